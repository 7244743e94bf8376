//! Node RSS: sampled through the run, reported at the end.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Harness, RssSample};
use crate::options::FaultKind;
use crate::{ADMIN_TIMEOUT, RSS_CAP_KIB};

impl Harness {
    pub(super) async fn sample_rss(&mut self) {
        let at = self.secs();
        let nodes: Vec<Option<(u32, f64, u64)>> = self
            .slots
            .iter()
            .map(|slot| {
                let pid = slot.phase.proc()?.pid();
                let kib = read_rss_kib(pid)?;
                Some((slot.incarnation, slot.started.elapsed().as_secs_f64(), kib))
            })
            .collect();
        let progress: Option<(i64, String)> = if self.table_lock.is_some() {
            None
        } else {
            tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_as(
                "SELECT (SELECT count(*) FROM soak_cron_effects),
                        coalesce((SELECT string_agg(format('%s %s %s (oldest %ss)', n, kind, state, age), ', ')
                           FROM (SELECT kind, state, count(*) AS n,
                                        round(extract(epoch FROM now() - min(created_at)))::bigint AS age
                                   FROM forge.jobs WHERE state NOT IN ('completed', 'dead', 'cancelled')
                                  GROUP BY 1, 2 ORDER BY 1, 2) o), 'none')",
            )
            .fetch_one(&self.admin),
        )
        .await
        .ok()
        .and_then(Result::ok)
        };
        let mut line = String::from("status:");
        for (slot, rss) in self.slots.iter().zip(&nodes) {
            let _ = write!(line, " {} {}", slot.id, slot.phase.label());
            if let Some((incarnation, _, kib)) = rss {
                let _ = write!(line, " #{incarnation} {:.1} MiB;", *kib as f64 / 1024.0);
            } else {
                line.push(';');
            }
        }
        if let Some((ticks, open)) = progress {
            let _ = write!(line, " {ticks} tick effects; open jobs: {open}");
        }
        self.note(line);
        self.rss.push(RssSample { at, nodes });
    }

    /// Node RSS over time, min/max per node, and whether any process grew without bound.
    pub(super) fn memory_report(&self, out: &mut String) -> (bool, String) {
        let _ = writeln!(out, "\nnode RSS over time (MiB, #process):");
        let mut header = String::from("     time");
        for slot in &self.slots {
            let _ = write!(header, " {:>14}", slot.id);
        }
        let _ = writeln!(out, "{header}");
        for sample in &self.rss {
            let mut line = format!("  {:>6.0}s", sample.at);
            for node in &sample.nodes {
                match node {
                    Some((incarnation, _, kib)) => {
                        let _ = write!(
                            line,
                            " {:>14}",
                            format!("{:.1} #{incarnation}", *kib as f64 / 1024.0)
                        );
                    }
                    None => {
                        let _ = write!(line, " {:>14}", "-");
                    }
                }
            }
            let _ = writeln!(out, "{line}");
        }
        let mut max_all = 0u64;
        for (i, slot) in self.slots.iter().enumerate() {
            let values: Vec<u64> = self
                .rss
                .iter()
                .filter_map(|s| s.nodes[i].map(|(_, _, kib)| kib))
                .collect();
            let min = values.iter().min().copied().unwrap_or(0);
            let max = values.iter().max().copied().unwrap_or(0);
            max_all = max_all.max(max);
            let _ = writeln!(
                out,
                "  {}: min {:.1} MiB, max {:.1} MiB over {} samples",
                slot.id,
                min as f64 / 1024.0,
                max as f64 / 1024.0,
                values.len()
            );
        }
        // Growth within one process: from its first sample after 60 s of uptime to its last,
        // for processes that lived at least 5 minutes after that first sample. The large jobs
        // of a frozen-claim fault (a claim's answer of about 16 MB) raise every node's high
        // water mark for good: the first sample is taken after the last of them.
        let after_large = self
            .faults
            .iter()
            .filter(|f| f.kind == FaultKind::FrozenLargeClaim)
            .map(|f| f.ended.unwrap_or(f.at) + 10.0)
            .fold(0.0, f64::max);
        let mut judged = 0;
        let mut grown = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let mut by_process: BTreeMap<u32, Vec<(f64, f64, u64)>> = BTreeMap::new();
            for sample in &self.rss {
                if let Some((incarnation, uptime, kib)) = sample.nodes[i] {
                    by_process
                        .entry(incarnation)
                        .or_default()
                        .push((sample.at, uptime, kib));
                }
            }
            for (incarnation, samples) in by_process {
                let Some(&(_, t0, base)) = samples
                    .iter()
                    .find(|(at, uptime, _)| *uptime >= 60.0 && *at >= after_large)
                else {
                    continue;
                };
                let Some(&(_, t1, last)) = samples.last() else {
                    continue;
                };
                if t1 - t0 < 300.0 {
                    continue;
                }
                judged += 1;
                if last > base + base / 2 && last > base + 16 * 1024 {
                    grown.push(format!(
                        "{} #{incarnation} {:.1} -> {:.1} MiB in {:.0} s",
                        slot.id,
                        base as f64 / 1024.0,
                        last as f64 / 1024.0,
                        t1 - t0
                    ));
                }
            }
        }
        let ok = max_all <= RSS_CAP_KIB && grown.is_empty();
        let text = if !grown.is_empty() {
            format!("grew: {}", grown.join(", "))
        } else if judged == 0 {
            format!(
                "max {:.1} MiB; no node process lived 6 min (after the last large claim), growth not judged",
                max_all as f64 / 1024.0
            )
        } else {
            format!(
                "max {:.1} MiB; {judged} long-lived processes grew < 50 %",
                max_all as f64 / 1024.0
            )
        };
        (ok, text)
    }
}

/// VmRSS of a process, in KiB.
pub(super) fn read_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}
