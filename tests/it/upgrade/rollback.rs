//! Rollbacks: a release that crashes or never gets healthy, an agent killed mid-switch, a hub away past the deadline.

use super::*;

/// The agent rolled back `version`: the restored agent runs the old build from the old
/// file, the hub halted the version (when it had sent it), and the agent remembers it as
/// bad.
fn assert_rolled_back(up: &Up, version: &str, why: &str) {
    assert_rolled_back_as(up, version, why, true);
}

pub(super) fn assert_rolled_back_as(up: &Up, version: &str, why: &str, halted_by_hub: bool) {
    let u = up.wait_upgrade("rolled_back");
    assert_eq!(u["target"], version);
    assert_says(&u, "error", why);
    up.assert_running(&builds().v1_version);
    assert_eq!(sha256_hex(&up.exe()), sha256_hex(&builds().v1));
    up.assert_clean_bin();
    let rec = up.record();
    assert_eq!(rec["upgrade"]["phase"], "rolled_back", "{rec}");
    assert_eq!(rec["bad_versions"][0]["version"], version, "{rec}");
    let hub = up.hub_upgrade("rolled_back");
    assert_eq!(hub["target"], version);
    let rel = up.releases();
    if !halted_by_hub {
        // Not a release the hub sent: nothing for the fleet to halt.
        assert_eq!(rel, serde_json::json!([]), "{rel}");
        return;
    }
    let halted = rel
        .as_array()
        .expect("list")
        .iter()
        .find(|r| r["version"] == version)
        .map(|r| r["halted"].clone())
        .expect("the release");
    assert_eq!(halted["agent"], "a1", "{rel}");
    assert_says(&halted, "reason", why);
}

#[test]
fn a_release_that_crashes_at_start_is_rolled_back_and_halted_for_the_fleet() {
    let mut up = Up::new();
    up.hub().enrol("a2");
    up.start_agent();
    let crash = script(
        up.dir.path(),
        "crash",
        "99.0.2",
        "echo crashing >&2\nexit 1",
    );
    up.release("99.0.2", &crash);
    let started = Instant::now();
    up.want("99.0.2");
    assert_rolled_back(&up, "99.0.2", "exited before it committed");
    eprintln!(
        "rolled back {:?} after the desired version was set",
        started.elapsed()
    );
    // An agent that has not started it is not offered it.
    let a2 = up.hub().admin_json(&["desired", "show", "--agent", "a2"]);
    assert_eq!(a2["effective"]["agent"], Value::Null, "{a2}");
    let list = up.hub().admin_ok(&["release", "list"]);
    assert!(
        list.contains("halted") && list.contains("rolled back by a1"),
        "{list}"
    );
    // Not retried while it is halted: the hub offers a1 no version either, and a desired
    // state applied after the halt (a label moves a1's generation) leaves it rolled back.
    up.hub().admin_ok(&["agent", "label", "a1", "seen=halt"]);
    let shown = up.hub().admin_json(&["desired", "show", "--agent", "a1"]);
    assert_eq!(shown["effective"]["agent"], Value::Null, "{shown}");
    let generation = shown["effective"]["generation"]
        .as_u64()
        .expect("generation");
    up.wait_agent("a1 applied the desired state after the halt", |st| {
        st["hub"]["generation"].as_u64() >= Some(generation)
    });
    assert_eq!(up.upgrade_state()["state"], "rolled_back");
    // Resumed at the hub, still bad here.
    up.hub().admin_ok(&["release", "resume", "99.0.2"]);
    let a2 = up.hub().admin_json(&["desired", "show", "--agent", "a2"]);
    assert_eq!(a2["effective"]["agent"]["version"], "99.0.2", "{a2}");
    let out = railgrid()
        .args(["agent", "upgrade", "--clear-bad", "--state-dir"])
        .arg(up.host.state())
        .output()
        .expect("clear-bad");
    succeeded(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("forgot 99.0.2"));
    assert_eq!(up.record()["bad_versions"], serde_json::json!([]));
}

#[test]
fn a_release_that_never_gets_healthy_is_rolled_back_at_the_deadline() {
    let mut up = Up::new();
    up.start_agent();
    // Runs, but never serves a runner: `agent run` just sleeps.
    let hang = script(up.dir.path(), "hang", "99.0.4", "exec sleep 600");
    up.release("99.0.4", &hang);
    up.want("99.0.4");
    assert_rolled_back(&up, "99.0.4", "did not commit by its deadline");
}

/// Starts the agent, asks for the second build, and freezes the agent (SIGSTOP) once
/// the record says `pending` (right after the rename; the re-exec comes after the
/// runner's stop), checking that it still runs the old bytes. Its pid.
pub(super) fn freeze_between_rename_and_re_exec(up: &mut Up) -> i32 {
    use std::os::unix::fs::MetadataExt;
    let pid = up.start_and_switch();
    kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("SIGSTOP");
    let exe = fs::metadata(format!("/proc/{pid}/exe")).expect("agent exe");
    let prev = fs::metadata(up.bin_dir().join("railgrid.prev")).expect(".prev");
    assert_eq!(exe.ino(), prev.ino(), "the agent has not re-executed yet");
    pid
}

#[test]
fn an_agent_killed_between_the_rename_and_the_re_exec_still_ends_on_a_verified_binary() {
    let mut up = Up::new();
    let pid = freeze_between_rename_and_re_exec(&mut up);
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("SIGKILL");
    up.agent.take().map(|mut g| g.wait_output(LIMIT));
    // Standalone, the watcher starts the agent once more, from the new, verified file.
    up.wait_upgrade("committed");
    up.assert_running(V2);
    up.assert_clean_bin();
}

/// Asks for V2, and stops the hub once the switch is under way: (its listen address,
/// its data dir).
fn hub_gone_after_the_switch(up: &mut Up) -> (String, PathBuf) {
    up.start_and_switch();
    let hub = up.hub.take().expect("hub");
    let (listen, dir) = (hub.listen.clone(), hub.dir.clone());
    hub.stop();
    // The new agent runs, healthy, and cannot reach its hub: it waits, it does not fail.
    up.wait_agent("the new agent healthy without its hub", |st| {
        st["version"] == V2
            && st["runner"]["state"] == "running"
            && st["upgrade"]["state"] == "pending_commit"
            && st["hub"]["last_error"].is_string()
    });
    (listen, dir)
}

#[test]
fn a_hub_down_past_the_deadline_delays_the_commit_and_fails_nothing() {
    let mut up = Up::new();
    let (listen, dir) = hub_gone_after_the_switch(&mut up);
    // Past the commit deadline (10 s here): healthy on the host, waiting for the hub.
    let deadline = up.record()["upgrade"]["deadline"]
        .as_u64()
        .expect("deadline");
    wait_for(Duration::from_secs(30), "the deadline passed", || {
        (unix_now() > deadline + 2).then_some(())
    });
    let rec = up.record();
    assert_eq!(rec["upgrade"]["phase"], "pending", "{rec}");
    assert!(rec["upgrade"]["healthy_at"].is_u64(), "{rec}");
    assert!(
        read_lossy(&up.host.path("logs/upgrade-watch.log"))
            .contains("waiting for the hub past the deadline"),
        "the watcher says why it waits"
    );
    let back = unix_now();
    up.hub = Some(TestHub::start_on(
        &dir,
        &listen,
        &["--release-key", &path_str(&up.key.public)],
    ));
    up.wait_upgrade("committed");
    let rec = up.record();
    assert!(
        rec["upgrade"]["finished_at"].as_u64().expect("finished_at") >= back,
        "committed only once the hub answered: {rec}"
    );
    up.assert_running(V2);
    up.assert_clean_bin();
    assert_eq!(up.releases()[0]["halted"], Value::Null);
}

#[test]
fn a_hub_away_past_its_bound_rolls_back_without_blame_and_halts_nothing() {
    let mut up = Up::new();
    up.env.push(("RAILGRID_UPGRADE_HUB_WAIT", "3s"));
    let (listen, dir) = hub_gone_after_the_switch(&mut up);
    let rec = wait_for(LIMIT, "the upgrade ended", || {
        let rec = up.record();
        (rec["upgrade"]["phase"] != "pending").then_some(rec)
    });
    assert_eq!(rec["upgrade"]["phase"], "aborted", "{rec}");
    assert_says(&rec["upgrade"], "reason", "rolled back without blame");
    up.assert_running(&builds().v1_version);
    assert_eq!(sha256_hex(&up.exe()), sha256_hex(&builds().v1));
    let rec = up.record();
    assert_eq!(
        rec["bad_versions"],
        serde_json::json!([]),
        "not remembered as bad: {rec}"
    );
    // The hub back once the restored agent's own proof window has passed (it gave the
    // hub 15 s to answer it, which would have blamed the version after all).
    let finished = rec["upgrade"]["finished_at"].as_u64().expect("finished_at");
    wait_for(Duration::from_secs(30), "the proof window passed", || {
        (unix_now() > finished + 16).then_some(())
    });
    // It hears of a failure, not of a rollback, and halts nothing.
    up.hub = Some(TestHub::start_on(
        &dir,
        &listen,
        &["--release-key", &path_str(&up.key.public)],
    ));
    // It hears of a failure, or already of the upgrade tried again, never of a rollback.
    let seen = wait_for(LIMIT, "the agent's report at the hub", || {
        let v = up.hub_agent();
        v["connected"].as_bool()?.then_some(())?;
        v["report"]["upgrade"]["state"].as_str().map(str::to_owned)
    });
    assert_ne!(seen, "rolled_back");
    let rel = up.releases();
    assert_eq!(rel[0]["version"], V2, "{rel}");
    assert_eq!(rel[0]["halted"], Value::Null, "{rel}");
}

/// The other side of a rollback without blame: the restored, previous binary reaches the
/// hub at once, so the hub was not what kept the new version from it. The version is
/// blamed after all (remembered as bad, reported rolled back, halted), and not retried.
#[test]
fn a_rollback_without_blame_is_blamed_when_the_previous_binary_reaches_the_hub_at_once() {
    let mut up = Up::new();
    up.env.push(("RAILGRID_UPGRADE_HUB_WAIT", "3s"));
    let (listen, dir) = hub_gone_after_the_switch(&mut up);
    wait_for(LIMIT, "the rollback without blame", || {
        (up.record()["upgrade"]["phase"] == "aborted").then_some(())
    });
    up.hub = Some(TestHub::start_on(
        &dir,
        &listen,
        &["--release-key", &path_str(&up.key.public)],
    ));
    let u = up.wait_upgrade("rolled_back");
    assert_says(&u, "error", "was at fault");
    let rec = up.record();
    assert_eq!(rec["upgrade"]["phase"], "rolled_back", "{rec}");
    assert_eq!(rec["bad_versions"][0]["version"], V2, "{rec}");
    up.hub_upgrade("rolled_back");
    let rel = up.releases();
    assert_eq!(rel[0]["halted"]["agent"], "a1", "{rel}");
    up.assert_running(&builds().v1_version);
}
