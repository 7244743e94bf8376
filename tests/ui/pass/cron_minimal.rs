//! The smallest cron: no context, no return value, no options; and its defaults.

use forge::crons::{CatchUp, Interrupted, IntoCron, Overlap};
use forge::{Role, Schedule};

#[forge::cron("0 * * * *")]
async fn compact() {}

fn main() {
    let job = compact.cron_job().unwrap();
    assert_eq!(job.name(), "compact");
    assert_eq!(job.role_name(), &Role::SCHEDULER);
    assert_eq!(job.schedule(), &Schedule::parse("0 * * * *").unwrap());
    let debug = format!("{job:?}");
    for part in [
        format!("catch_up: {:?}", CatchUp::Latest),
        format!("overlap: {:?}", Overlap::Skip),
        format!("interrupted: {:?}", Interrupted::Rerun),
        "timeout: None".to_owned(),
    ] {
        assert!(debug.contains(&part), "{debug} lacks {part}");
    }
    // The body is still callable.
    let _run = compact::run();
}
