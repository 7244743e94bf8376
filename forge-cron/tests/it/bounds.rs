//! Bounds of `ticks_between` and `latest_at_or_before`, and their agreement
//! with plain forward iteration.

use chrono::{DateTime, NaiveDateTime, TimeDelta, Utc};
use forge_cron::Schedule;

fn utc(s: &str) -> DateTime<Utc> {
    NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S")
        .unwrap_or_else(|e| panic!("bad test time {s:?}: {e}"))
        .and_utc()
}

const NS: TimeDelta = TimeDelta::nanoseconds(1);

#[test]
fn ticks_between_excludes_the_start_and_includes_the_end() {
    let s = Schedule::parse("0 * * * *").unwrap();
    let (ten, eleven, twelve) = (
        utc("2026-05-01 10:00:00"),
        utc("2026-05-01 11:00:00"),
        utc("2026-05-01 12:00:00"),
    );
    assert_eq!(
        s.ticks_between(ten, twelve).collect::<Vec<_>>(),
        [eleven, twelve]
    );
    assert_eq!(
        s.ticks_between(ten - NS, twelve - NS).collect::<Vec<_>>(),
        [ten, eleven]
    );
    assert_eq!(s.ticks_between(ten, ten).count(), 0);
    assert_eq!(s.ticks_between(ten - NS, ten).collect::<Vec<_>>(), [ten]);
    assert_eq!(s.ticks_between(twelve, ten).count(), 0);
    assert_eq!(s.ticks_between(ten, eleven - NS).count(), 0);
    // Consecutive windows neither repeat nor lose a tick.
    let whole: Vec<_> = s.ticks_between(ten, utc("2026-05-02 10:00:00")).collect();
    let mut pieces: Vec<_> = s.ticks_between(ten, eleven).collect();
    pieces.extend(s.ticks_between(eleven, utc("2026-05-01 15:30:00")));
    pieces.extend(s.ticks_between(utc("2026-05-01 15:30:00"), utc("2026-05-02 10:00:00")));
    assert_eq!(pieces, whole);
    assert_eq!(whole.len(), 24);
}

#[test]
fn iterators_are_fused() {
    let s = Schedule::parse("0 0 1 1 *").unwrap();
    let mut ticks = s.ticks_between(utc("2026-01-01 00:00:00"), utc("2027-06-01 00:00:00"));
    assert_eq!(ticks.next(), Some(utc("2027-01-01 00:00:00")));
    assert_eq!(ticks.next(), None);
    assert_eq!(ticks.next(), None);
    let mut ticks = s.ticks_after(utc("2099-06-01 00:00:00"));
    assert_eq!(ticks.next(), Some(utc("2100-01-01 00:00:00")));
    assert_eq!(ticks.next(), None);
    assert_eq!(ticks.next(), None);
}

#[test]
fn latest_at_or_before_includes_both_bounds() {
    let s = Schedule::parse("0 * * * *").unwrap();
    let (ten, eleven) = (utc("2026-05-01 10:00:00"), utc("2026-05-01 11:00:00"));
    // `at` itself counts.
    assert_eq!(s.latest_at_or_before(eleven, ten), Some(eleven));
    assert_eq!(s.latest_at_or_before(eleven - NS, ten), Some(ten));
    // `not_before` itself counts; just after it does not.
    assert_eq!(s.latest_at_or_before(eleven - NS, ten), Some(ten));
    assert_eq!(s.latest_at_or_before(eleven - NS, ten + NS), None);
    assert_eq!(s.latest_at_or_before(ten, ten), Some(ten));
    // Empty or inverted windows.
    assert_eq!(
        s.latest_at_or_before(ten + TimeDelta::minutes(30), ten + TimeDelta::minutes(1)),
        None
    );
    assert_eq!(s.latest_at_or_before(ten, eleven), None);
    // A long window returns the most recent tick only.
    assert_eq!(
        s.latest_at_or_before(eleven + TimeDelta::minutes(59), utc("2020-01-01 00:00:00")),
        Some(eleven)
    );
    // A sparse schedule, far back.
    let yearly = Schedule::parse("@yearly").unwrap();
    assert_eq!(
        yearly.latest_at_or_before(utc("2026-05-01 00:00:00"), utc("1970-01-01 00:00:00")),
        Some(utc("2026-01-01 00:00:00"))
    );
    assert_eq!(
        yearly.latest_at_or_before(utc("1970-06-01 00:00:00"), DateTime::<Utc>::MIN_UTC),
        Some(utc("1970-01-01 00:00:00"))
    );
    assert_eq!(
        yearly.latest_at_or_before(utc("1969-12-31 23:59:59"), DateTime::<Utc>::MIN_UTC),
        None
    );
    // Per second, with fractional bounds.
    let every = Schedule::parse("* * * * * *").unwrap();
    let t = utc("2026-05-01 10:00:07") + TimeDelta::milliseconds(250);
    assert_eq!(
        every.latest_at_or_before(t, t - TimeDelta::hours(1)),
        Some(utc("2026-05-01 10:00:07"))
    );
    assert_eq!(
        every.latest_at_or_before(t, t - TimeDelta::milliseconds(200)),
        None
    );
}

/// `latest_at_or_before` and `ticks_between` against plain forward
/// iteration, for random schedules and instants around clock changes.
#[test]
fn agree_with_forward_iteration() {
    let zones = [
        "UTC",
        "America/New_York",
        "Europe/Berlin",
        "Australia/Lord_Howe",
    ];
    let exprs = [
        "*/30 * * * *",
        "30 1 * * *",
        "30 2 * * *",
        "0,30 1-3 * * *",
        "50 * * * *",
        "0-10/10 * * * *",
        "*/15 2 * * *",
        "*/20 * * * * *",
        "0-59/7 30 1-2 * * *",
        "0 9 * * 1-5",
        "0 0 13 * 5",
        "@hourly",
    ];
    let changes = [
        "2026-03-08 07:00:00",
        "2026-11-01 06:00:00",
        "2026-03-29 01:00:00",
        "2026-10-25 01:00:00",
        "2026-04-04 15:00:00",
        "2026-10-03 15:30:00",
    ];
    let mut rng = fastrand::Rng::with_seed(seed(99));
    let mut compared = 0;
    for zone in zones {
        for expr in exprs {
            let s = Schedule::parse_in(expr, zone).unwrap();
            for _ in 0..15 {
                let change = utc(changes[rng.usize(..changes.len())]);
                let at = change + TimeDelta::seconds(rng.i64(-3 * 3600..3 * 3600));
                let not_before = at - TimeDelta::seconds(rng.i64(0..4 * 3600));
                let window: Vec<_> = s
                    .ticks_after(not_before - NS)
                    .take_while(|t| *t <= at)
                    .collect();
                assert_eq!(
                    s.latest_at_or_before(at, not_before),
                    window.last().copied(),
                    "{expr:?} in {zone} at {at} not before {not_before}"
                );
                assert_eq!(
                    s.ticks_between(not_before - NS, at).collect::<Vec<_>>(),
                    window,
                    "{expr:?} in {zone}"
                );
                assert!(window.windows(2).all(|w| w[0] < w[1]));
                compared += 1;
            }
        }
    }
    println!("forward-iteration comparison: {compared} cases");
}

/// The fixed seed, unless `FORGE_CRON_SEED` asks for another one (to explore
/// more cases locally; CI always uses the fixed seed).
fn seed(fixed: u64) -> u64 {
    std::env::var("FORGE_CRON_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(fixed)
}
