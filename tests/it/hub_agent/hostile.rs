//! A hub that is broken or hostile: errors, garbage, a flood, another CA, silence, answers that would leak the token.

use super::*;

#[test]
fn a_hub_answering_500_leaves_the_runner_alone_and_the_error_in_status() {
    let ca = TestCa::new();
    let hub = FakeHub::start(Misbehaviour::ServerError, ca.server());
    let h = HubHost::new(&ca.pem());
    let _agent = h.start_agent(&hub.url);
    let runner = h.host.wait_runner("a runner", |_| true);
    let st = h.wait_hub_error("answered 500: the store is on fire", LIMIT);
    assert_eq!(st["hub"]["connected"], false, "{st:#}");
    wait_for(LIMIT, "three attempts", || {
        (hub.connections() >= 3).then_some(())
    });
    assert_eq!(count(&h.host.agent_log(), "hub reconcile failed"), 1);

    // What the agent sent: its report, with the token in one header.
    let requests = hub.requests();
    let first = &requests[0];
    assert!(
        first.starts_with("POST /v1/agents/a1/reconcile?wait=0 HTTP/1.1\r\n"),
        "{first}"
    );
    assert!(
        first.contains(&format!("authorization: Bearer {}\r\n", h.token)),
        "{first}"
    );
    let r = report_of(first);
    assert_eq!(r["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(r["os"], std::env::consts::OS);
    assert_eq!(r["arch"], std::env::consts::ARCH);
    assert!(!r["hostname"].as_str().expect("hostname").is_empty());
    assert_eq!(r["observed_generation"], 0);
    // Once the runner serves, the report has its pid and job counts.
    let later = wait_for(LIMIT, "a report of the running runner", || {
        hub.requests()
            .iter()
            .map(|q| report_of(q))
            .find(|r| r["runner"]["pid"] == runner && r["jobs_summary"].is_object())
    });
    assert_eq!(later["runner"]["state"], "running");
    assert_eq!(later["runner"]["starts"], 1);
    assert_eq!(later["jobs_summary"]["running"], 0);

    let text = agent_status(&h.host.state());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("hub:        {} as a1: not connected", hub.url))
            && text.contains("hub error:  https://")
            && text.contains("the store is on fire"),
        "{text}"
    );
    assert_eq!(h.host.status()["runner"]["pid"], runner);
    h.assert_token_kept_secret();
}

#[test]
fn a_hub_answering_garbage_is_an_error_not_a_crash() {
    the_agent_rides_out(
        Misbehaviour::Garbage,
        "the answer is not a desired state",
        LIMIT,
        3,
    );
}

#[test]
fn a_hub_answering_100_mib_is_cut_off_at_the_cap() {
    the_agent_rides_out(
        Misbehaviour::Huge,
        "the answer is larger than 1048576 bytes",
        LIMIT,
        3,
    );
}

#[test]
fn a_hub_with_a_certificate_of_another_ca_is_refused() {
    let other = TestCa::new();
    let ca = TestCa::new();
    let hub = FakeHub::start(Misbehaviour::Garbage, other.server());
    let h = HubHost::new(&ca.pem());
    let agent = h.start_agent(&hub.url);
    let runner = h.host.wait_runner("a runner", |_| true);
    let st = h.wait_hub_error("invalid peer certificate", LIMIT);
    assert_eq!(st["hub"]["connected"], false);
    wait_for(LIMIT, "three attempts", || {
        (hub.connections() >= 3).then_some(())
    });
    assert!(
        hub.requests().is_empty(),
        "no request (and no token) went to a hub the agent does not trust"
    );
    assert_eq!(count(&h.host.agent_log(), "hub reconcile failed"), 1);
    assert!(alive(agent.pid()));
    assert_eq!(h.host.status()["runner"]["pid"], runner);
    h.assert_token_kept_secret();
}

#[test]
fn a_hub_that_accepts_and_never_answers_times_out() {
    // The TCP connection is taken, the TLS handshake never comes: the connect timeout.
    the_agent_rides_out(
        Misbehaviour::Mute,
        "did not answer within 10s",
        Duration::from_secs(60),
        2,
    );
}

#[test]
fn a_hub_that_holds_a_request_past_its_wait_times_out() {
    // TLS done, the request read, no answer: the request timeout (wait + 15 s).
    the_agent_rides_out(
        Misbehaviour::Silent,
        "did not answer within 45s",
        Duration::from_secs(120),
        2,
    );
}

/// The agent against a hub that answers 200 with `body` (made from the request's
/// `Authorization` value): refused as an invalid answer, shown as `expect`, logged once,
/// nothing applied or kept, the runner untouched, and the token nowhere.
fn an_invalid_answer_is_refused(body: fn(&str) -> String, expect: &str) {
    let ca = TestCa::new();
    let hub = FakeHub::scripted(ca.server(), move |req| {
        ("200 OK", body(&authorization(req)))
    });
    let h = HubHost::new(&ca.pem());
    let agent = h.start_agent(&hub.url);
    let runner = h.host.wait_runner("a runner", |_| true);
    let st = h.wait_hub_error(expect, LIMIT);
    assert_eq!(st["hub"]["connected"], false, "{st:#}");
    wait_for(LIMIT, "three attempts", || {
        (hub.connections() >= 3).then_some(())
    });
    let log = h.host.agent_log();
    assert_eq!(count(&log, "hub reconcile failed"), 1, "{log}");
    let st = h.host.status();
    assert_eq!(st["hub"]["generation"], 0, "{st:#}");
    assert!(st["hub"]["desired_version"].is_null(), "{st:#}");
    assert_eq!(st["runner"]["pid"], runner, "{st:#}");
    assert_eq!(st["runner"]["starts"], 1, "{st:#}");
    assert!(
        !h.host.state().join("desired.json").exists(),
        "nothing kept"
    );
    // Every report still says nothing from the hub is applied.
    let last = hub
        .requests()
        .last()
        .map(|r| report_of(r))
        .expect("a request");
    assert_eq!(last["observed_generation"], 0);
    assert!(alive(agent.pid()));
    h.assert_token_kept_secret();
}

#[test]
fn a_generation_beyond_2_pow_53_is_refused_and_not_kept() {
    // Applied, it would be kept, and every real answer refused as older from then on.
    an_invalid_answer_is_refused(
        |_| r#"{"generation": 18446744073709551615, "runner": {"enabled": false}}"#.to_owned(),
        "generation 18446744073709551615 is beyond",
    );
}

#[test]
fn a_hub_echoing_the_token_as_the_generation_leaks_it_nowhere() {
    // serde's error quotes the string it could not take as a number.
    an_invalid_answer_is_refused(
        |auth| format!(r#"{{"generation": "{auth}"}}"#),
        "the answer is not a desired state",
    );
}

#[test]
fn a_hub_echoing_the_token_as_the_agent_version_is_refused() {
    // The token's characters are all allowed in a version: only redacting it first
    // keeps it out of the log, the status file and desired.json.
    an_invalid_answer_is_refused(
        |auth| {
            let token = auth.strip_prefix("Bearer ").expect("a bearer token");
            format!(r#"{{"generation": 3, "agent": {{"version": "{token}"}}}}"#)
        },
        "the agent version it asks for is not a version",
    );
}

#[test]
fn a_token_straddling_the_cut_of_a_hubs_error_leaks_no_part_of_it() {
    // The error text is cut at 300 characters: here within the token, 12 characters in.
    let ca = TestCa::new();
    let hub = FakeHub::scripted(ca.server(), |req| {
        let pad = "x".repeat(300 - 12 - "Bearer ".len());
        let body =
            serde_json::json!({"error": format!("{pad}{} is not known", authorization(req))});
        ("401 Unauthorized", body.to_string())
    });
    let h = HubHost::new(&ca.pem());
    let _agent = h.start_agent(&hub.url);
    h.host.wait_runner("a runner", |_| true);
    let st = h.wait_hub_error("the hub refused this agent's token", LIMIT);
    let err = st["hub"]["last_error"].as_str().expect("error");
    assert!(err.contains("xxxxBearer <redacted"), "{err}");
    h.assert_kept_secret(&h.token[..8]);
}
