//! The peer FORGE's drain rate is judged against: `tools/peers`, built and run for one round.

use std::path::{Path, PathBuf};

use tokio::process::Command;

use super::BoxError;

/// The peer FORGE's drain rate is judged against (issue 11): graphile_worker 0.14 polling every
/// 10 ms with a local queue of 500 and batched completions (`benches/peers`, `--tuning full`).
pub const PEER_LABEL: &str = "graphile_worker best tuning";

/// Builds `benches/peers` (its own workspace and lock file; the first build fetches and
/// compiles graphile_worker and riverqueue, a few minutes) and returns its binary.
pub async fn build_peer() -> Result<PathBuf, BoxError> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers");
    let target = dir.join("target");
    println!("Building benches/peers (graphile_worker, riverqueue) for the side-by-side rounds...");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .status()
        .await
        .map_err(|err| format!("could not run cargo to build benches/peers: {err}"))?;
    if !status.success() {
        return Err(format!(
            "building benches/peers failed ({status}); it needs crates.io (graphile_worker 0.14, riverqueue 0.5)"
        )
        .into());
    }
    Ok(target.join("release/forge-peers-bench"))
}

/// One round of the peer on the server of `url` (a database of its own): its drain rate.
pub(super) async fn peer_round(binary: &Path, url: &str) -> Result<f64, BoxError> {
    let output = Command::new(binary)
        .args([
            url, "--quick", "--only", "graphile", "--tuning", "full", "--cap", "60",
        ])
        .output()
        .await
        .map_err(|err| format!("could not start {}: {err}", binary.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("PEER ")?.split("median ").nth(1))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no PEER line in its output: {}", stdout.trim()).into())
}
