//! The admin HTTP API over real HTTP, against nodes on a real PostgreSQL: every endpoint, the
//! access rules (no token, wrong token, read token, read-only, writes disabled), bad input
//! (malformed JSON, bad filters, unknown ids and endpoints), readiness when PostgreSQL is
//! unreachable, and the node serving on `[admin] listen` (its URL in membership, stopped with
//! the node).

use std::net::SocketAddr;
use std::time::Duration;

use forge::crons::{CatchUp, CronJob};
use forge::inspect::{Cluster, Workload};
use forge::jobs::{JobState, NewJob};
use forge::{Config, CronContext, LockNamespace, Node, Role, Schedule};
use forge_testkit::{Filter, PgProxy, PgServer, wait_for, wait_until};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::jobs::{Behave, job_config, plain, served_job_config, setup, wait_state};
use crate::support::*;

const TOKEN: &str = "admin-write-token-0123456789";
const READ_TOKEN: &str = "admin-read-token-9876543210";

/// One HTTP answer: the status, the body as JSON (a string if it is not JSON), and its text.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: Value,
    text: String,
}

impl Reply {
    /// The body, after checking the status.
    #[track_caller]
    fn expect(self, status: u16) -> Value {
        assert_eq!(
            self.status, status,
            "unexpected status; body: {}",
            self.text
        );
        self.body
    }

    /// Checks an error answer: the status and a JSON `error` message.
    #[track_caller]
    fn expect_error(self, status: u16) -> String {
        assert_eq!(
            self.status, status,
            "unexpected status; body: {}",
            self.text
        );
        let message = self.body["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no JSON error in {}", self.text))
            .to_owned();
        assert_eq!(self.body["status"], status, "{}", self.text);
        message
    }
}

/// A client of one admin API, with or without a bearer token.
#[derive(Clone)]
pub(crate) struct Api {
    addr: SocketAddr,
    token: Option<String>,
}

impl Api {
    /// The API `node` serves, from the URL it records in membership.
    pub(crate) fn of(node: &Node) -> Api {
        let url = node.admin_url().expect("the node serves the admin API");
        let addr = url
            .strip_prefix("http://")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("not an http://ip:port URL: {url}"));
        Api { addr, token: None }
    }

    pub(crate) fn with_token(&self, token: &str) -> Api {
        Api {
            addr: self.addr,
            token: Some(token.to_owned()),
        }
    }

    async fn get(&self, path: &str) -> Reply {
        self.call("GET", path, None).await
    }

    async fn post(&self, path: &str) -> Reply {
        self.call("POST", path, None).await
    }

    async fn post_json(&self, path: &str, body: &str) -> Reply {
        self.call("POST", path, Some(body)).await
    }

    async fn delete(&self, path: &str) -> Reply {
        self.call("DELETE", path, None).await
    }

    /// One request; panics without an answer within 30 s (longer than the API's own bounds
    /// on PostgreSQL, so that a 503 for a slow database arrives first).
    pub(crate) async fn call(&self, method: &str, path: &str, body: Option<&str>) -> Reply {
        let bound = Duration::from_secs(30);
        match tokio::time::timeout(bound, self.send(method, path, body)).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(err)) => panic!("{method} {path}: {err}"),
            Err(_) => panic!("{method} {path}: no answer within {bound:?}"),
        }
    }

    /// One request on a fresh connection; connection errors as `Err`.
    async fn send(&self, method: &str, path: &str, body: Option<&str>) -> Result<Reply, String> {
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string());
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or("").to_owned())))
            .map_err(|e| format!("request: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.clone()));
        Ok(Reply { status, body, text })
    }
}

impl Api {
    /// A POST with a large body the way curl sends one: `Expect: 100-continue` first, the body
    /// only after the server's `100 Continue` (a server that refuses it answers at once).
    async fn post_large(&self, path: &str, body: &[u8]) -> Reply {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let mut head = format!(
            "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nexpect: 100-continue\r\nconnection: close\r\n",
            self.addr,
            body.len()
        );
        if let Some(token) = &self.token {
            head.push_str(&format!("authorization: Bearer {token}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut received = Vec::new();
        let mut chunk = [0u8; 8192];
        let mut sent_body = false;
        loop {
            let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut chunk))
                .await
                .unwrap_or_else(|_| panic!("POST {path}: no answer within 30 s"))
                .unwrap_or(0);
            if n == 0 {
                break;
            }
            received.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&received).into_owned();
            if !sent_body
                && text.starts_with("HTTP/1.1 100")
                && let Some(end) = text.find("\r\n\r\n")
            {
                received.drain(..end + 4);
                sent_body = true;
                // The server asked for it: send it (it may still refuse it part-way).
                let _ = stream.write_all(body).await;
            }
        }
        let text = String::from_utf8_lossy(&received).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("POST {path}: no status in {text:?}"));
        let json = text
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_owned();
        let body = serde_json::from_str(&json).unwrap_or_else(|_| Value::String(json.clone()));
        Reply {
            status,
            body,
            text: json,
        }
    }
}

/// Percent-encodes a query parameter's value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A node that serves the admin API on a free port of 127.0.0.1, works the `work` queue
/// (the `plain` job) and has the `yearly` cron (it never fires on its own in a test: its ticks
/// are the ones triggered).
async fn admin_node(url: &str, id: &str, token: Option<&str>) -> Node {
    admin_node_with(url, id, token, |_| {}).await
}

/// [`admin_node`] with `configure` applied to its configuration.
async fn admin_node_with(
    url: &str,
    id: &str,
    token: Option<&str>,
    configure: impl FnOnce(&mut Config),
) -> Node {
    let mut config = served_job_config(url, id, false);
    config.admin.token = token.map(str::to_owned);
    configure(&mut config);
    let yearly = CronJob::new(
        "yearly",
        Schedule::parse("0 0 1 1 *").unwrap(),
        |_ctx: CronContext| async move { Ok::<_, forge::CronError>(()) },
    )
    .catch_up(CatchUp::Skip);
    Node::builder(config)
        .auto_register(false)
        .job(plain)
        .cron(yearly)
        .start()
        .await
        .expect("node starts")
}

/// `url` with a password the server ignores (trust authentication): the API must not show
/// it. An external server's URL keeps its own password.
fn with_password(url: &str) -> (String, Option<String>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_owned(), None);
    };
    let Some((user_info, host)) = rest.rsplit_once('@') else {
        return (url.to_owned(), None);
    };
    match user_info.split_once(':') {
        Some((_, password)) => (url.to_owned(), Some(password.to_owned())),
        None if PgServer::shared().is_ok_and(|s| !s.is_external()) => {
            let password = "hunter2-admin-secret".to_owned();
            (
                format!("{scheme}://{user_info}:{password}@{host}"),
                Some(password),
            )
        }
        None => (url.to_owned(), None),
    }
}

/// An API served by this test over `pool` (no node): for the access rules and outages.
async fn standalone(pool: PgPool, configure: impl FnOnce(&mut Config)) -> (Api, ServerGuard) {
    let mut config = Config::default();
    configure(&mut config);
    let namespace = LockNamespace::default();
    let state = forge::admin::AdminState::new(
        Cluster::new(pool.clone(), namespace.clone(), Duration::from_secs(15)),
        Workload::new(pool, namespace),
        config.admin.clone(),
    )
    .with_config(&config)
    .timeouts(Duration::from_secs(3), Duration::from_secs(5));
    let listener = forge::admin::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(forge::admin::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    (
        Api { addr, token: None },
        ServerGuard {
            _stop: stop,
            _task: task,
        },
    )
}

/// Stops a standalone server when dropped.
struct ServerGuard {
    _stop: tokio::sync::oneshot::Sender<()>,
    _task: tokio::task::JoinHandle<std::io::Result<()>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_endpoints_show_nodes_leaders_history_events_config_and_step_down() {
    let db = fresh_db().await;
    let (url, password) = with_password(db.url());
    // Every role with work campaigned for (else the status reports the built-in roles'
    // duties unserved), and each kept by whoever wins it (no spreading moves meanwhile).
    let every_role = |config: &mut Config| {
        config.node.roles = None;
        config.cluster.spread = false;
    };
    let a = admin_node_with(&url, "a", Some(TOKEN), every_role).await;
    let b = admin_node_with(&url, "b", Some(TOKEN), every_role).await;
    let (leader, first_epoch) = wait_single_leader(&[&a, &b], &Role::SCHEDULER).await;
    let leader_id = [&a, &b][leader].id().to_string();
    let (api_a, api_b) = (Api::of(&a), Api::of(&b));

    // Health: live, and ready while PostgreSQL answers.
    let live = api_a.get("/api/health/live").await.expect(200);
    assert_eq!(live["status"], "live");
    assert_eq!(live["node_id"], "a");
    let ready = api_b.get("/api/health/ready").await.expect(200);
    assert_eq!(ready["status"], "ready");

    // Nodes: both, each with the URL it serves the API on, from either node.
    // (Polled: a node heartbeating late under load shows as drifted for a moment.)
    let nodes = wait_for(
        "both nodes active",
        SOON,
        Duration::from_millis(50),
        || async {
            let nodes = api_b.get("/api/cluster/nodes").await.expect(200);
            if nodes["counts"]["active"] == 2 {
                Ok(nodes)
            } else {
                Err(nodes.to_string())
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(nodes["total"], 2, "{nodes}");
    assert_eq!(nodes["counts"]["active"], 2, "{nodes}");
    for node in [&a, &b] {
        let row = nodes["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node_id"] == node.id().as_str())
            .unwrap_or_else(|| panic!("{} in {nodes}", node.id()));
        assert_eq!(row["admin_url"], node.admin_url().unwrap(), "{row}");
        assert_eq!(row["state"], "active");
    }
    let one = api_a.get("/api/cluster/nodes/b").await.expect(200);
    assert_eq!(one["node_id"], "b");
    assert_eq!(one["admin_url"], b.admin_url().unwrap());
    api_a
        .get("/api/cluster/nodes/no-such-node")
        .await
        .expect_error(404);

    // Status: two active nodes, the scheduler led by the leader, healthy.
    let status = wait_for(
        "a healthy status",
        SOON,
        Duration::from_millis(50),
        || async {
            let status = api_a.get("/api/cluster/status").await.expect(200);
            if status["healthy"] == true {
                Ok(status)
            } else {
                Err(status.to_string())
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(status["nodes"]["active"], 2, "{status}");
    assert_eq!(status["nodes"]["total"], 2, "{status}");
    assert_eq!(status["namespace"], "forge", "{status}");
    let scheduler = status["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == "scheduler")
        .unwrap_or_else(|| panic!("scheduler in {status}"))
        .clone();
    assert_eq!(scheduler["leader"], leader_id.as_str(), "{status}");
    assert_eq!(scheduler["epoch"], first_epoch, "{status}");
    assert_eq!(scheduler["led"], true);
    assert_eq!(scheduler["candidates"], 2);
    assert_eq!(status["this_node"]["node_id"], "a");

    // Leaders: every role, and one.
    let leaders = api_b.get("/api/cluster/leaders").await.expect(200);
    assert!(
        leaders["leaders"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["role"] == "scheduler"
                && l["node_id"] == leader_id.as_str()
                && l["led"] == true),
        "{leaders}"
    );
    let one = api_b
        .get("/api/cluster/leaders/scheduler")
        .await
        .expect(200);
    assert_eq!(one["epoch"], first_epoch);
    assert!(one["lease_remaining_ms"].as_f64().unwrap() > 0.0, "{one}");
    api_b
        .get("/api/cluster/leaders/never_led")
        .await
        .expect_error(404);
    api_b
        .get("/api/cluster/leaders/Not%20A%20Role")
        .await
        .expect_error(400);

    // This node: its id, its URL, its state in each role.
    let this = api_b.get("/api/cluster/this").await.expect(200);
    assert_eq!(this["node_id"], "b");
    assert_eq!(this["admin_url"], b.admin_url().unwrap());
    assert_eq!(this["stopping"], false);
    assert_eq!(this["membership"]["node_id"], "b");
    let role = this["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == "scheduler")
        .unwrap_or_else(|| panic!("scheduler in {this}"))
        .clone();
    let expected = if leader_id == "b" {
        "leader"
    } else {
        "follower"
    };
    assert_eq!(role["state"], expected, "{this}");

    // Config: the node's configuration without its secrets.
    let config = api_a.get("/api/cluster/config").await;
    assert!(!config.text.contains(TOKEN), "{}", config.text);
    if let Some(password) = &password {
        assert!(!config.text.contains(password.as_str()), "{}", config.text);
    }
    let config = config.expect(200);
    assert_eq!(config["node_id"], "a");
    assert_eq!(config["access"]["writes"], "token");
    assert_eq!(config["access"]["reads"], "open");
    assert_eq!(config["config"]["admin"]["token"], "<redacted>", "{config}");
    assert_eq!(
        config["config"]["cluster"]["leader_election"]["lease_duration"], "2s",
        "{config}"
    );
    let shown_url = config["config"]["database"]["url"].as_str().unwrap();
    if password.is_some() {
        assert!(shown_url.contains(":***@"), "{shown_url}");
    }

    // Step-down, asked on the follower once it waits as a standby: the leader hands over, a
    // newer epoch leads.
    wait_standby(&db.pool().await.unwrap(), "scheduler").await;
    let follower = if leader_id == "a" { &api_b } else { &api_a };
    follower
        .post("/api/cluster/roles/scheduler/step-down")
        .await
        .expect_error(401);
    let asked = follower
        .with_token(TOKEN)
        .post("/api/cluster/roles/scheduler/step-down")
        .await
        .expect(202);
    assert_eq!(asked["epoch"], first_epoch, "{asked}");
    assert_eq!(asked["role"], "scheduler");
    wait_for(
        "a newer scheduler epoch",
        SOON,
        Duration::from_millis(50),
        || async {
            let now = api_a
                .get("/api/cluster/leaders/scheduler")
                .await
                .expect(200);
            if now["led"] == true && now["epoch"].as_i64().unwrap() > first_epoch {
                Ok(())
            } else {
                Err(now.to_string())
            }
        },
    )
    .await
    .unwrap();
    follower
        .with_token(TOKEN)
        .post("/api/cluster/roles/never_led/step-down")
        .await
        .expect_error(404);
    let message = follower
        .with_token(TOKEN)
        .post("/api/cluster/roles/Bad%20Role/step-down")
        .await
        .expect_error(400);
    // Said once: not "invalid role name ...: `role`: invalid role name ...".
    assert_eq!(message.matches("Bad Role").count(), 1, "{message}");
    assert!(message.starts_with("invalid role name"), "{message}");

    // History: the first tenure ended by the handoff, the next one current.
    let history = api_a
        .get("/api/cluster/history?role=scheduler")
        .await
        .expect(200);
    let items = history["items"].as_array().unwrap();
    assert!(items.len() >= 2, "{history}");
    assert_eq!(items[0]["end"], "current", "{history}");
    let first = items
        .iter()
        .find(|t| t["epoch"] == first_epoch)
        .unwrap_or_else(|| panic!("epoch {first_epoch} in {history}"));
    assert_eq!(first["end"], "released", "{history}");
    assert_eq!(first["node_id"], leader_id.as_str());
    let paged = api_a
        .get("/api/cluster/history?role=scheduler&limit=1")
        .await
        .expect(200);
    assert_eq!(paged["items"].as_array().unwrap().len(), 1);
    let next = paged["next"].as_i64().expect("a next page");
    let older = api_a
        .get(&format!(
            "/api/cluster/history?role=scheduler&limit=1&before={next}"
        ))
        .await
        .expect(200);
    assert!(older["items"][0]["id"].as_i64().unwrap() < next, "{older}");

    // Events: the step-down in the audit trail, by the client's address; filters and pages.
    let audit = api_b
        .get("/api/cluster/events?kind=admin_action")
        .await
        .expect(200);
    let step_down = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["detail"]["action"] == "step_down")
        .unwrap_or_else(|| panic!("step_down in {audit}"));
    assert_eq!(step_down["detail"]["subject"], "scheduler");
    assert_eq!(step_down["detail"]["by"], "api 127.0.0.1", "{step_down}");
    let joined = api_b
        .get("/api/cluster/events?kind=node_joined,leader_elected&node=a")
        .await
        .expect(200);
    let items = joined["items"].as_array().unwrap();
    assert!(!items.is_empty(), "{joined}");
    assert!(items.iter().all(|e| e["node_id"] == "a"), "{joined}");
    assert!(
        items
            .iter()
            .all(|e| e["kind"] == "node_joined" || e["kind"] == "leader_elected"),
        "{joined}"
    );
    let by_role = api_b
        .get("/api/cluster/events?role=scheduler&limit=2")
        .await
        .expect(200);
    assert_eq!(by_role["items"].as_array().unwrap().len(), 2, "{by_role}");
    assert!(
        by_role["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["role"] == "scheduler")
    );
    let next = by_role["next"].as_i64().expect("more events");
    let older = api_b
        .get(&format!(
            "/api/cluster/events?role=scheduler&limit=2&before={next}"
        ))
        .await
        .expect(200);
    assert!(
        older["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["id"].as_i64().unwrap() < next),
        "{older}"
    );
    let newest = by_role["items"][0]["id"].as_i64().unwrap();
    let after = api_b
        .get(&format!("/api/cluster/events?after={}", newest - 1))
        .await
        .expect(200);
    assert_eq!(after["items"][0]["id"], newest, "{after}");

    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crons_are_listed_paused_resumed_and_triggered_with_their_ticks() {
    let (db, _pool) = setup().await;
    let node = admin_node(db.url(), "a", Some(TOKEN)).await;
    wait_single_leader(&[&node], &Role::SCHEDULER).await;
    let api = Api::of(&node);
    let admin = api.with_token(TOKEN);

    let crons = wait_for(
        "the cron registered",
        SOON,
        Duration::from_millis(50),
        || async {
            let crons = api.get("/api/crons").await.expect(200);
            if crons["crons"].as_array().is_some_and(|c| !c.is_empty()) {
                Ok(crons)
            } else {
                Err(crons.to_string())
            }
        },
    )
    .await
    .unwrap();
    let yearly = &crons["crons"][0];
    assert_eq!(yearly["name"], "yearly", "{crons}");
    assert_eq!(yearly["expression"], "0 0 1 1 *");
    assert_eq!(yearly["role"], "scheduler");
    assert!(yearly["next_run"].is_string(), "{yearly}");
    assert_eq!(yearly["paused_at"], Value::Null);

    // Pause and resume, recorded with who did it.
    let paused = admin.post("/api/crons/yearly/pause").await.expect(200);
    assert_eq!(paused["paused"], true);
    let detail = api.get("/api/crons/yearly").await.expect(200);
    assert!(detail["cron"]["paused_at"].is_string(), "{detail}");
    assert_eq!(detail["cron"]["paused_by"], "api 127.0.0.1", "{detail}");
    let resumed = admin.post("/api/crons/yearly/resume").await.expect(200);
    assert_eq!(resumed["paused"], false);
    let detail = api.get("/api/crons/yearly").await.expect(200);
    assert_eq!(detail["cron"]["paused_at"], Value::Null, "{detail}");

    // Trigger now: the leader runs a tick at the returned instant, twice.
    let mut instants = Vec::new();
    for _ in 0..2 {
        let triggered = admin.post("/api/crons/yearly/trigger").await.expect(202);
        let at = triggered["scheduled_at"].as_str().unwrap().to_owned();
        let at = chrono::DateTime::parse_from_rfc3339(&at).unwrap();
        wait_for(
            "the triggered tick to succeed",
            SOON,
            Duration::from_millis(50),
            || async {
                let ticks = api.get("/api/crons/yearly/ticks").await.expect(200);
                let done = ticks["items"].as_array().unwrap().iter().any(|t| {
                    t["state"] == "succeeded"
                        && t["scheduled_at"]
                            .as_str()
                            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
                            == Some(at)
                });
                if done { Ok(()) } else { Err(ticks.to_string()) }
            },
        )
        .await
        .unwrap();
        instants.push(at);
    }
    assert!(instants[0] < instants[1], "{instants:?}");

    // The detail shows the newest tick; the ticks page back in time.
    let detail = api.get("/api/crons/yearly?limit=1").await.expect(200);
    assert_eq!(detail["cron"]["last"]["state"], "succeeded", "{detail}");
    assert_eq!(
        detail["ticks"]["items"].as_array().unwrap().len(),
        1,
        "{detail}"
    );
    let next = detail["ticks"]["next"].as_i64().expect("an older tick");
    let older = api
        .get(&format!("/api/crons/yearly/ticks?limit=1&before={next}"))
        .await
        .expect(200);
    let older_at = older["items"][0]["scheduled_at"].as_str().unwrap();
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(older_at).unwrap(),
        instants[0],
        "{older}"
    );
    assert_eq!(older["next"], Value::Null, "{older}");

    // Unknown crons.
    api.get("/api/crons/no_such_cron").await.expect_error(404);
    api.get("/api/crons/no_such_cron/ticks")
        .await
        .expect_error(404);
    for action in ["pause", "resume", "trigger"] {
        admin
            .post(&format!("/api/crons/no_such_cron/{action}"))
            .await
            .expect_error(404);
    }

    // Every write is in the audit trail.
    let audit = api
        .get("/api/cluster/events?kind=admin_action&limit=500")
        .await
        .expect(200);
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["detail"]["subject"] == "yearly")
        .map(|e| e["detail"]["action"].as_str().unwrap())
        .collect();
    for action in ["pause_cron", "resume_cron", "trigger_cron"] {
        assert!(actions.contains(&action), "{action} in {actions:?}");
    }
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_and_queues_are_listed_filtered_paged_retried_cancelled_and_deleted() {
    let (db, pool) = setup().await;
    let node = admin_node(db.url(), "a", Some(TOKEN)).await;
    let api = Api::of(&node);
    let admin = api.with_token(TOKEN);
    let jobs = client(&pool);
    let enqueue = |job: NewJob| {
        let jobs = jobs.clone();
        async move { jobs.enqueue_job(job).await.unwrap().id() }
    };

    // A dead job (discarded on its first attempt), a running one, five idle ones (no node
    // works their queue).
    let dead = enqueue(
        NewJob::new(
            plain,
            Behave {
                fail_attempts: 1,
                discard: true,
                ..Behave::tag("dead")
            },
        )
        .queue("work"),
    )
    .await;
    let slow = enqueue(
        NewJob::new(
            plain,
            Behave {
                sleep_ms: 600_000,
                ..Behave::tag("slow")
            },
        )
        .queue("work"),
    )
    .await;
    let mut idle = Vec::new();
    for i in 0..5 {
        idle.push(
            enqueue(NewJob::new(plain, Behave::tag(format!("idle-{i}"))).queue("idle")).await,
        );
    }
    wait_state(&pool, dead, JobState::Dead).await;
    wait_state(&pool, slow, JobState::Running).await;

    // One job, with its attempts' errors.
    let job = api.get(&format!("/api/jobs/{dead}")).await.expect(200);
    assert_eq!(job["id"], dead.0);
    assert_eq!(job["state"], "dead");
    assert_eq!(job["kind"], "plain");
    assert_eq!(job["queue"], "work");
    assert_eq!(job["args"]["tag"], "dead");
    assert_eq!(job["errors"][0]["attempt"], 1, "{job}");
    assert_eq!(job["errors"][0]["reason"], "discard", "{job}");
    assert_eq!(job["errors"][0]["node"], "a", "{job}");
    assert!(
        job["errors"][0]["error"]
            .as_str()
            .unwrap()
            .contains("discarded on attempt 1"),
        "{job}"
    );

    // Lists: filters and pages.
    let mut seen = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let path = match before {
            Some(b) => format!("/api/jobs?queue=idle&limit=2&before={b}"),
            None => "/api/jobs?queue=idle&limit=2".to_owned(),
        };
        let page = api.get(&path).await.expect(200);
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 2, "{page}");
        seen.extend(items.iter().map(|j| j["id"].as_i64().unwrap()));
        match page["next"].as_i64() {
            Some(next) => before = Some(next),
            None => break,
        }
    }
    let mut expected: Vec<i64> = idle.iter().map(|id| id.0).collect();
    expected.reverse();
    assert_eq!(seen, expected, "newest first, each once");
    let by_args = api
        .get(&format!(
            "/api/jobs?args={}",
            encode(&json!({ "tag": "idle-3" }).to_string())
        ))
        .await
        .expect(200);
    assert_eq!(by_args["items"].as_array().unwrap().len(), 1, "{by_args}");
    assert_eq!(by_args["items"][0]["id"], idle[3].0);
    let by_state = api
        .get("/api/jobs?state=dead,running&kind=plain")
        .await
        .expect(200);
    let mut ids: Vec<i64> = by_state["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_i64().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, vec![dead.0, slow.0], "{by_state}");

    // Queues: depth, oldest job, paused.
    let queues = api.get("/api/queues").await.expect(200);
    let queue = |queues: &Value, name: &str| {
        queues["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["queue"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} in {queues}"))
    };
    let idle_queue = queue(&queues, "idle");
    assert_eq!(idle_queue["available"], 5, "{queues}");
    assert!(idle_queue["oldest_available_age_s"].as_f64().unwrap() >= 0.0);
    assert_eq!(idle_queue["paused"], false);
    let work = queue(&queues, "work");
    assert_eq!(work["running"], 1, "{queues}");
    assert_eq!(work["dead"], 1, "{queues}");

    // One job: a running job cannot be deleted, but cancelled; the dead one retried runs
    // again and completes (its second attempt succeeds); a finished job deleted is gone.
    let refused = admin.delete(&format!("/api/jobs/{slow}")).await;
    let message = refused.expect_error(409);
    assert!(message.contains("running"), "{message}");
    let cancelled = admin
        .post(&format!("/api/jobs/{slow}/cancel"))
        .await
        .expect(200);
    assert_eq!(cancelled["outcome"], "applied");
    wait_state(&pool, slow, JobState::Cancelled).await;
    admin
        .post(&format!("/api/jobs/{slow}/cancel"))
        .await
        .expect_error(409);
    let retried = admin
        .post(&format!("/api/jobs/{dead}/retry"))
        .await
        .expect(200);
    assert_eq!(retried["outcome"], "applied");
    wait_state(&pool, dead, JobState::Completed).await;
    let deleted = admin.delete(&format!("/api/jobs/{dead}")).await.expect(200);
    assert_eq!(deleted["outcome"], "applied");
    api.get(&format!("/api/jobs/{dead}"))
        .await
        .expect_error(404);
    for (method, path) in [
        ("POST", "/api/jobs/987654321/retry"),
        ("POST", "/api/jobs/987654321/cancel"),
        ("DELETE", "/api/jobs/987654321"),
        ("GET", "/api/jobs/987654321"),
    ] {
        admin.call(method, path, None).await.expect_error(404);
    }

    // Bulk: cancel one by its arguments, then every idle one, retry the cancelled, delete.
    let one = admin
        .post_json(
            "/api/jobs/bulk/cancel",
            r#"{"queue": "idle", "args": {"tag": "idle-0"}}"#,
        )
        .await
        .expect(200);
    assert_eq!(one["affected"], 1, "{one}");
    assert_eq!(
        api.get(&format!("/api/jobs/{}", idle[0])).await.expect(200)["state"],
        "cancelled"
    );
    let rest = admin
        .post_json(
            "/api/jobs/bulk/cancel",
            r#"{"queue": "idle", "state": "available"}"#,
        )
        .await
        .expect(200);
    assert_eq!(rest["affected"], 4, "{rest}");
    let again = admin
        .post_json(
            "/api/jobs/bulk/retry",
            r#"{"queue": "idle", "state": ["cancelled"]}"#,
        )
        .await
        .expect(200);
    assert_eq!(again["affected"], 5, "{again}");
    let available = api
        .get("/api/jobs?queue=idle&state=available")
        .await
        .expect(200);
    assert_eq!(
        available["items"].as_array().unwrap().len(),
        5,
        "{available}"
    );
    let gone = admin
        .post_json("/api/jobs/bulk/delete", r#"{"queue": "idle"}"#)
        .await
        .expect(200);
    assert_eq!(gone["affected"], 5, "{gone}");
    let none = api.get("/api/jobs?queue=idle").await.expect(200);
    assert_eq!(none["items"], json!([]), "{none}");

    // Queues: paused, a job waits in it, resumed, the job runs.
    let paused = admin.post("/api/queues/work/pause").await.expect(200);
    assert_eq!(paused["paused"], true);
    let queues = api.get("/api/queues").await.expect(200);
    assert_eq!(queue(&queues, "work")["paused"], true, "{queues}");
    let later = enqueue(NewJob::new(plain, Behave::tag("later")).queue("work")).await;
    let resumed = admin.post("/api/queues/work/resume").await.expect(200);
    assert_eq!(resumed["paused"], false);
    assert_eq!(resumed["was_paused"], true);
    wait_state(&pool, later, JobState::Completed).await;
    let queues = api.get("/api/queues").await.expect(200);
    if let Some(work) = queues["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "work")
    {
        assert_eq!(work["paused"], false, "{queues}");
    }

    // The audit trail has every write, by this client.
    let audit = api
        .get("/api/cluster/events?kind=admin_action&limit=500")
        .await
        .expect(200);
    let items = audit["items"].as_array().unwrap();
    for action in [
        "cancel_job",
        "retry_job",
        "delete_job",
        "cancel_jobs",
        "retry_jobs",
        "delete_jobs",
        "pause_queue",
        "resume_queue",
    ] {
        let event = items
            .iter()
            .find(|e| e["detail"]["action"] == action)
            .unwrap_or_else(|| panic!("{action} in {audit}"));
        assert_eq!(event["detail"]["by"], "api 127.0.0.1", "{event}");
    }
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_need_the_token_reads_the_read_token_and_read_only_refuses_every_write() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    // The schema, for the reads.
    Node::builder(config(db.url(), "migrator"))
        .auto_register(false)
        .start()
        .await
        .unwrap()
        .shutdown()
        .await;

    // Token and read token.
    let (api, _guard) = standalone(pool.clone(), |c| {
        c.admin.token = Some(TOKEN.into());
        c.admin.read_token = Some(READ_TOKEN.into());
    })
    .await;
    let read = "/api/cluster/nodes";
    let write = "/api/crons/no_such_cron/pause";
    api.get(read).await.expect_error(401);
    api.with_token("wrong-token-0123456789")
        .get(read)
        .await
        .expect_error(401);
    api.with_token(READ_TOKEN).get(read).await.expect(200);
    api.with_token(TOKEN).get(read).await.expect(200);
    // The probes stay open, and so does the vocabulary (no data of the cluster): every
    // event kind, job state and job action of the Rust enums, each action with its states.
    api.get("/api/health/live").await.expect(200);
    api.get("/api/health/ready").await.expect(200);
    let meta = api.get("/api/meta").await.expect(200);
    let names = |key: &str| -> Vec<String> {
        meta[key]
            .as_array()
            .unwrap_or_else(|| panic!("no {key} in {meta}"))
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let kinds: Vec<&str> = forge::inspect::EventKind::ALL
        .iter()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(names("event_kinds"), kinds, "{meta}");
    let states: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(names("job_states"), states, "{meta}");
    let groups = meta["event_groups"].as_array().unwrap();
    let leadership = groups
        .iter()
        .find(|g| g["group"] == "leadership")
        .unwrap_or_else(|| panic!("no leadership group in {meta}"));
    assert!(
        leadership["kinds"]
            .as_array()
            .unwrap()
            .iter()
            .all(|k| k.as_str().is_some_and(|k| k.starts_with("leader_"))),
        "{meta}"
    );
    for action in forge::jobs::JobAction::ALL {
        let shown = meta["job_actions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["action"] == action.as_str())
            .unwrap_or_else(|| panic!("no {} in {meta}", action.as_str()));
        let expected: Vec<&str> = action.states().iter().map(|s| s.as_str()).collect();
        assert_eq!(shown["states"], json!(expected), "{meta}");
    }
    api.post(write).await.expect_error(401);
    api.with_token("wrong-token-0123456789")
        .post(write)
        .await
        .expect_error(401);
    // A prefix or an extension of the token is wrong too.
    api.with_token(&TOKEN[..TOKEN.len() - 1])
        .post(write)
        .await
        .expect_error(401);
    api.with_token(&format!("{TOKEN}x"))
        .post(write)
        .await
        .expect_error(401);
    let message = api
        .with_token(READ_TOKEN)
        .post(write)
        .await
        .expect_error(403);
    assert!(message.contains("only read"), "{message}");
    // Authorized: the write goes through to the model (the cron is unknown).
    api.with_token(TOKEN).post(write).await.expect_error(404);
    let unauthorized = api.post(write).await;
    assert!(!unauthorized.text.contains(TOKEN) && !unauthorized.text.contains(READ_TOKEN));

    // No token configured: reads open, writes refused with how to allow them.
    let (open, _guard2) = standalone(pool.clone(), |_| {}).await;
    open.get(read).await.expect(200);
    let message = open.with_token(TOKEN).post(write).await.expect_error(403);
    assert!(message.contains("[admin] token"), "{message}");
    let message = open
        .with_token(TOKEN)
        .post_json("/api/jobs/bulk/delete", r#"{"all": true}"#)
        .await
        .expect_error(403);
    assert!(message.contains("[admin] token"), "{message}");

    // Read-only: every write refused, whatever the token; reads still work.
    let (read_only, _guard3) = standalone(pool.clone(), |c| {
        c.admin.token = Some(TOKEN.into());
        c.admin.read_only = true;
    })
    .await;
    read_only.get(read).await.expect(200);
    for (method, path) in [
        ("POST", write),
        ("POST", "/api/cluster/roles/scheduler/step-down"),
        ("POST", "/api/jobs/1/retry"),
        ("DELETE", "/api/jobs/1"),
        ("POST", "/api/queues/work/pause"),
    ] {
        let message = read_only
            .with_token(TOKEN)
            .call(method, path, None)
            .await
            .expect_error(403);
        assert!(message.contains("read-only"), "{message}");
    }
    let config = read_only.get("/api/cluster/config").await.expect(200);
    assert_eq!(config["access"]["writes"], "read_only");
    assert!(!config.to_string().contains(TOKEN));

    // Nothing was written by the refused requests.
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM forge.events WHERE kind = 'admin_action'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(audited, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_400_unknown_ids_a_404_never_a_500() {
    let db = fresh_db().await;
    let node = admin_node(db.url(), "a", Some(TOKEN)).await;
    let api = Api::of(&node);
    let admin = api.with_token(TOKEN);
    for path in [
        "/api/jobs?state=bogus",
        "/api/jobs?limit=0",
        "/api/jobs?limit=501",
        "/api/jobs?limit=ten",
        "/api/jobs?before=yesterday",
        "/api/jobs?args=%7Bnot-json",
        "/api/jobs?queue=idle&unknown=1",
        "/api/jobs/not-a-number",
        "/api/cluster/events?kind=nope",
        "/api/cluster/events?role=Not%20A%20Role",
        "/api/cluster/history?limit=-1",
        "/api/crons/yearly?limit=0",
    ] {
        let message = api.get(path).await.expect_error(400);
        assert!(!message.is_empty(), "{path}");
    }
    for (path, body) in [
        ("/api/jobs/bulk/cancel", "{not json"),
        ("/api/jobs/bulk/cancel", r#"{"queu": "idle"}"#),
        ("/api/jobs/bulk/cancel", r#"{"state": "bogus"}"#),
        ("/api/jobs/bulk/delete", "{}"),
        ("/api/jobs/bulk/retry", r#"{"state": 7}"#),
    ] {
        admin.post_json(path, body).await.expect_error(400);
    }
    // A body that is not declared JSON.
    let reply = admin.post("/api/jobs/bulk/cancel").await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    admin
        .post("/api/queues/bad%20queue%21/pause")
        .await
        .expect_error(400);
    admin
        .post_json("/api/jobs/bulk/explode", r#"{"all": true}"#)
        .await
        .expect_error(404);
    api.get("/api/no/such/endpoint").await.expect_error(404);
    api.get("/no-such-page").await.expect_error(404);
    admin.delete("/api/crons").await.expect_error(405);
    api.get("/api/jobs/987654321").await.expect_error(404);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_series_are_the_aggregators_points_and_bad_input_is_a_400() {
    let (db, pool) = setup().await;
    // The metrics aggregator rolls the node's counters up every second.
    let config = served_job_config(db.url(), "series-a", true);
    let node = Node::builder(config)
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .expect("node starts");
    let api = Api::of(&node);
    for i in 0..3 {
        let job = NewJob::new(plain, Behave::tag(format!("series-{i}"))).queue("work");
        let id = client(&pool).enqueue_job(job).await.unwrap().id();
        wait_state(&pool, id, JobState::Completed).await;
    }

    // One series over 5 minutes: its points, oldest first, count exactly the three
    // completions (the rollup reads the nodes' counters once: none lost, none twice).
    let completed = wait_for(
        "completions in the jobs_completed series",
        SOON,
        Duration::from_millis(100),
        || async {
            let body = api
                .get("/api/dashboard/series?series=jobs_completed&minutes=5")
                .await
                .expect(200);
            let sum: f64 = body["points"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["label"] == "work")
                .map(|p| p["value"].as_f64().unwrap())
                .sum();
            if sum == 3.0 {
                Ok(body)
            } else {
                Err(body.to_string())
            }
        },
    )
    .await
    .unwrap();
    let instant = |v: &Value| {
        chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap())
            .unwrap_or_else(|e| panic!("{v}: {e}"))
    };
    let window = instant(&completed["now"]) - instant(&completed["since"]);
    assert_eq!(window.num_seconds(), 300, "{completed}");
    let points = completed["points"].as_array().unwrap();
    assert!(
        points.iter().all(|p| p["series"] == "jobs_completed"),
        "{completed}"
    );
    let times: Vec<_> = points.iter().map(|p| instant(&p["at"])).collect();
    assert!(times.is_sorted(), "oldest first: {completed}");
    assert!(
        times.iter().all(|at| *at >= instant(&completed["since"])),
        "{completed}"
    );

    // Every series by default (the last hour), or the ones named (spaces allowed).
    let all = api.get("/api/dashboard/series").await.expect(200);
    let window = instant(&all["now"]) - instant(&all["since"]);
    assert_eq!(window.num_seconds(), 3600, "{all}");
    let named = |body: &Value| -> std::collections::BTreeSet<String> {
        body["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["series"].as_str().unwrap().to_owned())
            .collect()
    };
    let every = named(&all);
    assert!(
        every.contains("jobs_completed") && every.contains("job_attempts") && every.len() > 2,
        "{every:?}"
    );
    let two = api
        .get("/api/dashboard/series?series=jobs_completed,%20job_attempts&minutes=10080")
        .await
        .expect(200);
    assert_eq!(
        named(&two),
        ["job_attempts".to_owned(), "jobs_completed".to_owned()].into(),
        "{two}"
    );

    // Bad input: a 400 with a JSON error (naming the parameter where the endpoint checks it).
    let many = vec!["jobs_completed"; 33].join(",");
    let long = "a".repeat(65);
    for (query, parameter) in [
        ("minutes=0", Some("minutes")),
        ("minutes=10081", Some("minutes")),
        ("minutes=-5", None),
        ("minutes=soon", None),
        ("series=Jobs-Completed", Some("series")),
        ("series=jobs_completed;drop", Some("series")),
        (&*format!("series={long}"), Some("series")),
        (&*format!("series={many}"), Some("series")),
        ("serie=jobs_completed", None),
    ] {
        let reply = api.get(&format!("/api/dashboard/series?{query}")).await;
        let body = reply.body.clone();
        let message = reply.expect_error(400);
        assert!(!message.is_empty(), "{query}");
        if let Some(parameter) = parameter {
            assert_eq!(body["parameter"], parameter, "{query}: {body}");
        }
    }

    // Behind the read token when one is set, like every read.
    let (guarded, _server) = standalone(pool.clone(), |c| {
        c.admin.read_token = Some(READ_TOKEN.to_owned());
    })
    .await;
    guarded.get("/api/dashboard/series").await.expect_error(401);
    let body = guarded
        .with_token(READ_TOKEN)
        .get("/api/dashboard/series?series=jobs_completed")
        .await
        .expect(200);
    assert!(!body["points"].as_array().unwrap().is_empty(), "{body}");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_503_while_postgresql_is_unreachable_and_reads_are_503s() {
    // An API over a database that is not there: a port nobody listens on.
    let dead_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(1))
        .connect_lazy(&format!(
            "postgres://postgres:pw@127.0.0.1:{dead_port}/nothing"
        ))
        .unwrap();
    let (api, _guard) = standalone(pool, |c| c.admin.token = Some(TOKEN.into())).await;
    api.get("/api/health/live").await.expect(200);
    let ready = api.get("/api/health/ready").await;
    assert_eq!(ready.status, 503, "{}", ready.text);
    assert_eq!(ready.body["status"], "not_ready");
    for path in [
        "/api/cluster/status",
        "/api/cluster/nodes",
        "/api/jobs",
        "/api/crons",
    ] {
        let reply = api.get(path).await;
        assert!(!reply.text.contains("pw@"), "{}", reply.text);
        let message = reply.expect_error(503);
        assert!(message.contains("database"), "{message}");
    }
    api.with_token(TOKEN)
        .post("/api/crons/x/pause")
        .await
        .expect_error(503);

    // A node whose pool loses PostgreSQL (a silent network): not ready within the probe's
    // bound, ready again once the network heals.
    let server = PgServer::shared().unwrap();
    let db = server.create_database().await.unwrap();
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let node = admin_node(&proxy.url_for(server, db.name()), "a", Some(TOKEN)).await;
    let api = Api::of(&node);
    api.get("/api/health/ready").await.expect(200);
    let pool_filter = Filter::application_prefix("forge:pool:a");
    proxy.blackhole(pool_filter.clone());
    wait_until("not ready", SOON, Duration::from_millis(100), || async {
        let reply = api.get("/api/health/ready").await;
        (reply.status == 503).then_some(reply)
    })
    .await
    .unwrap();
    let status = api.get("/api/cluster/status").await;
    assert_eq!(status.status, 503, "{}", status.text);
    api.get("/api/health/live").await.expect(200);
    proxy.heal(&pool_filter);
    proxy.sever(&pool_filter);
    wait_until("ready again", SOON, Duration::from_millis(100), || async {
        (api.get("/api/health/ready").await.status == 200).then_some(())
    })
    .await
    .unwrap();
    api.get("/api/cluster/status").await.expect(200);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serves_the_api_on_admin_listen_records_its_url_and_stops_it_on_shutdown() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    // Without [admin] listen: no API, no URL in membership.
    let quiet = start_node(db.url(), "quiet", &[]).await;
    assert_eq!(quiet.admin_url(), None);
    let url: Option<String> =
        sqlx::query_scalar("SELECT admin_url FROM forge.nodes WHERE node_id = 'quiet'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(url, None);

    // With it: served on the bound port, recorded from the first heartbeat.
    let node = admin_node(db.url(), "served", None).await;
    let url = node.admin_url().unwrap().to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let recorded: Option<String> =
        sqlx::query_scalar("SELECT admin_url FROM forge.nodes WHERE node_id = 'served'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(recorded.as_deref(), Some(url.as_str()));
    let api = Api::of(&node);
    let this = api.get("/api/cluster/this").await.expect(200);
    assert_eq!(this["node_id"], "served");
    assert_eq!(this["admin_url"], url.as_str());

    // The same API mounted in an application's own router answers the same.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mounted = Api {
        addr: listener.local_addr().unwrap(),
        token: None,
    };
    let app = forge::admin::axum::Router::new().merge(quiet.admin_router());
    let server = tokio::spawn(async move {
        forge::admin::axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    let nodes = mounted.get("/api/cluster/nodes").await.expect(200);
    assert_eq!(nodes["total"], 2, "{nodes}");
    assert_eq!(
        mounted.get("/api/cluster/this").await.expect(200)["node_id"],
        "quiet"
    );
    server.abort();

    // A port already taken: the node refuses to start, saying which key.
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = job_config(db.url(), "clash");
    config.admin.listen = Some(taken.local_addr().unwrap());
    let err = Node::builder(config)
        .auto_register(false)
        .start()
        .await
        .err()
        .expect("the port is taken");
    assert!(err.to_string().contains("admin.listen"), "{err}");

    // Shutdown stops the API: the port no longer answers.
    node.shutdown().await;
    let gone = api.send("GET", "/api/health/live", None).await;
    assert!(gone.is_err(), "still answering after shutdown: {gone:?}");
    quiet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_down_with_no_standby_is_refused_with_409_unless_forced() {
    let db = fresh_db().await;
    let solo = admin_node(db.url(), "solo", Some(TOKEN)).await;
    let (_, epoch) = wait_single_leader(&[&solo], &Role::SCHEDULER).await;
    let api = Api::of(&solo).with_token(TOKEN);
    let refused = api
        .post("/api/cluster/roles/scheduler/step-down")
        .await
        .expect_error(409);
    assert!(
        refused.contains("no standby") && refused.contains("force"),
        "{refused}"
    );
    api.post_json(
        "/api/cluster/roles/scheduler/step-down",
        "{\"forse\": true}",
    )
    .await
    .expect_error(400);
    let asked = api
        .post_json(
            "/api/cluster/roles/scheduler/step-down",
            "{\"force\": true}",
        )
        .await
        .expect(202);
    assert_eq!(asked["epoch"], epoch, "{asked}");
    assert_eq!(asked["standbys"], 0, "{asked}");
    wait_for(
        "the node to lead the scheduler again",
        SOON,
        Duration::from_millis(10),
        || async {
            let now = api.get("/api/cluster/leaders/scheduler").await.expect(200);
            if now["led"] == true && now["epoch"].as_i64().unwrap() > epoch {
                Ok(())
            } else {
                Err(now.to_string())
            }
        },
    )
    .await
    .unwrap();
    solo.shutdown().await;
}

/// After a SIGKILL of the scheduler's leader, every endpoint tells the same truth at once: the
/// killed node leads nothing (also before it is marked down), each role is led by the one node
/// `forge.leaders` names, the failover's gap is the takeover (measured from the lock grant, and
/// never longer than from the kill to the election), and the status stays healthy - the dead
/// node is a warning - with each expected role led.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sigkill_the_dead_node_leads_nothing_and_the_gap_is_the_takeover() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let dir = ScratchDir::new("admin-sigkill");
    let mut probes = probes_with_standbys(&db, &dir.0, ["k1", "k2", "k3"]).await;
    let (api, _guard) = standalone(pool.clone(), |_| {}).await;
    let (victim, epoch, before_kill) = kill_scheduler_leader(&pool, &mut probes).await;
    let successor = wait_for(
        "a new scheduler leader",
        SOON,
        Duration::from_millis(5),
        || async {
            let leader = api.get("/api/cluster/leaders/scheduler").await.expect(200);
            if leader["led"] == true && leader["epoch"].as_i64() > Some(epoch) {
                Ok(leader)
            } else {
                Err(leader.to_string())
            }
        },
    )
    .await
    .unwrap();
    assert_ne!(successor["node_id"], victim.as_str(), "{successor}");

    // The killed node leads nothing, whatever its last heartbeat said: asked at once, before
    // the scheduler's watch marks it down.
    let dead = api
        .get(&format!("/api/cluster/nodes/{victim}"))
        .await
        .expect(200);
    assert_eq!(dead["leads"], json!([]), "{dead}");
    assert_eq!(successor["state"], "led", "{successor}");
    // Each role is led by exactly one node, the one the leaders say. The other roles the victim
    // led fail over on their own, so the two reads may straddle one of their elections: read
    // both again until they agree (a disagreement that lasts fails the test with it).
    wait_for(
        "the leaders and the nodes to name the same leader of each role",
        SOON,
        Duration::from_millis(5),
        || async {
            let leaders = api.get("/api/cluster/leaders").await.expect(200);
            let nodes = api.get("/api/cluster/nodes").await.expect(200);
            for role in BUILTIN_ROLES {
                let leader = leaders["leaders"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|l| l["role"] == role)
                    .unwrap_or_else(|| panic!("{role} in {leaders}"));
                let leading: Vec<&Value> = nodes["nodes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|n| n["leads"].as_array().unwrap().iter().any(|r| r == role))
                    .collect();
                // The killed node never leads, in either read.
                assert!(
                    leading.iter().all(|n| n["node_id"] != victim.as_str()),
                    "{role}: {nodes}"
                );
                let agree = if leader["led"] == true {
                    assert_ne!(leader["node_id"], victim.as_str(), "{role}: {leaders}");
                    leading.len() == 1 && leading[0]["node_id"] == leader["node_id"]
                } else {
                    leading.is_empty()
                };
                if !agree {
                    return Err(format!("{role}: leaders {leaders}, nodes {nodes}"));
                }
            }
            Ok(())
        },
    )
    .await
    .unwrap();

    // The failover's gap: from the lock grant (a standby waited inside the lock), and no
    // longer than from the kill to the election.
    let history = api
        .get("/api/cluster/history?role=scheduler&limit=1")
        .await
        .expect(200);
    let tenure = &history["items"][0];
    assert_eq!(tenure["epoch"], successor["epoch"], "{history}");
    assert_eq!(tenure["failover"], true, "{history}");
    assert_eq!(tenure["gap_from"], "lock_granted", "{history}");
    let acquired = chrono::DateTime::parse_from_rfc3339(tenure["acquired_at"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    let since_kill = (acquired - before_kill).num_microseconds().unwrap() as f64 / 1000.0;
    let gap = tenure["gap_ms"].as_f64().unwrap();
    assert!(
        (0.0..=since_kill).contains(&gap),
        "the gap {gap} ms is at most the {since_kill} ms from the kill to the election: {history}"
    );
    let elected = api
        .get("/api/cluster/events?kind=leader_elected&role=scheduler&limit=1")
        .await
        .expect(200);
    assert_eq!(elected["items"][0]["detail"]["gap_from"], "lock_granted");
    assert_eq!(elected["items"][0]["detail"]["gap_ms"], tenure["gap_ms"]);

    // The status: every expected role led, healthy; once the node is marked down, a warning.
    let status = wait_for(
        "the killed node down, every role led",
        SOON,
        Duration::from_millis(50),
        || async {
            let status = api.get("/api/cluster/status").await.expect(200);
            let down = status["nodes"]["down"] == 1;
            let led = status["roles"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["led"] == true);
            if down && led {
                Ok(status)
            } else {
                Err(status.to_string())
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(status["healthy"], true, "{status}");
    assert_eq!(status["problems"], json!([]), "{status}");
    assert_eq!(status["leaderless"], json!([]), "{status}");
    assert_eq!(
        status["warnings"],
        json!([format!("node {victim} is down")]),
        "{status}"
    );
    assert_eq!(status["nodes"]["active"], 2, "{status}");
    let roles: Vec<&str> = status["roles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["log_compactor", "metrics_aggregator", "scheduler"]);
    let now = chrono::DateTime::parse_from_rfc3339(status["now"].as_str().unwrap()).unwrap();
    assert!(
        (chrono::Utc::now() - now.with_timezone(&chrono::Utc))
            .num_seconds()
            .abs()
            < 5,
        "the status has the database's now: {status}"
    );
    let dead = api
        .get(&format!("/api/cluster/nodes/{victim}"))
        .await
        .expect(200);
    assert_eq!(dead["state"], "down", "{dead}");
    assert_eq!(dead["live"], false, "{dead}");
    assert_eq!(dead["leads"], json!([]), "{dead}");
    for probe in &probes {
        let _ = probe.process.terminate();
    }
}

/// A queue no node works and that holds no job is a 404 to pause or resume (a typo must not
/// show as a paused queue), unless the caller says it means a new queue; a queue that a node
/// works, or that holds jobs, pauses without more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_a_queue_nobody_knows_is_a_404_unless_it_is_new() {
    let (db, pool) = setup().await;
    let node = admin_node(db.url(), "q", Some(TOKEN)).await;
    let admin = Api::of(&node).with_token(TOKEN);
    let message = admin
        .post("/api/queues/never-existed/pause")
        .await
        .expect_error(404);
    assert!(
        message.contains("never-existed") && message.contains("new"),
        "{message}"
    );
    admin
        .post("/api/queues/never-existed/resume")
        .await
        .expect_error(404);
    let queues = admin.get("/api/queues").await.expect(200);
    assert!(
        !queues.to_string().contains("never-existed"),
        "the typo is no queue: {queues}"
    );
    let paused: i64 = sqlx::query_scalar("SELECT count(*) FROM forge.queues")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(paused, 0);

    // Meant: a queue paused before any node works it.
    let reply = admin
        .post_json("/api/queues/coming-soon/pause", r#"{"new": true}"#)
        .await
        .expect(200);
    assert_eq!(reply["paused"], true, "{reply}");
    let queues = admin.get("/api/queues").await.expect(200);
    let listed = queues["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "coming-soon")
        .cloned();
    assert_eq!(
        listed.map(|q| q["paused"].clone()),
        Some(json!(true)),
        "{queues}"
    );
    let resumed = admin
        .post("/api/queues/coming-soon/resume")
        .await
        .expect(200);
    assert_eq!(resumed["was_paused"], true, "{resumed}");
    // Resumed, it is unknown again.
    admin
        .post("/api/queues/coming-soon/resume")
        .await
        .expect_error(404);
    admin
        .post_json("/api/queues/x/pause", r#"{"new": "yes"}"#)
        .await
        .expect_error(400);

    // The node works `work`: known. A queue no node works that holds a job: known.
    let reply = admin.post("/api/queues/work/pause").await.expect(200);
    assert_eq!(reply["was_paused"], false, "{reply}");
    let reply = admin.post("/api/queues/work/pause").await.expect(200);
    assert_eq!(reply["was_paused"], true, "{reply}");
    admin.post("/api/queues/work/resume").await.expect(200);
    client(&pool)
        .enqueue_job(NewJob::new(plain, Behave::tag("parked")).queue("parked"))
        .await
        .unwrap();
    admin.post("/api/queues/parked/pause").await.expect(200);
    admin.post("/api/queues/parked/resume").await.expect(200);
    node.shutdown().await;
}

/// A body over the limit is a 413; a write that takes no body refuses one (400), and does
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_too_large_is_a_413_and_a_write_without_a_body_refuses_one() {
    let (db, pool) = setup().await;
    let node = admin_node(db.url(), "b", Some(TOKEN)).await;
    let admin = Api::of(&node).with_token(TOKEN);
    // The cron is registered: a write that took the junk would act on it.
    wait_until(
        "the cron registered",
        SOON,
        Duration::from_millis(20),
        || async { (admin.get("/api/crons/yearly").await.status == 200).then_some(()) },
    )
    .await
    .unwrap();
    let big = "x".repeat(10 * 1024 * 1024);
    let big_json = format!("{{\"state\": \"dead\", \"kind\": \"{big}\"}}");
    for (path, body) in [
        ("/api/jobs/bulk/retry", big_json.as_str()),
        ("/api/crons/yearly/pause", big.as_str()),
        ("/api/crons/yearly/trigger", big.as_str()),
        ("/api/queues/work/pause", big.as_str()),
        ("/api/cluster/roles/scheduler/step-down", big.as_str()),
        ("/api/jobs/1/retry", big.as_str()),
    ] {
        let reply = admin.post_large(path, body.as_bytes()).await;
        assert_eq!(reply.status, 413, "{path}: {}", reply.text);
        assert_eq!(
            reply.body["code"], "payload_too_large",
            "{path}: {}",
            reply.text
        );
    }
    for path in [
        "/api/crons/yearly/pause",
        "/api/crons/yearly/resume",
        "/api/crons/yearly/trigger",
        "/api/queues/work/resume",
        "/api/jobs/1/cancel",
    ] {
        let message = admin.post_json(path, "junk").await.expect_error(400);
        assert!(message.contains("no body"), "{path}: {message}");
    }
    let deleted = admin.call("DELETE", "/api/jobs/1", Some("{}")).await;
    assert_eq!(deleted.status, 400, "{}", deleted.text);
    let state: (
        Option<chrono::DateTime<chrono::Utc>>,
        Option<chrono::DateTime<chrono::Utc>>,
    ) = sqlx::query_as(
        "SELECT paused_at, trigger_requested_at FROM forge.crons WHERE name = 'yearly'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(state, (None, None), "nothing was paused or triggered");
    // Without a body (or an empty one), the same writes work.
    admin.post("/api/crons/yearly/pause").await.expect(200);
    admin
        .post_json("/api/crons/yearly/resume", "")
        .await
        .expect(200);
    node.shutdown().await;
}

/// PostgreSQL really stopped: every endpoint that needs it answers 503 within about 2 s (not
/// the pool's 10 s connect_timeout), saying since when the database is unreachable; readiness
/// too; the probes that need no database still answer; once it is back, so is everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_postgresql_stopped_every_request_fails_within_two_seconds_saying_since_when() {
    let server = tokio::task::spawn_blocking(PgServer::start)
        .await
        .unwrap()
        .unwrap();
    let db = server.create_database().await.unwrap();
    let mut config = served_job_config(db.url(), "ff", false);
    config.admin.token = Some(TOKEN.to_owned());
    // The default: what a request waited for before.
    config.database.connect_timeout = Duration::from_secs(10);
    let node = Node::builder(config)
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .expect("node starts");
    let api = Api::of(&node).with_token(TOKEN);
    api.get("/api/cluster/status").await.expect(200);
    tokio::task::block_in_place(|| server.stop()).unwrap();

    let mut first_since: Option<String> = None;
    for (method, path) in [
        ("GET", "/api/cluster/status"),
        ("GET", "/api/cluster/nodes"),
        ("GET", "/api/cluster/leaders"),
        ("GET", "/api/cluster/history"),
        ("GET", "/api/cluster/events"),
        ("GET", "/api/crons"),
        ("GET", "/api/jobs"),
        ("GET", "/api/queues"),
        ("GET", "/api/dashboard/series"),
        ("POST", "/api/queues/work/pause"),
        ("POST", "/api/jobs/1/retry"),
        ("GET", "/api/cluster/status"),
    ] {
        let started = std::time::Instant::now();
        let reply = api.call(method, path, None).await;
        let took = started.elapsed();
        assert_eq!(reply.status, 503, "{method} {path}: {}", reply.text);
        assert!(
            took < Duration::from_millis(3500),
            "{method} {path} took {took:?} to say the database is unreachable"
        );
        assert_eq!(reply.body["database"], "unreachable", "{}", reply.text);
        let since = reply.body["since"].as_str().unwrap_or_default().to_owned();
        assert!(
            reply.body["error"]
                .as_str()
                .unwrap()
                .contains("unreachable (since"),
            "{}",
            reply.text
        );
        // One outage, one instant it began.
        match &first_since {
            None => first_since = Some(since),
            Some(first) => assert_eq!(&since, first, "{method} {path}: {}", reply.text),
        }
    }
    let started = std::time::Instant::now();
    let ready = api.get("/api/health/ready").await;
    assert_eq!(ready.status, 503, "{}", ready.text);
    assert!(started.elapsed() < Duration::from_millis(3500));
    api.get("/api/health/live").await.expect(200);
    api.get("/api/cluster/config").await.expect(200);

    tokio::task::block_in_place(|| server.start_again()).unwrap();
    wait_until(
        "the API answering again",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { (api.get("/api/cluster/status").await.status == 200).then_some(()) },
    )
    .await
    .unwrap();
    let later = api.get("/api/crons").await.expect(200);
    assert!(later.get("since").is_none(), "{later}");
    node.shutdown().await;
}

/// A cron claimed ahead of its instant: its ticks say when the handler started (lag from the
/// instant, not 0 for a claim made ahead) and how long it ran (not finished minus claimed,
/// which adds the claim-ahead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticks_lag_and_duration_are_the_handlers() {
    let (db, _pool) = setup().await;
    let mut config = served_job_config(db.url(), "cr", false);
    config.admin.token = Some(TOKEN.to_owned());
    let sleepy = CronJob::new(
        "sleepy",
        Schedule::parse("* * * * * *").unwrap(),
        |_ctx: CronContext| async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            Ok::<_, forge::CronError>(())
        },
    );
    let node = Node::builder(config)
        .auto_register(false)
        .cron(sleepy)
        .start()
        .await
        .expect("node starts");
    let api = Api::of(&node);
    let ticks = wait_for(
        "three finished ticks",
        SOON,
        Duration::from_millis(100),
        || async {
            let reply = api.get("/api/crons/sleepy/ticks").await;
            if reply.status != 200 {
                return Err(reply.text);
            }
            let ticks = reply.body;
            let done = ticks["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["state"] == "succeeded")
                .count();
            if done >= 3 {
                Ok(ticks)
            } else {
                Err(ticks.to_string())
            }
        },
    )
    .await
    .unwrap();
    for tick in ticks["items"].as_array().unwrap() {
        if tick["started_at"].is_null() {
            // Not started (claimed ahead of its instant): no lag, no duration yet.
            assert!(
                tick["lag_ms"].is_null() && tick["duration_ms"].is_null(),
                "{tick}"
            );
        }
        if tick["state"] != "succeeded" {
            continue;
        }
        let at = |field: &str| {
            chrono::DateTime::parse_from_rfc3339(tick[field].as_str().unwrap()).unwrap()
        };
        let ms =
            |from: &str, to: &str| (at(to) - at(from)).num_microseconds().unwrap() as f64 / 1000.0;
        // Started at or after the instant (claimed ahead of it when on time).
        assert!(at("started_at") >= at("scheduled_at"), "{tick}");
        let lag = tick["lag_ms"].as_f64().unwrap();
        assert!(
            lag > 0.0 && (lag - ms("scheduled_at", "started_at")).abs() < 0.01,
            "lag {lag} ms from the instant to the handler's start: {tick}"
        );
        // The handler's 30 ms, not the time since the claim: at most from the instant to the
        // outcome's record.
        let took = tick["duration_ms"].as_f64().unwrap();
        assert!(
            took >= 30.0 && took <= ms("scheduled_at", "finished_at") + 1.0,
            "the handler sleeps 30 ms: duration {took} ms: {tick}"
        );
    }
    let cron = api.get("/api/crons/sleepy").await.expect(200);
    assert!(
        cron["cron"]["last"]["duration_ms"].is_f64() || cron["cron"]["last"]["state"] == "running",
        "{cron}"
    );
    node.shutdown().await;
}

/// Jobs waiting for their parents are counted as `pending` by `GET /api/queues` and by the
/// aggregator's `forge_job_queue_depth{state="pending"}`; a stored cron's policies read back
/// from `GET /api/crons/{name}` in the words `PUT` takes (`job_options`), so that storing them
/// again changes nothing (what the dashboard's form of a change starts from).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_jobs_are_counted_and_a_stored_crons_policies_read_back_as_put_takes_them() {
    let (db, pool) = setup().await;
    let node = admin_node_with(db.url(), "a", Some(TOKEN), |config| {
        config.node.roles = Some(vec!["scheduler".into(), "metrics_aggregator".into()]);
    })
    .await;
    wait_single_leader(&[&node], &Role::METRICS_AGGREGATOR).await;
    let api = Api::of(&node);
    let admin = api.with_token(TOKEN);

    // No node works `flow`: the parent stays available, its children pending.
    crate::cli::parent_and_children(&pool, "flow", 2).await;
    let queues = api.get("/api/queues").await.expect(200);
    let flow = queues["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "flow")
        .unwrap_or_else(|| panic!("flow in {queues}"));
    assert_eq!(
        (&flow["available"], &flow["pending"]),
        (&json!(1), &json!(2)),
        "{flow}"
    );
    wait_until(
        "the pending jobs in forge_job_queue_depth",
        SOON,
        Duration::from_millis(50),
        || {
            let text = node.render_metrics();
            async move {
                (crate::jobs::metric(
                    &text,
                    r#"forge_job_queue_depth{queue="flow",kind="plain",state="pending"}"#,
                ) == Some(2.0))
                .then_some(())
            }
        },
    )
    .await
    .unwrap();

    let spec = json!({
        "expression": "*/5 * * * *", "kind": "plain", "args": {"tag": "report"},
        "catch_up": "all", "catch_up_window": "2h", "overlap": "skip", "timeout": "30s",
    });
    let put = |body: Value| {
        let admin = admin.clone();
        async move {
            admin
                .call("PUT", "/api/crons/report", Some(&body.to_string()))
                .await
                .expect(200)
        }
    };
    assert_eq!(put(spec.clone()).await["result"], "created");
    let cron = api.get("/api/crons/report").await.expect(200);
    let options = &cron["cron"]["job_options"];
    assert_eq!(
        options,
        &json!({
            "catch_up": "all", "catch_up_window": "2h", "overlap": "skip",
            "interrupted": "rerun", "timeout": "30s",
        }),
        "{cron}"
    );
    let mut again = json!({
        "expression": cron["cron"]["expression"], "kind": cron["cron"]["job_kind"],
        "args": cron["cron"]["job_args"],
    });
    for (key, value) in options.as_object().unwrap() {
        if !value.is_null() {
            again[key] = value.clone();
        }
    }
    assert_eq!(put(again).await["result"], "unchanged");
    let code = api.get("/api/crons/yearly").await.expect(200);
    assert_eq!(code["cron"]["job_options"], Value::Null, "{code}");
    node.shutdown().await;
}

/// `PUT /api/kinds/{kind}/limits` sets a job kind's limits as an operator's (shown by `GET
/// /api/kinds/limits`, stored with who set them), refuses bad values and a write without the
/// token with what is wrong, and `DELETE` gives them back to the code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kinds_limits_are_set_shown_refused_and_reset_over_http() {
    let (db, pool) = setup().await;
    let node = admin_node(db.url(), "k", Some(TOKEN)).await;
    let anonymous = Api::of(&node);
    let admin = anonymous.with_token(TOKEN);
    let body = r#"{"global_concurrency": 2, "rate": "10/1s", "rate_key": "customer"}"#;
    anonymous
        .call("PUT", "/api/kinds/sync/limits", Some(body))
        .await
        .expect_error(401);
    let reply = admin
        .call("PUT", "/api/kinds/sync/limits", Some(body))
        .await
        .expect(200);
    assert_eq!(reply["kind"], "sync", "{reply}");
    let listed = admin.get("/api/kinds/limits").await.expect(200);
    let sync = &listed["kinds"][0];
    assert_eq!(sync["kind"], "sync", "{listed}");
    assert_eq!(sync["limits"]["global_concurrency"], 2, "{listed}");
    assert_eq!(sync["limits"]["rate"], "10/1s", "{listed}");
    assert_eq!(sync["limits"]["rate_key"], "customer", "{listed}");
    let set_by: Option<String> =
        sqlx::query_scalar("SELECT set_by FROM forge.kind_limits WHERE kind = 'sync'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(set_by.is_some(), "an operator's limits say who set them");

    let message = admin
        .call(
            "PUT",
            "/api/kinds/sync/limits",
            Some(r#"{"rate": "10 a second"}"#),
        )
        .await
        .expect_error(400);
    assert!(message.contains("100/1m"), "{message}");
    let message = admin
        .call("PUT", "/api/kinds/sync/limits", Some(r#"{"global": 2}"#))
        .await
        .expect_error(400);
    assert!(message.contains("global"), "{message}");
    let message = admin
        .call("PUT", "/api/kinds/Bad%20Kind/limits", Some(body))
        .await
        .expect_error(400);
    assert!(message.contains("Bad Kind"), "{message}");
    let unchanged = admin.get("/api/kinds/limits").await.expect(200);
    assert_eq!(unchanged, listed, "a refused write changes nothing");

    let reply = admin.delete("/api/kinds/sync/limits").await.expect(200);
    assert_eq!(reply["had_operator_limits"], true, "{reply}");
    let listed = admin.get("/api/kinds/limits").await.expect(200);
    assert_eq!(listed["kinds"], json!([]), "{listed}");
    node.shutdown().await;
}
