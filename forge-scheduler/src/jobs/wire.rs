//! The worker's wire format: the arguments of one `forge.jobs_step` call (and of the
//! `forge.jobs_reconcile` before it), sent as one round trip, and the rows they answer, decoded
//! into what the worker acts on. No worker state here: [`super::worker`] builds a [`Step`],
//! runs it off its own task, and takes in the [`StepAnswer`]s and [`Reconciled`]s.
//!
//! A claim carries the worker's identity: its node's incarnation and its lane's generation,
//! which each reconciliation advances and answers (`forge.jobs_step` claims nothing with any
//! other: see `forge.jobs_lane_take`). A round trip that reconciles claims with the generation
//! its reconciliation just answered.

use std::future::Future;
use std::time::Duration;

use forge_core::sql::Lenient;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgRow;
use sqlx::{FromRow, Postgres, Row};
use tokio::time::{Instant, timeout_at};

use super::JobState;
use super::shared::{Outcome, StepRow};

/// A position in the claim order: (priority, run_at, id) of the last job a worker claimed.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, sqlx::FromRow)]
pub(super) struct Floor {
    pub(super) priority: i16,
    pub(super) run_at: chrono::DateTime<chrono::Utc>,
    pub(super) id: i64,
}

/// The arguments of one `forge.jobs_step` call (and of the reconciliation before it), owned so
/// the round trip can run while the worker goes on.
pub(super) struct Step {
    pub(super) namespace: String,
    pub(super) node: String,
    /// The queue, or `None` for a role worker (all queues of the role).
    pub(super) queue: Option<String>,
    pub(super) role: Option<String>,
    pub(super) epoch: Option<i64>,
    pub(super) tenure: Option<i64>,
    /// The node's incarnation ([`forge_core::NodeContext::incarnation`]).
    pub(super) incarnation: i64,
    /// The lane's generation, from the worker's last reconciliation (`None` before the first:
    /// a claim without one is answered stale).
    pub(super) generation: Option<i64>,
    pub(super) kinds: Vec<&'static str>,
    pub(super) limit: i32,
    pub(super) start: i32,
    pub(super) started: Vec<i64>,
    pub(super) ids: Vec<i64>,
    pub(super) attempts: Vec<i32>,
    pub(super) states: Vec<Outcome>,
    pub(super) delays: Vec<Option<i64>>,
    pub(super) errors: Vec<Option<serde_json::Value>>,
    pub(super) default_max: i32,
    /// Claim after this position of the claim order (priority, run_at, id), or from the head.
    pub(super) after: Option<Floor>,
    /// Record completions as `completed` rows (or delete the jobs).
    pub(super) keep_completed: bool,
    /// With a claim: the jobs the worker holds besides this trip's outcomes, which its lane's
    /// list names after the claim (`forge.jobs_step`'s `p_held`).
    pub(super) held: Option<Vec<i64>>,
    /// How long the reconciliation waits, each time, for a round trip of this worker still in
    /// flight on the server before it ends that trip's session (see `forge.jobs_reconcile`).
    pub(super) reconcile_wait_ms: i32,
}

/// The jobs a worker holds, for the reconciliation: ids and their attempts.
pub(super) type Held = (Vec<i64>, Vec<i32>);

/// What a round trip answered: the reconciliation's rows (when it reconciled), the step's rows,
/// and the connection when it is still good.
pub(super) type Answer = (
    Option<Vec<Reconciled>>,
    Result<Vec<PgRow>, sqlx::Error>,
    Option<PoolConnection<Postgres>>,
);

impl Step {
    /// Whether the step has nothing to send (the reconciliation may still have).
    pub(super) fn is_empty(&self) -> bool {
        self.limit == 0 && self.ids.is_empty() && self.started.is_empty()
    }

    /// Reconciles (if asked), then records and claims, all within `bound`; returns the
    /// connection when it is still good. A connection whose statement failed or got no answer
    /// in time (a half-open session, a server stalled) is closed, never given back to the pool
    /// with its statement still in flight.
    pub(super) async fn run(
        mut self,
        conn: Option<PoolConnection<Postgres>>,
        pool: &sqlx::PgPool,
        reconcile: Option<Held>,
        bound: Duration,
    ) -> Answer {
        let deadline = Instant::now() + bound;
        let mut conn = match conn {
            Some(conn) => conn,
            None => match within(deadline, pool.acquire()).await {
                Ok(conn) => conn,
                Err(err) => return (None, Err(err), None),
            },
        };
        let reconciled = match reconcile {
            Some(held) => match within(deadline, self.reconcile(&mut conn, held)).await {
                Ok(rows) => {
                    if let Some(generation) = Reconciled::generation(&rows) {
                        self.generation = Some(generation);
                    }
                    Some(rows)
                }
                Err(err) => {
                    conn.close_on_drop();
                    return (None, Err(err), None);
                }
            },
            None => None,
        };
        let result = if self.is_empty() {
            Ok(Vec::new())
        } else {
            within(deadline, self.step(&mut conn)).await
        };
        let conn = if result.is_ok() {
            Some(conn)
        } else {
            conn.close_on_drop();
            None
        };
        (reconciled, result, conn)
    }

    async fn reconcile(
        &self,
        conn: &mut PoolConnection<Postgres>,
        (known, known_attempts): Held,
    ) -> Result<Vec<Reconciled>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT id, status, generation FROM forge.jobs_reconcile($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&self.namespace)
        .bind(&self.node)
        .bind(&self.queue)
        .bind(self.role.as_deref())
        .bind(self.tenure)
        .bind(self.incarnation)
        .bind(&known)
        .bind(&known_attempts)
        .bind(self.default_max)
        .bind(self.reconcile_wait_ms)
        .fetch_all(&mut **conn)
        .await?;
        rows.iter().map(Reconciled::decode).collect()
    }

    async fn step(&self, conn: &mut PoolConnection<Postgres>) -> Result<Vec<PgRow>, sqlx::Error> {
        sqlx::query(
            "SELECT id, claimed, kind, args, attempt, max_attempts, timeout_ms, pickup_ms, state, priority, run_at FROM forge.jobs_step($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)",
        )
        .bind(&self.namespace)
        .bind(&self.node)
        .bind(&self.queue)
        .bind(self.role.as_deref())
        .bind(self.epoch)
        .bind(self.tenure)
        .bind(self.incarnation)
        .bind(self.generation)
        .bind(&self.kinds)
        .bind(self.limit)
        .bind(self.start)
        .bind(&self.started)
        .bind(&self.ids)
        .bind(&self.attempts)
        .bind(&self.states)
        .bind(&self.delays)
        .bind(&self.errors)
        .bind(self.default_max)
        .bind(self.after.map(|f| f.priority))
        .bind(self.after.map(|f| f.run_at))
        .bind(self.after.map(|f| f.id))
        .bind(self.keep_completed)
        .bind(&self.held)
        .fetch_all(&mut **conn)
        .await
    }
}

/// `work` if it ends by `deadline`; else the error of a round trip that got no answer.
async fn within<T>(
    deadline: Instant,
    work: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    timeout_at(deadline, work).await.unwrap_or_else(|_| {
        Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the job round trip got no answer in time (is the connection half-open?)",
        )))
    })
}

/// One row of `forge.jobs_step`'s answer.
pub(super) enum StepAnswer {
    /// A job it claimed.
    Claimed(ClaimedRow),
    /// An outcome recorded as another state than asked, or refused (`None`): outcome rows come
    /// only for the outcomes not recorded as asked.
    Exception {
        id: i64,
        recorded_as: Option<JobState>,
    },
    /// The claim carried a stale identity (the lane was taken since the worker's last
    /// reconciliation): it claimed nothing.
    Stale,
    /// The queue has limits; when they cut the claim short, how long until a claim may take
    /// more (milliseconds).
    Limited { wait_ms: Option<f64> },
    /// Jobs of limited kinds were passed over or cut: claim from the head next time and, when
    /// the claim came back short, again after `wait_ms`.
    Paced { wait_ms: Option<f64> },
}

/// A claimed job, as `forge.jobs_step` answers it.
pub(super) struct ClaimedRow {
    /// Its position in the claim order (the worker's next floor).
    pub(super) position: Floor,
    /// `running` (claimed and marked started) or `ahead` (see [`ClaimedRow::ahead`]).
    pub(super) state: StepRow,
    pub(super) id: i64,
    pub(super) attempt: i32,
    pub(super) kind: String,
    /// The arguments, or why they cannot be decoded (the job is then dead-lettered).
    pub(super) args: Lenient<serde_json::Value>,
    /// The job's own limits, when it has them (else its type's, else the queue's default).
    pub(super) max_attempts: Option<i32>,
    pub(super) timeout_ms: Option<i64>,
    /// How long the job waited, from due to claimed.
    pub(super) pickup_ms: Option<f64>,
}

impl ClaimedRow {
    /// Claimed ahead of a free slot (marked started when it starts), not started by the claim.
    pub(super) fn ahead(&self) -> bool {
        self.state == StepRow::Ahead
    }

    fn decode(row: &PgRow) -> Result<ClaimedRow, sqlx::Error> {
        Ok(ClaimedRow {
            position: Floor {
                priority: row.try_get(column::PRIORITY)?,
                run_at: row.try_get(column::RUN_AT)?,
                id: row.try_get(column::ID)?,
            },
            state: row.try_get(column::STATE)?,
            id: row.try_get(column::ID)?,
            attempt: row.try_get(column::ATTEMPT)?,
            kind: row.try_get(column::KIND)?,
            args: row.try_get(column::ARGS)?,
            max_attempts: row.try_get(column::MAX_ATTEMPTS)?,
            timeout_ms: row.try_get(column::TIMEOUT_MS)?,
            pickup_ms: row.try_get(column::PICKUP_MS)?,
        })
    }
}

/// The columns of `forge.jobs_step`'s answer, in the order [`Step`] selects them. Read by
/// position: a worker decodes two rows per job, and looking each column up by its name (a hash
/// and a comparison of the name) was a third of the decoding.
mod column {
    pub(super) const ID: usize = 0;
    /// Whether the row is a claim; else `state` says what it is.
    pub(super) const CLAIMED: usize = 1;
    pub(super) const KIND: usize = 2;
    pub(super) const ARGS: usize = 3;
    pub(super) const ATTEMPT: usize = 4;
    pub(super) const MAX_ATTEMPTS: usize = 5;
    pub(super) const TIMEOUT_MS: usize = 6;
    pub(super) const PICKUP_MS: usize = 7;
    /// A [`super::StepRow`] or, for an outcome recorded otherwise than asked, a
    /// [`super::JobState`].
    pub(super) const STATE: usize = 8;
    pub(super) const PRIORITY: usize = 9;
    pub(super) const RUN_AT: usize = 10;
}

/// The job a row of `forge.jobs_reconcile` is about.
#[derive(sqlx::FromRow)]
struct JobOfRow {
    id: i64,
}

impl StepAnswer {
    pub(super) fn decode(row: &PgRow) -> Result<StepAnswer, sqlx::Error> {
        if row.try_get::<bool, _>(column::CLAIMED)? {
            return Ok(StepAnswer::Claimed(ClaimedRow::decode(row)?));
        }
        let state: &str = row.try_get(column::STATE)?;
        match StepRow::parse(state) {
            Some(StepRow::Stale) => return Ok(StepAnswer::Stale),
            Some(StepRow::Limited) => {
                return Ok(StepAnswer::Limited {
                    wait_ms: row.try_get(column::PICKUP_MS)?,
                });
            }
            Some(StepRow::Paced) => {
                return Ok(StepAnswer::Paced {
                    wait_ms: row.try_get(column::PICKUP_MS)?,
                });
            }
            _ => {}
        }
        Ok(StepAnswer::Exception {
            id: row.try_get(column::ID)?,
            recorded_as: JobState::parse(state),
        })
    }
}

/// One row of `forge.jobs_reconcile`'s answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reconciled {
    /// What became of a job this worker holds.
    Job(i64, Fate),
    /// `lane`: the lane's new generation, which the worker's claims carry from now on.
    Lane(i64),
}

/// What became of a job a worker holds, as its reconciliation found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fate {
    /// `cancel`: a cancel was requested.
    Cancel,
    /// `unsettled`: another transaction holds it; look again shortly.
    Unsettled,
    /// `gone` (or anything else): taken away from this node (rescued while it seemed down).
    Gone,
}

impl Fate {
    pub(super) fn from_status(status: &str) -> Fate {
        match status {
            "cancel" => Fate::Cancel,
            "unsettled" => Fate::Unsettled,
            _ => Fate::Gone,
        }
    }
}

/// What a row of `forge.jobs_reconcile` is about (`lane`, or a job's fate).
#[derive(sqlx::FromRow)]
struct ReconcileHead {
    status: String,
}

/// The lane's row of `forge.jobs_reconcile`.
#[derive(sqlx::FromRow)]
struct LaneRow {
    generation: i64,
}

impl Reconciled {
    pub(super) fn decode(row: &PgRow) -> Result<Reconciled, sqlx::Error> {
        let status = ReconcileHead::from_row(row)?.status;
        if status == "lane" {
            return Ok(Reconciled::Lane(LaneRow::from_row(row)?.generation));
        }
        Ok(Reconciled::Job(
            JobOfRow::from_row(row)?.id,
            Fate::from_status(&status),
        ))
    }

    /// The lane's new generation among `rows`.
    pub(super) fn generation(rows: &[Reconciled]) -> Option<i64> {
        rows.iter().find_map(|row| match row {
            Reconciled::Lane(generation) => Some(*generation),
            Reconciled::Job(..) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::source::function;

    #[test]
    fn every_status_of_jobs_reconcile_is_read() {
        let sql = function("jobs_reconcile");
        for (status, read) in [
            ("cancel", Fate::Cancel),
            ("unsettled", Fate::Unsettled),
            ("gone", Fate::Gone),
        ] {
            assert!(sql.contains(&format!("'{status}'")), "{status}");
            assert_eq!(Fate::from_status(status), read);
        }
        assert!(sql.contains("'lane'"), "the lane's generation");
    }

    #[test]
    fn floors_order_as_the_claim_does() {
        let at = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let floor = |priority, seconds, id| Floor {
            priority,
            run_at: at + chrono::TimeDelta::seconds(seconds),
            id,
        };
        assert!(floor(0, 0, 1) < floor(0, 0, 2));
        assert!(floor(0, 5, 1) < floor(0, 6, 0));
        assert!(floor(-1, 9, 9) < floor(0, 0, 0));
    }

    #[test]
    fn an_empty_step_sends_nothing() {
        let step = Step {
            namespace: "forge".into(),
            node: "a".into(),
            queue: Some("default".into()),
            role: None,
            epoch: None,
            tenure: None,
            incarnation: 1,
            generation: None,
            kinds: vec!["mail"],
            limit: 0,
            start: 0,
            started: Vec::new(),
            ids: Vec::new(),
            attempts: Vec::new(),
            states: Vec::new(),
            delays: Vec::new(),
            errors: Vec::new(),
            default_max: 20,
            after: None,
            keep_completed: true,
            held: None,
            reconcile_wait_ms: 1,
        };
        assert!(step.is_empty());
        assert!(!Step { limit: 1, ..step }.is_empty());
    }
}
