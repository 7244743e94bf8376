//! The unique options of `#[job]` (`unique`, `unique_period`, `unique_mode`, `unique_states`)
//! produce the same options as `JobOptions`'s builders.

use std::time::Duration;

use forge::jobs::{Job, JobOptions, JobState, UniqueMode};

#[forge::job(
    unique = true,
    unique_period = "1h",
    unique_mode = "keep_earliest_run_at",
    unique_states = ["scheduled", "running", "completed"]
)]
async fn sync_customer(_customer_id: i64) {}

#[forge::job(unique_states = ["available"], unique_mode = "replace")]
async fn reindex(_doc_id: i64) {}

fn main() {
    let expected = JobOptions::new()
        .unique(true)
        .unique_period(Duration::from_secs(3600))
        .unique_mode(UniqueMode::KeepEarliestRunAt)
        .unique_states([JobState::Scheduled, JobState::Running, JobState::Completed]);
    assert_eq!(sync_customer.options(), expected);

    let expected = JobOptions::new()
        .unique_states([JobState::Available])
        .unique_mode(UniqueMode::Replace);
    assert_eq!(reindex.options(), expected);
}
