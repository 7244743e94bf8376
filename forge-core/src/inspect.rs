//! Read models of the cluster: who leads what, the leadership history with each failover's
//! gap, the events, the nodes and their states, the per-minute series. Typed and paginated;
//! shared by the admin API, the CLI and the dashboard. Every query reads PostgreSQL, so any
//! node (or a process that is no node at all) answers for the whole cluster.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;
use sqlx::{PgPool, Postgres};

use crate::error::Result;
use crate::role::{Epoch, LockNamespace, Role};

crate::sql_enum! {
    /// What happened (`forge.events.kind`).
    pub enum EventKind {
        /// A node won a role (`detail.failover`: its predecessor did not hand over;
        /// `detail.gap_ms`: how long the role was without a leader).
        LeaderElected = "leader_elected",
        /// A leader handed a role over gracefully.
        LeaderReleased = "leader_released",
        /// A follower ended the session of a leader whose renewal it saw unchanged for a lease
        /// (`detail.silent_ms`), or a new leader ended a deposed tenure's stuck transactions.
        LeaderFenced = "leader_fenced",
        /// A leader lost its leadership without handing over, as it saw it (`detail.reason`:
        /// deadline, deposed, renewal_failed); recorded best effort once it reaches the database.
        LeaderLost = "leader_lost",
        /// A leader handed a role over to a named node to spread the roles or because that
        /// node prefers the role (`detail.to`, `detail.why`: `spread` or `preferred`).
        LeaderRebalanced = "leader_rebalanced",
        /// A node started.
        NodeJoined = "node_joined",
        /// A node stopped gracefully.
        NodeLeft = "node_left",
        /// A node stopped heartbeating for `drift_after`.
        NodeDrifted = "node_drifted",
        /// A drifted node heartbeats again.
        NodeRecovered = "node_recovered",
        /// A node is gone (`detail.reason`): its running jobs are rescued.
        NodeDown = "node_down",
        /// A node marked down came back.
        NodeRejoined = "node_rejoined",
        /// A departed node was removed from the registry (`forget_after`).
        NodeForgotten = "node_forgotten",
        /// An operator's write through the admin API or the CLI (`detail.action`,
        /// `detail.subject`, `detail.by`).
        AdminAction = "admin_action",
    }
}

crate::sql_enum! {
    /// Where a node is, as the cluster sees it.
    pub enum NodeState {
        /// Heartbeating.
        Active = "active",
        /// No heartbeat for `drift_after`: frozen, starved or cut off.
        Drifted = "drifted",
        /// Gone: its session ended while PostgreSQL stayed up, or no heartbeat for
        /// `down_after`. Its running jobs are rescued.
        Down = "down",
        /// Stopped gracefully.
        Stopped = "stopped",
    }
}

impl NodeState {
    /// Whether a node in this state is live (active or drifted): it may still run work and
    /// hold leaderships. Down and stopped nodes are gone.
    pub fn is_live(self) -> bool {
        matches!(self, NodeState::Active | NodeState::Drifted)
    }
}

impl Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl Serialize for NodeState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A page of results, newest first, and the cursor of the next (older) page.
#[derive(Clone, Debug, Serialize)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Pass as [`PageRequest::before`] for the next page; `None` on the last page.
    pub next: Option<i64>,
}

/// Which page to read: at most `limit` items (1..=500) older than the cursor `before`.
#[derive(Clone, Copy, Debug)]
pub struct PageRequest {
    /// Items per page.
    pub limit: u32,
    /// The cursor from the previous page's [`Page::next`]; `None` for the newest page.
    pub before: Option<i64>,
}

impl Default for PageRequest {
    fn default() -> Self {
        PageRequest {
            limit: 50,
            before: None,
        }
    }
}

impl PageRequest {
    /// The newest `limit` items.
    pub fn first(limit: u32) -> PageRequest {
        PageRequest {
            limit,
            before: None,
        }
    }

    fn limit(&self) -> i64 {
        i64::from(self.limit.clamp(1, 500))
    }

    /// Builds the page from one more row than asked for: its presence means there is more.
    pub fn page<T>(&self, mut items: Vec<T>, cursor: impl Fn(&T) -> i64) -> Page<T> {
        let more = items.len() as i64 > self.limit();
        items.truncate(self.limit() as usize);
        let next = more.then(|| items.last().map(&cursor)).flatten();
        Page { items, next }
    }

    /// The SQL `LIMIT` to use: one more than the page holds.
    pub fn fetch(&self) -> i64 {
        self.limit() + 1
    }
}

/// The current leadership of a role.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct LeaderView {
    /// The role.
    pub role: String,
    /// The leader's node (the last one, if released).
    pub node_id: String,
    /// The tenure's epoch.
    pub epoch: Epoch,
    /// When it was granted.
    pub acquired_at: DateTime<Utc>,
    /// Its last renewal.
    pub renewed_at: DateTime<Utc>,
    /// When the lease runs out without renewal, by the database's clock (a report: a lease is
    /// judged on the observers' own clocks).
    pub lease_until: DateTime<Utc>,
    /// Set when the leader handed the role over and nobody took it yet.
    pub released_at: Option<DateTime<Utc>>,
    /// Milliseconds of lease left by the database's clock (negative: past `lease_until`).
    #[serde(serialize_with = "crate::inspect::rounded::figure")]
    pub lease_remaining_ms: f64,
    /// Whether this tenure is current (`forge.tenure_current`, the rule the fence enforces:
    /// unreleased, its lock session alive): the role is led by `node_id`.
    pub led: bool,
    /// Led, released (handed over, nobody took it yet) or lost (its lock session ended, and no
    /// one leads yet).
    pub state: LeadershipState,
}

impl LeaderView {
    /// Whether the role has a leader: its tenure is current (see [`LeaderView::led`]).
    pub fn is_led(&self) -> bool {
        self.led
    }
}

/// Where a role's leadership is (see [`LeaderView::state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeadershipState {
    /// Its tenure is current: the role has a leader.
    Led,
    /// Its leader handed it over and no one took it yet.
    Released,
    /// Its leader's lock session ended (a crash, or ended once it stopped renewing), and no one
    /// took it yet.
    Lost,
}

impl LeadershipState {
    /// `led`, `released` or `lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeadershipState::Led => "led",
            LeadershipState::Released => "released",
            LeadershipState::Lost => "lost",
        }
    }
}

/// How a tenure ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TenureEnd {
    /// It is the current leadership.
    Current,
    /// Handed over gracefully.
    Released,
    /// Lost without a handoff (crash, freeze, partition): the next tenure is a failover.
    Lost,
}

/// One tenure of one role, from the leadership history.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct TenureView {
    /// Its event id (the cursor).
    pub id: i64,
    /// The role.
    pub role: String,
    /// The epoch.
    pub epoch: Epoch,
    /// The leader.
    pub node_id: String,
    /// When it began.
    pub acquired_at: DateTime<Utc>,
    /// Whether it began by failover (the previous leader did not hand over).
    pub failover: bool,
    /// How long the role was without a leader before it, in milliseconds: from the instant
    /// [`TenureView::gap_from`] names to this election (`None` for a role's first tenure).
    #[serde(serialize_with = "crate::inspect::rounded::optional")]
    pub gap_ms: Option<f64>,
    /// Where [`TenureView::gap_ms`] is measured from.
    pub gap_from: Option<GapFrom>,
    /// Set when it began with a placement move (a handoff to this node named by its
    /// predecessor): why - `spread` (the roles spread across the nodes) or `preferred` (this
    /// node prefers the role).
    pub moved: Option<String>,
    /// When it ended (release, or the next election after a loss).
    pub ended_at: Option<DateTime<Utc>>,
    /// How it ended.
    pub end: TenureEnd,
}

/// Where a tenure's gap ([`TenureView::gap_ms`], `leader_elected`'s `detail.gap_ms`) is measured
/// from: the last instant the previous tenure is known to have led.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GapFrom {
    /// A handoff: the previous leader's release.
    Release,
    /// A failover whose new leader was waiting inside the role's lock: the lock was granted to
    /// it the instant the previous leader's lock session ended (a crash, a terminated session),
    /// while that leader's lease was still valid. The gap is the takeover as PostgreSQL saw it
    /// (a killed process's session ends a few milliseconds after the process: the demo's
    /// SIGKILL-to-election 15 ms is such a gap of 0.3 ms).
    LockGranted,
    /// A failover otherwise (the lock was free when the new leader asked, or the previous
    /// lease had run out: a frozen or cut-off leader): the previous leader's last renewal, the
    /// last instant it is known to have led. An upper bound of the gap.
    LastRenewal,
}

impl GapFrom {
    /// `release`, `lock_granted` or `last_renewal` (as in `detail.gap_from`).
    pub fn as_str(self) -> &'static str {
        match self {
            GapFrom::Release => "release",
            GapFrom::LockGranted => "lock_granted",
            GapFrom::LastRenewal => "last_renewal",
        }
    }

    fn parse(text: &str) -> Option<GapFrom> {
        [GapFrom::Release, GapFrom::LockGranted, GapFrom::LastRenewal]
            .into_iter()
            .find(|g| g.as_str() == text)
    }
}

/// One event of the cluster's history.
#[derive(Clone, Debug, PartialEq, Serialize, sqlx::FromRow)]
#[non_exhaustive]
pub struct EventView {
    /// Its id (the cursor).
    pub id: i64,
    /// When.
    pub at: DateTime<Utc>,
    /// What.
    pub kind: EventKind,
    /// The node concerned.
    pub node_id: Option<String>,
    /// The role concerned.
    pub role: Option<String>,
    /// The epoch concerned.
    pub epoch: Option<Epoch>,
    /// Everything else (failover, gap, reason, ...).
    pub detail: serde_json::Value,
}

/// Which events to read.
#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    /// Only these kinds (empty: all).
    pub kinds: Vec<EventKind>,
    /// Only about this node.
    pub node_id: Option<String>,
    /// Only about this role.
    pub role: Option<Role>,
    /// Only after this id (for following: pass the newest id seen).
    pub after: Option<i64>,
}

/// A node of the cluster.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct NodeView {
    /// Its id.
    pub node_id: String,
    /// Active, drifted, down or stopped.
    pub state: NodeState,
    /// Its host.
    pub hostname: Option<String>,
    /// Its process id.
    pub pid: Option<i32>,
    /// The application's version.
    pub version: Option<String>,
    /// When this run of it started.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// Milliseconds since its last heartbeat.
    #[serde(serialize_with = "crate::inspect::rounded::figure")]
    pub heartbeat_age_ms: f64,
    /// Whether it is live: active or drifted ([`NodeState::is_live`]).
    pub live: bool,
    /// The roles it campaigns for.
    pub roles: Vec<String>,
    /// The roles its binary has work for (crons, leader-only jobs, leader tasks, the built-in
    /// duties), campaigned for or not: `roles` leaves out those its `[node] roles` hides.
    pub work_roles: Vec<String>,
    /// The roles it leads: those whose current tenure ([`LeaderView::led`]) is its. A node
    /// down or stopped leads nothing, whatever its last heartbeat said.
    pub leads: Vec<String>,
    /// The queues it works, with their concurrency.
    pub queues: serde_json::Value,
    /// Its admin API, if it serves one.
    pub admin_url: Option<String>,
    /// When it stopped gracefully.
    pub stopped_at: Option<DateTime<Utc>>,
    /// When it was marked down, and why.
    pub down_at: Option<DateTime<Utc>>,
    /// Why it was marked down.
    pub down_reason: Option<String>,
}

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

/// One point of a cluster series.
#[derive(Clone, Debug, PartialEq, Serialize, sqlx::FromRow)]
pub struct SeriesPoint {
    /// The start of the point's interval (`[metrics] rollup_interval`).
    pub at: DateTime<Utc>,
    /// The series (`jobs_completed`, `queue_depth`, ...).
    pub series: String,
    /// Its label (a queue, a cron; empty for none).
    pub label: String,
    /// The value for that minute.
    pub value: f64,
}

/// What a write to one item did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", content = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Change {
    /// Done.
    Applied,
    /// No such item.
    NotFound,
    /// Not possible in the item's state, for this reason (for example: deleting a running
    /// job).
    Refused(String),
}

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

/// The cluster's read models (leaders, history, events, nodes, series) for one namespace.
#[derive(Clone, Debug)]
pub struct Cluster {
    pool: PgPool,
    namespace: LockNamespace,
    drift_after: Duration,
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
fn leaders_query(namespace: &LockNamespace) -> QueryAs<'_, Postgres, LeaderRow, PgArguments> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("{LEADERS_SQL} ORDER BY role"))).bind(namespace)
}

/// A row of [`LEADERS_SQL`].
#[derive(sqlx::FromRow)]
struct LeaderRow {
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
pub(crate) const NODES_SQL: &str =
    "SELECT node_id, hostname, pid, version, started_at, heartbeat_at,
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
fn nodes_query<'q>(
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
struct NodeRow {
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
struct TenureRow {
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
