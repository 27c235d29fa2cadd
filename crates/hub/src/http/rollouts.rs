//! The rollout routes (`/v1/admin/rollouts…`): start, list, status, pause, resume and
//! abort.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error::{ApiError, ApiResult};
use super::extract::{parse, read_body, ApiPath, MAX_BODY_BYTES};
use super::state::Hub;
use crate::proto::rollout::{AbortRequest, RolloutRequest};
use crate::store::Store;

pub(super) async fn start<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    body: Body,
) -> ApiResult<Response> {
    let req: RolloutRequest = parse(body).await?;
    let view = hub.fleet.start_rollout(&req).await?;
    let target = format!("{} of {}", view.id, view.version);
    Ok(super::access::about(
        (StatusCode::CREATED, Json(view)).into_response(),
        target,
    ))
}

pub(super) async fn list<S: Store>(State(hub): State<Arc<Hub<S>>>) -> ApiResult<Response> {
    Ok(Json(hub.fleet.rollouts().await?).into_response())
}

pub(super) async fn show<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    Ok(Json(hub.fleet.rollout(&id).await?).into_response())
}

pub(super) async fn pause<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    Ok(Json(hub.fleet.pause_rollout(&id).await?).into_response())
}

pub(super) async fn resume<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    Ok(Json(hub.fleet.resume_rollout(&id).await?).into_response())
}

pub(super) async fn abort<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath(id): ApiPath<String>,
    body: Body,
) -> ApiResult<Response> {
    // An empty body is a plain abort.
    let bytes = read_body(body, MAX_BODY_BYTES).await?;
    let req: AbortRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        AbortRequest::default()
    } else {
        serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("invalid request body: {e}"),
            )
        })?
    };
    Ok(Json(hub.fleet.abort_rollout(&id, req.rollback).await?).into_response())
}
