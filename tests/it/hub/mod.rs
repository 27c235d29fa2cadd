//! The reference hub on its own: enrolment, desired state, long polls, restarts,
//! revocation and its bounds, over real TLS on 127.0.0.1 (curl as the client).

mod connection;
mod secrets;

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::fixtures::*;

fn token(path: &std::path::Path) -> String {
    read_lossy(path).trim().to_owned()
}

/// A reconcile held in a curl of its own, its answer read as it comes (an answer past a
/// pipe's size would otherwise hold curl); killed when dropped.
struct HeldPoll(Child, Option<std::thread::JoinHandle<String>>);

impl HeldPoll {
    fn start(hub: &TestHub, id: &str, token: &str, generation: u64, wait: u64) -> HeldPoll {
        Self::report(hub, id, token, &report(generation), wait)
    }

    /// A poll with `report` as its body.
    fn report(hub: &TestHub, id: &str, token: &str, report: &str, wait: u64) -> HeldPoll {
        let mut child = Command::new("curl")
            .args(["-sS", "--max-time", "60", "--cacert"])
            .arg(hub.ca())
            .args(["-w", "\n%{http_code}", "-H"])
            .arg(format!("Authorization: Bearer {token}"))
            .args(["-H", "Content-Type: application/json", "--data-binary"])
            .arg(report)
            .arg(format!("{}/v1/agents/{id}/reconcile?wait={wait}", hub.url))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("curl");
        let mut stdout = child.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || {
            let mut out = String::new();
            let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
            out
        });
        HeldPoll(child, Some(reader))
    }

    fn done(&mut self) -> bool {
        self.0.try_wait().expect("try_wait").is_some()
    }

    /// Waits for the answer: (status, body).
    fn answer(mut self, limit: Duration) -> (u16, String) {
        wait_for(limit, "the held poll's answer", || {
            self.done().then_some(())
        });
        let out = self
            .1
            .take()
            .expect("read once")
            .join()
            .expect("the reader");
        let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }
}

impl Drop for HeldPoll {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// The polls the hub holds now, as its health check says.
fn held(hub: &TestHub) -> u64 {
    let (_, body) = hub.curl("GET", "/v1/health", None, None);
    json(&body)["polls_held"].as_u64().expect("polls_held")
}

fn connected(hub: &TestHub, id: &str) -> bool {
    hub.admin_json(&["agent", "show", id])["connected"] == true
}

#[test]
fn an_enrolled_agent_is_listed_and_sent_its_merged_desired_state() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let web = token(&hub.enrol("web-1"));
    assert!(web.starts_with("rga_"), "{web}");
    // The hub keeps only the hash: the token is nowhere in its data dir.
    for entry in std::fs::read_dir(&hub.dir).expect("data dir") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            let bytes = std::fs::read(&path).expect("read");
            assert!(
                !String::from_utf8_lossy(&bytes).contains(&web),
                "the agent token is stored in {}",
                path.display()
            );
        }
    }
    let mode = std::fs::metadata(hub.dir.join("admin.token"))
        .expect("admin.token")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // A new agent is behind from the start: answered at once, even when asking to wait.
    let started = Instant::now();
    let (code, body) = hub.curl(
        "POST",
        "/v1/agents/web-1/reconcile?wait=30",
        Some(&web),
        Some(&report(0)),
    );
    assert_eq!(code, 200, "{body}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let first = json(&body);
    assert!(first["generation"].as_u64().expect("generation") >= 1);
    assert_eq!(first["runner"]["enabled"], true);

    hub.admin_ok(&[
        "desired",
        "set",
        "--fleet",
        "--max-jobs",
        "4",
        "--version",
        "9.9.9",
    ]);
    hub.set_desired("web-1", &["--runner-enabled", "false", "--max-jobs", "2"]);
    let g = first["generation"].as_u64().expect("generation");
    let (code, body) = hub.reconcile("web-1", &web, g);
    assert_eq!(code, 200, "{body}");
    let d = json(&body);
    assert!(d["generation"].as_u64().expect("generation") > g);
    assert_eq!(d["runner"]["enabled"], false);
    assert_eq!(d["runner"]["max_jobs"], 2, "the agent's own setting wins");
    assert_eq!(
        d["agent"]["version"], "9.9.9",
        "the fleet's setting fills in"
    );

    // Clearing the agent's own setting falls back to the fleet's.
    hub.set_desired("web-1", &["--clear", "max_jobs"]);
    let shown = hub.admin_json(&["desired", "show", "--agent", "web-1"]);
    assert_eq!(shown["effective"]["runner"]["max_jobs"], 4);

    let list = hub.admin_json(&["agent", "list"]);
    let a = &list.as_array().expect("array")[0];
    assert_eq!(a["id"], "web-1");
    assert_eq!(a["report"]["version"], "0.0.0-test");
    assert_eq!(a["report"]["os"], "linux");
    assert!(a["last_seen"].as_u64().is_some());
    assert_eq!(a["observed_generation"], g);
    let text = hub.admin_ok(&["agent", "list"]);
    assert!(
        text.contains("web-1") && text.contains("linux/x86_64"),
        "{text}"
    );
}

#[test]
fn a_change_wakes_the_held_polls_it_concerns_and_no_others() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let (a, b) = (token(&hub.enrol("a")), token(&hub.enrol("b")));
    let gen_of = |id: &str, t: &str| {
        let (code, body) = hub.curl(
            "POST",
            &format!("/v1/agents/{id}/reconcile"),
            Some(t),
            Some(&report(0)),
        );
        assert_eq!(code, 200, "{body}");
        json(&body)["generation"].as_u64().expect("generation")
    };
    let (ga, gb) = (gen_of("a", &a), gen_of("b", &b));

    let pa = HeldPoll::start(&hub, "a", &a, ga, 30);
    let mut pb = HeldPoll::start(&hub, "b", &b, gb, 30);
    wait_for(Duration::from_secs(10), "both polls held", || {
        (connected(&hub, "a") && connected(&hub, "b")).then_some(())
    });

    let changed = Instant::now();
    hub.set_desired("a", &["--max-jobs", "3"]);
    let (code, body) = pa.answer(Duration::from_secs(10));
    let took = changed.elapsed();
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["runner"]["max_jobs"], 3);
    println!("agent change reached the held poll in {took:?}");
    // b's poll is still held: a change to a is not b's business.
    assert!(!pb.done(), "b's poll was answered by a change to a");
    assert!(connected(&hub, "b"));

    hub.admin_ok(&["desired", "set", "--fleet", "--runner-enabled", "false"]);
    let (code, body) = pb.answer(Duration::from_secs(10));
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["runner"]["enabled"], false);
    // Answered, not gone: an agent's next poll follows at once, and `connected` does not
    // flicker to "no" in between (it did after every change or job for the agent).
    assert!(connected(&hub, "b"), "connected flickered after an answer");
    wait_for(Duration::from_secs(30), "b no longer connected", || {
        (!connected(&hub, "b")).then_some(())
    });
}

/// A report that echoes the jobs' version `v` of the answer it took.
fn echoing(generation: u64, v: &serde_json::Value) -> String {
    let mut r = json(&report(generation));
    r["jobs_version"] = v.clone();
    r.to_string()
}

#[test]
fn a_job_wakes_its_agents_held_poll_and_leaves_its_generation() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let (a, b) = (token(&hub.enrol("a")), token(&hub.enrol("b")));
    let first = |id: &str, t: &str| {
        let (code, body) = hub.reconcile(id, t, 0);
        assert_eq!(code, 200, "{body}");
        json(&body)
    };
    let (da, db) = (first("a", &a), first("b", &b));
    let g = |d: &serde_json::Value| d["generation"].as_u64().expect("generation");
    let (ga, gb) = (g(&da), g(&db));
    let v1 = da["jobs_version"].clone();
    assert!(v1.is_u64(), "an answer names its jobs' version: {da}");

    let pa = HeldPoll::report(&hub, "a", &a, &echoing(ga, &v1), 30);
    // An agent older than the version echoes none: woken all the same.
    let pb = HeldPoll::start(&hub, "b", &b, gb, 30);
    wait_for(Duration::from_secs(10), "both polls held", || {
        (held(&hub) == 2).then_some(())
    });
    hub.admin_ok(&["job", "submit", "--agent", "a", "--id", "j1", "--", "true"]);
    let (code, body) = pa.answer(Duration::from_secs(10));
    assert_eq!(code, 200, "{body}");
    let d = json(&body);
    assert_eq!(d["jobs"][0]["id"], "j1", "{d}");
    assert!(d["jobs"][0]["spec"].is_object(), "{d}");
    assert_eq!(g(&d), ga, "a job is not a setting: the generation stays");
    let v2 = d["jobs_version"].clone();
    assert_ne!(v2, v1, "{d}");

    // Taken (echoed), the answer holds, though the job is not reported yet; b's too.
    let mut pa = HeldPoll::report(&hub, "a", &a, &echoing(ga, &v2), 30);
    wait_for(Duration::from_secs(10), "a's poll held again", || {
        (held(&hub) == 2).then_some(())
    });
    assert!(!pa.done(), "a poll that took its jobs was answered again");
    // The answer lost on its way (the old version echoed): at once, the job in it.
    let (code, body) =
        HeldPoll::report(&hub, "a", &a, &echoing(ga, &v1), 30).answer(Duration::from_secs(10));
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["jobs"][0]["id"], "j1", "{body}");
    // An echo past what this (single) hub ever gave, as after a restore: at once too,
    // with the hub's own version, which the agent then echoes.
    let ahead = serde_json::json!(v2.as_u64().expect("version") + 1000);
    let (code, body) =
        HeldPoll::report(&hub, "a", &a, &echoing(ga, &ahead), 30).answer(Duration::from_secs(10));
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["jobs_version"], v2, "{body}");

    hub.admin_ok(&["job", "submit", "--agent", "b", "--id", "j2", "--", "true"]);
    let (code, body) = pb.answer(Duration::from_secs(10));
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["jobs"][0]["id"], "j2", "{body}");
    assert_eq!(g(&json(&body)), gb);
    // A job no answer carried yet: an agent that echoes nothing is answered at once.
    hub.admin_ok(&["job", "submit", "--agent", "b", "--id", "j3", "--", "true"]);
    let (code, body) = HeldPoll::start(&hub, "b", &b, gb, 30).answer(Duration::from_secs(10));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"j3\""), "{body}");

    // A cancel is news too, and still no setting.
    hub.admin_ok(&["job", "cancel", "j1"]);
    let (code, body) = pa.answer(Duration::from_secs(10));
    assert_eq!(code, 200, "{body}");
    let d = json(&body);
    assert_eq!(d["cancel_jobs"][0], "j1", "{d}");
    assert_eq!(g(&d), ga);
    let shown = hub.admin_json(&["desired", "show", "--agent", "a"]);
    assert_eq!(shown["effective"]["generation"], ga, "{shown}");
}

#[test]
fn a_poll_with_nothing_new_is_held_for_its_wait_then_answered_unchanged() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &["--max-wait", "1s"]);
    let t = token(&hub.enrol("idle"));
    let (_, body) = hub.reconcile("idle", &t, 0);
    let g = json(&body)["generation"].as_u64().expect("generation");
    // Asks for an hour; the hub's --max-wait caps it.
    let p = HeldPoll::start(&hub, "idle", &t, g, 3600);
    let (code, body) = p.answer(Duration::from_secs(20));
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["generation"], g);
}

#[test]
fn a_restarted_hub_keeps_its_agents_tokens_desired_state_and_ca() {
    let tmp = tempdir();
    let dir = tmp.path().join("hub");
    let hub = TestHub::start(&dir, &[]);
    let t = token(&hub.enrol("keep"));
    hub.set_desired("keep", &["--max-jobs", "5"]);
    let (code, body) = hub.reconcile("keep", &t, 0);
    assert_eq!(code, 200, "{body}");
    let before = json(&body);
    let ca_before = read_lossy(&hub.ca());
    let listen = hub.listen.clone();
    let out = hub.stop();
    assert!(out.status.success(), "hub exit: {:?}", out.status);

    let hub = TestHub::start_on(&dir, &listen, &[]);
    assert_eq!(read_lossy(&hub.ca()), ca_before, "the CA changed");
    // The same token, over a new server certificate from the same CA.
    let (code, body) = hub.reconcile("keep", &t, 0);
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body), before);
    let shown = hub.admin_json(&["agent", "show", "keep"]);
    assert_eq!(
        shown["report"]["hostname"], "test",
        "the last report was kept"
    );
}

#[test]
fn an_agent_ahead_of_a_restored_hub_is_told_to_take_the_hubs_own_state() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let t = token(&hub.enrol("ahead"));
    // As if the hub's database were restored from a backup older than what the agent
    // applied: the agent reports generation 500.
    let (code, body) = hub.curl(
        "POST",
        "/v1/agents/ahead/reconcile?wait=30",
        Some(&t),
        Some(&report(500)),
    );
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("observed_generation") && body.contains("report 0"),
        "{body}"
    );
    // Reported 0, as the agent then does: the hub's own state, at once.
    let (code, body) = hub.reconcile("ahead", &t, 0);
    assert_eq!(code, 200, "{body}");
    let g = json(&body)["generation"].as_u64().expect("generation");
    assert!(g > 0 && g < 500, "the hub's own generation: {body}");
    assert!(hub.log().contains("never handed out"), "logged");
}

#[test]
fn a_revoked_token_is_refused_and_its_held_poll_answered_at_once() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let t = token(&hub.enrol("gone"));
    let (_, body) = hub.reconcile("gone", &t, 0);
    let g = json(&body)["generation"].as_u64().expect("generation");
    let p = HeldPoll::start(&hub, "gone", &t, g, 30);
    wait_for(Duration::from_secs(10), "the poll held", || {
        connected(&hub, "gone").then_some(())
    });
    hub.admin_ok(&["agent", "revoke", "gone"]);
    let (code, body) = p.answer(Duration::from_secs(10));
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("revoked"), "{body}");
    let (code, _) = hub.reconcile("gone", &t, g);
    assert_eq!(code, 401);
    assert_eq!(hub.admin_json(&["agent", "show", "gone"])["revoked"], true);

    // Its id given again only when asked: a new token; the old one stays refused.
    let out = hub.admin(&["agent", "add", "gone"]);
    exited_saying(&out, 1, "--reuse-revoked-id");
    let fresh = token(&hub.enrol_again("gone"));
    assert_ne!(fresh, t);
    let (code, _) = hub.reconcile("gone", &t, g);
    assert_eq!(code, 401);
    let (code, body) = hub.reconcile("gone", &fresh, g);
    assert_eq!(code, 200, "{body}");
}

#[test]
fn bad_requests_get_an_error_that_says_what_is_wrong() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let t = token(&hub.enrol("x"));
    let reconcile = "/v1/agents/x/reconcile";
    let cases: Vec<(Option<&str>, String, u16, &str)> = vec![
        (None, report(0), 401, "Authorization"),
        (Some("rga_wrong"), report(0), 401, "not valid"),
        (
            Some(&t),
            r#"{"observed_generation": 1}"#.into(),
            400,
            "`version`",
        ),
        (Some(&t), "not json".into(), 400, "invalid request body"),
        (
            Some(&t),
            r#"{"version": "1", "observed_generation": "one"}"#.into(),
            400,
            "invalid type",
        ),
        // Unknown fields are ignored.
        (
            Some(&t),
            r#"{"version": "1", "observed_generation": 0, "from_the_future": [1]}"#.into(),
            200,
            "generation",
        ),
        (Some(&t), "x".repeat(1100 * 1024), 413, "larger than"),
        (Some(&t), report(1 << 60), 400, "observed_generation"),
    ];
    for (tok, body, want, needle) in cases {
        let (code, text) = hub.curl("POST", reconcile, tok, Some(&body));
        assert_eq!(code, want, "{text}");
        assert!(text.contains(needle), "{needle:?} not in {text}");
        if want != 200 {
            assert!(json(&text)["error"].is_string(), "{text}");
        }
    }
    let (code, text) = hub.curl(
        "POST",
        &format!("{reconcile}?wait=soon"),
        Some(&t),
        Some(&report(0)),
    );
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("wait"), "{text}");
    let (code, text) = hub.curl("GET", "/v1/nothing", None, None);
    assert_eq!(
        (code, json(&text)["error"].is_string()),
        (404, true),
        "{text}"
    );
    let (code, text) = hub.curl("DELETE", "/v1/health", None, None);
    assert_eq!(
        (code, json(&text)["error"].is_string()),
        (405, true),
        "{text}"
    );
    // An agent's token opens nothing of the admin API.
    let (code, _) = hub.curl("GET", "/v1/admin/agents", Some(&t), None);
    assert_eq!(code, 401);
    let (code, text) = hub.curl("GET", "/v1/admin/agents", Some(&hub.admin_token()), None);
    assert_eq!(code, 200, "{text}");

    // Admin commands refuse bad settings with the field named.
    for (args, needle) in [
        (
            vec!["desired", "set", "--fleet", "--max-jobs", "0"],
            "max_jobs",
        ),
        (
            vec!["desired", "set", "--fleet", "--version", "1.0/../x"],
            "version",
        ),
        (
            vec!["desired", "set", "--fleet", "--clear", "colour"],
            "colour",
        ),
        (
            vec![
                "desired",
                "set",
                "--agent",
                "nobody-here",
                "--max-jobs",
                "1",
            ],
            "unknown agent",
        ),
        (vec!["agent", "add", "../etc"], "invalid agent id"),
        (vec!["agent", "add", "x"], "already enrolled"),
    ] {
        let out = hub.admin(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(needle), "{args:?}: {needle:?} not in {err}");
    }
    let out = hub.admin(&["desired", "set", "--fleet"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "nothing to set is a usage error"
    );
}

#[test]
fn past_its_connection_cap_the_hub_answers_503_with_retry_after() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &["--max-connections", "1"]);
    let t = token(&hub.enrol("busy"));
    // The first agent of a new hub is enrolled at generation 1: a poll reporting it is
    // held. It may itself meet the cap while the enrolment's connection is closing, so it
    // is started again until it holds the one connection.
    let mut held = HeldPoll::start(&hub, "busy", &t, 1, 30);
    let out = wait_for(Duration::from_secs(10), "a 503", || {
        if held.done() {
            held = HeldPoll::start(&hub, "busy", &t, 1, 30);
            return None;
        }
        let out = Command::new("curl")
            .args(["-sS", "-i", "--max-time", "10", "--cacert"])
            .arg(hub.ca())
            .arg(format!("{}/v1/health", hub.url))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.starts_with("HTTP/1.1 503").then_some(text)
    });
    assert!(out.to_ascii_lowercase().contains("retry-after: 5"), "{out}");
    assert!(out.contains("connection limit"), "{out}");
}

#[test]
fn under_a_low_open_files_limit_the_hub_serves_fewer_connections_blaming_no_flag_it_was_not_given()
{
    let tmp = tempdir();
    let data = tmp.path().join("hub");
    let mut cmd = Command::new("prlimit");
    cmd.args(["--nofile=1024:1024", "--", env!("CARGO_BIN_EXE_railgrid")])
        .args([
            "hub",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tls-self-signed",
        ])
        .arg("--data-dir")
        .arg(&data);
    let mut hub = Guard::spawn_piped(&mut cmd, "hub serve under prlimit");
    wait_for(Duration::from_secs(20), "hub.json", || {
        data.join("hub.json").exists().then_some(())
    });
    hub.signal(nix::sys::signal::Signal::SIGTERM);
    let log = text(&hub.wait_output(Duration::from_secs(20)).stderr);
    assert!(log.contains("as the open-files limit allows"), "{log}");
    assert!(!log.contains("--max-connections"), "{log}");
}

#[test]
fn a_second_hub_on_the_same_data_dir_is_refused() {
    let tmp = tempdir();
    let dir = tmp.path().join("hub");
    let _hub = TestHub::start(&dir, &[]);
    let out = railgrid()
        .args(["hub", "serve", "--data-dir"])
        .arg(&dir)
        .args(["--listen", "127.0.0.1:0", "--tls-self-signed"])
        .output()
        .expect("second hub");
    exited_saying(&out, 2, "another hub is serving");
}

#[test]
fn admin_commands_reach_a_hub_from_elsewhere_with_its_url_token_and_ca() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    hub.enrol("far");
    let elsewhere = tmp.path().join("laptop");
    std::fs::create_dir(&elsewhere).expect("dir");
    let tok = elsewhere.join("admin.token");
    std::fs::copy(hub.dir.join("admin.token"), &tok).expect("copy token");
    let ca = elsewhere.join("hub-ca.pem");
    std::fs::copy(hub.ca(), &ca).expect("copy ca");
    let run = |extra: &[&str]| {
        railgrid()
            .args(["hub", "--hub", &hub.url, "--token-file"])
            .arg(&tok)
            .args(extra)
            .args(["agent", "list", "--json"])
            .output()
            .expect("remote admin")
    };
    std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let out = run(&["--ca-file", ca.to_str().expect("utf-8")]);
    succeeded(&out);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(list[0]["id"], "far");

    // Without the hub's CA, its certificate is not trusted.
    let out = run(&[]);
    exited_saying(&out, 1, "could not reach the hub");

    // A token file others can read is refused before anything is sent.
    std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = run(&["--ca-file", ca.to_str().expect("utf-8")]);
    exited_saying(&out, 2, "chmod 600");
}

#[test]
fn a_hub_serves_the_certificate_files_it_is_given() {
    let tmp = tempdir();
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("params");
    let cert = params.self_signed(&key).expect("cert");
    let (cert_file, key_file) = (tmp.path().join("hub.pem"), tmp.path().join("hub.key"));
    std::fs::write(&cert_file, cert.pem()).expect("write cert");
    std::fs::write(&key_file, key.serialize_pem()).expect("write key");
    let dir = tmp.path().join("hub");
    let child = railgrid()
        .args(["hub", "serve", "--data-dir"])
        .arg(&dir)
        .args(["--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&cert_file)
        .arg("--tls-key")
        .arg(&key_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("hub");
    let _guard = Guard::new(child);
    let url = wait_for(Duration::from_secs(20), "hub.json", || {
        let v: serde_json::Value = serde_json::from_str(&read_lossy(&dir.join("hub.json"))).ok()?;
        v["url"].as_str().map(str::to_owned)
    });
    assert!(!dir.join("ca.pem").exists(), "no CA of its own was made");
    let (code, body) = curl(&url, &cert_file, "GET", "/v1/health", None, None);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"agents\":0"), "{body}");
}

#[test]
fn an_agent_cannot_push_the_fleets_generations_out_of_range() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let t = token(&hub.enrol("push"));
    // Each just inside what a restore could once explain (newest + 2^32 - 1): accepted,
    // each moved the fleet's one counter by 2^32, and 2^21 of them ended every agent's
    // desired states.
    for _ in 0..20 {
        let (code, body) = hub.reconcile("push", &t, 0);
        assert_eq!(code, 200, "{body}");
        let newest = json(&body)["generation"].as_u64().expect("generation");
        for observed in [newest + (1u64 << 32) - 1, 1u64 << 53, u64::MAX] {
            let (code, body) = hub.reconcile("push", &t, observed);
            assert_eq!(code, 400, "{observed}: {body}");
            assert!(body.contains("observed_generation"), "{body}");
        }
    }
    let lines = hub.log().matches("never handed out").count();
    assert_eq!(lines, 1, "one line a minute per agent, not one per report");
    let fleet = hub.admin_json(&["desired", "show", "--fleet"]);
    let shown = hub.admin_json(&["desired", "set", "--fleet", "--max-jobs", "2"]);
    assert!(
        shown["generation"].as_u64().expect("generation") < 100,
        "the counter moved: {fleet} then {shown}"
    );
}

#[test]
fn a_change_that_changes_nothing_keeps_the_generation() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let first = hub.admin_json(&["desired", "set", "--fleet", "--max-jobs", "3"]);
    let again = hub.admin_json(&["desired", "set", "--fleet", "--max-jobs", "3"]);
    assert_eq!(first["generation"], again["generation"]);
    // A setting the hub does not know is an error, not nothing.
    let (code, body) = hub.curl(
        "PUT",
        "/v1/admin/desired/fleet",
        Some(&hub.admin_token()),
        Some(r#"{"set": {"colour": 1}}"#),
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("colour"), "{body}");
    let (code, body) = hub.curl(
        "PUT",
        "/v1/admin/desired/fleet",
        Some(&hub.admin_token()),
        Some("{}"),
    );
    assert_eq!(code, 400, "{body}");
    let after = hub.admin_json(&["desired", "show", "--fleet"]);
    assert_eq!(after["generation"], first["generation"]);
}

#[test]
fn what_agents_report_is_bounded_and_printed_safely() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let t = token(&hub.enrol("loud"));
    let body = serde_json::json!({
        "version": "\u{1b}]0;pwned\u{7}1.0",
        "observed_generation": 0,
        "os": "li\nnux",
        "hostname": "x".repeat(200_000),
        "runner": {"state": "running\u{1b}[2J", "last_error": "a\r\nfake-agent  yes"}
    })
    .to_string();
    let (code, text) = hub.curl("POST", "/v1/agents/loud/reconcile", Some(&t), Some(&body));
    assert_eq!(code, 200, "{text}");
    for args in [vec!["agent", "list"], vec!["agent", "show", "loud"]] {
        let out = hub.admin_ok(&args);
        assert!(!out.contains('\u{1b}') && !out.contains('\r'), "{out:?}");
        assert!(!out.contains("li\nnux"), "{out:?}");
    }
    let shown = hub.admin_json(&["agent", "show", "loud"]);
    let kept = shown["report"]["hostname"].as_str().expect("hostname");
    assert!(
        kept.len() < 1024,
        "kept {} bytes of a host name",
        kept.len()
    );
}

#[test]
fn admin_command_mistakes_are_usage_errors_and_leave_nothing_half_done() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    // An existing token file: refused before the agent is enrolled.
    let existing = tmp.path().join("taken.token");
    std::fs::write(&existing, "someone else's\n").expect("write");
    let out = hub.admin(&[
        "agent",
        "add",
        "late",
        "--token-out",
        existing.to_str().expect("utf-8"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(read_lossy(&existing), "someone else's\n");
    let out = hub.admin(&["agent", "show", "late"]);
    assert!(!out.status.success(), "the agent was enrolled anyway");
    let fresh = tmp.path().join("late.token");
    hub.admin_ok(&[
        "agent",
        "add",
        "late",
        "--token-out",
        fresh.to_str().expect("utf-8"),
    ]);

    let tok = hub.dir.join("admin.token");
    for (args, needle) in [
        (
            vec![
                "--hub",
                "http://127.0.0.1:1",
                "--token-file",
                tok.to_str().expect("utf-8"),
                "agent",
                "list",
            ],
            "https://",
        ),
        (
            vec![
                "--hub",
                &hub.url,
                "--data-dir",
                hub.dir.to_str().expect("utf-8"),
                "agent",
                "list",
            ],
            "not both",
        ),
    ] {
        let out = railgrid().arg("hub").args(&args).output().expect("run");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
    let out = hub.admin(&["desired", "set", "--fleet", "--max-jobs", "0"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a refused setting is a usage error"
    );
    // A stopped hub: the data dir's hub.json is named.
    let dir = hub.dir.clone();
    hub.stop();
    let out = railgrid()
        .args(["hub", "--data-dir"])
        .arg(&dir)
        .args(["agent", "list"])
        .output()
        .expect("run");
    exited_saying(&out, 1, "still running?");
}

#[test]
fn release_uploads_a_killed_hub_left_are_swept_at_its_next_start() {
    let tmp = tempdir();
    let dir = tmp.path().join("hub");
    let hub = TestHub::start(&dir, &[]);
    let releases = dir.join("releases");
    std::fs::create_dir_all(&releases).expect("releases");
    let left = [
        releases.join(".upload-00ff00ff00ff00ff"),
        releases.join(".abc.tmp.12.0"),
    ];
    let kept = releases.join("0".repeat(64));
    for p in left.iter().chain([&kept]) {
        std::fs::write(p, b"partial").expect("write");
    }
    let mut hub = hub;
    hub.guard.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = hub.guard.wait_output(std::time::Duration::from_secs(10));
    let _hub = TestHub::start(&dir, &[]);
    for p in &left {
        assert!(!p.exists(), "{} is left", p.display());
    }
    assert!(kept.exists(), "a stored binary is kept");
}
