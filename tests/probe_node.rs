//! The probe node process used by the multi-process tests (see `forge_tests::probe`).
//!
//! `forge-probe-node [forge.toml]`: configuration from the file if given, then the
//! environment (`DATABASE_URL`, `FORGE_NODE_ID`, `FORGE_ROLES`, ...).

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,forge::leader=info".into()),
        )
        .init();
    let config = match std::env::args().nth(1) {
        Some(path) => forge::Config::load(path),
        None => forge::Config::from_env(),
    };
    match config {
        Ok(config) => forge_tests::probe::run(config).await,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
