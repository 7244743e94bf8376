//! `config check FILE` and `alerts export`: no database needed.

use std::path::Path;

use forge::Config;
use forge::config_sections::no_env;
use serde_json::json;

use crate::args::Cli;
use crate::fail::{Fail, Outcome};
use crate::out;

/// Loads and validates a forge.toml; a broken one is a configuration error (exit 2) whose
/// message names the file, the key and the line.
pub(crate) fn check(file: &Path, env: bool, json: bool) -> Outcome {
    let config = if env {
        Config::load(file)
    } else {
        Config::load_with_env(file, &no_env)
    };
    let config = config?;
    let roles = match &config.node.roles {
        Some(roles) => out::list(roles),
        None => "every role this node's binary has work for ([node] roles unset)".to_owned(),
    };
    let tuned = config
        .jobs
        .queues
        .iter()
        .map(|(queue, tuning)| {
            let limits = &tuning.limits;
            match limits.is_empty() {
                true => format!("{queue} {}", config.jobs.concurrency(queue)),
                false => format!("{queue} {} ({limits})", config.jobs.concurrency(queue)),
            }
        })
        .chain([format!("others {}", config.jobs.default_concurrency)])
        .collect::<Vec<_>>()
        .join(", ");
    let queues = match &config.node.queues {
        Some(queues) => format!("{}; concurrency: {tuned}", out::list(queues)),
        None => format!(
            "every queue this node's binary declares, and those tuned ([node] queues unset); concurrency: {tuned}"
        ),
    };
    let database = match &config.database.url {
        Some(url) => forge::db::redact_url(url),
        None if env => "not set: set DATABASE_URL or [database] url".to_owned(),
        None => "not in the file (nodes take DATABASE_URL)".to_owned(),
    };
    let election = &config.cluster.leader_election;
    // The tokens are secrets: shown only as set (`<redacted>`) or not.
    let admin = config.admin.redacted();
    let access = match (&admin.listen, &admin.token, &admin.read_token) {
        (None, ..) => "not served ([admin] listen unset)".to_owned(),
        (Some(listen), token, read) => format!(
            "{listen}; writes {}; reads {}",
            if admin.read_only {
                "refused (read_only)"
            } else if token.is_some() {
                "need the token"
            } else {
                "refused (no token)"
            },
            if read.is_some() {
                "need the read token"
            } else {
                "open"
            }
        ),
    };
    if json {
        out::print_json(&json!({
            "file": file.display().to_string(),
            "ok": true,
            "database": config.database.url.as_deref().map(forge::db::redact_url),
            "namespace": config.cluster.lock_namespace,
            "roles": config.node.roles,
            "queues": config.node.queues,
            "concurrency": { "default": config.jobs.default_concurrency, "queues": config.jobs.queues },
            "lease_duration_ms": election.lease_duration.as_millis() as u64,
            "refresh_interval_ms": election.refresh_interval.as_millis() as u64,
            "admin": admin,
        }));
        return Ok(0);
    }
    outln!("{}: ok", file.display());
    out::print_fields(&[
        ("database", database),
        ("namespace", config.cluster.lock_namespace.clone()),
        ("roles", roles),
        ("queues", queues),
        ("admin", access),
        (
            "lease",
            format!(
                "{} (renewed every {})",
                humantime::format_duration(election.lease_duration),
                humantime::format_duration(election.refresh_interval)
            ),
        ),
    ]);
    Ok(0)
}

/// The Prometheus rule file for the configuration (`--config`, else the defaults with the
/// environment's overrides).
pub(crate) fn alerts_export(cli: &Cli, output: Option<&Path>, json: bool) -> Outcome {
    let config = match &cli.config {
        Some(path) => Config::load(path)?,
        None => Config::from_env()?,
    };
    let yaml = config.alert_rules().to_yaml();
    if let Some(path) = output {
        std::fs::write(path, &yaml)
            .map_err(|err| Fail::problem(format!("cannot write {}: {err}", path.display())))?;
    }
    if json {
        out::print_json(&json!({
            "file": output.map(|p| p.display().to_string()),
            "rules": yaml,
        }));
    } else if let Some(path) = output {
        outln!("wrote {}", path.display());
    } else {
        out!("{yaml}");
    }
    Ok(0)
}
