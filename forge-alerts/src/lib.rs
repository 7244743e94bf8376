//! # forge-alerts
//!
//! Prometheus alert rules for FORGE: the built-in rule set ([`BUILTIN`]) plus forge.toml's
//! `[[alerts]]` ([`AlertRule`]) and `[alerting]` ([`AlertingConfig`]), exported as a
//! Prometheus rule file ([`RuleFile`], `forge alerts export`). Users reach it as
//! `forge::alerts`, and export a configuration's rules with `forge::Config::alert_rules`
//! (`config.alert_rules().to_yaml()`); made of its parts, the default configuration's file is:
//!
//! ```
//! let yaml = forge_alerts::RuleFile::new(&[]).to_yaml();
//! assert!(yaml.contains("- alert: \"forge_no_leader\""));
//! ```
//!
//! In forge.toml:
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

mod builtin;
mod config;
mod rules;

pub use builtin::{BUILTIN, Builtin};
pub use config::{AlertRule, AlertingConfig, Severity, refine_toml_error, validate};
pub use rules::{Rule, RuleFile, notify_labels};

/// Where the built-in rules' `runbook_url` annotations point by default: the runbook in
/// FORGE's repository (`docs/src/runbook.md`, one section per rule, anchored by its name), a
/// relative link. Set `[alerting] runbook_base_url` (or [`RuleFile::runbook_base`]) to make
/// the links absolute, so that they open from Alertmanager, PagerDuty or Slack.
pub const DEFAULT_RUNBOOK_BASE: &str = "docs/src/runbook.md";
