//! Crons when clocks disagree. The database's clock decides when a tick is due:
//!
//! * a leader whose wall clock is wrong by minutes - a probe node process under libfaketime (its
//!   wall clock skewed, its monotonic clock true) - loses no tick at the start of its tenure,
//!   fires each tick at its instant by the database's clock, and its handler sees that clock's
//!   time, whatever the node's own clock says;
//! * when the database's clock steps forward during a tenure, the ticks it stepped over follow
//!   the catch-up policy, and the next ticks fire on time by the new clock.
//!
//! libfaketime is Debian's package `libfaketime`: in CI (`CI=true` or `FORGE_REQUIRE_TOOLS`) a
//! missing one fails the tests that need it; elsewhere they check nothing and say so on stderr.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use forge::crons::{CatchUp, CronJob};
use forge::{CronContext, CronError, Node, Schedule};
use forge_testkit::wait_until;
use forge_tests::probe::ProbeLine;
use sqlx::PgPool;

use crate::support::*;

/// How late after its instant (by the database's clock) a tick's handler may write its row and
/// still be on time here: the skews under test are 5 minutes.
const ON_TIME: TimeDelta = TimeDelta::seconds(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_five_minutes_ahead_loses_no_per_second_tick_under_skip() {
    leads_by_the_databases_clock("+5m", "* * * * * *", "skip", 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_five_minutes_ahead_loses_no_per_minute_tick_under_latest() {
    leads_by_the_databases_clock("+5m", "* * * * *", "latest", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_five_minutes_behind_fires_per_second_ticks_on_time() {
    leads_by_the_databases_clock("-5m", "* * * * * *", "latest", 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_five_minutes_behind_fires_per_minute_ticks_on_time() {
    leads_by_the_databases_clock("-5m", "* * * * *", "skip", 1).await;
}

/// Starts a probe node whose wall clock is off by `skew` (libfaketime's `FAKETIME`), leading
/// the scheduler with the cron `probe_tick` (`expression`, `catch_up`), waits for `ticks` of its
/// ticks after its tenure began, and checks that every tick from the tenure's start ran once, on
/// time by the database's clock, and that the handler saw the database's time.
async fn leads_by_the_databases_clock(skew: &str, expression: &str, catch_up: &str, ticks: usize) {
    let Some(library) = libfaketime() else {
        tools_present(
            &[("libfaketime.so.1", "libfaketime")],
            "the tests of crons led by a skewed node clock",
        );
        return;
    };
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    let dir = ScratchDir::new("skew");
    let env = [
        ("LD_PRELOAD", library.display().to_string()),
        ("FAKETIME", skew.to_owned()),
        // tokio's timers run on the monotonic clock: it stays true.
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ("FORGE_PROBE_CATCH_UP", catch_up.to_owned()),
    ];
    let probe = Probe::spawn(
        &db,
        &dir.0,
        "skewed",
        &["scheduler"],
        Some(expression),
        &env,
    )
    .await;
    assert_skewed(&pool, &probe, skew).await;
    let began: DateTime<Utc> = wait_until(
        "the skewed node to lead the scheduler",
        SOON,
        Duration::from_millis(10),
        || async {
            sqlx::query_scalar(
                "SELECT acquired_at FROM forge.leaders
                  WHERE role = 'scheduler' AND node_id = 'skewed' AND released_at IS NULL",
            )
            .fetch_optional(&pool)
            .await
            .unwrap()
        },
    )
    .await
    .unwrap();
    let schedule = Schedule::parse(expression).unwrap();
    let first = schedule.next_after(began).unwrap();
    // The wait: until the `ticks`-th tick after the tenure's start, plus slack for a loaded
    // machine (a tick lost or 5 minutes late never comes within it).
    let last = schedule.ticks_after(began).nth(ticks - 1).unwrap();
    let runs = wait_until(
        &format!(
            "{ticks} ticks of `{expression}` (catch_up = {catch_up}) from {first} to {last} run by a node {skew} off"
        ),
        (last - began).to_std().unwrap() + SOON,
        Duration::from_millis(20),
        || async {
            let runs = runs_since(&pool, began).await;
            (runs.len() >= ticks).then_some(runs)
        },
    )
    .await
    .unwrap();
    let newest = runs.last().unwrap().scheduled_at;
    let due: Vec<DateTime<Utc>> = schedule.ticks_between(began, newest).collect();
    let ran: Vec<DateTime<Utc>> = runs.iter().map(|run| run.scheduled_at).collect();
    assert_eq!(
        ran, due,
        "every tick since the tenure began ({began}) runs once"
    );
    for run in &runs {
        let late = run.written_at - run.scheduled_at;
        assert!(
            late >= TimeDelta::zero() && late <= ON_TIME,
            "the tick at {} ran {} ms after its instant by the database's clock: {runs:#?}",
            run.scheduled_at,
            late.num_milliseconds()
        );
        let seen = (run.fired_at - run.written_at).abs();
        assert!(
            seen <= ON_TIME,
            "the handler saw fired_at {} for a run the database recorded at {}: {runs:#?}",
            run.fired_at,
            run.written_at
        );
        assert_eq!(run.attempt, 1, "{runs:#?}");
    }
    let missed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM forge.cron_ticks WHERE cron = 'probe_tick' AND scheduled_at > $1
            AND state <> 'succeeded'",
    )
    .bind(began)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(missed, 0, "ticks since the tenure began not succeeded");
}

/// Checks that the probe's wall clock really is off by `skew` (its `READY` line carries its
/// time): otherwise these tests would prove nothing.
async fn assert_skewed(pool: &PgPool, probe: &Probe, skew: &str) {
    let database: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .unwrap();
    let ready = probe
        .lines()
        .into_iter()
        .find(|line| line.event == "READY")
        .map(|line: ProbeLine| DateTime::from_timestamp_micros(line.t).unwrap())
        .expect("a READY line");
    let minutes: i64 = skew.trim_end_matches('m').parse().unwrap();
    let off = ready - database - TimeDelta::minutes(minutes);
    assert!(
        off.abs() < TimeDelta::seconds(30),
        "the probe under FAKETIME={skew} said READY at {ready}, the database's clock read {database}"
    );
}

/// A run of `probe_tick` as the probe recorded it.
#[derive(Debug)]
struct Run {
    scheduled_at: DateTime<Utc>,
    attempt: i32,
    /// What the handler saw as `ctx.fired_at()`.
    fired_at: DateTime<Utc>,
    /// The database's clock when the handler wrote the row.
    written_at: DateTime<Utc>,
}

/// The runs of ticks after `since`, by instant.
async fn runs_since(pool: &PgPool, since: DateTime<Utc>) -> Vec<Run> {
    use sqlx::Row;
    sqlx::query(
        "SELECT scheduled_at, attempt, fired_at, at FROM forge_probe_ticks
          WHERE scheduled_at > $1 ORDER BY scheduled_at, attempt",
    )
    .bind(since)
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|row| Run {
        scheduled_at: row.get("scheduled_at"),
        attempt: row.get("attempt"),
        fired_at: row.get("fired_at"),
        written_at: row.get("at"),
    })
    .collect()
}

/// Debian's libfaketime preload library (`/usr/lib/<multiarch>/faketime/libfaketime.so.1`), or
/// one under `/usr/lib/faketime` or `/usr/local/lib/faketime`.
fn libfaketime() -> Option<PathBuf> {
    let multiarch = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("faketime"));
    multiarch
        .chain(["/usr/lib/faketime".into(), "/usr/local/lib/faketime".into()])
        .map(|dir| dir.join("libfaketime.so.1"))
        .find(|library| library.is_file())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_a_forward_step_of_the_databases_clock_steps_over_follow_catch_up() {
    let db = fresh_db().await;
    let pool = db.pool().await.unwrap();
    // This host's clock cannot be stepped, so the database's clock is, for the node's sessions
    // only: their search_path finds `skewed.clock_timestamp()`, pg_catalog's plus
    // `skewed.step`, before pg_catalog's (FORGE's functions call `clock_timestamp()`).
    sqlx::raw_sql(
        "CREATE SCHEMA skewed;
         CREATE TABLE skewed.step (ahead interval NOT NULL);
         INSERT INTO skewed.step VALUES (interval '0');
         CREATE FUNCTION skewed.clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE
           AS $$ SELECT pg_catalog.clock_timestamp() + (SELECT ahead FROM skewed.step) $$;
         CREATE TABLE stepped_runs (scheduled_at timestamptz NOT NULL, at timestamptz NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let separator = if db.url().contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{separator}options[search_path]=skewed,pg_catalog,public",
        db.url()
    );
    let cron = CronJob::new(
        "stepped",
        Schedule::parse("* * * * * *").unwrap(),
        record_stepped,
    )
    .catch_up(CatchUp::Skip);
    let node = Node::builder(config(&url, "a"))
        .auto_register(false)
        .cron(cron)
        .start()
        .await
        .expect("node starts");
    wait_stepped_runs(&pool, DateTime::UNIX_EPOCH, 2).await;
    let (before, after): (DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
        "UPDATE skewed.step SET ahead = interval '5 minutes'
         RETURNING pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp() + ahead",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let runs = wait_stepped_runs(&pool, after + TimeDelta::seconds(1), 3).await;
    for (scheduled_at, at) in &runs {
        let late = *at - *scheduled_at;
        assert!(
            late >= TimeDelta::zero() && late <= ON_TIME,
            "after the step, the tick at {scheduled_at} ran {} ms after its instant by the new clock: {runs:?}",
            late.num_milliseconds()
        );
    }
    // Under catch_up = "skip", the ticks stepped over are missed but for those within
    // misfire_threshold (1 s) of the new time: none is claimed, none runs.
    let stepped_over: Vec<(DateTime<Utc>, String)> = sqlx::query_as(
        "SELECT scheduled_at, state FROM forge.cron_ticks
          WHERE cron = 'stepped' AND scheduled_at > $1 AND scheduled_at < $2 ORDER BY 1",
    )
    .bind(before + TimeDelta::seconds(3))
    .bind(after - TimeDelta::seconds(3))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        stepped_over.is_empty(),
        "{} ticks stepped over were claimed (catch_up = skip): {:?}",
        stepped_over.len(),
        &stepped_over[..stepped_over.len().min(5)]
    );
    node.shutdown().await;
}

/// Records a run of `stepped` with the node's (stepped) database clock.
async fn record_stepped(ctx: CronContext) -> Result<(), CronError> {
    sqlx::query("INSERT INTO stepped_runs VALUES ($1, skewed.clock_timestamp())")
        .bind(ctx.scheduled_at())
        .execute(ctx.pool())
        .await?;
    Ok(())
}

/// Waits for `at_least` runs of `stepped` with ticks after `since`: (scheduled_at, at).
async fn wait_stepped_runs(
    pool: &PgPool,
    since: DateTime<Utc>,
    at_least: usize,
) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    wait_until(
        &format!("{at_least} runs of `stepped` after {since}"),
        SOON,
        Duration::from_millis(20),
        || async {
            let runs: Vec<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
                "SELECT scheduled_at, at FROM stepped_runs WHERE scheduled_at > $1 ORDER BY 1",
            )
            .bind(since)
            .fetch_all(pool)
            .await
            .unwrap();
            (runs.len() >= at_least).then_some(runs)
        },
    )
    .await
    .unwrap()
}
