//! Prometheus alert rules: FORGE's built-in rule set plus forge.toml's `[[alerts]]`, exported
//! as a Prometheus rule file with [`Config::alert_rules`] (`forge alerts export`). They live in
//! the crate `forge-alerts`; see its documentation for `[[alerts]]`, `notify` routing labels
//! and grouping.
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = forge::Config::load("forge.toml")?;
//! std::fs::write("rules.yml", config.alert_rules().to_yaml())?;
//! # Ok(()) }
//! ```

pub use forge_alerts::{
    AlertRule, AlertingConfig, BUILTIN, Builtin, DEFAULT_RUNBOOK_BASE, Rule, RuleFile, Severity,
    notify_labels,
};

use crate::Config;

/// The Prometheus rule file of `config`.
#[deprecated(note = "use `config.alert_rules().to_yaml()`")]
pub fn rules_yaml(config: &Config) -> String {
    config.alert_rules().to_yaml()
}

/// [`rules_yaml`] with the built-in rules' runbook links into `runbook_base`.
#[deprecated(note = "use `config.alert_rules().runbook_base(base).to_yaml()`")]
pub fn rules_yaml_with(config: &Config, runbook_base: &str) -> String {
    config.alert_rules().runbook_base(runbook_base).to_yaml()
}

/// The rules `config` exports, with the built-in rules' runbook links into `runbook_base`.
#[deprecated(note = "use `config.alert_rules().runbook_base(base).rules()`")]
pub fn rules(config: &Config, runbook_base: &str) -> Vec<Rule> {
    config.alert_rules().runbook_base(runbook_base).rules()
}
