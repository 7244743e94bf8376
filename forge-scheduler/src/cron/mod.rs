//! Leader-only crons: definitions, the handler context, and the runtime that fires each tick
//! once in the whole cluster.
//!
//! A cron belongs to a role (default `scheduler`) and runs only on that role's leader. Before
//! running a tick the leader claims `(cron, scheduled instant)` in the ledger
//! `forge.cron_ticks` (primary key) in a statement fenced by its tenure, so a tick is claimed
//! once, even when leadership changes at the tick. See [`CatchUp`], [`Overlap`] and
//! [`Interrupted`] for what happens around failovers and slow runs.
//!
//! The claim is made `[cron] claim_ahead` (50 ms) before the instant, so that its durable
//! commit is not on the firing path; at the instant one read on the role's lock session (the
//! gate) checks that the tenure is still current by the database's clock, then the handler
//! starts. A tick whose claimer lost its leadership before the instant was never started, and
//! a next leader that leads by the instant claims it again and runs it on time as attempt 1;
//! one that leads only after the instant cannot tell the claim from a run cut short and
//! applies [`Interrupted`] (tested with leaders cut off, killed and handing over before the
//! instant). `claim_ahead = "0s"` claims at the instant.
//!
//! # What runs exactly once
//!
//! * **Claims**: every tick is claimed at most once; with [`CatchUp::All`] every tick in the
//!   window is claimed exactly once.
//! * **Effects in the tick's transaction: exactly once.** A handler that writes its effects in
//!   a fenced transaction and completes the tick in it ([`CronContext::complete`]) commits both
//!   together: if the commit happened, the tick is `succeeded` and no leader runs it again,
//!   even when the reply to the commit was lost or the leader died right after it; if it did
//!   not, neither did the effects, and the next leader runs the tick again.
//! * **Effects anywhere else: at least once.** A run cut short by its leader's death (or a
//!   lost reply to its outcome) is run again by the next leader ([`Interrupted::Rerun`]), so
//!   an email sent or an HTTP call made outside the transaction can happen twice. Make such
//!   effects idempotent, keyed by the tick: [`CronContext::scheduled_at`] is the same in
//!   every run of a tick.
//!
//! ```no_run
//! # async fn demo(ctx: forge_scheduler::CronContext) -> Result<(), forge_scheduler::CronError> {
//! let mut tx = ctx.fenced_transaction().await?;
//! sqlx::query("INSERT INTO hourly_totals (hour, total) SELECT $1, sum(amount) FROM orders")
//!     .bind(ctx.scheduled_at())
//!     .execute(&mut *tx)
//!     .await?;
//! ctx.complete(&mut tx).await?; // the tick is done in the same commit as the totals
//! tx.commit().await?;
//! # Ok(()) }
//! ```

mod clock;
mod component;
mod ledger;
pub(crate) mod plan;
mod stored;
mod supervisor;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge_core::{Epoch, Leadership, NodeId, Result, Role};
use forge_cron::Schedule;
use sqlx::{PgPool, Postgres, Transaction};
use tokio_util::sync::CancellationToken;

#[allow(deprecated)]
pub use component::{CronRunner, Crons};
pub(crate) use stored::EnqueueTick;
pub use stored::{StoredCron, StoredCronSpec};

forge_core::sql_enum! {
    /// The state of a tick in the ledger (`forge.cron_ticks.state`).
    pub enum TickState {
        /// Claimed; its handler is running (or its leader died: the next leader reruns or
        /// abandons it).
        Running = "running",
        /// The handler returned `Ok`, or completed the tick in its own transaction.
        Succeeded = "succeeded",
        /// The handler returned an error or panicked.
        Failed = "failed",
        /// The handler ran past the cron's timeout.
        TimedOut = "timed_out",
        /// Not run: the previous run was still going (`overlap = "skip"`).
        Skipped = "skipped",
        /// Not run again after its leader's death (`interrupted = "abandon"`, or 3 attempts).
        Abandoned = "abandoned",
    }
}

/// What to do with ticks that were due while the cron's role had no leader (or its leader
/// lacked the cron), and with ticks a forward step of the database's clock stepped over during
/// a tenure (the database's clock decides when a tick is due).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CatchUp {
    /// Run none of them. A tick at most `[cron] misfire_threshold` late (default 1 s) still
    /// runs: a tick due during a fast failover is late, not missed.
    Skip,
    /// Run the most recent one once (the default; Quartz's "fire once now").
    Latest,
    /// Run every one of them, oldest first, within the catch-up window.
    All,
}

/// What to do when a tick is due while the previous run of the same cron is still going.
/// The default is `Skip`, and `Wait` under [`CatchUp::All`] (which asks for every tick).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    /// Record the tick as `skipped` and do not run it (the default, but under
    /// [`CatchUp::All`]).
    Skip,
    /// Run it as soon as the previous run ends (the default under [`CatchUp::All`]).
    Wait,
    /// Run it alongside the previous run.
    Allow,
}

/// What the next leader does with a tick whose run was cut short by its leader's death (the
/// ledger row is still `running` under an older epoch). This includes a tick its leader
/// claimed ahead (`[cron] claim_ahead`) and died before starting, when the next leader
/// took over only after the tick's instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupted {
    /// Run it again, with the attempt number incremented (the default), at most 3 attempts;
    /// the handler sees [`CronContext::attempt`] > 1.
    Rerun,
    /// Mark it `abandoned` and move on.
    Abandon,
}

impl CatchUp {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CatchUp::Skip => "skip",
            CatchUp::Latest => "latest",
            CatchUp::All => "all",
        }
    }
}

/// An error returned by a cron handler. Any `std::error::Error` converts into it with `?`;
/// [`CronError::msg`] makes one from a message.
pub struct CronError(Box<dyn std::error::Error + Send + Sync>);

impl CronError {
    /// An error with this message.
    pub fn msg(message: impl fmt::Display) -> CronError {
        CronError(message.to_string().into())
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for CronError {
    fn from(err: E) -> CronError {
        CronError(Box::new(err))
    }
}

impl fmt::Display for CronError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for CronError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// What a cron handler may return: `()` or `Result<(), E>` where `E` converts into
/// [`CronError`].
#[diagnostic::on_unimplemented(
    message = "a cron handler must return `()` or `Result<(), E>` where `E` converts into `forge::CronError`, not `{Self}`",
    note = "any `std::error::Error + Send + Sync + 'static` converts; for a message use `forge::CronError::msg(...)`"
)]
pub trait IntoCronResult {
    /// The outcome as a `Result`.
    fn into_cron_result(self) -> Result<(), CronError>;
}

impl IntoCronResult for () {
    fn into_cron_result(self) -> Result<(), CronError> {
        Ok(())
    }
}

impl<E: Into<CronError>> IntoCronResult for Result<(), E> {
    fn into_cron_result(self) -> Result<(), CronError> {
        self.map_err(Into::into)
    }
}

/// A cron's handler. Two definitions with the same options are the same cron whatever their
/// handlers (the node compares definitions to refuse two different crons of one name).
#[derive(Clone)]
pub(crate) struct Handler(Arc<HandlerFn>);

type HandlerFn = dyn Fn(CronContext) -> Pin<Box<dyn Future<Output = Result<(), CronError>> + Send>>
    + Send
    + Sync;

impl Handler {
    pub(crate) fn call(&self, ctx: CronContext) -> impl Future<Output = Result<(), CronError>> {
        (self.0)(ctx)
    }
}

impl PartialEq for Handler {
    fn eq(&self, _: &Handler) -> bool {
        true
    }
}

/// A cron: a name, a [`Schedule`], a role, policies, and an async handler.
///
/// `#[cron]` builds one: each of its options is the builder method of the same name, so
/// `#[cron("0 * * * *", catch_up = "all", timeout = "2m")]` is
/// `CronJob::new(name, schedule, handler).catch_up(CatchUp::All).timeout(..)` (a word of a
/// choice is the variant of the enum named after the option). In code:
///
/// ```
/// use forge_scheduler::{CronJob, CatchUp, Schedule};
///
/// let job = CronJob::new("compact", Schedule::parse("0 * * * *").unwrap(), |ctx| async move {
///     println!("tick {} (attempt {})", ctx.scheduled_at(), ctx.attempt());
/// })
/// .catch_up(CatchUp::All);
/// assert_eq!(job.name(), "compact");
/// ```
#[derive(Clone, PartialEq)]
pub struct CronJob {
    pub(crate) name: String,
    pub(crate) schedule: Schedule,
    pub(crate) role: Role,
    pub(crate) catch_up: CatchUp,
    pub(crate) catch_up_window: Duration,
    /// As set; `None`: the default for the catch-up policy (see [`CronJob::overlap_policy`]).
    pub(crate) overlap: Option<Overlap>,
    pub(crate) interrupted: Interrupted,
    pub(crate) timeout: Option<Duration>,
    pub(crate) description: Option<String>,
    pub(crate) handler: Handler,
}

impl CronJob {
    /// The default catch-up window: ticks older than this are never caught up.
    pub const DEFAULT_CATCH_UP_WINDOW: Duration = Duration::from_secs(24 * 3600);

    /// A cron on the `scheduler` role with the default policies (catch up the latest missed
    /// tick, skip overlapping ticks, rerun interrupted ones, no timeout).
    pub fn new<F, Fut, R>(name: impl Into<String>, schedule: Schedule, handler: F) -> CronJob
    where
        F: Fn(CronContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoCronResult,
    {
        let handler = Handler(Arc::new(move |ctx| {
            let run = handler(ctx);
            Box::pin(async move { run.await.into_cron_result() })
        }));
        CronJob {
            name: name.into(),
            schedule,
            role: Role::SCHEDULER,
            catch_up: CatchUp::Latest,
            catch_up_window: CronJob::DEFAULT_CATCH_UP_WINDOW,
            overlap: None,
            interrupted: Interrupted::Rerun,
            timeout: None,
            description: None,
            handler,
        }
    }

    /// The role whose leader runs the cron (`#[cron(role = "...")]`); default
    /// [`Role::SCHEDULER`].
    pub fn role(mut self, role: Role) -> Self {
        self.role = role;
        self
    }

    /// What to do with the ticks missed while the role had no leader (`#[cron(catch_up =
    /// "...")]`); default [`CatchUp::Latest`].
    pub fn catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// How far back [`CatchUp::All`] and [`CatchUp::Latest`] look (`#[cron(catch_up_window =
    /// "1h")]`); default 24 h.
    pub fn catch_up_window(mut self, window: Duration) -> Self {
        self.catch_up_window = window;
        self
    }

    /// The overlap policy. Unset, it is [`Overlap::Wait`] under [`CatchUp::All`] (every tick
    /// runs: one that comes due while a run goes runs after it) and [`Overlap::Skip`] otherwise.
    pub fn overlap(mut self, overlap: Overlap) -> Self {
        self.overlap = Some(overlap);
        self
    }

    /// The overlap policy in force: as set, or the default for the catch-up policy.
    pub fn overlap_policy(&self) -> Overlap {
        self.overlap.unwrap_or(match self.catch_up {
            CatchUp::All => Overlap::Wait,
            CatchUp::Skip | CatchUp::Latest => Overlap::Skip,
        })
    }

    /// What the next leader does with a run cut short by its leader's death (`#[cron(interrupted
    /// = "...")]`); default [`Interrupted::Rerun`].
    pub fn interrupted(mut self, interrupted: Interrupted) -> Self {
        self.interrupted = interrupted;
        self
    }

    /// Cancels a run that takes longer, recorded as `timed_out` (`#[cron(timeout = "30s")]`);
    /// default none.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// What the cron is for, in words, for people reading its definition
    /// (`#[cron(description = "...")]`); default none. FORGE keeps it with the definition
    /// ([`CronJob::description_text`]) and does not interpret it; two definitions of one name that
    /// differ in it are two different crons.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// The cron's description, if it has one (see [`CronJob::description`]).
    pub fn description_text(&self) -> Option<&str> {
        self.description.as_deref()
    }

    /// The cron's name (its key in the ledger).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cron's schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The role whose leader runs it.
    pub fn role_name(&self) -> &Role {
        &self.role
    }

    /// Whether two definitions describe the same cron (the same options, the overlap policy
    /// as in force).
    pub(crate) fn same_definition(&self, other: &CronJob) -> bool {
        let in_force = |cron: &CronJob| CronJob {
            overlap: Some(cron.overlap_policy()),
            ..cron.clone()
        };
        in_force(self) == in_force(other)
    }
}

/// The options as they are in force (the schedule as written, the overlap policy as
/// [`CronJob::overlap_policy`] says). Every field is named here, so a new option cannot be left
/// out by mistake.
impl fmt::Debug for CronJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let CronJob {
            name,
            schedule,
            role,
            catch_up,
            catch_up_window: _,
            overlap: _,
            interrupted,
            timeout,
            description,
            handler: _,
        } = self;
        f.debug_struct("CronJob")
            .field("name", name)
            .field("schedule", &schedule.to_string())
            .field("role", role)
            .field("catch_up", catch_up)
            .field("overlap", &self.overlap_policy())
            .field("interrupted", interrupted)
            .field("timeout", timeout)
            .field("description", description)
            .finish()
    }
}

/// Something that defines a cron: a `#[cron]` function, or a [`CronJob`]. What
/// `NodeBuilder::cron` takes.
pub trait IntoCron {
    /// The cron's definition; an error when it cannot be used (for `#[cron]` functions the
    /// macro has already validated everything at compile time).
    fn cron_job(&self) -> Result<CronJob>;
}

/// The former name of [`IntoCron`], kept for one release: every `IntoCron` is a `Cron`, so
/// `impl Cron` bounds still compile. (Implement `IntoCron` itself.)
#[deprecated(since = "0.2.0", note = "renamed `IntoCron`")]
pub trait Cron: IntoCron {}

#[allow(deprecated)]
impl<T: IntoCron + ?Sized> Cron for T {}

impl IntoCron for CronJob {
    fn cron_job(&self) -> Result<CronJob> {
        Ok(self.clone())
    }
}

/// What a cron handler gets for one run of one tick.
#[derive(Clone)]
pub struct CronContext {
    pub(crate) name: Arc<str>,
    pub(crate) scheduled_at: DateTime<Utc>,
    pub(crate) fired_at: DateTime<Utc>,
    pub(crate) attempt: u32,
    pub(crate) leadership: Leadership,
    pub(crate) cancel: CancellationToken,
}

impl CronContext {
    /// The cron's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The instant the tick was scheduled for (UTC). The database's clock decides when it is
    /// due.
    pub fn scheduled_at(&self) -> DateTime<Utc> {
        self.scheduled_at
    }

    /// When this run started, by the database's clock as the leader follows it (read on the
    /// role's lock session, carried on the monotonic clock; not this node's wall clock), so
    /// that `fired_at - scheduled_at` is how late it started.
    pub fn fired_at(&self) -> DateTime<Utc> {
        self.fired_at
    }

    /// 1 for the first run of the tick; more when a run cut short by a leader's death is run
    /// again ([`Interrupted::Rerun`]).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The epoch of the leadership running the tick.
    pub fn epoch(&self) -> Epoch {
        self.leadership.epoch()
    }

    /// The node running the tick.
    pub fn node_id(&self) -> &NodeId {
        self.leadership.node_id()
    }

    /// The leadership running the tick.
    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    /// The node's pool.
    pub fn pool(&self) -> &PgPool {
        self.leadership.pool()
    }

    /// A transaction whose writes are applied only if this leadership is still current when
    /// it commits (see `Leadership::fenced_transaction`). Complete the tick in it with
    /// [`CronContext::complete`] to make its effects exactly-once.
    pub async fn fenced_transaction(&self) -> Result<Transaction<'static, Postgres>> {
        self.leadership.fenced_transaction().await
    }

    /// Marks the tick `succeeded` inside `tx`, fenced by this leadership: when `tx` commits,
    /// the handler's writes in it and the tick's outcome are one commit, so the tick never
    /// runs again, whatever happens to this leader afterwards. When it does not commit,
    /// neither did the effects, and the tick is run again per [`Interrupted`].
    ///
    /// Fails with [`Error::Fenced`](forge_core::Error::Fenced) when this leadership is no longer
    /// current and with [`Error::NotRunning`](forge_core::Error::NotRunning) when the tick is no
    /// longer this run's; then `tx` must not commit (with `?`, it is rolled back when dropped).
    /// Calling it twice in one transaction is harmless; calling it in a second transaction after
    /// the first committed fails with [`Error::NotRunning`](forge_core::Error::NotRunning), so a
    /// handler that retries after an error from `COMMIT` (which may have committed all the same)
    /// cannot commit its effects twice. A handler that
    /// returns an error after a completed commit leaves the tick `succeeded`.
    pub async fn complete(&self, tx: &mut Transaction<'_, Postgres>) -> Result<()> {
        self.leadership.check_local()?;
        ledger::complete(
            &self.leadership,
            &self.name,
            self.scheduled_at,
            self.fired_at,
            tx,
        )
        .await
    }

    /// Whether the run should stop: leadership lost or past its local deadline, handoff
    /// begun, or timeout reached.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled() || self.leadership.is_draining() || !self.leadership.is_valid()
    }

    /// Resolves when the run should stop (see [`CronContext::is_cancelled`]).
    pub async fn cancelled(&self) {
        tokio::select! {
            _ = self.cancel.cancelled() => {}
            _ = self.leadership.stopping() => {}
        }
    }
}

impl fmt::Debug for CronContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CronContext")
            .field("name", &self.name)
            .field("scheduled_at", &self.scheduled_at)
            .field("attempt", &self.attempt)
            .field("epoch", &self.leadership.epoch())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_description_is_kept_and_part_of_the_definition() {
        let schedule = Schedule::parse("0 * * * *").unwrap();
        let plain = CronJob::new("compact", schedule.clone(), |_| async {});
        assert_eq!(plain.description_text(), None);
        let described = plain.clone().description("compacts the event log");
        assert_eq!(described.description_text(), Some("compacts the event log"));
        assert!(!described.same_definition(&plain));
        assert!(described.same_definition(&described.clone()));
    }
}
