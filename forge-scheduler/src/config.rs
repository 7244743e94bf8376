//! The scheduler's sections of `forge.toml`: `[cron]` and `[jobs]`.

use std::collections::BTreeMap;
use std::time::Duration;

use forge_core::config::{ConfigSource, duration};
use forge_core::{Error, Result};
use forge_rules::{Name, check_name, format_duration};

use crate::limits::{QueueLimits, Rate};
use serde::{Deserialize, Serialize};

/// `[cron]`: how leader-only schedules behave around failovers, and how long the tick ledger
/// keeps its rows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct CronConfig {
    /// A tick that is at most this late still fires under `catch_up = "skip"` (a tick due
    /// during a fast failover is late, not missed). Late by the database's clock, which
    /// decides when a tick is due: a forward step of it longer than this during a tenure hands
    /// the ticks it stepped over to the catch-up policy.
    #[serde(with = "duration")]
    pub misfire_threshold: Duration,
    /// How long before its instant the leader claims a scheduled tick, so that the claim's
    /// durable commit is done when the tick is due and the handler starts within about a
    /// millisecond. A leader that dies in that window leaves a claimed, never-started tick:
    /// a next leader that leads by the instant claims it again and runs it on time; one that
    /// takes over after the instant cannot tell it from a run cut short and applies the cron's
    /// `interrupted` policy. `"0s"` claims at the instant.
    #[serde(with = "duration")]
    pub claim_ahead: Duration,
    /// How long the tick ledger (`forge.cron_ticks`) keeps finished ticks; the `log_compactor`
    /// leader prunes older ones. The newest tick of every cron is always kept: it is where a new
    /// leader resumes.
    #[serde(with = "duration")]
    pub ledger_retention: Duration,
}

impl Default for CronConfig {
    fn default() -> Self {
        CronConfig {
            misfire_threshold: Duration::from_secs(1),
            claim_ahead: Duration::from_millis(50),
            ledger_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl CronConfig {
    /// Checks the section's values.
    pub fn validate(&self, at: &ConfigSource<'_>) -> Result<()> {
        at.check_duration(
            "cron.misfire_threshold",
            self.misfire_threshold,
            Duration::ZERO,
        )?;
        at.check_duration("cron.claim_ahead", self.claim_ahead, Duration::ZERO)?;
        if self.claim_ahead > Duration::from_secs(10) {
            return Err(at.error(
                "cron.claim_ahead",
                format!(
                    "{} is more than 10s: a leader that dies in that window before an instant leaves its tick to the `interrupted` policy; use a few tens of milliseconds",
                    format_duration(self.claim_ahead)
                ),
            ));
        }
        at.check_duration(
            "cron.ledger_retention",
            self.ledger_retention,
            Duration::from_secs(60),
        )
    }
}

/// `[jobs]`: the durable job queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct JobsConfig {
    /// How many jobs of one queue run at once on this node, for a queue `queues` does not
    /// tune. Also a role's jobs, on the role's leader.
    pub default_concurrency: u32,
    /// Per-queue tuning: a queue's concurrency on this node (`mailers = 4`, or
    /// `[jobs.queues.mailers] concurrency = 4`), and its cluster-wide limits
    /// (`global_concurrency`, `rate`, `rate_key`: see [`QueueConfig`]). Tuning only: which
    /// queues a node works is `[node] queues` (unset: the queues its job types declare, and the
    /// ones tuned here).
    pub queues: BTreeMap<String, QueueConfig>,
    /// Per job kind: its cluster-wide limits (`[jobs.kinds.send_email]` with
    /// `global_concurrency`, `rate`, `rate_key`: see [`KindConfig`]), in place of the ones its
    /// type declares in code.
    pub kinds: BTreeMap<String, KindConfig>,
    /// Attempts of a job whose declaration does not say `max_attempts`.
    pub default_max_attempts: u32,
    /// How often the Scheduler leader rescues and dead-letters jobs of departed nodes and
    /// ended role tenures (scheduled jobs are promoted on time by a timer, not by this pass;
    /// jobs of a node marked down are rescued at once). Finished jobs are pruned by the
    /// `log_compactor` leader, every `[cluster] compaction_interval`.
    #[serde(with = "duration")]
    pub maintenance_interval: Duration,
    /// How long completed and cancelled jobs are kept before pruning. `0s` deletes a completed
    /// job in the statement that records its completion (as graphile_worker does), instead of
    /// keeping a `completed` row (in `forge.jobs_done`) until the next prune: a completed job
    /// can then no longer be looked up, listed or retried. Cancelled jobs are then pruned at the
    /// next compaction pass.
    #[serde(with = "duration")]
    pub completed_retention: Duration,
    /// How long dead-lettered jobs are kept before pruning.
    #[serde(with = "duration")]
    pub dead_retention: Duration,
    /// On graceful shutdown, how long running jobs may take to finish before they are
    /// cancelled and released for another node (the interrupted attempt does not count
    /// against `max_attempts`).
    #[serde(with = "duration")]
    pub drain_timeout: Duration,
    /// How many times a job may snooze (`JobError::snooze`) before the next snooze
    /// dead-letters it, for a job type that does not declare `max_snoozes`.
    pub max_snoozes: u32,
    /// The largest output a job may store (its JSON text, in bytes): a handler's return value
    /// or `JobContext::set_output`. A larger output fails the attempt with an error that says
    /// so; it is never truncated.
    pub max_output_bytes: u64,
}

impl Default for JobsConfig {
    fn default() -> Self {
        JobsConfig {
            default_concurrency: 16,
            queues: BTreeMap::new(),
            kinds: BTreeMap::new(),
            default_max_attempts: 20,
            maintenance_interval: Duration::from_secs(15),
            completed_retention: Duration::from_secs(24 * 3600),
            dead_retention: Duration::from_secs(7 * 24 * 3600),
            drain_timeout: Duration::from_secs(30),
            max_snoozes: 100,
            max_output_bytes: 1024 * 1024,
        }
    }
}

impl JobsConfig {
    /// Whether a completed job keeps its row (as `completed`, until pruned): all but
    /// `completed_retention = "0s"`, which deletes it at completion.
    pub fn keeps_completed(&self) -> bool {
        !self.completed_retention.is_zero()
    }

    /// How many jobs of `queue` run at once on this node: its `queues` entry, else
    /// `default_concurrency`.
    pub fn concurrency(&self, queue: &str) -> u32 {
        self.queues
            .get(queue)
            .and_then(|q| q.concurrency)
            .unwrap_or(self.default_concurrency)
    }

    /// The cluster-wide limits forge.toml gives `queue` (none when it gives none).
    pub fn limits(&self, queue: &str) -> QueueLimits {
        self.queues
            .get(queue)
            .map(|q| q.limits.clone())
            .unwrap_or_default()
    }

    /// Checks the section's values.
    pub fn validate(&self, at: &ConfigSource<'_>) -> Result<()> {
        check_concurrency(at, "jobs.default_concurrency", self.default_concurrency)?;
        for (queue, tuning) in &self.queues {
            let key = format!("jobs.queues.{queue}");
            check_name(Name::Queue, queue).map_err(|err| at.error(&key, err.to_string()))?;
            if let Some(concurrency) = tuning.concurrency {
                let key = match tuning.short {
                    true => key.clone(),
                    false => format!("{key}.concurrency"),
                };
                check_concurrency(at, &key, concurrency)?;
            }
            if let Some((field, message)) = tuning.limits.problem() {
                return Err(at.error(&format!("{key}.{field}"), message));
            }
        }
        for (kind, tuning) in &self.kinds {
            let key = format!("jobs.kinds.{kind}");
            check_name(Name::JobKind, kind).map_err(|err| at.error(&key, err.to_string()))?;
            if let Some((field, message)) = tuning.limits().problem() {
                return Err(at.error(&format!("{key}.{field}"), message));
            }
        }
        if self.default_max_attempts == 0 {
            return Err(at.error("jobs.default_max_attempts", "must be at least 1".into()));
        }
        at.check_duration(
            "jobs.maintenance_interval",
            self.maintenance_interval,
            Duration::from_millis(100),
        )?;
        for (key, value) in [
            ("jobs.completed_retention", self.completed_retention),
            ("jobs.dead_retention", self.dead_retention),
            ("jobs.drain_timeout", self.drain_timeout),
        ] {
            at.check_duration(key, value, Duration::ZERO)?;
        }
        if self.max_output_bytes == 0 {
            return Err(at.error(
                "jobs.max_output_bytes",
                "must be at least 1 (a job without an output stores nothing either way)".into(),
            ));
        }
        Ok(())
    }
}

/// One queue's `[jobs.queues]` entry: `mailers = 4` (its concurrency on this node), or a table
/// `[jobs.queues.mailers]` with `concurrency`, `global_concurrency`, `rate` (`"100/1m"`) and
/// `rate_key`. The limits are the cluster's: each node writes forge.toml's to the database at
/// start (`forge.queue_limits`), where an operator's values win over them until reset.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct QueueConfig {
    /// Jobs of the queue running at once on this node (unset: `default_concurrency`).
    pub concurrency: Option<u32>,
    /// The queue's cluster-wide limits.
    pub limits: QueueLimits,
    /// Written in the short form (`mailers = 4`): its errors name the queue's key.
    short: bool,
}

/// The short form when it says all (`mailers = 4`), else the table.
impl Serialize for QueueConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        if let (Some(n), true) = (self.concurrency, self.limits.is_empty()) {
            return s.serialize_u32(n);
        }
        let mut map = s.serialize_map(None)?;
        if let Some(n) = self.concurrency {
            map.serialize_entry("concurrency", &n)?;
        }
        if let Some(n) = self.limits.global_concurrency {
            map.serialize_entry("global_concurrency", &n)?;
        }
        if let Some(rate) = &self.limits.rate {
            map.serialize_entry("rate", rate)?;
        }
        if let Some(key) = &self.limits.rate_key {
            map.serialize_entry("rate_key", key)?;
        }
        map.end()
    }
}

impl From<u32> for QueueConfig {
    fn from(concurrency: u32) -> QueueConfig {
        QueueConfig {
            concurrency: Some(concurrency),
            limits: QueueLimits::default(),
            short: true,
        }
    }
}

impl QueueConfig {
    /// A queue's tuning from its parts.
    pub fn new(concurrency: Option<u32>, limits: QueueLimits) -> QueueConfig {
        QueueConfig {
            concurrency,
            limits,
            short: false,
        }
    }
}

impl<'de> Deserialize<'de> for QueueConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        /// The table form.
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Table {
            concurrency: Option<u32>,
            global_concurrency: Option<u32>,
            rate: Option<Rate>,
            rate_key: Option<String>,
        }
        /// Either form.
        struct Form;
        impl<'de> serde::de::Visitor<'de> for Form {
            type Value = QueueConfig;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a concurrency (mailers = 4) or a table ([jobs.queues.mailers] with concurrency, global_concurrency, rate, rate_key)")
            }

            fn visit_i64<E: serde::de::Error>(self, n: i64) -> std::result::Result<QueueConfig, E> {
                u32::try_from(n).map(QueueConfig::from).map_err(|_| {
                    E::custom(format!("concurrency {n} is out of range: use 1 to 10000"))
                })
            }

            fn visit_u64<E: serde::de::Error>(self, n: u64) -> std::result::Result<QueueConfig, E> {
                self.visit_i64(i64::try_from(n).unwrap_or(-1))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<QueueConfig, A::Error> {
                let t = Table::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(QueueConfig::new(
                    t.concurrency,
                    QueueLimits {
                        global_concurrency: t.global_concurrency,
                        rate: t.rate,
                        rate_key: t.rate_key,
                    },
                ))
            }
        }
        d.deserialize_any(Form)
    }
}

/// One job kind's `[jobs.kinds.<kind>]` entry: its cluster-wide limits, `global_concurrency`,
/// `rate` (`"100/1m"`) and `rate_key`, which replace all of those its type declares in code
/// (`#[job(global_concurrency = ..)]`; an entry without keys removes them). Each node writes
/// them to the database at start for the kinds it registers (`forge.kind_limits`), where an
/// operator's values win over them until reset. A kind that runs on a role's leader takes no
/// limits: an entry for it stops the node's start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct KindConfig {
    /// At most this many of the kind's jobs run at once on all nodes together.
    pub global_concurrency: Option<u32>,
    /// At most so many claims of the kind's jobs in any window.
    pub rate: Option<Rate>,
    /// The rate holds per value of this top-level field of the jobs' arguments.
    pub rate_key: Option<String>,
}

impl From<QueueLimits> for KindConfig {
    fn from(limits: QueueLimits) -> KindConfig {
        KindConfig {
            global_concurrency: limits.global_concurrency,
            rate: limits.rate,
            rate_key: limits.rate_key,
        }
    }
}

impl KindConfig {
    /// The kind's limits.
    pub fn limits(&self) -> QueueLimits {
        QueueLimits {
            global_concurrency: self.global_concurrency,
            rate: self.rate,
            rate_key: self.rate_key.clone(),
        }
    }
}

/// A concurrency: at least 1, at most 10,000.
fn check_concurrency(at: &ConfigSource<'_>, key: &str, concurrency: u32) -> Result<()> {
    if concurrency == 0 {
        return Err(at.error(
            key,
            "concurrency 0 works nothing: use at least 1 (to keep a node from working a queue, leave it out of [node] queues)".into(),
        ));
    }
    if concurrency > 10_000 {
        return Err(at.error(
            key,
            format!("concurrency {concurrency} is more than 10000 attempts at once on one node: use a smaller number"),
        ));
    }
    Ok(())
}

/// A duration for messages.
pub(crate) fn fmt_duration(d: Duration) -> String {
    format_duration(d)
}

/// A registration error (a cron or job definition FORGE cannot use).
pub(crate) fn invalid(message: String) -> Error {
    Error::Registration { message }
}
