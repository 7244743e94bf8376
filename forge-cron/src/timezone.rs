//! Time-zone names.

use chrono_tz::{TZ_VARIANTS, Tz};

use crate::error::ScheduleError;

/// Looks up an IANA time zone by its exact name, such as `"Europe/Berlin"`,
/// `"America/New_York"` or `"UTC"`.
///
/// Names are case-sensitive, as in the tz database. When the name is not
/// known, the error suggests a zone whose name differs only in case, spaces
/// instead of underscores or a missing area (`"berlin"` → `"Europe/Berlin"`).
///
/// ```
/// use forge_cron::parse_timezone;
///
/// assert_eq!(parse_timezone("Europe/Berlin")?, chrono_tz::Europe::Berlin);
/// let err = parse_timezone("europe/berlin").unwrap_err();
/// assert!(err.to_string().contains("did you mean \"Europe/Berlin\"?"));
/// # Ok::<(), forge_cron::ScheduleError>(())
/// ```
pub fn parse_timezone(name: &str) -> Result<Tz, ScheduleError> {
    name.parse::<Tz>()
        .map_err(|_| ScheduleError::UnknownTimeZone {
            name: name.to_owned(),
            suggestion: suggest(name).map(|tz| tz.name().to_owned()),
        })
}

/// A zone the author probably meant. Only runs on the error path, so a
/// linear scan of the ~600 names is fine.
fn suggest(name: &str) -> Option<Tz> {
    let wanted = normalize(name);
    if wanted.is_empty() {
        return None;
    }
    let whole = TZ_VARIANTS.iter().find(|tz| normalize(tz.name()) == wanted);
    let city = || {
        TZ_VARIANTS.iter().find(|tz| {
            tz.name()
                .rsplit_once('/')
                .is_some_and(|(_, city)| normalize(city) == wanted)
        })
    };
    whole.or_else(city).copied()
}

fn normalize(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace(' ', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_by_case_spaces_and_city() {
        assert_eq!(
            suggest("america/new york"),
            Some(chrono_tz::America::New_York)
        );
        assert_eq!(suggest("Berlin"), Some(chrono_tz::Europe::Berlin));
        assert_eq!(suggest(" utc "), Some(Tz::UTC));
        assert_eq!(suggest("Mars/Olympus_Mons"), None);
        assert_eq!(suggest(""), None);
    }
}
