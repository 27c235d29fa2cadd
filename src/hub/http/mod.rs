//! The hub's HTTP API (hub protocol v1, docs/hub.md): the agents' reconcile, output upload
//! and release download, and the admin routes under `/v1/admin` (admin token). One file
//! per resource ([`agents`], [`jobs`], [`releases`], [`rollouts`]); what they share is below them
//! ([`error`], [`extract`], [`state`]), so no handler reaches back up into the router.
//! Errors are `{"error": "..."}` with a fitting status, for every route and for routes and
//! methods that do not exist.

mod agents;
mod error;
mod extract;
mod jobs;
mod releases;
mod rollouts;
mod state;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

pub(crate) use self::error::ApiError;
use self::extract::bearer;
pub(crate) use self::releases::SIGNATURE_HEADER;
pub(crate) use self::state::Hub;
use crate::build_info;
use crate::hub::store::Store;
use crate::hub::token;
use crate::hub::unproven::proven;

pub(crate) fn router<S: Store>(hub: Arc<Hub<S>>) -> Router {
    let admin = Router::new()
        .route("/agents", post(agents::enrol::<S>).get(agents::list::<S>))
        .route("/agents/{id}", get(agents::show::<S>))
        .route("/agents/{id}/revoke", post(agents::revoke::<S>))
        .route("/agents/{id}/labels", post(agents::labels::<S>))
        .route("/drain", post(agents::drain::<S>))
        .route("/resume", post(agents::resume::<S>))
        .route(
            "/desired/fleet",
            get(agents::fleet_desired::<S>).put(agents::set_fleet::<S>),
        )
        .route(
            "/desired/agents/{id}",
            get(agents::agent_desired::<S>).put(agents::set_agent::<S>),
        )
        .route("/jobs", post(jobs::submit::<S>).get(jobs::list::<S>))
        .route("/groups", post(jobs::submit_group::<S>))
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
        .route(
            "/rollouts",
            post(rollouts::start::<S>).get(rollouts::list::<S>),
        )
        .route("/rollouts/{id}", get(rollouts::show::<S>))
        .route("/rollouts/{id}/pause", post(rollouts::pause::<S>))
        .route("/rollouts/{id}/resume", post(rollouts::resume::<S>))
        .route("/rollouts/{id}/abort", post(rollouts::abort::<S>))
        .layer(axum::middleware::from_fn_with_state(
            hub.clone(),
            admin_only::<S>,
        ));
    Router::new()
        .route("/v1/health", get(health::<S>))
        .route("/v1/agents/{id}/reconcile", post(agents::reconcile::<S>))
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

async fn admin_only<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    req: Request,
    next: Next,
) -> Response {
    match bearer(req.headers()) {
        Ok(t) if token::matches(t, &hub.admin_sha256) => {
            proven();
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
