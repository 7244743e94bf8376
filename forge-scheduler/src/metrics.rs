//! The scheduler's metrics (crons and jobs) and the cluster series it publishes. Names are
//! spelled here only; this module depends on no other of the crate, so `cron` and `jobs` both
//! use it and it uses neither.

use forge_core::metrics::MetricDef;

/// `forge_cron_lag_seconds{cron, role}`
pub(crate) const CRON_LAG: MetricDef = MetricDef::histogram(
    "forge_cron_lag_seconds",
    "How late a cron run started: actual start minus scheduled instant, by the database's clock as the leader follows it",
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

/// `forge_job_enqueued_total{queue, kind}`
pub(crate) const JOB_ENQUEUED: MetricDef = MetricDef::counter(
    "forge_job_enqueued_total",
    "Jobs inserted through this node's client (node.jobs()), by queue and kind",
);
/// `forge_job_completed_total{queue, kind}`
pub(crate) const JOB_COMPLETED: MetricDef = MetricDef::counter(
    "forge_job_completed_total",
    "Attempts that completed their job, recorded by this node (in the handler's transaction or after it)",
);
/// `forge_job_failed_total{queue, kind}`
pub(crate) const JOB_FAILED: MetricDef = MetricDef::counter(
    "forge_job_failed_total",
    "Attempts that failed on this node (error, timeout, panic, discard), whatever follows",
);
/// `forge_job_retried_total{queue, kind}`
pub(crate) const JOB_RETRIED: MetricDef = MetricDef::counter(
    "forge_job_retried_total",
    "Failed attempts on this node after which the job will be retried",
);
/// `forge_job_dead_total{queue, kind}`
pub(crate) const JOB_DEAD: MetricDef = MetricDef::counter(
    "forge_job_dead_total",
    "Jobs dead-lettered by this node: out of attempts, discarded, undecodable, or rescued with no attempts left",
);
/// `forge_job_cancelled_total{queue, kind}`
pub(crate) const JOB_CANCELLED: MetricDef = MetricDef::counter(
    "forge_job_cancelled_total",
    "Running jobs this node stopped because they were cancelled, and rescued jobs cancelled",
);
/// `forge_job_rescued_total{queue, kind}`
pub(crate) const JOB_RESCUED: MetricDef = MetricDef::counter(
    "forge_job_rescued_total",
    "Running jobs of down, stopped or restarted nodes given back by this node (scheduler leader, or the node itself on start)",
);
/// `forge_job_snoozed_total{queue, kind}`
pub(crate) const JOB_SNOOZED: MetricDef = MetricDef::counter(
    "forge_job_snoozed_total",
    "Snoozes (JobError::snooze) this node recorded: the job waits again without counting the attempt",
);
/// `forge_job_duration_seconds{queue, kind}`
pub(crate) const JOB_DURATION: MetricDef = MetricDef::histogram(
    "forge_job_duration_seconds",
    "How long attempts took on this node, whatever their outcome",
);
/// `forge_job_pickup_latency_seconds{queue, kind}`
pub(crate) const JOB_PICKUP: MetricDef = MetricDef::histogram(
    "forge_job_pickup_latency_seconds",
    "From when a job was due (enqueued, run-at reached, backoff over) to its claim by this node (database clock)",
);
/// `forge_job_queue_depth{queue, kind, state}`
pub(crate) const JOB_QUEUE_DEPTH: MetricDef = MetricDef::gauge(
    "forge_job_queue_depth",
    "Unfinished jobs of the cluster by queue, kind and state, as of the metrics_aggregator leader's last look (every [jobs] maintenance_interval, or less often when a look takes over 2 % of the time; reported by that leader only)",
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

/// `forge_job_queue_limited{queue,limit}`
pub(crate) const JOB_QUEUE_LIMITED: MetricDef = MetricDef::gauge(
    "forge_job_queue_limited",
    "1 while the queue has available jobs and its limit (limit: global, rate) is reached, so they wait for it; 0 otherwise; reported by the metrics_aggregator leader only",
);

/// `forge_job_kind_limited{kind,limit}`
pub(crate) const JOB_KIND_LIMITED: MetricDef = MetricDef::gauge(
    "forge_job_kind_limited",
    "1 while the job kind has available jobs and its limit (limit: global, rate) is reached, so they wait for it; 0 otherwise; reported by the metrics_aggregator leader only",
);

/// Every metric of the crons.
pub(crate) const CRON_METRICS: &[&MetricDef] = &[
    &CRON_LAG,
    &CRON_RUNS,
    &CRON_MISSED,
    &CRON_DURATION,
    &CRON_UNKNOWN,
];

/// The counters and histograms of a (queue, job kind), all exported at 0 from the node's
/// start.
pub(crate) const JOB_SERIES: &[&MetricDef] = &[
    &JOB_ENQUEUED,
    &JOB_COMPLETED,
    &JOB_FAILED,
    &JOB_RETRIED,
    &JOB_DEAD,
    &JOB_CANCELLED,
    &JOB_RESCUED,
    &JOB_SNOOZED,
    &JOB_DURATION,
    &JOB_PICKUP,
];

/// The queue figures, reported by the `metrics_aggregator` leader only.
pub(crate) const JOB_FIGURES: &[&MetricDef] = &[
    &JOB_QUEUE_DEPTH,
    &JOB_OLDEST_AGE,
    &JOB_DEAD_JOBS,
    &JOB_QUEUE_LIMITED,
    &JOB_KIND_LIMITED,
];

forge_core::sql_enum! {
    /// A cluster series (`forge.stats.series`) of the scheduler: counters the nodes publish
    /// in their tally (summed per interval by the `metrics_aggregator` leader) and the queue
    /// figures that leader samples. The dashboard's charts and `Cluster::series` read them by
    /// these names.
    pub(crate) enum Series {
        /// Attempts completed, by queue.
        JobsCompleted = "jobs_completed",
        /// Attempts failed (whatever followed), by queue.
        JobsFailed = "jobs_failed",
        /// Failed attempts to be retried, by queue.
        JobsRetried = "jobs_retried",
        /// Jobs dead-lettered, by queue.
        JobsDead = "jobs_dead",
        /// Jobs cancelled while running or rescued, by queue.
        JobsCancelled = "jobs_cancelled",
        /// Attempts finished, by queue (the divisor of the mean duration).
        JobAttempts = "job_attempts",
        /// The attempts' durations summed, in seconds, by queue.
        JobDurationSum = "job_duration_seconds_sum",
        /// Cron runs, by role (per cron: Prometheus).
        CronRuns = "cron_runs",
        /// Cron runs that failed, timed out or were abandoned, by role (per cron: Prometheus).
        CronFailures = "cron_failures",
        /// The runs' lags summed, in seconds, by role (per cron: Prometheus).
        CronLagSum = "cron_lag_seconds_sum",
        /// The runs' durations summed, in seconds, by role (per cron: Prometheus).
        CronDurationSum = "cron_duration_seconds_sum",
        /// Unfinished jobs, by queue (sampled).
        QueueDepth = "queue_depth",
        /// How long the oldest available job has been due, by queue (sampled).
        OldestJobAge = "oldest_job_age_seconds",
        /// Dead jobs kept, by queue (sampled).
        DeadJobs = "dead_jobs",
    }
}

#[cfg(test)]
mod tests {
    use super::Series;

    #[test]
    fn names_follow_prometheus_conventions() {
        forge_core::metrics::check_conventions(super::CRON_METRICS).unwrap();
        forge_core::metrics::check_conventions(super::JOB_SERIES).unwrap();
        forge_core::metrics::check_conventions(super::JOB_FIGURES).unwrap();
    }

    #[test]
    fn series_names_are_distinct_tally_keys() {
        let mut names: Vec<&str> = Series::ALL.iter().map(|s| s.as_str()).collect();
        for name in &names {
            // The tally joins a series and its label with `|`; the dashboard's API asks for
            // names of at most 64 lowercase letters and underscores.
            assert!(
                name.len() <= 64 && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{name}"
            );
            assert_eq!(Series::parse(name).map(Series::as_str), Some(*name));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Series::ALL.len());
    }
}
