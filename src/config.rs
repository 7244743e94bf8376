//! `forge.toml`: the whole configuration of a node, made of the core's sections and the
//! scheduler's, with human durations, environment overrides for what differs per node, and
//! errors that name the file, the key and the line.
//!
//! Every key, with its default, is documented in the workspace's `forge.toml`, which a test
//! parses and compares with [`Config::default`], so the reference cannot drift from the code.

use std::fmt;
use std::path::Path;

use forge_core::config::{ConfigSource, read_file};
use forge_core::{
    AdminConfig, ClusterConfig, CoreConfig, DatabaseConfig, Env, LockNamespace, MetricsConfig,
    NodeConfig, NodeId, ProcessEnv, Result, Role, no_env,
};
use forge_scheduler::{CronConfig, JobsConfig};
use serde::{Deserialize, Serialize};

use forge_alerts::{AlertRule, AlertingConfig, RuleFile};

/// The whole configuration of a node (`forge.toml`).
///
/// Build it from a file with [`Config::load`], from the environment alone with
/// [`Config::from_env`], from text with [`Config::from_toml`], or start from
/// [`Config::default`] and set fields in code.
///
/// ```
/// use forge::Config;
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
    /// `[cluster]`: namespace, `[cluster.leader_election]`, `[cluster.membership]`
    pub cluster: ClusterConfig,
    /// `[metrics]`
    pub metrics: MetricsConfig,
    /// `[cron]`
    pub cron: CronConfig,
    /// `[jobs]`
    pub jobs: JobsConfig,
    /// `[admin]`: the admin API the node serves, and its tokens
    pub admin: AdminConfig,
    /// `[alerting]`: the exported rule file's runbook links
    pub alerting: AlertingConfig,
    /// `[[alerts]]`: Prometheus alert rules of your own, and changes to the built-in ones
    /// (exported with [`Config::alert_rules`])
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alerts: Vec<AlertRule>,
}

impl Config {
    /// Reads `path`, applies the environment overrides (`DATABASE_URL`, `FORGE_NODE_ID`,
    /// `HOSTNAME`, `FORGE_ROLES`, `FORGE_QUEUES`, `FORGE_METRICS_LISTEN`, `FORGE_ADMIN_LISTEN`,
    /// `FORGE_ADMIN_TOKEN`) and validates.
    pub fn load(path: impl AsRef<Path>) -> Result<Config> {
        Config::load_with_env(path, &ProcessEnv)
    }

    /// [`Config::load`] with an explicit environment.
    pub fn load_with_env(path: impl AsRef<Path>, env: &dyn Env) -> Result<Config> {
        let path = path.as_ref();
        let text = read_file(path)?;
        Config::parse(&text, Some(path), env)
    }

    /// Parses TOML text without consulting the environment, and validates.
    pub fn from_toml(text: &str) -> Result<Config> {
        Config::parse(text, None, &no_env)
    }

    /// The defaults with the environment's overrides (no file): `DATABASE_URL` is enough to
    /// run a node, which then campaigns for every role and works every queue its binary has
    /// work for.
    pub fn from_env() -> Result<Config> {
        Config::parse("", None, &ProcessEnv)
    }

    /// Parses TOML text, applies overrides from `env`, and validates. `path` is only used in
    /// error messages.
    pub fn parse(text: &str, path: Option<&Path>, env: &dyn Env) -> Result<Config> {
        let source = ConfigSource::new(text, path);
        let mut config: Config = toml::from_str(text)
            .map_err(|err| forge_alerts::refine_toml_error(source.toml_error(&err), &err, text))?;
        let mut core = config.core();
        core.apply_env(env)?;
        config.set_core(core);
        config.admin.apply_env(env)?;
        config.validate_at(&source)?;
        forge_alerts::validate(&config.alerts, text, path)?;
        Ok(config)
    }

    /// Checks values and combinations (a config built in code should be validated too;
    /// `NodeBuilder::start` does it).
    pub fn validate(&self) -> Result<()> {
        self.validate_at(&ConfigSource::default())?;
        forge_alerts::validate(&self.alerts, "", None)
    }

    fn validate_at(&self, at: &ConfigSource<'_>) -> Result<()> {
        self.core().validate(at)?;
        self.cron.validate(at)?;
        self.jobs.validate(at)?;
        self.admin.validate(at)?;
        self.alerting.validate(at)
    }

    /// The core's sections.
    pub fn core(&self) -> CoreConfig {
        CoreConfig::new(
            self.database.clone(),
            self.node.clone(),
            self.cluster.clone(),
            self.metrics.clone(),
        )
    }

    fn set_core(&mut self, core: CoreConfig) {
        self.database = core.database;
        self.node = core.node;
        self.cluster = core.cluster;
        self.metrics = core.metrics;
    }

    /// The Prometheus rule file this configuration exports (`forge alerts export`): the
    /// built-in rules with `[[alerts]]`' changes, then `[[alerts]]`' own rules, runbook links
    /// into `[alerting] runbook_base_url`, the cron rules per cron unless `[metrics] per_cron =
    /// false`. `.to_yaml()` gives the file; the same configuration always gives the same text.
    ///
    /// ```
    /// let config = forge::Config::from_toml(
    ///     "[[alerts]]\nname = \"forge_leader_failover\"\nenabled = false\n",
    /// )?;
    /// let yaml = config.alert_rules().to_yaml();
    /// assert!(yaml.contains("- alert: \"forge_no_leader\""));
    /// assert!(!yaml.contains("- alert: \"forge_leader_failover\""));
    /// # Ok::<(), forge::Error>(())
    /// ```
    pub fn alert_rules(&self) -> RuleFile<'_> {
        RuleFile::new(&self.alerts)
            .runbook_base(self.alerting.runbook_base())
            .per_cron(self.metrics.per_cron)
    }

    /// The database URL, or an error that says how to provide one.
    pub fn database_url(&self) -> Result<&str> {
        self.database.url()
    }

    /// The roles listed in `[node] roles`, parsed; `None` when unset (every role with work).
    pub fn roles(&self) -> Result<Option<Vec<Role>>> {
        self.node.roles()
    }

    /// The lock namespace, parsed.
    pub fn lock_namespace(&self) -> Result<LockNamespace> {
        self.cluster.namespace()
    }

    /// The node id: the configured one, else a generated one.
    pub fn node_id(&self) -> Result<NodeId> {
        self.node.node_id()
    }
}

impl Config {
    /// A copy to show (log, print, serve): every secret hidden - the database URL's password
    /// (`***`) and the `[admin]` tokens (`<redacted>`). [`Display`](fmt::Display), `Debug` and
    /// the admin API's `GET /api/cluster/config` show this.
    pub fn redacted(&self) -> Config {
        Config {
            database: self.database.redacted(),
            admin: self.admin.redacted(),
            ..self.clone()
        }
    }
}

impl fmt::Display for Config {
    /// The configuration as TOML, its secrets hidden ([`Config::redacted`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match toml::to_string_pretty(&self.redacted()) {
            Ok(text) => f.write_str(&text),
            Err(_) => Err(fmt::Error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn parse_err(text: &str) -> String {
        Config::parse(text, Some(Path::new("forge.toml")), &no_env)
            .unwrap_err()
            .to_string()
    }

    fn reference_path() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("forge.toml")
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
    fn absurd_durations_are_errors_not_panics() {
        let msg = parse_err("[jobs]\ncompleted_retention = \"300000y\"\n");
        assert!(
            msg.starts_with("forge.toml:2: `jobs.completed_retention`"),
            "{msg}"
        );
        assert!(msg.contains("longer than the longest duration"), "{msg}");
        let msg = parse_err("[cron]\nmisfire_threshold = \"99999999999999999999s\"\n");
        assert!(msg.contains("cron.misfire_threshold"), "{msg}");
        let msg = parse_err("[cron]\nclaim_ahead = \"1m\"\n");
        assert!(msg.contains("cron.claim_ahead"), "{msg}");
        assert!(msg.contains("more than 10s"), "{msg}");
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
        let msg = parse_err("[cluster.membership]\ndrift_after = \"1m\"\ndown_after = \"30s\"\n");
        assert!(
            msg.starts_with("forge.toml:3: `cluster.membership.down_after`"),
            "{msg}"
        );
        let msg = parse_err("[cluster.membership]\nheartbeat_interval = \"10s\"\n");
        assert!(
            msg.contains("cluster.membership.drift_after") && msg.contains("twice"),
            "{msg}"
        );
    }

    #[test]
    fn bad_job_settings_name_the_key_and_line() {
        let msg = parse_err("[jobs.queues]\ndefault = 0\n");
        assert!(
            msg.starts_with("forge.toml:2: `jobs.queues.default`"),
            "{msg}"
        );
        let msg = parse_err("[jobs.queues]\n\"mail ers\" = 4\n");
        assert!(msg.contains("invalid queue name"), "{msg}");
        let msg = parse_err("[jobs]\ndefault_concurrency = 0\n");
        assert!(
            msg.starts_with("forge.toml:2: `jobs.default_concurrency`"),
            "{msg}"
        );
        let msg = parse_err("[node]\nqueues = [\"mail ers\"]\n");
        assert!(
            msg.starts_with("forge.toml:2: `node.queues`") && msg.contains("invalid queue name"),
            "{msg}"
        );
    }

    #[test]
    fn queue_limits_load_and_bad_ones_name_the_key_and_line() {
        let config = Config::from_toml(
            "[jobs.queues]\nfast = 8\n\n[jobs.queues.mailers]\nconcurrency = 4\nglobal_concurrency = 16\nrate = \"100/1m\"\nrate_key = \"customer_id\"\n",
        )
        .unwrap();
        assert_eq!(config.jobs.concurrency("fast"), 8);
        assert_eq!(config.jobs.concurrency("mailers"), 4);
        let limits = config.jobs.limits("mailers");
        assert_eq!(limits.global_concurrency, Some(16));
        assert_eq!(limits.to_string(), "global 16, rate 100/1m per customer_id");
        assert!(config.jobs.limits("fast").is_empty());
        let msg = parse_err("[jobs.queues.mailers]\nrate = \"100 a minute\"\n");
        assert!(
            msg.starts_with("forge.toml:2: `jobs.queues.mailers.rate`") && msg.contains("100/1m"),
            "{msg}"
        );
        let msg = parse_err("[jobs.queues.mailers]\nconcurrency = 4\nglobal_concurrency = 0\n");
        assert!(
            msg.starts_with("forge.toml:3: `jobs.queues.mailers.global_concurrency`"),
            "{msg}"
        );
        let msg = parse_err("[jobs.queues.mailers]\nrate_key = \"customer_id\"\n");
        assert!(
            msg.starts_with("forge.toml:2: `jobs.queues.mailers.rate_key`")
                && msg.contains("needs a rate"),
            "{msg}"
        );
        let msg = parse_err("[jobs.queues.mailers]\nconcurrency = 0\n");
        assert!(
            msg.starts_with("forge.toml:2: `jobs.queues.mailers.concurrency`"),
            "{msg}"
        );
        let msg = parse_err("[jobs.queues.mailers]\nglobal = 4\n");
        assert!(msg.contains("unknown field `global`"), "{msg}");
    }

    #[test]
    fn kind_limits_load_and_bad_ones_name_the_key_and_line() {
        let config = Config::from_toml(
            "[jobs.kinds.send_email]\nglobal_concurrency = 4\nrate = \"100/1m\"\nrate_key = \"customer_id\"\n\n[jobs.kinds.unlimited]\n",
        )
        .unwrap();
        let limits = config.jobs.kinds["send_email"].limits();
        assert_eq!(limits.to_string(), "global 4, rate 100/1m per customer_id");
        assert!(config.jobs.kinds["unlimited"].limits().is_empty());
        let msg = parse_err("[jobs.kinds.send_email]\nrate = \"100 a minute\"\n");
        assert!(
            msg.starts_with("forge.toml:2: `jobs.kinds.send_email.rate`") && msg.contains("100/1m"),
            "{msg}"
        );
        let msg = parse_err("[jobs.kinds.send_email]\nglobal_concurrency = 0\n");
        assert!(
            msg.starts_with("forge.toml:2: `jobs.kinds.send_email.global_concurrency`"),
            "{msg}"
        );
        let msg = parse_err("[jobs.kinds.send_email]\nconcurrency = 4\n");
        assert!(msg.contains("unknown field `concurrency`"), "{msg}");
        let msg = parse_err("[jobs.kinds.\"Send Email\"]\nglobal_concurrency = 4\n");
        assert!(msg.contains("Send Email"), "{msg}");
    }

    #[test]
    fn restrictions_of_roles_are_explicit_and_checked() {
        // Unset: every role with work, so prefer_roles cannot be checked against a list.
        let config = Config::from_toml("[node]\nprefer_roles = [\"billing\"]\n").unwrap();
        assert_eq!(config.node.roles, None);
        let msg = parse_err("[node]\nroles = [\"scheduler\"]\nprefer_roles = [\"billing\"]\n");
        assert!(
            msg.starts_with("forge.toml:3: `node.prefer_roles`")
                && msg.contains("not in node.roles"),
            "{msg}"
        );
        // campaign_without_work names no role by itself: a key that would do nothing.
        let msg = parse_err("[node]\ncampaign_without_work = true\n");
        assert!(
            msg.starts_with("forge.toml:2: `node.campaign_without_work`")
                && msg.contains("needs [node] roles"),
            "{msg}"
        );
        Config::from_toml("[node]\nroles = [\"billing\"]\ncampaign_without_work = true\n").unwrap();
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
        assert_eq!(
            config.node.roles.as_deref(),
            Some(&["scheduler".to_owned(), "reports".to_owned()][..])
        );
        assert_eq!(config.node.queues, None, "unset: every declared queue");

        let env = |name: &str| match name {
            "FORGE_NODE_ID" => Some("explicit".to_owned()),
            "HOSTNAME" => Some("pod-7".to_owned()),
            "FORGE_METRICS_LISTEN" => Some("off".to_owned()),
            _ => None,
        };
        let config = Config::parse("[metrics]\nlisten = \"0.0.0.0:1\"", None, &env).unwrap();
        assert_eq!(config.node.id.as_deref(), Some("explicit"));
        assert_eq!(config.metrics.listen, None);
        assert_eq!(config.node.roles, None, "unset: every role with work");

        // Set, even empty, FORGE_ROLES and FORGE_QUEUES restrict.
        let env = |name: &str| match name {
            "FORGE_ROLES" => Some(String::new()),
            "FORGE_QUEUES" => Some("mailers, default".to_owned()),
            _ => None,
        };
        let config = Config::parse("[node]\nroles = [\"billing\"]\n", None, &env).unwrap();
        assert_eq!(config.node.roles, Some(vec![]));
        assert_eq!(
            config.node.queues.as_deref(),
            Some(&["mailers".to_owned(), "default".to_owned()][..])
        );

        let env = |name: &str| (name == "FORGE_METRICS_LISTEN").then(|| "nope".to_owned());
        let msg = Config::parse("", None, &env).unwrap_err().to_string();
        assert!(
            msg.contains("FORGE_METRICS_LISTEN") && msg.contains("host:port"),
            "{msg}"
        );
    }

    #[test]
    fn environment_overrides_the_admin_section() {
        let file = "[admin]\nlisten = \"0.0.0.0:9465\"\ntoken = \"file-token-0123456789\"\n";
        let env = |name: &str| match name {
            "FORGE_ADMIN_LISTEN" => Some("127.0.0.1:9999".to_owned()),
            "FORGE_ADMIN_TOKEN" => Some("env-token-0123456789".to_owned()),
            _ => None,
        };
        let config = Config::parse(file, None, &env).unwrap();
        assert_eq!(config.admin.listen, Some("127.0.0.1:9999".parse().unwrap()));
        assert_eq!(config.admin.token.as_deref(), Some("env-token-0123456789"));

        // `off` stops serving; an empty token leaves the file's.
        let env = |name: &str| match name {
            "FORGE_ADMIN_LISTEN" => Some("off".to_owned()),
            "FORGE_ADMIN_TOKEN" => Some(String::new()),
            _ => None,
        };
        let config = Config::parse(file, None, &env).unwrap();
        assert_eq!(config.admin.listen, None);
        assert_eq!(config.admin.token.as_deref(), Some("file-token-0123456789"));

        // Without the variables the file stands.
        let config = Config::parse(file, None, &no_env).unwrap();
        assert_eq!(config.admin.listen, Some("0.0.0.0:9465".parse().unwrap()));

        // Bad values are errors naming the variable or the key, never showing a token.
        let env = |name: &str| (name == "FORGE_ADMIN_LISTEN").then(|| "nope".to_owned());
        let msg = Config::parse("", None, &env).unwrap_err().to_string();
        assert!(
            msg.contains("FORGE_ADMIN_LISTEN") && msg.contains("host:port"),
            "{msg}"
        );
        let env = |name: &str| (name == "FORGE_ADMIN_TOKEN").then(|| "short-secret".to_owned());
        let msg = Config::parse("", None, &env).unwrap_err().to_string();
        assert!(
            msg.contains("admin.token") && msg.contains("at least 16 characters"),
            "{msg}"
        );
        assert!(!msg.contains("short-secret"), "{msg}");
    }

    #[test]
    fn debug_and_display_never_show_the_password() {
        let mut config = Config::default();
        config.database.url = Some("postgres://app:hunter2@db/app?password=hunter2".into());
        config.admin.token = Some("write-secret-0123456789".into());
        config.admin.read_token = Some("read-secret-9876543210".into());
        config.validate().unwrap();
        let redacted = config.redacted();
        let serialized = serde_json::to_string(&redacted).unwrap();
        for shown in [format!("{config:?}"), config.to_string(), serialized] {
            for secret in ["hunter2", "write-secret", "read-secret"] {
                assert!(!shown.contains(secret), "{secret} in {shown}");
            }
            assert!(shown.contains("app:***@db"), "{shown}");
            assert_eq!(
                shown.matches(forge_core::config::REDACTED).count(),
                2,
                "{shown}"
            );
        }
        // What is not a secret is shown as it is, and an unset token stays unset.
        assert_eq!(redacted.admin.read_only, config.admin.read_only);
        let mut open = config.clone();
        open.admin.read_token = None;
        assert_eq!(open.redacted().admin.read_token, None);
        assert!(!open.to_string().contains("read_token"), "{open}");
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
        full.node.roles = Some(vec!["scheduler".into()]);
        full.node.queues = Some(vec!["default".into()]);
        full.jobs.queues.insert("mailers".into(), 4.into());
        full.metrics.listen = Some("0.0.0.0:1".parse().unwrap());
        full.alerting.runbook_base_url = Some("https://example.com/runbook.md".into());
        let mut keys = Vec::new();
        collect_keys(&toml::Value::try_from(&full).unwrap(), "", &mut keys);
        assert!(keys.len() >= 20, "{keys:?}");
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
