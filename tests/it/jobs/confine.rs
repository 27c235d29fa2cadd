//! What confines a job: its cgroup, the file systems the runner pins, Landlock.

use super::*;

/// Starts the runner as nobody inside `cgroup` (a directory of a delegated one).
/// The cgroup tier alone (a job's pids, as it writes them, are the host's; the sandbox
/// over it is tests/it/jobs/sandbox.rs).
fn start_runner_in(r: &mut Runner, cgroup: &Path) {
    let mut cmd = railgrid();
    cmd.args(["runner", "run", "--sandbox", "off", "--state-dir"])
        .arg(r.state())
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    r.launch(in_cgroup(&cmd, cgroup, Some("nobody")));
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
    assert_ended(&rec, "lost", "cgroup was killed");
    assert!(!alive(escapee), "the escapee {escapee} survived");
    assert!(!cg.dir.join(format!("job-{id}")).exists());
}

/// The runner's Landlock rules name the entries beside the path to its state dir; it once
/// held a descriptor on each for its whole life, so a file system mounted beside them
/// could not be unmounted ("target is busy") and a file deleted there kept its space.
#[test]
fn the_runner_pins_no_file_system_or_file_beside_its_state_dir() {
    if !requires_root("mounting file systems needs root") {
        return;
    }
    let dir = tempdir();
    // Declared before the runner, so unmounted after it: the temp dir, whose own removal
    // failed while it was mounted, goes with the mount.
    let outer = Mounted::tmpfs(dir.path(), "64m", "0755");
    let sibling = dir.path().join("sibling");
    fs::create_dir(&sibling).expect("mkdir");
    let _inner = Mounted::tmpfs(&sibling, "1m", "0755");
    let big = dir.path().join("big");
    fs::write(&big, vec![7u8; 32 << 20]).expect("big file");
    let free = || outer.free();
    let mut r = Runner::in_dir(dir);
    r.start(&["--sandbox", "off"]);
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

    run_ok(
        Command::new("umount").arg(&sibling),
        "the sibling file system could not be unmounted while the runner runs",
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
    // Landlock alone: the sandbox hides the state dir itself (tests/it/jobs/sandbox.rs).
    let r = Runner::started(&["--sandbox", "off"]);
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
    assert_says(&rec, "confinement", "landlock");
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
