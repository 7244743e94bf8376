//! The sections of `forge.toml` the core reads, and the machinery every section uses: human
//! durations, environment overrides, and errors that name the file, the key and the line.
//!
//! The whole file is one type, `forge::Config`, in the facade crate: it is made of these
//! sections and of the scheduler's (`[cron]`, `[jobs]`). Each section validates itself against a
//! [`ConfigSource`], so an error points at the line that set the offending key.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use forge_rules::{Name, check_name};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::role::{LockNamespace, NodeId, Role};

/// The core's part of the configuration: what a node needs to connect, campaign and report.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct CoreConfig {
    /// `[database]`
    pub database: DatabaseConfig,
    /// `[node]`
    pub node: NodeConfig,
    /// `[cluster]`
    pub cluster: ClusterConfig,
    /// `[metrics]`
    pub metrics: MetricsConfig,
}

impl CoreConfig {
    /// The core sections, validated together.
    pub fn new(
        database: DatabaseConfig,
        node: NodeConfig,
        cluster: ClusterConfig,
        metrics: MetricsConfig,
    ) -> CoreConfig {
        CoreConfig {
            database,
            node,
            cluster,
            metrics,
        }
    }

    /// Applies the environment overrides of the core sections: `DATABASE_URL`,
    /// `FORGE_NODE_ID` (else `HOSTNAME`), `FORGE_ROLES`, `FORGE_QUEUES`,
    /// `FORGE_METRICS_LISTEN`.
    pub fn apply_env(&mut self, env: &dyn Env) -> Result<()> {
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
        // Set, even empty, they restrict: `FORGE_ROLES=""` campaigns for no role.
        if let Some(roles) = env.var("FORGE_ROLES") {
            self.node.roles = Some(comma_separated(&roles));
        }
        if let Some(queues) = env.var("FORGE_QUEUES") {
            self.node.queues = Some(comma_separated(&queues));
        }
        if let Some(listen) = env.var("FORGE_METRICS_LISTEN") {
            self.metrics.listen = parse_listen("FORGE_METRICS_LISTEN", &listen)?;
        }
        Ok(())
    }

    /// Checks values and combinations of the core sections.
    pub fn validate(&self, at: &ConfigSource<'_>) -> Result<()> {
        self.database.validate(at)?;
        self.node.validate(at)?;
        self.metrics.validate(at)?;
        self.cluster.validate(at)
    }
}

/// The names of a comma-separated list, trimmed, empty ones left out.
fn comma_separated(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Parses a `host:port` listen address from the environment (`off` or empty: none).
pub fn parse_listen(variable: &str, value: &str) -> Result<Option<SocketAddr>> {
    let value = value.trim();
    if value.is_empty() || value == "off" {
        return Ok(None);
    }
    value.parse().map(Some).map_err(|_| Error::Config {
        path: None,
        line: None,
        key: variable.into(),
        message: format!(
            "{value:?} is not a socket address: use host:port such as 0.0.0.0:9464, or `off`"
        ),
    })
}

/// `[database]`: where PostgreSQL is and how FORGE uses it.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DatabaseConfig {
    /// `postgres://user:password@host:port/database`. Overridden by `DATABASE_URL`. Required.
    pub url: Option<String>,
    /// Size of the node's connection pool (fenced writes, job claims, your own queries). The
    /// node also opens one dedicated connection per campaigned role and one node session.
    pub max_connections: u32,
    /// How long `Node::start` keeps trying to reach PostgreSQL before giving up.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// Apply FORGE's schema (schema `forge`: its migrations, then its function files) on start.
    /// Several nodes starting at once serialize on a lock, so this is safe to leave on. Off, a
    /// node only checks that the schema is current (`forge migrate up` applies it).
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

// The URL holds the password: never print it.
impl fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("url", &self.redacted().url)
            .field("max_connections", &self.max_connections)
            .field("connect_timeout", &self.connect_timeout)
            .field("migrate", &self.migrate)
            .finish()
    }
}

impl DatabaseConfig {
    /// A copy to show: the URL's password replaced with `***` ([`redact_url`](crate::redact_url)).
    pub fn redacted(&self) -> DatabaseConfig {
        DatabaseConfig {
            url: self.url.as_deref().map(crate::error::redact_url),
            ..self.clone()
        }
    }

    /// The database URL, or an error that says how to provide one.
    pub fn url(&self) -> Result<&str> {
        self.url.as_deref().ok_or_else(|| Error::Config {
            path: None,
            line: None,
            key: "database.url".into(),
            message: "no database URL: set DATABASE_URL or [database] url in forge.toml (postgres://user:password@host:port/database)".into(),
        })
    }

    fn validate(&self, at: &ConfigSource<'_>) -> Result<()> {
        if self.max_connections == 0 {
            return Err(at.error("database.max_connections", "must be at least 1".into()));
        }
        at.check_duration(
            "database.connect_timeout",
            self.connect_timeout,
            Duration::from_millis(100),
        )?;
        if let Some(url) = &self.url
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
        Ok(())
    }
}

/// `[node]`: this node's identity, the roles it campaigns for and the queues it works.
///
/// By default a node serves all the work its binary registered: it campaigns for every role it
/// has work for (crons, leader-only jobs, leader tasks; the built-in roles always have the
/// core's duties) and works every queue a job type of it declares. `roles` and `queues`
/// restrict that, explicitly; work they hide is logged as a warning at start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct NodeConfig {
    /// The node's id in the cluster. Overridden by `FORGE_NODE_ID`; when neither is set,
    /// `$HOSTNAME`, else a generated `node-xxxxxxxx`. Two live nodes never share an id: the
    /// second is refused at start.
    pub id: Option<String>,
    /// The roles this node may campaign for. Unset (the default): every role this binary has
    /// work for. Set: only the listed ones, and of those only the ones with work, unless
    /// `campaign_without_work` is set, so that a node built from an older binary never leads a
    /// role whose work it does not know. Overridden by `FORGE_ROLES` (comma-separated; set and
    /// empty: no role).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roles: Option<Vec<String>>,
    /// Campaign for the roles listed in `roles` even when this binary registered no work for
    /// them (a standby that holds a role's lock for nothing, tests). Needs `roles`.
    pub campaign_without_work: bool,
    /// The queues this node works. Unset (the default): every queue a job type of this binary
    /// declares (without a `role`) and every queue tuned in `[jobs.queues]`. Set: exactly these
    /// (a node with no job type works none). Overridden by `FORGE_QUEUES` (comma-separated; set
    /// and empty: no queue). A role's jobs run on the role's leader whatever this says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queues: Option<Vec<String>>,
    /// Roles this node should lead when it can: while it waits as a standby of such a role, a
    /// leader that does not prefer the role hands it over to this node (as Kafka's preferred
    /// leader election does). Useful for a node with more memory for the aggregator. When
    /// `roles` is set, each must be listed there.
    pub prefer_roles: Vec<String>,
}

impl NodeConfig {
    /// The roles listed in `roles`, parsed; `None` when unset (every role with work).
    pub fn roles(&self) -> Result<Option<Vec<Role>>> {
        let Some(names) = &self.roles else {
            return Ok(None);
        };
        names
            .iter()
            .map(|name| {
                Role::new(name).map_err(|err| Error::Config {
                    path: None,
                    line: None,
                    key: "node.roles".into(),
                    message: err.to_string(),
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// The node id: the configured one, else a generated one.
    pub fn node_id(&self) -> Result<NodeId> {
        match &self.id {
            Some(id) => NodeId::new(id).map_err(|err| Error::Config {
                path: None,
                line: None,
                key: "node.id".into(),
                message: err.to_string(),
            }),
            None => Ok(NodeId::generate()),
        }
    }

    fn validate(&self, at: &ConfigSource<'_>) -> Result<()> {
        if let Some(id) = &self.id {
            check_name(Name::NodeId, id).map_err(|err| at.error("node.id", err.to_string()))?;
        }
        for role in self.roles.iter().flatten() {
            check_name(Name::Role, role).map_err(|err| at.error("node.roles", err.to_string()))?;
        }
        for queue in self.queues.iter().flatten() {
            check_name(Name::Queue, queue)
                .map_err(|err| at.error("node.queues", err.to_string()))?;
        }
        if self.campaign_without_work && self.roles.is_none() {
            return Err(at.error(
                "node.campaign_without_work",
                "campaign_without_work needs [node] roles: it makes a node campaign for the listed roles it has no work for; list them in roles (or FORGE_ROLES), or remove this key".into(),
            ));
        }
        for role in &self.prefer_roles {
            check_name(Name::Role, role)
                .map_err(|err| at.error("node.prefer_roles", err.to_string()))?;
            if let Some(roles) = &self.roles
                && !roles.contains(role)
            {
                return Err(at.error(
                    "node.prefer_roles",
                    format!(
                        "{role:?} is not in node.roles ({}): a node can only lead roles it campaigns for; add it to roles or remove it here",
                        roles.join(", ")
                    ),
                ));
            }
        }
        Ok(())
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
    /// How long the cluster's history (`forge.events`: elections, handoffs, joins,
    /// departures, drifts) is kept; the `log_compactor` leader prunes older events.
    #[serde(with = "duration")]
    pub history_retention: Duration,
    /// How often the `log_compactor` leader prunes every table by its retention (in batches
    /// of 10,000 rows per statement, fenced).
    #[serde(with = "duration")]
    pub compaction_interval: Duration,
    /// Spread the roles' leaderships across the nodes: a node that leads more roles than its
    /// share (the roles divided by the nodes, rounded up) hands one over, gracefully, to a
    /// standby that leads fewer; one move at a time in the cluster, and a role that just moved
    /// stays put for a while. `false`: the first node to campaign keeps what it wins (only
    /// `[node] prefer_roles` moves roles).
    pub spread: bool,
    /// `[cluster.leader_election]`
    pub leader_election: LeaderElectionConfig,
    /// `[cluster.membership]`
    pub membership: MembershipConfig,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            lock_namespace: LockNamespace::default().name().to_owned(),
            history_retention: Duration::from_secs(30 * 24 * 3600),
            compaction_interval: Duration::from_secs(60),
            spread: true,
            leader_election: LeaderElectionConfig::default(),
            membership: MembershipConfig::default(),
        }
    }
}

impl ClusterConfig {
    /// The lock namespace, parsed.
    pub fn namespace(&self) -> Result<LockNamespace> {
        LockNamespace::new(&self.lock_namespace).map_err(|err| Error::Config {
            path: None,
            line: None,
            key: "cluster.lock_namespace".into(),
            message: err.to_string(),
        })
    }

    fn validate(&self, at: &ConfigSource<'_>) -> Result<()> {
        check_name(Name::Namespace, &self.lock_namespace)
            .map_err(|err| at.error("cluster.lock_namespace", err.to_string()))?;
        at.check_duration(
            "cluster.history_retention",
            self.history_retention,
            Duration::from_secs(60),
        )?;
        at.check_duration(
            "cluster.compaction_interval",
            self.compaction_interval,
            Duration::from_millis(100),
        )?;
        self.leader_election.validate(at)?;
        self.membership.validate(at)
    }
}

/// `[cluster.membership]`: heartbeats, and when a silent node counts as drifted or down.
///
/// A node heartbeats on its own node session (never on the pool). The scheduler leader marks a
/// node `drifted` after `drift_after` without a heartbeat (a warning: frozen, starved, or cut
/// off) and `down` after `down_after`, or sooner when its node session ended while PostgreSQL
/// stayed up (the process was killed) and it did not come back within one heartbeat interval.
/// The running jobs of a down node are rescued. After a PostgreSQL restart or failover the
/// ages count from when the scheduler leader took over, so reconnecting nodes are never
/// marked down for the outage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct MembershipConfig {
    /// How often each node heartbeats (one statement on its node session). A node session
    /// that stopped answering (half-open connection) is replaced within about this long.
    #[serde(with = "duration")]
    pub heartbeat_interval: Duration,
    /// No heartbeat for this long: the node is `drifted`.
    #[serde(with = "duration")]
    pub drift_after: Duration,
    /// No heartbeat for this long: the node is `down` and its running jobs are rescued.
    #[serde(with = "duration")]
    pub down_after: Duration,
    /// A node that stopped or went down this long ago is forgotten: the `log_compactor`
    /// leader removes it from `forge.nodes` (a `node_forgotten` event remains).
    #[serde(with = "duration")]
    pub forget_after: Duration,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        MembershipConfig {
            heartbeat_interval: Duration::from_secs(5),
            drift_after: Duration::from_secs(15),
            down_after: Duration::from_secs(60),
            forget_after: Duration::from_secs(3600),
        }
    }
}

impl MembershipConfig {
    fn validate(&self, at: &ConfigSource<'_>) -> Result<()> {
        let key = |name: &str| format!("cluster.membership.{name}");
        at.check_duration(
            &key("heartbeat_interval"),
            self.heartbeat_interval,
            Duration::from_millis(100),
        )?;
        if self.drift_after < self.heartbeat_interval * 2 {
            return Err(at.error(
                &key("drift_after"),
                format!(
                    "drift_after ({}) must be at least twice heartbeat_interval ({}), or one late heartbeat marks a healthy node drifted",
                    fmt_duration(self.drift_after),
                    fmt_duration(self.heartbeat_interval)
                ),
            ));
        }
        at.check_duration(&key("drift_after"), self.drift_after, Duration::ZERO)?;
        if self.down_after <= self.drift_after {
            return Err(at.error(
                &key("down_after"),
                format!(
                    "down_after ({}) must be longer than drift_after ({}): a node is drifted before it is down",
                    fmt_duration(self.down_after),
                    fmt_duration(self.drift_after)
                ),
            ));
        }
        at.check_duration(&key("down_after"), self.down_after, Duration::ZERO)?;
        if self.forget_after <= self.down_after {
            return Err(at.error(
                &key("forget_after"),
                format!(
                    "forget_after ({}) must be longer than down_after ({}): a node is forgotten only after it is down",
                    fmt_duration(self.forget_after),
                    fmt_duration(self.down_after)
                ),
            ));
        }
        at.check_duration(&key("forget_after"), self.forget_after, Duration::ZERO)
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
    #[serde(with = "duration")]
    pub check_interval: Duration,
    /// How long a leadership lasts without renewal. PostgreSQL ends a lock session that stays
    /// silent this long (`idle_session_timeout`), so a frozen or cut-off leader is replaced
    /// after about this time; the leader itself stops trusting its leadership a safety margin
    /// earlier.
    #[serde(with = "duration")]
    pub lease_duration: Duration,
    /// How often the leader renews its lease. At most half of `lease_duration`.
    #[serde(with = "duration")]
    pub refresh_interval: Duration,
    /// The longest a follower waits inside `pg_advisory_lock` before the wait returns to prove
    /// its session alive and to check the leader's lease (one statement per wait). Also
    /// bounds every other lock wait of FORGE's sessions. Short on purpose: PostgreSQL keeps a
    /// waiting statement's snapshot, so every wait holds the database's vacuum horizon back
    /// by up to this long, and a busy job queue pays for that in dead index entries. Only the
    /// `standbys` of each role wait, so the cost is `standbys` x roles statements per
    /// `lock_timeout` across the whole cluster.
    #[serde(with = "duration")]
    pub lock_timeout: Duration,
    /// On graceful shutdown, how long the leader lets in-flight leader-only work finish
    /// before cancelling it and handing over. The leader keeps renewing its lease while it
    /// drains, so no other node leads the role before the handover.
    #[serde(with = "duration")]
    pub drain_timeout: Duration,
    /// How many followers of a role wait inside its lock (standbys: one of them takes over
    /// the instant the leader's session ends). The other followers are reserves: they hold no
    /// connection for the role and campaign again when their node session's heartbeat finds
    /// a standby missing (within `[cluster.membership] heartbeat_interval`). Fewer waiting
    /// sessions mean fewer connections and idle statements; at least 1.
    pub standbys: u32,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        LeaderElectionConfig {
            check_interval: Duration::from_secs(5),
            lease_duration: Duration::from_secs(15),
            refresh_interval: Duration::from_secs(5),
            lock_timeout: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(10),
            standbys: 2,
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

    fn validate(&self, at: &ConfigSource<'_>) -> Result<()> {
        let key = |name: &str| format!("cluster.leader_election.{name}");
        for (name, value) in [
            ("check_interval", self.check_interval),
            ("lease_duration", self.lease_duration),
            ("refresh_interval", self.refresh_interval),
            ("lock_timeout", self.lock_timeout),
        ] {
            at.check_duration(&key(name), value, Duration::from_millis(100))?;
        }
        at.check_duration(&key("drain_timeout"), self.drain_timeout, Duration::ZERO)?;
        if self.standbys == 0 {
            return Err(at.error(
                &key("standbys"),
                "must be at least 1: with no follower waiting inside the lock, a crashed leader would be replaced only after the next heartbeat".into(),
            ));
        }
        if self.lease_duration < Duration::from_secs(1) {
            return Err(at.error(
                &key("lease_duration"),
                format!(
                    "{} is too short: use at least 1s (PostgreSQL enforces it with idle_session_timeout)",
                    fmt_duration(self.lease_duration)
                ),
            ));
        }
        if self.refresh_interval * 2 > self.lease_duration {
            return Err(at.error(
                &key("refresh_interval"),
                format!(
                    "refresh_interval ({}) must be at most half of lease_duration ({}), so that one slow renewal does not drop leadership",
                    fmt_duration(self.refresh_interval),
                    fmt_duration(self.lease_duration)
                ),
            ));
        }
        Ok(())
    }
}

/// `[admin]`: the admin HTTP API (and the dashboard) a node serves, and who may use it.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct AdminConfig {
    /// Address the node serves the admin API on, such as `0.0.0.0:9465`. Overridden by
    /// `FORGE_ADMIN_LISTEN` (`off` disables). Unset: not served (the API can still be
    /// mounted in the application's own axum router).
    pub listen: Option<SocketAddr>,
    /// Bearer token that writes (pause, retry, step-down, ...) require. Overridden by
    /// `FORGE_ADMIN_TOKEN`. Unset: writes are refused.
    pub token: Option<String>,
    /// When set, reads require this bearer token (or `token`). Unset: reads are open.
    pub read_token: Option<String>,
    /// Refuse every write, whatever the token.
    pub read_only: bool,
}

/// What a secret (a token) is shown as wherever a configuration is shown: `Debug`, the
/// facade's `Display` of the whole configuration, the admin API's configuration endpoint.
pub const REDACTED: &str = "<redacted>";

// The tokens are secrets: never print them.
impl fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.redacted();
        f.debug_struct("AdminConfig")
            .field("listen", &shown.listen)
            .field("token", &shown.token)
            .field("read_token", &shown.read_token)
            .field("read_only", &shown.read_only)
            .finish()
    }
}

impl AdminConfig {
    /// A copy to show: each token that is set is replaced with [`REDACTED`] (an unset one
    /// stays unset, so the copy still says whether writes and reads need a token).
    pub fn redacted(&self) -> AdminConfig {
        let hide = |token: &Option<String>| token.as_ref().map(|_| REDACTED.to_owned());
        AdminConfig {
            token: hide(&self.token),
            read_token: hide(&self.read_token),
            ..self.clone()
        }
    }

    /// Applies `FORGE_ADMIN_LISTEN` and `FORGE_ADMIN_TOKEN`.
    pub fn apply_env(&mut self, env: &dyn Env) -> Result<()> {
        if let Some(listen) = env.var("FORGE_ADMIN_LISTEN") {
            self.listen = parse_listen("FORGE_ADMIN_LISTEN", &listen)?;
        }
        if let Some(token) = env.var("FORGE_ADMIN_TOKEN").filter(|v| !v.is_empty()) {
            self.token = Some(token);
        }
        Ok(())
    }

    /// Checks the tokens: long enough to resist guessing.
    pub fn validate(&self, at: &ConfigSource<'_>) -> Result<()> {
        for (key, token) in [
            ("admin.token", &self.token),
            ("admin.read_token", &self.read_token),
        ] {
            if let Some(token) = token
                && token.trim().len() < 16
            {
                return Err(at.error(
                    key,
                    "a token must be at least 16 characters; generate one with `openssl rand -hex 32`"
                        .to_owned(),
                ));
            }
        }
        Ok(())
    }
}

/// `[metrics]`: the Prometheus endpoint, and the cluster series the `metrics_aggregator`
/// leader keeps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct MetricsConfig {
    /// Address of the Prometheus scrape endpoint (`GET /metrics`), such as `0.0.0.0:9464`.
    /// Overridden by `FORGE_METRICS_LISTEN` (`off` disables). Unset: no HTTP listener; the
    /// text stays available through `Node::render_metrics`.
    pub listen: Option<SocketAddr>,
    /// The width of one point of the cluster series (`forge.stats`: jobs and cron runs,
    /// failures, durations, lag, queue depth): the `metrics_aggregator` leader rolls the nodes'
    /// counters up once per interval.
    #[serde(with = "duration")]
    pub rollup_interval: Duration,
    /// How long the cluster series are kept; the `log_compactor` leader prunes older points.
    #[serde(with = "duration")]
    pub rollup_retention: Duration,
    /// Whether the cron metrics have a series per cron (label `cron`): each cron's runs by
    /// outcome and missed ticks on every node that campaigns for its role (6 series), its lag
    /// and duration histograms on the role's leader while it leads (40 more). `false`: the
    /// same metrics per role only (no `cron` label), whatever the number of crons - for
    /// clusters with thousands of crons.
    pub per_cron: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: None,
            rollup_interval: Duration::from_secs(60),
            rollup_retention: Duration::from_secs(7 * 24 * 3600),
            per_cron: true,
        }
    }
}

impl MetricsConfig {
    fn validate(&self, at: &ConfigSource<'_>) -> Result<()> {
        at.check_duration(
            "metrics.rollup_interval",
            self.rollup_interval,
            Duration::from_secs(1),
        )?;
        if self.rollup_retention < self.rollup_interval {
            return Err(at.error(
                "metrics.rollup_retention",
                format!(
                    "rollup_retention ({}) must be at least rollup_interval ({})",
                    fmt_duration(self.rollup_retention),
                    fmt_duration(self.rollup_interval)
                ),
            ));
        }
        at.check_duration(
            "metrics.rollup_retention",
            self.rollup_retention,
            Duration::ZERO,
        )
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

/// Where a configuration came from: its text and file, to turn keys into line numbers in
/// errors. A config built in code has an empty source (errors then name only the key).
#[derive(Clone, Copy, Debug, Default)]
pub struct ConfigSource<'a> {
    text: &'a str,
    path: Option<&'a Path>,
}

impl<'a> ConfigSource<'a> {
    /// The source of a parsed file (`path` only appears in messages).
    pub fn new(text: &'a str, path: Option<&'a Path>) -> ConfigSource<'a> {
        ConfigSource { text, path }
    }

    /// An error about `key` (dotted, such as `jobs.queues.mail`), with the line that sets it.
    pub fn error(&self, key: &str, message: String) -> Error {
        Error::Config {
            path: self.path.map(Path::to_owned),
            line: self.line_of_key(key),
            key: key.into(),
            message,
        }
    }

    /// Checks a duration against a lower bound and FORGE's upper bound
    /// ([`forge_rules::MAX_DURATION`]).
    pub fn check_duration(&self, key: &str, value: Duration, at_least: Duration) -> Result<()> {
        if value < at_least {
            return Err(self.error(
                key,
                format!(
                    "{} is too short: use at least {}",
                    fmt_duration(value),
                    fmt_duration(at_least)
                ),
            ));
        }
        forge_rules::check_duration(value).map_err(|message| self.error(key, message))
    }

    /// Turns a TOML parse error into one that names the key and the line.
    pub fn toml_error(&self, err: &toml::de::Error) -> Error {
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

/// Reads a config file, with an error naming it when it cannot be read.
pub fn read_file(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::ConfigRead {
        path: path.to_owned(),
        source,
    })
}

fn fmt_duration(d: Duration) -> String {
    forge_rules::format_duration(d)
}

/// Serde adapter for human durations (`"5s"`, `"250ms"`, `"1m 30s"`), bounded by
/// [`forge_rules::MAX_DURATION`]: use it as `#[serde(with = "forge_core::config::duration")]`.
pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes a duration as humans do (`"1m 30s"`).
    pub fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&forge_rules::format_duration(*value))
    }

    /// Reads a human duration.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected a duration string such as \"5s\", \"250ms\" or \"1m 30s\"",
            )
        })?;
        forge_rules::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}
