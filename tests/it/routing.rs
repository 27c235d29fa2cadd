//! Jobs routed by labels: a real hub over TLS with three real agents of different
//! labels, selected jobs taken from the fleet's queue, priority, expiry and a hub
//! killed under a queue.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(30);

/// One enrolled host and its running agent.
pub(super) struct Member {
    pub(super) id: &'static str,
    pub(super) host: Host,
    pub(super) agent: Guard,
}

/// The command that runs `id`'s agent on `host`, labelled `queue=QUEUE`.
pub(super) fn member_cmd(
    hub: &TestHub,
    host: &Host,
    id: &str,
    queue: &str,
) -> std::process::Command {
    let token = hub.dir.with_file_name(format!("{id}.token"));
    let mut cmd = host.agent_cmd(&["--label", &format!("queue={queue}")]);
    cmd.args(hub.link(id, &token))
        .env("RAILGRID_RUNNER_SANDBOX_SHARED", hub.marks())
        .stderr(std::process::Stdio::null());
    cmd
}

pub(super) fn start_member(hub: &TestHub, id: &'static str, queue: &str) -> Member {
    let host = Host::new();
    hub.enrol(id);
    let agent = Guard::new(
        member_cmd(hub, &host, id, queue)
            .spawn()
            .expect("spawn agent"),
    );
    Member { id, host, agent }
}

/// Every agent connected, its runner serving and admitting one job at a time.
pub(super) fn wait_ready(hub: &TestHub, ids: &[&str]) {
    wait_for(
        LIMIT,
        "every agent connected with a runner of one slot",
        || {
            let list = hub.admin_json(&["agent", "list"]);
            let ready = |a: &Value| {
                a["connected"] == true
                    && a["report"]["runner"]["state"] == "running"
                    && a["report"]["jobs_summary"]["max_jobs"] == 1
            };
            let all = list.as_array()?;
            ids.iter()
                .all(|id| all.iter().any(|a| a["id"] == *id && ready(a)))
                .then_some(())
        },
    );
}

pub(super) fn submit(hub: &TestHub, args: &[&str]) -> Output {
    let mut all = vec!["job", "submit"];
    all.extend_from_slice(args);
    hub.admin(&all)
}

/// A selected job that marks its run, then waits for its own gate file.
pub(super) fn submit_gated(hub: &TestHub, marks: &Path, id: &str, flags: &[&str]) {
    let script = format!(
        "echo {id} >> {m}/ran; while [ ! -e {m}/go-{id} ]; do sleep 0.05; done",
        m = marks.display()
    );
    let mut args = vec!["--id", id, "--select", "queue=build"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "sh", "-c", &script]);
    let out = submit(hub, &args);
    assert!(
        out.status.success(),
        "submit {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(super) fn status(hub: &TestHub, id: &str) -> Value {
    hub.admin_json(&["job", "status", id])
}

pub(super) fn wait_job(
    hub: &TestHub,
    id: &str,
    what: &str,
    accept: impl Fn(&Value) -> bool,
) -> Value {
    wait_for(LIMIT, &format!("job {id}: {what}"), || {
        let v = status(hub, id);
        accept(&v).then_some(v)
    })
}

pub(super) fn running(v: &Value) -> bool {
    v["state"] == "running"
}

/// Opens job `id`'s gate and waits until it is done at the hub.
pub(super) fn release(hub: &TestHub, marks: &Path, id: &str) {
    let gate = marks.join(format!("go-{id}"));
    fs::write(&gate, "").expect("gate");
    wait_job(hub, id, "done", |v| v["done"] == true);
}

/// The open jobs per agent never pass the one slot each agent has.
fn assert_within_room(hub: &TestHub) {
    let jobs = hub.admin_json(&["job", "list"]);
    for agent in ["b1", "b2", "g1"] {
        let open = jobs
            .as_array()
            .expect("list")
            .iter()
            .filter(|j| j["agent"] == agent && j["done"] == false)
            .count();
        assert!(open <= 1, "agent {agent} holds {open} jobs: {jobs:#}");
    }
}

#[test]
fn selected_jobs_reach_only_matching_agents_with_room_in_priority_order_and_survive_a_hub_kill() {
    let dir = tempdir();
    let hub_dir: PathBuf = dir.path().join("hub");
    let mut hub = TestHub::start(&hub_dir, &[]);
    hub.admin_ok(&["desired", "set", "--fleet", "--max-jobs", "1"]);
    let members = [
        start_member(&hub, "b1", "build"),
        start_member(&hub, "b2", "build"),
        start_member(&hub, "g1", "gpu"),
    ];
    let ids: Vec<&str> = members.iter().map(|m| m.id).collect();
    wait_ready(&hub, &ids);
    let marks = hub.marks();

    // Two build agents, one slot each: two of three run, on both, the third waits.
    for id in ["s1", "s2", "s3"] {
        submit_gated(&hub, &marks, id, &[]);
    }
    let s1 = wait_job(&hub, "s1", "running", running);
    let s2 = wait_job(&hub, "s2", "running", running);
    let mut on = [s1["agent"].as_str(), s2["agent"].as_str()];
    on.sort_unstable();
    assert_eq!(on, [Some("b1"), Some("b2")], "spread over both");
    let s3 = status(&hub, "s3");
    assert_eq!(
        (s3["state"].as_str(), s3["agent"].as_str()),
        (Some("queued"), Some(""))
    );
    assert_eq!(s3["selector"], "queue=build");
    assert_eq!(s3["waiting"], "2 agents match, all full", "{s3:#}");
    assert_within_room(&hub);

    // With one slot free, the highest priority goes first, then submission order.
    submit_gated(&hub, &marks, "lo", &["--priority", "10"]);
    submit_gated(&hub, &marks, "hi", &["--priority", "90"]);
    release(&hub, &marks, "s1");
    let hi = wait_job(&hub, "hi", "running", running);
    assert_eq!(hi["priority"], 90);
    assert_eq!(status(&hub, "s3")["state"], "queued", "behind hi");
    assert_within_room(&hub);
    release(&hub, &marks, "s2");
    wait_job(&hub, "s3", "running", running);
    let lo = status(&hub, "lo");
    assert_eq!(lo["state"], "queued", "{lo:#}");
    assert_eq!(lo["waiting"], "2 agents match, all full");
    // Waiting ages it (a point each 3 s by default), and its status says so.
    let lo = wait_job(&hub, "lo", "priority gained by waiting", |v| {
        v["effective_priority"].as_u64() > Some(10)
    });
    assert_eq!(lo["priority"], 10, "{lo:#}");
    let text = hub.admin_ok(&["job", "status", "lo"]);
    assert!(text.contains("with its wait in the queue"), "{text}");

    // A selector nothing matches is taken, says so, and expires.
    let out = submit(
        &hub,
        &[
            "--id",
            "x",
            "--select",
            "queue=nowhere",
            "--queue-timeout",
            "1s",
            "--",
            "true",
        ],
    );
    succeeded(&out);
    let x = status(&hub, "x");
    assert!(
        x["waiting"]
            .as_str()
            .is_some_and(|w| w.starts_with("no agent matches queue=nowhere")),
        "{x:#}"
    );
    let waited = hub.admin(&["job", "wait", "x"]);
    exited_saying(
        &waited,
        1,
        "expired: no agent took it within its queue timeout",
    );
    assert_eq!(status(&hub, "x")["state"], "expired");

    // The hub killed under a queue: the queue is in the store, and no job runs twice.
    let listen = hub.listen.clone();
    hub.guard.signal(Signal::SIGKILL);
    hub.guard.wait_output(LIMIT);
    hub = TestHub::start_on(&hub_dir, &listen, &[]);
    assert_eq!(status(&hub, "lo")["state"], "queued");
    wait_ready(&hub, &ids);
    for id in ["hi", "s3"] {
        release(&hub, &marks, id);
    }
    let lo = wait_job(&hub, "lo", "running", running);
    assert_ne!(lo["agent"], "g1");
    release(&hub, &marks, "lo");
    let mut ran: Vec<String> = read_lossy(&marks.join("ran"))
        .lines()
        .map(str::to_owned)
        .collect();
    ran.sort();
    assert_eq!(ran, ["hi", "lo", "s1", "s2", "s3"], "each once");
    let listed = hub.admin_json(&["job", "list", "--select", "queue = build"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(5), "{listed:#}");
    assert!(
        listed
            .as_array()
            .expect("list")
            .iter()
            .all(|j| j["agent"] != "g1"),
        "{listed:#}"
    );

    // Fan-out: one member per build agent, as a group; the failing member's code wins.
    let b2 = path_str(&members[1].host.state());
    let script = format!("echo hello; case \"$PWD\" in {b2}*) echo bad >&2; exit 3;; esac");
    let fan = submit(
        &hub,
        &[
            "--id",
            "fan",
            "--select",
            "queue=build",
            "--each",
            "--wait",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let (out, err) = (
        String::from_utf8_lossy(&fan.stdout),
        String::from_utf8_lossy(&fan.stderr),
    );
    assert_eq!(fan.status.code(), Some(3), "{out}{err}");
    assert!(
        out.contains("[b1] hello\n") && out.contains("[b2] hello\n"),
        "{out}"
    );
    assert!(err.contains("[b2] bad\n"), "{err}");
    assert!(err.contains("1 of 2 members succeeded"), "{err}");
    let group = hub.admin_json(&["job", "list", "--group", "fan"]);
    let mut agents: Vec<&str> = group
        .as_array()
        .expect("list")
        .iter()
        .map(|j| j["agent"].as_str().expect("agent"))
        .collect();
    agents.sort_unstable();
    assert_eq!(agents, ["b1", "b2"], "{group:#}");
    assert_eq!(group[0]["group"], "fan");
    let again = hub.admin(&["job", "wait", "--group", "fan"]);
    assert_eq!(again.status.code(), Some(3));

    // A retry: lost with its revoked agent, the job runs again as rt.2 on the other.
    submit_gated(&hub, &marks, "rt", &["--retry", "1"]);
    let rt = wait_job(&hub, "rt", "running", running);
    let lost_on = rt["agent"].as_str().expect("agent").to_owned();
    assert_eq!(rt["retries"], 1);
    hub.admin_ok(&["agent", "revoke", &lost_on]);
    let rt = wait_job(&hub, "rt", "lost", |v| v["state"] == "lost");
    assert_says(&rt, "error", "revoked");
    let retry = wait_job(&hub, "rt.2", "the retry running", running);
    assert_eq!(
        (retry["attempt"].as_u64(), retry["retries"].as_u64()),
        (Some(2), Some(0))
    );
    assert_ne!(retry["agent"], lost_on.as_str(), "{retry:#}");
    assert_ne!(retry["agent"], "g1");
    // The same spec: it waits for rt's gate.
    fs::write(marks.join("go-rt"), "").expect("gate");
    let retry = wait_job(&hub, "rt.2", "done", |v| v["done"] == true);
    assert_eq!(retry["state"], "succeeded", "{retry:#}");

    refuses_bad_submissions(&hub);
}

/// Bad input is refused before anything is sent, naming what is wrong.
fn refuses_bad_submissions(hub: &TestHub) {
    for (args, says) in [
        (vec!["--select", "zone in (a", "--", "true"], "zone in (a"),
        (
            vec!["--select", "a=1", "--priority", "101", "--", "true"],
            "101",
        ),
        (
            vec!["--agent", "b1", "--select", "a=1", "--", "true"],
            "cannot be used",
        ),
        (
            vec!["--agent", "b1", "--queue-timeout", "1s", "--", "true"],
            "cannot be used",
        ),
        (vec!["--", "true"], "--agent"),
        (
            vec!["--each", "--agent", "b1", "--", "true"],
            "cannot be used",
        ),
        (vec!["--each", "--", "true"], "--select"),
        (vec!["--select", "a=1", "--retry", "11", "--", "true"], "11"),
        (
            vec!["--agent", "b1", "--retry", "1", "--", "true"],
            "cannot be used",
        ),
        (
            vec!["--select", "a=1", "--connected-only", "--", "true"],
            "--each",
        ),
    ] {
        let out = submit(hub, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn the_jobs_of_an_agent_gone_past_the_hubs_patience_end_lost_and_are_retried_elsewhere() {
    let dir = tempdir();
    let hub = TestHub::start(
        &dir.path().join("hub"),
        &["--max-wait", "1s", "--agent-patience", "2s"],
    );
    hub.admin_ok(&["desired", "set", "--fleet", "--max-jobs", "1"]);
    let mut members = [
        start_member(&hub, "p1", "build"),
        start_member(&hub, "p2", "build"),
    ];
    wait_ready(&hub, &["p1", "p2"]);
    let marks = hub.marks();
    submit_gated(&hub, &marks, "gone", &["--retry", "1"]);
    let first = wait_job(&hub, "gone", "running", running);
    let on = first["agent"].as_str().expect("agent").to_owned();
    // Its agent hangs (a host cut off looks the same to the hub): past the patience, the
    // job ends lost and its retry runs on the other agent.
    let hung = members.iter_mut().find(|m| m.id == on).expect("member");
    hung.agent.signal(Signal::SIGSTOP);
    let lost = wait_job(&hub, "gone", "lost", |v| v["state"] == "lost");
    assert_says(&lost, "error", &format!("agent {on} was not seen for 2s"));
    let retry = wait_job(&hub, "gone.2", "the retry running", running);
    assert_ne!(retry["agent"], on.as_str(), "{retry:#}");
    hung.agent.signal(Signal::SIGCONT);
    // The same spec: it waits for the first attempt's gate.
    fs::write(marks.join("go-gone"), "").expect("gate");
    let retry = wait_job(&hub, "gone.2", "done", |v| v["done"] == true);
    assert_eq!(retry["state"], "succeeded", "{retry:#}");
    assert_eq!(status(&hub, "gone")["state"], "lost", "stays as it ended");
}
