//! The campaign for one role on one node: the state machine described in ARCHITECTURE.md.
//!
//! ```text
//!            connect ok                 granted (epoch bumped)
//! Connecting ─────────► Follower ─────────────────────────► Leader
//!     ▲                   │  ▲ wait timed out: report         │
//!     │  session error    │  └─ holder, fence expired holder  │ renewal error / 0 rows /
//!     └───────────────────┴───────────────────────────────────┘ deadline / newer epoch seen
//!                                shutdown: drain (still renewing), release, close → Stopped
//! ```
//!
//! One task owns the role's dedicated lock session and is the only writer of the role's
//! state. Any error on that session ends the tenure at once (tasks cancelled first) and the
//! session is closed, which releases the lock.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use metrics::{Counter, Gauge, Histogram};
use sqlx::postgres::{PgConnectOptions, PgPool, PgRow};
use sqlx::{Connection, PgConnection, Row};
use tokio::sync::{Notify, broadcast, watch};
use tokio::task::JoinSet;
use tokio::time::error::Elapsed;
use tokio::time::{Instant, sleep, sleep_until, timeout, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::LeaderElectionConfig;
use crate::db;
use crate::error::{Error, Result};
use crate::leadership::{Leadership, SharedSession, Tenure, TenureParts};
use crate::membership::{LEADER_CHANNEL, ListenerEvent};
use crate::metrics::{Metrics, defs};
use crate::role::{Epoch, LockKey, LockNamespace, NodeId, Role};
use crate::util::Backoff;

/// Leader-only work: started with a [`Leadership`] each time the node wins the role.
pub(crate) type LeaderTask =
    Arc<dyn Fn(Leadership) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// What a node knows about one of its roles.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum RoleState {
    /// Opening (or re-opening) the role's lock session; `last_error` says why it is not open.
    Connecting {
        /// The last connection error, if any.
        last_error: Option<String>,
    },
    /// Waiting for the lock inside PostgreSQL.
    Follower {
        /// The current leader as last seen (`None`: no leader, or not known yet).
        leader: Option<LeaderInfo>,
    },
    /// This node leads the role.
    Leader {
        /// The tenure's epoch.
        epoch: Epoch,
        /// When the leadership was granted.
        since: DateTime<Utc>,
    },
    /// The role's lock key is held by something that is not a FORGE node of this role.
    Conflict {
        /// What holds it and what to do.
        message: String,
    },
    /// The node has shut down.
    Stopped,
}

impl RoleState {
    /// Whether this node leads the role.
    pub fn is_leader(&self) -> bool {
        matches!(self, RoleState::Leader { .. })
    }
}

/// The leader of a role as seen by a follower.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaderInfo {
    /// The leader's node id.
    pub node_id: String,
    /// Its epoch.
    pub epoch: Epoch,
}

/// The `event` of a `forge_leader` notice asking the leader of `epoch` to step down
/// (sent by [`Cluster::step_down`](crate::inspect::Cluster::step_down)).
pub(crate) const STEP_DOWN: &str = "step_down";

/// A leadership change (or a step-down request) announced on the `forge_leader` channel.
#[derive(Debug, serde::Deserialize)]
struct LeaderNotice {
    namespace: String,
    role: String,
    epoch: i64,
    node: Option<String>,
    event: String,
}

/// What a campaign makes of the node's LISTEN events.
enum Heard {
    /// A leadership change of this campaign's role.
    Notice(LeaderNotice),
    /// Notifications may have been missed: verify now.
    Verify,
    /// Nothing for this role.
    Nothing,
}

/// Shared between the campaign task, the node session and the node's public API.
pub(crate) struct RoleHandle {
    pub(crate) role: Role,
    pub(crate) state: watch::Sender<RoleState>,
    pub(crate) current: Mutex<Option<Leadership>>,
    /// Set while this node is a reserve for the role: a follower that waits outside the lock
    /// (enough standbys wait inside it). The node session's heartbeat then checks whether
    /// the role still has its standbys, and wakes the campaign with `wake` when it does not.
    pub(crate) reserve: AtomicBool,
    pub(crate) wake: Arc<Notify>,
    /// A placement move asked of this node's leadership of the role (from its heartbeat:
    /// `forge.placement_move`): hand it over to that node.
    pub(crate) moves: watch::Sender<Option<PlacementMove>>,
}

/// A placement move: hand the role over to `to`, for `why` (`spread` or `preferred`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PlacementMove {
    pub(crate) to: String,
    pub(crate) why: String,
}

impl RoleHandle {
    pub(crate) fn new(role: Role) -> RoleHandle {
        RoleHandle {
            role,
            state: watch::Sender::new(RoleState::Connecting { last_error: None }),
            current: Mutex::new(None),
            reserve: AtomicBool::new(false),
            wake: Arc::new(Notify::new()),
            moves: watch::Sender::new(None),
        }
    }

    fn set_current(&self, leadership: Option<Leadership>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = leadership;
    }
}

/// The role's metrics, registered once per campaign.
struct RoleMetrics {
    metrics: Metrics,
    role: Role,
    is_leader: Gauge,
    tenure: Gauge,
    epoch: Gauge,
    elections: Counter,
    failovers: Counter,
    lock_conflicts: Counter,
    handoff: Histogram,
    reconnects: Counter,
}

impl RoleMetrics {
    fn new(metrics: &Metrics, role: &Role) -> RoleMetrics {
        let labels = [("role", role.name())];
        let session = crate::metrics::lock_session(role);
        RoleMetrics {
            metrics: metrics.clone(),
            role: role.clone(),
            is_leader: metrics.gauge(&defs::IS_LEADER, &labels),
            tenure: metrics.gauge(&defs::TENURE, &labels),
            epoch: metrics.gauge(&defs::EPOCH, &labels),
            elections: metrics.counter(&defs::ELECTIONS, &labels),
            failovers: metrics.counter(&defs::FAILOVERS, &labels),
            lock_conflicts: metrics.counter(&defs::LOCK_CONFLICTS, &labels),
            handoff: metrics.histogram(&defs::HANDOFF, &labels),
            reconnects: metrics.counter(&defs::RECONNECTS, &[("session", &session)]),
        }
    }

    fn not_leading(&self) {
        self.is_leader.set(0.0);
        self.tenure.set(0.0);
    }

    fn lost(&self, reason: LossReason) {
        self.not_leading();
        self.metrics
            .counter(
                &defs::LOSSES,
                &[("role", self.role.name()), ("reason", reason.as_str())],
            )
            .increment(1);
    }
}

/// Everything one campaign needs.
pub(crate) struct Campaign {
    pub(crate) handle: Arc<RoleHandle>,
    pub(crate) key: LockKey,
    pub(crate) namespace: LockNamespace,
    pub(crate) node_id: NodeId,
    pub(crate) election: LeaderElectionConfig,
    pub(crate) lock_options: PgConnectOptions,
    pub(crate) pool: PgPool,
    pub(crate) tasks: Vec<(String, LeaderTask)>,
    pub(crate) events: broadcast::Receiver<ListenerEvent>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) metrics: Metrics,
}

/// How a lock session ended.
enum SessionEnd {
    /// Shutdown requested and done: stop campaigning.
    Shutdown,
    /// The session broke or leadership was lost: reconnect.
    Broken,
    /// Handed over on an operator's request: campaign again at once (a standby that waited
    /// inside the lock holds it already).
    SteppedDown,
    /// Enough standbys wait inside the lock: wait outside it, as a reserve.
    Reserve,
}

/// How holding a leadership ended.
enum Hold {
    /// The node shuts down: hand over.
    Shutdown,
    /// An operator asked this leader to step down: hand over, keep campaigning.
    StepDown,
    /// Placement asked this leader to hand the role over to another node: hand over to it,
    /// keep campaigning.
    Move(PlacementMove),
    /// Lost, for this reason.
    Lost(LossReason),
}

/// Why a tenure ended: the `reason` label of `forge_leader_losses_total` (every one exported
/// at 0 from the start), the reason of the `leader_lost` event and of the log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LossReason {
    /// Its local deadline passed before a renewal landed.
    Deadline,
    /// A renewal found the lease no longer its own, or a newer epoch was announced.
    Deposed,
    /// A renewal failed (the lock session's error).
    RenewalFailed,
    /// Handed over: the node shuts down.
    Shutdown,
    /// Handed over: an operator asked a step-down.
    StepDown,
    /// Handed over: placement moved the role to another node.
    Rebalance,
}

impl LossReason {
    /// Every reason, as exported at 0.
    pub(crate) const ALL: [LossReason; 6] = [
        LossReason::Deadline,
        LossReason::Deposed,
        LossReason::RenewalFailed,
        LossReason::Shutdown,
        LossReason::StepDown,
        LossReason::Rebalance,
    ];

    /// The reason as metrics, events and logs name it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LossReason::Deadline => "deadline",
            LossReason::Deposed => "deposed",
            LossReason::RenewalFailed => "renewal_failed",
            LossReason::Shutdown => "shutdown",
            LossReason::StepDown => "step_down",
            LossReason::Rebalance => "rebalance",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of `forge.campaign(...)`.
struct CampaignRow {
    acquired: bool,
    epoch: Option<i64>,
    tenure: Option<i64>,
    leader_node: Option<String>,
    leader_since: Option<DateTime<Utc>>,
    released: Option<bool>,
    failover: bool,
    my_pid: i32,
    holder_pid: Option<i32>,
    holder_application: Option<String>,
    fenced_pid: Option<i32>,
    /// Not granted, and not waiting: enough standbys wait inside the lock.
    reserve: bool,
}

impl CampaignRow {
    fn from_row(row: &PgRow) -> Result<CampaignRow, sqlx::Error> {
        Ok(CampaignRow {
            acquired: row.try_get("acquired")?,
            epoch: row.try_get("epoch")?,
            tenure: row.try_get("tenure")?,
            leader_node: row.try_get("leader_node")?,
            leader_since: row.try_get("leader_since")?,
            released: row.try_get("released")?,
            failover: row.try_get::<Option<bool>, _>("failover")?.unwrap_or(false),
            my_pid: row.try_get("my_pid")?,
            holder_pid: row.try_get("holder_pid")?,
            holder_application: row.try_get("holder_application")?,
            fenced_pid: row.try_get("fenced_pid")?,
            reserve: row.try_get("reserve")?,
        })
    }
}

/// The arguments of `forge.campaign`, owned so the call can outlive a borrow of the campaign.
struct CallArgs {
    namespace: LockNamespace,
    role: Role,
    key: LockKey,
    node: NodeId,
    lease_ms: i64,
    standbys: i32,
}

/// Calls `forge.campaign` once.
async fn campaign_call(
    conn: &mut PgConnection,
    args: &CallArgs,
    wait: bool,
) -> Result<CampaignRow, sqlx::Error> {
    let row = sqlx::query("SELECT * FROM forge.campaign($1, $2, $3, $4, $5, $6, $7)")
        .bind(&args.namespace)
        .bind(&args.role)
        .bind(args.key.0)
        .bind(&args.node)
        .bind(args.lease_ms)
        .bind(wait)
        .bind(args.standbys)
        .fetch_one(&mut *conn)
        .await?;
    CampaignRow::from_row(&row)
}

/// The `application_name` of a lock session; other nodes use its prefix to tell FORGE
/// sessions from foreign holders of a key.
pub(crate) fn lock_application_name(role: &Role, node: &NodeId) -> String {
    format!("forge:{}:{}", role.name(), node)
}

impl Campaign {
    fn role(&self) -> &Role {
        &self.handle.role
    }

    /// Publishes a new state. Transitions into leadership, losses, conflicts and connection
    /// errors are logged where they happen; the follower's view of the leader is logged here.
    fn set_state(&self, state: RoleState) {
        let changed = self.handle.state.send_if_modified(|current| {
            if *current == state {
                false
            } else {
                *current = state.clone();
                true
            }
        });
        if changed && let RoleState::Follower { leader } = &state {
            match leader {
                // The lock is held by a session of this node's id that is not this campaign's
                // (a previous incarnation's, about to end): not a leader to follow.
                Some(leader) if leader.node_id == self.node_id.as_str() => {
                    info!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = leader.epoch.0,
                          "waiting for the lock: a previous session of this node still holds it")
                }
                Some(leader) => {
                    info!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                                      leader = %leader.node_id, epoch = leader.epoch.0, "following")
                }
                None => info!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                              "waiting for the lock: no current leader"),
            }
        }
    }

    /// Runs until shutdown: connect, follow, lead, reconnect.
    pub(crate) async fn run(mut self) {
        let metrics = RoleMetrics::new(&self.metrics, self.role());
        metrics.not_leading();
        let mut backoff = Backoff::new(self.election.check_interval);
        loop {
            if self.shutdown.is_cancelled() {
                break;
            }
            let connected = tokio::select! {
                conn = self.open_session() => conn,
                _ = self.shutdown.cancelled() => break,
            };
            match connected {
                Ok(conn) => {
                    backoff.reset();
                    match self.session(conn, &metrics).await {
                        SessionEnd::Shutdown => break,
                        SessionEnd::Broken => metrics.reconnects.increment(1),
                        SessionEnd::Reserve => {
                            if !self.wait_as_reserve(&metrics).await {
                                break;
                            }
                            continue;
                        }
                        SessionEnd::SteppedDown => {
                            // The release granted the lock to the first standby waiting inside
                            // it (a step-down is refused without one, unless forced): wait
                            // again as a standby at once, behind it. Forced with none waiting,
                            // this node most likely leads again within milliseconds.
                            backoff.reset();
                            continue;
                        }
                    }
                }
                Err(err) => {
                    let message = err.to_string();
                    if matches!(err, Error::TransactionPooler { .. }) {
                        error!(target: "forge::leader", role = %self.role(), node = %self.node_id, error = %message, "refusing to campaign");
                    } else {
                        warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, error = %message, "lock session unavailable; retrying");
                    }
                    self.set_state(RoleState::Connecting {
                        last_error: Some(message),
                    });
                }
            }
            let delay = backoff.next();
            tokio::select! {
                _ = sleep(delay) => {}
                _ = self.shutdown.cancelled() => break,
            }
        }
        self.set_state(RoleState::Stopped);
        debug!(target: "forge::leader", role = %self.role(), node = %self.node_id, "campaign stopped");
    }

    /// Waits outside the lock until the node session's heartbeat finds the role short of
    /// standbys, or the node session comes back after an outage. While the node session is
    /// down (nobody checks), it campaigns again every `lock_timeout`. Keeps the follower's
    /// view of the leader current. False on shutdown.
    async fn wait_as_reserve(&mut self, metrics: &RoleMetrics) -> bool {
        self.handle.reserve.store(true, Ordering::Relaxed);
        debug!(target: "forge::leader", role = %self.role(), node = %self.node_id,
               standbys = self.election.standbys, "enough standbys wait inside the lock; waiting outside it");
        let mut deaf_until: Option<Instant> = None;
        let woken = loop {
            tokio::select! {
                _ = self.handle.wake.notified() => break true,
                _ = async { sleep_until(deaf_until.expect("guarded")).await }, if deaf_until.is_some() => break true,
                _ = self.shutdown.cancelled() => break false,
                event = self.events.recv() => match event {
                    Ok(ListenerEvent::Restored) => break true,
                    Ok(ListenerEvent::Lost) => {
                        deaf_until.get_or_insert_with(|| Instant::now() + self.election.lock_timeout);
                    }
                    event => self.follower_event(event, metrics),
                },
            }
        };
        self.handle.reserve.store(false, Ordering::Relaxed);
        woken
    }

    async fn open_session(&self) -> Result<(PgConnection, i32)> {
        let bound = self.election.check_interval.max(Duration::from_secs(2));
        let mut conn = db::connect_once(&self.lock_options, bound).await?;
        timeout(bound, db::setup_lock_session(&mut conn, &self.election))
            .await
            .map_err(|_| Error::Database(sqlx::Error::PoolTimedOut))??;
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await?;
        Ok((conn, pid))
    }

    fn call_args(&self) -> CallArgs {
        CallArgs {
            namespace: self.namespace.clone(),
            role: self.role().clone(),
            key: self.key,
            node: self.node_id.clone(),
            lease_ms: self.election.lease_duration.as_millis() as i64,
            standbys: self.election.standbys.min(i32::MAX as u32) as i32,
        }
    }

    /// Follows and leads on one lock session until it breaks or the node shuts down.
    async fn session(
        &mut self,
        (conn, session_pid): (PgConnection, i32),
        metrics: &RoleMetrics,
    ) -> SessionEnd {
        let mut wait = false;
        // The wait returns after lock_timeout at the latest; a much longer silence means the
        // server or the network is gone.
        let call_bound = self.election.lock_timeout + Duration::from_secs(5);
        let mut idle_conn = Some(conn);
        loop {
            let Some(mut conn) = idle_conn.take() else {
                return SessionEnd::Broken;
            };
            let sent_at = Instant::now();
            let args = self.call_args();
            // The call owns the connection and hands it back, so that a shutdown can cancel
            // the wait and still use the session afterwards.
            let call = timeout(call_bound, async move {
                let result = campaign_call(&mut conn, &args, wait).await;
                (conn, result)
            });
            tokio::pin!(call);
            let outcome = loop {
                tokio::select! {
                    result = &mut call => break result,
                    event = self.events.recv() => self.follower_event(event, metrics),
                    _ = self.shutdown.cancelled() => {
                        return self.stop_waiting(call.as_mut(), session_pid).await;
                    }
                }
            };
            wait = true;
            let (conn, row) = match outcome {
                Ok((conn, Ok(row))) => (conn, row),
                Ok((conn, Err(err))) => {
                    self.session_broken(&err.to_string());
                    close(conn).await;
                    return SessionEnd::Broken;
                }
                Err(_) => {
                    self.session_broken("the lock wait did not return in time");
                    return SessionEnd::Broken;
                }
            };
            if row.my_pid != session_pid {
                let err = Error::TransactionPooler {
                    evidence: format!(
                        "the lock session's backend changed from pid {session_pid} to {}",
                        row.my_pid
                    ),
                };
                error!(target: "forge::leader", role = %self.role(), node = %self.node_id, error = %err, "refusing to lead");
                self.set_state(RoleState::Connecting {
                    last_error: Some(err.to_string()),
                });
                drop(conn);
                return SessionEnd::Broken;
            }
            if row.acquired {
                return self.lead(conn, row, sent_at, metrics).await;
            }
            self.observe_follower(&row, metrics);
            if row.reserve {
                close(conn).await;
                return SessionEnd::Reserve;
            }
            idle_conn = Some(conn);
        }
    }

    fn session_broken(&self, why: &str) {
        warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, error = %why, "lock session lost; reconnecting");
        self.set_state(RoleState::Connecting {
            last_error: Some(why.to_owned()),
        });
    }

    /// Shutdown while waiting for the lock: cancel the wait on the server (so that no orphaned
    /// wait can be granted the lock after this node is gone), then close.
    async fn stop_waiting<F>(&self, call: Pin<&mut F>, pid: i32) -> SessionEnd
    where
        F: Future<Output = Result<(PgConnection, Result<CampaignRow, sqlx::Error>), Elapsed>>,
    {
        let cancelled = timeout(
            Duration::from_secs(2),
            sqlx::query("SELECT pg_cancel_backend($1)")
                .bind(pid)
                .execute(&self.pool),
        )
        .await;
        if !matches!(cancelled, Ok(Ok(_))) {
            // Dropping the call drops the socket; the backend ends its wait within
            // client_connection_check_interval.
            return SessionEnd::Shutdown;
        }
        // The call now returns: with "canceling statement" normally, or with the lock if it was
        // granted just before the cancel arrived - then hand it straight back.
        if let Ok(Ok((mut conn, result))) = timeout(Duration::from_secs(2), call).await {
            if let Ok(row) = result
                && row.acquired
                && let (Some(epoch), Some(tenure)) = (row.epoch, row.tenure)
            {
                let _ = self.release(&mut conn, Epoch(epoch), tenure, None).await;
            }
            close(conn).await;
        }
        SessionEnd::Shutdown
    }

    fn hear(&self, event: Result<ListenerEvent, broadcast::error::RecvError>) -> Heard {
        match event {
            Ok(ListenerEvent::Notification { channel, payload }) if &*channel == LEADER_CHANNEL => {
                match serde_json::from_str::<LeaderNotice>(&payload) {
                    Ok(notice)
                        if notice.namespace == self.namespace.name()
                            && notice.role == self.role().name() =>
                    {
                        Heard::Notice(notice)
                    }
                    _ => Heard::Nothing,
                }
            }
            Ok(ListenerEvent::Lost) | Err(broadcast::error::RecvError::Lagged(_)) => Heard::Verify,
            _ => Heard::Nothing,
        }
    }

    fn follower_event(
        &self,
        event: Result<ListenerEvent, broadcast::error::RecvError>,
        metrics: &RoleMetrics,
    ) {
        if let Heard::Notice(notice) = self.hear(event)
            && notice.event != STEP_DOWN
            // This node's own election, heard on its node session before the campaign call's
            // reply on the lock session says so: not a leader to follow.
            && !(notice.event == "elected" && notice.node.as_deref() == Some(self.node_id.as_str()))
        {
            let leader = (notice.event == "elected")
                .then_some(notice.node)
                .flatten()
                .map(|node_id| LeaderInfo {
                    node_id,
                    epoch: Epoch(notice.epoch),
                });
            self.set_state(RoleState::Follower { leader });
            metrics.epoch.set(notice.epoch as f64);
        }
    }

    fn observe_follower(&self, row: &CampaignRow, metrics: &RoleMetrics) {
        if let Some(fenced) = row.fenced_pid {
            warn!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                  epoch = row.epoch, leader = row.leader_node.as_deref().unwrap_or("?"), pid = fenced,
                  "terminated the session of a leader whose lease had expired");
        }
        if let Some(err) = self.foreign_holder(row) {
            error!(target: "forge::leader", role = %self.role(), node = %self.node_id, error = %err, "cannot campaign");
            metrics.lock_conflicts.increment(1);
            self.set_state(RoleState::Conflict {
                message: err.to_string(),
            });
            return;
        }
        let leader = match (row.epoch, &row.leader_node, row.released) {
            (Some(epoch), Some(node), Some(false)) if row.holder_pid.is_some() => {
                Some(LeaderInfo {
                    node_id: node.clone(),
                    epoch: Epoch(epoch),
                })
            }
            _ => None,
        };
        if let Some(epoch) = row.epoch {
            metrics.epoch.set(epoch as f64);
        }
        self.set_state(RoleState::Follower { leader });
    }

    /// The error to report when the key is held by something other than this role's nodes.
    fn foreign_holder(&self, row: &CampaignRow) -> Option<Error> {
        let (pid, application) = (row.holder_pid?, row.holder_application.as_ref()?);
        if application.starts_with(&format!("forge:{}:", self.role())) {
            return None;
        }
        Some(
            match application
                .strip_prefix("forge:")
                .and_then(|rest| rest.split(':').next())
            {
                Some(other) => Error::DuplicateLockKey {
                    first: self.role().name().to_owned(),
                    second: other.to_owned(),
                    key: self.key.0,
                },
                None => Error::LockKeyConflict {
                    role: self.role().name().to_owned(),
                    key: self.key.0,
                    pid,
                    application: application.clone(),
                },
            },
        )
    }

    /// Leads until the leadership is lost or handed over.
    async fn lead(
        &mut self,
        mut conn: PgConnection,
        row: CampaignRow,
        sent_at: Instant,
        metrics: &RoleMetrics,
    ) -> SessionEnd {
        let epoch = Epoch(row.epoch.unwrap_or_default());
        let sent_at = match self.confirm_fresh_lease(&mut conn, &row, sent_at).await {
            Ok(sent_at) => sent_at,
            Err(why) => {
                self.session_broken(&why);
                close(conn).await;
                return SessionEnd::Broken;
            }
        };
        let session: SharedSession = Arc::new(tokio::sync::Mutex::new(Some(conn)));
        let leadership = self.begin_tenure(&row, sent_at, metrics, session.clone());
        // What only this tenure exported (a leader's figures) goes with it.
        let tenure_metrics = leadership.metrics().clone();
        let mut tasks = self.start_tasks(&leadership);
        let end = match self.hold(&session, &leadership, metrics).await {
            Hold::Shutdown => {
                self.hand_over(&session, leadership, tasks, metrics, None)
                    .await
            }
            Hold::StepDown => {
                self.hand_over(&session, leadership, tasks, metrics, Some(None))
                    .await;
                SessionEnd::SteppedDown
            }
            Hold::Move(to) => {
                self.hand_over(&session, leadership, tasks, metrics, Some(Some(to)))
                    .await;
                SessionEnd::SteppedDown
            }
            Hold::Lost(reason) => {
                // Stop leader-only work before anything else.
                leadership.tenure().lost.cancel();
                self.handle.set_current(None);
                metrics.lost(reason);
                warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0, reason = reason.as_str(), "lost leadership");
                self.set_state(RoleState::Connecting {
                    last_error: Some(format!("lost leadership of epoch {epoch}: {reason}")),
                });
                stop_tasks(&mut tasks).await;
                self.record_loss(epoch, leadership.tenure_id(), reason);
                // Closing the session releases the lock if this node still holds it.
                match take_session(&session).await {
                    Some(conn) if reason != LossReason::Deadline => close(conn).await,
                    _ => {}
                }
                SessionEnd::Broken
            }
        };
        tenure_metrics.close_scope();
        end
    }

    /// Records `leader_lost` in the events history, in the background and best effort (the
    /// database may be what took the leadership away; the successor's `leader_elected` with
    /// `failover` tells the same story from the other side).
    fn record_loss(&self, epoch: Epoch, tenure: i64, reason: LossReason) {
        let pool = self.pool.clone();
        let (namespace, role, node) = (
            self.namespace.clone(),
            self.role().clone(),
            self.node_id.clone(),
        );
        tokio::spawn(async move {
            let recorded = timeout(
                Duration::from_secs(30),
                sqlx::query("SELECT forge.leader_lost($1, $2, $3, $4, $5, $6)")
                    .bind(&namespace)
                    .bind(&role)
                    .bind(&node)
                    .bind(epoch)
                    .bind(tenure)
                    .bind(reason.as_str())
                    .execute(&pool),
            )
            .await;
            if !matches!(recorded, Ok(Ok(_))) {
                debug!(target: "forge::leader", role = %role, epoch = epoch.0, "could not record the lost leadership in the events history");
            }
        });
    }

    /// Trust is measured from when the campaign call was sent, and the call may have waited in
    /// the lock for up to lock_timeout. If that leaves less than one refresh interval of trust,
    /// confirm the lease first (one round trip) rather than start work on a leadership about
    /// to expire locally. Returns the send time trust is measured from.
    async fn confirm_fresh_lease(
        &self,
        conn: &mut PgConnection,
        row: &CampaignRow,
        sent_at: Instant,
    ) -> std::result::Result<Instant, String> {
        let lease = self.election.lease_duration;
        let margin = self.election.safety_margin();
        if Instant::now() + self.election.refresh_interval < sent_at + lease - margin {
            return Ok(sent_at);
        }
        let epoch = Epoch(row.epoch.unwrap_or_default());
        let tenure = row.tenure.unwrap_or_default();
        let send = Instant::now();
        match timeout(lease - margin, self.renew(conn, epoch, tenure)).await {
            Ok(Ok(true)) => Ok(send),
            Ok(Err(err)) => Err(err.to_string()),
            _ => Err("the new lease could not be confirmed".to_owned()),
        }
    }

    /// Records the new tenure: its [`Leadership`], metrics, log line and state.
    fn begin_tenure(
        &self,
        row: &CampaignRow,
        sent_at: Instant,
        metrics: &RoleMetrics,
        session: SharedSession,
    ) -> Leadership {
        let epoch = Epoch(row.epoch.unwrap_or_default());
        let since = row.leader_since.unwrap_or_else(Utc::now);
        let lease = self.election.lease_duration;
        // The server's idle timer can only have started after the call was sent.
        let deadline = sent_at + lease - self.election.safety_margin();
        let leadership = Leadership::new(Tenure::new(
            TenureParts {
                role: self.role().clone(),
                namespace: self.namespace.clone(),
                node_id: self.node_id.clone(),
                epoch,
                id: row.tenure.unwrap_or_default(),
                acquired_at: since,
                lease,
                pool: self.pool.clone(),
                metrics: self.metrics.scoped(),
            },
            session,
            deadline,
        ));
        metrics.is_leader.set(1.0);
        metrics.epoch.set(epoch.0 as f64);
        metrics.elections.increment(1);
        if row.failover {
            metrics.failovers.increment(1);
        }
        info!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0,
              failover = row.failover, "became leader");
        self.handle.set_current(Some(leadership.clone()));
        self.set_state(RoleState::Leader { epoch, since });
        leadership
    }

    /// Renews the lease until the node shuts down or the leadership is lost.
    async fn hold(
        &mut self,
        session: &SharedSession,
        leadership: &Leadership,
        metrics: &RoleMetrics,
    ) -> Hold {
        let refresh = self.election.refresh_interval;
        let acquired = Instant::now();
        let mut last_sent = leadership.tenure().deadline() + self.election.safety_margin()
            - self.election.lease_duration;
        // Placement moves asked of an earlier tenure are not this one's.
        let mut moves = self.handle.moves.subscribe();
        moves.borrow_and_update();
        loop {
            let deadline = leadership.tenure().deadline();
            tokio::select! {
                biased;
                _ = sleep_until(deadline) => return Hold::Lost(LossReason::Deadline),
                _ = self.shutdown.cancelled() => return Hold::Shutdown,
                event = self.events.recv() => match self.hear(event) {
                    Heard::Notice(notice) if notice.epoch > leadership.epoch().0 => {
                        return Hold::Lost(LossReason::Deposed);
                    }
                    Heard::Notice(notice)
                        if notice.event == STEP_DOWN && notice.epoch == leadership.epoch().0 =>
                    {
                        info!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                              epoch = notice.epoch, "asked to step down; handing over");
                        return Hold::StepDown;
                    }
                    // Verify now rather than at the next renewal.
                    Heard::Verify => last_sent = Instant::now() - refresh,
                    _ => {}
                },
                Ok(()) = moves.changed() => {
                    if let Some(to) = moves.borrow_and_update().clone() {
                        info!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                              epoch = leadership.epoch().0, to = %to.to, why = %to.why,
                              "handing the role over to spread leadership");
                        return Hold::Move(to);
                    }
                }
                _ = sleep_until(last_sent + refresh) => {
                    match self.renew_lease(session, leadership).await {
                        Ok(sent) => {
                            last_sent = sent;
                            metrics.tenure.set(acquired.elapsed().as_secs_f64());
                        }
                        Err(reason) => return Hold::Lost(reason),
                    }
                }
            }
        }
    }

    /// One renewal on the lock session (after the duty statement running on it, if any),
    /// bounded by the local deadline; extends the deadline on success and returns when the
    /// renewal was sent.
    async fn renew_lease(
        &self,
        session: &SharedSession,
        leadership: &Leadership,
    ) -> std::result::Result<Instant, LossReason> {
        let deadline = leadership.tenure().deadline();
        let renewal = async {
            let mut conn = session.lock().await;
            let send = Instant::now();
            let renewed = match conn.as_mut() {
                Some(conn) => {
                    self.renew(conn, leadership.epoch(), leadership.tenure_id())
                        .await
                }
                None => Ok(false),
            };
            renewed.map(|renewed| (renewed, send))
        };
        match timeout_at(deadline, renewal).await {
            Ok(Ok((true, send))) => {
                leadership
                    .tenure()
                    .extend_to(send + self.election.lease_duration - self.election.safety_margin());
                Ok(send)
            }
            Ok(Ok((false, _))) => Err(LossReason::Deposed),
            Ok(Err(err)) => {
                warn!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                      epoch = leadership.epoch().0, error = %err, "lease renewal failed");
                Err(LossReason::RenewalFailed)
            }
            Err(_) => Err(LossReason::Deadline),
        }
    }

    async fn renew(
        &self,
        conn: &mut PgConnection,
        epoch: Epoch,
        tenure: i64,
    ) -> Result<bool, sqlx::Error> {
        let renewed = sqlx::query(
            "UPDATE forge.leaders
                SET renewed_at = clock_timestamp(),
                    lease_until = clock_timestamp() + make_interval(secs => $5 / 1000.0)
              WHERE namespace = $1 AND role = $2 AND epoch = $3 AND tenure = $4
                AND backend_pid = pg_backend_pid()",
        )
        .bind(&self.namespace)
        .bind(self.role())
        .bind(epoch)
        .bind(tenure)
        .bind(self.election.lease_duration.as_millis() as i64)
        .execute(&mut *conn)
        .await?;
        Ok(renewed.rows_affected() == 1)
    }

    async fn release(
        &self,
        conn: &mut PgConnection,
        epoch: Epoch,
        tenure: i64,
        to: Option<&PlacementMove>,
    ) -> Result<bool, sqlx::Error> {
        // The named node is a standby waiting inside the lock: the lock reaches it in
        // milliseconds; past the window any waiter may take it (the node may have died).
        let window = self.election.lock_timeout.as_millis() as i64;
        sqlx::query_scalar("SELECT forge.release($1, $2, $3, $4, $5, $6, $7, $8)")
            .bind(&self.namespace)
            .bind(self.role())
            .bind(self.key.0)
            .bind(epoch)
            .bind(tenure)
            .bind(to.map(|m| m.to.as_str()))
            .bind(to.map(|m| m.why.as_str()))
            .bind(window)
            .fetch_one(&mut *conn)
            .await
    }

    fn start_tasks(&self, leadership: &Leadership) -> JoinSet<()> {
        let mut set = JoinSet::new();
        for (name, task) in &self.tasks {
            let work = task(leadership.clone());
            let leadership = leadership.clone();
            let name = name.clone();
            set.spawn(async move {
                if leadership.run(work).await.is_none() {
                    debug!(target: "forge::leader", role = %leadership.role(), task = %name, "leader task cancelled");
                }
            });
        }
        set
    }

    /// Graceful handoff: stop new work, drain up to `drain_timeout` while still renewing the
    /// lease (so no other node can lead while the old work runs), release, close. `asked`:
    /// `None` at shutdown; `Some(None)` on a step-down; `Some(Some(move))` for a placement move,
    /// whose node the release names.
    async fn hand_over(
        &mut self,
        session: &SharedSession,
        leadership: Leadership,
        mut tasks: JoinSet<()>,
        metrics: &RoleMetrics,
        asked: Option<Option<PlacementMove>>,
    ) -> SessionEnd {
        let (reason, to) = match asked {
            None => (LossReason::Shutdown, None),
            Some(None) => (LossReason::StepDown, None),
            Some(Some(to)) => (LossReason::Rebalance, Some(to)),
        };
        let started = Instant::now();
        let epoch = leadership.epoch();
        leadership.tenure().draining.cancel();
        let drained = self.drain(session, &leadership, &mut tasks).await;
        if let Err(why) = drained {
            warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0,
                  drain_timeout = ?self.election.drain_timeout, why, "leader-only work did not finish; cancelling it");
        }
        leadership.tenure().lost.cancel();
        stop_tasks(&mut tasks).await;
        self.handle.set_current(None);
        let Some(mut conn) = take_session(session).await else {
            metrics.lost(reason);
            warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0,
                  "the lock session was still in use at handoff; closing it without a release");
            return SessionEnd::Shutdown;
        };
        let released = if leadership.deadline_passed() {
            Ok(Ok(false))
        } else {
            timeout(
                Duration::from_secs(5),
                self.release(&mut conn, epoch, leadership.tenure_id(), to.as_ref()),
            )
            .await
        };
        metrics.lost(reason);
        metrics.handoff.record(started.elapsed().as_secs_f64());
        match released {
            Ok(Ok(true)) => {
                info!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0,
                                  drain_ms = started.elapsed().as_millis() as u64, "handed over leadership")
            }
            other => {
                warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0,
                           outcome = ?other.map(|r| r.map_err(|e| e.to_string())), "leadership was already gone at handoff")
            }
        }
        close(conn).await;
        SessionEnd::Shutdown
    }

    /// Waits for the leader tasks to finish, for at most `drain_timeout`, renewing the lease
    /// meanwhile. Fails (with why) at the bound, or when the lease cannot be kept: then the
    /// work must stop at once, since another node may take over.
    async fn drain(
        &mut self,
        session: &SharedSession,
        leadership: &Leadership,
        tasks: &mut JoinSet<()>,
    ) -> std::result::Result<(), &'static str> {
        let bound = Instant::now() + self.election.drain_timeout;
        let refresh = self.election.refresh_interval;
        let mut next_renewal = Instant::now() + refresh;
        loop {
            tokio::select! {
                biased;
                joined = tasks.join_next() => if joined.is_none() { return Ok(()) },
                _ = sleep_until(bound) => return Err("drain_timeout reached"),
                // As while holding: a newer leadership (the session was ended, or a promoted
                // standby elected another) means the old work must stop at once.
                event = self.events.recv() => match self.hear(event) {
                    Heard::Notice(notice) if notice.epoch > leadership.epoch().0 => {
                        return Err("a newer leadership was announced while draining");
                    }
                    Heard::Verify => next_renewal = Instant::now(),
                    _ => {}
                },
                _ = sleep_until(next_renewal) => {
                    if self.renew_lease(session, leadership).await.is_err() {
                        return Err("the lease could not be renewed while draining");
                    }
                    next_renewal = Instant::now() + refresh;
                }
            }
        }
    }
}

/// Aborts leader tasks and waits until they are gone, so that a new tenure of this node can
/// never overlap the old one.
async fn stop_tasks(tasks: &mut JoinSet<()>) {
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

/// Takes the lock session back from the tenure at its end (its leader tasks are stopped, so
/// no duty holds it). `None` if it is gone, or still held after a while (a
/// [`LeaderSession`](crate::LeaderSession) kept outside the leader tasks): the connection is
/// then dropped with the last reference to it.
async fn take_session(session: &SharedSession) -> Option<PgConnection> {
    match timeout(Duration::from_secs(2), session.lock()).await {
        Ok(mut conn) => conn.take(),
        Err(_) => None,
    }
}

/// Closes a connection politely, but never waits long for a dead peer.
async fn close(conn: PgConnection) {
    let _ = timeout(Duration::from_secs(1), conn.close()).await;
}

#[cfg(test)]
mod tests {
    use super::LossReason;

    /// The reasons are metric labels, event fields and log values: their strings are a contract.
    #[test]
    fn loss_reasons_keep_their_strings() {
        let names: Vec<&str> = LossReason::ALL
            .iter()
            .map(|reason| reason.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "deadline",
                "deposed",
                "renewal_failed",
                "shutdown",
                "step_down",
                "rebalance"
            ]
        );
        assert_eq!(LossReason::StepDown.to_string(), "step_down");
    }
}
