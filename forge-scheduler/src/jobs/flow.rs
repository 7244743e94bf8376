//! Job outputs and job dependencies: what a handler returns or sets ([`JobContext::set_output`]),
//! stored with the job's completion in one commit, and jobs that wait for others
//! ([`NewJob::after`](super::NewJob::after), [`Workflow`]).
//!
//! A job without an output completes exactly as before (the worker's round trip). A job with
//! one is completed in a transaction of its own when its handler returns - its output written
//! and `forge.jobs_complete` called in it, the guard of every completion - so the output and
//! the completion are one commit; the worker's later `completed` outcome then counts as
//! recorded. Readiness of waiting jobs is decided in SQL by `forge.jobs_parent_finished`, which
//! every writer that ends or deletes a job calls in the transaction that records the end (the
//! scheduler leader's pass calls it for ends that SQL outside FORGE wrote).

use std::collections::{BTreeMap, BTreeSet};

use forge_core::{Error, Result};
use sqlx::{PgConnection, Postgres, Transaction};
use tracing::warn;

use super::{JobContext, JobError, JobId, NewJob};

/// The output a handler set, waiting for its completion.
#[derive(Debug, Default)]
pub(crate) struct OutputSlot {
    /// The JSON text to store (`None`: no output).
    text: Option<String>,
    /// Why the output was refused (too large, or not serializable): the attempt fails.
    refused: Option<String>,
    /// A `complete` wrote the current text in its transaction.
    written: bool,
}

impl JobContext {
    /// Sets the job's output: stored with its completion, in the same commit - by
    /// [`JobContext::complete`] in the handler's transaction, or when the handler returns `Ok`
    /// (then in a transaction of its own). A handler's `Ok` value does the same. Readable with
    /// [`Jobs::get`](super::Jobs::get) ([`JobInfo::output`](super::JobInfo::output)), by the
    /// job's children ([`JobContext::parent_outputs`]), the admin API, `forge jobs show` and the
    /// dashboard. Setting it again replaces it; JSON `null` clears it.
    ///
    /// Fails when the value cannot be serialized, or when its JSON text is longer than
    /// `[jobs] max_output_bytes`; the attempt then fails too with that error (even if this
    /// error is ignored), and nothing is truncated. An output set after the handler's own
    /// transaction completed the job is not stored (a warning says so): set it before
    /// [`JobContext::complete`].
    pub fn set_output<T: serde::Serialize + ?Sized>(&self, value: &T) -> Result<()> {
        let mut slot = self.output.lock().unwrap_or_else(|e| e.into_inner());
        slot.written = false;
        let text = match serde_json::to_string(value) {
            Ok(text) => text,
            Err(err) => {
                let message = format!(
                    "job {} (`{}`): its output cannot be serialized: {err}",
                    self.id, self.kind
                );
                slot.refused = Some(message.clone());
                return Err(Error::Serialization {
                    kind: self.kind.to_owned(),
                    message,
                });
            }
        };
        if text.len() as u64 > self.max_output_bytes {
            let message = format!(
                "job {} (`{}`): its output is {} bytes of JSON, more than [jobs] max_output_bytes = {}: \
                 store large results elsewhere (a table, object storage) and output a reference to them",
                self.id,
                self.kind,
                text.len(),
                self.max_output_bytes
            );
            slot.refused = Some(message.clone());
            return Err(Error::InvalidInput { message });
        }
        slot.refused = None;
        slot.text = (text != "null").then_some(text);
        Ok(())
    }

    /// A handler's `Ok` value as its output: JSON `null` (such as `()`) is none, and keeps
    /// what [`JobContext::set_output`] set.
    pub(crate) fn set_returned_output<T: serde::Serialize>(
        &self,
        value: &T,
    ) -> std::result::Result<(), JobError> {
        if let Ok(serde_json::Value::Null) = serde_json::to_value(value) {
            return Ok(());
        }
        self.set_output(value)
            .map_err(|err| JobError::retry(err.to_string()))
    }

    /// Writes the output set so far into the job's row, in `tx`, before `complete` records
    /// the completion there (under the same guard: this attempt, this node, still running).
    pub(crate) async fn write_output(&self, tx: &mut Transaction<'_, Postgres>) -> Result<()> {
        let (text, refused) = {
            let slot = self.output.lock().unwrap_or_else(|e| e.into_inner());
            (slot.text.clone(), slot.refused.clone())
        };
        if let Some(message) = refused {
            return Err(Error::InvalidInput { message });
        }
        let Some(text) = text else {
            return Ok(());
        };
        sqlx::query(
            "UPDATE forge.jobs SET output = $4::jsonb
              WHERE id = $1 AND attempt = $2 AND node_id = $3 AND state = 'running'",
        )
        .bind(self.id)
        .bind(self.attempt as i32)
        .bind(&self.node_id)
        .bind(&text)
        .execute(&mut **tx)
        .await?;
        self.output
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .written = true;
        Ok(())
    }

    /// The outputs of this job's parents ([`NewJob::after`]) that stored one, by parent id. A
    /// parent whose row was deleted (by retention, or at once with `[jobs] completed_retention
    /// = "0s"`) has none here.
    pub async fn parent_outputs(&self) -> Result<BTreeMap<JobId, serde_json::Value>> {
        let rows: Vec<(JobId, String)> = sqlx::query_as(
            "SELECT p.id, p.output::text FROM forge.jobs c
              CROSS JOIN LATERAL unnest(c.parents) AS x(id)
              JOIN forge.jobs p ON p.id = x.id
             WHERE c.id = $1 AND p.output IS NOT NULL",
        )
        .bind(self.id)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(id, text)| {
                let value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
                Ok((id, value))
            })
            .collect()
    }
}

/// After a handler returned `Ok`: completes a job that has an output in a transaction of its
/// own, the output with it. `Ok` when there is nothing to store, when it committed, and when
/// the job no longer runs this attempt (completed by the handler's own transaction, or taken
/// away: the worker's outcome then finds out which); an error fails the attempt (an output
/// refused, or the transaction failed - if its commit landed after all, the failure is
/// refused by the guard, so the job is completed with its output either way).
pub(crate) async fn complete_with_output(
    output: &std::sync::Mutex<OutputSlot>,
    context: impl FnOnce() -> JobContext,
) -> std::result::Result<(), JobError> {
    {
        let slot = output.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(message) = &slot.refused {
            return Err(JobError::retry(message));
        }
        if slot.text.is_none() {
            return Ok(());
        }
    }
    let ctx = &context();
    let result = async {
        let mut tx = forge_core::begin(&ctx.pool).await?;
        ctx.complete(&mut tx).await?;
        tx.commit().await?;
        Ok::<(), Error>(())
    }
    .await;
    match result {
        Ok(()) => Ok(()),
        Err(Error::NotRunning { why, .. }) => {
            if !ctx.output.lock().unwrap_or_else(|e| e.into_inner()).written {
                warn!(target: "forge::job", job = ctx.kind, id = ctx.id.0, attempt = ctx.attempt,
                      "the job's output was not stored: the job no longer runs this attempt ({why}); \
                       an output set after the handler completed the job in its own transaction is \
                       not stored - set it before JobContext::complete");
            }
            Ok(())
        }
        Err(err) => Err(JobError::retry(format!(
            "the job's output could not be stored with its completion: {err}"
        ))),
    }
}

/// What a job does when one of its parents ends dead or cancelled (or its row is deleted
/// before it finished).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ParentFailure {
    /// Cancel the job (and, through it, its own waiting children that cancel too).
    #[default]
    Cancel,
    /// Count the parent as done: the job runs once every parent has ended, whichever way.
    Run,
}

/// A graph of jobs enqueued in one call ([`Jobs::enqueue_workflow_in`](super::Jobs::enqueue_workflow_in)):
/// named steps, each a [`NewJob`] that may wait for earlier steps. Every step is inserted in
/// the caller's transaction, so the whole graph exists or none of it.
///
/// ```
/// # use forge_scheduler::jobs::{Job, JobContext, JobError, NewJob, Workflow};
/// # #[allow(non_camel_case_types)] struct fetch;
/// # impl Job for fetch {
/// #     type Args = u32;
/// #     const KIND: &'static str = "fetch";
/// #     async fn run(&self, _: JobContext, _: u32) -> Result<(), JobError> { Ok(()) }
/// # }
/// let workflow = Workflow::new()
///     .step("a", NewJob::new(fetch, 1))
///     .step("b", NewJob::new(fetch, 2))
///     .step_after("join", NewJob::new(fetch, 0), ["a", "b"]);
/// assert_eq!(workflow.len(), 3);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Workflow {
    steps: Vec<Step>,
}

#[derive(Clone, Debug)]
struct Step {
    name: String,
    job: NewJob,
    after: Vec<String>,
}

impl Workflow {
    /// An empty workflow.
    pub fn new() -> Workflow {
        Workflow::default()
    }

    /// Adds a step that waits for no other step (it may still wait for jobs by id:
    /// [`NewJob::after`]).
    pub fn step(self, name: impl Into<String>, job: NewJob) -> Workflow {
        self.step_after(name, job, std::iter::empty::<String>())
    }

    /// Adds a step that waits for the named earlier steps.
    pub fn step_after<S: Into<String>>(
        mut self,
        name: impl Into<String>,
        job: NewJob,
        after: impl IntoIterator<Item = S>,
    ) -> Workflow {
        self.steps.push(Step {
            name: name.into(),
            job,
            after: after.into_iter().map(Into::into).collect(),
        });
        self
    }

    /// The number of steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether it has no step.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The steps in rounds: each round waits only for steps of earlier rounds (one enqueue
    /// statement per round). Refuses a step named twice, or one that waits for a step not
    /// added before it.
    fn rounds(self) -> Result<Vec<Vec<Step>>> {
        let mut round_of: BTreeMap<String, usize> = BTreeMap::new();
        let mut rounds: Vec<Vec<Step>> = Vec::new();
        for step in self.steps {
            if round_of.contains_key(&step.name) {
                return Err(invalid(format!(
                    "the step `{}` is added twice: give each step its own name",
                    step.name
                )));
            }
            let mut round = 0;
            for name in &step.after {
                let Some(&before) = round_of.get(name) else {
                    return Err(invalid(format!(
                        "the step `{}` waits for `{name}`, which is not a step added before it",
                        step.name
                    )));
                };
                round = round.max(before + 1);
            }
            round_of.insert(step.name.clone(), round);
            if rounds.len() <= round {
                rounds.resize_with(round + 1, Vec::new);
            }
            rounds[round].push(step);
        }
        Ok(rounds)
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidInput {
        message: format!("workflow: {message}"),
    }
}

/// Enqueues `workflow` on `conn` (the caller's transaction), round by round; returns each
/// step's job id by name (a unique step that collided: the job it collided with).
pub(super) async fn enqueue_workflow(
    jobs: &super::Jobs,
    conn: &mut PgConnection,
    workflow: Workflow,
) -> Result<BTreeMap<String, JobId>> {
    let mut ids: BTreeMap<String, JobId> = BTreeMap::new();
    for round in workflow.rounds()? {
        let mut names = Vec::with_capacity(round.len());
        let mut batch = Vec::with_capacity(round.len());
        for step in round {
            let parents: BTreeSet<JobId> = step.after.iter().map(|name| ids[name]).collect();
            batch.push(step.job.after(parents));
            names.push(step.name);
        }
        let enqueued = jobs.enqueue_many_in(&mut *conn, batch).await?;
        for (name, result) in names.into_iter().zip(enqueued) {
            ids.insert(name, result.id());
        }
    }
    Ok(ids)
}
