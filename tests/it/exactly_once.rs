//! The exactly-once promise at its edges: effects committed with the tick or the job are never
//! repeated (a leader dying after the commit, a lost reply), catch-up never drops a tick, and
//! the cron runtime survives failed claims, failed outcomes, refused fences and a clock that
//! runs ahead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Timelike, Utc};
use forge::crons::{CatchUp, CronJob, Overlap};
use forge::{CronContext, CronError, Node, Role, Schedule};
use forge_testkit::{PgProxy, PgServer, TestDatabase, wait_until};
use sqlx::PgPool;
use tokio::sync::Notify;

use crate::support::*;

pub(crate) const EFFECTS_TABLE: &str = "CREATE TABLE tick_effects (
    cron         text        NOT NULL,
    scheduled_at timestamptz NOT NULL,
    attempt      integer     NOT NULL,
    node         text        NOT NULL,
    epoch        bigint      NOT NULL,
    at           timestamptz NOT NULL DEFAULT clock_timestamp()
)";

/// A fresh database with FORGE's schema and `tick_effects` (no unique key: a repeated effect
/// is a second row).
pub(crate) async fn setup() -> (TestDatabase, PgPool) {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    sqlx::query(EFFECTS_TABLE).execute(&pool).await.unwrap();
    let migrator = Node::builder(config(db.url(), "migrator"))
        .auto_register(false)
        .start()
        .await
        .unwrap();
    migrator.shutdown().await;
    (db, pool)
}

/// Writes the run's effect; with `complete`, completes the tick in the same transaction.
async fn write_effect(ctx: &CronContext, complete: bool) -> Result<(), CronError> {
    let mut tx = ctx.fenced_transaction().await?;
    write_effect_in(ctx, &mut tx).await?;
    if complete {
        ctx.complete(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Writes the run's effect row in `tx`.
async fn write_effect_in(
    ctx: &CronContext,
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
) -> Result<(), CronError> {
    sqlx::query(
        "INSERT INTO tick_effects (cron, scheduled_at, attempt, node, epoch) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(ctx.name())
    .bind(ctx.scheduled_at())
    .bind(ctx.attempt() as i32)
    .bind(ctx.node_id())
    .bind(ctx.epoch())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A per-second cron writing effects (completing its tick in the effect's transaction or
/// not). With `hang`, the first run on this node commits and then never returns, so that the
/// node can lose its leadership between the commit and the recorded outcome.
pub(crate) fn effect_cron(name: &str, complete: bool, hang: Option<Arc<Notify>>) -> CronJob {
    let hung = Arc::new(AtomicBool::new(false));
    CronJob::new(
        name,
        Schedule::parse("* * * * * *").unwrap(),
        move |ctx: CronContext| {
            let hang = hang.clone();
            let hung = hung.clone();
            async move {
                write_effect(&ctx, complete).await?;
                if let Some(hang) = hang
                    && !hung.swap(true, Ordering::SeqCst)
                {
                    hang.notify_one();
                    std::future::pending::<()>().await;
                }
                Ok::<_, CronError>(())
            }
        },
    )
    .catch_up(CatchUp::All)
}

/// The tests' election timings, with a lease long enough that a loaded test machine does not
/// lose a leadership (these tests check what happens within one tenure).
pub(crate) fn steady_config(url: &str, id: &str) -> forge::Config {
    let mut config = config(url, id);
    config.node.roles = Some(vec!["scheduler".into()]);
    let election = &mut config.cluster.leader_election;
    election.lease_duration = Duration::from_secs(6);
    election.refresh_interval = Duration::from_secs(1);
    config
}

async fn node_with(url: &str, id: &str, crons: Vec<CronJob>) -> Node {
    let config = steady_config(url, id);
    let mut builder = Node::builder(config).auto_register(false);
    for cron in crons {
        builder = builder.cron(cron);
    }
    builder.start().await.expect("node starts")
}

/// (scheduled_at, rows) of ticks of `cron` with more than one effect row.
async fn repeated(pool: &PgPool, cron: &str) -> Vec<(DateTime<Utc>, i64)> {
    sqlx::query_as(
        "SELECT scheduled_at, count(*) FROM tick_effects WHERE cron = $1
          GROUP BY scheduled_at HAVING count(*) > 1 ORDER BY 1",
    )
    .bind(cron)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Terminates `from`'s lock session of the scheduler role until `to` leads: `from` loses the
/// leadership at once. (Terminated again while `to` is not leading, in case `from` was
/// reconnecting when first cut, under load.)
pub(crate) async fn depose(pool: &PgPool, from: &str, to: &str) -> i64 {
    wait_until(
        &format!("{to} to lead the scheduler role after {from}'s lock session is cut"),
        SOON,
        Duration::from_millis(10),
        || async {
            sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1")
                .bind(format!("forge:scheduler:{from}"))
                .execute(pool)
                .await
                .unwrap();
            let row: Option<(String, i64)> = sqlx::query_as(
                "SELECT node_id, epoch FROM forge.leaders WHERE role = 'scheduler' AND released_at IS NULL",
            )
            .fetch_optional(pool)
            .await
            .unwrap();
            row.filter(|(leader, _)| leader == to).map(|(_, epoch)| epoch)
        },
    )
    .await
    .unwrap()
}

/// Waits until `node` leads the scheduler role.
pub(crate) async fn wait_leads(pool: &PgPool, node: &str) -> i64 {
    wait_until(
        &format!("{node} to lead the scheduler role"),
        SOON,
        Duration::from_millis(10),
        || async {
            let row: Option<(String, i64)> = sqlx::query_as(
                "SELECT node_id, epoch FROM forge.leaders WHERE role = 'scheduler' AND released_at IS NULL",
            )
            .fetch_optional(pool)
            .await
            .unwrap();
            row.filter(|(leader, _)| leader == node).map(|(_, epoch)| epoch)
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_completed_in_its_transaction_is_not_rerun_after_its_leader_dies() {
    let (db, pool) = setup().await;
    // On node a, the first run of each cron commits its effect and hangs: the leader's
    // outcome is never recorded. One cron completes its tick in that commit, one does not.
    let completed_hung = Arc::new(Notify::new());
    let plain_hung = Arc::new(Notify::new());
    let a = node_with(
        db.url(),
        "a",
        vec![
            effect_cron("completed", true, Some(completed_hung.clone())),
            effect_cron("plain", false, Some(plain_hung.clone())),
        ],
    )
    .await;
    wait_leads(&pool, "a").await;
    tokio::time::timeout(SOON, completed_hung.notified())
        .await
        .unwrap();
    tokio::time::timeout(SOON, plain_hung.notified())
        .await
        .unwrap();
    let b = node_with(
        db.url(),
        "b",
        vec![
            effect_cron("completed", true, None),
            effect_cron("plain", false, None),
        ],
    )
    .await;
    // a dies between its commits and its outcomes: its lock session ends, b takes over.
    depose(&pool, "a", "b").await;

    // The plain cron's interrupted tick is run again by b: its effect happens twice (at
    // least once: why effects belong in the tick's transaction).
    let twice = wait_until(
        "b to rerun the plain cron's interrupted tick",
        SOON,
        Duration::from_millis(20),
        || async {
            let twice = repeated(&pool, "plain").await;
            (!twice.is_empty()).then_some(twice)
        },
    )
    .await
    .unwrap();
    assert_eq!(twice.len(), 1, "{twice:?}");
    // The completed cron's tick was done in the same commit as its effect: b does not run
    // it again, and its outcome is `succeeded`, attempt 1.
    let (hung_tick, state, attempt): (DateTime<Utc>, String, i32) = sqlx::query_as(
        "SELECT t.scheduled_at, t.state, t.attempt FROM forge.cron_ticks t
          WHERE t.cron = 'completed' AND t.node_id = 'a' ORDER BY t.scheduled_at LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((state.as_str(), attempt), ("succeeded", 1));
    // b has been running later ticks meanwhile.
    wait_until(
        "b to run ticks of the completed cron",
        SOON,
        Duration::from_millis(20),
        || async {
            let by_b: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM tick_effects WHERE cron = 'completed' AND node = 'b'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (by_b >= 2).then_some(())
        },
    )
    .await
    .unwrap();
    assert_eq!(repeated(&pool, "completed").await, [], "no effect twice");
    let effects: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tick_effects WHERE cron = 'completed' AND scheduled_at = $1",
    )
    .bind(hung_tick)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(effects, 1);
    b.shutdown().await;
    a.shutdown().await;
}

/// A deferred constraint trigger that makes every COMMIT touching `table` sleep while the flag
/// row is set: the reply to a commit can then be lost by killing the client meanwhile.
async fn slow_commits(pool: &PgPool, table: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE slow_commit (on_ boolean NOT NULL);
         INSERT INTO slow_commit VALUES (false);
         CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF (SELECT on_ FROM public.slow_commit) THEN PERFORM pg_sleep(1.5); END IF;
             RETURN NULL;
         END $$;
         CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON {table}
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.slow_commit();"
    )))
    .execute(pool)
    .await
    .unwrap();
}

async fn set_slow(pool: &PgPool, on: bool) {
    sqlx::query("UPDATE public.slow_commit SET on_ = $1")
        .bind(on)
        .execute(pool)
        .await
        .unwrap();
}

/// The pid of a backend of `application_prefix` sleeping in a slow commit.
async fn wait_committing(pool: &PgPool, application_prefix: &str) -> i32 {
    wait_until(
        "a commit to be in progress",
        SOON,
        Duration::from_millis(5),
        || async {
            sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name LIKE $1 || '%' AND wait_event = 'PgSleep' LIMIT 1",
            )
            .bind(application_prefix)
            .fetch_optional(pool)
            .await
            .unwrap()
        },
    )
    .await
    .unwrap()
}

async fn wait_backend_gone(pool: &PgPool, pid: i32) {
    wait_until(
        "the committing backend to finish",
        SOON,
        Duration::from_millis(10),
        || async {
            let alive: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                    .bind(pid)
                    .fetch_one(pool)
                    .await
                    .unwrap();
            (!alive).then_some(())
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_whose_commit_reply_was_lost_when_its_leader_was_killed_runs_once() {
    // The probe nodes' cron completes its tick in the transaction of its effect row.
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    sqlx::raw_sql(forge_tests::probe::PROBE_TABLE_SQL)
        .execute(&pool)
        .await
        .unwrap();
    slow_commits(&pool, "forge_probe_ticks").await;
    let dir = ScratchDir::new("lost-reply");
    let mut probes = Vec::new();
    for id in ["p1", "p2", "p3"] {
        probes.push(Probe::start_with_cron(&db, &dir.0, id, &["scheduler"], "* * * * * *").await);
    }
    wait_until("ticks", SOON, Duration::from_millis(20), || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM forge_probe_ticks")
            .fetch_one(&pool)
            .await
            .unwrap();
        (n >= 2).then_some(())
    })
    .await
    .unwrap();
    // Commits now take 1.5 s; kill the leader while its commit is in progress: the server
    // commits, the client never hears it.
    set_slow(&pool, true).await;
    let pid = wait_committing(&pool, "forge:pool:").await;
    let leader: String = sqlx::query_scalar(
        "SELECT node_id FROM forge.leaders WHERE role = 'scheduler' AND released_at IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let victim = probes.iter_mut().find(|p| p.id == leader).unwrap();
    victim.process.kill().unwrap();
    wait_backend_gone(&pool, pid).await;
    set_slow(&pool, false).await;
    // The next leader runs on; the tick whose reply was lost is done, not run again.
    let lost: (DateTime<Utc>, String, i32) = sqlx::query_as(
        "SELECT scheduled_at, state, attempt FROM forge.cron_ticks
          WHERE node_id = $1 ORDER BY scheduled_at DESC LIMIT 1",
    )
    .bind(&leader)
    .fetch_one(&pool)
    .await
    .unwrap();
    wait_until(
        "the next leader to run later ticks",
        SOON,
        Duration::from_millis(20),
        || async {
            let later: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM forge_probe_ticks WHERE scheduled_at > $1 + interval '2 s'",
            )
            .bind(lost.0)
            .fetch_one(&pool)
            .await
            .unwrap();
            (later >= 1).then_some(())
        },
    )
    .await
    .unwrap();
    let runs: i64 =
        sqlx::query_scalar("SELECT count(*) FROM forge_probe_ticks WHERE scheduled_at = $1")
            .bind(lost.0)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (lost.1.as_str(), lost.2, runs),
        ("succeeded", 1, 1),
        "{lost:?}"
    );
    let twice: Vec<(DateTime<Utc>,)> =
        sqlx::query_as("SELECT scheduled_at FROM forge_probe_ticks GROUP BY 1 HAVING count(*) > 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(twice, [], "no tick's effect twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_all_runs_the_backlog_and_every_tick_due_meanwhile_once() {
    let (db, pool) = setup().await;
    // A frontier 6 s back: 6 missed ticks, each run taking 400 ms, so that 2-3 live ticks come
    // due while the backlog runs. None may be skipped as an "overlap".
    let frontier = Utc::now()
        .with_nanosecond(0)
        .and_then(|t| t.checked_sub_signed(TimeDelta::seconds(6)))
        .unwrap();
    sqlx::query(
        "INSERT INTO forge.crons (namespace, name, role, expression, timezone, last_seen_by, first_seen_at)
         VALUES ('forge', 'slow', 'scheduler', '* * * * * *', 'UTC', 'gone', $1 - interval '1 h')",
    )
    .bind(frontier)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO forge.cron_ticks (namespace, cron, scheduled_at, role, epoch, tenure, node_id, state, finished_at)
         VALUES ('forge', 'slow', $1, 'scheduler', 0, 0, 'gone', 'succeeded', $1)",
    )
    .bind(frontier)
    .execute(&pool)
    .await
    .unwrap();
    let slow = CronJob::new(
        "slow",
        Schedule::parse("* * * * * *").unwrap(),
        |ctx: CronContext| async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            write_effect(&ctx, true).await
        },
    )
    .catch_up(CatchUp::All)
    .overlap(Overlap::Skip);
    let node = node_with(db.url(), "a", vec![slow]).await;
    let until = Utc::now() + TimeDelta::seconds(3);
    let ticks: Vec<DateTime<Utc>> = wait_until(
        "the backlog and the live ticks to run",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            let ticks: Vec<DateTime<Utc>> = sqlx::query_scalar(
                "SELECT scheduled_at FROM tick_effects WHERE cron = 'slow' ORDER BY 1",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            ticks.last().is_some_and(|t| *t >= until).then_some(ticks)
        },
    )
    .await
    .unwrap();
    node.shutdown().await;
    let skipped: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.cron_ticks WHERE cron = 'slow' AND state = 'skipped'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(skipped, 0, "no tick skipped");
    assert_eq!(ticks[0], frontier + TimeDelta::seconds(1), "{ticks:?}");
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            TimeDelta::seconds(1),
            "a tick missing or twice: {ticks:?}"
        );
    }
}

/// Makes statements on `forge.cron_ticks` fail while the flag row is set: `insert` for claims,
/// else for outcomes.
async fn failing_ledger(pool: &PgPool, insert: bool) {
    let (event, condition) = if insert {
        ("INSERT", "true")
    } else {
        ("UPDATE", "NEW.state <> 'running'")
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE ledger_fault (on_ boolean NOT NULL);
         INSERT INTO ledger_fault VALUES (false);
         CREATE FUNCTION ledger_fault() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF (SELECT on_ FROM public.ledger_fault) AND {condition} THEN
                 RAISE EXCEPTION 'injected ledger fault';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER ledger_fault BEFORE {event} ON forge.cron_ticks
             FOR EACH ROW EXECUTE FUNCTION public.ledger_fault();"
    )))
    .execute(pool)
    .await
    .unwrap();
}

async fn set_fault(pool: &PgPool, on: bool) {
    sqlx::query("UPDATE ledger_fault SET on_ = $1")
        .bind(on)
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_that_fail_to_record_are_retried_within_the_tenure() {
    let (db, pool) = setup().await;
    failing_ledger(&pool, false).await;
    // The effect does not complete the tick: only the runtime's outcome marks it done.
    let node = node_with(db.url(), "a", vec![effect_cron("recorded", false, None)]).await;
    let epoch = wait_leads(&pool, "a").await;
    set_fault(&pool, true).await;
    // A run whose outcome has been failing for over a second (its retries keep the run
    // going, so the ticks after it are skipped as overlaps meanwhile).
    wait_until(
        "a tick whose outcome keeps failing",
        SOON,
        Duration::from_millis(20),
        || async {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM tick_effects e JOIN forge.cron_ticks t
                 ON t.cron = e.cron AND t.scheduled_at = e.scheduled_at
              WHERE e.cron = 'recorded' AND t.state = 'running'
                AND e.at < clock_timestamp() - interval '1200 ms'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (n >= 1).then_some(())
        },
    )
    .await
    .unwrap();
    set_fault(&pool, false).await;
    // Without a new leader, every run's outcome lands.
    wait_until(
        "every outcome to be recorded",
        SOON,
        Duration::from_millis(20),
        || async {
            let running: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM tick_effects e JOIN forge.cron_ticks t
                 ON t.cron = e.cron AND t.scheduled_at = e.scheduled_at
              WHERE e.cron = 'recorded' AND t.state <> 'succeeded'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (running == 0).then_some(())
        },
    )
    .await
    .unwrap();
    assert_eq!(wait_leads(&pool, "a").await, epoch, "the same tenure");
    assert_eq!(repeated(&pool, "recorded").await, []);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_whose_claims_fail_are_claimed_again_and_none_is_lost() {
    let (db, pool) = setup().await;
    failing_ledger(&pool, true).await;
    let node = node_with(db.url(), "a", vec![effect_cron("claimed", true, None)]).await;
    let epoch = wait_leads(&pool, "a").await;
    wait_until("a first run", SOON, Duration::from_millis(20), || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tick_effects")
            .fetch_one(&pool)
            .await
            .unwrap();
        (n >= 1).then_some(())
    })
    .await
    .unwrap();
    // Claims fail for 2.5 s (two or three ticks), then work again.
    set_fault(&pool, true).await;
    let runs = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM tick_effects")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let before = runs(pool.clone()).await;
    let fault_ends = tokio::time::Instant::now() + Duration::from_millis(2500);
    wait_until(
        "claims to fail for 2.5 s",
        SOON,
        Duration::from_millis(100),
        || async {
            // At most a run whose claim committed just before the fault.
            assert!(
                runs(pool.clone()).await <= before + 1,
                "a claim succeeded during the fault"
            );
            (tokio::time::Instant::now() >= fault_ends).then_some(())
        },
    )
    .await
    .unwrap();
    set_fault(&pool, false).await;
    let after = Utc::now() + TimeDelta::seconds(2);
    let ticks: Vec<DateTime<Utc>> = wait_until(
        "runs after the fault",
        SOON,
        Duration::from_millis(20),
        || async {
            let ticks: Vec<DateTime<Utc>> =
                sqlx::query_scalar("SELECT scheduled_at FROM tick_effects ORDER BY 1")
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            ticks.last().is_some_and(|t| *t >= after).then_some(ticks)
        },
    )
    .await
    .unwrap();
    let ledger: Vec<(DateTime<Utc>, String, Option<String>)> = sqlx::query_as(
        "SELECT scheduled_at, state, coalesce(error, '') || ' claimed ' || claimed_at::time || ' finished ' || coalesce(finished_at::time::text, '-') FROM forge.cron_ticks ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            TimeDelta::seconds(1),
            "a tick missing or twice: {ticks:?}; ledger: {ledger:?}"
        );
    }
    assert_eq!(wait_leads(&pool, "a").await, epoch, "the same tenure");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_committed_with_its_reply_lost_runs_its_tick_once() {
    // The node reaches PostgreSQL through a proxy. Claims run on the scheduler's lock session;
    // that session goes silent while a claim's commit is in progress: the claim commits, the
    // node never hears it (and, its session silent, loses the leadership at its deadline).
    let server = PgServer::shared().unwrap();
    let db = server.create_database().await.unwrap();
    let pool = db.pool().await.unwrap();
    sqlx::query(EFFECTS_TABLE).execute(&pool).await.unwrap();
    let proxy = PgProxy::start(server.host(), server.port()).unwrap();
    let mut config = steady_config(&proxy.url_for(server, db.name()), "a");
    // A lease long enough that the leader's statements may take the slow commit (lease / 6).
    config.cluster.leader_election.lease_duration = Duration::from_secs(12);
    config.cluster.leader_election.refresh_interval = Duration::from_secs(2);
    let node = Node::builder(config)
        .auto_register(false)
        .cron(effect_cron("claimed", true, None))
        .start()
        .await
        .unwrap();
    let epoch = wait_leads(&pool, "a").await;
    slow_commits(&pool, "forge.cron_ticks").await;
    set_slow(&pool, true).await;
    // Only claims insert into the ledger: the lock session sleeping at commit is a claim.
    let lock_session = forge_testkit::Filter::application_prefix("forge:scheduler:a");
    let pid = wait_committing(&pool, "forge:scheduler:a").await;
    proxy.blackhole(lock_session.clone());
    proxy.heal(&lock_session);
    wait_until(
        "the silenced claim to commit",
        SOON,
        Duration::from_millis(10),
        || async {
            let sleeping: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'PgSleep')",
            )
            .bind(pid)
            .fetch_one(&pool)
            .await
            .unwrap();
            (!sleeping).then_some(())
        },
    )
    .await
    .unwrap();
    set_slow(&pool, false).await;
    let lost: DateTime<Utc> =
        sqlx::query_scalar("SELECT max(scheduled_at) FROM forge.cron_ticks WHERE epoch = $1")
            .bind(epoch)
            .fetch_one(&pool)
            .await
            .unwrap();
    // The next tenure (the node again, once the silent session is gone) finds the tick claimed
    // and never run, and runs it: once.
    wait_until(
        "the lost claim's tick to run",
        Duration::from_secs(40),
        Duration::from_millis(50),
        || async {
            let (state, effects): (String, i64) = sqlx::query_as(
                "SELECT t.state, (SELECT count(*) FROM tick_effects e WHERE e.scheduled_at = t.scheduled_at)
                   FROM forge.cron_ticks t WHERE t.cron = 'claimed' AND t.scheduled_at = $1",
            )
            .bind(lost)
            .fetch_one(&pool)
            .await
            .unwrap();
            (state == "succeeded" && effects == 1).then_some(())
        },
    )
    .await
    .unwrap();
    assert!(wait_leads(&pool, "a").await > epoch, "a new tenure ran it");
    assert_eq!(repeated(&pool, "claimed").await, [], "no effect twice");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_refused_by_the_fence_while_still_leading_is_checked_again() {
    let (db, pool) = setup().await;
    let node = node_with(db.url(), "a", vec![effect_cron("refused", true, None)]).await;
    let epoch = wait_leads(&pool, "a").await;
    wait_until("a first run", SOON, Duration::from_millis(20), || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tick_effects")
            .fetch_one(&pool)
            .await
            .unwrap();
        (n >= 1).then_some(())
    })
    .await
    .unwrap();
    // The tenure stops being current for a moment (its row says released) while the node
    // still trusts its leadership: claims are refused until it is current again.
    let mark_released = |released: bool| {
        let pool = pool.clone();
        async move {
            sqlx::query("UPDATE forge.leaders SET released_at = CASE WHEN $1 THEN clock_timestamp() END WHERE role = 'scheduler'")
                .bind(released)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    mark_released(true).await;
    wait_until(
        "claims to be refused for a second",
        SOON,
        Duration::from_millis(20),
        || async {
            let behind: bool = sqlx::query_scalar(
                "SELECT max(scheduled_at) < clock_timestamp() - interval '1 second'
               FROM forge.cron_ticks WHERE cron = 'refused'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            behind.then_some(())
        },
    )
    .await
    .unwrap();
    mark_released(false).await;
    let after = Utc::now() + TimeDelta::seconds(2);
    let ticks: Vec<DateTime<Utc>> = wait_until(
        "runs after the refusal",
        SOON,
        Duration::from_millis(20),
        || async {
            let ticks: Vec<DateTime<Utc>> =
                sqlx::query_scalar("SELECT scheduled_at FROM tick_effects ORDER BY 1")
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            ticks.last().is_some_and(|t| *t >= after).then_some(ticks)
        },
    )
    .await
    .unwrap();
    let ledger: Vec<(DateTime<Utc>, String, Option<String>)> = sqlx::query_as(
        "SELECT scheduled_at, state, coalesce(error, '') || ' claimed ' || claimed_at::time || ' finished ' || coalesce(finished_at::time::text, '-') FROM forge.cron_ticks ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            TimeDelta::seconds(1),
            "a tick missing or twice: {ticks:?}; ledger: {ledger:?}"
        );
    }
    assert_eq!(wait_leads(&pool, "a").await, epoch, "the same tenure");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_clock_runs_ahead_claims_no_future_tick() {
    let (db, pool) = setup().await;
    let node = node_with(db.url(), "a", vec![effect_cron("ahead", true, None)]).await;
    wait_leads(&pool, "a").await;
    // (The database shows the leader a moment before the node has taken up its leadership.)
    let token = wait_until(
        "a to hold its leadership",
        SOON,
        Duration::from_millis(10),
        || async { node.leadership(&Role::SCHEDULER).map(|l| l.fence_token()) },
    )
    .await
    .unwrap();
    // What a claim made by a clock 5 s ahead looks like to the database.
    let future = Utc::now() + TimeDelta::seconds(5);
    let (outcome, early_ms): (String, Option<f64>) = sqlx::query_as(
        "SELECT * FROM forge.tick_claim($1, $2, $3, $4, $5, 'ahead', $6, 'running', NULL)",
    )
    .bind(&token.namespace)
    .bind(&token.role)
    .bind(token.epoch)
    .bind(token.tenure)
    .bind("a")
    .bind(future)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(outcome, "early");
    let early_ms = early_ms.unwrap();
    assert!((4000.0..=5000.0).contains(&early_ms), "{early_ms}");
    let claimed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.cron_ticks WHERE cron = 'ahead' AND scheduled_at = $1",
    )
    .bind(future)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(claimed, 0);
    // Claiming ahead (1 s here) does not reach a tick 5 s away either.
    let (outcome, early_ms): (String, Option<f64>) = sqlx::query_as(
        "SELECT outcome, early_ms FROM forge.tick_claim_ahead_many($1, $2, $3, $4, $5,
                ARRAY['ahead'], ARRAY[$6::timestamptz], ARRAY['running'], ARRAY[NULL::text], 1000)",
    )
    .bind(&token.namespace)
    .bind(&token.role)
    .bind(token.epoch)
    .bind(token.tenure)
    .bind("a")
    .bind(future)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(outcome, "early");
    let early_ms = early_ms.unwrap();
    assert!((3000.0..=4000.0).contains(&early_ms), "{early_ms}");
    // Fenced statements commit synchronously even where the database default is off.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{}\" SET synchronous_commit = off",
        db.name()
    )))
    .execute(&pool)
    .await
    .unwrap();
    let fresh = db.pool().await.unwrap();
    let mut tx = fresh.begin().await.unwrap();
    let before: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    token.check(&mut tx).await.unwrap();
    let after: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!((before.as_str(), after.as_str()), ("off", "on"));
    tx.rollback().await.unwrap();
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_transaction_of_a_completed_run_cannot_complete_it_again() {
    let (db, pool) = setup().await;
    // Each run commits its effect with its completion, then does it all again, as a handler
    // would that retries after an error from COMMIT that had in fact committed. Completing
    // twice within one transaction stays harmless.
    let refusals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = refusals.clone();
    let cron = CronJob::new(
        "retried",
        Schedule::parse("* * * * * *").unwrap(),
        move |ctx: CronContext| {
            let seen = seen.clone();
            async move {
                // Completing twice within one transaction is harmless.
                let mut tx = ctx.fenced_transaction().await?;
                ctx.complete(&mut tx).await?;
                write_effect_in(&ctx, &mut tx).await?;
                ctx.complete(&mut tx).await?;
                tx.commit().await?;
                let again = write_effect(&ctx, true).await;
                seen.lock()
                    .unwrap()
                    .push(again.map_err(|err| err.to_string()));
                Ok::<_, CronError>(())
            }
        },
    );
    let a = node_with(db.url(), "a", vec![cron]).await;
    let tries = wait_until(
        "three runs of the retried cron",
        SOON,
        Duration::from_millis(20),
        || async {
            let tries = refusals.lock().unwrap().clone();
            (tries.len() >= 3).then_some(tries)
        },
    )
    .await
    .unwrap();
    a.shutdown().await;
    for outcome in &tries {
        let err = outcome
            .as_ref()
            .expect_err("a second completion must be refused");
        assert!(err.contains("is no longer running"), "{err}");
    }
    assert_eq!(repeated(&pool, "retried").await, [], "no effect twice");
    let (effects, succeeded): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM tick_effects),
                (SELECT count(*) FROM forge.cron_ticks WHERE cron = 'retried' AND state = 'succeeded')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(succeeded >= 3, "{succeeded} succeeded ticks");
    assert_eq!(effects, succeeded, "one effect per completed tick");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_crons_due_at_one_instant_are_claimed_together_and_each_tick_runs_once() {
    let (db, pool) = setup().await;
    // 60 per-second crons: their ticks come due together and are claimed in batches.
    let crons: Vec<CronJob> = (0..60)
        .map(|i| effect_cron(&format!("many_{i}"), true, None))
        .collect();
    let node = node_with(db.url(), "a", crons).await;
    wait_leads(&pool, "a").await;
    let start = Utc::now() + TimeDelta::seconds(1);
    let end = start + TimeDelta::seconds(3);
    let per_tick: Vec<(DateTime<Utc>, i64, i64)> = wait_until(
        "three seconds of ticks of the 60 crons",
        SOON,
        Duration::from_millis(50),
        || async {
            let rows: Vec<(DateTime<Utc>, i64, i64)> = sqlx::query_as(
                "SELECT scheduled_at, count(*), count(DISTINCT cron) FROM tick_effects
                  WHERE scheduled_at >= date_trunc('second', $1::timestamptz)
                    AND scheduled_at < date_trunc('second', $2::timestamptz)
                  GROUP BY 1 ORDER BY 1",
            )
            .bind(start)
            .bind(end)
            .fetch_all(&pool)
            .await
            .unwrap();
            (rows.len() == 3 && rows.iter().all(|r| r.1 == 60)).then_some(rows)
        },
    )
    .await
    .unwrap();
    node.shutdown().await;
    for (tick, effects, crons) in per_tick {
        assert_eq!(
            (effects, crons),
            (60, 60),
            "tick {tick}: one effect per cron"
        );
    }
    for name in ["many_0", "many_59"] {
        assert_eq!(repeated(&pool, name).await, [], "{name}: no effect twice");
    }
}
