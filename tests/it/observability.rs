//! What operators see: the Prometheus endpoint and the leadership history.

use forge::crons::CronJob;
use forge::{CronContext, Node, Role, Schedule};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

async fn scrape(addr: std::net::SocketAddr) -> String {
    request(addr, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n").await
}

/// The response to `head` (its lines, without the blank line that ends it) sent alone on a
/// connection that it closes (`Connection: close`).
async fn request(addr: std::net::SocketAddr, head: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("{head}Connection: close\r\n\r\n").as_bytes())
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
    config.node.roles = Some(vec!["scheduler".into(), "log_compactor".into()]);
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
    config.node.roles = Some(vec!["scheduler".into(), "log_compactor".into()]);
    config.node.queues = Some(vec!["default".into(), "mailers".into()]);
    config.jobs.queues.insert("mailers".into(), 2.into());
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

/// The body of `GET /metrics` from a node's endpoint.
async fn scrape_body(addr: std::net::SocketAddr) -> String {
    let response = scrape(addr).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

const LEADER_ONLY: &[&str] = &[
    "forge_cron_lag_seconds",
    "forge_cron_run_duration_seconds",
    "forge_cron_unknown_crons",
    "forge_cluster_nodes{",
    "forge_job_queue_depth{",
    "forge_job_oldest_age_seconds{",
    "forge_job_dead_jobs{",
];

/// Series only a leader measures - a cron's lag and duration histograms (46 series a cron on
/// every node made 460,000 per node at 10,000 crons), the cluster gauges of the
/// `metrics_aggregator` leader - are exported by that leader only, over HTTP, and go with the
/// leadership: a node that lost it neither keeps them frozen nor exports them as 0 (a naive
/// `sum(forge_job_queue_depth)` then counts one node's figures, not zeros beside them). A
/// cron's counters stay on every node that campaigns for its role, at 0 from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_only_series_are_exported_by_the_leader_only() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let noop = |_ctx: CronContext| async { Ok::<_, forge::CronError>(()) };
    let yearly = CronJob::new("yearly", Schedule::parse("0 0 1 1 *").unwrap(), noop);
    let start = |id: &'static str, addr| {
        let mut config = crate::jobs::job_config(db.url(), id);
        config.node.roles = Some(vec!["scheduler".into(), "metrics_aggregator".into()]);
        config.metrics.listen = Some(addr);
        // a leads both roles until the test moves them (not a placement move).
        config.cluster.spread = false;
        Node::builder(config)
            .auto_register(false)
            .cron(yearly.clone())
            .job(crate::jobs::plain)
            .start()
    };
    let (addr_a, addr_b) = (free_port(), free_port());
    let a = start("a", addr_a).await.unwrap();
    wait_single_leader(&[&a], &Role::SCHEDULER).await;
    wait_single_leader(&[&a], &Role::METRICS_AGGREGATOR).await;
    let b = start("b", addr_b).await.unwrap();
    // A job waiting an hour: a queue figure to report.
    crate::support::client(&pool)
        .enqueue_job(
            forge::jobs::NewJob::new(crate::jobs::plain, crate::jobs::Behave::tag("later"))
                .delay(std::time::Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    let leads = |addr| async move {
        let text = scrape_body(addr).await;
        match [
            "forge_cron_lag_seconds_count{cron=\"yearly\",role=\"scheduler\"} 0",
            "forge_cron_run_duration_seconds_count{cron=\"yearly\",role=\"scheduler\"} 0",
            "forge_cluster_nodes{state=\"active\"} 2",
            "forge_job_queue_depth{queue=\"default\",kind=\"plain\",state=\"scheduled\"} 1",
        ]
        .iter()
        .find(|line| !text.contains(*line))
        {
            Some(missing) => Err(format!("missing {missing:?} in\n{text}")),
            None => Ok(text),
        }
    };
    let follows = |addr| async move {
        let text = scrape_body(addr).await;
        let counters = [
            "forge_cron_runs_total{cron=\"yearly\",role=\"scheduler\",outcome=\"failed\"} 0",
            "forge_cron_missed_ticks_total{cron=\"yearly\",role=\"scheduler\"} 0",
            "forge_leader_is_leader{role=\"metrics_aggregator\"} 0",
        ];
        (counters.iter().all(|line| text.contains(line))
            && !LEADER_ONLY.iter().any(|name| text.contains(name)))
        .then_some(text)
    };
    forge_testkit::wait_for("a to export the leader's series", SOON, MS_20, || {
        leads(addr_a)
    })
    .await
    .unwrap();
    forge_testkit::wait_until("b to export no leader's series", SOON, MS_20, || {
        follows(addr_b)
    })
    .await
    .unwrap();

    // b takes both roles over; a, a follower again, no longer exports what it measured.
    let terminated: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE application_name IN ('forge:scheduler:a', 'forge:metrics_aggregator:a')
            AND datname = current_database()",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(terminated, [true, true]);
    wait_single_leader(&[&a, &b], &Role::SCHEDULER).await;
    forge_testkit::wait_for("b to export the leader's series", SOON, MS_20, || {
        leads(addr_b)
    })
    .await
    .unwrap();
    forge_testkit::wait_until("a to follow again", SOON, MS_20, || async {
        matches!(
            a.role_state(&Role::SCHEDULER),
            Some(forge::RoleState::Follower { .. })
        )
        .then_some(())
    })
    .await
    .unwrap();
    forge_testkit::wait_until("a to drop the leader's series", SOON, MS_20, || {
        follows(addr_a)
    })
    .await
    .unwrap();
    b.shutdown().await;
    a.shutdown().await;
}

const MS_20: std::time::Duration = std::time::Duration::from_millis(20);

/// `[metrics] per_cron = false`: the cron metrics are the role's (no `cron` label), so a node's
/// series do not grow with its crons; the histograms are exported from the start then, on
/// every node that campaigns for the role (46 series per role).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_cron_series_can_be_turned_off() {
    let db = fresh_db().await;
    let noop = |_ctx: CronContext| async { Ok::<_, forge::CronError>(()) };
    let node = |per_cron: bool, id: &'static str, crons: usize| {
        let mut config = config(db.url(), id);
        config.node.roles = Some(vec!["scheduler".into()]);
        config.metrics.per_cron = per_cron;
        let mut builder = Node::builder(config).auto_register(false);
        for i in 0..crons {
            builder = builder.cron(CronJob::new(
                format!("c{i}"),
                Schedule::parse("0 0 1 1 *").unwrap(),
                noop,
            ));
        }
        builder.start()
    };
    let off = node(false, "off", 50).await.unwrap();
    wait_single_leader(&[&off], &Role::SCHEDULER).await;
    let samples = |text: &str, name: &str| {
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .count()
    };
    let text = forge_testkit::wait_until("the leader's tenure", SOON, MS_20, || async {
        let text = off.render_metrics();
        text.contains("forge_cron_unknown_crons{role=\"scheduler\"} 0")
            .then_some(text)
    })
    .await
    .unwrap();
    assert!(!text.contains("cron=\""), "{text}");
    for line in [
        "forge_cron_runs_total{role=\"scheduler\",outcome=\"succeeded\"} 0",
        "forge_cron_missed_ticks_total{role=\"scheduler\"} 0",
        "forge_cron_run_duration_seconds_count{role=\"scheduler\"} 0",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    let per_role = samples(&text, "forge_cron_");
    // The histograms are the role's from the start on a node that does not lead it too.
    let follower = node(false, "off-follower", 50).await.unwrap();
    let text = follower.render_metrics();
    assert!(
        text.contains("forge_cron_lag_seconds_count{role=\"scheduler\"} 0"),
        "{text}"
    );
    follower.shutdown().await;
    off.shutdown().await;

    // Per cron, the same 50 crons cost 46 series each on the leader.
    let on = node(true, "on", 50).await.unwrap();
    wait_single_leader(&[&on], &Role::SCHEDULER).await;
    // (Each cron's series appear as the leader reaches it: wait for all of them, then check
    // that there are no more.)
    let text = forge_testkit::wait_until("the leader's per-cron series", SOON, MS_20, || async {
        let text = on.render_metrics();
        (samples(&text, "forge_cron_lag_seconds_count") == 50
            && text.contains("forge_cron_unknown_crons{role=\"scheduler\"} 0")
            && samples(&text, "forge_cron_") > 46 * 50)
            .then_some(text)
    })
    .await
    .unwrap();
    assert_eq!(per_role, 46 + 1, "{text}");
    assert_eq!(samples(&text, "forge_cron_") - 1, 46 * 50, "{text}");
    on.shutdown().await;
}

/// `forge_build_info` (the FORGE version and the git commit it was built from) and the
/// process' own figures under the names every Prometheus client uses, over HTTP; the whole
/// text passes `promtool check metrics` (the exposition format, and Prometheus' naming lint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_info_and_process_metrics_are_served() {
    let db = fresh_db().await;
    let addr = free_port();
    let mut config = crate::jobs::job_config(db.url(), "a");
    config.metrics.listen = Some(addr);
    let noop = |_ctx: CronContext| async { Ok::<_, forge::CronError>(()) };
    let a = Node::builder(config)
        .auto_register(false)
        .cron(CronJob::new(
            "yearly",
            Schedule::parse("0 0 1 1 *").unwrap(),
            noop,
        ))
        .job(crate::jobs::plain)
        .start()
        .await
        .unwrap();
    wait_single_leader(&[&a], &Role::SCHEDULER).await;
    let text = scrape_body(addr).await;
    let sha = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    let info = format!(
        "forge_build_info{{version=\"{}\",git_sha=\"{sha}\"}} 1\n",
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.contains(&info), "missing {info:?} in\n{text}");
    assert!(text.contains("# TYPE forge_build_info gauge\n"), "{text}");
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_threads",
        "process_start_time_seconds",
    ] {
        assert!(
            text.contains(&format!("\n{name} ")),
            "missing {name} in\n{text}"
        );
    }
    // HEAD answers the headers alone; other methods are refused.
    let response = request(addr, "HEAD /metrics HTTP/1.1\r\nHost: localhost\r\n").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.contains("content-type: text/plain; version=0.0.4"),
        "{response}"
    );
    assert!(
        response.ends_with("\r\n\r\n"),
        "a body after HEAD: {response}"
    );
    let response = request(
        addr,
        "POST /metrics HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 405"), "{response}");
    assert!(response.contains("allow: GET,HEAD"), "{response}");

    promtool_accepts(&text);
    a.shutdown().await;
}

/// The endpoint bounds what a client sends (as the admin API's router, it is axum, served
/// through hyper's HTTP/1 builder): a request head over 16 KiB is refused with 431, a client
/// that sends no whole head is cut off within 10 s; a connection kept alive serves several
/// scrapes; an address already taken fails the node's start with a message that says what to
/// do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_endpoint_bounds_its_clients() {
    let db = fresh_db().await;
    let addr = free_port();
    let mut config = config(db.url(), "a");
    config.node.roles = Some(vec![]);
    config.metrics.listen = Some(addr);
    let node = Node::builder(config.clone())
        .auto_register(false)
        .start()
        .await
        .unwrap();

    let huge = format!(
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Padding: {}\r\n",
        "x".repeat(32 * 1024)
    );
    let response = request(addr, &huge).await;
    assert!(response.starts_with("HTTP/1.1 431"), "{response}");

    // Two scrapes on one connection, then silence: the server closes it.
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    for _ in 0..2 {
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        let mut response = Vec::new();
        let mut buf = [0u8; 64 * 1024];
        while !String::from_utf8_lossy(&response).contains("forge_build_info{") {
            let n = tokio::time::timeout(SOON, stream.read(&mut buf))
                .await
                .expect("a scrape's answer on a kept-alive connection")
                .unwrap();
            assert!(n > 0, "closed after {} scrapes", seen.len());
            response.extend_from_slice(&buf[..n]);
        }
        seen.push(response);
    }
    assert!(seen.iter().all(|r| r.starts_with(b"HTTP/1.1 200")));
    let mut rest = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        stream.read_to_end(&mut rest),
    )
    .await
    .expect("a silent client is cut off within the 10 s bound")
    .unwrap();
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(9),
        "cut off after {:?}: before the bound",
        started.elapsed()
    );

    // The address is taken (by this node): a second node cannot start on it.
    let mut second = config;
    second.node.id = Some("b".into());
    let err = Node::builder(second)
        .auto_register(false)
        .start()
        .await
        .err()
        .expect("a second node on the same [metrics] listen");
    let msg = err.to_string();
    assert!(
        msg.contains(&addr.to_string()) && msg.contains("[metrics] listen"),
        "{msg}"
    );
    node.shutdown().await;
}

/// Checks `text` with `promtool check metrics` (the exposition format, and Prometheus' naming
/// lint), where promtool is installed (see `tools_present`).
fn promtool_accepts(text: &str) {
    if crate::support::tools_present(
        if std::process::Command::new("promtool")
            .arg("--version")
            .output()
            .is_ok()
        {
            &[]
        } else {
            &[("promtool", "prometheus")]
        },
        "the exposition format check",
    ) {
        let mut child = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics:\n{}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// One scrape for the application's metrics and FORGE's: an application that records with the
/// `metrics` crate's macros through `metrics-exporter-prometheus` hands its handle's render to
/// `NodeBuilder::app_metrics`, and `[metrics] listen` serves both (so does
/// `Node::render_metrics`, for the application's own router). A process figure the
/// application exports too (as the `metrics-process` crate does) appears once, and promtool
/// accepts the whole text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_scrape_serves_the_applications_metrics_and_forges() {
    let db = fresh_db().await;
    let addr = free_port();
    let mut config = config(db.url(), "a");
    config.metrics.listen = Some(addr);
    // The application's recorder (a local one: other tests of this process keep theirs).
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        metrics::describe_counter!("orders_placed_total", "Orders placed.");
        metrics::counter!("orders_placed_total", "shop" => "eu").increment(3);
        metrics::describe_gauge!("process_threads", "Number of OS threads in the process.");
        metrics::gauge!("process_threads").set(42.0);
    });
    let a = Node::builder(config)
        .app_metrics(move || handle.render())
        .start()
        .await
        .unwrap();
    wait_single_leader(&[&a], &Role::SCHEDULER).await;

    let scraped = scrape_body(addr).await;
    for text in [&scraped, &a.render_metrics()] {
        for expected in [
            "forge_leader_is_leader{role=\"scheduler\"} 1\n",
            "# HELP orders_placed_total Orders placed.\n",
            "orders_placed_total{shop=\"eu\"} 3\n",
            "process_threads 42\n",
            "\nprocess_open_fds ",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        assert_eq!(
            text.matches("# TYPE process_threads ").count(),
            1,
            "the application's process_threads, not a second family:\n{text}"
        );
    }
    promtool_accepts(&scraped);
    a.shutdown().await;
}

/// Quiet, plain logs: a node process at `RUST_LOG=info` started three times on one database
/// (the later starts find FORGE's schema there) prints only FORGE's own INFO lines - no
/// PostgreSQL NOTICEs such as `schema "forge" already exists, skipping` - never "following"
/// itself (its own election, heard on its node session before the lock session's reply), and
/// not a line for each tick of a paused per-second cron (the ledger, the metrics and the
/// dashboard show those).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_info_log_has_only_lines_for_people() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let dir = ScratchDir::new("quiet-logs");
    let path = dir.0.join("forge.toml");
    std::fs::write(&path, config_toml(db.url())).unwrap();
    let roles = ["scheduler", "metrics_aggregator", "log_compactor"];
    let workload = forge::inspect::Workload::new(pool.clone(), forge::LockNamespace::default());
    let skipped = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM forge.cron_ticks WHERE cron = 'probe_tick' AND state = 'skipped'",
        )
        .fetch_one(&pool)
        .await
        .unwrap_or(0)
    };
    for run in 1..=3 {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_forge-probe-node"));
        command
            .arg(&path)
            .env("FORGE_NODE_ID", "quiet")
            .env("FORGE_ROLES", roles.join(","))
            .env("FORGE_PROBE_WORK_MS", "3600000")
            .env("FORGE_PROBE_CRON", "* * * * * *")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("DATABASE_URL");
        let mut node = forge_testkit::NodeProcess::spawn(command)
            .unwrap()
            .named(&format!("quiet-{run}"));
        forge_testkit::wait_until("the node to lead every role", SOON, MS_20, || async {
            let lines = node.lines();
            roles
                .iter()
                .all(|role| {
                    lines
                        .iter()
                        .any(|l| l.starts_with(&format!("FORGE-PROBE LEADER role={role} ")))
                })
                .then_some(())
        })
        .await
        .unwrap();
        // The cron paused (once it is known), then two of its ticks skipped.
        forge_testkit::wait_until("the cron to be paused", SOON, MS_20, || async {
            workload
                .pause_cron("probe_tick", "test")
                .await
                .ok()
                .filter(|known| *known)
        })
        .await
        .unwrap();
        let before = skipped().await;
        forge_testkit::wait_until("two skipped ticks", SOON, MS_20, || async {
            (skipped().await >= before + 2).then_some(())
        })
        .await
        .unwrap();
        node.terminate().unwrap();
        node.wait_exit(SOON).await.unwrap();
        let lines = node.lines();
        let logged: Vec<&String> = lines
            .iter()
            .filter(|l| !l.starts_with("FORGE-PROBE "))
            .collect();
        for line in &logged {
            assert!(
                line.contains(" forge::"),
                "run {run}: a log line that is not FORGE's: {line}\n{logged:#?}"
            );
            assert!(
                !(line.contains("following") && line.contains("leader=quiet")),
                "run {run}: the node follows itself: {line}\n{logged:#?}"
            );
            assert!(
                !line.contains("tick skipped"),
                "run {run}: a line for each skipped tick: {line}\n{logged:#?}"
            );
        }
        assert!(
            logged.iter().any(|l| l.contains("became leader")),
            "run {run}: {logged:#?}"
        );
    }
}

/// The events the test's subscriber saw: each with its message and the fields of the spans
/// around it (innermost first, each as `span name`, then `field=value`s).
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<CapturedEvent>>>);

/// A span's name (as field `span`) and fields.
type SpanFields = Vec<(String, String)>;

/// An event's message and the spans around it.
type CapturedEvent = (String, Vec<SpanFields>);

#[derive(Default)]
struct FieldsOf(Vec<(String, String)>);

impl tracing::field::Visit for FieldsOf {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S> tracing_subscriber::Layer<S> for Captured
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = FieldsOf(vec![(
            "span".to_owned(),
            attrs.metadata().name().to_owned(),
        )]);
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<FieldsOf>()
        {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let mut message = FieldsOf::default();
        event.record(&mut message);
        let message = message
            .0
            .into_iter()
            .find(|(name, _)| name == "message")
            .map(|(_, value)| value)
            .unwrap_or_default();
        let spans = ctx
            .event_scope(event)
            .into_iter()
            .flatten()
            .map(|span| {
                span.extensions()
                    .get::<FieldsOf>()
                    .map(|f| f.0.clone())
                    .unwrap_or_default()
            })
            .collect();
        self.0.lock().unwrap().push((message, spans));
    }
}

impl Captured {
    /// The spans around the first event whose message is `message`.
    fn spans_of(&self, message: &str) -> Option<Vec<SpanFields>> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|(m, _)| m == message)
            .map(|(_, spans)| spans.clone())
    }
}

fn field<'a>(span: &'a [(String, String)], name: &str) -> Option<&'a str> {
    span.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// A job whose handler logs a line of its own.
#[derive(Clone, Copy, Debug)]
struct Traced;

impl forge::jobs::Job for Traced {
    type Args = ();
    const KIND: &'static str = "traced";

    fn options(&self) -> forge::jobs::JobOptions {
        forge::jobs::JobOptions::new().queue("traces")
    }

    async fn run(&self, _ctx: forge::JobContext, _args: ()) -> Result<(), forge::JobError> {
        tracing::info!("the job's own line");
        Ok(())
    }
}

/// Every job attempt and cron run executes inside a span with what identifies it - a job's id
/// (`messaging.message.id`), kind, queue (`messaging.destination.name`) and attempt; a cron's
/// name, tick, attempt, role and the tenure's epoch - so a handler's own log lines carry them
/// (and an OpenTelemetry exporter makes a span of each); the election's transitions are
/// logged inside a span of their role. (A current-thread runtime: the node's tasks run on
/// the thread whose default subscriber this test sets.)
#[tokio::test]
async fn job_attempts_cron_runs_and_elections_run_in_spans() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let captured = Captured::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(captured.clone()));
    let db = fresh_db().await;
    let mut config = crate::jobs::job_config(db.url(), "traced");
    config.node.queues = Some(vec!["default".into(), "traces".into()]);
    config.jobs.queues.insert("traces".into(), 1.into());
    let every_second = CronJob::new(
        "every_second",
        Schedule::parse("* * * * * *").unwrap(),
        |ctx: CronContext| async move {
            tracing::info!(scheduled_at = %ctx.scheduled_at(), "the cron's own line");
            Ok::<_, forge::CronError>(())
        },
    );
    let node = Node::builder(config)
        .auto_register(false)
        .cron(every_second)
        .job(Traced)
        .start()
        .await
        .unwrap();
    let (_, epoch) = wait_single_leader(&[&node], &Role::SCHEDULER).await;
    let id = node.jobs().enqueue(Traced, ()).await.unwrap().id().0;
    let job = forge_testkit::wait_until("the job's line", SOON, MS_20, || async {
        captured.spans_of("the job's own line")
    })
    .await
    .unwrap();
    let cron = forge_testkit::wait_until("the cron's line", SOON, MS_20, || async {
        captured.spans_of("the cron's own line")
    })
    .await
    .unwrap();
    node.shutdown().await;

    let span = &job[0];
    for (name, value) in [
        ("span", "job".to_owned()),
        ("otel.name", "process traces".to_owned()),
        ("otel.kind", "consumer".to_owned()),
        ("messaging.system", "forge".to_owned()),
        ("messaging.operation.type", "process".to_owned()),
        ("messaging.destination.name", "traces".to_owned()),
        ("messaging.message.id", id.to_string()),
        ("job.kind", "traced".to_owned()),
        ("job.attempt", "1".to_owned()),
    ] {
        assert_eq!(field(span, name), Some(value.as_str()), "{name} in {job:?}");
    }
    let span = &cron[0];
    assert_eq!(field(span, "span"), Some("cron"), "{cron:?}");
    assert_eq!(field(span, "cron.name"), Some("every_second"), "{cron:?}");
    assert_eq!(field(span, "cron.attempt"), Some("1"), "{cron:?}");
    assert_eq!(field(span, "role"), Some("scheduler"), "{cron:?}");
    assert_eq!(
        field(span, "epoch"),
        Some(epoch.to_string().as_str()),
        "{cron:?}"
    );
    let tick = field(span, "cron.tick").unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(tick).is_ok() && tick.ends_with('Z'),
        "{tick}"
    );

    let elected = captured.spans_of("became leader").unwrap();
    assert!(
        elected
            .iter()
            .any(|span| field(span, "span") == Some("role") && field(span, "role").is_some()),
        "{elected:?}"
    );
}

/// What a node logged, in the fmt layer's words (level, target, message, fields).
#[derive(Clone, Default)]
struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Log {
    /// The lines logged since the last call.
    fn take(&self) -> Vec<String> {
        let bytes = std::mem::take(&mut *self.0.lock().unwrap());
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = Log;

    fn make_writer(&'a self) -> Log {
        self.clone()
    }
}

/// A configuration that hides work of the node's binary from it - a role with work that
/// `[node] roles` leaves out, a queue a job type declares that `[node] queues` leaves out - is a
/// warning at start that names the work and says what to do; the default configuration hides
/// nothing. (A current-thread runtime: the node logs on the thread whose subscriber this test
/// sets.)
#[tokio::test]
async fn work_a_configuration_hides_is_a_warning_at_start() {
    let log = Log::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let db = fresh_db().await;
    // [node] roles = ["scheduler"], [node] queues = ["default"].
    let hides = crate::jobs::job_config(db.url(), "hides");
    billing_and_mailers_node(hides).await.shutdown().await;
    let lines = log.take();
    let warned = |said: &str, about: &str| {
        lines
            .iter()
            .any(|l| l.contains(" WARN ") && l.contains(said) && l.contains(about))
    };
    assert!(
        warned(
            "not campaigning for a role this binary has work for",
            r#"role=billing node=hides work=["invoices"]"#
        ),
        "{lines:#?}"
    );
    assert!(
        warned("add it there, or unset roles", "role=billing"),
        "{lines:#?}"
    );
    assert!(
        warned(
            "this node does not work a queue its job types declare",
            r#"queue=mailers jobs=["mailer"]"#
        ),
        "{lines:#?}"
    );
    assert!(
        warned("add it there, or unset queues", "queue=mailers"),
        "{lines:#?}"
    );

    // A pool smaller than two connections per job worker, plus one.
    let mut small = config(db.url(), "small-pool");
    small.database.max_connections = 2;
    billing_and_mailers_node(small).await.shutdown().await;
    let lines = log.take();
    assert!(
        lines.iter().any(|l| l.contains(" WARN ")
            && l.contains("max_connections is too small for this node's job workers")
            && l.contains("at least 3")
            && l.contains("max_connections=2 job_workers=1")),
        "{lines:#?}"
    );

    // The defaults: every role with work, every declared queue, a pool large enough.
    let serves = billing_and_mailers_node(config(db.url(), "serves")).await;
    let billing = Role::new("billing").unwrap();
    assert!(serves.roles().contains(&billing), "{:?}", serves.roles());
    serves.shutdown().await;
    let lines = log.take();
    assert!(
        !lines.iter().any(|l| l.contains("not campaigning")
            || l.contains("does not work a queue")
            || l.contains("max_connections is too small")),
        "{lines:#?}"
    );
}
