//! The cluster's status ([`ClusterStatus`]): its rules, computed once for every surface, and
//! the one-snapshot read behind it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::rows::{leaders_query, nodes_query};
use super::views::{LeaderView, LeadershipState, NodeState, NodeView};
use crate::error::Result;
use crate::role::{Epoch, LockNamespace};

/// How many nodes are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeCounts {
    /// Every node the cluster knows (until forgotten).
    pub total: usize,
    /// Heartbeating.
    pub active: usize,
    /// Silent for `drift_after`.
    pub drifted: usize,
    /// Gone.
    pub down: usize,
    /// Stopped gracefully.
    pub stopped: usize,
}

impl NodeCounts {
    /// The counts of `nodes`.
    pub fn of(nodes: &[NodeView]) -> NodeCounts {
        let mut counts = NodeCounts::default();
        for node in nodes {
            counts.total += 1;
            *counts.slot(node.state) += 1;
        }
        counts
    }

    /// Nodes in `state`.
    pub fn get(&self, state: NodeState) -> usize {
        match state {
            NodeState::Active => self.active,
            NodeState::Drifted => self.drifted,
            NodeState::Down => self.down,
            NodeState::Stopped => self.stopped,
        }
    }

    fn slot(&mut self, state: NodeState) -> &mut usize {
        match state {
            NodeState::Active => &mut self.active,
            NodeState::Drifted => &mut self.drifted,
            NodeState::Down => &mut self.down,
            NodeState::Stopped => &mut self.stopped,
        }
    }
}

/// A role the cluster expects a leader for, and its leadership ([`ClusterStatus::roles`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RoleStatus {
    /// The role.
    pub role: String,
    /// Whether it has a leader ([`LeaderView::led`]).
    pub led: bool,
    /// Led, released, lost; `None`: it has never had a leader.
    pub state: Option<LeadershipState>,
    /// Its leader, while led.
    pub leader: Option<String>,
    /// The current (or last) tenure's epoch.
    pub epoch: Option<Epoch>,
    /// When the current tenure began, while led.
    pub since: Option<DateTime<Utc>>,
    /// The lease left, while led, in milliseconds.
    #[serde(serialize_with = "crate::inspect::rounded::optional")]
    pub lease_remaining_ms: Option<f64>,
    /// The lease's length (from the last renewal to its end), while led, in milliseconds.
    #[serde(serialize_with = "crate::inspect::rounded::optional")]
    pub lease_ms: Option<f64>,
    /// Active nodes that campaign for it.
    pub candidates: usize,
    /// Down nodes that campaigned for it.
    pub down_candidates: Vec<String>,
}

/// What kind of work has nowhere to run ([`UnservedWork::work`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkKind {
    /// Jobs wait in a queue that no live node works.
    Queue,
    /// Live nodes have work for a role (crons, leader-only jobs, leader tasks, the built-in
    /// duties) and none of them campaigns for it.
    Role,
}

impl WorkKind {
    /// `queue` or `role` (the `work` label of `forge_work_unserved`).
    pub fn as_str(self) -> &'static str {
        match self {
            WorkKind::Queue => "queue",
            WorkKind::Role => "role",
        }
    }
}

/// Work with nowhere to run ([`ClusterStatus::unserved`]): a problem of the status, and
/// `forge_work_unserved{work, name}` = 1 on the `metrics_aggregator` leader.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct UnservedWork {
    /// A queue or a role.
    pub work: WorkKind,
    /// The queue's or the role's name.
    pub name: String,
    /// For a role, the live nodes that have work for it (none campaigns for it); for a queue,
    /// empty.
    pub nodes: Vec<String>,
    /// What is wrong, one sentence.
    pub problem: String,
    /// What to do, one sentence.
    pub remedy: String,
}

impl UnservedWork {
    /// Jobs wait in `queue` and no live node works it.
    fn queue(queue: &str) -> UnservedWork {
        UnservedWork {
            work: WorkKind::Queue,
            name: queue.to_owned(),
            nodes: Vec::new(),
            problem: format!("queue {queue} has jobs waiting and no live node works it"),
            remedy: format!(
                "a node works the queues its job types declare unless [node] queues (FORGE_QUEUES) lists others: start nodes whose binary has a job of queue {queue}, or add {queue} to their [node] queues"
            ),
        }
    }

    /// Live `nodes` have work for `role` and none campaigns for it.
    fn role(role: &str, nodes: Vec<String>) -> UnservedWork {
        UnservedWork {
            work: WorkKind::Role,
            name: role.to_owned(),
            problem: format!(
                "role {role} has work on {} and no live node campaigns for it",
                nodes.join(", ")
            ),
            remedy: format!(
                "add {role} to [node] roles (FORGE_ROLES) of nodes that have its work, or unset roles there (a node then campaigns for every role it has work for)"
            ),
            nodes,
        }
    }
}

/// The cluster at a glance, computed once for the admin API (`GET /api/cluster/status`), the
/// CLI (`forge status`, `forge doctor`), the dashboard and the `metrics_aggregator` leader's
/// gauges, so that they all say the same.
///
/// * **Expected roles**: the roles that nodes not stopped (active, drifted or down) campaign
///   for - a node that left gracefully takes its roles with it, one that died does not - and
///   any role led right now.
/// * **Unserved work**: jobs waiting (available, no role) in a queue that no live node works;
///   a role that live nodes have work for and none campaigns for (a role's jobs count through
///   their role: they run on its leader, over every queue).
/// * **Problems** (the cluster is not healthy): an expected role without a leader; unserved
///   work; no active node.
/// * **Warnings**: a node drifted or down.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ClusterStatus {
    /// The cluster's lock namespace.
    pub namespace: String,
    /// The database's clock when this was read: relative times ("3 s ago") count from it.
    pub now: DateTime<Utc>,
    /// No problem.
    pub healthy: bool,
    /// What is wrong, one sentence each.
    pub problems: Vec<String>,
    /// What deserves a look, one sentence each.
    pub warnings: Vec<String>,
    /// Nodes by state.
    pub nodes: NodeCounts,
    /// The expected roles, by name.
    pub roles: Vec<RoleStatus>,
    /// The expected roles without a leader.
    pub leaderless: Vec<String>,
    /// Work with nowhere to run: queues first, then roles, each by name.
    pub unserved: Vec<UnservedWork>,
}

impl ClusterStatus {
    /// The status of a cluster with these leaderships and nodes, read at `now`, where jobs
    /// wait in the queues `waiting` (available, without a role).
    pub fn of(
        namespace: &str,
        now: DateTime<Utc>,
        leaders: &[LeaderView],
        nodes: &[NodeView],
        waiting: &[String],
    ) -> ClusterStatus {
        let counts = NodeCounts::of(nodes);
        let unserved = unserved_work(nodes, waiting);
        let mut expected: std::collections::BTreeSet<&str> = nodes
            .iter()
            .filter(|n| n.state != NodeState::Stopped)
            .flat_map(|n| n.roles.iter().map(String::as_str))
            .collect();
        expected.extend(leaders.iter().filter(|l| l.led).map(|l| l.role.as_str()));
        let mut problems = Vec::new();
        let mut warnings = Vec::new();
        let mut leaderless = Vec::new();
        let roles: Vec<RoleStatus> = expected
            .into_iter()
            .map(|role| {
                let view = leaders.iter().find(|l| l.role == role);
                let led = view.is_some_and(|l| l.led);
                let current = view.filter(|l| l.led);
                let campaigning = |state: NodeState| {
                    nodes
                        .iter()
                        .filter(move |n| n.state == state && n.roles.iter().any(|r| r == role))
                };
                let candidates = campaigning(NodeState::Active).count();
                let down_candidates: Vec<String> = campaigning(NodeState::Down)
                    .map(|n| n.node_id.clone())
                    .collect();
                let unserved_role = unserved
                    .iter()
                    .any(|u| u.work == WorkKind::Role && u.name == role);
                // A role no live node campaigns for is reported below, with what to do.
                if !led && !unserved_role {
                    let why = if candidates == 1 {
                        "1 active node campaigns for it".to_owned()
                    } else if candidates > 1 {
                        format!("{candidates} active nodes campaign for it")
                    } else if !down_candidates.is_empty() {
                        format!(
                            "the nodes that campaign for it are down: {}",
                            down_candidates.join(", ")
                        )
                    } else {
                        "no active node campaigns for it".to_owned()
                    };
                    problems.push(format!("role {role} has no leader ({why})"));
                }
                if !led {
                    leaderless.push(role.to_owned());
                }
                RoleStatus {
                    role: role.to_owned(),
                    led,
                    state: view.map(|l| l.state),
                    leader: current.map(|l| l.node_id.clone()),
                    epoch: view.map(|l| l.epoch),
                    since: current.map(|l| l.acquired_at),
                    lease_remaining_ms: current.map(|l| l.lease_remaining_ms),
                    lease_ms: current.map(|l| {
                        (l.lease_until - l.renewed_at)
                            .num_microseconds()
                            .unwrap_or(0) as f64
                            / 1000.0
                    }),
                    candidates,
                    down_candidates,
                }
            })
            .collect();
        for work in &unserved {
            problems.push(format!("{}: {}", work.problem, work.remedy));
        }
        if counts.active == 0 {
            problems.push("no active node".to_owned());
        }
        for node in nodes {
            if matches!(node.state, NodeState::Drifted | NodeState::Down) {
                warnings.push(format!("node {} is {}", node.node_id, node.state));
            }
        }
        ClusterStatus {
            namespace: namespace.to_owned(),
            now,
            healthy: problems.is_empty(),
            problems,
            warnings,
            nodes: counts,
            roles,
            leaderless,
            unserved,
        }
    }
}

/// Work with nowhere to run: queues in `waiting` that no live node works, then roles that live
/// nodes have work for and none campaigns for.
fn unserved_work(nodes: &[NodeView], waiting: &[String]) -> Vec<UnservedWork> {
    let live = || nodes.iter().filter(|n| n.live);
    let worked = |queue: &str| {
        live().any(|n| {
            n.queues
                .as_object()
                .is_some_and(|queues| queues.contains_key(queue))
        })
    };
    let mut unserved: Vec<UnservedWork> = waiting
        .iter()
        .filter(|queue| !worked(queue))
        .map(|queue| UnservedWork::queue(queue))
        .collect();
    let with_work: std::collections::BTreeSet<&str> = live()
        .flat_map(|n| n.work_roles.iter().map(String::as_str))
        .collect();
    for role in with_work {
        if live().any(|n| n.roles.iter().any(|r| r == role)) {
            continue;
        }
        let nodes = live()
            .filter(|n| n.work_roles.iter().any(|r| r == role))
            .map(|n| n.node_id.clone())
            .collect();
        unserved.push(UnservedWork::role(role, nodes));
    }
    unserved
}

/// The cluster's status ([`ClusterStatus`]), read in `tx` as of one snapshot: for
/// [`Cluster::status`] and the `metrics_aggregator` leader's gauges. The first statement of
/// `tx`: it makes the transaction a read-only repeatable read.
pub(crate) async fn read_status(
    tx: &mut sqlx::PgConnection,
    namespace: &LockNamespace,
    drift_after: Duration,
) -> Result<ClusterStatus> {
    // One snapshot: the leaders, the nodes and the waiting queues as of the same instant.
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&mut *tx)
        .await?;
    let leaders: Vec<LeaderView> = leaders_query(namespace)
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(LeaderView::from)
        .collect();
    let nodes: Vec<NodeView> = nodes_query(namespace, drift_after, "ORDER BY node_id")
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(NodeView::from)
        .collect();
    let waiting: Vec<String> = sqlx::query_scalar("SELECT forge.queues_waiting($1)")
        .bind(namespace)
        .fetch_all(&mut *tx)
        .await?;
    Ok(ClusterStatus::of(
        namespace.name(),
        now,
        &leaders,
        &nodes,
        &waiting,
    ))
}
