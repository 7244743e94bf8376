//! Production faults at the edges of the promise: database restarts and primary failover,
//! drains longer than the lease, half-open node sessions, duplicate node ids, undecodable
//! rows, starved pools, cancels racing a shutdown, and rescues of attempts never started.

use std::time::Duration;

use chrono::{DateTime, Utc};
use forge::jobs::{JobId, JobState, NewJob};
use forge::{Config, Error, Node, Role};
use forge_testkit::{Filter, PgOptions, PgProxy, PgServer, TestDatabase, wait_until};
use sqlx::PgPool;

use crate::jobs::{Behave, RUNS_TABLE_SQL, job_config, plain, setup, wait_state};
use crate::support::*;

/// Keeps a fault in place for `d`. (The length of the fault is the experiment; nothing waits
/// on it for something to be ready.)
async fn fault_window(d: Duration) {
    tokio::time::sleep(d).await;
}

async fn jobs_node(config: Config) -> Node {
    Node::builder(config)
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .expect("node starts")
}

/// Terminates the sessions named `application_name`; how many there were.
async fn terminate_sessions(pool: &PgPool, application_name: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = $1",
    )
    .bind(application_name)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn wait_leads(pool: &PgPool, role: &str, node: &str) -> i64 {
    wait_until(
        &format!("{node} to lead {role}"),
        SOON,
        Duration::from_millis(10),
        || async {
            let row: Option<(String, i64)> = sqlx::query_as(
                "SELECT node_id, epoch FROM forge.leaders WHERE role = $1 AND released_at IS NULL",
            )
            .bind(role)
            .fetch_optional(pool)
            .await
            .ok()
            .flatten();
            row.filter(|(leader, _)| leader == node).map(|(_, e)| e)
        },
    )
    .await
    .unwrap()
}

/// Waits until the job's handler runs on `node`.
async fn wait_running_on(pool: &PgPool, id: JobId, node: &str) {
    wait_until(
        &format!("job {id} to run on {node}"),
        SOON,
        Duration::from_millis(10),
        || async {
            let on: Option<String> = sqlx::query_scalar(
                "SELECT node FROM job_runs WHERE job_id = $1 AND finished_at IS NULL",
            )
            .bind(id)
            .fetch_optional(pool)
            .await
            .ok()
            .flatten();
            (on.as_deref() == Some(node)).then_some(())
        },
    )
    .await
    .unwrap();
}

async fn node_down_events(pool: &PgPool) -> Vec<(String, serde_json::Value)> {
    sqlx::query_as("SELECT node_id, detail FROM forge.events WHERE kind = 'node_down'")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_node_with_the_same_id_is_refused() {
    let (db, _pool) = setup().await;
    let first = jobs_node(job_config(db.url(), "twin")).await;
    let err = Node::builder(job_config(db.url(), "twin"))
        .auto_register(false)
        .start()
        .await
        .err()
        .expect("the second node is refused");
    assert!(matches!(err, Error::DuplicateNode { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("another live node already uses the node id `twin`")
            && message.contains("forge:node:twin")
            && message.contains("FORGE_NODE_ID"),
        "{message}"
    );
    first.shutdown().await;
    // Once the first is gone, the id is free again.
    let again = jobs_node(job_config(db.url(), "twin")).await;
    again.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_that_takes_the_id_while_a_node_reconnects_stops_that_node() {
    let server = PgServer::shared().unwrap();
    let (db, pool) = setup().await;
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let first = jobs_node(job_config(&proxy.url_for(server, db.name()), "twin")).await;
    let first_incarnation: i64 =
        sqlx::query_scalar("SELECT incarnation FROM forge.nodes WHERE node_id = 'twin'")
            .fetch_one(&pool)
            .await
            .unwrap();
    // The first node's session goes silent; the server ends it after down_after (its
    // idle_session_timeout), and a second node with the same id, started meanwhile (host
    // networking: one HOSTNAME), gets the id's lock.
    assert_eq!(
        proxy.blackhole(Filter::application_prefix("forge:node:twin")),
        1
    );
    let second = jobs_node(job_config(db.url(), "twin")).await;
    proxy.heal_all();
    // The first node, reconnecting, finds the id taken: it stops its work and says why.
    let stopped = tokio::time::timeout(SOON, first.run_until_signal())
        .await
        .expect("the first node stops on its own");
    let err = stopped.expect_err("the first node reports why it stopped");
    assert!(matches!(err, Error::DuplicateNode { .. }), "{err:?}");
    assert_eq!(
        first.role_state(&Role::SCHEDULER),
        Some(forge::RoleState::Stopped)
    );
    // The second node is the one the cluster sees, and it was not marked stopped by the first
    // node's shutdown.
    let (incarnation, stopped_at): (i64, Option<DateTime<Utc>>) =
        sqlx::query_as("SELECT incarnation, stopped_at FROM forge.nodes WHERE node_id = 'twin'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_ne!(incarnation, first_incarnation);
    assert_eq!(stopped_at, None);
    let id = client(&pool)
        .enqueue(plain, Behave::tag("after the twin"))
        .await
        .unwrap()
        .id();
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(job.attempt, 1, "{job:?}");
    second.shutdown().await;
}

/// A lossy failover can leave a job `running` on a live node that finished it: its completion
/// committed on the old primary only. The node's worker, idle by then, must still check its
/// jobs when its node session comes back, and rescue the one it does not run. (Found by the
/// soak, seed 1795580930584794114: two jobs stuck `running` on a live node for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_rescues_a_job_left_running_on_it_when_its_session_comes_back() {
    let (db, pool) = setup().await;
    let node = jobs_node(job_config(db.url(), "a")).await;
    let id = node
        .jobs()
        .enqueue(plain, Behave::tag("once"))
        .await
        .unwrap()
        .id();
    wait_state(&pool, id, JobState::Completed).await;
    // What the new primary would hold: the claim, without the completion.
    sqlx::query("UPDATE forge.jobs SET state = 'running', finished_at = NULL WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    // (Two while a session the node replaced, on a slow machine, is still closing.)
    let ended = terminate_sessions(&pool, "forge:node:a").await;
    assert!(ended >= 1, "the node session of a ended: {ended}");
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(job.attempt, 2, "run again after the rescue: {job:?}");
    assert!(
        job.errors
            .iter()
            .any(|e| e.reason == "rescued" && e.error.contains("not running there")),
        "{:?}",
        job.errors
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_does_not_rescue_the_jobs_of_live_nodes() {
    restart_does_not_rescue_live_nodes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_does_not_rescue_the_jobs_of_live_nodes() {
    restart_does_not_rescue_live_nodes(true).await;
}

/// A job runs on node b while PostgreSQL is down longer than down_after (stopped, or crashed
/// with `-m immediate` and crash recovery); then nobody rescues it.
async fn restart_does_not_rescue_live_nodes(crash: bool) {
    let server = tokio::task::spawn_blocking(PgServer::start)
        .await
        .unwrap()
        .unwrap();
    let db = server.create_database().await.unwrap();
    let pool = db.pool().await.unwrap();
    sqlx::raw_sql(RUNS_TABLE_SQL).execute(&pool).await.unwrap();
    // b works the job; a leads the scheduler role (and so decides about rescues).
    let mut a_config = job_config(db.url(), "a");
    a_config.node.queues = Some(vec![]);
    let a = jobs_node(a_config).await;
    wait_leads(&pool, "scheduler", "a").await;
    let mut b_config = job_config(db.url(), "b");
    b_config.node.roles = Some(vec![]);
    let b = jobs_node(b_config).await;
    let id = b
        .jobs()
        .enqueue(
            plain,
            Behave {
                sleep_ms: 12_000,
                sleep_on_node: Some("b".into()),
                ..Behave::tag("long")
            },
        )
        .await
        .unwrap()
        .id();
    wait_running_on(&pool, id, "b").await;
    // PostgreSQL is down for longer than down_after (3 s); then every node has to reconnect.
    drop(pool);
    if crash {
        tokio::task::block_in_place(|| server.kill_immediate()).unwrap();
    } else {
        tokio::task::block_in_place(|| server.stop()).unwrap();
    }
    fault_window(Duration::from_secs(4)).await;
    tokio::task::block_in_place(|| server.start_again()).unwrap();
    let pool = db.pool().await.unwrap();
    wait_leads(&pool, "scheduler", "a").await;
    // Longer than down_after after the restart: b reconnected and heartbeats; nothing is
    // rescued from it.
    fault_window(Duration::from_secs(4)).await;
    assert_eq!(node_down_events(&pool).await, [], "no node marked down");
    let job = client(&pool).get(id).await.unwrap().unwrap();
    assert_eq!(
        (job.state, job.attempt, job.node_id.as_deref()),
        (JobState::Running, 1, Some("b")),
        "{job:?}"
    );
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(job.attempt, 1, "{job:?}");
    assert!(job.errors.is_empty(), "{:?}", job.errors);
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_longer_than_the_lease_never_overlaps_the_next_leader() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    sqlx::query(
        "CREATE TABLE drain_log (node text, what text, at timestamptz DEFAULT clock_timestamp())",
    )
    .execute(&pool)
    .await
    .unwrap();
    let billing = Role::new("billing").unwrap();
    let node = |id: &'static str| {
        let mut config = config(db.url(), id);
        config.node.roles = Some(vec!["billing".into()]);
        // Lease 2 s; the drain takes 3.5 s.
        config.cluster.leader_election.drain_timeout = Duration::from_secs(6);
        let pool = pool.clone();
        Node::builder(config)
            .auto_register(false)
            .leader_task(billing.clone(), "slow-drain", move |leadership| {
                let pool = pool.clone();
                async move {
                    leadership.stopping().await;
                    let log = |what: &'static str| {
                        sqlx::query("INSERT INTO drain_log (node, what) VALUES ($1, $2)")
                            .bind(id)
                            .bind(what)
                            .execute(&pool)
                    };
                    log("drain_started").await.unwrap();
                    // The last unit of leader-only work, longer than the lease.
                    tokio::time::sleep(Duration::from_millis(3500)).await;
                    log("drain_done").await.unwrap();
                }
            })
            .start()
    };
    let a = node("a").await.unwrap();
    wait_leads(&pool, "billing", "a").await;
    let b = node("b").await.unwrap();
    a.shutdown().await;
    wait_leads(&pool, "billing", "b").await;
    let drained: DateTime<Utc> =
        sqlx::query_scalar("SELECT at FROM drain_log WHERE node = 'a' AND what = 'drain_done'")
            .fetch_one(&pool)
            .await
            .unwrap();
    let (elected, failover): (DateTime<Utc>, bool) = sqlx::query_as(
        "SELECT at, (detail->>'failover')::boolean FROM forge.events
          WHERE kind = 'leader_elected' AND role = 'billing' AND node_id = 'b'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        elected >= drained,
        "b was elected at {elected}, before a finished draining at {drained}"
    );
    assert!(
        !failover,
        "a handed over; b did not take over from a lost lease"
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_node_session_is_replaced_and_jobs_still_run_meanwhile() {
    let server = PgServer::shared().unwrap();
    let (db, pool) = setup().await;
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let node = jobs_node(job_config(&proxy.url_for(server, db.name()), "a")).await;
    wait_leads(&pool, "scheduler", "a").await;
    // The node session (LISTEN, heartbeat) goes silent: no error, no data, ever.
    let silenced = proxy.blackhole(Filter::application_prefix("forge:node:a"));
    assert_eq!(silenced, 1);
    let id = client(&pool)
        .enqueue(plain, Behave::tag("while deaf"))
        .await
        .unwrap()
        .id();
    // No notification reaches the node; its workers poll, and the job runs.
    let job = wait_state(&pool, id, JobState::Completed).await;
    assert_eq!(job.node_id.as_deref(), Some("a"));
    // The node noticed (its heartbeat went unanswered) and keeps trying a new node session;
    // once the network heals, it is back and heartbeating.
    proxy.heal_all();
    let healed = Utc::now();
    wait_until(
        "the node session to be back",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            let (heartbeat, down): (DateTime<Utc>, Option<DateTime<Utc>>) =
                sqlx::query_as("SELECT heartbeat_at, down_at FROM forge.nodes WHERE node_id = 'a'")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            (heartbeat > healed && down.is_none()).then_some(())
        },
    )
    .await
    .unwrap();
    let id = client(&pool)
        .enqueue(plain, Behave::tag("heard again"))
        .await
        .unwrap()
        .id();
    wait_state(&pool, id, JobState::Completed).await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_row_that_cannot_be_decoded_is_dead_lettered_and_its_batch_runs() {
    let (db, pool) = setup().await;
    // Arguments nested deeper than the decoder accepts, claimed in one batch with good jobs.
    let deep: i64 = sqlx::query_scalar(
        "INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at)
         VALUES ('forge', 'default', 'plain', (repeat('[', 300) || repeat(']', 300))::jsonb,
                 'available', clock_timestamp())
         RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let jobs = client(&pool);
    let good: Vec<JobId> = jobs
        .enqueue_many((0..3).map(|i| NewJob::new(plain, Behave::tag(format!("good {i}")))))
        .await
        .unwrap()
        .iter()
        .map(|e| e.id())
        .collect();
    let node = jobs_node(job_config(db.url(), "a")).await;
    let dead = wait_state(&pool, JobId(deep), JobState::Dead).await;
    assert_eq!(dead.errors.len(), 1, "{:?}", dead.errors);
    assert!(
        dead.errors[0].error.contains("cannot be decoded"),
        "{:?}",
        dead.errors
    );
    for id in good {
        wait_state(&pool, id, JobState::Completed).await;
    }
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_holding_every_pool_connection_do_not_get_their_node_marked_down() {
    let (db, pool) = setup().await;
    // b leads the scheduler role (it decides about rescues) and works no queue; a works the
    // jobs with a small pool.
    let mut b_config = job_config(db.url(), "b");
    b_config.node.queues = Some(vec![]);
    let b = jobs_node(b_config).await;
    wait_leads(&pool, "scheduler", "b").await;
    let mut a_config = job_config(db.url(), "a");
    a_config.node.roles = Some(vec![]);
    // The worker keeps one connection for its round trips; the two jobs take the others.
    a_config.database.max_connections = 3;
    let a = jobs_node(a_config).await;
    // Every connection is held for 5 s, longer than down_after (3 s).
    let hogs: Vec<JobId> = a
        .jobs()
        .enqueue_many((0..2).map(|i| {
            NewJob::new(
                plain,
                Behave {
                    sleep_ms: 5000,
                    sleep_on_node: Some("a".into()),
                    hold_connection: true,
                    ..Behave::tag(format!("hog {i}"))
                },
            )
        }))
        .await
        .unwrap()
        .iter()
        .map(|e| e.id())
        .collect();
    for id in &hogs {
        wait_running_on(&pool, *id, "a").await;
    }
    for id in hogs {
        let job = wait_state(&pool, id, JobState::Completed).await;
        assert_eq!(
            (job.attempt, job.node_id.as_deref()),
            (1, Some("a")),
            "{job:?}"
        );
        assert!(job.errors.is_empty(), "{:?}", job.errors);
    }
    assert_eq!(node_down_events(&pool).await, [], "a was never marked down");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_requested_while_a_job_is_released_at_shutdown_is_kept() {
    let (db, pool) = setup().await;
    let mut config = job_config(db.url(), "a");
    config.jobs.drain_timeout = Duration::from_millis(300);
    let node = jobs_node(config).await;
    let id = node
        .jobs()
        .enqueue(
            plain,
            Behave {
                sleep_ms: 60_000,
                ..Behave::tag("long")
            },
        )
        .await
        .unwrap()
        .id();
    wait_running_on(&pool, id, "a").await;
    // The cancel request lands but its notification does not reach the node before it stops.
    sqlx::query("UPDATE forge.jobs SET cancel_requested = true WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    node.shutdown().await;
    let job = client(&pool).get(id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Cancelled, "{job:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescued_attempt_that_never_started_does_not_count() {
    let (db, pool) = setup().await;
    // A node marked down held a job it had claimed ahead and not started, on its last attempt.
    sqlx::query(
        "INSERT INTO forge.nodes (namespace, node_id, started_at, heartbeat_at, down_at, down_reason)
         VALUES ('forge', 'ghost', now(), now(), now(), 'test')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO forge.jobs (namespace, queue, kind, args, state, run_at, attempt,
                                 max_attempts, node_id, attempted_at, started_at)
         VALUES ('forge', 'default', 'plain', '{\"tag\": \"ahead\"}', 'running', now(), 1, 1,
                 'ghost', now(), NULL)
         RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let node = jobs_node(job_config(db.url(), "a")).await;
    let job = wait_state(&pool, JobId(id), JobState::Completed).await;
    assert_eq!(
        (job.attempt, job.node_id.as_deref()),
        (2, Some("a")),
        "{job:?}"
    );
    assert!(
        job.errors[0].error.contains("had not started"),
        "{:?}",
        job.errors
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_that_missed_the_last_election_accepts_no_stale_write() {
    // A primary with an asynchronous streaming standby; the nodes reach PostgreSQL through
    // one address (a proxy) that moves to the standby when it is promoted.
    let primary =
        tokio::task::spawn_blocking(|| PgServer::start_with(PgOptions::default().durable(true)))
            .await
            .unwrap()
            .unwrap();
    let db: TestDatabase = primary.create_database().await.unwrap();
    let replication = PgProxy::start(primary.host(), primary.port()).unwrap();
    let standby =
        tokio::task::block_in_place(|| primary.start_standby(Some(&replication))).unwrap();
    let address = PgProxy::start(primary.host(), primary.port()).unwrap();
    let url = address.url_for(&primary, db.name());
    let on_primary = db.pool().await.unwrap();
    let node = |id: &str| {
        Node::builder(config(&url, id))
            .auto_register(false)
            .leader_task(
                Role::SCHEDULER,
                "idle",
                |l| async move { l.stopping().await },
            )
            .start()
    };
    let a = node("a").await.unwrap();
    assert_eq!(wait_leads(&on_primary, "scheduler", "a").await, 1);
    let first = wait_until(
        "a to hold its tenure",
        SOON,
        Duration::from_millis(5),
        || async { a.leadership(&Role::SCHEDULER).map(|l| l.fence_token()) },
    )
    .await
    .unwrap();
    let b = node("b").await.unwrap();
    // The standby has everything so far; then replication stalls.
    primary.wait_caught_up(&standby, SOON).await.unwrap();
    replication.blackhole(Filter::All);
    // A new election on the primary only: b leads at epoch 2.
    assert_eq!(
        terminate_sessions(&on_primary, "forge:scheduler:a").await,
        1
    );
    assert_eq!(wait_leads(&on_primary, "scheduler", "b").await, 2);
    // (The database row is written by the campaign just before the node takes the tenure.)
    let stale = wait_until(
        "b to hold its tenure",
        SOON,
        Duration::from_millis(5),
        || async { b.leadership(&Role::SCHEDULER).map(|l| l.fence_token()) },
    )
    .await
    .unwrap();
    drop(on_primary);
    // Failover: promote the standby (it never saw epoch 2), move the address, kill the old
    // primary.
    let failed_over = tokio::time::Instant::now();
    tokio::task::block_in_place(|| standby.promote()).unwrap();
    address.retarget(standby.host(), standby.port());
    tokio::task::block_in_place(|| primary.kill_immediate()).unwrap();
    let on_standby = sqlx::PgPool::connect(&standby.url_for(db.name()))
        .await
        .unwrap();
    // Leadership is re-established on the new primary within seconds, at epoch 2 again. (Until
    // then the standby still shows a's first tenure, whose lease it never saw end.)
    let epoch: i64 = wait_until(
        "a leader on the new primary",
        SOON,
        Duration::from_millis(20),
        || async {
            sqlx::query_scalar(
                "SELECT epoch FROM forge.leaders WHERE role = 'scheduler' AND released_at IS NULL
                    AND lease_until > clock_timestamp() AND tenure <> ALL ($1)",
            )
            .bind([first.tenure, stale.tenure])
            .fetch_optional(&on_standby)
            .await
            .ok()
            .flatten()
        },
    )
    .await
    .unwrap();
    assert_eq!(epoch, 2, "the standby hands out epoch 2 a second time");
    println!(
        "leadership re-established on the promoted standby {:?} after the promotion",
        failed_over.elapsed()
    );
    // The deposed leader's token names the same epoch, but not the same tenure: refused.
    let mut tx = on_standby.begin().await.unwrap();
    let refused = stale.check(&mut tx).await;
    assert!(matches!(refused, Err(Error::Fenced { .. })), "{refused:?}");
    drop(tx);
    a.shutdown().await;
    b.shutdown().await;
}
