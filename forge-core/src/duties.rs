//! The built-in roles' duties that belong to the core.
//!
//! * `log_compactor`: every `[cluster] compaction_interval`, runs every registered pruner -
//!   one per table, registered by the table's owner ([`crate::Assembly::prune`]) - in
//!   batches, each statement fenced by the tenure.
//! * `metrics_aggregator`: once per `[metrics] rollup_interval`, rolls the counters the nodes
//!   publish in their heartbeats into the cluster series (`forge.stats`), and reports the
//!   cluster's status as gauges: the nodes by state (`forge_cluster_nodes{state}`) and work
//!   with nowhere to run (`forge_work_unserved{work, name}`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use sqlx::Row;
use tokio::time::{sleep, timeout};
use tracing::{debug, warn};

use crate::error::Error;
use crate::inspect::{ClusterStatus, NodeState, WorkKind, read_status};
use crate::leadership::Leadership;
use crate::metrics::defs;

/// Whether a duty's error says this tenure is over (the fence refused it, or the leader's
/// session is gone).
pub(crate) fn is_fenced(err: &Error) -> bool {
    match err {
        Error::Fenced { .. } => true,
        Error::Database(err) => Error::is_fence_refusal(err),
        _ => false,
    }
}

/// Rows a pruner deletes per statement.
const PRUNE_BATCH: i32 = 10_000;

/// One table's pruning: a SQL function `forge.<function>(namespace, role, epoch, tenure,
/// retention_ms, limit) RETURNS bigint` that deletes at most `limit` rows older than the
/// retention, fenced.
#[derive(Clone, Debug)]
pub(crate) struct Pruner {
    pub(crate) table: &'static str,
    pub(crate) function: &'static str,
    pub(crate) retention: Duration,
}

/// The log compactor's leader task.
pub(crate) async fn compact(leadership: Leadership, pruners: Arc<Vec<Pruner>>, every: Duration) {
    // A first pass soon after the tenure starts, then one per interval.
    let mut pause = every.min(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = sleep(pause) => {}
            _ = leadership.stopping() => return,
        }
        pause = every;
        for pruner in pruners.iter() {
            if !prune_table(&leadership, pruner).await {
                return;
            }
        }
    }
}

/// Prunes one table until a batch comes back short. False when this tenure is over.
async fn prune_table(leadership: &Leadership, pruner: &Pruner) -> bool {
    let counter = leadership
        .metrics()
        .counter(&defs::PRUNED, &[("table", pruner.table)]);
    let token = leadership.fence_token();
    let sql = format!("SELECT forge.{}($1, $2, $3, $4, $5, $6)", pruner.function);
    loop {
        if leadership.is_draining() {
            return false;
        }
        let deleted = async {
            let mut session = leadership.session().await?;
            let row = token
                .bind(sqlx::query(sqlx::AssertSqlSafe(sql.as_str())))
                .bind(pruner.retention.as_millis().min(i64::MAX as u128) as i64)
                .bind(PRUNE_BATCH)
                .fetch_one(&mut *session)
                .await?;
            Ok::<i64, Error>(row.try_get(0)?)
        };
        match timeout(leadership.lease_duration(), deleted).await {
            Ok(Ok(deleted)) => {
                counter.increment(deleted.max(0) as u64);
                if deleted > 0 {
                    debug!(target: "forge::compactor", table = pruner.table, deleted, "pruned by retention");
                }
                if deleted < i64::from(PRUNE_BATCH) {
                    return true;
                }
            }
            Ok(Err(err)) if is_fenced(&err) => return false,
            Ok(Err(err)) => {
                warn!(target: "forge::compactor", table = pruner.table, error = %err, "pruning failed; trying again at the next pass");
                return true;
            }
            Err(_) => {
                warn!(target: "forge::compactor", table = pruner.table, "pruning got no answer in time; trying again at the next pass");
                return true;
            }
        }
    }
}

/// What the aggregator needs to know.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Aggregation {
    /// Nodes silent this long are drifted.
    pub(crate) drift_after: Duration,
    /// How often to report the cluster's status as gauges.
    pub(crate) gauge_every: Duration,
    /// The width of a point of the series.
    pub(crate) interval: Duration,
    /// How long after an interval's end to roll it (its last heartbeats land meanwhile).
    pub(crate) settle: Duration,
}

/// The metrics aggregator's leader task: after every interval boundary, roll the interval that
/// just ended; every `gauge_every` (three heartbeat intervals), report the cluster's status.
pub(crate) async fn aggregate(leadership: Leadership, how: Aggregation) {
    let mut gauges = ClusterGauges::new(&leadership);
    let width = TimeDelta::from_std(how.interval).unwrap_or(TimeDelta::minutes(1));
    let settle = TimeDelta::from_std(how.settle).unwrap_or_default();
    let next_boundary = || {
        let now = Utc::now();
        now.duration_trunc(width).unwrap_or(now) + width
    };
    let mut boundary = next_boundary();
    let (drift_after, gauge_every) = (how.drift_after, how.gauge_every);
    loop {
        gauges.report(&leadership, drift_after).await;
        let roll_at = boundary + settle;
        let wait = (roll_at - Utc::now())
            .to_std()
            .unwrap_or_default()
            .min(gauge_every);
        tokio::select! {
            _ = sleep(wait) => {}
            _ = leadership.stopping() => return,
        }
        if Utc::now() >= roll_at {
            if !rollup(&leadership, boundary - width).await {
                return;
            }
            boundary = next_boundary();
        }
    }
}

/// Rolls the nodes' counters into `forge.stats` for the interval starting at `at`. False
/// when fenced.
async fn rollup(leadership: &Leadership, at: DateTime<Utc>) -> bool {
    let token = leadership.fence_token();
    let rolled = async {
        let mut session = leadership.session().await?;
        let row = token
            .bind(sqlx::query("SELECT forge.stats_rollup($1, $2, $3, $4, $5)"))
            .bind(at)
            .fetch_one(&mut *session)
            .await?;
        Ok::<i64, Error>(row.try_get(0)?)
    };
    match timeout(leadership.lease_duration(), rolled).await {
        Ok(Ok(rows)) => {
            debug!(target: "forge::aggregator", %at, rows, "rolled the nodes' counters up");
            true
        }
        Ok(Err(err)) if is_fenced(&err) => false,
        Ok(Err(err)) => {
            warn!(target: "forge::aggregator", %at, error = %err, "rolling the nodes' counters up failed; this interval's figures go to the next");
            true
        }
        Err(_) => {
            warn!(target: "forge::aggregator", %at, "rolling up got no answer in time");
            true
        }
    }
}

/// The cluster's status as gauges, registered through the tenure's metrics: exported while this
/// node is the aggregator leader only (never as 0 elsewhere). `forge_cluster_nodes{state}`, one
/// gauge per state; `forge_work_unserved{work, name}`, 1 for each unserved queue or role, 0 for
/// one that was unserved earlier in the tenure and is served again.
struct ClusterGauges {
    nodes: BTreeMap<NodeState, metrics::Gauge>,
    /// Every queue and role reported unserved in this tenure (1 while unserved, then 0).
    unserved: BTreeSet<(WorkKind, String)>,
}

impl ClusterGauges {
    fn new(leadership: &Leadership) -> ClusterGauges {
        let nodes = NodeState::ALL
            .iter()
            .map(|state| {
                let gauge = leadership
                    .metrics()
                    .gauge(&defs::CLUSTER_NODES, &[("state", state.as_str())]);
                (*state, gauge)
            })
            .collect();
        ClusterGauges {
            nodes,
            unserved: BTreeSet::new(),
        }
    }

    async fn report(&mut self, leadership: &Leadership, drift_after: Duration) {
        let status = async {
            let mut session = leadership.session().await?;
            let mut tx = sqlx::Connection::begin(&mut *session).await?;
            let status = read_status(&mut tx, leadership.namespace(), drift_after).await?;
            tx.commit().await?;
            Ok::<ClusterStatus, Error>(status)
        };
        let status = match status.await {
            Ok(status) => status,
            Err(err) => {
                debug!(target: "forge::aggregator", error = %err, "cannot read the cluster's status");
                return;
            }
        };
        for (state, gauge) in &self.nodes {
            gauge.set(status.nodes.get(*state) as f64);
        }
        let unserved: BTreeSet<(WorkKind, String)> = status
            .unserved
            .into_iter()
            .map(|work| (work.work, work.name))
            .collect();
        self.unserved.extend(unserved.iter().cloned());
        for key in &self.unserved {
            let (work, name) = key;
            leadership
                .metrics()
                .gauge(
                    &defs::WORK_UNSERVED,
                    &[("work", work.as_str()), ("name", name)],
                )
                .set(if unserved.contains(key) { 1.0 } else { 0.0 });
        }
    }
}
