//! The agent's configuration: errors that name the file and key, reloads, the limits and paths it gives the runner.

use super::*;

fn agent_fails(host: &Host, extra: &[&str]) -> String {
    // The file alone decides: no environment override may mask a bad value.
    let child = host
        .agent_cmd(extra)
        .env_remove("RAILGRID_RUNNER_INITIAL_BACKOFF")
        .spawn()
        .expect("spawn");
    let out = Guard::new(child).wait_output(LIMIT);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "expected exit 2 for {extra:?}: {err}"
    );
    err
}

#[test]
fn configuration_errors_exit_2_naming_file_and_key() {
    let host = Host::new();
    let config = host.path("agent.toml");
    let config_s = config.display().to_string();

    fs::write(&config, "[runner]\nstop_grace = \"10s\"\nbogus_key = 1\n").expect("write");
    let err = agent_fails(&host, &[]);
    assert!(
        err.contains(&config_s) && err.contains("bogus_key"),
        "{err}"
    );

    fs::write(&config, "[runner]\ninitial_backoff = \"a while\"\n").expect("write");
    let err = agent_fails(&host, &[]);
    assert!(
        err.contains(&config_s) && err.contains("runner.initial_backoff") && err.contains("250ms"),
        "{err}"
    );

    fs::write(&config, "").expect("write");
    let token = host.path("token");
    fs::write(&token, "t0ken").expect("token");
    fs::set_permissions(&token, fs::Permissions::from_mode(0o644)).expect("chmod");
    let token_s = token.display().to_string();
    let err = agent_fails(
        &host,
        &["--hub", "https://hub.invalid", "--token-file", &token_s],
    );
    assert!(
        err.contains(&token_s) && err.contains("readable by group or others"),
        "{err}"
    );
    assert!(
        !err.contains("t0ken"),
        "the token leaked into an error: {err}"
    );

    if is_root() {
        let out = railgrid()
            .args(["agent", "run", "--config", &config_s, "--state-dir"])
            .arg(host.state())
            .output()
            .expect("run");
        exited_saying(&out, 2, "set runner.user (e.g. --runner-user nobody)");
    } else {
        eprintln!("SKIPPED part: root without runner.user (needs root)");
    }
    assert!(
        !host.state().join("runner").exists(),
        "nothing is created before validation"
    );

    let out = railgrid()
        .args([
            "agent",
            "check-config",
            "--config",
            &config_s,
            "--state-dir",
            "/srv/rg",
            "--runner-user",
            "nobody",
        ])
        .output()
        .expect("check");
    if is_root() {
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("state_dir = \"/srv/rg\"") && text.contains("user = \"nobody\""),
            "{text}"
        );
    }
}

/// `agent reload` (SIGHUP, then the agent's word in its status file): it returns once the
/// reload is over, so what it says is already true when it returns.
fn reload(host: &Host) -> std::process::Output {
    railgrid()
        .args(["agent", "reload", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("agent reload")
}

#[test]
fn a_reload_keeps_the_running_config_when_the_new_one_is_broken() {
    let host = Host::new();
    let config = host.path("agent.toml");
    fs::write(&config, "[runner]\nstop_grace = \"3s\"\n").expect("write");
    let agent = host.start_agent();
    let runner = host.wait_runner("a runner", |_| true);

    fs::write(
        &config,
        "[runner]\nstop_grace = \"3 fortnights and a bit\"\n",
    )
    .expect("write");
    let out = reload(&host);
    let err = exited(&out, 1);
    assert!(
        err.contains("refused the new configuration") && err.contains("runner.stop_grace"),
        "{err}"
    );
    assert!(
        host.agent_log().contains("keeping the running one"),
        "{}",
        host.agent_log()
    );
    assert_eq!(
        get_json(&host.socket(), "/v1/health").expect("health")["pid"],
        runner
    );
    let st = host.status();
    assert_eq!(st["runner"]["starts"], 1);
    assert_eq!(st["reloads"]["count"], 1, "{st}");

    // A valid change of the runner's settings restarts it, before the reload returns.
    fs::write(&config, "[runner]\nstop_grace = \"4s\"\n").expect("write");
    let out = reload(&host);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let st = host.status();
    assert_eq!(st["runner"]["starts"], 2, "{st}");
    assert_eq!(st["reloads"]["count"], 2, "{st}");
    assert_eq!(st["reloads"]["last_error"], serde_json::Value::Null, "{st}");
    assert_ne!(st["runner"]["pid"], runner, "{st}");
    assert!(!alive(runner));

    // No agent: exit 3, and a pid that is not the agent's is refused.
    let out = railgrid()
        .args(["agent", "reload", "--pid", "1", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("reload");
    exited_saying(&out, 1, "not signalling either");
    drop(agent);
    let out = railgrid()
        .args(["agent", "reload", "--state-dir"])
        .arg(host.path("nowhere"))
        .output()
        .expect("reload");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

#[test]
fn systemd_notifications_bracket_the_runner() {
    let host = Host::new();
    let sock_path = host.path("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind");
    fs::set_permissions(&sock_path, fs::Permissions::from_mode(0o600)).expect("chmod");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let child = host
        .agent_cmd(&[])
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "200000")
        .spawn()
        .expect("spawn");
    let mut agent = Guard::new(child);

    let mut seen = Vec::new();
    let recv_until = |want: &str, seen: &mut Vec<String>| {
        wait_for(LIMIT, want, || {
            let mut buf = [0u8; 4096];
            if let Ok(n) = sock.recv(&mut buf) {
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
            seen.iter().any(|m| m.contains(want)).then_some(())
        })
    };
    recv_until("READY=1", &mut seen);
    // READY=1 came once the runner was started: it is there now.
    let st = host.status();
    let runner = st["runner"]["pid"]
        .as_i64()
        .expect("runner pid after READY=1") as i32;
    assert!(alive(runner));
    assert!(seen.iter().any(|m| m.starts_with("STATUS=")), "{seen:?}");
    // The main loop pings the watchdog at half of WATCHDOG_USEC.
    recv_until("WATCHDOG=1", &mut seen);

    // A reload: RELOADING=1, then READY=1 again once it is over.
    assert_eq!(reload(&host).status.code(), Some(0));
    recv_until("RELOADING=1", &mut seen);
    let reloading = seen
        .iter()
        .position(|m| m.contains("RELOADING=1"))
        .expect("reloading");
    assert!(seen[reloading].contains("MONOTONIC_USEC="), "{seen:?}");
    wait_for(LIMIT, "READY=1 after the reload", || {
        let mut buf = [0u8; 4096];
        if let Ok(n) = sock.recv(&mut buf) {
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        seen[reloading..]
            .iter()
            .any(|m| m.contains("READY=1"))
            .then_some(())
    });

    agent.signal(Signal::SIGTERM);
    recv_until("STOPPING=1", &mut seen);
    let out = agent.wait_output(LIMIT);
    assert_eq!(out.status.code(), Some(0));
    let ready = seen
        .iter()
        .position(|m| m.contains("READY=1"))
        .expect("ready");
    let stopping = seen
        .iter()
        .position(|m| m.contains("STOPPING=1"))
        .expect("stopping");
    assert!(ready < stopping, "{seen:?}");
}

#[test]
fn a_runner_dir_of_another_account_is_refused_not_reowned() {
    if !is_root() || uzers::get_user_by_name("daemon").is_none() {
        eprintln!("SKIPPED: needs root and the daemon account");
        return;
    }
    let host = Host::new();
    let mut agent = host.start_agent();
    host.wait_runner("a runner as nobody", |_| true);
    agent.signal(Signal::SIGTERM);
    assert_eq!(agent.wait_output(LIMIT).status.code(), Some(0));

    let out = railgrid()
        .args(["agent", "run", "--config"])
        .arg(host.path("agent.toml"))
        .arg("--state-dir")
        .arg(host.state())
        .arg("--log-dir")
        .arg(host.path("logs"))
        .args(["--runner-user", "daemon"])
        .output()
        .expect("run");
    let err = exited(&out, 2);
    assert!(
        err.contains(&host.state().join("runner").display().to_string()) && err.contains("daemon"),
        "{err}"
    );
}

#[test]
fn job_limits_in_the_agent_config_reach_the_runner() {
    let host = Host::new();
    fs::write(
        host.path("agent.toml"),
        "[runner]\nmax_jobs = 1\nmax_queued = 1\n",
    )
    .expect("config");
    let _agent = host.start_agent();
    host.wait_runner("a runner", |_| true);
    let spec = |id: &str| format!(r#"{{"id":"{id}","argv":["sleep","1000"]}}"#);
    let socket = host.socket();
    assert_eq!(
        http(&socket, "POST", "/v1/jobs", Some(&spec("a")))
            .expect("post")
            .0,
        201
    );
    assert_eq!(
        http(&socket, "POST", "/v1/jobs", Some(&spec("b")))
            .expect("post")
            .0,
        201
    );
    wait_for(LIMIT, "job a to run", || {
        (get_json(&socket, "/v1/jobs/a")?["state"] == "running").then_some(())
    });
    // One running, one queued: the queue is full at 1.
    assert_eq!(
        get_json(&socket, "/v1/jobs/b").expect("b")["state"],
        "queued"
    );
    assert_eq!(
        http(&socket, "POST", "/v1/jobs", Some(&spec("c")))
            .expect("post")
            .0,
        429
    );
}

#[test]
fn runner_job_path_is_every_jobs_path_unless_the_job_sets_its_own() {
    let host = Host::new();
    fs::write(
        host.path("agent.toml"),
        "[runner]\njob_path = \"/opt/railgrid-test/bin:/usr/bin:/bin\"\n",
    )
    .expect("config");
    let _agent = host.start_agent();
    host.wait_runner("a runner", |_| true);
    let socket = host.socket();
    for (id, env, want) in [
        ("runner-wide", "{}", "/opt/railgrid-test/bin:/usr/bin:/bin"),
        ("own", r#"{"PATH":"/bin"}"#, "/bin"),
    ] {
        let spec = format!(r#"{{"id":"{id}","argv":["sh","-c","echo $PATH"],"env":{env}}}"#);
        let (code, body) = http(&socket, "POST", "/v1/jobs", Some(&spec)).expect("post");
        assert_eq!(code, 201, "{body}");
        wait_for(LIMIT, "the job to end", || {
            (get_json(&socket, &format!("/v1/jobs/{id}"))?["state"] == "succeeded").then_some(())
        });
        let (_, out) = get(&socket, &format!("/v1/jobs/{id}/output/stdout")).expect("output");
        assert_eq!(out.trim(), want);
    }

    // A relative entry is refused, naming the key.
    fs::write(
        host.path("agent.toml"),
        "[runner]\njob_path = \"bin:/usr/bin\"\n",
    )
    .expect("config");
    let out = railgrid()
        .args(["agent", "check-config", "--config"])
        .arg(host.path("agent.toml"))
        .arg("--state-dir")
        .arg(host.state())
        .args(if is_root() {
            vec!["--runner-user", "nobody"]
        } else {
            vec![]
        })
        .output()
        .expect("check-config");
    let err = exited(&out, 2);
    assert!(
        err.contains("runner.job_path") && err.contains("not an absolute"),
        "{err}"
    );
}
