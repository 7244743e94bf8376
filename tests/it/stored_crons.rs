//! Crons stored in the database (`Workload::upsert_cron`): their ticks enqueue their job on
//! the scheduler's leader from the first tick after they are stored; a change, a pause and a
//! deletion take effect with no restart; names of crons of code are refused both ways; every
//! change is audited; a tick enqueues its job exactly once across a SIGKILL of the leader
//! (node processes).

use std::time::Duration;

use forge::crons::{CatchUp, CronJob, StoredCron};
use forge::inspect::{Upserted, Workload};
use forge::{Config, LockNamespace, Node, Schedule};
use forge_testkit::{NodeProcess, wait_until};
use sqlx::PgPool;

use crate::admin::Api;
use crate::cli::forge;
use crate::jobs::{Behave, job_config, plain, served_job_config, setup};
use crate::support::*;

fn workload(pool: &PgPool) -> Workload {
    Workload::new(pool.clone(), LockNamespace::default())
}

/// A per-second stored cron enqueueing `plain` with the tag `tag`.
fn every_second(name: &str, tag: &str) -> StoredCron {
    let args = serde_json::to_value(Behave::tag(tag)).unwrap();
    StoredCron::new(name, Schedule::parse("* * * * * *").unwrap(), "plain", args).unwrap()
}

async fn start(config: Config) -> Node {
    Node::builder(config)
        .auto_register(false)
        .job(plain)
        .start()
        .await
        .expect("node starts")
}

/// Jobs enqueued with this tag.
async fn jobs_tagged(pool: &PgPool, tag: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM forge.jobs WHERE kind = 'plain' AND args->>'tag' = $1")
        .bind(tag)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The cron's ticks in the ledger: (scheduled_at, state).
async fn ticks(pool: &PgPool, cron: &str) -> Vec<(chrono::DateTime<chrono::Utc>, String)> {
    sqlx::query_as(
        "SELECT scheduled_at, state FROM forge.cron_ticks WHERE cron = $1 ORDER BY scheduled_at",
    )
    .bind(cron)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn wait_ticks(
    pool: &PgPool,
    cron: &str,
    state: &str,
    after: chrono::DateTime<chrono::Utc>,
    n: usize,
) {
    wait_until(
        &format!("{n} {state} ticks of {cron} after {after}"),
        SOON,
        Duration::from_millis(20),
        || async {
            let found = ticks(pool, cron)
                .await
                .into_iter()
                .filter(|(at, s)| *at > after && s == state)
                .count();
            (found >= n).then_some(())
        },
    )
    .await
    .unwrap();
}

pub(crate) async fn db_now(pool: &PgPool) -> chrono::DateTime<chrono::Utc> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The audit trail's actions on `subject`, oldest first.
async fn audited(pool: &PgPool, subject: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT detail->>'action', detail->>'by' FROM forge.events
          WHERE kind = 'admin_action' AND detail->>'subject' = $1 ORDER BY id",
    )
    .bind(subject)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_cron_runs_from_its_first_tick_and_is_changed_paused_and_deleted_at_run_time() {
    let (db, pool) = setup().await;
    let node = start(job_config(db.url(), "n1")).await;
    wait_single_leader(&[&node], &forge::Role::SCHEDULER).await;
    let ops = workload(&pool);

    // Created: the first tick due after the store runs (under catch_up = "skip", a tick more
    // than [cron] misfire_threshold late would be missed, not run).
    let cron = every_second("stored-every-second", "v1").catch_up(CatchUp::Skip);
    let stored = db_now(&pool).await;
    assert_eq!(
        ops.upsert_cron(&cron, "alice").await.unwrap(),
        Upserted::Created
    );
    assert_eq!(
        ops.upsert_cron(&cron, "alice").await.unwrap(),
        Upserted::Unchanged
    );
    wait_ticks(&pool, "stored-every-second", "succeeded", stored, 2).await;
    let first = ticks(&pool, "stored-every-second").await;
    let next_second = stored + chrono::TimeDelta::seconds(1);
    assert!(
        first[0].0 <= next_second && first[0].1 == "succeeded",
        "the first tick after the store ({stored}) ran: {first:?}"
    );
    let view = ops.cron("stored-every-second").await.unwrap().unwrap();
    assert_eq!(view.job_kind.as_deref(), Some("plain"));

    // Changed: the ticks after the change enqueue the new arguments, without a restart.
    let changed = db_now(&pool).await;
    let v2 = every_second("stored-every-second", "v2").catch_up(CatchUp::Skip);
    assert_eq!(
        ops.upsert_cron(&v2, "bob").await.unwrap(),
        Upserted::Updated
    );
    wait_until(
        "jobs of the new definition",
        SOON,
        Duration::from_millis(20),
        || async { (jobs_tagged(&pool, "v2").await >= 2).then_some(()) },
    )
    .await
    .unwrap();
    let before_v2: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.jobs WHERE args->>'tag' = 'v1' AND created_at > $1 + interval '1 second'",
    )
    .bind(changed)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        before_v2, 0,
        "the old definition enqueued after the change took effect"
    );

    // Paused: ticks are skipped and enqueue nothing; resumed: they run again.
    assert!(
        ops.pause_cron("stored-every-second", "carol")
            .await
            .unwrap()
    );
    let paused = db_now(&pool).await + chrono::TimeDelta::milliseconds(500);
    wait_ticks(&pool, "stored-every-second", "skipped", paused, 2).await;
    let jobs_paused = jobs_tagged(&pool, "v2").await;
    assert!(
        ops.resume_cron("stored-every-second", "carol")
            .await
            .unwrap()
    );
    let resumed = db_now(&pool).await;
    wait_ticks(&pool, "stored-every-second", "succeeded", resumed, 2).await;
    assert!(jobs_tagged(&pool, "v2").await >= jobs_paused + 2);

    // Every succeeded tick enqueued one job, and every job came from one succeeded tick.
    let all = ticks(&pool, "stored-every-second").await;
    let succeeded = all.iter().filter(|(_, s)| s == "succeeded").count() as i64;
    let enqueued = jobs_tagged(&pool, "v1").await + jobs_tagged(&pool, "v2").await;
    assert_eq!(succeeded, enqueued, "ticks {all:?}");

    // Deleted: no tick after its deletion, while another stored cron goes on ticking.
    assert!(
        ops.delete_cron("stored-every-second", "dave")
            .await
            .unwrap()
    );
    assert!(
        !ops.delete_cron("stored-every-second", "dave")
            .await
            .unwrap()
    );
    assert!(ops.cron("stored-every-second").await.unwrap().is_none());
    let deleted = db_now(&pool).await;
    ops.upsert_cron(&every_second("witness", "w"), "dave")
        .await
        .unwrap();
    wait_ticks(&pool, "witness", "succeeded", deleted, 2).await;
    let late: Vec<_> = ticks(&pool, "stored-every-second")
        .await
        .into_iter()
        .filter(|(at, _)| *at > deleted + chrono::TimeDelta::seconds(1))
        .collect();
    assert!(late.is_empty(), "ticks after the deletion: {late:?}");

    // Audited, with who asked.
    let actions = audited(&pool, "stored-every-second").await;
    let expected: Vec<(String, String)> = [
        ("upsert_cron", "alice"),
        ("upsert_cron", "bob"),
        ("pause_cron", "carol"),
        ("resume_cron", "carol"),
        ("delete_cron", "dave"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(actions, expected);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_of_a_cron_of_code_is_refused_both_ways() {
    let (db, pool) = setup().await;
    sqlx::query("CREATE TABLE code_runs (cron text NOT NULL, at timestamptz NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let ops = workload(&pool);
    // Stored first: a node deployed later with a cron of code of that name does not run it.
    ops.upsert_cron(&every_second("shadowed", "stored"), "ops")
        .await
        .unwrap();
    let code = |name: &'static str| {
        CronJob::new(
            name,
            Schedule::parse("* * * * * *").unwrap(),
            move |ctx| async move {
                sqlx::query("INSERT INTO code_runs VALUES ($1, $2)")
                    .bind(ctx.name())
                    .bind(ctx.scheduled_at())
                    .execute(ctx.pool())
                    .await
                    .unwrap();
            },
        )
    };
    let node = Node::builder(job_config(db.url(), "n1"))
        .auto_register(false)
        .job(plain)
        .cron(code("shadowed"))
        .cron(code("nightly"))
        .start()
        .await
        .unwrap();
    let since = db_now(&pool).await;
    wait_ticks(&pool, "nightly", "succeeded", since, 2).await;
    wait_ticks(&pool, "shadowed", "succeeded", since, 2).await;
    let runs: Vec<String> = sqlx::query_scalar("SELECT DISTINCT cron FROM code_runs")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        runs,
        ["nightly"],
        "the cron of code named like a stored cron ran"
    );
    assert!(jobs_tagged(&pool, "stored").await >= 2);
    let view = ops.cron("shadowed").await.unwrap().unwrap();
    assert_eq!(
        view.job_kind.as_deref(),
        Some("plain"),
        "the stored row was taken over"
    );

    // Code first: storing under its name is refused, and so is deleting it.
    let refused = ops
        .upsert_cron(&every_second("nightly", "x"), "ops")
        .await
        .unwrap_err();
    assert!(
        matches!(refused, forge::Error::Conflict { .. })
            && refused.to_string().contains("cron of code"),
        "{refused}"
    );
    let refused = ops.delete_cron("nightly", "ops").await.unwrap_err();
    assert!(
        matches!(refused, forge::Error::Conflict { .. }),
        "{refused}"
    );
    assert_eq!(audited(&pool, "nightly").await, []);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_stored_crons_are_refused_with_clear_errors() {
    let schedule = Schedule::parse("* * * * *").unwrap();
    let err = StoredCron::new(
        "bad name!",
        schedule.clone(),
        "plain",
        serde_json::json!({}),
    )
    .unwrap_err();
    assert!(err.to_string().contains("bad name!"), "{err}");
    let err = StoredCron::new("ok", schedule.clone(), "", serde_json::json!({})).unwrap_err();
    assert!(matches!(err, forge::Error::InvalidInput { .. }), "{err}");
    let (_db, pool) = setup().await;
    let zero = StoredCron::new("ok", schedule, "plain", serde_json::json!({}))
        .unwrap()
        .timeout(Duration::ZERO);
    let err = workload(&pool).upsert_cron(&zero, "ops").await.unwrap_err();
    assert!(err.to_string().contains("timeout"), "{err}");
}

/// The forge.toml of a job node process.
/// A tick whose enqueue fails for a transient reason - here its connection is terminated while
/// its insert waits behind a table lock - tries again in its run and enqueues its job: no tick
/// ends `failed` for a blip, and every succeeded tick has exactly one job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_ticks_enqueue_is_tried_again_after_a_lost_connection() {
    let (db, pool) = setup().await;
    let node = start(job_config(db.url(), "n1")).await;
    wait_single_leader(&[&node], &forge::Role::SCHEDULER).await;
    // Inserts into forge.jobs wait behind this lock (reads do not).
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE forge.jobs IN SHARE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let started = db_now(&pool).await;
    workload(&pool)
        .upsert_cron(&every_second("stored-retried", "retried"), "alice")
        .await
        .unwrap();
    let waiting: i32 = wait_until(
        "a tick's enqueue waiting behind the table lock",
        SOON,
        Duration::from_millis(20),
        || async {
            sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%jobs_enqueue%' LIMIT 1",
            )
            .fetch_optional(&pool)
            .await
            .unwrap()
        },
    )
    .await
    .unwrap();
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(waiting)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        terminated,
        "the waiting enqueue's backend {waiting} was terminated"
    );
    blocker.commit().await.unwrap();

    wait_ticks(&pool, "stored-retried", "succeeded", started, 3).await;
    let ticks = ticks(&pool, "stored-retried").await;
    assert!(
        ticks.iter().all(|(_, state)| state != "failed"),
        "no tick failed for a lost connection: {ticks:?}"
    );
    let succeeded = ticks.iter().filter(|(_, s)| s == "succeeded").count() as i64;
    let enqueued = jobs_tagged(&pool, "retried").await;
    assert!(
        enqueued == succeeded || enqueued == succeeded + 1,
        "one job per succeeded tick ({succeeded} succeeded, {enqueued} jobs; one more tick may \
         be committing): {ticks:?}"
    );
    node.shutdown().await;
}

fn node_toml(url: &str) -> String {
    format!(
        "{}\n[node]\nroles = [\"scheduler\"]\n\n[jobs]\nmaintenance_interval = \"1s\"\ndrain_timeout = \"2s\"\n",
        config_toml(url)
    )
}

async fn spawn_job_node(config: &std::path::Path, id: &str) -> NodeProcess {
    crate::jobs::process::spawn_job_node(config, id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_cron_enqueues_exactly_once_per_tick_across_a_sigkill_of_its_leader() {
    let (db, pool) = setup().await;
    let dir = ScratchDir::new("stored-crons");
    let path = dir.0.join("forge.toml");
    std::fs::write(&path, node_toml(db.url())).unwrap();
    let mut n1 = spawn_job_node(&path, "n1").await;
    wait_until(
        "n1 to lead the scheduler",
        SOON,
        Duration::from_millis(10),
        || async {
            let leaders = current_leaders(&pool).await;
            (leaders.get("scheduler").map(|(n, _)| n.as_str()) == Some("n1")).then_some(())
        },
    )
    .await
    .unwrap();
    let mut n2 = spawn_job_node(&path, "n2").await;
    let ops = workload(&pool);
    let cron = every_second("killed", "k").catch_up(CatchUp::All);
    ops.upsert_cron(&cron, "ops").await.unwrap();
    let start = db_now(&pool).await;
    wait_ticks(&pool, "killed", "succeeded", start, 3).await;
    n1.kill().unwrap();
    let killed = db_now(&pool).await;
    wait_until(
        "n2 to lead the scheduler",
        SOON,
        Duration::from_millis(10),
        || async {
            let leaders = current_leaders(&pool).await;
            (leaders.get("scheduler").map(|(n, _)| n.as_str()) == Some("n2")).then_some(())
        },
    )
    .await
    .unwrap();
    wait_ticks(&pool, "killed", "succeeded", killed, 3).await;
    ops.pause_cron("killed", "ops").await.unwrap();
    // Paused: wait for a skipped tick, after which no tick enqueues.
    let paused = db_now(&pool).await;
    wait_ticks(&pool, "killed", "skipped", paused, 1).await;
    let all = ticks(&pool, "killed").await;
    let succeeded: Vec<_> = all.iter().filter(|(_, s)| s == "succeeded").collect();
    // No tick missing between the first and the last (catch_up = "all"), none left running.
    let (first, last) = (all[0].0, all[all.len() - 1].0);
    assert_eq!(
        all.len() as i64,
        (last - first).num_seconds() + 1,
        "a tick is missing: {all:?}"
    );
    assert!(
        all.iter().all(|(_, s)| s == "succeeded" || s == "skipped"),
        "{all:?}"
    );
    assert_eq!(
        jobs_tagged(&pool, "k").await,
        succeeded.len() as i64,
        "one job per succeeded tick: {all:?}"
    );
    n2.terminate().unwrap();
    n2.wait_exit(SOON).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_and_the_cli_store_change_and_delete_crons() {
    let (db, pool) = setup().await;
    let mut config = served_job_config(db.url(), "n1", false);
    config.admin.token = Some("stored-crons-token".into());
    let node = start(config).await;
    wait_single_leader(&[&node], &forge::Role::SCHEDULER).await;
    let api = Api::of(&node).with_token("stored-crons-token");
    let body = r#"{"expression": "* * * * * *", "kind": "plain", "args": {"tag": "api"}}"#;
    let reply = api.call("PUT", "/api/crons/from-api", Some(body)).await;
    assert_eq!(
        (reply.status, &reply.body["result"]),
        (200, &serde_json::json!("created")),
        "{:?}",
        reply.body
    );
    wait_until(
        "a job of the API's cron",
        SOON,
        Duration::from_millis(20),
        || async { (jobs_tagged(&pool, "api").await >= 1).then_some(()) },
    )
    .await
    .unwrap();
    let bad = r#"{"expression": "* * * * * *", "kind": "plain", "catch_up": "sometimes"}"#;
    let reply = api.call("PUT", "/api/crons/from-api", Some(bad)).await;
    assert_eq!(reply.status, 400, "{:?}", reply.body);
    assert!(
        reply
            .body
            .to_string()
            .contains("catch_up must be one of skip, latest, all"),
        "{:?}",
        reply.body
    );
    assert_eq!(
        api.call("DELETE", "/api/crons/from-api", None).await.status,
        200
    );
    assert_eq!(
        api.call("DELETE", "/api/crons/from-api", None).await.status,
        404
    );

    let add = [
        "crons",
        "add",
        "from-cli",
        "* * * * * *",
        "--kind",
        "plain",
        "--args",
        r#"{"tag":"cli"}"#,
    ];
    let run = forge(db.url(), &add).await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("created stored cron from-cli"),
        "{}",
        run.stdout
    );
    wait_until(
        "a job of the CLI's cron",
        SOON,
        Duration::from_millis(20),
        || async { (jobs_tagged(&pool, "cli").await >= 1).then_some(()) },
    )
    .await
    .unwrap();
    let again = forge(db.url(), &add).await;
    assert_ne!(again.code, 0);
    assert!(again.stderr.contains("forge crons set"), "{}", again.stderr);
    let set = [
        "crons",
        "set",
        "from-cli",
        "*/2 * * * * *",
        "--kind",
        "plain",
        "--args",
        r#"{"tag":"cli2"}"#,
    ];
    let run = forge(db.url(), &set).await;
    assert!(
        run.stdout.contains("updated stored cron from-cli"),
        "{}{}",
        run.stdout,
        run.stderr
    );
    let view = workload(&pool).cron("from-cli").await.unwrap().unwrap();
    assert_eq!(view.expression, "*/2 * * * * *");
    let run = forge(db.url(), &["crons", "delete", "from-cli"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let actions: Vec<String> = audited(&pool, "from-cli")
        .await
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert_eq!(actions, ["upsert_cron", "upsert_cron", "delete_cron"]);
    node.shutdown().await;
}
