//! Wall-clock tick search on top of the `cron` crate.
//!
//! The `cron` crate is the matching engine, but it only ever receives
//! explicit value lists in its own 7-field syntax (`sec min hour dom month
//! dow year`, Sunday = 1), built here from a [`Spec`]. It is iterated over
//! `Utc` while the values are really wall-clock times of the schedule's zone:
//! the time-zone rules are applied afterwards, in `schedule.rs`, because the
//! crate's own local-zone iteration fires a repeated 01:30 twice.

use std::str::FromStr;

use chrono::{Datelike, NaiveDate, NaiveDateTime, TimeDelta, Timelike};

use crate::parse::{Bits, Spec, span};

/// The `cron` crate only knows the years 1970-2100; before and after that
/// nothing matches.
const FIRST_YEAR: i32 = 1970;
const LAST_YEAR: i32 = 2100;

/// The wall-clock times matching a [`Spec`], in ascending order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Engine {
    primary: cron::Schedule,
    /// Vixie ORs a restricted day-of-month with a restricted day-of-week,
    /// while the `cron` crate ANDs them. The OR is the union of two
    /// schedules: `primary` restricts the day of month only, this one the
    /// weekday only.
    secondary: Option<cron::Schedule>,
}

impl Engine {
    /// Builds the `cron` schedules; fails only if the `cron` crate rejects a
    /// list we built, which would be a bug here.
    pub(crate) fn new(spec: &Spec) -> Result<Engine, String> {
        let sec = list(spec.seconds, 0, 59, 0);
        let min = list(spec.minutes, 0, 59, 0);
        let hour = list(spec.hours, 0, 23, 0);
        let dom = list(spec.days_of_month, 1, 31, 0);
        let month = list(spec.months, 1, 12, 0);
        // Our weekdays are 0-6 from Sunday; the `cron` crate counts 1-7.
        let dow = list(spec.days_of_week, 0, 6, 1);
        let time = format!("{sec} {min} {hour}");

        let (primary, secondary) = match (spec.dom_or_dow, dom.as_str(), dow.as_str()) {
            // With OR, an unrestricted side matches every day on its own.
            (true, "*", _) | (true, _, "*") => (format!("{time} * {month} * *"), None),
            (true, _, _) => (
                format!("{time} {dom} {month} * *"),
                Some(format!("{time} * {month} {dow} *")),
            ),
            (false, _, _) => (format!("{time} {dom} {month} {dow} *"), None),
        };
        let build = |source: &str| {
            cron::Schedule::from_str(source)
                .map_err(|e| format!("internal error: the cron engine rejected \"{source}\": {e}"))
        };
        Ok(Engine {
            primary: build(&primary)?,
            secondary: secondary.as_deref().map(build).transpose()?,
        })
    }

    /// The first matching wall-clock time strictly after `t`.
    pub(crate) fn next_after(&self, t: NaiveDateTime) -> Option<NaiveDateTime> {
        if t.year() > LAST_YEAR {
            return None;
        }
        // Earlier than this nothing matches, and clamping keeps the `cron`
        // crate's `t + 1s` and our offsets far from chrono's limits.
        let t = t.max(first_instant());
        let next = |s: &cron::Schedule| s.after(&t.and_utc()).next().map(|d| d.naive_utc());
        earliest(next(&self.primary), self.secondary.as_ref().and_then(next))
    }

    /// The first matching wall-clock time at or after `t`.
    pub(crate) fn next_at_or_after(&self, t: NaiveDateTime) -> Option<NaiveDateTime> {
        // Ticks are whole seconds; `cron` searches from the whole second after
        // its argument. (Clamped first so that `t - 1s` cannot overflow.)
        let t = t.max(first_instant());
        if t.nanosecond() == 0 {
            self.next_after(t - TimeDelta::seconds(1))
        } else {
            self.next_after(t)
        }
    }

    /// The last matching wall-clock time at or before `t`.
    pub(crate) fn last_at_or_before(&self, t: NaiveDateTime) -> Option<NaiveDateTime> {
        if t.year() < FIRST_YEAR {
            return None;
        }
        // Nothing matches after the last supported second, and clamping to it
        // keeps `t + 1s` in range.
        let t = t.min(after_last_instant() - TimeDelta::seconds(1));
        // `cron` searches backwards from the whole second before its argument
        // when that has no fraction, and from its own second otherwise.
        let before = if t.nanosecond() == 0 {
            t + TimeDelta::seconds(1)
        } else {
            t
        };
        let prev = |s: &cron::Schedule| {
            s.after(&before.and_utc())
                .next_back()
                .map(|d| d.naive_utc())
        };
        prev(&self.primary).max(self.secondary.as_ref().and_then(prev))
    }
}

fn first_instant() -> NaiveDateTime {
    NaiveDate::from_ymd_opt(FIRST_YEAR - 1, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap_or(NaiveDateTime::MIN)
}

fn after_last_instant() -> NaiveDateTime {
    NaiveDate::from_ymd_opt(LAST_YEAR + 1, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap_or(NaiveDateTime::MAX)
}

/// The earlier of two optional times (`Option::min` would prefer `None`).
fn earliest<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A field for the `cron` crate: `*` when every value from `lo` to `hi` is
/// present, else the explicit comma list with `shift` added to each value.
fn list(bits: Bits, lo: u32, hi: u32, shift: u32) -> String {
    if bits & span(lo, hi) == span(lo, hi) {
        return "*".to_owned();
    }
    (lo..=hi)
        .filter(|v| bits & 1 << v != 0)
        .map(|v| (v + shift).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    fn at(s: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S").unwrap()
    }

    #[test]
    fn builds_explicit_lists_in_cron_crate_numbering() {
        let engine = Engine::new(&parse("0 9 * * 1-5").unwrap()).unwrap();
        assert_eq!(engine.primary.source(), "0 0 9 * * 2,3,4,5,6 *");
        assert!(engine.secondary.is_none());

        let engine = Engine::new(&parse("0 0 13 * 5").unwrap()).unwrap();
        assert_eq!(engine.primary.source(), "0 0 0 13 * * *");
        assert_eq!(engine.secondary.unwrap().source(), "0 0 0 * * 6 *");
    }

    #[test]
    fn searches_are_inclusive_or_exclusive_as_named() {
        let engine = Engine::new(&parse("0 12 * * *").unwrap()).unwrap();
        let noon = at("2026-05-01 12:00:00");
        assert_eq!(engine.next_after(noon), Some(at("2026-05-02 12:00:00")));
        assert_eq!(engine.next_at_or_after(noon), Some(noon));
        assert_eq!(engine.last_at_or_before(noon), Some(noon));
        let just_before = noon - TimeDelta::nanoseconds(1);
        assert_eq!(engine.next_after(just_before), Some(noon));
        assert_eq!(engine.next_at_or_after(just_before), Some(noon));
        assert_eq!(
            engine.last_at_or_before(just_before),
            Some(at("2026-04-30 12:00:00"))
        );
    }

    #[test]
    fn stays_inside_the_supported_years() {
        let engine = Engine::new(&parse("* * * * * *").unwrap()).unwrap();
        assert_eq!(engine.next_after(NaiveDateTime::MAX), None);
        assert_eq!(
            engine.next_after(NaiveDateTime::MIN),
            Some(at("1970-01-01 00:00:00"))
        );
        assert_eq!(engine.last_at_or_before(NaiveDateTime::MIN), None);
        assert_eq!(
            engine.last_at_or_before(NaiveDateTime::MAX),
            Some(at("2100-12-31 23:59:59"))
        );
        assert_eq!(engine.next_after(at("2100-12-31 23:59:59")), None);
    }
}
