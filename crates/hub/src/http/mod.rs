//! The hub's HTTP API (hub protocol v1, docs/hub.md): the agents' reconcile, output upload
//! and release download, and the admin routes under `/v1/admin` (admin token). One file
//! per resource ([`agents`], [`jobs`], [`releases`], [`rollouts`]); what they share is below them
//! ([`error`], [`extract`], [`state`]), so no handler reaches back up into the router.
//! Errors are `{"error": "..."}` with a fitting status, for every route and for routes and
//! methods that do not exist.

mod access;
mod agents;
mod conn;
mod error;
mod extract;
mod jobs;
mod metrics;
mod releases;
mod rendered;
mod rollouts;
mod secrets;
mod session;
mod state;
mod ui;

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

pub(crate) use self::conn::Conns;
pub(crate) use self::error::ApiError;
use self::extract::bearer;
pub(crate) use self::metrics::plain as metrics_router;
pub(crate) use self::state::Hub;
use crate::access::{is_fleet_wide, scope_of, Audited, Caller};
use crate::build_info;
use crate::metrics::AuthRoute;
use crate::store::Store;
use crate::unproven::proven;

/// Where the admin routes are.
const ADMIN_PREFIX: &str = "/v1/admin";

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
        .route(
            "/tokens",
            post(access::create_token::<S>).get(access::tokens::<S>),
        )
        .route("/tokens/rotate-root", post(access::rotate_root::<S>))
        .route("/tokens/{name}/revoke", post(access::revoke_token::<S>))
        .route(
            "/enrol-tokens",
            post(access::create_enrol_token::<S>).get(access::enrol_tokens::<S>),
        )
        .route(
            "/enrol-tokens/{id}/revoke",
            post(access::revoke_enrol_token::<S>),
        )
        .route("/agents/rotate", post(access::rotate_agents::<S>))
        .route("/audit", get(access::audit::<S>))
        .route("/secrets", get(secrets::list::<S>))
        .route("/secrets/rotate-key", post(secrets::rotate_key::<S>))
        .route(
            "/secrets/{name}",
            axum::routing::put(secrets::set::<S>).delete(secrets::remove::<S>),
        )
        // A route layer: the gate sees the route it matched (for its scope), and a path
        // matching none is a 404 without a token's check.
        .route_layer(axum::middleware::from_fn_with_state(hub.clone(), gate::<S>));
    Router::new()
        .route("/v1/health", get(health::<S>))
        .route("/metrics", get(metrics::scrape::<S>))
        .route("/v1/agents/{id}/reconcile", post(agents::reconcile::<S>))
        .route("/v1/enrol", post(access::enrol::<S>))
        .route(
            "/v1/jobs/{id}/output/{stream}",
            axum::routing::put(jobs::upload::<S>),
        )
        .route(
            "/v1/releases/{version}/{platform}",
            get(releases::download::<S>),
        )
        .nest(ADMIN_PREFIX, admin)
        .merge(ui::router::<S>())
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .with_state(hub)
}

/// Every admin request: the caller known by its token, its scope checked against the
/// route's, and the request written to the audit log when it changes something or is
/// refused.
async fn gate<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    matched: Option<MatchedPath>,
    req: Request,
    next: Next,
) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let route = matched.map_or_else(|| path.clone(), |m| m.as_str().to_owned());
    let peer_ip = req
        .extensions()
        .get::<crate::serve::Peer>()
        .map(|p| p.0.ip());
    let scope = scope_of(&method, &route);
    let caller = match bearer(req.headers()) {
        Ok(t) => hub.access.who(t).await.ok_or(
            "not a token of this hub (the root token is in the hub's data dir, admin.token)",
        ),
        Err(why) => Err(why),
    };
    let resp = match &caller {
        Err(why) => match hub.access.failed(AuthRoute::Admin, peer_ip) {
            Some(wait) => ApiError::throttled(wait),
            None => ApiError::new(
                StatusCode::UNAUTHORIZED,
                format!("{why} (the admin token is in the hub's data dir, admin.token)"),
            ),
        }
        .into_response(),
        Ok(c) => match refusal(c, scope, &method, &route) {
            Some(e) => e.into_response(),
            None => {
                proven();
                let mut req = req;
                req.extensions_mut().insert(c.clone());
                next.run(req).await
            }
        },
    };
    let refused = error::is_refusal(resp.status());
    if method != Method::GET || refused {
        let target = resp
            .extensions()
            .get::<access::Target>()
            .map(|t| t.0.clone())
            .unwrap_or_else(|| path_values(&route, &path));
        let line = Audited {
            token: caller.as_ref().map_or("-", |c| c.name()),
            peer: &peer_ip.map_or_else(|| "-".to_owned(), |ip| ip.to_string()),
            action: &format!("{method} {route}"),
            target: &target,
            outcome: &error::outcome(&resp),
        };
        if refused {
            hub.access.refused(line).await;
        } else {
            hub.access.audit(line).await;
        }
    }
    resp
}

/// Why a known caller may not use `method` on `route`, if it may not: a scope it lacks,
/// or a selection on a route that acts on the whole fleet.
fn refusal(c: &Caller, scope: &str, method: &Method, route: &str) -> Option<ApiError> {
    if !c.may(scope) {
        return Some(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "token {:?} lacks the scope {scope} that {method} {route} needs",
                c.name()
            ),
        ));
    }
    if is_fleet_wide(method, route) {
        return c
            .fleet_wide(&format!("{method} {route}"))
            .err()
            .map(ApiError::from);
    }
    None
}

/// The values a path gives its route's `{…}` parts (`web-1` for `/agents/{id}/revoke`).
/// The router nested under `/v1/admin` matches the whole route but sees the path without
/// that prefix: the two are read from the same place on.
fn path_values(route: &str, path: &str) -> String {
    let route = match path.strip_prefix(ADMIN_PREFIX) {
        Some(_) => route,
        None => route.strip_prefix(ADMIN_PREFIX).unwrap_or(route),
    };
    let values: Vec<&str> = route
        .split('/')
        .zip(path.split('/'))
        .filter(|(r, _)| r.starts_with('{'))
        .map(|(_, p)| p)
        .collect();
    if values.is_empty() {
        "-".into()
    } else {
        values.join("/")
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

#[cfg(test)]
mod tests {
    use super::path_values;

    #[test]
    fn a_routes_values_are_read_from_the_path_seen_inside_or_outside_the_nest() {
        for path in ["/agents/web-1/revoke", "/v1/admin/agents/web-1/revoke"] {
            assert_eq!(path_values("/v1/admin/agents/{id}/revoke", path), "web-1");
        }
        assert_eq!(
            path_values(
                "/v1/admin/releases/{version}/{platform}",
                "/releases/1.2.3/linux-x86_64"
            ),
            "1.2.3/linux-x86_64"
        );
        assert_eq!(path_values("/v1/admin/agents", "/agents"), "-");
    }
}
