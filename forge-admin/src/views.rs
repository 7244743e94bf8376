//! JSON shapes the read models do not serialize themselves: a role's state on this node.

use forge_core::RoleState;
use serde_json::{Value, json};

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
