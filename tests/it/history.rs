//! Completed jobs kept in `forge.jobs_done` (the partition of `forge.jobs` for completed jobs): a
//! kept completion moves the job's whole row there, by the worker's round trip and by the
//! handler's own transaction; an operator's retry moves it back and it runs again; the compactor
//! prunes it by age, found by id without an index by age; and every column of a job is copied
//! by the move.

use std::time::Duration;

use forge::inspect::{Change, Workload};
use forge::jobs::{JobId, JobState, NewJob};
use forge::{LockNamespace, Node};
use forge_testkit::wait_until;
use sqlx::PgPool;

use crate::jobs::{Behave, inserted, job_config, plain, setup, wait_state};
use crate::support::*;

/// The partition that holds job `id` (`forge.jobs_live` or `forge.jobs_done`), and how many
/// rows `forge.jobs` has for it.
async fn partition(pool: &PgPool, id: JobId) -> (Option<String>, i64) {
    sqlx::query_as("SELECT min(tableoid::regclass::text), count(*) FROM forge.jobs WHERE id = $1")
        .bind(id.0)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_completion_moves_the_job_to_jobs_done_a_retry_moves_it_back_and_the_compactor_prunes_it()
 {
    let (db, pool) = setup().await;
    let mut config = job_config(db.url(), "a");
    config.node.roles = Some(vec!["scheduler".into(), "log_compactor".into()]);
    config.jobs.completed_retention = Duration::from_secs(3600);
    config.cluster.compaction_interval = Duration::from_millis(200);
    let node = Node::builder(config)
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .expect("node starts");
    let jobs = node.jobs();

    // Completed by the worker's round trip, with every field it had.
    let id = inserted(
        jobs.enqueue_job(
            NewJob::new(plain, Behave::tag("moved"))
                .priority(3)
                .max_attempts(4)
                .timeout(Duration::from_secs(30)),
        )
        .await
        .unwrap(),
    );
    let done = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(
        partition(&pool, id).await,
        (Some("forge.jobs_done".to_owned()), 1)
    );
    assert_eq!(
        (done.priority, done.max_attempts, done.attempt),
        (3, Some(4), 1),
        "{done:?}"
    );
    assert_eq!(done.timeout, Some(Duration::from_secs(30)));
    assert_eq!(done.node_id.as_deref(), Some("a"));
    assert!(
        done.finished_at.is_some() && done.attempted_at.is_some(),
        "{done:?}"
    );

    // An operator's retry moves it back; it runs and completes again, one row throughout.
    let workload = Workload::new(pool.clone(), LockNamespace::default());
    assert_eq!(workload.retry_job(id, "op").await.unwrap(), Change::Applied);
    let again = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(again.attempt, 2, "{again:?}");
    assert_eq!(
        partition(&pool, id).await,
        (Some("forge.jobs_done".to_owned()), 1)
    );

    // Pruned by age (the compactor's next pass once it is older than the retention): as if it
    // had been enqueued and completed two hours ago.
    sqlx::query(
        "UPDATE forge.jobs SET created_at = created_at - interval '2 hours',
                               finished_at = finished_at - interval '2 hours' WHERE id = $1",
    )
    .bind(id.0)
    .execute(&pool)
    .await
    .unwrap();
    wait_until(
        "the completed job to be pruned",
        SOON,
        Duration::from_millis(50),
        || async { (partition(&pool, id).await.1 == 0).then_some(()) },
    )
    .await
    .unwrap();
    node.shutdown().await;
}

/// `forge.jobs_move_done` and `forge.jobs_move_live` (a retry's move back) name each column of
/// `forge.jobs` but those they set: a column added by a migration and not copied there would be
/// lost at every kept completion, or at every retry of a completed job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_moves_between_partitions_copy_every_column_of_a_job() {
    let (_db, pool) = setup().await;
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT attname::text FROM pg_attribute
          WHERE attrelid = 'forge.jobs'::regclass AND attnum > 0 AND NOT attisdropped
          ORDER BY attnum",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(columns.len() >= 30, "{columns:?}");
    let moves: [(&str, &[(&str, &str)]); 2] = [
        (
            "forge.jobs_move_done(tid[], xid[], text)",
            &[
                ("state", "'completed'"),
                ("finished_at", "clock_timestamp()"),
                ("phase", "'completed'"),
            ],
        ),
        (
            "forge.jobs_move_live(text, bigint[])",
            &[
                ("state", "'available'"),
                ("run_at", "clock_timestamp()"),
                ("max_attempts", "greatest(d.max_attempts, d.attempt + 1)"),
                ("finished_at", "NULL"),
                ("cancel_requested", "false"),
                ("phase", "'ready'"),
            ],
        ),
    ];
    for (function, set) in moves {
        let source: String =
            sqlx::query_scalar("SELECT prosrc FROM pg_proc WHERE oid = $1::regprocedure")
                .bind(function)
                .fetch_one(&pool)
                .await
                .unwrap();
        // The insert names no columns: each must be copied (or set) in the table's order, in
        // its select list.
        let list = &source[source
            .find("SELECT d.id")
            .expect("the insert's select list")..];
        let mut at = 0;
        for column in &columns {
            let expression = match set.iter().find(|(c, _)| c == column) {
                Some((_, expression)) => expression.to_string(),
                None => format!("d.{column}"),
            };
            let found = [",", "\n"].iter().find_map(|end| {
                list[at..]
                    .find(&format!("{expression}{end}"))
                    .map(|i| at + i + expression.len())
            });
            at = found.unwrap_or_else(|| {
                panic!("{function} does not copy {column} ({expression}) in the table's order")
            });
        }
    }
}

/// Pruning by age without an index by age (`forge.jobs_prune`): of the completed jobs, those
/// that finished before the cutoff go - also one created after a job kept longer (a job
/// created long ago that completed recently, which the pass reads and keeps) - and none of
/// another namespace's or finished since; cancelled jobs go by their own index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_finds_completed_jobs_by_id_past_the_ones_kept_longer() {
    let (_db, pool) = setup().await;
    // (tag, namespace, state, created so long ago, finished so long ago), in id order.
    let rows = [
        ("expired", "forge", "completed", "3 hours", "2 hours"),
        ("kept longer", "forge", "completed", "3 hours", "10 minutes"),
        (
            "another namespace",
            "other",
            "completed",
            "3 hours",
            "2 hours",
        ),
        (
            "expired after one kept",
            "forge",
            "completed",
            "2 hours",
            "90 minutes",
        ),
        ("cancelled", "forge", "cancelled", "2 hours", "90 minutes"),
        ("recent", "forge", "completed", "10 minutes", "5 minutes"),
    ];
    for (tag, namespace, state, created, finished) in rows {
        sqlx::query(
            "INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at, created_at,
                                     finished_at)
             VALUES ($1, 'q', 'k', jsonb_build_object('tag', $2::text), $3, now(),
                     now() - $4::interval, now() - $5::interval)",
        )
        .bind(namespace)
        .bind(tag)
        .bind(state)
        .bind(created)
        .bind(finished)
        .execute(&pool)
        .await
        .unwrap();
    }
    let pruned: i64 = sqlx::query_scalar(
        "SELECT forge.jobs_prune('forge', ARRAY['completed', 'cancelled'], 3600000, 100)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let left: Vec<String> =
        sqlx::query_scalar("SELECT args ->> 'tag' FROM forge.jobs WHERE kind = 'k' ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        (pruned, left),
        (
            3,
            vec![
                "kept longer".to_owned(),
                "another namespace".to_owned(),
                "recent".to_owned()
            ]
        )
    );
}

/// An operator's retry of a completed job moves it back to `forge.jobs_live` as one delete and
/// one insert (`forge.jobs_move_live`): a transaction waiting for its row meanwhile (here an
/// operator's delete; the compactor's prune likewise) finds it gone and goes on. An update that
/// PostgreSQL moves between partitions made that transaction fail ("already moved to another
/// partition").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_waiting_for_a_completed_job_that_a_retry_moves_back_goes_on_without_it() {
    let (_db, pool) = setup().await;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at, finished_at)
         VALUES ('forge', 'q', 'k', '{}', 'completed', now(), now()) RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let mut retry = pool.begin().await.unwrap();
    let retried: Vec<i64> = sqlx::query_scalar("SELECT forge.jobs_retry_now('forge', ARRAY[$1])")
        .bind(id)
        .fetch_all(&mut *retry)
        .await
        .unwrap();
    assert_eq!(retried, vec![id]);
    let delete = tokio::spawn({
        let pool = pool.clone();
        async move {
            sqlx::query("DELETE FROM forge.jobs WHERE namespace = 'forge' AND id = $1")
                .bind(id)
                .execute(&pool)
                .await
                .map(|done| done.rows_affected())
        }
    });
    crate::jobs::wait_for_lock_waiter(
        &pool,
        "the delete to wait for the retry's row lock",
        "query LIKE $1",
        "DELETE FROM forge.jobs WHERE namespace%",
    )
    .await;
    retry.commit().await.unwrap();
    // The delete's snapshot predates the retry's commit: it saw the completed row only.
    assert_eq!(delete.await.unwrap().map_err(|e| e.to_string()), Ok(0));
    assert_eq!(
        partition(&pool, JobId(id)).await,
        (Some("forge.jobs_live".to_owned()), 1)
    );
    let state: String = sqlx::query_scalar("SELECT state FROM forge.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(state, "available");
}
