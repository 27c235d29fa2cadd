//! The agents' routes: an agent's reconcile (its token), and the admin's enrolment, list,
//! show, revoke, labels and desired settings of the fleet and of each agent.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;

use super::access::{about, checked, peer_ip, CallerOf};
use super::error::{ApiError, ApiResult};
use super::extract::{bearer, parse, parse_capped, read_body, ApiPath, MAX_BODY_BYTES};
use super::state::Hub;
use crate::access::Caller;
use crate::fleet::{AgentEntry, Poll};
use crate::metrics::AuthRoute;
use crate::proto::hub::{
    DesiredChange, DrainRequest, EnrolRequest, Enrolled, LabelChange, SETTINGS,
};
use crate::proto::labels::Labels;
use crate::proto::report::AgentReport;
use crate::serve::Peer;
use crate::store::Store;
use crate::unproven::proven;

/// A report may carry up to a thousand jobs' states.
pub(super) const MAX_REPORT_BYTES: usize = 1024 * 1024;

#[derive(Deserialize)]
pub(super) struct ReconcileQuery {
    /// Seconds to hold the request when nothing has changed for the agent.
    #[serde(default)]
    wait: Option<u64>,
}

pub(super) async fn reconcile<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath(id): ApiPath<String>,
    peer: Option<axum::Extension<crate::serve::Peer>>,
    query: Result<Query<ReconcileQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    // The token before the body: an unauthenticated caller learns nothing from its body's
    // errors.
    let admitted = bearer(&headers)
        .map_err(|why| ApiError::new(StatusCode::UNAUTHORIZED, why))
        .and_then(|t| admit(&hub, &id, t));
    let action = ("POST /v1/agents/{id}/reconcile", id.as_str());
    let admitted = checked(
        &hub,
        AuthRoute::Agent,
        peer_ip(peer.as_ref()),
        action,
        admitted,
    )
    .await?;
    // Nothing of the request is kept while the poll is held: its headers hold on to the
    // connection's read buffer, which hyper would then have to allocate again to notice
    // the agent going away (docs/benchmarks.md, "Memory per held poll").
    drop(headers);
    proven();
    let q = super::extract::query(query)?;
    let report: AgentReport = parse_capped(body, MAX_REPORT_BYTES).await?;
    let peer = peer.map(|p| p.0);
    let mut poll = take(&hub, &admitted, peer, report).await?;
    hub.fleet.hold(&mut poll, held_for(&hub, q.wait)).await;
    let json = answer(&hub, admitted, poll, peer).await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        json,
    )
        .into_response())
}

/// An agent whose token a reconcile showed: what its answer is computed for.
pub(super) struct Admitted {
    entry: Arc<AgentEntry>,
    id: String,
    /// The SHA-256 of the token it showed.
    presented: String,
}

/// A reconcile of agent `id` with `token`, if that is its token.
pub(super) fn admit<S: Store>(hub: &Hub<S>, id: &str, token: &str) -> ApiResult<Admitted> {
    let presented = crate::token::sha256_hex(token);
    Ok(Admitted {
        entry: hub.fleet.authorize_sha256(id, &presented)?,
        id: id.to_owned(),
        presented,
    })
}

/// How long a reconcile that asks to wait `wait` seconds is held.
pub(super) fn held_for<S: Store>(hub: &Hub<S>, wait: Option<u64>) -> Duration {
    Duration::from_secs(wait.unwrap_or(0)).min(hub.max_wait)
}

/// An admitted agent's report taken: what its poll then waits on.
pub(super) async fn take<S: Store>(
    hub: &Hub<S>,
    a: &Admitted,
    peer: Option<Peer>,
    report: AgentReport,
) -> ApiResult<Poll> {
    // A rotation's two steps go to the audit log as they happen: a token taken (before
    // the poll is held), a token sent.
    if hub.fleet.is_next_token(&a.entry, &a.presented) {
        hub.fleet.promote_if_next(&a.entry, &a.presented).await?;
        rotation(
            hub,
            &a.id,
            peer,
            "the agent uses its new token: the old one is refused",
        )
        .await;
    }
    Ok(hub
        .fleet
        .take_report(&a.entry, &a.presented, report)
        .await?)
}

/// The answer to a poll taken (and held, or not): its JSON text.
pub(super) async fn answer<S: Store>(
    hub: &Hub<S>,
    a: Admitted,
    poll: Poll,
    peer: Option<Peer>,
) -> ApiResult<Bytes> {
    let (mut desired, fresh) = hub.fleet.answer(poll, &a.presented).await?;
    deliver_secrets(hub, &a.id, &mut desired, &fresh, peer).await?;
    if desired.new_token.is_some() {
        rotation(hub, &a.id, peer, "a new token sent to the agent").await;
    }
    hub.answers.json(&desired).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the answer could not be written: {e}"),
        )
    })
}

/// The bytes of secret values one answer carries, at most: with the specs' budget, far
/// under the 1 MiB an agent reads of an answer. Jobs past it wait for later answers.
const VALUE_BUDGET: usize = 320 * 1024;

/// Gives each job the answer carries the values of the secrets it names, unsealed now and
/// checked against the agent's hub labels now. A job offered for the first time (`fresh`)
/// whose secrets may not go fails at the hub, saying why; one an earlier answer (or
/// another replica) may have carried is never failed here, since its agent may have it:
/// it goes without the values, which its runner refuses unless it has the job already.
/// A job whose secrets must wait (the store did not answer, or the answer is full) is left
/// out of this answer (its agent's follower of it, if any, comes back with the next), its
/// offer withdrawn. The first offer of each job with secrets is a line in the audit log
/// (names only).
async fn deliver_secrets<S: Store>(
    hub: &Hub<S>,
    agent: &str,
    desired: &mut crate::proto::desired::DesiredState,
    fresh: &std::collections::HashSet<String>,
    peer: Option<Peer>,
) -> ApiResult<()> {
    use crate::secrets::Undelivered;
    let (mut failed, mut held) = (Vec::new(), Vec::new());
    let mut budget = VALUE_BUDGET;
    let mut labels = None;
    for job in &mut desired.jobs {
        let Some(spec) = &job.spec else { continue };
        let names: Vec<String> = crate::proto::secret::names(spec).cloned().collect();
        if names.is_empty() {
            continue;
        }
        let labels = match &labels {
            Some(l) => l,
            None => labels.insert(hub.fleet.hub_labels(agent)?),
        };
        let is_fresh = fresh.contains(&job.id);
        let values = match hub.secrets.unseal(&names, agent, labels).await {
            Ok(v) => v,
            Err(Undelivered::Refused(why)) if is_fresh => {
                failed.push((job.id.clone(), why));
                continue;
            }
            Err(Undelivered::Refused(why)) => {
                tracing::warn!(job = %job.id, agent, error = %why, "a job's secrets were held back from its agent, which may have the job already: sent without them");
                continue;
            }
            Err(Undelivered::Passing(why)) => {
                tracing::warn!(job = %job.id, agent, error = %why, "a job's secrets wait for a later answer");
                held.push(job.id.clone());
                continue;
            }
        };
        let size = serde_json::to_string(&values).map_or(usize::MAX, |t| t.len());
        if size > budget {
            match is_fresh && size > VALUE_BUDGET {
                true => failed.push((
                    job.id.clone(),
                    format!("its secrets take {size} bytes in an answer to its agent, more than the {VALUE_BUDGET} one answer carries"),
                )),
                false => held.push(job.id.clone()),
            }
            continue;
        }
        budget -= size;
        job.secret_values = values;
        if is_fresh {
            let peer = peer.map_or_else(|| "-".to_owned(), |p| p.0.ip().to_string());
            hub.access
                .audit(crate::access::Audited {
                    token: agent,
                    peer: &peer,
                    action: "secrets sent with a job",
                    target: &format!("{} to agent {agent}: {}", job.id, names.join(", ")),
                    outcome: "sent",
                })
                .await;
        }
    }
    desired
        .jobs
        .retain(|j| !held.contains(&j.id) && !failed.iter().any(|(id, _)| *id == j.id));
    held.retain(|id| fresh.contains(id));
    hub.fleet.withdraw(agent, &held);
    for (id, why) in failed {
        hub.fleet.fail_unsent(agent, &id, &why).await?;
    }
    Ok(())
}

async fn rotation<S: Store>(hub: &Hub<S>, id: &str, peer: Option<Peer>, outcome: &str) {
    let peer = peer.map_or_else(|| "-".to_owned(), |p| p.0.ip().to_string());
    hub.access
        .audit(crate::access::Audited {
            token: id,
            peer: &peer,
            action: "token rotation",
            target: id,
            outcome,
        })
        .await;
}

pub(super) async fn enrol<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    body: Body,
) -> ApiResult<Response> {
    let req: EnrolRequest = parse(body).await?;
    // A new agent has no hub labels yet.
    caller.reach(&req.id, &Labels::new())?;
    let token = hub.fleet.enrol(&req.id, req.reuse_revoked).await?;
    let id = req.id.clone();
    Ok(about(
        (StatusCode::CREATED, Json(Enrolled { id: req.id, token })).into_response(),
        id,
    ))
}

/// The agents the caller reaches, by id.
pub(super) async fn list<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
) -> ApiResult<Response> {
    hub.fleet.adopt_reports().await?;
    let mut all = hub.fleet.list();
    if let Some(sel) = caller.selection() {
        all.retain(|a| sel.matches(&a.hub_labels));
    }
    Ok(Json(all).into_response())
}

pub(super) async fn show<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    hub.fleet.adopt_reports().await?;
    hub.fleet.reach(&id, caller.selection())?;
    Ok(Json(hub.fleet.view_of(&id)?).into_response())
}

pub(super) async fn revoke<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    hub.fleet.reach(&id, caller.selection())?;
    Ok(Json(hub.fleet.revoke(&id).await?).into_response())
}

pub(super) async fn labels<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    ApiPath(id): ApiPath<String>,
    body: Body,
) -> ApiResult<Response> {
    let change: LabelChange = parse(body).await?;
    if let Some(sel) = caller.selection() {
        let before = hub.fleet.hub_labels(&id)?;
        let mut after = before.clone();
        for k in &change.remove {
            after.remove(k);
        }
        after.extend(change.set.iter().map(|(k, v)| (k.clone(), v.clone())));
        hub.secrets
            .labels_allowed(&id, &before, &after, Some((caller.name(), sel)))
            .await?;
    }
    let view = hub
        .fleet
        .change_labels(&id, &change.set, &change.remove, caller.selection())
        .await?;
    Ok(Json(view).into_response())
}

pub(super) async fn drain<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    body: Body,
) -> ApiResult<Response> {
    drain_or_resume(&hub, &caller, body, false).await
}

pub(super) async fn resume<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    body: Body,
) -> ApiResult<Response> {
    drain_or_resume(&hub, &caller, body, true).await
}

async fn drain_or_resume<S: Store>(
    hub: &Hub<S>,
    caller: &Caller,
    body: Body,
    resume: bool,
) -> ApiResult<Response> {
    let req: DrainRequest = parse(body).await?;
    let target = drained(&req);
    let reach = caller.selection();
    let views = if resume {
        hub.fleet.resume(&req, reach).await?
    } else {
        hub.fleet.drain(&req, reach).await?
    };
    Ok(about(Json(views).into_response(), target))
}

/// The agents a drain or resume names, for the audit log.
fn drained(req: &DrainRequest) -> String {
    match (&req.agent, &req.selector) {
        (Some(a), _) => a.clone(),
        (None, Some(s)) => s.clone(),
        (None, None) => "-".into(),
    }
}

pub(super) async fn fleet_desired<S: Store>(State(hub): State<Arc<Hub<S>>>) -> ApiResult<Response> {
    Ok(Json(hub.fleet.desired_view(None)?).into_response())
}

pub(super) async fn set_fleet<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    body: Body,
) -> ApiResult<Response> {
    let change = parse_change(body).await?;
    may_set_network(&caller, &change)?;
    Ok(Json(hub.fleet.change(None, &change).await?).into_response())
}

pub(super) async fn agent_desired<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    hub.fleet.reach(&id, caller.selection())?;
    Ok(Json(hub.fleet.desired_view(Some(&id))?).into_response())
}

pub(super) async fn set_agent<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    Extension(caller): CallerOf,
    ApiPath(id): ApiPath<String>,
    body: Body,
) -> ApiResult<Response> {
    let change = parse_change(body).await?;
    hub.fleet.reach(&id, caller.selection())?;
    may_set_network(&caller, &change)?;
    Ok(Json(hub.fleet.change(Some(&id), &change).await?).into_response())
}
/// A network policy set to anything but `none`, or cleared (which lets the host's own
/// `runner.network` apply), may widen what jobs reach: it takes `jobs:network`, as a
/// job's own widening does (docs/security.md, "Egress").
fn may_set_network(caller: &crate::access::Caller, change: &DesiredChange) -> ApiResult<()> {
    let sets_wider = change
        .set
        .network
        .as_ref()
        .is_some_and(|n| *n != crate::proto::job::Network::None);
    let clears = change.clear.iter().any(|c| c == "network");
    if sets_wider || clears {
        caller.may_widen_network()?;
    }
    Ok(())
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
    let unknown = v
        .get("set")
        .and_then(|s| s.as_object())
        .and_then(|o| o.keys().find(|k| !SETTINGS.contains(&k.as_str())).cloned())
        .or_else(|| {
            v.as_object()?
                .keys()
                .find(|k| !["set", "clear"].contains(&k.as_str()))
                .cloned()
        });
    match unknown {
        Some(k) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{k:?}: not a desired setting ({})", SETTINGS.join(", ")),
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
