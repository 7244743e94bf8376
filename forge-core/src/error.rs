//! The one error type of `forge-core`.
//!
//! Messages are lowercase, say what was wrong and what to do, and never contain a password
//! (database URLs are always shown through [`redact_url`]).

use std::path::PathBuf;

use forge_rules::NameError;

use crate::role::{Epoch, LockSlotError, NodeId, Role};

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in FORGE's core.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `forge.toml` (or the environment) holds a value FORGE cannot use.
    #[error("{}", display_config_error(path, *line, key, message))]
    Config {
        /// The file, when the value came from one.
        path: Option<PathBuf>,
        /// 1-based line in that file, when known.
        line: Option<usize>,
        /// Dotted key (`cluster.leader_election.lease_duration`) or environment variable.
        key: String,
        /// What is wrong and what is valid.
        message: String,
    },

    /// The configuration file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    ConfigRead {
        /// The file FORGE tried to read.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// PostgreSQL could not be reached or refused the connection.
    #[error("{message}")]
    Connect {
        /// A full sentence: what failed, where, and what to check.
        message: String,
        /// The driver error.
        #[source]
        source: sqlx::Error,
    },

    /// FORGE is connected through a transaction-mode pooler, which silently breaks session-level
    /// advisory locks.
    #[error(
        "the database connection goes through a transaction-mode pooler ({evidence}): \
         session advisory locks cannot work there. Connect FORGE directly to PostgreSQL \
         (or through a pooler in session mode) with a separate DATABASE_URL"
    )]
    TransactionPooler {
        /// What was observed (backend pids changing between statements, ...).
        evidence: String,
    },

    /// The advisory-lock key of a role is held by a session that is not a FORGE node.
    #[error(
        "the advisory lock key {key} of role `{role}` is held by a session that is not a FORGE node \
         (pid {pid}, application_name {application:?}); another application uses the same key: \
         set [cluster] lock_namespace in forge.toml to a value of your own"
    )]
    LockKeyConflict {
        /// The role whose key is taken.
        role: String,
        /// The 64-bit key.
        key: i64,
        /// Backend pid of the holder.
        pid: i32,
        /// `application_name` of the holder.
        application: String,
    },

    /// Two roles resolve to the same advisory-lock key.
    #[error(
        "roles `{first}` and `{second}` resolve to the same advisory lock key {key}: rename one of them or give one an explicit slot with `Role::with_lock_slot`"
    )]
    DuplicateLockKey {
        /// One role.
        first: String,
        /// The other role.
        second: String,
        /// The shared key.
        key: i64,
    },

    /// A leader-only write was attempted by a node that no longer holds the epoch it names.
    #[error(
        "fenced: role `{role}` epoch {epoch} is no longer the current leadership; the write was not applied"
    )]
    Fenced {
        /// The role.
        role: Role,
        /// The stale epoch.
        epoch: Epoch,
    },

    /// Another live node already runs with this node's id.
    #[error(
        "another live node already uses the node id `{node_id}` ({holder}): give every node a unique id \
         with FORGE_NODE_ID or [node] id (on Kubernetes, the pod name; with host networking \
         $HOSTNAME is the same for every node on a host)"
    )]
    DuplicateNode {
        /// The id in use.
        node_id: NodeId,
        /// The session that holds it.
        holder: String,
    },

    /// A handler tried to complete work that is no longer running under it (it was rescued,
    /// cancelled or taken over by a newer leadership); nothing was written.
    #[error(
        "{what} is no longer running under this attempt: {why}; the transaction must not commit"
    )]
    NotRunning {
        /// The tick or job.
        what: String,
        /// What happened to it, as far as the database says.
        why: String,
    },

    /// A cron expression or time zone could not be parsed (`Schedule::parse`, `#[cron]`
    /// definitions built at run time). This is why the core depends on `forge-cron`: the one
    /// error type of FORGE converts from it.
    #[error(transparent)]
    Schedule(#[from] forge_cron::ScheduleError),

    /// Applying FORGE's migrations failed.
    #[error("applying FORGE's database migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),

    /// FORGE's schema in the database cannot be brought to this build's: it was made by
    /// another line of migrations (a development build from before the pre-1.0 squash), or a
    /// function file failed to apply.
    #[error("{message}")]
    Schema {
        /// A full sentence: what is wrong and what to do.
        message: String,
        /// The database error, when there was one.
        #[source]
        source: Option<sqlx::Error>,
    },

    /// Applying the application's own migrations (`NodeBuilder::migrations`) failed.
    #[error("applying the application's migrations failed: {0}")]
    AppMigrate(#[source] sqlx::migrate::MigrateError),

    /// Serving the Prometheus endpoint failed.
    #[error("cannot serve metrics on {listen}: {message}")]
    Metrics {
        /// The configured address.
        listen: String,
        /// Why.
        message: String,
    },

    /// A database statement failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),

    /// A definition installed on the node cannot be used: a cron, a job type, a component's
    /// settings (a duplicate name, an invalid schedule, a duration out of range, ...).
    #[error("{message}")]
    Registration {
        /// What is wrong and what to do.
        message: String,
    },

    /// A value given to a read model or an action is not valid (a queue or role name, a
    /// filter, a job's options when it is enqueued): the caller's input, not the cluster, is
    /// wrong.
    #[error("{message}")]
    InvalidInput {
        /// What is wrong and what to do.
        message: String,
    },

    /// Concurrent changes to the same rows kept an action from finishing (a job that kept
    /// moving between waiting and running while it was cancelled, a unique job's twin that
    /// vanished while it was enqueued). Doing it again usually succeeds.
    #[error("{message}")]
    Conflict {
        /// What raced with what, and what to do.
        message: String,
    },

    /// Job arguments could not be turned into JSON, or back.
    #[error("job arguments of `{kind}`: {message}")]
    Serialization {
        /// The job kind.
        kind: String,
        /// The serde error.
        message: String,
    },

    /// The node was asked to do something after it shut down.
    #[error("the FORGE node is shut down")]
    ShutDown,
}

/// Whether a connection failure may go away by itself (server starting, restarting, briefly
/// unreachable) as opposed to a mistake that needs a human (bad password, missing database).
pub(crate) fn is_transient(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => matches!(
            db.code().as_deref(),
            // cannot_connect_now, admin_shutdown, crash_shutdown, too_many_connections,
            // connection_exception class
            Some(
                "57P03"
                    | "57P01"
                    | "57P02"
                    | "53300"
                    | "08000"
                    | "08003"
                    | "08006"
                    | "08001"
                    | "08004"
            )
        ),
        _ => false,
    }
}

/// SQLSTATE of FORGE's fence (`forge.fence`) refusing a write.
pub(crate) const FENCED_SQLSTATE: &str = "FG001";

impl Error {
    /// Whether a database error is FORGE's fence refusing a leader-only write: the leadership
    /// it was made under is no longer current.
    pub fn is_fence_refusal(err: &sqlx::Error) -> bool {
        matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some(FENCED_SQLSTATE))
    }

    /// Whether the same work may succeed if tried again shortly: the database was briefly out
    /// of reach (connection lost, server restarting, pool exhausted) or the transaction lost a
    /// deadlock or serialization race. A mistake that needs a human (a refused write, bad
    /// input, a fence) is not.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Database(err) | Error::Connect { source: err, .. } => {
                is_transient(err)
                    || matches!(err, sqlx::Error::Database(db)
                        if matches!(db.code().as_deref(), Some("40001" | "40P01")))
            }
            _ => false,
        }
    }

    /// `err` as [`Error::Fenced`] when the fence refused it, else as a database error.
    pub fn fenced_or_database(err: sqlx::Error, role: &Role, epoch: Epoch) -> Error {
        if Error::is_fence_refusal(&err) {
            Error::Fenced {
                role: role.clone(),
                epoch,
            }
        } else {
            Error::Database(err)
        }
    }
}

/// A name that breaks its rule (a role's, from [`Role::new`]): the caller's input is wrong.
/// The message names the name already.
impl From<NameError> for Error {
    fn from(err: NameError) -> Error {
        Error::InvalidInput {
            message: err.to_string(),
        }
    }
}

impl From<LockSlotError> for Error {
    fn from(err: LockSlotError) -> Error {
        match err {
            LockSlotError::Name(err) => Error::from(err),
            LockSlotError::Reserved { .. } => Error::Config {
                path: None,
                line: None,
                key: "role".into(),
                message: err.to_string(),
            },
        }
    }
}

fn display_config_error(
    path: &Option<PathBuf>,
    line: Option<usize>,
    key: &str,
    message: &str,
) -> String {
    match (path, line) {
        (Some(path), Some(line)) => format!("{}:{line}: `{key}`: {message}", path.display()),
        (Some(path), None) => format!("{}: `{key}`: {message}", path.display()),
        (None, Some(line)) => format!("forge.toml:{line}: `{key}`: {message}"),
        (None, None) => format!("`{key}`: {message}"),
    }
}

/// Replaces the password of a PostgreSQL URL (or `key=value` connection string) with `***`,
/// for messages and logs.
///
/// Whatever the URL's shape - a password with an unescaped `/`, `?` or `@`, a `password=`
/// query parameter, a libpq keyword string - the password is not in the result. When in
/// doubt more is hidden, never less.
pub fn redact_url(url: &str) -> String {
    let mut out = match url.find("://") {
        Some(scheme_end) => {
            let (head, rest) = url.split_at(scheme_end + 3);
            // The user info ends at the last `@`: a password may contain `@`, `/` or `?`
            // unescaped, which would end the authority early for a strict URL parser.
            match rest.rfind('@') {
                Some(at) => {
                    let user_info = &rest[..at];
                    match user_info.find(':') {
                        Some(colon) => format!("{head}{}:***{}", &user_info[..colon], &rest[at..]),
                        None => url.to_owned(),
                    }
                }
                None => url.to_owned(),
            }
        }
        None => url.to_owned(),
    };
    redact_password_parameters(&mut out);
    out
}

/// Hides the value of every `password=...` parameter (query string or keyword/value form,
/// where libpq allows spaces around `=` and a quoted value: `password = 'a b\'c'`).
fn redact_password_parameters(text: &mut String) {
    const KEY: &str = "password";
    let mut from = 0;
    while let Some(found) = text[from..].to_ascii_lowercase().find(KEY) {
        let key_at = from + found;
        let bytes = text.as_bytes();
        let preceded_ok = key_at == 0 || matches!(bytes[key_at - 1], b'?' | b'&' | b' ' | b'\t');
        let mut at = key_at + KEY.len();
        let skip_blanks = |mut i: usize| {
            while i < bytes.len() && matches!(bytes[i], b' ' | b'\t') {
                i += 1;
            }
            i
        };
        at = skip_blanks(at);
        if !preceded_ok || bytes.get(at) != Some(&b'=') {
            from = key_at + KEY.len();
            continue;
        }
        let start = skip_blanks(at + 1);
        let end = if bytes.get(start) == Some(&b'\'') {
            // A quoted value ends at the first quote not escaped by a backslash.
            let mut i = start + 1;
            while i < bytes.len() && bytes[i] != b'\'' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            (i + 1).min(bytes.len())
        } else {
            text[start..]
                .find(['&', ' ', '\t'])
                .map_or(text.len(), |i| start + i)
        };
        text.replace_range(start..end, "***");
        from = start + 3;
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/app?sslmode=disable"),
            "postgres://app:***@db:5432/app?sslmode=disable"
        );
        assert_eq!(redact_url("postgres://app@db/app"), "postgres://app@db/app");
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(
            redact_url("postgres://a:b@c@host/db"),
            "postgres://a:***@host/db"
        );
    }

    #[test]
    fn redacts_every_shape_of_password() {
        for (url, secret) in [
            ("postgres://app:se/cret@db:5432/app", "se/cret"),
            ("postgres://app:se?cret@db/app", "se?cret"),
            ("postgres://app:s@e/c?r@db/app?sslmode=disable", "s@e/c?r"),
            (
                "postgres://app@db/app?password=hunter2&sslmode=off",
                "hunter2",
            ),
            (
                "postgres://app@db/app?sslmode=off&PASSWORD=hunter2",
                "hunter2",
            ),
            ("host=db user=app password=hunter2 dbname=app", "hunter2"),
            ("host=db password='hunter two' dbname=app", "two"),
            ("host=db password = 'it\\'s secret' dbname=app", "secret"),
            ("host=db password= hunter2", "hunter2"),
        ] {
            let shown = redact_url(url);
            assert!(!shown.contains(secret), "{url} -> {shown}");
            assert!(shown.contains("***"), "{url} -> {shown}");
        }
        assert_eq!(
            redact_url("postgres://db:5432/app"),
            "postgres://db:5432/app"
        );
    }
}
