//! A webhook that runs on the scheduler's leader only, whichever node a request reaches: every
//! node serves the same routes, `LeaderOnly` lets a request through on the role's leader alone
//! (the handler gets the tenure's `Leadership`) and answers it `503` everywhere else.
//!
//! ```text
//! # two nodes (two terminals), each with its application port and its admin port:
//! DATABASE_URL=postgres://localhost/app FORGE_NODE_ID=a FORGE_ADMIN_LISTEN=127.0.0.1:9465 \
//!     cargo run --example leader_routes -- forge.toml 127.0.0.1:8080
//! DATABASE_URL=postgres://localhost/app FORGE_NODE_ID=b FORGE_ADMIN_LISTEN=127.0.0.1:9466 \
//!     cargo run --example leader_routes -- forge.toml 127.0.0.1:8081
//!
//! curl -i -X POST 127.0.0.1:8080/webhook   # on the leader: 200, "handled by a, epoch 7"
//! curl -i -X POST 127.0.0.1:8081/webhook   # elsewhere: 503, Retry-After: 1, Forge-Leader: a,
//!                                          # Forge-Leader-Url: http://127.0.0.1:9465
//! curl -i 127.0.0.1:9465/api/health/leader/scheduler   # what a load balancer checks: 200 / 503
//! ```
//!
//! Stop the leader (ctrl-c) and the other node's `/webhook` answers 200 a few milliseconds
//! later. In front of the nodes, a load balancer sends the requests to the leader:
//! `deploy/haproxy/haproxy.cfg` checks each node's `GET /api/health/leader/scheduler` on the
//! admin port, `deploy/nginx/forge-leader.conf` lets a non-leader's 503 move a request on to
//! the next node (both tested against real nodes by `tests/it/routing.rs`).

use std::process::ExitCode;

use forge::admin::axum::{Router, routing::post};
use forge::admin::{Leader, LeaderOnly};
use forge::{Config, Node, Role};

/// Runs on the scheduler's leader only: `LeaderOnly` answered the request elsewhere.
async fn webhook(Leader(leadership): Leader) -> String {
    format!(
        "handled by {}, epoch {}\n",
        leadership.node_id(),
        leadership.epoch()
    )
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

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "forge.toml".into());
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:8080".into());
    let config = Config::load(&path)?;
    // The node leads the scheduler role because it has work for it: the job queue's maintenance.
    let node = Node::builder(config).start().await?;
    let app: Router = Router::new()
        .route("/webhook", post(webhook))
        .layer(LeaderOnly::new(node.clone(), Role::SCHEDULER));
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|err| format!("cannot listen on {listen} (the second argument): {err}"))?;
    println!(
        "node {}: POST http://{listen}/webhook, admin API {}",
        node.id(),
        node.admin_url()
            .unwrap_or("off ([admin] listen or FORGE_ADMIN_LISTEN)")
    );
    tokio::spawn(async move { forge::admin::axum::serve(listener, app).await });
    // Until SIGTERM or ctrl-c; then the node hands its roles over and the process exits.
    node.run_until_signal().await?;
    Ok(())
}
