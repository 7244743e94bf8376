//! The guide's "Testing", "Testing your own handlers": a user's tests of a job and of a cron,
//! compiled and run by the test command (`forge` with its `testing` feature, a dev-dependency).

#[forge::job]
async fn send_receipt(ctx: forge::JobContext, order: i64) -> Result<(), forge::JobError> {
    let mut tx = ctx.pool().begin().await?;
    ctx.jobs().enqueue_in(&mut *tx, notify_shop, order).await?;
    ctx.complete(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

#[forge::job]
async fn notify_shop(_ctx: forge::JobContext, _order: i64) -> Result<(), forge::JobError> {
    Ok(())
}

#[forge::cron("0 3 * * *", name = "nightly_receipts")]
async fn nightly(ctx: forge::CronContext) -> Result<(), forge::CronError> {
    let mut tx = ctx.fenced_transaction().await?;
    ctx.jobs().enqueue_in(&mut *tx, notify_shop, 0).await?;
    ctx.complete(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_receipt_notifies_the_shop() {
    let db = forge::testing::database().await.unwrap();
    let run = forge::testing::run_job(db.pool(), send_receipt, 7)
        .await
        .unwrap();
    assert!(run.result.is_ok());
    assert_eq!(run.state, forge::jobs::JobState::Completed);
    forge::testing::assert_enqueued(db.pool(), "notify_shop", 7).await;
    forge::testing::assert_not_enqueued(db.pool(), "notify_shop", 8).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_nightly_cron_notifies_the_shop_in_its_tick() {
    let db = forge::testing::database().await.unwrap();
    let run = forge::testing::run_cron(&db, nightly).await.unwrap();
    assert_eq!(run.state, forge::crons::TickState::Succeeded);
    forge::testing::assert_enqueued(db.pool(), "notify_shop", 0).await;
}

#[test]
fn after_a_night_without_leader_the_cron_runs_once() {
    use chrono::TimeZone as _;
    let day = |d: u32, h: u32| chrono::Utc.with_ymd_and_hms(2026, 5, d, h, 0, 0).unwrap();
    let mut clock = forge::testing::CronClock::new(&nightly, day(1, 12)).unwrap();
    // No leader for three days: the latest missed tick runs once (catch_up = "latest").
    let ticks = clock.leaderless_until(day(4, 12));
    assert_eq!(ticks, [day(4, 3)]);
}
