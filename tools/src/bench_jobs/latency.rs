//! Pickup latency at one job every 10 ms.

use std::time::Duration;

use forge::jobs::Jobs;
use sqlx::postgres::PgPoolOptions;
use tokio::time::{Instant, sleep_until};

use super::harness::Bench;
use super::node::{now_us, ping};
use super::{BoxError, Mode};

/// One `ping` every 10 ms through one connection; the node prints each pickup latency.
pub(super) async fn latency(bench: &mut Bench, n: usize) -> Result<(Vec<f64>, Vec<f64>), BoxError> {
    let (db, pool, config) = bench.database(Mode::Kept).await?;
    let mut node = bench.spawn(&config)?;
    Bench::ready(&mut node).await?;
    let client = PgPoolOptions::new()
        .max_connections(1)
        .connect(db.url())
        .await?;
    let jobs = Jobs::new(client, &forge::LockNamespace::default());
    let warmup = 50;
    let start = Instant::now();
    for i in 0..(warmup + n) {
        sleep_until(start + Duration::from_millis(10 * i as u64)).await;
        jobs.enqueue(ping, now_us()).await?;
    }
    let lines = forge_testkit::wait_until(
        "every pickup to be reported",
        Duration::from_secs(30),
        Duration::from_millis(20),
        || async {
            let lines: Vec<f64> = node
                .lines()
                .iter()
                .filter_map(|l| l.strip_prefix("FORGE-BENCH LAT "))
                .filter_map(|v| v.trim().parse::<f64>().ok())
                .collect();
            (lines.len() >= warmup + n).then_some(lines)
        },
    )
    .await?;
    let mut client_side: Vec<f64> = lines[warmup..].iter().map(|us| us / 1000.0).collect();
    client_side.sort_by(f64::total_cmp);
    let mut server_side: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM attempted_at - created_at)::float8 * 1000 FROM forge.jobs
          WHERE queue = 'default' ORDER BY id OFFSET $1",
    )
    .bind(warmup as i64)
    .fetch_all(&pool)
    .await?;
    server_side.sort_by(f64::total_cmp);
    Bench::stop(vec![&mut node]).await?;
    Ok((client_side, server_side))
}
