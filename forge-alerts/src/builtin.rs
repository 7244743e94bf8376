//! The built-in rules: what FORGE's own metrics can tell an operator, with a runbook section
//! each (`docs/src/runbook.md`).

use std::time::Duration;

use crate::Severity;

/// A built-in rule.
#[derive(Debug)]
pub struct Builtin {
    /// The alert's name, also its runbook section's anchor.
    pub name: &'static str,
    /// `critical`, `warning` or `info`.
    pub severity: Severity,
    /// How long the condition must hold.
    pub for_: Duration,
    /// The PromQL expression.
    pub expr: &'static str,
    /// The `summary` annotation.
    pub summary: &'static str,
    /// The `description` annotation.
    pub description: &'static str,
}

const fn minutes(n: u64) -> Duration {
    Duration::from_secs(n * 60)
}

/// The built-in rules, in export order. Every metric they use is one FORGE exports (counters
/// from 0 at a node's start, so that a first increment counts).
pub const BUILTIN: &[Builtin] = &[
    Builtin {
        name: "forge_no_leader",
        severity: Severity::Critical,
        for_: minutes(1),
        expr: "sum by (job, role) (forge_leader_is_leader) == 0 or (max by (job, role) (max_over_time(forge_leader_is_leader[15m])) * 0 unless on (job, role) max by (job, role) (forge_leader_is_leader))",
        summary: "No leader for role {{ $labels.role }}",
        description: "No node of {{ $labels.job }} reports leading the role {{ $labels.role }} (or no node that campaigns for it is scraped any more): its crons, leader-only jobs and duties are not running.",
    },
    Builtin {
        name: "forge_work_unserved",
        severity: Severity::Critical,
        for_: minutes(5),
        expr: "max by (job, work, name) (forge_work_unserved) > 0",
        summary: "No node serves {{ $labels.work }} {{ $labels.name }}",
        description: "{{ if eq $labels.work \"queue\" }}Jobs wait in the queue {{ $labels.name }} of {{ $labels.job }} and no live node works it{{ else }}Live nodes of {{ $labels.job }} have work for the role {{ $labels.name }} (crons, leader-only jobs, leader tasks) and none of them campaigns for it{{ end }}: the work waits until a node serves it. `forge status` says what to do.",
    },
    Builtin {
        name: "forge_multiple_leaders",
        severity: Severity::Critical,
        for_: minutes(1),
        expr: "sum by (job, role) (forge_leader_is_leader) > 1",
        summary: "{{ $value }} nodes lead role {{ $labels.role }}",
        description: "More than one node of {{ $labels.job }} reports leading the role {{ $labels.role }}. Fenced writes of a deposed leader are refused, but its unfenced side effects (HTTP calls, emails) may happen twice.",
    },
    Builtin {
        name: "forge_leader_failover",
        severity: Severity::Info,
        for_: Duration::ZERO,
        expr: "sum by (job, role) (increase(forge_leader_failovers_total[15m])) >= 1",
        summary: "Failover of role {{ $labels.role }}",
        description: "In the last 15 minutes a node of {{ $labels.job }} took the role {{ $labels.role }} over from a leader that did not hand over: it crashed, froze or lost PostgreSQL.",
    },
    Builtin {
        name: "forge_frequent_failovers",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, role) (increase(forge_leader_failovers_total[1h])) >= 3",
        summary: "Frequent failovers of role {{ $labels.role }}",
        description: "The role {{ $labels.role }} of {{ $labels.job }} failed over 3 times or more in the last hour: its leaders keep crashing, freezing or losing PostgreSQL.",
    },
    Builtin {
        name: "forge_leader_lock_conflict",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, role) (increase(forge_leader_lock_conflicts_total[15m])) >= 1",
        summary: "A foreign session holds the lock of role {{ $labels.role }}",
        description: "Nodes of {{ $labels.job }} waiting for the role {{ $labels.role }} found its advisory-lock key held by a session that is not a FORGE node: no FORGE node can lead the role while it holds the key.",
    },
    Builtin {
        name: "forge_cron_missed_ticks",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, role, cron) (increase(forge_cron_missed_ticks_total[1h])) >= 1",
        summary: "Cron {{ $labels.cron }} missed ticks",
        description: "In the last hour, ticks of the cron {{ $labels.cron }} (role {{ $labels.role }}) were due while the role had no leader and were not run, per the cron's catch_up policy.",
    },
    Builtin {
        name: "forge_cron_late",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, role, cron) (increase(forge_cron_lag_seconds_count[15m])) - sum by (job, role, cron) (increase(forge_cron_lag_seconds_bucket{le=~\"60|60.0\"}[15m])) >= 1",
        summary: "Cron {{ $labels.cron }} runs start late",
        description: "In the last 15 minutes, runs of the cron {{ $labels.cron }} (role {{ $labels.role }}) started more than 60s after their scheduled instant: ticks caught up after a leaderless gap, runs slower than the schedule, or a saturated leader.",
    },
    Builtin {
        name: "forge_cron_failing",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, role, cron) (increase(forge_cron_runs_total{outcome=~\"failed|timed_out|abandoned\"}[1h])) >= 1",
        summary: "Cron {{ $labels.cron }} runs fail",
        description: "In the last hour, runs of the cron {{ $labels.cron }} (role {{ $labels.role }}) failed, timed out or were abandoned; forge.cron_ticks has their errors.",
    },
    Builtin {
        name: "forge_cron_unknown",
        severity: Severity::Warning,
        for_: minutes(15),
        expr: "max by (job, role) (forge_cron_unknown_crons > 0 and forge_leader_is_leader == 1)",
        summary: "The leader of role {{ $labels.role }} lacks {{ $value }} cron(s)",
        description: "The leader of the role {{ $labels.role }} ({{ $labels.job }}) runs a binary without crons that other nodes registered: their ticks do not run until a node that has them leads the role. Usually a rolling deploy that did not finish.",
    },
    Builtin {
        name: "forge_job_backlog",
        severity: Severity::Warning,
        for_: minutes(15),
        expr: "sum by (job, queue) (forge_job_queue_depth{state=\"available\"}) > 1000",
        summary: "{{ $value }} jobs wait in queue {{ $labels.queue }}",
        description: "More than 1000 jobs of the queue {{ $labels.queue }} ({{ $labels.job }}) have been due and unclaimed for 15 minutes: the nodes that work the queue cannot keep up.",
    },
    Builtin {
        name: "forge_job_oldest_age",
        severity: Severity::Warning,
        for_: minutes(5),
        expr: "max by (job, queue) (forge_job_oldest_age_seconds) > 600",
        summary: "Jobs of queue {{ $labels.queue }} wait longer than 10 minutes",
        description: "The oldest due job of the queue {{ $labels.queue }} ({{ $labels.job }}) has waited {{ $value | humanizeDuration }}: no node works the queue, or its workers are saturated or cannot claim.",
    },
    Builtin {
        name: "forge_jobs_dead",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, queue, kind) (increase(forge_job_dead_total[15m])) >= 1",
        summary: "Jobs of queue {{ $labels.queue }} were dead-lettered",
        description: "In the last 15 minutes, jobs of the queue {{ $labels.queue }} ({{ $labels.job }}) were dead-lettered: out of attempts, discarded, undecodable, or rescued with no attempts left. They are kept for [jobs] dead_retention (forge_job_dead_jobs).",
    },
    Builtin {
        name: "forge_nodes_down",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "max by (job) (forge_cluster_nodes{state=\"down\"}) > 0",
        summary: "{{ $value }} node(s) of {{ $labels.job }} down",
        description: "The scheduler leader marked nodes down (their session ended and they did not come back, or no heartbeat for down_after) and rescued their running jobs. A node stays down until it rejoins or is forgotten after forget_after.",
    },
    Builtin {
        name: "forge_nodes_drifted",
        severity: Severity::Warning,
        for_: minutes(2),
        expr: "max by (job) (forge_cluster_nodes{state=\"drifted\"}) > 0",
        summary: "{{ $value }} node(s) of {{ $labels.job }} drifted",
        description: "Nodes have not heartbeaten for longer than drift_after: frozen, starved of CPU, or cut off from PostgreSQL.",
    },
    Builtin {
        name: "forge_db_reconnect_storm",
        severity: Severity::Warning,
        for_: Duration::ZERO,
        expr: "sum by (job, instance) (increase(forge_db_reconnects_total[15m])) > 10",
        summary: "Node {{ $labels.instance }} keeps reconnecting to PostgreSQL",
        description: "The dedicated sessions of the node {{ $labels.instance }} ({{ $labels.job }}: its node session, one per role) reconnected more than 10 times in 15 minutes: PostgreSQL restarts, a flapping network, or a proxy that drops connections.",
    },
];

/// Whether `name` is a built-in rule's.
pub(crate) fn is_builtin(name: &str) -> bool {
    BUILTIN.iter().any(|b| b.name == name)
}
