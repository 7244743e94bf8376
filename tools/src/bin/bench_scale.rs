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
//! * Scale: `--node <forge.toml>` runs the probe node of `forge_testkit::probe` for the three
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

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use chrono::Utc;
use forge::crons::CronJob;
use forge::{Config, CronContext, CronError, Node, Schedule};
use forge_testkit::stats::{percentile, summary};
use forge_testkit::{NodeProcess, PgOptions, PgServer};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::process::Command;
use tokio::time::{Instant, sleep};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The job queue's measurements, shared with the `bench_jobs` example.
#[allow(dead_code)] // bench_jobs's own main and its flag parsing are not used here.
#[path = "bench_jobs.rs"]
mod jobs;

const ROLES: &str = "scheduler,metrics_aggregator,log_compactor";
/// How long the number of FORGE backends must stay the same for a start to count as settled.
const STABLE: Duration = Duration::from_secs(3);

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(code) = forge_testkit::probe::run_if_node_mode(&args).await {
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

// ---------------------------------------------------------------------------------------------
// The cron node.

async fn cron_node(config: String, count: usize) -> ExitCode {
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

// ---------------------------------------------------------------------------------------------
// The harness.

struct Cluster {
    exe: PathBuf,
    config: PathBuf,
    nodes: BTreeMap<String, NodeProcess>,
    next_id: usize,
}

impl Cluster {
    /// Spawns a probe node for the three roles without waiting for it.
    fn spawn(&mut self) -> Result<String, BoxError> {
        self.next_id += 1;
        let id = format!("s{:03}", self.next_id);
        let mut command = Command::new(&self.exe);
        command
            .arg("--node")
            .arg(&self.config)
            .env("FORGE_NODE_ID", &id)
            .env("FORGE_ROLES", ROLES)
            .env("FORGE_PROBE_WORK_MS", "3600000")
            .env_remove("DATABASE_URL")
            .env_remove("FORGE_METRICS_LISTEN");
        let process = NodeProcess::spawn(command)?.named(&id);
        self.nodes.insert(id.clone(), process);
        Ok(id)
    }

    async fn spawn_ready(&mut self) -> Result<String, BoxError> {
        let id = self.spawn()?;
        let process = self.nodes.get_mut(&id).ok_or("node gone")?;
        process
            .wait_for_line("READY", Duration::from_secs(60), |l| {
                l.starts_with("FORGE-PROBE READY")
            })
            .await?;
        Ok(id)
    }

    fn ids(&self) -> Vec<String> {
        self.nodes.keys().cloned().collect()
    }

    /// Errors if a node exited.
    fn check_alive(&self) -> Result<(), BoxError> {
        for (id, node) in &self.nodes {
            if let Some(status) = node.try_status() {
                let lines = node.lines();
                let tail = lines[lines.len().saturating_sub(10)..].join("\n");
                return Err(format!("node {id} exited ({status}):\n{tail}").into());
            }
        }
        Ok(())
    }

    async fn stop_all(&mut self) -> Result<(), BoxError> {
        for node in self.nodes.values() {
            let _ = node.terminate();
        }
        for (_, mut node) in std::mem::take(&mut self.nodes) {
            node.wait_exit(Duration::from_secs(60)).await?;
        }
        Ok(())
    }
}

/// What the settle loop looks at.
#[derive(Debug, Default, PartialEq)]
struct Snapshot {
    ready: usize,
    backends: i64,
    leaders: i64,
    lock_holders: i64,
    active: i64,
}

async fn snapshot(pool: &PgPool, cluster: &Cluster) -> Result<Snapshot, BoxError> {
    let ids = cluster.ids();
    let ready = cluster
        .nodes
        .values()
        .filter(|p| p.lines().iter().any(|l| l.starts_with("FORGE-PROBE READY")))
        .count();
    let backends: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'forge:%'",
    )
    .fetch_one(pool)
    .await?;
    // Holders of a role's lock: granted advisory locks of the roles' lock sessions.
    let lock_holders: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE l.locktype = 'advisory' AND l.granted
            AND a.application_name ~ '^forge:(scheduler|metrics_aggregator|log_compactor):'",
    )
    .fetch_one(pool)
    .await?;
    // The tables exist once the first node migrated.
    let tables: Result<(i64, i64), sqlx::Error> = sqlx::query_as(
        "SELECT (SELECT count(DISTINCT role) FROM forge.leaders
                  WHERE released_at IS NULL AND node_id = ANY($1)),
                (SELECT count(*) FROM forge.nodes
                  WHERE node_id = ANY($1) AND stopped_at IS NULL AND down_at IS NULL
                    AND drifted_at IS NULL AND heartbeat_at > clock_timestamp() - interval '15 s')",
    )
    .bind(&ids)
    .fetch_one(pool)
    .await;
    let (leaders, active) = tables.unwrap_or_default();
    Ok(Snapshot {
        ready,
        backends,
        leaders,
        lock_holders,
        active,
    })
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

async fn scale(
    server: &PgServer,
    admin: &PgPool,
    dir: &Path,
    options: &Options,
) -> Result<(), BoxError> {
    let n = options.nodes;
    let db = server.create_database().await?;
    let pool = db.pool().await?;
    let mut cluster = Cluster {
        exe: std::env::current_exe()?,
        config: write_config(dir, "scale.toml", db.url(), &options.extra_config)?,
        nodes: BTreeMap::new(),
        next_id: 0,
    };
    // Followers that wait inside each role's lock; the others are reserves.
    let standbys = (Config::load(&cluster.config)?
        .cluster
        .leader_election
        .standbys as usize)
        .min(n.saturating_sub(1));
    println!(
        "== {n} node processes x 3 roles (scheduler, metrics_aggregator, log_compactor), {standbys} standbys per role"
    );

    // 1. Start all at once.
    let started = Instant::now();
    for _ in 0..n {
        cluster.spawn()?;
    }
    let spawned = started.elapsed();
    let mut last = Snapshot::default();
    let mut last_change = Instant::now();
    let mut peak_backends = 0;
    let mut all_ready: Option<Duration> = None;
    let deadline = started + Duration::from_secs(180);
    let settled = loop {
        cluster.check_alive()?;
        let now = snapshot(&pool, &cluster).await?;
        peak_backends = peak_backends.max(now.backends);
        if all_ready.is_none() && now.ready == n {
            all_ready = Some(started.elapsed());
        }
        if now != last {
            last = now;
            last_change = Instant::now();
        }
        let complete = last.ready == n
            && last.leaders == 3
            && last.lock_holders == 3
            && last.active == n as i64;
        if complete && last_change.elapsed() >= STABLE {
            break Some(last_change - started);
        }
        if Instant::now() > deadline {
            break None;
        }
        sleep(Duration::from_millis(50)).await;
    };
    println!(
        "start of all {n} at once (spawned in {:.0} ms; peak {peak_backends} FORGE backends):",
        spawned.as_secs_f64() * 1000.0
    );
    println!(
        "  every node READY after {}",
        all_ready.map_or("-".into(), |d| format!("{:.2} s", d.as_secs_f64()))
    );
    match settled {
        Some(at) => println!(
            "  settled after {:.2} s (3 leaders, {n} active nodes, {} backends, unchanged for {} s)   target: within seconds (<= 10 s) {}",
            at.as_secs_f64(),
            last.backends,
            STABLE.as_secs(),
            verdict(at <= Duration::from_secs(10))
        ),
        None => println!("  NOT settled within 180 s: {last:?}   MISS"),
    }

    // 2. Idle: statements over the window (server log, per application_name). The window
    // starts 20 s after the start has settled, more than a lock_timeout: a session waiting in
    // the lock reports its statistics when the wait returns, so the start-up's are out by then.
    if let Some(at) = settled {
        let since = started + at + Duration::from_secs(20);
        tokio::time::sleep_until(since).await;
    }
    let log = server.log_file().ok_or("no server log")?.to_owned();
    sqlx::query("ALTER SYSTEM SET log_statement = 'all'")
        .execute(admin)
        .await?;
    sqlx::query("SELECT pg_reload_conf()")
        .execute(admin)
        .await?;
    sleep(Duration::from_secs(1)).await;
    let xacts = "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()";
    let xact_start: i64 = sqlx::query_scalar(xacts).fetch_one(&pool).await?;
    let log_start = std::fs::metadata(&log)?.len();
    let window_start = Instant::now();
    sleep(Duration::from_secs(options.idle_secs)).await;
    let log_end = std::fs::metadata(&log)?.len();
    let window = window_start.elapsed().as_secs_f64();
    // The statistics of sessions waiting in a lock are flushed when the wait ends.
    let xact_end: i64 = sqlx::query_scalar(xacts).fetch_one(&pool).await?;
    sqlx::query("ALTER SYSTEM RESET log_statement")
        .execute(admin)
        .await?;
    sqlx::query("SELECT pg_reload_conf()")
        .execute(admin)
        .await?;
    let text = {
        use std::io::{Read as _, Seek as _, SeekFrom};
        let mut file = std::fs::File::open(&log)?;
        file.seek(SeekFrom::Start(log_start))?;
        let mut bytes = Vec::new();
        file.take(log_end - log_start).read_to_end(&mut bytes)?;
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    let mut per_kind: BTreeMap<String, usize> = BTreeMap::new();
    for line in text.lines() {
        if !(line.contains(" LOG:  statement: ") || line.contains(" LOG:  execute ")) {
            continue;
        }
        let Some(app) = line
            .split(" app=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
        else {
            continue;
        };
        let mut parts = app.splitn(3, ':');
        if parts.next() != Some("forge") {
            continue;
        }
        let (Some(kind), Some(node)) = (parts.next(), parts.next()) else {
            continue;
        };
        *per_node.entry(node.to_owned()).or_default() += 1;
        let kind = if ROLES.split(',').any(|r| r == kind) {
            "lock sessions (campaign, renewals)"
        } else if kind == "node" {
            "node sessions (heartbeats)"
        } else if kind == "pool" {
            "pools (leader duties, fenced writes)"
        } else {
            "other"
        };
        *per_kind.entry(kind.to_owned()).or_default() += 1;
    }
    let leaders: Vec<(String, String)> = sqlx::query_as(
        "SELECT role, node_id FROM forge.leaders WHERE released_at IS NULL ORDER BY role",
    )
    .fetch_all(&pool)
    .await?;
    let leader_nodes: BTreeSet<String> = leaders.iter().map(|(_, n)| n.clone()).collect();
    let total: usize = per_node.values().sum();
    let rate = total as f64 / window;
    println!(
        "idle, {:.0} s window (leaders: {}):",
        window,
        leaders
            .iter()
            .map(|(r, n)| format!("{r}={n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  total statements of FORGE sessions (server log): {total} = {rate:.1} /s   target: <= 50 /s {}",
        verdict(rate <= 50.0)
    );
    for (kind, count) in &per_kind {
        println!("    {kind}: {:.1} /s", *count as f64 / window);
    }
    let follower_rates: Vec<f64> = cluster
        .nodes
        .keys()
        .filter(|id| !leader_nodes.contains(*id))
        .map(|id| per_node.get(id).copied().unwrap_or_default() as f64 / window)
        .collect();
    let follower_mean = follower_rates.iter().sum::<f64>() / follower_rates.len().max(1) as f64;
    println!(
        "  per follower node: mean {follower_mean:.3} /s, max {:.3} /s; per leader node: {}",
        percentile(&follower_rates, 100.0).unwrap_or_default(),
        leader_nodes
            .iter()
            .map(|id| format!(
                "{id} {:.3} /s",
                per_node.get(id).copied().unwrap_or_default() as f64 / window
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  cross-check: pg_stat_database transactions (commits + rollbacks, this database, all sessions): {:.1} /s",
        (xact_end - xact_start) as f64 / window
    );

    // 3. Connections per idle node.
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT split_part(application_name, ':', 3), split_part(application_name, ':', 2), count(*)
           FROM pg_stat_activity WHERE application_name LIKE 'forge:%' GROUP BY 1, 2",
    )
    .fetch_all(&pool)
    .await?;
    let mut conns: BTreeMap<String, i64> = cluster.ids().into_iter().map(|id| (id, 0)).collect();
    let mut pool_conns = 0;
    for (node, kind, count) in &rows {
        *conns.entry(node.clone()).or_default() += count;
        if kind == "pool" {
            pool_conns += count;
        }
    }
    let total_conns: i64 = conns.values().sum();
    let max_conns = conns.values().copied().max().unwrap_or_default();
    let mut histogram: BTreeMap<i64, usize> = BTreeMap::new();
    for count in conns.values() {
        *histogram.entry(*count).or_default() += 1;
    }
    let over: Vec<String> = conns
        .iter()
        .filter(|(_, c)| **c > 4)
        .map(|(id, c)| {
            let led: Vec<&str> = leaders
                .iter()
                .filter(|(_, n)| n == id)
                .map(|(r, _)| r.as_str())
                .collect();
            format!(
                "{id}={c} (leads {})",
                if led.is_empty() {
                    "nothing".to_owned()
                } else {
                    led.join("+")
                }
            )
        })
        .collect();
    println!(
        "connections per idle node (pg_stat_activity after the idle window, {:.0} s after the start):",
        started.elapsed().as_secs_f64()
    );
    println!(
        "  max {max_conns}, mean {:.2}, total {total_conns} ({pool_conns} of them pool connections)   target: <= 4 per node {}",
        total_conns as f64 / conns.len().max(1) as f64,
        verdict(max_conns <= 4)
    );
    println!(
        "  nodes by connections held: {}{}",
        histogram
            .iter()
            .map(|(c, nodes)| format!("{c}: {nodes} nodes"))
            .collect::<Vec<_>>()
            .join(", "),
        if over.is_empty() {
            String::new()
        } else {
            format!("; above 4: {}", over.join(", "))
        }
    );
    let mut rss: Vec<f64> = cluster
        .nodes
        .values()
        .filter_map(|p| forge_testkit::stats::rss_kib(p.pid()))
        .map(|k| k as f64 / 1024.0)
        .collect();
    rss.sort_by(f64::total_cmp);
    println!(
        "  idle RSS per node process: min {:.1} MiB, max {:.1} MiB",
        rss.first().copied().unwrap_or_default(),
        rss.last().copied().unwrap_or_default()
    );

    // 4. Crash failover among n waiters.
    let mut listener = PgListener::connect(db.url()).await?;
    listener.listen("forge_leader").await?;
    let mut gaps = Vec::new();
    let mut short_waits = 0;
    for _ in 0..options.kills {
        let (leader, epoch) = current_leader(&pool, &cluster).await?;
        if !followers_waiting(&pool, standbys).await? {
            short_waits += 1;
        }
        while listener.next_buffered().is_some() {}
        let killed = Instant::now();
        cluster
            .nodes
            .get_mut(&leader)
            .ok_or("leader gone")?
            .kill()?;
        let heard = wait_elected(&mut listener, epoch).await?;
        gaps.push((heard - killed).as_secs_f64() * 1000.0);
        if let Some(mut gone) = cluster.nodes.remove(&leader) {
            gone.wait_exit(Duration::from_secs(30)).await?;
        }
        cluster.spawn_ready().await?;
    }
    let p99 = percentile(&gaps, 99.0).unwrap_or(f64::NAN);
    println!(
        "crash failover with {n} nodes, {} SIGKILLs of the scheduler leader (-> new leader's NOTIFY received):",
        gaps.len()
    );
    println!(
        "{}   target: p99 <= 100 ms {}",
        summary("gap", &gaps, "ms"),
        verdict(p99 <= 100.0)
    );
    if short_waits > 0 {
        println!(
            "  ({short_waits} rounds started with fewer than {standbys} standbys waiting in the lock after 20 s)"
        );
    }
    cluster.stop_all().await?;
    println!();
    Ok(())
}

async fn current_leader(pool: &PgPool, cluster: &Cluster) -> Result<(String, i64), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let row: Option<(String, i64)> = sqlx::query_as(
            "SELECT node_id, epoch FROM forge.leaders WHERE role = 'scheduler' AND released_at IS NULL",
        )
        .fetch_optional(pool)
        .await?;
        if let Some(row) = row
            && cluster.nodes.contains_key(&row.0)
        {
            return Ok(row);
        }
        if Instant::now() > deadline {
            return Err("no scheduler leader among the nodes within 60 s".into());
        }
        sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (up to 20 s) until `followers` lock sessions wait inside pg_advisory_lock for the
/// scheduler, so that a round measures a takeover by a waiter. False if they never did.
async fn followers_waiting(pool: &PgPool, followers: usize) -> Result<bool, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE application_name LIKE 'forge:scheduler:%' AND wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await?;
        if waiting as usize >= followers {
            return Ok(true);
        }
        if Instant::now() > deadline {
            return Ok(false);
        }
        sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_elected(listener: &mut PgListener, after_epoch: i64) -> Result<Instant, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = tokio::time::timeout_at(deadline, listener.recv())
            .await
            .map_err(|_| "no election notification within 60 s")??;
        let heard = Instant::now();
        let v: serde_json::Value = serde_json::from_str(n.payload())?;
        if v["role"] == "scheduler"
            && v["event"] == "elected"
            && v["epoch"].as_i64() > Some(after_epoch)
        {
            return Ok(heard);
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

async fn crons(server: &PgServer, dir: &Path, options: &Options) -> Result<(), BoxError> {
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
