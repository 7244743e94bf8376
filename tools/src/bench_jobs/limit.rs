//! The limit: FORGE's SQL alone, and the least SQL any durable queue needs, driven in loops.

use forge::jobs::{Jobs, NewJob};
use tokio::time::Instant;

use super::harness::{Bench, count};
use super::meter::{Cost, Meter, loops_done};
use super::node::noop;
use super::{BoxError, Mode};

/// FORGE's SQL alone: `forge.jobs_step`, the statement FORGE's workers send, driven in a loop
/// with nothing around it (no node, no handlers, no notifications) on `connections`
/// connections, each recording the previous batch as completed (kept as `completed` rows, or
/// deleted: `mode`) while claiming the next `batch`. Returns jobs/s from the first claim to
/// the last completion (database clock; by the wall clock around the loops when completed
/// jobs leave no row).
pub(super) async fn forge_alone(
    bench: &mut Bench,
    connections: usize,
    batch: i32,
    total: usize,
    mode: Mode,
) -> Result<(f64, Cost), BoxError> {
    let keep = mode == Mode::Kept;
    let (db, pool, _config) = bench.database(mode).await?;
    // The enqueue and the loops on connections of their own, each closed after it (see Meter).
    let writers = db.pool().await?;
    let jobs = Jobs::new(writers.clone(), &forge::LockNamespace::default());
    for chunk in 0..total.div_ceil(1000) {
        let n = 1000.min(total - chunk * 1000);
        jobs.enqueue_many((0..n).map(|_| NewJob::new(noop, ())))
            .await?;
    }
    writers.close().await;
    sqlx::query("ANALYZE forge.jobs").execute(&pool).await?;
    // Each loop is a node's worker: the node registered, its lane taken (the identity its
    // claims carry).
    let mut generations = Vec::new();
    for c in 0..connections {
        sqlx::query(
            "INSERT INTO forge.nodes (namespace, node_id, started_at, heartbeat_at, incarnation)
             VALUES ('forge', $1, now(), now(), 1)",
        )
        .bind(format!("limit{c}"))
        .execute(&pool)
        .await?;
        let generation: i64 =
            sqlx::query_scalar("SELECT forge.jobs_lane_take('forge', $1, 'default', 1, 1000)")
                .bind(format!("limit{c}"))
                .fetch_one(&pool)
                .await?;
        generations.push(generation);
    }
    let m0 = Meter::read(&pool).await?;
    let loopers = db.pool().await?;
    let began = Instant::now();
    let mut loops = Vec::new();
    for (c, generation) in generations.into_iter().enumerate() {
        let pool = loopers.clone();
        loops.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            let node = format!("limit{c}");
            let (mut ids, mut attempts): (Vec<i64>, Vec<i32>) = (Vec::new(), Vec::new());
            loop {
                let n = ids.len();
                // (p_held '{}': the loop holds nothing but the jobs it reports, as a worker says.)
                let rows: Vec<(i64, bool, Option<i32>)> = sqlx::query_as(
                    "SELECT id, claimed, attempt FROM forge.jobs_step('forge', $1, 'default', NULL, NULL, NULL,
                        1, $9, ARRAY['noop'], $2, $2, '{}', $3, $4, $5, $6, $7, 20, NULL, NULL, NULL, $8,
                        '{}')",
                )
                .bind(&node)
                .bind(batch)
                .bind(&ids)
                .bind(&attempts)
                .bind(vec!["completed"; n])
                .bind(vec![None::<i64>; n])
                .bind(vec![None::<serde_json::Value>; n])
                .bind(keep)
                .bind(generation)
                .fetch_all(&mut *conn)
                .await?;
                (ids, attempts) = rows
                    .into_iter()
                    .filter(|r| r.1)
                    .map(|r| (r.0, r.2.unwrap_or(1)))
                    .unzip();
                if ids.is_empty() {
                    return Ok::<(), BoxError>(());
                }
            }
        }));
    }
    let (wall, cost) = loops_done(loops, began, &pool, loopers, &m0, total).await?;
    let unfinished = count(
        &pool,
        "SELECT count(*) FROM forge.jobs WHERE queue = 'default' AND state <> 'completed'",
    )
    .await?;
    if unfinished != 0 {
        return Err(format!("limit: {unfinished} of {total} jobs not completed").into());
    }
    if !keep {
        return Ok((total as f64 / wall, cost));
    }
    let span: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(finished_at) - min(attempted_at))::float8 FROM forge.jobs
          WHERE queue = 'default'",
    )
    .fetch_one(&pool)
    .await?;
    Ok((total as f64 / span, cost))
}

/// The limit of any design (issue 26): the least SQL a durable queue needs on this server, on
/// `connections` connections. One table with its primary key and one partial index, of the
/// jobs not claimed yet; one insert per job (1,000 per statement, as FORGE's `enqueue_many`),
/// then round trips as FORGE's workers make them: each claims the next `batch` (`FOR UPDATE
/// SKIP LOCKED`, one update: a new row version and its primary-key entry) and records the
/// previous batch's completions in the same statement and transaction (a HOT update of a
/// column no index names, kept; or a delete), committed with `synchronous_commit = on`. The
/// table has fillfactor 50, so that a completion finds room on its row's page (a HOT update).
/// Nothing else: no rescue of a claim whose worker died (no index of running jobs), no unique
/// keys, no figures, no notifications, no fencing. Returns jobs/s from the first round trip to
/// the last.
pub(super) async fn minimal_limit(
    bench: &mut Bench,
    connections: usize,
    batch: i32,
    total: usize,
    mode: Mode,
) -> Result<(f64, f64, Cost), BoxError> {
    let (db, pool, _config) = bench.database(mode).await?;
    sqlx::raw_sql(
        "CREATE SCHEMA minimal;
         CREATE TABLE minimal.jobs (
             id          bigserial   PRIMARY KEY,
             queue       text        NOT NULL,
             priority    smallint    NOT NULL DEFAULT 0,
             run_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
             args        jsonb       NOT NULL,
             claimed_by  text,
             attempt     integer     NOT NULL DEFAULT 0,
             finished_at timestamptz
         ) WITH (fillfactor = 50);
         CREATE INDEX minimal_claim ON minimal.jobs (queue, priority, run_at, id)
             WHERE claimed_by IS NULL;",
    )
    .execute(&pool)
    .await?;
    // The inserts and the loops on connections of their own, each closed after it (see Meter).
    let writers = db.pool().await?;
    let started = Instant::now();
    for chunk in 0..total.div_ceil(1000) {
        let n = 1000.min(total - chunk * 1000) as i64;
        sqlx::query(
            "INSERT INTO minimal.jobs (queue, args) SELECT 'default', 'null' FROM generate_series(1, $1)",
        )
        .bind(n)
        .execute(&writers)
        .await?;
    }
    let insert_per_s = total as f64 / started.elapsed().as_secs_f64();
    writers.close().await;
    sqlx::query("ANALYZE minimal.jobs").execute(&pool).await?;
    let m0 = Meter::read(&pool).await?;
    let complete = match mode {
        Mode::Kept => {
            "UPDATE minimal.jobs SET finished_at = clock_timestamp()
              WHERE id = ANY ($1) AND claimed_by = $2 AND finished_at IS NULL"
        }
        Mode::Deleted => "DELETE FROM minimal.jobs WHERE id = ANY ($1) AND claimed_by = $2",
    };
    let step = format!(
        "WITH done AS ({complete}),
              claimed AS (
                  UPDATE minimal.jobs j SET claimed_by = $2, attempt = j.attempt + 1
                   WHERE j.id = ANY (ARRAY(
                         SELECT c.id FROM minimal.jobs c
                          WHERE c.queue = 'default' AND c.claimed_by IS NULL
                          ORDER BY c.priority, c.run_at, c.id
                          LIMIT $3 FOR UPDATE SKIP LOCKED))
                  RETURNING j.id)
         SELECT id FROM claimed"
    );
    let loopers = db.pool().await?;
    let began = Instant::now();
    let mut loops = Vec::new();
    for c in 0..connections {
        let pool = loopers.clone();
        let step = step.clone();
        loops.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            sqlx::query("SET synchronous_commit = on")
                .execute(&mut *conn)
                .await?;
            let node = format!("limit{c}");
            let mut ids: Vec<i64> = Vec::new();
            loop {
                // The previous batch's completions, and the next claim: one round trip.
                ids = sqlx::query_scalar(sqlx::AssertSqlSafe(step.as_str()))
                    .bind(&ids)
                    .bind(&node)
                    .bind(batch)
                    .fetch_all(&mut *conn)
                    .await?;
                if ids.is_empty() {
                    return Ok::<(), BoxError>(());
                }
            }
        }));
    }
    let (wall, cost) = loops_done(loops, began, &pool, loopers, &m0, total).await?;
    let unfinished: i64 = sqlx::query_scalar(match mode {
        Mode::Kept => "SELECT count(*) FROM minimal.jobs WHERE finished_at IS NULL",
        Mode::Deleted => "SELECT count(*) FROM minimal.jobs",
    })
    .fetch_one(&pool)
    .await?;
    if unfinished != 0 {
        return Err(format!("minimal limit: {unfinished} of {total} jobs not completed").into());
    }
    Ok((total as f64 / wall, insert_per_s, cost))
}
