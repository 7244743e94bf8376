//! Election benchmark: prints crash-failover, graceful-handoff and frozen-leader figures,
//! idle database statements per node, and idle RSS per node.
//!
//! ```text
//! cargo run --release --example bench_election            # 30 kills, 20 handoffs, 5 freezes, 60 s idle
//! cargo run --release --example bench_election -- --quick # fewer rounds, for a smoke run
//! ```
//!
//! It starts its own throwaway PostgreSQL (fsync on, statement logging on so that statements
//! can be counted per node) and runs every node as a separate process: this same binary with
//! `--node <forge.toml>`, which is the probe node of `forge_tests::probe` (leader-only work
//! every 20 ms under every role it leads, with fenced writes, reported on stdout).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use forge_testkit::{NodeProcess, PgOptions, PgServer};
use forge_tests::probe::ProbeLine;
use sqlx::postgres::PgListener;
use tokio::process::Command;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Frozen-leader rounds use this lease; the target is "replaced within lease + 1 s".
const FROZEN_LEASE_SECS: u64 = 5;

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

struct Cluster {
    exe: PathBuf,
    config: PathBuf,
    nodes: BTreeMap<String, NodeProcess>,
    next_id: usize,
    listener: PgListener,
}

struct Elected {
    epoch: i64,
    node: String,
    heard: Instant,
}

impl Cluster {
    /// Starts a probe node; `work_ms` is how often its leader-only work runs.
    async fn spawn(&mut self, roles: &str, work_ms: u64) -> Result<String, BoxError> {
        self.next_id += 1;
        let id = format!("n{}", self.next_id);
        let mut command = Command::new(&self.exe);
        command
            .arg("--node")
            .arg(&self.config)
            .env("FORGE_NODE_ID", &id)
            .env("FORGE_ROLES", roles)
            .env("FORGE_PROBE_WORK_MS", work_ms.to_string())
            .env_remove("DATABASE_URL")
            .env_remove("FORGE_METRICS_LISTEN");
        let mut process = NodeProcess::spawn(command)?.named(&id);
        process
            .wait_for_line("READY", Duration::from_secs(30), |l| {
                l.starts_with("FORGE-PROBE READY")
            })
            .await?;
        self.nodes.insert(id.clone(), process);
        Ok(id)
    }

    fn drain(&mut self) {
        while self.listener.next_buffered().is_some() {}
    }

    async fn wait_event(&mut self, event: &str, after_epoch: i64) -> Result<Elected, BoxError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let n = tokio::time::timeout_at(deadline, self.listener.recv())
                .await
                .map_err(|_| format!("no {event} notification within 60 s"))??;
            let heard = Instant::now();
            let v: serde_json::Value = serde_json::from_str(n.payload())?;
            if v["role"] == "scheduler"
                && v["event"] == event
                && v["epoch"].as_i64() > Some(after_epoch)
            {
                return Ok(Elected {
                    epoch: v["epoch"].as_i64().unwrap_or_default(),
                    node: v["node"].as_str().unwrap_or_default().to_owned(),
                    heard,
                });
            }
        }
    }

    /// Waits until every node except the leader waits inside pg_advisory_lock for the
    /// scheduler, so that each round measures a real takeover, not a start-up.
    async fn wait_followers_waiting(
        &self,
        pool: &sqlx::PgPool,
        followers: usize,
    ) -> Result<(), BoxError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE application_name LIKE 'forge:scheduler:%' AND wait_event_type = 'Lock'",
            )
            .fetch_one(pool)
            .await?;
            if waiting as usize >= followers {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("only {waiting} of {followers} followers are waiting").into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn current_leader(&self, pool: &sqlx::PgPool) -> Result<(String, i64), BoxError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let row: Option<(String, i64)> = sqlx::query_as(
                "SELECT node_id, epoch FROM forge.leaders WHERE role = 'scheduler' AND released_at IS NULL",
            )
            .fetch_optional(pool)
            .await?;
            if let Some(row) = row
                && self.nodes.contains_key(&row.0)
            {
                return Ok(row);
            }
            if Instant::now() > deadline {
                return Err("no scheduler leader within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn write_config(dir: &Path, url: &str, lease_secs: u64) -> Result<PathBuf, BoxError> {
    let path = dir.join(format!("forge-{lease_secs}s.toml"));
    let refresh = (lease_secs * 1000 / 3).max(300);
    std::fs::write(
        &path,
        format!(
            "[database]\nurl = \"{url}\"\n\n[cluster.leader_election]\nlease_duration = \"{lease_secs}s\"\nrefresh_interval = \"{refresh}ms\"\n"
        ),
    )?;
    Ok(path)
}

fn summary(name: &str, values: Vec<f64>, unit: &str) {
    println!("{}", forge_testkit::stats::summary(name, &values, unit));
}

async fn bench(quick: bool) -> Result<(), BoxError> {
    let (kills, handoffs, freezes, idle_secs) = if quick {
        (5, 5, 1, 10)
    } else {
        (30, 20, 5, 60)
    };
    println!(
        "FORGE election benchmark ({} mode)",
        if quick { "quick" } else { "full" }
    );
    let server = PgServer::start_with(
        PgOptions::default()
            .durable(true)
            .setting("log_statement", "all")
            .setting("log_line_prefix", "%m [%p] app=%a "),
    )?;
    let db = server.create_database().await?;
    let pool = db.pool().await?;
    let dir = std::env::temp_dir().join(format!("forge-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let default_config = write_config(&dir, db.url(), 15)?;
    let mut listener = PgListener::connect(db.url()).await?;
    listener.listen("forge_leader").await?;
    let mut cluster = Cluster {
        exe: std::env::current_exe()?,
        config: default_config.clone(),
        nodes: BTreeMap::new(),
        next_id: 0,
        listener,
    };
    println!(
        "PostgreSQL {} on 127.0.0.1:{} (fsync on); nodes are separate processes, 3 at a time\n",
        sqlx::query_scalar::<_, String>("SHOW server_version")
            .fetch_one(&pool)
            .await?,
        server.port()
    );

    // Crash failover: SIGKILL the leader, time until the new leader's NOTIFY arrives.
    for _ in 0..3 {
        cluster.spawn("scheduler", 20).await?;
    }
    let mut crash = Vec::new();
    for _ in 0..kills {
        let (leader, epoch) = cluster.current_leader(&pool).await?;
        cluster.wait_followers_waiting(&pool, 2).await?;
        cluster.drain();
        let killed = Instant::now();
        cluster
            .nodes
            .get_mut(&leader)
            .ok_or("leader gone")?
            .kill()?;
        let elected = cluster.wait_event("elected", epoch).await?;
        crash.push((elected.heard - killed).as_secs_f64() * 1000.0);
        cluster.nodes.remove(&leader);
        cluster.spawn("scheduler", 20).await?;
    }

    // Graceful handoff: SIGTERM the leader. Gap = release -> next election (server clock),
    // and SIGTERM -> new leader notified (drain included).
    let mut handoff = Vec::new();
    let mut stop_to_leader = Vec::new();
    for _ in 0..handoffs {
        let (leader, epoch) = cluster.current_leader(&pool).await?;
        cluster.wait_followers_waiting(&pool, 2).await?;
        cluster.drain();
        let stopped = Instant::now();
        cluster
            .nodes
            .get(&leader)
            .ok_or("leader gone")?
            .terminate()?;
        let elected = cluster.wait_event("elected", epoch).await?;
        stop_to_leader.push((elected.heard - stopped).as_secs_f64() * 1000.0);
        let gap: f64 = sqlx::query_scalar(
            "SELECT extract(epoch FROM e.at - r.at)::float8 * 1000
               FROM forge.events r JOIN forge.events e
                 ON e.role = r.role AND e.epoch = r.epoch + 1 AND e.kind = 'leader_elected'
              WHERE r.role = 'scheduler' AND r.kind = 'leader_released' AND r.epoch = $1",
        )
        .bind(epoch)
        .fetch_one(&pool)
        .await?;
        handoff.push(gap);
        let mut gone = cluster.nodes.remove(&leader).ok_or("leader gone")?;
        let status = gone.wait_exit(Duration::from_secs(30)).await?;
        if !status.success() {
            return Err(format!("{leader} exited with {status} after SIGTERM").into());
        }
        cluster.spawn("scheduler", 20).await?;
    }

    // Frozen leader: SIGSTOP; PostgreSQL ends its session after the lease.
    let frozen_config = write_config(&dir, db.url(), FROZEN_LEASE_SECS)?;
    for id in cluster.nodes.keys().cloned().collect::<Vec<_>>() {
        let mut node = cluster.nodes.remove(&id).ok_or("node gone")?;
        node.terminate()?;
        node.wait_exit(Duration::from_secs(30)).await?;
    }
    cluster.config = frozen_config;
    for _ in 0..3 {
        cluster.spawn("scheduler", 20).await?;
    }
    let mut frozen = Vec::new();
    let mut overlaps = 0;
    for _ in 0..freezes {
        let (leader, epoch) = cluster.current_leader(&pool).await?;
        cluster.wait_followers_waiting(&pool, 2).await?;
        cluster.drain();
        let stopped = Instant::now();
        cluster.nodes.get(&leader).ok_or("leader gone")?.pause()?;
        let elected = cluster.wait_event("elected", epoch).await?;
        frozen.push((elected.heard - stopped).as_secs_f64());
        let old = cluster.nodes.get_mut(&leader).ok_or("leader gone")?;
        old.resume()?;
        old.wait_for_line("the old tenure to end", Duration::from_secs(30), |l| {
            ProbeLine::parse(l).is_some_and(|p| p.event == "ENDED" && p.epoch == Some(epoch))
        })
        .await?;
        // No overlap: the old tenure's last decision to work precedes the new tenure's first.
        let last_old = old
            .lines()
            .iter()
            .filter_map(|l| ProbeLine::parse(l))
            .filter(|p| p.event == "WORK" && p.epoch == Some(epoch))
            .map(|p| p.t)
            .max();
        let new_node = cluster
            .nodes
            .get(&elected.node)
            .ok_or("new leader unknown")?;
        let first_new = forge_testkit::wait_until(
            "work by the new leader",
            Duration::from_secs(10),
            Duration::from_millis(5),
            || async {
                new_node
                    .lines()
                    .iter()
                    .filter_map(|l| ProbeLine::parse(l))
                    .filter(|p| p.event == "WORK" && p.epoch == Some(elected.epoch))
                    .map(|p| p.t)
                    .min()
            },
        )
        .await?;
        if last_old.is_some_and(|t| t >= first_new) {
            overlaps += 1;
        }
        let stale_rows: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM forge_probe_work o
              WHERE o.role = 'scheduler' AND o.epoch = $1
                AND o.at >= (SELECT min(at) FROM forge_probe_work WHERE role = 'scheduler' AND epoch = $2)",
        )
        .bind(epoch)
        .bind(elected.epoch)
        .fetch_one(&pool)
        .await?;
        overlaps += stale_rows as usize;
        // The resumed node lost its session; replace it to keep three live nodes.
        let mut old = cluster.nodes.remove(&leader).ok_or("leader gone")?;
        old.terminate()?;
        old.wait_exit(Duration::from_secs(30)).await?;
        cluster.spawn("scheduler", 20).await?;
    }

    // Idle: 3 nodes campaigning for all three roles; count their statements in the server log.
    for id in cluster.nodes.keys().cloned().collect::<Vec<_>>() {
        let mut node = cluster.nodes.remove(&id).ok_or("node gone")?;
        node.terminate()?;
        node.wait_exit(Duration::from_secs(30)).await?;
    }
    cluster.config = default_config;
    let mut idle_ids = Vec::new();
    for _ in 0..3 {
        // Leader-only work once an hour: what is measured is FORGE's own idle cost.
        idle_ids.push(
            cluster
                .spawn("scheduler,metrics_aggregator,log_compactor", 3_600_000)
                .await?,
        );
    }
    // Let start-up settle, then measure a clean window.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = server.log_file().ok_or("no server log")?.to_owned();
    let start_len = std::fs::metadata(&log)?.len();
    let window = Duration::from_secs(idle_secs);
    tokio::time::sleep(window).await;
    let text = std::fs::read(&log)?;
    let text = String::from_utf8_lossy(&text[start_len as usize..]);
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for line in text.lines() {
        let is_statement = line.contains(" LOG:  statement: ") || line.contains(" LOG:  execute ");
        if !is_statement {
            continue;
        }
        if let Some(app) = line
            .split(" app=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            && let Some(node) = app.rsplit(':').next()
            && app.starts_with("forge:")
        {
            *per_node.entry(node.to_owned()).or_default() += 1;
        }
    }
    let mut rss = Vec::new();
    for id in &idle_ids {
        let pid = cluster.nodes[id].pid();
        rss.push(forge_testkit::stats::rss_kib(pid).unwrap_or_default() as f64 / 1024.0);
    }
    let leader_of: Vec<(String, String)> = sqlx::query_as(
        "SELECT role, node_id FROM forge.leaders WHERE released_at IS NULL ORDER BY role",
    )
    .fetch_all(&pool)
    .await?;

    println!("crash failover (SIGKILL of the leader process -> new leader's NOTIFY received):");
    summary("gap", crash, "ms");
    println!("graceful handoff (SIGTERM of the leader):");
    summary(
        "release -> new leader elected (server clock)",
        handoff,
        "ms",
    );
    summary(
        "SIGTERM -> new leader's NOTIFY (drain incl.)",
        stop_to_leader,
        "ms",
    );
    println!("frozen leader (SIGSTOP), lease_duration = {FROZEN_LEASE_SECS} s:");
    summary("SIGSTOP -> new leader's NOTIFY", frozen.clone(), "s");
    let worst = frozen.iter().copied().fold(0.0, f64::max);
    println!(
        "  worst case vs lease + 1 s: {worst:.2} s vs {:.2} s; overlapping leader-only work or stale fenced writes: {overlaps}",
        FROZEN_LEASE_SECS as f64 + 1.0
    );
    println!(
        "idle, 3 nodes x 3 roles, default timings, {} s window (leaders: {}):",
        idle_secs,
        leader_of
            .iter()
            .map(|(r, n)| format!("{r}={n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for id in &idle_ids {
        let count = per_node.get(id).copied().unwrap_or_default();
        println!(
            "  {id}: {:.3} statements/s ({:.3} per role)",
            count as f64 / window.as_secs_f64(),
            count as f64 / window.as_secs_f64() / 3.0
        );
    }
    let total: usize = idle_ids
        .iter()
        .map(|id| per_node.get(id).copied().unwrap_or_default())
        .sum();
    println!(
        "  mean: {:.3} statements/s per node",
        total as f64 / window.as_secs_f64() / idle_ids.len() as f64
    );
    rss.sort_by(f64::total_cmp);
    println!(
        "idle RSS per node process: min {:.1} MiB, max {:.1} MiB",
        rss.first().copied().unwrap_or_default(),
        rss.last().copied().unwrap_or_default()
    );

    for (_, node) in cluster.nodes.iter_mut() {
        node.terminate()?;
        node.wait_exit(Duration::from_secs(30)).await?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
