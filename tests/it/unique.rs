//! Unique jobs over time (`unique_period`, `unique_states`) and what a duplicate does
//! (`UniqueMode`: keep, replace - debounce -, keep_earliest_run_at): concurrent enqueues from
//! many connections, from several enqueuing processes (`forge-job-node enqueue`) released at
//! once, and inside callers' transactions, against a real PostgreSQL.

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use forge::Node;
use forge::jobs::{Enqueued, JobId, JobState, NewJob, UniqueMode};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::jobs::{Behave, inserted, job_config, plain, setup, wait_for_lock_waiter, wait_state};
use crate::stored_crons::db_now;
use crate::support::*;

/// Where debounced enqueues record the order in which they took the key: each draws
/// `nextval('debounce_order')` after its enqueue, in its transaction.
const DEBOUNCED_TABLE_SQL: &str =
    "CREATE SEQUENCE debounce_order; CREATE TABLE debounced (tag text, n bigint)";

fn keyed(tag: &str, key: &str) -> NewJob {
    NewJob::new(plain, Behave::tag(tag)).unique_key(key)
}

/// A pool of `size` connections: enqueues from as many sessions at once.
async fn wide_pool(url: &str, size: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(size)
        .connect(url)
        .await
        .unwrap()
}

async fn count_jobs(pool: &PgPool, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM forge.jobs WHERE unique_key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_enqueues_of_one_key_in_a_period_create_one_job() {
    let (db, pool) = setup().await;
    // 20 sessions, each enqueue on its own, released together 20 at a time; half of them
    // inside transactions of their own that commit.
    let wide = wide_pool(db.url(), 20).await;
    let together = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let pool = wide.clone();
            let together = together.clone();
            tokio::spawn(async move {
                let job =
                    keyed(&format!("n{i}"), "sync:42").unique_period(Duration::from_secs(3600));
                let jobs = client(&pool);
                let mut conn = pool.acquire().await.unwrap();
                together.wait().await;
                if i % 2 == 0 {
                    jobs.enqueue_job_in(&mut *conn, job).await.unwrap()
                } else {
                    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
                    let result = jobs.enqueue_job_in(&mut *tx, job).await.unwrap();
                    tx.commit().await.unwrap();
                    result
                }
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let winners: Vec<JobId> = results
        .iter()
        .filter_map(|r| match r {
            Enqueued::Inserted(id) => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    assert!(
        results
            .iter()
            .all(|r| r.id() == winners[0]
                && (r.is_duplicate() || *r == Enqueued::Inserted(winners[0]))),
        "{results:?}"
    );
    assert_eq!(count_jobs(&pool, "sync:42").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_period_counts_finished_and_pruned_jobs_and_then_ends() {
    let (db, pool) = setup().await;
    let mut config = job_config(db.url(), "a");
    // The compactor too, often: it prunes the keys that block nothing any more.
    config.node.roles = Some(vec!["scheduler".into(), "log_compactor".into()]);
    config.cluster.compaction_interval = Duration::from_secs(1);
    let node = Node::builder(config)
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .unwrap();
    let period = Duration::from_secs(2);
    let jobs = node.jobs();
    let first = inserted(
        jobs.enqueue_job(keyed("first", "hourly").unique_period(period))
            .await
            .unwrap(),
    );
    wait_state(&pool, first, JobState::Completed).await;
    // Completed, and still within the period: a duplicate.
    let again = jobs
        .enqueue_job(keyed("again", "hourly").unique_period(period))
        .await
        .unwrap();
    assert_eq!(again, Enqueued::Duplicate(first));
    // Without a period, a completed job blocks nothing (the unfinished states alone).
    let plain_key = inserted(jobs.enqueue_job(keyed("p1", "plain")).await.unwrap());
    wait_state(&pool, plain_key, JobState::Completed).await;
    inserted(jobs.enqueue_job(keyed("p2", "plain")).await.unwrap());

    // Pruned (as retention would): the key outlives the job, the period still holds.
    sqlx::query("DELETE FROM forge.jobs WHERE id = $1")
        .bind(first.0)
        .execute(&pool)
        .await
        .unwrap();
    let again = jobs
        .enqueue_job(keyed("pruned", "hourly").unique_period(period))
        .await
        .unwrap();
    assert_eq!(again, Enqueued::Duplicate(first));

    // Once the period is over, the next enqueue inserts.
    let second =
        forge_testkit::wait_until("the period to end", SOON, Duration::from_millis(50), || {
            let jobs = jobs.clone();
            async move {
                match jobs
                    .enqueue_job(keyed("second", "hourly").unique_period(period))
                    .await
                    .unwrap()
                {
                    Enqueued::Inserted(id) => Some(id),
                    _ => None,
                }
            }
        })
        .await
        .unwrap();
    let (first_at, second_at): (chrono::DateTime<Utc>, chrono::DateTime<Utc>) = sqlx::query_as(
        "SELECT k.enqueued_at, j.created_at FROM forge.job_keys k, forge.jobs j
          WHERE k.unique_key = 'hourly' AND j.id = $1",
    )
    .bind(second.0)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(first_at, second_at, "the new job holds the key");
    let held =
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM forge.jobs WHERE unique_key = 'hourly'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(held, 1);

    // A key whose job is gone and whose period is over is pruned; one still held is not.
    let gone = inserted(
        jobs.enqueue_job(keyed("gone", "gone").unique_period(Duration::from_millis(200)))
            .await
            .unwrap(),
    );
    wait_state(&pool, gone, JobState::Completed).await;
    sqlx::query("DELETE FROM forge.jobs WHERE id = $1")
        .bind(gone.0)
        .execute(&pool)
        .await
        .unwrap();
    let keys = || async {
        sqlx::query_scalar::<_, String>("SELECT unique_key FROM forge.job_keys ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap()
    };
    forge_testkit::wait_until(
        "the compactor to prune the key",
        SOON,
        Duration::from_millis(50),
        || async { (!keys().await.contains(&"gone".to_owned())).then_some(()) },
    )
    .await
    .unwrap();
    assert!(keys().await.contains(&"hourly".to_owned()));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_covered_states_decide_what_blocks() {
    let (_db, pool) = setup().await;
    let jobs = client(&pool);
    // Covering only `scheduled`: an available holder blocks nothing.
    let states = [JobState::Scheduled];
    let first = inserted(
        jobs.enqueue_job(keyed("a", "s").unique_states(states))
            .await
            .unwrap(),
    );
    let second = inserted(
        jobs.enqueue_job(
            keyed("b", "s")
                .unique_states(states)
                .delay(Duration::from_secs(600)),
        )
        .await
        .unwrap(),
    );
    assert_ne!(first, second);
    // The scheduled holder blocks.
    let third = jobs
        .enqueue_job(keyed("c", "s").unique_states(states))
        .await
        .unwrap();
    assert_eq!(third, Enqueued::Duplicate(second));
    // No state at all is refused, saying why.
    let err = jobs
        .enqueue_job(keyed("d", "s").unique_states([]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unique_states is empty"), "{err}");
    // So are unique options on a job without a key.
    let err = jobs
        .enqueue_job(NewJob::new(plain, Behave::tag("e")).unique_period(Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("apply to a unique job"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_keeps_exactly_one_waiting_job_with_the_last_arguments_under_concurrent_enqueues() {
    let (db, pool) = setup().await;
    // No node works the jobs: they wait. The order in which the enqueues took the key is the
    // order of the sequence values drawn right after them, in the same transaction (the key's
    // row stays locked until the transaction ends).
    sqlx::raw_sql(DEBOUNCED_TABLE_SQL)
        .execute(&pool)
        .await
        .unwrap();
    let wide = wide_pool(db.url(), 20).await;
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let pool = wide.clone();
            tokio::spawn(async move {
                let tag = format!("n{i}");
                let job = keyed(&tag, "debounce")
                    .unique_mode(UniqueMode::Replace)
                    .delay(Duration::from_secs(60 + i));
                let mut tx = pool.begin().await.unwrap();
                let result = client(&pool).enqueue_job_in(&mut *tx, job).await.unwrap();
                sqlx::query("INSERT INTO debounced VALUES ($1, nextval('debounce_order'))")
                    .bind(&tag)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                result
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let inserted: Vec<_> = results
        .iter()
        .filter(|r| matches!(r, Enqueued::Inserted(_)))
        .collect();
    assert_eq!(inserted.len(), 1, "{results:?}");
    let id = inserted[0].id();
    assert!(
        results
            .iter()
            .all(|r| r.id() == id && !matches!(r, Enqueued::Duplicate(_))),
        "{results:?}"
    );
    assert_eq!(count_jobs(&pool, "debounce").await, 1);
    let last: String = sqlx::query_scalar("SELECT tag FROM debounced ORDER BY n DESC LIMIT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    let job = client(&pool).get(id).await.unwrap().unwrap();
    assert_eq!(job.args["tag"], last, "{job:?}");
    assert_eq!(job.state, JobState::Scheduled);
    let n: i64 = last[1..].parse().unwrap();
    let expected = job.created_at + TimeDelta::seconds(60 + n);
    assert!(
        (job.run_at - expected).abs() < TimeDelta::seconds(5),
        "run_at {} for the last enqueue's delay of {}s",
        job.run_at,
        60 + n
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_earliest_run_at_takes_the_arguments_and_keeps_the_earlier_run_at() {
    let (_db, pool) = setup().await;
    let jobs = client(&pool);
    let mode = UniqueMode::KeepEarliestRunAt;
    let at = |minutes: i64| Utc::now() + TimeDelta::minutes(minutes);
    let id = inserted(
        jobs.enqueue_job(keyed("1", "e").unique_mode(mode).run_at(at(60)))
            .await
            .unwrap(),
    );
    let earlier = at(10);
    let r = jobs
        .enqueue_job(keyed("2", "e").unique_mode(mode).run_at(earlier))
        .await
        .unwrap();
    assert_eq!(r, Enqueued::Replaced(id));
    let r = jobs
        .enqueue_job(keyed("3", "e").unique_mode(mode).run_at(at(30)))
        .await
        .unwrap();
    assert_eq!(r, Enqueued::Replaced(id));
    let job = client(&pool).get(id).await.unwrap().unwrap();
    assert_eq!(job.args["tag"], "3");
    assert!(
        (job.run_at - earlier).abs() < TimeDelta::milliseconds(1),
        "{} kept, {earlier} expected",
        job.run_at
    );
    // Replace takes the later one as given.
    let r = jobs
        .enqueue_job(
            keyed("4", "e")
                .unique_mode(UniqueMode::Replace)
                .run_at(at(30)),
        )
        .await
        .unwrap();
    assert_eq!(r, Enqueued::Replaced(id));
    let job = client(&pool).get(id).await.unwrap().unwrap();
    assert!(
        job.run_at > earlier + TimeDelta::minutes(10),
        "{}",
        job.run_at
    );
    assert_eq!(count_jobs(&pool, "e").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_enqueue_leaves_no_job_and_no_key_and_a_waiting_enqueuer_inserts() {
    let (_db, pool) = setup().await;
    let jobs = client(&pool);
    let period = Duration::from_secs(3600);
    let mut tx = pool.begin().await.unwrap();
    let held = inserted(
        jobs.enqueue_job_in(&mut *tx, keyed("rolled", "tx").unique_period(period))
            .await
            .unwrap(),
    );
    // Another enqueuer of the key waits for this transaction to end...
    let other = {
        let jobs = jobs.clone();
        tokio::spawn(async move {
            jobs.enqueue_job(keyed("other", "tx").unique_period(period))
                .await
                .unwrap()
        })
    };
    wait_for_lock_waiter(
        &pool,
        "the second enqueuer to wait for the key",
        "query LIKE $1",
        "%jobs_enqueue%",
    )
    .await;
    assert!(!other.is_finished());
    tx.rollback().await.unwrap();
    // ... and inserts once it rolled back: nothing of the first remains.
    let result = other.await.unwrap();
    let id = inserted(result);
    assert_ne!(id, held);
    assert!(client(&pool).get(held).await.unwrap().is_none());
    assert_eq!(count_jobs(&pool, "tx").await, 1);
}

/// The advisory lock the enqueuing processes wait at (see tests/job_enqueue.rs).
const BARRIER: i64 = 733_301;

/// What one enqueue of a `forge-job-node enqueue` process reported: its tag, `inserted`,
/// `duplicate` or `replaced`, and the job id.
#[derive(Debug)]
struct Reported {
    tag: String,
    what: String,
    id: i64,
}

/// Enqueues `processes * per_process` jobs of `key` in `mode` (`keep` or `replace`) from as
/// many connections of `processes` enqueuing processes, all released at once: every
/// connection waits at the barrier (this test holds it) before it enqueues, and the barrier
/// is released only once all of them wait there. Returns what each enqueue reported.
async fn enqueue_from_processes(
    db: &forge_testkit::TestDatabase,
    pool: &PgPool,
    key: &str,
    mode: &str,
    processes: u64,
    per_process: u64,
) -> Vec<Reported> {
    let mut gate = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(BARRIER)
        .execute(&mut *gate)
        .await
        .unwrap();
    let mut enqueuers: Vec<forge_testkit::NodeProcess> = (0..processes)
        .map(|p| {
            let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_forge-job-node"));
            command
                .arg("enqueue")
                .arg(key)
                .arg((p * per_process).to_string())
                .arg(per_process.to_string())
                .arg(mode)
                .arg(BARRIER.to_string())
                .env("DATABASE_URL", db.url());
            forge_testkit::NodeProcess::spawn(command)
                .unwrap()
                .named(&format!("enqueuer{p}"))
        })
        .collect();
    let total = (processes * per_process) as i64;
    forge_testkit::wait_until(
        "every enqueue of every process to wait at the barrier",
        SOON,
        Duration::from_millis(20),
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 0
                    AND objid::bigint = $1 AND mode = 'ShareLock' AND NOT granted",
            )
            .bind(BARRIER)
            .fetch_one(pool)
            .await
            .unwrap();
            (waiting == total).then_some(())
        },
    )
    .await
    .unwrap();
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(BARRIER)
        .execute(&mut *gate)
        .await
        .unwrap();
    let mut reported = Vec::new();
    for enqueuer in &mut enqueuers {
        let status = enqueuer.wait_exit(SOON).await.unwrap();
        let lines = enqueuer.lines();
        assert!(
            status.success(),
            "{}: {status}\n{lines:#?}",
            enqueuer.name()
        );
        assert!(
            lines.iter().any(|l| l == "FORGE-ENQUEUE DONE"),
            "{lines:#?}"
        );
        for line in lines {
            let fields: Vec<&str> = line.split(' ').collect();
            if let ["FORGE-ENQUEUE", tag, what, id] = fields[..] {
                reported.push(Reported {
                    tag: tag.to_owned(),
                    what: what.to_owned(),
                    id: id.parse().unwrap(),
                });
            }
        }
    }
    let tags: std::collections::BTreeSet<&str> = reported.iter().map(|r| r.tag.as_str()).collect();
    assert_eq!(
        tags.len() as i64,
        total,
        "one answer per enqueue: {reported:?}"
    );
    reported
}

/// Asserts that exactly one enqueue inserted, and that every other one reported `other`
/// (`duplicate` or `replaced`) naming that job; returns its id.
fn one_inserted_and_the_others(reported: &[Reported], other: &str) -> i64 {
    let inserted: Vec<&Reported> = reported.iter().filter(|r| r.what == "inserted").collect();
    assert_eq!(inserted.len(), 1, "{reported:?}");
    let id = inserted[0].id;
    let odd: Vec<&Reported> = reported
        .iter()
        .filter(|r| r.what != "inserted" && (r.what != other || r.id != id))
        .collect();
    assert!(odd.is_empty(), "not {other} of job {id}: {odd:?}");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_enqueues_of_one_key_from_four_processes_at_once_create_one_job() {
    let (db, pool) = setup().await;
    // 4 processes x 25 connections; half of the enqueues inside transactions that commit.
    let reported = enqueue_from_processes(&db, &pool, "sync:7", "keep", 4, 25).await;
    one_inserted_and_the_others(&reported, "duplicate");
    assert_eq!(count_jobs(&pool, "sync:7").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debounce_from_four_processes_keeps_one_waiting_job_with_the_last_commit() {
    let (db, pool) = setup().await;
    // Each enqueue records its tag with a sequence value in its own transaction, after the
    // enqueue: the key's row stays locked until that transaction ends, so the last commit
    // that took the key drew the highest value. No node works the jobs: they wait.
    sqlx::raw_sql(DEBOUNCED_TABLE_SQL)
        .execute(&pool)
        .await
        .unwrap();
    let before = db_now(&pool).await;
    let reported = enqueue_from_processes(&db, &pool, "debounce", "replace", 4, 25).await;
    let after = db_now(&pool).await;
    let id = one_inserted_and_the_others(&reported, "replaced");
    assert_eq!(count_jobs(&pool, "debounce").await, 1);
    let last: String = sqlx::query_scalar("SELECT tag FROM debounced ORDER BY n DESC LIMIT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    let job = client(&pool).get(JobId(id)).await.unwrap().unwrap();
    assert_eq!(job.args["tag"], last, "{job:?}");
    assert_eq!(job.state, JobState::Scheduled);
    // Tag n<i> asked for a delay of i + 1 minutes from its enqueue's call, made between
    // `before` and `after` (a few seconds: the delays are a minute apart).
    let i: i64 = last[1..].parse().unwrap();
    let delay = TimeDelta::minutes(i + 1);
    assert!(
        job.run_at >= before + delay && job.run_at <= after + delay,
        "run_at {} for the last enqueue's delay of {i} + 1 minutes (enqueued from {before} to {after})",
        job.run_at
    );
}
