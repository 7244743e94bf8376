//! The error type of the test kit.

use std::sync::Arc;
use std::time::Duration;

/// Everything that can go wrong in the test kit.
///
/// Messages are written for the person reading a failed test: they say what
/// was attempted, what happened and, where it helps, what to do about it
/// (including the tail of the server log or of a process's output).
///
/// `Error` is `Clone` so that one failure (for example the shared server not
/// starting) can be handed to every test that asks for it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No PostgreSQL server binaries could be found for a throwaway cluster.
    #[error(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: install them (Debian/Ubuntu: \
         `apt-get install postgresql`; macOS: `brew install postgresql`), set FORGE_PG_BIN to \
         their directory, or set DATABASE_URL to a server where this user may CREATE DATABASE"
    )]
    BinariesNotFound,

    /// The environment or an argument is unusable (bad `DATABASE_URL`,
    /// missing OS user, bad option, ...). The message says which and why.
    #[error("{0}")]
    Config(String),

    /// A helper command (`initdb`, `pg_ctl`, `runuser`, ...) failed.
    #[error("{command} failed: {detail}")]
    Command {
        /// The command line, shortened to what identifies it.
        command: String,
        /// Exit status and captured output, or the spawn error.
        detail: String,
    },

    /// The PostgreSQL server did not start.
    #[error(
        "PostgreSQL did not start on port {port}: {detail}\n--- last lines of {log} ---\n{log_tail}"
    )]
    ServerStart {
        /// The TCP port it was asked to listen on.
        port: u16,
        /// What `pg_ctl` reported.
        detail: String,
        /// Path of the server log.
        log: String,
        /// The last lines the server wrote to its log during this attempt.
        log_tail: String,
    },

    /// A database operation (connect, `CREATE DATABASE`, ...) failed.
    #[error("{context}: {source}")]
    Database {
        /// What was being done, e.g. `connecting to postgres://...`.
        context: String,
        /// The sqlx error.
        source: Arc<sqlx::Error>,
    },

    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        source: Arc<std::io::Error>,
    },

    /// Something awaited did not happen in time.
    #[error("timed out after {waited:?} waiting for {what}{details}")]
    Timeout {
        /// What was awaited (as given by the caller).
        what: String,
        /// How long we waited.
        waited: Duration,
        /// Extra context, e.g. the last lines of a process's output; empty or
        /// starting with a separator.
        details: String,
    },

    /// A child process misbehaved or could not be signalled (for example it
    /// exited before printing the awaited line). The message includes the
    /// process name and its last output lines where relevant.
    #[error("{0}")]
    Process(String),

    /// The operation is not allowed on this server (for example restarting an
    /// external server or the shared one).
    #[error("{0}")]
    Unsupported(String),

    /// The transaction-pooling proxy could not be started.
    #[error("TxPooler: {0}")]
    Proxy(String),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source: Arc::new(source),
        }
    }

    pub(crate) fn db(context: impl Into<String>, source: sqlx::Error) -> Self {
        Error::Database {
            context: context.into(),
            source: Arc::new(source),
        }
    }
}
