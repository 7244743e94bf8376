//! A test kit for your own handlers (the `testing` feature): a throwaway database with FORGE's
//! schema in one line, one job attempt run inline with a real context, assertions on what was
//! enqueued, one cron tick run on a real leader, and a cron driven by a fake clock.
//!
//! ```no_run
//! # #[forge::job] async fn send_welcome(_ctx: forge::JobContext, _email: String) -> Result<(), forge::JobError> { Ok(()) }
//! # async fn demo() -> forge::Result<()> {
//! let db = forge::testing::database().await?;
//! let run = forge::testing::run_job(db.pool(), send_welcome, "a@example.com".to_owned()).await?;
//! assert!(run.result.is_ok());
//! # Ok(()) }
//! ```
//!
//! The throwaway PostgreSQL is `forge-testkit`'s: the server of `DATABASE_URL` when it is set
//! (its user may `CREATE DATABASE`), else a cluster of its own started from the PostgreSQL
//! server binaries found on the machine (`initdb`, `postgres`), shared by the tests of one
//! process and removed when it ends. Each [`database`] is a fresh database on it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use forge_scheduler::TickState;
pub use forge_scheduler::testing::{
    CronClock, EnqueuedJob, JobRun, TEST_NODE, assert_enqueued, assert_not_enqueued, enqueued,
    run_job,
};
pub use forge_testkit::{PgServer, TestDatabase};
use sqlx::PgPool;

use crate::crons::IntoCron;
use crate::{Config, Error, Node, Result};

/// A fresh database with FORGE's schema, and a pool on it.
#[derive(Debug)]
pub struct TestDb {
    database: TestDatabase,
    pool: PgPool,
}

impl TestDb {
    /// A pool on the database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Its URL (for a node's `[database] url`).
    pub fn url(&self) -> &str {
        self.database.url()
    }

    /// A node configuration on this database for a test: node id `test`, the election's timings
    /// short (a leader within a second).
    pub fn config(&self) -> Config {
        let mut config = Config::default();
        config.database.url = Some(self.url().to_owned());
        config.node.id = Some("test".to_owned());
        let election = &mut config.cluster.leader_election;
        election.lease_duration = Duration::from_secs(2);
        election.refresh_interval = Duration::from_millis(500);
        election.lock_timeout = Duration::from_secs(1);
        election.check_interval = Duration::from_millis(500);
        config
    }
}

/// A fresh database on the tests' PostgreSQL, with FORGE's schema applied.
pub async fn database() -> Result<TestDb> {
    let unreachable = |err: forge_testkit::Error| Error::Connect {
        message: format!("cannot start or reach a PostgreSQL for tests: {err}"),
        source: sqlx::Error::Configuration(err.to_string().into()),
    };
    let server = PgServer::shared().map_err(unreachable)?;
    let database = server.create_database().await.map_err(unreachable)?;
    let pool = database.pool().await.map_err(unreachable)?;
    let mut conn = pool.acquire().await?;
    crate::migrate::up(&mut conn).await?;
    drop(conn);
    Ok(TestDb { database, pool })
}

/// What one tick run by [`run_cron`] did.
#[derive(Debug)]
pub struct CronRun {
    /// The tick's instant (a manual tick: when it was asked for).
    pub scheduled_at: DateTime<Utc>,
    /// Its final state in the ledger.
    pub state: TickState,
    /// The handler's error, if it failed.
    pub error: Option<String>,
    /// The jobs it enqueued (committed), oldest first.
    pub enqueued: Vec<EnqueuedJob>,
}

/// Runs one tick of `cron` on a real leader: starts a node on `db` with this cron alone (no job
/// types: the jobs the tick enqueues stay in `forge.jobs`, for [`CronRun::enqueued`]), waits
/// until it leads the cron's role, asks for a manual tick ("trigger now"), waits until the ledger has
/// its outcome, and stops the node. The handler's context is a leader's:
/// `ctx.fenced_transaction()`, `ctx.complete(&mut tx)` and `ctx.jobs()` work as in production.
/// Fails after 30 s without an outcome.
pub async fn run_cron(db: &TestDb, cron: impl IntoCron + 'static) -> Result<CronRun> {
    let job = cron.cron_job()?;
    let name = job.name().to_owned();
    let mut config = db.config();
    config.node.roles = Some(vec![job.role_name().name().to_owned()]);
    config.node.campaign_without_work = true;
    let before: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM forge.jobs")
        .fetch_one(db.pool())
        .await?;
    let node = Node::builder(config)
        .auto_register(false)
        .cron(job)
        .start()
        .await?;
    let outcome = tick(db, &node, &name).await;
    node.shutdown().await;
    let (scheduled_at, state, error) = outcome?;
    let enqueued =
        sqlx::query_as("SELECT id, kind, args, queue FROM forge.jobs WHERE id > $1 ORDER BY id")
            .bind(before)
            .fetch_all(db.pool())
            .await?;
    Ok(CronRun {
        scheduled_at,
        state,
        error,
        enqueued,
    })
}

/// Triggers `name` once its node leads and waits for the tick's final state.
async fn tick(
    db: &TestDb,
    node: &Node,
    name: &str,
) -> Result<(DateTime<Utc>, TickState, Option<String>)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let workload = node.workload();
    let mut at = None;
    loop {
        if at.is_none() {
            // The cron is known once its node registered it.
            at = workload.trigger_cron(name, "forge::testing").await?;
        }
        if let Some(at) = at {
            let row: Option<(TickState, Option<String>)> = sqlx::query_as(
                "SELECT state, error FROM forge.cron_ticks
                  WHERE cron = $1 AND scheduled_at = $2 AND state <> 'running'",
            )
            .bind(name)
            .bind(at)
            .fetch_optional(db.pool())
            .await?;
            if let Some((state, error)) = row {
                return Ok((at, state, error));
            }
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::NotRunning {
                what: format!("cron `{name}`"),
                why: "its tick had no outcome within 30 s (did the node become its role's leader?)"
                    .into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
