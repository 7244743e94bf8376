//! Cron benchmark: fire lag of a per-second cron, and the ticks around a SIGKILL and a
//! graceful stop of its leader.
//!
//! ```text
//! cargo run --release --example bench_cron             # 60 s of steady ticks, 5 kills, 5 stops
//! cargo run --release --example bench_cron -- --quick  # shorter
//! ```
//!
//! Three node processes (this binary with `--node`, the probe node of `forge_tests::probe`
//! with `FORGE_PROBE_CRON="* * * * * *"`, catch_up = all) share a throwaway PostgreSQL
//! (fsync on). Lag is the handler's start minus the scheduled instant, both wall clock on one
//! machine; every tick's run is recorded by the handler in a fenced transaction.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use forge_testkit::stats::summary;
use forge_testkit::{NodeProcess, PgOptions, PgServer};
use tokio::process::Command;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(code) = forge_tests::probe::run_if_node_mode(&args).await {
        return code;
    }
    let quick = args.iter().any(|a| a == "--quick");
    match bench(quick).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

struct Nodes {
    config: std::path::PathBuf,
    running: BTreeMap<String, NodeProcess>,
    next: usize,
}

impl Nodes {
    async fn spawn(&mut self) -> Result<(), BoxError> {
        self.next += 1;
        let id = format!("n{}", self.next);
        let mut command = Command::new(std::env::current_exe()?);
        command
            .arg("--node")
            .arg(&self.config)
            .env("FORGE_NODE_ID", &id)
            .env("FORGE_ROLES", "scheduler")
            .env("FORGE_PROBE_CRON", "* * * * * *")
            .env("FORGE_PROBE_WORK_MS", "3600000")
            .env_remove("DATABASE_URL");
        let mut process = NodeProcess::spawn(command)?.named(&id);
        process
            .wait_for_line("READY", Duration::from_secs(30), |l| {
                l.starts_with("FORGE-PROBE READY")
            })
            .await?;
        self.running.insert(id, process);
        Ok(())
    }
}

async fn leader(pool: &sqlx::PgPool) -> Result<(String, i64), BoxError> {
    Ok(sqlx::query_as(
        "SELECT node_id, epoch FROM forge.leaders WHERE role = 'scheduler' AND released_at IS NULL",
    )
    .fetch_one(pool)
    .await?)
}

/// Waits until the wall clock is `offset_ms` past a whole second, so that a fault lands
/// mid-way between two ticks.
async fn mid_second(offset_ms: u32) {
    let now = Utc::now();
    let into = now.timestamp_subsec_millis();
    let wait = if into < offset_ms {
        offset_ms - into
    } else {
        1000 - into + offset_ms
    };
    tokio::time::sleep(Duration::from_millis(u64::from(wait))).await;
}

/// The runs recorded after `since`: (scheduled_at, fired_at, attempt).
async fn ticks_since(
    pool: &sqlx::PgPool,
    since: DateTime<Utc>,
) -> Result<Vec<(DateTime<Utc>, DateTime<Utc>, i32)>, BoxError> {
    Ok(sqlx::query_as(
        "SELECT scheduled_at, fired_at, attempt FROM forge_probe_ticks WHERE scheduled_at > $1 ORDER BY 1, 3",
    )
    .bind(since)
    .fetch_all(pool)
    .await?)
}

fn lag_ms(scheduled: DateTime<Utc>, fired: DateTime<Utc>) -> f64 {
    (fired - scheduled).num_microseconds().unwrap_or_default() as f64 / 1000.0
}

async fn bench(quick: bool) -> Result<(), BoxError> {
    let (steady_secs, rounds) = if quick { (15, 2) } else { (60, 5) };
    println!(
        "FORGE cron benchmark ({} mode)",
        if quick { "quick" } else { "full" }
    );
    let server = PgServer::start_with(PgOptions::default().durable(true))?;
    let db = server.create_database().await?;
    let pool = db.pool().await?;
    let dir = std::env::temp_dir().join(format!("forge-bench-cron-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("forge.toml");
    std::fs::write(&config, format!("[database]\nurl = \"{}\"\n", db.url()))?;
    let mut nodes = Nodes {
        config,
        running: BTreeMap::new(),
        next: 0,
    };
    for _ in 0..3 {
        nodes.spawn().await?;
    }
    println!(
        "PostgreSQL on 127.0.0.1:{} (fsync on); 3 node processes, default timings; cron \"* * * * * *\", catch_up = all\n",
        server.port()
    );

    // Steady state.
    let since = Utc::now() + TimeDelta::seconds(2);
    let until = since + TimeDelta::seconds(steady_secs);
    tokio::time::sleep((until - Utc::now()).to_std()? + Duration::from_millis(500)).await;
    let steady: Vec<f64> = ticks_since(&pool, since)
        .await?
        .into_iter()
        .filter(|t| t.0 <= until)
        .map(|t| lag_ms(t.0, t.1))
        .collect();

    // Failovers: the first tick after the fault is the one whose lag shows the gap.
    let mut results = Vec::new();
    for (kind, graceful) in [("SIGKILL", false), ("SIGTERM (graceful)", true)] {
        let mut first_lags = Vec::new();
        let mut missing = 0;
        let mut duplicates = 0;
        let mut takeovers = Vec::new();
        for _ in 0..rounds {
            let (victim, epoch) = leader(&pool).await?;
            mid_second(995).await;
            let fault_at = Utc::now();
            let started = Instant::now();
            let process = nodes.running.get_mut(&victim).ok_or("leader not ours")?;
            if graceful {
                process.terminate()?;
            } else {
                process.kill()?;
            }
            // New leader: poll the leaders table (the notify path is measured by bench_election).
            loop {
                let (_, now_epoch) = leader(&pool).await.unwrap_or((String::new(), epoch));
                if now_epoch > epoch {
                    takeovers.push(started.elapsed().as_secs_f64() * 1000.0);
                    break;
                }
                if started.elapsed() > Duration::from_secs(30) {
                    return Err("no takeover within 30 s".into());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if graceful {
                nodes
                    .running
                    .get_mut(&victim)
                    .ok_or("leader gone")?
                    .wait_exit(Duration::from_secs(30))
                    .await?;
            }
            nodes.running.remove(&victim);
            nodes.spawn().await?;
            // Look at the ticks from 3 s before to 3 s after the fault.
            tokio::time::sleep(Duration::from_secs(4)).await;
            let window = ticks_since(&pool, fault_at - TimeDelta::seconds(3)).await?;
            let window: Vec<_> = window
                .into_iter()
                .filter(|t| t.0 <= fault_at + TimeDelta::seconds(3))
                .collect();
            let scheduled: Vec<DateTime<Utc>> = window.iter().map(|t| t.0).collect();
            for pair in scheduled.windows(2) {
                match (pair[1] - pair[0]).num_seconds() {
                    0 => duplicates += 1,
                    1 => {}
                    n => missing += n - 1,
                }
            }
            if let Some(first) = window.iter().find(|t| t.0 > fault_at) {
                first_lags.push(lag_ms(first.0, first.1));
            }
        }
        results.push((kind, takeovers, first_lags, missing, duplicates));
    }

    println!("fire lag (handler start - scheduled instant), steady state:");
    println!("{}", summary("per-second cron", &steady, "ms"));
    for (kind, takeovers, first_lags, missing, duplicates) in results {
        println!("{kind} of the leader, fault 5 ms before a tick:");
        println!(
            "{}",
            summary(
                "fault -> new leader (forge.leaders polled)",
                &takeovers,
                "ms"
            )
        );
        println!(
            "{}",
            summary("lag of the first tick after the fault", &first_lags, "ms")
        );
        println!("  missing ticks: {missing}, ticks run twice: {duplicates}");
    }
    for (_, process) in nodes.running.iter_mut() {
        process.terminate()?;
        process.wait_exit(Duration::from_secs(30)).await?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
