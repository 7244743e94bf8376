//! [`Schedule`]: an expression in a time zone, and the instants it fires at.
//!
//! The engine yields matching wall-clock times; this module maps them to
//! instants with Vixie cron's rules for clock changes (see the crate docs):
//!
//! * fixed-time schedules fire once per wall-clock tick: at the first of two
//!   occurrences when clocks go back, at the moment of the jump when clocks
//!   go forward over it;
//! * wildcard schedules follow elapsed time: every instant whose wall clock
//!   matches fires, so a repeated time fires twice and a skipped one never.
//!
//! Every search is stateless (a function of the `after` instant) so the
//! iterators are trivially correct, and every loop is bounded.

use std::fmt;
use std::iter::FusedIterator;
use std::str::FromStr;

use chrono::{
    DateTime, FixedOffset, LocalResult, NaiveDate, NaiveDateTime, Offset, TimeDelta, TimeZone, Utc,
};
use chrono_tz::Tz;

use crate::engine::Engine;
use crate::error::ScheduleError;
use crate::parse::{self, Problem};
use crate::timezone::parse_timezone;

/// Cap on the clock changes a single search steps over. Real zones change
/// at most a few times a year and each step moves past one change, so this
/// is never reached; it only guarantees termination on absurd zone data.
const MAX_STEPS: usize = 1_000;

/// Cap on the ticks [`Schedule::latest_at_or_before`] walks forward. The walk
/// starts at (or right before) the answer, so it is a handful of ticks.
const MAX_SCAN: usize = 100_000;

/// Wider than any UTC offset (the tz database stays within ±15h) and than
/// any jump of the clock (Samoa skipped a whole day in 2011), so a window
/// this wide around a wall-clock time always contains the instant(s) that
/// show it, or the jump over it.
const MAX_SHIFT: TimeDelta = TimeDelta::hours(26);

/// A parsed cron expression in a time zone.
///
/// Create one with [`Schedule::parse`] (UTC) or [`Schedule::parse_in`]; ask
/// it for tick instants with [`Schedule::next_after`] and friends. All
/// instants are returned in UTC; ticks are whole seconds. The meaning of the
/// syntax and the behaviour across clock changes are described in the
/// [crate documentation](crate).
///
/// `Display` shows the expression as written, followed by the zone in
/// parentheses unless it is UTC: `0 9 * * 1-5 (Europe/Berlin)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    expression: String,
    tz: Tz,
    has_seconds: bool,
    fixed_time: bool,
    engine: Engine,
}

impl Schedule {
    /// Parses `expr` as a schedule in UTC.
    ///
    /// Leading and trailing whitespace is ignored.
    ///
    /// ```
    /// use forge_cron::Schedule;
    ///
    /// let weekdays = Schedule::parse("0 9 * * 1-5")?;
    /// assert_eq!(weekdays.to_string(), "0 9 * * 1-5");
    ///
    /// let err = Schedule::parse("0 25 * * *").unwrap_err();
    /// assert!(err.to_string().contains("hour 25 is out of range (valid: 0-23)"));
    /// # Ok::<(), forge_cron::ScheduleError>(())
    /// ```
    pub fn parse(expr: &str) -> Result<Schedule, ScheduleError> {
        let expression = expr.trim();
        let error = |problem| match problem {
            Problem::Syntax(reason) => ScheduleError::Syntax {
                expression: expression.to_owned(),
                reason,
            },
            Problem::NeverFires(reason) => ScheduleError::NeverFires {
                expression: expression.to_owned(),
                reason,
            },
        };
        let spec = parse::parse(expression).map_err(error)?;
        let engine = Engine::new(&spec).map_err(|reason| error(Problem::Syntax(reason)))?;
        Ok(Schedule {
            expression: expression.to_owned(),
            tz: Tz::UTC,
            has_seconds: spec.has_seconds,
            fixed_time: spec.fixed_time,
            engine,
        })
    }

    /// Parses `expr` as a schedule in the IANA time zone named `tz`, such as
    /// `"Europe/Berlin"` (see [`parse_timezone`]).
    ///
    /// ```
    /// use forge_cron::Schedule;
    ///
    /// let s = Schedule::parse_in("30 2 * * *", "America/New_York")?;
    /// assert_eq!(s.to_string(), "30 2 * * * (America/New_York)");
    /// # Ok::<(), forge_cron::ScheduleError>(())
    /// ```
    pub fn parse_in(expr: &str, tz: &str) -> Result<Schedule, ScheduleError> {
        let schedule = Schedule::parse(expr)?;
        Ok(schedule.with_timezone(parse_timezone(tz)?))
    }

    /// The same schedule, in the time zone `tz`.
    #[must_use]
    pub fn with_timezone(self, tz: Tz) -> Schedule {
        Schedule { tz, ..self }
    }

    /// The expression as written (trimmed).
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The time zone whose wall clock the expression is read in.
    pub fn timezone(&self) -> Tz {
        self.tz
    }

    /// Whether the expression uses the 6-field form with seconds first.
    pub fn has_seconds(&self) -> bool {
        self.has_seconds
    }

    /// Whether this is a fixed-time schedule in Vixie cron's sense: its
    /// minute and hour fields (and seconds, in the 6-field form) do not start
    /// with `*`. Fixed-time schedules fire once per matching wall-clock time
    /// across clock changes; the others follow elapsed time.
    pub fn is_fixed_time(&self) -> bool {
        self.fixed_time
    }

    /// The first tick strictly after `after`, or `None` if there is none
    /// before the end of the year 2100.
    ///
    /// ```
    /// use chrono::{TimeZone, Utc};
    /// use forge_cron::Schedule;
    ///
    /// let s = Schedule::parse("*/15 * * * *")?;
    /// let t = Utc.with_ymd_and_hms(2026, 5, 1, 10, 15, 0).unwrap();
    /// assert_eq!(s.next_after(t), Some(Utc.with_ymd_and_hms(2026, 5, 1, 10, 30, 0).unwrap()));
    /// # Ok::<(), forge_cron::ScheduleError>(())
    /// ```
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if after >= horizon_end() {
            return None;
        }
        // No tick exists this early; clamping keeps the offset arithmetic
        // below away from chrono's limits.
        let after = after.max(horizon_start());
        if self.tz == Tz::UTC {
            return self
                .engine
                .next_after(after.naive_utc())
                .map(|t| t.and_utc());
        }
        if self.fixed_time {
            self.next_fixed_time(after)
        } else {
            self.next_wildcard(after)
        }
    }

    /// All ticks strictly after `after`, in ascending order, without
    /// duplicates. The iterator ends after the year 2100.
    pub fn ticks_after(&self, after: DateTime<Utc>) -> Ticks<'_> {
        Ticks {
            schedule: self,
            cursor: Some(after),
            until: None,
        }
    }

    /// The ticks `t` with `after_exclusive < t <= until_inclusive`, in
    /// ascending order.
    ///
    /// The bounds suit a scheduler loop: pass the end of the previous window
    /// as `after_exclusive` and no tick is ever produced twice or skipped.
    pub fn ticks_between(
        &self,
        after_exclusive: DateTime<Utc>,
        until_inclusive: DateTime<Utc>,
    ) -> Ticks<'_> {
        Ticks {
            schedule: self,
            cursor: Some(after_exclusive),
            until: Some(until_inclusive),
        }
    }

    /// The most recent tick `t` with `not_before <= t <= at`, if any.
    ///
    /// Useful for catching up after downtime: "which tick should have fired
    /// last, given that nothing earlier than `not_before` matters?"
    ///
    /// ```
    /// use chrono::{TimeZone, Utc};
    /// use forge_cron::Schedule;
    ///
    /// let s = Schedule::parse("0 * * * *")?;
    /// let at = Utc.with_ymd_and_hms(2026, 5, 1, 10, 59, 0).unwrap();
    /// let ten = Utc.with_ymd_and_hms(2026, 5, 1, 10, 0, 0).unwrap();
    /// assert_eq!(s.latest_at_or_before(at, ten), Some(ten));
    /// assert_eq!(s.latest_at_or_before(at, at), None);
    /// # Ok::<(), forge_cron::ScheduleError>(())
    /// ```
    pub fn latest_at_or_before(
        &self,
        at: DateTime<Utc>,
        not_before: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        if not_before > at || at < horizon_start() {
            return None;
        }
        let at = at.min(horizon_end());
        // Start from a tick known to be at or before `at` (and normally the
        // answer itself), then walk forward to the last tick not after `at`.
        let start = match self.anchor_at_or_before(at) {
            Some(anchor) => anchor.max(not_before),
            None => not_before.max(horizon_start()),
        };
        let mut cursor = start - TimeDelta::nanoseconds(1);
        let mut latest = None;
        for _ in 0..MAX_SCAN {
            match self.next_after(cursor) {
                Some(tick) if tick <= at => {
                    latest = Some(tick);
                    cursor = tick;
                }
                _ => break,
            }
        }
        latest
    }

    /// Fixed-time rule: each matching wall-clock time fires once; a repeated
    /// one at its first occurrence, a skipped one when the clock jumps.
    fn next_fixed_time(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let tz = self.tz;
        // The instant of a wall-clock tick only grows with the wall-clock
        // time, so the answer is the first tick after `after`'s wall clock
        // whose instant is after `after`.
        let mut next = self.engine.next_after(wall_clock(tz, after));
        for _ in 0..MAX_STEPS {
            let tick = next?;
            match resolve(tz, tick) {
                LocalResult::Single(instant) => return Some(instant),
                LocalResult::Ambiguous(first, _) if first > after => return Some(first),
                LocalResult::Ambiguous(first, second) => {
                    // `after` is in the repeat of this range, whose ticks all
                    // fired in its first pass: resume where the repeat ends.
                    let back = fold_point(tz, first, second);
                    next = self.engine.next_at_or_after(tick + (back - first));
                }
                // Skipped ticks fire when the clock jumps over them. The next
                // call starts from the jump's wall clock, past the gap, so
                // several skipped ticks (and a regular tick at the jump) fire
                // once.
                LocalResult::None => return Some(gap_end(tz, tick)),
            }
        }
        None
    }

    /// Wildcard rule: fire at every instant whose wall clock matches.
    fn next_wildcard(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let tz = self.tz;
        let wall = wall_clock(tz, after);
        let mut next = self.engine.next_after(wall);

        // In the first pass of a repeated range, the repeat still lies ahead
        // and shows again wall-clock times at or before `wall`.
        if let LocalResult::Ambiguous(_, second) = resolve(tz, wall)
            && after < second
        {
            let back = fold_point(tz, after, second);
            // A tick later in the first pass comes before any repeat.
            if let Some(tick) = next
                && let LocalResult::Ambiguous(first, _) = resolve(tz, tick)
                && first < back
            {
                return Some(first);
            }
            // Else the first tick of the repeat, if it shows a time the first
            // pass already went by (later ones are found below anyway).
            if let Some(tick) = self.engine.next_at_or_after(wall_clock(tz, back))
                && tick <= wall
            {
                return resolve(tz, tick).latest();
            }
        }

        for _ in 0..MAX_STEPS {
            let tick = next?;
            match resolve(tz, tick) {
                LocalResult::Single(instant) => return Some(instant),
                // Past `after`'s wall clock, the first occurrence is the
                // answer unless `after` is already in the repeat.
                LocalResult::Ambiguous(first, second) => {
                    return Some(if first > after { first } else { second });
                }
                // A skipped time does not fire; go on from the end of the gap.
                LocalResult::None => {
                    next = self
                        .engine
                        .next_at_or_after(wall_clock(tz, gap_end(tz, tick)));
                }
            }
        }
        None
    }

    /// A tick instant at or before `at`, normally the latest one; `None` if
    /// none was found (then there is no tick since 1970, or only in the
    /// first pass of a repeated range ahead of `at`'s wall clock).
    fn anchor_at_or_before(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let tz = self.tz;
        let wall = wall_clock(tz, at);
        let mut tick = match resolve(tz, wall) {
            // `at` is in the repeat of a range: the first pass is entirely
            // in the past, including ticks showing later wall-clock times.
            LocalResult::Ambiguous(first, second) if second <= at => {
                let back = fold_point(tz, first, second);
                if !self.fixed_time {
                    let last = self.engine.last_at_or_before(wall);
                    if let Some(tick) = last
                        && tick >= wall_clock(tz, back)
                    {
                        return resolve(tz, tick).latest();
                    }
                }
                let first_pass_end = wall + (back - first);
                self.engine
                    .last_at_or_before(first_pass_end - TimeDelta::nanoseconds(1))?
            }
            _ => self.engine.last_at_or_before(wall)?,
        };
        for _ in 0..MAX_STEPS {
            match resolve(tz, tick) {
                LocalResult::Single(instant) => return Some(instant),
                LocalResult::Ambiguous(first, second) => {
                    return Some(if !self.fixed_time && second <= at {
                        second
                    } else {
                        first
                    });
                }
                LocalResult::None if self.fixed_time => return Some(gap_end(tz, tick)),
                // A skipped time does not fire: look before the gap.
                LocalResult::None => {
                    let before_gap = gap_end(tz, tick) - TimeDelta::seconds(1);
                    tick = self.engine.last_at_or_before(wall_clock(tz, before_gap))?;
                }
            }
        }
        None
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.expression)?;
        if self.tz != Tz::UTC {
            write!(f, " ({})", self.tz.name())?;
        }
        Ok(())
    }
}

impl FromStr for Schedule {
    type Err = ScheduleError;

    /// Same as [`Schedule::parse`] (UTC).
    fn from_str(s: &str) -> Result<Schedule, ScheduleError> {
        Schedule::parse(s)
    }
}

/// Iterator over tick instants in ascending order, from
/// [`Schedule::ticks_after`] or [`Schedule::ticks_between`].
#[derive(Clone, Debug)]
pub struct Ticks<'a> {
    schedule: &'a Schedule,
    /// The last instant returned (or the exclusive start); `None` once done.
    cursor: Option<DateTime<Utc>>,
    /// Inclusive end, if any.
    until: Option<DateTime<Utc>>,
}

impl Iterator for Ticks<'_> {
    type Item = DateTime<Utc>;

    fn next(&mut self) -> Option<DateTime<Utc>> {
        let cursor = self.cursor?;
        // `next_after` is strictly increasing; checking it here too means no
        // bug there could ever turn this iterator into an endless loop.
        let tick = self
            .schedule
            .next_after(cursor)
            .filter(|tick| *tick > cursor && self.until.is_none_or(|until| *tick <= until));
        self.cursor = tick;
        tick
    }
}

impl FusedIterator for Ticks<'_> {}

/// Before the first tick the engine can produce (1970).
fn horizon_start() -> DateTime<Utc> {
    utc_midnight(1969, 1, 1)
}

/// After the last tick the engine can produce (2100), in any zone.
fn horizon_end() -> DateTime<Utc> {
    utc_midnight(2101, 1, 2)
}

fn utc_midnight(year: i32, month: u32, day: u32) -> DateTime<Utc> {
    NaiveDate::from_ymd_opt(year, month, day)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(DateTime::UNIX_EPOCH, |t| t.and_utc())
}

/// What the clocks of `tz` show at `instant`.
fn wall_clock(tz: Tz, instant: DateTime<Utc>) -> NaiveDateTime {
    instant.with_timezone(&tz).naive_local()
}

/// The instant(s) at which the clocks of `tz` show `wall`.
fn resolve(tz: Tz, wall: NaiveDateTime) -> LocalResult<DateTime<Utc>> {
    tz.from_local_datetime(&wall)
        .map(|local| local.with_timezone(&Utc))
}

fn offset(tz: Tz, instant: DateTime<Utc>) -> FixedOffset {
    tz.offset_from_utc_datetime(&instant.naive_utc()).fix()
}

/// The moment the clock jumps over the nonexistent wall-clock time `wall`:
/// the first instant whose wall clock is past it.
fn gap_end(tz: Tz, wall: NaiveDateTime) -> DateTime<Utc> {
    let guess = wall.and_utc();
    // 26 hours before `wall`-as-UTC, the wall clock shows an earlier time;
    // 26 hours after, a later one (see MAX_SHIFT). In between it crosses
    // `wall` only by the jump.
    first_second_where(guess - MAX_SHIFT, guess + MAX_SHIFT, |instant| {
        wall_clock(tz, instant) > wall
    })
}

/// The moment clocks go back, given an instant `first` before it and an
/// instant `second` at or after it within the repeated range.
fn fold_point(tz: Tz, first: DateTime<Utc>, second: DateTime<Utc>) -> DateTime<Utc> {
    let before = offset(tz, first);
    first_second_where(first, second, |instant| offset(tz, instant) != before)
}

/// Bisects for the first whole second in `(lo, hi]` at which `pred` holds,
/// given that it does not at `lo` and does at `hi`. Zone changes happen on
/// whole seconds, so that is where they are found. At most ~64 steps.
fn first_second_where(
    lo: DateTime<Utc>,
    hi: DateTime<Utc>,
    pred: impl Fn(DateTime<Utc>) -> bool,
) -> DateTime<Utc> {
    // Within the supported years the timestamps are always valid.
    let at = |secs: i64| DateTime::from_timestamp(secs, 0).unwrap_or(DateTime::UNIX_EPOCH);
    let (mut lo, mut hi) = (lo.timestamp(), hi.timestamp());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if pred(at(mid)) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    at(hi)
}
