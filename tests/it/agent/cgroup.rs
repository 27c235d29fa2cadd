//! The cgroups an agent gives its runner and jobs, and empties when the runner could not.

use super::*;

#[test]
fn a_delegated_agent_gives_its_runner_a_cgroup_and_jobs_get_the_cgroup_tier() {
    let Some(cg) = DelegatedCgroup::new("agent", None) else {
        return;
    };
    let host = Host::new();
    let cmd = host.agent_cmd(&[]);
    let mut cmd = in_cgroup(&cmd, &cg.dir, None);
    cmd.env("RAILGRID_RUNNER_DELEGATE_CGROUP", "true")
        .env("RAILGRID_RUNNER_INITIAL_BACKOFF", "100ms")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let agent = Guard::new(cmd.spawn().expect("spawn agent"));
    let runner = host.wait_runner("a healthy runner", |_| true);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(health["confinement"], "cgroup", "{health}");
    // The agent moved into its leaf; the runner started in its own, in the delegated tree.
    assert_eq!(cg.procs("agent"), [agent.pid()]);
    assert_eq!(cg.procs("runner/runner"), [runner]);
    assert!(cg.procs("").is_empty());
    if let Some(nobody) = uzers::get_user_by_name("nobody") {
        use std::os::unix::fs::MetadataExt;
        let meta = fs::metadata(cg.dir.join("runner/cgroup.procs")).expect("tree");
        assert_eq!(
            meta.uid(),
            nobody.uid(),
            "the runner's tree is delegated to it"
        );
    }

    // A runner killed and restarted by the agent goes back into its leaf.
    sigkill(runner);
    let again = host.wait_runner("a restarted runner", |st| st["runner"]["pid"] != runner);
    assert_eq!(cg.procs("runner/runner"), [again]);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(health["confinement"], "cgroup", "{health}");
}

/// Outside a service manager (this test's process is in the hierarchy's root cgroup), a
/// root agent makes a cgroup of its own: jobs get the cgroup tier, so a job's setsid and
/// setpgid children end with it; the agent removes the cgroup when it stops.
#[test]
fn a_root_agent_without_a_service_manager_gives_its_jobs_a_cgroup_nothing_escapes() {
    if !requires_root("a cgroup of the agent's own needs root") {
        return;
    }
    let in_root =
        fs::read_to_string("/proc/self/cgroup").is_ok_and(|t| t.lines().any(|l| l == "0::/"));
    let host = Host::new();
    let Some(own) = own_cgroup(&host.state()).filter(|_| in_root) else {
        eprintln!("SKIPPED: this test must run in the root cgroup of a cgroup v2 hierarchy");
        return;
    };
    // The cgroup tier alone: the escapees' pids, as they print them, are the host's.
    let mut agent = host.start_agent_with(&[("RAILGRID_RUNNER_SANDBOX", "off")]);
    let runner = host.wait_runner("a runner", |_| true);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(health["confinement"], "cgroup", "{health}");
    assert!(own.join("runner/runner").exists(), "{}", own.display());
    let procs = fs::read_to_string(own.join("runner/runner/cgroup.procs")).expect("procs");
    assert_eq!(procs.trim(), runner.to_string());

    // Children that leave the job's process group: a new session, a new group. Each
    // prints its pid.
    let script = "setsid sh -c 'echo $$; exec sleep 300' & \
         perl -e 'setpgrp(0,0); $| = 1; print \"$$\\n\"; sleep 300' & \
         sleep 300";
    let body = serde_json::json!({"id": "escape", "argv": ["sh", "-c", script]}).to_string();
    let (code, reply) = http(&host.socket(), "POST", "/v1/jobs", Some(&body)).expect("submit");
    assert_eq!(code, 201, "{reply}");
    let pids: Vec<i32> = wait_for(LIMIT, "both escapees running", || {
        let (_, out) = get(&host.socket(), "/v1/jobs/escape/output/stdout")?;
        let pids: Vec<i32> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
        (pids.len() == 2).then_some(pids)
    });
    // The job may print before the runner has recorded its pid.
    let leader = wait_for(LIMIT, "the job's pid", || {
        get_json(&host.socket(), "/v1/jobs/escape")?["pid"].as_i64()
    }) as i32;
    for p in &pids {
        let pgid = nix::unistd::getpgid(Some(Pid::from_raw(*p))).expect("pgid");
        assert_ne!(pgid.as_raw(), leader, "{p} left the job's group {leader}");
    }
    http(&host.socket(), "POST", "/v1/jobs/escape/cancel", None).expect("cancel");
    wait_for(LIMIT, "the escapees gone with their job", || {
        pids.iter().all(|p| !alive(*p)).then_some(())
    });

    agent.signal(Signal::SIGTERM);
    let out = agent.wait_output(LIMIT);
    succeeded(&out);
    assert!(
        !own.exists(),
        "the agent's own cgroup {} is removed",
        own.display()
    );
}

#[test]
fn a_delegated_agent_empties_the_runners_cgroup_tree_when_the_runner_could_not() {
    let Some(cg) = DelegatedCgroup::new("stop", None) else {
        eprintln!("SKIPPED: needs root and a cgroup v2 hierarchy with cgroup.kill");
        return;
    };
    let host = Host::new();
    let mut cmd = in_cgroup(&host.agent_cmd(&[]), &cg.dir, None);
    // The cgroup tier alone: the escapee's pid, as it writes it, is the host's.
    cmd.env("RAILGRID_RUNNER_SANDBOX", "off")
        .env("RAILGRID_RUNNER_DELEGATE_CGROUP", "true")
        .env("RAILGRID_RUNNER_STOP_GRACE", "1s")
        .env("RAILGRID_RUNNER_INITIAL_BACKOFF", "100ms")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut agent = Guard::new(cmd.spawn().expect("spawn agent"));
    let runner = host.wait_runner("a runner", |_| true);
    agent.own_group(runner);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(health["confinement"], "cgroup", "{health}");
    // A job that leaves a process outside its group, and ignores SIGTERM itself.
    let spec = r#"{"id":"escaping","argv":["sh","-c","setsid sh -c 'trap \"\" TERM; echo $$ > escaped.pid; exec sleep 1000' & while [ ! -s escaped.pid ]; do sleep 0.01; done; trap '' TERM; echo ready; exec sleep 1000"],"kill_grace_secs":120}"#;
    let (code, body) = http(&host.socket(), "POST", "/v1/jobs", Some(spec)).expect("submit");
    assert_eq!(code, 201, "{body}");
    wait_for(LIMIT, "the job to be ready", || {
        let (_, out) = get(&host.socket(), "/v1/jobs/escaping/output/stdout")?;
        (out == "ready\n").then_some(())
    });
    let file = host.state().join("runner/work/escaping/escaped.pid");
    let escapee: i32 = fs::read_to_string(file)
        .expect("escaped.pid")
        .trim()
        .parse()
        .expect("pid");
    let pid = wait_for(LIMIT, "the job's pid", || {
        get_json(&host.socket(), "/v1/jobs/escaping")?["pid"].as_i64()
    }) as i32;
    agent.own_group(pid);
    agent.own_group(escapee);

    kill(Pid::from_raw(runner), Signal::SIGSTOP).expect("SIGSTOP the runner");
    agent.signal(Signal::SIGTERM);
    let out = agent.wait_output(LIMIT);
    exited(&out, 0);
    assert!(!alive(escapee), "the escapee outlived the agent");
    assert!(live_in_group(pid).is_empty(), "the job outlived the agent");
    assert!(cg.procs("runner").is_empty());
    let reaped = host.status()["reaped"].to_string();
    assert!(reaped.contains("cgroup.kill"), "{reaped}");
}
