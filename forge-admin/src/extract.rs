//! axum's extractors with their rejections as the API's JSON errors: 400 for a malformed
//! request, 413 for a body over [`MAX_BODY`]; and [`NoBody`] for the writes that take none.

use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// The largest request body the API reads (1 MiB): a job filter or a step-down's options are
/// a few bytes. A larger one is a 413.
pub(crate) const MAX_BODY: usize = 1 << 20;

/// 413: the body is over [`MAX_BODY`].
fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body is larger than the limit of {MAX_BODY} bytes"),
    )
    .with("limit", MAX_BODY)
}

/// A rejection of a body: 413 when it was too large, else 400.
fn body_rejection(status: StatusCode, text: String) -> ApiError {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        too_large()
    } else {
        ApiError::bad_request(text)
    }
}

/// A 413 at once, without reading, when the declared length (`Content-Length`) is over.
fn check_declared(req: &Request) -> Result<(), ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > MAX_BODY as u64 => Err(too_large()),
        _ => Ok(()),
    }
}

/// The body, read up to [`MAX_BODY`] (413 beyond).
async fn body<S: Send + Sync>(req: Request, state: &S) -> Result<axum::body::Bytes, ApiError> {
    check_declared(&req)?;
    axum::body::Bytes::from_request(req, state)
        .await
        .map_err(|rejection: BytesRejection| {
            body_rejection(rejection.status(), rejection.body_text())
        })
}

/// A write that takes no body: an empty one (or only whitespace) is fine, anything else a 400
/// (413 when too large), so that junk sent to an action is never mistaken for a request.
pub(crate) struct NoBody;

impl<S> FromRequest<S> for NoBody
where
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = body(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            Ok(NoBody)
        } else {
            Err(ApiError::bad_request(format!(
                "this endpoint takes no body (got {} bytes)",
                bytes.len()
            )))
        }
    }
}

/// A query string, deserialized; malformed: 400.
pub(crate) struct ApiQuery<T>(pub(crate) T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(value)| ApiQuery(value))
            .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
    }
}

/// Path parameters, deserialized; malformed: 400.
pub(crate) struct ApiPath<T>(pub(crate) T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(value)| ApiPath(value))
            .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
    }
}

/// A JSON body, deserialized; malformed, or not JSON: 400.
pub(crate) struct ApiJson<T>(pub(crate) T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        check_declared(&req)?;
        axum::Json::<T>::from_request(req, state)
            .await
            .map(|axum::Json(value)| ApiJson(value))
            .map_err(|rejection| body_rejection(rejection.status(), rejection.body_text()))
    }
}

/// An optional JSON body: none (empty) is `T::default()`; anything else must be JSON that
/// deserializes as `T` (else 400).
pub(crate) struct ApiOptionalJson<T>(pub(crate) T);

impl<T, S> FromRequest<S> for ApiOptionalJson<T>
where
    T: DeserializeOwned + Default,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = body(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(ApiOptionalJson(T::default()));
        }
        serde_json::from_slice(&bytes)
            .map(ApiOptionalJson)
            .map_err(|err| {
                ApiError::bad_request(format!("the body is not the JSON expected: {err}"))
            })
    }
}
