//! Leader-aware routing for the application's own routes: [`LeaderOnly`], a tower layer that
//! lets requests through on the leader of a role only (elsewhere: 503 with `Retry-After` and the
//! leader's node and admin URL in headers, so a load balancer tries the next upstream), the
//! [`Leader`] extractor for handlers behind it, and the probe `GET /api/health/leader/{role}`
//! (200 on the role's leader, 503 elsewhere) for HAProxy, nginx and Kubernetes readiness.
//!
//! ```no_run
//! # fn demo(node: impl forge_admin::LeaderSource) {
//! use forge_admin::axum::{Router, routing::post};
//! use forge_admin::{Leader, LeaderOnly};
//! use forge_core::Role;
//!
//! async fn webhook(Leader(leadership): Leader) -> String {
//!     format!("handled by the scheduler's leader, epoch {}", leadership.epoch())
//! }
//!
//! let app: Router = Router::new()
//!     .route("/webhook", post(webhook))
//!     .layer(LeaderOnly::new(node, Role::SCHEDULER));
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use forge_core::inspect::Cluster;
use forge_core::{Leadership, Role, RoleState};
use serde_json::json;
use tower_layer::Layer;
use tower_service::Service;

use crate::AdminState;
use crate::error::ApiError;
use crate::extract::ApiPath;

/// The header naming the role's current leader (its node id), on a 503 of [`LeaderOnly`] and
/// of the leader probe.
pub const LEADER_HEADER: HeaderName = HeaderName::from_static("forge-leader");

/// The header with the leader's admin API URL (`[admin] listen` as it advertises it), when
/// known.
pub const LEADER_URL_HEADER: HeaderName = HeaderName::from_static("forge-leader-url");

/// What [`LeaderOnly`] asks of the node it guards (the `forge` facade implements it for
/// `forge::Node`).
pub trait LeaderSource: Clone + Send + Sync + 'static {
    /// The node's current leadership of `role`, if it leads it.
    fn leadership(&self, role: &Role) -> Option<Leadership>;
    /// The node's state in `role` (who leads it, as the node last heard).
    fn role_state(&self, role: &Role) -> Option<RoleState>;
    /// The cluster's read model (the leader's admin URL is looked up there).
    fn cluster(&self) -> Cluster;
}

/// A tower layer for routes that must run on `role`'s leader only: on the leader (holding a
/// valid leadership) the request passes, with its [`Leadership`] for the [`Leader`]
/// extractor; on any other node it is answered `503 Service Unavailable` with `Retry-After: 1`,
/// `Forge-Leader: <node id>` and `Forge-Leader-Url: <admin URL>` (when known), and the handler
/// does not run. The check is local (no database round trip per request).
#[derive(Clone)]
pub struct LeaderOnly<N> {
    node: N,
    role: Role,
    /// The last leader's admin URL: (its node id, the URL, when it was looked up).
    urls: Arc<Mutex<Option<KnownUrl>>>,
}

type KnownUrl = (String, Option<String>, Instant);

impl<N: LeaderSource> LeaderOnly<N> {
    /// Guards routes with `node`'s leadership of `role`.
    pub fn new(node: N, role: Role) -> LeaderOnly<N> {
        LeaderOnly {
            node,
            role,
            urls: Arc::new(Mutex::new(None)),
        }
    }

    /// The 503 of a node that does not lead the role.
    async fn elsewhere(&self) -> Response {
        let leader = match self.node.role_state(&self.role) {
            Some(RoleState::Follower {
                leader: Some(leader),
            }) => Some(leader.node_id),
            _ => None,
        };
        let url = match &leader {
            Some(node) => self.admin_url(node).await,
            None => None,
        };
        not_leader(&self.role, leader.as_deref(), url.as_deref())
    }

    /// The leader's admin URL, looked up once per leader (and again after 10 s).
    async fn admin_url(&self, node: &str) -> Option<String> {
        const FRESH: Duration = Duration::from_secs(10);
        if let Some((cached, url, at)) = &*self.urls.lock().unwrap_or_else(|e| e.into_inner())
            && cached == node
            && at.elapsed() < FRESH
        {
            return url.clone();
        }
        let view = tokio::time::timeout(Duration::from_secs(1), self.node.cluster().node(node))
            .await
            .ok()?
            .ok()
            .flatten();
        let url = view.and_then(|v| v.admin_url);
        *self.urls.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((node.to_owned(), url.clone(), Instant::now()));
        url
    }
}

fn not_leader(role: &Role, leader: Option<&str>, url: Option<&str>) -> Response {
    let mut response = (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({
            "error": format!("this node does not lead {role}: send the request to its leader"),
            "code": "not_leader",
            "status": 503,
            "role": role.name(),
            "leader": leader,
            "leader_url": url,
        })),
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    if let Some(value) = leader.and_then(|l| HeaderValue::from_str(l).ok()) {
        headers.insert(LEADER_HEADER, value);
    }
    if let Some(value) = url.and_then(|u| HeaderValue::from_str(u).ok()) {
        headers.insert(LEADER_URL_HEADER, value);
    }
    response
}

impl<N: LeaderSource, S> Layer<S> for LeaderOnly<N> {
    type Service = LeaderOnlyService<N, S>;

    fn layer(&self, inner: S) -> Self::Service {
        LeaderOnlyService {
            guard: self.clone(),
            inner,
        }
    }
}

/// The service [`LeaderOnly`] wraps around a route.
#[derive(Clone)]
pub struct LeaderOnlyService<N, S> {
    guard: LeaderOnly<N>,
    inner: S,
}

impl<N, S> Service<Request> for LeaderOnlyService<N, S>
where
    N: LeaderSource,
    S: Service<Request, Response = Response> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let leadership = self
            .guard
            .node
            .leadership(&self.guard.role)
            .filter(Leadership::is_valid);
        match leadership {
            Some(leadership) => {
                request.extensions_mut().insert(Leader(leadership));
                Box::pin(self.inner.call(request))
            }
            None => {
                let guard = self.guard.clone();
                Box::pin(async move { Ok(guard.elsewhere().await) })
            }
        }
    }
}

/// The leadership a request behind [`LeaderOnly`] runs under (its epoch, its fence token for
/// leader-only writes). Without the layer in front of the route, the request is refused (503).
#[derive(Clone)]
pub struct Leader(pub Leadership);

impl<S: Send + Sync> FromRequestParts<S> for Leader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        parts.extensions.get::<Leader>().cloned().ok_or_else(|| {
            ApiError::unavailable(
                "this route takes forge_admin::Leader but has no LeaderOnly layer in front of it",
            )
        })
    }
}

/// `GET /api/health/leader/{role}`: 200 on the role's leader, 503 elsewhere (with the leader
/// in `Forge-Leader`), for load balancers' health checks. Local, no database round trip.
pub(crate) async fn probe(
    State(state): State<AdminState>,
    ApiPath(role): ApiPath<String>,
) -> Response {
    let role = match Role::new(&role) {
        Ok(role) => role,
        Err(err) => return ApiError::bad_request(err.to_string()).into_response(),
    };
    let Some(local) = state.local.as_deref() else {
        return ApiError::not_found("this API is not served by a node: no role to check")
            .into_response();
    };
    match local.state(&role) {
        None => {
            ApiError::not_found(format!("this node does not campaign for {role}")).into_response()
        }
        Some(RoleState::Leader { epoch, since }) if !local.is_stopping() => Json(json!({
            "role": role.name(),
            "leader": true,
            "node_id": local.node_id.as_str(),
            "epoch": epoch,
            "since": since,
        }))
        .into_response(),
        Some(RoleState::Follower {
            leader: Some(leader),
        }) => not_leader(&role, Some(&leader.node_id), None),
        Some(_) => not_leader(&role, None, None),
    }
}
