//! Statements per node while the nodes idle.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tokio::time::sleep;

use super::harness::Bench;
use super::{BoxError, Mode};

/// Statements per node while `nodes` nodes idle for `window`, from the server's statement log.
pub(super) async fn idle(
    bench: &mut Bench,
    log: &Path,
    nodes: usize,
    window: Duration,
) -> Result<BTreeMap<String, (usize, usize)>, BoxError> {
    let (_db, pool, config) = bench.database(Mode::Kept).await?;
    sqlx::query("ALTER SYSTEM SET log_statement = 'all'")
        .execute(&pool)
        .await?;
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&pool)
        .await?;
    let mut processes = Vec::new();
    for _ in 0..nodes {
        let mut process = bench.spawn(&config)?;
        Bench::ready(&mut process).await?;
        processes.push(process);
    }
    // Let start-up settle (elections, first maintenance passes), then measure a clean window.
    sleep(Duration::from_secs(5)).await;
    let start_len = std::fs::metadata(log)?.len();
    sleep(window).await;
    let text = std::fs::read(log)?;
    sqlx::query("ALTER SYSTEM RESET log_statement")
        .execute(&pool)
        .await?;
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&pool)
        .await?;
    Bench::stop(processes.iter_mut().collect()).await?;

    let text = String::from_utf8_lossy(&text[start_len as usize..]);
    let mut per_node: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for line in text.lines() {
        let is_statement = line.contains(" LOG:  statement: ") || line.contains(" LOG:  execute ");
        if !is_statement {
            continue;
        }
        let Some(app) = line
            .split(" app=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
        else {
            continue;
        };
        if !app.starts_with("forge:") || app.starts_with("forge:setup:") {
            continue;
        }
        let Some(node) = app.rsplit(':').next() else {
            continue;
        };
        let entry = per_node.entry(node.to_owned()).or_default();
        entry.0 += 1;
        if line.contains("forge.jobs_") || line.contains("forge.nodes") {
            entry.1 += 1;
        }
    }
    Ok(per_node)
}
