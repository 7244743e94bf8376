//! What the pool's guard costs per acquire.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::time::Instant;

use super::harness::Bench;
use super::{BoxError, Mode};

/// Cycles of acquire, `SELECT 1`, release on `pool`, `cycles` on each of `tasks` tasks:
/// microseconds per cycle (wall clock over all of them) and per acquire call (the mean wait).
pub(super) async fn pool_cycles(
    pool: &PgPool,
    tasks: usize,
    cycles: usize,
) -> Result<(f64, f64), BoxError> {
    let began = Instant::now();
    let mut loops = Vec::new();
    for _ in 0..tasks {
        let pool = pool.clone();
        loops.push(tokio::spawn(async move {
            let mut acquiring = Duration::ZERO;
            for _ in 0..cycles {
                let asked = Instant::now();
                let mut conn = pool.acquire().await?;
                acquiring += asked.elapsed();
                sqlx::query("SELECT 1").execute(&mut *conn).await?;
            }
            Ok::<_, BoxError>(acquiring)
        }));
    }
    let mut acquiring = Duration::ZERO;
    for l in loops {
        acquiring += l.await??;
    }
    let n = (tasks * cycles) as f64;
    Ok((
        began.elapsed().as_secs_f64() * 1e6 / n,
        acquiring.as_secs_f64() * 1e6 / n,
    ))
}

/// What the node pool's guard costs: the pool a node hands out (an in-process node that works
/// no queue and leads no role, so the pool serves the loops alone) beside a pool with sqlx's
/// defaults of the same size, on the same database, in cycles of [`pool_cycles`] on 1 task and
/// on 16, the pools taking turns. Per round: (guarded, default), each ((1 task), (16 tasks)).
pub(super) async fn pool_guard(
    bench: &mut Bench,
    rounds: usize,
    cycles: usize,
) -> Result<Vec<[[(f64, f64); 2]; 2]>, BoxError> {
    let (db, _pool, _config) = bench.database(Mode::Kept).await?;
    let mut config = forge::Config::default();
    config.database.url = Some(db.url().to_owned());
    config.node.id = Some("bench-pool".into());
    config.node.roles = Some(vec![]);
    config.node.queues = Some(vec![]);
    let node = forge::Node::builder(config)
        .auto_register(false)
        .start()
        .await?;
    let guarded = node.pool().clone();
    let default = PgPoolOptions::new()
        .max_connections(guarded.options().get_max_connections())
        .connect(db.url())
        .await?;
    let mut figures = Vec::new();
    for _ in 0..rounds {
        let mut round = [[(0.0, 0.0); 2]; 2];
        for (pool, into) in [&guarded, &default].into_iter().zip(&mut round) {
            // Warm: the pool opens its connections, the server caches its plans.
            pool_cycles(pool, 16, cycles / 20).await?;
            into[0] = pool_cycles(pool, 1, cycles).await?;
            into[1] = pool_cycles(pool, 16, cycles / 16).await?;
        }
        figures.push(round);
    }
    default.close().await;
    node.shutdown().await;
    Ok(figures)
}
