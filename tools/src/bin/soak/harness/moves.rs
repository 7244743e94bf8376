//! Leader changes per kind of fault: the placement moves (`leader_rebalanced` for `spread` or
//! `preferred`) and the flaps (a role going A -> B -> A with no fault in between), and the
//! outcome each clock and claim fault printed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use super::{FaultRecord, Harness};
use crate::BoxError;

/// A leader change is put down to the fault in progress, or to one that ended at most this
/// long before it (the cluster settling: restarts, then placement spreading the roles again);
/// later, to no fault.
const AFTERMATH: f64 = 30.0;
/// The label of leader changes with no fault to put them down to.
const NO_FAULT: &str = "no fault";

/// One leader change of a role.
struct Change {
    role: String,
    from: String,
    to: String,
    /// Harness seconds.
    at: f64,
    /// A placement move (`leader_rebalanced` with why `spread` or `preferred`).
    placement: bool,
}

/// Per kind of fault: faults applied, leader changes, placement moves, flaps.
#[derive(Default)]
struct Row {
    applied: usize,
    changes: usize,
    moves: usize,
    flaps: usize,
}

impl Harness {
    /// The fault a leader change at `at` is put down to: the last one started by then, if it
    /// is still under way or ended at most [`AFTERMATH`] before.
    fn cause(&self, at: f64) -> Option<&FaultRecord> {
        self.faults
            .iter()
            .rfind(|f| f.at <= at + 0.05)
            .filter(|f| at <= f.ended.unwrap_or(f.at) + AFTERMATH)
    }

    /// Prints the moves-and-flaps table and the clock and claim faults' outcomes; returns the
    /// number of flaps.
    pub(super) async fn moves_report(&self, out: &mut String) -> Result<usize, BoxError> {
        // Each election, with the placement move that handed the role over, if one did.
        let elected: Vec<(String, String, DateTime<Utc>, Option<String>)> = sqlx::query_as(
            "SELECT e.role, e.node_id, e.at, r.why
               FROM soak_events e
               LEFT JOIN LATERAL (
                    SELECT m.detail->>'why' AS why FROM soak_events m
                     WHERE m.kind = 'leader_rebalanced' AND m.role = e.role
                       AND m.namespace = e.namespace AND m.id < e.id
                       AND m.epoch = (e.detail->>'previous_epoch')::bigint
                       AND m.detail->>'to' = e.node_id
                     ORDER BY m.id DESC LIMIT 1) r ON true
              WHERE e.kind = 'leader_elected' AND e.role IS NOT NULL
                AND ($1::timestamptz IS NULL OR e.at <= $1)
              ORDER BY e.role, e.id",
        )
        .bind(self.stop_began)
        .fetch_all(&self.admin)
        .await?;
        let mut changes = Vec::new();
        let mut previous: Option<(&str, &str)> = None;
        for (role, node, at, why) in &elected {
            if let Some((prev_role, prev_node)) = previous
                && prev_role == role
                && prev_node != node
            {
                changes.push(Change {
                    role: role.clone(),
                    from: prev_node.to_owned(),
                    to: node.clone(),
                    at: self.secs_of(*at),
                    placement: matches!(why.as_deref(), Some("spread" | "preferred")),
                });
            }
            previous = Some((role, node));
        }

        let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
        for fault in &self.faults {
            rows.entry(fault.label()).or_default().applied += 1;
        }
        let label = |at: f64| self.cause(at).map_or(NO_FAULT, FaultRecord::label);
        for change in &changes {
            let row = rows.entry(label(change.at)).or_default();
            row.changes += 1;
            row.moves += usize::from(change.placement);
        }
        // A flap: A -> B, then B -> A, with no fault started between the two, where the first
        // change was not forced by a fault: a placement move, or a change no fault explains.
        let mut flaps = Vec::new();
        for pair in changes.windows(2) {
            let (first, second) = (&pair[0], &pair[1]);
            let back =
                first.role == second.role && first.from == second.to && first.to == second.from;
            // A fault started between the two, or under way at the second (one of its steps,
            // such as a node's restart, may have forced it).
            let fault_between = self.faults.iter().any(|f| {
                f.at <= second.at && (f.at > first.at || second.at <= f.ended.unwrap_or(f.at))
            });
            let unforced = first.placement || self.cause(first.at).is_none();
            if back && !fault_between && unforced {
                rows.entry(label(first.at)).or_default().flaps += 1;
                flaps.push((first, second));
            }
        }

        let _ = writeln!(
            out,
            "\nleader changes per kind of fault (forge.events leader_elected; a change is put down to the fault under way or ended at most {AFTERMATH:.0} s before, else to \"{NO_FAULT}\"); placement moves: leader_rebalanced for spread or preferred; flaps: A -> B -> A with no fault started in between nor under way at the second change, the first change a placement move or unexplained by a fault:"
        );
        let _ = writeln!(
            out,
            "  {:<42} {:>7} {:>8} {:>6} {:>6}",
            "fault kind", "applied", "changes", "moves", "flaps"
        );
        let mut total = Row::default();
        for (kind, row) in &rows {
            let _ = writeln!(
                out,
                "  {kind:<42} {:>7} {:>8} {:>6} {:>6}",
                row.applied, row.changes, row.moves, row.flaps
            );
            total.applied += row.applied;
            total.changes += row.changes;
            total.moves += row.moves;
            total.flaps += row.flaps;
        }
        let _ = writeln!(
            out,
            "  {:<42} {:>7} {:>8} {:>6} {:>6}",
            "all", total.applied, total.changes, total.moves, total.flaps
        );
        for (first, second) in &flaps {
            let _ = writeln!(
                out,
                "    FLAP {}: {} -> {} at {:.1}s ({}{}), back to {} at {:.1}s ({})",
                first.role,
                first.from,
                first.to,
                first.at,
                if first.placement {
                    "placement move, "
                } else {
                    ""
                },
                self.fault_at(first.at),
                second.to,
                second.at,
                if second.placement {
                    "placement move"
                } else {
                    "not a placement move"
                }
            );
        }
        for change in changes
            .iter()
            .filter(|c| c.placement && self.cause(c.at).is_none())
            .take(6)
        {
            let _ = writeln!(
                out,
                "    move with no fault to explain it: {} {} -> {} at {:.1}s ({})",
                change.role,
                change.from,
                change.to,
                change.at,
                self.fault_at(change.at)
            );
        }

        if !self.outcomes.is_empty() {
            let _ = writeln!(
                out,
                "\noutcomes of the clock and claim faults (what was done; events, rescues and skipped ticks from its start to its end and a few seconds after):"
            );
            for (kind, text) in &self.outcomes {
                let _ = writeln!(out, "  {}: {text}", kind.key());
            }
        }
        Ok(flaps.len())
    }
}
