//! What a follower has seen of the leader's lease, on its own monotonic clock: the holder's
//! tenure and its last renewal (`renewed_at`, as a value that every renewal changes), and since
//! when it has seen that one. Once it has seen the same renewal for a lease, the leader has
//! stopped trusting its leadership (it trusts it until a renewal's send time + lease - margin,
//! on its own monotonic clock, and the renewal was sent before the follower saw it): the
//! follower asks `forge.campaign` to end the holder's session, which it does only if that is
//! still the holder's last renewal. No wall clock is compared, so a step of the database's clock
//! (or of a node's) deposes no healthy leader, and delays the end of no frozen one.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

/// A silent holder for `forge.campaign` to end: its tenure and the renewal seen unchanged.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct EndHolder {
    pub(super) epoch: i64,
    pub(super) tenure: i64,
    pub(super) renewed_at: DateTime<Utc>,
    /// How long the follower has seen it unchanged (for the `leader_fenced` event).
    pub(super) silent_ms: i64,
}

/// A holder's tenure and renewal, as a campaign call reported them.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Holder {
    pub(super) epoch: i64,
    pub(super) tenure: i64,
    pub(super) renewed_at: DateTime<Utc>,
}

/// The holder last seen and since when its renewal has been seen unchanged.
#[derive(Debug, Default)]
pub(super) struct ObservedLease {
    seen: Option<(Holder, Instant)>,
}

impl ObservedLease {
    /// A campaign call received at `at` showed `holder` leading (`None`: no leader holding the
    /// lock, or this node's own tenure): keeps the instant it was first seen while it is the
    /// same tenure and renewal.
    pub(super) fn saw(&mut self, holder: Option<Holder>, at: Instant) {
        self.seen = holder.map(|holder| match self.seen.take() {
            Some((before, since)) if before == holder => (before, since),
            _ => (holder, at),
        });
    }

    /// The holder to end at `now`: one whose renewal has been seen unchanged for `lease`.
    pub(super) fn silent_for(&self, lease: Duration, now: Instant) -> Option<EndHolder> {
        let (holder, since) = self.seen.as_ref()?;
        let silent = now.saturating_duration_since(*since);
        (silent >= lease).then(|| EndHolder {
            epoch: holder.epoch,
            tenure: holder.tenure,
            renewed_at: holder.renewed_at,
            silent_ms: silent.as_millis().min(i64::MAX as u128) as i64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    const LEASE: Duration = Duration::from_secs(3);

    fn holder(tenure: i64, second: u32) -> Holder {
        Holder {
            epoch: 7,
            tenure,
            renewed_at: Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, second).unwrap(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_is_silent_once_its_renewal_was_seen_unchanged_for_a_lease() {
        let mut observed = ObservedLease::default();
        // A renewal an hour old by any wall clock: only the follower's own watching counts.
        observed.saw(Some(holder(1, 0)), Instant::now());
        tokio::time::advance(LEASE - Duration::from_millis(1)).await;
        observed.saw(Some(holder(1, 0)), Instant::now());
        assert_eq!(observed.silent_for(LEASE, Instant::now()), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        let end = observed.silent_for(LEASE, Instant::now()).unwrap();
        assert_eq!(
            (end.epoch, end.tenure, end.renewed_at, end.silent_ms),
            (7, 1, holder(1, 0).renewed_at, 3000)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_or_another_tenure_starts_the_count_again() {
        let mut observed = ObservedLease::default();
        observed.saw(Some(holder(1, 0)), Instant::now());
        tokio::time::advance(LEASE).await;
        observed.saw(Some(holder(1, 1)), Instant::now());
        assert_eq!(observed.silent_for(LEASE, Instant::now()), None);
        tokio::time::advance(LEASE).await;
        observed.saw(Some(holder(2, 1)), Instant::now());
        assert_eq!(observed.silent_for(LEASE, Instant::now()), None);
        observed.saw(None, Instant::now());
        tokio::time::advance(LEASE).await;
        assert_eq!(observed.silent_for(LEASE, Instant::now()), None);
    }
}
