//! Claiming ahead (`[cron] claim_ahead`): a tick claimed before its instant runs once, on the
//! leader of its instant - when its claimer is cut off or killed before the instant, or hands
//! over - and a tick whose claimer dies with no successor until after the instant follows the
//! `interrupted` policy. The window is widened to seconds here so that each case is reached
//! deliberately.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge::crons::{CatchUp, CronJob, Interrupted};
use forge::{CronContext, CronError, Node, Role, Schedule};
use forge_testkit::{Filter, PgProxy, PgServer, wait_until};
use sqlx::PgPool;

use crate::exactly_once::{setup, steady_config, wait_leads};
use crate::support::*;

/// Every handler start of the test's crons, in this process: (node, scheduled_at, attempt).
type Starts = Arc<Mutex<Vec<(String, DateTime<Utc>, u32)>>>;

/// A cron every 5 s (`interrupted = "abandon"`, `catch_up = "all"`) that notes each handler
/// start in `starts` before anything can fence it.
fn noting_cron(starts: &Starts) -> CronJob {
    let starts = starts.clone();
    CronJob::new(
        "every5",
        Schedule::parse("*/5 * * * * *").unwrap(),
        move |ctx: CronContext| {
            starts.lock().unwrap().push((
                ctx.node_id().to_string(),
                ctx.scheduled_at(),
                ctx.attempt(),
            ));
            async { Ok::<_, CronError>(()) }
        },
    )
    .catch_up(CatchUp::All)
    .interrupted(Interrupted::Abandon)
}

/// A node whose leader claims ticks 3 s ahead.
async fn ahead_node(url: &str, id: &str, crons: Vec<CronJob>) -> Node {
    let mut config = steady_config(url, id);
    config.cron.claim_ahead = Duration::from_secs(3);
    let mut builder = Node::builder(config).auto_register(false);
    for cron in crons {
        builder = builder.cron(cron);
    }
    builder.start().await.expect("node starts")
}

/// Waits for a tick of `every5` that `node` has claimed and whose instant is still at least
/// 1 s away.
async fn wait_claimed_ahead(pool: &PgPool, node: &str) -> DateTime<Utc> {
    wait_until(
        &format!("{node} to claim a tick of every5 ahead of its instant"),
        SOON,
        Duration::from_millis(10),
        || async {
            sqlx::query_scalar(
                "SELECT scheduled_at FROM forge.cron_ticks
                  WHERE cron = 'every5' AND node_id = $1 AND state = 'running'
                    AND scheduled_at > clock_timestamp() + interval '1 s'",
            )
            .bind(node)
            .fetch_optional(pool)
            .await
            .unwrap()
        },
    )
    .await
    .unwrap()
}

/// The ledger row of `tick`: (node, state, attempt).
async fn ledger_row(pool: &PgPool, tick: DateTime<Utc>) -> Option<(String, String, i32)> {
    sqlx::query_as(
        "SELECT node_id, state, attempt FROM forge.cron_ticks
          WHERE cron = 'every5' AND scheduled_at = $1",
    )
    .bind(tick)
    .fetch_optional(pool)
    .await
    .unwrap()
}

/// Waits until `tick` has a final state in the ledger: (node, state, attempt).
async fn wait_final(pool: &PgPool, tick: DateTime<Utc>) -> (String, String, i32) {
    wait_until(
        &format!("tick {tick} to be final"),
        SOON,
        Duration::from_millis(20),
        || async {
            ledger_row(pool, tick)
                .await
                .filter(|(_, state, _)| state != "running")
        },
    )
    .await
    .unwrap()
}

/// Waits until the database's clock is past `at`.
async fn wait_passed(pool: &PgPool, at: DateTime<Utc>) {
    wait_until(
        &format!("the instant {at} to pass"),
        SOON,
        Duration::from_millis(20),
        || async {
            let passed: bool = sqlx::query_scalar("SELECT clock_timestamp() > $1")
                .bind(at)
                .fetch_one(pool)
                .await
                .unwrap();
            passed.then_some(())
        },
    )
    .await
    .unwrap();
}

fn starts_of(starts: &Starts, tick: DateTime<Utc>) -> Vec<(String, u32)> {
    starts
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, at, _)| *at == tick)
        .map(|(node, _, attempt)| (node.clone(), *attempt))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_claimed_ahead_by_a_leader_cut_off_before_its_instant_starts_once_on_the_next() {
    // Node a reaches PostgreSQL through a proxy, b directly.
    let server = PgServer::shared().unwrap();
    let db = server.create_database().await.unwrap();
    let pool = db.pool().await.unwrap();
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let starts: Starts = Arc::default();
    let a = ahead_node(
        &proxy.url_for(server, db.name()),
        "a",
        vec![noting_cron(&starts)],
    )
    .await;
    wait_leads(&pool, "a").await;
    let b = ahead_node(db.url(), "b", vec![noting_cron(&starts)]).await;
    let tick = wait_claimed_ahead(&pool, "a").await;
    // a is cut off as by a database restart it has not noticed: the server ends its sessions
    // (b leads at once, before the instant) while a hears nothing - no error, no notice of
    // b's election - and trusts its leadership until its deadline, seconds after the
    // instant. Only the gate keeps a from starting the tick it claimed.
    proxy.blackhole(Filter::All);
    wait_until(
        "b to lead after a's sessions are ended",
        SOON,
        Duration::from_millis(10),
        || async {
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'forge:%:a'",
            )
            .execute(&pool)
            .await
            .unwrap();
            let leader: Option<String> = sqlx::query_scalar(
                "SELECT node_id FROM forge.leaders WHERE role = 'scheduler' AND released_at IS NULL",
            )
            .fetch_optional(&pool)
            .await
            .unwrap();
            (leader.as_deref() == Some("b")).then_some(())
        },
    )
    .await
    .unwrap();
    let acquired: DateTime<Utc> = sqlx::query_scalar(
        "SELECT acquired_at FROM forge.leaders WHERE role = 'scheduler' AND node_id = 'b'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(acquired < tick, "b leads from {acquired}, before {tick}");
    assert!(
        a.leadership(&Role::SCHEDULER).is_some(),
        "a still trusts its leadership (else this test shows nothing)"
    );
    let row = wait_final(&pool, tick).await;
    assert_eq!(
        row,
        ("b".to_owned(), "succeeded".to_owned(), 1),
        "the tick a claimed ahead is b's first attempt, not a run cut short"
    );
    // Until a's leadership is over: any start of the tick by a would have happened by then.
    wait_until(
        "a to stop trusting its leadership",
        SOON,
        Duration::from_millis(20),
        || async { a.leadership(&Role::SCHEDULER).is_none().then_some(()) },
    )
    .await
    .unwrap();
    assert_eq!(
        starts_of(&starts, tick),
        [("b".to_owned(), 1)],
        "started once, by b"
    );
    let abandoned: i64 =
        sqlx::query_scalar("SELECT count(*) FROM forge.cron_ticks WHERE state = 'abandoned'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(abandoned, 0, "no tick abandoned");
    proxy.sever(&Filter::All);
    proxy.heal_all();
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_handing_over_before_a_claimed_ticks_instant_deletes_its_claim() {
    let (db, pool) = setup().await;
    let starts: Starts = Arc::default();
    let a = ahead_node(db.url(), "a", vec![noting_cron(&starts)]).await;
    wait_leads(&pool, "a").await;
    let tick = wait_claimed_ahead(&pool, "a").await;
    // No other node: the claim is not taken back by a successor; a must delete it itself.
    a.shutdown().await;
    assert_eq!(
        ledger_row(&pool, tick).await,
        None,
        "the claim of a tick a handed over before is gone"
    );
    assert_eq!(starts_of(&starts, tick), [], "a did not start it");
    // The next leader, after the instant, runs it by catch_up = "all" (not abandoned).
    wait_passed(&pool, tick).await;
    let b = ahead_node(db.url(), "b", vec![noting_cron(&starts)]).await;
    let row = wait_final(&pool, tick).await;
    assert_eq!(row, ("b".to_owned(), "succeeded".to_owned(), 1));
    assert_eq!(starts_of(&starts, tick), [("b".to_owned(), 1)]);
    b.shutdown().await;
}

/// The probe nodes' forge.toml with ticks claimed 2 s ahead.
fn probe_dir(db: &forge_testkit::TestDatabase, name: &str) -> ScratchDir {
    let dir = ScratchDir::new(name);
    std::fs::write(
        dir.0.join("forge.toml"),
        format!("{}\n[cron]\nclaim_ahead = \"2s\"\n", config_toml(db.url())),
    )
    .unwrap();
    dir
}

/// The probe runs of `tick`: (node, attempt).
async fn probe_runs(pool: &PgPool, tick: DateTime<Utc>) -> Vec<(String, i32)> {
    sqlx::query_as(
        "SELECT node, attempt FROM forge_probe_ticks WHERE scheduled_at = $1 ORDER BY id",
    )
    .bind(tick)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The node leading the scheduler role, if one does (none before the first election, nor
/// between a release and the next).
async fn scheduler_leader(pool: &PgPool) -> Option<String> {
    sqlx::query_scalar(
        "SELECT node_id FROM forge.leaders WHERE role = 'scheduler' AND released_at IS NULL",
    )
    .fetch_optional(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_claimed_ahead_by_a_killed_leader_runs_on_time_or_by_the_interrupted_policy() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    sqlx::raw_sql(forge_tests::probe::PROBE_TABLE_SQL)
        .execute(&pool)
        .await
        .unwrap();
    let dir = probe_dir(&db, "claim-ahead-kill");
    let mut probes = Vec::new();
    for id in ["p1", "p2"] {
        probes.push(Probe::start_with_cron(&db, &dir.0, id, &["scheduler"], "*/5 * * * * *").await);
    }
    // A follower waits: the leader is SIGKILLed after claiming a tick ahead, the follower leads
    // within milliseconds, before the instant, and runs the tick as its first attempt.
    let first = wait_until(
        "the leader to claim a tick ahead",
        SOON,
        Duration::from_millis(10),
        || async {
            let leader = scheduler_leader(&pool).await?;
            let tick: Option<DateTime<Utc>> = sqlx::query_scalar(
                "SELECT scheduled_at FROM forge.cron_ticks
                  WHERE node_id = $1 AND state = 'running'
                    AND scheduled_at > clock_timestamp() + interval '500 ms'",
            )
            .bind(&leader)
            .fetch_optional(&pool)
            .await
            .unwrap();
            tick.map(|tick| (leader, tick))
        },
    )
    .await
    .unwrap();
    let (killed, tick) = first;
    let index = probes.iter().position(|p| p.id == killed).unwrap();
    probes[index].process.kill().unwrap();
    let survivor = probes[1 - index].id.clone();
    let runs = wait_until(
        &format!("tick {tick} to run"),
        SOON,
        Duration::from_millis(20),
        || async { Some(probe_runs(&pool, tick).await).filter(|runs| !runs.is_empty()) },
    )
    .await
    .unwrap();
    assert_eq!(
        runs,
        [(survivor.clone(), 1)],
        "the tick {killed} claimed ahead ran once, as {survivor}'s first attempt"
    );
    // No follower now: the survivor is SIGKILLed after claiming the next tick ahead, and a new
    // node starts only after that tick's instant. It cannot tell the claim from a run cut
    // short: `interrupted = "rerun"` (the probe's) runs it as attempt 2 - once, since the
    // killed leader never started it.
    let next = wait_until(
        &format!("{survivor} to claim the next tick ahead"),
        SOON,
        Duration::from_millis(10),
        || async {
            sqlx::query_scalar::<_, DateTime<Utc>>(
                "SELECT scheduled_at FROM forge.cron_ticks
                  WHERE node_id = $1 AND state = 'running' AND scheduled_at > $2
                    AND scheduled_at > clock_timestamp() + interval '500 ms'",
            )
            .bind(&survivor)
            .bind(tick)
            .fetch_optional(&pool)
            .await
            .unwrap()
        },
    )
    .await
    .unwrap();
    probes[1 - index].process.kill().unwrap();
    wait_passed(&pool, next + chrono::TimeDelta::milliseconds(200)).await;
    let _late = Probe::start_with_cron(&db, &dir.0, "p3", &["scheduler"], "*/5 * * * * *").await;
    // Until a later tick has run too, so that a second run of `next` would show.
    wait_until(
        &format!("p3 to run a tick after {next}"),
        SOON,
        Duration::from_millis(20),
        || async {
            let later: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM forge_probe_ticks WHERE node = 'p3' AND scheduled_at > $1",
            )
            .bind(next)
            .fetch_one(&pool)
            .await
            .unwrap();
            (later > 0).then_some(())
        },
    )
    .await
    .unwrap();
    let runs = probe_runs(&pool, next).await;
    assert_eq!(
        runs,
        [("p3".to_owned(), 2)],
        "a claim left by a leader with no successor until after the instant is rerun"
    );
}
