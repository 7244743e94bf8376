//! Queue limits (`--only limits`): the same backlog of short jobs (`nap`: 10 ms each) drained
//! by 2 node processes (16 at once each), without limits, under a global concurrency limit of
//! 16, and under a rate, side by side in each round: jobs/s, and how many were running on
//! average, two ways:
//! - in the database, as the limit counts them: the jobs in state `running`, sampled every
//!   20 ms while jobs were still waiting (a claim that ends one attempt and starts the next
//!   commits both at once, so a slot the limit keeps busy never shows free);
//! - from claims to outcomes: the attempts' time from claim to recorded outcome over the
//!   drain's span, which leaves out the time between one attempt's recorded outcome and its
//!   slot's next claim (within one round trip: the claim's wait for the queue's limit lock and
//!   its statements).
//!
//! Unlimited, 32 slots; a global limit of 16 should keep 16 running; the rate should hold the
//! drain to it.

use std::time::Duration;

use forge::jobs::{Jobs, NewJob, QueueLimits};
use tokio::time::{Instant, sleep};

use super::harness::Bench;
use super::node::nap;
use super::{BoxError, Mode};

/// How long each job of this part takes.
pub(super) const NAP_MS: u64 = 10;

/// One drain: jobs/s (first claim to last completion) and the average running (see the
/// module's header).
pub(super) struct Limited {
    pub(super) per_s: f64,
    /// From claims to recorded outcomes.
    pub(super) running: f64,
    /// In the database, sampled while jobs waited.
    pub(super) sampled: f64,
}

/// Inserts `total` nap jobs, sets `limits` (none: unlimited), starts 2 node processes and
/// waits until every job is completed.
pub(super) async fn limited_drain(
    bench: &mut Bench,
    total: usize,
    limits: Option<QueueLimits>,
) -> Result<Limited, BoxError> {
    let (db, pool, config) = bench.database(Mode::Kept).await?;
    let writers = db.pool().await?;
    let jobs = Jobs::new(writers.clone(), &forge::LockNamespace::default());
    for chunk in 0..total.div_ceil(1000) {
        let n = 1000.min(total - chunk * 1000);
        jobs.enqueue_many((0..n).map(|_| NewJob::new(nap, NAP_MS)))
            .await?;
    }
    writers.close().await;
    sqlx::query("ANALYZE forge.jobs").execute(&pool).await?;
    let workload = forge::inspect::Workload::new(pool.clone(), forge::LockNamespace::default());
    workload.pause_queue("default", "bench", true).await?;
    if let Some(limits) = &limits {
        workload
            .set_queue_limits("default", limits, "bench", true)
            .await?;
    }
    let mut processes = vec![bench.spawn(&config)?, bench.spawn(&config)?];
    for process in &mut processes {
        Bench::ready(process).await?;
    }
    workload.resume_queue("default", "bench").await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut samples = Vec::new();
    loop {
        let (running, waiting, finished): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'running'),
                    count(*) FILTER (WHERE state = 'available'),
                    count(*) FILTER (WHERE state = 'completed')
               FROM forge.jobs WHERE namespace = 'forge' AND queue = 'default'",
        )
        .fetch_one(&pool)
        .await?;
        if running + waiting == 0 {
            break;
        }
        if waiting > 0 && (running > 0 || finished > 0) {
            samples.push(running as f64);
        }
        if Instant::now() > deadline {
            return Err(format!("the {total} jobs were not completed in 600 s").into());
        }
        sleep(Duration::from_millis(20)).await;
    }
    let (span, busy): (f64, f64) = sqlx::query_as(
        "SELECT extract(epoch FROM max(finished_at) - min(attempted_at))::float8,
                extract(epoch FROM sum(finished_at - attempted_at))::float8
           FROM forge.jobs WHERE queue = 'default' AND state = 'completed'",
    )
    .fetch_one(&pool)
    .await?;
    Bench::stop(processes.iter_mut().collect()).await?;
    Ok(Limited {
        per_s: total as f64 / span,
        running: busy / span,
        sampled: samples.iter().sum::<f64>() / samples.len().max(1) as f64,
    })
}
