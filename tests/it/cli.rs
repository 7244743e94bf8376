//! The `forge` command as a real process (`forge-cli`, the same code as the `forge` binary)
//! against a real cluster: every command in table and JSON form, operators' writes and their
//! audit trail, migrations on a fresh database (and FORGE's SQL printed, applied with psql:
//! the same schema), `config check`, `doctor` gating on a role without a leader, a foreign
//! holder of a lock key, a transaction pooler and pending migrations, and bad input (unknown
//! commands, bad filters, unknown ids, broken config, unreachable database) with the documented
//! exit codes.

use std::time::Duration;

use forge::crons::CronJob;
use forge::jobs::NewJob;
use forge::{Config, CronContext, LockNamespace, Node, Role, RoleState, Schedule};
use forge_testkit::{NodeProcess, PgServer, TestDatabase, TxPooler, wait_for, wait_until};
use serde_json::Value;
use sqlx::Connection;
use tokio::process::Command;

use crate::jobs::{Behave, mailer, plain};
use crate::support::*;

/// What one run of the command did.
pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|err| {
            panic!(
                "stdout is not JSON ({err}):\n{}\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// Asserts the exit code, showing the output when it differs.
    fn expect(self, code: i32) -> Run {
        assert_eq!(
            self.code, code,
            "exit code\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.stdout, self.stderr
        );
        self
    }

    fn ok(self) -> Run {
        self.expect(0)
    }
}

/// The command with a clean environment: only `DATABASE_URL` (when given) and `env`.
fn forge_command(url: Option<&str>, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_forge-cli"));
    for name in [
        "DATABASE_URL",
        "FORGE_NODE_ID",
        "FORGE_ROLES",
        "FORGE_QUEUES",
        "FORGE_METRICS_LISTEN",
        "FORGE_ADMIN_LISTEN",
        "FORGE_ADMIN_TOKEN",
    ] {
        command.env_remove(name);
    }
    if let Some(url) = url {
        command.env("DATABASE_URL", url);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    command.kill_on_drop(true);
    command
}

/// Runs `forge ARGS` to completion (bounded) with `env`.
async fn forge_env(url: Option<&str>, env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut command = forge_command(url, env);
    command.args(args);
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .unwrap_or_else(|_| panic!("forge {args:?} did not finish within 60 s"))
        .expect("the forge-cli binary runs");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Runs `forge ARGS` against `url`.
pub(crate) async fn forge(url: &str, args: &[&str]) -> Run {
    forge_env(Some(url), &[], args).await
}

/// A config that campaigns for every built-in role (they all have work).
fn leading_config(url: &str, node: &str) -> Config {
    let mut config = config(url, node);
    config.node.roles = Some(Role::BUILTIN.iter().map(|r| r.name().to_owned()).collect());
    config.node.campaign_without_work = true;
    // What the CLI shows is checked against one node leading everything: placement would
    // hand roles to the second node at a moment the test does not choose.
    config.cluster.spread = false;
    config
}

/// A node that campaigns for every built-in role, with a cron `beat` (hourly) on `scheduler`.
async fn start_leading(url: &str, node: &str) -> Node {
    let beat = CronJob::new(
        "beat",
        Schedule::parse("0 * * * *").unwrap(),
        |_ctx: CronContext| async move { Ok::<_, forge::CronError>(()) },
    );
    Node::builder(leading_config(url, node))
        .auto_register(false)
        .cron(beat)
        .start()
        .await
        .expect("node starts")
}

/// Waits until `node` leads every built-in role.
async fn wait_leads_all(node: &Node) {
    wait_until(
        "the node to lead every built-in role",
        SOON,
        Duration::from_millis(10),
        || async {
            Role::BUILTIN
                .iter()
                .all(|role| matches!(node.role_state(role), Some(RoleState::Leader { .. })))
                .then_some(())
        },
    )
    .await
    .unwrap();
}

/// The checks a `forge doctor --json` report failed, in order.
fn failed_checks(report: &Value) -> Vec<&str> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| c["check"].as_str().unwrap())
        .collect()
}

/// A fresh database with FORGE's schema applied by the CLI itself.
async fn migrated_db() -> TestDatabase {
    let db = fresh_db().await;
    forge(db.url(), &["migrate", "up"]).await.ok();
    db
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_leaders_nodes_and_events_show_the_running_cluster() {
    let db = migrated_db().await;
    let a = start_leading(db.url(), "cli-a").await;
    wait_leads_all(&a).await;
    let b = start_leading(db.url(), "cli-b").await;
    let url = db.url();
    wait_until(
        "both nodes active",
        SOON,
        Duration::from_millis(20),
        || async {
            let run = forge(url, &["nodes", "--json"]).await.ok();
            let nodes = run.json();
            let active = nodes
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["state"] == "active")
                .count();
            (active == 2).then_some(())
        },
    )
    .await
    .unwrap();

    // status
    let run = forge(url, &["status"]).await.ok();
    for expected in [
        "namespace",
        "forge",
        "2 active",
        "0 pending",
        "ROLE",
        "scheduler",
        "cli-a",
        "leading",
    ] {
        assert!(run.stdout.contains(expected), "{expected}:\n{}", run.stdout);
    }
    assert!(!run.stdout.contains("hunter"), "{}", run.stdout);
    let status = forge(url, &["status", "--json"]).await.ok().json();
    assert_eq!(status["namespace"], "forge");
    assert_eq!(status["nodes"]["active"], 2);
    assert_eq!(status["migrations"]["pending"], 0);
    assert_eq!(status["crons"]["total"], 1);
    let leaders = status["leaders"].as_array().unwrap();
    assert_eq!(leaders.len(), 3, "{status}");
    assert!(
        leaders
            .iter()
            .all(|l| l["led"] == true && l["node_id"] == "cli-a")
    );

    // leaders, now and in history
    let run = forge(url, &["leaders"]).await.ok();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(lines[0].starts_with("ROLE"), "{}", run.stdout);
    for role in Role::BUILTIN {
        assert!(
            lines.iter().any(|l| l.starts_with(role.name())
                && l.contains("cli-a")
                && l.contains("leading")),
            "{role}:\n{}",
            run.stdout
        );
    }
    let leaders = forge(url, &["leaders", "--json"]).await.ok().json();
    assert_eq!(leaders.as_array().unwrap().len(), 3);
    let history = forge(
        url,
        &["leaders", "--history", "--role", "scheduler", "--json"],
    )
    .await
    .ok()
    .json();
    let items = history["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{history}");
    assert_eq!(items[0]["node_id"], "cli-a");
    assert_eq!(items[0]["end"], "current");
    let run = forge(url, &["leaders", "--history"]).await.ok();
    assert!(run.stdout.contains("FAILOVER"), "{}", run.stdout);

    // nodes, all and one
    let run = forge(url, &["nodes"]).await.ok();
    assert!(run.stdout.starts_with("NODE"), "{}", run.stdout);
    assert!(run.stdout.contains("cli-b"), "{}", run.stdout);
    let run = forge(url, &["nodes", "cli-a"]).await.ok();
    assert!(run.stdout.contains("leads"), "{}", run.stdout);
    assert!(run.stdout.contains("scheduler"), "{}", run.stdout);
    let node = forge(url, &["nodes", "cli-b", "--json"]).await.ok().json();
    assert_eq!(node["node_id"], "cli-b");
    assert_eq!(node["state"], "active");
    let run = forge(url, &["nodes", "nobody"]).await.expect(1);
    assert!(run.stderr.contains("no node \"nobody\""), "{}", run.stderr);

    // events: filters, pages, bad kinds
    let joined = forge(url, &["events", "--kind", "node_joined", "--json"])
        .await
        .ok()
        .json();
    let nodes: Vec<&str> = joined["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node_id"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["cli-b", "cli-a"], "newest first: {joined}");
    let first = forge(url, &["events", "--limit", "1", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(first["items"].as_array().unwrap().len(), 1);
    let next = first["next"].as_i64().expect("a next page");
    let second = forge(
        url,
        &[
            "events",
            "--limit",
            "1",
            "--before",
            &next.to_string(),
            "--json",
        ],
    )
    .await
    .ok()
    .json();
    assert!(second["items"][0]["id"].as_i64().unwrap() < first["items"][0]["id"].as_i64().unwrap());
    let run = forge(url, &["events", "--role", "scheduler"]).await.ok();
    assert!(run.stdout.starts_with("ID"), "{}", run.stdout);
    assert!(run.stdout.contains("leader_elected"), "{}", run.stdout);
    assert!(!run.stdout.contains("node_joined"), "{}", run.stdout);
    let run = forge(url, &["events", "--node", "cli-b", "--json"])
        .await
        .ok();
    assert!(
        run.json()["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["node_id"] == "cli-b")
    );
    let run = forge(url, &["events", "--kind", "leader_exploded"])
        .await
        .expect(2);
    assert!(
        run.stderr.contains("unknown event kind") && run.stderr.contains("leader_elected"),
        "{}",
        run.stderr
    );

    // Connected through --config alone (no DATABASE_URL in the environment): the file's
    // namespace has no cluster, `--namespace forge` reads this one.
    let dir = ScratchDir::new("cli-config-connect");
    let file = dir.0.join("forge.toml");
    std::fs::write(
        &file,
        config_toml(url) + "\n[cluster]\nlock_namespace = \"billing\"\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let other = forge_env(None, &[], &["status", "--config", file, "--json"])
        .await
        .ok()
        .json();
    assert_eq!(other["namespace"], "billing", "{other}");
    assert_eq!(other["nodes"]["active"], 0, "{other}");
    let ours = forge_env(
        None,
        &[],
        &["status", "--config", file, "--namespace", "forge", "--json"],
    )
    .await
    .ok()
    .json();
    assert_eq!(ours["namespace"], "forge", "{ours}");
    assert_eq!(ours["nodes"]["active"], 2, "{ours}");
    let run = forge_env(
        None,
        &[],
        &["nodes", "--config", file, "--namespace", "forge"],
    )
    .await
    .ok();
    assert!(
        run.stdout.contains("cli-a") && run.stdout.contains("cli-b"),
        "{}",
        run.stdout
    );

    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follow_prints_new_events_as_they_happen_until_terminated() {
    let db = migrated_db().await;
    let mut command = forge_command(Some(db.url()), &[]);
    command.args([
        "events",
        "--follow",
        "--json",
        "--kind",
        "node_joined,node_left",
        "--interval",
        "50ms",
    ]);
    let mut follower = NodeProcess::spawn(command).unwrap().named("forge-events");
    let node = start_node(db.url(), "late", &[Role::SCHEDULER]).await;
    let line = follower
        .wait_for_line("the node_joined event", SOON, |l| l.contains("node_joined"))
        .await
        .unwrap();
    let event: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(event["node_id"], "late");
    node.shutdown().await;
    follower
        .wait_for_line("the node_left event", SOON, |l| l.contains("node_left"))
        .await
        .unwrap();
    follower.terminate().unwrap();
    let status = follower.wait_exit(SOON).await.unwrap();
    assert_eq!(status.code(), Some(0), "{:?}", follower.lines());

    // The table form prints a header, then rows as they come.
    let mut command = forge_command(Some(db.url()), &[]);
    command.args(["events", "-f", "--interval", "50ms"]);
    let mut follower = NodeProcess::spawn(command)
        .unwrap()
        .named("forge-events-table");
    follower
        .wait_for_line("the header", SOON, |l| l.starts_with("ID"))
        .await
        .unwrap();
    follower
        .wait_for_line("the earlier node_left", SOON, |l| {
            l.contains("node_left") && l.contains("late")
        })
        .await
        .unwrap();
    follower.terminate().unwrap();
    follower.wait_exit(SOON).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_down_hands_the_role_over_and_is_audited() {
    let db = migrated_db().await;
    let start = |id: &'static str| {
        let mut config = config(db.url(), id);
        config.node.roles = Some(vec!["scheduler".into()]);
        config.node.campaign_without_work = true;
        Node::builder(config).auto_register(false).start()
    };
    let a = start("sd-a").await.unwrap();
    let b = start("sd-b").await.unwrap();
    let (leader, epoch) = wait_single_leader(&[&a, &b], &Role::SCHEDULER).await;
    let url = db.url();
    let pool = db.pool().await.unwrap();
    wait_standby(&pool, "scheduler").await;
    let run = forge(
        url,
        &[
            "step-down",
            "scheduler",
            "--wait",
            "--timeout",
            "10s",
            "--json",
        ],
    )
    .await
    .ok();
    let out = run.json();
    assert_eq!(out["role"], "scheduler");
    assert_eq!(out["epoch"], epoch);
    assert_eq!(out["node_id"], ["sd-a", "sd-b"][leader]);
    let new_leader = &out["new_leader"];
    assert!(new_leader["epoch"].as_i64().unwrap() > epoch, "{out}");
    assert_eq!(new_leader["node_id"], ["sd-b", "sd-a"][leader], "{out}");

    wait_standby(&pool, "scheduler").await;
    let run = forge(url, &["step-down", "scheduler", "--wait"]).await.ok();
    assert!(run.stdout.contains("to hand over"), "{}", run.stdout);
    assert!(run.stdout.contains("is now led by"), "{}", run.stdout);

    let audit = forge(url, &["events", "--kind", "admin_action", "--json"])
        .await
        .ok()
        .json();
    let items = audit["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{audit}");
    assert_eq!(items[0]["detail"]["action"], "step_down");
    assert_eq!(items[0]["detail"]["subject"], "scheduler");
    assert!(
        items[0]["detail"]["by"]
            .as_str()
            .unwrap()
            .starts_with("cli "),
        "{audit}"
    );

    let run = forge(url, &["step-down", "billing"]).await.expect(1);
    assert!(run.stderr.contains("no live leader"), "{}", run.stderr);
    let run = forge(url, &["step-down", "Not A Role"]).await.expect(2);
    assert!(run.stderr.contains("role"), "{}", run.stderr);

    // With the follower gone no standby waits: refused, unless forced.
    let (leading, follower) = match wait_single_leader(&[&a, &b], &Role::SCHEDULER).await {
        (0, _) => (a, b),
        _ => (b, a),
    };
    follower.shutdown().await;
    let run = forge(url, &["step-down", "scheduler"]).await.expect(1);
    assert!(
        run.stderr.contains("no standby") && run.stderr.contains("--force"),
        "{}",
        run.stderr
    );
    let run = forge(url, &["step-down", "scheduler", "--force", "--wait"])
        .await
        .ok();
    assert!(run.stdout.contains("is now led by"), "{}", run.stdout);
    leading.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crons_are_listed_shown_paused_resumed_and_triggered() {
    let db = migrated_db().await;
    let node = start_leading(db.url(), "cron-node").await;
    wait_leads_all(&node).await;
    let url = db.url();
    let run = forge(url, &["crons"]).await.ok();
    assert!(run.stdout.starts_with("NAME"), "{}", run.stdout);
    assert!(
        run.stdout.contains("beat") && run.stdout.contains("0 * * * *"),
        "{}",
        run.stdout
    );
    let crons = forge(url, &["crons", "ls", "--json"]).await.ok().json();
    assert_eq!(crons[0]["name"], "beat");
    assert_eq!(crons[0]["role"], "scheduler");
    assert!(crons[0]["paused_at"].is_null());

    forge(url, &["crons", "pause", "beat"]).await.ok();
    let shown = forge(url, &["crons", "show", "beat", "--json"])
        .await
        .ok()
        .json();
    assert!(!shown["cron"]["paused_at"].is_null(), "{shown}");
    assert!(
        shown["cron"]["paused_by"]
            .as_str()
            .unwrap()
            .starts_with("cli ")
    );
    let run = forge(url, &["crons", "show", "beat"]).await.ok();
    assert!(
        run.stdout.contains("paused") && run.stdout.contains("since"),
        "{}",
        run.stdout
    );
    let resumed = forge(url, &["crons", "resume", "beat", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(resumed["paused"], false);
    let crons = forge(url, &["crons", "--json"]).await.ok().json();
    assert!(crons[0]["paused_at"].is_null(), "{crons}");

    // Trigger now: the leader runs a manual tick at the instant returned.
    let triggered = forge(url, &["crons", "trigger", "beat", "--json"])
        .await
        .ok()
        .json();
    let at = triggered["scheduled_at"].as_str().unwrap().to_owned();
    let at: chrono::DateTime<chrono::Utc> = at.parse().unwrap();
    wait_until(
        "the triggered tick",
        SOON,
        Duration::from_millis(50),
        || async {
            let shown = forge(url, &["crons", "show", "beat", "--json"])
                .await
                .ok()
                .json();
            shown["ticks"]["items"]
                .as_array()
                .unwrap()
                .iter()
                .find_map(|t| {
                    let scheduled: chrono::DateTime<chrono::Utc> =
                        t["scheduled_at"].as_str()?.parse().ok()?;
                    (scheduled == at && t["state"] == "succeeded").then_some(())
                })
        },
    )
    .await
    .unwrap();
    let run = forge(url, &["crons", "show", "beat"]).await.ok();
    assert!(
        run.stdout.contains("SCHEDULED") && run.stdout.contains("succeeded"),
        "{}",
        run.stdout
    );
    let run = forge(url, &["crons", "trigger", "beat"]).await.ok();
    assert!(run.stdout.contains("triggered cron beat"), "{}", run.stdout);

    let audit = forge(url, &["events", "--kind", "admin_action", "--json"])
        .await
        .ok()
        .json();
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["detail"]["action"].as_str().unwrap())
        .collect();
    for action in ["pause_cron", "resume_cron", "trigger_cron"] {
        assert!(actions.contains(&action), "{action} in {actions:?}");
    }

    for args in [
        ["crons", "show", "nope"],
        ["crons", "pause", "nope"],
        ["crons", "resume", "nope"],
        ["crons", "trigger", "nope"],
    ] {
        let run = forge(url, &args).await.expect(1);
        assert!(run.stderr.contains("no cron \"nope\""), "{}", run.stderr);
    }
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_listed_filtered_shown_retried_cancelled_and_deleted() {
    let db = migrated_db().await;
    let pool = db.pool().await.unwrap();
    // No node works queue `cli`: the jobs wait there.
    let jobs = client(&pool);
    let mut ids = Vec::new();
    for tag in ["a", "b", "c"] {
        let job = NewJob::new(plain, Behave::tag(tag)).queue("cli");
        ids.push(jobs.enqueue_job(job).await.unwrap().id().0);
    }
    let url = db.url();
    let id = |i: usize| ids[i].to_string();

    let run = forge(url, &["jobs"]).await.ok();
    assert!(run.stdout.starts_with("ID"), "{}", run.stdout);
    assert_eq!(run.stdout.lines().count(), 4, "{}", run.stdout);
    let listed = forge(url, &["jobs", "ls", "--json"]).await.ok().json();
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 3);
    assert_eq!(items[0]["id"], ids[2], "newest first");
    assert_eq!(items[0]["state"], "available");
    assert_eq!(items[0]["queue"], "cli");
    assert!(listed["next"].is_null());

    let filtered = forge(
        url,
        &[
            "jobs",
            "ls",
            "--queue",
            "cli",
            "--kind",
            "plain",
            "--state",
            "available,scheduled",
            "--args",
            r#"{"tag":"b"}"#,
            "--json",
        ],
    )
    .await
    .ok()
    .json();
    let items = filtered["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{filtered}");
    assert_eq!(items[0]["id"], ids[1]);
    let none = forge(url, &["jobs", "ls", "--queue", "elsewhere"])
        .await
        .ok();
    assert!(none.stdout.contains("no jobs match"), "{}", none.stdout);

    let page = forge(url, &["jobs", "ls", "--limit", "2", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    let next = page["next"].as_i64().unwrap().to_string();
    let rest = forge(
        url,
        &["jobs", "ls", "--limit", "2", "--before", &next, "--json"],
    )
    .await
    .ok()
    .json();
    assert_eq!(rest["items"][0]["id"], ids[0], "{rest}");
    assert!(rest["next"].is_null());

    let run = forge(url, &["jobs", "show", &id(0)]).await.ok();
    assert!(
        run.stdout.contains("available") && run.stdout.contains("\"tag\":\"a\""),
        "{}",
        run.stdout
    );
    let shown = forge(url, &["jobs", "show", &id(0), "--json"])
        .await
        .ok()
        .json();
    assert_eq!(shown["id"], ids[0]);
    assert_eq!(shown["kind"], "plain");
    assert_eq!(shown["args"]["tag"], "a");
    assert_eq!(shown["errors"], serde_json::json!([]));

    // One by one: cancel, retry, delete; unknown ids and refusals exit 1.
    let run = forge(url, &["jobs", "cancel", &id(0)]).await.ok();
    assert!(run.stdout.contains("cancelled"), "{}", run.stdout);
    assert_eq!(
        forge(url, &["jobs", "show", &id(0), "--json"])
            .await
            .ok()
            .json()["state"],
        "cancelled"
    );
    let run = forge(url, &["jobs", "cancel", &id(0)]).await.expect(1);
    assert!(
        run.stderr.contains("cannot cancel") && run.stderr.contains("cancelled"),
        "{}",
        run.stderr
    );
    let retried = forge(url, &["jobs", "retry", &id(0), "--json"])
        .await
        .ok()
        .json();
    assert_eq!(retried["outcome"], "applied");
    assert_eq!(
        forge(url, &["jobs", "show", &id(0), "--json"])
            .await
            .ok()
            .json()["state"],
        "available"
    );
    forge(url, &["jobs", "delete", &id(0)]).await.ok();
    let run = forge(url, &["jobs", "show", &id(0)]).await.expect(1);
    assert!(
        run.stderr.contains(&format!("no job {}", ids[0])),
        "{}",
        run.stderr
    );
    for verb in ["show", "retry", "cancel", "delete"] {
        let run = forge(url, &["jobs", verb, "987654321"]).await.expect(1);
        assert!(
            run.stderr.contains("no job 987654321"),
            "{verb}: {}",
            run.stderr
        );
    }

    // Bad filters and half-said bulk actions are usage errors.
    let run = forge(url, &["jobs", "ls", "--args", "{not json"])
        .await
        .expect(2);
    assert!(run.stderr.contains("not valid JSON"), "{}", run.stderr);
    let run = forge(url, &["jobs", "ls", "--state", "lost"])
        .await
        .expect(2);
    assert!(
        run.stderr.contains("unknown job state") && run.stderr.contains("dead"),
        "{}",
        run.stderr
    );
    let run = forge(url, &["jobs", "delete", "--all-matching"])
        .await
        .expect(2);
    assert!(run.stderr.contains("at least one filter"), "{}", run.stderr);
    forge(url, &["jobs", "delete", "--queue", "cli"])
        .await
        .expect(2);
    forge(
        url,
        &["jobs", "delete", &id(1), "--all-matching", "--queue", "cli"],
    )
    .await
    .expect(2);
    let run = forge(url, &["jobs", "delete", &id(1), "--queue", "cli"])
        .await
        .expect(2);
    assert!(run.stderr.contains("--all-matching"), "{}", run.stderr);
    forge(url, &["jobs", "show", "seven"]).await.expect(2);
    assert_eq!(
        forge(url, &["jobs", "ls", "--json"]).await.ok().json()["items"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // In bulk, by filter.
    let cancelled = forge(
        url,
        &[
            "jobs",
            "cancel",
            "--all-matching",
            "--queue",
            "cli",
            "--json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(cancelled["matched"], 2);
    let retried = forge(
        url,
        &[
            "jobs",
            "retry",
            "--all-matching",
            "--args",
            r#"{"tag":"c"}"#,
        ],
    )
    .await
    .ok();
    assert!(
        retried.stdout.contains("1 jobs made available again"),
        "{}",
        retried.stdout
    );
    let states = forge(url, &["jobs", "ls", "--json"]).await.ok().json();
    let state_of = |id: i64| {
        states["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == id)
            .map(|j| j["state"].as_str().unwrap().to_owned())
    };
    assert_eq!(state_of(ids[1]).as_deref(), Some("cancelled"));
    assert_eq!(state_of(ids[2]).as_deref(), Some("available"));
    let deleted = forge(
        url,
        &[
            "jobs",
            "delete",
            "--all-matching",
            "--state",
            "cancelled",
            "--json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(deleted["matched"], 1);
    let left = forge(url, &["jobs", "ls", "--json"]).await.ok().json();
    assert_eq!(left["items"].as_array().unwrap().len(), 1);
    assert_eq!(left["items"][0]["id"], ids[2]);

    let audit = forge(
        url,
        &[
            "events",
            "--kind",
            "admin_action",
            "--limit",
            "100",
            "--json",
        ],
    )
    .await
    .ok()
    .json();
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["detail"]["action"].as_str().unwrap())
        .collect();
    for action in [
        "cancel_job",
        "retry_job",
        "delete_job",
        "cancel_jobs",
        "retry_jobs",
        "delete_jobs",
    ] {
        assert!(actions.contains(&action), "{action} in {actions:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_show_their_depth_and_are_paused_and_resumed() {
    let db = migrated_db().await;
    let pool = db.pool().await.unwrap();
    let jobs = client(&pool);
    for tag in ["a", "b"] {
        jobs.enqueue_job(NewJob::new(plain, Behave::tag(tag)).queue("cli"))
            .await
            .unwrap();
    }
    let url = db.url();
    let run = forge(url, &["queues"]).await.ok();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(
        lines[0].starts_with("QUEUE") && lines[0].contains("PAUSED"),
        "{}",
        run.stdout
    );
    assert!(
        lines[1].starts_with("cli") && lines[1].ends_with("no"),
        "{}",
        run.stdout
    );
    let queues = forge(url, &["queues", "--json"]).await.ok().json();
    assert_eq!(queues[0]["queue"], "cli");
    assert_eq!(queues[0]["available"], 2);
    assert_eq!(queues[0]["paused"], false);

    let run = forge(url, &["queues", "pause", "cli"]).await.ok();
    assert!(run.stdout.contains("paused queue cli"), "{}", run.stdout);
    let queues = forge(url, &["queues", "ls", "--json"]).await.ok().json();
    assert_eq!(queues[0]["paused"], true, "{queues}");
    let resumed = forge(url, &["queues", "resume", "cli", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(resumed["was_paused"], true);
    let run = forge(url, &["queues", "resume", "cli"]).await.ok();
    assert!(run.stdout.contains("was not paused"), "{}", run.stdout);
    let queues = forge(url, &["queues", "--json"]).await.ok().json();
    assert_eq!(queues[0]["paused"], false);

    let run = forge(url, &["queues", "pause", "Not A Queue"])
        .await
        .expect(2);
    assert!(run.stderr.contains("queue"), "{}", run.stderr);
}

/// Enqueues in `queue` a parent (available) and `children` jobs waiting for it (pending).
pub(crate) async fn parent_and_children(pool: &sqlx::PgPool, queue: &str, children: usize) {
    let jobs = client(pool);
    let parent = jobs
        .enqueue_job(NewJob::new(plain, Behave::tag("parent")).queue(queue))
        .await
        .unwrap()
        .id();
    for i in 0..children {
        let child = NewJob::new(plain, Behave::tag(format!("child-{i}")));
        jobs.enqueue_job(child.queue(queue).after([parent]))
            .await
            .unwrap();
    }
}

/// Jobs waiting for their parents (`pending`) are counted in `forge queues` (a PENDING column)
/// and in `forge status`'s jobs line, as in `--json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_jobs_show_in_forge_queues_and_forge_status() {
    let db = migrated_db().await;
    let pool = db.pool().await.unwrap();
    parent_and_children(&pool, "flow", 2).await;
    let url = db.url();
    let run = forge(url, &["queues"]).await.ok();
    let lines: Vec<Vec<&str>> = run
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let column = lines[0]
        .iter()
        .position(|c| *c == "PENDING")
        .unwrap_or_else(|| panic!("no PENDING column:\n{}", run.stdout));
    let available = lines[0].iter().position(|c| *c == "AVAILABLE").unwrap();
    let flow = lines
        .iter()
        .find(|l| l.first() == Some(&"flow"))
        .unwrap_or_else(|| panic!("no queue flow:\n{}", run.stdout));
    assert_eq!(flow[column], "2", "{}", run.stdout);
    assert_eq!(flow[available], "1", "{}", run.stdout);
    let queues = forge(url, &["queues", "--json"]).await.ok().json();
    assert_eq!(queues[0]["pending"], 2, "{queues}");

    let run = forge(url, &["status"]).await.ok();
    assert!(
        run.stdout.contains(
            "1 available, 0 running, 0 scheduled, 2 pending, 0 retryable, 0 dead in 1 queues"
        ),
        "{}",
        run.stdout
    );
    let status = forge(url, &["status", "--json"]).await.ok().json();
    assert_eq!(status["queues"][0]["pending"], 2, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_status_and_up_on_a_fresh_database_then_a_node_needs_none() {
    let db = fresh_db().await;
    let url = db.url();
    let dir = ScratchDir::new("cli-migrate");
    let app = dir.0.join("migrations");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(
        app.join("0001_widgets.sql"),
        "CREATE TABLE widgets (id int);\n",
    )
    .unwrap();
    let app = app.to_str().unwrap();

    let status = forge(url, &["migrate", "status", "--json"])
        .await
        .ok()
        .json();
    let migrations = status["sets"][0]["migrations"].as_array().unwrap();
    assert_eq!(
        migrations.len(),
        forge::migrate::sources().len(),
        "{status}"
    );
    assert!(
        migrations.iter().all(|m| m["state"] == "pending"),
        "{status}"
    );
    assert_eq!(status["pending"], migrations.len());
    let run = forge(url, &["migrate", "status"]).await.ok();
    assert!(run.stdout.starts_with("SET"), "{}", run.stdout);
    assert!(
        run.stdout.contains("0001") && run.stdout.contains("core"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("pending: apply with `forge migrate up`"),
        "{}",
        run.stdout
    );

    // A dry run says what would run and changes nothing.
    let run = forge(url, &["migrate", "up", "--dry-run", "--app", app])
        .await
        .ok();
    assert!(run.stdout.contains("would apply"), "{}", run.stdout);
    assert!(run.stdout.contains("forge 0001_core"), "{}", run.stdout);
    assert!(run.stdout.contains("app 0001_widgets"), "{}", run.stdout);
    let run = forge(url, &["migrate", "up", "--dry-run", "--sql"])
        .await
        .ok();
    assert!(run.stdout.contains("CREATE"), "shows the SQL");
    let dry = forge(url, &["migrate", "up", "--dry-run", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(
        dry["would_apply"].as_array().unwrap().len(),
        migrations.len()
    );
    let pool = db.pool().await.unwrap();
    let schema: Option<String> = sqlx::query_scalar("SELECT to_regnamespace('forge')::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(schema, None, "a dry run applies nothing");
    let status = forge(url, &["migrate", "status", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(status["pending"], migrations.len());

    // Up: FORGE's, then the application's.
    let applied = forge(url, &["migrate", "up", "--app", app, "--json"])
        .await
        .ok()
        .json();
    assert_eq!(
        applied["applied"].as_array().unwrap().len(),
        migrations.len() + 1,
        "{applied}"
    );
    let status = forge(url, &["migrate", "status", "--app", app, "--json"])
        .await
        .ok()
        .json();
    assert_eq!(status["pending"], 0, "{status}");
    assert_eq!(status["sets"][1]["migrations"][0]["state"], "applied");
    let widgets: i64 = sqlx::query_scalar("SELECT count(*) FROM widgets")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(widgets, 0);
    let run = forge(url, &["migrate", "up"]).await.ok();
    assert!(run.stdout.contains("up to date"), "{}", run.stdout);
    let run = forge(url, &["migrate", "status"]).await.ok();
    assert!(run.stdout.contains("up to date"), "{}", run.stdout);

    // The node agrees: with migrations off it finds the schema complete.
    let mut config = config(url, "after-cli");
    config.database.migrate = false;
    let node = Node::builder(config)
        .auto_register(false)
        .start()
        .await
        .expect("a node finds the schema the CLI applied complete");
    node.shutdown().await;

    let run = forge(url, &["migrate", "status", "--app", "/no/such/dir"])
        .await
        .expect(2);
    assert!(run.stderr.contains("not a directory"), "{}", run.stderr);
}

#[tokio::test]
async fn config_check_accepts_a_good_file_and_names_the_line_of_a_broken_one() {
    let dir = ScratchDir::new("cli-config");
    let good = dir.0.join("good.toml");
    std::fs::write(
        &good,
        config_toml("postgres://app:hunter2@db.internal:5432/app")
            + "\n[cluster]\nlock_namespace = \"billing\"\n"
            + "\n[admin]\nlisten = \"127.0.0.1:9465\"\ntoken = \"cli-config-secret-token-42\"\n",
    )
    .unwrap();
    let good = good.to_str().unwrap();
    let run = forge_env(None, &[], &["config", "check", good]).await.ok();
    assert!(run.stdout.contains(": ok"), "{}", run.stdout);
    assert!(run.stdout.contains("billing"), "{}", run.stdout);
    assert!(run.stdout.contains("app:***@db.internal"), "{}", run.stdout);
    assert!(
        run.stdout
            .contains("127.0.0.1:9465; writes need the token; reads open"),
        "{}",
        run.stdout
    );
    let checked = forge_env(None, &[], &["config", "check", good, "--json"])
        .await
        .ok();
    for shown in [&run.stdout, &checked.stdout] {
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("cli-config-secret"), "{shown}");
    }
    let checked = checked.json();
    assert_eq!(checked["ok"], true);
    assert_eq!(checked["namespace"], "billing");
    assert_eq!(checked["lease_duration_ms"], 2000);
    assert_eq!(checked["admin"]["token"], "<redacted>", "{checked}");
    assert_eq!(checked["admin"]["read_token"], Value::Null, "{checked}");

    let broken = dir.0.join("broken.toml");
    std::fs::write(
        &broken,
        "[cluster.leader_election]\nlease_duration = \"15s\"\nrefresh_interval = \"often\"\n",
    )
    .unwrap();
    let broken = broken.to_str().unwrap();
    let run = forge_env(None, &[], &["config", "check", broken])
        .await
        .expect(2);
    assert!(
        run.stderr.contains(&format!(
            "{broken}:3: `cluster.leader_election.refresh_interval`"
        )),
        "{}",
        run.stderr
    );
    let out = forge_env(None, &[], &["config", "check", broken, "--json"])
        .await
        .expect(2)
        .json();
    assert_eq!(out["exit_code"], 2);
    assert!(out["error"].as_str().unwrap().contains(":3:"), "{out}");

    let run = forge_env(None, &[], &["config", "check", "/no/such/forge.toml"])
        .await
        .expect(2);
    assert!(
        run.stderr.contains("cannot read config file"),
        "{}",
        run.stderr
    );

    // A broken --config for any command is a configuration error too.
    let run = forge_env(None, &[], &["status", "--config", broken])
        .await
        .expect(2);
    assert!(run.stderr.contains(":3:"), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_passes_a_healthy_cluster_and_fails_on_a_leaderless_role_or_a_foreign_lock_holder() {
    let db = migrated_db().await;
    let url = db.url();
    // Another application holds the log compactor's key before any node starts.
    let key = Role::LOG_COMPACTOR.lock_key(&LockNamespace::default()).0;
    let mut foreign = sqlx::PgConnection::connect(&format!("{url}?application_name=billing-cron"))
        .await
        .unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key)
        .execute(&mut foreign)
        .await
        .unwrap();
    let node = start_leading(url, "doc-a").await;
    wait_until(
        "scheduler and metrics_aggregator led",
        SOON,
        Duration::from_millis(10),
        || async {
            [Role::SCHEDULER, Role::METRICS_AGGREGATOR]
                .iter()
                .all(|r| matches!(node.role_state(r), Some(RoleState::Leader { .. })))
                .then_some(())
        },
    )
    .await
    .unwrap();

    let run = forge(url, &["doctor"]).await.expect(1);
    assert!(run.stdout.starts_with("CHECK"), "{}", run.stdout);
    assert!(run.stdout.contains("billing-cron"), "{}", run.stdout);
    assert!(
        run.stdout.contains("lock_namespace"),
        "says what to do: {}",
        run.stdout
    );
    assert!(
        run.stdout.contains("log_compactor: no leader"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("NOT HEALTHY"), "{}", run.stdout);
    let report = forge(url, &["doctor", "--json"]).await.expect(1).json();
    assert_eq!(report["ok"], false);
    assert_eq!(failed_checks(&report), ["lock keys", "leaders"], "{report}");

    // The other application lets go: the node leads everything, the doctor is content.
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .execute(&mut foreign)
        .await
        .unwrap();
    wait_leads_all(&node).await;
    let run = forge(url, &["doctor"]).await.ok();
    assert!(run.stdout.contains("healthy: 0 problems"), "{}", run.stdout);
    let report = forge(url, &["doctor", "--strict", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(report["ok"], true, "{report}");
    for check in [
        "connection",
        "pooler",
        "migrations",
        "lock keys",
        "leaders",
        "work",
        "nodes",
        "clock",
    ] {
        assert!(
            report["checks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["check"] == check && c["status"] == "ok"),
            "{check}: {report}"
        );
    }

    // A clock off by more than --max-clock-skew (default 5 s) is a problem, a skew over 1 s
    // within it a warning. This host cannot be made to run late, so the database's clock is,
    // for the command's sessions only: their search_path finds `skewed.clock_timestamp()`,
    // the server's clock minus `forge_test.behind`, before pg_catalog's.
    sqlx::raw_sql(
        "CREATE SCHEMA skewed;
         CREATE FUNCTION skewed.clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE
           AS $$ SELECT pg_catalog.clock_timestamp() - current_setting('forge_test.behind')::interval $$;",
    )
    .execute(&mut foreign)
    .await
    .unwrap();
    let behind = |offset: &str| {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!(
            "{url}{separator}options[search_path]=skewed,pg_catalog,public&options[forge_test.behind]={offset}"
        )
    };
    let clock = |report: &Value| {
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "clock")
            .cloned()
            .unwrap_or_else(|| panic!("no clock check in {report}"))
    };
    let far = behind("10s");
    let run = forge(&far, &["doctor"]).await.expect(1);
    assert!(
        run.stdout.contains("this host is 10.0")
            && run.stdout.contains("ahead of the database")
            && run.stdout.contains("more than --max-clock-skew 5.0"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("NOT HEALTHY: 1 problems"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("run NTP"), "{}", run.stdout);
    let report = forge(&far, &["doctor", "--json"]).await.expect(1).json();
    assert_eq!(clock(&report)["status"], "fail", "{report}");
    let failed = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] != "ok")
        .count();
    assert_eq!(failed, 1, "only the clock: {report}");
    // Within a larger bound, the same skew is a warning: exit 0, unless --strict.
    let report = forge(&far, &["doctor", "--max-clock-skew", "30s", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(clock(&report)["status"], "warn", "{report}");
    let near = behind("2s");
    let report = forge(&near, &["doctor", "--json"]).await.ok().json();
    assert_eq!(clock(&report)["status"], "warn", "{report}");
    assert_eq!(report["ok"], true, "{report}");
    forge(&near, &["doctor", "--strict"]).await.expect(1);
    let run = forge(url, &["doctor", "--max-clock-skew", "soon"])
        .await
        .expect(2);
    assert!(run.stderr.contains("--max-clock-skew"), "{}", run.stderr);

    // A role this configuration lists but no node campaigns for: not the cluster's problem
    // (the admin API's status says healthy too), a warning - a problem with --strict.
    let billing = [("FORGE_ROLES", "scheduler,billing")];
    let run = forge_env(Some(url), &billing, &["doctor"]).await.ok();
    assert!(
        run.stdout
            .contains("billing: listed in [node] roles here, but no node campaigns for it"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("healthy: 0 problems, 1 warnings"),
        "{}",
        run.stdout
    );
    forge_env(Some(url), &billing, &["doctor", "--strict"])
        .await
        .expect(1);

    // A stopped node is no problem; with no node left, there is.
    node.shutdown().await;
    let run = forge(url, &["doctor"]).await.expect(1);
    assert!(run.stdout.contains("no active node"), "{}", run.stdout);
}

/// Work with nowhere to run - jobs waiting in a queue that no live node works, a role that a
/// live node has work for and none campaigns for - makes `forge status` and `forge doctor`
/// unhealthy, each naming the queue or the role and what to do, until a node serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_doctor_report_work_with_nowhere_to_run() {
    let db = migrated_db().await;
    let url = db.url();
    let pool = db.pool().await.unwrap();
    // The built-in roles and no queue, though the binary has work on billing and mailers.
    let mut hides = leading_config(url, "hides");
    hides.node.queues = Some(vec![]);
    let node = billing_and_mailers_node(hides).await;
    wait_leads_all(&node).await;
    client(&pool)
        .enqueue(mailer, Behave::tag("waits"))
        .await
        .unwrap();

    let run = forge(url, &["doctor"]).await.expect(1);
    for said in [
        "queue mailers has jobs waiting and no live node works it",
        "role billing has work on hides and no live node campaigns for it",
        "work: a node works the queues its job types declare unless [node] queues (FORGE_QUEUES) lists others",
        "work: add billing to [node] roles (FORGE_ROLES) of nodes that have its work",
        "NOT HEALTHY: 2 problems",
    ] {
        assert!(run.stdout.contains(said), "{said}: {}", run.stdout);
    }
    let report = forge(url, &["doctor", "--json"]).await.expect(1).json();
    assert_eq!(failed_checks(&report), ["work", "work"], "{report}");
    let status = forge(url, &["status", "--json"]).await.ok().json();
    assert_eq!(status["healthy"], false, "{status}");
    let unserved: Vec<(&str, &str)> = status["unserved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["work"].as_str().unwrap(), u["name"].as_str().unwrap()))
        .collect();
    assert_eq!(
        unserved,
        [("queue", "mailers"), ("role", "billing")],
        "{status}"
    );
    let run = forge(url, &["status"]).await.ok();
    assert!(
        run.stdout
            .contains("NOT HEALTHY: queue mailers has jobs waiting and no live node works it"),
        "{}",
        run.stdout
    );

    // A node with the default configuration works mailers and campaigns for billing.
    let serves = billing_and_mailers_node(config(url, "serves")).await;
    wait_for(
        "the doctor to be content",
        SOON,
        Duration::from_millis(100),
        || async {
            let run = forge(url, &["doctor"]).await;
            if run.code == 0 {
                Ok(())
            } else {
                Err(run.stdout)
            }
        },
    )
    .await
    .unwrap();
    serves.shutdown().await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_fails_on_pending_migrations_a_transaction_pooler_and_an_unreachable_database() {
    let server = PgServer::shared().unwrap();
    let db = server.create_database().await.unwrap();
    let run = forge(db.url(), &["doctor"]).await.expect(1);
    assert!(run.stdout.contains("pending"), "{}", run.stdout);
    assert!(run.stdout.contains("forge migrate up"), "{}", run.stdout);
    assert!(run.stdout.contains("skipped"), "{}", run.stdout);

    let pooler = TxPooler::start(server, db.name(), 2).await.unwrap();
    let report = forge(&pooler.url(), &["doctor", "--json"])
        .await
        .expect(1)
        .json();
    let pooled = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "pooler")
        .unwrap()
        .clone();
    assert_eq!(pooled["status"], "fail", "{report}");
    assert!(
        pooled["detail"]
            .as_str()
            .unwrap()
            .contains("transaction-mode pooler"),
        "{report}"
    );
    assert!(
        pooled["hint"].as_str().unwrap().contains("session"),
        "{report}"
    );

    let run = forge("postgres://forge:secret@127.0.0.1:1/app", &["doctor"])
        .await
        .expect(1);
    assert!(
        run.stdout.contains("connection") && run.stdout.contains("FAIL"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("is PostgreSQL running?"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("secret"), "{}", run.stdout);
}

#[tokio::test]
async fn bad_input_gets_a_clear_message_and_the_documented_exit_code() {
    let run = forge_env(None, &[], &["frobnicate"]).await.expect(2);
    assert!(
        run.stderr.contains("unrecognized subcommand"),
        "{}",
        run.stderr
    );
    let run = forge_env(None, &[], &["--help"]).await.ok();
    assert!(
        run.stdout.contains("doctor") && run.stdout.contains("Exit codes"),
        "{}",
        run.stdout
    );
    forge_env(None, &[], &["jobs", "ls", "--limit", "0"])
        .await
        .expect(2);

    // No database configured: a configuration error that says how to set one.
    let run = forge_env(None, &[], &["status"]).await.expect(2);
    assert!(run.stderr.contains("DATABASE_URL"), "{}", run.stderr);
    let run = forge_env(None, &[], &["leaders", "--namespace", "Bad Name"])
        .await
        .expect(2);
    assert!(run.stderr.contains("--namespace"), "{}", run.stderr);

    // Unreachable: the redacted URL and what to do, as text and as JSON.
    let url = "postgres://forge:secret@127.0.0.1:1/app";
    for args in [
        &["status"][..],
        &["leaders"],
        &["jobs", "ls"],
        &["migrate", "status"],
    ] {
        let run = forge(url, args).await.expect(1);
        assert!(
            run.stderr
                .contains("cannot connect to PostgreSQL at postgres://forge:***@127.0.0.1:1/app"),
            "{args:?}: {}",
            run.stderr
        );
        assert!(
            run.stderr
                .contains("is PostgreSQL running? set DATABASE_URL or --config"),
            "{}",
            run.stderr
        );
        assert!(!run.stderr.contains("secret"), "{}", run.stderr);
    }
    let out = forge(url, &["nodes", "--json"]).await.expect(1).json();
    assert!(
        out["error"].as_str().unwrap().contains("cannot connect"),
        "{out}"
    );
    assert_eq!(out["exit_code"], 1);

    // A database without FORGE's schema: what to do.
    let db = fresh_db().await;
    let run = forge(db.url(), &["leaders"]).await.expect(1);
    assert!(run.stderr.contains("forge migrate up"), "{}", run.stderr);
    let run = forge(db.url(), &["status"]).await.expect(1);
    assert!(run.stderr.contains("forge migrate up"), "{}", run.stderr);
}

#[tokio::test]
async fn alerts_export_writes_the_rule_file_of_the_configuration() {
    // No configuration: the defaults' rules, on stdout.
    let run = forge_env(None, &[], &["alerts", "export"]).await.ok();
    assert_eq!(run.stdout, Config::default().alert_rules().to_yaml());
    assert!(run.stdout.contains("forge_no_leader"), "{}", run.stdout);

    // A forge.toml with a rule of its own, to a file.
    let dir = ScratchDir::new("cli-alerts");
    let path = dir.0.join("forge.toml");
    std::fs::write(
        &path,
        "[[alerts]]\nname = \"billing_backlog\"\ncondition = \"forge_job_queue_depth{queue=\\\"billing\\\"} > 100\"\n\
         for = \"5m\"\nseverity = \"warning\"\nnotify = [\"slack:#billing\"]\n",
    )
    .unwrap();
    let file = dir.0.join("rules.yml");
    let run = forge_env(
        None,
        &[],
        &[
            "alerts",
            "export",
            "--config",
            path.to_str().unwrap(),
            "-o",
            file.to_str().unwrap(),
        ],
    )
    .await
    .ok();
    assert!(run.stdout.contains("wrote"), "{}", run.stdout);
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        written,
        Config::load(&path).unwrap().alert_rules().to_yaml()
    );
    assert!(written.contains("billing_backlog"), "{written}");
    let out = forge_env(
        None,
        &[],
        &[
            "alerts",
            "export",
            "--config",
            path.to_str().unwrap(),
            "--json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(out["rules"].as_str().unwrap(), written);

    // Runbook links made absolute by [alerting] runbook_base_url.
    std::fs::write(
        &path,
        "[alerting]\nrunbook_base_url = \"https://runbooks.example.com/forge.md\"\n",
    )
    .unwrap();
    let run = forge_env(
        None,
        &[],
        &["alerts", "export", "--config", path.to_str().unwrap()],
    )
    .await
    .ok();
    assert!(
        run.stdout
            .contains("runbook_url: \"https://runbooks.example.com/forge.md#forge_no_leader\""),
        "{}",
        run.stdout
    );
    assert!(
        !run.stdout.contains("\"docs/src/runbook.md#"),
        "{}",
        run.stdout
    );

    // A broken rule is a configuration error.
    std::fs::write(&path, "[[alerts]]\nname = \"no_condition\"\n").unwrap();
    let run = forge_env(
        None,
        &[],
        &["alerts", "export", "--config", path.to_str().unwrap()],
    )
    .await
    .expect(2);
    assert!(run.stderr.contains("no_condition"), "{}", run.stderr);
}

/// After a SIGKILL of the scheduler's leader, `forge nodes` shows the killed node leading
/// nothing (the node that leads each role is the one `forge leaders` names), `forge leaders
/// --history` measures the failover from the lock grant, and `forge status` and `forge doctor`
/// agree with each other: healthy, the dead node a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sigkill_forge_nodes_shows_the_dead_node_leading_nothing() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let url = db.url();
    let dir = ScratchDir::new("cli-sigkill");
    let mut probes = probes_with_standbys(&db, &dir.0, ["n1", "n2", "n3"]).await;
    let (victim, epoch, _) = kill_scheduler_leader(&pool, &mut probes).await;
    wait_until(
        "a new scheduler leader",
        SOON,
        Duration::from_millis(5),
        || async {
            let leaders = forge(url, &["leaders", "--json"]).await.ok().json();
            leaders
                .as_array()
                .unwrap()
                .iter()
                .any(|l| {
                    l["role"] == "scheduler"
                        && l["led"] == true
                        && l["epoch"].as_i64() > Some(epoch)
                })
                .then_some(())
        },
    )
    .await
    .unwrap();

    // The table: the killed node's LEADS is empty, whether or not it is marked down yet.
    let run = forge(url, &["nodes"]).await.ok();
    let header = run.stdout.lines().next().unwrap();
    let leads_at = header.find("LEADS").unwrap();
    let row = run
        .stdout
        .lines()
        .find(|l| l.starts_with(victim.as_str()))
        .unwrap_or_else(|| panic!("{victim} in\n{}", run.stdout));
    assert_eq!(
        row[leads_at..].trim(),
        "-",
        "{victim} leads nothing:\n{}",
        run.stdout
    );
    let one = forge(url, &["nodes", &victim, "--json"]).await.ok().json();
    assert_eq!(one["leads"], serde_json::json!([]), "{one}");
    // Each role: led by the node `forge leaders` names, and by no other.
    let leaders = forge(url, &["leaders", "--json"]).await.ok().json();
    let nodes = forge(url, &["nodes", "--json"]).await.ok().json();
    for leader in leaders
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["led"] == true)
    {
        let leading: Vec<&str> = nodes
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["leads"].as_array().unwrap().contains(&leader["role"]))
            .map(|n| n["node_id"].as_str().unwrap())
            .collect();
        assert_eq!(
            leading,
            [leader["node_id"].as_str().unwrap()],
            "{leader}\n{nodes}"
        );
    }

    // The failover's gap, from the lock grant.
    let history = forge(
        url,
        &[
            "leaders",
            "--history",
            "--role",
            "scheduler",
            "--limit",
            "1",
            "--json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(history["items"][0]["gap_from"], "lock_granted", "{history}");
    let run = forge(url, &["leaders", "--history", "--role", "scheduler"])
        .await
        .ok();
    assert!(
        run.stdout.lines().next().unwrap().contains("GAP FROM")
            && run.stdout.contains("lock_granted"),
        "{}",
        run.stdout
    );

    // Status and doctor say the same: healthy, the killed node down as a warning.
    let status = wait_for(
        "the killed node down",
        SOON,
        Duration::from_millis(50),
        || async {
            let status = forge(url, &["status", "--json"]).await.ok().json();
            if status["nodes"]["down"] == 1 {
                Ok(status)
            } else {
                Err(status.to_string())
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(status["healthy"], true, "{status}");
    assert_eq!(
        status["warnings"],
        serde_json::json!([format!("node {victim} is down")]),
        "{status}"
    );
    let report = forge(url, &["doctor", "--json"]).await.ok().json();
    let leaders_ok = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["check"] == "leaders")
        .all(|c| c["status"] == "ok");
    assert!(leaders_ok, "{report}");
    assert!(
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["check"] == "nodes"
                && c["status"] == "warn"
                && c["detail"].as_str().unwrap().contains(victim.as_str())),
        "{report}"
    );
    forge(url, &["doctor", "--strict"]).await.expect(1);
    for probe in &probes {
        let _ = probe.process.terminate();
    }
}

/// `forge queues pause` of a queue the cluster does not know (a typo) exits 1 and pauses
/// nothing; `--new` pre-pauses it on purpose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_a_typo_queue_fails_unless_new() {
    let db = migrated_db().await;
    let pool = db.pool().await.unwrap();
    let url = db.url();
    let run = forge(url, &["queues", "pause", "typo-queue"])
        .await
        .expect(1);
    assert!(
        run.stderr.contains("no queue \"typo-queue\"") && run.stderr.contains("--new"),
        "{}",
        run.stderr
    );
    forge(url, &["queues", "resume", "typo-queue"])
        .await
        .expect(1);
    let queues = forge(url, &["queues", "--json"]).await.ok().json();
    assert_eq!(queues, serde_json::json!([]), "the typo is no queue");
    let run = forge(url, &["queues", "pause", "typo-queue", "--new"])
        .await
        .ok();
    assert!(
        run.stdout.contains("paused queue typo-queue"),
        "{}",
        run.stdout
    );
    let paused: Vec<String> = sqlx::query_scalar("SELECT queue FROM forge.queues")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(paused, ["typo-queue"]);
    forge(url, &["queues", "resume", "typo-queue"]).await.ok();
    forge(url, &["queues", "resume", "typo-queue"])
        .await
        .expect(1);
}

/// A server that answers every connection as an HTTP server answers bytes it cannot parse
/// (the admin API's port given as `DATABASE_URL`, say), until dropped.
pub(crate) async fn http_server() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 512];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    )
                    .await;
            });
        }
    });
    (addr, task)
}

/// The forms a person tries first work (`forge jobs --state dead`, as `forge jobs ls --state
/// dead`); errors say what is wrong once (a bad role name is not repeated in a prefix of its
/// own) and plainly (a `DATABASE_URL` at a server that is not PostgreSQL says so, not
/// "expected to read 1414811696 bytes").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn obvious_forms_work_and_errors_say_what_is_wrong_once() {
    let db = migrated_db().await;
    let pool = db.pool().await.unwrap();
    client(&pool)
        .enqueue_job(NewJob::new(plain, Behave::tag("a")).queue("cli"))
        .await
        .unwrap();
    let url = db.url();

    let run = forge(url, &["jobs", "--state", "dead"]).await.ok();
    assert!(run.stdout.contains("no jobs match"), "{}", run.stdout);
    let short = forge(
        url,
        &["jobs", "--state", "available", "--queue", "cli", "--json"],
    )
    .await
    .ok()
    .json();
    let long = forge(
        url,
        &[
            "jobs",
            "ls",
            "--state",
            "available",
            "--queue",
            "cli",
            "--json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(short, long);
    assert_eq!(short["items"].as_array().unwrap().len(), 1, "{short}");
    let run = forge(url, &["jobs", "--state", "dead", "show", "1"])
        .await
        .expect(2);
    assert!(run.stderr.contains("cannot be used"), "{}", run.stderr);

    // A bad name is named once, in one message.
    let run = forge(url, &["step-down", "x'y"]).await.expect(2);
    assert_eq!(run.stderr.matches("x'y").count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("invalid role name"), "{}", run.stderr);
    let run = forge(url, &["leaders", "--namespace", "Bad Name"])
        .await
        .expect(2);
    assert_eq!(run.stderr.matches("Bad Name").count(), 1, "{}", run.stderr);

    // DATABASE_URL at an HTTP server.
    let (addr, server) = http_server().await;
    let run = forge(&format!("postgres://forge:secret@{addr}/app"), &["status"])
        .await
        .expect(1);
    assert!(
        run.stderr.contains("is not PostgreSQL") && run.stderr.contains("HTTP/1.1 400 Bad Request"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("expected to read"), "{}", run.stderr);
    assert!(!run.stderr.contains("secret"), "{}", run.stderr);
    server.abort();
}

/// Runs `program ARGS` (a PostgreSQL client) to completion, bounded; its stdout.
async fn pg_client(program: &str, args: &[&str]) -> String {
    let path = forge_testkit::client_program(program).unwrap();
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(&path).args(args).kill_on_drop(true).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{program} {args:?} did not finish within 60 s"))
    .unwrap_or_else(|err| panic!("cannot run {}: {err}", path.display()));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Applies `sql` to `url` as the header of `forge migrate sql` says: psql, one transaction,
/// stopping at the first error.
async fn psql(url: &str, sql: &str) {
    let dir = ScratchDir::new("cli-migrate-sql");
    let file = dir.0.join("forge.sql");
    std::fs::write(&file, sql).unwrap();
    let file = file.to_str().unwrap();
    let args = [
        "-X",
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        "--single-transaction",
        "-f",
        file,
        url,
    ];
    pg_client("psql", &args).await;
}

/// Schema `forge` as pg_dump prints it (tables, indexes, constraints, functions, comments).
async fn forge_schema_dump(url: &str) -> String {
    let dump = pg_client(
        "pg_dump",
        &["--schema-only", "--schema=forge", "--no-owner", url],
    )
    .await;
    // pg_dump 17.6, 16.10, 15.14, ... guard the dump with a random key per run.
    dump.lines()
        .filter(|line| !line.starts_with("\\restrict") && !line.starts_with("\\unrestrict"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The bookkeeping of FORGE's schema, but for when each row was written and how long sqlx
/// took: (migrations: version, description, success, checksum), (function files: name,
/// checksum, release).
type Bookkeeping = (
    Vec<(i64, String, bool, Vec<u8>)>,
    Vec<(String, Vec<u8>, String)>,
);

async fn bookkeeping(url: &str) -> Bookkeeping {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let migrations = sqlx::query_as(
        "SELECT version, description, success, checksum FROM forge._sqlx_migrations ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let functions = sqlx::query_as(
        "SELECT name, checksum, forge_version FROM forge.schema_functions ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    (migrations, functions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_sql_applied_with_psql_leaves_the_database_as_migrate_up_does() {
    let reference = migrated_db().await;
    let expected_schema = forge_schema_dump(reference.url()).await;
    let expected_bookkeeping = bookkeeping(reference.url()).await;

    // Printed with no database at hand, applied by another tool to an empty database.
    let sql = forge_env(None, &[], &["migrate", "sql"]).await.ok().stdout;
    assert!(sql.starts_with("-- FORGE "), "{sql}");
    let db = fresh_db().await;
    let url = db.url();
    psql(url, &sql).await;
    assert_eq!(
        forge_schema_dump(url).await,
        expected_schema,
        "the schema differs from the one `forge migrate up` makes"
    );
    assert_eq!(bookkeeping(url).await, expected_bookkeeping);
    let run = forge(url, &["migrate", "status"]).await.ok();
    assert!(run.stdout.contains("up to date"), "{}", run.stdout);

    // Nodes that do not migrate start on it, and the doctor finds nothing missing.
    let mut config = leading_config(url, "sql-a");
    config.database.migrate = false;
    let node = Node::builder(config)
        .auto_register(false)
        .start()
        .await
        .expect("a node with migrate = false starts on the schema psql applied");
    wait_leads_all(&node).await;
    let report = forge(url, &["doctor", "--strict", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(report["ok"], true, "{report}");
    let migrations = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "migrations")
        .cloned()
        .unwrap();
    assert_eq!(migrations["status"], "ok", "{report}");
    node.shutdown().await;

    // An upgrade: a database an older release migrated - its first two migrations, its own
    // function files (one of them, `fence`, different from this release's) - takes only what
    // is new: `--after 2`.
    let old = fresh_db().await;
    let mut conn = old.connect().await.unwrap();
    migrate_until(&mut conn, 2).await;
    let last = forge::migrate::sources().last().unwrap().0.to_string();
    let functions_only = forge_env(None, &[], &["migrate", "sql", "--after", &last])
        .await
        .ok()
        .stdout;
    assert!(
        !functions_only.contains("-- migrations/0"),
        "{functions_only}"
    );
    psql(old.url(), &functions_only).await;
    sqlx::raw_sql(
        "UPDATE forge.schema_functions SET checksum = '\\x00', forge_version = '0.0.1'
          WHERE name = 'fence'",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let when = "SELECT applied_at FROM forge.schema_functions WHERE name = 'audit'";
    let audit_applied: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar(when).fetch_one(&mut conn).await.unwrap();
    let run = forge(old.url(), &["migrate", "status", "--json"])
        .await
        .ok();
    let pending = forge::migrate::sources().len() - 2;
    assert_eq!(run.json()["pending"], pending, "{}", run.stdout);

    let upgrade = forge_env(None, &[], &["migrate", "sql", "--after", "2"])
        .await
        .ok()
        .stdout;
    psql(old.url(), &upgrade).await;
    assert_eq!(forge_schema_dump(old.url()).await, expected_schema);
    assert_eq!(bookkeeping(old.url()).await, expected_bookkeeping);
    let unchanged: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar(when).fetch_one(&mut conn).await.unwrap();
    assert_eq!(
        unchanged, audit_applied,
        "a function file recorded with the same SQL keeps its row, as `forge migrate up` does"
    );
    let run = forge(old.url(), &["migrate", "status"]).await.ok();
    assert!(run.stdout.contains("up to date"), "{}", run.stdout);

    // A database migrated further than this release knows: said so, exit 2.
    let run = forge_env(None, &[], &["migrate", "sql", "--after", "9999"])
        .await
        .expect(2);
    assert!(
        run.stderr.contains("9999") && run.stderr.contains("newer FORGE"),
        "{}",
        run.stderr
    );
}

/// `forge ... | head` closes the pipe the command writes to: the command ends quietly, as a Unix
/// tool does, instead of panicking on its first write.
#[tokio::test]
async fn output_to_a_closed_pipe_ends_the_command_quietly() {
    let mut command = forge_command(None, &[]);
    command
        .args(["alerts", "export"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("the forge-cli binary runs");
    // The reader goes away before the command writes its first line (it reads its
    // configuration first); a write after that fails with EPIPE.
    drop(child.stdout.take());
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("forge alerts export ended within 60 s")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("panicked"),
        "no panic on a closed pipe: {stderr}"
    );
    assert_eq!(output.status.code(), Some(0), "stderr: {stderr}");
}

/// `forge queues limit` sets a queue's limits (shown by `forge queues`), refuses bad values
/// with what is wrong, and gives them back to forge.toml with `--reset`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_limits_are_set_shown_and_reset() {
    let db = migrated_db().await;
    let url = db.url();
    let run = forge(
        url,
        &[
            "queues", "limit", "mail", "--global", "4", "--rate", "100/1m", "--new",
        ],
    )
    .await
    .ok();
    assert!(
        run.stdout.contains("global 4, rate 100/1m"),
        "{}",
        run.stdout
    );
    let queues = forge(url, &["queues", "--json"]).await.ok().json();
    assert_eq!(queues[0]["queue"], "mail");
    assert_eq!(queues[0]["limits"]["global_concurrency"], 4);
    assert_eq!(queues[0]["limits"]["rate"], "100/1m");
    assert_eq!(
        queues[0]["limits_set_by"].as_str().map(|b| !b.is_empty()),
        Some(true)
    );
    let table = forge(url, &["queues"]).await.ok();
    assert!(
        table.stdout.contains("LIMITS") && table.stdout.contains("global 4"),
        "{}",
        table.stdout
    );
    let run = forge(url, &["queues", "limit", "mail", "--rate", "100 a minute"])
        .await
        .expect(2);
    assert!(run.stderr.contains("100/1m"), "{}", run.stderr);
    let run = forge(url, &["queues", "limit", "mail"]).await.expect(2);
    assert!(run.stderr.contains("--global"), "{}", run.stderr);
    forge(url, &["queues", "limit", "mail", "--reset"])
        .await
        .ok();
    let queues = forge(url, &["queues", "--json"]).await.ok().json();
    assert_eq!(
        queues,
        serde_json::json!([]),
        "no limits, no jobs: no queue"
    );
}
