//! The rules a configuration exports, and the Prometheus rule file that holds them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use crate::builtin::{BUILTIN, is_builtin};
use crate::{AlertRule, DEFAULT_RUNBOOK_BASE, Severity};

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

/// The Prometheus rule file (`rule_files:`) a configuration exports: FORGE's built-in rules
/// with forge.toml's changes, then forge.toml's own `[[alerts]]`, in one group `forge`. The
/// facade builds it from a whole configuration (`forge::Config::alert_rules`); here it is
/// made of its parts.
///
/// ```
/// use forge_alerts::{AlertRule, RuleFile};
///
/// let mut mine = AlertRule::new("forge_leader_failover");
/// mine.enabled = false; // a built-in rule turned off
/// let yaml = RuleFile::new(std::slice::from_ref(&mine))
///     .runbook_base("https://runbooks.example.com/forge.md")
///     .to_yaml();
/// assert!(yaml.contains("- alert: \"forge_no_leader\""));
/// assert!(!yaml.contains("forge_leader_failover\""));
/// assert!(yaml.contains("https://runbooks.example.com/forge.md#forge_no_leader"));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RuleFile<'a> {
    alerts: &'a [AlertRule],
    runbook_base: &'a str,
    per_cron: bool,
}

impl<'a> RuleFile<'a> {
    /// The built-in rules changed and completed by `alerts` (forge.toml's `[[alerts]]`), the
    /// runbook links into [`DEFAULT_RUNBOOK_BASE`], the cron rules per cron.
    pub fn new(alerts: &'a [AlertRule]) -> RuleFile<'a> {
        RuleFile {
            alerts,
            runbook_base: DEFAULT_RUNBOOK_BASE,
            per_cron: true,
        }
    }

    /// Where the built-in rules' runbook links point: `<runbook_base>#<rule name>` (forge.toml's
    /// `[alerting] runbook_base_url`, a URL of your copy of `docs/src/runbook.md`).
    pub fn runbook_base(mut self, runbook_base: &'a str) -> RuleFile<'a> {
        self.runbook_base = runbook_base;
        self
    }

    /// Whether the cron metrics carry a `cron` label (`[metrics] per_cron`, default yes).
    /// Without it the cron rules group by role and say so.
    pub fn per_cron(mut self, per_cron: bool) -> RuleFile<'a> {
        self.per_cron = per_cron;
        self
    }

    /// The rules, in export order: the built-ins (with forge.toml's changes, without those
    /// turned off), then forge.toml's own rules. Built-in rules' runbook links are
    /// `<runbook_base>#<name>` unless forge.toml sets `runbook`.
    pub fn rules(&self) -> Vec<Rule> {
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
                runbook_url: Some(format!("{}#{}", self.runbook_base, builtin.name)),
                builtin: true,
            };
            if !self.per_cron {
                per_role(&mut rule);
            }
            match self.alerts.iter().find(|a| a.name == builtin.name) {
                Some(change) if !change.enabled => continue,
                Some(change) => apply(&mut rule, change),
                None => {}
            }
            rules.push(rule);
        }
        for alert in self.alerts {
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

    /// The rule file as YAML, for Prometheus' `rule_files:` (`forge alerts export`). The same
    /// rules always give the same text. The repository ships the default configuration's as
    /// `deploy/prometheus/forge-alerts.yml`.
    pub fn to_yaml(&self) -> String {
        yaml(&self.rules())
    }
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

/// The rule file's text: a header, then one group `forge` of `rules`. Written by hand (a
/// fixed shape: every value is a double-quoted scalar, escaped by [`quote`], or a duration)
/// rather than with a YAML crate: serde_yaml is unmaintained, and promtool checks the output
/// in the tests.
fn yaml(rules: &[Rule]) -> String {
    let mut out = String::new();
    out.push_str(
        "# Prometheus alerting rules for FORGE: the built-in rules and forge.toml's [[alerts]].\n\
         # Generated by `forge alerts export` (forge::Config::alert_rules): change forge.toml and\n\
         # export again rather than editing this file. Runbook: docs/src/runbook.md.\n\
         # notify = [\"channel:target\"] is the label notify_<channel>=\"<target>\" (\"true\" without a\n\
         # target), for Alertmanager routes to match.\n\
         groups:\n  - name: forge\n    rules:\n",
    );
    for rule in rules {
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
}
