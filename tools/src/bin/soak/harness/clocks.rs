//! The clock faults: the database's wall clock stepped while it runs (PostgreSQL runs under
//! libfaketime, its monotonic clock true, as in an NTP step), and a node process restarted with
//! its wall clock minutes off. Issue 31: liveness is judged on each observer's monotonic clock,
//! so neither may depose a healthy leader, mark a live node down, or lose or double a tick.

use std::time::Duration;

use tokio::time::Instant;

use super::faults::{SETTLE, Snapshot};
use super::{Harness, Phase};
use crate::options::FaultKind;
use crate::{ADMIN_TIMEOUT, DOWN_AFTER, LEASE};

/// How far `db-clock-ahead` and `db-clock-behind` step the database's clock.
const DB_STEP: Duration = Duration::from_secs(90);
/// The node clock skews, in turn: libfaketime's `FAKETIME` and the same in seconds.
const NODE_SKEWS: [(&str, i64); 2] = [("+5m", 300), ("-5m", -300)];

/// The database's clock stepped until `until`, then put back to true time.
pub(in crate::harness) struct DbClock {
    kind: FaultKind,
    step_ms: i64,
    since: Instant,
    until: Instant,
    /// When it was put back to true time.
    back_at: Option<Instant>,
    before: Snapshot,
}

/// A node restarted with a skewed clock, run a while, restarted true.
pub(in crate::harness) struct Skew {
    slot: usize,
    offset: &'static str,
    since: Instant,
    before: Snapshot,
    stage: SkewStage,
}

enum SkewStage {
    /// SIGTERM sent: waiting for the next process (after `incarnation`) to be ready, skewed.
    Skewing { incarnation: u32, deadline: Instant },
    /// The skewed process runs until `until`.
    Skewed { until: Instant },
    /// SIGTERM sent: waiting for the next process, true.
    Restoring { incarnation: u32, deadline: Instant },
}

impl Harness {
    /// Steps the database's clock by ±90 s or ±down_after (alternating), held a few heartbeats
    /// and beyond a lease.
    pub(super) async fn step_db_clock(&mut self, kind: FaultKind) -> Option<String> {
        if self.standby_build.is_some()
            || self.pending_failover.is_some()
            || self.primary.clock_offset_ms().is_none()
        {
            return None;
        }
        let step_ms = match kind {
            FaultKind::DbClockAhead => DB_STEP.as_millis() as i64,
            FaultKind::DbClockBehind => -(DB_STEP.as_millis() as i64),
            _ => {
                self.down_after_steps += 1;
                let ms = DOWN_AFTER.as_millis() as i64;
                if self.down_after_steps % 2 == 1 {
                    ms
                } else {
                    -ms
                }
            }
        };
        let hold = self.rng.secs(
            LEASE.as_secs_f64() + 3.0,
            LEASE.as_secs_f64() + DOWN_AFTER.as_secs_f64() + 6.0,
        );
        let before = self.snapshot().await?;
        let by = Duration::from_millis(step_ms.unsigned_abs());
        let stepped = if step_ms > 0 {
            self.primary.step_clock_ahead(by)
        } else {
            self.primary.step_clock_back(by)
        };
        if let Err(err) = stepped {
            self.note(format!("stepping the database's clock failed: {err}"));
            return None;
        }
        self.set_soak_clock(step_ms).await;
        let now = Instant::now();
        self.db_clock = Some(DbClock {
            kind,
            step_ms,
            since: now,
            until: now + hold,
            back_at: None,
            before,
        });
        Some(format!(
            "the database's wall clock stepped {:+.0} s (libfaketime under PostgreSQL; its monotonic clock and the nodes' clocks true) for {:.1} s (lease {} s, heartbeat 500 ms, down_after {} s), then back to true time",
            step_ms as f64 / 1000.0,
            hold.as_secs_f64(),
            LEASE.as_secs(),
            DOWN_AFTER.as_secs()
        ))
    }

    pub(super) async fn tend_db_clock(&mut self) {
        let Some(clock) = &self.db_clock else {
            return;
        };
        let now = Instant::now();
        match clock.back_at {
            None if now >= clock.until => {
                let held = clock.since.elapsed().as_secs_f64();
                if let Err(err) = self.primary.step_clock_to_true_time() {
                    self.note(format!(
                        "putting the database's clock back failed ({err}); retrying"
                    ));
                    return;
                }
                self.set_soak_clock(0).await;
                if let Some(clock) = &mut self.db_clock {
                    clock.back_at = Some(now);
                }
                self.note(format!(
                    "the database's clock is back to true time after {held:.1} s"
                ));
            }
            Some(back) if now >= back + SETTLE => {
                let Some(clock) = self.db_clock.take() else {
                    return;
                };
                let what = self.outcome_since(&clock.before).await;
                self.outcome(
                    clock.kind,
                    format!(
                        "database clock {:+.0} s for {:.1} s, then true (watched {} s more): {what}",
                        clock.step_ms as f64 / 1000.0,
                        (back - clock.since).as_secs_f64(),
                        SETTLE.as_secs()
                    ),
                );
            }
            _ => {}
        }
    }

    /// Tells the soak's tables how far the database's clock is from the true time
    /// (`soak_clock`, read by `soak_now()`), so that the times they record stay true.
    async fn set_soak_clock(&mut self, offset_ms: i64) {
        let set = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query("UPDATE soak_clock SET offset_us = $1")
                .bind(offset_ms * 1000)
                .execute(&self.admin),
        )
        .await;
        if !matches!(set, Ok(Ok(_))) {
            self.finding(format!(
                "harness: recording the database's clock offset ({offset_ms} ms) failed: the soak's times of this step are the server's"
            ));
        }
    }

    /// Restarts a node (SIGTERM, then the harness's restart) with its wall clock 5 minutes
    /// ahead or behind, in turn.
    pub(super) async fn start_skew(&mut self) -> Option<String> {
        let (i, note) = self.pick_node(true).await?;
        let (offset, secs) = NODE_SKEWS[self.skews as usize % NODE_SKEWS.len()];
        let before = self.snapshot().await?;
        let incarnation = self.slots[i].incarnation;
        if let Err(err) = self.terminate_slot(i)? {
            self.note(format!("SIGTERM {} failed: {err}", self.slots[i].id));
            return None;
        }
        self.skews += 1;
        self.slots[i].skew = Some((offset, secs));
        let now = Instant::now();
        self.skew = Some(Skew {
            slot: i,
            offset,
            since: now,
            before,
            stage: SkewStage::Skewing {
                incarnation,
                deadline: now + Duration::from_secs(60),
            },
        });
        Some(format!(
            "{}{note} restarted (SIGTERM) with its wall clock {offset} (libfaketime; its monotonic clock true), run 20-40 s, then restarted with a true clock",
            self.slots[i].id
        ))
    }

    pub(super) async fn tend_skew(&mut self) {
        let Some(skew) = &self.skew else {
            return;
        };
        let (i, offset) = (skew.slot, skew.offset);
        let id = self.slots[i].id.clone();
        let running = matches!(self.slots[i].phase, Phase::Running { .. });
        let now = Instant::now();
        match skew.stage {
            SkewStage::Skewing {
                incarnation,
                deadline,
            } => {
                if running && self.slots[i].incarnation > incarnation {
                    let until = now + self.rng.secs(20.0, 40.0);
                    self.note(format!("{id} runs with its clock {offset}"));
                    if let Some(skew) = &mut self.skew {
                        skew.stage = SkewStage::Skewed { until };
                    }
                } else if now >= deadline {
                    self.finding(format!(
                        "{id} did not come back with its clock {offset} within 60 s"
                    ));
                    self.slots[i].skew = None;
                    self.skew = None;
                }
            }
            SkewStage::Skewed { until } => {
                if now < until {
                    return;
                }
                self.slots[i].skew = None;
                let incarnation = self.slots[i].incarnation;
                // A process that is not running (it exited) restarts true anyway.
                if let Some(Err(err)) = self.terminate_slot(i) {
                    self.note(format!("SIGTERM {id} failed: {err}"));
                }
                self.note(format!("{id}: restarting it with a true clock"));
                if let Some(skew) = &mut self.skew {
                    skew.stage = SkewStage::Restoring {
                        incarnation,
                        deadline: now + Duration::from_secs(60),
                    };
                }
            }
            SkewStage::Restoring {
                incarnation,
                deadline,
            } => {
                let back = running && self.slots[i].incarnation > incarnation;
                if !back && now < deadline {
                    return;
                }
                let Some(skew) = self.skew.take() else {
                    return;
                };
                let what = self.outcome_since(&skew.before).await;
                self.outcome(
                    FaultKind::NodeClockSkew,
                    format!(
                        "{id} ran with its clock {offset}, {:.0} s in all with its restarts{}: {what}",
                        skew.since.elapsed().as_secs_f64(),
                        if back {
                            ""
                        } else {
                            "; NOT back with a true clock within 60 s"
                        }
                    ),
                );
            }
        }
    }

    /// After the faults: the database's clock true, no node skewed.
    pub(super) async fn heal_clocks(&mut self) {
        if let Some(clock) = &mut self.db_clock {
            clock.until = Instant::now();
        }
        self.tend_db_clock().await;
        if let Some(clock) = &mut self.db_clock {
            clock.back_at = clock.back_at.map(|_| Instant::now() - SETTLE);
        }
        self.tend_db_clock().await;
        if let Some(skew) = self.skew.take() {
            let i = skew.slot;
            if self.slots[i].skew.take().is_some()
                && let Some(Err(err)) = self.terminate_slot(i)
            {
                self.note(format!("SIGTERM {} failed: {err}", self.slots[i].id));
            }
            let what = self.outcome_since(&skew.before).await;
            self.outcome(
                FaultKind::NodeClockSkew,
                format!(
                    "{} ran with its clock {} (cut short by the end of the faults): {what}",
                    self.slots[i].id, skew.offset
                ),
            );
        }
    }
}
