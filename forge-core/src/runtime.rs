//! Assembling and running a node's core: the extension point ([`Component`], [`Assembly`])
//! and the running [`Runtime`] (node session, campaigns, services, graceful shutdown).
//!
//! The `forge` facade's `Node` is the only node users see; it builds an [`Assembly`], installs
//! the crons and jobs components (and the user's own), hands over FORGE's schema, and starts it.
//! This module knows nothing of crons or jobs: they arrive as leader tasks, services, LISTEN
//! channels, metric descriptions and a shutdown budget.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Connection;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgPool;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use crate::config::CoreConfig;
use crate::db;
use crate::duties::{self, Pruner};
use crate::election::{
    Campaign, LeaderTask, LossReason, PlacementMove, RoleHandle, RoleState, lock_application_name,
};
use crate::error::{Error, Result};
use crate::leadership::Leadership;
use crate::membership::{
    self, Fault, LEADER_CHANNEL, ListenerEvent, Membership, NodeInfo, Standing,
};
use crate::metrics::{AppMetrics, MetricDef, Metrics, defs};
use crate::role::{LockKey, LockNamespace, NodeId, Role};
use crate::schema::{self, FunctionSource, MigrationSource, Schema};

/// Work that plugs into a node: the crons, the job queue, the built-in roles' duties, or your
/// own. A component is installed once, before the node connects, and describes everything it
/// needs through the [`Assembly`].
pub trait Component: Send + 'static {
    /// A short name for logs (`crons`, `jobs`).
    fn name(&self) -> &'static str;

    /// Adds the component's leader tasks, services, LISTEN channels, metric descriptions and
    /// shutdown budget to the node being assembled.
    fn install(self: Box<Self>, node: &mut Assembly) -> Result<()>;
}

type Service = Box<dyn FnOnce(NodeContext) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

type ExportedSeries = (
    Option<Role>,
    &'static MetricDef,
    Vec<(&'static str, String)>,
);

/// A node being assembled: what every component contributes, before anything connects.
pub struct Assembly {
    config: CoreConfig,
    node_id: NodeId,
    namespace: LockNamespace,
    tasks: BTreeMap<Role, Vec<(String, LeaderTask)>>,
    services: Vec<(String, Service)>,
    channels: Vec<String>,
    drain_budget: Duration,
    migrations: Vec<MigrationSource>,
    functions: Vec<FunctionSource>,
    metric_defs: Vec<&'static MetricDef>,
    /// Series exported from the start: (only when campaigning for this role, metric, labels).
    series: Vec<ExportedSeries>,
    queues: BTreeMap<String, u32>,
    pruners: Vec<Pruner>,
    app_migrator: Option<Migrator>,
    app_metrics: Vec<AppMetrics>,
    version: String,
    admin_url: Option<String>,
}

impl Assembly {
    /// An assembly for the core configuration: resolves the node id and the namespace and
    /// adds the core's own duties (the scheduler leader's membership watch).
    pub fn new(config: CoreConfig) -> Result<Assembly> {
        config.validate(&Default::default())?;
        let node_id = config.node.node_id()?;
        let namespace = config.cluster.namespace()?;
        let mut assembly = Assembly {
            drain_budget: config.cluster.leader_election.drain_timeout,
            config,
            node_id,
            namespace,
            tasks: BTreeMap::new(),
            services: Vec::new(),
            channels: vec![
                LEADER_CHANNEL.to_owned(),
                membership::NODES_CHANNEL.to_owned(),
            ],
            migrations: Vec::new(),
            functions: Vec::new(),
            metric_defs: Vec::new(),
            series: Vec::new(),
            queues: BTreeMap::new(),
            pruners: Vec::new(),
            app_migrator: None,
            app_metrics: Vec::new(),
            admin_url: None,
            version: format!("forge {}", env!("CARGO_PKG_VERSION")),
        };
        let cluster = assembly.config.cluster.clone();
        let watch = cluster.membership.clone();
        assembly.leader_task(Role::SCHEDULER, "membership", move |leadership| {
            membership::watch(leadership, watch.clone())
        });
        let aggregation = duties::Aggregation {
            drift_after: cluster.membership.drift_after,
            gauge_every: cluster.membership.heartbeat_interval * 3,
            interval: assembly.config.metrics.rollup_interval,
            // The interval's last heartbeats land meanwhile.
            settle: cluster
                .membership
                .heartbeat_interval
                .min(Duration::from_secs(2)),
        };
        assembly.leader_task(Role::METRICS_AGGREGATOR, "rollups", move |leadership| {
            duties::aggregate(leadership, aggregation)
        });
        let rollup_retention = assembly.config.metrics.rollup_retention;
        assembly
            .prune("events", "prune_events", cluster.history_retention)
            .prune("nodes", "prune_nodes", cluster.membership.forget_after)
            .prune("stats", "prune_stats", rollup_retention);
        Ok(assembly)
    }

    /// This node's id.
    pub fn node_id(&self) -> &NodeId {
        &self.node_id
    }

    /// The lock namespace (`[cluster] lock_namespace`).
    pub fn namespace(&self) -> &LockNamespace {
        &self.namespace
    }

    /// The core configuration.
    pub fn config(&self) -> &CoreConfig {
        &self.config
    }

    /// Registers leader-only work for `role`: `task` is called with a [`Leadership`] each time
    /// this node wins the role, and its future is dropped the moment the leadership is lost.
    /// On a graceful shutdown [`Leadership::stopping`] resolves first and the future gets up
    /// to `drain_timeout` to finish, while the lease is still renewed.
    pub fn leader_task<F, Fut>(&mut self, role: Role, name: impl Into<String>, task: F) -> &mut Self
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

    /// Registers a service that runs on every node from start to shutdown; it must return soon
    /// after [`NodeContext::shutdown`] is cancelled (within its declared drain budget).
    pub fn service<F, Fut>(&mut self, name: impl Into<String>, service: F) -> &mut Self
    where
        F: FnOnce(NodeContext) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.services
            .push((name.into(), Box::new(move |ctx| Box::pin(service(ctx)))));
        self
    }

    /// Also LISTEN on `channel`; its notifications reach [`NodeContext::subscribe`].
    pub fn listen(&mut self, channel: impl Into<String>) -> &mut Self {
        let channel = channel.into();
        if !self.channels.contains(&channel) {
            self.channels.push(channel);
        }
        self
    }

    /// How long a graceful shutdown may take for this component's work to drain; the node waits
    /// for the longest budget (and the election's `drain_timeout`), plus a margin.
    pub fn drain_budget(&mut self, budget: Duration) -> &mut Self {
        self.drain_budget = self.drain_budget.max(budget);
        self
    }

    /// FORGE's schema, which the node applies (or checks, with `[database] migrate = false`) at
    /// start: migrations in version order, then the function files. The `forge` crate hands
    /// over the whole of it (`forge::migrate::SCHEMA`, its `migrations/` folder).
    pub fn schema(&mut self, schema: Schema) -> &mut Self {
        self.migrations.extend_from_slice(schema.migrations);
        self.functions.extend_from_slice(schema.functions);
        self
    }

    /// Registers the descriptions of the component's metrics.
    pub fn describe_metrics(&mut self, defs: &[&'static MetricDef]) -> &mut Self {
        self.metric_defs.extend_from_slice(defs);
        self
    }

    /// Adds the application's own metrics to the node's: `render` returns them in the
    /// Prometheus text format (`metrics_exporter_prometheus::PrometheusHandle::render`, say)
    /// and is called at each scrape of `[metrics] listen` and by [`Metrics::render`], its text
    /// after FORGE's (and after the texts of earlier calls). A process figure (`process_*`) its
    /// text has too is left out of FORGE's, so that each family appears once.
    pub fn app_metrics(
        &mut self,
        render: impl Fn() -> String + Send + Sync + 'static,
    ) -> &mut Self {
        self.app_metrics.push(Box::new(render));
        self
    }

    /// Exports a series of one of the component's metrics as soon as the node starts, before
    /// its first event: a counter at 0 (so that Prometheus' `increase()` sees the first
    /// increment), a gauge at 0, a histogram with empty buckets. Call it for every label set the component knows at install
    /// time (each cron and outcome, each queue and job kind), with the labels in the order the
    /// recording code uses. With `role`, only when this node campaigns for the role (series
    /// that only its leader records). The core exports its own series (every role campaigned
    /// for, the node session, the pruned tables) itself.
    pub fn export_series(
        &mut self,
        role: Option<&Role>,
        def: &'static MetricDef,
        labels: &[(&'static str, &str)],
    ) -> &mut Self {
        self.series.push((
            role.cloned(),
            def,
            labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
        ));
        self
    }

    /// Registers the pruning of a table the component owns: the `log_compactor` leader calls
    /// `forge.<function>(namespace, role, epoch, tenure, retention_ms, limit)` every
    /// `[cluster] compaction_interval` until it deletes fewer than `limit` rows. The function
    /// must fence itself (`forge.fence`) and return how many rows it deleted.
    pub fn prune(
        &mut self,
        table: &'static str,
        function: &'static str,
        retention: Duration,
    ) -> &mut Self {
        self.pruners.push(Pruner {
            table,
            function,
            retention,
        });
        self
    }

    /// The queues this node works and their concurrency, shown in membership.
    pub fn advertise_queues(&mut self, queues: BTreeMap<String, u32>) -> &mut Self {
        self.queues.extend(queues);
        self
    }

    /// The application's version, shown in membership (default: FORGE's own).
    pub fn version(&mut self, version: impl Into<String>) -> &mut Self {
        self.version = version.into();
        self
    }

    /// The URL of the admin API this node serves, shown in membership (`forge.nodes.admin_url`).
    pub fn admin_url(&mut self, url: impl Into<String>) -> &mut Self {
        self.admin_url = Some(url.into());
        self
    }

    /// The application's own migrations (`sqlx::migrate!()`), applied after FORGE's and before
    /// any leader task or service starts. Nodes starting together serialize on sqlx's
    /// migration lock, so exactly one applies them.
    pub fn app_migrations(&mut self, migrator: Migrator) -> &mut Self {
        self.app_migrator = Some(migrator);
        self
    }

    /// Installs a component.
    pub fn install(&mut self, component: Box<dyn Component>) -> Result<()> {
        let name = component.name();
        component.install(self).map_err(|err| match err {
            Error::Registration { message } => Error::Registration {
                message: format!("{name}: {message}"),
            },
            other => other,
        })
    }

    /// The roles this node campaigns for: every role it has work for, or, when `[node] roles`
    /// is set, the listed ones with work (all listed ones with `campaign_without_work`). Work
    /// the list hides is a warning: it runs only if another node campaigns for its role.
    fn campaigned_roles(&self) -> Result<Vec<Role>> {
        let configured = self.config.node.roles()?;
        let listed = configured.clone().unwrap_or_default();
        let mut keys = BTreeMap::new();
        for role in self.tasks.keys().chain(&listed) {
            let key = role.lock_key(&self.namespace);
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
        let campaigned = match configured {
            None => self.tasks.keys().cloned().collect(),
            Some(configured) => self.listed_roles(&configured),
        };
        for name in &self.config.node.prefer_roles {
            if !campaigned.iter().any(|role| role.name() == name) {
                warn!(target: "forge::leader", role = %name, node = %self.node_id,
                      "[node] prefer_roles names a role this node does not campaign for (no work is registered for it): the preference does nothing");
            }
        }
        Ok(campaigned)
    }

    /// The roles of a `[node] roles` list this node campaigns for, with a warning for each
    /// role with work the list leaves out.
    fn listed_roles(&self, configured: &[Role]) -> Vec<Role> {
        let mut campaigned = Vec::new();
        for role in configured {
            if self.tasks.contains_key(role) || self.config.node.campaign_without_work {
                campaigned.push(role.clone());
            } else {
                info!(target: "forge::leader", role = %role, node = %self.node_id,
                      "not campaigning: no work is registered for this role (set [node] campaign_without_work to lead it anyway)");
            }
        }
        for (role, tasks) in &self.tasks {
            if !configured.contains(role) {
                let work: Vec<&str> = tasks.iter().map(|(name, _)| name.as_str()).collect();
                warn!(target: "forge::leader", role = %role, node = %self.node_id, work = ?work,
                      roles = ?self.config.node.roles,
                      "not campaigning for a role this binary has work for: [node] roles (FORGE_ROLES) does not list it, so its work runs only where another node leads it; add it there, or unset roles to campaign for every role with work");
            }
        }
        campaigned
    }

    /// Connects (retrying for `connect_timeout`), refuses transaction poolers, applies the
    /// migrations, joins the cluster (refusing a duplicate node id), and starts campaigning
    /// and the services.
    pub async fn start(mut self) -> Result<Runtime> {
        let pruned_tables: Vec<&'static str> = self.pruners.iter().map(|p| p.table).collect();
        let pruners = Arc::new(std::mem::take(&mut self.pruners));
        let every = self.config.cluster.compaction_interval;
        self.leader_task(Role::LOG_COMPACTOR, "compaction", move |leadership| {
            duties::compact(leadership, pruners.clone(), every)
        });
        let campaigned = self.campaigned_roles()?;
        self.prepare_database().await?;
        let metrics = Metrics::with_app_metrics(std::mem::take(&mut self.app_metrics));
        if let Some(listen) = self.config.metrics.listen {
            metrics.serve(listen)?;
        }
        metrics.describe(&self.metric_defs);
        self.export_at_start(&metrics, &campaigned, &pruned_tables);
        let pool = db::pool(
            &self.config.database,
            self.options("pool")?,
            &self.config.cluster.leader_election,
        );
        let shutdown = CancellationToken::new();
        let (events, _) = broadcast::channel(1024);
        let handles: Vec<Arc<RoleHandle>> = campaigned
            .iter()
            .map(|role| Arc::new(RoleHandle::new(role.clone())))
            .collect();
        let (fault, faults) = watch::channel(None);
        let membership = self.membership(
            &handles,
            &events,
            &metrics,
            fault,
            shutdown.clone(),
            pool.clone(),
        )?;
        let standing = membership.standing.clone();
        let incarnation = membership.incarnation;
        let session = membership.join().await?;
        let leave = CancellationToken::new();
        let membership_task = tokio::spawn(membership.run(session, leave.clone()));

        let mut tasks = Vec::new();
        let mut roles = BTreeMap::new();
        for handle in handles {
            let role = handle.role.clone();
            let campaign = Campaign {
                handle: handle.clone(),
                key: role.lock_key(&self.namespace),
                namespace: self.namespace.clone(),
                node_id: self.node_id.clone(),
                election: self.config.cluster.leader_election.clone(),
                lock_options: self.options_for(&lock_application_name(&role, &self.node_id))?,
                pool: pool.clone(),
                tasks: self.tasks.remove(&role).unwrap_or_default(),
                events: events.subscribe(),
                shutdown: shutdown.clone(),
                metrics: metrics.clone(),
            };
            // The election's transitions are logged inside the role's span.
            let span = tracing::info_span!(target: "forge::leader", "role", role = %role);
            tasks.push(tokio::spawn(campaign.run().instrument(span)));
            roles.insert(role, handle);
        }
        let context = NodeContext {
            node_id: self.node_id.clone(),
            namespace: self.namespace.clone(),
            pool: pool.clone(),
            metrics,
            shutdown: shutdown.clone(),
            events,
            standing,
            incarnation,
        };
        for (name, service) in self.services {
            let service = service(context.clone());
            tasks.push(tokio::spawn(async move {
                service.await;
                tracing::debug!(target: "forge::node", service = %name, "service stopped");
            }));
        }
        info!(target: "forge::node", node = %self.node_id, roles = ?roles.keys().map(Role::name).collect::<Vec<_>>(), "node started");
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                context,
                roles,
                tasks: Mutex::new(tasks),
                membership: Mutex::new(Some((membership_task, leave))),
                faults,
                drain_budget: self.drain_budget,
            }),
        })
    }

    /// Every counter and histogram (and `forge_leader_is_leader`) of a known label set, at 0
    /// before the first event: the core's for each role campaigned for, the node session and the pruned
    /// tables, then the components' ([`Assembly::export_series`]).
    fn export_at_start(&self, metrics: &Metrics, campaigned: &[Role], pruned_tables: &[&str]) {
        metrics.export_zero(&defs::RECONNECTS, &[("session", "node")]);
        for role in campaigned {
            let labels = [("role", role.name())];
            for def in [
                &defs::IS_LEADER,
                &defs::ELECTIONS,
                &defs::FAILOVERS,
                &defs::LOCK_CONFLICTS,
                &defs::HANDOFF,
            ] {
                metrics.export_zero(def, &labels);
            }
            for reason in LossReason::ALL {
                metrics.export_zero(
                    &defs::LOSSES,
                    &[("role", role.name()), ("reason", reason.as_str())],
                );
            }
            let session = crate::metrics::lock_session(role);
            metrics.export_zero(&defs::RECONNECTS, &[("session", &session)]);
            if *role == Role::LOG_COMPACTOR {
                for table in pruned_tables {
                    metrics.export_zero(&defs::PRUNED, &[("table", table)]);
                }
            }
        }
        for (role, def, labels) in &self.series {
            if role.as_ref().is_none_or(|role| campaigned.contains(role)) {
                let labels: Vec<(&'static str, &str)> =
                    labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                metrics.export_zero(def, &labels);
            }
        }
    }

    fn options(&self, purpose: &str) -> Result<sqlx::postgres::PgConnectOptions> {
        self.options_for(&format!("forge:{purpose}:{}", self.node_id))
    }

    fn options_for(&self, application_name: &str) -> Result<sqlx::postgres::PgConnectOptions> {
        db::connect_options(&self.config.database, application_name)
    }

    /// First contact: connect patiently, refuse poolers, migrate (FORGE's, then the app's).
    async fn prepare_database(&mut self) -> Result<()> {
        // Migrations that find their objects there already (`CREATE SCHEMA IF NOT EXISTS`, sqlx's
        // own table) raise NOTICEs, which sqlx logs at INFO on every start: warnings only.
        let setup_options = self
            .options("setup")?
            .options([("client_min_messages", "warning")]);
        let patience = self.config.database.connect_timeout;
        let mut setup = db::connect_patiently(&setup_options, patience).await?;
        db::check_not_pooled(&setup_options, patience).await?;
        if self.config.database.migrate {
            schema::apply_schema(&mut setup, &self.migrations, &self.functions).await?;
        } else {
            schema::check_schema(&mut setup, &self.migrations, &self.functions).await?;
        }
        if let Some(migrator) = self.app_migrator.take() {
            migrator
                .run_direct(None, &mut setup, false)
                .await
                .map_err(Error::AppMigrate)?;
        }
        if setup.server_version_num().unwrap_or(0) < 140000 {
            warn!(target: "forge::leader",
                  "PostgreSQL older than 14 has no idle_session_timeout: a frozen leader is fenced by its followers within lease_duration + lock_timeout instead of lease_duration");
        }
        let _ = setup.close().await;
        Ok(())
    }

    fn membership(
        &self,
        handles: &[Arc<RoleHandle>],
        events: &broadcast::Sender<ListenerEvent>,
        metrics: &Metrics,
        fault: watch::Sender<Option<Fault>>,
        work: CancellationToken,
        pool: PgPool,
    ) -> Result<Membership> {
        let led: Vec<Arc<RoleHandle>> = handles.to_vec();
        let leading = Arc::new(move || {
            led.iter()
                .filter(|h| h.state.borrow().is_leader())
                .map(|h| h.role.name().to_owned())
                .collect::<Vec<_>>()
        });
        let waiting: Vec<(LockKey, Arc<RoleHandle>)> = handles
            .iter()
            .map(|h| (h.role.lock_key(&self.namespace), h.clone()))
            .collect();
        let reserves = Arc::new(move || {
            waiting
                .iter()
                .filter(|(_, h)| h.reserve.load(std::sync::atomic::Ordering::Relaxed))
                .map(|(key, h)| (*key, h.wake.clone()))
                .collect::<Vec<_>>()
        });
        let movable: Vec<Arc<RoleHandle>> = handles.to_vec();
        let moves = Arc::new(move |role: &str, to: String, why: String| {
            if let Some(handle) = movable.iter().find(|h| h.role.name() == role) {
                handle.moves.send_replace(Some(PlacementMove { to, why }));
            }
        });
        let queues: serde_json::Map<String, serde_json::Value> = self
            .queues
            .iter()
            .map(|(queue, concurrency)| (queue.clone(), (*concurrency).into()))
            .collect();
        Ok(Membership {
            namespace: self.namespace.clone(),
            node_id: self.node_id.clone(),
            incarnation: (fastrand::u64(..) >> 1) as i64,
            info: NodeInfo {
                hostname: hostname(),
                pid: std::process::id() as i32,
                version: self.version.clone(),
                roles: handles.iter().map(|h| h.role.name().to_owned()).collect(),
                work_roles: self.tasks.keys().map(|r| r.name().to_owned()).collect(),
                prefers: self.config.node.prefer_roles.clone(),
                queues: serde_json::Value::Object(queues),
                admin_url: self.admin_url.clone(),
            },
            options: self.options("node")?,
            config: self.config.cluster.membership.clone(),
            election: self.config.cluster.leader_election.clone(),
            channels: self.channels.clone(),
            events: events.clone(),
            leading,
            reserves,
            moves,
            spread: self.config.cluster.spread,
            metrics: metrics.clone(),
            last_session: std::sync::Mutex::new(None),
            fault,
            work,
            pool,
            standing: Standing::new(&self.config.cluster.membership),
        })
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// What services get: the node's identity, pool, metrics, notifications and shutdown signal.
#[derive(Clone)]
pub struct NodeContext {
    node_id: NodeId,
    namespace: LockNamespace,
    pool: PgPool,
    metrics: Metrics,
    shutdown: CancellationToken,
    events: broadcast::Sender<ListenerEvent>,
    standing: Standing,
    incarnation: i64,
}

impl NodeContext {
    /// Until when this node's running jobs are its own: while the node session is down and
    /// no heartbeat lands (not even through the pool), the scheduler leader may mark the node
    /// down after `down_after` and rescue its jobs elsewhere. Work that must not run beside
    /// its rescued successor stops at this instant (job workers do).
    pub fn standing(&self) -> &Standing {
        &self.standing
    }

    /// This node's id.
    pub fn node_id(&self) -> &NodeId {
        &self.node_id
    }

    /// This process's incarnation of the node (`forge.nodes.incarnation`): drawn at random when
    /// the node starts, the same through its rejoins, another after a restart.
    pub fn incarnation(&self) -> i64 {
        self.incarnation
    }

    /// The node's lock namespace (its FORGE cluster in the database).
    pub fn namespace(&self) -> &LockNamespace {
        &self.namespace
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

    /// Notifications on the channels registered with [`Assembly::listen`], and the node
    /// session's losses and restorations.
    pub fn subscribe(&self) -> broadcast::Receiver<ListenerEvent> {
        self.events.subscribe()
    }
}

/// A running node's core. Cheap to clone; all clones refer to the same node.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

struct RuntimeInner {
    context: NodeContext,
    roles: BTreeMap<Role, Arc<RoleHandle>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    membership: Mutex<Option<(JoinHandle<()>, CancellationToken)>>,
    /// Why the node stopped its work on its own, once it has.
    faults: watch::Receiver<Option<Fault>>,
    drain_budget: Duration,
}

impl Drop for RuntimeInner {
    fn drop(&mut self) {
        // A node dropped without `shutdown` still stops campaigning.
        self.context.shutdown.cancel();
        if let Some((_, leave)) = self.membership.get_mut().ok().and_then(Option::take) {
            leave.cancel();
        }
    }
}

impl Runtime {
    /// This node's id.
    pub fn id(&self) -> &NodeId {
        &self.inner.context.node_id
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

    /// Resolves when the node had to stop its work on its own, with why: another live node
    /// took this node's id while its session was down ([`Error::DuplicateNode`]). The node's
    /// work is already stopping then (as on [`Runtime::shutdown`], which still has to be
    /// called to finish). Pending forever otherwise.
    pub async fn fault(&self) -> Error {
        let mut faults = self.inner.faults.clone();
        if let Ok(fault) = faults.wait_for(Option::is_some).await
            && let Some(fault) = &*fault
        {
            return fault.to_error(self.id());
        }
        // The sender lives as long as the membership task: the node stopped without a fault.
        std::future::pending().await
    }

    /// Graceful shutdown: leaders stop taking new leader-only work, drain it (still renewing
    /// their leases) and hand over; services drain; then the node records its departure and
    /// closes. Idempotent.
    pub async fn shutdown(&self) {
        self.inner.context.shutdown.cancel();
        let tasks =
            std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        let bound = self.inner.drain_budget + Duration::from_secs(10);
        let aborts: Vec<_> = tasks.iter().map(|task| task.abort_handle()).collect();
        if timeout(bound, async {
            for task in tasks {
                let _ = task.await;
            }
        })
        .await
        .is_err()
        {
            // (A node cut off from PostgreSQL: its tasks wait on statements that never end.)
            warn!(target: "forge::node", node = %self.id(), "shutdown did not finish in time; stopping what is left");
            for abort in aborts {
                abort.abort();
            }
        }
        let membership = self
            .inner
            .membership
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((task, leave)) = membership {
            leave.cancel();
            let _ = timeout(Duration::from_secs(10), task).await;
        }
        // A connection lost in a silent network is never given back: do not wait for it.
        let _ = timeout(Duration::from_secs(5), self.inner.context.pool.close()).await;
        info!(target: "forge::node", node = %self.id(), "node stopped");
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
