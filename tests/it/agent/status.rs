//! `agent status`, and a second agent on a live state dir.

use super::*;

#[test]
fn a_second_agent_on_a_live_state_dir_refuses_and_touches_nothing() {
    let host = Host::new();
    let first = host.start_agent();
    let runner = host.wait_runner("a runner", |_| true);
    let (code, body) = http(
        &host.socket(),
        "POST",
        "/v1/jobs",
        Some(r#"{"id":"keep","argv":["sleep","1000"]}"#),
    )
    .expect("submit");
    assert_eq!(code, 201, "{body}");
    let job_pid = wait_for(LIMIT, "the job running", || {
        let job = get_json(&host.socket(), "/v1/jobs/keep")?;
        (job["state"] == "running").then(|| job["pid"].as_i64())?
    }) as i32;

    let mut second = Guard::new(host.agent_cmd(&[]).spawn().expect("spawn agent"));
    let out = second.wait_output(LIMIT);
    let err = exited(&out, 2);
    assert!(
        err.contains(&format!("another agent (pid {})", first.pid())),
        "{err}"
    );
    // Nothing of the first agent's was touched: its runner, its job, its status file.
    assert!(alive(runner), "the first agent's runner was killed");
    assert!(alive(job_pid), "the first agent's job was killed");
    assert_eq!(
        get_json(&host.socket(), "/v1/health").expect("health")["pid"],
        runner
    );
    assert_eq!(
        get_json(&host.socket(), "/v1/jobs/keep").expect("job")["state"],
        "running"
    );
    assert_eq!(host.status()["pid"], first.pid());
    let out = agent_status(&host.state());
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("running (pid {}", first.pid())));
}

#[test]
fn agent_status_believes_only_the_holder_of_the_agent_lock() {
    if !cfg!(target_os = "linux") {
        eprintln!("SKIPPED: the kernel's lock table is read on Linux only");
        return;
    }
    let host = Host::new();
    let mut agent = host.start_agent();
    let runner = host.wait_runner("a runner", |_| true);
    // The runner outlives a SIGKILLed agent: the guard kills it at the end.
    agent.own_group(runner);
    agent.signal(Signal::SIGKILL);
    let _ = agent.wait_output(LIMIT);
    // A status file that says running, naming a live process that looks like an agent
    // (`agent run` in its command line: a recycled pid) but holds no agent lock.
    let mut impostor = Guard::new(
        Command::new("sh")
            .args(["-c", "sleep 1000", "agent", "run"])
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sh"),
    );
    impostor.own_group(impostor.pid());
    let mut st = host.status();
    st["pid"] = serde_json::json!(impostor.pid());
    st["pid_start_time"] = Value::Null;
    fs::write(host.state().join("agent-status.json"), st.to_string()).expect("write status");
    let out = agent_status(&host.state());
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

#[test]
fn a_start_the_runner_account_could_not_reach_is_refused_before_anything_is_made() {
    if !requires_root("needs root (a runner account other than the agent's)") {
        return;
    }
    let host = Host::new();
    // The runner account may not pass through this one.
    let closed = host.path("closed");
    fs::create_dir(&closed).expect("mkdir");
    fs::set_permissions(&closed, fs::Permissions::from_mode(0o700)).expect("chmod");
    let state = closed.join("deeper/state");
    let err = host.refused_start(&state, &["--runner-user", "nobody"]);
    assert!(
        err.contains("runner user nobody cannot reach") && err.contains(&path_str(&closed)),
        "{err}"
    );
    assert_empty(&closed);
    assert!(
        !host.path("logs").exists(),
        "a refused start made the log dir"
    );
}

#[test]
fn agent_status_shows_where_things_are_and_json_always_parses() {
    let host = Host::new();
    let status = |json: bool| {
        let mut cmd = railgrid();
        cmd.args(["agent", "status", "--state-dir"])
            .arg(host.state());
        if json {
            cmd.arg("--json");
        }
        cmd.output().expect("agent status")
    };
    // Before any agent ran: still a JSON object.
    let out = status(true);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json before any agent");
    assert_eq!(v["running"], false);

    let mut agent = host.start_agent();
    host.wait_runner("a runner", |_| true);
    let out = status(false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for want in [
        format!("state dir:  {}", host.state().display()),
        format!("log dir:    {}", host.path("logs").display()),
        format!("runner log: {}", host.path("logs/runner.log").display()),
        format!("config:     {}", host.path("agent.toml").display()),
    ] {
        assert!(text.contains(&want), "{want:?} in:\n{text}");
    }
    // What finished jobs keep and the sandbox they get, from the runner, on lines of
    // their own.
    assert!(
        text.lines()
            .any(|l| l.starts_with("kept:       0 finished jobs")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l == "sandbox:    namespaces+seccomp (runner.sandbox)"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l == "network:    open (runner.network, or the hub's)"),
        "{text}"
    );
    let v: Value = serde_json::from_slice(&status(true).stdout).expect("json");
    assert_eq!(v["running"], true);
    assert_eq!(v["runner"]["kept"]["finished_jobs"], 0, "{v}");
    assert_eq!(v["runner"]["sandbox"], "namespaces+seccomp", "{v}");
    assert_eq!(v["runner"]["network"], "open", "{v}");

    agent.signal(Signal::SIGTERM);
    let _ = agent.wait_output(LIMIT);
    let out = status(true);
    assert_eq!(out.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json after the stop");
    assert_eq!(v["running"], false);
}
