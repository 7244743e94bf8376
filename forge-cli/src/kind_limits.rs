//! `forge jobs limit` and `forge jobs limits`: job kinds' cluster-wide limits.

use serde_json::json;

use crate::args::KindLimitArgs;
use crate::ctx::Ctx;
use crate::fail::Outcome;
use crate::out::{self, Table};

/// `forge jobs limit`: sets, removes or resets a job kind's limits.
pub(crate) async fn limit(ctx: &Ctx, args: &KindLimitArgs, json: bool) -> Outcome {
    let workload = ctx.workload();
    let kind = &args.kind;
    let Some(limits) = args.values.limits()? else {
        let had = workload.reset_kind_limits(kind, &ctx.by).await?;
        if json {
            out::print_json(&json!({ "kind": kind, "reset": true, "had_operator_limits": had }));
        } else {
            outln!(
                "job kind {kind}: limits given back to the code (unlimited until a node starts and writes them){}",
                if had {
                    ""
                } else {
                    "; no operator had set them"
                }
            );
        }
        return Ok(0);
    };
    workload.set_kind_limits(kind, &limits, &ctx.by).await?;
    if json {
        out::print_json(&json!({ "kind": kind, "limits": limits }));
    } else {
        outln!("job kind {kind}: {limits}, from the next claim on every node and in every queue");
    }
    Ok(0)
}

/// `forge jobs limits`: every job kind with limits.
pub(crate) async fn list(ctx: &Ctx, json: bool) -> Outcome {
    let kinds = ctx.workload().kind_limits().await?;
    if json {
        out::print_json(&json!({ "kinds": kinds }));
        return Ok(0);
    }
    let mut table = Table::new(&[
        "KIND",
        "LIMITS",
        "SET BY",
        "RUNNING",
        "RATE CLAIMS",
        "WAITING ON",
    ]);
    for k in &kinds {
        table.row(vec![
            k.kind.clone(),
            k.limits.to_string(),
            k.set_by.clone().unwrap_or_else(|| "node".to_owned()),
            k.limited_running.to_string(),
            k.rate_claims.to_string(),
            match (k.at_global_limit, k.rate_limited_until) {
                (true, _) => "global limit".to_owned(),
                (false, Some(at)) => format!("rate limited until {}", out::time(at)),
                (false, None) => "-".to_owned(),
            },
        ]);
    }
    table.print();
    Ok(0)
}
