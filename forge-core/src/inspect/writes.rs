//! The cluster's writes: step-down requests and the audit trail.

use crate::error::Result;
use crate::role::{Epoch, LockNamespace, Role};

use super::Cluster;

/// Records an operator's write in the events history (kind `admin_action`), on `executor`: a
/// transaction makes the record part of the write. For the read models' own writes (the
/// scheduler's); everyone else uses [`Cluster::audit`].
#[doc(hidden)]
pub async fn audit<'e, E>(
    executor: E,
    namespace: &LockNamespace,
    action: &str,
    subject: &str,
    by: &str,
    detail: serde_json::Value,
) -> Result<()>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    sqlx::query("SELECT forge.audit($1, $2, $3, $4, $5)")
        .bind(namespace)
        .bind(action)
        .bind(subject)
        .bind(by)
        .bind(detail)
        .execute(executor)
        .await?;
    Ok(())
}

/// What a step-down request ([`Cluster::step_down`]) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepDown {
    /// The leader of this epoch was asked to hand over; `standbys` followers were waiting
    /// inside the role's lock to take it.
    Asked {
        /// The tenure asked to step down.
        epoch: Epoch,
        /// Its node.
        node_id: String,
        /// Standbys waiting at that moment (0 only when forced).
        standbys: u64,
    },
    /// Refused: no standby waits for the role, so stepping down would leave it without a
    /// leader until a node campaigned again. Ask with `force` to insist.
    NoStandby {
        /// The current tenure.
        epoch: Epoch,
        /// Its node.
        node_id: String,
    },
    /// The role has no live leader (never led, released, or its lock session ended).
    NoLeader,
}

impl Cluster {
    /// Asks the leader of `role` to hand over gracefully; `by` (who and from where) goes to
    /// the audit trail. The request travels through the database, so any node - or a process
    /// that is no node - may ask. The leader drains its leader-only work and releases; a
    /// standby waiting inside the role's lock is granted it at once, and the stepped-down node
    /// waits again as a standby.
    ///
    /// Refused ([`StepDown::NoStandby`]) when no standby waits: the role would have no leader
    /// until a reserve or the same node campaigned again. `force` asks anyway (the same node
    /// then most likely leads again, in a new tenure, milliseconds later). Best effort: a
    /// leader whose notification session is down at that moment does not hear the request.
    pub async fn step_down(&self, role: &Role, by: &str, force: bool) -> Result<StepDown> {
        let row: Option<(i64, String, i64, bool)> = sqlx::query_as(
            "SELECT epoch, node_id, standbys, asked FROM forge.step_down($1, $2, $3, $4)",
        )
        .bind(&self.namespace)
        .bind(role)
        .bind(by)
        .bind(force)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match row {
            None => StepDown::NoLeader,
            Some((epoch, node_id, standbys, true)) => StepDown::Asked {
                epoch: Epoch(epoch),
                node_id,
                standbys: standbys.max(0) as u64,
            },
            Some((epoch, node_id, _, false)) => StepDown::NoStandby {
                epoch: Epoch(epoch),
                node_id,
            },
        })
    }

    /// Records an operator's write in the events history (kind `admin_action`). The write
    /// actions of the read models record themselves; this is for writes made elsewhere.
    pub async fn audit(
        &self,
        action: &str,
        subject: &str,
        by: &str,
        detail: serde_json::Value,
    ) -> Result<()> {
        audit(&self.pool, &self.namespace, action, subject, by, detail).await
    }
}
