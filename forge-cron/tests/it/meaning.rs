//! Table tests of what expressions mean (in UTC, where clocks never change).

use chrono::{DateTime, NaiveDateTime, Utc};
use forge_cron::Schedule;

fn utc(s: &str) -> DateTime<Utc> {
    NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S")
        .unwrap_or_else(|e| panic!("bad test time {s:?}: {e}"))
        .and_utc()
}

/// The first `n` ticks strictly after `from`, as "2026-04-03 Fri 00:00:00".
fn fires(expr: &str, from: &str, n: usize) -> Vec<String> {
    let schedule = Schedule::parse(expr).unwrap_or_else(|e| panic!("{e}"));
    schedule
        .ticks_after(utc(from))
        .take(n)
        .map(|t| t.format("%Y-%m-%d %a %H:%M:%S").to_string())
        .collect()
}

#[track_caller]
fn check(expr: &str, from: &str, expected: &[&str]) {
    assert_eq!(
        fires(expr, from, expected.len()),
        expected,
        "expression {expr:?} from {from}"
    );
}

#[test]
fn weekdays_at_nine() {
    check(
        "0 9 * * 1-5",
        "2026-05-01 00:00:00",
        &[
            "2026-05-01 Fri 09:00:00",
            "2026-05-04 Mon 09:00:00",
            "2026-05-05 Tue 09:00:00",
            "2026-05-06 Wed 09:00:00",
            "2026-05-07 Thu 09:00:00",
            "2026-05-08 Fri 09:00:00",
        ],
    );
    check(
        "0 9 * * mon-FRI",
        "2026-05-01 09:00:00",
        &["2026-05-04 Mon 09:00:00", "2026-05-05 Tue 09:00:00"],
    );
}

#[test]
fn zero_and_seven_are_both_sunday() {
    let sundays = ["2026-05-03 Sun 00:00:00", "2026-05-10 Sun 00:00:00"];
    for expr in [
        "0 0 * * 0",
        "0 0 * * 7",
        "0 0 * * sun",
        "0 0 * * SUN",
        "0 0 * * 0,7",
    ] {
        check(expr, "2026-05-01 00:00:00", &sundays);
    }
}

#[test]
fn five_to_seven_is_friday_to_sunday() {
    let expected = [
        "2026-05-02 Sat 00:00:00",
        "2026-05-03 Sun 00:00:00",
        "2026-05-08 Fri 00:00:00",
        "2026-05-09 Sat 00:00:00",
        "2026-05-10 Sun 00:00:00",
    ];
    for expr in [
        "0 0 * * 5-7",
        "0 0 * * fri-sun",
        "0 0 * * 5-6,0",
        "0 0 * * 5/1",
    ] {
        check(expr, "2026-05-01 00:00:00", &expected);
    }
}

#[test]
fn restricted_day_of_month_and_day_of_week_are_ored() {
    // Every 13th (Mon 13 April, Wed 13 May) and every Friday.
    check(
        "0 0 13 * 5",
        "2026-04-01 00:00:00",
        &[
            "2026-04-03 Fri 00:00:00",
            "2026-04-10 Fri 00:00:00",
            "2026-04-13 Mon 00:00:00",
            "2026-04-17 Fri 00:00:00",
            "2026-04-24 Fri 00:00:00",
            "2026-05-01 Fri 00:00:00",
            "2026-05-08 Fri 00:00:00",
            "2026-05-13 Wed 00:00:00",
            "2026-05-15 Fri 00:00:00",
        ],
    );
    // Friday the 13th (March 2026) fires once, not twice.
    check(
        "0 0 13 * 5",
        "2026-03-12 00:00:00",
        &["2026-03-13 Fri 00:00:00", "2026-03-20 Fri 00:00:00"],
    );
}

#[test]
fn a_star_in_either_day_field_means_and() {
    // Only the other field restricts.
    check(
        "0 0 13 * *",
        "2026-04-01 00:00:00",
        &["2026-04-13 Mon 00:00:00", "2026-05-13 Wed 00:00:00"],
    );
    check(
        "0 0 * * 5",
        "2026-04-01 00:00:00",
        &[
            "2026-04-03 Fri 00:00:00",
            "2026-04-10 Fri 00:00:00",
            "2026-04-17 Fri 00:00:00",
        ],
    );
    // A field starting with `*` (here `*/10`: days 1, 11, 21, 31) is ANDed:
    // Fridays falling on those days only.
    check(
        "0 0 */10 * 5",
        "2026-01-01 00:00:00",
        &[
            "2026-05-01 Fri 00:00:00",
            "2026-07-31 Fri 00:00:00",
            "2026-08-21 Fri 00:00:00",
            "2026-09-11 Fri 00:00:00",
            "2026-12-11 Fri 00:00:00",
            "2027-01-01 Fri 00:00:00",
        ],
    );
    // Same with the star on the weekday side: `*/1` is every day, so only the
    // 13th matters (not "13th OR every day").
    check(
        "0 0 13 * */1",
        "2026-04-01 00:00:00",
        &["2026-04-13 Mon 00:00:00", "2026-05-13 Wed 00:00:00"],
    );
}

#[test]
fn question_mark_is_a_star_in_day_fields() {
    check(
        "0 0 ? * 5",
        "2026-04-01 00:00:00",
        &["2026-04-03 Fri 00:00:00", "2026-04-10 Fri 00:00:00"],
    );
    check(
        "0 0 13 * ?",
        "2026-04-01 00:00:00",
        &["2026-04-13 Mon 00:00:00", "2026-05-13 Wed 00:00:00"],
    );
}

#[test]
fn steps() {
    check(
        "*/15 * * * *",
        "2026-05-01 10:00:00",
        &[
            "2026-05-01 Fri 10:15:00",
            "2026-05-01 Fri 10:30:00",
            "2026-05-01 Fri 10:45:00",
            "2026-05-01 Fri 11:00:00",
        ],
    );
    check(
        "10-50/20 * * * *",
        "2026-05-01 10:00:00",
        &[
            "2026-05-01 Fri 10:10:00",
            "2026-05-01 Fri 10:30:00",
            "2026-05-01 Fri 10:50:00",
            "2026-05-01 Fri 11:10:00",
        ],
    );
    // `a/n` runs from a to the end of the field.
    check(
        "5/15 * * * *",
        "2026-05-01 10:00:00",
        &[
            "2026-05-01 Fri 10:05:00",
            "2026-05-01 Fri 10:20:00",
            "2026-05-01 Fri 10:35:00",
            "2026-05-01 Fri 10:50:00",
            "2026-05-01 Fri 11:05:00",
        ],
    );
    check(
        "0 0 */10 * *",
        "2026-01-01 00:00:00",
        &[
            "2026-01-11 Sun 00:00:00",
            "2026-01-21 Wed 00:00:00",
            "2026-01-31 Sat 00:00:00",
            "2026-02-01 Sun 00:00:00",
            "2026-02-11 Wed 00:00:00",
        ],
    );
    // An oversized-looking but valid step selects the first value only.
    check(
        "*/59 * * * *",
        "2026-05-01 10:00:00",
        &["2026-05-01 Fri 10:59:00", "2026-05-01 Fri 11:00:00"],
    );
}

#[test]
fn lists_ranges_and_names() {
    check(
        "0 12 * jan,JUL mon-wed",
        "2026-05-01 00:00:00",
        &[
            "2026-07-01 Wed 12:00:00",
            "2026-07-06 Mon 12:00:00",
            "2026-07-07 Tue 12:00:00",
            "2026-07-08 Wed 12:00:00",
        ],
    );
    check(
        "0 0 1 FEB-apr *",
        "2026-01-15 00:00:00",
        &[
            "2026-02-01 Sun 00:00:00",
            "2026-03-01 Sun 00:00:00",
            "2026-04-01 Wed 00:00:00",
            "2027-02-01 Mon 00:00:00",
        ],
    );
    check(
        "0,30 8-9,17 * * *",
        "2026-05-01 00:00:00",
        &[
            "2026-05-01 Fri 08:00:00",
            "2026-05-01 Fri 08:30:00",
            "2026-05-01 Fri 09:00:00",
            "2026-05-01 Fri 09:30:00",
            "2026-05-01 Fri 17:00:00",
            "2026-05-01 Fri 17:30:00",
            "2026-05-02 Sat 08:00:00",
        ],
    );
    // Leading zeros and tabs are fine.
    check(
        "05\t09 * * *",
        "2026-05-01 00:00:00",
        &["2026-05-01 Fri 09:05:00"],
    );
}

#[test]
fn february_29th_fires_in_leap_years_only() {
    check(
        "0 0 29 2 *",
        "2026-01-01 00:00:00",
        &["2028-02-29 Tue 00:00:00", "2032-02-29 Sun 00:00:00"],
    );
}

#[test]
fn aliases() {
    let cases: [(&str, &[&str]); 8] = [
        (
            "@yearly",
            &["2027-01-01 Fri 00:00:00", "2028-01-01 Sat 00:00:00"],
        ),
        ("@annually", &["2027-01-01 Fri 00:00:00"]),
        (
            "@monthly",
            &["2026-06-01 Mon 00:00:00", "2026-07-01 Wed 00:00:00"],
        ),
        (
            "@weekly",
            &["2026-05-03 Sun 00:00:00", "2026-05-10 Sun 00:00:00"],
        ),
        (
            "@daily",
            &["2026-05-02 Sat 00:00:00", "2026-05-03 Sun 00:00:00"],
        ),
        ("@midnight", &["2026-05-02 Sat 00:00:00"]),
        (
            "@hourly",
            &["2026-05-01 Fri 11:00:00", "2026-05-01 Fri 12:00:00"],
        ),
        ("@DAILY", &["2026-05-02 Sat 00:00:00"]),
    ];
    for (alias, expected) in cases {
        check(alias, "2026-05-01 10:30:00", expected);
    }
    assert!(Schedule::parse("@daily").unwrap().is_fixed_time());
    assert!(!Schedule::parse("@hourly").unwrap().is_fixed_time());
}

#[test]
fn six_fields_put_seconds_first() {
    let every_20s = Schedule::parse("*/20 * * * * *").unwrap();
    assert!(every_20s.has_seconds());
    check(
        "*/20 * * * * *",
        "2026-05-01 10:00:00",
        &[
            "2026-05-01 Fri 10:00:20",
            "2026-05-01 Fri 10:00:40",
            "2026-05-01 Fri 10:01:00",
        ],
    );
    check(
        "30 0 12 * * *",
        "2026-05-01 00:00:00",
        &["2026-05-01 Fri 12:00:30", "2026-05-02 Sat 12:00:30"],
    );
    check(
        "* * * * * *",
        "2026-05-01 23:59:58",
        &["2026-05-01 Fri 23:59:59", "2026-05-02 Sat 00:00:00"],
    );
    // Five fields fire at second 0.
    assert!(!Schedule::parse("* * * * *").unwrap().has_seconds());
    check(
        "* * * * *",
        "2026-05-01 10:00:00",
        &["2026-05-01 Fri 10:01:00"],
    );
}

#[test]
fn accessors_and_display() {
    let s = Schedule::parse("  0 9 * * 1-5 ").unwrap();
    assert_eq!(s.expression(), "0 9 * * 1-5");
    assert_eq!(s.timezone(), chrono_tz::UTC);
    assert_eq!(s.to_string(), "0 9 * * 1-5");
    let berlin = s.clone().with_timezone(chrono_tz::Europe::Berlin);
    assert_eq!(berlin.timezone(), chrono_tz::Europe::Berlin);
    assert_eq!(berlin.to_string(), "0 9 * * 1-5 (Europe/Berlin)");
    assert_ne!(s, berlin);
    assert_eq!(
        berlin,
        Schedule::parse_in("0 9 * * 1-5", "Europe/Berlin").unwrap()
    );
    assert_eq!("0 9 * * 1-5".parse::<Schedule>().unwrap(), s);
    assert!(s.is_fixed_time());
}

#[test]
fn sub_second_start_instants_are_handled() {
    let s = Schedule::parse("* * * * * *").unwrap();
    let t = utc("2026-05-01 10:00:00") + chrono::TimeDelta::milliseconds(500);
    assert_eq!(s.next_after(t), Some(utc("2026-05-01 10:00:01")));
    let m = Schedule::parse("0 10 * * *").unwrap();
    let just_before = utc("2026-05-01 10:00:00") - chrono::TimeDelta::nanoseconds(1);
    assert_eq!(m.next_after(just_before), Some(utc("2026-05-01 10:00:00")));
}

#[test]
fn the_supported_range_ends_in_2100() {
    let s = Schedule::parse("0 0 1 1 *").unwrap();
    assert_eq!(
        s.next_after(utc("2099-06-01 00:00:00")),
        Some(utc("2100-01-01 00:00:00"))
    );
    assert_eq!(s.next_after(utc("2100-01-01 00:00:00")), None);
    assert_eq!(s.next_after(DateTime::<Utc>::MAX_UTC), None);
    assert_eq!(
        s.next_after(DateTime::<Utc>::MIN_UTC),
        Some(utc("1970-01-01 00:00:00"))
    );
    let berlin = s.with_timezone(chrono_tz::Europe::Berlin);
    assert_eq!(berlin.next_after(DateTime::<Utc>::MAX_UTC), None);
    assert_eq!(berlin.ticks_after(utc("2100-01-01 00:00:00")).count(), 0);
    assert_eq!(
        berlin.latest_at_or_before(DateTime::<Utc>::MAX_UTC, DateTime::<Utc>::MIN_UTC),
        Some(utc("2099-12-31 23:00:00"))
    );
    assert_eq!(
        berlin.latest_at_or_before(DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MIN_UTC),
        None
    );
}

#[test]
fn schedules_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<Schedule>();
    assert_send_sync::<forge_cron::ScheduleError>();
}
