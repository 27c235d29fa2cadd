//! Drains: a real hub over TLS and two real agents. A drained agent keeps its running job
//! whole while new work goes to the other; `drain --wait` returns at idle; a deadline
//! cancels with its reason; a host's own drain refuses local jobs and outlives an agent
//! restart.

use std::fs;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use super::routing::{
    member_cmd, release, running, start_member, status, submit, submit_gated, wait_job, wait_ready,
};
use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(30);

fn agent_view(hub: &TestHub, id: &str) -> Value {
    let list = hub.admin_json(&["agent", "list"]);
    list.as_array()
        .and_then(|a| a.iter().find(|v| v["id"] == id).cloned())
        .unwrap_or(Value::Null)
}

/// Waits until `id` reports a drain with `left` jobs left.
fn wait_drained(hub: &TestHub, id: &str, left: u64) -> Value {
    wait_for(
        LIMIT,
        &format!("{id} draining with {left} job(s) left"),
        || {
            let v = agent_view(hub, id);
            (v["report"]["drain"]["jobs_left"] == left).then_some(v)
        },
    )
}

/// A pinned job on `agent` that writes to both streams around its gate, then exits 7.
fn submit_whole(hub: &TestHub, marks: &Path, agent: &str, id: &str) {
    let script = format!(
        "echo before; echo err >&2; while [ ! -e {m}/go-{id} ]; do sleep 0.05; done; echo after; exit 7",
        m = marks.display()
    );
    let out = submit(
        hub,
        &["--agent", agent, "--id", id, "--", "sh", "-c", &script],
    );
    succeeded(&out);
}

fn local_submit(state: &Path) -> Output {
    railgrid()
        .args(["job", "submit", "--state-dir"])
        .arg(state)
        .args(["--", "true"])
        .output()
        .expect("job submit")
}

#[test]
fn a_drain_keeps_running_jobs_whole_sends_new_work_elsewhere_and_cancels_at_its_deadline() {
    let dir = tempdir();
    let hub = TestHub::start(&dir.path().join("hub"), &[]);
    hub.admin_ok(&["desired", "set", "--fleet", "--max-jobs", "1"]);
    let mut d1 = start_member(&hub, "d1", "build");
    let _d2 = start_member(&hub, "d2", "build");
    wait_ready(&hub, &["d1", "d2"]);
    let marks = hub.marks();

    // A running job on d1, then the drain: it finishes, whole.
    submit_whole(&hub, &marks, "d1", "keep");
    wait_job(&hub, "keep", "running", running);
    let said = hub.admin_ok(&["agent", "drain", "d1"]);
    assert!(said.contains("agent d1: draining"), "{said}");
    let v = wait_drained(&hub, "d1", 1);
    assert_eq!(v["accept_jobs"], false, "{v:#}");
    assert_eq!(v["report"]["drain"]["reason"], "drained by the hub");
    let table = hub.admin_ok(&["agent", "list"]);
    assert!(table.contains("draining (1 job left)"), "{table}");

    // New selected work goes to d2; a job pinned to d1 waits at the hub, saying why.
    submit_gated(&hub, &marks, "elsewhere", &[]);
    let e = wait_job(&hub, "elsewhere", "running", running);
    assert_eq!(e["agent"], "d2", "{e:#}");
    let out = submit(&hub, &["--agent", "d1", "--id", "later", "--", "true"]);
    succeeded(&out);
    let later = wait_job(&hub, "later", "waiting for the drain", |v| {
        says(v, "waiting", "agent d1 is draining (drained by the hub)")
    });
    assert_eq!(later["state"], "pending", "{later:#}");

    // A local job on the drained host is refused with the reason.
    let out = local_submit(&d1.host.state());
    exited_saying(&out, 1, "this host is draining: drained by the hub");

    // `drain --wait` returns once the running job is done, and it is whole.
    let mut waiter = Guard::new(
        hub.admin_cmd(&["agent", "drain", "d1", "--wait"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("drain --wait"),
    );
    release(&hub, &marks, "keep");
    let out = waiter.wait_output(LIMIT);
    exited_saying(&out, 0, "agent d1 is idle");
    let keep = status(&hub, "keep");
    assert_eq!(
        (keep["state"].as_str(), keep["exit_code"].as_i64()),
        (Some("failed"), Some(7)),
        "{keep:#}"
    );
    let logs = hub.admin(&["job", "logs", "keep"]);
    assert_eq!(text(&logs.stdout), "before\nafter\n");
    assert_eq!(text(&logs.stderr), "err\n");
    assert_eq!(status(&hub, "later")["state"], "pending", "still drained");

    // Resumed, d1 takes its pinned job; drained again with a deadline, what runs is
    // cancelled with the reason, and `--wait` says so (exit 1).
    let said = hub.admin_ok(&["agent", "resume", "d1"]);
    assert!(said.contains("agent d1: takes jobs again"), "{said}");
    wait_job(&hub, "later", "done", |v| v["state"] == "succeeded");
    submit_whole(&hub, &marks, "d1", "cut");
    wait_job(&hub, "cut", "running", running);
    let out = hub.admin(&["agent", "drain", "d1", "--deadline", "1s", "--wait"]);
    exited_saying(
        &out,
        1,
        "job cut on d1 was cancelled at the drain's deadline",
    );
    let cut = status(&hub, "cut");
    assert_eq!(cut["state"], "cancelled", "{cut:#}");
    assert_says(&cut, "error", "drain deadline (drained by the hub)");
    hub.admin_ok(&["agent", "resume", "--select", "queue=build"]);
    wait_for(LIMIT, "d1 without a drain", || {
        agent_view(&hub, "d1")["report"]["drain"]
            .is_null()
            .then_some(())
    });
    release(&hub, &marks, "elsewhere");

    // The host's own drain: refuses local jobs, is reported, outlives an agent restart.
    let state = d1.host.state();
    let out = railgrid()
        .args(["agent", "drain", "--state-dir"])
        .arg(&state)
        .output()
        .expect("agent drain");
    succeeded(&out);
    let v = wait_drained(&hub, "d1", 0);
    assert_eq!(v["report"]["drain"]["host"], true, "{v:#}");
    assert_eq!(v["accept_jobs"], true, "the hub's own setting is untouched");
    d1.agent.signal(Signal::SIGTERM);
    d1.agent.wait_output(LIMIT);
    d1.agent = Guard::new(
        member_cmd(&hub, &d1.host, "d1", "build")
            .spawn()
            .expect("restart agent"),
    );
    let pid = d1.agent.pid();
    wait_for(
        LIMIT,
        "the restarted agent holding the host's drain",
        || {
            let st = d1.host.status();
            (st["pid"] == pid && st["drain"]["jobs_left"] == 0).then_some(())
        },
    );
    let shown = agent_status(&state);
    let shown = text(&shown.stdout);
    assert!(
        shown.contains("drain:      draining (0 jobs left)"),
        "{shown}"
    );
    let out = local_submit(&state);
    exited_saying(&out, 1, "drained on the host");
    let out = railgrid()
        .args(["agent", "resume", "--state-dir"])
        .arg(&state)
        .output()
        .expect("agent resume");
    exited_saying(&out, 0, "the host takes jobs again");
    let out = local_submit(&state);
    succeeded(&out);
    assert!(!state.join("host-drain.json").exists());
    assert!(!state.join("runner/drain.json").exists());

    // Disabling the runner drains it first: its job finishes whole, then it stops.
    submit_whole(&hub, &marks, "d1", "last");
    wait_job(&hub, "last", "running", running);
    hub.set_desired("d1", &["--runner-enabled", "false"]);
    let v = wait_for(LIMIT, "d1 draining before its runner stops", || {
        let v = agent_view(&hub, "d1");
        says(
            &v["report"]["drain"],
            "reason",
            "the hub disables the runner",
        )
        .then_some(v)
    });
    assert_eq!(v["report"]["runner"]["state"], "running", "{v:#}");
    release(&hub, &marks, "last");
    let last = status(&hub, "last");
    assert_eq!(last["exit_code"], 7, "{last:#}");
    wait_for(LIMIT, "d1's runner stopped once idle", || {
        (agent_view(&hub, "d1")["report"]["runner"]["state"] == "disabled").then_some(())
    });
    // --force stops it at once, its job getting the stop budget.
    hub.set_desired("d1", &["--runner-enabled", "true"]);
    wait_ready(&hub, &["d1"]);
    submit_whole(&hub, &marks, "d1", "forced");
    wait_job(&hub, "forced", "running", running);
    hub.set_desired("d1", &["--runner-enabled", "false", "--force"]);
    let forced = wait_job(&hub, "forced", "done", |v| v["done"] == true);
    assert_eq!(forced["state"], "cancelled", "{forced:#}");
    fs::remove_dir_all(&marks).ok();
}
