//! Errors that end a command: what is wrong, what to do, and the exit code.

use std::fmt;

/// Exit code: the command ran and found something wrong (a problem, an unknown id).
pub(crate) const PROBLEM: u8 = 1;
/// Exit code: the command line or the configuration is wrong.
pub(crate) const USAGE: u8 = 2;

/// A command that could not do its work.
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Fail {
    /// Bad command line or configuration (exit 2).
    pub(crate) fn usage(message: impl Into<String>) -> Fail {
        Fail {
            code: USAGE,
            message: message.into(),
        }
    }

    /// Something is wrong or not found (exit 1).
    pub(crate) fn problem(message: impl Into<String>) -> Fail {
        Fail {
            code: PROBLEM,
            message: message.into(),
        }
    }

    /// A database error, with what to do about the usual ones.
    pub(crate) fn database(err: &forge::sqlx::Error) -> Fail {
        use forge::sqlx::Error as E;
        match err {
            E::Database(db)
                if matches!(
                    db.code().as_deref(),
                    Some("42P01" | "3F000" | "42883" | "42703")
                ) =>
            {
                Fail::problem(format!(
                    "FORGE's schema is missing from this database or older than this CLI ({}): \
                     run `forge migrate status`, then `forge migrate up` (or start a node)",
                    db.message()
                ))
            }
            E::Io(_) | E::PoolTimedOut | E::Protocol(_) | E::Tls(_) => Fail::problem(format!(
                "lost the connection to PostgreSQL ({err}): is PostgreSQL running? \
                 set DATABASE_URL or --config"
            )),
            other => Fail::problem(format!("database error: {other}")),
        }
    }
}

impl From<forge::Error> for Fail {
    fn from(err: forge::Error) -> Fail {
        match err {
            forge::Error::Config { .. }
            | forge::Error::ConfigRead { .. }
            | forge::Error::InvalidInput { .. } => Fail::usage(err.to_string()),
            forge::Error::Database(db) => Fail::database(&db),
            other => Fail::problem(other.to_string()),
        }
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The result of a command: the exit code it wants (0 or [`PROBLEM`]), or why it failed.
pub(crate) type Outcome = Result<u8, Fail>;
