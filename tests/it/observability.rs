//! What operators see: the Prometheus endpoint and the leadership history.

use forge::cron::CronJob;
use forge::{CronContext, Node, Role, Schedule};
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

/// Every counter of a label set the node knows at start - its roles, its crons and their
/// outcomes, its job kinds on their queues - is exported at 0 before anything happens, so
/// that Prometheus' `increase()` counts the first increment (a counter that first appears at
/// 1 reads as no increase: the first failover went unseen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_are_exported_at_zero_from_the_start() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let mut config = crate::jobs::job_config(db.url(), "a");
    config.node.roles = vec!["scheduler".into(), "log_compactor".into()];
    config.jobs.queues.insert("mailers".into(), 2);
    let noop = |_ctx: CronContext| async { Ok::<_, forge::CronError>(()) };
    let yearly = CronJob::new("yearly", Schedule::parse("0 0 1 1 *").unwrap(), noop);
    // A cron of a role this node does not campaign for: only that role's leaders count it.
    let elsewhere = CronJob::new("elsewhere", Schedule::parse("0 0 1 1 *").unwrap(), noop)
        .role(Role::new("billing").unwrap());
    let a = Node::builder(config)
        .auto_register(false)
        .cron(yearly)
        .cron(elsewhere)
        .job(crate::jobs::plain)
        .job(crate::jobs::mailer)
        .start()
        .await
        .unwrap();

    // Right after start, before any failover, loss, run, miss or job.
    let text = a.render_metrics();
    let mut expected = vec![
        "forge_db_reconnects_total{session=\"node\"} 0".to_owned(),
        "forge_db_reconnects_total{session=\"lock:scheduler\"} 0".to_owned(),
        "forge_cron_missed_ticks_total{cron=\"yearly\",role=\"scheduler\"} 0".to_owned(),
        "forge_cron_lag_seconds_count{cron=\"yearly\",role=\"scheduler\"} 0".to_owned(),
        "forge_compactor_pruned_total{table=\"cron_ticks\"} ".to_owned(),
        "forge_compactor_pruned_total{table=\"jobs_dead\"} ".to_owned(),
    ];
    for role in ["scheduler", "log_compactor"] {
        expected.push(format!("forge_leader_is_leader{{role=\"{role}\"}} "));
        expected.push(format!("forge_leader_elections_total{{role=\"{role}\"}} "));
        expected.push(format!("forge_leader_failovers_total{{role=\"{role}\"}} 0"));
        expected.push(format!(
            "forge_leader_lock_conflicts_total{{role=\"{role}\"}} 0"
        ));
        for reason in [
            "deadline",
            "deposed",
            "renewal_failed",
            "shutdown",
            "step_down",
        ] {
            expected.push(format!(
                "forge_leader_losses_total{{role=\"{role}\",reason=\"{reason}\"}} 0"
            ));
        }
    }
    for outcome in ["succeeded", "failed", "timed_out", "skipped", "abandoned"] {
        expected.push(format!(
            "forge_cron_runs_total{{cron=\"yearly\",role=\"scheduler\",outcome=\"{outcome}\"}} 0"
        ));
    }
    // Each kind on its declared queue and on every queue this node works.
    for (queue, kind) in [
        ("default", "plain"),
        ("mailers", "mailer"),
        ("mailers", "plain"),
        ("default", "mailer"),
    ] {
        for counter in [
            "enqueued",
            "completed",
            "failed",
            "retried",
            "dead",
            "cancelled",
            "rescued",
        ] {
            expected.push(format!(
                "forge_job_{counter}_total{{queue=\"{queue}\",kind=\"{kind}\"}} 0"
            ));
        }
        expected.push(format!(
            "forge_job_duration_seconds_count{{queue=\"{queue}\",kind=\"{kind}\"}} 0"
        ));
    }
    for line in &expected {
        assert!(text.contains(line.as_str()), "missing {line:?} in:\n{text}");
    }
    for absent in [
        "outcome=\"running\"",
        "cron=\"elsewhere\"",
        "role=\"billing\"",
        "role=\"metrics_aggregator\"",
    ] {
        assert!(!text.contains(absent), "unexpected {absent:?} in:\n{text}");
    }

    // The first failover then reads 0 -> 1 on the node that takes over.
    wait_single_leader(&[&a], &Role::SCHEDULER).await;
    let b = start_node(db.url(), "b", &[Role::SCHEDULER]).await;
    let failovers = "forge_leader_failovers_total{role=\"scheduler\"}";
    assert!(
        b.render_metrics().contains(&format!("{failovers} 0")),
        "{}",
        b.render_metrics()
    );
    let terminated: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE application_name = 'forge:scheduler:a' AND datname = current_database()",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(terminated, [true]);
    forge_testkit::wait_until(
        "b to count its first failover",
        SOON,
        std::time::Duration::from_millis(10),
        || async {
            b.render_metrics()
                .contains(&format!("{failovers} 1"))
                .then_some(())
        },
    )
    .await
    .unwrap();
    forge_testkit::wait_until(
        "a to count its lock session's reconnection",
        SOON,
        std::time::Duration::from_millis(10),
        || async {
            a.render_metrics()
                .contains("forge_db_reconnects_total{session=\"lock:scheduler\"} 1")
                .then_some(())
        },
    )
    .await
    .unwrap();
    b.shutdown().await;
    a.shutdown().await;
}
