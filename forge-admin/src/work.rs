//! The work's endpoints: crons (pause, resume, trigger), jobs (one and in bulk), queues.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, post};
use axum::{Extension, Json};
use forge_core::inspect::{Change, Page};
use forge_scheduler::inspect::{CronView, JobFilter, TickView};
use forge_scheduler::jobs::{JobAction, JobId, JobState, QueueLimits, Rate};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AdminState;
use crate::auth::Actor;
use crate::cluster::{page, parse_list};
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiOptionalJson, ApiPath, ApiQuery, NoBody};

mod kind_limits;
pub(crate) use kind_limits::{kind_limits, reset_kind_limits, set_kind_limits};

pub(crate) async fn crons(State(state): State<AdminState>) -> ApiResult<Json<Value>> {
    let crons = state.read(state.workload.crons()).await?;
    Ok(Json(json!({ "crons": crons })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TicksQuery {
    limit: Option<u32>,
    before: Option<i64>,
}

fn unknown_cron(name: &str) -> ApiError {
    ApiError::not_found(format!(
        "no cron {name:?} in this cluster (no node has registered it)"
    ))
}

/// A cron and a page of its ticks, read together.
async fn cron_and_ticks(
    state: &AdminState,
    name: &str,
    query: TicksQuery,
) -> ApiResult<(Option<CronView>, Page<TickView>)> {
    let page = page(query.limit, query.before)?;
    let workload = &state.workload;
    state
        .read(async { tokio::try_join!(workload.cron(name), workload.ticks(name, page)) })
        .await
}

pub(crate) async fn cron(
    State(state): State<AdminState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<TicksQuery>,
) -> ApiResult<Json<Value>> {
    let (cron, ticks) = cron_and_ticks(&state, &name, query).await?;
    let cron = cron.ok_or_else(|| unknown_cron(&name))?;
    Ok(Json(json!({ "cron": cron, "ticks": ticks })))
}

pub(crate) async fn ticks(
    State(state): State<AdminState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<TicksQuery>,
) -> ApiResult<Json<Value>> {
    let (cron, ticks) = cron_and_ticks(&state, &name, query).await?;
    if cron.is_none() && ticks.items.is_empty() {
        return Err(unknown_cron(&name));
    }
    Ok(Json(json!(ticks)))
}

fn audit_log(action: &str, subject: &str, by: &str) {
    tracing::info!(target: "forge::admin", action, subject, by, "admin action");
}

async fn set_cron_paused(
    state: AdminState,
    by: String,
    name: String,
    paused: bool,
) -> ApiResult<Json<Value>> {
    let workload = state.workload.clone();
    let (n, b) = (name.clone(), by.clone());
    let known = state
        .write(async move {
            if paused {
                workload.pause_cron(&n, &b).await
            } else {
                workload.resume_cron(&n, &b).await
            }
        })
        .await?;
    if !known {
        return Err(unknown_cron(&name));
    }
    audit_log(
        if paused { "pause_cron" } else { "resume_cron" },
        &name,
        &by,
    );
    Ok(Json(json!({ "cron": name, "paused": paused })))
}

/// `POST /api/crons/{name}/pause` (`paused`) or `POST /api/crons/{name}/resume`.
pub(crate) fn cron_paused(paused: bool) -> MethodRouter<AdminState> {
    post(
        move |State(state): State<AdminState>,
              Extension(Actor(by)): Extension<Actor>,
              ApiPath(name): ApiPath<String>,
              _: NoBody| set_cron_paused(state, by, name, paused),
    )
}

pub(crate) async fn trigger_cron(
    State(state): State<AdminState>,
    Extension(Actor(by)): Extension<Actor>,
    ApiPath(name): ApiPath<String>,
    _: NoBody,
) -> ApiResult<Response> {
    let workload = state.workload.clone();
    let (n, b) = (name.clone(), by.clone());
    let at = state
        .write(async move { workload.trigger_cron(&n, &b).await })
        .await?
        .ok_or_else(|| unknown_cron(&name))?;
    audit_log("trigger_cron", &name, &by);
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "cron": name,
            "scheduled_at": at,
            "status": "requested",
            "message": "the leader of the cron's role runs it as a manual tick at this instant",
        })),
    )
        .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JobsQuery {
    state: Option<String>,
    queue: Option<String>,
    kind: Option<String>,
    args: Option<String>,
    limit: Option<u32>,
    before: Option<i64>,
}

fn parse_states(text: Option<&str>) -> ApiResult<Vec<JobState>> {
    parse_list(
        "state",
        text,
        JobState::parse,
        JobState::ALL,
        JobState::as_str,
    )
}

fn parse_args(text: &str) -> ApiResult<Value> {
    serde_json::from_str(text).map_err(|err| {
        ApiError::bad_request(format!(
            "args must be JSON that the jobs' arguments contain, such as {{\"customer\":42}}: {err}"
        ))
        .with("parameter", "args")
    })
}

fn non_empty(text: Option<String>) -> Option<String> {
    text.filter(|t| !t.is_empty())
}

pub(crate) async fn jobs(
    State(state): State<AdminState>,
    ApiQuery(query): ApiQuery<JobsQuery>,
) -> ApiResult<Json<Value>> {
    let filter = JobFilter {
        states: parse_states(query.state.as_deref())?,
        queue: non_empty(query.queue),
        kind: non_empty(query.kind),
        args: query.args.as_deref().map(parse_args).transpose()?,
    };
    let page = page(query.limit, query.before)?;
    let jobs = state.read(state.workload.jobs(&filter, page)).await?;
    Ok(Json(json!({ "items": jobs.items, "next": jobs.next })))
}

fn unknown_job(id: i64) -> ApiError {
    ApiError::not_found(format!(
        "no job {id} in this cluster (never existed, or pruned)"
    ))
}

pub(crate) async fn job(
    State(state): State<AdminState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<Value>> {
    let job = state.read(state.workload.job(JobId(id))).await?;
    match job {
        Some(job) => Ok(Json(json!(job))),
        None => Err(unknown_job(id)),
    }
}

async fn one_job(
    state: AdminState,
    by: String,
    id: i64,
    action: JobAction,
) -> ApiResult<Json<Value>> {
    let workload = state.workload.clone();
    let b = by.clone();
    let change = state
        .write(async move {
            match action {
                JobAction::Retry => workload.retry_job(JobId(id), &b).await,
                JobAction::Cancel => workload.cancel_job(JobId(id), &b).await,
                JobAction::Delete => workload.delete_job(JobId(id), &b).await,
            }
        })
        .await?;
    match change {
        Change::Applied => {}
        Change::NotFound => return Err(unknown_job(id)),
        Change::Refused(reason) => {
            return Err(ApiError::conflict(format!(
                "job {id} cannot be {}: {reason}",
                match action {
                    JobAction::Retry => "retried",
                    JobAction::Cancel => "cancelled",
                    JobAction::Delete => "deleted",
                }
            ))
            .with("id", id)
            .with("reason", reason));
        }
        _ => return Err(ApiError::conflict(format!("job {id}: not applied")).with("id", id)),
    }
    audit_log(&format!("{}_job", action.as_str()), &id.to_string(), &by);
    let job = match action {
        JobAction::Delete => None,
        _ => state
            .read(state.workload.job(JobId(id)))
            .await
            .ok()
            .flatten()
            .map(|job| json!(job)),
    };
    Ok(Json(json!({
        "id": id,
        "action": action.as_str(),
        "outcome": "applied",
        "job": job,
    })))
}

/// One job's action: `POST /api/jobs/{id}/retry`, `POST /api/jobs/{id}/cancel`,
/// `DELETE /api/jobs/{id}`.
pub(crate) fn job_action(action: JobAction) -> MethodRouter<AdminState> {
    let handler = move |State(state): State<AdminState>,
                        Extension(Actor(by)): Extension<Actor>,
                        ApiPath(id): ApiPath<i64>,
                        _: NoBody| one_job(state, by, id, action);
    match action {
        JobAction::Retry | JobAction::Cancel => post(handler),
        JobAction::Delete => delete(handler),
    }
}

/// `"dead,retryable"` or `["dead", "retryable"]`.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum States {
    One(String),
    Many(Vec<String>),
}

/// The filter of a bulk action.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BulkFilter {
    state: Option<States>,
    queue: Option<String>,
    kind: Option<String>,
    args: Option<Value>,
    #[serde(default)]
    all: bool,
}

pub(crate) async fn bulk(
    State(state): State<AdminState>,
    Extension(Actor(by)): Extension<Actor>,
    ApiPath(action): ApiPath<String>,
    ApiJson(body): ApiJson<BulkFilter>,
) -> ApiResult<Json<Value>> {
    let Some(action) = JobAction::parse(&action) else {
        return Err(ApiError::not_found(format!(
            "no bulk action {action:?}: use retry, cancel or delete"
        )));
    };
    let states = match &body.state {
        None => Vec::new(),
        Some(States::One(text)) => parse_states(Some(text))?,
        Some(States::Many(list)) => parse_states(Some(&list.join(",")))?,
    };
    let filter = JobFilter {
        states,
        queue: non_empty(body.queue),
        kind: non_empty(body.kind),
        args: body.args.filter(|a| !a.is_null()),
    };
    let empty = filter.states.is_empty()
        && filter.queue.is_none()
        && filter.kind.is_none()
        && filter.args.is_none();
    if empty && !body.all {
        return Err(ApiError::bad_request(
            "a bulk action needs a filter (state, queue, kind, args), or \"all\": true to act on every job",
        ));
    }
    let summary = json!({
        "state": filter.states.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "queue": filter.queue,
        "kind": filter.kind,
        "args": filter.args,
    });
    let workload = state.workload.clone();
    let b = by.clone();
    let affected = state
        .write(async move {
            match action {
                JobAction::Retry => workload.retry_jobs(&filter, &b).await,
                JobAction::Cancel => workload.cancel_jobs(&filter, &b).await,
                JobAction::Delete => workload.delete_jobs(&filter, &b).await,
            }
        })
        .await?;
    audit_log(
        &format!("{}_jobs", action.as_str()),
        &summary.to_string(),
        &by,
    );
    Ok(Json(json!({
        "action": action.as_str(),
        "filter": summary,
        "affected": affected,
    })))
}

pub(crate) async fn queues(State(state): State<AdminState>) -> ApiResult<Json<Value>> {
    let queues = state.read(state.workload.queues()).await?;
    Ok(Json(json!({ "queues": queues })))
}

fn check_queue(queue: &str) -> ApiResult<()> {
    forge_rules::check_name(forge_rules::Name::Queue, queue)
        .map_err(|err| ApiError::bad_request(err.to_string()).with("parameter", "queue"))
}

/// The optional body of a queue's pause.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PauseQueueBody {
    /// Pause it even though the cluster does not know it yet (no node works it, no job): to
    /// pre-pause a queue before its nodes start.
    #[serde(default)]
    new: bool,
}

fn unknown_queue(queue: &str) -> ApiError {
    ApiError::not_found(format!(
        "no queue {queue:?} in this cluster (no node works it, it holds no unfinished or dead job, it is not paused); to pause a queue before any node works it, send {{\"new\": true}}"
    ))
}

pub(crate) async fn pause_queue(
    State(state): State<AdminState>,
    Extension(Actor(by)): Extension<Actor>,
    ApiPath(queue): ApiPath<String>,
    ApiOptionalJson(body): ApiOptionalJson<PauseQueueBody>,
) -> ApiResult<Json<Value>> {
    check_queue(&queue)?;
    let workload = state.workload.clone();
    let (q, b) = (queue.clone(), by.clone());
    let was_paused = state
        .write(async move { workload.pause_queue(&q, &b, body.new).await })
        .await?
        .ok_or_else(|| unknown_queue(&queue))?;
    audit_log("pause_queue", &queue, &by);
    Ok(Json(
        json!({ "queue": queue, "paused": true, "was_paused": was_paused }),
    ))
}

pub(crate) async fn resume_queue(
    State(state): State<AdminState>,
    Extension(Actor(by)): Extension<Actor>,
    ApiPath(queue): ApiPath<String>,
    _: NoBody,
) -> ApiResult<Json<Value>> {
    check_queue(&queue)?;
    let workload = state.workload.clone();
    let (q, b) = (queue.clone(), by.clone());
    let was_paused = state
        .write(async move { workload.resume_queue(&q, &b).await })
        .await?
        .ok_or_else(|| unknown_queue(&queue))?;
    audit_log("resume_queue", &queue, &by);
    Ok(Json(
        json!({ "queue": queue, "paused": false, "was_paused": was_paused }),
    ))
}

/// The body of `PUT /api/queues/{queue}/limits`: the queue's limits, all of them (a key left
/// out: no such limit).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct QueueLimitsBody {
    #[serde(default)]
    global_concurrency: Option<u32>,
    /// Such as `"100/1m"`.
    #[serde(default)]
    rate: Option<String>,
    #[serde(default)]
    rate_key: Option<String>,
    /// Limit it even though the cluster does not know it yet.
    #[serde(default)]
    new: bool,
}

/// Sets a queue's cluster-wide limits as an operator (they win over forge.toml's until reset).
pub(crate) async fn set_queue_limits(
    State(state): State<AdminState>,
    Extension(Actor(by)): Extension<Actor>,
    ApiPath(queue): ApiPath<String>,
    ApiJson(body): ApiJson<QueueLimitsBody>,
) -> ApiResult<Json<Value>> {
    check_queue(&queue)?;
    let limits = limits_of(body.global_concurrency, body.rate, body.rate_key)?;
    let workload = state.workload.clone();
    let (q, b, l) = (queue.clone(), by.clone(), limits.clone());
    state
        .write(async move { workload.set_queue_limits(&q, &l, &b, body.new).await })
        .await?
        .ok_or_else(|| unknown_queue(&queue))?;
    audit_log("limit_queue", &queue, &by);
    Ok(Json(json!({ "queue": queue, "limits": limits })))
}

/// A queue's or a kind's limits from a body's values, checked.
fn limits_of(
    global_concurrency: Option<u32>,
    rate: Option<String>,
    rate_key: Option<String>,
) -> ApiResult<QueueLimits> {
    let rate = match rate {
        Some(text) => Some(
            text.parse::<Rate>()
                .map_err(|err| ApiError::bad_request(err).with("parameter", "rate"))?,
        ),
        None => None,
    };
    QueueLimits::new(global_concurrency, rate, rate_key).map_err(ApiError::bad_request)
}

/// Gives a queue's limits back to forge.toml (removes an operator's).
pub(crate) async fn reset_queue_limits(
    State(state): State<AdminState>,
    Extension(Actor(by)): Extension<Actor>,
    ApiPath(queue): ApiPath<String>,
    _: NoBody,
) -> ApiResult<Json<Value>> {
    check_queue(&queue)?;
    let workload = state.workload.clone();
    let (q, b) = (queue.clone(), by.clone());
    let had = state
        .write(async move { workload.reset_queue_limits(&q, &b).await })
        .await?
        .ok_or_else(|| unknown_queue(&queue))?;
    audit_log("reset_queue_limits", &queue, &by);
    Ok(Json(
        json!({ "queue": queue, "reset": true, "had_operator_limits": had }),
    ))
}
