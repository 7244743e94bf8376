//! The cron runtime (in progress).

use forge_core::Result;

use super::CronJob;

/// Rejects two different crons with one name; drops exact duplicates (a cron registered both
/// automatically and explicitly).
pub(crate) fn dedupe(crons: Vec<CronJob>) -> Result<Vec<CronJob>> {
    let mut kept: Vec<CronJob> = Vec::new();
    for cron in crons {
        match kept.iter().find(|k| k.name == cron.name) {
            Some(existing) if existing.same_definition(&cron) => {}
            Some(_) => {
                return Err(forge_core::Error::Registration {
                    message: format!(
                        "two different crons are named `{}`: give one of them another name (#[cron(..., name = \"...\")])",
                        cron.name
                    ),
                });
            }
            None => kept.push(cron),
        }
    }
    Ok(kept)
}

/// Adds one leader task per role that has crons.
pub(crate) fn install(
    _crons: Vec<CronJob>,
    builder: forge_core::NodeBuilder,
) -> forge_core::NodeBuilder {
    builder
}
