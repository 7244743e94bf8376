//! Cron expressions with their standard meaning, and time-zone aware tick
//! computation.
//!
//! FORGE users write `#[cron("0 9 * * 1-5")]`. This crate gives such an
//! expression the meaning it has in Vixie cron and `crontab(5)`, and computes
//! the instants at which it fires in a time zone, handling daylight-saving
//! changes the way Vixie cron does. It is used at compile time by the
//! proc-macro (to validate expressions and zones: errors are human messages)
//! and at run time by the scheduler.
//!
//! ```
//! use chrono::{TimeZone, Utc};
//! use forge_cron::Schedule;
//!
//! let s = Schedule::parse_in("0 9 * * 1-5", "Europe/Berlin")?;
//! // Friday 2026-05-01 10:00 UTC is 12:00 in Berlin; next is Monday 09:00 CEST.
//! let friday = Utc.with_ymd_and_hms(2026, 5, 1, 10, 0, 0).unwrap();
//! assert_eq!(s.next_after(friday), Some(Utc.with_ymd_and_hms(2026, 5, 4, 7, 0, 0).unwrap()));
//! # Ok::<(), forge_cron::ScheduleError>(())
//! ```
//!
//! # Syntax
//!
//! An expression is one of:
//!
//! * 5 fields: `minute hour day-of-month month day-of-week`;
//! * 6 fields: `second minute hour day-of-month month day-of-week` (seconds
//!   first; the 5-field form fires at second 0);
//! * an alias (case-insensitive): `@yearly` and `@annually` (`0 0 1 1 *`),
//!   `@monthly` (`0 0 1 * *`), `@weekly` (`0 0 * * 0`), `@daily` and
//!   `@midnight` (`0 0 * * *`), `@hourly` (`0 * * * *`).
//!
//! Fields are separated by spaces or tabs. The valid values are:
//!
//! | field        | values                                              |
//! |--------------|-----------------------------------------------------|
//! | second       | 0-59                                                |
//! | minute       | 0-59                                                |
//! | hour         | 0-23                                                |
//! | day-of-month | 1-31                                                |
//! | month        | 1-12, or `jan`-`dec`                                |
//! | day-of-week  | 0-7 (0 and 7 are both Sunday), or `sun`-`sat`       |
//!
//! Each field is a comma-separated list of items, each item one of:
//!
//! * `*`: every value;
//! * `n`: one value;
//! * `a-b`: the values from `a` to `b` inclusive (`a` must not be after `b`;
//!   to wrap around, write two ranges such as `22-23,0-2`);
//! * `*/n`: every `n`th value starting at the first (`*/15` in the minute
//!   field is 0,15,30,45);
//! * `a-b/n`: every `n`th value from `a` to `b` (`10-50/20` is 10,30,50);
//! * `a/n`: every `n`th value from `a` to the end of the field, as in Vixie
//!   cron and cronie (`5/15` is 5,20,35,50).
//!
//! Steps go from 1 up to the field's largest value. Month and weekday names
//! are three letters, case-insensitive, and work anywhere a number does,
//! including ranges (`mon-fri`, `jan-mar`). Because 7 is also Sunday,
//! `5-7` and `fri-sun` both mean Friday, Saturday and Sunday (`sun` ending a
//! range that starts later in the week counts as 7). `?` is accepted as the
//! whole day-of-month or day-of-week field and means `*` (a Quartz habit).
//!
//! ## Day of month and day of week
//!
//! As in Vixie cron: if either field starts with `*` (including `*/n`, and
//! `?`), a day must match both, which in practice means only the other field
//! restricts it. If both fields are restricted, a day matches when **either**
//! matches: `0 0 13 * 5` fires on every 13th of the month *and* every Friday,
//! while `0 0 * * 5` fires on Fridays only.
//!
//! ## Errors
//!
//! [`Schedule::parse`] rejects, with a message naming the problem and what
//! is valid: a wrong number of fields, values out of range, zero or
//! oversized or non-numeric steps, reversed ranges (`5-1`), empty list items
//! (`1,,2`), unknown names and aliases, `?` outside the day fields, and
//! expressions that can never fire, such as February 30th (`0 0 30 2 *`).
//!
//! ```
//! let err = forge_cron::Schedule::parse("0 25 * * *").unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "invalid cron expression \"0 25 * * *\": hour 25 is out of range (valid: 0-23); \
//!      expected 5 fields \"minute hour day-of-month month day-of-week\", \
//!      6 fields with seconds first, or an alias such as @hourly",
//! );
//! ```
//!
//! # Time zones and daylight saving
//!
//! A schedule reads its expression on the wall clock of an IANA time zone
//! ([`Schedule::parse_in`], [`parse_timezone`]); the default is UTC, which
//! has no clock changes. All results are UTC instants, strictly increasing
//! and without duplicates. When the clocks change, Vixie cron's rule
//! applies, which depends on the kind of schedule:
//!
//! * **Fixed-time** schedules, whose minute and hour fields (and second
//!   field, in the 6-field form) do not start with `*`, such as `30 1 * * *`
//!   or `0 9 * * 1-5`, fire once for every matching wall-clock time:
//!   * a time that occurs twice (clocks go back) fires at its **first**
//!     occurrence only;
//!   * a time that is skipped (clocks go forward) fires at the moment of the
//!     jump, i.e. the first instant after it. Several skipped times, and a
//!     regular tick at the moment of the jump, fire once together.
//! * **Wildcard** schedules, whose minute or hour (or second) field starts
//!   with `*`, such as `*/15 * * * *`, `30 * * * *` or `0 */2 * * *`, follow
//!   elapsed time: they fire at every instant whose wall clock matches, so a
//!   repeated time fires in both passes and a skipped time does not fire.
//!
//! Examples, with `next_after` iterated from before each change
//! ([`Schedule::ticks_after`]):
//!
//! | zone, change                     | expression     | fires at (UTC)                                                 |
//! |----------------------------------|----------------|----------------------------------------------------------------|
//! | America/New_York, 2026-03-08 02:00 EST → 03:00 EDT | `30 2 * * *`   | 07:00 (03:00 EDT, the jump)                       |
//! | America/New_York, 2026-11-01 02:00 EDT → 01:00 EST | `30 1 * * *`   | 05:30 (01:30 EDT) only                            |
//! | America/New_York, 2026-11-01     | `*/30 * * * *` | 05:00, 05:30 (EDT), 06:00, 06:30 (EST again), 07:00            |
//! | Europe/Berlin, 2026-03-29 02:00 CET → 03:00 CEST   | `30 2 * * *`   | 01:00 (03:00 CEST, the jump)                      |
//! | Europe/Berlin, 2026-03-29        | `*/30 * * * *` | 00:30 (01:30 CET), 01:00 (03:00 CEST); 02:00 and 02:30 do not exist |
//! | Europe/Berlin, 2026-10-25 03:00 CEST → 02:00 CET   | `30 2 * * *`   | 00:30 (02:30 CEST) only                           |
//! | Europe/Berlin, 2026-10-25        | `*/30 * * * *` | 00:00, 00:30 (CEST), 01:00, 01:30 (CET again), 02:00           |
//!
//! ```
//! use chrono::{TimeZone, Utc};
//! use forge_cron::Schedule;
//!
//! let utc = |h, m| Utc.with_ymd_and_hms(2026, 11, 1, h, m, 0).unwrap();
//! let fixed = Schedule::parse_in("30 1 * * *", "America/New_York")?;
//! let fires: Vec<_> = fixed.ticks_between(utc(0, 0), utc(12, 0)).collect();
//! assert_eq!(fires, [utc(5, 30)]);
//!
//! let wildcard = Schedule::parse_in("*/30 * * * *", "America/New_York")?;
//! let fires: Vec<_> = wildcard.ticks_between(utc(4, 45), utc(7, 0)).collect();
//! assert_eq!(fires, [utc(5, 0), utc(5, 30), utc(6, 0), utc(6, 30), utc(7, 0)]);
//! # Ok::<(), forge_cron::ScheduleError>(())
//! ```
//!
//! # Range
//!
//! Ticks are computed for the years 1970 to 2100 (the range of the `cron`
//! crate, which does the matching); searches past that end return `None`.
//! Every search is bounded and never panics.

mod engine;
mod error;
mod parse;
mod schedule;
mod timezone;

pub use error::ScheduleError;
pub use schedule::{Schedule, Ticks};
pub use timezone::parse_timezone;
