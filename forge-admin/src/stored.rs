//! The stored crons' endpoints: `PUT /api/crons/{name}` (create or change) and
//! `DELETE /api/crons/{name}`, over `Workload::upsert_cron` and `Workload::delete_cron`.

use axum::extract::State;
use axum::{Extension, Json};
use forge_scheduler::cron::StoredCronSpec;
use serde_json::{Value, json};

use crate::AdminState;
use crate::auth::Actor;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath, NoBody};

pub(crate) async fn upsert_cron(
    State(state): State<AdminState>,
    Extension(Actor(by)): Extension<Actor>,
    ApiPath(name): ApiPath<String>,
    ApiJson(spec): ApiJson<StoredCronSpec>,
) -> ApiResult<Json<Value>> {
    let cron = spec.into_cron(&name).map_err(ApiError::from)?;
    let workload = state.workload.clone();
    let b = by.clone();
    let upserted = state
        .write(async move { workload.upsert_cron(&cron, &b).await })
        .await?;
    tracing::info!(target: "forge::admin", action = "upsert_cron", subject = %name, %by, "admin action");
    Ok(Json(json!({ "cron": name, "result": upserted })))
}

pub(crate) async fn delete_cron(
    State(state): State<AdminState>,
    Extension(Actor(by)): Extension<Actor>,
    ApiPath(name): ApiPath<String>,
    _: NoBody,
) -> ApiResult<Json<Value>> {
    let workload = state.workload.clone();
    let (n, b) = (name.clone(), by.clone());
    let deleted = state
        .write(async move { workload.delete_cron(&n, &b).await })
        .await?;
    if !deleted {
        return Err(ApiError::not_found(format!(
            "no cron {name:?} in this cluster"
        )));
    }
    tracing::info!(target: "forge::admin", action = "delete_cron", subject = %name, %by, "admin action");
    Ok(Json(json!({ "cron": name, "deleted": true })))
}
