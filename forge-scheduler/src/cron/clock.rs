//! The database's clock as a leader follows it ([`DbClock`]).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use forge_core::{Leadership, Result};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::debug;

use super::ledger::{self, Reading};

/// The database's wall clock as one tenure of a role's leader follows it: the clock that
/// decides when a tick is due, as the ledger's instants, the claim's `early` and the gate do.
///
/// It is an estimate read on the role's lock session: `clock_timestamp()`, taken to have been
/// read at the middle of the statement's round trip, then carried forward on this node's
/// monotonic clock. The node's own wall clock plays no part, so a leader whose clock is minutes
/// ahead or behind, or is stepped, fires each tick when the database's clock reaches it.
///
/// Readings: a few at tenure start ([`DbClock::read`]), the answer of every gate, and one
/// every [`DbClock::REFRESH`] ([`DbClock::follow`]). A reading replaces the estimate when it is
/// at least as precise (its half round trip against the estimate's, grown by [`DRIFT`] since
/// it was made), or when the two disagree by more than both their errors: the database's clock
/// was stepped, and the step is followed from that reading on. Sleepers ([`DbClock::sleep_until`])
/// wake when a reading moves the estimate, and sleep again by the new one.
pub(super) struct DbClock {
    /// What the estimate's instants count from.
    base: Instant,
    estimate: Mutex<Estimate>,
    /// Sent when a reading moves the estimate by [`MOVED`] or more.
    moved: watch::Sender<()>,
}

/// How far two clocks may run apart per unit of time: 100 ppm (a computer's quartz is within
/// tens of ppm, and NTP keeps both the database's clock and this node's monotonic clock
/// closer), so an estimate made a minute ago may be 6 ms further off.
const DRIFT: f64 = 100e-6;

/// A move of the estimate that wakes the sleepers: smaller ones are within the error of a
/// reading.
const MOVED: i64 = 1_000;

/// One estimate of the database's clock, in microseconds.
#[derive(Clone, Copy, Debug)]
struct Estimate {
    /// The database's time minus the time since `base`.
    offset: i64,
    /// How far off it may have been when it was made: half its reading's round trip.
    error: i64,
    /// When it was made, since `base`: the middle of its reading's round trip.
    made: i64,
}

impl DbClock {
    /// How often [`DbClock::follow`] reads the database's clock besides the gates (which a
    /// tenure whose crons are rare, or claimed at their instant, seldom or never passes): a
    /// step of the database's clock is followed within this.
    pub(super) const REFRESH: Duration = Duration::from_secs(30);

    /// Readings at tenure start, the most precise kept: the first statement of a session can
    /// be slow.
    const FIRST_READINGS: usize = 3;

    /// Reads the database's clock on the role's lock session, at tenure start.
    pub(super) async fn read(leadership: &Leadership) -> Result<DbClock> {
        let clock = DbClock::new(ledger::read_clock(leadership).await?);
        for _ in 1..Self::FIRST_READINGS {
            clock.observe(&ledger::read_clock(leadership).await?);
        }
        Ok(clock)
    }

    fn new(first: Reading) -> DbClock {
        let base = first.sent;
        DbClock {
            base,
            estimate: Mutex::new(Estimate::from(base, &first)),
            moved: watch::Sender::new(()),
        }
    }

    /// Follows the database's clock while this leadership lasts: a reading every
    /// [`DbClock::REFRESH`].
    pub(super) async fn follow(&self, leadership: &Leadership) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Self::REFRESH) => {}
                _ = leadership.stopping() => return,
            }
            let bound = leadership.lease_duration();
            match tokio::time::timeout(bound, ledger::read_clock(leadership)).await {
                Ok(Ok(reading)) => self.observe(&reading),
                Ok(Err(err)) => {
                    debug!(target: "forge::cron", error = %err, "cannot read the database's clock; the estimate stands")
                }
                Err(_) => {
                    debug!(target: "forge::cron", "reading the database's clock got no answer in time; the estimate stands")
                }
            }
        }
    }

    /// Takes a reading into account (see [`DbClock`] for when it replaces the estimate).
    pub(super) fn observe(&self, reading: &Reading) {
        let new = Estimate::from(self.base, reading);
        let moved = {
            let mut current = self.estimate.lock().unwrap_or_else(PoisonError::into_inner);
            let aged = current.error + ((new.made - current.made).max(0) as f64 * DRIFT) as i64;
            let apart = (new.offset - current.offset).abs();
            if new.error <= aged || apart > new.error + aged {
                *current = new;
                apart
            } else {
                0
            }
        };
        if moved >= MOVED {
            self.moved.send_replace(());
        }
    }

    /// The database's time now, as far as this leader can tell.
    pub(super) fn now(&self) -> DateTime<Utc> {
        let now = self
            .offset_micros()
            .saturating_add(micros(self.base.elapsed()));
        DateTime::from_timestamp_micros(now).unwrap_or(DateTime::<Utc>::MAX_UTC)
    }

    /// The database's clock minus this node's monotonic clock (from an origin of its own): it
    /// grows by the step when the database's clock is stepped forward.
    pub(super) fn offset(&self) -> TimeDelta {
        TimeDelta::microseconds(self.offset_micros())
    }

    fn offset_micros(&self) -> i64 {
        self.estimate
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .offset
    }

    /// Sleeps until the database's clock reaches `at`, on the monotonic clock, sleeping again
    /// by the new estimate whenever a reading moves it.
    pub(super) async fn sleep_until(&self, at: DateTime<Utc>) {
        let mut moved = self.moved.subscribe();
        loop {
            let remaining = (at - self.now()).to_std().unwrap_or_default();
            if remaining.is_zero() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(remaining) => {}
                // The sender lives as long as `self`: an error is not reached.
                changed = moved.changed() => if changed.is_err() {
                    tokio::time::sleep(remaining).await;
                },
            }
        }
    }
}

impl Estimate {
    fn from(base: Instant, reading: &Reading) -> Estimate {
        let trip = micros(reading.received.saturating_duration_since(reading.sent));
        let made = micros(reading.sent.saturating_duration_since(base)) + trip / 2;
        Estimate {
            offset: reading.time.timestamp_micros() - made,
            error: trip / 2,
            made,
        }
    }
}

fn micros(d: Duration) -> i64 {
    d.as_micros().min(i64::MAX as u128) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    /// A reading sent `sent_ms` after `base` whose round trip took `trip_ms`, answering `time`.
    fn reading(base: Instant, sent_ms: u64, trip_ms: u64, time: DateTime<Utc>) -> Reading {
        let sent = base + Duration::from_millis(sent_ms);
        Reading {
            time,
            sent,
            received: sent + Duration::from_millis(trip_ms),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_reading_is_placed_at_the_middle_of_its_round_trip_and_carried_on_the_monotonic_clock()
     {
        let base = Instant::now();
        let clock = DbClock::new(reading(base, 0, 10, t(0)));
        // Read 5 ms after it was sent; now is 10 ms after.
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(clock.now(), t(5));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(clock.now(), t(60_005));
    }

    #[tokio::test(start_paused = true)]
    async fn a_more_precise_reading_replaces_the_estimate_and_a_coarser_one_that_agrees_does_not() {
        let base = Instant::now();
        let clock = DbClock::new(reading(base, 0, 10, t(0)));
        tokio::time::advance(Duration::from_millis(200)).await;
        // 2 ms round trip, answering 1 ms later than the estimate says: taken.
        clock.observe(&reading(base, 100, 2, t(101 - 5 + 1)));
        assert_eq!(clock.now(), t(200 - 5 + 1));
        // 40 ms round trip, within both errors of the estimate: not taken.
        clock.observe(&reading(base, 150, 40, t(150 + 20 - 5 + 10)));
        assert_eq!(clock.now(), t(200 - 5 + 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reading_that_disagrees_beyond_both_errors_is_a_step_and_is_followed() {
        let base = Instant::now();
        let clock = DbClock::new(reading(base, 0, 2, t(0)));
        tokio::time::advance(Duration::from_millis(100)).await;
        // The database's clock stepped back 10 minutes: a coarse reading shows it.
        clock.observe(&reading(base, 50, 40, t(70 - 1 - 600_000)));
        assert_eq!(clock.now(), t(100 - 1 - 600_000));
    }

    #[tokio::test(start_paused = true)]
    async fn an_estimate_ages_so_that_a_coarser_reading_later_replaces_it() {
        let base = Instant::now();
        let clock = DbClock::new(reading(base, 0, 2, t(0)));
        // 10 minutes on, the 1 ms estimate may be 60 ms further off: a 20 ms reading that says
        // the database's clock is 30 ms further on is better.
        tokio::time::advance(Duration::from_millis(600_020)).await;
        assert_eq!(clock.now(), t(600_019));
        clock.observe(&reading(base, 600_000, 20, t(600_009 + 30)));
        assert_eq!(clock.now(), t(600_019 + 30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleeper_wakes_when_a_reading_moves_the_estimate_past_its_instant() {
        let base = Instant::now();
        let clock = std::sync::Arc::new(DbClock::new(reading(base, 0, 0, t(0))));
        let sleeper = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep_until(t(600_000)).await }
        });
        while clock.moved.receiver_count() == 0 {
            tokio::task::yield_now().await;
        }
        // The database's clock steps 10 minutes forward.
        clock.observe(&reading(base, 0, 0, t(600_000)));
        sleeper.await.unwrap();
        assert!(
            base.elapsed() < Duration::from_secs(1),
            "slept {:?} by the monotonic clock",
            base.elapsed()
        );
    }
}
