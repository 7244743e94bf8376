//! Crons returning `Result` (with `?` on any `std::error::Error`, or `CronError` itself), and
//! every form of expression: 5 fields, 6 fields with seconds, and aliases.

use forge::{CronContext, CronError};

#[forge::cron("0 9 * * mon-fri")]
async fn weekdays(ctx: CronContext) -> Result<(), CronError> {
    let hours: u32 = "9".parse()?;
    if hours != 9 || ctx.attempt() == 0 {
        return Err(CronError::msg("unexpected"));
    }
    Ok(())
}

#[derive(Debug)]
struct MyError;

impl std::fmt::Display for MyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("my error")
    }
}

impl std::error::Error for MyError {}

#[forge::cron("*/10 * * * * *")]
async fn every_ten_seconds() -> Result<(), MyError> {
    Err(MyError)
}

#[forge::cron("@daily", tz = "America/New_York")]
async fn daily() -> Result<(), std::io::Error> {
    Ok(())
}

#[forge::cron("@HOURLY")]
async fn hourly(_: CronContext) {}

fn main() {
    use forge::crons::IntoCron;
    assert_eq!(
        weekdays.cron_job().unwrap().schedule().to_string(),
        "0 9 * * mon-fri"
    );
    let _ = (
        every_ten_seconds.cron_job().unwrap(),
        daily.cron_job().unwrap(),
        hourly.cron_job().unwrap(),
    );
}
