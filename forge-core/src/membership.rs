//! Membership: each node's one *node session* - a dedicated connection that holds the node's
//! advisory lock (so two live nodes never share an id), LISTENs for the node, and heartbeats
//! the node's row in `forge.nodes`.
//!
//! ```text
//!  start ──► connect ─► lock node key (wait ≤ lease for a previous incarnation; else refuse:
//!            │          duplicate id) ─► LISTEN ─► node_join ─► Running
//!  Running: every heartbeat_interval: node_heartbeat (bounded by a timeout)
//!           ├─ ok            → keep going
//!           ├─ false         → marked down by the scheduler leader (or row replaced): rejoin
//!           └─ error/timeout → Lost: the session may be half-open; drop it, reconnect with
//!                              backoff, re-lock, re-LISTEN, rejoin, Restored
//!  shutdown (after the node's work drained) ─► node_leave ─► close (unlocks)
//! ```
//!
//! The heartbeat runs on this session, never on the pool, so handlers that hold every pool
//! connection cannot starve it; and because it is a round trip on the LISTEN connection, a
//! LISTEN session that died silently (half-open TCP, a middlebox dropping idle flows) is
//! noticed within one heartbeat interval plus its timeout, instead of never.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::{Notify, broadcast, watch};
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::{LeaderElectionConfig, MembershipConfig};
use crate::error::{Error, Result};
use crate::leadership::Leadership;
use crate::metrics::{Metrics, defs};
use crate::role::{LockKey, LockNamespace, NodeId};
use crate::util::Backoff;

/// The notification channel on which leadership changes are announced.
pub(crate) const LEADER_CHANNEL: &str = "forge_leader";

/// The notification channel on which membership changes are announced: payload
/// `<namespace> down <node id>` when the scheduler leader marks a node down, so that work
/// waiting on it (job rescue) need not wait for its next pass.
pub const NODES_CHANNEL: &str = "forge_nodes";

/// What the node session reports to the campaigns and to services.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ListenerEvent {
    /// A `NOTIFY` on one of the channels the node listens to.
    Notification {
        /// The channel.
        channel: Arc<str>,
        /// The payload.
        payload: Arc<str>,
    },
    /// The node session broke (PostgreSQL down or restarting, or the connection went silent):
    /// notifications may be missed until [`ListenerEvent::Restored`]. Work that waits for
    /// notifications polls meanwhile.
    Lost,
    /// The node session is (again) up, or the node rejoined the cluster after being marked
    /// down: re-check whatever notifications would have said.
    Restored,
}

/// What this node tells the cluster about itself (`forge.nodes`).
#[derive(Clone, Debug)]
pub(crate) struct NodeInfo {
    pub(crate) hostname: String,
    pub(crate) pid: i32,
    pub(crate) version: String,
    pub(crate) roles: Vec<String>,
    pub(crate) queues: serde_json::Value,
    pub(crate) admin_url: Option<String>,
}

/// Everything the node session needs.
pub(crate) struct Membership {
    pub(crate) namespace: LockNamespace,
    pub(crate) node_id: NodeId,
    pub(crate) incarnation: i64,
    pub(crate) info: NodeInfo,
    pub(crate) options: PgConnectOptions,
    pub(crate) config: MembershipConfig,
    pub(crate) election: LeaderElectionConfig,
    pub(crate) channels: Vec<String>,
    pub(crate) events: broadcast::Sender<ListenerEvent>,
    /// The roles this node leads right now, for the heartbeat.
    pub(crate) leading: Arc<dyn Fn() -> Vec<String> + Send + Sync>,
    /// The roles this node waits for outside their lock (a reserve), with the signal that
    /// wakes their campaign: the heartbeat checks whether they still have their standbys.
    pub(crate) reserves: Arc<dyn Fn() -> Vec<(LockKey, Arc<Notify>)> + Send + Sync>,
    pub(crate) metrics: Metrics,
    /// The backend (pid, start) of this node's last node session: after a half-open
    /// connection it may live on in the server, holding the node's lock.
    pub(crate) last_session: Mutex<Option<(i32, DateTime<Utc>)>>,
    /// Set when another live node took this node's id while its session was down; the node
    /// must stop (see [`Membership::reopen`]).
    pub(crate) fault: watch::Sender<Option<Fault>>,
    /// The node's work: cancelled on a fault.
    pub(crate) work: CancellationToken,
}

/// Why a node had to stop on its own.
#[derive(Clone, Debug)]
pub(crate) enum Fault {
    /// Another live session holds this node's id (described).
    DuplicateNode(String),
}

impl Fault {
    pub(crate) fn to_error(&self, node_id: &NodeId) -> Error {
        match self {
            Fault::DuplicateNode(holder) => Error::DuplicateNode {
                node_id: node_id.clone(),
                holder: holder.clone(),
            },
        }
    }
}

/// An open node session.
pub(crate) struct Session {
    listener: PgListener,
    // The listener's own one-connection pool; closed with the session.
    pool: PgPool,
}

/// How an attempt to open the node session failed.
enum OpenError {
    /// Another live session holds this node's id.
    Duplicate(Error),
    /// Anything else (unreachable, restarting): retry.
    Other(Error),
}

impl Membership {
    fn lock_key(&self) -> LockKey {
        LockKey::for_node(&self.namespace, &self.node_id)
    }

    /// The first join, at start: connects, takes the node's lock - waiting up to the lease for
    /// a previous incarnation's session to end (a killed process, a vanished host) - LISTENs
    /// and registers. Fails when another live node has this id.
    pub(crate) async fn join(&self) -> Result<Session> {
        let patience = self.election.lease_duration + Duration::from_secs(2);
        match self.open(patience).await {
            Ok(session) => Ok(session),
            Err(OpenError::Duplicate(err) | OpenError::Other(err)) => Err(err),
        }
    }

    /// Connects, locks, listens and joins, waiting at most `lock_wait` for the node lock.
    async fn open(&self, lock_wait: Duration) -> std::result::Result<Session, OpenError> {
        let bound = self.election.check_interval.max(Duration::from_secs(2)) + lock_wait;
        let opened = timeout(bound, self.open_unbounded(lock_wait)).await;
        opened.unwrap_or_else(|_| {
            Err(OpenError::Other(Error::Connect {
                message: "opening the node session timed out".into(),
                source: sqlx::Error::PoolTimedOut,
            }))
        })
    }

    async fn open_unbounded(&self, lock_wait: Duration) -> std::result::Result<Session, OpenError> {
        let other = OpenError::Other;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(self.election.check_interval.max(Duration::from_secs(2)))
            .connect_lazy_with(self.options.clone());
        let mut listener = PgListener::connect_with(&pool)
            .await
            .map_err(|err| other(err.into()))?;
        listener.eager_reconnect(false);
        listener.ignore_pool_close_event(true);
        let settings =
            crate::db::node_session_settings(&self.election, lock_wait, self.config.down_after);
        sqlx::raw_sql(AssertSqlSafe(settings))
            .execute(&mut listener)
            .await
            .map_err(|err| other(err.into()))?;
        self.end_previous_session(&mut listener).await;
        let locked = sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(self.lock_key().0)
            .execute(&mut listener)
            .await;
        match locked {
            Ok(_) => {}
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => {
                let holder = self.describe_holder(&mut listener).await;
                return Err(OpenError::Duplicate(Error::DuplicateNode {
                    node_id: self.node_id.clone(),
                    holder,
                }));
            }
            Err(err) => return Err(other(err.into())),
        }
        // Known at once, so that a reconnect after this point can end this backend (and
        // never takes a lock it left behind for another node's).
        let me: (i32, DateTime<Utc>) =
            sqlx::query_as("SELECT pid, backend_start FROM pg_stat_get_activity(pg_backend_pid())")
                .fetch_one(&mut listener)
                .await
                .map_err(|err| other(err.into()))?;
        *self.last_session.lock().unwrap_or_else(|e| e.into_inner()) = Some(me);
        listener
            .listen_all(self.channels.iter().map(String::as_str))
            .await
            .map_err(|err| other(err.into()))?;
        let mut session = Session { listener, pool };
        self.register(&mut session).await.map_err(other)?;
        Ok(session)
    }

    /// Ends this node's previous node session if the server still runs it (the connection
    /// went half-open: the server may never notice), so that its lock is freed at once. Only
    /// the exact session this node opened (pid and start time) is ended, never another node's.
    async fn end_previous_session(&self, listener: &mut PgListener) {
        let previous = *self.last_session.lock().unwrap_or_else(|e| e.into_inner());
        let Some((pid, started)) = previous else {
            return;
        };
        let ended = sqlx::query_scalar::<_, bool>(
            "SELECT pg_terminate_backend(pid, 1000) FROM pg_stat_activity
              WHERE pid = $1 AND backend_start = $2",
        )
        .bind(pid)
        .bind(started)
        .fetch_optional(&mut *listener)
        .await;
        if let Ok(Some(true)) = ended {
            info!(target: "forge::node", node = %self.node_id, pid,
                  "ended this node's previous node session, which the server still ran (half-open connection)");
        }
    }

    /// Who holds this node's lock, for the duplicate-id error.
    async fn describe_holder(&self, listener: &mut PgListener) -> String {
        let key = self.lock_key().0;
        let row = sqlx::query(
            "SELECT a.pid, a.application_name, host(a.client_addr) AS client, a.backend_start
               FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
              WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                AND l.classid = (($1 >> 32) & 4294967295)::oid
                AND l.objid = ($1 & 4294967295)::oid
              LIMIT 1",
        )
        .bind(key)
        .fetch_optional(&mut *listener)
        .await;
        match row {
            Ok(Some(row)) => format!(
                "backend pid {}, application_name {:?}, client {}, connected since {}",
                row.try_get::<i32, _>("pid").unwrap_or_default(),
                row.try_get::<Option<String>, _>("application_name")
                    .ok()
                    .flatten()
                    .unwrap_or_default(),
                row.try_get::<Option<String>, _>("client")
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| "local socket".into()),
                row.try_get::<chrono::DateTime<chrono::Utc>, _>("backend_start")
                    .map(|at| at.to_rfc3339())
                    .unwrap_or_default(),
            ),
            _ => "a session this node cannot see".into(),
        }
    }

    /// `forge.node_join` on the session.
    async fn register(&self, session: &mut Session) -> Result<()> {
        let row = sqlx::query("SELECT * FROM forge.node_join($1, $2, $3, $4, $5, $6, $7, $8, $9)")
            .bind(&self.namespace)
            .bind(&self.node_id)
            .bind(self.incarnation)
            .bind(&self.info.hostname)
            .bind(self.info.pid)
            .bind(&self.info.version)
            .bind(&self.info.roles)
            .bind(&self.info.queues)
            .bind(self.info.admin_url.as_deref())
            .fetch_one(&mut session.listener)
            .await?;
        let previous: Option<i64> = row.try_get("previous_incarnation")?;
        let stopped: Option<bool> = row.try_get("previous_stopped")?;
        let was_down: Option<bool> = row.try_get("was_down")?;
        if previous.is_some_and(|p| p != self.incarnation) && stopped == Some(false) {
            warn!(target: "forge::node", node = %self.node_id,
                  "the previous run of this node did not stop cleanly; its running jobs are rescued");
        }
        if previous == Some(self.incarnation) && was_down == Some(true) {
            warn!(target: "forge::node", node = %self.node_id,
                  "this node had been marked down by the scheduler leader (it was unreachable or frozen); it rejoined, and work taken from it runs elsewhere");
        }
        Ok(())
    }

    /// Runs the node session until `stop` is cancelled, then records the node's departure.
    pub(crate) async fn run(self, session: Session, stop: CancellationToken) {
        let mut backoff = Backoff::new(self.election.check_interval);
        let mut current = Some(session);
        loop {
            let session = match current.take() {
                Some(session) => session,
                None => match self.reopen(&mut backoff, &stop).await {
                    Some(session) => session,
                    None => return,
                },
            };
            match self.serve(session, &stop).await {
                Served::Stopped(session) => {
                    self.leave(session).await;
                    return;
                }
                Served::Lost => {
                    let _ = self.events.send(ListenerEvent::Lost);
                    if stop.is_cancelled() {
                        return;
                    }
                }
            }
        }
    }

    /// Reconnects after a loss, with backoff, until it works or the node stops.
    async fn reopen(&self, backoff: &mut Backoff, stop: &CancellationToken) -> Option<Session> {
        loop {
            tokio::select! {
                _ = sleep(backoff.next()) => {}
                _ = stop.cancelled() => return None,
            }
            let opened = tokio::select! {
                opened = self.open(self.election.check_interval) => opened,
                _ = stop.cancelled() => return None,
            };
            match opened {
                Ok(session) => {
                    backoff.reset();
                    self.metrics
                        .counter(&defs::RECONNECTS, &[("session", "node")])
                        .increment(1);
                    info!(target: "forge::node", node = %self.node_id, "node session restored");
                    let _ = self.events.send(ListenerEvent::Restored);
                    return Some(session);
                }
                Err(OpenError::Duplicate(err)) => {
                    // This node's previous session was ended before the lock was asked for,
                    // so the holder is another live node with this id (a twin started while
                    // this one was reconnecting). Two workers under one id would rescue each
                    // other's jobs: stop this node's work and report it.
                    error!(target: "forge::node", node = %self.node_id, error = %err,
                           "another node took this node's id while its session was down; stopping this node");
                    if let Error::DuplicateNode { holder, .. } = err {
                        self.fault.send_replace(Some(Fault::DuplicateNode(holder)));
                    }
                    self.work.cancel();
                    return None;
                }
                Err(OpenError::Other(err)) => {
                    debug!(target: "forge::node", node = %self.node_id, error = %err, "node session unavailable");
                }
            }
        }
    }

    /// Forwards notifications and heartbeats until the session breaks or the node stops.
    async fn serve(&self, mut session: Session, stop: &CancellationToken) -> Served {
        let every = self.config.heartbeat_interval;
        // A heartbeat that takes longer than this means the connection is gone or the server
        // is stuck; either way the session is replaced.
        let bound = every.clamp(Duration::from_secs(1), Duration::from_secs(10));
        let mut next_beat = Instant::now() + every;
        loop {
            // The heartbeat comes before notifications: a steady stream of them must not
            // starve it (a busy node would look dead).
            tokio::select! {
                biased;
                _ = stop.cancelled() => return Served::Stopped(session),
                _ = sleep_until(next_beat) => {
                    next_beat = Instant::now() + every;
                    match timeout(bound, self.heartbeat(&mut session)).await {
                        Ok(Ok(true)) => {}
                        Ok(Ok(false)) => {
                            if let Err(err) = self.register(&mut session).await {
                                warn!(target: "forge::node", node = %self.node_id, error = %err, "cannot rejoin; reconnecting");
                                self.discard(session);
                                return Served::Lost;
                            }
                            let _ = self.events.send(ListenerEvent::Restored);
                        }
                        Ok(Err(err)) => {
                            warn!(target: "forge::node", node = %self.node_id, error = %err, "heartbeat failed; reconnecting the node session");
                            self.discard(session);
                            return Served::Lost;
                        }
                        Err(_) => {
                            warn!(target: "forge::node", node = %self.node_id, waited_ms = bound.as_millis() as u64,
                                  "heartbeat got no answer (the connection may be half-open); reconnecting the node session");
                            self.discard(session);
                            return Served::Lost;
                        }
                    }
                }
                received = session.listener.try_recv() => match received {
                    Ok(Some(notification)) => {
                        let _ = self.events.send(ListenerEvent::Notification {
                            channel: notification.channel().into(),
                            payload: notification.payload().into(),
                        });
                    }
                    Ok(None) | Err(_) => {
                        warn!(target: "forge::node", node = %self.node_id, "node session lost (LISTEN connection closed); reconnecting");
                        self.discard(session);
                        return Served::Lost;
                    }
                },
            }
        }
    }

    /// One heartbeat; for the roles this node is a reserve of, in the same statement, which of
    /// them lack standbys (their campaigns are woken to take a standby's place).
    async fn heartbeat(&self, session: &mut Session) -> std::result::Result<bool, sqlx::Error> {
        let leading = (self.leading)();
        let reserves = (self.reserves)();
        let tally = self.metrics.tally();
        let (all, counters) = tally.for_heartbeat();
        let beat = |sql| {
            sqlx::query(sql)
                .bind(&self.namespace)
                .bind(&self.node_id)
                .bind(self.incarnation)
                .bind(&leading)
                .bind(&counters)
                .bind(all)
        };
        let landed = |row: &PgRow| {
            let landed: bool = row.try_get(0)?;
            if landed {
                tally.sent();
            }
            Ok::<bool, sqlx::Error>(landed)
        };
        if reserves.is_empty() {
            let row = beat("SELECT forge.node_heartbeat($1, $2, $3, $4, $5, $6)")
                .fetch_one(&mut session.listener)
                .await?;
            return landed(&row);
        }
        let keys: Vec<i64> = reserves.iter().map(|(key, _)| key.0).collect();
        let row = beat(
            "SELECT forge.node_heartbeat($1, $2, $3, $4, $5, $6), forge.standbys_wanted($7, $8)",
        )
        .bind(&keys)
        .bind(self.election.standbys.min(i32::MAX as u32) as i32)
        .fetch_one(&mut session.listener)
        .await?;
        let wanted: Vec<i64> = row.try_get(1)?;
        for (key, wake) in reserves {
            if wanted.contains(&key.0) {
                wake.notify_one();
            }
        }
        landed(&row)
    }

    /// Drops a broken session without waiting on it (it may never answer again).
    fn discard(&self, session: Session) {
        let Session { listener, pool } = session;
        drop(listener);
        tokio::spawn(async move {
            let _ = timeout(Duration::from_secs(5), pool.close()).await;
        });
    }

    /// Records the departure and closes the session (which releases the node lock).
    async fn leave(&self, mut session: Session) {
        let left = timeout(
            Duration::from_secs(5),
            sqlx::query("SELECT forge.node_leave($1, $2, $3)")
                .bind(&self.namespace)
                .bind(&self.node_id)
                .bind(self.incarnation)
                .execute(&mut session.listener),
        )
        .await;
        if !matches!(left, Ok(Ok(_))) {
            warn!(target: "forge::node", node = %self.node_id, "could not record the node's departure; the cluster will mark it down");
        }
        let Session { listener, pool } = session;
        drop(listener);
        let _ = timeout(Duration::from_secs(2), pool.close()).await;
    }
}

/// How serving a session ended.
enum Served {
    /// The node stops; the session is still good for the goodbye.
    Stopped(Session),
    /// The session broke.
    Lost,
}

/// The scheduler leader's membership duty: every heartbeat interval, mark drifted and down
/// nodes (`forge.nodes_watch`, fenced by this tenure).
pub(crate) async fn watch(leadership: Leadership, config: MembershipConfig) {
    let ms = |d: Duration| d.as_millis().min(i64::MAX as u128) as i64;
    // A node whose session ended gets one heartbeat interval (at least a second) to come back
    // before it counts as down: a terminated session reconnects in milliseconds.
    let grace = config.heartbeat_interval.max(Duration::from_secs(1));
    loop {
        let token = leadership.fence_token();
        let changes = async {
            let mut session = leadership.session().await?;
            let rows = token
                .bind(sqlx::query(
                    "SELECT node_id, change, reason FROM forge.nodes_watch($1, $2, $3, $4, $5, $6, $7)",
                ))
                .bind(ms(config.drift_after))
                .bind(ms(config.down_after))
                .bind(ms(grace))
                .fetch_all(&mut *session)
                .await?;
            rows.iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
                .collect::<Result<Vec<(String, String, String)>>>()
        };
        let changes = tokio::select! {
            changes = timeout(config.heartbeat_interval.max(Duration::from_secs(5)), changes) => changes,
            _ = leadership.stopping() => return,
        };
        match changes {
            Ok(Ok(changes)) => {
                for (node, change, reason) in changes {
                    warn!(target: "forge::node", node = %node, change = %change, reason = %reason,
                          by = %leadership.node_id(), "membership changed");
                }
            }
            Ok(Err(err)) if crate::duties::is_fenced(&err) => return,
            Ok(Err(err)) => {
                debug!(target: "forge::node", error = %err, "membership watch failed; retrying")
            }
            Err(_) => debug!(target: "forge::node", "membership watch timed out; retrying"),
        }
        tokio::select! {
            _ = sleep(config.heartbeat_interval) => {}
            _ = leadership.stopping() => return,
        }
    }
}
