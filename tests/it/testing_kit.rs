//! The test kit for users (`forge::testing`): a fresh database in one line, one job attempt run
//! inline with a real context (complete, enqueue, errors), assertions on what was enqueued
//! (also inside a transaction), one cron tick run on a real leader, and a cron driven by a fake
//! clock.

use chrono::{TimeZone, Utc};
use forge::crons::{CatchUp, CronJob, TickState};
use forge::jobs::JobState;
use forge::testing::{
    CronClock, assert_enqueued, assert_not_enqueued, database, run_cron, run_job,
};
use forge::{CronContext, CronError, JobContext, JobError, Schedule};
use serde_json::json;

#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Paid {
    order: i64,
    /// "ok", "fail" or "discard".
    then: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Ship {
    order: i64,
}

#[forge::job]
async fn kit_ship(_ctx: JobContext, _args: Ship) -> Result<(), JobError> {
    Ok(())
}

/// Records the payment and enqueues the shipment in one transaction that completes the job.
#[forge::job]
async fn kit_paid(ctx: JobContext, args: Paid) -> Result<(), JobError> {
    match args.then.as_str() {
        "fail" => return Err(JobError::retry("the bank is down")),
        "discard" => return Err(JobError::discard("no such order")),
        _ => {}
    }
    let mut tx = ctx.pool().begin().await?;
    forge::sqlx::query("INSERT INTO payments (order_id) VALUES ($1)")
        .bind(args.order)
        .execute(&mut *tx)
        .await?;
    ctx.jobs()
        .enqueue_in(&mut *tx, kit_ship, Ship { order: args.order })
        .await?;
    ctx.complete(&mut tx).await?;
    tx.commit().await?;
    // A second completion, in another transaction, is refused: the context is a real one.
    let mut again = ctx.pool().begin().await?;
    assert!(ctx.complete(&mut again).await.is_err());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_inline_with_a_real_context_and_what_it_enqueued_is_seen() {
    let db = database().await.unwrap();
    forge::sqlx::query("CREATE TABLE payments (order_id bigint PRIMARY KEY)")
        .execute(db.pool())
        .await
        .unwrap();
    let paid = Paid {
        order: 7,
        then: "ok".into(),
    };
    let run = run_job(db.pool(), kit_paid, paid).await.unwrap();
    assert!(run.result.is_ok(), "{:?}", run.result);
    assert_eq!(run.state, JobState::Completed);
    assert_eq!(run.enqueued.len(), 1);
    assert_eq!(
        (run.enqueued[0].kind.as_str(), &run.enqueued[0].args),
        ("kit_ship", &json!({"order": 7}))
    );
    assert_enqueued(db.pool(), "kit_ship", json!({"order": 7})).await;
    assert_not_enqueued(db.pool(), "kit_ship", json!({"order": 8})).await;
    let payments: i64 = forge::sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(payments, 1);

    let failing = Paid {
        order: 8,
        then: "fail".into(),
    };
    let run = run_job(db.pool(), kit_paid, failing).await.unwrap();
    assert_eq!(run.state, JobState::Retryable);
    assert_eq!(run.result.unwrap_err().message(), "the bank is down");
    let discarded = Paid {
        order: 9,
        then: "discard".into(),
    };
    let run = run_job(db.pool(), kit_paid, discarded).await.unwrap();
    assert_eq!(run.state, JobState::Dead);
    assert!(run.enqueued.is_empty());
}

/// Enqueues a shipment that waits for this job, then succeeds or (`then` = "discard") fails.
#[forge::job]
async fn kit_followed(ctx: JobContext, args: Paid) -> Result<(), JobError> {
    let follow_up =
        forge::jobs::NewJob::new(kit_ship, Ship { order: args.order }).after([ctx.id()]);
    ctx.jobs().enqueue_job(follow_up).await?;
    match args.then.as_str() {
        "discard" => Err(JobError::discard("no such order")),
        _ => Ok(()),
    }
}

/// An attempt run inline ends its job as a node's would: a job waiting for it becomes
/// available when it completes, and is cancelled when it ends dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_run_inline_releases_or_cancels_the_jobs_waiting_for_it() {
    let db = database().await.unwrap();
    for (then, state) in [
        ("ok", JobState::Available),
        ("discard", JobState::Cancelled),
    ] {
        let paid = Paid {
            order: 1,
            then: then.into(),
        };
        let run = run_job(db.pool(), kit_followed, paid).await.unwrap();
        assert_eq!(run.enqueued.len(), 1, "{then}");
        let waiting: String =
            forge::sqlx::query_scalar("SELECT state FROM forge.jobs WHERE id = $1")
                .bind(run.enqueued[0].id)
                .fetch_one(db.pool())
                .await
                .unwrap();
        assert_eq!(JobState::parse(&waiting), Some(state), "{then}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_enqueue_assertions_look_inside_a_transaction_and_fail_when_wrong() {
    let db = database().await.unwrap();
    let jobs = forge::jobs::Jobs::new(db.pool().clone(), &forge::LockNamespace::default());
    let mut tx = db.pool().begin().await.unwrap();
    jobs.enqueue_in(&mut *tx, kit_ship, Ship { order: 1 })
        .await
        .unwrap();
    assert_enqueued(&mut *tx, "kit_ship", json!({"order": 1})).await;
    // Not committed: not seen from outside the transaction.
    assert_not_enqueued(db.pool(), "kit_ship", json!({"order": 1})).await;
    tx.rollback().await.unwrap();
    // Each assertion fails (panics) when what it asserts is false.
    let pool = db.pool().clone();
    let missing = tokio::spawn(async move {
        assert_enqueued(&pool, "kit_ship", json!({"order": 1})).await;
    });
    let err = missing.await.unwrap_err();
    assert!(err.is_panic());
    jobs.enqueue(kit_ship, Ship { order: 2 }).await.unwrap();
    let pool = db.pool().clone();
    let present = tokio::spawn(async move {
        assert_not_enqueued(&pool, "kit_ship", json!({"order": 2})).await;
    });
    assert!(present.await.unwrap_err().is_panic());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_tick_runs_on_a_real_leader_and_enqueues_in_its_transaction() {
    let db = database().await.unwrap();
    let cron = CronJob::new(
        "kit_nightly",
        Schedule::parse("0 3 * * *").unwrap(),
        |ctx: CronContext| async move {
            let mut tx = ctx.fenced_transaction().await?;
            ctx.jobs()
                .enqueue_in(&mut *tx, kit_ship, Ship { order: 42 })
                .await?;
            ctx.complete(&mut tx).await?;
            tx.commit().await?;
            Ok::<_, CronError>(())
        },
    );
    let run = run_cron(&db, cron).await.unwrap();
    assert_eq!(run.state, TickState::Succeeded, "{:?}", run.error);
    assert_eq!(run.enqueued.len(), 1);
    assert_enqueued(db.pool(), "kit_ship", json!({"order": 42})).await;
    let failing = CronJob::new(
        "kit_failing",
        Schedule::parse("0 3 * * *").unwrap(),
        |_ctx: CronContext| async move { Err::<(), _>(CronError::msg("no route to the bank")) },
    );
    let run = run_cron(&db, failing).await.unwrap();
    assert_eq!(run.state, TickState::Failed);
    assert_eq!(run.error.as_deref(), Some("no route to the bank"));
}

#[test]
fn a_cron_clock_says_which_ticks_fire_on_time_and_after_a_gap() {
    let at = |h: u32, m: u32| Utc.with_ymd_and_hms(2026, 3, 1, h, m, 0).unwrap();
    let hourly = |catch_up| {
        CronJob::new("hourly", Schedule::parse("0 * * * *").unwrap(), |_| async {
        })
        .catch_up(catch_up)
    };
    let mut clock = CronClock::new(&hourly(CatchUp::All), at(0, 30)).unwrap();
    assert_eq!(clock.advance_to(at(2, 0)), [at(1, 0), at(2, 0)]);
    assert_eq!(
        clock.leaderless_until(at(5, 30)),
        [at(3, 0), at(4, 0), at(5, 0)]
    );
    assert_eq!(clock.now(), at(5, 30));
    let mut latest = CronClock::new(&hourly(CatchUp::Latest), at(0, 30)).unwrap();
    assert_eq!(latest.leaderless_until(at(5, 30)), [at(5, 0)]);
    let mut skip = CronClock::new(&hourly(CatchUp::Skip), at(0, 30)).unwrap();
    assert!(skip.leaderless_until(at(5, 30)).is_empty());
    // A tick at most `misfire_threshold` late still runs under "skip".
    let mut skip = CronClock::new(&hourly(CatchUp::Skip), at(0, 30)).unwrap();
    let just_late = at(5, 0) + chrono::TimeDelta::milliseconds(500);
    assert_eq!(skip.leaderless_until(just_late), [at(5, 0)]);
    // The window bounds "all".
    let windowed = hourly(CatchUp::All).catch_up_window(std::time::Duration::from_secs(7200));
    let mut clock = CronClock::new(&windowed, at(0, 30)).unwrap();
    assert_eq!(clock.leaderless_until(at(5, 30)), [at(4, 0), at(5, 0)]);
}
