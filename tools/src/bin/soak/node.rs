//! Node mode: the user-style binary (`soak node <forge.toml>`), its crons, jobs and leader
//! work.

use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge::jobs::{Jobs, NewJob};
use forge::{Config, CronContext, CronError, JobContext, JobError, Leadership, Node, Role};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::{
    CRON, DEFAULT_CRON, DOWN_AFTER, FREEZE_CRON_FLAG, FREEZE_JOB_FLAG, HOLD_CRON_TX, HOLD_JOB_TX,
    LEASE, POOL_SIZE, SKEW_ENV, WORK,
};

/// The arguments of the jobs a tick enqueues: the tick's instant.
#[derive(Serialize, Deserialize)]
struct TickArgs {
    tick_us: i64,
}

/// The arguments of a pool hog: how long to hold the connection.
#[derive(Serialize, Deserialize)]
pub(crate) struct HogArgs {
    pub(crate) hold_ms: u64,
}

/// One node process: runs until SIGTERM, or until the harness is gone.
pub(crate) async fn node_main(config_path: String) -> ExitCode {
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
        .job(soak_limited_job)
        .job(soak_rated_job)
        .job(soak_big_job)
        .job(soak_flow_job)
        .job(soak_stored_job)
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
    // The limited queue's job (300 ms, at most 2 at once in the cluster: one a tick fits), and
    // the rated queue's (4 a tick under a rate of 5 a second: the rate holds back the bursts
    // of ticks caught up after a failover).
    jobs.enqueue_in(&mut *tx, soak_limited_job, TickArgs { tick_us })
        .await?;
    jobs.enqueue_many_in(
        &mut *tx,
        (0..4).map(|_| NewJob::new(soak_rated_job, TickArgs { tick_us })),
    )
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

/// The node's true time: its wall clock less the skew the harness started it with
/// (`SOAK_CLOCK_SKEW_US`, set with libfaketime's `FAKETIME`), so that the times the handlers
/// record in `soak_runs` are true whatever the clock faults do (the database's clock steps do
/// not reach the nodes).
fn true_now() -> DateTime<Utc> {
    static SKEW_US: OnceLock<i64> = OnceLock::new();
    let skew = *SKEW_US.get_or_init(|| {
        std::env::var(SKEW_ENV)
            .ok()
            .and_then(|us| us.parse().ok())
            .unwrap_or(0)
    });
    Utc::now() - chrono::Duration::microseconds(skew)
}

/// An attempt whose run the ledger judges (`what`: the queue `limited` or `rated`, or a
/// workflow's step): its start row (its own attempt, written by the handler), then `work`,
/// then its end row written in the transaction that completes the job (`ctx.complete`), so the
/// end lands exactly when the slot is given back, and never for an attempt that was rescued
/// meanwhile (its end is then the rescue's instant).
async fn recorded_run(ctx: &JobContext, what: &str, work: Duration) -> Result<(), JobError> {
    let _mark = HandlerMark::start(ctx);
    sqlx::query(
        "INSERT INTO soak_runs (job_id, attempt, what, node, started_at)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
    )
    .bind(ctx.id().0)
    .bind(ctx.attempt() as i32)
    .bind(what)
    .bind(ctx.node_id().to_string())
    .bind(true_now())
    .execute(ctx.pool())
    .await?;
    tokio::time::sleep(work).await;
    let mut tx = ctx.pool().begin().await?;
    sqlx::query("UPDATE soak_runs SET finished_at = $3 WHERE job_id = $1 AND attempt = $2")
        .bind(ctx.id().0)
        .bind(ctx.attempt() as i32)
        .bind(true_now())
        .execute(&mut *tx)
        .await?;
    ctx.complete(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// A job of the queue `limited` (global_concurrency = 2): 300 ms.
#[forge::job(name = "soak_limited_job", queue = "limited", max_attempts = 100)]
async fn soak_limited_job(ctx: JobContext, _args: TickArgs) -> Result<(), JobError> {
    recorded_run(&ctx, "limited", Duration::from_millis(300)).await
}

/// A job of the queue `rated` (rate = "5/1s"): no work.
#[forge::job(name = "soak_rated_job", queue = "rated", max_attempts = 100)]
async fn soak_rated_job(ctx: JobContext, _args: TickArgs) -> Result<(), JobError> {
    recorded_run(&ctx, "rated", Duration::ZERO).await
}

/// The arguments of a workflow's step: the workflow's number.
#[derive(Serialize, Deserialize)]
pub(crate) struct FlowArgs {
    pub(crate) flow: i64,
}

/// A step of a workflow the harness enqueues (a root, children after it, a join after them):
/// 200 ms, its start and its end recorded as the limited queue's are. Its end is its effect: a
/// step whose end row landed twice (two attempts' completions) would be a duplicate.
#[forge::job(name = "soak_flow_job", max_attempts = 100)]
pub(crate) async fn soak_flow_job(ctx: JobContext, _args: FlowArgs) -> Result<(), JobError> {
    recorded_run(&ctx, "flow", Duration::from_millis(200)).await
}

/// The arguments of the stored cron's job: which version of the stored cron enqueued it.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredArgs {
    pub(crate) version: i64,
}

/// The job the stored cron `soak_stored` enqueues at each tick: a no-op (the ledger counts the
/// jobs each tick enqueued, from the database).
#[forge::job(name = "soak_stored_job", max_attempts = 100)]
async fn soak_stored_job(ctx: JobContext, _args: StoredArgs) -> Result<(), JobError> {
    let _mark = HandlerMark::start(&ctx);
    Ok(())
}

/// A no-op job of 100 ms, enqueued by the harness in a burst just before a write stall, so that
/// workers claim while commits stall: a claim whose commit waits past the statement bound is
/// dropped by its worker, and commits (invisibly until the stall ends) after the worker's
/// reconciliation looked (issue 22, item 4).
#[forge::job(name = "soak_burst_job", max_attempts = 100)]
pub(crate) async fn soak_burst_job(ctx: JobContext, _args: HogArgs) -> Result<(), JobError> {
    let _mark = HandlerMark::start(&ctx);
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

/// The arguments of a job whose claim's answer is large: a payload of this many bytes.
#[derive(Serialize, Deserialize)]
pub(crate) struct BigArgs {
    pub(crate) payload: String,
}

/// A no-op of 100 ms with a large payload, enqueued by the harness in a batch so that a claim's
/// answer exceeds the socket buffers: the harness freezes a node while such an answer is on its
/// way (issue 31, item 5).
#[forge::job(name = "soak_big_job", max_attempts = 100)]
pub(crate) async fn soak_big_job(ctx: JobContext, args: BigArgs) -> Result<(), JobError> {
    let _mark = HandlerMark::start(&ctx);
    std::hint::black_box(args.payload.len());
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
pub(crate) fn hog_job(node: &str, args: HogArgs) -> Option<NewJob> {
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
pub(crate) fn node_config(url: &str, id: &str) -> String {
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
queues = ["default", "hog_{id}", "limited", "rated"]

[jobs]
maintenance_interval = "5s"
drain_timeout = "2s"

[jobs.queues]
default = 8
hog_{id} = {hogs}

[jobs.queues.limited]
concurrency = 2
global_concurrency = 2

[jobs.queues.rated]
concurrency = 2
rate = "5/1s"
"#,
        lease = LEASE.as_secs(),
        down = DOWN_AFTER.as_secs(),
        hogs = POOL_SIZE + 3,
    )
}
