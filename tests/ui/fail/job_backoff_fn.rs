// A custom backoff of the wrong signature, and one with the options of the built-in backoffs.

use std::time::Duration;

use forge::JobError;

fn by_attempt(attempt: u64) -> Duration {
    Duration::from_secs(attempt)
}

fn linear(attempt: u32, _error: &JobError) -> Duration {
    Duration::from_secs(u64::from(attempt))
}

#[forge::job(backoff = by_attempt)]
async fn a(_args: String) {}

#[forge::job(backoff = linear, backoff_base = "1s", backoff_max = "1m")]
async fn b(_args: String) {}

fn main() {}
