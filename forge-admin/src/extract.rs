//! axum's extractors with their rejections as the API's JSON 400s.

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

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
        axum::Json::<T>::from_request(req, state)
            .await
            .map(|axum::Json(value)| ApiJson(value))
            .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
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
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|rejection| ApiError::bad_request(rejection.body_text()))?;
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
