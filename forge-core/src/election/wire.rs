//! The campaign's wire format: the arguments of `forge.campaign` and the row it answers,
//! decoded, and the `application_name` other nodes read.

use super::observed::EndHolder;
use super::*;

/// One row of `forge.campaign(...)`.
#[derive(sqlx::FromRow)]
pub(super) struct CampaignRow {
    pub(super) acquired: bool,
    pub(super) epoch: Option<i64>,
    pub(super) tenure: Option<i64>,
    pub(super) leader_node: Option<String>,
    pub(super) leader_since: Option<DateTime<Utc>>,
    /// The leader's last renewal (a value every renewal changes; compared, never used as a time).
    pub(super) renewed_at: Option<DateTime<Utc>>,
    pub(super) released: Option<bool>,
    /// Granted by failover (`None` when not granted).
    pub(super) failover: Option<bool>,
    pub(super) my_pid: i32,
    pub(super) holder_pid: Option<i32>,
    pub(super) holder_application: Option<String>,
    pub(super) fenced_pid: Option<i32>,
    /// Not granted, and not waiting: enough standbys wait inside the lock.
    pub(super) reserve: bool,
}

/// The arguments of `forge.campaign`, owned so the call can outlive a borrow of the campaign.
pub(super) struct CallArgs {
    pub(super) namespace: LockNamespace,
    pub(super) role: Role,
    pub(super) key: LockKey,
    pub(super) node: NodeId,
    pub(super) lease_ms: i64,
    pub(super) standbys: i32,
    /// Wait inside the lock (not when ending a silent holder: the call comes back at once, and
    /// the next one waits for the ended session's lock).
    pub(super) wait: bool,
    /// The silent holder to end, if any.
    pub(super) end: Option<EndHolder>,
}

/// Calls `forge.campaign` once.
pub(super) async fn campaign_call(
    conn: &mut PgConnection,
    args: &CallArgs,
) -> Result<CampaignRow, sqlx::Error> {
    let end = args.end.as_ref();
    sqlx::query_as("SELECT * FROM forge.campaign($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)")
        .bind(&args.namespace)
        .bind(&args.role)
        .bind(args.key.0)
        .bind(&args.node)
        .bind(args.lease_ms)
        .bind(args.wait && end.is_none())
        .bind(args.standbys)
        .bind(end.map(|e| e.epoch))
        .bind(end.map(|e| e.tenure))
        .bind(end.map(|e| e.renewed_at))
        .bind(end.map(|e| e.silent_ms))
        .fetch_one(&mut *conn)
        .await
}

/// The `application_name` of a lock session; other nodes use its prefix to tell FORGE
/// sessions from foreign holders of a key.
pub(crate) fn lock_application_name(role: &Role, node: &NodeId) -> String {
    format!("forge:{}:{}", role.name(), node)
}
