//! Small helpers shared by the node's long-running sessions.

use std::time::Duration;

/// Exponential backoff with jitter: the first retry is immediate, then 50 ms doubling up to a
/// cap.
pub(crate) struct Backoff {
    next: Duration,
    cap: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(50);

    pub(crate) fn new(cap: Duration) -> Backoff {
        Backoff {
            next: Duration::ZERO,
            cap,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.next = Duration::ZERO;
    }

    pub(crate) fn next(&mut self) -> Duration {
        let current = self.next;
        self.next = (current * 2).clamp(Backoff::FIRST, self.cap);
        // +-20 % so that nodes restarted together do not reconnect in lockstep.
        current.mul_f64(0.8 + fastrand::f64() * 0.4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_starts_immediately_and_is_capped() {
        let mut backoff = Backoff::new(Duration::from_secs(5));
        assert_eq!(backoff.next(), Duration::ZERO);
        let mut last = Duration::ZERO;
        for _ in 0..20 {
            last = backoff.next();
            assert!(last <= Duration::from_secs(6), "{last:?}");
        }
        assert!(last >= Duration::from_secs(4), "{last:?}");
        backoff.reset();
        assert_eq!(backoff.next(), Duration::ZERO);
    }
}
