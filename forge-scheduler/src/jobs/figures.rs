//! The `metrics_aggregator` leader's queue figures: every `[jobs] maintenance_interval` (15 s by
//! default), the unfinished jobs by queue,
//! kind and state (`forge_job_queue_depth`), the age of each queue's oldest due job
//! (`forge_job_oldest_age_seconds`), the dead jobs (`forge_job_dead_jobs`) and whether a
//! queue's limit holds its available jobs back (`forge_job_queue_limited`), reported by that
//! leader only (registered through the tenure's metrics: they go when the tenure ends), so
//! that one scrape sees the whole cluster's queues; once per
//! `[metrics] rollup_interval`, the same as cluster series (`queue_depth`,
//! `oldest_job_age_seconds`, `dead_jobs`) for the charts.
//!
//! A look counts every unfinished job from the indexes alone (see `migrations/functions/jobs_figures.sql`): about 0.2 s
//! of one database core per million queued jobs. So that a huge backlog cannot make the figures
//! a load of their own, the next look waits at least [`LOOK_SHARE`] times as long as the last
//! one took (the count alone, not waiting for a session), up to 20 intervals: past about 1.5
//! million queued jobs (at the 15 s default) the figures are refreshed less often rather than
//! costing more.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DurationRound, TimeDelta, Utc};
use forge_core::{Error, Leadership};
use tokio::time::{Instant, sleep, timeout};
use tracing::debug;

use super::JobState;
use crate::metrics::{
    JOB_DEAD_JOBS, JOB_KIND_LIMITED, JOB_OLDEST_AGE, JOB_QUEUE_DEPTH, JOB_QUEUE_LIMITED, Series,
};

/// One look at the queues.
#[derive(Default)]
struct Look {
    /// (queue, kind, state) -> jobs.
    depth: BTreeMap<(String, String, JobState), f64>,
    /// queue -> age in seconds of the oldest due (available) job.
    oldest: BTreeMap<String, f64>,
    /// queue -> dead jobs.
    dead: BTreeMap<String, f64>,
    /// (queue, limit) -> whether the limit holds available jobs back.
    limited: BTreeMap<(String, String), bool>,
    /// (job kind, limit) -> whether the limit holds available jobs back.
    kind_limited: BTreeMap<(String, String), bool>,
}

/// A look takes at most one part in `LOOK_SHARE` of the leader's time (2 % of one database
/// core): the pause after a look is at least this many times the look's duration.
const LOOK_SHARE: u32 = 50;

/// How far a slow look may stretch the pause, in `maintenance_interval`s: one look slowed by
/// something else (a lock held by a migration, a stalled disk) must not hide the figures for
/// long.
const MAX_STRETCH: u32 = 20;

/// The pause after a look that took `took`.
fn pause_after(every: Duration, took: Duration) -> Duration {
    every.max((took * LOOK_SHARE).min(every * MAX_STRETCH))
}

/// The leader task.
pub(crate) async fn run(leadership: Leadership, every: Duration, width: Duration) {
    let width = TimeDelta::from_std(width).unwrap_or(TimeDelta::minutes(1));
    let mut reported = Look::default();
    let mut sampled = None;
    loop {
        let mut pause = every;
        match look(&leadership).await {
            Ok((look, took)) => {
                pause = pause_after(every, took);
                report(&leadership, &look, &reported);
                let bucket = Utc::now().duration_trunc(width).ok();
                if bucket != sampled {
                    if !sample(&leadership, &look, bucket).await {
                        return;
                    }
                    sampled = bucket;
                }
                reported = look;
            }
            Err(err) => {
                debug!(target: "forge::aggregator", error = %err, "cannot read the queue figures")
            }
        }
        tokio::select! {
            _ = sleep(pause) => {}
            _ = leadership.stopping() => return,
        }
    }
}

/// One row of `forge.jobs_figures`: the jobs of a queue and kind in a state.
#[derive(sqlx::FromRow)]
struct Figure {
    queue: String,
    kind: String,
    state: JobState,
    n: i64,
    oldest_age_s: Option<f64>,
}

/// The figures, and how long the database took to count them.
async fn look(leadership: &Leadership) -> Result<(Look, Duration), Error> {
    let rows = async {
        let mut session = leadership.session().await?;
        let started = Instant::now();
        let rows: Vec<Figure> = sqlx::query_as("SELECT * FROM forge.jobs_figures($1)")
            .bind(leadership.namespace())
            .fetch_all(&mut *session)
            .await?;
        let took = started.elapsed();
        let reached: Vec<(String, String, Option<bool>)> =
            sqlx::query_as("SELECT * FROM forge.queue_limits_reached($1)")
                .bind(leadership.namespace())
                .fetch_all(&mut *session)
                .await?;
        let kinds_reached: Vec<(String, String, Option<bool>)> =
            sqlx::query_as("SELECT * FROM forge.kind_limits_reached($1)")
                .bind(leadership.namespace())
                .fetch_all(&mut *session)
                .await?;
        Ok::<_, Error>(((rows, reached, kinds_reached), took))
    };
    let ((rows, reached, kinds_reached), took) = timeout(leadership.lease_duration(), rows)
        .await
        .map_err(|_| Error::Database(sqlx::Error::PoolTimedOut))??;
    let mut look = Look::default();
    for Figure {
        queue,
        kind,
        state,
        n,
        oldest_age_s: age,
    } in rows
    {
        let n = n as f64;
        if state == JobState::Dead {
            *look.dead.entry(queue).or_default() += n;
            continue;
        }
        if state == JobState::Available {
            let oldest = look.oldest.entry(queue.clone()).or_default();
            *oldest = oldest.max(age.unwrap_or_default().max(0.0));
        }
        look.depth.insert((queue, kind, state), n);
    }
    for (queue, limit, reached) in reached {
        let waiting = look
            .depth
            .iter()
            .any(|((q, _, s), n)| *q == queue && *s == JobState::Available && *n > 0.0);
        look.limited
            .insert((queue, limit), waiting && reached == Some(true));
    }
    for (kind, limit, reached) in kinds_reached {
        let waiting = look
            .depth
            .iter()
            .any(|((_, k, s), n)| *k == kind && *s == JobState::Available && *n > 0.0);
        look.kind_limited
            .insert((kind, limit), waiting && reached == Some(true));
    }
    Ok((look, took))
}

fn report(leadership: &Leadership, look: &Look, before: &Look) {
    let m = leadership.metrics();
    let depth = |(queue, kind, state): &(String, String, JobState)| {
        m.gauge(
            &JOB_QUEUE_DEPTH,
            &[("queue", queue), ("kind", kind), ("state", state.as_str())],
        )
    };
    for (key, n) in &look.depth {
        depth(key).set(*n);
    }
    for key in before.depth.keys() {
        if !look.depth.contains_key(key) {
            depth(key).set(0.0);
        }
    }
    let queues: BTreeSet<&String> = look
        .oldest
        .keys()
        .chain(look.dead.keys())
        .chain(before.oldest.keys())
        .chain(before.dead.keys())
        .collect();
    for (queue, limit) in look.limited.keys().chain(before.limited.keys()) {
        let held = look.limited.get(&(queue.clone(), limit.clone())) == Some(&true);
        m.gauge(&JOB_QUEUE_LIMITED, &[("queue", queue), ("limit", limit)])
            .set(if held { 1.0 } else { 0.0 });
    }
    for (kind, limit) in look.kind_limited.keys().chain(before.kind_limited.keys()) {
        let held = look.kind_limited.get(&(kind.clone(), limit.clone())) == Some(&true);
        m.gauge(&JOB_KIND_LIMITED, &[("kind", kind), ("limit", limit)])
            .set(if held { 1.0 } else { 0.0 });
    }
    for queue in queues {
        m.gauge(&JOB_OLDEST_AGE, &[("queue", queue)])
            .set(look.oldest.get(queue).copied().unwrap_or(0.0));
        m.gauge(&JOB_DEAD_JOBS, &[("queue", queue)])
            .set(look.dead.get(queue).copied().unwrap_or(0.0));
    }
}

/// Writes the look as this interval's samples. False when fenced.
async fn sample(
    leadership: &Leadership,
    look: &Look,
    bucket: Option<chrono::DateTime<Utc>>,
) -> bool {
    let Some(bucket) = bucket else {
        return true;
    };
    let mut depth: BTreeMap<&str, f64> = BTreeMap::new();
    for ((queue, _, _), n) in &look.depth {
        *depth.entry(queue).or_default() += n;
    }
    let mut series = Vec::new();
    let mut labels = Vec::new();
    let mut values = Vec::new();
    let points = depth
        .into_iter()
        .map(|(queue, n)| (Series::QueueDepth, queue, n))
        .chain(
            look.oldest
                .iter()
                .map(|(queue, age)| (Series::OldestJobAge, queue.as_str(), *age)),
        )
        .chain(
            look.dead
                .iter()
                .map(|(queue, n)| (Series::DeadJobs, queue.as_str(), *n)),
        );
    for (name, label, value) in points {
        series.push(name);
        labels.push(label);
        values.push(value);
    }
    let token = leadership.fence_token();
    let written = async {
        let mut session = leadership.session().await?;
        token
            .bind(sqlx::query(
                "SELECT forge.stats_sample($1, $2, $3, $4, $5, $6, $7, $8)",
            ))
            .bind(bucket)
            .bind(&series)
            .bind(&labels)
            .bind(&values)
            .execute(&mut *session)
            .await
            .map_err(|err| token.map_error(err))
    };
    match written.await {
        Ok(_) => true,
        Err(Error::Fenced { .. }) => false,
        Err(err) => {
            debug!(target: "forge::aggregator", error = %err, "cannot write the queue samples");
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_look_stretches_the_pause_up_to_twenty_intervals() {
        let every = Duration::from_secs(15);
        let s = Duration::from_secs_f64;
        assert_eq!(pause_after(every, s(0.2)), every, "0.2 s: 10 s < 15 s");
        assert_eq!(pause_after(every, s(1.0)), s(50.0));
        assert_eq!(
            pause_after(every, s(60.0)),
            s(300.0),
            "capped at 20 intervals"
        );
    }
}
