//! A worker: claims jobs of one queue (or of one role's queue, on the role's leader) up to its
//! concurrency, runs each attempt in its own task, and records outcomes.
//!
//! One task owns all of a worker's state. It keeps at most one database round trip in flight
//! (`forge.jobs_step`: record the outcomes of finished attempts, then claim jobs), on a pool
//! connection it holds while busy and for a second after (no per-statement acquire and health
//! check), and keeps
//! running attempts and listening meanwhile, so the database's latency overlaps with the work.
//! Outcomes that finish while a round trip is in flight travel in the next one, so a busy
//! worker needs about one statement per batch of jobs, and an idle one none at all. (Two round
//! trips in flight on two connections were measured slower on 2 cores: they split the batches.)
//!
//! It claims when jobs may be waiting: at start, after a claim that took all it asked for (a
//! backlog: claim again without waiting for a notification), after a `forge_jobs` notification
//! for its queue, and after the LISTEN session was restored (notifications may have been
//! missed).
//!
//! **Claiming ahead.** When attempts take less time than a round trip, slots would sit idle
//! while the next claim travels. The worker then claims a few jobs beyond its free slots and
//! starts them locally as slots free up: as many as `concurrency × round trip / attempt
//! duration` (moving averages), at most `CLAIM_AHEAD_MAX × concurrency`, and none for jobs
//! that take longer than a round trip. Claimed-ahead jobs are `running` in the database
//! (their node would be rescued like any other); on shutdown they are released at once.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use forge_core::{Leadership, ListenerEvent, NodeContext};
use metrics::{Counter, Histogram};
use serde_json::json;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgRow;
use sqlx::{Postgres, Row};
use tokio::sync::broadcast;
use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tracing::{debug, error, warn};

use super::runtime::{CHANNEL_AVAILABLE, CHANNEL_CANCEL, Shared, WorkerSpec};
use super::{
    CancelReason, CancelSignal, FailAction, JobContext, JobError, JobId, JobType, fmt_duration,
};

/// How many cancel requests for jobs not (yet) known to the worker are remembered: a cancel
/// notification can overtake the response of the claim that started the job.
const EARLY_CANCELS: usize = 256;

/// How long an idle worker keeps its connection before giving it back to the pool.
const CONNECTION_LINGER: Duration = Duration::from_secs(1);

/// At most this many times the concurrency is claimed ahead of free slots.
const CLAIM_AHEAD_MAX: usize = 8;

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

/// What one attempt's task reports.
enum AttemptResult {
    /// The handler returned.
    Done(Result<(), JobError>),
    /// The handler ran past its timeout and was dropped.
    TimedOut(Duration),
    /// The attempt was stopped from outside.
    Interrupted(CancelReason),
    /// The handler panicked (with this message).
    Panicked(String),
}

/// A claimed job, not started yet.
struct Claimed {
    id: i64,
    attempt: i32,
    ty: JobType,
    args: serde_json::Value,
    max_attempts: u32,
    timeout: Option<Duration>,
}

/// A running attempt, as the worker knows it.
struct Running {
    attempt: i32,
    ty: JobType,
    max_attempts: u32,
    cancel: Arc<CancelSignal>,
    started: Instant,
}

/// An outcome to record.
struct Outcome {
    id: i64,
    attempt: i32,
    state: &'static str,
    delay_ms: Option<i64>,
    error: Option<serde_json::Value>,
    kind: &'static str,
    /// The attempt failed (counts in forge_job_failed_total).
    failed: bool,
}

/// The metrics of one job kind in this worker's queue.
struct KindMetrics {
    completed: Counter,
    failed: Counter,
    retried: Counter,
    dead: Counter,
    cancelled: Counter,
    duration: Histogram,
    pickup: Histogram,
}

/// What a round trip brings back.
struct RoundTrip {
    /// The outcomes it carried (to count, or to send again after an error).
    outcomes: Vec<Outcome>,
    /// How many jobs it asked for.
    limit: usize,
    /// Rows of `forge.jobs_reconcile`, when it reconciled.
    reconciled: Option<Vec<PgRow>>,
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

struct Worker {
    shared: Arc<Shared>,
    ctx: NodeContext,
    queue: Arc<str>,
    concurrency: usize,
    kinds: Arc<Vec<&'static str>>,
    /// The notification payload target that concerns this worker: the queue, or `@role`.
    target: String,
    role: Option<String>,
    leadership: Option<Leadership>,
    /// Claimed jobs waiting for a slot (see "claiming ahead").
    claimed: VecDeque<Claimed>,
    running: HashMap<i64, Running>,
    tasks: JoinSet<(i64, AttemptResult)>,
    task_jobs: HashMap<tokio::task::Id, i64>,
    outcomes: Vec<Outcome>,
    /// Jobs may be waiting: claim when there is room.
    want_claim: bool,
    /// Check this worker's running jobs against the database in the next round trip.
    must_reconcile: bool,
    stopping: bool,
    early_cancels: VecDeque<i64>,
    metrics: HashMap<&'static str, KindMetrics>,
    round_trip: Average,
    attempt_time: Average,
    /// The connection round trips use, held while the worker is busy.
    conn: Option<PoolConnection<Postgres>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Dropped without draining (a role's leadership was lost): the JoinSet aborts the
        // attempts; tell what they spawned.
        for running in self.running.values() {
            running.cancel.cancel(CancelReason::Shutdown);
        }
    }
}

impl Worker {
    fn new(
        shared: Arc<Shared>,
        ctx: NodeContext,
        spec: WorkerSpec,
        leadership: Option<Leadership>,
    ) -> Worker {
        let role = spec.role.as_ref().map(|r| r.name().to_owned());
        let target = match &role {
            Some(role) => format!("@{role}"),
            None => spec.queue.clone(),
        };
        let metrics = spec
            .kinds
            .iter()
            .map(|kind| {
                let labels = [("queue", spec.queue.as_str()), ("job", *kind)];
                let m = ctx.metrics();
                (
                    *kind,
                    KindMetrics {
                        completed: m.counter("forge_job_completed_total", &labels),
                        failed: m.counter("forge_job_failed_total", &labels),
                        retried: m.counter("forge_job_retried_total", &labels),
                        dead: m.counter("forge_job_dead_total", &labels),
                        cancelled: m.counter("forge_job_cancelled_total", &labels),
                        duration: m.histogram("forge_job_duration_seconds", &labels),
                        pickup: m.histogram("forge_job_pickup_latency_seconds", &labels),
                    },
                )
            })
            .collect();
        Worker {
            shared,
            ctx,
            queue: spec.queue.as_str().into(),
            concurrency: spec.concurrency.max(1),
            kinds: Arc::new(spec.kinds),
            target,
            // A role worker starts by rescuing what ended tenures of its role left running.
            must_reconcile: role.is_some(),
            role,
            leadership,
            claimed: VecDeque::new(),
            running: HashMap::new(),
            tasks: JoinSet::new(),
            task_jobs: HashMap::new(),
            outcomes: Vec::new(),
            want_claim: true,
            stopping: false,
            early_cancels: VecDeque::new(),
            metrics,
            round_trip: Average::default(),
            attempt_time: Average::default(),
            conn: None,
        }
    }

    fn epoch(&self) -> Option<i64> {
        self.leadership.as_ref().map(|l| l.epoch().0)
    }

    /// How many jobs beyond free slots to hold (see "claiming ahead").
    fn ahead(&self) -> usize {
        match (self.round_trip.0, self.attempt_time.trusted()) {
            (Some(trip), Some(attempt)) if attempt < trip => {
                let ahead = self.concurrency as f64 * trip / attempt.max(1e-6);
                (ahead as usize).min(CLAIM_AHEAD_MAX * self.concurrency)
            }
            _ => 0,
        }
    }

    /// How many jobs to claim now.
    fn room(&self) -> usize {
        (self.concurrency + self.ahead()).saturating_sub(self.running.len() + self.claimed.len())
    }

    fn needs_round_trip(&self) -> bool {
        !self.outcomes.is_empty()
            || self.must_reconcile
            || (self.want_claim && !self.stopping && self.room() > 0)
    }

    async fn run(mut self, stop: impl Future<Output = ()>, drain_bound: Duration) {
        tokio::pin!(stop);
        let mut events = self.ctx.subscribe();
        let mut in_flight: Option<InFlight> = None;
        let mut failures = 0u32;
        let mut retry_at: Option<Instant> = None;
        // When the worker last became idle (nothing running, claimed or in flight).
        let mut idle_since: Option<Instant> = None;
        loop {
            self.fill_slots();
            if in_flight.is_none() && retry_at.is_none() && self.needs_round_trip() {
                in_flight = Some(self.send());
            }
            tokio::select! {
                biased;
                _ = &mut stop => break,
                trip = async { in_flight.as_mut().expect("guarded").await }, if in_flight.is_some() => {
                    in_flight = None;
                    match self.receive(trip) {
                        Ok(()) => failures = 0,
                        Err(err) => {
                            failures += 1;
                            let pause = Duration::from_millis(50 << failures.min(6))
                                .min(self.shared.check_interval.max(Duration::from_millis(100)));
                            warn!(target: "forge::job", queue = %self.queue, error = %err,
                                  retry_in_ms = pause.as_millis() as u64, "job round trip failed");
                            retry_at = Some(Instant::now() + pause);
                        }
                    }
                }
                _ = async { sleep_until(retry_at.expect("guarded")).await }, if retry_at.is_some() => {
                    retry_at = None;
                }
                Some(joined) = self.tasks.join_next_with_id() => {
                    self.collect(joined);
                    while let Some(joined) = self.tasks.try_join_next_with_id() {
                        self.collect(joined);
                    }
                }
                event = events.recv() => self.hear(event),
                // Idle for a while: give the connection back to the pool. (Kept meanwhile, so
                // that a steady trickle of jobs needs no acquire and health check per claim.)
                _ = async { sleep_until(idle_since.expect("guarded") + CONNECTION_LINGER).await },
                    if idle_since.is_some() && self.conn.is_some() => {
                    self.conn = None;
                }
            }
            if in_flight.is_none() && self.running.is_empty() && self.claimed.is_empty() {
                idle_since.get_or_insert_with(Instant::now);
            } else {
                idle_since = None;
            }
        }
        self.stopping = true;
        // A claim abandoned half-way would leave jobs running under this node's name that
        // nobody runs: let the round trip in flight finish.
        if let Some(trip) = in_flight {
            let trip = trip.await;
            let _ = self.receive(trip);
        }
        self.drain(drain_bound, &mut events).await;
        self.conn = None;
    }

    /// Graceful stop: claim nothing more, release the jobs claimed ahead, let running attempts
    /// finish for up to `bound`, then stop them and release their jobs.
    async fn drain(&mut self, bound: Duration, events: &mut broadcast::Receiver<ListenerEvent>) {
        self.stopping = true;
        self.fill_slots();
        let deadline = Instant::now() + bound;
        if !self.running.is_empty() {
            debug!(target: "forge::job", queue = %self.queue, running = self.running.len(),
                   bound_ms = bound.as_millis() as u64, "draining");
        }
        loop {
            if !self.outcomes.is_empty() {
                if let Err(err) = self.round_trip_now().await {
                    warn!(target: "forge::job", queue = %self.queue, error = %err, "recording outcomes failed while draining");
                    if Instant::now() >= deadline {
                        break;
                    }
                    sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
            if self.tasks.is_empty() {
                break;
            }
            tokio::select! {
                Some(joined) = self.tasks.join_next_with_id() => self.collect(joined),
                event = events.recv() => self.hear(event),
                _ = sleep_until(deadline) => break,
            }
        }
        if !self.tasks.is_empty() {
            warn!(target: "forge::job", queue = %self.queue, running = self.running.len(),
                  "attempts did not finish within the drain bound; stopping them and releasing their jobs");
            for running in self.running.values() {
                running.cancel.cancel(CancelReason::Shutdown);
            }
            // The attempts' tasks drop their handlers at the next poll.
            let _ = timeout(Duration::from_secs(1), async {
                while let Some(joined) = self.tasks.join_next_with_id().await {
                    self.collect(joined);
                }
            })
            .await;
            self.tasks.abort_all();
            while let Some(joined) = self.tasks.join_next_with_id().await {
                self.collect(joined);
            }
        }
        for _ in 0..3 {
            if self.outcomes.is_empty() {
                break;
            }
            if let Err(err) = self.round_trip_now().await {
                warn!(target: "forge::job", queue = %self.queue, error = %err,
                      "recording outcomes failed at shutdown; the jobs will be rescued");
                sleep(Duration::from_millis(200)).await;
            }
        }
    }

    async fn round_trip_now(&mut self) -> Result<(), sqlx::Error> {
        let trip = self.send().await;
        self.receive(trip)
    }

    fn hear(&mut self, event: Result<ListenerEvent, broadcast::error::RecvError>) {
        match event {
            Ok(ListenerEvent::Notification { channel, payload }) => {
                let mut words = payload.split(' ');
                if words.next() != Some(self.shared.namespace.as_str()) {
                    return;
                }
                if &*channel == CHANNEL_AVAILABLE {
                    if words.next() == Some(self.target.as_str()) {
                        self.want_claim = true;
                    }
                } else if &*channel == CHANNEL_CANCEL
                    && words.next() == Some(self.ctx.node_id().as_str())
                    && let Some(id) = words.next().and_then(|w| w.parse::<i64>().ok())
                {
                    self.cancel(id, CancelReason::Requested);
                }
            }
            Ok(ListenerEvent::Restored) | Err(broadcast::error::RecvError::Lagged(_)) => {
                // Notifications may have been missed: look for jobs and for cancels.
                self.want_claim = true;
                if !self.running.is_empty() || !self.claimed.is_empty() {
                    self.must_reconcile = true;
                }
            }
            _ => {}
        }
    }

    /// Stops a running attempt, or drops a job claimed ahead.
    fn cancel(&mut self, id: i64, reason: CancelReason) {
        if let Some(running) = self.running.get(&id) {
            debug!(target: "forge::job", queue = %self.queue, job = running.ty.kind, id, ?reason, "stopping the attempt");
            running.cancel.cancel(reason);
        } else if let Some(at) = self.claimed.iter().position(|c| c.id == id) {
            let Some(claimed) = self.claimed.remove(at) else {
                return;
            };
            if reason == CancelReason::Requested {
                self.outcomes.push(Outcome {
                    id,
                    attempt: claimed.attempt,
                    state: "cancelled",
                    delay_ms: None,
                    error: Some(
                        json!({"reason": "cancelled", "error": "cancelled before it started"}),
                    ),
                    kind: claimed.ty.kind,
                    failed: false,
                });
            }
        } else if reason == CancelReason::Requested {
            if self.early_cancels.len() == EARLY_CANCELS {
                self.early_cancels.pop_front();
            }
            self.early_cancels.push_back(id);
        }
    }

    /// Builds the next round trip: reconcile if needed, record outcomes, claim up to the room.
    fn send(&mut self) -> InFlight {
        let deposed = self.leadership.as_ref().is_some_and(|l| !l.is_valid());
        if deposed {
            // A deposed leader claims nothing; its outcomes are still recorded (guarded).
            self.want_claim = false;
        }
        let limit = if self.want_claim && !self.stopping {
            self.room()
        } else {
            0
        };
        let outcomes = std::mem::take(&mut self.outcomes);
        let reconcile = std::mem::take(&mut self.must_reconcile).then(|| {
            self.running
                .iter()
                .map(|(id, r)| (*id, r.attempt))
                .chain(self.claimed.iter().map(|c| (c.id, c.attempt)))
                .unzip::<i64, i32, Vec<i64>, Vec<i32>>()
        });
        let n = outcomes.len();
        let mut ids = Vec::with_capacity(n);
        let mut attempts = Vec::with_capacity(n);
        let mut states = Vec::with_capacity(n);
        let mut delays = Vec::with_capacity(n);
        let mut errors = Vec::with_capacity(n);
        for o in &outcomes {
            ids.push(o.id);
            attempts.push(o.attempt);
            states.push(o.state);
            delays.push(o.delay_ms);
            errors.push(o.error.clone());
        }
        let pool = self.ctx.pool().clone();
        let conn = self.conn.take();
        let namespace = self.shared.namespace.clone();
        let node = self.ctx.node_id().as_str().to_owned();
        let queue = self.queue.to_string();
        let role = self.role.clone();
        let epoch = self.epoch();
        let kinds = self.kinds.clone();
        let default_max = self.shared.default_max_attempts();
        Box::pin(async move {
            let started = Instant::now();
            let failed = |err, outcomes| RoundTrip {
                outcomes,
                limit,
                reconciled: None,
                result: Err(err),
                took: started.elapsed(),
                conn: None,
            };
            let mut conn = match conn {
                Some(conn) => conn,
                None => match pool.acquire().await {
                    Ok(conn) => conn,
                    Err(err) => return failed(err, outcomes),
                },
            };
            let reconciled = match reconcile {
                Some((known, known_attempts)) => {
                    let rows = sqlx::query(
                        "SELECT id, status FROM forge.jobs_reconcile($1, $2, $3, $4, $5, $6, $7, $8)",
                    )
                    .bind(&namespace)
                    .bind(&node)
                    .bind(&queue)
                    .bind(role.as_deref())
                    .bind(epoch)
                    .bind(&known)
                    .bind(&known_attempts)
                    .bind(default_max)
                    .fetch_all(&mut *conn)
                    .await;
                    match rows {
                        Ok(rows) => Some(rows),
                        Err(err) => return failed(err, outcomes),
                    }
                }
                None => None,
            };
            let result = if limit == 0 && outcomes.is_empty() {
                Ok(Vec::new())
            } else {
                sqlx::query(
                    "SELECT * FROM forge.jobs_step($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
                )
                .bind(&namespace)
                .bind(&node)
                .bind(&queue)
                .bind(role.as_deref())
                .bind(epoch)
                .bind(&*kinds)
                .bind(limit as i32)
                .bind(&ids)
                .bind(&attempts)
                .bind(&states)
                .bind(&delays)
                .bind(&errors)
                .bind(default_max)
                .fetch_all(&mut *conn)
                .await
            };
            // A connection that failed a statement may be broken: let the pool replace it.
            let conn = if result.is_ok() {
                Some(conn)
            } else {
                conn.close_on_drop();
                None
            };
            RoundTrip {
                outcomes,
                limit,
                reconciled,
                result,
                took: started.elapsed(),
                conn,
            }
        })
    }

    /// Takes in what a round trip brought back.
    fn receive(&mut self, trip: RoundTrip) -> Result<(), sqlx::Error> {
        self.conn = trip.conn;
        if let Some(rows) = trip.reconciled {
            for row in rows {
                let id: i64 = row.try_get("id")?;
                let status: String = row.try_get("status")?;
                if status == "cancel" {
                    self.cancel(id, CancelReason::Requested);
                } else {
                    warn!(target: "forge::job", queue = %self.queue, id,
                          "the job was taken away from this node (rescued while it seemed dead); stopping the attempt");
                    self.cancel(id, CancelReason::Rescued);
                }
            }
        }
        let rows = match trip.result {
            Ok(rows) => rows,
            Err(err) => {
                // Send them again: outcomes are guarded, so a repeat of an outcome that was
                // recorded after all changes nothing. A claim that committed unseen is found by
                // the reconciliation.
                let mut outcomes = trip.outcomes;
                outcomes.append(&mut self.outcomes);
                self.outcomes = outcomes;
                self.must_reconcile = true;
                return Err(err);
            }
        };
        self.round_trip.add(trip.took.as_secs_f64());
        let mut recorded: HashMap<i64, String> = HashMap::with_capacity(trip.outcomes.len());
        let mut claimed = 0usize;
        for row in rows {
            if row.try_get::<bool, _>("claimed")? {
                claimed += 1;
                self.take(&row)?;
            } else {
                recorded.insert(row.try_get("id")?, row.try_get("state")?);
            }
        }
        for outcome in &trip.outcomes {
            self.count(outcome, recorded.get(&outcome.id).map(String::as_str));
        }
        if trip.limit > 0 {
            // All it asked for: more may be waiting, claim again as soon as there is room.
            self.want_claim = claimed == trip.limit;
        }
        Ok(())
    }

    /// Queues a claimed row to start.
    fn take(&mut self, row: &PgRow) -> Result<(), sqlx::Error> {
        let id: i64 = row.try_get("id")?;
        let kind: String = row.try_get("kind")?;
        let args: serde_json::Value = row.try_get("args")?;
        let attempt: i32 = row.try_get("attempt")?;
        let max_attempts: Option<i32> = row.try_get("max_attempts")?;
        let timeout_ms: Option<i64> = row.try_get("timeout_ms")?;
        let pickup_ms: Option<f64> = row.try_get("pickup_ms")?;
        let Some(ty) = self.shared.types.get(kind.as_str()).cloned() else {
            // Claims filter on this worker's kinds, so this cannot happen; give it back.
            warn!(target: "forge::job", queue = %self.queue, job = %kind, id, "claimed a job of an unknown kind; releasing it");
            self.outcomes.push(Outcome {
                id,
                attempt,
                state: "released",
                delay_ms: None,
                error: Some(json!({"reason": "released", "error": format!("node {} does not know this job kind", self.ctx.node_id())})),
                kind: "unknown",
                failed: false,
            });
            return Ok(());
        };
        if let (Some(m), Some(ms)) = (self.metrics.get(ty.kind), pickup_ms) {
            m.pickup.record(ms.max(0.0) / 1000.0);
        }
        let max_attempts = max_attempts
            .map(|n| n.max(1) as u32)
            .or(ty.options.max_attempts)
            .unwrap_or(self.shared.config.default_max_attempts)
            .max(1);
        let timeout = timeout_ms
            .map(|ms| Duration::from_millis(ms.max(1) as u64))
            .or(ty.options.timeout);
        self.claimed.push_back(Claimed {
            id,
            attempt,
            ty,
            args,
            max_attempts,
            timeout,
        });
        Ok(())
    }

    /// Starts claimed jobs while there are free slots (releases them when stopping).
    fn fill_slots(&mut self) {
        while let Some(claimed) = self.claimed.pop_front() {
            if self.stopping {
                self.outcomes.push(Outcome {
                    id: claimed.id,
                    attempt: claimed.attempt,
                    state: "released",
                    delay_ms: None,
                    error: Some(json!({"reason": "released", "error": "claimed but not started before its node shut down (the attempt does not count against max_attempts)"})),
                    kind: claimed.ty.kind,
                    failed: false,
                });
                continue;
            }
            if self.running.len() >= self.concurrency {
                self.claimed.push_front(claimed);
                return;
            }
            self.start(claimed);
        }
    }

    /// Starts an attempt in its own task.
    fn start(&mut self, claimed: Claimed) {
        let Claimed {
            id,
            attempt,
            ty,
            args,
            max_attempts,
            timeout,
        } = claimed;
        let cancel = Arc::new(CancelSignal::default());
        let ctx = JobContext {
            id: JobId(id),
            kind: ty.kind,
            queue: self.queue.clone(),
            attempt: attempt.max(1) as u32,
            max_attempts,
            node_id: self.ctx.node_id().clone(),
            pool: self.ctx.pool().clone(),
            cancel: cancel.clone(),
            leadership: self.leadership.clone(),
        };
        debug!(target: "forge::job", queue = %self.queue, job = ty.kind, id, attempt, "attempt started");
        let handler = (ty.handler)(ctx, args);
        let signal = cancel.clone();
        let task = self.tasks.spawn(async move {
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
            (id, result)
        });
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

    /// Turns a finished attempt's task into an outcome to record.
    fn collect(&mut self, joined: Result<(tokio::task::Id, (i64, AttemptResult)), JoinError>) {
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
        let kind = running.ty.kind;
        let took = running.started.elapsed().as_secs_f64();
        self.attempt_time.add(took);
        if let Some(m) = self.metrics.get(kind) {
            m.duration.record(took);
        }
        let outcome = |state: &'static str, error: Option<serde_json::Value>| Outcome {
            id,
            attempt: running.attempt,
            state,
            delay_ms: None,
            error,
            kind,
            failed: false,
        };
        let outcome = match result {
            AttemptResult::Done(Ok(())) => {
                debug!(target: "forge::job", queue = %self.queue, job = kind, id, attempt = running.attempt, "completed");
                outcome("completed", None)
            }
            AttemptResult::Done(Err(err)) => {
                let reason = if err.action() == FailAction::Discard {
                    "discard"
                } else {
                    "error"
                };
                self.failure(&running, id, reason, err.message(), err.action())
            }
            AttemptResult::Panicked(message) => self.failure(
                &running,
                id,
                "panic",
                &format!("panicked: {message}"),
                FailAction::Retry,
            ),
            AttemptResult::TimedOut(limit) => self.failure(
                &running,
                id,
                "timeout",
                &format!("timed out after {}", fmt_duration(limit)),
                FailAction::Retry,
            ),
            AttemptResult::Interrupted(CancelReason::TimedOut) => {
                self.failure(&running, id, "timeout", "timed out", FailAction::Retry)
            }
            AttemptResult::Interrupted(CancelReason::Requested) => {
                debug!(target: "forge::job", queue = %self.queue, job = kind, id, attempt = running.attempt, "cancelled while running");
                outcome(
                    "cancelled",
                    Some(json!({"reason": "cancelled", "error": "cancelled while running"})),
                )
            }
            AttemptResult::Interrupted(CancelReason::Rescued) => {
                // The job is no longer this node's: nothing to record.
                return;
            }
            AttemptResult::Interrupted(CancelReason::Shutdown) => {
                let why = if self.leadership.is_some() {
                    "the leadership it ran under wound down"
                } else {
                    "its node shut down"
                };
                outcome(
                    "released",
                    Some(
                        json!({"reason": "released", "error": format!("interrupted: {why} (the attempt does not count against max_attempts)")}),
                    ),
                )
            }
        };
        self.outcomes.push(outcome);
    }

    /// The outcome of a failed attempt: retry after the backoff, or dead-letter.
    fn failure(
        &self,
        running: &Running,
        id: i64,
        reason: &'static str,
        message: &str,
        action: FailAction,
    ) -> Outcome {
        let attempt = running.attempt.max(1) as u32;
        let kind = running.ty.kind;
        let error = json!({"reason": reason, "error": message});
        let base = Outcome {
            id,
            attempt: running.attempt,
            state: "dead",
            delay_ms: None,
            error: Some(error),
            kind,
            failed: true,
        };
        if action == FailAction::Discard || attempt >= running.max_attempts {
            error!(target: "forge::job", queue = %self.queue, job = kind, id, attempt,
                   max_attempts = running.max_attempts, reason, error = %message, "attempt failed; dead-lettering the job");
            return base;
        }
        let delay = match action {
            FailAction::RetryAfter(delay) => delay,
            _ => running.ty.options.backoff.delay(attempt),
        };
        warn!(target: "forge::job", queue = %self.queue, job = kind, id, attempt,
              max_attempts = running.max_attempts, reason, error = %message,
              retry_in_ms = delay.as_millis() as u64, "attempt failed; will retry");
        let delay_ms = delay.as_millis().min(i64::MAX as u128) as i64;
        Outcome {
            state: if delay_ms == 0 {
                "available"
            } else {
                "retryable"
            },
            delay_ms: Some(delay_ms),
            ..base
        }
    }

    /// Counts an outcome once the database has recorded it (`recorded` = the state written),
    /// or reports that it was refused.
    fn count(&self, outcome: &Outcome, recorded: Option<&str>) {
        let Some(state) = recorded else {
            // A late result of an attempt whose job was rescued meanwhile (this node seemed
            // dead): the guard refused it, so the job is not completed twice.
            warn!(target: "forge::job", queue = %self.queue, job = outcome.kind, id = outcome.id,
                  attempt = outcome.attempt, outcome = outcome.state,
                  "outcome not recorded: the job is no longer running this attempt on this node (it was rescued)");
            return;
        };
        let Some(m) = self.metrics.get(outcome.kind) else {
            return;
        };
        if outcome.failed {
            m.failed.increment(1);
        }
        match state {
            "completed" => m.completed.increment(1),
            "retryable" => m.retried.increment(1),
            "available" if outcome.failed => m.retried.increment(1),
            "dead" => m.dead.increment(1),
            "cancelled" => m.cancelled.increment(1),
            _ => {}
        }
    }
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
