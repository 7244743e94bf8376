//! Job kinds' cluster-wide limits (`forge.kind_limits`): read, set and reset by operators.

use chrono::{DateTime, Utc};
use forge_core::Result;
use serde::Serialize;

use super::Workload;
use crate::jobs::QueueLimits;
use crate::limits::Limited;

/// A job kind's cluster-wide limits and what counts against them now.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct KindLimitsView {
    /// The job kind.
    pub kind: String,
    /// Its limits, checked by every claim of its jobs, in whichever queue.
    pub limits: QueueLimits,
    /// Who set them: `None` for a node's (forge.toml's `[jobs.kinds]`, else the kind's declared
    /// options, written by a node at start), else the operator, whose values win until reset.
    pub set_by: Option<String>,
    /// Attempts counted against the global concurrency limit now (running or claimed).
    pub limited_running: i64,
    /// Whether as many attempts run as the global concurrency limit allows.
    pub at_global_limit: bool,
    /// Claims counted against the rate in its current window (all rate keys).
    pub rate_claims: i64,
    /// When some rate key's window is full: when it lets that key's next claim through.
    pub rate_limited_until: Option<DateTime<Utc>>,
}

impl Workload {
    /// Every job kind with cluster-wide limits, by name.
    pub async fn kind_limits(&self) -> Result<Vec<KindLimitsView>> {
        /// A kind's limits and their use.
        #[derive(sqlx::FromRow)]
        struct Row {
            kind: String,
            global_concurrency: Option<i32>,
            rate_count: Option<i32>,
            rate_window_ms: Option<i64>,
            rate_key: Option<String>,
            set_by: Option<String>,
            limited_running: i64,
            rate_claims: i64,
            rate_full_until: Option<DateTime<Utc>>,
        }
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT l.kind, l.global_concurrency, l.rate_count, l.rate_window_ms, l.rate_key,
                    l.set_by,
                    (SELECT count(*) FROM forge.kind_slots s
                       JOIN forge.jobs j ON j.id = s.job_id AND j.attempt = s.attempt
                                        AND j.state = 'running'
                      WHERE s.namespace = l.namespace AND s.kind = l.kind) AS limited_running,
                    (SELECT count(*) FROM forge.kind_claims c
                      WHERE c.namespace = l.namespace AND c.kind = l.kind
                        AND c.claimed_at > clock_timestamp()
                                           - l.rate_window_ms * interval '1 millisecond') AS rate_claims,
                    (SELECT min(c.claimed_at) + l.rate_window_ms * interval '1 millisecond'
                       FROM (SELECT c.claimed_at, count(*) OVER (PARTITION BY c.rate_key) AS n
                               FROM forge.kind_claims c
                              WHERE c.namespace = l.namespace AND c.kind = l.kind
                                AND c.claimed_at > clock_timestamp()
                                                   - l.rate_window_ms * interval '1 millisecond') c
                      WHERE c.n >= l.rate_count) AS rate_full_until
               FROM forge.kind_limits l WHERE l.namespace = $1 ORDER BY l.kind",
        )
        .bind(self.namespace.name())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let limits = QueueLimits::from_stored(
                    row.global_concurrency,
                    row.rate_count,
                    row.rate_window_ms,
                    row.rate_key,
                );
                KindLimitsView {
                    kind: row.kind,
                    at_global_limit: limits
                        .global_concurrency
                        .is_some_and(|n| row.limited_running >= i64::from(n)),
                    limits,
                    set_by: row.set_by,
                    limited_running: row.limited_running,
                    rate_claims: row.rate_claims,
                    rate_limited_until: row.rate_full_until,
                }
            })
            .collect())
    }

    /// Sets a job kind's cluster-wide limits as an operator (`by`, in the audit trail): every
    /// claim of its jobs from the next on checks them, on every node and in every queue, and a
    /// node's start leaves them alone (the code's values apply again after
    /// [`Workload::reset_kind_limits`]). The name is checked as a kind's name, not against any
    /// code: a kind no node registers has no jobs to bind.
    pub async fn set_kind_limits(&self, kind: &str, limits: &QueueLimits, by: &str) -> Result<()> {
        check_kind(kind)?;
        if let Some((_, message)) = limits.problem() {
            return Err(forge_core::Error::InvalidInput { message });
        }
        limits
            .write(
                &self.pool,
                self.namespace.name(),
                Limited::Kind,
                kind,
                Some(by),
            )
            .await?;
        Ok(())
    }

    /// Removes an operator's limits of a job kind (in the audit trail): the kind is unlimited
    /// until a node starts and writes its declared ones. Returns whether an operator had set
    /// them.
    pub async fn reset_kind_limits(&self, kind: &str, by: &str) -> Result<bool> {
        check_kind(kind)?;
        Ok(
            sqlx::query_scalar("SELECT forge.kind_limit_reset($1, $2, $3)")
                .bind(self.namespace.name())
                .bind(kind)
                .bind(by)
                .fetch_one(&self.pool)
                .await?,
        )
    }
}

fn check_kind(kind: &str) -> Result<()> {
    forge_rules::check_name(forge_rules::Name::JobKind, kind).map_err(|err| {
        forge_core::Error::InvalidInput {
            message: err.to_string(),
        }
    })
}
