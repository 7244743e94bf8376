//! Frozen inside a transaction: a node SIGSTOPped while its job's or tick's transaction is
//! open.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::{Freeze, FreezeStage, Harness, Phase};
use crate::{ADMIN_TIMEOUT, DOWN_AFTER, FREEZE_CRON_FLAG, FREEZE_JOB_FLAG};

impl Harness {
    pub(super) async fn arm_freeze(&mut self, cron: bool) -> Option<String> {
        let (i, note) = if cron {
            self.eligible_scheduler_leader().await?
        } else {
            self.pick_node(true).await?
        };
        let flag = if cron {
            FREEZE_CRON_FLAG
        } else {
            FREEZE_JOB_FLAG
        };
        let id = self.slots[i].id.clone();
        if !self.set_flag(flag, &id, true).await {
            return None;
        }
        let hold = DOWN_AFTER + self.rng.secs(1.0, 8.0);
        let compound = !cron && self.rng.chance(0.5);
        self.freeze = Some(Freeze {
            slot: i,
            flag,
            cron,
            hold,
            compound,
            stage: FreezeStage::Armed {
                deadline: Instant::now() + Duration::from_secs(15),
            },
        });
        let what = if cron {
            "its next soak_tick transaction, after CronContext::complete"
        } else {
            "its next soak_tx_job transaction, after JobContext::complete"
        };
        Some(format!(
            "freeze inside a transaction on {id}{note}: {what}, stays open; SIGSTOP {id} while it does, for {:.1} s (down_after {} s), then SIGCONT{}",
            hold.as_secs_f64(),
            DOWN_AFTER.as_secs(),
            if compound {
                "; meanwhile another node runs a long job and is SIGKILLed once the frozen one is marked down (restarted after the thaw)"
            } else {
                ""
            }
        ))
    }

    pub(super) async fn tend_freeze(&mut self) {
        let Some(freeze) = &self.freeze else {
            return;
        };
        let (i, flag, cron, hold, compound) = (
            freeze.slot,
            freeze.flag,
            freeze.cron,
            freeze.hold,
            freeze.compound,
        );
        let id = self.slots[i].id.clone();
        match freeze.stage {
            FreezeStage::Armed { deadline } => {
                if !matches!(self.slots[i].phase, Phase::Running { .. }) {
                    self.freeze = None;
                    self.disarm(flag, &id, "freeze", "the node stopped running")
                        .await;
                    return;
                }
                let holding = tokio::time::timeout(
                    ADMIN_TIMEOUT,
                    sqlx::query_as::<_, (i32, String)>(
                        "SELECT pid, application_name FROM pg_stat_activity
                          WHERE application_name LIKE $1 AND state = 'idle in transaction'
                            AND query LIKE '%soak_hold_marker%'
                          LIMIT 1",
                    )
                    .bind(format!("forge:%:{id}"))
                    .fetch_optional(&self.admin),
                )
                .await;
                if let Ok(Ok(Some((pid, app)))) = holding {
                    let until = Instant::now() + hold;
                    if let Err(err) = self.freeze_slot(i, until) {
                        self.freeze = None;
                        self.disarm(flag, &id, "freeze", &format!("SIGSTOP failed ({err})"))
                            .await;
                        return;
                    }
                    for _ in 0..10 {
                        if self.set_flag(flag, &id, false).await {
                            break;
                        }
                    }
                    self.note(format!(
                        "SIGSTOP {id} for {:.1} s while its {} transaction (backend {pid}, {app}) is open after complete",
                        hold.as_secs_f64(),
                        if cron { "tick" } else { "job" }
                    ));
                    // The compound variant: another node runs a long job now, so that it
                    // has one to be rescued when it is killed.
                    let mut victim = None;
                    if compound {
                        let candidates: Vec<usize> = (0..self.slots.len())
                            .filter(|j| *j != i && self.eligible(*j))
                            .collect();
                        if !candidates.is_empty() {
                            let j = candidates[self.rng.below(candidates.len())];
                            let hold = hold + Duration::from_secs(10);
                            if self.enqueue_hogs(j, &[(Duration::ZERO, hold)]).await {
                                victim = Some(j);
                                self.note(format!(
                                    "{} runs a {:.0} s job meanwhile (soak_hog_{})",
                                    self.slots[j].id,
                                    hold.as_secs_f64(),
                                    self.slots[j].id
                                ));
                            }
                        }
                    }
                    if let Some(freeze) = &mut self.freeze {
                        freeze.stage = FreezeStage::Frozen {
                            since: Instant::now(),
                            since_utc: Utc::now(),
                            until,
                            down_seen: false,
                            next_check: Instant::now(),
                            victim,
                        };
                    }
                } else if Instant::now() >= deadline {
                    self.freeze = None;
                    self.disarm(flag, &id, "freeze", "no transaction held open within 15 s")
                        .await;
                }
            }
            FreezeStage::Frozen {
                since,
                since_utc,
                until,
                down_seen,
                next_check,
                victim,
            } => {
                let now = Instant::now();
                if now >= until + Duration::from_secs(1) {
                    self.freeze = None;
                    return;
                }
                if down_seen || now < next_check {
                    return;
                }
                let down = tokio::time::timeout(
                    ADMIN_TIMEOUT,
                    sqlx::query_scalar::<_, Option<DateTime<Utc>>>(
                        "SELECT min(at) FROM soak_events
                          WHERE kind = 'node_down' AND node_id = $1 AND at >= $2",
                    )
                    .bind(&id)
                    .bind(since_utc)
                    .fetch_one(&self.admin),
                )
                .await;
                let Ok(Ok(Some(down_at))) = down else {
                    if let Some(Freeze {
                        stage: FreezeStage::Frozen { next_check, .. },
                        ..
                    }) = &mut self.freeze
                    {
                        *next_check = now + Duration::from_millis(500);
                    }
                    return;
                };
                if let Some(Freeze {
                    stage: FreezeStage::Frozen { down_seen, .. },
                    ..
                }) = &mut self.freeze
                {
                    *down_seen = true;
                }
                let after = (down_at - since_utc).num_milliseconds() as f64 / 1000.0;
                self.note(format!(
                    "{id} marked down {after:.1} s into its freeze (seen {:.1} s in)",
                    since.elapsed().as_secs_f64()
                ));
                let Some(victim) = victim.filter(|j| self.eligible(*j)) else {
                    return;
                };
                let running = self
                    .count(
                        "SELECT count(*) FROM forge.jobs WHERE state = 'running' AND node_id = $1",
                        &self.slots[victim].id,
                    )
                    .await
                    .unwrap_or(-1);
                let delay =
                    until.saturating_duration_since(Instant::now()) + Duration::from_secs(2);
                self.kill_slot(victim, delay).await;
                self.note(format!(
                    "SIGKILL {} ({running} jobs running on it) while {id} is frozen and marked down; restart in {:.1} s, after the thaw",
                    self.slots[victim].id,
                    delay.as_secs_f64()
                ));
            }
        }
    }
}
