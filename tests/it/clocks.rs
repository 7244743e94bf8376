//! Steps of the database's wall clock (an NTP step, a VM resumed, a snapshot restored), with
//! PostgreSQL under libfaketime (`PgOptions::steppable_clock`): whether a lease ran out or a
//! node is down is judged by the observer, on its own monotonic clock, so no step deposes a
//! healthy leader, marks a live node down or delays a rescue (ARCHITECTURE.md, "Clocks").
//!
//! While the clock is stepped ahead, libfaketime also makes PostgreSQL's own timeouts armed
//! meanwhile (`lock_timeout`, `idle_session_timeout`, ...) fire late by the step, as a real
//! backward step does to the timeouts pending at it (see `forge_testkit`'s `PgServer::step_clock_ahead`).
//! Stepping back to the true time then is, for every timestamp written meanwhile, a real
//! backward step.
//!
//! Timings as the soak's: lease 3 s, heartbeat 500 ms, drift_after 1.5 s, down_after 4 s.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use forge::jobs::{JobId, JobState};
use forge::{Config, Node};
use forge_testkit::{PgOptions, PgServer, TestDatabase, faketime_library, wait_until};
use sqlx::PgPool;
use tokio::time::Instant;

use crate::exactly_once::{EFFECTS_TABLE, effect_cron};
use crate::jobs::{Behave, RUNS_TABLE_SQL, inserted, plain, wait_state};
use crate::support::*;

const LEASE: Duration = Duration::from_secs(3);
const LOCK_TIMEOUT: Duration = Duration::from_secs(1);
const HEARTBEAT: Duration = Duration::from_millis(500);
const DOWN_AFTER: Duration = Duration::from_secs(4);
/// The step: far beyond every lease and down_after.
const STEP: Duration = Duration::from_secs(90);
/// What a loaded test machine may add to a stated bound.
const SLACK: Duration = Duration::from_millis(1500);
/// The in-process nodes of [`busy_cluster`].
const NODES: [&str; 3] = ["a", "b", "c"];

/// A private cluster whose clock the test steps; `None` (with a notice) where libfaketime is
/// missing, except in CI, where the test fails instead.
async fn steppable_server() -> Option<PgServer> {
    let missing: &[(&str, &str)] = if faketime_library().is_some() {
        &[]
    } else {
        &[("libfaketime.so.1", "libfaketime")]
    };
    if !tools_present(missing, "the clock-step tests") {
        return None;
    }
    let server = tokio::task::spawn_blocking(|| {
        PgServer::start_with(PgOptions::default().steppable_clock())
    })
    .await
    .unwrap()
    .expect("a cluster with a steppable clock");
    Some(server)
}

/// A database with the cron's `tick_effects` and the jobs' `job_runs` (the first node to start
/// applies FORGE's schema).
async fn setup(server: &PgServer) -> (TestDatabase, PgPool) {
    let db = server.create_database().await.unwrap();
    let pool = db.pool().await.unwrap();
    sqlx::raw_sql(RUNS_TABLE_SQL).execute(&pool).await.unwrap();
    sqlx::query(EFFECTS_TABLE).execute(&pool).await.unwrap();
    (db, pool)
}

/// Three busy nodes on a database of `server`, once every role is led with two standbys
/// waiting: the database, its pool, the nodes and each role's (leader, epoch).
async fn busy_cluster(server: &PgServer) -> (TestDatabase, PgPool, Vec<Node>, Leaders) {
    let (db, pool) = setup(server).await;
    let mut nodes = Vec::new();
    for id in NODES {
        nodes.push(busy_node(db.url(), id).await);
    }
    let leaders = settled(&pool, 2).await;
    (db, pool, nodes, leaders)
}

/// The soak's timings; no placement moves (their handoffs would be new tenures of their own).
fn clock_config(url: &str, id: &str) -> Config {
    let mut config = config(url, id);
    config.cluster.spread = false;
    config.cluster.leader_election.lease_duration = LEASE;
    config.cluster.leader_election.lock_timeout = LOCK_TIMEOUT;
    config.cluster.membership.heartbeat_interval = HEARTBEAT;
    config.cluster.membership.down_after = DOWN_AFTER;
    config.node.queues = Some(vec!["default".into()]);
    config.jobs.maintenance_interval = Duration::from_secs(1);
    config
}

/// The same timings as forge.toml text, for probe processes.
fn clock_toml(url: &str) -> String {
    format!(
        "{}\n[cluster]\nspread = false\n",
        config_toml(url)
            .replace("lease_duration = \"2s\"", "lease_duration = \"3s\"")
            .replace("down_after = \"3s\"", "down_after = \"4s\"")
    )
}

/// A node serving every built-in role, the `plain` job and a per-second cron (`ticks`) that
/// completes its tick in the transaction of its effect.
async fn busy_node(url: &str, id: &str) -> Node {
    Node::builder(clock_config(url, id))
        .auto_register(false)
        .job(plain)
        .cron(effect_cron("ticks", true, None))
        .start()
        .await
        .expect("node starts")
}

/// The highest event id so far: what happens after is what the test judges (event times are
/// the stepped clock's).
async fn last_event(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM forge.events")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The events of `kinds` after event `after`, as (kind, node, role).
async fn events_after(
    pool: &PgPool,
    after: i64,
    kinds: &[&str],
) -> Vec<(String, String, Option<String>)> {
    sqlx::query_as(
        "SELECT kind, coalesce(node_id, ''), role FROM forge.events
          WHERE id > $1 AND kind = ANY ($2) ORDER BY id",
    )
    .bind(after)
    .bind(kinds)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Each role's (leader, epoch).
type Leaders = BTreeMap<String, (String, i64)>;

/// Each role's (node, epoch), once every built-in role is led and has `standbys` sessions
/// waiting inside its lock.
async fn settled(pool: &PgPool, standbys: i64) -> Leaders {
    wait_until(
        &format!("every role led, with {standbys} standbys waiting"),
        SOON,
        Duration::from_millis(20),
        || async {
            let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(
                "SELECT role, node_id, epoch, forge.lock_waiters(lock_key) FROM forge.leaders l
                  WHERE forge.tenure_current(l)",
            )
            .fetch_all(pool)
            .await
            .unwrap();
            (rows.len() == BUILTIN_ROLES.len() && rows.iter().all(|r| r.3 == standbys)).then(|| {
                rows.into_iter()
                    .map(|(role, node, epoch, _)| (role, (node, epoch)))
                    .collect()
            })
        },
    )
    .await
    .unwrap()
}

/// The backends of the nodes' lock sessions, as (application_name, pid).
async fn lock_sessions(pool: &PgPool) -> BTreeSet<(String, i32)> {
    sqlx::query_as(
        "SELECT application_name, pid FROM pg_stat_activity
          WHERE datname = current_database() AND application_name LIKE 'forge:%:%'
            AND split_part(application_name, ':', 2) NOT IN ('pool', 'node')",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// Waits until every node in `nodes` has heartbeated `beats` more times: the cluster has run
/// that long (by the nodes' own clocks) through whatever the test does to it.
async fn heartbeats(pool: &PgPool, nodes: &[&str], beats: usize) {
    // (node -> (last heartbeat seen, changes seen))
    let seen =
        std::sync::Mutex::new(BTreeMap::<String, (chrono::DateTime<chrono::Utc>, usize)>::new());
    wait_until(
        &format!("{beats} heartbeats of each of {nodes:?}"),
        HEARTBEAT * beats as u32 + SOON,
        Duration::from_millis(40),
        || async {
            let rows: Vec<(String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
                "SELECT node_id, heartbeat_at FROM forge.nodes WHERE node_id = ANY ($1)",
            )
            .bind(nodes)
            .fetch_all(pool)
            .await
            .unwrap();
            let mut seen = seen.lock().unwrap();
            for (node, beat) in rows {
                let entry = seen.entry(node).or_insert((beat, 0));
                if entry.0 != beat {
                    *entry = (beat, entry.1 + 1);
                }
            }
            nodes
                .iter()
                .all(|n| seen.get(*n).is_some_and(|(_, count)| *count >= beats))
                .then_some(())
        },
    )
    .await
    .unwrap();
}

/// Jobs that ran more than once, or not to completion, as (id, runs, finished runs).
async fn job_reruns(pool: &PgPool) -> Vec<(i64, i64, i64)> {
    sqlx::query_as(
        "SELECT job_id, count(*), count(finished_at) FROM job_runs GROUP BY job_id
         HAVING count(*) <> 1 OR count(finished_at) <> 1 ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Enqueues `n` plain jobs that take `ms` each.
async fn enqueue(pool: &PgPool, n: usize, ms: u64, tag: &str) -> Vec<JobId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let behave = Behave {
            sleep_ms: ms,
            ..Behave::tag(format!("{tag}-{i}"))
        };
        ids.push(inserted(client(pool).enqueue(plain, behave).await.unwrap()));
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_testkit_steps_the_servers_wall_clock_and_back() {
    let Some(server) = steppable_server().await else {
        return;
    };
    let pool = server
        .create_database()
        .await
        .unwrap()
        .pool()
        .await
        .unwrap();
    let offset = || async {
        let ms: f64 = sqlx::query_scalar(
            "SELECT extract(epoch FROM clock_timestamp() - $1::timestamptz)::float8 * 1000",
        )
        .bind(chrono::Utc::now())
        .fetch_one(&pool)
        .await
        .unwrap();
        ms
    };
    assert!(offset().await.abs() < 1000.0);
    server.step_clock_ahead(STEP).unwrap();
    assert_eq!(server.clock_offset_ms(), Some(90_000));
    let ahead = offset().await;
    assert!((ahead - 90_000.0).abs() < 1000.0, "{ahead} ms ahead");
    server.step_clock_back(STEP * 2).unwrap();
    let behind = offset().await;
    assert!((behind + 90_000.0).abs() < 1000.0, "{behind} ms");
    server.step_clock_to_true_time().unwrap();
    assert_eq!(server.clock_offset_ms(), Some(0));
    assert!(offset().await.abs() < 1000.0);
    let shared = PgServer::shared().unwrap();
    assert!(
        shared.step_clock_ahead(STEP).is_err(),
        "a server without a steppable clock"
    );
}

/// Issue 31, item 1: a step of +90 s and back, under three nodes with a per-second cron and
/// jobs running across the steps, deposes no leader, drops no standby's lock session, marks no
/// node drifted or down, reruns no job, and misses, doubles or skips no tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_of_the_database_clock_deposes_no_leader_and_marks_no_node_down() {
    let Some(server) = steppable_server().await else {
        return;
    };
    let (_db, pool, nodes, leaders) = busy_cluster(&server).await;
    let sessions = lock_sessions(&pool).await;
    let since = last_event(&pool).await;
    // Jobs running across the step.
    let mut jobs = enqueue(&pool, 6, 3000, "across").await;
    heartbeats(&pool, &NODES, 2).await;

    server.step_clock_ahead(STEP).unwrap();
    // Beyond the standbys' next waits, and the 6 s after which a lock wait that does not
    // return used to cost the session.
    heartbeats(&pool, &NODES, 16).await;
    jobs.extend(enqueue(&pool, 6, 1500, "back").await);
    server.step_clock_to_true_time().unwrap();
    heartbeats(&pool, &NODES, 16).await;
    for job in jobs {
        wait_state(&pool, job, JobState::Completed).await;
    }

    let changes = [
        "leader_elected",
        "leader_lost",
        "leader_fenced",
        "leader_released",
        "node_drifted",
        "node_down",
        "node_rejoined",
    ];
    assert_eq!(events_after(&pool, since, &changes).await, []);
    assert_eq!(settled(&pool, 2).await, leaders, "the same tenures");
    assert_eq!(
        lock_sessions(&pool).await,
        sessions,
        "every lock session kept its backend"
    );
    assert_eq!(job_reruns(&pool).await, [], "every job ran once");
    let (missing, doubled, not_run) = tick_gaps(&pool).await;
    let ticks: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT scheduled_at) FROM tick_effects WHERE cron = 'ticks'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        ticks > STEP.as_secs() as i64,
        "the per-second cron ran the {} s the clock jumped over, and more: {ticks} ticks",
        STEP.as_secs()
    );
    let none: [String; 0] = [];
    assert_eq!(missing, none, "ticks of the per-second cron that never ran");
    assert_eq!(doubled, none, "ticks whose effect was written twice");
    assert_eq!(not_run, none, "ticks recorded as anything but a run");
    for node in nodes {
        node.shutdown().await;
    }
}

/// The per-second cron's ticks, judged from its effects and its ledger: the seconds between its
/// first and last effect that have none (missing), the seconds with more than one (doubled),
/// and the ticks the ledger recorded as skipped, abandoned, failed or timed out (not run).
async fn tick_gaps(pool: &PgPool) -> (Vec<String>, Vec<String>, Vec<String>) {
    let missing = sqlx::query_scalar(
        "SELECT s::text FROM generate_series(
             (SELECT min(scheduled_at) FROM tick_effects WHERE cron = 'ticks'),
             (SELECT max(scheduled_at) FROM tick_effects WHERE cron = 'ticks'),
             interval '1 second') AS s
         WHERE NOT EXISTS (SELECT 1 FROM tick_effects
                           WHERE cron = 'ticks' AND scheduled_at = s)",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let doubled = sqlx::query_scalar(
        "SELECT scheduled_at::text FROM tick_effects WHERE cron = 'ticks'
         GROUP BY scheduled_at HAVING count(*) > 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let not_run = sqlx::query_scalar(
        "SELECT scheduled_at::text || ' ' || state FROM forge.cron_ticks
         WHERE cron = 'ticks' AND state NOT IN ('running', 'succeeded')",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    (missing, doubled, not_run)
}

/// Issue 31, item 2: a step of more than down_after right before a new scheduler leader looks
/// at the nodes marks no live node down (the new leader has seen no heartbeat yet, so it waits
/// a full down_after of its own watching), and the step back does not either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_right_before_a_new_scheduler_leader_looks_marks_no_live_node_down() {
    let Some(server) = steppable_server().await else {
        return;
    };
    let (_db, pool, nodes, leaders) = busy_cluster(&server).await;
    let since = last_event(&pool).await;
    let (leader, epoch) = leaders["scheduler"].clone();

    server.step_clock_ahead(DOWN_AFTER * 5).unwrap();
    // The scheduler leader's lock session ends: a standby is granted the role at once and
    // looks at the nodes, all of whose last heartbeats are older than down_after by the
    // stepped clock.
    let ended: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = $1",
    )
    .bind(format!("forge:scheduler:{leader}"))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(ended, 1);
    successor(&pool, "scheduler", epoch, SOON).await;
    // Beyond down_after of the new leader's watching.
    heartbeats(&pool, &NODES, 12).await;
    server.step_clock_to_true_time().unwrap();
    heartbeats(&pool, &NODES, 12).await;

    assert_eq!(
        events_after(
            &pool,
            since,
            &["node_drifted", "node_down", "node_rejoined"]
        )
        .await,
        []
    );
    for node in nodes {
        node.shutdown().await;
    }
}

/// Waits until a tenure of `role` after `epoch` is current: its (node, lock session pid).
async fn successor(pool: &PgPool, role: &str, epoch: i64, within: Duration) -> (String, i32) {
    wait_until(
        &format!("a new leader of {role}"),
        within,
        Duration::from_millis(20),
        || async {
            sqlx::query_as(
                "SELECT node_id, backend_pid FROM forge.leaders l
                  WHERE role = $1 AND epoch > $2 AND forge.tenure_current(l)",
            )
            .bind(role)
            .bind(epoch)
            .fetch_optional(pool)
            .await
            .unwrap()
        },
    )
    .await
    .unwrap()
}

/// Waits until `node` is down; how long after `from`.
async fn down_within(pool: &PgPool, node: &str, from: Instant, bound: Duration) -> Duration {
    wait_until(
        &format!("{node} to be marked down"),
        bound.saturating_sub(from.elapsed()),
        Duration::from_millis(20),
        || async {
            let down: Option<bool> = sqlx::query_scalar(
                "SELECT down_at IS NOT NULL FROM forge.nodes WHERE node_id = $1",
            )
            .bind(node)
            .fetch_optional(pool)
            .await
            .unwrap();
            down.unwrap_or(false).then(|| from.elapsed())
        },
    )
    .await
    .unwrap()
}

/// Issue 31, item 2: a backward step delays the rescue of no frozen or killed node. The nodes'
/// heartbeats were written while the clock was ahead; it steps back (by 90 s) after the watcher
/// saw one node frozen and the other's sessions gone. The frozen one is down within down_after
/// plus two heartbeat intervals of its freezing, the killed one within the grace (a heartbeat
/// interval, at least 1 s) plus two heartbeat intervals of its death.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backward_step_delays_no_rescue_of_a_frozen_or_killed_node() {
    let Some(server) = steppable_server().await else {
        return;
    };
    let (db, pool) = setup(&server).await;
    let dir = ScratchDir::new("clocks");
    std::fs::write(dir.0.join("forge.toml"), clock_toml(db.url())).unwrap();
    let mut config = clock_config(db.url(), "watcher");
    config.node.roles = Some(vec!["scheduler".into()]);
    // (Its work for the role: the built-in membership watch.)
    let watcher = Node::builder(config)
        .auto_register(false)
        .start()
        .await
        .unwrap();
    let frozen = Probe::start(&db, &dir.0, "frozen", &[]).await;
    let mut killed = Probe::start(&db, &dir.0, "killed", &[]).await;
    let ids = ["watcher", "frozen", "killed"];
    heartbeats(&pool, &ids, 2).await;
    server.step_clock_ahead(STEP).unwrap();
    heartbeats(&pool, &ids, 4).await;

    frozen.process.pause().unwrap();
    let frozen_at = Instant::now();
    killed.process.kill().unwrap();
    let killed_at = Instant::now();
    // The watcher has seen both: the frozen one drifted, the killed one's sessions gone.
    wait_until(
        "the watcher to see one node drifted and the other gone",
        SOON,
        Duration::from_millis(20),
        || async {
            let seen: (bool, bool) = sqlx::query_as(
                "SELECT bool_or(node_id = 'frozen' AND drifted_at IS NOT NULL),
                        bool_or(node_id = 'killed' AND session_lost_at IS NOT NULL)
                   FROM forge.nodes",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (seen == (true, true)).then_some(())
        },
    )
    .await
    .unwrap();
    server.step_clock_to_true_time().unwrap();

    let grace = HEARTBEAT.max(Duration::from_secs(1));
    let killed_down = down_within(&pool, "killed", killed_at, grace + HEARTBEAT * 2 + SLACK).await;
    let frozen_down = down_within(
        &pool,
        "frozen",
        frozen_at,
        DOWN_AFTER + HEARTBEAT * 2 + SLACK,
    )
    .await;
    eprintln!(
        "killed: down {killed_down:?} after its death; frozen: {frozen_down:?} after its freeze"
    );
    let reasons: Vec<(String, String)> = sqlx::query_as(
        "SELECT node_id, detail->>'reason' FROM forge.events WHERE kind = 'node_down' ORDER BY node_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        reasons,
        [
            ("frozen".to_owned(), "no_heartbeat".to_owned()),
            ("killed".to_owned(), "session_ended".to_owned())
        ]
    );
    frozen.process.resume().unwrap();
    watcher.shutdown().await;
}

/// A frozen leader while the server's own timers run late (idle_session_timeout would end its
/// session 90 s late): a standby that saw no renewal for a lease ends it, and takes over, on
/// the lock session it waited on, within the lease plus two lock waits of the freeze.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_is_replaced_within_its_lease_while_the_servers_timers_run_late() {
    let Some(server) = steppable_server().await else {
        return;
    };
    let (db, pool) = setup(&server).await;
    let dir = ScratchDir::new("clocks-frozen");
    std::fs::write(dir.0.join("forge.toml"), clock_toml(db.url())).unwrap();
    let mut probes = Vec::new();
    for id in ["p1", "p2", "p3"] {
        probes.push(Probe::start(&db, &dir.0, id, &["scheduler"]).await);
    }
    wait_standby(&pool, "scheduler").await;
    server.step_clock_ahead(STEP).unwrap();
    // Sessions settle under the stepped clock: every standby's wait and the leader's idle
    // timer are now armed by it.
    let ids = ["p1", "p2", "p3"];
    heartbeats(&pool, &ids, 6).await;
    let (leader, epoch): (String, i64) = sqlx::query_as(
        "SELECT node_id, epoch FROM forge.leaders l WHERE role = 'scheduler' AND forge.tenure_current(l)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let standbys: BTreeSet<(String, i32)> = lock_sessions(&pool)
        .await
        .into_iter()
        .filter(|(name, _)| *name != format!("forge:scheduler:{leader}"))
        .collect();
    assert_eq!(standbys.len(), 2, "{standbys:?}");
    let since = last_event(&pool).await;
    let victim = probes.iter().position(|p| p.id == leader).unwrap();
    probes[victim].process.pause().unwrap();
    let frozen_at = Instant::now();

    let (successor, pid) =
        successor(&pool, "scheduler", epoch, LEASE + LOCK_TIMEOUT * 2 + SLACK).await;
    eprintln!("replaced {:?} after the freeze", frozen_at.elapsed());
    assert!(
        standbys.contains(&(format!("forge:scheduler:{successor}"), pid)),
        "the successor took over on the session it waited on: {successor} pid {pid}, standbys {standbys:?}"
    );
    let fenced: Vec<(String, String, Option<String>)> =
        events_after(&pool, since, &["leader_fenced"]).await;
    assert_eq!(
        fenced,
        [(
            "leader_fenced".to_owned(),
            leader.clone(),
            Some("scheduler".to_owned())
        )]
    );
    probes[victim].process.resume().unwrap();
    server.step_clock_to_true_time().unwrap();
}
