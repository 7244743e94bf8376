//! The job node process used by the multi-process job tests (`tests/it/jobs_process.rs`).
//!
//! `forge-job-node [forge.toml]`: configuration from the file if given, then the environment
//! (`DATABASE_URL`, `FORGE_NODE_ID`, `FORGE_ROLES`, ...). It registers the job types of
//! `job_types.rs`, prints `FORGE-JOBS READY node=<id>` once started, and runs until SIGTERM
//! (graceful shutdown, then `FORGE-JOBS STOPPED node=<id>`) or SIGKILL.
//!
//! `forge-job-node enqueue ...`: an enqueuing process instead of a node (`job_enqueue.rs`).

#[path = "job_types.rs"]
mod job_types;

#[path = "job_enqueue.rs"]
mod job_enqueue;

use std::process::ExitCode;

use job_types::*;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,forge::job=info".into()),
        )
        .init();
    // The enqueuing process of the unique-job tests (tests/it/unique.rs).
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("enqueue") {
        return job_enqueue::main(&args[2..]).await;
    }
    let config = match std::env::args().nth(1) {
        Some(path) => forge::Config::load(path),
        None => forge::Config::from_env(),
    };
    let config = match config {
        Ok(config) => config,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let node = forge::Node::builder(config)
        .auto_register(false)
        .job(plain)
        .job(retrying)
        .job(quick_retry)
        .job(report)
        .job(effect)
        .job(poison)
        .job(flow_step)
        // A kind with a global limit of 3 (tests/it/kind_limits.rs): the other kinds' claims
        // stay unlimited ones, ahead too (jobs_process's poison-ahead test).
        .job(capped);
    let node = node.start().await;
    let node = match node {
        Ok(node) => node,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let tables = format!("{RUNS_TABLE_SQL}; {EFFECTS_TABLE_SQL}; {FLOW_TABLE_SQL}");
    if let Err(err) = sqlx::raw_sql(sqlx::AssertSqlSafe(tables))
        .execute(node.pool())
        .await
    {
        eprintln!("error: {err}");
        return ExitCode::FAILURE;
    }
    println!("FORGE-JOBS READY node={}", node.id());
    let stopped = node.run_until_signal().await;
    println!("FORGE-JOBS STOPPED node={}", node.id());
    match stopped {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
