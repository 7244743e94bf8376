//! The read models' view types: what the API, the CLI and the dashboard show.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::role::{Epoch, Role};

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

    pub(super) fn parse(text: &str) -> Option<GapFrom> {
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
