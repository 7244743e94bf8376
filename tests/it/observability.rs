//! What operators see: the Prometheus endpoint and the leadership history.

use forge::{Node, Role};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

fn free_port() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_metrics_are_served_for_prometheus() {
    let db = fresh_db().await;
    let addr = free_port();
    let mut config = config(db.url(), "a");
    config.node.roles = vec!["scheduler".into(), "log_compactor".into()];
    config.metrics.listen = Some(addr);
    let a = Node::builder(config)
        .leader_task(
            Role::SCHEDULER,
            "idle",
            |l| async move { l.stopping().await },
        )
        .leader_task(Role::LOG_COMPACTOR, "idle", |l| async move {
            l.stopping().await
        })
        .start()
        .await
        .unwrap();
    wait_single_leader(&[&a], &Role::SCHEDULER).await;
    wait_single_leader(&[&a], &Role::LOG_COMPACTOR).await;
    let b = start_node(db.url(), "b", &[Role::SCHEDULER]).await;

    let response = scrape(addr).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    for expected in [
        "# HELP forge_leader_is_leader",
        "# TYPE forge_leader_is_leader gauge",
        "forge_leader_is_leader{role=\"scheduler\"} 1",
        "forge_leader_is_leader{role=\"log_compactor\"} 1",
        "forge_leader_elections_total{role=\"scheduler\"} 1",
        "forge_leader_epoch{role=\"scheduler\"} 1",
        "# TYPE forge_leader_tenure_seconds gauge",
    ] {
        assert!(
            response.contains(expected),
            "missing {expected:?} in:\n{response}"
        );
    }
    // The follower exposes 0 for the role, so `sum(forge_leader_is_leader)` is the leader count.
    let text = b.render_metrics();
    assert!(
        text.contains("forge_leader_is_leader{role=\"scheduler\"} 0"),
        "{text}"
    );

    // After a handoff, the new leader counts the election and the old one the loss.
    a.shutdown().await;
    wait_single_leader(&[&b], &Role::SCHEDULER).await;
    let text = b.render_metrics();
    assert!(
        text.contains("forge_leader_is_leader{role=\"scheduler\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("forge_leader_elections_total{role=\"scheduler\"} 1"),
        "{text}"
    );
    assert!(
        !text.contains("forge_leader_failovers_total{role=\"scheduler\"} 1"),
        "a handoff is not a failover: {text}"
    );
    let text = a.render_metrics();
    assert!(
        text.contains("forge_leader_losses_total{role=\"scheduler\",reason=\"shutdown\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("forge_leader_is_leader{role=\"scheduler\"} 0"),
        "{text}"
    );
    b.shutdown().await;
}
