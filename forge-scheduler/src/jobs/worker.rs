//! A worker: claims jobs of one queue (or of one role's queue, on the role's leader) up to its
//! concurrency, runs each attempt in its own task ([`super::attempt`]), and records outcomes.
//!
//! One task owns all of a worker's state. It keeps at most one database round trip in flight
//! on each of its two lanes ([`Lane`]: `forge.jobs_step` records the outcomes of finished
//! attempts, then claims jobs; the record lane carries the outcomes that finish while a claim
//! travels, never the same job as the claim lane), on pool connections it holds while busy and
//! for a second after (no per-statement acquire and health check), and keeps running attempts
//! and listening meanwhile, so the database's latency overlaps with the work. A busy worker
//! needs about one statement per batch of jobs, and an idle one none at all. Every round trip
//! is bounded by a timeout: a half-open connection fails it, and is closed, instead of stalling
//! the worker.
//!
//! **The floor.** A queue worker claims after the claim-order position of the last job it
//! claimed ([`Floor`]), so it does not walk the index entries of the jobs it claimed before
//! (dead but not yet removable while any snapshot may see them), and from the head of the
//! queue again every [`FLOOR_RESCAN`] and whenever a claim from the floor comes back short.
//!
//! It claims when jobs may be waiting: at start, after a claim that took all it asked for (a
//! backlog: claim again without waiting for a notification), after a `forge_jobs` notification
//! for its queue, after the node session was restored (notifications may have been missed),
//! and every [`POLL_WHILE_DEAF`] while the node session is down: a worker never depends on
//! notifications alone.
//!
//! **Claiming ahead.** When attempts take less time than a round trip, slots would sit idle
//! while the next claim travels. The worker then claims a few jobs beyond its free slots and
//! starts them locally as slots free up: as many as `concurrency × round trip / attempt
//! duration` (moving averages), at most `CLAIM_AHEAD_MAX × concurrency`, and none for jobs
//! that take longer than a round trip. Claimed-ahead jobs are `running` in the database but
//! not started (`started_at` is set when they start); a rescue does not count such an attempt
//! (three times per job: see `forge.jobs_rescue`), and on shutdown they are released at once.
//!
//! **Reconciliation.** A worker checks its running jobs against the database
//! (`forge.jobs_reconcile`) when it starts, after a failed round trip, after a LISTEN outage,
//! when a claim came back stale, and [`RECONCILE_EVERY`] while it claims. Each reconciliation
//! takes the worker's lane (`forge.jobs_lane_take`): it waits for, or ends, the worker's round
//! trips still on the server, and advances the lane's generation, which the worker's claims carry
//! from then on with the node's incarnation. A claim with an older identity - one the worker gave
//! up on that reaches the server late, or one of a previous run of the node - takes nothing.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use forge_core::{Leadership, ListenerEvent, NodeContext};
use sqlx::Postgres;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgRow;
use tokio::sync::broadcast;
use tokio::time::{Instant, sleep, sleep_until};
use tracing::{debug, warn};

use super::attempt::{Attempts, Claimed, KindMetrics, Origin, Record, count, unusable};
use super::shared::{CHANNEL_AVAILABLE, CHANNEL_CANCEL, IdMap, IdSet, Outcome, Shared, WorkerSpec};
use super::wire::{ClaimedRow, Fate, Floor, Reconciled, Step, StepAnswer};
use super::{CancelReason, JobState, JobType};
use crate::metrics::Series;

/// How long an idle worker keeps its connection before giving it back to the pool.
const CONNECTION_LINGER: Duration = Duration::from_secs(1);

/// At most this many times the concurrency is claimed ahead of free slots. Each round trip has
/// a cost of its own beside its jobs' (the call, its commit, the lane's list), and a worker has
/// one claim in flight at a time, which asks only for the room its slots freed since the last
/// one: a backlog of short jobs drains faster in fewer, larger claims. A one-node drain of
/// no-op jobs at concurrency 16 went from about 34,700 to 38,500 jobs/s (completed kept) and
/// 40,900 to 44,100 (deleted) when this went from 32 to 64, and, with completed jobs deleted,
/// from about 39,300 to 42,700 when it went to 128 (docs/src/experiments.md, "claim batches").
const CLAIM_AHEAD_MAX: usize = 128;

/// How long a worker claims from its floor before it claims from the head of its queue again
/// (jobs that sort before its floor - a higher priority, a promoted scheduled job - wait at
/// most this long behind a backlog).
const FLOOR_RESCAN: Duration = Duration::from_millis(100);

/// How often a worker looks for jobs while the node session (and so LISTEN) is down.
const POLL_WHILE_DEAF: Duration = Duration::from_secs(1);

/// How soon a worker reconciles again after its reconciliation found jobs of its own that
/// another transaction held (a rescue or an operator's action in progress).
const RECONCILE_AGAIN: Duration = Duration::from_secs(1);

/// How often a worker that claimed since its last reconciliation reconciles even when nothing
/// failed: the longest a job claimed unseen by it (which its lane's identity should make
/// impossible) stays stranded on its node. One statement per worker per period while it claims.
const RECONCILE_EVERY: Duration = Duration::from_secs(10);

/// Runs a queue's worker on this node until the node shuts down, then drains.
pub(crate) async fn run_node_worker(shared: Arc<Shared>, ctx: NodeContext, spec: WorkerSpec) {
    let shutdown = ctx.shutdown().clone();
    let bound = shared.config.drain_timeout;
    let worker = Worker::new(shared, ctx, spec, None);
    worker
        .run(async move { shutdown.cancelled().await }, bound)
        .await;
}

/// Runs a role's worker for one tenure of the role's leadership: until the leadership winds
/// down (then drains within the leader's drain bound) or is lost (then this future is dropped,
/// the attempts are aborted, and the next leader rescues their jobs).
pub(crate) async fn run_role_worker(shared: Arc<Shared>, spec: WorkerSpec, leadership: Leadership) {
    let Some(ctx) = shared.context_until(leadership.stopping()).await else {
        return;
    };
    // Leave time to record the drained outcomes before the node aborts the leader task.
    let bound = shared.config.drain_timeout.min(
        shared
            .election_drain
            .saturating_sub(Duration::from_millis(500)),
    );
    let stopping = leadership.clone();
    let worker = Worker::new(shared, ctx, spec, Some(leadership));
    worker
        .run(async move { stopping.stopping().await }, bound)
        .await;
}

/// A worker's two connections. Round trips on the claim lane record outcomes, mark started
/// jobs, reconcile and claim; while one is in flight, the outcomes that finish meanwhile go on
/// the record lane. Under load the two run side by side on two backends; a quiet worker uses
/// only the claim lane (one statement per batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lane {
    Claim,
    Record,
}

impl Lane {
    fn other(self) -> Lane {
        match self {
            Lane::Claim => Lane::Record,
            Lane::Record => Lane::Claim,
        }
    }
}

/// What a round trip brings back.
struct RoundTrip {
    lane: Lane,
    /// The outcomes it carried (to count, or to send again after an error).
    records: Vec<Record>,
    /// The claimed-ahead jobs it marked started (to send again after an error).
    started: Vec<i64>,
    /// How many jobs it asked for.
    limit: usize,
    /// Rows of `forge.jobs_reconcile`, when it reconciled.
    reconciled: Option<Vec<Reconciled>>,
    /// Rows of `forge.jobs_step`.
    result: Result<Vec<PgRow>, sqlx::Error>,
    took: Duration,
    /// The connection, for the next round trip (`None` after an error: it may be broken).
    conn: Option<PoolConnection<Postgres>>,
}

type InFlight = Pin<Box<dyn Future<Output = RoundTrip> + Send>>;

/// An exponential moving average.
#[derive(Default)]
struct Average(Option<f64>, u32);

impl Average {
    /// Samples needed before the average is trusted: one unusually fast attempt (a job that
    /// fails at once) must not make a worker claim a backlog ahead that idle nodes could run.
    const TRUSTED_AFTER: u32 = 8;

    fn add(&mut self, value: f64) {
        self.1 = self.1.saturating_add(1);
        self.0 = Some(match self.0 {
            Some(mean) => mean + (value - mean) / 8.0,
            None => value,
        });
    }

    /// The mean, once enough samples were seen.
    fn trusted(&self) -> Option<f64> {
        self.0.filter(|_| self.1 >= Average::TRUSTED_AFTER)
    }
}

/// What the worker wants to do next.
#[derive(Default)]
struct Wants {
    /// Jobs may be waiting: claim when there is room.
    claim: bool,
    /// Check this worker's running jobs against the database in the next round trip.
    reconcile: bool,
    /// Winding down: claim nothing more.
    stopping: bool,
    /// The node session is down: poll for jobs.
    deaf: bool,
    /// No heartbeat of this node has landed for nearly `down_after`: its jobs may be rescued
    /// elsewhere, so its attempts were stopped and it claims nothing until it is heard again.
    cut_off: bool,
    /// Reconcile again then: the last reconciliation found jobs of this worker that another
    /// transaction held.
    reconcile_at: Option<Instant>,
    /// A claim was sent since the last reconciliation: reconcile within [`RECONCILE_EVERY`] of
    /// that reconciliation.
    claimed_since_reconcile: bool,
    /// The queue's limits cut the last claim short: claim again then (the window lets a claim
    /// through, or a slot may have freed unheard).
    claim_at: Option<Instant>,
}

struct Worker {
    shared: Arc<Shared>,
    ctx: NodeContext,
    spec: WorkerSpec,
    origin: Arc<Origin>,
    /// The notification payload target that concerns this worker: the queue, or `@role`.
    target: String,
    attempts: Attempts,
    wants: Wants,
    metrics: HashMap<&'static str, KindMetrics>,
    /// Moving averages of a round trip and of an attempt, in seconds.
    pace: (Average, Average),
    /// The time taken by attempts finished since the cluster's tally last had it (seconds),
    /// and how many: added to the tally with a round trip's outcomes, not at each attempt.
    untallied: (f64, f64),
    /// The connections of the two lanes, held while the worker is busy.
    conns: [Option<PoolConnection<Postgres>>; 2],
    /// The jobs each lane's round trip in flight writes (outcomes, started marks).
    in_flight: [IdSet<i64>; 2],
    /// Where the next claim may start (see `forge.jobs_step`), and until when: `None` after a
    /// claim that came back short (the queue's end was reached) or past `FLOOR_RESCAN`.
    floor: Option<(Floor, Instant)>,
    /// The lane's generation from the last reconciliation: with the node's incarnation, the
    /// identity the worker's claims carry (`None` until the first, which every worker starts
    /// with).
    generation: Option<i64>,
    /// When the last reconciliation was answered.
    reconciled_at: Instant,
    /// The last claim answered that the queue has cluster-wide limits (`forge.queue_limits`):
    /// claim no job ahead of a free slot (it would hold a slot, or a rate's share, idle).
    limited: bool,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Dropped without draining (a role's leadership was lost): the JoinSet aborts the
        // attempts; tell what they spawned.
        self.attempts.cancel_all(CancelReason::Shutdown);
    }
}

impl Worker {
    fn new(
        shared: Arc<Shared>,
        ctx: NodeContext,
        spec: WorkerSpec,
        leadership: Option<Leadership>,
    ) -> Worker {
        let target = match &spec.role {
            Some(role) => format!("@{role}"),
            None => spec.queue.clone(),
        };
        let metrics = spec
            .kinds
            .iter()
            .map(|kind| {
                // A role worker's jobs are labelled with the queue their type declares.
                let queue = match (&spec.role, shared.types.get(kind)) {
                    (Some(_), Some(ty)) => ty.options.queue.as_str(),
                    _ => spec.queue.as_str(),
                };
                (*kind, KindMetrics::new(ctx.metrics(), queue, kind))
            })
            .collect();
        let origin = Origin {
            queue: spec.queue.as_str().into(),
            namespace: shared.namespace.clone(),
            node_id: ctx.node_id().clone(),
            pool: ctx.pool().clone(),
            leadership,
            keep_completed: shared.config.keeps_completed(),
            max_output_bytes: shared.config.max_output_bytes,
            metrics: ctx.metrics().node_wide(),
            max_snoozes: shared.config.max_snoozes,
            default_max_attempts: shared.default_max_attempts(),
            statement_bound: shared.statement_bound,
        };
        Worker {
            wants: Wants {
                claim: true,
                // Every worker starts by taking its lane (the identity of its claims); a role
                // worker's also rescues what ended tenures of its role left running.
                reconcile: true,
                ..Wants::default()
            },
            shared,
            ctx,
            spec: WorkerSpec {
                concurrency: spec.concurrency.max(1),
                ..spec
            },
            origin: Arc::new(origin),
            target,
            attempts: Attempts::default(),
            metrics,
            pace: (Average::default(), Average::default()),
            untallied: (0.0, 0.0),
            conns: [None, None],
            in_flight: [IdSet::default(), IdSet::default()],
            floor: None,
            generation: None,
            reconciled_at: Instant::now(),
            limited: false,
        }
    }

    fn tenure(&self) -> (Option<i64>, Option<i64>) {
        match &self.origin.leadership {
            Some(l) => (Some(l.epoch().0), Some(l.tenure_id())),
            None => (None, None),
        }
    }

    /// How many jobs to claim now, and how many of them can start at once.
    fn room(&self) -> (usize, usize) {
        let held = self.attempts.running() + self.attempts.claimed.len();
        let ahead = match self.limited {
            true => 0,
            false => claim_ahead(self.spec.concurrency, self.pace.0.0, self.pace.1.trusted()),
        };
        room(self.spec.concurrency, held, ahead)
    }

    /// The arguments of the next round trip.
    fn step(&self, records: &[Record], started: &[i64], limit: usize, start: usize) -> Step {
        let (epoch, tenure) = self.tenure();
        Step {
            namespace: self.shared.namespace.name().to_owned(),
            node: self.ctx.node_id().as_str().to_owned(),
            queue: match self.spec.role {
                Some(_) => None,
                None => Some(self.spec.queue.clone()),
            },
            role: self.spec.role.as_ref().map(|r| r.name().to_owned()),
            epoch,
            tenure,
            incarnation: self.ctx.incarnation(),
            generation: self.generation,
            kinds: self.spec.kinds.clone(),
            limit: limit as i32,
            start: start as i32,
            started: started.to_vec(),
            ids: records.iter().map(|r| r.id).collect(),
            attempts: records.iter().map(|r| r.attempt).collect(),
            states: records.iter().map(|r| r.outcome).collect(),
            delays: records.iter().map(|r| r.delay_ms).collect(),
            errors: records.iter().map(|r| r.error.clone()).collect(),
            default_max: self.shared.default_max_attempts(),
            after: None,
            keep_completed: self.origin.keep_completed,
            held: None,
            // Up to three waits and two session ends fit in one round trip's bound.
            reconcile_wait_ms: self.shared.lane_wait_ms(),
        }
    }

    /// Whether a round trip on the claim lane has something to do. (A reconciliation waits
    /// while the record lane is busy: see [`Worker::send`].)
    fn needs_round_trip(&self, recording: bool) -> bool {
        !self.attempts.records.is_empty()
            || !self.attempts.started_ahead.is_empty()
            || (self.wants.reconcile && !recording)
            || (self.wants.claim && !self.wants.stopping && self.room().0 > 0)
    }

    fn fill(&mut self) {
        // A node cut off from the cluster starts nothing: it releases what it claimed ahead.
        self.attempts.fill(
            self.spec.concurrency,
            self.wants.stopping || self.wants.cut_off,
            &self.origin,
        );
        if self.attempts.durations.is_empty() {
            return;
        }
        for (kind, took) in self.attempts.durations.drain(..) {
            self.pace.1.add(took);
            if let Some(m) = self.metrics.get(kind) {
                m.duration.record(took);
            }
            self.untallied.0 += took;
            self.untallied.1 += 1.0;
        }
        if self.attempts.records.is_empty() {
            // No round trip is due to carry them (a snooze, a rescued job's end).
            self.tally_attempts();
        }
    }

    /// Adds the attempts finished since the last time to the cluster's tally.
    fn tally_attempts(&mut self) {
        let (sum, attempts) = std::mem::take(&mut self.untallied);
        if attempts > 0.0 {
            let tally = self.ctx.metrics().tally();
            tally.add(Series::JobDurationSum.as_str(), &self.spec.queue, sum);
            tally.add(Series::JobAttempts.as_str(), &self.spec.queue, attempts);
        }
    }

    async fn run(mut self, stop: impl Future<Output = ()>, drain_bound: Duration) {
        tokio::pin!(stop);
        let mut events = self.ctx.subscribe();
        // The round trip in flight on each lane; whether the claim lane's reconciles.
        let mut claiming: Option<InFlight> = None;
        let mut recording: Option<InFlight> = None;
        let mut reconciling = false;
        let mut failures = 0u32;
        let mut retry_at: Option<Instant> = None;
        // When the worker last became idle (nothing running, claimed or in flight).
        let mut idle_since: Option<Instant> = None;
        loop {
            self.fill();
            if retry_at.is_none() {
                if claiming.is_none() && self.needs_round_trip(recording.is_some()) {
                    let reconcile = self.wants.reconcile && recording.is_none();
                    claiming = self.send(Lane::Claim, reconcile);
                    reconciling = reconcile && claiming.is_some();
                }
                // Outcomes that finished while a claim travels go on their own, unless that
                // claim reconciles: it must see them as this worker's (still running); or the
                // queue has limits: they wait for the next claim, which records them (see
                // `send`).
                if recording.is_none()
                    && !reconciling
                    && !self.limited
                    && !self.attempts.records.is_empty()
                {
                    recording = self.send(Lane::Record, false);
                }
            }
            let trip = tokio::select! {
                biased;
                _ = &mut stop => break,
                trip = async { claiming.as_mut().expect("guarded").await }, if claiming.is_some() => {
                    claiming = None;
                    reconciling = false;
                    Some(trip)
                }
                trip = async { recording.as_mut().expect("guarded").await }, if recording.is_some() => {
                    recording = None;
                    Some(trip)
                }
                _ = async { sleep_until(retry_at.expect("guarded")).await }, if retry_at.is_some() => {
                    retry_at = None;
                    None
                }
                Some(joined) = self.attempts.next_finished() => {
                    self.attempts.collect(joined, &self.origin);
                    None
                }
                event = events.recv() => {
                    self.hear(event);
                    None
                }
                _ = sleep(POLL_WHILE_DEAF), if self.wants.deaf => {
                    self.wants.claim = true;
                    None
                }
                _ = sleep_until(self.ctx.standing().until()),
                    if self.wants.deaf && !self.wants.cut_off && self.attempts.has_tasks() => {
                    // (A heartbeat through the pool may have moved the instant meanwhile.)
                    if Instant::now() >= self.ctx.standing().until() {
                        self.cut_off();
                    }
                    None
                }
                _ = async { sleep_until(self.wants.claim_at.expect("guarded")).await },
                    if self.wants.claim_at.is_some() => {
                    self.wants.claim_at = None;
                    self.wants.claim = true;
                    None
                }
                _ = async { sleep_until(self.wants.reconcile_at.expect("guarded")).await },
                    if self.wants.reconcile_at.is_some() => {
                    self.wants.reconcile_at = None;
                    self.wants.reconcile = true;
                    None
                }
                _ = sleep_until(self.reconciled_at + RECONCILE_EVERY),
                    if self.wants.claimed_since_reconcile && !self.wants.reconcile => {
                    self.wants.reconcile = true;
                    None
                }
                // Idle for a while: give the connections back to the pool. (Kept meanwhile, so
                // that a steady trickle of jobs needs no acquire and health check per claim.)
                _ = async { sleep_until(idle_since.expect("guarded") + CONNECTION_LINGER).await },
                    if idle_since.is_some() && self.conns.iter().any(Option::is_some) => {
                    self.conns = [None, None];
                    None
                }
            };
            if let Some(trip) = trip {
                match self.receive(trip) {
                    Ok(()) => failures = 0,
                    Err(err) => {
                        failures += 1;
                        let pause = Duration::from_millis(50 << failures.min(6))
                            .min(self.shared.check_interval.max(Duration::from_millis(100)));
                        warn!(target: "forge::job", queue = %self.spec.queue, error = %err,
                              retry_in_ms = pause.as_millis() as u64, "job round trip failed");
                        retry_at = Some(Instant::now() + pause);
                    }
                }
            }
            if claiming.is_none() && recording.is_none() && self.attempts.is_idle() {
                idle_since.get_or_insert_with(Instant::now);
            } else {
                idle_since = None;
            }
        }
        self.wants.stopping = true;
        // A claim abandoned half-way would leave jobs running under this node's name that
        // nobody runs: let the round trips in flight finish.
        for trip in [claiming, recording].into_iter().flatten() {
            let trip = trip.await;
            let _ = self.receive(trip);
        }
        self.drain(drain_bound, &mut events).await;
        self.conns = [None, None];
    }

    /// Graceful stop: claim nothing more, release the jobs claimed ahead, let running attempts
    /// finish for up to `bound`, then stop them and release their jobs.
    async fn drain(&mut self, bound: Duration, events: &mut broadcast::Receiver<ListenerEvent>) {
        self.wants.stopping = true;
        self.fill();
        let deadline = Instant::now() + bound;
        if self.attempts.running() > 0 {
            debug!(target: "forge::job", queue = %self.spec.queue, running = self.attempts.running(),
                   bound_ms = bound.as_millis() as u64, "draining");
        }
        loop {
            if !self.attempts.records.is_empty() {
                if let Err(err) = self.round_trip_now().await {
                    warn!(target: "forge::job", queue = %self.spec.queue, error = %err, "recording outcomes failed while draining");
                    if Instant::now() >= deadline {
                        break;
                    }
                    sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
            if !self.attempts.has_tasks() {
                break;
            }
            tokio::select! {
                Some(joined) = self.attempts.next_finished() => self.attempts.collect(joined, &self.origin),
                event = events.recv() => self.hear(event),
                _ = sleep_until(deadline) => break,
            }
        }
        if self.attempts.has_tasks() {
            warn!(target: "forge::job", queue = %self.spec.queue, running = self.attempts.running(),
                  "attempts did not finish within the drain bound; stopping them and releasing their jobs");
            self.attempts.stop_all(&self.origin).await;
        }
        for _ in 0..3 {
            if self.attempts.records.is_empty() {
                break;
            }
            if let Err(err) = self.round_trip_now().await {
                warn!(target: "forge::job", queue = %self.spec.queue, error = %err,
                      "recording outcomes failed at shutdown; the jobs will be rescued");
                sleep(Duration::from_millis(200)).await;
            }
        }
    }

    async fn round_trip_now(&mut self) -> Result<(), sqlx::Error> {
        let reconcile = self.wants.reconcile;
        match self.send(Lane::Claim, reconcile) {
            Some(trip) => {
                let trip = trip.await;
                self.receive(trip)
            }
            None => Ok(()),
        }
    }

    fn hear(&mut self, event: Result<ListenerEvent, broadcast::error::RecvError>) {
        match event {
            Ok(ListenerEvent::Notification { channel, payload }) => {
                let mut words = payload.split(' ');
                if words.next() != Some(self.shared.namespace.name()) {
                    return;
                }
                if &*channel == CHANNEL_AVAILABLE {
                    if words.next() == Some(self.target.as_str()) {
                        self.wants.claim = true;
                    }
                } else if &*channel == CHANNEL_CANCEL
                    && words.next() == Some(self.ctx.node_id().as_str())
                    && let Some(id) = words.next().and_then(|w| w.parse::<i64>().ok())
                {
                    self.attempts.cancel(id, CancelReason::Requested);
                }
            }
            Ok(ListenerEvent::Lost) => {
                // Until the node session is back, notifications are not heard: poll.
                self.wants.deaf = true;
            }
            Ok(ListenerEvent::Restored) | Err(broadcast::error::RecvError::Lagged(_)) => {
                // Notifications may have been missed, or this node was marked down and
                // rejoined: look for jobs, cancels and jobs taken away. Even an idle worker
                // reconciles: after a lossy failover the new primary can hold a job running
                // here whose completion committed on the old primary only.
                self.wants.deaf = false;
                self.wants.cut_off = false;
                self.wants.claim = true;
                self.wants.reconcile = true;
            }
            _ => {}
        }
    }

    /// Builds the next round trip of a lane: on the claim lane, reconcile (when asked), record
    /// outcomes, mark started jobs and claim up to the room; on the record lane, record
    /// outcomes only.
    /// Returns `None` when the lane has nothing to send (everything pending concerns jobs the
    /// other lane's round trip is writing: they wait for it, so that the two never wait on each
    /// other's row locks).
    fn send(&mut self, lane: Lane, reconcile: bool) -> Option<InFlight> {
        let deposed = self
            .origin
            .leadership
            .as_ref()
            .is_some_and(|l| !l.is_valid());
        if deposed || self.wants.cut_off {
            // A deposed leader, or a node cut off from the cluster, claims nothing; outcomes
            // are still recorded (guarded).
            self.wants.claim = false;
        }
        // Under the queue's limits, a round trip that records outcomes claims too: the slots
        // they free are taken again in the same commit, so that the limit's slots never show
        // free while jobs wait (a trip of outcomes alone would free them until a claim that
        // its notification wakes).
        let claim = self.wants.claim || (self.limited && !self.attempts.records.is_empty());
        let (limit, start) = if lane == Lane::Claim && claim && !self.wants.stopping {
            self.room()
        } else {
            (0, 0)
        };
        if limit > 0 {
            // This claim answers the wish; a notification heard while it is in flight (a job
            // committed after its snapshot) makes a new one, which its answer must not erase.
            self.wants.claim = false;
            self.wants.claimed_since_reconcile = true;
        }
        let other = &self.in_flight[lane.other() as usize];
        let (records, deferred): (Vec<Record>, Vec<Record>) =
            std::mem::take(&mut self.attempts.records)
                .into_iter()
                .partition(|r| !other.contains(&r.id));
        self.attempts.records = deferred;
        if !self.attempts.started_ahead.is_empty() && !records.is_empty() {
            // An outcome of a job claimed ahead says that it started: marking it started as
            // well would only write one more row version.
            let finished: IdSet<i64> = records.iter().map(|r| r.id).collect();
            self.attempts
                .started_ahead
                .retain(|id| !finished.contains(id));
        }
        let mut started = match lane {
            Lane::Claim => std::mem::take(&mut self.attempts.started_ahead),
            Lane::Record => Vec::new(),
        };
        // (A mark of a job whose outcome the other lane is recording is moot.)
        started.retain(|id| !other.contains(id));
        if limit == 0 && records.is_empty() && started.is_empty() && !reconcile {
            return None;
        }
        self.in_flight[lane as usize] = records
            .iter()
            .map(|r| r.id)
            .chain(started.iter().copied())
            .collect();
        let reconcile = (reconcile && std::mem::take(&mut self.wants.reconcile)).then(|| {
            // (This trip's own claim, if any, follows the reconciliation.)
            self.wants.claimed_since_reconcile = limit > 0;
            // The jobs whose outcomes this trip records are still running in the database
            // until it does: they are this worker's, not orphans to rescue.
            let (mut ids, mut attempts) = self.attempts.held();
            ids.extend(records.iter().map(|r| r.id));
            attempts.extend(records.iter().map(|r| r.attempt));
            (ids, attempts)
        });
        let mut step = self.step(&records, &started, limit, start);
        if limit > 0 {
            // What the lane's list names after this claim, besides the jobs it claims (see
            // `forge.jobs_step`): every job this worker holds whose outcome this trip does not
            // record - running, claimed ahead, outcomes waiting or in flight on the other lane.
            // (Claims travel on this lane only, so no other claim is in flight.)
            let (mut held, _) = self.attempts.held();
            held.extend(self.attempts.records.iter().map(|r| r.id));
            held.extend(self.in_flight[Lane::Record as usize].iter().copied());
            step.held = Some(held);
        }
        if limit > 0 && self.spec.role.is_none() {
            step.after = self
                .floor
                .filter(|(_, until)| Instant::now() < *until)
                .map(|(floor, _)| floor);
            if step.after.is_none() {
                self.floor = None;
            }
        }
        let conn = self.conns[lane as usize].take();
        let pool = self.ctx.pool().clone();
        let bound = self.shared.statement_bound;
        Some(Box::pin(async move {
            let began = Instant::now();
            let (reconciled, result, conn) = step.run(conn, &pool, reconcile, bound).await;
            RoundTrip {
                lane,
                records,
                started,
                limit,
                reconciled,
                result,
                took: began.elapsed(),
                conn,
            }
        }))
    }

    /// No heartbeat of this node has landed for nearly `down_after` (see
    /// [`forge_core::Standing`]): stop every attempt and give back the jobs claimed ahead
    /// before the scheduler leader can rescue them, so that no attempt of this node runs
    /// beside its successor. Their outcomes (released) are recorded if the node reaches
    /// PostgreSQL again while the jobs are still its own.
    fn cut_off(&mut self) {
        warn!(target: "forge::job", queue = %self.spec.queue, running = self.attempts.running(),
              "no heartbeat of this node has landed for nearly down_after: stopping its attempts, which may be rescued elsewhere");
        self.wants.cut_off = true;
        self.wants.claim = false;
        self.attempts.cancel_all(CancelReason::CutOff);
    }

    /// Takes in what a round trip brought back.
    fn receive(&mut self, trip: RoundTrip) -> Result<(), sqlx::Error> {
        let asked = trip.limit > 0;
        let received = self.receive_rows(trip);
        if received.is_err() && asked {
            // The claim's answer is lost: jobs may be waiting; claim again (after the pause).
            self.wants.claim = true;
        }
        received
    }

    fn receive_rows(&mut self, trip: RoundTrip) -> Result<(), sqlx::Error> {
        self.conns[trip.lane as usize] = trip.conn;
        self.in_flight[trip.lane as usize].clear();
        if let Some(rows) = trip.reconciled {
            self.reconciled(rows);
        }
        let rows = match trip.result {
            Ok(rows) => rows,
            Err(err) => {
                // Send them again: outcomes are guarded, so a repeat of an outcome that was
                // recorded after all changes nothing. A claim whose answer was lost is settled
                // by the reconciliation: it first waits for (or ends) every round trip of this
                // worker still on the server, so a claim that commits late is seen and its jobs
                // given back, and it advances the lane's generation, so a claim that reaches
                // the server only later takes nothing (see `forge.jobs_lane_take`).
                let mut records = trip.records;
                records.append(&mut self.attempts.records);
                self.attempts.records = records;
                self.attempts.started_ahead.extend(trip.started);
                self.wants.reconcile = true;
                return Err(err);
            }
        };
        self.pace.0.add(trip.took.as_secs_f64());
        // Outcome rows come only for the outcomes not recorded as asked.
        let mut exceptions: IdMap<i64, Option<JobState>> = IdMap::default();
        let mut ahead = Vec::new();
        let mut claimed = 0usize;
        let mut highest: Option<Floor> = None;
        let mut paced = false;
        if trip.limit > 0 {
            // (Answered afresh by each claim.)
            self.limited = false;
        }
        for row in &rows {
            match StepAnswer::decode(row)? {
                StepAnswer::Claimed(job) => {
                    claimed += 1;
                    if highest.is_none_or(|h| job.position > h) {
                        highest = Some(job.position);
                    }
                    // Jobs the claim marked started go first; the ones claimed ahead wait.
                    if job.ahead() {
                        ahead.push(job);
                    } else {
                        self.take(job, true);
                    }
                }
                StepAnswer::Exception { id, recorded_as } => {
                    exceptions.insert(id, recorded_as);
                }
                StepAnswer::Limited { wait_ms } => {
                    self.limited = true;
                    self.claim_after(wait_ms);
                }
                StepAnswer::Paced { wait_ms } => {
                    paced = true;
                    self.claim_after(wait_ms);
                }
                StepAnswer::Stale => {
                    // The lane was taken since this worker's last reconciliation (the node's
                    // id restarted elsewhere, the database failed over to a standby that
                    // missed the last one): take it back, then claim.
                    warn!(target: "forge::job", queue = %self.spec.queue,
                          "a claim carried a stale lane identity and took nothing; reconciling");
                    self.wants.reconcile = true;
                    self.wants.claim = true;
                }
            }
        }
        // In the claim's order (priority first): the claim answers them in the order of their
        // rows in the table.
        ahead.sort_by(|a, b| {
            a.position
                .partial_cmp(&b.position)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        for job in ahead {
            self.take(job, false);
        }
        // The cluster series, added to the tally once per round trip rather than per job.
        let mut series: BTreeMap<Series, f64> = BTreeMap::new();
        for record in &trip.records {
            let recorded = match exceptions.get(&record.id) {
                Some(instead) => *instead,
                None => Some(record.outcome.recorded_as()),
            };
            if recorded.is_some() && record.failed {
                *series.entry(Series::JobsFailed).or_default() += 1.0;
            }
            if let Some(name) = count(&self.metrics, record, recorded, &self.spec.queue) {
                *series.entry(name).or_default() += 1.0;
            }
        }
        let tally = self.ctx.metrics().tally();
        for (name, n) in series {
            tally.add(name.as_str(), &self.spec.queue, n);
        }
        self.tally_attempts();
        if trip.limit > 0 && claimed == trip.limit {
            // All it asked for: more may be waiting, claim again as soon as there is room.
            self.wants.claim = true;
            if let Some(highest) = highest {
                let until = match self.floor {
                    Some((_, until)) => until,
                    None => Instant::now() + FLOOR_RESCAN,
                };
                self.floor = Some((highest, until));
            }
        } else if trip.limit > 0 {
            // The end of the queue (from the floor): look from the head next time.
            self.floor = None;
        }
        if paced {
            // Jobs of limited kinds were passed over: they may be in reach next time.
            self.floor = None;
        }
        Ok(())
    }

    /// Claims again after `wait_ms` (a limit cut the claim short), or sooner if asked sooner.
    fn claim_after(&mut self, wait_ms: Option<f64>) {
        if let Some(ms) = wait_ms {
            let at = Instant::now() + Duration::from_secs_f64(ms.max(0.0) / 1000.0);
            self.wants.claim_at = Some(self.wants.claim_at.map_or(at, |t| t.min(at)));
        }
    }

    fn reconciled(&mut self, rows: Vec<Reconciled>) {
        self.reconciled_at = Instant::now();
        for row in rows {
            match row {
                Reconciled::Lane(generation) => self.generation = Some(generation),
                Reconciled::Job(id, Fate::Cancel) => {
                    self.attempts.cancel(id, CancelReason::Requested)
                }
                Reconciled::Job(id, Fate::Unsettled) => {
                    debug!(target: "forge::job", queue = %self.spec.queue, id,
                           "a job of this worker is held by another transaction; reconciling again shortly");
                    self.wants.reconcile_at = Some(Instant::now() + RECONCILE_AGAIN);
                }
                Reconciled::Job(id, Fate::Gone) => {
                    warn!(target: "forge::job", queue = %self.spec.queue, id,
                          "the job was taken away from this node (rescued while it seemed down); stopping the attempt");
                    self.attempts.cancel(id, CancelReason::Rescued);
                }
            }
        }
    }

    /// Queues a claimed job to start. A job that cannot become an attempt - arguments that do
    /// not decode (such as JSON nested deeper than the decoder accepts), a kind this node does
    /// not know - is answered with an outcome instead, so it never strands its batch.
    fn take(&mut self, job: ClaimedRow, started_by_claim: bool) {
        let ClaimedRow {
            id,
            attempt,
            kind,
            args,
            max_attempts,
            timeout_ms,
            pickup_ms,
            ..
        } = job;
        let Some(ty) = self.shared.types.get(kind.as_str()).cloned() else {
            // Claims filter on this worker's kinds, so this cannot happen; give it back.
            warn!(target: "forge::job", queue = %self.spec.queue, job = %kind, id, "claimed a job of an unknown kind; releasing it");
            let why = format!("node {} does not know this job kind", self.ctx.node_id());
            self.attempts
                .records
                .push(unusable(id, attempt, "unknown", why, Outcome::Released));
            return;
        };
        let args = match args.0 {
            Ok(args) => args,
            Err(err) => {
                warn!(target: "forge::job", queue = %self.spec.queue, job = ty.kind, id, error = %err,
                      "the job's arguments cannot be decoded; dead-lettering it");
                let why = format!("the job's arguments cannot be decoded: {err}");
                self.attempts
                    .records
                    .push(unusable(id, attempt, ty.kind, why, Outcome::Dead));
                return;
            }
        };
        if let (Some(m), Some(ms)) = (self.metrics.get(ty.kind), pickup_ms) {
            m.pickup.record(ms.max(0.0) / 1000.0);
        }
        let (max_attempts, timeout) = limits(
            max_attempts,
            timeout_ms,
            &ty,
            self.shared.config.default_max_attempts,
        );
        self.attempts.claimed.push_back(Claimed {
            id,
            attempt,
            ty,
            args,
            max_attempts,
            timeout,
            started_by_claim,
        });
    }
}

/// How many jobs beyond free slots to hold (see "claiming ahead"): as many as
/// `concurrency × round trip / attempt` when attempts are shorter than a round trip (moving
/// averages, the attempt's once trusted), at most `CLAIM_AHEAD_MAX × concurrency`.
fn claim_ahead(concurrency: usize, trip: Option<f64>, attempt: Option<f64>) -> usize {
    match (trip, attempt) {
        (Some(trip), Some(attempt)) if attempt < trip => {
            let ahead = concurrency as f64 * trip / attempt.max(1e-6);
            (ahead as usize).min(CLAIM_AHEAD_MAX * concurrency)
        }
        _ => 0,
    }
}

/// With `held` jobs running or waiting to start: how many to claim now, and how many of them
/// can start at once.
fn room(concurrency: usize, held: usize, ahead: usize) -> (usize, usize) {
    let free = concurrency.saturating_sub(held);
    let room = (concurrency + ahead).saturating_sub(held);
    (room, free.min(room))
}

/// An attempt's limits: the job's own, else its type's, else the default (attempts at least 1,
/// a timeout at least 1 ms).
fn limits(
    max_attempts: Option<i32>,
    timeout_ms: Option<i64>,
    ty: &JobType,
    default_max_attempts: u32,
) -> (u32, Option<Duration>) {
    let max_attempts = max_attempts
        .map(|n| n.max(1) as u32)
        .or(ty.options.max_attempts)
        .unwrap_or(default_max_attempts)
        .max(1);
    let timeout = timeout_ms
        .map(|ms| Duration::from_millis(ms.max(1) as u64))
        .or(ty.options.timeout);
    (max_attempts, timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_counts_free_slots_and_the_jobs_claimed_ahead() {
        // Idle, no claiming ahead: the concurrency, all startable.
        assert_eq!(room(4, 0, 0), (4, 4));
        // Two held: two free.
        assert_eq!(room(4, 2, 0), (2, 2));
        // Claiming 8 ahead: 10 to claim, 2 of them start now.
        assert_eq!(room(4, 2, 8), (10, 2));
        // Full, more held than the concurrency (claimed ahead): nothing startable.
        assert_eq!(room(4, 6, 8), (6, 0));
        assert_eq!(room(4, 20, 8), (0, 0));
    }

    #[test]
    fn jobs_are_claimed_ahead_only_when_attempts_are_shorter_than_a_round_trip() {
        assert_eq!(claim_ahead(4, None, Some(0.001)), 0);
        assert_eq!(claim_ahead(4, Some(0.005), None), 0, "not trusted yet");
        assert_eq!(claim_ahead(4, Some(0.005), Some(0.010)), 0);
        assert_eq!(claim_ahead(4, Some(0.5), Some(0.125)), 16);
        assert_eq!(
            claim_ahead(4, Some(1.0), Some(0.0)),
            CLAIM_AHEAD_MAX * 4,
            "capped"
        );
    }

    #[test]
    fn an_average_is_trusted_after_enough_samples() {
        let mut average = Average::default();
        for _ in 1..Average::TRUSTED_AFTER {
            average.add(1.0);
        }
        assert_eq!(average.trusted(), None);
        average.add(1.0);
        assert_eq!(average.trusted(), Some(1.0));
        average.add(9.0);
        assert_eq!(average.trusted(), Some(2.0));
    }
}
