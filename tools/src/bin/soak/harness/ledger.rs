//! The ledger: what the guarantees survived, computed from the database after the run.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use super::figures::{EffectStats, JobStats, cron_figures};
use super::{Harness, Verdict};
use crate::options::FaultKind;
use crate::{
    BIG_JOB, BURST_JOB, BoxError, CRON, DEFAULT_CRON, DRAIN_DEADLINE, HOG_JOB, PLAIN_JOB,
    SAMPLE_EVERY, STRANDED_AFTER, TX_JOB,
};

impl Harness {
    pub(super) async fn analyze(
        &mut self,
        cutoff: DateTime<Utc>,
        drained: bool,
        drain_secs: f64,
        stop_clean: bool,
    ) -> Result<Verdict, BoxError> {
        let db = &self.admin;
        let mut out = String::new();
        let mut targets: Vec<(bool, String)> = Vec::new();
        let cutoff_us = cutoff.timestamp_micros();

        // --- Cron ticks.
        let Some(main_cron) = cron_figures(db, CRON, cutoff).await? else {
            return Err("the cron never wrote an effect".into());
        };
        let default_cron = cron_figures(db, DEFAULT_CRON, cutoff).await?;

        // --- Jobs.
        let jobs: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT CASE WHEN kind LIKE $4 THEN 'soak_hog' ELSE kind END, state, count(*),
                    count(*) FILTER (WHERE attempt > 1) FROM forge.jobs
              WHERE (kind IN ($1, $2) AND (args->>'tick_us')::bigint <= $3) OR kind LIKE $4
                 OR kind = ANY ($5)
              GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .bind(TX_JOB)
        .bind(PLAIN_JOB)
        .bind(cutoff_us)
        .bind(HOG_JOB)
        .bind([BURST_JOB, BIG_JOB])
        .fetch_all(db)
        .await?;
        let mut job_stats: BTreeMap<String, JobStats> = BTreeMap::new();
        for (kind, state, count, reruns) in &jobs {
            let stats = job_stats.entry(kind.clone()).or_default();
            stats.total += count;
            stats.reruns += reruns;
            if state == "completed" {
                stats.completed += count;
            } else {
                stats.not_completed.push(format!("{state} {count}"));
                stats.lost_or_stuck += count;
            }
        }
        let mut effects: BTreeMap<&str, EffectStats> = BTreeMap::new();
        for (label, kind, job) in [("tx", "tx", TX_JOB), ("plain", "plain", PLAIN_JOB)] {
            let (dup_jobs, dup_rows, completed_without, effect_not_completed, orphan, reruns): (
                i64,
                i64,
                i64,
                i64,
                i64,
                i64,
            ) = sqlx::query_as(
                "SELECT
                   (SELECT count(*) FROM (SELECT job_id FROM soak_job_effects
                      WHERE kind = $1 AND tick_us <= $2 GROUP BY job_id HAVING count(*) > 1) d),
                   (SELECT coalesce(sum(n - 1), 0)::bigint FROM (SELECT count(*) AS n FROM soak_job_effects
                      WHERE kind = $1 AND tick_us <= $2 GROUP BY job_id HAVING count(*) > 1) d),
                   (SELECT count(*) FROM forge.jobs j
                     WHERE j.kind = $3 AND j.state = 'completed' AND (j.args->>'tick_us')::bigint <= $2
                       AND NOT EXISTS (SELECT 1 FROM soak_job_effects e WHERE e.job_id = j.id AND e.kind = $1)),
                   (SELECT count(DISTINCT e.job_id) FROM soak_job_effects e JOIN forge.jobs j ON j.id = e.job_id
                     WHERE e.kind = $1 AND e.tick_us <= $2 AND j.state <> 'completed'),
                   (SELECT count(DISTINCT e.job_id) FROM soak_job_effects e
                     WHERE e.kind = $1 AND e.tick_us <= $2
                       AND NOT EXISTS (SELECT 1 FROM forge.jobs j WHERE j.id = e.job_id)),
                   (SELECT count(*) FROM soak_job_effects WHERE kind = $1 AND tick_us <= $2 AND attempt > 1)",
            )
            .bind(kind)
            .bind(cutoff_us)
            .bind(job)
            .fetch_one(db)
            .await?;
            effects.insert(
                label,
                EffectStats {
                    dup_jobs,
                    dup_rows,
                    completed_without,
                    effect_not_completed,
                    orphan,
                    reruns,
                },
            );
        }
        let enqueues: Vec<(String, i64, i64)> = sqlx::query_as(
            "WITH t AS (SELECT DISTINCT (extract(epoch FROM scheduled_at) * 1000000)::bigint AS us
                          FROM soak_cron_effects WHERE cron = $4 AND scheduled_at <= $1),
                  j AS (SELECT kind, (args->>'tick_us')::bigint AS us, count(*) AS n FROM forge.jobs
                         WHERE kind IN ($2, $3) GROUP BY 1, 2)
             SELECT k.kind, count(*) FILTER (WHERE j.n IS NULL), count(*) FILTER (WHERE j.n > 1)
               FROM t CROSS JOIN (VALUES ($2), ($3)) AS k(kind)
               LEFT JOIN j ON j.kind = k.kind AND j.us = t.us
              GROUP BY 1 ORDER BY 1",
        )
        .bind(cutoff)
        .bind(TX_JOB)
        .bind(PLAIN_JOB)
        .bind(CRON)
        .fetch_all(db)
        .await?;

        // Jobs that took long from enqueue to their end: stuck for a while, then recovered.
        let slow_jobs: Vec<(i64, String, String, i32, String, f64, String)> = sqlx::query_as(
            "SELECT id, kind, state, attempt, coalesce(node_id, '-'),
                    extract(epoch FROM coalesce(finished_at, now()) - created_at)::float8,
                    left(errors::text, 600)
               FROM forge.jobs
              WHERE kind IN ($1, $2) AND (args->>'tick_us')::bigint <= $3
                AND coalesce(finished_at, now()) - created_at > interval '20 seconds'
              ORDER BY 6 DESC LIMIT 5",
        )
        .bind(TX_JOB)
        .bind(PLAIN_JOB)
        .bind(cutoff_us)
        .fetch_all(db)
        .await?;
        let (slow_count, max_latency): (i64, f64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE coalesce(finished_at, now()) - created_at > interval '20 seconds'),
                    coalesce(max(extract(epoch FROM coalesce(finished_at, now()) - created_at)), 0)::float8
               FROM forge.jobs WHERE kind IN ($1, $2) AND (args->>'tick_us')::bigint <= $3",
        )
        .bind(TX_JOB)
        .bind(PLAIN_JOB)
        .bind(cutoff_us)
        .fetch_one(db)
        .await?;

        // --- Lost replies.
        let lost: Vec<(String, String, i64, i32, i64)> = sqlx::query_as(
            "SELECT r.kind, r.node, r.key, r.backend_pid,
                    CASE r.kind WHEN 'cron' THEN
                        (SELECT count(*) FROM soak_cron_effects e
                          WHERE e.cron = 'soak_tick'
                            AND (extract(epoch FROM e.scheduled_at) * 1000000)::bigint = r.key)
                    ELSE (SELECT count(*) FROM soak_job_effects e WHERE e.job_id = r.key AND e.kind = 'tx') END
               FROM soak_lost_replies r ORDER BY r.at",
        )
        .fetch_all(db)
        .await?;

        // --- Epochs.
        const WORK: &str = "(SELECT role, epoch, tenure, node, at FROM soak_leader_work
                             UNION ALL
                             SELECT 'scheduler', epoch, tenure, node, at FROM soak_cron_effects)";
        let late_writes: Vec<(String, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT w.role, count(*),
                    coalesce(string_agg(format('epoch %s on %s at %s', w.epoch, w.node,
                                               to_char(w.at, 'HH24:MI:SS.MS')), '; ') FILTER (WHERE true), '')
               FROM {WORK} w
              WHERE EXISTS (SELECT 1 FROM soak_events e
                             WHERE e.kind = 'leader_elected' AND e.role = w.role
                               AND e.epoch > w.epoch AND e.at <= w.at)
              GROUP BY 1 ORDER BY 1"
        )))
        .fetch_all(db)
        .await?;
        let overlaps: Vec<(String, i64, String, i64, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "WITH win AS (SELECT role, epoch, tenure, min(at) AS a, max(at) AS b FROM {WORK} w
                               GROUP BY 1, 2, 3)
                 SELECT x.role, x.epoch, to_char(x.b, 'HH24:MI:SS.MS'), y.epoch, to_char(y.a, 'HH24:MI:SS.MS')
                   FROM win x JOIN win y ON x.role = y.role AND x.epoch < y.epoch AND x.b >= y.a
                  ORDER BY 1, 2, 4"
            )))
            .fetch_all(db)
            .await?;
        let reused: Vec<(String, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT role, epoch, count(DISTINCT tenure) FROM {WORK} w GROUP BY 1, 2
              HAVING count(DISTINCT tenure) > 1 ORDER BY 1, 2"
        )))
        .fetch_all(db)
        .await?;
        let regressions: Vec<(String, i64)> = sqlx::query_as(
            "SELECT role, count(*) FROM (
                 SELECT role, epoch, lag(epoch) OVER (PARTITION BY role ORDER BY at, id) AS prev
                   FROM soak_events WHERE kind = 'leader_elected') s
              WHERE prev IS NOT NULL AND epoch <= prev GROUP BY 1 ORDER BY 1",
        )
        .fetch_all(db)
        .await?;
        let events: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT kind, coalesce(role, ''), count(*),
                    count(*) FILTER (WHERE coalesce((detail->>'failover')::boolean, false))
               FROM soak_events GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .fetch_all(db)
        .await?;
        let work_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM soak_leader_work")
            .fetch_one(db)
            .await?;

        // ----------------------------------------------------------------------------------
        // The report.
        // ----------------------------------------------------------------------------------
        let _ = writeln!(
            out,
            "\n================ FORGE soak: summary ================"
        );
        let lossy = self.failover_losses.iter().filter(|b| **b > 0).count();
        let _ = writeln!(
            out,
            "run: {:.1} min in all ({} faults), {} failovers ({lossy} lost commits: {} WAL bytes); run directory {}",
            self.secs() / 60.0,
            self.faults.len(),
            self.failovers,
            self.failover_losses.iter().sum::<u64>(),
            self.dir.display()
        );
        let _ = writeln!(
            out,
            "unplanned PostgreSQL crashes: {}{}",
            self.crashes.seen.len(),
            if self.crashes.seen.is_empty() {
                String::new()
            } else {
                format!(
                    " (at {})",
                    self.crashes
                        .seen
                        .iter()
                        .map(|c| c.describe())
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            }
        );
        let _ = writeln!(out, "\nfaults applied ({}):", self.faults.len());
        for fault in &self.faults {
            let _ = writeln!(out, "  [{:>7.1}s] {}", fault.at, fault.text);
        }
        let mut by_kind: BTreeMap<FaultKind, usize> = BTreeMap::new();
        for fault in &self.faults {
            *by_kind.entry(fault.kind).or_default() += 1;
        }
        let _ = writeln!(out, "faults by kind:");
        for kind in FaultKind::ALL {
            let _ = writeln!(
                out,
                "  {:<40} {}",
                kind.name(),
                by_kind.get(&kind).copied().unwrap_or(0)
            );
        }

        main_cron.write(&mut out, CRON, "overlap = wait", cutoff);
        match &default_cron {
            Some(figures) => {
                figures.write(&mut out, DEFAULT_CRON, "overlap at its default", cutoff)
            }
            None => {
                let _ = writeln!(out, "\ncron {DEFAULT_CRON}: never wrote an effect");
            }
        }

        let _ = writeln!(
            out,
            "\njobs (those of ticks up to the cut-off, the pool hogs, the bursts before write stalls):"
        );
        for kind in [TX_JOB, PLAIN_JOB, "soak_hog", BURST_JOB] {
            let stats = job_stats.get(kind).cloned().unwrap_or_default();
            let _ = writeln!(
                out,
                "  {kind:<15} total {:>5}, completed {:>5}, lost or stuck {}{}, reruns (attempt > 1) {}",
                stats.total,
                stats.completed,
                stats.lost_or_stuck,
                if stats.not_completed.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", stats.not_completed.join(", "))
                },
                stats.reruns
            );
        }
        for (kind, lost_enqueues, double_enqueues) in &enqueues {
            let _ = writeln!(
                out,
                "  ticks without a {kind}: {lost_enqueues}; ticks with more than one: {double_enqueues}"
            );
        }
        let tx = effects.get("tx").cloned().unwrap_or_default();
        let plain = effects.get("plain").cloned().unwrap_or_default();
        let _ = writeln!(
            out,
            "  {TX_JOB} effects: duplicated jobs {} ({} extra rows), completed without effect {}, effect but not completed {}, effect of an unknown job {}, effect rows of attempt > 1: {}",
            tx.dup_jobs,
            tx.dup_rows,
            tx.completed_without,
            tx.effect_not_completed,
            tx.orphan,
            tx.reruns
        );
        let _ = writeln!(
            out,
            "  {PLAIN_JOB} effects: duplicated jobs {} ({} extra rows), completed without effect {}, effect but not completed {}, effect rows of attempt > 1: {}",
            plain.dup_jobs,
            plain.dup_rows,
            plain.completed_without,
            plain.effect_not_completed,
            plain.reruns
        );
        let _ = writeln!(
            out,
            "    (at least once by design: its effect commits before the job's completion, so an attempt cut short\n     between the two - SIGKILL, SIGSTOP past down_after, a black hole, a lost reply - runs again)"
        );
        let _ = writeln!(
            out,
            "  enqueue-to-finish: max {max_latency:.1} s; jobs that took over 20 s: {slow_count}"
        );
        for (id, kind, state, attempt, node, secs, errors) in &slow_jobs {
            let _ = writeln!(
                out,
                "    job {id} {kind} {state} after {secs:.1} s, attempt {attempt} on {node}; errors {errors}"
            );
        }

        let _ = writeln!(
            out,
            "\nlost replies after commit: {} injected (node SIGKILLed during its slow COMMIT), {} commits found completed on the server",
            self.lost_reply_pids.len(),
            lost.len()
        );
        for (kind, node, key, pid, effects) in &lost {
            let what = if kind == "cron" {
                DateTime::<Utc>::from_timestamp_micros(*key)
                    .map(|t| format!("tick {}", t.format("%H:%M:%S")))
                    .unwrap_or_default()
            } else {
                format!("job {key}")
            };
            let killed = if self.lost_reply_pids.contains(pid) {
                "node killed during it"
            } else {
                "node not killed during it"
            };
            let _ = writeln!(
                out,
                "  {kind} {what} on {node} (backend {pid}, {killed}): {effects} effect row(s)"
            );
        }

        let _ = writeln!(out, "\nepochs and leadership (forge.events):");
        for (kind, role, count, failover) in &events {
            let extra = if kind == "leader_elected" {
                format!(" ({failover} failovers)")
            } else {
                String::new()
            };
            let role = if role.is_empty() {
                String::new()
            } else {
                format!(" {role}")
            };
            let _ = writeln!(out, "  {kind}{role}: {count}{extra}");
        }
        let _ = writeln!(
            out,
            "  fenced writes checked: {work_rows} leader-task rows + the cron's effect rows"
        );
        let late_total: i64 = late_writes.iter().map(|(_, n, _)| n).sum();
        let _ = writeln!(
            out,
            "  writes under an epoch older than one already elected: {late_total}"
        );
        for (role, n, examples) in &late_writes {
            let examples: String = examples.chars().take(400).collect();
            let _ = writeln!(out, "    {role}: {n}: {examples}");
        }
        let _ = writeln!(
            out,
            "  tenures whose write windows overlap a later epoch's: {}",
            overlaps.len()
        );
        for (role, older, last, newer, first) in overlaps.iter().take(5) {
            let _ = writeln!(
                out,
                "    {role}: epoch {older} wrote until {last}, epoch {newer} from {first}"
            );
        }
        let _ = writeln!(out, "  epochs with writes of two tenures: {}", reused.len());
        for (role, epoch, tenures) in &reused {
            let _ = writeln!(out, "    {role} epoch {epoch}: {tenures} tenures");
        }
        let regression_total: i64 = regressions.iter().map(|(_, n)| n).sum();
        let _ = writeln!(
            out,
            "  elections whose epoch is not above the previous one: {regression_total}"
        );

        let _ = writeln!(out, "\nnodes:");
        for slot in &self.slots {
            let _ = writeln!(
                out,
                "  {}: {} processes (restarts {}), failed starts {}, exits on its own {}",
                slot.id,
                slot.incarnation,
                slot.incarnation.saturating_sub(1),
                slot.start_failures,
                slot.unexpected_exits
            );
        }
        let slow_terms: Vec<String> = self
            .term_exits
            .iter()
            .map(|(id, took, status)| format!("{id} {took:.1} s ({status})"))
            .collect();
        let _ = writeln!(
            out,
            "  exits after a fault's SIGTERM: {}",
            if slow_terms.is_empty() {
                "none".to_owned()
            } else {
                slow_terms.join(", ")
            }
        );
        let _ = writeln!(
            out,
            "  backlog drain after the faults: {}",
            if drained {
                format!("{drain_secs:.1} s")
            } else {
                format!("NOT drained within {} s", DRAIN_DEADLINE.as_secs())
            }
        );
        let _ = writeln!(
            out,
            "  final SIGTERM: {}",
            if stop_clean {
                "every node stopped cleanly"
            } else {
                "NOT every node stopped cleanly"
            }
        );

        let liveness = self
            .liveness_report(&mut out, default_cron.as_ref())
            .await?;

        let flaps = self.moves_report(&mut out).await?;

        let (memory_ok, memory_text) = self.memory_report(&mut out);

        let _ = writeln!(
            out,
            "\nERROR lines and panics in the node logs: {}",
            self.error_lines
        );
        for example in &self.error_examples {
            let _ = writeln!(out, "  {example}");
        }

        if self.findings.is_empty() {
            let _ = writeln!(out, "\nfindings: none");
        } else {
            let _ = writeln!(out, "\nfindings ({}):", self.findings.len());
            for finding in &self.findings {
                let _ = writeln!(out, "  {finding}");
            }
        }

        // --- Targets.
        let (duplicated, succeeded_without_effect, effect_without_success, missing, expected) = (
            main_cron.duplicated,
            main_cron.succeeded_without_effect,
            main_cron.effect_without_success,
            main_cron.missing,
            main_cron.expected,
        );
        let (d_dup, d_succ_without, d_eff_without, d_missing, d_expected, d_skipped) =
            default_cron.as_ref().map_or((0, 0, 0, 0, 0, 0), |f| {
                (
                    f.duplicated,
                    f.succeeded_without_effect,
                    f.effect_without_success,
                    f.missing,
                    f.expected,
                    f.skipped(),
                )
            });
        let transactional_duplicates = duplicated + d_dup + tx.dup_jobs;
        targets.push((
            transactional_duplicates == 0
                && succeeded_without_effect + d_succ_without == 0
                && effect_without_success + d_eff_without == 0
                && tx.completed_without == 0
                && tx.effect_not_completed == 0,
            format!(
                "0 duplicate effects of transactional handlers: cron {duplicated}, {DEFAULT_CRON} {d_dup}, {TX_JOB} {} (and 0 effects without their commit: {} / {} / {} / {})",
                tx.dup_jobs,
                succeeded_without_effect + d_succ_without,
                effect_without_success + d_eff_without,
                tx.completed_without,
                tx.effect_not_completed
            ),
        ));
        targets.push((
            missing == 0 && d_missing == 0 && default_cron.is_some(),
            format!(
                "0 missing ticks with catch_up = \"all\": {CRON} {missing} of {expected}, {DEFAULT_CRON} {d_missing} of {d_expected} ({d_skipped} recorded skipped){}",
                if default_cron.is_some() {
                    ""
                } else {
                    ", and it never ran"
                }
            ),
        ));
        let lost_jobs: i64 = job_stats.values().map(|s| s.lost_or_stuck).sum();
        let lost_enqueues: i64 = enqueues.iter().map(|(_, lost, double)| lost + double).sum();
        targets.push((
            lost_jobs == 0 && lost_enqueues == 0 && drained,
            format!(
                "0 lost or stuck jobs: {lost_jobs} not completed, {lost_enqueues} ticks without exactly one job of each kind{}",
                if drained { "" } else { ", backlog not drained" }
            ),
        ));
        let overlapping =
            late_total + overlaps.len() as i64 + reused.len() as i64 + regression_total;
        targets.push((
            overlapping == 0,
            format!(
                "0 overlapping epochs: {late_total} late writes, {} overlapping windows, {} reused epochs, {regression_total} epoch regressions",
                overlaps.len(),
                reused.len()
            ),
        ));
        let unexpected: u32 = self.slots.iter().map(|s| s.unexpected_exits).sum();
        let alive = stop_clean && unexpected == 0;
        targets.push((
            alive,
            format!(
                "every node alive or restarted by the harness: {unexpected} exits on their own, {}",
                if stop_clean {
                    "all running and stopped cleanly at the end"
                } else {
                    "NOT all running / stopped cleanly at the end"
                }
            ),
        ));
        targets.push((
            memory_ok,
            format!("nothing unbounded in memory: {memory_text}"),
        ));

        targets.push((
            liveness.stranded == 0,
            format!(
                "0 jobs running with no handler anywhere for over {} s (sampled every {} s): {} (longest without a handler {:.1} s)",
                STRANDED_AFTER.as_secs(),
                SAMPLE_EVERY.as_secs(),
                liveness.stranded,
                self.max_handlerless
            ),
        ));
        targets.push((
            liveness.rescued_live == 0,
            format!(
                "0 jobs rescued from a live node (its handler running, the node neither SIGSTOPped nor black-holed): {}",
                liveness.rescued_live
            ),
        ));
        targets.push((
            flaps == 0,
            format!(
                "0 flaps (a role A -> B -> A with no fault in between, the first change a placement move or unexplained): {flaps}"
            ),
        ));
        if !self.fill_reports.is_empty() {
            let kept = self.fill_reports.iter().filter(|(ok, _)| *ok).count();
            targets.push((
                kept == self.fill_reports.len(),
                format!(
                    "a node that cannot reconnect keeps running its handlers: {kept} of {} times",
                    self.fill_reports.len()
                ),
            ));
        }

        // --- Queue limits, a workflow, a stored cron.
        targets.extend(self.queue_limits(&mut out).await?);
        targets.extend(self.flow_report(&mut out).await?);
        targets.extend(self.stored_report(&mut out, cutoff).await?);

        let _ = writeln!(out, "\ntargets:");
        for (ok, text) in &targets {
            let _ = writeln!(out, "  {}  {text}", if *ok { "PASS" } else { "FAIL" });
        }
        let _ = writeln!(
            out,
            "  info  {} duplicate effects of the non-transactional job (at least once: allowed)",
            plain.dup_rows
        );
        for line in &liveness.info {
            let _ = writeln!(out, "  info  {line}");
        }
        let all = targets.iter().all(|(ok, _)| *ok);
        let crashes = &self.crashes.seen;
        let _ = writeln!(out, "\nenvironment:");
        let _ = writeln!(
            out,
            "  {}  0 unplanned PostgreSQL crashes (a server process died and the server ended every session; the harness did not order it): {}",
            if crashes.is_empty() { "PASS" } else { "FAIL" },
            crashes.len()
        );
        let verdict = if !crashes.is_empty() {
            let _ = writeln!(
                out,
                "\nRESULT: ENVIRONMENT FAILED ({} unplanned PostgreSQL crashes: the figures above are not the product's alone); the product's targets: {}",
                crashes.len(),
                if all { "PASS" } else { "FAIL" }
            );
            Verdict::EnvironmentFailed
        } else if all {
            let _ = writeln!(out, "\nRESULT: PASS");
            Verdict::Pass
        } else {
            let _ = writeln!(out, "\nRESULT: FAIL");
            Verdict::ProductFailed
        };
        print!("{out}");
        Ok(verdict)
    }
}
