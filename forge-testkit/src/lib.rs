//! # forge-testkit
//!
//! Test helpers for code that coordinates several processes through one
//! PostgreSQL, as FORGE does (leader election, crons, jobs). Everything runs
//! against a real PostgreSQL; nothing is mocked.
//!
//! * [`PgServer`]: PostgreSQL for tests. [`PgServer::shared`] is the server
//!   all tests of a process share (`DATABASE_URL`, or a throwaway cluster
//!   started on first use); [`PgServer::start`] gives a private throwaway
//!   cluster for tests that stop, restart or crash PostgreSQL. Throwaway
//!   clusters are removed when the process ends, however it ends.
//! * [`TestDatabase`]: a fresh, empty, uniquely named database per test.
//! * [`NodeProcess`]: a child process (a node binary) with captured output
//!   that can be killed (`SIGKILL`), paused (`SIGSTOP`) and resumed.
//! * [`TxPooler`]: a proxy behaving like PgBouncer in transaction mode, to
//!   prove such a pooler is detected and refused.
//! * [`PgProxy`]: a TCP proxy for the PostgreSQL protocol between nodes and
//!   a server, to inject network faults per connection, chosen by
//!   `application_name` prefix, replication or id ([`Filter`]):
//!   [`blackhole`](PgProxy::blackhole) (silence both ways, nothing closed:
//!   a half-open flow or a partition; reconnects hang too),
//!   [`sever`](PgProxy::sever) (a reset), and
//!   [`retarget`](PgProxy::retarget) (new connections go to another server,
//!   e.g. a promoted standby). [`PgProxy::connections`] lists who is
//!   connected and in which state.
//! * Primary failover: [`PgServer::start_standby`] makes an asynchronous
//!   streaming hot standby of a private cluster (optionally replicating
//!   through a [`PgProxy`], to make it fall behind);
//!   [`PgServer::wait_caught_up`] waits until it has replayed everything
//!   committed on the primary; [`PgServer::promote`] makes it the primary.
//! * Write stalls: [`PgServer::set_synchronous_standby`] makes such a
//!   standby synchronous (and the primary asynchronous again), and
//!   [`PgServer::pause_wal_receiver`] / [`PgServer::resume_wal_receiver`]
//!   freeze and thaw its WAL receiver: while it is frozen, commits on the
//!   primary wait and reads do not.
//! * Clock steps: a cluster started with
//!   [`PgOptions::steppable_clock`] runs under libfaketime, and
//!   [`PgServer::step_clock_ahead`] / [`PgServer::step_clock_back`] /
//!   [`PgServer::step_clock_to_true_time`] step its wall clock while it runs
//!   (its monotonic clock stays true, as in an NTP step).
//! * Crashes nobody ordered: [`PgServer::crash_watch`] reads a throwaway
//!   cluster's log as it grows and reports each crash of a server process
//!   after which the postmaster restarted every session ([`ServerCrash`]:
//!   the exit line and what the process wrote to stderr), so that a test or
//!   a soak does not blame the code under test for what the server did.
//! * [`wait_until`] / [`wait_for`]: poll a condition with a deadline, with an
//!   error saying what was awaited. Tests never sleep to synchronise.
//!
//! ## Finding PostgreSQL
//!
//! With `DATABASE_URL` set, [`PgServer::shared`] uses that server (its user
//! must be allowed to `CREATE DATABASE`). Otherwise the kit runs its own
//! clusters with the server binaries from `FORGE_PG_BIN` (a directory),
//! `pg_config --bindir`, `initdb` on `PATH`, or the newest
//! `/usr/lib/postgresql/*/bin`. Running as root, PostgreSQL is run as the OS
//! user `postgres` (or `FORGE_PG_OS_USER`) through `runuser`, since `initdb`
//! refuses to run as root. [`client_program`] finds a client (`psql`,
//! `pg_dump`) beside those binaries, or on `PATH`.
//!
//! Environment variables: `DATABASE_URL`, `FORGE_PG_BIN`,
//! `FORGE_PG_OS_USER`, `FORGE_PG_TMPDIR` (where clusters live),
//! `FORGE_FAKETIME_LIB` (libfaketime's `libfaketime.so.1`, when not in the usual place),
//! `FORGE_TEST_ECHO=1` (echo node output to stderr),
//! `FORGE_KEEP_TEST_DATABASES=1` (keep test databases on an external server).
//!
//! The crate also has a binary, `forge-pg`, which starts a throwaway cluster,
//! prints its `DATABASE_URL` and keeps it until interrupted: handy for
//! running a node by hand.
//!
//! ## Example
//!
//! ```
//! use std::time::Duration;
//! use forge_testkit::{PgServer, wait_until};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = PgServer::shared()?;            // DATABASE_URL, or a throwaway cluster
//! let db = server.create_database().await?;    // fresh and empty, just for this test
//! let pool = db.pool().await?;
//! sqlx::raw_sql("CREATE TABLE leader (node text)").execute(&pool).await?;
//!
//! // Something else (a node process, a task) is expected to write the row...
//! # sqlx::raw_sql("INSERT INTO leader VALUES ('node-a')").execute(&pool).await?;
//! let leader: String = wait_until("a leader to be elected", Duration::from_secs(10), Duration::from_millis(50), || {
//!     let pool = pool.clone();
//!     async move { sqlx::query_scalar("SELECT node FROM leader").fetch_optional(&pool).await.ok().flatten() }
//! })
//! .await?;
//! assert_eq!(leader, "node-a");
//! # Ok(()) }
//! ```

mod error;
mod pg;
mod pooler;
mod process;
mod proxy;
pub mod stats;
mod sys;

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

pub use error::Error;
pub use pg::{
    CrashWatch, Lsn, PgOptions, PgServer, ServerCrash, TestDatabase, client_program,
    faketime_library, skewed_clock_env,
};
pub use pooler::TxPooler;
pub use process::NodeProcess;
pub use proxy::{Filter, PgProxy, ProxyConnection, ProxyConnectionState};

/// Polls `f` every `poll_every` until it returns `Some(value)`, and returns
/// the value; fails with [`Error::Timeout`] naming `what` if `timeout`
/// passes first. `f` is always called at least once, and once more at the
/// deadline.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), forge_testkit::Error> {
/// use std::time::Duration;
///
/// let epoch: i64 = forge_testkit::wait_until("epoch 2", Duration::from_secs(10), Duration::from_millis(20), || {
///     let pool = pool.clone();
///     async move {
///         let epoch: Option<i64> = sqlx::query_scalar("SELECT max(epoch) FROM leases").fetch_one(&pool).await.ok()?;
///         epoch.filter(|e| *e >= 2)
///     }
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn wait_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    poll_every: Duration,
    mut f: F,
) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for(what, timeout, poll_every, || {
        let attempt = f();
        async move { attempt.await.ok_or("not yet") }
    })
    .await
}

/// Like [`wait_until`], for conditions that can say why they are not met
/// yet: `f` returns `Ok(value)` when done, or `Err(reason)`; on timeout the
/// last reason is part of the error (`... last observed: <reason>`).
///
/// ```no_run
/// # async fn demo(url: &str) -> Result<(), forge_testkit::Error> {
/// use std::time::Duration;
/// use sqlx::Connection;
///
/// let conn = forge_testkit::wait_for("the server to accept connections", Duration::from_secs(10), Duration::from_millis(50), || {
///     sqlx::PgConnection::connect(url)
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn wait_for<T, E, F, Fut>(
    what: &str,
    timeout: Duration,
    poll_every: Duration,
    mut f: F,
) -> Result<T, Error>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let start = Instant::now();
    let deadline = start + timeout;
    let mut attempts = 0u64;
    loop {
        attempts += 1;
        let last = match f().await {
            Ok(value) => return Ok(value),
            Err(reason) => reason.to_string(),
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout {
                what: what.to_owned(),
                waited: now - start,
                details: format!(" ({attempts} attempts; last observed: {last})"),
            });
        }
        tokio::time::sleep_until((now + poll_every).min(deadline)).await;
    }
}
