//! JSON shapes the read models do not serialize themselves.

use chrono::{DateTime, Utc};
use forge_core::RoleState;
use forge_scheduler::jobs::JobInfo;
use serde::Serialize;
use serde_json::{Value, json};

/// A job as the API shows it.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct JobView {
    /// The id.
    pub id: i64,
    /// The queue.
    pub queue: String,
    /// The kind.
    pub kind: String,
    /// The arguments.
    pub args: Value,
    /// `available`, `scheduled`, `running`, `retryable`, `completed`, `dead`, `cancelled`.
    pub state: &'static str,
    /// Lower runs first.
    pub priority: i16,
    /// When it is (or was) due.
    pub run_at: DateTime<Utc>,
    /// Attempts started so far.
    pub attempt: u32,
    /// Attempts allowed (`null`: the node's `[jobs] default_max_attempts`).
    pub max_attempts: Option<u32>,
    /// Per-attempt timeout in milliseconds.
    pub timeout_ms: Option<u64>,
    /// The role whose leader runs it.
    pub role: Option<String>,
    /// The unique key.
    pub unique_key: Option<String>,
    /// The node of the current or last attempt.
    pub node_id: Option<String>,
    /// When the current or last attempt started.
    pub attempted_at: Option<DateTime<Utc>>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// A cancel was requested while it ran.
    pub cancel_requested: bool,
    /// Each failed, interrupted or rescued attempt, oldest first.
    pub errors: Vec<AttemptView>,
}

/// One failed, interrupted or rescued attempt of a job.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct AttemptView {
    /// The attempt's number.
    pub attempt: u32,
    /// When it was recorded.
    pub at: DateTime<Utc>,
    /// The node that ran it.
    pub node: Option<String>,
    /// `error`, `timeout`, `panic`, `discard`, `cancelled`, `released` or `rescued`.
    pub reason: String,
    /// What happened.
    pub error: String,
}

impl From<&JobInfo> for JobView {
    fn from(job: &JobInfo) -> JobView {
        JobView {
            id: job.id.0,
            queue: job.queue.clone(),
            kind: job.kind.clone(),
            args: job.args.clone(),
            state: job.state.as_str(),
            priority: job.priority,
            run_at: job.run_at,
            attempt: job.attempt,
            max_attempts: job.max_attempts,
            timeout_ms: job
                .timeout
                .map(|t| t.as_millis().min(u128::from(u64::MAX)) as u64),
            role: job.role.clone(),
            unique_key: job.unique_key.clone(),
            node_id: job.node_id.clone(),
            attempted_at: job.attempted_at,
            finished_at: job.finished_at,
            created_at: job.created_at,
            cancel_requested: job.cancel_requested,
            errors: job
                .errors
                .iter()
                .map(|e| AttemptView {
                    attempt: e.attempt,
                    at: e.at,
                    node: e.node.clone(),
                    reason: e.reason.clone(),
                    error: e.error.clone(),
                })
                .collect(),
        }
    }
}

/// A role's state on the serving node.
pub(crate) fn role_state(role: &str, state: &RoleState) -> Value {
    match state {
        RoleState::Leader { epoch, since } => {
            json!({ "role": role, "state": "leader", "epoch": epoch, "since": since })
        }
        RoleState::Follower { leader } => json!({
            "role": role,
            "state": "follower",
            "leader": leader.as_ref().map(|l| json!({ "node_id": l.node_id, "epoch": l.epoch })),
        }),
        RoleState::Connecting { last_error } => {
            json!({ "role": role, "state": "connecting", "last_error": last_error })
        }
        RoleState::Conflict { message } => {
            json!({ "role": role, "state": "conflict", "message": message })
        }
        RoleState::Stopped => json!({ "role": role, "state": "stopped" }),
        _ => json!({ "role": role, "state": "unknown" }),
    }
}
