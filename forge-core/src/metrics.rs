//! Prometheus metrics: one registry per node, and every metric defined once as a [`MetricDef`].
//!
//! Each node owns its registry rather than using the process-global recorder, so several nodes
//! in one process (tests, embedded clusters) keep separate figures. The registry is served on
//! `[metrics] listen` and rendered by [`Metrics::render`], with the process' own figures
//! (`process_*`) and `forge_build_info`. A metric's name is spelled in its definition only; code
//! records through handles built from the definition (once per label set where it is hot).
//!
//! The application's own metrics can share the endpoint: each render given to
//! [`Assembly::app_metrics`](crate::Assembly::app_metrics) adds its text after FORGE's, at
//! each scrape and in [`Metrics::render`].
//!
//! A series registered through a tenure's [`Leadership::metrics`](crate::Leadership::metrics)
//! is exported only while the tenure lasts, unless the node exports it too (a counter at 0
//! from the start): what only a leader measures (a cron's lag and durations, the cluster
//! gauges) is not left behind, frozen, on a node that no longer leads.

mod http;
mod process;
mod registry;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram};

use crate::error::{Error, Result};
use registry::{Owner, Registry, Scope};

/// What kind of metric a [`MetricDef`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up (`_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution (`_seconds`).
    Histogram,
}

/// A metric's definition: the one place its name and help are written.
#[derive(Debug)]
pub struct MetricDef {
    /// `forge_...`; counters end in `_total`, durations in `_seconds`.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// The `# HELP` text.
    pub help: &'static str,
}

impl MetricDef {
    /// A counter.
    pub const fn counter(name: &'static str, help: &'static str) -> MetricDef {
        MetricDef {
            name,
            kind: MetricKind::Counter,
            help,
        }
    }

    /// A gauge.
    pub const fn gauge(name: &'static str, help: &'static str) -> MetricDef {
        MetricDef {
            name,
            kind: MetricKind::Gauge,
            help,
        }
    }

    /// A histogram.
    pub const fn histogram(name: &'static str, help: &'static str) -> MetricDef {
        MetricDef {
            name,
            kind: MetricKind::Histogram,
            help,
        }
    }
}

/// The core's metrics.
pub mod defs {
    use super::MetricDef;

    /// `forge_leader_is_leader{role}`
    pub const IS_LEADER: MetricDef = MetricDef::gauge(
        "forge_leader_is_leader",
        "1 while this node leads the role, else 0",
    );
    /// `forge_leader_elections_total{role}`
    pub const ELECTIONS: MetricDef = MetricDef::counter(
        "forge_leader_elections_total",
        "Leaderships of the role won by this node",
    );
    /// `forge_leader_failovers_total{role}`
    pub const FAILOVERS: MetricDef = MetricDef::counter(
        "forge_leader_failovers_total",
        "Leaderships won by this node from a leader that did not hand over (crashed, frozen or cut off)",
    );
    /// `forge_leader_losses_total{role, reason}`
    pub const LOSSES: MetricDef = MetricDef::counter(
        "forge_leader_losses_total",
        "Leaderships of this node that ended, by reason",
    );
    /// `forge_leader_tenure_seconds{role}`
    pub const TENURE: MetricDef = MetricDef::gauge(
        "forge_leader_tenure_seconds",
        "How long this node has held the role (0 when not leader)",
    );
    /// `forge_leader_epoch{role}`
    pub const EPOCH: MetricDef = MetricDef::gauge(
        "forge_leader_epoch",
        "The role's current epoch (fencing token) as last seen by this node",
    );
    /// `forge_leader_handoff_seconds{role}`
    pub const HANDOFF: MetricDef = MetricDef::histogram(
        "forge_leader_handoff_seconds",
        "Graceful handoff: time from the stop request to the lock release, drain included",
    );
    /// `forge_leader_lock_conflicts_total{role}`
    pub const LOCK_CONFLICTS: MetricDef = MetricDef::counter(
        "forge_leader_lock_conflicts_total",
        "Lock waits that found the role's key held by a session that is not a FORGE node",
    );
    /// `forge_db_reconnects_total{session}`
    pub const RECONNECTS: MetricDef = MetricDef::counter(
        "forge_db_reconnects_total",
        "Reconnections of this node's dedicated sessions, by session",
    );
    /// `forge_cluster_nodes{state}`
    pub const CLUSTER_NODES: MetricDef = MetricDef::gauge(
        "forge_cluster_nodes",
        "Nodes of the cluster by state (active, drifted, down, stopped), as of the metrics_aggregator leader's last look (reported by that leader only)",
    );
    /// `forge_work_unserved{work, name}`
    pub const WORK_UNSERVED: MetricDef = MetricDef::gauge(
        "forge_work_unserved",
        "1 while work has nowhere to run: a queue (work=\"queue\") with jobs waiting that no live node works, or a role (work=\"role\") that live nodes have work for and none campaigns for; 0 once served again (reported by the metrics_aggregator leader only)",
    );
    /// `forge_compactor_pruned_total{table}`
    pub const PRUNED: MetricDef = MetricDef::counter(
        "forge_compactor_pruned_total",
        "Rows the log_compactor leader deleted by retention, by table (on the node that led it)",
    );

    /// `forge_build_info{version, git_sha}`
    pub const BUILD_INFO: MetricDef = MetricDef::gauge(
        "forge_build_info",
        "Always 1; its labels are the FORGE version this node runs and the git commit it was built from (unknown outside a git checkout)",
    );

    /// Every metric of the core.
    pub const ALL: &[&MetricDef] = &[
        &BUILD_INFO,
        &CLUSTER_NODES,
        &WORK_UNSERVED,
        &PRUNED,
        &IS_LEADER,
        &ELECTIONS,
        &FAILOVERS,
        &LOSSES,
        &TENURE,
        &EPOCH,
        &HANDOFF,
        &LOCK_CONFLICTS,
        &RECONNECTS,
    ];
}

/// Buckets for the `_seconds` histograms: from half a millisecond to five minutes.
const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// The git commit FORGE was built from (`forge-core/build.rs`), or `unknown`.
pub const GIT_SHA: &str = env!("FORGE_GIT_SHA");

/// A node's metrics registry, or a tenure's view of it. Cheap to clone.
///
/// Besides the Prometheus registry it holds the node's [`Tally`]: the counters the node
/// publishes to the cluster in its heartbeat.
#[derive(Clone)]
pub struct Metrics {
    shared: Arc<Shared>,
    /// A tenure's view: the series it registers go when the scope closes.
    scope: Option<Arc<Scope>>,
}

/// Renders the application's own metrics in the Prometheus text format (such as
/// `metrics_exporter_prometheus::PrometheusHandle::render`), called at each scrape.
pub(crate) type AppMetrics = Box<dyn Fn() -> String + Send + Sync>;

struct Shared {
    registry: Arc<Registry>,
    tally: Tally,
    /// The application's metrics, rendered after FORGE's.
    app: Vec<AppMetrics>,
    /// The scrape endpoint's task, if any (it ends with the registry).
    server: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Shared {
    /// FORGE's series, the process' figures and the application's text. A family must appear
    /// once in a scrape (Prometheus' Go parsers - promtool, federation - refuse a second
    /// `# TYPE` line for a name; the server keeps the first sample of a series and drops the
    /// others): the process figures the application's text declares too (the `metrics-process`
    /// crate exports the same names) are left to the application.
    fn render(&self) -> String {
        let app: Vec<String> = self.app.iter().map(|render| render()).collect();
        let mut out = String::with_capacity(4096 + app.iter().map(String::len).sum::<usize>());
        self.registry.render(&mut out);
        let declared: BTreeSet<&str> = app
            .iter()
            .flat_map(|text| declared_families(text))
            .collect();
        process::render(&mut out, &declared);
        for text in &app {
            out.push_str(text);
            if !text.is_empty() && !text.ends_with('\n') {
                out.push('\n');
            }
        }
        out
    }
}

/// The families a text in the Prometheus format declares (its `# TYPE` and `# HELP` lines).
fn declared_families(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter_map(|line| {
        let rest = line
            .strip_prefix("# TYPE ")
            .or_else(|| line.strip_prefix("# HELP "))?;
        rest.split_whitespace().next()
    })
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(server) = self.server.get_mut().ok().and_then(Option::take) {
            server.abort();
        }
    }
}

/// Counters a node publishes to the cluster: cumulative since the node started, sent with
/// heartbeats (`forge.nodes.tally`), turned into per-minute cluster series (`forge.stats`) by
/// the `metrics_aggregator` leader. Keys are a series and a label (a queue, a role): labels
/// are few whatever the workload (the scheduler counts cron runs by role, not by cron).
///
/// A heartbeat sends only the counters that changed since the previous one (merged into the
/// stored object; the values are cumulative, so a resend is harmless), and all of them after a
/// heartbeat that may not have landed.
#[derive(Clone, Default)]
pub struct Tally(Arc<Mutex<TallyCounters>>);

#[derive(Default)]
struct TallyCounters {
    /// Each counter, and whether it changed since the last heartbeat took it.
    values: BTreeMap<String, (f64, bool)>,
    /// The next heartbeat sends every counter (after one that may not have landed; at start
    /// every counter is a changed one anyway).
    send_all: bool,
    /// Where [`Tally::add`] spells a counter's key, so that adding to one that exists (every
    /// call but the first, several per round trip of a busy worker) allocates nothing.
    key: String,
}

impl Tally {
    fn counters(&self) -> std::sync::MutexGuard<'_, TallyCounters> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `value` to `series` for `label` (`|` is not allowed in either and is dropped).
    pub fn add(&self, series: &str, label: &str, value: f64) {
        let mut counters = self.counters();
        let TallyCounters { values, key, .. } = &mut *counters;
        key.clear();
        key.extend(series.chars().filter(|c| *c != '|'));
        key.push('|');
        key.extend(label.chars().filter(|c| *c != '|'));
        let entry = match values.get_mut(key.as_str()) {
            Some(entry) => entry,
            None => values.entry(key.clone()).or_default(),
        };
        entry.0 += value;
        entry.1 = true;
    }

    /// What a heartbeat sends: whether it is every counter (then it replaces the stored
    /// object) and the counters as `{"<series>|<label>": value}`, every one or those changed
    /// since the last heartbeat. Until
    /// [`Tally::sent`] says this one landed, the next sends every counter again.
    pub(crate) fn for_heartbeat(&self) -> (bool, serde_json::Value) {
        let mut counters = self.counters();
        let all = std::mem::replace(&mut counters.send_all, true);
        let object = if all {
            Self::object(counters.values.iter())
        } else {
            Self::object(counters.values.iter().filter(|(_, (_, changed))| *changed))
        };
        for (_, changed) in counters.values.values_mut() {
            *changed = false;
        }
        (all, object)
    }

    /// The heartbeat built by the last [`Tally::for_heartbeat`] landed.
    pub(crate) fn sent(&self) {
        self.counters().send_all = false;
    }

    fn object<'a>(
        counters: impl Iterator<Item = (&'a String, &'a (f64, bool))>,
    ) -> serde_json::Value {
        serde_json::Value::Object(
            counters
                .map(|(key, (value, _))| (key.clone(), (*value).into()))
                .collect(),
        )
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// A registry that is only rendered on demand (no HTTP listener).
    pub fn new() -> Metrics {
        Metrics::with_app_metrics(Vec::new())
    }

    /// A registry whose text is followed by the application's.
    pub(crate) fn with_app_metrics(app: Vec<AppMetrics>) -> Metrics {
        let metrics = Metrics {
            shared: Arc::new(Shared {
                registry: Arc::default(),
                tally: Tally::default(),
                app,
                server: Mutex::new(None),
            }),
            scope: None,
        };
        metrics.describe(defs::ALL);
        metrics
            .gauge(
                &defs::BUILD_INFO,
                &[("version", env!("CARGO_PKG_VERSION")), ("git_sha", GIT_SHA)],
            )
            .set(1.0);
        metrics
    }

    /// Serves the registry on `listen` (`GET /metrics`; any path answers) until the last clone
    /// of the registry is dropped. Must be called inside a tokio runtime, once; fails if the
    /// address cannot be bound.
    pub(crate) fn serve(&self, listen: SocketAddr) -> Result<()> {
        let server =
            http::serve(listen, Arc::downgrade(&self.shared)).map_err(|err| Error::Metrics {
                listen: listen.to_string(),
                message: format!(
                    "{err}; choose a free address in [metrics] listen or FORGE_METRICS_LISTEN"
                ),
            })?;
        *self.shared.server.lock().unwrap_or_else(|e| e.into_inner()) = Some(server);
        Ok(())
    }

    /// A view of this registry whose new series are exported until [`Metrics::close_scope`]
    /// (or until the last clone of the view is dropped): a tenure's.
    pub(crate) fn scoped(&self) -> Metrics {
        Metrics {
            shared: self.shared.clone(),
            scope: Some(Arc::new(Scope::new(self.shared.registry.clone()))),
        }
    }

    /// The node's registry itself, whatever view this is (a tenure's): what is registered
    /// through it is kept for the node's life - for clients that count on the node's behalf,
    /// such as a job client made in a cron handler.
    pub fn node_wide(&self) -> Metrics {
        Metrics {
            shared: self.shared.clone(),
            scope: None,
        }
    }

    /// Removes the series only this scope registered (nothing for the node's own registry);
    /// the view exports nothing new afterwards.
    pub(crate) fn close_scope(&self) {
        if let Some(scope) = &self.scope {
            scope.close();
        }
    }

    fn owner(&self) -> Owner<'_> {
        match &self.scope {
            Some(scope) => Owner::Scope(scope),
            None => Owner::Node,
        }
    }

    /// Registers the `# HELP` text of metrics (every crate describes its own).
    pub fn describe(&self, defs: &[&MetricDef]) {
        for def in defs {
            self.shared.registry.describe(def);
        }
    }

    /// A counter with labels.
    pub fn counter(&self, def: &MetricDef, labels: &[(&'static str, &str)]) -> Counter {
        debug_assert_eq!(def.kind, MetricKind::Counter, "{}", def.name);
        self.shared.registry.counter(def, labels, self.owner())
    }

    /// A gauge with labels.
    pub fn gauge(&self, def: &MetricDef, labels: &[(&'static str, &str)]) -> Gauge {
        debug_assert_eq!(def.kind, MetricKind::Gauge, "{}", def.name);
        self.shared.registry.gauge(def, labels, self.owner())
    }

    /// A histogram with labels.
    pub fn histogram(&self, def: &MetricDef, labels: &[(&'static str, &str)]) -> Histogram {
        debug_assert_eq!(def.kind, MetricKind::Histogram, "{}", def.name);
        self.shared.registry.histogram(def, labels, self.owner())
    }

    /// Exports a series before its first event: a counter at 0, a gauge at 0 unless it is
    /// set already, a histogram with empty buckets. Prometheus computes `increase()` and
    /// `rate()` from the samples it has, so a counter that first appears at 1 hides that first
    /// increment: every counter of a known label set is exported from the node's start (see
    /// [`Assembly::export_series`](crate::Assembly::export_series)). Idempotent: a series
    /// that exists keeps its value. `labels` must be in the order the recording code uses.
    pub fn export_zero(&self, def: &MetricDef, labels: &[(&'static str, &str)]) {
        match def.kind {
            MetricKind::Counter => drop(self.counter(def, labels)),
            MetricKind::Gauge => drop(self.gauge(def, labels)),
            MetricKind::Histogram => drop(self.histogram(def, labels)),
        }
    }

    /// The counters this node publishes to the cluster.
    pub fn tally(&self) -> &Tally {
        &self.shared.tally
    }

    /// The registry in the Prometheus text format (0.0.4), the process' figures and the
    /// application's metrics ([`Assembly::app_metrics`](crate::Assembly::app_metrics))
    /// included: what the endpoint serves. With many
    /// series this takes a while (10,000 crons: about 0.16 s on a cron's leader): call it off
    /// the async workers (`tokio::task::spawn_blocking`), as the endpoint does.
    pub fn render(&self) -> String {
        self.shared.render()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// The `session` label of a role's lock session in `forge_db_reconnects_total`.
pub(crate) fn lock_session(role: &crate::Role) -> String {
    format!("lock:{}", role.name())
}

/// Checks the naming conventions of a crate's definitions (each crate's tests call it).
pub fn check_conventions(defs: &[&MetricDef]) -> std::result::Result<(), String> {
    for def in defs {
        let ok = def.name.starts_with("forge_")
            && (def.kind != MetricKind::Counter || def.name.ends_with("_total"))
            && (def.kind != MetricKind::Histogram || def.name.ends_with("_seconds"));
        if !ok {
            return Err(format!("{} breaks the naming conventions", def.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_sends_the_changed_counters_and_all_of_them_after_one_that_did_not_land() {
        let tally = Tally::default();
        tally.add("cron_runs", "a", 1.0);
        tally.add("cron_runs", "b", 1.0);
        // At start every counter is a changed one.
        let (all, sent) = tally.for_heartbeat();
        assert_eq!(
            sent,
            serde_json::json!({"cron_runs|a": 1.0, "cron_runs|b": 1.0})
        );
        assert!(!all);
        tally.sent();
        tally.add("cron_runs", "a", 2.0);
        let (all, sent) = tally.for_heartbeat();
        assert_eq!(
            (all, sent),
            (false, serde_json::json!({"cron_runs|a": 3.0}))
        );
        // That one was lost: the next sends every counter, cumulative, to replace the object.
        tally.add("cron_runs", "b", 1.0);
        let (all, sent) = tally.for_heartbeat();
        assert!(
            all,
            "a heartbeat after one that did not land sends everything"
        );
        assert_eq!(
            sent,
            serde_json::json!({"cron_runs|a": 3.0, "cron_runs|b": 2.0})
        );
        tally.sent();
        let (all, sent) = tally.for_heartbeat();
        assert_eq!((all, sent), (false, serde_json::json!({})));
    }

    #[test]
    fn renders_described_metrics_with_labels() {
        let metrics = Metrics::new();
        metrics
            .gauge(&defs::IS_LEADER, &[("role", "scheduler")])
            .set(1.0);
        metrics
            .counter(&defs::ELECTIONS, &[("role", "scheduler")])
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
    fn exported_series_render_at_zero_and_keep_their_value() {
        let metrics = Metrics::new();
        let labels = [("role", "scheduler")];
        metrics
            .gauge(&defs::IS_LEADER, &[("role", "billing")])
            .set(1.0);
        metrics.export_zero(&defs::FAILOVERS, &labels);
        metrics.export_zero(&defs::IS_LEADER, &labels);
        metrics.export_zero(&defs::IS_LEADER, &[("role", "billing")]);
        metrics.export_zero(&defs::HANDOFF, &labels);
        let text = metrics.render();
        assert!(
            text.contains("forge_leader_failovers_total{role=\"scheduler\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("forge_leader_is_leader{role=\"scheduler\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("forge_leader_is_leader{role=\"billing\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("forge_leader_handoff_seconds_count{role=\"scheduler\"} 0"),
            "{text}"
        );
        metrics.counter(&defs::FAILOVERS, &labels).increment(1);
        metrics.export_zero(&defs::FAILOVERS, &labels);
        let text = metrics.render();
        assert!(
            text.contains("forge_leader_failovers_total{role=\"scheduler\"} 1"),
            "{text}"
        );
    }

    /// The application's texts follow FORGE's, each ending with a newline, and a process
    /// family that the application declares too is not FORGE's to export.
    #[test]
    fn the_applications_metrics_follow_forges_and_its_process_figures_win() {
        let app: Vec<AppMetrics> = vec![
            Box::new(|| {
                "# TYPE process_threads gauge\nprocess_threads 7\n\n# TYPE orders_total counter\norders_total 3".to_owned()
            }),
            Box::new(|| "# HELP shipped_total Shipped.\nshipped_total 2\n".to_owned()),
            Box::new(String::new),
        ];
        let metrics = Metrics::with_app_metrics(app);
        let text = metrics.render();
        let forge = text.find("# TYPE forge_build_info gauge").expect(&text);
        let orders = text
            .find("orders_total 3\n# HELP shipped_total")
            .expect(&text);
        assert!(forge < orders, "{text}");
        assert!(text.ends_with("shipped_total 2\n"), "{text}");
        assert_eq!(text.matches("# TYPE process_threads ").count(), 1, "{text}");
        assert!(text.contains("\nprocess_threads 7\n"), "{text}");
        if cfg!(target_os = "linux") {
            assert!(text.contains("\nprocess_open_fds "), "{text}");
        }
    }

    #[test]
    fn names_follow_prometheus_conventions() {
        check_conventions(defs::ALL).unwrap();
    }
}
