//! A node: builder, start-up checks, the LISTEN session, the campaigns, graceful shutdown.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Config;
use crate::db;
use crate::election::{Campaign, LeaderTask, RoleHandle, RoleState, lock_application_name};
use crate::error::{Error, Result};
use crate::leadership::Leadership;
use crate::metrics::Metrics;
use crate::role::{NodeId, Role};
use crate::util::Backoff;

/// The notification channel on which leadership changes are announced.
pub(crate) const LEADER_CHANNEL: &str = "forge_leader";

/// What the node's LISTEN session reports to the campaigns and to services.
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
    /// The LISTEN session broke (PostgreSQL down or restarting): notifications may be missed
    /// until [`ListenerEvent::Restored`].
    Lost,
    /// The LISTEN session is (again) up: re-check whatever notifications would have said.
    Restored,
}

type Service = Box<dyn FnOnce(NodeContext) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Builds a [`Node`]: register leader-only work and services, then [`NodeBuilder::start`].
///
/// ```no_run
/// use forge_core::{Config, Node, Role};
///
/// # async fn demo() -> forge_core::Result<()> {
/// let node = Node::builder(Config::load("forge.toml")?)
///     .leader_task(Role::SCHEDULER, "announce", |leadership| async move {
///         println!("leading {} at epoch {}", leadership.role(), leadership.epoch());
///         leadership.stopping().await;
///     })
///     .start()
///     .await?;
/// node.run_until_signal().await;
/// # Ok(()) }
/// ```
pub struct NodeBuilder {
    config: Config,
    tasks: BTreeMap<Role, Vec<(String, LeaderTask)>>,
    services: Vec<(String, Service)>,
    channels: Vec<String>,
}

impl NodeBuilder {
    /// Registers leader-only work for `role`: `task` is called with a [`Leadership`] each time
    /// this node wins the role, and its future is dropped the moment the leadership is lost.
    /// On a graceful shutdown [`Leadership::stopping`] resolves first and the future gets up
    /// to `drain_timeout` to finish.
    pub fn leader_task<F, Fut>(mut self, role: Role, name: impl Into<String>, task: F) -> Self
    where
        F: Fn(Leadership) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let task: LeaderTask = Arc::new(move |leadership| Box::pin(task(leadership)));
        self.tasks
            .entry(role)
            .or_default()
            .push((name.into(), task));
        self
    }

    /// Registers a service that runs on every node (job workers, for example) from start to
    /// shutdown; it must return soon after [`NodeContext::shutdown`] is cancelled.
    pub fn service<F, Fut>(mut self, name: impl Into<String>, service: F) -> Self
    where
        F: FnOnce(NodeContext) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.services
            .push((name.into(), Box::new(move |ctx| Box::pin(service(ctx)))));
        self
    }

    /// Also LISTEN on `channel`; its notifications reach [`NodeContext::subscribe`].
    pub fn listen(mut self, channel: impl Into<String>) -> Self {
        let channel = channel.into();
        if !self.channels.contains(&channel) {
            self.channels.push(channel);
        }
        self
    }

    /// The configuration the node will start with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Validates the configuration, connects (retrying for `connect_timeout`), refuses
    /// transaction poolers, applies migrations, and starts campaigning.
    pub async fn start(self) -> Result<Node> {
        let config = self.config;
        config.validate()?;
        let node_id = config.node_id()?;
        let namespace = config.lock_namespace()?;
        let configured = config.roles()?;

        // Campaign only for roles this node may lead and can serve.
        let mut campaigned = Vec::new();
        for role in &configured {
            if self.tasks.contains_key(role) || config.node.campaign_without_work {
                campaigned.push(role.clone());
            } else {
                info!(target: "forge::leader", role = %role, node = %node_id,
                      "not campaigning: no work is registered for this role (set [node] campaign_without_work to lead it anyway)");
            }
        }
        for role in self.tasks.keys() {
            if !configured.contains(role) {
                info!(target: "forge::leader", role = %role, node = %node_id,
                      "not campaigning: the role has work but is not in [node] roles");
            }
        }
        let mut keys = BTreeMap::new();
        for role in self.tasks.keys().chain(&configured) {
            let key = role.lock_key(&namespace);
            if let Some(other) = keys.insert(key, role.clone())
                && other != *role
            {
                return Err(Error::DuplicateLockKey {
                    first: other.name().to_owned(),
                    second: role.name().to_owned(),
                    key: key.0,
                });
            }
        }

        let options =
            |purpose: &str| db::connect_options(&config, &format!("forge:{purpose}:{node_id}"));
        let setup_options = options("setup")?;
        let patience = config.database.connect_timeout;
        let mut setup = db::connect_patiently(&setup_options, patience).await?;
        db::check_not_pooled(&setup_options, patience).await?;
        if config.database.migrate {
            db::migrate(&mut setup).await?;
        } else {
            db::check_schema(&mut setup).await?;
        }
        if setup.server_version_num().unwrap_or(0) < 140000 {
            warn!(target: "forge::leader",
                  "PostgreSQL older than 14 has no idle_session_timeout: a frozen leader is fenced by its followers within lease_duration + lock_timeout instead of lease_duration");
        }
        let _ = setup.close().await;

        let metrics = match config.metrics.listen {
            Some(listen) => Metrics::serve(listen)?,
            None => Metrics::new(),
        };
        let pool = db::pool(&config, options("pool")?);
        let shutdown = CancellationToken::new();
        let (events, _) = broadcast::channel(1024);
        let mut handles = Vec::new();

        let mut channels = vec![LEADER_CHANNEL.to_owned()];
        channels.extend(self.channels);
        handles.push(tokio::spawn(listen(
            options("listen")?,
            channels,
            events.clone(),
            shutdown.clone(),
            config.cluster.leader_election.check_interval,
            metrics.clone(),
        )));
        handles.push(tokio::spawn(upkeep(metrics.clone(), shutdown.clone())));

        let mut tasks = self.tasks;
        let mut roles = BTreeMap::new();
        for role in campaigned {
            let handle = Arc::new(RoleHandle::new(role.clone()));
            let campaign = Campaign {
                handle: handle.clone(),
                key: role.lock_key(&namespace),
                namespace: namespace.clone(),
                node_id: node_id.clone(),
                election: config.cluster.leader_election.clone(),
                lock_options: db::connect_options(
                    &config,
                    &lock_application_name(&role, &node_id),
                )?,
                pool: pool.clone(),
                tasks: tasks.remove(&role).unwrap_or_default(),
                events: events.subscribe(),
                shutdown: shutdown.clone(),
                metrics: metrics.clone(),
            };
            handles.push(tokio::spawn(campaign.run()));
            roles.insert(role, handle);
        }

        let config = Arc::new(config);
        let context = NodeContext {
            node_id: node_id.clone(),
            config: config.clone(),
            pool: pool.clone(),
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
            events: events.clone(),
        };
        for (name, service) in self.services {
            let service = service(context.clone());
            handles.push(tokio::spawn(async move {
                service.await;
                tracing::debug!(target: "forge::node", service = %name, "service stopped");
            }));
        }
        info!(target: "forge::node", node = %node_id, roles = ?roles.keys().map(Role::name).collect::<Vec<_>>(), "node started");
        Ok(Node {
            inner: Arc::new(NodeInner {
                context,
                roles,
                handles: Mutex::new(handles),
            }),
        })
    }
}

/// What services get: the node's identity, pool, metrics, notifications and shutdown signal.
#[derive(Clone)]
pub struct NodeContext {
    node_id: NodeId,
    config: Arc<Config>,
    pool: PgPool,
    metrics: Metrics,
    shutdown: CancellationToken,
    events: broadcast::Sender<ListenerEvent>,
}

impl NodeContext {
    /// This node's id.
    pub fn node_id(&self) -> &NodeId {
        &self.node_id
    }

    /// The node's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The node's connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The node's metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Cancelled when the node shuts down.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Notifications on the channels registered with [`NodeBuilder::listen`], and the LISTEN
    /// session's losses and restorations.
    pub fn subscribe(&self) -> broadcast::Receiver<ListenerEvent> {
        self.events.subscribe()
    }
}

/// A running node. Cheap to clone; all clones refer to the same node.
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeInner>,
}

struct NodeInner {
    context: NodeContext,
    roles: BTreeMap<Role, Arc<RoleHandle>>,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for NodeInner {
    fn drop(&mut self) {
        // A node dropped without `shutdown` still stops campaigning.
        self.context.shutdown.cancel();
    }
}

impl Node {
    /// A builder for a node with this configuration.
    pub fn builder(config: Config) -> NodeBuilder {
        NodeBuilder {
            config,
            tasks: BTreeMap::new(),
            services: Vec::new(),
            channels: Vec::new(),
        }
    }

    /// This node's id.
    pub fn id(&self) -> &NodeId {
        &self.inner.context.node_id
    }

    /// The node's connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.inner.context.pool
    }

    /// The node's context, as services get it.
    pub fn context(&self) -> &NodeContext {
        &self.inner.context
    }

    /// The roles this node campaigns for.
    pub fn roles(&self) -> Vec<Role> {
        self.inner.roles.keys().cloned().collect()
    }

    /// The current state of a role (`None` if this node does not campaign for it).
    pub fn role_state(&self, role: &Role) -> Option<RoleState> {
        self.inner
            .roles
            .get(role)
            .map(|handle| handle.state.borrow().clone())
    }

    /// A receiver that sees every state change of a role.
    pub fn watch_role(&self, role: &Role) -> Option<watch::Receiver<RoleState>> {
        self.inner
            .roles
            .get(role)
            .map(|handle| handle.state.subscribe())
    }

    /// This node's current leadership of a role, if it leads it.
    pub fn leadership(&self, role: &Role) -> Option<Leadership> {
        let handle = self.inner.roles.get(role)?;
        let current = handle.current.lock().unwrap_or_else(|e| e.into_inner());
        current.clone().filter(Leadership::is_valid)
    }

    /// The node's metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.context.metrics
    }

    /// The node's metrics in the Prometheus text format.
    pub fn render_metrics(&self) -> String {
        self.inner.context.metrics.render()
    }

    /// Graceful shutdown: leaders stop taking new leader-only work, drain it for up to
    /// `drain_timeout`, release their locks (a waiting follower takes over within
    /// milliseconds) and close; followers withdraw; services stop. Idempotent.
    pub async fn shutdown(&self) {
        self.inner.context.shutdown.cancel();
        let handles =
            std::mem::take(&mut *self.inner.handles.lock().unwrap_or_else(|e| e.into_inner()));
        // Leader-only work drains for up to the election's drain_timeout, job workers for up
        // to [jobs] drain_timeout; both run at once.
        let config = &self.inner.context.config;
        let bound = config
            .cluster
            .leader_election
            .drain_timeout
            .max(config.jobs.drain_timeout)
            + Duration::from_secs(10);
        if timeout(bound, async {
            for handle in handles {
                let _ = handle.await;
            }
        })
        .await
        .is_err()
        {
            warn!(target: "forge::node", node = %self.id(), "shutdown did not finish in time");
        }
        self.inner.context.pool.close().await;
        info!(target: "forge::node", node = %self.id(), "node stopped");
    }

    /// Runs until SIGTERM or ctrl-c, then shuts down gracefully.
    pub async fn run_until_signal(&self) {
        shutdown_signal().await;
        info!(target: "forge::node", node = %self.id(), "shutdown requested");
        self.shutdown().await;
    }
}

/// Resolves on SIGTERM or ctrl-c (SIGINT).
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// The node's LISTEN session: forwards notifications, and reports its own breakage at once,
/// which is how leaders learn within milliseconds that PostgreSQL went away.
async fn listen(
    options: PgConnectOptions,
    channels: Vec<String>,
    events: broadcast::Sender<ListenerEvent>,
    shutdown: CancellationToken,
    check_interval: Duration,
    metrics: Metrics,
) {
    let mut backoff = Backoff::new(check_interval);
    let mut first = true;
    loop {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(check_interval.max(Duration::from_secs(2)))
            .connect_lazy_with(options.clone());
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.eager_reconnect(false);
            listener.ignore_pool_close_event(true);
            listener
                .listen_all(channels.iter().map(String::as_str))
                .await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let connected = tokio::select! {
            connected = connected => connected,
            _ = shutdown.cancelled() => return,
        };
        match connected {
            Ok(mut listener) => {
                backoff.reset();
                if !first {
                    metrics
                        .counter("forge_db_reconnects_total", &[("session", "listen")])
                        .increment(1);
                }
                first = false;
                let _ = events.send(ListenerEvent::Restored);
                loop {
                    let received = tokio::select! {
                        received = listener.try_recv() => received,
                        _ = shutdown.cancelled() => return,
                    };
                    match received {
                        Ok(Some(notification)) => {
                            let _ = events.send(ListenerEvent::Notification {
                                channel: notification.channel().into(),
                                payload: notification.payload().into(),
                            });
                        }
                        Ok(None) | Err(_) => {
                            warn!(target: "forge::node", "LISTEN session lost; reconnecting");
                            let _ = events.send(ListenerEvent::Lost);
                            break;
                        }
                    }
                }
            }
            Err(err) => {
                tracing::debug!(target: "forge::node", error = %err, "LISTEN session unavailable");
            }
        }
        pool.close().await;
        tokio::select! {
            _ = sleep(backoff.next()) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

async fn upkeep(metrics: Metrics, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = sleep(Metrics::UPKEEP_EVERY) => metrics.run_upkeep(),
            _ = shutdown.cancelled() => return,
        }
    }
}
