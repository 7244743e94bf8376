//! Crons stored in the database: created, changed and deleted at run time by operators
//! (`Workload::upsert_cron`, the admin API, the CLI), each enqueueing a job at every tick.
//!
//! A stored cron is a row of `forge.crons` with a job (`job_kind`, `job_args`, `options`). The
//! nodes' cron-registry service reads every stored definition into the board (at start, and on
//! each notification on `forge_crons`, which `forge.cron_store` and `forge.cron_unstore` send),
//! and the scheduler's leader keeps one cron loop per stored cron, the same loop as a cron of
//! code's (ledger, claim, catch-up, overlap, interrupted runs): `supervisor/stored.rs` stops the loop
//! of a changed or deleted cron (a run in progress ends first) and starts the new one. The
//! tick's handler enqueues the job in the tick's fenced transaction and completes the tick in
//! it (`clients.rs`, since `cron` does not use `jobs`): a tick enqueues its job exactly once.
//!
//! Names: a cron of code owns its name. Storing a cron under the name of a cron of code the
//! cluster knows is refused; a node whose binary brings a cron of code with the name of a stored
//! cron logs an error, and no leader runs that cron of code while the stored one exists (the
//! stored one runs).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use forge_core::{Error, Result, Role};
use forge_cron::Schedule;
use forge_rules::{Name, check_duration, check_name};
use serde_json::{Value, json};
use tracing::error;

use super::{CatchUp, CronContext, CronError, CronJob, Interrupted, Overlap};

/// A cron stored in the database: a schedule, the job its ticks enqueue (a `#[job]` kind and
/// its JSON arguments), and the same policies as a `#[cron]`'s. It runs on the scheduler's
/// leader. Build one and store it with `Workload::upsert_cron`:
///
/// ```
/// use forge_scheduler::{CatchUp, Schedule, StoredCron};
///
/// let cron = StoredCron::new(
///     "nightly-report",
///     Schedule::parse_in("0 3 * * *", "Europe/Paris").unwrap(),
///     "send_report",
///     serde_json::json!({"to": "ops@example.com"}),
/// )
/// .unwrap()
/// .catch_up(CatchUp::Skip);
/// assert_eq!(cron.kind(), "send_report");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct StoredCron {
    name: String,
    schedule: Schedule,
    kind: String,
    args: Value,
    catch_up: CatchUp,
    catch_up_window: Duration,
    overlap: Option<Overlap>,
    interrupted: Interrupted,
    timeout: Option<Duration>,
}

impl StoredCron {
    /// A stored cron enqueueing a job of `kind` with `args` at each tick of `schedule`, with a
    /// `#[cron]`'s default policies. An invalid cron name or job kind is an
    /// [`Error::InvalidInput`] saying what is valid.
    pub fn new(
        name: impl Into<String>,
        schedule: Schedule,
        kind: impl Into<String>,
        args: Value,
    ) -> Result<StoredCron> {
        let (name, kind) = (name.into(), kind.into());
        check_name(Name::Cron, &name).map_err(|err| invalid(err.to_string()))?;
        check_name(Name::JobKind, &kind).map_err(|err| invalid(err.to_string()))?;
        Ok(StoredCron {
            name,
            schedule,
            kind,
            args,
            catch_up: CatchUp::Latest,
            catch_up_window: CronJob::DEFAULT_CATCH_UP_WINDOW,
            overlap: None,
            interrupted: Interrupted::Rerun,
            timeout: None,
        })
    }

    /// As [`CronJob::catch_up`].
    pub fn catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// As [`CronJob::catch_up_window`].
    pub fn catch_up_window(mut self, window: Duration) -> Self {
        self.catch_up_window = window;
        self
    }

    /// As [`CronJob::overlap`]. A tick's run is the enqueue, so overlap matters only while a
    /// slow enqueue is going.
    pub fn overlap(mut self, overlap: Overlap) -> Self {
        self.overlap = Some(overlap);
        self
    }

    /// As [`CronJob::interrupted`].
    pub fn interrupted(mut self, interrupted: Interrupted) -> Self {
        self.interrupted = interrupted;
        self
    }

    /// As [`CronJob::timeout`]: bounds the enqueue of a tick.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The kind of the job each tick enqueues.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The job's arguments.
    pub fn args(&self) -> &Value {
        &self.args
    }

    /// Its policies as stored in `forge.crons.options`.
    pub(crate) fn options(&self) -> Value {
        let ms = |d: Duration| d.as_millis().min(i64::MAX as u128) as i64;
        json!({
            "catch_up": self.catch_up.as_str(),
            "catch_up_window_ms": ms(self.catch_up_window),
            "overlap": self.overlap.map(Overlap::as_str),
            "interrupted": self.interrupted.as_str(),
            "timeout_ms": self.timeout.map(ms),
        })
    }

    /// Checks what [`StoredCron::new`] cannot: the durations.
    pub(crate) fn validate(&self) -> Result<()> {
        for (what, value) in [
            ("catch_up_window", Some(self.catch_up_window)),
            ("timeout", self.timeout),
        ] {
            if let Some(value) = value {
                check_duration(value).map_err(|message| {
                    invalid(format!("cron `{}`: {what} {message}", self.name))
                })?;
            }
        }
        if self.timeout == Some(Duration::ZERO) {
            return Err(invalid(format!(
                "cron `{}`: a timeout must be longer than zero",
                self.name
            )));
        }
        Ok(())
    }

    /// Reads a stored row back (`expression`, `timezone`, `job_kind`, `job_args`, `options`).
    pub(crate) fn from_stored(
        name: String,
        expression: &str,
        timezone: &str,
        kind: String,
        args: Value,
        options: &Value,
    ) -> std::result::Result<StoredCron, String> {
        let schedule = Schedule::parse_in(expression, timezone).map_err(|err| err.to_string())?;
        let word = |key: &str| options.get(key).and_then(Value::as_str);
        let ms = |key: &str| {
            options
                .get(key)
                .and_then(Value::as_u64)
                .map(Duration::from_millis)
        };
        let bad = |key: &str| format!("options.{key} is not valid: {options}");
        let cron = StoredCron {
            catch_up: CatchUp::parse(word("catch_up").unwrap_or("latest"))
                .ok_or_else(|| bad("catch_up"))?,
            catch_up_window: ms("catch_up_window_ms").unwrap_or(CronJob::DEFAULT_CATCH_UP_WINDOW),
            overlap: match word("overlap") {
                None => None,
                Some(word) => Some(Overlap::parse(word).ok_or_else(|| bad("overlap"))?),
            },
            interrupted: Interrupted::parse(word("interrupted").unwrap_or("rerun"))
                .ok_or_else(|| bad("interrupted"))?,
            timeout: ms("timeout_ms"),
            ..StoredCron::new(name, schedule, kind, args).map_err(|err| err.to_string())?
        };
        Ok(cron)
    }

    /// The cron loop's definition: this schedule and these policies on the scheduler's role,
    /// with a handler that enqueues the job through `enqueue`.
    pub(super) fn cron_job(&self, enqueue: &EnqueueTick) -> CronJob {
        let (enqueue, kind, args) = (enqueue.clone(), self.kind.clone(), self.args.clone());
        let mut job = CronJob::new(self.name.clone(), self.schedule.clone(), move |ctx| {
            enqueue(ctx, kind.clone(), args.clone())
        })
        .role(Role::SCHEDULER)
        .catch_up(self.catch_up)
        .catch_up_window(self.catch_up_window)
        .interrupted(self.interrupted);
        job.overlap = self.overlap;
        job.timeout = self.timeout;
        job
    }
}

/// A stored cron as an operator writes it (the admin API's `PUT /api/crons/{name}` body, the
/// CLI's `forge crons add` options): words and human durations, checked by
/// [`StoredCronSpec::into_cron`], which says what is wrong.
///
/// ```
/// use forge_scheduler::cron::StoredCronSpec;
///
/// let spec: StoredCronSpec = serde_json::from_value(serde_json::json!({
///     "expression": "*/5 * * * *",
///     "kind": "send_report",
///     "args": {"to": "ops@example.com"},
///     "catch_up": "skip",
/// })).unwrap();
/// let cron = spec.into_cron("reports").unwrap();
/// assert_eq!(cron.schedule().expression(), "*/5 * * * *");
/// ```
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredCronSpec {
    /// The cron expression (5 or 6 fields, or an `@` alias).
    pub expression: String,
    /// An IANA time zone; default UTC.
    #[serde(default)]
    pub timezone: Option<String>,
    /// The kind of the job each tick enqueues.
    pub kind: String,
    /// The job's arguments (JSON); default `null`.
    #[serde(default)]
    pub args: Value,
    /// `"skip"`, `"latest"` (default) or `"all"`.
    #[serde(default)]
    pub catch_up: Option<String>,
    /// A duration such as `"1h"`; default 24 h.
    #[serde(default)]
    pub catch_up_window: Option<String>,
    /// `"skip"`, `"wait"` or `"allow"`; default per the catch-up policy.
    #[serde(default)]
    pub overlap: Option<String>,
    /// `"rerun"` (default) or `"abandon"`.
    #[serde(default)]
    pub interrupted: Option<String>,
    /// A duration such as `"30s"`; default none.
    #[serde(default)]
    pub timeout: Option<String>,
}

impl StoredCronSpec {
    /// The stored cron named `name`, or an [`Error::InvalidInput`] naming the field that is
    /// wrong and what is valid.
    pub fn into_cron(self, name: &str) -> Result<StoredCron> {
        let zone = self.timezone.as_deref().unwrap_or("UTC");
        let schedule = Schedule::parse_in(&self.expression, zone)
            .map_err(|err| invalid(format!("cron `{name}`: {err}")))?;
        let mut cron = StoredCron::new(name, schedule, self.kind, self.args)?;
        fn word<T>(
            field: &str,
            text: Option<&str>,
            parse: fn(&str) -> Option<T>,
            valid: &str,
        ) -> Result<Option<T>> {
            text.map(|t| {
                parse(t)
                    .ok_or_else(|| invalid(format!("{field} must be one of {valid}, not {t:?}")))
            })
            .transpose()
        }
        fn duration(field: &str, text: Option<&str>) -> Result<Option<Duration>> {
            text.map(|t| {
                forge_rules::parse_duration(t)
                    .map_err(|message| invalid(format!("{field}: {message}")))
            })
            .transpose()
        }
        if let Some(c) = word(
            "catch_up",
            self.catch_up.as_deref(),
            CatchUp::parse,
            "skip, latest, all",
        )? {
            cron = cron.catch_up(c);
        }
        if let Some(o) = word(
            "overlap",
            self.overlap.as_deref(),
            Overlap::parse,
            "skip, wait, allow",
        )? {
            cron = cron.overlap(o);
        }
        if let Some(i) = word(
            "interrupted",
            self.interrupted.as_deref(),
            Interrupted::parse,
            "rerun, abandon",
        )? {
            cron = cron.interrupted(i);
        }
        if let Some(w) = duration("catch_up_window", self.catch_up_window.as_deref())? {
            cron = cron.catch_up_window(w);
        }
        if let Some(t) = duration("timeout", self.timeout.as_deref())? {
            cron = cron.timeout(t);
        }
        cron.validate()?;
        Ok(cron)
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidInput { message }
}

impl CatchUp {
    /// The policy named by its word (`"skip"`, `"latest"`, `"all"`), as `#[cron]` writes it.
    pub fn parse(word: &str) -> Option<CatchUp> {
        [CatchUp::Skip, CatchUp::Latest, CatchUp::All]
            .into_iter()
            .find(|c| c.as_str() == word)
    }
}

impl Overlap {
    /// The word `#[cron]` writes for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Wait => "wait",
            Overlap::Allow => "allow",
        }
    }

    /// The policy named by its word (`"skip"`, `"wait"`, `"allow"`).
    pub fn parse(word: &str) -> Option<Overlap> {
        [Overlap::Skip, Overlap::Wait, Overlap::Allow]
            .into_iter()
            .find(|o| o.as_str() == word)
    }
}

impl Interrupted {
    /// The word `#[cron]` writes for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Interrupted::Rerun => "rerun",
            Interrupted::Abandon => "abandon",
        }
    }

    /// The policy named by its word (`"rerun"`, `"abandon"`).
    pub fn parse(word: &str) -> Option<Interrupted> {
        [Interrupted::Rerun, Interrupted::Abandon]
            .into_iter()
            .find(|i| i.as_str() == word)
    }
}

/// A stored cron's tick: enqueue a job of this kind with these arguments, in the tick's fenced
/// transaction, and complete the tick in it (given by `clients.rs`, which knows the jobs).
pub(crate) type EnqueueTick = Arc<
    dyn Fn(
            CronContext,
            String,
            Value,
        ) -> Pin<Box<dyn Future<Output = Result<(), CronError>> + Send>>
        + Send
        + Sync,
>;

/// Reports the crons of code of this binary that carry the name of a stored cron: they do not
/// run while the stored cron exists.
pub(super) fn report_shadowed(names: &[String]) {
    for name in names {
        error!(target: "forge::cron", cron = %name,
               "this binary defines a cron of code named like a cron stored in the database: the stored cron runs and this one does not; delete the stored cron (`forge crons delete {name}`) or rename the cron of code");
    }
}

/// When a stored cron's loop starts: from its newest claimed tick, but never before its
/// definition was stored (ticks of a new schedule due before the change are not caught up).
pub(super) fn stored_from(
    frontier: Option<DateTime<Utc>>,
    stored_at: DateTime<Utc>,
) -> DateTime<Utc> {
    frontier.map_or(stored_at, |f| f.max(stored_at))
}
