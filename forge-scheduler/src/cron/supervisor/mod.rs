//! The cron runtime: one supervisor per role (a leader task), one loop per cron.
//!
//! ```text
//! tenure starts ──► read the database's clock (`DbClock`), load: register crons, frontier per
//!                   cron, interrupted ticks, unknown crons
//!                   ├─► interrupted ticks: rerun (attempt + 1) or abandon
//!                   ├─► backlog: ticks due between the frontier and the tenure's start, per the
//!                   │   catch-up policy, one after another
//!                   └─► loop: next tick ─► sleep until `claim_ahead` before it ─► claim
//!                       (fenced) ─► sleep until due ─► gate ─► run ─► finish
//! ```
//!
//! Clocks. The database's wall clock decides when a tick is due (the ledger's instants, the
//! claim's `early`, the gate): every decision of this module about time - the backlog's end at
//! tenure start, the sleep until a tick is to be claimed and until it is due, `behind`, the
//! overlap decision, the misfire threshold, a run's `fired_at` and lag - is taken by the
//! tenure's [`DbClock`], the leader's estimate of that clock, never by the node's own wall clock.
//! Sleeps run on tokio's monotonic timers. How long a run took is measured on the monotonic
//! clock.
//!
//! Claiming ahead. A scheduled tick is claimed `[cron] claim_ahead` before its instant, so that
//! the claim's durable commit is not on the firing path; at the instant, the gate (one read on
//! the lock session, for all the ticks due together) checks that this tenure is still the
//! current one by the database's clock at or past the instant. A tenure starting later takes
//! back the claims of ticks whose instant is at or after its start: they were never started
//! (`migrations/functions/tick_gate.sql` has the argument). A leader that hands over before a
//! claimed tick's instant deletes its claim.
//!
//! Overlap. A tick reached while the cron is behind - the following tick is already due,
//! because the backlog or a slow run held the loop - is backlog too: it waits for the run
//! before it and then runs. The overlap policy (skip / wait / allow) applies only to a tick
//! that comes due on time while a run of an earlier on-time tick is still going.
//!
//! Failures. A claim that fails (database error, lost reply) is retried until it succeeds,
//! the tick turns out claimed by another tenure, or this leadership ends: a claim that
//! committed unseen comes back as this tenure's own and runs. An outcome that cannot be
//! recorded is retried the same way, so a succeeded tick is not rerun by a later tenure.
//! A claim the fence refuses while this node still believes it leads is retried after a
//! short pause (the lease was being renewed), not taken as the end of the tenure. A tick the
//! database says is not due yet (the estimate of its clock ran ahead) is claimed when it is.
//!
//! The pieces: [`batch`] (the tenure's batchers: claims, the gate, outcomes, one statement
//! per batch), [`gates`] (the gate's latest answer, shared by the loops), [`runs`] (one cron's
//! ticks in one tenure: overlap, claims, manual runs), [`recovery`] (the ticks earlier tenures
//! left running), [`outcomes`] (a run, its outcome and its metrics).

mod batch;
mod gates;
mod outcomes;
mod recovery;
mod runs;
mod stored;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge_core::{Leadership, Role};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::CronJob;
use super::clock::DbClock;
use super::ledger::{self, Board, Resume};
use super::plan::{self, to_delta};
use super::stored::{EnqueueTick, report_shadowed};
use crate::metrics::{CRON_MISSED, CRON_UNKNOWN};
pub(super) use batch::Batchers;
use batch::batches;
use gates::GatePassed;
use outcomes::CronMetrics;
use recovery::recover;
use runs::Runs;
use stored::keep_stored;

/// Attempts of one tick under [`Interrupted::Rerun`], the first included.
const MAX_TICK_ATTEMPTS: i32 = 3;

/// The crons paused in the cluster and the pending manual runs (`forge.crons`), kept current
/// by the node's cron-registry service, its one writer (at start, on notifications on
/// `forge_crons`, when the node session is restored, and when a tenure starts).
pub(super) type SharedBoard = Arc<watch::Sender<Board>>;

/// What every cron loop of a node shares.
pub(super) struct Settings {
    pub(super) misfire_threshold: Duration,
    /// How long before its instant a scheduled tick is claimed (`[cron] claim_ahead`).
    pub(super) claim_ahead: Duration,
    pub(super) board: SharedBoard,
    /// Asks the cron-registry service to read the board again (a tenure starts).
    pub(super) refresh_board: Arc<tokio::sync::Notify>,
    /// `[metrics] per_cron`: the cron metrics' series are per cron (else per role).
    pub(super) per_cron: bool,
    /// How a stored cron's tick enqueues its job; `None`: this node runs no stored crons.
    pub(super) stored: Option<EnqueueTick>,
}

/// The leader task of one role's crons.
pub(super) async fn supervise(
    crons: Arc<Vec<CronJob>>,
    leadership: Leadership,
    settings: Arc<Settings>,
) {
    let mut delay = Duration::from_millis(100);
    let (clock, mut loaded) = loop {
        let loaded = async {
            let clock = DbClock::read(&leadership).await?;
            Ok::<_, forge_core::Error>((clock, ledger::load(&crons, &leadership).await?))
        };
        match loaded.await {
            Ok((clock, loaded)) => {
                // The registry service is the board's one writer (a read of ours could be
                // older than its latest and undo it): ask it to read the board again.
                settings.refresh_board.notify_one();
                report_unknown(&leadership, &loaded.unknown);
                report_shadowed(&loaded.shadowed);
                break (Arc::new(clock), loaded);
            }
            Err(err) => {
                warn!(target: "forge::cron", role = %leadership.role(), epoch = %leadership.epoch(), error = %err,
                      "cannot read the tick ledger; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = leadership.stopping() => return,
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    };
    info!(target: "forge::cron", role = %leadership.role(), epoch = %leadership.epoch(), crons = crons.len(),
          "running crons");
    let following = tokio::spawn({
        let (clock, leadership) = (clock.clone(), leadership.clone());
        async move { clock.follow(&leadership).await }
    });
    let (claimer, claims) = mpsc::unbounded_channel();
    let (gater, gates) = mpsc::unbounded_channel();
    let (finisher, outcomes) = mpsc::unbounded_channel();
    let batchers = Batchers {
        claimer,
        gater,
        finisher,
        gate_passed: Arc::new(GatePassed::new(settings.claim_ahead)),
        clock: clock.clone(),
    };
    let gate_passed = batchers.gate_passed.clone();
    let mut loops = JoinSet::new();
    for cron in crons.iter() {
        if loaded.shadowed.contains(&cron.name) {
            continue;
        }
        let resume = loaded.resume.remove(&cron.name).unwrap_or_default();
        loops.spawn(run_cron(
            cron.clone(),
            leadership.clone(),
            resume,
            settings.clone(),
            batchers.clone(),
            CancellationToken::new(),
        ));
    }
    if let Some(enqueue) = settings.stored.clone()
        && *leadership.role() == Role::SCHEDULER
    {
        // The crons of code running in this tenure (a shadowed one is not: the stored one is).
        let code = crons
            .iter()
            .map(|c| c.name.clone())
            .filter(|name| !loaded.shadowed.contains(name))
            .collect();
        loops.spawn(keep_stored(
            code,
            enqueue,
            leadership.clone(),
            settings.clone(),
            batchers.clone(),
        ));
    }
    drop(batchers);
    // The batchers end when every loop (and so every sender) is gone.
    let ahead = settings.claim_ahead;
    let claiming = tokio::spawn(batches(
        leadership.clone(),
        claims,
        move |l, r| async move { ledger::claim_many(&l, &r, ahead).await },
    ));
    let gating = tokio::spawn(batches(
        leadership.clone(),
        gates,
        move |l, ticks: Vec<DateTime<Utc>>| {
            let (passed, clock) = (gate_passed.clone(), clock.clone());
            async move {
                // Asks queued while the previous answer travelled are answered by it when it
                // covers their instants (see `GatePassed`).
                if let Some(at) = ticks.iter().max().and_then(|t| passed.covers(*t)) {
                    return Ok(vec![Some(at); ticks.len()]);
                }
                let reading = ledger::gate(&l).await?;
                if let Some(reading) = &reading {
                    clock.observe(reading);
                    passed.record(reading.time);
                }
                Ok(vec![reading.map(|r| r.time); ticks.len()])
            }
        },
    ));
    let finishing = tokio::spawn(batches(leadership.clone(), outcomes, |l, r| async move {
        ledger::finish_many(&l, &r).await
    }));
    while loops.join_next().await.is_some() {}
    let _ = claiming.await;
    let _ = gating.await;
    let _ = finishing.await;
    following.abort();
}

fn report_unknown(leadership: &Leadership, unknown: &[(String, String)]) {
    for (name, seen_by) in unknown {
        warn!(target: "forge::cron", cron = %name, role = %leadership.role(), last_seen_by = %seen_by,
              "the cluster knows a cron of this role that this leader's binary lacks: its ticks do not run until a node that has it leads the role");
    }
    leadership
        .metrics()
        .gauge(&CRON_UNKNOWN, &[("role", leadership.role().name())])
        .set(unknown.len() as f64);
}

/// One cron's loop for one tenure, until the tenure ends or `stop` (a stored cron changed or
/// deleted) is cancelled; either way its runs in progress end first.
pub(super) async fn run_cron(
    cron: CronJob,
    leadership: Leadership,
    resume: Resume,
    settings: Arc<Settings>,
    batchers: Batchers,
    stop: CancellationToken,
) {
    let mut runs = Runs {
        metrics: Arc::new(CronMetrics::new(&cron, &leadership, settings.per_cron)),
        cron: cron.clone(),
        leadership: leadership.clone(),
        board: settings.board.clone(),
        batchers,
        claim_ahead: to_delta(settings.claim_ahead),
        last_manual: None,
        on_time: JoinSet::new(),
        backlog: JoinSet::new(),
    };
    let mut board = settings.board.subscribe();
    if !resume.interrupted.is_empty() {
        // Backlog: the catch-up and on-time ticks wait for it (but under overlap = "allow").
        runs.backlog.spawn(recover(
            cron.clone(),
            runs.metrics.clone(),
            leadership.clone(),
            runs.batchers.clone(),
            resume.interrupted.clone(),
        ));
    }
    let clock = runs.batchers.clock.clone();
    // The backlog ends, and the loop starts, at the database's time.
    let start = clock.now();
    let from = resume.frontier.or(resume.first_seen).unwrap_or(start);
    if !runs
        .catch_up(backlog(
            &cron,
            &leadership,
            (from, start),
            &settings,
            NO_LEADER,
        ))
        .await
    {
        return runs.drain().await;
    }
    let mut cursor = start.max(from);
    let mut offset = clock.offset();
    let threshold = to_delta(settings.misfire_threshold);
    loop {
        let Some(tick) = cron.schedule.next_after(cursor) else {
            info!(target: "forge::cron", cron = %cron.name, "the schedule has no further ticks");
            break;
        };
        // Wait until the tick is to be claimed, running manual ticks asked for meanwhile.
        let claim_at = tick - runs.claim_ahead;
        let due = loop {
            if let Some(at) = runs.pending_trigger() {
                if !runs.fire_manual(at).await {
                    break false;
                }
                continue;
            }
            tokio::select! {
                biased;
                _ = leadership.stopping() => break false,
                _ = stop.cancelled() => break false,
                _ = clock.sleep_until(claim_at) => break true,
                changed = board.changed() => if changed.is_err() {
                    // The board's sender lives as long as the node: not reached.
                    break tokio::select! {
                        _ = leadership.stopping() => false,
                        _ = clock.sleep_until(claim_at) => true,
                    };
                },
            }
        };
        if !due {
            break;
        }
        // The database's clock stepped forward past this tick (seen since the previous one):
        // the ticks it stepped over follow the catch-up policy, as those due while no leader
        // was. (A loop held back by runs is not stepped over: its ticks are backlog, below.)
        let now = clock.now();
        let leapt = clock.offset() - offset;
        offset = clock.offset();
        if leapt > threshold && now - tick > threshold {
            let stepped = backlog(&cron, &leadership, (cursor, now), &settings, STEPPED);
            if !runs.catch_up(stepped).await {
                break;
            }
            cursor = now;
            continue;
        }
        cursor = tick;
        // Behind: the following tick is due already. Then this one is backlog, not overlap.
        let behind = cron
            .schedule
            .next_after(tick)
            .is_some_and(|next| next <= clock.now());
        if !runs.fire(tick, behind).await {
            break;
        }
    }
    runs.drain().await
}

/// Why [`backlog`] did not run ticks: no leader when they were due.
const NO_LEADER: &str = "ticks were due while the role had no leader and are not run";
/// Why [`backlog`] did not run ticks: the database's clock stepped over them.
const STEPPED: &str = "the database's clock stepped forward over ticks that are not run";

/// The ticks due in `(from, now]` - from the frontier to the tenure's start, or stepped over
/// by the database's clock - that the catch-up policy runs, oldest first. Counts the others
/// as missed and reports them with `why`.
fn backlog(
    cron: &CronJob,
    leadership: &Leadership,
    (from, now): (DateTime<Utc>, DateTime<Utc>),
    settings: &Settings,
    why: &str,
) -> Vec<DateTime<Utc>> {
    let (due, missed) = plan::catch_up(cron, (from, now), settings.misfire_threshold);
    if missed > 0 {
        leadership
            .metrics()
            .counter(&CRON_MISSED, &metric_labels(cron, settings.per_cron))
            .increment(missed);
        warn!(target: "forge::cron", cron = %cron.name, role = %cron.role, missed, catch_up = cron.catch_up.as_str(),
              "{why}");
    }
    due
}

/// A cron's labels in the cron metrics: its name and role, or its role alone (`[metrics]
/// per_cron = false`).
pub(super) fn metric_labels(cron: &CronJob, per_cron: bool) -> Vec<(&'static str, &str)> {
    let role = ("role", cron.role.name());
    if per_cron {
        vec![("cron", cron.name.as_str()), role]
    } else {
        vec![role]
    }
}
