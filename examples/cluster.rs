//! The FORGE demo: three node processes share one PostgreSQL, spread the three roles across
//! themselves (one each), run a per-second cron and work a job queue; jobs are drained across
//! the nodes (one fails, retries and is dead-lettered);
//! the Scheduler leader is SIGKILLed, then the next one is stopped gracefully; the takeover
//! gaps are measured and the cron's tick ledger is printed around both: no duplicate, no gap.
//!
//! ```text
//! cargo run --example cluster             # the demo, then everything stops
//! cargo run --example cluster -- --keep   # then the cluster and its dashboard stay up
//! ```
//!
//! A fourth node, `web`, leads no role and works no queue: it serves the admin API and the
//! dashboard on a free port of 127.0.0.1 (`[admin] listen`), and the demo prints its URL. With
//! `--keep` the surviving nodes go on (the per-second cron ticks, a few jobs a second are
//! enqueued, some fail) until ctrl-c, for a look at the dashboard.
//!
//! With `DATABASE_URL` unset it starts a throwaway PostgreSQL (initdb/pg_ctl in a temporary
//! directory, on a free port, removed afterwards); with `DATABASE_URL` set it creates a fresh
//! database there and drops it at the end. The node processes are this same binary started
//! with `--node <id>`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use forge::jobs::NewJob;
use forge::{Config, CronContext, JobContext, JobError, Leadership, Node, Role};
use forge_testkit::{NodeProcess, PgServer};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgListener;
use tokio::process::Command;
use tokio::time::Instant;

const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("--node") => run_node().await,
        _ => run_demo(args.iter().any(|a| a == "--keep")).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One node process: leads whatever roles it wins until SIGTERM.
async fn run_node() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let mut config = Config::from_env()?;
    // The dashboard's charts get a point every 5 s instead of every minute.
    config.metrics.rollup_interval = Duration::from_secs(5);
    // Placement moves at most one role per heartbeat interval: every second here, so the
    // three roles spread across the three nodes within seconds (at the default, 5 s a move).
    config.cluster.membership.heartbeat_interval = Duration::from_secs(1);
    if std::env::var_os("FORGE_DEMO_WEB").is_some() {
        // The web node: serves the admin API and the dashboard, works no queue.
        config.node.queues = Some(vec![]);
    }
    // The #[cron] and #[job] below are registered automatically.
    let mut builder = Node::builder(config);
    for role in Role::BUILTIN {
        builder = builder.leader_task(role, "demo", lead);
    }
    let node = builder.start().await?;
    println!("ready");
    if let Some(url) = node.admin_url() {
        println!("admin {url}");
    }
    node.run_until_signal().await?;
    Ok(())
}

/// The demo cron: the ledger row the runtime writes for each tick is the point; the handler
/// itself only says where it ran.
#[forge::cron("* * * * * *", name = "every_second", catch_up = "all")]
async fn tick(ctx: CronContext) {
    println!(
        "tick {} on epoch {} (attempt {})",
        ctx.scheduled_at().format("%H:%M:%S"),
        ctx.epoch(),
        ctx.attempt()
    );
}

/// The demo job's arguments.
#[derive(Serialize, Deserialize)]
struct Thumbnail {
    image: u32,
}

/// The demo job: "renders a thumbnail" for 100 ms; image 13 is corrupt and fails every
/// attempt, so it is retried with backoff and then dead-lettered.
#[forge::job(max_attempts = 3, backoff = "exponential", backoff_base = "100ms")]
async fn thumbnail(ctx: JobContext, args: Thumbnail) -> Result<(), JobError> {
    if args.image == 13 {
        return Err(JobError::retry(format!(
            "image 13 is corrupt (attempt {} of {})",
            ctx.attempt(),
            ctx.max_attempts()
        )));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

/// The demo's leader-only work: nothing but staying until told to stop.
async fn lead(leadership: Leadership) {
    leadership.stopping().await;
}

/// A leadership change as announced on `forge_leader`, with when this process heard it.
struct Heard {
    role: String,
    epoch: i64,
    node: Option<String>,
    event: String,
    at: Instant,
}

async fn run_demo(keep: bool) -> Result<(), BoxError> {
    println!("FORGE demo: three nodes, one PostgreSQL, leader roles on advisory locks\n");
    let server = PgServer::shared().map_err(|err| {
        format!("{err}\n(the demo needs PostgreSQL's server binaries, or DATABASE_URL pointing at a server where it may CREATE DATABASE)")
    })?;
    let db = server.create_database().await?;
    if server.is_external() {
        println!("PostgreSQL: DATABASE_URL, fresh database {}", db.name());
    } else {
        println!(
            "PostgreSQL: throwaway cluster on 127.0.0.1:{} (removed at exit)",
            server.port()
        );
    }

    let mut listener = PgListener::connect(db.url()).await?;
    listener.listen("forge_leader").await?;

    let exe = std::env::current_exe()?;
    let mut nodes: BTreeMap<String, NodeProcess> = BTreeMap::new();
    for id in NODES {
        let mut command = Command::new(&exe);
        command
            .arg("--node")
            .env("DATABASE_URL", db.url())
            .env("FORGE_NODE_ID", id)
            .env_remove("FORGE_ROLES")
            .env_remove("FORGE_METRICS_LISTEN");
        let mut process = NodeProcess::spawn(command)?.named(id);
        process
            .wait_for_line("ready", Duration::from_secs(30), |l| l == "ready")
            .await?;
        nodes.insert(id.to_owned(), process);
    }
    println!("started {} node processes", nodes.len());

    // The web node: no role, no queue; the admin API and the dashboard on a free port.
    let token = random_token()?;
    let mut command = Command::new(&exe);
    command
        .arg("--node")
        .env("DATABASE_URL", db.url())
        .env("FORGE_NODE_ID", "web")
        .env("FORGE_ROLES", "")
        .env("FORGE_DEMO_WEB", "1")
        .env("FORGE_ADMIN_LISTEN", "127.0.0.1:0")
        .env("FORGE_ADMIN_TOKEN", &token)
        .env_remove("FORGE_METRICS_LISTEN");
    let mut web = NodeProcess::spawn(command)?.named("web");
    let admin = web
        .wait_for_line("its admin URL", Duration::from_secs(30), |l| {
            l.starts_with("admin ")
        })
        .await?;
    let admin_url = admin.trim_start_matches("admin ").to_owned();
    println!("dashboard: {admin_url}/  (served by node web; admin API under {admin_url}/api/)");
    println!("admin token for the dashboard's actions: {token}\n");

    let pool = db.pool().await?;
    // The node that starts first wins every role; placement then hands roles over, one at a
    // time, to nodes that lead fewer, until each leads one.
    let spreading = Instant::now();
    let leaders = wait_spread(&pool).await?;
    let moves: i64 =
        sqlx::query_scalar("SELECT count(*) FROM forge.events WHERE kind = 'leader_rebalanced'")
            .fetch_one(&pool)
            .await?;
    println!(
        "roles spread across the nodes {:.1} s after the start ({moves} placement moves, each a graceful handoff)",
        spreading.elapsed().as_secs_f64()
    );
    println!("who leads what:");
    for (role, (node, epoch)) in &leaders {
        println!("  {role:<20} {node}  (epoch {epoch})");
    }

    // Jobs: enqueued once, worked by every node.
    let batch: Vec<NewJob> = (1..=90)
        .map(|image| NewJob::new(thumbnail, Thumbnail { image }))
        .collect();
    forge::jobs::Jobs::new(pool.clone(), &forge::LockNamespace::default())
        .enqueue_many(batch)
        .await?;
    println!("\nenqueued 90 thumbnail jobs (image 13 is corrupt)");
    let by_node = wait_jobs_settled(&pool).await?;
    println!("jobs drained across the nodes:");
    for (node, state, count) in &by_node {
        println!("  {node:<8} {state:<10} {count}");
    }
    let (attempts, errors): (i32, serde_json::Value) = sqlx::query_as(
        "SELECT attempt, errors FROM forge.jobs WHERE kind = 'thumbnail' AND state = 'dead'",
    )
    .fetch_one(&pool)
    .await?;
    println!("the corrupt image was dead-lettered after {attempts} attempts:");
    for error in errors.as_array().into_iter().flatten() {
        println!(
            "  attempt {} on {}: {}",
            error["attempt"],
            error["node"].as_str().unwrap_or("?"),
            error["error"].as_str().unwrap_or("?")
        );
    }
    let nodes_used = by_node
        .iter()
        .filter(|(_, state, _)| state == "completed")
        .count();

    wait_ticks(&pool, 2).await?;

    // 1. SIGKILL the scheduler leader.
    let (victim, epoch) = leaders["scheduler"].clone();
    println!("\nSIGKILL {victim}, the scheduler leader ...");
    drain(&mut listener);
    let killed_at = Instant::now();
    nodes.get_mut(&victim).ok_or("unknown node")?.kill()?;
    let elected = wait_heard(&mut listener, |h| {
        h.role == "scheduler" && h.event == "elected" && h.epoch > epoch
    })
    .await?;
    let kill_gap = elected.at - killed_at;
    println!(
        "  {} took over the scheduler (epoch {}) {:.1} ms after the kill",
        elected.node.as_deref().unwrap_or("?"),
        elected.epoch,
        ms(kill_gap)
    );
    nodes.remove(&victim);
    wait_ticks(&pool, 2).await?;

    // 2. Stop the new leader gracefully.
    let successor = elected.node.clone().ok_or("no node in notification")?;
    println!("\nSIGTERM {successor}, the new scheduler leader (graceful handoff) ...");
    drain(&mut listener);
    let stopped_at = Instant::now();
    nodes.get(&successor).ok_or("unknown node")?.terminate()?;
    let released = wait_heard(&mut listener, |h| {
        h.role == "scheduler" && h.event == "released"
    })
    .await?;
    let next = wait_heard(&mut listener, |h| {
        h.role == "scheduler" && h.event == "elected"
    })
    .await?;
    let status = nodes
        .get_mut(&successor)
        .ok_or("unknown node")?
        .wait_exit(Duration::from_secs(30))
        .await?;
    let (handoff_ms, failover): (f64, bool) = sqlx::query_as(
        "SELECT extract(epoch FROM e.at - r.at)::float8 * 1000, coalesce((e.detail->>'failover')::boolean, false)
           FROM forge.events r JOIN forge.events e
             ON e.role = r.role AND e.epoch = r.epoch + 1 AND e.kind = 'leader_elected'
          WHERE r.role = 'scheduler' AND r.kind = 'leader_released' AND r.epoch = $1",
    )
    .bind(released.epoch)
    .fetch_one(&pool)
    .await?;
    println!(
        "  {successor} drained and released the lock {:.1} ms after SIGTERM, exit status {}",
        ms(released.at - stopped_at),
        status.code().unwrap_or(-1)
    );
    println!(
        "  {} took over (epoch {}) {:.1} ms after the release (server clock), failover = {failover}",
        next.node.as_deref().unwrap_or("?"),
        next.epoch,
        handoff_ms
    );
    nodes.remove(&successor);
    wait_ticks(&pool, 2).await?;

    let leaders = wait_for_leaders(&pool, |_| true).await?;
    println!("\nwho leads what now:");
    for (role, (node, epoch)) in &leaders {
        println!("  {role:<20} {node}  (epoch {epoch})");
    }

    println!("\nleadership history (forge.events):");
    let history: Vec<(String, i64, String, String, bool)> = sqlx::query_as(
        "SELECT to_char(at, 'HH24:MI:SS.MS'), epoch, role,
                node_id || ' ' || replace(kind, 'leader_', ''),
                coalesce((detail->>'failover')::boolean, false)
           FROM forge.events WHERE kind LIKE 'leader_%' ORDER BY id",
    )
    .fetch_all(&pool)
    .await?;
    for (at, epoch, role, what, failover) in history {
        let note = if failover { "  (failover)" } else { "" };
        println!("  {at}  {role:<20} epoch {epoch:<3} {what}{note}");
    }

    println!("\nthe per-second cron's ledger (forge.cron_ticks):");
    let ticks: Vec<(chrono::DateTime<chrono::Utc>, String, i64, i32, String, f64)> =
        sqlx::query_as(
            "SELECT scheduled_at, node_id, epoch, attempt, state,
                extract(epoch FROM claimed_at - scheduled_at)::float8 * 1000
           FROM forge.cron_ticks WHERE cron = 'every_second' ORDER BY scheduled_at",
        )
        .fetch_all(&pool)
        .await?;
    for (at, node, epoch, attempt, state, claim_ms) in &ticks {
        println!(
            "  {}  {node}  epoch {epoch:<3} attempt {attempt}  {state:<9}  claimed {claim_ms:>6.1} ms after the tick",
            at.format("%H:%M:%S")
        );
    }
    let gaps = ticks
        .windows(2)
        .filter(|w| (w[1].0 - w[0].0).num_seconds() != 1)
        .count();
    if gaps > 0 {
        return Err(format!("the cron ledger has {gaps} gaps or duplicates").into());
    }

    if keep {
        keep_up(&pool, &admin_url, &token).await?;
    }
    nodes.insert("web".to_owned(), web);
    for process in nodes.values() {
        process.terminate()?;
    }
    for (id, process) in nodes.iter_mut() {
        let status = process.wait_exit(Duration::from_secs(30)).await?;
        if !status.success() {
            return Err(format!("{id} exited with {status}").into());
        }
    }
    pool.close().await;

    println!("\nsummary:");
    println!(
        "  crash takeover (SIGKILL -> new leader notified): {:.1} ms",
        ms(kill_gap)
    );
    println!("  graceful handoff (release -> new leader):        {handoff_ms:.1} ms");
    println!(
        "  per-second cron: {} ticks across the kill and the handoff, no duplicate, no gap",
        ticks.len()
    );
    println!("  jobs: 89 completed on {nodes_used} nodes, 1 dead-lettered after its retries");
    println!("  every node stopped cleanly");
    println!("  dashboard was at {admin_url}/ (run with --keep to keep it up)");
    Ok(())
}

/// `--keep`: the cluster and its dashboard stay up until ctrl-c, with a few jobs a second
/// (one in 20 fails and is retried, then dead-lettered) so that the charts move.
async fn keep_up(pool: &sqlx::PgPool, admin_url: &str, token: &str) -> Result<(), BoxError> {
    println!("\nthe cluster and its dashboard stay up (--keep): open {admin_url}/");
    println!("actions (pause, retry, step-down) ask for the token: {token}");
    println!("ctrl-c stops every node and removes the database");
    let jobs = forge::jobs::Jobs::new(pool.clone(), &forge::LockNamespace::default());
    let mut image = 1000u32;
    let mut every = tokio::time::interval(Duration::from_secs(1));
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            result = &mut stop => {
                result?;
                println!("\nctrl-c: stopping");
                return Ok(());
            }
            _ = every.tick() => {
                let batch: Vec<NewJob> = (0..4)
                    .map(|_| {
                        image += 1;
                        // 13 is the corrupt image: every 20th job fails.
                        let image = if image.is_multiple_of(20) { 13 } else { image };
                        NewJob::new(thumbnail, Thumbnail { image })
                    })
                    .collect();
                jobs.enqueue_many(batch).await?;
            }
        }
    }
}

/// A token for the web node's writes: 16 random bytes, hex.
fn random_token() -> Result<String, BoxError> {
    use std::io::Read as _;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Discards notifications already received.
fn drain(listener: &mut PgListener) {
    while listener.next_buffered().is_some() {}
}

async fn wait_heard(
    listener: &mut PgListener,
    pred: impl Fn(&Heard) -> bool,
) -> Result<Heard, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let notification = tokio::time::timeout_at(deadline, listener.recv())
            .await
            .map_err(|_| "no leadership change within 30 s")??;
        let at = Instant::now();
        let value: serde_json::Value = serde_json::from_str(notification.payload())?;
        let heard = Heard {
            role: value["role"].as_str().unwrap_or_default().to_owned(),
            epoch: value["epoch"].as_i64().unwrap_or_default(),
            node: value["node"].as_str().map(str::to_owned),
            event: value["event"].as_str().unwrap_or_default().to_owned(),
            at,
        };
        if pred(&heard) {
            return Ok(heard);
        }
    }
}

/// Waits until every demo job is completed or dead; returns (node, state, count).
async fn wait_jobs_settled(pool: &sqlx::PgPool) -> Result<Vec<(String, String, i64)>, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM forge.jobs WHERE kind = 'thumbnail' AND state NOT IN ('completed', 'dead')",
        )
        .fetch_one(pool)
        .await?;
        if open == 0 {
            return Ok(sqlx::query_as(
                "SELECT coalesce(node_id, '-'), state, count(*) FROM forge.jobs
                  WHERE kind = 'thumbnail' GROUP BY 1, 2 ORDER BY 1, 2",
            )
            .fetch_all(pool)
            .await?);
        }
        if Instant::now() > deadline {
            return Err(format!("{open} jobs still open after 60 s").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `count` more ticks of the demo cron have been claimed.
async fn wait_ticks(pool: &sqlx::PgPool, count: i64) -> Result<(), BoxError> {
    let claimed = |pool: &sqlx::PgPool| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM forge.cron_ticks WHERE cron = 'every_second'",
            )
            .fetch_one(&pool)
            .await
        }
    };
    let target = claimed(pool).await? + count;
    let deadline = Instant::now() + Duration::from_secs(30);
    while claimed(pool).await? < target {
        if Instant::now() > deadline {
            return Err("the cron stopped ticking".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Polls `forge.leaders` until the three roles are led by three different nodes.
async fn wait_spread(pool: &sqlx::PgPool) -> Result<BTreeMap<String, (String, i64)>, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let leaders = wait_for_leaders(pool, |_| true).await?;
        let nodes: std::collections::BTreeSet<&String> = leaders.values().map(|(n, _)| n).collect();
        if nodes.len() == 3 {
            return Ok(leaders);
        }
        if Instant::now() > deadline {
            return Err(format!("the roles did not spread within 30 s: {leaders:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `forge.leaders` until all three roles have a leader satisfying `pred`.
async fn wait_for_leaders(
    pool: &sqlx::PgPool,
    pred: impl Fn(&(String, i64)) -> bool,
) -> Result<BTreeMap<String, (String, i64)>, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT role, node_id, epoch FROM forge.leaders WHERE released_at IS NULL",
        )
        .fetch_all(pool)
        .await?;
        let leaders: BTreeMap<String, (String, i64)> = rows
            .into_iter()
            .map(|(role, node, epoch)| (role, (node, epoch)))
            .collect();
        if leaders.len() == 3 && leaders.values().all(&pred) {
            return Ok(leaders);
        }
        if Instant::now() > deadline {
            return Err("the roles did not all get a leader within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
