//! The hub's job routes: the admin's (`/v1/admin/jobs…`: submit, list, status, wait,
//! cancel, output with offsets and follow) and the agent's output upload
//! (`PUT /v1/jobs/{job}/output/{stream}?offset=N`, the agent's token).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

use super::access::{about, checked, peer_ip, CallerOf};
use super::error::{ApiError, ApiResult};
use super::extract::{bearer, parse, query, read_body, ApiPath};
use super::state::Hub;
use crate::access::Caller;
use crate::fleet::Upload;
use crate::metrics::AuthRoute;
use crate::proto::fleet_job::{HubGroupSubmit, HubJobSubmit, OutputAck};
use crate::proto::selector::Selector;
use crate::store::{Appended, JobFilter, Store, Stream};
use crate::util::clip;

/// The largest upload: an agent sends its output in pieces of at most this.
pub(super) const MAX_UPLOAD: usize = 1024 * 1024;
/// The most of a stream one `output` answer (or one piece of a followed one) carries.
const MAX_SLICE: usize = 1024 * 1024;
const DEFAULT_LIST: usize = 100;
const MAX_LIST: usize = 1000;
const DEFAULT_WAIT_SECS: u64 = 30;
const MAX_WAIT_SECS: u64 = 300;

/// Offsets are stored as signed 64-bit numbers.
fn offset_of(offset: u64) -> ApiResult<u64> {
    if offset > i64::MAX as u64 {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("offset={offset} is out of range (0 to {})", i64::MAX),
        ));
    }
    Ok(offset)
}

fn stream_of(s: &str) -> ApiResult<Stream> {
    Stream::parse(s).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no stream {:?}: use stdout or stderr", clip(s)),
        )
    })
}

/// Refuses a job naming a secret that does not exist, that reaches beyond where the job
/// may go (`agent` or `selector`), or that the caller's selection does not cover.
async fn secrets_admitted<S: Store>(
    hub: &Hub<S>,
    caller: &Caller,
    spec: &crate::proto::job::JobSpec,
    agent: Option<&str>,
    selector: Option<&str>,
) -> ApiResult<()> {
    use crate::secrets::Target;
    crate::proto::secret::check_names(spec)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    let names: Vec<String> = crate::proto::secret::names(spec).cloned().collect();
    if names.is_empty() {
        return Ok(());
    }
    let reach = caller.selection().map(|s| (caller.name(), s));
    let labels;
    let sel;
    let target = match (agent, selector) {
        (Some(id), _) => {
            labels = hub.fleet.hub_labels(id)?;
            Target::Agent(id, &labels)
        }
        (None, Some(text)) => {
            sel = Selector::parse(text).map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("selector {}: {e}", clip(text)),
                )
            })?;
            Target::Selected(&sel)
        }
        (None, None) => return Ok(()),
    };
    hub.secrets.admit(&names, target, reach).await?;
    Ok(())
}

pub(super) async fn submit<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    body: Body,
) -> ApiResult<Response> {
    let req: HubJobSubmit = parse(body).await?;
    secrets_admitted(
        &hub,
        &caller,
        &req.spec,
        req.agent.as_deref(),
        req.selector.as_deref(),
    )
    .await?;
    if req.spec.widen_network {
        caller.may_widen_network()?;
    }
    let view = hub.fleet.submit_job(req, caller.selection()).await?;
    let target = format!(
        "{} on {}",
        view.id,
        match (&view.selector, view.agent.as_str()) {
            (Some(s), _) => s.clone(),
            (None, a) => a.to_owned(),
        }
    );
    Ok(about(
        (StatusCode::CREATED, Json(view)).into_response(),
        target,
    ))
}

/// A fan-out: one job per matching agent, as a group.
pub(super) async fn submit_group<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    body: Body,
) -> ApiResult<Response> {
    let req: HubGroupSubmit = parse(body).await?;
    secrets_admitted(&hub, &caller, &req.spec, None, Some(&req.selector)).await?;
    if req.spec.widen_network {
        caller.may_widen_network()?;
    }
    let target = req.selector.clone();
    let view = hub.fleet.submit_group(req, caller.selection()).await?;
    let target = format!("group {} on {target}", view.group);
    Ok(about(
        (StatusCode::CREATED, Json(view)).into_response(),
        target,
    ))
}

#[derive(Deserialize)]
pub(super) struct ListQuery {
    agent: Option<String>,
    /// Jobs routed by this selector (any spelling of it).
    selector: Option<String>,
    /// The members of one fan-out.
    group: Option<String>,
    /// A `seq`-ordered page: jobs submitted before the job at this position.
    before: Option<u64>,
    limit: Option<usize>,
}

pub(super) async fn list<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let q = query(q)?;
    let limit = q.limit.unwrap_or(DEFAULT_LIST);
    if !(1..=MAX_LIST).contains(&limit) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("limit={limit} is out of range (1 to {MAX_LIST})"),
        ));
    }
    let selector = q
        .selector
        .as_deref()
        .map(|s| {
            Selector::parse(s)
                .map(|s| s.to_string())
                .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("selector: {e}")))
        })
        .transpose()?;
    let filter = JobFilter {
        agent: q.agent.as_deref(),
        selector: selector.as_deref(),
        group: q.group.as_deref(),
    };
    let mut jobs = hub.fleet.jobs(filter, q.before, limit).await?;
    if let Some(sel) = caller.selection() {
        jobs.retain(|j| hub.fleet.job_in_scope(j, sel));
    }
    Ok(Json(jobs).into_response())
}

pub(super) async fn status<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    Ok(Json(hub.fleet.job_for(&id, caller.selection()).await?).into_response())
}

#[derive(Deserialize)]
pub(super) struct WaitQuery {
    timeout_secs: Option<u64>,
}

/// The job once it is done (ended, all output here), or as it is after the timeout.
pub(super) async fn wait<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    ApiPath(id): ApiPath<String>,
    q: Result<Query<WaitQuery>, QueryRejection>,
) -> ApiResult<Response> {
    hub.fleet.job_for(&id, caller.selection()).await?;
    let secs = query(q)?.timeout_secs.unwrap_or(DEFAULT_WAIT_SECS);
    if secs > MAX_WAIT_SECS {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("timeout_secs={secs} is out of range (0 to {MAX_WAIT_SECS})"),
        ));
    }
    let view = hub.fleet.wait_job(&id, Duration::from_secs(secs)).await?;
    Ok(Json(view).into_response())
}

pub(super) async fn cancel<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    hub.fleet.job_for(&id, caller.selection()).await?;
    Ok(Json(hub.fleet.cancel_job(&id).await?).into_response())
}

#[derive(Deserialize)]
pub(super) struct OutputQuery {
    offset: Option<u64>,
    limit: Option<usize>,
    follow: Option<bool>,
}

/// Raw bytes of a stream from `offset`, with `X-Next-Offset` and `X-Complete` (the job
/// is done and nothing is kept past the next offset). With `follow=true` the body runs
/// until the job is done.
pub(super) async fn output<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    ApiPath((id, stream)): ApiPath<(String, String)>,
    q: Result<Query<OutputQuery>, QueryRejection>,
) -> ApiResult<Response> {
    hub.fleet.job_for(&id, caller.selection()).await?;
    let q = query(q)?;
    let stream = stream_of(&stream)?;
    let limit = q.limit.unwrap_or(MAX_SLICE).clamp(1, MAX_SLICE);
    let offset = offset_of(q.offset.unwrap_or(0))?;
    // Before the first read: a change after it wakes the follower.
    let activity = hub.fleet.job_activity();
    let first = hub.fleet.job_output(&id, stream, offset, limit).await?;
    if q.follow.unwrap_or(false) {
        return Ok(follow(hub, id, stream, first, activity));
    }
    let mut resp = Response::new(Body::from(first.bytes));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert("x-next-offset", HeaderValue::from(first.next));
    h.insert(
        "x-complete",
        HeaderValue::from_static(if first.complete { "true" } else { "false" }),
    );
    Ok(resp)
}

fn follow<S: Store>(
    hub: Arc<Hub<S>>,
    id: String,
    stream: Stream,
    first: crate::fleet::OutputSlice,
    mut activity: tokio::sync::watch::Receiver<u64>,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    tokio::spawn(async move {
        let mut slice = first;
        loop {
            let next = slice.next;
            let got = !slice.bytes.is_empty();
            if got && tx.send(Ok(slice.bytes)).await.is_err() {
                return;
            }
            if slice.complete {
                return;
            }
            if !got {
                // Cancel-safe: `changed` only observes; a closed client ends the loop.
                tokio::select! {
                    r = activity.changed() => if r.is_err() { return },
                    () = tx.closed() => return,
                }
            }
            activity.borrow_and_update();
            slice = match hub.fleet.job_output(&id, stream, next, MAX_SLICE).await {
                Ok(s) => s,
                // The job was deleted meanwhile, or the database failed: the stream ends
                // short, and the client's `X-Complete`-less end says so.
                Err(e) => {
                    let _ = tx
                        .send(Err(std::io::Error::other(crate::error_chain(&e))))
                        .await;
                    return;
                }
            };
        }
    });
    crate::stream_body::streamed_bytes(rx)
}

#[derive(Deserialize)]
pub(super) struct UploadQuery {
    offset: u64,
}

/// A 409 for an upload past what the hub holds: the length to resume from.
#[derive(Serialize)]
struct GapBody {
    error: String,
    length: u64,
}

pub(super) async fn upload<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    peer: Option<Extension<crate::serve::Peer>>,
    ApiPath((id, stream)): ApiPath<(String, String)>,
    q: Result<Query<UploadQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let stream = stream_of(&stream)?;
    let offset = offset_of(query(q)?.offset)?;
    let upload = Upload {
        job: id,
        stream,
        offset,
    };
    // The token before the body, as for a reconcile.
    let authorized = match bearer(&headers) {
        Ok(t) => hub
            .fleet
            .authorize_upload(&upload, t)
            .await
            .map_err(ApiError::from),
        Err(why) => Err(ApiError::new(StatusCode::UNAUTHORIZED, why)),
    };
    let action = ("PUT /v1/jobs/{id}/output/{stream}", upload.job.as_str());
    checked(
        &hub,
        AuthRoute::Agent,
        peer_ip(peer.as_ref()),
        action,
        authorized,
    )
    .await?;
    crate::unproven::proven();
    let data = read_body(body, MAX_UPLOAD).await?;
    match hub.fleet.upload(&upload, data).await? {
        Appended::Length(length) => Ok(Json(OutputAck { length }).into_response()),
        Appended::Gap(length) => Ok((
            StatusCode::CONFLICT,
            Json(GapBody {
                error: format!(
                    "offset {offset} is past the {length} bytes of {} the hub holds for job {}: resume from {length}",
                    stream.name(),
                    clip(&upload.job)
                ),
                length,
            }),
        )
            .into_response()),
        Appended::NoJob => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            format!("the token is not valid for job {:?}", clip(&upload.job)),
        )),
    }
}
