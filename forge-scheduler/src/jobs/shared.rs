//! What the job queue's service, workers and leader tasks of one node share: notification
//! channels, worker specs, the registry and settings, and the outcome vocabulary.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Duration;

use forge_core::{LockNamespace, Metrics, NodeContext, Role};
use tokio::sync::watch;

use super::{JobState, JobType};
use crate::config::JobsConfig;
use crate::metrics::{JOB_CANCELLED, JOB_DEAD, JOB_RESCUED};

/// Jobs became available: payload `<namespace> <queue>` or `<namespace> @<role>`.
pub(crate) const CHANNEL_AVAILABLE: &str = "forge_jobs";
/// A scheduled job or retry is due: payload `<namespace> <unix ms>`.
pub(crate) const CHANNEL_DUE: &str = "forge_jobs_due";
/// Cancel a running job: payload `<namespace> <node> <job id>`.
pub(crate) const CHANNEL_CANCEL: &str = "forge_jobs_cancel";

/// Hashes the ids a worker keys its attempts by (job ids, task ids) with one multiplication:
/// the database and tokio hand them out, so nobody picks them to collide, and the default
/// SipHash was 2 % of a busy node's CPU (several lookups per job).
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.write_u64(u64::from(*byte));
        }
    }

    fn write_u64(&mut self, n: u64) {
        // (The golden ratio's multiplier spreads consecutive ids over the high bits, which
        // hashbrown's groups read.)
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_i64(&mut self, n: i64) {
        self.write_u64(n as u64);
    }
}

/// A map keyed by ids ([`IdHasher`]).
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
/// A set of ids ([`IdHasher`]).
pub(crate) type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

forge_core::sql_enum! {
    /// What a worker asks `forge.jobs_step` to record for a finished attempt.
    pub(crate) enum Outcome {
        /// Done.
        Completed = "completed",
        /// Failed; retry after the backoff.
        Retryable = "retryable",
        /// Failed; retry at once.
        Available = "available",
        /// Failed for good: dead-letter.
        Dead = "dead",
        /// Stopped by a cancel request.
        Cancelled = "cancelled",
        /// Interrupted by a graceful stop or a lost leadership: available again, the attempt
        /// not counted (cancelled instead if a cancel was requested meanwhile).
        Released = "released",
    }
}

forge_core::sql_enum! {
    /// Why an attempt is in a job's `errors` (their `reason`, read as
    /// [`AttemptError::reason`](super::AttemptError::reason)); written by the workers and by
    /// `forge.jobs_rescue` and `forge.jobs_cancel`.
    pub(crate) enum AttemptReason {
        /// The handler returned an error.
        Error = "error",
        /// The handler ran past its timeout.
        Timeout = "timeout",
        /// The handler panicked.
        Panic = "panic",
        /// The handler asked not to retry (`JobError::discard`).
        Discard = "discard",
        /// A cancel stopped the job (before it started, or while it ran).
        Cancelled = "cancelled",
        /// Given back without counting the attempt (graceful stop, lost leadership, a kind
        /// this node does not know).
        Released = "released",
        /// Taken back from a node that is down or stopped, or from an ended leadership.
        Rescued = "rescued",
        /// Its arguments could not be decoded into the job's type.
        Undecodable = "undecodable",
        /// The handler snoozed the job (`JobError::snooze`): not counted as an attempt.
        Snoozed = "snoozed",
        /// The handler snoozed the job once more than `max_snoozes` allows: dead-lettered.
        TooManySnoozes = "too_many_snoozes",
    }
}

forge_core::sql_enum! {
    /// What `forge.jobs_step` says of a row: a job it claimed (started, or claimed ahead and
    /// waiting for a slot), an outcome it refused (the job is no longer this attempt's), or a
    /// claim it refused. Other outcome rows carry the [`JobState`] recorded instead of the one
    /// asked for.
    pub(crate) enum StepRow {
        /// Claimed and marked started.
        Running = "running",
        /// Claimed ahead of a free slot; marked started when it starts.
        Ahead = "ahead",
        /// An outcome not recorded: the job was taken from this attempt.
        Refused = "refused",
        /// Nothing claimed: the claim did not carry its lane's current identity.
        Stale = "stale",
        /// The queue has limits (global concurrency, rate): claim nothing ahead, and claim
        /// again after `pickup_ms` when the claim was cut short by them.
        Limited = "limited",
        /// Jobs of limited kinds were passed over or cut (forge.kind_limits): claim from the
        /// head next time, and, when the claim came back short, again after `pickup_ms`.
        Paced = "paced",
    }
}

impl Outcome {
    /// The state `forge.jobs_step` records for this outcome when nothing intervened.
    pub(crate) fn recorded_as(self) -> JobState {
        match self {
            Outcome::Completed => JobState::Completed,
            Outcome::Retryable => JobState::Retryable,
            Outcome::Available | Outcome::Released => JobState::Available,
            Outcome::Dead => JobState::Dead,
            Outcome::Cancelled => JobState::Cancelled,
        }
    }
}

/// One worker: the jobs of one queue (without role), or of one role on the role's leader.
#[derive(Clone, Debug)]
pub(crate) struct WorkerSpec {
    /// The queue worked; for a role worker, which works all queues, the queue its first type
    /// declares (a label for logs and figures).
    pub(crate) queue: String,
    pub(crate) role: Option<Role>,
    pub(crate) concurrency: usize,
    pub(crate) kinds: Vec<&'static str>,
}

/// What the service, the workers and the leader tasks of one node share.
pub(crate) struct Shared {
    pub(crate) types: BTreeMap<&'static str, JobType>,
    pub(crate) config: JobsConfig,
    pub(crate) namespace: LockNamespace,
    /// `[cluster.leader_election] drain_timeout`: how long a role's leader tasks may drain.
    pub(crate) election_drain: Duration,
    /// `[cluster.leader_election] check_interval`: the longest a node waits to reconnect.
    pub(crate) check_interval: Duration,
    /// How long one database round trip may take before it counts as failed (a half-open
    /// connection never answers).
    pub(crate) statement_bound: Duration,
    /// The node's context, once the node has rescued its previous run's jobs; leader tasks
    /// wait for it.
    pub(crate) ready: watch::Sender<Option<NodeContext>>,
}

impl Shared {
    /// The node's context, once ready; `None` if `stop` resolves first.
    pub(crate) async fn context_until(
        &self,
        stop: impl Future<Output = ()>,
    ) -> Option<NodeContext> {
        let mut ready = self.ready.subscribe();
        tokio::select! {
            context = ready.wait_for(Option::is_some) => context.ok().and_then(|c| c.clone()),
            _ = stop => None,
        }
    }

    pub(crate) fn default_max_attempts(&self) -> i32 {
        self.config.default_max_attempts.clamp(1, i32::MAX as u32) as i32
    }

    /// How long taking a lane (`forge.jobs_lane_take`) waits, each time, for a round trip still
    /// in flight on the server before it ends that trip's session: up to three waits and two
    /// session ends fit in one round trip's bound.
    pub(crate) fn lane_wait_ms(&self) -> i32 {
        (self.statement_bound / 8)
            .as_millis()
            .clamp(1, i32::MAX as u128) as i32
    }
}

/// Counts `n` rescued jobs in the metrics, given the state the rescue left them in.
pub(crate) fn record_rescue(metrics: &Metrics, queue: &str, kind: &str, state: JobState, n: u64) {
    let labels = [("queue", queue), ("kind", kind)];
    metrics.counter(&JOB_RESCUED, &labels).increment(n);
    match state {
        JobState::Dead => metrics.counter(&JOB_DEAD, &labels).increment(n),
        JobState::Cancelled => metrics.counter(&JOB_CANCELLED, &labels).increment(n),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::{AttemptReason, StepRow};
    use crate::schema::source::{function, literals_after};

    #[test]
    fn every_row_state_of_jobs_step_is_one_the_sql_writes() {
        let sql = function("jobs_step");
        for state in StepRow::ALL {
            assert!(
                sql.contains(&format!("'{state}'")),
                "forge.jobs_step never writes {state:?}"
            );
        }
    }

    #[test]
    fn every_reason_the_sql_writes_parses() {
        let mut written = Vec::new();
        for name in ["jobs_rescue", "jobs_cancel", "jobs_snooze"] {
            let sql = function(name);
            let reasons = literals_after(sql, "'reason', '");
            assert!(!reasons.is_empty(), "forge.{name} writes no reason: {sql}");
            written.extend(reasons);
        }
        for reason in written {
            assert!(AttemptReason::parse(reason).is_some(), "{reason:?}");
        }
    }
}
