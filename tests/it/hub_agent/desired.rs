//! The hub's desired state applied: the runner stopped and started, admission limits, a revoked token, labels.

use super::*;

#[test]
fn the_hubs_desired_state_stops_and_starts_the_runner() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    let agent = h.start_agent(&hub.url);
    let first = h.host.wait_runner("a runner", |_| true);
    let g = hub_generation(&hub, "a1");
    h.wait_status(
        "connected, the hub's generation applied",
        LIMIT,
        connected_at(g),
    );

    let changed = std::time::Instant::now();
    hub.set_desired("a1", &["--runner-enabled", "false"]);
    let off = hub_generation(&hub, "a1");
    assert!(off > g);
    let st = h.wait_status("the runner stopped by the hub", APPLIED, |st| {
        st["hub"]["generation"].as_u64() == Some(off) && st["runner"]["state"] == "stopped"
    });
    println!("runner disabled by the hub in {:?}", changed.elapsed());
    assert_eq!(st["runner_enabled"], false);
    assert!(st["runner"]["pid"].is_null());
    wait_for(LIMIT, "the old runner gone", || {
        (!alive(first)).then_some(())
    });
    // Kept for a start while the hub is down.
    let kept: Value =
        serde_json::from_str(&read_lossy(&h.host.state().join("desired.json"))).expect("kept");
    assert_eq!(kept["generation"], off);
    assert_eq!(kept["runner"]["enabled"], false);
    let mode = fs::metadata(h.host.state().join("desired.json"))
        .expect("desired.json")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // The hub hears what was applied.
    let shown = wait_for(LIMIT, "the hub sees generation applied", || {
        let a = hub.admin_json(&["agent", "show", "a1"]);
        (a["observed_generation"].as_u64() == Some(off)).then_some(a)
    });
    assert_eq!(shown["report"]["runner"]["state"], "disabled", "{shown:#}");
    assert_eq!(shown["report"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(shown["report"]["os"], std::env::consts::OS);

    hub.set_desired("a1", &["--runner-enabled", "true"]);
    let on = hub_generation(&hub, "a1");
    let second = h.host.wait_runner("a runner started by the hub", |st| {
        st["hub"]["generation"].as_u64() == Some(on) && st["runner"]["starts"] == 2
    });
    assert_ne!(second, first);

    // A desired agent version, without trusted keys: shown, refused, and the runner is
    // left alone.
    hub.set_desired("a1", &["--version", "9.9.9"]);
    let v = hub_generation(&hub, "a1");
    let st = h.wait_status("the desired version", APPLIED, connected_at(v));
    assert_eq!(st["hub"]["desired_version"], "9.9.9", "{st:#}");
    assert_eq!(st["runner"]["pid"], second, "no restart for a version");
    let st = wait_for(LIMIT, "the upgrade refused", || {
        let st = h.host.status();
        (st["upgrade"]["state"] == "refused").then_some(st)
    });
    assert_says(&st["upgrade"], "error", "no [upgrade] trusted_keys");
    let log = h.host.agent_log();
    assert!(log.contains("the upgrade takes it from here"), "{log}");
    assert!(
        log.contains("hub: the desired state disables the runner; it drains first")
            && log.contains("the runner has no job left: stopping it")
            && log.contains("hub: the desired state enables the runner; starting it"),
        "{log}"
    );
    assert!(alive(agent.pid()));
    h.assert_token_kept_secret();
}

#[test]
fn a_restarted_hub_keeps_the_agent_and_its_desired_state() {
    let tmp = tempdir();
    let dir = tmp.path().join("hub");
    let (h, hub) = HubHost::enrolled(&dir, "a1");
    let _agent = h.start_agent(&hub.url);
    h.host.wait_runner("a runner", |_| true);
    let off = disable_runner(&h, &hub, "a1");

    let (url, listen) = (hub.url.clone(), hub.listen.clone());
    let out = hub.stop();
    assert!(out.status.success(), "hub exit: {:?}", out.status);
    h.wait_status("the agent sees the hub gone", LIMIT, |st| {
        st["hub"]["connected"] == false
    });
    // Without its hub the agent keeps what it was told: still no runner.
    let st = h.host.status();
    assert_eq!(st["runner"]["state"], "stopped", "{st:#}");
    assert_eq!(st["runner"]["starts"], 1, "{st:#}");

    let hub = TestHub::start_on(&dir, &listen, &[]);
    assert_eq!(hub.url, url);
    // The same token still works, and the same desired state holds.
    h.wait_status(
        "connected again",
        Duration::from_secs(90),
        connected_at(off),
    );
    assert!(
        h.host.agent_log().contains("hub reachable again"),
        "{}",
        h.host.agent_log()
    );
    assert_eq!(h.host.status()["runner"]["starts"], 1);
    hub.set_desired("a1", &["--runner-enabled", "true"]);
    h.host
        .wait_runner("a runner started after the hub's restart", |st| {
            st["runner"]["starts"] == 2
        });
    h.assert_token_kept_secret();
}

#[test]
fn a_revoked_token_shows_in_status_and_the_runner_keeps_running() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    // Each retry is logged at debug level: the test sees them happen.
    let mut cmd = h.agent_command(&hub.url, "a1");
    cmd.env("RAILGRID_LOG", "info,railgrid_agent::hub=debug");
    let agent = Guard::new(cmd.spawn().expect("spawn agent"));
    let runner = h.host.wait_runner("a runner", |_| true);
    let g = hub_generation(&hub, "a1");
    h.wait_status("connected", LIMIT, connected_at(g));

    hub.admin_ok(&["agent", "revoke", "a1"]);
    let st = h.wait_hub_error(
        "the hub refused this agent's token (revoked or unknown)",
        LIMIT,
    );
    assert_eq!(st["hub"]["connected"], false);
    let err = st["hub"]["last_error"].as_str().expect("error");
    assert!(err.contains("answered 401"), "{err}");
    // Retried (each one refused) and logged once.
    let seen = hub.admin_json(&["agent", "show", "a1"]);
    assert_eq!(seen["revoked"], true);
    wait_for(LIMIT, "three tries, each refused", || {
        (count(&h.host.agent_log(), "next reconcile after the backoff") >= 3).then_some(())
    });
    let log = h.host.agent_log();
    assert_eq!(count(&log, "hub reconcile failed"), 1, "{log}");
    assert!(alive(agent.pid()));
    let now = h.host.status();
    assert_eq!(now["runner"]["pid"], runner);
    assert_eq!(now["runner"]["starts"], 1);
    assert_eq!(
        get_json(&h.host.socket(), "/v1/health").expect("health")["pid"],
        runner
    );
    h.assert_token_kept_secret();

    // Enrolled again (deliberately): the new token in the same file, and SIGHUP reads it.
    let fresh = hub.enrol_again("a1");
    assert_eq!(fresh, h.token_file);
    let new_token = read_lossy(&fresh).trim().to_owned();
    assert_ne!(new_token, h.token);
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    h.wait_status("connected with the new token", LIMIT, |st| {
        st["hub"]["connected"] == true
    });
    assert!(h.host.agent_log().contains("hub reachable again"));
    assert_eq!(h.host.status()["runner"]["pid"], runner);
    assert!(!h.host.agent_log().contains(&new_token));
}

#[test]
fn admission_limits_from_the_hub_reach_the_running_runner_and_survive_its_restart() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    // A limit the hub leaves alone comes from the config file.
    fs::write(h.host.path("agent.toml"), "[runner]\nmax_queued = 7\n").expect("config");
    let agent = h.start_agent(&hub.url);
    let runner = h.host.wait_runner("a runner", |_| true);
    let g = hub_generation(&hub, "a1");
    h.wait_status("connected", LIMIT, connected_at(g));
    assert_eq!(admission(&h).expect("admission")["max_queued"], 7);

    hub.set_desired("a1", &["--max-jobs", "3"]);
    let three = hub_generation(&hub, "a1");
    h.wait_status("max_jobs applied", APPLIED, connected_at(three));
    let limits = admission(&h).expect("admission");
    assert_eq!(limits["max_jobs"], 3, "{limits}");
    assert_eq!(limits["max_queued"], 7, "{limits}");
    // Live: the same runner.
    let st = h.host.status();
    assert_eq!(st["runner"]["pid"], runner, "{st:#}");
    assert_eq!(st["runner"]["starts"], 1, "{st:#}");
    assert!(
        h.host
            .agent_log()
            .contains("changed; the running runner took the new admission limits"),
        "{}",
        h.host.agent_log()
    );

    // A runner restarted after a crash comes back with the hub's limit, not the old one.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9");
    h.host
        .wait_runner("the restarted runner", |st| st["runner"]["starts"] == 2);
    let limits = wait_for(LIMIT, "the restarted runner's limits", || admission(&h));
    assert_eq!(limits["max_jobs"], 3, "{limits}");
    assert_eq!(limits["max_queued"], 7, "{limits}");

    // SIGHUP with a hub: the hub's desired state stays, the file's new value joins it.
    fs::write(h.host.path("agent.toml"), "[runner]\nmax_queued = 9\n").expect("config");
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    let limits = wait_for(LIMIT, "the reloaded max_queued", || {
        admission(&h).filter(|l| l["max_queued"] == 9)
    });
    assert_eq!(limits["max_jobs"], 3, "{limits}");
    assert_eq!(h.host.status()["runner"]["starts"], 2);

    // The hub stops setting the limit: the running runner goes back to its default in
    // place (a restart would end its jobs).
    let runner = h.host.status()["runner"]["pid"].clone();
    hub.set_desired("a1", &["--clear", "max_jobs"]);
    let cleared = hub_generation(&hub, "a1");
    h.wait_status("the cleared limit applied", APPLIED, connected_at(cleared));
    let limits = admission(&h).expect("admission");
    assert_ne!(limits["max_jobs"], 3, "{limits}");
    let st = h.host.status();
    assert_eq!(st["runner"]["pid"], runner, "{st:#}");
    assert_eq!(st["runner"]["starts"], 2, "{st:#}");
    assert!(!h.host.agent_log().contains("restarting the runner"));
    h.assert_token_kept_secret();
}

#[test]
fn sighup_with_a_hub_keeps_the_hubs_desired_state() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    fs::write(h.host.path("agent.toml"), "[runner]\nstop_grace = \"3s\"\n").expect("config");
    let agent = h.start_agent(&hub.url);
    h.host.wait_runner("a runner", |_| true);
    let off = disable_runner(&h, &hub, "a1");

    // A new local setting: applied with the hub's desired state, which keeps the runner
    // off (a standalone reload would have started one).
    fs::write(h.host.path("agent.toml"), "[runner]\nstop_grace = \"4s\"\n").expect("config");
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for(LIMIT, "the reload", || {
        h.host
            .agent_log()
            .contains("SIGHUP: runner settings unchanged")
            .then_some(())
    });
    let st = h.host.status();
    assert_eq!(st["runner"]["state"], "stopped", "{st:#}");
    assert_eq!(st["runner_enabled"], false, "{st:#}");
    assert_eq!(st["hub"]["generation"], off);

    // Enabled again, the runner comes with the reloaded settings.
    hub.set_desired("a1", &["--runner-enabled", "true"]);
    h.host.wait_runner("a runner started by the hub", |st| {
        st["runner"]["starts"] == 2
    });
    // Another local change while it runs: a restart, saying why.
    fs::write(h.host.path("agent.toml"), "[runner]\nstop_grace = \"5s\"\n").expect("config");
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    h.host
        .wait_runner("a runner with the new stop grace", |st| {
            st["runner"]["starts"] == 3
        });
    assert!(
        h.host
            .agent_log()
            .contains("SIGHUP: restarting the runner: stop_grace changed"),
        "{}",
        h.host.agent_log()
    );
}

#[test]
fn admission_limits_set_before_the_agent_starts_need_no_runner_restart() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    hub.set_desired("a1", &["--max-jobs", "13"]);
    let g = hub_generation(&hub, "a1");
    // The runner starts from the standalone default; the hub's first answer comes while
    // it may not serve yet, and its limit is still taken live.
    let _agent = h.start_agent(&hub.url);
    let st = h.wait_status("the hub's limit applied", APPLIED, connected_at(g));
    let first = st["runner"]["pid"].clone();
    let limits = wait_for(LIMIT, "the runner's limits", || admission(&h));
    assert_eq!(limits["max_jobs"], 13, "{limits}");
    let st = h.host.status();
    assert_eq!(st["runner"]["starts"], 1, "{st:#}");
    assert_eq!(st["runner"]["pid"], first, "{st:#}");
    let log = h.host.agent_log();
    assert!(!log.contains("restarting the runner"), "{log}");
    assert!(
        log.contains("max_jobs, max_jobs_per_owner changed; the running runner took the new admission limits"),
        "{log}"
    );
}

#[test]
fn an_agent_started_while_its_hub_is_down_says_connected_when_it_first_answers() {
    let tmp = tempdir();
    let dir = tmp.path().join("hub");
    let (h, hub) = HubHost::enrolled(&dir, "a1");
    let (url, listen) = (hub.url.clone(), hub.listen.clone());
    assert!(hub.stop().status.success());
    let _agent = h.start_agent(&url);
    h.wait_hub_error("Connection refused", LIMIT);

    let hub = TestHub::start_on(&dir, &listen, &[]);
    let g = hub_generation(&hub, "a1");
    h.wait_status("connected", Duration::from_secs(90), connected_at(g));
    let log = h.host.agent_log();
    assert!(log.contains("connected to the hub"), "{log}");
    assert!(!log.contains("hub reachable again"), "{log}");
}

/// Disables agent `id`'s runner at the hub, waits until the agent has stopped it, and
/// returns the generation that did it.
fn disable_runner(h: &HubHost, hub: &TestHub, id: &str) -> u64 {
    hub.set_desired(id, &["--runner-enabled", "false"]);
    let off = hub_generation(hub, id);
    h.wait_status("the runner stopped by the hub", APPLIED, |st| {
        connected_at(off)(st) && st["runner"]["state"] == "stopped"
    });
    off
}

#[test]
fn the_hosts_labels_and_the_hubs_reach_agent_list_and_a_sighup_changes_the_hosts() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    let config = h.host.path("agent.toml");
    fs::write(
        &config,
        "[agent]\nlabels = { queue = \"build\", tier = \"dev\" }\n",
    )
    .expect("config");
    let agent = h.start_agent(&hub.url);
    let labels_at_hub = |what: &str, accept: &dyn Fn(&Value) -> bool| {
        wait_for(LIMIT, what, || {
            let a = hub.admin_json(&["agent", "show", "a1"]);
            accept(&a["labels"]).then_some(a)
        })
    };
    let shown = labels_at_hub("the host's labels at the hub", &|l| l["queue"] == "build");
    assert_eq!(shown["labels"]["tier"], "dev", "{shown:#}");
    assert_eq!(
        shown["labels"]["os"],
        std::env::consts::OS,
        "added by the agent"
    );
    assert_eq!(shown["labels"]["arch"], std::env::consts::ARCH);
    assert!(shown["labels"]["hostname"].is_string(), "{shown:#}");

    // The hub's label wins over the host's, and both show in the list.
    let set: Value = serde_json::from_str(&hub.admin_ok(&[
        "agent",
        "label",
        "a1",
        "tier=prod",
        "zone=b",
        "--json",
    ]))
    .expect("json");
    assert_eq!(set["labels"]["tier"], "prod", "{set:#}");
    assert_eq!(
        set["hub_labels"],
        serde_json::json!({"tier": "prod", "zone": "b"})
    );
    let table = hub.admin_ok(&["agent", "list"]);
    assert!(table.contains("queue=build,tier=prod,zone=b"), "{table}");
    // The host's name is a label the table shows (os and arch have a column).
    assert!(table.contains("hostname="), "{table}");
    let detail = hub.admin_ok(&["agent", "show", "a1"]);
    assert!(detail.contains("by hub:    tier=prod,zone=b"), "{detail}");
    // The report that follows (the change answered the held poll) says how many jobs
    // the runner runs at once.
    h.host.wait_runner("a runner", |_| true);
    hub.admin_ok(&["agent", "label", "a1", "zone=c"]);
    wait_for(LIMIT, "the runner's admission limit in the report", || {
        let a = hub.admin_json(&["agent", "show", "a1"]);
        (a["report"]["jobs_summary"]["max_jobs"].as_u64() >= Some(1)).then_some(())
    });

    // A SIGHUP sends the host's new labels; the hub's stay over them.
    fs::write(
        &config,
        "[agent]\nlabels = { queue = \"test\", tier = \"dev\" }\n",
    )
    .expect("config");
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    let shown = labels_at_hub("the new host labels", &|l| l["queue"] == "test");
    assert_eq!(shown["labels"]["tier"], "prod", "{shown:#}");
    // Removing the hub's label shows the host's again.
    hub.admin_ok(&["agent", "label", "a1", "--remove", "tier"]);
    labels_at_hub("the host's tier again", &|l| l["tier"] == "dev");

    // Bad input is refused, naming it, and changes nothing.
    for (args, code, says) in [
        (vec!["agent", "label", "a1", "Tier=x"], 2, "\"Tier\""),
        (vec!["agent", "label", "a1", "tier"], 2, "KEY=VALUE"),
        (vec!["agent", "label", "a1"], 2, "--remove"),
        (vec!["agent", "label", "nobody", "x=1"], 1, "unknown agent"),
    ] {
        let out = hub.admin(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let kept = hub.admin_json(&["agent", "show", "a1"]);
    assert_eq!(
        kept["hub_labels"],
        serde_json::json!({"zone": "c"}),
        "{kept:#}"
    );
}

/// What the fake hub of [`runner_settings_the_agent_cannot_apply_hold_no_job_back`] says:
/// every upload taken whole, and to a reconcile the desired state of `phase`.
fn jobs_apart_hub(req: &str, phase: usize) -> (&'static str, String) {
    if let Some(offset) = req
        .strip_prefix("PUT ")
        .and_then(|r| r.split_once("offset="))
        .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<usize>().ok())
    {
        let body = req.split_once("\r\n\r\n").map_or(0, |(_, b)| b.len());
        return ("200 OK", format!(r#"{{"length": {}}}"#, offset + body));
    }
    let job = r#"{"id": "j1", "spec": {"id": "j1", "argv": ["echo", "hi"]}}"#;
    let answer = match phase {
        0 => r#"{"generation": 1, "poll_interval_secs": 1, "runner": {"enabled": true}}"#.into(),
        // A spool cap needs a new runner, which this host cannot build for now.
        1 => format!(
            r#"{{"generation": 2, "poll_interval_secs": 1, "runner": {{"enabled": true, "max_output_bytes": 65536}}, "jobs": [{job}]}}"#
        ),
        _ => format!(
            r#"{{"generation": 3, "poll_interval_secs": 1, "runner": {{"enabled": true, "max_output_bytes": 65536}}, "jobs": [{job}]}}"#
        ),
    };
    ("200 OK", answer)
}

#[test]
fn runner_settings_the_agent_cannot_apply_hold_no_job_back() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let ca = TestCa::new();
    let phase = std::sync::Arc::new(AtomicUsize::new(0));
    let p = phase.clone();
    let hub = FakeHub::scripted(ca.server(), move |req| {
        jobs_apart_hub(req, p.load(Ordering::SeqCst))
    });
    let h = HubHost::new(&ca.pem());
    let _agent = h.start_agent(&hub.url);
    h.wait_status("generation 1 applied", LIMIT, |st| {
        st["hub"]["generation"] == 1 && st["runner"]["state"] == "running"
    });
    // A new runner cannot be built while its log directory is not one.
    let logs = h.host.path("logs");
    let aside = h.host.path("logs.aside");
    fs::rename(&logs, &aside).expect("move the log directory aside");
    fs::write(&logs, "").expect("a file in its place");
    phase.store(1, Ordering::SeqCst);
    let st = h.wait_hub_error("generation 2", LIMIT);
    assert_eq!(st["hub"]["generation"], 1, "{st:#}");
    // The job in the refused answer ran all the same, and its end reached the hub.
    wait_for(LIMIT, "j1 reported succeeded", || {
        hub.requests()
            .iter()
            .any(|r| {
                r.starts_with("POST ")
                    && report_of(r)["jobs"].as_array().is_some_and(|js| {
                        js.iter()
                            .any(|j| j["id"] == "j1" && j["state"] == "succeeded")
                    })
            })
            .then_some(())
    });
    fs::remove_file(&logs).expect("the file");
    fs::rename(&aside, &logs).expect("the log directory back");
    phase.store(2, Ordering::SeqCst);
    h.wait_status("generation 3 applied", LIMIT, |st| {
        st["hub"]["generation"] == 3
    });
    // What is kept on disk is settings, never a job's spec.
    let kept: Value =
        serde_json::from_str(&read_lossy(&h.host.state().join("desired.json"))).expect("kept");
    assert_eq!(kept["generation"], 3, "{kept:#}");
    assert!(kept.get("jobs").is_none(), "{kept:#}");
}

#[test]
fn the_hubs_network_policy_reaches_the_runner_and_a_job_cannot_widen_it() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    let _agent = h.start_agent(&hub.url);
    h.host.wait_runner("a runner", |_| true);
    hub.admin_ok(&["desired", "set", "--fleet", "--network", "none"]);
    let g = hub_generation(&hub, "a1");
    h.wait_status("network none applied", APPLIED, connected_at(g));
    assert!(
        h.host
            .agent_log()
            .contains("restarting the runner: network changed"),
        "{}",
        h.host.agent_log()
    );
    // `agent status` says so once the new runner answers.
    wait_for(LIMIT, "agent status saying network none", || {
        (h.status_json()["runner"]["network"] == "none").then_some(())
    });
    // A job through the hub gets a network namespace of its own.
    let out = hub.admin(&[
        "job", "submit", "--agent", "a1", "--id", "n1", "--wait", "--", "true",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The runner's own record says so (the hub's does not carry the confinement).
    let out = railgrid()
        .args(["job", "--state-dir"])
        .arg(h.host.state())
        .args(["status", "n1", "--json"])
        .output()
        .expect("job status");
    let rec: Value = serde_json::from_slice(&out.stdout).expect("the runner's record");
    assert_says(&rec, "confinement", "; network: none");
    // One that asks for the host's network is refused by the runner, saying why.
    let out = hub.admin(&[
        "job",
        "submit",
        "--agent",
        "a1",
        "--id",
        "n2",
        "--network",
        "open",
        "--wait",
        "--",
        "true",
    ]);
    assert!(!out.status.success());
    let rec = hub.admin_json(&["job", "status", "n2"]);
    assert_eq!(rec["state"], "rejected", "{rec}");
    assert_says(&rec, "error", "runner.network = \"none\"");

    // Widening takes jobs:network: a token without it is refused at the hub.
    let narrow = tmp.path().join("ci.token");
    hub.create_token("ci", "jobs:submit,jobs:read", &[], &narrow);
    let allow = ["--allow", "127.0.0.1:9", "--widen-network"];
    let out = railgrid()
        .args(["hub", "--hub", &hub.url, "--ca-file"])
        .arg(hub.ca())
        .arg("--token-file")
        .arg(&narrow)
        .args(["job", "submit", "--agent", "a1", "--id", "n3"])
        .args(allow)
        .args(["--", "true"])
        .output()
        .expect("hub job submit");
    assert!(!out.status.success());
    // A job naming a secret the hub does not hold is refused here, not at the runner.
    let body = r#"{"agent": "a1", "spec": {"argv": ["true"], "secrets": ["A_KEY"]}}"#;
    let (code, answer) = hub.curl(
        "POST",
        "/v1/admin/jobs",
        Some(&hub.admin_token()),
        Some(body),
    );
    assert_eq!(code, 404, "{answer}");
    assert!(answer.contains("no secret A_KEY at this hub"), "{answer}");
    // So does a desired network that may widen what jobs reach, set or cleared.
    let ops = tmp.path().join("ops.token");
    hub.create_token("ops", "agents:write", &[], &ops);
    for change in [&["--network", "open"][..], &["--clear", "network"][..]] {
        let out = railgrid()
            .args(["hub", "--hub", &hub.url, "--ca-file"])
            .arg(hub.ca())
            .arg("--token-file")
            .arg(&ops)
            .args(["desired", "set", "--agent", "a1"])
            .args(change)
            .output()
            .expect("hub desired set");
        assert!(!out.status.success(), "{change:?}");
        assert!(
            text(&out.stderr).contains("has no scope jobs:network"),
            "{}",
            text(&out.stderr)
        );
    }
    assert!(
        text(&out.stderr).contains("has no scope jobs:network"),
        "{}",
        text(&out.stderr)
    );
    // One that has it (the root token) gives the job an `allow` wider than `none`: what
    // its proxy refused reaches the hub's status.
    let script = "curl -sS -o /dev/null http://169.254.169.254/ || true";
    let mut args = vec!["job", "submit", "--agent", "a1", "--id", "n4"];
    args.extend(allow);
    args.extend(["--wait", "--", "sh", "-c", script]);
    let out = hub.admin(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rec = hub.admin_json(&["job", "status", "n4"]);
    assert_eq!(
        rec["egress_denied"][0]["destination"], "169.254.169.254:80",
        "{rec}"
    );
    assert_eq!(rec["egress_denied"][0]["count"], 1, "{rec}");
    let status = hub.admin_ok(&["job", "status", "n4"]);
    let line = status.lines().find(|l| l.starts_with("egress denied"));
    assert!(
        line.is_some_and(|l| l.ends_with(
            "169.254.169.254:80 ×1: no rule allows the address 169.254.169.254 on port 80"
        )),
        "{status}"
    );
}

/// Runner settings the host cannot take (a new runner cannot be built while its log
/// directory is a file): the agent says which generation it refused, the hub holds its
/// polls as it would an agent's that applied it (no answer of the same state at once, no
/// backoff in between), a job still runs as soon as it is given, and a newer state wakes
/// the poll and is applied once the host can take it.
#[test]
fn an_agent_holding_refused_settings_keeps_a_held_poll_and_takes_jobs_at_once() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    let _agent = h.start_agent(&hub.url);
    h.host.wait_runner("a runner", |_| true);
    let before = hub_generation(&hub, "a1");
    h.wait_status("the first state applied", APPLIED, connected_at(before));
    let logs = h.host.path("logs");
    let aside = h.host.path("logs.aside");
    fs::rename(&logs, &aside).expect("move the log directory aside");
    fs::write(&logs, "").expect("a file in its place");
    // Another network needs a new runner, which this host cannot build for now.
    hub.admin_ok(&["desired", "set", "--agent", "a1", "--network", "none"]);
    let refused = hub_generation(&hub, "a1");
    h.wait_hub_error(&format!("generation {refused}"), LIMIT);
    let held = || {
        let (_, body) = hub.curl("GET", "/v1/health", None, None);
        serde_json::from_str::<Value>(&body).expect("health")["polls_held"].as_u64()
    };
    wait_for(LIMIT, "the refusing agent's poll held", || {
        (held() == Some(1)).then_some(())
    });
    let shown = hub.admin_json(&["agent", "show", "a1"]);
    assert_eq!(shown["report"]["refused_generation"], refused, "{shown:#}");

    let out = hub.admin(&[
        "job", "submit", "--agent", "a1", "--id", "r-job", "--wait", "--", "true",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        h.status_json()["hub"]["generation"],
        before,
        "still refused"
    );

    fs::remove_file(&logs).expect("the file");
    fs::rename(&aside, &logs).expect("the log directory back");
    hub.admin_ok(&["desired", "set", "--agent", "a1", "--max-jobs", "3"]);
    let g = hub_generation(&hub, "a1");
    h.wait_status("the newer state applied", APPLIED, connected_at(g));
    let shown = hub.admin_json(&["agent", "show", "a1"]);
    assert!(shown["report"]["refused_generation"].is_null(), "{shown:#}");
}
