//! Shared helpers: configs with short timings, in-process nodes, probe processes.

use std::collections::BTreeMap;
use std::time::Duration;

use forge::{Config, Node, Role, RoleState};
use forge_testkit::{NodeProcess, PgServer, TestDatabase, wait_until};
use forge_tests::probe::ProbeLine;
use sqlx::{PgConnection, PgPool, SqlSafeStr};
use tokio::process::Command;

/// Short timings so that tests of frozen leaders and outages take seconds, not minutes.
pub(crate) const LEASE: Duration = Duration::from_secs(2);

/// How long tests wait for something that should take milliseconds.
pub(crate) const SOON: Duration = Duration::from_secs(10);

/// A config for `url` with short election timings.
pub(crate) fn config(url: &str, node: &str) -> Config {
    let mut config = Config::default();
    config.database.url = Some(url.to_owned());
    config.database.connect_timeout = Duration::from_secs(5);
    config.node.id = Some(node.to_owned());
    let election = &mut config.cluster.leader_election;
    election.lease_duration = LEASE;
    election.refresh_interval = Duration::from_millis(500);
    election.lock_timeout = Duration::from_secs(1);
    election.check_interval = Duration::from_millis(500);
    election.drain_timeout = Duration::from_secs(2);
    let membership = &mut config.cluster.membership;
    membership.heartbeat_interval = Duration::from_millis(500);
    membership.drift_after = Duration::from_millis(1500);
    membership.down_after = Duration::from_secs(3);
    config
}

/// The same timings as [`config`], as forge.toml text for node processes.
pub(crate) fn config_toml(url: &str) -> String {
    format!(
        r#"[database]
url = "{url}"
connect_timeout = "5s"

[cluster.leader_election]
lease_duration = "2s"
refresh_interval = "500ms"
lock_timeout = "1s"
check_interval = "500ms"
drain_timeout = "2s"

[cluster.membership]
heartbeat_interval = "500ms"
drift_after = "1500ms"
down_after = "3s"
"#
    )
}

/// A job client for the default namespace on `pool`.
pub(crate) fn client(pool: &PgPool) -> forge::jobs::Jobs {
    forge::jobs::Jobs::new(pool.clone(), &forge::LockNamespace::default())
}

/// A fresh database on the shared server.
pub(crate) async fn fresh_db() -> TestDatabase {
    PgServer::shared()
        .expect("PostgreSQL for tests")
        .create_database()
        .await
        .expect("a fresh database")
}

/// An in-process node that leads `roles` with a leader task that just waits.
pub(crate) async fn start_node(url: &str, id: &str, roles: &[Role]) -> Node {
    let mut config = config(url, id);
    config.node.roles = Some(roles.iter().map(|r| r.name().to_owned()).collect());
    // Crons and jobs linked into the test binary must not join every node.
    let mut builder = Node::builder(config).auto_register(false);
    for role in roles {
        builder = builder.leader_task(role.clone(), "idle", |leadership| async move {
            leadership.stopping().await;
        });
    }
    builder.start().await.expect("node starts")
}

/// Waits until a standby waits inside the lock of `role` (a step-down is refused without one).
pub(crate) async fn wait_standby(pool: &PgPool, role: &str) {
    wait_until(
        &format!("a standby of {role} waiting inside its lock"),
        SOON,
        Duration::from_millis(5),
        || async {
            let waiting: Option<i64> = sqlx::query_scalar(
                "SELECT forge.lock_waiters(lock_key) FROM forge.leaders WHERE role = $1",
            )
            .bind(role)
            .fetch_optional(pool)
            .await
            .ok()
            .flatten();
            waiting.filter(|n| *n > 0).map(|_| ())
        },
    )
    .await
    .unwrap();
}

/// Waits until exactly one of `nodes` leads `role`, and returns its index and epoch.
pub(crate) async fn wait_single_leader(nodes: &[&Node], role: &Role) -> (usize, i64) {
    wait_until(
        &format!("exactly one leader of {role}"),
        SOON,
        Duration::from_millis(5),
        || async {
            let leaders: Vec<(usize, i64)> = nodes
                .iter()
                .enumerate()
                .filter_map(|(i, node)| match node.role_state(role) {
                    Some(RoleState::Leader { epoch, .. }) => Some((i, epoch.0)),
                    _ => None,
                })
                .collect();
            (leaders.len() == 1).then(|| leaders[0])
        },
    )
    .await
    .unwrap()
}

/// Leadership history of a role from `forge.events`: (epoch, node, event without its
/// `leader_` prefix, failover).
/// The leadership events of `role` (without `leader_lost`, which the losing node records in
/// the background): (epoch, node, elected | released | fenced, failover).
pub(crate) async fn events(pool: &PgPool, role: &str) -> Vec<(i64, String, String, bool)> {
    sqlx::query_as(
        "SELECT epoch, node_id, replace(kind, 'leader_', ''),
                coalesce((detail->>'failover')::boolean, false)
           FROM forge.events WHERE role = $1 AND kind LIKE 'leader_%' AND kind <> 'leader_lost'
          ORDER BY id",
    )
    .bind(role)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A probe node process (see `forge_tests::probe`) with the short timings.
pub(crate) struct Probe {
    pub(crate) process: NodeProcess,
    pub(crate) id: String,
}

impl Probe {
    /// Starts a probe node process and waits until it is ready.
    pub(crate) async fn start(
        db: &TestDatabase,
        dir: &std::path::Path,
        id: &str,
        roles: &[&str],
    ) -> Probe {
        Probe::spawn(db, dir, id, roles, None, &[]).await
    }

    /// A probe that also serves the admin API on `admin` and `GET /leader-only` (behind
    /// `LeaderOnly` for the scheduler) on `app`, both on 127.0.0.1.
    pub(crate) async fn start_serving(
        db: &TestDatabase,
        dir: &std::path::Path,
        id: &str,
        roles: &[&str],
        (admin, app): (u16, u16),
    ) -> Probe {
        let env = [
            ("FORGE_ADMIN_LISTEN", format!("127.0.0.1:{admin}")),
            ("FORGE_PROBE_APP_LISTEN", format!("127.0.0.1:{app}")),
        ];
        Probe::spawn(db, dir, id, roles, None, &env).await
    }

    /// A probe that also runs the `probe_tick` cron with this expression (catch_up = all).
    pub(crate) async fn start_with_cron(
        db: &TestDatabase,
        dir: &std::path::Path,
        id: &str,
        roles: &[&str],
        cron: &str,
    ) -> Probe {
        Probe::spawn(db, dir, id, roles, Some(cron), &[]).await
    }

    /// A probe with `cron` (if any) and more environment variables.
    pub(crate) async fn spawn(
        db: &TestDatabase,
        dir: &std::path::Path,
        id: &str,
        roles: &[&str],
        cron: Option<&str>,
        env: &[(&str, String)],
    ) -> Probe {
        let path = dir.join("forge.toml");
        if !path.exists() {
            // Probe tests follow one leader through kills and handoffs: placement moves would
            // add handoffs of their own to the history they read (placement has its own tests).
            let toml = config_toml(db.url()) + "\n[cluster]\nspread = false\n";
            std::fs::write(&path, toml).unwrap();
        }
        let mut command = Command::new(env!("CARGO_BIN_EXE_forge-probe-node"));
        command
            .arg(&path)
            .env("FORGE_NODE_ID", id)
            .env("FORGE_ROLES", roles.join(","))
            .env_remove("DATABASE_URL")
            .env(
                "FORGE_PROBE_WORK_MS",
                if cron.is_some() { "3600000" } else { "20" },
            );
        match cron {
            Some(cron) => command.env("FORGE_PROBE_CRON", cron),
            None => command.env_remove("FORGE_PROBE_CRON"),
        };
        command.envs(env.iter().map(|(k, v)| (k, v)));
        let mut process = NodeProcess::spawn(command).unwrap().named(id);
        process
            .wait_for_line("READY", SOON, |line| line.starts_with("FORGE-PROBE READY"))
            .await
            .unwrap();
        Probe {
            process,
            id: id.to_owned(),
        }
    }

    /// Every probe line printed so far.
    pub(crate) fn lines(&self) -> Vec<ProbeLine> {
        self.process
            .lines()
            .iter()
            .filter_map(|line| ProbeLine::parse(line))
            .collect()
    }
}

/// A TCP port of 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

/// The built-in roles, by name.
pub(crate) const BUILTIN_ROLES: [&str; 3] = ["scheduler", "metrics_aggregator", "log_compactor"];

/// Three probe processes campaigning for every built-in role, returned once each role is led
/// and two standbys of the scheduler wait inside its lock: a SIGKILLed leader's successor is
/// then granted the lock the instant the leader's session ends.
pub(crate) async fn probes_with_standbys(
    db: &TestDatabase,
    dir: &std::path::Path,
    ids: [&str; 3],
) -> Vec<Probe> {
    let mut probes = Vec::new();
    for id in ids {
        probes.push(Probe::start(db, dir, id, &BUILTIN_ROLES).await);
    }
    let pool = db.pool().await.unwrap();
    wait_until(
        "every role led, two standbys of the scheduler waiting",
        SOON,
        Duration::from_millis(10),
        || async {
            let waiting: Option<i64> = sqlx::query_scalar(
                "SELECT forge.lock_waiters(lock_key) FROM forge.leaders WHERE role = 'scheduler'",
            )
            .fetch_optional(&pool)
            .await
            .unwrap();
            (current_leaders(&pool).await.len() == BUILTIN_ROLES.len() && waiting == Some(2))
                .then_some(())
        },
    )
    .await
    .unwrap();
    probes
}

/// The scheduler's leader among `probes`, SIGKILLed once its last heartbeat has reported it
/// leading (what a view trusting heartbeats would go on showing): its id, its epoch and the
/// database's clock just before the kill.
pub(crate) async fn kill_scheduler_leader(
    pool: &PgPool,
    probes: &mut [Probe],
) -> (String, i64, chrono::DateTime<chrono::Utc>) {
    let (victim, epoch) = current_leaders(pool).await["scheduler"].clone();
    wait_until(
        "a heartbeat after the election",
        SOON,
        Duration::from_millis(20),
        || async {
            let reported: Vec<String> =
                sqlx::query_scalar("SELECT leads FROM forge.nodes WHERE node_id = $1")
                    .bind(&victim)
                    .fetch_one(pool)
                    .await
                    .unwrap();
            reported.iter().any(|r| r == "scheduler").then_some(())
        },
    )
    .await
    .unwrap();
    let index = probes.iter().position(|p| p.id == victim).unwrap();
    let before: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .unwrap();
    probes[index].process.kill().unwrap();
    (victim, epoch, before)
}

/// A scratch directory for config files, removed on drop.
pub(crate) struct ScratchDir(pub std::path::PathBuf);

impl ScratchDir {
    pub(crate) fn new(name: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!(
            "forge-it-{name}-{}-{:x}",
            std::process::id(),
            fastrand_u64()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fastrand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0);
    hasher.finish()
}

/// Which probe holds which role right now, according to `forge.leaders`.
pub(crate) async fn current_leaders(pool: &PgPool) -> BTreeMap<String, (String, i64)> {
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT role, node_id, epoch FROM forge.leaders WHERE released_at IS NULL")
            .fetch_all(pool)
            .await
            .unwrap();
    rows.into_iter()
        .map(|(role, node, epoch)| (role, (node, epoch)))
        .collect()
}

/// Whether the external programs a test drives (a browser, promtool) are here. In CI
/// (`CI=true`, as `.ci/run` runs, or `FORGE_REQUIRE_TOOLS=1`) a missing one fails the test with
/// what to install; on a developer machine that has only Rust and PostgreSQL, the test checks
/// nothing and says so on stderr (`cargo test -- --nocapture` shows it), so that the README's
/// test command works there.
pub(crate) fn tools_present(missing: &[(&str, &str)], what: &str) -> bool {
    if missing.is_empty() {
        return true;
    }
    let list = missing
        .iter()
        .map(|(program, package)| format!("{program} (Debian package `{package}`)"))
        .collect::<Vec<_>>()
        .join(", ");
    let message = format!(
        "{what} need {list}: install it (`apt-get install {}`; .ci/run does)",
        missing
            .iter()
            .map(|(_, package)| *package)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let required = std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var_os("FORGE_REQUIRE_TOOLS").is_some();
    assert!(!required, "{message}");
    eprintln!("NOTICE: not checked here: {message}. With CI=true this test fails instead.");
    false
}

/// A node whose binary has work for the role `billing` (a leader task `invoices` that waits for
/// its leadership to end) and for the queue `mailers` (the job type `mailer`), and no other.
pub(crate) async fn billing_and_mailers_node(config: Config) -> Node {
    Node::builder(config)
        .auto_register(false)
        .job(crate::jobs::mailer)
        .leader_task(
            Role::new("billing").unwrap(),
            "invoices",
            |leadership| async move { leadership.stopping().await },
        )
        .start()
        .await
        .expect("node starts")
}

/// Applies FORGE's migrations up to `last` only (no function files): a database as an older
/// release left it.
pub(crate) async fn migrate_until(conn: &mut PgConnection, last: i64) {
    let older: Vec<sqlx::migrate::Migration> = forge::migrate::sources()
        .into_iter()
        .filter(|(version, _, _)| *version <= last)
        .map(|(version, description, sql)| {
            sqlx::migrate::Migration::new(
                version,
                std::borrow::Cow::Borrowed(description),
                sqlx::migrate::MigrationType::Simple,
                sql.into_sql_str(),
                false,
            )
        })
        .collect();
    let mut older = sqlx::migrate::Migrator::with_migrations(older);
    older.create_schema("forge");
    older.dangerous_set_table_name(forge::migrate::TABLE);
    older.run_direct(None, conn, false).await.unwrap();
}
