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
//! again. See [`cron`](mod@cron) and [`jobs`]
//! for the details, the README for configuration (`forge.toml`) and operations (metrics,
//! alerts), and ARCHITECTURE.md for how the election, membership and fencing work.

pub mod alerts;
mod config;
pub mod migrate;
mod node;

pub use config::Config;
pub use node::{Node, NodeBuilder};

pub use forge_core::{
    Assembly, Component, Epoch, Error, FenceToken, LeaderInfo, Leadership, ListenerEvent, LockKey,
    LockNamespace, Metrics, NodeContext, NodeId, Result, Role, RoleState, not_postgres, redact_url,
    shutdown_signal,
};
pub use forge_macros::{cron, job, migrate};
pub use forge_scheduler::cron::{CronContext, CronError};
pub use forge_scheduler::jobs::{JobContext, JobError};
pub use forge_scheduler::{Schedule, ScheduleError};

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
    pub use forge_scheduler::{CronConfig, JobsConfig};
}

/// Crons: definitions, policies, the handler context, the tick ledger's states.
pub mod cron {
    pub use forge_scheduler::cron::{
        CatchUp, Cron, CronContext, CronError, CronJob, Crons, Interrupted, IntoCronResult,
        Overlap, TickState,
    };
    pub use forge_scheduler::{Schedule, ScheduleError};
}

/// Durable jobs: declaring, enqueueing, running, inspecting.
pub mod jobs {
    pub use forge_scheduler::jobs::*;
}

/// The admin HTTP API (axum): cluster status, leaders, history, nodes, events, crons, jobs,
/// queues, step-down, with bearer-token access and an audit trail. A node serves it itself on
/// `[admin] listen` (`FORGE_ADMIN_LISTEN`); or mount it in your own axum application:
///
/// ```no_run
/// # async fn demo(node: forge::Node) -> std::io::Result<()> {
/// use std::net::SocketAddr;
/// use forge::admin::axum;
///
/// let app = axum::Router::new().merge(forge::admin::router_for(&node));
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
/// axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
/// # }
/// ```
///
/// The endpoints and the access rules are in the README ("Admin API") and in [`router`](admin::router).
pub mod admin {
    pub use forge_admin::*;

    /// The admin API of `node` as an axum router (the same as [`Node::admin_router`](crate::Node::admin_router)).
    pub fn router_for(node: &crate::Node) -> axum::Router {
        node.admin_router()
    }

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
/// doing ([`Workload`](inspect::Workload)). Every query reads PostgreSQL, so any process with
/// a pool answers for the whole cluster.
pub mod inspect {
    pub use forge_core::inspect::*;
    pub use forge_scheduler::inspect::*;
}

#[doc(hidden)]
pub use forge_core::sql::check_values as sql_check_values;

#[doc(hidden)]
pub mod __private {
    pub use forge_core::{Error, Result};
    pub use forge_scheduler::__private::*;

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
