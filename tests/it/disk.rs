//! The runner on a full disk: its state dir on a real 20 MiB tmpfs that the test fills,
//! then frees. Needs root (to mount); says SKIPPED otherwise.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{json, Value};

use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(60);

/// A tmpfs mounted for one test and the runner on it. Dropping it stops the runner (SIGTERM:
/// it stops its jobs; SIGKILL after a grace), then unmounts, even when the test failed
/// half-way.
struct FullDisk {
    runner: Option<Guard>,
    // Unmounted after the runner is stopped and before the directory is removed.
    _mount: Mounted,
    dir: tempfile::TempDir,
}

impl FullDisk {
    fn mount() -> Self {
        let dir = tempdir();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let state = dir.path().join("state");
        fs::create_dir(&state).expect("mkdir state");
        let disk = Self {
            runner: None,
            _mount: Mounted::tmpfs(&state, "20m", "0711"),
            dir,
        };
        let runner = disk.runner_dir();
        fs::create_dir(&runner).expect("mkdir runner");
        fs::set_permissions(&runner, fs::Permissions::from_mode(0o700)).expect("chmod");
        let nobody = uzers::get_user_by_name("nobody").expect("nobody");
        std::os::unix::fs::chown(&runner, Some(nobody.uid()), Some(nobody.primary_group_id()))
            .expect("chown");
        disk
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn runner_dir(&self) -> PathBuf {
        self.state().join("runner")
    }

    fn socket(&self) -> PathBuf {
        self.runner_dir().join("runner.sock")
    }

    fn filler(&self) -> PathBuf {
        self.state().join("filler")
    }

    /// Starts the runner as nobody, one job at a time; its log goes beside the mount, not
    /// on it.
    fn start(&mut self) {
        let nobody = uzers::get_user_by_name("nobody").expect("nobody");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("runner.log"))
            .expect("runner log");
        let child = railgrid()
            .args(["runner", "run", "--max-jobs", "1", "--state-dir"])
            .arg(self.state())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("RAILGRID_LOG", "info")
            .uid(nobody.uid())
            .gid(nobody.primary_group_id())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn runner");
        let pid = child.id() as i32;
        self.runner = Some(Guard::new(child));
        wait_for(LIMIT, "the runner to answer", || {
            let h = get_json(&self.socket(), "/v1/health")?;
            (h["pid"] == pid).then_some(())
        });
    }

    fn kill_runner(&mut self, sig: Signal) {
        if let Some(mut runner) = self.runner.take() {
            runner.signal(sig);
            runner.wait_output(LIMIT);
        }
    }

    fn job(&self, id: &str) -> Value {
        get_json(&self.socket(), &format!("/v1/jobs/{id}")).expect("job")
    }

    fn health(&self) -> Value {
        get_json(&self.socket(), "/v1/health").expect("health")
    }

    fn log(&self) -> String {
        read_lossy(&self.dir.path().join("runner.log"))
    }

    fn cli(&self, args: &[&str]) -> Guard {
        let mut cmd = railgrid();
        cmd.arg("job").arg("--socket").arg(self.socket()).args(args);
        Guard::spawn_piped(&mut cmd, "railgrid job")
    }
}

fn state_of(v: &Value) -> &str {
    v["state"].as_str().unwrap_or("")
}

#[test]
fn job_ends_on_a_full_disk_are_held_shown_and_recorded_when_space_returns() {
    if !requires_root("mounting a tmpfs to fill needs root") {
        return;
    }
    let mut disk = FullDisk::mount();
    disk.start();
    let socket = disk.socket();
    let post = |spec: Value| {
        let (status, body) =
            http(&socket, "POST", "/v1/jobs", Some(&spec.to_string())).expect("POST /v1/jobs");
        (
            status,
            serde_json::from_str::<Value>(&body).unwrap_or(Value::Null),
        )
    };
    // `a` prints, then waits for the test to fill the disk and prints 10 MiB more; `b`
    // waits in the queue behind it (one job at a time).
    let (status, body) = post(json!({"id": "a", "argv": ["sh", "-c",
        "echo start; while [ ! -e go ]; do sleep 0.05; done; head -c 10485760 /dev/zero; exit 0"]}));
    assert_eq!(status, 201, "{body}");
    let (status, body) = post(json!({"id": "b", "argv": ["sh", "-c", "echo b-done"]}));
    assert_eq!(status, 201, "{body}");
    let spool = disk.runner_dir().join("jobs/a/stdout");
    wait_for_text(&spool, "start", LIMIT);

    fill(&disk.filler());
    fs::write(disk.runner_dir().join("work/a/go"), "").expect("create go");

    // The runner knows `a` ended and `b` left the queue; neither could be written.
    let a = wait_for(LIMIT, "a's end to be shown", || {
        let a = disk.job("a");
        (state_of(&a) == "succeeded").then_some(a)
    });
    assert_eq!(a["exit_code"], 0, "{a}");
    assert_eq!(a["commit_pending"], true, "{a}");
    let cut = a["output_truncated"]["stdout"].as_str().unwrap_or("");
    assert!(cut.contains("disk full writing"), "{a}");
    assert!(cut.contains(&spool.display().to_string()), "{a}");
    assert_eq!(a["stdout_truncated"], true, "{a}");
    // The spool holds what was written before the disk filled, and stops there.
    let kept = fs::metadata(&spool).expect("spool").len();
    assert!(read_lossy(&spool).starts_with("start\n"), "{a}");
    assert!(a["stdout_bytes"].as_u64() >= Some(kept), "{a}");
    let b = wait_for(LIMIT, "b's start to be shown", || {
        let b = disk.job("b");
        (state_of(&b) == "starting").then_some(b)
    });
    assert_eq!(b["commit_pending"], true, "{b}");

    // Health, list and status agree.
    let health = disk.health();
    let list = get_json(&socket, "/v1/jobs").expect("list");
    let listed: Vec<(&str, &str)> = list
        .as_array()
        .expect("array")
        .iter()
        .map(|j| (j["id"].as_str().unwrap_or(""), state_of(j)))
        .collect();
    assert_eq!(listed, [("b", "starting"), ("a", "succeeded")], "{list}");
    let active = listed
        .iter()
        .filter(|(_, s)| matches!(*s, "starting" | "running"))
        .count();
    assert_eq!(
        health["jobs_running"].as_u64(),
        Some(active as u64),
        "{health}"
    );
    assert!(health["commits_pending"].as_u64() >= Some(2), "{health}");
    let succeeded = get_json(&socket, "/v1/jobs?state=succeeded").expect("list");
    assert_eq!(succeeded.as_array().map(Vec::len), Some(1), "{succeeded}");
    assert_eq!(succeeded[0]["id"], "a", "{succeeded}");

    // A new job is refused: there is no room to record it.
    let (status, body) = post(json!({"argv": ["true"]}));
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["error"]["code"], "insufficient_storage", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("disk is full"), "{body}");
    assert!(
        message.contains(&disk.runner_dir().join("jobs.db").display().to_string()),
        "{body}"
    );
    let out = disk.cli(&["submit", "--", "true"]).wait_output(LIMIT);
    exited_saying(&out, 1, "disk is full");

    // Waiting and cancelling go on until the end is recorded, then report it.
    let mut wait = disk.cli(&["wait", "a"]);
    let mut cancel = disk.cli(&["cancel", "a"]);

    fs::remove_file(disk.filler()).expect("free the disk");
    let a = wait_for(LIMIT, "a's end to be recorded", || {
        let a = disk.job("a");
        (a["commit_pending"] == false).then_some(a)
    });
    assert_eq!(
        (state_of(&a), &a["exit_code"]),
        ("succeeded", &json!(0)),
        "{a}"
    );
    let out = wait.wait_output(LIMIT);
    assert_eq!(out.status.code(), Some(0), "job wait: {out:?}");
    let out = cancel.wait_output(LIMIT);
    assert_eq!(out.status.code(), Some(0), "job cancel: {out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "a succeeded");
    // `b` started once its start was recorded, and ran once.
    let b = wait_for(LIMIT, "b to end", || {
        let b = disk.job("b");
        (state_of(&b) == "succeeded" && b["commit_pending"] == false).then_some(b)
    });
    assert_eq!(
        read_lossy(&disk.runner_dir().join("jobs/b/stdout")),
        "b-done\n",
        "{b}"
    );
    wait_for(LIMIT, "nothing held", || {
        (disk.health()["commits_pending"] == 0).then_some(())
    });
    let (status, body) = post(json!({"id": "c", "argv": ["true"]}));
    assert_eq!(status, 201, "{body}");

    // What was recorded is durable: a runner killed now leaves nothing to call lost.
    disk.kill_runner(Signal::SIGKILL);
    disk.start();
    for (id, want) in [("a", "succeeded"), ("b", "succeeded")] {
        let rec = disk.job(id);
        assert_eq!(state_of(&rec), want, "{rec}");
        assert_eq!(rec["commit_pending"], false, "{rec}");
    }
    let log = disk.log();
    assert!(log.contains("holding them in memory"), "{log}");
    assert!(
        log.contains("every held job state change is now recorded"),
        "{log}"
    );
}

#[test]
fn a_full_hub_disk_is_said_to_be_full_and_a_change_goes_through_once_there_is_room() {
    let Some(disk) = Tmpfs::mount("16m", "0700") else {
        return;
    };
    let hub = TestHub::start(&disk.path.join("hub"), &[]);
    let filler = disk.path.join("filler");
    fill(&filler);
    let out = hub.admin(&["desired", "set", "--fleet", "--max-jobs", "2"]);
    let err = exited(&out, 1);
    assert!(err.contains("507") && err.contains("disk is full"), "{err}");
    let (code, body) = hub.curl(
        "PUT",
        "/v1/admin/desired/fleet",
        Some(&hub.admin_token()),
        Some(r#"{"set": {"max_jobs": 2}}"#),
    );
    assert_eq!(code, 507, "{body}");
    assert!(body.contains(r#""error""#), "{body}");
    fs::remove_file(&filler).expect("free");
    let shown = hub.admin_json(&["desired", "set", "--fleet", "--max-jobs", "2"]);
    assert_eq!(shown["settings"]["max_jobs"], 2, "{shown}");
}
