//! The runner's HTTP API (HTTP/1.1 + JSON on its Unix socket). Errors are
//! `{"error": {"code", "message"}}` with a fitting status.

use std::time::Duration;

use axum::body::Body;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, State};
use axum::http::{header, request::Parts, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::engine::{Engine, EngineError, Until};
use super::job::Stream;
use crate::build_info;
use crate::proto::admission::{Admission, AdmissionChange};
use crate::proto::drain::{Drain, DrainView};
use crate::proto::health::Health;
use crate::proto::job::Submitted;
use crate::proto::job::{JobRecord, JobState};
use crate::proto::spec;
use crate::util::clip;

/// Request bodies above this are refused (413): a spec with 1 MiB of stdin fits.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;
/// Longest `wait` a client may ask for, in seconds.
const MAX_WAIT_SECS: u64 = 3600;
/// `wait` without `timeout_secs`.
const DEFAULT_WAIT_SECS: u64 = 30;
/// Largest output slice returned by one request.
const MAX_SLICE: u64 = 8 * 1024 * 1024;
/// Most jobs one list request returns.
const MAX_LIST: u32 = 1000;
/// A list without `limit`.
const DEFAULT_LIST: u32 = 100;

#[derive(Clone)]
pub struct Api {
    pub engine: Engine,
    pub started: std::time::Instant,
    /// What `Authorization: Bearer` must carry (see `runner::token`).
    pub token: std::sync::Arc<str>,
}

pub fn router(api: Api) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/metrics", get(metrics))
        .route("/v1/admission", get(admission).put(set_admission))
        .route("/v1/jobs", post(submit).get(list))
        .route("/v1/jobs/{id}", get(status))
        .route("/v1/jobs/{id}/cancel", post(cancel))
        .route("/v1/prune", post(prune))
        .route("/v1/drain", get(drain).put(set_drain).delete(end_drain))
        .route("/v1/jobs/{id}/wait", get(wait))
        .route("/v1/jobs/{id}/output/{stream}", get(output))
        // After the routes: it is given to each route registered before it.
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(no_route)
        .layer(axum::middleware::from_fn_with_state(api.clone(), authorize))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(api)
}

/// Every route but health needs the token. A request without it is answered (401, or
/// health) on a connection that is then closed, so a client without the token cannot hold
/// one of the server's connections (see `runner::serve`).
async fn authorize(
    State(api): State<Api>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let authorized = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| super::token::matches(&api.token, t.trim()));
    if authorized {
        return next.run(req).await;
    }
    let mut resp = if req.uri().path() == "/v1/health" {
        next.run(req).await
    } else {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            format!(
                "missing or wrong API token: send `Authorization: Bearer <token>` with the token from {} beside the socket (readable by the runner's account and root)",
                super::token::TOKEN_FILE
            ),
        )
        .into_response()
    };
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let message = crate::error_chain(&e);
        match &e {
            EngineError::Spec(_) => Self::new(StatusCode::BAD_REQUEST, "invalid_spec", message),
            EngineError::Job(super::job::JobError::WorkspaceExists { .. }) => {
                Self::new(StatusCode::CONFLICT, "conflict", message)
            }
            EngineError::Job(j) if j.is_client_error() => {
                Self::new(StatusCode::BAD_REQUEST, "invalid_spec", message)
            }
            EngineError::Conflict { .. } => Self::new(StatusCode::CONFLICT, "conflict", message),
            EngineError::QueueFull { .. } => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, "queue_full", message)
            }
            EngineError::InvalidAdmission { .. } => {
                Self::new(StatusCode::BAD_REQUEST, "invalid_admission", message)
            }
            EngineError::NotFound { .. } => Self::new(StatusCode::NOT_FOUND, "not_found", message),
            EngineError::Draining { .. } => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "draining", message)
            }
            EngineError::NoSandbox { .. } | EngineError::NoNetworkSandbox { .. } => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "no_sandbox", message)
            }
            EngineError::NetworkWider { .. } => {
                Self::new(StatusCode::FORBIDDEN, "network_policy", message)
            }
            EngineError::Drain(super::engine::DrainError::Invalid(_)) => {
                Self::new(StatusCode::BAD_REQUEST, "invalid_drain", message)
            }
            EngineError::ShuttingDown => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", message)
            }
            // The disk, not the runner, is at fault: a client may retry once there is room.
            e if e.is_disk_full() => {
                tracing::warn!(error = %message, "job refused: no room to record it");
                Self::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    "insufficient_storage",
                    message,
                )
            }
            _ => {
                tracing::error!(error = %message, "request failed");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// A route with another method: the JSON error, not axum's empty 405 (axum still adds the
/// `Allow` header listing the route's methods).
async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{method} is not allowed on {}: the Allow header lists the methods it takes",
            clip(uri.path())
        ),
    )
}

/// No such route: the JSON error, not axum's empty 404.
async fn no_route(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route {}: see docs/api.md", clip(uri.path())),
    )
}

/// Query parameters, or the API's JSON `invalid_query` error naming the parameter that
/// could not be read. Every handler takes its query through this, never through axum's
/// `Query`, whose rejection is plain text.
struct ApiQuery<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        Query::<T>::try_from_uri(&parts.uri)
            .map(|Query(q)| Self(q))
            .map_err(|e| invalid_query(e.body_text()))
    }
}

/// A request body, or the API's JSON error when it cannot be read (413 past
/// [`MAX_BODY_BYTES`]); axum's `Bytes` rejection is plain text.
struct ApiBody(Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBody {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        Bytes::from_request(req, state)
            .await
            .map(Self)
            .map_err(|e| {
                let status = e.status();
                if status == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(
                        status,
                        "too_large",
                        format!("the request body is larger than {MAX_BODY_BYTES} bytes (2 MiB)"),
                    )
                } else {
                    ApiError::new(status, "invalid_body", e.body_text())
                }
            })
    }
}

fn invalid_query(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", message)
}

/// `value` of query parameter `name` when given and inside `range`; `default` when not
/// given. Out of range is refused, not clamped: a client that asks for what it cannot get
/// is told so.
fn in_range<T>(
    name: &str,
    value: Option<T>,
    default: T,
    range: std::ops::RangeInclusive<T>,
) -> ApiResult<T>
where
    T: PartialOrd + Copy + std::fmt::Display,
{
    Ok(opt_in_range(name, value, range)?.unwrap_or(default))
}

/// [`in_range`] for a parameter without a default: `None` when not given.
fn opt_in_range<T>(
    name: &str,
    value: Option<T>,
    range: std::ops::RangeInclusive<T>,
) -> ApiResult<Option<T>>
where
    T: PartialOrd + Copy + std::fmt::Display,
{
    match value {
        Some(v) if !range.contains(&v) => Err(invalid_query(format!(
            "{name}={v} is out of range: use {}–{}",
            range.start(),
            range.end()
        ))),
        v => Ok(v),
    }
}

async fn health(State(api): State<Api>) -> Json<Health> {
    let (running, queued) = api.engine.job_counts();
    let kept = api.engine.kept();
    Json(Health {
        version: build_info::VERSION.to_owned(),
        pid: std::process::id(),
        uptime_secs: api.started.elapsed().as_secs(),
        jobs_running: running as u64,
        jobs_queued: queued as u64,
        confinement: api.engine.confinement().to_owned(),
        isolation: api.engine.isolation().to_owned(),
        sandbox: api.engine.sandbox(),
        network: api.engine.network().to_string(),
        commits_pending: api.engine.commits_pending() as u64,
        reconciling: api.engine.reconciling() > 0,
        leftovers: api.engine.reconciling() as u64,
        launch: api.engine.launch_method().to_owned(),
        finished_jobs: kept.count as u64,
        kept_bytes: kept.kept,
        max_kept_bytes: api.engine.max_kept_bytes(),
        max_jobs: api.engine.admission().max_jobs as u64,
    })
}

/// Prometheus' text format: the agent serves it beside its own metrics.
async fn metrics(State(api): State<Api>) -> Response {
    let (running, queued) = api.engine.job_counts();
    let kept = api.engine.kept();
    let now = crate::metrics::Now {
        running: running as u64,
        queued: queued as u64,
        max_jobs: api.engine.admission().max_jobs as u64,
        kept_bytes: kept.kept,
        finished_jobs: kept.count as u64,
        commits_pending: api.engine.commits_pending() as u64,
        draining: api.engine.drain_view().drain.is_some(),
        confinement: api.engine.confinement(),
    };
    let mut resp = crate::metrics::render(&now).into_response();
    resp.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

async fn admission(State(api): State<Api>) -> Json<Admission> {
    Json(api.engine.admission())
}

/// Changes the admission limits of the running runner: no job is stopped or restarted.
async fn set_admission(
    State(api): State<Api>,
    ApiBody(body): ApiBody,
) -> ApiResult<Json<Admission>> {
    // Read through axum's `Json`, whose error names the field that could not be read
    // ("max_jobs: invalid value: integer `-1`, expected usize"); the client is told that
    // error, without the rejection's own prefix.
    let Json(change) = Json::<AdmissionChange>::from_bytes(&body).map_err(|e| {
        let why = std::error::Error::source(&e).map_or_else(|| e.body_text(), |s| s.to_string());
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("invalid admission change: {why}"),
        )
    })?;
    Ok(Json(api.engine.set_admission(change)?))
}

/// The drain in force, and the jobs it waits for.
async fn drain(State(api): State<Api>) -> Json<DrainView> {
    Json(api.engine.drain_view())
}

/// Puts a drain in force (or changes its reason or deadline): new jobs are refused from
/// the answer on.
async fn set_drain(State(api): State<Api>, ApiBody(body): ApiBody) -> ApiResult<Json<DrainView>> {
    let drain: Drain = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("invalid drain: {e}"),
        )
    })?;
    Ok(Json(api.engine.set_drain(Some(drain)).await?))
}

async fn end_drain(State(api): State<Api>) -> ApiResult<Json<DrainView>> {
    Ok(Json(api.engine.set_drain(None).await?))
}

async fn submit(State(api): State<Api>, ApiBody(body): ApiBody) -> ApiResult<Response> {
    let crate::proto::secret::Submission {
        spec,
        secret_values,
    } = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("invalid job spec: {e}"),
        )
    })?;
    let warnings = api.engine.unenforced(&spec);
    let (created, rec) = api.engine.submit(spec, secret_values).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(Submitted {
            id: rec.id,
            state: rec.state,
            warnings,
        }),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    state: Option<String>,
    owner: Option<String>,
    before: Option<i64>,
    limit: Option<u32>,
}

async fn list(
    State(api): State<Api>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Vec<JobRecord>>> {
    let state = match q.state.as_deref() {
        None => None,
        Some(s) => Some(
            JobState::parse(s)
                .ok_or_else(|| invalid_query(format!("unknown state {:?}", clip(s))))?,
        ),
    };
    // Seqs start at 1, so `before=1` is the page after the oldest job (empty); below it
    // is a client's mistake (a sign, an off-by-one), not an empty page.
    let before = opt_in_range("before", q.before, 1..=i64::MAX)?;
    let limit = in_range("limit", q.limit, DEFAULT_LIST, 1..=MAX_LIST)?;
    // An owner no job can have matches nothing, for the same reason.
    if let Some(owner) = q.owner.as_deref().filter(|o| !spec::valid_owner(o)) {
        return Err(invalid_query(format!(
            "owner={:?} cannot name an owner: owners are 1-128 characters from A-Z a-z 0-9 . _ - @",
            clip(owner)
        )));
    }
    Ok(Json(api.engine.list(state, q.owner, before, limit).await?))
}

async fn found(api: &Api, id: &str) -> ApiResult<JobRecord> {
    api.engine.get(id).await?.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no job {}", clip(id)),
        )
    })
}

async fn status(State(api): State<Api>, Path(id): Path<String>) -> ApiResult<Json<JobRecord>> {
    Ok(Json(found(&api, &id).await?))
}

async fn cancel(State(api): State<Api>, Path(id): Path<String>) -> ApiResult<Json<JobRecord>> {
    found(&api, &id).await?;
    Ok(Json(api.engine.cancel(&id).await?))
}

#[derive(Debug, Deserialize)]
struct PruneQuery {
    /// Finished jobs to keep, newest first (default 0: every finished job goes).
    keep: Option<usize>,
}

/// `POST /v1/prune?keep=N`: deletes the oldest finished jobs (records, spools and
/// workspaces) until `keep` are left; running and queued jobs are not touched.
async fn prune(
    State(api): State<Api>,
    ApiQuery(q): ApiQuery<PruneQuery>,
) -> ApiResult<Json<crate::proto::job::Pruned>> {
    let (deleted, freed_bytes) = api.engine.prune(q.keep.unwrap_or(0)).await?;
    let kept = api.engine.kept();
    Ok(Json(crate::proto::job::Pruned {
        deleted,
        freed_bytes,
        finished_jobs: kept.count,
        kept_bytes: kept.kept,
    }))
}

#[derive(Debug, Deserialize)]
struct WaitQuery {
    timeout_secs: Option<u64>,
    /// `ended` (the default) or `started`: the job's process runs (or the job is over).
    until: Option<String>,
}

async fn wait(
    State(api): State<Api>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> ApiResult<Json<JobRecord>> {
    let secs = in_range(
        "timeout_secs",
        q.timeout_secs,
        DEFAULT_WAIT_SECS,
        0..=MAX_WAIT_SECS,
    )?;
    let until = match q.until.as_deref() {
        None => Until::Ended,
        Some(u) => Until::parse(u)
            .ok_or_else(|| invalid_query(format!("until={:?}: use started or ended", clip(u))))?,
    };
    found(&api, &id).await?;
    let timeout = Duration::from_secs(secs);
    Ok(Json(api.engine.wait_until(&id, until, timeout).await?))
}

#[derive(Debug, Deserialize)]
struct OutputQuery {
    offset: Option<u64>,
    limit: Option<u64>,
    follow: Option<bool>,
}

/// Raw bytes of a stream from `offset`. Headers: `X-Next-Offset` and `X-Complete` (the
/// job has ended and everything up to the next offset is all there is). With
/// `follow=true` the body streams until the job ends.
async fn output(
    State(api): State<Api>,
    Path((id, stream)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<OutputQuery>,
) -> ApiResult<Response> {
    let limit = in_range("limit", q.limit, MAX_SLICE, 1..=MAX_SLICE)?;
    let stream = Stream::parse(&stream).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no stream {:?}: use stdout or stderr", clip(&stream)),
        )
    })?;
    let rec = found(&api, &id).await?;
    let path = api.engine.paths().spool_file(&id, stream);
    let offset = q.offset.unwrap_or(0);
    if q.follow.unwrap_or(false) {
        return Ok(follow(api, id, path, offset));
    }
    let bytes = read_slice(&path, offset, limit).await;
    let next = offset + bytes.len() as u64;
    let size = tokio::fs::metadata(&path)
        .await
        .map(|m| m.len())
        .unwrap_or(0);
    let complete = rec.state.is_terminal() && next >= size;
    let mut resp = Response::new(Body::from(bytes));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert("x-next-offset", HeaderValue::from(next));
    h.insert(
        "x-complete",
        HeaderValue::from_static(if complete { "true" } else { "false" }),
    );
    Ok(resp)
}

async fn read_slice(path: &std::path::Path, offset: u64, limit: u64) -> Vec<u8> {
    let Ok(mut f) = tokio::fs::File::open(path).await else {
        return Vec::new();
    };
    if f.seek(std::io::SeekFrom::Start(offset)).await.is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    let _ = f.take(limit).read_to_end(&mut buf).await;
    buf
}

fn follow(api: Api, id: String, path: std::path::PathBuf, offset: u64) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    tokio::spawn(async move {
        let mut offset = offset;
        let mut activity = api.engine.activity();
        loop {
            // Read the state before the bytes: if the job had ended by then, the bytes read
            // after it are all there will ever be.
            // A job that is gone (retention) or unreadable ends the stream too.
            let ended = !matches!(api.engine.get(&id).await, Ok(Some(r)) if !r.state.is_terminal());
            let chunk = read_slice(&path, offset, 1024 * 1024).await;
            if !chunk.is_empty() {
                offset += chunk.len() as u64;
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
                continue;
            }
            if ended {
                return;
            }
            // Cancel-safe: `changed` only observes; a closed client ends the loop on send.
            tokio::select! {
                r = activity.changed() => if r.is_err() { return },
                _ = tx.closed() => return,
            }
        }
    });
    crate::stream_body::streamed_bytes(rx)
}
