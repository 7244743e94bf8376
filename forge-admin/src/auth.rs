//! Who may do what: bearer tokens compared in constant time, read-only mode, and the `by` of
//! the audit trail (who and from where).

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::AdminState;
use crate::error::ApiError;

/// Who made a write, for the audit trail: `api <peer address>` (with `X-Forwarded-For`'s
/// first address when the state trusts it: `api <client> via <peer>`).
#[derive(Clone, Debug)]
pub(crate) struct Actor(pub(crate) String);

/// Compares two secrets in time that depends only on the longer one's length.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// The bearer token of a request, if any (`None`: no or another scheme).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let scheme = value.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = value[7..].trim_ascii();
    (!token.is_empty()).then_some(token)
}

fn matches(secret: Option<&str>, presented: &[u8]) -> bool {
    // Both compared every time, so the timing does not say which one matched.
    secret
        .filter(|s| !s.is_empty())
        .is_some_and(|s| constant_time_eq(s.as_bytes(), presented))
}

/// Whether a request may go on: reads need the read token or the write token when a read
/// token is set; writes need the write token, which must be set, and no read-only mode.
pub(crate) fn check(
    state: &AdminState,
    method: &Method,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    let access = &state.access;
    let token = access.token.as_deref().filter(|t| !t.is_empty());
    let read_token = access.read_token.as_deref().filter(|t| !t.is_empty());
    let presented = bearer(headers);
    let is_write = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if !is_write {
        if read_token.is_none() {
            return Ok(());
        }
        let Some(presented) = presented else {
            return Err(ApiError::unauthorized(
                "reading needs a bearer token: send `Authorization: Bearer <[admin] read_token or token>`",
            ));
        };
        let as_read = matches(read_token, presented);
        let as_write = matches(token, presented);
        return if as_read | as_write {
            Ok(())
        } else {
            Err(ApiError::unauthorized("invalid token"))
        };
    }
    if access.read_only {
        return Err(ApiError::forbidden(
            "the admin API is read-only here ([admin] read_only = true): writes are refused",
        ));
    }
    if token.is_none() {
        return Err(ApiError::forbidden(
            "writes are disabled: set [admin] token (or FORGE_ADMIN_TOKEN) on the serving node to allow them",
        ));
    }
    let Some(presented) = presented else {
        return Err(ApiError::unauthorized(
            "writes need a bearer token: send `Authorization: Bearer <[admin] token>`",
        ));
    };
    let as_write = matches(token, presented);
    let as_read = matches(read_token, presented);
    if as_write {
        Ok(())
    } else if as_read {
        Err(ApiError::forbidden(
            "this token may only read: writes need [admin] token",
        ))
    } else {
        Err(ApiError::unauthorized("invalid token"))
    }
}

/// The middleware of every route but the health probes.
pub(crate) async fn guard(
    State(state): State<AdminState>,
    mut req: Request,
    next: Next,
) -> Response {
    if let Err(err) = check(&state, req.method(), req.headers()) {
        tracing::debug!(target: "forge::admin", method = %req.method(), path = %req.uri().path(),
                        status = err.status().as_u16(), "admin API request refused");
        return err.into_response();
    }
    let actor = actor(&state, &req);
    req.extensions_mut().insert(actor);
    next.run(req).await
}

fn actor(state: &AdminState, req: &Request) -> Actor {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip().to_string());
    let forwarded = state
        .trust_forwarded_for
        .then(|| req.headers().get("x-forwarded-for"))
        .flatten()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(sanitize)
        .filter(|v| !v.is_empty());
    Actor(match (forwarded, peer) {
        (Some(client), Some(peer)) => format!("api {client} via {peer}"),
        (Some(client), None) => format!("api {client}"),
        (None, Some(peer)) => format!("api {peer}"),
        (None, None) => "api".to_owned(),
    })
}

/// Keeps what an address may contain, at most 64 characters: nothing a log line could
/// misread.
fn sanitize(text: &str) -> String {
    text.trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']' | '-' | '_'))
        .take(64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares() {
        assert!(constant_time_eq(b"abcdef", b"abcdef"));
        assert!(!constant_time_eq(b"abcdef", b"abcdeg"));
        assert!(!constant_time_eq(b"abcdef", b"abcde"));
        assert!(!constant_time_eq(b"abc", b"abcdef"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn bearer_is_parsed_case_insensitively() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, "Bearer  tok ".parse().unwrap());
        assert_eq!(bearer(&headers), Some(&b"tok"[..]));
        headers.insert(header::AUTHORIZATION, "bearer tok".parse().unwrap());
        assert_eq!(bearer(&headers), Some(&b"tok"[..]));
        headers.insert(header::AUTHORIZATION, "Basic dG9r".parse().unwrap());
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(&headers), None);
    }

    #[test]
    fn forwarded_addresses_are_sanitized() {
        assert_eq!(sanitize(" 10.1.2.3\n<script>"), "10.1.2.3script");
        assert_eq!(sanitize(&"9".repeat(100)).len(), 64);
    }
}
