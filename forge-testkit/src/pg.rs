//! PostgreSQL servers for tests: the shared one, private throwaway clusters,
//! and fresh databases.

use std::fmt;
use std::fs;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::str::FromStr as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool};

use crate::Error;
use crate::sys;

mod clock;
mod crashes;
mod standby;

pub use clock::{faketime_library, skewed_clock_env};
pub use crashes::{CrashWatch, ServerCrash};
pub use standby::Lsn;

/// How many times a throwaway cluster is started on a fresh port when the
/// chosen port was taken between choosing it and the server binding it.
const PORT_ATTEMPTS: usize = 5;
/// `pg_ctl -t`: seconds to wait for start/stop.
const PG_CTL_TIMEOUT_SECS: &str = "60";
/// Free space `/dev/shm` needs to be used for clusters.
const SHM_MIN_FREE: u64 = 2 << 30;
/// How many log lines an error shows.
const LOG_TAIL_LINES: usize = 30;

/// Options for a throwaway cluster started by [`PgServer::start_with`].
///
/// The defaults are tuned for tests: no `fsync`, 300 connections.
///
/// ```
/// use forge_testkit::PgOptions;
///
/// let options = PgOptions::default()
///     .max_connections(50)
///     .setting("log_statement", "all");
/// assert!(!options.durable);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOptions {
    /// `true`: `fsync=on`, `full_page_writes=on` (survives an OS crash).
    /// `false` (default): both off, which makes `CREATE DATABASE` and commits
    /// much cheaper. `synchronous_commit` stays `on` either way, so a crash of
    /// PostgreSQL itself ([`PgServer::kill_immediate`]) never loses a
    /// committed transaction; only an OS crash could.
    pub durable: bool,
    /// `max_connections` (default 300: several nodes with pools per test,
    /// many tests in parallel).
    pub max_connections: u32,
    /// Further `postgresql.conf` settings, `(name, value)`; values are quoted
    /// for you. Applied last, so they override the settings above.
    pub extra_settings: Vec<(String, String)>,
    /// `true`: the server runs under libfaketime, so that a test can step its wall clock while
    /// it runs ([`PgServer::step_clock_ahead`], [`PgServer::step_clock_back`],
    /// [`PgServer::step_clock_to_true_time`]); starting fails, saying what to install, where
    /// libfaketime is missing ([`faketime_library`]). Default `false`.
    pub steppable_clock: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            durable: false,
            max_connections: 300,
            extra_settings: Vec::new(),
            steppable_clock: false,
        }
    }
}

impl PgOptions {
    /// Sets [`durable`](PgOptions::durable).
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Sets [`max_connections`](PgOptions::max_connections).
    pub fn max_connections(mut self, max_connections: u32) -> Self {
        self.max_connections = max_connections;
        self
    }

    /// Sets [`steppable_clock`](PgOptions::steppable_clock).
    pub fn steppable_clock(mut self) -> Self {
        self.steppable_clock = true;
        self
    }

    /// Adds a `postgresql.conf` setting, e.g. `.setting("log_statement", "all")`.
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_settings.push((name.into(), value.into()));
        self
    }
}

/// A PostgreSQL server for tests: either an external one (`DATABASE_URL`) or
/// a throwaway cluster this process started and will remove.
///
/// * [`PgServer::shared`]: one server per test process, used by most tests;
///   each test takes its own fresh database with [`PgServer::create_database`].
/// * [`PgServer::start`]: a private throwaway cluster, for tests that stop,
///   restart or crash PostgreSQL.
///
/// A throwaway cluster lives in a temporary directory (`FORGE_PG_TMPDIR`,
/// else `/dev/shm` if it has at least 2 GiB free, else the system temporary
/// directory) and listens on `127.0.0.1` on a free port (and on a Unix
/// socket in its directory), with `trust` authentication for user
/// `postgres`. Its data directory is a copy of one `initdb` run per process,
/// so the first cluster of a process takes about a second and later ones a
/// few hundred milliseconds. It is stopped (`-m immediate`) and its directory removed when
/// the `PgServer` is dropped, and also when the process ends in any other way
/// (including `SIGKILL`, a panic in another thread, or statics never being
/// dropped): a small reaper process started with the cluster waits for a pipe
/// only this process holds, and cleans up when it closes.
///
/// The control methods ([`restart`](PgServer::restart),
/// [`stop`](PgServer::stop), ...) are synchronous and block the calling
/// thread for the time PostgreSQL needs (typically well under a second). If
/// other tasks of the same tokio runtime must keep running meanwhile (for
/// example in-process nodes whose leases should not freeze), call them via
/// `tokio::task::block_in_place` on a multi-threaded runtime, or from
/// `spawn_blocking`.
pub struct PgServer {
    host: String,
    port: u16,
    kind: Kind,
}

enum Kind {
    /// A server we do not own: never stopped or restarted.
    External { url: String },
    /// A throwaway cluster we started.
    Throwaway(Cluster),
}

impl fmt::Debug for PgServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("PgServer");
        d.field("url", &redact(&self.url()));
        match &self.kind {
            Kind::External { .. } => d.field("external", &true),
            Kind::Throwaway(c) => d.field("dir", &c.dir).field("shared", &c.shared),
        };
        d.finish()
    }
}

impl PgServer {
    /// The server shared by all tests of this process.
    ///
    /// If `DATABASE_URL` is set (and not empty), that server: it is external,
    /// never stopped or restarted by the kit, and its user must be allowed
    /// to `CREATE DATABASE`. Otherwise a throwaway cluster, started on first
    /// use and removed when the process ends.
    ///
    /// Synchronous, so any test can call it whatever its runtime; concurrent
    /// first calls wait for the one initialisation. If that fails, every
    /// caller gets the same error (the kit does not retry).
    pub fn shared() -> Result<&'static PgServer, Error> {
        static SHARED: OnceLock<Result<PgServer, Error>> = OnceLock::new();
        SHARED
            .get_or_init(|| match std::env::var("DATABASE_URL") {
                Ok(url) if !url.trim().is_empty() => PgServer::external(url.trim()),
                _ => {
                    let mut server = PgServer::start()?;
                    if let Kind::Throwaway(cluster) = &mut server.kind {
                        cluster.shared = true;
                    }
                    Ok(server)
                }
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// An external server given by URL (`postgres://user:password@host:port/db?...`).
    ///
    /// The database in the URL is the one the kit connects to in order to
    /// create test databases ([`url`](PgServer::url) returns the URL as
    /// given). The server is never stopped or restarted.
    pub fn external(url: &str) -> Result<PgServer, Error> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(Error::Config(format!(
                "DATABASE_URL must be a postgres:// or postgresql:// URL, got {:?}",
                redact(url)
            )));
        }
        let options = PgConnectOptions::from_str(url).map_err(|e| {
            Error::Config(format!("cannot parse database URL {}: {e}", redact(url)))
        })?;
        Ok(PgServer {
            host: options.get_host().to_owned(),
            port: options.get_port(),
            kind: Kind::External {
                url: url.to_owned(),
            },
        })
    }

    /// Starts a private throwaway cluster with default [`PgOptions`].
    pub fn start() -> Result<PgServer, Error> {
        PgServer::start_with(PgOptions::default())
    }

    /// Starts a private throwaway cluster with the given options.
    ///
    /// Blocks until the server accepts connections. See the type docs for
    /// where it lives and how it is cleaned up.
    pub fn start_with(options: PgOptions) -> Result<PgServer, Error> {
        let env = PgEnv::detect()?;
        let mut cluster = Cluster::guarded(env, "forge-pg", None)?;
        if options.steppable_clock {
            cluster.clock = Some(Box::new(clock::SteppedClock::new(&cluster.dir)?));
        }
        cluster.init(&options)?;
        cluster.start_on_free_port()?;
        Ok(PgServer {
            host: "127.0.0.1".to_owned(),
            port: cluster.port,
            kind: Kind::Throwaway(cluster),
        })
    }

    /// URL of the maintenance database: `postgres` on a throwaway cluster;
    /// for an external server, the URL as given.
    pub fn url(&self) -> String {
        match &self.kind {
            Kind::External { url } => url.clone(),
            Kind::Throwaway(_) => self.url_for("postgres"),
        }
    }

    /// URL of `database` on this server (same user, host, port and options).
    pub fn url_for(&self, database: &str) -> String {
        match &self.kind {
            Kind::External { url } => replace_database(url, database),
            Kind::Throwaway(_) => {
                format!(
                    "postgres://postgres@{}:{}/{}",
                    self.host,
                    self.port,
                    encode_path(database)
                )
            }
        }
    }

    /// Host name or address of the server.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// TCP port of the server.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether this is an external server (`DATABASE_URL` / [`PgServer::external`]).
    pub fn is_external(&self) -> bool {
        matches!(self.kind, Kind::External { .. })
    }

    /// Whether this is the process-wide server of [`PgServer::shared`].
    pub fn is_shared(&self) -> bool {
        match &self.kind {
            Kind::External { .. } => false,
            Kind::Throwaway(c) => c.shared,
        }
    }

    /// The PostgreSQL data directory of a throwaway cluster (`None` if external).
    pub fn data_dir(&self) -> Option<&Path> {
        match &self.kind {
            Kind::External { .. } => None,
            Kind::Throwaway(c) => Some(&c.data),
        }
    }

    /// The server log of a throwaway cluster (`None` if external).
    pub fn log_file(&self) -> Option<&Path> {
        match &self.kind {
            Kind::External { .. } => None,
            Kind::Throwaway(c) => Some(&c.log),
        }
    }

    /// Creates a fresh, empty, uniquely named database
    /// (`forge_test_<pid>_<counter>_<random>`).
    ///
    /// On a throwaway cluster it disappears with the cluster. On an external
    /// server it is dropped when the [`TestDatabase`] is dropped (set
    /// `FORGE_KEEP_TEST_DATABASES=1` to keep it for inspection).
    pub async fn create_database(&self) -> Result<TestDatabase, Error> {
        let name = format!("forge_test_{}", unique_suffix());
        let admin_url = self.url();
        let mut conn = PgConnection::connect(&admin_url)
            .await
            .map_err(|e| Error::db(format!("connecting to {}", redact(&admin_url)), e))?;
        let created = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await;
        let _ = conn.close().await;
        created.map_err(|e| {
            let hint = match &e {
                sqlx::Error::Database(db) if db.code().as_deref() == Some("42501") => {
                    " (the user needs the CREATEDB privilege)"
                }
                _ => "",
            };
            Error::db(
                format!("CREATE DATABASE {name} on {}{hint}", redact(&admin_url)),
                e,
            )
        })?;
        let drop_with = (self.is_external()
            && std::env::var_os("FORGE_KEEP_TEST_DATABASES")
                .is_none_or(|v| v.is_empty() || v == "0"))
        .then_some(admin_url);
        Ok(TestDatabase {
            url: self.url_for(&name),
            name,
            drop_with,
        })
    }

    /// Restarts PostgreSQL (`pg_ctl stop -m fast`, then start on the same
    /// port). Every existing connection is closed; committed data is kept.
    /// Starts the server if it was stopped.
    ///
    /// Errors on an external server and on the shared one.
    pub fn restart(&self) -> Result<(), Error> {
        let cluster = self.controllable("restart")?;
        let _guard = cluster.ctl.lock().unwrap_or_else(PoisonError::into_inner);
        if cluster.is_running()? {
            cluster.stop("fast")?;
        }
        cluster.start(cluster.port).map_err(StartError::into_error)
    }

    /// Stops PostgreSQL (`pg_ctl stop -m fast`): connections fail until
    /// [`start_again`](PgServer::start_again). For "database unreachable" tests.
    ///
    /// Errors on an external server and on the shared one.
    pub fn stop(&self) -> Result<(), Error> {
        let cluster = self.controllable("stop")?;
        let _guard = cluster.ctl.lock().unwrap_or_else(PoisonError::into_inner);
        cluster.stop("fast")
    }

    /// Crashes PostgreSQL (`pg_ctl stop -m immediate`: no shutdown
    /// checkpoint; the next start runs crash recovery). Committed data
    /// survives this (see [`PgOptions::durable`]). The server stays down
    /// until [`start_again`](PgServer::start_again).
    ///
    /// Errors on an external server and on the shared one.
    pub fn kill_immediate(&self) -> Result<(), Error> {
        let cluster = self.controllable("crash")?;
        let _guard = cluster.ctl.lock().unwrap_or_else(PoisonError::into_inner);
        cluster.stop("immediate")
    }

    /// [`kill_immediate`](PgServer::kill_immediate) followed by
    /// [`start_again`](PgServer::start_again): a crash-restart with crash
    /// recovery.
    pub fn restart_immediate(&self) -> Result<(), Error> {
        let cluster = self.controllable("crash-restart")?;
        let _guard = cluster.ctl.lock().unwrap_or_else(PoisonError::into_inner);
        cluster.stop("immediate")?;
        cluster.start(cluster.port).map_err(StartError::into_error)
    }

    /// Starts the server again after [`stop`](PgServer::stop) or
    /// [`kill_immediate`](PgServer::kill_immediate): same port, same data.
    pub fn start_again(&self) -> Result<(), Error> {
        let cluster = self.controllable("start")?;
        let _guard = cluster.ctl.lock().unwrap_or_else(PoisonError::into_inner);
        cluster.start(cluster.port).map_err(StartError::into_error)
    }

    /// Whether the server is running (`pg_ctl status`). Always `true` for an
    /// external server (the kit does not probe it).
    pub fn is_running(&self) -> Result<bool, Error> {
        match &self.kind {
            Kind::External { .. } => Ok(true),
            Kind::Throwaway(c) => c.is_running(),
        }
    }

    fn controllable(&self, op: &str) -> Result<&Cluster, Error> {
        match &self.kind {
            Kind::External { .. } => Err(Error::Unsupported(format!(
                "cannot {op} an external PostgreSQL server (DATABASE_URL): the test kit never \
                 stops or restarts a server it does not own; use PgServer::start() for a private cluster"
            ))),
            Kind::Throwaway(c) if c.shared => Err(Error::Unsupported(format!(
                "cannot {op} the shared PostgreSQL server: other tests of this process use it \
                 concurrently; use PgServer::start() for a private cluster"
            ))),
            Kind::Throwaway(c) => Ok(c),
        }
    }
}

/// A fresh database created by [`PgServer::create_database`].
///
/// Dropping it drops the database on an external server (best effort, with
/// `WITH (FORCE)`, in a helper thread so it works from any context); on a
/// throwaway cluster it simply goes away with the cluster.
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
    /// Maintenance URL to drop the database through on drop (external servers).
    drop_with: Option<String>,
}

impl TestDatabase {
    /// Connection URL of this database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Name of this database.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new connection pool (at most 10 connections) to this database.
    pub async fn pool(&self) -> Result<PgPool, Error> {
        PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&self.url)
            .await
            .map_err(|e| Error::db(format!("connecting a pool to {}", redact(&self.url)), e))
    }

    /// A single new connection to this database.
    pub async fn connect(&self) -> Result<PgConnection, Error> {
        PgConnection::connect(&self.url)
            .await
            .map_err(|e| Error::db(format!("connecting to {}", redact(&self.url)), e))
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let Some(admin_url) = self.drop_with.take() else {
            return;
        };
        let name = std::mem::take(&mut self.name);
        // A thread with its own runtime: works whether or not we are inside a
        // runtime, and whatever its flavour.
        let dropper = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(mut conn) = PgConnection::connect(&admin_url).await {
                    let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&mut conn)
                        .await;
                    let _ = conn.close().await;
                }
            });
        });
        let _ = dropper.join();
    }
}

/// Where the PostgreSQL binaries are and which OS user runs them.
#[derive(Clone)]
struct PgEnv {
    bin: PathBuf,
    /// OS user to run PostgreSQL as, with uid and gid (when we are root).
    os_user: Option<(String, u32, u32)>,
}

impl PgEnv {
    fn detect() -> Result<PgEnv, Error> {
        let bin = find_bin_dir()?;
        let os_user = if sys::is_root() {
            let user = std::env::var("FORGE_PG_OS_USER").unwrap_or_else(|_| "postgres".to_owned());
            let (uid, gid) = lookup_user(&user)?;
            Some((user, uid, gid))
        } else {
            None
        };
        Ok(PgEnv { bin, os_user })
    }

    fn os_user_name(&self) -> Option<&str> {
        self.os_user.as_ref().map(|(name, _, _)| name.as_str())
    }

    /// A command running PostgreSQL binary `program`, as the right OS user.
    fn command(&self, program: &str, cwd: &Path) -> Command {
        let exe = self.bin.join(program);
        let mut cmd = match self.os_user_name() {
            Some(user) => {
                let mut cmd = Command::new("runuser");
                cmd.arg("-u").arg(user).arg("--").arg(exe);
                cmd
            }
            None => Command::new(exe),
        };
        // cwd: a directory the OS user may enter. No stdin. Our own process
        // group, so a Ctrl-C meant for the test run does not reach pg_ctl
        // halfway through.
        cmd.current_dir(cwd).stdin(Stdio::null()).process_group(0);
        cmd
    }

    /// Runs `cmd`; an error with its output unless it succeeds.
    fn run(&self, mut cmd: Command, what: &str) -> Result<Output, Error> {
        let out = cmd.output().map_err(|e| Error::Command {
            command: what.to_owned(),
            detail: match (&self.os_user, e.kind()) {
                (Some(_), std::io::ErrorKind::NotFound) => {
                    format!("cannot run `runuser` ({e}); it is needed to run PostgreSQL as a non-root user")
                }
                _ => format!("cannot run it: {e}"),
            },
        })?;
        if out.status.success() {
            Ok(out)
        } else {
            Err(Error::Command {
                command: what.to_owned(),
                detail: describe_output(&out),
            })
        }
    }

    /// A new temporary directory owned by the OS user, and the reaper that
    /// stops the server in `<dir>/data` (if any) and removes the directory
    /// when this process lets go of it.
    fn guarded_dir(&self, prefix: &str) -> Result<(PathBuf, Child), Error> {
        let dir = temp_base().join(format!("{prefix}-{}", unique_suffix()));
        fs::create_dir(&dir)
            .map_err(|e| Error::io(format!("creating temporary directory {}", dir.display()), e))?;
        let prepared = match self.os_user {
            Some((_, uid, gid)) => std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| Error::io(format!("handing {} to its OS user", dir.display()), e)),
            None => Ok(()),
        }
        .and_then(|()| spawn_reaper(&self.bin, &dir.join("data"), &dir, self.os_user_name()));
        match prepared {
            Ok(reaper) => Ok((dir, reaper)),
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// `initdb` into `data`.
    fn initdb(&self, data: &Path, cwd: &Path) -> Result<(), Error> {
        let mut cmd = self.command("initdb", cwd);
        cmd.arg("-D").arg(data).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        self.run(cmd, "initdb").map(drop)
    }
}

/// A data directory fresh from `initdb`, made once per process and copied
/// for every cluster: `initdb` takes over a second, a copy a fraction of it.
/// Removed at process exit by its own reaper.
struct Template {
    data: PathBuf,
    /// Kept only for its stdin (the pipe the reaper waits on).
    _reaper: Mutex<Child>,
}

fn template(env: &PgEnv) -> Result<&'static Template, Error> {
    static TEMPLATE: OnceLock<Result<Template, Error>> = OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            let (dir, reaper) = env.guarded_dir("forge-pg-template")?;
            let template = Template {
                data: dir.join("data"),
                _reaper: Mutex::new(reaper),
            };
            env.initdb(&template.data, &dir)?;
            Ok(template)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A throwaway cluster: directory, binaries, and the reaper guarding both.
struct Cluster {
    env: PgEnv,
    /// The temporary directory: `data/`, `server.log`, the Unix socket.
    dir: PathBuf,
    data: PathBuf,
    log: PathBuf,
    /// The process-wide cluster of `PgServer::shared` (not controllable).
    shared: bool,
    port: u16,
    /// Serialises start/stop/restart.
    ctl: Mutex<()>,
    /// Stops the server and removes `dir` when its stdin closes.
    reaper: Mutex<Option<Child>>,
    /// A standby's WAL receiver `application_name` (`None` unless made by
    /// `PgServer::start_standby`).
    walreceiver_name: Option<String>,
    /// The wall clock a test steps (`PgOptions::steppable_clock`).
    clock: Option<Box<clock::SteppedClock>>,
}

/// Why a start failed.
enum StartError {
    /// The port was taken by someone else: worth retrying on another port.
    PortInUse(Error),
    Other(Error),
}

impl StartError {
    fn into_error(self) -> Error {
        match self {
            StartError::PortInUse(e) | StartError::Other(e) => e,
        }
    }
}

impl Cluster {
    /// A cluster in a new temporary directory. The reaper comes with the
    /// directory: from then on, whatever happens to this process, the
    /// directory (and the server, once started) is cleaned up.
    fn guarded(
        env: PgEnv,
        prefix: &str,
        walreceiver_name: Option<String>,
    ) -> Result<Cluster, Error> {
        let (dir, reaper) = env.guarded_dir(prefix)?;
        Ok(Cluster {
            data: dir.join("data"),
            log: dir.join("server.log"),
            dir,
            env,
            shared: false,
            port: 0,
            ctl: Mutex::new(()),
            reaper: Mutex::new(Some(reaper)),
            walreceiver_name,
            clock: None,
        })
    }

    fn pg_command(&self, program: &str) -> Command {
        self.env.command(program, &self.dir)
    }

    fn run(&self, cmd: Command, what: &str) -> Result<Output, Error> {
        self.env.run(cmd, what)
    }

    /// The data directory (a copy of the process's `initdb` template), and
    /// our settings.
    fn init(&self, options: &PgOptions) -> Result<(), Error> {
        let template = template(&self.env)?;
        let mut cp = Command::new("cp");
        cp.arg("-a")
            .arg(&template.data)
            .arg(&self.data)
            .stdin(Stdio::null());
        self.run(cp, "copying the initdb template")?;

        let mut settings = vec![
            ("listen_addresses", "127.0.0.1".to_owned()),
            (
                "unix_socket_directories",
                self.dir.to_string_lossy().into_owned(),
            ),
            ("max_connections", options.max_connections.to_string()),
        ];
        if !options.durable {
            settings.push(("fsync", "off".to_owned()));
            settings.push(("full_page_writes", "off".to_owned()));
        }
        settings.extend(
            options
                .extra_settings
                .iter()
                .map(|(name, value)| (name.as_str(), value.clone())),
        );
        append_settings(&self.data.join("postgresql.conf"), &settings)
    }

    fn start_on_free_port(&mut self) -> Result<(), Error> {
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            match self.start(port) {
                Ok(()) => {
                    self.port = port;
                    return Ok(());
                }
                Err(StartError::PortInUse(e)) => last = Some(e),
                Err(StartError::Other(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Config("no port attempts".to_owned())))
    }

    fn start(&self, port: u16) -> Result<(), StartError> {
        let log_offset = fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "-o"])
            .arg(format!("-p {port}"))
            .arg("start");
        if let Some(clock) = &self.clock {
            cmd.envs(clock.env());
        }
        let out = match cmd.output() {
            Ok(out) => out,
            Err(e) => {
                return Err(StartError::Other(Error::Command {
                    command: "pg_ctl start".to_owned(),
                    detail: format!("cannot run it: {e}"),
                }));
            }
        };
        if out.status.success() {
            return Ok(());
        }
        let log_tail = read_log_tail(&self.log, log_offset);
        let error = Error::ServerStart {
            port,
            detail: describe_output(&out),
            log: self.log.display().to_string(),
            log_tail: log_tail.clone(),
        };
        if log_tail.contains("could not bind") || log_tail.contains("already in use") {
            Err(StartError::PortInUse(error))
        } else {
            Err(StartError::Other(error))
        }
    }

    fn stop(&self, mode: &str) -> Result<(), Error> {
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "-m", mode, "stop"]);
        self.run(cmd, &format!("pg_ctl stop -m {mode}")).map(drop)
    }

    fn is_running(&self) -> Result<bool, Error> {
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D").arg(&self.data).arg("status");
        let out = cmd.output().map_err(|e| Error::Command {
            command: "pg_ctl status".to_owned(),
            detail: format!("cannot run it: {e}"),
        })?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(3) => Ok(false),
            _ => Err(Error::Command {
                command: "pg_ctl status".to_owned(),
                detail: describe_output(&out),
            }),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let reaper = self
            .reaper
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut reaper) = reaper {
            // Closing the pipe is the signal: the reaper stops the server
            // (-m immediate) and removes the directory. Wait for it, so the
            // cluster is really gone when drop returns.
            drop(reaper.stdin.take());
            let _ = reaper.wait();
        }
    }
}

/// Appends `name = 'value'` lines to a PostgreSQL configuration file (later
/// lines override earlier ones, so this wins over what the file had).
fn append_settings(path: &Path, settings: &[(&str, String)]) -> Result<(), Error> {
    let mut conf = String::from("\n# --- added by forge-testkit ---\n");
    for (name, value) in settings {
        conf.push_str(&format!("{name} = '{}'\n", value.replace('\'', "''")));
    }
    let mut file = fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    std::io::Write::write_all(&mut file, conf.as_bytes())
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// The reaper: `sh` blocked reading a pipe whose only write end is ours
/// (std opens pipes close-on-exec, so no other child inherits it). When the
/// write end closes - we dropped it, or this process died however it died -
/// `read` returns and the cluster is stopped and removed.
///
/// It runs in its own process group (a Ctrl-C of the test run must not kill
/// it before it has cleaned up) with its output discarded (it must not hold
/// the test run's stdout/stderr open).
fn spawn_reaper(
    bin: &Path,
    data: &Path,
    dir: &Path,
    os_user: Option<&str>,
) -> Result<Child, Error> {
    const SCRIPT: &str = r#"trap '' INT HUP
read -r _ignored
if [ -n "$4" ]; then
  runuser -u "$4" -- "$1" -D "$2" -m immediate -w stop
else
  "$1" -D "$2" -m immediate -w stop
fi
rm -rf -- "$3""#;
    Command::new("/bin/sh")
        .arg("-c")
        .arg(SCRIPT)
        .arg("forge-pg-reaper")
        .arg(bin.join("pg_ctl"))
        .arg(data)
        .arg(dir)
        .arg(os_user.unwrap_or(""))
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| Error::io("spawning the cleanup process (/bin/sh)", e))
}

/// A PostgreSQL client program (`psql`, `pg_dump`, ...): the one next to the server binaries
/// the kit runs (found as they are: see the crate's docs), else the first on `PATH` (with
/// `DATABASE_URL` set, a machine may have the clients only).
pub fn client_program(name: &str) -> Result<PathBuf, Error> {
    let beside_server = find_bin_dir().ok().map(|dir| dir.join(name));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(name));
    beside_server
        .into_iter()
        .chain(on_path)
        .find(|program| program.is_file())
        .ok_or_else(|| {
            Error::Config(format!(
                "the PostgreSQL client program {name} was not found beside the server binaries \
                 or on PATH: install PostgreSQL's clients (Debian/Ubuntu: postgresql-client)"
            ))
        })
}

/// Where the PostgreSQL server binaries are: `FORGE_PG_BIN`, then
/// `pg_config --bindir`, then `initdb` on `PATH`, then the highest version
/// under `/usr/lib/postgresql/*/bin` (Debian) or `/usr/pgsql-*/bin` (RHEL).
fn find_bin_dir() -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os("FORGE_PG_BIN").filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        return if has_server_binaries(&dir) {
            Ok(dir)
        } else {
            Err(Error::Config(format!(
                "FORGE_PG_BIN={} does not contain the PostgreSQL server binaries initdb and pg_ctl",
                dir.display()
            )))
        };
    }
    if let Ok(out) = Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_server_binaries(&dir) {
            return Ok(dir);
        }
    }
    if let Some(path) = std::env::var_os("PATH")
        && let Some(dir) = std::env::split_paths(&path).find(|d| has_server_binaries(d))
    {
        return Ok(dir);
    }
    let mut candidates: Vec<(Vec<u32>, PathBuf)> = Vec::new();
    for (parent, prefix) in [("/usr/lib/postgresql", ""), ("/usr", "pgsql-")] {
        let Ok(entries) = fs::read_dir(parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(version) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
                continue;
            };
            let Ok(version) = version
                .split('.')
                .map(str::parse)
                .collect::<Result<Vec<u32>, _>>()
            else {
                continue;
            };
            let dir = entry.path().join("bin");
            if has_server_binaries(&dir) {
                candidates.push((version, dir));
            }
        }
    }
    candidates
        .into_iter()
        .max()
        .map(|(_, dir)| dir)
        .ok_or(Error::BinariesNotFound)
}

/// Where throwaway clusters live: `FORGE_PG_TMPDIR` if set; else
/// `/dev/shm` when it is a RAM file system with room to spare (`initdb` and
/// the per-cluster copy are several times faster there than on a disk; small
/// container `/dev/shm`s are left alone); else the usual temporary directory.
fn temp_base() -> &'static Path {
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    BASE.get_or_init(|| {
        if let Some(dir) = std::env::var_os("FORGE_PG_TMPDIR").filter(|v| !v.is_empty()) {
            return PathBuf::from(dir);
        }
        let shm = Path::new("/dev/shm");
        let roomy = sys::available_bytes(shm).is_ok_and(|bytes| bytes >= SHM_MIN_FREE);
        if shm.is_dir() && roomy {
            shm.to_owned()
        } else {
            std::env::temp_dir()
        }
    })
}

fn has_server_binaries(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

/// uid and gid of an OS user (via `id`, to stay free of NSS bindings).
fn lookup_user(user: &str) -> Result<(u32, u32), Error> {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id")
            .arg(flag)
            .arg(user)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    match (id("-u"), id("-g")) {
        (Some(uid), Some(gid)) => Ok((uid, gid)),
        _ => Err(Error::Config(format!(
            "running as root, and initdb refuses to run as root, but there is no OS user {user:?} \
             to run PostgreSQL as: create it (`useradd --system {user}`), set FORGE_PG_OS_USER \
             to another unprivileged user, run the tests as a non-root user, or set DATABASE_URL"
        ))),
    }
}

fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| Error::io("binding 127.0.0.1:0 to find a free port", e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("reading the free port", e))
}

/// `<pid>_<counter>_<random>`: unique within the process, and across
/// processes sharing a temp dir or a server.
pub(crate) fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}_{}_{:04x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        fastrand::u16(..)
    )
}

fn describe_output(out: &Output) -> String {
    let mut text = format!("{}", out.status);
    for stream in [&out.stdout, &out.stderr] {
        let s = String::from_utf8_lossy(stream);
        if !s.trim().is_empty() {
            text.push('\n');
            text.push_str(s.trim_end());
        }
    }
    text
}

/// The last lines of the log written since `offset`.
fn read_log_tail(log: &Path, offset: u64) -> String {
    let mut text = String::new();
    let read = fs::File::open(log).and_then(|mut f| {
        f.seek(SeekFrom::Start(offset))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        text = String::from_utf8_lossy(&bytes).into_owned();
        Ok(())
    });
    if let Err(e) = read {
        return format!("(cannot read the log: {e})");
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// The URL with the password replaced by `***`, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        _ => url.to_owned(),
    }
}

/// The URL with its database (path) replaced, keeping user, host, port and query.
fn replace_database(url: &str, database: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let query = tail.find(['?', '#']).map_or("", |i| &tail[i..]);
    format!("{scheme}://{authority}/{}{query}", encode_path(database))
}

/// Percent-encodes everything but unreserved URL characters.
fn encode_path(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_database_keeping_everything_else() {
        assert_eq!(
            replace_database("postgres://u:p@h:5433/app?sslmode=disable", "forge_test_1"),
            "postgres://u:p@h:5433/forge_test_1?sslmode=disable"
        );
        assert_eq!(
            replace_database("postgresql://h", "db"),
            "postgresql://h/db"
        );
        assert_eq!(
            replace_database("postgres:///app?host=/run/pg", "x y"),
            "postgres:///x%20y?host=/run/pg"
        );
    }

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[test]
    fn external_rejects_non_urls() {
        let err = PgServer::external("host=localhost user=me").unwrap_err();
        assert!(err.to_string().contains("postgres://"), "{err}");
        let server = PgServer::external("postgres://me:pw@db.example:5433/app").unwrap();
        assert!(server.is_external());
        assert_eq!((server.host(), server.port()), ("db.example", 5433));
        assert_eq!(server.url_for("t"), "postgres://me:pw@db.example:5433/t");
        let err = server.restart().unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
    }

    #[test]
    fn missing_binaries_say_what_to_do() {
        assert_eq!(
            Error::BinariesNotFound.to_string(),
            "PostgreSQL server binaries (initdb, pg_ctl) not found: install them (Debian/Ubuntu: \
             `apt-get install postgresql`; macOS: `brew install postgresql`), set FORGE_PG_BIN to \
             their directory, or set DATABASE_URL to a server where this user may CREATE DATABASE"
        );
    }

    #[test]
    fn suffixes_are_unique() {
        assert_ne!(unique_suffix(), unique_suffix());
    }
}
