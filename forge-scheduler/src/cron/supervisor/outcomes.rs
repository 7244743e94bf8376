//! A run: its handler (timeout, panics), its outcome recorded (retried), and its metrics.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge_core::Leadership;
use futures_util::FutureExt;
use metrics::{Counter, Histogram};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, warn};

use super::super::ledger::{Finish, FinishRequest};
use super::super::{CronContext, CronJob, TickState};
use super::batch::{Batchers, Finisher, ask};
use super::metric_labels;
use crate::metrics::{CRON_DURATION, CRON_LAG, CRON_RUNS, Series};

/// Runs a claimed tick's handler and records the outcome, in the run's span: the cron's
/// name, the tick's instant, the attempt, the role and the tenure's epoch (the handler's own
/// log lines carry them). The run's start (`fired_at`, `started_at`) and lag are by the
/// database's clock as the tenure follows it, so that they compare with the tick's instant;
/// its duration is by the monotonic clock.
pub(super) async fn run_tick(
    cron: CronJob,
    metrics: Arc<CronMetrics>,
    leadership: Leadership,
    batchers: &Batchers,
    tick: DateTime<Utc>,
    attempt: u32,
) {
    let span = tracing::info_span!(
        target: "forge::cron",
        "cron",
        otel.name = %format_args!("cron {}", cron.name),
        cron.name = %cron.name,
        cron.tick = %tick.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        cron.attempt = i64::from(attempt),
        role = %cron.role,
        epoch = leadership.epoch().0,
    );
    async move {
        // Never start a handler past the local deadline: the lease may be gone already.
        if !leadership.is_valid() {
            debug!(target: "forge::cron", cron = %cron.name, %tick, "not starting: this leadership is past its deadline");
            return;
        }
        let fired_at = batchers.clock.now();
        let lag = (fired_at - tick).to_std().unwrap_or_default();
        metrics.lag.record(lag.as_secs_f64());
        let cancel = CancellationToken::new();
        let ctx = CronContext {
            name: cron.name.as_str().into(),
            scheduled_at: tick,
            fired_at,
            attempt,
            leadership: leadership.clone(),
            cancel: cancel.clone(),
        };
        debug!(target: "forge::cron", cron = %cron.name, %tick, attempt, lag_ms = lag.as_millis() as u64, "run");
        let started = tokio::time::Instant::now();
        let (state, error) = run_handler(&cron, ctx, &cancel).await;
        let took = started.elapsed().as_secs_f64();
        metrics.duration.record(took);
        metrics.runs(state).increment(1);
        // The cluster series count by role, not by cron: a heartbeat then carries four
        // counters per role whatever the number of crons (10,000 crons were 40,000 keys);
        // Prometheus keeps the per-cron figures.
        let tally = leadership.metrics().tally();
        let role = cron.role.name();
        tally.add(Series::CronRuns.as_str(), role, 1.0);
        if state != TickState::Succeeded {
            tally.add(Series::CronFailures.as_str(), role, 1.0);
        }
        tally.add(Series::CronLagSum.as_str(), role, lag.as_secs_f64());
        tally.add(Series::CronDurationSum.as_str(), role, took);
        match &error {
            Some(error) => {
                warn!(target: "forge::cron", cron = %cron.name, %tick, attempt, outcome = %state, %error, "run did not succeed")
            }
            None => debug!(target: "forge::cron", cron = %cron.name, %tick, attempt, "run succeeded"),
        }
        let ran = Ran {
            started: fired_at,
            took_ms: took * 1000.0,
        };
        record(&cron, &leadership, &batchers.finisher, tick, state, error, ran).await;
    }
    .instrument(span)
    .await
}

/// When a run's handler started and how long it ran, recorded with its outcome.
#[derive(Clone, Copy)]
struct Ran {
    started: DateTime<Utc>,
    took_ms: f64,
}

/// Runs the handler with the cron's timeout; panics are caught.
async fn run_handler(
    cron: &CronJob,
    ctx: CronContext,
    cancel: &CancellationToken,
) -> (TickState, Option<String>) {
    let work = AssertUnwindSafe(cron.handler.call(ctx)).catch_unwind();
    let result = match cron.timeout {
        Some(limit) => tokio::time::timeout(limit, work).await.ok(),
        None => Some(work.await),
    };
    match result {
        None => {
            cancel.cancel();
            (
                TickState::TimedOut,
                Some(format!(
                    "the run exceeded its timeout of {}",
                    crate::config::fmt_duration(cron.timeout.unwrap_or_default())
                )),
            )
        }
        Some(Ok(Ok(()))) => (TickState::Succeeded, None),
        Some(Ok(Err(err))) => (TickState::Failed, Some(err.to_string())),
        Some(Err(panic)) => (
            TickState::Failed,
            Some(format!("panicked: {}", panic_message(&panic))),
        ),
    }
}

/// Logs a statement about `cron`'s `tick` that failed (with its `error`) or got no answer in
/// time (`None`), before it is retried: "`what`; retrying".
pub(super) fn retrying(
    cron: &CronJob,
    tick: DateTime<Utc>,
    error: Option<&dyn fmt::Display>,
    what: &str,
) {
    match error {
        Some(err) => {
            warn!(target: "forge::cron", cron = %cron.name, %tick, error = %err, "{what}; retrying")
        }
        None => warn!(target: "forge::cron", cron = %cron.name, %tick, "{what}; retrying"),
    }
}

/// Records a run's outcome, retrying until it lands or this leadership ends (a succeeded tick
/// whose outcome is lost would be rerun by the next leader).
async fn record(
    cron: &CronJob,
    leadership: &Leadership,
    finisher: &Finisher,
    tick: DateTime<Utc>,
    state: TickState,
    error: Option<String>,
    ran: Ran,
) {
    let mut pause = Duration::from_millis(50);
    let bound = leadership.lease_duration();
    loop {
        let request = FinishRequest {
            cron: cron.name.clone(),
            tick,
            state,
            error: error.clone(),
            started: ran.started,
            took_ms: ran.took_ms,
        };
        let finished = tokio::time::timeout(bound, ask(finisher, request)).await;
        match finished {
            Ok(Ok(Finish::Recorded)) => return,
            Ok(Ok(Finish::AlreadyFinal(final_state))) => {
                if final_state != state {
                    warn!(target: "forge::cron", cron = %cron.name, %tick, outcome = %state, recorded = %final_state,
                          "the handler completed the tick in its transaction; its later outcome is not recorded");
                }
                return;
            }
            Ok(Ok(Finish::Taken)) => {
                warn!(target: "forge::cron", cron = %cron.name, %tick,
                      "another leadership took the tick over; this run's outcome is not recorded");
                return;
            }
            Ok(Err(err)) => retrying(cron, tick, Some(&err), "cannot record a run's outcome yet"),
            Err(_) => retrying(
                cron,
                tick,
                None,
                "recording a run's outcome got no answer in time",
            ),
        }
        if !leadership.is_valid() {
            warn!(target: "forge::cron", cron = %cron.name, %tick,
                  "this leadership ended before the run's outcome was recorded; the next leader handles the tick per its `interrupted` policy");
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// One cron's Prometheus handles, looked up once per tenure: a tick then records without
/// building and looking up label sets (with thousands of crons due at one instant, that was
/// much of the time between the first tick's start and the last one's).
pub(super) struct CronMetrics {
    lag: Histogram,
    duration: Histogram,
    /// `forge_cron_runs_total` by outcome, in the order of [`CronMetrics::OUTCOMES`].
    runs: [Counter; 5],
}

impl CronMetrics {
    const OUTCOMES: [TickState; 5] = [
        TickState::Succeeded,
        TickState::Failed,
        TickState::TimedOut,
        TickState::Skipped,
        TickState::Abandoned,
    ];

    /// Through the tenure's metrics: the histograms are exported while the tenure lasts (the
    /// counters are the node's, exported from its start).
    pub(super) fn new(cron: &CronJob, leadership: &Leadership, per_cron: bool) -> CronMetrics {
        let metrics = leadership.metrics();
        let labels = metric_labels(cron, per_cron);
        CronMetrics {
            lag: metrics.histogram(&CRON_LAG, &labels),
            duration: metrics.histogram(&CRON_DURATION, &labels),
            runs: Self::OUTCOMES.map(|outcome| {
                let mut labels = labels.clone();
                labels.push(("outcome", outcome.as_str()));
                metrics.counter(&CRON_RUNS, &labels)
            }),
        }
    }

    /// The run counter of an outcome (`running` is not an outcome; no caller passes it).
    pub(super) fn runs(&self, outcome: TickState) -> &Counter {
        &self.runs[Self::slot(outcome)]
    }

    /// Where an outcome's counter is in `runs` (its place in [`CronMetrics::OUTCOMES`]).
    fn slot(outcome: TickState) -> usize {
        match outcome {
            TickState::Succeeded | TickState::Running => 0,
            TickState::Failed => 1,
            TickState::TimedOut => 2,
            TickState::Skipped => 3,
            TickState::Abandoned => 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_counts_in_its_own_counter() {
        for (at, outcome) in CronMetrics::OUTCOMES.iter().enumerate() {
            assert_eq!(CronMetrics::slot(*outcome), at, "{outcome:?}");
        }
    }
}
