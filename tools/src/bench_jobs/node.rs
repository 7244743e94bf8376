//! The node process: this binary with `--jobs-node <forge.toml>`, its no-op and ping jobs.

use std::process::ExitCode;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use forge::jobs::Job;
use forge::{JobContext, JobError};

/// A job that does nothing but note when it ran, for the node's `FORGE-BENCH DRAIN` line.
#[allow(non_camel_case_types)]
pub(super) struct noop;

/// How many no-op jobs this node process ran, and when the first started and the last ended
/// (wall clock, microseconds): the drain's span when completed jobs leave no row to time it by
/// (`--extra-config` with `completed_retention = "0s"`).
static HANDLED: AtomicU64 = AtomicU64::new(0);
static FIRST_US: AtomicI64 = AtomicI64::new(0);
static LAST_US: AtomicI64 = AtomicI64::new(0);

impl Job for noop {
    type Args = ();
    const KIND: &'static str = "noop";

    async fn run(&self, _: JobContext, _: ()) -> Result<(), JobError> {
        let _ = FIRST_US.compare_exchange(0, now_us(), Ordering::Relaxed, Ordering::Relaxed);
        HANDLED.fetch_add(1, Ordering::Relaxed);
        LAST_US.fetch_max(now_us(), Ordering::Relaxed);
        Ok(())
    }
}

/// A job that sleeps its argument's milliseconds (the queue limits' part).
#[allow(non_camel_case_types)]
pub(super) struct nap;

impl Job for nap {
    type Args = u64;
    const KIND: &'static str = "nap";

    async fn run(&self, _: JobContext, ms: u64) -> Result<(), JobError> {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        Ok(())
    }
}

/// A job that prints how long after its enqueue (wall clock, microseconds) it started.
#[allow(non_camel_case_types)]
pub(super) struct ping;

impl Job for ping {
    type Args = i64;
    const KIND: &'static str = "ping";

    async fn run(&self, _: JobContext, sent_us: i64) -> Result<(), JobError> {
        println!("FORGE-BENCH LAT {}", now_us() - sent_us);
        Ok(())
    }
}

pub(super) fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

/// The argument that makes this binary a node process (`bench_scale` re-executes itself the
/// same way for its jobs part: see there).
pub const NODE_FLAG: &str = "--jobs-node";

/// The node process.
pub async fn node(config: String) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let started = async {
        let config = forge::Config::load(&config)?;
        forge::Node::builder(config)
            .auto_register(false)
            .job(noop)
            .job(ping)
            .job(nap)
            .start()
            .await
    };
    match started.await {
        Ok(node) => {
            println!("FORGE-BENCH READY node={}", node.id());
            let ran = node.run_until_signal().await;
            println!(
                "FORGE-BENCH DRAIN node={} handled={} first_us={} last_us={}",
                std::env::var("FORGE_NODE_ID").unwrap_or_default(),
                HANDLED.load(Ordering::Relaxed),
                FIRST_US.load(Ordering::Relaxed),
                LAST_US.load(Ordering::Relaxed)
            );
            match ran {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
