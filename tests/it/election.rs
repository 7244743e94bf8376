//! In-process nodes against one database.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use forge::{Error, Node, Role, RoleState};
use forge_testkit::wait_until;

use crate::support::*;

/// Terminates the lock session of `node` for `role`, as an operator (or a network failure)
/// might.
async fn terminate_lock_session(pool: &sqlx::PgPool, role: &Role, node: &str) {
    let terminated: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE application_name = $1 AND datname = current_database()",
    )
    .bind(format!("forge:{}:{}", role.name(), node))
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        terminated,
        [true],
        "exactly one lock session of {role} on {node}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_per_role_among_three_nodes_and_followers_know_it() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    // Whoever wins a role keeps it: spreading them (placement.rs) would start a second epoch.
    let unspread = |id: &str| {
        let mut config = config(db.url(), id);
        config.node.roles = Some(Role::BUILTIN.iter().map(|r| r.name().to_owned()).collect());
        config.cluster.spread = false;
        Node::builder(config).auto_register(false).start()
    };
    let nodes = [
        unspread("a").await.unwrap(),
        unspread("b").await.unwrap(),
        unspread("c").await.unwrap(),
    ];
    let refs: Vec<&Node> = nodes.iter().collect();
    for role in Role::BUILTIN {
        let (leader, epoch) = wait_single_leader(&refs, &role).await;
        assert_eq!(epoch, 1, "first election of {role}");
        let leader_id = nodes[leader].id().to_string();
        let row: (String, i64) =
            sqlx::query_as("SELECT node_id, epoch FROM forge.leaders WHERE role = $1")
                .bind(role.name())
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(row, (leader_id.clone(), 1));
        // Followers learn who leads (from the lock wait's report or the NOTIFY).
        for (i, node) in nodes.iter().enumerate().filter(|(i, _)| *i != leader) {
            let mut watch = node.watch_role(&role).unwrap();
            tokio::time::timeout(SOON, watch.wait_for(|state| {
                matches!(state, RoleState::Follower { leader: Some(info) } if info.node_id == leader_id && info.epoch.0 == 1)
            }))
            .await
            .unwrap_or_else(|_| panic!("node {i} never saw {leader_id} lead {role}: {:?}", node.role_state(&role)))
            .unwrap();
            assert!(node.leadership(&role).is_none());
        }
        assert!(nodes[leader].leadership(&role).unwrap().is_valid());
    }
    for node in &nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_fail_over_independently_when_a_lock_session_is_terminated() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let nodes = [
        start_node(db.url(), "a", &Role::BUILTIN).await,
        start_node(db.url(), "b", &Role::BUILTIN).await,
        start_node(db.url(), "c", &Role::BUILTIN).await,
    ];
    let refs: Vec<&Node> = nodes.iter().collect();
    let mut before = Vec::new();
    for role in Role::BUILTIN {
        before.push(wait_single_leader(&refs, &role).await);
    }
    let (old, _) = before[0];
    let old_leadership = nodes[old].leadership(&Role::SCHEDULER).unwrap();
    terminate_lock_session(&pool, &Role::SCHEDULER, nodes[old].id().as_str()).await;

    let (new, epoch) = wait_until(
        "a new scheduler leader",
        SOON,
        Duration::from_millis(5),
        || async {
            let leaders: Vec<(usize, i64)> = refs
                .iter()
                .enumerate()
                .filter_map(|(i, node)| match node.role_state(&Role::SCHEDULER) {
                    Some(RoleState::Leader { epoch, .. }) if epoch.0 == 2 => Some((i, epoch.0)),
                    _ => None,
                })
                .collect();
            leaders.first().copied()
        },
    )
    .await
    .unwrap();
    assert_eq!(epoch, 2);
    // The deposed leader stops trusting its leadership (it hears the new epoch, or fails to
    // renew) even if it reconnects and then leads again later with a higher epoch.
    wait_until(
        "the old scheduler tenure to end",
        SOON,
        Duration::from_millis(5),
        || async { (!old_leadership.is_valid()).then_some(()) },
    )
    .await
    .unwrap();
    // The other roles did not move.
    for (role, (leader, epoch)) in Role::BUILTIN.iter().zip(&before).skip(1) {
        assert_eq!(*epoch, 1);
        assert!(
            nodes[*leader].role_state(role).unwrap().is_leader(),
            "{role} stayed with node {leader}"
        );
    }
    let history = events(&pool, "scheduler").await;
    assert_eq!(history.len(), 2, "{history:?}");
    assert_eq!(history[1].0, 2);
    assert_eq!(history[1].1, nodes[new].id().to_string());
    assert!(
        history[1].3,
        "a terminated leader is a failover: {history:?}"
    );
    // The deposed leader records its loss, as it saw it, once it reaches the database.
    let old_id = nodes[old].id().to_string();
    let reason: String = wait_until(
        "the deposed leader's leader_lost event",
        SOON,
        Duration::from_millis(10),
        || async {
            sqlx::query_scalar(
                "SELECT detail->>'reason' FROM forge.events
                  WHERE kind = 'leader_lost' AND role = 'scheduler' AND node_id = $1 AND epoch = 1",
            )
            .bind(&old_id)
            .fetch_optional(&pool)
            .await
            .unwrap()
        },
    )
    .await
    .unwrap();
    assert!(
        ["deposed", "deadline", "renewal_failed"].contains(&reason.as_str()),
        "{reason}"
    );
    for node in &nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_hands_over_without_a_failover() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let a = start_node(db.url(), "a", &[Role::SCHEDULER]).await;
    let (leader, _) = wait_single_leader(&[&a], &Role::SCHEDULER).await;
    assert_eq!(leader, 0);
    let b = start_node(db.url(), "b", &[Role::SCHEDULER]).await;
    let mut b_state = b.watch_role(&Role::SCHEDULER).unwrap();
    tokio::time::timeout(
        SOON,
        b_state.wait_for(|s| matches!(s, RoleState::Follower { leader: Some(_) })),
    )
    .await
    .unwrap()
    .unwrap();

    a.shutdown().await;
    assert_eq!(a.role_state(&Role::SCHEDULER), Some(RoleState::Stopped));
    tokio::time::timeout(SOON, b_state.wait_for(RoleState::is_leader))
        .await
        .expect("b takes over after a's handoff")
        .unwrap();
    let history = events(&pool, "scheduler").await;
    let kinds: Vec<(i64, &str, &str, bool)> = history
        .iter()
        .map(|(epoch, node, event, failover)| (*epoch, node.as_str(), event.as_str(), *failover))
        .collect();
    assert_eq!(
        kinds,
        [
            (1, "a", "elected", false),
            (1, "a", "released", false),
            (2, "b", "elected", false)
        ]
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_work_is_cancelled_when_leadership_is_lost_and_fenced_writes_are_refused() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    sqlx::query("CREATE TABLE ledger (epoch bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();

    // Node a's leader task records when it starts and when it is dropped.
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    struct Dropped(Arc<Mutex<Vec<String>>>, i64);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.lock().unwrap().push(format!("dropped {}", self.1));
        }
    }
    let task_log = log.clone();
    let mut config = config(db.url(), "a");
    config.node.roles = Some(vec!["scheduler".into()]);
    let a = Node::builder(config)
        .leader_task(Role::SCHEDULER, "recorder", move |leadership| {
            let log = task_log.clone();
            async move {
                let epoch = leadership.epoch().0;
                log.lock().unwrap().push(format!("started {epoch}"));
                let _guard = Dropped(log.clone(), epoch);
                std::future::pending::<()>().await;
            }
        })
        .start()
        .await
        .unwrap();
    wait_single_leader(&[&a], &Role::SCHEDULER).await;
    let old = a.leadership(&Role::SCHEDULER).unwrap();
    let token = old.fence_token();
    // A fenced write works while a leads.
    let mut tx = old.fenced_transaction().await.unwrap();
    sqlx::query("INSERT INTO ledger VALUES ($1)")
        .bind(old.epoch().0)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let b = start_node(db.url(), "b", &[Role::SCHEDULER]).await;
    terminate_lock_session(&pool, &Role::SCHEDULER, "a").await;
    wait_until("b to lead", SOON, Duration::from_millis(5), || async {
        matches!(
            b.role_state(&Role::SCHEDULER),
            Some(RoleState::Leader { .. })
        )
        .then_some(())
    })
    .await
    .unwrap();
    wait_until(
        "a's leader task to be dropped",
        SOON,
        Duration::from_millis(5),
        || async {
            log.lock()
                .unwrap()
                .contains(&"dropped 1".to_owned())
                .then_some(())
        },
    )
    .await
    .unwrap();
    assert!(!old.is_valid());

    // The deposed leadership can no longer write: locally refused...
    assert!(matches!(
        old.fenced_transaction().await,
        Err(Error::Fenced {
            epoch: forge::Epoch(1),
            ..
        })
    ));
    // ...and refused by PostgreSQL for anyone holding its token.
    let mut tx = pool.begin().await.unwrap();
    let checked = token.check(&mut tx).await;
    assert!(
        matches!(
            checked,
            Err(Error::Fenced {
                epoch: forge::Epoch(1),
                ..
            })
        ),
        "{checked:?}"
    );
    drop(tx);
    let new = b.leadership(&Role::SCHEDULER).unwrap();
    let mut tx = pool.begin().await.unwrap();
    new.fence_token().check(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    let epochs: Vec<i64> = sqlx::query_scalar("SELECT epoch FROM ledger")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(epochs, [1]);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_strictly_increase_over_repeated_takeovers() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let nodes = [
        start_node(db.url(), "a", &[Role::LOG_COMPACTOR]).await,
        start_node(db.url(), "b", &[Role::LOG_COMPACTOR]).await,
    ];
    let refs: Vec<&Node> = nodes.iter().collect();
    let mut last = 0;
    for round in 0..6 {
        let (leader, epoch) = wait_until(
            "a leader with a new epoch",
            SOON,
            Duration::from_millis(5),
            || async {
                let leaders: Vec<(usize, i64)> = refs
                    .iter()
                    .enumerate()
                    .filter_map(|(i, node)| match node.role_state(&Role::LOG_COMPACTOR) {
                        Some(RoleState::Leader { epoch, .. }) if epoch.0 > last => {
                            Some((i, epoch.0))
                        }
                        _ => None,
                    })
                    .collect();
                (leaders.len() == 1).then(|| leaders[0])
            },
        )
        .await
        .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(epoch > last);
        last = epoch;
        terminate_lock_session(&pool, &Role::LOG_COMPACTOR, nodes[leader].id().as_str()).await;
    }
    let epochs: Vec<i64> = events(&pool, "log_compactor")
        .await
        .into_iter()
        .filter(|e| e.2 == "elected")
        .map(|e| e.0)
        .collect();
    assert!(epochs.windows(2).all(|w| w[1] == w[0] + 1), "{epochs:?}");
    for node in &nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_campaigns_only_for_roles_it_has_work_for() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    // [node] roles lists the scheduler alone: the other roles' work is left to other nodes.
    let node = start_node(db.url(), "a", &[Role::SCHEDULER]).await;
    assert_eq!(node.roles(), [Role::SCHEDULER]);
    wait_single_leader(&[&node], &Role::SCHEDULER).await;
    node.shutdown().await;

    // [node] roles unset: every role with work, and the built-in roles always have the core's
    // duties.
    let standby = Node::builder(config(db.url(), "standby"))
        .auto_register(false)
        .start()
        .await
        .unwrap();
    let mut roles = standby.roles();
    roles.sort();
    let mut all = Role::BUILTIN.to_vec();
    all.sort();
    assert_eq!(roles, all);
    for role in Role::BUILTIN {
        wait_single_leader(&[&standby], &role).await;
    }
    standby.shutdown().await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM forge.leaders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 3);

    // A listed role without work is not campaigned for, unless campaign_without_work.
    let reports = Role::new("reports").unwrap();
    let mut listed = config(db.url(), "b");
    listed.node.roles = Some(vec!["scheduler".into(), "reports".into()]);
    let node = Node::builder(listed.clone())
        .auto_register(false)
        .start()
        .await
        .unwrap();
    assert_eq!(node.roles(), [Role::SCHEDULER]);
    node.shutdown().await;
    listed.node.campaign_without_work = true;
    let node = Node::builder(listed)
        .auto_register(false)
        .start()
        .await
        .unwrap();
    assert_eq!(node.roles(), [reports.clone(), Role::SCHEDULER]);
    wait_single_leader(&[&node], &reports).await;
    node.shutdown().await;

    // A user-defined role has its own key and campaigns like the built-in ones.
    let node = start_node(db.url(), "c", std::slice::from_ref(&reports)).await;
    wait_single_leader(&[&node], &reports).await;
    let key: i64 = sqlx::query_scalar("SELECT lock_key FROM forge.leaders WHERE role = 'reports'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(key, reports.lock_key(&forge::LockNamespace::default()).0);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_waited_longer_than_the_lease_keeps_the_leadership_it_wins() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let a = start_node(db.url(), "a", &[Role::SCHEDULER]).await;
    wait_single_leader(&[&a], &Role::SCHEDULER).await;
    // b's lock waits last longer than the lease.
    let mut config = config(db.url(), "b");
    config.node.roles = Some(vec!["scheduler".into()]);
    config.cluster.leader_election.lock_timeout = Duration::from_secs(6);
    let b = Node::builder(config)
        .leader_task(
            Role::SCHEDULER,
            "idle",
            |l| async move { l.stopping().await },
        )
        .start()
        .await
        .unwrap();
    wait_until(
        "b to wait in the lock for longer than the lease",
        SOON,
        Duration::from_millis(20),
        || async {
            let waited: Option<bool> = sqlx::query_scalar(
                "SELECT now() - query_start > interval '2.5 seconds' FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = 'forge:scheduler:b' AND wait_event_type = 'Lock'",
            )
            .fetch_optional(&pool)
            .await
            .unwrap();
            (waited == Some(true)).then_some(())
        },
    )
    .await
    .unwrap();
    a.shutdown().await;
    let (_, epoch) = wait_single_leader(&[&b], &Role::SCHEDULER).await;
    // It renews and keeps leading past the point where trust based on the old wait would end.
    wait_until("b to renew its lease twice", SOON, Duration::from_millis(20), || async {
        let renewed: bool = sqlx::query_scalar(
            "SELECT renewed_at > acquired_at + interval '1 second' FROM forge.leaders WHERE role = 'scheduler'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        renewed.then_some(())
    })
    .await
    .unwrap();
    assert_eq!(
        b.role_state(&Role::SCHEDULER),
        Some(RoleState::Leader {
            epoch: forge::Epoch(epoch),
            since: match b.role_state(&Role::SCHEDULER) {
                Some(RoleState::Leader { since, .. }) => since,
                other => panic!("{other:?}"),
            }
        })
    );
    assert!(b.leadership(&Role::SCHEDULER).unwrap().is_valid());
    b.shutdown().await;
}

/// The lock sessions of `role` in this database: (node id, waiting for the lock).
async fn lock_sessions(pool: &sqlx::PgPool, role: &Role) -> Vec<(String, bool)> {
    let key = role.lock_key(&forge::LockNamespace::default()).0;
    sqlx::query_as(
        "SELECT split_part(a.application_name, ':', 3),
                EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory'
                           AND NOT l.granted AND l.objsubid = 1
                           AND l.classid = (($1 >> 32) & 4294967295)::oid
                           AND l.objid = ($1 & 4294967295)::oid)
           FROM pg_stat_activity a
          WHERE a.application_name LIKE 'forge:' || $2 || ':%' AND a.datname = current_database()
          ORDER BY 1",
    )
    .bind(key)
    .bind(role.name())
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_standbys_wait_in_the_lock_and_a_reserve_takes_a_missing_standbys_place() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let billing = Role::new("billing").unwrap();
    let mut nodes = Vec::new();
    for id in ["a", "b", "c", "d", "e"] {
        let mut config = config(db.url(), id);
        config.node.roles = Some(vec!["billing".into()]);
        config.cluster.leader_election.standbys = 1;
        let node = Node::builder(config)
            .auto_register(false)
            .leader_task(billing.clone(), "idle", |leadership| async move {
                leadership.stopping().await;
            })
            .start()
            .await
            .unwrap();
        nodes.push(node);
    }
    // Five nodes, one leader, one standby: two lock sessions for the role, one of them waiting.
    // The three reserves hold none (and still know the leader).
    let settled = |pool: sqlx::PgPool, billing: Role| async move {
        wait_until(
            "one leader and one standby, no other lock session",
            SOON,
            Duration::from_millis(20),
            || async {
                let sessions = lock_sessions(&pool, &billing).await;
                let waiting: Vec<String> = sessions
                    .iter()
                    .filter(|(_, w)| *w)
                    .map(|(n, _)| n.clone())
                    .collect();
                (sessions.len() == 2 && waiting.len() == 1).then(|| waiting[0].clone())
            },
        )
        .await
        .unwrap()
    };
    let standby = settled(pool.clone(), billing.clone()).await;
    let refs: Vec<&Node> = nodes.iter().collect();
    let (leader, _) = wait_single_leader(&refs, &billing).await;
    let leader_id = nodes[leader].id().to_string();
    for node in nodes.iter().filter(|n| n.id().as_str() != leader_id) {
        let mut watch = node.watch_role(&billing).unwrap();
        tokio::time::timeout(
            SOON,
            watch.wait_for(
                |s| matches!(s, RoleState::Follower { leader: Some(l) } if l.node_id == leader_id),
            ),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{} does not know the leader: {:?}",
                node.id(),
                node.role_state(&billing)
            )
        })
        .unwrap();
    }

    // The leader leaves: the standby takes over at once, and a reserve takes the standby's
    // place (its node session's heartbeat finds the role short of a standby).
    let leaving = nodes.remove(leader);
    leaving.shutdown().await;
    let refs: Vec<&Node> = nodes.iter().collect();
    let (new_leader, _) = wait_single_leader(&refs, &billing).await;
    assert_eq!(
        nodes[new_leader].id().as_str(),
        standby,
        "the standby took over"
    );
    let next_standby = settled(pool.clone(), billing.clone()).await;
    assert_ne!(next_standby, standby);
    assert_ne!(next_standby, leader_id);

    // The standby dies (its lock session ends): a reserve - or the same node, reconnecting -
    // waits in its place; never more than one.
    terminate_lock_session(&pool, &billing, &next_standby).await;
    settled(pool.clone(), billing.clone()).await;
    for node in &nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_runs_its_duties_on_its_lock_sessions_and_holds_no_pool_connection() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let mut config = config(db.url(), "solo");
    config.node.roles = Some(Role::BUILTIN.iter().map(|r| r.name().to_owned()).collect());
    config.cluster.compaction_interval = Duration::from_secs(1);
    config.metrics.rollup_interval = Duration::from_secs(1);
    let node = Node::builder(config)
        .auto_register(false)
        .start()
        .await
        .unwrap();
    let refs = [&node];
    for role in Role::BUILTIN {
        wait_single_leader(&refs, &role).await;
    }
    // Every duty has run a few times: the membership watch (each heartbeat), the compactor
    // and the rollup (each second: the rollup moves its cursor), the node gauges.
    let mut rollups = Vec::new();
    while rollups.len() < 3 {
        let after = rollups.last().copied().unwrap_or_else(chrono::Utc::now);
        let at = wait_until(
            "a rollup by the aggregator",
            SOON,
            Duration::from_millis(50),
            || async {
                let at: Option<chrono::DateTime<chrono::Utc>> =
                    sqlx::query_scalar("SELECT at FROM forge.stats_cursor WHERE node_id = 'solo'")
                        .fetch_optional(&pool)
                        .await
                        .unwrap();
                at.filter(|at| *at > after)
            },
        )
        .await
        .unwrap();
        rollups.push(at);
    }
    assert!(
        node.render_metrics()
            .contains("forge_compactor_pruned_total{table=\"events\"}"),
        "the compactor ran"
    );
    // The node's connections: three lock sessions and its node session, no pool connection.
    let sessions: Vec<String> = sqlx::query_scalar(
        "SELECT application_name FROM pg_stat_activity
          WHERE datname = current_database() AND application_name LIKE 'forge:%:solo'
          ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        sessions,
        [
            "forge:log_compactor:solo",
            "forge:metrics_aggregator:solo",
            "forge:node:solo",
            "forge:scheduler:solo"
        ],
        "an idle leader of every built-in role holds its lock sessions and node session only"
    );
    node.shutdown().await;
}
