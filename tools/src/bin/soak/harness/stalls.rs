//! The harness's own write stalls: a table lock on `forge.jobs`, a frozen synchronous
//! standby.

use std::time::Duration;

use forge::LockNamespace;
use forge::jobs::{Jobs, NewJob};
use tokio::time::Instant;

use super::{Harness, TableLock, WriteStall};
use crate::node::{HogArgs, soak_burst_job};
use crate::options::FaultKind;
use crate::{ADMIN_TIMEOUT, BURST, STATEMENT_BOUND};

impl Harness {
    // --- A table lock on forge.jobs.

    pub(super) async fn lock_jobs_table(&mut self) -> Option<String> {
        let hold = self.rng.secs(18.0, 22.0);
        let started = Instant::now();
        let locked = tokio::time::timeout(ADMIN_TIMEOUT, async {
            let mut tx = self.admin.begin().await?;
            sqlx::query("LOCK TABLE forge.jobs IN ACCESS EXCLUSIVE MODE")
                .execute(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(tx)
        })
        .await;
        let tx = match locked {
            Ok(Ok(tx)) => tx,
            Ok(Err(err)) => {
                self.note(format!("LOCK TABLE forge.jobs failed: {err}"));
                return None;
            }
            Err(_) => {
                self.note("LOCK TABLE forge.jobs: no lock within 5 s");
                return None;
            }
        };
        let waited = started.elapsed().as_secs_f64();
        let now = Instant::now();
        self.stalls.push((now, None));
        self.table_lock = Some(TableLock {
            tx,
            since: now,
            until: now + hold,
        });
        Some(format!(
            "LOCK TABLE forge.jobs IN ACCESS EXCLUSIVE MODE (a migration's or an operator's) for {:.1} s (granted after {waited:.2} s)",
            hold.as_secs_f64()
        ))
    }

    pub(super) async fn tend_table_lock(&mut self) {
        if self
            .table_lock
            .as_ref()
            .is_none_or(|l| Instant::now() < l.until)
        {
            return;
        }
        let Some(lock) = self.table_lock.take() else {
            return;
        };
        let held = lock.since.elapsed().as_secs_f64();
        let committed = tokio::time::timeout(ADMIN_TIMEOUT, lock.tx.commit()).await;
        self.end_stall();
        self.note(format!(
            "released the lock on forge.jobs after {held:.1} s{}",
            match committed {
                Ok(Ok(())) => String::new(),
                Ok(Err(err)) => format!(" (COMMIT failed: {err}; the connection ends it)"),
                Err(_) => " (COMMIT timed out; the connection ends it)".to_owned(),
            }
        ));
    }

    // --- A write stall: the standby made synchronous, its WAL receiver frozen.

    /// A write stall; with `kill`, a node is SIGKILLed 1-3 s into it (its claims of the burst
    /// waiting at commit) and restarted at once with the same id: its old backends' claims
    /// commit when the stall ends, after the new process looked for its own jobs.
    pub(super) async fn start_write_stall(&mut self, kill: bool) -> Option<String> {
        if self.standby_build.is_some() || self.pending_failover.is_some() {
            return None;
        }
        let standby = self.standby.clone()?;
        let kill = if kill {
            let (i, note) = self.pick_node(true).await?;
            let before = self.snapshot().await?;
            let at = Instant::now() + self.rng.secs(1.0, 3.0);
            Some((i, note, at, before))
        } else {
            None
        };
        let primary = self.primary.clone();
        if let Err(err) = primary
            .set_synchronous_standby(Some(&standby), Duration::from_secs(10))
            .await
        {
            self.note(format!("making the standby synchronous failed: {err}"));
            let _ = primary
                .set_synchronous_standby(None, Duration::from_secs(10))
                .await;
            return None;
        }
        // Jobs to claim while commits stall: the burst commits (the standby still answers),
        // the workers start claiming it, and the WAL receiver freezes meanwhile.
        let jobs = Jobs::new(self.admin.clone(), &LockNamespace::default());
        let burst: Vec<NewJob> = (0..BURST)
            .map(|_| NewJob::new(soak_burst_job, HogArgs { hold_ms: 100 }))
            .collect();
        let burst = matches!(
            tokio::time::timeout(ADMIN_TIMEOUT, jobs.enqueue_many(burst)).await,
            Ok(Ok(_))
        );
        let pid = match standby.pause_wal_receiver().await {
            Ok(pid) => pid,
            Err(err) => {
                self.note(format!("freezing the standby's WAL receiver failed: {err}"));
                let _ = primary
                    .set_synchronous_standby(None, Duration::from_secs(10))
                    .await;
                return None;
            }
        };
        let hold = STATEMENT_BOUND + self.rng.secs(1.0, 10.0);
        let now = Instant::now();
        self.stalls.push((now, None));
        let killing = kill.as_ref().map_or(String::new(), |(i, note, at, _)| {
            format!(
                "; SIGKILL {}{note} {:.1} s into it, restarted at once with the same id",
                self.slots[*i].id,
                at.saturating_duration_since(now).as_secs_f64()
            )
        });
        self.write_stall = Some(WriteStall {
            standby,
            since: now,
            until: now + hold,
            resumed: false,
            kill: kill.map(|(i, _, at, before)| (i, at, before)),
        });
        Some(format!(
            "write stall for {:.1} s (statement bound {} s): the standby is made synchronous, {} no-op jobs are enqueued and its WAL receiver (pid {pid}) SIGSTOPped while they are claimed; commits on the primary wait, reads do not{killing}",
            hold.as_secs_f64(),
            STATEMENT_BOUND.as_secs(),
            if burst { BURST } else { 0 }
        ))
    }

    pub(super) async fn tend_write_stall(&mut self) {
        let Some(stall) = &self.write_stall else {
            return;
        };
        if let Some((i, at, _)) = &stall.kill
            && !stall.resumed
            && Instant::now() >= *at
        {
            let i = *i;
            let incarnation = self.slots[i].incarnation;
            let waiting = self
                .count(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE application_name = $1 AND wait_event = 'SyncRep'",
                    &format!("forge:pool:{}", self.slots[i].id),
                )
                .await
                .unwrap_or(-1);
            if let Some(WriteStall {
                kill: Some((_, at, _)),
                ..
            }) = &mut self.write_stall
            {
                // Killed once: the restarted process is not killed again.
                *at = Instant::now() + Duration::from_secs(3600 * 24);
            }
            self.kill_slot(i, Duration::ZERO).await;
            self.note(format!(
                "SIGKILL {} (incarnation {incarnation}) in the write stall, {waiting} of its pool sessions waiting at commit; restarted at once with the same id",
                self.slots[i].id
            ));
        }
        let Some(stall) = &self.write_stall else {
            return;
        };
        if Instant::now() < stall.until {
            return;
        }
        let standby = stall.standby.clone();
        let primary = self.primary.clone();
        if !stall.resumed {
            if let Err(err) = standby.resume_wal_receiver().await {
                self.note(format!(
                    "resuming the standby's WAL receiver failed ({err}); retrying"
                ));
                return;
            }
            if let Some(stall) = &mut self.write_stall {
                stall.resumed = true;
            }
            self.end_stall();
        }
        match primary
            .set_synchronous_standby(None, Duration::from_secs(10))
            .await
        {
            Ok(()) => {
                let Some(stall) = self.write_stall.take() else {
                    return;
                };
                let took = stall.since.elapsed().as_secs_f64();
                self.note(format!(
                    "write stall over after {took:.1} s: the WAL receiver runs again, the primary is asynchronous again"
                ));
                if let Some((i, _, before)) = stall.kill {
                    let id = self.slots[i].id.clone();
                    let running = self
                        .count(
                            "SELECT count(*) FROM forge.jobs WHERE state = 'running' AND node_id = $1",
                            &id,
                        )
                        .await
                        .unwrap_or(-1);
                    let what = self.outcome_since(&before).await;
                    self.outcome(
                        FaultKind::KillInWriteStall,
                        format!(
                            "{id} killed in a {took:.1} s write stall and restarted with the same id (incarnation {} now, {}); at the stall's end {running} jobs running on {id} in the database, {} handlers open in its process: {what}",
                            self.slots[i].incarnation,
                            self.slots[i].phase.label(),
                            self.slots[i].open.len()
                        ),
                    );
                }
            }
            Err(err) => self.note(format!(
                "making the primary asynchronous again failed ({err}); retrying"
            )),
        }
    }
}
