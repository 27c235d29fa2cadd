//! The hub's HTTP API (hub protocol v1, docs/hub.md): the agents' reconcile, and the admin
//! routes under `/v1/admin` (admin token). Errors are `{"error": "..."}` with a fitting
//! status, for every route and for routes and methods that do not exist.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::fleet::{Fleet, FleetError};
use super::jobs_api as jobs;
use super::releases_api as releases;
use super::store::{Store, StoreError};
use super::token;
use crate::build_info;
use crate::proto::hub::{DesiredChange, EnrolRequest, Enrolled, ErrorBody};
use crate::proto::report::AgentReport;

/// Request bodies above this are refused (413): a report is a few KiB.
pub(crate) const MAX_BODY_BYTES: usize = 256 * 1024;
/// A report may carry up to a thousand jobs' states.
const MAX_REPORT_BYTES: usize = 1024 * 1024;
/// A body must arrive within this, once its headers have (408).
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) struct Hub<S: Store> {
    pub(crate) fleet: Arc<Fleet<S>>,
    /// SHA-256 of the admin token.
    pub(crate) admin_sha256: String,
    /// The longest a reconcile is held, whatever `wait` asks.
    pub(crate) max_wait: Duration,
    /// The publishers' keys: a release is taken only signed by one of them.
    pub(crate) release_keys: Vec<minisign::PublicKey>,
    /// Where published binaries are kept, by SHA-256.
    pub(crate) releases_dir: std::path::PathBuf,
    /// One binary at a time is brought from the database (replicas): a thousand agents
    /// asking at once for one this replica lacks must not load it a thousand times.
    pub(crate) fetching: tokio::sync::Mutex<()>,
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
        .route("/jobs", post(jobs::submit::<S>).get(jobs::list::<S>))
        .route("/jobs/{id}", get(jobs::status::<S>))
        .route("/jobs/{id}/wait", get(jobs::wait::<S>))
        .route("/jobs/{id}/cancel", post(jobs::cancel::<S>))
        .route("/jobs/{id}/output/{stream}", get(jobs::output::<S>))
        .route("/releases", get(releases::list::<S>))
        .route(
            "/releases/{version}/{platform}",
            axum::routing::put(releases::publish::<S>),
        )
        .route("/releases/{version}/resume", post(releases::resume::<S>))
        .layer(axum::middleware::from_fn_with_state(
            hub.clone(),
            admin_only::<S>,
        ));
    Router::new()
        .route("/v1/health", get(health::<S>))
        .route("/v1/agents/{id}/reconcile", post(reconcile::<S>))
        .route(
            "/v1/jobs/{id}/output/{stream}",
            axum::routing::put(jobs::upload::<S>),
        )
        .route(
            "/v1/releases/{version}/{platform}",
            get(releases::download::<S>),
        )
        .nest("/v1/admin", admin)
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .with_state(hub)
}

pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

/// The path's parameters, as axum's `Path` takes them, but refused in the API's own
/// shape (`{"error": …}`, 400) instead of axum's plain text: a client reads one kind of
/// error from every route.
pub(super) struct ApiPath<T>(pub(super) T);

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

impl ApiError {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
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
            FleetError::NoSuchJob(_) => StatusCode::NOT_FOUND,
            FleetError::JobExists(_) | FleetError::RevokedAgent(_) => StatusCode::CONFLICT,
            FleetError::TooManyJobs { .. } => StatusCode::TOO_MANY_REQUESTS,
            FleetError::JobToken(_) => StatusCode::UNAUTHORIZED,
            FleetError::NoSuchRelease(_) => StatusCode::NOT_FOUND,
            FleetError::NotHalted(_) => StatusCode::CONFLICT,
            FleetError::StoreLost | FleetError::CatchingUp(_) => StatusCode::SERVICE_UNAVAILABLE,
            FleetError::AheadOfHub { .. } => StatusCode::BAD_REQUEST,
            FleetError::Store(s) if s.is_disk_full() => {
                tracing::error!(error = %crate::error_chain(&e), "the hub's disk is full");
                return ApiError::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    "the hub's database has no room left (its disk is full): nothing was changed; retry once the hub's operator has made room",
                );
            }
            FleetError::Store(s @ StoreError::GenerationsExhausted(_)) => {
                tracing::error!(error = %crate::error_chain(s), "no change can be made");
                return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, s.to_string());
            }
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

pub(super) type ApiResult<T> = Result<T, ApiError>;

/// Reads a request body: at most [`MAX_BODY_BYTES`] (413), within [`BODY_TIMEOUT`] (408).
/// Called only once the caller is authorised, so that no one without a token makes the
/// hub buffer anything.
pub(super) async fn read_body(body: Body, max: usize) -> ApiResult<Bytes> {
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, max)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the request body is larger than {max} bytes"),
                ))
            } else {
                Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("could not read the request body: {e}"),
                ))
            }
        }
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {BODY_TIMEOUT:?}"),
        )),
    }
}

/// A JSON body, with every way it can be wrong answered as `{"error"}`: too large (413),
/// too slow (408), not JSON or missing a field (400, serde's message names it).
pub(super) async fn parse<T: DeserializeOwned>(body: Body) -> ApiResult<T> {
    parse_capped(body, MAX_BODY_BYTES).await
}

async fn parse_capped<T: DeserializeOwned>(body: Body, max: usize) -> ApiResult<T> {
    let body = read_body(body, max).await?;
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })
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
    match value.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err("the Authorization header must be `Bearer <token>`"),
    }
}

/// A desired change with only the settings this hub knows: an admin's typo must not pass
/// as "nothing to change" (agents' messages, unlike an admin's, may carry fields a newer
/// peer added, and there unknown fields are ignored).
fn strict_change(body: &Bytes) -> ApiResult<()> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })?;
    let known = [
        "runner_enabled",
        "max_jobs",
        "max_jobs_per_owner",
        "version",
        "rollback",
    ];
    let unknown = v
        .get("set")
        .and_then(|s| s.as_object())
        .and_then(|o| o.keys().find(|k| !known.contains(&k.as_str())).cloned())
        .or_else(|| {
            v.as_object()?
                .keys()
                .find(|k| !["set", "clear"].contains(&k.as_str()))
                .cloned()
        });
    match unknown {
        Some(k) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{k:?}: not a desired setting (runner_enabled, max_jobs, max_jobs_per_owner, version, rollback)"),
        )),
        None => Ok(()),
    }
}

async fn parse_change(body: Body) -> ApiResult<DesiredChange> {
    let bytes = read_body(body, MAX_BODY_BYTES).await?;
    strict_change(&bytes)?;
    let change: DesiredChange = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })?;
    if change.set == crate::proto::hub::DesiredSettings::default() && change.clear.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "nothing to change: give `set` or `clear`",
        ));
    }
    Ok(change)
}

async fn admin_only<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    req: Request,
    next: Next,
) -> Response {
    match bearer(req.headers()) {
        Ok(t) if token::matches(t, &hub.admin_sha256) => {
            super::serve::proven();
            next.run(req).await
        }
        Ok(_) => {
            ApiError::new(StatusCode::UNAUTHORIZED, "not the hub's admin token").into_response()
        }
        Err(why) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            format!("{why} (the admin token is in the hub's data dir, admin.token)"),
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
    ApiPath(id): ApiPath<String>,
    query: Result<Query<ReconcileQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let t = bearer(&headers).map_err(|why| ApiError::new(StatusCode::UNAUTHORIZED, why))?;
    // The token before the body: an unauthenticated caller learns nothing from its
    // body's errors.
    let entry = hub.fleet.authorize(&id, t)?;
    super::serve::proven();
    let Query(q) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid query: {}", e.body_text()),
        )
    })?;
    let report: AgentReport = parse_capped(body, MAX_REPORT_BYTES).await?;
    let wait = Duration::from_secs(q.wait.unwrap_or(0)).min(hub.max_wait);
    let desired = hub.fleet.reconcile(&entry, report, wait).await?;
    Ok(Json(desired).into_response())
}

async fn enrol<S: Store>(State(hub): State<Arc<Hub<S>>>, body: Body) -> ApiResult<Response> {
    let req: EnrolRequest = parse(body).await?;
    let token = hub.fleet.enrol(&req.id).await?;
    Ok((StatusCode::CREATED, Json(Enrolled { id: req.id, token })).into_response())
}

async fn list<S: Store>(State(hub): State<Arc<Hub<S>>>) -> ApiResult<Response> {
    hub.fleet.adopt_reports().await?;
    Ok(Json(hub.fleet.list()).into_response())
}

async fn show<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    hub.fleet.adopt_reports().await?;
    Ok(Json(hub.fleet.view_of(&id)?).into_response())
}

async fn revoke<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    Ok(Json(hub.fleet.revoke(&id).await?).into_response())
}

async fn fleet_desired<S: Store>(State(hub): State<Arc<Hub<S>>>) -> ApiResult<Response> {
    Ok(Json(hub.fleet.desired_view(None)?).into_response())
}

async fn set_fleet<S: Store>(State(hub): State<Arc<Hub<S>>>, body: Body) -> ApiResult<Response> {
    let change = parse_change(body).await?;
    Ok(Json(hub.fleet.change(None, &change).await?).into_response())
}

async fn agent_desired<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    Ok(Json(hub.fleet.desired_view(Some(&id))?).into_response())
}

async fn set_agent<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath(id): ApiPath<String>,
    body: Body,
) -> ApiResult<Response> {
    let change = parse_change(body).await?;
    Ok(Json(hub.fleet.change(Some(&id), &change).await?).into_response())
}
