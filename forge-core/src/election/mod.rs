//! The campaign for one role on one node: the state machine described in the
//! guide (docs/src/architecture/election.md).
//!
//! ```text
//!            connect ok                 granted (epoch bumped)
//! Connecting ─────────► Follower ─────────────────────────► Leader
//!     ▲                   │  ▲ wait timed out: report holder, │
//!     │  session error    │  └─ end it if silent for a lease  │ renewal error / 0 rows /
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
use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{Connection, PgConnection};
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

mod follower;
mod leader;
mod observed;
mod wire;

pub(crate) use leader::LossReason;
pub(crate) use wire::lock_application_name;
use wire::{CallArgs, CampaignRow, campaign_call};

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
