//! The harness's own write stalls: a table lock on `forge.jobs`, a frozen synchronous
//! standby.

use std::time::Duration;

use forge::LockNamespace;
use forge::jobs::{Jobs, NewJob};
use tokio::time::Instant;

use super::{Harness, TableLock, WriteStall};
use crate::node::{HogArgs, soak_burst_job};
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

    pub(super) async fn start_write_stall(&mut self) -> Option<String> {
        if self.standby_build.is_some() || self.pending_failover.is_some() {
            return None;
        }
        let standby = self.standby.clone()?;
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
        self.write_stall = Some(WriteStall {
            standby,
            since: now,
            until: now + hold,
            resumed: false,
        });
        Some(format!(
            "write stall for {:.1} s (statement bound {} s): the standby is made synchronous, {} no-op jobs are enqueued and its WAL receiver (pid {pid}) SIGSTOPped while they are claimed; commits on the primary wait, reads do not",
            hold.as_secs_f64(),
            STATEMENT_BOUND.as_secs(),
            if burst { BURST } else { 0 }
        ))
    }

    pub(super) async fn tend_write_stall(&mut self) {
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
                let took = self
                    .write_stall
                    .take()
                    .map_or(0.0, |s| s.since.elapsed().as_secs_f64());
                self.note(format!(
                    "write stall over after {took:.1} s: the WAL receiver runs again, the primary is asynchronous again"
                ));
            }
            Err(err) => self.note(format!(
                "making the primary asynchronous again failed ({err}); retrying"
            )),
        }
    }
}
