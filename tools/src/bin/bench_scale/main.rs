//! Scale benchmark: 100 node processes x 3 roles on one PostgreSQL (start-up of all at once,
//! connections per idle node, total idle statements, crash failover among 100 waiters),
//! 10,000 crons on one leader (fire lag), and the job queue at the defaults (drain rate with 1
//! and 2 nodes, the same SQL with no FORGE around it, pickup latency, idle statements: the
//! measurements of `bench_jobs`, which this runs).
//!
//! ```text
//! cargo run --release --example bench_scale                       # 100 nodes, 10 kills, 10,000 crons
//! cargo run --release --example bench_scale -- --quick            # 20 nodes, 5 kills, 2,000 crons, short windows
//! cargo run --release --example bench_scale -- --only scale       # or crons, or jobs
//! cargo run --release --example bench_scale -- --no-peers         # without graphile_worker's rounds
//! cargo run --release --example bench_scale -- --nodes 50 --kills 20 --crons 5000 --idle-secs 60 --cron-secs 60
//! cargo run --release --example bench_scale -- --extra-config '[cluster.leader_election]
//! lock_timeout = "15s"'                                           # other timings (TOML added to forge.toml)
//! ```
//!
//! It starts its own throwaway PostgreSQL (forge-testkit: fsync on, full_page_writes on,
//! synchronous_commit on, data in /dev/shm when it has room) with room for the connections.
//! Every node is a separate process: this binary re-executed.
//!
//! * Scale: `--node <forge.toml>` runs the probe node of `forge_tests::probe` for the three
//!   built-in roles (leader-only work once an hour: the cost measured is FORGE's own), default
//!   timings. All nodes are spawned at once; *settled* is the first instant from which every
//!   node printed READY, every role has one leader (`forge.leaders` and one granted advisory
//!   lock per role), every node is `active` in `forge.nodes`, and the number of FORGE backends
//!   stays the same for 3 s. Idle statements are counted in the server log (`log_statement =
//!   all`, switched on for the window only, counted per `application_name`), with
//!   `pg_stat_database` transactions beside them as a cross-check. Connections are counted in
//!   `pg_stat_activity` per node (`forge:<role>:<node>`, `forge:node:<node>`,
//!   `forge:pool:<node>`) after the idle window. Crash failover: SIGKILL of the scheduler leader
//!   while every other node waits inside the lock, to the new leader's NOTIFY received (as in
//!   `bench_election`); the killed node is replaced so that the cluster stays at N nodes.
//! * Crons: `--cron-node <forge.toml> <count>` is one node with `count` per-minute crons
//!   `c<i>` at second `i % 60` (so `count / 60` ticks are due at every whole second) whose
//!   handler prints its start time; lag is the handler's start minus the scheduled instant
//!   (wall clock, one machine), and `forge.cron_ticks.claimed_at - scheduled_at` on the
//!   server's clock (negative: claimed ahead, `[cron] claim_ahead`, 50 ms by default).
//!
//! * Jobs: `bench_jobs` at the defaults on a throwaway server of its own (its node processes are
//!   this binary re-executed with `--jobs-node`). The throughput target is relative to
//!   graphile_worker's best tuning (the Rust crate graphile_worker 0.14): `benches/peers`, a
//!   project of its own, is built (crates.io) and run for one round before each of FORGE's
//!   throughput rounds on the same server; `--no-peers` skips it.
//!
//! Prints PASS/MISS next to each figure with a target; exits non-zero only when the harness
//! itself fails.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use forge_testkit::{PgOptions, PgServer};
use forge_tools::bench_jobs as jobs;
use sqlx::PgPool;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

mod crons;
mod scale;

use crons::{cron_node, crons};
use scale::scale;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(code) = forge_tests::probe::run_if_node_mode(&args).await {
        return code;
    }
    if args.get(1).map(String::as_str) == Some(jobs::NODE_FLAG) {
        return jobs::node(args.get(2).cloned().unwrap_or_default()).await;
    }
    if args.get(1).map(String::as_str) == Some("--cron-node") {
        let count = args.get(3).and_then(|c| c.parse().ok()).unwrap_or(0);
        return cron_node(args.get(2).cloned().unwrap_or_default(), count).await;
    }
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let number = |flag: &str| value(flag).and_then(|v| v.replace([',', '_'], "").parse().ok());
    let quick = args.iter().any(|a| a == "--quick");
    let options = Options {
        quick,
        nodes: number("--nodes").unwrap_or(if quick { 20 } else { 100 }),
        kills: number("--kills").unwrap_or(if quick { 5 } else { 10 }),
        crons: number("--crons").unwrap_or(if quick { 2_000 } else { 10_000 }),
        idle_secs: number("--idle-secs").unwrap_or(if quick { 15 } else { 60 }) as u64,
        cron_secs: number("--cron-secs").unwrap_or(if quick { 15 } else { 60 }) as u64,
        only: value("--only"),
        extra_config: value("--extra-config").unwrap_or_default(),
        peers: !args.iter().any(|a| a == "--no-peers"),
    };
    if let Some(only) = &options.only
        && only != "scale"
        && only != "crons"
        && only != "jobs"
    {
        eprintln!("error: --only takes scale, crons or jobs");
        return ExitCode::FAILURE;
    }
    match bench(options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

struct Options {
    quick: bool,
    nodes: usize,
    kills: usize,
    crons: usize,
    idle_secs: u64,
    cron_secs: u64,
    only: Option<String>,
    /// TOML appended to the nodes' forge.toml (to try other timings).
    extra_config: String,
    /// Run graphile_worker's best tuning between the job queue's rounds (`--no-peers`: not).
    peers: bool,
}

fn verdict(met: bool) -> &'static str {
    if met { "PASS" } else { "MISS" }
}

async fn bench(options: Options) -> Result<(), BoxError> {
    println!(
        "FORGE scale benchmark ({} mode)",
        if options.quick { "quick" } else { "full" }
    );
    if !options.extra_config.is_empty() {
        println!(
            "nodes' forge.toml adds: {}",
            options.extra_config.replace('\n', " ")
        );
    }
    let part = |name: &str| options.only.as_deref().is_none_or(|only| only == name);
    if part("jobs") {
        job_queue(options.quick, options.peers).await?;
    }
    if !part("scale") && !part("crons") {
        return Ok(());
    }
    // Each node holds 4-5 sessions; starting, a node also opens a setup session and two for
    // the pooler check, and the probe one more.
    let max_connections = (options.nodes as u32 * 10 + 100).max(300);
    let server = PgServer::start_with(
        PgOptions::default()
            .durable(true)
            .max_connections(max_connections)
            .setting("log_line_prefix", "%m [%p] app=%a "),
    )?;
    let admin = PgPool::connect(&server.url()).await?;
    println!(
        "PostgreSQL {} on 127.0.0.1:{} (fsync on, max_connections {max_connections}); {} CPUs; every node a separate process, {} timings\n",
        sqlx::query_scalar::<_, String>("SHOW server_version")
            .fetch_one(&admin)
            .await?,
        server.port(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if options.extra_config.is_empty() {
            "default"
        } else {
            "these"
        },
    );
    let dir = std::env::temp_dir().join(format!("forge-bench-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = async {
        if part("scale") {
            scale(&server, &admin, &dir, &options).await?;
        }
        if part("crons") {
            crons(&server, &dir, &options).await?;
        }
        Ok::<_, BoxError>(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The job queue at the defaults (`bench_jobs`), with graphile_worker's best tuning between
/// its throughput rounds on the same server unless `--no-peers`, judged against the targets.
async fn job_queue(quick: bool, peers: bool) -> Result<(), BoxError> {
    println!("\n== Job queue (bench_jobs at the defaults) ==\n");
    let peer = if peers {
        match jobs::build_peer().await {
            Ok(binary) => Some(binary),
            Err(err) => {
                println!("  (no side-by-side rounds: {err})");
                None
            }
        }
    } else {
        None
    };
    let mut options = jobs::Options::defaults(quick);
    options.peer = peer;
    options.modes = vec![jobs::Mode::Kept, jobs::Mode::Deleted];
    let figures = jobs::bench(options).await?;
    println!("\nJob queue targets:");
    for (mode, factor) in [(jobs::Mode::Kept, 1.5), (jobs::Mode::Deleted, 2.0)] {
        let (Some(one), Some(two)) = (
            figures.throughput.get(&(mode, 1)),
            figures.throughput.get(&(mode, 2)),
        ) else {
            continue;
        };
        println!(
            "  {}: 2 nodes at least as fast as 1: {two:.0} against {one:.0} jobs/s   {}",
            mode.label(),
            verdict(two >= one)
        );
        match figures.peer {
            Some(best) => println!(
                "  {}: {factor}x {}: 1 node {:.2}x, 2 nodes {:.2}x ({best:.0} jobs/s; medians of interleaved rounds on one server)   {}",
                mode.label(),
                jobs::PEER_LABEL,
                one / best,
                two / best,
                verdict(one.min(*two) >= factor * best)
            ),
            None => println!(
                "  {}: {factor}x {}: not measured (without --no-peers this runs benches/peers between the rounds)",
                mode.label(),
                jobs::PEER_LABEL
            ),
        }
        if let Some(limit) = figures.limit.get(&mode) {
            println!(
                "  {}: percent of the limit (the minimal queue's {limit:.0} jobs/s): 1 node {:.0} %, 2 nodes {:.0} %",
                mode.label(),
                100.0 * one / limit,
                100.0 * two / limit
            );
        }
    }
    if let Some((p50, p99)) = figures.latency_ms {
        println!(
            "  pickup latency p50 {p50:.2} ms (<= 1.0), p99 {p99:.2} ms (<= 3)   {}",
            verdict(p50 <= 1.0 && p99 <= 3.0)
        );
    }
    println!();
    Ok(())
}

fn write_config(dir: &Path, name: &str, url: &str, extra: &str) -> Result<PathBuf, BoxError> {
    let path = dir.join(name);
    std::fs::write(&path, format!("[database]\nurl = \"{url}\"\n\n{extra}\n"))?;
    Ok(path)
}
