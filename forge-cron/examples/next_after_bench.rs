//! Prints the cost of `Schedule::next_after` for a few typical schedules.
//!
//! Run with `cargo run --release -p forge-cron --example next_after_bench`.
//! Each call starts from the previous tick, as the scheduler does.

use std::hint::black_box;
use std::time::Instant;

use chrono::{DateTime, Utc};
use forge_cron::Schedule;

fn main() {
    let cases = [
        ("* * * * * *", "UTC"),
        ("* * * * * *", "Europe/Berlin"),
        ("*/15 * * * *", "Europe/Berlin"),
        ("0 9 * * 1-5", "America/New_York"),
        ("30 2 * * *", "America/New_York"),
        ("0 0 13 * 5", "UTC"),
        ("@yearly", "Europe/Berlin"),
    ];
    let start: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().expect("valid instant");
    for (expr, tz) in cases {
        let schedule = Schedule::parse_in(expr, tz).expect("valid schedule");
        let calls = 20_000;
        let began = Instant::now();
        let mut t = start;
        for _ in 0..calls {
            // Sparse schedules run out of supported years (2100): start over.
            t = black_box(schedule.next_after(black_box(t))).unwrap_or(start);
        }
        let per_call = began.elapsed() / calls;
        println!(
            "{:<32} {per_call:>10.2?} per next_after",
            schedule.to_string()
        );
    }
}
