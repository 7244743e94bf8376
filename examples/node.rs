//! Runs one FORGE node from a forge.toml until SIGTERM or ctrl-c, then hands its roles over.
//!
//! ```text
//! DATABASE_URL=postgres://localhost/app FORGE_NODE_ID=a cargo run --example node -- forge.toml
//! ```
//!
//! Start it in two or three terminals with different FORGE_NODE_IDs, stop or kill the leader,
//! and watch another node take over.

use std::process::ExitCode;
use std::time::Duration;

use forge::{Config, Leadership, Node, Role};
use tracing::info;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "forge.toml".into());
    let config = match Config::load(&path) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut builder = Node::builder(config);
    for role in Role::BUILTIN {
        builder = builder.leader_task(role, "heartbeat", heartbeat);
    }
    let node = match builder.start().await {
        Ok(node) => node,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    match node.run_until_signal().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Leader-only work of the example: log every few seconds while leading.
async fn heartbeat(leadership: Leadership) {
    info!(role = %leadership.role(), epoch = %leadership.epoch(), "leading");
    loop {
        tokio::select! {
            _ = leadership.stopping() => return,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        if !leadership.is_valid() {
            return;
        }
        info!(role = %leadership.role(), epoch = %leadership.epoch(), "still leading");
    }
}
