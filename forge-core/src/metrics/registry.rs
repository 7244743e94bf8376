//! The registry behind [`Metrics`](super::Metrics): every series of a node, who keeps each one
//! exported, and the Prometheus text format.
//!
//! A series is kept for the node's life once the node registers it (a counter exported at 0
//! from the start, a gauge of the node's own) or only while a *scope* that registered it lives
//! (a tenure: the per-cron histograms of the crons its leader runs, the cluster gauges of the
//! `metrics_aggregator` leader). Closing a scope removes the series no one else keeps, so a
//! node that no longer leads a role stops exporting what only the leader measures.
//!
//! Handles are `metrics` handles over atomics the registry shares: recording is an atomic add
//! (a histogram finds its bucket and adds), there are no buffers to drain, and a handle kept
//! after its series was removed records into nothing anyone renders.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use metrics::{Counter, Gauge, Histogram, HistogramFn};

use super::{MetricDef, MetricKind};

/// A series' labels, in the order the recording code gives them.
pub(super) type Labels = Vec<(&'static str, String)>;

#[derive(Default)]
pub(super) struct Registry {
    families: RwLock<BTreeMap<&'static str, Family>>,
}

struct Family {
    kind: MetricKind,
    help: Option<&'static str>,
    series: BTreeMap<Labels, Entry>,
}

struct Entry {
    cell: Cell,
    /// Kept for the node's life.
    node: bool,
    /// The open scopes that registered it.
    scopes: Vec<u64>,
}

#[derive(Clone)]
enum Cell {
    Counter(Arc<AtomicU64>),
    /// An `f64`'s bits.
    Gauge(Arc<AtomicU64>),
    Histogram(Arc<Buckets>),
}

impl Cell {
    fn new(kind: MetricKind) -> Cell {
        match kind {
            MetricKind::Counter => Cell::Counter(Arc::default()),
            MetricKind::Gauge => Cell::Gauge(Arc::default()),
            MetricKind::Histogram => {
                Cell::Histogram(Arc::new(Buckets::new(super::SECONDS_BUCKETS)))
            }
        }
    }

    fn counter(&self) -> Counter {
        match self {
            Cell::Counter(cell) => Counter::from_arc(cell.clone()),
            _ => Counter::noop(),
        }
    }

    fn gauge(&self) -> Gauge {
        match self {
            Cell::Gauge(cell) => Gauge::from_arc(cell.clone()),
            _ => Gauge::noop(),
        }
    }

    fn histogram(&self) -> Histogram {
        match self {
            Cell::Histogram(cell) => Histogram::from_arc(cell.clone()),
            _ => Histogram::noop(),
        }
    }
}

/// A histogram: a count per bucket (not cumulative; the last one is `+Inf`) and the sum.
pub(super) struct Buckets {
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    /// An `f64`'s bits.
    sum: AtomicU64,
}

impl Buckets {
    fn new(bounds: &'static [f64]) -> Buckets {
        Buckets {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }
}

impl HistogramFn for Buckets {
    fn record(&self, value: f64) {
        if value.is_nan() {
            return;
        }
        // The first bucket whose bound is at or above the value (`le`); past the last, `+Inf`.
        let at = self.bounds.partition_point(|bound| *bound < value);
        self.counts[at].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }
}

/// Who registers a series: the node (kept for its life) or a scope.
pub(super) enum Owner<'a> {
    Node,
    Scope(&'a Scope),
}

/// A set of series that goes away together: [`Scope::close`] removes the ones no one else
/// keeps. Registering through a closed scope exports nothing new.
pub(super) struct Scope {
    id: u64,
    registry: Arc<Registry>,
    /// `None` once closed; else the series this scope registered.
    keys: Mutex<Option<Vec<(&'static str, Labels)>>>,
}

impl Scope {
    pub(super) fn new(registry: Arc<Registry>) -> Scope {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Scope {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            registry,
            keys: Mutex::new(Some(Vec::new())),
        }
    }

    /// Removes the series only this scope kept; later registrations through it export nothing.
    pub(super) fn close(&self) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let Some(keys) = keys.take() else { return };
        if keys.is_empty() {
            return;
        }
        let mut families = self
            .registry
            .families
            .write()
            .unwrap_or_else(|e| e.into_inner());
        for (name, labels) in keys {
            let Some(family) = families.get_mut(name) else {
                continue;
            };
            if let Some(entry) = family.series.get_mut(&labels) {
                entry.scopes.retain(|id| *id != self.id);
                if !entry.node && entry.scopes.is_empty() {
                    family.series.remove(&labels);
                }
            }
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        self.close();
    }
}

impl Registry {
    /// Records a metric's help text (its series appear when registered).
    pub(super) fn describe(&self, def: &MetricDef) {
        let mut families = self.families.write().unwrap_or_else(|e| e.into_inner());
        families
            .entry(def.name)
            .or_insert_with(|| Family {
                kind: def.kind,
                help: None,
                series: BTreeMap::new(),
            })
            .help = Some(def.help);
    }

    pub(super) fn counter(
        &self,
        def: &MetricDef,
        labels: &[(&'static str, &str)],
        owner: Owner<'_>,
    ) -> Counter {
        self.register(def, labels, owner).counter()
    }

    pub(super) fn gauge(
        &self,
        def: &MetricDef,
        labels: &[(&'static str, &str)],
        owner: Owner<'_>,
    ) -> Gauge {
        self.register(def, labels, owner).gauge()
    }

    pub(super) fn histogram(
        &self,
        def: &MetricDef,
        labels: &[(&'static str, &str)],
        owner: Owner<'_>,
    ) -> Histogram {
        self.register(def, labels, owner).histogram()
    }

    /// The series of `def` with `labels`, created if need be and kept for `owner`.
    fn register(&self, def: &MetricDef, labels: &[(&'static str, &str)], owner: Owner<'_>) -> Cell {
        let labels: Labels = labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        match owner {
            Owner::Node => {
                // The common case, a series that exists and that the node keeps: a read lock.
                if let Some(cell) = self.existing(def, &labels, |entry| entry.node) {
                    return cell;
                }
                let mut families = self.families.write().unwrap_or_else(|e| e.into_inner());
                let entry = Self::entry(&mut families, def, labels);
                entry.node = true;
                entry.cell.clone()
            }
            Owner::Scope(scope) => {
                let mut keys = scope.keys.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(cell) = self.existing(def, &labels, |entry| {
                    entry.node || entry.scopes.contains(&scope.id)
                }) {
                    return cell;
                }
                let mut families = self.families.write().unwrap_or_else(|e| e.into_inner());
                let Some(keys) = keys.as_mut() else {
                    // Closed: an existing series the node keeps, else a cell no one renders.
                    return match families.get(def.name).and_then(|f| f.series.get(&labels)) {
                        Some(entry) if entry.node => entry.cell.clone(),
                        _ => Cell::new(def.kind),
                    };
                };
                let entry = Self::entry(&mut families, def, labels.clone());
                if !entry.node && !entry.scopes.contains(&scope.id) {
                    entry.scopes.push(scope.id);
                    keys.push((def.name, labels));
                }
                entry.cell.clone()
            }
        }
    }

    fn existing(
        &self,
        def: &MetricDef,
        labels: &Labels,
        kept: impl Fn(&Entry) -> bool,
    ) -> Option<Cell> {
        let families = self.families.read().unwrap_or_else(|e| e.into_inner());
        let entry = families.get(def.name)?.series.get(labels)?;
        kept(entry).then(|| entry.cell.clone())
    }

    fn entry<'a>(
        families: &'a mut BTreeMap<&'static str, Family>,
        def: &MetricDef,
        labels: Labels,
    ) -> &'a mut Entry {
        let family = families.entry(def.name).or_insert_with(|| Family {
            kind: def.kind,
            help: None,
            series: BTreeMap::new(),
        });
        let kind = family.kind;
        family.series.entry(labels).or_insert_with(|| Entry {
            cell: Cell::new(kind),
            node: false,
            scopes: Vec::new(),
        })
    }

    /// Appends every family that has a series, in the Prometheus text format (0.0.4).
    pub(super) fn render(&self, out: &mut String) {
        let families = self.families.read().unwrap_or_else(|e| e.into_inner());
        for (name, family) in families.iter() {
            if family.series.is_empty() {
                continue;
            }
            if let Some(help) = family.help {
                write_help(out, name, help);
            }
            let kind = match family.kind {
                MetricKind::Counter => "counter",
                MetricKind::Gauge => "gauge",
                MetricKind::Histogram => "histogram",
            };
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, entry) in &family.series {
                match &entry.cell {
                    Cell::Counter(value) => {
                        write_sample(out, name, "", labels, None);
                        let _ = writeln!(out, "{}", value.load(Ordering::Relaxed));
                    }
                    Cell::Gauge(value) => {
                        write_sample(out, name, "", labels, None);
                        write_f64(out, f64::from_bits(value.load(Ordering::Relaxed)));
                        out.push('\n');
                    }
                    Cell::Histogram(buckets) => {
                        let mut cumulative = 0u64;
                        for (at, count) in buckets.counts.iter().enumerate() {
                            cumulative += count.load(Ordering::Relaxed);
                            let le = buckets.bounds.get(at).copied().unwrap_or(f64::INFINITY);
                            write_sample(out, name, "_bucket", labels, Some(le));
                            let _ = writeln!(out, "{cumulative}");
                        }
                        write_sample(out, name, "_sum", labels, None);
                        write_f64(out, f64::from_bits(buckets.sum.load(Ordering::Relaxed)));
                        out.push('\n');
                        // The count is the `+Inf` bucket's, read once: the two always agree.
                        write_sample(out, name, "_count", labels, None);
                        let _ = writeln!(out, "{cumulative}");
                    }
                }
            }
            out.push('\n');
        }
    }
}

/// `# HELP name text` (backslashes and newlines escaped).
pub(super) fn write_help(out: &mut String, name: &str, help: &str) {
    let _ = write!(out, "# HELP {name} ");
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('\n');
}

/// `name<suffix>{labels,le="..."} ` (the value follows).
pub(super) fn write_sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &Labels,
    le: Option<f64>,
) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        let mut first = true;
        for (key, value) in labels {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(key);
            out.push_str("=\"");
            for c in value.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '"' => out.push_str("\\\""),
                    '\n' => out.push_str("\\n"),
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        if let Some(le) = le {
            if !first {
                out.push(',');
            }
            out.push_str("le=\"");
            write_f64(out, le);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
}

/// A float as Prometheus reads it (`+Inf`, `-Inf`, `NaN`; no exponent).
pub(super) fn write_f64(out: &mut String, value: f64) {
    if value.is_nan() {
        out.push_str("NaN");
    } else if value == f64::INFINITY {
        out.push_str("+Inf");
    } else if value == f64::NEG_INFINITY {
        out.push_str("-Inf");
    } else {
        let _ = write!(out, "{value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: MetricDef = MetricDef::counter("forge_test_total", "A test counter");
    const G: MetricDef = MetricDef::gauge("forge_test_gauge", "A test gauge");
    const H: MetricDef = MetricDef::histogram("forge_test_seconds", "A test histogram");

    fn render(registry: &Registry) -> String {
        let mut out = String::new();
        registry.render(&mut out);
        out
    }

    #[test]
    fn histograms_render_cumulative_buckets_sum_and_count() {
        let registry = Registry::default();
        registry.describe(&H);
        let h = registry.histogram(&H, &[("cron", "a")], Owner::Node);
        for value in [0.0001, 0.003, 0.003, 7.0, 1000.0] {
            h.record(value);
        }
        let text = render(&registry);
        for line in [
            "# HELP forge_test_seconds A test histogram\n# TYPE forge_test_seconds histogram\n",
            "forge_test_seconds_bucket{cron=\"a\",le=\"0.0005\"} 1\n",
            "forge_test_seconds_bucket{cron=\"a\",le=\"0.0025\"} 1\n",
            "forge_test_seconds_bucket{cron=\"a\",le=\"0.005\"} 3\n",
            "forge_test_seconds_bucket{cron=\"a\",le=\"60\"} 4\n",
            "forge_test_seconds_bucket{cron=\"a\",le=\"300\"} 4\n",
            "forge_test_seconds_bucket{cron=\"a\",le=\"+Inf\"} 5\n",
            "forge_test_seconds_sum{cron=\"a\"} 1007.0061\n",
            "forge_test_seconds_count{cron=\"a\"} 5\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn label_values_and_help_are_escaped_and_gauges_print_as_prometheus_reads_them() {
        let registry = Registry::default();
        registry.describe(&MetricDef::gauge("forge_test_gauge", "line\\one\ntwo"));
        registry
            .gauge(&G, &[("queue", "a\"b\\c\nd")], Owner::Node)
            .set(f64::INFINITY);
        registry
            .gauge(&G, &[("queue", "n")], Owner::Node)
            .set(f64::NAN);
        registry.gauge(&G, &[("queue", "x")], Owner::Node).set(2.5);
        let text = render(&registry);
        assert!(
            text.contains("# HELP forge_test_gauge line\\\\one\\ntwo\n"),
            "{text}"
        );
        assert!(
            text.contains("forge_test_gauge{queue=\"a\\\"b\\\\c\\nd\"} +Inf\n"),
            "{text}"
        );
        assert!(
            text.contains("forge_test_gauge{queue=\"n\"} NaN\n"),
            "{text}"
        );
        assert!(
            text.contains("forge_test_gauge{queue=\"x\"} 2.5\n"),
            "{text}"
        );
    }

    #[test]
    fn a_closed_scope_takes_its_series_along_but_not_what_the_node_keeps() {
        let registry = Arc::new(Registry::default());
        let scope = Scope::new(registry.clone());
        let kept = registry.counter(&C, &[("cron", "kept")], Owner::Node);
        kept.increment(1);
        registry
            .counter(&C, &[("cron", "kept")], Owner::Scope(&scope))
            .increment(1);
        let h = registry.histogram(&H, &[("cron", "a")], Owner::Scope(&scope));
        h.record(1.0);
        // Registered through the scope again: kept once.
        let _ = registry.histogram(&H, &[("cron", "a")], Owner::Scope(&scope));
        let other = Scope::new(registry.clone());
        let _ = registry.gauge(&G, &[("state", "shared")], Owner::Scope(&scope));
        let _ = registry.gauge(&G, &[("state", "shared")], Owner::Scope(&other));
        let text = render(&registry);
        assert!(
            text.contains("forge_test_seconds_count{cron=\"a\"} 1"),
            "{text}"
        );
        assert!(text.contains("forge_test_total{cron=\"kept\"} 2"), "{text}");

        scope.close();
        let text = render(&registry);
        assert!(!text.contains("forge_test_seconds"), "{text}");
        assert!(text.contains("forge_test_total{cron=\"kept\"} 2"), "{text}");
        assert!(
            text.contains("forge_test_gauge{state=\"shared\"} 0"),
            "another scope keeps it: {text}"
        );
        // A closed scope exports nothing new, and a handle kept records into nothing rendered.
        registry
            .histogram(&H, &[("cron", "late")], Owner::Scope(&scope))
            .record(1.0);
        h.record(1.0);
        registry
            .counter(&C, &[("cron", "kept")], Owner::Scope(&scope))
            .increment(1);
        let text = render(&registry);
        assert!(!text.contains("forge_test_seconds"), "{text}");
        assert!(text.contains("forge_test_total{cron=\"kept\"} 3"), "{text}");
        drop(other);
        assert!(
            !render(&registry).contains("forge_test_gauge"),
            "dropping a scope closes it"
        );
    }

    #[test]
    fn a_described_metric_without_series_renders_nothing() {
        let registry = Registry::default();
        registry.describe(&G);
        assert_eq!(render(&registry), "");
    }
}
