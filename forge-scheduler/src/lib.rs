//! FORGE scheduler: leader-only crons with an exactly-once tick ledger, and the durable job
//! queue, as components of a FORGE node.
//!
//! Users depend on the `forge` facade, whose `Node` installs both components ([`CronRunner`],
//! [`jobs::JobRunner`]). See the crate docs of `forge` for examples, and [`cron`] and [`jobs`]
//! for exactly what is guaranteed.

mod clients;
pub mod config;
pub mod cron;
pub mod inspect;
pub mod jobs;
mod limits;
mod metrics;
#[cfg(test)]
mod schema;
pub mod testing;

#[doc(hidden)]
pub mod __private;

pub use config::{CronConfig, JobsConfig};
pub use cron::{
    CatchUp, CronContext, CronError, CronJob, CronRunner, Interrupted, IntoCron, IntoCronResult,
    Overlap, StoredCron, TickState,
};
#[allow(deprecated)]
pub use cron::{Cron, Crons};
pub use forge_cron::{Schedule, ScheduleError};
