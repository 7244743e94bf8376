//! The test kit's parts that live here (`forge::testing` re-exports them, behind the facade's
//! `testing` feature): one job attempt run inline with a real [`JobContext`], what was
//! enqueued and assertions on it, and [`CronClock`], a cron driven by a fake clock.
//!
//! Everything runs against a real PostgreSQL with FORGE's schema (the facade's
//! `forge::testing::database()` makes one).

use std::time::Duration;

use chrono::{DateTime, Utc};
use forge_core::{LockNamespace, NodeId, Result};
use serde::Serialize;
use serde_json::Value;
use sqlx::{Executor, PgPool, Postgres};

use crate::cron::{CronJob, IntoCron, plan};
use crate::jobs::{Job, JobContext, JobError, JobId, JobState, Jobs, NewJob};

/// The node id the kit's job attempts run under.
pub const TEST_NODE: &str = "forge-testing";

/// What one attempt run by [`run_job`] did.
#[derive(Debug)]
pub struct JobRun {
    /// The job's id in `forge.jobs`.
    pub id: JobId,
    /// What the handler returned.
    pub result: std::result::Result<(), JobError>,
    /// The job's state after the attempt: `completed` when the handler returned `Ok` (or
    /// completed the job in its transaction), `retryable` after an error (the kit schedules no
    /// retry), `dead` after `JobError::discard`.
    pub state: JobState,
    /// The jobs the handler enqueued (committed), oldest first.
    pub enqueued: Vec<EnqueuedJob>,
}

/// A job found in `forge.jobs`.
#[derive(Clone, Debug, PartialEq, Serialize, sqlx::FromRow)]
pub struct EnqueuedJob {
    /// Its id (`JobId(id)`).
    pub id: i64,
    /// Its kind.
    pub kind: String,
    /// Its arguments.
    pub args: Value,
    /// Its queue.
    pub queue: String,
}

/// Runs one attempt of `job` with `args` inline, against `pool`'s database (FORGE's schema,
/// namespace `forge`): the job is enqueued with its declared options, marked running under
/// attempt 1 on node [`TEST_NODE`], and its handler runs here with a real [`JobContext`]:
/// `ctx.complete(&mut tx)`, `ctx.pool()` and `ctx.jobs()` (enqueueing) work as on a node.
/// No node needs to run; none should work the job's queue meanwhile.
pub async fn run_job<J: Job>(pool: &PgPool, job: J, args: J::Args) -> Result<JobRun> {
    let namespace = LockNamespace::default();
    let value = serde_json::to_value(&args).map_err(|err| forge_core::Error::Serialization {
        kind: J::KIND.to_owned(),
        message: err.to_string(),
    })?;
    let options = job.options();
    let max_attempts = options.max_attempts.unwrap_or(1);
    let new = NewJob::declared(J::KIND, options, Ok(value));
    let queue = new.queue.clone();
    let id = Jobs::new(pool.clone(), &namespace)
        .enqueue_job(new)
        .await?
        .id();
    let node = NodeId::new(TEST_NODE).map_err(forge_core::Error::from)?;
    sqlx::query(
        // 'busy': running in no lane's list, so that rescue finds it (see forge.jobs_running).
        "UPDATE forge.jobs SET state = 'running', phase = 'busy', attempt = 1, node_id = $2,
                attempted_at = clock_timestamp(), started_at = clock_timestamp()
          WHERE id = $1",
    )
    .bind(id.0)
    .bind(&node)
    .execute(pool)
    .await?;
    let ctx = JobContext::detached(
        id,
        namespace,
        J::KIND,
        &queue,
        (1, max_attempts),
        node,
        pool.clone(),
    );
    let result = match job.run(ctx.clone(), args).await {
        // An output (the handler's `Ok` value or `set_output`) is stored with the completion,
        // as on a node.
        Ok(()) => crate::jobs::flow::complete_with_output(&ctx.output, || ctx.clone()).await,
        failed => failed,
    };
    let outcome = match &result {
        Ok(()) => "completed",
        Err(err) if err.action() == crate::jobs::FailAction::Discard => "dead",
        Err(_) => "retryable",
    };
    // As a worker records an outcome: only if the attempt still holds the job; an end counts
    // in the job's children in the same transaction (see forge.jobs_parent_finished).
    let mut tx = pool.begin().await?;
    let parent: Option<bool> = sqlx::query_scalar(
        "UPDATE forge.jobs SET state = $2, finished_at = clock_timestamp()
          WHERE id = $1 AND state = 'running' AND attempt = 1
         RETURNING has_children AND state <> 'retryable'",
    )
    .bind(id.0)
    .bind(outcome)
    .fetch_optional(&mut *tx)
    .await?;
    if parent == Some(true) {
        sqlx::query("SELECT forge.jobs_parent_finished(ARRAY[$1::bigint], ARRAY[$2], false)")
            .bind(id.0)
            .bind(outcome)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    let state: String = sqlx::query_scalar("SELECT state FROM forge.jobs WHERE id = $1")
        .bind(id.0)
        .fetch_optional(pool)
        .await?
        .unwrap_or_else(|| "completed".to_owned());
    let enqueued =
        sqlx::query_as("SELECT id, kind, args, queue FROM forge.jobs WHERE id > $1 ORDER BY id")
            .bind(id.0)
            .fetch_all(pool)
            .await?;
    Ok(JobRun {
        id,
        result,
        state: JobState::parse(&state).unwrap_or(JobState::Completed),
        enqueued,
    })
}

/// The jobs of `kind` whose arguments contain `args` (JSON containment, `args @> $args`),
/// seen through `executor`: a pool sees what committed, `&mut *tx` also what `tx` enqueued.
pub async fn enqueued<'c, E>(executor: E, kind: &str, args: impl Serialize) -> Vec<EnqueuedJob>
where
    E: Executor<'c, Database = Postgres>,
{
    let args = serde_json::to_value(args).expect("the arguments serialize to JSON");
    sqlx::query_as(
        "SELECT id, kind, args, queue FROM forge.jobs WHERE kind = $1 AND args @> $2 ORDER BY id",
    )
    .bind(kind)
    .bind(args)
    .fetch_all(executor)
    .await
    .expect("forge.jobs can be read (does the database have FORGE's schema?)")
}

/// Panics unless a job of `kind` whose arguments contain `args` was enqueued, as seen through
/// `executor` (pass `&mut *tx` to look inside a transaction that has not committed).
pub async fn assert_enqueued<'c, E>(executor: E, kind: &str, args: impl Serialize)
where
    E: Executor<'c, Database = Postgres>,
{
    let args = serde_json::to_value(args).expect("the arguments serialize to JSON");
    let found = enqueued(executor, kind, &args).await;
    assert!(
        !found.is_empty(),
        "no job of kind `{kind}` with arguments containing {args} was enqueued"
    );
}

/// Panics if a job of `kind` whose arguments contain `args` was enqueued, as seen through
/// `executor`.
pub async fn assert_not_enqueued<'c, E>(executor: E, kind: &str, args: impl Serialize)
where
    E: Executor<'c, Database = Postgres>,
{
    let args = serde_json::to_value(args).expect("the arguments serialize to JSON");
    let found = enqueued(executor, kind, &args).await;
    assert!(
        found.is_empty(),
        "jobs of kind `{kind}` with arguments containing {args} were enqueued: {found:?}"
    );
}

/// A cron driven by a fake clock: which of its ticks fire, by the rules its leader applies
/// (the schedule with its time zone and DST rules; the catch-up policy and window after a gap
/// without a leader; `[cron] misfire_threshold`, default 1 s).
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use forge_scheduler::testing::CronClock;
/// use forge_scheduler::{CatchUp, CronJob, Schedule};
///
/// let cron = CronJob::new("hourly", Schedule::parse("0 * * * *").unwrap(), |_| async {})
///     .catch_up(CatchUp::Latest);
/// let mut clock = CronClock::new(&cron, Utc.with_ymd_and_hms(2026, 1, 1, 0, 30, 0).unwrap()).unwrap();
/// // A leader throughout: every tick, on time.
/// assert_eq!(clock.advance_to(Utc.with_ymd_and_hms(2026, 1, 1, 2, 30, 0).unwrap()).len(), 2);
/// // No leader for five hours: the latest missed tick runs once when a leader is back.
/// let caught = clock.leaderless_until(Utc.with_ymd_and_hms(2026, 1, 1, 7, 30, 0).unwrap());
/// assert_eq!(caught, [Utc.with_ymd_and_hms(2026, 1, 1, 7, 0, 0).unwrap()]);
/// ```
#[derive(Clone, Debug)]
pub struct CronClock {
    cron: CronJob,
    now: DateTime<Utc>,
    misfire_threshold: Duration,
}

impl CronClock {
    /// The cron at the instant `start` (ticks at or before it are past).
    pub fn new(cron: &impl IntoCron, start: DateTime<Utc>) -> Result<CronClock> {
        Ok(CronClock {
            cron: cron.cron_job()?,
            now: start,
            misfire_threshold: Duration::from_secs(1),
        })
    }

    /// As `[cron] misfire_threshold` (default 1 s).
    pub fn misfire_threshold(mut self, threshold: Duration) -> Self {
        self.misfire_threshold = threshold;
        self
    }

    /// The clock's instant.
    pub fn now(&self) -> DateTime<Utc> {
        self.now
    }

    /// Moves the clock to `to` with a leader throughout: the ticks that fire on time, in
    /// `(now, to]`, oldest first.
    pub fn advance_to(&mut self, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        let from = self.now;
        self.now = to.max(from);
        self.cron.schedule().ticks_between(from, to).collect()
    }

    /// Moves the clock to `to` with no leader until then: the ticks of `(now, to]` that the
    /// leader starting at `to` runs by the catch-up policy (none, the latest, or all within
    /// the window), oldest first.
    pub fn leaderless_until(&mut self, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        let from = self.now;
        self.now = to.max(from);
        plan::catch_up(&self.cron, (from, to), self.misfire_threshold).0
    }
}
