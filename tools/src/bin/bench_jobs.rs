//! Job queue benchmark: throughput (a backlog of no-op jobs drained by one node and by two),
//! pickup latency at one job every 10 ms, bulk enqueue rate, and idle statements per node.
//!
//! ```text
//! cargo run --release --example bench_jobs                 # 3 rounds of each, 60 s idle window
//! cargo run --release --example bench_jobs -- --quick      # 1 round, 20 s idle window
//! cargo run --release --example bench_jobs -- --database-url postgres://...   # an existing server
//! cargo run --release --example bench_jobs -- --only throughput   # or latency, idle, limit, pool
//! cargo run --release --example bench_jobs -- --only throughput --nodes 1 --jobs 200000
//! cargo run --release --example bench_jobs -- --extra-config $'[jobs.queues]\ndefault = 32'
//! cargo run --release --example bench_jobs -- --only throughput --extra-config $'[jobs]\ncompleted_retention = "0s"'
//! cargo run --release --example bench_jobs -- --quick --only latency --backlog 1000000 --history 10000000
//! cargo run --release --example bench_jobs -- --only throughput --setup-sql 'DROP INDEX forge.jobs_finished'
//! cargo run --release --example bench_jobs -- --only throughput --peers   # graphile_worker side by side
//! cargo run --release --example bench_jobs -- --quick --only limit --both-modes [--batch 128]
//! cargo run --release --example bench_jobs -- --only pool   # what the pool's guard costs
//! ```
//!
//! Side by side with the peer: `--peers` builds `benches/peers` and runs graphile_worker at its
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
//! The pool's guard (`--only pool`): the node's pool checks at each release that the connection
//! is outside any transaction block (one statement, bounded) and pings it, bounded, before
//! handing it out; a pool with sqlx's defaults pings at every acquire and release, unbounded. Both pools (10 connections each, on one database) run cycles
//! of acquire, `SELECT 1`, release, on 1 task and on 16, rounds interleaved: microseconds per
//! cycle and per acquire call, and the difference, what the guard costs per acquire.
//!
//! By default it starts its own throwaway PostgreSQL (forge-testkit: fsync on, full_page_writes
//! on, synchronous_commit on, data in /dev/shm when it has room) and logs statements only during
//! the idle measurement. With `--database-url` it uses that server (for side-by-side runs with
//! `benches/peers`, against the same `forge-pg`), creating a database per measurement; the idle
//! measurement then needs `--pg-log <file>` (the server's log, with `log_line_prefix` containing
//! `app=%a`) and a superuser to switch `log_statement`.
//!
//! Every node is a separate process: this binary with `--jobs-node <forge.toml>`, working the queue
//! `default` with its default concurrency (16) and no tuning: the defaults of forge.toml.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use forge::jobs::{Job, Jobs, NewJob};
use forge::{JobContext, JobError};
use forge_testkit::{NodeProcess, PgOptions, PgServer, TestDatabase};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::process::Command;
use tokio::time::{Instant, sleep, sleep_until};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `--help`: the usage lines of this file's header.
const HELP: &str = "bench_jobs: FORGE's job queue benchmark (see examples/bench_jobs.rs for what each part measures)

  --quick                 1 round of each part, 20 s idle window (default: 3 rounds, 60 s)
  --only PART             throughput, latency, idle, limit or pool
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

/// A job that does nothing but note when it ran, for the node's `FORGE-BENCH DRAIN` line.
#[allow(non_camel_case_types)]
struct noop;

/// How many no-op jobs this node process ran, and when the first started and the last ended
/// (wall clock, microseconds): the drain's span when completed jobs leave no row to time it by
/// (`--extra-config` with `completed_retention = "0s"`).
static HANDLED: AtomicU64 = AtomicU64::new(0);
static FIRST_US: AtomicI64 = AtomicI64::new(0);
static LAST_US: AtomicI64 = AtomicI64::new(0);

impl Job for noop {
    type Args = ();
    const KIND: &'static str = "noop";

    async fn run(&self, _: JobContext, _: ()) -> Result<(), JobError> {
        let _ = FIRST_US.compare_exchange(0, now_us(), Ordering::Relaxed, Ordering::Relaxed);
        HANDLED.fetch_add(1, Ordering::Relaxed);
        LAST_US.fetch_max(now_us(), Ordering::Relaxed);
        Ok(())
    }
}

/// A job that prints how long after its enqueue (wall clock, microseconds) it started.
#[allow(non_camel_case_types)]
struct ping;

impl Job for ping {
    type Args = i64;
    const KIND: &'static str = "ping";

    async fn run(&self, _: JobContext, sent_us: i64) -> Result<(), JobError> {
        println!("FORGE-BENCH LAT {}", now_us() - sent_us);
        Ok(())
    }
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> ExitCode {
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

/// The peer FORGE's drain rate is judged against (issue 11): graphile_worker 0.14 polling every
/// 10 ms with a local queue of 500 and batched completions (`benches/peers`, `--tuning full`).
pub(crate) const PEER_LABEL: &str = "graphile_worker best tuning";

/// Builds `benches/peers` (its own workspace and lock file; the first build fetches and
/// compiles graphile_worker and riverqueue, a few minutes) and returns its binary.
pub(crate) async fn build_peer() -> Result<PathBuf, BoxError> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers");
    let target = dir.join("target");
    println!("Building benches/peers (graphile_worker, riverqueue) for the side-by-side rounds...");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .status()
        .await
        .map_err(|err| format!("could not run cargo to build benches/peers: {err}"))?;
    if !status.success() {
        return Err(format!(
            "building benches/peers failed ({status}); it needs crates.io (graphile_worker 0.14, riverqueue 0.5)"
        )
        .into());
    }
    Ok(target.join("release/forge-peers-bench"))
}

/// One round of the peer on the server of `url` (a database of its own): its drain rate.
async fn peer_round(binary: &Path, url: &str) -> Result<f64, BoxError> {
    let output = Command::new(binary)
        .args([
            url, "--quick", "--only", "graphile", "--tuning", "full", "--cap", "60",
        ])
        .output()
        .await
        .map_err(|err| format!("could not start {}: {err}", binary.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("PEER ")?.split("median ").nth(1))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no PEER line in its output: {}", stdout.trim()).into())
}

/// The argument that makes this binary a node process (`bench_scale` re-executes itself the
/// same way for its jobs part: see there).
pub(crate) const NODE_FLAG: &str = "--jobs-node";

/// The node process.
pub(crate) async fn node(config: String) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let started = async {
        let config = forge::Config::load(&config)?;
        forge::Node::builder(config)
            .auto_register(false)
            .job(noop)
            .job(ping)
            .start()
            .await
    };
    match started.await {
        Ok(node) => {
            println!("FORGE-BENCH READY node={}", node.id());
            let ran = node.run_until_signal().await;
            println!(
                "FORGE-BENCH DRAIN node={} handled={} first_us={} last_us={}",
                std::env::var("FORGE_NODE_ID").unwrap_or_default(),
                HANDLED.load(Ordering::Relaxed),
                FIRST_US.load(Ordering::Relaxed),
                LAST_US.load(Ordering::Relaxed)
            );
            match ran {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// What a completion does with the job's row: keeps it (`completed_retention` at its default,
/// a day) or deletes it (`completed_retention = "0s"`, as graphile_worker does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Mode {
    Kept,
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

    pub(crate) fn label(self) -> &'static str {
        match self {
            Mode::Kept => "completed kept",
            Mode::Deleted => "completed deleted",
        }
    }
}

pub(crate) struct Options {
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
    pub(crate) modes: Vec<Mode>,
    /// Jobs per round trip of the limit's loops (`--batch`, default 128).
    batch: i32,
    database_url: Option<String>,
    pg_log: Option<PathBuf>,
    /// The built `benches/peers` binary: graphile_worker at its best tuning runs one round
    /// before each of FORGE's throughput rounds, on the same server (`--peers`).
    pub(crate) peer: Option<PathBuf>,
}

impl Options {
    /// Every measurement at the defaults, on a throwaway server.
    pub(crate) fn defaults(quick: bool) -> Self {
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
pub(crate) struct Figures {
    /// Median drain rate (first claim to last completion, jobs/s) by mode and number of nodes.
    pub(crate) throughput: BTreeMap<(Mode, usize), f64>,
    /// The limit (`minimal_limit`), median jobs/s by mode: the better of 1 and 2 connections.
    pub(crate) limit: BTreeMap<Mode, f64>,
    /// Pickup latency p50 and p99, milliseconds (enqueue call to handler start).
    pub(crate) latency_ms: Option<(f64, f64)>,
    /// graphile_worker's median drain rate at its best tuning, measured between FORGE's
    /// throughput rounds on the same server (`peer`).
    pub(crate) peer: Option<f64>,
}

struct Bench {
    server: PgServer,
    extra_config: String,
    setup_sql: Option<String>,
    backlog: u64,
    history: u64,
    exe: PathBuf,
    dir: PathBuf,
    next_id: usize,
}

impl Bench {
    /// A fresh database with FORGE's schema, and a forge.toml for it (defaults otherwise, plus
    /// `--extra-config` and `mode`'s settings).
    async fn database(&self, mode: Mode) -> Result<(TestDatabase, PgPool, PathBuf), BoxError> {
        let db = self.server.create_database().await?;
        let pool = db.pool().await?;
        let mut config = forge::Config::default();
        config.database.url = Some(db.url().to_owned());
        config.node.id = Some("bench-migrator".into());
        forge::Node::builder(config)
            .auto_register(false)
            .start()
            .await?
            .shutdown()
            .await;
        self.seed(&pool).await?;
        if let Some(sql) = &self.setup_sql {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                .execute(&pool)
                .await
                .map_err(|err| format!("--setup-sql failed: {err}"))?;
        }
        let path = self.dir.join(format!("{}.toml", db.name()));
        std::fs::write(
            &path,
            format!(
                "[database]\nurl = \"{}\"\n{}\n{}",
                db.url(),
                self.extra_config,
                mode.config()
            ),
        )?;
        Ok((db, pool, path))
    }

    /// The `--backlog` and `--history` rows: jobs no node of the benchmark claims, in the
    /// same table and indexes as the measured ones.
    async fn seed(&self, pool: &PgPool) -> Result<(), BoxError> {
        if self.backlog == 0 && self.history == 0 {
            return Ok(());
        }
        let started = Instant::now();
        for (queue, state, n) in [
            ("backlog", "available", self.backlog),
            ("history", "completed", self.history),
        ] {
            // In chunks of a million: one huge statement would hold all its WAL and locks.
            let mut done = 0;
            while done < n {
                let chunk = (n - done).min(1_000_000);
                sqlx::query(
                    "INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at, attempt,
                                             node_id, attempted_at, finished_at, created_at)
                     SELECT 'forge', $1, 'noop', 'null', $2, now() - interval '1 hour',
                            CASE WHEN $2 = 'completed' THEN 1 ELSE 0 END,
                            CASE WHEN $2 = 'completed' THEN 'gone' END,
                            CASE WHEN $2 = 'completed' THEN now() - interval '1 hour' END,
                            CASE WHEN $2 = 'completed' THEN now() - interval '1 hour' END,
                            now() - interval '1 hour'
                       FROM generate_series(1, $3)",
                )
                .bind(queue)
                .bind(state)
                .bind(chunk as i64)
                .execute(pool)
                .await?;
                done += chunk;
            }
        }
        sqlx::query("VACUUM ANALYZE forge.jobs")
            .execute(pool)
            .await?;
        // The seeding writes gigabytes of WAL: the checkpoints it triggers would otherwise run
        // during the measurement (and every page it touches first would be logged whole), a
        // cost of the seeding, not of the rows kept. (Needs superuser or pg_checkpoint.)
        if let Err(err) = sqlx::query("CHECKPOINT").execute(pool).await {
            println!(
                "  (no CHECKPOINT after seeding: {err}; checkpoints may overlap the measurement)"
            );
        }
        println!(
            "  (seeded {} backlog and {} history jobs in {:.1} s)",
            self.backlog,
            self.history,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    fn spawn(&mut self, config: &Path) -> Result<NodeProcess, BoxError> {
        self.next_id += 1;
        let id = format!("n{}", self.next_id);
        let mut command = Command::new(&self.exe);
        command
            .arg(NODE_FLAG)
            .arg(config)
            .env("FORGE_NODE_ID", &id)
            .env_remove("DATABASE_URL")
            .env_remove("FORGE_ROLES")
            .env_remove("FORGE_METRICS_LISTEN");
        Ok(NodeProcess::spawn(command)?.named(&id))
    }

    async fn ready(node: &mut NodeProcess) -> Result<(), BoxError> {
        node.wait_for_line("READY", Duration::from_secs(30), |l| {
            l.starts_with("FORGE-BENCH READY")
        })
        .await?;
        Ok(())
    }

    async fn stop(mut nodes: Vec<&mut NodeProcess>) -> Result<(), BoxError> {
        for node in &nodes {
            node.terminate()?;
        }
        for node in &mut nodes {
            node.wait_exit(Duration::from_secs(60)).await?;
        }
        Ok(())
    }
}

async fn count(pool: &PgPool, sql: &'static str) -> Result<i64, BoxError> {
    Ok(sqlx::query_scalar(sql).fetch_one(pool).await?)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    percentile(&values, 50.0)
}

struct Drain {
    enqueue_per_s: f64,
    drain_per_s: f64,
    wall_per_s: f64,
    per_node: BTreeMap<String, i64>,
    /// What the enqueue and the drain cost the database, per job.
    cost: Cost,
}

/// A reading of what the database has done so far: PostgreSQL's CPU (every process of the
/// server, from `/proc`, when it runs on this machine), the WAL position and records
/// (`pg_current_wal_insert_lsn()`, `pg_stat_wal`: the whole server), and the row writes of the
/// job tables (`pg_stat_user_tables` of the measurement's database).
struct Meter {
    server_cpu: Option<f64>,
    wal_lsn: i64,
    wal_records: i64,
    wal_fpi: i64,
    /// (table, [inserted, updated, of which HOT, deleted]).
    rows: BTreeMap<String, [i64; 4]>,
}

impl Meter {
    /// PostgreSQL's CPU so far (every live process of the server), without waiting: read it
    /// before the sessions of a measurement end (an ended process takes its time with it).
    async fn server_cpu(pool: &PgPool) -> Result<Option<f64>, BoxError> {
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(pool)
            .await?;
        Ok(forge_testkit::stats::parent_pid(pid as u32)
            .and_then(forge_testkit::stats::tree_cpu_seconds))
    }

    async fn read(pool: &PgPool) -> Result<Meter, BoxError> {
        // Backends publish their row and WAL counts when idle, at most once a second: wait
        // for the ones of the statements just run.
        sleep(Duration::from_millis(1200)).await;
        let (pid, lsn, records, fpi): (i32, i64, i64, i64) = sqlx::query_as(
            "SELECT pg_backend_pid(), (pg_current_wal_insert_lsn() - '0/0')::bigint,
                    wal_records, wal_fpi
               FROM pg_stat_wal",
        )
        .fetch_one(pool)
        .await?;
        let server_cpu = forge_testkit::stats::parent_pid(pid as u32)
            .and_then(forge_testkit::stats::tree_cpu_seconds);
        let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
            "SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
               FROM pg_stat_user_tables
              WHERE (schemaname = 'forge' AND relname LIKE 'jobs%') OR schemaname = 'minimal'",
        )
        .fetch_all(pool)
        .await?;
        Ok(Meter {
            server_cpu,
            wal_lsn: lsn,
            wal_records: records,
            wal_fpi: fpi,
            rows: rows
                .into_iter()
                .map(|(t, i, u, h, d)| (t, [i, u, h, d]))
                .collect(),
        })
    }

    /// What happened since `before`, per job of `jobs`.
    fn since(&self, before: &Meter, jobs: usize) -> Cost {
        let n = jobs.max(1) as f64;
        Cost {
            server_cpu_us: self
                .server_cpu
                .zip(before.server_cpu)
                .map(|(a, b)| (a - b) * 1e6 / n),
            wal_bytes: (self.wal_lsn - before.wal_lsn) as f64 / n,
            wal_records: (self.wal_records - before.wal_records) as f64 / n,
            wal_fpi: (self.wal_fpi - before.wal_fpi) as f64 / n,
            rows: self
                .rows
                .iter()
                .map(|(t, now)| {
                    let was = before.rows.get(t).copied().unwrap_or_default();
                    let per = |i: usize| (now[i] - was[i]) as f64 / n;
                    (t.clone(), [per(0), per(1), per(2), per(3)])
                })
                .filter(|(_, r)| r.iter().any(|v| *v > 0.0))
                .collect(),
            ..Cost::default()
        }
    }
}

/// PostgreSQL's CPU per job between `before` and a reading `now` taken while the measurement's
/// sessions still lived, in microseconds.
fn cpu_per_job(now: Option<f64>, before: &Meter, jobs: usize) -> Option<f64> {
    now.zip(before.server_cpu)
        .map(|(a, b)| (a - b) * 1e6 / jobs.max(1) as f64)
}

/// Waits for the loops of a limit measurement and reads what they cost: PostgreSQL's CPU while
/// their sessions (`loopers`) live, the rest once they have ended. Returns the seconds since
/// `began` and the cost per job since `m0`.
async fn loops_done(
    loops: Vec<tokio::task::JoinHandle<Result<(), BoxError>>>,
    began: Instant,
    pool: &PgPool,
    loopers: PgPool,
    m0: &Meter,
    total: usize,
) -> Result<(f64, Cost), BoxError> {
    for l in loops {
        l.await??;
    }
    let wall = began.elapsed().as_secs_f64();
    let cpu = Meter::server_cpu(pool).await?;
    loopers.close().await;
    let mut cost = Meter::read(pool).await?.since(m0, total);
    cost.server_cpu_us = cpu_per_job(cpu, m0, total);
    Ok((wall, cost))
}

/// What a measurement cost the database, per job (see [`Meter`]): the drain's (or the loop's)
/// CPU and WAL, the enqueue's, and the rows written from enqueue to completion.
#[derive(Default)]
struct Cost {
    server_cpu_us: Option<f64>,
    nodes_cpu_us: Option<f64>,
    enqueue_cpu_us: Option<f64>,
    enqueue_wal_bytes: f64,
    wal_bytes: f64,
    wal_records: f64,
    wal_fpi: f64,
    rows: BTreeMap<String, [f64; 4]>,
}

impl std::fmt::Display for Cost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(cpu) = self.server_cpu_us {
            write!(f, "PostgreSQL CPU {cpu:.1} us, ")?;
        }
        if let Some(cpu) = self.nodes_cpu_us {
            write!(f, "nodes' CPU {cpu:.1} us, ")?;
        }
        write!(
            f,
            "WAL {:.0} bytes in {:.2} records ({:.3} full pages)",
            self.wal_bytes, self.wal_records, self.wal_fpi
        )?;
        if self.enqueue_wal_bytes > 0.0 {
            write!(f, "; enqueue: WAL {:.0} bytes", self.enqueue_wal_bytes)?;
            if let Some(cpu) = self.enqueue_cpu_us {
                write!(f, ", PostgreSQL CPU {cpu:.1} us")?;
            }
        }
        for (table, [ins, upd, hot, del]) in &self.rows {
            write!(
                f,
                "; {table}: {ins:.2} inserted, {upd:.2} updated ({hot:.2} HOT), {del:.2} deleted"
            )?;
        }
        Ok(())
    }
}

/// Inserts `total` no-op jobs (bulk, 1,000 per statement), then starts `nodes` node processes
/// and waits until every job is completed.
async fn drain(
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
        // process shares the CPUs with the nodes and PostgreSQL.
        let busy: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM forge.jobs WHERE namespace = 'forge' AND queue = 'default'
                               AND state = 'available' AND role IS NULL)
                 OR EXISTS (SELECT 1 FROM forge.jobs WHERE namespace = 'forge' AND state = 'running')",
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

/// FORGE's SQL alone: `forge.jobs_step`, the statement FORGE's workers send, driven in a loop
/// with nothing around it (no node, no handlers, no notifications) on `connections`
/// connections, each recording the previous batch as completed (kept as `completed` rows, or
/// deleted: `mode`) while claiming the next `batch`. Returns jobs/s from the first claim to
/// the last completion (database clock; by the wall clock around the loops when completed
/// jobs leave no row).
async fn forge_alone(
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
    let m0 = Meter::read(&pool).await?;
    let loopers = db.pool().await?;
    let began = Instant::now();
    let mut loops = Vec::new();
    for c in 0..connections {
        let pool = loopers.clone();
        loops.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            let node = format!("limit{c}");
            let (mut ids, mut attempts): (Vec<i64>, Vec<i32>) = (Vec::new(), Vec::new());
            loop {
                let n = ids.len();
                let rows: Vec<(i64, bool, Option<i32>)> = sqlx::query_as(
                    "SELECT id, claimed, attempt FROM forge.jobs_step('forge', $1, 'default', NULL, NULL, NULL,
                        ARRAY['noop'], $2, $2, '{}', $3, $4, $5, $6, $7, 20, NULL, NULL, NULL, $8)",
                )
                .bind(&node)
                .bind(batch)
                .bind(&ids)
                .bind(&attempts)
                .bind(vec!["completed"; n])
                .bind(vec![None::<i64>; n])
                .bind(vec![None::<serde_json::Value>; n])
                .bind(keep)
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
async fn minimal_limit(
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

/// Cycles of acquire, `SELECT 1`, release on `pool`, `cycles` on each of `tasks` tasks:
/// microseconds per cycle (wall clock over all of them) and per acquire call (the mean wait).
async fn pool_cycles(pool: &PgPool, tasks: usize, cycles: usize) -> Result<(f64, f64), BoxError> {
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
async fn pool_guard(
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

/// One `ping` every 10 ms through one connection; the node prints each pickup latency.
async fn latency(bench: &mut Bench, n: usize) -> Result<(Vec<f64>, Vec<f64>), BoxError> {
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

/// Statements per node while `nodes` nodes idle for `window`, from the server's statement log.
async fn idle(
    bench: &mut Bench,
    log: &Path,
    nodes: usize,
    window: Duration,
) -> Result<BTreeMap<String, (usize, usize)>, BoxError> {
    let (_db, pool, config) = bench.database(Mode::Kept).await?;
    sqlx::query("ALTER SYSTEM SET log_statement = 'all'")
        .execute(&pool)
        .await?;
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&pool)
        .await?;
    let mut processes = Vec::new();
    for _ in 0..nodes {
        let mut process = bench.spawn(&config)?;
        Bench::ready(&mut process).await?;
        processes.push(process);
    }
    // Let start-up settle (elections, first maintenance passes), then measure a clean window.
    sleep(Duration::from_secs(5)).await;
    let start_len = std::fs::metadata(log)?.len();
    sleep(window).await;
    let text = std::fs::read(log)?;
    sqlx::query("ALTER SYSTEM RESET log_statement")
        .execute(&pool)
        .await?;
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&pool)
        .await?;
    Bench::stop(processes.iter_mut().collect()).await?;

    let text = String::from_utf8_lossy(&text[start_len as usize..]);
    let mut per_node: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for line in text.lines() {
        let is_statement = line.contains(" LOG:  statement: ") || line.contains(" LOG:  execute ");
        if !is_statement {
            continue;
        }
        let Some(app) = line
            .split(" app=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
        else {
            continue;
        };
        if !app.starts_with("forge:") || app.starts_with("forge:setup:") {
            continue;
        }
        let Some(node) = app.rsplit(':').next() else {
            continue;
        };
        let entry = per_node.entry(node.to_owned()).or_default();
        entry.0 += 1;
        if line.contains("forge.jobs_") || line.contains("forge.nodes") {
            entry.1 += 1;
        }
    }
    Ok(per_node)
}

pub(crate) async fn bench(options: Options) -> Result<Figures, BoxError> {
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
            format!("external server {}", forge::redact_url(url)),
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
