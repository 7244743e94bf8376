//! The campaign for one role on one node: the state machine described in ARCHITECTURE.md.
//!
//! ```text
//!            connect ok                 granted (epoch bumped)
//! Connecting ─────────► Follower ─────────────────────────► Leader
//!     ▲                   │  ▲ wait timed out: report         │
//!     │  session error    │  └─ holder, fence expired holder  │ renewal error / 0 rows /
//!     └───────────────────┴───────────────────────────────────┘ deadline / newer epoch seen
//!                                                  shutdown: drain, release, close → Stopped
//! ```
//!
//! One task owns the role's dedicated lock session and is the only writer of the role's
//! state. Any error on that session ends the tenure at once (tasks cancelled first) and the
//! session is closed, which releases the lock.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPool, PgRow};
use sqlx::{Connection, PgConnection, Row};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinSet;
use tokio::time::error::Elapsed;
use tokio::time::{Instant, sleep, sleep_until, timeout, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::LeaderElectionConfig;
use crate::db;
use crate::error::{Error, Result};
use crate::leadership::{Leadership, Tenure};
use crate::metrics::Metrics;
use crate::node::{LEADER_CHANNEL, ListenerEvent};
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

/// A leadership change announced on the `forge_leader` channel.
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

/// Shared between the campaign task and the node's public API.
pub(crate) struct RoleHandle {
    pub(crate) role: Role,
    pub(crate) state: watch::Sender<RoleState>,
    pub(crate) current: Mutex<Option<Leadership>>,
}

impl RoleHandle {
    pub(crate) fn new(role: Role) -> RoleHandle {
        RoleHandle {
            role,
            state: watch::Sender::new(RoleState::Connecting { last_error: None }),
            current: Mutex::new(None),
        }
    }

    fn set_current(&self, leadership: Option<Leadership>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = leadership;
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
}

/// One row of `forge.campaign(...)`.
struct CampaignRow {
    acquired: bool,
    epoch: Option<i64>,
    leader_node: Option<String>,
    leader_since: Option<DateTime<Utc>>,
    released: Option<bool>,
    failover: bool,
    my_pid: i32,
    holder_pid: Option<i32>,
    holder_application: Option<String>,
    fenced_pid: Option<i32>,
}

impl CampaignRow {
    fn from_row(row: &PgRow) -> Result<CampaignRow, sqlx::Error> {
        Ok(CampaignRow {
            acquired: row.try_get("acquired")?,
            epoch: row.try_get("epoch")?,
            leader_node: row.try_get("leader_node")?,
            leader_since: row.try_get("leader_since")?,
            released: row.try_get("released")?,
            failover: row.try_get::<Option<bool>, _>("failover")?.unwrap_or(false),
            my_pid: row.try_get("my_pid")?,
            holder_pid: row.try_get("holder_pid")?,
            holder_application: row.try_get("holder_application")?,
            fenced_pid: row.try_get("fenced_pid")?,
        })
    }
}

/// The arguments of `forge.campaign`, owned so the call can outlive a borrow of the campaign.
struct CallArgs {
    namespace: String,
    role: String,
    key: LockKey,
    node: String,
    lease_ms: i64,
}

/// Calls `forge.campaign` once.
async fn campaign_call(
    conn: &mut PgConnection,
    args: &CallArgs,
    wait: bool,
) -> Result<CampaignRow, sqlx::Error> {
    let row = sqlx::query("SELECT * FROM forge.campaign($1, $2, $3, $4, $5, $6)")
        .bind(&args.namespace)
        .bind(&args.role)
        .bind(args.key.0)
        .bind(&args.node)
        .bind(args.lease_ms)
        .bind(wait)
        .fetch_one(&mut *conn)
        .await?;
    CampaignRow::from_row(&row)
}

fn role_label(handle: &RoleHandle) -> [(&'static str, &str); 1] {
    [("role", handle.role.name())]
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
                Some(leader) => {
                    info!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                                      leader = %leader.node_id, epoch = leader.epoch.0, "following")
                }
                None => info!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                              "waiting for the lock: no current leader"),
            }
        }
    }

    fn label(&self) -> [(&'static str, &str); 1] {
        role_label(&self.handle)
    }

    /// Runs until shutdown: connect, follow, lead, reconnect.
    pub(crate) async fn run(mut self) {
        let role_label = self.label();
        self.metrics
            .gauge("forge_leader_is_leader", &role_label)
            .set(0.0);
        self.metrics
            .gauge("forge_leader_tenure_seconds", &role_label)
            .set(0.0);
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
                    match self.session(conn).await {
                        SessionEnd::Shutdown => break,
                        SessionEnd::Broken => {
                            self.metrics
                                .counter(
                                    "forge_db_reconnects_total",
                                    &[("session", &format!("lock:{}", self.role()))],
                                )
                                .increment(1);
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

    fn call_args(&self) -> CallArgs {
        CallArgs {
            namespace: self.namespace.name().to_owned(),
            role: self.role().name().to_owned(),
            key: self.key,
            node: self.node_id.as_str().to_owned(),
            lease_ms: self.election.lease_duration.as_millis() as i64,
        }
    }

    /// Follows and leads on one lock session until it breaks or the node shuts down.
    async fn session(&mut self, (conn, session_pid): (PgConnection, i32)) -> SessionEnd {
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
                    event = self.events.recv() => self.follower_event(event),
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
                return self.lead(conn, row, sent_at).await;
            }
            self.observe_follower(&row);
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
                && let Some(epoch) = row.epoch
            {
                let _ = self.release(&mut conn, Epoch(epoch)).await;
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

    fn follower_event(&self, event: Result<ListenerEvent, broadcast::error::RecvError>) {
        if let Heard::Notice(notice) = self.hear(event) {
            let leader = (notice.event == "elected")
                .then_some(notice.node)
                .flatten()
                .map(|node_id| LeaderInfo {
                    node_id,
                    epoch: Epoch(notice.epoch),
                });
            self.set_state(RoleState::Follower { leader });
            self.metrics
                .gauge("forge_leader_epoch", &self.label())
                .set(notice.epoch as f64);
        }
    }

    fn observe_follower(&self, row: &CampaignRow) {
        if let Some(fenced) = row.fenced_pid {
            warn!(target: "forge::leader", role = %self.role(), node = %self.node_id,
                  epoch = row.epoch, leader = row.leader_node.as_deref().unwrap_or("?"), pid = fenced,
                  "terminated the session of a leader whose lease had expired");
        }
        if let (Some(pid), Some(application)) = (row.holder_pid, &row.holder_application) {
            let forge_prefix = format!("forge:{}:", self.role());
            if !application.starts_with(&forge_prefix) {
                let err = if let Some(other) = application
                    .strip_prefix("forge:")
                    .and_then(|rest| rest.split(':').next())
                {
                    Error::DuplicateLockKey {
                        first: self.role().name().to_owned(),
                        second: other.to_owned(),
                        key: self.key.0,
                    }
                } else {
                    Error::LockKeyConflict {
                        role: self.role().name().to_owned(),
                        key: self.key.0,
                        pid,
                        application: application.clone(),
                    }
                };
                error!(target: "forge::leader", role = %self.role(), node = %self.node_id, error = %err, "cannot campaign");
                self.metrics
                    .counter("forge_leader_lock_conflicts_total", &self.label())
                    .increment(1);
                self.set_state(RoleState::Conflict {
                    message: err.to_string(),
                });
                return;
            }
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
            self.metrics
                .gauge("forge_leader_epoch", &self.label())
                .set(epoch as f64);
        }
        self.set_state(RoleState::Follower { leader });
    }

    /// Leads until the leadership is lost or handed over.
    async fn lead(
        &mut self,
        mut conn: PgConnection,
        row: CampaignRow,
        sent_at: Instant,
    ) -> SessionEnd {
        let epoch = Epoch(row.epoch.unwrap_or_default());
        let lease = self.election.lease_duration;
        let margin = self.election.safety_margin();
        let refresh = self.election.refresh_interval;
        let since = row.leader_since.unwrap_or_else(Utc::now);
        let acquired = Instant::now();
        // Trust is measured from when the campaign call was sent, and the call may have
        // waited in the lock for up to lock_timeout. If that leaves less than one refresh
        // interval of trust, confirm the lease first (one round trip) rather than start work
        // on a leadership about to expire locally.
        let mut sent_at = sent_at;
        if acquired + refresh >= sent_at + lease - margin {
            let send = Instant::now();
            match timeout(lease - margin, self.renew(&mut conn, epoch)).await {
                Ok(Ok(true)) => sent_at = send,
                outcome => {
                    let why = match outcome {
                        Ok(Err(err)) => err.to_string(),
                        _ => "the new lease could not be confirmed".to_owned(),
                    };
                    self.session_broken(&why);
                    close(conn).await;
                    return SessionEnd::Broken;
                }
            }
        }
        // Trust is measured from when the campaign call was sent: the server's idle timer can
        // only have started after that.
        let tenure = Tenure::new(
            self.role().clone(),
            self.namespace.clone(),
            self.node_id.clone(),
            epoch,
            since,
            lease,
            self.pool.clone(),
            self.metrics.clone(),
            sent_at + lease - margin,
        );
        let leadership = Leadership::new(tenure);
        let handle = self.handle.clone();
        let labels = role_label(&handle);
        self.metrics
            .gauge("forge_leader_is_leader", &labels)
            .set(1.0);
        self.metrics
            .gauge("forge_leader_epoch", &labels)
            .set(epoch.0 as f64);
        self.metrics
            .counter("forge_leader_elections_total", &labels)
            .increment(1);
        if row.failover {
            self.metrics
                .counter("forge_leader_failovers_total", &labels)
                .increment(1);
        }
        info!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0,
              failover = row.failover, "became leader");
        self.handle.set_current(Some(leadership.clone()));
        self.set_state(RoleState::Leader { epoch, since });
        let tasks = self.start_tasks(&leadership);

        let mut last_sent = sent_at;
        let reason: &'static str = loop {
            let deadline = leadership.tenure().deadline();
            tokio::select! {
                biased;
                _ = sleep_until(deadline) => break "deadline",
                _ = self.shutdown.cancelled() => {
                    return self.hand_over(conn, leadership, tasks).await;
                }
                event = self.events.recv() => match self.hear(event) {
                    Heard::Notice(notice) if notice.epoch > epoch.0 => break "deposed",
                    // Verify now rather than at the next renewal.
                    Heard::Verify => last_sent = Instant::now() - refresh,
                    _ => {}
                },
                _ = sleep_until(last_sent + refresh) => {
                    let send = Instant::now();
                    match timeout_at(deadline, self.renew(&mut conn, epoch)).await {
                        Ok(Ok(true)) => {
                            leadership.tenure().extend_to(send + lease - margin);
                            last_sent = send;
                            self.metrics
                                .gauge("forge_leader_tenure_seconds", &labels)
                                .set(acquired.elapsed().as_secs_f64());
                        }
                        Ok(Ok(false)) => break "deposed",
                        Ok(Err(err)) => {
                            warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0, error = %err, "lease renewal failed");
                            break "renewal_failed";
                        }
                        Err(_) => break "deadline",
                    }
                }
            }
        };
        // Stop leader-only work before anything else.
        leadership.tenure().lost.cancel();
        self.handle.set_current(None);
        self.metrics
            .gauge("forge_leader_is_leader", &labels)
            .set(0.0);
        self.metrics
            .gauge("forge_leader_tenure_seconds", &labels)
            .set(0.0);
        self.metrics
            .counter(
                "forge_leader_losses_total",
                &[("role", self.role().name()), ("reason", reason)],
            )
            .increment(1);
        warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0, reason, "lost leadership");
        self.set_state(RoleState::Connecting {
            last_error: Some(format!("lost leadership of epoch {epoch}: {reason}")),
        });
        stop_tasks(tasks).await;
        // Closing the session releases the lock if this node still holds it.
        if reason == "deadline" {
            drop(conn);
        } else {
            close(conn).await;
        }
        SessionEnd::Broken
    }

    async fn renew(&self, conn: &mut PgConnection, epoch: Epoch) -> Result<bool, sqlx::Error> {
        let renewed = sqlx::query(
            "UPDATE forge.leaders
                SET renewed_at = clock_timestamp(),
                    lease_until = clock_timestamp() + make_interval(secs => $4 / 1000.0)
              WHERE namespace = $1 AND role = $2 AND epoch = $3 AND backend_pid = pg_backend_pid()",
        )
        .bind(self.namespace.name())
        .bind(self.role().name())
        .bind(epoch.0)
        .bind(self.election.lease_duration.as_millis() as i64)
        .execute(&mut *conn)
        .await?;
        Ok(renewed.rows_affected() == 1)
    }

    async fn release(&self, conn: &mut PgConnection, epoch: Epoch) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar("SELECT forge.release($1, $2, $3, $4)")
            .bind(self.namespace.name())
            .bind(self.role().name())
            .bind(self.key.0)
            .bind(epoch.0)
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

    /// Graceful handoff: stop new work, drain up to `drain_timeout`, release, close.
    async fn hand_over(
        &self,
        mut conn: PgConnection,
        leadership: Leadership,
        mut tasks: JoinSet<()>,
    ) -> SessionEnd {
        let started = Instant::now();
        let epoch = leadership.epoch();
        leadership.tenure().draining.cancel();
        let drained = timeout(self.election.drain_timeout, async {
            while tasks.join_next().await.is_some() {}
        })
        .await
        .is_ok();
        if !drained {
            warn!(target: "forge::leader", role = %self.role(), node = %self.node_id, epoch = epoch.0,
                  drain_timeout = ?self.election.drain_timeout, "leader-only work did not finish in time; cancelling it");
        }
        leadership.tenure().lost.cancel();
        stop_tasks(tasks).await;
        self.handle.set_current(None);
        let released = if leadership.is_deadline_ok() {
            timeout(Duration::from_secs(5), self.release(&mut conn, epoch)).await
        } else {
            Ok(Ok(false))
        };
        let labels = self.label();
        self.metrics
            .gauge("forge_leader_is_leader", &labels)
            .set(0.0);
        self.metrics
            .gauge("forge_leader_tenure_seconds", &labels)
            .set(0.0);
        self.metrics
            .counter(
                "forge_leader_losses_total",
                &[("role", self.role().name()), ("reason", "shutdown")],
            )
            .increment(1);
        self.metrics
            .histogram("forge_leader_handoff_seconds", &labels)
            .record(started.elapsed().as_secs_f64());
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
}

impl Leadership {
    fn is_deadline_ok(&self) -> bool {
        Instant::now() < self.tenure().deadline()
    }
}

/// Aborts leader tasks and waits until they are gone, so that a new tenure of this node can
/// never overlap the old one.
async fn stop_tasks(mut tasks: JoinSet<()>) {
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

/// Closes a connection politely, but never waits long for a dead peer.
async fn close(conn: PgConnection) {
    let _ = timeout(Duration::from_secs(1), conn.close()).await;
}
