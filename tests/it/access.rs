//! Access, end to end: a real hub over TLS and real agents. Hosts that enrol themselves
//! with an enrolment token (and the ones it refuses), scoped admin tokens against every
//! route, the audit log, the root token's rotation, and agent token rotation with the
//! agent killed at each of its steps.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use super::routing::{start_member, wait_ready};
use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(30);

/// An agent of `host` that enrols (if it has no token yet) as `id` with `enrol`.
fn enrolling(hub: &TestHub, host: &Host, id: &str, enrol: &Path) -> std::process::Command {
    let (url, ca) = (hub.url.clone(), path_str(&hub.ca()));
    let mut cmd = host.agent_cmd(&[
        "--hub",
        &url,
        "--agent-id",
        id,
        "--enrol-token",
        &path_str(enrol),
        "--ca-file",
        &ca,
    ]);
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(host.path("agent.stderr"))
        .expect("agent stderr");
    cmd.stderr(log);
    cmd
}

/// Waits until `id` is enrolled, connected and serving.
fn connected(hub: &TestHub, id: &str) {
    wait_for(LIMIT, &format!("{id} connected"), || {
        let out = hub.admin(&["agent", "show", id, "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        (v["connected"] == true && v["report"]["runner"]["state"] == "running").then_some(())
    });
}

/// Every file under `dir`, read.
fn all_text(dir: &Path) -> String {
    let mut out = String::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.push_str(&all_text(&p));
        } else if let Ok(b) = fs::read(&p) {
            out.push_str(&String::from_utf8_lossy(&b));
        }
    }
    out
}

fn token_of(path: &Path) -> String {
    read_lossy(path).trim().to_owned()
}

#[test]
fn hosts_enrol_themselves_as_far_as_their_token_goes_and_rotated_tokens_never_lock_one_out() {
    let dir = tempdir();
    let hub = TestHub::start(&dir.path().join("hub"), &[]);
    let enrol = dir.path().join("enrol.token");
    let made = hub.admin_ok(&[
        "enrol-token",
        "create",
        "--uses",
        "2",
        "--label",
        "pool=ci",
        "--token-out",
        &path_str(&enrol),
    ]);
    assert!(made.contains("for 2 host(s)"), "{made}");
    let secret = token_of(&enrol);
    assert!(secret.starts_with("rge_"), "{secret}");

    // Two hosts enrol, each with its own token in its state dir, the token's label on it.
    let hosts = [Host::new(), Host::new(), Host::new()];
    let mut agents = Vec::new();
    for (i, id) in ["e1", "e2"].iter().enumerate() {
        agents.push(Guard::new(
            enrolling(&hub, &hosts[i], id, &enrol)
                .spawn()
                .expect("agent"),
        ));
        connected(&hub, id);
        let own = hosts[i].state().join("hub.token");
        assert!(token_of(&own).starts_with("rga_"));
        let v = hub.admin_json(&["agent", "show", id]);
        assert_eq!(v["hub_labels"]["pool"], "ci", "{v:#}");
    }
    // A third is refused with the reason, and exits 2.
    let out = enrolling(&hub, &hosts[2], "e3", &enrol)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("third");
    exited_saying(
        &out,
        2,
        "enrolment token et1 enrols no host: it has enrolled as many hosts as it may",
    );
    let listed = hub.admin_ok(&["enrol-token", "list"]);
    assert!(listed.contains("2/2"), "{listed}");
    // An enrolment token can never reconcile.
    let (code, body) = hub.reconcile("e1", &secret, 0);
    assert_eq!(code, 401, "{body}");
    // Another host under an id that is taken: refused, naming both.
    let again = dir.path().join("again.token");
    hub.admin_ok(&["enrol-token", "create", "--token-out", &path_str(&again)]);
    let out = enrolling(&hub, &hosts[2], "e1", &again)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("same id");
    let err = exited(&out, 2);
    assert!(
        err.contains("agent id \"e1\" is taken: enrolled at") && err.contains("this host, at"),
        "{err}"
    );

    // Rotation, with the agent killed at each step: it is never locked out.
    let own = hosts[0].state().join("hub.token");
    let audit_has = |needle: &str, n: usize| {
        let lines = hub.admin_json(&["audit", "list", "--token", "e1"]);
        let count = lines.as_array().map_or(0, |a| {
            a.iter()
                .filter(|l| l["outcome"].as_str().is_some_and(|o| o.contains(needle)))
                .count()
        });
        (count >= n).then_some(())
    };
    let mut agent = agents.remove(0);
    for (round, step) in ["sent", "stored", "used"].iter().enumerate() {
        let before = token_of(&own);
        hub.admin_ok(&["agent", "rotate", "e1"]);
        match *step {
            "sent" => wait_for(LIMIT, "a token sent", || {
                audit_has("new token sent", round + 1)
            }),
            "stored" => wait_for(LIMIT, "the token stored", || {
                (token_of(&own) != before).then_some(())
            }),
            _ => wait_for(LIMIT, "the token used", || {
                audit_has("uses its new token", round + 1)
            }),
        }
        agent.signal(Signal::SIGKILL);
        agent.wait_output(LIMIT);
        agent = Guard::new(
            enrolling(&hub, &hosts[0], "e1", &enrol)
                .spawn()
                .expect("agent again"),
        );
        connected(&hub, "e1");
        // Whatever it holds now works, and the rotation completes.
        wait_for(LIMIT, "the rotation done", || {
            let (code, _) = hub.reconcile("e1", &token_of(&own), 0);
            let v = hub.admin_json(&["agent", "show", "e1"]);
            (code == 200 && token_of(&own) != before && v["connected"] == true).then_some(())
        });
        let (code, body) = hub.reconcile("e1", &before, 0);
        assert_eq!(code, 401, "the old token is refused: {body}");
    }
    drop(agent);

    // No token in any log or status file; the hub keeps hashes only.
    let agent_tokens: Vec<String> = hosts[..2]
        .iter()
        .map(|h| token_of(&h.state().join("hub.token")))
        .collect();
    let logs = [
        all_text(&hosts[0].path("logs")),
        read_lossy(&hosts[0].path("agent.stderr")),
        read_lossy(&hosts[2].path("agent.stderr")),
        read_lossy(&hosts[0].state().join("agent-status.json")),
        hub.log(),
    ]
    .join("\n");
    for t in std::iter::once(&secret).chain(&agent_tokens) {
        assert!(!logs.contains(t.as_str()), "a token leaked into a log");
    }
    let db = fs::read(hub.dir.join("hub.db")).expect("hub.db");
    let db = String::from_utf8_lossy(&db);
    assert!(!db.contains(&secret) && !agent_tokens.iter().any(|t| db.contains(t.as_str())));
}

#[test]
fn a_scoped_token_reaches_only_its_scopes_and_agents_and_the_audit_log_names_it() {
    let dir = tempdir();
    let hub = TestHub::start(&dir.path().join("hub"), &[]);
    hub.admin_ok(&["desired", "set", "--fleet", "--max-jobs", "1"]);
    let members = [
        start_member(&hub, "c1", "build"),
        start_member(&hub, "p1", "build"),
    ];
    wait_ready(&hub, &["c1", "p1"]);
    hub.admin_ok(&["agent", "label", "c1", "tier=ci"]);
    hub.admin_ok(&["agent", "label", "p1", "tier=prod"]);
    let ci: PathBuf = dir.path().join("ci.token");
    hub.create_token("ci", "jobs:submit,jobs:read", &["--select", "tier=ci"], &ci);
    // Its jobs run on the agents it reaches, by id or by selector, never elsewhere.
    let out = hub.admin_with(
        &ci,
        &[
            "job", "submit", "--agent", "c1", "--wait", "--", "echo", "ci",
        ],
    );
    succeeded(&out);
    assert_eq!(text(&out.stdout), "ci\n");
    let out = hub.admin_with(&ci, &["job", "submit", "--agent", "p1", "--", "true"]);
    let err = exited(&out, 1);
    assert!(
        err.contains("403") && err.contains("agent p1 does not"),
        "{err}"
    );
    for n in 0..3 {
        let id = format!("sel{n}");
        let out = hub.admin_with(
            &ci,
            &[
                "job",
                "submit",
                "--id",
                &id,
                "--select",
                "queue=build",
                "--wait",
                "--",
                "true",
            ],
        );
        succeeded(&out);
        let v = hub.admin_json(&["job", "status", &id]);
        assert_eq!(v["agent"], "c1", "{v:#}");
        assert_eq!(v["scope"], "tier=ci");
    }
    // A job on an agent it does not reach is not its to see.
    hub.admin_ok(&[
        "job", "submit", "--agent", "p1", "--id", "prod-job", "--", "true",
    ]);
    let out = hub.admin_with(&ci, &["job", "status", "prod-job"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let listed = hub.admin_with(&ci, &["job", "list", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("job list");
    assert!(
        listed
            .as_array()
            .is_some_and(|a| !a.is_empty() && a.iter().all(|j| j["agent"] == "c1")),
        "{listed:#}"
    );
    // Every other scope's routes: 403, naming the scope it lacks.
    for (args, scope) in [
        (vec!["agent", "list"], "agents:read"),
        (vec!["agent", "label", "c1", "x=y"], "agents:write"),
        (
            vec!["desired", "set", "--fleet", "--max-jobs", "2"],
            "agents:write",
        ),
        (vec!["job", "cancel", "sel0"], "jobs:cancel"),
        (vec!["release", "resume", "9.9.9"], "releases:write"),
        (
            vec!["rollout", "start", "--version", "9.9.9"],
            "rollouts:write",
        ),
        (vec!["token", "list"], "tokens:write"),
        (vec!["enrol-token", "create"], "tokens:write"),
        (vec!["audit", "list"], "audit:read"),
        (vec!["token", "rotate-root"], "root"),
    ] {
        let out = hub.admin_with(&ci, &args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(&format!("lacks the scope {scope}")),
            "{args:?}: {err}"
        );
    }

    // The audit log: who did what from where, refusals included, and no secret.
    let audit = hub.admin_json(&["audit", "list"]);
    let lines = audit.as_array().expect("lines");
    let by_ci: Vec<&Value> = lines.iter().filter(|l| l["token"] == "ci").collect();
    assert!(
        by_ci.iter().any(|l| l["action"] == "POST /v1/admin/jobs"
            && l["outcome"] == "201"
            && l["target"].as_str().is_some_and(|t| t.contains("on c1"))),
        "{audit:#}"
    );
    assert!(
        by_ci
            .iter()
            .any(|l| l["outcome"].as_str().is_some_and(|o| o.starts_with("403"))),
        "{audit:#}"
    );
    assert!(lines.iter().all(|l| l["peer"] == "127.0.0.1"), "{audit:#}");
    let all = audit.to_string();
    for secret in ["rgh_", "rga_", "rge_"] {
        assert!(!all.contains(secret), "a secret in the audit log: {all}");
    }
    let only = hub.admin_json(&["audit", "list", "--token", "ci"]);
    assert_eq!(only.as_array().map(Vec::len), Some(by_ci.len()));

    // Revoked, it opens nothing; the root token rotated, the old one neither.
    hub.admin_ok(&["token", "revoke", "ci"]);
    let out = hub.admin_with(&ci, &["job", "list"]);
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));
    let old = dir.path().join("old-admin.token");
    fs::copy(hub.dir.join("admin.token"), &old).expect("copy");
    let said = hub.admin_ok(&["token", "rotate-root"]);
    assert!(said.contains("rotated the root admin token"), "{said}");
    let out = hub.admin_with(&old, &["agent", "list"]);
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));
    hub.admin_ok(&["agent", "list"]);
    let (code, _) = hub.reconcile("c1", "rga_nothing", 0);
    assert_eq!(code, 401);
    drop(members);
}

/// `with_token`, which must be refused 403 saying `words`.
fn forbidden(hub: &TestHub, token: &Path, args: &[&str], words: &str) {
    let out = hub.admin_with(token, args);
    let err = exited(&out, 1);
    assert!(
        err.contains("403") && err.contains(words),
        "{args:?} must be refused saying {words:?}: {err}"
    );
}

#[test]
fn rights_never_grow_by_delegation_and_a_revoked_id_is_never_taken_over() {
    let dir = tempdir();
    let hub = TestHub::start(&dir.path().join("hub"), &[]);
    for (id, tier) in [("c1", "tier=ci"), ("p1", "tier=prod")] {
        hub.enrol(id);
        hub.admin_ok(&["agent", "label", id, tier]);
    }
    hub.set_desired("p1", &["--max-jobs", "3"]);

    // A token that may only make tokens makes none wider than itself.
    let minter = dir.path().join("minter.token");
    hub.create_token("minter", "tokens:write", &[], &minter);
    let wide = ["token", "create", "--name", "wide", "--scope", "audit:read"];
    forbidden(&hub, &minter, &wide, "audit:read is not among them");
    forbidden(&hub, &minter, &["enrol-token", "create"], "agents:write");

    // A selected token: everything it makes selects within its selection, everything it
    // does lands on agents its selection matches, before and after.
    let ci = dir.path().join("ci.token");
    let scopes = "agents:read,agents:write,jobs:submit,tokens:write,rollouts:write";
    hub.create_token("ci", scopes, &["--select", "tier=ci"], &ci);
    fn make<'a>(name: &'a str, select: Option<&'a str>) -> Vec<&'a str> {
        let mut args = vec!["token", "create", "--name", name, "--scope", "jobs:submit"];
        args.extend(select.map(|s| ["--select", s]).into_iter().flatten());
        args
    }
    forbidden(&hub, &ci, &make("n1", None), "must select within it");
    forbidden(
        &hub,
        &ci,
        &make("n2", Some("tier!=prod")),
        "reaches further",
    );
    let narrower = hub.admin_with(&ci, &make("n3", Some("tier=ci,queue=build")));
    succeeded(&narrower);
    forbidden(&hub, &ci, &["enrol-token", "create"], "must give labels");
    succeeded(&hub.admin_with(&ci, &["enrol-token", "create", "--label", "tier=ci"]));
    for args in [
        vec!["agent", "label", "p1", "tier=ci"],
        vec!["agent", "drain", "p1"],
        vec!["agent", "resume", "p1"],
        vec!["desired", "set", "--agent", "p1", "--max-jobs", "1"],
        vec!["agent", "revoke", "p1"],
        vec!["agent", "rotate", "p1"],
        vec!["agent", "show", "p1"],
        vec!["job", "submit", "--agent", "p1", "--", "true"],
    ] {
        forbidden(&hub, &ci, &args, "agent p1 does not");
    }
    forbidden(
        &hub,
        &ci,
        &["agent", "label", "c1", "tier=prod"],
        "agent c1 does not once relabelled",
    );
    for args in [
        vec!["desired", "set", "--fleet", "--max-jobs", "1"],
        vec!["rollout", "start", "--version", "9.9.9"],
    ] {
        forbidden(&hub, &ci, &args, "match tier=ci: ");
    }
    let listed = hub.admin_with(&ci, &["agent", "list", "--json"]);
    let listed: Value = serde_json::from_str(&succeeded(&listed)).expect("agent list");
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed:#}");
    assert_eq!(listed[0]["id"], "c1");
    succeeded(&hub.admin_with(&ci, &["agent", "drain", "c1"]));
    let v = hub.admin_json(&["agent", "show", "p1"]);
    assert_eq!(v["hub_labels"]["tier"], "prod", "untouched: {v:#}");

    // A revoked agent's id: never given to an enrolling host, nor a job pinned to it; given
    // again only when asked, to a new agent with nothing of the old one.
    hub.admin_ok(&["agent", "revoke", "p1"]);
    let enrol = dir.path().join("enrol.token");
    hub.admin_ok(&["enrol-token", "create", "--token-out", &path_str(&enrol)]);
    let (code, body) = hub.curl(
        "POST",
        "/v1/enrol",
        Some(&token_of(&enrol)),
        Some(r#"{"id":"p1","hostname":"intruder"}"#),
    );
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("never given to an enrolling host"), "{body}");
    let out = hub.admin(&["job", "submit", "--agent", "p1", "--", "true"]);
    let err = exited(&out, 1);
    assert!(err.contains("409") && err.contains("was revoked"), "{err}");
    let out = hub.admin(&["agent", "add", "p1"]);
    assert!(exited(&out, 1).contains("--reuse-revoked-id"));
    hub.admin_ok(&["agent", "add", "p1", "--reuse-revoked-id"]);
    let v = hub.admin_json(&["agent", "show", "p1"]);
    assert_eq!(v["hub_labels"], serde_json::json!({}), "{v:#}");
    let d = hub.admin_json(&["desired", "show", "--agent", "p1"]);
    assert!(d["settings"]["max_jobs"].is_null(), "{d:#}");

    // Every action and every refusal names its target in the audit log.
    let audit = hub.admin_json(&["audit", "list"]);
    let lines = audit.as_array().expect("lines");
    for (action, outcome) in [
        ("POST /v1/admin/agents/{id}/labels", "403"),
        ("POST /v1/admin/agents/{id}/revoke", "403"),
        ("POST /v1/admin/agents/{id}/revoke", "200"),
        ("PUT /v1/admin/desired/agents/{id}", "403"),
    ] {
        assert!(
            lines.iter().any(|l| l["action"] == action
                && l["target"] == "p1"
                && l["outcome"]
                    .as_str()
                    .is_some_and(|o| o.starts_with(outcome))),
            "no {action} {outcome} on p1: {audit:#}"
        );
    }
    assert!(lines
        .iter()
        .all(|l| l["target"] != "-" || !l["action"].as_str().is_some_and(|a| a.contains('{'))));
}

/// A request with `token` as the bearer: the status and the `Retry-After` it gave.
fn status_of(
    hub: &TestHub,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&str>,
) -> (u16, Option<String>) {
    let mut headers = vec![format!("Authorization: Bearer {token}")];
    if body.is_some() {
        headers.push("Content-Type: application/json".into());
    }
    let (code, text) = hub.curl_head(method, path, &headers, body);
    let retry = text
        .lines()
        .find_map(|l| l.strip_prefix("retry-after: "))
        .map(|v| v.trim().to_owned());
    (code, retry)
}

#[test]
fn failed_authentication_is_throttled_per_source_counted_and_kept_in_few_audit_lines() {
    let dir = tempdir();
    let hub = TestHub::start(&dir.path().join("hub"), &[]);
    let enrol = dir.path().join("enrol.token");
    hub.admin_ok(&["enrol-token", "create", "--token-out", &path_str(&enrol)]);
    let root = hub.admin_token();

    // A burst of wrong tokens is answered 401, then 429 with Retry-After (the bucket
    // refills at one a second: however slow this machine, the burst runs out).
    let until_429 = |method: &str, path: &str, body: Option<&str>| {
        for tries in 1..=200 {
            match status_of(&hub, method, path, "rgh_wrong", body) {
                (401, _) => {}
                (429, Some(retry)) if retry.parse::<u64>().is_ok_and(|n| n >= 1) => return tries,
                other => panic!("{method} {path}: {other:?}"),
            }
        }
        panic!("{method} {path}: never throttled");
    };
    let admin_failures = until_429("GET", "/v1/admin/agents", None);
    assert!(admin_failures > 20, "a burst of 20 first: {admin_failures}");
    // Every route with a token throttles this source for a wrong one now…
    for (method, path, body) in [
        ("POST", "/v1/agents/a1/reconcile", Some(report(0))),
        ("POST", "/v1/enrol", Some(r#"{"id":"h1"}"#.to_owned())),
        ("GET", "/v1/releases/1.0.0/linux-x86_64?agent=a1", None),
    ] {
        assert!(
            until_429(method, path, body.as_deref()) <= 5,
            "{method} {path}"
        );
    }
    // …and serves one that authenticates, as before.
    assert_eq!(
        status_of(&hub, "GET", "/v1/admin/agents", &root, None).0,
        200
    );
    let (code, _) = status_of(
        &hub,
        "POST",
        "/v1/enrol",
        &token_of(&enrol),
        Some(r#"{"id":"h1","hostname":"h1"}"#),
    );
    assert_eq!(code, 201, "a good enrolment token still enrols");

    // Counted by route, and kept in the audit log as a few lines with counts.
    let (code, metrics) = hub.curl("GET", "/metrics", Some(&root), None);
    assert_eq!(code, 200);
    let admin = metrics
        .lines()
        .find_map(|l| l.strip_prefix("railgrid_auth_failures_total{route=\"admin\"} "))
        .and_then(|n| n.parse::<u64>().ok());
    assert_eq!(admin, Some(admin_failures as u64), "{metrics}");
    let lines = wait_for(LIMIT, "the refusals counted in the audit log", || {
        let audit = hub.admin_json(&["audit", "list"]);
        let lines = audit.as_array()?.clone();
        let counted: u64 = lines
            .iter()
            .filter(|l| l["action"] == "GET /v1/admin/agents" && l["token"] == "-")
            .map(|l| l["count"].as_u64().unwrap_or(0))
            .sum();
        (counted == admin_failures as u64).then_some(lines)
    });
    let refusals = lines
        .iter()
        .filter(|l| l["action"] == "GET /v1/admin/agents" && l["token"] == "-")
        .count();
    assert!(
        refusals <= 4,
        "{admin_failures} refusals in {refusals} lines: {lines:#?}"
    );
}
