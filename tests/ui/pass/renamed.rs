//! The former names still compile for one release (deprecated, see CHANGELOG.md "Renamed"):
//! `crons::Cron` (now `IntoCron`), `crons::Crons` (now `CronRunner`), `jobs::JobQueue` (now
//! `JobRunner`). A bound on the old trait accepts what the new one does.
#![allow(deprecated)]

use forge::crons::{Cron, CronRunner, Crons};
use forge::jobs::{JobQueue, JobRunner};

#[forge::cron("0 * * * *")]
async fn compact() {}

fn name_of(cron: impl Cron) -> String {
    cron.cron_job().unwrap().name().to_owned()
}

fn main() {
    assert_eq!(name_of(compact), "compact");
    let same_cron_runner: fn() -> Option<Crons> = || None::<CronRunner>;
    let same_job_runner: fn() -> Option<JobQueue> = || None::<JobRunner>;
    assert!(same_cron_runner().is_none() && same_job_runner().is_none());
}
