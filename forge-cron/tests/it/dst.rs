//! Daylight-saving behaviour (Vixie cron's rules), in America/New_York and
//! Europe/Berlin for both changes of 2026, plus a brute-force comparison in
//! more zones.
//!
//! 2026 changes (all instants UTC):
//! * New York: 03-08 07:00 (02:00 EST -> 03:00 EDT), 11-01 06:00 (02:00 EDT -> 01:00 EST)
//! * Berlin:   03-29 01:00 (02:00 CET -> 03:00 CEST), 10-25 01:00 (03:00 CEST -> 02:00 CET)

use chrono::{DateTime, LocalResult, NaiveDateTime, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use forge_cron::Schedule;

const NEW_YORK: &str = "America/New_York";
const BERLIN: &str = "Europe/Berlin";

fn utc(s: &str) -> DateTime<Utc> {
    NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S")
        .unwrap_or_else(|e| panic!("bad test time {s:?}: {e}"))
        .and_utc()
}

fn schedule(expr: &str, tz: &str) -> Schedule {
    Schedule::parse_in(expr, tz).unwrap_or_else(|e| panic!("{e}"))
}

/// Ticks in `(from, until]`, formatted as UTC "MM-DD HH:MM:SS".
fn fires(expr: &str, tz: &str, from: &str, until: &str) -> Vec<String> {
    schedule(expr, tz)
        .ticks_between(utc(from), utc(until))
        .map(|t| t.format("%m-%d %H:%M:%S").to_string())
        .collect()
}

#[track_caller]
fn check(expr: &str, tz: &str, from: &str, until: &str, expected: &[&str]) {
    assert_eq!(
        fires(expr, tz, from, until),
        expected,
        "{expr:?} in {tz} over ({from}, {until}]"
    );
}

#[test]
fn fixed_time_in_the_spring_gap_fires_once_at_the_jump() {
    // 02:30 does not exist on 03-08; it fires at 07:00Z = 03:00 EDT.
    check(
        "30 2 * * *",
        NEW_YORK,
        "2026-03-07 00:00:00",
        "2026-03-09 23:00:00",
        &["03-07 07:30:00", "03-08 07:00:00", "03-09 06:30:00"],
    );
    check(
        "30 2 * * *",
        BERLIN,
        "2026-03-28 00:00:00",
        "2026-03-30 23:00:00",
        &["03-28 01:30:00", "03-29 01:00:00", "03-30 00:30:00"],
    );
    // Several skipped ticks, and a regular 03:00 tick at the jump, fire once.
    check(
        "0,30 2,3 * * *",
        NEW_YORK,
        "2026-03-08 00:00:00",
        "2026-03-08 12:00:00",
        &["03-08 07:00:00", "03-08 07:30:00"],
    );
    check(
        "0,15,30,45 2 * * *",
        BERLIN,
        "2026-03-29 00:00:00",
        "2026-03-29 12:00:00",
        &["03-29 01:00:00"],
    );
    // From just before the jump, and from exactly at it.
    let s = schedule("30 2 * * *", NEW_YORK);
    assert_eq!(
        s.next_after(utc("2026-03-08 06:59:59")),
        Some(utc("2026-03-08 07:00:00"))
    );
    assert_eq!(
        s.next_after(utc("2026-03-08 07:00:00")),
        Some(utc("2026-03-09 06:30:00"))
    );
}

#[test]
fn fixed_time_in_the_autumn_repeat_fires_once_at_the_first_pass() {
    // 01:30 happens at 05:30Z (EDT) and again at 06:30Z (EST); only the first.
    check(
        "30 1 * * *",
        NEW_YORK,
        "2026-10-31 00:00:00",
        "2026-11-02 23:00:00",
        &["10-31 05:30:00", "11-01 05:30:00", "11-02 06:30:00"],
    );
    check(
        "30 2 * * *",
        BERLIN,
        "2026-10-24 00:00:00",
        "2026-10-26 23:00:00",
        &["10-24 00:30:00", "10-25 00:30:00", "10-26 01:30:00"],
    );
    // Several ticks in the repeated hour: first pass only.
    check(
        "0,20,40 1 * * *",
        NEW_YORK,
        "2026-11-01 00:00:00",
        "2026-11-01 12:00:00",
        &["11-01 05:00:00", "11-01 05:20:00", "11-01 05:40:00"],
    );
    // Starting inside the repeat (or late in the first pass) skips the repeat.
    let s = schedule("30 1 * * *", NEW_YORK);
    for start in [
        "2026-11-01 05:45:00",
        "2026-11-01 06:00:00",
        "2026-11-01 06:10:00",
        "2026-11-01 06:30:00",
    ] {
        assert_eq!(
            s.next_after(utc(start)),
            Some(utc("2026-11-02 06:30:00")),
            "from {start}"
        );
    }
    assert_eq!(
        s.next_after(utc("2026-11-01 05:29:59")),
        Some(utc("2026-11-01 05:30:00"))
    );
}

#[test]
fn wildcard_schedules_follow_elapsed_time() {
    // Spring: 02:00 and 02:30 do not exist and do not fire.
    check(
        "*/30 * * * *",
        NEW_YORK,
        "2026-03-08 05:45:00",
        "2026-03-08 08:00:00",
        &[
            "03-08 06:00:00",
            "03-08 06:30:00",
            "03-08 07:00:00",
            "03-08 07:30:00",
            "03-08 08:00:00",
        ],
    );
    check(
        "*/30 * * * *",
        BERLIN,
        "2026-03-28 23:45:00",
        "2026-03-29 02:00:00",
        &[
            "03-29 00:00:00",
            "03-29 00:30:00",
            "03-29 01:00:00",
            "03-29 01:30:00",
            "03-29 02:00:00",
        ],
    );
    // Autumn: the repeated hour fires in both passes.
    check(
        "*/30 * * * *",
        NEW_YORK,
        "2026-11-01 04:45:00",
        "2026-11-01 07:00:00",
        &[
            "11-01 05:00:00",
            "11-01 05:30:00",
            "11-01 06:00:00",
            "11-01 06:30:00",
            "11-01 07:00:00",
        ],
    );
    check(
        "*/30 * * * *",
        BERLIN,
        "2026-10-24 23:45:00",
        "2026-10-25 02:00:00",
        &[
            "10-25 00:00:00",
            "10-25 00:30:00",
            "10-25 01:00:00",
            "10-25 01:30:00",
            "10-25 02:00:00",
        ],
    );
    // `30 * * * *` is a wildcard schedule too (hour starts with `*`).
    check(
        "30 * * * *",
        NEW_YORK,
        "2026-11-01 04:00:00",
        "2026-11-01 08:00:00",
        &[
            "11-01 04:30:00",
            "11-01 05:30:00",
            "11-01 06:30:00",
            "11-01 07:30:00",
        ],
    );
    check(
        "30 * * * *",
        NEW_YORK,
        "2026-03-08 05:00:00",
        "2026-03-08 09:00:00",
        &[
            "03-08 05:30:00",
            "03-08 06:30:00",
            "03-08 07:30:00",
            "03-08 08:30:00",
        ],
    );
    // A wildcard schedule whose only times that day are skipped does not fire.
    check(
        "*/10 2 * * *",
        NEW_YORK,
        "2026-03-08 00:00:00",
        "2026-03-08 23:00:00",
        &[],
    );
}

#[test]
fn wildcard_searches_starting_inside_the_repeat() {
    let s = schedule("*/30 * * * *", NEW_YORK);
    // In the first pass after its last tick: the repeat comes next.
    assert_eq!(
        s.next_after(utc("2026-11-01 05:40:00")),
        Some(utc("2026-11-01 06:00:00"))
    );
    // In the first pass, a later first-pass tick comes first.
    assert_eq!(
        s.next_after(utc("2026-11-01 05:10:00")),
        Some(utc("2026-11-01 05:30:00"))
    );
    // In the repeat.
    assert_eq!(
        s.next_after(utc("2026-11-01 06:10:00")),
        Some(utc("2026-11-01 06:30:00"))
    );
    assert_eq!(
        s.next_after(utc("2026-11-01 06:40:00")),
        Some(utc("2026-11-01 07:00:00"))
    );

    // Times only in the early part of the repeated hour.
    let s = schedule("0-10/10 * * * *", NEW_YORK);
    assert_eq!(
        s.next_after(utc("2026-11-01 05:20:00")),
        Some(utc("2026-11-01 06:00:00"))
    );
    let ticks: Vec<_> = s
        .ticks_between(utc("2026-11-01 04:30:00"), utc("2026-11-01 07:30:00"))
        .collect();
    assert_eq!(
        ticks,
        ["05:00", "05:10", "06:00", "06:10", "07:00", "07:10"]
            .map(|t| utc(&format!("2026-11-01 {t}:00")))
    );
}

#[test]
fn per_second_schedules_across_both_changes() {
    for tz in [NEW_YORK, BERLIN] {
        let zone: Tz = tz.parse().unwrap();
        for (date, change) in [
            ("2026-03-08", 7),
            ("2026-11-01", 6),
            ("2026-03-29", 1),
            ("2026-10-25", 1),
        ] {
            let jump = utc(&format!("{date} {change:02}:00:00"));
            let (from, until) = (jump - TimeDelta::hours(1), jump + TimeDelta::hours(1));
            // Wildcard: every real second fires, nothing twice.
            let every: Vec<_> = schedule("* * * * * *", tz)
                .ticks_between(from, until)
                .collect();
            assert_eq!(every.len(), 2 * 3600, "{tz} around {jump}");
            assert!(
                every
                    .windows(2)
                    .all(|w| w[1] - w[0] == TimeDelta::seconds(1))
            );

            for expr in [
                "*/7 * * * * *",
                "0-59 * 1-3 * * *",
                "0-59/13 0-59 1-3 * * *",
                "*/10 30 2 * * *",
            ] {
                let ticks: Vec<_> = schedule(expr, tz).ticks_between(from, until).collect();
                assert!(
                    ticks.windows(2).all(|w| w[0] < w[1]),
                    "{expr:?} in {tz} around {jump}"
                );
                // Every tick shows a matching wall-clock time (fixed-time jump
                // fires excepted).
                let utc_schedule = Schedule::parse(expr).unwrap();
                for t in &ticks {
                    let wall = t.with_timezone(&zone).naive_local().and_utc();
                    let matches =
                        utc_schedule.next_after(wall - TimeDelta::seconds(1)) == Some(wall);
                    assert!(matches || utc_schedule.is_fixed_time(), "{expr:?} {t}");
                }
            }
        }
    }
    // A fixed-time per-second list in the repeated hour: first pass only.
    let ticks: Vec<_> = schedule("0-59 30 1 * * *", NEW_YORK)
        .ticks_between(utc("2026-11-01 00:00:00"), utc("2026-11-01 12:00:00"))
        .collect();
    assert_eq!(ticks.len(), 60);
    assert_eq!(ticks[0], utc("2026-11-01 05:30:00"));
    assert_eq!(ticks[59], utc("2026-11-01 05:30:59"));
    // ... and in the skipped hour: all 60 collapse into the jump.
    let ticks: Vec<_> = schedule("0-59 30 2 * * *", NEW_YORK)
        .ticks_between(utc("2026-03-08 00:00:00"), utc("2026-03-08 12:00:00"))
        .collect();
    assert_eq!(ticks, [utc("2026-03-08 07:00:00")]);
}

#[test]
fn latest_at_or_before_across_changes() {
    let fixed = schedule("30 1 * * *", NEW_YORK);
    // In the repeat, the latest fire is the first pass.
    let repeat = utc("2026-11-01 06:45:00");
    assert_eq!(
        fixed.latest_at_or_before(repeat, utc("2026-11-01 00:00:00")),
        Some(utc("2026-11-01 05:30:00"))
    );
    assert_eq!(
        fixed.latest_at_or_before(repeat, utc("2026-11-01 05:30:01")),
        None
    );

    let wildcard = schedule("*/30 * * * *", NEW_YORK);
    assert_eq!(
        wildcard.latest_at_or_before(repeat, repeat - TimeDelta::hours(9)),
        Some(utc("2026-11-01 06:30:00"))
    );
    assert_eq!(
        wildcard.latest_at_or_before(utc("2026-11-01 06:29:59"), utc("2026-11-01 00:00:00")),
        Some(utc("2026-11-01 06:00:00"))
    );
    // Only early minutes of each hour: in the repeat at 01:20 EST, the latest
    // fire is 01:10 EST, not the first pass.
    let early = schedule("0-10/10 * * * *", NEW_YORK);
    assert_eq!(
        early.latest_at_or_before(utc("2026-11-01 06:20:00"), utc("2026-11-01 00:00:00")),
        Some(utc("2026-11-01 06:10:00"))
    );
    // Only late minutes: in the repeat before they come round again, the
    // latest fire is in the first pass, at a later wall-clock time.
    let late = schedule("50 * * * *", NEW_YORK);
    assert_eq!(
        late.latest_at_or_before(utc("2026-11-01 06:20:00"), utc("2026-11-01 00:00:00")),
        Some(utc("2026-11-01 05:50:00"))
    );

    // Spring: the fixed-time jump fire, and a wildcard skipping the gap.
    let spring = schedule("30 2 * * *", BERLIN);
    assert_eq!(
        spring.latest_at_or_before(utc("2026-03-29 01:00:00"), utc("2026-03-29 00:00:00")),
        Some(utc("2026-03-29 01:00:00"))
    );
    let gap_only = schedule("*/15 2 * * *", BERLIN);
    assert_eq!(
        gap_only.latest_at_or_before(utc("2026-03-29 12:00:00"), utc("2026-03-27 00:00:00")),
        Some(utc("2026-03-28 01:45:00"))
    );
}

/// The mapping from wall-clock ticks to instants, checked by brute force:
/// minute by minute in several zones (including Lord Howe's half-hour
/// change and the southern hemisphere), for random expressions around every
/// 2026 change. Matching uses croner, so this is independent of the crate.
#[test]
fn brute_force_around_every_change_of_2026() {
    let zones = [
        "America/New_York",
        "Europe/Berlin",
        "Australia/Lord_Howe",
        "Australia/Sydney",
        "America/Santiago",
    ];
    let minutes = [
        "0", "30", "*/15", "0,30", "*", "15-45/15", "5/20", "59", "*/7", "0-10",
    ];
    let hours = [
        "*", "1", "2", "1-3", "*/2", "0,2", "2-3", "1,2,3", "*/1", "0-4/2", "3",
    ];
    let days = [
        ("*", "*"),
        ("*", "0"),
        ("1", "0"),
        ("*/2", "*"),
        ("*", "1-5"),
    ];
    let mut rng = fastrand::Rng::with_seed(seed(2026));
    let mut compared = 0;
    for zone in zones {
        let tz: Tz = zone.parse().unwrap();
        for jump in changes_in_2026(tz) {
            for _ in 0..12 {
                let (dom, dow) = days[rng.usize(..days.len())];
                let expr = format!(
                    "{} {} {dom} * {dow}",
                    minutes[rng.usize(..minutes.len())],
                    hours[rng.usize(..hours.len())]
                );
                let ours = schedule(&expr, zone);
                let matcher = croner::parser::CronParser::builder()
                    .seconds(croner::parser::Seconds::Optional)
                    .sloppy_ranges(true)
                    .build()
                    .parse(&expr)
                    .unwrap();
                let (from, until) = (jump - TimeDelta::hours(6), jump + TimeDelta::hours(6));
                let expected = brute_force(&matcher, ours.is_fixed_time(), tz, from, until);
                let actual: Vec<_> = ours.ticks_between(from, until).collect();
                assert_eq!(actual, expected, "{expr:?} in {zone} around {jump}");
                compared += 1;
            }
        }
    }
    println!("brute-force DST comparison: {compared} cases");
    assert!(compared >= 100);
}

/// Instants in `(from, until]` at which Vixie cron would run `matcher`.
fn brute_force(
    matcher: &croner::Cron,
    fixed_time: bool,
    tz: Tz,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    let matches = |wall: &NaiveDateTime| matcher.is_time_matching(wall).unwrap();
    let mut out = Vec::new();
    if !fixed_time {
        // Every instant whose wall clock matches.
        let mut t = from + TimeDelta::minutes(1);
        while t <= until {
            if matches(&t.with_timezone(&tz).naive_local()) {
                out.push(t);
            }
            t += TimeDelta::minutes(1);
        }
        return out;
    }
    // Every matching wall-clock time, at its first instant, or when the clock
    // jumps over it.
    let mut wall = from.naive_utc() - TimeDelta::hours(16);
    while wall <= until.naive_utc() + TimeDelta::hours(16) {
        if matches(&wall) {
            let instant = match tz.from_local_datetime(&wall) {
                LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => t,
                LocalResult::None => {
                    let mut later = wall;
                    loop {
                        later += TimeDelta::minutes(1);
                        if let Some(t) = tz.from_local_datetime(&later).earliest() {
                            break t;
                        }
                    }
                }
            }
            .with_timezone(&Utc);
            if from < instant && instant <= until && out.last() != Some(&instant) {
                out.push(instant);
            }
        }
        wall += TimeDelta::minutes(1);
    }
    out
}

/// The instants in 2026 at which the UTC offset of `tz` changes.
fn changes_in_2026(tz: Tz) -> Vec<DateTime<Utc>> {
    use chrono::Offset;
    let offset = |t: DateTime<Utc>| tz.offset_from_utc_datetime(&t.naive_utc()).fix();
    let mut changes = Vec::new();
    let mut t = utc("2026-01-01 00:00:00");
    while t < utc("2027-01-01 00:00:00") {
        let next = t + TimeDelta::minutes(30);
        if offset(t) != offset(next) {
            changes.push(next);
        }
        t = next;
    }
    assert_eq!(changes.len(), 2, "{tz} should change twice in 2026");
    changes
}

/// The fixed seed, unless `FORGE_CRON_SEED` asks for another one (to explore
/// more cases locally; CI always uses the fixed seed).
fn seed(fixed: u64) -> u64 {
    std::env::var("FORGE_CRON_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(fixed)
}

/// Samoa skipped Friday 2011-12-30 entirely (UTC-10 -> UTC+14 at 10:00Z):
/// the widest jump on record.
#[test]
fn a_skipped_whole_day() {
    check(
        "0 9 * * *",
        "Pacific/Apia",
        "2011-12-29 00:00:00",
        "2011-12-31 00:00:00",
        // Dec 29 09:00 -10; Dec 30 09:00 fires at the jump (Dec 31 00:00 +14);
        // Dec 31 09:00 +14.
        &["12-29 19:00:00", "12-30 10:00:00", "12-30 19:00:00"],
    );
    // A wildcard schedule keeps firing every real hour across the jump.
    let hourly: Vec<_> = schedule("0 * * * *", "Pacific/Apia")
        .ticks_between(utc("2011-12-30 00:00:00"), utc("2011-12-30 20:00:00"))
        .collect();
    assert_eq!(hourly.len(), 20);
    // Friday noon was skipped, so it fires at the jump (a Saturday, local):
    // Vixie runs the skipped wall-clock times, whatever day they fell on.
    check(
        "0 12 * * 5",
        "Pacific/Apia",
        "2011-12-25 00:00:00",
        "2012-01-06 00:00:00",
        &["12-30 10:00:00", "01-05 22:00:00"],
    );
}
