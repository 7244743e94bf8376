//! Prometheus alert rules: FORGE's built-in rule set plus forge.toml's `[[alerts]]`, exported
//! as a Prometheus rule file ([`rules_yaml`], `forge alerts export`).
//!
//! ```toml
//! [[alerts]]
//! name = "no_scheduler_leader"
//! condition = "sum(forge_leader_is_leader{role='scheduler'}) == 0"
//! for = "30s"
//! severity = "critical"
//! notify = ["pagerduty"]
//!
//! [[alerts]]                          # a built-in rule, routed to Slack with a longer delay
//! name = "forge_nodes_drifted"
//! for = "10m"
//! notify = ["slack:#ops"]
//!
//! [[alerts]]                          # a built-in rule turned off
//! name = "forge_leader_failover"
//! enabled = false
//! ```
//!
//! A rule named like a built-in ([`BUILTIN`]) replaces the keys it sets and keeps the others;
//! `enabled = false` drops it. Any other rule needs `condition` and `severity`.
//!
//! **`notify` → Alertmanager labels.** Alertmanager routes on labels, and a label holds one
//! string, so each entry becomes a label of its own: `"pagerduty"` → `notify_pagerduty="true"`,
//! `"slack:#ops"` → `notify_slack="#ops"` (several targets of one channel are joined with `,`
//! in sorted order: `notify_slack="#db,#ops"`). Route with `matchers: [notify_pagerduty="true"]`
//! or `[notify_slack=~"(.*,)?#ops(,.*)?"]`, and `continue: true` to reach several receivers.
//! Every rule also carries `severity` (`critical`, `warning`, `info`).
//!
//! **Grouping.** The built-in rules aggregate `by (job, ...)`: one Prometheus scrape job per
//! FORGE cluster (lock namespace). Job metrics label the job kind `kind` (not `job`, which
//! is Prometheus' own target label).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use forge_core::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::Config;

/// Where the built-in rules' `runbook_url` annotations point by default: the runbook in
/// FORGE's repository (`docs/runbook.md`, one section per rule, anchored by its name), a
/// relative link. Set `[alerting] runbook_base_url` (or use [`rules_yaml_with`]) to make the
/// links absolute, so that they open from Alertmanager, PagerDuty or Slack.
pub const DEFAULT_RUNBOOK_BASE: &str = "docs/runbook.md";

/// `[alerting]`: settings of the exported rule file as a whole (the rules themselves are
/// `[[alerts]]`, an array of tables, which is why this section has a name of its own).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct AlertingConfig {
    /// The absolute URL (`http://` or `https://`) of your copy of `docs/runbook.md`: the
    /// built-in rules' `runbook_url` is `<runbook_base_url>#<rule name>`. Unset: the relative
    /// [`DEFAULT_RUNBOOK_BASE`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runbook_base_url: Option<String>,
}

impl AlertingConfig {
    /// Where the built-in rules' runbook links point.
    pub fn runbook_base(&self) -> &str {
        self.runbook_base_url
            .as_deref()
            .unwrap_or(DEFAULT_RUNBOOK_BASE)
    }

    pub(crate) fn validate(&self, at: &forge_core::config::ConfigSource<'_>) -> Result<()> {
        let Some(url) = &self.runbook_base_url else {
            return Ok(());
        };
        let key = "alerting.runbook_base_url";
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"));
        match rest {
            Some(rest) if !rest.is_empty() && !url.contains(char::is_whitespace) => {}
            _ => {
                return Err(at.error(
                    key,
                    format!(
                        "{url:?} is not an absolute http(s) URL: give the address your copy of docs/runbook.md is served at, such as \"https://github.com/acme/app/blob/main/docs/runbook.md\""
                    ),
                ));
            }
        }
        if url.contains('#') {
            return Err(at.error(
                key,
                format!(
                    "{url:?} has a fragment: each rule's link adds `#<rule name>` to it; give the page's URL without one"
                ),
            ));
        }
        Ok(())
    }
}

/// How loud an alert is: the `severity` label of the exported rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Someone must act now (a role without a leader).
    Critical,
    /// Someone must look soon.
    Warning,
    /// Worth knowing (a failover happened).
    Info,
}

impl Severity {
    /// `critical`, `warning` or `info`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// One `[[alerts]]` entry of forge.toml: a rule of your own, or changes to a built-in rule of
/// the same name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AlertRule {
    /// The alert's name (`alert:`): letters, digits, `_` and `:`, not starting with a digit;
    /// unique among `[[alerts]]`.
    pub name: String,
    /// The PromQL expression; the alert is active for every series it returns. Required
    /// unless `name` is a built-in rule's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// How long the condition must hold before the alert fires (none: at once).
    #[serde(
        default,
        rename = "for",
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub for_: Option<Duration>,
    /// `critical`, `warning` or `info`. Required unless `name` is a built-in rule's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<Severity>,
    /// Where to send it: `"channel"` or `"channel:target"`, turned into Alertmanager routing
    /// labels (see the [module](self) documentation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<Vec<String>>,
    /// The `summary` annotation (Prometheus templates such as `{{ $labels.role }}` work).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The `description` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The `runbook_url` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runbook: Option<String>,
    /// `false` leaves the rule out of the export (the way to turn a built-in rule off).
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub enabled: bool,
}

fn yes() -> bool {
    true
}

fn is_yes(value: &bool) -> bool {
    *value
}

impl AlertRule {
    /// A rule named `name` with nothing else set (enabled).
    pub fn new(name: impl Into<String>) -> AlertRule {
        AlertRule {
            name: name.into(),
            enabled: true,
            ..AlertRule::default()
        }
    }
}

/// A built-in rule.
#[derive(Debug)]
pub struct Builtin {
    /// The alert's name, also its runbook section's anchor.
    pub name: &'static str,
    /// `critical`, `warning` or `info`.
    pub severity: Severity,
    /// How long the condition must hold.
    pub for_: Duration,
    /// The PromQL expression.
    pub expr: &'static str,
    /// The `summary` annotation.
    pub summary: &'static str,
    /// The `description` annotation.
    pub description: &'static str,
}

const fn minutes(n: u64) -> Duration {
    Duration::from_secs(n * 60)
}

/// The built-in rules, in export order. Every metric they use is one FORGE exports (counters
/// from 0 at a node's start, so that a first increment counts).
pub const BUILTIN: &[Builtin] = &[
    Builtin {
        name: "forge_no_leader",
        severity: Severity::Critical,
        for_: minutes(1),
        expr: "sum by (job, role) (forge_leader_is_leader) == 0 or (max by (job, role) (max_over_time(forge_leader_is_leader[15m])) * 0 unless on (job, role) max by (job, role) (forge_leader_is_leader))",
        summary: "No leader for role {{ $labels.role }}",
        description: "No node of {{ $labels.job }} reports leading the role {{ $labels.role }} (or no node that campaigns for it is scraped any more): its crons, leader-only jobs and duties are not running.",
    },
    Builtin {
        name: "forge_work_unserved",
        severity: Severity::Critical,
        for_: minutes(5),
        expr: "max by (job, work, name) (forge_work_unserved) > 0",
        summary: "No node serves {{ $labels.work }} {{ $labels.name }}",
        description: "{{ if eq $labels.work \"queue\" }}Jobs wait in the queue {{ $labels.name }} of {{ $labels.job }} and no live node works it{{ else }}Live nodes of {{ $labels.job }} have work for the role {{ $labels.name }} (crons, leader-only jobs, leader tasks) and none of them campaigns for it{{ end }}: the work waits until a node serves it. `forge status` says what to do.",
    },
    Builtin {
        name: "forge_multiple_leaders",
        severity: Severity::Critical,
        for_: minutes(1),
        expr: "sum by (job, role) (forge_leader_is_leader) > 1",
        summary: "{{ $value }} nodes lead role {{ $labels.role }}",
        description: "More than one node of {{ $labels.job }} reports leading the role {{ $labels.role }}. Fenced writes of a deposed leader are refused, but its unfenced side effects (HTTP calls, emails) may happen twice.",
    },
    Builtin {
        name: "forge_leader_failover",
        severity: Severity::Info,
        for_: Duration::ZERO,
        expr: "sum by (job, role) (increase(forge_leader_failovers_total[15m])) >= 1",
        summary: "Failover of role {{ $labels.role }}",
        description: "In the last 15 minutes a node of {{ $labels.job }} took the role {{ $labels.role }} over from a leader that did not hand over: it crashed, froze or lost PostgreSQL.",
    },
    Builtin {
        name: "forge_frequent_failovers",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, role) (increase(forge_leader_failovers_total[1h])) >= 3",
        summary: "Frequent failovers of role {{ $labels.role }}",
        description: "The role {{ $labels.role }} of {{ $labels.job }} failed over 3 times or more in the last hour: its leaders keep crashing, freezing or losing PostgreSQL.",
    },
    Builtin {
        name: "forge_leader_lock_conflict",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, role) (increase(forge_leader_lock_conflicts_total[15m])) >= 1",
        summary: "A foreign session holds the lock of role {{ $labels.role }}",
        description: "Nodes of {{ $labels.job }} waiting for the role {{ $labels.role }} found its advisory-lock key held by a session that is not a FORGE node: no FORGE node can lead the role while it holds the key.",
    },
    Builtin {
        name: "forge_cron_missed_ticks",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, role, cron) (increase(forge_cron_missed_ticks_total[1h])) >= 1",
        summary: "Cron {{ $labels.cron }} missed ticks",
        description: "In the last hour, ticks of the cron {{ $labels.cron }} (role {{ $labels.role }}) were due while the role had no leader and were not run, per the cron's catch_up policy.",
    },
    Builtin {
        name: "forge_cron_late",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, role, cron) (increase(forge_cron_lag_seconds_count[15m])) - sum by (job, role, cron) (increase(forge_cron_lag_seconds_bucket{le=~\"60|60.0\"}[15m])) >= 1",
        summary: "Cron {{ $labels.cron }} runs start late",
        description: "In the last 15 minutes, runs of the cron {{ $labels.cron }} (role {{ $labels.role }}) started more than 60s after their scheduled instant: ticks caught up after a leaderless gap, runs slower than the schedule, or a saturated leader.",
    },
    Builtin {
        name: "forge_cron_failing",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, role, cron) (increase(forge_cron_runs_total{outcome=~\"failed|timed_out|abandoned\"}[1h])) >= 1",
        summary: "Cron {{ $labels.cron }} runs fail",
        description: "In the last hour, runs of the cron {{ $labels.cron }} (role {{ $labels.role }}) failed, timed out or were abandoned; forge.cron_ticks has their errors.",
    },
    Builtin {
        name: "forge_cron_unknown",
        severity: Severity::Warning,
        for_: minutes(15),
        expr: "max by (job, role) (forge_cron_unknown_crons > 0 and forge_leader_is_leader == 1)",
        summary: "The leader of role {{ $labels.role }} lacks {{ $value }} cron(s)",
        description: "The leader of the role {{ $labels.role }} ({{ $labels.job }}) runs a binary without crons that other nodes registered: their ticks do not run until a node that has them leads the role. Usually a rolling deploy that did not finish.",
    },
    Builtin {
        name: "forge_job_backlog",
        severity: Severity::Warning,
        for_: minutes(15),
        expr: "sum by (job, queue) (forge_job_queue_depth{state=\"available\"}) > 1000",
        summary: "{{ $value }} jobs wait in queue {{ $labels.queue }}",
        description: "More than 1000 jobs of the queue {{ $labels.queue }} ({{ $labels.job }}) have been due and unclaimed for 15 minutes: the nodes that work the queue cannot keep up.",
    },
    Builtin {
        name: "forge_job_oldest_age",
        severity: Severity::Warning,
        for_: minutes(5),
        expr: "max by (job, queue) (forge_job_oldest_age_seconds) > 600",
        summary: "Jobs of queue {{ $labels.queue }} wait longer than 10 minutes",
        description: "The oldest due job of the queue {{ $labels.queue }} ({{ $labels.job }}) has waited {{ $value | humanizeDuration }}: no node works the queue, or its workers are saturated or cannot claim.",
    },
    Builtin {
        name: "forge_jobs_dead",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, queue, kind) (increase(forge_job_dead_total[15m])) >= 1",
        summary: "Jobs of queue {{ $labels.queue }} were dead-lettered",
        description: "In the last 15 minutes, jobs of the queue {{ $labels.queue }} ({{ $labels.job }}) were dead-lettered: out of attempts, discarded, undecodable, or rescued with no attempts left. They are kept for [jobs] dead_retention (forge_job_dead_jobs).",
    },
    Builtin {
        name: "forge_nodes_down",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "max by (job) (forge_cluster_nodes{state=\"down\"}) > 0",
        summary: "{{ $value }} node(s) of {{ $labels.job }} down",
        description: "The scheduler leader marked nodes down (their session ended and they did not come back, or no heartbeat for down_after) and rescued their running jobs. A node stays down until it rejoins or is forgotten after forget_after.",
    },
    Builtin {
        name: "forge_nodes_drifted",
        severity: Severity::Warning,
        for_: minutes(2),
        expr: "max by (job) (forge_cluster_nodes{state=\"drifted\"}) > 0",
        summary: "{{ $value }} node(s) of {{ $labels.job }} drifted",
        description: "Nodes have not heartbeaten for longer than drift_after: frozen, starved of CPU, or cut off from PostgreSQL.",
    },
    Builtin {
        name: "forge_db_reconnect_storm",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, instance) (increase(forge_db_reconnects_total[15m])) > 10",
        summary: "Node {{ $labels.instance }} keeps reconnecting to PostgreSQL",
        description: "The dedicated sessions of the node {{ $labels.instance }} ({{ $labels.job }}: its node session, one per role) reconnected more than 10 times in 15 minutes: PostgreSQL restarts, a flapping network, or a proxy that drops connections.",
    },
];

/// A rule as exported: a built-in with forge.toml's changes, or a rule of forge.toml.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Rule {
    /// `alert:`
    pub name: String,
    /// `expr:`
    pub expr: String,
    /// `for:` (zero: none)
    pub for_: Duration,
    /// The `severity` label.
    pub severity: Severity,
    /// `notify` entries, turned into labels by [`notify_labels`].
    pub notify: Vec<String>,
    /// The `summary` annotation.
    pub summary: Option<String>,
    /// The `description` annotation.
    pub description: Option<String>,
    /// The `runbook_url` annotation.
    pub runbook_url: Option<String>,
    /// A built-in rule (possibly changed by forge.toml).
    pub builtin: bool,
}

/// The rules `config` exports, in order: the built-ins (with forge.toml's changes, without
/// those turned off), then forge.toml's own rules. Built-in rules' runbook links are
/// `<runbook_base>#<name>` unless forge.toml sets `runbook`.
///
/// With `[metrics] per_cron = false` the cron metrics have no `cron` label: the cron rules
/// then group by role and say so.
pub fn rules(config: &Config, runbook_base: &str) -> Vec<Rule> {
    let mut rules = Vec::new();
    for builtin in BUILTIN {
        let mut rule = Rule {
            name: builtin.name.to_owned(),
            expr: builtin.expr.to_owned(),
            for_: builtin.for_,
            severity: builtin.severity,
            notify: Vec::new(),
            summary: Some(builtin.summary.to_owned()),
            description: Some(builtin.description.to_owned()),
            runbook_url: Some(format!("{runbook_base}#{}", builtin.name)),
            builtin: true,
        };
        if !config.metrics.per_cron {
            per_role(&mut rule);
        }
        match config.alerts.iter().find(|a| a.name == builtin.name) {
            Some(change) if !change.enabled => continue,
            Some(change) => apply(&mut rule, change),
            None => {}
        }
        rules.push(rule);
    }
    for alert in &config.alerts {
        if !alert.enabled || is_builtin(&alert.name) {
            continue;
        }
        let mut rule = Rule {
            name: alert.name.clone(),
            expr: String::new(),
            for_: Duration::ZERO,
            severity: Severity::Warning,
            notify: Vec::new(),
            summary: None,
            description: None,
            runbook_url: None,
            builtin: false,
        };
        apply(&mut rule, alert);
        rules.push(rule);
    }
    rules
}

/// A built-in cron rule for cron metrics labelled by role only (`[metrics] per_cron = false`).
fn per_role(rule: &mut Rule) {
    rule.expr = rule.expr.replace("by (job, role, cron)", "by (job, role)");
    for text in [&mut rule.summary, &mut rule.description]
        .into_iter()
        .flatten()
    {
        *text = text
            .replace(
                "Cron {{ $labels.cron }}",
                "Crons of role {{ $labels.role }}:",
            )
            .replace(
                "the cron {{ $labels.cron }} (role {{ $labels.role }})",
                "crons of role {{ $labels.role }} (forge.cron_ticks says which: [metrics] per_cron = false)",
            );
    }
}

fn apply(rule: &mut Rule, alert: &AlertRule) {
    if let Some(condition) = &alert.condition {
        rule.expr = condition.trim().to_owned();
    }
    if let Some(for_) = alert.for_ {
        rule.for_ = for_;
    }
    if let Some(severity) = alert.severity {
        rule.severity = severity;
    }
    if let Some(notify) = &alert.notify {
        rule.notify = notify.clone();
    }
    for (field, value) in [
        (&mut rule.summary, &alert.summary),
        (&mut rule.description, &alert.description),
        (&mut rule.runbook_url, &alert.runbook),
    ] {
        if value.is_some() {
            *field = value.clone();
        }
    }
}

fn is_builtin(name: &str) -> bool {
    BUILTIN.iter().any(|b| b.name == name)
}

/// The Alertmanager routing labels of `notify` entries: `"pagerduty"` →
/// `notify_pagerduty = "true"`, `"slack:#ops"` → `notify_slack = "#ops"`, several targets of
/// one channel joined with `,` in sorted order.
pub fn notify_labels(notify: &[String]) -> BTreeMap<String, String> {
    let mut targets: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for entry in notify {
        let (channel, target) = entry.split_once(':').unwrap_or((entry, "true"));
        targets
            .entry(channel.trim())
            .or_default()
            .insert(target.trim());
    }
    targets
        .into_iter()
        .map(|(channel, targets)| {
            let targets: Vec<&str> = targets.into_iter().collect();
            (format!("notify_{channel}"), targets.join(","))
        })
        .collect()
}

/// The Prometheus rule file (`rule_files:`) of `config`: the built-in rules and forge.toml's
/// `[[alerts]]`, in one group `forge`, runbook links into `[alerting] runbook_base_url` (by
/// default the relative [`DEFAULT_RUNBOOK_BASE`]). The same config always gives the same
/// text. The repository ships the default config's export as
/// `deploy/prometheus/forge-alerts.yml`.
pub fn rules_yaml(config: &Config) -> String {
    rules_yaml_with(config, config.alerting.runbook_base())
}

/// [`rules_yaml`] with the built-in rules' runbook links into `runbook_base` (a URL of your
/// copy of `docs/runbook.md`; each rule's section is `#<name>`).
pub fn rules_yaml_with(config: &Config, runbook_base: &str) -> String {
    let mut out = String::new();
    out.push_str(
        "# Prometheus alerting rules for FORGE: the built-in rules and forge.toml's [[alerts]].\n\
         # Generated by forge::alerts::rules_yaml (`forge alerts export`): change forge.toml and\n\
         # export again rather than editing this file. Runbook: docs/runbook.md.\n\
         # notify = [\"channel:target\"] is the label notify_<channel>=\"<target>\" (\"true\" without a\n\
         # target), for Alertmanager routes to match.\n\
         groups:\n  - name: forge\n    rules:\n",
    );
    for rule in rules(config, runbook_base) {
        let _ = writeln!(out, "      - alert: {}", quote(&rule.name));
        let _ = writeln!(out, "        expr: {}", quote(&rule.expr));
        if !rule.for_.is_zero() {
            let _ = writeln!(out, "        for: {}", prometheus_duration(rule.for_));
        }
        out.push_str("        labels:\n");
        let _ = writeln!(out, "          severity: {}", quote(rule.severity.as_str()));
        for (label, value) in notify_labels(&rule.notify) {
            let _ = writeln!(out, "          {label}: {}", quote(&value));
        }
        let annotations = [
            ("summary", &rule.summary),
            ("description", &rule.description),
            ("runbook_url", &rule.runbook_url),
        ];
        if annotations.iter().any(|(_, value)| value.is_some()) {
            out.push_str("        annotations:\n");
            for (key, value) in annotations {
                if let Some(value) = value {
                    let _ = writeln!(out, "          {key}: {}", quote(value));
                }
            }
        }
    }
    out
}

/// A YAML double-quoted scalar.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A duration as Prometheus writes it (`1h30m`, `45s`, `500ms`); whole milliseconds.
fn prometheus_duration(duration: Duration) -> String {
    let mut ms = duration.as_millis();
    let mut out = String::new();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if ms >= size {
            let _ = write!(out, "{}{unit}", ms / size);
            ms %= size;
        }
    }
    if out.is_empty() { "0s".to_owned() } else { out }
}

/// Checks `[[alerts]]`; errors name the key (`alerts[<index>].<key>`) and, when `text` is the
/// file's, its line.
pub(crate) fn validate(alerts: &[AlertRule], text: &str, path: Option<&Path>) -> Result<()> {
    let error = |index: usize, key: &str, message: String| {
        let name = &alerts[index].name;
        Error::Config {
            path: path.map(Path::to_owned),
            line: line_of(text, index, key),
            key: format!("alerts[{index}].{key}"),
            message: if check_alert_name(name).is_err() {
                message
            } else {
                format!("alert `{name}`: {message}")
            },
        }
    };
    let mut seen = BTreeSet::new();
    for (index, alert) in alerts.iter().enumerate() {
        if let Err(message) = check_alert_name(&alert.name) {
            return Err(error(index, "name", message));
        }
        if !seen.insert(alert.name.as_str()) {
            return Err(error(
                index,
                "name",
                "another [[alerts]] entry has this name: names must be unique".into(),
            ));
        }
        let builtin = is_builtin(&alert.name);
        match &alert.condition {
            Some(condition) => {
                check_condition(condition).map_err(|message| error(index, "condition", message))?
            }
            None if !builtin && alert.enabled => {
                return Err(error(
                    index,
                    "condition",
                    "a condition (a PromQL expression) is required, unless the name is a built-in rule's".into(),
                ));
            }
            None => {}
        }
        if alert.severity.is_none() && !builtin && alert.enabled {
            return Err(error(
                index,
                "severity",
                "a severity is required (critical, warning or info), unless the name is a built-in rule's".into(),
            ));
        }
        if let Some(for_) = alert.for_
            && for_.subsec_nanos() % 1_000_000 != 0
        {
            return Err(error(
                index,
                "for",
                "Prometheus counts `for` in whole milliseconds".into(),
            ));
        }
        for entry in alert.notify.iter().flatten() {
            check_notify(entry, alert.notify.as_deref().unwrap_or_default())
                .map_err(|message| error(index, "notify", message))?;
        }
        for (key, value) in [
            ("summary", &alert.summary),
            ("description", &alert.description),
            ("runbook", &alert.runbook),
        ] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(error(index, key, "empty: leave the key out instead".into()));
            }
        }
    }
    Ok(())
}

/// Prometheus' rule for alert names (those of metrics): `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn check_alert_name(name: &str) -> std::result::Result<(), String> {
    let mut chars = name.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "invalid alert name {name:?}: use letters, digits, `_` and `:`, not starting with a digit (Prometheus' rule)"
        ))
    }
}

/// A non-empty expression whose brackets and quotes are balanced (Prometheus checks the rest:
/// `promtool check rules`).
fn check_condition(condition: &str) -> std::result::Result<(), String> {
    if condition.trim().is_empty() {
        return Err("empty: a PromQL expression is required".into());
    }
    let mut open: Vec<char> = Vec::new();
    let mut quote: Option<char> = None;
    let mut chars = condition.chars();
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            if c == '\\' && q != '`' {
                chars.next();
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '#' => {
                // A comment, to the end of the line.
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '(' | '[' | '{' => open.push(c),
            ')' | ']' | '}' => {
                let expected = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                if open.pop() != Some(expected) {
                    return Err(format!(
                        "not a PromQL expression: `{c}` closes nothing in {condition:?}"
                    ));
                }
            }
            _ => {}
        }
    }
    if let Some(q) = quote {
        return Err(format!(
            "not a PromQL expression: the string opened with {q} is not closed in {condition:?}"
        ));
    }
    if let Some(c) = open.pop() {
        return Err(format!(
            "not a PromQL expression: `{c}` is not closed in {condition:?}"
        ));
    }
    Ok(())
}

/// `channel` or `channel:target`, the channel usable in a label name.
fn check_notify(entry: &str, all: &[String]) -> std::result::Result<(), String> {
    let (channel, target) = match entry.split_once(':') {
        Some((channel, target)) => (channel.trim(), Some(target.trim())),
        None => (entry.trim(), None),
    };
    let mut chars = channel.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!(
            "invalid entry {entry:?}: use \"channel\" or \"channel:target\" (such as \"pagerduty\" or \"slack:#ops\"), the channel made of letters, digits and `_` (it becomes the label notify_<channel>)"
        ));
    }
    if target.is_some_and(str::is_empty) {
        return Err(format!(
            "invalid entry {entry:?}: the target after `:` is empty"
        ));
    }
    let bare = all.iter().any(|e| e.trim() == channel);
    let targeted = all
        .iter()
        .any(|e| e.split_once(':').is_some_and(|(c, _)| c.trim() == channel));
    if bare && targeted {
        return Err(format!(
            "both {channel:?} and {channel:?} with a target: give every entry of the channel a target, or none"
        ));
    }
    Ok(())
}

/// The line of `key` in the `index`th `[[alerts]]` table of `text` (its header when the key
/// is not set there).
fn line_of(text: &str, index: usize, key: &str) -> Option<usize> {
    let root = toml::de::DeTable::parse(text).ok()?;
    let entry = root.get_ref().get("alerts")?.get_ref().get(index)?;
    let offset = entry
        .get_ref()
        .as_table()
        .and_then(|table| {
            table
                .iter()
                .find(|(k, _)| k.get_ref() == key)
                .map(|(k, _)| k.span().start)
        })
        .unwrap_or(entry.span().start);
    Some(text[..offset.min(text.len())].matches('\n').count() + 1)
}

/// Names the key of a TOML error located in an `[[alerts]]` entry: `alerts[<index>].<key>`.
pub(crate) fn refine_toml_error(error: Error, toml_error: &toml::de::Error, text: &str) -> Error {
    let Error::Config {
        path,
        line,
        key,
        message,
    } = error
    else {
        return error;
    };
    let refined = toml_error.span().and_then(|span| {
        let root = toml::de::DeTable::parse(text).ok()?;
        let entries = root.get_ref().get("alerts")?.get_ref().as_array()?;
        // The entry is the last one that starts before the error (an entry's span may cover
        // its `[[alerts]]` header only).
        let (index, entry) = entries
            .iter()
            .enumerate()
            .take_while(|(_, entry)| entry.span().start <= span.start)
            .last()?;
        let field = entry.get_ref().as_table()?.iter().find_map(|(k, v)| {
            (k.span().contains(&span.start) || v.span().contains(&span.start))
                .then(|| k.get_ref().to_string())
        });
        match field {
            Some(field) => Some(format!("alerts[{index}].{field}")),
            None => entry
                .span()
                .contains(&span.start)
                .then(|| format!("alerts[{index}]")),
        }
    });
    Error::Config {
        path,
        line,
        key: refined.unwrap_or(key),
        message,
    }
}

/// Serde adapter for an optional human duration.
mod opt_duration {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => forge_core::config::duration::serialize(value, s),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        forge_core::config::duration::deserialize(d).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_written_as_prometheus_reads_them() {
        assert_eq!(prometheus_duration(Duration::from_secs(30)), "30s");
        assert_eq!(prometheus_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(prometheus_duration(Duration::from_millis(1500)), "1s500ms");
        assert_eq!(prometheus_duration(Duration::from_secs(86_400 * 2)), "2d");
    }

    #[test]
    fn strings_are_quoted_for_yaml() {
        assert_eq!(quote("a \"b\" \\ c\nd"), r#""a \"b\" \\ c\nd""#);
        assert_eq!(quote("{role='x'}"), r#""{role='x'}""#);
    }

    #[test]
    fn notify_becomes_one_label_per_channel() {
        let labels = notify_labels(&["pagerduty".into(), "slack:#ops".into(), "slack:#db".into()]);
        assert_eq!(labels["notify_pagerduty"], "true");
        assert_eq!(labels["notify_slack"], "#db,#ops");
    }

    #[test]
    fn conditions_must_be_balanced() {
        assert!(check_condition("sum(rate(x[5m])) > 1").is_ok());
        assert!(check_condition("x{a=\")\"} > 1 # (comment").is_ok());
        assert!(check_condition("sum(x").is_err());
        assert!(check_condition("x]").is_err());
        assert!(check_condition("x{a='b}").is_err());
        assert!(check_condition("  ").is_err());
    }

    #[test]
    fn builtin_names_are_valid_and_unique() {
        let mut names = BTreeSet::new();
        for builtin in BUILTIN {
            check_alert_name(builtin.name).unwrap();
            check_condition(builtin.expr).unwrap();
            assert!(names.insert(builtin.name), "{}", builtin.name);
        }
    }
}
