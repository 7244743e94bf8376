//! Prometheus metrics: one registry per node, every FORGE metric described once here.
//!
//! Each node owns its registry rather than using the process-global recorder, so several nodes
//! in one process (tests, embedded clusters) keep separate figures. The registry is served on
//! `[metrics] listen` and rendered by [`Metrics::render`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::error::{Error, Result};

/// Every FORGE metric: name, kind, unit, help. The single place metric names are spelled.
const DESCRIPTIONS: &[(&str, Kind, Option<Unit>, &str)] = &[
    (
        "forge_leader_is_leader",
        Kind::Gauge,
        None,
        "1 while this node leads the role, else 0",
    ),
    (
        "forge_leader_elections_total",
        Kind::Counter,
        None,
        "Leaderships of the role won by this node",
    ),
    (
        "forge_leader_failovers_total",
        Kind::Counter,
        None,
        "Leaderships won by this node from a leader that did not hand over (crashed, frozen or cut off)",
    ),
    (
        "forge_leader_losses_total",
        Kind::Counter,
        None,
        "Leaderships of this node that ended, by reason",
    ),
    (
        "forge_leader_tenure_seconds",
        Kind::Gauge,
        Some(Unit::Seconds),
        "How long this node has held the role (0 when not leader)",
    ),
    (
        "forge_leader_epoch",
        Kind::Gauge,
        None,
        "The role's current epoch (fencing token) as last seen by this node",
    ),
    (
        "forge_leader_handoff_seconds",
        Kind::Histogram,
        Some(Unit::Seconds),
        "Graceful handoff: time from the stop request to the lock release, drain included",
    ),
    (
        "forge_leader_lock_conflicts_total",
        Kind::Counter,
        None,
        "Lock waits that found the role's key held by a session that is not a FORGE node",
    ),
    (
        "forge_db_reconnects_total",
        Kind::Counter,
        None,
        "Reconnections of this node's dedicated sessions, by session",
    ),
    (
        "forge_cron_lag_seconds",
        Kind::Histogram,
        Some(Unit::Seconds),
        "How late a cron run started: actual start minus scheduled instant",
    ),
    (
        "forge_cron_runs_total",
        Kind::Counter,
        None,
        "Cron runs by outcome (succeeded, failed, timed_out, skipped, abandoned)",
    ),
    (
        "forge_cron_missed_ticks_total",
        Kind::Counter,
        None,
        "Cron ticks not run because they were due while the role had no leader (per catch-up policy)",
    ),
    (
        "forge_cron_run_duration_seconds",
        Kind::Histogram,
        Some(Unit::Seconds),
        "How long cron runs took",
    ),
    (
        "forge_cron_unknown_crons",
        Kind::Gauge,
        None,
        "Crons of the role known to the cluster (forge.crons) that this leader's binary lacks: their ticks do not run",
    ),
];

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Buckets for the `_seconds` histograms: from a millisecond to five minutes.
const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

static METADATA: Metadata<'static> = Metadata::new("forge", Level::INFO, Some(module_path!()));

/// A node's metrics registry. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// A registry that is only rendered on demand (no HTTP listener).
    pub fn new() -> Metrics {
        Metrics::from_recorder(builder().build_recorder())
    }

    /// A registry served on `listen` (`GET /metrics`). Must be called inside a tokio runtime;
    /// fails if the address cannot be bound.
    pub fn serve(listen: SocketAddr) -> Result<Metrics> {
        let (recorder, exporter) = builder()
            .with_http_listener(listen)
            .build()
            .map_err(|err| Error::Metrics {
                listen: listen.to_string(),
                message: format!(
                    "{err}; choose a free address in [metrics] listen or FORGE_METRICS_LISTEN"
                ),
            })?;
        tokio::spawn(async move {
            if let Err(err) = exporter.await {
                tracing::error!(target: "forge::metrics", %listen, error = ?err, "metrics endpoint stopped");
            }
        });
        Ok(Metrics::from_recorder(recorder))
    }

    fn from_recorder(recorder: PrometheusRecorder) -> Metrics {
        for (name, kind, unit, help) in DESCRIPTIONS {
            let key = KeyName::from_const_str(name);
            let help = (*help).into();
            match kind {
                Kind::Counter => recorder.describe_counter(key, *unit, help),
                Kind::Gauge => recorder.describe_gauge(key, *unit, help),
                Kind::Histogram => recorder.describe_histogram(key, *unit, help),
            }
        }
        let handle = recorder.handle();
        Metrics {
            recorder: Arc::new(recorder),
            handle,
        }
    }

    /// Registers descriptions of metrics defined outside this crate (the scheduler's).
    pub fn describe(&self, descriptions: &[(&'static str, &'static str, &'static str)]) {
        for (name, kind, help) in descriptions {
            let key = KeyName::from_const_str(name);
            let unit = name.ends_with("_seconds").then_some(Unit::Seconds);
            match *kind {
                "counter" => self.recorder.describe_counter(key, unit, (*help).into()),
                "histogram" => self.recorder.describe_histogram(key, unit, (*help).into()),
                _ => self.recorder.describe_gauge(key, unit, (*help).into()),
            }
        }
    }

    /// A counter with labels.
    pub fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        self.recorder
            .register_counter(&key(name, labels), &METADATA)
    }

    /// A gauge with labels.
    pub fn gauge(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
        self.recorder.register_gauge(&key(name, labels), &METADATA)
    }

    /// A histogram with labels.
    pub fn histogram(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Histogram {
        self.recorder
            .register_histogram(&key(name, labels), &METADATA)
    }

    /// The registry in the Prometheus text format.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// Drains histogram buffers; the node calls it periodically.
    pub(crate) fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }

    pub(crate) const UPKEEP_EVERY: Duration = Duration::from_secs(5);
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn builder() -> PrometheusBuilder {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .expect("static, non-empty bucket list")
}

fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
    Key::from_parts(
        name,
        labels
            .iter()
            .map(|(k, v)| Label::new(*k, (*v).to_owned()))
            .collect::<Vec<_>>(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_described_metrics_with_labels() {
        let metrics = Metrics::new();
        metrics
            .gauge("forge_leader_is_leader", &[("role", "scheduler")])
            .set(1.0);
        metrics
            .counter("forge_leader_elections_total", &[("role", "scheduler")])
            .increment(2);
        let text = metrics.render();
        assert!(
            text.contains("# HELP forge_leader_is_leader 1 while this node leads the role"),
            "{text}"
        );
        assert!(
            text.contains("forge_leader_is_leader{role=\"scheduler\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("forge_leader_elections_total{role=\"scheduler\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn names_follow_prometheus_conventions() {
        for (name, kind, unit, _) in DESCRIPTIONS {
            assert!(name.starts_with("forge_"), "{name}");
            if matches!(kind, Kind::Counter) {
                assert!(name.ends_with("_total"), "{name}");
            }
            if unit.is_some() {
                assert!(name.ends_with("_seconds"), "{name}");
            }
        }
    }
}
