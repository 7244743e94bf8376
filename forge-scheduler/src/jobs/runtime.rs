//! Wiring: what `install` adds to a node (the per-node service with workers and heartbeats, the
//! scheduler leader's maintenance, the role workers), the state they share, and the metrics.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use forge_core::{Error, JobsConfig, Metrics, NodeBuilder, NodeContext, Result, Role};
use sqlx::Row;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::sleep;
use tracing::{info, warn};

use super::{JobRegistry, JobType, maintenance, validate_queue, worker};

/// Jobs became available: payload `<namespace> <queue>` or `<namespace> @<role>`.
pub(crate) const CHANNEL_AVAILABLE: &str = "forge_jobs";
/// A scheduled job or retry is due: payload `<namespace> <unix ms>`.
pub(crate) const CHANNEL_DUE: &str = "forge_jobs_due";
/// Cancel a running job: payload `<namespace> <node> <job id>`.
pub(crate) const CHANNEL_CANCEL: &str = "forge_jobs_cancel";

/// Every job metric, described once (name, kind, help).
const METRICS: &[(&str, &str, &str)] = &[
    (
        "forge_job_enqueued_total",
        "counter",
        "Jobs inserted through this node's client (node.jobs()), by queue and job",
    ),
    (
        "forge_job_completed_total",
        "counter",
        "Attempts that completed their job, recorded by this node",
    ),
    (
        "forge_job_failed_total",
        "counter",
        "Attempts that failed on this node (error, timeout, panic, discard), whatever follows",
    ),
    (
        "forge_job_retried_total",
        "counter",
        "Failed attempts on this node after which the job will be retried",
    ),
    (
        "forge_job_dead_total",
        "counter",
        "Jobs dead-lettered by this node: out of attempts, discarded, or rescued with no attempts left",
    ),
    (
        "forge_job_cancelled_total",
        "counter",
        "Running jobs this node stopped because they were cancelled, and rescued jobs cancelled",
    ),
    (
        "forge_job_rescued_total",
        "counter",
        "Running jobs of dead, frozen or restarted nodes given back by this node (scheduler leader, or the node itself on start)",
    ),
    (
        "forge_job_duration_seconds",
        "histogram",
        "How long attempts took on this node, whatever their outcome",
    ),
    (
        "forge_job_pickup_latency_seconds",
        "histogram",
        "From when a job was due (enqueued, run-at reached, backoff over) to its claim by this node (database clock)",
    ),
    (
        "forge_job_queue_depth",
        "gauge",
        "Unfinished jobs by queue, job and state, as of the scheduler leader's last maintenance pass (reported by the leader only)",
    ),
];

/// Registers the job metrics' descriptions in a node's registry.
pub(crate) fn describe_metrics(metrics: &Metrics) {
    metrics.describe(METRICS);
}

/// One worker: the jobs of one queue (without role), or of one (role, queue) on the role's
/// leader.
#[derive(Clone, Debug)]
pub(crate) struct WorkerSpec {
    pub(crate) queue: String,
    pub(crate) role: Option<Role>,
    pub(crate) concurrency: usize,
    pub(crate) kinds: Vec<&'static str>,
}

/// What the service, the workers and the leader tasks of one node share.
pub(crate) struct Shared {
    pub(crate) types: BTreeMap<&'static str, JobType>,
    pub(crate) config: JobsConfig,
    pub(crate) namespace: String,
    /// `[cluster.leader_election] drain_timeout`: how long a role's leader tasks may drain.
    pub(crate) election_drain: Duration,
    /// `[cluster.leader_election] check_interval`: the longest a node waits to reconnect.
    pub(crate) check_interval: Duration,
    /// The node's context, once the node has registered and rescued its previous
    /// incarnation's jobs; leader tasks wait for it.
    ready: watch::Sender<Option<NodeContext>>,
}

impl Shared {
    /// The node's context, once ready; `None` if `stop` resolves first.
    pub(crate) async fn context_until(
        &self,
        stop: impl Future<Output = ()>,
    ) -> Option<NodeContext> {
        let mut ready = self.ready.subscribe();
        tokio::select! {
            context = ready.wait_for(Option::is_some) => context.ok().and_then(|c| c.clone()),
            _ = stop => None,
        }
    }

    pub(crate) fn default_max_attempts(&self) -> i32 {
        self.config.default_max_attempts.clamp(1, i32::MAX as u32) as i32
    }
}

fn check_type(ty: &JobType) -> Result<Option<Role>> {
    let invalid = |message: String| Error::Registration {
        message: format!("job `{}`: {message}", ty.kind),
    };
    validate_queue(&ty.options.queue).map_err(invalid)?;
    if ty.options.max_attempts == Some(0) {
        return Err(invalid("max_attempts must be at least 1".into()));
    }
    if ty.options.timeout == Some(Duration::ZERO) {
        return Err(invalid("a timeout must be longer than zero".into()));
    }
    ty.options
        .role
        .as_deref()
        .map(|name| Role::new(name).map_err(|err| invalid(err.to_string())))
        .transpose()
}

/// Adds the job machinery for `registry` to `builder`: nothing when no job is registered;
/// otherwise the per-node `jobs` service (heartbeats, and a worker per queue of
/// `[jobs.queues]` that has registered jobs), the `LISTEN` channels, the scheduler leader's
/// maintenance, and a worker per (role, queue) of role jobs on that role's leader.
pub(crate) fn install(registry: JobRegistry, builder: NodeBuilder) -> Result<NodeBuilder> {
    if registry.is_empty() {
        return Ok(builder);
    }
    let config = builder.config().clone();
    let namespace = config.lock_namespace()?;

    let mut queue_kinds: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    let mut role_kinds: BTreeMap<(Role, String), Vec<&'static str>> = BTreeMap::new();
    for ty in registry.types.values() {
        match check_type(ty)? {
            Some(role) => role_kinds
                .entry((role, ty.options.queue.clone()))
                .or_default()
                .push(ty.kind),
            None => queue_kinds
                .entry(ty.options.queue.clone())
                .or_default()
                .push(ty.kind),
        }
    }
    let mut specs = Vec::new();
    for (queue, kinds) in queue_kinds {
        match config.jobs.queues.get(&queue) {
            Some(&concurrency) => specs.push(WorkerSpec {
                queue,
                role: None,
                concurrency: concurrency as usize,
                kinds,
            }),
            None => info!(target: "forge::job", queue = %queue, jobs = ?kinds,
                          "this node does not work the queue (not in [jobs.queues]); its jobs run on nodes that do"),
        }
    }

    let (ready, _) = watch::channel(None);
    let shared = Arc::new(Shared {
        types: registry.types,
        config: config.jobs.clone(),
        namespace: namespace.name().to_owned(),
        election_drain: config.cluster.leader_election.drain_timeout,
        check_interval: config.cluster.leader_election.check_interval,
        ready,
    });

    let mut builder = builder
        .listen(CHANNEL_AVAILABLE)
        .listen(CHANNEL_DUE)
        .listen(CHANNEL_CANCEL);
    let service_shared = shared.clone();
    builder = builder.service("jobs", move |ctx| node_service(service_shared, ctx, specs));
    let maintenance_shared = shared.clone();
    builder = builder.leader_task(Role::SCHEDULER, "jobs-maintenance", move |leadership| {
        maintenance::run(maintenance_shared.clone(), leadership)
    });
    for ((role, queue), kinds) in role_kinds {
        // Role jobs run where the role's leader is, whether or not it lists the queue; the
        // queue's concurrency applies when it does.
        let concurrency = config.jobs.queues.get(&queue).copied().unwrap_or(1) as usize;
        let spec = WorkerSpec {
            queue: queue.clone(),
            role: Some(role.clone()),
            concurrency,
            kinds,
        };
        let shared = shared.clone();
        builder = builder.leader_task(role, format!("jobs:{queue}"), move |leadership| {
            worker::run_role_worker(shared.clone(), spec.clone(), leadership)
        });
    }
    Ok(builder)
}

/// The per-node service: register the node (rescuing what its previous incarnation left
/// running), then heartbeat and run the queue workers until shutdown, then record the stop.
async fn node_service(shared: Arc<Shared>, ctx: NodeContext, specs: Vec<WorkerSpec>) {
    describe_metrics(ctx.metrics());
    let queues: serde_json::Map<String, serde_json::Value> = specs
        .iter()
        .map(|s| (s.queue.clone(), s.concurrency.into()))
        .collect();
    let queues = serde_json::Value::Object(queues);
    let mut delay = Duration::from_millis(100);
    loop {
        match node_start(&shared, &ctx, &queues).await {
            Ok(()) => break,
            Err(err) => {
                warn!(target: "forge::job", node = %ctx.node_id(), error = %err,
                      "cannot register the node for jobs; retrying");
                tokio::select! {
                    _ = sleep(delay) => {}
                    _ = ctx.shutdown().cancelled() => return,
                }
                delay = (delay * 2).min(shared.check_interval.max(Duration::from_secs(1)));
            }
        }
    }
    shared.ready.send_replace(Some(ctx.clone()));

    let mut workers = JoinSet::new();
    for spec in specs {
        info!(target: "forge::job", queue = %spec.queue, concurrency = spec.concurrency,
              jobs = ?spec.kinds, "working queue");
        workers.spawn(worker::run_node_worker(shared.clone(), ctx.clone(), spec));
    }
    heartbeat(&shared, &ctx, &queues).await;
    while workers.join_next().await.is_some() {}
    let stopped = sqlx::query(
        "UPDATE forge.nodes SET stopped_at = clock_timestamp(), heartbeat_at = clock_timestamp()
          WHERE namespace = $1 AND node_id = $2",
    )
    .bind(&shared.namespace)
    .bind(ctx.node_id().as_str())
    .execute(ctx.pool())
    .await;
    if let Err(err) = stopped {
        warn!(target: "forge::job", node = %ctx.node_id(), error = %err, "cannot record the node's stop");
    }
}

async fn node_start(
    shared: &Shared,
    ctx: &NodeContext,
    queues: &serde_json::Value,
) -> Result<(), sqlx::Error> {
    let rows = sqlx::query("SELECT * FROM forge.jobs_node_start($1, $2, $3, $4)")
        .bind(&shared.namespace)
        .bind(ctx.node_id().as_str())
        .bind(queues)
        .bind(shared.default_max_attempts())
        .fetch_all(ctx.pool())
        .await?;
    for row in rows {
        let id: i64 = row.try_get("id")?;
        let queue: String = row.try_get("queue")?;
        let kind: String = row.try_get("kind")?;
        let state: String = row.try_get("state")?;
        warn!(target: "forge::job", queue = %queue, job = %kind, id, state = %state,
              "rescued a job this node's previous run left running");
        record_rescue(ctx.metrics(), &queue, &kind, &state, 1);
    }
    Ok(())
}

/// Counts a rescued job in the metrics.
pub(crate) fn record_rescue(metrics: &Metrics, queue: &str, kind: &str, state: &str, n: u64) {
    let labels = [("queue", queue), ("job", kind)];
    metrics
        .counter("forge_job_rescued_total", &labels)
        .increment(n);
    match state {
        "dead" => metrics
            .counter("forge_job_dead_total", &labels)
            .increment(n),
        "cancelled" => metrics
            .counter("forge_job_cancelled_total", &labels)
            .increment(n),
        _ => {}
    }
}

/// Records that the node is alive every `heartbeat_interval`, until shutdown.
async fn heartbeat(shared: &Shared, ctx: &NodeContext, queues: &serde_json::Value) {
    loop {
        tokio::select! {
            _ = sleep(shared.config.heartbeat_interval) => {}
            _ = ctx.shutdown().cancelled() => return,
        }
        let beat = sqlx::query(
            "INSERT INTO forge.nodes (namespace, node_id, started_at, heartbeat_at, queues)
             VALUES ($1, $2, clock_timestamp(), clock_timestamp(), $3)
             ON CONFLICT (namespace, node_id) DO UPDATE
                SET heartbeat_at = excluded.heartbeat_at, stopped_at = NULL",
        )
        .bind(&shared.namespace)
        .bind(ctx.node_id().as_str())
        .bind(queues)
        .execute(ctx.pool())
        .await;
        if let Err(err) = beat {
            warn!(target: "forge::job", node = %ctx.node_id(), error = %err, "heartbeat failed");
        }
    }
}
