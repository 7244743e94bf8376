//! Scale: 100 node processes x 3 roles started at once, their connections and idle
//! statements, crash failover among 100 waiters.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use forge::Config;
use forge_testkit::stats::{percentile, summary};
use forge_testkit::{NodeProcess, PgServer};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::process::Command;
use tokio::time::{Instant, sleep};

use crate::{BoxError, Options, verdict, write_config};

const ROLES: &str = "scheduler,metrics_aggregator,log_compactor";
/// How long the number of FORGE backends must stay the same for a start to count as settled.
const STABLE: Duration = Duration::from_secs(3);

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

pub(super) async fn scale(
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
