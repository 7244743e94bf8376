//! The API's one error type: a status and a JSON body `{ "error": "...", "code": "...", ... }`.
//!
//! Database outages are 503s, unknown ids 404s, refused changes 409s, bad input 400s. A 500
//! is reserved for what should never happen (a bug, a panic caught in a handler); its body
//! says no more than that, and the details go to the node's log.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// An error response of the admin API.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    extra: Map<String, Value>,
}

impl ApiError {
    /// An error with this status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            extra: Map::new(),
        }
    }

    /// 400: the request is malformed (bad JSON, a bad filter, an invalid name).
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404: no such item.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    /// 409: the change is not possible in the item's state.
    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, message)
    }

    /// 503: PostgreSQL cannot be reached (or did not answer in time).
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 401: no credentials, or wrong ones.
    pub(crate) fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, message)
    }

    /// 403: the credentials (or the configuration) do not allow this.
    pub(crate) fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, message)
    }

    /// 500 without details (they go to the log).
    pub(crate) fn internal() -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal error: see the node's log",
        )
    }

    /// Adds a field to the JSON body.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> ApiError {
        self.extra.insert(key.to_owned(), value.into());
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "bad_request",
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::FORBIDDEN => "forbidden",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::CONFLICT => "conflict",
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            _ => "internal",
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert("error".to_owned(), Value::String(self.message.clone()));
        body.insert("code".to_owned(), json!(self.code()));
        body.insert("status".to_owned(), json!(self.status.as_u16()));
        for (key, value) in self.extra {
            body.entry(key).or_insert(value);
        }
        let mut response = (self.status, Json(Value::Object(body))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"forge-admin\""),
            );
        }
        response
    }
}

impl From<forge_core::Error> for ApiError {
    fn from(err: forge_core::Error) -> ApiError {
        use forge_core::Error;
        match &err {
            Error::Database(db) | Error::Connect { source: db, .. } => from_sqlx(db, &err),
            Error::Fenced { .. } | Error::NotRunning { .. } | Error::Conflict { .. } => {
                ApiError::conflict(err.to_string())
            }
            Error::InvalidInput { message } => ApiError::bad_request(message.clone()),
            Error::ShutDown => ApiError::unavailable("the node is shut down"),
            _ => {
                tracing::error!(target: "forge::admin", error = %err, "admin API request failed");
                ApiError::internal()
            }
        }
    }
}

/// Database errors: an outage (connection, pool, server shutting down, overload, conflicts
/// worth retrying) is a 503, a value the database refused a 400, the rest a 500.
fn from_sqlx(db: &sqlx::Error, err: &forge_core::Error) -> ApiError {
    use sqlx::Error as E;
    match db {
        E::Io(_)
        | E::Tls(_)
        | E::Protocol(_)
        | E::PoolTimedOut
        | E::PoolClosed
        | E::WorkerCrashed => {
            tracing::warn!(target: "forge::admin", error = %db, "database unavailable");
            ApiError::unavailable(format!("the database is unavailable: {db}"))
        }
        E::Database(e) => {
            let code = e.code().map(|c| c.into_owned()).unwrap_or_default();
            let class = code.get(..2).unwrap_or("");
            match class {
                // connection exception, insufficient resources, operator intervention,
                // transaction rollback (serialization failure, deadlock)
                "08" | "53" | "57" | "40" => {
                    tracing::warn!(target: "forge::admin", error = %db, "database unavailable");
                    ApiError::unavailable(format!("the database is unavailable: {}", e.message()))
                        .with("sqlstate", code)
                }
                // data exception: a value out of range, malformed
                "22" => {
                    ApiError::bad_request(format!("the database refused a value: {}", e.message()))
                        .with("sqlstate", code)
                }
                _ if code.starts_with("FG") => ApiError::conflict(err.to_string()),
                _ => {
                    tracing::error!(target: "forge::admin", error = %err, "admin API request failed");
                    ApiError::internal()
                }
            }
        }
        _ => {
            tracing::error!(target: "forge::admin", error = %err, "admin API request failed");
            ApiError::internal()
        }
    }
}

/// The result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;
