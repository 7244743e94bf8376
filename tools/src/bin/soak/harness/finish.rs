//! After the last fault: everything healed, the backlog drained, the nodes stopped.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::{ConnFill, FillStage, Harness, Phase, describe_status};
use crate::{
    ADMIN_TIMEOUT, BIG_JOB, BURST_JOB, CRON, FLOW_JOB, HOG_JOB, PLAIN_JOB, STORED_CRON, STORED_JOB,
    TX_JOB,
};

impl Harness {
    /// After the faults: nothing armed, nothing paused or black-holed, dead nodes restarted.
    pub(super) async fn heal_all(&mut self) {
        if self.pending_failover.is_some() {
            let done = self.fail_over_now().await;
            self.note(done);
        }
        self.heal_clocks().await;
        self.heal_claims().await;
        if let Some(freeze) = self.freeze.take() {
            let id = self.slots[freeze.slot].id.clone();
            self.set_flag(freeze.flag, &id, false).await;
        }
        if let Some(lock) = &mut self.table_lock {
            lock.until = Instant::now();
        }
        self.tend_table_lock().await;
        if let Some(stall) = &mut self.write_stall {
            stall.until = Instant::now();
        }
        for _ in 0..10 {
            self.tend_write_stall().await;
            if self.write_stall.is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // A fill that holds the server ends as planned (its report); one still filling stops.
        match &mut self.fill {
            Some(ConnFill {
                stage: FillStage::Holding { until, .. },
                ..
            }) => {
                *until = Instant::now();
                self.tend_fill().await;
            }
            Some(_) => self.stop_fill().await,
            None => {}
        }
        if let Some(storm) = &mut self.storm {
            storm.queue.clear();
            storm.started = true;
            storm.end_at = Some(Instant::now());
        }
        self.tend_storm().await;
        for slot in &mut self.slots {
            slot.hold_until = None;
        }
        if let Some(armed) = self.armed.take() {
            let id = self.slots[armed.slot].id.clone();
            self.set_flag(armed.kind, &id, false).await;
        }
        let _ = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query("DELETE FROM soak_flags").execute(&self.admin),
        )
        .await;
        let now = Instant::now();
        for i in 0..self.slots.len() {
            if self.slots[i].blackhole_until.is_some() {
                self.heal(i);
            }
            self.slots[i].busy_until = None;
            match &mut self.slots[i].phase {
                Phase::Paused { resume_at, .. } => *resume_at = now,
                Phase::Dead { restart_at } => *restart_at = now,
                _ => {}
            }
        }
    }

    /// What is still to be done up to `cutoff` ("" when nothing), or `None` if the database
    /// could not be asked.
    pub(super) async fn backlog(&self, cutoff: DateTime<Utc>) -> Option<String> {
        let row: (i64, i64, i64, i64, i64) = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_as(
                "SELECT
                   (SELECT count(*) FROM forge.cron_ticks
                     WHERE cron = $1 AND scheduled_at >= $2 AND state = 'succeeded'),
                   (SELECT count(*) FROM forge.cron_ticks
                     WHERE cron = $8 AND scheduled_at >= $2 AND state = 'succeeded'),
                   (SELECT count(*) FROM forge.cron_ticks
                     WHERE cron = $1 AND scheduled_at <= $2 AND state = 'running'),
                   (SELECT count(*) FROM forge.jobs
                     WHERE kind IN ($3, $4) AND (args->>'tick_us')::bigint <= $5
                       AND state NOT IN ('completed', 'dead', 'cancelled')),
                   (SELECT count(*) FROM forge.jobs
                     WHERE (kind LIKE $6 OR kind = ANY ($7))
                       AND state NOT IN ('completed', 'dead', 'cancelled'))",
            )
            .bind(CRON)
            .bind(cutoff)
            .bind(TX_JOB)
            .bind(PLAIN_JOB)
            .bind(cutoff.timestamp_micros())
            .bind(HOG_JOB)
            .bind([BURST_JOB, BIG_JOB, FLOW_JOB, STORED_JOB])
            .bind(STORED_CRON)
            .fetch_one(&self.admin),
        )
        .await
        .ok()?
        .ok()?;
        let (after, stored_after, running, open, hogs) = row;
        let mut missing = Vec::new();
        if after == 0 {
            missing.push("no tick at or after the cut-off has succeeded yet".to_owned());
        }
        if stored_after == 0 {
            missing
                .push("no stored-cron tick at or after the cut-off has succeeded yet".to_owned());
        }
        if running > 0 {
            missing.push(format!("{running} ticks still running"));
        }
        if open > 0 {
            missing.push(format!("{open} jobs of those ticks not finished"));
        }
        if hogs > 0 {
            missing.push(format!(
                "{hogs} pool hogs, burst, large, workflow and stored-cron jobs not finished"
            ));
        }
        Some(missing.join(", "))
    }

    /// SIGTERM to every node; true if all exited cleanly within 30 s.
    pub(super) async fn stop_all(&mut self) -> bool {
        self.note("stopping the nodes (SIGTERM)");
        self.sample_jobs().await;
        self.stop_began = Some(Utc::now());
        let mut clean = true;
        for i in 0..self.slots.len() {
            if let Some(proc) = self.slots[i].phase.proc() {
                let _ = proc.resume();
                let _ = proc.terminate();
            }
            self.resumed(i);
        }
        for i in 0..self.slots.len() {
            let phase = std::mem::replace(
                &mut self.slots[i].phase,
                Phase::Dead {
                    restart_at: Instant::now() + Duration::from_secs(3600 * 24),
                },
            );
            let id = self.slots[i].id.clone();
            let proc = match phase {
                Phase::Starting { proc, .. }
                | Phase::Running { proc }
                | Phase::Paused { proc, .. }
                | Phase::Terminating { proc, .. } => proc,
                Phase::Dead { .. } => {
                    self.finding(format!("{id} was not running at the end"));
                    clean = false;
                    continue;
                }
            };
            let mut proc = proc;
            let started = Instant::now();
            let status = proc.wait_exit(Duration::from_secs(30)).await;
            self.save_log(i, &proc);
            let took = started.elapsed().as_secs_f64();
            match &status {
                Ok(s) if s.success() => {
                    self.note(format!("{id} stopped cleanly ({took:.1} s)"));
                }
                _ => {
                    clean = false;
                    self.finding(format!(
                        "{id} did not stop cleanly on the final SIGTERM ({}); last lines: {}",
                        describe_status(&status),
                        Self::last_lines(&proc, 8)
                    ));
                    let _ = proc.kill();
                }
            }
        }
        clean
    }
}
