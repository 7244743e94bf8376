//! Rates: claims per window (`"100/1m"`), for cluster-wide rate limits.

use std::time::Duration;

use crate::parse_duration;

/// The largest count of a rate or a global concurrency (a row per claim is kept for a rate).
pub const MAX_LIMIT: u32 = 1_000_000;

/// Parses a rate, `"COUNT/WINDOW"` (`"100/1m"`): a count from 1 to [`MAX_LIMIT`] and a window
/// of at least 1 ms. The error says what is wrong and shows a valid rate.
pub fn parse_rate(text: &str) -> Result<(u32, Duration), String> {
    let (count, per) = text.split_once('/').ok_or_else(|| {
        format!("{text:?} is not a rate: write claims per window, such as \"100/1m\"")
    })?;
    let count: u32 = count.trim().parse().map_err(|_| {
        format!("{text:?}: the count before '/' must be a whole number, such as \"100/1m\"")
    })?;
    if count == 0 || count > MAX_LIMIT {
        return Err(format!(
            "{text:?}: the count must be between 1 and {MAX_LIMIT} (to stop a queue, pause it)"
        ));
    }
    let per = parse_duration(per.trim()).map_err(|err| format!("{text:?}: {err}"))?;
    if per < Duration::from_millis(1) {
        return Err(format!("{text:?}: the window must be at least 1ms"));
    }
    Ok((count, per))
}
