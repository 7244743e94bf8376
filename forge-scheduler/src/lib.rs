//! FORGE scheduler: leader-only crons with an exactly-once tick ledger, and the durable job
//! queue, as components of a FORGE node.
//!
//! Users depend on the `forge` facade, whose `Node` installs both components ([`Crons`],
//! [`jobs::JobQueue`]). See the crate docs of `forge` for examples, and [`cron`] and [`jobs`]
//! for exactly what is guaranteed.

pub mod config;
pub mod cron;
pub mod inspect;
pub mod jobs;
mod metrics;
#[cfg(test)]
mod sql_source;

#[doc(hidden)]
pub mod __private;

pub use config::{CronConfig, JobsConfig};
pub use cron::{
    CatchUp, Cron, CronContext, CronError, CronJob, Crons, Interrupted, IntoCronResult, Overlap,
    TickState,
};
pub use forge_cron::{Schedule, ScheduleError};

/// The scheduler's migrations (the tick ledger, the job queue, and their move to the cluster
/// model), applied by every node with the core's.
pub const MIGRATIONS: &[forge_core::MigrationSource] = &[
    (2, "cron", include_str!("../../migrations/0002_cron.sql")),
    (3, "jobs", include_str!("../../migrations/0003_jobs.sql")),
    (
        5,
        "scheduler",
        include_str!("../../migrations/0005_scheduler.sql"),
    ),
    (
        6,
        "jobs_step",
        include_str!("../../migrations/0006_jobs_step.sql"),
    ),
    (
        9,
        "tick_finish_many",
        include_str!("../../migrations/0009_tick_finish_many.sql"),
    ),
    (
        11,
        "jobs_figures",
        include_str!("../../migrations/0011_jobs_figures.sql"),
    ),
    (
        12,
        "jobs_step_pkey",
        include_str!("../../migrations/0012_jobs_step_pkey.sql"),
    ),
    (
        13,
        "tick_claim_ahead",
        include_str!("../../migrations/0013_tick_claim_ahead.sql"),
    ),
    (
        14,
        "jobs_delete_completed",
        include_str!("../../migrations/0014_jobs_delete_completed.sql"),
    ),
    (
        15,
        "jobs_figures_index_only",
        include_str!("../../migrations/0015_jobs_figures_index_only.sql"),
    ),
];
