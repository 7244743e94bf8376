//! Alert rules: `[[alerts]]` in forge.toml, the built-in rule set, the exported Prometheus rule
//! file, the shipped copy of it (`deploy/prometheus/forge-alerts.yml`) and its promtool unit
//! tests (`deploy/prometheus/forge-alerts.test.yml`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use forge::Config;
use forge::alerts::{BUILTIN, Severity};
use forge::config_sections::no_env;

use crate::support::tools_present;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn shipped_rules() -> PathBuf {
    repo().join("deploy/prometheus/forge-alerts.yml")
}

fn parse(text: &str) -> forge::Result<Config> {
    Config::parse(text, Some(Path::new("forge.toml")), &no_env)
}

fn parse_err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

/// The FORGE seed's `[[alerts]]`, exactly as its users write them.
const SEED: &str = r#"
[[alerts]]
name = "no_scheduler_leader"
condition = "sum(forge_leader_is_leader{role='scheduler'}) == 0"
for = "30s"
severity = "critical"
notify = ["pagerduty"]

[[alerts]]
name = "frequent_failovers"
condition = "rate(forge_leader_failovers_total[5m]) > 5"
severity = "warning"
notify = ["slack:#ops"]
"#;

#[test]
fn the_seeds_alerts_parse_and_export_with_routing_labels() {
    let config = parse(SEED).unwrap();
    assert_eq!(config.alerts.len(), 2);
    let first = &config.alerts[0];
    assert_eq!(first.name, "no_scheduler_leader");
    assert_eq!(
        first.condition.as_deref(),
        Some("sum(forge_leader_is_leader{role='scheduler'}) == 0")
    );
    assert_eq!(first.for_, Some(Duration::from_secs(30)));
    assert_eq!(first.severity, Some(Severity::Critical));
    assert_eq!(first.notify.as_deref(), Some(&["pagerduty".to_owned()][..]));
    assert_eq!(config.alerts[1].for_, None);

    let yaml = config.alert_rules().to_yaml();
    for expected in [
        "      - alert: \"no_scheduler_leader\"\n        expr: \"sum(forge_leader_is_leader{role='scheduler'}) == 0\"\n        for: 30s\n        labels:\n          severity: \"critical\"\n          notify_pagerduty: \"true\"\n",
        "      - alert: \"frequent_failovers\"\n        expr: \"rate(forge_leader_failovers_total[5m]) > 5\"\n        labels:\n          severity: \"warning\"\n          notify_slack: \"#ops\"\n",
    ] {
        assert!(yaml.contains(expected), "missing\n{expected}\nin\n{yaml}");
    }
    // The user's rules come after every built-in one, which stay.
    for builtin in BUILTIN {
        assert!(
            yaml.contains(&format!("- alert: \"{}\"\n", builtin.name)),
            "{yaml}"
        );
    }
    assert!(
        yaml.find("forge_db_reconnect_storm").unwrap() < yaml.find("no_scheduler_leader").unwrap()
    );
    assert_eq!(
        yaml,
        parse(SEED).unwrap().alert_rules().to_yaml(),
        "deterministic"
    );
    // The config shows them again as TOML that parses to the same.
    assert_eq!(parse(&config.to_string()).unwrap().alerts, config.alerts);
}

#[test]
fn a_rule_named_like_a_builtin_changes_it_and_enabled_false_drops_it() {
    let config = parse(
        r#"
[[alerts]]
name = "forge_nodes_drifted"
for = "10m"
notify = ["slack:#ops", "slack:#db", "pagerduty"]
runbook = "https://wiki.example.com/forge#drift"

[[alerts]]
name = "forge_leader_failover"
enabled = false
"#,
    )
    .unwrap();
    let rules = config.alert_rules().rules();
    assert_eq!(rules.len(), BUILTIN.len() - 1);
    assert!(rules.iter().all(|r| r.name != "forge_leader_failover"));
    let drifted = rules
        .iter()
        .find(|r| r.name == "forge_nodes_drifted")
        .unwrap();
    let builtin = BUILTIN
        .iter()
        .find(|b| b.name == "forge_nodes_drifted")
        .unwrap();
    assert_eq!(drifted.expr, builtin.expr, "kept");
    assert_eq!(drifted.severity, builtin.severity, "kept");
    assert_eq!(drifted.for_, Duration::from_secs(600));
    assert_eq!(
        drifted.runbook_url.as_deref(),
        Some("https://wiki.example.com/forge#drift")
    );
    let yaml = config
        .alert_rules()
        .runbook_base("https://runbooks.example.com/forge.md")
        .to_yaml();
    assert!(
        yaml.contains("        for: 10m\n        labels:\n          severity: \"warning\"\n          notify_pagerduty: \"true\"\n          notify_slack: \"#db,#ops\"\n"),
        "{yaml}"
    );
    assert!(
        yaml.contains("runbook_url: \"https://runbooks.example.com/forge.md#forge_no_leader\""),
        "{yaml}"
    );
}

#[test]
fn bad_alerts_name_the_key_and_the_line() {
    // A missing key is reported at its entry's `[[alerts]]` line (3).
    let rule = |body: &str| format!("[metrics]\n\n[[alerts]]\n{body}\n");
    let cases: &[(&str, &str, &str)] = &[
        (
            "name = \"1st\"\ncondition = \"up == 0\"\nseverity = \"info\"",
            "forge.toml:4: `alerts[0].name`",
            "invalid alert name \"1st\"",
        ),
        (
            "name = \"no leader\"\ncondition = \"up == 0\"\nseverity = \"info\"",
            "forge.toml:4: `alerts[0].name`",
            "Prometheus",
        ),
        (
            "name = \"x\"\nseverity = \"info\"",
            "forge.toml:3: `alerts[0].condition`",
            "condition (a PromQL expression) is required",
        ),
        (
            "name = \"x\"\ncondition = \"  \"\nseverity = \"info\"",
            "forge.toml:5: `alerts[0].condition`",
            "empty",
        ),
        (
            "name = \"x\"\ncondition = \"sum(up == 0\"\nseverity = \"info\"",
            "forge.toml:5: `alerts[0].condition`",
            "`(` is not closed",
        ),
        (
            "name = \"x\"\ncondition = \"up == 0\"",
            "forge.toml:3: `alerts[0].severity`",
            "critical, warning or info",
        ),
        (
            "name = \"x\"\ncondition = \"up == 0\"\nseverity = \"fatal\"",
            "forge.toml:6: `alerts[0].severity`",
            "`critical`, `warning`",
        ),
        (
            "name = \"x\"\ncondition = \"up == 0\"\nseverity = \"info\"\nfor = \"half a minute\"",
            "forge.toml:7: `alerts[0].for`",
            "\"5s\"",
        ),
        (
            "name = \"x\"\ncondition = \"up == 0\"\nseverity = \"info\"\nnotify = [\"slack #ops\"]",
            "forge.toml:7: `alerts[0].notify`",
            "\"channel:target\"",
        ),
        (
            "name = \"x\"\ncondition = \"up == 0\"\nseverity = \"info\"\nnotify = [\"slack:\"]",
            "forge.toml:7: `alerts[0].notify`",
            "target after `:` is empty",
        ),
        (
            "name = \"x\"\ncondition = \"up == 0\"\nseverity = \"info\"\nsummry = \"typo\"",
            "forge.toml:7: `alerts[0].summry`",
            "unknown field `summry`",
        ),
    ];
    for (body, prefix, detail) in cases {
        let msg = parse_err(&rule(body));
        assert!(msg.starts_with(prefix), "{body:?}: {msg}");
        assert!(msg.contains(detail), "{body:?}: {msg}");
    }
    let msg = parse_err(
        "[[alerts]]\nname = \"x\"\ncondition = \"up == 0\"\nseverity = \"info\"\n\n[[alerts]]\nname = \"x\"\ncondition = \"up == 1\"\nseverity = \"info\"\n",
    );
    assert!(msg.starts_with("forge.toml:7: `alerts[1].name`"), "{msg}");
    assert!(msg.contains("unique"), "{msg}");
    // An error in a section after the entries is not theirs.
    let msg = parse_err(
        "[[alerts]]\nname = \"x\"\ncondition = \"up == 0\"\nseverity = \"info\"\n\n[cron]\nmisfire = \"1s\"\n",
    );
    assert!(msg.starts_with("forge.toml:7: `cron.misfire`"), "{msg}");
    let msg = parse_err("[[alerts]]\ncondition = \"up == 0\"\nseverity = \"info\"\n");
    assert!(msg.contains("missing field `name`"), "{msg}");
    // A config built in code is checked too.
    let mut config = Config::default();
    config
        .alerts
        .push(forge::alerts::AlertRule::new("no_condition"));
    let msg = config.validate().unwrap_err().to_string();
    assert!(msg.contains("alerts[0].condition"), "{msg}");
}

/// `deploy/prometheus/forge-alerts.yml` is what `forge alerts export` writes for the default
/// config. After changing the built-in rules, rewrite it with
/// `FORGE_BLESS=1 cargo test -p forge-tests --test it -- alerts::`.
#[test]
fn the_shipped_rule_file_is_the_export_of_the_default_config() {
    let exported = Config::default().alert_rules().to_yaml();
    let path = shipped_rules();
    if std::env::var_os("FORGE_BLESS").is_some() {
        std::fs::write(&path, &exported).unwrap();
    }
    let shipped = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        shipped == exported,
        "{} differs from Config::default().alert_rules().to_yaml(); rewrite it with \
         `FORGE_BLESS=1 cargo test -p forge-tests --test it -- alerts::` (and update its promtool \
         tests). The export:\n{exported}",
        path.display()
    );
}

/// Every built-in rule reads only metrics FORGE defines, and has a runbook section.
#[test]
fn builtin_rules_use_real_metrics_and_have_a_runbook_section() {
    let mut defined = BTreeSet::new();
    for source in [
        "forge-core/src/metrics.rs",
        "forge-scheduler/src/metrics.rs",
    ] {
        let text = std::fs::read_to_string(repo().join(source)).unwrap();
        for (i, _) in text.match_indices("MetricDef::") {
            let rest = &text[i..];
            let kind = &rest["MetricDef::".len()..rest.find('(').unwrap()];
            let name = rest.split('"').nth(1).unwrap();
            defined.insert(name.to_owned());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    defined.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    assert!(defined.contains("forge_leader_is_leader"), "{defined:?}");
    let runbook = std::fs::read_to_string(repo().join("docs/src/runbook.md")).unwrap();
    for builtin in BUILTIN {
        let mut used = 0;
        for (i, _) in builtin.expr.match_indices("forge_") {
            let name: String = builtin.expr[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                defined.contains(&name),
                "{}: {name} is not a metric FORGE exports",
                builtin.name
            );
            used += 1;
        }
        assert!(used > 0, "{}", builtin.name);
        assert!(
            runbook.contains(&format!("\n## {}\n", builtin.name)),
            "docs/src/runbook.md has no section `## {}`",
            builtin.name
        );
        assert!(!builtin.summary.is_empty() && !builtin.description.is_empty());
    }
}

/// Whether promtool (Debian package `prometheus`) is on PATH (see [`tools_present`]).
fn promtool_present() -> bool {
    let found = Command::new("promtool").arg("--version").output().is_ok();
    let missing: &[(&str, &str)] = if found {
        &[]
    } else {
        &[("promtool", "prometheus")]
    };
    tools_present(missing, "the alert rule checks")
}

/// Runs promtool.
fn promtool(args: &[&str]) -> String {
    let output = match Command::new("promtool").args(args).output() {
        Ok(output) => output,
        Err(err) => panic!(
            "cannot run promtool ({err}): the alert rule tests need it on PATH. Install the \
             Debian package `prometheus` (`apt-get install prometheus`; .ci/run does it), or \
             get promtool from https://prometheus.io/download/"
        ),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "promtool {} failed:\n{text}",
        args.join(" ")
    );
    text
}

#[test]
fn promtool_checks_and_unit_tests_the_shipped_rules() {
    if !promtool_present() {
        return;
    }
    let dir = repo().join("deploy/prometheus");
    let rules = dir.join("forge-alerts.yml");
    let tests = dir.join("forge-alerts.test.yml");
    let checked = promtool(&["check", "rules", rules.to_str().unwrap()]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", BUILTIN.len())),
        "{checked}"
    );
    promtool(&["test", "rules", tests.to_str().unwrap()]);
}

#[test]
fn promtool_accepts_the_export_of_user_rules() {
    if !promtool_present() {
        return;
    }
    let config = parse(&format!(
        "{SEED}\n[[alerts]]\nname = \"queue_stuck\"\ncondition = '''\nmax by (queue) (\n  forge_job_oldest_age_seconds{{queue=\"mail\\\\ers\"}}\n) > 60'''\nfor = \"1m 30s\"\nseverity = \"info\"\nsummary = 'Queue {{{{ $labels.queue }}}} is \"stuck\"'\ndescription = \"line one\\nline two\"\nrunbook = \"https://wiki.example.com/q?a=1&b=2\"\n"
    ))
    .unwrap();
    let dir = std::env::temp_dir().join(format!("forge-alerts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.yml");
    let yaml = config.alert_rules().to_yaml();
    assert!(yaml.contains("        for: 1m30s\n"), "{yaml}");
    std::fs::write(&file, &yaml).unwrap();
    let checked = promtool(&["check", "rules", file.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", BUILTIN.len() + 3)),
        "{checked}"
    );
}

/// `[alerting] runbook_base_url` makes every built-in rule's runbook link absolute (a relative
/// `docs/src/runbook.md#...` opens from nowhere an alert is read: Alertmanager, PagerDuty, Slack);
/// a rule's own `runbook` still wins; anything but an absolute http(s) URL without a fragment
/// is refused at its line.
#[test]
fn runbook_base_url_makes_the_runbook_links_absolute() {
    let base = "https://github.com/acme/app/blob/main/docs/src/runbook.md";
    let config = parse(&format!(
        "[alerting]\nrunbook_base_url = \"{base}\"\n{SEED}\n[[alerts]]\nname = \"forge_nodes_drifted\"\nrunbook = \"https://wiki.example.com/drift\"\n"
    ))
    .unwrap();
    let yaml = config.alert_rules().to_yaml();
    for builtin in BUILTIN {
        let link = if builtin.name == "forge_nodes_drifted" {
            "https://wiki.example.com/drift".to_owned()
        } else {
            format!("{base}#{}", builtin.name)
        };
        assert!(
            yaml.contains(&format!("runbook_url: \"{link}\"\n")),
            "{}: {yaml}",
            builtin.name
        );
    }
    assert!(!yaml.contains("\"docs/src/runbook.md"), "{yaml}");
    // Without it, the links stay relative (the shipped file).
    assert!(
        Config::default()
            .alert_rules()
            .to_yaml()
            .contains("runbook_url: \"docs/src/runbook.md#forge_no_leader\"")
    );

    for (value, detail) in [
        ("docs/src/runbook.md", "not an absolute http(s) URL"),
        ("https://", "not an absolute http(s) URL"),
        ("ftp://example.com/runbook", "not an absolute http(s) URL"),
        (
            "https://example.com/run book.md",
            "not an absolute http(s) URL",
        ),
        ("https://example.com/runbook.md#top", "fragment"),
    ] {
        let msg = parse_err(&format!(
            "[cron]\nclaim_ahead = \"50ms\"\n\n[alerting]\nrunbook_base_url = \"{value}\"\n"
        ));
        assert!(
            msg.starts_with("forge.toml:5: `alerting.runbook_base_url`"),
            "{value}: {msg}"
        );
        assert!(msg.contains(detail), "{value}: {msg}");
    }
}

/// With `[metrics] per_cron = false` the cron metrics carry no `cron` label: the cron rules
/// group by role (grouping by a label no series has would name no cron and read "Cron  runs
/// fail") and promtool accepts them.
#[test]
fn the_cron_rules_group_by_role_without_per_cron_series() {
    let config = parse("[metrics]\nper_cron = false\n").unwrap();
    let yaml = config.alert_rules().to_yaml();
    assert!(!yaml.contains("cron)"), "{yaml}");
    assert!(!yaml.contains("$labels.cron"), "{yaml}");
    assert!(
        yaml.contains(
            "sum by (job, role) (increase(forge_cron_runs_total{outcome=~\\\"failed|timed_out|abandoned\\\"}[1h])) >= 1"
        ),
        "{yaml}"
    );
    assert!(
        yaml.contains("summary: \"Crons of role {{ $labels.role }}: runs fail\""),
        "{yaml}"
    );
    if !promtool_present() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("forge-alerts-per-role-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.yml");
    std::fs::write(&file, &yaml).unwrap();
    let checked = promtool(&["check", "rules", file.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", BUILTIN.len())),
        "{checked}"
    );
}
