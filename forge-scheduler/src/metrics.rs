//! The scheduler's metrics: crons and jobs. Names are spelled here only.

use forge_core::metrics::MetricDef;
use forge_core::{Assembly, Role};

use crate::cron::TickState;

/// `forge_cron_lag_seconds{cron, role}`
pub(crate) const CRON_LAG: MetricDef = MetricDef::histogram(
    "forge_cron_lag_seconds",
    "How late a cron run started: actual start minus scheduled instant",
);
/// `forge_cron_runs_total{cron, role, outcome}`
pub(crate) const CRON_RUNS: MetricDef = MetricDef::counter(
    "forge_cron_runs_total",
    "Cron runs by outcome (succeeded, failed, timed_out, skipped, abandoned)",
);
/// `forge_cron_missed_ticks_total{cron, role}`
pub(crate) const CRON_MISSED: MetricDef = MetricDef::counter(
    "forge_cron_missed_ticks_total",
    "Cron ticks not run because they were due while the role had no leader (per catch-up policy)",
);
/// `forge_cron_run_duration_seconds{cron, role}`
pub(crate) const CRON_DURATION: MetricDef =
    MetricDef::histogram("forge_cron_run_duration_seconds", "How long cron runs took");
/// `forge_cron_unknown_crons{role}`
pub(crate) const CRON_UNKNOWN: MetricDef = MetricDef::gauge(
    "forge_cron_unknown_crons",
    "Crons of the role known to the cluster (forge.crons) that this leader's binary lacks: their ticks do not run",
);

/// `forge_job_enqueued_total{queue, job}`
pub(crate) const JOB_ENQUEUED: MetricDef = MetricDef::counter(
    "forge_job_enqueued_total",
    "Jobs inserted through this node's client (node.jobs()), by queue and job",
);
/// `forge_job_completed_total{queue, job}`
pub(crate) const JOB_COMPLETED: MetricDef = MetricDef::counter(
    "forge_job_completed_total",
    "Attempts that completed their job, recorded by this node (in the handler's transaction or after it)",
);
/// `forge_job_failed_total{queue, job}`
pub(crate) const JOB_FAILED: MetricDef = MetricDef::counter(
    "forge_job_failed_total",
    "Attempts that failed on this node (error, timeout, panic, discard), whatever follows",
);
/// `forge_job_retried_total{queue, job}`
pub(crate) const JOB_RETRIED: MetricDef = MetricDef::counter(
    "forge_job_retried_total",
    "Failed attempts on this node after which the job will be retried",
);
/// `forge_job_dead_total{queue, job}`
pub(crate) const JOB_DEAD: MetricDef = MetricDef::counter(
    "forge_job_dead_total",
    "Jobs dead-lettered by this node: out of attempts, discarded, undecodable, or rescued with no attempts left",
);
/// `forge_job_cancelled_total{queue, job}`
pub(crate) const JOB_CANCELLED: MetricDef = MetricDef::counter(
    "forge_job_cancelled_total",
    "Running jobs this node stopped because they were cancelled, and rescued jobs cancelled",
);
/// `forge_job_rescued_total{queue, job}`
pub(crate) const JOB_RESCUED: MetricDef = MetricDef::counter(
    "forge_job_rescued_total",
    "Running jobs of down, stopped or restarted nodes given back by this node (scheduler leader, or the node itself on start)",
);
/// `forge_job_duration_seconds{queue, job}`
pub(crate) const JOB_DURATION: MetricDef = MetricDef::histogram(
    "forge_job_duration_seconds",
    "How long attempts took on this node, whatever their outcome",
);
/// `forge_job_pickup_latency_seconds{queue, job}`
pub(crate) const JOB_PICKUP: MetricDef = MetricDef::histogram(
    "forge_job_pickup_latency_seconds",
    "From when a job was due (enqueued, run-at reached, backoff over) to its claim by this node (database clock)",
);
/// `forge_job_queue_depth{queue, job, state}`
pub(crate) const JOB_QUEUE_DEPTH: MetricDef = MetricDef::gauge(
    "forge_job_queue_depth",
    "Unfinished jobs of the cluster by queue, job and state, as of the metrics_aggregator leader's last look (every [jobs] maintenance_interval; reported by that leader only)",
);
/// `forge_job_oldest_age_seconds{queue}`
pub(crate) const JOB_OLDEST_AGE: MetricDef = MetricDef::gauge(
    "forge_job_oldest_age_seconds",
    "How long the oldest available job of the queue has been due (0: none waiting); reported by the metrics_aggregator leader only",
);
/// `forge_job_dead_jobs{queue}`
pub(crate) const JOB_DEAD_JOBS: MetricDef = MetricDef::gauge(
    "forge_job_dead_jobs",
    "Dead-lettered jobs of the queue still kept (until [jobs] dead_retention); reported by the metrics_aggregator leader only",
);

/// Every metric of the crons.
pub(crate) const CRON_METRICS: &[&MetricDef] = &[
    &CRON_LAG,
    &CRON_RUNS,
    &CRON_MISSED,
    &CRON_DURATION,
    &CRON_UNKNOWN,
];

/// Every metric of the jobs.
pub(crate) const JOB_METRICS: &[&MetricDef] = &[
    &JOB_ENQUEUED,
    &JOB_COMPLETED,
    &JOB_FAILED,
    &JOB_RETRIED,
    &JOB_DEAD,
    &JOB_CANCELLED,
    &JOB_RESCUED,
    &JOB_DURATION,
    &JOB_PICKUP,
    &JOB_QUEUE_DEPTH,
    &JOB_OLDEST_AGE,
    &JOB_DEAD_JOBS,
];

/// The counters and histograms of a (queue, job kind), all exported at 0 from the node's
/// start.
const JOB_SERIES: &[&MetricDef] = &[
    &JOB_ENQUEUED,
    &JOB_COMPLETED,
    &JOB_FAILED,
    &JOB_RETRIED,
    &JOB_DEAD,
    &JOB_CANCELLED,
    &JOB_RESCUED,
    &JOB_DURATION,
    &JOB_PICKUP,
];

/// Exports a cron's counters and histograms at 0 from the start (runs by outcome, missed
/// ticks, lag, duration) on nodes that campaign for its role: Prometheus sees a first
/// failure, a first missed tick, a first late run.
pub(crate) fn export_cron(node: &mut Assembly, cron: &str, role: &Role) {
    for outcome in TickState::ALL {
        if *outcome != TickState::Running {
            let labels = [
                ("cron", cron),
                ("role", role.name()),
                ("outcome", outcome.as_str()),
            ];
            node.export_series(Some(role), &CRON_RUNS, &labels);
        }
    }
    for def in [&CRON_MISSED, &CRON_LAG, &CRON_DURATION] {
        node.export_series(Some(role), def, &[("cron", cron), ("role", role.name())]);
    }
}

/// Exports the counters and histograms of a job kind on a queue at 0 from the start.
pub(crate) fn export_job(node: &mut Assembly, queue: &str, kind: &str) {
    for def in JOB_SERIES {
        node.export_series(None, def, &[("queue", queue), ("kind", kind)]);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_follow_prometheus_conventions() {
        forge_core::metrics::check_conventions(super::CRON_METRICS).unwrap();
        forge_core::metrics::check_conventions(super::JOB_METRICS).unwrap();
    }
}
