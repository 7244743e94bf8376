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

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use forge_core::Leadership;
use futures_util::FutureExt;
use metrics::{Counter, Histogram};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use super::clock::DbClock;
use super::ledger::{self, Board, Claim, ClaimRequest, Finish, FinishRequest, Resume};
use super::{CatchUp, CronContext, CronJob, Interrupted, Overlap, TickState};
use crate::metrics::{CRON_DURATION, CRON_LAG, CRON_MISSED, CRON_RUNS, CRON_UNKNOWN, Series};

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
}

/// The leader task of one role's crons.
pub(super) async fn supervise(
    crons: Arc<Vec<CronJob>>,
    leadership: Leadership,
    settings: Arc<Settings>,
) {
    let mut delay = Duration::from_millis(100);
    let (clock, mut resume) = loop {
        let loaded = async {
            let clock = DbClock::read(&leadership).await?;
            Ok::<_, forge_core::Error>((clock, ledger::load(&crons, &leadership).await?))
        };
        match loaded.await {
            Ok((clock, (resume, unknown))) => {
                // The registry service is the board's one writer (a read of ours could be
                // older than its latest and undo it): ask it to read the board again.
                settings.refresh_board.notify_one();
                report_unknown(&leadership, &unknown);
                break (Arc::new(clock), resume);
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
        let resume = resume.remove(&cron.name).unwrap_or_default();
        loops.spawn(run_cron(
            cron.clone(),
            leadership.clone(),
            resume,
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

/// A request to one of the tenure's batchers (the claimer, the finisher), and where its
/// answer goes.
struct Ask<Q, A> {
    request: Q,
    reply: oneshot::Sender<Result<A, String>>,
}

type Claimer = mpsc::UnboundedSender<Ask<ClaimRequest, Claim>>;
/// Answers the gate: the database's time while this tenure is current, `None` otherwise.
type Gater = mpsc::UnboundedSender<Ask<DateTime<Utc>, Option<DateTime<Utc>>>>;
type Finisher = mpsc::UnboundedSender<Ask<FinishRequest, Finish>>;

/// What the cron loops of one tenure share: its batchers, the gate's latest answer and the
/// database's clock.
#[derive(Clone)]
struct Batchers {
    /// Claims of scheduled ticks.
    claimer: Claimer,
    /// The gate before claimed ticks start.
    gater: Gater,
    /// The runs' outcomes.
    finisher: Finisher,
    /// The latest time at which a gate found this tenure current.
    gate_passed: Arc<GatePassed>,
    /// The database's clock, as this tenure follows it.
    clock: Arc<DbClock>,
}

/// The latest database time at which the gate found this tenure the current one. A tick whose
/// instant is at or before it passes the gate without asking again: the gate's promise - a
/// tick started by this tenure has its instant at or before a time at which the tenure was
/// current, so before any newer tenure's `acquired_at` (ARCHITECTURE.md, "Claiming ahead") -
/// holds for it as it did for the ticks of the answer. So the ticks due at one instant need
/// one read, even when they wake across two timer ticks and the second batch would otherwise
/// wait for the session behind the first runs' outcomes.
///
/// One answer covers only the ticks within `claim_ahead` before it: the ticks of its own
/// instant and those that woke a timer tick later. An answer read while the database's clock
/// had been stepped far ahead would otherwise let every later tick of the tenure start without
/// a gate, long after the tenure might have ended.
#[derive(Debug)]
struct GatePassed {
    at: std::sync::atomic::AtomicI64,
    /// `[cron] claim_ahead`, in microseconds.
    reach: i64,
}

impl GatePassed {
    fn new(claim_ahead: Duration) -> GatePassed {
        GatePassed {
            at: std::sync::atomic::AtomicI64::new(i64::MIN),
            reach: claim_ahead.as_micros().min(i64::MAX as u128) as i64,
        }
    }

    fn record(&self, at: DateTime<Utc>) {
        self.at
            .fetch_max(at.timestamp_micros(), std::sync::atomic::Ordering::AcqRel);
    }

    /// The recorded time, if `tick` is at or before it and within `claim_ahead` of it.
    fn covers(&self, tick: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let at = self.at.load(std::sync::atomic::Ordering::Acquire);
        let tick = tick.timestamp_micros();
        (at >= tick && at.saturating_sub(tick) <= self.reach)
            .then(|| DateTime::from_timestamp_micros(at))
            .flatten()
    }
}

/// Serves asks in batches: whatever is waiting when a batch goes out goes in one statement
/// (with many crons due at one instant, one claim and one outcome statement, one commit
/// each, instead of one per cron). Ends when every sender is gone.
async fn batches<Q, A, F, Fut>(
    leadership: Leadership,
    mut asks: mpsc::UnboundedReceiver<Ask<Q, A>>,
    run: F,
) where
    F: Fn(Leadership, Vec<Q>) -> Fut,
    Fut: Future<Output = forge_core::Result<Vec<A>>>,
{
    const MOST: usize = 1000;
    while let Some(first) = asks.recv().await {
        let mut batch = vec![first];
        // The loops of the crons due at this instant woke on the same timer tick: let them
        // run and ask (a few scheduler rounds, no sleep), so that they all go in one batch.
        loop {
            tokio::task::yield_now().await;
            let before = batch.len();
            while batch.len() < MOST {
                match asks.try_recv() {
                    Ok(ask) => batch.push(ask),
                    Err(_) => break,
                }
            }
            if batch.len() == before || batch.len() >= MOST {
                break;
            }
        }
        // Dropped answers are asks whose caller gave up waiting (it asks again: a claim then
        // finds the tick already its own, an outcome the tick already final).
        batch.retain(|ask| !ask.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let (requests, replies): (Vec<Q>, Vec<_>) = batch
            .into_iter()
            .map(|ask| (ask.request, ask.reply))
            .unzip();
        // Bounded like a single statement: a connection that went silent (half-open) must
        // not hold every later ask of the tenure behind it.
        let answered = tokio::time::timeout(
            leadership.lease_duration(),
            run(leadership.clone(), requests),
        )
        .await;
        match answered {
            Ok(Ok(answers)) => {
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(Ok(answer));
                }
            }
            failed => {
                let err = match failed {
                    Ok(Err(err)) => err.to_string(),
                    _ => "the batch got no answer in time".to_owned(),
                };
                for reply in replies {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }
}

/// Asks a batcher and waits for its answer.
async fn ask<Q, A>(batcher: &mpsc::UnboundedSender<Ask<Q, A>>, request: Q) -> Result<A, String> {
    let (reply, answer) = oneshot::channel();
    batcher
        .send(Ask { request, reply })
        .map_err(|_| "the tenure's batcher has stopped".to_owned())?;
    answer
        .await
        .map_err(|_| "the tenure's batcher has stopped".to_owned())?
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

/// One cron's loop for one tenure.
async fn run_cron(
    cron: CronJob,
    leadership: Leadership,
    resume: Resume,
    settings: Arc<Settings>,
    batchers: Batchers,
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
    if from >= now {
        return Vec::new();
    }
    let window_start = now
        .checked_sub_signed(to_delta(cron.catch_up_window))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let threshold = to_delta(settings.misfire_threshold);
    let mut missed = 0u64;
    let mut due: Vec<DateTime<Utc>> = Vec::new();
    for tick in cron.schedule.ticks_between(from, now) {
        let eligible = match cron.catch_up {
            CatchUp::Skip => now - tick <= threshold,
            CatchUp::Latest | CatchUp::All => tick >= window_start,
        };
        if !eligible {
            missed += 1;
        } else if cron.catch_up == CatchUp::Latest && !due.is_empty() {
            // Only the most recent eligible tick runs.
            missed += 1;
            due[0] = tick;
        } else {
            due.push(tick);
        }
    }
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

/// The runs of one cron in one tenure.
struct Runs {
    cron: CronJob,
    metrics: Arc<CronMetrics>,
    leadership: Leadership,
    board: SharedBoard,
    /// The tenure's batchers.
    batchers: Batchers,
    /// `[cron] claim_ahead`.
    claim_ahead: TimeDelta,
    /// The newest manual tick this loop handled (its request may still show on the board
    /// until the board is refreshed).
    last_manual: Option<DateTime<Utc>>,
    /// Runs of ticks fired on time: the overlap policy is about these.
    on_time: JoinSet<()>,
    /// Runs of backlog ticks (caught up, rerun, or reached while behind).
    backlog: JoinSet<()>,
}

/// Whether a run may start now, after the overlap rules.
enum Slot {
    /// Run it; `backlog`: it started late (it waited for the backlog), so a run still going
    /// when the next tick is due is not an overlap.
    Run { backlog: bool },
    /// Record it as skipped, with why.
    Skip(&'static str),
}

/// Why a tick is skipped under `overlap = "skip"`.
const STILL_GOING: &str = "the previous run was still going (overlap = skip)";

impl Runs {
    async fn wait_backlog(&mut self) {
        while self.backlog.join_next().await.is_some() {}
    }

    async fn wait_all(&mut self) {
        self.wait_backlog().await;
        while self.on_time.join_next().await.is_some() {}
    }

    /// On a handoff, lets runs in progress finish (the election bounds this with
    /// `drain_timeout`); on a loss they are aborted when this is dropped.
    async fn drain(mut self) {
        self.wait_all().await;
    }

    /// Applies the pause and the overlap rules before a tick runs.
    async fn slot(&mut self, backlog: bool) -> Slot {
        if self.board.borrow().paused.contains(&self.cron.name) {
            return Slot::Skip("paused");
        }
        if self.cron.overlap_policy() == Overlap::Allow {
            return Slot::Run { backlog };
        }
        if backlog {
            self.wait_all().await;
            return Slot::Run { backlog };
        }
        // A backlog run still going is not an overlap: wait for it; this tick then starts
        // late, and counts as backlog too.
        while self.backlog.try_join_next().is_some() {}
        if !self.backlog.is_empty() {
            self.wait_all().await;
            return Slot::Run { backlog: true };
        }
        while self.on_time.try_join_next().is_some() {}
        if self.on_time.is_empty() {
            return Slot::Run { backlog: false };
        }
        match self.cron.overlap_policy() {
            Overlap::Skip => Slot::Skip(STILL_GOING),
            _ => {
                while self.on_time.join_next().await.is_some() {}
                Slot::Run { backlog: false }
            }
        }
    }

    /// Claims and runs the ticks the catch-up policy kept, one after another. Returns false
    /// when this tenure can no longer act.
    async fn catch_up(&mut self, ticks: Vec<DateTime<Utc>>) -> bool {
        for tick in ticks {
            if !self.fire(tick, true).await {
                return false;
            }
        }
        true
    }

    /// Claims and runs one tick. Returns false when this tenure can no longer act.
    async fn fire(&mut self, tick: DateTime<Utc>, backlog: bool) -> bool {
        if !self.leadership.is_valid() || self.leadership.is_draining() {
            return false;
        }
        let mut slot = self.slot(backlog).await;
        if matches!(slot, Slot::Skip(STILL_GOING)) && tick > self.batchers.clock.now() {
            // Before the instant (claiming ahead) the run going may yet end in time: decide at
            // the instant, as overlap = "skip" promises.
            if !self.until(tick).await {
                return false;
            }
            slot = self.slot(backlog).await;
        }
        let (state, note) = match slot {
            Slot::Run { .. } => (TickState::Running, None),
            Slot::Skip(why) => (TickState::Skipped, Some(why)),
        };
        let retried = match self.claim(tick, state, note, false).await {
            Some((true, retried)) => retried,
            Some((false, _)) => return true,
            None => return false,
        };
        match slot {
            Slot::Skip(why) => {
                self.metrics.runs(TickState::Skipped).increment(1);
                // In the ledger, the metrics and the dashboard: a paused cron is not a line a tick.
                debug!(target: "forge::cron", cron = %self.cron.name, %tick, why, "tick skipped");
            }
            // A run whose claim had to be retried starts late through no fault of its
            // handler: if it is still going when the next tick is due, that is not an
            // overlap either.
            Slot::Run { backlog } => {
                if !self.start_when_due(tick).await {
                    return false;
                }
                self.spawn_run(tick, 1, backlog || retried)
            }
        }
        true
    }

    /// Sleeps until the database's clock reaches `at`, unless the leadership winds down first
    /// (then false).
    async fn until(&self, at: DateTime<Utc>) -> bool {
        tokio::select! {
            biased;
            _ = self.leadership.stopping() => false,
            _ = self.batchers.clock.sleep_until(at) => true,
        }
    }

    /// Waits for a claimed tick's instant and then for the gate: the database's clock at or
    /// past the instant while this tenure is still the current one. True: start the run. False:
    /// this tenure will not start it (a handover began first: the claim is deleted; or the
    /// leadership is over: the next leader takes the claim back if its tenure began before the
    /// instant, see `migrations/functions/tick_gate.sql`).
    async fn start_when_due(&self, tick: DateTime<Utc>) -> bool {
        if self.claim_ahead.is_zero() {
            // Claimed at or after the instant by the database's clock: no gate needed.
            return true;
        }
        let mut pause = Duration::from_millis(50);
        let bound = self.leadership.lease_duration();
        loop {
            if !self.until(tick).await {
                self.unclaim(tick).await;
                return false;
            }
            if self.batchers.gate_passed.covers(tick).is_some() {
                return true;
            }
            let gate = tokio::time::timeout(bound, ask(&self.batchers.gater, tick)).await;
            match gate {
                Ok(Ok(Some(now))) if now >= tick => return true,
                Ok(Ok(Some(now))) => {
                    let wait = (tick - now).to_std().unwrap_or_default();
                    debug!(target: "forge::cron", cron = %self.cron.name, %tick, wait_ms = wait.as_millis() as u64,
                           "the database says the tick is not due yet (the estimate of its clock ran ahead)");
                    if !self.pause(wait.max(Duration::from_millis(1))).await {
                        self.unclaim(tick).await;
                        return false;
                    }
                    continue;
                }
                Ok(Ok(None)) => {
                    debug!(target: "forge::cron", cron = %self.cron.name, %tick, epoch = %self.leadership.epoch(),
                           "the gate refused a claimed tick while this node still leads; checking again");
                }
                Ok(Err(err)) => retrying(
                    &self.cron,
                    tick,
                    Some(&err),
                    "cannot pass a claimed tick's gate yet",
                ),
                Err(_) => retrying(
                    &self.cron,
                    tick,
                    None,
                    "a claimed tick's gate got no answer in time",
                ),
            }
            if !self.leadership.is_valid() || !self.pause(pause).await {
                return false;
            }
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// Deletes the claim of a tick this tenure will not start because it hands over before the
    /// instant. Best effort: if it fails, the next leader takes the claim back when its tenure
    /// begins before the instant, and otherwise handles the tick per the `interrupted` policy.
    async fn unclaim(&self, tick: DateTime<Utc>) {
        if !self.leadership.is_valid() {
            return;
        }
        let bound = self.leadership.lease_duration();
        match tokio::time::timeout(
            bound,
            ledger::unclaim(&self.leadership, &self.cron.name, tick),
        )
        .await
        {
            Ok(Ok(_)) => {
                debug!(target: "forge::cron", cron = %self.cron.name, %tick, "handing over before a claimed tick's instant: claim deleted")
            }
            Ok(Err(err)) => {
                warn!(target: "forge::cron", cron = %self.cron.name, %tick, error = %err,
                      "handing over before a claimed tick's instant, and cannot delete the claim; the next leader takes it back if it leads by the instant, else applies the `interrupted` policy")
            }
            Err(_) => {
                warn!(target: "forge::cron", cron = %self.cron.name, %tick,
                      "handing over before a claimed tick's instant, and deleting the claim got no answer in time; the next leader takes it back if it leads by the instant, else applies the `interrupted` policy")
            }
        }
    }

    /// A manual run asked for ("trigger now") and not handled yet: its tick's instant.
    fn pending_trigger(&self) -> Option<DateTime<Utc>> {
        let at = *self.board.borrow().triggers.get(&self.cron.name)?;
        (self.last_manual.is_none_or(|last| at > last)).then_some(at)
    }

    /// Claims and runs a manual tick at `at`: after the runs in progress unless overlap is
    /// allowed, paused or not (an operator asked for it). Returns false when this tenure can
    /// no longer act.
    async fn fire_manual(&mut self, at: DateTime<Utc>) -> bool {
        self.last_manual = Some(at);
        if !self.leadership.is_valid() || self.leadership.is_draining() {
            return false;
        }
        if self.cron.overlap_policy() != Overlap::Allow {
            self.wait_all().await;
        }
        match self.claim(at, TickState::Running, None, true).await {
            Some((true, _)) => {
                info!(target: "forge::cron", cron = %self.cron.name, tick = %at, "running a manual tick (trigger now)");
                self.spawn_run(at, 1, true);
                true
            }
            Some((false, _)) => true,
            None => false,
        }
    }

    /// Claims a tick, retrying failures. `Some((true, retried))`: this tenure holds it, after
    /// failed tries or not; `Some((false, _))`: another tenure does; `None`: this leadership
    /// is over.
    async fn claim(
        &self,
        tick: DateTime<Utc>,
        state: TickState,
        note: Option<&'static str>,
        manual: bool,
    ) -> Option<(bool, bool)> {
        let mut pause = Duration::from_millis(50);
        let mut retried = false;
        let bound = self.leadership.lease_duration();
        loop {
            if !self.leadership.is_valid() || self.leadership.is_draining() {
                return None;
            }
            let claimed =
                tokio::time::timeout(bound, self.claim_once(tick, state, note, manual)).await;
            match claimed {
                Ok(Ok(Claim::Claimed)) => return Some((true, retried)),
                Ok(Ok(Claim::Taken)) => {
                    debug!(target: "forge::cron", cron = %self.cron.name, %tick, "tick already claimed");
                    return Some((false, retried));
                }
                Ok(Ok(Claim::Early(wait))) => {
                    debug!(target: "forge::cron", cron = %self.cron.name, %tick, wait_ms = wait.as_millis() as u64,
                           "the database says the tick is not due yet (the estimate of its clock ran ahead)");
                    if !self.pause(wait).await {
                        return None;
                    }
                    continue;
                }
                Ok(Ok(Claim::Fenced)) => {
                    debug!(target: "forge::cron", cron = %self.cron.name, %tick, epoch = %self.leadership.epoch(),
                           "the fence refused a claim while this node still leads; checking again");
                }
                Ok(Err(err)) => retrying(&self.cron, tick, Some(&err), "cannot claim a tick yet"),
                Err(_) => retrying(&self.cron, tick, None, "a claim got no answer in time"),
            }
            retried = true;
            if !self.pause(pause).await {
                return None;
            }
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// One try: a manual tick directly, a scheduled one through the tenure's claimer.
    async fn claim_once(
        &self,
        tick: DateTime<Utc>,
        state: TickState,
        note: Option<&'static str>,
        manual: bool,
    ) -> Result<Claim, String> {
        if manual {
            return ledger::claim(&self.cron, &self.leadership, tick, state, note, true)
                .await
                .map_err(|err| err.to_string());
        }
        let request = ClaimRequest {
            cron: self.cron.name.clone(),
            tick,
            state,
            note,
        };
        ask(&self.batchers.claimer, request).await
    }

    /// Sleeps, unless the leadership winds down first (then false).
    async fn pause(&self, pause: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(pause) => true,
            _ = self.leadership.stopping() => false,
        }
    }

    fn spawn_run(&mut self, tick: DateTime<Utc>, attempt: u32, backlog: bool) {
        let cron = self.cron.clone();
        let metrics = self.metrics.clone();
        let leadership = self.leadership.clone();
        let batchers = self.batchers.clone();
        let run =
            async move { run_tick(cron, metrics, leadership, &batchers, tick, attempt).await };
        if backlog {
            self.backlog.spawn(run);
        } else {
            self.on_time.spawn(run);
        }
    }
}

/// Handles the ticks earlier tenures claimed and did not finish, one after another: takes
/// each over (rerun as the next attempt, or abandoned), retrying a failed take-over until it
/// is known or this leadership ends - a tick left `running` under a dead tenure would
/// otherwise wait for the next failover - then reruns it.
async fn recover(
    cron: CronJob,
    metrics: Arc<CronMetrics>,
    leadership: Leadership,
    batchers: Batchers,
    interrupted: Vec<(DateTime<Utc>, i32, i64)>,
) {
    for (tick, attempt, epoch) in interrupted {
        let rerun = cron.interrupted == Interrupted::Rerun && attempt < MAX_TICK_ATTEMPTS;
        let mut pause = Duration::from_millis(50);
        let taken = loop {
            if !leadership.is_valid() || leadership.is_draining() {
                return;
            }
            let bound = leadership.lease_duration();
            match tokio::time::timeout(bound, ledger::reclaim(&cron, &leadership, tick, rerun))
                .await
            {
                Ok(Ok(taken)) => break taken,
                Ok(Err(err)) => retrying(
                    &cron,
                    tick,
                    Some(&err),
                    "cannot take over an interrupted tick yet",
                ),
                Err(_) => retrying(
                    &cron,
                    tick,
                    None,
                    "taking over an interrupted tick got no answer in time",
                ),
            }
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = leadership.stopping() => return,
            }
            pause = (pause * 2).min(Duration::from_secs(2));
        };
        match taken {
            Some(attempt) if rerun => {
                warn!(target: "forge::cron", cron = %cron.name, %tick, attempt, previous_epoch = epoch,
                      "rerunning a tick whose run was cut short by its leader's death");
                run_tick(
                    cron.clone(),
                    metrics.clone(),
                    leadership.clone(),
                    &batchers,
                    tick,
                    attempt as u32,
                )
                .await;
            }
            Some(_) => {
                metrics.runs(TickState::Abandoned).increment(1);
                warn!(target: "forge::cron", cron = %cron.name, %tick, attempt, previous_epoch = epoch,
                      "abandoned a tick whose run was cut short by its leader's death");
            }
            // Finished meanwhile (the earlier tenure's outcome landed late): nothing to do.
            None => {}
        }
    }
}

/// Runs a claimed tick's handler and records the outcome, in the run's span: the cron's
/// name, the tick's instant, the attempt, the role and the tenure's epoch (the handler's own
/// log lines carry them). The run's start (`fired_at`, `started_at`) and lag are by the
/// database's clock as the tenure follows it, so that they compare with the tick's instant;
/// its duration is by the monotonic clock.
async fn run_tick(
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
fn retrying(cron: &CronJob, tick: DateTime<Utc>, error: Option<&dyn fmt::Display>, what: &str) {
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

fn to_delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
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

/// One cron's Prometheus handles, looked up once per tenure: a tick then records without
/// building and looking up label sets (with thousands of crons due at one instant, that was
/// much of the time between the first tick's start and the last one's).
struct CronMetrics {
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
    fn new(cron: &CronJob, leadership: &Leadership, per_cron: bool) -> CronMetrics {
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
    fn runs(&self, outcome: TickState) -> &Counter {
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

    #[test]
    fn a_gate_answer_covers_the_ticks_at_or_before_it_and_only_grows() {
        let passed = GatePassed::new(Duration::from_millis(50));
        let t = |ms: i64| DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap();
        assert_eq!(passed.covers(t(0)), None, "nothing passed yet");
        passed.record(t(2));
        assert_eq!(passed.covers(t(0)), Some(t(2)));
        assert_eq!(
            passed.covers(t(2)),
            Some(t(2)),
            "the instant itself is covered"
        );
        assert_eq!(
            passed.covers(t(3)),
            None,
            "a later instant needs its own gate"
        );
        passed.record(t(1));
        assert_eq!(
            passed.covers(t(2)),
            Some(t(2)),
            "an older answer does not move it back"
        );
    }

    #[test]
    fn a_gate_answer_covers_only_the_ticks_within_claim_ahead_before_it() {
        let passed = GatePassed::new(Duration::from_millis(50));
        let t = |ms: i64| DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap();
        // Read while the database's clock was an hour ahead.
        passed.record(t(3_600_000));
        assert_eq!(
            passed.covers(t(1_000)),
            None,
            "a tick an hour before the answer asks the gate again"
        );
        assert_eq!(passed.covers(t(3_600_000 - 50)), Some(t(3_600_000)));
        assert_eq!(passed.covers(t(3_600_000 - 51)), None);
    }
}
