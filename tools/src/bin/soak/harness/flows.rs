//! Workflows among the faults: every few seconds the harness enqueues one (a root step, a
//! fan-out of children after it, a join after them, all `soak_flow_job`s), and the ledger
//! checks that no step started before each of its parents had completed, that no step's
//! completion (a join's effect) landed twice, and that every workflow finished.

use std::fmt::Write as _;
use std::time::Duration;

use forge::LockNamespace;
use forge::jobs::{Jobs, NewJob, Workflow};
use tokio::time::Instant;

use super::Harness;
use crate::node::{FlowArgs, soak_flow_job};
use crate::{ADMIN_TIMEOUT, BoxError, FLOW_JOB};

/// How often a workflow is enqueued while the faults go on.
const FLOW_EVERY: Duration = Duration::from_secs(6);
/// The children of each workflow's root; the join waits for all of them.
const CHILDREN: [&str; 3] = ["child-1", "child-2", "child-3"];

/// The workflows' figures, from their jobs and their steps' runs.
#[derive(sqlx::FromRow)]
struct FlowFigures {
    flows: i64,
    unfinished: i64,
    steps: i64,
    /// Steps whose end row (written with their completion) landed more than once.
    twice: i64,
    /// Those of them that are joins (several parents).
    joins_twice: i64,
    completed_without_end: i64,
}

impl Harness {
    /// Enqueues the next workflow when it is due (through the harness's own connection, as an
    /// application would); a failure (the database restarting) is counted, not retried.
    pub(super) async fn tend_flows(&mut self) {
        if Instant::now() < self.next_flow {
            return;
        }
        self.next_flow = Instant::now() + FLOW_EVERY;
        self.flows_tried += 1;
        let flow = i64::from(self.flows_tried);
        let step = || NewJob::new(soak_flow_job, FlowArgs { flow });
        let mut workflow = Workflow::new().step("root", step());
        for child in CHILDREN {
            workflow = workflow.step_after(child, step(), ["root"]);
        }
        workflow = workflow.step_after("join", step(), CHILDREN);
        let jobs = Jobs::new(self.admin.clone(), &LockNamespace::default());
        match tokio::time::timeout(ADMIN_TIMEOUT, jobs.enqueue_workflow(workflow)).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => self.flow_errors.push(err.to_string()),
            Err(_) => self.flow_errors.push("no answer within 5 s".to_owned()),
        }
    }

    /// The workflows' section of the report, and its targets.
    pub(super) async fn flow_report(
        &self,
        out: &mut String,
    ) -> Result<Vec<(bool, String)>, BoxError> {
        // A step's run started before a parent's end row (written in the parent's completing
        // transaction, so before the parent's completion committed) - or with a parent that
        // never completed.
        let (early, early_examples): (i64, Option<String>) = sqlx::query_as(
            "WITH e AS (
                 SELECT r.job_id, r.attempt, p.id AS parent FROM soak_runs r
                   JOIN forge.jobs j ON j.id = r.job_id
                  CROSS JOIN LATERAL unnest(j.parents) AS p(id)
                  WHERE r.what = 'flow'
                    AND NOT EXISTS (SELECT 1 FROM soak_runs pr
                                     WHERE pr.job_id = p.id AND pr.finished_at <= r.started_at))
             SELECT count(DISTINCT (job_id, attempt)),
                    string_agg(format('job %s attempt %s (parent %s)', job_id, attempt, parent),
                               '; ') FILTER (WHERE job_id IN (SELECT job_id FROM e LIMIT 5))
               FROM e",
        )
        .fetch_one(&self.admin)
        .await?;
        let FlowFigures {
            flows,
            unfinished,
            steps,
            twice,
            joins_twice,
            completed_without_end,
        } = sqlx::query_as(
            "WITH ends AS (
                 SELECT job_id, count(*) AS n FROM soak_runs
                  WHERE what = 'flow' AND finished_at IS NOT NULL GROUP BY job_id)
             SELECT count(DISTINCT j.args ->> 'flow') AS flows,
                    count(DISTINCT j.args ->> 'flow') FILTER (WHERE j.state <> 'completed')
                        AS unfinished,
                    count(*) AS steps,
                    count(*) FILTER (WHERE e.n > 1) AS twice,
                    count(*) FILTER (WHERE e.n > 1 AND cardinality(j.parents) > 1) AS joins_twice,
                    count(*) FILTER (WHERE j.state = 'completed' AND e.n IS NULL)
                        AS completed_without_end
               FROM forge.jobs j LEFT JOIN ends e ON e.job_id = j.id
              WHERE j.kind = $1",
        )
        .bind(FLOW_JOB)
        .fetch_one(&self.admin)
        .await?;
        let unfinished_states: Vec<(String, i64)> = sqlx::query_as(
            "SELECT state, count(*) FROM forge.jobs WHERE kind = $1 AND state <> 'completed'
              GROUP BY 1 ORDER BY 1",
        )
        .bind(FLOW_JOB)
        .fetch_all(&self.admin)
        .await?;
        let _ = writeln!(
            out,
            "\nworkflows (a root, {} children after it, a join after them; one every {} s):\n  {flows} workflows in the database ({} enqueued, {} enqueues failed{}), {steps} steps\n  steps that started before a parent completed   {early}{}\n  steps whose completion landed twice            {twice} ({joins_twice} of them joins)\n  steps completed without their end row          {completed_without_end}\n  workflows not finished after the drain         {unfinished}{}",
            CHILDREN.len(),
            FLOW_EVERY.as_secs(),
            self.flows_tried,
            self.flow_errors.len(),
            self.flow_errors
                .first()
                .map_or(String::new(), |e| format!(", the first: {e}")),
            early_examples.map_or(String::new(), |e| format!(": {e}")),
            if unfinished_states.is_empty() {
                String::new()
            } else {
                let states: Vec<String> = unfinished_states
                    .iter()
                    .map(|(s, n)| format!("{s} {n}"))
                    .collect();
                format!(" (steps: {})", states.join(", "))
            }
        );
        Ok(vec![
            (
                early == 0 && flows > 0,
                format!(
                    "0 workflow steps started before a parent completed: {early} ({flows} workflows)"
                ),
            ),
            (
                joins_twice == 0 && twice == 0 && completed_without_end == 0,
                format!(
                    "0 duplicate joins (a step's completion, its effect, landing twice): {joins_twice} joins twice, {twice} steps twice in all ({steps} steps); {completed_without_end} completed without it"
                ),
            ),
            (
                unfinished == 0 && flows > 0,
                format!("0 workflows unfinished after the drain: {unfinished} of {flows}"),
            ),
        ])
    }
}
