//! Leadership placement: roles spread across the nodes (each leads at most its share, moved by
//! graceful handoffs to a named standby, one at a time, without flapping), a node that prefers
//! a role takes it over, and `[cluster] spread = false` keeps whatever each node won.

use std::collections::BTreeMap;
use std::time::Duration;

use forge::Node;
use forge_testkit::wait_until;
use sqlx::PgPool;

use crate::support::*;

/// Watches the cluster for `d`: what happens meanwhile is the experiment (no move, say).
async fn observe(d: Duration) {
    tokio::time::sleep(d).await;
}

/// Who leads what: node -> roles.
async fn leads(pool: &PgPool) -> BTreeMap<String, Vec<String>> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT node_id, role FROM forge.leaders
          WHERE released_at IS NULL AND lease_until > now() ORDER BY role",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (node, role) in rows {
        by_node.entry(node).or_default().push(role);
    }
    by_node
}

/// The placement moves so far: (role, from, to, why).
async fn moves(pool: &PgPool) -> Vec<(String, String, String, String)> {
    sqlx::query_as(
        "SELECT role, node_id, detail->>'to', detail->>'why' FROM forge.events
          WHERE kind = 'leader_rebalanced' ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn builtin_node(url: &str, id: &str, configure: impl FnOnce(&mut forge::Config)) -> Node {
    let mut config = config(url, id);
    configure(&mut config);
    Node::builder(config)
        .auto_register(false)
        .start()
        .await
        .expect("node starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_spread_three_roles_one_each_and_stay_put() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let (a, b, c) = tokio::join!(
        builtin_node(db.url(), "a", |_| {}),
        builtin_node(db.url(), "b", |_| {}),
        builtin_node(db.url(), "c", |_| {}),
    );
    let spread = wait_until(
        "every node to lead one role",
        SOON,
        Duration::from_millis(20),
        || async {
            let leads = leads(&pool).await;
            (leads.len() == 3 && leads.values().all(|roles| roles.len() == 1)).then_some(leads)
        },
    )
    .await
    .unwrap();
    let made = moves(&pool).await;
    assert!(
        !made.is_empty() && made.len() <= 2,
        "no more moves than needed: {made:?}"
    );
    assert!(made.iter().all(|m| m.3 == "spread"), "{made:?}");
    // Settled: nothing moves any more (10 heartbeat intervals).
    observe(Duration::from_secs(5)).await;
    assert_eq!(leads(&pool).await, spread);
    assert_eq!(moves(&pool).await, made, "no flapping");
    // Each move was a graceful handoff to the node it named: no failover among the elections.
    let failovers: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.events WHERE kind = 'leader_elected'
            AND (detail->>'failover')::boolean",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(failovers, 0);
    let moved: Vec<(String, String)> = sqlx::query_as(
        "SELECT e.role, e.node_id FROM forge.events e
          WHERE e.kind = 'leader_elected' AND (e.detail->>'moved')::boolean ORDER BY e.id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let expected: Vec<(String, String)> = made.iter().map(|m| (m.0.clone(), m.2.clone())).collect();
    assert_eq!(moved, expected, "each move was taken by the node it named");
    // The history (API, CLI, dashboard lanes) tells a move from a handoff.
    let history = a
        .cluster()
        .history(None, forge::inspect::PageRequest::first(50))
        .await
        .unwrap();
    let shown: Vec<(String, String)> = history
        .items
        .iter()
        .rev()
        .filter(|t| t.moved.as_deref() == Some("spread"))
        .map(|t| (t.role.clone(), t.node_id.clone()))
        .collect();
    assert_eq!(shown, expected, "{:?}", history.items);
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_prefers_a_role_takes_it_over_when_it_joins() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let a = builtin_node(db.url(), "a", |_| {}).await;
    wait_until(
        "a to lead every role",
        SOON,
        Duration::from_millis(10),
        || async { (leads(&pool).await.get("a").map(Vec::len) == Some(3)).then_some(()) },
    )
    .await
    .unwrap();
    // Spreading off: only the preference moves a role.
    let big = builtin_node(db.url(), "big", |config| {
        config.cluster.spread = false;
        config.node.prefer_roles = vec!["metrics_aggregator".into()];
    })
    .await;
    wait_until(
        "big to lead the aggregator",
        SOON,
        Duration::from_millis(10),
        || async {
            let leads = leads(&pool).await;
            (leads.get("big") == Some(&vec!["metrics_aggregator".to_owned()])).then_some(())
        },
    )
    .await
    .unwrap();
    assert_eq!(
        moves(&pool).await,
        [(
            "metrics_aggregator".to_owned(),
            "a".to_owned(),
            "big".to_owned(),
            "preferred".to_owned()
        )]
    );
    big.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_spread_off_the_first_node_keeps_every_role() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let off = |config: &mut forge::Config| config.cluster.spread = false;
    let a = builtin_node(db.url(), "a", off).await;
    wait_until(
        "a to lead every role",
        SOON,
        Duration::from_millis(10),
        || async { (leads(&pool).await.get("a").map(Vec::len) == Some(3)).then_some(()) },
    )
    .await
    .unwrap();
    let b = builtin_node(db.url(), "b", off).await;
    let c = builtin_node(db.url(), "c", off).await;
    wait_standby(&pool, "scheduler").await;
    observe(Duration::from_secs(3)).await;
    assert_eq!(leads(&pool).await.get("a").map(Vec::len), Some(3));
    assert_eq!(moves(&pool).await, []);
    c.shutdown().await;
    b.shutdown().await;
    a.shutdown().await;
}

#[test]
fn a_preferred_role_must_be_one_the_node_campaigns_for() {
    let err = forge::Config::from_toml(
        "[node]\nroles = [\"scheduler\"]\nprefer_roles = [\"metrics_aggregator\"]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("node.prefer_roles"), "{err}");
    assert!(err.contains("not in node.roles"), "{err}");
}
