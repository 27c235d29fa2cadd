//! `railgrid agent run` and `railgrid runner run`: the agent/runner pair on one host with no
//! hub, against real processes, sockets and files.

mod cgroup;
mod config;
mod status;
mod stop;
mod trust;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use crate::fixtures::*;

/// A refused start made nothing in `dir`.
fn assert_empty(dir: &Path) {
    assert!(
        fs::read_dir(dir).expect("read_dir").next().is_none(),
        "a refused start made files in {}",
        dir.display()
    );
}

fn sigkill(pid: i32) {
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill -9");
}

#[test]
fn the_agent_starts_the_runner_and_health_answers() {
    let host = Host::new();
    let _agent = host.start_agent();
    let pid = host.wait_runner("a healthy runner", |_| true);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(health["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(health["jobs_running"], 0);
    assert!(health["uptime_secs"].is_u64());

    let mode = fs::metadata(host.socket())
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "socket mode");
    let runner_dir = fs::metadata(host.state().join("runner")).expect("runner dir");
    assert_eq!(runner_dir.permissions().mode() & 0o777, 0o700);
    if is_root() {
        let nobody = uzers::get_user_by_name("nobody").expect("nobody");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            runner_dir.uid(),
            nobody.uid(),
            "runner dir owned by the runner user"
        );
        let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
        let uid_line = status.lines().find(|l| l.starts_with("Uid:")).expect("Uid");
        assert!(
            uid_line
                .split_whitespace()
                .skip(1)
                .all(|u| u == nobody.uid().to_string()),
            "{uid_line}"
        );
    }

    let out = railgrid()
        .args(["agent", "status", "--json", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("status");
    assert!(out.status.success(), "{out:?}");
    let st: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(st["runner"]["pid"], pid);
    let out = agent_status(&host.state());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("agent:      running") && text.contains(&format!("pid {pid}")),
        "{text}"
    );
}

#[test]
fn a_killed_runner_is_restarted_and_the_status_says_why() {
    let host = Host::new();
    let _agent = host.start_agent();
    let first = host.wait_runner("the first runner", |_| true);
    sigkill(first);
    let second = host.wait_runner("a restarted runner", |st| st["runner"]["starts"] == 2);
    assert_ne!(first, second);
    let st = host.status();
    let err = st["runner"]["last_error"].as_str().expect("last_error");
    assert!(err.contains("signal 9"), "{err}");
}

#[test]
fn an_orphan_runner_of_a_killed_agent_is_reclaimed() {
    let host = Host::new();
    let mut first_agent = host.start_agent();
    let orphan = host.wait_runner("the first runner", |_| true);
    sigkill(first_agent.pid());
    let _ = first_agent.wait_output(LIMIT);
    assert!(alive(orphan), "the runner should outlive a SIGKILLed agent");

    let _agent = host.start_agent();
    let runner = host.wait_runner("a runner of the new agent", |st| {
        st["reclaimed_pids"]
            .as_array()
            .is_some_and(|a| a.iter().any(|p| p == orphan))
    });
    assert_ne!(runner, orphan);
    assert!(!alive(orphan), "orphan runner {orphan} survived");
    // Exactly one runner holds the lock: the new one.
    let lock = fs::read_to_string(host.state().join("runner/runner.lock")).expect("lock");
    assert_eq!(lock.trim(), runner.to_string());
    let out = agent_status(&host.state());
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains(&format!("reclaimed orphan runners: {orphan}")));
}

#[test]
fn sigterm_stops_the_runner_and_exits_zero() {
    let host = Host::new();
    let mut agent = host.start_agent();
    let runner = host.wait_runner("a runner", |_| true);
    agent.signal(Signal::SIGTERM);
    // Within the default 10 s stop grace, plus a margin.
    let out = agent.wait_output(Duration::from_secs(10) + Duration::from_secs(10));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!alive(runner), "runner {runner} survived the agent");
    assert!(live_in_group(runner).is_empty());
    assert!(!host.socket().exists(), "the socket was left behind");
    assert_eq!(host.status()["running"], false);
    let out = agent_status(&host.state());
    exited_saying(&out, 3, "agent not running");
}

#[test]
fn agent_secrets_never_reach_the_runner() {
    // The runner is non-dumpable: only root may read its environment.
    if !requires_root("reading the runner's /proc/<pid>/environ needs root") {
        return;
    }
    let host = Host::new();
    let child = host
        .agent_cmd(&[])
        .env("RAILGRID_HUB_TOKEN", "secret-hub-token")
        .env("AWS_SECRET_ACCESS_KEY", "secret-aws-key")
        .spawn()
        .expect("spawn");
    let _agent = Guard::new(child);
    let runner = host.wait_runner("a runner", |_| true);
    let environ = fs::read(format!("/proc/{runner}/environ")).expect("environ");
    let environ = String::from_utf8_lossy(&environ);
    assert!(
        !environ.contains("RAILGRID_HUB_TOKEN") && !environ.contains("secret"),
        "{environ}"
    );
    assert!(!environ.contains("AWS_SECRET_ACCESS_KEY"), "{environ}");
    let mut names: Vec<&str> = environ
        .split('\0')
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["HOME", "LOGNAME", "PATH", "USER"]);
}

#[test]
fn the_runner_log_is_private_and_capped() {
    let host = Host::new();
    let cap = 1024u64;
    let child = host
        .agent_cmd(&[])
        .env("RAILGRID_RUNNER_MAX_LOG_BYTES", cap.to_string())
        .env("RAILGRID_RUNNER_INITIAL_BACKOFF", "10ms")
        .spawn()
        .expect("spawn");
    let _agent = Guard::new(child);
    let log = host.path("logs/runner.log");
    // Each runner start logs a few lines: enough restarts rotate the log.
    for n in 1..=6 {
        let pid = host.wait_runner("a runner", |st| st["runner"]["starts"] == n);
        sigkill(pid);
    }
    host.wait_runner("the last runner", |st| st["runner"]["starts"] == 7);
    // The live log takes the last runner's lines; they pass through the agent's pipe
    // after the runner already answers, so they are waited for.
    wait_for_text(&log, "runner serving", Duration::from_secs(10));
    assert!(
        host.path("logs/runner.log.1").exists(),
        "six restarts should have rotated the log"
    );
    for p in [log.clone(), host.path("logs/runner.log.1")] {
        let meta = fs::metadata(&p).expect("log");
        assert!(
            meta.len() <= cap,
            "{} holds {} bytes, cap {cap}",
            p.display(),
            meta.len()
        );
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }
}

#[test]
fn a_second_runner_on_a_held_lock_fails_naming_the_holder() {
    let host = Host::new();
    let _agent = host.start_agent();
    let runner = host.wait_runner("a runner", |_| true);
    let mut cmd = railgrid();
    cmd.args(["runner", "run", "--state-dir"]).arg(host.state());
    if is_root() {
        let nobody = uzers::get_user_by_name("nobody").expect("nobody");
        cmd.uid(nobody.uid())
            .gid(nobody.primary_group_id())
            .env_clear();
    }
    let out = cmd.output().expect("run");
    let err = exited(&out, 1);
    assert!(
        err.contains(&format!("another runner (pid {runner}) holds")),
        "{err}"
    );
    // The running runner is untouched.
    assert_eq!(
        get_json(&host.socket(), "/v1/health").expect("health")["pid"],
        runner
    );
}

#[test]
fn the_runner_refuses_root() {
    if !requires_root("needs root") {
        return;
    }
    let host = Host::new();
    let out = railgrid()
        .args(["runner", "run", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("run");
    exited_saying(&out, 2, "refusing to run the runner as root");
}
