//! Every rejection, with a check that the message names the problem.

use forge_cron::{Schedule, ScheduleError, parse_timezone};

const EXPECTED: &str = "expected 5 fields \"minute hour day-of-month month day-of-week\", \
                        6 fields with seconds first, or an alias such as @hourly";

#[track_caller]
fn rejects(expr: &str, fragments: &[&str]) -> ScheduleError {
    let err = match Schedule::parse(expr) {
        Ok(s) => panic!("{expr:?} was accepted as {s:?}"),
        Err(err) => err,
    };
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("invalid cron expression \"{}\": ", expr.trim())),
        "{message}"
    );
    for fragment in fragments {
        assert!(message.contains(fragment), "{message:?} lacks {fragment:?}");
    }
    // Messages are lowercase apart from what the user wrote.
    assert!(!message.replace(expr, "").contains("Invalid"), "{message}");
    err
}

#[track_caller]
fn rejects_syntax(expr: &str, fragments: &[&str]) {
    let err = rejects(expr, fragments);
    assert!(matches!(err, ScheduleError::Syntax { .. }), "{err:?}");
    assert!(err.to_string().ends_with(EXPECTED), "{err}");
}

#[test]
fn the_documented_example_message() {
    assert_eq!(
        Schedule::parse("0 25 * * *").unwrap_err().to_string(),
        format!(
            "invalid cron expression \"0 25 * * *\": hour 25 is out of range (valid: 0-23); {EXPECTED}"
        )
    );
}

#[test]
fn wrong_field_count() {
    rejects_syntax("", &["the expression is empty"]);
    rejects_syntax("   ", &["the expression is empty"]);
    rejects_syntax("0 9 * *", &["found 4 fields"]);
    rejects_syntax("*", &["found 1 field;"]);
    rejects_syntax("0 0 9 * * * 2026", &["found 7 fields"]);
}

#[test]
fn out_of_range_values_name_the_field_and_range() {
    let cases = [
        ("60 * * * * *", "second 60 is out of range (valid: 0-59)"),
        ("60 * * * *", "minute 60 is out of range (valid: 0-59)"),
        ("0 24 * * *", "hour 24 is out of range (valid: 0-23)"),
        ("0 0 0 * *", "day-of-month 0 is out of range (valid: 1-31)"),
        (
            "0 0 32 * *",
            "day-of-month 32 is out of range (valid: 1-31)",
        ),
        (
            "0 0 * 0 *",
            "month 0 is out of range (valid: 1-12 or jan-dec)",
        ),
        (
            "0 0 * 13 *",
            "month 13 is out of range (valid: 1-12 or jan-dec)",
        ),
        (
            "0 0 * * 8",
            "day-of-week 8 is out of range (valid: 0-7 or sun-sat, where 0 and 7 are both sunday)",
        ),
        ("0 0-24 * * *", "hour 24 is out of range"),
        (
            "0 99999999999999999999 * * *",
            "hour 99999999999999999999 is out of range",
        ),
        ("1,2,70 * * * *", "minute 70 is out of range"),
    ];
    for (expr, fragment) in cases {
        rejects_syntax(expr, &[fragment]);
    }
}

#[test]
fn bad_steps() {
    rejects_syntax(
        "*/0 * * * *",
        &["minute step in \"*/0\" is zero (valid steps: 1-59)"],
    );
    rejects_syntax(
        "0 1-5/0 * * *",
        &["hour step in \"1-5/0\" is zero (valid steps: 1-23)"],
    );
    rejects_syntax(
        "*/60 * * * *",
        &["minute step in \"*/60\" is too large (valid steps: 1-59)"],
    );
    rejects_syntax(
        "0 0 * * */8",
        &["day-of-week step in \"*/8\" is too large (valid steps: 1-7)"],
    );
    rejects_syntax("*/x * * * *", &["minute step in \"*/x\" is not a number"]);
    rejects_syntax("*/ * * * *", &["minute step in \"*/\" is not a number"]);
    rejects_syntax(
        "*/2/3 * * * *",
        &["minute step in \"*/2/3\" is not a number"],
    );
    rejects_syntax("*/-1 * * * *", &["minute step in \"*/-1\" is not a number"]);
}

#[test]
fn reversed_ranges() {
    rejects_syntax(
        "0 0 * * 5-1",
        &[
            "day-of-week range \"5-1\" is reversed",
            "the start must not be after the end",
            "\"5-6,0-1\"",
        ],
    );
    rejects_syntax(
        "0 22-2 * * *",
        &["hour range \"22-2\" is reversed", "\"22-23,0-2\""],
    );
    rejects_syntax("30-10/5 * * * *", &["minute range \"30-10\" is reversed"]);
    rejects_syntax(
        "0 0 1 dec-jan *",
        &["month range \"dec-jan\" is reversed", "\"12-12,1-1\""],
    );
}

#[test]
fn malformed_ranges() {
    rejects_syntax("-5 * * * *", &["minute range \"-5\" is missing its start"]);
    rejects_syntax("5- * * * *", &["minute range \"5-\" is missing its end"]);
    rejects_syntax("1-2-3 * * * *", &["minute range \"1-2-3\" is not valid"]);
    rejects_syntax("*-5 * * * *", &["\"*\" cannot be part of a range"]);
}

#[test]
fn empty_list_items() {
    rejects_syntax(
        "1,,2 * * * *",
        &["minute field \"1,,2\" has an empty list item"],
    );
    rejects_syntax(
        "0 0 1, * *",
        &["day-of-month field \"1,\" has an empty list item"],
    );
    rejects_syntax("0 0 * ,1 *", &["month field \",1\" has an empty list item"]);
}

#[test]
fn unknown_names_and_non_numbers() {
    rejects_syntax(
        "0 0 * * fir",
        &["day-of-week name \"fir\" is unknown (valid: sun, mon, tue, wed, thu, fri, sat)"],
    );
    rejects_syntax(
        "0 0 * * monday",
        &["day-of-week name \"monday\" is unknown"],
    );
    rejects_syntax(
        "0 0 * jna *",
        &["month name \"jna\" is unknown (valid: jan, feb, mar"],
    );
    rejects_syntax(
        "0 0 * * mon-frii",
        &["day-of-week name \"frii\" is unknown"],
    );
    rejects_syntax(
        "0 0 jan * *",
        &["day-of-month \"jan\" is not a number (valid: 1-31)"],
    );
    rejects_syntax("x * * * *", &["minute \"x\" is not a number (valid: 0-59)"]);
    rejects_syntax("0 +1 * * *", &["hour \"+1\" is not a number"]);
    rejects_syntax("0 0 L * *", &["day-of-month \"L\" is not a number"]);
    rejects_syntax("0 0 * * 5#3", &["day-of-week \"5#3\" is not a number"]);
}

#[test]
fn question_mark_only_as_a_whole_day_field() {
    rejects_syntax(
        "? * * * *",
        &[
            "minute \"?\" is not valid",
            "only accepted as the whole day-of-month or day-of-week field",
        ],
    );
    rejects_syntax("0 0 ?,1 * *", &["day-of-month \"?,1\" is not valid"]);
}

#[test]
fn unknown_aliases() {
    rejects_syntax(
        "@fortnightly",
        &[
            "unknown alias \"@fortnightly\" (valid: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly)",
        ],
    );
    rejects_syntax("@reboot", &["@reboot is not supported"]);
    rejects_syntax("@daily 5", &["must be the whole expression"]);
}

#[test]
fn impossible_dates_never_fire() {
    for (expr, fragment) in [
        (
            "0 0 30 2 *",
            "day-of-month \"30\" never occurs in month \"2\"",
        ),
        (
            "0 0 31 4,6,9,11 *",
            "day-of-month \"31\" never occurs in month \"4,6,9,11\"",
        ),
        (
            "0 0 30-31 feb *",
            "day-of-month \"30-31\" never occurs in month \"feb\"",
        ),
        // A star-prefixed day of week ANDs, so the date still has to exist.
        ("0 0 31 2 */2", "never occurs"),
    ] {
        let err = rejects(expr, &["it never fires", fragment]);
        assert!(matches!(err, ScheduleError::NeverFires { .. }), "{err:?}");
    }
    // Not errors: February 29th exists every four years, and a restricted
    // day of week ORs with the (impossible) day of month.
    assert!(Schedule::parse("0 0 29 2 *").is_ok());
    assert!(Schedule::parse("0 0 30 2 1").is_ok());
}

#[test]
fn unknown_time_zones() {
    let err = parse_timezone("Europe/Berln").unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown time zone \"Europe/Berln\": expected an IANA time zone name such as \
         \"Europe/Berlin\", \"America/New_York\" or \"UTC\""
    );
    let err = parse_timezone("europe/berlin").unwrap_err();
    assert_eq!(
        err,
        ScheduleError::UnknownTimeZone {
            name: "europe/berlin".to_owned(),
            suggestion: Some("Europe/Berlin".to_owned())
        }
    );
    assert!(err.to_string().starts_with(
        "unknown time zone \"europe/berlin\" (did you mean \"Europe/Berlin\"?): expected an IANA"
    ));
    let err = parse_timezone("New York").unwrap_err();
    assert!(
        err.to_string()
            .contains("did you mean \"America/New_York\"?"),
        "{err}"
    );
    let err = Schedule::parse_in("0 9 * * *", "CEST").unwrap_err();
    assert!(
        err.to_string().starts_with("unknown time zone \"CEST\""),
        "{err}"
    );
    // The expression is checked first.
    let err = Schedule::parse_in("0 99 * * *", "Nowhere").unwrap_err();
    assert!(matches!(err, ScheduleError::Syntax { .. }), "{err:?}");
    assert_eq!(parse_timezone("UTC").unwrap(), chrono_tz::UTC);
    assert_eq!(
        parse_timezone("America/New_York").unwrap(),
        chrono_tz::America::New_York
    );
}
