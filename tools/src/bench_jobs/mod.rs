//! Job queue benchmark: throughput (a backlog of no-op jobs drained by one node and by two),
//! pickup latency at one job every 10 ms, bulk enqueue rate, and idle statements per node.
//!
//! ```text
//! cargo run --release -p forge-tools --bin bench_jobs                 # 3 rounds of each, 60 s idle window
//! cargo run --release -p forge-tools --bin bench_jobs -- --quick      # 1 round, 20 s idle window
//! cargo run --release -p forge-tools --bin bench_jobs -- --database-url postgres://...   # an existing server
//! cargo run --release -p forge-tools --bin bench_jobs -- --only throughput   # or latency, idle, limit, pool
//! cargo run --release -p forge-tools --bin bench_jobs -- --only throughput --nodes 1 --jobs 200000
//! cargo run --release -p forge-tools --bin bench_jobs -- --extra-config $'[jobs.queues]\ndefault = 32'
//! cargo run --release -p forge-tools --bin bench_jobs -- --only throughput --extra-config $'[jobs]\ncompleted_retention = "0s"'
//! cargo run --release -p forge-tools --bin bench_jobs -- --quick --only latency --backlog 1000000 --history 10000000
//! cargo run --release -p forge-tools --bin bench_jobs -- --only throughput --setup-sql 'DROP INDEX forge.jobs_finished'
//! cargo run --release -p forge-tools --bin bench_jobs -- --only throughput --peers   # graphile_worker side by side
//! cargo run --release -p forge-tools --bin bench_jobs -- --quick --only limit --both-modes [--batch 128]
//! cargo run --release -p forge-tools --bin bench_jobs -- --only pool   # what the pool's guard costs
//! cargo run --release -p forge-tools --bin bench_jobs -- --quick --only limits   # queue limits side by side
//! ```
//!
//! Side by side with the peer: `--peers` builds `tools/peers` and runs graphile_worker at its
//! best tuning (poll every 10 ms, local queue of 500, batched completions) for one round before
//! each of FORGE's throughput rounds, on the same server, and prints FORGE's rate over its.
//!
//! Flat with backlog and history: `--backlog N` inserts N available jobs in another queue
//! (`backlog`, which no node works) and `--history N` N completed jobs (queue `history`,
//! finished an hour ago, within the default retention) into every measurement's database
//! before it starts, then `VACUUM ANALYZE` and `CHECKPOINT`; compare the figures with a run
//! without them. A backlog of the worked queue itself is `--jobs N` (throughput drains all
//! of it).
//!
//! What a piece of the schema costs: `--setup-sql SQL` runs SQL in every measurement's database
//! after its schema and seed rows, before any node starts (for example dropping an index the
//! hot path writes, to compare the drain with and without it). An experiment, not a tuning:
//! FORGE needs every index its migrations create.
//!
//! With `completed_retention = "0s"` completed jobs leave no row to time the drain by; it is then
//! timed by the nodes' own notes (first no-op started to last one ended, printed by each node
//! at exit). `--both-modes` runs the throughput and limit rounds both ways, interleaved:
//! completed jobs kept (the default) and deleted (`completed_retention = "0s"`).
//!
//! The limit (`--only limit`): the least SQL any durable queue needs on this server, so that
//! "percent of the limit" means the limit of any design, not of FORGE's. One table with its
//! primary key and one partial index of the jobs not claimed yet; one insert per job (1,000 per
//! statement, as `enqueue_many`), then round trips as FORGE's workers make them, on 1 and on 2
//! connections: each claims the next `--batch` jobs (default 128, `FOR UPDATE SKIP LOCKED`) and
//! records the previous batch's completions in the same statement (kept: an update of a column
//! no index names; or deleted), committed with `synchronous_commit = on`. Beside it, FORGE's own
//! `forge.jobs_step` driven the same way with nothing around it. Each line says what a job cost
//! the database: row writes per table (`pg_stat_user_tables`), WAL bytes, records and full-page
//! images (`pg_stat_wal`, the server's WAL position) and PostgreSQL's CPU (its processes'
//! `/proc` times, when the server runs on this machine); the throughput rounds print the same
//! for the drain, the enqueue and the node processes.
//!
//! Queue limits (`--only limits`, not to be confused with `limit`): 2 nodes drain short jobs
//! without limits, under a global concurrency limit of 16 and under a rate, side by side in each
//! round (`queue_limits.rs`).
//!
//! The pool's guard (`--only pool`): the node's pool checks at each release that the connection
//! is outside any transaction block (one statement, bounded) and pings it, bounded, before
//! handing it out; a pool with sqlx's defaults pings at every acquire and release, unbounded. Both pools (10 connections each, on one database) run cycles
//! of acquire, `SELECT 1`, release, on 1 task and on 16, rounds interleaved: microseconds per
//! cycle and per acquire call, and the difference, what the guard costs per acquire.
//!
//! By default it starts its own throwaway PostgreSQL (forge-testkit: fsync on, full_page_writes
//! on, synchronous_commit on, data in /dev/shm when it has room) and logs statements only during
//! the idle measurement. With `--database-url` it uses that server (for side-by-side runs with
//! `tools/peers`, against the same `forge-pg`), creating a database per measurement; the idle
//! measurement then needs `--pg-log <file>` (the server's log, with `log_line_prefix` containing
//! `app=%a`) and a superuser to switch `log_statement`.
//!
//! Every node is a separate process: this binary with `--jobs-node <forge.toml>`, working the queue
//! `default` with its default concurrency (16) and no tuning: the defaults of forge.toml.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use forge::jobs::QueueLimits;
use forge_testkit::{PgOptions, PgServer};

mod drain;
mod harness;
mod idle;
mod latency;
mod limit;
mod meter;
mod node;
mod peer;
mod pool;
mod queue_limits;

use drain::drain;
use harness::{Bench, median, percentile};
use idle::idle;
use latency::latency;
use limit::{forge_alone, minimal_limit};
pub use node::{NODE_FLAG, node};
use peer::peer_round;
pub use peer::{PEER_LABEL, build_peer};
use pool::pool_guard;
use queue_limits::{NAP_MS, limited_drain};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `--help`: the usage lines of this file's header.
const HELP: &str = "bench_jobs: FORGE's job queue benchmark (see tools/src/bench_jobs/ for what each part measures)

  --quick                 1 round of each part, 20 s idle window (default: 3 rounds, 60 s)
  --only PART             throughput, latency, idle, limit, limits (queue limits) or pool
  --nodes N               throughput with N nodes only (default: 1 and 2)
  --jobs N                jobs drained per throughput round (default 20000)
  --backlog N             N available jobs in another queue, in every measurement's database
  --history N             N completed jobs (finished an hour ago), the same
  --both-modes            throughput and limit rounds with completed jobs kept and deleted
                          (completed_retention = \"0s\"), interleaved (default: kept only)
  --batch N               jobs per round trip of the limit's loops (default 128)
  --extra-config TOML     appended to every node's forge.toml
  --setup-sql SQL         run in every measurement's database before the nodes start
  --peers                 graphile_worker at its best tuning, one round before each of FORGE's
  --database-url URL      an existing server instead of a throwaway one
  --pg-log FILE           its log (the idle part needs it with --database-url)";

/// The command: a node process with `--jobs-node <forge.toml>`, else the benchmark as the
/// command line asks (`--help`).
pub async fn run() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(NODE_FLAG) {
        return node(args.get(2).cloned().unwrap_or_default()).await;
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let options = Options {
        database_url: value("--database-url"),
        pg_log: value("--pg-log").map(PathBuf::from),
        only: value("--only"),
        nodes: value("--nodes").and_then(|n| n.parse().ok()),
        jobs: value("--jobs").and_then(|n| n.parse().ok()),
        backlog: value("--backlog").and_then(|n| n.parse().ok()).unwrap_or(0),
        history: value("--history").and_then(|n| n.parse().ok()).unwrap_or(0),
        extra_config: value("--extra-config").unwrap_or_default(),
        setup_sql: value("--setup-sql"),
        modes: if args.iter().any(|a| a == "--both-modes") {
            vec![Mode::Kept, Mode::Deleted]
        } else {
            vec![Mode::Kept]
        },
        batch: value("--batch").and_then(|n| n.parse().ok()).unwrap_or(128),
        ..Options::defaults(args.iter().any(|a| a == "--quick"))
    };
    let options = if args.iter().any(|a| a == "--peers") {
        match build_peer().await {
            Ok(peer) => Options {
                peer: Some(peer),
                ..options
            },
            Err(err) => {
                eprintln!("error: --peers: {err}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        options
    };
    match bench(options).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// What a completion does with the job's row: keeps it (`completed_retention` at its default,
/// a day) or deletes it (`completed_retention = "0s"`, as graphile_worker does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// Completed jobs are kept (the default).
    Kept,
    /// Completed jobs are deleted (`completed_retention = "0s"`).
    Deleted,
}

impl Mode {
    /// The nodes' forge.toml lines for this mode.
    fn config(self) -> &'static str {
        match self {
            Mode::Kept => "",
            Mode::Deleted => "[jobs]\ncompleted_retention = \"0s\"\n",
        }
    }

    /// The mode in the printed figures.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Kept => "completed kept",
            Mode::Deleted => "completed deleted",
        }
    }
}

/// What to measure and how (the command line's options; `bench_scale` starts from
/// [`Options::defaults`]).
pub struct Options {
    quick: bool,
    only: Option<String>,
    nodes: Option<usize>,
    /// Jobs inserted before a throughput or limit run (default 20,000).
    jobs: Option<usize>,
    /// Available jobs of another queue, inserted first (`--backlog`).
    backlog: u64,
    /// Completed jobs, inserted first (`--history`).
    history: u64,
    /// TOML added to the nodes' forge.toml (other timings than the defaults).
    extra_config: String,
    /// SQL run in every measurement's database after its schema and seed rows (`--setup-sql`).
    setup_sql: Option<String>,
    /// How completed jobs are kept in the throughput and limit rounds: kept (the default), and
    /// also deleted with `--both-modes` (`completed_retention = "0s"`), rounds interleaved.
    pub modes: Vec<Mode>,
    /// Jobs per round trip of the limit's loops (`--batch`, default 128).
    batch: i32,
    database_url: Option<String>,
    pg_log: Option<PathBuf>,
    /// The built `tools/peers` binary: graphile_worker at its best tuning runs one round
    /// before each of FORGE's throughput rounds, on the same server (`--peers`).
    pub peer: Option<PathBuf>,
}

impl Options {
    /// Every measurement at the defaults, on a throwaway server.
    pub fn defaults(quick: bool) -> Self {
        Options {
            quick,
            only: None,
            nodes: None,
            jobs: None,
            backlog: 0,
            history: 0,
            extra_config: String::new(),
            setup_sql: None,
            modes: vec![Mode::Kept],
            batch: 128,
            database_url: None,
            pg_log: None,
            peer: None,
        }
    }
}

/// The figures a caller judges against targets (`bench_scale`).
pub struct Figures {
    /// Median drain rate (first claim to last completion, jobs/s) by mode and number of nodes.
    pub throughput: BTreeMap<(Mode, usize), f64>,
    /// The limit (`minimal_limit`), median jobs/s by mode: the better of 1 and 2 connections.
    pub limit: BTreeMap<Mode, f64>,
    /// Pickup latency p50 and p99, milliseconds (enqueue call to handler start).
    pub latency_ms: Option<(f64, f64)>,
    /// graphile_worker's median drain rate at its best tuning, measured between FORGE's
    /// throughput rounds on the same server (`peer`).
    pub peer: Option<f64>,
}

/// Runs the measurements `options` asks for, prints each figure, and returns the ones a caller
/// judges against targets.
pub async fn bench(options: Options) -> Result<Figures, BoxError> {
    let total = options.jobs.unwrap_or(20_000);
    let (rounds, pings, idle_secs) = if options.quick {
        (1, 300, 20)
    } else {
        (3, 1000, 60)
    };
    let (server, log, setup) = match &options.database_url {
        Some(url) => (
            PgServer::external(url)?,
            options.pg_log.clone(),
            format!("external server {}", forge::db::redact_url(url)),
        ),
        None => {
            let server = PgServer::start_with(
                PgOptions::default()
                    .durable(true)
                    .setting("log_line_prefix", "%m [%p] app=%a "),
            )?;
            let log = server.log_file().map(Path::to_owned);
            let data = server
                .data_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default();
            (server, log, format!("throwaway server, data in {data}"))
        }
    };
    let dir = std::env::temp_dir().join(format!("forge-bench-jobs-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut bench = Bench {
        server,
        extra_config: options.extra_config.clone(),
        setup_sql: options.setup_sql.clone(),
        backlog: options.backlog,
        history: options.history,
        exe: std::env::current_exe()?,
        dir,
        next_id: 0,
    };
    {
        let db = bench.server.create_database().await?;
        let pool = db.pool().await?;
        let mut settings = Vec::new();
        for name in [
            "server_version",
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "shared_buffers",
            "max_connections",
        ] {
            let value: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SHOW {name}")))
                .fetch_one(&pool)
                .await?;
            settings.push(format!("{name}={value}"));
        }
        println!(
            "FORGE job queue benchmark ({} mode), {} CPUs",
            if options.quick { "quick" } else { "full" },
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        println!("PostgreSQL on 127.0.0.1:{}: {setup}", bench.server.port());
        println!("  {}", settings.join(", "));
        println!(
            "Nodes: separate processes of this binary, forge.toml defaults (concurrency 16 per node, no tuning)\n"
        );
    }

    let mut figures = Figures {
        throughput: BTreeMap::new(),
        limit: BTreeMap::new(),
        latency_ms: None,
        peer: None,
    };
    let part = |name: &str| options.only.as_deref().is_none_or(|only| only == name);
    let only_nodes: Option<usize> = options.nodes;
    let node_counts: Vec<usize> = [1, 2]
        .into_iter()
        .filter(|n| part("throughput") && only_nodes.is_none_or(|only| only == *n))
        .collect();
    let limits = part("limit");
    let queue_limits = options.only.as_deref() == Some("limits");
    let mut limited_rates: BTreeMap<&str, [Vec<f64>; 3]> = BTreeMap::new();
    let batch = options.batch;
    // Rounds interleaved (peer, FORGE's drains by mode and nodes, the limits), so that a slow
    // minute of a shared machine falls on all of them rather than on one.
    let mut peer = options.peer.clone().filter(|_| !node_counts.is_empty());
    let mut rates: BTreeMap<(Mode, usize), [Vec<f64>; 3]> = BTreeMap::new();
    let mut limit_rates: BTreeMap<(Mode, usize), [Vec<f64>; 3]> = BTreeMap::new();
    let mut peer_rates = Vec::new();
    for round in 1..=rounds {
        if let Some(binary) = &peer {
            match peer_round(binary, &bench.server.url()).await {
                Ok(rate) => {
                    println!(
                        "  throughput, {PEER_LABEL}, round {round}: {rate:>8.0} jobs/s (run() -> no job left)"
                    );
                    peer_rates.push(rate);
                }
                Err(err) => {
                    println!("  {PEER_LABEL}: failed ({err}); FORGE's rounds go on without it");
                    peer = None;
                }
            }
        }
        for &mode in &options.modes {
            for &nodes in &node_counts {
                let d = drain(&mut bench, nodes, total, mode).await?;
                println!(
                    "  throughput, {}, {nodes} node(s), round {round}: {:>8.0} jobs/s (first claim -> last completion), {:>8.0} jobs/s (process start -> all completed); per node {:?}\n    per job: {}",
                    mode.label(),
                    d.drain_per_s,
                    d.wall_per_s,
                    d.per_node,
                    d.cost
                );
                let [drains, walls, enqueues] = rates.entry((mode, nodes)).or_default();
                drains.push(d.drain_per_s);
                walls.push(d.wall_per_s);
                enqueues.push(d.enqueue_per_s);
            }
        }
        if queue_limits {
            let jobs = options.jobs.unwrap_or(4000);
            let rate = format!("{}/1s", jobs / 8);
            let runs: [(&str, Option<QueueLimits>); 3] = [
                ("unlimited", None),
                ("global 16", Some(QueueLimits::new(Some(16), None, None)?)),
                (
                    "rate",
                    Some(QueueLimits::new(None, Some(rate.parse()?), None)?),
                ),
            ];
            for (label, limits) in runs {
                let l = limited_drain(&mut bench, jobs, limits).await?;
                println!(
                    "  limits, {label}, 2 nodes, round {round}: {:>8.0} jobs/s, running on average {:>5.1} in the database (sampled), {:>5.1} from claims to outcomes ({jobs} jobs of {NAP_MS} ms, concurrency 16 per node{})",
                    l.per_s,
                    l.sampled,
                    l.running,
                    if label == "rate" {
                        format!(", rate {rate}")
                    } else {
                        String::new()
                    }
                );
                let [rates, sampled, running] = limited_rates.entry(label).or_default();
                rates.push(l.per_s);
                sampled.push(l.sampled);
                running.push(l.running);
            }
        }
        if limits {
            for &mode in &options.modes {
                for connections in [1, 2] {
                    let (minimal, inserts, minimal_cost) =
                        minimal_limit(&mut bench, connections, batch, total, mode).await?;
                    let (alone, alone_cost) =
                        forge_alone(&mut bench, connections, batch, total, mode).await?;
                    println!(
                        "  limit, {}, {connections} connection(s), round {round}: minimal queue {minimal:>8.0} jobs/s (its inserts {inserts:.0} jobs/s), forge.jobs_step alone {alone:>8.0} jobs/s\n    per job, minimal queue: {minimal_cost}\n    per job, forge.jobs_step alone: {alone_cost}",
                        mode.label()
                    );
                    let [m, a, i] = limit_rates.entry((mode, connections)).or_default();
                    m.push(minimal);
                    a.push(alone);
                    i.push(inserts);
                }
            }
        }
    }
    let runs = |rates: &[f64]| {
        rates
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    for (label, [rates, sampled, running]) in limited_rates {
        println!(
            "LIMITS {label}: median {:.0} jobs/s, running on average: median {:.1} in the database, {:.1} from claims to outcomes (rounds {})",
            median(rates.clone()),
            median(sampled),
            median(running),
            runs(&rates)
        );
    }
    for ((mode, nodes), [drains, walls, enqueues]) in rates {
        let drain = median(drains.clone());
        figures.throughput.insert((mode, nodes), drain);
        println!(
            "THROUGHPUT {nodes} node(s), {}: median {drain:.0} jobs/s (claim->completion; rounds {}), {:.0} jobs/s incl. process start; {total} no-op jobs inserted first, concurrency 16 per node",
            mode.label(),
            runs(&drains),
            median(walls)
        );
        println!(
            "BULK ENQUEUE: median {:.0} jobs/s (enqueue_many, 1,000 jobs per statement)",
            median(enqueues)
        );
    }
    for ((mode, connections), [minimal, alone, inserts]) in &limit_rates {
        let m = median(minimal.clone());
        let best = figures.limit.entry(*mode).or_insert(m);
        *best = best.max(m);
        println!(
            "LIMIT, {}, {connections} connection(s), batches of {batch}: minimal queue median {m:.0} jobs/s (rounds {}; its inserts {:.0} jobs/s), forge.jobs_step alone median {:.0} jobs/s (rounds {}); {total} no-op jobs inserted first",
            mode.label(),
            runs(minimal),
            median(inserts.clone()),
            median(alone.clone()),
            runs(alone)
        );
    }
    if !peer_rates.is_empty() {
        let best = median(peer_rates.clone());
        figures.peer = Some(best);
        println!(
            "PEER {PEER_LABEL}: median {best:.0} jobs/s (rounds {}; 20,000 no-op jobs, concurrency 16; same server, rounds interleaved with FORGE's)",
            runs(&peer_rates)
        );
        for ((mode, nodes), rate) in &figures.throughput {
            println!(
                "  FORGE {nodes} node(s), {} / {PEER_LABEL}: {:.2}x",
                mode.label(),
                rate / best
            );
        }
    }
    for ((mode, nodes), rate) in &figures.throughput {
        if let Some(limit) = figures.limit.get(mode) {
            println!(
                "  FORGE {nodes} node(s), {}: {:.0} % of the limit ({limit:.0} jobs/s)",
                mode.label(),
                100.0 * rate / limit
            );
        }
    }
    if !node_counts.is_empty() || limits {
        println!();
    }

    if part("pool") {
        let cycles = if options.quick { 4_000 } else { 10_000 };
        let rounds = pool_guard(&mut bench, rounds, cycles).await?;
        // Medians over the rounds, by pool and tasks: (per cycle, per acquire).
        let of = |pool: usize, tasks: usize| {
            (
                median(rounds.iter().map(|r| r[pool][tasks].0).collect()),
                median(rounds.iter().map(|r| r[pool][tasks].1).collect()),
            )
        };
        println!(
            "POOL GUARD: acquire, SELECT 1, release, {cycles} cycles a round, medians of {} rounds; the node's pool (a check statement at release, bounded pings) / sqlx's defaults (pings at acquire and release)",
            rounds.len()
        );
        for (tasks, label) in [(0, "1 task"), (1, "16 tasks on 10 connections")] {
            let ((guarded, guarded_wait), (default, default_wait)) = (of(0, tasks), of(1, tasks));
            println!(
                "  {label}: {guarded:.1} / {default:.1} us per cycle (the guard: {:+.1} us per acquire); acquire call {guarded_wait:.1} / {default_wait:.1} us",
                guarded - default
            );
        }
        println!();
    }

    if part("latency") {
        let (client, server) = latency(&mut bench, pings).await?;
        figures.latency_ms = Some((percentile(&client, 50.0), percentile(&client, 99.0)));
        println!(
            "PICKUP LATENCY, one job every 10 ms, n={pings}: enqueue call -> handler start p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            percentile(&client, 50.0),
            percentile(&client, 99.0),
            client.last().copied().unwrap_or_default()
        );
        println!(
            "  of which in the database (the job's insert -> its claim, PostgreSQL's clock): p50 {:.2} ms, p99 {:.2} ms",
            percentile(&server, 50.0),
            percentile(&server, 99.0)
        );
        println!(
            "  (database clock, insert -> claim: p50 {:.2} ms, p99 {:.2} ms)\n",
            percentile(&server, 50.0),
            percentile(&server, 99.0)
        );
    }

    match log.filter(|_| part("idle")) {
        Some(log) => {
            let nodes = 3;
            let per_node = idle(&mut bench, &log, nodes, Duration::from_secs(idle_secs)).await?;
            println!(
                "IDLE, {nodes} nodes with job workers, {idle_secs} s window (election included; the scheduler role is campaigned for because jobs need its maintenance):"
            );
            for (node, (all, jobs)) in &per_node {
                println!(
                    "  {node}: {:.3} statements/s ({:.3} of them by the job queue)",
                    *all as f64 / idle_secs as f64,
                    *jobs as f64 / idle_secs as f64
                );
            }
        }
        None => println!("IDLE: skipped (no server log; pass --pg-log for an external server)"),
    }
    let _ = std::fs::remove_dir_all(&bench.dir);
    Ok(figures)
}
