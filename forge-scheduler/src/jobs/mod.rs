//! The durable job queue: `#[job]` types stored in PostgreSQL (`forge.jobs`), worked by every
//! node, maintained by the `scheduler` leader.
//!
//! * **Declare** a job type with `#[job]` (or implement [`Job`] by hand): a kind (its name), a
//!   serde argument type, declared [`JobOptions`] and an async handler.
//! * **Enqueue** from anywhere with a [`Jobs`] client: the node's (`node.jobs()`, and
//!   [`JobContext::jobs`] / `CronContext::jobs` in handlers), or [`Jobs::new`] in a process
//!   that is no node. [`Jobs::enqueue`], [`Jobs::enqueue_job`] and [`Jobs::enqueue_many`] each
//!   have an `_in` variant ([`Jobs::enqueue_in`], [`Jobs::enqueue_job_in`],
//!   [`Jobs::enqueue_many_in`]) that takes any sqlx executor, so a job can be enqueued inside
//!   the caller's own transaction and exists only if that transaction commits. [`NewJob`] sets
//!   per-job options (run at / delay, priority, unique key, queue, timeout, attempts). A
//!   duplicate of a unique job is reported as [`Enqueued::Duplicate`], never inserted.
//! * **Work**: every node works the queues its job types declare (or those `[node] queues`
//!   lists), `[jobs] default_concurrency` jobs at once unless `[jobs.queues]` tunes it. Claiming
//!   is `FOR UPDATE SKIP LOCKED` in batches, on each node's own pool, never through the leader;
//!   idle workers are woken by `NOTIFY` on commit of an enqueue and drain a backlog without
//!   waiting for a tick. Each attempt runs in its own task: a panic fails the attempt, not the
//!   worker. Failed attempts are retried with exponential backoff and jitter until
//!   `max_attempts`, then dead-lettered ([`JobState::Dead`]); [`JobError`] says what to do.
//! * **Maintain**: the `scheduler` leader promotes scheduled jobs and retries on a timer taken
//!   from the data (and woken by `NOTIFY`), rescues the running jobs of dead or frozen nodes,
//!   and prunes finished jobs by retention. Jobs declared with a `role` run only on that role's
//!   leader.
//!
//! Delivery is **at least once**: a handler may run again after its node died mid-attempt, so
//! handlers should be idempotent. A job is never *completed* twice: every outcome is recorded
//! with a guard on (job, attempt, node), so a late result from a rescued attempt is refused.
//! The guide (docs/src/architecture/jobs.md) describes the state machine and what happens
//! when each party dies.
//!
//! # Exactly once, at least once
//!
//! * **Effects in the job's transaction: exactly once.** A handler that writes its effects in
//!   a transaction and completes the job in it ([`JobContext::complete`], River's
//!   `JobCompleteTx`) commits both together: once that commit happened the job is
//!   `completed` (or deleted, with `[jobs] completed_retention = "0s"`) and never runs again,
//!   even if the node dies before it hears the reply.
//! * **Everything else: at least once.** A handler may run again after its node died
//!   mid-attempt, was marked down, or lost the reply to an outcome; make such effects
//!   idempotent, keyed by [`JobContext::id`] (the same in every attempt).
//! * A job is never *completed* twice: every outcome is recorded with a guard on
//!   (job, attempt, node, still running), so a late result from a rescued attempt is refused.
//!   With `completed_retention = "0s"` the completion deletes the row under the same guard.
//!
//! # Example
//!
//! `#[job]` generates the [`Job`] implementation; written by hand it looks like this:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use forge_scheduler::jobs::{Backoff, Job, JobContext, JobError, JobOptions, Jobs, NewJob};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Invoice {
//!     order_id: i64,
//! }
//!
//! #[allow(non_camel_case_types)]
//! struct issue_invoice;
//!
//! impl Job for issue_invoice {
//!     type Args = Invoice;
//!     const KIND: &'static str = "issue_invoice";
//!
//!     fn options(&self) -> JobOptions {
//!         JobOptions::new()
//!             .queue("billing")
//!             .max_attempts(5)
//!             .backoff(Backoff::exponential(Duration::from_secs(2)))
//!             .timeout(Duration::from_secs(30))
//!     }
//!
//!     async fn run(&self, ctx: JobContext, args: Invoice) -> Result<(), JobError> {
//!         if args.order_id <= 0 {
//!             return Err(JobError::discard("no such order")); // dead-letter now
//!         }
//!         // The invoice and the job's completion commit together: exactly once.
//!         let mut tx = ctx.pool().begin().await?;
//!         sqlx::query("INSERT INTO invoices (order_id, job_id) VALUES ($1, $2)")
//!             .bind(args.order_id)
//!             .bind(ctx.id())
//!             .execute(&mut *tx)
//!             .await?;
//!         ctx.complete(&mut tx).await?;
//!         tx.commit().await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn demo(jobs: Jobs, pool: sqlx::PgPool) -> forge_core::Result<()> {
//! // Enqueue through the node's client (`node.jobs()`)...
//! let id = jobs.enqueue(issue_invoice, Invoice { order_id: 7 }).await?.id();
//!
//! // ...or inside your own transaction: the job exists only if it commits.
//! let mut tx = pool.begin().await?;
//! // sqlx::query("INSERT INTO orders ...").execute(&mut *tx).await?;
//! jobs.enqueue_job_in(
//!     &mut *tx,
//!     NewJob::new(issue_invoice, Invoice { order_id: 8 })
//!         .delay(Duration::from_secs(60))
//!         .unique_key("invoice:8"),
//! )
//! .await?;
//! tx.commit().await?;
//!
//! jobs.cancel(id).await?;
//! # Ok(()) }
//! ```

mod attempt;
mod component;
mod enqueue;
mod figures;
pub(crate) mod flow;
mod maintenance;
mod shared;
mod wire;
mod worker;

use std::any::TypeId;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use forge_core::{Error, Leadership, LockNamespace, NodeId, Result};
use forge_rules::{Name, check_name};
use sqlx::{PgPool, Postgres, Transaction};
use tokio_util::sync::CancellationToken;

pub use crate::limits::{MAX_LIMIT, QueueLimits, Rate};
#[allow(deprecated)]
pub use component::{JobQueue, JobRunner};
pub(crate) use enqueue::cancel;
pub use enqueue::{AttemptError, CancelOutcome, Enqueued, JobInfo, Jobs, NewJob};
pub(crate) use enqueue::{JOB_SQL, JobRow};
pub use flow::{ParentFailure, Workflow};

/// A durable job type, declared with `#[job]` (or implemented by hand, see the
/// [module docs](self)).
pub trait Job: Send + Sync + 'static {
    /// The handler's argument type, stored as JSONB.
    type Args: serde::Serialize + serde::de::DeserializeOwned + Send + 'static;

    /// The job's kind: its name in `forge.jobs` and in metrics (the fn name unless
    /// `name = "..."`). Unique among the job types of a cluster.
    const KIND: &'static str;

    /// Declared options (queue, role, attempts, backoff, timeout, priority, unique).
    fn options(&self) -> JobOptions {
        JobOptions::new()
    }

    /// Runs one attempt.
    fn run(
        &self,
        ctx: JobContext,
        args: Self::Args,
    ) -> impl Future<Output = Result<(), JobError>> + Send;
}

/// The declared options of a job type. Each can be overridden per job with [`NewJob`].
///
/// ```
/// use std::time::Duration;
/// use forge_scheduler::jobs::{Backoff, JobOptions};
///
/// let options = JobOptions::new()
///     .queue("mailers")
///     .max_attempts(5)
///     .backoff(Backoff::exponential(Duration::from_secs(2)))
///     .timeout(Duration::from_secs(30))
///     .priority(1)
///     .unique(true);
/// assert_eq!(options.queue_name(), "mailers");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct JobOptions {
    pub(crate) queue: String,
    pub(crate) role: Option<String>,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) backoff: Backoff,
    pub(crate) timeout: Option<Duration>,
    pub(crate) priority: i16,
    pub(crate) unique: bool,
    /// `None`: `[jobs] max_snoozes`.
    pub(crate) max_snoozes: Option<u32>,
    /// How long a unique key holds, and in which states, and what a duplicate does.
    pub(crate) uniqueness: Uniqueness,
    /// The kind's cluster-wide limits (`forge.kind_limits`), written by each node at start.
    pub(crate) limits: QueueLimits,
}

/// What a unique job's key covers (see [`NewJob::unique_key`]): a period, the states of the
/// job holding the key, and what a duplicate does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Uniqueness {
    pub(crate) period: Option<Duration>,
    pub(crate) states: Option<Vec<JobState>>,
    pub(crate) mode: UniqueMode,
}

impl Uniqueness {
    /// The states a key covers when none are given: the unfinished ones, and with a period
    /// `completed` too (a period counts finished jobs; dead and cancelled ones do not block).
    pub(crate) fn states(&self) -> Vec<JobState> {
        self.states.clone().unwrap_or_else(|| {
            let mut states = vec![
                JobState::Pending,
                JobState::Available,
                JobState::Scheduled,
                JobState::Running,
                JobState::Retryable,
            ];
            if self.period.is_some() {
                states.push(JobState::Completed);
            }
            states
        })
    }
}

/// What enqueueing a duplicate of a unique job does (the job holding the key blocks it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum UniqueMode {
    /// Nothing is inserted; [`Enqueued::Duplicate`] names the job holding the key.
    #[default]
    Keep,
    /// Debounce: the holder, if it waits (available, scheduled or retryable), takes the new
    /// arguments and run-at ([`Enqueued::Replaced`]). A running holder keeps running and the
    /// new job is inserted, holding the key from then on; a finished holder (with a period)
    /// blocks as with `Keep`.
    Replace,
    /// As [`UniqueMode::Replace`], but the holder keeps the earlier of both run-at times
    /// (graphile-worker's `preserve_run_at`).
    KeepEarliestRunAt,
}

impl UniqueMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            UniqueMode::Keep => "keep",
            UniqueMode::Replace => "replace",
            UniqueMode::KeepEarliestRunAt => "keep_earliest_run_at",
        }
    }
}

impl Default for JobOptions {
    fn default() -> Self {
        JobOptions::new()
    }
}

impl JobOptions {
    /// The queue every job goes to unless told otherwise.
    pub const DEFAULT_QUEUE: &'static str = "default";

    /// The defaults: queue `default`, no role (runs on every node working the queue),
    /// `[jobs] default_max_attempts` attempts, exponential backoff (1 s doubling up to 1 h, with
    /// jitter), no timeout, priority 0, not unique.
    pub fn new() -> JobOptions {
        JobOptions {
            queue: JobOptions::DEFAULT_QUEUE.to_owned(),
            role: None,
            max_attempts: None,
            backoff: Backoff::default(),
            timeout: None,
            priority: 0,
            unique: false,
            max_snoozes: None,
            uniqueness: Uniqueness::default(),
            limits: QueueLimits::default(),
        }
    }

    /// At most `jobs` attempts of this kind run at once on all nodes together, whichever
    /// queues its jobs sit in (between 1 and [`MAX_LIMIT`], checked when the kind is
    /// registered). The kind's limits are the cluster's: each node writes its code's values to
    /// the database at start, where an operator's values win until reset
    /// ([`crate::inspect::Workload::set_kind_limits`]).
    pub fn global_concurrency(mut self, jobs: u32) -> Self {
        self.limits.global_concurrency = Some(jobs);
        self
    }

    /// At most so many attempts of this kind are claimed in any window, on all nodes together
    /// (`"100/1m".parse()?`); jobs beyond it wait, available.
    pub fn rate(mut self, rate: Rate) -> Self {
        self.limits.rate = Some(rate);
        self
    }

    /// The [`JobOptions::rate`] holds per value of this top-level field of the arguments
    /// (a job without it counts under one shared empty value).
    pub fn rate_key(mut self, field: impl Into<String>) -> Self {
        self.limits.rate_key = Some(field.into());
        self
    }

    /// The kind's cluster-wide limits as declared (none: unlimited).
    pub fn limits(&self) -> &QueueLimits {
        &self.limits
    }

    /// A unique job's key holds for `period` after the job holding it was enqueued (database
    /// clock), counting finished jobs too: "one per key per hour". Without a period it holds
    /// while the job is in the covered states (by default the unfinished ones).
    pub fn unique_period(mut self, period: Duration) -> Self {
        self.uniqueness.period = Some(period);
        self
    }

    /// The states of the job holding a unique key in which it blocks another (default: the
    /// unfinished ones - available, scheduled, running, retryable -, and with a period
    /// `completed` too).
    pub fn unique_states(mut self, states: impl IntoIterator<Item = JobState>) -> Self {
        self.uniqueness.states = Some(states.into_iter().collect());
        self
    }

    /// What a duplicate of a unique job does (default [`UniqueMode::Keep`]).
    pub fn unique_mode(mut self, mode: UniqueMode) -> Self {
        self.uniqueness.mode = mode;
        self
    }

    /// How many times a job may snooze ([`JobError::snooze`]) before the next snooze
    /// dead-letters it (default: `[jobs] max_snoozes`).
    pub fn max_snoozes(mut self, snoozes: u32) -> Self {
        self.max_snoozes = Some(snoozes);
        self
    }

    /// The queue: nodes work the queues their job types declare, or those their `[node] queues`
    /// lists, so a job moved to a queue no node works waits (the cluster's status says so).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// Runs the jobs only on the leader of this role (validated when the node starts).
    pub fn role(mut self, role: &str) -> Self {
        self.role = Some(role.to_owned());
        self
    }

    /// Attempts before the job is dead-lettered (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// The delay before each retry.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Fails an attempt that runs longer (the attempt is retried per the backoff).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Lower runs first (like Oban); jobs of equal priority run in order of their run-at time.
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// With `true`, enqueuing a job whose arguments equal those of an unfinished job of the same
    /// kind reports [`Enqueued::Duplicate`] instead of inserting (a [`NewJob::unique_key`]
    /// replaces the arguments as the key).
    pub fn unique(mut self, unique: bool) -> Self {
        self.unique = unique;
        self
    }

    /// The queue.
    pub fn queue_name(&self) -> &str {
        &self.queue
    }

    /// The role whose leader runs the jobs, if any.
    pub fn role_name(&self) -> Option<&str> {
        self.role.as_deref()
    }
}

/// How long to wait before retrying a failed attempt.
#[derive(Clone, Copy, Debug)]
pub enum Backoff {
    /// `base * 2^(attempt - 1)`, capped at `max`, with ±25 % jitter so that jobs failing
    /// together do not retry in lockstep.
    Exponential {
        /// The delay after the first failed attempt.
        base: Duration,
        /// The longest delay.
        max: Duration,
    },
    /// The same delay after every failed attempt, without jitter.
    Fixed(Duration),
    /// Your function of the failed attempt's number (from 1) and its error (a panic or a
    /// timeout arrives as a [`JobError::retry`] saying so). Its delay is used as returned,
    /// without jitter, capped at [`forge_rules::MAX_DURATION`] (about ten years).
    Custom(BackoffFn),
}

/// A custom backoff: `fn(attempt, &error) -> delay` (see [`Backoff::Custom`]).
pub type BackoffFn = fn(u32, &JobError) -> Duration;

/// Two custom backoffs are equal when they are the same function (by address, as
/// [`std::ptr::fn_addr_eq`] compares: the same function may have two addresses).
impl PartialEq for Backoff {
    fn eq(&self, other: &Backoff) -> bool {
        match (self, other) {
            (Backoff::Custom(a), Backoff::Custom(b)) => std::ptr::fn_addr_eq(*a, *b),
            (
                Backoff::Exponential { base, max },
                Backoff::Exponential {
                    base: base2,
                    max: max2,
                },
            ) => base == base2 && max == max2,
            (Backoff::Fixed(a), Backoff::Fixed(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Backoff {}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::exponential(Duration::from_secs(1))
    }
}

impl Backoff {
    /// The default cap of an exponential backoff.
    pub const DEFAULT_MAX: Duration = Duration::from_secs(3600);

    /// Exponential backoff from `base`, capped at one hour.
    pub fn exponential(base: Duration) -> Backoff {
        Backoff::Exponential {
            base,
            max: Backoff::DEFAULT_MAX,
        }
    }

    /// A fixed delay.
    pub fn fixed(delay: Duration) -> Backoff {
        Backoff::Fixed(delay)
    }

    /// Your own delays (`#[job(backoff = my_backoff)]` declares it):
    ///
    /// ```
    /// use std::time::Duration;
    /// use forge_scheduler::jobs::{Backoff, JobError};
    ///
    /// fn linear(attempt: u32, _error: &JobError) -> Duration {
    ///     Duration::from_secs(10) * attempt
    /// }
    /// assert_eq!(
    ///     Backoff::custom(linear).delay_after(3, &JobError::retry("busy")),
    ///     Duration::from_secs(30)
    /// );
    /// ```
    pub fn custom(delay: BackoffFn) -> Backoff {
        Backoff::Custom(delay)
    }

    /// The same backoff with another cap (no effect on [`Backoff::Fixed`]).
    pub fn capped(self, max: Duration) -> Backoff {
        match self {
            Backoff::Exponential { base, .. } => Backoff::Exponential { base, max },
            fixed => fixed,
        }
    }

    /// The longest delay this backoff waits (`None`: a custom one's, not known in advance).
    pub fn max_delay(&self) -> Option<Duration> {
        Some(match *self {
            Backoff::Fixed(delay) => delay,
            Backoff::Exponential { max, .. } => max,
            Backoff::Custom(_) => return None,
        })
    }

    /// The delay after failed attempt `attempt` (1-based) that failed with `error`, jitter
    /// included.
    pub fn delay_after(&self, attempt: u32, error: &JobError) -> Duration {
        match *self {
            Backoff::Custom(delay) => delay(attempt, error).min(forge_rules::MAX_DURATION),
            _ => self.delay(attempt),
        }
    }

    /// The delay after failed attempt `attempt` (1-based), jitter included; a custom backoff
    /// is asked with a [`JobError::retry`] without a message (see [`Backoff::delay_after`]).
    pub fn delay(&self, attempt: u32) -> Duration {
        match *self {
            Backoff::Custom(_) => self.delay_after(attempt, &JobError::retry("")),
            Backoff::Fixed(delay) => delay,
            Backoff::Exponential { base, max } => {
                let doublings = attempt.saturating_sub(1).min(62);
                let nominal = base
                    .checked_mul(1u32 << doublings.min(31))
                    .unwrap_or(max)
                    .min(max);
                nominal.mul_f64(0.75 + fastrand::f64() * 0.5).min(max)
            }
        }
    }
}

/// A job's id (`forge.jobs.id`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct JobId(pub i64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

forge_core::sql_bigint_newtype!(JobId);

forge_core::sql_enum! {
    /// Where a job is in its life (`forge.jobs.state`). See the guide
    /// (docs/src/architecture/jobs.md) for who moves it where.
    pub enum JobState {
        /// Waiting for its parents ([`NewJob::after`]): no worker claims it until each has
        /// finished; then available (or scheduled, or cancelled by [`ParentFailure`]).
        Pending = "pending",
        /// Waiting to be claimed by a worker.
        Available = "available",
        /// Enqueued with a future run-at time; promoted to available when due.
        Scheduled = "scheduled",
        /// An attempt is running on a node.
        Running = "running",
        /// An attempt failed; promoted to available when its backoff is over.
        Retryable = "retryable",
        /// Done.
        Completed = "completed",
        /// Out of attempts, discarded by its handler, undecodable, or rescued with no attempts
        /// left: the dead-letter state. Kept for `[jobs] dead_retention`.
        Dead = "dead",
        /// Cancelled before it completed.
        Cancelled = "cancelled",
    }
}

impl JobState {
    /// Whether the job will not change any more (completed, dead or cancelled).
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Dead | JobState::Cancelled
        )
    }
}

/// An operator's action on a job (one by one, or in bulk by filter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobAction {
    /// Make it available again now, with one more attempt.
    Retry,
    /// Cancel it (a running one: ask its node to stop it).
    Cancel,
    /// Delete it.
    Delete,
}

impl JobAction {
    /// Every action.
    pub const ALL: &'static [JobAction] = &[JobAction::Retry, JobAction::Cancel, JobAction::Delete];

    /// `retry`, `cancel` or `delete`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobAction::Retry => "retry",
            JobAction::Cancel => "cancel",
            JobAction::Delete => "delete",
        }
    }

    /// The action named `name`.
    pub fn parse(name: &str) -> Option<JobAction> {
        JobAction::ALL.iter().copied().find(|a| a.as_str() == name)
    }

    /// The states from which it changes a job (what a bulk action selects).
    pub fn states(self) -> Vec<JobState> {
        JobState::ALL
            .iter()
            .copied()
            .filter(|state| JobActions::of(*state, false).allows(self))
            .collect()
    }
}

/// What an operator may do to a job now: the one rule behind the refusals of the read
/// models' actions (so the admin API's 409s and the CLI's), the dashboard's buttons and the
/// bulk actions' states ([`JobInfo::actions`](crate::jobs::JobInfo::actions)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct JobActions {
    /// Retry: not while it runs or waits to be claimed.
    pub retry: bool,
    /// Cancel: while it waits (at once) or runs (its node is asked to stop it) and no cancel
    /// was requested yet; never once it finished.
    pub cancel: bool,
    /// Delete: unless it runs (cancel it first).
    pub delete: bool,
}

impl JobActions {
    /// The actions a job in `state` allows (`cancel_requested`: a cancel was asked of its
    /// running attempt).
    pub fn of(state: JobState, cancel_requested: bool) -> JobActions {
        use JobState::*;
        JobActions {
            retry: matches!(state, Scheduled | Retryable | Completed | Cancelled | Dead),
            cancel: matches!(state, Pending | Available | Scheduled | Retryable)
                || (state == Running && !cancel_requested),
            delete: state != Running,
        }
    }

    /// Whether `action` is allowed.
    pub fn allows(self, action: JobAction) -> bool {
        match action {
            JobAction::Retry => self.retry,
            JobAction::Cancel => self.cancel,
            JobAction::Delete => self.delete,
        }
    }

    /// Why `action` is refused for a job in `state`, or `None` when it is allowed.
    pub fn refusal(state: JobState, cancel_requested: bool, action: JobAction) -> Option<String> {
        if JobActions::of(state, cancel_requested).allows(action) {
            return None;
        }
        Some(match (action, state) {
            (JobAction::Retry, JobState::Available) => {
                "the job is available already: a worker claims it next".to_owned()
            }
            (JobAction::Cancel, JobState::Running) => {
                "a cancel was requested already: its node stops it".to_owned()
            }
            (JobAction::Delete, _) => "the job is running: cancel it first".to_owned(),
            _ => format!("the job is {state}"),
        })
    }
}

/// Why a [`JobContext`] was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelReason {
    /// A user cancelled the job ([`Jobs::cancel`]).
    Requested,
    /// The attempt ran past its timeout.
    TimedOut,
    /// The node shut down and the attempt did not finish within `[jobs] drain_timeout`, or the
    /// leadership a role job ran under ended.
    Shutdown,
    /// The job was taken away from this node: the node was marked down (its node session
    /// ended, or no heartbeat for `[cluster.membership] down_after`) and the job rescued;
    /// another attempt may be running elsewhere, and this attempt's outcome would be refused.
    Rescued,
    /// The node lost contact with the cluster (no heartbeat landed) for nearly
    /// `[cluster.membership] down_after`: the scheduler leader may mark it down and run the job
    /// elsewhere, so this attempt stops first. The job is released (the attempt does not count)
    /// if it is still this node's when the node reaches PostgreSQL again.
    CutOff,
}

#[derive(Debug, Default)]
pub(crate) struct CancelSignal {
    token: CancellationToken,
    reason: AtomicU8,
}

impl CancelSignal {
    pub(crate) fn cancel(&self, reason: CancelReason) {
        let code = match reason {
            CancelReason::Requested => 1,
            CancelReason::TimedOut => 2,
            CancelReason::Shutdown => 3,
            CancelReason::Rescued => 4,
            CancelReason::CutOff => 5,
        };
        // The first reason wins.
        let _ = self
            .reason
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
        self.token.cancel();
    }

    pub(crate) fn reason(&self) -> Option<CancelReason> {
        match self.reason.load(Ordering::Acquire) {
            1 => Some(CancelReason::Requested),
            2 => Some(CancelReason::TimedOut),
            3 => Some(CancelReason::Shutdown),
            4 => Some(CancelReason::Rescued),
            5 => Some(CancelReason::CutOff),
            _ => None,
        }
    }
}

/// What a handler gets for one attempt of one job.
#[derive(Clone)]
pub struct JobContext {
    pub(crate) id: JobId,
    pub(crate) namespace: LockNamespace,
    pub(crate) kind: &'static str,
    pub(crate) queue: Arc<str>,
    pub(crate) attempt: u32,
    pub(crate) max_attempts: u32,
    pub(crate) node_id: NodeId,
    pub(crate) pool: PgPool,
    pub(crate) cancel: Arc<CancelSignal>,
    pub(crate) leadership: Option<Leadership>,
    /// Completing keeps the job's row as `completed` (or deletes it: `completed_retention = "0s"`).
    pub(crate) keep_completed: bool,
    /// The node's metrics (its job client counts what it enqueues).
    pub(crate) metrics: forge_core::Metrics,
    /// The output to store with the completion ([`JobContext::set_output`]), shared by the
    /// clones of this context.
    pub(crate) output: Arc<std::sync::Mutex<flow::OutputSlot>>,
    /// `[jobs] max_output_bytes`.
    pub(crate) max_output_bytes: u64,
}

impl JobContext {
    /// The job's id.
    pub fn id(&self) -> JobId {
        self.id
    }

    /// The job's kind ([`Job::KIND`]).
    pub fn kind(&self) -> &str {
        self.kind
    }

    /// The queue it was claimed from.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// This attempt's number, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Attempts allowed in all; a failure of attempt `max_attempts` dead-letters the job.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Whether a failure of this attempt dead-letters the job.
    pub fn is_last_attempt(&self) -> bool {
        self.attempt >= self.max_attempts
    }

    /// The node running the attempt.
    pub fn node_id(&self) -> &NodeId {
        &self.node_id
    }

    /// The node's pool. It hands out no connection inside a transaction block: one that comes
    /// back inside one - a `begin()` whose future was dropped while its `BEGIN` travelled, say
    /// when this attempt timed out - is closed instead of reused, and so is one whose last
    /// statement got no answer within two seconds of its release (a half-open session).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The node's job client (as `node.jobs()`: it counts what it enqueues in the node's
    /// metrics), to enqueue follow-up jobs - in the handler's own transaction with the `_in`
    /// methods, so that they exist only if it commits.
    pub fn jobs(&self) -> Jobs {
        Jobs::for_node(self.pool.clone(), &self.namespace, self.metrics.clone())
    }

    /// Whether the attempt should stop: the job was cancelled, timed out, or the node is
    /// shutting down past its drain bound. The handler's future is dropped at the same moment;
    /// this matters to work the handler spawned.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.token.is_cancelled()
    }

    /// Resolves when the attempt should stop (see [`JobContext::is_cancelled`]).
    pub async fn cancelled(&self) {
        self.cancel.token.cancelled().await
    }

    /// Why the attempt was cancelled, once it is.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.cancel.reason()
    }

    /// For a job declared with a `role`: the leadership it runs under. Leader-only writes go
    /// through [`Leadership::fenced_transaction`].
    pub fn leadership(&self) -> Option<&Leadership> {
        self.leadership.as_ref()
    }

    /// Completes the job inside `tx` (River's `JobCompleteTx`): when `tx` commits, the
    /// handler's writes in it and the job's completion are one commit, so a job whose effects
    /// committed is never run again - not after its node dies, not when the reply to the
    /// commit is lost. A role job's completion is also fenced by its leadership.
    ///
    /// Fails with [`Error::NotRunning`] when this attempt no longer owns the job (it was
    /// rescued, or cancelled and recorded) and with [`Error::Fenced`] when a role job's
    /// leadership ended; then `tx` must not commit (with `?`, it is rolled back when dropped).
    /// The handler then returns normally; its outcome is not recorded twice. With `[jobs]
    /// completed_retention = "0s"` the job's row is deleted in `tx` instead. Calling it twice
    /// in one transaction is harmless; calling it in a second transaction after the first
    /// committed fails with [`Error::NotRunning`], so a retry after an error from `COMMIT`
    /// cannot commit the effects twice.
    pub async fn complete(&self, tx: &mut Transaction<'_, Postgres>) -> Result<()> {
        self.write_output(tx).await?;
        let token = self.leadership.as_ref().map(Leadership::fence_token);
        let result = sqlx::query("SELECT forge.jobs_complete($1, $2, $3, $4, $5, $6, $7, $8)")
            .bind(self.id)
            .bind(self.attempt as i32)
            .bind(&self.node_id)
            .bind(&self.namespace)
            .bind(token.as_ref().map(|t| t.role.as_str()))
            .bind(token.as_ref().map(|t| t.epoch))
            .bind(token.as_ref().map(|t| t.tenure))
            .bind(self.keep_completed)
            .execute(&mut **tx)
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("FG002") => {
                Err(Error::NotRunning {
                    what: format!("job {} (`{}`)", self.id, self.kind),
                    why: db
                        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                        .and_then(|pg| pg.detail())
                        .unwrap_or("it was rescued or cancelled")
                        .to_owned(),
                })
            }
            Err(err) => Err(match token {
                Some(token) => token.map_error(err),
                None => Error::Database(err),
            }),
        }
    }
}

impl JobContext {
    /// The context of one attempt run outside a worker, by the test kit
    /// (`forge_scheduler::testing::run_job`): the job's row is `running` under this attempt and
    /// node, so [`JobContext::complete`] works as it does on a node; nothing cancels it.
    pub(crate) fn detached(
        id: JobId,
        namespace: LockNamespace,
        kind: &'static str,
        queue: &str,
        (attempt, max_attempts): (u32, u32),
        node_id: NodeId,
        pool: PgPool,
    ) -> JobContext {
        JobContext {
            id,
            namespace,
            kind,
            queue: queue.into(),
            attempt,
            max_attempts,
            node_id,
            pool,
            cancel: Arc::default(),
            leadership: None,
            keep_completed: true,
            metrics: forge_core::Metrics::new(),
            output: Default::default(),
            max_output_bytes: crate::JobsConfig::default().max_output_bytes,
        }
    }
}

impl fmt::Debug for JobContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("queue", &self.queue)
            .field("attempt", &self.attempt)
            .field("max_attempts", &self.max_attempts)
            .field("node_id", &self.node_id)
            .finish()
    }
}

/// What to do after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailAction {
    /// Retry per the job's backoff, or dead-letter when out of attempts.
    Retry,
    /// Retry after this delay (still bounded by the attempts).
    RetryAfter(Duration),
    /// Dead-letter now, whatever attempts are left.
    Discard,
    /// Not a failure: run the job again after this delay, without counting the attempt
    /// (bounded by `max_snoozes`; see [`JobError::snooze`]).
    Snooze(Duration),
}

/// A failed attempt, as data: what went wrong and what to do about it.
///
/// Any `std::error::Error` converts into a [`FailAction::Retry`] with `?`. Like `anyhow::Error`,
/// `JobError` does not implement `std::error::Error` itself (that would conflict with the
/// blanket conversion).
pub struct JobError {
    message: String,
    action: FailAction,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl JobError {
    /// Retry per the job's backoff (dead-letter when out of attempts).
    pub fn retry(message: impl fmt::Display) -> JobError {
        JobError::new(message.to_string(), FailAction::Retry)
    }

    /// Retry after `delay` instead of the backoff (dead-letter when out of attempts).
    pub fn retry_after(message: impl fmt::Display, delay: Duration) -> JobError {
        JobError::new(message.to_string(), FailAction::RetryAfter(delay))
    }

    /// Dead-letter now: retrying cannot help.
    pub fn discard(message: impl fmt::Display) -> JobError {
        JobError::new(message.to_string(), FailAction::Discard)
    }

    /// Run the job again after `delay` without counting this attempt (River's snooze): for
    /// "not yet" rather than "failed" - a resource still busy, a rate limit's answer. The job
    /// waits `scheduled` and frees its slot at once; the snooze shows in its `errors` (reason
    /// `snoozed`). A job snoozed more than its `max_snoozes` (`[jobs] max_snoozes`, 100 by
    /// default) is dead-lettered with an error that says so.
    pub fn snooze(delay: Duration) -> JobError {
        let message = format!("snoozed for {}", crate::config::fmt_duration(delay));
        JobError::new(message, FailAction::Snooze(delay))
    }

    fn new(message: String, action: FailAction) -> JobError {
        JobError {
            message,
            action,
            source: None,
        }
    }

    /// What to do.
    pub fn action(&self) -> FailAction {
        self.action
    }

    /// The message recorded in the job's `errors`.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error this one was converted from, if any.
    pub fn source(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.source.as_deref()
    }

    /// The same error with another action (e.g. `err.with_action(FailAction::Discard)`).
    pub fn with_action(mut self, action: FailAction) -> JobError {
        self.action = action;
        self
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for JobError {
    fn from(err: E) -> JobError {
        // The chain of causes, so the stored message says as much as `{:#}` would.
        let mut message = err.to_string();
        let mut cause = err.source();
        while let Some(inner) = cause {
            message.push_str(": ");
            message.push_str(&inner.to_string());
            cause = inner.source();
        }
        JobError {
            message,
            action: FailAction::Retry,
            source: Some(Box::new(err)),
        }
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobError")
            .field("message", &self.message)
            .field("action", &self.action)
            .finish()
    }
}

/// What a `#[job]` handler may return: `()`, or `Result<T, E>` where `T` is the job's output
/// (anything serde serializes; `()` for none) and `E` converts into [`JobError`].
#[diagnostic::on_unimplemented(
    message = "a job handler must return `()` or `Result<T, E>` where `T: serde::Serialize` and `E` converts into `forge::JobError`, not `{Self}`",
    note = "any `std::error::Error + Send + Sync + 'static` converts; for outcomes use `JobError::retry`, `JobError::retry_after` or `JobError::discard`"
)]
pub trait IntoJobResult {
    /// The outcome as a `Result`; an `Ok` value other than JSON `null` becomes the job's
    /// output ([`JobContext::set_output`] on `ctx`).
    fn into_job_result(self, ctx: &JobContext) -> Result<(), JobError>;
}

impl IntoJobResult for () {
    fn into_job_result(self, _: &JobContext) -> Result<(), JobError> {
        Ok(())
    }
}

impl<T: serde::Serialize, E: Into<JobError>> IntoJobResult for Result<T, E> {
    fn into_job_result(self, ctx: &JobContext) -> Result<(), JobError> {
        let value = self.map_err(Into::into)?;
        ctx.set_returned_output(&value)
    }
}

/// The result of decoding the arguments and running one attempt.
pub(crate) type AttemptFuture = Pin<Box<dyn Future<Output = Result<(), JobError>> + Send>>;

/// A type-erased handler: decodes the JSON arguments and runs the attempt.
pub(crate) type Handler = Arc<dyn Fn(JobContext, serde_json::Value) -> AttemptFuture + Send + Sync>;

/// One registered job type.
#[derive(Clone)]
pub(crate) struct JobType {
    pub(crate) type_id: TypeId,
    pub(crate) kind: &'static str,
    /// Shared, so that a claimed job's type is a few reference counts, not a copy of strings.
    pub(crate) options: Arc<JobOptions>,
    pub(crate) handler: Handler,
}

/// The job types a node knows, by kind.
#[derive(Clone, Default)]
pub struct JobRegistry {
    pub(crate) types: BTreeMap<&'static str, JobType>,
}

impl fmt::Debug for JobRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.types.keys()).finish()
    }
}

impl JobRegistry {
    /// Adds a job type. Adding the same type again is a no-op (a job may be registered both
    /// automatically and explicitly); two different types with one [`Job::KIND`] are an
    /// [`Error::Registration`].
    pub fn add<J: Job>(&mut self, job: J) -> Result<()> {
        let type_id = TypeId::of::<J>();
        let kind = J::KIND;
        if let Some(existing) = self.types.get(kind) {
            if existing.type_id == type_id {
                return Ok(());
            }
            return Err(Error::Registration {
                message: format!(
                    "two different job types have the kind `{kind}`: give one of them another name (#[job(name = \"...\")])"
                ),
            });
        }
        validate_kind(kind)?;
        let options = job.options();
        check_limits(kind, &options)?;
        let job = Arc::new(job);
        let handler: Handler = Arc::new(move |ctx, args| {
            let job = job.clone();
            Box::pin(async move {
                let args: J::Args = serde_json::from_value(args).map_err(|err| {
                    JobError::retry(format!("cannot decode the arguments of `{kind}`: {err}"))
                })?;
                job.run(ctx, args).await
            })
        });
        self.types.insert(
            kind,
            JobType {
                type_id,
                kind,
                options: Arc::new(options),
                handler,
            },
        );
        Ok(())
    }

    /// Whether no job type is registered.
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// The registered kinds.
    pub fn kinds(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.types.keys().copied()
    }

    /// A job of a registered kind with JSON arguments and the kind's declared options (for a
    /// stored cron's tick and the test kit); `None` when no type of this kind is registered.
    pub fn new_job(&self, kind: &str, args: serde_json::Value) -> Option<NewJob> {
        let job = self.types.get(kind)?;
        Some(NewJob::declared(
            job.kind,
            JobOptions::clone(&job.options),
            Ok(args),
        ))
    }
}

/// A kind's limits are valid, and bind its jobs: a role's jobs, claimed by its leader alone,
/// are not bound by them.
fn check_limits(kind: &str, options: &JobOptions) -> Result<()> {
    let message = match (options.limits.problem(), &options.role) {
        (Some((_, message)), _) => message,
        (None, Some(role)) if !options.limits.is_empty() => format!(
            "runs on the leader of role `{role}`, whose claims no limit binds: remove its global_concurrency and rate"
        ),
        (None, _) => return Ok(()),
    };
    Err(Error::Registration {
        message: format!("job kind `{kind}`: {message}"),
    })
}

fn validate_kind(kind: &str) -> Result<()> {
    check_name(Name::JobKind, kind).map_err(|err| Error::Registration {
        message: err.to_string(),
    })
}

/// Checks a queue name: it appears in `forge.toml`, in notifications and in metric labels.
pub(crate) fn validate_queue(queue: &str) -> std::result::Result<(), String> {
    check_name(Name::Queue, queue).map_err(|err| err.to_string())
}
