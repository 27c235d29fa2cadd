//! The dashboard in a real headless Chromium against a real hub over TLS: a token traded
//! for a session cookie the page's scripts cannot read, the fleet, a job whose output grows
//! on its page while it runs, a hostile command shown as text, a rollout and its members,
//! logout, and a revoked token ending its session.

use std::fs;
use std::process::Command;

use super::replicas::sim_reconcile;
use super::routing::{running, start_member, submit, wait_job, wait_ready};
use super::webdriver::Browser;
use crate::fixtures::*;

/// Where the screenshots go: `target/dashboard/` (docs/images/ holds one of them).
fn shots() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard");
    fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

/// `curl` of a dashboard page with `cookie`: the status and where it sends the browser.
fn page_with_cookie(hub: &TestHub, path: &str, cookie: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "--max-time", "10", "--cacert"])
        .arg(hub.ca())
        .args(["-H", &format!("Cookie: {cookie}")])
        .args(["-w", "%{http_code} %{redirect_url}"])
        .arg(format!("{}{path}", hub.url))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (code, to) = text.split_once(' ').unwrap_or((&text, ""));
    (code.parse().unwrap_or(0), to.to_owned())
}

#[test]
fn an_operator_follows_the_fleet_a_live_job_and_a_rollout_in_a_real_browser() {
    let dir = tempdir();
    let (key, hub) = signed_hub(dir.path());
    hub.admin_ok(&["desired", "set", "--fleet", "--max-jobs", "1"]);
    let _member = start_member(&hub, "d1", "build");

    // A simulated agent in a rollout of its own (a real one would upgrade for real).
    let sim_token = read_lossy(&hub.enrol("s1")).trim().to_owned();
    sim_reconcile(&hub, ("s1", &sim_token), 0, "1.0.0", None, "2.0.0");
    hub.admin_ok(&["agent", "label", "s1", "sim=yes"]);
    let artifact = dir.path().join("artifact");
    fs::write(&artifact, b"not run: s1 is simulated").expect("artifact");
    release(&hub, &key, dir.path(), "2.0.0", &artifact);
    let said = hub.admin_ok(&[
        "rollout",
        "start",
        "--version",
        "2.0.0",
        "--select",
        "sim=yes",
        "--waves",
        "1",
    ]);
    let rollout = said
        .strip_prefix("rollout ")
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("no rollout id in {said:?}"))
        .to_owned();
    wait_ready(&hub, &["d1"]);
    let viewer = dir.path().join("viewer.token");
    hub.create_token("viewer", "agents:read,jobs:read", &[], &viewer);
    let viewer = read_lossy(&viewer).trim().to_owned();

    // Not logged in: the login page. A wrong token is refused there, and sets nothing.
    let browser = Browser::start(dir.path());
    browser.go(&format!("{}/ui/", hub.url));
    wait_for(LIMIT, "the login page", || {
        browser.url().ends_with("/ui/login").then_some(())
    });
    browser.type_into("#token", "rg_not-a-token");
    browser.click("#login");
    let error = browser.wait_text("#error", "the login refused", |t| !t.is_empty());
    assert!(error.contains("not a token of this hub"), "{error}");
    let is_session = |c: &serde_json::Value| c["name"] == "railgrid_session";
    assert!(
        !browser.cookies().iter().any(is_session),
        "{:?}",
        browser.cookies()
    );

    // Logged in: the fleet, under a cookie scripts cannot read.
    browser.type_into("#token", &viewer);
    browser.click("#login");
    browser.wait_text("#agents", "two agents on the fleet page", |t| t == "2");
    assert!(browser.has("tr[data-agent=d1]") && browser.has("tr[data-agent=s1]"));
    let fleet = browser.text("#fleet");
    assert!(
        fleet.contains("sim=yes") && fleet.contains("queue=build"),
        "{fleet}"
    );
    let cookies = browser.cookies();
    assert_eq!(cookies.len(), 1, "{cookies:?}");
    let c = &cookies[0];
    assert_eq!(c["name"], "railgrid_session", "{c}");
    assert_eq!(
        (&c["httpOnly"], &c["secure"]),
        (&true.into(), &true.into()),
        "{c}"
    );
    assert_eq!(c["sameSite"], "Strict", "{c}");
    assert_eq!(browser.script("return document.cookie"), "", "HttpOnly");
    let session = format!("railgrid_session={}", c["value"].as_str().expect("value"));
    browser.screenshot(&shots().join("fleet.png"));

    // A job's output grows on its page while it runs; the state follows when it ends.
    let marks = hub.marks();
    let script = format!(
        "echo first-line; while [ ! -e {m}/go-live ]; do sleep 0.05; done; echo second-line",
        m = marks.display()
    );
    let out = submit(
        &hub,
        &["--agent", "d1", "--id", "live", "--", "sh", "-c", &script],
    );
    succeeded(&out);
    wait_job(&hub, "live", "running", running);
    browser.go(&format!("{}/ui/jobs/live", hub.url));
    let shown = browser.wait_text("#stdout", "the first line", |t| t.contains("first-line"));
    assert!(!shown.contains("second-line"), "{shown}");
    assert!(browser.text("#state").contains("running"));
    fs::write(marks.join("go-live"), "").expect("gate");
    browser.wait_text("#stdout", "the second line, live", |t| {
        t.contains("first-line\nsecond-line")
    });
    browser.wait_text("#state", "the job succeeded", |t| t.contains("succeeded"));
    browser.screenshot(&shots().join("job.png"));

    // A hostile command is text on every page, never markup.
    let hostile = "<img src=x id=pwned onerror=\"document.title='pwned'\">";
    let out = submit(
        &hub,
        &["--agent", "d1", "--id", "hostile", "--", "echo", hostile],
    );
    succeeded(&out);
    wait_job(&hub, "hostile", "done", |v| v["done"] == true);
    for page in ["/ui/jobs", "/ui/jobs/hostile"] {
        browser.go(&format!("{}{page}", hub.url));
        let body = browser.wait_text("main", "the hostile command shown", |t| {
            t.contains("id=pwned")
        });
        assert!(!browser.has("#pwned"), "{page}: {body}");
        assert_ne!(browser.script("return document.title"), "pwned", "{page}");
    }

    // The rollout and its member.
    browser.go(&format!("{}/ui/rollouts", hub.url));
    let list = browser.text("#rollouts");
    assert!(list.contains(&rollout) && list.contains("2.0.0"), "{list}");
    browser.click(&format!("a[href='/ui/rollouts/{rollout}']"));
    browser.wait_text("tr[data-member=s1]", "s1 in the rollout", |t| {
        t.contains("s1") && t.contains("1.0.0")
    });
    let state = browser.text("#rollout-state");
    assert!(!state.is_empty(), "{state}");
    browser.go(&format!("{}/ui/releases", hub.url));
    assert!(browser.text("#releases").contains("2.0.0"));
    browser.go(&format!("{}/ui/rollouts/{rollout}", hub.url));
    browser.screenshot(&shots().join("rollout.png"));

    // Logout ends the session: the cookie is gone and its old value opens nothing.
    browser.click("#logout");
    wait_for(LIMIT, "the login page after logout", || {
        browser.url().ends_with("/ui/login").then_some(())
    });
    let is_session = |c: &serde_json::Value| c["name"] == "railgrid_session";
    assert!(
        !browser.cookies().iter().any(is_session),
        "{:?}",
        browser.cookies()
    );
    let (code, to) = page_with_cookie(&hub, "/ui/", &session);
    assert_eq!(code, 303, "{to}");
    assert!(to.ends_with("/ui/login"), "{to}");

    // A token revoked ends the sessions it opened, at their next page.
    browser.type_into("#token", &viewer);
    browser.click("#login");
    browser.wait_text("#agents", "the fleet again", |t| t == "2");
    hub.admin_ok(&["token", "revoke", "viewer"]);
    browser.go(&format!("{}/ui/jobs", hub.url));
    wait_for(LIMIT, "the login page after revocation", || {
        browser.url().ends_with("/ui/login").then_some(())
    });

    // Every login, logout and refusal is in the audit log, with no token in it.
    let audit = hub.admin_ok(&["audit", "list"]);
    assert!(audit.contains("viewer"), "{audit}");
    assert!(!audit.contains(&viewer), "a token in the audit log");
    assert!(!hub.log().contains(&viewer), "a token in the hub's log");
}

const LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A login POST with `headers`: the status and the session cookie set.
fn post_login(hub: &TestHub, headers: &[String], body: &str) -> (u16, Option<String>) {
    let (code, text) = hub.curl_head("POST", "/ui/login", headers, Some(body));
    let session = text
        .lines()
        .filter_map(|l| l.strip_prefix("set-cookie: railgrid_session="))
        .find_map(|c| c.split(';').next().map(|v| format!("railgrid_session={v}")));
    (code, session)
}

/// The login form's CSRF cookie and value, as a browser gets them.
fn login_form(hub: &TestHub) -> (String, String) {
    let (_, text) = hub.curl_head("GET", "/ui/login", &[], None);
    let cookie = text
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .expect("a login cookie")
        .to_owned();
    let value = text
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .expect("a csrf field")
        .to_owned();
    (cookie, value)
}

#[test]
fn a_login_comes_from_the_hubs_own_form_and_one_token_never_ends_anothers_sessions() {
    let dir = tempdir();
    let hub = TestHub::start(&dir.path().join("hub"), &[]);
    let viewer = dir.path().join("viewer.token");
    hub.create_token("viewer", "agents:read", &[], &viewer);
    let viewer = read_lossy(&viewer).trim().to_owned();
    let host = hub.url.trim_start_matches("https://").to_owned();
    let login = |token: &str, origin: &str| {
        let (cookie, csrf) = login_form(&hub);
        let headers = [format!("Origin: {origin}"), format!("Cookie: {cookie}")];
        post_login(&hub, &headers, &format!("token={token}&csrf={csrf}"))
    };

    // Another site's form: refused whatever it carries, and no session.
    assert_eq!(login(&viewer, "https://evil.example"), (403, None));
    let (code, session) = post_login(
        &hub,
        &[format!("Origin: https://{host}")],
        &format!("token={viewer}"),
    );
    assert_eq!((code, session), (403, None), "no CSRF value");
    let (code, session) = post_login(
        &hub,
        &[format!("Cookie: {}", login_form(&hub).0)],
        &format!("token={viewer}&csrf=guessed"),
    );
    assert_eq!((code, session), (403, None), "another CSRF value");

    // The hub's own form: a session. The root's survives any number of the viewer's.
    let (code, root) = login(&hub.admin_token(), &format!("https://{host}"));
    assert_eq!(code, 303);
    let root = root.expect("the root's session");
    let mut viewers = Vec::new();
    for _ in 0..40 {
        let (code, s) = login(&viewer, &format!("https://{host}"));
        assert_eq!(code, 303);
        viewers.push(s.expect("a viewer's session"));
    }
    assert_eq!(page_with_cookie(&hub, "/ui/", &root).0, 200);
    assert_eq!(page_with_cookie(&hub, "/ui/", &viewers[39]).0, 200);
    assert_eq!(
        page_with_cookie(&hub, "/ui/", &viewers[0]).0,
        303,
        "the viewer's oldest session ended"
    );
}
