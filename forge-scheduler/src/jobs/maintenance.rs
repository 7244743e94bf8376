//! The scheduler leader's duties: promote scheduled jobs and retries when they are due, and,
//! every `[jobs] maintenance_interval` - and at once when membership marks a node down -
//! rescue the running jobs of down and stopped nodes (and of ended role leaderships). The pass
//! is fenced by the tenure. (Finished jobs are pruned by the `log_compactor` leader, queue
//! figures reported by the `metrics_aggregator` leader: see `figures.rs`.)
//!
//! There is no polling: the leader sleeps until the earlier of its next pass and the earliest
//! due job, which each statement returns, and a `forge_jobs_due` notification (sent by enqueues
//! of scheduled jobs and by failed attempts) brings that time forward. Everything here is
//! idempotent and guarded by the rows' states, so a deposed leader that is a little late
//! changes nothing a newer one would not.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use forge_core::sql::Lenient;
use forge_core::{Error, Leadership, ListenerEvent, Metrics, NODES_CHANNEL};
use sqlx::FromRow;
use tokio::sync::broadcast;
use tokio::time::{Instant, sleep_until, timeout};
use tracing::{debug, info, warn};

use super::JobState;
use super::shared::{CHANNEL_DUE, Shared, record_rescue};

/// At most this many jobs are promoted per statement.
const BATCH: i32 = 10_000;

/// The second pass of a tenure follows the first this soon (or after the interval if shorter).
const SECOND_PASS: Duration = Duration::from_secs(1);

/// Promotions are at least this far apart, so that a storm of failing jobs (each announcing its
/// retry) costs at most a few hundred promotions per second.
const MIN_PROMOTE_SPACING: Duration = Duration::from_millis(5);

/// Runs the maintenance for one tenure of the scheduler leadership.
pub(crate) async fn run(shared: Arc<Shared>, leadership: Leadership) {
    let Some(ctx) = shared.context_until(leadership.stopping()).await else {
        return;
    };
    let mut events = ctx.subscribe();
    let mut state = Maintenance {
        shared: shared.clone(),
        leadership: leadership.clone(),
        metrics: ctx.metrics().clone(),
        offset_ms: 0.0,
        last_promote: None,
        deferred: false,
    };
    let interval = shared.config.maintenance_interval;
    let mut next_pass = Instant::now();
    let mut passes = 0u32;
    let mut next_due: Option<Instant> = None;
    info!(target: "forge::job", epoch = leadership.epoch().0, "maintaining the job queue");
    loop {
        let wake = next_due.map_or(next_pass, |due| due.min(next_pass));
        tokio::select! {
            biased;
            _ = leadership.stopping() => return,
            _ = sleep_until(wake) => {
                if !leadership.is_valid() {
                    return;
                }
                if Instant::now() >= next_pass {
                    next_due = state.pass().await;
                    passes += 1;
                    // A tenure that began because the previous leader's node died starts
                    // while that node's other sessions may still be closing (milliseconds
                    // after its lock session): a second pass soon after finds them gone.
                    // So does a pass that had to leave jobs whose rows another transaction
                    // held (a frozen node's, until its sessions are gone).
                    let soon = passes == 1 || std::mem::take(&mut state.deferred);
                    let pause = if soon { interval.min(SECOND_PASS) } else { interval };
                    next_pass = Instant::now() + pause;
                } else {
                    next_due = state.promote().await;
                }
            }
            event = events.recv() => match state.hear(event) {
                Heard::Due(due) => next_due = Some(next_due.map_or(due, |d| d.min(due))),
                // A node was marked down: rescue its jobs now, not at the next pass.
                Heard::NodeDown => next_pass = Instant::now(),
                Heard::Nothing => {}
            }
        }
    }
}

/// What a notification means for the maintenance timer.
enum Heard {
    /// A job is due then.
    Due(Instant),
    /// Membership marked a node down.
    NodeDown,
    Nothing,
}

struct Maintenance {
    shared: Arc<Shared>,
    leadership: Leadership,
    metrics: Metrics,
    /// The database clock minus this node's wall clock, in milliseconds, as last seen: to turn
    /// due times announced in database time into local instants.
    offset_ms: f64,
    last_promote: Option<Instant>,
    /// The last pass left jobs to rescue whose rows another transaction held.
    deferred: bool,
}

fn wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or_default()
}

impl Maintenance {
    /// When, locally, a job due in `ms` milliseconds is due (not sooner than the promotion
    /// spacing allows).
    fn due_in(&self, ms: Option<f64>) -> Option<Instant> {
        let ms = ms?;
        let mut at = Instant::now() + Duration::from_secs_f64(ms.max(0.0) / 1000.0);
        if let Some(last) = self.last_promote {
            at = at.max(last + MIN_PROMOTE_SPACING);
        }
        Some(at)
    }

    fn observe_clock(&mut self, server_now: Option<DateTime<Utc>>) {
        if let Some(now) = server_now {
            self.offset_ms = now.timestamp_micros() as f64 / 1000.0 - wall_ms();
        }
    }

    /// What a notification means for the timer.
    fn hear(&self, event: Result<ListenerEvent, broadcast::error::RecvError>) -> Heard {
        match event {
            Ok(ListenerEvent::Notification { channel, payload }) if &*channel == CHANNEL_DUE => {
                let due = payload
                    .split_once(' ')
                    .filter(|(namespace, _)| *namespace == self.shared.namespace.name())
                    .and_then(|(_, at)| at.parse::<f64>().ok())
                    .and_then(|at_ms| self.due_in(Some(at_ms - (wall_ms() + self.offset_ms))));
                due.map_or(Heard::Nothing, Heard::Due)
            }
            Ok(ListenerEvent::Notification { channel, payload })
                if &*channel == NODES_CHANNEL
                    && payload.starts_with(&format!("{} down ", self.shared.namespace)) =>
            {
                Heard::NodeDown
            }
            // Announcements may have been missed: look now.
            Ok(ListenerEvent::Restored) | Err(broadcast::error::RecvError::Lagged(_)) => {
                Heard::Due(Instant::now())
            }
            _ => Heard::Nothing,
        }
    }

    /// Promotes due jobs; returns when the next one is due.
    async fn promote(&mut self) -> Option<Instant> {
        self.last_promote = Some(Instant::now());
        let row = async {
            let mut session = self.leadership.session().await?;
            Ok::<Promoted, Error>(
                sqlx::query_as("SELECT * FROM forge.jobs_promote($1, $2)")
                    .bind(&self.shared.namespace)
                    .bind(BATCH)
                    .fetch_one(&mut *session)
                    .await?,
            )
        };
        let row = match timeout(self.shared.statement_bound, row).await {
            Ok(Ok(row)) => row,
            Ok(Err(err)) => {
                warn!(target: "forge::job", error = %err, "promoting due jobs failed; retrying in 1s");
                return Some(Instant::now() + Duration::from_secs(1));
            }
            Err(_) => {
                warn!(target: "forge::job", "promoting due jobs got no answer in time; retrying in 1s");
                return Some(Instant::now() + Duration::from_secs(1));
            }
        };
        let promoted = row.promoted.or_default();
        let next = row.next_due_in_ms.or_default();
        self.observe_clock(row.server_now.ok());
        if promoted > 0 {
            debug!(target: "forge::job", promoted, "promoted due jobs");
        }
        self.due_in(next)
    }

    /// The full pass; returns when the next job is due.
    async fn pass(&mut self) -> Option<Instant> {
        let token = self.leadership.fence_token();
        self.last_promote = Some(Instant::now());
        let rows = async {
            let mut session = self.leadership.session().await?;
            token
                .bind(sqlx::query(
                    "SELECT * FROM forge.jobs_maintain($1, $2, $3, $4, $5, $6)",
                ))
                .bind(self.shared.default_max_attempts())
                .bind(BATCH)
                .fetch_all(&mut *session)
                .await
                .map_err(|err| token.map_error(err))
        };
        let rows = match timeout(self.shared.statement_bound, rows).await {
            Ok(Ok(rows)) => rows,
            Ok(Err(Error::Fenced { .. })) => {
                debug!(target: "forge::job", "job maintenance refused by the fence: this leadership is over");
                return None;
            }
            Ok(Err(err)) => {
                warn!(target: "forge::job", error = %err, "job maintenance failed; retrying at the next pass");
                return None;
            }
            Err(_) => {
                warn!(target: "forge::job", "job maintenance got no answer in time; retrying at the next pass");
                return None;
            }
        };
        let mut next_due = None;
        for row in rows {
            // Every column is lenient, so this always reads (a row without event is skipped).
            let row = Maintained::from_row(&row).unwrap_or_default();
            match row.event.0 {
                Ok(MaintainEvent::Rescued) => self.rescued(row),
                Ok(MaintainEvent::Deferred) => {
                    let n = row.n.or_default() as u64;
                    info!(target: "forge::job", jobs = n,
                          "jobs to rescue are held by another transaction (a frozen node's, say); rescuing them at the next pass");
                    self.deferred = true;
                }
                Ok(MaintainEvent::Settled) => {
                    let n = row.n.or_default() as u64;
                    info!(target: "forge::job", parents = n,
                          "counted in their children the ends of parent jobs that SQL outside FORGE wrote (an UPDATE or DELETE of forge.jobs)");
                }
                Ok(MaintainEvent::NextDue) => {
                    self.observe_clock(row.at.ok());
                    next_due = self.due_in(row.n.ok());
                }
                Err(err) => {
                    warn!(target: "forge::job", error = %err, "job maintenance answered a row this node does not understand")
                }
            }
        }
        next_due
    }

    /// Logs and counts a `rescued` row: `n` jobs of a queue and kind left in `state`.
    fn rescued(&self, row: Maintained) {
        let queue = row.queue.or_default();
        let kind = row.kind.or_default();
        let n = row.n.or_default() as u64;
        match row.state.0 {
            Ok(state) => {
                warn!(target: "forge::job", queue = %queue, job = %kind, jobs = n, state = %state,
                      "rescued running jobs of a node that is down or stopped");
                record_rescue(&self.metrics, &queue, &kind, state, n);
            }
            Err(err) => {
                warn!(target: "forge::job", queue = %queue, job = %kind, jobs = n, error = %err,
                      "rescued running jobs of a node that is down or stopped (their state is unreadable)");
            }
        }
    }
}

/// The row of `forge.jobs_promote`. Its columns, and those of [`Maintained`], are lenient: a
/// newer node may have replaced these functions during a rolling upgrade, and this node then
/// does what it can with what it understands.
#[derive(sqlx::FromRow)]
#[sqlx(default)]
#[derive(Default)]
struct Promoted {
    promoted: Lenient<i64>,
    next_due_in_ms: Lenient<Option<f64>>,
    server_now: Lenient<DateTime<Utc>>,
}

/// A row of `forge.jobs_maintain`: what its `event` says, with the columns that event uses.
#[derive(sqlx::FromRow)]
#[sqlx(default)]
#[derive(Default)]
struct Maintained {
    event: Lenient<MaintainEvent>,
    queue: Lenient<String>,
    kind: Lenient<String>,
    state: Lenient<JobState>,
    n: Lenient<f64>,
    at: Lenient<DateTime<Utc>>,
}

forge_core::sql_enum! {
    /// The kind of a row `forge.jobs_maintain` returns (its `event` column).
    pub(crate) enum MaintainEvent {
        /// `n` running jobs of a queue and kind were rescued into `state`.
        Rescued = "rescued",
        /// `n` jobs to rescue were held by another transaction: the next pass tries again.
        Deferred = "deferred",
        /// The ends of `n` parent jobs that SQL outside FORGE wrote were counted in their
        /// children.
        Settled = "settled",
        /// The next scheduled job or retry is due in `n` ms; `at` is the server's clock.
        NextDue = "next_due",
    }
}

#[cfg(test)]
mod tests {
    use super::MaintainEvent;
    use crate::schema::source::{function, literals_after};

    #[test]
    fn every_event_of_jobs_maintain_parses() {
        let sql = function("jobs_maintain");
        let events = literals_after(sql, "SELECT '");
        let mut parsed: Vec<MaintainEvent> = events
            .iter()
            .map(|event| {
                MaintainEvent::parse(event).unwrap_or_else(|| panic!("{event:?} in {sql}"))
            })
            .collect();
        parsed.sort();
        parsed.dedup();
        assert_eq!(parsed, MaintainEvent::ALL);
    }
}
