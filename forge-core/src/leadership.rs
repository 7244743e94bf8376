//! A tenure: one node's leadership of one role at one epoch, handed to leader-only work.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::fence::FenceToken;
use crate::metrics::Metrics;
use crate::role::{Epoch, LockNamespace, NodeId, Role};

/// This node's leadership of a role, valid for one epoch.
///
/// Leader-only work receives it when the node wins the role and must stop when it is lost:
/// the task registered with `NodeBuilder::leader_task` is dropped the moment the leadership is
/// lost, and long-running work should also check [`Leadership::is_valid`] before each
/// leader-only action. Writes that must never be applied by a deposed leader go through
/// [`Leadership::fenced_transaction`], which PostgreSQL checks against the current epoch.
///
/// ```no_run
/// # async fn demo(leadership: forge_core::Leadership) -> forge_core::Result<()> {
/// let mut tx = leadership.fenced_transaction().await?;
/// sqlx::query("UPDATE accounts SET balance = balance * 1.01")
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?; // a newer leader cannot have started in between
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Leadership {
    tenure: Arc<Tenure>,
}

/// The role's lock session, shared by the campaign (renewals, release) and the leader's
/// duties ([`Leadership::session`]) for the tenure; the campaign takes it back at its end.
pub(crate) type SharedSession = Arc<Mutex<Option<PgConnection>>>;

pub(crate) struct Tenure {
    /// Whose tenure it is and what it may use.
    pub(crate) who: TenureParts,
    /// The lock session (see [`SharedSession`]).
    pub(crate) session: SharedSession,
    /// Cancelled when the leadership is over (lost, or released after a handoff).
    pub(crate) lost: CancellationToken,
    /// Cancelled when the node asks leader-only work to wind down before a handoff.
    pub(crate) draining: CancellationToken,
    /// The local deadline, in nanoseconds after `base`: the leader trusts its leadership until
    /// the send time of its last successful renewal plus the lease minus a safety margin,
    /// measured on the monotonic clock.
    deadline_nanos: AtomicU64,
    base: Instant,
}

/// Who a tenure belongs to and what it may use: everything but its deadline.
pub(crate) struct TenureParts {
    pub(crate) role: Role,
    pub(crate) namespace: LockNamespace,
    pub(crate) node_id: NodeId,
    pub(crate) epoch: Epoch,
    pub(crate) id: i64,
    pub(crate) acquired_at: DateTime<Utc>,
    pub(crate) lease: Duration,
    pub(crate) pool: PgPool,
    pub(crate) metrics: Metrics,
}

impl Tenure {
    pub(crate) fn new(who: TenureParts, session: SharedSession, deadline: Instant) -> Tenure {
        let tenure = Tenure {
            who,
            session,
            lost: CancellationToken::new(),
            draining: CancellationToken::new(),
            deadline_nanos: AtomicU64::new(0),
            base: Instant::now(),
        };
        tenure.extend_to(deadline);
        tenure
    }

    pub(crate) fn extend_to(&self, deadline: Instant) {
        let nanos = deadline.saturating_duration_since(self.base).as_nanos() as u64;
        self.deadline_nanos.store(nanos, Ordering::Release);
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.base + Duration::from_nanos(self.deadline_nanos.load(Ordering::Acquire))
    }
}

impl Leadership {
    pub(crate) fn new(tenure: Tenure) -> Leadership {
        Leadership {
            tenure: Arc::new(tenure),
        }
    }

    pub(crate) fn tenure(&self) -> &Tenure {
        &self.tenure
    }

    /// The role led.
    pub fn role(&self) -> &Role {
        &self.tenure.who.role
    }

    /// The epoch of this tenure (the fencing token).
    pub fn epoch(&self) -> Epoch {
        self.tenure.who.epoch
    }

    /// This node's id.
    pub fn node_id(&self) -> &NodeId {
        &self.tenure.who.node_id
    }

    /// When PostgreSQL granted this leadership.
    pub fn acquired_at(&self) -> DateTime<Utc> {
        self.tenure.who.acquired_at
    }

    /// The lock namespace the role belongs to (`[cluster] lock_namespace`).
    pub fn namespace(&self) -> &LockNamespace {
        &self.tenure.who.namespace
    }

    /// The lease duration this leadership is renewed with.
    pub fn lease_duration(&self) -> Duration {
        self.tenure.who.lease
    }

    /// The node's metrics registry as this tenure sees it, for leader-only work that records
    /// figures: a series first registered here is exported until the tenure ends (then it
    /// is removed, so that a node that no longer leads does not export a leader's figures,
    /// frozen); one the node exports too (say, a counter exported at 0 from the start, or
    /// registered through `NodeContext::metrics`) stays.
    pub fn metrics(&self) -> &Metrics {
        &self.tenure.who.metrics
    }

    /// The node's pool, for the leader's own queries.
    pub fn pool(&self) -> &PgPool {
        &self.tenure.who.pool
    }

    /// The role's own lock session, for short leader-only statements (the built-in roles'
    /// duties run here): it opens no connection, so an idle leader holds none beyond its
    /// lock sessions and node session. The lease is renewed on this session between your
    /// statements, so keep each one short: the session bounds statements and lock waits to a
    /// sixth of the lease (`statement_timeout`, `lock_timeout`), and a statement that holds it
    /// past the leader's deadline costs the leadership. Use it from leader tasks only (they
    /// are stopped before the tenure ends); for long or user work, use
    /// [`Leadership::fenced_transaction`] on the pool. Fails with [`Error::Fenced`] once the
    /// leadership is over.
    pub async fn session(&self) -> Result<LeaderSession> {
        self.check_local()?;
        let guard = self.tenure.session.clone().lock_owned().await;
        OwnedMutexGuard::try_map(guard, Option::as_mut)
            .map(LeaderSession)
            .map_err(|_| self.fenced())
    }

    /// Whether this node may still act as leader: the leadership was not lost and its local
    /// deadline (last renewal + lease - margin, monotonic clock) has not passed. Cheap; call it
    /// before every leader-only action. It stays true while draining for a handoff.
    pub fn is_valid(&self) -> bool {
        !self.tenure.lost.is_cancelled() && Instant::now() < self.tenure.deadline()
    }

    /// Whether a graceful handoff has begun (finish the current unit of work, start no new one).
    pub fn is_draining(&self) -> bool {
        self.tenure.draining.is_cancelled() || self.tenure.lost.is_cancelled()
    }

    /// Resolves when the leadership is over.
    pub async fn lost(&self) {
        self.tenure.lost.cancelled().await
    }

    /// Resolves when leader-only work should wind down: a handoff began or the leadership is
    /// over.
    pub async fn stopping(&self) {
        tokio::select! {
            _ = self.tenure.draining.cancelled() => {}
            _ = self.tenure.lost.cancelled() => {}
        }
    }

    /// Runs `work` until it completes or the leadership is lost (then `None`; the future is
    /// dropped at its next `.await`).
    pub async fn run<F: Future>(&self, work: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            _ = self.tenure.lost.cancelled() => None,
            output = work => Some(output),
        }
    }

    /// Begins a transaction on the node's pool in which this leadership is checked by
    /// PostgreSQL (see [`Leadership::fence`]). Commit it to apply the leader-only writes; when
    /// it fails with [`Error::Fenced`] this node is no longer the leader.
    ///
    /// The future may be dropped at any point (a cron's timeout, a lost leadership): the
    /// `BEGIN` runs on a task of its own, so a transaction begun for a caller that is gone is
    /// rolled back and its connection goes back to the pool outside any transaction.
    pub async fn fenced_transaction(&self) -> Result<Transaction<'static, Postgres>> {
        self.check_local()?;
        let mut tx = crate::db::begin(&self.tenure.who.pool).await?;
        self.fence(&mut tx).await?;
        Ok(tx)
    }

    /// Checks, inside the caller's open transaction, that this leadership is still the role's
    /// current one: first locally (not lost, deadline not passed), then in PostgreSQL with
    /// [`FenceToken::check`], which holds a `FOR KEY SHARE` lock on the role's row until the
    /// transaction ends. A newer leader's epoch bump takes `FOR UPDATE` on that row, so it
    /// waits for this transaction: every write in it either commits before a newer leader
    /// exists or is refused here. The transaction also commits with `synchronous_commit = on`.
    pub async fn fence(&self, conn: &mut PgConnection) -> Result<()> {
        self.check_local()?;
        self.fence_token().check(conn).await
    }

    /// The token to fence writes made on this leadership's behalf elsewhere.
    pub fn fence_token(&self) -> FenceToken {
        FenceToken::new(
            &self.tenure.who.namespace,
            &self.tenure.who.role,
            self.tenure.who.epoch,
            self.tenure.who.id,
        )
    }

    /// Fails with [`Error::Fenced`] when this leadership is lost or past its local deadline.
    pub fn check_local(&self) -> Result<()> {
        if self.is_valid() {
            Ok(())
        } else {
            Err(self.fenced())
        }
    }

    /// The [`Error::Fenced`] of this leadership.
    pub fn fenced(&self) -> Error {
        Error::Fenced {
            role: self.tenure.who.role.clone(),
            epoch: self.tenure.who.epoch,
        }
    }

    /// The tenure's random id (with the epoch, its identity; see [`FenceToken`]).
    pub fn tenure_id(&self) -> i64 {
        self.tenure.who.id
    }

    /// Whether the local deadline has passed (a frozen or cut-off leader).
    pub(crate) fn deadline_passed(&self) -> bool {
        Instant::now() >= self.tenure.deadline()
    }
}

/// Exclusive use of a leader's lock session ([`Leadership::session`]); derefs to the
/// connection. Drop it as soon as the statement is done: the lease renews on this session.
pub struct LeaderSession(OwnedMappedMutexGuard<Option<PgConnection>, PgConnection>);

impl std::ops::Deref for LeaderSession {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.0
    }
}

impl std::ops::DerefMut for LeaderSession {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.0
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("role", &self.tenure.who.role)
            .field("epoch", &self.tenure.who.epoch)
            .field("node_id", &self.tenure.who.node_id)
            .field("valid", &self.is_valid())
            .finish()
    }
}
