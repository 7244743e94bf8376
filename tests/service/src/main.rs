//! `orders-service`: a small service on FORGE, written as a user writes one (its own workspace
//! and Cargo.lock, FORGE as a path dependency), so that CI builds and tests what a user builds.
//!
//! Every node is configured by the environment alone: `DATABASE_URL` and `FORGE_NODE_ID` for
//! FORGE (no forge.toml), `LISTEN` for its HTTP API (default `127.0.0.1:8080`; port 0 picks a
//! free one). It prints `listening on http://<address>` once it serves.
//!
//! * `POST /orders?count=N` places N orders and enqueues a `ship` job for each, in the
//!   transaction that inserts them.
//! * `ship` (a `#[forge::job]`, on any node) writes the order's shipment and completes the job
//!   in one commit: an order is shipped once, even when a node dies in the middle.
//! * `audit` (a `#[forge::cron]` every second, on the scheduler's leader) writes its tick and
//!   completes it in the tick's fenced transaction: a tick's row is written at most once.
//! * `GET /metrics`: the service's metrics (the `metrics` crate, `metrics-exporter-prometheus`)
//!   and FORGE's, in one scrape.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use forge::admin::axum::extract::{Query, State};
use forge::admin::axum::http::StatusCode;
use forge::admin::axum::routing::{get, post};
use forge::admin::axum::{self, Router};
use forge::jobs::NewJob;
use forge::{CronContext, CronError, JobContext, JobError, Node};
use metrics_exporter_prometheus::PrometheusBuilder;

/// How long shipping an order takes besides its database writes (the carrier's API, say).
const CARRIER_CALL: Duration = Duration::from_millis(100);

#[derive(serde::Serialize, serde::Deserialize)]
struct Ship {
    order_id: i64,
}

/// Ships an order: the shipment and the job's completion commit together, so a job that runs
/// again (its node died before the commit) writes the shipment once.
#[forge::job]
async fn ship(ctx: JobContext, args: Ship) -> Result<(), JobError> {
    let mut tx = ctx.pool().begin().await?;
    forge::sqlx::query("INSERT INTO shipments (order_id, job_id, node) VALUES ($1, $2, $3)")
        .bind(args.order_id)
        .bind(ctx.id())
        .bind(ctx.node_id().to_string())
        .execute(&mut *tx)
        .await?;
    tokio::time::sleep(CARRIER_CALL).await;
    ctx.complete(&mut tx).await?;
    tx.commit().await?;
    metrics::counter!("orders_shipped_total").increment(1);
    Ok(())
}

/// Every second, on the scheduler's leader: how many orders were shipped by then.
#[forge::cron("* * * * * *", catch_up = "all")]
async fn audit(ctx: CronContext) -> Result<(), CronError> {
    let mut tx = ctx.fenced_transaction().await?; // refused if this node was deposed
    forge::sqlx::query(
        "INSERT INTO audits (tick, node, shipped) SELECT $1, $2, count(*) FROM shipments",
    )
    .bind(ctx.scheduled_at())
    .bind(ctx.node_id().to_string())
    .execute(&mut *tx)
    .await?;
    ctx.complete(&mut tx).await?; // the tick is done in the same commit
    tx.commit().await?;
    Ok(())
}

#[derive(serde::Deserialize)]
struct Place {
    count: i32,
}

/// `POST /orders?count=N`: the orders and their jobs exist only if the transaction commits.
async fn place_orders(
    State(node): State<Node>,
    Query(place): Query<Place>,
) -> Result<String, (StatusCode, String)> {
    let failed = |err: &dyn std::fmt::Display| (StatusCode::INTERNAL_SERVER_ERROR, err.to_string());
    let mut tx = node.pool().begin().await.map_err(|e| failed(&e))?;
    let ids: Vec<i64> = forge::sqlx::query_scalar(
        "INSERT INTO orders (placed_at) SELECT now() FROM generate_series(1, $1) RETURNING id",
    )
    .bind(place.count)
    .fetch_all(&mut *tx)
    .await
    .map_err(|e| failed(&e))?;
    let jobs = ids
        .iter()
        .map(|&order_id| NewJob::new(ship, Ship { order_id }));
    node.jobs()
        .enqueue_many_in(&mut *tx, jobs)
        .await
        .map_err(|e| failed(&e))?;
    tx.commit().await.map_err(|e| failed(&e))?;
    metrics::counter!("orders_placed_total").increment(ids.len() as u64);
    Ok(format!("placed {} orders\n", ids.len()))
}

/// `GET /metrics`: the service's metrics and FORGE's (`NodeBuilder::app_metrics`).
async fn scrape(State(node): State<Node>) -> Result<String, StatusCode> {
    tokio::task::spawn_blocking(move || node.render_metrics())
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:8080".to_owned());
    let listen: SocketAddr = listen
        .parse()
        .map_err(|err| format!("LISTEN={listen:?}: {err}; give host:port"))?;
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let node = Node::builder(forge::Config::from_env()?)
        .migrations(forge::migrate!("migrations"))
        .app_metrics(move || prometheus.render())
        .start()
        .await?;
    let app = Router::new()
        .route("/orders", post(place_orders))
        .route("/metrics", get(scrape))
        .with_state(node.clone());
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|err| format!("cannot listen on {listen}: {err}; set LISTEN"))?;
    println!("listening on http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let stopped = node.run_until_signal().await;
    server.abort();
    Ok(stopped?)
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The service's own tests of its handlers, with FORGE's test kit (`forge::testing`, the
/// `testing` feature): no cluster, a fresh database each.
#[cfg(test)]
mod tests {
    use super::*;

    async fn database() -> forge::testing::TestDb {
        let db = forge::testing::database().await.unwrap();
        forge::migrate!("migrations").run(db.pool()).await.unwrap();
        db
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn shipping_an_order_writes_one_shipment_and_completes_the_job() {
        let db = database().await;
        let order_id: i64 =
            forge::sqlx::query_scalar("INSERT INTO orders DEFAULT VALUES RETURNING id")
                .fetch_one(db.pool())
                .await
                .unwrap();
        let run = forge::testing::run_job(db.pool(), ship, Ship { order_id })
            .await
            .unwrap();
        assert!(run.result.is_ok(), "{:?}", run.result);
        assert_eq!(run.state, forge::jobs::JobState::Completed);
        let shipments: i64 =
            forge::sqlx::query_scalar("SELECT count(*) FROM shipments WHERE order_id = $1")
                .bind(order_id)
                .fetch_one(db.pool())
                .await
                .unwrap();
        assert_eq!(shipments, 1);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_audit_cron_writes_its_tick_on_the_leader() {
        let db = database().await;
        let run = forge::testing::run_cron(&db, audit).await.unwrap();
        assert_eq!(
            run.state,
            forge::crons::TickState::Succeeded,
            "{:?}",
            run.error
        );
        let audits: i64 = forge::sqlx::query_scalar("SELECT count(*) FROM audits WHERE tick = $1")
            .bind(run.scheduled_at)
            .fetch_one(db.pool())
            .await
            .unwrap();
        assert_eq!(audits, 1);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_ship_job_is_enqueued_only_if_the_orders_transaction_commits() {
        let db = database().await;
        let jobs = forge::jobs::Jobs::new(db.pool().clone(), &forge::LockNamespace::default());
        let mut tx = db.pool().begin().await.unwrap();
        jobs.enqueue_in(&mut *tx, ship, Ship { order_id: 1 })
            .await
            .unwrap();
        forge::testing::assert_enqueued(&mut *tx, "ship", Ship { order_id: 1 }).await;
        tx.rollback().await.unwrap();
        forge::testing::assert_not_enqueued(db.pool(), "ship", Ship { order_id: 1 }).await;
    }
}
