//! The ticks earlier tenures claimed and did not finish: rerun or abandoned.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge_core::Leadership;
use tracing::warn;

use super::super::ledger;
use super::super::{CronJob, Interrupted, TickState};
use super::MAX_TICK_ATTEMPTS;
use super::batch::Batchers;
use super::outcomes::{CronMetrics, retrying, run_tick};

/// Handles the ticks earlier tenures claimed and did not finish, one after another: takes
/// each over (rerun as the next attempt, or abandoned), retrying a failed take-over until it
/// is known or this leadership ends - a tick left `running` under a dead tenure would
/// otherwise wait for the next failover - then reruns it.
pub(super) async fn recover(
    cron: CronJob,
    metrics: Arc<CronMetrics>,
    leadership: Leadership,
    batchers: Batchers,
    interrupted: Vec<(DateTime<Utc>, i32, i64)>,
) {
    for (tick, attempt, epoch) in interrupted {
        let rerun = cron.interrupted == Interrupted::Rerun && attempt < MAX_TICK_ATTEMPTS;
        let mut pause = Duration::from_millis(50);
        let taken = loop {
            if !leadership.is_valid() || leadership.is_draining() {
                return;
            }
            let bound = leadership.lease_duration();
            match tokio::time::timeout(bound, ledger::reclaim(&cron, &leadership, tick, rerun))
                .await
            {
                Ok(Ok(taken)) => break taken,
                Ok(Err(err)) => retrying(
                    &cron,
                    tick,
                    Some(&err),
                    "cannot take over an interrupted tick yet",
                ),
                Err(_) => retrying(
                    &cron,
                    tick,
                    None,
                    "taking over an interrupted tick got no answer in time",
                ),
            }
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = leadership.stopping() => return,
            }
            pause = (pause * 2).min(Duration::from_secs(2));
        };
        match taken {
            Some(attempt) if rerun => {
                warn!(target: "forge::cron", cron = %cron.name, %tick, attempt, previous_epoch = epoch,
                      "rerunning a tick whose run was cut short by its leader's death");
                run_tick(
                    cron.clone(),
                    metrics.clone(),
                    leadership.clone(),
                    &batchers,
                    tick,
                    attempt as u32,
                )
                .await;
            }
            Some(_) => {
                metrics.runs(TickState::Abandoned).increment(1);
                warn!(target: "forge::cron", cron = %cron.name, %tick, attempt, previous_epoch = epoch,
                      "abandoned a tick whose run was cut short by its leader's death");
            }
            // Finished meanwhile (the earlier tenure's outcome landed late): nothing to do.
            None => {}
        }
    }
}
