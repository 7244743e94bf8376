//! A cron handler's job client: here, since `cron` and `jobs` do not use each other.

use crate::cron::CronContext;
use crate::jobs::Jobs;

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
