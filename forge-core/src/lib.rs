//! FORGE core: leader roles on PostgreSQL advisory locks, membership, and the fence.
//!
//! Every leader role ([`Role::SCHEDULER`], [`Role::METRICS_AGGREGATOR`],
//! [`Role::LOG_COMPACTOR`], and your own) owns one advisory-lock key; the node whose dedicated
//! session holds it is the role's leader. Followers wait inside `pg_advisory_lock`, so a
//! crashed leader is replaced within milliseconds of its session ending; a frozen one is ended
//! by PostgreSQL (`idle_session_timeout` = the lease) and fenced by its tenure; a stopping one
//! hands over gracefully. Every node also keeps one node session: it holds the node's id
//! (two live nodes never share one), LISTENs, and heartbeats its membership row. See
//! the guide's architecture chapter (docs/src/architecture.md) for the mechanism and its
//! invariants.
//!
//! Crons and jobs plug into a node as [`Component`]s; this crate's mechanisms know nothing of
//! them (its [`Error`] is FORGE's one error type, so it has the variants they report). Users
//! depend on the `forge` facade, whose `Node` assembles everything:
//!
//! ```no_run
//! # async fn demo(leadership: forge_core::Leadership) -> forge_core::Result<()> {
//! // Leader-only writes, fenced by the tenure:
//! let mut tx = leadership.fenced_transaction().await?;
//! sqlx::query("INSERT INTO ticks (at) VALUES (now())").execute(&mut *tx).await?;
//! tx.commit().await?; // a newer leader cannot have started in between
//! # Ok(()) }
//! ```

pub mod config;
mod db;
mod duties;
mod election;
mod error;
mod fence;
pub mod inspect;
mod leadership;
mod membership;
pub mod metrics;
mod role;
mod runtime;
mod schema;
pub mod sql;
mod util;

pub use config::{
    AdminConfig, ClusterConfig, CoreConfig, DatabaseConfig, Env, LeaderElectionConfig,
    MembershipConfig, MetricsConfig, NodeConfig, ProcessEnv, no_env,
};
pub use db::{begin, not_postgres};
pub use election::{LeaderInfo, RoleState};
pub use error::{Error, Result, redact_url};
pub use fence::FenceToken;
pub use forge_rules::NameError;
pub use leadership::{LeaderSession, Leadership};
pub use membership::{ListenerEvent, NODES_CHANNEL, Standing};
pub use metrics::{Metrics, Tally};
pub use role::{Epoch, LockKey, LockNamespace, LockSlotError, NodeId, Role};
pub use runtime::{Assembly, Component, NodeContext, Runtime, shutdown_signal};
pub use schema::{
    APP_MIGRATIONS_TABLE, FUNCTIONS_TABLE, FunctionSource, FunctionState, FunctionStatus,
    MIGRATION_LOCK_PATIENCE, MIGRATION_LOCK_TIMEOUT, MIGRATIONS_TABLE, MigrationSource,
    MigrationState, MigrationStatus, Schema, apply_functions, apply_schema, check_history,
    function_status, migration_status, migrator, schema_script,
};

#[doc(hidden)]
pub use sqlx as __sqlx;
