//! Throughput of FORGE's peers, measured like `examples/bench_jobs.rs` measures FORGE: 20,000
//! no-op jobs inserted first (bulk), then a worker with concurrency 16 starts and drains them.
//!
//! ```text
//! cargo run --release --manifest-path benches/peers/Cargo.toml -- <DATABASE_URL> [--quick] [--only graphile|river]
//! cargo run --release --manifest-path benches/peers/Cargo.toml -- <DATABASE_URL> --quick --only graphile --tuning full
//! ```
//!
//! `--tuning defaults|polling|full` runs one configuration only (`bench_jobs --peers` and
//! `bench_scale` run graphile_worker's `full` once per round, between FORGE's rounds).
//!
//! Each run gets a fresh database on the server of `DATABASE_URL` (its user must be allowed to
//! create databases). Runs at the libraries' defaults stop after `--cap` seconds (default 30)
//! and report the rate so far, since draining 20,000 jobs at tens of jobs per second would take
//! many minutes. Tuned runs shorten the polling interval (10 ms), then also set the batching
//! knobs each library documents for throughput (graphile: a local queue of 500 claimed jobs
//! and batched completions; River: a 1 ms fetch cooldown instead of 10 ms).

use std::time::{Duration, Instant};

use riverqueue::sqlx::{self, PgPool, postgres::PgPoolOptions};
use serde::{Deserialize, Serialize};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TOTAL: usize = 20_000;
const CONCURRENCY: usize = 16;

#[derive(Clone, Debug, Deserialize, Serialize)]
struct GraphileNoop {}

impl graphile_worker::TaskHandler for GraphileNoop {
    const IDENTIFIER: &'static str = "noop";

    async fn run(
        self,
        _ctx: graphile_worker::WorkerContext,
    ) -> impl graphile_worker::IntoTaskHandlerResult {
        Ok::<(), String>(())
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, riverqueue::JobArgs)]
#[river(kind = "noop")]
struct RiverNoop {}

async fn river_noop(
    _context: riverqueue::WorkContext,
    _job: riverqueue::Job<RiverNoop>,
) -> Result<riverqueue::WorkOutcome, riverqueue::BoxError> {
    Ok(riverqueue::WorkOutcome::Complete)
}

struct Server {
    admin: PgPool,
    url: String,
    next: usize,
}

impl Server {
    /// A fresh database and a pool on it.
    async fn database(&mut self) -> Result<(String, PgPool), BoxError> {
        self.next += 1;
        let name = format!("peers_{}_{}", std::process::id(), self.next);
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&self.admin)
            .await?;
        let (base, query) = match self.url.split_once('?') {
            Some((base, query)) => (base, format!("?{query}")),
            None => (self.url.as_str(), String::new()),
        };
        let prefix = base.rsplit_once('/').map_or(base, |(prefix, _)| prefix);
        let url = format!("{prefix}/{name}{query}");
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await?;
        Ok((url, pool))
    }
}

/// Waits until `remaining` (a query counting unfinished jobs) reaches 0 or `cap` passes;
/// returns the jobs done and the time taken.
async fn wait_drained(
    pool: &PgPool,
    remaining: &'static str,
    started: Instant,
    cap: Duration,
) -> Result<(usize, Duration), BoxError> {
    loop {
        let left: i64 = sqlx::query_scalar(remaining).fetch_one(pool).await?;
        let elapsed = started.elapsed();
        if left == 0 || elapsed >= cap {
            return Ok((TOTAL - left.max(0) as usize, elapsed));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How a peer is configured.
#[derive(Clone, Copy, PartialEq)]
enum Tuning {
    /// The library's defaults (concurrency 16).
    Defaults,
    /// Only the polling interval shortened (10 ms).
    Polling,
    /// Every throughput knob the library documents.
    Full,
}

async fn graphile(
    server: &mut Server,
    tuning: Tuning,
    cap: Duration,
) -> Result<(usize, Duration), BoxError> {
    let (_url, pool) = server.database().await?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut options = graphile_worker::WorkerOptions::default()
        .pg_pool(pool.clone())
        .schema("graphile_worker")
        .concurrency(CONCURRENCY)
        .listen_os_shutdown_signals(false)
        .shutdown_signal(async move {
            let _ = stop_rx.await;
        })
        .define_job::<GraphileNoop>();
    if tuning != Tuning::Defaults {
        options = options.poll_interval(Duration::from_millis(10));
    }
    if tuning == Tuning::Full {
        // The knobs graphile_worker documents for throughput: a local queue that batch-fetches
        // jobs, batched completions.
        options = options
            .local_queue(
                graphile_worker::LocalQueueConfig::default()
                    .with_size(500)
                    .with_ttl(Duration::from_secs(60)),
            )
            .complete_job_batch_delay(Duration::from_millis(1));
    }
    let worker = options.init().await?;
    let utils = worker.create_utils();
    let spec = graphile_worker::JobSpec::default();
    for _ in 0..TOTAL / 1000 {
        let batch: Vec<(GraphileNoop, &graphile_worker::JobSpec)> =
            (0..1000).map(|_| (GraphileNoop {}, &spec)).collect();
        utils.add_jobs(&batch).await?;
    }
    let started = Instant::now();
    let run = tokio::spawn(async move { worker.run().await });
    let drained = wait_drained(
        &pool,
        "SELECT count(*) FROM graphile_worker._private_jobs",
        started,
        cap,
    )
    .await?;
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(30), run).await;
    Ok(drained)
}

async fn river(
    server: &mut Server,
    tuning: Tuning,
    cap: Duration,
) -> Result<(usize, Duration), BoxError> {
    let (_url, pool) = server.database().await?;
    riverqueue::migrate::PostgresMigrator::new(pool.clone())
        .migrate_up()
        .await?;
    let mut workers = riverqueue::Workers::new();
    workers.add_fn(river_noop)?;
    let mut queue = riverqueue::QueueConfig::new(CONCURRENCY);
    let mut builder = riverqueue::Client::builder(pool.clone()).workers(workers);
    if tuning != Tuning::Defaults {
        // River refuses a poll interval shorter than the fetch cooldown (default 100 ms).
        queue = queue
            .with_fetch_poll_interval(Duration::from_millis(10))
            .with_fetch_cooldown(Duration::from_millis(10));
        builder = builder.fetch_cooldown(Duration::from_millis(10));
    }
    if tuning == Tuning::Full {
        // The other knob River documents for throughput: the shortest fetch cooldown.
        queue = queue.with_fetch_cooldown(Duration::from_millis(1));
        builder = builder.fetch_cooldown(Duration::from_millis(1));
    }
    let client = builder.queue("default", queue).build()?;
    for _ in 0..TOTAL / 1000 {
        client.insert_many((0..1000).map(|_| RiverNoop {})).await?;
    }
    let started = Instant::now();
    let mut run = client.start()?;
    let drained = wait_drained(
        &pool,
        "SELECT count(*) FROM river_job WHERE state <> 'completed'",
        started,
        cap,
    )
    .await?;
    let _ = tokio::time::timeout(Duration::from_secs(30), run.stop()).await;
    Ok(drained)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let Some(url) = args.get(1).filter(|a| !a.starts_with("--")).cloned() else {
        eprintln!(
            "usage: forge-peers-bench <DATABASE_URL> [--quick] [--only graphile|river] [--tuning defaults|polling|full] [--cap <seconds>]"
        );
        std::process::exit(2);
    };
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    let rounds = if args.iter().any(|a| a == "--quick") {
        1
    } else {
        3
    };
    let only = value("--only").cloned();
    let only_tuning = match value("--tuning").map(String::as_str) {
        None => None,
        Some("defaults") => Some(Tuning::Defaults),
        Some("polling") => Some(Tuning::Polling),
        Some("full") => Some(Tuning::Full),
        Some(other) => {
            eprintln!("--tuning: expected defaults, polling or full, got {other:?}");
            std::process::exit(2);
        }
    };
    let cap = Duration::from_secs(value("--cap").and_then(|v| v.parse().ok()).unwrap_or(30));
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await?;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&admin)
        .await?;
    let fsync: String = sqlx::query_scalar("SHOW fsync").fetch_one(&admin).await?;
    println!(
        "Peers: {TOTAL} no-op jobs inserted first (1,000 per statement), then drained with concurrency {CONCURRENCY}; PostgreSQL {version}, fsync={fsync}"
    );
    let mut server = Server {
        admin,
        url,
        next: 0,
    };
    for (name, tuning) in [
        ("graphile", Tuning::Defaults),
        ("graphile", Tuning::Polling),
        ("graphile", Tuning::Full),
        ("river", Tuning::Defaults),
        ("river", Tuning::Polling),
        ("river", Tuning::Full),
    ] {
        if only.as_deref().is_some_and(|o| o != name) || only_tuning.is_some_and(|t| t != tuning) {
            continue;
        }
        let label = format!(
            "{} {}",
            if name == "graphile" {
                "graphile_worker 0.14"
            } else {
                "riverqueue 0.5"
            },
            match tuning {
                Tuning::Defaults => "defaults",
                Tuning::Polling => "tuned: poll every 10 ms",
                Tuning::Full => "tuned: poll every 10 ms + batching knobs",
            }
        );
        let mut rates = Vec::new();
        for round in 1..=rounds {
            let (done, took) = match name {
                "graphile" => graphile(&mut server, tuning, cap).await?,
                _ => river(&mut server, tuning, cap).await?,
            };
            let rate = done as f64 / took.as_secs_f64();
            println!(
                "  {label}, round {round}: {rate:>8.0} jobs/s ({done} jobs in {:.2} s{})",
                took.as_secs_f64(),
                if done < TOTAL { ", capped" } else { "" }
            );
            rates.push(rate);
        }
        rates.sort_by(f64::total_cmp);
        println!("PEER {label}: median {:.0} jobs/s", rates[rates.len() / 2]);
    }
    Ok(())
}
