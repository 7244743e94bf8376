//! Every option at once, and the options it produces at run time; backoff variants.

use std::time::Duration;

use forge::jobs::{Backoff, Job, JobOptions};
use forge::{JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
struct SendEmail {
    to: String,
}

#[forge::job(
    queue = "mailers",
    max_attempts = 5,
    backoff = "exponential",
    backoff_base = "2s",
    backoff_max = "10m",
    timeout = "30s",
    priority = -1,
    unique = true,
    max_snoozes = 7,
    role = "reports",
    name = "mail.send"
)]
async fn send_email(ctx: JobContext, args: SendEmail) -> Result<(), JobError> {
    let _ = (ctx, args);
    Ok(())
}

#[forge::job(backoff = "fixed", backoff_base = "1m 30s")]
async fn fixed(_: ()) {}

#[forge::job(backoff_max = "5m")]
async fn capped(_: ()) {}

fn linear(attempt: u32, _error: &JobError) -> Duration {
    Duration::from_secs(u64::from(attempt))
}

#[forge::job(backoff = linear, max_snoozes = 0)]
async fn custom(_: ()) {}

fn main() {
    assert_eq!(send_email::KIND, "mail.send");
    let expected = JobOptions::new()
        .queue("mailers")
        .max_attempts(5)
        .backoff(Backoff::exponential(Duration::from_secs(2)).capped(Duration::from_secs(600)))
        .timeout(Duration::from_secs(30))
        .priority(-1)
        .unique(true)
        .max_snoozes(7)
        .role("reports");
    assert_eq!(send_email.options(), expected);

    let expected = JobOptions::new().backoff(Backoff::fixed(Duration::from_secs(90)));
    assert_eq!(fixed.options(), expected);

    let expected = JobOptions::new().backoff(Backoff::default().capped(Duration::from_secs(300)));
    assert_eq!(capped.options(), expected);

    let expected = JobOptions::new()
        .backoff(Backoff::custom(linear))
        .max_snoozes(0);
    assert_eq!(custom.options(), expected);

    // Registered automatically.
    let mut registry = forge::__private::JobRegistry::default();
    forge::__private::register_jobs(&mut registry).unwrap();
    let mut kinds: Vec<&str> = registry.kinds().collect();
    kinds.sort();
    assert_eq!(kinds, ["capped", "custom", "fixed", "mail.send"]);
}
