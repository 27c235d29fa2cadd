//! `railgrid agent run` with a hub: against hubs that misbehave (`fixtures::fake_hub`,
//! over real TLS with a test CA), with no hub at all, and against the reference hub.

mod desired;
mod hostile;
mod kept;
mod secrets;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::Value;

use crate::fixtures::*;

/// `agent check-config` with the host's config, a hub, its token file and `extra`.
fn check_config(h: &HubHost, extra: &[&str]) -> std::process::Output {
    railgrid()
        .args(["agent", "check-config", "--config"])
        .arg(h.host.path("agent.toml"))
        .args(["--hub", "https://hub.example", "--token-file"])
        .arg(h.host.path("token"))
        .args(extra)
        .args(if is_root() {
            &["--runner-user", "nobody"][..]
        } else {
            &[][..]
        })
        .output()
        .expect("check-config")
}

/// How often the agent log says `needle`.
fn count(log: &str, needle: &str) -> usize {
    log.matches(needle).count()
}

/// The agent against a hub that misbehaves `how`: it stays up, its runner keeps running
/// (the same process throughout), `agent status` shows `expect` as the hub's last error,
/// the log says it once however often it is retried, and the token leaks nowhere.
fn the_agent_rides_out(how: Misbehaviour, expect: &str, limit: Duration, attempts: usize) {
    let ca = TestCa::new();
    let hub = FakeHub::start(how, ca.server());
    let h = HubHost::new(&ca.pem());
    let agent = h.start_agent(&hub.url);
    let runner = h.host.wait_runner("a runner", |_| true);

    let st = h.wait_hub_error(expect, limit);
    assert_eq!(st["hub"]["connected"], false, "{st:#}");
    assert_eq!(st["hub"]["url"], hub.url.as_str());
    assert_eq!(st["hub"]["agent_id"], "a1");
    // Retried, with backoff, and the log said it once.
    wait_for(limit, &format!("{attempts} attempts"), || {
        (hub.connections() >= attempts).then_some(())
    });
    let log = h.host.agent_log();
    assert_eq!(count(&log, "hub reconcile failed"), 1, "{log}");
    assert!(log.contains(expect), "{log}");

    assert!(alive(agent.pid()), "the agent is up");
    let st = h.host.status();
    assert_eq!(st["runner"]["pid"], runner, "{st:#}");
    assert_eq!(st["runner"]["starts"], 1, "{st:#}");
    assert_eq!(
        get_json(&h.host.socket(), "/v1/health").expect("health")["pid"],
        runner
    );
    h.assert_token_kept_secret();
}

/// The reference hub gives up to this long for a change to reach the agent and be applied
/// (a runner stop included).
const APPLIED: Duration = Duration::from_secs(30);

/// The runner's admission limits, from its API.
fn admission(h: &HubHost) -> Option<Value> {
    get_json(&h.host.socket(), "/v1/admission")
}

/// The effective generation the hub sends `id`.
fn hub_generation(hub: &TestHub, id: &str) -> u64 {
    hub.admin_json(&["desired", "show", "--agent", id])["effective"]["generation"]
        .as_u64()
        .expect("effective generation")
}

fn connected_at(generation: u64) -> impl Fn(&Value) -> bool {
    move |st: &Value| {
        st["hub"]["connected"] == true && st["hub"]["generation"].as_u64() == Some(generation)
    }
}
