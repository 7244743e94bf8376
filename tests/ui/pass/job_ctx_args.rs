//! A job taking (ctx, args) and returning `Result<(), JobError>` with `?`; the defaults.

use forge::jobs::{Job, JobOptions};
use forge::{JobContext, JobError};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct SendEmail {
    pub to: String,
}

/// Sends one email.
#[forge::job]
pub async fn send_email(ctx: JobContext, args: SendEmail) -> Result<(), JobError> {
    let port: u16 = "25".parse()?;
    if args.to.is_empty() || ctx.attempt() == 0 || port == 0 {
        return Err(JobError::discard("no recipient"));
    }
    Ok(())
}

fn main() {
    assert_eq!(send_email::KIND, "send_email");
    assert_eq!(send_email.options(), JobOptions::new());
    // The body is still callable, and the struct is a `Copy` value.
    let job: send_email = send_email;
    let _ = (job, format!("{job:?}"));
}
