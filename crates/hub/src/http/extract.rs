//! Taking a request apart, each refusal in the API's own shape: the path's parameters,
//! the query, the bearer token, and a body read with a size cap and a deadline (only once
//! the caller is authorised).

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query};
use axum::http::{header, HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

use super::error::{ApiError, ApiResult};

/// Request bodies above this are refused (413): a report is a few KiB.
pub(super) const MAX_BODY_BYTES: usize = 256 * 1024;
/// A body must arrive within this, once its headers have (408).
pub(super) const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The path's parameters, as axum's `Path` takes them, but refused in the API's own
/// shape (`{"error": …}`, 400) instead of axum's plain text: a client reads one kind of
/// error from every route.
pub(super) struct ApiPath<T>(pub T);

impl<S, T> axum::extract::FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(ApiPath(v)),
            Err(e) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "the request path is not valid: {}",
                    crate::util::clip(&e.body_text()).escape_debug()
                ),
            )),
        }
    }
}

/// The query string, or 400 naming what is wrong with it.
pub(super) fn query<T>(q: Result<Query<T>, QueryRejection>) -> ApiResult<T> {
    q.map(|Query(q)| q).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid query: {}", e.body_text()),
        )
    })
}

/// Reads a request body: at most [`MAX_BODY_BYTES`] (413), within [`BODY_TIMEOUT`] (408).
/// Called only once the caller is authorised, so that no one without a token makes the
/// hub buffer anything.
pub(super) async fn read_body(body: Body, max: usize) -> ApiResult<Bytes> {
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, max)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => {
            let too_large_for = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large_for {
                Err(too_large(max))
            } else {
                Err(unreadable(&e))
            }
        }
        Err(_) => Err(too_slow()),
    }
}

/// A body over `max` bytes (413).
pub(super) fn too_large(max: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body is larger than {max} bytes"),
    )
}

/// A body not all there within [`BODY_TIMEOUT`] (408).
pub(super) fn too_slow() -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        format!("the request body did not arrive within {BODY_TIMEOUT:?}"),
    )
}

/// A body that could not be read (400).
pub(super) fn unreadable(e: &dyn std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        format!("could not read the request body: {e}"),
    )
}

/// A JSON body's value, or 400 with serde's message (which names the field).
pub(super) fn json<T: DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })
}

/// A JSON body, with every way it can be wrong answered as `{"error"}`: too large (413),
/// too slow (408), not JSON or missing a field (400, serde's message names it).
pub(super) async fn parse<T: DeserializeOwned>(body: Body) -> ApiResult<T> {
    parse_capped(body, MAX_BODY_BYTES).await
}

pub(super) async fn parse_capped<T: DeserializeOwned>(body: Body, max: usize) -> ApiResult<T> {
    json(&read_body(body, max).await?)
}

/// The token of an `Authorization: Bearer …` header (the scheme in any case, RFC 7235);
/// why there is none otherwise.
pub(super) fn bearer(headers: &HeaderMap) -> Result<&str, &'static str> {
    let mut all = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = all.next() else {
        return Err("missing `Authorization: Bearer <token>`");
    };
    if all.next().is_some() {
        return Err("more than one Authorization header");
    }
    let value = value
        .to_str()
        .map_err(|_| "the Authorization header is not text")?;
    crate::token::bearer_text(value)
}
