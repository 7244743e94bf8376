//! Every Rust snippet of the README and of the guide (`docs/src/`), compiled: each is here word
//! for word (the test `tests/it/readme.rs` checks it, paragraph by paragraph), in the items and
//! functions that give it what it names (a `node`, a `?` to return to). The OpenTelemetry
//! snippet is `examples/otel.rs`.
//!
//! And run: `forge-readme`, with `DATABASE_URL` (and `FORGE_NODE_ID`) and nothing else, is the
//! README's node - its migrations, its leader task on `billing`, its crons and its `mailers`
//! job (the `#[cron]`s and the `#[job]` register themselves), each snippet as written - until
//! SIGTERM or ctrl-c. `tests/readme_node.rs` starts two of them and sees the leader task and the
//! jobs run.

// Some snippets' items are used by nobody, and some bind what the next line shadows. Each is
// skipped by rustfmt: it is the README's text.
#![allow(dead_code, unused_variables)]

#[tokio::main]
async fn main() -> forge::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    migrations().await?;
    let node = leader_tasks().await?;
    jobs::enqueue(&node).await?;
    println!("ready {}", node.id());
    node.run_until_signal().await
}

#[cfg(test)]
mod user_tests;

/// The README's first snippet.
#[rustfmt::skip]
mod quick_start {
    use forge::{Config, CronContext, CronError, Node};

    #[forge::cron("0 * * * *")]                  // standard cron: every hour, on the hour
    async fn hourly_totals(ctx: CronContext) -> Result<(), CronError> {
        let mut tx = ctx.fenced_transaction().await?;   // refused if this node was deposed
        // The orders of the hour that ended at the tick: [tick - 1 h, tick).
        forge::sqlx::query("INSERT INTO totals (hour, amount)
                            SELECT $1 - interval '1 hour', coalesce(sum(amount), 0) FROM orders
                            WHERE created_at >= $1 - interval '1 hour' AND created_at < $1")
            .bind(ctx.scheduled_at())
            .execute(&mut *tx)
            .await?;
        ctx.complete(&mut tx).await?;           // the tick is done in the same commit: exactly once
        tx.commit().await?;
        Ok(())
    }

    #[tokio::main]
    async fn main() -> forge::Result<()> {
        let node = Node::builder(Config::from_env()?).start().await?;  // DATABASE_URL is enough
        node.run_until_signal().await           // SIGTERM / ctrl-c: finish, hand over, exit
    }
}

/// The guide's "Configuration".
#[rustfmt::skip]
fn configuration() -> forge::Result<()> {
    let config = forge::Config::from_env()?;          // DATABASE_URL, FORGE_NODE_ID, ... only
    let config = forge::Config::load("forge.toml")?;  // or a file, with the same overrides
    Ok(())
}

/// The README's leader task (and the guide's "Leader roles and routing"): the node `main` runs.
#[rustfmt::skip]
async fn leader_tasks() -> forge::Result<forge::Node> {
    use forge::{Config, Node, Role};

    let node = Node::builder(Config::from_env()?)
        .leader_task(Role::new("billing")?, "invoices", |leadership| async move {
            // Runs when this node wins the role; dropped the moment it loses it.
            while !leadership.is_draining() {
                let Ok(mut tx) = leadership.fenced_transaction().await else { return };  // deposed
                let issued = forge::sqlx::query(
                    "UPDATE invoices SET issued_at = now() WHERE issued_at IS NULL")
                    .execute(&mut *tx)
                    .await;
                if issued.is_err() || tx.commit().await.is_err() { return }
                tokio::select! {                                 // every 10 s, until a handover
                    _ = tokio::time::sleep(std::time::Duration::from_secs(10)) => {}
                    _ = leadership.stopping() => return,
                }
            }
        })
        .start()
        .await?;
    Ok(node)
}

/// The guide's "Leader roles and routing", "Routes that run on the leader only".
#[rustfmt::skip]
mod leader_routes {
    use forge::admin::axum::{Router, routing::post};
    use forge::admin::{Leader, LeaderOnly};

    async fn webhook(Leader(leadership): Leader) -> String {
        format!("handled by the scheduler's leader, epoch {}", leadership.epoch())
    }

    fn router(node: &forge::Node) -> Router {
        let app: Router = Router::new()
            .route("/webhook", post(webhook))
            .layer(LeaderOnly::new(node.clone(), forge::Role::SCHEDULER));
        app
    }
}

/// The guide's "Crons".
#[rustfmt::skip]
#[forge::cron("*/5 * * * *", tz = "Europe/Berlin", catch_up = "all", overlap = "skip",
              timeout = "2m")]
async fn rollup(ctx: forge::CronContext) -> Result<(), forge::CronError> {
    let mut tx = ctx.fenced_transaction().await?;
    forge::sqlx::query("INSERT INTO rollups (at) VALUES ($1)")
        .bind(ctx.scheduled_at())
        .execute(&mut *tx)
        .await?;
    ctx.complete(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// The README's job and the guide's "Jobs": the job type, its enqueueing, a cron that enqueues it.
#[rustfmt::skip]
mod jobs {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Welcome { user_id: i64 }

    #[forge::job(queue = "mailers", max_attempts = 5, backoff = "exponential",
                 backoff_base = "2s", timeout = "30s")]
    async fn send_welcome(ctx: forge::JobContext, args: Welcome) -> Result<(), forge::JobError> {
        // Any error retries with backoff; JobError::discard("...") dead-letters at once.
        let mut tx = ctx.pool().begin().await?;
        forge::sqlx::query("INSERT INTO outbox (job_id, user_id) VALUES ($1, $2)")
            .bind(ctx.id())
            .bind(args.user_id)
            .execute(&mut *tx)
            .await?;
        ctx.complete(&mut tx).await?;    // the outbox row and the job's completion: one commit
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn enqueue(node: &forge::Node) -> forge::Result<()> {
        // Through the node's client, or inside your own transaction (the job exists only if it commits).
        node.jobs().enqueue(send_welcome, Welcome { user_id: 7 }).await?;

        let mut tx = node.pool().begin().await?;
        forge::sqlx::query("INSERT INTO users (name) VALUES ('ada')").execute(&mut *tx).await?;
        node.jobs().enqueue_job_in(&mut *tx, forge::jobs::NewJob::new(send_welcome, Welcome { user_id: 8 })
            .delay(std::time::Duration::from_secs(60))
            .unique_key("welcome:8")).await?;              // a duplicate is reported, not inserted
        tx.commit().await?;
        Ok(())
    }

    #[forge::cron("0 3 * * *")]
    async fn nightly_welcomes(ctx: forge::CronContext) -> Result<(), forge::CronError> {
        let mut tx = ctx.fenced_transaction().await?;
        for user_id in [7, 8] {
            ctx.jobs().enqueue_in(&mut *tx, send_welcome, Welcome { user_id }).await?;
        }
        ctx.complete(&mut tx).await?;   // the jobs and the tick's outcome: one commit
        tx.commit().await?;
        Ok(())
    }
}

/// The guide's "Jobs": unique jobs over time, snooze, a custom backoff.
#[rustfmt::skip]
mod flow_control {
    #[forge::job(unique = true, unique_period = "1h")]
    async fn sync_customer(ctx: forge::JobContext, customer_id: i64) -> Result<(), forge::JobError> {
        // At most one per customer per hour, finished ones included: the arguments are the key.
        Ok(())
    }

    #[forge::job]
    async fn reindex(ctx: forge::JobContext, doc_id: i64) -> Result<(), forge::JobError> {
        Ok(())
    }

    #[forge::job(unique = true, unique_states = ["available", "scheduled", "retryable"])]
    async fn refresh_feed(ctx: forge::JobContext, feed_id: i64) -> Result<(), forge::JobError> {
        // One waiting refresh per feed; a running one does not block the next.
        Ok(())
    }

    pub(crate) async fn on_edit(node: &forge::Node, doc_id: i64) -> forge::Result<()> {
        // Debounce: one waiting job per document, with the last edit's arguments, 10 s after it.
        node.jobs().enqueue_job(forge::jobs::NewJob::new(reindex, doc_id)
            .unique_key(format!("reindex:{doc_id}"))
            .unique_mode(forge::jobs::UniqueMode::Replace)
            .delay(std::time::Duration::from_secs(10))).await?;
        Ok(())
    }

    #[forge::job(max_snoozes = 20)]
    async fn charge(ctx: forge::JobContext, order_id: i64) -> Result<(), forge::JobError> {
        let busy: bool = forge::sqlx::query_scalar("SELECT busy FROM provider_status")
            .fetch_one(ctx.pool())
            .await?;
        if busy {
            return Err(forge::JobError::snooze(std::time::Duration::from_secs(30)));   // not an attempt
        }
        Ok(())
    }

    fn polite(attempt: u32, error: &forge::JobError) -> std::time::Duration {
        // The provider's rate limit: a minute; anything else: 5 s more per attempt.
        if error.message().contains("429") {
            std::time::Duration::from_secs(60)
        } else {
            std::time::Duration::from_secs(5 * u64::from(attempt))
        }
    }

    #[forge::job(backoff = polite, max_attempts = 8)]
    async fn notify_provider(ctx: forge::JobContext, order_id: i64) -> Result<(), forge::JobError> {
        Ok(())
    }
}

/// The guide's "Jobs", "Job dependencies": outputs, a workflow, a parent's outputs.
#[rustfmt::skip]
mod job_flow {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Resize { image_id: i64, width: u32 }

    #[forge::job(queue = "images")]
    async fn resize(ctx: forge::JobContext, args: Resize) -> Result<String, forge::JobError> {
        // The Ok value is the job's output: stored with its completion, in one commit.
        Ok(format!("images/{}-{}.webp", args.image_id, args.width))
    }

    #[forge::job(queue = "images")]
    async fn publish(ctx: forge::JobContext, image_id: i64) -> Result<usize, forge::JobError> {
        let paths = ctx.parent_outputs().await?;   // each parent's output, by job id
        Ok(paths.len())
    }

    async fn enqueue_images(node: &forge::Node) -> forge::Result<()> {
        use forge::jobs::{NewJob, Workflow};
        let mut tx = node.pool().begin().await?;
        let steps = Workflow::new()
            .step("small", NewJob::new(resize, Resize { image_id: 9, width: 320 }))
            .step("large", NewJob::new(resize, Resize { image_id: 9, width: 1280 }))
            .step_after("publish", NewJob::new(publish, 9), ["small", "large"]);
        let ids = node.jobs().enqueue_workflow_in(&mut tx, steps).await?;   // all or nothing
        tx.commit().await?;
        Ok(())
    }
}

/// The guide's "Jobs", "Limits across the cluster".
#[rustfmt::skip]
mod limits {
    // For every node at once, without a restart; recorded in the audit trail as "ops".
    async fn limit_mailers(node: &forge::Node) -> Result<(), Box<dyn std::error::Error>> {
        let limits = forge::jobs::QueueLimits::new(Some(16), Some("100/1m".parse()?), None)?;
        node.workload().set_queue_limits("mailers", &limits, "ops", false).await?;
        Ok(())
    }
}

/// The guide's "Jobs", "Limits of a job kind".
#[rustfmt::skip]
mod kind_limits {
    use forge::{JobContext, JobError};

    #[derive(serde::Serialize, serde::Deserialize)]
    struct SyncAccount {
        customer_id: i64,
    }

    // At most 4 syncs at once on all nodes together, whichever queue; 100 a minute per customer.
    #[forge::job(global_concurrency = 4, rate = "100/1m", rate_key = "customer_id")]
    async fn sync_account(ctx: JobContext, args: SyncAccount) -> Result<(), JobError> {
        let _ = (ctx, args.customer_id);
        Ok(())
    }

    // The same without the attribute, on the kind's options (`Job::options`).
    fn sync_options() -> Result<forge::jobs::JobOptions, String> {
        Ok(forge::jobs::JobOptions::new()
            .global_concurrency(4)
            .rate("100/1m".parse()?)
            .rate_key("customer_id"))
    }

    // An operator's change, for every node at once; recorded in the audit trail as "ops".
    async fn limit_syncs(node: &forge::Node) -> Result<(), Box<dyn std::error::Error>> {
        let limits = forge::jobs::QueueLimits::new(Some(1), None, None)?;
        node.workload().set_kind_limits("sync_account", &limits, "ops").await?;
        Ok(())
    }
}

/// The guide's "Alerts and metrics", "Your metrics and FORGE's in one scrape".
#[rustfmt::skip]
mod one_scrape {
    use forge::admin::axum::{Router, extract::State, routing::get};
    use metrics_exporter_prometheus::PrometheusBuilder;

    async fn scrape(State(node): State<forge::Node>) -> String {
        tokio::task::spawn_blocking(move || node.render_metrics()).await.unwrap_or_default()
    }

    async fn serve() -> Result<(), Box<dyn std::error::Error>> {
        let prometheus = PrometheusBuilder::new().install_recorder()?;   // the `metrics` macros record here
        let node = forge::Node::builder(forge::Config::from_env()?)
            .app_metrics(move || prometheus.render())                      // yours after FORGE's, each scrape
            .start()
            .await?;
        metrics::counter!("orders_placed_total").increment(1);
        let app: Router = Router::new().route("/metrics", get(scrape)).with_state(node);
        Ok(())
    }
}

/// The guide's "Migrations": `migrations/` next to this crate's Cargo.toml (`main` runs it
/// first, then starts the node of the leader task).
#[rustfmt::skip]
async fn migrations() -> forge::Result<()> {
    let node = forge::Node::builder(forge::Config::from_env()?)
        .migrations(forge::migrate!("migrations"))   // ./migrations/0001_orders.sql, ...
        .start()
        .await?;
    node.shutdown().await;
    Ok(())
}
