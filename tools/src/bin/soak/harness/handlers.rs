//! Handlers as the nodes report them (`SOAK-HANDLER` lines), and running jobs compared with
//! those handlers; what the stalls of issue 22 need.

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use forge::LockNamespace;
use forge::jobs::{Jobs, NewJob};
use forge_testkit::NodeProcess;
use tokio::time::Instant;

use super::{HandlerSpan, Handlerless, Harness, Phase, Stranded};
use crate::node::{HogArgs, hog_job};
use crate::{ADMIN_TIMEOUT, STRANDED_AFTER};

impl Harness {
    /// Reads the `SOAK-HANDLER` lines of slot `i`'s current process past its cursor.
    pub(super) fn scan_handlers(&mut self, i: usize, lines: &[String]) {
        let from = self.slots[i].cursor.min(lines.len());
        // A process with a skewed wall clock prints skewed times.
        let skew_us = self.slots[i].clock_us;
        for line in &lines[from..] {
            let Some(rest) = line.strip_prefix("SOAK-HANDLER ") else {
                continue;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let (Some(what), Some(job), Some(attempt), Some(us)) = (
                fields.first(),
                fields.get(1).and_then(|v| v.parse::<i64>().ok()),
                fields.get(2).and_then(|v| v.parse::<i32>().ok()),
                fields
                    .get(3)
                    .and_then(|v| v.parse::<i64>().ok())
                    .map(|us| us - skew_us),
            ) else {
                continue;
            };
            match *what {
                "start" => {
                    self.spans.push(HandlerSpan {
                        slot: i,
                        job,
                        attempt,
                        start_us: us,
                        end_us: None,
                        died: false,
                    });
                    let n = self.spans.len() - 1;
                    self.slots[i].open.insert((job, attempt), n);
                }
                "end" => {
                    if let Some(n) = self.slots[i].open.remove(&(job, attempt)) {
                        self.spans[n].end_us = Some(us);
                    }
                }
                _ => {}
            }
        }
        self.slots[i].cursor = lines.len();
    }

    /// Reads the handler lines of slot `i`'s running process.
    pub(super) fn scan_current(&mut self, i: usize) {
        let Some(lines) = self.slots[i].phase.proc().map(NodeProcess::lines) else {
            return;
        };
        self.scan_handlers(i, &lines);
    }

    /// Slot `i`'s process is gone: its handlers end with it.
    pub(super) fn process_ended(&mut self, i: usize) {
        let now = Utc::now().timestamp_micros();
        for (_, n) in self.slots[i].open.drain() {
            self.spans[n].end_us = Some(now);
            self.spans[n].died = true;
        }
        self.slots[i].cursor = 0;
        self.resumed(i);
    }

    /// Slot `i` is not SIGSTOPped (any more).
    pub(super) fn resumed(&mut self, i: usize) {
        if let Some(since) = self.slots[i].paused_since_us.take() {
            self.pauses.push((i, since, Utc::now().timestamp_micros()));
        }
    }

    /// SIGSTOPs slot `i` until `until` (it must be running).
    pub(super) fn freeze_slot(&mut self, i: usize, until: Instant) -> Result<(), String> {
        let now = Instant::now();
        let phase = std::mem::replace(&mut self.slots[i].phase, Phase::Dead { restart_at: now });
        let Phase::Running { proc } = phase else {
            self.slots[i].phase = phase;
            return Err("not running".into());
        };
        if let Err(err) = proc.pause() {
            self.slots[i].phase = Phase::Running { proc };
            return Err(err.to_string());
        }
        self.slots[i].phase = Phase::Paused {
            proc,
            resume_at: until,
        };
        self.slots[i].paused_since_us = Some(Utc::now().timestamp_micros());
        Ok(())
    }

    /// The time the harness's own write stalls took up to `now`.
    fn stall_total(&self, now: Instant) -> Duration {
        self.stalls
            .iter()
            .map(|(from, to)| to.unwrap_or(now).min(now).saturating_duration_since(*from))
            .sum()
    }

    pub(super) fn end_stall(&mut self) {
        if let Some((_, to)) = self.stalls.last_mut()
            && to.is_none()
        {
            *to = Some(Instant::now());
        }
    }

    /// Compares the jobs the database shows `running` with the handlers the nodes report:
    /// a job whose attempt has no live handler (on the process its node runs now, SIGSTOPped
    /// or not) for longer than [`STRANDED_AFTER`] is stranded.
    pub(super) async fn sample_jobs(&mut self) {
        for i in 0..self.slots.len() {
            self.scan_current(i);
        }
        if self.table_lock.is_some() {
            // forge.jobs cannot be read under the harness's own lock (its time is a stall).
            return;
        }
        let rows = tokio::time::timeout(
            Duration::from_secs(3),
            sqlx::query_as::<_, (i64, i32, Option<String>)>(
                "SELECT id, attempt, node_id FROM forge.jobs WHERE state = 'running'",
            )
            .fetch_all(&self.admin),
        )
        .await;
        let Ok(Ok(rows)) = rows else {
            self.sample_failures += 1;
            return;
        };
        self.samples += 1;
        let now = Instant::now();
        let at = self.secs();
        let stall_now = self.stall_total(now);
        let mut seen = HashSet::new();
        for (job, attempt, node) in rows {
            let key = (job, attempt);
            seen.insert(key);
            let node = node.unwrap_or_default();
            let live = self
                .slots
                .iter()
                .any(|s| s.id == node && s.open.contains_key(&key));
            if live {
                self.handlerless.remove(&key);
                continue;
            }
            let entry = self.handlerless.entry(key).or_insert(Handlerless {
                node,
                first: now,
                first_at: at,
                stall_at_first: stall_now,
            });
            let age = (now - entry.first)
                .saturating_sub(stall_now.saturating_sub(entry.stall_at_first))
                .as_secs_f64();
            self.max_handlerless = self.max_handlerless.max(age);
            if age > STRANDED_AFTER.as_secs_f64() {
                let (node, first_at) = (entry.node.clone(), entry.first_at);
                let new = !self.stranded.contains_key(&key);
                let record = self.stranded.entry(key).or_insert(Stranded {
                    node: node.clone(),
                    first_at,
                    age,
                    still: true,
                });
                record.age = age;
                record.still = true;
                if new {
                    self.note(format!(
                        "STRANDED: job {job} attempt {attempt} running on {node} with no live handler for {age:.0} s (since {first_at:.1}s)"
                    ));
                }
            }
        }
        self.handlerless.retain(|key, _| seen.contains(key));
        for (key, record) in &mut self.stranded {
            if !seen.contains(key) {
                record.still = false;
            }
        }
    }

    /// `sql`, a count with one text parameter, by the harness; `None` if it failed.
    pub(super) async fn count(&self, sql: &'static str, arg: &str) -> Option<i64> {
        tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar::<_, i64>(sql)
                .bind(arg)
                .fetch_one(&self.admin),
        )
        .await
        .ok()
        .and_then(Result::ok)
    }

    /// Enqueues pool hogs only slot `i` works: `(delay, hold)` each.
    pub(super) async fn enqueue_hogs(&self, i: usize, hogs: &[(Duration, Duration)]) -> bool {
        let jobs = Jobs::new(self.admin.clone(), &LockNamespace::default());
        let batch: Vec<NewJob> = hogs
            .iter()
            .filter_map(|(delay, hold)| {
                let args = HogArgs {
                    hold_ms: hold.as_millis() as u64,
                };
                hog_job(&self.slots[i].id, args).map(|job| job.delay(*delay))
            })
            .collect();
        matches!(
            tokio::time::timeout(ADMIN_TIMEOUT, jobs.enqueue_many(batch)).await,
            Ok(Ok(_))
        )
    }
}
