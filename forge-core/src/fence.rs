//! The fence: the one check every leader-only write makes, in SQL (`forge.fence`, migration
//! 0004) and here.
//!
//! A write is fenced when its transaction first runs `forge.fence(namespace, role, epoch,
//! tenure)`. The function raises SQLSTATE `FG001` unless that tenure is the role's current,
//! unreleased one *and* its lock session is alive on this very server (no clock is read), and it holds
//! `FOR KEY SHARE` on the role's row until the transaction ends. A newer leader's epoch bump
//! takes `FOR UPDATE` on the same row, so every fenced write either commits before a newer
//! tenure exists or is refused. Statements that fence inside SQL functions (the job claims of
//! role workers, the scheduler's membership watch, cron tick claims and completions) call the
//! same function.

use sqlx::PgConnection;
use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::Query;

use crate::error::{Error, Result};
use crate::role::{Epoch, LockNamespace, Role};

/// The identity of one tenure: enough to fence writes made on its behalf, in any process.
///
/// Hand it to work done on the leader's behalf elsewhere (a job, another service) so that
/// work can fence its own writes with [`FenceToken::check`]. Unlike `Leadership::fence`, it
/// has no local deadline to consult: only PostgreSQL decides.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FenceToken {
    /// The lock namespace.
    pub namespace: String,
    /// The role's name.
    pub role: String,
    /// The epoch the writes are made under.
    pub epoch: i64,
    /// The tenure's random id: tells two tenures apart even if a database failover handed
    /// out an epoch twice.
    pub tenure: i64,
}

impl FenceToken {
    pub(crate) fn new(namespace: &LockNamespace, role: &Role, epoch: Epoch, tenure: i64) -> Self {
        FenceToken {
            namespace: namespace.name().to_owned(),
            role: role.name().to_owned(),
            epoch: epoch.0,
            tenure,
        }
    }

    /// Checks, inside the caller's open transaction, that this tenure is still the role's
    /// current leadership, and holds it (`FOR KEY SHARE` on the role's row) until the
    /// transaction ends. Outside a transaction the check protects nothing.
    ///
    /// Fails with [`Error::Fenced`] when a newer leadership exists, the tenure was released, or
    /// its lock session is gone from this server (ended by the server or a follower once the
    /// leader stopped renewing).
    pub async fn check(&self, conn: &mut PgConnection) -> Result<()> {
        self.bind(sqlx::query("SELECT forge.fence($1, $2, $3, $4)"))
            .execute(&mut *conn)
            .await
            .map_err(|err| self.map_error(err))?;
        Ok(())
    }

    /// Binds this tenure as the next four parameters of `query` - namespace, role, epoch,
    /// tenure, the order in which `forge.fence` and every fenced FORGE function take them:
    ///
    /// ```
    /// # fn demo(token: &forge_core::FenceToken) {
    /// let query = token
    ///     .bind(sqlx::query("SELECT forge.fence($1, $2, $3, $4), $5"))
    ///     .bind("and the statement's own parameters after them");
    /// # }
    /// ```
    pub fn bind<'q>(
        &self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        query
            .bind(self.namespace.as_str())
            .bind(self.role.as_str())
            .bind(self.epoch)
            .bind(self.tenure)
    }

    /// A database error as [`Error::Fenced`] when it is the fence's refusal.
    pub fn map_error(&self, err: sqlx::Error) -> Error {
        if Error::is_fence_refusal(&err) {
            self.fenced()
        } else {
            Error::Database(err)
        }
    }

    /// The [`Error::Fenced`] of this tenure.
    pub fn fenced(&self) -> Error {
        Error::Fenced {
            role: Role::new(&self.role).unwrap_or(Role::SCHEDULER),
            epoch: Epoch(self.epoch),
        }
    }
}
