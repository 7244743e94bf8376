//! Enqueueing, cancelling and reading jobs: [`Jobs`], the one client (`node.jobs()`, or
//! `Jobs::new` in a process that only enqueues). Every `_in` method takes any sqlx executor -
//! a connection, or `&mut *tx` to enqueue inside the caller's transaction - and uses the
//! client's namespace, so a job enqueued anywhere runs on the cluster the client belongs to.

use std::time::Duration;

use chrono::{DateTime, Utc};
use forge_core::sql::Lenient;
use forge_core::{Error, LockNamespace, Metrics, Result};
use sqlx::{Executor, PgPool, Postgres};

use super::{
    Job, JobActions, JobId, JobState, ParentFailure, UniqueMode, Uniqueness, Workflow,
    validate_queue,
};
use crate::metrics::JOB_ENQUEUED;

/// A job to enqueue, with per-job options on top of its type's declared [`super::JobOptions`].
///
/// ```
/// use std::time::Duration;
/// use forge_scheduler::jobs::{Job, JobContext, JobError, NewJob};
///
/// # #[allow(non_camel_case_types)] struct send_email;
/// # impl Job for send_email {
/// #     type Args = String;
/// #     const KIND: &'static str = "send_email";
/// #     async fn run(&self, _: JobContext, _: String) -> Result<(), JobError> { Ok(()) }
/// # }
/// let job = NewJob::new(send_email, "a@example.com".to_owned())
///     .delay(Duration::from_secs(60))
///     .priority(-1)
///     .unique_key("welcome:a@example.com");
/// assert_eq!(job.kind(), "send_email");
/// ```
#[derive(Clone, Debug)]
pub struct NewJob {
    pub(crate) kind: &'static str,
    pub(crate) args: std::result::Result<serde_json::Value, String>,
    pub(crate) queue: String,
    pub(crate) role: Option<String>,
    pub(crate) priority: i16,
    pub(crate) run_at: Option<DateTime<Utc>>,
    pub(crate) delay: Option<Duration>,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) unique: bool,
    pub(crate) unique_key: Option<String>,
    pub(crate) uniqueness: Uniqueness,
    /// Jobs this one waits for ([`NewJob::after`]).
    pub(crate) after: Vec<JobId>,
    pub(crate) on_parent_failure: ParentFailure,
}

impl NewJob {
    /// A job of type `J` with these arguments and `J`'s declared options. An argument that
    /// cannot be serialized is reported when the job is enqueued.
    pub fn new<J: Job>(job: J, args: J::Args) -> NewJob {
        let args = serde_json::to_value(&args).map_err(|err| err.to_string());
        NewJob::declared(J::KIND, job.options(), args)
    }

    /// A job of `kind` with these arguments and the kind's declared `options`.
    pub(crate) fn declared(
        kind: &'static str,
        options: super::JobOptions,
        args: std::result::Result<serde_json::Value, String>,
    ) -> NewJob {
        NewJob {
            kind,
            args,
            queue: options.queue,
            role: options.role,
            priority: options.priority,
            run_at: None,
            delay: None,
            max_attempts: options.max_attempts,
            timeout: options.timeout,
            unique: options.unique,
            unique_key: None,
            uniqueness: options.uniqueness,
            after: Vec::new(),
            on_parent_failure: ParentFailure::default(),
        }
    }

    /// The job's kind.
    pub fn kind(&self) -> &str {
        self.kind
    }

    /// Puts the job in another queue than the declared one.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// Lower runs first.
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Runs the job no earlier than `at` (the database's clock decides). A time in the past
    /// means now.
    pub fn run_at(mut self, at: DateTime<Utc>) -> Self {
        self.run_at = Some(at);
        self.delay = None;
        self
    }

    /// Runs the job no earlier than `delay` after it is enqueued (measured by the database's
    /// clock).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self.run_at = None;
        self
    }

    /// Attempts before the job is dead-lettered (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Fails an attempt that runs longer.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// At most one unfinished (available, scheduled, running or retryable) job of this kind
    /// has this key: enqueueing another reports [`Enqueued::Duplicate`]. Without a key, a job
    /// type declared `unique` uses its arguments as the key.
    pub fn unique_key(mut self, key: impl Into<String>) -> Self {
        self.unique_key = Some(key.into());
        self
    }

    /// The key holds for `period` after the job holding it was enqueued, counting finished
    /// jobs (see [`JobOptions::unique_period`](super::JobOptions::unique_period)).
    pub fn unique_period(mut self, period: Duration) -> Self {
        self.uniqueness.period = Some(period);
        self
    }

    /// The states in which the job holding the key blocks this one (see
    /// [`JobOptions::unique_states`](super::JobOptions::unique_states)).
    pub fn unique_states(mut self, states: impl IntoIterator<Item = JobState>) -> Self {
        self.uniqueness.states = Some(states.into_iter().collect());
        self
    }

    /// What this job does if it is a duplicate (see [`UniqueMode`]).
    pub fn unique_mode(mut self, mode: UniqueMode) -> Self {
        self.uniqueness.mode = mode;
        self
    }

    /// `forge.jobs_enqueue`'s options of a unique job, checked.
    fn unique_opts(&self) -> Result<Option<serde_json::Value>> {
        let u = &self.uniqueness;
        if self.unique_key.is_none() && !self.unique {
            if *u != Uniqueness::default() {
                return Err(self.invalid(
                    "unique_period, unique_states and unique_mode apply to a unique job: give it \
                     a unique_key, or declare it unique = true (its arguments are the key)"
                        .into(),
                ));
            }
            return Ok(None);
        }
        if let Some(period) = u.period {
            if period.is_zero() {
                return Err(self.invalid("a unique_period must be longer than zero".into()));
            }
            forge_rules::check_duration(period).map_err(|message| self.invalid(message))?;
        }
        let states = u.states();
        if states.is_empty() {
            return Err(self.invalid(
                "unique_states is empty, so the key would block nothing: name the states of the \
                 holding job that block a duplicate, or leave the default"
                    .into(),
            ));
        }
        Ok(Some(serde_json::json!({
            "period_ms": u.period.map(|p| p.as_millis() as u64),
            "states": states.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            "mode": u.mode.as_str(),
        })))
    }

    /// Makes the job wait for these jobs (its parents): it is `pending`, claimed by no worker,
    /// until each has ended, then available (or scheduled, if its run-at is still ahead). Its
    /// handler reads their outputs with [`JobContext::parent_outputs`](super::JobContext::parent_outputs).
    /// A parent that completed counts as done, and so does one whose row is deleted after it
    /// completed (`[jobs] completed_retention`); a parent that ends dead or cancelled cancels
    /// the job unless [`NewJob::on_parent_failure`] says [`ParentFailure::Run`]. Each id must
    /// name a job of this cluster when the job is enqueued, else the enqueue fails (a job
    /// deleted by retention cannot be told from one that never existed). Adds to the ids of an
    /// earlier call. A unique job that collides with an existing one is not inserted and
    /// gains no parents.
    pub fn after(mut self, parents: impl IntoIterator<Item = JobId>) -> Self {
        self.after.extend(parents);
        self
    }

    /// What the job does when a parent ([`NewJob::after`]) ends dead or cancelled, or is
    /// deleted before it finished: [`ParentFailure::Cancel`] (the default) or
    /// [`ParentFailure::Run`].
    pub fn on_parent_failure(mut self, policy: ParentFailure) -> Self {
        self.on_parent_failure = policy;
        self
    }

    fn invalid(&self, message: String) -> Error {
        Error::InvalidInput {
            message: format!("job `{}`: {message}", self.kind),
        }
    }
}

/// What enqueueing did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Enqueued {
    /// The job was inserted with this id (it exists once the transaction commits).
    Inserted(JobId),
    /// A unique job: the job holding the same kind and key (this id) blocks it - unfinished, or
    /// within the key's period -; nothing was inserted.
    Duplicate(JobId),
    /// A unique job with [`UniqueMode::Replace`] or [`UniqueMode::KeepEarliestRunAt`]: the
    /// waiting job holding the key (this id) took its arguments and run-at; nothing was
    /// inserted.
    Replaced(JobId),
}

impl Enqueued {
    /// The inserted job's id, or the id of the job it duplicates.
    pub fn id(&self) -> JobId {
        match *self {
            Enqueued::Inserted(id) | Enqueued::Duplicate(id) | Enqueued::Replaced(id) => id,
        }
    }

    /// Whether nothing was inserted because of a unique key (a duplicate, kept or replaced).
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Enqueued::Duplicate(_) | Enqueued::Replaced(_))
    }
}

/// What [`Jobs::cancel`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The job was waiting (available, scheduled or retryable) and is now cancelled.
    Cancelled,
    /// The job is running: its node was asked to stop it, and records it as cancelled (unless
    /// the attempt completes first). If the node is dead, the rescue records it as cancelled.
    Requested,
    /// The job had already finished in this state.
    Finished(JobState),
    /// No job has this id (never existed, or pruned).
    NotFound,
}

/// One failed, interrupted or rescued attempt, from the job's `errors`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct AttemptError {
    /// The attempt's number.
    pub attempt: u32,
    /// When it was recorded (database clock).
    pub at: DateTime<Utc>,
    /// The node that ran the attempt, if any.
    #[serde(default)]
    pub node: Option<String>,
    /// `error`, `timeout`, `panic`, `discard`, `cancelled`, `released`, `rescued`,
    /// `undecodable`, `snoozed` or `too_many_snoozes` (text rather than an enum, so that a job written by a newer FORGE with
    /// a reason this one does not know still reads).
    pub reason: String,
    /// What happened.
    pub error: String,
}

/// A job as stored in `forge.jobs`. Serializes (for the admin API and the CLI's `--json`)
/// with `state` as its name and `timeout` as `timeout_ms`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct JobInfo {
    /// The id.
    pub id: JobId,
    /// The FORGE cluster it belongs to.
    pub namespace: String,
    /// The queue.
    pub queue: String,
    /// The kind ([`Job::KIND`]).
    pub kind: String,
    /// The arguments, as stored; when they cannot be decoded (JSON nested deeper than 128
    /// levels), their JSON text as a string.
    pub args: serde_json::Value,
    /// The state.
    #[serde(serialize_with = "state_name")]
    pub state: JobState,
    /// Lower runs first.
    pub priority: i16,
    /// When it is (or was) due.
    pub run_at: DateTime<Utc>,
    /// Attempts started so far (the running attempt's number while running).
    pub attempt: u32,
    /// Attempts allowed (`None`: `[jobs] default_max_attempts`).
    pub max_attempts: Option<u32>,
    /// Per-attempt timeout.
    #[serde(rename = "timeout_ms", serialize_with = "millis")]
    pub timeout: Option<Duration>,
    /// The role whose leader runs it, if any.
    pub role: Option<String>,
    /// The unique key, if any.
    pub unique_key: Option<String>,
    /// The node of the current or last attempt.
    pub node_id: Option<String>,
    /// When the current or last attempt started.
    pub attempted_at: Option<DateTime<Utc>>,
    /// When it finished (completed, dead, cancelled).
    pub finished_at: Option<DateTime<Utc>>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// A cancel was requested while it was running.
    pub cancel_requested: bool,
    /// Failed, interrupted, rescued and snoozed attempts, oldest first.
    pub errors: Vec<AttemptError>,
    /// How many times it snoozed ([`JobError::snooze`](super::JobError::snooze)): its
    /// `errors` with reason `snoozed`. Each gave its attempt back, so `max_attempts` is the
    /// declared number plus this one; the next snooze past the job type's `max_snoozes`
    /// dead-letters it.
    pub snoozes: u32,
    /// What an operator may do to it now ([`JobActions::of`] its state).
    pub actions: JobActions,
    /// What it stored with its completion ([`JobContext::set_output`](super::JobContext::set_output),
    /// or its handler's `Ok` value), if anything; when it cannot be decoded (JSON nested
    /// deeper than 128 levels), its JSON text as a string. Read by [`Jobs::get`] and the
    /// job's view, not by lists of jobs.
    pub output: Option<serde_json::Value>,
    /// The jobs it waits (or waited) for ([`NewJob::after`]), by id.
    pub parents: Vec<JobId>,
    /// Of its parents, how many have not ended yet (`None`: it has no parents).
    pub parents_left: Option<u32>,
    /// The jobs that wait (or waited) for it, by id. Read by [`Jobs::get`] and the job's
    /// view, not by lists of jobs.
    pub children: Vec<JobId>,
}

fn state_name<S: serde::Serializer>(
    state: &JobState,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(state.as_str())
}

fn millis<S: serde::Serializer>(
    timeout: &Option<Duration>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match timeout {
        Some(t) => s.serialize_some(&(t.as_millis().min(u128::from(u64::MAX)) as u64)),
        None => s.serialize_none(),
    }
}

/// A row of `SELECT *, args::text AS args_text FROM forge.jobs`: a [`JobInfo`] once its errors
/// are read.
#[derive(sqlx::FromRow)]
pub(crate) struct JobRow {
    id: JobId,
    namespace: String,
    queue: String,
    kind: String,
    /// Arguments that do not decode (JSON nested deeper than 128 levels) read as their text.
    args: Lenient<serde_json::Value>,
    args_text: String,
    state: JobState,
    priority: i16,
    run_at: DateTime<Utc>,
    attempt: i32,
    max_attempts: Option<i32>,
    timeout_ms: Option<i64>,
    role: Option<String>,
    unique_key: Option<String>,
    node_id: Option<String>,
    attempted_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    cancel_requested: bool,
    errors: serde_json::Value,
    /// Selected by the reads of one job only (`JOB_SQL`).
    #[sqlx(default)]
    output_text: Option<String>,
    #[sqlx(default)]
    parents: Option<Vec<i64>>,
    #[sqlx(default)]
    parents_left: Option<i32>,
    #[sqlx(default)]
    children: Option<Vec<i64>>,
}

/// One job with its output and children (`$1` the id; `$2` its namespace, or NULL for any),
/// as [`JobRow`] reads it.
pub(crate) const JOB_SQL: &str = "SELECT j.*, j.args::text AS args_text, j.output::text AS output_text,
        ARRAY(SELECT e.child_id FROM forge.job_edges e WHERE e.parent_id = j.id ORDER BY 1) AS children
   FROM forge.jobs j WHERE j.id = $1 AND ($2::text IS NULL OR j.namespace = $2)";

impl TryFrom<JobRow> for JobInfo {
    type Error = Error;

    fn try_from(row: JobRow) -> Result<JobInfo> {
        let errors: Vec<AttemptError> =
            serde_json::from_value(row.errors).map_err(|err| Error::Serialization {
                kind: row.kind.clone(),
                message: format!("the job's errors cannot be read: {err}"),
            })?;
        let snoozed = super::shared::AttemptReason::Snoozed.as_str();
        let snoozes = errors.iter().filter(|e| e.reason == snoozed).count() as u32;
        Ok(JobInfo {
            id: row.id,
            namespace: row.namespace,
            queue: row.queue,
            kind: row.kind,
            args: (row.args.ok()).unwrap_or(serde_json::Value::String(row.args_text)),
            state: row.state,
            priority: row.priority,
            run_at: row.run_at,
            attempt: row.attempt.max(0) as u32,
            max_attempts: row.max_attempts.map(|n| n.max(1) as u32),
            timeout: row
                .timeout_ms
                .map(|ms| Duration::from_millis(ms.max(0) as u64)),
            role: row.role,
            unique_key: row.unique_key,
            node_id: row.node_id,
            attempted_at: row.attempted_at,
            finished_at: row.finished_at,
            created_at: row.created_at,
            cancel_requested: row.cancel_requested,
            errors,
            snoozes,
            actions: JobActions::of(row.state, row.cancel_requested),
            output: row
                .output_text
                .map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))),
            parents: ids(row.parents),
            parents_left: row.parents_left.map(|n| n.max(0) as u32),
            children: ids(row.children),
        })
    }
}

fn ids(ids: Option<Vec<i64>>) -> Vec<JobId> {
    ids.unwrap_or_default().into_iter().map(JobId).collect()
}

forge_core::sql_enum! {
    /// What `forge.jobs_cancel` answers: one of these, followed by `:` and the job's state
    /// for `finished` and `moving`.
    pub(crate) enum CancelReply {
        /// The job was waiting and is cancelled.
        CancelledNow = "cancelled_now",
        /// The job is running: its node was asked to stop it.
        Requested = "requested",
        /// No such job.
        NotFound = "not_found",
        /// The job had already finished (`finished:<state>`).
        Finished = "finished",
        /// The job kept moving between waiting and running while the function looked
        /// (`moving:<state>`).
        Moving = "moving",
    }
}

/// Cancels a job (see [`CancelOutcome`]).
pub(crate) async fn cancel<'c, E>(executor: E, id: JobId) -> Result<CancelOutcome>
where
    E: Executor<'c, Database = Postgres>,
{
    let reply: String = sqlx::query_scalar("SELECT forge.jobs_cancel($1)")
        .bind(id)
        .fetch_one(executor)
        .await?;
    let (head, state) = match reply.split_once(':') {
        Some((head, state)) => (head, JobState::parse(state)),
        None => (reply.as_str(), None),
    };
    match (CancelReply::parse(head), state) {
        (Some(CancelReply::CancelledNow), None) => Ok(CancelOutcome::Cancelled),
        (Some(CancelReply::Requested), None) => Ok(CancelOutcome::Requested),
        (Some(CancelReply::NotFound), None) => Ok(CancelOutcome::NotFound),
        (Some(CancelReply::Finished), Some(state)) => Ok(CancelOutcome::Finished(state)),
        (Some(CancelReply::Moving), _) => Err(Error::Conflict {
            message: format!(
                "job {id} kept moving between waiting and running while it was cancelled \
                 ({reply}): cancel it again"
            ),
        }),
        _ => Err(unexpected(format!("forge.jobs_cancel answered {reply:?}"))),
    }
}

/// An answer of one of FORGE's SQL functions that this binary does not understand: the
/// database's FORGE schema and this binary do not match.
fn unexpected(what: String) -> Error {
    Error::Database(sqlx::Error::Protocol(format!(
        "{what}: the FORGE schema in this database does not match this binary; \
         compare `forge migrate status` with the version the nodes run"
    )))
}

/// Reads a job (`None` if there is no job with this id).
async fn get<'c, E>(executor: E, id: JobId) -> Result<Option<JobInfo>>
where
    E: Executor<'c, Database = Postgres>,
{
    let row: Option<JobRow> = sqlx::query_as(JOB_SQL)
        .bind(id)
        .bind(None::<&str>)
        .fetch_optional(executor)
        .await?;
    row.map(JobInfo::try_from).transpose()
}

/// The parallel arrays of one `forge.jobs_enqueue` call.
#[derive(Default)]
struct Batch {
    queues: Vec<String>,
    kinds: Vec<&'static str>,
    args: Vec<serde_json::Value>,
    priorities: Vec<i16>,
    run_at: Vec<Option<DateTime<Utc>>>,
    delays_ms: Vec<Option<i64>>,
    max_attempts: Vec<Option<i32>>,
    timeouts_ms: Vec<Option<i64>>,
    roles: Vec<Option<String>>,
    unique_keys: Vec<Option<String>>,
    unique: Vec<bool>,
    unique_opts: Vec<Option<serde_json::Value>>,
}

/// Inserts `jobs` into `namespace` with one statement.
async fn insert<'c, E>(
    executor: E,
    jobs: &[NewJob],
    namespace: &LockNamespace,
) -> Result<Vec<Enqueued>>
where
    E: Executor<'c, Database = Postgres>,
{
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let mut batch = Batch::default();
    for job in jobs {
        let args = job.args.clone().map_err(|message| Error::Serialization {
            kind: job.kind.to_owned(),
            message,
        })?;
        validate_queue(&job.queue).map_err(|message| job.invalid(message))?;
        if job.max_attempts == Some(0) {
            return Err(job.invalid("max_attempts must be at least 1".into()));
        }
        if job.timeout == Some(Duration::ZERO) {
            return Err(job.invalid("a timeout must be longer than zero".into()));
        }
        if let Some(delay) = job.delay.or(job.timeout) {
            forge_rules::check_duration(delay).map_err(|message| job.invalid(message))?;
        }
        batch.queues.push(job.queue.clone());
        batch.kinds.push(job.kind);
        batch.args.push(args);
        batch.priorities.push(job.priority);
        batch.run_at.push(job.run_at);
        batch.delays_ms.push(
            job.delay
                .map(|d| d.as_millis().min(i64::MAX as u128) as i64),
        );
        batch
            .max_attempts
            .push(job.max_attempts.map(|n| n.min(i32::MAX as u32) as i32));
        batch.timeouts_ms.push(
            job.timeout
                .map(|d| d.as_millis().clamp(1, i64::MAX as u128) as i64),
        );
        batch.roles.push(job.role.clone());
        batch.unique_keys.push(job.unique_key.clone());
        batch.unique.push(job.unique);
        batch.unique_opts.push(job.unique_opts()?);
    }
    /// One row of `forge.jobs_enqueue`: the job at position `ord` (from 1) of the batch.
    #[derive(sqlx::FromRow)]
    struct EnqueueRow {
        ord: i32,
        id: Option<i64>,
        inserted: bool,
        replaced: bool,
    }
    // Jobs with parents ($14 not NULL): forge.jobs_after, for each row the statement inserted.
    let waits = jobs.iter().any(|job| !job.after.is_empty());
    let rows: Vec<EnqueueRow> = sqlx::query_as(
        "SELECT ord, id, inserted, replaced, CASE WHEN $14::jsonb IS NOT NULL THEN forge.jobs_after(id, inserted, $14::jsonb -> (ord - 1), ($15::boolean[])[ord]) END FROM forge.jobs_enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
    )
    .bind(namespace)
    .bind(&batch.queues)
    .bind(&batch.kinds)
    .bind(&batch.args)
    .bind(&batch.priorities)
    .bind(&batch.run_at)
    .bind(&batch.delays_ms)
    .bind(&batch.max_attempts)
    .bind(&batch.timeouts_ms)
    .bind(&batch.roles)
    .bind(&batch.unique_keys)
    .bind(&batch.unique)
    .bind(&batch.unique_opts)
    .bind(waits.then(|| parents_json(jobs)))
    .bind(waits.then(|| run_anyway(jobs)))
    .fetch_all(executor)
    .await
    .map_err(no_such_parent)?;
    let mut results = vec![None; jobs.len()];
    for EnqueueRow {
        ord,
        id,
        inserted,
        replaced,
    } in rows
    {
        let Some(id) = id else {
            // The colliding job finished and was deleted between the insert and the lookup.
            return Err(Error::Conflict {
                message: "a unique job collided with a job that was deleted at the same moment: enqueue it again".into(),
            });
        };
        let slot = usize::try_from(ord - 1)
            .ok()
            .and_then(|i| results.get_mut(i))
            .ok_or_else(|| unexpected(format!("forge.jobs_enqueue answered the position {ord}")))?;
        *slot = Some(if inserted {
            Enqueued::Inserted(JobId(id))
        } else if replaced {
            Enqueued::Replaced(JobId(id))
        } else {
            Enqueued::Duplicate(JobId(id))
        });
    }
    results
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| unexpected("forge.jobs_enqueue answered fewer rows than jobs".into()))
}

/// The parents of each job, as one JSON array per job.
fn parents_json(jobs: &[NewJob]) -> serde_json::Value {
    jobs.iter()
        .map(|job| job.after.iter().map(|id| id.0).collect::<Vec<_>>().into())
        .collect::<Vec<serde_json::Value>>()
        .into()
}

fn run_anyway(jobs: &[NewJob]) -> Vec<bool> {
    jobs.iter()
        .map(|job| job.on_parent_failure == ParentFailure::Run)
        .collect()
}

/// `forge.jobs_after`'s refusal of a parent id that names no job (FG003), as bad input.
fn no_such_parent(err: sqlx::Error) -> Error {
    if let sqlx::Error::Database(db) = &err
        && db.code().as_deref() == Some("FG003")
    {
        let hint = db
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .and_then(|pg| pg.hint())
            .map(|hint| format!(": {hint}"))
            .unwrap_or_default();
        return Error::InvalidInput {
            message: format!("{}{hint}", db.message()),
        };
    }
    Error::Database(err)
}

/// Enqueues, reads and cancels jobs of one FORGE cluster (one `[cluster] lock_namespace`).
///
/// A node's client (`node.jobs()`) uses the node's pool and namespace and counts what it
/// inserts in `forge_job_enqueued_total`. A process that only enqueues (a web app without
/// workers) makes its own with [`Jobs::new`], naming the namespace the workers use.
///
/// Every method has an `_in` variant taking any executor, such as `&mut *tx`: the job then
/// exists only if that transaction commits.
#[derive(Clone, Debug)]
pub struct Jobs {
    pool: PgPool,
    namespace: LockNamespace,
    metrics: Option<Metrics>,
}

impl Jobs {
    /// A client on `pool` for the cluster `namespace` (`[cluster] lock_namespace` of the nodes
    /// that work the jobs; [`LockNamespace::default`] for `forge`), counting nothing.
    pub fn new(pool: PgPool, namespace: &LockNamespace) -> Jobs {
        Jobs {
            pool,
            namespace: namespace.clone(),
            metrics: None,
        }
    }

    /// A node's client.
    pub fn for_node(pool: PgPool, namespace: &LockNamespace, metrics: Metrics) -> Jobs {
        Jobs {
            pool,
            namespace: namespace.clone(),
            metrics: Some(metrics),
        }
    }

    /// The pool jobs are enqueued through.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The cluster the jobs are for.
    pub fn namespace(&self) -> &LockNamespace {
        &self.namespace
    }

    /// Enqueues a job with its declared options.
    pub async fn enqueue<J: Job>(&self, job: J, args: J::Args) -> Result<Enqueued> {
        self.enqueue_job(NewJob::new(job, args)).await
    }

    /// Enqueues a job with its declared options through `executor` (such as `&mut *tx`).
    pub async fn enqueue_in<'c, E, J>(&self, executor: E, job: J, args: J::Args) -> Result<Enqueued>
    where
        E: Executor<'c, Database = Postgres>,
        J: Job,
    {
        self.enqueue_job_in(executor, NewJob::new(job, args)).await
    }

    /// Enqueues a [`NewJob`] (per-job options).
    pub async fn enqueue_job(&self, job: NewJob) -> Result<Enqueued> {
        self.enqueue_job_in(&self.pool, job).await
    }

    /// Enqueues a [`NewJob`] through `executor` (such as `&mut *tx`).
    pub async fn enqueue_job_in<'c, E>(&self, executor: E, job: NewJob) -> Result<Enqueued>
    where
        E: Executor<'c, Database = Postgres>,
    {
        let mut results = self.enqueue_many_in(executor, [job]).await?;
        results
            .pop()
            .ok_or_else(|| unexpected("forge.jobs_enqueue answered no row".into()))
    }

    /// Enqueues many jobs in one statement; results in the same order. Jobs may be of
    /// different kinds and queues.
    pub async fn enqueue_many(
        &self,
        jobs: impl IntoIterator<Item = NewJob>,
    ) -> Result<Vec<Enqueued>> {
        self.enqueue_many_in(&self.pool, jobs).await
    }

    /// Enqueues many jobs through `executor` (such as `&mut *tx`), in one statement.
    pub async fn enqueue_many_in<'c, E>(
        &self,
        executor: E,
        jobs: impl IntoIterator<Item = NewJob>,
    ) -> Result<Vec<Enqueued>>
    where
        E: Executor<'c, Database = Postgres>,
    {
        let jobs: Vec<NewJob> = jobs.into_iter().collect();
        let results = insert(executor, &jobs, &self.namespace).await?;
        if let Some(metrics) = &self.metrics {
            for (job, result) in jobs.iter().zip(&results) {
                if !result.is_duplicate() {
                    metrics
                        .counter(&JOB_ENQUEUED, &[("queue", &job.queue), ("kind", job.kind)])
                        .increment(1);
                }
            }
        }
        Ok(results)
    }

    /// Enqueues a [`Workflow`] (a graph of named steps) through `conn`, such as `&mut *tx`:
    /// the whole graph exists only if that transaction commits. One statement per round of
    /// steps (a step waits only for earlier rounds). Returns each step's job id by name.
    pub async fn enqueue_workflow_in(
        &self,
        conn: &mut sqlx::PgConnection,
        workflow: Workflow,
    ) -> Result<std::collections::BTreeMap<String, JobId>> {
        super::flow::enqueue_workflow(self, conn, workflow).await
    }

    /// Enqueues a [`Workflow`] in a transaction of its own.
    pub async fn enqueue_workflow(
        &self,
        workflow: Workflow,
    ) -> Result<std::collections::BTreeMap<String, JobId>> {
        let mut tx = forge_core::begin(&self.pool).await?;
        let ids = self.enqueue_workflow_in(&mut tx, workflow).await?;
        tx.commit().await?;
        Ok(ids)
    }

    /// Cancels a job.
    pub async fn cancel(&self, id: JobId) -> Result<CancelOutcome> {
        cancel(&self.pool, id).await
    }

    /// Reads a job.
    pub async fn get(&self, id: JobId) -> Result<Option<JobInfo>> {
        get(&self.pool, id).await
    }
}

#[cfg(test)]
mod tests {
    use super::CancelReply;
    use crate::schema::source::{function, literals_after};

    #[test]
    fn every_answer_of_jobs_cancel_parses() {
        let sql = function("jobs_cancel");
        let answers = literals_after(sql, "RETURN '");
        for answer in &answers {
            let head = answer.strip_suffix(':').unwrap_or(answer);
            assert!(CancelReply::parse(head).is_some(), "{answer:?} in {sql}");
        }
        for reply in CancelReply::ALL {
            assert!(
                answers
                    .iter()
                    .any(|a| a.trim_end_matches(':') == reply.as_str()),
                "forge.jobs_cancel never answers {reply}"
            );
        }
    }
}
