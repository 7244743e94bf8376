//! A job kind's cluster-wide limits: `GET /api/kinds/limits`, `PUT` / `DELETE
//! /api/kinds/{kind}/limits`.

use axum::extract::State;
use axum::{Extension, Json};
use forge_scheduler::jobs::QueueLimits;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{audit_log, limits_of};
use crate::AdminState;
use crate::auth::Actor;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath, NoBody};

/// Every job kind with limits, what counts against them and whether one is reached.
pub(crate) async fn kind_limits(State(state): State<AdminState>) -> ApiResult<Json<Value>> {
    let kinds = state.read(state.workload.kind_limits()).await?;
    Ok(Json(json!({ "kinds": kinds })))
}

/// The body of `PUT /api/kinds/{kind}/limits`: the kind's limits, all of them (a key left out:
/// no such limit).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KindLimitsBody {
    #[serde(default)]
    global_concurrency: Option<u32>,
    /// Such as `"100/1m"`.
    #[serde(default)]
    rate: Option<String>,
    #[serde(default)]
    rate_key: Option<String>,
}

/// Sets a job kind's cluster-wide limits as an operator (they win over the code's until
/// reset).
pub(crate) async fn set_kind_limits(
    State(state): State<AdminState>,
    Extension(Actor(by)): Extension<Actor>,
    ApiPath(kind): ApiPath<String>,
    ApiJson(body): ApiJson<KindLimitsBody>,
) -> ApiResult<Json<Value>> {
    check_kind(&kind)?;
    let limits: QueueLimits = limits_of(body.global_concurrency, body.rate, body.rate_key)?;
    let workload = state.workload.clone();
    let (k, b, l) = (kind.clone(), by.clone(), limits.clone());
    state
        .write(async move { workload.set_kind_limits(&k, &l, &b).await })
        .await?;
    audit_log("limit_kind", &kind, &by);
    Ok(Json(json!({ "kind": kind, "limits": limits })))
}

/// Gives a job kind's limits back to the code (removes an operator's).
pub(crate) async fn reset_kind_limits(
    State(state): State<AdminState>,
    Extension(Actor(by)): Extension<Actor>,
    ApiPath(kind): ApiPath<String>,
    _: NoBody,
) -> ApiResult<Json<Value>> {
    check_kind(&kind)?;
    let workload = state.workload.clone();
    let (k, b) = (kind.clone(), by.clone());
    let had = state
        .write(async move { workload.reset_kind_limits(&k, &b).await })
        .await?;
    audit_log("reset_kind_limits", &kind, &by);
    Ok(Json(
        json!({ "kind": kind, "reset": true, "had_operator_limits": had }),
    ))
}

fn check_kind(kind: &str) -> ApiResult<()> {
    forge_rules::check_name(forge_rules::Name::JobKind, kind)
        .map_err(|err| ApiError::bad_request(err.to_string()).with("parameter", "kind"))
}
