//! The cluster's endpoints: health, status, leaders, history, nodes, events, config, this
//! node, step-down.

use std::time::Instant;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use forge_core::Role;
use forge_core::inspect::{EventFilter, EventKind, NodeCounts, PageRequest, StepDown};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Actor;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiOptionalJson, ApiPath, ApiQuery};
use crate::{AdminState, views};

/// `limit` (1..=500, default 50) and `before` as a [`PageRequest`].
pub(crate) fn page(limit: Option<u32>, before: Option<i64>) -> ApiResult<PageRequest> {
    let limit = limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(
            ApiError::bad_request(format!("limit must be between 1 and 500, not {limit}"))
                .with("parameter", "limit"),
        );
    }
    Ok(PageRequest { limit, before })
}

pub(crate) fn parse_role(name: &str) -> ApiResult<Role> {
    Role::new(name).map_err(|err| {
        // The message names the role already ("invalid role name \"x'y\": ...").
        ApiError::bad_request(err.to_string()).with("parameter", "role")
    })
}

/// Comma-separated values, each parsed; an unknown one is a 400 naming the valid ones.
pub(crate) fn parse_list<T: Copy>(
    parameter: &str,
    text: Option<&str>,
    parse: impl Fn(&str) -> Option<T>,
    all: &[T],
    show: impl Fn(T) -> &'static str,
) -> ApiResult<Vec<T>> {
    let mut out = Vec::new();
    for item in text
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        match parse(item) {
            Some(value) => out.push(value),
            None => {
                let valid: Vec<&str> = all.iter().map(|v| show(*v)).collect();
                return Err(ApiError::bad_request(format!(
                    "unknown {parameter} {item:?}: use {}",
                    valid.join(", ")
                ))
                .with("parameter", parameter.to_owned()));
            }
        }
    }
    Ok(out)
}

pub(crate) async fn live(State(state): State<AdminState>) -> Json<Value> {
    Json(json!({
        "status": "live",
        "node_id": state.local.as_ref().map(|l| l.node_id.to_string()),
    }))
}

pub(crate) async fn ready(State(state): State<AdminState>) -> Response {
    if state.local.as_ref().is_some_and(|l| l.is_stopping()) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "stopping", "error": "the node is shutting down" })),
        )
            .into_response();
    }
    let started = Instant::now();
    let probe = sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(state.cluster.pool());
    let failure = match tokio::time::timeout(state.ready_timeout, probe).await {
        Ok(Ok(_)) => {
            state.database.reached();
            return Json(json!({
                "status": "ready",
                "database": "ok",
                "latency_ms": started.elapsed().as_secs_f64() * 1000.0,
            }))
            .into_response();
        }
        Ok(Err(err)) => format!("the database is unreachable: {err}"),
        Err(_) => format!(
            "the database did not answer within {} s",
            state.ready_timeout.as_secs_f64()
        ),
    };
    let since = state.database.failed();
    tracing::debug!(target: "forge::admin", error = %failure, "not ready");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({
            "status": "not_ready",
            "database": "unavailable",
            "error": failure,
            "since": since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        })),
    )
        .into_response()
}

pub(crate) async fn status(State(state): State<AdminState>) -> ApiResult<Json<Value>> {
    let status = state.read(state.cluster.status()).await?;
    let this = state.local.as_ref().map(|local| {
        let leads: Vec<&str> = local
            .roles
            .iter()
            .filter(|(_, rx)| rx.borrow().is_leader())
            .map(|(role, _)| role.name())
            .collect();
        json!({ "node_id": local.node_id.to_string(), "leads": leads })
    });
    let mut body = json!(status);
    body["this_node"] = json!(this);
    Ok(Json(body))
}

pub(crate) async fn leaders(State(state): State<AdminState>) -> ApiResult<Json<Value>> {
    let leaders = state.read(state.cluster.leaders()).await?;
    Ok(Json(json!({ "leaders": leaders })))
}

pub(crate) async fn leader(
    State(state): State<AdminState>,
    ApiPath(role): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    let role = parse_role(&role)?;
    let leaders = state.read(state.cluster.leaders()).await?;
    let view = leaders
        .iter()
        .find(|l| l.role == role.name())
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "role {role} has never had a leader in this cluster"
            ))
        })?;
    Ok(Json(json!(view)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HistoryQuery {
    role: Option<String>,
    limit: Option<u32>,
    before: Option<i64>,
}

pub(crate) async fn history(
    State(state): State<AdminState>,
    ApiQuery(query): ApiQuery<HistoryQuery>,
) -> ApiResult<Json<Value>> {
    let role = query.role.as_deref().map(parse_role).transpose()?;
    let page = page(query.limit, query.before)?;
    let history = state
        .read(state.cluster.history(role.as_ref(), page))
        .await?;
    Ok(Json(json!(history)))
}

pub(crate) async fn nodes(State(state): State<AdminState>) -> ApiResult<Json<Value>> {
    let nodes = state.read(state.cluster.nodes()).await?;
    let counts = NodeCounts::of(&nodes);
    Ok(Json(json!({
        "total": counts.total,
        "counts": counts,
        "nodes": nodes,
    })))
}

pub(crate) async fn node(
    State(state): State<AdminState>,
    ApiPath(node_id): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    let node = state.read(state.cluster.node(&node_id)).await?;
    match node {
        Some(node) => Ok(Json(json!(node))),
        None => Err(ApiError::not_found(format!(
            "no node {node_id:?} in this cluster (never joined, or forgotten)"
        ))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsQuery {
    kind: Option<String>,
    node: Option<String>,
    role: Option<String>,
    after: Option<i64>,
    limit: Option<u32>,
    before: Option<i64>,
}

pub(crate) async fn events(
    State(state): State<AdminState>,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> ApiResult<Json<Value>> {
    let kinds = parse_list(
        "kind",
        query.kind.as_deref(),
        EventKind::parse,
        EventKind::ALL,
        EventKind::as_str,
    )?;
    let filter = EventFilter {
        kinds,
        node_id: query.node.filter(|n| !n.is_empty()),
        role: query.role.as_deref().map(parse_role).transpose()?,
        after: query.after,
    };
    let page = page(query.limit, query.before)?;
    let events = state.read(state.cluster.events(&filter, page)).await?;
    Ok(Json(json!(events)))
}

pub(crate) async fn config(State(state): State<AdminState>) -> Json<Value> {
    let access = &state.access;
    let writes = if access.read_only {
        "read_only"
    } else if access.token.as_deref().is_some_and(|t| !t.is_empty()) {
        "token"
    } else {
        "disabled"
    };
    let reads = if access.read_token.as_deref().is_some_and(|t| !t.is_empty()) {
        "token"
    } else {
        "open"
    };
    Json(json!({
        "node_id": state.local.as_ref().map(|l| l.node_id.to_string()),
        "namespace": state.cluster.namespace().to_string(),
        "access": { "writes": writes, "reads": reads },
        "config": state.config.as_deref(),
    }))
}

pub(crate) async fn this(State(state): State<AdminState>) -> ApiResult<Json<Value>> {
    let Some(local) = state.local.clone() else {
        return Err(ApiError::not_found(
            "this API is not served by a FORGE node (mounted without one)",
        ));
    };
    let node_id = local.node_id.to_string();
    let roles: Vec<Value> = local
        .roles
        .iter()
        .map(|(role, rx)| views::role_state(role.name(), &rx.borrow()))
        .collect();
    let membership = state.read(state.cluster.node(&node_id)).await?;
    Ok(Json(json!({
        "node_id": node_id,
        "namespace": state.cluster.namespace().to_string(),
        "admin_url": local.admin_url,
        "stopping": local.is_stopping(),
        "roles": roles,
        "membership": membership,
    })))
}

/// The optional body of a step-down request.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepDownBody {
    /// Step down even though no standby waits for the role.
    #[serde(default)]
    force: bool,
}

pub(crate) async fn step_down(
    State(state): State<AdminState>,
    Extension(Actor(by)): Extension<Actor>,
    ApiPath(role): ApiPath<String>,
    ApiOptionalJson(body): ApiOptionalJson<StepDownBody>,
) -> ApiResult<Response> {
    let role = parse_role(&role)?;
    let cluster = state.cluster.clone();
    let (asked, by_) = (role.clone(), by.clone());
    let done = state
        .write(async move { cluster.step_down(&asked, &by_, body.force).await })
        .await?;
    let (epoch, node_id, standbys) = match done {
        StepDown::Asked {
            epoch,
            node_id,
            standbys,
        } => (epoch, node_id, standbys),
        StepDown::NoStandby { epoch, node_id } => {
            return Err(ApiError::conflict(format!(
                "no standby is waiting for role {role}: if {node_id} stepped down, the role would have no leader until a node campaigned again; start or wait for another eligible node, or send {{\"force\": true}} to step down anyway"
            ))
            .with("epoch", json!(epoch))
            .with("node_id", json!(node_id))
            .with("standbys", json!(0)));
        }
        StepDown::NoLeader => {
            let leaders = state.read(state.cluster.leaders()).await?;
            return Err(if leaders.iter().any(|l| l.role == role.name()) {
                ApiError::conflict(format!(
                    "role {role} has no live leader to step down (released, or its lease ran out)"
                ))
            } else {
                ApiError::not_found(format!(
                    "role {role} has never had a leader in this cluster"
                ))
            });
        }
    };
    tracing::info!(target: "forge::admin", role = %role, epoch = epoch.0, by = %by, standbys, "step-down requested");
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "role": role.name(),
            "epoch": epoch,
            "node_id": node_id,
            "standbys": standbys,
            "status": "requested",
            "message": "the leader drains its leader-only work and hands over to a standby; watch GET /api/cluster/leaders",
        })),
    )
        .into_response())
}
