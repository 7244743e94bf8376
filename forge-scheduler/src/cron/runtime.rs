//! The cron runtime: one supervisor per role (a leader task), one timer loop per cron.
//!
//! ```text
//! tenure starts ──► load: register crons, frontier per cron, interrupted ticks, unknown crons
//!                   ├─► interrupted ticks: rerun (attempt + 1) or abandon
//!                   ├─► catch-up of ticks due since the frontier (skip / latest / all)
//!                   └─► loop: sleep until the next tick ─► claim (fenced INSERT) ─► run ─► finish
//! ```
//!
//! The claim is `INSERT INTO forge.cron_ticks ... SELECT ... FROM <fence> ON CONFLICT DO NOTHING`
//! where the fence selects the role's row `FOR KEY SHARE` only if this tenure's epoch is
//! current: a deposed leader's claim either commits before its successor's epoch exists (and
//! the successor sees it) or inserts nothing. Ticks are claimed in order, so the newest
//! claimed tick of a cron (its frontier) is where a new leader resumes.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use forge_core::{Leadership, NodeContext, Result, Role};
use futures_util::FutureExt;
use sqlx::Row;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::{CatchUp, CronContext, CronJob, Interrupted, Overlap};

/// Attempts of one tick under [`Interrupted::Rerun`], the first included.
const MAX_TICK_ATTEMPTS: i32 = 3;

/// Settings every cron loop of a node shares, read from the config at install time.
struct Settings {
    misfire_threshold: Duration,
}

/// Rejects two different crons with one name; drops exact duplicates (a cron registered both
/// automatically and explicitly).
pub(crate) fn dedupe(crons: Vec<CronJob>) -> Result<Vec<CronJob>> {
    let mut kept: Vec<CronJob> = Vec::new();
    for cron in crons {
        validate_name(&cron.name)?;
        match kept.iter().find(|k| k.name == cron.name) {
            Some(existing) if existing.same_definition(&cron) => {}
            Some(_) => {
                return Err(forge_core::Error::Registration {
                    message: format!(
                        "two different crons are named `{}`: give one of them another name (#[cron(..., name = \"...\")])",
                        cron.name
                    ),
                });
            }
            None => kept.push(cron),
        }
    }
    Ok(kept)
}

/// Cron names key the ledger and label metrics: 1-64 ASCII letters, digits, `_ - . :`,
/// starting with a letter (the same rule `#[cron]` checks at compile time).
fn validate_name(name: &str) -> Result<()> {
    let valid = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    if valid {
        Ok(())
    } else {
        Err(forge_core::Error::Registration {
            message: format!(
                "invalid cron name {name:?}: use 1-64 ASCII letters, digits, `_`, `-`, `.` or `:`, starting with a letter"
            ),
        })
    }
}

/// Adds one supervisor (a leader task) per role that has crons, and a service that records
/// this node's crons in `forge.crons` at start.
pub(crate) fn install(
    crons: Vec<CronJob>,
    mut builder: forge_core::NodeBuilder,
) -> forge_core::NodeBuilder {
    if crons.is_empty() {
        return builder;
    }
    let settings = Arc::new(Settings {
        misfire_threshold: builder.config().cron.misfire_threshold,
    });
    let mut by_role: BTreeMap<Role, Vec<CronJob>> = BTreeMap::new();
    for cron in &crons {
        by_role
            .entry(cron.role.clone())
            .or_default()
            .push(cron.clone());
    }
    for (role, crons) in by_role {
        let crons = Arc::new(crons);
        let settings = settings.clone();
        builder = builder.leader_task(role, "crons", move |leadership| {
            supervise(crons.clone(), leadership, settings.clone())
        });
    }
    let crons = Arc::new(crons);
    builder.service("cron-registry", move |ctx| announce(crons, ctx))
}

/// Records this node's crons in `forge.crons`, so that a leader whose binary lacks one of
/// them can say so.
async fn announce(crons: Arc<Vec<CronJob>>, ctx: NodeContext) {
    let namespace = ctx.config().cluster.lock_namespace.clone();
    let mut delay = Duration::from_millis(200);
    for _ in 0..10 {
        let result = register(ctx.pool(), &namespace, ctx.node_id().as_str(), &crons).await;
        match result {
            Ok(()) => return,
            Err(err) => debug!(target: "forge::cron", error = %err, "cannot record crons yet"),
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = ctx.shutdown().cancelled() => return,
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

async fn register(
    pool: &sqlx::PgPool,
    namespace: &str,
    node: &str,
    crons: &[CronJob],
) -> Result<(), sqlx::Error> {
    let names: Vec<&str> = crons.iter().map(|c| c.name.as_str()).collect();
    let roles: Vec<&str> = crons.iter().map(|c| c.role.name()).collect();
    let expressions: Vec<&str> = crons.iter().map(|c| c.schedule.expression()).collect();
    let zones: Vec<&str> = crons.iter().map(|c| c.schedule.timezone().name()).collect();
    sqlx::query(
        "INSERT INTO forge.crons AS c (namespace, name, role, expression, timezone, last_seen_by)
         SELECT $1, name, role, expression, timezone, $6
           FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS m(name, role, expression, timezone)
         ON CONFLICT (namespace, name) DO UPDATE
            SET role = EXCLUDED.role, expression = EXCLUDED.expression, timezone = EXCLUDED.timezone,
                last_seen_at = clock_timestamp(), last_seen_by = EXCLUDED.last_seen_by",
    )
    .bind(namespace)
    .bind(&names)
    .bind(&roles)
    .bind(&expressions)
    .bind(&zones)
    .bind(node)
    .execute(pool)
    .await?;
    Ok(())
}

/// Where a cron resumes in a new tenure.
#[derive(Default)]
struct Resume {
    /// When the cron was first registered in the cluster (nothing to catch up before that).
    first_seen: Option<DateTime<Utc>>,
    /// The newest claimed tick.
    frontier: Option<DateTime<Utc>>,
    /// Ticks whose run was cut short by an earlier tenure: (scheduled_at, attempt, epoch).
    interrupted: Vec<(DateTime<Utc>, i32, i64)>,
}

/// The leader task of one role's crons.
async fn supervise(crons: Arc<Vec<CronJob>>, leadership: Leadership, settings: Arc<Settings>) {
    let mut delay = Duration::from_millis(100);
    let mut resume = loop {
        match load(&crons, &leadership).await {
            Ok(resume) => break resume,
            Err(err) => {
                warn!(target: "forge::cron", role = %leadership.role(), epoch = %leadership.epoch(), error = %err,
                      "cannot read the tick ledger; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = leadership.stopping() => return,
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    };
    info!(target: "forge::cron", role = %leadership.role(), epoch = %leadership.epoch(), crons = crons.len(),
          "running crons");
    let mut loops = JoinSet::new();
    for cron in crons.iter() {
        let resume = resume.remove(&cron.name).unwrap_or_default();
        loops.spawn(run_cron(
            cron.clone(),
            leadership.clone(),
            resume,
            settings.clone(),
        ));
    }
    while loops.join_next().await.is_some() {}
}

/// Registers the role's crons, reads each one's frontier and interrupted ticks, and warns
/// about crons the cluster knows for this role that this binary lacks. Two statements.
async fn load(
    crons: &[CronJob],
    leadership: &Leadership,
) -> Result<BTreeMap<String, Resume>, sqlx::Error> {
    let namespace = leadership.namespace().name();
    let role = leadership.role().name();
    let names: Vec<&str> = crons.iter().map(|c| c.name.as_str()).collect();
    let expressions: Vec<&str> = crons.iter().map(|c| c.schedule.expression()).collect();
    let zones: Vec<&str> = crons.iter().map(|c| c.schedule.timezone().name()).collect();
    let rows = sqlx::query(
        "WITH up AS (
             INSERT INTO forge.crons AS c (namespace, name, role, expression, timezone, last_seen_by)
             SELECT $1, name, $2, expression, timezone, $6
               FROM unnest($3::text[], $4::text[], $5::text[]) AS m(name, expression, timezone)
             ON CONFLICT (namespace, name) DO UPDATE
                SET role = EXCLUDED.role, expression = EXCLUDED.expression, timezone = EXCLUDED.timezone,
                    last_seen_at = clock_timestamp(), last_seen_by = EXCLUDED.last_seen_by
             RETURNING c.name, c.first_seen_at)
         SELECT up.name, up.first_seen_at,
                (SELECT max(t.scheduled_at) FROM forge.cron_ticks t
                  WHERE t.namespace = $1 AND t.cron = up.name) AS frontier
           FROM up",
    )
    .bind(namespace)
    .bind(role)
    .bind(&names)
    .bind(&expressions)
    .bind(&zones)
    .bind(leadership.node_id().as_str())
    .fetch_all(leadership.pool())
    .await?;
    let mut resume: BTreeMap<String, Resume> = BTreeMap::new();
    for row in rows {
        let entry = resume.entry(row.try_get("name")?).or_default();
        entry.first_seen = row.try_get("first_seen_at")?;
        entry.frontier = row.try_get("frontier")?;
    }
    let rows = sqlx::query(
        "SELECT 'interrupted' AS kind, cron AS name, scheduled_at, attempt, epoch, NULL AS seen_by
           FROM forge.cron_ticks
          WHERE namespace = $1 AND role = $2 AND state = 'running' AND epoch < $3
         UNION ALL
         SELECT 'unknown', name, NULL, NULL, NULL, last_seen_by
           FROM forge.crons
          WHERE namespace = $1 AND role = $2 AND NOT (name = ANY($4))
          ORDER BY 3",
    )
    .bind(namespace)
    .bind(role)
    .bind(leadership.epoch().0)
    .bind(&names)
    .fetch_all(leadership.pool())
    .await?;
    let mut unknown = 0;
    for row in rows {
        let kind: String = row.try_get("kind")?;
        let name: String = row.try_get("name")?;
        if kind == "unknown" {
            unknown += 1;
            let seen_by: Option<String> = row.try_get("seen_by")?;
            warn!(target: "forge::cron", cron = %name, role, node = %leadership.node_id(),
                  registered_by = seen_by.as_deref().unwrap_or("?"),
                  "the cluster knows this cron but this node's binary does not have it: its ticks will not run while this node leads the role");
        } else if let Some(entry) = resume.get_mut(&name) {
            let at: Option<DateTime<Utc>> = row.try_get("scheduled_at")?;
            let attempt: Option<i32> = row.try_get("attempt")?;
            let epoch: Option<i64> = row.try_get("epoch")?;
            if let (Some(at), Some(attempt), Some(epoch)) = (at, attempt, epoch) {
                entry.interrupted.push((at, attempt, epoch));
            }
        }
    }
    leadership
        .metrics()
        .gauge("forge_cron_unknown_crons", &[("role", role)])
        .set(f64::from(unknown));
    Ok(resume)
}

/// One cron's loop for one tenure.
async fn run_cron(cron: CronJob, leadership: Leadership, resume: Resume, settings: Arc<Settings>) {
    let mut runs = Runs::new(cron.clone(), leadership.clone());
    for (at, attempt, epoch) in &resume.interrupted {
        runs.recover(*at, *attempt, *epoch).await;
    }

    // Catch-up: ticks due after the frontier (or the cron's registration), up to now.
    let now = Utc::now();
    let from = resume.frontier.or(resume.first_seen).unwrap_or(now);
    if from < now {
        let window_start = now - to_delta(cron.catch_up_window);
        let threshold = to_delta(settings.misfire_threshold);
        let mut missed = 0u64;
        let mut due: Vec<DateTime<Utc>> = Vec::new();
        for tick in cron.schedule.ticks_between(from, now) {
            let eligible = match cron.catch_up {
                CatchUp::Skip => now - tick <= threshold,
                CatchUp::Latest | CatchUp::All => tick >= window_start,
            };
            if !eligible {
                missed += 1;
            } else if cron.catch_up == CatchUp::Latest && !due.is_empty() {
                // Only the most recent eligible tick runs.
                missed += 1;
                due[0] = tick;
            } else {
                due.push(tick);
            }
        }
        if missed > 0 {
            leadership
                .metrics()
                .counter("forge_cron_missed_ticks_total", &labels(&cron))
                .increment(missed);
            warn!(target: "forge::cron", cron = %cron.name, role = %cron.role, missed, catch_up = cron.catch_up.as_str(),
                  "ticks were due while the role had no leader and are not run");
        }
        for tick in due {
            // Catch-up ticks run one after another (unless overlap = allow), so that a slow
            // handler does not turn a backlog into skipped ticks.
            if cron.overlap != Overlap::Allow {
                runs.wait_idle().await;
            }
            if !runs.fire(tick, true).await {
                return runs.drain().await;
            }
        }
    }

    let mut cursor = now.max(from);
    loop {
        let Some(tick) = cron.schedule.next_after(cursor) else {
            info!(target: "forge::cron", cron = %cron.name, "the schedule has no further ticks");
            break;
        };
        cursor = tick;
        let due = tokio::select! {
            biased;
            _ = leadership.stopping() => false,
            _ = sleep_until_utc(tick) => true,
        };
        if !due || !runs.fire(tick, false).await {
            break;
        }
    }
    runs.drain().await
}

/// The runs of one cron in one tenure.
struct Runs {
    cron: CronJob,
    leadership: Leadership,
    running: JoinSet<()>,
}

impl Runs {
    fn new(cron: CronJob, leadership: Leadership) -> Runs {
        Runs {
            cron,
            leadership,
            running: JoinSet::new(),
        }
    }

    async fn wait_idle(&mut self) {
        while self.running.join_next().await.is_some() {}
    }

    /// On a handoff, lets runs in progress finish (the election bounds this with
    /// `drain_timeout`); on a loss they are aborted when this is dropped.
    async fn drain(mut self) {
        self.wait_idle().await;
    }

    /// Claims and runs one tick. Returns false when this tenure can no longer act.
    async fn fire(&mut self, tick: DateTime<Utc>, catching_up: bool) -> bool {
        if !self.leadership.is_valid() || self.leadership.is_draining() {
            return false;
        }
        // Reap finished runs so that "still running" means it.
        while self.running.try_join_next().is_some() {}
        let overlapping = !self.running.is_empty();
        let skip = overlapping && self.cron.overlap == Overlap::Skip && !catching_up;
        if overlapping && self.cron.overlap == Overlap::Wait {
            self.wait_idle().await;
        }
        let state = if skip { "skipped" } else { "running" };
        match claim(&self.cron, &self.leadership, tick, state).await {
            Ok(Claim::Claimed) => {}
            Ok(Claim::AlreadyClaimed) => {
                debug!(target: "forge::cron", cron = %self.cron.name, %tick, "tick already claimed");
                return true;
            }
            Ok(Claim::Fenced) => {
                warn!(target: "forge::cron", cron = %self.cron.name, %tick, epoch = %self.leadership.epoch(),
                      "not claiming a tick: this leadership is no longer current");
                return false;
            }
            Err(err) => {
                // The tick stays unclaimed; a later leader's catch-up may still run it.
                error!(target: "forge::cron", cron = %self.cron.name, %tick, error = %err, "cannot claim a tick");
                return true;
            }
        }
        if skip {
            self.leadership
                .metrics()
                .counter(
                    "forge_cron_runs_total",
                    &outcome_labels(&self.cron, "skipped"),
                )
                .increment(1);
            info!(target: "forge::cron", cron = %self.cron.name, %tick, "tick skipped: the previous run is still going (overlap = skip)");
            return true;
        }
        self.spawn_run(tick, 1);
        true
    }

    /// Handles a tick an earlier tenure claimed but did not finish.
    async fn recover(&mut self, tick: DateTime<Utc>, attempt: i32, epoch: i64) {
        let rerun = self.cron.interrupted == Interrupted::Rerun && attempt < MAX_TICK_ATTEMPTS;
        match reclaim(&self.cron, &self.leadership, tick, rerun, epoch).await {
            Ok(Some(attempt)) if rerun => {
                warn!(target: "forge::cron", cron = %self.cron.name, %tick, attempt, previous_epoch = epoch,
                      "rerunning a tick whose run was cut short by its leader's death");
                if self.cron.overlap != Overlap::Allow {
                    self.wait_idle().await;
                }
                self.spawn_run(tick, attempt as u32);
            }
            Ok(Some(_)) => {
                self.leadership
                    .metrics()
                    .counter(
                        "forge_cron_runs_total",
                        &outcome_labels(&self.cron, "abandoned"),
                    )
                    .increment(1);
                warn!(target: "forge::cron", cron = %self.cron.name, %tick, attempt, previous_epoch = epoch,
                      "abandoned a tick whose run was cut short by its leader's death");
            }
            Ok(None) => {}
            Err(err) => {
                error!(target: "forge::cron", cron = %self.cron.name, %tick, error = %err, "cannot recover an interrupted tick");
            }
        }
    }

    fn spawn_run(&mut self, tick: DateTime<Utc>, attempt: u32) {
        let cron = self.cron.clone();
        let leadership = self.leadership.clone();
        self.running.spawn(async move {
            run_tick(cron, leadership, tick, attempt).await;
        });
    }
}

/// Runs a claimed tick's handler and records the outcome.
async fn run_tick(cron: CronJob, leadership: Leadership, tick: DateTime<Utc>, attempt: u32) {
    let fired_at = Utc::now();
    let metrics = leadership.metrics().clone();
    let labels = labels(&cron);
    let lag = (fired_at - tick).to_std().unwrap_or_default();
    metrics
        .histogram("forge_cron_lag_seconds", &labels)
        .record(lag.as_secs_f64());
    let cancel = CancellationToken::new();
    let ctx = CronContext {
        name: cron.name.as_str().into(),
        scheduled_at: tick,
        fired_at,
        attempt,
        leadership: leadership.clone(),
        cancel: cancel.clone(),
    };
    debug!(target: "forge::cron", cron = %cron.name, %tick, attempt, lag_ms = lag.as_millis() as u64, "run");
    let started = tokio::time::Instant::now();
    let work = AssertUnwindSafe((cron.handler)(ctx)).catch_unwind();
    let result = match cron.timeout {
        Some(limit) => tokio::time::timeout(limit, work).await.ok(),
        None => Some(work.await),
    };
    let (state, error) = match result {
        None => {
            cancel.cancel();
            (
                "timed_out",
                Some(format!(
                    "the run exceeded its timeout of {:?}",
                    cron.timeout.unwrap_or_default()
                )),
            )
        }
        Some(Ok(Ok(()))) => ("succeeded", None),
        Some(Ok(Err(err))) => ("failed", Some(err.to_string())),
        Some(Err(panic)) => (
            "failed",
            Some(format!("panicked: {}", panic_message(&panic))),
        ),
    };
    metrics
        .histogram("forge_cron_run_duration_seconds", &labels)
        .record(started.elapsed().as_secs_f64());
    metrics
        .counter("forge_cron_runs_total", &outcome_labels(&cron, state))
        .increment(1);
    match &error {
        Some(error) => {
            warn!(target: "forge::cron", cron = %cron.name, %tick, attempt, outcome = state, %error, "run did not succeed")
        }
        None => debug!(target: "forge::cron", cron = %cron.name, %tick, attempt, "run succeeded"),
    }
    if let Err(err) = finish(&cron, &leadership, tick, state, error.as_deref()).await {
        warn!(target: "forge::cron", cron = %cron.name, %tick, error = %err, "cannot record a run's outcome");
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

enum Claim {
    Claimed,
    AlreadyClaimed,
    Fenced,
}

/// The fenced claim: one statement, one round trip.
async fn claim(
    cron: &CronJob,
    leadership: &Leadership,
    tick: DateTime<Utc>,
    state: &str,
) -> Result<Claim, sqlx::Error> {
    let row = sqlx::query(
        "WITH fence AS (
             SELECT 1 FROM forge.leaders
              WHERE namespace = $1 AND role = $2 AND epoch = $3
                AND released_at IS NULL AND lease_until > clock_timestamp()
                FOR KEY SHARE
         ), claimed AS (
             INSERT INTO forge.cron_ticks (namespace, cron, scheduled_at, role, epoch, node_id, state, finished_at)
             SELECT $1, $4, $5, $2, $3, $6, $7, CASE WHEN $7 = 'running' THEN NULL ELSE clock_timestamp() END
               FROM fence
             ON CONFLICT DO NOTHING
             RETURNING 1
         )
         SELECT EXISTS (SELECT 1 FROM fence) AS current, EXISTS (SELECT 1 FROM claimed) AS claimed",
    )
    .bind(leadership.namespace().name())
    .bind(leadership.role().name())
    .bind(leadership.epoch().0)
    .bind(&cron.name)
    .bind(tick)
    .bind(leadership.node_id().as_str())
    .bind(state)
    .fetch_one(leadership.pool())
    .await?;
    let current: bool = row.try_get("current")?;
    let claimed: bool = row.try_get("claimed")?;
    Ok(match (current, claimed) {
        (false, _) => Claim::Fenced,
        (true, true) => Claim::Claimed,
        (true, false) => Claim::AlreadyClaimed,
    })
}

/// Takes over an interrupted tick for this tenure (rerun) or marks it abandoned, fenced.
/// Returns the tick's attempt number if this tenure took it.
async fn reclaim(
    cron: &CronJob,
    leadership: &Leadership,
    tick: DateTime<Utc>,
    rerun: bool,
    previous_epoch: i64,
) -> Result<Option<i32>, sqlx::Error> {
    sqlx::query_scalar(
        "WITH fence AS (
             SELECT 1 FROM forge.leaders
              WHERE namespace = $1 AND role = $2 AND epoch = $3
                AND released_at IS NULL AND lease_until > clock_timestamp()
                FOR KEY SHARE
         )
         UPDATE forge.cron_ticks t
            SET attempt = t.attempt + CASE WHEN $6 THEN 1 ELSE 0 END,
                epoch = $3, node_id = $7,
                state = CASE WHEN $6 THEN 'running' ELSE 'abandoned' END,
                claimed_at = clock_timestamp(),
                finished_at = CASE WHEN $6 THEN NULL ELSE clock_timestamp() END,
                error = CASE WHEN $6 THEN NULL
                             ELSE 'interrupted by the loss of the leadership of epoch ' || $8 END
          WHERE t.namespace = $1 AND t.cron = $4 AND t.scheduled_at = $5
            AND t.state = 'running' AND t.epoch < $3
            AND EXISTS (SELECT 1 FROM fence)
         RETURNING t.attempt",
    )
    .bind(leadership.namespace().name())
    .bind(leadership.role().name())
    .bind(leadership.epoch().0)
    .bind(&cron.name)
    .bind(tick)
    .bind(rerun)
    .bind(leadership.node_id().as_str())
    .bind(previous_epoch.to_string())
    .fetch_optional(leadership.pool())
    .await
}

/// Records a run's outcome. Only the tenure that claimed the tick may: if a newer leader has
/// taken the tick over in the meantime, this changes nothing.
async fn finish(
    cron: &CronJob,
    leadership: &Leadership,
    tick: DateTime<Utc>,
    state: &str,
    error: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE forge.cron_ticks
            SET state = $5, finished_at = clock_timestamp(), error = $6
          WHERE namespace = $1 AND cron = $2 AND scheduled_at = $3 AND epoch = $4 AND state = 'running'",
    )
    .bind(leadership.namespace().name())
    .bind(&cron.name)
    .bind(tick)
    .bind(leadership.epoch().0)
    .bind(state)
    .bind(error)
    .execute(leadership.pool())
    .await?;
    Ok(())
}

/// Sleeps until a wall-clock instant. Timers run on the monotonic clock, so long sleeps are
/// cut into pieces of at most 30 s and the wall clock is re-read: a stepped system clock
/// (NTP) shifts the tick by at most that much re-check.
async fn sleep_until_utc(at: DateTime<Utc>) {
    loop {
        let remaining = (at - Utc::now()).to_std().unwrap_or_default();
        if remaining.is_zero() {
            return;
        }
        tokio::time::sleep(remaining.min(Duration::from_secs(30))).await;
    }
}

fn to_delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

fn labels(cron: &CronJob) -> [(&'static str, &str); 2] {
    [("cron", cron.name.as_str()), ("role", cron.role.name())]
}

fn outcome_labels<'a>(cron: &'a CronJob, outcome: &'a str) -> [(&'static str, &'a str); 3] {
    [
        ("cron", cron.name.as_str()),
        ("role", cron.role.name()),
        ("outcome", outcome),
    ]
}
