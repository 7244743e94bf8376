//! The scrape endpoint: `GET` (or `HEAD`) on any path of `[metrics] listen` answers the
//! registry in the Prometheus text format; other methods are refused (405, `Allow: GET,HEAD`).
//!
//! An axum router, as the admin API is, served connection by connection through hyper's
//! HTTP/1 builder rather than `axum::serve` (which takes no settings), so that a client is
//! bounded: a request head larger than [`MAX_HEAD`] is refused (431), and a connection that
//! sends no whole head within [`READ_TIMEOUT`] - a new one, or one kept alive between scrapes -
//! is closed.

use std::net::SocketAddr;
use std::sync::Weak;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use super::Shared;

/// A request head larger than this is refused (hyper's smallest buffer is 8 KiB).
const MAX_HEAD: usize = 16 * 1024;
/// How long a client may take to send a request's head.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `listen` (so that a taken address fails the node's start) and serves until the
/// registry is gone or the returned task is aborted.
pub(super) fn serve(
    listen: SocketAddr,
    shared: Weak<Shared>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = std::net::TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    let app = Router::new().fallback_service(get(scrape).with_state(shared.clone()));
    Ok(tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of descriptors and the like: wait rather than spin.
                    tracing::debug!(target: "forge::metrics", %listen, error = %err, "cannot accept a scrape");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if shared.strong_count() == 0 {
                return;
            }
            let service = TowerToHyperService::new(app.clone());
            tokio::spawn(async move {
                let connection = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(READ_TIMEOUT)
                    .max_buf_size(MAX_HEAD)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                if let Err(err) = connection {
                    tracing::debug!(target: "forge::metrics", error = %err, "a scrape's connection failed");
                }
            });
        }
    }))
}

/// One scrape (`HEAD` too: axum answers it as `GET` without the body).
async fn scrape(State(shared): State<Weak<Shared>>) -> Response {
    let Some(shared) = shared.upgrade() else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    // Rendering hundreds of thousands of series takes a while: not on an async worker.
    match tokio::task::spawn_blocking(move || shared.render()).await {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
