//! The faults: picking a node, drawing from the deck, applying each kind (failover and the
//! standby it needs, backend kills, lost replies).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use forge::LockNamespace;
use forge::jobs::{Jobs, NewJob};
use forge_testkit::Filter;
use tokio::time::Instant;

use super::{Armed, FaultRecord, Harness, Phase, build_standby};

/// How long the cluster is watched after a fault of the clock and claim kinds ends before its
/// outcome is read (a harm done by the fault's end, such as a clock put back, shows within it).
pub(super) const SETTLE: Duration = Duration::from_secs(5);

/// The cluster's history and figures before a fault, to tell what the fault changed.
pub(super) struct Snapshot {
    /// The last `forge.events` id.
    event_id: i64,
    /// Rescued attempts (`errors` entries `rescued`) in all.
    rescues: i64,
    /// Ticks recorded `skipped` in all.
    skipped: i64,
}
use crate::node::{HogArgs, hog_job};
use crate::options::FaultKind;
use crate::{ADMIN_TIMEOUT, DOWN_AFTER, LEASE, POOL_SIZE, SLOW_COMMIT_SECS};

impl Harness {
    pub(super) fn eligible(&self, i: usize) -> bool {
        let slot = &self.slots[i];
        matches!(slot.phase, Phase::Running { .. })
            && slot.blackhole_until.is_none()
            && slot.busy_until.is_none_or(|t| Instant::now() >= t)
            && self.armed.as_ref().is_none_or(|a| a.slot != i)
    }

    pub(super) async fn scheduler_leader(&self) -> Option<String> {
        tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar::<_, String>(
                "SELECT node_id FROM forge.leaders
                  WHERE role = 'scheduler' AND released_at IS NULL AND lease_until > now()",
            )
            .fetch_optional(&self.admin),
        )
        .await
        .ok()?
        .ok()?
    }

    /// The scheduler leader's slot, if it is eligible for a fault.
    pub(super) async fn eligible_scheduler_leader(&self) -> Option<(usize, String)> {
        let leader = self.scheduler_leader().await?;
        let i = (0..self.slots.len()).find(|i| self.slots[*i].id == leader)?;
        self.eligible(i)
            .then(|| (i, " (scheduler leader)".to_owned()))
    }

    /// A node to hurt: the scheduler leader half the time (when eligible), else any eligible
    /// one. Returns the slot and a note saying whether it leads.
    pub(super) async fn pick_node(&mut self, prefer_leader: bool) -> Option<(usize, String)> {
        let eligible: Vec<usize> = (0..self.slots.len())
            .filter(|i| self.eligible(*i))
            .collect();
        if eligible.is_empty() {
            return None;
        }
        let leader = self.scheduler_leader().await;
        let leader_slot = leader
            .as_deref()
            .and_then(|l| eligible.iter().copied().find(|i| self.slots[*i].id == l));
        let pick = match leader_slot {
            Some(i) if prefer_leader && self.rng.chance(0.5) => i,
            _ => eligible[self.rng.below(eligible.len())],
        };
        let note = if leader.as_deref() == Some(self.slots[pick].id.as_str()) {
            " (scheduler leader)".to_owned()
        } else {
            String::new()
        };
        Some((pick, note))
    }

    /// SIGTERMs slot `i`'s running process (restarted once it exited); `None` if it was not
    /// running.
    pub(super) fn terminate_slot(&mut self, i: usize) -> Option<Result<(), forge_testkit::Error>> {
        let now = Instant::now();
        let phase = std::mem::replace(&mut self.slots[i].phase, Phase::Dead { restart_at: now });
        let Phase::Running { proc } = phase else {
            self.slots[i].phase = phase;
            return None;
        };
        let sent = proc.terminate();
        self.slots[i].phase = Phase::Terminating { proc, since: now };
        Some(sent)
    }

    /// What a fault's outcome is compared with: the cluster's history and figures now.
    pub(super) async fn snapshot(&self) -> Option<Snapshot> {
        let (event_id, rescues, skipped): (i64, i64, i64) = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_as(
                "SELECT (SELECT coalesce(max(id), 0) FROM forge.events),
                        (SELECT count(*) FROM forge.jobs j, jsonb_array_elements(j.errors) e
                          WHERE e->>'reason' = 'rescued'),
                        (SELECT count(*) FROM forge.cron_ticks WHERE state = 'skipped')",
            )
            .fetch_one(&self.admin),
        )
        .await
        .ok()?
        .ok()?;
        Some(Snapshot {
            event_id,
            rescues,
            skipped,
        })
    }

    /// What the cluster did since `before`: its leadership and membership events, the jobs it
    /// rescued, the ticks it skipped.
    pub(super) async fn outcome_since(&self, before: &Snapshot) -> String {
        let Some(now) = self.snapshot().await else {
            return "(the database could not be asked)".into();
        };
        let events: Vec<(String, i64)> = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_as(
                "SELECT kind, count(*) FROM forge.events WHERE id > $1 AND id <= $2 GROUP BY 1",
            )
            .bind(before.event_id)
            .bind(now.event_id)
            .fetch_all(&self.admin),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
        let count = |kind: &str| {
            events
                .iter()
                .find(|(k, _)| k == kind)
                .map_or(0, |(_, n)| *n)
        };
        format!(
            "leader_elected {}, leader_lost {}, leader_fenced {}, leader_rebalanced {}, node_drifted {}, node_down {}; jobs rescued {}, ticks skipped {}",
            count("leader_elected"),
            count("leader_lost"),
            count("leader_fenced"),
            count("leader_rebalanced"),
            count("node_drifted"),
            count("node_down"),
            now.rescues - before.rescues,
            now.skipped - before.skipped
        )
    }

    /// Prints a fault's outcome and keeps it for the report.
    pub(super) fn outcome(&mut self, kind: FaultKind, text: String) {
        self.note(format!("OUTCOME {}: {text}", kind.key()));
        self.outcomes.push((kind, text));
    }

    /// Applies the next applicable fault of the deck; false if none was applicable now.
    pub(super) async fn fault(&mut self) -> bool {
        if self.deck.is_empty() {
            let faketime = self.faketime;
            let mut deck: Vec<FaultKind> = self
                .only
                .clone()
                .unwrap_or_else(|| FaultKind::ALL.to_vec())
                .into_iter()
                .filter(|kind| faketime || !kind.needs_faketime())
                .collect();
            for i in (1..deck.len()).rev() {
                let j = self.rng.below(i + 1);
                deck.swap(i, j);
            }
            self.deck = deck;
        }
        let mut passed = Vec::new();
        let mut applied = false;
        while let Some(kind) = self.deck.pop() {
            let before = self.secs();
            if let Some(text) = self.apply(kind).await {
                // A server restart is under way from its first step: the sessions it ends (and
                // the leader changes that follow) come before `apply` returns.
                let at = match kind {
                    FaultKind::PgFastRestart | FaultKind::PgImmediateRestart => before,
                    _ => self.secs(),
                };
                let n = self.faults.len() + 1;
                self.note(format!("FAULT #{n}: {text}"));
                self.faults.push(FaultRecord {
                    at,
                    kind,
                    text,
                    ended: None,
                });
                applied = true;
                break;
            }
            passed.push(kind);
        }
        for kind in passed.into_iter().rev() {
            self.deck.push(kind);
        }
        applied
    }

    async fn apply(&mut self, kind: FaultKind) -> Option<String> {
        match kind {
            FaultKind::SigKill => {
                let (i, note) = self.pick_node(true).await?;
                let delay = self.rng.secs(1.0, 4.0);
                self.kill_slot(i, delay).await;
                Some(format!(
                    "SIGKILL {}{note}; restart in {:.1} s",
                    self.slots[i].id,
                    delay.as_secs_f64()
                ))
            }
            FaultKind::SigTerm => {
                let (i, note) = self.pick_node(true).await?;
                Some(match self.terminate_slot(i)? {
                    Ok(()) => format!(
                        "SIGTERM {}{note} (graceful: drain, hand over); restart once it exited",
                        self.slots[i].id
                    ),
                    Err(err) => format!("SIGTERM {}{note} failed: {err}", self.slots[i].id),
                })
            }
            FaultKind::SigStop => {
                let (i, note) = self.pick_node(true).await?;
                let hold = self.rng.secs(
                    LEASE.as_secs_f64() + 1.0,
                    LEASE.as_secs_f64() + DOWN_AFTER.as_secs_f64(),
                );
                if let Err(err) = self.freeze_slot(i, Instant::now() + hold) {
                    self.note(format!("SIGSTOP {} failed: {err}", self.slots[i].id));
                    return None;
                }
                Some(format!(
                    "SIGSTOP {}{note} for {:.1} s (lease {} s, down_after {} s), then SIGCONT",
                    self.slots[i].id,
                    hold.as_secs_f64(),
                    LEASE.as_secs(),
                    DOWN_AFTER.as_secs()
                ))
            }
            FaultKind::PgFastRestart | FaultKind::PgImmediateRestart => {
                if self.standby_build.is_some() || self.pending_failover.is_some() {
                    return None;
                }
                let fast = kind == FaultKind::PgFastRestart;
                let primary = self.primary.clone();
                let port = primary.port();
                let started = Instant::now();
                let result = tokio::task::spawn_blocking(move || {
                    if fast {
                        primary.restart()
                    } else {
                        primary.restart_immediate()
                    }
                })
                .await;
                let took = started.elapsed().as_secs_f64();
                let what = if fast {
                    "fast restart (pg_ctl stop -m fast, start)"
                } else {
                    "immediate restart (pg_ctl stop -m immediate: crash, recovery)"
                };
                match result {
                    Ok(Ok(())) => Some(format!(
                        "PostgreSQL {what} of the primary (:{port}), {took:.1} s"
                    )),
                    Ok(Err(err)) => {
                        self.finding(format!(
                            "harness: the PostgreSQL {what} failed: {err}; starting it again"
                        ));
                        let primary = self.primary.clone();
                        let _ = tokio::task::spawn_blocking(move || primary.start_again()).await;
                        Some(format!("PostgreSQL {what} of the primary (failed)"))
                    }
                    Err(err) => {
                        self.finding(format!("harness: the PostgreSQL {what} panicked: {err}"));
                        Some(format!("PostgreSQL {what} of the primary (panicked)"))
                    }
                }
            }
            FaultKind::Failover => self.failover().await,
            FaultKind::TerminateNodeSessions => self.terminate("node").await,
            FaultKind::TerminatePoolSessions => self.terminate("pool").await,
            FaultKind::TerminateLockSessions => self.terminate("lock").await,
            FaultKind::BlackHole => {
                let (i, note) = self.pick_node(true).await?;
                let hold = self.rng.secs(
                    DOWN_AFTER.as_secs_f64() + 1.0,
                    DOWN_AFTER.as_secs_f64() + 5.0,
                );
                let silenced = self.slots[i].proxy.blackhole(Filter::All);
                self.slots[i].blackhole_since_us = Some(Utc::now().timestamp_micros());
                self.slots[i].blackhole_until = Some(Instant::now() + hold);
                Some(format!(
                    "black hole on {}{note}'s connections for {:.1} s (down_after {} s): {silenced} open flows silenced, new ones swallowed",
                    self.slots[i].id,
                    hold.as_secs_f64(),
                    DOWN_AFTER.as_secs()
                ))
            }
            FaultKind::PoolStarvation => {
                let (i, note) = self.pick_node(true).await?;
                let hold = self.rng.secs(
                    DOWN_AFTER.as_secs_f64() + 2.0,
                    DOWN_AFTER.as_secs_f64() + 5.0,
                );
                let hold_ms = hold.as_millis() as u64;
                let jobs = Jobs::new(self.admin.clone(), &LockNamespace::default());
                let batch: Vec<NewJob> = (0..POOL_SIZE)
                    .filter_map(|_| hog_job(&self.slots[i].id, HogArgs { hold_ms }))
                    .collect();
                match tokio::time::timeout(ADMIN_TIMEOUT, jobs.enqueue_many(batch)).await {
                    Ok(Ok(_)) => {}
                    _ => return None,
                }
                // Hogs that wait for a connection hold theirs after the first ones: two rounds.
                self.slots[i].busy_until = Some(Instant::now() + hold * 2 + Duration::from_secs(3));
                self.slots[i].starve_check_at = Some(Instant::now() + Duration::from_secs(3));
                Some(format!(
                    "pool starvation on {}{note}: {POOL_SIZE} jobs each hold one of its {POOL_SIZE} pool connections for {:.1} s",
                    self.slots[i].id,
                    hold.as_secs_f64()
                ))
            }
            FaultKind::LostReplyCron => self.arm_lost_reply(true).await,
            FaultKind::LostReplyJob => self.arm_lost_reply(false).await,
            FaultKind::FreezeJobTx => self.arm_freeze(false).await,
            FaultKind::FreezeCronTx => self.arm_freeze(true).await,
            FaultKind::TableLock => self.lock_jobs_table().await,
            FaultKind::StepDownStorm => self.start_storm(),
            FaultKind::ConnectionsFull => self.start_fill().await,
            FaultKind::DbClockAhead | FaultKind::DbClockBehind | FaultKind::DbClockDownAfter => {
                self.step_db_clock(kind).await
            }
            FaultKind::NodeClockSkew => self.start_skew().await,
            FaultKind::KillInWriteStall => self.start_write_stall(true).await,
            FaultKind::WriteStall => self.start_write_stall(false).await,
            FaultKind::FrozenLargeClaim => self.freeze_large_claim().await,
            FaultKind::DelayedRequests => self.delay_requests().await,
        }
    }

    /// A primary failover: at once, or (half the time) after cutting the standby's replication
    /// off for a few seconds, so that the commits of those seconds are lost with the primary,
    /// as in an unplanned failover to an asynchronous standby that had fallen behind.
    async fn failover(&mut self) -> Option<String> {
        if self.standby_build.is_some() || self.pending_failover.is_some() {
            return None;
        }
        self.standby.as_ref()?;
        if self.rng.chance(0.5)
            && let Some(proxy) = &self.repl_proxy
        {
            let lag = self.rng.secs(2.0, 5.0);
            let cut = proxy.blackhole(Filter::Replication);
            self.pending_failover = Some(Instant::now() + lag);
            return Some(format!(
                "lossy primary failover: the standby's replication is black-holed ({cut} flows) for {:.1} s, then the primary crashes and the standby is promoted: the commits of those seconds are lost",
                lag.as_secs_f64()
            ));
        }
        Some(self.fail_over_now().await)
    }

    /// Crashes the primary, promotes the standby, points every proxy at it, and starts
    /// building the next standby.
    pub(super) async fn fail_over_now(&mut self) -> String {
        self.pending_failover = None;
        let Some(standby) = self.standby.clone() else {
            return "primary failover: no standby".into();
        };
        let old = self.primary.clone();
        let old_port = old.port();
        let flushed = old.current_wal_lsn().await.ok();
        let crasher = old.clone();
        let crashed = tokio::task::spawn_blocking(move || crasher.kill_immediate()).await;
        if !matches!(crashed, Ok(Ok(()))) {
            self.finding(format!(
                "harness: crashing the primary for a failover failed: {crashed:?}"
            ));
        }
        let replayed = standby.replay_lsn().await.ok().flatten();
        let promoter = standby.clone();
        let promoted = tokio::task::spawn_blocking(move || promoter.promote()).await;
        if !matches!(promoted, Ok(Ok(()))) {
            self.finding(format!(
                "harness: promoting the standby failed ({promoted:?}); restarting the old primary"
            ));
            let restart = old.clone();
            let _ = tokio::task::spawn_blocking(move || restart.start_again()).await;
            if let Some(proxy) = &self.repl_proxy {
                proxy.heal_all();
            }
            return "primary failover (failed; old primary restarted)".into();
        }
        let (host, port) = (standby.host().to_owned(), standby.port());
        for slot in &self.slots {
            slot.proxy.retarget(&host, port);
            slot.proxy.sever(&Filter::All);
        }
        self.admin_proxy.retarget(&host, port);
        self.admin_proxy.sever(&Filter::All);
        self.primary = standby;
        self.standby = None;
        self.failovers += 1;
        let old_proxy = self.repl_proxy.take();
        // Dropping a cluster waits for its reaper to remove it.
        tokio::task::spawn_blocking(move || drop((old, old_proxy)));
        self.start_standby_build();
        let behind = match (flushed, replayed) {
            (Some(f), Some(r)) => {
                let lost = f.0.saturating_sub(r.0);
                self.failover_losses.push(lost);
                format!("{lost} bytes of WAL behind")
            }
            _ => "lag unknown".into(),
        };
        format!(
            "primary failover: crashed the primary (:{old_port}), promoted the standby (:{port}, {behind}), proxies retargeted; building a new standby"
        )
    }

    fn start_standby_build(&mut self) {
        let primary = self.primary.clone();
        self.standby_build = Some(tokio::task::spawn_blocking(move || build_standby(&primary)));
    }

    pub(super) async fn tend_standby(&mut self) {
        if let Some(build) = &self.standby_build
            && build.is_finished()
            && let Some(build) = self.standby_build.take()
        {
            match build.await {
                Ok(Ok((standby, proxy))) => {
                    self.note(format!(
                        "new streaming standby on 127.0.0.1:{}",
                        standby.port()
                    ));
                    self.standby = Some(Arc::new(standby));
                    self.repl_proxy = Some(proxy);
                }
                Ok(Err(err)) => {
                    self.note(format!(
                        "building a standby failed ({err}); retrying in 10 s"
                    ));
                    self.standby_retry_at = Some(Instant::now() + Duration::from_secs(10));
                }
                Err(err) => {
                    self.note(format!(
                        "building a standby panicked ({err}); retrying in 10 s"
                    ));
                    self.standby_retry_at = Some(Instant::now() + Duration::from_secs(10));
                }
            }
        }
        if self.standby.is_none()
            && self.standby_build.is_none()
            && self.standby_retry_at.is_some_and(|t| Instant::now() >= t)
        {
            self.standby_retry_at = None;
            self.start_standby_build();
        }
    }

    /// `pg_terminate_backend` of one kind of session, of every node or of one.
    async fn terminate(&mut self, kind: &str) -> Option<String> {
        let one = self.rng.chance(0.5);
        let leader = self.scheduler_leader().await;
        let any_node = self.slots[self.rng.below(self.slots.len())].id.clone();
        let pattern = match kind {
            "lock" => {
                let roles = [
                    "scheduler",
                    "scheduler",
                    "metrics_aggregator",
                    "log_compactor",
                ];
                let role = roles[self.rng.below(roles.len())];
                match (one, role, leader) {
                    (true, "scheduler", Some(leader)) => format!("forge:scheduler:{leader}"),
                    (true, _, _) => format!("forge:{role}:{any_node}"),
                    (false, _, _) => format!("forge:{role}:%"),
                }
            }
            _ if one => format!("forge:{kind}:{any_node}"),
            _ => format!("forge:{kind}:%"),
        };
        let terminated = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
                  WHERE application_name LIKE $1 AND pid <> pg_backend_pid()",
            )
            .bind(&pattern)
            .fetch_one(&self.admin),
        )
        .await;
        match terminated {
            Ok(Ok(n)) => Some(format!(
                "pg_terminate_backend of the sessions {pattern:?}: {n} terminated"
            )),
            _ => None,
        }
    }

    pub(super) async fn set_flag(&self, kind: &str, node: &str, on: bool) -> bool {
        let query = if on {
            sqlx::query(
                "INSERT INTO soak_flags (kind, node) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            )
        } else {
            sqlx::query("DELETE FROM soak_flags WHERE kind = $1 AND node = $2")
        };
        matches!(
            tokio::time::timeout(
                ADMIN_TIMEOUT,
                query.bind(kind).bind(node).execute(&self.admin)
            )
            .await,
            Ok(Ok(_))
        )
    }

    async fn arm_lost_reply(&mut self, cron: bool) -> Option<String> {
        if self.armed.is_some() {
            return None;
        }
        let (i, note) = if cron {
            self.eligible_scheduler_leader().await?
        } else {
            self.pick_node(false).await?
        };
        let kind = if cron { "cron" } else { "tx_job" };
        let id = self.slots[i].id.clone();
        if !self.set_flag(kind, &id, true).await {
            return None;
        }
        self.armed = Some(Armed {
            slot: i,
            kind,
            deadline: Instant::now() + Duration::from_secs(15),
        });
        let what = if cron {
            "its next tick's COMMIT"
        } else {
            "its next soak_tx_job COMMIT"
        };
        Some(format!(
            "lost reply after commit on {id}{note}: {what} sleeps {SLOW_COMMIT_SECS} s on the server (deferred trigger); SIGKILL {id} while it does"
        ))
    }

    /// A fault armed by a flag ends without firing: the flag is cleared, the log says why.
    pub(super) async fn disarm(&mut self, flag: &str, id: &str, fault: &str, why: &str) {
        self.set_flag(flag, id, false).await;
        self.note(format!("{fault} on {id}: {why}; disarmed"));
    }

    pub(super) async fn check_armed(&mut self) {
        let Some(armed) = &self.armed else {
            return;
        };
        let (i, kind, deadline) = (armed.slot, armed.kind, armed.deadline);
        let id = self.slots[i].id.clone();
        if !matches!(self.slots[i].phase, Phase::Running { .. }) {
            self.armed = None;
            self.disarm(kind, &id, "lost reply", "the node stopped running")
                .await;
            return;
        }
        let sleeping = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar::<_, i32>(
                "SELECT pid FROM pg_stat_activity
                  WHERE application_name = $1 AND wait_event = 'PgSleep' AND query ILIKE 'commit%'
                  LIMIT 1",
            )
            .bind(format!("forge:pool:{id}"))
            .fetch_optional(&self.admin),
        )
        .await;
        if let Ok(Ok(Some(pid))) = sleeping {
            let delay = self.rng.secs(1.0, 4.0);
            self.kill_slot(i, delay).await;
            self.armed = None;
            self.lost_reply_pids.push(pid);
            for _ in 0..10 {
                if self.set_flag(kind, &id, false).await {
                    break;
                }
            }
            self.note(format!(
                "SIGKILL {id} while its COMMIT (backend {pid}) sleeps at commit: the server completes it, the node never hears the reply; restart in {:.1} s",
                delay.as_secs_f64()
            ));
        } else if Instant::now() >= deadline {
            self.armed = None;
            self.disarm(kind, &id, "lost reply", "no slow COMMIT within 15 s")
                .await;
        }
    }
}
