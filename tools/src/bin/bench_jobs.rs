//! The job queue benchmark (`--help` lists its options): what it measures and how is
//! [`forge_tools::bench_jobs`], which `bench_scale` runs too.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    forge_tools::bench_jobs::run().await
}
