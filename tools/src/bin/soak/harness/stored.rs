//! A stored cron among the faults: `soak_stored`, per second with `catch_up = "all"`, created
//! by the harness before the nodes start (`Workload::upsert_cron`, the path of the admin API
//! and the CLI) and changed once halfway through the faults (its job's arguments: version 1,
//! then 2). Each tick enqueues one `soak_stored_job` in its fenced transaction; a deferred
//! trigger finds, at that commit, the tick the same transaction completed, and records the job
//! as that tick's effect (`soak_cron_effects`), so the ledger counts missing and doubled ticks
//! exactly as it does for the crons of code.

use std::fmt::Write as _;

use std::time::Duration;

use chrono::{DateTime, Utc};
use forge::LockNamespace;
use forge::Schedule;
use forge::crons::{CatchUp, StoredCron};
use forge::inspect::Workload;
use tokio::time::Instant;

use super::Harness;
use super::figures::cron_figures;
use crate::{ADMIN_TIMEOUT, BoxError, STORED_CRON, STORED_JOB};

/// Made after FORGE's migrations: the job each stored-cron tick enqueues, tied to its tick by
/// the transaction both are written in (the tick's row version carries that transaction's id).
pub(super) const STORED_SQL: &str = r#"
-- seq: when the job's transaction committed, in the order of the harness's own readings of
-- the sequence (a clock of the database's would be stepped by the clock faults).
CREATE SEQUENCE soak_stored_seq;
CREATE TABLE soak_stored_jobs (
    job_id       bigint      PRIMARY KEY,
    scheduled_at timestamptz,
    version      bigint,
    seq          bigint      NOT NULL DEFAULT nextval('soak_stored_seq')
);

CREATE FUNCTION soak_stored_job_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    t forge.cron_ticks;
BEGIN
    SELECT * INTO t FROM forge.cron_ticks c
     WHERE c.cron = 'soak_stored' AND c.state = 'succeeded' AND c.xmin = pg_current_xact_id()::xid;
    INSERT INTO soak_stored_jobs (job_id, scheduled_at, version)
    VALUES (NEW.id, t.scheduled_at, (NEW.args ->> 'version')::bigint);
    IF t.scheduled_at IS NOT NULL THEN
        INSERT INTO soak_cron_effects (cron, scheduled_at, attempt, node, epoch, tenure)
        VALUES (t.cron, t.scheduled_at, t.attempt, t.node_id, t.epoch, t.tenure);
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER soak_stored_job_inserted AFTER INSERT ON forge.jobs_live
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.kind = 'soak_stored_job')
    EXECUTE FUNCTION soak_stored_job_inserted();
"#;

/// The stored cron's one change, halfway through the faults.
pub(super) struct StoredChange {
    /// When to make it (it waits for a moment with no fault of several steps under way).
    pub(super) due: Instant,
    /// When it was asked and when it was answered (true times), and `soak_stored_seq` read just
    /// before it was asked (a tick's job with a later `seq` committed after that).
    pub(super) made: Option<(DateTime<Utc>, DateTime<Utc>, i64)>,
    /// Why it was not made at the last try (the cron behind).
    pub(super) why_not: Option<String>,
}

/// The stored cron at `version`: per second, every tick run (`catch_up = "all"`).
fn stored_cron(version: i64) -> Result<StoredCron, BoxError> {
    Ok(StoredCron::new(
        STORED_CRON,
        Schedule::parse("* * * * * *")?,
        STORED_JOB,
        serde_json::json!({ "version": version }),
    )?
    .catch_up(CatchUp::All))
}

impl Harness {
    fn workload(&self) -> Workload {
        Workload::new(self.admin.clone(), LockNamespace::default())
    }

    /// Stores the cron (version 1), before the nodes start.
    pub(super) async fn store_cron(&self) -> Result<(), BoxError> {
        self.workload()
            .upsert_cron(&stored_cron(1)?, "forge-soak")
            .await?;
        Ok(())
    }

    /// Changes the stored cron's arguments (version 2) once, when due and no fault of several
    /// steps is under way (so neither clock is stepped: ticks compare with the true time).
    pub(super) async fn tend_stored_change(&mut self) {
        let due = self
            .stored_change
            .as_ref()
            .is_some_and(|c| c.made.is_none() && Instant::now() >= c.due);
        if !due || self.busy() {
            return;
        }
        // Preferably while the cron is caught up (its ticks of the last 3 s succeeded): a
        // change starts the cron's loop again from the change's instant, and ticks due before it
        // that had not run yet (a backlog) are not caught up, by design. After 30 s of waiting
        // the change is made anyway, and the report counts those ticks apart.
        let recent = tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM forge.cron_ticks
                  WHERE cron = $1 AND state = 'succeeded'
                    AND scheduled_at > $2::timestamptz - interval '3 seconds' AND scheduled_at <= $2",
            )
            .bind(STORED_CRON)
            .bind(Utc::now())
            .fetch_one(&self.admin),
        )
        .await;
        let why_not = match recent {
            Ok(Ok(n)) if n >= 2 => None,
            Ok(Ok(n)) => Some(format!("its ticks of the last 3 s: {n} succeeded")),
            Ok(Err(err)) => Some(format!("reading its ticks failed: {err}")),
            Err(_) => Some("reading its ticks: no answer".to_owned()),
        };
        if let Some(change) = &mut self.stored_change {
            change.why_not = why_not.clone();
        }
        let waited_enough = self
            .stored_change
            .as_ref()
            .is_some_and(|c| Instant::now() >= c.due + Duration::from_secs(30));
        if why_not.is_some() && !waited_enough {
            return;
        }
        let Ok(cron) = stored_cron(2) else {
            return;
        };
        // Which tick jobs committed before the change was asked: a forward step of the
        // database's clock (a fault before this one) runs the ticks it stepped over at once
        // (docs/src/architecture/crons.md), so ticks due after the change may have run before it,
        // with the old arguments, as they must.
        let seq_asked = match tokio::time::timeout(
            ADMIN_TIMEOUT,
            sqlx::query_scalar::<_, i64>("SELECT nextval('soak_stored_seq')")
                .fetch_one(&self.admin),
        )
        .await
        {
            Ok(Ok(seq)) => seq,
            _ => return,
        };
        let asked = Utc::now();
        let workload = self.workload();
        match tokio::time::timeout(ADMIN_TIMEOUT, workload.upsert_cron(&cron, "forge-soak")).await {
            Ok(Ok(_)) => {
                let answered = Utc::now();
                if let Some(change) = &mut self.stored_change {
                    change.made = Some((asked, answered, seq_asked));
                }
                self.note("the stored cron's arguments changed (version 2)");
            }
            Ok(Err(err)) => self.note(format!("changing the stored cron failed ({err}); retrying")),
            Err(_) => self.note("changing the stored cron: no answer; retrying"),
        }
    }

    /// The stored cron's section of the report, and its targets.
    pub(super) async fn stored_report(
        &self,
        out: &mut String,
        cutoff: DateTime<Utc>,
    ) -> Result<Vec<(bool, String)>, BoxError> {
        let db = &self.admin;
        let Some(figures) = cron_figures(db, STORED_CRON, cutoff).await? else {
            return Ok(vec![(
                false,
                format!("the stored cron {STORED_CRON} ticked: it never enqueued a job"),
            )]);
        };
        figures.write(
            out,
            STORED_CRON,
            "stored, its arguments changed once",
            cutoff,
        );
        let (jobs, without_tick, not_completed): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE s.scheduled_at IS NULL),
                    count(*) FILTER (WHERE j.state IS DISTINCT FROM 'completed')
               FROM soak_stored_jobs s LEFT JOIN forge.jobs j ON j.id = s.job_id
              WHERE s.scheduled_at IS NULL OR s.scheduled_at <= $1",
        )
        .bind(cutoff)
        .fetch_one(db)
        .await?;
        let _ = writeln!(
            out,
            "  jobs enqueued by its ticks              {jobs} ({without_tick} in a transaction that completed no tick, {not_completed} not completed)"
        );
        // Ticks due in the 30 s before the change that never ran (no ledger row): a change
        // does not catch them up (docs/src/crons.md), so they are counted apart.
        let across: i64 = match self.stored_change.as_ref().and_then(|c| c.made) {
            Some((asked, _, _)) => {
                sqlx::query_scalar(
                    "SELECT count(*) FROM generate_series(date_trunc('second', $1::timestamptz)
                                                          - interval '30 seconds', $1, interval '1 second') s
                      WHERE NOT EXISTS (SELECT 1 FROM forge.cron_ticks t
                                         WHERE t.cron = $2 AND t.scheduled_at = s)",
                )
                .bind(asked)
                .bind(STORED_CRON)
                .fetch_one(db)
                .await?
            }
            None => 0,
        };
        let missed = figures.missing - across;
        let _ = writeln!(
            out,
            "  ticks due before the change that never ran (not caught up across a change, by design) {across}"
        );
        let mut targets = vec![
            (
                missed == 0 && figures.succeeded_without_effect == 0,
                format!(
                    "0 missed stored-cron ticks: {missed} of {} ({across} due before its change not caught up, by design; {} succeeded without their job)",
                    figures.expected, figures.succeeded_without_effect
                ),
            ),
            (
                figures.duplicated == 0 && without_tick == 0 && figures.effect_without_success == 0,
                format!(
                    "0 doubled stored-cron ticks (a tick that enqueued its job twice): {} ({without_tick} jobs without their tick)",
                    figures.duplicated
                ),
            ),
            (
                not_completed == 0,
                format!("every job of the stored cron's ticks completed: {not_completed} not"),
            ),
        ];
        match self.stored_change.as_ref().and_then(|c| c.made) {
            Some((asked, answered, seq_asked)) => {
                // The first tick due after the change follows it (docs/src/crons.md); a tick
                // due within a second of the answer may have been claimed just before it, and
                // one that ran before the change was asked (early, after a forward step of the
                // database's clock) kept the old arguments, as it must.
                let (old_after, ran_before, new_before): (i64, i64, i64) = sqlx::query_as(
                    "SELECT count(*) FILTER (WHERE version = 1 AND scheduled_at > $2 + interval '1 second'
                                               AND seq > $3),
                            count(*) FILTER (WHERE version = 1 AND scheduled_at > $2 + interval '1 second'
                                               AND seq < $3),
                            count(*) FILTER (WHERE version = 2 AND scheduled_at <= $1)
                       FROM soak_stored_jobs",
                )
                .bind(asked)
                .bind(answered)
                .bind(seq_asked)
                .fetch_one(db)
                .await?;
                let _ = writeln!(
                    out,
                    "  changed at {} (answered {}): ticks due over 1 s after it with the old arguments {old_after} (besides {ran_before} that ran before the change, early after a forward step of the database's clock), ticks due before it with the new ones {new_before}",
                    asked.format("%H:%M:%S%.3f"),
                    answered.format("%H:%M:%S%.3f")
                );
                targets.push((
                    old_after == 0 && new_before == 0,
                    format!(
                        "the stored cron's change holds from the next tick: {old_after} later ticks with the old arguments, {new_before} earlier ones with the new"
                    ),
                ));
            }
            None => targets.push((
                false,
                format!(
                    "the stored cron was changed once: it was not ({})",
                    self.stored_change
                        .as_ref()
                        .and_then(|c| c.why_not.as_deref())
                        .unwrap_or("no moment without a fault under way")
                ),
            )),
        }
        Ok(targets)
    }
}
