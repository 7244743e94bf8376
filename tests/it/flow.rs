//! Job outputs and job dependencies: an output stored in the commit of its completion (also
//! under SIGKILLs), an output over `[jobs] max_output_bytes` refused; children that wait for
//! every parent, a parent's failure cancelling its child or not, concurrent completions of the
//! last two parents, and a fan-out/fan-in of 1,000 children on node processes that get
//! SIGKILLed: every child runs after its parent, the join once, after all of them.

use std::collections::BTreeMap;
use std::time::Duration;

use forge::jobs::{JobId, JobState, NewJob, ParentFailure, Workflow};
use forge::{Config, Node};
use forge_testkit::{NodeProcess, TestDatabase, wait_until};
use sqlx::PgPool;

use crate::jobs::{FLOW_TABLE_SQL, Step, StepOutput, flow_step, job_config, setup, wait_state};
use crate::support::*;

/// A fresh database with the `flow_runs` and `flow_gates` tables.
async fn flow_setup() -> (TestDatabase, PgPool) {
    let (db, pool) = setup().await;
    sqlx::raw_sql(FLOW_TABLE_SQL).execute(&pool).await.unwrap();
    (db, pool)
}

fn flow_config(url: &str, node: &str) -> Config {
    let mut config = job_config(url, node);
    config.node.queues = Some(vec!["flow".into()]);
    config
}

async fn start(config: Config) -> Node {
    Node::builder(config)
        .auto_register(false)
        .job(flow_step)
        .start()
        .await
        .expect("node starts")
}

fn step(tag: &str) -> Step {
    Step {
        tag: tag.into(),
        ..Step::default()
    }
}

fn gated(tag: &str, gate: &str) -> Step {
    Step {
        gate: Some(gate.into()),
        ..step(tag)
    }
}

async fn open_gate(pool: &PgPool, gate: &str) {
    sqlx::query("INSERT INTO flow_gates (name) VALUES ($1)")
        .bind(gate)
        .execute(pool)
        .await
        .unwrap();
}

fn output(tag: &str, parent_outputs: usize) -> serde_json::Value {
    serde_json::to_value(StepOutput {
        tag: tag.into(),
        parent_outputs,
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_value_is_stored_with_its_completion_and_an_oversized_one_fails_the_attempt() {
    let (db, pool) = flow_setup().await;
    let mut config = flow_config(db.url(), "n1");
    config.jobs.max_output_bytes = 1000;
    let node = start(config).await;
    let jobs = client(&pool);

    let id = jobs.enqueue(flow_step, step("a")).await.unwrap().id();
    let done = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(done.output, Some(output("a", 0)), "{done:?}");

    // Set inside the handler, committed with its effect by its own transaction's complete.
    let in_tx = Step {
        complete_in_tx: true,
        ..step("t")
    };
    let id = jobs.enqueue(flow_step, in_tx).await.unwrap().id();
    let done = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(done.output, Some(serde_json::json!({ "in_tx": "t" })));
    let effect: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM flow_gates WHERE name = 'effect:t')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(effect, "the effect committed with the completion");

    let big = Step {
        output_bytes: 2000,
        ..step("big")
    };
    let id = jobs
        .enqueue_job(NewJob::new(flow_step, big).max_attempts(1))
        .await
        .unwrap()
        .id();
    let dead = wait_state(&pool, id, JobState::Dead).await;
    assert_eq!(dead.output, None, "nothing truncated is stored: {dead:?}");
    let error = &dead.errors.last().expect("the attempt's error").error;
    assert!(
        error.contains("max_output_bytes = 1000") && error.contains("2002 bytes"),
        "the error says what is wrong: {error}"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_waits_for_every_parent_and_reads_their_outputs() {
    let (db, pool) = flow_setup().await;
    let node = start(flow_config(db.url(), "n1")).await;
    let jobs = client(&pool);

    let mut tx = pool.begin().await.unwrap();
    let ids = jobs
        .enqueue_workflow_in(
            &mut tx,
            Workflow::new()
                .step("a", NewJob::new(flow_step, step("a")))
                .step("b", NewJob::new(flow_step, gated("b", "b")))
                .step_after("c", NewJob::new(flow_step, step("c")), ["a", "b"]),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let (a, b, c) = (ids["a"], ids["b"], ids["c"]);

    wait_state(&pool, a, JobState::Completed).await;
    let child = jobs.get(c).await.unwrap().unwrap();
    assert_eq!(child.state, JobState::Pending, "{child:?}");
    assert_eq!(child.parents, vec![a, b]);
    assert_eq!(child.parents_left, Some(1));
    assert_eq!(jobs.get(a).await.unwrap().unwrap().children, vec![c]);
    assert!(
        runs(&pool, c).await.is_empty(),
        "the child ran before its parent b completed"
    );

    open_gate(&pool, "b").await;
    let child = wait_state(&pool, c, JobState::Completed).await;
    assert_eq!(child.output, Some(output("c", 2)), "it read both outputs");
    let b_done = jobs.get(b).await.unwrap().unwrap().finished_at.unwrap();
    let c_started = runs(&pool, c).await[0];
    assert!(
        c_started > b_done,
        "the child started at {c_started} before its parent finished at {b_done}"
    );

    // An id that names no job is refused, clearly.
    let err = jobs
        .enqueue_job(NewJob::new(flow_step, step("orphan")).after([JobId(987_654_321)]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("987654321") && err.contains("no such job"),
        "{err}"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_parent_cancels_its_children_in_cascade_or_lets_one_run_that_says_so() {
    let (db, pool) = flow_setup().await;
    let node = start(flow_config(db.url(), "n1")).await;
    let jobs = client(&pool);

    let failing = Step {
        discard: true,
        ..gated("p", "p")
    };
    let ids = jobs
        .enqueue_workflow(
            Workflow::new()
                .step("p", NewJob::new(flow_step, failing))
                .step_after("cancelled", NewJob::new(flow_step, step("c")), ["p"])
                .step_after(
                    "grandchild",
                    NewJob::new(flow_step, step("g")),
                    ["cancelled"],
                )
                .step_after(
                    "runs",
                    NewJob::new(flow_step, step("r")).on_parent_failure(ParentFailure::Run),
                    ["p"],
                ),
        )
        .await
        .unwrap();
    open_gate(&pool, "p").await;
    wait_state(&pool, ids["p"], JobState::Dead).await;
    let cancelled = wait_state(&pool, ids["cancelled"], JobState::Cancelled).await;
    let why = &cancelled.errors.last().unwrap().error;
    assert!(
        why.contains(&format!("parent job {} is dead", ids["p"])),
        "{why}"
    );
    wait_state(&pool, ids["grandchild"], JobState::Cancelled).await;
    let ran = wait_state(&pool, ids["runs"], JobState::Completed).await;
    assert_eq!(ran.output, Some(output("r", 0)));
    assert!(runs(&pool, ids["cancelled"]).await.is_empty());
    assert!(runs(&pool, ids["grandchild"]).await.is_empty());

    // A child enqueued after its parent is dead is cancelled at once.
    let late = jobs
        .enqueue_job(NewJob::new(flow_step, step("late")).after([ids["p"]]))
        .await
        .unwrap()
        .id();
    assert_eq!(
        jobs.get(late).await.unwrap().unwrap().state,
        JobState::Cancelled
    );
    node.shutdown().await;
}

/// The last two parents of a child end in two transactions at once: the second waits for the
/// child's row and counts after the first committed, so the child becomes available (once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_ends_of_the_last_two_parents_make_the_child_available() {
    let (_db, pool) = flow_setup().await;
    let jobs = client(&pool);
    for round in 0..20 {
        // No node works the queue: the test moves the jobs itself.
        let ids = jobs
            .enqueue_workflow(
                Workflow::new()
                    .step("p1", NewJob::new(flow_step, step("p1")).queue("idle"))
                    .step("p2", NewJob::new(flow_step, step("p2")).queue("idle"))
                    .step_after(
                        "c",
                        NewJob::new(flow_step, step("c")).queue("idle"),
                        ["p1", "p2"],
                    ),
            )
            .await
            .unwrap();
        let mut t1 = pool.begin().await.unwrap();
        let mut t2 = pool.begin().await.unwrap();
        end_parent(&mut t1, ids["p1"]).await;
        // The second waits for the child's row, which the first holds.
        let p2 = ids["p2"];
        let second = tokio::spawn(async move {
            end_parent(&mut t2, p2).await;
            t2.commit().await.unwrap();
        });
        if round % 2 == 0 {
            wait_until(
                "the second parent's end to wait for the child's row",
                SOON,
                Duration::from_millis(2),
                || async {
                    let waiting: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM pg_stat_activity
                          WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    )
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                    (waiting > 0).then_some(())
                },
            )
            .await
            .unwrap();
        }
        t1.commit().await.unwrap();
        second.await.unwrap();
        let child = jobs.get(ids["c"]).await.unwrap().unwrap();
        assert_eq!(
            (child.state, child.parents_left),
            (JobState::Available, Some(0)),
            "round {round}: {child:?}"
        );
    }
}

/// How a writer under test ends parent `p` (running attempt 1 on node `n`, with `q`, when it
/// is `running`).
enum End {
    /// A round trip recording these outcomes of `p` (and `q`), completed jobs kept or not.
    Step(&'static [&'static str], bool),
    /// One statement of SQL, `$1` the parent's id.
    Sql(String),
    /// An operator's UPDATE to `dead` an hour ago (not counted), then the prune.
    HandThenPrune,
}

struct Writer {
    name: &'static str,
    running: bool,
    end: End,
    /// Whether the parent counts as done (its children run) or failed (a child whose policy is
    /// `cancel` is cancelled).
    done: bool,
    /// Whether the parent's row is gone afterwards.
    deleted: bool,
}

/// A round trip of a worker that records outcomes and claims nothing (`p_limit` 0).
const STEP: &str = "SELECT count(*) FROM forge.jobs_step($1, 'n', 'idle', NULL, NULL, NULL, 0, 0,
    '{flow_step}', 0, 0, '{}', $2, $3, $4, $5, $6, 3, NULL, NULL, NULL, $7)";

/// The parent's namespace, for the SQL that asks for it.
const NAMESPACE: &str = "(SELECT namespace FROM forge.jobs WHERE id = $1)";

/// Every writer of FORGE that ends a job or deletes its row counts the end in the job's
/// children in its own transaction (`forge.jobs_parent_finished`; no trigger does it): each
/// path of a round trip (completions only, mixed outcomes; completed jobs kept or deleted), a
/// handler's own completion, a rescue into `dead`, a cancel, the admin API's delete, and the
/// prune of a parent whose end an operator wrote by hand. A child whose policy is `cancel` is
/// cancelled by a parent that did not complete, one whose policy is `run` runs; a deleted
/// parent's edges go with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_writer_that_ends_a_parent_counts_it_in_its_children() {
    let (_db, pool) = flow_setup().await;
    let jobs = client(&pool);
    let round_trip = |name, states, keep, done| Writer {
        name,
        running: true,
        end: End::Step(states, keep),
        done,
        deleted: done && !keep,
    };
    let complete = |keep| {
        format!("SELECT forge.jobs_complete($1, 1, 'n', {NAMESPACE}, NULL, NULL, NULL, {keep})")
    };
    let sql = |name, running, sql: String, done, deleted| Writer {
        name,
        running,
        end: End::Sql(sql),
        done,
        deleted,
    };
    let writers = [
        round_trip("round trip, completions, kept", &["completed"], true, true),
        round_trip("round trip, completions, deleted", &["completed"], false, true),
        round_trip("round trip, mixed, kept", &["completed", "dead"], true, true),
        round_trip("round trip, mixed, deleted", &["completed", "dead"], false, true),
        round_trip("round trip, dead", &["dead", "completed"], false, false),
        round_trip("round trip, cancelled", &["cancelled"], true, false),
        sql("handler's completion, kept", true, complete(true), true, false),
        sql("handler's completion, deleted", true, complete(false), true, true),
        sql(
            "rescue, out of attempts",
            true,
            "SELECT count(*) FROM forge.jobs_rescue(ARRAY[$1::bigint], '{1}', '{gone}', '{true}', 1, false)"
                .into(),
            false,
            false,
        ),
        sql("cancel", false, "SELECT forge.jobs_cancel($1)".into(), false, false),
        sql(
            "admin delete",
            false,
            format!("SELECT forge.jobs_delete({NAMESPACE}, ARRAY[$1::bigint])"),
            false,
            true,
        ),
        Writer {
            name: "prune of a parent ended by hand",
            running: false,
            end: End::HandThenPrune,
            done: false,
            deleted: true,
        },
    ];
    for writer in &writers {
        let name = writer.name;
        let ids = jobs
            .enqueue_workflow(
                Workflow::new()
                    .step("p", NewJob::new(flow_step, step("p")).queue("idle"))
                    .step("q", NewJob::new(flow_step, step("q")).queue("idle"))
                    .step_after("c", NewJob::new(flow_step, step("c")).queue("idle"), ["p"])
                    .step_after(
                        "r",
                        NewJob::new(flow_step, step("r"))
                            .queue("idle")
                            .on_parent_failure(ParentFailure::Run),
                        ["p"],
                    ),
            )
            .await
            .unwrap();
        let (p, q) = (ids["p"], ids["q"]);
        if writer.running {
            sqlx::query(
                "UPDATE forge.jobs SET state = 'running', phase = 'busy', attempt = 1,
                        node_id = 'n', max_attempts = 1, attempted_at = now(), started_at = now()
                  WHERE id = ANY ($1)",
            )
            .bind(vec![p.0, q.0])
            .execute(&pool)
            .await
            .unwrap();
        }
        match &writer.end {
            &End::Step(states, keep) => {
                let n = states.len();
                let namespace: String =
                    sqlx::query_scalar("SELECT namespace FROM forge.jobs WHERE id = $1")
                        .bind(p.0)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                let not_as_asked: i64 = sqlx::query_scalar(STEP)
                    .bind(namespace)
                    .bind([p.0, q.0][..n].to_vec())
                    .bind(vec![1_i32; n])
                    .bind(states.to_vec())
                    .bind(vec![None::<i64>; n])
                    .bind(vec![None::<serde_json::Value>; n])
                    .bind(keep)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert_eq!(not_as_asked, 0, "{name}: outcomes recorded as asked");
            }
            End::Sql(sql) => {
                sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
                    .bind(p.0)
                    .execute(&pool)
                    .await
                    .unwrap_or_else(|err| panic!("{name}: {err}"));
            }
            End::HandThenPrune => {
                sqlx::query(
                    "UPDATE forge.jobs SET state = 'dead', finished_at = now() - interval '1 hour'
                      WHERE id = $1",
                )
                .bind(p.0)
                .execute(&pool)
                .await
                .unwrap();
                let pruned: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT forge.jobs_prune({NAMESPACE}, '{{dead}}', 1800000, 100)"
                )))
                .bind(p.0)
                .fetch_one(&pool)
                .await
                .unwrap();
                assert_eq!(pruned, 1, "{name}");
            }
        }

        let parent = jobs.get(p).await.unwrap();
        assert_eq!(parent.is_none(), writer.deleted, "{name}: {parent:?}");
        let c = jobs.get(ids["c"]).await.unwrap().unwrap();
        let r = jobs.get(ids["r"]).await.unwrap().unwrap();
        let c_state = if writer.done {
            JobState::Available
        } else {
            JobState::Cancelled
        };
        assert_eq!(
            (c.state, c.parents_left, r.state, r.parents_left),
            (c_state, Some(0), JobState::Available, Some(0)),
            "{name}: {c:?} {r:?}"
        );
        let (open, all): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE NOT resolved), count(*) FROM forge.job_edges
              WHERE parent_id = $1",
        )
        .bind(p.0)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(open, 0, "{name}: every edge of the parent is counted");
        assert_eq!(all == 0, writer.deleted, "{name}: {all} edges left");
    }
}

/// Ends written by an operator's SQL (an UPDATE of the state, a DELETE), which no writer of
/// FORGE counts, are counted in the children by the scheduler leader's pass; a child whose row
/// another transaction holds is counted once the row is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ends_written_by_hand_are_counted_by_the_schedulers_pass() {
    let (db, pool) = flow_setup().await;
    let node = start(flow_config(db.url(), "n1")).await;
    let jobs = client(&pool);
    let mut holder = pool.begin().await.unwrap();
    let mut held = None;
    let mut children = Vec::new();
    for (by_hand, expected) in [
        (
            "UPDATE forge.jobs SET state = 'completed', finished_at = now() WHERE id = $1",
            JobState::Available,
        ),
        (
            "UPDATE forge.jobs SET state = 'cancelled', finished_at = now() WHERE id = $1",
            JobState::Cancelled,
        ),
        ("DELETE FROM forge.jobs WHERE id = $1", JobState::Cancelled),
    ] {
        let ids = jobs
            .enqueue_workflow(
                Workflow::new()
                    .step("p", NewJob::new(flow_step, step("p")).queue("idle"))
                    .step_after("c", NewJob::new(flow_step, step("c")).queue("idle"), ["p"]),
            )
            .await
            .unwrap();
        if held.is_none() {
            sqlx::query("SELECT 1 FROM forge.jobs WHERE id = $1 FOR UPDATE")
                .bind(ids["c"].0)
                .execute(&mut *holder)
                .await
                .unwrap();
            held = Some(ids["c"]);
        }
        sqlx::query(by_hand)
            .bind(ids["p"].0)
            .execute(&pool)
            .await
            .unwrap();
        children.push((ids["c"], expected, by_hand));
    }
    let held = jobs.get(held.unwrap()).await.unwrap().unwrap();
    assert_eq!(held.state, JobState::Pending, "its row is held: {held:?}");
    holder.rollback().await.unwrap();
    for (child, expected, by_hand) in children {
        let job = wait_state(&pool, child, expected).await;
        assert_eq!(job.parents_left, Some(0), "{by_hand}: {job:?}");
    }
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM forge.job_edges WHERE NOT resolved")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(open, 0, "every edge is counted");
    node.shutdown().await;
}

/// Completes a queued parent in `tx` the way FORGE's writers end a job: the row, then its
/// children's count (`forge.jobs_parent_finished`) in the same transaction.
async fn end_parent(tx: &mut sqlx::PgConnection, id: JobId) {
    sqlx::query("UPDATE forge.jobs SET state = 'completed', finished_at = now() WHERE id = $1")
        .bind(id.0)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT forge.jobs_parent_finished(ARRAY[$1::bigint], '{completed}', false)")
        .bind(id.0)
        .execute(&mut *tx)
        .await
        .unwrap();
}

/// The starts of a job's attempts (the database's clock), in order.
async fn runs(pool: &PgPool, id: JobId) -> Vec<chrono::DateTime<chrono::Utc>> {
    sqlx::query_scalar("SELECT started_at FROM flow_runs WHERE job_id = $1 ORDER BY attempt")
        .bind(id.0)
        .fetch_all(pool)
        .await
        .unwrap()
}

struct FlowNode {
    process: NodeProcess,
}

impl FlowNode {
    async fn start(config: &std::path::Path, id: &str) -> FlowNode {
        FlowNode {
            process: crate::jobs::process::spawn_job_node(config, id).await,
        }
    }
}

/// A root, 1,000 children of it and a join of all of them, on three node processes, two of
/// which are SIGKILLed (and restarted) while the children run: every child runs after the
/// root completed and completes once with its output, and the join runs once, after every
/// child completed, reading 1,000 outputs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_and_fan_in_of_1000_children_survives_sigkills() {
    const CHILDREN: usize = 1000;
    let (db, pool) = flow_setup().await;
    let dir = ScratchDir::new("flow");
    let path = dir.0.join("forge.toml");
    std::fs::write(
        &path,
        format!(
            "{}\n[node]\nroles = [\"scheduler\"]\n\n[jobs]\nmaintenance_interval = \"500ms\"\ndrain_timeout = \"2s\"\n",
            config_toml(db.url())
        ),
    )
    .unwrap();
    let mut nodes = BTreeMap::new();
    for id in ["f1", "f2", "f3"] {
        nodes.insert(id, FlowNode::start(&path, id).await);
    }

    let mut workflow = Workflow::new().step(
        "root",
        NewJob::new(
            flow_step,
            Step {
                sleep_ms: 200,
                ..step("root")
            },
        ),
    );
    let mut names = Vec::new();
    for i in 0..CHILDREN {
        let name = format!("child{i}");
        let work = Step {
            sleep_ms: 20 + (i % 7) as u64 * 10,
            ..step(&name)
        };
        workflow = workflow.step_after(&name, NewJob::new(flow_step, work), ["root"]);
        names.push(name);
    }
    workflow = workflow.step_after("join", NewJob::new(flow_step, step("join")), &names);
    let ids = client(&pool).enqueue_workflow(workflow).await.unwrap();

    // Kill two nodes, one after the other, while children run; restart each.
    for victim in ["f1", "f2"] {
        wait_until(
            &format!("{victim} to run children"),
            SOON * 3,
            Duration::from_millis(5),
            || async {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM forge.jobs WHERE node_id = $1 AND state = 'running'",
                )
                .bind(victim)
                .fetch_one(&pool)
                .await
                .unwrap();
                (n > 0).then_some(())
            },
        )
        .await
        .unwrap();
        nodes.get_mut(victim).unwrap().process.kill().unwrap();
        nodes.insert(victim, FlowNode::start(&path, victim).await);
    }

    let join = forge_testkit::wait_for(
        "the join to complete",
        Duration::from_secs(120),
        Duration::from_millis(50),
        || async {
            match client(&pool).get(ids["join"]).await {
                Ok(Some(job)) if job.state == JobState::Completed => Ok(job),
                Ok(job) => Err(format!("{:?}", job.map(|j| (j.state, j.parents_left)))),
                Err(err) => Err(err.to_string()),
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        join.output,
        Some(output("join", CHILDREN)),
        "the join read every child's output"
    );

    /// Per job: its state, attempt, output, finished_at, and its runs' starts.
    #[derive(sqlx::FromRow, Debug)]
    struct Seen {
        id: i64,
        state: JobState,
        has_output: bool,
        finished_at: Option<chrono::DateTime<chrono::Utc>>,
        starts: Vec<chrono::DateTime<chrono::Utc>>,
    }
    let seen: Vec<Seen> = sqlx::query_as(
        "SELECT j.id, j.state, j.output IS NOT NULL AS has_output, j.finished_at,
                ARRAY(SELECT r.started_at FROM flow_runs r WHERE r.job_id = j.id
                       ORDER BY r.attempt) AS starts
           FROM forge.jobs j WHERE j.queue = 'flow'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let by_id: BTreeMap<i64, &Seen> = seen.iter().map(|s| (s.id, s)).collect();
    let root = by_id[&ids["root"].0];
    let root_done = root.finished_at.unwrap();
    let join_row = by_id[&ids["join"].0];
    assert_eq!(
        join_row.starts.len(),
        1,
        "the join ran once: {:?}",
        join_row.starts
    );
    let mut reruns = 0;
    for name in &names {
        let child = by_id[&ids[name.as_str()].0];
        assert_eq!(child.state, JobState::Completed, "{child:?}");
        assert!(child.has_output, "completed without its output: {child:?}");
        assert!(
            child.starts.iter().all(|s| *s > root_done),
            "{name} ran before the root completed at {root_done}: {child:?}"
        );
        assert!(
            child.finished_at.unwrap() < join_row.starts[0],
            "the join started before {name} completed: {child:?}"
        );
        reruns += child.starts.len() - 1;
    }
    // Only attempts in flight on a killed node run again (16 at once per node).
    assert!(
        reruns <= 2 * 16 * 2,
        "{reruns} reruns: more than the attempts in flight on the killed nodes"
    );
    println!("fan-out of {CHILDREN}: {reruns} children ran again after SIGKILLs");
    drop(nodes);
}
