//! Read models of the work: crons (with their next and last runs, outcomes, lag, skipped and
//! missing ticks, pause), a cron's ticks, jobs (by state, queue, kind, arguments), a job with
//! each attempt's error, queues. Typed and paginated like the cluster's
//! ([`forge_core::inspect`]); shared by the admin API, the CLI and the dashboard.

use chrono::{DateTime, TimeDelta, Utc};
use forge_core::inspect::{Change, Page, PageRequest, audit};
use forge_core::{LockNamespace, Result};
use forge_cron::Schedule;
use serde::Serialize;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{FromRow, PgPool, Postgres};

use crate::cron::{StoredCron, TickState};
use crate::jobs::QueueLimits;
use crate::jobs::{
    CancelOutcome, JOB_SQL, JobAction, JobActions, JobId, JobInfo, JobRow, JobState,
};

mod kind_limits;
pub use kind_limits::KindLimitsView;

/// A cron the cluster knows (registered by some node).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct CronView {
    /// Its name.
    pub name: String,
    /// The role whose leader runs it.
    pub role: String,
    /// Its expression.
    pub expression: String,
    /// Its time zone.
    pub timezone: String,
    /// When it was paused (`None`: running).
    pub paused_at: Option<DateTime<Utc>>,
    /// Who paused it.
    pub paused_by: Option<String>,
    /// A "trigger now" waiting for the role's leader: the instant its manual tick will have.
    pub trigger_requested_at: Option<DateTime<Utc>>,
    /// Its next tick (`None`: the expression does not parse here, or never fires again).
    pub next_run: Option<DateTime<Utc>>,
    /// Its newest tick in the ledger whose instant has come (a tick claimed ahead of its
    /// instant has not run yet).
    pub last: Option<TickView>,
    /// Ticks of the last 24 hours recorded as skipped (paused, or overlap).
    pub skipped_24h: i64,
    /// Ticks of the last 24 hours (since it was first registered) with no ledger row: due while
    /// the role had no leader and not caught up.
    pub missing_24h: i64,
    /// The node that last registered it (for a stored cron: who last stored it).
    pub last_seen_by: String,
    /// For a cron stored in the database (`Workload::upsert_cron`): the kind of the job each
    /// tick enqueues; `None` for a cron of code.
    pub job_kind: Option<String>,
    /// For a stored cron: the job's arguments.
    pub job_args: Option<serde_json::Value>,
    /// For a stored cron: its policies as `PUT /api/crons/{name}` takes them (`catch_up`,
    /// `catch_up_window`, `overlap`, `interrupted`, `timeout`; durations as `"1day"`, `"30s"`;
    /// `null`: the default), so that a change can start from what is stored.
    pub job_options: Option<serde_json::Value>,
}

/// What [`Workload::upsert_cron`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Upserted {
    /// A new stored cron.
    Created,
    /// Its definition changed.
    Updated,
    /// It was stored with this definition already: nothing was written or audited.
    Unchanged,
}

/// One tick of a cron, from the ledger.
#[derive(Clone, Debug, PartialEq, Serialize, sqlx::FromRow)]
#[non_exhaustive]
pub struct TickView {
    /// The instant it was scheduled for.
    pub scheduled_at: DateTime<Utc>,
    /// Its state.
    pub state: TickState,
    /// Its attempt (more than 1 after a rerun).
    pub attempt: i32,
    /// The node that ran it.
    pub node_id: String,
    /// The epoch it ran under.
    pub epoch: i64,
    /// When it was claimed (ahead of its instant, by `[cron] claim_ahead`, when on time).
    pub claimed_at: DateTime<Utc>,
    /// When its handler started, by the database's clock as the leader that ran it followed it
    /// (`None`: it did not start: skipped, abandoned, or not yet).
    pub started_at: Option<DateTime<Utc>>,
    /// When its outcome was recorded.
    pub finished_at: Option<DateTime<Utc>>,
    /// The error, or why it was skipped.
    pub error: Option<String>,
    /// How late after its instant the handler started, in milliseconds (what
    /// `forge_cron_lag_seconds` measures; `None` until it started).
    #[serde(serialize_with = "forge_core::inspect::rounded::optional")]
    pub lag_ms: Option<f64>,
    /// How long the handler ran, in milliseconds (what `forge_cron_run_duration_seconds`
    /// measures; `None` until its outcome is recorded).
    #[serde(serialize_with = "forge_core::inspect::rounded::optional")]
    pub duration_ms: Option<f64>,
    /// Run on an operator's request ("trigger now"), not on the schedule.
    pub manual: bool,
}

/// A queue's figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct QueueView {
    /// The queue.
    pub queue: String,
    /// Jobs waiting to be claimed.
    pub available: i64,
    /// Jobs waiting for their run-at time.
    pub scheduled: i64,
    /// Jobs waiting for their parents ([`NewJob::after`](crate::jobs::NewJob::after)).
    pub pending: i64,
    /// Jobs running.
    pub running: i64,
    /// Jobs waiting for a retry.
    pub retryable: i64,
    /// Dead-lettered jobs still kept.
    pub dead: i64,
    /// How long the oldest available job has been due, in seconds (0: none).
    #[serde(serialize_with = "forge_core::inspect::rounded::figure")]
    pub oldest_available_age_s: f64,
    /// Paused: no node claims its jobs until it is resumed.
    pub paused: bool,
    /// Its cluster-wide limits (global concurrency, rate), checked by every claim.
    pub limits: QueueLimits,
    /// Who set the limits: `None` for forge.toml's (written by a node at start), else the
    /// operator, whose values win until reset.
    pub limits_set_by: Option<String>,
    /// Attempts counted against the global concurrency limit now (running or claimed).
    pub limited_running: i64,
    /// Claims counted against the rate in its current window (all rate keys).
    pub rate_claims: i64,
    /// When the rate lets the next claim through, when its window is full (without a rate key;
    /// with one, when the first key's window frees a claim).
    pub rate_limited_until: Option<DateTime<Utc>>,
    /// Why its available jobs wait, when a limit holds them: "at global limit (4/4 running)",
    /// "rate limited until ...".
    pub waiting_on: Option<String>,
}

/// Which jobs to list.
#[derive(Clone, Debug, Default)]
pub struct JobFilter {
    /// Only these states (empty: all).
    pub states: Vec<JobState>,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this kind.
    pub kind: Option<String>,
    /// Only jobs whose arguments contain this JSON (`args @> filter`).
    pub args: Option<serde_json::Value>,
}

/// The work's read models (crons, ticks, jobs, queues) for one namespace.
#[derive(Clone, Debug)]
pub struct Workload {
    pool: PgPool,
    namespace: LockNamespace,
}

impl Workload {
    /// Read models on `pool` for the cluster `namespace`.
    pub fn new(pool: PgPool, namespace: LockNamespace) -> Workload {
        Workload { pool, namespace }
    }

    /// Every cron the cluster knows, by name.
    pub async fn crons(&self) -> Result<Vec<CronView>> {
        let rows = self
            .crons_query("ORDER BY c.name")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(cron_from_row).collect()
    }

    /// One cron.
    pub async fn cron(&self, name: &str) -> Result<Option<CronView>> {
        let row = self
            .crons_query("AND c.name = $2")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(cron_from_row).transpose()
    }

    /// [`CRONS_SQL`] and `tail`, with the namespace bound (the tail's parameters are `$2`
    /// onwards).
    fn crons_query(&self, tail: &str) -> Query<'static, Postgres, PgArguments> {
        sqlx::query(sqlx::AssertSqlSafe(format!("{CRONS_SQL} {tail}"))).bind(&self.namespace)
    }

    /// A cron's ticks, newest first; the cursor is the tick's instant in microseconds.
    pub async fn ticks(&self, cron: &str, page: PageRequest) -> Result<Page<TickView>> {
        let before = page.before.and_then(DateTime::<Utc>::from_timestamp_micros);
        let items: Vec<TickView> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "{TICKS_SQL} WHERE namespace = $1 AND cron = $2
               AND ($3::timestamptz IS NULL OR scheduled_at < $3)
             ORDER BY scheduled_at DESC LIMIT $4"
        )))
        .bind(&self.namespace)
        .bind(cron)
        .bind(before)
        .bind(page.fetch())
        .fetch_all(&self.pool)
        .await?;
        Ok(page.page(items, |t| t.scheduled_at.timestamp_micros()))
    }

    /// Pauses a cron: whichever node leads its role records its ticks as skipped until it is
    /// resumed. False when the cluster knows no such cron.
    pub async fn pause_cron(&self, name: &str, by: &str) -> Result<bool> {
        self.set_paused(name, true, by).await
    }

    /// Resumes a paused cron from its next tick (the ticks skipped while paused stay skipped).
    pub async fn resume_cron(&self, name: &str, by: &str) -> Result<bool> {
        self.set_paused(name, false, by).await
    }

    async fn set_paused(&self, name: &str, paused: bool, by: &str) -> Result<bool> {
        let mut tx = forge_core::begin(&self.pool).await?;
        let known: bool = sqlx::query_scalar("SELECT forge.cron_set_paused($1, $2, $3, $4)")
            .bind(&self.namespace)
            .bind(name)
            .bind(paused)
            .bind(by)
            .fetch_one(&mut *tx)
            .await?;
        if known {
            let action = if paused { "pause_cron" } else { "resume_cron" };
            audit(
                &mut *tx,
                &self.namespace,
                action,
                name,
                by,
                serde_json::json!({}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(known)
    }

    /// Asks for a run of the cron now ("trigger now"): whichever node leads its role runs it
    /// once, as a manual tick at the returned instant, under the cron's overlap rule (a run
    /// still going is waited for), even while the cron is paused. A request made while
    /// another is pending returns the pending one's instant. `None` when the cluster knows no
    /// such cron.
    pub async fn trigger_cron(&self, name: &str, by: &str) -> Result<Option<DateTime<Utc>>> {
        Ok(sqlx::query_scalar("SELECT forge.cron_trigger($1, $2, $3)")
            .bind(&self.namespace)
            .bind(name)
            .bind(by)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Creates or changes a cron stored in the database, which enqueues its job at each tick on
    /// the scheduler's leader; the leader runs the new definition within a second, with no
    /// restart (a run in progress ends first; ticks of a changed schedule due before the change
    /// are not caught up). Audited (`upsert_cron`, with the definition). Refused with
    /// [`Error::Conflict`](forge_core::Error::Conflict) when a cron of code has the name, and
    /// with [`Error::InvalidInput`](forge_core::Error::InvalidInput) for invalid durations. The
    /// kind is not checked here (this process may not know the kinds): a tick whose kind the
    /// leader's binary lacks fails, saying so.
    pub async fn upsert_cron(&self, cron: &StoredCron, by: &str) -> Result<Upserted> {
        cron.validate()?;
        let mut tx = forge_core::begin(&self.pool).await?;
        let answer: String =
            sqlx::query_scalar("SELECT forge.cron_store($1, $2, $3, $4, $5, $6, $7, $8)")
                .bind(&self.namespace)
                .bind(cron.name())
                .bind(cron.schedule().expression())
                .bind(cron.schedule().timezone().name())
                .bind(cron.kind())
                .bind(cron.args())
                .bind(cron.options())
                .bind(by)
                .fetch_one(&mut *tx)
                .await?;
        let upserted = match answer.as_str() {
            "created" => Upserted::Created,
            "updated" => Upserted::Updated,
            "unchanged" => Upserted::Unchanged,
            _ => {
                return Err(forge_core::Error::Conflict {
                    message: format!(
                        "a cron of code is named `{}`: its name is taken; store this cron under another name",
                        cron.name()
                    ),
                });
            }
        };
        if upserted != Upserted::Unchanged {
            let detail = serde_json::json!({
                "expression": cron.schedule().expression(),
                "timezone": cron.schedule().timezone().name(),
                "kind": cron.kind(),
                "args": cron.args(),
                "options": cron.options(),
                "created": upserted == Upserted::Created,
            });
            audit(
                &mut *tx,
                &self.namespace,
                "upsert_cron",
                cron.name(),
                by,
                detail,
            )
            .await?;
        }
        tx.commit().await?;
        Ok(upserted)
    }

    /// Deletes a cron stored in the database: the scheduler's leader stops its loop within a
    /// second (a run in progress ends first); its ticks stay in the ledger until retention
    /// prunes them. Audited (`delete_cron`). False when no cron has the name; refused with
    /// [`Error::Conflict`](forge_core::Error::Conflict) for a cron of code (deploy without it).
    pub async fn delete_cron(&self, name: &str, by: &str) -> Result<bool> {
        let mut tx = forge_core::begin(&self.pool).await?;
        let answer: String = sqlx::query_scalar("SELECT forge.cron_unstore($1, $2)")
            .bind(&self.namespace)
            .bind(name)
            .fetch_one(&mut *tx)
            .await?;
        match answer.as_str() {
            "deleted" => {}
            "missing" => return Ok(false),
            _ => {
                return Err(forge_core::Error::Conflict {
                    message: format!(
                        "`{name}` is a cron of code, not a stored cron: it is deleted by deploying without it"
                    ),
                });
            }
        }
        audit(
            &mut *tx,
            &self.namespace,
            "delete_cron",
            name,
            by,
            serde_json::json!({}),
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Makes a job available again now, with room for one more attempt (from dead,
    /// cancelled, completed, retryable or scheduled). Refused while it runs.
    pub async fn retry_job(&self, id: JobId, by: &str) -> Result<Change> {
        let mut tx = forge_core::begin(&self.pool).await?;
        let Some((state, requested)) = self.state_of(&mut tx, id).await? else {
            return Ok(Change::NotFound);
        };
        let change = match JobActions::refusal(state, requested, JobAction::Retry) {
            Some(reason) => Change::Refused(reason),
            None => {
                sqlx::query("SELECT forge.jobs_retry_now($1, $2)")
                    .bind(&self.namespace)
                    .bind(vec![id.0])
                    .execute(&mut *tx)
                    .await?;
                Change::Applied
            }
        };
        self.audit_one(tx, "retry_job", id, by, &change).await?;
        Ok(change)
    }

    /// Cancels a job: at once when it waits; a running job's node is asked to stop it (and
    /// records it cancelled unless the attempt completes first). Refused when it finished.
    pub async fn cancel_job(&self, id: JobId, by: &str) -> Result<Change> {
        let mut tx = forge_core::begin(&self.pool).await?;
        let Some((state, requested)) = self.state_of(&mut tx, id).await? else {
            return Ok(Change::NotFound);
        };
        let change = match JobActions::refusal(state, requested, JobAction::Cancel) {
            Some(reason) => Change::Refused(reason),
            None => match crate::jobs::cancel(&mut *tx, id).await? {
                CancelOutcome::Cancelled | CancelOutcome::Requested => Change::Applied,
                CancelOutcome::Finished(state) => Change::Refused(format!("the job is {state}")),
                CancelOutcome::NotFound => Change::NotFound,
            },
        };
        self.audit_one(tx, "cancel_job", id, by, &change).await?;
        Ok(change)
    }

    /// Deletes a job that is not running (cancel a running one first).
    pub async fn delete_job(&self, id: JobId, by: &str) -> Result<Change> {
        let mut tx = forge_core::begin(&self.pool).await?;
        let Some((state, requested)) = self.state_of(&mut tx, id).await? else {
            return Ok(Change::NotFound);
        };
        let change = if let Some(reason) = JobActions::refusal(state, requested, JobAction::Delete)
        {
            Change::Refused(reason)
        } else {
            sqlx::query("SELECT forge.jobs_delete($1, ARRAY[$2::bigint])")
                .bind(&self.namespace)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            Change::Applied
        };
        self.audit_one(tx, "delete_job", id, by, &change).await?;
        Ok(change)
    }

    /// [`Workload::retry_job`] for every job matching `filter` that is not running, in
    /// batches. Returns how many were made available.
    pub async fn retry_jobs(&self, filter: &JobFilter, by: &str) -> Result<u64> {
        self.bulk(filter, by, "retry_jobs", JobAction::Retry, |tx, ids| {
            Box::pin(async move {
                let done: Vec<i64> = sqlx::query_scalar("SELECT forge.jobs_retry_now($1, $2)")
                    .bind(tx.1)
                    .bind(ids)
                    .fetch_all(&mut *tx.0)
                    .await?;
                Ok(done.len() as u64)
            })
        })
        .await
    }

    /// [`Workload::cancel_job`] for every job matching `filter` that has not finished, in
    /// batches. Returns how many were cancelled or asked to stop.
    pub async fn cancel_jobs(&self, filter: &JobFilter, by: &str) -> Result<u64> {
        self.bulk(filter, by, "cancel_jobs", JobAction::Cancel, |tx, ids| {
            Box::pin(async move {
                let mut n = 0;
                for id in ids {
                    if matches!(
                        crate::jobs::cancel(&mut *tx.0, JobId(id)).await?,
                        CancelOutcome::Cancelled | CancelOutcome::Requested
                    ) {
                        n += 1;
                    }
                }
                Ok(n)
            })
        })
        .await
    }

    /// [`Workload::delete_job`] for every job matching `filter` that is not running, in
    /// batches. Returns how many were deleted.
    pub async fn delete_jobs(&self, filter: &JobFilter, by: &str) -> Result<u64> {
        self.bulk(filter, by, "delete_jobs", JobAction::Delete, |tx, ids| {
            Box::pin(async move {
                let done: i64 = sqlx::query_scalar("SELECT forge.jobs_delete($1, $2)")
                    .bind(tx.1)
                    .bind(ids)
                    .fetch_one(&mut *tx.0)
                    .await?;
                Ok(done as u64)
            })
        })
        .await
    }

    /// Pauses a queue: no node claims its jobs (running ones finish) until it is resumed.
    /// Returns whether it was paused already; `None` when the cluster knows no such queue (no
    /// node works it, it holds no unfinished or dead job, it is not paused: most likely a
    /// typo), unless `new` says to pre-pause a queue no node works yet.
    pub async fn pause_queue(&self, queue: &str, by: &str, new: bool) -> Result<Option<bool>> {
        self.set_queue_paused(queue, true, by, new).await
    }

    /// Resumes a paused queue; its workers claim at once. Returns whether it was paused;
    /// `None` when the cluster knows no such queue.
    pub async fn resume_queue(&self, queue: &str, by: &str) -> Result<Option<bool>> {
        self.set_queue_paused(queue, false, by, false).await
    }

    /// Sets the pause; `Some(whether it was paused)`, `None` for an unknown queue (unless
    /// `new`).
    async fn set_queue_paused(
        &self,
        queue: &str,
        paused: bool,
        by: &str,
        new: bool,
    ) -> Result<Option<bool>> {
        crate::jobs::validate_queue(queue)
            .map_err(|message| forge_core::Error::InvalidInput { message })?;
        let mut tx = forge_core::begin(&self.pool).await?;
        let (was, known): (bool, bool) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM forge.queues WHERE namespace = $1 AND queue = $2),
                    forge.queue_known($1, $2)",
        )
        .bind(&self.namespace)
        .bind(queue)
        .fetch_one(&mut *tx)
        .await?;
        if !known && !new {
            return Ok(None);
        }
        if was == paused {
            return Ok(Some(was));
        }
        sqlx::query("SELECT forge.queue_set_paused($1, $2, $3, $4)")
            .bind(&self.namespace)
            .bind(queue)
            .bind(paused)
            .bind(by)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(was))
    }

    /// A job's state and whether a cancel was requested, its row locked for the transaction;
    /// `None`: no such job here.
    async fn state_of(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        id: JobId,
    ) -> Result<Option<(JobState, bool)>> {
        Ok(sqlx::query_as(
            "SELECT state, cancel_requested FROM forge.jobs
              WHERE namespace = $1 AND id = $2 FOR UPDATE",
        )
        .bind(&self.namespace)
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?)
    }

    /// Records a one-job action in the audit trail (when it did something) and commits.
    async fn audit_one(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
        action: &str,
        id: JobId,
        by: &str,
        change: &Change,
    ) -> Result<()> {
        if *change == Change::Applied {
            audit(
                &mut *tx,
                &self.namespace,
                action,
                &id.to_string(),
                by,
                serde_json::json!({}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Applies `apply` to the jobs matching `filter` (and in `states`), a batch of ids per
    /// transaction, until none is left. Each batch records its own audit event (the filter,
    /// the batch's number and how many jobs it changed) in its transaction, so whatever a
    /// failure part-way leaves committed is in the audit trail, and nothing else is; an action
    /// that matches nothing records one event with a count of 0.
    async fn bulk<F>(
        &self,
        filter: &JobFilter,
        by: &str,
        action: &str,
        job_action: JobAction,
        apply: F,
    ) -> Result<u64>
    where
        F: for<'t> Fn(
            (&'t mut sqlx::PgConnection, &'t LockNamespace),
            Vec<i64>,
        ) -> futures_util::future::BoxFuture<'t, Result<u64>>,
    {
        let wanted: Vec<&str> = job_action
            .states()
            .into_iter()
            .filter(|s| filter.states.is_empty() || filter.states.contains(s))
            .map(|s| s.as_str())
            .collect();
        let shown_filter = serde_json::json!({
            "states": wanted,
            "queue": filter.queue,
            "kind": filter.kind,
            "args": filter.args,
        });
        let mut total = 0u64;
        let mut after = 0i64;
        for batch in 1u64.. {
            let mut tx = forge_core::begin(&self.pool).await?;
            let ids: Vec<i64> = sqlx::query_scalar(
                "SELECT id FROM forge.jobs
                  WHERE namespace = $1 AND state = ANY ($2)
                    AND ($3::text IS NULL OR queue = $3)
                    AND ($4::text IS NULL OR kind = $4)
                    AND ($5::jsonb IS NULL OR args @> $5)
                    AND id > $6
                  ORDER BY id LIMIT $7
                    FOR UPDATE SKIP LOCKED",
            )
            .bind(&self.namespace)
            .bind(&wanted)
            .bind(filter.queue.as_deref())
            .bind(filter.kind.as_deref())
            .bind(filter.args.as_ref())
            .bind(after)
            .bind(BULK_BATCH)
            .fetch_all(&mut *tx)
            .await?;
            let full = ids.len() as i64 == BULK_BATCH;
            let count = match ids.last() {
                Some(&last) => {
                    after = last;
                    apply((&mut *tx, &self.namespace), ids).await?
                }
                // Nothing (more) matches: the action is on record already, or records 0.
                None if batch > 1 => break,
                None => 0,
            };
            let detail = serde_json::json!({
                "count": count,
                "batch": batch,
                "filter": shown_filter,
            });
            audit(&mut *tx, &self.namespace, action, "jobs", by, detail).await?;
            tx.commit().await?;
            total += count;
            if !full {
                break;
            }
        }
        Ok(total)
    }

    /// Jobs matching `filter`, newest first (the cursor is the job id).
    pub async fn jobs(&self, filter: &JobFilter, page: PageRequest) -> Result<Page<JobInfo>> {
        let states: Vec<&str> = filter.states.iter().map(|s| s.as_str()).collect();
        let rows: Vec<JobRow> = sqlx::query_as(
            "SELECT *, args::text AS args_text FROM forge.jobs
              WHERE namespace = $1
                AND (cardinality($2::text[]) = 0 OR state = ANY ($2))
                AND ($3::text IS NULL OR queue = $3)
                AND ($4::text IS NULL OR kind = $4)
                AND ($5::jsonb IS NULL OR args @> $5)
                AND ($6::bigint IS NULL OR id < $6)
              ORDER BY id DESC LIMIT $7",
        )
        .bind(&self.namespace)
        .bind(&states)
        .bind(filter.queue.as_deref())
        .bind(filter.kind.as_deref())
        .bind(filter.args.as_ref())
        .bind(page.before)
        .bind(page.fetch())
        .fetch_all(&self.pool)
        .await?;
        let items = rows
            .into_iter()
            .map(JobInfo::try_from)
            .collect::<Result<Vec<_>>>()?;
        Ok(page.page(items, |j| j.id.0))
    }

    /// One job, with each failed, interrupted or rescued attempt's error, its output, its
    /// parents and its children.
    pub async fn job(&self, id: JobId) -> Result<Option<JobInfo>> {
        let row: Option<JobRow> = sqlx::query_as(JOB_SQL)
            .bind(id)
            .bind(&self.namespace)
            .fetch_optional(&self.pool)
            .await?;
        row.map(JobInfo::try_from).transpose()
    }

    /// Every queue with unfinished or dead jobs, or paused, by name.
    pub async fn queues(&self) -> Result<Vec<QueueView>> {
        /// A queue's count of jobs in a state; a paused queue's row has no state.
        #[derive(sqlx::FromRow)]
        struct QueueRow {
            queue: String,
            state: Option<JobState>,
            n: i64,
            oldest_age_s: Option<f64>,
        }
        let rows: Vec<QueueRow> = sqlx::query_as(
            "SELECT f.queue, f.state, f.n, f.oldest_age_s FROM forge.jobs_figures($1) f
             UNION ALL
             SELECT q.queue, NULL, 0, NULL FROM forge.queues q WHERE q.namespace = $1
             ORDER BY 1",
        )
        .bind(&self.namespace)
        .fetch_all(&self.pool)
        .await?;
        let mut queues: Vec<QueueView> = Vec::new();
        for row in rows {
            let QueueRow {
                queue,
                state,
                n,
                oldest_age_s: age,
            } = row;
            if queues.last().is_none_or(|q| q.queue != queue) {
                queues.push(QueueView {
                    queue,
                    ..QueueView::default()
                });
            }
            let Some(view) = queues.last_mut() else {
                continue;
            };
            let Some(state) = state else {
                view.paused = true;
                continue;
            };
            match state {
                JobState::Available => {
                    view.available += n;
                    view.oldest_available_age_s =
                        view.oldest_available_age_s.max(age.unwrap_or(0.0).max(0.0));
                }
                JobState::Scheduled => view.scheduled += n,
                JobState::Pending => view.pending += n,
                JobState::Running => view.running += n,
                JobState::Retryable => view.retryable += n,
                JobState::Dead => view.dead += n,
                JobState::Completed | JobState::Cancelled => {}
            }
        }
        self.add_limits(&mut queues).await?;
        Ok(queues)
    }

    /// Adds each queue's limits, what counts against them now, and why its jobs wait (a queue
    /// with limits and no jobs is listed too).
    async fn add_limits(&self, queues: &mut Vec<QueueView>) -> Result<()> {
        /// A queue's limits and their use.
        #[derive(sqlx::FromRow)]
        struct LimitRow {
            queue: String,
            global_concurrency: Option<i32>,
            rate_count: Option<i32>,
            rate_window_ms: Option<i64>,
            rate_key: Option<String>,
            set_by: Option<String>,
            limited_running: i64,
            rate_claims: i64,
            rate_full_until: Option<DateTime<Utc>>,
        }
        let rows: Vec<LimitRow> = sqlx::query_as(
            "SELECT l.queue, l.global_concurrency, l.rate_count, l.rate_window_ms, l.rate_key,
                    l.set_by,
                    (SELECT count(*) FROM forge.queue_slots s
                       JOIN forge.jobs j ON j.id = s.job_id AND j.attempt = s.attempt
                                        AND j.state = 'running'
                      WHERE s.namespace = l.namespace AND s.queue = l.queue) AS limited_running,
                    (SELECT count(*) FROM forge.queue_claims c
                      WHERE c.namespace = l.namespace AND c.queue = l.queue
                        AND c.claimed_at > clock_timestamp()
                                           - l.rate_window_ms * interval '1 millisecond') AS rate_claims,
                    (SELECT min(c.claimed_at) + l.rate_window_ms * interval '1 millisecond'
                       FROM (SELECT c.rate_key, c.claimed_at,
                                    count(*) OVER (PARTITION BY c.rate_key) AS n
                               FROM forge.queue_claims c
                              WHERE c.namespace = l.namespace AND c.queue = l.queue
                                AND c.claimed_at > clock_timestamp()
                                                   - l.rate_window_ms * interval '1 millisecond') c
                      WHERE c.n >= l.rate_count) AS rate_full_until
               FROM forge.queue_limits l WHERE l.namespace = $1 ORDER BY l.queue",
        )
        .bind(&self.namespace)
        .fetch_all(&self.pool)
        .await?;
        for row in rows {
            let at = match queues.binary_search_by(|q| q.queue.as_str().cmp(&row.queue)) {
                Ok(at) => at,
                Err(at) => {
                    queues.insert(
                        at,
                        QueueView {
                            queue: row.queue.clone(),
                            ..QueueView::default()
                        },
                    );
                    at
                }
            };
            let view = &mut queues[at];
            view.limits = QueueLimits::from_stored(
                row.global_concurrency,
                row.rate_count,
                row.rate_window_ms,
                row.rate_key,
            );
            view.limits_set_by = row.set_by;
            view.limited_running = row.limited_running;
            view.rate_claims = row.rate_claims;
            view.rate_limited_until = row.rate_full_until;
            view.waiting_on = waiting_on(view);
        }
        Ok(())
    }

    /// Sets a queue's cluster-wide limits as an operator (`by`, in the audit trail): every
    /// claim from the next on checks them, on every node, and a node's start leaves them alone
    /// (forge.toml's values apply again after [`Workload::reset_queue_limits`]). `None` when
    /// the cluster knows no such queue, unless `new`.
    pub async fn set_queue_limits(
        &self,
        queue: &str,
        limits: &QueueLimits,
        by: &str,
        new: bool,
    ) -> Result<Option<()>> {
        crate::jobs::validate_queue(queue)
            .map_err(|message| forge_core::Error::InvalidInput { message })?;
        if let Some((_, message)) = limits.problem() {
            return Err(forge_core::Error::InvalidInput { message });
        }
        let mut tx = forge_core::begin(&self.pool).await?;
        if !new && !self.queue_known(&mut tx, queue).await? {
            return Ok(None);
        }
        limits
            .write(
                &mut *tx,
                self.namespace.name(),
                crate::limits::Limited::Queue,
                queue,
                Some(by),
            )
            .await?;
        tx.commit().await?;
        Ok(Some(()))
    }

    /// Removes an operator's limits of a queue (in the audit trail): the queue is unlimited
    /// until a node starts and writes forge.toml's. Returns whether an operator had set them;
    /// `None` when the cluster knows no such queue.
    pub async fn reset_queue_limits(&self, queue: &str, by: &str) -> Result<Option<bool>> {
        crate::jobs::validate_queue(queue)
            .map_err(|message| forge_core::Error::InvalidInput { message })?;
        let mut tx = forge_core::begin(&self.pool).await?;
        let limited: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM forge.queue_limits WHERE namespace = $1 AND queue = $2)",
        )
        .bind(&self.namespace)
        .bind(queue)
        .fetch_one(&mut *tx)
        .await?;
        if !limited && !self.queue_known(&mut tx, queue).await? {
            return Ok(None);
        }
        let had: bool = sqlx::query_scalar("SELECT forge.queue_limit_reset($1, $2, $3)")
            .bind(&self.namespace)
            .bind(queue)
            .bind(by)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(had))
    }

    async fn queue_known(&self, tx: &mut sqlx::PgConnection, queue: &str) -> Result<bool> {
        Ok(sqlx::query_scalar("SELECT forge.queue_known($1, $2)")
            .bind(&self.namespace)
            .bind(queue)
            .fetch_one(tx)
            .await?)
    }
}

/// Why a queue's available jobs wait, when one of its limits holds them.
fn waiting_on(view: &QueueView) -> Option<String> {
    if let Some(limit) = view.limits.global_concurrency
        && view.limited_running >= i64::from(limit)
    {
        return Some(format!(
            "at global limit ({}/{limit} running)",
            view.limited_running
        ));
    }
    view.rate_limited_until.map(|until| {
        format!(
            "rate limited until {}",
            until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        )
    })
}

/// Jobs per bulk transaction.
const BULK_BATCH: i64 = 1000;

/// The crons with their newest tick and their last day's skipped ticks; `$1` namespace.
const CRONS_SQL: &str = "SELECT c.name, c.role, c.expression, c.timezone, c.paused_at,
        c.paused_by, c.trigger_requested_at, c.first_seen_at, c.last_seen_by, c.job_kind,
        c.job_args, c.options AS job_options, t.*,
        (SELECT count(*) FROM forge.cron_ticks s
          WHERE s.namespace = c.namespace AND s.cron = c.name AND s.state = 'skipped'
            AND s.scheduled_at > clock_timestamp() - interval '24 hours') AS skipped_24h,
        (SELECT count(*) FROM forge.cron_ticks s
          WHERE s.namespace = c.namespace AND s.cron = c.name AND NOT s.manual
            AND s.scheduled_at > clock_timestamp() - interval '24 hours') AS rows_24h
   FROM forge.crons c
   LEFT JOIN LATERAL (
        SELECT scheduled_at, state, attempt, node_id, epoch, claimed_at, started_at,
               finished_at, error, manual, duration_ms,
               CASE WHEN started_at IS NOT NULL
                    THEN greatest(extract(epoch FROM started_at - scheduled_at)::float8 * 1000, 0) END AS lag_ms
          FROM forge.cron_ticks x
         WHERE x.namespace = c.namespace AND x.cron = c.name
           AND x.scheduled_at <= clock_timestamp()
         ORDER BY x.scheduled_at DESC LIMIT 1) t ON true
  WHERE c.namespace = $1";

const TICKS_SQL: &str = "SELECT scheduled_at, state, attempt, node_id, epoch, claimed_at,
        started_at, finished_at, error, manual, duration_ms,
        CASE WHEN started_at IS NOT NULL
             THEN greatest(extract(epoch FROM started_at - scheduled_at)::float8 * 1000, 0) END AS lag_ms
   FROM forge.cron_ticks";

/// A row of [`CRONS_SQL`] but its newest tick ([`TickView`]'s columns, NULL when none).
#[derive(sqlx::FromRow)]
struct CronRow {
    name: String,
    role: String,
    expression: String,
    timezone: String,
    paused_at: Option<DateTime<Utc>>,
    paused_by: Option<String>,
    trigger_requested_at: Option<DateTime<Utc>>,
    first_seen_at: DateTime<Utc>,
    last_seen_by: String,
    job_kind: Option<String>,
    job_args: Option<serde_json::Value>,
    job_options: Option<serde_json::Value>,
    skipped_24h: i64,
    rows_24h: i64,
    /// The newest tick's instant: `None` when the cron has no tick yet.
    scheduled_at: Option<DateTime<Utc>>,
}

fn cron_from_row(row: &PgRow) -> Result<CronView> {
    let cron = CronRow::from_row(row)?;
    let last = match cron.scheduled_at {
        Some(_) => Some(TickView::from_row(row)?),
        None => None,
    };
    let now = Utc::now();
    let schedule = Schedule::parse_in(&cron.expression, &cron.timezone).ok();
    // Ticks due in the last day (since first registered) without a ledger row.
    let missing_24h = schedule.as_ref().map_or(0, |s| {
        let from = cron.first_seen_at.max(now - TimeDelta::hours(24));
        let due = s.ticks_between(from, now).take(1_000_000).count() as i64;
        (due - cron.rows_24h).max(0)
    });
    Ok(CronView {
        name: cron.name,
        role: cron.role,
        next_run: schedule.as_ref().and_then(|s| s.next_after(now)),
        expression: cron.expression,
        timezone: cron.timezone,
        paused_at: cron.paused_at,
        paused_by: cron.paused_by,
        trigger_requested_at: cron.trigger_requested_at,
        last,
        skipped_24h: cron.skipped_24h,
        missing_24h,
        last_seen_by: cron.last_seen_by,
        job_kind: cron.job_kind,
        job_args: cron.job_args,
        job_options: cron.job_options.as_ref().map(spec_options),
    })
}

/// A stored cron's `forge.crons.options` (durations in milliseconds) in the words of
/// [`StoredCronSpec`](crate::cron::StoredCronSpec) (human durations).
fn spec_options(stored: &serde_json::Value) -> serde_json::Value {
    let duration = |key: &str| {
        stored
            .get(key)
            .and_then(serde_json::Value::as_u64)
            .map(|ms| forge_rules::format_duration(std::time::Duration::from_millis(ms)))
    };
    serde_json::json!({
        "catch_up": stored.get("catch_up"),
        "catch_up_window": duration("catch_up_window_ms"),
        "overlap": stored.get("overlap"),
        "interrupted": stored.get("interrupted"),
        "timeout": duration("timeout_ms"),
    })
}

impl Serialize for TickState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}
