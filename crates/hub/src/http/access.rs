//! The access routes: scoped admin tokens and the root token's rotation
//! (`/v1/admin/tokens…`), enrolment tokens (`/v1/admin/enrol-tokens…`), agent token
//! rotation (`/v1/admin/agents/rotate`), the audit log (`/v1/admin/audit`), and a host's
//! own enrolment (`POST /v1/enrol`, with an enrolment token).

use std::net::IpAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiResult};
use super::extract::{bearer, parse, ApiPath};
use super::state::Hub;
use crate::access::{Audited, Caller};
use crate::metrics::AuthRoute;
use crate::proto::access::{EnrolTokenRequest, SelfEnrol, TokenRequest};
use crate::store::Store;
use crate::unproven::proven;

/// What an admin request was about, when its path does not say (a body's job id, a
/// token's name): the gate writes it in the audit line.
#[derive(Debug, Clone)]
pub(super) struct Target(pub String);

/// `resp` with `target` for the audit log.
pub(super) fn about(mut resp: Response, target: impl Into<String>) -> Response {
    resp.extensions_mut().insert(Target(target.into()));
    resp
}

pub(super) async fn create_token<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    body: Body,
) -> ApiResult<Response> {
    let req: TokenRequest = parse(body).await?;
    let made = hub.access.create_token(&caller, &req).await?;
    let name = made.view.name.clone();
    Ok(about(
        (StatusCode::CREATED, Json(made)).into_response(),
        name,
    ))
}

pub(super) async fn tokens<S: Store>(State(hub): State<Arc<Hub<S>>>) -> ApiResult<Response> {
    Ok(Json(hub.access.tokens().await?).into_response())
}

pub(super) async fn revoke_token<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Response> {
    Ok(Json(hub.access.revoke_token(&caller, &name).await?).into_response())
}

#[derive(Serialize)]
struct RootToken {
    token: String,
}

pub(super) async fn rotate_root<S: Store>(State(hub): State<Arc<Hub<S>>>) -> ApiResult<Response> {
    let token = hub.access.rotate_root().await?;
    Ok(about(Json(RootToken { token }).into_response(), "root"))
}

pub(super) async fn create_enrol_token<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    body: Body,
) -> ApiResult<Response> {
    let req: EnrolTokenRequest = parse(body).await?;
    if let Some(sel) = caller.selection() {
        // The agents it enrols start with these labels.
        hub.secrets
            .labels_allowed(
                "(enrolled)",
                &Default::default(),
                &req.labels,
                Some((caller.name(), sel)),
            )
            .await?;
    }
    let made = hub.access.create_enrol_token(&caller, &req).await?;
    let id = made.view.id.clone();
    Ok(about((StatusCode::CREATED, Json(made)).into_response(), id))
}

pub(super) async fn enrol_tokens<S: Store>(State(hub): State<Arc<Hub<S>>>) -> ApiResult<Response> {
    Ok(Json(hub.access.enrol_tokens().await?).into_response())
}

pub(super) async fn revoke_enrol_token<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    Ok(Json(hub.access.revoke_enrol_token(&caller, &id).await?).into_response())
}

/// `POST /v1/admin/agents/rotate`: `{"agents": [...]}` or `{"all": true}`.
#[derive(Deserialize)]
pub(super) struct RotateRequest {
    #[serde(default)]
    agents: Vec<String>,
    #[serde(default)]
    all: bool,
}

#[derive(Serialize)]
struct Rotating {
    agents: Vec<String>,
}

pub(super) async fn rotate_agents<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    body: Body,
) -> ApiResult<Response> {
    let req: RotateRequest = parse(body).await?;
    if req.all != req.agents.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "give either agents or all",
        ));
    }
    if req.all {
        caller.fleet_wide("rotating every agent's token")?;
    }
    for id in &req.agents {
        hub.fleet.reach(id, caller.selection())?;
    }
    let ids = (!req.all).then_some(req.agents.as_slice());
    let agents = hub.fleet.rotate_tokens(ids).await?;
    let target = if req.all {
        "all".to_owned()
    } else {
        agents.join(",")
    };
    Ok(about(Json(Rotating { agents }).into_response(), target))
}

#[derive(Deserialize)]
pub(super) struct AuditQuery {
    #[serde(default)]
    since_secs: Option<u64>,
    #[serde(default)]
    token: Option<String>,
}

pub(super) async fn audit<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let q = super::extract::query(query)?;
    let since = q.since_secs.map_or(0, |s| {
        crate::util::unix_now_ms().saturating_sub(s.saturating_mul(1000))
    });
    let lines = hub.access.audit_lines(since, q.token.as_deref()).await?;
    Ok(Json(lines).into_response())
}

/// `POST /v1/enrol`: a host trades an enrolment token for its own agent token. Audited
/// here (no admin gate stands before it), refusals included; the tokens never.
pub(super) async fn enrol<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    peer: Option<Extension<crate::serve::Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let ip = peer_ip(peer.as_ref());
    let peer = ip.map_or_else(|| "-".to_owned(), |ip| ip.to_string());
    let token = bearer(&headers).ok().map(str::to_owned);
    // A source past its burst of failures is not looked up in the store, unless its token
    // is one this hub made (known by its hash in memory).
    let exhausted = match (hub.access.throttle.exhausted(ip), &token) {
        (Some(wait), Some(t)) if !hub.access.is_enrol_token(t).await => Some(wait),
        (Some(wait), None) => Some(wait),
        _ => None,
    };
    let (resp, via, id) = match (exhausted, token) {
        (Some(wait), _) => (
            ApiError::throttled(wait).into_response(),
            "-".to_owned(),
            "-".to_owned(),
        ),
        (None, None) => (
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing `Authorization: Bearer <enrolment token>` (hub enrol-token create)",
            )
            .into_response(),
            "-".to_owned(),
            "-".to_owned(),
        ),
        (None, Some(t)) if !hub.access.may_enrol(&t) => (
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too many enrolments with this token: retry in a few seconds",
            )
            .into_response(),
            "-".to_owned(),
            "-".to_owned(),
        ),
        (None, Some(t)) => match parse::<SelfEnrol>(body).await {
            Err(e) => (e.into_response(), "-".to_owned(), "-".to_owned()),
            Ok(req) => {
                let id = crate::util::clip(&req.id).into_owned();
                match hub.fleet.self_enrol(&req, &t, &peer).await {
                    Ok((enrolled, via)) => {
                        proven();
                        (
                            (StatusCode::CREATED, Json(enrolled)).into_response(),
                            via,
                            id,
                        )
                    }
                    Err((e, via)) => (ApiError::from(e).into_response(), via, id),
                }
            }
        },
    };
    // A token unknown, spent, expired or revoked is a failed authentication.
    let failed = matches!(
        resp.status(),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
    );
    let resp = match failed
        .then(|| hub.access.failed(AuthRoute::Enrol, ip))
        .flatten()
    {
        Some(wait) => ApiError::throttled(wait).into_response(),
        None => resp,
    };
    let line = Audited {
        token: &via,
        peer: &peer,
        action: "POST /v1/enrol",
        target: &id,
        outcome: &super::error::outcome(&resp),
    };
    if super::error::is_refusal(resp.status()) {
        hub.access.refused(line).await;
    } else {
        hub.access.audit(line).await;
    }
    resp
}

/// The caller of an admin request, as the gate put it in the request.
pub(super) type CallerOf = Extension<Caller>;

/// The address of a request's peer, when it came over TCP.
pub(super) fn peer_ip(peer: Option<&Extension<crate::serve::Peer>>) -> Option<IpAddr> {
    peer.map(|p| p.0 .0.ip())
}

/// `result` of checking a token on one of the hub's own routes (not the admin gate's):
/// a refusal (401) is counted, answered 429 past its source's burst, and kept in the
/// audit log as `action` on `target`.
pub(super) async fn checked<S: Store, T>(
    hub: &Hub<S>,
    route: AuthRoute,
    peer: Option<IpAddr>,
    (action, target): (&str, &str),
    result: ApiResult<T>,
) -> ApiResult<T> {
    let err = match result {
        Ok(t) => return Ok(t),
        Err(e) if e.status() != StatusCode::UNAUTHORIZED => return Err(e),
        Err(e) => e,
    };
    let err = match hub.access.failed(route, peer) {
        Some(wait) => ApiError::throttled(wait),
        None => err,
    };
    hub.access
        .refused(Audited {
            token: "-",
            peer: &peer.map_or_else(|| "-".to_owned(), |ip| ip.to_string()),
            action,
            target,
            outcome: &err.outcome(),
        })
        .await;
    Err(err)
}
