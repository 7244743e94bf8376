//! The guide's "Crons", "Crons stored in the database": a cron stored at run time.
//!
//! ```text
//! DATABASE_URL=postgres://localhost/app cargo run -p forge-readme --example stored_crons
//! ```

use forge::{Config, JobContext, JobError, Node};

/// The job the stored cron enqueues.
#[forge::job]
async fn send_report(_ctx: JobContext, args: serde_json::Value) -> Result<(), JobError> {
    tracing::info!(%args, "report sent");
    Ok(())
}

async fn store_a_cron(node: &forge::Node) -> forge::Result<()> {
    let cron = forge::crons::StoredCron::new(
        "nightly-report",
        forge::Schedule::parse_in("0 3 * * *", "Europe/Paris")?,
        "send_report",
        serde_json::json!({ "to": "ops@example.com" }),
    )?
    .catch_up(forge::crons::CatchUp::Skip);
    node.workload().upsert_cron(&cron, "alice").await?;
    Ok(())
}

#[tokio::main]
async fn main() -> forge::Result<()> {
    let node = Node::builder(Config::from_env()?).start().await?;
    store_a_cron(&node).await?;
    node.shutdown().await;
    Ok(())
}
