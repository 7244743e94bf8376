//! Streaming standbys of throwaway clusters, promotion, and WAL positions:
//! the pieces of a primary-failover test.

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use sqlx::{Connection as _, PgConnection};

use super::{Cluster, Kind, PgServer, append_settings, read_log_tail, unique_suffix};
use crate::{Error, PgProxy, wait_for};

/// `pg_promote(wait_seconds => ...)`: how long PostgreSQL may take to promote.
const PROMOTE_WAIT_SECS: u64 = 60;
/// How often [`PgServer::wait_caught_up`] looks at the standby.
const CATCH_UP_POLL: Duration = Duration::from_millis(10);
/// SQLSTATE `object_not_in_prerequisite_state`: PostgreSQL's answer to
/// recovery functions on a primary and WAL functions on a standby.
const NOT_IN_PREREQUISITE_STATE: &str = "55000";

/// A position in the write-ahead log (PostgreSQL's `pg_lsn`), shown as
/// PostgreSQL shows it (`0/3000148`). Positions compare in WAL order.
///
/// ```
/// use forge_testkit::Lsn;
///
/// let lsn: Lsn = "16/B374D848".parse()?;
/// assert_eq!(lsn, Lsn(0x16_B374_D848));
/// assert_eq!(lsn.to_string(), "16/B374D848");
/// assert!(lsn > "0/3000148".parse()?);
/// # Ok::<(), forge_testkit::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl FromStr for Lsn {
    type Err = Error;

    fn from_str(s: &str) -> Result<Lsn, Error> {
        let invalid = || Error::Config(format!("invalid LSN {s:?}: expected <hex>/<hex>"));
        let (high, low) = s.trim().split_once('/').ok_or_else(invalid)?;
        let high = u32::from_str_radix(high, 16).map_err(|_| invalid())?;
        let low = u32::from_str_radix(low, 16).map_err(|_| invalid())?;
        Ok(Lsn(u64::from(high) << 32 | u64::from(low)))
    }
}

impl PgServer {
    /// Starts an asynchronous streaming standby of this throwaway cluster
    /// (the primary), for failover tests; `via`: let it replicate through a
    /// [`PgProxy`] forwarding to this server, so a test can black-hole or
    /// sever replication ([`Filter::Replication`](crate::Filter::Replication),
    /// or [`Filter::ApplicationPrefix`](crate::Filter::ApplicationPrefix) with
    /// [`standby_application_name`](PgServer::standby_application_name)).
    ///
    /// The standby is a `pg_basebackup` of the primary (taken directly, not
    /// through `via`) in its own temporary directory, removed like any
    /// throwaway cluster's (see [`PgServer`]), started on a free port with
    /// `hot_standby` on: it serves read-only queries and replays the
    /// primary's WAL as it streams in. It uses no replication slot, so the
    /// primary never keeps WAL for it: one left behind for very long (over
    /// `max_wal_size` of WAL) may be unable to catch up when replication
    /// resumes. Blocks until the standby accepts connections. Everything in
    /// the primary's `postgresql.conf` ([`PgOptions`](crate::PgOptions)) is
    /// inherited, and so is a steppable clock
    /// ([`PgOptions::steppable_clock`](crate::PgOptions::steppable_clock)): the
    /// standby's starts at true time and is stepped on its own, so that it can
    /// be stepped after a failover promoted it.
    ///
    /// The control methods ([`stop`](PgServer::stop),
    /// [`kill_immediate`](PgServer::kill_immediate),
    /// [`restart`](PgServer::restart), ...) work on the standby, before and
    /// after [`promote`](PgServer::promote); a restarted standby is still a
    /// standby.
    ///
    /// Errors on an external server and on the shared one (use
    /// [`PgServer::start`] for the primary), and if `via` does not forward
    /// to this server.
    pub fn start_standby(&self, via: Option<&PgProxy>) -> Result<PgServer, Error> {
        let primary = self.standby_source()?;
        let (host, port) = match via {
            Some(proxy) => {
                let upstream = proxy.upstream();
                if upstream != (self.host.clone(), self.port) {
                    return Err(Error::Config(format!(
                        "start_standby: the PgProxy on port {} forwards to {}:{}, not to this \
                         primary at {}:{}; start it with PgProxy::start(primary.host(), primary.port())",
                        proxy.port(),
                        upstream.0,
                        upstream.1,
                        self.host,
                        self.port
                    )));
                }
                (proxy.host().to_owned(), proxy.port())
            }
            None => (self.host.clone(), self.port),
        };
        let name = format!("forge-testkit-standby-{}", unique_suffix());
        let mut standby = Cluster::guarded(primary.env.clone(), "forge-pg-standby", Some(name))?;
        if primary.clock.is_some() {
            standby.clock = Some(Box::new(super::clock::SteppedClock::new(&standby.dir)?));
        }
        standby.base_backup(self.port)?;
        standby.configure_standby(&host, port)?;
        standby.start_on_free_port()?;
        Ok(PgServer {
            host: "127.0.0.1".to_owned(),
            port: standby.port,
            kind: Kind::Throwaway(standby),
        })
    }

    /// The `application_name` this standby's WAL receiver connects with
    /// (`forge-testkit-standby-<unique>`), to select its replication
    /// connection in a [`PgProxy`]. `None` for servers not made by
    /// [`start_standby`](PgServer::start_standby).
    pub fn standby_application_name(&self) -> Option<&str> {
        match &self.kind {
            Kind::Throwaway(c) => c.walreceiver_name.as_deref(),
            Kind::External { .. } => None,
        }
    }

    /// Promotes this standby to a primary (`SELECT pg_promote(true, 60)`):
    /// returns once it accepts writes (`pg_is_in_recovery()` is false). What
    /// it had not received from its primary by then is lost to it, as in a
    /// real failover; its old primary is not touched (stop or kill it to
    /// avoid a split brain, or keep it to test one).
    ///
    /// Blocks the calling thread (it runs its query on a helper thread, so
    /// any runtime or none will do). Errors on a server that is not a
    /// standby ([`Error::Unsupported`]), and on external and shared servers.
    pub fn promote(&self) -> Result<(), Error> {
        let cluster = self.controllable("promote")?;
        let _guard = cluster.ctl.lock().unwrap_or_else(PoisonError::into_inner);
        let url = self.url();
        let promoted = block_on_helper_thread(async move {
            let mut conn = PgConnection::connect(&url).await?;
            let sql = format!("SELECT pg_promote(true, {PROMOTE_WAIT_SECS})");
            let promoted = sqlx::query_scalar::<_, bool>(sqlx::AssertSqlSafe(sql))
                .fetch_one(&mut conn)
                .await;
            let _ = conn.close().await;
            promoted
        })?;
        let port = self.port;
        match promoted {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::Timeout {
                what: format!("the standby on port {port} to finish its promotion"),
                waited: Duration::from_secs(PROMOTE_WAIT_SECS),
                details: cluster.log_tail_details(),
            }),
            Err(sqlx::Error::Database(e))
                if e.code().as_deref() == Some(NOT_IN_PREREQUISITE_STATE) =>
            {
                Err(Error::Unsupported(format!(
                    "cannot promote the server on port {port}: it is not a standby ({})",
                    e.message()
                )))
            }
            Err(e) => Err(Error::db(
                format!(
                    "promoting the standby on port {port} (SELECT pg_promote){}",
                    cluster.log_tail_details()
                ),
                e,
            )),
        }
    }

    /// Whether the server is in recovery (`pg_is_in_recovery()`): `true` for
    /// a standby, `false` for a primary or a promoted standby.
    pub async fn is_in_recovery(&self) -> Result<bool, Error> {
        let mut conn = self.admin_connection().await?;
        let in_recovery = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await
            .map_err(|e| {
                Error::db(
                    format!("SELECT pg_is_in_recovery() on port {}", self.port),
                    e,
                )
            });
        let _ = conn.close().await;
        in_recovery
    }

    /// The primary's WAL position up to which everything is on disk
    /// (`pg_current_wal_flush_lsn()`): every transaction committed so far
    /// ends at or before it. Errors on a standby ([`Error::Unsupported`]).
    pub async fn current_wal_lsn(&self) -> Result<Lsn, Error> {
        let mut conn = self.admin_connection().await?;
        let lsn = sqlx::query_scalar::<_, String>("SELECT pg_current_wal_flush_lsn()::text")
            .fetch_one(&mut conn)
            .await;
        let _ = conn.close().await;
        match lsn {
            Ok(lsn) => lsn.parse(),
            Err(sqlx::Error::Database(e))
                if e.code().as_deref() == Some(NOT_IN_PREREQUISITE_STATE) =>
            {
                Err(Error::Unsupported(format!(
                    "the server on port {} is a standby (in recovery): it writes no WAL of its own \
                     ({}); use replay_lsn()",
                    self.port,
                    e.message()
                )))
            }
            Err(e) => Err(Error::db(
                format!("SELECT pg_current_wal_flush_lsn() on port {}", self.port),
                e,
            )),
        }
    }

    /// The standby's last replayed WAL position
    /// (`pg_last_wal_replay_lsn()`), or `None` on a server that never was in
    /// recovery.
    pub async fn replay_lsn(&self) -> Result<Option<Lsn>, Error> {
        let mut conn = self.admin_connection().await?;
        let lsn = replay_lsn_on(&mut conn).await.map_err(|e| {
            Error::db(
                format!("SELECT pg_last_wal_replay_lsn() on port {}", self.port),
                e,
            )
        });
        let _ = conn.close().await;
        lsn?.map(|lsn| lsn.parse()).transpose()
    }

    /// Waits until `standby` has replayed everything this primary had
    /// flushed when the call started ([`current_wal_lsn`](PgServer::current_wal_lsn)),
    /// so every transaction committed before the call is visible on the
    /// standby. Returns the standby's replay position.
    ///
    /// Fails at once if `standby` is not in recovery, and with
    /// [`Error::Timeout`] (including the standby's log tail, which says why
    /// replication is stuck) if `timeout` passes first.
    pub async fn wait_caught_up(
        &self,
        standby: &PgServer,
        timeout: Duration,
    ) -> Result<Lsn, Error> {
        let target = self.current_wal_lsn().await?;
        if !standby.is_in_recovery().await? {
            return Err(Error::Unsupported(format!(
                "the server on port {} is not a standby (pg_is_in_recovery() is false): it will \
                 not replay the WAL of the server on port {}",
                standby.port, self.port
            )));
        }
        // One connection for all the polls (FnMut closures cannot lend a
        // captured connection to the futures they return).
        let conn = Arc::new(tokio::sync::Mutex::new(standby.admin_connection().await?));
        let what = format!(
            "the standby on port {} to replay the WAL of the primary on port {} up to {target}",
            standby.port, self.port
        );
        let caught_up = wait_for(&what, timeout, CATCH_UP_POLL, || {
            let conn = conn.clone();
            async move {
                let mut conn = conn.lock().await;
                match replay_lsn_on(&mut conn).await {
                    Ok(Some(lsn)) => match lsn.parse::<Lsn>() {
                        Ok(lsn) if lsn >= target => Ok(lsn),
                        Ok(lsn) => Err(format!("replayed up to {lsn}")),
                        Err(e) => Err(e.to_string()),
                    },
                    Ok(None) => Err("nothing replayed yet".to_owned()),
                    Err(e) => Err(format!("cannot read the replay position: {e}")),
                }
            }
        })
        .await;
        if let Ok(conn) = Arc::try_unwrap(conn).map(tokio::sync::Mutex::into_inner) {
            let _ = conn.close().await;
        }
        caught_up.map_err(|e| match (e, &standby.kind) {
            (
                Error::Timeout {
                    what,
                    waited,
                    details,
                },
                Kind::Throwaway(cluster),
            ) => Error::Timeout {
                what,
                waited,
                details: format!("{details}{}", cluster.log_tail_details()),
            },
            (e, _) => e,
        })
    }

    /// Makes `standby` (made of this primary by
    /// [`start_standby`](PgServer::start_standby)) the primary's synchronous
    /// standby, or with `None` makes the primary asynchronous again: sets
    /// `synchronous_standby_names` to the standby's WAL receiver name (or
    /// resets it) with `ALTER SYSTEM` and `pg_reload_conf()`, and returns once
    /// `pg_stat_replication` shows the standby as `sync` (or no standby as
    /// anything but `async`), within `timeout`.
    ///
    /// While a standby is synchronous, every commit that wrote something
    /// waits until the standby has flushed its WAL (`synchronous_commit` on,
    /// the default): pause its WAL receiver
    /// ([`pause_wal_receiver`](PgServer::pause_wal_receiver)) and writes
    /// stall on the primary while reads go on, as with a stalled disk or
    /// network behind a synchronous standby. Sessions that set
    /// `synchronous_commit` to `local` or `off` do not wait.
    ///
    /// The setting is written to the primary's `postgresql.auto.conf`: it
    /// survives a restart, and a standby made meanwhile inherits it (set
    /// `None` before making or promoting one). Errors on external and shared
    /// servers and for a server that has no WAL receiver name (not made by
    /// `start_standby`); [`Error::Timeout`] if the standby does not show as
    /// synchronous in time (it is not connected to this primary).
    pub async fn set_synchronous_standby(
        &self,
        standby: Option<&PgServer>,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.controllable("change the synchronous standby of")?;
        let name = match standby {
            Some(standby) => Some(standby.standby_application_name().ok_or_else(|| {
                Error::Unsupported(format!(
                    "the server on port {} has no WAL receiver name of the kit's: make it with \
                     PgServer::start_standby",
                    standby.port
                ))
            })?),
            None => None,
        };
        let mut conn = self.admin_connection().await?;
        let sql = match name {
            Some(name) => format!(
                "ALTER SYSTEM SET synchronous_standby_names = '\"{}\"'",
                name.replace('\'', "''").replace('"', "\"\"")
            ),
            None => "ALTER SYSTEM RESET synchronous_standby_names".to_owned(),
        };
        let set = async {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                .execute(&mut conn)
                .await?;
            sqlx::query("SELECT pg_reload_conf()")
                .execute(&mut conn)
                .await
        }
        .await;
        if let Err(e) = set {
            let _ = conn.close().await;
            return Err(Error::db(format!("{sql} on port {}", self.port), e));
        }
        let conn = Arc::new(tokio::sync::Mutex::new(conn));
        let what = match name {
            Some(name) => format!(
                "the standby {name} to be the synchronous standby of the primary on port {}",
                self.port
            ),
            None => format!("the primary on port {} to be asynchronous", self.port),
        };
        let wanted = name.map(str::to_owned);
        let settled = wait_for(&what, timeout, CATCH_UP_POLL, || {
            let conn = conn.clone();
            let wanted = wanted.clone();
            async move {
                let mut conn = conn.lock().await;
                // Each poll is a new statement: the backend has reloaded its configuration.
                let rows: Vec<(String, String)> = sqlx::query_as(
                    "SELECT coalesce(application_name, ''), coalesce(sync_state, '')
                       FROM pg_stat_replication",
                )
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| format!("cannot read pg_stat_replication: {e}"))?;
                let names: String = sqlx::query_scalar("SHOW synchronous_standby_names")
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(|e| format!("cannot read synchronous_standby_names: {e}"))?;
                let seen =
                    format!("synchronous_standby_names = {names:?}, pg_stat_replication: {rows:?}");
                let done = match &wanted {
                    Some(wanted) => rows
                        .iter()
                        .any(|(app, state)| app == wanted && state == "sync"),
                    None => names.is_empty() && rows.iter().all(|(_, state)| state == "async"),
                };
                if done { Ok(()) } else { Err(seen) }
            }
        })
        .await;
        if let Ok(conn) = Arc::try_unwrap(conn).map(tokio::sync::Mutex::into_inner) {
            let _ = conn.close().await;
        }
        settled
    }

    /// Freezes this standby's WAL receiver (`SIGSTOP` to the process
    /// `pg_stat_wal_receiver` names) and returns its pid: the standby stops
    /// receiving, flushing and acknowledging WAL while its connection to the
    /// primary stays open. With the standby synchronous
    /// ([`set_synchronous_standby`](PgServer::set_synchronous_standby)),
    /// commits on the primary wait until
    /// [`resume_wal_receiver`](PgServer::resume_wal_receiver). Left frozen
    /// for over a minute (`wal_sender_timeout`), the primary drops the
    /// replication connection and the standby reconnects once resumed.
    ///
    /// Errors on external and shared servers, and on a server with no WAL
    /// receiver running (a primary, or a standby not connected to one).
    pub async fn pause_wal_receiver(&self) -> Result<u32, Error> {
        let pid = self.wal_receiver_pid("pause the WAL receiver of").await?;
        crate::sys::send_signal(pid, libc::SIGSTOP)
            .map_err(|e| Error::io(format!("SIGSTOP to the WAL receiver (pid {pid})"), e))?;
        Ok(pid)
    }

    /// Resumes the WAL receiver [`pause_wal_receiver`](PgServer::pause_wal_receiver)
    /// froze (`SIGCONT`; harmless if it is not frozen) and returns its pid:
    /// it catches up, and commits waiting for it on a primary that has it as
    /// synchronous standby complete.
    pub async fn resume_wal_receiver(&self) -> Result<u32, Error> {
        let pid = self.wal_receiver_pid("resume the WAL receiver of").await?;
        crate::sys::send_signal(pid, libc::SIGCONT)
            .map_err(|e| Error::io(format!("SIGCONT to the WAL receiver (pid {pid})"), e))?;
        Ok(pid)
    }

    /// The pid of this standby's WAL receiver (`pg_stat_wal_receiver`, which
    /// shows it even while it is frozen).
    async fn wal_receiver_pid(&self, op: &str) -> Result<u32, Error> {
        self.controllable(op)?;
        let mut conn = self.admin_connection().await?;
        let pid: Result<Option<i32>, _> =
            sqlx::query_scalar("SELECT pid FROM pg_stat_wal_receiver WHERE pid IS NOT NULL")
                .fetch_optional(&mut conn)
                .await;
        let _ = conn.close().await;
        match pid {
            Ok(Some(pid)) if pid > 0 => Ok(pid as u32),
            Ok(_) => Err(Error::Unsupported(format!(
                "cannot {op} the server on port {}: it runs no WAL receiver (not a standby, or \
                 not connected to its primary)",
                self.port
            ))),
            Err(e) => Err(Error::db(
                format!("SELECT pid FROM pg_stat_wal_receiver on port {}", self.port),
                e,
            )),
        }
    }

    /// A connection to the maintenance database, for the kit's own queries.
    async fn admin_connection(&self) -> Result<PgConnection, Error> {
        let url = self.url();
        PgConnection::connect(&url)
            .await
            .map_err(|e| Error::db(format!("connecting to {}", super::redact(&url)), e))
    }

    /// The primary a standby can be made of: a throwaway cluster of ours.
    fn standby_source(&self) -> Result<&Cluster, Error> {
        match &self.kind {
            Kind::External { .. } => Err(Error::Unsupported(
                "cannot start a standby of an external PostgreSQL server (DATABASE_URL): the test \
                 kit makes standbys only of throwaway clusters it owns; use PgServer::start() for \
                 the primary"
                    .to_owned(),
            )),
            Kind::Throwaway(c) if c.shared => Err(Error::Unsupported(
                "cannot start a standby of the shared PostgreSQL server: it would copy every test's \
                 database; use PgServer::start() for the primary"
                    .to_owned(),
            )),
            Kind::Throwaway(c) => Ok(c),
        }
    }
}

impl Cluster {
    /// `pg_basebackup` of the primary on `primary_port` into `self.data`,
    /// with `standby.signal` (`-R`). A fast checkpoint, so it does not wait
    /// for a spread one; no fsync, like the rest of a throwaway cluster.
    fn base_backup(&self, primary_port: u16) -> Result<(), Error> {
        let mut cmd = self.pg_command("pg_basebackup");
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-h", "127.0.0.1", "-p"])
            .arg(primary_port.to_string())
            .args([
                "-U",
                "postgres",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
                "-R",
            ]);
        self.run(
            cmd,
            &format!("pg_basebackup of the primary on port {primary_port}"),
        )
        .map(drop)
    }

    /// Settings of a standby replicating from `host:port`: its own socket
    /// directory (the copied one is the primary's, which may go away before
    /// the standby), hot standby, and the connection to the primary.
    fn configure_standby(&self, host: &str, port: u16) -> Result<(), Error> {
        append_settings(
            &self.data.join("postgresql.conf"),
            &[
                (
                    "unix_socket_directories",
                    self.dir.to_string_lossy().into_owned(),
                ),
                ("hot_standby", "on".to_owned()),
            ],
        )?;
        let name = self.walreceiver_name.as_deref().unwrap_or("walreceiver");
        // postgresql.auto.conf is read last, and -R wrote its own
        // primary_conninfo there: appending ours makes ours win.
        append_settings(
            &self.data.join("postgresql.auto.conf"),
            &[(
                "primary_conninfo",
                format!("host={host} port={port} user=postgres application_name={name}"),
            )],
        )
    }

    /// `\n--- last lines of <log> ---\n<tail>`, for error details.
    fn log_tail_details(&self) -> String {
        let tail = read_log_tail(&self.log, 0);
        format!("\n--- last lines of {} ---\n{tail}", self.log.display())
    }
}

async fn replay_lsn_on(conn: &mut PgConnection) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_last_wal_replay_lsn()::text")
        .fetch_one(conn)
        .await
}

/// Runs `future` to completion on a new thread with its own runtime: works
/// from synchronous code and from inside any runtime (where blocking on
/// another runtime directly would panic).
fn block_on_helper_thread<F>(future: F) -> Result<F::Output, Error>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let helper = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map(|runtime| runtime.block_on(future))
    });
    match helper.join() {
        Ok(result) => result.map_err(|e| Error::io("building a runtime for the kit's queries", e)),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsns_parse_print_and_order() {
        assert_eq!("0/0".parse::<Lsn>().unwrap(), Lsn(0));
        assert_eq!("1/0".parse::<Lsn>().unwrap(), Lsn(1 << 32));
        assert_eq!(Lsn(0x3000148).to_string(), "0/3000148");
        assert_eq!(Lsn(u64::MAX).to_string(), "FFFFFFFF/FFFFFFFF");
        assert!("0/3000148".parse::<Lsn>().unwrap() < "1/0".parse().unwrap());
        for bad in ["", "3000148", "0/x", "1/2/3", "100000000/0"] {
            let err = bad.parse::<Lsn>().unwrap_err();
            assert!(err.to_string().contains("invalid LSN"), "{bad}: {err}");
        }
    }
}
