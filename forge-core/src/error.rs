//! The one error type of `forge-core`.
//!
//! Messages are lowercase, say what was wrong and what to do, and never contain a password
//! (database URLs are always shown through [`redact_url`]).

use std::path::PathBuf;

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
        "roles `{first}` and `{second}` resolve to the same advisory lock key {key}: rename one of them or give it an explicit key with `Role::with_lock_key`"
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
        role: String,
        /// The stale epoch.
        epoch: i64,
    },

    /// Applying FORGE's migrations failed.
    #[error("applying FORGE's database migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),

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

    /// A cron or job definition cannot be used (duplicate name, invalid schedule, ...).
    #[error("{message}")]
    Registration {
        /// What is wrong and what to do.
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

/// Replaces the password of a PostgreSQL URL with `***`, for messages and logs.
pub fn redact_url(url: &str) -> String {
    // postgres://user:password@host/...  ->  postgres://user:***@host/...
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &authority[..colon],
            &rest[at..]
        ),
        _ => url.to_owned(),
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
}
