//! The scope each admin route needs: one table, so that a route added without one is
//! the root token's alone (refused to every scoped token), never open to all of them.

use axum::http::Method;

use crate::proto::access::{
    AGENTS_READ, AGENTS_WRITE, AUDIT_READ, JOBS_CANCEL, JOBS_READ, JOBS_SUBMIT, RELEASES_WRITE,
    ROLLOUTS_WRITE, ROOT, SECRETS_WRITE, TOKENS_WRITE,
};

/// (method, route under `/v1/admin`, scope).
const ROUTES: &[(Method, &str, &str)] = &[
    (Method::GET, "/agents", AGENTS_READ),
    (Method::POST, "/agents", AGENTS_WRITE),
    (Method::GET, "/agents/{id}", AGENTS_READ),
    (Method::POST, "/agents/{id}/revoke", AGENTS_WRITE),
    (Method::POST, "/agents/{id}/labels", AGENTS_WRITE),
    (Method::POST, "/agents/rotate", AGENTS_WRITE),
    (Method::POST, "/drain", AGENTS_WRITE),
    (Method::POST, "/resume", AGENTS_WRITE),
    (Method::GET, "/desired/fleet", AGENTS_READ),
    (Method::PUT, "/desired/fleet", AGENTS_WRITE),
    (Method::GET, "/desired/agents/{id}", AGENTS_READ),
    (Method::PUT, "/desired/agents/{id}", AGENTS_WRITE),
    (Method::POST, "/jobs", JOBS_SUBMIT),
    (Method::GET, "/jobs", JOBS_READ),
    (Method::POST, "/groups", JOBS_SUBMIT),
    (Method::GET, "/jobs/{id}", JOBS_READ),
    (Method::GET, "/jobs/{id}/wait", JOBS_READ),
    (Method::POST, "/jobs/{id}/cancel", JOBS_CANCEL),
    (Method::GET, "/jobs/{id}/output/{stream}", JOBS_READ),
    (Method::GET, "/releases", AGENTS_READ),
    (
        Method::PUT,
        "/releases/{version}/{platform}",
        RELEASES_WRITE,
    ),
    (Method::POST, "/releases/{version}/resume", RELEASES_WRITE),
    (Method::POST, "/rollouts", ROLLOUTS_WRITE),
    (Method::GET, "/rollouts", AGENTS_READ),
    (Method::GET, "/rollouts/{id}", AGENTS_READ),
    (Method::POST, "/rollouts/{id}/pause", ROLLOUTS_WRITE),
    (Method::POST, "/rollouts/{id}/resume", ROLLOUTS_WRITE),
    (Method::POST, "/rollouts/{id}/abort", ROLLOUTS_WRITE),
    (Method::GET, "/tokens", TOKENS_WRITE),
    (Method::POST, "/tokens", TOKENS_WRITE),
    (Method::POST, "/tokens/{name}/revoke", TOKENS_WRITE),
    (Method::POST, "/tokens/rotate-root", ROOT),
    (Method::GET, "/enrol-tokens", TOKENS_WRITE),
    (Method::POST, "/enrol-tokens", TOKENS_WRITE),
    (Method::POST, "/enrol-tokens/{id}/revoke", TOKENS_WRITE),
    (Method::GET, "/audit", AUDIT_READ),
    (Method::GET, "/secrets", SECRETS_WRITE),
    (Method::PUT, "/secrets/{name}", SECRETS_WRITE),
    (Method::DELETE, "/secrets/{name}", SECRETS_WRITE),
    (Method::POST, "/secrets/rotate-key", SECRETS_WRITE),
];

/// The admin routes that act on the whole fleet: a token with a selection may not use
/// them, whatever its scopes (docs/security.md, "Rights never grow by delegation").
const FLEET_WIDE: &[(Method, &str)] = &[
    (Method::PUT, "/desired/fleet"),
    (Method::PUT, "/releases/{version}/{platform}"),
    (Method::POST, "/releases/{version}/resume"),
    (Method::POST, "/rollouts"),
    (Method::POST, "/rollouts/{id}/pause"),
    (Method::POST, "/rollouts/{id}/resume"),
    (Method::POST, "/rollouts/{id}/abort"),
    (Method::POST, "/secrets/rotate-key"),
];

/// Whether `method` on the admin route `route` acts on the whole fleet.
pub fn is_fleet_wide(method: &Method, route: &str) -> bool {
    let route = route.strip_prefix("/v1/admin").unwrap_or(route);
    FLEET_WIDE.iter().any(|(m, r)| m == method && *r == route)
}

/// The scope `method` on the admin route `route` (its pattern, as the router matched
/// it, with or without the `/v1/admin` prefix) needs; [`ROOT`] for one not listed.
pub fn scope_of(method: &Method, route: &str) -> &'static str {
    let route = route.strip_prefix("/v1/admin").unwrap_or(route);
    ROUTES
        .iter()
        .find(|(m, r, _)| m == method && *r == route)
        .map_or(ROOT, |(_, _, s)| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_has_its_scope_and_an_unlisted_one_is_the_roots() {
        assert_eq!(scope_of(&Method::GET, "/v1/admin/agents"), AGENTS_READ);
        assert_eq!(scope_of(&Method::POST, "/v1/admin/jobs"), JOBS_SUBMIT);
        assert_eq!(scope_of(&Method::POST, "/jobs/{id}/cancel"), JOBS_CANCEL);
        assert_eq!(scope_of(&Method::DELETE, "/v1/admin/agents"), ROOT);
        assert_eq!(scope_of(&Method::GET, "/v1/admin/nothing"), ROOT);
        let mut seen = std::collections::HashSet::new();
        for (m, r, _) in ROUTES {
            assert!(seen.insert((m.clone(), *r)), "{m} {r} listed twice");
        }
        for (m, r) in FLEET_WIDE {
            assert!(seen.contains(&(m.clone(), *r)), "{m} {r} is not a route");
        }
        assert!(is_fleet_wide(&Method::PUT, "/v1/admin/desired/fleet"));
        assert!(!is_fleet_wide(
            &Method::PUT,
            "/v1/admin/desired/agents/{id}"
        ));
    }
}
