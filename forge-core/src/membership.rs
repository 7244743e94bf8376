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
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, FromRow, Row};
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

mod sightings;

use sightings::{Judged, Seen, Sightings, Thresholds};

/// The notification channel on which leadership changes are announced.
pub(crate) const LEADER_CHANNEL: &str = "forge_leader";

/// The notification channel on which membership changes are announced: payload
/// `<namespace> down <node id>` when the scheduler leader marks a node down, so that work
/// waiting on it (job rescue) need not wait for its next pass.
pub const NODES_CHANNEL: &str = "forge_nodes";

/// How long this node may still count its running jobs as its own.
///
/// The scheduler leader marks a node down - and rescues its jobs elsewhere - only after it has
/// seen the node's last heartbeat unchanged for `down_after` on its own monotonic clock (a new
/// leader has seen nothing yet), and it sees a heartbeat only after it landed. So a node whose
/// last heartbeat that landed was *sent* at `t` holds its jobs at least until `t + down_after`,
/// whatever any wall clock does; it stops trusting that a margin before
/// (`[cluster.membership] heartbeat_interval`, at most a quarter of `down_after`), as a leader
/// stops trusting its lease. Job workers stop their attempts when this runs out (a node cut
/// off from PostgreSQL), so a live node's attempt never runs beside its rescued successor.
#[derive(Clone, Debug)]
pub struct Standing {
    until: Arc<watch::Sender<Instant>>,
    window: Duration,
}

impl Standing {
    pub(crate) fn new(config: &MembershipConfig) -> Standing {
        let margin = config.heartbeat_interval.min(config.down_after / 4);
        let window = config.down_after.saturating_sub(margin);
        Standing {
            until: Arc::new(watch::Sender::new(Instant::now() + window)),
            window,
        }
    }

    /// A heartbeat sent at `sent_at` landed.
    pub(crate) fn landed(&self, sent_at: Instant) {
        let until = sent_at + self.window;
        self.until.send_if_modified(|current| {
            let later = until > *current;
            if later {
                *current = until;
            }
            later
        });
    }

    /// PostgreSQL was seen not running at `at` (refused, starting up, shutting down): the
    /// scheduler leader after it is a new tenure, which watches from nothing, so it cannot mark
    /// this node down before `at + down_after`.
    pub(crate) fn server_down(&self, at: Instant) {
        self.landed(at);
    }

    /// The cluster says this node was marked down: its jobs are rescued already.
    pub(crate) fn revoke(&self) {
        self.until.send_replace(Instant::now());
    }

    /// Until when this node's running jobs are its own.
    pub fn until(&self) -> Instant {
        *self.until.borrow()
    }
}

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
    /// The roles it campaigns for.
    pub(crate) roles: Vec<String>,
    /// The roles its binary has work for, campaigned for or not: where no live node campaigns
    /// for one of them, the cluster's status reports work with nowhere to run.
    pub(crate) work_roles: Vec<String>,
    /// `[node] prefer_roles` (of `roles`).
    pub(crate) prefers: Vec<String>,
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
    /// Asks this node's leadership of a role (by name) to hand it over to a node, for a reason:
    /// the placement moves the heartbeat learns of (`forge.placement_move`).
    pub(crate) moves: AskMove,
    /// `[cluster] spread`.
    pub(crate) spread: bool,
    pub(crate) metrics: Metrics,
    /// The backend (pid, start) of this node's last node session: after a half-open
    /// connection it may live on in the server, holding the node's lock.
    pub(crate) last_session: Mutex<Option<(i32, DateTime<Utc>)>>,
    /// Set when another live node took this node's id while its session was down; the node
    /// must stop (see [`Membership::reopen`]).
    pub(crate) fault: watch::Sender<Option<Fault>>,
    /// The node's work: cancelled on a fault.
    pub(crate) work: CancellationToken,
    /// The node's pool: heartbeats go through it while the node session cannot be reopened.
    pub(crate) pool: PgPool,
    /// Until when this node's jobs are its own (see [`Standing`]).
    pub(crate) standing: Standing,
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

/// Asks this node's leadership of a role (by name) to hand it over: (role, to node, why).
pub(crate) type AskMove = Arc<dyn Fn(&str, String, String) + Send + Sync>;

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
        /// The session holding the node's lock, as `pg_stat_activity` shows it.
        #[derive(sqlx::FromRow)]
        struct Holder {
            pid: i32,
            application_name: Option<String>,
            client: Option<String>,
            backend_start: Option<DateTime<Utc>>,
        }
        let holder: std::result::Result<Option<Holder>, _> = sqlx::query_as(
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
        match holder {
            Ok(Some(holder)) => format!(
                "backend pid {}, application_name {:?}, client {}, connected since {}",
                holder.pid,
                holder.application_name.unwrap_or_default(),
                holder.client.unwrap_or_else(|| "local socket".into()),
                holder
                    .backend_start
                    .map(|at| at.to_rfc3339())
                    .unwrap_or_default(),
            ),
            _ => "a session this node cannot see".into(),
        }
    }

    /// `forge.node_join` on the session.
    async fn register(&self, session: &mut Session) -> Result<()> {
        /// What `forge.node_join` knew of this node's previous run.
        #[derive(sqlx::FromRow)]
        struct Joined {
            previous_incarnation: Option<i64>,
            previous_stopped: Option<bool>,
            was_down: Option<bool>,
        }
        let joined: Joined = sqlx::query_as(
            "SELECT * FROM forge.node_join($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&self.namespace)
        .bind(&self.node_id)
        .bind(self.incarnation)
        .bind(&self.info.hostname)
        .bind(self.info.pid)
        .bind(&self.info.version)
        .bind(&self.info.roles)
        .bind(&self.info.queues)
        .bind(self.info.admin_url.as_deref())
        .bind(&self.info.prefers)
        .bind(&self.info.work_roles)
        .fetch_one(&mut session.listener)
        .await?;
        let previous = joined.previous_incarnation;
        if previous.is_some_and(|p| p != self.incarnation) && joined.previous_stopped == Some(false)
        {
            warn!(target: "forge::node", node = %self.node_id,
                  "the previous run of this node did not stop cleanly; its running jobs are rescued");
        }
        if previous == Some(self.incarnation) && joined.was_down == Some(true) {
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
        // Meanwhile the node heartbeats through its pool, when the next heartbeat would have
        // been due and every interval after: a node whose node session cannot be reopened
        // (connections full, its flows cut) but whose pool works stays a live member.
        let mut next_pool_beat = Instant::now() + self.config.heartbeat_interval;
        loop {
            let pause = backoff.next();
            let paused = self.beating_through_pool(sleep(pause), &mut next_pool_beat, stop);
            paused.await?;
            let open = self.open(self.election.check_interval);
            let opened = self.beating_through_pool(open, &mut next_pool_beat, stop);
            match opened.await? {
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
                    if server_not_running(&err) {
                        self.standing.server_down(Instant::now());
                    }
                }
            }
        }
    }

    /// Runs `work`, heartbeating through the pool whenever `next_beat` comes meanwhile;
    /// `None` when the node stops first.
    async fn beating_through_pool<T>(
        &self,
        work: impl std::future::Future<Output = T>,
        next_beat: &mut Instant,
        stop: &CancellationToken,
    ) -> Option<T> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                done = &mut work => return Some(done),
                _ = stop.cancelled() => return None,
                _ = sleep_until(*next_beat) => {
                    self.heartbeat_through_pool().await;
                    *next_beat = Instant::now() + self.config.heartbeat_interval;
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

    /// One heartbeat on the node session; see [`Membership::heartbeat_on`].
    async fn heartbeat(&self, session: &mut Session) -> std::result::Result<bool, sqlx::Error> {
        let sent = Instant::now();
        let landed = self.heartbeat_on(&mut session.listener, false).await?;
        if landed {
            self.standing.landed(sent);
        }
        Ok(landed)
    }

    /// One heartbeat through the pool, while the node session is down and cannot be reopened
    /// (the server refuses new connections, say): the process is alive, and its jobs stay its
    /// own while this lands. `false` when it did not: the pool cannot reach the server either,
    /// or this node was marked down or replaced (then its jobs are not its own any more).
    async fn heartbeat_through_pool(&self) -> bool {
        let sent = Instant::now();
        let bound = self
            .config
            .heartbeat_interval
            .clamp(Duration::from_millis(500), Duration::from_secs(5));
        let beat = async {
            let mut conn = self.pool.acquire().await?;
            self.heartbeat_on(&mut *conn, true).await
        };
        match timeout(bound, beat).await {
            Ok(Ok(true)) => {
                self.standing.landed(sent);
                debug!(target: "forge::node", node = %self.node_id, "heartbeat sent through the pool while the node session is down");
                true
            }
            Ok(Ok(false)) => {
                warn!(target: "forge::node", node = %self.node_id,
                      "this node was marked down (or replaced) while its node session was down: stopping its attempts; its jobs run elsewhere");
                self.standing.revoke();
                false
            }
            Ok(Err(err)) => {
                debug!(target: "forge::node", node = %self.node_id, error = %err, "heartbeat through the pool failed");
                self.probe_server().await;
                false
            }
            Err(_) => {
                self.probe_server().await;
                false
            }
        }
    }

    /// After a heartbeat through the pool failed: one direct connection attempt, to tell a
    /// server that is not running (its clock for missing heartbeats does not run meanwhile,
    /// see [`Standing::server_down`]) from one this node cannot reach (a partition: it does).
    async fn probe_server(&self) {
        let at = Instant::now();
        match timeout(Duration::from_secs(1), self.options.connect()).await {
            Ok(Ok(conn)) => {
                let _ = sqlx::Connection::close(conn).await;
            }
            Ok(Err(err)) => {
                if server_not_running(&Error::Database(err)) {
                    debug!(target: "forge::node", node = %self.node_id, "PostgreSQL is not running: this node's jobs stay its own meanwhile");
                    self.standing.server_down(at);
                }
            }
            Err(_) => {}
        }
    }

    /// One heartbeat (`via_pool`: not on the node session). In the same statement: for the
    /// roles this node is a reserve of, which lack standbys (their campaigns are woken to take a
    /// standby's place); and, when it leads roles, whether placement wants one of them moved
    /// (`forge.placement_move`: the role's leadership is asked to hand it over).
    async fn heartbeat_on<'c, E>(
        &self,
        conn: E,
        via_pool: bool,
    ) -> std::result::Result<bool, sqlx::Error>
    where
        E: sqlx::Executor<'c, Database = sqlx::Postgres>,
    {
        let leading = (self.leading)();
        let reserves = (self.reserves)();
        let tally = self.metrics.tally();
        let (all, counters) = tally.for_heartbeat();
        let keys: Vec<i64> = reserves.iter().map(|(key, _)| key.0).collect();
        let mut sql = String::from("SELECT forge.node_heartbeat($1, $2, $3, $4, $5, $6, $7)");
        sql.push_str(if keys.is_empty() {
            ", NULL::bigint[]"
        } else {
            ", forge.standbys_wanted($8, $9)"
        });
        if leading.is_empty() {
            sql.push_str(", NULL::text[]");
        } else {
            let first = if keys.is_empty() { 8 } else { 10 };
            sql.push_str(&format!(
                ", forge.placement_move($1, $2, ${}, ${}, ${})",
                first,
                first + 1,
                first + 2
            ));
        }
        let every = self.config.heartbeat_interval.as_millis() as i64;
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(&self.namespace)
            .bind(&self.node_id)
            .bind(self.incarnation)
            .bind(&leading)
            .bind(&counters)
            .bind(all)
            .bind(via_pool);
        if !keys.is_empty() {
            query = query
                .bind(&keys)
                .bind(self.election.standbys.min(i32::MAX as u32) as i32);
        }
        if !leading.is_empty() {
            // One move per heartbeat interval in the cluster; a moved role stays 10 of them.
            query = query.bind(self.spread).bind(every).bind(every * 10);
        }
        let row = query.fetch_one(conn).await?;
        let landed: bool = row.try_get(0)?;
        if landed {
            tally.sent();
        }
        let wanted: Option<Vec<i64>> = row.try_get(1)?;
        for (key, wake) in reserves {
            if wanted.as_ref().is_some_and(|w| w.contains(&key.0)) {
                wake.notify_one();
            }
        }
        if let Some([role, to, why]) = row.try_get::<Option<Vec<String>>, _>(2)?.as_deref() {
            (self.moves)(role, to.clone(), why.clone());
        }
        Ok(landed)
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

/// The scheduler leader's membership duty: every heartbeat interval, a look at every node
/// (`forge.nodes_watch`, fenced by this tenure, on its lock session), which applies the verdicts
/// this leader reached from its earlier looks, on its own monotonic clock ([`Sightings`]):
/// drifted and down nodes.
pub(crate) async fn watch(leadership: Leadership, config: MembershipConfig) {
    // A node whose session ended gets one heartbeat interval (at least a second) to come back
    // before it counts as down: a terminated session reconnects in milliseconds.
    let limits = Thresholds {
        drift_after: config.drift_after,
        down_after: config.down_after,
        grace: config.heartbeat_interval.max(Duration::from_secs(1)),
    };
    let mut sightings = Sightings::default();
    loop {
        let verdicts = sightings.verdicts(Instant::now(), limits);
        let look = tokio::select! {
            look = timeout(config.heartbeat_interval.max(Duration::from_secs(5)), look(&leadership, &verdicts)) => look,
            _ = leadership.stopping() => return,
        };
        match look {
            Ok(Ok((rows, changes))) => {
                sightings.saw(&rows, Instant::now());
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

/// A look's changes: (node, change, reason).
type Changes = Vec<(String, String, String)>;

/// One look: `forge.nodes_watch` with `verdicts`, on the leader's lock session. What it saw of
/// each node, and what it changed.
async fn look(leadership: &Leadership, verdicts: &[Judged]) -> Result<(Vec<Seen>, Changes)> {
    let ms = |d: Duration| d.as_millis().min(i64::MAX as u128) as i64;
    let nodes: Vec<&str> = verdicts.iter().map(|j| j.node.as_str()).collect();
    let beats: Vec<DateTime<Utc>> = verdicts.iter().map(|j| j.beat).collect();
    let kinds: Vec<&str> = verdicts.iter().map(|j| j.verdict.as_str()).collect();
    let silent: Vec<i64> = verdicts.iter().map(|j| ms(j.silent)).collect();
    let mut session = leadership.session().await?;
    let rows = leadership
        .fence_token()
        .bind(sqlx::query(
            "SELECT node_id, heartbeat_at, gone, drifted, change, reason
               FROM forge.nodes_watch($1, $2, $3, $4, $5, $6, $7, $8)",
        ))
        .bind(&nodes)
        .bind(&beats)
        .bind(&kinds)
        .bind(&silent)
        .fetch_all(&mut *session)
        .await?;
    /// One row of `forge.nodes_watch`: a node as seen, and what was recorded of it.
    #[derive(sqlx::FromRow)]
    struct Watched {
        node_id: String,
        heartbeat_at: DateTime<Utc>,
        gone: bool,
        drifted: bool,
        change: Option<String>,
        reason: Option<String>,
    }
    let mut seen = Vec::with_capacity(rows.len());
    let mut changes = Vec::new();
    for row in &rows {
        let row = Watched::from_row(row)?;
        if let Some(change) = &row.change {
            changes.push((
                row.node_id.clone(),
                change.clone(),
                row.reason.unwrap_or_default(),
            ));
        }
        seen.push(Seen {
            node: row.node_id,
            beat: row.heartbeat_at,
            gone: row.gone,
            drifted: row.drifted,
            down: row.change.as_deref() == Some("down"),
        });
    }
    Ok((seen, changes))
}

/// Whether a failure to reach PostgreSQL shows the server itself not running: the connection
/// refused at its address, or the server starting up, shutting down or restarting after a
/// crash. (A timeout shows nothing: the server may be up behind a partition.) This assumes the
/// configured address leads to the cluster's current primary.
fn server_not_running(err: &Error) -> bool {
    let sqlx_error = match err {
        Error::Connect { source, .. } | Error::Database(source) => source,
        _ => return false,
    };
    match sqlx_error {
        sqlx::Error::Io(io) => io.kind() == std::io::ErrorKind::ConnectionRefused,
        sqlx::Error::Database(db) => {
            matches!(db.code().as_deref(), Some("57P01" | "57P02" | "57P03"))
        }
        _ => false,
    }
}
