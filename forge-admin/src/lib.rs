//! # FORGE admin HTTP API
//!
//! JSON over HTTP for operators and their tools: who leads what, the nodes and the cluster's
//! history, crons, jobs and queues, and the writes an operator needs at 3 a.m. (pause a cron,
//! retry the dead jobs of a queue, ask a leader to step down). Every answer comes from
//! PostgreSQL through the read models ([`forge_core::inspect::Cluster`],
//! [`forge_scheduler::inspect::Workload`]), so **any node answers any request** for the
//! whole cluster, and a step-down travels through the database to whichever node leads.
//!
//! A node serves it itself when `[admin] listen` (or `FORGE_ADMIN_LISTEN`) is set, and records
//! the URL in membership (`GET /api/cluster/nodes` shows every node's `admin_url`). Or mount
//! [`router`] in your own axum application (`node.admin_router()` with the
//! `forge` facade).
//!
//! ## Endpoints
//!
//! | method and path | what |
//! |---|---|
//! | `GET /api/health/live` | 200 while the process serves (liveness probe; no token needed) |
//! | `GET /api/health/ready` | 200 when PostgreSQL answers within 2 s, else 503 (readiness probe; no token needed); 503 while the node shuts down |
//! | `GET /api/health/leader/{role}` | 200 on the role's leader, 503 elsewhere with the leader in `Forge-Leader` (for HAProxy, nginx, Kubernetes; no token needed; no database round trip) |
//! | `GET /api/meta` | the vocabulary: `event_kinds`, `event_groups` (`leadership`, `membership`, `operators`: the kinds of each), `job_states`, `job_actions` (each action with the `states` it applies to); from the Rust enums, what the dashboard renders its filters and confirmations from (no token needed: no data of the cluster) |
//! | `GET /api/cluster/status` | the [`ClusterStatus`](forge_core::inspect::ClusterStatus): the database's `now`, nodes by state, the expected roles and each one's leader, roles without one, work with nowhere to run (`unserved`: a queue with waiting jobs no live node works, a role with work no live node campaigns for), `healthy`, `problems` and `warnings` |
//! | `GET /api/cluster/leaders` | every role's current (or last) leadership, with `led` |
//! | `GET /api/cluster/leaders/{role}` | one role's |
//! | `GET /api/cluster/history?role=&limit=&before=` | tenures, newest first: failover or handoff, the gap before each (`gap_ms`) and what it is measured from (`gap_from`) |
//! | `GET /api/cluster/nodes` | every node with its state and `admin_url`, and the counts |
//! | `GET /api/cluster/nodes/{node_id}` | one node |
//! | `GET /api/cluster/events?kind=&node=&role=&after=&limit=&before=` | the events history (`kind`: comma-separated) |
//! | `GET /api/cluster/config` | the serving node's configuration, passwords and tokens redacted |
//! | `GET /api/cluster/this` | the serving node: id, roles and its state in each |
//! | `POST /api/cluster/roles/{role}/step-down` | ask the role's leader to hand over gracefully (202) |
//! | `GET /api/crons` | every cron: next run, last tick, skipped and missing ticks, paused; a stored cron's job and policies (`job_options`, as `PUT` takes them) |
//! | `GET /api/crons/{name}?limit=&before=` | one cron and a page of its ticks |
//! | `GET /api/crons/{name}/ticks?limit=&before=` | a page of its ticks (`before`: the `next` cursor) |
//! | `POST /api/crons/{name}/pause`, `.../resume` | pause or resume it |
//! | `POST /api/crons/{name}/trigger` | run it now on its role's leader (202, with the tick's instant) |
//! | `PUT /api/crons/{name}` | create or change a stored cron (body: `expression`, `kind`, optional `timezone`, `args`, `catch_up`, `catch_up_window`, `overlap`, `interrupted`, `timeout`): `result` `created`, `updated` or `unchanged`; 409 for a cron of code's name |
//! | `DELETE /api/crons/{name}` | delete a stored cron (409 for a cron of code) |
//! | `GET /api/jobs?state=&queue=&kind=&args=&limit=&before=` | jobs, newest first (`state`: comma-separated; `args`: JSON the arguments contain) |
//! | `GET /api/jobs/{id}` | one job, with each failed attempt's error |
//! | `POST /api/jobs/{id}/retry`, `.../cancel`; `DELETE /api/jobs/{id}` | one job (409 when its state refuses: deleting a running job) |
//! | `POST /api/jobs/bulk/retry`, `.../cancel`, `.../delete` | every job matching the JSON filter body, in batches |
//! | `GET /api/queues` | depth by state (`pending`: waiting for parents), oldest available job's age, paused, limits and why jobs wait on them |
//! | `POST /api/queues/{queue}/pause`, `.../resume` | stop or restart claims of a queue; a queue the cluster does not know is a 404, unless the pause's body is `{"new": true}` |
//! | `PUT /api/queues/{queue}/limits`, `DELETE` | set a queue's cluster-wide limits (body `{"global_concurrency": 4, "rate": "100/1m", "rate_key": "customer_id"}`, each optional: left out, no such limit; `"new": true` for a queue the cluster does not know), or give them back to forge.toml |
//! | `GET /api/kinds/limits` | every job kind with cluster-wide limits, who set them, what counts against them and whether the global one is reached |
//! | `PUT /api/kinds/{kind}/limits`, `DELETE` | set a job kind's cluster-wide limits (the body as a queue's, without `new`), or give them back to the code |
//!
//! Pages are `{ "items": [...], "next": cursor | null }`: pass `next` as `before` for the
//! following page; `limit` is 1 to 500 (default 50). Errors are
//! `{ "error": "...", "code": "...", "status": n }`: 400 bad input (malformed JSON, unknown
//! query parameter or state, invalid name, a body sent to a write that takes none), 401
//! missing or wrong token, 403 not allowed, 404 unknown id or endpoint, 409 a change the
//! item's state refuses, 413 a body over 1 MiB, 503 PostgreSQL unreachable or too slow. Never a
//! stack trace, never a secret. While PostgreSQL does not answer, a request that needs it is a
//! 503 within the readiness bound (2 s), with `"database": "unreachable"` and `since`.
//!
//! The bulk body is the list filter as JSON, e.g. `{ "state": ["dead"], "queue": "mail" }`
//! (`state` also as `"dead,retryable"`; `kind`; `args`); an empty filter is refused unless it
//! says `"all": true`.
//!
//! ## Access
//!
//! * Writes (every non-GET) need `Authorization: Bearer <[admin] token>`. With no token
//!   configured writes are refused (403); `[admin] read_only = true` refuses them all.
//! * Reads are open unless `[admin] read_token` is set; then they need it (or the write
//!   token). The health probes and `/api/meta` are always open.
//! * Tokens are compared in constant time and never logged or shown (`/api/cluster/config`
//!   redacts them and the database password).
//! * Every write records an `admin_action` (or `step_down`) event with `by` = `api <peer
//!   address>`; with [`AdminState::trust_forwarded_for`] (behind your own reverse proxy
//!   only), `api <X-Forwarded-For's first address> via <peer>`.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> std::io::Result<()> {
//! use forge_admin::AdminState;
//! use forge_core::inspect::Cluster;
//! use forge_core::{AdminConfig, LockNamespace};
//! use forge_scheduler::inspect::Workload;
//!
//! let namespace = LockNamespace::default();
//! let state = AdminState::new(
//!     Cluster::new(pool.clone(), namespace.clone(), std::time::Duration::from_secs(15)),
//!     Workload::new(pool, namespace),
//!     AdminConfig::default(),
//! );
//! let app = forge_admin::axum::Router::new().merge(forge_admin::router(state));
//! # let _ = app; Ok(()) }
//! ```

mod auth;
mod cluster;
mod dashboard;
mod error;
mod extract;
mod leader;
mod meta;
mod redact;
mod stored;
mod views;
mod work;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use forge_core::inspect::Cluster;
use forge_core::{AdminConfig, NodeId, Role, RoleState};
use forge_scheduler::inspect::Workload;
use forge_scheduler::jobs::JobAction;
use futures_util::FutureExt as _;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use axum;
pub use error::{ApiError, ApiResult};
pub use leader::{
    LEADER_HEADER, LEADER_URL_HEADER, Leader, LeaderOnly, LeaderOnlyService, LeaderSource,
};

/// Everything the API needs: the read models (and so the pool and namespace), the access
/// rules, and optionally the serving node and its configuration. Cheap to clone.
#[derive(Clone)]
pub struct AdminState {
    cluster: Cluster,
    workload: Workload,
    access: Arc<AdminConfig>,
    config: Option<Arc<serde_json::Value>>,
    local: Option<Arc<LocalNode>>,
    trust_forwarded_for: bool,
    read_timeout: Duration,
    write_timeout: Duration,
    ready_timeout: Duration,
    database: Arc<DatabaseWatch>,
}

/// What the API last saw of PostgreSQL: since when it has been unreachable, if it is.
#[derive(Debug, Default)]
struct DatabaseWatch {
    down_since: std::sync::Mutex<Option<DateTime<Utc>>>,
}

impl DatabaseWatch {
    /// PostgreSQL answered: it is reachable.
    fn reached(&self) {
        if let Ok(mut since) = self.down_since.lock() {
            *since = None;
        }
    }

    /// PostgreSQL did not answer: unreachable since the first such answer.
    fn failed(&self) -> DateTime<Utc> {
        match self.down_since.lock() {
            Ok(mut since) => *since.get_or_insert_with(Utc::now),
            Err(_) => Utc::now(),
        }
    }
}

impl AdminState {
    /// The API over these read models, with these access rules (`[admin]`: `token`,
    /// `read_token`, `read_only`; `listen` is not used here).
    pub fn new(cluster: Cluster, workload: Workload, access: AdminConfig) -> AdminState {
        AdminState {
            cluster,
            workload,
            access: Arc::new(access),
            config: None,
            local: None,
            trust_forwarded_for: false,
            read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(60),
            ready_timeout: Duration::from_secs(2),
            database: Arc::new(DatabaseWatch::default()),
        }
    }

    /// The configuration `GET /api/cluster/config` shows, redacted here: values of keys
    /// naming a secret (`token`, `password`, ...) and the password of every connection URL
    /// are hidden.
    pub fn with_config<T: serde::Serialize>(mut self, config: &T) -> AdminState {
        let mut value = serde_json::to_value(config).unwrap_or(serde_json::Value::Null);
        redact::redact(&mut value);
        self.config = Some(Arc::new(value));
        self
    }

    /// The node serving the API (`GET /api/cluster/this`, readiness while it shuts down).
    pub fn with_local_node(mut self, node: LocalNode) -> AdminState {
        self.local = Some(Arc::new(node));
        self
    }

    /// Whether the audit trail names the first `X-Forwarded-For` address as the client. Only
    /// behind a reverse proxy of your own that sets the header: anyone can send it.
    pub fn trust_forwarded_for(mut self, trust: bool) -> AdminState {
        self.trust_forwarded_for = trust;
        self
    }

    /// How long a read (default 10 s) and a write (default 60 s; a bulk action goes on in the
    /// background after that) may wait for PostgreSQL before the answer is a 503.
    pub fn timeouts(mut self, read: Duration, write: Duration) -> AdminState {
        self.read_timeout = read;
        self.write_timeout = write;
        self
    }

    /// The cluster's read models.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The work's read models.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// Fails fast while PostgreSQL is unreachable: a pool connection within the readiness
    /// bound (2 s), or a 503 saying since when the database is unreachable (or that the pool is
    /// busy), instead of waiting for the pool's `connect_timeout` on every request.
    async fn reachable(&self) -> ApiResult<()> {
        let pool = self.cluster.pool();
        let failure = match tokio::time::timeout(self.ready_timeout, pool.acquire()).await {
            Ok(Ok(conn)) => {
                drop(conn);
                self.database.reached();
                return Ok(());
            }
            Ok(Err(err)) => err.to_string(),
            Err(_)
                if pool.size() >= pool.options().get_max_connections() && pool.num_idle() == 0 =>
            {
                return Err(ApiError::unavailable(format!(
                    "no database connection was free within {} s: all {} of the pool's connections are busy",
                    self.ready_timeout.as_secs_f64(),
                    pool.size()
                ))
                .with("database", "busy"));
            }
            Err(_) => format!(
                "no connection could be opened within {} s",
                self.ready_timeout.as_secs_f64()
            ),
        };
        Err(self.unreachable(&failure))
    }

    /// A 503 for a database that does not answer, with since when (`since`, RFC 3339).
    fn unreachable(&self, failure: &str) -> ApiError {
        let since = self.database.failed();
        tracing::debug!(target: "forge::admin", error = %failure, %since, "the database is unreachable");
        ApiError::unavailable(format!(
            "the database is unreachable (since {}): {failure}",
            since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ))
        .with("database", "unreachable")
        .with(
            "since",
            since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        )
    }

    /// A failed request's error; an outage (503) also marks the database unreachable.
    fn failed(&self, err: forge_core::Error) -> ApiError {
        let err = ApiError::from(err);
        if err.status() == StatusCode::SERVICE_UNAVAILABLE {
            let since = self.database.failed();
            return err.with("database", "unreachable").with(
                "since",
                since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            );
        }
        err
    }

    /// Runs a read, bounded by the read timeout (failing fast while PostgreSQL is unreachable).
    pub(crate) async fn read<T>(
        &self,
        query: impl Future<Output = forge_core::Result<T>>,
    ) -> ApiResult<T> {
        self.reachable().await?;
        match tokio::time::timeout(self.read_timeout, query).await {
            Ok(result) => result.map_err(|err| self.failed(err)),
            Err(_) => Err(ApiError::unavailable(format!(
                "the database did not answer within {} s",
                self.read_timeout.as_secs_f64()
            ))),
        }
    }

    /// Runs a write on its own task (a client that goes away does not cut it short), bounded
    /// by the write timeout (failing fast while PostgreSQL is unreachable).
    pub(crate) async fn write<T: Send + 'static>(
        &self,
        action: impl Future<Output = forge_core::Result<T>> + Send + 'static,
    ) -> ApiResult<T> {
        self.reachable().await?;
        let task = tokio::spawn(action);
        match tokio::time::timeout(self.write_timeout, task).await {
            Ok(Ok(result)) => result.map_err(|err| self.failed(err)),
            Ok(Err(err)) => {
                tracing::error!(target: "forge::admin", error = %err, "admin action failed");
                Err(ApiError::internal())
            }
            Err(_) => Err(ApiError::unavailable(format!(
                "the database did not answer within {} s: the action goes on in the background \
                 and may or may not be applied; see GET /api/cluster/events?kind=admin_action",
                self.write_timeout.as_secs_f64()
            ))),
        }
    }
}

/// The node that serves the API, as `GET /api/cluster/this` shows it: its id, the roles it
/// campaigns for and its state in each (watched, so the answer is always current), its admin
/// URL, and whether it is shutting down (readiness is then 503).
pub struct LocalNode {
    node_id: NodeId,
    roles: Vec<(Role, watch::Receiver<RoleState>)>,
    stopping: Option<CancellationToken>,
    admin_url: Option<String>,
}

impl LocalNode {
    /// The node with this id, no roles yet.
    pub fn new(node_id: NodeId) -> LocalNode {
        LocalNode {
            node_id,
            roles: Vec::new(),
            stopping: None,
            admin_url: None,
        }
    }

    /// A role it campaigns for, and the receiver of its state (`Node::watch_role`).
    pub fn role(mut self, role: Role, state: watch::Receiver<RoleState>) -> LocalNode {
        self.roles.push((role, state));
        self
    }

    /// Cancelled when the node begins to shut down.
    pub fn stopping(mut self, token: CancellationToken) -> LocalNode {
        self.stopping = Some(token);
        self
    }

    /// The URL it serves the API on.
    pub fn admin_url(mut self, url: impl Into<String>) -> LocalNode {
        self.admin_url = Some(url.into());
        self
    }

    /// Its state in `role`, if it campaigns for it.
    fn state(&self, role: &Role) -> Option<RoleState> {
        self.roles
            .iter()
            .find(|(r, _)| r == role)
            .map(|(_, state)| state.borrow().clone())
    }

    fn is_stopping(&self) -> bool {
        self.stopping
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
    }
}

/// The admin API as an axum [`Router`] with its state: merge or nest it into your own
/// application. The audit trail names the client's address only when the application is
/// served with `into_make_service_with_connect_info::<SocketAddr>()` (as [`serve`] does).
pub fn router(state: AdminState) -> Router {
    let guarded = Router::new()
        .route("/api/cluster/status", get(cluster::status))
        .route("/api/cluster/leaders", get(cluster::leaders))
        .route("/api/cluster/leaders/{role}", get(cluster::leader))
        .route("/api/cluster/history", get(cluster::history))
        .route("/api/cluster/nodes", get(cluster::nodes))
        .route("/api/cluster/nodes/{node_id}", get(cluster::node))
        .route("/api/cluster/events", get(cluster::events))
        .route("/api/cluster/config", get(cluster::config))
        .route("/api/cluster/this", get(cluster::this))
        .route(
            "/api/cluster/roles/{role}/step-down",
            post(cluster::step_down),
        )
        .route("/api/crons", get(work::crons))
        .route(
            "/api/crons/{name}",
            get(work::cron)
                .put(stored::upsert_cron)
                .delete(stored::delete_cron),
        )
        .route("/api/crons/{name}/ticks", get(work::ticks))
        .route("/api/crons/{name}/pause", work::cron_paused(true))
        .route("/api/crons/{name}/resume", work::cron_paused(false))
        .route("/api/crons/{name}/trigger", post(work::trigger_cron))
        .route("/api/jobs", get(work::jobs))
        .route("/api/jobs/bulk/{action}", post(work::bulk))
        .route(
            "/api/jobs/{id}",
            get(work::job).merge(work::job_action(JobAction::Delete)),
        )
        .route("/api/jobs/{id}/retry", work::job_action(JobAction::Retry))
        .route("/api/jobs/{id}/cancel", work::job_action(JobAction::Cancel))
        .route("/api/queues", get(work::queues))
        .route("/api/queues/{queue}/pause", post(work::pause_queue))
        .route("/api/queues/{queue}/resume", post(work::resume_queue))
        .route(
            "/api/queues/{queue}/limits",
            axum::routing::put(work::set_queue_limits).delete(work::reset_queue_limits),
        )
        .route("/api/kinds/limits", get(work::kind_limits))
        .route(
            "/api/kinds/{kind}/limits",
            axum::routing::put(work::set_kind_limits).delete(work::reset_kind_limits),
        )
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::guard));
    Router::new()
        .route("/api/health/live", get(cluster::live))
        .route("/api/health/ready", get(cluster::ready))
        .route("/api/health/leader/{role}", get(leader::probe))
        .route("/api/meta", get(meta::meta))
        .merge(guarded)
        .merge(dashboard::routes(&state))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(extract::MAX_BODY))
        .layer(middleware::from_fn(catch_panic))
        .with_state(state)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "no such endpoint: {} {} (the endpoints are listed in the guide's \"Admin API\" chapter, docs/src/admin-api.md)",
        req.method(),
        req.uri().path()
    ))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

/// A handler that panics answers 500 (and the panic is logged), the connection stays up.
async fn catch_panic(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    match AssertUnwindSafe(next.run(req)).catch_unwind().await {
        Ok(response) => response,
        Err(_) => {
            tracing::error!(target: "forge::admin", %method, %path, "admin API handler panicked");
            ApiError::internal().into_response()
        }
    }
}

/// Binds the API's listener (`[admin] listen`).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The URL other machines reach a listener on: its address, or this host's name when it
/// listens on every interface (`0.0.0.0`, `[::]`).
pub fn advertised_url(local: SocketAddr) -> String {
    let port = local.port();
    match local.ip() {
        ip if ip.is_unspecified() => format!("http://{}:{port}", hostname()),
        IpAddr::V4(ip) => format!("http://{ip}:{port}"),
        IpAddr::V6(ip) => format!("http://[{ip}]:{port}"),
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Serves the API on `listener` until `shutdown` resolves (then finishes the requests in
/// flight). The audit trail names each client by its address.
pub async fn serve(
    listener: TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
