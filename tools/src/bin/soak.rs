//! Soak benchmark: three node processes of a user-style binary under random faults, and the
//! ledger of what the guarantees survived.
//!
//! ```text
//! cargo run --release --example soak -- --minutes 30            # the full soak
//! cargo run --release --example soak -- --minutes 3 --seed 42   # replay a run's fault choices
//! cargo run --release --example soak -- --interval 5-10         # denser faults (default 5-30 s)
//! cargo run --release --example soak -- --only table-lock,write-stall   # a deck of these kinds
//! ```
//!
//! The harness starts a throwaway PostgreSQL (fsync on, `max_connections` 100) with an
//! asynchronous streaming standby, one [`PgProxy`] per node (so one node's connections can be
//! black-holed alone and a primary failover is a promotion plus a retarget), and three node
//! processes: this binary re-executed as `soak node <forge.toml>`. The nodes log in as an
//! ordinary role (`forge_soak`, owner of the database; the harness applies FORGE's migrations
//! as that role with `forge::migrate` before they start), the harness as the superuser. Each
//! node registers, explicitly:
//!
//! * `soak_tick`, a per-second cron (`catch_up = "all"`, `overlap = "wait"`) whose handler, in
//!   its fenced transaction, inserts an effect row (no unique key: a repeated effect is a second
//!   row), enqueues one `soak_tx_job` and one `soak_plain_job`, and completes the tick in the
//!   same commit: exactly once;
//! * `soak_default_tick`, a per-second cron with `catch_up = "all"` and the default overlap
//!   (since issue 22 `"wait"` under `catch_up = "all"`, `"skip"` before): an effect row, a read
//!   of `forge.jobs` and the tick's completion in its fenced transaction (with
//!   `catch_up = "all"` every tick must run, also one that came due while a run was held up);
//! * `soak_tx_job`, which inserts its effect and completes the job in one transaction: exactly
//!   once;
//! * `soak_plain_job`, which inserts its effect with autocommit before returning: at least once
//!   (duplicates are counted, not failures);
//! * `soak_hog`, which holds one pool connection for a while (pool starvation, and work only
//!   one node does), on a queue only its node works;
//! * `soak_burst_job`, a no-op of 100 ms the harness enqueues 40 at a time just before a write
//!   stall, so that workers are claiming when commits start to wait;
//! * a leader task per built-in role writing a fenced row every 500 ms (for the overlap check).
//!
//! Every job handler prints `SOAK-HANDLER start <job> <attempt> <µs>` when it starts and
//! `SOAK-HANDLER end ...` when it returns or is dropped (an attempt taken away); the harness
//! reads these lines from each process's output, so it knows which attempts have a live
//! handler, independently of the database.
//!
//! Timings are small so that faults matter: lease 3 s, renewal 1 s, lock_timeout 1 s,
//! check_interval 500 ms, drain 2 s, heartbeat 500 ms, drifted after 1.5 s, down after 4 s,
//! maintenance_interval 5 s, a pool of 5 connections.
//!
//! Every 5-30 s (seeded; the seed is printed; after a fault of several steps, 5-30 s after it
//! ended) the harness applies one fault, drawn from a shuffled deck so that every kind comes up
//! before any repeats: SIGKILL (restart after 1-4 s),
//! SIGTERM (restart once it exited), SIGSTOP for longer than the lease then SIGCONT, PostgreSQL
//! fast restart, immediate (crash) restart, primary failover (crash the primary, promote the
//! standby, retarget the proxies, build a new standby for the next one; half of the failovers
//! first black-hole the standby's replication for 2-5 s, so that the last seconds of commits
//! are lost, as with an asynchronous standby that fell behind), `pg_terminate_backend`
//! of node sessions, pool sessions or lock sessions, a black hole on one node's proxy for
//! longer than down_after (then healed, and the dead flows severed), pool starvation, lost
//! replies after commit (a deferred trigger makes the node's next effect COMMIT sleep 1.5 s on
//! the server; the node is SIGKILLed meanwhile: the commit completes, the reply is never heard),
//! and the stalls of issue 22:
//!
//! * **frozen inside a job's transaction**: the harness sets a flag row for a node; its next
//!   `soak_tx_job` keeps its transaction open after `ctx.complete(&mut tx)` (a marker
//!   statement, then 3 s before the commit); when `pg_stat_activity` shows that session idle in
//!   transaction with the marker, the node is SIGSTOPped for down_after + 1-8 s, then SIGCONT.
//!   Half the time another node is given a long job (its `soak_hog`) at the freeze and
//!   SIGKILLed once the frozen node is marked down (restarted only after the thaw): its job must
//!   be rescued while the frozen transaction holds its row lock;
//! * **frozen inside a tick's fenced transaction**: the same on the scheduler leader, in
//!   `soak_tick` after `CronContext::complete(&mut tx)` (held 2 s, under the lease after which
//!   the server ends an idle fenced transaction);
//! * **a write stall longer than the statement bound** (5 s): the standby is made synchronous
//!   (`PgServer::set_synchronous_standby`), a burst of `soak_burst_job`s is enqueued and its
//!   WAL receiver SIGSTOPped (`PgServer::pause_wal_receiver`) while they are being claimed, for
//!   6-15 s: every commit on the primary waits (invisible to others until it ends), reads do
//!   not; then resumed and the primary made asynchronous again;
//! * **a table lock**: `LOCK TABLE forge.jobs IN ACCESS EXCLUSIVE MODE` in a transaction of the
//!   harness (a migration's, an operator's), held 18-22 s, then committed;
//! * **a step-down storm**: 3-5 `forge.step_down` requests for each built-in role, 0.2-2 s
//!   apart, through `forge::inspect::Cluster::step_down` (the path of the admin API and the
//!   CLI); half the time with standbys waiting, half the time with one eligible node (the two
//!   others stopped with SIGTERM and kept down until the storm is over);
//! * **a node that cannot reconnect**: the harness opens connections as the nodes' role until
//!   the server refuses them (`max_connections` less the superuser-reserved slots, which keep
//!   the harness working), ends one node's node session, keeps taking every slot that frees
//!   (and ends the session again if the node got one back) for down_after + 2-5 s, then frees
//!   them. Jobs only that node works are due every second meanwhile: its handlers must keep
//!   running.
//!
//! After the last fault everything is healed, dead nodes are restarted, the backlog drains
//! (bounded), the nodes are stopped with SIGTERM, and the ledger is computed from the
//! database: duplicate effects, missing and skipped ticks of both crons, lost or stuck jobs,
//! reruns, overlapping epochs, node RSS over time, and:
//!
//! * **rescue latency after a node is marked down**: the harness adds deferred constraint
//!   triggers to `forge.jobs` (`soak_job_moves`: each commit that changes a job's state,
//!   attempt or node, at the time of the COMMIT); for each `node_down` event of `forge.events`,
//!   every job that history shows `running` on that node at that moment, and the time until it
//!   left `running`: rescued by the scheduler leader, rescued by the node's next run (its
//!   restart), or completed by its own attempt (so never rescued: a frozen node that thawed);
//!   p50, p99, max, per way out, and the slowest with the fault in force;
//! * **jobs running with no handler anywhere** (target: 0): every 2 s the harness reads the
//!   jobs `running` in the database, (job, attempt, node), and looks for a live handler of that
//!   attempt in that node's current process (from its `SOAK-HANDLER` lines; a SIGSTOPped
//!   process's handlers count as live: its jobs wait for it or for rescue, which the latency
//!   measures; a killed process's handlers end with it). A job seen without one for longer than
//!   lease + down_after + maintenance_interval + 15 s of slack (27 s: pool starvation holds a
//!   finished attempt's report for up to two rounds of hogs), not counting the time of the
//!   harness's own table lock and write stall, is stranded. Sampled through the run and once
//!   more after the drain;
//! * **jobs rescued from a live node** (target: 0, ARCHITECTURE's invariant 4): a rescue
//!   (`errors` entry `rescued`) of an attempt whose handler was running at that instant on a
//!   node neither SIGSTOPped nor black-holed then. Every rescue is also counted by who made it
//!   (the scheduler leader, the node's next run, the worker's own reconciliation) and where
//!   the attempt's handler was (running, already returned: its outcome was on its way, gone
//!   with its process, never started);
//! * **leaderless time per role**: from `forge.events`, a tenure ends at its release, its
//!   `leader_lost` report or its lease expiry, whichever is first, and the next begins at
//!   `leader_elected`; a crashed leader's tenure counts from its lease expiry, so its gap is a
//!   lower bound. Sum and max per role, the gaps grouped by the last fault before them, the
//!   longest ones;
//! * **step-down requests** and what they answered; for each connections-full fault, the
//!   node's handler starts and ends while it could not reconnect (target: some).
//!
//! One PASS/FAIL line per target (and `info` lines for the figures without one); the exit
//! status is non-zero when a target is missed. Node logs are kept in the printed run
//! directory.
//!
//! Why `overlap = "wait"` on `soak_tick`: with the default `"skip"`, a tick that comes due while
//! the previous run is still going (a commit held 1.5 s by the lost-reply trigger, a starved
//! pool) is recorded as `skipped` and its effect never happens; "0 missing ticks" is only a
//! meaningful target when every tick runs. `soak_default_tick` measures what the default does
//! under `catch_up = "all"`.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge::inspect::StepDown;
use forge::jobs::{Jobs, NewJob};
use forge::{
    Config, CronContext, CronError, JobContext, JobError, Leadership, LockNamespace, Node, Role,
};
use forge_testkit::{Filter, NodeProcess, PgOptions, PgProxy, PgServer};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgPool};
use tokio::process::Command;
use tokio::task::JoinHandle;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str =
    "usage: soak [--minutes N] [--seed N] [--interval MIN-MAX] [--only KIND,KIND...]
fault kinds for --only: sigkill sigterm sigstop pg-fast-restart pg-immediate-restart failover
  kill-node-sessions kill-pool-sessions kill-lock-sessions blackhole pool-starvation
  lost-reply-cron lost-reply-job freeze-job-tx freeze-cron-tx write-stall table-lock
  step-down-storm connections-full";

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
/// `[jobs] maintenance_interval` of every node.
const MAINTENANCE: Duration = Duration::from_secs(5);
/// The jobs' statement bound (a worker round trip, a maintenance pass): max(lease, 5 s).
const STATEMENT_BOUND: Duration = Duration::from_secs(5);
/// The database role the nodes log in as: not a superuser, so that the superuser-reserved
/// connection slots stay free for the harness when the server's connections are full.
const NODE_ROLE: &str = "forge_soak";
/// `max_connections` of the server (three nodes use about 30).
const MAX_CONNECTIONS: u32 = 100;
/// How long a handler asked to hold its transaction open keeps it (the harness SIGSTOPs the
/// node meanwhile). A tick's fenced transaction is ended by the server after a lease idle, so
/// its hold stays below the lease (a hold the harness misses then commits normally).
const HOLD_JOB_TX: Duration = Duration::from_secs(3);
const HOLD_CRON_TX: Duration = Duration::from_secs(2);
/// The flags (`soak_flags.kind`) asking a node's handlers to hold their transaction open.
const FREEZE_JOB_FLAG: &str = "freeze_job";
const FREEZE_CRON_FLAG: &str = "freeze_cron";
/// How many no-op jobs are enqueued just before a write stall.
const BURST: usize = 40;
/// How often running jobs are compared with the handlers the nodes report.
const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// A job `running` in the database with no live handler of its attempt for longer than this
/// (not counting the harness's own write stalls: a table lock, a stalled synchronous standby)
/// is stranded: lease + down_after + maintenance_interval + slack for pool starvation (two
/// rounds of hogs) and a black hole.
const STRANDED_AFTER: Duration =
    Duration::from_secs(LEASE.as_secs() + DOWN_AFTER.as_secs() + MAINTENANCE.as_secs() + 15);

/// The cron and job kinds of the soak.
const CRON: &str = "soak_tick";
/// The cron at the default `overlap` (with `catch_up = "all"`).
const DEFAULT_CRON: &str = "soak_default_tick";
const TX_JOB: &str = "soak_tx_job";
const PLAIN_JOB: &str = "soak_plain_job";
/// The pool hogs' kinds, as a LIKE pattern (one kind per node).
const HOG_JOB: &str = "soak_hog%";
/// The no-op jobs enqueued in a burst just before a write stall.
const BURST_JOB: &str = "soak_burst_job";

/// The application's tables, made by the harness before the nodes start. No unique key on
/// the effects: a repeated effect is a second row, so duplicates can be counted. The deferred
/// constraint triggers make a COMMIT sleep on the server while a flag names the committing
/// node (lost replies), and record the commit's key in the same transaction, so that a commit
/// that completed after its node died can be found afterwards.
const SETUP_SQL: &str = r#"
CREATE TABLE soak_cron_effects (
    id           bigserial   PRIMARY KEY,
    cron         text        NOT NULL,
    scheduled_at timestamptz NOT NULL,
    attempt      integer     NOT NULL,
    node         text        NOT NULL,
    epoch        bigint      NOT NULL,
    tenure       bigint      NOT NULL,
    at           timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX soak_cron_effects_tick ON soak_cron_effects (cron, scheduled_at);

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
    IF NEW.cron = 'soak_tick'
       AND EXISTS (SELECT 1 FROM soak_flags f WHERE f.kind = 'cron' AND f.node = NEW.node) THEN
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

/// The history of every job's (state, attempt, node), recorded at each commit that changes
/// one (deferred constraint triggers on `forge.jobs`, made after FORGE's migrations; the
/// product's statements are unchanged, each commit adds a row here): which jobs were running
/// on a node when it was marked down, and when each left `running`. `at` is the time of the
/// COMMIT (`clock_timestamp()` in a deferred trigger), so a completion written inside a
/// transaction that stays open counts from its commit.
const MOVES_SQL: &str = r#"
CREATE TABLE soak_job_moves (
    id      bigserial   PRIMARY KEY,
    job_id  bigint      NOT NULL,
    state   text        NOT NULL,
    attempt integer     NOT NULL,
    node    text,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE FUNCTION soak_job_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO soak_job_moves (job_id, state, attempt, node)
        VALUES (OLD.id, 'deleted', OLD.attempt, OLD.node_id);
    ELSE
        INSERT INTO soak_job_moves (job_id, state, attempt, node)
        VALUES (NEW.id, NEW.state, NEW.attempt, NEW.node_id);
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER soak_job_inserted AFTER INSERT OR DELETE ON forge.jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION soak_job_moved();
CREATE CONSTRAINT TRIGGER soak_job_updated AFTER UPDATE ON forge.jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.attempt IS DISTINCT FROM NEW.attempt
          OR OLD.node_id IS DISTINCT FROM NEW.node_id)
    EXECUTE FUNCTION soak_job_moved();
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
        .cron(soak_default_tick)
        .job(soak_tx_job)
        .job(soak_plain_job)
        .job(soak_burst_job)
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
    run_tick(&ctx, true).await
}

/// The second per-second cron, at the defaults but for `catch_up = "all"` (so `overlap` is the
/// default `"skip"`): its effect and the tick's completion in one fenced commit, and a read of
/// `forge.jobs` in the same transaction (a tick that looks at the queue), so that a lock on
/// that table holds its run. Issue 22: with `catch_up = "all"` every tick must run.
#[forge::cron("* * * * * *", name = "soak_default_tick", catch_up = "all")]
async fn soak_default_tick(ctx: CronContext) -> Result<(), CronError> {
    run_tick(&ctx, false).await
}

/// A tick's run: its transaction, retried until it is ready to commit, then the commit.
async fn run_tick(ctx: &CronContext, main: bool) -> Result<(), CronError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        match tick_transaction(ctx, main).await {
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

/// A tick's transaction, ready to commit. `main`: the `soak_tick` cron (effect, work, two
/// jobs; held open on request), else `soak_default_tick` (effect, a read of `forge.jobs`).
async fn tick_transaction(
    ctx: &CronContext,
    main: bool,
) -> forge::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let mut tx = ctx.fenced_transaction().await?;
    sqlx::query(
        "INSERT INTO soak_cron_effects (cron, scheduled_at, attempt, node, epoch, tenure)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(if main { CRON } else { DEFAULT_CRON })
    .bind(ctx.scheduled_at())
    .bind(ctx.attempt() as i32)
    .bind(ctx.node_id().to_string())
    .bind(ctx.epoch().0)
    .bind(ctx.leadership().tenure_id())
    .execute(&mut *tx)
    .await?;
    if !main {
        sqlx::query("SELECT count(*) FROM forge.jobs WHERE id = -1")
            .execute(&mut *tx)
            .await?;
        ctx.complete(&mut tx).await?;
        return Ok(tx);
    }
    tokio::time::sleep(WORK).await;
    let jobs = Jobs::new(ctx.pool().clone(), ctx.leadership().namespace());
    let tick_us = ctx.scheduled_at().timestamp_micros();
    jobs.enqueue_in(&mut *tx, soak_tx_job, TickArgs { tick_us })
        .await?;
    jobs.enqueue_in(&mut *tx, soak_plain_job, TickArgs { tick_us })
        .await?;
    ctx.complete(&mut tx).await?;
    hold_if_asked(
        &mut tx,
        FREEZE_CRON_FLAG,
        &ctx.node_id().to_string(),
        HOLD_CRON_TX,
    )
    .await?;
    Ok(tx)
}

/// The freeze-in-a-transaction faults: when the harness has set the flag `flag` for this
/// node, the handler keeps its transaction open (after `complete`, before the commit) for
/// `hold`, with a marker statement as the session's last query, so that the harness sees it
/// in `pg_stat_activity` (idle in transaction) and SIGSTOPs the node while it is there.
async fn hold_if_asked(
    conn: &mut sqlx::PgConnection,
    flag: &str,
    node: &str,
    hold: Duration,
) -> Result<(), sqlx::Error> {
    let asked: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM soak_flags WHERE kind = $1 AND node = $2)",
    )
    .bind(flag)
    .bind(node)
    .fetch_one(&mut *conn)
    .await?;
    if asked {
        sqlx::query("SELECT 1 AS soak_hold_marker")
            .execute(&mut *conn)
            .await?;
        println!("SOAK-HOLD {flag} {}", Utc::now().timestamp_micros());
        tokio::time::sleep(hold).await;
    }
    Ok(())
}

/// A running handler, as the harness sees it: `SOAK-HANDLER start <job> <attempt> <unix µs>`
/// when the handler starts and `SOAK-HANDLER end ...` when it returns or is dropped (an
/// attempt taken away). A SIGKILLed process prints no end: the harness ends its handlers
/// with the process.
struct HandlerMark {
    job: i64,
    attempt: i32,
}

impl HandlerMark {
    fn start(ctx: &JobContext) -> HandlerMark {
        let mark = HandlerMark {
            job: ctx.id().0,
            attempt: ctx.attempt() as i32,
        };
        println!(
            "SOAK-HANDLER start {} {} {}",
            mark.job,
            mark.attempt,
            Utc::now().timestamp_micros()
        );
        mark
    }
}

impl Drop for HandlerMark {
    fn drop(&mut self) {
        println!(
            "SOAK-HANDLER end {} {} {}",
            self.job,
            self.attempt,
            Utc::now().timestamp_micros()
        );
    }
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
    let _mark = HandlerMark::start(&ctx);
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
    hold_if_asked(
        &mut tx,
        FREEZE_JOB_FLAG,
        &ctx.node_id().to_string(),
        HOLD_JOB_TX,
    )
    .await?;
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
    let _mark = HandlerMark::start(&ctx);
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

/// A no-op job of 100 ms, enqueued by the harness in a burst just before a write stall, so that
/// workers claim while commits stall: a claim whose commit waits past the statement bound is
/// dropped by its worker, and commits (invisibly until the stall ends) after the worker's
/// reconciliation looked (issue 22, item 4).
#[forge::job(name = "soak_burst_job", max_attempts = 100)]
async fn soak_burst_job(ctx: JobContext, _args: HogArgs) -> Result<(), JobError> {
    let _mark = HandlerMark::start(&ctx);
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

/// Pool starvation: holds one of the node's pool connections (busy in `pg_sleep`) for
/// `hold_ms`. Always succeeds, whatever happened to the connection.
async fn hog(ctx: JobContext, args: HogArgs) -> Result<(), JobError> {
    let _mark = HandlerMark::start(&ctx);
    if let Ok(mut conn) = ctx.pool().acquire().await {
        let _ = sqlx::query("SELECT pg_sleep($1)")
            .bind(args.hold_ms as f64 / 1000.0)
            .execute(&mut *conn)
            .await;
    }
    Ok(())
}

// One hog type per node, each declaring a queue only that node works (`[node] queues` lists it;
// every node's binary declares all three).

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

[node]
queues = ["default", "hog_{id}"]

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
    /// `--only`: the deck holds these kinds alone.
    only: Option<Vec<FaultKind>>,
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
            only: None,
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
                "--only" => {
                    let text = value("--only")?;
                    let kinds = text
                        .split(',')
                        .map(|key| {
                            FaultKind::ALL
                                .into_iter()
                                .find(|k| k.key() == key.trim())
                                .ok_or_else(|| format!("--only: unknown fault kind {key:?}"))
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    options.only = Some(kinds);
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
    FreezeJobTx,
    FreezeCronTx,
    WriteStall,
    TableLock,
    StepDownStorm,
    ConnectionsFull,
}

impl FaultKind {
    const ALL: [FaultKind; 19] = [
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
        FaultKind::FreezeJobTx,
        FaultKind::FreezeCronTx,
        FaultKind::WriteStall,
        FaultKind::TableLock,
        FaultKind::StepDownStorm,
        FaultKind::ConnectionsFull,
    ];

    /// The name `--only` takes.
    fn key(self) -> &'static str {
        match self {
            FaultKind::SigKill => "sigkill",
            FaultKind::SigTerm => "sigterm",
            FaultKind::SigStop => "sigstop",
            FaultKind::PgFastRestart => "pg-fast-restart",
            FaultKind::PgImmediateRestart => "pg-immediate-restart",
            FaultKind::Failover => "failover",
            FaultKind::TerminateNodeSessions => "kill-node-sessions",
            FaultKind::TerminatePoolSessions => "kill-pool-sessions",
            FaultKind::TerminateLockSessions => "kill-lock-sessions",
            FaultKind::BlackHole => "blackhole",
            FaultKind::PoolStarvation => "pool-starvation",
            FaultKind::LostReplyCron => "lost-reply-cron",
            FaultKind::LostReplyJob => "lost-reply-job",
            FaultKind::FreezeJobTx => "freeze-job-tx",
            FaultKind::FreezeCronTx => "freeze-cron-tx",
            FaultKind::WriteStall => "write-stall",
            FaultKind::TableLock => "table-lock",
            FaultKind::StepDownStorm => "step-down-storm",
            FaultKind::ConnectionsFull => "connections-full",
        }
    }

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
            FaultKind::FreezeJobTx => "frozen inside a job transaction",
            FaultKind::FreezeCronTx => "frozen inside a tick transaction",
            FaultKind::WriteStall => "write stall (synchronous standby frozen)",
            FaultKind::TableLock => "LOCK TABLE forge.jobs",
            FaultKind::StepDownStorm => "step-down storm",
            FaultKind::ConnectionsFull => "connections full, node session cut",
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
    /// Held down (not restarted) until this instant, or until cleared (a step-down storm with
    /// one eligible node).
    hold_until: Option<Instant>,
    /// How many lines of the current process's output were read for its handlers.
    cursor: usize,
    /// The current process's handlers that started and have not ended: (job, attempt) -> span.
    open: HashMap<(i64, i32), usize>,
    /// SIGSTOPped since (µs since the epoch).
    paused_since_us: Option<i64>,
    /// Black-holed since (µs since the epoch).
    blackhole_since_us: Option<i64>,
}

/// A lost-reply fault waiting for the node's next slow COMMIT.
struct Armed {
    slot: usize,
    kind: &'static str,
    deadline: Instant,
}

/// One run of a job handler, from the lines its node printed (`SOAK-HANDLER`).
struct HandlerSpan {
    slot: usize,
    job: i64,
    attempt: i32,
    start_us: i64,
    /// When it returned or was dropped; or when its process ended (`died`).
    end_us: Option<i64>,
    died: bool,
}

/// A job `running` in the database with no live handler of its attempt, since `first`.
struct Handlerless {
    node: String,
    first: Instant,
    first_at: f64,
    /// The harness's write-stall time at `first` (not counted in the job's age).
    stall_at_first: Duration,
}

/// A job that stayed `running` with no live handler for longer than [`STRANDED_AFTER`].
struct Stranded {
    node: String,
    first_at: f64,
    age: f64,
    still: bool,
}

/// The freeze-inside-a-transaction faults: armed (the flag is set, the node's next handler
/// holds its transaction open), then frozen.
struct Freeze {
    slot: usize,
    flag: &'static str,
    cron: bool,
    hold: Duration,
    /// Also SIGKILL another node (kept down until after the thaw) once the frozen one is
    /// marked down: its jobs must be rescued while the frozen transaction holds its row lock.
    compound: bool,
    stage: FreezeStage,
}

enum FreezeStage {
    Armed {
        deadline: Instant,
    },
    Frozen {
        since: Instant,
        since_utc: DateTime<Utc>,
        until: Instant,
        down_seen: bool,
        next_check: Instant,
        /// The node to SIGKILL once the frozen one is marked down (running a long hog).
        victim: Option<usize>,
    },
}

/// `LOCK TABLE forge.jobs IN ACCESS EXCLUSIVE MODE`, held in this transaction until `until`.
struct TableLock {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    since: Instant,
    until: Instant,
}

/// The standby made synchronous and its WAL receiver frozen until `until`.
struct WriteStall {
    standby: Arc<PgServer>,
    since: Instant,
    until: Instant,
    resumed: bool,
}

/// The server's connections filled by the harness while one node's node session is cut.
struct ConnFill {
    slot: usize,
    state: Arc<std::sync::Mutex<FillState>>,
    task: JoinHandle<()>,
    hold: Duration,
    stage: FillStage,
}

enum FillStage {
    Filling {
        deadline: Instant,
    },
    Holding {
        since: Instant,
        since_us: i64,
        until: Instant,
        next_check: Instant,
        terminations: u32,
    },
}

/// What the filling task shares with the harness.
#[derive(Default)]
struct FillState {
    held: usize,
    refused: u64,
    full: bool,
    /// Retry refused connections every few ms until then (a slot was just freed).
    spin_until: Option<Instant>,
    stop: bool,
    errors: u64,
    last_error: String,
}

/// A step-down storm: requests for each role, with standbys or with one eligible node.
struct Storm {
    alone: bool,
    held: Vec<usize>,
    plan: Vec<(Duration, Role, bool)>,
    queue: VecDeque<(Instant, Role, bool)>,
    started: bool,
    wait_deadline: Instant,
    end_at: Option<Instant>,
}

/// One step-down request: when (harness seconds), role, whether the storm had one eligible
/// node, and what it answered.
struct StepDownRecord {
    at: f64,
    role: String,
    alone: bool,
    outcome: String,
}

/// A standby being built: the server and the proxy it replicates through.
type StandbyBuild = Result<(PgServer, Arc<PgProxy>), forge_testkit::Error>;

/// `url` (the kit's `postgres://postgres@...`) for the nodes' role.
fn as_node_role(url: &str) -> Result<String, BoxError> {
    url.strip_prefix("postgres://postgres@")
        .map(|rest| format!("postgres://{NODE_ROLE}@{rest}"))
        .ok_or_else(|| format!("unexpected server URL {url}: cannot log in as {NODE_ROLE}").into())
}

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

impl FaultRecord {
    /// The kind, and for a step-down storm which one (the report groups by it).
    fn label(&self) -> &'static str {
        match self.kind {
            FaultKind::StepDownStorm if self.text.contains("one eligible node") => {
                "step-down storm, one eligible node"
            }
            FaultKind::StepDownStorm => "step-down storm, standbys waiting",
            kind => kind.name(),
        }
    }
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
    /// The wall clock at `t0`, to place the database's timestamps on the harness's clock.
    t0_utc: DateTime<Utc>,
    db_name: String,
    /// `--only`.
    only: Option<Vec<FaultKind>>,
    /// Every handler run the nodes reported.
    spans: Vec<HandlerSpan>,
    /// SIGSTOP intervals: (slot, from µs, to µs).
    pauses: Vec<(usize, i64, i64)>,
    /// Black-hole intervals: (slot, from µs, to µs).
    blackholes: Vec<(usize, i64, i64)>,
    /// The harness's own write stalls (table lock, frozen synchronous standby).
    stalls: Vec<(Instant, Option<Instant>)>,
    handlerless: HashMap<(i64, i32), Handlerless>,
    stranded: BTreeMap<(i64, i32), Stranded>,
    max_handlerless: f64,
    samples: u64,
    sample_failures: u64,
    next_sample: Instant,
    freeze: Option<Freeze>,
    table_lock: Option<TableLock>,
    write_stall: Option<WriteStall>,
    fill: Option<ConnFill>,
    storm: Option<Storm>,
    step_downs: Vec<StepDownRecord>,
    /// One line per connections-full fault: did the node's handlers keep running?
    fill_reports: Vec<(bool, String)>,
    /// When the final SIGTERMs were sent (the end of the leaderless accounting).
    stop_began: Option<DateTime<Utc>>,
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
    let primary = tokio::task::spawn_blocking(|| {
        PgServer::start_with(
            PgOptions::default()
                .durable(true)
                .max_connections(MAX_CONNECTIONS),
        )
    })
    .await??;
    let primary = Arc::new(primary);
    let db = primary.create_database().await?;
    let db_name = db.name().to_owned();
    // The nodes log in as an ordinary role owning the database (FORGE's migrations, the
    // soak's tables and the job history triggers are made as that role, before the nodes
    // start: `forge::migrate` applies what a node would); the harness is the superuser.
    let mut setup = sqlx::PgConnection::connect(&primary.url()).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {NODE_ROLE} LOGIN; ALTER DATABASE \"{db_name}\" OWNER TO {NODE_ROLE};"
    )))
    .execute(&mut setup)
    .await?;
    setup.close().await?;
    let mut setup = sqlx::PgConnection::connect(&as_node_role(&primary.url_for(&db_name))?).await?;
    forge::migrate::up(&mut setup).await?;
    sqlx::raw_sql(SETUP_SQL).execute(&mut setup).await?;
    sqlx::raw_sql(MOVES_SQL).execute(&mut setup).await?;
    setup.close().await?;
    let admin_proxy = PgProxy::start(primary.host(), primary.port())?;
    let admin_url = format!(
        "{}?application_name=forge-soak-harness",
        admin_proxy.url_for(&primary, &db_name)
    );
    // A lock wait of the harness's own (behind its LOCK TABLE, a frozen transaction) ends
    // on the server, not only in the client.
    let admin_options = PgConnectOptions::from_str(&admin_url)?.options([("lock_timeout", "3s")]);
    let admin = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(ADMIN_TIMEOUT)
        .connect_lazy_with(admin_options);
    let source = primary.clone();
    let (standby, repl_proxy) =
        tokio::task::spawn_blocking(move || build_standby(&source)).await??;

    let dir = std::env::temp_dir().join(format!("forge-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut slots = Vec::new();
    for id in NODE_IDS {
        let proxy = PgProxy::start(primary.host(), primary.port())?;
        let text = node_config(&as_node_role(&proxy.url_for(&primary, &db_name))?, id);
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
            hold_until: None,
            cursor: 0,
            open: HashMap::new(),
            paused_since_us: None,
            blackhole_since_us: None,
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
        t0_utc: Utc::now(),
        db_name,
        only: options.only,
        spans: Vec::new(),
        pauses: Vec::new(),
        blackholes: Vec::new(),
        stalls: Vec::new(),
        handlerless: HashMap::new(),
        stranded: BTreeMap::new(),
        max_handlerless: 0.0,
        samples: 0,
        sample_failures: 0,
        next_sample: Instant::now(),
        freeze: None,
        table_lock: None,
        write_stall: None,
        fill: None,
        storm: None,
        step_downs: Vec::new(),
        fill_reports: Vec::new(),
        stop_began: None,
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
        // A fault of several steps (a freeze, a lock held, a storm...) gives the cluster the
        // interval after it ends, not after it starts.
        let mut after_busy = false;
        while Instant::now() < fault_end {
            self.supervise().await;
            if self.busy() {
                after_busy = true;
            } else if after_busy {
                after_busy = false;
                next_fault = Instant::now() + self.rng.secs(self.interval.0, self.interval.1);
            }
            if Instant::now() >= next_fault && !self.busy() {
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
        self.scan_handlers(i, &lines);
        self.process_ended(i);
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
        self.tend_freeze().await;
        self.tend_table_lock().await;
        self.tend_write_stall().await;
        self.tend_fill().await;
        self.tend_storm().await;
        self.tend_standby().await;
        if Instant::now() >= self.next_sample {
            self.next_sample = Instant::now() + SAMPLE_EVERY;
            self.sample_jobs().await;
        }
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
        if let Some(since) = slot.blackhole_since_us.take() {
            self.blackholes
                .push((i, since, Utc::now().timestamp_micros()));
        }
        let slot = &mut self.slots[i];
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
                    self.resumed(i);
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
            && self.slots[i].hold_until.is_none_or(|t| now >= t)
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

    /// The scheduler leader's slot, if it is eligible for a fault.
    async fn eligible_scheduler_leader(&self) -> Option<(usize, String)> {
        let leader = self.scheduler_leader().await?;
        let i = (0..self.slots.len()).find(|i| self.slots[*i].id == leader)?;
        self.eligible(i)
            .then(|| (i, " (scheduler leader)".to_owned()))
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
            let mut deck = self.only.clone().unwrap_or_else(|| FaultKind::ALL.to_vec());
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
                if let Err(err) = self.freeze_slot(i, Instant::now() + hold) {
                    self.note(format!("SIGSTOP {} failed: {err}", self.slots[i].id));
                    return None;
                }
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
                self.slots[i].blackhole_since_us = Some(Utc::now().timestamp_micros());
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
            FaultKind::FreezeJobTx => self.arm_freeze(false).await,
            FaultKind::FreezeCronTx => self.arm_freeze(true).await,
            FaultKind::WriteStall => self.start_write_stall().await,
            FaultKind::TableLock => self.lock_jobs_table().await,
            FaultKind::StepDownStorm => self.start_storm(),
            FaultKind::ConnectionsFull => self.start_fill().await,
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
            self.eligible_scheduler_leader().await?
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

    /// A fault armed by a flag ends without firing: the flag is cleared, the log says why.
    async fn disarm(&mut self, flag: &str, id: &str, fault: &str, why: &str) {
        self.set_flag(flag, id, false).await;
        self.note(format!("{fault} on {id}: {why}; disarmed"));
    }

    async fn check_armed(&mut self) {
        let Some(armed) = &self.armed else {
            return;
        };
        let (i, kind, deadline) = (armed.slot, armed.kind, armed.deadline);
        let id = self.slots[i].id.clone();
        if !matches!(self.slots[i].phase, Phase::Running { .. }) {
            self.armed = None;
            self.disarm(kind, &id, "lost reply", "the node stopped running")
                .await;
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
            self.disarm(kind, &id, "lost reply", "no slow COMMIT within 15 s")
                .await;
        }
    }

    /// After the faults: nothing armed, nothing paused or black-holed, dead nodes restarted.
    async fn heal_all(&mut self) {
        if self.pending_failover.is_some() {
            let done = self.fail_over_now().await;
            self.note(done);
        }
        if let Some(freeze) = self.freeze.take() {
            let id = self.slots[freeze.slot].id.clone();
            self.set_flag(freeze.flag, &id, false).await;
        }
        if let Some(lock) = &mut self.table_lock {
            lock.until = Instant::now();
        }
        self.tend_table_lock().await;
        if let Some(stall) = &mut self.write_stall {
            stall.until = Instant::now();
        }
        for _ in 0..10 {
            self.tend_write_stall().await;
            if self.write_stall.is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // A fill that holds the server ends as planned (its report); one still filling stops.
        match &mut self.fill {
            Some(ConnFill {
                stage: FillStage::Holding { until, .. },
                ..
            }) => {
                *until = Instant::now();
                self.tend_fill().await;
            }
            Some(_) => self.stop_fill().await,
            None => {}
        }
        if let Some(storm) = &mut self.storm {
            storm.queue.clear();
            storm.started = true;
            storm.end_at = Some(Instant::now());
        }
        self.tend_storm().await;
        for slot in &mut self.slots {
            slot.hold_until = None;
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
                     WHERE (kind LIKE $6 OR kind = $7)
                       AND state NOT IN ('completed', 'dead', 'cancelled'))",
            )
            .bind(CRON)
            .bind(cutoff)
            .bind(TX_JOB)
            .bind(PLAIN_JOB)
            .bind(cutoff.timestamp_micros())
            .bind(HOG_JOB)
            .bind(BURST_JOB)
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
            missing.push(format!("{hogs} pool hogs and burst jobs not finished"));
        }
        Some(missing.join(", "))
    }

    /// SIGTERM to every node; true if all exited cleanly within 30 s.
    async fn stop_all(&mut self) -> bool {
        self.note("stopping the nodes (SIGTERM)");
        self.sample_jobs().await;
        self.stop_began = Some(Utc::now());
        let mut clean = true;
        for i in 0..self.slots.len() {
            if let Some(proc) = self.slots[i].phase.proc() {
                let _ = proc.resume();
                let _ = proc.terminate();
            }
            self.resumed(i);
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
        let progress: Option<(i64, String)> = if self.table_lock.is_some() {
            None
        } else {
            tokio::time::timeout(
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
        .and_then(Result::ok)
        };
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

        // --- Cron ticks.
        let Some(main_cron) = cron_figures(db, CRON, cutoff).await? else {
            return Err("the cron never wrote an effect".into());
        };
        let default_cron = cron_figures(db, DEFAULT_CRON, cutoff).await?;

        // --- Jobs.
        let jobs: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT CASE WHEN kind LIKE $4 THEN 'soak_hog' ELSE kind END, state, count(*),
                    count(*) FILTER (WHERE attempt > 1) FROM forge.jobs
              WHERE (kind IN ($1, $2) AND (args->>'tick_us')::bigint <= $3) OR kind LIKE $4
                 OR kind = $5
              GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .bind(TX_JOB)
        .bind(PLAIN_JOB)
        .bind(cutoff_us)
        .bind(HOG_JOB)
        .bind(BURST_JOB)
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
                          FROM soak_cron_effects WHERE cron = $4 AND scheduled_at <= $1),
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
        .bind(CRON)
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
                          WHERE e.cron = 'soak_tick'
                            AND (extract(epoch FROM e.scheduled_at) * 1000000)::bigint = r.key)
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

        main_cron.write(&mut out, CRON, "overlap = wait", cutoff);
        match &default_cron {
            Some(figures) => {
                figures.write(&mut out, DEFAULT_CRON, "overlap at its default", cutoff)
            }
            None => {
                let _ = writeln!(out, "\ncron {DEFAULT_CRON}: never wrote an effect");
            }
        }

        let _ = writeln!(
            out,
            "\njobs (those of ticks up to the cut-off, the pool hogs, the bursts before write stalls):"
        );
        for kind in [TX_JOB, PLAIN_JOB, "soak_hog", BURST_JOB] {
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

        let liveness = self
            .liveness_report(&mut out, default_cron.as_ref())
            .await?;

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
        let (duplicated, succeeded_without_effect, effect_without_success, missing, expected) = (
            main_cron.duplicated,
            main_cron.succeeded_without_effect,
            main_cron.effect_without_success,
            main_cron.missing,
            main_cron.expected,
        );
        let (d_dup, d_succ_without, d_eff_without, d_missing, d_expected, d_skipped) =
            default_cron.as_ref().map_or((0, 0, 0, 0, 0, 0), |f| {
                (
                    f.duplicated,
                    f.succeeded_without_effect,
                    f.effect_without_success,
                    f.missing,
                    f.expected,
                    f.skipped(),
                )
            });
        let transactional_duplicates = duplicated + d_dup + tx.dup_jobs;
        targets.push((
            transactional_duplicates == 0
                && succeeded_without_effect + d_succ_without == 0
                && effect_without_success + d_eff_without == 0
                && tx.completed_without == 0
                && tx.effect_not_completed == 0,
            format!(
                "0 duplicate effects of transactional handlers: cron {duplicated}, {DEFAULT_CRON} {d_dup}, {TX_JOB} {} (and 0 effects without their commit: {} / {} / {} / {})",
                tx.dup_jobs,
                succeeded_without_effect + d_succ_without,
                effect_without_success + d_eff_without,
                tx.completed_without,
                tx.effect_not_completed
            ),
        ));
        targets.push((
            missing == 0 && d_missing == 0 && default_cron.is_some(),
            format!(
                "0 missing ticks with catch_up = \"all\": {CRON} {missing} of {expected}, {DEFAULT_CRON} {d_missing} of {d_expected} ({d_skipped} recorded skipped){}",
                if default_cron.is_some() {
                    ""
                } else {
                    ", and it never ran"
                }
            ),
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

        targets.push((
            liveness.stranded == 0,
            format!(
                "0 jobs running with no handler anywhere for over {} s (sampled every {} s): {} (longest without a handler {:.1} s)",
                STRANDED_AFTER.as_secs(),
                SAMPLE_EVERY.as_secs(),
                liveness.stranded,
                self.max_handlerless
            ),
        ));
        targets.push((
            liveness.rescued_live == 0,
            format!(
                "0 jobs rescued from a live node (its handler running, the node neither SIGSTOPped nor black-holed): {}",
                liveness.rescued_live
            ),
        ));
        if !self.fill_reports.is_empty() {
            let kept = self.fill_reports.iter().filter(|(ok, _)| *ok).count();
            targets.push((
                kept == self.fill_reports.len(),
                format!(
                    "a node that cannot reconnect keeps running its handlers: {kept} of {} times",
                    self.fill_reports.len()
                ),
            ));
        }

        let _ = writeln!(out, "\ntargets:");
        for (ok, text) in &targets {
            let _ = writeln!(out, "  {}  {text}", if *ok { "PASS" } else { "FAIL" });
        }
        let _ = writeln!(
            out,
            "  info  {} duplicate effects of the non-transactional job (at least once: allowed)",
            plain.dup_rows
        );
        for line in &liveness.info {
            let _ = writeln!(out, "  info  {line}");
        }
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

// ---------------------------------------------------------------------------------------------
// The faults of issue 22 (stalls and liveness) and what they need: handlers as the nodes
// report them, running jobs compared with those handlers.
// ---------------------------------------------------------------------------------------------

impl Harness {
    /// A fault of several steps is under way: no other fault starts meanwhile.
    fn busy(&self) -> bool {
        self.armed.is_some()
            || self.freeze.is_some()
            || self.table_lock.is_some()
            || self.write_stall.is_some()
            || self.fill.is_some()
            || self.storm.is_some()
    }

    /// A database timestamp on the harness's clock (seconds since the start).
    fn secs_of(&self, at: DateTime<Utc>) -> f64 {
        (at - self.t0_utc).num_microseconds().unwrap_or(0) as f64 / 1e6
    }

    /// The last fault applied at or before `secs`, for the report.
    fn fault_at(&self, secs: f64) -> String {
        match self.faults.iter().rposition(|f| f.at <= secs + 0.05) {
            Some(n) => {
                let fault = &self.faults[n];
                format!("fault #{} {} at {:.1}s", n + 1, fault.label(), fault.at)
            }
            None => "before any fault".to_owned(),
        }
    }

    /// Reads the `SOAK-HANDLER` lines of slot `i`'s current process past its cursor.
    fn scan_handlers(&mut self, i: usize, lines: &[String]) {
        let from = self.slots[i].cursor.min(lines.len());
        for line in &lines[from..] {
            let Some(rest) = line.strip_prefix("SOAK-HANDLER ") else {
                continue;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let (Some(what), Some(job), Some(attempt), Some(us)) = (
                fields.first(),
                fields.get(1).and_then(|v| v.parse::<i64>().ok()),
                fields.get(2).and_then(|v| v.parse::<i32>().ok()),
                fields.get(3).and_then(|v| v.parse::<i64>().ok()),
            ) else {
                continue;
            };
            match *what {
                "start" => {
                    self.spans.push(HandlerSpan {
                        slot: i,
                        job,
                        attempt,
                        start_us: us,
                        end_us: None,
                        died: false,
                    });
                    let n = self.spans.len() - 1;
                    self.slots[i].open.insert((job, attempt), n);
                }
                "end" => {
                    if let Some(n) = self.slots[i].open.remove(&(job, attempt)) {
                        self.spans[n].end_us = Some(us);
                    }
                }
                _ => {}
            }
        }
        self.slots[i].cursor = lines.len();
    }

    /// Reads the handler lines of slot `i`'s running process.
    fn scan_current(&mut self, i: usize) {
        let Some(lines) = self.slots[i].phase.proc().map(NodeProcess::lines) else {
            return;
        };
        self.scan_handlers(i, &lines);
    }

    /// Slot `i`'s process is gone: its handlers end with it.
    fn process_ended(&mut self, i: usize) {
        let now = Utc::now().timestamp_micros();
        for (_, n) in self.slots[i].open.drain() {
            self.spans[n].end_us = Some(now);
            self.spans[n].died = true;
        }
        self.slots[i].cursor = 0;
        self.resumed(i);
    }

    /// Slot `i` is not SIGSTOPped (any more).
    fn resumed(&mut self, i: usize) {
        if let Some(since) = self.slots[i].paused_since_us.take() {
            self.pauses.push((i, since, Utc::now().timestamp_micros()));
        }
    }

    /// SIGSTOPs slot `i` until `until` (it must be running).
    fn freeze_slot(&mut self, i: usize, until: Instant) -> Result<(), String> {
        let now = Instant::now();
        let phase = std::mem::replace(&mut self.slots[i].phase, Phase::Dead { restart_at: now });
        let Phase::Running { proc } = phase else {
            self.slots[i].phase = phase;
            return Err("not running".into());
        };
        if let Err(err) = proc.pause() {
            self.slots[i].phase = Phase::Running { proc };
            return Err(err.to_string());
        }
        self.slots[i].phase = Phase::Paused {
            proc,
            resume_at: until,
        };
        self.slots[i].paused_since_us = Some(Utc::now().timestamp_micros());
        Ok(())
    }

    /// The time the harness's own write stalls took up to `now`.
    fn stall_total(&self, now: Instant) -> Duration {
        self.stalls
            .iter()
            .map(|(from, to)| to.unwrap_or(now).min(now).saturating_duration_since(*from))
            .sum()
    }

    fn end_stall(&mut self) {
        if let Some((_, to)) = self.stalls.last_mut()
            && to.is_none()
        {
            *to = Some(Instant::now());
        }
    }

    /// Compares the jobs the database shows `running` with the handlers the nodes report:
    /// a job whose attempt has no live handler (on the process its node runs now, SIGSTOPped
    /// or not) for longer than [`STRANDED_AFTER`] is stranded.
    async fn sample_jobs(&mut self) {
        for i in 0..self.slots.len() {
            self.scan_current(i);
        }
        if self.table_lock.is_some() {
            // forge.jobs cannot be read under the harness's own lock (its time is a stall).
            return;
        }
        let rows = tokio::time::timeout(
            Duration::from_secs(3),
            sqlx::query_as::<_, (i64, i32, Option<String>)>(
                "SELECT id, attempt, node_id FROM forge.jobs WHERE state = 'running'",
            )
            .fetch_all(&self.admin),
        )
        .await;
        let Ok(Ok(rows)) = rows else {
            self.sample_failures += 1;
            return;
        };
        self.samples += 1;
        let now = Instant::now();
        let at = self.secs();
        let stall_now = self.stall_total(now);
        let mut seen = HashSet::new();
        for (job, attempt, node) in rows {
            let key = (job, attempt);
            seen.insert(key);
            let node = node.unwrap_or_default();
            let live = self
                .slots
                .iter()
                .any(|s| s.id == node && s.open.contains_key(&key));
            if live {
                self.handlerless.remove(&key);
                continue;
            }
            let entry = self.handlerless.entry(key).or_insert(Handlerless {
                node,
                first: now,
                first_at: at,
                stall_at_first: stall_now,
            });
            let age = (now - entry.first)
                .saturating_sub(stall_now.saturating_sub(entry.stall_at_first))
                .as_secs_f64();
            self.max_handlerless = self.max_handlerless.max(age);
            if age > STRANDED_AFTER.as_secs_f64() {
                let (node, first_at) = (entry.node.clone(), entry.first_at);
                let new = !self.stranded.contains_key(&key);
                let record = self.stranded.entry(key).or_insert(Stranded {
                    node: node.clone(),
                    first_at,
                    age,
                    still: true,
                });
                record.age = age;
                record.still = true;
                if new {
                    self.note(format!(
                        "STRANDED: job {job} attempt {attempt} running on {node} with no live handler for {age:.0} s (since {first_at:.1}s)"
                    ));
                }
            }
        }
        self.handlerless.retain(|key, _| seen.contains(key));
        for (key, record) in &mut self.stranded {
            if !seen.contains(key) {
                record.still = false;
            }
        }
    }

    /// `sql`, a count with one text parameter, by the harness; `None` if it failed.
    async fn count(&self, sql: &'static str, arg: &str) -> Option<i64> {
        tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar::<_, i64>(sql)
                .bind(arg)
                .fetch_one(&self.admin),
        )
        .await
        .ok()
        .and_then(Result::ok)
    }

    /// Enqueues pool hogs only slot `i` works: `(delay, hold)` each.
    async fn enqueue_hogs(&self, i: usize, hogs: &[(Duration, Duration)]) -> bool {
        let jobs = Jobs::new(self.admin.clone(), &LockNamespace::default());
        let batch: Vec<NewJob> = hogs
            .iter()
            .filter_map(|(delay, hold)| {
                let args = HogArgs {
                    hold_ms: hold.as_millis() as u64,
                };
                hog_job(&self.slots[i].id, args).map(|job| job.delay(*delay))
            })
            .collect();
        matches!(
            tokio::time::timeout(ADMIN_TIMEOUT, jobs.enqueue_many(batch)).await,
            Ok(Ok(_))
        )
    }

    // --- Frozen inside a transaction.

    async fn arm_freeze(&mut self, cron: bool) -> Option<String> {
        let (i, note) = if cron {
            self.eligible_scheduler_leader().await?
        } else {
            self.pick_node(true).await?
        };
        let flag = if cron {
            FREEZE_CRON_FLAG
        } else {
            FREEZE_JOB_FLAG
        };
        let id = self.slots[i].id.clone();
        if !self.set_flag(flag, &id, true).await {
            return None;
        }
        let hold = DOWN_AFTER + self.rng.secs(1.0, 8.0);
        let compound = !cron && self.rng.chance(0.5);
        self.freeze = Some(Freeze {
            slot: i,
            flag,
            cron,
            hold,
            compound,
            stage: FreezeStage::Armed {
                deadline: Instant::now() + Duration::from_secs(15),
            },
        });
        let what = if cron {
            "its next soak_tick transaction, after CronContext::complete"
        } else {
            "its next soak_tx_job transaction, after JobContext::complete"
        };
        Some(format!(
            "freeze inside a transaction on {id}{note}: {what}, stays open; SIGSTOP {id} while it does, for {:.1} s (down_after {} s), then SIGCONT{}",
            hold.as_secs_f64(),
            DOWN_AFTER.as_secs(),
            if compound {
                "; meanwhile another node runs a long job and is SIGKILLed once the frozen one is marked down (restarted after the thaw)"
            } else {
                ""
            }
        ))
    }

    async fn tend_freeze(&mut self) {
        let Some(freeze) = &self.freeze else {
            return;
        };
        let (i, flag, cron, hold, compound) = (
            freeze.slot,
            freeze.flag,
            freeze.cron,
            freeze.hold,
            freeze.compound,
        );
        let id = self.slots[i].id.clone();
        match freeze.stage {
            FreezeStage::Armed { deadline } => {
                if !matches!(self.slots[i].phase, Phase::Running { .. }) {
                    self.freeze = None;
                    self.disarm(flag, &id, "freeze", "the node stopped running")
                        .await;
                    return;
                }
                let holding = tokio::time::timeout(
                    ADMIN_TIMEOUT,
                    sqlx::query_as::<_, (i32, String)>(
                        "SELECT pid, application_name FROM pg_stat_activity
                          WHERE application_name LIKE $1 AND state = 'idle in transaction'
                            AND query LIKE '%soak_hold_marker%'
                          LIMIT 1",
                    )
                    .bind(format!("forge:%:{id}"))
                    .fetch_optional(&self.admin),
                )
                .await;
                if let Ok(Ok(Some((pid, app)))) = holding {
                    let until = Instant::now() + hold;
                    if let Err(err) = self.freeze_slot(i, until) {
                        self.freeze = None;
                        self.disarm(flag, &id, "freeze", &format!("SIGSTOP failed ({err})"))
                            .await;
                        return;
                    }
                    for _ in 0..10 {
                        if self.set_flag(flag, &id, false).await {
                            break;
                        }
                    }
                    self.note(format!(
                        "SIGSTOP {id} for {:.1} s while its {} transaction (backend {pid}, {app}) is open after complete",
                        hold.as_secs_f64(),
                        if cron { "tick" } else { "job" }
                    ));
                    // The compound variant: another node runs a long job now, so that it
                    // has one to be rescued when it is killed.
                    let mut victim = None;
                    if compound {
                        let candidates: Vec<usize> = (0..self.slots.len())
                            .filter(|j| *j != i && self.eligible(*j))
                            .collect();
                        if !candidates.is_empty() {
                            let j = candidates[self.rng.below(candidates.len())];
                            let hold = hold + Duration::from_secs(10);
                            if self.enqueue_hogs(j, &[(Duration::ZERO, hold)]).await {
                                victim = Some(j);
                                self.note(format!(
                                    "{} runs a {:.0} s job meanwhile (soak_hog_{})",
                                    self.slots[j].id,
                                    hold.as_secs_f64(),
                                    self.slots[j].id
                                ));
                            }
                        }
                    }
                    if let Some(freeze) = &mut self.freeze {
                        freeze.stage = FreezeStage::Frozen {
                            since: Instant::now(),
                            since_utc: Utc::now(),
                            until,
                            down_seen: false,
                            next_check: Instant::now(),
                            victim,
                        };
                    }
                } else if Instant::now() >= deadline {
                    self.freeze = None;
                    self.disarm(flag, &id, "freeze", "no transaction held open within 15 s")
                        .await;
                }
            }
            FreezeStage::Frozen {
                since,
                since_utc,
                until,
                down_seen,
                next_check,
                victim,
            } => {
                let now = Instant::now();
                if now >= until + Duration::from_secs(1) {
                    self.freeze = None;
                    return;
                }
                if down_seen || now < next_check {
                    return;
                }
                let down = tokio::time::timeout(
                    ADMIN_TIMEOUT,
                    sqlx::query_scalar::<_, Option<DateTime<Utc>>>(
                        "SELECT min(at) FROM forge.events
                          WHERE kind = 'node_down' AND node_id = $1 AND at >= $2",
                    )
                    .bind(&id)
                    .bind(since_utc)
                    .fetch_one(&self.admin),
                )
                .await;
                let Ok(Ok(Some(down_at))) = down else {
                    if let Some(Freeze {
                        stage: FreezeStage::Frozen { next_check, .. },
                        ..
                    }) = &mut self.freeze
                    {
                        *next_check = now + Duration::from_millis(500);
                    }
                    return;
                };
                if let Some(Freeze {
                    stage: FreezeStage::Frozen { down_seen, .. },
                    ..
                }) = &mut self.freeze
                {
                    *down_seen = true;
                }
                let after = (down_at - since_utc).num_milliseconds() as f64 / 1000.0;
                self.note(format!(
                    "{id} marked down {after:.1} s into its freeze (seen {:.1} s in)",
                    since.elapsed().as_secs_f64()
                ));
                let Some(victim) = victim.filter(|j| self.eligible(*j)) else {
                    return;
                };
                let running = self
                    .count(
                        "SELECT count(*) FROM forge.jobs WHERE state = 'running' AND node_id = $1",
                        &self.slots[victim].id,
                    )
                    .await
                    .unwrap_or(-1);
                let delay =
                    until.saturating_duration_since(Instant::now()) + Duration::from_secs(2);
                self.kill_slot(victim, delay).await;
                self.note(format!(
                    "SIGKILL {} ({running} jobs running on it) while {id} is frozen and marked down; restart in {:.1} s, after the thaw",
                    self.slots[victim].id,
                    delay.as_secs_f64()
                ));
            }
        }
    }

    // --- A table lock on forge.jobs.

    async fn lock_jobs_table(&mut self) -> Option<String> {
        let hold = self.rng.secs(18.0, 22.0);
        let started = Instant::now();
        let locked = tokio::time::timeout(ADMIN_TIMEOUT, async {
            let mut tx = self.admin.begin().await?;
            sqlx::query("LOCK TABLE forge.jobs IN ACCESS EXCLUSIVE MODE")
                .execute(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(tx)
        })
        .await;
        let tx = match locked {
            Ok(Ok(tx)) => tx,
            Ok(Err(err)) => {
                self.note(format!("LOCK TABLE forge.jobs failed: {err}"));
                return None;
            }
            Err(_) => {
                self.note("LOCK TABLE forge.jobs: no lock within 5 s");
                return None;
            }
        };
        let waited = started.elapsed().as_secs_f64();
        let now = Instant::now();
        self.stalls.push((now, None));
        self.table_lock = Some(TableLock {
            tx,
            since: now,
            until: now + hold,
        });
        Some(format!(
            "LOCK TABLE forge.jobs IN ACCESS EXCLUSIVE MODE (a migration's or an operator's) for {:.1} s (granted after {waited:.2} s)",
            hold.as_secs_f64()
        ))
    }

    async fn tend_table_lock(&mut self) {
        if self
            .table_lock
            .as_ref()
            .is_none_or(|l| Instant::now() < l.until)
        {
            return;
        }
        let Some(lock) = self.table_lock.take() else {
            return;
        };
        let held = lock.since.elapsed().as_secs_f64();
        let committed = tokio::time::timeout(ADMIN_TIMEOUT, lock.tx.commit()).await;
        self.end_stall();
        self.note(format!(
            "released the lock on forge.jobs after {held:.1} s{}",
            match committed {
                Ok(Ok(())) => String::new(),
                Ok(Err(err)) => format!(" (COMMIT failed: {err}; the connection ends it)"),
                Err(_) => " (COMMIT timed out; the connection ends it)".to_owned(),
            }
        ));
    }

    // --- A write stall: the standby made synchronous, its WAL receiver frozen.

    async fn start_write_stall(&mut self) -> Option<String> {
        if self.standby_build.is_some() || self.pending_failover.is_some() {
            return None;
        }
        let standby = self.standby.clone()?;
        let primary = self.primary.clone();
        if let Err(err) = primary
            .set_synchronous_standby(Some(&standby), Duration::from_secs(10))
            .await
        {
            self.note(format!("making the standby synchronous failed: {err}"));
            let _ = primary
                .set_synchronous_standby(None, Duration::from_secs(10))
                .await;
            return None;
        }
        // Jobs to claim while commits stall: the burst commits (the standby still answers),
        // the workers start claiming it, and the WAL receiver freezes meanwhile.
        let jobs = Jobs::new(self.admin.clone(), &LockNamespace::default());
        let burst: Vec<NewJob> = (0..BURST)
            .map(|_| NewJob::new(soak_burst_job, HogArgs { hold_ms: 100 }))
            .collect();
        let burst = matches!(
            tokio::time::timeout(ADMIN_TIMEOUT, jobs.enqueue_many(burst)).await,
            Ok(Ok(_))
        );
        let pid = match standby.pause_wal_receiver().await {
            Ok(pid) => pid,
            Err(err) => {
                self.note(format!("freezing the standby's WAL receiver failed: {err}"));
                let _ = primary
                    .set_synchronous_standby(None, Duration::from_secs(10))
                    .await;
                return None;
            }
        };
        let hold = STATEMENT_BOUND + self.rng.secs(1.0, 10.0);
        let now = Instant::now();
        self.stalls.push((now, None));
        self.write_stall = Some(WriteStall {
            standby,
            since: now,
            until: now + hold,
            resumed: false,
        });
        Some(format!(
            "write stall for {:.1} s (statement bound {} s): the standby is made synchronous, {} no-op jobs are enqueued and its WAL receiver (pid {pid}) SIGSTOPped while they are claimed; commits on the primary wait, reads do not",
            hold.as_secs_f64(),
            STATEMENT_BOUND.as_secs(),
            if burst { BURST } else { 0 }
        ))
    }

    async fn tend_write_stall(&mut self) {
        let Some(stall) = &self.write_stall else {
            return;
        };
        if Instant::now() < stall.until {
            return;
        }
        let standby = stall.standby.clone();
        let primary = self.primary.clone();
        if !stall.resumed {
            if let Err(err) = standby.resume_wal_receiver().await {
                self.note(format!(
                    "resuming the standby's WAL receiver failed ({err}); retrying"
                ));
                return;
            }
            if let Some(stall) = &mut self.write_stall {
                stall.resumed = true;
            }
            self.end_stall();
        }
        match primary
            .set_synchronous_standby(None, Duration::from_secs(10))
            .await
        {
            Ok(()) => {
                let took = self
                    .write_stall
                    .take()
                    .map_or(0.0, |s| s.since.elapsed().as_secs_f64());
                self.note(format!(
                    "write stall over after {took:.1} s: the WAL receiver runs again, the primary is asynchronous again"
                ));
            }
            Err(err) => self.note(format!(
                "making the primary asynchronous again failed ({err}); retrying"
            )),
        }
    }

    // --- Connections full while one node's node session is cut.

    async fn start_fill(&mut self) -> Option<String> {
        let (i, note) = self.pick_node(true).await?;
        let url = format!(
            "{}?application_name=forge-soak-filler",
            as_node_role(&self.primary.url_for(&self.db_name)).ok()?
        );
        let state = Arc::new(std::sync::Mutex::new(FillState::default()));
        let task = tokio::spawn(fill_connections(url, state.clone()));
        let hold = DOWN_AFTER + self.rng.secs(2.0, 5.0);
        self.fill = Some(ConnFill {
            slot: i,
            state,
            task,
            hold,
            stage: FillStage::Filling {
                deadline: Instant::now() + Duration::from_secs(20),
            },
        });
        Some(format!(
            "connections full: the harness opens connections as {NODE_ROLE} until max_connections ({MAX_CONNECTIONS}, less the superuser-reserved ones), then ends {}{note}'s node session; it cannot reconnect for {:.1} s (down_after {} s)",
            self.slots[i].id,
            hold.as_secs_f64(),
            DOWN_AFTER.as_secs()
        ))
    }

    /// Ends slot `i`'s node session; the filler then takes the freed slot.
    async fn cut_node_session(&self, i: usize) -> i64 {
        if let Some(fill) = &self.fill {
            fill.state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .spin_until = Some(Instant::now() + Duration::from_millis(1500));
        }
        self.count(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE application_name = $1",
            &format!("forge:node:{}", self.slots[i].id),
        )
        .await
        .unwrap_or(0)
    }

    async fn tend_fill(&mut self) {
        let Some(fill) = &self.fill else {
            return;
        };
        let i = fill.slot;
        let id = self.slots[i].id.clone();
        let now = Instant::now();
        let (held, refused, full, errors, last_error) = {
            let state = fill.state.lock().unwrap_or_else(|e| e.into_inner());
            (
                state.held,
                state.refused,
                state.full,
                state.errors,
                state.last_error.clone(),
            )
        };
        match fill.stage {
            FillStage::Filling { deadline } => {
                if full {
                    let hold = fill.hold;
                    // Work only this node does (its hog queue), due through the fault: its
                    // workers must go on claiming and running it without a node session.
                    let mut hogs = vec![(Duration::ZERO, Duration::from_secs(3))];
                    let mut at = Duration::from_millis(500);
                    while at < hold {
                        hogs.push((at, Duration::from_millis(300)));
                        at += Duration::from_secs(1);
                    }
                    let enqueued = self.enqueue_hogs(i, &hogs).await;
                    let cut = self.cut_node_session(i).await;
                    if let Some(fill) = &mut self.fill {
                        fill.stage = FillStage::Holding {
                            since: now,
                            since_us: Utc::now().timestamp_micros(),
                            until: now + hold,
                            next_check: now + Duration::from_millis(300),
                            terminations: 1,
                        };
                    }
                    self.note(format!(
                        "connections full ({held} held by the harness); {} jobs only {id} works enqueued (one now for 3 s, then one due every second); {id}'s node session ended ({cut} terminated)",
                        if enqueued { hogs.len() } else { 0 }
                    ));
                } else if now >= deadline {
                    self.stop_fill().await;
                    self.note(format!(
                        "connections full: the server was not full within 20 s ({held} held, {errors} errors: {last_error}); given up"
                    ));
                }
            }
            FillStage::Holding {
                since,
                since_us,
                until,
                next_check,
                terminations,
            } => {
                if now >= until {
                    self.stop_fill().await;
                    self.scan_current(i);
                    let now_us = Utc::now().timestamp_micros();
                    let within = |us: i64| us >= since_us && us <= now_us;
                    let started = self
                        .spans
                        .iter()
                        .filter(|s| s.slot == i && within(s.start_us))
                        .count();
                    let ended = self
                        .spans
                        .iter()
                        .filter(|s| s.slot == i && s.end_us.is_some_and(within))
                        .count();
                    let alive = matches!(self.slots[i].phase, Phase::Running { .. });
                    let ok = started + ended > 0;
                    let text = format!(
                        "{id} could not reconnect for {:.1} s ({held} connections held by the harness, {refused} connection attempts refused, its node session ended {terminations} time(s)): meanwhile its handlers started {started} and finished {ended} jobs; the process is {}",
                        since.elapsed().as_secs_f64(),
                        if alive { "running" } else { "NOT running" }
                    );
                    self.note(format!("connections freed. {text}"));
                    self.fill_reports.push((ok, text));
                } else if now >= next_check {
                    let back = self
                        .count(
                            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                            &format!("forge:node:{id}"),
                        )
                        .await
                        .unwrap_or(0);
                    let mut terminations = terminations;
                    if back > 0 && terminations < 20 {
                        let cut = self.cut_node_session(i).await;
                        terminations += 1;
                        self.note(format!(
                            "{id} got a connection slot back for its node session; ended again ({cut} terminated)"
                        ));
                    }
                    if let Some(fill) = &mut self.fill {
                        fill.stage = FillStage::Holding {
                            since,
                            since_us,
                            until,
                            next_check: now + Duration::from_millis(300),
                            terminations,
                        };
                    }
                }
            }
        }
    }

    /// Stops the filling task, which closes its connections.
    async fn stop_fill(&mut self) {
        if let Some(fill) = self.fill.take() {
            fill.state.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
            let _ = tokio::time::timeout(Duration::from_secs(10), fill.task).await;
        }
    }

    // --- Step-down storms.

    fn start_storm(&mut self) -> Option<String> {
        let running: Vec<usize> = (0..self.slots.len())
            .filter(|i| self.eligible(*i))
            .collect();
        if running.is_empty() {
            return None;
        }
        let alone = running.len() == self.slots.len() && self.rng.chance(0.5);
        let mut roles: Vec<Role> = Role::BUILTIN.to_vec();
        for i in (1..roles.len()).rev() {
            let j = self.rng.below(i + 1);
            roles.swap(i, j);
        }
        let mut plan = Vec::new();
        let mut offset = Duration::ZERO;
        for role in roles {
            for _ in 0..3 + self.rng.below(3) {
                plan.push((offset, role.clone(), alone && self.rng.chance(0.5)));
                offset += self.rng.secs(0.2, 2.0);
            }
        }
        let mut held = Vec::new();
        let mut text = if alone {
            let survivor = running[self.rng.below(running.len())];
            let now = Instant::now();
            for i in running.iter().copied().filter(|i| *i != survivor) {
                let phase =
                    std::mem::replace(&mut self.slots[i].phase, Phase::Dead { restart_at: now });
                if let Phase::Running { proc } = phase {
                    let _ = proc.terminate();
                    self.slots[i].phase = Phase::Terminating { proc, since: now };
                } else {
                    self.slots[i].phase = phase;
                }
                self.slots[i].hold_until = Some(now + Duration::from_secs(600));
                held.push(i);
            }
            let stopped: Vec<&str> = held.iter().map(|i| self.slots[*i].id.as_str()).collect();
            format!(
                "step-down storm with one eligible node: SIGTERM {} (kept down), then with only {} running: ",
                stopped.join(", "),
                self.slots[survivor].id
            )
        } else {
            "step-down storm with standbys waiting: ".to_owned()
        };
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for (_, role, _) in &plan {
            *counts.entry(role.name().to_owned()).or_default() += 1;
        }
        let counts: Vec<String> = counts.iter().map(|(r, n)| format!("{r} x{n}")).collect();
        let _ = write!(
            text,
            "{} forge.step_down requests ({}) over {:.1} s",
            plan.len(),
            counts.join(", "),
            offset.as_secs_f64()
        );
        self.storm = Some(Storm {
            alone,
            held,
            plan,
            queue: VecDeque::new(),
            started: false,
            wait_deadline: Instant::now() + Duration::from_secs(30),
            end_at: None,
        });
        Some(text)
    }

    async fn tend_storm(&mut self) {
        let Some(storm) = &mut self.storm else {
            return;
        };
        let now = Instant::now();
        if !storm.started {
            let held_down = storm
                .held
                .iter()
                .all(|i| matches!(self.slots[*i].phase, Phase::Dead { .. }));
            if !held_down && now < storm.wait_deadline {
                return;
            }
            storm.queue = storm
                .plan
                .iter()
                .map(|(offset, role, force)| (now + *offset, role.clone(), *force))
                .collect();
            storm.started = true;
        }
        let alone = storm.alone;
        while let Some((due, _, _)) = self.storm.as_ref().and_then(|s| s.queue.front()) {
            if *due > now {
                break;
            }
            let Some((_, role, force)) = self.storm.as_mut().and_then(|s| s.queue.pop_front())
            else {
                break;
            };
            let outcome = self.step_down(&role, force).await;
            self.note(format!(
                "step-down {}{}: {outcome}",
                role.name(),
                if force { " (force)" } else { "" }
            ));
            self.step_downs.push(StepDownRecord {
                at: self.secs(),
                role: role.name().to_owned(),
                alone,
                outcome,
            });
        }
        let Some(storm) = &mut self.storm else {
            return;
        };
        if storm.queue.is_empty() && storm.end_at.is_none() {
            storm.end_at = Some(now + Duration::from_secs(3));
        }
        if storm.end_at.is_some_and(|t| now >= t) {
            let held = std::mem::take(&mut storm.held);
            self.storm = None;
            for i in &held {
                self.slots[*i].hold_until = None;
            }
            self.note(if held.is_empty() {
                "step-down storm over".to_owned()
            } else {
                "step-down storm over; the stopped nodes start again".to_owned()
            });
        }
    }

    /// An operator's step-down request, through the path the admin API and the CLI use
    /// (`forge::inspect::Cluster::step_down`, the SQL function `forge.step_down`).
    ///
    /// `force`: a step-down with no standby waiting is refused unless forced (the storm asks
    /// with force half the time when one node is eligible).
    async fn step_down(&self, role: &Role, force: bool) -> String {
        let cluster = forge::inspect::Cluster::new(
            self.admin.clone(),
            LockNamespace::default(),
            Duration::from_millis(1500),
        );
        let asked = cluster.step_down(role, "forge-soak", force);
        match tokio::time::timeout(ADMIN_TIMEOUT, asked).await {
            Ok(Ok(StepDown::Asked {
                epoch, standbys, ..
            })) => format!("asked epoch {} ({standbys} standbys waiting)", epoch.0),
            Ok(Ok(StepDown::NoStandby { epoch, .. })) => {
                format!("refused: no standby waits (epoch {})", epoch.0)
            }
            Ok(Ok(StepDown::NoLeader)) => "no live leader".to_owned(),
            Ok(Err(err)) => format!("error: {err}"),
            Err(_) => "no answer within 5 s".to_owned(),
        }
    }
}

/// The connections-full fault's task: opens connections as the nodes' role until the server
/// refuses them (too many connections), keeps them, and keeps taking every slot that frees
/// (every few ms while `spin_until`, else every 50 ms) until told to stop.
async fn fill_connections(url: String, state: Arc<std::sync::Mutex<FillState>>) {
    let mut conns = Vec::new();
    loop {
        let (stop, spin) = {
            let state = state.lock().unwrap_or_else(|e| e.into_inner());
            (
                state.stop,
                state.spin_until.is_some_and(|t| Instant::now() < t),
            )
        };
        if stop {
            break;
        }
        let attempt =
            tokio::time::timeout(Duration::from_secs(2), sqlx::PgConnection::connect(&url)).await;
        {
            let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
            match attempt {
                Ok(Ok(conn)) => {
                    conns.push(conn);
                    state.held = conns.len();
                    continue;
                }
                Ok(Err(sqlx::Error::Database(err))) if err.code().as_deref() == Some("53300") => {
                    state.full = true;
                    state.refused += 1;
                }
                Ok(Err(err)) => {
                    state.errors += 1;
                    state.last_error = err.to_string();
                }
                Err(_) => {
                    state.errors += 1;
                    state.last_error = "connect timed out".to_owned();
                }
            }
        }
        tokio::time::sleep(if spin {
            Duration::from_millis(3)
        } else {
            Duration::from_millis(50)
        })
        .await;
    }
    for conn in conns {
        let _ = conn.close().await;
    }
    state.lock().unwrap_or_else(|e| e.into_inner()).held = 0;
}

/// The liveness figures of issue 22 that have a target, and one-line summaries of the others.
struct Liveness {
    stranded: usize,
    rescued_live: usize,
    info: Vec<String>,
}

/// A job that was running on a node when the node was marked down.
struct Rescue {
    node: String,
    down_at: f64,
    job: i64,
    attempt: i32,
    /// Seconds from the node_down event until the job left `running` (or until the analysis).
    latency: f64,
    /// What it became (`None`: still running at the analysis).
    next: Option<String>,
}

/// A time with no leader of a role.
struct Gap {
    role: String,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    ended_by: &'static str,
}

/// The `q` quantile of sorted `values` (nearest rank).
fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

impl Harness {
    /// Rescue latency, jobs without a handler, leaderless time, ticks skipped, step-downs,
    /// connections-full, jobs rescued from live nodes: printed into `out`.
    async fn liveness_report(
        &self,
        out: &mut String,
        default_cron: Option<&CronFigures>,
    ) -> Result<Liveness, BoxError> {
        let db = &self.admin;
        let mut info = Vec::new();

        // --- Rescue latency after node_down.
        let (downs, rescues) = self.rescues().await?;
        let mut latencies: Vec<f64> = rescues.iter().map(|r| r.latency).collect();
        latencies.sort_by(f64::total_cmp);
        let never = rescues.iter().filter(|r| r.next.is_none()).count();
        let (p50, p99, max) = (
            quantile(&latencies, 0.5),
            quantile(&latencies, 0.99),
            latencies.last().copied().unwrap_or(0.0),
        );
        let _ = writeln!(
            out,
            "\nrescue after a node is marked down (each node_down event of forge.events, each job the job history shows running on that node at that moment, until it left running):"
        );
        let _ = writeln!(
            out,
            "  {downs} node_down events, {} jobs running on the node then: p50 {p50:.2} s, p99 {p99:.2} s, max {max:.2} s; still running at the end: {never}",
            rescues.len()
        );
        let mut outcomes: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for r in &rescues {
            outcomes
                .entry(r.next.as_deref().unwrap_or("still running"))
                .or_default()
                .push(r.latency);
        }
        for (outcome, mut values) in outcomes {
            values.sort_by(f64::total_cmp);
            let _ = writeln!(
                out,
                "    {outcome}: {}, p50 {:.2} s, max {:.2} s",
                values.len(),
                quantile(&values, 0.5),
                values.last().copied().unwrap_or(0.0)
            );
        }
        let mut slowest: Vec<&Rescue> = rescues.iter().collect();
        slowest.sort_by(|a, b| b.latency.total_cmp(&a.latency));
        for r in slowest.iter().take(6) {
            let _ = writeln!(
                out,
                "    job {} attempt {} on {}, down at {:.1}s ({}): {:.2} s, then {}",
                r.job,
                r.attempt,
                r.node,
                r.down_at,
                self.fault_at(r.down_at),
                r.latency,
                r.next.as_deref().unwrap_or("STILL RUNNING")
            );
        }
        info.push(format!(
            "rescue latency after node_down: p50 {p50:.2} s, p99 {p99:.2} s, max {max:.2} s ({} jobs, {downs} node_down events)",
            rescues.len()
        ));

        // --- Jobs without a handler.
        let _ = writeln!(
            out,
            "\njobs running with no live handler of their attempt ({} samples every {} s, {} failed; handlers from the nodes' SOAK-HANDLER lines; stall time of the harness's own table lock and write stall not counted):",
            self.samples,
            SAMPLE_EVERY.as_secs(),
            self.sample_failures
        );
        let _ = writeln!(
            out,
            "  longest without a handler: {:.1} s; stranded (over {} s): {}",
            self.max_handlerless,
            STRANDED_AFTER.as_secs(),
            self.stranded.len()
        );
        for ((job, attempt), record) in self.stranded.iter().take(8) {
            let _ = writeln!(
                out,
                "    job {job} attempt {attempt} on {}: no handler from {:.1}s ({}) for {:.1} s{}",
                record.node,
                record.first_at,
                self.fault_at(record.first_at),
                record.age,
                if record.still {
                    ", still at the last sample"
                } else {
                    ""
                }
            );
        }

        // --- Leaderless time.
        let gaps = self.leaderless_gaps().await?;
        let _ = writeln!(
            out,
            "\nleaderless time per role (forge.events: a tenure ends at its release, its leader_lost report or its lease expiry, whichever is first; the next begins at leader_elected; a crashed leader's tenure counts from its lease expiry, so its gap is a lower bound):"
        );
        for role in Role::BUILTIN {
            let mine: Vec<f64> = gaps
                .iter()
                .filter(|g| g.role == role.name())
                .map(|g| (g.to - g.from).num_milliseconds() as f64 / 1000.0)
                .collect();
            // (+ 0.0: an empty sum of floats is -0.0)
            let sum: f64 = mine.iter().sum::<f64>() + 0.0;
            let max = mine.iter().copied().fold(0.0, f64::max);
            let long = mine.iter().filter(|g| **g >= 1.0).count();
            let _ = writeln!(
                out,
                "  {:<20} {} gaps, {long} of them >= 1 s; sum {sum:.1} s, max {max:.2} s",
                role.name(),
                mine.len()
            );
            info.push(format!(
                "leaderless {}: sum {sum:.1} s, max {max:.2} s",
                role.name()
            ));
        }
        let mut by_fault: BTreeMap<&str, (usize, f64, f64)> = BTreeMap::new();
        for g in &gaps {
            let from = self.secs_of(g.from);
            let kind = self
                .faults
                .iter()
                .rfind(|f| f.at <= from + 0.05)
                .map_or("before any fault", FaultRecord::label);
            let length = (g.to - g.from).num_milliseconds() as f64 / 1000.0;
            let entry = by_fault.entry(kind).or_default();
            entry.0 += 1;
            entry.1 += length;
            entry.2 = entry.2.max(length);
        }
        let _ = writeln!(out, "  by the last fault before the gap:");
        for (kind, (n, sum, max)) in &by_fault {
            let _ = writeln!(
                out,
                "    {kind:<40} {n:>3} gaps, sum {sum:>6.1} s, max {max:.2} s"
            );
        }
        let _ = writeln!(out, "  the longest:");
        let mut longest: Vec<&Gap> = gaps.iter().collect();
        longest.sort_by_key(|g| std::cmp::Reverse(g.to - g.from));
        for g in longest.iter().take(6) {
            let from = self.secs_of(g.from);
            let _ = writeln!(
                out,
                "    {}: {:.2} s from {from:.1}s (previous tenure {}; {})",
                g.role,
                (g.to - g.from).num_milliseconds() as f64 / 1000.0,
                g.ended_by,
                self.fault_at(from)
            );
        }

        // --- Ticks skipped.
        let skipped_main: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM forge.cron_ticks WHERE cron = $1 AND state = 'skipped'",
        )
        .bind(CRON)
        .fetch_one(db)
        .await?;
        info.push(format!(
            "ticks recorded skipped: {CRON} {skipped_main}, {DEFAULT_CRON} {}",
            default_cron.map_or(0, CronFigures::skipped)
        ));

        // --- Step-downs.
        if !self.step_downs.is_empty() {
            let mut outcomes: BTreeMap<(bool, String), usize> = BTreeMap::new();
            for record in &self.step_downs {
                let kind = record
                    .outcome
                    .split(':')
                    .next()
                    .unwrap_or_default()
                    .split(" epoch")
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                *outcomes.entry((record.alone, kind)).or_default() += 1;
            }
            let _ = writeln!(
                out,
                "\nstep-down requests (forge::inspect::Cluster::step_down): {}",
                self.step_downs.len()
            );
            for ((alone, kind), n) in &outcomes {
                let _ = writeln!(
                    out,
                    "  {}: {kind}: {n}",
                    if *alone {
                        "one eligible node"
                    } else {
                        "standbys waiting"
                    }
                );
            }
            for record in self
                .step_downs
                .iter()
                .filter(|r| r.outcome.starts_with("refused"))
                .take(3)
            {
                let _ = writeln!(
                    out,
                    "    {:.1}s {}: {}",
                    record.at, record.role, record.outcome
                );
            }
        }

        // --- Connections full.
        if !self.fill_reports.is_empty() {
            let _ = writeln!(out, "\nconnections full:");
            for (ok, text) in &self.fill_reports {
                let _ = writeln!(out, "  {} {text}", if *ok { "ok:" } else { "NOT OK:" });
            }
        }

        // --- Jobs rescued while their handler ran.
        let rescued: Vec<(i64, i32, String, DateTime<Utc>, String)> = sqlx::query_as(
            "SELECT j.id, (e->>'attempt')::int, coalesce(e->>'node', ''), (e->>'at')::timestamptz,
                    left(coalesce(e->>'error', ''), 160)
               FROM forge.jobs j, jsonb_array_elements(j.errors) e
              WHERE e->>'reason' = 'rescued'",
        )
        .fetch_all(db)
        .await?;
        let within = |spans: &[(usize, i64, i64)], slot: usize, us: i64| {
            spans
                .iter()
                .any(|(s, from, to)| *s == slot && *from <= us && us <= *to)
        };
        let mut live = Vec::new();
        let (mut frozen, mut cut_off) = (0, 0);
        // By who rescued and why, and where the attempt's handler was at that instant.
        let mut kinds: BTreeMap<&str, [usize; 4]> = BTreeMap::new();
        for (job, attempt, node, at, error) in &rescued {
            let us = at.timestamp_micros();
            let Some(slot) = self.slots.iter().position(|s| s.id == *node) else {
                continue;
            };
            let span = self
                .spans
                .iter()
                .filter(|h| h.slot == slot && h.job == *job && h.attempt == *attempt)
                .find(|h| h.start_us <= us);
            let running = span.is_some_and(|h| h.end_us.is_none_or(|end| us < end));
            let kind = if error.contains("restarted during the attempt") {
                "by the node's next run (restarted during the attempt)"
            } else if error.starts_with("orphaned") {
                "by its own worker's reconciliation (orphaned)"
            } else if error.contains(" is down") {
                "by the scheduler leader (node down)"
            } else if error.contains("stopped without finishing") {
                "by the scheduler leader (node stopped)"
            } else {
                "otherwise"
            };
            let entry = kinds.entry(kind).or_default();
            entry[match span {
                _ if running => 0,
                Some(h) if !h.died => 1,
                Some(_) => 2,
                None => 3,
            }] += 1;
            if !running {
                continue;
            }
            if within(&self.pauses, slot, us) {
                frozen += 1;
            } else if within(&self.blackholes, slot, us) {
                cut_off += 1;
            } else {
                live.push((
                    *job,
                    *attempt,
                    node.clone(),
                    self.secs_of(*at),
                    error.clone(),
                ));
            }
        }
        let _ = writeln!(
            out,
            "\njobs rescued while their handler was running ({} rescues in all): {} on a SIGSTOPped node, {} on a black-holed node (both by design), {} on a live node",
            rescued.len(),
            frozen,
            cut_off,
            live.len()
        );
        for (kind, [running, finished, died, none]) in &kinds {
            let _ = writeln!(
                out,
                "  rescued {kind}: {} (handler then running {running}, already returned {finished}, gone with its process {died}, never started {none})",
                running + finished + died + none
            );
        }
        for (job, attempt, node, at, error) in live.iter().take(6) {
            let _ = writeln!(
                out,
                "    job {job} attempt {attempt} on {node} at {at:.1}s ({}): {error}",
                self.fault_at(*at)
            );
        }
        Ok(Liveness {
            stranded: self.stranded.len(),
            rescued_live: live.len(),
            info,
        })
    }

    /// The number of node_down events, and the jobs running on each down node at that moment.
    async fn rescues(&self) -> Result<(usize, Vec<Rescue>), BoxError> {
        // (job, state, attempt, node, at)
        type Move = (i64, String, i32, Option<String>, DateTime<Utc>);
        let moves: Vec<Move> = sqlx::query_as(
            "SELECT job_id, state, attempt, node, at FROM soak_job_moves ORDER BY job_id, id",
        )
        .fetch_all(&self.admin)
        .await?;
        let downs: Vec<(String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT node_id, at FROM forge.events WHERE kind = 'node_down' ORDER BY at",
        )
        .fetch_all(&self.admin)
        .await?;
        // Who rescued an attempt: its node's next run, or the scheduler leader.
        let by_restart: HashSet<(i64, i32)> = sqlx::query_as::<_, (i64, i32)>(
            "SELECT j.id, (e->>'attempt')::int FROM forge.jobs j, jsonb_array_elements(j.errors) e
              WHERE e->>'reason' = 'rescued' AND e->>'error' LIKE '%restarted during the attempt%'",
        )
        .fetch_all(&self.admin)
        .await?
        .into_iter()
        .collect();
        // Running intervals by node: (job, attempt, from, then (at, state)).
        type Interval = (i64, i32, DateTime<Utc>, Option<(DateTime<Utc>, String)>);
        let mut by_node: HashMap<String, Vec<Interval>> = HashMap::new();
        for (k, (job, state, attempt, node, at)) in moves.iter().enumerate() {
            if state != "running" {
                continue;
            }
            // A completion is the attempt's own (outcomes are guarded by node and attempt): the
            // job was not rescued. A rescue makes it available (or dead, or cancelled).
            let next = moves.get(k + 1).filter(|m| m.0 == *job).map(|m| {
                let what = match m.1.as_str() {
                    "completed" | "deleted" => "completed by its own attempt (not rescued)",
                    "available" | "dead" | "cancelled"
                        if by_restart.contains(&(*job, *attempt)) =>
                    {
                        "rescued by its node's next run"
                    }
                    "available" | "dead" | "cancelled" => "rescued by the scheduler leader",
                    _ => "left running otherwise",
                };
                (m.4, what.to_owned())
            });
            by_node
                .entry(node.clone().unwrap_or_default())
                .or_default()
                .push((*job, *attempt, *at, next));
        }
        let now = Utc::now();
        let end = self.stop_began.unwrap_or(now);
        let mut rescues = Vec::new();
        let mut counted = 0;
        for (node, down_at) in &downs {
            if *down_at > end {
                continue;
            }
            counted += 1;
            for (job, attempt, from, next) in by_node.get(node).map_or(&[][..], Vec::as_slice) {
                if *from > *down_at || next.as_ref().is_some_and(|(t, _)| *t <= *down_at) {
                    continue;
                }
                let left = next.as_ref().map_or(now, |(t, _)| *t);
                rescues.push(Rescue {
                    node: node.clone(),
                    down_at: self.secs_of(*down_at),
                    job: *job,
                    attempt: *attempt,
                    latency: (left - *down_at).num_milliseconds() as f64 / 1000.0,
                    next: next.as_ref().map(|(_, state)| state.clone()),
                });
            }
        }
        Ok((counted, rescues))
    }

    /// Every time a role had no leader, from the events history, up to the final SIGTERM.
    async fn leaderless_gaps(&self) -> Result<Vec<Gap>, BoxError> {
        type Elected = (
            String,
            DateTime<Utc>,
            Option<i64>,
            Option<DateTime<Utc>>,
            Option<DateTime<Utc>>,
            Option<DateTime<Utc>>,
        );
        let elected: Vec<Elected> = sqlx::query_as(
            "SELECT e.role, e.at, (e.detail->>'previous_epoch')::bigint,
                    (e.detail->>'previous_released_at')::timestamptz,
                    (e.detail->>'previous_lease_until')::timestamptz,
                    (SELECT min(l.at) FROM forge.events l
                      WHERE l.kind = 'leader_lost' AND l.role = e.role
                        AND l.epoch = (e.detail->>'previous_epoch')::bigint AND l.at <= e.at)
               FROM forge.events e
              WHERE e.kind = 'leader_elected' AND e.role IS NOT NULL
              ORDER BY e.role, e.at, e.id",
        )
        .fetch_all(&self.admin)
        .await?;
        let end = self.stop_began.unwrap_or_else(Utc::now);
        let mut gaps = Vec::new();
        for (role, at, previous, released, lease_until, lost) in &elected {
            if previous.is_none() || *at > end {
                continue;
            }
            let candidates = [
                (*released, "released"),
                (*lost, "lost (leader_lost)"),
                (*lease_until, "lease expired"),
            ];
            let Some((from, ended_by)) = candidates
                .iter()
                .filter_map(|(t, why)| t.map(|t| (t, *why)))
                .min_by_key(|(t, _)| *t)
            else {
                continue;
            };
            if from < *at {
                gaps.push(Gap {
                    role: role.clone(),
                    from,
                    to: *at,
                    ended_by,
                });
            }
        }
        // A role whose last tenure ended before the final SIGTERM with no successor.
        let last: Vec<(String, DateTime<Utc>)> = sqlx::query_as(
            "WITH last AS (SELECT DISTINCT ON (role) role, epoch, at FROM forge.events
                            WHERE kind = 'leader_elected' AND role IS NOT NULL
                            ORDER BY role, at DESC, id DESC)
             SELECT l.role, min(x.at) FROM last l
               JOIN forge.events x ON x.role = l.role AND x.epoch = l.epoch
                                  AND x.kind IN ('leader_released', 'leader_lost') AND x.at >= l.at
              GROUP BY 1",
        )
        .fetch_all(&self.admin)
        .await?;
        for (role, from) in last {
            if from < end {
                gaps.push(Gap {
                    role,
                    from,
                    to: end,
                    ended_by: "ended with no successor before the final stop",
                });
            }
        }
        Ok(gaps)
    }
}

/// What the ledger and the effects say about one cron's ticks from its first effect to the
/// cut-off.
#[derive(Clone)]
struct CronFigures {
    first: DateTime<Utc>,
    expected: i64,
    present: i64,
    missing: i64,
    duplicated: i64,
    extra_rows: i64,
    off_grid: i64,
    missing_by_state: Vec<(String, i64, DateTime<Utc>, String)>,
    ledger: Vec<(String, i64, i64)>,
    succeeded_without_effect: i64,
    effect_without_success: i64,
    reruns: i64,
    duplicate_examples: Vec<(DateTime<Utc>, String)>,
}

impl CronFigures {
    /// The cron's section of the summary.
    fn write(&self, out: &mut String, cron: &str, what: &str, cutoff: DateTime<Utc>) {
        let _ = writeln!(
            out,
            "\ncron {cron} (\"* * * * * *\", catch_up = all, {what}), ticks {} .. {} (cut-off):",
            self.first.format("%H:%M:%S"),
            cutoff.format("%H:%M:%S")
        );
        let _ = writeln!(
            out,
            "  ticks expected (every second)           {}",
            self.expected
        );
        let _ = writeln!(
            out,
            "  ticks with an effect                    {}",
            self.present
        );
        let _ = writeln!(
            out,
            "  missing ticks (no effect)               {}",
            self.missing
        );
        for (state, count, from, error) in &self.missing_by_state {
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
            "  duplicate effects (ticks with >1 row)   {} ({} extra rows)",
            self.duplicated, self.extra_rows
        );
        for (at, rows) in &self.duplicate_examples {
            let _ = writeln!(out, "    {}: {rows}", at.format("%H:%M:%S"));
        }
        let _ = writeln!(
            out,
            "  effects off the per-second grid         {}",
            self.off_grid
        );
        let _ = writeln!(
            out,
            "  ledger succeeded without an effect      {}",
            self.succeeded_without_effect
        );
        let _ = writeln!(
            out,
            "  effect without a succeeded ledger row   {}",
            self.effect_without_success
        );
        let ledger_text: Vec<String> = self
            .ledger
            .iter()
            .map(|(state, n, reruns)| format!("{state} {n} (attempt > 1: {reruns})"))
            .collect();
        let _ = writeln!(out, "  ledger states: {}", ledger_text.join(", "));
        let not_succeeded: i64 = self
            .ledger
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
            "  reruns (effect rows with attempt > 1)   {}",
            self.reruns
        );
    }

    /// Ticks the ledger recorded as `skipped`.
    fn skipped(&self) -> i64 {
        self.ledger
            .iter()
            .filter(|(state, _, _)| state == "skipped")
            .map(|(_, n, _)| n)
            .sum()
    }
}

/// The figures of cron `cron`; `None` if it never wrote an effect.
async fn cron_figures(
    db: &PgPool,
    cron: &str,
    cutoff: DateTime<Utc>,
) -> Result<Option<CronFigures>, BoxError> {
    let first: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT min(scheduled_at) FROM soak_cron_effects WHERE cron = $1")
            .bind(cron)
            .fetch_one(db)
            .await?;
    let Some(first) = first else {
        return Ok(None);
    };

    let (expected, present, missing, duplicated, extra_rows): (i64, i64, i64, i64, i64) =
            sqlx::query_as(
                "WITH expected AS (
                     SELECT generate_series($1::timestamptz, $2::timestamptz, interval '1 second') AS s),
                 eff AS (SELECT scheduled_at, count(*) AS n FROM soak_cron_effects
                          WHERE cron = $3 GROUP BY 1)
                 SELECT count(*),
                        count(*) FILTER (WHERE eff.n IS NOT NULL),
                        count(*) FILTER (WHERE eff.n IS NULL),
                        count(*) FILTER (WHERE eff.n > 1),
                        coalesce(sum(eff.n - 1) FILTER (WHERE eff.n > 1), 0)::bigint
                   FROM expected LEFT JOIN eff ON eff.scheduled_at = expected.s",
            )
            .bind(first)
            .bind(cutoff)
            .bind(cron)
            .fetch_one(db)
            .await?;
    let off_grid: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM soak_cron_effects
              WHERE cron = $2 AND scheduled_at <= $1 AND date_trunc('second', scheduled_at) <> scheduled_at",
        )
        .bind(cutoff)
        .bind(cron)
        .fetch_one(db)
        .await?;
    let missing_by_state: Vec<(String, i64, DateTime<Utc>, String)> = sqlx::query_as(
            "WITH expected AS (
                 SELECT generate_series($1::timestamptz, $2::timestamptz, interval '1 second') AS s)
             SELECT coalesce(t.state, 'no ledger row'), count(*), min(x.s), coalesce(max(t.error), '')
               FROM expected x
               LEFT JOIN forge.cron_ticks t ON t.cron = $3 AND t.scheduled_at = x.s
              WHERE NOT EXISTS (SELECT 1 FROM soak_cron_effects e
                                 WHERE e.cron = $3 AND e.scheduled_at = x.s)
              GROUP BY 1 ORDER BY 1",
        )
        .bind(first)
        .bind(cutoff)
        .bind(cron)
        .fetch_all(db)
        .await?;
    let ledger: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT state, count(*), count(*) FILTER (WHERE attempt > 1) FROM forge.cron_ticks
              WHERE cron = $1 AND scheduled_at BETWEEN $2 AND $3 GROUP BY 1 ORDER BY 1",
    )
    .bind(cron)
    .bind(first)
    .bind(cutoff)
    .fetch_all(db)
    .await?;
    let (succeeded_without_effect, effect_without_success): (i64, i64) = sqlx::query_as(
        "SELECT
               (SELECT count(*) FROM forge.cron_ticks t
                 WHERE t.cron = $1 AND t.scheduled_at BETWEEN $2 AND $3 AND t.state = 'succeeded'
                   AND NOT EXISTS (SELECT 1 FROM soak_cron_effects e
                                    WHERE e.cron = $1 AND e.scheduled_at = t.scheduled_at)),
               (SELECT count(DISTINCT e.scheduled_at) FROM soak_cron_effects e
                 WHERE e.cron = $1 AND e.scheduled_at BETWEEN $2 AND $3
                   AND NOT EXISTS (SELECT 1 FROM forge.cron_ticks t
                                    WHERE t.cron = $1 AND t.scheduled_at = e.scheduled_at
                                      AND t.state = 'succeeded'))",
    )
    .bind(cron)
    .bind(first)
    .bind(cutoff)
    .fetch_one(db)
    .await?;
    let cron_reruns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM soak_cron_effects
              WHERE cron = $2 AND scheduled_at <= $1 AND attempt > 1",
    )
    .bind(cutoff)
    .bind(cron)
    .fetch_one(db)
    .await?;
    let duplicate_examples: Vec<(DateTime<Utc>, String)> = sqlx::query_as(
            "SELECT scheduled_at, string_agg(format('attempt %s on %s epoch %s at %s', attempt, node, epoch,
                                                   to_char(at, 'HH24:MI:SS.MS')), '; ' ORDER BY id)
               FROM soak_cron_effects WHERE cron = $2 AND scheduled_at <= $1
              GROUP BY 1 HAVING count(*) > 1 ORDER BY 1 LIMIT 5",
        )
        .bind(cutoff)
        .bind(cron)
        .fetch_all(db)
        .await?;

    Ok(Some(CronFigures {
        first,
        expected,
        present,
        missing,
        duplicated,
        extra_rows,
        off_grid,
        missing_by_state,
        ledger,
        succeeded_without_effect,
        effect_without_success,
        reruns: cron_reruns,
        duplicate_examples,
    }))
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
