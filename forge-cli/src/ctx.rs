//! The configuration a command runs with, and its connection to the cluster's database.

use std::time::Duration;

use forge::db::redact_url;
use forge::inspect::{Cluster, Workload};
use forge::sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use forge::sqlx::{ConnectOptions, PgConnection};
use forge::{Config, LockNamespace};

use crate::args::Cli;
use crate::fail::Fail;

/// How long to try to reach PostgreSQL at most, whatever `[database] connect_timeout` says:
/// a person is waiting.
const CONNECT_CAP: Duration = Duration::from_secs(10);

/// The configuration (from `--config` or the environment) and the namespace.
pub(crate) struct Settings {
    pub(crate) config: Config,
    pub(crate) namespace: LockNamespace,
}

impl Settings {
    /// `--config FILE` (with the environment's overrides, as for nodes), else the environment
    /// alone; `--namespace` over `[cluster] lock_namespace`.
    pub(crate) fn load(cli: &Cli) -> Result<Settings, Fail> {
        let config = match &cli.config {
            Some(path) => Config::load(path)?,
            None => Config::from_env()?,
        };
        let namespace = match &cli.namespace {
            Some(name) => LockNamespace::new(name)
                .map_err(|err| Fail::usage(format!("--namespace: {err}")))?,
            None => config.lock_namespace()?,
        };
        Ok(Settings { config, namespace })
    }
}

/// A command's connection to the cluster.
pub(crate) struct Ctx {
    pub(crate) config: Config,
    pub(crate) namespace: LockNamespace,
    /// The database URL without its password, for messages.
    pub(crate) url: String,
    pub(crate) options: PgConnectOptions,
    pub(crate) pool: PgPool,
    /// Who acts, for the audit trail: `cli <user>@<host>`.
    pub(crate) by: String,
}

impl Ctx {
    /// Connects once (no retries: a person is waiting), with a clear error when it fails.
    pub(crate) async fn connect(settings: Settings) -> Result<Ctx, Fail> {
        let Settings { config, namespace } = settings;
        let url = config.database_url()?.to_owned();
        let shown = redact_url(&url);
        let options: PgConnectOptions = url.parse().map_err(|err: forge::sqlx::Error| {
            Fail::usage(format!(
                "cannot parse the database URL {shown}: {}; use postgres://user:password@host:port/database",
                err.to_string().replace(&url, &shown)
            ))
        })?;
        let by = format!("cli {}@{}", user(), host());
        let options =
            options.application_name(&truncate(&format!("forge:cli:{}@{}", user(), host()), 63));
        let timeout = config.database.connect_timeout.min(CONNECT_CAP);
        let first = connect_once(&options, timeout, &shown).await?;
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(timeout)
            .connect_lazy_with(options.clone());
        drop(first);
        Ok(Ctx {
            config,
            namespace,
            url: shown,
            options,
            pool,
            by,
        })
    }

    pub(crate) fn cluster(&self) -> Cluster {
        Cluster::new(
            self.pool.clone(),
            self.namespace.clone(),
            self.config.cluster.membership.drift_after,
        )
    }

    pub(crate) fn workload(&self) -> Workload {
        Workload::new(self.pool.clone(), self.namespace.clone())
    }

    /// One more connection of its own (the pooler check needs two, migrations one).
    pub(crate) async fn connection(&self) -> Result<PgConnection, Fail> {
        let timeout = self.config.database.connect_timeout.min(CONNECT_CAP);
        connect_once(&self.options, timeout, &self.url).await
    }
}

async fn connect_once(
    options: &PgConnectOptions,
    timeout: Duration,
    shown: &str,
) -> Result<PgConnection, Fail> {
    let err = match tokio::time::timeout(timeout, options.connect()).await {
        Ok(Ok(conn)) => return Ok(conn),
        Ok(Err(err)) => err,
        Err(_) => forge::sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {}", humantime::format_duration(timeout)),
        )),
    };
    // What reading a foreign server's answer as PostgreSQL's fails with.
    let protocol_trouble = match &err {
        forge::sqlx::Error::Protocol(_) => true,
        forge::sqlx::Error::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::InvalidData
                | std::io::ErrorKind::ConnectionReset
        ),
        _ => false,
    };
    let not_postgres = if protocol_trouble {
        forge::db::not_postgres(options).await
    } else {
        None
    };
    if let Some(answer) = not_postgres {
        return Err(Fail::problem(format!(
            "cannot connect to PostgreSQL at {shown}: the server there is not PostgreSQL (it answered {answer:?} to PostgreSQL's first message): check the host and port in DATABASE_URL / [database] url"
        )));
    }
    let what = match &err {
        forge::sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("28P01" | "28000") => format!(
                "authentication failed ({}): check the user and password in DATABASE_URL",
                db.message()
            ),
            Some("3D000") => format!(
                "{}: check the database name in DATABASE_URL / [database] url",
                db.message()
            ),
            _ => db.message().to_owned(),
        },
        other => format!("{other}: is PostgreSQL running? set DATABASE_URL or --config"),
    };
    Err(Fail::problem(format!(
        "cannot connect to PostgreSQL at {shown}: {what}"
    )))
}

fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// The user running the command: `$USER` / `$LOGNAME`, else the name of the process's uid in
/// /etc/passwd, else `uid<N>`.
fn user() -> String {
    ["USER", "LOGNAME", "USERNAME"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
        .or_else(user_from_uid)
        .unwrap_or_else(|| "unknown".to_owned())
}

fn user_from_uid() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let uid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .to_owned();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let name = passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        (fields.nth(1)? == uid).then(|| name.to_owned())
    });
    Some(name.unwrap_or_else(|| format!("uid{uid}")))
}

/// This host's name.
pub(crate) fn host() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}
