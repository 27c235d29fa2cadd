//! The secrets' routes (`/v1/admin/secrets…`, scope `secrets:write`): set, list (never a
//! value), remove, and rotate the key that seals them. The audit log records each by the
//! secret's name (the gate writes it from the path); a body is never logged.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;

use super::access::{about, CallerOf};
use super::error::{ApiError, ApiResult};
use super::extract::{parse, ApiPath};
use super::state::Hub;
use crate::access::Caller;
use crate::proto::secret::SecretSet;
use crate::proto::selector::Selector;
use crate::secrets::SecretsError;
use crate::store::Store;

impl From<SecretsError> for ApiError {
    fn from(e: SecretsError) -> Self {
        if let SecretsError::Store(s) = e {
            return ApiError::from(crate::fleet::FleetError::Store(s));
        }
        let status = match &e {
            SecretsError::Bad(_) | SecretsError::BadSelector { .. } => StatusCode::BAD_REQUEST,
            SecretsError::NoSuchSecret(_) => StatusCode::NOT_FOUND,
            SecretsError::OutOfScope(_) => StatusCode::FORBIDDEN,
            SecretsError::Moved(_)
            | SecretsError::RotationMoved
            | SecretsError::RotationPending { .. } => StatusCode::CONFLICT,
            SecretsError::TooLarge(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, crate::util::error_chain(&e))
    }
}

/// The caller's name and selection, when it has one.
fn reach(caller: &Caller) -> Option<(&str, &Selector)> {
    caller.selection().map(|s| (caller.name(), s))
}

/// The secrets the caller may change: all of them, or those scoped inside its selection.
pub(super) async fn list<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
) -> ApiResult<Response> {
    let mut all = hub.secrets.list().await?;
    if let Some(sel) = caller.selection() {
        all.retain(|v| {
            v.selector
                .as_deref()
                .and_then(|s| Selector::parse(s).ok())
                .is_some_and(|s| s.within(sel))
        });
    }
    Ok(Json(all).into_response())
}

pub(super) async fn set<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    ApiPath(name): ApiPath<String>,
    body: Body,
) -> ApiResult<Response> {
    let req: SecretSet = parse(body).await?;
    let view = hub
        .secrets
        .set(&name, req, caller.name(), reach(&caller))
        .await?;
    tracing::info!(secret = %name, version = view.version, by = caller.name(), "secret set");
    let target = format!("{name} version {}", view.version);
    Ok(about((StatusCode::OK, Json(view)).into_response(), target))
}

pub(super) async fn remove<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Response> {
    let version = hub.secrets.remove(&name, reach(&caller)).await?;
    tracing::info!(secret = %name, version, by = caller.name(), "secret removed");
    #[derive(Serialize)]
    struct Removed {
        name: String,
        version: u64,
    }
    Ok(Json(Removed { name, version }).into_response())
}

pub(super) async fn rotate_key<S: Store>(State(hub): State<Arc<Hub<S>>>) -> ApiResult<Response> {
    let (old, new, resealed) = hub.secrets.rotate_key().await?;
    tracing::warn!(old = old.as_deref().unwrap_or("-"), new = %new, resealed, "the secrets key was rotated: back up the new key file; replicas need it too");
    #[derive(Serialize)]
    struct Rotated {
        old_key: Option<String>,
        key: String,
        resealed: usize,
    }
    let target = format!("key {new}");
    Ok(about(
        Json(Rotated {
            old_key: old,
            key: new,
            resealed,
        })
        .into_response(),
        target,
    ))
}
