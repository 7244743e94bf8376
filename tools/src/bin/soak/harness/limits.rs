//! The queue limits as the ledger judges them: the limited queue's attempts at once, from its
//! handlers' own runs, and the rated queue's claims in any window of the rate, by the claims'
//! own instants.
//!
//! What is measured is what the guarantee says (README, "Guarantees"; docs/src/architecture/
//! jobs.md). A slot is held from the claim until the attempt's outcome is recorded or the
//! attempt is rescued: a handler's run is its start row (its own attempt, written by the
//! handler) to its end row, written in the transaction that completes the job, or - when that
//! never landed - to the instant its attempt left `running` (a recorded failure, or a rescue:
//! a node frozen or cut off past `down_after` has its attempt rescued, and its thawed handler,
//! whose writes are fenced, is outside the guarantee from then on). The runs are stamped with
//! the nodes' host clocks less their known skew, which the database's clock steps do not move.
//!
//! A rate counts claims by the database's clock (`forge.queue_claims`, the claim's instant,
//! which the claim also writes as the job's `attempted_at`). Across a step of that clock the
//! same database instants occur twice (a step back) or a window is skipped (a step ahead), so
//! claims made under different clock offsets are never judged in one window: each claim's
//! offset is its `attempted_at` less the true time of its commit (`soak_job_moves`), rounded to
//! a second, and a window counts the claims of its first claim's offset; windows that also
//! hold claims of another offset are reported apart.

use std::fmt::Write as _;

use super::Harness;
use crate::BoxError;
use chrono::{DateTime, Utc};

/// The limited queue's limit and its job kind (`forge.toml` of the nodes).
const GLOBAL_LIMIT: i64 = 2;
const LIMITED_JOB: &str = "soak_limited_job";
/// The rated queue's rate (claims per second) and its job kind.
const RATE: i64 = 5;
const RATED_JOB: &str = "soak_rated_job";

/// The runs of `what` (`soak_runs`): each from its start to its end, the end taken at the
/// instant its attempt left `running` (`soak_job_moves`) when its own end row never landed.
const RUNS_SQL: &str = "
    WITH r AS (
        SELECT r.*,
               (SELECT min(m.at) FROM soak_job_moves m
                 WHERE m.job_id = r.job_id AND m.attempt >= r.attempt
                   AND NOT (m.attempt = r.attempt AND m.state = 'running')) AS left_at
          FROM soak_runs r WHERE r.what = $1)
    SELECT job_id, attempt, node, started_at AS began,
           coalesce(least(finished_at, left_at), soak_now()) AS ended,
           finished_at IS NULL AND left_at IS NOT NULL AS cut
      FROM r";

/// The slots as the database held them: each claim of `kind` (its attempt `running`) to the
/// commit that ended that attempt, from the job history.
const SLOTS_SQL: &str = "
    WITH c AS (
        SELECT DISTINCT ON (job_id, attempt) job_id, attempt, node, at FROM soak_job_moves
         WHERE kind = $1 AND state = 'running' ORDER BY job_id, attempt, id)
    SELECT c.job_id, c.attempt, c.node, c.at AS began,
           coalesce((SELECT min(m.at) FROM soak_job_moves m
                      WHERE m.job_id = c.job_id AND m.attempt >= c.attempt
                        AND NOT (m.attempt = c.attempt AND m.state = 'running')),
                    soak_now()) AS ended,
           false AS cut
      FROM c";

/// One interval of a run or a slot.
#[derive(sqlx::FromRow)]
struct Span {
    job_id: i64,
    attempt: i32,
    node: Option<String>,
    began: DateTime<Utc>,
    ended: DateTime<Utc>,
    /// Its end is the instant its attempt was taken away (its own end never landed).
    cut: bool,
}

/// The most spans open at once (at some span's start), and the spans open at the worst one.
fn most_at_once(spans: &[Span]) -> (usize, Vec<&Span>) {
    let mut worst: (usize, Vec<&Span>) = (0, Vec::new());
    for s in spans {
        let open: Vec<&Span> = spans
            .iter()
            .filter(|o| o.began <= s.began && o.ended > s.began)
            .collect();
        if open.len() > worst.0 {
            worst = (open.len(), open);
        }
    }
    worst
}

impl Harness {
    /// Writes the queue limits' section into `out` and returns its targets.
    pub(super) async fn queue_limits(
        &self,
        out: &mut String,
    ) -> Result<Vec<(bool, String)>, BoxError> {
        let db = &self.admin;
        let runs: Vec<Span> = sqlx::query_as(RUNS_SQL)
            .bind("limited")
            .fetch_all(db)
            .await?;
        let slots: Vec<Span> = sqlx::query_as(SLOTS_SQL)
            .bind(LIMITED_JOB)
            .fetch_all(db)
            .await?;
        let (overlap, worst) = most_at_once(&runs);
        let (slot_overlap, _) = most_at_once(&slots);
        let cut = runs.iter().filter(|r| r.cut).count();
        let _ = writeln!(
            out,
            "\nqueue limits:\n  limited (global_concurrency = {GLOBAL_LIMIT}): {} handler runs, at most {overlap} at once ({cut} of them ended at their attempt's rescue or failure: their own end never landed); {} claims, at most {slot_overlap} running in the database at once",
            runs.len(),
            slots.len()
        );
        if overlap as i64 > GLOBAL_LIMIT {
            for s in &worst {
                let _ = writeln!(
                    out,
                    "    job {} attempt {} on {}: {:.3} s .. {:.3} s{}",
                    s.job_id,
                    s.attempt,
                    s.node.as_deref().unwrap_or("?"),
                    self.secs_of(s.began),
                    self.secs_of(s.ended),
                    if s.cut { " (ended by its rescue)" } else { "" }
                );
            }
        }

        let (claims, rate_max, straddling, straddling_max): (i64, i64, i64, i64) = sqlx::query_as(
            "WITH c AS (
             SELECT DISTINCT ON (job_id, attempt) attempted_at AS at,
                    round(extract(epoch FROM attempted_at - at))::bigint AS offset_s
               FROM soak_job_moves WHERE kind = $1 AND state = 'running'
              ORDER BY job_id, attempt, id),
         w AS (
             SELECT (SELECT count(*) FROM c o WHERE o.offset_s = s.offset_s
                        AND o.at >= s.at AND o.at < s.at + interval '1 second') AS judged,
                    (SELECT count(*) FROM c o
                      WHERE o.at >= s.at AND o.at < s.at + interval '1 second') AS all_claims
               FROM c s)
         SELECT (SELECT count(*) FROM c), coalesce(max(judged), 0),
                count(*) FILTER (WHERE all_claims > judged),
                coalesce(max(all_claims) FILTER (WHERE all_claims > judged), 0)
           FROM w",
        )
        .bind(RATED_JOB)
        .fetch_one(db)
        .await?;
        let _ = writeln!(
            out,
            "  rated (rate = \"{RATE}/1s\"): {claims} claims, at most {rate_max} in any 1 s window of the database's clock (claims of one clock offset); {straddling} windows hold claims made under two clock offsets (a step of the database's clock between them: judged apart), at most {straddling_max} claims in one"
        );
        Ok(vec![
            (
                overlap as i64 <= GLOBAL_LIMIT && !runs.is_empty(),
                format!(
                    "a global limit of {GLOBAL_LIMIT}: at most {overlap} handlers at once ({} runs; claim to completion or rescue)",
                    runs.len()
                ),
            ),
            (
                rate_max <= RATE && claims > 0,
                format!(
                    "a rate of {RATE}/1s: at most {rate_max} claims in any 1 s window ({claims} claims; {straddling} windows across a clock step judged apart)"
                ),
            ),
        ])
    }
}
