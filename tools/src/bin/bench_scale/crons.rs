//! Crons: 10,000 on one leader (the cron node, and the fire lag it prints).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use chrono::Utc;
use forge::crons::CronJob;
use forge::{Config, CronContext, CronError, Node, Schedule};
use forge_testkit::stats::{percentile, summary};
use forge_testkit::{NodeProcess, PgServer};
use tokio::process::Command;
use tokio::time::{Instant, sleep};

use crate::{BoxError, Options, verdict, write_config};

pub(super) async fn cron_node(config: String, count: usize) -> ExitCode {
    let config = match Config::load(&config) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut builder = Node::builder(config).auto_register(false);
    for i in 0..count {
        let schedule = match Schedule::parse(&format!("{} * * * * *", i % 60)) {
            Ok(schedule) => schedule,
            Err(err) => {
                eprintln!("error: {err}");
                return ExitCode::FAILURE;
            }
        };
        builder = builder.cron(CronJob::new(
            format!("c{i}"),
            schedule,
            |ctx: CronContext| async move {
                println!(
                    "FORGE-BENCH TICK {} {} {}",
                    ctx.name(),
                    ctx.scheduled_at().timestamp_micros(),
                    ctx.fired_at().timestamp_micros()
                );
                Ok::<(), CronError>(())
            },
        ));
    }
    let node = match builder.start().await {
        Ok(node) => node,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    println!("FORGE-BENCH READY");
    match node.run_until_signal().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// CPU time (user + system) of a process, from `/proc/<pid>/stat` (Linux, 100 ticks/s).
fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

pub(super) async fn crons(server: &PgServer, dir: &Path, options: &Options) -> Result<(), BoxError> {
    let count = options.crons;
    let db = server.create_database().await?;
    let pool = db.pool().await?;
    let config = write_config(dir, "crons.toml", db.url(), &options.extra_config)?;
    println!(
        "== {count} crons on one leader: per-minute crons c<i> at second i % 60 ({} due at every whole second), catch_up = latest, handler prints its start",
        count.div_ceil(60)
    );
    let mut command = Command::new(std::env::current_exe()?);
    command
        .arg("--cron-node")
        .arg(&config)
        .arg(count.to_string())
        .env("FORGE_NODE_ID", "cron-leader")
        .env_remove("FORGE_ROLES")
        .env_remove("DATABASE_URL")
        .env_remove("FORGE_METRICS_LISTEN");
    let started = Instant::now();
    let mut node = NodeProcess::spawn(command)?.named("cron-leader");
    node.wait_for_line("READY", Duration::from_secs(120), |l| {
        l == "FORGE-BENCH READY"
    })
    .await?;
    let ready = started.elapsed();
    node.wait_for_line("the first tick", Duration::from_secs(120), |l| {
        l.starts_with("FORGE-BENCH TICK ")
    })
    .await?;
    let first = started.elapsed();
    println!(
        "  start: node ready after {:.2} s, first tick ran after {:.2} s",
        ready.as_secs_f64(),
        first.as_secs_f64()
    );
    // Let the first whole minute pass the cron registration and the tenure's load.
    sleep(Duration::from_secs(3)).await;
    let since = Utc::now();
    let cpu_start = cpu_secs(node.pid());
    let window_start = Instant::now();
    sleep(Duration::from_secs(options.cron_secs)).await;
    let until = Utc::now();
    let cpu = cpu_start
        .zip(cpu_secs(node.pid()))
        .map(|(a, b)| (b - a) / window_start.elapsed().as_secs_f64() * 100.0);
    let rss = forge_testkit::stats::rss_kib(node.pid()).unwrap_or_default() as f64 / 1024.0;
    // Ticks due near the end may still be running: give them a moment.
    sleep(Duration::from_secs(2)).await;
    let since_us = since.timestamp_micros();
    let until_us = until.timestamp_micros();
    let mut lags = Vec::new();
    let mut seen = BTreeSet::new();
    let mut duplicates = 0;
    // The lags of each second's ticks, to show how the burst of a second drains.
    let mut per_second: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    for line in node.lines() {
        let Some(rest) = line.strip_prefix("FORGE-BENCH TICK ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let name = parts.next().unwrap_or_default().to_owned();
        let mut times = parts.map(|p| p.parse::<i64>());
        let (Some(Ok(scheduled)), Some(Ok(fired))) = (times.next(), times.next()) else {
            continue;
        };
        if scheduled <= since_us || scheduled > until_us {
            continue;
        }
        let lag = (fired - scheduled) as f64 / 1000.0;
        lags.push(lag);
        per_second.entry(scheduled).or_default().push(lag);
        if !seen.insert((name, scheduled)) {
            duplicates += 1;
        }
    }
    // Expected: for every whole second in the window, the crons due at that second.
    let mut expected = 0usize;
    let mut second = since.timestamp() + 1;
    while second <= until.timestamp() {
        let s = second.rem_euclid(60) as usize;
        expected += (count + 59 - s) / 60;
        second += 1;
    }
    let server_lags: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM claimed_at - scheduled_at)::float8 * 1000
           FROM forge.cron_ticks WHERE scheduled_at > $1 AND scheduled_at <= $2",
    )
    .bind(since)
    .bind(until)
    .fetch_all(&pool)
    .await?;
    let states: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state::text, count(*) FROM forge.cron_ticks
          WHERE scheduled_at > $1 AND scheduled_at <= $2 GROUP BY 1 ORDER BY 1",
    )
    .bind(since)
    .bind(until)
    .fetch_all(&pool)
    .await?;
    let p99 = percentile(&lags, 99.0).unwrap_or(f64::NAN);
    println!(
        "  {:.0} s window: {} ticks ran of {expected} due, {duplicates} twice (ledger: {})",
        (until - since).num_milliseconds() as f64 / 1000.0,
        lags.len(),
        states
            .iter()
            .map(|(s, c)| format!("{s} {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "{}   target: p99 <= 10 ms {}",
        summary("fire lag (handler start - scheduled)", &lags, "ms"),
        verdict(p99 <= 10.0)
    );
    println!(
        "{}",
        summary(
            "claim lag (claimed_at - scheduled, < 0: ahead)",
            &server_lags,
            "ms"
        )
    );
    let firsts: Vec<f64> = per_second
        .values()
        .filter_map(|v| v.iter().copied().reduce(f64::min))
        .collect();
    let lasts: Vec<f64> = per_second
        .values()
        .filter_map(|v| v.iter().copied().reduce(f64::max))
        .collect();
    println!("{}", summary("first tick of each second", &firsts, "ms"));
    println!("{}", summary("last tick of each second", &lasts, "ms"));
    // Which seconds were worst (to match them with the leader's periodic work).
    let mut worst: Vec<(i64, f64)> = per_second
        .iter()
        .filter_map(|(at, v)| Some((*at, v.iter().copied().reduce(f64::max)?)))
        .collect();
    worst.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!(
        "  worst seconds (last tick's lag): {}",
        worst
            .iter()
            .take(3)
            .map(|(at, lag)| {
                let at = chrono::DateTime::from_timestamp_micros(*at).unwrap_or_default();
                format!("{} {lag:.1} ms", at.format("%H:%M:%S"))
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  leader process: CPU {} of one core over the window, RSS {rss:.1} MiB",
        cpu.map_or("-".into(), |c| format!("{c:.1} %"))
    );
    node.terminate()?;
    node.wait_exit(Duration::from_secs(60)).await?;
    Ok(())
}
