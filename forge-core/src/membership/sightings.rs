//! What the scheduler leader has seen of each node, on its own monotonic clock: the node's last
//! heartbeat (as a value that every heartbeat changes) and since when it has seen that one, and
//! since when it has seen the node gone. From these come its verdicts - drifted, down - which
//! `forge.nodes_watch` applies only if the node has not heartbeated since. No wall clock is
//! compared: a step of the database's clock (or of this node's) marks no live node down.
//!
//! A new tenure starts with no sightings: every node is first seen at its first look, so none is
//! marked down by silence before a full `down_after` of this leader's own watching.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

/// Why the leader marks a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// No new heartbeat seen for `drift_after`.
    Drifted,
    /// No new heartbeat seen for `down_after`: down.
    NoHeartbeat,
    /// Seen gone (its sessions ended while the server stayed up) for the grace: down.
    SessionEnded,
}

impl Verdict {
    /// As `forge.nodes_watch` takes it.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Verdict::Drifted => "drifted",
            Verdict::NoHeartbeat => "no_heartbeat",
            Verdict::SessionEnded => "session_ended",
        }
    }
}

/// One node as the watch sees it now (a row of `forge.nodes_watch`).
#[derive(Clone, Debug)]
pub(super) struct Seen {
    pub(super) node: String,
    pub(super) beat: DateTime<Utc>,
    pub(super) gone: bool,
    pub(super) drifted: bool,
    /// The change this look made; a node marked down is watched no more.
    pub(super) down: bool,
}

/// A verdict on a node, with the heartbeat it was reached on and how long that heartbeat has been
/// seen unchanged.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Judged {
    pub(super) node: String,
    pub(super) beat: DateTime<Utc>,
    pub(super) verdict: Verdict,
    pub(super) silent: Duration,
}

#[derive(Clone, Debug)]
struct Sighting {
    beat: DateTime<Utc>,
    /// When this heartbeat was first seen (the reply that showed it was received).
    since: Instant,
    /// When the node was first seen gone, with this heartbeat.
    gone_since: Option<Instant>,
    drifted: bool,
}

/// The thresholds of the verdicts.
#[derive(Clone, Copy, Debug)]
pub(super) struct Thresholds {
    pub(super) drift_after: Duration,
    pub(super) down_after: Duration,
    /// How long a node seen gone may take to come back.
    pub(super) grace: Duration,
}

/// Every node the leader watches, as last seen.
#[derive(Debug, Default)]
pub(super) struct Sightings {
    nodes: HashMap<String, Sighting>,
}

impl Sightings {
    /// The verdicts due at `now`.
    pub(super) fn verdicts(&self, now: Instant, limits: Thresholds) -> Vec<Judged> {
        let mut judged: Vec<Judged> = self
            .nodes
            .iter()
            .filter_map(|(node, seen)| {
                let silent = now.saturating_duration_since(seen.since);
                let verdict = if seen
                    .gone_since
                    .is_some_and(|gone| now.saturating_duration_since(gone) >= limits.grace)
                {
                    Verdict::SessionEnded
                } else if silent >= limits.down_after {
                    Verdict::NoHeartbeat
                } else if silent >= limits.drift_after && !seen.drifted {
                    Verdict::Drifted
                } else {
                    return None;
                };
                Some(Judged {
                    node: node.clone(),
                    beat: seen.beat,
                    verdict,
                    silent,
                })
            })
            .collect();
        judged.sort_by(|a, b| a.node.cmp(&b.node));
        judged
    }

    /// What a look showed, its reply received at `at`. Nodes it did not show (stopped, down,
    /// forgotten) are forgotten here too.
    pub(super) fn saw(&mut self, rows: &[Seen], at: Instant) {
        let mut nodes = HashMap::with_capacity(rows.len());
        for row in rows.iter().filter(|row| !row.down) {
            let before = self
                .nodes
                .remove(&row.node)
                .filter(|before| before.beat == row.beat);
            let since = before.as_ref().map_or(at, |b| b.since);
            let gone_since = match (row.gone, before.and_then(|b| b.gone_since)) {
                (false, _) => None,
                (true, earlier) => Some(earlier.unwrap_or(at)),
            };
            nodes.insert(
                row.node.clone(),
                Sighting {
                    beat: row.beat,
                    since,
                    gone_since,
                    drifted: row.drifted,
                },
            );
        }
        self.nodes = nodes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    const LIMITS: Thresholds = Thresholds {
        drift_after: Duration::from_millis(1500),
        down_after: Duration::from_secs(4),
        grace: Duration::from_secs(1),
    };

    fn beat(second: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, second).unwrap()
    }

    fn seen(node: &str, at: DateTime<Utc>, gone: bool) -> Seen {
        Seen {
            node: node.into(),
            beat: at,
            gone,
            drifted: false,
            down: false,
        }
    }

    fn verdicts(sightings: &Sightings) -> Vec<(String, Verdict)> {
        sightings
            .verdicts(Instant::now(), LIMITS)
            .into_iter()
            .map(|j| (j.node, j.verdict))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_is_judged_by_how_long_its_heartbeat_was_seen_unchanged() {
        let mut sightings = Sightings::default();
        // A heartbeat far in the past by any wall clock: only the leader's own watching counts.
        sightings.saw(&[seen("a", beat(0), false)], Instant::now());
        tokio::time::advance(Duration::from_millis(1499)).await;
        assert_eq!(verdicts(&sightings), []);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(verdicts(&sightings), [("a".into(), Verdict::Drifted)]);
        // A new heartbeat starts the count again.
        sightings.saw(&[seen("a", beat(1), false)], Instant::now());
        tokio::time::advance(Duration::from_millis(3999)).await;
        sightings.saw(&[seen("a", beat(1), false)], Instant::now());
        assert_eq!(verdicts(&sightings), [("a".into(), Verdict::Drifted)]);
        tokio::time::advance(Duration::from_millis(1)).await;
        let judged = sightings.verdicts(Instant::now(), LIMITS);
        assert_eq!(
            judged,
            [Judged {
                node: "a".into(),
                beat: beat(1),
                verdict: Verdict::NoHeartbeat,
                silent: Duration::from_secs(4),
            }]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_seen_gone_is_down_after_the_grace_unless_it_heartbeats() {
        let mut sightings = Sightings::default();
        sightings.saw(&[seen("a", beat(0), true)], Instant::now());
        tokio::time::advance(Duration::from_millis(900)).await;
        sightings.saw(&[seen("a", beat(0), true)], Instant::now());
        assert_eq!(verdicts(&sightings), []);
        // A heartbeat through its pool: the grace starts again.
        sightings.saw(&[seen("a", beat(1), true)], Instant::now());
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(verdicts(&sightings), []);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(verdicts(&sightings), [("a".into(), Verdict::SessionEnded)]);
        // Back (its session seen alive): no verdict.
        sightings.saw(&[seen("a", beat(1), false)], Instant::now());
        assert_eq!(verdicts(&sightings), []);
    }

    #[tokio::test(start_paused = true)]
    async fn nodes_not_shown_or_marked_down_are_forgotten() {
        let mut sightings = Sightings::default();
        sightings.saw(
            &[seen("a", beat(0), false), seen("b", beat(0), false)],
            Instant::now(),
        );
        tokio::time::advance(LIMITS.down_after).await;
        let mut down = seen("a", beat(0), false);
        down.down = true;
        sightings.saw(&[down], Instant::now());
        assert_eq!(verdicts(&sightings), []);
        // Seen again (it rejoined): counted from now.
        sightings.saw(&[seen("a", beat(0), false)], Instant::now());
        assert_eq!(verdicts(&sightings), []);
    }
}
