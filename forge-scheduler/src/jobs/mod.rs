//! The durable job queue (skeleton; filled in by the jobs work).

use forge_core::Result;
use sqlx::PgPool;

/// A durable job type, declared with `#[job]`.
pub trait Job: Send + Sync + 'static {}

/// The job types a node knows.
#[derive(Default)]
pub struct JobRegistry {}

impl JobRegistry {
    /// Adds a job type.
    pub fn add<J: Job>(&mut self, _job: J) -> Result<()> {
        Ok(())
    }
}

/// Installs workers and leader duties for the registered jobs.
pub(crate) fn install(
    _registry: JobRegistry,
    builder: forge_core::NodeBuilder,
) -> Result<forge_core::NodeBuilder> {
    Ok(builder)
}

/// Enqueues, inspects and cancels jobs.
#[derive(Clone, Debug)]
pub struct Jobs {
    pool: PgPool,
}

impl Jobs {
    /// A client on `pool`.
    pub fn new(pool: PgPool) -> Jobs {
        Jobs { pool }
    }

    /// The pool jobs are enqueued through.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}
