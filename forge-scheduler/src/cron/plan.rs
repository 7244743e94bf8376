//! Which ticks a leader runs after a gap (no leader, or a step of the database's clock): the
//! catch-up policy as a pure function, shared by the supervisor and the test kit's cron clock.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::{CatchUp, CronJob};

/// The ticks due in `(from, now]` that the cron's catch-up policy runs, oldest first, and how
/// many it does not run (missed). `misfire_threshold`: how late a tick may be and still run
/// under [`CatchUp::Skip`].
pub(crate) fn catch_up(
    cron: &CronJob,
    (from, now): (DateTime<Utc>, DateTime<Utc>),
    misfire_threshold: Duration,
) -> (Vec<DateTime<Utc>>, u64) {
    if from >= now {
        return (Vec::new(), 0);
    }
    let window_start = now
        .checked_sub_signed(to_delta(cron.catch_up_window))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let threshold = to_delta(misfire_threshold);
    let mut missed = 0u64;
    let mut due: Vec<DateTime<Utc>> = Vec::new();
    for tick in cron.schedule.ticks_between(from, now) {
        let eligible = match cron.catch_up {
            CatchUp::Skip => now - tick <= threshold,
            CatchUp::Latest | CatchUp::All => tick >= window_start,
        };
        if !eligible {
            missed += 1;
        } else if cron.catch_up == CatchUp::Latest && !due.is_empty() {
            // Only the most recent eligible tick runs.
            missed += 1;
            due[0] = tick;
        } else {
            due.push(tick);
        }
    }
    (due, missed)
}

pub(crate) fn to_delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}
