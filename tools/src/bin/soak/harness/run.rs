//! The run: the loop that applies faults and supervises the node processes (start, watch,
//! resume, heal, restart, kill).

use std::time::Duration;

use chrono::{DateTime, Utc};
use forge_testkit::{Filter, NodeProcess};
use tokio::process::Command;
use tokio::time::Instant;

use super::stored::StoredChange;
use super::{Harness, Phase, Verdict, describe_status};
use crate::{
    ADMIN_TIMEOUT, BoxError, DRAIN_DEADLINE, POOL_SIZE, RSS_EVERY, SAMPLE_EVERY, SKEW_ENV,
};

impl Harness {
    pub(super) async fn run(&mut self, minutes: f64) -> Result<Verdict, BoxError> {
        // Start the nodes.
        for i in 0..self.slots.len() {
            self.start_node(i);
        }
        let ready_by = Instant::now() + Duration::from_secs(60);
        while !self.all_running() {
            if Instant::now() > ready_by {
                return Err("the nodes did not all start within 60 s".into());
            }
            self.supervise().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.note("all nodes ready; faults begin");
        self.sample_rss().await;

        // Faults, with a workflow now and then and the stored cron's change halfway.
        let fault_end = Instant::now() + Duration::from_secs_f64(minutes * 60.0);
        self.stored_change = Some(StoredChange {
            due: Instant::now() + Duration::from_secs_f64(minutes * 30.0),
            made: None,
            why_not: None,
        });
        let mut next_fault = Instant::now() + self.rng.secs(self.interval.0, self.interval.1);
        let mut next_rss = Instant::now() + RSS_EVERY;
        // A fault of several steps (a freeze, a lock held, a storm...) gives the cluster the
        // interval after it ends, not after it starts.
        let mut after_busy = false;
        while Instant::now() < fault_end {
            self.supervise().await;
            self.tend_flows().await;
            self.tend_stored_change().await;
            if self.busy() {
                after_busy = true;
            } else if after_busy {
                after_busy = false;
                let at = self.secs();
                if let Some(last) = self.faults.last_mut() {
                    last.ended = Some(at);
                }
                next_fault = Instant::now() + self.rng.secs(self.interval.0, self.interval.1);
            }
            if Instant::now() >= next_fault && !self.busy() {
                next_fault = if self.fault().await {
                    Instant::now() + self.rng.secs(self.interval.0, self.interval.1)
                } else {
                    Instant::now() + Duration::from_secs(1)
                };
            }
            if Instant::now() >= next_rss {
                self.sample_rss().await;
                next_rss += RSS_EVERY;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // Heal everything and bring every node back (a fault still under way ends here).
        let at = self.secs();
        if self.busy()
            && let Some(last) = self.faults.last_mut()
        {
            last.ended = Some(at);
        }
        self.note("faults over: healing, restarting dead nodes");
        self.heal_all().await;
        let ready_by = Instant::now() + Duration::from_secs(120);
        while !self.all_running() {
            if Instant::now() > ready_by {
                let states: Vec<String> = self
                    .slots
                    .iter()
                    .map(|s| format!("{} {}", s.id, s.phase.label()))
                    .collect();
                self.finding(format!(
                    "the nodes were not all running 120 s after the faults: {}",
                    states.join(", ")
                ));
                break;
            }
            self.supervise().await;
            if Instant::now() >= next_rss {
                self.sample_rss().await;
                next_rss += RSS_EVERY;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // Drain: every tick up to the cut-off succeeded, and the jobs they enqueued finished.
        let cutoff = Utc::now();
        let cutoff_second =
            DateTime::<Utc>::from_timestamp(cutoff.timestamp(), 0).unwrap_or(cutoff);
        self.note(format!(
            "waiting for the backlog up to {} to drain (at most {} s)",
            cutoff_second.format("%H:%M:%S"),
            DRAIN_DEADLINE.as_secs()
        ));
        let drain_started = Instant::now();
        let mut last_state = String::new();
        let drained = loop {
            self.supervise().await;
            match self.backlog(cutoff_second).await {
                Some(state) if state.is_empty() => break true,
                Some(state) => last_state = state,
                None => {}
            }
            if drain_started.elapsed() > DRAIN_DEADLINE {
                break false;
            }
            if Instant::now() >= next_rss {
                self.sample_rss().await;
                next_rss += RSS_EVERY;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let drain_secs = drain_started.elapsed().as_secs_f64();
        if drained {
            self.note(format!("backlog drained in {drain_secs:.1} s"));
        } else {
            self.finding(format!(
                "the backlog did not drain within {} s: {last_state}",
                DRAIN_DEADLINE.as_secs()
            ));
        }
        self.sample_rss().await;

        // Stop the nodes gracefully.
        let stop_clean = self.stop_all().await;
        self.watch_crashes();

        let report = self
            .analyze(cutoff_second, drained, drain_secs, stop_clean)
            .await?;
        Ok(report)
    }

    fn all_running(&self) -> bool {
        self.slots
            .iter()
            .all(|s| matches!(s.phase, Phase::Running { .. }))
    }

    fn start_node(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.incarnation += 1;
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(err) => {
                let message = format!("cannot find this executable to start {}: {err}", slot.id);
                self.finding(message);
                return;
            }
        };
        let mut command = Command::new(exe);
        command
            .arg("node")
            .arg(&slot.config)
            .env("FORGE_NODE_ID", &slot.id)
            .env(
                "RUST_LOG",
                std::env::var("SOAK_NODE_LOG").unwrap_or_else(|_| "warn,forge=info".into()),
            )
            .env_remove("DATABASE_URL")
            .env_remove("FORGE_ROLES")
            .env_remove("FORGE_METRICS_LISTEN");
        slot.clock_us = 0;
        if let Some((offset, secs)) = slot.skew {
            match forge_testkit::skewed_clock_env(offset) {
                Ok(env) => {
                    command.envs(env);
                    slot.clock_us = secs * 1_000_000;
                    command.env(SKEW_ENV, slot.clock_us.to_string());
                }
                Err(err) => {
                    let message = format!("cannot skew {}'s clock: {err}", slot.id);
                    self.finding(message);
                    return;
                }
            }
        }
        match NodeProcess::spawn(command) {
            Ok(proc) => {
                let proc = proc.named(&slot.id);
                slot.started = Instant::now();
                slot.phase = Phase::Starting {
                    proc,
                    since: Instant::now(),
                };
                let (id, incarnation) = (slot.id.clone(), slot.incarnation);
                if incarnation > 1 {
                    self.note(format!("restarting {id} (incarnation {incarnation})"));
                }
            }
            Err(err) => {
                slot.phase = Phase::Dead {
                    restart_at: Instant::now() + Duration::from_secs(2),
                };
                let message = format!("cannot spawn {}: {err}", slot.id);
                self.finding(message);
            }
        }
    }

    /// Keeps the node process's output in the run directory, and collects its ERROR lines
    /// and panics.
    pub(super) fn save_log(&mut self, i: usize, proc: &NodeProcess) {
        let slot = &self.slots[i];
        let path = self
            .dir
            .join(format!("{}.{}.log", slot.id, slot.incarnation));
        let lines = proc.lines();
        let _ = std::fs::write(path, lines.join("\n") + "\n");
        let id = slot.id.clone();
        self.scan_handlers(i, &lines);
        self.process_ended(i);
        for line in &lines {
            if line.contains(" ERROR ") || line.contains("panicked") {
                self.error_lines += 1;
                let message = line
                    .split_once(' ')
                    .map_or(line.as_str(), |(_, rest)| rest)
                    .chars()
                    .take(300)
                    .collect::<String>();
                let message = format!("{id}: {message}");
                if self.error_examples.len() < 10 && !self.error_examples.contains(&message) {
                    self.error_examples.push(message);
                }
            }
        }
    }

    pub(super) fn last_lines(proc: &NodeProcess, n: usize) -> String {
        let lines = proc.lines();
        let start = lines.len().saturating_sub(n);
        lines[start..].join(" | ")
    }

    /// Watches the node processes, resumes, heals, restarts, fires armed lost replies, and
    /// tends the standby.
    async fn supervise(&mut self) {
        self.watch_crashes();
        for i in 0..self.slots.len() {
            self.check_slot(i).await;
            if let Some(until) = self.slots[i].blackhole_until
                && Instant::now() >= until
            {
                self.heal(i);
            }
        }
        self.check_armed().await;
        self.tend_freeze().await;
        self.tend_table_lock().await;
        self.tend_write_stall().await;
        self.tend_fill().await;
        self.tend_storm().await;
        self.tend_db_clock().await;
        self.tend_skew().await;
        self.tend_large_claim().await;
        self.tend_delayed().await;
        self.tend_standby().await;
        if Instant::now() >= self.next_sample {
            self.next_sample = Instant::now() + SAMPLE_EVERY;
            self.sample_jobs().await;
        }
        if self.pending_failover.is_some_and(|t| Instant::now() >= t) {
            let done = self.fail_over_now().await;
            self.note(done);
        }
        for i in 0..self.slots.len() {
            if self.slots[i]
                .starve_check_at
                .is_some_and(|t| Instant::now() >= t)
            {
                self.slots[i].starve_check_at = None;
                self.check_starved(i).await;
            }
        }
    }

    /// Says how many of a node's pool connections the hogs hold.
    async fn check_starved(&self, i: usize) {
        let id = &self.slots[i].id;
        let held = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE application_name = $1 AND wait_event = 'PgSleep' AND query LIKE 'SELECT pg_sleep%'",
            )
            .bind(format!("forge:pool:{id}"))
            .fetch_one(&self.admin),
        )
        .await;
        if let Ok(Ok(held)) = held {
            self.note(format!(
                "pool starvation on {id}: {held} of its {POOL_SIZE} pool connections held by hogs"
            ));
        }
    }

    pub(super) fn heal(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.blackhole_until = None;
        if let Some(since) = slot.blackhole_since_us.take() {
            self.blackholes
                .push((i, since, Utc::now().timestamp_micros()));
        }
        let slot = &mut self.slots[i];
        slot.proxy.heal_all();
        let severed = slot.proxy.sever(&Filter::All);
        let id = slot.id.clone();
        self.note(format!(
            "healed the black hole on {id}; {severed} dead flows severed"
        ));
    }

    async fn check_slot(&mut self, i: usize) {
        let now = Instant::now();
        let placeholder = Phase::Dead {
            restart_at: now + Duration::from_secs(3600),
        };
        let phase = std::mem::replace(&mut self.slots[i].phase, placeholder);
        let id = self.slots[i].id.clone();
        let next = match phase {
            Phase::Starting { mut proc, since } => {
                if proc.try_status().is_some() {
                    let status = proc.wait_exit(Duration::from_secs(5)).await;
                    self.save_log(i, &proc);
                    self.slots[i].start_failures += 1;
                    self.note(format!(
                        "{id} failed to start ({}): {}; retrying in 2 s",
                        describe_status(&status),
                        Self::last_lines(&proc, 2)
                    ));
                    Phase::Dead {
                        restart_at: now + Duration::from_secs(2),
                    }
                } else if proc.lines().iter().any(|l| l.starts_with("SOAK-READY")) {
                    self.note(format!(
                        "{id} ready ({:.1} s after its start)",
                        since.elapsed().as_secs_f64()
                    ));
                    Phase::Running { proc }
                } else if since.elapsed() > Duration::from_secs(90) {
                    self.finding(format!(
                        "{id} was not ready 90 s after its start; killed and restarted. Last lines: {}",
                        Self::last_lines(&proc, 5)
                    ));
                    let _ = proc.kill();
                    let _ = proc.wait_exit(Duration::from_secs(5)).await;
                    self.save_log(i, &proc);
                    Phase::Dead {
                        restart_at: now + Duration::from_secs(1),
                    }
                } else {
                    Phase::Starting { proc, since }
                }
            }
            Phase::Running { mut proc } => {
                if proc.try_status().is_some() {
                    let status = proc.wait_exit(Duration::from_secs(5)).await;
                    self.save_log(i, &proc);
                    self.slots[i].unexpected_exits += 1;
                    self.finding(format!(
                        "{id} exited on its own ({}); last lines: {}",
                        describe_status(&status),
                        Self::last_lines(&proc, 8)
                    ));
                    Phase::Dead {
                        restart_at: now + Duration::from_secs(2),
                    }
                } else {
                    Phase::Running { proc }
                }
            }
            Phase::Paused { proc, resume_at } => {
                if now >= resume_at {
                    match proc.resume() {
                        Ok(()) => self.note(format!("SIGCONT {id}")),
                        Err(err) => self.note(format!("SIGCONT {id} failed: {err}")),
                    }
                    self.resumed(i);
                    Phase::Running { proc }
                } else {
                    Phase::Paused { proc, resume_at }
                }
            }
            Phase::Terminating { mut proc, since } => {
                if proc.try_status().is_some() {
                    let status = proc.wait_exit(Duration::from_secs(5)).await;
                    self.save_log(i, &proc);
                    let took = since.elapsed().as_secs_f64();
                    let described = describe_status(&status);
                    self.term_exits.push((id.clone(), took, described.clone()));
                    let clean = matches!(&status, Ok(s) if s.success());
                    if clean {
                        self.note(format!(
                            "{id} exited after SIGTERM in {took:.1} s ({described})"
                        ));
                    } else {
                        self.finding(format!(
                            "{id} did not exit cleanly after SIGTERM ({described}, {took:.1} s); last lines: {}",
                            Self::last_lines(&proc, 8)
                        ));
                    }
                    let delay = self.rng.secs(1.0, 3.0);
                    Phase::Dead {
                        restart_at: now + delay,
                    }
                } else if since.elapsed() > Duration::from_secs(30) {
                    self.finding(format!(
                        "{id} had not exited 30 s after SIGTERM (drain bounds are 2 s); SIGKILL. Last lines: {}",
                        Self::last_lines(&proc, 8)
                    ));
                    let _ = proc.kill();
                    let _ = proc.wait_exit(Duration::from_secs(5)).await;
                    self.save_log(i, &proc);
                    Phase::Dead {
                        restart_at: now + Duration::from_secs(1),
                    }
                } else {
                    Phase::Terminating { proc, since }
                }
            }
            Phase::Dead { restart_at } => Phase::Dead { restart_at },
        };
        self.slots[i].phase = next;
        if let Phase::Dead { restart_at } = self.slots[i].phase
            && now >= restart_at
            && self.slots[i].hold_until.is_none_or(|t| now >= t)
        {
            self.start_node(i);
        }
    }

    /// SIGKILLs a node's process and schedules its restart.
    pub(super) async fn kill_slot(&mut self, i: usize, restart_after: Duration) {
        let now = Instant::now();
        let phase = std::mem::replace(
            &mut self.slots[i].phase,
            Phase::Dead {
                restart_at: now + restart_after,
            },
        );
        let proc = match phase {
            Phase::Starting { proc, .. }
            | Phase::Running { proc }
            | Phase::Paused { proc, .. }
            | Phase::Terminating { proc, .. } => Some(proc),
            Phase::Dead { .. } => None,
        };
        if let Some(mut proc) = proc {
            let _ = proc.kill();
            let _ = proc.wait_exit(Duration::from_secs(10)).await;
            self.save_log(i, &proc);
        }
    }
}
