//! The scheduler's leader task for the crons stored in the database (see `cron/stored.rs`):
//! one cron loop per stored cron, kept in step with the board.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use forge_core::Leadership;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::super::ledger;
use super::super::stored::{EnqueueTick, StoredCron};
use super::{Batchers, Settings, run_cron};

/// A stored cron's loop in this tenure.
struct Kept {
    cron: StoredCron,
    stop: CancellationToken,
    running: JoinHandle<()>,
}

/// The scheduler's leader task for stored crons, for one tenure: keeps one cron loop per stored
/// cron of the board, restarting it when its definition changes and stopping it when it is
/// deleted, until the tenure ends (then the loops drain as the crons of code's do). `code`: the
/// names of the crons of code running in this tenure (a stored cron of such a name - stored in
/// a race with the registration of the cron of code - is not run).
pub(super) async fn keep_stored(
    code: BTreeSet<String>,
    enqueue: EnqueueTick,
    leadership: Leadership,
    settings: Arc<Settings>,
    batchers: Batchers,
) {
    let mut board = settings.board.subscribe();
    let mut kept: BTreeMap<String, Kept> = BTreeMap::new();
    loop {
        let wanted = board.borrow_and_update().stored.clone();
        // Stop the loops of crons changed or deleted; each ends its run in progress first.
        let stale: Vec<String> = kept
            .iter()
            .filter(|(name, k)| wanted.get(*name) != Some(&k.cron))
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some(k) = kept.remove(&name) {
                k.stop.cancel();
                let _ = k.running.await;
                info!(target: "forge::cron", cron = %name, "stored cron changed or deleted: its loop stopped");
            }
        }
        for (name, cron) in &wanted {
            if kept.contains_key(name) || code.contains(name) {
                continue;
            }
            let resume = loop {
                match ledger::resume_stored(&leadership, name).await {
                    Ok(resume) => break Some(resume),
                    Err(err) => {
                        warn!(target: "forge::cron", cron = %name, error = %err,
                              "cannot read a stored cron's ledger; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                            _ = leadership.stopping() => break None,
                        }
                    }
                }
            };
            let Some(resume) = resume else { break };
            let stop = CancellationToken::new();
            let running = tokio::spawn(run_cron(
                cron.cron_job(&enqueue),
                leadership.clone(),
                resume,
                settings.clone(),
                batchers.clone(),
                stop.clone(),
            ));
            info!(target: "forge::cron", cron = %name, kind = %cron.kind(), schedule = %cron.schedule(),
                  "running stored cron");
            kept.insert(
                name.clone(),
                Kept {
                    cron: cron.clone(),
                    stop,
                    running,
                },
            );
        }
        tokio::select! {
            changed = board.changed() => if changed.is_err() { break },
            _ = leadership.stopping() => break,
        }
    }
    // The loops see the tenure end themselves; wait for their drains.
    for (_, k) in kept {
        let _ = k.running.await;
    }
}
