//! The desired state an agent keeps across a hub that is down, ahead, renumbered or corrupt, and a token file it cannot use.

use super::*;

#[test]
fn an_agent_ahead_of_its_hub_takes_the_hubs_state_and_a_renumbered_hub_is_followed() {
    // The agent applied generation 100 once; the reference hub never handed it out (it
    // was restored from an older backup): the hub's own state wins, as a reset.
    let tmp = tempdir();
    let dir = tmp.path().join("hub");
    let (h, hub) = HubHost::enrolled(&dir, "a1");
    let state = h.host.state();
    fs::create_dir_all(&state).expect("state dir");
    fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).expect("chmod");
    write_private(&state.join("desired.json"), r#"{"generation": 100}"#);
    let agent = h.start_agent(&hub.url);
    let runner = h.host.wait_runner("a runner", |_| true);
    let g = hub_generation(&hub, "a1");
    assert!(g < 100, "{g}");
    h.wait_status("the hub's own generation applied", LIMIT, connected_at(g));
    let log = h.host.agent_log();
    assert!(
        log.contains("the hub refuses the generation this agent reports")
            && log.contains("reset to the hub's desired state"),
        "{log}"
    );

    // A counter at the end of its range: changes are refused, naming the way back.
    let (url, listen) = (hub.url.clone(), hub.listen.clone());
    assert!(hub.stop().status.success());
    let db = rusqlite::Connection::open(dir.join("hub.db")).expect("db");
    db.execute(
        "UPDATE meta SET value = ?1 WHERE key = 'generation'",
        [1i64 << 53],
    )
    .expect("edit");
    drop(db);
    let hub = TestHub::start_on(&dir, &listen, &[]);
    assert_eq!(hub.url, url);
    let out = hub.admin(&["desired", "set", "--fleet", "--max-jobs", "3"]);
    exited_saying(&out, 1, "hub store renumber");

    // The way back: with the hub stopped, the counter starts over; the agent, whose
    // number may now name another state, is told to take the hub's.
    let refused = railgrid()
        .args(["hub", "store", "renumber", "--data-dir"])
        .arg(&dir)
        .output()
        .expect("renumber");
    assert_eq!(
        refused.status.code(),
        Some(2),
        "a serving hub holds the data dir"
    );
    assert!(hub.stop().status.success());
    let out = railgrid()
        .args(["hub", "store", "renumber", "--data-dir"])
        .arg(&dir)
        .output()
        .expect("renumber");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("was 9007199254740992 and is 1"), "{text}");
    let hub = TestHub::start_on(&dir, &listen, &[]);
    h.wait_status(
        "generation 1 applied",
        Duration::from_secs(90),
        connected_at(1),
    );
    let shown = hub.admin_json(&["desired", "set", "--fleet", "--max-jobs", "3"]);
    assert_eq!(shown["generation"], 2, "{shown}");
    // Within a long poll, not after one has timed out: the agent's reset must leave it
    // polling at once (it once paused the 30 s a hub that does not hold polls asks for).
    let changed = std::time::Instant::now();
    h.wait_status("generation 2 applied", APPLIED, connected_at(2));
    assert!(
        changed.elapsed() < Duration::from_secs(10),
        "generation 2 took {:?}",
        changed.elapsed()
    );
    wait_for(APPLIED, "max_jobs 3 at the runner", || {
        (admission(&h)?["max_jobs"] == 3).then_some(())
    });
    assert_eq!(h.host.status()["runner"]["pid"], runner);
    assert!(alive(agent.pid()));
    h.assert_token_kept_secret();
}

/// A port nothing listens on.
fn closed_port_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    format!("https://{addr}")
}

#[test]
fn an_agent_started_while_its_hub_is_down_keeps_the_last_desired_state() {
    let ca = TestCa::new();
    let h = HubHost::new(&ca.pem());
    // What the hub said last: no runner on this host.
    let state = h.host.state();
    fs::create_dir_all(&state).expect("state dir");
    fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).expect("chmod");
    write_private(
        &state.join("desired.json"),
        r#"{"generation": 5, "runner": {"enabled": false}}"#,
    );
    let url = closed_port_url();
    let agent = h.start_agent(&url);

    let st = h.wait_hub_error("Connection refused", LIMIT);
    assert_eq!(st["hub"]["connected"], false, "{st:#}");
    assert_eq!(st["hub"]["generation"], 5, "{st:#}");
    assert_eq!(st["runner_enabled"], false, "{st:#}");
    assert_eq!(st["runner"]["state"], "stopped", "{st:#}");
    assert_eq!(st["runner"]["starts"], 0, "no runner was started: {st:#}");
    assert!(st["runner"]["pid"].is_null());
    assert!(!h.host.socket().exists(), "no runner socket");
    let out = agent_status(&state);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("runner:     disabled by the desired state")
            && text.contains("generation 5 applied"),
        "{text}"
    );
    assert!(
        h.host
            .agent_log()
            .contains("starting from the desired state the hub gave last"),
        "{}",
        h.host.agent_log()
    );
    assert!(alive(agent.pid()));
    h.assert_token_kept_secret();
}

/// An agent whose kept desired state is `kept` starts from the standalone default (a
/// runner), saying why, while its hub is down.
fn the_kept_desired_state_is_ignored(kept: &str) {
    let ca = TestCa::new();
    let h = HubHost::new(&ca.pem());
    let state = h.host.state();
    fs::create_dir_all(&state).expect("state dir");
    fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).expect("chmod");
    write_private(&state.join("desired.json"), kept);
    let _agent = h.start_agent(&closed_port_url());
    // The standalone default: a runner.
    h.host.wait_runner("a runner", |_| true);
    let log = h.host.agent_log();
    assert!(
        log.contains("ignoring the kept desired state") && log.contains("desired.json"),
        "{log}"
    );
    assert_eq!(h.status_json()["hub"]["generation"], 0);
}

#[test]
fn a_corrupt_kept_desired_state_is_logged_and_ignored() {
    the_kept_desired_state_is_ignored("{\"generation\": 5, \"runn");
}

#[test]
fn a_kept_desired_state_beyond_2_pow_53_is_ignored() {
    // Kept by an agent that did not check the bound: it would refuse every real answer
    // as older.
    the_kept_desired_state_is_ignored(
        r#"{"generation": 9007199254740993, "runner": {"enabled": false}}"#,
    );
}

#[test]
fn an_unusable_token_file_is_a_configuration_error() {
    let ca = TestCa::new();
    let h = HubHost::new(&ca.pem());
    write_private(&h.host.path("token"), "\n");
    let mut agent = h.start_agent(&closed_port_url());
    let out = agent.wait_output(LIMIT);
    assert_eq!(out.status.code(), Some(2));
    assert!(!h.host.state().join("runner").exists(), "nothing started");
    let check = check_config(&h, &[]);
    exited_saying(&check, 2, "is empty");

    // A good token: check-config names the file, never the token.
    write_private(&h.host.path("token"), &h.token);
    let ca = h.host.path("ca.pem");
    let check = check_config(
        &h,
        &["--agent-id", "a7", "--ca-file", ca.to_str().expect("utf-8")],
    );
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{check:?}");
    assert!(
        text.contains("agent_id = \"a7\"")
            && text.contains("token = \"<redacted>\"")
            && text.contains(&path_str(&h.host.path("token"))),
        "{text}"
    );
    assert!(!text.contains(&h.token), "{text}");
}
