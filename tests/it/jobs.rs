//! The runner's job engine through its real API and the `railgrid job` CLI: real
//! processes, real SQLite, real sockets.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{json, Value};

use crate::support::*;

const LIMIT: Duration = Duration::from_secs(30);

struct Runner {
    dir: tempfile::TempDir,
    guard: Option<Guard>,
}

fn as_runner_user(cmd: &mut Command) {
    if is_root() {
        let nobody = uzers::get_user_by_name("nobody").expect("nobody");
        cmd.uid(nobody.uid()).gid(nobody.primary_group_id());
    }
}

/// Gives the runner account the runner directory (as the agent does).
fn chown_runner_dir(dir: &Path) {
    if !is_root() {
        return;
    }
    let nobody = uzers::get_user_by_name("nobody").expect("nobody");
    let (uid, gid) = (nobody.uid(), nobody.primary_group_id());
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid)).expect("chown");
        if p.is_dir() && !p.is_symlink() {
            stack.extend(
                fs::read_dir(&p)
                    .expect("read_dir")
                    .flatten()
                    .map(|e| e.path()),
            );
        }
    }
}

impl Runner {
    fn new() -> Self {
        Self::in_dir(tempdir())
    }

    /// A runner's state dir in `dir` (which a test may have mounted something on).
    fn in_dir(dir: tempfile::TempDir) -> Self {
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let runner_dir = dir.path().join("state/runner");
        fs::create_dir_all(&runner_dir).expect("mkdir");
        fs::set_permissions(dir.path().join("state"), fs::Permissions::from_mode(0o711))
            .expect("chmod");
        fs::set_permissions(&runner_dir, fs::Permissions::from_mode(0o700)).expect("chmod");
        chown_runner_dir(&runner_dir);
        Self { dir, guard: None }
    }

    fn started(extra: &[&str]) -> Self {
        let mut r = Self::new();
        r.start(extra);
        r
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

    fn start(&mut self, extra: &[&str]) {
        let mut cmd = railgrid();
        cmd.args(["runner", "run", "--state-dir"])
            .arg(self.state())
            .args(extra)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("RUNNER_SECRET", "runner-secret-value")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_runner_user(&mut cmd);
        let child = cmd.spawn().expect("spawn runner");
        let pid = child.id() as i32;
        self.guard = Some(Guard::new(child));
        wait_for(LIMIT, "the runner to answer", || {
            let h = get_json(&self.socket(), "/v1/health")?;
            (h["pid"] == pid).then_some(())
        });
    }

    fn submit(&self, spec: Value) -> (u16, Value) {
        let (status, body) = http(&self.socket(), "POST", "/v1/jobs", Some(&spec.to_string()))
            .expect("POST /v1/jobs");
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    fn job(&self, id: &str) -> Value {
        get_json(&self.socket(), &format!("/v1/jobs/{id}")).expect("job")
    }

    fn wait(&self, id: &str) -> Value {
        wait_for(LIMIT, &format!("job {id} to end"), || {
            let rec = get_json(
                &self.socket(),
                &format!("/v1/jobs/{id}/wait?timeout_secs=5"),
            )?;
            let state = rec["state"].as_str()?;
            (!matches!(state, "queued" | "starting" | "running")).then_some(rec)
        })
    }

    fn output(&self, id: &str, stream: &str) -> String {
        get(&self.socket(), &format!("/v1/jobs/{id}/output/{stream}"))
            .expect("output")
            .1
    }

    fn cli(&self) -> Command {
        let mut cmd = railgrid();
        cmd.arg("job").arg("--socket").arg(self.socket());
        cmd
    }
}

fn submit_ok(r: &Runner, spec: Value) -> String {
    let (status, body) = r.submit(spec);
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().expect("id").to_owned()
}

#[test]
fn output_and_exit_code_round_trip_and_ids_are_idempotent() {
    let r = Runner::started(&[]);
    let spec = json!({"id": "round-trip", "argv": ["sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3"]});
    let id = submit_ok(&r, spec.clone());
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "failed");
    assert_eq!(rec["exit_code"], 3);
    assert_eq!(rec["signal"], Value::Null);
    assert_eq!(r.output(&id, "stdout"), "to-stdout\n");
    assert_eq!(r.output(&id, "stderr"), "to-stderr\n");
    assert_eq!(rec["stdout_bytes"], 10);

    let (status, body) = r.submit(spec);
    assert_eq!(status, 200, "identical resubmission: {body}");
    assert_eq!(body["id"], "round-trip");
    let (status, body) = r.submit(json!({"id": "round-trip", "argv": ["true"]}));
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
    // A conflicting resubmission with a bad cwd is still a conflict, and leaves the
    // existing job's workspace alone.
    let ws = r.runner_dir().join("work/round-trip");
    assert!(ws.is_dir());
    let (status, body) =
        r.submit(json!({"id": "round-trip", "argv": ["true"], "cwd": "no-such-dir"}));
    assert_eq!(status, 409, "{body}");
    assert!(ws.is_dir(), "the existing job's workspace was removed");
    let (status, _) = get(&r.socket(), "/v1/jobs/no-such-job").expect("get");
    assert_eq!(status, 404);
}

#[test]
fn hostile_specs_are_refused_and_the_environment_is_a_baseline() {
    let r = Runner::started(&[]);
    let (status, body) = r.submit(json!({"argv": ["true"], "env": {"LD_PRELOAD": "/tmp/evil.so"}}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_spec");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("LD_PRELOAD"),
        "{body}"
    );

    let (status, body) = r.submit(json!({"argv": ["true"], "cwd": "../../etc"}));
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("outside the workspace root"),
        "{body}"
    );

    // A symlink inside the workspace root that points out of it.
    let link = r.runner_dir().join("work/escape");
    std::os::unix::fs::symlink("/etc", &link).expect("symlink");
    let (status, body) = r.submit(json!({"argv": ["true"], "cwd": "../escape"}));
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("passes through a symlink"),
        "{body}"
    );

    let (status, body) = r.submit(json!({"argv": []}));
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("argv"),
        "{body}"
    );
    let (status, _) = http(&r.socket(), "POST", "/v1/jobs", Some("{not json")).expect("post");
    assert_eq!(status, 400);

    let id = submit_ok(&r, json!({"argv": ["env"], "env": {"JOB_VAR": "1"}}));
    r.wait(&id);
    let out = r.output(&id, "stdout");
    let mut names: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "HOME",
            "JOB_VAR",
            "LANG",
            "PATH",
            "RAILGRID_JOB_ID",
            "TMPDIR"
        ],
        "{out}"
    );
    assert!(!out.contains("runner-secret-value"), "{out}");
    assert!(
        out.contains(&format!(
            "HOME={}",
            r.runner_dir().join("work").join(&id).display()
        )),
        "{out}"
    );
}

fn tree_script() -> &'static str {
    r#"for i in $(seq 20); do sleep 1000 & done
       sh -c 'trap "" TERM; exec sleep 1000' &
       echo ready; wait"#
}

fn assert_no_survivors(r: &Runner, rec: &Value) {
    let pid = rec["pid"].as_i64().expect("pid") as i32;
    let survivors = live_in_group(pid);
    assert!(
        survivors.is_empty(),
        "survivors of job group {pid}: {survivors:?} ({})",
        r.dir.path().display()
    );
}

#[test]
fn a_timed_out_tree_is_killed_whole() {
    let r = Runner::started(&[]);
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", tree_script()], "timeout_secs": 1, "kill_grace_secs": 1}),
    );
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "timed_out", "{rec}");
    assert_eq!(r.output(&id, "stdout"), "ready\n");
    assert_no_survivors(&r, &rec);
}

#[test]
fn a_wait_until_started_returns_a_silent_job_once_it_runs() {
    let r = Runner::started(&[]);
    // Silent: no output wakes a waiter, only the recorded start. A waiter that missed it
    // would be answered when the job ends, with the job over.
    let id = submit_ok(&r, json!({"argv": ["sleep", "20"]}));
    let rec = get_json(
        &r.socket(),
        &format!("/v1/jobs/{id}/wait?until=started&timeout_secs=60"),
    )
    .expect("wait");
    assert_eq!(rec["state"], "running", "{rec}");
    let (status, body) = http(
        &r.socket(),
        "GET",
        &format!("/v1/jobs/{id}/wait?until=soon"),
        None,
    )
    .expect("wait");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("use started or ended"), "{body}");
}

#[test]
fn a_cancelled_tree_is_killed_whole() {
    let r = Runner::started(&[]);
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", tree_script()], "kill_grace_secs": 1}),
    );
    wait_for(LIMIT, "the job to be ready", || {
        (r.output(&id, "stdout") == "ready\n").then_some(())
    });
    let pid = r.job(&id)["pid"].as_i64().expect("pid") as i32;
    wait_for(LIMIT, "22 processes in the job's group", || {
        (live_in_group(pid).len() >= 22).then_some(())
    });
    let out = r.cli().args(["cancel", &id]).output().expect("cancel");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{id} cancelled")
    );
    let rec = r.job(&id);
    assert_eq!(rec["state"], "cancelled");
    assert_no_survivors(&r, &rec);
}

#[test]
fn a_killed_runner_leaves_a_lost_job_and_its_output() {
    let mut r = Runner::started(&[]);
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "echo written-before-the-crash; sleep 1000 & exec sleep 1000"]}),
    );
    wait_for(LIMIT, "output", || {
        (r.output(&id, "stdout") == "written-before-the-crash\n").then_some(())
    });
    let pid = r.job(&id)["pid"].as_i64().expect("pid") as i32;
    let runner_pid = r.guard.as_ref().expect("runner").pid();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(runner_pid), Signal::SIGKILL)
        .expect("kill -9");
    let _ = r.guard.take().expect("runner").wait_output(LIMIT);
    assert!(alive(pid), "the job outlives a SIGKILLed runner");

    r.start(&[]);
    // Ended in the background: the runner serves first.
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "lost", "{rec}");
    assert!(
        rec["error"]
            .as_str()
            .expect("error")
            .contains("process group was killed"),
        "{rec}"
    );
    assert!(
        live_in_group(pid).is_empty(),
        "the orphaned job group survived"
    );
    assert_eq!(r.output(&id, "stdout"), "written-before-the-crash\n");
}

#[test]
fn a_recycled_pid_is_never_signalled() {
    use railgrid::proto::job::JobSpec;
    use railgrid::runner::store::Store;
    let mut r = Runner::new();
    // A live process that is not the job: same pid as the record, another start time.
    let bystander = Guard::new(Command::new("sleep").arg("1000").spawn().expect("sleep"));
    {
        let store = Store::open(&r.runner_dir().join("jobs.db")).expect("store");
        let spec = JobSpec::from_argv(["sleep", "1000"]);
        store.insert("recycled", &spec).wait().expect("insert");
        store.mark_starting("recycled", 0).wait().expect("starting");
        let real = railgrid::sys::process_start_time(
            railgrid::sys::ProcessId::new(bystander.pid()).expect("pid"),
        );
        store
            .mark_running(
                "recycled",
                bystander.pid(),
                Some(real.expect("start time") + 1),
                "process-group",
            )
            .wait()
            .expect("running");
    }
    chown_runner_dir(&r.runner_dir());
    r.start(&[]);
    let rec = r.wait("recycled");
    assert_eq!(rec["state"], "lost");
    assert!(
        rec["error"]
            .as_str()
            .expect("error")
            .contains("already gone"),
        "{rec}"
    );
    assert!(
        alive(bystander.pid()),
        "a process with a recycled pid was signalled"
    );
}

#[test]
fn admission_runs_at_most_max_jobs_in_fifo_order() {
    let r = Runner::started(&["--max-jobs", "2"]);
    let ids: Vec<String> = (1..=5)
        .map(|i| {
            submit_ok(
                &r,
                json!({"id": format!("fifo-{i}"), "argv": ["sleep", "0.3"]}),
            )
        })
        .collect();
    let recs: Vec<Value> = ids.iter().map(|id| r.wait(id)).collect();
    let span = |rec: &Value| {
        (
            rec["started_ms"].as_i64().expect("started"),
            rec["finished_ms"].as_i64().expect("finished"),
        )
    };
    let spans: Vec<(i64, i64)> = recs.iter().map(span).collect();
    for rec in &recs {
        assert_eq!(rec["state"], "succeeded", "{rec}");
    }
    // At no job's start were more than two jobs running.
    let max_overlap = spans
        .iter()
        .map(|&(start, _)| {
            spans
                .iter()
                .filter(|&&(s, f)| s <= start && start < f)
                .count()
        })
        .max()
        .expect("spans");
    assert_eq!(max_overlap, 2, "{spans:?}");
    assert!(
        spans.windows(2).all(|w| w[0].0 <= w[1].0),
        "not FIFO: {spans:?}"
    );
}

#[test]
fn a_full_queue_answers_429() {
    let r = Runner::started(&["--max-jobs", "1", "--max-queued", "2"]);
    for i in 0..3 {
        submit_ok(
            &r,
            json!({"id": format!("hold-{i}"), "argv": ["sleep", "1000"]}),
        );
    }
    wait_for(LIMIT, "one job running", || {
        (r.job("hold-0")["state"] == "running").then_some(())
    });
    let (status, body) = r.submit(json!({"argv": ["true"]}));
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "queue_full");
    // Cancelling a queued job frees a place.
    assert!(r
        .cli()
        .args(["cancel", "hold-2"])
        .output()
        .expect("cancel")
        .status
        .success());
    assert_eq!(r.submit(json!({"argv": ["true"]})).0, 201);
}

#[test]
fn output_beyond_the_cap_is_counted_and_dropped_without_blocking() {
    let r = Runner::started(&["--max-output-bytes", "1048576"]);
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "head -c 104857600 /dev/zero; echo done >&2"]}),
    );
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "succeeded", "{rec}");
    // The record counts what the job produced; the spool keeps the cap.
    assert_eq!(rec["stdout_bytes"], 104857600, "{rec}");
    assert_eq!(rec["stdout_truncated"], true);
    assert_eq!(rec["stderr_bytes"], 5);
    assert_eq!(rec["stderr_truncated"], false);
    assert_eq!(
        rec["output_truncated"],
        json!({"stdout": "cap of 1048576 bytes reached"}),
        "{rec}"
    );
    let file = r.runner_dir().join("jobs").join(&id).join("stdout");
    assert_eq!(fs::metadata(&file).expect("spool").len(), 1048576);
    let listed = get_json(&r.socket(), "/v1/jobs").expect("list");
    assert_eq!(listed[0]["stdout_bytes"], 104857600, "{listed}");
    // Reading the output follows the spool, not the count: the next offset stops at what
    // was kept, and that is complete.
    let resp = raw_get(
        &r.socket(),
        &format!("/v1/jobs/{id}/output/stdout?offset=1048000"),
    );
    assert!(resp.contains("x-next-offset: 1048576"), "{resp}");
    assert!(resp.contains("x-complete: true"), "{resp}");
    assert_eq!(
        fs::metadata(&file).expect("spool").permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(r.output(&id, "stderr"), "done\n");
}

#[test]
fn submit_wait_behaves_like_running_the_program() {
    let r = Runner::started(&[]);
    let out = r
        .cli()
        .args([
            "submit",
            "--wait",
            "--",
            "sh",
            "-c",
            "echo out-line; echo err-line >&2; exit 7",
        ])
        .output()
        .expect("submit");
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out-line\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err-line\n");

    let out = r
        .cli()
        .args(["submit", "--wait", "--timeout", "1s", "--", "sleep", "1000"])
        .output()
        .expect("submit");
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("timed out after 1s"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");

    let out = r
        .cli()
        .args(["submit", "--env", "LD_AUDIT=x", "--", "true"])
        .output()
        .expect("submit");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn runner_shutdown_stops_running_jobs_and_keeps_queued_ones() {
    let mut r = Runner::started(&["--max-jobs", "1"]);
    submit_ok(
        &r,
        json!({"id": "long", "argv": ["sh", "-c", tree_script()], "kill_grace_secs": 1}),
    );
    submit_ok(
        &r,
        json!({"id": "waiting", "argv": ["echo", "ran-after-restart"]}),
    );
    wait_for(LIMIT, "the long job to run", || {
        (r.output("long", "stdout") == "ready\n").then_some(())
    });
    let pid = r.job("long")["pid"].as_i64().expect("pid") as i32;
    let mut guard = r.guard.take().expect("runner");
    guard.signal(Signal::SIGTERM);
    let out = guard.wait_output(LIMIT);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        live_in_group(pid).is_empty(),
        "the job group survived runner shutdown"
    );

    r.start(&["--max-jobs", "1"]);
    let rec = r.job("long");
    assert_eq!(rec["state"], "cancelled");
    assert!(
        rec["error"]
            .as_str()
            .expect("error")
            .contains("shutting down"),
        "{rec}"
    );
    r.wait("waiting");
    assert_eq!(r.output("waiting", "stdout"), "ran-after-restart\n");
}

#[test]
fn per_owner_limits_let_other_owners_pass() {
    let r = Runner::started(&["--max-jobs", "2", "--max-jobs-per-owner", "1"]);
    submit_ok(
        &r,
        json!({"id": "alice-1", "owner": "alice", "argv": ["sleep", "1000"]}),
    );
    submit_ok(
        &r,
        json!({"id": "alice-2", "owner": "alice", "argv": ["true"]}),
    );
    submit_ok(&r, json!({"id": "bob-1", "owner": "bob", "argv": ["true"]}));
    // bob's job overtakes alice's second one: alice is at her limit.
    assert_eq!(r.wait("bob-1")["state"], "succeeded");
    assert_eq!(r.job("alice-2")["state"], "queued");
    let out = r
        .cli()
        .args(["list", "--owner", "alice", "--json"])
        .output()
        .expect("list");
    let list: Value = serde_json::from_slice(&out.stdout).expect("json");
    let ids: Vec<&str> = list
        .as_array()
        .expect("array")
        .iter()
        .map(|j| j["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["alice-2", "alice-1"], "newest first, alice only");
    assert!(r
        .cli()
        .args(["cancel", "alice-1"])
        .output()
        .expect("cancel")
        .status
        .success());
    assert_eq!(r.wait("alice-2")["state"], "succeeded");
}

#[test]
fn rlimits_apply_and_are_reported() {
    let r = Runner::started(&[]);
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "ulimit -n; ulimit -t"], "limits": {"open_files": 64, "cpu_secs": 7}}),
    );
    let rec = r.wait(&id);
    assert_eq!(r.output(&id, "stdout"), "64\n7\n");
    // Landlock joins where the kernel has it.
    let confinement = rec["confinement"].as_str().expect("confinement");
    assert!(
        ["process-group+rlimits", "process-group+rlimits+landlock"].contains(&confinement),
        "{rec}"
    );

    // The same limits from the command line.
    let out = r
        .cli()
        .args([
            "submit",
            "--open-files",
            "48",
            "--cpu-secs",
            "5",
            "--wait",
            "--",
        ])
        .args(["sh", "-c", "ulimit -n; ulimit -t"])
        .output()
        .expect("job submit");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "48\n5\n");
}

#[test]
fn logs_follow_streams_until_the_job_ends() {
    let r = Runner::started(&[]);
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "for i in 1 2 3; do echo line-$i; sleep 0.2; done"]}),
    );
    let out = r
        .cli()
        .args(["logs", "--follow", &id])
        .output()
        .expect("logs");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "line-1\nline-2\nline-3\n"
    );
    let (status, body) = get(
        &r.socket(),
        &format!("/v1/jobs/{id}/output/stdout?offset=7&limit=7"),
    )
    .expect("slice");
    assert_eq!((status, body.as_str()), (200, "line-2\n"));
}

#[test]
fn finished_jobs_beyond_the_retention_bound_are_deleted_with_their_files() {
    let r = Runner::started(&["--max-finished-jobs", "2"]);
    for i in 1..=4 {
        let id = submit_ok(
            &r,
            json!({"id": format!("keep-{i}"), "argv": ["echo", format!("output-{i}")]}),
        );
        r.wait(&id);
    }
    wait_for(LIMIT, "the oldest jobs to be deleted", || {
        (get(&r.socket(), "/v1/jobs/keep-2").map(|(s, _)| s) == Some(404)).then_some(())
    });
    assert_eq!(get(&r.socket(), "/v1/jobs/keep-1").expect("get").0, 404);
    assert!(
        !r.runner_dir().join("jobs/keep-1").exists(),
        "spool files of a deleted job remain"
    );
    assert!(
        !r.runner_dir().join("work/keep-1").exists(),
        "workspace of a deleted job remains"
    );
    assert_eq!(r.output("keep-4", "stdout"), "output-4\n");
    assert_eq!(r.job("keep-3")["state"], "succeeded");
}

#[test]
fn logs_prints_all_output_past_one_slice() {
    let r = Runner::started(&[]);
    // 10 MiB: more than the 8 MiB one request returns.
    let id = submit_ok(&r, json!({"argv": ["head", "-c", "10485760", "/dev/zero"]}));
    assert_eq!(r.wait(&id)["stdout_bytes"], 10485760);
    let out = r.cli().args(["logs", &id]).output().expect("logs");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout.len(), 10485760);
    let (status, body) = r.submit(json!({"argv": ["true"], "kill_grace_secs": 100000}));
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("kill_grace_secs"),
        "{body}"
    );
}

#[test]
fn a_job_spawned_but_not_yet_recorded_is_found_and_killed_after_a_crash() {
    use railgrid::proto::job::JobSpec;
    use railgrid::runner::store::Store;
    let mut r = Runner::new();
    {
        let store = Store::open(&r.runner_dir().join("jobs.db")).expect("store");
        store
            .insert("unrecorded", &JobSpec::from_argv(["sleep", "1000"]))
            .wait()
            .expect("insert");
        store
            .mark_starting("unrecorded", 0)
            .wait()
            .expect("starting");
    }
    chown_runner_dir(&r.runner_dir());
    // The process a dead runner spawned but never recorded: its own group, the runner's
    // account, the job id in its environment.
    let mut cmd = Command::new("sleep");
    cmd.arg("1000")
        .env_clear()
        .env("RAILGRID_JOB_ID", "unrecorded")
        .process_group(0);
    as_runner_user(&mut cmd);
    let orphan = Guard::new(cmd.spawn().expect("spawn"));
    // A process of the same account with another job's marker is left alone.
    let mut cmd = Command::new("sleep");
    cmd.arg("1000")
        .env_clear()
        .env("RAILGRID_JOB_ID", "another-job")
        .process_group(0);
    as_runner_user(&mut cmd);
    let bystander = Guard::new(cmd.spawn().expect("spawn"));

    r.start(&[]);
    let rec = r.wait("unrecorded");
    assert_eq!(rec["state"], "lost", "{rec}");
    assert!(
        rec["error"].as_str().expect("error").contains("killed"),
        "{rec}"
    );
    assert!(!alive(orphan.pid()), "the unrecorded job process survived");
    assert!(alive(bystander.pid()));

    let (status, body) = r.submit(json!({"argv": ["true"], "env": {"RAILGRID_JOB_ID": "x"}}));
    assert_eq!(status, 400, "{body}");
}

#[test]
fn a_job_starts_clean_and_a_failed_launch_names_its_cause() {
    let r = Runner::started(&[]);
    // Each check runs as the job's own process, right after the runner's exec: a shell in
    // between would show its own state (dash blocks every signal around its vfork, and a
    // child that reads the shell's status can catch it so).
    let run = |argv: Value| {
        let id = submit_ok(&r, json!({ "argv": argv }));
        let rec = r.wait(&id);
        assert_eq!(rec["state"], "succeeded", "{rec}");
        r.output(&id, "stdout")
    };
    // No signal is blocked or ignored (the runner ignores SIGPIPE and blocks signals while
    // it launches).
    let status = run(json!(["grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"]));
    assert!(status.contains("SigBlk:\t0000000000000000"), "{status}");
    assert!(status.contains("SigIgn:\t0000000000000000"), "{status}");
    // Only stdin, stdout and stderr are open, plus the directory `ls` opens to list.
    let fds = run(json!(["ls", "/proc/self/fd"]));
    assert_eq!(
        fds.lines().collect::<Vec<_>>(),
        ["0", "1", "2", "3"],
        "{fds}"
    );
    // The job leads its session.
    let ids = run(json!(["sh", "-c", "ps -o sid= -p $$; echo $$"]));
    let ids: Vec<&str> = ids.lines().map(str::trim).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids[0], ids[1], "session id and pid");

    let id = submit_ok(&r, json!({"argv": ["no-such-program-anywhere"]}));
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "failed", "{rec}");
    let err = rec["error"].as_str().expect("error");
    assert!(
        err.contains("no-such-program-anywhere") && err.contains("not found in PATH"),
        "{err}"
    );

    // A file that is executable but no program: the step that failed is named.
    let ws = r.runner_dir().join("work/not-a-program");
    fs::create_dir_all(&ws).expect("mkdir");
    fs::write(ws.join("data"), [0u8; 64]).expect("write");
    fs::set_permissions(ws.join("data"), fs::Permissions::from_mode(0o755)).expect("chmod");
    chown_runner_dir(&ws);
    let (status, body) = r.submit(json!({"id": "not-a-program", "argv": ["./data"]}));
    assert_eq!(status, 201, "{body}");
    let rec = r.wait("not-a-program");
    let err = rec["error"].as_str().expect("error");
    assert!(
        err.contains("execve failed") && err.contains("./data"),
        "{err}"
    );
}

/// Starts the runner as nobody inside `cgroup` (a directory of a delegated one).
fn start_runner_in(r: &mut Runner, cgroup: &Path) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_railgrid"));
    cmd.args(["runner", "run", "--state-dir"])
        .arg(r.state())
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    let mut cmd = in_cgroup(&cmd, cgroup, Some("nobody"));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn runner");
    let pid = child.id() as i32;
    r.guard = Some(Guard::new(child));
    wait_for(LIMIT, "the runner to answer", || {
        let h = get_json(&r.socket(), "/v1/health")?;
        (h["pid"] == pid).then_some(())
    });
}

/// A job script whose escapee leaves the process group (setsid) and ignores SIGTERM:
/// only the job's cgroup can still reach it.
const ESCAPE_SCRIPT: &str = r#"setsid sh -c 'trap "" TERM; echo $$ > escaped.pid; exec sleep 1000' &
    while [ ! -s escaped.pid ]; do sleep 0.01; done; echo ready; wait"#;

/// The job's record once its start is in it. The runner records a start without waiting
/// for the write (the job runs either way), so a job's process may be running a moment
/// before its record says `running` with its confinement: on a loaded machine the escapee
/// wrote its pid first, and a record read then had no confinement yet.
fn started_record(r: &Runner, id: &str) -> Value {
    wait_for(LIMIT, &format!("job {id}'s start recorded"), || {
        let rec = r.job(id);
        rec["confinement"].is_string().then_some(rec)
    })
}

fn escaped_pid(r: &Runner, id: &str) -> i32 {
    let file = r.runner_dir().join("work").join(id).join("escaped.pid");
    wait_for(LIMIT, "the escapee to write its pid", || {
        fs::read_to_string(&file).ok()?.trim().parse().ok()
    })
}

#[test]
fn the_cgroup_tier_kills_processes_that_left_the_group() {
    let Some(cg) = DelegatedCgroup::new("kill", Some("nobody")) else {
        return;
    };
    let mut r = Runner::new();
    start_runner_in(&mut r, &cg.dir);
    let health = get_json(&r.socket(), "/v1/health").expect("health");
    assert_eq!(health["confinement"], "cgroup", "{health}");
    // The runner moved itself into a leaf, so the delegated cgroup can enable controllers.
    let leaf = fs::read_to_string(cg.dir.join("runner/cgroup.procs")).expect("runner leaf");
    assert_eq!(leaf.trim(), health["pid"].to_string(), "{leaf}");

    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", ESCAPE_SCRIPT], "kill_grace_secs": 1}),
    );
    let escapee = escaped_pid(&r, &id);
    let job_cg = cg.dir.join(format!("job-{id}"));
    let members = fs::read_to_string(job_cg.join("cgroup.procs")).expect("job cgroup");
    assert!(
        members.lines().any(|l| l.trim() == escapee.to_string()),
        "{members}"
    );
    let rec = started_record(&r, &id);
    assert!(
        rec["confinement"]
            .as_str()
            .expect("confinement")
            .starts_with("cgroup"),
        "{rec}"
    );

    let (status, body) =
        http(&r.socket(), "POST", &format!("/v1/jobs/{id}/cancel"), None).expect("cancel");
    assert_eq!(status, 200, "{body}");
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "cancelled", "{rec}");
    assert!(!alive(escapee), "the escapee {escapee} survived its job");
    assert!(!job_cg.exists(), "{} was not removed", job_cg.display());
    assert_no_survivors(&r, &rec);

    // Limits the host's controllers can enforce become the job cgroup's files.
    let controllers = fs::read_to_string(cg.dir.join("cgroup.subtree_control")).unwrap_or_default();
    if controllers.contains("pids") {
        let id = submit_ok(
            &r,
            json!({"argv": ["sh", "-c", "cat /proc/self/cgroup; sleep 1000"], "limits": {"processes": 50}}),
        );
        let job_cg = cg.dir.join(format!("job-{id}"));
        let max = wait_for(LIMIT, "the job cgroup", || {
            fs::read_to_string(job_cg.join("pids.max")).ok()
        });
        assert_eq!(max.trim(), "50");
        assert!(started_record(&r, &id)["confinement"]
            .as_str()
            .expect("c")
            .contains("pids.max"));
        http(&r.socket(), "POST", &format!("/v1/jobs/{id}/cancel"), None).expect("cancel");
        r.wait(&id);
    } else {
        eprintln!("note: no pids controller delegated here; limits stay rlimits");
    }
}

#[test]
fn a_restarted_runner_kills_what_a_killed_one_left_in_a_job_cgroup() {
    let Some(cg) = DelegatedCgroup::new("crash", Some("nobody")) else {
        return;
    };
    let mut r = Runner::new();
    start_runner_in(&mut r, &cg.dir);
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", ESCAPE_SCRIPT], "kill_grace_secs": 1}),
    );
    let escapee = escaped_pid(&r, &id);
    wait_for(LIMIT, "the job to run", || {
        (r.job(&id)["state"] == "running").then_some(())
    });
    r.guard.as_ref().expect("runner").signal(Signal::SIGKILL);
    r.guard = None;
    assert!(alive(escapee));

    // Where a restart must go once the delegated cgroup may have controllers enabled.
    start_runner_in(&mut r, &cg.dir.join("runner"));
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "lost", "{rec}");
    assert!(
        rec["error"]
            .as_str()
            .expect("error")
            .contains("cgroup was killed"),
        "{rec}"
    );
    assert!(!alive(escapee), "the escapee {escapee} survived");
    assert!(!cg.dir.join(format!("job-{id}")).exists());
}

/// Unmounts (lazily) when dropped, then removes the mount point (a temp dir whose own
/// removal failed while it was mounted): declared before the runner, so that it goes after.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn mount_tmpfs(at: &Path, size: &str) {
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={size},mode=0755"))
        .arg("tmpfs")
        .arg(at)
        .status()
        .expect("mount");
    assert!(ok.success(), "mount tmpfs at {}", at.display());
}

/// The runner's Landlock rules name the entries beside the path to its state dir; it once
/// held a descriptor on each for its whole life, so a file system mounted beside them
/// could not be unmounted ("target is busy") and a file deleted there kept its space.
#[test]
fn the_runner_pins_no_file_system_or_file_beside_its_state_dir() {
    if !is_root() {
        eprintln!("SKIPPED: mounting file systems needs root");
        return;
    }
    let dir = tempdir();
    mount_tmpfs(dir.path(), "64m");
    let _outer = Unmount(dir.path().to_owned());
    let sibling = dir.path().join("sibling");
    fs::create_dir(&sibling).expect("mkdir");
    mount_tmpfs(&sibling, "1m");
    let _inner = Unmount(sibling.clone());
    let big = dir.path().join("big");
    fs::write(&big, vec![7u8; 32 << 20]).expect("big file");
    let top = dir.path().to_owned();
    let free = || {
        let s = nix::sys::statvfs::statvfs(&top).expect("statvfs");
        s.blocks_available() as u64 * s.fragment_size() as u64
    };
    let mut r = Runner::in_dir(dir);
    r.start(&[]);
    let health = get_json(&r.socket(), "/v1/health").expect("health");
    if !health["isolation"]
        .as_str()
        .unwrap_or_default()
        .starts_with("landlock")
    {
        eprintln!("SKIPPED: this kernel offers no Landlock (health: {health})");
        return;
    }
    // A job: its ruleset is built from those entries.
    let id = submit_ok(&r, json!({"argv": ["true"]}));
    assert_eq!(r.wait(&id)["state"], "succeeded");

    let out = Command::new("umount")
        .arg(&sibling)
        .output()
        .expect("umount");
    assert!(
        out.status.success(),
        "the sibling file system could not be unmounted while the runner runs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = free();
    fs::remove_file(&big).expect("rm");
    // The kernel frees an ended job's Landlock domain (which refers to the inode) a moment
    // later, from a work queue.
    wait_for(
        Duration::from_secs(10),
        "the deleted file's space back",
        || (free() >= before + (30 << 20)).then_some(()),
    );
    // And jobs still run, kept out of the state dir as before.
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "cat ../../api.token 2>/dev/null || echo denied"]}),
    );
    r.wait(&id);
    assert_eq!(r.output(&id, "stdout"), "denied\n");
}

#[test]
fn landlock_keeps_a_job_out_of_the_state_dir_and_other_workspaces_and_its_signals_in() {
    let r = Runner::started(&[]);
    let health = get_json(&r.socket(), "/v1/health").expect("health");
    let isolation = health["isolation"].as_str().unwrap_or_default().to_owned();
    if !isolation.starts_with("landlock") {
        eprintln!("skipped: this kernel offers no Landlock (health: {health})");
        return;
    }
    let runner_pid = health["pid"].as_i64().expect("pid");
    let earlier = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "echo another-jobs-output"], "env": {"TOKEN": "s3cret"}}),
    );
    r.wait(&earlier);
    let dir = r.runner_dir();
    // A file of the agent's beside the runner's directory, readable by anyone.
    let agent_file = r.state().join("agent-note");
    fs::write(&agent_file, "agent").expect("agent file");
    fs::set_permissions(&agent_file, fs::Permissions::from_mode(0o644)).expect("chmod");
    // A directory that appears beside the state dir after the runner started is usable.
    let late = r.dir.path().join("late");
    fs::create_dir(&late).expect("late dir");
    fs::write(late.join("file"), "late").expect("late file");
    fs::set_permissions(late.join("file"), fs::Permissions::from_mode(0o644)).expect("chmod");
    // Each probe prints its name only if it got through.
    let probes = format!(
        "cat {db} >/dev/null 2>&1 && echo READ_DB; \
         cat {spool} >/dev/null 2>&1 && echo READ_OTHER_OUTPUT; \
         ls {dir} >/dev/null 2>&1 && echo LISTED_RUNNER_DIR; \
         cat /proc/{pid}/environ >/dev/null 2>&1 && echo READ_RUNNER_ENVIRON; \
         kill -0 {pid} 2>/dev/null && echo SIGNALLED_RUNNER; \
         echo kept > here && cat here; \
         cat /etc/passwd >/dev/null && echo READ_ETC; \
         cat {late}/file >/dev/null && echo READ_LATE; \
         ls {work} >/dev/null 2>&1 && echo LISTED_WORK; \
         cat {dir}/api.token >/dev/null 2>&1 && echo READ_TOKEN; \
         cat {agent_file} >/dev/null 2>&1 && echo READ_AGENT_FILE; \
         echo x > {dir}/work/{earlier}/planted 2>/dev/null && echo PLANTED; \
         ls {dir}/work/{earlier} >/dev/null 2>&1 && echo LISTED_OTHER_WORKSPACE; \
         {exe} job --socket {dir}/runner.sock list >/dev/null 2>&1 && echo USED_API; \
         true",
        db = dir.join("jobs.db").display(),
        spool = dir.join("jobs").join(&earlier).join("stdout").display(),
        dir = dir.display(),
        work = dir.join("work").display(),
        pid = runner_pid,
        exe = env!("CARGO_BIN_EXE_railgrid"),
        agent_file = agent_file.display(),
        late = late.display(),
    );
    let id = submit_ok(&r, json!({"argv": ["sh", "-c", probes]}));
    let rec = r.wait(&id);
    let out = r.output(&id, "stdout");
    assert_eq!(rec["state"], "succeeded", "{rec} {out}");
    assert!(
        rec["confinement"]
            .as_str()
            .is_some_and(|c| c.contains("landlock")),
        "{rec}"
    );
    for line in ["kept", "READ_ETC", "READ_LATE"] {
        assert!(
            out.contains(line),
            "the job lost ordinary access ({line}): {out}"
        );
    }
    for line in [
        "READ_DB",
        "READ_OTHER_OUTPUT",
        "LISTED_RUNNER_DIR",
        "READ_RUNNER_ENVIRON",
        "READ_TOKEN",
        "USED_API",
        "READ_AGENT_FILE",
        "PLANTED",
        "LISTED_OTHER_WORKSPACE",
        "LISTED_WORK",
    ] {
        assert!(!out.contains(line), "{line}: {out}");
    }
    if isolation == "landlock+signals" {
        assert!(!out.contains("SIGNALLED_RUNNER"), "{out}");
    }
    // A job whose cwd is another workspace (a shared checkout) may work there.
    let shared = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "echo shared > file && cat file"], "cwd": format!("../{earlier}")}),
    );
    assert_eq!(r.wait(&shared)["state"], "succeeded");
    assert_eq!(r.output(&shared, "stdout"), "shared\n");
}

#[cfg(target_os = "linux")]
#[test]
fn the_runner_cannot_be_inspected_by_its_own_account() {
    if !is_root() {
        eprintln!("skipped: needs root, to run the runner as another account");
        return;
    }
    let r = Runner::started(&[]);
    let pid = get_json(&r.socket(), "/v1/health").expect("health")["pid"].clone();
    // The kernel gives /proc/<pid> of a non-dumpable process to root: the runner's own
    // account (and so every job) can no longer read its environ, memory or descriptors.
    let environ = fs::metadata(format!("/proc/{pid}/environ")).expect("environ");
    assert_eq!(
        environ.uid(),
        0,
        "/proc/{pid}/environ belongs to the runner's account"
    );
}

#[test]
fn the_job_api_answers_only_clients_with_the_token() {
    let r = Runner::started(&[]);
    let sock = r.socket();
    // Health stays open: the agent and operators probe it with plain curl.
    let (status, _) = http_with(&sock, "GET", "/v1/health", None, None).expect("health");
    assert_eq!(status, 200);
    for (method, path) in [
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs/x"),
    ] {
        for token in [None, Some("0".repeat(64))] {
            let (status, body) =
                http_with(&sock, method, path, Some("{}"), token.as_deref()).expect("request");
            assert_eq!(status, 401, "{method} {path}: {body}");
            assert!(body.contains("\"unauthorized\""), "{body}");
        }
    }
    let token = fs::read_to_string(r.runner_dir().join("api.token")).expect("token");
    let mode = fs::metadata(r.runner_dir().join("api.token"))
        .expect("token")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let (status, body) = http_with(&sock, "GET", "/v1/jobs", None, Some(&token)).expect("list");
    assert_eq!(status, 200, "{body}");
    // A client that cannot read the token says which file it needed.
    let token_path = r.runner_dir().join("api.token");
    let aside = r.runner_dir().join("api.token.aside");
    fs::rename(&token_path, &aside).expect("move the token aside");
    let out = r.cli().arg("list").output().expect("job list");
    fs::rename(&aside, &token_path).expect("put the token back");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("could not read the runner's API token"),
        "{err}"
    );
    assert!(r.cli().arg("list").status().expect("job list").success());
}

#[test]
fn silent_and_unauthorized_connections_cannot_exhaust_the_runner() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let r = Runner::started(&[]);
    let sock = r.socket();
    // Without the token even health is answered on a connection that is then closed.
    let mut s = UnixStream::connect(&sock).expect("connect");
    s.set_read_timeout(Some(LIMIT)).expect("timeout");
    write!(s, "GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("write");
    let mut resp = String::new();
    s.read_to_string(&mut resp)
        .expect("the runner closes the connection");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(
        resp.to_ascii_lowercase().contains("connection: close"),
        "{resp}"
    );

    // A silent connection is closed by the runner after a few seconds (5; hyper's own
    // default would be 30).
    let mut silent = UnixStream::connect(&sock).expect("connect");
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut buf = [0u8; 1];
    assert_eq!(silent.read(&mut buf).expect("closed, not timed out"), 0);

    if !is_root() || !cfg!(target_os = "linux") {
        eprintln!(
            "skipped the connection cap: needs root (whose clients the cap spares) and /proc"
        );
        return;
    }
    let pid = get_json(&sock, "/v1/health").expect("health")["pid"].clone();
    let fds = || fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let before = fds();
    // A job (never root) opens more connections than the runner serves at once (256) and
    // holds them. perl is part of every Debian system (perl-base is Essential).
    let flood = "use IO::Socket::UNIX; my @s; \
        for (1..300) { my $c = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => $ARGV[0]) or last; push @s, $c } \
        print 'opened ', scalar(@s), \"\\n\"; STDOUT->flush; sleep 120;";
    let id = submit_ok(&r, json!({"argv": ["perl", "-e", flood, path_str(&sock)]}));
    let opened = wait_for(LIMIT, "the flood to connect", || {
        let out = r.output(&id, "stdout");
        out.contains('\n').then_some(out)
    });
    let cancel = || http(&sock, "POST", &format!("/v1/jobs/{id}/cancel"), None);
    if opened.trim() != "opened 300" {
        eprintln!("skipped the connection cap: the job could not connect ({opened})");
        let _ = cancel();
        return;
    }
    let most = (0..200).map(|_| fds()).max().unwrap_or(0);
    assert!(
        most < before + 256 + 16 + 16, // served, refusals being answered, slack
        "{most} descriptors, {before} before 300 connections"
    );
    // Root's clients are not crowded out: the listing answers while the flood holds on.
    let out = r.cli().arg("list").output().expect("job list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(cancel().expect("cancel").0, 200);
    assert_eq!(r.wait(&id)["state"], "cancelled");
}

#[test]
fn a_client_follows_the_token_of_a_restarted_runner() {
    let mut r = Runner::started(&[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = railgrid::runner::client::Client::new(&r.socket());
    rt.block_on(client.list("")).expect("list");
    let first = fs::read_to_string(r.runner_dir().join("api.token")).expect("token");
    let mut old = r.guard.take().expect("runner");
    old.signal(Signal::SIGTERM);
    let _ = old.wait_output(LIMIT);
    r.start(&[]);
    let second = fs::read_to_string(r.runner_dir().join("api.token")).expect("token");
    assert_ne!(first, second, "a restarted runner has a new token");
    rt.block_on(client.list(""))
        .expect("list after the restart");
}

#[test]
fn a_client_over_the_connection_limit_is_told_why_and_root_still_gets_in() {
    if !is_root() {
        eprintln!("skipped: needs root, to run clients as the runner's account and as root");
        return;
    }
    let r = Runner::started(&["--max-api-connections", "1"]);
    let nobody = uzers::get_user_by_name("nobody").expect("nobody");
    let as_runner = |cmd: &mut Command| {
        cmd.uid(nobody.uid()).gid(nobody.primary_group_id());
    };
    let id = submit_ok(&r, json!({"argv": ["sleep", "1000"]}));
    // The runner's account holds the one connection with a long poll.
    let mut waiter = r.cli();
    waiter
        .args(["wait", &id])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    as_runner(&mut waiter);
    let _waiter = Guard::new(waiter.spawn().expect("job wait"));
    // Another client of that account is refused, and told why.
    let refused = wait_for(LIMIT, "a client to be refused", || {
        let mut list = r.cli();
        list.arg("list");
        as_runner(&mut list);
        let out = list.output().expect("job list");
        (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned())
    });
    assert!(refused.contains("limit of 1 API connections"), "{refused}");
    // Root's clients are not counted.
    let out = r.cli().arg("list").output().expect("job list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, _) =
        http(&r.socket(), "POST", &format!("/v1/jobs/{id}/cancel"), None).expect("cancel");
    assert_eq!(status, 200);
}

/// One GET with the token, returning the whole response, headers included (lower-cased
/// header names, as hyper sends them).
fn raw_get(socket: &Path, path: &str) -> String {
    raw_request(socket, "GET", path)
}

/// [`raw_get`] with any method.
fn raw_request(socket: &Path, method: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let token = fs::read_to_string(socket.with_file_name("api.token")).expect("token");
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("connect");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: 0\r\nAuthorization: Bearer {}\r\n\r\n",
        token.trim()
    )
    .expect("write");
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).expect("read");
    String::from_utf8_lossy(&resp).to_lowercase()
}

#[test]
fn bad_query_values_get_the_json_invalid_query_error_naming_the_parameter() {
    let r = Runner::started(&[]);
    let id = submit_ok(&r, json!({"argv": ["echo", "hi"]}));
    r.wait(&id);
    let cases = [
        (format!("/v1/jobs/{id}/output/stdout?offset=-1"), "offset"),
        (format!("/v1/jobs/{id}/output/stdout?limit=0"), "limit"),
        (
            format!("/v1/jobs/{id}/output/stdout?limit=8388609"),
            "limit",
        ),
        (format!("/v1/jobs/{id}/output/stdout?follow=yes"), "follow"),
        ("/v1/jobs?before=abc".to_owned(), "before"),
        ("/v1/jobs?limit=0".to_owned(), "limit"),
        ("/v1/jobs?limit=100000".to_owned(), "limit"),
        ("/v1/jobs?limit=-5".to_owned(), "limit"),
        ("/v1/jobs?state=sleeping".to_owned(), "sleeping"),
        // Seqs start at 1: a `before` below can match nothing.
        ("/v1/jobs?before=0".to_owned(), "before"),
        ("/v1/jobs?before=-1".to_owned(), "before"),
        ("/v1/jobs?owner=no%20such%20owner".to_owned(), "owner"),
        ("/v1/jobs?owner=".to_owned(), "owner"),
        (
            format!("/v1/jobs/{id}/wait?timeout_secs=-1"),
            "timeout_secs",
        ),
        (
            format!("/v1/jobs/{id}/wait?timeout_secs=3601"),
            "timeout_secs",
        ),
    ];
    for (path, needle) in cases {
        let (status, body) = get(&r.socket(), &path).expect("GET");
        assert_eq!(status, 400, "{path}: {body}");
        let body: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{path}: not the JSON error ({e}): {body}"));
        assert_eq!(body["error"]["code"], "invalid_query", "{path}: {body}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains(needle), "{path}: {message}");
    }
    // The bounds themselves are accepted.
    for path in [
        "/v1/jobs?before=1".to_owned(),
        "/v1/jobs?before=9223372036854775807&owner=default".to_owned(),
        "/v1/jobs?limit=1".to_owned(),
        "/v1/jobs?limit=1000".to_owned(),
        format!("/v1/jobs/{id}/wait?timeout_secs=0"),
        format!("/v1/jobs/{id}/output/stdout?limit=8388608"),
    ] {
        let (status, body) = get(&r.socket(), &path).expect("GET");
        assert_eq!(status, 200, "{path}: {body}");
    }
}

/// The JSON error of a response, or a panic naming what came instead.
fn json_error(what: &str, status: u16, body: &str) -> (u16, String, String) {
    let v: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{what}: {status} without the JSON error ({e}): {body:?}"));
    let code = v["error"]["code"].as_str().expect("code").to_owned();
    let message = v["error"]["message"].as_str().expect("message").to_owned();
    (status, code, message)
}

#[test]
fn wrong_methods_and_unknown_routes_get_the_json_error() {
    let r = Runner::started(&[]);
    let id = submit_ok(&r, json!({"argv": ["true"]}));
    for (method, path, allowed) in [
        ("DELETE", "/v1/jobs".to_owned(), "get"),
        ("PUT", format!("/v1/jobs/{id}"), "get"),
        ("GET", format!("/v1/jobs/{id}/cancel"), "post"),
        ("POST", format!("/v1/jobs/{id}/wait"), "get"),
        ("DELETE", "/v1/admission".to_owned(), "put"),
    ] {
        let what = format!("{method} {path}");
        let resp = raw_request(&r.socket(), method, &path);
        assert!(resp.starts_with("http/1.1 405"), "{what}: {resp}");
        let (head, body) = resp.split_once("\r\n\r\n").expect("head");
        let allow = head
            .lines()
            .find_map(|l| l.strip_prefix("allow: "))
            .unwrap_or_else(|| panic!("{what}: no allow header: {head}"));
        assert!(allow.contains(allowed), "{what}: {allow}");
        // raw_request lower-cases the response.
        let (_, code, message) = json_error(&what, 405, body);
        assert_eq!(code, "method_not_allowed", "{what}");
        assert!(
            message.contains(&method.to_lowercase()),
            "{what}: {message}"
        );
    }
    for (method, path) in [
        ("GET", "/v1/nope"),
        ("POST", "/v1/jobs/x/y/z"),
        ("GET", "/"),
    ] {
        let what = format!("{method} {path}");
        let (status, body) = http(&r.socket(), method, path, None).expect("request");
        let (status, code, message) = json_error(&what, status, &body);
        assert_eq!((status, code.as_str()), (404, "not_found"), "{what}");
        assert!(message.contains(path), "{what}: {message}");
    }
    // A body over the bound: the JSON error too. Written beside the read, since the
    // runner answers before it has read all of it.
    {
        use std::io::{Read, Write};
        let token = fs::read_to_string(r.runner_dir().join("api.token")).expect("token");
        let mut s = std::os::unix::net::UnixStream::connect(r.socket()).expect("connect");
        let mut w = s.try_clone().expect("clone");
        let len = 2 * 1024 * 1024 + 1;
        let writer = std::thread::spawn(move || {
            let _ = write!(
                w,
                "POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Length: {len}\r\n\r\n",
                token.trim()
            );
            let _ = w.write_all(&vec![b' '; len]);
        });
        let mut resp = Vec::new();
        let _ = s.read_to_end(&mut resp);
        let _ = s.shutdown(std::net::Shutdown::Both);
        writer.join().expect("writer");
        let resp = String::from_utf8_lossy(&resp);
        assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
        let body = resp.split_once("\r\n\r\n").expect("head").1;
        let (_, code, message) = json_error("a large body", 413, body);
        assert_eq!(code, "too_large");
        assert!(message.contains("2097152"), "{message}");
    }
    // Without the token, still the token's error first, and in JSON.
    for (method, path) in [("DELETE", "/v1/jobs"), ("GET", "/v1/nope")] {
        let (status, body) = http_with(&r.socket(), method, path, None, None).expect("request");
        let (status, code, _) = json_error(path, status, &body);
        assert_eq!((status, code.as_str()), (401, "unauthorized"), "{path}");
    }
}

#[test]
fn what_exec_cannot_take_is_refused_at_submission_naming_it() {
    let r = Runner::started(&[]);
    // Linux's MAX_ARG_STRLEN: 128 KiB per string, its NUL included.
    const STRLEN: usize = 128 * 1024;
    let refused = |spec: Value, needle: &str| {
        let (status, body) = r.submit(spec);
        assert_eq!(status, 400, "{needle}: {body}");
        assert_eq!(body["error"]["code"], "invalid_spec", "{body}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains(needle), "{needle}: {message}");
        assert!(
            message.len() < 400,
            "the message repeats the value: {message}"
        );
    };
    refused(
        json!({"argv": ["true"], "env": {"BIG": "x".repeat(200 * 1024)}}),
        "variable BIG",
    );
    refused(
        json!({"argv": ["true"], "env": {"BIG": "x".repeat(STRLEN - "BIG=".len())}}),
        "variable BIG",
    );
    refused(json!({"argv": ["echo", "x".repeat(STRLEN)]}), "argv[1]");
    // Each string fits; all together are more than the runner passes to exec.
    let env: serde_json::Map<String, Value> = (0..9)
        .map(|i| (format!("V{i}"), json!("x".repeat(120 * 1024))))
        .collect();
    refused(json!({"argv": ["true"], "env": env}), "1048576");

    // What is accepted, exec takes: the longest single strings, and nearly all of the
    // total, reach the program whole.
    let id = submit_ok(
        &r,
        json!({
            "argv": ["sh", "-c", "echo ${#BIG} ${#1}", "sh", "y".repeat(STRLEN - 1)],
            "env": {"BIG": "x".repeat(STRLEN - 1 - "BIG=".len())},
        }),
    );
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "succeeded", "{rec}");
    assert_eq!(
        r.output(&id, "stdout"),
        format!("{} {}\n", STRLEN - 5, STRLEN - 1)
    );
    let env: serde_json::Map<String, Value> = (0..8)
        .map(|i| (format!("V{i}"), json!("x".repeat(STRLEN - 100))))
        .collect();
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "echo ${#V0} ${#V7}"], "env": env}),
    );
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "succeeded", "{rec}");
    assert_eq!(
        r.output(&id, "stdout"),
        format!("{} {}\n", STRLEN - 100, STRLEN - 100)
    );
}

#[test]
fn echoed_client_values_are_cut_short() {
    let r = Runner::started(&[]);
    // Within hyper's 64 KiB bound on a request's URI, which it answers itself (414).
    let long = "o".repeat(60_000);
    let short = |what: &str, message: &str| {
        assert!(message.len() < 400, "{what}: {} bytes", message.len());
        assert!(message.contains("o…"), "{what}: {message}");
    };
    for spec in [
        json!({"argv": ["true"], "owner": format!("{long}!")}),
        json!({"argv": ["true"], "id": format!("{long}!")}),
        json!({"argv": ["true"], "env": {format!("{long}="): "x"}}),
        json!({"argv": ["true"], "env": {format!("LD_{long}"): "x"}}),
    ] {
        let (status, body) = r.submit(spec);
        assert_eq!(status, 400);
        short(
            "submission",
            body["error"]["message"].as_str().expect("message"),
        );
    }
    for path in [
        format!("/v1/jobs/{long}"),
        format!("/v1/jobs/{long}/wait"),
        format!("/v1/jobs?owner={long}!"),
        format!("/v1/jobs?state={long}"),
    ] {
        let (status, body) = get(&r.socket(), &path).expect("GET");
        let (_, _, message) = json_error(&path[..20], status, &body);
        short(&path[..20], &message);
    }
}

#[test]
fn limits_too_small_to_start_a_shell_are_refused_and_the_minimums_run_one() {
    let r = Runner::started(&[]);
    // The minimums once documented: neither lets `sh` start.
    for (limits, needle) in [
        (json!({"open_files": 3}), "at least 16"),
        (json!({"open_files": 15}), "at least 16"),
        (json!({"memory_bytes": 1048576}), "at least 8388608"),
    ] {
        let (status, body) = r.submit(json!({"argv": ["true"], "limits": limits}));
        assert_eq!(status, 400, "{limits}: {body}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains(needle), "{limits}: {message}");
    }
    // A shell runs with both at their minimum, redirections included (dash moves the
    // descriptor it saves to 10 or above).
    let id = submit_ok(
        &r,
        json!({
            "argv": ["sh", "-c", "echo ok >/dev/null && echo ok"],
            "limits": {"open_files": 16, "memory_bytes": 8388608},
        }),
    );
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "succeeded", "{rec}");
    assert_eq!(r.output(&id, "stdout"), "ok\n");
}

#[test]
fn glibc_unsecure_variables_are_refused_by_name_and_tmpdir_may_be_chosen() {
    let r = Runner::started(&[]);
    for name in ["GLIBC_TUNABLES", "TZDIR", "LOCALDOMAIN"] {
        let (status, body) = r.submit(json!({
            "argv": ["true"],
            "env": {name: "glibc.malloc.mxfast=0"},
        }));
        assert_eq!(status, 400, "{name}: {body}");
        assert_eq!(body["error"]["code"], "invalid_spec", "{body}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains(name), "{name}: {message}");
    }
    let tmp = r.runner_dir().join("work/chosen-tmp");
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "echo TMPDIR=$TMPDIR"], "env": {"TMPDIR": path_str(&tmp)}}),
    );
    r.wait(&id);
    assert_eq!(
        r.output(&id, "stdout"),
        format!("TMPDIR={}\n", tmp.display())
    );
}

/// The attack of a job on another job's cwd: a directory on the way to that cwd is
/// swapped, as fast as a thread can, with a symlink to the state directory. A path that is
/// checked and then resolved again lands some jobs in `<state>/runner`, with its API token
/// and database; resolved once by descriptor, none.
#[cfg(target_os = "linux")]
#[test]
fn a_cwd_swapped_with_a_symlink_never_lands_a_job_in_the_state_dir() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let r = Runner::started(&[]);
    let token = fs::read_to_string(r.runner_dir().join("api.token")).expect("token");
    let attack = submit_ok(&r, json!({"id": "attack", "argv": ["true"]}));
    r.wait(&attack);
    let ws = r.runner_dir().join("work/attack");
    // `x/runner` exists for real, with a decoy token, so a cwd through `x` passes every
    // check while `x` is the directory; swapped, `x/runner` is `<state>/runner`.
    fs::create_dir_all(ws.join("x/runner")).expect("mkdir");
    fs::write(ws.join("x/runner/api.token"), "decoy\n").expect("decoy");
    std::os::unix::fs::symlink(r.state(), ws.join("y")).expect("symlink");
    chown_runner_dir(&ws);

    /// Swaps `x` and `y` until dropped (also when the test fails, before its files go).
    struct Swapper {
        stop: Arc<AtomicBool>,
        swaps: Arc<AtomicU64>,
        thread: Option<std::thread::JoinHandle<()>>,
    }
    impl Drop for Swapper {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let thread = {
        let (stop, swaps, ws) = (stop.clone(), swaps.clone(), ws.clone());
        std::thread::spawn(move || {
            let (x, y) = (ws.join("x"), ws.join("y"));
            while !stop.load(Ordering::Relaxed) {
                let swapped = nix::fcntl::renameat2(
                    nix::fcntl::AT_FDCWD,
                    &x,
                    nix::fcntl::AT_FDCWD,
                    &y,
                    nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                );
                if swapped.is_err() {
                    break;
                }
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let swapper = Swapper {
        stop,
        swaps,
        thread: Some(thread),
    };
    let mut accepted = Vec::new();
    let mut refused = 0;
    for i in 0..60 {
        let id = format!("victim-{i}");
        let (status, body) = r.submit(json!({
            "id": id, "argv": ["cat", "api.token"], "cwd": "../attack/x/runner",
        }));
        match status {
            201 => accepted.push(id),
            400 => refused += 1,
            _ => panic!("submission {id}: {status} {body}"),
        }
    }
    let mut decoys = 0;
    for id in &accepted {
        let rec = r.wait(id);
        let out = r.output(id, "stdout");
        assert!(
            !out.contains(token.trim()),
            "job {id} read the runner's API token from its cwd: {rec}"
        );
        if out == "decoy\n" {
            decoys += 1;
        } else {
            // Refused at its start instead: the symlink was there when it was opened.
            let error = rec["error"].as_str().unwrap_or_default();
            assert!(
                rec["state"] == "failed" && error.contains("field cwd"),
                "job {id}: {rec}"
            );
        }
    }
    let swaps = swapper.swaps.load(Ordering::Relaxed);
    drop(swapper);
    assert!(swaps > 0, "the swapper never swapped");
    eprintln!(
        "{} accepted ({decoys} ran in the real directory), {refused} refused, {swaps} swaps",
        accepted.len(),
    );
}

/// The client's own process, its stdout and stderr read line by line on threads, so the
/// test can wait for a line with a deadline.
struct Client {
    guard: Guard,
    out: std::sync::mpsc::Receiver<String>,
    err: std::sync::mpsc::Receiver<String>,
    err_seen: Vec<String>,
}

fn lines_of(pipe: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

impl Client {
    fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn client");
        let out = lines_of(child.stdout.take().expect("stdout"));
        let err = lines_of(child.stderr.take().expect("stderr"));
        Self {
            guard: Guard::new(child),
            out,
            err,
            err_seen: Vec::new(),
        }
    }

    fn wait_line(&self, want: &str) {
        let line = self
            .out
            .recv_timeout(LIMIT)
            .unwrap_or_else(|_| panic!("no line {want:?} from the client"));
        assert_eq!(line, want);
    }

    fn wait_err(&mut self, needle: &str) {
        while !self.err_seen.iter().any(|l| l.contains(needle)) {
            let line = self.err.recv_timeout(LIMIT).unwrap_or_else(|_| {
                panic!("no {needle:?} on the client's stderr: {:?}", self.err_seen)
            });
            self.err_seen.push(line);
        }
    }

    /// Waits for the exit; returns the code and all of stderr.
    fn exit(&mut self) -> (Option<i32>, String) {
        let out = self.guard.wait_output(LIMIT);
        self.err_seen.extend(self.err.try_iter());
        (out.status.code(), self.err_seen.join("\n"))
    }
}

#[test]
fn a_job_that_cannot_start_says_why_and_exits_as_a_shell_would() {
    let r = Runner::started(&[]);
    for (id, program, code, says) in [
        ("missing", "no-such-program", 127, "not found in PATH"),
        ("not-executable", "/etc/passwd", 126, "Permission denied"),
    ] {
        let out = r
            .cli()
            .args(["submit", "--id", id, "--", program])
            .output()
            .expect("submit");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{program}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.contains("failed: could not start") && err.contains(says),
            "{err}"
        );
        for cmd in [vec!["wait", id], vec!["logs", id]] {
            let out = r.cli().args(&cmd).output().expect("client");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(code), "{cmd:?}: {err}");
            assert!(err.contains(says), "{cmd:?}: {err}");
        }
        let rec = r.job(id);
        assert_eq!(rec["exit_code"], code, "{rec}");
        assert!(rec["pid"].is_null(), "{rec}");
    }
}

#[test]
fn interrupting_a_submitted_job_cancels_it_and_a_second_interrupt_detaches() {
    let r = Runner::started(&[]);
    // Ends on SIGTERM: the first interrupt cancels it and the client exits as it did.
    let mut cmd = r.cli();
    cmd.args([
        "submit",
        "--id",
        "calm",
        "--",
        "sh",
        "-c",
        "echo ready; exec sleep 1000",
    ]);
    let mut client = Client::spawn(cmd);
    client.wait_line("ready");
    client.guard.signal(Signal::SIGINT);
    let (code, err) = client.exit();
    assert_eq!(code, Some(128 + 15), "{err}");
    assert!(err.contains("cancelling job calm"), "{err}");
    assert_eq!(r.job("calm")["state"], "cancelled");

    // Ignores SIGTERM, so cancelling takes its grace: SIGTERM to the client cancels, a
    // Ctrl-C then detaches, and the job is still stopped.
    let mut cmd = r.cli();
    cmd.args([
        "submit",
        "--id",
        "stubborn",
        "--",
        "sh",
        "-c",
        "trap '' TERM; echo ready; exec sleep 1000",
    ]);
    let mut client = Client::spawn(cmd);
    client.wait_line("ready");
    client.guard.signal(Signal::SIGTERM);
    client.wait_err("cancelling job stubborn");
    client.guard.signal(Signal::SIGINT);
    let (code, err) = client.exit();
    assert_eq!(code, Some(130), "{err}");
    assert!(
        err.contains("detached") && err.contains("logs --follow stubborn"),
        "{err}"
    );
    let rec = r.wait("stubborn");
    assert_eq!(rec["state"], "cancelled", "{rec}");
}

#[test]
fn detach_returns_the_id_and_unenforceable_limits_are_named() {
    let r = Runner::started(&[]);
    let out = r
        .cli()
        .args([
            "submit",
            "--detach",
            "--id",
            "bg",
            "--cpu-millis",
            "500",
            "--",
            "true",
        ])
        .output()
        .expect("submit");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "bg");
    let err = String::from_utf8_lossy(&out.stderr);
    let health = get_json(&r.socket(), "/v1/health").expect("health");
    if health["confinement"] == "process-group" {
        assert!(err.contains("cpu_millis will not be enforced"), "{err}");
    }
    assert_eq!(r.wait("bg")["state"], "succeeded");
}

#[test]
fn a_client_without_access_to_the_socket_is_told_whose_it_is() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to run the client as another account");
        return;
    }
    let r = Runner::started(&[]);
    let daemon = uzers::get_user_by_name("daemon").expect("daemon");
    let out = r
        .cli()
        .args(["list"])
        .uid(daemon.uid())
        .gid(daemon.primary_group_id())
        .output()
        .expect("list");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("belongs to the runner's account (nobody)")
            && !err.contains("is the agent running"),
        "{err}"
    );
}

/// A job whose own process ignores SIGTERM (SIG_IGN survives exec), with a kill grace far
/// longer than any stop may take.
fn stubborn_job(id: &str) -> Value {
    json!({"id": id, "argv": ["sh", "-c", r#"trap "" TERM; echo ready; exec sleep 1000"#], "kill_grace_secs": 120})
}

/// Submits a stubborn job, waits until it runs, and returns its pid (which leads its
/// group); the runner's guard kills that group if the test fails.
fn start_stubborn(r: &mut Runner, id: &str) -> i32 {
    submit_ok(r, stubborn_job(id));
    wait_for(LIMIT, "the stubborn job to be ready", || {
        (r.output(id, "stdout") == "ready\n").then_some(())
    });
    let pid = r.job(id)["pid"].as_i64().expect("pid") as i32;
    r.guard.as_mut().expect("runner").own_group(pid);
    pid
}

#[test]
fn a_stop_budget_cuts_kill_graces_and_leaves_no_job_alive() {
    let mut r = Runner::started(&["--stop-budget", "2s"]);
    let pid = start_stubborn(&mut r, "stubborn");
    let mut guard = r.guard.take().expect("runner");
    guard.own_group(pid);
    guard.signal(Signal::SIGTERM);
    let out = guard.wait_output(LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        live_in_group(pid).is_empty(),
        "the job outlived the runner's stop"
    );
    assert!(
        err.contains("kill grace shortened") && err.contains("stubborn"),
        "{err}"
    );

    r.start(&[]);
    let rec = r.job("stubborn");
    assert_eq!(rec["state"], "cancelled", "{rec}");
    let why = rec["error"].as_str().expect("error");
    assert!(
        why.contains("shutting down") && why.contains("cut from 2m"),
        "{rec}"
    );
}

#[test]
fn a_restarted_runner_serves_while_it_ends_a_dead_runners_jobs() {
    // One job at a time, so the second one is still queued when the runner dies.
    let mut r = Runner::started(&["--max-jobs", "1"]);
    let pid = start_stubborn(&mut r, "left");
    submit_ok(
        &r,
        json!({"id": "waiting", "argv": ["echo", "queued-before"]}),
    );
    let mut old = r.guard.take().expect("runner");
    old.own_group(pid);
    old.signal(Signal::SIGKILL);
    let _ = old.wait_output(LIMIT);
    assert!(alive(pid), "the job outlives a SIGKILLed runner");

    // `start` returns once health answers: the leftover has 10 s of grace and ignores
    // SIGTERM, so it is still alive then.
    r.start(&[]);
    r.guard.as_mut().expect("runner").own_group(pid);
    let health = get_json(&r.socket(), "/v1/health").expect("health");
    let still_alive = alive(pid);
    assert_eq!(health["reconciling"], true, "{health}");
    assert_eq!(health["leftovers"], 1, "{health}");
    assert!(
        still_alive,
        "the runner served only after ending the leftover"
    );
    assert_eq!(r.job("left")["state"], "running");

    let rec = r.wait("left");
    assert_eq!(rec["state"], "lost", "{rec}");
    assert!(
        rec["error"]
            .as_str()
            .expect("error")
            .contains("process group was killed"),
        "{rec}"
    );
    assert!(live_in_group(pid).is_empty(), "the leftover survived");
    wait_for(LIMIT, "reconciling to end", || {
        let h = get_json(&r.socket(), "/v1/health")?;
        (h["reconciling"] == false && h["leftovers"] == 0).then_some(())
    });
    r.wait("waiting");
    assert_eq!(r.output("waiting", "stdout"), "queued-before\n");
}

/// `railgrid runner reap` as the runner's account.
fn reap(r: &Runner) -> (Option<i32>, Value, String) {
    let mut cmd = railgrid();
    cmd.args(["runner", "reap", "--grace", "1s", "--state-dir"])
        .arg(r.state())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    as_runner_user(&mut cmd);
    let mut g = Guard::new(cmd.spawn().expect("spawn reap"));
    let out = g.wait_output(LIMIT);
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.code(),
        report,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn runner_reap_ends_a_dead_runners_jobs_and_never_a_live_ones() {
    let mut r = Runner::started(&[]);
    let pid = start_stubborn(&mut r, "orphan");

    // A live runner holds the lock: reap touches nothing and says so.
    let runner_pid = r.guard.as_ref().expect("runner").pid();
    let (code, report, err) = reap(&r);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(report["held_by"], runner_pid, "{report}");
    assert_eq!(report["ended"], json!([]), "{report}");
    assert!(alive(pid), "reap killed a live runner's job");
    assert_eq!(r.job("orphan")["state"], "running");

    let mut old = r.guard.take().expect("runner");
    old.own_group(pid);
    old.signal(Signal::SIGKILL);
    let _ = old.wait_output(LIMIT);
    assert!(alive(pid));
    let (code, report, err) = reap(&r);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(report["held_by"], Value::Null, "{report}");
    let ended = report["ended"].as_array().expect("ended");
    assert_eq!(ended.len(), 1, "{report}");
    assert_eq!(ended[0]["id"], "orphan");
    assert_eq!(ended[0]["pid"], pid);
    assert_eq!(ended[0]["killed"], true);
    assert!(live_in_group(pid).is_empty(), "the job outlived the reap");

    r.start(&[]);
    let rec = r.job("orphan");
    assert_eq!(rec["state"], "lost", "{rec}");
    assert!(
        rec["error"].as_str().expect("error").contains("reap"),
        "{rec}"
    );
    if is_root() {
        // jobs.db and its WAL files still belong to the runner's account.
        let nobody = uzers::get_user_by_name("nobody").expect("nobody").uid();
        for entry in fs::read_dir(r.runner_dir()).expect("runner dir").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("jobs.db") {
                assert_eq!(entry.metadata().expect("meta").uid(), nobody, "{name}");
            }
        }
    }
}

#[test]
fn what_a_dead_runners_job_left_in_its_group_after_its_leader_exited_is_killed() {
    let mut r = Runner::started(&[]);
    // The leader leaves a child in its process group and exits on its own a moment later.
    let id = submit_ok(
        &r,
        json!({"id": "left", "argv": ["sh", "-c", "sleep 1000 & echo ready; sleep 1; exit 0"]}),
    );
    wait_for(LIMIT, "the job to be ready", || {
        (r.output(&id, "stdout") == "ready\n").then_some(())
    });
    let pgid = r.job(&id)["pid"].as_i64().expect("pid") as i32;
    let mut old = r.guard.take().expect("runner");
    old.own_group(pgid);
    old.signal(Signal::SIGKILL);
    let _ = old.wait_output(LIMIT);
    wait_for(LIMIT, "the job's leader to exit", || {
        (!alive(pgid)).then_some(())
    });
    assert!(
        !live_in_group(pgid).is_empty(),
        "the leader's child should outlive it in the group"
    );

    r.start(&[]);
    r.guard.as_mut().expect("runner").own_group(pgid);
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "lost", "{rec}");
    assert!(
        rec["error"]
            .as_str()
            .unwrap_or_default()
            .contains("what it left in its process group was killed"),
        "{rec}"
    );
    wait_for(LIMIT, "the group to be empty", || {
        live_in_group(pgid).is_empty().then_some(())
    });
}

/// The fork and exec path, as on a kernel without `clone(CLONE_PIDFD)` (before 5.2, or
/// under a seccomp filter that refuses it), forced by the runner's setting: jobs run,
/// stream, exit, fail to start, time out and stay confined just as on the clone path.
#[test]
fn jobs_started_with_fork_and_exec_behave_as_with_clone() {
    let r = Runner::started(&["--job-launch", "fork"]);
    let health = get_json(&r.socket(), "/v1/health").expect("health");
    assert_eq!(health["launch"], "fork", "{health}");

    let out = r
        .cli()
        .args([
            "submit",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; echo $RAILGRID_JOB_ID; exit 7",
        ])
        .output()
        .expect("submit");
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("out\n"), "{stdout}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");

    // Starts clean: no signal ignored, nothing of the runner's open but 0-2 (and the
    // directory `ls` reads).
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "grep SigIgn /proc/self/status; ls /proc/self/fd | wc -l"]}),
    );
    r.wait(&id);
    let out = r.output(&id, "stdout");
    assert!(out.starts_with("SigIgn:\t0000000000000000\n"), "{out}");
    assert_eq!(out.lines().nth(1).map(str::trim), Some("4"), "{out}");

    let out = r
        .cli()
        .args(["submit", "--", "no-such-program"])
        .output()
        .expect("submit");
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found in PATH"));

    // Its own process group, and killed whole on timeout.
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", tree_script()], "timeout_secs": 1, "kill_grace_secs": 1}),
    );
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "timed_out", "{rec}");
    assert_no_survivors(&r, &rec);

    // The working directory by descriptor, and Landlock where the kernel has it.
    fs::create_dir_all(r.runner_dir().join("work/shared/src")).expect("mkdir");
    chown_runner_dir(&r.runner_dir().join("work/shared"));
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "pwd; cat ../../../api.token 2>/dev/null || echo denied"], "cwd": "../shared/src"}),
    );
    r.wait(&id);
    let out = r.output(&id, "stdout");
    assert!(
        out.starts_with(&path_str(&r.runner_dir().join("work/shared/src"))),
        "{out}"
    );
    if health["isolation"]
        .as_str()
        .unwrap_or_default()
        .starts_with("landlock")
    {
        assert!(
            out.ends_with("denied\n"),
            "a forked job read the API token: {out}"
        );
    }
}

/// A database `runner reap` cannot open for writing (here a newer schema, as a newer build
/// leaves it before a downgrade) still says which processes to stop: they are stopped, and
/// their records are left for a runner that can write them.
#[test]
fn runner_reap_ends_jobs_even_when_it_cannot_open_the_database_for_writing() {
    let mut r = Runner::started(&[]);
    let pid = start_stubborn(&mut r, "orphan");
    let mut old = r.guard.take().expect("runner");
    old.own_group(pid);
    old.signal(Signal::SIGKILL);
    let _ = old.wait_output(LIMIT);
    assert!(alive(pid));

    // A schema newer than this build knows, written as the runner's account would.
    let db = r.runner_dir().join("jobs.db");
    {
        let conn = rusqlite::Connection::open(&db).expect("open jobs.db");
        conn.pragma_update(None, "user_version", 99)
            .expect("user_version");
    }
    chown_runner_dir(&r.runner_dir());

    let (code, report, err) = reap(&r);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("read-only look"), "{err}");
    let ended = report["ended"].as_array().expect("ended");
    assert_eq!(ended.len(), 1, "{report}");
    assert_eq!(ended[0]["killed"], true, "{report}");
    assert_eq!(report["uncommitted"], json!(["orphan"]), "{report}");
    assert!(live_in_group(pid).is_empty(), "the job outlived the reap");
}

/// A job that runs until it is stopped, and says when it runs.
fn long_job(id: &str) -> Value {
    json!({"id": id, "argv": ["sh", "-c", "echo ready; exec sleep 1000"], "kill_grace_secs": 1})
}

/// Waits until job `id` (a [`long_job`]) runs, and returns its pid, which leads its group;
/// the runner's guard kills that group if the test fails.
fn wait_ready(r: &mut Runner, id: &str) -> i32 {
    wait_for(LIMIT, &format!("job {id} to be ready"), || {
        (r.output(id, "stdout") == "ready\n").then_some(())
    });
    let pid = r.job(id)["pid"].as_i64().expect("pid") as i32;
    r.guard.as_mut().expect("runner").own_group(pid);
    pid
}

fn admission_of(r: &Runner) -> Value {
    get_json(&r.socket(), "/v1/admission").expect("GET /v1/admission")
}

fn put_admission(r: &Runner, body: &str) -> (u16, Value) {
    let (status, body) =
        http(&r.socket(), "PUT", "/v1/admission", Some(body)).expect("PUT /v1/admission");
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// (jobs_running, jobs_queued) of `/v1/health`.
fn job_counts(r: &Runner) -> (u64, u64) {
    let h = get_json(&r.socket(), "/v1/health").expect("health");
    let count = |k: &str| h[k].as_u64().unwrap_or_else(|| panic!("{k} in {h}"));
    (count("jobs_running"), count("jobs_queued"))
}

fn limits(max_jobs: u64, max_jobs_per_owner: u64, max_queued: u64) -> Value {
    json!({"max_jobs": max_jobs, "max_jobs_per_owner": max_jobs_per_owner, "max_queued": max_queued})
}

#[test]
fn raising_max_jobs_starts_a_queued_job_at_once_and_leaves_the_running_one_alone() {
    let mut r = Runner::started(&["--max-jobs", "1"]);
    let runner_pid = r.guard.as_ref().expect("runner").pid();
    submit_ok(&r, long_job("first"));
    let first = wait_ready(&mut r, "first");
    let first_started = r.job("first")["started_ms"].clone();
    submit_ok(&r, long_job("second"));
    assert_eq!(r.job("second")["state"], "queued");
    assert_eq!(job_counts(&r), (1, 1));
    // Without --max-jobs-per-owner, the per-owner limit is max_jobs, and follows it.
    assert_eq!(admission_of(&r), limits(1, 1, 1000));

    let (status, body) = put_admission(&r, r#"{"max_jobs": 2}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, limits(2, 2, 1000));
    let second = wait_ready(&mut r, "second");
    assert_ne!(first, second);

    let rec = r.job("first");
    assert_eq!(rec["state"], "running", "{rec}");
    assert_eq!(rec["pid"], first, "{rec}");
    assert_eq!(rec["started_ms"], first_started, "{rec}");
    assert!(alive(first), "the running job was disturbed");
    assert_eq!(r.output("first", "stdout"), "ready\n");
    let h = get_json(&r.socket(), "/v1/health").expect("health");
    assert_eq!(h["pid"], runner_pid, "the runner restarted: {h}");
    assert_eq!(job_counts(&r), (2, 0));
    assert_eq!(admission_of(&r), limits(2, 2, 1000));
}

#[test]
fn lowering_max_jobs_stops_no_running_job_and_holds_new_starts() {
    let mut r = Runner::started(&["--max-jobs", "2"]);
    submit_ok(&r, long_job("a"));
    submit_ok(&r, long_job("b"));
    let a = wait_ready(&mut r, "a");
    let b = wait_ready(&mut r, "b");

    let (status, body) = put_admission(&r, r#"{"max_jobs": 1}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, limits(1, 1, 1000));
    for (id, pid) in [("a", a), ("b", b)] {
        let rec = r.job(id);
        assert_eq!(rec["state"], "running", "{rec}");
        assert_eq!(rec["pid"], pid, "{rec}");
        assert!(alive(pid), "job {id} was stopped by a lower limit");
    }
    // Scheduling runs within the submission: a job that could start has by now.
    submit_ok(&r, json!({"id": "c", "argv": ["echo", "c-ran"]}));
    assert_eq!(job_counts(&r), (2, 1));

    // One ends: one runs, which is the limit, so c still waits.
    let (status, _) = http(&r.socket(), "POST", "/v1/jobs/a/cancel", None).expect("cancel");
    assert_eq!(status, 200);
    assert_eq!(r.wait("a")["state"], "cancelled");
    wait_for(LIMIT, "a to leave the scheduler", || {
        (job_counts(&r).0 == 1).then_some(())
    });
    submit_ok(&r, json!({"id": "d", "argv": ["echo", "d-ran"]}));
    assert_eq!(job_counts(&r), (1, 2));
    assert_eq!(r.job("c")["state"], "queued");
    assert_eq!(r.job("b")["pid"], b);

    // Under the new limit: the queue runs, one job at a time.
    let (status, _) = http(&r.socket(), "POST", "/v1/jobs/b/cancel", None).expect("cancel");
    assert_eq!(status, 200);
    assert_eq!(r.wait("c")["state"], "succeeded");
    assert_eq!(r.wait("d")["state"], "succeeded");
    assert_eq!(r.output("c", "stdout"), "c-ran\n");
    assert_eq!(job_counts(&r), (0, 0));
}

#[test]
fn lowering_max_queued_keeps_queued_jobs_and_refuses_new_ones_until_the_queue_drains() {
    let mut r = Runner::started(&["--max-jobs", "1"]);
    submit_ok(&r, long_job("hold"));
    wait_ready(&mut r, "hold");
    for i in 0..3 {
        submit_ok(&r, json!({"id": format!("q-{i}"), "argv": ["true"]}));
    }
    let (status, body) = put_admission(&r, r#"{"max_queued": 1}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, limits(1, 1, 1));
    assert_eq!(job_counts(&r), (1, 3), "accepted jobs were dropped");
    let (status, body) = r.submit(json!({"argv": ["true"]}));
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "queue_full");

    let (status, _) = http(&r.socket(), "POST", "/v1/jobs/hold/cancel", None).expect("cancel");
    assert_eq!(status, 200);
    for i in 0..3 {
        assert_eq!(r.wait(&format!("q-{i}"))["state"], "succeeded");
    }
    let id = submit_ok(&r, json!({"argv": ["true"]}));
    assert_eq!(r.wait(&id)["state"], "succeeded");
}

#[test]
fn a_bad_admission_change_is_refused_naming_the_field_and_changes_nothing() {
    let r = Runner::started(&["--max-jobs", "2", "--max-queued", "5"]);
    let before = limits(2, 2, 5);
    for (body, code, field) in [
        (r#"{"max_jobs": 0}"#, "invalid_admission", "max_jobs"),
        (
            r#"{"max_jobs": 3, "max_jobs_per_owner": 0}"#,
            "invalid_admission",
            "max_jobs_per_owner",
        ),
        (r#"{"max_jobs": -1}"#, "invalid_json", "max_jobs"),
        (r#"{"max_queued": "ten"}"#, "invalid_json", "max_queued"),
        ("{not json", "invalid_json", "invalid admission change"),
    ] {
        let (status, resp) = put_admission(&r, body);
        assert_eq!(status, 400, "{body}: {resp}");
        assert_eq!(resp["error"]["code"], code, "{body}: {resp}");
        let message = resp["error"]["message"].as_str().expect("message");
        assert!(message.contains(field), "{body}: {message}");
        assert_eq!(admission_of(&r), before, "{body} changed the limits");
    }
    // Unknown fields are ignored; a field left out keeps its value.
    let (status, resp) = put_admission(&r, r#"{"max_queued": 0, "max_cpus": 9}"#);
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp, limits(2, 2, 0));
    assert_eq!(admission_of(&r), limits(2, 2, 0));
    assert_eq!(r.submit(json!({"argv": ["true"]})).0, 429);

    // Like every route but health, both need the token.
    for method in ["GET", "PUT"] {
        let (status, body) =
            http_with(&r.socket(), method, "/v1/admission", Some("{}"), None).expect("request");
        assert_eq!(status, 401, "{method}: {body}");
    }
}

#[test]
fn the_client_reads_and_changes_the_admission_limits() {
    use railgrid::proto::admission::{Admission, AdmissionChange};
    use railgrid::runner::client::ClientError;
    let r = Runner::started(&["--max-jobs", "1", "--max-jobs-per-owner", "1"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = railgrid::runner::client::Client::new(&r.socket());
    let first = rt.block_on(client.admission()).expect("admission");
    assert_eq!(
        first,
        Admission {
            max_jobs: 1,
            max_jobs_per_owner: 1,
            max_queued: 1000
        }
    );
    let change = AdmissionChange {
        max_jobs: Some(4),
        max_queued: Some(7),
        ..AdmissionChange::default()
    };
    let changed = rt.block_on(client.set_admission(&change)).expect("set");
    // A per-owner limit given by flag stays: only what the change names moves.
    let want = Admission {
        max_jobs: 4,
        max_jobs_per_owner: 1,
        max_queued: 7,
    };
    assert_eq!(changed, want);
    assert_eq!(rt.block_on(client.admission()).expect("admission"), want);
    let zero = AdmissionChange {
        max_jobs_per_owner: Some(0),
        ..AdmissionChange::default()
    };
    match rt.block_on(client.set_admission(&zero)) {
        Err(ClientError::Api {
            status: 400,
            code,
            message,
        }) => {
            assert_eq!(code, "invalid_admission");
            assert!(message.contains("max_jobs_per_owner"), "{message}");
        }
        other => panic!("a per-owner limit of 0 was not refused: {other:?}"),
    }
    assert_eq!(rt.block_on(client.admission()).expect("admission"), want);
}

/// Workspaces count: a build's checkout and artifacts stay in its workspace, and kept
/// spools alone let a handful of builds fill a disk. Past `--max-kept-bytes` the oldest
/// finished jobs go, never a running one; `job prune` deletes by hand.
#[test]
fn finished_jobs_keep_at_most_their_byte_budget_and_prune_deletes_them() {
    let r = Runner::started(&["--max-kept-bytes", &(5u64 << 20).to_string()]);
    // A running job whose workspace is larger than the budget on its own.
    let running = submit_ok(
        &r,
        json!({"id": "running", "argv": ["sh", "-c", "head -c 6291456 /dev/zero > big; echo ready; sleep 1000"]}),
    );
    wait_for(LIMIT, "the running job's file", || {
        r.output(&running, "stdout").contains("ready").then_some(())
    });
    for n in 0..4 {
        let id = submit_ok(
            &r,
            json!({"id": format!("build-{n}"), "argv": ["sh", "-c", "head -c 2097152 /dev/zero > artifact"]}),
        );
        assert_eq!(r.wait(&id)["state"], "succeeded");
    }
    let health = wait_for(LIMIT, "retention within the budget", || {
        let h = get_json(&r.socket(), "/v1/health")?;
        (h["kept_bytes"].as_u64()? <= 5 << 20).then_some(h)
    });
    assert_eq!(health["max_kept_bytes"], 5u64 << 20, "{health}");
    let work = r.runner_dir().join("work");
    assert!(!work.join("build-0").exists(), "the oldest went");
    assert!(
        work.join("build-3").join("artifact").exists(),
        "the newest stays"
    );
    assert!(
        work.join("running").join("big").exists(),
        "a running job's workspace stays"
    );

    let out = r
        .cli()
        .args(["prune", "--keep", "0"])
        .output()
        .expect("prune");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("deleted") && text.contains("freed"), "{text}");
    assert!(!work.join("build-3").exists(), "pruned");
    assert!(
        work.join("running").join("big").exists(),
        "never a running job's"
    );
    let health = get_json(&r.socket(), "/v1/health").expect("health");
    assert_eq!(health["finished_jobs"], 0, "{health}");
    http(
        &r.socket(),
        "POST",
        &format!("/v1/jobs/{running}/cancel"),
        None,
    )
    .expect("cancel");
    r.wait(&running);
}
