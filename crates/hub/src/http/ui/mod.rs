//! The dashboard, `https://HUB/ui/`: read-only pages of the fleet, its jobs (a job's
//! output live), releases and rollouts, rendered on the hub (docs/hub.md, "Dashboard").
//!
//! Nothing of the fleet is shown without a session: a token with `agents:read` or
//! `jobs:read` is traded at `/ui/login` for a session cookie (`HttpOnly; Secure;
//! SameSite=Strict`, 8 hours, ended by `/ui/logout`, which wants the session's CSRF
//! value). Each page needs the scope its data needs, and a token's job selector holds
//! here as in the API. Every answer carries a strict Content-Security-Policy (no inline
//! script, no style or script from anywhere but the hub) and is not cached.

mod pages;

use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;

use super::error::ApiError;
use super::extract::ApiPath;
use super::session::{self, Session, COOKIE, LIFETIME};
use super::state::Hub;
use crate::access::{Audited, Caller};
use crate::metrics::AuthRoute;
use crate::proto::access::{AGENTS_READ, JOBS_READ};
use crate::proto::job::Stream;
use crate::store::{JobFilter, Store};

/// The login form's CSRF cookie, and how long a login form may be sent after it was
/// loaded.
const LOGIN_COOKIE: &str = "railgrid_login";
const LOGIN_FORM_LIFETIME: std::time::Duration = std::time::Duration::from_secs(3600);

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
/// What a page of jobs lists.
const LISTED_JOBS: usize = 100;
/// The most of a stream one output request returns.
const OUTPUT_SLICE: usize = 64 * 1024;

pub(super) fn router<S: Store>() -> Router<Arc<Hub<S>>> {
    Router::new()
        .route("/ui", get(|| async { see_other("/ui/") }))
        .route("/ui/", get(fleet::<S>))
        .route("/ui/jobs", get(jobs::<S>))
        .route("/ui/jobs/{id}", get(job::<S>))
        .route("/ui/jobs/{id}/output/{stream}", get(output::<S>))
        .route("/ui/releases", get(releases::<S>))
        .route("/ui/rollouts", get(rollouts::<S>))
        .route("/ui/rollouts/{id}", get(rollout::<S>))
        .route("/ui/login", get(login_page).post(login::<S>))
        .route("/ui/logout", post(logout::<S>))
        .route("/ui/assets/style.css", get(style))
        .route("/ui/assets/app.js", get(script))
        .layer(axum::middleware::from_fn(headers))
}

/// The headers of every dashboard answer.
async fn headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: under it a browser sends `Origin: null` with the login form, and
    // the hub could no longer tell its own form from another site's.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn see_other(to: &'static str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
}

fn html(status: StatusCode, page: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        page,
    )
        .into_response()
}

/// The session a request carries, with its caller (the token it logged in with, still
/// good); a redirect to the login page otherwise.
async fn session<S: Store>(
    hub: &Hub<S>,
    headers: &HeaderMap,
) -> Result<(Session, Caller), Response> {
    let id = headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|c| session::cookie(c, COOKIE))
        .ok_or_else(|| see_other("/ui/login"))?;
    let s = hub.sessions.get(id).ok_or_else(|| see_other("/ui/login"))?;
    // A token revoked or rotated away since ends its sessions.
    let Some(caller) = hub.access.who_sha256(&s.token_sha256).await else {
        hub.sessions.close(id);
        return Err(see_other("/ui/login"));
    };
    crate::unproven::proven();
    Ok((s, caller))
}

/// A page for a session whose caller has `scope`.
async fn page<S: Store, F, Fut>(
    hub: &Hub<S>,
    headers: &HeaderMap,
    scope: &str,
    title: &str,
    here: &str,
    refresh: bool,
    body: F,
) -> Response
where
    F: FnOnce(Caller) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let (s, caller) = match session(hub, headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if !caller.may(scope) {
        let why = format!(
            "token {:?} lacks the scope {scope} this page needs",
            caller.name()
        );
        return html(
            StatusCode::FORBIDDEN,
            pages::layout(title, here, &s.csrf, false, &pages::forbidden(&why)),
        );
    }
    match body(caller).await {
        Ok(b) => html(
            StatusCode::OK,
            pages::layout(title, here, &s.csrf, refresh, &b),
        ),
        Err(e) => html(
            StatusCode::NOT_FOUND,
            pages::layout(title, here, &s.csrf, false, &pages::forbidden(&e)),
        ),
    }
}

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

async fn fleet<S: Store>(State(hub): State<Arc<Hub<S>>>, headers: HeaderMap) -> Response {
    let h = hub.clone();
    page(
        &hub,
        &headers,
        AGENTS_READ,
        "Fleet",
        "Fleet",
        false,
        |caller| async move {
            h.fleet.adopt_reports().await.map_err(text)?;
            let mut all = h.fleet.list();
            if let Some(sel) = caller.selection() {
                all.retain(|a| sel.matches(&a.hub_labels));
            }
            Ok(pages::fleet(&all))
        },
    )
    .await
}

async fn jobs<S: Store>(State(hub): State<Arc<Hub<S>>>, headers: HeaderMap) -> Response {
    let h = hub.clone();
    page(
        &hub,
        &headers,
        JOBS_READ,
        "Jobs",
        "Jobs",
        false,
        |caller| async move {
            let mut all = h
                .fleet
                .jobs(JobFilter::default(), None, LISTED_JOBS)
                .await
                .map_err(text)?;
            if let Some(sel) = caller.selection() {
                all.retain(|j| h.fleet.job_in_scope(j, sel));
            }
            Ok(pages::jobs(&all))
        },
    )
    .await
}

async fn job<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
) -> Response {
    let h = hub.clone();
    page(
        &hub,
        &headers,
        JOBS_READ,
        &id.clone(),
        "Jobs",
        false,
        |caller| async move {
            let j = h
                .fleet
                .job_for(&id, caller.selection())
                .await
                .map_err(text)?;
            Ok(pages::job(&j))
        },
    )
    .await
}

#[derive(Deserialize)]
struct Offset {
    #[serde(default)]
    offset: u64,
}

/// Raw bytes of a stream from `offset`, for the job page's script.
async fn output<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath((id, stream)): ApiPath<(String, String)>,
    Query(q): Query<Offset>,
    headers: HeaderMap,
) -> Response {
    let (_, caller) = match session(&hub, &headers).await {
        Ok(x) => x,
        // The script is told, not redirected.
        Err(_) => return StatusCode::UNAUTHORIZED.into_response(),
    };
    if !caller.may(JOBS_READ) {
        return StatusCode::FORBIDDEN.into_response();
    }
    let Some(stream) = Stream::parse(&stream) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if hub.fleet.job_for(&id, caller.selection()).await.is_err() {
        return StatusCode::NOT_FOUND.into_response();
    }
    match hub
        .fleet
        .job_output(&id, stream, q.offset, OUTPUT_SLICE)
        .await
    {
        Ok(slice) => (
            [
                (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_owned()),
                (
                    header::HeaderName::from_static("x-next-offset"),
                    slice.next.to_string(),
                ),
                (
                    header::HeaderName::from_static("x-complete"),
                    slice.complete.to_string(),
                ),
            ],
            slice.bytes,
        )
            .into_response(),
        Err(_) => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn releases<S: Store>(State(hub): State<Arc<Hub<S>>>, headers: HeaderMap) -> Response {
    let h = hub.clone();
    page(
        &hub,
        &headers,
        AGENTS_READ,
        "Releases",
        "Releases",
        false,
        |_| async move { Ok(pages::releases(&h.fleet.releases())) },
    )
    .await
}

async fn rollouts<S: Store>(State(hub): State<Arc<Hub<S>>>, headers: HeaderMap) -> Response {
    let h = hub.clone();
    page(
        &hub,
        &headers,
        AGENTS_READ,
        "Rollouts",
        "Rollouts",
        false,
        |_| async move { Ok(pages::rollouts(&h.fleet.rollouts().await.map_err(text)?)) },
    )
    .await
}

async fn rollout<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
) -> Response {
    let h = hub.clone();
    // While it goes on, the page reloads itself.
    let going = hub
        .fleet
        .rollout(&id)
        .await
        .is_ok_and(|r| !crate::proto::rollout::is_final(&r.state));
    page(
        &hub,
        &headers,
        AGENTS_READ,
        &format!("Rollout {id}"),
        "Rollouts",
        going,
        |_| async move { Ok(pages::rollout(&h.fleet.rollout(&id).await.map_err(text)?)) },
    )
    .await
}

async fn login_page() -> Response {
    login_form(StatusCode::OK, None)
}

/// The login form with a new CSRF value, in the form and in a cookie of its own
/// (`SameSite=Strict`, for the login route only): a login must come from this very form,
/// never from another site's (which can set neither).
fn login_form(status: StatusCode, error: Option<&str>) -> Response {
    let Ok(csrf) = crate::token::new_session_id() else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let mut resp = html(status, pages::login(error, &csrf));
    let cookie = format!(
        "{LOGIN_COOKIE}={csrf}; Path=/ui/login; HttpOnly; Secure; SameSite=Strict; Max-Age={}",
        LOGIN_FORM_LIFETIME.as_secs()
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

/// Why a login POST is not this hub's own form's, if it is not: an `Origin` other than
/// the hub's, or a CSRF value that is not the login cookie's.
fn cross_site(headers: &HeaderMap, csrf: &str) -> Option<&'static str> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if let Some(origin) = headers.get(header::ORIGIN) {
        let same = origin
            .to_str()
            .ok()
            .zip(host)
            .is_some_and(|(o, h)| o.strip_prefix("https://") == Some(h));
        if !same {
            return Some("the login form was sent from another site");
        }
    }
    let cookie = headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|c| session::cookie(c, LOGIN_COOKIE));
    let matches = cookie.is_some_and(|c| {
        !csrf.is_empty() && crate::token::sha256_hex(c) == crate::token::sha256_hex(csrf)
    });
    (!matches).then_some("the login form's CSRF value does not match: load the login page again")
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
    #[serde(default)]
    csrf: String,
}

fn peer(req_peer: Option<axum::Extension<crate::serve::Peer>>) -> String {
    req_peer.map_or_else(|| "-".to_owned(), |p| p.0 .0.ip().to_string())
}

async fn login<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    p: Option<axum::Extension<crate::serve::Peer>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let ip = p.as_ref().map(|p| p.0 .0.ip());
    let peer = peer(p);
    let token = form.token.trim();
    let refused = cross_site(&headers, &form.csrf);
    // No token is looked at for a form that is not this hub's.
    let caller = match refused {
        Some(_) => None,
        None => hub.access.who(token).await,
    };
    let (resp, name, outcome) = match (refused, caller) {
        (Some(why), _) => (
            login_form(StatusCode::FORBIDDEN, Some(why)),
            "-".to_owned(),
            format!("403 {why}"),
        ),
        (None, None) => (
            login_form(StatusCode::UNAUTHORIZED, Some("not a token of this hub")),
            "-".to_owned(),
            "401 not a token of this hub".to_owned(),
        ),
        (None, Some(c)) if !c.may(AGENTS_READ) && !c.may(JOBS_READ) => {
            let why = format!("token {:?} has neither agents:read nor jobs:read", c.name());
            (
                login_form(StatusCode::FORBIDDEN, Some(&why)),
                c.name().to_owned(),
                format!("403 {why}"),
            )
        }
        (None, Some(c)) => match hub.sessions.open(crate::token::sha256_hex(token)) {
            None => (
                StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                c.name().to_owned(),
                "500 no session".to_owned(),
            ),
            Some((id, _)) => {
                crate::unproven::proven();
                let cookie = format!(
                    "{COOKIE}={id}; Path=/ui; HttpOnly; Secure; SameSite=Strict; Max-Age={}",
                    LIFETIME.as_secs()
                );
                let mut resp = see_other("/ui/");
                if let Ok(v) = HeaderValue::from_str(&cookie) {
                    resp.headers_mut().insert(header::SET_COOKIE, v);
                }
                // The login form's value is spent.
                resp.headers_mut().append(
                    header::SET_COOKIE,
                    HeaderValue::from_static(
                        "railgrid_login=; Path=/ui/login; HttpOnly; Secure; SameSite=Strict; Max-Age=0",
                    ),
                );
                (resp, c.name().to_owned(), "303 session opened".to_owned())
            }
        },
    };
    // Every refused login is a failed authentication, throttled per source.
    let refusal = super::error::is_refusal(resp.status());
    let throttled = refusal
        .then(|| hub.access.failed(AuthRoute::Login, ip))
        .flatten();
    let (resp, outcome) = match throttled {
        Some(wait) => {
            let err = ApiError::throttled(wait);
            let mut resp = login_form(StatusCode::TOO_MANY_REQUESTS, Some(err.message()));
            if let Ok(v) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
            (resp, err.outcome())
        }
        None => (resp, outcome),
    };
    let line = Audited {
        token: &name,
        peer: &peer,
        action: "POST /ui/login",
        target: "-",
        outcome: &outcome,
    };
    if refusal {
        hub.access.refused(line).await;
    } else {
        hub.access.audit(line).await;
    }
    resp
}

#[derive(Deserialize)]
struct LogoutForm {
    #[serde(default)]
    csrf: String,
}

async fn logout<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    p: Option<axum::Extension<crate::serve::Peer>>,
    headers: HeaderMap,
    Form(form): Form<LogoutForm>,
) -> Response {
    let peer = peer(p);
    let id = headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|c| session::cookie(c, COOKIE))
        .map(str::to_owned);
    let Some((id, s)) = id.and_then(|id| hub.sessions.get(&id).map(|s| (id, s))) else {
        return see_other("/ui/login");
    };
    // Only the page's own form knows the value: another site's form cannot log out.
    let same = crate::token::sha256_hex(&form.csrf) == crate::token::sha256_hex(&s.csrf);
    let name = hub
        .access
        .who_sha256(&s.token_sha256)
        .await
        .map_or_else(|| "-".to_owned(), |c| c.name().to_owned());
    let (resp, outcome) = if same {
        hub.sessions.close(&id);
        let mut resp = see_other("/ui/login");
        resp.headers_mut().insert(
            header::SET_COOKIE,
            HeaderValue::from_static(
                "railgrid_session=; Path=/ui; HttpOnly; Secure; SameSite=Strict; Max-Age=0",
            ),
        );
        (resp, "303 session ended")
    } else {
        (
            (
                StatusCode::FORBIDDEN,
                "the logout form's CSRF value does not match\n",
            )
                .into_response(),
            "403 CSRF value does not match",
        )
    };
    let line = Audited {
        token: &name,
        peer: &peer,
        action: "POST /ui/logout",
        target: "-",
        outcome,
    };
    if same {
        hub.access.audit(line).await;
    } else {
        hub.access.refused(line).await;
    }
    resp
}

async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("style.css"),
    )
        .into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("app.js"),
    )
        .into_response()
}
