//! forge.toml's `[alerting]` and `[[alerts]]`: their types and their checks, with errors that
//! name the key (`alerts[<index>].<key>`) and the line.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use forge_core::config::ConfigSource;
use forge_core::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::DEFAULT_RUNBOOK_BASE;
use crate::builtin::is_builtin;

/// `[alerting]`: settings of the exported rule file as a whole (the rules themselves are
/// `[[alerts]]`, an array of tables, which is why this section has a name of its own).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct AlertingConfig {
    /// The absolute URL (`http://` or `https://`) of your copy of `docs/src/runbook.md`: the
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

    /// Checks `runbook_base_url` (an absolute http(s) URL without a fragment); errors name
    /// the key and, through `at`, the file and line.
    pub fn validate(&self, at: &ConfigSource<'_>) -> Result<()> {
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
                        "{url:?} is not an absolute http(s) URL: give the address your copy of docs/src/runbook.md is served at, such as \"https://github.com/acme/app/blob/main/docs/src/runbook.md\""
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
    /// labels (see the [crate](crate) documentation).
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

/// Checks forge.toml's `[[alerts]]`; errors name the key (`alerts[<index>].<key>`) and, when
/// `text` is the file's (read from `path`), its line. Called by the facade's `Config` on
/// every parse and validation.
pub fn validate(alerts: &[AlertRule], text: &str, path: Option<&Path>) -> Result<()> {
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

/// Names the key of a TOML error located in an `[[alerts]]` entry of `text`:
/// `alerts[<index>].<key>` (TOML's own error names only the array). The facade's `Config`
/// passes every parse error of forge.toml through it; other errors are returned as they are.
pub fn refine_toml_error(error: Error, toml_error: &toml::de::Error, text: &str) -> Error {
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
    use crate::BUILTIN;

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
