//! Leader-aware routing: `GET /api/health/leader/{role}` answers 200 on the role's leader only,
//! and routes behind `LeaderOnly` run on the leader only - elsewhere a 503 with `Retry-After`
//! and the leader's node and admin URL - with the tenure's `Leadership` for the handler.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use forge::admin::axum::Router;
use forge::admin::axum::routing::post;
use forge::admin::{Leader, LeaderOnly};
use forge::{Node, Role};
use forge_testkit::wait_until;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::jobs::served_job_config;
use crate::support::*;

/// One HTTP request on a fresh connection: status, headers, JSON body.
async fn call(addr: SocketAddr, method: &str, path: &str) -> (u16, hyper::HeaderMap, Value) {
    match tokio::time::timeout(SOON, try_call(addr, method, path)).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(err)) => panic!("{method} {path}: {err}"),
        Err(_) => panic!("{method} {path}: no answer within {SOON:?}"),
    }
}

/// [`call`], with connection errors as `Err`.
async fn try_call(
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> Result<(u16, hyper::HeaderMap, Value), String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(connection);
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("request: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Ok((status, headers, body))
}

fn admin_addr(node: &Node) -> SocketAddr {
    node.admin_url()
        .and_then(|url| url.strip_prefix("http://"))
        .and_then(|addr| addr.parse().ok())
        .expect("the node serves the admin API on http://ip:port")
}

async fn served(url: &str, id: &str) -> Node {
    let mut config = served_job_config(url, id, false);
    config.node.roles = Some(vec!["scheduler".into()]);
    config.node.campaign_without_work = true;
    Node::builder(config)
        .auto_register(false)
        .start()
        .await
        .expect("node starts")
}

/// Two nodes serving the admin API that campaign for the scheduler: (its leader, the other,
/// the leader's epoch), once the other waits as its standby.
async fn leader_and_follower(db: &forge_testkit::TestDatabase) -> (Node, Node, i64) {
    let a = served(db.url(), "a").await;
    let b = served(db.url(), "b").await;
    let (leader, epoch) = wait_single_leader(&[&a, &b], &Role::SCHEDULER).await;
    wait_standby(&db.pool().await.unwrap(), "scheduler").await;
    if leader == 0 {
        (a, b, epoch)
    } else {
        (b, a, epoch)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_probe_answers_200_on_the_leader_and_503_elsewhere() {
    let db = fresh_db().await;
    let (leading, following, epoch) = leader_and_follower(&db).await;
    let (leading, following) = (&leading, &following);

    let (status, _, body) = call(admin_addr(leading), "GET", "/api/health/leader/scheduler").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["leader"].clone(), body["epoch"].clone()),
        (Value::Bool(true), epoch.into())
    );
    let (status, headers, body) =
        call(admin_addr(following), "GET", "/api/health/leader/scheduler").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        headers.get("forge-leader").and_then(|v| v.to_str().ok()),
        Some(leading.id().as_str())
    );
    assert_eq!(body["code"], "not_leader", "{body}");
    let (status, _, _) = call(admin_addr(following), "GET", "/api/health/leader/billing").await;
    assert_eq!(status, 404, "a role the node does not campaign for");
    let (status, _, _) = call(
        admin_addr(following),
        "GET",
        "/api/health/leader/Bad%20Role",
    )
    .await;
    assert_eq!(status, 400);
    leading.shutdown().await;
    following.shutdown().await;
}

/// The application's own routes on `node`: `POST /webhook` behind `LeaderOnly`, counting the
/// requests its handler ran.
async fn application(node: &Node, ran: Arc<AtomicUsize>) -> SocketAddr {
    let app: Router = Router::new()
        .route(
            "/webhook",
            post(move |Leader(leadership): Leader| {
                let ran = ran.clone();
                async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    format!("{} {}", leadership.node_id(), leadership.epoch())
                }
            }),
        )
        .layer(LeaderOnly::new(node.clone(), Role::SCHEDULER));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { forge::admin::axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_only_routes_run_on_the_leader_and_point_elsewhere_to_it() {
    let db = fresh_db().await;
    let (leading, following, epoch) = leader_and_follower(&db).await;
    let (leading, following) = (&leading, &following);
    let (on_leader, on_follower) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let leader_app = application(leading, on_leader.clone()).await;
    let follower_app = application(following, on_follower.clone()).await;

    let (status, _, body) = call(leader_app, "POST", "/webhook").await;
    assert_eq!(status, 200);
    assert_eq!(body, Value::String(format!("{} {epoch}", leading.id())));
    let (status, headers, body) = call(follower_app, "POST", "/webhook").await;
    assert_eq!(status, 503, "{body}");
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(header("retry-after").as_deref(), Some("1"));
    assert_eq!(
        header("forge-leader").as_deref(),
        Some(leading.id().as_str())
    );
    assert_eq!(header("forge-leader-url").as_deref(), leading.admin_url());
    assert_eq!(
        (
            on_leader.load(Ordering::SeqCst),
            on_follower.load(Ordering::SeqCst)
        ),
        (1, 0),
        "the follower's handler never ran"
    );
    // The leader steps down: the former follower's routes now run, the former leader's do not.
    leading
        .cluster()
        .step_down(&Role::SCHEDULER, "test", false)
        .await
        .unwrap();
    wait_until(
        "the follower to take the routes",
        SOON,
        Duration::from_millis(10),
        || async { (call(follower_app, "POST", "/webhook").await.0 == 200).then_some(()) },
    )
    .await
    .unwrap();
    assert_eq!(call(leader_app, "POST", "/webhook").await.0, 503);
    leading.shutdown().await;
    following.shutdown().await;
}

/// A load balancer from `deploy/` in front of three probe nodes.
enum Balancer {
    /// `deploy/haproxy/haproxy.cfg`: active checks of `/api/health/leader/scheduler`.
    Haproxy,
    /// `deploy/nginx/forge-leader.conf`: no checks; a non-leader's 503 moves the request on.
    Nginx,
}

impl Balancer {
    fn program(&self) -> (&'static str, &'static str) {
        match self {
            Balancer::Haproxy => ("haproxy", "haproxy"),
            Balancer::Nginx => ("nginx", "nginx"),
        }
    }

    /// The shipped file with this test's addresses in place of the example ones.
    fn config(&self, listen: u16, nodes: &[(u16, u16)], dir: &std::path::Path) -> String {
        let shipped = |path: &str| {
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
                .unwrap()
        };
        match self {
            Balancer::Haproxy => {
                let mut text = shipped("../deploy/haproxy/haproxy.cfg")
                    .replace("bind :8000", &format!("bind 127.0.0.1:{listen}"));
                for (i, (admin, app)) in nodes.iter().enumerate() {
                    text = text.replace(
                        &format!("10.0.0.{}:8080 port 9465", i + 1),
                        &format!("127.0.0.1:{app} port {admin}"),
                    );
                }
                text
            }
            Balancer::Nginx => {
                let mut server = shipped("../deploy/nginx/forge-leader.conf")
                    .replace("listen 8000;", &format!("listen 127.0.0.1:{listen};"));
                for (i, (_, app)) in nodes.iter().enumerate() {
                    server = server.replace(
                        &format!("10.0.0.{}:8080", i + 1),
                        &format!("127.0.0.1:{app}"),
                    );
                }
                let d = dir.display();
                format!(
                    "daemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
                     events {{ worker_connections 256; }}\n\
                     http {{\n access_log off;\n client_body_temp_path {d};\n\
                     proxy_temp_path {d};\n fastcgi_temp_path {d};\n uwsgi_temp_path {d};\n\
                     scgi_temp_path {d};\n{server}\n}}\n"
                )
            }
        }
    }

    fn command(&self, config: &std::path::Path) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(self.program().0);
        match self {
            Balancer::Haproxy => command.arg("-db").arg("-f").arg(config),
            Balancer::Nginx => command.arg("-e").arg("stderr").arg("-c").arg(config),
        };
        command
    }
}

/// Requests through `balancer` reach the scheduler's leader, never a non-leader's handler;
/// after the leader is SIGKILLed they reach the new one. Prints how long that took.
async fn routes_to_the_leader_through(balancer: Balancer) {
    let (program, package) = balancer.program();
    let missing = std::process::Command::new(program)
        .arg("-v")
        .output()
        .is_err()
        .then_some((program, package));
    if !tools_present(missing.as_slice(), "the load-balancer tests") {
        return;
    }
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let dir = ScratchDir::new(program);
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let mut probes = Vec::new();
    for (i, ports) in ports.iter().enumerate() {
        let id = format!("lb{}", i + 1);
        probes.push(Probe::start_serving(&db, &dir.0, &id, &["scheduler"], *ports).await);
    }
    let (leader, epoch) = wait_until(
        "a scheduler leader",
        SOON,
        Duration::from_millis(10),
        || async { current_leaders(&pool).await.remove("scheduler") },
    )
    .await
    .unwrap();
    wait_standby(&pool, "scheduler").await;

    let listen = free_port();
    let config = dir.0.join(format!("{program}.conf"));
    std::fs::write(&config, balancer.config(listen, &ports, &dir.0)).unwrap();
    let mut proxy = balancer
        .command(&config)
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let front: SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();
    let answer = |reply: Result<(u16, hyper::HeaderMap, Value), String>| {
        reply
            .ok()
            .filter(|(status, _, _)| *status == 200)
            .map(|(_, _, body)| body.as_str().unwrap_or_default().to_owned())
    };
    let first = wait_until(
        "the balancer to reach the leader",
        SOON,
        Duration::from_millis(20),
        || async { answer(try_call(front, "GET", "/leader-only").await) },
    )
    .await
    .unwrap();
    assert_eq!(first, format!("{leader} {epoch}"));

    // SIGKILL the leader under a steady stream of requests.
    let victim = probes.iter_mut().find(|p| p.id == leader).unwrap();
    let killed = tokio::time::Instant::now();
    victim.process.kill().unwrap();
    let next = wait_until(
        "requests to reach the new leader",
        SOON,
        Duration::from_millis(2),
        || async {
            answer(try_call(front, "GET", "/leader-only").await)
                .filter(|a| !a.starts_with(&format!("{leader} ")))
        },
    )
    .await
    .unwrap();
    println!(
        "{program}: requests reached the new leader ({next}) {} ms after the SIGKILL of {leader}",
        killed.elapsed().as_millis()
    );
    let (new_leader, new_epoch) = current_leaders(&pool).await.remove("scheduler").unwrap();
    assert_eq!(next, format!("{new_leader} {new_epoch}"));
    // Every request any handler served, it served as the leader of that epoch.
    for probe in &probes {
        for line in probe.lines().iter().filter(|l| l.event == "SERVED") {
            let epoch = line.epoch.unwrap();
            let led_by: String =
                sqlx::query_scalar("SELECT node_id FROM forge.events WHERE kind = 'leader_elected' AND role = 'scheduler' AND epoch = $1")
                    .bind(epoch)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(led_by, probe.id, "{line:?}");
        }
    }
    let _ = proxy.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_sends_requests_to_the_leader_and_to_the_next_one_after_a_sigkill() {
    routes_to_the_leader_through(Balancer::Haproxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_sends_requests_to_the_leader_and_to_the_next_one_after_a_sigkill() {
    routes_to_the_leader_through(Balancer::Nginx).await;
}
