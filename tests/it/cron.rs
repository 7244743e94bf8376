//! Crons on in-process nodes: exactly-once ticks, catch-up, overlap, interrupted runs,
//! outcomes, roles.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use forge::crons::{CatchUp, CronJob, Interrupted, Overlap};
use forge::{CronContext, CronError, Node, Role, RoleState, Schedule};
use forge_testkit::{TestDatabase, wait_until};
use sqlx::PgPool;

use crate::support::*;

const RUNS_TABLE: &str = "CREATE TABLE cron_runs (
    cron         text        NOT NULL,
    scheduled_at timestamptz NOT NULL,
    attempt      integer     NOT NULL,
    node         text        NOT NULL,
    epoch        bigint      NOT NULL,
    at           timestamptz NOT NULL DEFAULT clock_timestamp()
)";

/// A cron that records each run in `cron_runs`, in a fenced transaction.
fn recording(name: &str, expression: &str) -> CronJob {
    CronJob::new(name, Schedule::parse(expression).unwrap(), record)
}

async fn record(ctx: CronContext) -> Result<(), CronError> {
    let mut tx = ctx.fenced_transaction().await?;
    sqlx::query("INSERT INTO cron_runs (cron, scheduled_at, attempt, node, epoch) VALUES ($1, $2, $3, $4, $5)")
        .bind(ctx.name())
        .bind(ctx.scheduled_at())
        .bind(ctx.attempt() as i32)
        .bind(ctx.leadership().node_id().as_str())
        .bind(ctx.epoch().0)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// A fresh database with FORGE's schema (applied by starting and stopping a node with no
/// work) and the `cron_runs` table.
async fn setup() -> (TestDatabase, PgPool) {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    sqlx::query(RUNS_TABLE).execute(&pool).await.unwrap();
    let migrator = Node::builder(config(db.url(), "migrator"))
        .auto_register(false)
        .start()
        .await
        .unwrap();
    migrator.shutdown().await;
    (db, pool)
}

async fn cron_node(url: &str, id: &str, crons: Vec<CronJob>) -> Node {
    let mut config = config(url, id);
    let mut roles: Vec<String> = crons
        .iter()
        .map(|c| c.role_name().name().to_owned())
        .collect();
    roles.sort();
    roles.dedup();
    config.node.roles = Some(roles);
    let mut builder = Node::builder(config).auto_register(false);
    for cron in crons {
        builder = builder.cron(cron);
    }
    builder.start().await.expect("node starts")
}

/// (scheduled_at, attempt, node) of every recorded run of `cron`, in order.
async fn runs(pool: &PgPool, cron: &str) -> Vec<(DateTime<Utc>, i32, String)> {
    sqlx::query_as("SELECT scheduled_at, attempt, node FROM cron_runs WHERE cron = $1 ORDER BY scheduled_at, attempt")
        .bind(cron)
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn wait_runs(
    pool: &PgPool,
    cron: &str,
    at_least: usize,
    timeout: Duration,
) -> Vec<(DateTime<Utc>, i32, String)> {
    wait_until(
        &format!("{at_least} runs of {cron}"),
        timeout,
        Duration::from_millis(20),
        || async {
            let runs = runs(pool, cron).await;
            (runs.len() >= at_least).then_some(runs)
        },
    )
    .await
    .unwrap()
}

/// Ledger states of `cron` by tick.
async fn ledger(pool: &PgPool, cron: &str) -> Vec<(DateTime<Utc>, String, i32)> {
    sqlx::query_as("SELECT scheduled_at, state, attempt FROM forge.cron_ticks WHERE cron = $1 ORDER BY scheduled_at")
        .bind(cron)
        .fetch_all(pool)
        .await
        .unwrap()
}

fn assert_every_second_once(runs: &[(DateTime<Utc>, i32, String)]) {
    let ticks: Vec<DateTime<Utc>> = runs.iter().map(|r| r.0).collect();
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            TimeDelta::seconds(1),
            "a tick missing or twice: {ticks:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_second_cron_fires_once_per_tick_on_the_leader_only() {
    let (db, pool) = setup().await;
    let mut nodes = Vec::new();
    for id in ["a", "b", "c"] {
        nodes.push(cron_node(db.url(), id, vec![recording("every_second", "* * * * * *")]).await);
    }
    let (leader, epoch) = wait_single_leader_of(&nodes, &Role::SCHEDULER).await;
    let runs = wait_runs(&pool, "every_second", 4, SOON).await;
    assert_every_second_once(&runs);
    let leader_id = nodes[leader].id().to_string();
    assert!(
        runs.iter().all(|r| r.2 == leader_id && r.1 == 1),
        "{runs:?}"
    );
    // The ledger holds one row per tick, claimed by the leader's epoch.
    let claimed: Vec<(DateTime<Utc>, i64, String)> =
        sqlx::query_as("SELECT scheduled_at, epoch, node_id FROM forge.cron_ticks WHERE cron = 'every_second' ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(
        claimed.iter().all(|c| c.1 == epoch && c.2 == leader_id),
        "{claimed:?}"
    );
    // The handler started close to its tick, as seen in the metrics.
    let text = nodes[leader].render_metrics();
    assert!(
        text.contains("forge_cron_lag_seconds_bucket{cron=\"every_second\",role=\"scheduler\""),
        "{text}"
    );
    assert!(
        text.contains(
            "forge_cron_runs_total{cron=\"every_second\",role=\"scheduler\",outcome=\"succeeded\"}"
        ),
        "{text}"
    );
    for node in &nodes {
        node.shutdown().await;
    }
}

/// Waits until exactly one of `nodes` leads `role`.
async fn wait_single_leader_of(nodes: &[Node], role: &Role) -> (usize, i64) {
    let refs: Vec<&Node> = nodes.iter().collect();
    wait_single_leader(&refs, role).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_are_exactly_once_across_a_graceful_handoff_with_catch_up_all() {
    let (db, pool) = setup().await;
    let job = || recording("handoff", "* * * * * *").catch_up(CatchUp::All);
    let a = cron_node(db.url(), "a", vec![job()]).await;
    wait_single_leader_of(std::slice::from_ref(&a), &Role::SCHEDULER).await;
    let b = cron_node(db.url(), "b", vec![job()]).await;
    wait_runs(&pool, "handoff", 2, SOON).await;
    a.shutdown().await;
    let before = runs(&pool, "handoff").await.len();
    let runs = wait_runs(&pool, "handoff", before + 3, SOON).await;
    assert_every_second_once(&runs);
    assert!(
        runs.iter().any(|r| r.2 == "a") && runs.iter().any(|r| r.2 == "b"),
        "{runs:?}"
    );
    b.shutdown().await;
}

/// Plants a finished tick `hours_ago` hours ago as the cron's frontier, as if the cluster had
/// had no leader since then.
async fn plant_frontier(pool: &PgPool, cron: &str, at: DateTime<Utc>) {
    sqlx::query(
        "INSERT INTO forge.cron_ticks (namespace, cron, scheduled_at, role, epoch, tenure, node_id, state, finished_at)
         VALUES ('forge', $1, $2, 'scheduler', 0, 0, 'gone', 'succeeded', $2)",
    )
    .bind(cron)
    .bind(at)
    .execute(pool)
    .await
    .unwrap();
}

/// Hourly ticks in (from, now].
fn hourly_ticks_since(from: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    Schedule::parse("0 * * * *")
        .unwrap()
        .ticks_between(from, Utc::now())
        .collect()
}

/// Runs one catch-up scenario: an hourly cron whose last tick ran 10 hours ago.
async fn catch_up_scenario(
    policy: CatchUp,
    window: Duration,
) -> (Vec<DateTime<Utc>>, Vec<DateTime<Utc>>, String) {
    // Keep clear of the top of the hour, where "late by less than the misfire threshold" would
    // make the newest tick run even under `skip`.
    wait_until(
        "the clock to leave the top of the hour",
        Duration::from_secs(5),
        Duration::from_millis(100),
        || async { (Utc::now().timestamp() % 3600 > 2).then_some(()) },
    )
    .await
    .unwrap();
    let (db, pool) = setup().await;
    let frontier = Utc::now() - TimeDelta::hours(10);
    plant_frontier(&pool, "hourly", frontier).await;
    let missed = hourly_ticks_since(frontier);
    let node = cron_node(
        db.url(),
        "a",
        vec![
            recording("hourly", "0 * * * *")
                .catch_up(policy)
                .catch_up_window(window),
        ],
    )
    .await;
    wait_single_leader_of(std::slice::from_ref(&node), &Role::SCHEDULER).await;
    // Catch-up happens at the start of the tenure; wait until the supervisor has loaded.
    let metrics = wait_until(
        "catch-up to be decided",
        SOON,
        Duration::from_millis(20),
        || async {
            let text = node.render_metrics();
            (text.contains("forge_cron_unknown_crons{role=\"scheduler\"} 0")).then_some(text)
        },
    )
    .await
    .unwrap();
    let expected_runs = match policy {
        CatchUp::Skip => 0,
        CatchUp::Latest => 1,
        CatchUp::All => missed
            .iter()
            .filter(|t| Utc::now() - **t <= TimeDelta::from_std(window).unwrap())
            .count(),
    };
    let ran = wait_runs(&pool, "hourly", expected_runs, SOON).await;
    node.shutdown().await;
    let _ = metrics;
    let text = node.render_metrics();
    (missed, ran.into_iter().map(|r| r.0).collect(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_all_runs_every_missed_tick_within_the_window() {
    let (missed, ran, text) = catch_up_scenario(CatchUp::All, Duration::from_secs(24 * 3600)).await;
    assert_eq!(missed.len(), 10, "{missed:?}");
    assert_eq!(ran, missed);
    assert!(
        text.contains("forge_cron_missed_ticks_total{cron=\"hourly\",role=\"scheduler\"} 0"),
        "nothing missed (the counter is exported at 0): {text}"
    );

    let (missed, ran, text) = catch_up_scenario(CatchUp::All, Duration::from_secs(5 * 3600)).await;
    assert_eq!(
        ran,
        missed[missed.len() - 5..],
        "only the ticks within the window"
    );
    assert!(
        text.contains("forge_cron_missed_ticks_total{cron=\"hourly\",role=\"scheduler\"} 5"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_latest_runs_the_most_recent_missed_tick_once() {
    let (missed, ran, text) =
        catch_up_scenario(CatchUp::Latest, Duration::from_secs(24 * 3600)).await;
    assert_eq!(ran, [*missed.last().unwrap()]);
    assert!(
        text.contains("forge_cron_missed_ticks_total{cron=\"hourly\",role=\"scheduler\"} 9"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_skip_runs_no_missed_tick() {
    let (missed, ran, text) =
        catch_up_scenario(CatchUp::Skip, Duration::from_secs(24 * 3600)).await;
    assert!(ran.is_empty(), "{ran:?}");
    assert!(
        text.contains(&format!(
            "forge_cron_missed_ticks_total{{cron=\"hourly\",role=\"scheduler\"}} {}",
            missed.len()
        )),
        "{text}"
    );
}

/// Plants a tick that an earlier leader claimed and never finished.
async fn plant_interrupted(pool: &PgPool, cron: &str, at: DateTime<Utc>, attempt: i32) {
    sqlx::query(
        "INSERT INTO forge.cron_ticks (namespace, cron, scheduled_at, role, epoch, tenure, node_id, attempt, state)
         VALUES ('forge', $1, $2, 'scheduler', 0, 0, 'dead-node', $3, 'running')",
    )
    .bind(cron)
    .bind(at)
    .bind(attempt)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_short_by_its_leaders_death_is_rerun_or_abandoned_per_policy() {
    let (db, pool) = setup().await;
    let tick = Utc::now() - TimeDelta::minutes(30);
    let tick = tick
        - TimeDelta::seconds(tick.timestamp() % 60)
        - TimeDelta::nanoseconds(tick.timestamp_subsec_nanos() as i64);
    plant_interrupted(&pool, "rerun_me", tick, 1).await;
    plant_interrupted(&pool, "abandon_me", tick, 1).await;
    plant_interrupted(&pool, "tried_enough", tick, 3).await;
    let node = cron_node(
        db.url(),
        "a",
        vec![
            recording("rerun_me", "0 0 1 1 *"),
            recording("abandon_me", "0 0 1 1 *").interrupted(Interrupted::Abandon),
            recording("tried_enough", "0 0 1 1 *"),
        ],
    )
    .await;
    let ran = wait_runs(&pool, "rerun_me", 1, SOON).await;
    assert_eq!(ran, [(tick, 2, "a".to_owned())], "rerun as attempt 2");
    let states = wait_until(
        "the interrupted ticks to be settled",
        SOON,
        Duration::from_millis(20),
        || async {
            let mut states = Vec::new();
            for cron in ["rerun_me", "abandon_me", "tried_enough"] {
                states.push(ledger(&pool, cron).await[0].clone());
            }
            states.iter().all(|s| s.1 != "running").then_some(states)
        },
    )
    .await
    .unwrap();
    assert_eq!(states[0], (tick, "succeeded".to_owned(), 2));
    assert_eq!(states[1], (tick, "abandoned".to_owned(), 1));
    assert_eq!(
        states[2],
        (tick, "abandoned".to_owned(), 3),
        "at most 3 attempts"
    );
    assert!(runs(&pool, "abandon_me").await.is_empty());
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_ticks_are_skipped_or_run_alongside_per_policy() {
    let (db, pool) = setup().await;
    let in_flight = Arc::new(AtomicUsize::new(0));
    let max_in_flight = Arc::new(AtomicUsize::new(0));
    // Each run takes 2.5 s, so the per-second ticks overlap.
    let slow =
        |name: &str, overlap: Overlap, in_flight: Arc<AtomicUsize>, max: Arc<AtomicUsize>| {
            CronJob::new(
                name,
                Schedule::parse("* * * * * *").unwrap(),
                move |ctx: CronContext| {
                    let (in_flight, max) = (in_flight.clone(), max.clone());
                    async move {
                        let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        max.fetch_max(now, Ordering::SeqCst);
                        record(ctx).await?;
                        tokio::time::sleep(Duration::from_millis(2500)).await;
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        Ok::<(), CronError>(())
                    }
                },
            )
            .overlap(overlap)
        };
    let node = cron_node(
        db.url(),
        "a",
        vec![
            slow("skipper", Overlap::Skip, Arc::default(), Arc::default()),
            slow(
                "allower",
                Overlap::Allow,
                in_flight.clone(),
                max_in_flight.clone(),
            ),
        ],
    )
    .await;
    wait_until(
        "skipped ticks",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            let states = ledger(&pool, "skipper").await;
            (states.iter().filter(|s| s.1 == "skipped").count() >= 2).then_some(())
        },
    )
    .await
    .unwrap();
    let skipper = runs(&pool, "skipper").await;
    let ledger = ledger(&pool, "skipper").await;
    let ran: Vec<_> = ledger.iter().filter(|s| s.1 != "skipped").collect();
    assert_eq!(
        skipper.len(),
        ran.len(),
        "skipped ticks did not run: {ledger:?}"
    );
    assert!(
        max_in_flight.load(Ordering::SeqCst) >= 2,
        "overlap = allow runs ticks alongside"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_timeouts_and_panics_are_recorded_and_the_cron_keeps_going() {
    let (db, pool) = setup().await;
    let every = || Schedule::parse("* * * * * *").unwrap();
    let node = cron_node(
        db.url(),
        "a",
        vec![
            CronJob::new("fails", every(), |_ctx: CronContext| async {
                Err::<(), _>(CronError::msg("disk full"))
            })
            .overlap(Overlap::Allow),
            CronJob::new("hangs", every(), |ctx: CronContext| async move {
                ctx.cancelled().await
            })
            .timeout(Duration::from_millis(200))
            .overlap(Overlap::Allow),
            CronJob::new("panics", every(), |_ctx: CronContext| async {
                if Utc::now().timestamp() > 0 {
                    panic!("boom");
                }
            })
            // A panic's backtrace (RUST_BACKTRACE in CI) or a slow outcome write on a loaded
            // machine can outlast the second to the next tick: with overlap = skip that tick
            // would be recorded as skipped, which is not what this test is about.
            .overlap(Overlap::Allow),
        ],
    )
    .await;
    let outcomes = wait_until("two recorded outcomes of each cron", Duration::from_secs(15), Duration::from_millis(50), || async {
        let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
            "SELECT cron, state, error FROM forge.cron_ticks WHERE state <> 'running' ORDER BY cron, scheduled_at",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let count = |cron: &str| rows.iter().filter(|r| r.0 == cron).count();
        (count("fails") >= 2 && count("hangs") >= 2 && count("panics") >= 2).then_some(rows)
    })
    .await
    .unwrap();
    for (cron, state, error) in &outcomes {
        let error = error.as_deref().unwrap_or_default();
        match cron.as_str() {
            "fails" => assert_eq!((state.as_str(), error), ("failed", "disk full")),
            "hangs" => assert!(
                state == "timed_out" && error.contains("timeout"),
                "{state} {error}"
            ),
            "panics" => assert_eq!((state.as_str(), error), ("failed", "panicked: boom")),
            other => panic!("unexpected cron {other}"),
        }
    }
    let text = node.render_metrics();
    assert!(
        text.contains(
            "forge_cron_runs_total{cron=\"hangs\",role=\"scheduler\",outcome=\"timed_out\"}"
        ),
        "{text}"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_runs_on_the_leader_of_its_own_role() {
    let (db, pool) = setup().await;
    let reports = Role::new("reports").unwrap();
    let cron = || recording("report", "* * * * * *").role(reports.clone());
    // a leads the scheduler only; b and c campaign for reports.
    let a = cron_node(db.url(), "a", vec![recording("other", "0 0 1 1 *")]).await;
    wait_single_leader_of(std::slice::from_ref(&a), &Role::SCHEDULER).await;
    let b = cron_node(db.url(), "b", vec![cron()]).await;
    let c = cron_node(db.url(), "c", vec![cron()]).await;
    let (leader, _) = wait_single_leader_of(&[b.clone(), c.clone()], &reports).await;
    let runs = wait_runs(&pool, "report", 2, SOON).await;
    let leader_id = ["b", "c"][leader];
    assert!(runs.iter().all(|r| r.2 == leader_id), "{runs:?}");
    assert!(
        a.role_state(&reports).is_none(),
        "a never campaigns for a role it has no cron for"
    );
    assert!(matches!(
        a.role_state(&Role::SCHEDULER),
        Some(RoleState::Leader { .. })
    ));
    for node in [&a, &b, &c] {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_missing_a_cron_the_cluster_knows_says_so() {
    let (db, _pool) = setup().await;
    // A newer node registers two crons; it is not the leader.
    let old = cron_node(db.url(), "old", vec![recording("kept", "0 0 1 1 *")]).await;
    wait_single_leader_of(std::slice::from_ref(&old), &Role::SCHEDULER).await;
    let new = cron_node(
        db.url(),
        "new",
        vec![
            recording("kept", "0 0 1 1 *"),
            recording("added", "0 0 1 1 *"),
        ],
    )
    .await;
    // The new node's crons reach forge.crons; then the old node takes a new tenure.
    wait_until(
        "the new cron to be registered",
        SOON,
        Duration::from_millis(20),
        || async {
            let known: Option<String> =
                sqlx::query_scalar("SELECT last_seen_by FROM forge.crons WHERE name = 'added'")
                    .fetch_optional(&_pool)
                    .await
                    .unwrap();
            known.map(|_| ())
        },
    )
    .await
    .unwrap();
    new.shutdown().await;
    let _ = sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'forge:scheduler:old'",
    )
    .execute(&_pool)
    .await
    .unwrap();
    wait_until(
        "the old leader to report the unknown cron",
        SOON,
        Duration::from_millis(20),
        || async {
            old.render_metrics()
                .contains("forge_cron_unknown_crons{role=\"scheduler\"} 1")
                .then_some(())
        },
    )
    .await
    .unwrap();
    old.shutdown().await;
}
