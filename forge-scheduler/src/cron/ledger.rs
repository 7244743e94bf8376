//! The tick ledger (`forge.cron_ticks`): every statement the cron runtime makes, one round
//! trip each. The SQL functions are in `migrations/functions/`, one file each (`tick_claim.sql`,
//! `tick_gate.sql`, ...). The leader's statements run on the role's lock session
//! ([`Leadership::session`]); the node's (the registry, the board) on the pool.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge_core::{Error, Leadership, Result};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, Postgres, Row, Transaction};
use tokio::time::Instant;
use tracing::{info, warn};

use super::stored::StoredCron;
use super::{CronJob, TickState};

forge_core::sql_enum! {
    /// What `forge.tick_claim` found.
    enum ClaimOutcome {
        Claimed = "claimed",
        Ours = "ours",
        Taken = "taken",
        Early = "early",
        Fenced = "fenced",
    }
}

forge_core::sql_enum! {
    /// What `forge.tick_finish_many` found for a tick (besides a final state, when the tick
    /// already had one).
    enum FinishOutcome {
        Recorded = "recorded",
        Taken = "taken",
        Missing = "missing",
    }
}

/// What a claim found.
#[derive(Debug, PartialEq)]
pub(super) enum Claim {
    /// This tenure holds the tick now (freshly claimed, or claimed earlier by this tenure and
    /// the reply lost): run it.
    Claimed,
    /// Another tenure claimed it, or it was recorded in another state.
    Taken,
    /// The database's clock says the tick is not due yet: try again after this long.
    Early(Duration),
    /// This tenure is not the role's current leadership (in the database's view).
    Fenced,
}

/// Claims `tick` for this tenure with `state` (`running`, or `skipped` to record a skip, with
/// a note saying why).
pub(super) async fn claim(
    cron: &CronJob,
    leadership: &Leadership,
    tick: DateTime<Utc>,
    state: TickState,
    note: Option<&str>,
    manual: bool,
) -> Result<Claim> {
    let token = leadership.fence_token();
    // A manual tick ("trigger now") also answers its request.
    let query = if manual {
        sqlx::query("SELECT * FROM forge.tick_claim_manual($1, $2, $3, $4, $5, $6, $7)")
    } else {
        sqlx::query("SELECT * FROM forge.tick_claim($1, $2, $3, $4, $5, $6, $7, $8, $9)")
    };
    let query = token
        .bind(query)
        .bind(leadership.node_id())
        .bind(&cron.name)
        .bind(tick);
    let query = if manual {
        query
    } else {
        query.bind(state).bind(note)
    };
    let row = query.fetch_one(&mut *leadership.session().await?).await?;
    Ok(claim_from_row(&row)?)
}

/// One tick of a batch claim.
#[derive(Debug)]
pub(super) struct ClaimRequest {
    pub(super) cron: String,
    pub(super) tick: DateTime<Utc>,
    pub(super) state: TickState,
    pub(super) note: Option<&'static str>,
}

/// Claims several ticks for this tenure in one transaction (one commit for all the ticks due
/// at one instant), each as [`claim`] would but up to `ahead` before its instant by the
/// database's clock; the claims in input order. A tick claimed ahead is started only after
/// [`gate`] (see `migrations/functions/tick_gate.sql` for why).
pub(super) async fn claim_many(
    leadership: &Leadership,
    requests: &[ClaimRequest],
    ahead: Duration,
) -> Result<Vec<Claim>> {
    let token = leadership.fence_token();
    let crons: Vec<&str> = requests.iter().map(|r| r.cron.as_str()).collect();
    let ticks: Vec<DateTime<Utc>> = requests.iter().map(|r| r.tick).collect();
    let states: Vec<&str> = requests.iter().map(|r| r.state.as_str()).collect();
    let notes: Vec<Option<&str>> = requests.iter().map(|r| r.note).collect();
    let rows = token
        .bind(sqlx::query(
            "SELECT * FROM forge.tick_claim_ahead_many($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ORDER BY idx",
        ))
        .bind(leadership.node_id())
        .bind(&crons)
        .bind(&ticks)
        .bind(&states)
        .bind(&notes)
        .bind(ahead.as_secs_f64() * 1000.0)
        .fetch_all(&mut *leadership.session().await?)
        .await?;
    if rows.len() != requests.len() {
        return Err(answer_mismatch(
            "tick_claim_ahead_many",
            rows.len(),
            requests.len(),
        ));
    }
    Ok(rows
        .iter()
        .map(claim_from_row)
        .collect::<Result<_, sqlx::Error>>()?)
}

/// The gate before claimed ticks start: the database's time if this tenure is the role's
/// current one, read on its lock session (a reading of its clock); `None` if it is not. Ticks
/// whose instant is at or before the answer may start (a newer tenure's `acquired_at` is after
/// it).
pub(super) async fn gate(leadership: &Leadership) -> Result<Option<Reading>> {
    let token = leadership.fence_token();
    let mut session = leadership.session().await?;
    let sent = Instant::now();
    let row = token
        .bind(sqlx::query("SELECT forge.tick_gate($1, $2, $3, $4)"))
        .fetch_one(&mut *session)
        .await?;
    let received = Instant::now();
    let time: Option<DateTime<Utc>> = row.try_get(0)?;
    Ok(time.map(|time| Reading {
        time,
        sent,
        received,
    }))
}

/// One reading of the database's clock (for `DbClock`): its answer, and when the statement
/// was sent and its answer received, by this node's monotonic clock.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reading {
    pub(super) time: DateTime<Utc>,
    pub(super) sent: Instant,
    pub(super) received: Instant,
}

/// Reads the database's clock on the role's lock session, timed from when the session is
/// this statement's (not while it waits for the session).
pub(super) async fn read_clock(leadership: &Leadership) -> Result<Reading> {
    let mut session = leadership.session().await?;
    let sent = Instant::now();
    let time = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&mut *session)
        .await?;
    Ok(Reading {
        time,
        sent,
        received: Instant::now(),
    })
}

/// Deletes this tenure's claim of a tick it will not start (it hands over before the
/// instant), fenced. Whether there was such a claim.
pub(super) async fn unclaim(
    leadership: &Leadership,
    cron: &str,
    tick: DateTime<Utc>,
) -> Result<bool> {
    let token = leadership.fence_token();
    let row = token
        .bind(sqlx::query(
            "SELECT forge.tick_unclaim($1, $2, $3, $4, $5, $6)",
        ))
        .bind(cron)
        .bind(tick)
        .fetch_one(&mut *leadership.session().await?)
        .await
        .map_err(|err| token.map_error(err))?;
    Ok(row.try_get(0)?)
}

fn answer_mismatch(function: &str, rows: usize, asked: usize) -> Error {
    Error::Database(sqlx::Error::Protocol(format!(
        "forge.{function} answered {rows} rows for {asked} ticks"
    )))
}

/// A row of `forge.tick_claim` (and of its manual and batch forms).
#[derive(sqlx::FromRow)]
struct ClaimRow {
    outcome: ClaimOutcome,
    /// How long before its instant an early claim was asked for.
    early_ms: Option<f64>,
}

fn claim_from_row(row: &PgRow) -> Result<Claim, sqlx::Error> {
    let row = ClaimRow::from_row(row)?;
    Ok(match row.outcome {
        ClaimOutcome::Claimed | ClaimOutcome::Ours => Claim::Claimed,
        ClaimOutcome::Early => {
            let ms = row.early_ms.unwrap_or(1.0).max(1.0);
            Claim::Early(Duration::from_secs_f64(ms / 1000.0))
        }
        ClaimOutcome::Fenced => Claim::Fenced,
        ClaimOutcome::Taken => Claim::Taken,
    })
}

/// What recording an outcome found.
#[derive(Debug, PartialEq)]
pub(super) enum Finish {
    /// Recorded.
    Recorded,
    /// The tick was already final (completed in the handler's transaction): its state.
    AlreadyFinal(TickState),
    /// Another tenure took the tick over (this leader was presumed dead).
    Taken,
}

/// One run's outcome to record (see [`finish_many`]).
#[derive(Debug)]
pub(super) struct FinishRequest {
    pub(super) cron: String,
    pub(super) tick: DateTime<Utc>,
    pub(super) state: TickState,
    pub(super) error: Option<String>,
    /// When the handler started, by the database's clock as the leader follows it.
    pub(super) started: DateTime<Utc>,
    /// How long it ran, in milliseconds (this node's monotonic clock).
    pub(super) took_ms: f64,
}

/// Records the outcomes of runs that ended together in one statement, each only if its tick
/// is still running under this tenure; what each found, in input order.
pub(super) async fn finish_many(
    leadership: &Leadership,
    requests: &[FinishRequest],
) -> Result<Vec<Finish>> {
    let crons: Vec<&str> = requests.iter().map(|r| r.cron.as_str()).collect();
    let ticks: Vec<DateTime<Utc>> = requests.iter().map(|r| r.tick).collect();
    let states: Vec<&str> = requests.iter().map(|r| r.state.as_str()).collect();
    let errors: Vec<Option<&str>> = requests.iter().map(|r| r.error.as_deref()).collect();
    let started: Vec<DateTime<Utc>> = requests.iter().map(|r| r.started).collect();
    let took: Vec<f64> = requests.iter().map(|r| r.took_ms).collect();
    let outcomes: Vec<String> = sqlx::query_scalar(
        "SELECT outcome FROM forge.tick_finish_many($1, $2, $3, $4, $5, $6, $7, $8) ORDER BY idx",
    )
    .bind(leadership.namespace())
    .bind(leadership.tenure_id())
    .bind(&crons)
    .bind(&ticks)
    .bind(&states)
    .bind(&errors)
    .bind(&started)
    .bind(&took)
    .fetch_all(&mut *leadership.session().await?)
    .await?;
    if outcomes.len() != requests.len() {
        return Err(answer_mismatch(
            "tick_finish_many",
            outcomes.len(),
            requests.len(),
        ));
    }
    let mut found = Vec::with_capacity(outcomes.len());
    for outcome in outcomes {
        found.push(
            match (FinishOutcome::parse(&outcome), TickState::parse(&outcome)) {
                (Some(FinishOutcome::Recorded), _) => Finish::Recorded,
                (Some(FinishOutcome::Taken | FinishOutcome::Missing), _) => Finish::Taken,
                (None, Some(state)) => Finish::AlreadyFinal(state),
                (None, None) => Finish::Taken,
            },
        );
    }
    Ok(found)
}

/// Marks the tick succeeded inside the handler's transaction, fenced, with when its handler
/// started.
pub(super) async fn complete(
    leadership: &Leadership,
    cron: &str,
    tick: DateTime<Utc>,
    started: DateTime<Utc>,
    tx: &mut Transaction<'_, Postgres>,
) -> Result<()> {
    let token = leadership.fence_token();
    token
        .bind(sqlx::query(
            "SELECT forge.tick_complete($1, $2, $3, $4, $5, $6, $7)",
        ))
        .bind(cron)
        .bind(tick)
        .bind(started)
        .execute(&mut **tx)
        .await
        .map_err(|err| match &err {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("FG002") => {
                Error::NotRunning {
                    what: format!("tick {tick} of cron `{cron}`"),
                    why: "another leadership took it over, or it was recorded already".into(),
                }
            }
            _ => token.map_error(err),
        })?;
    Ok(())
}

/// Takes over a tick an earlier tenure left running (rerun) or marks it abandoned, fenced.
/// Returns the tick's attempt number if this tenure took it.
pub(super) async fn reclaim(
    cron: &CronJob,
    leadership: &Leadership,
    tick: DateTime<Utc>,
    rerun: bool,
) -> Result<Option<i32>> {
    let token = leadership.fence_token();
    token
        .bind(sqlx::query(
            "SELECT forge.tick_reclaim($1, $2, $3, $4, $5, $6, $7, $8)",
        ))
        .bind(leadership.node_id())
        .bind(&cron.name)
        .bind(tick)
        .bind(rerun)
        .fetch_one(&mut *leadership.session().await?)
        .await
        .map_err(|err| token.map_error(err))?
        .try_get(0)
        .map_err(Error::from)
}

forge_core::sql_enum! {
    /// What a row of [`load`]'s second statement is about.
    enum Found {
        /// A tick an earlier tenure left running.
        Interrupted = "interrupted",
        /// A cron of the role that this binary lacks.
        Unknown = "unknown",
    }
}

/// Where a cron resumes in a new tenure.
#[derive(Default)]
pub(super) struct Resume {
    /// When the cron was first registered in the cluster (nothing to catch up before that).
    pub(super) first_seen: Option<DateTime<Utc>>,
    /// The newest claimed tick.
    pub(super) frontier: Option<DateTime<Utc>>,
    /// Ticks whose run was cut short by an earlier tenure: (scheduled_at, attempt, epoch).
    pub(super) interrupted: Vec<(DateTime<Utc>, i32, i64)>,
}

/// What operators asked of the crons: which are paused, which have a "trigger now" pending.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Board {
    /// The names of the crons paused in the cluster.
    pub(super) paused: std::collections::BTreeSet<String>,
    /// Pending manual runs: the cron and the instant of its manual tick.
    pub(super) triggers: BTreeMap<String, DateTime<Utc>>,
    /// The crons stored in the database, by name.
    pub(super) stored: BTreeMap<String, StoredCron>,
}

/// Reads the [`Board`].
pub(super) async fn board(
    pool: &sqlx::PgPool,
    namespace: &forge_core::LockNamespace,
) -> Result<Board, sqlx::Error> {
    /// A paused, triggered or stored cron.
    #[derive(sqlx::FromRow)]
    struct BoardRow {
        name: String,
        paused: bool,
        trigger_requested_at: Option<DateTime<Utc>>,
        expression: String,
        timezone: String,
        job_kind: Option<String>,
        job_args: Option<serde_json::Value>,
        options: Option<serde_json::Value>,
    }
    let rows: Vec<BoardRow> = sqlx::query_as(
        "SELECT name, paused_at IS NOT NULL AS paused, trigger_requested_at, expression, timezone,
                job_kind, job_args, options
           FROM forge.crons
          WHERE namespace = $1
            AND (paused_at IS NOT NULL OR trigger_requested_at IS NOT NULL OR job_kind IS NOT NULL)",
    )
    .bind(namespace)
    .fetch_all(pool)
    .await?;
    let mut board = Board::default();
    for row in rows {
        if let Some(at) = row.trigger_requested_at {
            board.triggers.insert(row.name.clone(), at);
        }
        if row.paused {
            board.paused.insert(row.name.clone());
        }
        if let (Some(kind), Some(args), Some(options)) = (row.job_kind, row.job_args, row.options) {
            match StoredCron::from_stored(
                row.name.clone(),
                &row.expression,
                &row.timezone,
                kind,
                args,
                &options,
            ) {
                Ok(cron) => {
                    board.stored.insert(row.name, cron);
                }
                Err(message) => {
                    warn!(target: "forge::cron", cron = %row.name, %message,
                          "a stored cron cannot be read by this binary: it does not run on this node");
                }
            }
        }
    }
    Ok(board)
}

/// Takes back the ticks earlier tenures claimed ahead and never started, registers the role's
/// crons, reads each one's frontier and interrupted ticks, and counts crons the cluster knows
/// for this role that this binary lacks. Three statements.
pub(super) async fn load(crons: &[CronJob], leadership: &Leadership) -> Result<Loaded> {
    let namespace = leadership.namespace();
    let role = leadership.role();
    // First the claims of earlier tenures that were never started (made ahead of an instant
    // at or after this tenure began): this tenure claims those ticks again, on time.
    let token = leadership.fence_token();
    /// A tick an earlier tenure claimed ahead and never started.
    #[derive(sqlx::FromRow)]
    struct Unstarted {
        cron: String,
        scheduled_at: DateTime<Utc>,
        epoch: i64,
    }
    let unstarted = token
        .bind(sqlx::query(
            "SELECT cron, scheduled_at, epoch FROM forge.tick_unclaim_unstarted($1, $2, $3, $4)",
        ))
        .fetch_all(&mut *leadership.session().await?)
        .await
        .map_err(|err| token.map_error(err))?;
    for row in &unstarted {
        let Unstarted {
            cron,
            scheduled_at: tick,
            epoch,
        } = Unstarted::from_row(row)?;
        info!(target: "forge::cron", %cron, %tick, previous_epoch = epoch,
              "an earlier leader claimed this tick ahead and never started it: claiming it again");
    }
    let names: Vec<&str> = crons.iter().map(|c| c.name.as_str()).collect();
    let expressions: Vec<&str> = crons.iter().map(|c| c.schedule.expression()).collect();
    let zones: Vec<&str> = crons.iter().map(|c| c.schedule.timezone().name()).collect();
    /// A cron as registered, with its newest claimed tick.
    #[derive(sqlx::FromRow)]
    struct Registered {
        name: String,
        first_seen_at: Option<DateTime<Utc>>,
        frontier: Option<DateTime<Utc>>,
    }
    let rows: Vec<Registered> = sqlx::query_as(
        "WITH up AS (
             INSERT INTO forge.crons AS c (namespace, name, role, expression, timezone, last_seen_by)
             SELECT $1, name, $2, expression, timezone, $6
               FROM unnest($3::text[], $4::text[], $5::text[]) AS m(name, expression, timezone)
             ON CONFLICT (namespace, name) DO UPDATE
                SET role = EXCLUDED.role, expression = EXCLUDED.expression, timezone = EXCLUDED.timezone,
                    last_seen_at = clock_timestamp(), last_seen_by = EXCLUDED.last_seen_by
              WHERE c.job_kind IS NULL
             RETURNING c.name, c.first_seen_at)
         SELECT up.name, up.first_seen_at,
                (SELECT max(t.scheduled_at) FROM forge.cron_ticks t
                  WHERE t.namespace = $1 AND t.cron = up.name AND NOT t.manual) AS frontier
           FROM up",
    )
    .bind(namespace)
    .bind(role)
    .bind(&names)
    .bind(&expressions)
    .bind(&zones)
    .bind(leadership.node_id())
    .fetch_all(&mut *leadership.session().await?)
    .await?;
    let mut resume: BTreeMap<String, Resume> = BTreeMap::new();
    // A cron of code not registered: a stored cron has its name (see `stored.rs`).
    let shadowed: Vec<String> = names
        .iter()
        .filter(|name| !rows.iter().any(|row| row.name == **name))
        .map(|name| name.to_string())
        .collect();
    for row in rows {
        let entry = resume.entry(row.name).or_default();
        entry.first_seen = row.first_seen_at;
        entry.frontier = row.frontier;
    }
    /// An interrupted tick of a known cron, or a cron of the role this binary lacks.
    #[derive(sqlx::FromRow)]
    struct FoundRow {
        found: Found,
        name: String,
        scheduled_at: Option<DateTime<Utc>>,
        attempt: Option<i32>,
        epoch: Option<i64>,
        seen_by: Option<String>,
    }
    let rows: Vec<FoundRow> = sqlx::query_as(
        "SELECT $5 AS found, cron AS name, scheduled_at, attempt, epoch, NULL AS seen_by
           FROM forge.cron_ticks
          WHERE namespace = $1 AND role = $2 AND state = $6 AND tenure <> $3
         UNION ALL
         SELECT $7, name, NULL, NULL, NULL, last_seen_by
           FROM forge.crons
          WHERE namespace = $1 AND role = $2 AND NOT (name = ANY($4)) AND job_kind IS NULL
          ORDER BY 3",
    )
    .bind(namespace)
    .bind(role)
    .bind(leadership.tenure_id())
    .bind(&names)
    .bind(Found::Interrupted)
    .bind(TickState::Running)
    .bind(Found::Unknown)
    .fetch_all(&mut *leadership.session().await?)
    .await?;
    let mut unknown = Vec::new();
    for row in rows {
        if row.found == Found::Unknown {
            unknown.push((row.name, row.seen_by.unwrap_or_default()));
        } else {
            let entry = resume.entry(row.name).or_default();
            if let (Some(at), Some(attempt), Some(epoch)) =
                (row.scheduled_at, row.attempt, row.epoch)
            {
                entry.interrupted.push((at, attempt, epoch));
            }
        }
    }
    Ok(Loaded {
        resume,
        unknown,
        shadowed,
    })
}

/// What [`load`] found at a tenure's start.
pub(super) struct Loaded {
    /// Where each cron of code resumes.
    pub(super) resume: BTreeMap<String, Resume>,
    /// Crons of code of the role that this binary lacks, and the node that last had each.
    pub(super) unknown: Vec<(String, String)>,
    /// This binary's crons of code named like a stored cron: they do not run.
    pub(super) shadowed: Vec<String>,
}

/// Where a stored cron's loop resumes: its frontier (never before its definition was stored)
/// and the ticks earlier tenures left running. Two statements on the lock session.
pub(super) async fn resume_stored(leadership: &Leadership, name: &str) -> Result<Resume> {
    let namespace = leadership.namespace();
    let (stored_at, frontier): (Option<DateTime<Utc>>, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT (SELECT stored_at FROM forge.crons WHERE namespace = $1 AND name = $2),
                (SELECT max(t.scheduled_at) FROM forge.cron_ticks t
                  WHERE t.namespace = $1 AND t.cron = $2 AND NOT t.manual)",
    )
    .bind(namespace)
    .bind(name)
    .fetch_one(&mut *leadership.session().await?)
    .await?;
    let interrupted: Vec<(DateTime<Utc>, i32, i64)> = sqlx::query_as(
        "SELECT scheduled_at, attempt, epoch FROM forge.cron_ticks
          WHERE namespace = $1 AND cron = $2 AND state = $3 AND tenure <> $4
          ORDER BY scheduled_at",
    )
    .bind(namespace)
    .bind(name)
    .bind(TickState::Running)
    .bind(leadership.tenure_id())
    .fetch_all(&mut *leadership.session().await?)
    .await?;
    let stored_at = stored_at.unwrap_or_else(Utc::now);
    Ok(Resume {
        first_seen: Some(stored_at),
        frontier: Some(super::stored::stored_from(frontier, stored_at)),
        interrupted,
    })
}

/// Records this node's crons in `forge.crons`, so that a leader whose binary lacks one of
/// them can say so.
pub(super) async fn register(
    pool: &sqlx::PgPool,
    namespace: &forge_core::LockNamespace,
    node: &forge_core::NodeId,
    crons: &[CronJob],
) -> Result<Vec<String>, sqlx::Error> {
    let names: Vec<&str> = crons.iter().map(|c| c.name.as_str()).collect();
    let roles: Vec<&str> = crons.iter().map(|c| c.role.name()).collect();
    let expressions: Vec<&str> = crons.iter().map(|c| c.schedule.expression()).collect();
    let zones: Vec<&str> = crons.iter().map(|c| c.schedule.timezone().name()).collect();
    // A stored cron's row is not taken over: its name is answered (shadowed, see `stored.rs`).
    let shadowed = sqlx::query_scalar(
        "WITH up AS (
             INSERT INTO forge.crons AS c (namespace, name, role, expression, timezone, last_seen_by)
             SELECT $1, name, role, expression, timezone, $6
               FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS m(name, role, expression, timezone)
             ON CONFLICT (namespace, name) DO UPDATE
                SET role = EXCLUDED.role, expression = EXCLUDED.expression, timezone = EXCLUDED.timezone,
                    last_seen_at = clock_timestamp(), last_seen_by = EXCLUDED.last_seen_by
              WHERE c.job_kind IS NULL
             RETURNING c.name)
         SELECT name FROM unnest($2::text[]) AS m(name) WHERE name NOT IN (SELECT name FROM up)",
    )
    .bind(namespace)
    .bind(&names)
    .bind(&roles)
    .bind(&expressions)
    .bind(&zones)
    .bind(node)
    .fetch_all(pool)
    .await?;
    Ok(shadowed)
}
