//! One log line is one event, whatever clients and jobs send: control characters,
//! escape sequences, line breaks, NUL, C1 controls, bidirectional overrides and bytes
//! that are not UTF-8 reach the hub's and the runner's logs escaped, in text and JSON.

use std::path::Path;

use nix::sys::signal::Signal;
use serde_json::{json, Value};

use crate::fixtures::*;

/// What an adversary puts in every string it controls.
const EVIL: &str = "\u{1b}]0;PWNED\u{7}\r\nfake line\0\u{9b}31m\u{202e}gnp.exe";

/// Characters that must never reach a log as they are.
fn raw_controls(log: &str) -> Vec<char> {
    log.chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

/// Every line of `log` is one event: a timestamp first (text), or a JSON object.
fn assert_one_event_a_line(log: &str, json: bool, who: &str) {
    assert!(
        raw_controls(log).is_empty(),
        "{who}: {:?}",
        raw_controls(log)
    );
    for line in log.lines().filter(|l| !l.is_empty()) {
        if json {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{who}: not one JSON event ({e}): {line:?}"));
            assert!(v["timestamp"].is_string(), "{who}: {line:?}");
        } else {
            assert!(
                line.starts_with("20") || line.starts_with("\u{1b}"),
                "{who}: a line that is not an event of its own: {line:?}"
            );
        }
    }
}

/// A host with `EVIL` for a hostname enrols and reports it, and requests carry it in a
/// path, a header and a body that is not UTF-8.
fn send_evil(hub: &TestHub, dir: &Path, n: usize) {
    let enrol = dir.join(format!("enrol{n}.token"));
    hub.admin_ok(&["enrol-token", "create", "--token-out", &path_str(&enrol)]);
    let body = json!({"id": format!("evil-{n}"), "hostname": EVIL}).to_string();
    let token = read_lossy(&enrol).trim().to_owned();
    let (code, said) = hub.curl("POST", "/v1/enrol", Some(&token), Some(&body));
    assert_eq!(code, 201, "{said}");
    let agent: Value = serde_json::from_str(&said).expect("enrolled");
    let agent_token = agent["token"].as_str().expect("token");
    let report = json!({
        "version": "1.0.0", "os": "linux", "arch": "x86_64", "hostname": EVIL,
        "observed_generation": 0,
        "upgrade": {"state": "failed", "target": "1.0.1", "error": EVIL},
    });
    let path = format!("/v1/agents/evil-{n}/reconcile");
    let (code, said) = hub.curl("POST", &path, Some(agent_token), Some(&report.to_string()));
    assert_eq!(code, 200, "{said}");
    let (code, _) = hub.curl("GET", "/v1/admin/agents/%1b%0d%0a%ff", Some("x"), None);
    assert_eq!(code, 401);
    let raw = b"POST /v1/enrol HTTP/1.1\r\nHost: x\r\nUser-Agent: \x1b[31m\r\nAuthorization: Bearer rge_\xff\x1b\r\nContent-Length: 4\r\nConnection: close\r\n\r\n\xff\xfe\x00\x1b";
    raw_tls(hub, raw, std::time::Duration::from_secs(10));
}

#[test]
fn what_clients_and_jobs_send_never_forges_a_line_of_a_hubs_or_a_runners_log() {
    let dir = tempdir();
    for (n, format) in ["text", "json"].into_iter().enumerate() {
        let hub = TestHub::start(
            &dir.path().join(format!("hub-{format}")),
            &["--log-format", format],
        );
        send_evil(&hub, dir.path(), n);
        let log = wait_for_text(
            &dir.path().join(format!("hub-{format}.log")),
            "agent enrolled itself",
            std::time::Duration::from_secs(10),
        );
        drop(hub);
        assert!(
            log.contains("fake line"),
            "the hostile text was logged: {log}"
        );
        assert_one_event_a_line(&log, format == "json", &format!("hub ({format})"));
    }

    // A job whose argv carries it: the runner logs the argv as the job starts.
    for format in ["text", "json"] {
        let mut runner = Runner::new();
        runner.start(&["--log-format", format]);
        // (An argument cannot hold a NUL: exec would cut it there, and the runner says so.)
        let spec = json!({"id": "evil", "argv": ["/bin/echo", EVIL.replace('\0', "")]});
        let (status, body) = runner.submit(spec);
        assert_eq!(status, 201, "{body}");
        runner.wait("evil");
        let mut guard = runner.guard.take().expect("runner");
        guard.signal(Signal::SIGTERM);
        let out = guard.wait_output(std::time::Duration::from_secs(20));
        let log = text(&out.stderr);
        assert!(log.contains("job running"), "{log}");
        assert!(log.contains("fake line"), "{log}");
        assert_one_event_a_line(&log, format == "json", &format!("runner ({format})"));
    }
}
