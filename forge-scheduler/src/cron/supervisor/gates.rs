//! The gate's latest answer, shared by the cron loops of one tenure.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// The latest database time at which the gate found this tenure the current one. A tick whose
/// instant is at or before it passes the gate without asking again: the gate's promise - a
/// tick started by this tenure has its instant at or before a time at which the tenure was
/// current, so before any newer tenure's `acquired_at` (docs/src/architecture/crons.md, "Claiming ahead") -
/// holds for it as it did for the ticks of the answer. So the ticks due at one instant need
/// one read, even when they wake across two timer ticks and the second batch would otherwise
/// wait for the session behind the first runs' outcomes.
///
/// One answer covers only the ticks within `claim_ahead` before it: the ticks of its own
/// instant and those that woke a timer tick later. An answer read while the database's clock
/// had been stepped far ahead would otherwise let every later tick of the tenure start without
/// a gate, long after the tenure might have ended.
#[derive(Debug)]
pub(super) struct GatePassed {
    at: std::sync::atomic::AtomicI64,
    /// `[cron] claim_ahead`, in microseconds.
    reach: i64,
}

impl GatePassed {
    pub(super) fn new(claim_ahead: Duration) -> GatePassed {
        GatePassed {
            at: std::sync::atomic::AtomicI64::new(i64::MIN),
            reach: claim_ahead.as_micros().min(i64::MAX as u128) as i64,
        }
    }

    pub(super) fn record(&self, at: DateTime<Utc>) {
        self.at
            .fetch_max(at.timestamp_micros(), std::sync::atomic::Ordering::AcqRel);
    }

    /// The recorded time, if `tick` is at or before it and within `claim_ahead` of it.
    pub(super) fn covers(&self, tick: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let at = self.at.load(std::sync::atomic::Ordering::Acquire);
        let tick = tick.timestamp_micros();
        (at >= tick && at.saturating_sub(tick) <= self.reach)
            .then(|| DateTime::from_timestamp_micros(at))
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_answer_covers_the_ticks_at_or_before_it_and_only_grows() {
        let passed = GatePassed::new(Duration::from_millis(50));
        let t = |ms: i64| DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap();
        assert_eq!(passed.covers(t(0)), None, "nothing passed yet");
        passed.record(t(2));
        assert_eq!(passed.covers(t(0)), Some(t(2)));
        assert_eq!(
            passed.covers(t(2)),
            Some(t(2)),
            "the instant itself is covered"
        );
        assert_eq!(
            passed.covers(t(3)),
            None,
            "a later instant needs its own gate"
        );
        passed.record(t(1));
        assert_eq!(
            passed.covers(t(2)),
            Some(t(2)),
            "an older answer does not move it back"
        );
    }

    #[test]
    fn a_gate_answer_covers_only_the_ticks_within_claim_ahead_before_it() {
        let passed = GatePassed::new(Duration::from_millis(50));
        let t = |ms: i64| DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap();
        // Read while the database's clock was an hour ahead.
        passed.record(t(3_600_000));
        assert_eq!(
            passed.covers(t(1_000)),
            None,
            "a tick an hour before the answer asks the gate again"
        );
        assert_eq!(passed.covers(t(3_600_000 - 50)), Some(t(3_600_000)));
        assert_eq!(passed.covers(t(3_600_000 - 51)), None);
    }
}
