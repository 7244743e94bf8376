//! What `#[cron]` and `#[job]` expand to refers to these, through `::forge::__private`. Not
//! a public API: it changes whenever the macros change.

pub use crate::cron::{
    CatchUp, CronContext, CronJob, Interrupted, IntoCron, IntoCronResult, Overlap,
};
pub use crate::jobs::{Backoff, IntoJobResult, Job, JobContext, JobError, JobOptions, JobRegistry};
pub use crate::jobs::{JobState, UniqueMode};
pub use crate::limits::Rate;
pub use forge_core::Role;
pub use forge_cron::Schedule;
pub use inventory;

/// A cron declared with `#[cron]`, collected at link time for automatic registration.
pub struct CronRegistration {
    /// Builds the cron's definition.
    pub make: fn() -> forge_core::Result<CronJob>,
}

inventory::collect!(CronRegistration);

/// A job declared with `#[job]`, collected at link time for automatic registration.
pub struct JobRegistration {
    /// Adds the job to a registry.
    pub register: fn(&mut JobRegistry) -> forge_core::Result<()>,
}

inventory::collect!(JobRegistration);

/// Every `#[cron]` linked into this binary.
pub fn registered_crons() -> impl Iterator<Item = forge_core::Result<CronJob>> {
    inventory::iter::<CronRegistration>
        .into_iter()
        .map(|r| (r.make)())
}

/// Every `#[job]` linked into this binary, added to `registry`.
pub fn register_jobs(registry: &mut JobRegistry) -> forge_core::Result<()> {
    for registration in inventory::iter::<JobRegistration> {
        (registration.register)(registry)?;
    }
    Ok(())
}
