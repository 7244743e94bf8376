//! Read models of the cluster: who leads what, the leadership history with each failover's
//! gap, the events, the nodes and their states, the per-minute series. Typed and paginated;
//! shared by the admin API, the CLI and the dashboard. Every query reads PostgreSQL, so any
//! node (or a process that is no node at all) answers for the whole cluster.
//!
//! The pieces: the view types (`views`), paging (`paging`), the cluster's status and its rules
//! (`status`), the rows the queries answer and how they map to views (`rows`), and the writes
//! (`writes`: step-down, the audit trail).

mod paging;
mod rows;
mod status;
mod views;
mod writes;

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::error::Result;
use crate::role::{LockNamespace, Role};
use rows::{TenureRow, leaders_query, nodes_query};

pub use paging::{Page, PageRequest};
pub(crate) use status::read_status;
pub use status::{ClusterStatus, NodeCounts, RoleStatus, UnservedWork, WorkKind};
pub use views::{
    Change, EventFilter, EventKind, EventView, GapFrom, LeaderView, LeadershipState, NodeState,
    NodeView, SeriesPoint, TenureEnd, TenureView,
};
pub use writes::StepDown;
#[doc(hidden)]
pub use writes::audit;

/// The cluster's read models (leaders, history, events, nodes, series) for one namespace.
#[derive(Clone, Debug)]
pub struct Cluster {
    pool: PgPool,
    namespace: LockNamespace,
    drift_after: Duration,
}

impl Cluster {
    /// Read models on `pool` for the cluster `namespace`; nodes silent for `drift_after`
    /// show as drifted (`[cluster.membership] drift_after`).
    pub fn new(pool: PgPool, namespace: LockNamespace, drift_after: Duration) -> Cluster {
        Cluster {
            pool,
            namespace,
            drift_after,
        }
    }

    /// The pool it reads through.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The namespace it reads.
    pub fn namespace(&self) -> &LockNamespace {
        &self.namespace
    }

    /// Every role's current (or last) leadership.
    pub async fn leaders(&self) -> Result<Vec<LeaderView>> {
        let leaders = leaders_query(&self.namespace).fetch_all(&self.pool).await?;
        Ok(leaders.into_iter().map(LeaderView::from).collect())
    }

    /// The leadership history, newest first: each tenure with how it began (failover or
    /// not, and the gap before it) and how it ended.
    pub async fn history(
        &self,
        role: Option<&Role>,
        page: PageRequest,
    ) -> Result<Page<TenureView>> {
        let rows: Vec<TenureRow> = sqlx::query_as(
            "SELECT e.id, e.role, e.epoch, e.node_id, e.at,
                    coalesce((e.detail->>'failover')::boolean, false) AS failover,
                    (e.detail->>'gap_ms')::float8 AS gap_ms, e.detail->>'gap_from' AS gap_from,
                    CASE WHEN (e.detail->>'moved')::boolean THEN (
                        SELECT coalesce(m.detail->>'why', 'spread') FROM forge.events m
                         WHERE m.namespace = e.namespace AND m.role = e.role
                           AND m.kind = 'leader_rebalanced' AND m.id < e.id
                         ORDER BY m.id DESC LIMIT 1) END AS moved,
                    r.at AS released_at, n.at AS next_at
               FROM forge.events e
               LEFT JOIN LATERAL (
                    SELECT x.at FROM forge.events x
                     WHERE x.namespace = e.namespace AND x.role = e.role AND x.epoch = e.epoch
                       AND x.kind = 'leader_released' AND x.id > e.id
                     ORDER BY x.id LIMIT 1) r ON true
               LEFT JOIN LATERAL (
                    SELECT x.at FROM forge.events x
                     WHERE x.namespace = e.namespace AND x.role = e.role
                       AND x.kind = 'leader_elected' AND x.id > e.id
                     ORDER BY x.id LIMIT 1) n ON true
              WHERE e.namespace = $1 AND e.kind = 'leader_elected'
                AND ($2::text IS NULL OR e.role = $2)
                AND ($3::bigint IS NULL OR e.id < $3)
              ORDER BY e.id DESC LIMIT $4",
        )
        .bind(&self.namespace)
        .bind(role)
        .bind(page.before)
        .bind(page.fetch())
        .fetch_all(&self.pool)
        .await?;
        let items = rows.into_iter().map(TenureView::from).collect();
        Ok(page.page(items, |t| t.id))
    }

    /// Events, newest first (or, with [`EventFilter::after`], the ones after that id, oldest
    /// first, for following).
    pub async fn events(&self, filter: &EventFilter, page: PageRequest) -> Result<Page<EventView>> {
        let kinds: Vec<&str> = filter.kinds.iter().map(|k| k.as_str()).collect();
        let items: Vec<EventView> = sqlx::query_as(
            "SELECT id, at, kind, node_id, role, epoch, detail FROM forge.events
              WHERE namespace = $1
                AND (cardinality($2::text[]) = 0 OR kind = ANY ($2))
                AND ($3::text IS NULL OR node_id = $3)
                AND ($4::text IS NULL OR role = $4)
                AND ($5::bigint IS NULL OR id < $5)
                AND ($6::bigint IS NULL OR id > $6)
              ORDER BY CASE WHEN $6::bigint IS NULL THEN -id ELSE id END
              LIMIT $7",
        )
        .bind(&self.namespace)
        .bind(&kinds)
        .bind(filter.node_id.as_deref())
        .bind(filter.role.as_ref())
        .bind(page.before)
        .bind(filter.after)
        .bind(page.fetch())
        .fetch_all(&self.pool)
        .await?;
        Ok(page.page(items, |e| e.id))
    }

    /// Every node the cluster knows (until forgotten), with its state.
    pub async fn nodes(&self) -> Result<Vec<NodeView>> {
        let nodes = nodes_query(&self.namespace, self.drift_after, "ORDER BY node_id")
            .fetch_all(&self.pool)
            .await?;
        Ok(nodes.into_iter().map(NodeView::from).collect())
    }

    /// One node.
    pub async fn node(&self, node_id: &str) -> Result<Option<NodeView>> {
        let node = nodes_query(&self.namespace, self.drift_after, "AND node_id = $3")
            .bind(node_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(node.map(NodeView::from))
    }

    /// How many nodes are in each state.
    pub async fn node_counts(&self) -> Result<NodeCounts> {
        Ok(NodeCounts::of(&self.nodes().await?))
    }

    /// The cluster's status, as every tool shows it ([`ClusterStatus`]): the leaders, the nodes
    /// and the queues with waiting jobs read in one snapshot, with the database's clock.
    pub async fn status(&self) -> Result<ClusterStatus> {
        let mut tx = crate::db::begin(&self.pool).await?;
        let status = read_status(&mut tx, &self.namespace, self.drift_after).await?;
        tx.commit().await?;
        Ok(status)
    }

    /// The cluster series named (all when empty) since `since`, oldest first: `jobs_completed`,
    /// `jobs_failed`, `jobs_retried`, `jobs_dead`, `jobs_cancelled`, `job_attempts` and
    /// `job_duration_seconds_sum` by queue; `cron_runs`, `cron_failures`,
    /// `cron_lag_seconds_sum` and `cron_duration_seconds_sum` by role; `queue_depth`,
    /// `oldest_job_age_seconds` and `dead_jobs` by queue (sampled); and `rollups`, 1 at each
    /// interval whose counters have been rolled up. A counted series has no point for a
    /// rolled-up interval in which it did not move: read a missing point as 0 at the intervals
    /// `rollups` marks, and as unknown at the others (not rolled up yet - the interval in
    /// progress has its samples before its counts - or skipped while no aggregator led: their
    /// counts went to a later interval).
    pub async fn series(&self, names: &[&str], since: DateTime<Utc>) -> Result<Vec<SeriesPoint>> {
        Ok(sqlx::query_as(
            "SELECT at, series, label, value FROM forge.stats
              WHERE namespace = $1 AND at >= $2
                AND (cardinality($3::text[]) = 0 OR series = ANY ($3))
              ORDER BY at, series, label",
        )
        .bind(&self.namespace)
        .bind(since)
        .bind(names)
        .fetch_all(&self.pool)
        .await?)
    }
}

/// How the read models write measured figures in JSON: rounded to three decimals (a
/// microsecond of a millisecond figure, a millisecond of a second's), so that the API and
/// `--json` say `10422.669`, not the `10422.669000000002` a float subtraction leaves.
#[doc(hidden)]
pub mod rounded {
    use serde::Serializer;

    fn round(value: f64) -> f64 {
        (value * 1000.0).round() / 1000.0
    }

    /// `#[serde(serialize_with = "rounded::figure")]`
    pub fn figure<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(round(*value))
    }

    /// `#[serde(serialize_with = "rounded::optional")]`
    pub fn optional<S: Serializer>(value: &Option<f64>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => serializer.serialize_some(&round(*value)),
            None => serializer.serialize_none(),
        }
    }

    #[cfg(test)]
    mod tests {
        #[derive(serde::Serialize)]
        struct Figures {
            #[serde(serialize_with = "super::figure")]
            gap_ms: f64,
            #[serde(serialize_with = "super::optional")]
            lag_ms: Option<f64>,
            #[serde(serialize_with = "super::optional")]
            none: Option<f64>,
        }

        #[test]
        fn figures_carry_no_float_noise() {
            let json = serde_json::to_string(&Figures {
                gap_ms: 10422.669000000002,
                lag_ms: Some(0.1 + 0.2),
                none: None,
            })
            .unwrap();
            assert_eq!(json, r#"{"gap_ms":10422.669,"lag_ms":0.3,"none":null}"#);
        }
    }
}
