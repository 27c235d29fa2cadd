//! A runner's stop within its budget, and what a restarted runner or `runner reap` does with a dead one's jobs.

use super::*;

/// A job whose own process ignores SIGTERM (SIG_IGN survives exec), with a kill grace far
/// longer than any stop may take.
fn stubborn_job(id: &str) -> Value {
    json!({"id": id, "argv": ["sh", "-c", r#"trap "" TERM; echo ready; exec sleep 1000"#], "kill_grace_secs": 120})
}

/// Submits a stubborn job, waits until it runs, and returns its pid (which leads its
/// group); the runner's guard kills that group if the test fails.
fn start_stubborn(r: &mut Runner, id: &str) -> i32 {
    submit_ok(r, stubborn_job(id));
    let pid = r.pid_when_printed(id, "ready\n");
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
    let err = exited(&out, 0);
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
    assert_ended(&rec, "lost", "process group was killed");
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
    assert_says(&rec, "error", "reap");
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
    // The process-group tier alone: in a sandbox, the leader's exit ends its namespace.
    let mut r = Runner::started(&["--sandbox", "off"]);
    // The leader leaves a child in its process group and exits on its own a moment later.
    let id = submit_ok(
        &r,
        json!({"id": "left", "argv": ["sh", "-c", "sleep 1000 & echo ready; sleep 1; exit 0"]}),
    );
    let pgid = r.pid_when_printed(&id, "ready\n");
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
    assert_says(
        &rec,
        "error",
        "what it left in its process group was killed",
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
    exited_saying(&out, 127, "not found in PATH");

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
