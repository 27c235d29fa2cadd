//! The hub's HTTP API (hub protocol v1, DESIGN.md): the agents' reconcile, and the admin
//! routes under `/v1/admin` (admin token). Errors are `{"error": "..."}` with a fitting
//! status, for every route and for routes and methods that do not exist.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::fleet::{Fleet, FleetError};
use super::store::Store;
use super::token;
use crate::build_info;
use crate::proto::hub::{DesiredChange, EnrolRequest, Enrolled, ErrorBody};
use crate::proto::report::AgentReport;

/// Request bodies above this are refused (413): a report is a few KiB.
pub(crate) const MAX_BODY_BYTES: usize = 256 * 1024;

pub(crate) struct Hub<S: Store> {
    pub(crate) fleet: Arc<Fleet<S>>,
    /// SHA-256 of the admin token.
    pub(crate) admin_sha256: String,
    /// The longest a reconcile is held, whatever `wait` asks.
    pub(crate) max_wait: Duration,
}

pub(crate) fn router<S: Store>(hub: Arc<Hub<S>>) -> Router {
    let admin = Router::new()
        .route("/agents", post(enrol::<S>).get(list::<S>))
        .route("/agents/{id}", get(show::<S>))
        .route("/agents/{id}/revoke", post(revoke::<S>))
        .route(
            "/desired/fleet",
            get(fleet_desired::<S>).put(set_fleet::<S>),
        )
        .route(
            "/desired/agents/{id}",
            get(agent_desired::<S>).put(set_agent::<S>),
        )
        .layer(axum::middleware::from_fn_with_state(
            hub.clone(),
            admin_only::<S>,
        ));
    Router::new()
        .route("/v1/health", get(health::<S>))
        .route("/v1/agents/{id}/reconcile", post(reconcile::<S>))
        .nest("/v1/admin", admin)
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(hub)
}

pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (
            self.status,
            Json(ErrorBody {
                error: self.message,
            }),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

impl From<FleetError> for ApiError {
    fn from(e: FleetError) -> Self {
        let status = match &e {
            FleetError::NoSuchAgent(_) => StatusCode::NOT_FOUND,
            FleetError::BadToken(_) | FleetError::Revoked(_) => StatusCode::UNAUTHORIZED,
            FleetError::Exists(_) => StatusCode::CONFLICT,
            FleetError::BadId { .. } | FleetError::BadSetting { .. } => StatusCode::BAD_REQUEST,
            FleetError::Store(_) => {
                tracing::error!(error = %crate::error_chain(&e), "the hub's store failed");
                return ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the hub could not reach its database; see the hub's log",
                );
            }
        };
        ApiError::new(status, e.to_string())
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// A JSON body, with every way it can be wrong answered as `{"error"}`: too large (413,
/// from the body limit), not JSON or missing a field (400, serde's message names it).
fn parse<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> ApiResult<T> {
    let body = body.map_err(|r| ApiError::new(r.status(), r.body_text()))?;
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

async fn admin_only<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    req: Request,
    next: Next,
) -> Response {
    match bearer(req.headers()) {
        Some(t) if token::matches(t, &hub.admin_sha256) => next.run(req).await,
        Some(_) => ApiError::new(StatusCode::UNAUTHORIZED, "not the hub's admin token").into_response(),
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer <admin token>` (the token is in the hub's data dir, admin.token)",
        )
        .into_response(),
    }
}

async fn no_route() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route")
}

async fn no_method() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "this route does not take that method",
    )
}

#[derive(Serialize)]
struct HubHealth {
    version: &'static str,
    agents: usize,
    polls_held: usize,
}

async fn health<S: Store>(State(hub): State<Arc<Hub<S>>>) -> Json<HubHealth> {
    let (agents, polls_held) = hub.fleet.counts();
    Json(HubHealth {
        version: build_info::VERSION,
        agents,
        polls_held,
    })
}

#[derive(Deserialize)]
struct ReconcileQuery {
    /// Seconds to hold the request when nothing has changed for the agent.
    #[serde(default)]
    wait: Option<u64>,
}

async fn reconcile<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Path(id): Path<String>,
    query: Result<Query<ReconcileQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let Some(t) = bearer(&headers) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer <agent token>`",
        ));
    };
    // The token before the body: an unauthenticated caller learns nothing from its
    // body's errors.
    let entry = hub.fleet.authorize(&id, t)?;
    let Query(q) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid query: {}", e.body_text()),
        )
    })?;
    let report: AgentReport = parse(body)?;
    let wait = Duration::from_secs(q.wait.unwrap_or(0)).min(hub.max_wait);
    let desired = hub.fleet.reconcile(&entry, report, wait).await?;
    Ok(Json(desired).into_response())
}

async fn enrol<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let req: EnrolRequest = parse(body)?;
    let token = hub.fleet.enrol(&req.id).await?;
    Ok((StatusCode::CREATED, Json(Enrolled { id: req.id, token })).into_response())
}

async fn list<S: Store>(State(hub): State<Arc<Hub<S>>>) -> Response {
    Json(hub.fleet.list()).into_response()
}

async fn show<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    Ok(Json(hub.fleet.view_of(&id)?).into_response())
}

async fn revoke<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    Ok(Json(hub.fleet.revoke(&id).await?).into_response())
}

async fn fleet_desired<S: Store>(State(hub): State<Arc<Hub<S>>>) -> ApiResult<Response> {
    Ok(Json(hub.fleet.desired_view(None)?).into_response())
}

async fn set_fleet<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let change: DesiredChange = parse(body)?;
    Ok(Json(hub.fleet.change(None, &change).await?).into_response())
}

async fn agent_desired<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    Ok(Json(hub.fleet.desired_view(Some(&id))?).into_response())
}

async fn set_agent<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let change: DesiredChange = parse(body)?;
    Ok(Json(hub.fleet.change(Some(&id), &change).await?).into_response())
}
