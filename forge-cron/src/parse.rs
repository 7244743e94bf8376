//! Turns an expression into explicit value sets with the standard (Vixie
//! cron, crontab(5)) meaning.
//!
//! This is where the semantics live: the `cron` crate only ever sees the
//! comma lists built from these sets (see `engine.rs`), so none of its own
//! conventions (seconds first, Sunday = 1, day-of-month AND day-of-week)
//! leak through.

/// A field of an expression, in the order of the 6-field form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Second,
    Minute,
    Hour,
    DayOfMonth,
    Month,
    DayOfWeek,
}

const MONTH_NAMES: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAY_NAMES: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// Longest length of each month, February counted in a leap year: a day is
/// possible in a month if it is at most this.
const MAX_MONTH_DAYS: [u32; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Second => "second",
            Field::Minute => "minute",
            Field::Hour => "hour",
            Field::DayOfMonth => "day-of-month",
            Field::Month => "month",
            Field::DayOfWeek => "day-of-week",
        }
    }

    fn min(self) -> u32 {
        match self {
            Field::DayOfMonth | Field::Month => 1,
            _ => 0,
        }
    }

    /// Largest value accepted; for day-of-week that is 7, another name for
    /// Sunday.
    fn max(self) -> u32 {
        match self {
            Field::Second | Field::Minute => 59,
            Field::Hour => 23,
            Field::DayOfMonth => 31,
            Field::Month => 12,
            Field::DayOfWeek => 7,
        }
    }

    /// Names usable instead of numbers, and the number of the first name.
    fn names(self) -> Option<(&'static [&'static str], u32)> {
        match self {
            Field::Month => Some((&MONTH_NAMES, 1)),
            Field::DayOfWeek => Some((&WEEKDAY_NAMES, 0)),
            _ => None,
        }
    }

    /// The valid values, as shown in error messages.
    fn valid(self) -> &'static str {
        match self {
            Field::Second | Field::Minute => "0-59",
            Field::Hour => "0-23",
            Field::DayOfMonth => "1-31",
            Field::Month => "1-12 or jan-dec",
            Field::DayOfWeek => "0-7 or sun-sat, where 0 and 7 are both sunday",
        }
    }

    /// Whether `?` may stand for `*` (a Quartz habit, harmless to accept).
    fn allows_question_mark(self) -> bool {
        matches!(self, Field::DayOfMonth | Field::DayOfWeek)
    }
}

/// A set of small numbers, one bit each.
pub(crate) type Bits = u64;

/// All values from `lo` to `hi` inclusive.
pub(crate) fn span(lo: u32, hi: u32) -> Bits {
    (lo..=hi).fold(0, |bits, v| bits | 1 << v)
}

/// What an expression means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Spec {
    /// Seconds 0-59 (only 0 for the 5-field form).
    pub(crate) seconds: Bits,
    /// Minutes 0-59.
    pub(crate) minutes: Bits,
    /// Hours 0-23.
    pub(crate) hours: Bits,
    /// Days of month 1-31.
    pub(crate) days_of_month: Bits,
    /// Months 1-12.
    pub(crate) months: Bits,
    /// Weekdays 0-6 with Sunday = 0 (a 7 in the expression is folded into 0).
    pub(crate) days_of_week: Bits,
    /// Vixie's rule: when both day fields are restricted (neither starts
    /// with `*`), a day matches if EITHER matches; otherwise both must.
    pub(crate) dom_or_dow: bool,
    /// Vixie's "fixed-time" job: second (6-field form), minute and hour do
    /// not start with `*`. Decides how clock changes are handled.
    pub(crate) fixed_time: bool,
    /// The 6-field form was used.
    pub(crate) has_seconds: bool,
}

/// Why an expression was rejected; becomes a [`crate::ScheduleError`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Problem {
    Syntax(String),
    NeverFires(String),
}

const ALIASES: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

/// Parses a whole expression (already trimmed).
pub(crate) fn parse(expression: &str) -> Result<Spec, Problem> {
    if expression.is_empty() {
        return Err(Problem::Syntax("the expression is empty".to_owned()));
    }
    if expression.starts_with('@') {
        return parse_alias(expression);
    }
    let fields: Vec<&str> = expression.split_ascii_whitespace().collect();
    match fields.as_slice() {
        [minute, hour, dom, month, dow] => parse_fields(None, minute, hour, dom, month, dow),
        [second, minute, hour, dom, month, dow] => {
            parse_fields(Some(second), minute, hour, dom, month, dow)
        }
        _ => Err(Problem::Syntax(format!(
            "found {} field{}",
            fields.len(),
            if fields.len() == 1 { "" } else { "s" }
        ))),
    }
}

fn parse_alias(expression: &str) -> Result<Spec, Problem> {
    if expression.split_ascii_whitespace().nth(1).is_some() {
        return Err(Problem::Syntax(
            "an alias such as @daily must be the whole expression".to_owned(),
        ));
    }
    let lowered = expression.to_ascii_lowercase();
    if lowered == "@reboot" {
        return Err(Problem::Syntax(
            "@reboot is not supported: schedules here are time-based, not tied to a start-up"
                .to_owned(),
        ));
    }
    match ALIASES.iter().find(|(alias, _)| *alias == lowered) {
        Some((_, meaning)) => parse(meaning),
        None => {
            let known: Vec<&str> = ALIASES.iter().map(|(alias, _)| *alias).collect();
            Err(Problem::Syntax(format!(
                "unknown alias \"{expression}\" (valid: {})",
                known.join(", ")
            )))
        }
    }
}

fn parse_fields(
    second: Option<&str>,
    minute: &str,
    hour: &str,
    dom: &str,
    month: &str,
    dow: &str,
) -> Result<Spec, Problem> {
    let field = |field, text| parse_field(field, text).map_err(Problem::Syntax);
    let seconds = match second {
        Some(text) => field(Field::Second, text)?,
        None => 1,
    };
    let minutes = field(Field::Minute, minute)?;
    let hours = field(Field::Hour, hour)?;
    let days_of_month = field(Field::DayOfMonth, dom)?;
    let months = field(Field::Month, month)?;
    let days_of_week = field(Field::DayOfWeek, dow)?;

    // Vixie decides on the first character only (DOM_STAR / DOW_STAR), so
    // `*/2` counts as a star too. `?` is our spelling of `*`.
    let is_star = |text: &str| text.starts_with('*') || text == "?";
    let dom_or_dow = !is_star(dom) && !is_star(dow);
    // Vixie's MIN_STAR / HR_STAR, extended to seconds for the 6-field form.
    let fixed_time = !minute.starts_with('*')
        && !hour.starts_with('*')
        && second.is_none_or(|s| !s.starts_with('*'));

    // With OR a restricted day-of-week always matches some day; with AND the
    // day-of-month must exist in one of the months. Every (month, day) pair
    // falls on every weekday within a 28-year cycle (Feb 29 included), so the
    // weekday never makes an otherwise possible date impossible.
    if !dom_or_dow {
        let possible = (1..=12u32)
            .filter(|m| months & 1 << m != 0)
            .any(|m| days_of_month & span(1, MAX_MONTH_DAYS[m as usize - 1]) != 0);
        if !possible {
            return Err(Problem::NeverFires(format!(
                "day-of-month \"{dom}\" never occurs in month \"{month}\""
            )));
        }
    }

    Ok(Spec {
        seconds,
        minutes,
        hours,
        days_of_month,
        months,
        days_of_week,
        dom_or_dow,
        fixed_time,
        has_seconds: second.is_some(),
    })
}

/// Parses one field: a comma list of `*`, `n`, `a-b`, `*/n`, `a-b/n`, `a/n`.
fn parse_field(field: Field, text: &str) -> Result<Bits, String> {
    let name = field.name();
    if text == "?" && field.allows_question_mark() {
        return Ok(span(field.min(), field.max()) & all_days(field));
    }
    if text.contains('?') {
        return Err(format!(
            "{name} \"{text}\" is not valid: \"?\" is only accepted as the whole \
             day-of-month or day-of-week field, meaning \"*\""
        ));
    }
    let mut bits = 0;
    for item in text.split(',') {
        if item.is_empty() {
            return Err(format!("{name} field \"{text}\" has an empty list item"));
        }
        bits |= parse_item(field, item)?;
    }
    Ok((bits & all_days(field)) | sunday_from_seven(field, bits))
}

/// Day-of-week keeps 0-6 only: 7 is folded into 0 by [`sunday_from_seven`].
fn all_days(field: Field) -> Bits {
    if field == Field::DayOfWeek {
        span(0, 6)
    } else {
        Bits::MAX
    }
}

/// 0 and 7 are both Sunday (crontab(5)), so 7 sets bit 0.
fn sunday_from_seven(field: Field, bits: Bits) -> Bits {
    if field == Field::DayOfWeek && bits & 1 << 7 != 0 {
        1
    } else {
        0
    }
}

fn parse_item(field: Field, item: &str) -> Result<Bits, String> {
    let name = field.name();
    let (range, step) = match item.split_once('/') {
        Some((range, step)) => (range, Some(parse_step(field, item, step)?)),
        None => (item, None),
    };
    let (lo, hi) = if range == "*" {
        (field.min(), field.max())
    } else if let Some((start, end)) = range.split_once('-') {
        if start.is_empty() {
            return Err(format!("{name} range \"{item}\" is missing its start"));
        }
        if end.is_empty() {
            return Err(format!("{name} range \"{item}\" is missing its end"));
        }
        if end.contains('-') {
            return Err(format!(
                "{name} range \"{item}\" is not valid (write a range as start-end)"
            ));
        }
        let lo = parse_value(field, item, start)?;
        // `fri-sun` reads naturally as Friday to Sunday; with Sunday = 0 it
        // would be a reversed range, so a closing `sun` means 7.
        let hi = if field == Field::DayOfWeek && lo > 0 && end.eq_ignore_ascii_case("sun") {
            7
        } else {
            parse_value(field, item, end)?
        };
        if lo > hi {
            return Err(reversed_range(field, range, lo, hi, step.is_none()));
        }
        (lo, hi)
    } else {
        let value = parse_value(field, item, range)?;
        // `a/n` is cronie's shorthand for `a-max/n`.
        (value, if step.is_some() { field.max() } else { value })
    };
    let step = step.unwrap_or(1) as usize;
    Ok((lo..=hi).step_by(step).fold(0, |bits, v| bits | 1 << v))
}

fn reversed_range(field: Field, range: &str, lo: u32, hi: u32, suggest_wrap: bool) -> String {
    let name = field.name();
    // Suggest the wrap-around the author probably meant, e.g. 22-2 -> 22-23,0-2.
    // For weekdays, 7 and 0 are the same day, so wrap at Saturday. (Not with
    // a step: its phase would restart at the wrap, so the rewrite is unclear.)
    let last = if field == Field::DayOfWeek {
        6
    } else {
        field.max()
    };
    let hint = if suggest_wrap && lo <= last {
        format!(
            "; to wrap around write \"{lo}-{last},{}-{hi}\"",
            field.min()
        )
    } else {
        String::new()
    };
    format!(
        "{name} range \"{range}\" is reversed: the start must not be after the end (valid: {}){hint}",
        field.valid()
    )
}

fn parse_step(field: Field, item: &str, step: &str) -> Result<u32, String> {
    let name = field.name();
    let max = field.max();
    if step.is_empty() || !step.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{name} step in \"{item}\" is not a number (valid steps: 1-{max})"
        ));
    }
    match step.parse::<u32>() {
        Ok(0) => Err(format!(
            "{name} step in \"{item}\" is zero (valid steps: 1-{max})"
        )),
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!(
            "{name} step in \"{item}\" is too large (valid steps: 1-{max})"
        )),
    }
}

/// Parses a single number or name of `field`, part of `item`.
fn parse_value(field: Field, item: &str, token: &str) -> Result<u32, String> {
    let name = field.name();
    let valid = field.valid();
    if !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) {
        return token
            .parse::<u32>()
            .ok()
            .filter(|v| (field.min()..=field.max()).contains(v))
            .ok_or_else(|| format!("{name} {token} is out of range (valid: {valid})"));
    }
    if token == "*" {
        return Err(format!(
            "{name} \"{item}\" is not valid: \"*\" cannot be part of a range (valid: {valid})"
        ));
    }
    match field.names() {
        Some((names, first)) if token.bytes().all(|b| b.is_ascii_alphabetic()) => names
            .iter()
            .position(|n| n.eq_ignore_ascii_case(token))
            .map(|i| i as u32 + first)
            .ok_or_else(|| {
                format!(
                    "{name} name \"{token}\" is unknown (valid: {})",
                    names.join(", ")
                )
            }),
        _ => Err(format!(
            "{name} \"{token}\" is not a number (valid: {valid})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(bits: Bits) -> Vec<u32> {
        (0..64).filter(|v| bits & 1 << v != 0).collect()
    }

    #[test]
    fn steps_and_ranges_expand_like_vixie() {
        assert_eq!(
            values(parse_field(Field::Minute, "*/15").unwrap()),
            [0, 15, 30, 45]
        );
        assert_eq!(
            values(parse_field(Field::Minute, "10-50/20").unwrap()),
            [10, 30, 50]
        );
        assert_eq!(
            values(parse_field(Field::Minute, "5/15").unwrap()),
            [5, 20, 35, 50]
        );
        assert_eq!(
            values(parse_field(Field::DayOfMonth, "*/10").unwrap()),
            [1, 11, 21, 31]
        );
        assert_eq!(
            values(parse_field(Field::Month, "*/5").unwrap()),
            [1, 6, 11]
        );
    }

    #[test]
    fn weekdays_fold_seven_into_sunday() {
        assert_eq!(
            values(parse_field(Field::DayOfWeek, "5-7").unwrap()),
            [0, 5, 6]
        );
        assert_eq!(values(parse_field(Field::DayOfWeek, "7").unwrap()), [0]);
        assert_eq!(
            values(parse_field(Field::DayOfWeek, "fri-sun").unwrap()),
            [0, 5, 6]
        );
        assert_eq!(
            values(parse_field(Field::DayOfWeek, "sun-sun").unwrap()),
            [0]
        );
        assert_eq!(
            values(parse_field(Field::DayOfWeek, "*").unwrap()),
            [0, 1, 2, 3, 4, 5, 6]
        );
        assert_eq!(
            values(parse_field(Field::DayOfWeek, "*/2").unwrap()),
            [0, 2, 4, 6]
        );
        assert_eq!(
            values(parse_field(Field::DayOfWeek, "?").unwrap()),
            [0, 1, 2, 3, 4, 5, 6]
        );
    }

    #[test]
    fn star_detection_follows_the_first_character() {
        let spec = parse("0 0 */2 * 1").unwrap();
        assert!(!spec.dom_or_dow);
        let spec = parse("0 0 1,15 * 1").unwrap();
        assert!(spec.dom_or_dow);
        assert!(spec.fixed_time);
        assert!(!parse("*/5 3 * * *").unwrap().fixed_time);
        assert!(!parse("0 */2 * * *").unwrap().fixed_time);
        assert!(parse("0,30 1-3 * * *").unwrap().fixed_time);
        assert!(!parse("* 0 1 * * *").unwrap().fixed_time);
    }
}
