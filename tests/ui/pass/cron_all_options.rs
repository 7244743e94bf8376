//! Every option at once, a documented `pub` cron in a module, a `#[cfg]`d one; and, at run
//! time, the definition the attribute produced.

use std::time::Duration;

use forge::crons::{CatchUp, Interrupted, IntoCron, Overlap};
use forge::{Role, Schedule};

mod crons {
    use forge::CronContext;

    /// Doc comments stay on the generated struct.
    #[forge::cron(
        "*/5 * * * * *",
        name = "heartbeat",
        role = "reports",
        tz = "Europe/Berlin",
        catch_up = "all",
        catch_up_window = "1h",
        overlap = "wait",
        interrupted = "abandon",
        timeout = "1m 30s"
    )]
    pub async fn beat(ctx: CronContext) {
        let _ = ctx.attempt();
    }

    #[cfg(any())]
    #[forge::cron("@hourly")]
    pub async fn compiled_out() {
        this_would_not_compile()
    }

    // The macro repeats `#[cfg]` on everything it generates.
    #[forge::cron("@hourly")]
    #[cfg(any())]
    pub async fn compiled_out_too() {
        this_would_not_compile()
    }

    /// Attributes other than docs and `#[cfg]` stay on the body.
    #[forge::cron("@daily", name = "daily")]
    #[allow(unused_variables)]
    #[cfg(all())]
    pub async fn compiled_in() {
        let unused = 1;
    }
}

fn assert_debug_has(debug: &str, parts: &[String]) {
    for part in parts {
        assert!(debug.contains(part), "{debug} lacks {part}");
    }
}

fn main() {
    let job = crons::beat.cron_job().unwrap();
    assert_eq!(job.name(), "heartbeat");
    assert_eq!(job.role_name(), &Role::new("reports").unwrap());
    let schedule = Schedule::parse_in("*/5 * * * * *", "Europe/Berlin").unwrap();
    assert_eq!(job.schedule(), &schedule);
    assert_debug_has(
        &format!("{job:?}"),
        &[
            format!("catch_up: {:?}", CatchUp::All),
            format!("overlap: {:?}", Overlap::Wait),
            format!("interrupted: {:?}", Interrupted::Abandon),
            format!("timeout: {:?}", Some(Duration::from_secs(90))),
        ],
    );

    // A unit struct: Copy, Default, Debug.
    let copy: crons::beat = crons::beat;
    assert_eq!(format!("{copy:?}"), "beat");

    // Registered automatically, once.
    let names: Vec<String> = forge::__private::registered_crons()
        .map(|job| job.unwrap().name().to_owned())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["daily", "heartbeat"]);
}
