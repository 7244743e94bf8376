//! The job queue on in-process nodes: runs, retries and backoff, dead letters, timeouts, unique
//! keys, cancellation, transactional and bulk enqueue, priorities and run-at, panics, role jobs,
//! graceful drain, metrics, bad declarations. (Killed node processes: `jobs_process`.)

#[path = "../job_types.rs"]
mod job_types;
#[path = "jobs_process.rs"]
pub(crate) mod process;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use forge::crons::CronJob;
use forge::jobs::{
    Backoff, CancelOutcome, Enqueued, Job, JobId, JobInfo, JobOptions, JobState, NewJob,
};
use forge::{Config, CronContext, JobContext, JobError, Node, Role, RoleState, Schedule};
use forge_testkit::{TestDatabase, wait_until};
use sqlx::PgPool;

pub(crate) use job_types::*;

use crate::support::*;

/// The election timings of [`config`], plus job timings short enough for tests.
pub(crate) fn job_config(url: &str, node: &str) -> Config {
    let mut config = config(url, node);
    config.node.roles = Some(vec!["scheduler".into()]);
    // The default queue only: the `mailers` queue of the `mailer` type waits for the nodes
    // that list it.
    config.node.queues = Some(vec!["default".into()]);
    config.jobs.maintenance_interval = Duration::from_secs(1);
    config.jobs.drain_timeout = Duration::from_secs(2);
    config
}

/// [`job_config`] for a node that works the `work` queue (2 at once) and serves the admin API
/// on a free port of 127.0.0.1; with `charted`, it also leads the metrics aggregator with a
/// 1 s rollup, so that the cluster series have points within seconds.
pub(crate) fn served_job_config(url: &str, node: &str, charted: bool) -> Config {
    let mut config = job_config(url, node);
    config.node.queues = Some(vec!["work".into()]);
    config.jobs.queues = [("work".to_owned(), 2.into())].into_iter().collect();
    config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    if charted {
        config.node.roles = Some(vec!["scheduler".into(), "metrics_aggregator".into()]);
        config.metrics.rollup_interval = Duration::from_secs(1);
    }
    config
}

/// A fresh database with FORGE's schema and the `job_runs` table.
pub(crate) async fn setup() -> (TestDatabase, PgPool) {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    sqlx::raw_sql(RUNS_TABLE_SQL).execute(&pool).await.unwrap();
    let migrator = Node::builder(config(db.url(), "migrator"))
        .auto_register(false)
        .start()
        .await
        .unwrap();
    migrator.shutdown().await;
    (db, pool)
}

/// A node with every test job type registered.
async fn start(config: Config) -> Node {
    Node::builder(config)
        .auto_register(false)
        .job(plain)
        .job(retrying)
        .job(timing_out)
        .job(quick_retry)
        .job(unique_by_args)
        .job(mailer)
        .start()
        .await
        .expect("node starts")
}

/// Waits until job `id` is in `state`, and returns it.
pub(crate) async fn wait_state(pool: &PgPool, id: JobId, state: JobState) -> JobInfo {
    wait_for_job(pool, id, &format!("job {id} to be {state}"), |job| {
        job.state == state
    })
    .await
}

async fn wait_for_job(
    pool: &PgPool,
    id: JobId,
    what: &str,
    pred: impl Fn(&JobInfo) -> bool,
) -> JobInfo {
    forge_testkit::wait_for(what, SOON, Duration::from_millis(10), || async {
        match client(pool).get(id).await {
            Ok(Some(job)) if pred(&job) => Ok(job),
            Ok(Some(job)) => Err(format!(
                "state {}, attempt {}, errors {:?}",
                job.state, job.attempt, job.errors
            )),
            Ok(None) => Err("no such job".to_owned()),
            Err(err) => Err(err.to_string()),
        }
    })
    .await
    .unwrap()
}

/// (attempt, node, started_at seconds, finished) of each attempt of a job, in order.
async fn runs(pool: &PgPool, id: JobId) -> Vec<(i32, String, f64, bool)> {
    sqlx::query_as(
        "SELECT attempt, node, extract(epoch FROM started_at)::float8, finished_at IS NOT NULL
           FROM job_runs WHERE job_id = $1 ORDER BY attempt",
    )
    .bind(id.0)
    .fetch_all(pool)
    .await
    .unwrap()
}

pub(crate) fn inserted(result: Enqueued) -> JobId {
    match result {
        Enqueued::Inserted(id) => id,
        Enqueued::Duplicate(id) => panic!("expected an insert, got a duplicate of {id}"),
        Enqueued::Replaced(id) => panic!("expected an insert, got {id} replaced"),
    }
}

/// The value of a metric line `name{labels} value` in a Prometheus text rendering.
pub(crate) fn metric(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(name_and_labels)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_once_and_is_counted() {
    let (db, pool) = setup().await;
    let node = start(job_config(db.url(), "a")).await;
    let id = inserted(node.jobs().enqueue(plain, Behave::tag("x")).await.unwrap());
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(job.attempt, 1);
    assert_eq!(job.node_id.as_deref(), Some("a"));
    assert_eq!(job.kind, "plain");
    assert_eq!(job.queue, "default");
    assert!(
        job.finished_at.is_some() && job.errors.is_empty(),
        "{job:?}"
    );
    assert_eq!(runs(&pool, id).await.len(), 1);

    let text = wait_until(
        "completion metrics",
        SOON,
        Duration::from_millis(10),
        || {
            let text = node.render_metrics();
            async move {
                (metric(
                    &text,
                    r#"forge_job_completed_total{queue="default",kind="plain"}"#,
                ) == Some(1.0))
                .then_some(text)
            }
        },
    )
    .await
    .unwrap();
    for expected in [
        r#"forge_job_enqueued_total{queue="default",kind="plain"} 1"#,
        r#"forge_job_duration_seconds_count{queue="default",kind="plain"} 1"#,
        r#"forge_job_pickup_latency_seconds_count{queue="default",kind="plain"} 1"#,
        "# HELP forge_job_completed_total",
        "# HELP forge_job_pickup_latency_seconds",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_are_retried_with_exponential_backoff_then_dead_lettered() {
    let (db, pool) = setup().await;
    let node = start(job_config(db.url(), "a")).await;
    // retrying: 3 attempts, backoff 200 ms doubling, ±25 % jitter.
    let dead = inserted(
        node.jobs()
            .enqueue(
                retrying,
                Behave {
                    fail_attempts: 99,
                    ..Behave::tag("dead")
                },
            )
            .await
            .unwrap(),
    );
    let recovers = inserted(
        node.jobs()
            .enqueue(
                retrying,
                Behave {
                    fail_attempts: 2,
                    ..Behave::tag("recovers")
                },
            )
            .await
            .unwrap(),
    );

    let job = wait_state(&pool, dead, JobState::Dead).await;
    assert_eq!(job.attempt, 3);
    assert_eq!(job.errors.len(), 3, "{:?}", job.errors);
    for (i, error) in job.errors.iter().enumerate() {
        assert_eq!(error.attempt, i as u32 + 1);
        assert_eq!(error.reason, "error");
        assert_eq!(error.error, format!("failed attempt {}", i + 1));
        assert_eq!(error.node.as_deref(), Some("a"));
    }
    let attempts = runs(&pool, dead).await;
    assert_eq!(attempts.len(), 3);
    let gap1 = attempts[1].2 - attempts[0].2;
    let gap2 = attempts[2].2 - attempts[1].2;
    // 200 ms then 400 ms, each -25 %/+25 %; pickup adds a little (a loaded machine more, so
    // the upper bounds only rule out a backoff that is wildly too long).
    assert!((0.15..2.0).contains(&gap1), "first backoff {gap1}s");
    assert!((0.3..3.0).contains(&gap2), "second backoff {gap2}s");

    let job = wait_state(&pool, recovers, JobState::Completed).await;
    assert_eq!(job.attempt, 3);
    assert_eq!(job.errors.len(), 2);

    let labels = r#"{queue="default",kind="retrying"}"#;
    // Counted once the worker has heard back from the database.
    let text = wait_until(
        "the outcomes to be counted",
        SOON,
        Duration::from_millis(10),
        || {
            let text = node.render_metrics();
            async move {
                (metric(&text, &format!("forge_job_completed_total{labels}")) == Some(1.0)
                    && metric(&text, &format!("forge_job_dead_total{labels}")) == Some(1.0))
                .then_some(text)
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        metric(&text, &format!("forge_job_failed_total{labels}")),
        Some(5.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, &format!("forge_job_retried_total{labels}")),
        Some(4.0)
    );
    assert_eq!(
        metric(&text, &format!("forge_job_dead_total{labels}")),
        Some(1.0)
    );
    assert_eq!(
        metric(&text, &format!("forge_job_completed_total{labels}")),
        Some(1.0)
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_dead_letters_at_once_and_retry_after_overrides_the_backoff() {
    let (db, pool) = setup().await;
    let node = start(job_config(db.url(), "a")).await;
    let discarded = inserted(
        node.jobs()
            .enqueue(
                retrying,
                Behave {
                    fail_attempts: 1,
                    discard: true,
                    ..Behave::tag("discard")
                },
            )
            .await
            .unwrap(),
    );
    let job = wait_state(&pool, discarded, JobState::Dead).await;
    assert_eq!(job.attempt, 1);
    assert_eq!(job.errors[0].reason, "discard");
    assert_eq!(job.errors[0].error, "discarded on attempt 1");

    // quick_retry's backoff is 20 ms; the handler asks for 700 ms.
    let later = inserted(
        node.jobs()
            .enqueue(
                quick_retry,
                Behave {
                    fail_attempts: 1,
                    retry_after_ms: Some(700),
                    ..Behave::tag("later")
                },
            )
            .await
            .unwrap(),
    );
    wait_state(&pool, later, JobState::Completed).await;
    let attempts = runs(&pool, later).await;
    let gap = attempts[1].2 - attempts[0].2;
    assert!((0.7..3.0).contains(&gap), "retry_after 700 ms gave {gap}s");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_past_its_timeout_fails_and_is_retried() {
    let (db, pool) = setup().await;
    let node = start(job_config(db.url(), "a")).await;
    // timing_out: 300 ms timeout, 2 attempts.
    let slow = inserted(
        node.jobs()
            .enqueue(
                timing_out,
                Behave {
                    sleep_ms: 60_000,
                    ..Behave::tag("slow")
                },
            )
            .await
            .unwrap(),
    );
    let job = wait_state(&pool, slow, JobState::Dead).await;
    assert_eq!(job.attempt, 2);
    assert!(
        job.errors
            .iter()
            .all(|e| e.reason == "timeout" && e.error == "timed out after 300ms"),
        "{:?}",
        job.errors
    );
    // The handlers were dropped: neither attempt finished.
    assert!(runs(&pool, slow).await.iter().all(|r| !r.3));

    // A per-job timeout overrides the declared one.
    let patient = inserted(
        node.jobs()
            .enqueue_job(
                NewJob::new(
                    timing_out,
                    Behave {
                        sleep_ms: 500,
                        ..Behave::tag("patient")
                    },
                )
                .timeout(Duration::from_secs(5)),
            )
            .await
            .unwrap(),
    );
    let job = wait_state(&pool, patient, JobState::Completed).await;
    assert_eq!(job.attempt, 1);
    assert_eq!(job.timeout, Some(Duration::from_secs(5)));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_attempt_and_the_worker_keeps_working() {
    let (db, pool) = setup().await;
    let mut config = job_config(db.url(), "a");
    config.jobs.queues = [("default".to_owned(), 1.into())].into_iter().collect();
    let node = start(config).await;
    let panics = inserted(
        node.jobs()
            .enqueue(
                quick_retry,
                Behave {
                    fail_attempts: 2,
                    panic: true,
                    ..Behave::tag("panics")
                },
            )
            .await
            .unwrap(),
    );
    let job = wait_state(&pool, panics, JobState::Completed).await;
    assert_eq!(job.attempt, 3);
    assert_eq!(job.errors.len(), 2);
    for (i, error) in job.errors.iter().enumerate() {
        assert_eq!(error.reason, "panic");
        assert_eq!(
            error.error,
            format!("panicked: test panic on attempt {}", i + 1)
        );
    }
    // The single worker slot is still there.
    let after = inserted(
        node.jobs()
            .enqueue(plain, Behave::tag("after"))
            .await
            .unwrap(),
    );
    wait_state(&pool, after, JobState::Completed).await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_jobs_report_duplicates_instead_of_inserting() {
    let (db, pool) = setup().await;
    // A node that does not work the queue, so jobs stay available.
    let mut config = job_config(db.url(), "a");
    config.node.queues = Some(vec!["elsewhere".into()]);
    let node = start(config).await;
    let jobs = node.jobs();

    let keyed = |tag: &str| NewJob::new(plain, Behave::tag(tag)).unique_key("k1");
    let first = inserted(jobs.enqueue_job(keyed("one")).await.unwrap());
    assert_eq!(
        jobs.enqueue_job(keyed("two")).await.unwrap(),
        Enqueued::Duplicate(first)
    );
    // Keys are per kind.
    let other_kind = jobs
        .enqueue_job(NewJob::new(quick_retry, Behave::tag("one")).unique_key("k1"))
        .await
        .unwrap();
    assert!(!other_kind.is_duplicate());

    // Declared unique: the arguments are the key.
    let a = inserted(
        jobs.enqueue(unique_by_args, Behave::tag("a"))
            .await
            .unwrap(),
    );
    assert_eq!(
        jobs.enqueue(unique_by_args, Behave::tag("a"))
            .await
            .unwrap(),
        Enqueued::Duplicate(a)
    );
    assert!(
        !jobs
            .enqueue(unique_by_args, Behave::tag("b"))
            .await
            .unwrap()
            .is_duplicate()
    );

    // In one batch: the second of two equal keys is the duplicate of the first.
    let batch = jobs
        .enqueue_many([
            NewJob::new(plain, Behave::tag("x")).unique_key("k2"),
            NewJob::new(plain, Behave::tag("y")).unique_key("k2"),
            NewJob::new(plain, Behave::tag("z")).unique_key("k1"),
        ])
        .await
        .unwrap();
    let k2 = inserted(batch[0]);
    assert_eq!(batch[1], Enqueued::Duplicate(k2));
    assert_eq!(batch[2], Enqueued::Duplicate(first));

    // A finished job frees its key.
    assert_eq!(jobs.cancel(first).await.unwrap(), CancelOutcome::Cancelled);
    let again = inserted(jobs.enqueue_job(keyed("three")).await.unwrap());
    assert_ne!(again, first);

    let count: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.jobs WHERE unique_key = 'k1' AND kind = 'plain'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(count, 2, "one cancelled, one waiting");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueuers_of_one_unique_key_insert_one_job() {
    let (_db, pool) = setup().await;
    let jobs = client(&pool);

    // Two transactions: the second waits on the first's uncommitted insert, then reports it.
    let mut tx1 = pool.begin().await.unwrap();
    let first = inserted(
        client(&pool)
            .enqueue_job_in(
                &mut *tx1,
                NewJob::new(plain, Behave::tag("1")).unique_key("u"),
            )
            .await
            .unwrap(),
    );
    let second = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut tx2 = pool.begin().await.unwrap();
            let result = client(&pool)
                .enqueue_job_in(
                    &mut *tx2,
                    NewJob::new(plain, Behave::tag("2")).unique_key("u"),
                )
                .await
                .unwrap();
            tx2.commit().await.unwrap();
            result
        }
    });
    wait_for_lock_waiter(
        &pool,
        "the second enqueuer to wait for the first",
        "query LIKE $1",
        "%jobs_enqueue%",
    )
    .await;
    tx1.commit().await.unwrap();
    assert_eq!(second.await.unwrap(), Enqueued::Duplicate(first));

    // Many at once: exactly one insert, everyone else learns its id.
    let mut tasks = Vec::new();
    for i in 0..16 {
        let jobs = jobs.clone();
        tasks.push(tokio::spawn(async move {
            jobs.enqueue_job(NewJob::new(plain, Behave::tag(format!("{i}"))).unique_key("many"))
                .await
                .unwrap()
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let winners: Vec<_> = results.iter().filter(|r| !r.is_duplicate()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    assert!(results.iter().all(|r| r.id() == winners[0].id()));
    let count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM forge.jobs WHERE unique_key = 'many'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_queued_and_running_jobs() {
    let (db, pool) = setup().await;
    let node = start(job_config(db.url(), "a")).await;
    let jobs = node.jobs();

    // Queued (scheduled an hour from now): cancelled at once.
    let queued = inserted(
        jobs.enqueue_job(NewJob::new(plain, Behave::tag("q")).delay(Duration::from_secs(3600)))
            .await
            .unwrap(),
    );
    assert_eq!(
        jobs.get(queued).await.unwrap().unwrap().state,
        JobState::Scheduled
    );
    assert_eq!(jobs.cancel(queued).await.unwrap(), CancelOutcome::Cancelled);
    let job = jobs.get(queued).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Cancelled);
    assert_eq!(job.attempt, 0);

    // Running: the node is told, drops the handler and records the cancel.
    let running = inserted(
        jobs.enqueue(
            plain,
            Behave {
                sleep_ms: 60_000,
                ..Behave::tag("r")
            },
        )
        .await
        .unwrap(),
    );
    wait_until(
        "the job to start",
        SOON,
        Duration::from_millis(10),
        || async { (!runs(&pool, running).await.is_empty()).then_some(()) },
    )
    .await
    .unwrap();
    assert_eq!(
        jobs.cancel(running).await.unwrap(),
        CancelOutcome::Requested
    );
    let job = wait_state(&pool, running, JobState::Cancelled).await;
    assert!(job.cancel_requested);
    assert_eq!(job.errors.last().unwrap().reason, "cancelled");
    assert!(
        !runs(&pool, running).await[0].3,
        "the handler did not finish"
    );

    // Finished and unknown jobs.
    assert_eq!(
        jobs.cancel(running).await.unwrap(),
        CancelOutcome::Finished(JobState::Cancelled)
    );
    let done = inserted(jobs.enqueue(plain, Behave::tag("d")).await.unwrap());
    wait_state(&pool, done, JobState::Completed).await;
    assert_eq!(
        jobs.cancel(done).await.unwrap(),
        CancelOutcome::Finished(JobState::Completed)
    );
    assert_eq!(
        jobs.cancel(JobId(987_654)).await.unwrap(),
        CancelOutcome::NotFound
    );
    // Counted once the worker has heard back from the database.
    wait_until(
        "the cancel to be counted",
        SOON,
        Duration::from_millis(10),
        || {
            let text = node.render_metrics();
            async move {
                (metric(
                    &text,
                    r#"forge_job_cancelled_total{queue="default",kind="plain"}"#,
                ) == Some(1.0))
                .then_some(())
            }
        },
    )
    .await
    .unwrap();
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_enqueued_in_a_rolled_back_transaction_does_not_exist() {
    let (db, pool) = setup().await;
    let node = start(job_config(db.url(), "a")).await;

    let mut tx = pool.begin().await.unwrap();
    let ghost = inserted(
        client(&pool)
            .enqueue_in(&mut *tx, plain, Behave::tag("ghost"))
            .await
            .unwrap(),
    );
    tx.rollback().await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("CREATE TABLE orders (id int)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let real = inserted(
        node.jobs()
            .enqueue_job_in(&mut *tx, NewJob::new(plain, Behave::tag("real")))
            .await
            .unwrap(),
    );
    // Not visible, not run, before the commit.
    assert!(client(&pool).get(real).await.unwrap().is_none());
    tx.commit().await.unwrap();
    wait_state(&pool, real, JobState::Completed).await;

    assert!(client(&pool).get(ghost).await.unwrap().is_none());
    assert!(runs(&pool, ghost).await.is_empty());
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM forge.jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(total, 1);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_enqueued_jobs_all_run_exactly_once_on_two_nodes() {
    let (db, pool) = setup().await;
    let a = start(job_config(db.url(), "a")).await;
    let b = start(job_config(db.url(), "b")).await;
    let batch: Vec<NewJob> = (0..600)
        .map(|i| {
            // A few milliseconds each, so that one node cannot drain them all before the
            // other's first claim returns (both must take part: claims do not funnel).
            let job = NewJob::new(
                plain,
                Behave {
                    sleep_ms: 5,
                    ..Behave::tag(format!("{i}"))
                },
            );
            if i % 7 == 0 {
                job.queue("mailers")
            } else {
                job
            }
        })
        .collect();
    let results = a.jobs().enqueue_many(batch).await.unwrap();
    assert_eq!(results.len(), 600);
    let ids: Vec<i64> = results.iter().map(|r| inserted(*r).0).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "results come back in input order");

    // mailers is not in [node] queues: those jobs wait; the others are completed.
    wait_until(
        "the default queue to drain",
        SOON,
        Duration::from_millis(20),
        || async {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM forge.jobs WHERE queue = 'default' AND state <> 'completed'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (open == 0).then_some(())
        },
    )
    .await
    .unwrap();
    let (completed, runs, per_node): (i64, i64, Vec<String>) = (
        sqlx::query_scalar("SELECT count(*) FROM forge.jobs WHERE state = 'completed'")
            .fetch_one(&pool)
            .await
            .unwrap(),
        sqlx::query_scalar("SELECT count(*) FROM job_runs")
            .fetch_one(&pool)
            .await
            .unwrap(),
        sqlx::query_scalar(
            "SELECT DISTINCT node_id FROM forge.jobs WHERE state = 'completed' ORDER BY 1",
        )
        .fetch_all(&pool)
        .await
        .unwrap(),
    );
    assert_eq!(completed, 600 - 86);
    assert_eq!(runs, completed, "every job ran exactly once");
    assert_eq!(per_node, ["a", "b"], "both nodes claimed jobs");
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.jobs WHERE queue = 'mailers' AND state = 'available'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(waiting, 86);
    a.shutdown().await;
    b.shutdown().await;

    // A node that works mailers runs them, though their type declares another queue.
    let mut config = job_config(db.url(), "c");
    config.node.queues = Some(vec!["mailers".into()]);
    config.jobs.queues = [("mailers".to_owned(), 4.into())].into_iter().collect();
    let c = start(config).await;
    wait_until(
        "c to run the jobs enqueued on mailers",
        SOON,
        Duration::from_millis(20),
        || async {
            let by_c: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM forge.jobs WHERE queue = 'mailers' AND state = 'completed' AND node_id = 'c'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (by_c == 86).then_some(())
        },
    )
    .await
    .unwrap();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_order_waiting_jobs_and_run_at_defers_them() {
    let (db, pool) = setup().await;
    // Enqueue while no node works the queue, then start one with a single slot.
    let jobs = client(&pool);
    let mut expected = Vec::new();
    for (tag, priority) in [("p5", 5), ("p0-a", 0), ("p-3", -3), ("p0-b", 0), ("p9", 9)] {
        let id = inserted(
            jobs.enqueue_job(NewJob::new(plain, Behave::tag(tag)).priority(priority))
                .await
                .unwrap(),
        );
        expected.push((priority, id, tag));
    }
    expected.sort();
    let delayed = inserted(
        jobs.enqueue_job(
            NewJob::new(plain, Behave::tag("later")).delay(Duration::from_millis(1500)),
        )
        .await
        .unwrap(),
    );
    let at = Utc::now() + TimeDelta::milliseconds(2500);
    let timed = inserted(
        jobs.enqueue_job(NewJob::new(plain, Behave::tag("at")).run_at(at))
            .await
            .unwrap(),
    );
    let info = jobs.get(delayed).await.unwrap().unwrap();
    assert_eq!(info.state, JobState::Scheduled);

    let mut config = job_config(db.url(), "a");
    config.jobs.queues = [("default".to_owned(), 1.into())].into_iter().collect();
    let node = start(config).await;
    for (_, id, _) in &expected {
        wait_state(&pool, *id, JobState::Completed).await;
    }
    let order: Vec<i64> = sqlx::query_scalar("SELECT job_id FROM job_runs ORDER BY started_at")
        .fetch_all(&pool)
        .await
        .unwrap();
    let want: Vec<i64> = expected.iter().map(|(_, id, _)| id.0).collect();
    assert_eq!(
        &order[..5],
        &want[..],
        "priority order, then FIFO: {expected:?}"
    );

    for (id, due) in [(delayed, info.run_at), (timed, at)] {
        let job = wait_state(&pool, id, JobState::Completed).await;
        let started = job.attempted_at.unwrap();
        assert!(started >= due, "job {id} started at {started}, due {due}");
        // Promoted by the scheduler leader's timer, not a poll.
        assert!(
            started - due < TimeDelta::milliseconds(500),
            "job {id} started {} ms after it was due",
            (started - due).num_milliseconds()
        );
    }
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_jobs_run_only_on_the_roles_leader() {
    let (db, pool) = setup().await;
    let start_reporter = |id: &'static str| {
        let mut config = job_config(db.url(), id);
        config.node.roles = Some(vec!["scheduler".into(), "reports".into()]);
        Node::builder(config)
            .auto_register(false)
            .job(plain)
            .job(report)
            .start()
    };
    let a = start_reporter("a").await.unwrap();
    let b = start_reporter("b").await.unwrap();
    let reports = Role::new("reports").unwrap();
    let (leader, epoch) = wait_single_leader(&[&a, &b], &reports).await;
    let leader_id = ["a", "b"][leader];

    let results = a
        .jobs()
        .enqueue_many((0..20).map(|i| NewJob::new(report, Behave::tag(format!("{i}")))))
        .await
        .unwrap();
    for result in &results {
        let job = wait_state(&pool, result.id(), JobState::Completed).await;
        assert_eq!(job.node_id.as_deref(), Some(leader_id));
        assert_eq!(job.role.as_deref(), Some("reports"));
    }
    let nodes: Vec<String> = sqlx::query_scalar("SELECT DISTINCT node FROM job_runs")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(nodes, [leader_id]);
    let epochs: Vec<Option<i64>> =
        sqlx::query_scalar("SELECT DISTINCT epoch FROM forge.jobs WHERE role = 'reports'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(epochs, [Some(epoch)]);

    // The leader goes away: the other node leads and runs the next role jobs.
    let (old, new) = if leader == 0 { (a, b) } else { (b, a) };
    old.shutdown().await;
    wait_until(
        "the other node to lead reports",
        SOON,
        Duration::from_millis(10),
        || async {
            matches!(new.role_state(&reports), Some(RoleState::Leader { .. })).then_some(())
        },
    )
    .await
    .unwrap();
    // Enqueued on another queue than its type declares, a role job still runs on the leader.
    let results = new
        .jobs()
        .enqueue_many([
            NewJob::new(report, Behave::tag("next")),
            NewJob::new(report, Behave::tag("elsewhere")).queue("elsewhere"),
        ])
        .await
        .unwrap();
    for result in results {
        let job = wait_state(&pool, result.id(), JobState::Completed).await;
        assert_eq!(job.node_id.as_deref(), Some(new.id().as_str()));
    }
    new.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_running_jobs_then_releases_the_rest() {
    let (db, pool) = setup().await;
    let mut config = job_config(db.url(), "a");
    config.jobs.drain_timeout = Duration::from_secs(1);
    let a = start(config).await;
    let quick = inserted(
        a.jobs()
            .enqueue(
                plain,
                Behave {
                    sleep_ms: 300,
                    ..Behave::tag("quick")
                },
            )
            .await
            .unwrap(),
    );
    let slow = inserted(
        a.jobs()
            .enqueue(
                plain,
                Behave {
                    sleep_ms: 60_000,
                    sleep_on_node: Some("a".into()),
                    ..Behave::tag("slow")
                },
            )
            .await
            .unwrap(),
    );
    wait_until(
        "both jobs to start",
        SOON,
        Duration::from_millis(5),
        || async {
            let started: i64 = sqlx::query_scalar("SELECT count(*) FROM job_runs")
                .fetch_one(&pool)
                .await
                .unwrap();
            (started == 2).then_some(())
        },
    )
    .await
    .unwrap();
    let stopping = tokio::time::Instant::now();
    a.shutdown().await;
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");

    // The quick one finished during the drain; the slow one went back, attempt not counted.
    assert_eq!(
        client(&pool).get(quick).await.unwrap().unwrap().state,
        JobState::Completed
    );
    let job = client(&pool).get(slow).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Available, "{job:?}");
    assert_eq!(job.attempt, 1);
    assert_eq!(
        job.max_attempts,
        Some(21),
        "one more than [jobs] default_max_attempts"
    );
    assert_eq!(job.errors.len(), 1);
    assert_eq!(job.errors[0].reason, "released");
    let stopped: Option<chrono::DateTime<Utc>> =
        sqlx::query_scalar("SELECT stopped_at FROM forge.nodes WHERE node_id = 'a'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(stopped.is_some());

    // Another node picks it up (and does not sleep).
    let b = start(job_config(db.url(), "b")).await;
    let job = wait_state(&pool, slow, JobState::Completed).await;
    assert_eq!(job.attempt, 2);
    assert_eq!(job.node_id.as_deref(), Some("b"));
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aggregator_reports_queue_figures_and_the_compactor_prunes_finished_jobs() {
    let (db, pool) = setup().await;
    let mut config = job_config(db.url(), "a");
    config.node.roles = Some(Role::BUILTIN.iter().map(|r| r.name().to_owned()).collect());
    config.jobs.completed_retention = Duration::from_millis(500);
    config.cluster.compaction_interval = Duration::from_millis(500);
    let node = start(config).await;
    wait_single_leader(&[&node], &Role::METRICS_AGGREGATOR).await;
    let done = inserted(
        node.jobs()
            .enqueue(plain, Behave::tag("done"))
            .await
            .unwrap(),
    );
    wait_state(&pool, done, JobState::Completed).await;
    // Waiting in a queue nobody works here.
    node.jobs()
        .enqueue_many((0..3).map(|i| NewJob::new(mailer, Behave::tag(format!("{i}")))))
        .await
        .unwrap();
    let text = wait_until(
        "the queue depth gauge",
        SOON,
        Duration::from_millis(50),
        || {
            let text = node.render_metrics();
            async move {
                (metric(
                    &text,
                    r#"forge_job_queue_depth{queue="mailers",kind="mailer",state="available"}"#,
                ) == Some(3.0))
                .then_some(text)
            }
        },
    )
    .await
    .unwrap();
    assert!(text.contains("# HELP forge_job_queue_depth"), "{text}");
    wait_until(
        "the completed job to be pruned",
        SOON,
        Duration::from_millis(50),
        || async {
            client(&pool)
                .get(done)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await
    .unwrap();
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_crash_mid_job_neither_loses_nor_reruns_it() {
    let server = forge_testkit::PgServer::start().unwrap();
    let db = server.create_database().await.unwrap();
    let pool = db.pool().await.unwrap();
    sqlx::raw_sql(RUNS_TABLE_SQL).execute(&pool).await.unwrap();
    let node = start(job_config(db.url(), "a")).await;
    let during = inserted(
        node.jobs()
            .enqueue(
                plain,
                Behave {
                    sleep_ms: 1500,
                    ..Behave::tag("during")
                },
            )
            .await
            .unwrap(),
    );
    wait_until(
        "the job to start",
        SOON,
        Duration::from_millis(5),
        || async { (!runs(&pool, during).await.is_empty()).then_some(()) },
    )
    .await
    .unwrap();

    // Every session ends; the handler keeps running; the node reconnects.
    tokio::task::block_in_place(|| server.restart_immediate()).unwrap();

    // The outcome is recorded once the database is back. The scheduler leader's first pass
    // after the restart must not take the node for dead while it reconnects.
    let job = wait_state(&pool, during, JobState::Completed).await;
    assert_eq!(job.attempt, 1, "{job:?}");
    assert!(job.errors.is_empty(), "{:?}", job.errors);
    // Notifications flow again (the LISTEN session was restored).
    let after = inserted(
        node.jobs()
            .enqueue(plain, Behave::tag("after"))
            .await
            .unwrap(),
    );
    wait_state(&pool, after, JobState::Completed).await;
    assert_eq!(runs(&pool, during).await.len(), 1, "ran once");
    node.shutdown().await;
}

/// A job type whose kind collides with `plain`'s.
#[allow(non_camel_case_types)]
struct impostor;

impl Job for impostor {
    type Args = ();
    const KIND: &'static str = "plain";

    async fn run(&self, _: JobContext, _: ()) -> Result<(), JobError> {
        Ok(())
    }
}

/// A job type with a role name that cannot be a role.
#[allow(non_camel_case_types)]
struct bad_role;

impl Job for bad_role {
    type Args = ();
    const KIND: &'static str = "bad_role";

    fn options(&self) -> JobOptions {
        JobOptions::new().role("Not A Role")
    }

    async fn run(&self, _: JobContext, _: ()) -> Result<(), JobError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_job_declarations_and_config_are_clear_errors() {
    let url = "postgres://nobody@127.0.0.1:1/none";
    let err = Node::builder(job_config(url, "a"))
        .auto_register(false)
        .job(plain)
        .job(plain) // the same type twice: fine
        .job(impostor)
        .start()
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("two different job types have the kind `plain`"),
        "{err}"
    );

    let err = Node::builder(job_config(url, "a"))
        .auto_register(false)
        .job(bad_role)
        .start()
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("job `bad_role`") && err.contains("role"),
        "{err}"
    );

    let mut config = job_config(url, "a");
    config.jobs.queues = [("default".to_owned(), 0.into())].into_iter().collect();
    let err = Node::builder(config)
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("jobs.queues.default") && err.contains("concurrency 0"),
        "{err}"
    );

    let mut config = job_config(url, "a");
    config.cluster.membership.down_after = config.cluster.membership.drift_after;
    let err = Node::builder(config)
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("down_after"), "{err}");

    // Bad per-job input is an error at enqueue, not a panic or a bad row.
    let (_db, pool) = setup().await;
    let err = client(&pool)
        .enqueue_job(NewJob::new(plain, Behave::tag("x")).max_attempts(0))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_attempts must be at least 1"), "{err}");
    // So is it through the SQL function, which forge.jobs_live has no CHECK constraint behind
    // (migration 0017): for an attempt count and for a timeout.
    for (attempts, timeout_ms) in [(0, 1000), (3, 0)] {
        let err = sqlx::query(
            "SELECT * FROM forge.jobs_enqueue('forge', ARRAY['default'], ARRAY['plain'],
                 ARRAY['{}'::jsonb], ARRAY[0::smallint], ARRAY[NULL::timestamptz],
                 ARRAY[NULL::bigint], ARRAY[$1::integer], ARRAY[$2::bigint], ARRAY[NULL::text],
                 ARRAY[NULL::text], ARRAY[false], ARRAY[NULL::jsonb])",
        )
        .bind(attempts)
        .bind(timeout_ms as i64)
        .execute(&pool)
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("max_attempts and timeout_ms must be at least 1"),
            "({attempts}, {timeout_ms}): {err}"
        );
    }
    let err = client(&pool)
        .enqueue_job(NewJob::new(plain, Behave::tag("x")).queue("no spaces"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("queue name"), "{err}");
    let mut broken = BTreeMap::new();
    broken.insert(vec![1u8], 2u8); // a map with non-string keys cannot be JSON
    #[allow(non_camel_case_types)]
    struct map_job;
    impl Job for map_job {
        type Args = BTreeMap<Vec<u8>, u8>;
        const KIND: &'static str = "map_job";
        async fn run(&self, _: JobContext, _: Self::Args) -> Result<(), JobError> {
            Ok(())
        }
    }
    let err = client(&pool)
        .enqueue(map_job, broken)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("job arguments of `map_job`"), "{err}");
}

#[test]
fn backoff_grows_with_jitter_and_respects_its_cap() {
    let backoff = Backoff::exponential(Duration::from_secs(1)).capped(Duration::from_secs(10));
    for _ in 0..100 {
        let first = backoff.delay(1);
        assert!(first >= Duration::from_millis(750) && first <= Duration::from_millis(1250));
        let third = backoff.delay(3);
        assert!(third >= Duration::from_secs(3) && third <= Duration::from_secs(5));
        assert!(backoff.delay(30) <= Duration::from_secs(10));
        assert!(backoff.delay(u32::MAX) <= Duration::from_secs(10));
    }
    assert_eq!(
        Backoff::fixed(Duration::from_millis(50)).delay(7),
        Duration::from_millis(50)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_transaction_of_a_completed_attempt_cannot_complete_it_again() {
    let (db, pool) = setup().await;
    sqlx::raw_sql(EFFECTS_TABLE_SQL)
        .execute(&pool)
        .await
        .unwrap();
    let node = Node::builder(job_config(db.url(), "a"))
        .auto_register(false)
        .job(effect)
        .start()
        .await
        .unwrap();
    let id = inserted(
        node.jobs()
            .enqueue(
                effect,
                Effect {
                    transactional: true,
                    again: true,
                    ..Effect::default()
                },
            )
            .await
            .unwrap(),
    );
    let job = wait_state(&pool, id, JobState::Completed).await;
    node.shutdown().await;
    assert_eq!(job.attempt, 1, "{job:?}");
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM job_effects WHERE job_id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        effects, 1,
        "the retried transaction's completion must be refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_notified_while_a_claim_is_in_flight_is_claimed_next() {
    let (db, pool) = setup().await;
    // While the flag is set, a commit that completes a job (moves it to forge.jobs_done) sleeps
    // 1.5 s on the server: the worker's round trip (outcome + claim) stays in flight meanwhile.
    sqlx::raw_sql(
        "CREATE TABLE slow_commit (on_ boolean NOT NULL);
         INSERT INTO slow_commit VALUES (false);
         CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF (SELECT on_ FROM public.slow_commit) AND NEW.state = 'completed' THEN
                 PERFORM pg_sleep(1.5);
             END IF;
             RETURN NULL;
         END $$;
         CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON forge.jobs_done
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.slow_commit();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut config = job_config(db.url(), "a");
    config.jobs.queues = [("default".to_owned(), 1.into())].into_iter().collect();
    let node = start(config).await;
    let jobs = client(&pool);
    let first = inserted(jobs.enqueue(plain, Behave::tag("first")).await.unwrap());
    wait_state(&pool, first, JobState::Completed).await;

    sqlx::query("UPDATE slow_commit SET on_ = true")
        .execute(&pool)
        .await
        .unwrap();
    let second = inserted(jobs.enqueue(plain, Behave::tag("second")).await.unwrap());
    // The round trip recording the second job's completion (and claiming) is committing.
    wait_until(
        "the worker's round trip to be committing",
        SOON,
        Duration::from_millis(2),
        || async {
            sqlx::query_scalar::<_, i32>(
                "SELECT pid FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name LIKE 'forge:pool:a%' AND wait_event = 'PgSleep' LIMIT 1",
            )
            .fetch_optional(&pool)
            .await
            .unwrap()
        },
    )
    .await
    .unwrap();
    // Enqueued now: after that claim's snapshot, its notification heard while it is in flight.
    let third = inserted(jobs.enqueue(plain, Behave::tag("third")).await.unwrap());
    sqlx::query("UPDATE slow_commit SET on_ = false")
        .execute(&pool)
        .await
        .unwrap();
    wait_state(&pool, second, JobState::Completed).await;
    let job = wait_state(&pool, third, JobState::Completed).await;
    assert_eq!(job.attempt, 1, "{job:?}");
    node.shutdown().await;
}

/// Waits until job `id` has no row any more (completed with `completed_retention = "0s"`).
async fn wait_deleted(pool: &PgPool, id: JobId) {
    wait_until(
        &format!("job {id} to be deleted"),
        SOON,
        Duration::from_millis(10),
        || async {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM forge.jobs WHERE id = $1")
                .bind(id)
                .fetch_one(pool)
                .await
                .unwrap();
            (n == 0).then_some(())
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_completed_retention_zero_completed_jobs_are_deleted_and_the_rest_is_kept() {
    let (db, pool) = setup().await;
    sqlx::raw_sql(EFFECTS_TABLE_SQL)
        .execute(&pool)
        .await
        .unwrap();
    let mut config = job_config(db.url(), "a");
    config.jobs.completed_retention = Duration::ZERO;
    let node = Node::builder(config)
        .auto_register(false)
        .job(plain)
        .job(quick_retry)
        .job(effect)
        .start()
        .await
        .unwrap();
    let jobs = node.jobs();

    let done = inserted(jobs.enqueue(plain, Behave::tag("x")).await.unwrap());
    wait_deleted(&pool, done).await;
    assert_eq!(runs(&pool, done).await.len(), 1);

    // A unique key is free again once its job is deleted.
    let keyed = || NewJob::new(plain, Behave::tag("k")).unique_key("k");
    let first = inserted(jobs.enqueue_job(keyed()).await.unwrap());
    wait_deleted(&pool, first).await;
    let second = inserted(jobs.enqueue_job(keyed()).await.unwrap());
    assert_ne!(first, second);
    wait_deleted(&pool, second).await;

    // Retried, then completed: deleted after its second attempt.
    let retried = inserted(
        jobs.enqueue(
            quick_retry,
            Behave {
                fail_attempts: 1,
                ..Behave::tag("r")
            },
        )
        .await
        .unwrap(),
    );
    wait_deleted(&pool, retried).await;
    assert_eq!(runs(&pool, retried).await.len(), 2);

    // Dead jobs are kept (dead_retention).
    let dead = inserted(
        jobs.enqueue(
            plain,
            Behave {
                fail_attempts: 1,
                discard: true,
                ..Behave::tag("d")
            },
        )
        .await
        .unwrap(),
    );
    wait_state(&pool, dead, JobState::Dead).await;

    // Completed in the handler's transaction: deleted in that commit, exactly once (the
    // handler's second transaction is refused), and the worker's own report of the completion
    // then counts as recorded.
    let txn = inserted(
        jobs.enqueue(
            effect,
            Effect {
                transactional: true,
                again: true,
                ..Effect::default()
            },
        )
        .await
        .unwrap(),
    );
    wait_deleted(&pool, txn).await;
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM job_effects WHERE job_id = $1")
        .bind(txn)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(effects, 1, "the second transaction's completion is refused");

    let text = wait_until(
        "completion metrics",
        SOON,
        Duration::from_millis(10),
        || {
            let text = node.render_metrics();
            async move {
                (metric(
                    &text,
                    r#"forge_job_completed_total{queue="default",kind="effect"}"#,
                ) == Some(1.0)
                    && metric(
                        &text,
                        r#"forge_job_completed_total{queue="default",kind="plain"}"#,
                    ) == Some(3.0))
                .then_some(text)
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        metric(
            &text,
            r#"forge_job_completed_total{queue="default",kind="quick_retry"}"#
        ),
        Some(1.0),
        "{text}"
    );
    node.shutdown().await;
}

/// A row of `forge.jobs_step`: (id, claimed, attempt, state).
type StepRow = (i64, bool, Option<i32>, Option<String>);

/// The incarnation of the nodes that [`take_lane`] registers.
pub(crate) const INCARNATION: i64 = 1;

/// Takes the lane of queue `default` on node `node` (registered as incarnation [`INCARNATION`]
/// if it is not), as a worker does at its start; returns the generation its claims carry.
async fn take_lane(pool: &PgPool, node: &str) -> i64 {
    sqlx::query(
        "INSERT INTO forge.nodes (namespace, node_id, started_at, heartbeat_at, incarnation)
         VALUES ('forge', $1, now(), now(), $2) ON CONFLICT DO NOTHING",
    )
    .bind(node)
    .bind(INCARNATION)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query_scalar("SELECT forge.jobs_lane_take('forge', $1, 'default', $2, 1000)")
        .bind(node)
        .bind(INCARNATION)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// One `forge.jobs_step` call as a worker of node `node` on queue `default` (kind `plain`) that
/// has just taken its lane: reports `(id, attempt, outcome)`, then claims up to `limit` (all
/// started); rows sorted by id.
pub(crate) async fn step_as(
    pool: PgPool,
    node: &'static str,
    limit: i32,
    reports: Vec<(i64, i32, &'static str)>,
    keep_completed: bool,
) -> Vec<StepRow> {
    step_holding(pool, node, limit, reports, keep_completed, None).await
}

/// [`step_as`], the worker saying which other jobs it holds (`p_held`; `None`: not saying).
pub(crate) async fn step_holding(
    pool: PgPool,
    node: &'static str,
    limit: i32,
    reports: Vec<(i64, i32, &'static str)>,
    keep_completed: bool,
    held: Option<&[i64]>,
) -> Vec<StepRow> {
    let ids: Vec<i64> = reports.iter().map(|r| r.0).collect();
    let attempts: Vec<i32> = reports.iter().map(|r| r.1).collect();
    let states: Vec<&str> = reports.iter().map(|r| r.2).collect();
    let n = reports.len();
    let generation = take_lane(&pool, node).await;
    let mut rows: Vec<StepRow> = sqlx::query_as(
        "SELECT id, claimed, attempt, state FROM forge.jobs_step('forge', $1, 'default',
            NULL, NULL, NULL, $9, $10, ARRAY['plain'], $2, $2, '{}', $3, $4, $5, $6, $7, 20,
            NULL, NULL, NULL, $8, $11)",
    )
    .bind(node)
    .bind(limit)
    .bind(&ids)
    .bind(&attempts)
    .bind(&states)
    .bind(vec![Some(0_i64); n])
    .bind(vec![None::<serde_json::Value>; n])
    .bind(keep_completed)
    .bind(INCARNATION)
    .bind(generation)
    .bind(held)
    .fetch_all(&pool)
    .await
    .unwrap();
    rows.sort();
    rows
}

/// `forge.jobs_step` with completed jobs deleted: a batch of mixed outcomes, the same reports
/// sent again (their reply lost), and a report from a node the job is no longer running on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleting_step_records_mixed_outcomes_once_and_refuses_other_nodes() {
    let (_db, pool) = setup().await;
    let client = forge::jobs::Jobs::new(pool.clone(), &forge::LockNamespace::default());
    for tag in ["a", "b", "c"] {
        client.enqueue(plain, Behave::tag(tag)).await.unwrap();
    }
    let step = |node: &'static str, limit: i32, reports: Vec<(i64, i32, &'static str)>| {
        step_as(pool.clone(), node, limit, reports, false)
    };
    let claimed = step("x", 3, vec![]).await;
    assert_eq!(claimed.len(), 3, "{claimed:?}");
    let (a, b, c) = (claimed[0].0, claimed[1].0, claimed[2].0);
    let state = |id: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT state FROM forge.jobs WHERE id = $1")
                .bind(id)
                .fetch_optional(&pool)
                .await
                .unwrap()
        }
    };

    let mixed = vec![(a, 1, "completed"), (b, 1, "retryable")];
    assert_eq!(
        step("x", 0, mixed.clone()).await,
        vec![],
        "recorded as asked"
    );
    assert_eq!(state(a).await, None, "completed: deleted");
    assert_eq!(state(b).await.as_deref(), Some("retryable"));
    // Sent again: the deleted completion counts as recorded; the retry is no longer running.
    assert_eq!(
        step("x", 0, mixed).await,
        vec![(b, false, None, Some("refused".into()))]
    );
    // Only completions (the other branch), again and from another node.
    assert_eq!(step("x", 0, vec![(a, 1, "completed")]).await, vec![]);
    assert_eq!(
        step("y", 0, vec![(c, 1, "completed")]).await,
        vec![(c, false, None, Some("refused".into()))],
        "job c runs on x, not y"
    );
    assert_eq!(state(c).await.as_deref(), Some("running"));
    assert_eq!(step("x", 0, vec![(c, 1, "completed")]).await, vec![]);
    assert_eq!(state(c).await, None);
}

/// A worker's round trip reads forge.jobs by index and by TID only, whatever the statistics
/// say: here they say the table is empty (analyzed before 300 jobs arrived, as autovacuum
/// leaves an idle queue), which made the planner scan the whole table for every claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_read_no_whole_table_when_the_statistics_say_it_is_empty() {
    let (_db, pool) = setup().await;
    sqlx::query("ANALYZE forge.jobs")
        .execute(&pool)
        .await
        .unwrap();
    let client = forge::jobs::Jobs::new(pool.clone(), &forge::LockNamespace::default());
    client
        .enqueue_many((0..300).map(|i| NewJob::new(plain, Behave::tag(format!("{i}")))))
        .await
        .unwrap();
    let generation = take_lane(&pool, "x").await;
    // One session throughout, so that its own counts are flushed before each reading.
    let mut conn = pool.acquire().await.unwrap();
    let before = seq_scans(&mut conn).await;
    let mut reports = Vec::new();
    for _ in 0..3 {
        let ids: Vec<i64> = reports.iter().map(|r: &(i64, i32)| r.0).collect();
        let attempts: Vec<i32> = reports.iter().map(|r| r.1).collect();
        let n = ids.len();
        let claimed: Vec<(i64, i32)> = sqlx::query_as(
            "SELECT id, attempt FROM forge.jobs_step('forge', 'x', 'default', NULL, NULL, NULL,
                $6, $7, ARRAY['plain'], 10, 10, '{}', $1, $2, $3, $4, $5, 20, NULL, NULL, NULL, true)
              WHERE claimed",
        )
        .bind(&ids)
        .bind(&attempts)
        .bind(vec!["completed"; n])
        .bind(vec![None::<i64>; n])
        .bind(vec![None::<serde_json::Value>; n])
        .bind(INCARNATION)
        .bind(generation)
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        assert_eq!(claimed.len(), 10, "{claimed:?}");
        reports = claimed;
    }
    assert_eq!(
        seq_scans(&mut conn).await,
        before,
        "sequential scans of forge.jobs by round trips"
    );
}

/// Sequential scans of forge.jobs (its partitions: jobs_live and jobs_done) so far, this
/// session's own included.
async fn seq_scans(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar(
        "SELECT sum(seq_scan)::int8 FROM pg_stat_user_tables
          WHERE relid IN ('forge.jobs_live'::regclass, 'forge.jobs_done'::regclass)",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// Claims a new job as node `x`, then reports it completed while another transaction has
/// written its row with `write` (`$1` the job's id) and not committed yet; commits that write
/// once the report waits for it. Returns the report's rows and the job's state after it (`None`:
/// deleted); the job is deleted afterwards.
async fn report_racing_a_write(
    pool: &PgPool,
    keep: bool,
    write: &'static str,
) -> (Vec<StepRow>, Option<String>) {
    let client = forge::jobs::Jobs::new(pool.clone(), &forge::LockNamespace::default());
    let id = inserted(client.enqueue(plain, Behave::tag("r")).await.unwrap()).0;
    let claimed = step_as(pool.clone(), "x", 1, vec![], keep).await;
    assert_eq!(claimed.first().map(|r| r.0), Some(id), "{claimed:?}");

    let mut writer = pool.begin().await.unwrap();
    sqlx::query(write)
        .bind(id)
        .execute(&mut *writer)
        .await
        .unwrap();
    let reported = tokio::spawn(step_as(
        pool.clone(),
        "x",
        0,
        vec![(id, 1, "completed")],
        keep,
    ));
    wait_for_row_lock_wait(pool).await;
    writer.commit().await.unwrap();
    let rows = reported.await.unwrap();
    let state: Option<String> = sqlx::query_scalar("SELECT state FROM forge.jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM forge.jobs WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    (rows, state)
}

/// A completion report that has to wait for another writer of its job's row - here a rescue
/// that makes the job available again - checks its guard again on the version that writer
/// committed, and is refused, in both modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_that_waits_for_a_concurrent_rescue_is_refused() {
    let (_db, pool) = setup().await;
    for keep in [true, false] {
        let (rows, state) = report_racing_a_write(
            &pool,
            keep,
            "UPDATE forge.jobs SET state = 'available', node_id = NULL WHERE id = $1",
        )
        .await;
        let id = rows.first().map(|r| r.0).unwrap_or_default();
        assert_eq!(
            rows,
            vec![(id, false, None, Some("refused".into()))],
            "keep_completed = {keep}"
        );
        assert_eq!(
            state.as_deref(),
            Some("available"),
            "keep_completed = {keep}"
        );
    }
}

/// A completion report that has to wait for a writer that leaves the job running this attempt
/// on this node - a cancel request - is recorded all the same, in both modes. (Completions are
/// found without a row lock and written where they were found: a row written in between is
/// left out of that write, and found again, locked, by a second pass; without it the report
/// was refused and the job stayed running on a node that had finished it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_that_waits_for_a_concurrent_cancel_request_is_recorded() {
    let (_db, pool) = setup().await;
    for keep in [true, false] {
        let (rows, state) = report_racing_a_write(
            &pool,
            keep,
            "UPDATE forge.jobs SET cancel_requested = true WHERE id = $1",
        )
        .await;
        assert_eq!(rows, vec![], "recorded as asked; keep_completed = {keep}");
        let expected = keep.then_some("completed");
        assert_eq!(state.as_deref(), expected, "keep_completed = {keep}");
    }
}

/// A started mark of a job claimed ahead that has to wait for another writer of its job's row -
/// a cancel request - lands all the same: the attempt counts if its node dies. (Marks are
/// written where their lookup found the rows; without a second, locked pass a row written in
/// between was left out and the mark was lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_mark_that_waits_for_a_concurrent_cancel_request_lands() {
    let (_db, pool) = setup().await;
    let client = forge::jobs::Jobs::new(pool.clone(), &forge::LockNamespace::default());
    let id = inserted(client.enqueue(plain, Behave::tag("m")).await.unwrap()).0;
    let generation = take_lane(&pool, "x").await;
    let claimed: Vec<(i64, String)> = sqlx::query_as(
        "SELECT id, state FROM forge.jobs_step('forge', 'x', 'default', NULL, NULL, NULL, $1, $2,
            ARRAY['plain'], 1, 0, '{}', '{}', '{}', '{}', '{}', '{}', 20, NULL, NULL, NULL, true)",
    )
    .bind(INCARNATION)
    .bind(generation)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(claimed, vec![(id, "ahead".to_owned())]);

    let mut writer = pool.begin().await.unwrap();
    sqlx::query("UPDATE forge.jobs SET cancel_requested = true WHERE id = $1")
        .bind(id)
        .execute(&mut *writer)
        .await
        .unwrap();
    let marking = tokio::spawn({
        let pool = pool.clone();
        async move {
            sqlx::query(
                "SELECT * FROM forge.jobs_step('forge', 'x', 'default', NULL, NULL, NULL, $2, $3,
                    ARRAY['plain'], 0, 0, $1, '{}', '{}', '{}', '{}', '{}', 20, NULL, NULL, NULL, true)",
            )
            .bind(vec![id])
            .bind(INCARNATION)
            .bind(generation)
            .execute(&pool)
            .await
            .unwrap();
        }
    });
    wait_for_row_lock_wait(&pool).await;
    writer.commit().await.unwrap();
    marking.await.unwrap();
    let started: bool =
        sqlx::query_scalar("SELECT started_at IS NOT NULL FROM forge.jobs WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(started, "the started mark was lost");
}

/// Waits until a `forge.jobs_step` call waits for another transaction's row lock.
async fn wait_for_row_lock_wait(pool: &PgPool) {
    wait_for_lock_waiter(
        pool,
        "the round trip to wait for the other writer's row lock",
        "query LIKE $1",
        "%jobs_step%",
    )
    .await;
}

/// Waits until a session that `matches` (an SQL condition on `pg_stat_activity`, `$1` being
/// `arg`) waits for a lock.
pub(crate) async fn wait_for_lock_waiter(pool: &PgPool, what: &str, matches: &str, arg: &str) {
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND {matches}"
    );
    wait_until(what, SOON, Duration::from_millis(5), || async {
        let waiting: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone()))
            .bind(arg)
            .fetch_one(pool)
            .await
            .unwrap();
        (waiting > 0).then_some(())
    })
    .await
    .unwrap();
}

/// Commits of claims of jobs tagged with a given tag, made to wait (as a commit waits for a
/// stalled synchronous standby: the claim holds its rows and its worker's lane lock, invisible
/// to others) until [`Stall::release`]: a deferred trigger on `forge.jobs` waits for an advisory
/// lock that the stall's own connection holds.
pub(crate) struct Stall {
    conn: sqlx::PgConnection,
}

/// The advisory lock key a [`Stall`] holds.
const STALL_KEY: i64 = 4242;

/// Stalls the commits of claims of jobs tagged `tag` in the database at `url`.
pub(crate) async fn stall_commits(url: &str, tag: &str) -> Stall {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION stall_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_advisory_xact_lock({STALL_KEY}); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER stall_commit AFTER UPDATE ON forge.jobs
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
             WHEN (NEW.state = 'running' AND NEW.args ->> 'tag' = '{tag}')
             EXECUTE FUNCTION stall_commit();
         SELECT pg_advisory_lock({STALL_KEY});"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    Stall { conn }
}

impl Stall {
    /// Waits until a session named `application_name` waits for this stall.
    pub(crate) async fn wait_until_waiting(&self, pool: &PgPool, application_name: &str) {
        wait_for_lock_waiter(
            pool,
            &format!("a commit of {application_name} to wait for the stall"),
            "application_name = $1 AND wait_event = 'advisory'",
            application_name,
        )
        .await;
    }

    /// Lets every stalled commit, and every later one, go.
    pub(crate) async fn release(mut self) {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(STALL_KEY)
            .execute(&mut self.conn)
            .await
            .unwrap();
    }
}

/// A job that enqueues a `plain` job through its context's client.
#[derive(Clone, Copy, Debug)]
struct Chained;

impl forge::jobs::Job for Chained {
    type Args = ();
    const KIND: &'static str = "chained";

    async fn run(&self, ctx: JobContext, _args: ()) -> Result<(), JobError> {
        let mut tx = ctx.pool().begin().await?;
        ctx.jobs()
            .enqueue_in(&mut *tx, plain, Behave::tag("from a job"))
            .await?;
        ctx.complete(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// `CronContext::jobs()` and `JobContext::jobs()` are the node's job client: a cron enqueues
/// in its tick's fenced transaction, a job in its own, and both count what they enqueue in
/// the node's metrics (`forge_job_enqueued_total`), as `node.jobs()` does - a client pieced
/// together with `Jobs::new` counted nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_enqueue_through_the_nodes_client() {
    let (db, pool) = setup().await;
    let once = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let enqueues = CronJob::new(
        "enqueues",
        Schedule::parse("* * * * * *").unwrap(),
        move |ctx: CronContext| {
            let once = once.clone();
            async move {
                if once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    return Ok(());
                }
                let mut tx = ctx.fenced_transaction().await?;
                ctx.jobs().enqueue_in(&mut *tx, Chained, ()).await?;
                ctx.complete(&mut tx).await?;
                tx.commit().await?;
                Ok::<_, forge::CronError>(())
            }
        },
    );
    let node = Node::builder(job_config(db.url(), "a"))
        .auto_register(false)
        .cron(enqueues)
        .job(Chained)
        .job(plain)
        .start()
        .await
        .unwrap();
    wait_until(
        "the chained job's follow-up to run",
        SOON,
        Duration::from_millis(20),
        || async {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM forge.jobs WHERE kind = 'plain' AND state = 'completed'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (n == 1).then_some(())
        },
    )
    .await
    .unwrap();
    let text = node.render_metrics();
    for line in [
        r#"forge_job_enqueued_total{queue="default",kind="chained"} 1"#,
        r#"forge_job_enqueued_total{queue="default",kind="plain"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    node.shutdown().await;
}
