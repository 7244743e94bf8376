//! The one error type of the crate.
//!
//! Its `Display` output is shown verbatim by the `#[cron]` proc-macro as a
//! compile error, so every message names the offending input, says what was
//! wrong and what would have been valid.

/// Why an expression or a time zone was rejected.
///
/// `Display` gives the complete human message, for example:
///
/// ```text
/// invalid cron expression "0 25 * * *": hour 25 is out of range (valid: 0-23); expected 5 fields "minute hour day-of-month month day-of-week", 6 fields with seconds first, or an alias such as @hourly
/// ```
#[non_exhaustive]
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ScheduleError {
    /// The expression is not valid cron syntax (field count, value, range,
    /// step, name or alias).
    #[error(
        "invalid cron expression \"{expression}\": {reason}; expected 5 fields \
         \"minute hour day-of-month month day-of-week\", 6 fields with seconds first, \
         or an alias such as @hourly"
    )]
    Syntax {
        /// The expression as written.
        expression: String,
        /// What was wrong with it, in lowercase words.
        reason: String,
    },

    /// The expression is well formed but no date ever matches it, such as
    /// February 30th (`0 0 30 2 *`).
    #[error("invalid cron expression \"{expression}\": it never fires ({reason})")]
    NeverFires {
        /// The expression as written.
        expression: String,
        /// Which fields cannot be satisfied together.
        reason: String,
    },

    /// The time zone is not an IANA name known to `chrono-tz`.
    #[error(
        "unknown time zone \"{name}\"{}: expected an IANA time zone name such as \
         \"Europe/Berlin\", \"America/New_York\" or \"UTC\"",
        did_you_mean(.suggestion.as_deref())
    )]
    UnknownTimeZone {
        /// The name as written.
        name: String,
        /// A known zone whose name differs only in case, spaces or a missing
        /// area prefix, if there is one.
        suggestion: Option<String>,
    },
}

fn did_you_mean(suggestion: Option<&str>) -> String {
    suggestion.map_or_else(String::new, |s| format!(" (did you mean \"{s}\"?)"))
}
