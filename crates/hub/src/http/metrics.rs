//! `GET /metrics`: the hub's metrics in Prometheus' text format, for a token with the
//! scope `agents:read` (a plain-HTTP listener of its own serves them without one:
//! `hub serve --metrics-listen`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ApiResult};
use super::extract::bearer;
use super::state::Hub;
use crate::proto::access::AGENTS_READ;
use crate::store::Store;
use crate::unproven::proven;

/// The text format's content type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub(super) async fn scrape<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let token = bearer(&headers).map_err(|why| ApiError::new(StatusCode::UNAUTHORIZED, why))?;
    let caller = hub
        .access
        .who(token)
        .await
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "not a token of this hub"))?;
    if !caller.may(AGENTS_READ) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "token {:?} lacks the scope {AGENTS_READ} that GET /metrics needs",
                caller.name()
            ),
        ));
    }
    proven();
    exposition(&hub).await
}

/// The exposition, for either listener.
pub(super) async fn exposition<S: Store>(hub: &Hub<S>) -> ApiResult<Response> {
    let gauges = hub.fleet.gauges().await?;
    let body = crate::metrics::render(&gauges, &hub.replica);
    let mut resp = body.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    Ok(resp)
}

/// The plain-HTTP listener's router: `GET /metrics` and nothing else, no token.
pub(crate) fn plain<S: Store>(hub: Arc<Hub<S>>) -> axum::Router {
    async fn open<S: Store>(State(hub): State<Arc<Hub<S>>>) -> ApiResult<Response> {
        exposition(&hub).await
    }
    axum::Router::new()
        .route("/metrics", axum::routing::get(open::<S>))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "only /metrics is served here") })
        .with_state(hub)
}
