//! Jobs run, time out, are cancelled and admitted; their output is spooled, capped, followed and retained.

use super::*;

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
    refused_spec(
        &r,
        json!({"argv": ["true"], "env": {"LD_PRELOAD": "/tmp/evil.so"}}),
        "LD_PRELOAD",
    );

    refused_spec(
        &r,
        json!({"argv": ["true"], "cwd": "../../etc"}),
        "outside the workspace root",
    );

    // A symlink inside the workspace root that points out of it.
    let link = r.runner_dir().join("work/escape");
    std::os::unix::fs::symlink("/etc", &link).expect("symlink");
    refused_spec(
        &r,
        json!({"argv": ["true"], "cwd": "../escape"}),
        "passes through a symlink",
    );

    refused_spec(&r, json!({"argv": []}), "argv");
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
    // The process-group tier alone: the tree's processes are in the job's group on the
    // host (a sandbox's tree is in its own namespace: tests/it/jobs/sandbox.rs).
    let r = Runner::started(&["--sandbox", "off"]);
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", tree_script()], "kill_grace_secs": 1}),
    );
    let pid = r.pid_when_printed(&id, "ready\n");
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
    let pid = r.pid_when_printed(&id, "written-before-the-crash\n");
    let runner_pid = r.guard.as_ref().expect("runner").pid();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(runner_pid), Signal::SIGKILL)
        .expect("kill -9");
    let _ = r.guard.take().expect("runner").wait_output(LIMIT);
    assert!(alive(pid), "the job outlives a SIGKILLed runner");

    r.start(&[]);
    // Ended in the background: the runner serves first.
    let rec = r.wait(&id);
    assert_ended(&rec, "lost", "process group was killed");
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
    assert_error(&rec, "already gone");
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
    let err = exited_saying(&out, 124, "timed out after 1s");
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
    let pid = r.pid_when_printed("long", "ready\n");
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
    assert_error(&rec, "shutting down");
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
    // Landlock joins where the kernel has it, and the sandbox over both.
    let confinement = rec["confinement"].as_str().expect("confinement");
    assert!(
        ["process-group+rlimits", "process-group+rlimits+landlock"]
            .contains(&confinement.trim_start_matches("sandbox+")),
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
    succeeded(&out);
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
    refused_spec(
        &r,
        json!({"argv": ["true"], "kill_grace_secs": 100000}),
        "kill_grace_secs",
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
    assert_says(&rec, "error", "killed");
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
