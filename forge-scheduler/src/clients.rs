//! A cron handler's job client, and the enqueue of a stored cron's tick: here, since `cron`
//! and `jobs` do not use each other.

use std::sync::Arc;
use std::time::Duration;

use crate::cron::{CronContext, CronError, CronRunner, EnqueueTick};
use crate::jobs::{JobRegistry, Jobs, NewJob};

impl CronRunner {
    /// Runs the crons stored in the database (`Workload::upsert_cron`) on this node when it
    /// leads the scheduler role: each tick enqueues its cron's job, a kind of `jobs` with the
    /// kind's declared options, in the tick's fenced transaction, and completes the tick in it.
    /// A tick whose kind this node's binary lacks fails, with an error saying so (it is in the
    /// ledger, the metrics and the dashboard). With no job type registered (`jobs` empty) the
    /// node runs no stored crons: it has nothing they could enqueue.
    pub fn stored_crons(mut self, jobs: JobRegistry) -> CronRunner {
        if jobs.is_empty() {
            return self;
        }
        let enqueue: EnqueueTick = Arc::new(move |ctx: CronContext, kind: String, args| {
            let job = jobs.new_job(&kind, args);
            Box::pin(async move {
                let job = job.ok_or_else(|| {
                    CronError::msg(format!(
                        "this node's binary has no job of kind `{kind}`: deploy one that registers it, or change the stored cron `{}`",
                        ctx.name()
                    ))
                })?;
                // A transient failure (connection lost, pool exhausted, deadlock) rolls the
                // transaction back: try again while this run may, or the tick would end
                // `failed` with no job for a blip. A commit whose reply was lost and which did
                // commit makes the next try's `complete` fail (NotRunning): no second job.
                let mut pause = Duration::from_millis(50);
                loop {
                    match enqueue_tick(&ctx, job.clone()).await {
                        Err(err) if err.is_transient() && !ctx.is_cancelled() => {
                            tracing::warn!(cron = ctx.name(), error = %err, retry_in = ?pause,
                                "a stored cron's tick could not enqueue its job; trying again");
                            tokio::select! {
                                _ = tokio::time::sleep(pause) => {}
                                _ = ctx.cancelled() => return Err(err.into()),
                            }
                            pause = (pause * 2).min(Duration::from_secs(2));
                        }
                        result => return result.map_err(CronError::from),
                    }
                }
            })
        });
        self.stored = Some(enqueue);
        self
    }
}

/// One try of a stored cron's tick: its job enqueued and the tick completed in one fenced
/// transaction.
async fn enqueue_tick(ctx: &CronContext, job: NewJob) -> forge_core::Result<()> {
    let mut tx = ctx.fenced_transaction().await?;
    ctx.jobs().enqueue_job_in(&mut *tx, job).await?;
    ctx.complete(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

impl CronContext {
    /// The node's job client (as `node.jobs()`: it counts what it enqueues in the node's
    /// metrics), to enqueue jobs from a cron - in the tick's fenced transaction with the `_in`
    /// methods, so that they exist only if the tick's effects commit:
    ///
    /// ```no_run
    /// # async fn demo(ctx: forge_scheduler::CronContext, job: forge_scheduler::jobs::NewJob) -> forge_core::Result<()> {
    /// let mut tx = ctx.fenced_transaction().await?;
    /// ctx.jobs().enqueue_job_in(&mut *tx, job).await?;
    /// ctx.complete(&mut tx).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn jobs(&self) -> Jobs {
        let leadership = self.leadership();
        Jobs::for_node(
            leadership.pool().clone(),
            leadership.namespace(),
            leadership.metrics().node_wide(),
        )
    }
}
