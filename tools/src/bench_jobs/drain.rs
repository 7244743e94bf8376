//! Throughput: a backlog of no-op jobs drained by node processes.

use std::collections::BTreeMap;
use std::time::Duration;

use forge::jobs::{Jobs, NewJob};
use forge_testkit::NodeProcess;
use tokio::time::{Instant, sleep};

use super::harness::Bench;
use super::meter::{Cost, Meter, cpu_per_job};
use super::node::noop;
use super::{BoxError, Mode};

pub(super) struct Drain {
    pub(super) enqueue_per_s: f64,
    pub(super) drain_per_s: f64,
    pub(super) wall_per_s: f64,
    pub(super) per_node: BTreeMap<String, i64>,
    /// What the enqueue and the drain cost the database, per job.
    pub(super) cost: Cost,
}

/// Inserts `total` no-op jobs (bulk, 1,000 per statement), then starts `nodes` node processes
/// and waits until every job is completed.
pub(super) async fn drain(
    bench: &mut Bench,
    nodes: usize,
    total: usize,
    mode: Mode,
) -> Result<Drain, BoxError> {
    let (db, pool, config) = bench.database(mode).await?;
    // The enqueue on connections of its own, closed after it: a session's row and WAL counts
    // reach the statistics for sure when it ends (see Meter).
    let writers = db.pool().await?;
    let jobs = Jobs::new(writers.clone(), &forge::LockNamespace::default());
    // The measured jobs are the ones after the seeded rows: the checks below read them by id,
    // not by a scan of the history.
    let before: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM forge.jobs")
        .fetch_one(&pool)
        .await?;
    let m0 = Meter::read(&pool).await?;
    let started = Instant::now();
    for chunk in 0..total.div_ceil(1000) {
        let n = 1000.min(total - chunk * 1000);
        jobs.enqueue_many((0..n).map(|_| NewJob::new(noop, ())))
            .await?;
    }
    let enqueue_per_s = total as f64 / started.elapsed().as_secs_f64();
    let enqueue_cpu = Meter::server_cpu(&pool).await?;
    writers.close().await;
    let m1 = Meter::read(&pool).await?;
    // Let autovacuum/analyze notice the new rows as it would in steady state.
    sqlx::query("ANALYZE forge.jobs").execute(&pool).await?;

    // The queue stays paused until every node is ready: a node's start takes about as long as
    // the drain, and the first node up would otherwise drain alone for a while.
    let workload = forge::inspect::Workload::new(pool.clone(), forge::LockNamespace::default());
    workload.pause_queue("default", "bench", true).await?;
    let spawned = Instant::now();
    let mut processes = Vec::new();
    for _ in 0..nodes {
        processes.push(bench.spawn(&config)?);
    }
    for process in &mut processes {
        Bench::ready(process).await?;
    }
    let node_cpu = |processes: &[NodeProcess]| -> Option<f64> {
        processes
            .iter()
            .map(|p| forge_testkit::stats::cpu_seconds(p.pid()))
            .sum()
    };
    let metering = Instant::now();
    let m2 = Meter::read(&pool).await?;
    // (Not part of the nodes' start: the wall-clock figure leaves it out.)
    let metering = metering.elapsed();
    let nodes_before = node_cpu(&processes);
    workload.resume_queue("default", "bench").await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        // Cheap while the nodes work (two probes of partial indexes, every 20 ms): this
        // process shares the CPUs with the nodes and PostgreSQL. ('ready': available, or
        // running after a claim; 'busy': running otherwise. See migration 0016.)
        let busy: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM forge.jobs_live WHERE namespace = 'forge'
                               AND queue = 'default' AND phase = 'ready' AND role IS NULL)
                 OR EXISTS (SELECT 1 FROM forge.jobs_live WHERE namespace = 'forge' AND phase = 'busy')",
        )
        .fetch_one(&pool)
        .await?;
        if !busy {
            // Completed: a `completed` row, or no row when completed jobs are deleted.
            let unfinished: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM forge.jobs
                  WHERE id > $1 AND queue = 'default' AND state <> 'completed'",
            )
            .bind(before)
            .fetch_one(&pool)
            .await?;
            if unfinished == 0 {
                break;
            }
        }
        if Instant::now() > deadline {
            return Err(format!("the {total} jobs were not completed in 600 s").into());
        }
        sleep(Duration::from_millis(20)).await;
    }
    let wall = (spawned.elapsed() - metering).as_secs_f64();
    let m3 = Meter::read(&pool).await?;
    let nodes_after = node_cpu(&processes);
    let span: Option<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(finished_at) - min(attempted_at))::float8 FROM forge.jobs
          WHERE id > $1 AND queue = 'default'",
    )
    .bind(before)
    .fetch_one(&pool)
    .await?;
    let mut per_node: Vec<(String, i64)> = sqlx::query_as(
        "SELECT node_id, count(*) FROM forge.jobs WHERE id > $1 AND queue = 'default'
          GROUP BY node_id ORDER BY node_id",
    )
    .bind(before)
    .fetch_all(&pool)
    .await?;
    Bench::stop(processes.iter_mut().collect()).await?;
    // The nodes' row and WAL record counts reach the statistics when their sessions end (the
    // WAL bytes and the CPU are the drain's, read before the nodes stop).
    let m4 = Meter::read(&pool).await?;
    let mut cost = m3.since(&m2, total);
    let whole = m4.since(&m2, total);
    (cost.wal_records, cost.wal_fpi) = (whole.wal_records, whole.wal_fpi);
    cost.rows = m4.since(&m0, total).rows;
    cost.enqueue_cpu_us = cpu_per_job(enqueue_cpu, &m0, total);
    cost.enqueue_wal_bytes = m1.since(&m0, total).wal_bytes;
    cost.nodes_cpu_us = nodes_after
        .zip(nodes_before)
        .map(|(a, b)| (a - b) * 1e6 / total as f64);
    // No rows: completed jobs were deleted. Time the drain by the nodes' own notes instead,
    // from the first no-op's start to the last one's end (each a round trip inside the
    // database-clock span: about a millisecond shorter).
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    if span.is_none() {
        per_node.clear();
        for process in &processes {
            let line = process
                .lines()
                .into_iter()
                .find(|l| l.starts_with("FORGE-BENCH DRAIN"))
                .ok_or("a node printed no FORGE-BENCH DRAIN line")?;
            let field = |name: &str| -> Result<i64, BoxError> {
                let value = line
                    .split(' ')
                    .find_map(|f| f.strip_prefix(name))
                    .ok_or("a malformed FORGE-BENCH DRAIN line")?;
                Ok(value.parse()?)
            };
            let node = line.split(' ').find_map(|f| f.strip_prefix("node="));
            let handled = field("handled=")?;
            per_node.push((node.unwrap_or("?").to_owned(), handled));
            if handled > 0 {
                first = first.min(field("first_us=")?);
                last = last.max(field("last_us=")?);
            }
        }
    }
    let handled: i64 = per_node.iter().map(|(_, n)| n).sum();
    if handled < total as i64 {
        return Err(format!("{handled} of {total} jobs were run").into());
    }
    let span = span.unwrap_or((last - first) as f64 / 1e6);
    Ok(Drain {
        enqueue_per_s,
        drain_per_s: total as f64 / span,
        wall_per_s: total as f64 / wall,
        per_node: per_node.into_iter().collect(),
        cost,
    })
}
