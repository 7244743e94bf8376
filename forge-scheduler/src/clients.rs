//! A cron handler's job client, and the enqueue of a stored cron's tick: here, since `cron`
//! and `jobs` do not use each other.

use std::sync::Arc;

use crate::cron::{CronContext, CronError, CronRunner, EnqueueTick};
use crate::jobs::{JobRegistry, Jobs};

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
                let mut tx = ctx.fenced_transaction().await?;
                ctx.jobs().enqueue_job_in(&mut *tx, job).await?;
                ctx.complete(&mut tx).await?;
                tx.commit().await?;
                Ok(())
            })
        });
        self.stored = Some(enqueue);
        self
    }
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
