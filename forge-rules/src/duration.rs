//! Durations as written in `forge.toml` and in attributes: `"5s"`, `"250ms"`, `"1m 30s"`.

use std::time::Duration;

/// The longest duration FORGE accepts anywhere: about ten years. Longer values are almost
/// certainly typos (`"300000y"`), and they would overflow the arithmetic on instants that
/// timers and catch-up windows do.
pub const MAX_DURATION: Duration = Duration::from_secs(315_576_000);

/// Parses a human duration and checks it against [`MAX_DURATION`]. The error is a whole
/// message that says what is valid.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|err| {
        format!(
            "invalid duration {text:?} ({err}): use a number with a unit, such as \"5s\", \"250ms\" or \"1m 30s\""
        )
    })?;
    check_duration(duration).map_err(|message| format!("duration {text:?}: {message}"))?;
    Ok(duration)
}

/// Checks a duration given in code against [`MAX_DURATION`].
pub fn check_duration(duration: Duration) -> Result<(), String> {
    if duration > MAX_DURATION {
        Err(format!(
            "{} is longer than the longest duration FORGE accepts ({})",
            format_duration(duration),
            format_duration(MAX_DURATION)
        ))
    } else {
        Ok(())
    }
}

/// A duration as humans write it: `1m 30s`, `250ms`.
pub fn format_duration(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_human_durations_within_bounds() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("9y").unwrap().as_secs(), 9 * 31_557_600);
        let err = parse_duration("300000y").unwrap_err();
        assert!(err.contains("longer than the longest"), "{err}");
        let err = parse_duration("ten seconds").unwrap_err();
        assert!(err.contains("\"5s\""), "{err}");
        assert!(check_duration(Duration::MAX).is_err());
    }
}
