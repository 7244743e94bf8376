//! Snooze (`JobError::snooze`: run again later without counting the attempt, bounded by
//! `max_snoozes`) and custom retry backoff (`#[job(backoff = my_fn)]`), on in-process nodes.

use std::time::Duration;

use forge::jobs::{Backoff, Job, JobOptions, JobState};
use forge::{Config, JobContext, JobError, Node};
use sqlx::PgPool;

use crate::jobs::{inserted, job_config, metric, setup, wait_state};
use crate::support::*;

/// Attempts as the handlers saw them: (job, attempt, seconds since the epoch).
const NAPS_SQL: &str = "CREATE TABLE naps (
    job_id  bigint  NOT NULL,
    attempt integer NOT NULL,
    at      float8  NOT NULL DEFAULT extract(epoch FROM clock_timestamp())
)";

/// Records the attempt, and returns how many attempts of this job ran so far (this one too).
async fn nap(ctx: &JobContext) -> Result<i64, JobError> {
    sqlx::query("INSERT INTO naps (job_id, attempt) VALUES ($1, $2)")
        .bind(ctx.id().0)
        .bind(ctx.attempt() as i32)
        .execute(ctx.pool())
        .await?;
    let count = sqlx::query_scalar("SELECT count(*) FROM naps WHERE job_id = $1")
        .bind(ctx.id().0)
        .fetch_one(ctx.pool())
        .await?;
    Ok(count)
}

/// A job type `$name` running `$run` (not `#[job]`: this binary's nodes would all register it).
macro_rules! job_type {
    ($name:ident, $args:ty, $options:expr, $run:ident) => {
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug)]
        pub(crate) struct $name;

        impl Job for $name {
            type Args = $args;
            const KIND: &'static str = stringify!($name);

            fn options(&self) -> JobOptions {
                $options
            }

            async fn run(&self, ctx: JobContext, args: $args) -> Result<(), JobError> {
                $run(ctx, args).await
            }
        }
    };
}

job_type!(
    napper,
    (i64, u64),
    JobOptions::new()
        .max_attempts(2)
        .max_snoozes(3)
        .backoff(Backoff::fixed(Duration::from_millis(1))),
    nap_then_fail_once
);

/// Snoozes for `snooze_ms` on its first `snoozes` attempts, then fails once (retried at
/// once), then completes. Two attempts allowed, three snoozes.
async fn nap_then_fail_once(
    ctx: JobContext,
    (snoozes, snooze_ms): (i64, u64),
) -> Result<(), JobError> {
    let ran = nap(&ctx).await?;
    if ran <= snoozes {
        return Err(JobError::snooze(Duration::from_millis(snooze_ms)));
    }
    if ran == snoozes + 1 {
        return Err(JobError::retry("failed once"));
    }
    Ok(())
}

job_type!(quick, (), JobOptions::new(), nap_once);

/// Completes at once.
async fn nap_once(ctx: JobContext, _: ()) -> Result<(), JobError> {
    nap(&ctx).await?;
    Ok(())
}

/// The delay its error asks for (`"wait <ms>"`), plus one millisecond per attempt.
fn as_asked(attempt: u32, error: &JobError) -> Duration {
    let ms: u64 = error
        .message()
        .strip_prefix("wait ")
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0);
    Duration::from_millis(ms + u64::from(attempt))
}

job_type!(
    picky,
    Vec<u64>,
    JobOptions::new()
        .backoff(Backoff::custom(as_asked))
        .max_attempts(5),
    fail_asking
);

/// Fails each attempt asking for the next delay of `waits_ms`, then completes.
async fn fail_asking(ctx: JobContext, waits_ms: Vec<u64>) -> Result<(), JobError> {
    let ran = nap(&ctx).await? as usize;
    match waits_ms.get(ran - 1) {
        Some(ms) => Err(JobError::retry(format_args!("wait {ms}"))),
        None => Ok(()),
    }
}

async fn start(config: Config) -> Node {
    Node::builder(config)
        .auto_register(false)
        .job(napper)
        .job(quick)
        .job(picky)
        .start()
        .await
        .expect("node starts")
}

/// The start times of a job's attempts, in order.
async fn nap_times(pool: &PgPool, id: forge::jobs::JobId) -> Vec<(i32, f64)> {
    sqlx::query_as("SELECT attempt, at FROM naps WHERE job_id = $1 ORDER BY at")
        .bind(id.0)
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn setup_naps() -> (forge_testkit::TestDatabase, PgPool) {
    let (db, pool) = setup().await;
    sqlx::raw_sql(NAPS_SQL).execute(&pool).await.unwrap();
    (db, pool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snooze_counts_no_attempt_shows_in_the_history_and_frees_its_slot() {
    let (db, pool) = setup_naps().await;
    let mut config = job_config(db.url(), "a");
    // One job at a time: a snoozing job must give its slot to the next one.
    config.jobs.default_concurrency = 1;
    let node = start(config).await;

    // Three snoozes of 300 ms, then a failure, with two attempts allowed: the failure is
    // retried (the snoozes counted no attempt), and the job completes.
    let id = inserted(node.jobs().enqueue(napper, (3, 300)).await.unwrap());
    let job = wait_state(&pool, id, JobState::Completed).await;
    let reasons: Vec<_> = job.errors.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(
        reasons,
        ["snoozed", "snoozed", "snoozed", "error"],
        "{:?}",
        job.errors
    );
    assert_eq!(job.errors[0].error, "snoozed for 300ms");
    assert_eq!(job.errors[0].node.as_deref(), Some("a"));
    let naps = nap_times(&pool, id).await;
    assert_eq!(naps.len(), 5, "{naps:?}");
    for pair in naps[..4].windows(2) {
        let gap = pair[1].1 - pair[0].1;
        assert!(
            gap >= 0.3,
            "a snooze of 300 ms ran again after {gap}s: {naps:?}"
        );
    }

    // A long snooze frees the only slot: a job enqueued after it runs meanwhile.
    let sleeper = inserted(node.jobs().enqueue(napper, (1, 60_000)).await.unwrap());
    wait_state(&pool, sleeper, JobState::Scheduled).await;
    let next = inserted(node.jobs().enqueue(quick, ()).await.unwrap());
    wait_state(&pool, next, JobState::Completed).await;
    let job = client(&pool).get(sleeper).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Scheduled, "{job:?}");
    assert_eq!(job.attempt, 1);
    assert_eq!(
        job.max_attempts,
        Some(3),
        "the snoozed attempt is given back"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_snoozed_more_than_max_snoozes_is_dead_lettered_saying_so() {
    let (db, pool) = setup_naps().await;
    let node = start(job_config(db.url(), "a")).await;
    // The type's max_snoozes = 3 (not `[jobs] max_snoozes`, 100): the fourth snooze
    // dead-letters it, whatever attempts are left.
    let id = inserted(node.jobs().enqueue(napper, (10, 10)).await.unwrap());
    let job = wait_state(&pool, id, JobState::Dead).await;
    assert_eq!(nap_times(&pool, id).await.len(), 4);
    let reasons: Vec<_> = job.errors.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(
        reasons,
        ["snoozed", "snoozed", "snoozed", "too_many_snoozes"],
        "{:?}",
        job.errors
    );
    let last = &job.errors[3].error;
    assert!(
        last.contains("snoozed more than max_snoozes (3) times"),
        "{last}"
    );
    // Counted as other dead jobs are; the three recorded snoozes count, the refused fourth
    // does not.
    let labels = r#"{queue="default",kind="napper"}"#;
    wait_until_metric(&node, &format!("forge_job_dead_total{labels}"), 1.0).await;
    wait_until_metric(&node, &format!("forge_job_snoozed_total{labels}"), 3.0).await;
    // Operators see the count: the job's view (the admin API serves it as it is) and
    // `forge jobs show`.
    assert_eq!(job.snoozes, 3, "{job:?}");
    let shown = crate::cli::forge(db.url(), &["jobs", "show", &id.0.to_string()]).await;
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert!(
        shown
            .stdout
            .lines()
            .any(|line| line.starts_with("snoozes") && line.contains(" 3 (each gave")),
        "{}",
        shown.stdout
    );

    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_snoozes_of_the_config_bounds_a_type_that_declares_none() {
    let (db, pool) = setup_naps().await;
    let mut config = job_config(db.url(), "a");
    config.jobs.max_snoozes = 0;
    let node = Node::builder(config)
        .auto_register(false)
        .job(fidget)
        .start()
        .await
        .unwrap();
    let id = inserted(node.jobs().enqueue(fidget, ()).await.unwrap());
    let job = wait_state(&pool, id, JobState::Dead).await;
    assert_eq!(job.errors.len(), 1, "{:?}", job.errors);
    assert_eq!(job.errors[0].reason, "too_many_snoozes");
    assert!(
        job.errors[0].error.contains("max_snoozes (0)"),
        "{:?}",
        job.errors
    );
    node.shutdown().await;
}

job_type!(fidget, (), JobOptions::new(), always_snooze);

/// Always snoozes (fidget declares no max_snoozes).
async fn always_snooze(_: JobContext, _: ()) -> Result<(), JobError> {
    Err(JobError::snooze(Duration::from_millis(10)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_backoff_decides_each_retrys_delay_from_the_attempt_and_the_error() {
    let (db, pool) = setup_naps().await;
    let node = start(job_config(db.url(), "a")).await;
    let id = inserted(
        node.jobs()
            .enqueue(picky, vec![1_200, 50, 600])
            .await
            .unwrap(),
    );
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(job.attempt, 4);
    let naps = nap_times(&pool, id).await;
    let gaps: Vec<f64> = naps.windows(2).map(|w| w[1].1 - w[0].1).collect();
    // 1.2 s, 50 ms, 600 ms as asked (no jitter); pickup adds a little, a loaded machine more,
    // so the upper bounds only rule out the default backoff's and each other's delays.
    assert!((1.2..1.2 + 0.5).contains(&gaps[0]), "{gaps:?}");
    assert!((0.05..0.5).contains(&gaps[1]), "{gaps:?}");
    assert!((0.6..1.1).contains(&gaps[2]), "{gaps:?}");
    node.shutdown().await;
}

async fn wait_until_metric(node: &Node, name: &str, value: f64) {
    forge_testkit::wait_until(
        &format!("{name} to be {value}"),
        SOON,
        Duration::from_millis(10),
        || {
            let text = node.render_metrics();
            async move { (metric(&text, name) == Some(value)).then_some(()) }
        },
    )
    .await
    .unwrap();
}
