//! A binary replaced by hand, and faults of the switch and the watcher.

use super::rollback::{assert_rolled_back_as, freeze_between_rename_and_re_exec};
use super::*;

/// Replaces the agent's executable as a package manager does: a new file renamed over.
fn replace_by_hand(up: &Up, with: &Path) {
    let tmp = up.bin_dir().join(".railgrid.new");
    fs::copy(with, &tmp).expect("copy");
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::rename(&tmp, up.exe()).expect("rename");
}

#[test]
fn a_binary_replaced_by_hand_is_test_run_and_taken_in_lockstep() {
    let mut up = Up::new();
    up.start_agent();
    let old = sha256_hex(&up.exe());
    // A job runs: the agent drains, and takes the new file once the job is done.
    let marks = up.host.marks_dir();
    let gate = marks.join("go");
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done", gate.display());
    up.hub().admin_ok(&[
        "job", "submit", "--agent", "a1", "--id", "busy", "--", "sh", "-c", &script,
    ]);
    wait_for(LIMIT, "the job running", || {
        (up.hub().admin_json(&["job", "status", "busy"])["state"] == "running").then_some(())
    });
    replace_by_hand(&up, &builds().v2);
    let replaced = Instant::now();
    let u = up.wait_upgrade("draining");
    assert_eq!(u["target"], V2, "{u:#}");
    fs::write(&gate, "").expect("gate");
    up.wait_upgrade("committed");
    let busy = wait_for(LIMIT, "the job done at the hub", || {
        let v = up.hub().admin_json(&["job", "status", "busy"]);
        (v["done"] == true).then_some(v)
    });
    assert_eq!(busy["state"], "succeeded", "{busy:#}");
    eprintln!("replaced by hand, committed {:?} later", replaced.elapsed());
    up.assert_running(V2);
    assert_eq!(sha256_hex(&up.bin_dir().join("railgrid.prev")), old);
    up.assert_clean_bin();
    assert_eq!(up.record()["upgrade"]["kind"], "local");
}

#[test]
fn a_replaced_binary_that_fails_its_test_run_is_not_run_and_the_runner_keeps_the_pinned_bytes() {
    let mut up = Up::new();
    up.start_agent();
    let garbage = up.path("garbage");
    fs::write(&garbage, vec![0u8; 4096]).expect("garbage");
    replace_by_hand(&up, &garbage);
    let u = up.wait_upgrade("refused");
    assert_says(&u, "error", "test run");
    // A runner restart launches from the pinned bytes, not from the garbage.
    let st = up.status();
    let runner = st["runner"]["pid"].as_i64().expect("runner") as i32;
    kill(Pid::from_raw(runner), Signal::SIGKILL).expect("kill runner");
    let st = up.wait_agent("a new runner", |st| {
        st["runner"]["state"] == "running" && st["runner"]["pid"].as_i64() != Some(runner as i64)
    });
    let health = wait_for(LIMIT, "the new runner's health", || {
        let (code, body) = get(&up.host.socket(), "/v1/health")?;
        let v: Value = serde_json::from_str(&body).ok()?;
        (code == 200 && v["pid"] == st["runner"]["pid"]).then_some(v)
    });
    assert_eq!(health["version"], builds().v1_version.as_str());
    assert_eq!(st["version"], builds().v1_version.as_str());
    assert!(!up.bin_dir().join("railgrid.prev").exists());
}

#[test]
fn a_binary_replaced_by_hand_that_crashes_at_start_is_rolled_back() {
    let mut up = Up::new();
    up.start_agent();
    let crash = script(up.dir.path(), "crash", "99.0.5", "exit 3");
    replace_by_hand(&up, &crash);
    assert_rolled_back_as(&up, "99.0.5", "exited before it committed", false);
}

#[test]
fn a_watcher_that_dies_during_the_commit_window_is_started_again_from_the_previous_binary() {
    let mut up = Up::new();
    up.start_agent();
    up.offer_v2();
    // Held in the commit window: no answer from the hub counts until it is back.
    let first = wait_for(LIMIT, "the new agent waiting to commit", || {
        let rec = up.record();
        let pid = rec["upgrade"]["watcher_pid"].as_i64()?;
        (rec["upgrade"]["phase"] == "pending").then_some(pid as i32)
    });
    kill(Pid::from_raw(first), Signal::SIGKILL).expect("kill the watcher");
    let second = wait_for(LIMIT, "another watcher", || {
        let pid = up.record()["upgrade"]["watcher_pid"].as_i64()? as i32;
        (pid != first && alive(pid)).then_some(pid)
    });
    let exe = fs::read_link(format!("/proc/{second}/exe")).expect("watcher exe");
    assert!(
        exe.to_string_lossy().contains("railgrid.prev"),
        "the watcher runs the previous binary: {}",
        exe.display()
    );
    up.wait_upgrade("committed");
    wait_for(LIMIT, "the second watcher exits", || {
        (!alive(second)).then_some(())
    });
    up.assert_running(V2);
    up.assert_clean_bin();
}

#[test]
fn an_agent_stopped_during_the_switch_puts_the_previous_binary_back_and_exits() {
    let mut up = Up::new();
    let pid = up.start_and_switch();
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM");
    let out = up.agent.take().expect("agent").wait_output(LIMIT);
    assert!(out.status.success(), "a clean stop: {:?}", out.status);
    let rec = up.record();
    assert_eq!(rec["upgrade"]["phase"], "aborted", "{rec}");
    assert_eq!(
        rec["bad_versions"],
        serde_json::json!([]),
        "not the version's fault"
    );
    assert_eq!(
        sha256_hex(&up.exe()),
        sha256_hex(&builds().v1),
        "the previous binary is back"
    );
    let watcher = rec["upgrade"]["watcher_pid"].as_i64().expect("watcher") as i32;
    wait_for(LIMIT, "the watcher exits", || {
        (!alive(watcher)).then_some(())
    });
    assert!(!alive(pid), "the agent stayed stopped");
    assert_eq!(up.bin_entries(), ["railgrid"]);
    // Started again, it reports why and takes the upgrade.
    up.start_agent();
    up.wait_upgrade("committed");
    up.assert_running(V2);
}

#[test]
fn a_new_binary_changed_in_place_before_the_re_exec_is_never_run() {
    let mut up = Up::new();
    let pid = freeze_between_rename_and_re_exec(&mut up);
    // Written into the very file that was verified (not renamed over it).
    let marker = up.path("ran");
    let evil = format!(
        "#!/bin/sh\necho ran > {}\nexec {} \"$@\"\n",
        marker.display(),
        builds().v2.display()
    );
    fs::write(up.exe(), evil).expect("overwrite in place");
    kill(Pid::from_raw(pid), Signal::SIGCONT).expect("SIGCONT");
    let out = up.agent.take().expect("agent").wait_output(LIMIT);
    assert!(
        !out.status.success(),
        "the agent refuses to re-execute: {:?} {}",
        out.status,
        read_lossy(&up.path("agent.stderr"))
    );
    assert!(!marker.exists(), "the changed bytes never ran");
    let rec = up.record();
    assert_eq!(rec["upgrade"]["phase"], "aborted", "{rec}");
    assert_eq!(
        sha256_hex(&up.exe()),
        sha256_hex(&builds().v1),
        "the previous binary is back"
    );
    assert_eq!(up.bin_entries(), ["railgrid"]);
    let log = read_lossy(&up.path("agent.stderr"));
    assert!(log.contains("changed after it was verified"), "{log}");
}
