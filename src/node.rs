//! The node: assembled in one place from the core, the crons, the job queue, and whatever the
//! application registers.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use forge_core::inspect::Cluster;
use forge_core::{
    Assembly, Component, Error, Leadership, Metrics, NodeContext, NodeId, Result, Role, RoleState,
    Runtime,
};
use forge_scheduler::inspect::Workload;
use forge_scheduler::jobs::{Job, JobRegistry, JobRunner, Jobs};
use forge_scheduler::{CronJob, CronRunner, IntoCron};
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::Config;

/// Something the application adds to the assembly (a leader task, a service).
type Addition = Box<dyn FnOnce(&mut Assembly) + Send>;

/// Builds a [`Node`]: register crons, jobs, leader-only work, services and your migrations,
/// then [`NodeBuilder::start`].
///
/// Every `#[cron]` and `#[job]` linked into the binary is registered automatically (see
/// [`NodeBuilder::auto_register`] for the caveats); [`NodeBuilder::cron`] and
/// [`NodeBuilder::job`] register explicitly.
///
/// ```no_run
/// use forge::{Config, Node, Role};
///
/// # async fn demo() -> forge::Result<()> {
/// let node = Node::builder(Config::from_env()?)
///     .leader_task(Role::SCHEDULER, "announce", |leadership| async move {
///         println!("leading {} at epoch {}", leadership.role(), leadership.epoch());
///         leadership.stopping().await;
///     })
///     .start()
///     .await?;
/// node.run_until_signal().await?;
/// # Ok(()) }
/// ```
pub struct NodeBuilder {
    config: Config,
    crons: Vec<CronJob>,
    jobs: JobRegistry,
    auto_register: bool,
    additions: Vec<Addition>,
    components: Vec<Box<dyn Component>>,
    migrator: Option<Migrator>,
    version: Option<String>,
    error: Option<forge_core::Error>,
}

impl NodeBuilder {
    fn new(config: Config) -> NodeBuilder {
        NodeBuilder {
            config,
            crons: Vec::new(),
            jobs: JobRegistry::default(),
            auto_register: true,
            additions: Vec::new(),
            components: Vec::new(),
            migrator: None,
            version: None,
            error: None,
        }
    }

    /// Registers a cron (a `#[cron]` function, or a [`CronJob`] built in code).
    pub fn cron(mut self, cron: impl IntoCron) -> Self {
        match cron.cron_job() {
            Ok(job) => self.crons.push(job),
            Err(err) => {
                self.error.get_or_insert(err);
            }
        }
        self
    }

    /// Registers a job type (a `#[job]` function).
    pub fn job<J: Job>(mut self, job: J) -> Self {
        if let Err(err) = self.jobs.add(job) {
            self.error.get_or_insert(err);
        }
        self
    }

    /// Whether every `#[cron]` and `#[job]` linked into the binary is registered (default:
    /// yes). Registration happens at link time through the `inventory` crate: a `#[cron]` in a
    /// library crate is only linked if the binary uses something from that crate, so a
    /// library of crons should be registered explicitly (or referenced), and test binaries
    /// that start several differently-equipped nodes should turn this off.
    pub fn auto_register(mut self, enabled: bool) -> Self {
        self.auto_register = enabled;
        self
    }

    /// Registers leader-only work for `role`: `task` is called with a [`Leadership`] each time
    /// this node wins the role, and its future is dropped the moment the leadership is lost.
    /// On a graceful shutdown [`Leadership::stopping`] resolves first and the future gets up
    /// to `drain_timeout` to finish (the lease is still renewed meanwhile).
    pub fn leader_task<F, Fut>(mut self, role: Role, name: impl Into<String>, task: F) -> Self
    where
        F: Fn(Leadership) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let name = name.into();
        self.additions.push(Box::new(move |assembly| {
            assembly.leader_task(role, name, task);
        }));
        self
    }

    /// Registers a service that runs on every node from start to shutdown; it must return soon
    /// after [`NodeContext::shutdown`] is cancelled.
    pub fn service<F, Fut>(mut self, name: impl Into<String>, service: F) -> Self
    where
        F: FnOnce(NodeContext) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let name = name.into();
        self.additions.push(Box::new(move |assembly| {
            assembly.service(name, service);
        }));
        self
    }

    /// Adds a [`Component`]: work that brings its own leader tasks, services, LISTEN channels,
    /// metrics and shutdown budget (the crons and the job queue are components too).
    pub fn component(mut self, component: impl Component) -> Self {
        self.components.push(Box::new(component));
        self
    }

    /// The application's own migrations (`sqlx::migrate!()`): applied after FORGE's and
    /// before any cron, job or leader task starts. Nodes starting together serialize on sqlx's
    /// migration lock, so the application's tables exist before its crons run, and exactly one
    /// node applies each migration.
    pub fn migrations(mut self, migrator: Migrator) -> Self {
        self.migrator = Some(migrator);
        self
    }

    /// Serves the application's own metrics with FORGE's, so that one scrape sees both:
    /// `render` returns them in the Prometheus text format, and each scrape of `[metrics]
    /// listen` and each [`Node::render_metrics`] appends its text to FORGE's. With the
    /// `metrics` crate and `metrics-exporter-prometheus`, pass
    /// `move || handle.render()` (the `PrometheusHandle` of the recorder you installed); then
    /// serve `[metrics] listen`, or `node.render_metrics()` on your own router's `/metrics`.
    ///
    /// A family must appear once in a scrape (promtool refuses the text otherwise, Prometheus
    /// drops the second sample of a series): FORGE exports the process' figures (`process_*`)
    /// unless your text has a family of the same name (the `metrics-process` crate's), and
    /// names its own `forge_*`, a prefix your metrics must not use.
    pub fn app_metrics<F>(mut self, render: F) -> Self
    where
        F: Fn() -> String + Send + Sync + 'static,
    {
        self.additions.push(Box::new(move |assembly| {
            assembly.app_metrics(render);
        }));
        self
    }

    /// The application's version, shown in membership (`forge.nodes.version`); default:
    /// FORGE's own.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// The configuration the node will start with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Validates everything registered, connects (retrying for `connect_timeout`), refuses
    /// transaction poolers and duplicate node ids, applies FORGE's migrations and yours, and
    /// starts campaigning: crons run on the leaders of their roles, jobs on every node.
    pub async fn start(mut self) -> Result<Node> {
        if let Some(err) = self.error.take() {
            return Err(err);
        }
        self.config.validate()?;
        if self.auto_register {
            for cron in forge_scheduler::__private::registered_crons() {
                self.crons.push(cron?);
            }
            forge_scheduler::__private::register_jobs(&mut self.jobs)?;
        }
        let mut assembly = Assembly::new(self.config.core())?;
        assembly.schema(crate::migrate::SCHEMA);
        let crons =
            CronRunner::new(self.crons, self.config.cron.clone())?.stored_crons(self.jobs.clone());
        assembly.install(Box::new(crons))?;
        assembly.install(Box::new(JobRunner::new(
            self.jobs,
            self.config.jobs.clone(),
        )))?;
        for component in self.components {
            assembly.install(component)?;
        }
        for addition in self.additions {
            addition(&mut assembly);
        }
        if let Some(migrator) = self.migrator {
            assembly.app_migrations(migrator);
        }
        if let Some(version) = self.version {
            assembly.version(version);
        }
        // Bound before joining, so that membership records the URL from the first heartbeat.
        let admin_listener = match self.config.admin.listen {
            Some(listen) => {
                let bound = match forge_admin::bind(listen).await {
                    Ok(listener) => listener.local_addr().map(|addr| (listener, addr)),
                    Err(err) => Err(err),
                };
                let (listener, addr) = bound.map_err(|err| forge_core::Error::Config {
                    path: None,
                    line: None,
                    key: "admin.listen".to_owned(),
                    message: format!("cannot serve the admin API on {listen}: {err}"),
                })?;
                let url = forge_admin::advertised_url(addr);
                assembly.admin_url(url.clone());
                Some((listener, url))
            }
            None => None,
        };
        let runtime = assembly.start().await?;
        let context = runtime.context();
        let jobs = Jobs::for_node(
            context.pool().clone(),
            context.namespace(),
            context.metrics().clone(),
        );
        let mut node = Node {
            runtime,
            jobs,
            drift_after: self.config.cluster.membership.drift_after,
            config: Arc::new(self.config),
            admin: None,
        };
        if let Some((listener, url)) = admin_listener {
            node.admin = Some(Arc::new(AdminServer::start(&node, listener, url)));
        }
        Ok(node)
    }
}

/// The admin API a node serves on `[admin] listen`: stopped at the end of the node's
/// shutdown, or when the last handle of the node is dropped.
struct AdminServer {
    url: String,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl AdminServer {
    fn start(node: &Node, listener: tokio::net::TcpListener, url: String) -> AdminServer {
        let (stop, stopped) = oneshot::channel::<()>();
        let state = node.admin_state_at(Some(&url));
        let id = node.id().clone();
        tracing::info!(target: "forge::admin", node = %id, url = %url, "serving the admin API");
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(err) = forge_admin::serve(listener, state, shutdown).await {
                tracing::error!(target: "forge::admin", node = %id, error = %err, "the admin API stopped");
            }
        });
        AdminServer {
            url,
            stop: Mutex::new(Some(stop)),
            task: Mutex::new(Some(task)),
        }
    }

    async fn stop(&self) {
        let stop = self.stop.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(stop);
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut task) = task
            && tokio::time::timeout(Duration::from_secs(5), &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

/// A running node. Cheap to clone; all clones refer to the same node.
#[derive(Clone)]
pub struct Node {
    runtime: Runtime,
    jobs: Jobs,
    drift_after: std::time::Duration,
    config: Arc<Config>,
    admin: Option<Arc<AdminServer>>,
}

impl Node {
    /// A builder for a node with this configuration.
    pub fn builder(config: Config) -> NodeBuilder {
        NodeBuilder::new(config)
    }

    /// This node's id.
    pub fn id(&self) -> &NodeId {
        self.runtime.id()
    }

    /// The node's connection pool (for your own queries as well).
    pub fn pool(&self) -> &PgPool {
        self.runtime.context().pool()
    }

    /// Enqueue, inspect and cancel jobs through this node's pool and namespace.
    pub fn jobs(&self) -> &Jobs {
        &self.jobs
    }

    /// The cluster's read models (leaders, history, events, nodes, series) through this
    /// node's pool.
    pub fn cluster(&self) -> Cluster {
        Cluster::new(
            self.pool().clone(),
            self.context().namespace().clone(),
            self.drift_after,
        )
    }

    /// The work's read models (crons, ticks, jobs, queues) through this node's pool.
    pub fn workload(&self) -> Workload {
        Workload::new(self.pool().clone(), self.context().namespace().clone())
    }

    /// The URL of the admin API this node serves (`[admin] listen`), as recorded in membership.
    pub fn admin_url(&self) -> Option<&str> {
        self.admin.as_ref().map(|admin| admin.url.as_str())
    }

    /// The admin API as an axum router, to mount in your own application:
    /// `app.merge(node.admin_router())`: this node's read models, `[admin]` access rules, its
    /// configuration (redacted) and its roles. Serve the application with
    /// `into_make_service_with_connect_info::<SocketAddr>()` so that the audit trail names each
    /// client's address. (A process that is no node: [`forge::admin::router`](crate::admin::router).)
    pub fn admin_router(&self) -> forge_admin::axum::Router {
        forge_admin::router(self.admin_state_at(self.admin_url()))
    }

    fn admin_state_at(&self, url: Option<&str>) -> forge_admin::AdminState {
        let mut local = forge_admin::LocalNode::new(self.id().clone())
            .stopping(self.context().shutdown().clone());
        for role in self.roles() {
            if let Some(state) = self.watch_role(&role) {
                local = local.role(role, state);
            }
        }
        if let Some(url) = url {
            local = local.admin_url(url);
        }
        forge_admin::AdminState::new(self.cluster(), self.workload(), self.config.admin.clone())
            .with_config(&self.config.redacted())
            .with_local_node(local)
    }

    /// The node's context, as services get it.
    pub fn context(&self) -> &NodeContext {
        self.runtime.context()
    }

    /// The roles this node campaigns for.
    pub fn roles(&self) -> Vec<Role> {
        self.runtime.roles()
    }

    /// Whether this node leads a role (with its epoch) or follows (with the current leader);
    /// `None` if it does not campaign for it.
    pub fn role_state(&self, role: &Role) -> Option<RoleState> {
        self.runtime.role_state(role)
    }

    /// A receiver that sees every state change of a role.
    pub fn watch_role(&self, role: &Role) -> Option<watch::Receiver<RoleState>> {
        self.runtime.watch_role(role)
    }

    /// This node's current leadership of a role, if it leads it.
    pub fn leadership(&self, role: &Role) -> Option<Leadership> {
        self.runtime.leadership(role)
    }

    /// The node's metrics registry.
    pub fn metrics(&self) -> &Metrics {
        self.runtime.context().metrics()
    }

    /// The node's metrics in the Prometheus text format, the application's included
    /// ([`NodeBuilder::app_metrics`]): what `[metrics] listen` serves, for your own router's
    /// `/metrics`. With many series it takes a while (10,000 crons: about 0.16 s on the
    /// scheduler's leader): call it off the async workers (`tokio::task::spawn_blocking`).
    pub fn render_metrics(&self) -> String {
        self.metrics().render()
    }

    /// Graceful shutdown: leaders stop taking new leader-only work, drain it (still renewing
    /// their leases) for up to `drain_timeout`, and hand over (a waiting follower takes over
    /// within milliseconds); job workers drain for up to `[jobs] drain_timeout`; then the node
    /// records its departure and closes. The admin API it serves answers 503 on
    /// `/api/health/ready` meanwhile, and stops last. Idempotent.
    pub async fn shutdown(&self) {
        self.runtime.shutdown().await;
        if let Some(admin) = &self.admin {
            admin.stop().await;
        }
    }

    /// Runs until SIGTERM or ctrl-c, then shuts down gracefully and returns `Ok`. Returns
    /// the error, after the same shutdown, when the node had to stop on its own (see
    /// [`Node::fault`]): exit non-zero then, so that the supervisor notices.
    pub async fn run_until_signal(&self) -> Result<()> {
        let fault = tokio::select! {
            _ = forge_core::shutdown_signal() => {
                tracing::info!(target: "forge::node", node = %self.id(), "shutdown requested");
                None
            }
            fault = self.fault() => Some(fault),
        };
        self.shutdown().await;
        fault.map_or(Ok(()), Err)
    }

    /// Resolves when the node had to stop its work on its own, with why: another live node
    /// took this node's id while this node's session to PostgreSQL was down (two nodes with
    /// one id would rescue each other's jobs), [`Error::DuplicateNode`]. The node's work is
    /// already stopping then; call [`Node::shutdown`] to finish. Pending while all is well.
    pub async fn fault(&self) -> Error {
        self.runtime.fault().await
    }
}
