//! # FORGE
//!
//! Leader-only work for a cluster of identical service nodes that share one PostgreSQL.
//!
//! Each leader role ([`Role::SCHEDULER`], [`Role::METRICS_AGGREGATOR`], [`Role::LOG_COMPACTOR`]
//! and your own) owns a PostgreSQL advisory-lock key; the node holding it is the role's leader
//! and the only one that runs the role's work. Leadership hands over gracefully on shutdown, a
//! crashed leader is replaced within milliseconds, a frozen one is fenced by its epoch.
//!
//! ```no_run
//! use forge::{Config, Node, Role};
//!
//! #[tokio::main]
//! async fn main() -> forge::Result<()> {
//!     let node = Node::builder(Config::load("forge.toml")?)
//!         .leader_task(Role::SCHEDULER, "report", |leadership| async move {
//!             println!("leading at epoch {}", leadership.epoch());
//!             leadership.stopping().await; // until a handoff begins or leadership is lost
//!         })
//!         .start()
//!         .await?;
//!     node.run_until_signal().await // SIGTERM / ctrl-c: graceful handoff
//! }
//! ```
//!
//! # Crons and jobs
//!
//! [`cron`](macro@cron) and [`job`](macro@job) turn an `async fn` into leader-only work checked at compile time:
//!
//! ```no_run
//! use forge::{Config, CronContext, CronError, Node};
//!
//! /// Runs at minute 0 of every hour, on the leader of the `scheduler` role only.
//! #[forge::cron("0 * * * *", catch_up = "all")]
//! async fn compact(ctx: CronContext) -> Result<(), CronError> {
//!     let mut tx = ctx.fenced_transaction().await?; // applied only if still leading
//!     forge::sqlx::query("DELETE FROM sessions WHERE expires_at < $1")
//!         .bind(ctx.scheduled_at())
//!         .execute(&mut *tx)
//!         .await?;
//!     ctx.complete(&mut tx).await?; // the tick is done in the same commit: exactly once
//!     tx.commit().await?;
//!     Ok(())
//! }
//!
//! #[tokio::main]
//! async fn main() -> forge::Result<()> {
//!     // `#[cron]`s and `#[job]`s linked into the binary are registered automatically;
//!     // `.cron(compact)` does it explicitly (see `forge::cron` for when that matters).
//!     let node = Node::builder(Config::load("forge.toml")?).cron(compact).start().await?;
//!     node.run_until_signal().await
//! }
//! ```
//!
//! # What is guaranteed
//!
//! Effects a cron handler writes in its tick's fenced transaction together with
//! [`CronContext::complete`] never happen twice, and happen once for a tick that runs to
//! success; so do a job's effects written in a transaction that calls
//! [`JobContext::complete`] (for a job that completes: a dead or cancelled job commits none).
//! Everything else a handler does is at least once: a run cut short by its node's death runs
//! again. See [`crons`] and [`jobs`]
//! for the details, the guide in `docs/` for configuration (`forge.toml`) and operations
//! (metrics, alerts), and its architecture chapter for how the election, membership and fencing work.

pub mod alerts;
mod config;
pub mod migrate;
mod node;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::Config;
pub use node::{Node, NodeBuilder};

pub use forge_core::{
    Epoch, Error, FenceToken, LeaderInfo, Leadership, LockKey, LockNamespace, LockSlotError,
    NameError, NodeId, Result, Role, RoleState, shutdown_signal,
};
pub use forge_macros::{cron, job, migrate};
pub use forge_scheduler::cron::{CronContext, CronError};
pub use forge_scheduler::jobs::{JobContext, JobError};
pub use forge_scheduler::{Schedule, ScheduleError};

/// Extending a node: a [`Component`] brings its own leader tasks,
/// services, LISTEN channels, metrics, pruners and shutdown budget to the
/// [`Assembly`](component::Assembly) of a node being built ([`NodeBuilder::component`]); the
/// crons and the job queue are components too. Its services get a
/// [`NodeContext`](component::NodeContext) (pool, metrics registry, shutdown token,
/// notifications), and its metrics are [`MetricDef`](component::MetricDef)s registered in the
/// node's [`Metrics`](component::Metrics).
///
/// ```
/// use forge::component::{Assembly, Component, MetricDef};
/// use forge::{Leadership, Role};
///
/// static REPORTS: MetricDef = MetricDef::counter("app_reports_total", "Reports written.");
///
/// /// Writes a report every minute on the leader of the `reports` role.
/// struct Reports;
///
/// impl Component for Reports {
///     fn name(&self) -> &'static str {
///         "reports"
///     }
///
///     fn install(self: Box<Self>, node: &mut Assembly) -> forge::Result<()> {
///         node.describe_metrics(&[&REPORTS]);
///         node.leader_task(Role::new("reports")?, "report", |leadership: Leadership| async move {
///             let written = leadership.metrics().counter(&REPORTS, &[]);
///             while !leadership.is_draining() {
///                 written.increment(1);
///                 tokio::select! {
///                     _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => {}
///                     _ = leadership.stopping() => {}
///                 }
///             }
///         });
///         Ok(())
///     }
/// }
/// # fn demo(config: forge::Config) -> forge::NodeBuilder {
/// forge::Node::builder(config).component(Reports)
/// # }
/// ```
pub mod component {
    pub use forge_core::metrics::{MetricDef, MetricKind};
    pub use forge_core::{Assembly, Component, ListenerEvent, Metrics, NodeContext, Standing};
}

/// PostgreSQL connections as FORGE makes them, for tools that connect by themselves (the
/// `forge` command does): a URL fit to show, and what is wrong when the server is not
/// PostgreSQL at all.
pub mod db {
    pub use forge_core::{not_postgres, redact_url};
}

// The paths of the items that moved to `component` and `db`, for one release. A trait's
// re-export cannot be deprecated (rustc ignores `#[deprecated]` on `use`): `Component` is
// hidden instead; the types are deprecated aliases, the functions deprecated wrappers.
#[doc(hidden)]
pub use forge_core::Component;

/// Moved: [`forge::component::Assembly`](component::Assembly).
#[deprecated(note = "moved to `forge::component::Assembly`")]
pub type Assembly = component::Assembly;

/// Moved: [`forge::component::NodeContext`](component::NodeContext).
#[deprecated(note = "moved to `forge::component::NodeContext`")]
pub type NodeContext = component::NodeContext;

/// Moved: [`forge::component::Metrics`](component::Metrics).
#[deprecated(note = "moved to `forge::component::Metrics`")]
pub type Metrics = component::Metrics;

/// Moved: [`forge::component::ListenerEvent`](component::ListenerEvent).
#[deprecated(note = "moved to `forge::component::ListenerEvent`")]
pub type ListenerEvent = component::ListenerEvent;

/// Moved: [`forge::db::redact_url`](db::redact_url).
#[deprecated(note = "moved to `forge::db::redact_url`")]
pub fn redact_url(url: &str) -> String {
    db::redact_url(url)
}

/// Moved: [`forge::db::not_postgres`](db::not_postgres).
#[deprecated(note = "moved to `forge::db::not_postgres`")]
pub async fn not_postgres(options: &sqlx::postgres::PgConnectOptions) -> Option<String> {
    db::not_postgres(options).await
}

/// The sqlx FORGE is built on: use this one for the transactions you hand to FORGE
/// (`forge::sqlx::query(...)`), or depend on the same version (see the README).
pub use sqlx;

/// The sections of [`Config`], and what reading them needs.
pub mod config_sections {
    pub use crate::alerts::AlertingConfig;
    pub use forge_core::config::ConfigSource;
    pub use forge_core::{
        AdminConfig, ClusterConfig, DatabaseConfig, Env, LeaderElectionConfig, MembershipConfig,
        MetricsConfig, NodeConfig, ProcessEnv, no_env,
    };
    pub use forge_scheduler::config::{KindConfig, QueueConfig};
    pub use forge_scheduler::{CronConfig, JobsConfig};
}

/// Crons: definitions ([`CronJob`](crons::CronJob), which `#[forge::cron]` builds), policies,
/// the tick ledger's states. The handler's context and error are [`CronContext`] and
/// [`CronError`]; a schedule is a [`Schedule`]. (The attribute is [`forge::cron`](macro@cron);
/// this module is `crons`, as the jobs' is [`jobs`] beside [`forge::job`](macro@job).)
pub mod crons {
    pub use forge_scheduler::cron::{
        CatchUp, CronJob, CronRunner, Interrupted, IntoCron, IntoCronResult, Overlap, TickState,
    };
    pub use forge_scheduler::cron::{StoredCron, StoredCronSpec};
    // Former names, deprecated (their uses warn): see CHANGELOG.md, "Renamed".
    #[allow(deprecated)]
    pub use forge_scheduler::cron::{Cron, Crons};
}

/// Durable jobs: declaring, enqueueing, running, inspecting. The handler's context and error
/// are [`JobContext`] and [`JobError`].
///
/// The application's client is [`Jobs`](jobs::Jobs) (`node.jobs()`): it enqueues, reads a job
/// ([`Jobs::get`](jobs::Jobs::get)) and cancels one ([`Jobs::cancel`](jobs::Jobs::cancel),
/// the application's own decision: not in the audit trail). An operator's actions - retry,
/// cancel, delete, one by one or by filter, refused by what the job's state allows and
/// recorded with who asked - are [`Workload`](inspect::Workload)'s, as the admin API and the
/// CLI use them; its [`Workload::job`](inspect::Workload::job) reads a job as `Jobs::get` does.
pub mod jobs {
    pub use forge_scheduler::jobs::{
        AttemptError, Backoff, CancelOutcome, CancelReason, Enqueued, FailAction, IntoJobResult,
        Job, JobAction, JobActions, JobId, JobInfo, JobOptions, JobRunner, JobState, Jobs, NewJob,
    };
    pub use forge_scheduler::jobs::{BackoffFn, UniqueMode};
    pub use forge_scheduler::jobs::{QueueLimits, Rate};
    // The former name of `JobRunner`, deprecated: see CHANGELOG.md, "Renamed".
    #[allow(deprecated)]
    pub use forge_scheduler::jobs::JobQueue;
    // Job dependencies (issue 34).
    pub use forge_scheduler::jobs::{ParentFailure, Workflow};
}

/// The admin HTTP API (axum): cluster status, leaders, history, nodes, events, crons, jobs,
/// queues, step-down, with bearer-token access and an audit trail. A node serves it itself on
/// `[admin] listen` (`FORGE_ADMIN_LISTEN`); or mount a node's in your own axum application
/// with [`Node::admin_router`]:
///
/// ```no_run
/// # async fn demo(node: forge::Node) -> std::io::Result<()> {
/// use std::net::SocketAddr;
/// use forge::admin::axum;
///
/// let app = axum::Router::new().merge(node.admin_router());
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
/// axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
/// # }
/// ```
///
/// A process that is no node builds an [`AdminState`](admin::AdminState) from its own read
/// models and gets the same API from [`router`](admin::router), or serves it with
/// [`serve`](admin::serve). The endpoints and the access rules are in the README ("Admin API")
/// and in [`router`](admin::router).
pub mod admin {
    pub use forge_admin::{
        AdminState, ApiError, ApiResult, LEADER_HEADER, LEADER_URL_HEADER, Leader, LeaderOnly,
        LeaderOnlyService, LeaderSource, LocalNode, axum, bind, router, serve,
    };

    impl LeaderSource for crate::Node {
        fn leadership(&self, role: &crate::Role) -> Option<crate::Leadership> {
            crate::Node::leadership(self, role)
        }

        fn role_state(&self, role: &crate::Role) -> Option<crate::RoleState> {
            crate::Node::role_state(self, role)
        }

        fn cluster(&self) -> crate::inspect::Cluster {
            crate::Node::cluster(self)
        }
    }
}

/// Read models of the whole cluster, for dashboards, admin tools and your own code: who is in
/// the cluster and who leads what ([`Cluster`](inspect::Cluster)), and what crons and jobs are
/// doing ([`Workload`](inspect::Workload)), with the operators' writes (each recorded in the
/// events history). Every query reads PostgreSQL, so any process with a pool answers for the
/// whole cluster.
pub mod inspect {
    pub use forge_core::inspect::{
        Change, Cluster, ClusterStatus, EventFilter, EventKind, EventView, GapFrom, LeaderView,
        LeadershipState, NodeCounts, NodeState, NodeView, Page, PageRequest, RoleStatus,
        SeriesPoint, StepDown, TenureEnd, TenureView, UnservedWork, WorkKind,
    };
    pub use forge_scheduler::inspect::Upserted;
    pub use forge_scheduler::inspect::{
        CronView, JobFilter, KindLimitsView, QueueView, TickView, Workload,
    };
}

#[doc(hidden)]
pub use forge_core::sql::check_values as sql_check_values;

#[doc(hidden)]
pub mod __private {
    pub use forge_core::{Error, Result};
    pub use forge_scheduler::__private::Rate;
    pub use forge_scheduler::__private::{
        Backoff, CatchUp, CronContext, CronJob, CronRegistration, Interrupted, IntoCron,
        IntoCronResult, IntoJobResult, Job, JobContext, JobError, JobOptions, JobRegistration,
        JobRegistry, Overlap, Role, Schedule, inventory, register_jobs, registered_crons,
    };
    pub use forge_scheduler::__private::{JobState, UniqueMode};

    use sqlx::SqlSafeStr as _;
    use sqlx::migrate::{Migration, MigrationType, Migrator};

    /// One migration of `forge::migrate!`, as sqlx's own `migrate!` builds it (the same
    /// checksum); `kind` is `simple`, `up` or `down`.
    pub fn migration(
        version: i64,
        description: &'static str,
        kind: &str,
        sql: &'static str,
    ) -> Migration {
        let kind = match kind {
            "up" => MigrationType::ReversibleUp,
            "down" => MigrationType::ReversibleDown,
            _ => MigrationType::Simple,
        };
        let no_tx = sql.starts_with("-- no-transaction");
        Migration::new(
            version,
            description.into(),
            kind,
            sqlx::AssertSqlSafe(sql).into_sql_str(),
            no_tx,
        )
    }

    /// What `forge::migrate!` expands to.
    pub fn migrator(migrations: Vec<Migration>) -> Migrator {
        Migrator::with_migrations(migrations)
    }
}

#[cfg(test)]
mod tests {
    use super::{Error, Schedule};

    /// `?` on a schedule parsed at run time gives a `forge::Error` that keeps the typed error.
    #[test]
    fn a_schedule_error_converts_into_a_forge_error() {
        fn parse(expression: &str) -> crate::Result<Schedule> {
            Ok(Schedule::parse(expression)?)
        }
        let err = parse("0 25 * * *").unwrap_err();
        assert!(
            err.to_string()
                .contains("hour 25 is out of range (valid: 0-23)"),
            "{err}"
        );
        let Error::Schedule(schedule) = err else {
            panic!("not Error::Schedule: {err:?}");
        };
        assert!(schedule.to_string().contains("0 25 * * *"), "{schedule}");
        assert!(parse("0 9 * * 1-5").is_ok());
    }
}
