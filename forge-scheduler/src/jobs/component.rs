//! The job queue as a node component: the per-node service (rescue of the previous run's jobs,
//! then a worker per queue the node works: `[node] queues`, or, unset, the queues its job types
//! declare and those `[jobs.queues]` tunes), the `LISTEN`
//! channels, the scheduler leader's maintenance, and a worker per (role, queue) of role jobs on
//! that role's leader.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use forge_core::{Assembly, Component, NODES_CHANNEL, NodeContext, Result, Role};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::sleep;
use tracing::{info, warn};

use super::shared::{
    CHANNEL_AVAILABLE, CHANNEL_CANCEL, CHANNEL_DUE, Shared, WorkerSpec, record_rescue,
};
use super::{JobRegistry, JobState, JobType, figures, maintenance, validate_queue, worker};
use crate::config::{JobsConfig, invalid};
use crate::limits::Limited;
use crate::metrics::{JOB_FIGURES, JOB_SERIES};

/// The job queue of a node, as a [`Component`]. The `forge` facade's `NodeBuilder` builds it
/// from the registered jobs.
pub struct JobRunner {
    registry: JobRegistry,
    config: JobsConfig,
}

/// The former name of [`JobRunner`], kept for one release.
#[deprecated(since = "0.2.0", note = "renamed `JobRunner`")]
pub type JobQueue = JobRunner;

impl JobRunner {
    /// The component for `registry`.
    pub fn new(registry: JobRegistry, config: JobsConfig) -> JobRunner {
        JobRunner { registry, config }
    }
}

fn check_type(ty: &JobType) -> Result<Option<Role>> {
    let invalid = |message: String| invalid(format!("job `{}`: {message}", ty.kind));
    validate_queue(&ty.options.queue).map_err(invalid)?;
    if ty.options.max_attempts == Some(0) {
        return Err(invalid("max_attempts must be at least 1".into()));
    }
    if ty.options.timeout == Some(Duration::ZERO) {
        return Err(invalid("a timeout must be longer than zero".into()));
    }
    for value in [ty.options.timeout, ty.options.backoff.max_delay()]
        .into_iter()
        .flatten()
    {
        forge_rules::check_duration(value).map_err(&invalid)?;
    }
    ty.options
        .role
        .as_deref()
        .map(|name| Role::new(name).map_err(|err| invalid(err.to_string())))
        .transpose()
}

impl JobRunner {
    /// The node's workers and the role workers, by checking every registered type.
    ///
    /// A node works the queues `listed` (`[node] queues`), or, unset, every queue a job type of
    /// it declares without a role and every queue `[jobs.queues]` tunes; in each it claims any
    /// kind it knows (a job may be enqueued on another queue than its type declares, with
    /// [`NewJob::queue`](super::NewJob::queue)); a kind it does not know stays for nodes that
    /// do. A node without such job types works no queue. A role's jobs run on the role's
    /// leader, one worker per role over all queues; its concurrency is the largest of the
    /// queues the role's types declare ([`JobsConfig::concurrency`]).
    fn specs(&self, listed: Option<&[String]>) -> Result<(Vec<WorkerSpec>, Vec<WorkerSpec>)> {
        let mut node_kinds: Vec<&'static str> = Vec::new();
        let mut declared: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
        let mut role_kinds: BTreeMap<Role, (String, u32, Vec<&'static str>)> = BTreeMap::new();
        for ty in self.registry.types.values() {
            let queue = &ty.options.queue;
            match check_type(ty)? {
                Some(role) if self.config.kinds.contains_key(ty.kind) => {
                    return Err(invalid(format!(
                        "forge.toml's [jobs.kinds.{}] gives limits to a job kind that runs on the leader of role `{role}`, whose claims no limit binds: remove the entry",
                        ty.kind
                    )));
                }
                Some(role) => {
                    let concurrency = self.config.concurrency(queue);
                    let entry = role_kinds
                        .entry(role)
                        .or_insert_with(|| (queue.clone(), concurrency, Vec::new()));
                    entry.1 = entry.1.max(concurrency);
                    entry.2.push(ty.kind);
                }
                None => {
                    node_kinds.push(ty.kind);
                    declared.entry(queue.clone()).or_default().push(ty.kind);
                }
            }
        }
        let worked: BTreeSet<String> = match listed {
            Some(listed) => listed.iter().cloned().collect(),
            None => declared
                .keys()
                .chain(self.config.queues.keys())
                .cloned()
                .collect(),
        };
        for (queue, kinds) in &declared {
            if !worked.contains(queue) {
                warn!(target: "forge::job", queue = %queue, jobs = ?kinds, queues = ?worked,
                      "this node does not work a queue its job types declare: [node] queues (FORGE_QUEUES) does not list it, so these jobs run only on nodes that work it; add it there, or unset queues to work every queue this binary declares");
            }
        }
        let node_specs = if node_kinds.is_empty() {
            Vec::new()
        } else {
            worked
                .into_iter()
                .map(|queue| WorkerSpec {
                    concurrency: self.config.concurrency(&queue) as usize,
                    queue,
                    role: None,
                    kinds: node_kinds.clone(),
                })
                .collect()
        };
        let role_specs = role_kinds
            .into_iter()
            .map(|(role, (queue, concurrency, kinds))| WorkerSpec {
                queue,
                role: Some(role),
                concurrency: concurrency as usize,
                kinds,
            })
            .collect();
        Ok((node_specs, role_specs))
    }
}

impl Component for JobRunner {
    fn name(&self) -> &'static str {
        "jobs"
    }

    fn install(self: Box<Self>, node: &mut Assembly) -> Result<()> {
        let every = self.config.maintenance_interval;
        let width = node.config().metrics.rollup_interval;
        // The tables' upkeep runs whether or not this node has job types: any node may lead
        // the log_compactor and metrics_aggregator roles.
        node.describe_metrics(JOB_SERIES)
            .describe_metrics(JOB_FIGURES)
            .prune(
                "jobs_finished",
                "prune_finished_jobs",
                self.config.completed_retention,
            )
            .prune("jobs_dead", "prune_dead_jobs", self.config.dead_retention)
            // After the jobs: a key whose job was just pruned goes in the same pass.
            .prune("job_keys", "prune_job_keys", Duration::ZERO)
            .leader_task(Role::METRICS_AGGREGATOR, "job-figures", move |leadership| {
                figures::run(leadership, every, width)
            });
        if self.registry.is_empty() {
            return Ok(());
        }
        let listed = node.config().node.queues.clone();
        let (node_specs, role_specs) = self.specs(listed.as_deref())?;
        warn_small_pool(node, node_specs.len() + role_specs.len());
        // Labelled as the workers and the client label them: a type's declared queue, and
        // every queue this node works for its kinds.
        for ty in self.registry.types.values() {
            export_job(node, &ty.options.queue, ty.kind);
        }
        for spec in &node_specs {
            for kind in &spec.kinds {
                export_job(node, &spec.queue, kind);
            }
        }
        let election = &node.config().cluster.leader_election;
        let (ready, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            types: self.registry.types,
            namespace: node.namespace().clone(),
            election_drain: election.drain_timeout,
            check_interval: election.check_interval,
            statement_bound: election.lease_duration.max(Duration::from_secs(5)),
            ready,
            config: self.config,
        });
        node.listen(CHANNEL_AVAILABLE)
            .listen(CHANNEL_DUE)
            .listen(CHANNEL_CANCEL)
            .listen(NODES_CHANNEL)
            .drain_budget(shared.config.drain_timeout)
            .advertise_queues(
                node_specs
                    .iter()
                    .map(|s| (s.queue.clone(), s.concurrency as u32))
                    .collect(),
            );
        let service_shared = shared.clone();
        node.service("jobs", move |ctx| {
            node_service(service_shared, ctx, node_specs)
        });
        let maintenance_shared = shared.clone();
        node.leader_task(Role::SCHEDULER, "jobs-maintenance", move |leadership| {
            maintenance::run(maintenance_shared.clone(), leadership)
        });
        for spec in role_specs {
            let shared = shared.clone();
            let role = spec.role.clone().unwrap_or(Role::SCHEDULER);
            node.leader_task(role, "jobs", move |leadership| {
                worker::run_role_worker(shared.clone(), spec.clone(), leadership)
            });
        }
        Ok(())
    }
}

/// Warns at start when the node's pool is too small for its job workers: each holds up to two
/// pool connections while it has attempts running (its claim and record lanes), so a pool of
/// fewer than two per worker plus one leaves handlers, crons and fenced writes waiting on the
/// pool until they time out. (A warning, not an error: handlers that use no connection, or
/// queues that are never busy together, can live with less.)
fn warn_small_pool(node: &Assembly, workers: usize) {
    let pool = node.config().database.max_connections as usize;
    let needed = 2 * workers + 1;
    if workers > 0 && pool < needed {
        warn!(target: "forge::job", max_connections = pool, job_workers = workers,
              "[database] max_connections is too small for this node's job workers: each holds up to two pool connections while its jobs run, so handlers, crons and fenced writes would wait on the pool (\"pool timed out\"); raise it to at least {needed}, plus what your handlers use at once");
    }
}

/// Exports the counters and histograms of a job kind on a queue at 0 from the start.
fn export_job(node: &mut Assembly, queue: &str, kind: &str) {
    for def in JOB_SERIES {
        node.export_series(None, def, &[("queue", queue), ("kind", kind)]);
    }
}

/// The per-node service: rescue what this node's previous run left running, then run the
/// queue workers until shutdown.
async fn node_service(shared: Arc<Shared>, ctx: NodeContext, specs: Vec<WorkerSpec>) {
    let mut delay = Duration::from_millis(100);
    loop {
        match rescue_own(&shared, &ctx).await {
            Ok(()) => break,
            Err(err) => {
                warn!(target: "forge::job", node = %ctx.node_id(), error = %err,
                      "cannot rescue this node's previous jobs yet; retrying");
                tokio::select! {
                    _ = sleep(delay) => {}
                    _ = ctx.shutdown().cancelled() => return,
                }
                delay = (delay * 2).min(shared.check_interval.max(Duration::from_secs(1)));
            }
        }
    }
    write_config_limits(&shared, &ctx, &specs).await;
    shared.ready.send_replace(Some(ctx.clone()));
    let mut workers = JoinSet::new();
    for spec in specs {
        info!(target: "forge::job", queue = %spec.queue, concurrency = spec.concurrency,
              jobs = ?spec.kinds, "working queue");
        workers.spawn(worker::run_node_worker(shared.clone(), ctx.clone(), spec));
    }
    while workers.join_next().await.is_some() {}
}

/// Writes forge.toml's cluster-wide limits of the queues this node works or tunes
/// (`forge.queue_limits`; a queue without limits in forge.toml loses those forge.toml gave it
/// before), and the declared limits of the job kinds it registers (`forge.kind_limits`,
/// likewise), except where an operator set them: theirs win until reset.
async fn write_config_limits(shared: &Shared, ctx: &NodeContext, specs: &[WorkerSpec]) {
    let queues: BTreeSet<&str> = specs
        .iter()
        .map(|s| s.queue.as_str())
        .chain(shared.config.queues.keys().map(String::as_str))
        .collect();
    let queues = queues
        .into_iter()
        .map(|queue| (Limited::Queue, queue, shared.config.limits(queue)));
    // (A role's kinds have no limits: registration and the node's start refuse them.)
    // forge.toml's limits of a kind replace its code's.
    let kinds = shared
        .types
        .values()
        .filter(|t| t.options.role.is_none())
        .map(|t| {
            let limits = match shared.config.kinds.get(t.kind) {
                Some(tuning) => tuning.limits(),
                None => t.options.limits.clone(),
            };
            (Limited::Kind, t.kind, limits)
        });
    for kind in shared.config.kinds.keys() {
        if !shared.types.contains_key(kind.as_str()) {
            warn!(target: "forge::job", kind = %kind,
                  "forge.toml's [jobs.kinds] names a job kind this binary does not register: its limits are written by the nodes that register it; check the name");
        }
    }
    for (limited, name, limits) in queues.chain(kinds) {
        let (what, reset) = match limited {
            Limited::Queue => ("queue", "forge queues limit <queue> --reset"),
            Limited::Kind => ("job kind", "forge jobs limit <kind> --reset"),
        };
        match limits
            .write(ctx.pool(), shared.namespace.name(), limited, name, None)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                info!(target: "forge::job", name = %name,
                      "an operator set this {what}'s limits: the node's are not applied (reset them with `{reset}`)");
            }
            Err(err) => {
                warn!(target: "forge::job", name = %name, error = %err,
                      "cannot write this {what}'s limits: the database keeps the ones it has");
            }
        }
    }
}

/// Rescues the jobs this node's previous run left running (it holds its id's lock now, so no
/// other process can be running them), after ending the previous run's pool sessions and taking
/// its lanes (see `forge.jobs_rescue_own`), within the round trips' bound.
async fn rescue_own(shared: &Shared, ctx: &NodeContext) -> Result<(), sqlx::Error> {
    /// A job `forge.jobs_rescue_own` rescued, and the state it left it in.
    #[derive(sqlx::FromRow)]
    struct Rescued {
        id: i64,
        queue: String,
        kind: String,
        state: JobState,
    }
    let rescue = sqlx::query_as("SELECT * FROM forge.jobs_rescue_own($1, $2, $3, $4, $5)")
        .bind(&shared.namespace)
        .bind(ctx.node_id())
        .bind(ctx.incarnation())
        .bind(shared.default_max_attempts())
        .bind(shared.lane_wait_ms())
        .fetch_all(ctx.pool());
    let rows: Vec<Rescued> = tokio::time::timeout(shared.statement_bound, rescue)
        .await
        .map_err(|_| {
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the rescue of the previous run's jobs got no answer in time",
            ))
        })??;
    for Rescued {
        id,
        queue,
        kind,
        state,
    } in rows
    {
        warn!(target: "forge::job", queue = %queue, job = %kind, id, state = %state,
              "rescued a job this node's previous run left running");
        record_rescue(ctx.metrics(), &queue, &kind, state, 1);
    }
    Ok(())
}
