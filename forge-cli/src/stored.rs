//! `forge crons add`, `set`, `delete`: crons stored in the database.

use forge::crons::StoredCronSpec;
use serde_json::json;

use crate::args::StoredCronArgs;
use crate::ctx::Ctx;
use crate::fail::{Fail, Outcome};

/// Creates (`create_only`: refused when a cron has the name) or changes a stored cron.
pub(crate) async fn store(
    ctx: &Ctx,
    cron: &StoredCronArgs,
    create_only: bool,
    json: bool,
) -> Outcome {
    let args = serde_json::from_str(&cron.args).map_err(|err| {
        Fail::usage(format!(
            "--args must be JSON, such as '{{\"to\":\"ops@example.com\"}}': {err}"
        ))
    })?;
    let spec = StoredCronSpec {
        expression: cron.expression.clone(),
        timezone: Some(cron.timezone.clone()),
        kind: cron.kind.clone(),
        args,
        catch_up: cron.catch_up.clone(),
        catch_up_window: cron.catch_up_window.clone(),
        overlap: cron.overlap.clone(),
        interrupted: cron.interrupted.clone(),
        timeout: cron.timeout.clone(),
    };
    let stored = spec.into_cron(&cron.name)?;
    let workload = ctx.workload();
    if create_only && workload.cron(&cron.name).await?.is_some() {
        return Err(Fail::problem(format!(
            "a cron named {:?} exists already: `forge crons set` changes a stored cron",
            cron.name
        )));
    }
    let result = workload.upsert_cron(&stored, &ctx.by).await?;
    if json {
        crate::out::print_json(&json!({ "cron": cron.name, "result": result }));
    } else {
        let verb = serde_json::to_value(result).unwrap_or_default();
        outln!(
            "{} stored cron {}",
            verb.as_str().unwrap_or("stored"),
            cron.name
        );
    }
    Ok(0)
}

pub(crate) async fn delete(ctx: &Ctx, name: &str, json: bool) -> Outcome {
    if !ctx.workload().delete_cron(name, &ctx.by).await? {
        return Err(Fail::problem(format!(
            "no cron {name:?} in namespace {}",
            ctx.namespace
        )));
    }
    if json {
        crate::out::print_json(&json!({ "cron": name, "deleted": true }));
    } else {
        outln!("deleted stored cron {name}");
    }
    Ok(0)
}
