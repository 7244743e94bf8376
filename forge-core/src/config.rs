//! `forge.toml`: typed configuration with human durations, environment overrides for what
//! differs per node, and errors that name the file, the key and the line.
//!
//! Every key, with its default, is documented in the workspace's `forge.toml`, which a test
//! parses and compares with [`Config::default`], so the reference cannot drift from the code.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::role::{LockNamespace, NodeId, Role, validate_name};

/// The whole configuration of a node.
///
/// Build it from a file with [`Config::load`], from text with [`Config::from_toml`], or start
/// from [`Config::default`] and set fields in code.
///
/// ```
/// use forge_core::Config;
///
/// let config = Config::from_toml(
///     r#"
///     [database]
///     url = "postgres://app@localhost/app"
///
///     [cluster.leader_election]
///     lease_duration = "10s"
///     refresh_interval = "2s"
///     "#,
/// )
/// .unwrap();
/// assert_eq!(config.cluster.leader_election.lease_duration.as_secs(), 10);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// `[database]`
    pub database: DatabaseConfig,
    /// `[node]`
    pub node: NodeConfig,
    /// `[cluster]`
    pub cluster: ClusterConfig,
    /// `[metrics]`
    pub metrics: MetricsConfig,
    /// `[cron]`
    pub cron: CronConfig,
    /// `[jobs]`
    pub jobs: JobsConfig,
}

/// `[database]`: where PostgreSQL is and how FORGE uses it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DatabaseConfig {
    /// `postgres://user:password@host:port/database`. Overridden by `DATABASE_URL`. Required.
    pub url: Option<String>,
    /// Size of the node's connection pool (fenced writes, job claims, your own queries). The
    /// node also opens one dedicated connection per campaigned role and one for LISTEN.
    pub max_connections: u32,
    /// How long `Node::start` keeps trying to reach PostgreSQL before giving up.
    #[serde(with = "human_duration")]
    pub connect_timeout: Duration,
    /// Apply FORGE's migrations (schema `forge`) on start. Several nodes starting at once
    /// serialize on a lock, so this is safe to leave on.
    pub migrate: bool,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            url: None,
            max_connections: 10,
            connect_timeout: Duration::from_secs(10),
            migrate: true,
        }
    }
}

/// `[node]`: this node's identity and which roles it may lead.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct NodeConfig {
    /// The node's id in the cluster. Overridden by `FORGE_NODE_ID`; when neither is set,
    /// `$HOSTNAME`, else a generated `node-xxxxxxxx`.
    pub id: Option<String>,
    /// The roles this node campaigns for. Overridden by `FORGE_ROLES` (comma-separated). A node
    /// campaigns for a listed role only when it has work registered for it, unless
    /// `campaign_without_work` is set.
    pub roles: Vec<String>,
    /// Campaign for listed roles even when this binary registered no work for them.
    pub campaign_without_work: bool,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            id: None,
            roles: Role::BUILTIN
                .iter()
                .map(|role| role.name().to_owned())
                .collect(),
            campaign_without_work: false,
        }
    }
}

/// `[cluster]`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ClusterConfig {
    /// Keeps FORGE's advisory-lock keys apart from other applications and other FORGE clusters
    /// in the same database. With the default `forge`, the built-in roles use the keys
    /// `0x464F524745_0001..3`.
    pub lock_namespace: String,
    /// `[cluster.leader_election]`
    pub leader_election: LeaderElectionConfig,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            lock_namespace: LockNamespace::default().name().to_owned(),
            leader_election: LeaderElectionConfig::default(),
        }
    }
}

/// `[cluster.leader_election]`: the timing of elections, leases and handoffs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct LeaderElectionConfig {
    /// How often a node whose lock session is down (PostgreSQL unreachable or restarting)
    /// retries: the cap of its reconnect backoff. Followers whose session is up need no
    /// polling: they wait inside PostgreSQL, and the lock grant is the notification.
    #[serde(with = "human_duration")]
    pub check_interval: Duration,
    /// How long a leadership lasts without renewal. PostgreSQL ends a lock session that stays
    /// silent this long (`idle_session_timeout`), so a frozen or cut-off leader is replaced
    /// after about this time; the leader itself stops trusting its leadership a safety margin
    /// earlier.
    #[serde(with = "human_duration")]
    pub lease_duration: Duration,
    /// How often the leader renews its lease. At most half of `lease_duration`.
    #[serde(with = "human_duration")]
    pub refresh_interval: Duration,
    /// The longest a follower waits inside `pg_advisory_lock` before the wait returns to prove
    /// its session alive and to check the leader's lease (one statement per wait). Also
    /// bounds every other lock wait of FORGE's sessions.
    #[serde(with = "human_duration")]
    pub lock_timeout: Duration,
    /// On graceful shutdown, how long the leader lets in-flight leader-only work finish
    /// before cancelling it and handing over.
    #[serde(with = "human_duration")]
    pub drain_timeout: Duration,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        LeaderElectionConfig {
            check_interval: Duration::from_secs(5),
            lease_duration: Duration::from_secs(15),
            refresh_interval: Duration::from_secs(5),
            lock_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(10),
        }
    }
}

impl LeaderElectionConfig {
    /// How much earlier than the server-side lease end the leader stops trusting its leadership:
    /// a tenth of the lease, between 100 ms and 1 s. It absorbs the time between a leader's
    /// validity check and its action.
    pub fn safety_margin(&self) -> Duration {
        (self.lease_duration / 10).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct MetricsConfig {
    /// Address of the Prometheus scrape endpoint (`GET /metrics`), such as `0.0.0.0:9464`.
    /// Overridden by `FORGE_METRICS_LISTEN` (`off` disables). Unset: no HTTP listener; the
    /// text stays available through `Node::render_metrics`.
    pub listen: Option<SocketAddr>,
}

/// `[cron]`: how leader-only schedules behave around failovers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct CronConfig {
    /// A tick that is at most this late still fires under `catch_up = "skip"` (a tick due
    /// during a fast failover is late, not missed).
    #[serde(with = "human_duration")]
    pub misfire_threshold: Duration,
    /// How long the tick ledger (`forge.cron_ticks`) keeps finished ticks; the LogCompactor
    /// leader prunes older ones.
    #[serde(with = "human_duration")]
    pub ledger_retention: Duration,
}

impl Default for CronConfig {
    fn default() -> Self {
        CronConfig {
            misfire_threshold: Duration::from_secs(1),
            ledger_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// `[jobs]`: the durable job queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct JobsConfig {
    /// The queues this node works, with their concurrency (jobs running at once on this
    /// node). Queues not listed are not worked here.
    pub queues: std::collections::BTreeMap<String, u32>,
    /// Attempts of a job whose declaration does not say `max_attempts`.
    pub default_max_attempts: u32,
    /// How often each node records that it is alive (`forge.nodes`).
    #[serde(with = "human_duration")]
    pub heartbeat_interval: Duration,
    /// A running job whose node has not heartbeated for this long is rescued (retried or
    /// dead-lettered). Jobs of a node whose sessions are gone (killed) are rescued at the next
    /// maintenance pass, without waiting this long. Must be longer than `heartbeat_interval`
    /// (checked when a node with jobs starts).
    #[serde(with = "human_duration")]
    pub rescue_after: Duration,
    /// How often the Scheduler leader rescues, dead-letters and prunes (scheduled jobs are
    /// promoted on time by a timer, not by this pass).
    #[serde(with = "human_duration")]
    pub maintenance_interval: Duration,
    /// How long completed and cancelled jobs are kept before pruning.
    #[serde(with = "human_duration")]
    pub completed_retention: Duration,
    /// How long dead-lettered jobs are kept before pruning.
    #[serde(with = "human_duration")]
    pub dead_retention: Duration,
    /// On graceful shutdown, how long running jobs may take to finish before they are
    /// cancelled and released for another node (the interrupted attempt does not count
    /// against `max_attempts`).
    #[serde(with = "human_duration")]
    pub drain_timeout: Duration,
}

impl Default for JobsConfig {
    fn default() -> Self {
        JobsConfig {
            queues: [("default".to_owned(), 16)].into_iter().collect(),
            default_max_attempts: 20,
            heartbeat_interval: Duration::from_secs(30),
            rescue_after: Duration::from_secs(120),
            maintenance_interval: Duration::from_secs(15),
            completed_retention: Duration::from_secs(24 * 3600),
            dead_retention: Duration::from_secs(7 * 24 * 3600),
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// Environment variables FORGE reads, as a function so tests need not mutate the process
/// environment.
pub trait Env {
    /// The value of a variable, `None` when unset.
    fn var(&self, name: &str) -> Option<String>;
}

/// The real process environment.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl<F: Fn(&str) -> Option<String>> Env for F {
    fn var(&self, name: &str) -> Option<String> {
        self(name)
    }
}

/// No environment at all (for tests and for configs built purely in code).
pub fn no_env(_: &str) -> Option<String> {
    None
}

impl Config {
    /// Reads `path`, applies the environment overrides (`DATABASE_URL`, `FORGE_NODE_ID`,
    /// `HOSTNAME`, `FORGE_ROLES`, `FORGE_METRICS_LISTEN`) and validates.
    pub fn load(path: impl AsRef<Path>) -> Result<Config> {
        Config::load_with_env(path, &ProcessEnv)
    }

    /// [`Config::load`] with an explicit environment.
    pub fn load_with_env(path: impl AsRef<Path>, env: &dyn Env) -> Result<Config> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::ConfigRead {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text, Some(path), env)
    }

    /// Parses TOML text without consulting the environment, and validates.
    pub fn from_toml(text: &str) -> Result<Config> {
        Config::parse(text, None, &no_env)
    }

    /// Only the environment (no file): `DATABASE_URL` and the other overrides on top of the
    /// defaults.
    pub fn from_env() -> Result<Config> {
        Config::parse("", None, &ProcessEnv)
    }

    /// Parses TOML text, applies overrides from `env`, and validates. `path` is only used in
    /// error messages.
    pub fn parse(text: &str, path: Option<&Path>, env: &dyn Env) -> Result<Config> {
        let located = Located { text, path };
        let mut config: Config = toml::from_str(text).map_err(|err| located.toml_error(&err))?;
        config.apply_env(env)?;
        config.validate_located(&located)?;
        Ok(config)
    }

    fn apply_env(&mut self, env: &dyn Env) -> Result<()> {
        if let Some(url) = env.var("DATABASE_URL").filter(|v| !v.is_empty()) {
            self.database.url = Some(url);
        }
        if let Some(id) = env.var("FORGE_NODE_ID").filter(|v| !v.is_empty()) {
            self.node.id = Some(id);
        } else if self.node.id.is_none()
            && let Some(host) = env.var("HOSTNAME").filter(|v| !v.is_empty())
        {
            self.node.id = Some(host);
        }
        if let Some(roles) = env.var("FORGE_ROLES") {
            self.node.roles = roles
                .split(',')
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .map(str::to_owned)
                .collect();
        }
        if let Some(listen) = env.var("FORGE_METRICS_LISTEN") {
            let listen = listen.trim();
            self.metrics.listen = if listen.is_empty() || listen == "off" {
                None
            } else {
                Some(listen.parse().map_err(|_| Error::Config {
                    path: None,
                    line: None,
                    key: "FORGE_METRICS_LISTEN".into(),
                    message: format!(
                        "{listen:?} is not a socket address: use host:port such as 0.0.0.0:9464, or `off`"
                    ),
                })?)
            };
        }
        Ok(())
    }

    /// Checks values and combinations (a config built in code should be validated too;
    /// `Node::start` does it).
    pub fn validate(&self) -> Result<()> {
        self.validate_located(&Located {
            text: "",
            path: None,
        })
    }

    fn validate_located(&self, at: &Located<'_>) -> Result<()> {
        let le = &self.cluster.leader_election;
        let election = "cluster.leader_election";
        for (name, value) in [
            ("check_interval", le.check_interval),
            ("lease_duration", le.lease_duration),
            ("refresh_interval", le.refresh_interval),
            ("lock_timeout", le.lock_timeout),
        ] {
            if value < Duration::from_millis(100) {
                return Err(at.error(
                    &format!("{election}.{name}"),
                    format!("{} is too short: use at least 100ms", fmt_duration(value)),
                ));
            }
        }
        if le.lease_duration < Duration::from_secs(1) {
            return Err(at.error(
                &format!("{election}.lease_duration"),
                format!(
                    "{} is too short: use at least 1s (PostgreSQL enforces it with idle_session_timeout)",
                    fmt_duration(le.lease_duration)
                ),
            ));
        }
        if le.refresh_interval * 2 > le.lease_duration {
            return Err(at.error(
                &format!("{election}.refresh_interval"),
                format!(
                    "refresh_interval ({}) must be at most half of lease_duration ({}), so that one slow renewal does not drop leadership",
                    fmt_duration(le.refresh_interval),
                    fmt_duration(le.lease_duration)
                ),
            ));
        }
        if self.database.max_connections == 0 {
            return Err(at.error("database.max_connections", "must be at least 1".into()));
        }
        if let Some(url) = &self.database.url
            && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            return Err(at.error(
                "database.url",
                format!(
                    "{:?} is not a PostgreSQL URL: use postgres://user:password@host:port/database",
                    crate::error::redact_url(url)
                ),
            ));
        }
        if let Some(id) = &self.node.id {
            NodeId::new(id).map_err(|message| at.error("node.id", message))?;
        }
        for role in &self.node.roles {
            validate_name(role).map_err(|message| at.error("node.roles", message))?;
        }
        LockNamespace::new(&self.cluster.lock_namespace)
            .map_err(|message| at.error("cluster.lock_namespace", message))?;
        self.validate_jobs(at)
    }

    fn validate_jobs(&self, at: &Located<'_>) -> Result<()> {
        let jobs = &self.jobs;
        for (queue, concurrency) in &jobs.queues {
            let key = format!("jobs.queues.{queue}");
            validate_queue_name(queue).map_err(|message| at.error(&key, message))?;
            if *concurrency == 0 {
                return Err(at.error(
                    &key,
                    "concurrency 0 works nothing: use at least 1, or remove the queue so this node does not work it".into(),
                ));
            }
        }
        if jobs.default_max_attempts == 0 {
            return Err(at.error("jobs.default_max_attempts", "must be at least 1".into()));
        }
        for (key, value) in [
            ("jobs.heartbeat_interval", jobs.heartbeat_interval),
            ("jobs.maintenance_interval", jobs.maintenance_interval),
            ("jobs.rescue_after", jobs.rescue_after),
        ] {
            if value < Duration::from_millis(100) {
                return Err(at.error(
                    key,
                    format!("{} is too short: use at least 100ms", fmt_duration(value)),
                ));
            }
        }
        if jobs.rescue_after <= jobs.heartbeat_interval {
            return Err(at.error(
                "jobs.rescue_after",
                format!(
                    "rescue_after ({}) must be longer than heartbeat_interval ({}), or live nodes' jobs would be rescued; use at least twice as long",
                    fmt_duration(jobs.rescue_after),
                    fmt_duration(jobs.heartbeat_interval)
                ),
            ));
        }
        Ok(())
    }

    /// The database URL, or an error that says how to provide one.
    pub fn database_url(&self) -> Result<&str> {
        self.database.url.as_deref().ok_or_else(|| Error::Config {
            path: None,
            line: None,
            key: "database.url".into(),
            message: "no database URL: set DATABASE_URL or [database] url in forge.toml (postgres://user:password@host:port/database)".into(),
        })
    }

    /// The roles listed in `[node] roles`, parsed.
    pub fn roles(&self) -> Result<Vec<Role>> {
        self.node.roles.iter().map(|name| Role::new(name)).collect()
    }

    /// The lock namespace, parsed.
    pub fn lock_namespace(&self) -> Result<LockNamespace> {
        LockNamespace::new(&self.cluster.lock_namespace).map_err(|message| Error::Config {
            path: None,
            line: None,
            key: "cluster.lock_namespace".into(),
            message,
        })
    }

    /// The node id: the configured one, else a generated one.
    pub fn node_id(&self) -> Result<NodeId> {
        match &self.node.id {
            Some(id) => NodeId::new(id).map_err(|message| Error::Config {
                path: None,
                line: None,
                key: "node.id".into(),
                message,
            }),
            None => Ok(NodeId::generate()),
        }
    }
}

/// Where a config came from, to turn spans into lines.
struct Located<'a> {
    text: &'a str,
    path: Option<&'a Path>,
}

impl Located<'_> {
    fn line_of(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .bytes()
            .filter(|b| *b == b'\n')
            .count()
            + 1
    }

    /// The line of a dotted key in the text, when the text sets it.
    fn line_of_key(&self, dotted: &str) -> Option<usize> {
        let root = toml::de::DeTable::parse(self.text).ok()?;
        let mut parts = dotted.split('.');
        let mut value = root.get_ref().get(parts.next()?)?;
        for part in parts {
            value = value.get_ref().get(part)?;
        }
        Some(self.line_of(value.span().start))
    }

    fn error(&self, key: &str, message: String) -> Error {
        Error::Config {
            path: self.path.map(Path::to_owned),
            line: self.line_of_key(key),
            key: key.into(),
            message,
        }
    }

    fn toml_error(&self, err: &toml::de::Error) -> Error {
        let line = err.span().map(|span| self.line_of(span.start));
        let message = err.message().trim().to_owned();
        // serde names the offending field in its message; recover the key path from the span.
        let key = err
            .span()
            .and_then(|span| self.key_at(span.start))
            .unwrap_or_else(|| "forge.toml".into());
        let message = if message.starts_with("unknown field") {
            format!("{message} (see the reference forge.toml for every key and its default)")
        } else {
            message
        };
        Error::Config {
            path: self.path.map(Path::to_owned),
            line,
            key,
            message,
        }
    }

    /// The dotted path of the deepest key whose own span, or whose (non-table) value's span,
    /// covers `offset`.
    fn key_at(&self, offset: usize) -> Option<String> {
        fn walk(
            table: &toml::de::DeTable<'_>,
            offset: usize,
            prefix: &str,
            best: &mut Option<String>,
        ) {
            for (key, child) in table.iter() {
                let path = if prefix.is_empty() {
                    key.get_ref().to_string()
                } else {
                    format!("{prefix}.{}", key.get_ref())
                };
                match child.get_ref().as_table() {
                    Some(nested) => {
                        if key.span().contains(&offset) {
                            *best = Some(path.clone());
                        }
                        walk(nested, offset, &path, best);
                    }
                    None => {
                        if key.span().contains(&offset) || child.span().contains(&offset) {
                            *best = Some(path);
                        }
                    }
                }
            }
        }
        let root = toml::de::DeTable::parse(self.text).ok()?;
        let mut best = None;
        walk(root.get_ref(), offset, "", &mut best);
        best
    }
}

fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// The rule for queue names (in `[jobs.queues]` and in job declarations): 1 to 63 ASCII
/// letters, digits, `_`, `-` or `.`.
pub fn validate_queue_name(queue: &str) -> Result<(), String> {
    let ok = !queue.is_empty()
        && queue.len() <= 63
        && queue
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "queue name {queue:?} is not usable: use 1 to 63 ASCII letters, digits, '_', '-' or '.'"
        ))
    }
}

/// Serde adapter for human durations (`"5s"`, `"250ms"`, `"1m 30s"`).
mod human_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::fmt_duration(*value))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected a duration string such as \"5s\", \"250ms\" or \"1m 30s\"",
            )
        })?;
        humantime::parse_duration(&text).map_err(|err| {
            serde::de::Error::custom(format!(
                "invalid duration {text:?} ({err}): use a number with a unit, such as \"5s\", \"250ms\" or \"1m 30s\""
            ))
        })
    }
}

impl fmt::Display for Config {
    /// The configuration as TOML (the database password redacted).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.clone();
        shown.database.url = shown.database.url.as_deref().map(crate::error::redact_url);
        match toml::to_string_pretty(&shown) {
            Ok(text) => f.write_str(&text),
            Err(_) => Err(fmt::Error),
        }
    }
}

/// The path of the reference file inside the workspace (used by tests).
#[doc(hidden)]
pub fn reference_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../forge.toml")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_err(text: &str) -> String {
        Config::parse(text, Some(Path::new("forge.toml")), &no_env)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().unwrap();
        assert_eq!(Config::from_toml("").unwrap(), Config::default());
    }

    #[test]
    fn unknown_keys_name_file_key_and_line() {
        let msg =
            parse_err("[cluster.leader_election]\nlease_duration = \"10s\"\nleese = \"1s\"\n");
        assert!(
            msg.starts_with("forge.toml:3: `cluster.leader_election.leese`"),
            "{msg}"
        );
        assert!(msg.contains("unknown field `leese`"), "{msg}");
        let msg = parse_err("[databse]\nurl = \"postgres://x\"\n");
        assert!(msg.starts_with("forge.toml:1: `databse`"), "{msg}");
    }

    #[test]
    fn bad_durations_say_what_is_valid() {
        let msg = parse_err("[cluster.leader_election]\nlease_duration = \"ten seconds\"\n");
        assert!(
            msg.starts_with("forge.toml:2: `cluster.leader_election.lease_duration`"),
            "{msg}"
        );
        assert!(msg.contains("\"5s\""), "{msg}");
        let msg = parse_err("[cluster.leader_election]\nlock_timeout = 10\n");
        assert!(msg.contains("expected a duration string"), "{msg}");
    }

    #[test]
    fn impossible_combinations_are_rejected_at_the_right_line() {
        let msg = parse_err(
            "[cluster.leader_election]\nlease_duration = \"10s\"\nrefresh_interval = \"10s\"\n",
        );
        assert!(
            msg.starts_with("forge.toml:3: `cluster.leader_election.refresh_interval`"),
            "{msg}"
        );
        assert!(msg.contains("at most half of lease_duration"), "{msg}");
        let msg = parse_err(
            "[cluster.leader_election]\nlease_duration = \"500ms\"\nrefresh_interval = \"100ms\"\n",
        );
        assert!(msg.contains("at least 1s"), "{msg}");
        let msg = parse_err("[database]\nurl = \"mysql://root:pw@x/db\"\n");
        assert!(
            msg.contains("not a PostgreSQL URL") && !msg.contains("pw"),
            "{msg}"
        );
        let msg = parse_err("[node]\nroles = [\"Scheduler\"]\n");
        assert!(msg.starts_with("forge.toml:2: `node.roles`"), "{msg}");
    }

    #[test]
    fn bad_job_settings_name_the_key_and_line() {
        let msg = parse_err("[jobs]\nheartbeat_interval = \"1m\"\nrescue_after = \"30s\"\n");
        assert!(
            msg.starts_with("forge.toml:3: `jobs.rescue_after`"),
            "{msg}"
        );
        let msg = parse_err("[jobs.queues]\ndefault = 0\n");
        assert!(
            msg.starts_with("forge.toml:2: `jobs.queues.default`"),
            "{msg}"
        );
        let msg = parse_err("[jobs.queues]\n\"mail ers\" = 4\n");
        assert!(msg.contains("not usable"), "{msg}");
    }

    #[test]
    fn environment_overrides_the_file() {
        let env = |name: &str| match name {
            "DATABASE_URL" => Some("postgres://env@db/app".to_owned()),
            "HOSTNAME" => Some("pod-7".to_owned()),
            "FORGE_METRICS_LISTEN" => Some("127.0.0.1:9999".to_owned()),
            "FORGE_ROLES" => Some("scheduler, reports".to_owned()),
            _ => None,
        };
        let text = "[database]\nurl = \"postgres://file@db/app\"\n";
        let config = Config::parse(text, None, &env).unwrap();
        assert_eq!(
            config.database.url.as_deref(),
            Some("postgres://env@db/app")
        );
        assert_eq!(config.node.id.as_deref(), Some("pod-7"));
        assert_eq!(
            config.metrics.listen,
            Some("127.0.0.1:9999".parse().unwrap())
        );
        assert_eq!(config.node.roles, ["scheduler", "reports"]);

        let env = |name: &str| match name {
            "FORGE_NODE_ID" => Some("explicit".to_owned()),
            "HOSTNAME" => Some("pod-7".to_owned()),
            "FORGE_METRICS_LISTEN" => Some("off".to_owned()),
            _ => None,
        };
        let config = Config::parse("[metrics]\nlisten = \"0.0.0.0:1\"", None, &env).unwrap();
        assert_eq!(config.node.id.as_deref(), Some("explicit"));
        assert_eq!(config.metrics.listen, None);

        let env = |name: &str| (name == "FORGE_METRICS_LISTEN").then(|| "nope".to_owned());
        let msg = Config::parse("", None, &env).unwrap_err().to_string();
        assert!(
            msg.contains("FORGE_METRICS_LISTEN") && msg.contains("host:port"),
            "{msg}"
        );
    }

    /// The reference forge.toml sets every key to its default, and documents the optional
    /// ones as commented-out lines, each in its own section.
    #[test]
    fn reference_file_documents_every_key_with_its_default() {
        let path = reference_path();
        let text = std::fs::read_to_string(&path).unwrap();
        let parsed = Config::parse(&text, Some(&path), &no_env).unwrap();
        assert_eq!(
            parsed,
            Config::default(),
            "forge.toml values differ from the defaults"
        );

        let mut full = Config::default();
        full.database.url = Some("postgres://x@y/z".into());
        full.node.id = Some("n".into());
        full.metrics.listen = Some("0.0.0.0:1".parse().unwrap());
        let mut keys = Vec::new();
        collect_keys(&toml::Value::try_from(&full).unwrap(), "", &mut keys);
        assert!(keys.len() >= 14, "{keys:?}");
        for (section, key) in keys {
            let documented = section_lines(&text, &section).any(|line| {
                let line = line.trim_start_matches('#').trim_start();
                line.strip_prefix(key.as_str())
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
            });
            assert!(
                documented,
                "forge.toml does not document `{key}` in [{section}]"
            );
        }
    }

    fn collect_keys(value: &toml::Value, section: &str, out: &mut Vec<(String, String)>) {
        if let toml::Value::Table(table) = value {
            for (key, child) in table {
                if child.is_table() {
                    let nested = if section.is_empty() {
                        key.clone()
                    } else {
                        format!("{section}.{key}")
                    };
                    collect_keys(child, &nested, out);
                } else {
                    out.push((section.to_owned(), key.clone()));
                }
            }
        }
    }

    fn section_lines<'a>(text: &'a str, section: &str) -> impl Iterator<Item = &'a str> {
        let header = format!("[{section}]");
        text.lines()
            .skip_while(move |line| line.trim() != header)
            .skip(1)
            .take_while(|line| !line.trim_start().starts_with('['))
    }

    #[test]
    fn missing_database_url_says_how_to_set_it() {
        let msg = Config::default().database_url().unwrap_err().to_string();
        assert!(
            msg.contains("DATABASE_URL") && msg.contains("[database] url"),
            "{msg}"
        );
    }
}
