//! Soak benchmark: three node processes of a user-style binary under random faults, and the
//! ledger of what the guarantees survived.
//!
//! ```text
//! cargo run --release --example soak -- --minutes 30            # the full soak
//! cargo run --release --example soak -- --minutes 3 --seed 42   # replay a run's fault choices
//! cargo run --release --example soak -- --interval 5-10         # denser faults (default 5-30 s)
//! ```
//!
//! The harness starts a throwaway PostgreSQL (fsync on) with an asynchronous streaming standby,
//! one [`PgProxy`] per node (so one node's connections can be black-holed alone and a primary
//! failover is a promotion plus a retarget), and three node processes: this binary re-executed
//! as `soak node <forge.toml>`. Each node registers, explicitly:
//!
//! * `soak_tick`, a per-second cron (`catch_up = "all"`, `overlap = "wait"`) whose handler, in
//!   its fenced transaction, inserts an effect row (no unique key: a repeated effect is a second
//!   row), enqueues one `soak_tx_job` and one `soak_plain_job`, and completes the tick in the
//!   same commit: exactly once;
//! * `soak_tx_job`, which inserts its effect and completes the job in one transaction: exactly
//!   once;
//! * `soak_plain_job`, which inserts its effect with autocommit before returning: at least once
//!   (duplicates are counted, not failures);
//! * `soak_hog`, which holds one pool connection for a while (pool starvation), on a queue only
//!   its node works;
//! * a leader task per built-in role writing a fenced row every 500 ms (for the overlap check).
//!
//! Timings are small so that faults matter: lease 3 s, renewal 1 s, lock_timeout 1 s,
//! check_interval 500 ms, drain 2 s, heartbeat 500 ms, drifted after 1.5 s, down after 4 s,
//! a pool of 5 connections.
//!
//! Every 5-30 s (seeded; the seed is printed) the harness applies one fault, drawn from a
//! shuffled deck so that every kind comes up before any repeats: SIGKILL (restart after 1-4 s),
//! SIGTERM (restart once it exited), SIGSTOP for longer than the lease then SIGCONT, PostgreSQL
//! fast restart, immediate (crash) restart, primary failover (crash the primary, promote the
//! standby, retarget the proxies, build a new standby for the next one; half of the failovers
//! first black-hole the standby's replication for 2-5 s, so that the last seconds of commits
//! are lost, as with an asynchronous standby that fell behind), `pg_terminate_backend`
//! of node sessions, pool sessions or lock sessions, a black hole on one node's proxy for
//! longer than down_after (then healed, and the dead flows severed), pool starvation, and lost
//! replies after commit (a deferred trigger makes the node's next effect COMMIT sleep 1.5 s on
//! the server; the node is SIGKILLed meanwhile: the commit completes, the reply is never heard).
//!
//! After the last fault everything is healed, dead nodes are restarted, the backlog drains
//! (bounded), the nodes are stopped with SIGTERM, and the ledger is computed from the
//! database: duplicate effects, missing ticks, lost or stuck jobs, reruns, overlapping epochs,
//! node RSS over time. One PASS/FAIL line per target; the exit status is non-zero when a
//! target is missed. Node logs are kept in the printed run directory.
//!
//! Why `overlap = "wait"`: with the default `"skip"`, a tick that comes due while the previous
//! run is still going (a commit held 1.5 s by the lost-reply trigger, a starved pool) is
//! recorded as `skipped` by design and its effect never happens; "0 missing ticks" is only a
//! meaningful target when every tick runs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge::jobs::{Jobs, NewJob};
use forge::{
    Config, CronContext, CronError, JobContext, JobError, Leadership, LockNamespace, Node, Role,
};
use forge_testkit::{Filter, NodeProcess, PgOptions, PgProxy, PgServer};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::process::Command;
use tokio::task::JoinHandle;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "usage: soak [--minutes N] [--seed N] [--interval MIN-MAX]";

/// The node processes.
const NODE_IDS: [&str; 3] = ["n1", "n2", "n3"];
/// `[cluster.leader_election] lease_duration`.
const LEASE: Duration = Duration::from_secs(3);
/// `[cluster.membership] down_after`.
const DOWN_AFTER: Duration = Duration::from_secs(4);
/// `[database] max_connections` of every node.
const POOL_SIZE: u32 = 5;
/// How long a lost-reply COMMIT sleeps on the server (in `SETUP_SQL`).
const SLOW_COMMIT_SECS: f64 = 1.5;
/// The "work" each handler does in the middle of its run (inside the transaction for the
/// transactional ones, between the effect and the return for the plain job), so that faults
/// land mid-run: reruns, and the plain job's at-least-once duplicates, become observable.
const WORK: Duration = Duration::from_millis(250);
/// How often node RSS is sampled.
const RSS_EVERY: Duration = Duration::from_secs(30);
/// Bound of every query the harness makes.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the backlog may take to drain after the faults.
const DRAIN_DEADLINE: Duration = Duration::from_secs(180);
/// A node with RSS above this fails the memory target whatever its history.
const RSS_CAP_KIB: u64 = 512 * 1024;

/// The cron and job kinds of the soak.
const CRON: &str = "soak_tick";
const TX_JOB: &str = "soak_tx_job";
const PLAIN_JOB: &str = "soak_plain_job";
/// The pool hogs' kinds, as a LIKE pattern (one kind per node).
const HOG_JOB: &str = "soak_hog%";

/// The application's tables, made by the harness before the nodes start. No unique key on
/// the effects: a repeated effect is a second row, so duplicates can be counted. The deferred
/// constraint triggers make a COMMIT sleep on the server while a flag names the committing
/// node (lost replies), and record the commit's key in the same transaction, so that a commit
/// that completed after its node died can be found afterwards.
const SETUP_SQL: &str = r#"
CREATE TABLE soak_cron_effects (
    id           bigserial   PRIMARY KEY,
    scheduled_at timestamptz NOT NULL,
    attempt      integer     NOT NULL,
    node         text        NOT NULL,
    epoch        bigint      NOT NULL,
    tenure       bigint      NOT NULL,
    at           timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX soak_cron_effects_tick ON soak_cron_effects (scheduled_at);

CREATE TABLE soak_job_effects (
    id      bigserial   PRIMARY KEY,
    job_id  bigint      NOT NULL,
    kind    text        NOT NULL,
    attempt integer     NOT NULL,
    node    text        NOT NULL,
    tick_us bigint      NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX soak_job_effects_job ON soak_job_effects (job_id);

CREATE TABLE soak_leader_work (
    id     bigserial   PRIMARY KEY,
    role   text        NOT NULL,
    epoch  bigint      NOT NULL,
    tenure bigint      NOT NULL,
    node   text        NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE soak_flags (
    kind text NOT NULL,
    node text NOT NULL,
    PRIMARY KEY (kind, node)
);

CREATE TABLE soak_lost_replies (
    kind        text        NOT NULL,
    node        text        NOT NULL,
    key         bigint      NOT NULL,
    backend_pid integer     NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE FUNCTION soak_slow_cron_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM soak_flags f WHERE f.kind = 'cron' AND f.node = NEW.node) THEN
        INSERT INTO soak_lost_replies (kind, node, key, backend_pid)
        VALUES ('cron', NEW.node, (extract(epoch FROM NEW.scheduled_at) * 1000000)::bigint,
                pg_backend_pid());
        PERFORM pg_sleep(1.5);
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER soak_slow_cron_commit AFTER INSERT ON soak_cron_effects
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION soak_slow_cron_commit();

CREATE FUNCTION soak_slow_job_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM soak_flags f WHERE f.kind = 'tx_job' AND f.node = NEW.node) THEN
        INSERT INTO soak_lost_replies (kind, node, key, backend_pid)
        VALUES ('tx_job', NEW.node, NEW.job_id, pg_backend_pid());
        PERFORM pg_sleep(1.5);
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER soak_slow_job_commit AFTER INSERT ON soak_job_effects
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.kind = 'tx')
    EXECUTE FUNCTION soak_slow_job_commit();
"#;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("node") {
        return node_main(args.get(2).cloned().unwrap_or_default()).await;
    }
    let options = match Options::parse(&args[1..]) {
        Ok(options) => options,
        Err(err) => {
            eprintln!("error: {err}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match soak(options).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Node mode: the user-style binary.
// ---------------------------------------------------------------------------------------------

/// The arguments of the jobs a tick enqueues: the tick's instant.
#[derive(Serialize, Deserialize)]
struct TickArgs {
    tick_us: i64,
}

/// The arguments of a pool hog: how long to hold the connection.
#[derive(Serialize, Deserialize)]
struct HogArgs {
    hold_ms: u64,
}

/// One node process: runs until SIGTERM, or until the harness is gone.
async fn node_main(config_path: String) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,forge=info".into()),
        )
        .init();
    exit_with_parent();
    let config = match Config::load(&config_path) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut builder = Node::builder(config)
        .auto_register(false)
        .cron(soak_tick)
        .job(soak_tx_job)
        .job(soak_plain_job)
        .job(soak_hog_n1)
        .job(soak_hog_n2)
        .job(soak_hog_n3);
    for role in Role::BUILTIN {
        builder = builder.leader_task(role, "soak_work", leader_work);
    }
    let node = match builder.start().await {
        Ok(node) => node,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    println!("SOAK-READY {}", node.id());
    let stopped = node.run_until_signal().await;
    println!("SOAK-STOPPED {}", node.id());
    match stopped {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// A node whose harness died (killed, crashed) exits instead of running on as an orphan.
fn exit_with_parent() {
    let parent = std::os::unix::process::parent_id();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if std::os::unix::process::parent_id() != parent {
                eprintln!("soak node: the harness is gone; exiting");
                std::process::exit(3);
            }
        }
    });
}

/// The per-second cron: effect, two jobs and the tick's completion in one fenced commit.
/// Errors before the commit (a database restarting, a starved pool) are retried within the
/// run: nothing was committed, so a retry cannot duplicate anything. An error of the COMMIT
/// itself is ambiguous (it may have committed) and is returned, never retried.
#[forge::cron("* * * * * *", name = "soak_tick", catch_up = "all", overlap = "wait")]
async fn soak_tick(ctx: CronContext) -> Result<(), CronError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        match tick_transaction(&ctx).await {
            Ok(tx) => {
                tx.commit().await?;
                return Ok(());
            }
            Err(err @ (forge::Error::Fenced { .. } | forge::Error::NotRunning { .. })) => {
                return Err(err.into());
            }
            Err(err) => {
                if ctx.is_cancelled() || started.elapsed() > Duration::from_secs(60) {
                    return Err(err.into());
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// The tick's transaction, ready to commit.
async fn tick_transaction(
    ctx: &CronContext,
) -> forge::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let mut tx = ctx.fenced_transaction().await?;
    sqlx::query(
        "INSERT INTO soak_cron_effects (scheduled_at, attempt, node, epoch, tenure)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(ctx.scheduled_at())
    .bind(ctx.attempt() as i32)
    .bind(ctx.node_id().to_string())
    .bind(ctx.epoch().0)
    .bind(ctx.leadership().tenure_id())
    .execute(&mut *tx)
    .await?;
    tokio::time::sleep(WORK).await;
    let jobs = Jobs::new(ctx.pool().clone(), ctx.leadership().namespace());
    let tick_us = ctx.scheduled_at().timestamp_micros();
    jobs.enqueue_in(&mut *tx, soak_tx_job, TickArgs { tick_us })
        .await?;
    jobs.enqueue_in(&mut *tx, soak_plain_job, TickArgs { tick_us })
        .await?;
    ctx.complete(&mut tx).await?;
    Ok(tx)
}

/// Transactional job: its effect and its completion commit together (exactly once).
#[forge::job(
    name = "soak_tx_job",
    max_attempts = 100,
    backoff = "exponential",
    backoff_base = "200ms",
    backoff_max = "5s"
)]
async fn soak_tx_job(ctx: JobContext, args: TickArgs) -> Result<(), JobError> {
    let mut tx = ctx.pool().begin().await?;
    sqlx::query(
        "INSERT INTO soak_job_effects (job_id, kind, attempt, node, tick_us)
         VALUES ($1, 'tx', $2, $3, $4)",
    )
    .bind(ctx.id().0)
    .bind(ctx.attempt() as i32)
    .bind(ctx.node_id().to_string())
    .bind(args.tick_us)
    .execute(&mut *tx)
    .await?;
    tokio::time::sleep(WORK).await;
    ctx.complete(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// Non-transactional job: its effect commits on its own before the job completes (at least
/// once: an attempt cut short after the effect runs again).
#[forge::job(
    name = "soak_plain_job",
    max_attempts = 100,
    backoff = "exponential",
    backoff_base = "200ms",
    backoff_max = "5s"
)]
async fn soak_plain_job(ctx: JobContext, args: TickArgs) -> Result<(), JobError> {
    sqlx::query(
        "INSERT INTO soak_job_effects (job_id, kind, attempt, node, tick_us)
         VALUES ($1, 'plain', $2, $3, $4)",
    )
    .bind(ctx.id().0)
    .bind(ctx.attempt() as i32)
    .bind(ctx.node_id().to_string())
    .bind(args.tick_us)
    .execute(ctx.pool())
    .await?;
    tokio::time::sleep(WORK).await;
    Ok(())
}

/// Pool starvation: holds one of the node's pool connections (busy in `pg_sleep`) for
/// `hold_ms`. Always succeeds, whatever happened to the connection.
async fn hog(ctx: JobContext, args: HogArgs) -> Result<(), JobError> {
    if let Ok(mut conn) = ctx.pool().acquire().await {
        let _ = sqlx::query("SELECT pg_sleep($1)")
            .bind(args.hold_ms as f64 / 1000.0)
            .execute(&mut *conn)
            .await;
    }
    Ok(())
}

// One hog type per node, each declaring a queue only that node works: a node works a queue of
// `[jobs.queues]` only for the job types that declare it (a job enqueued with
// `NewJob::queue(...)` onto a queue no registered type declares is never claimed).

/// Pool hog of n1 (queue `hog_n1`).
#[forge::job(name = "soak_hog_n1", queue = "hog_n1", max_attempts = 100)]
async fn soak_hog_n1(ctx: JobContext, args: HogArgs) -> Result<(), JobError> {
    hog(ctx, args).await
}

/// Pool hog of n2 (queue `hog_n2`).
#[forge::job(name = "soak_hog_n2", queue = "hog_n2", max_attempts = 100)]
async fn soak_hog_n2(ctx: JobContext, args: HogArgs) -> Result<(), JobError> {
    hog(ctx, args).await
}

/// Pool hog of n3 (queue `hog_n3`).
#[forge::job(name = "soak_hog_n3", queue = "hog_n3", max_attempts = 100)]
async fn soak_hog_n3(ctx: JobContext, args: HogArgs) -> Result<(), JobError> {
    hog(ctx, args).await
}

/// The pool hog job for a node's queue.
fn hog_job(node: &str, args: HogArgs) -> Option<NewJob> {
    Some(match node {
        "n1" => NewJob::new(soak_hog_n1, args),
        "n2" => NewJob::new(soak_hog_n2, args),
        "n3" => NewJob::new(soak_hog_n3, args),
        _ => return None,
    })
}

/// Leader-only work of every built-in role: a fenced row every 500 ms, for the overlap check.
async fn leader_work(leadership: Leadership) {
    loop {
        if leadership.is_draining() {
            return;
        }
        if leadership.is_valid() {
            let _ = async {
                let mut tx = leadership.fenced_transaction().await?;
                sqlx::query(
                    "INSERT INTO soak_leader_work (role, epoch, tenure, node) VALUES ($1, $2, $3, $4)",
                )
                .bind(leadership.role().name())
                .bind(leadership.epoch().0)
                .bind(leadership.tenure_id())
                .bind(leadership.node_id().to_string())
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok::<_, forge::Error>(())
            }
            .await;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = leadership.stopping() => return,
        }
    }
}

/// A node's forge.toml: small timings so that faults matter.
fn node_config(url: &str, id: &str) -> String {
    format!(
        r#"[database]
url = "{url}"
max_connections = {POOL_SIZE}
connect_timeout = "10s"

[cluster.leader_election]
check_interval = "500ms"
lease_duration = "{lease}s"
refresh_interval = "1s"
lock_timeout = "1s"
drain_timeout = "2s"

[cluster.membership]
heartbeat_interval = "500ms"
drift_after = "1500ms"
down_after = "{down}s"

[jobs]
maintenance_interval = "5s"
drain_timeout = "2s"

[jobs.queues]
default = 8
hog_{id} = {hogs}
"#,
        lease = LEASE.as_secs(),
        down = DOWN_AFTER.as_secs(),
        hogs = POOL_SIZE + 3,
    )
}

// ---------------------------------------------------------------------------------------------
// Harness.
// ---------------------------------------------------------------------------------------------

struct Options {
    minutes: f64,
    seed: u64,
    interval: (f64, f64),
}

impl Options {
    fn parse(args: &[String]) -> Result<Options, String> {
        let mut options = Options {
            minutes: 30.0,
            seed: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 ^ u64::from(std::process::id()))
                .unwrap_or(1),
            interval: (5.0, 30.0),
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match arg.as_str() {
                "--minutes" => {
                    options.minutes = value("--minutes")?
                        .parse()
                        .ok()
                        .filter(|m: &f64| *m > 0.0)
                        .ok_or("--minutes: a positive number")?;
                }
                "--seed" => {
                    options.seed = value("--seed")?
                        .parse()
                        .map_err(|_| "--seed: an unsigned integer")?;
                }
                "--interval" => {
                    let text = value("--interval")?;
                    let parsed = text
                        .split_once('-')
                        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                        .filter(|(a, b): &(f64, f64)| *a > 0.0 && a <= b);
                    options.interval =
                        parsed.ok_or("--interval: MIN-MAX in seconds, such as 5-30")?;
                }
                "-h" | "--help" => return Err("help".into()),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(options)
    }
}

/// SplitMix64: small, seedable, good enough to pick faults.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn secs(&mut self, lo: f64, hi: f64) -> Duration {
        Duration::from_secs_f64(lo + (hi - lo) * self.unit())
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum FaultKind {
    SigKill,
    SigTerm,
    SigStop,
    PgFastRestart,
    PgImmediateRestart,
    Failover,
    TerminateNodeSessions,
    TerminatePoolSessions,
    TerminateLockSessions,
    BlackHole,
    PoolStarvation,
    LostReplyCron,
    LostReplyJob,
}

impl FaultKind {
    const ALL: [FaultKind; 13] = [
        FaultKind::SigKill,
        FaultKind::SigTerm,
        FaultKind::SigStop,
        FaultKind::PgFastRestart,
        FaultKind::PgImmediateRestart,
        FaultKind::Failover,
        FaultKind::TerminateNodeSessions,
        FaultKind::TerminatePoolSessions,
        FaultKind::TerminateLockSessions,
        FaultKind::BlackHole,
        FaultKind::PoolStarvation,
        FaultKind::LostReplyCron,
        FaultKind::LostReplyJob,
    ];

    fn name(self) -> &'static str {
        match self {
            FaultKind::SigKill => "SIGKILL",
            FaultKind::SigTerm => "SIGTERM",
            FaultKind::SigStop => "SIGSTOP/SIGCONT",
            FaultKind::PgFastRestart => "PostgreSQL fast restart",
            FaultKind::PgImmediateRestart => "PostgreSQL immediate restart",
            FaultKind::Failover => "primary failover",
            FaultKind::TerminateNodeSessions => "pg_terminate_backend node sessions",
            FaultKind::TerminatePoolSessions => "pg_terminate_backend pool sessions",
            FaultKind::TerminateLockSessions => "pg_terminate_backend lock sessions",
            FaultKind::BlackHole => "black hole (half-open)",
            FaultKind::PoolStarvation => "pool starvation",
            FaultKind::LostReplyCron => "lost reply after commit (cron)",
            FaultKind::LostReplyJob => "lost reply after commit (tx job)",
        }
    }
}

/// Where a node process is in its life.
enum Phase {
    /// Spawned; not ready yet.
    Starting { proc: NodeProcess, since: Instant },
    /// Ready and running.
    Running { proc: NodeProcess },
    /// SIGSTOPped until `resume_at`.
    Paused {
        proc: NodeProcess,
        resume_at: Instant,
    },
    /// SIGTERM sent at `since`.
    Terminating { proc: NodeProcess, since: Instant },
    /// Not running; restarted at `restart_at`.
    Dead { restart_at: Instant },
}

impl Phase {
    fn proc(&self) -> Option<&NodeProcess> {
        match self {
            Phase::Starting { proc, .. }
            | Phase::Running { proc }
            | Phase::Paused { proc, .. }
            | Phase::Terminating { proc, .. } => Some(proc),
            Phase::Dead { .. } => None,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Phase::Starting { .. } => "starting",
            Phase::Running { .. } => "up",
            Phase::Paused { .. } => "paused",
            Phase::Terminating { .. } => "stopping",
            Phase::Dead { .. } => "down",
        }
    }
}

/// One node id: its proxy, its config file, its current process.
struct Slot {
    id: String,
    proxy: PgProxy,
    config: PathBuf,
    phase: Phase,
    /// Processes started so far under this id.
    incarnation: u32,
    started: Instant,
    /// A black hole on the node's proxy, healed at this instant.
    blackhole_until: Option<Instant>,
    /// Another node-level fault (starvation) is under way until this instant.
    busy_until: Option<Instant>,
    /// When to look whether the pool hogs hold the node's pool.
    starve_check_at: Option<Instant>,
    start_failures: u32,
    unexpected_exits: u32,
}

/// A lost-reply fault waiting for the node's next slow COMMIT.
struct Armed {
    slot: usize,
    kind: &'static str,
    deadline: Instant,
}

/// A standby being built: the server and the proxy it replicates through.
type StandbyBuild = Result<(PgServer, Arc<PgProxy>), forge_testkit::Error>;

/// Starts a streaming standby of `primary` replicating through a new proxy.
fn build_standby(primary: &PgServer) -> StandbyBuild {
    let proxy = Arc::new(PgProxy::start(primary.host(), primary.port())?);
    let standby = primary.start_standby(Some(&proxy))?;
    Ok((standby, proxy))
}

struct FaultRecord {
    at: f64,
    kind: FaultKind,
    text: String,
}

/// RSS of each node at one instant: (incarnation, uptime, KiB).
struct RssSample {
    at: f64,
    nodes: Vec<Option<(u32, f64, u64)>>,
}

struct Harness {
    t0: Instant,
    rng: Rng,
    interval: (f64, f64),
    dir: PathBuf,
    primary: Arc<PgServer>,
    standby: Option<Arc<PgServer>>,
    /// The proxy the standby replicates through (to make it fall behind).
    repl_proxy: Option<Arc<PgProxy>>,
    standby_build: Option<JoinHandle<StandbyBuild>>,
    standby_retry_at: Option<Instant>,
    /// A lossy failover under way: the standby's replication is black-holed; the primary is
    /// crashed and the standby promoted at this instant.
    pending_failover: Option<Instant>,
    /// WAL bytes the promoted standby lacked, per failover.
    failover_losses: Vec<u64>,
    admin_proxy: PgProxy,
    admin: PgPool,
    slots: Vec<Slot>,
    deck: Vec<FaultKind>,
    faults: Vec<FaultRecord>,
    /// Things that should not happen (each is a target miss or a harness problem).
    findings: Vec<String>,
    armed: Option<Armed>,
    /// Backend pids of COMMITs whose node was killed while they slept.
    lost_reply_pids: Vec<i32>,
    failovers: u32,
    term_exits: Vec<(String, f64, String)>,
    rss: Vec<RssSample>,
    /// ERROR lines and panics in the node logs.
    error_lines: usize,
    error_examples: Vec<String>,
}

async fn soak(options: Options) -> Result<bool, BoxError> {
    println!(
        "FORGE soak: {} node processes, {} min of random faults every {}-{} s",
        NODE_IDS.len(),
        options.minutes,
        options.interval.0,
        options.interval.1
    );
    println!(
        "seed {} (rerun with --seed {} to replay the same fault choices and timings)",
        options.seed, options.seed
    );
    let primary =
        tokio::task::spawn_blocking(|| PgServer::start_with(PgOptions::default().durable(true)))
            .await??;
    let primary = Arc::new(primary);
    let db = primary.create_database().await?;
    let db_name = db.name().to_owned();
    let admin_proxy = PgProxy::start(primary.host(), primary.port())?;
    let admin_url = format!(
        "{}?application_name=forge-soak-harness",
        admin_proxy.url_for(&primary, &db_name)
    );
    let admin = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(ADMIN_TIMEOUT)
        .connect_lazy(&admin_url)?;
    sqlx::raw_sql(SETUP_SQL).execute(&admin).await?;
    let source = primary.clone();
    let (standby, repl_proxy) =
        tokio::task::spawn_blocking(move || build_standby(&source)).await??;

    let dir = std::env::temp_dir().join(format!("forge-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut slots = Vec::new();
    for id in NODE_IDS {
        let proxy = PgProxy::start(primary.host(), primary.port())?;
        let text = node_config(&proxy.url_for(&primary, &db_name), id);
        Config::from_toml(&text)?;
        let config = dir.join(format!("{id}.toml"));
        std::fs::write(&config, text)?;
        slots.push(Slot {
            id: id.to_owned(),
            proxy,
            config,
            phase: Phase::Dead {
                restart_at: Instant::now(),
            },
            incarnation: 0,
            started: Instant::now(),
            blackhole_until: None,
            busy_until: None,
            starve_check_at: None,
            start_failures: 0,
            unexpected_exits: 0,
        });
    }
    println!(
        "PostgreSQL primary on 127.0.0.1:{} (fsync on), streaming standby on 127.0.0.1:{}, one proxy per node",
        primary.port(),
        standby.port()
    );
    println!(
        "timings: lease {} s, refresh 1 s, lock_timeout 1 s, check 500 ms, drain 2 s, heartbeat 500 ms, drift 1.5 s, down {} s, pool {}",
        LEASE.as_secs(),
        DOWN_AFTER.as_secs(),
        POOL_SIZE
    );
    println!("run directory (node configs and logs): {}\n", dir.display());

    let mut harness = Harness {
        t0: Instant::now(),
        rng: Rng(options.seed),
        interval: options.interval,
        dir,
        primary,
        standby: Some(Arc::new(standby)),
        repl_proxy: Some(repl_proxy),
        standby_build: None,
        standby_retry_at: None,
        pending_failover: None,
        failover_losses: Vec::new(),
        admin_proxy,
        admin,
        slots,
        deck: Vec::new(),
        faults: Vec::new(),
        findings: Vec::new(),
        armed: None,
        lost_reply_pids: Vec::new(),
        failovers: 0,
        term_exits: Vec::new(),
        rss: Vec::new(),
        error_lines: 0,
        error_examples: Vec::new(),
    };
    harness.run(options.minutes).await
}

impl Harness {
    fn secs(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn note(&self, message: impl AsRef<str>) {
        println!("[{:>7.1}s] {}", self.secs(), message.as_ref());
    }

    fn finding(&mut self, message: String) {
        self.note(format!("FINDING: {message}"));
        let at = self.secs();
        self.findings.push(format!("[{at:>7.1}s] {message}"));
    }

    async fn run(&mut self, minutes: f64) -> Result<bool, BoxError> {
        // Start the nodes.
        for i in 0..self.slots.len() {
            self.start_node(i);
        }
        let ready_by = Instant::now() + Duration::from_secs(60);
        while !self.all_running() {
            if Instant::now() > ready_by {
                return Err("the nodes did not all start within 60 s".into());
            }
            self.supervise().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.note("all nodes ready; faults begin");
        self.sample_rss().await;

        // Faults.
        let fault_end = Instant::now() + Duration::from_secs_f64(minutes * 60.0);
        let mut next_fault = Instant::now() + self.rng.secs(self.interval.0, self.interval.1);
        let mut next_rss = Instant::now() + RSS_EVERY;
        while Instant::now() < fault_end {
            self.supervise().await;
            if Instant::now() >= next_fault && self.armed.is_none() {
                next_fault = if self.fault().await {
                    Instant::now() + self.rng.secs(self.interval.0, self.interval.1)
                } else {
                    Instant::now() + Duration::from_secs(1)
                };
            }
            if Instant::now() >= next_rss {
                self.sample_rss().await;
                next_rss += RSS_EVERY;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // Heal everything and bring every node back.
        self.note("faults over: healing, restarting dead nodes");
        self.heal_all().await;
        let ready_by = Instant::now() + Duration::from_secs(120);
        while !self.all_running() {
            if Instant::now() > ready_by {
                let states: Vec<String> = self
                    .slots
                    .iter()
                    .map(|s| format!("{} {}", s.id, s.phase.label()))
                    .collect();
                self.finding(format!(
                    "the nodes were not all running 120 s after the faults: {}",
                    states.join(", ")
                ));
                break;
            }
            self.supervise().await;
            if Instant::now() >= next_rss {
                self.sample_rss().await;
                next_rss += RSS_EVERY;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // Drain: every tick up to the cut-off succeeded, and the jobs they enqueued finished.
        let cutoff = Utc::now();
        let cutoff_second =
            DateTime::<Utc>::from_timestamp(cutoff.timestamp(), 0).unwrap_or(cutoff);
        self.note(format!(
            "waiting for the backlog up to {} to drain (at most {} s)",
            cutoff_second.format("%H:%M:%S"),
            DRAIN_DEADLINE.as_secs()
        ));
        let drain_started = Instant::now();
        let mut last_state = String::new();
        let drained = loop {
            self.supervise().await;
            match self.backlog(cutoff_second).await {
                Some(state) if state.is_empty() => break true,
                Some(state) => last_state = state,
                None => {}
            }
            if drain_started.elapsed() > DRAIN_DEADLINE {
                break false;
            }
            if Instant::now() >= next_rss {
                self.sample_rss().await;
                next_rss += RSS_EVERY;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let drain_secs = drain_started.elapsed().as_secs_f64();
        if drained {
            self.note(format!("backlog drained in {drain_secs:.1} s"));
        } else {
            self.finding(format!(
                "the backlog did not drain within {} s: {last_state}",
                DRAIN_DEADLINE.as_secs()
            ));
        }
        self.sample_rss().await;

        // Stop the nodes gracefully.
        let stop_clean = self.stop_all().await;

        let report = self
            .analyze(cutoff_second, drained, drain_secs, stop_clean)
            .await?;
        Ok(report)
    }

    fn all_running(&self) -> bool {
        self.slots
            .iter()
            .all(|s| matches!(s.phase, Phase::Running { .. }))
    }

    fn start_node(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.incarnation += 1;
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(err) => {
                let message = format!("cannot find this executable to start {}: {err}", slot.id);
                self.finding(message);
                return;
            }
        };
        let mut command = Command::new(exe);
        command
            .arg("node")
            .arg(&slot.config)
            .env("FORGE_NODE_ID", &slot.id)
            .env(
                "RUST_LOG",
                std::env::var("SOAK_NODE_LOG").unwrap_or_else(|_| "warn,forge=info".into()),
            )
            .env_remove("DATABASE_URL")
            .env_remove("FORGE_ROLES")
            .env_remove("FORGE_METRICS_LISTEN");
        match NodeProcess::spawn(command) {
            Ok(proc) => {
                let proc = proc.named(&slot.id);
                slot.started = Instant::now();
                slot.phase = Phase::Starting {
                    proc,
                    since: Instant::now(),
                };
                let (id, incarnation) = (slot.id.clone(), slot.incarnation);
                if incarnation > 1 {
                    self.note(format!("restarting {id} (incarnation {incarnation})"));
                }
            }
            Err(err) => {
                slot.phase = Phase::Dead {
                    restart_at: Instant::now() + Duration::from_secs(2),
                };
                let message = format!("cannot spawn {}: {err}", slot.id);
                self.finding(message);
            }
        }
    }

    /// Keeps the node process's output in the run directory, and collects its ERROR lines
    /// and panics.
    fn save_log(&mut self, i: usize, proc: &NodeProcess) {
        let slot = &self.slots[i];
        let path = self
            .dir
            .join(format!("{}.{}.log", slot.id, slot.incarnation));
        let lines = proc.lines();
        let _ = std::fs::write(path, lines.join("\n") + "\n");
        let id = slot.id.clone();
        for line in &lines {
            if line.contains(" ERROR ") || line.contains("panicked") {
                self.error_lines += 1;
                let message = line
                    .split_once(' ')
                    .map_or(line.as_str(), |(_, rest)| rest)
                    .chars()
                    .take(300)
                    .collect::<String>();
                let message = format!("{id}: {message}");
                if self.error_examples.len() < 10 && !self.error_examples.contains(&message) {
                    self.error_examples.push(message);
                }
            }
        }
    }

    fn last_lines(proc: &NodeProcess, n: usize) -> String {
        let lines = proc.lines();
        let start = lines.len().saturating_sub(n);
        lines[start..].join(" | ")
    }

    /// Watches the node processes, resumes, heals, restarts, fires armed lost replies, and
    /// tends the standby.
    async fn supervise(&mut self) {
        for i in 0..self.slots.len() {
            self.check_slot(i).await;
            if let Some(until) = self.slots[i].blackhole_until
                && Instant::now() >= until
            {
                self.heal(i);
            }
        }
        self.check_armed().await;
        self.tend_standby().await;
        if self.pending_failover.is_some_and(|t| Instant::now() >= t) {
            let done = self.fail_over_now().await;
            self.note(done);
        }
        for i in 0..self.slots.len() {
            if self.slots[i]
                .starve_check_at
                .is_some_and(|t| Instant::now() >= t)
            {
                self.slots[i].starve_check_at = None;
                self.check_starved(i).await;
            }
        }
    }

    /// Says how many of a node's pool connections the hogs hold.
    async fn check_starved(&self, i: usize) {
        let id = &self.slots[i].id;
        let held = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE application_name = $1 AND wait_event = 'PgSleep' AND query LIKE 'SELECT pg_sleep%'",
            )
            .bind(format!("forge:pool:{id}"))
            .fetch_one(&self.admin),
        )
        .await;
        if let Ok(Ok(held)) = held {
            self.note(format!(
                "pool starvation on {id}: {held} of its {POOL_SIZE} pool connections held by hogs"
            ));
        }
    }

    fn heal(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.blackhole_until = None;
        slot.proxy.heal_all();
        let severed = slot.proxy.sever(&Filter::All);
        let id = slot.id.clone();
        self.note(format!(
            "healed the black hole on {id}; {severed} dead flows severed"
        ));
    }

    async fn check_slot(&mut self, i: usize) {
        let now = Instant::now();
        let placeholder = Phase::Dead {
            restart_at: now + Duration::from_secs(3600),
        };
        let phase = std::mem::replace(&mut self.slots[i].phase, placeholder);
        let id = self.slots[i].id.clone();
        let next = match phase {
            Phase::Starting { mut proc, since } => {
                if proc.try_status().is_some() {
                    let status = proc.wait_exit(Duration::from_secs(5)).await;
                    self.save_log(i, &proc);
                    self.slots[i].start_failures += 1;
                    self.note(format!(
                        "{id} failed to start ({}): {}; retrying in 2 s",
                        describe_status(&status),
                        Self::last_lines(&proc, 2)
                    ));
                    Phase::Dead {
                        restart_at: now + Duration::from_secs(2),
                    }
                } else if proc.lines().iter().any(|l| l.starts_with("SOAK-READY")) {
                    self.note(format!(
                        "{id} ready ({:.1} s after its start)",
                        since.elapsed().as_secs_f64()
                    ));
                    Phase::Running { proc }
                } else if since.elapsed() > Duration::from_secs(90) {
                    self.finding(format!(
                        "{id} was not ready 90 s after its start; killed and restarted. Last lines: {}",
                        Self::last_lines(&proc, 5)
                    ));
                    let _ = proc.kill();
                    let _ = proc.wait_exit(Duration::from_secs(5)).await;
                    self.save_log(i, &proc);
                    Phase::Dead {
                        restart_at: now + Duration::from_secs(1),
                    }
                } else {
                    Phase::Starting { proc, since }
                }
            }
            Phase::Running { mut proc } => {
                if proc.try_status().is_some() {
                    let status = proc.wait_exit(Duration::from_secs(5)).await;
                    self.save_log(i, &proc);
                    self.slots[i].unexpected_exits += 1;
                    self.finding(format!(
                        "{id} exited on its own ({}); last lines: {}",
                        describe_status(&status),
                        Self::last_lines(&proc, 8)
                    ));
                    Phase::Dead {
                        restart_at: now + Duration::from_secs(2),
                    }
                } else {
                    Phase::Running { proc }
                }
            }
            Phase::Paused { proc, resume_at } => {
                if now >= resume_at {
                    match proc.resume() {
                        Ok(()) => self.note(format!("SIGCONT {id}")),
                        Err(err) => self.note(format!("SIGCONT {id} failed: {err}")),
                    }
                    Phase::Running { proc }
                } else {
                    Phase::Paused { proc, resume_at }
                }
            }
            Phase::Terminating { mut proc, since } => {
                if proc.try_status().is_some() {
                    let status = proc.wait_exit(Duration::from_secs(5)).await;
                    self.save_log(i, &proc);
                    let took = since.elapsed().as_secs_f64();
                    let described = describe_status(&status);
                    self.term_exits.push((id.clone(), took, described.clone()));
                    let clean = matches!(&status, Ok(s) if s.success());
                    if clean {
                        self.note(format!(
                            "{id} exited after SIGTERM in {took:.1} s ({described})"
                        ));
                    } else {
                        self.finding(format!(
                            "{id} did not exit cleanly after SIGTERM ({described}, {took:.1} s); last lines: {}",
                            Self::last_lines(&proc, 8)
                        ));
                    }
                    let delay = self.rng.secs(1.0, 3.0);
                    Phase::Dead {
                        restart_at: now + delay,
                    }
                } else if since.elapsed() > Duration::from_secs(30) {
                    self.finding(format!(
                        "{id} had not exited 30 s after SIGTERM (drain bounds are 2 s); SIGKILL. Last lines: {}",
                        Self::last_lines(&proc, 8)
                    ));
                    let _ = proc.kill();
                    let _ = proc.wait_exit(Duration::from_secs(5)).await;
                    self.save_log(i, &proc);
                    Phase::Dead {
                        restart_at: now + Duration::from_secs(1),
                    }
                } else {
                    Phase::Terminating { proc, since }
                }
            }
            Phase::Dead { restart_at } => Phase::Dead { restart_at },
        };
        self.slots[i].phase = next;
        if let Phase::Dead { restart_at } = self.slots[i].phase
            && now >= restart_at
        {
            self.start_node(i);
        }
    }

    /// SIGKILLs a node's process and schedules its restart.
    async fn kill_slot(&mut self, i: usize, restart_after: Duration) {
        let now = Instant::now();
        let phase = std::mem::replace(
            &mut self.slots[i].phase,
            Phase::Dead {
                restart_at: now + restart_after,
            },
        );
        let proc = match phase {
            Phase::Starting { proc, .. }
            | Phase::Running { proc }
            | Phase::Paused { proc, .. }
            | Phase::Terminating { proc, .. } => Some(proc),
            Phase::Dead { .. } => None,
        };
        if let Some(mut proc) = proc {
            let _ = proc.kill();
            let _ = proc.wait_exit(Duration::from_secs(10)).await;
            self.save_log(i, &proc);
        }
    }

    fn eligible(&self, i: usize) -> bool {
        let slot = &self.slots[i];
        matches!(slot.phase, Phase::Running { .. })
            && slot.blackhole_until.is_none()
            && slot.busy_until.is_none_or(|t| Instant::now() >= t)
            && self.armed.as_ref().is_none_or(|a| a.slot != i)
    }

    async fn scheduler_leader(&self) -> Option<String> {
        tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar::<_, String>(
                "SELECT node_id FROM forge.leaders
                  WHERE role = 'scheduler' AND released_at IS NULL AND lease_until > now()",
            )
            .fetch_optional(&self.admin),
        )
        .await
        .ok()?
        .ok()?
    }

    /// A node to hurt: the scheduler leader half the time (when eligible), else any eligible
    /// one. Returns the slot and a note saying whether it leads.
    async fn pick_node(&mut self, prefer_leader: bool) -> Option<(usize, String)> {
        let eligible: Vec<usize> = (0..self.slots.len())
            .filter(|i| self.eligible(*i))
            .collect();
        if eligible.is_empty() {
            return None;
        }
        let leader = self.scheduler_leader().await;
        let leader_slot = leader
            .as_deref()
            .and_then(|l| eligible.iter().copied().find(|i| self.slots[*i].id == l));
        let pick = match leader_slot {
            Some(i) if prefer_leader && self.rng.chance(0.5) => i,
            _ => eligible[self.rng.below(eligible.len())],
        };
        let note = if leader.as_deref() == Some(self.slots[pick].id.as_str()) {
            " (scheduler leader)".to_owned()
        } else {
            String::new()
        };
        Some((pick, note))
    }

    /// Applies the next applicable fault of the deck; false if none was applicable now.
    async fn fault(&mut self) -> bool {
        if self.deck.is_empty() {
            let mut deck = FaultKind::ALL.to_vec();
            for i in (1..deck.len()).rev() {
                let j = self.rng.below(i + 1);
                deck.swap(i, j);
            }
            self.deck = deck;
        }
        let mut passed = Vec::new();
        let mut applied = false;
        while let Some(kind) = self.deck.pop() {
            if let Some(text) = self.apply(kind).await {
                let at = self.secs();
                let n = self.faults.len() + 1;
                self.note(format!("FAULT #{n}: {text}"));
                self.faults.push(FaultRecord { at, kind, text });
                applied = true;
                break;
            }
            passed.push(kind);
        }
        for kind in passed.into_iter().rev() {
            self.deck.push(kind);
        }
        applied
    }

    async fn apply(&mut self, kind: FaultKind) -> Option<String> {
        match kind {
            FaultKind::SigKill => {
                let (i, note) = self.pick_node(true).await?;
                let delay = self.rng.secs(1.0, 4.0);
                self.kill_slot(i, delay).await;
                Some(format!(
                    "SIGKILL {}{note}; restart in {:.1} s",
                    self.slots[i].id,
                    delay.as_secs_f64()
                ))
            }
            FaultKind::SigTerm => {
                let (i, note) = self.pick_node(true).await?;
                let now = Instant::now();
                let phase =
                    std::mem::replace(&mut self.slots[i].phase, Phase::Dead { restart_at: now });
                let Phase::Running { proc } = phase else {
                    self.slots[i].phase = phase;
                    return None;
                };
                let sent = proc.terminate();
                self.slots[i].phase = Phase::Terminating { proc, since: now };
                Some(match sent {
                    Ok(()) => format!(
                        "SIGTERM {}{note} (graceful: drain, hand over); restart once it exited",
                        self.slots[i].id
                    ),
                    Err(err) => format!("SIGTERM {}{note} failed: {err}", self.slots[i].id),
                })
            }
            FaultKind::SigStop => {
                let (i, note) = self.pick_node(true).await?;
                let hold = self.rng.secs(
                    LEASE.as_secs_f64() + 1.0,
                    LEASE.as_secs_f64() + DOWN_AFTER.as_secs_f64(),
                );
                let now = Instant::now();
                let phase =
                    std::mem::replace(&mut self.slots[i].phase, Phase::Dead { restart_at: now });
                let Phase::Running { proc } = phase else {
                    self.slots[i].phase = phase;
                    return None;
                };
                if let Err(err) = proc.pause() {
                    self.slots[i].phase = Phase::Running { proc };
                    self.note(format!("SIGSTOP {} failed: {err}", self.slots[i].id));
                    return None;
                }
                self.slots[i].phase = Phase::Paused {
                    proc,
                    resume_at: now + hold,
                };
                Some(format!(
                    "SIGSTOP {}{note} for {:.1} s (lease {} s, down_after {} s), then SIGCONT",
                    self.slots[i].id,
                    hold.as_secs_f64(),
                    LEASE.as_secs(),
                    DOWN_AFTER.as_secs()
                ))
            }
            FaultKind::PgFastRestart | FaultKind::PgImmediateRestart => {
                if self.standby_build.is_some() || self.pending_failover.is_some() {
                    return None;
                }
                let fast = kind == FaultKind::PgFastRestart;
                let primary = self.primary.clone();
                let port = primary.port();
                let started = Instant::now();
                let result = tokio::task::spawn_blocking(move || {
                    if fast {
                        primary.restart()
                    } else {
                        primary.restart_immediate()
                    }
                })
                .await;
                let took = started.elapsed().as_secs_f64();
                let what = if fast {
                    "fast restart (pg_ctl stop -m fast, start)"
                } else {
                    "immediate restart (pg_ctl stop -m immediate: crash, recovery)"
                };
                match result {
                    Ok(Ok(())) => Some(format!(
                        "PostgreSQL {what} of the primary (:{port}), {took:.1} s"
                    )),
                    Ok(Err(err)) => {
                        self.finding(format!(
                            "harness: the PostgreSQL {what} failed: {err}; starting it again"
                        ));
                        let primary = self.primary.clone();
                        let _ = tokio::task::spawn_blocking(move || primary.start_again()).await;
                        Some(format!("PostgreSQL {what} of the primary (failed)"))
                    }
                    Err(err) => {
                        self.finding(format!("harness: the PostgreSQL {what} panicked: {err}"));
                        Some(format!("PostgreSQL {what} of the primary (panicked)"))
                    }
                }
            }
            FaultKind::Failover => self.failover().await,
            FaultKind::TerminateNodeSessions => self.terminate("node").await,
            FaultKind::TerminatePoolSessions => self.terminate("pool").await,
            FaultKind::TerminateLockSessions => self.terminate("lock").await,
            FaultKind::BlackHole => {
                let (i, note) = self.pick_node(true).await?;
                let hold = self.rng.secs(
                    DOWN_AFTER.as_secs_f64() + 1.0,
                    DOWN_AFTER.as_secs_f64() + 5.0,
                );
                let silenced = self.slots[i].proxy.blackhole(Filter::All);
                self.slots[i].blackhole_until = Some(Instant::now() + hold);
                Some(format!(
                    "black hole on {}{note}'s connections for {:.1} s (down_after {} s): {silenced} open flows silenced, new ones swallowed",
                    self.slots[i].id,
                    hold.as_secs_f64(),
                    DOWN_AFTER.as_secs()
                ))
            }
            FaultKind::PoolStarvation => {
                let (i, note) = self.pick_node(true).await?;
                let hold = self.rng.secs(
                    DOWN_AFTER.as_secs_f64() + 2.0,
                    DOWN_AFTER.as_secs_f64() + 5.0,
                );
                let hold_ms = hold.as_millis() as u64;
                let jobs = Jobs::new(self.admin.clone(), &LockNamespace::default());
                let batch: Vec<NewJob> = (0..POOL_SIZE)
                    .filter_map(|_| hog_job(&self.slots[i].id, HogArgs { hold_ms }))
                    .collect();
                match tokio::time::timeout(ADMIN_TIMEOUT, jobs.enqueue_many(batch)).await {
                    Ok(Ok(_)) => {}
                    _ => return None,
                }
                // Hogs that wait for a connection hold theirs after the first ones: two rounds.
                self.slots[i].busy_until = Some(Instant::now() + hold * 2 + Duration::from_secs(3));
                self.slots[i].starve_check_at = Some(Instant::now() + Duration::from_secs(3));
                Some(format!(
                    "pool starvation on {}{note}: {POOL_SIZE} jobs each hold one of its {POOL_SIZE} pool connections for {:.1} s",
                    self.slots[i].id,
                    hold.as_secs_f64()
                ))
            }
            FaultKind::LostReplyCron => self.arm_lost_reply(true).await,
            FaultKind::LostReplyJob => self.arm_lost_reply(false).await,
        }
    }

    /// A primary failover: at once, or (half the time) after cutting the standby's replication
    /// off for a few seconds, so that the commits of those seconds are lost with the primary,
    /// as in an unplanned failover to an asynchronous standby that had fallen behind.
    async fn failover(&mut self) -> Option<String> {
        if self.standby_build.is_some() || self.pending_failover.is_some() {
            return None;
        }
        self.standby.as_ref()?;
        if self.rng.chance(0.5)
            && let Some(proxy) = &self.repl_proxy
        {
            let lag = self.rng.secs(2.0, 5.0);
            let cut = proxy.blackhole(Filter::Replication);
            self.pending_failover = Some(Instant::now() + lag);
            return Some(format!(
                "lossy primary failover: the standby's replication is black-holed ({cut} flows) for {:.1} s, then the primary crashes and the standby is promoted: the commits of those seconds are lost",
                lag.as_secs_f64()
            ));
        }
        Some(self.fail_over_now().await)
    }

    /// Crashes the primary, promotes the standby, points every proxy at it, and starts
    /// building the next standby.
    async fn fail_over_now(&mut self) -> String {
        self.pending_failover = None;
        let Some(standby) = self.standby.clone() else {
            return "primary failover: no standby".into();
        };
        let old = self.primary.clone();
        let old_port = old.port();
        let flushed = old.current_wal_lsn().await.ok();
        let crasher = old.clone();
        let crashed = tokio::task::spawn_blocking(move || crasher.kill_immediate()).await;
        if !matches!(crashed, Ok(Ok(()))) {
            self.finding(format!(
                "harness: crashing the primary for a failover failed: {crashed:?}"
            ));
        }
        let replayed = standby.replay_lsn().await.ok().flatten();
        let promoter = standby.clone();
        let promoted = tokio::task::spawn_blocking(move || promoter.promote()).await;
        if !matches!(promoted, Ok(Ok(()))) {
            self.finding(format!(
                "harness: promoting the standby failed ({promoted:?}); restarting the old primary"
            ));
            let restart = old.clone();
            let _ = tokio::task::spawn_blocking(move || restart.start_again()).await;
            if let Some(proxy) = &self.repl_proxy {
                proxy.heal_all();
            }
            return "primary failover (failed; old primary restarted)".into();
        }
        let (host, port) = (standby.host().to_owned(), standby.port());
        for slot in &self.slots {
            slot.proxy.retarget(&host, port);
            slot.proxy.sever(&Filter::All);
        }
        self.admin_proxy.retarget(&host, port);
        self.admin_proxy.sever(&Filter::All);
        self.primary = standby;
        self.standby = None;
        self.failovers += 1;
        let old_proxy = self.repl_proxy.take();
        // Dropping a cluster waits for its reaper to remove it.
        tokio::task::spawn_blocking(move || drop((old, old_proxy)));
        self.start_standby_build();
        let behind = match (flushed, replayed) {
            (Some(f), Some(r)) => {
                let lost = f.0.saturating_sub(r.0);
                self.failover_losses.push(lost);
                format!("{lost} bytes of WAL behind")
            }
            _ => "lag unknown".into(),
        };
        format!(
            "primary failover: crashed the primary (:{old_port}), promoted the standby (:{port}, {behind}), proxies retargeted; building a new standby"
        )
    }

    fn start_standby_build(&mut self) {
        let primary = self.primary.clone();
        self.standby_build = Some(tokio::task::spawn_blocking(move || build_standby(&primary)));
    }

    async fn tend_standby(&mut self) {
        if let Some(build) = &self.standby_build
            && build.is_finished()
            && let Some(build) = self.standby_build.take()
        {
            match build.await {
                Ok(Ok((standby, proxy))) => {
                    self.note(format!(
                        "new streaming standby on 127.0.0.1:{}",
                        standby.port()
                    ));
                    self.standby = Some(Arc::new(standby));
                    self.repl_proxy = Some(proxy);
                }
                Ok(Err(err)) => {
                    self.note(format!(
                        "building a standby failed ({err}); retrying in 10 s"
                    ));
                    self.standby_retry_at = Some(Instant::now() + Duration::from_secs(10));
                }
                Err(err) => {
                    self.note(format!(
                        "building a standby panicked ({err}); retrying in 10 s"
                    ));
                    self.standby_retry_at = Some(Instant::now() + Duration::from_secs(10));
                }
            }
        }
        if self.standby.is_none()
            && self.standby_build.is_none()
            && self.standby_retry_at.is_some_and(|t| Instant::now() >= t)
        {
            self.standby_retry_at = None;
            self.start_standby_build();
        }
    }

    /// `pg_terminate_backend` of one kind of session, of every node or of one.
    async fn terminate(&mut self, kind: &str) -> Option<String> {
        let one = self.rng.chance(0.5);
        let leader = self.scheduler_leader().await;
        let any_node = self.slots[self.rng.below(self.slots.len())].id.clone();
        let pattern = match kind {
            "lock" => {
                let roles = [
                    "scheduler",
                    "scheduler",
                    "metrics_aggregator",
                    "log_compactor",
                ];
                let role = roles[self.rng.below(roles.len())];
                match (one, role, leader) {
                    (true, "scheduler", Some(leader)) => format!("forge:scheduler:{leader}"),
                    (true, _, _) => format!("forge:{role}:{any_node}"),
                    (false, _, _) => format!("forge:{role}:%"),
                }
            }
            _ if one => format!("forge:{kind}:{any_node}"),
            _ => format!("forge:{kind}:%"),
        };
        let terminated = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
                  WHERE application_name LIKE $1 AND pid <> pg_backend_pid()",
            )
            .bind(&pattern)
            .fetch_one(&self.admin),
        )
        .await;
        match terminated {
            Ok(Ok(n)) => Some(format!(
                "pg_terminate_backend of the sessions {pattern:?}: {n} terminated"
            )),
            _ => None,
        }
    }

    async fn set_flag(&self, kind: &str, node: &str, on: bool) -> bool {
        let query = if on {
            sqlx::query(
                "INSERT INTO soak_flags (kind, node) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            )
        } else {
            sqlx::query("DELETE FROM soak_flags WHERE kind = $1 AND node = $2")
        };
        matches!(
            tokio::time::timeout(
                ADMIN_TIMEOUT,
                query.bind(kind).bind(node).execute(&self.admin)
            )
            .await,
            Ok(Ok(_))
        )
    }

    async fn arm_lost_reply(&mut self, cron: bool) -> Option<String> {
        if self.armed.is_some() {
            return None;
        }
        let (i, note) = if cron {
            let leader = self.scheduler_leader().await?;
            let i = (0..self.slots.len()).find(|i| self.slots[*i].id == leader)?;
            if !self.eligible(i) {
                return None;
            }
            (i, " (scheduler leader)".to_owned())
        } else {
            self.pick_node(false).await?
        };
        let kind = if cron { "cron" } else { "tx_job" };
        let id = self.slots[i].id.clone();
        if !self.set_flag(kind, &id, true).await {
            return None;
        }
        self.armed = Some(Armed {
            slot: i,
            kind,
            deadline: Instant::now() + Duration::from_secs(15),
        });
        let what = if cron {
            "its next tick's COMMIT"
        } else {
            "its next soak_tx_job COMMIT"
        };
        Some(format!(
            "lost reply after commit on {id}{note}: {what} sleeps {SLOW_COMMIT_SECS} s on the server (deferred trigger); SIGKILL {id} while it does"
        ))
    }

    async fn check_armed(&mut self) {
        let Some(armed) = &self.armed else {
            return;
        };
        let (i, kind, deadline) = (armed.slot, armed.kind, armed.deadline);
        let id = self.slots[i].id.clone();
        if !matches!(self.slots[i].phase, Phase::Running { .. }) {
            self.armed = None;
            self.set_flag(kind, &id, false).await;
            self.note(format!(
                "lost reply on {id}: disarmed, the node stopped running"
            ));
            return;
        }
        let sleeping = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar::<_, i32>(
                "SELECT pid FROM pg_stat_activity
                  WHERE application_name = $1 AND wait_event = 'PgSleep' AND query ILIKE 'commit%'
                  LIMIT 1",
            )
            .bind(format!("forge:pool:{id}"))
            .fetch_optional(&self.admin),
        )
        .await;
        if let Ok(Ok(Some(pid))) = sleeping {
            let delay = self.rng.secs(1.0, 4.0);
            self.kill_slot(i, delay).await;
            self.armed = None;
            self.lost_reply_pids.push(pid);
            for _ in 0..10 {
                if self.set_flag(kind, &id, false).await {
                    break;
                }
            }
            self.note(format!(
                "SIGKILL {id} while its COMMIT (backend {pid}) sleeps at commit: the server completes it, the node never hears the reply; restart in {:.1} s",
                delay.as_secs_f64()
            ));
        } else if Instant::now() >= deadline {
            self.armed = None;
            self.set_flag(kind, &id, false).await;
            self.note(format!(
                "lost reply on {id}: no slow COMMIT within 15 s; disarmed"
            ));
        }
    }

    /// After the faults: nothing armed, nothing paused or black-holed, dead nodes restarted.
    async fn heal_all(&mut self) {
        if self.pending_failover.is_some() {
            let done = self.fail_over_now().await;
            self.note(done);
        }
        if let Some(armed) = self.armed.take() {
            let id = self.slots[armed.slot].id.clone();
            self.set_flag(armed.kind, &id, false).await;
        }
        let _ = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query("DELETE FROM soak_flags").execute(&self.admin),
        )
        .await;
        let now = Instant::now();
        for i in 0..self.slots.len() {
            if self.slots[i].blackhole_until.is_some() {
                self.heal(i);
            }
            self.slots[i].busy_until = None;
            match &mut self.slots[i].phase {
                Phase::Paused { resume_at, .. } => *resume_at = now,
                Phase::Dead { restart_at } => *restart_at = now,
                _ => {}
            }
        }
    }

    /// What is still to be done up to `cutoff` ("" when nothing), or `None` if the database
    /// could not be asked.
    async fn backlog(&self, cutoff: DateTime<Utc>) -> Option<String> {
        let row: (i64, i64, i64, i64) = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_as(
                "SELECT
                   (SELECT count(*) FROM forge.cron_ticks
                     WHERE cron = $1 AND scheduled_at >= $2 AND state = 'succeeded'),
                   (SELECT count(*) FROM forge.cron_ticks
                     WHERE cron = $1 AND scheduled_at <= $2 AND state = 'running'),
                   (SELECT count(*) FROM forge.jobs
                     WHERE kind IN ($3, $4) AND (args->>'tick_us')::bigint <= $5
                       AND state NOT IN ('completed', 'dead', 'cancelled')),
                   (SELECT count(*) FROM forge.jobs
                     WHERE kind LIKE $6 AND state NOT IN ('completed', 'dead', 'cancelled'))",
            )
            .bind(CRON)
            .bind(cutoff)
            .bind(TX_JOB)
            .bind(PLAIN_JOB)
            .bind(cutoff.timestamp_micros())
            .bind(HOG_JOB)
            .fetch_one(&self.admin),
        )
        .await
        .ok()?
        .ok()?;
        let (after, running, open, hogs) = row;
        let mut missing = Vec::new();
        if after == 0 {
            missing.push("no tick at or after the cut-off has succeeded yet".to_owned());
        }
        if running > 0 {
            missing.push(format!("{running} ticks still running"));
        }
        if open > 0 {
            missing.push(format!("{open} jobs of those ticks not finished"));
        }
        if hogs > 0 {
            missing.push(format!("{hogs} pool hogs not finished"));
        }
        Some(missing.join(", "))
    }

    /// SIGTERM to every node; true if all exited cleanly within 30 s.
    async fn stop_all(&mut self) -> bool {
        self.note("stopping the nodes (SIGTERM)");
        let mut clean = true;
        for i in 0..self.slots.len() {
            if let Some(proc) = self.slots[i].phase.proc() {
                let _ = proc.resume();
                let _ = proc.terminate();
            }
        }
        for i in 0..self.slots.len() {
            let phase = std::mem::replace(
                &mut self.slots[i].phase,
                Phase::Dead {
                    restart_at: Instant::now() + Duration::from_secs(3600 * 24),
                },
            );
            let id = self.slots[i].id.clone();
            let proc = match phase {
                Phase::Starting { proc, .. }
                | Phase::Running { proc }
                | Phase::Paused { proc, .. }
                | Phase::Terminating { proc, .. } => proc,
                Phase::Dead { .. } => {
                    self.finding(format!("{id} was not running at the end"));
                    clean = false;
                    continue;
                }
            };
            let mut proc = proc;
            let started = Instant::now();
            let status = proc.wait_exit(Duration::from_secs(30)).await;
            self.save_log(i, &proc);
            let took = started.elapsed().as_secs_f64();
            match &status {
                Ok(s) if s.success() => {
                    self.note(format!("{id} stopped cleanly ({took:.1} s)"));
                }
                _ => {
                    clean = false;
                    self.finding(format!(
                        "{id} did not stop cleanly on the final SIGTERM ({}); last lines: {}",
                        describe_status(&status),
                        Self::last_lines(&proc, 8)
                    ));
                    let _ = proc.kill();
                }
            }
        }
        clean
    }

    async fn sample_rss(&mut self) {
        let at = self.secs();
        let nodes: Vec<Option<(u32, f64, u64)>> = self
            .slots
            .iter()
            .map(|slot| {
                let pid = slot.phase.proc()?.pid();
                let kib = read_rss_kib(pid)?;
                Some((slot.incarnation, slot.started.elapsed().as_secs_f64(), kib))
            })
            .collect();
        let progress: Option<(i64, String)> = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_as(
                "SELECT (SELECT count(*) FROM soak_cron_effects),
                        coalesce((SELECT string_agg(format('%s %s %s (oldest %ss)', n, kind, state, age), ', ')
                           FROM (SELECT kind, state, count(*) AS n,
                                        round(extract(epoch FROM now() - min(created_at)))::bigint AS age
                                   FROM forge.jobs WHERE state NOT IN ('completed', 'dead', 'cancelled')
                                  GROUP BY 1, 2 ORDER BY 1, 2) o), 'none')",
            )
            .fetch_one(&self.admin),
        )
        .await
        .ok()
        .and_then(Result::ok);
        let mut line = String::from("status:");
        for (slot, rss) in self.slots.iter().zip(&nodes) {
            let _ = write!(line, " {} {}", slot.id, slot.phase.label());
            if let Some((incarnation, _, kib)) = rss {
                let _ = write!(line, " #{incarnation} {:.1} MiB;", *kib as f64 / 1024.0);
            } else {
                line.push(';');
            }
        }
        if let Some((ticks, open)) = progress {
            let _ = write!(line, " {ticks} tick effects; open jobs: {open}");
        }
        self.note(line);
        self.rss.push(RssSample { at, nodes });
    }

    // -----------------------------------------------------------------------------------------
    // The ledger.
    // -----------------------------------------------------------------------------------------

    async fn analyze(
        &mut self,
        cutoff: DateTime<Utc>,
        drained: bool,
        drain_secs: f64,
        stop_clean: bool,
    ) -> Result<bool, BoxError> {
        let db = &self.admin;
        let mut out = String::new();
        let mut targets: Vec<(bool, String)> = Vec::new();
        let cutoff_us = cutoff.timestamp_micros();

        let first: Option<DateTime<Utc>> =
            sqlx::query_scalar("SELECT min(scheduled_at) FROM soak_cron_effects")
                .fetch_one(db)
                .await?;
        let Some(first) = first else {
            return Err("the cron never wrote an effect".into());
        };

        // --- Cron ticks.
        let (expected, present, missing, duplicated, extra_rows): (i64, i64, i64, i64, i64) =
            sqlx::query_as(
                "WITH expected AS (
                     SELECT generate_series($1::timestamptz, $2::timestamptz, interval '1 second') AS s),
                 eff AS (SELECT scheduled_at, count(*) AS n FROM soak_cron_effects GROUP BY 1)
                 SELECT count(*),
                        count(*) FILTER (WHERE eff.n IS NOT NULL),
                        count(*) FILTER (WHERE eff.n IS NULL),
                        count(*) FILTER (WHERE eff.n > 1),
                        coalesce(sum(eff.n - 1) FILTER (WHERE eff.n > 1), 0)::bigint
                   FROM expected LEFT JOIN eff ON eff.scheduled_at = expected.s",
            )
            .bind(first)
            .bind(cutoff)
            .fetch_one(db)
            .await?;
        let off_grid: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM soak_cron_effects
              WHERE scheduled_at <= $1 AND date_trunc('second', scheduled_at) <> scheduled_at",
        )
        .bind(cutoff)
        .fetch_one(db)
        .await?;
        let missing_by_state: Vec<(String, i64, DateTime<Utc>, String)> = sqlx::query_as(
            "WITH expected AS (
                 SELECT generate_series($1::timestamptz, $2::timestamptz, interval '1 second') AS s)
             SELECT coalesce(t.state, 'no ledger row'), count(*), min(x.s), coalesce(max(t.error), '')
               FROM expected x
               LEFT JOIN forge.cron_ticks t ON t.cron = $3 AND t.scheduled_at = x.s
              WHERE NOT EXISTS (SELECT 1 FROM soak_cron_effects e WHERE e.scheduled_at = x.s)
              GROUP BY 1 ORDER BY 1",
        )
        .bind(first)
        .bind(cutoff)
        .bind(CRON)
        .fetch_all(db)
        .await?;
        let ledger: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT state, count(*), count(*) FILTER (WHERE attempt > 1) FROM forge.cron_ticks
              WHERE cron = $1 AND scheduled_at BETWEEN $2 AND $3 GROUP BY 1 ORDER BY 1",
        )
        .bind(CRON)
        .bind(first)
        .bind(cutoff)
        .fetch_all(db)
        .await?;
        let (succeeded_without_effect, effect_without_success): (i64, i64) = sqlx::query_as(
            "SELECT
               (SELECT count(*) FROM forge.cron_ticks t
                 WHERE t.cron = $1 AND t.scheduled_at BETWEEN $2 AND $3 AND t.state = 'succeeded'
                   AND NOT EXISTS (SELECT 1 FROM soak_cron_effects e WHERE e.scheduled_at = t.scheduled_at)),
               (SELECT count(DISTINCT e.scheduled_at) FROM soak_cron_effects e
                 WHERE e.scheduled_at BETWEEN $2 AND $3
                   AND NOT EXISTS (SELECT 1 FROM forge.cron_ticks t
                                    WHERE t.cron = $1 AND t.scheduled_at = e.scheduled_at
                                      AND t.state = 'succeeded'))",
        )
        .bind(CRON)
        .bind(first)
        .bind(cutoff)
        .fetch_one(db)
        .await?;
        let cron_reruns: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM soak_cron_effects WHERE scheduled_at <= $1 AND attempt > 1",
        )
        .bind(cutoff)
        .fetch_one(db)
        .await?;
        let duplicate_examples: Vec<(DateTime<Utc>, String)> = sqlx::query_as(
            "SELECT scheduled_at, string_agg(format('attempt %s on %s epoch %s at %s', attempt, node, epoch,
                                                   to_char(at, 'HH24:MI:SS.MS')), '; ' ORDER BY id)
               FROM soak_cron_effects WHERE scheduled_at <= $1
              GROUP BY 1 HAVING count(*) > 1 ORDER BY 1 LIMIT 5",
        )
        .bind(cutoff)
        .fetch_all(db)
        .await?;

        // --- Jobs.
        let jobs: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT CASE WHEN kind LIKE $4 THEN 'soak_hog' ELSE kind END, state, count(*),
                    count(*) FILTER (WHERE attempt > 1) FROM forge.jobs
              WHERE (kind IN ($1, $2) AND (args->>'tick_us')::bigint <= $3) OR kind LIKE $4
              GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .bind(TX_JOB)
        .bind(PLAIN_JOB)
        .bind(cutoff_us)
        .bind(HOG_JOB)
        .fetch_all(db)
        .await?;
        let mut job_stats: BTreeMap<String, JobStats> = BTreeMap::new();
        for (kind, state, count, reruns) in &jobs {
            let stats = job_stats.entry(kind.clone()).or_default();
            stats.total += count;
            stats.reruns += reruns;
            if state == "completed" {
                stats.completed += count;
            } else {
                stats.not_completed.push(format!("{state} {count}"));
                stats.lost_or_stuck += count;
            }
        }
        let mut effects: BTreeMap<&str, EffectStats> = BTreeMap::new();
        for (label, kind, job) in [("tx", "tx", TX_JOB), ("plain", "plain", PLAIN_JOB)] {
            let (dup_jobs, dup_rows, completed_without, effect_not_completed, orphan, reruns): (
                i64,
                i64,
                i64,
                i64,
                i64,
                i64,
            ) = sqlx::query_as(
                "SELECT
                   (SELECT count(*) FROM (SELECT job_id FROM soak_job_effects
                      WHERE kind = $1 AND tick_us <= $2 GROUP BY job_id HAVING count(*) > 1) d),
                   (SELECT coalesce(sum(n - 1), 0)::bigint FROM (SELECT count(*) AS n FROM soak_job_effects
                      WHERE kind = $1 AND tick_us <= $2 GROUP BY job_id HAVING count(*) > 1) d),
                   (SELECT count(*) FROM forge.jobs j
                     WHERE j.kind = $3 AND j.state = 'completed' AND (j.args->>'tick_us')::bigint <= $2
                       AND NOT EXISTS (SELECT 1 FROM soak_job_effects e WHERE e.job_id = j.id AND e.kind = $1)),
                   (SELECT count(DISTINCT e.job_id) FROM soak_job_effects e JOIN forge.jobs j ON j.id = e.job_id
                     WHERE e.kind = $1 AND e.tick_us <= $2 AND j.state <> 'completed'),
                   (SELECT count(DISTINCT e.job_id) FROM soak_job_effects e
                     WHERE e.kind = $1 AND e.tick_us <= $2
                       AND NOT EXISTS (SELECT 1 FROM forge.jobs j WHERE j.id = e.job_id)),
                   (SELECT count(*) FROM soak_job_effects WHERE kind = $1 AND tick_us <= $2 AND attempt > 1)",
            )
            .bind(kind)
            .bind(cutoff_us)
            .bind(job)
            .fetch_one(db)
            .await?;
            effects.insert(
                label,
                EffectStats {
                    dup_jobs,
                    dup_rows,
                    completed_without,
                    effect_not_completed,
                    orphan,
                    reruns,
                },
            );
        }
        let enqueues: Vec<(String, i64, i64)> = sqlx::query_as(
            "WITH t AS (SELECT DISTINCT (extract(epoch FROM scheduled_at) * 1000000)::bigint AS us
                          FROM soak_cron_effects WHERE scheduled_at <= $1),
                  j AS (SELECT kind, (args->>'tick_us')::bigint AS us, count(*) AS n FROM forge.jobs
                         WHERE kind IN ($2, $3) GROUP BY 1, 2)
             SELECT k.kind, count(*) FILTER (WHERE j.n IS NULL), count(*) FILTER (WHERE j.n > 1)
               FROM t CROSS JOIN (VALUES ($2), ($3)) AS k(kind)
               LEFT JOIN j ON j.kind = k.kind AND j.us = t.us
              GROUP BY 1 ORDER BY 1",
        )
        .bind(cutoff)
        .bind(TX_JOB)
        .bind(PLAIN_JOB)
        .fetch_all(db)
        .await?;

        // Jobs that took long from enqueue to their end: stuck for a while, then recovered.
        let slow_jobs: Vec<(i64, String, String, i32, String, f64, String)> = sqlx::query_as(
            "SELECT id, kind, state, attempt, coalesce(node_id, '-'),
                    extract(epoch FROM coalesce(finished_at, now()) - created_at)::float8,
                    left(errors::text, 600)
               FROM forge.jobs
              WHERE kind IN ($1, $2) AND (args->>'tick_us')::bigint <= $3
                AND coalesce(finished_at, now()) - created_at > interval '20 seconds'
              ORDER BY 6 DESC LIMIT 5",
        )
        .bind(TX_JOB)
        .bind(PLAIN_JOB)
        .bind(cutoff_us)
        .fetch_all(db)
        .await?;
        let (slow_count, max_latency): (i64, f64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE coalesce(finished_at, now()) - created_at > interval '20 seconds'),
                    coalesce(max(extract(epoch FROM coalesce(finished_at, now()) - created_at)), 0)::float8
               FROM forge.jobs WHERE kind IN ($1, $2) AND (args->>'tick_us')::bigint <= $3",
        )
        .bind(TX_JOB)
        .bind(PLAIN_JOB)
        .bind(cutoff_us)
        .fetch_one(db)
        .await?;

        // --- Lost replies.
        let lost: Vec<(String, String, i64, i32, i64)> = sqlx::query_as(
            "SELECT r.kind, r.node, r.key, r.backend_pid,
                    CASE r.kind WHEN 'cron' THEN
                        (SELECT count(*) FROM soak_cron_effects e
                          WHERE (extract(epoch FROM e.scheduled_at) * 1000000)::bigint = r.key)
                    ELSE (SELECT count(*) FROM soak_job_effects e WHERE e.job_id = r.key AND e.kind = 'tx') END
               FROM soak_lost_replies r ORDER BY r.at",
        )
        .fetch_all(db)
        .await?;

        // --- Epochs.
        const WORK: &str = "(SELECT role, epoch, tenure, node, at FROM soak_leader_work
                             UNION ALL
                             SELECT 'scheduler', epoch, tenure, node, at FROM soak_cron_effects)";
        let late_writes: Vec<(String, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT w.role, count(*),
                    coalesce(string_agg(format('epoch %s on %s at %s', w.epoch, w.node,
                                               to_char(w.at, 'HH24:MI:SS.MS')), '; ') FILTER (WHERE true), '')
               FROM {WORK} w
              WHERE EXISTS (SELECT 1 FROM forge.events e
                             WHERE e.kind = 'leader_elected' AND e.role = w.role
                               AND e.epoch > w.epoch AND e.at <= w.at)
              GROUP BY 1 ORDER BY 1"
        )))
        .fetch_all(db)
        .await?;
        let overlaps: Vec<(String, i64, String, i64, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "WITH win AS (SELECT role, epoch, tenure, min(at) AS a, max(at) AS b FROM {WORK} w
                               GROUP BY 1, 2, 3)
                 SELECT x.role, x.epoch, to_char(x.b, 'HH24:MI:SS.MS'), y.epoch, to_char(y.a, 'HH24:MI:SS.MS')
                   FROM win x JOIN win y ON x.role = y.role AND x.epoch < y.epoch AND x.b >= y.a
                  ORDER BY 1, 2, 4"
            )))
            .fetch_all(db)
            .await?;
        let reused: Vec<(String, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT role, epoch, count(DISTINCT tenure) FROM {WORK} w GROUP BY 1, 2
              HAVING count(DISTINCT tenure) > 1 ORDER BY 1, 2"
        )))
        .fetch_all(db)
        .await?;
        let regressions: Vec<(String, i64)> = sqlx::query_as(
            "SELECT role, count(*) FROM (
                 SELECT role, epoch, lag(epoch) OVER (PARTITION BY role ORDER BY at, id) AS prev
                   FROM forge.events WHERE kind = 'leader_elected') s
              WHERE prev IS NOT NULL AND epoch <= prev GROUP BY 1 ORDER BY 1",
        )
        .fetch_all(db)
        .await?;
        let events: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT kind, coalesce(role, ''), count(*),
                    count(*) FILTER (WHERE coalesce((detail->>'failover')::boolean, false))
               FROM forge.events GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .fetch_all(db)
        .await?;
        let work_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM soak_leader_work")
            .fetch_one(db)
            .await?;

        // ----------------------------------------------------------------------------------
        // The report.
        // ----------------------------------------------------------------------------------
        let _ = writeln!(
            out,
            "\n================ FORGE soak: summary ================"
        );
        let lossy = self.failover_losses.iter().filter(|b| **b > 0).count();
        let _ = writeln!(
            out,
            "run: {:.1} min in all ({} faults), {} failovers ({lossy} lost commits: {} WAL bytes); run directory {}",
            self.secs() / 60.0,
            self.faults.len(),
            self.failovers,
            self.failover_losses.iter().sum::<u64>(),
            self.dir.display()
        );
        let _ = writeln!(out, "\nfaults applied ({}):", self.faults.len());
        for fault in &self.faults {
            let _ = writeln!(out, "  [{:>7.1}s] {}", fault.at, fault.text);
        }
        let mut by_kind: BTreeMap<FaultKind, usize> = BTreeMap::new();
        for fault in &self.faults {
            *by_kind.entry(fault.kind).or_default() += 1;
        }
        let _ = writeln!(out, "faults by kind:");
        for kind in FaultKind::ALL {
            let _ = writeln!(
                out,
                "  {:<40} {}",
                kind.name(),
                by_kind.get(&kind).copied().unwrap_or(0)
            );
        }

        let _ = writeln!(
            out,
            "\ncron {CRON} (\"* * * * * *\", catch_up = all), ticks {} .. {} (cut-off):",
            first.format("%H:%M:%S"),
            cutoff.format("%H:%M:%S")
        );
        let _ = writeln!(out, "  ticks expected (every second)           {expected}");
        let _ = writeln!(out, "  ticks with an effect                    {present}");
        let _ = writeln!(out, "  missing ticks (no effect)               {missing}");
        for (state, count, from, error) in &missing_by_state {
            let _ = writeln!(
                out,
                "    {count} with ledger state {state} (first {}){}",
                from.format("%H:%M:%S"),
                if error.is_empty() {
                    String::new()
                } else {
                    format!(": {error}")
                }
            );
        }
        let _ = writeln!(
            out,
            "  duplicate effects (ticks with >1 row)   {duplicated} ({extra_rows} extra rows)"
        );
        for (at, rows) in &duplicate_examples {
            let _ = writeln!(out, "    {}: {rows}", at.format("%H:%M:%S"));
        }
        let _ = writeln!(out, "  effects off the per-second grid         {off_grid}");
        let _ = writeln!(
            out,
            "  ledger succeeded without an effect      {succeeded_without_effect}"
        );
        let _ = writeln!(
            out,
            "  effect without a succeeded ledger row   {effect_without_success}"
        );
        let ledger_text: Vec<String> = ledger
            .iter()
            .map(|(state, n, reruns)| format!("{state} {n} (attempt > 1: {reruns})"))
            .collect();
        let _ = writeln!(out, "  ledger states: {}", ledger_text.join(", "));
        let not_succeeded: i64 = ledger
            .iter()
            .filter(|(state, _, _)| state != "succeeded")
            .map(|(_, n, _)| n)
            .sum();
        let _ = writeln!(
            out,
            "  ticks not succeeded                     {not_succeeded}"
        );
        let _ = writeln!(
            out,
            "  reruns (effect rows with attempt > 1)   {cron_reruns}"
        );

        let _ = writeln!(
            out,
            "\njobs (those of ticks up to the cut-off, and the pool hogs):"
        );
        for kind in [TX_JOB, PLAIN_JOB, "soak_hog"] {
            let stats = job_stats.get(kind).cloned().unwrap_or_default();
            let _ = writeln!(
                out,
                "  {kind:<15} total {:>5}, completed {:>5}, lost or stuck {}{}, reruns (attempt > 1) {}",
                stats.total,
                stats.completed,
                stats.lost_or_stuck,
                if stats.not_completed.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", stats.not_completed.join(", "))
                },
                stats.reruns
            );
        }
        for (kind, lost_enqueues, double_enqueues) in &enqueues {
            let _ = writeln!(
                out,
                "  ticks without a {kind}: {lost_enqueues}; ticks with more than one: {double_enqueues}"
            );
        }
        let tx = effects.get("tx").cloned().unwrap_or_default();
        let plain = effects.get("plain").cloned().unwrap_or_default();
        let _ = writeln!(
            out,
            "  {TX_JOB} effects: duplicated jobs {} ({} extra rows), completed without effect {}, effect but not completed {}, effect of an unknown job {}, effect rows of attempt > 1: {}",
            tx.dup_jobs,
            tx.dup_rows,
            tx.completed_without,
            tx.effect_not_completed,
            tx.orphan,
            tx.reruns
        );
        let _ = writeln!(
            out,
            "  {PLAIN_JOB} effects: duplicated jobs {} ({} extra rows), completed without effect {}, effect but not completed {}, effect rows of attempt > 1: {}",
            plain.dup_jobs,
            plain.dup_rows,
            plain.completed_without,
            plain.effect_not_completed,
            plain.reruns
        );
        let _ = writeln!(
            out,
            "    (at least once by design: its effect commits before the job's completion, so an attempt cut short\n     between the two - SIGKILL, SIGSTOP past down_after, a black hole, a lost reply - runs again)"
        );
        let _ = writeln!(
            out,
            "  enqueue-to-finish: max {max_latency:.1} s; jobs that took over 20 s: {slow_count}"
        );
        for (id, kind, state, attempt, node, secs, errors) in &slow_jobs {
            let _ = writeln!(
                out,
                "    job {id} {kind} {state} after {secs:.1} s, attempt {attempt} on {node}; errors {errors}"
            );
        }

        let _ = writeln!(
            out,
            "\nlost replies after commit: {} injected (node SIGKILLed during its slow COMMIT), {} commits found completed on the server",
            self.lost_reply_pids.len(),
            lost.len()
        );
        for (kind, node, key, pid, effects) in &lost {
            let what = if kind == "cron" {
                DateTime::<Utc>::from_timestamp_micros(*key)
                    .map(|t| format!("tick {}", t.format("%H:%M:%S")))
                    .unwrap_or_default()
            } else {
                format!("job {key}")
            };
            let killed = if self.lost_reply_pids.contains(pid) {
                "node killed during it"
            } else {
                "node not killed during it"
            };
            let _ = writeln!(
                out,
                "  {kind} {what} on {node} (backend {pid}, {killed}): {effects} effect row(s)"
            );
        }

        let _ = writeln!(out, "\nepochs and leadership (forge.events):");
        for (kind, role, count, failover) in &events {
            let extra = if kind == "leader_elected" {
                format!(" ({failover} failovers)")
            } else {
                String::new()
            };
            let role = if role.is_empty() {
                String::new()
            } else {
                format!(" {role}")
            };
            let _ = writeln!(out, "  {kind}{role}: {count}{extra}");
        }
        let _ = writeln!(
            out,
            "  fenced writes checked: {work_rows} leader-task rows + the cron's effect rows"
        );
        let late_total: i64 = late_writes.iter().map(|(_, n, _)| n).sum();
        let _ = writeln!(
            out,
            "  writes under an epoch older than one already elected: {late_total}"
        );
        for (role, n, examples) in &late_writes {
            let examples: String = examples.chars().take(400).collect();
            let _ = writeln!(out, "    {role}: {n}: {examples}");
        }
        let _ = writeln!(
            out,
            "  tenures whose write windows overlap a later epoch's: {}",
            overlaps.len()
        );
        for (role, older, last, newer, first) in overlaps.iter().take(5) {
            let _ = writeln!(
                out,
                "    {role}: epoch {older} wrote until {last}, epoch {newer} from {first}"
            );
        }
        let _ = writeln!(out, "  epochs with writes of two tenures: {}", reused.len());
        for (role, epoch, tenures) in &reused {
            let _ = writeln!(out, "    {role} epoch {epoch}: {tenures} tenures");
        }
        let regression_total: i64 = regressions.iter().map(|(_, n)| n).sum();
        let _ = writeln!(
            out,
            "  elections whose epoch is not above the previous one: {regression_total}"
        );

        let _ = writeln!(out, "\nnodes:");
        for slot in &self.slots {
            let _ = writeln!(
                out,
                "  {}: {} processes (restarts {}), failed starts {}, exits on its own {}",
                slot.id,
                slot.incarnation,
                slot.incarnation.saturating_sub(1),
                slot.start_failures,
                slot.unexpected_exits
            );
        }
        let slow_terms: Vec<String> = self
            .term_exits
            .iter()
            .map(|(id, took, status)| format!("{id} {took:.1} s ({status})"))
            .collect();
        let _ = writeln!(
            out,
            "  exits after a fault's SIGTERM: {}",
            if slow_terms.is_empty() {
                "none".to_owned()
            } else {
                slow_terms.join(", ")
            }
        );
        let _ = writeln!(
            out,
            "  backlog drain after the faults: {}",
            if drained {
                format!("{drain_secs:.1} s")
            } else {
                format!("NOT drained within {} s", DRAIN_DEADLINE.as_secs())
            }
        );
        let _ = writeln!(
            out,
            "  final SIGTERM: {}",
            if stop_clean {
                "every node stopped cleanly"
            } else {
                "NOT every node stopped cleanly"
            }
        );

        let (memory_ok, memory_text) = self.memory_report(&mut out);

        let _ = writeln!(
            out,
            "\nERROR lines and panics in the node logs: {}",
            self.error_lines
        );
        for example in &self.error_examples {
            let _ = writeln!(out, "  {example}");
        }

        if self.findings.is_empty() {
            let _ = writeln!(out, "\nfindings: none");
        } else {
            let _ = writeln!(out, "\nfindings ({}):", self.findings.len());
            for finding in &self.findings {
                let _ = writeln!(out, "  {finding}");
            }
        }

        // --- Targets.
        let transactional_duplicates = duplicated + tx.dup_jobs;
        targets.push((
            transactional_duplicates == 0
                && succeeded_without_effect == 0
                && effect_without_success == 0
                && tx.completed_without == 0
                && tx.effect_not_completed == 0,
            format!(
                "0 duplicate effects of transactional handlers: cron {duplicated}, {TX_JOB} {} (and 0 effects without their commit: {} / {} / {} / {})",
                tx.dup_jobs,
                succeeded_without_effect,
                effect_without_success,
                tx.completed_without,
                tx.effect_not_completed
            ),
        ));
        targets.push((
            missing == 0,
            format!("0 missing ticks with catch_up = \"all\": {missing} of {expected}"),
        ));
        let lost_jobs: i64 = job_stats.values().map(|s| s.lost_or_stuck).sum();
        let lost_enqueues: i64 = enqueues.iter().map(|(_, lost, double)| lost + double).sum();
        targets.push((
            lost_jobs == 0 && lost_enqueues == 0 && drained,
            format!(
                "0 lost or stuck jobs: {lost_jobs} not completed, {lost_enqueues} ticks without exactly one job of each kind{}",
                if drained { "" } else { ", backlog not drained" }
            ),
        ));
        let overlapping =
            late_total + overlaps.len() as i64 + reused.len() as i64 + regression_total;
        targets.push((
            overlapping == 0,
            format!(
                "0 overlapping epochs: {late_total} late writes, {} overlapping windows, {} reused epochs, {regression_total} epoch regressions",
                overlaps.len(),
                reused.len()
            ),
        ));
        let unexpected: u32 = self.slots.iter().map(|s| s.unexpected_exits).sum();
        let alive = stop_clean && unexpected == 0;
        targets.push((
            alive,
            format!(
                "every node alive or restarted by the harness: {unexpected} exits on their own, {}",
                if stop_clean {
                    "all running and stopped cleanly at the end"
                } else {
                    "NOT all running / stopped cleanly at the end"
                }
            ),
        ));
        targets.push((
            memory_ok,
            format!("nothing unbounded in memory: {memory_text}"),
        ));

        let _ = writeln!(out, "\ntargets:");
        for (ok, text) in &targets {
            let _ = writeln!(out, "  {}  {text}", if *ok { "PASS" } else { "FAIL" });
        }
        let _ = writeln!(
            out,
            "  info  {} duplicate effects of the non-transactional job (at least once: allowed)",
            plain.dup_rows
        );
        let all = targets.iter().all(|(ok, _)| *ok);
        let _ = writeln!(out, "\nRESULT: {}", if all { "PASS" } else { "FAIL" });
        print!("{out}");
        Ok(all)
    }

    /// Node RSS over time, min/max per node, and whether any process grew without bound.
    fn memory_report(&self, out: &mut String) -> (bool, String) {
        let _ = writeln!(out, "\nnode RSS over time (MiB, #process):");
        let mut header = String::from("     time");
        for slot in &self.slots {
            let _ = write!(header, " {:>14}", slot.id);
        }
        let _ = writeln!(out, "{header}");
        for sample in &self.rss {
            let mut line = format!("  {:>6.0}s", sample.at);
            for node in &sample.nodes {
                match node {
                    Some((incarnation, _, kib)) => {
                        let _ = write!(
                            line,
                            " {:>14}",
                            format!("{:.1} #{incarnation}", *kib as f64 / 1024.0)
                        );
                    }
                    None => {
                        let _ = write!(line, " {:>14}", "-");
                    }
                }
            }
            let _ = writeln!(out, "{line}");
        }
        let mut max_all = 0u64;
        for (i, slot) in self.slots.iter().enumerate() {
            let values: Vec<u64> = self
                .rss
                .iter()
                .filter_map(|s| s.nodes[i].map(|(_, _, kib)| kib))
                .collect();
            let min = values.iter().min().copied().unwrap_or(0);
            let max = values.iter().max().copied().unwrap_or(0);
            max_all = max_all.max(max);
            let _ = writeln!(
                out,
                "  {}: min {:.1} MiB, max {:.1} MiB over {} samples",
                slot.id,
                min as f64 / 1024.0,
                max as f64 / 1024.0,
                values.len()
            );
        }
        // Growth within one process: from its first sample after 60 s of uptime to its last,
        // for processes that lived at least 5 minutes after that first sample.
        let mut judged = 0;
        let mut grown = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let mut by_process: BTreeMap<u32, Vec<(f64, u64)>> = BTreeMap::new();
            for sample in &self.rss {
                if let Some((incarnation, uptime, kib)) = sample.nodes[i] {
                    by_process
                        .entry(incarnation)
                        .or_default()
                        .push((uptime, kib));
                }
            }
            for (incarnation, samples) in by_process {
                let Some(&(t0, base)) = samples.iter().find(|(uptime, _)| *uptime >= 60.0) else {
                    continue;
                };
                let Some(&(t1, last)) = samples.last() else {
                    continue;
                };
                if t1 - t0 < 300.0 {
                    continue;
                }
                judged += 1;
                if last > base + base / 2 && last > base + 16 * 1024 {
                    grown.push(format!(
                        "{} #{incarnation} {:.1} -> {:.1} MiB in {:.0} s",
                        slot.id,
                        base as f64 / 1024.0,
                        last as f64 / 1024.0,
                        t1 - t0
                    ));
                }
            }
        }
        let ok = max_all <= RSS_CAP_KIB && grown.is_empty();
        let text = if !grown.is_empty() {
            format!("grew: {}", grown.join(", "))
        } else if judged == 0 {
            format!(
                "max {:.1} MiB; no node process lived 6 min, growth not judged",
                max_all as f64 / 1024.0
            )
        } else {
            format!(
                "max {:.1} MiB; {judged} long-lived processes grew < 50 %",
                max_all as f64 / 1024.0
            )
        };
        (ok, text)
    }
}

#[derive(Clone, Default)]
struct JobStats {
    total: i64,
    completed: i64,
    lost_or_stuck: i64,
    reruns: i64,
    not_completed: Vec<String>,
}

#[derive(Clone, Default)]
struct EffectStats {
    dup_jobs: i64,
    dup_rows: i64,
    completed_without: i64,
    effect_not_completed: i64,
    orphan: i64,
    reruns: i64,
}

fn describe_status(status: &Result<std::process::ExitStatus, forge_testkit::Error>) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("signal {signal}"),
            _ => status.to_string(),
        },
        Err(err) => format!("unknown status: {err}"),
    }
}

/// VmRSS of a process, in KiB.
fn read_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}
