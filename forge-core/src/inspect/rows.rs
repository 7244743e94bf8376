//! The rows the read models' queries answer, and how each maps to its view.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;

use super::views::{
    GapFrom, LeaderView, LeadershipState, NodeState, NodeView, TenureEnd, TenureView,
};
use crate::role::{Epoch, LockNamespace};

fn drift_ms(drift_after: Duration) -> i64 {
    drift_after.as_millis().min(i64::MAX as u128) as i64
}

/// Every role's leadership, with whether its tenure is current (`forge.tenure_current`, the
/// fence's rule). `$1` namespace.
const LEADERS_SQL: &str =
    "SELECT role, node_id, epoch, acquired_at, renewed_at, lease_until, released_at,
            extract(epoch FROM lease_until - clock_timestamp())::float8 * 1000 AS remaining,
            forge.tenure_current(l) AS led
       FROM forge.leaders l WHERE namespace = $1";

/// [`LEADERS_SQL`] ordered by role, the namespace bound.
pub(super) fn leaders_query(
    namespace: &LockNamespace,
) -> QueryAs<'_, Postgres, LeaderRow, PgArguments> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("{LEADERS_SQL} ORDER BY role"))).bind(namespace)
}

/// A row of [`LEADERS_SQL`].
#[derive(sqlx::FromRow)]
pub(super) struct LeaderRow {
    role: String,
    node_id: String,
    epoch: Epoch,
    acquired_at: DateTime<Utc>,
    renewed_at: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    released_at: Option<DateTime<Utc>>,
    remaining: f64,
    led: bool,
}

impl From<LeaderRow> for LeaderView {
    fn from(row: LeaderRow) -> LeaderView {
        LeaderView {
            state: match (row.led, row.released_at) {
                (true, _) => LeadershipState::Led,
                (false, Some(_)) => LeadershipState::Released,
                (false, None) => LeadershipState::Lost,
            },
            role: row.role,
            node_id: row.node_id,
            epoch: row.epoch,
            acquired_at: row.acquired_at,
            renewed_at: row.renewed_at,
            lease_until: row.lease_until,
            released_at: row.released_at,
            lease_remaining_ms: row.remaining,
            led: row.led,
        }
    }
}

/// The nodes with their state: stopped, down (marked by the scheduler leader), drifted
/// (marked, or silent for drift_after), else active; and the roles each leads: those whose
/// current tenure is its (the same rule as a leader's `led`). `$1` namespace, `$2` drift ms.
const NODES_SQL: &str = "SELECT node_id, hostname, pid, version, started_at, heartbeat_at,
        extract(epoch FROM clock_timestamp() - heartbeat_at)::float8 * 1000 AS age_ms,
        roles, work_roles, queues, admin_url, stopped_at, down_at, down_reason,
        ARRAY(SELECT l.role FROM forge.leaders l
               WHERE l.namespace = n.namespace AND l.node_id = n.node_id
                 AND forge.tenure_current(l)
               ORDER BY l.role) AS leads,
        CASE WHEN stopped_at IS NOT NULL THEN 'stopped'
             WHEN down_at IS NOT NULL THEN 'down'
             WHEN drifted_at IS NOT NULL
               OR heartbeat_at < clock_timestamp() - $2 * interval '1 millisecond' THEN 'drifted'
             ELSE 'active' END AS state
   FROM forge.nodes n WHERE namespace = $1";

/// [`NODES_SQL`] and `tail`, with the base query's parameters bound (the tail's are `$3`
/// onwards).
pub(super) fn nodes_query<'q>(
    namespace: &'q LockNamespace,
    drift_after: Duration,
    tail: &str,
) -> QueryAs<'q, Postgres, NodeRow, PgArguments> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("{NODES_SQL} {tail}")))
        .bind(namespace)
        .bind(drift_ms(drift_after))
}

/// A row of [`NODES_SQL`].
#[derive(sqlx::FromRow)]
pub(super) struct NodeRow {
    node_id: String,
    state: NodeState,
    hostname: Option<String>,
    pid: Option<i32>,
    version: Option<String>,
    started_at: DateTime<Utc>,
    heartbeat_at: DateTime<Utc>,
    age_ms: f64,
    roles: Vec<String>,
    work_roles: Vec<String>,
    leads: Vec<String>,
    queues: serde_json::Value,
    admin_url: Option<String>,
    stopped_at: Option<DateTime<Utc>>,
    down_at: Option<DateTime<Utc>>,
    down_reason: Option<String>,
}

impl From<NodeRow> for NodeView {
    fn from(row: NodeRow) -> NodeView {
        NodeView {
            node_id: row.node_id,
            state: row.state,
            live: row.state.is_live(),
            hostname: row.hostname,
            pid: row.pid,
            version: row.version,
            started_at: row.started_at,
            heartbeat_at: row.heartbeat_at,
            heartbeat_age_ms: row.age_ms,
            roles: row.roles,
            work_roles: row.work_roles,
            leads: row.leads,
            queues: row.queues,
            admin_url: row.admin_url,
            stopped_at: row.stopped_at,
            down_at: row.down_at,
            down_reason: row.down_reason,
        }
    }
}

/// A row of [`Cluster::history`]'s query: an election with its end.
#[derive(sqlx::FromRow)]
pub(super) struct TenureRow {
    id: i64,
    role: String,
    epoch: Epoch,
    node_id: String,
    at: DateTime<Utc>,
    failover: bool,
    gap_ms: Option<f64>,
    gap_from: Option<String>,
    moved: Option<String>,
    released_at: Option<DateTime<Utc>>,
    next_at: Option<DateTime<Utc>>,
}

impl From<TenureRow> for TenureView {
    fn from(row: TenureRow) -> TenureView {
        let (ended_at, end) = match (row.released_at, row.next_at) {
            (Some(at), _) => (Some(at), TenureEnd::Released),
            (None, Some(at)) => (Some(at), TenureEnd::Lost),
            (None, None) => (None, TenureEnd::Current),
        };
        let failover = row.failover;
        TenureView {
            id: row.id,
            role: row.role,
            epoch: row.epoch,
            node_id: row.node_id,
            acquired_at: row.at,
            failover,
            gap_from: row.gap_ms.map(|_| {
                match row.gap_from.as_deref().and_then(GapFrom::parse) {
                    Some(from) => from,
                    // Recorded before gap_from was: measured from the release or the last
                    // renewal.
                    None if failover => GapFrom::LastRenewal,
                    None => GapFrom::Release,
                }
            }),
            gap_ms: row.gap_ms,
            moved: row.moved,
            ended_at,
            end,
        }
    }
}
