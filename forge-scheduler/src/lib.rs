//! FORGE scheduler: leader-only crons with an exactly-once tick ledger, and the durable job
//! queue, on top of `forge-core`'s leader roles.
//!
//! Users depend on the `forge` facade, which re-exports what is public here. See the crate
//! docs of `forge` for examples.

pub mod cron;
pub mod jobs;
mod node;

#[doc(hidden)]
pub mod __private;

pub use cron::{
    CatchUp, Cron, CronContext, CronError, CronJob, Interrupted, IntoCronResult, Overlap,
};
pub use forge_cron::{Schedule, ScheduleError};
pub use node::{Node, NodeBuilder};
