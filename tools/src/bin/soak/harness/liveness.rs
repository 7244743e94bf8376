//! The liveness figures: rescue latency, jobs without a handler, leaderless time per role.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use forge::Role;

use super::Harness;
use super::figures::CronFigures;
use crate::options::FaultKind;
use crate::{BoxError, CRON, DEFAULT_CRON, SAMPLE_EVERY, STRANDED_AFTER};

/// The liveness figures of issue 22 that have a target, and one-line summaries of the others.
pub(super) struct Liveness {
    pub(super) stranded: usize,
    pub(super) rescued_live: usize,
    pub(super) info: Vec<String>,
}

/// A job that was running on a node when the node was marked down.
pub(super) struct Rescue {
    node: String,
    down_at: f64,
    job: i64,
    attempt: i32,
    /// Seconds from the node_down event until the job left `running` (or until the analysis).
    latency: f64,
    /// What it became (`None`: still running at the analysis).
    next: Option<String>,
}

/// A time with no leader of a role.
pub(super) struct Gap {
    role: String,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    ended_by: &'static str,
}

/// Leader elections up to this long after a step of the database's clock ended are left out of
/// the leaderless time (a lease written during the step ends by the stepped clock).
const DB_STEP_MARGIN: f64 = 10.0;

/// The `q` quantile of sorted `values` (nearest rank).
pub(super) fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

impl Harness {
    /// Rescue latency, jobs without a handler, leaderless time, ticks skipped, step-downs,
    /// connections-full, jobs rescued from live nodes: printed into `out`.
    pub(super) async fn liveness_report(
        &self,
        out: &mut String,
        default_cron: Option<&CronFigures>,
    ) -> Result<Liveness, BoxError> {
        let db = &self.admin;
        let mut info = Vec::new();

        // --- Rescue latency after node_down.
        let (downs, rescues) = self.rescues().await?;
        let mut latencies: Vec<f64> = rescues.iter().map(|r| r.latency).collect();
        latencies.sort_by(f64::total_cmp);
        let never = rescues.iter().filter(|r| r.next.is_none()).count();
        let (p50, p99, max) = (
            quantile(&latencies, 0.5),
            quantile(&latencies, 0.99),
            latencies.last().copied().unwrap_or(0.0),
        );
        let _ = writeln!(
            out,
            "\nrescue after a node is marked down (each node_down event of forge.events, each job the job history shows running on that node at that moment, until it left running):"
        );
        let _ = writeln!(
            out,
            "  {downs} node_down events, {} jobs running on the node then: p50 {p50:.2} s, p99 {p99:.2} s, max {max:.2} s; still running at the end: {never}",
            rescues.len()
        );
        let mut outcomes: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for r in &rescues {
            outcomes
                .entry(r.next.as_deref().unwrap_or("still running"))
                .or_default()
                .push(r.latency);
        }
        for (outcome, mut values) in outcomes {
            values.sort_by(f64::total_cmp);
            let _ = writeln!(
                out,
                "    {outcome}: {}, p50 {:.2} s, max {:.2} s",
                values.len(),
                quantile(&values, 0.5),
                values.last().copied().unwrap_or(0.0)
            );
        }
        let mut slowest: Vec<&Rescue> = rescues.iter().collect();
        slowest.sort_by(|a, b| b.latency.total_cmp(&a.latency));
        for r in slowest.iter().take(6) {
            let _ = writeln!(
                out,
                "    job {} attempt {} on {}, down at {:.1}s ({}): {:.2} s, then {}",
                r.job,
                r.attempt,
                r.node,
                r.down_at,
                self.fault_at(r.down_at),
                r.latency,
                r.next.as_deref().unwrap_or("STILL RUNNING")
            );
        }
        info.push(format!(
            "rescue latency after node_down: p50 {p50:.2} s, p99 {p99:.2} s, max {max:.2} s ({} jobs, {downs} node_down events)",
            rescues.len()
        ));

        // --- Jobs without a handler.
        let _ = writeln!(
            out,
            "\njobs running with no live handler of their attempt ({} samples every {} s, {} failed; handlers from the nodes' SOAK-HANDLER lines; stall time of the harness's own table lock and write stall not counted):",
            self.samples,
            SAMPLE_EVERY.as_secs(),
            self.sample_failures
        );
        let _ = writeln!(
            out,
            "  longest without a handler: {:.1} s; stranded (over {} s): {}",
            self.max_handlerless,
            STRANDED_AFTER.as_secs(),
            self.stranded.len()
        );
        for ((job, attempt), record) in self.stranded.iter().take(8) {
            let _ = writeln!(
                out,
                "    job {job} attempt {attempt} on {}: no handler from {:.1}s ({}) for {:.1} s{}",
                record.node,
                record.first_at,
                self.fault_at(record.first_at),
                record.age,
                if record.still {
                    ", still at the last sample"
                } else {
                    ""
                }
            );
        }

        // --- Leaderless time.
        let gaps = self.leaderless_gaps().await?;
        let _ = writeln!(
            out,
            "\nleaderless time per role (forge.events: a tenure ends at its release, its leader_lost report or its lease expiry, whichever is first; the next begins at leader_elected; a crashed leader's tenure counts from its lease expiry, so its gap is a lower bound; elections during a step of the database's clock or {DB_STEP_MARGIN:.0} s after it are left out, their lease times being the stepped clock's):"
        );
        for role in Role::BUILTIN {
            let mine: Vec<f64> = gaps
                .iter()
                .filter(|g| g.role == role.name())
                .map(|g| (g.to - g.from).num_milliseconds() as f64 / 1000.0)
                .collect();
            // (+ 0.0: an empty sum of floats is -0.0)
            let sum: f64 = mine.iter().sum::<f64>() + 0.0;
            let max = mine.iter().copied().fold(0.0, f64::max);
            let long = mine.iter().filter(|g| **g >= 1.0).count();
            let _ = writeln!(
                out,
                "  {:<20} {} gaps, {long} of them >= 1 s; sum {sum:.1} s, max {max:.2} s",
                role.name(),
                mine.len()
            );
            info.push(format!(
                "leaderless {}: sum {sum:.1} s, max {max:.2} s",
                role.name()
            ));
        }
        let mut by_fault: BTreeMap<&str, (usize, f64, f64)> = BTreeMap::new();
        for g in &gaps {
            let from = self.secs_of(g.from);
            let kind = self.last_cause(from).unwrap_or("before any fault");
            let length = (g.to - g.from).num_milliseconds() as f64 / 1000.0;
            let entry = by_fault.entry(kind).or_default();
            entry.0 += 1;
            entry.1 += length;
            entry.2 = entry.2.max(length);
        }
        let _ = writeln!(out, "  by the last fault before the gap:");
        for (kind, (n, sum, max)) in &by_fault {
            let _ = writeln!(
                out,
                "    {kind:<40} {n:>3} gaps, sum {sum:>6.1} s, max {max:.2} s"
            );
        }
        let _ = writeln!(out, "  the longest:");
        let mut longest: Vec<&Gap> = gaps.iter().collect();
        longest.sort_by_key(|g| std::cmp::Reverse(g.to - g.from));
        for g in longest.iter().take(6) {
            let from = self.secs_of(g.from);
            let _ = writeln!(
                out,
                "    {}: {:.2} s from {from:.1}s (previous tenure {}; {})",
                g.role,
                (g.to - g.from).num_milliseconds() as f64 / 1000.0,
                g.ended_by,
                self.fault_at(from)
            );
        }

        // --- Ticks skipped.
        let skipped_main: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM forge.cron_ticks WHERE cron = $1 AND state = 'skipped'",
        )
        .bind(CRON)
        .fetch_one(db)
        .await?;
        info.push(format!(
            "ticks recorded skipped: {CRON} {skipped_main}, {DEFAULT_CRON} {}",
            default_cron.map_or(0, CronFigures::skipped)
        ));

        // --- Step-downs.
        if !self.step_downs.is_empty() {
            let mut outcomes: BTreeMap<(bool, String), usize> = BTreeMap::new();
            for record in &self.step_downs {
                let kind = record
                    .outcome
                    .split(':')
                    .next()
                    .unwrap_or_default()
                    .split(" epoch")
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                *outcomes.entry((record.alone, kind)).or_default() += 1;
            }
            let _ = writeln!(
                out,
                "\nstep-down requests (forge::inspect::Cluster::step_down): {}",
                self.step_downs.len()
            );
            for ((alone, kind), n) in &outcomes {
                let _ = writeln!(
                    out,
                    "  {}: {kind}: {n}",
                    if *alone {
                        "one eligible node"
                    } else {
                        "standbys waiting"
                    }
                );
            }
            for record in self
                .step_downs
                .iter()
                .filter(|r| r.outcome.starts_with("refused"))
                .take(3)
            {
                let _ = writeln!(
                    out,
                    "    {:.1}s {}: {}",
                    record.at, record.role, record.outcome
                );
            }
        }

        // --- Connections full.
        if !self.fill_reports.is_empty() {
            let _ = writeln!(out, "\nconnections full:");
            for (ok, text) in &self.fill_reports {
                let _ = writeln!(out, "  {} {text}", if *ok { "ok:" } else { "NOT OK:" });
            }
        }

        // --- Jobs rescued while their handler ran.
        let rescued: Vec<(i64, i32, String, DateTime<Utc>, String)> = sqlx::query_as(
            "SELECT j.id, (e->>'attempt')::int, coalesce(e->>'node', ''),
                    coalesce((SELECT min(m.at) FROM soak_job_moves m
                               WHERE m.job_id = j.id AND m.attempt = (e->>'attempt')::int
                                 AND m.state <> 'running'),
                             (e->>'at')::timestamptz),
                    left(coalesce(e->>'error', ''), 160)
               FROM forge.jobs j, jsonb_array_elements(j.errors) e
              WHERE e->>'reason' = 'rescued'",
        )
        .fetch_all(db)
        .await?;
        let within = |spans: &[(usize, i64, i64)], slot: usize, us: i64| {
            spans
                .iter()
                .any(|(s, from, to)| *s == slot && *from <= us && us <= *to)
        };
        let mut live = Vec::new();
        let (mut frozen, mut cut_off) = (0, 0);
        // By who rescued and why, and where the attempt's handler was at that instant.
        let mut kinds: BTreeMap<&str, [usize; 4]> = BTreeMap::new();
        for (job, attempt, node, at, error) in &rescued {
            let us = at.timestamp_micros();
            let Some(slot) = self.slots.iter().position(|s| s.id == *node) else {
                continue;
            };
            let span = self
                .spans
                .iter()
                .filter(|h| h.slot == slot && h.job == *job && h.attempt == *attempt)
                .find(|h| h.start_us <= us);
            let running = span.is_some_and(|h| h.end_us.is_none_or(|end| us < end));
            let kind = if error.contains("restarted during the attempt") {
                "by the node's next run (restarted during the attempt)"
            } else if error.starts_with("orphaned") {
                "by its own worker's reconciliation (orphaned)"
            } else if error.contains(" is down") {
                "by the scheduler leader (node down)"
            } else if error.contains("stopped without finishing") {
                "by the scheduler leader (node stopped)"
            } else {
                "otherwise"
            };
            let entry = kinds.entry(kind).or_default();
            entry[match span {
                _ if running => 0,
                Some(h) if !h.died => 1,
                Some(_) => 2,
                None => 3,
            }] += 1;
            if !running {
                continue;
            }
            if within(&self.pauses, slot, us) {
                frozen += 1;
            } else if within(&self.blackholes, slot, us) {
                cut_off += 1;
            } else {
                live.push((
                    *job,
                    *attempt,
                    node.clone(),
                    self.secs_of(*at),
                    error.clone(),
                ));
            }
        }
        let _ = writeln!(
            out,
            "\njobs rescued while their handler was running ({} rescues in all): {} on a SIGSTOPped node, {} on a black-holed node (both by design), {} on a live node",
            rescued.len(),
            frozen,
            cut_off,
            live.len()
        );
        for (kind, [running, finished, died, none]) in &kinds {
            let _ = writeln!(
                out,
                "  rescued {kind}: {} (handler then running {running}, already returned {finished}, gone with its process {died}, never started {none})",
                running + finished + died + none
            );
        }
        for (job, attempt, node, at, error) in live.iter().take(6) {
            let _ = writeln!(
                out,
                "    job {job} attempt {attempt} on {node} at {at:.1}s ({}): {error}",
                self.fault_at(*at)
            );
        }
        Ok(Liveness {
            stranded: self.stranded.len(),
            rescued_live: live.len(),
            info,
        })
    }

    /// The number of node_down events, and the jobs running on each down node at that moment.
    async fn rescues(&self) -> Result<(usize, Vec<Rescue>), BoxError> {
        // (job, state, attempt, node, at)
        type Move = (i64, String, i32, Option<String>, DateTime<Utc>);
        let moves: Vec<Move> = sqlx::query_as(
            "SELECT job_id, state, attempt, node, at FROM soak_job_moves ORDER BY job_id, id",
        )
        .fetch_all(&self.admin)
        .await?;
        let downs: Vec<(String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT node_id, at FROM soak_events WHERE kind = 'node_down' ORDER BY at",
        )
        .fetch_all(&self.admin)
        .await?;
        // Who rescued an attempt: its node's next run, or the scheduler leader.
        let by_restart: HashSet<(i64, i32)> = sqlx::query_as::<_, (i64, i32)>(
            "SELECT j.id, (e->>'attempt')::int FROM forge.jobs j, jsonb_array_elements(j.errors) e
              WHERE e->>'reason' = 'rescued' AND e->>'error' LIKE '%restarted during the attempt%'",
        )
        .fetch_all(&self.admin)
        .await?
        .into_iter()
        .collect();
        // Running intervals by node: (job, attempt, from, then (at, state)).
        type Interval = (i64, i32, DateTime<Utc>, Option<(DateTime<Utc>, String)>);
        let mut by_node: HashMap<String, Vec<Interval>> = HashMap::new();
        for (k, (job, state, attempt, node, at)) in moves.iter().enumerate() {
            if state != "running" {
                continue;
            }
            // A completion is the attempt's own (outcomes are guarded by node and attempt): the
            // job was not rescued. A rescue makes it available (or dead, or cancelled).
            let next = moves.get(k + 1).filter(|m| m.0 == *job).map(|m| {
                let what = match m.1.as_str() {
                    "completed" | "deleted" => "completed by its own attempt (not rescued)",
                    "available" | "dead" | "cancelled"
                        if by_restart.contains(&(*job, *attempt)) =>
                    {
                        "rescued by its node's next run"
                    }
                    "available" | "dead" | "cancelled" => "rescued by the scheduler leader",
                    _ => "left running otherwise",
                };
                (m.4, what.to_owned())
            });
            by_node
                .entry(node.clone().unwrap_or_default())
                .or_default()
                .push((*job, *attempt, *at, next));
        }
        let now = Utc::now();
        let end = self.stop_began.unwrap_or(now);
        let mut rescues = Vec::new();
        let mut counted = 0;
        for (node, down_at) in &downs {
            if *down_at > end {
                continue;
            }
            counted += 1;
            for (job, attempt, from, next) in by_node.get(node).map_or(&[][..], Vec::as_slice) {
                if *from > *down_at || next.as_ref().is_some_and(|(t, _)| *t <= *down_at) {
                    continue;
                }
                let left = next.as_ref().map_or(now, |(t, _)| *t);
                rescues.push(Rescue {
                    node: node.clone(),
                    down_at: self.secs_of(*down_at),
                    job: *job,
                    attempt: *attempt,
                    latency: (left - *down_at).num_milliseconds() as f64 / 1000.0,
                    next: next.as_ref().map(|(_, state)| state.clone()),
                });
            }
        }
        Ok((counted, rescues))
    }

    /// Whether `secs` falls in a step of the database's clock or [`DB_STEP_MARGIN`] after it.
    fn near_db_clock_step(&self, secs: f64) -> bool {
        self.faults.iter().any(|f| {
            matches!(
                f.kind,
                FaultKind::DbClockAhead | FaultKind::DbClockBehind | FaultKind::DbClockDownAfter
            ) && f.at <= secs
                && secs <= f.ended.unwrap_or(f.at) + DB_STEP_MARGIN
        })
    }

    /// Every time a role had no leader, from the events history, up to the final SIGTERM.
    async fn leaderless_gaps(&self) -> Result<Vec<Gap>, BoxError> {
        type Elected = (
            String,
            DateTime<Utc>,
            Option<i64>,
            Option<DateTime<Utc>>,
            Option<DateTime<Utc>>,
            Option<DateTime<Utc>>,
        );
        let elected: Vec<Elected> = sqlx::query_as(
            "SELECT e.role, e.at, (e.detail->>'previous_epoch')::bigint,
                    (e.detail->>'previous_released_at')::timestamptz - e.server_ahead,
                    (e.detail->>'previous_lease_until')::timestamptz - e.server_ahead,
                    (SELECT min(l.at) FROM soak_events l
                      WHERE l.kind = 'leader_lost' AND l.role = e.role
                        AND l.epoch = (e.detail->>'previous_epoch')::bigint AND l.at <= e.at)
               FROM soak_events e
              WHERE e.kind = 'leader_elected' AND e.role IS NOT NULL
              ORDER BY e.role, e.at, e.id",
        )
        .fetch_all(&self.admin)
        .await?;
        let end = self.stop_began.unwrap_or_else(Utc::now);
        let mut gaps = Vec::new();
        for (role, at, previous, released, lease_until, lost) in &elected {
            if previous.is_none() || *at > end {
                continue;
            }
            let candidates = [
                (*released, "released"),
                (*lost, "lost (leader_lost)"),
                (*lease_until, "lease expired"),
            ];
            let Some((from, ended_by)) = candidates
                .iter()
                .filter_map(|(t, why)| t.map(|t| (t, *why)))
                .min_by_key(|(t, _)| *t)
            else {
                continue;
            };
            // The lease and release times in an election's detail are the server's clock: around
            // a step of it they are off by the step, so the gap is not measured.
            if self.near_db_clock_step(self.secs_of(*at)) {
                continue;
            }
            if from < *at {
                gaps.push(Gap {
                    role: role.clone(),
                    from,
                    to: *at,
                    ended_by,
                });
            }
        }
        // A role whose last tenure ended before the final SIGTERM with no successor.
        let last: Vec<(String, DateTime<Utc>)> = sqlx::query_as(
            "WITH last AS (SELECT DISTINCT ON (role) role, epoch, at FROM soak_events
                            WHERE kind = 'leader_elected' AND role IS NOT NULL
                            ORDER BY role, at DESC, id DESC)
             SELECT l.role, min(x.at) FROM last l
               JOIN soak_events x ON x.role = l.role AND x.epoch = l.epoch
                                  AND x.kind IN ('leader_released', 'leader_lost') AND x.at >= l.at
              GROUP BY 1",
        )
        .fetch_all(&self.admin)
        .await?;
        for (role, from) in last {
            if from < end {
                gaps.push(Gap {
                    role,
                    from,
                    to: end,
                    ended_by: "ended with no successor before the final stop",
                });
            }
        }
        Ok(gaps)
    }
}
