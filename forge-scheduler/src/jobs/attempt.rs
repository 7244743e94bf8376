//! The attempts of one worker: claimed jobs waiting for a slot, running attempts (each in its
//! own task), and turning their results into outcomes to record.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use forge_core::{Leadership, LockNamespace, NodeId};
use metrics::{Counter, Histogram};
use serde_json::json;
use sqlx::PgPool;
use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, sleep};
use tracing::{Instrument, debug, error, warn};

use super::flow::OutputSlot;
use super::shared::{AttemptReason, IdMap, Outcome};
use super::{
    CancelReason, CancelSignal, FailAction, JobContext, JobError, JobId, JobState, JobType,
};
use crate::config::fmt_duration;
use crate::metrics::{
    JOB_CANCELLED, JOB_COMPLETED, JOB_DEAD, JOB_DURATION, JOB_FAILED, JOB_PICKUP, JOB_RETRIED,
    JOB_SNOOZED, Series,
};

/// How many cancel requests for jobs not (yet) known to the worker are remembered: a cancel
/// notification can overtake the response of the claim that started the job.
const EARLY_CANCELS: usize = 256;

/// A claimed job, not started yet.
pub(super) struct Claimed {
    pub(super) id: i64,
    pub(super) attempt: i32,
    pub(super) ty: JobType,
    pub(super) args: serde_json::Value,
    pub(super) max_attempts: u32,
    pub(super) timeout: Option<Duration>,
    /// Claimed with a free slot (marked started by the claim); else claimed ahead.
    pub(super) started_by_claim: bool,
}

/// A running attempt, as the worker knows it.
struct Running {
    attempt: i32,
    ty: JobType,
    max_attempts: u32,
    cancel: Arc<CancelSignal>,
    started: Instant,
}

/// What one attempt's task reports.
pub(super) enum AttemptResult {
    /// The handler returned.
    Done(Result<(), JobError>),
    /// The handler ran past its timeout and was dropped.
    TimedOut(Duration),
    /// The attempt was stopped from outside.
    Interrupted(CancelReason),
    /// The handler panicked (with this message).
    Panicked(String),
    /// The handler snoozed the job (`JobError::snooze`); the task asked the database itself.
    Snoozed(Snoozed),
}

/// What the database made of a snooze (`forge.jobs_snooze`).
pub(super) enum Snoozed {
    /// Recorded (the job waits; or it was cancelled meanwhile), or not this attempt's any more
    /// (rescued; or recorded by an earlier call whose reply was lost): nothing to report.
    Done,
    /// The job had snoozed `max_snoozes` times already: the worker dead-letters it.
    TooMany(u32),
    /// The database could not be asked (this error): the worker releases the attempt instead.
    Failed(String),
}

/// What an attempt's task needs to record a snooze itself, in its own transaction, before the
/// attempt ends (so the slot it frees is free in the database too): its worker's [`Origin`],
/// shared by every attempt, and the job type's own bound.
struct Snoozer {
    origin: Arc<Origin>,
    max_snoozes: u32,
    kind: &'static str,
}

impl Snoozer {
    /// Asks `forge.jobs_snooze` up to three times: a call whose reply was lost is harmless to
    /// repeat (the function's guard makes it idempotent per attempt).
    async fn snooze(&self, id: i64, attempt: i32, delay: Duration, message: &str) -> Snoozed {
        let origin = &*self.origin;
        let delay_ms = delay.min(forge_rules::MAX_DURATION).as_millis() as i64;
        let max = self.max_snoozes.min(i32::MAX as u32) as i32;
        let mut failure = String::new();
        for _ in 0..3 {
            let call = sqlx::query_scalar::<_, Option<String>>(
                "SELECT forge.jobs_snooze($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(&origin.namespace)
            .bind(id)
            .bind(attempt)
            .bind(origin.node_id.as_str())
            .bind(delay_ms)
            .bind(max)
            .bind(origin.default_max_attempts)
            .bind(message)
            .fetch_one(&origin.pool);
            match tokio::time::timeout(origin.statement_bound, call).await {
                Ok(Ok(Some(reply))) if reply == "too_many_snoozes" => {
                    return Snoozed::TooMany(self.max_snoozes);
                }
                Ok(Ok(reply)) => {
                    // Counted when this call recorded the snooze (the job waits again): not
                    // when a cancel requested meanwhile turned it into a cancel, nor when the
                    // job is no longer this attempt's.
                    let state = reply.as_deref().and_then(JobState::parse);
                    if matches!(state, Some(JobState::Scheduled | JobState::Available)) {
                        let labels = [("queue", &*origin.queue), ("kind", self.kind)];
                        origin.metrics.counter(&JOB_SNOOZED, &labels).increment(1);
                    }
                    return Snoozed::Done;
                }
                Ok(Err(err)) => failure = err.to_string(),
                Err(_) => {
                    failure = format!("no answer within {}", fmt_duration(origin.statement_bound));
                }
            }
            sleep(Duration::from_millis(100)).await;
        }
        Snoozed::Failed(failure)
    }
}

/// What an attempt's [`JobContext`] says of its job, beside its worker's [`Origin`].
#[derive(Clone, Copy)]
struct Attempt {
    id: i64,
    kind: &'static str,
    attempt: i32,
    max_attempts: u32,
}

impl Attempt {
    fn context(
        self,
        origin: &Origin,
        cancel: Arc<CancelSignal>,
        output: Arc<Mutex<OutputSlot>>,
    ) -> JobContext {
        JobContext {
            id: JobId(self.id),
            namespace: origin.namespace.clone(),
            kind: self.kind,
            queue: origin.queue.clone(),
            attempt: self.attempt.max(1) as u32,
            max_attempts: self.max_attempts,
            node_id: origin.node_id.clone(),
            pool: origin.pool.clone(),
            cancel,
            leadership: origin.leadership.clone(),
            keep_completed: origin.keep_completed,
            metrics: origin.metrics.clone(),
            output,
            max_output_bytes: origin.max_output_bytes,
        }
    }
}

/// An outcome to record.
pub(super) struct Record {
    pub(super) id: i64,
    pub(super) attempt: i32,
    pub(super) outcome: Outcome,
    pub(super) delay_ms: Option<i64>,
    pub(super) error: Option<serde_json::Value>,
    pub(super) kind: &'static str,
    /// The attempt failed (counts in forge_job_failed_total).
    pub(super) failed: bool,
}

impl Record {
    fn new(id: i64, attempt: i32, kind: &'static str, outcome: Outcome) -> Record {
        Record {
            id,
            attempt,
            outcome,
            delay_ms: None,
            error: None,
            kind,
            failed: false,
        }
    }

    fn because(mut self, reason: AttemptReason, error: impl Into<String>) -> Record {
        self.error = Some(json!({"reason": reason.as_str(), "error": error.into()}));
        self
    }
}

/// The metrics of one job kind in this worker's queue.
pub(super) struct KindMetrics {
    completed: Counter,
    failed: Counter,
    retried: Counter,
    dead: Counter,
    cancelled: Counter,
    pub(super) duration: Histogram,
    pub(super) pickup: Histogram,
}

impl KindMetrics {
    pub(super) fn new(metrics: &forge_core::Metrics, queue: &str, kind: &str) -> KindMetrics {
        let labels = [("queue", queue), ("kind", kind)];
        KindMetrics {
            completed: metrics.counter(&JOB_COMPLETED, &labels),
            failed: metrics.counter(&JOB_FAILED, &labels),
            retried: metrics.counter(&JOB_RETRIED, &labels),
            dead: metrics.counter(&JOB_DEAD, &labels),
            cancelled: metrics.counter(&JOB_CANCELLED, &labels),
            duration: metrics.histogram(&JOB_DURATION, &labels),
            pickup: metrics.histogram(&JOB_PICKUP, &labels),
        }
    }

    /// The Prometheus counter of a kind that counts like `series`, if any.
    fn counter(&self, series: Series) -> Option<&Counter> {
        match series {
            Series::JobsCompleted => Some(&self.completed),
            Series::JobsRetried => Some(&self.retried),
            Series::JobsDead => Some(&self.dead),
            Series::JobsCancelled => Some(&self.cancelled),
            _ => None,
        }
    }
}

/// What an attempt's [`JobContext`] needs from its worker.
pub(super) struct Origin {
    pub(super) queue: Arc<str>,
    pub(super) namespace: LockNamespace,
    pub(super) node_id: NodeId,
    pub(super) pool: PgPool,
    pub(super) leadership: Option<Leadership>,
    /// `[jobs] completed_retention` is not zero: completions keep the job's row.
    pub(super) keep_completed: bool,
    /// `[jobs] max_output_bytes`.
    pub(super) max_output_bytes: u64,
    /// The node's metrics, for the handlers' job clients.
    pub(super) metrics: forge_core::Metrics,
    /// `[jobs] max_snoozes`, for job types that do not declare theirs.
    pub(super) max_snoozes: u32,
    /// `[jobs] default_max_attempts`, for a snooze (it adds one).
    pub(super) default_max_attempts: i32,
    /// How long one statement may take (a snooze's, recorded by the attempt's task).
    pub(super) statement_bound: Duration,
}

/// The span an attempt runs in (so do the handler's own log lines): the job's id, kind,
/// queue and attempt - under OpenTelemetry's names for messaging where they have one: a
/// consumer span `process <queue>`, `messaging.message.id`, `messaging.destination.name` - and,
/// for a role's job, the role and the tenure's epoch.
fn attempt_span(id: i64, attempt: i32, kind: &'static str, origin: &Origin) -> tracing::Span {
    let span = tracing::info_span!(
        target: "forge::job",
        "job",
        otel.name = %format_args!("process {}", origin.queue),
        otel.kind = "consumer",
        messaging.system = "forge",
        messaging.operation.type = "process",
        messaging.destination.name = %origin.queue,
        messaging.message.id = id,
        job.kind = kind,
        job.attempt = attempt.max(1),
        role = tracing::field::Empty,
        epoch = tracing::field::Empty,
    );
    if let Some(leadership) = &origin.leadership {
        span.record("role", tracing::field::display(leadership.role()));
        span.record("epoch", leadership.epoch().0);
    }
    span
}

/// The claimed and running attempts of one worker, and the outcomes waiting to be recorded.
#[derive(Default)]
pub(super) struct Attempts {
    /// Claimed jobs waiting for a slot (see "claiming ahead").
    pub(super) claimed: VecDeque<Claimed>,
    running: IdMap<i64, Running>,
    tasks: JoinSet<(i64, AttemptResult)>,
    task_jobs: IdMap<tokio::task::Id, i64>,
    early_cancels: VecDeque<i64>,
    /// Claimed-ahead jobs that started since the last round trip (it marks them started).
    pub(super) started_ahead: Vec<i64>,
    /// Outcomes waiting for the next round trip.
    pub(super) records: Vec<Record>,
    /// Kinds and durations of attempts finished since last asked, for the worker's pacing
    /// and metrics.
    pub(super) durations: Vec<(&'static str, f64)>,
}

impl Attempts {
    pub(super) fn running(&self) -> usize {
        self.running.len()
    }

    pub(super) fn is_idle(&self) -> bool {
        self.running.is_empty() && self.claimed.is_empty()
    }

    /// `(id, attempt)` of every job this worker holds, for reconciliation.
    pub(super) fn held(&self) -> (Vec<i64>, Vec<i32>) {
        self.running
            .iter()
            .map(|(id, r)| (*id, r.attempt))
            .chain(self.claimed.iter().map(|c| (c.id, c.attempt)))
            .unzip()
    }

    /// The next finished attempt, as `Option` so the worker's `select!` can poll it.
    pub(super) async fn next_finished(
        &mut self,
    ) -> Option<Result<(tokio::task::Id, (i64, AttemptResult)), JoinError>> {
        self.tasks.join_next_with_id().await
    }

    pub(super) fn has_tasks(&self) -> bool {
        !self.tasks.is_empty()
    }

    /// Starts claimed jobs while there are free slots; when `stopping`, releases them instead.
    pub(super) fn fill(&mut self, concurrency: usize, stopping: bool, origin: &Arc<Origin>) {
        while let Some(claimed) = self.claimed.pop_front() {
            if stopping {
                self.records.push(
                    Record::new(claimed.id, claimed.attempt, claimed.ty.kind, Outcome::Released)
                        .because(
                            AttemptReason::Released,
                            "claimed but not started before its node shut down (the attempt does not count against max_attempts)",
                        ),
                );
                continue;
            }
            if self.running.len() >= concurrency {
                self.claimed.push_front(claimed);
                return;
            }
            self.start(claimed, origin);
        }
    }

    /// Starts an attempt in its own task.
    fn start(&mut self, claimed: Claimed, origin: &Arc<Origin>) {
        let Claimed {
            id,
            attempt,
            ty,
            args,
            max_attempts,
            timeout,
            started_by_claim,
        } = claimed;
        if !started_by_claim {
            self.started_ahead.push(id);
        }
        let cancel = Arc::new(CancelSignal::default());
        let output: Arc<Mutex<OutputSlot>> = Arc::default();
        let context = Attempt {
            id,
            kind: ty.kind,
            attempt,
            max_attempts,
        };
        debug!(target: "forge::job", queue = %origin.queue, job = ty.kind, id, attempt, "attempt started");
        let span = attempt_span(id, attempt, ty.kind, origin);
        let handler = (ty.handler)(
            context.context(origin, cancel.clone(), output.clone()),
            args,
        );
        let signal = cancel.clone();
        let snoozer = Snoozer {
            origin: origin.clone(),
            max_snoozes: ty.options.max_snoozes.unwrap_or(origin.max_snoozes),
            kind: ty.kind,
        };
        let task = self.tasks.spawn(
            async move {
            let timed_out = async {
                match timeout {
                    Some(limit) => {
                        sleep(limit).await;
                        limit
                    }
                    None => std::future::pending().await,
                }
            };
            let result = tokio::select! {
                biased;
                _ = signal.token.cancelled() => {
                    AttemptResult::Interrupted(signal.reason().unwrap_or(CancelReason::Shutdown))
                }
                limit = timed_out => {
                    signal.cancel(CancelReason::TimedOut);
                    AttemptResult::TimedOut(limit)
                }
                result = handler => AttemptResult::Done(result),
            };
            // A snooze is recorded here, before the attempt ends: the worker reports no
            // outcome for it (see forge.jobs_snooze). A job with an output completes in a
            // transaction of its own, the output with it.
            let result = match result {
                AttemptResult::Done(Err(err)) => match err.action() {
                    FailAction::Snooze(delay) => AttemptResult::Snoozed(
                        snoozer.snooze(id, attempt, delay, err.message()).await,
                    ),
                    _ => AttemptResult::Done(Err(err)),
                },
                // (The context again, for an output to store: a handler that set none, the
                // common case, costs no second one.)
                AttemptResult::Done(Ok(())) => {
                    AttemptResult::Done(super::flow::complete_with_output(&output, || {
                        context.context(&snoozer.origin, signal.clone(), output.clone())
                    })
                    .await)
                }
                other => other,
            };
            (id, result)
        }
            .instrument(span),
        );
        self.task_jobs.insert(task.id(), id);
        if let Some(at) = self.early_cancels.iter().position(|c| *c == id) {
            self.early_cancels.remove(at);
            cancel.cancel(CancelReason::Requested);
        }
        self.running.insert(
            id,
            Running {
                attempt,
                ty,
                max_attempts,
                cancel,
                started: Instant::now(),
            },
        );
    }

    /// Stops a running attempt, or drops a job claimed ahead.
    pub(super) fn cancel(&mut self, id: i64, reason: CancelReason) {
        if let Some(running) = self.running.get(&id) {
            debug!(target: "forge::job", job = running.ty.kind, id, ?reason, "stopping the attempt");
            running.cancel.cancel(reason);
        } else if let Some(at) = self.claimed.iter().position(|c| c.id == id) {
            let Some(claimed) = self.claimed.remove(at) else {
                return;
            };
            if reason == CancelReason::Requested {
                self.records.push(
                    Record::new(id, claimed.attempt, claimed.ty.kind, Outcome::Cancelled)
                        .because(AttemptReason::Cancelled, "cancelled before it started"),
                );
            }
        } else if reason == CancelReason::Requested {
            if self.early_cancels.len() == EARLY_CANCELS {
                self.early_cancels.pop_front();
            }
            self.early_cancels.push_back(id);
        }
    }

    /// Stops every running attempt (a graceful stop past its bound, or a lost leadership).
    pub(super) fn cancel_all(&self, reason: CancelReason) {
        for running in self.running.values() {
            running.cancel.cancel(reason);
        }
    }

    /// Stops every attempt and waits for their tasks, turning them into outcomes.
    pub(super) async fn stop_all(&mut self, origin: &Origin) {
        self.cancel_all(CancelReason::Shutdown);
        // The attempts' tasks drop their handlers at the next poll.
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while let Some(joined) = self.tasks.join_next_with_id().await {
                self.collect(joined, origin);
            }
        })
        .await;
        self.tasks.abort_all();
        while let Some(joined) = self.tasks.join_next_with_id().await {
            self.collect(joined, origin);
        }
    }

    /// Turns a finished attempt's task into an outcome to record.
    pub(super) fn collect(
        &mut self,
        joined: Result<(tokio::task::Id, (i64, AttemptResult)), JoinError>,
        origin: &Origin,
    ) {
        let (id, result) = match joined {
            Ok((task, (id, result))) => {
                self.task_jobs.remove(&task);
                (id, result)
            }
            Err(err) => {
                let Some(id) = self.task_jobs.remove(&err.id()) else {
                    return;
                };
                if err.is_panic() {
                    (id, AttemptResult::Panicked(panic_message(err.into_panic())))
                } else {
                    (id, AttemptResult::Interrupted(CancelReason::Shutdown))
                }
            }
        };
        let Some(running) = self.running.remove(&id) else {
            return;
        };
        self.durations
            .push((running.ty.kind, running.started.elapsed().as_secs_f64()));
        if let Some(record) = outcome_of(&running, id, result, origin) {
            self.records.push(record);
        }
    }
}

/// What to record for an attempt's result (`None`: nothing, the job is not this node's).
fn outcome_of(
    running: &Running,
    id: i64,
    result: AttemptResult,
    origin: &Origin,
) -> Option<Record> {
    let kind = running.ty.kind;
    let record = |outcome| Record::new(id, running.attempt, kind, outcome);
    Some(match result {
        AttemptResult::Done(Ok(())) => {
            debug!(target: "forge::job", queue = %origin.queue, job = kind, id, attempt = running.attempt, "completed");
            record(Outcome::Completed)
        }
        AttemptResult::Done(Err(err)) => {
            let reason = if err.action() == FailAction::Discard {
                AttemptReason::Discard
            } else {
                AttemptReason::Error
            };
            failure(running, id, reason, &err, origin)
        }
        AttemptResult::Panicked(message) => failure(
            running,
            id,
            AttemptReason::Panic,
            &JobError::retry(format_args!("panicked: {message}")),
            origin,
        ),
        AttemptResult::TimedOut(limit) => failure(
            running,
            id,
            AttemptReason::Timeout,
            &JobError::retry(format_args!("timed out after {}", fmt_duration(limit))),
            origin,
        ),
        AttemptResult::Interrupted(CancelReason::TimedOut) => failure(
            running,
            id,
            AttemptReason::Timeout,
            &JobError::retry("timed out"),
            origin,
        ),
        AttemptResult::Interrupted(CancelReason::Requested) => {
            debug!(target: "forge::job", queue = %origin.queue, job = kind, id, attempt = running.attempt, "cancelled while running");
            record(Outcome::Cancelled).because(AttemptReason::Cancelled, "cancelled while running")
        }
        // The job is no longer this node's: nothing to record.
        AttemptResult::Interrupted(CancelReason::Rescued) => return None,
        AttemptResult::Snoozed(Snoozed::Done) => {
            debug!(target: "forge::job", queue = %origin.queue, job = kind, id, attempt = running.attempt, "snoozed");
            return None;
        }
        AttemptResult::Snoozed(Snoozed::TooMany(max)) => failure(
            running,
            id,
            AttemptReason::TooManySnoozes,
            &JobError::discard(format_args!(
                "snoozed more than max_snoozes ({max}) times, so dead-lettered: raise \
                 max_snoozes on the job type or in [jobs], or make the handler fail instead"
            )),
            origin,
        ),
        AttemptResult::Snoozed(Snoozed::Failed(why)) => record(Outcome::Released).because(
            AttemptReason::Released,
            format!(
                "snoozed, but the snooze could not be recorded ({why}): available again at once \
                 (the attempt does not count against max_attempts)"
            ),
        ),
        AttemptResult::Interrupted(reason @ (CancelReason::Shutdown | CancelReason::CutOff)) => {
            let why = if reason == CancelReason::CutOff {
                "its node lost contact with the cluster for longer than it may hold its jobs"
            } else if origin.leadership.is_some() {
                "the leadership it ran under wound down"
            } else {
                "its node shut down"
            };
            record(Outcome::Released).because(
                AttemptReason::Released,
                format!("interrupted: {why} (the attempt does not count against max_attempts)"),
            )
        }
    })
}

/// The outcome of a failed attempt: retry after the backoff, or dead-letter.
fn failure(
    running: &Running,
    id: i64,
    reason: AttemptReason,
    err: &JobError,
    origin: &Origin,
) -> Record {
    let (message, action) = (err.message(), err.action());
    let attempt = running.attempt.max(1) as u32;
    let kind = running.ty.kind;
    let mut base = Record::new(id, running.attempt, kind, Outcome::Dead).because(reason, message);
    base.failed = true;
    if action == FailAction::Discard || attempt >= running.max_attempts {
        error!(target: "forge::job", queue = %origin.queue, job = kind, id, attempt,
               max_attempts = running.max_attempts, reason = %reason, error = %message, "attempt failed; dead-lettering the job");
        return base;
    }
    let delay = match action {
        FailAction::RetryAfter(delay) => delay,
        _ => running.ty.options.backoff.delay_after(attempt, err),
    };
    warn!(target: "forge::job", queue = %origin.queue, job = kind, id, attempt,
          max_attempts = running.max_attempts, reason = %reason, error = %message,
          retry_in_ms = delay.as_millis() as u64, "attempt failed; will retry");
    let delay_ms = delay.as_millis().min(i64::MAX as u128) as i64;
    Record {
        outcome: if delay_ms == 0 {
            Outcome::Available
        } else {
            Outcome::Retryable
        },
        delay_ms: Some(delay_ms),
        ..base
    }
}

/// Counts an outcome once the database has recorded it (`recorded` = the state written),
/// or reports that it was refused, in the node's Prometheus metrics; returns the name of the
/// cluster series it counts in (`forge.stats`, a [`Series`]), which the caller adds to its
/// tally once per round trip.
pub(super) fn count(
    metrics: &HashMap<&'static str, KindMetrics>,
    record: &Record,
    recorded: Option<JobState>,
    queue: &str,
) -> Option<Series> {
    let Some(state) = recorded else {
        // A late result of an attempt whose job was rescued meanwhile (this node seemed
        // dead): the guard refused it, so the job is not completed twice.
        warn!(target: "forge::job", queue = %queue, job = record.kind, id = record.id,
              attempt = record.attempt, outcome = %record.outcome,
              "outcome not recorded: the job is no longer running this attempt on this node (it was rescued)");
        return None;
    };
    let series = match state {
        JobState::Completed => Some(Series::JobsCompleted),
        JobState::Retryable => Some(Series::JobsRetried),
        JobState::Available if record.failed => Some(Series::JobsRetried),
        JobState::Dead => Some(Series::JobsDead),
        JobState::Cancelled => Some(Series::JobsCancelled),
        _ => None,
    };
    if let Some(m) = metrics.get(record.kind) {
        if record.failed {
            m.failed.increment(1);
        }
        if let Some(counter) = series.and_then(|series| m.counter(series)) {
            counter.increment(1);
        }
    }
    series
}

/// The outcome for a claimed row that cannot become an attempt (its arguments cannot be
/// decoded, or its kind is unknown here).
pub(super) fn unusable(
    id: i64,
    attempt: i32,
    kind: &'static str,
    why: String,
    outcome: Outcome,
) -> Record {
    let mut record = Record::new(id, attempt, kind, outcome).because(
        if outcome == Outcome::Dead {
            AttemptReason::Undecodable
        } else {
            AttemptReason::Released
        },
        why,
    );
    record.failed = outcome == Outcome::Dead;
    record
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "(a non-string panic payload)".to_owned()
    }
}
