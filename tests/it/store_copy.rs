//! From one SQLite hub to replicas: `hub store copy` moves a stopped hub into an empty
//! PostgreSQL database, and a replica started on it at the same address serves the same
//! agents with their old tokens, the same job output, releases, halt and tokens.

use std::fs;
use std::process::Output;

use serde_json::Value;

use super::replicas::sim_reconcile;
use super::routing::{start_member, submit};
use crate::fixtures::*;

const LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

fn copy(from: &std::path::Path, to: &str) -> Output {
    railgrid()
        .args(["hub", "store", "copy", "--from"])
        .arg(from)
        .args(["--to", to])
        .output()
        .expect("hub store copy")
}

fn connected(hub: &TestHub, id: &str) -> bool {
    let v = hub.admin_json(&["agent", "show", id]);
    v["connected"] == true && v["report"]["runner"]["state"] == "running"
}

#[test]
fn a_sqlite_hub_copied_to_postgresql_serves_the_same_agents_jobs_and_halt_from_a_replica() {
    let Some(pg) = Postgres::start() else { return };
    let dir = tempdir();
    let (key, hub) = signed_hub(dir.path());
    let _member = start_member(&hub, "d1", "build");
    wait_for(LIMIT, "d1 connected", || {
        connected(&hub, "d1").then_some(())
    });
    let out = submit(
        &hub,
        &[
            "--agent",
            "d1",
            "--id",
            "hello",
            "--wait",
            "--",
            "sh",
            "-c",
            "echo hello from sqlite; echo and its stderr >&2",
        ],
    );
    succeeded(&out);

    // A release, sent to a simulated agent that rolls it back: the version is halted.
    let artifact = dir.path().join("artifact");
    fs::write(&artifact, b"not run: s1 is simulated").expect("artifact");
    release(&hub, &key, dir.path(), "2.0.0", &artifact);
    let s1 = read_lossy(&hub.enrol("s1")).trim().to_owned();
    let g = sim_reconcile(&hub, ("s1", &s1), 0, "1.0.0", None, "2.0.0").0;
    hub.set_desired("s1", &["--version", "2.0.0"]);
    sim_reconcile(
        &hub,
        ("s1", &s1),
        g,
        "1.0.0",
        Some(("rolled_back", "2.0.0")),
        "2.0.0",
    );
    let halted = |hub: &TestHub| {
        hub.admin_json(&["release", "list"])
            .as_array()
            .and_then(|a| a.iter().find(|r| r["version"] == "2.0.0").cloned())
            .map(|r| r["halted"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(halted(&hub)["agent"], "s1");
    let ci = dir.path().join("ci.token");
    hub.create_token("ci", "jobs:read", &[], &ci);
    let value = dir.path().join("secret");
    fs::write(&value, "copied-secret-value").expect("secret");
    hub.admin_ok(&["secret", "set", "COPIED", "--from-file", &path_str(&value)]);
    let agents_before = hub.admin_json(&["agent", "list"]);
    let logs_before = hub.admin_ok(&["job", "logs", "hello"]);

    // Refused while the hub serves its data dir, and nothing is written.
    let url = pg.create_db("copied");
    let out = copy(&hub.dir, &url);
    exited_saying(&out, 2, "another hub is serving data dir");
    let tables = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'";
    assert_eq!(pg.sql("copied", tables), "0");

    let (hub_dir, listen) = (hub.dir.clone(), hub.listen.clone());
    hub.stop();

    // A release binary that is not what the store names: refused, and nothing committed.
    let bin = fs::read_dir(hub_dir.join("releases"))
        .expect("releases")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .expect("the release binary");
    let good = fs::read(&bin).expect("binary");
    fs::write(&bin, b"tampered").expect("tamper");
    let out = copy(&hub_dir, &url);
    let err = exited(&out, 2);
    assert!(
        err.contains(&path_str(&bin)) && err.contains("does not hold"),
        "{err}"
    );
    assert_eq!(pg.sql("copied", "SELECT count(*) FROM agents"), "0");
    fs::write(&bin, good).expect("restore");
    let out = copy(&hub_dir, &url);
    let said = text(&out.stdout);
    succeeded(&out);
    for part in [
        "agents",
        "jobs",
        "job_output",
        "halts",
        "admin_tokens",
        "audit",
        "release binaries: 1",
        "the CA of --tls-self-signed",
        "job_secrets",
        "not the key that seals the secrets",
    ] {
        assert!(said.contains(part), "{part}: {said}");
    }
    assert_eq!(pg.sql("copied", "SELECT count(*) FROM agents"), "2");
    assert_eq!(pg.sql("copied", "SELECT count(*) FROM release_blobs"), "1");

    // A second copy is refused: the database is not empty any more.
    let out = copy(&hub_dir, &url);
    exited_saying(&out, 2, "is not empty");

    // A replica at the old address, with a data dir of its own (the admin token copied
    // for the admin commands): the agent comes back with its token, through its pinned CA.
    let rdir = dir.path().join("replica");
    fs::create_dir_all(&rdir).expect("replica dir");
    fs::copy(hub_dir.join("admin.token"), rdir.join("admin.token")).expect("admin token");
    fs::copy(hub_dir.join("secrets.key"), rdir.join("secrets.key")).expect("secrets key");
    let replica = TestHub::start_on(
        &rdir,
        &listen,
        &["--store", &url, "--release-key", &path_str(&key.public)],
    );
    wait_for(LIMIT, "d1 back, through the replica", || {
        connected(&replica, "d1").then_some(())
    });
    assert_eq!(replica.admin_ok(&["job", "logs", "hello"]), logs_before);
    assert_eq!(halted(&replica)["agent"], "s1");
    let agents = replica.admin_json(&["agent", "list"]);
    for id in ["d1", "s1"] {
        let pick = |v: &Value| {
            v.as_array()
                .and_then(|a| a.iter().find(|x| x["id"] == id).cloned())
                .expect("the agent")
        };
        let (a, b) = (pick(&agents_before), pick(&agents));
        assert_eq!(a["labels"], b["labels"], "{id}");
        assert_eq!(a["desired_generation"], b["desired_generation"], "{id}");
    }
    let (code, body) = replica.reconcile("s1", &s1, 0);
    assert_eq!(code, 200, "the old token of s1: {body}");
    let ci = read_lossy(&ci).trim().to_owned();
    let (code, body) = replica.curl("GET", "/v1/admin/jobs/hello", Some(&ci), None);
    assert_eq!(code, 200, "the scoped token: {body}");
    let out = submit(
        &replica,
        &[
            "--agent",
            "d1",
            "--id",
            "after",
            "--wait",
            "--",
            "echo",
            "after the copy",
        ],
    );
    succeeded(&out);
    assert!(text(&out.stdout).contains("after the copy"));
    // The secret went over sealed, and opens with the key file copied beside.
    let out = submit(
        &replica,
        &[
            "--agent",
            "d1",
            "--id",
            "sealed",
            "--secret",
            "COPIED",
            "--wait",
            "--",
            "sh",
            "-c",
            "echo \"${#COPIED}\"",
        ],
    );
    assert_eq!(text(&out.stdout).trim(), "19", "{}", text(&out.stderr));
}
