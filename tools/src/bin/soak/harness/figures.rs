//! One cron's ticks and the jobs' and effects' counts, as the ledger reports them.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::BoxError;

/// What the ledger and the effects say about one cron's ticks from its first effect to the
/// cut-off.
#[derive(Clone)]
pub(super) struct CronFigures {
    first: DateTime<Utc>,
    pub(super) expected: i64,
    present: i64,
    pub(super) missing: i64,
    pub(super) duplicated: i64,
    extra_rows: i64,
    off_grid: i64,
    missing_by_state: Vec<(String, i64, DateTime<Utc>, String)>,
    ledger: Vec<(String, i64, i64)>,
    pub(super) succeeded_without_effect: i64,
    pub(super) effect_without_success: i64,
    reruns: i64,
    duplicate_examples: Vec<(DateTime<Utc>, String)>,
}

impl CronFigures {
    /// The cron's section of the summary.
    pub(super) fn write(&self, out: &mut String, cron: &str, what: &str, cutoff: DateTime<Utc>) {
        let _ = writeln!(
            out,
            "\ncron {cron} (\"* * * * * *\", catch_up = all, {what}), ticks {} .. {} (cut-off):",
            self.first.format("%H:%M:%S"),
            cutoff.format("%H:%M:%S")
        );
        let _ = writeln!(
            out,
            "  ticks expected (every second)           {}",
            self.expected
        );
        let _ = writeln!(
            out,
            "  ticks with an effect                    {}",
            self.present
        );
        let _ = writeln!(
            out,
            "  missing ticks (no effect)               {}",
            self.missing
        );
        for (state, count, from, error) in &self.missing_by_state {
            let _ = writeln!(
                out,
                "    {count} with ledger state {state} (first {}){}",
                from.format("%H:%M:%S"),
                if error.is_empty() {
                    String::new()
                } else {
                    format!(": {error}")
                }
            );
        }
        let _ = writeln!(
            out,
            "  duplicate effects (ticks with >1 row)   {} ({} extra rows)",
            self.duplicated, self.extra_rows
        );
        for (at, rows) in &self.duplicate_examples {
            let _ = writeln!(out, "    {}: {rows}", at.format("%H:%M:%S"));
        }
        let _ = writeln!(
            out,
            "  effects off the per-second grid         {}",
            self.off_grid
        );
        let _ = writeln!(
            out,
            "  ledger succeeded without an effect      {}",
            self.succeeded_without_effect
        );
        let _ = writeln!(
            out,
            "  effect without a succeeded ledger row   {}",
            self.effect_without_success
        );
        let ledger_text: Vec<String> = self
            .ledger
            .iter()
            .map(|(state, n, reruns)| format!("{state} {n} (attempt > 1: {reruns})"))
            .collect();
        let _ = writeln!(out, "  ledger states: {}", ledger_text.join(", "));
        let not_succeeded: i64 = self
            .ledger
            .iter()
            .filter(|(state, _, _)| state != "succeeded")
            .map(|(_, n, _)| n)
            .sum();
        let _ = writeln!(
            out,
            "  ticks not succeeded                     {not_succeeded}"
        );
        let _ = writeln!(
            out,
            "  reruns (effect rows with attempt > 1)   {}",
            self.reruns
        );
    }

    /// Ticks the ledger recorded as `skipped`.
    pub(super) fn skipped(&self) -> i64 {
        self.ledger
            .iter()
            .filter(|(state, _, _)| state == "skipped")
            .map(|(_, n, _)| n)
            .sum()
    }
}

/// The figures of cron `cron`; `None` if it never wrote an effect.
pub(super) async fn cron_figures(
    db: &PgPool,
    cron: &str,
    cutoff: DateTime<Utc>,
) -> Result<Option<CronFigures>, BoxError> {
    let first: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT min(scheduled_at) FROM soak_cron_effects WHERE cron = $1")
            .bind(cron)
            .fetch_one(db)
            .await?;
    let Some(first) = first else {
        return Ok(None);
    };

    let (expected, present, missing, duplicated, extra_rows): (i64, i64, i64, i64, i64) =
            sqlx::query_as(
                "WITH expected AS (
                     SELECT generate_series($1::timestamptz, $2::timestamptz, interval '1 second') AS s),
                 eff AS (SELECT scheduled_at, count(*) AS n FROM soak_cron_effects
                          WHERE cron = $3 GROUP BY 1)
                 SELECT count(*),
                        count(*) FILTER (WHERE eff.n IS NOT NULL),
                        count(*) FILTER (WHERE eff.n IS NULL),
                        count(*) FILTER (WHERE eff.n > 1),
                        coalesce(sum(eff.n - 1) FILTER (WHERE eff.n > 1), 0)::bigint
                   FROM expected LEFT JOIN eff ON eff.scheduled_at = expected.s",
            )
            .bind(first)
            .bind(cutoff)
            .bind(cron)
            .fetch_one(db)
            .await?;
    let off_grid: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM soak_cron_effects
              WHERE cron = $2 AND scheduled_at <= $1 AND date_trunc('second', scheduled_at) <> scheduled_at",
        )
        .bind(cutoff)
        .bind(cron)
        .fetch_one(db)
        .await?;
    let missing_by_state: Vec<(String, i64, DateTime<Utc>, String)> = sqlx::query_as(
            "WITH expected AS (
                 SELECT generate_series($1::timestamptz, $2::timestamptz, interval '1 second') AS s)
             SELECT coalesce(t.state, 'no ledger row'), count(*), min(x.s), coalesce(max(t.error), '')
               FROM expected x
               LEFT JOIN forge.cron_ticks t ON t.cron = $3 AND t.scheduled_at = x.s
              WHERE NOT EXISTS (SELECT 1 FROM soak_cron_effects e
                                 WHERE e.cron = $3 AND e.scheduled_at = x.s)
              GROUP BY 1 ORDER BY 1",
        )
        .bind(first)
        .bind(cutoff)
        .bind(cron)
        .fetch_all(db)
        .await?;
    let ledger: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT state, count(*), count(*) FILTER (WHERE attempt > 1) FROM forge.cron_ticks
              WHERE cron = $1 AND scheduled_at BETWEEN $2 AND $3 GROUP BY 1 ORDER BY 1",
    )
    .bind(cron)
    .bind(first)
    .bind(cutoff)
    .fetch_all(db)
    .await?;
    let (succeeded_without_effect, effect_without_success): (i64, i64) = sqlx::query_as(
        "SELECT
               (SELECT count(*) FROM forge.cron_ticks t
                 WHERE t.cron = $1 AND t.scheduled_at BETWEEN $2 AND $3 AND t.state = 'succeeded'
                   AND NOT EXISTS (SELECT 1 FROM soak_cron_effects e
                                    WHERE e.cron = $1 AND e.scheduled_at = t.scheduled_at)),
               (SELECT count(DISTINCT e.scheduled_at) FROM soak_cron_effects e
                 WHERE e.cron = $1 AND e.scheduled_at BETWEEN $2 AND $3
                   AND NOT EXISTS (SELECT 1 FROM forge.cron_ticks t
                                    WHERE t.cron = $1 AND t.scheduled_at = e.scheduled_at
                                      AND t.state = 'succeeded'))",
    )
    .bind(cron)
    .bind(first)
    .bind(cutoff)
    .fetch_one(db)
    .await?;
    let cron_reruns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM soak_cron_effects
              WHERE cron = $2 AND scheduled_at <= $1 AND attempt > 1",
    )
    .bind(cutoff)
    .bind(cron)
    .fetch_one(db)
    .await?;
    let duplicate_examples: Vec<(DateTime<Utc>, String)> = sqlx::query_as(
            "SELECT scheduled_at, string_agg(format('attempt %s on %s epoch %s at %s', attempt, node, epoch,
                                                   to_char(at, 'HH24:MI:SS.MS')), '; ' ORDER BY id)
               FROM soak_cron_effects WHERE cron = $2 AND scheduled_at <= $1
              GROUP BY 1 HAVING count(*) > 1 ORDER BY 1 LIMIT 5",
        )
        .bind(cutoff)
        .bind(cron)
        .fetch_all(db)
        .await?;

    Ok(Some(CronFigures {
        first,
        expected,
        present,
        missing,
        duplicated,
        extra_rows,
        off_grid,
        missing_by_state,
        ledger,
        succeeded_without_effect,
        effect_without_success,
        reruns: cron_reruns,
        duplicate_examples,
    }))
}

#[derive(Clone, Default)]
pub(super) struct JobStats {
    pub(super) total: i64,
    pub(super) completed: i64,
    pub(super) lost_or_stuck: i64,
    pub(super) reruns: i64,
    pub(super) not_completed: Vec<String>,
}

#[derive(Clone, Default)]
pub(super) struct EffectStats {
    pub(super) dup_jobs: i64,
    pub(super) dup_rows: i64,
    pub(super) completed_without: i64,
    pub(super) effect_not_completed: i64,
    pub(super) orphan: i64,
    pub(super) reruns: i64,
}
