//! The scrape endpoint: `GET` (or `HEAD`) on any path of `[metrics] listen` answers the
//! registry in the Prometheus text format; one request per connection.

use std::net::SocketAddr;
use std::sync::Weak;

use super::Shared;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A request head larger than this is refused.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client may take to send its request.
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
            tokio::spawn(answer(stream, shared.clone()));
        }
    }))
}

async fn answer(mut stream: TcpStream, shared: Weak<Shared>) {
    let Ok(Some(method)) = tokio::time::timeout(READ_TIMEOUT, read_method(&mut stream)).await
    else {
        return;
    };
    let response = match method.as_str() {
        "GET" | "HEAD" => {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            // Rendering hundreds of thousands of series takes a while: not on an async worker.
            let Ok(body) = tokio::task::spawn_blocking(move || shared.render()).await else {
                return;
            };
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let mut response = head.into_bytes();
            if method == "GET" {
                response.extend_from_slice(body.as_bytes());
            }
            response
        }
        _ => b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
    };
    let _ = stream.write_all(&response).await;
    let _ = stream.shutdown().await;
}

/// Reads the request head and returns its method; `None` if the client sent no whole head.
async fn read_method(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|b| *b == b'\r').next()?;
    let method = std::str::from_utf8(line).ok()?.split(' ').next()?;
    Some(method.to_owned())
}
