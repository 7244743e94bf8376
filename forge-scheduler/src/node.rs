//! The node users build: forge-core's node plus crons and jobs.

use std::ops::Deref;

use forge_core::{Config, Leadership, NodeContext, Result, Role};

use crate::cron::{self, Cron, CronJob};
use crate::jobs::{self, Job, JobRegistry, Jobs};

/// Builds a [`Node`]: register crons, jobs and other leader-only work, then
/// [`NodeBuilder::start`].
///
/// Every `#[cron]` and `#[job]` linked into the binary is registered automatically (see
/// [`NodeBuilder::auto_register`] for the caveats); [`NodeBuilder::cron`] and
/// [`NodeBuilder::job`] register explicitly.
pub struct NodeBuilder {
    core: forge_core::NodeBuilder,
    crons: Vec<CronJob>,
    jobs: JobRegistry,
    auto_register: bool,
    error: Option<forge_core::Error>,
}

impl NodeBuilder {
    /// A builder for a node with this configuration.
    pub fn new(config: Config) -> NodeBuilder {
        NodeBuilder {
            core: forge_core::Node::builder(config),
            crons: Vec::new(),
            jobs: JobRegistry::default(),
            auto_register: true,
            error: None,
        }
    }

    /// Registers a cron (a `#[cron]` function, or a [`CronJob`] built in code).
    pub fn cron(mut self, cron: impl Cron) -> Self {
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
        if let Err(err) = self.jobs.add(job)
            && self.error.is_none()
        {
            self.error = Some(err);
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

    /// Registers leader-only work for `role` (see `forge_core::NodeBuilder::leader_task`).
    pub fn leader_task<F, Fut>(mut self, role: Role, name: impl Into<String>, task: F) -> Self
    where
        F: Fn(Leadership) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.core = self.core.leader_task(role, name, task);
        self
    }

    /// Registers a service that runs on every node (see `forge_core::NodeBuilder::service`).
    pub fn service<F, Fut>(mut self, name: impl Into<String>, service: F) -> Self
    where
        F: FnOnce(NodeContext) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.core = self.core.service(name, service);
        self
    }

    /// The configuration the node will start with.
    pub fn config(&self) -> &Config {
        self.core.config()
    }

    /// Validates everything registered, connects, migrates, and starts campaigning, running
    /// crons on the leaders of their roles and jobs on every node.
    pub async fn start(mut self) -> Result<Node> {
        if let Some(err) = self.error.take() {
            return Err(err);
        }
        if self.auto_register {
            for cron in crate::__private::registered_crons() {
                self.crons.push(cron?);
            }
            crate::__private::register_jobs(&mut self.jobs)?;
        }
        let crons = cron::dedupe(self.crons)?;
        let core = cron::install(crons, self.core);
        let core = jobs::install(self.jobs, core)?;
        let core = core.start().await?;
        let jobs = Jobs::for_node(
            core.pool().clone(),
            &core.context().config().lock_namespace()?,
            core.metrics().clone(),
        );
        Ok(Node { core, jobs })
    }
}

/// A running node: `forge-core`'s node (leadership state, metrics, shutdown; through `Deref`)
/// plus the job client.
#[derive(Clone)]
pub struct Node {
    core: forge_core::Node,
    jobs: Jobs,
}

impl Node {
    /// A builder for a node with this configuration.
    pub fn builder(config: Config) -> NodeBuilder {
        NodeBuilder::new(config)
    }

    /// Enqueue, inspect and cancel jobs through this node's pool.
    pub fn jobs(&self) -> &Jobs {
        &self.jobs
    }
}

impl Deref for Node {
    type Target = forge_core::Node;

    fn deref(&self) -> &forge_core::Node {
        &self.core
    }
}
