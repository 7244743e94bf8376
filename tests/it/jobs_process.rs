//! Job nodes as separate processes (`forge-job-node`) that really get SIGKILLed and SIGSTOPped
//! mid-job: their jobs are rescued and re-run, none is lost, none is completed twice.
//!
//! What "completed twice" means, precisely: `forge.jobs` records one completion per job (the
//! state `completed`, with the node and attempt that completed it), and a job whose attempt
//! was cut short by its node's death runs once more, as the next attempt, on a live node.
//! `job_runs` records every attempt that started (primary key (job, attempt)); the tests check
//! that the attempts of each job are exactly 1..=attempt, that only jobs in flight on the lost
//! node ran twice, and that a frozen node's late completion is refused.
//!
//! Also: a claim of a killed node that commits only after the node restarted strands nothing,
//! and a job whose handler aborts its process before its start was recorded ends dead instead
//! of killing nodes forever.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use forge::jobs::{JobId, JobState, NewJob};
use forge_testkit::{Filter, NodeProcess, PgProxy, PgServer, TestDatabase, wait_until};
use sqlx::PgPool;
use tokio::process::Command;

use super::{
    Behave, EFFECTS_TABLE_SQL, Effect, Poison, effect, plain, poison, setup, stall_commits,
    wait_for_job, wait_state,
};
use crate::support::*;

/// The election timings of `config_toml`, and short job timings.
fn job_config_toml(url: &str, maintenance: &str) -> String {
    format!(
        r#"{}
[node]
roles = ["scheduler"]

[jobs]
maintenance_interval = "{maintenance}"
drain_timeout = "2s"
"#,
        config_toml(url)
    )
}

struct JobNode {
    process: NodeProcess,
}

impl JobNode {
    async fn start(config: &std::path::Path, id: &str) -> JobNode {
        JobNode {
            process: spawn_job_node(config, id).await,
        }
    }
}

/// A `forge-job-node` process (tests/job_node.rs) with `config`, started and ready: the one way
/// the process tests of jobs start one.
pub(crate) async fn spawn_job_node(config: &std::path::Path, id: &str) -> NodeProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_forge-job-node"));
    command
        .arg(config)
        .env("FORGE_NODE_ID", id)
        .env_remove("DATABASE_URL")
        .env_remove("FORGE_ROLES")
        .env_remove("FORGE_METRICS_LISTEN");
    let mut process = NodeProcess::spawn(command).unwrap().named(id);
    process
        .wait_for_line("READY", SOON, |line| line.starts_with("FORGE-JOBS READY"))
        .await
        .unwrap();
    process
}

async fn write_config(
    db: &TestDatabase,
    dir: &ScratchDir,
    maintenance: &str,
) -> std::path::PathBuf {
    let path = dir.0.join("forge.toml");
    std::fs::write(&path, job_config_toml(db.url(), maintenance)).unwrap();
    path
}

async fn scheduler_leader(pool: &PgPool, node: &str) {
    wait_until(
        &format!("{node} to lead the scheduler"),
        SOON,
        Duration::from_millis(10),
        || async {
            let leaders = current_leaders(pool).await;
            (leaders.get("scheduler").map(|(n, _)| n.as_str()) == Some(node)).then_some(())
        },
    )
    .await
    .unwrap();
}

/// Jobs running on `node` whose handler has started.
async fn running_on(pool: &PgPool, node: &str) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT j.id FROM forge.jobs j JOIN job_runs r ON r.job_id = j.id AND r.attempt = j.attempt
          WHERE j.state = 'running' AND j.node_id = $1 AND r.finished_at IS NULL ORDER BY j.id",
    )
    .bind(node)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Enqueues a job that sleeps a minute on its first attempt, and waits until node n1 (the
/// only node) runs it.
async fn long_job_running_on_n1(pool: &PgPool, tag: &str) -> JobId {
    let long = Behave {
        sleep_ms: 60_000,
        sleep_attempts: 1,
        ..Behave::tag(tag)
    };
    let id = client(pool).enqueue(plain, long).await.unwrap().id();
    wait_until(
        "n1 to run the job",
        SOON,
        Duration::from_millis(5),
        || async { (running_on(pool, "n1").await == [id.0]).then_some(()) },
    )
    .await
    .unwrap();
    id
}

/// Waits until the sessions of a killed node are gone from the server: a round trip it sent
/// before it died still commits there, so what it held is known only after.
async fn sessions_gone(pool: &PgPool, node: &str) {
    wait_until(
        &format!("{node}'s sessions to end"),
        SOON,
        Duration::from_millis(5),
        || async {
            let left: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'forge:%:' || $1",
            )
            .bind(node)
            .fetch_one(pool)
            .await
            .unwrap();
            (left == 0).then_some(())
        },
    )
    .await
    .unwrap();
}

async fn wait_all_completed(pool: &PgPool, n: i64, within: Duration) {
    wait_until(
        &format!("all {n} jobs to complete"),
        within,
        Duration::from_millis(20),
        || async {
            let done: i64 =
                sqlx::query_scalar("SELECT count(*) FROM forge.jobs WHERE state = 'completed'")
                    .fetch_one(pool)
                    .await
                    .unwrap();
            (done == n).then_some(())
        },
    )
    .await
    .unwrap();
}

/// Per job: (attempt in forge.jobs, node that completed it, [(attempt, node, finished)] of
/// job_runs, reasons in errors).
async fn ledger(
    pool: &PgPool,
) -> BTreeMap<i64, (i32, String, Vec<(i32, String, bool)>, Vec<String>)> {
    let jobs: Vec<(i64, i32, String, String, serde_json::Value)> =
        sqlx::query_as("SELECT id, attempt, state, node_id, errors FROM forge.jobs ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    let runs: Vec<(i64, i32, String, bool)> = sqlx::query_as(
        "SELECT job_id, attempt, node, finished_at IS NOT NULL FROM job_runs ORDER BY job_id, attempt",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut out = BTreeMap::new();
    for (id, attempt, state, node, errors) in jobs {
        assert_eq!(state, "completed", "job {id} is {state}");
        let reasons = errors
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
            .collect();
        out.insert(id, (attempt, node, Vec::new(), reasons));
    }
    for (id, attempt, node, finished) in runs {
        out.get_mut(&id).unwrap().2.push((attempt, node, finished));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_worker_nodes_jobs_are_rescued_and_none_is_lost_or_completed_twice() {
    let (db, pool) = setup().await;
    let dir = ScratchDir::new("jobs-kill");
    let config = write_config(&db, &dir, "1s").await;
    // n1 starts first and leads the scheduler: killing it also kills the maintenance leader.
    let mut n1 = JobNode::start(&config, "n1").await;
    scheduler_leader(&pool, "n1").await;
    let n2 = JobNode::start(&config, "n2").await;

    let total = 400;
    let jobs = client(&pool);
    jobs.enqueue_many((0..total).map(|i| {
        NewJob::new(
            plain,
            Behave {
                sleep_ms: 40,
                ..Behave::tag(format!("{i}"))
            },
        )
    }))
    .await
    .unwrap();
    wait_until(
        "n1 to be mid-job",
        SOON,
        Duration::from_millis(2),
        || async { (running_on(&pool, "n1").await.len() >= 8).then_some(()) },
    )
    .await
    .unwrap();
    n1.process.kill().unwrap();
    n1.process.wait_exit(SOON).await.unwrap();
    // The jobs n1 was killed in the middle of: handler started, never finished. (Looking
    // before the kill would race with jobs finishing in between.)
    let in_flight: Vec<i64> = sqlx::query_scalar(
        "SELECT job_id FROM job_runs WHERE node = 'n1' AND finished_at IS NULL ORDER BY job_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!in_flight.is_empty(), "n1 was killed mid-job");

    // The survivor takes over the scheduler role, its membership watch sees n1's node session
    // ended and does not come back, its maintenance rescues n1's jobs, and they run again.
    wait_until(
        "n1's jobs to run again",
        SOON,
        Duration::from_millis(5),
        || async {
            let rerun: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM job_runs WHERE job_id = ANY($1) AND attempt = 2",
            )
            .bind(&in_flight)
            .fetch_one(&pool)
            .await
            .unwrap();
            (rerun == in_flight.len() as i64).then_some(())
        },
    )
    .await
    .unwrap();
    // Rescued because n1's node session ended (marked down after one heartbeat interval),
    // not because its heartbeat aged past down_after.
    let reasons: Vec<String> =
        sqlx::query_scalar("SELECT errors -> 0 ->> 'error' FROM forge.jobs WHERE id = ANY($1)")
            .bind(&in_flight)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(
        reasons.iter().all(|r| r.contains("its node session ended")),
        "{reasons:?}"
    );
    wait_all_completed(&pool, total, Duration::from_secs(60)).await;

    let ledger = ledger(&pool).await;
    assert_eq!(ledger.len(), total as usize, "no job lost");
    let mut ran_twice = Vec::new();
    for (id, (attempt, node, runs, reasons)) in &ledger {
        // job_runs' primary key already says no attempt started twice. An attempt may be
        // missing: n1 claimed the job but died before the handler's first statement.
        let numbers: Vec<i32> = runs.iter().map(|r| r.0).collect();
        assert_eq!(
            numbers.last(),
            Some(attempt),
            "job {id}: its last attempt ran"
        );
        assert!(*attempt <= 2, "job {id} ran {attempt} times");
        let last = runs.last().unwrap();
        assert_eq!(
            &last.1, node,
            "job {id} was completed by its last attempt's node"
        );
        assert!(last.2, "job {id}'s completing attempt finished its handler");
        if *attempt == 2 {
            ran_twice.push(*id);
            if runs.len() == 2 {
                assert_eq!(runs[0].1, "n1", "job {id}: only n1's jobs are rerun");
            }
            assert_eq!(node, "n2");
            assert_eq!(reasons, &["rescued"], "job {id}");
        } else {
            assert!(reasons.is_empty(), "job {id}: {reasons:?}");
        }
    }
    // Exactly the jobs n1 had claimed and not recorded as finished ran twice: those seen in
    // flight, and possibly others it claimed or finished (outcome not yet recorded) between
    // that look and the kill - at most its 16 slots plus 16 buffered outcomes (40 ms jobs take
    // longer than a round trip, so the worker claims nothing ahead).
    for id in &in_flight {
        assert!(
            ran_twice.contains(id),
            "job {id} was in flight on n1 but not rerun"
        );
    }
    assert!(ran_twice.len() <= 32, "{ran_twice:?}");
    drop(n2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_nodes_jobs_are_rescued_after_down_after_and_its_late_completions_are_refused() {
    let (db, pool) = setup().await;
    let dir = ScratchDir::new("jobs-freeze");
    let config = write_config(&db, &dir, "1s").await;
    let n1 = JobNode::start(&config, "n1").await;
    scheduler_leader(&pool, "n1").await;

    let jobs = client(&pool);
    let ids: Vec<i64> = jobs
        .enqueue_many((0..4).map(|i| {
            NewJob::new(
                plain,
                Behave {
                    sleep_ms: 1500,
                    sleep_on_node: Some("n1".into()),
                    ..Behave::tag(format!("{i}"))
                },
            )
        }))
        .await
        .unwrap()
        .iter()
        .map(|r| r.id().0)
        .collect();
    wait_until(
        "n1 to run all four",
        SOON,
        Duration::from_millis(5),
        || async { (running_on(&pool, "n1").await.len() == 4).then_some(()) },
    )
    .await
    .unwrap();
    n1.process.pause().unwrap();
    let mut n2 = JobNode::start(&config, "n2").await;
    // n1's sessions stay open: only its silence (down_after = 3 s) gives it away.
    for id in &ids {
        let job = wait_state(&pool, JobId(*id), JobState::Completed).await;
        assert_eq!(job.node_id.as_deref(), Some("n2"));
        assert_eq!(job.attempt, 2);
        assert_eq!(job.errors.len(), 1);
        assert_eq!(job.errors[0].reason, "rescued");
        assert!(
            job.errors[0].error.contains("no heartbeat for"),
            "{:?}",
            job.errors
        );
    }

    // n1 wakes up. Its handlers' sleeps are over and it learns its jobs were taken, both at
    // once, so each late attempt ends one of two ways: the handler finishes first and its
    // outcome is refused (the job is no longer this attempt's), or the node stops the attempt
    // first. Either way the job stays n2's.
    n1.process.resume().unwrap();
    let mut n1 = n1;
    let mut refused = BTreeSet::new();
    let mut stopped = BTreeSet::new();
    while refused.union(&stopped).count() < ids.len() {
        let line = n1
            .process
            .wait_for_line("each late attempt refused or stopped", SOON, |line| {
                line.contains("outcome not recorded") || line.contains("taken away from this node")
            })
            .await
            .unwrap();
        let id = ids
            .iter()
            .copied()
            .find(|id| line.split_whitespace().any(|t| t == format!("id={id}")))
            .unwrap_or_else(|| panic!("a line about none of {ids:?}: {line}"));
        if line.contains("outcome not recorded") {
            refused.insert(id);
        } else {
            stopped.insert(id);
        }
    }
    let ledger = ledger(&pool).await;
    for id in &ids {
        let (attempt, node, runs, _) = &ledger[id];
        assert_eq!(
            (*attempt, node.as_str()),
            (2, "n2"),
            "job {id} is still n2's"
        );
        assert_eq!(runs.len(), 2, "job {id}: {runs:?}");
        assert_eq!(
            (runs[0].0, runs[0].1.as_str()),
            (1, "n1"),
            "job {id}: {runs:?}"
        );
        assert_eq!(runs[1], (2, "n2".to_owned(), true), "job {id}: {runs:?}");
        if refused.contains(id) {
            assert!(
                runs[0].2,
                "job {id}: n1's outcome was refused, so its handler ran to the end: {runs:?}"
            );
        }
    }
    n2.process.terminate().unwrap();
    n2.process.wait_exit(SOON).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_rescues_what_its_previous_run_left_running() {
    let (db, pool) = setup().await;
    let dir = ScratchDir::new("jobs-restart");
    // A maintenance pass far away: only the restarted node itself can rescue in time.
    let config = write_config(&db, &dir, "1h").await;
    let mut n1 = JobNode::start(&config, "n1").await;
    let id = long_job_running_on_n1(&pool, "long").await;
    n1.process.kill().unwrap();
    n1.process.wait_exit(SOON).await.unwrap();
    let config2 = dir.0.join("forge-2.toml");
    std::fs::write(
        &config2,
        job_config_toml(db.url(), "1h").replace("\"scheduler\"", ""),
    )
    .unwrap();
    let _n1 = JobNode::start(&config2, "n1").await;
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(job.attempt, 2);
    assert_eq!(job.errors[0].reason, "rescued");
    assert!(
        job.errors[0].error.contains("restarted"),
        "{:?}",
        job.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_while_draining_a_backlog_of_short_jobs_loses_none() {
    let (db, pool) = setup().await;
    let dir = ScratchDir::new("jobs-kill-backlog");
    let config = write_config(&db, &dir, "1s").await;
    // A backlog of jobs much shorter than a round trip: n1 claims ahead of its slots.
    let total = 3000;
    client(&pool)
        .enqueue_many((0..total).map(|i| NewJob::new(plain, Behave::tag(format!("{i}")))))
        .await
        .unwrap();
    let mut n1 = JobNode::start(&config, "n1").await;
    wait_until(
        "n1 to be half-way",
        SOON,
        Duration::from_millis(1),
        || async {
            let done: i64 =
                sqlx::query_scalar("SELECT count(*) FROM forge.jobs WHERE state = 'completed'")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            (done >= total / 3).then_some(())
        },
    )
    .await
    .unwrap();
    n1.process.kill().unwrap();
    n1.process.wait_exit(SOON).await.unwrap();
    sessions_gone(&pool, "n1").await;
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.jobs WHERE state = 'running' AND node_id = 'n1'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let _n2 = JobNode::start(&config, "n2").await;
    wait_all_completed(&pool, total, Duration::from_secs(60)).await;

    let ledger = ledger(&pool).await;
    assert_eq!(ledger.len(), total as usize, "no job lost");
    let mut rescued = 0;
    for (id, (attempt, node, runs, reasons)) in &ledger {
        let numbers: Vec<i32> = runs.iter().map(|r| r.0).collect();
        assert_eq!(
            numbers.last(),
            Some(attempt),
            "job {id}: its last attempt ran"
        );
        assert!(*attempt <= 2, "job {id} ran {attempt} times");
        assert_eq!(&runs.last().unwrap().1, node, "job {id}");
        if *attempt == 2 {
            rescued += 1;
            assert_eq!(node, "n2", "job {id}");
            assert_eq!(reasons, &["rescued"], "job {id}");
        }
    }
    // What n1 held when it died (running or claimed ahead) is what was rescued.
    assert_eq!(rescued, held, "rescued jobs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_completed_in_its_transaction_never_runs_again_after_its_node_is_killed() {
    let (db, pool) = setup().await;
    sqlx::raw_sql(EFFECTS_TABLE_SQL)
        .execute(&pool)
        .await
        .unwrap();
    let dir = ScratchDir::new("jobs-txn");
    let config = write_config(&db, &dir, "1s").await;
    let mut n1 = JobNode::start(&config, "n1").await;
    scheduler_leader(&pool, "n1").await;
    // Both jobs commit their effect and then hang on attempt 1; one completed itself in that
    // commit, the other did not.
    let jobs = client(&pool);
    let hang = |transactional, tag: &str| Effect {
        transactional,
        hang_ms: 600_000,
        tag: tag.into(),
        ..Effect::default()
    };
    let done = jobs.enqueue(effect, hang(true, "txn")).await.unwrap().id();
    let untied = jobs
        .enqueue(effect, hang(false, "plain"))
        .await
        .unwrap()
        .id();
    wait_until(
        "both effects on n1",
        SOON,
        Duration::from_millis(10),
        || async {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM job_effects WHERE node = 'n1'")
                .fetch_one(&pool)
                .await
                .unwrap();
            (n == 2).then_some(())
        },
    )
    .await
    .unwrap();
    let _n2 = JobNode::start(&config, "n2").await;
    n1.process.kill().unwrap();
    n1.process.wait_exit(SOON).await.unwrap();

    // n2 leads, marks n1 down, rescues its running jobs: only the plain one was running.
    let rerun = wait_state(&pool, untied, JobState::Completed).await;
    assert_eq!(rerun.attempt, 2, "{rerun:?}");
    let effects = |id: JobId| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM job_effects WHERE job_id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        effects(untied).await,
        2,
        "at least once outside the job's transaction"
    );
    let job = client(&pool).get(done).await.unwrap().unwrap();
    assert_eq!(
        (job.state, job.attempt),
        (JobState::Completed, 1),
        "{job:?}"
    );
    assert!(job.errors.is_empty(), "{:?}", job.errors);
    assert_eq!(
        effects(done).await,
        1,
        "exactly once in the job's transaction"
    );
}

/// The same kill with `[jobs] completed_retention = "0s"`: completed jobs are deleted, so
/// `job_runs` is the only ledger. Every job's handler ran to its end (none lost), at most twice,
/// and exactly the jobs n1 held when it died ran a second attempt, on n2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_completed_jobs_deleted_a_node_killed_mid_backlog_loses_none() {
    let (db, pool) = setup().await;
    let dir = ScratchDir::new("jobs-kill-deleted");
    let config = dir.0.join("forge.toml");
    std::fs::write(
        &config,
        job_config_toml(db.url(), "1s") + "completed_retention = \"0s\"\n",
    )
    .unwrap();
    let total = 3000;
    let left = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM forge.jobs")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let mut ids: Vec<i64> = client(&pool)
        .enqueue_many((0..total).map(|i| NewJob::new(plain, Behave::tag(format!("{i}")))))
        .await
        .unwrap()
        .iter()
        .map(|r| r.id().0)
        .collect();
    ids.sort();
    let mut n1 = JobNode::start(&config, "n1").await;
    wait_until(
        "n1 to be a third of the way",
        SOON,
        Duration::from_millis(1),
        || async { (left(pool.clone()).await <= total - total / 3).then_some(()) },
    )
    .await
    .unwrap();
    n1.process.kill().unwrap();
    n1.process.wait_exit(SOON).await.unwrap();
    sessions_gone(&pool, "n1").await;
    let held: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM forge.jobs WHERE state = 'running' AND node_id = 'n1' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!held.is_empty(), "n1 died holding jobs");
    let _n2 = JobNode::start(&config, "n2").await;
    wait_until(
        "every job to be completed and deleted",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || async { (left(pool.clone()).await == 0).then_some(()) },
    )
    .await
    .unwrap();

    let runs: Vec<(i64, i32, String, bool)> = sqlx::query_as(
        "SELECT job_id, attempt, node, finished_at IS NOT NULL FROM job_runs ORDER BY job_id, attempt",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut last: BTreeMap<i64, (i32, String, bool)> = BTreeMap::new();
    for (id, attempt, node, finished) in runs {
        last.insert(id, (attempt, node, finished));
    }
    assert_eq!(
        last.keys().copied().collect::<Vec<_>>(),
        ids,
        "every job ran"
    );
    let mut rerun = Vec::new();
    for (id, (attempt, node, finished)) in &last {
        assert!(finished, "job {id}: its last attempt finished its handler");
        assert!(*attempt <= 2, "job {id} ran {attempt} times");
        if *attempt == 2 {
            assert_eq!(node, "n2", "job {id}");
            rerun.push(*id);
        }
    }
    assert_eq!(rerun, held, "what n1 held when it died is what ran again");
}

/// A node killed while its claim's commit waits (as for a stalled synchronous standby: a pool
/// session does not notice its client died) and restarted with the same id: the claim must
/// not commit after the new process looked for its predecessor's jobs and strand its job on a
/// live node that does not know it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_a_killed_node_that_would_commit_after_its_restart_strands_nothing() {
    let (db, pool) = setup().await;
    let dir = ScratchDir::new("jobs-late-claim");
    // A maintenance pass far away: nothing but the node itself looks at its jobs.
    let config = write_config(&db, &dir, "1h").await;
    let mut n1 = JobNode::start(&config, "n1").await;
    let jobs = client(&pool);
    // A job n1 runs when it is killed: the new process rescues it, which shows it has looked.
    let running = long_job_running_on_n1(&pool, "running").await;
    let stall = stall_commits(db.url(), "stalled").await;
    let id = jobs
        .enqueue(plain, Behave::tag("stalled"))
        .await
        .unwrap()
        .id();
    stall.wait_until_waiting(&pool, "forge:pool:n1").await;
    n1.process.kill().unwrap();
    n1.process.wait_exit(SOON).await.unwrap();

    let _n1 = JobNode::start(&config, "n1").await;
    wait_for_job(
        &pool,
        running,
        "the restarted node to rescue its job",
        |job| job.errors.iter().any(|e| e.reason == "rescued"),
    )
    .await;
    // Whatever waits for the stall now commits.
    stall.release().await;
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(job.node_id.as_deref(), Some("n1"));
    assert_eq!(
        (job.attempt, job.errors.len()),
        (1, 0),
        "the late claim took nothing: {job:?}"
    );
}

/// A job whose handler aborts its node's process (as a stack overflow or an out-of-memory
/// kill would) after it was claimed ahead, before the mark of its start landed: each rescue
/// looks like one of an attempt that never started. Up to three such rescues do not count;
/// then they do, and the job ends dead after max_attempts of them, saying why, instead of
/// killing its node again and again.
///
/// Each round the node warms up on no-op jobs (so it claims ahead of its one slot), then runs a
/// job that holds the slot while the poison waits behind it, claimed ahead; from then on what
/// its pool sends reaches the server too late (the proxy holds it, then drops it when the node
/// is dead): the mark of the poison's start never arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_kills_its_node_before_its_start_is_recorded_ends_dead() {
    let (db, pool) = setup().await;
    let server = PgServer::shared().unwrap();
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let dir = ScratchDir::new("jobs-poison");
    let config = dir.0.join("forge.toml");
    std::fs::write(
        &config,
        job_config_toml(&proxy.url_for(server, db.name()), "1h") + "\n[jobs.queues]\ndefault = 1\n",
    )
    .unwrap();
    let jobs = client(&pool);
    let abort = Poison {
        abort: true,
        ..Poison::default()
    };
    let id = jobs
        .enqueue_job(NewJob::new(poison, abort).priority(1).max_attempts(1))
        .await
        .unwrap()
        .id();
    let claimed_ahead = || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT state = 'running' AND node_id = 'n1' AND started_at IS NULL
               FROM forge.jobs WHERE id = $1",
        )
        .bind(id.0)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    // Three rescues free, then max_attempts (1) counted: four deaths.
    for round in 1..=4 {
        let warm_up = (0..30).map(|_| NewJob::new(poison, Poison::default()));
        let hold = NewJob::new(
            poison,
            Poison {
                sleep_ms: 1500,
                ..Poison::default()
            },
        );
        let warm_up: Vec<JobId> = jobs
            .enqueue_many(warm_up)
            .await
            .unwrap()
            .iter()
            .map(|e| e.id())
            .collect();
        jobs.enqueue_job(hold).await.unwrap();
        let mut n1 = JobNode::start(&config, "n1").await;
        forge_testkit::wait_for(
            &format!("round {round}: n1 to warm up and claim the poison ahead"),
            SOON,
            Duration::from_millis(2),
            || async {
                let warm: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM forge.jobs WHERE id = ANY($1) AND state = 'completed'",
                )
                .bind(warm_up.iter().map(|j| j.0).collect::<Vec<_>>())
                .fetch_one(&pool)
                .await
                .unwrap();
                let ahead = claimed_ahead().await;
                if warm == 30 && ahead {
                    Ok(())
                } else {
                    let row: (String, Option<String>, bool) = sqlx::query_as(
                        "SELECT state, node_id, started_at IS NULL FROM forge.jobs WHERE id = $1",
                    )
                    .bind(id.0)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                    Err(format!("{warm} of 30 warm-up jobs completed; the poison (state, node, not started): {row:?}"))
                }
            },
        )
        .await
        .unwrap();
        proxy.delay(
            Filter::application_prefix("forge:pool:n1"),
            Duration::from_secs(600),
        );
        let status = n1.process.wait_exit(SOON).await.unwrap();
        assert!(!status.success(), "round {round}: n1 {status:?}");
        proxy.sever(&Filter::application_prefix("forge:pool:n1"));
        sessions_gone(&pool, "n1").await;
    }
    let _n1 = JobNode::start(&config, "n1").await;
    let job = wait_state(&pool, id, JobState::Dead).await;
    let reasons: Vec<&str> = job.errors.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["rescued"; 4], "{:?}", job.errors);
    for free in &job.errors[..3] {
        assert!(free.error.contains("does not count"), "{:?}", job.errors);
    }
    assert!(
        job.errors[3]
            .error
            .contains("died 4 times before the handler's start was recorded"),
        "{:?}",
        job.errors
    );
}
