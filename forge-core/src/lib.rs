//! FORGE core: leader roles on PostgreSQL advisory locks.
//!
//! Every leader role ([`Role::SCHEDULER`], [`Role::METRICS_AGGREGATOR`],
//! [`Role::LOG_COMPACTOR`], and your own) owns one advisory-lock key; the node whose dedicated
//! session holds it is the role's leader. Followers wait inside `pg_advisory_lock`, so a
//! crashed leader is replaced within milliseconds of its session ending; a frozen one is ended
//! by PostgreSQL (`idle_session_timeout` = the lease) and fenced by its epoch; a stopping one
//! hands over gracefully. See ARCHITECTURE.md for the mechanism and its invariants.
//!
//! ```no_run
//! use forge_core::{Config, Node, Role};
//!
//! # async fn demo() -> forge_core::Result<()> {
//! let node = Node::builder(Config::load("forge.toml")?)
//!     .leader_task(Role::SCHEDULER, "tick", |leadership| async move {
//!         while leadership.is_valid() && !leadership.is_draining() {
//!             // Leader-only work, fenced by epoch:
//!             let mut tx = match leadership.fenced_transaction().await {
//!                 Ok(tx) => tx,
//!                 Err(_) => return, // no longer the leader
//!             };
//!             sqlx::query("INSERT INTO ticks (at) VALUES (now())")
//!                 .execute(&mut *tx)
//!                 .await
//!                 .ok();
//!             tx.commit().await.ok();
//!             tokio::time::sleep(std::time::Duration::from_secs(1)).await;
//!         }
//!     })
//!     .start()
//!     .await?;
//! node.run_until_signal().await; // SIGTERM / ctrl-c: graceful handoff
//! # Ok(()) }
//! ```

mod config;
mod db;
mod election;
mod error;
mod leadership;
mod metrics;
mod node;
mod role;
mod util;

#[doc(hidden)]
pub use config::reference_path;
pub use config::{
    ClusterConfig, Config, CronConfig, DatabaseConfig, Env, JobsConfig, LeaderElectionConfig,
    MetricsConfig, NodeConfig, ProcessEnv, no_env, validate_queue_name,
};
pub use election::{LeaderInfo, RoleState};
pub use error::{Error, Result, redact_url};
pub use leadership::{FenceToken, Leadership};
pub use metrics::Metrics;
pub use node::{ListenerEvent, Node, NodeBuilder, NodeContext, shutdown_signal};
pub use role::{Epoch, LockKey, LockNamespace, NodeId, Role};
