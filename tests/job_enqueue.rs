//! `forge-job-node enqueue <key> <first> <count> <keep|replace> <barrier>`: the enqueuing
//! process of the multi-process unique-job tests (`tests/it/unique.rs`). It is no node: it
//! enqueues `count` jobs of kind `plain` with the unique key `<key>` through `Jobs::new`
//! (`DATABASE_URL`, the default namespace), each from its own connection, tagged
//! `n<first>`..`n<first + count - 1>`.
//!
//! The enqueues start together across processes: each connection first waits in
//! `pg_advisory_lock_shared(<barrier>)`, which the test holds exclusively until every
//! connection of every process waits there (it sees them in `pg_locks`), then releases.
//!
//! - `keep`: a key with a one-hour period; even tags enqueue on their connection, odd ones
//!   inside a transaction that commits.
//! - `replace` (debounce): each enqueue runs in a transaction, with a delay of i + 1 minutes
//!   for tag `n<i>`, and records its tag with `nextval('debounce_order')` in the table
//!   `debounced (tag, n)` in the same transaction, so the order of the commits that took the
//!   key is the order of `n`.
//!
//! Prints `FORGE-ENQUEUE <tag> <inserted|duplicate|replaced> <id>` per job, then
//! `FORGE-ENQUEUE DONE`, and exits 0 (1 with `error: ...` on any failure).

use std::process::ExitCode;
use std::time::Duration;

use forge::jobs::{Enqueued, Jobs, NewJob, UniqueMode};
use sqlx::postgres::PgPoolOptions;

use crate::job_types::{Behave, plain};

struct Spec {
    key: String,
    first: u64,
    count: u64,
    replace: bool,
    barrier: i64,
}

fn parse(args: &[String]) -> Result<Spec, String> {
    let usage = "usage: forge-job-node enqueue <key> <first> <count> <keep|replace> <barrier>";
    let [key, first, count, mode, barrier] = args else {
        return Err(usage.into());
    };
    let number = |what: &str, text: &str| {
        text.parse::<u64>()
            .map_err(|err| format!("{what} {text:?}: {err}; {usage}"))
    };
    Ok(Spec {
        key: key.clone(),
        first: number("first", first)?,
        count: number("count", count)?,
        replace: match mode.as_str() {
            "keep" => false,
            "replace" => true,
            other => return Err(format!("mode {other:?}: use keep or replace; {usage}")),
        },
        barrier: barrier
            .parse()
            .map_err(|err| format!("barrier {barrier:?}: {err}; {usage}"))?,
    })
}

pub(crate) async fn main(args: &[String]) -> ExitCode {
    match run(args).await {
        Ok(()) => {
            println!("FORGE-ENQUEUE DONE");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &[String]) -> Result<(), String> {
    let spec = parse(args)?;
    let url = std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is not set".to_owned())?;
    let pool = PgPoolOptions::new()
        .max_connections(spec.count as u32)
        .connect(&url)
        .await
        .map_err(|err| err.to_string())?;
    let jobs = Jobs::new(pool.clone(), &forge::LockNamespace::default());
    let spec = std::sync::Arc::new(spec);
    let tasks: Vec<_> = (spec.first..spec.first + spec.count)
        .map(|i| {
            let (pool, jobs, spec) = (pool.clone(), jobs.clone(), spec.clone());
            tokio::spawn(async move { enqueue_one(&pool, &jobs, &spec, i).await })
        })
        .collect();
    for task in tasks {
        let (tag, result) = task.await.map_err(|err| err.to_string())??;
        let (what, id) = match result {
            Enqueued::Inserted(id) => ("inserted", id),
            Enqueued::Duplicate(id) => ("duplicate", id),
            Enqueued::Replaced(id) => ("replaced", id),
        };
        println!("FORGE-ENQUEUE {tag} {what} {}", id.0);
    }
    Ok(())
}

/// Waits at the barrier on a connection of its own, then enqueues job `n<i>`.
async fn enqueue_one(
    pool: &sqlx::PgPool,
    jobs: &Jobs,
    spec: &Spec,
    i: u64,
) -> Result<(String, Enqueued), String> {
    let tag = format!("n{i}");
    let error = |err: &dyn std::fmt::Display| format!("{tag}: {err}");
    let mut conn = pool.acquire().await.map_err(|err| error(&err))?;
    sqlx::query("SELECT pg_advisory_lock_shared($1)")
        .bind(spec.barrier)
        .execute(&mut *conn)
        .await
        .map_err(|err| error(&err))?;
    let job = NewJob::new(plain, Behave::tag(&tag)).unique_key(spec.key.as_str());
    let job = if spec.replace {
        job.unique_mode(UniqueMode::Replace)
            .delay(Duration::from_secs(60 * (i + 1)))
    } else {
        job.unique_period(Duration::from_secs(3600))
    };
    if !spec.replace && i.is_multiple_of(2) {
        let result = jobs
            .enqueue_job_in(&mut *conn, job)
            .await
            .map_err(|err| error(&err))?;
        return Ok((tag, result));
    }
    let mut tx = sqlx::Connection::begin(&mut *conn)
        .await
        .map_err(|err| error(&err))?;
    let result = jobs
        .enqueue_job_in(&mut *tx, job)
        .await
        .map_err(|err| error(&err))?;
    if spec.replace {
        sqlx::query("INSERT INTO debounced (tag, n) VALUES ($1, nextval('debounce_order'))")
            .bind(&tag)
            .execute(&mut *tx)
            .await
            .map_err(|err| error(&err))?;
    }
    tx.commit().await.map_err(|err| error(&err))?;
    Ok((tag, result))
}
