//! Rollouts, end to end: a real hub over TLS with a release key, real agents each run
//! from a binary of its own (so that each may replace it), the second build of this
//! source (99.0.0) and a signed release that crashes at start. A bad release stops at
//! the canary; a good one goes wave by wave, through a pause and a hub killed under it,
//! and reaches an agent that was away when its wave came.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(90);

/// One enrolled host whose agent runs from `<dir>/bin-<id>/railgrid`.
struct Node {
    id: &'static str,
    host: Host,
    agent: Option<Guard>,
}

/// A hub with a release key and its nodes.
struct Rig {
    dir: tempfile::TempDir,
    hub: Option<TestHub>,
    key: Key,
    nodes: Vec<Node>,
}

impl Rig {
    /// The hub and one running agent per id, each on this build.
    fn new(ids: &[&'static str]) -> Self {
        let dir = tempdir();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let (key, hub) = signed_hub(dir.path());
        let mut rig = Self {
            dir,
            hub: Some(hub),
            key,
            nodes: Vec::new(),
        };
        for &id in ids {
            rig.hub().enrol(id);
            let bin = rig.bin(id);
            fs::create_dir(&bin).expect("bin dir");
            fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).expect("chmod");
            fs::copy(&builds().v1, bin.join("railgrid")).expect("the agent's binary");
            rig.nodes.push(Node {
                id,
                host: Host::new(),
                agent: None,
            });
            rig.start(rig.nodes.len() - 1);
        }
        rig
    }

    fn hub(&self) -> &TestHub {
        self.hub.as_ref().expect("hub running")
    }

    fn bin(&self, id: &str) -> PathBuf {
        self.dir.path().join(format!("bin-{id}"))
    }

    fn node(&self, id: &str) -> &Node {
        self.nodes.iter().find(|n| n.id == id).expect("a node")
    }

    /// Starts node `i`'s agent and waits until it reconciles with a running runner.
    fn start(&mut self, i: usize) {
        let hub = self.hub();
        let id = self.nodes[i].id;
        let token = hub.dir.with_file_name(format!("{id}.token"));
        let exe = self.bin(id).join("railgrid");
        let err = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{id}.stderr")))
            .expect("agent stderr");
        let mut cmd = self.nodes[i]
            .host
            .agent_cmd_from(&exe, &["--trusted-key", &self.key.line]);
        cmd.args(hub.link(id, &token))
            .env("RAILGRID_UPGRADE_SETTLE", "1s")
            .env("RAILGRID_UPGRADE_DEADLINE", "10s")
            .env("RAILGRID_RUNNER_STOP_GRACE", "2s")
            .stderr(err);
        let node = &mut self.nodes[i];
        node.agent = Some(Guard::new(fresh(|| cmd.spawn()).expect("spawn agent")));
        wait_for(LIMIT, &format!("agent {id} connected"), || {
            let st = node.host.status();
            (st["hub"]["connected"] == true && st["runner"]["state"] == "running").then_some(())
        });
    }

    /// Stops node `id`'s agent, and waits until the hub counts it away.
    fn stop(&mut self, id: &str) {
        let node = self.nodes.iter_mut().find(|n| n.id == id).expect("node");
        kill_upgrading_agent(&node.host);
        node.agent.take();
        let hub = self.hub();
        wait_for(LIMIT, &format!("{id} not connected"), || {
            let v = hub.admin_json(&["agent", "show", id]);
            (v["connected"] == false).then_some(())
        });
    }

    /// Kills the hub (SIGKILL) and starts it again on its data dir and address.
    fn kill_hub(&mut self) {
        let hub = self.hub.take().expect("hub running");
        let listen = hub.listen.clone();
        let mut guard = hub.guard;
        guard.signal(Signal::SIGKILL);
        guard.wait_output(LIMIT);
        let public = path_str(&self.key.public);
        self.hub = Some(TestHub::start_on(
            &self.dir.path().join("hub"),
            &listen,
            &["--release-key", &public],
        ));
    }

    fn rollout(&self, id: &str) -> Value {
        self.hub().admin_json(&["rollout", "status", id])
    }

    fn wait_rollout(&self, id: &str, what: &str, accept: impl Fn(&Value) -> bool) -> Value {
        wait_for(LIMIT, &format!("rollout {id}: {what}"), || {
            let v = self.rollout(id);
            accept(&v).then_some(v)
        })
    }

    /// Starts a rollout (`rollout start ARGS…`); its id.
    fn start_rollout(&self, args: &[&str]) -> String {
        let mut all = vec!["rollout", "start"];
        all.extend_from_slice(args);
        let said = self.hub().admin_ok(&all);
        let id = said
            .strip_prefix("rollout ")
            .and_then(|r| r.split(' ').next())
            .unwrap_or_else(|| panic!("no rollout id in {said:?}"));
        id.to_owned()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            kill_upgrading_agent(&n.host);
            n.agent.take();
        }
    }
}

/// Every member of `v`, wave by wave.
fn members(v: &Value) -> Vec<Value> {
    v["waves"]
        .as_array()
        .expect("waves")
        .iter()
        .flat_map(|w| w["members"].as_array().expect("members").clone())
        .collect()
}

fn member(v: &Value, agent: &str) -> Value {
    members(v)
        .into_iter()
        .find(|m| m["agent"] == agent)
        .unwrap_or(Value::Null)
}

/// Under way: given the version, not yet at an end.
fn under_way(m: &Value) -> bool {
    matches!(m["state"].as_str(), Some("draining" | "switching"))
}

#[test]
fn a_release_that_crashes_at_start_stops_at_the_canary_and_reaches_no_other_agent() {
    let rig = Rig::new(&["c1", "c2", "c3"]);
    rig.hub()
        .admin_ok(&["agent", "label", "c2", "rollout=canary"]);
    let crash = script(
        rig.dir.path(),
        "crash",
        "99.0.2",
        "echo crashing >&2\nexit 1",
    );
    release(rig.hub(), &rig.key, rig.dir.path(), "99.0.2", &crash);

    let id = rig.start_rollout(&["--version", "99.0.2", "--waves", "1,50%,100%"]);
    let v = rig.wait_rollout(&id, "halted", |v| v["state"] == "halted");
    let canary = &v["waves"][0]["members"][0];
    assert_eq!(canary["agent"], "c2", "the canary first: {v:#}");
    assert_eq!(canary["state"], "rolled_back", "{v:#}");
    assert_says(&v, "reason", "99.0.2 rolled back on c2");
    for other in ["c1", "c3"] {
        assert_eq!(member(&v, other)["state"], "pending", "{v:#}");
        // Never sent it, never downloaded it.
        let d = rig.hub().admin_json(&["desired", "show", "--agent", other]);
        assert_eq!(d["effective"]["agent"], Value::Null, "{d:#}");
        let st = rig.node(other).host.status();
        assert_ne!(st["upgrade"]["target"], "99.0.2", "{st:#}");
        assert_eq!(st["version"], builds().v1_version.as_str());
    }
    let text = rig.hub().admin_ok(&["rollout", "status", &id]);
    assert!(
        text.contains("halted") && text.contains("release resume 99.0.2"),
        "{text}"
    );
    // Not resumed while the version is halted; aborted, it frees its agents.
    let out = rig.hub().admin(&["rollout", "resume", &id]);
    exited_saying(&out, 1, "still halted");
    let v = rig.hub().admin_json(&["rollout", "abort", &id]);
    assert_eq!(v["state"], "aborted");
    assert_eq!(member(&v, "c1")["state"], "skipped", "{v:#}");
    // Bad input is refused naming what is wrong, and starts nothing.
    for (args, says, code) in [
        (vec!["--version", "99.0.7"], "no release \"99.0.7\"", 1),
        (vec!["--version", "99.0.2"], "release 99.0.2 is halted", 1),
        (
            vec!["--version", "99.0.2", "--waves", "50%,10%"],
            "reaches no further",
            2,
        ),
        (
            vec!["--version", "99.0.2", "--select", "queue=none"],
            "no agent matches",
            2,
        ),
    ] {
        let mut all = vec!["rollout", "start"];
        all.extend_from_slice(&args);
        let out = rig.hub().admin(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn a_good_release_goes_wave_by_wave_through_a_pause_and_a_hub_kill_and_reaches_an_agent_that_was_away(
) {
    let mut rig = Rig::new(&["g1", "g2", "g3", "g4"]);
    rig.hub()
        .admin_ok(&["agent", "label", "g3", "rollout=canary"]);
    release(rig.hub(), &rig.key, rig.dir.path(), V2, &builds().v2);
    // g4 is away when its wave comes.
    rig.stop("g4");
    let soak = Duration::from_secs(3);
    let id = rig.start_rollout(&[
        "--version",
        V2,
        "--waves",
        "1,2,100%",
        "--soak",
        "3s",
        "--max-parallel",
        "1",
    ]);

    // Paused while the canary switches: it finishes, and no other member is given the
    // version however long the soak has been over.
    let v = rig.wait_rollout(&id, "the canary under way", |v| {
        under_way(&v["waves"][0]["members"][0])
    });
    assert_eq!(v["waves"][0]["members"][0]["agent"], "g3", "{v:#}");
    let paused = rig.hub().admin_json(&["rollout", "pause", &id]);
    assert_eq!(paused["state"], "paused");
    let v = rig.wait_rollout(&id, "the canary committed", |v| {
        member(v, "g3")["state"] == "committed"
    });
    let committed_ms = member(&v, "g3")["ended_ms"].as_u64().expect("ended");
    wait_for(LIMIT, "the soak over, nothing given while paused", || {
        let v = rig.rollout(&id);
        assert_eq!(v["state"], "paused", "{v:#}");
        for m in members(&v).iter().filter(|m| m["agent"] != "g3") {
            assert!(
                matches!(m["state"].as_str(), Some("pending")),
                "given while paused: {v:#}"
            );
        }
        let past = unix_ms().saturating_sub(committed_ms) > soak.as_millis() as u64 + 2000;
        past.then_some(())
    });
    assert_says(&v, "waiting", "paused");

    // Resumed; killed under the rollout, the hub goes on where it was.
    rig.hub().admin_ok(&["rollout", "resume", &id]);
    rig.wait_rollout(&id, "a member of a later wave under way", |v| {
        members(v)
            .iter()
            .any(|m| m["wave"].as_u64() > Some(0) && under_way(m))
    });
    rig.kill_hub();
    let v = rig.wait_rollout(&id, "done", |v| v["state"] == "done");
    assert_eq!(member(&v, "g4")["state"], "deferred", "{v:#}");
    for id in ["g1", "g2", "g3"] {
        assert_eq!(member(&v, id)["state"], "committed", "{v:#}");
        let st = rig.node(id).host.status();
        assert_eq!(st["version"], V2, "{id}: {st:#}");
        assert_eq!(st["runner"]["state"], "running");
    }
    // Each wave after the last committed and soaked; never two under way at once.
    let done: Vec<Value> = members(&v)
        .into_iter()
        .filter(|m| m["state"] == "committed")
        .collect();
    let span = |m: &Value| {
        (
            m["wave"].as_u64().expect("wave"),
            m["given_ms"].as_u64().expect("given"),
            m["ended_ms"].as_u64().expect("ended"),
        )
    };
    for a in &done {
        for b in &done {
            let ((wa, ga, ea), (wb, gb, eb)) = (span(a), span(b));
            if wb > wa {
                assert!(gb >= ea + soak.as_millis() as u64, "{v:#}");
            }
            if a != b {
                assert!(eb <= ga || ea <= gb, "two under way at once: {v:#}");
            }
        }
    }
    // The fleet's version is the rollout's now: g4 takes it when it is back.
    let fleet = rig.hub().admin_json(&["desired", "show", "--fleet"]);
    assert_eq!(fleet["settings"]["version"], V2, "{fleet:#}");
    let i = rig.nodes.iter().position(|n| n.id == "g4").expect("g4");
    rig.start(i);
    wait_for(LIMIT, "g4 on the new version", || {
        let st = rig.node("g4").host.status();
        (st["version"] == V2 && st["runner"]["state"] == "running").then_some(())
    });
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[test]
fn a_member_counts_as_committed_only_once_the_hub_served_it_the_artifact() {
    use super::replicas::{sim_fetch, sim_reconcile};
    let dir = tempdir();
    let (key, hub) = signed_hub(dir.path());
    let artifact = dir.path().join("artifact");
    fs::write(&artifact, b"not run: the agents here are simulated").expect("artifact");
    release(&hub, &key, dir.path(), "2.0.0", &artifact);
    let tokens: Vec<String> = ["s1", "s2"]
        .iter()
        .map(|id| read_lossy(&hub.enrol(id)).trim().to_owned())
        .collect();
    let sim = |i: usize| (["s1", "s2"][i], tokens[i].as_str());
    let mut g = [0u64; 2];
    for (i, g) in g.iter_mut().enumerate() {
        *g = sim_reconcile(&hub, sim(i), 0, "1.0.0", None, "2.0.0").0;
    }
    hub.admin_ok(&["agent", "label", "s1", "rollout=canary"]);
    let said = hub.admin_ok(&[
        "rollout",
        "start",
        "--version",
        "2.0.0",
        "--waves",
        "1,100%",
    ]);
    assert!(said.starts_with("rollout r1 started"), "{said}");
    let committed = Some(("committed", "2.0.0"));
    let member = |id: &str| {
        let v = hub.admin_json(&["rollout", "status", "r1"]);
        let m = v["waves"]
            .as_array()?
            .iter()
            .flat_map(|w| w["members"].as_array().into_iter().flatten())
            .find(|m| m["agent"] == id)?
            .clone();
        Some((m, v))
    };

    // The canary says it committed, never having fetched the artifact; the other says it
    // runs the version before it is offered: neither counts, the second wave waits.
    g[0] = wait_for(LIMIT, "the canary given 2.0.0", || {
        let (next, given) = sim_reconcile(&hub, sim(0), g[0], "1.0.0", None, "2.0.0");
        given.then_some(next)
    });
    g[1] = sim_reconcile(&hub, sim(1), g[1], "2.0.0", committed, "1.0.0").0;
    g[0] = sim_reconcile(&hub, sim(0), g[0], "2.0.0", committed, "2.0.0").0;
    let (m, v) = wait_for(LIMIT, "the canary's claim ignored", || {
        let (m, v) = member("s1")?;
        m["detail"]
            .as_str()?
            .contains("not counted")
            .then_some((m, v))
    });
    assert!(v["counts"].get("committed").is_none(), "{v:#}");
    assert_eq!(v["wave"], 0, "{v:#}");
    assert_ne!(m["state"], "committed", "{m:#}");
    let (_, metrics) = hub.curl("GET", "/metrics", Some(&hub.admin_token()), None);
    assert!(
        !metrics.contains("railgrid_rollout_unproven_claims_total 0\n"),
        "{metrics}"
    );
    assert!(hub
        .log()
        .contains("claims the version without having fetched"));

    // Served the artifact, its commit counts; the second wave is given the version, and
    // the other member counts once it too has fetched it.
    sim_fetch(&hub, sim(0), "2.0.0");
    sim_reconcile(&hub, sim(0), g[0], "2.0.0", committed, "2.0.0");
    wait_for(LIMIT, "the second wave given the version", || {
        g[1] = sim_reconcile(&hub, sim(1), g[1], "2.0.0", committed, "2.0.0").0;
        let (m, _) = member("s2")?;
        m["detail"].as_str()?.contains("not counted").then_some(())
    });
    sim_fetch(&hub, sim(1), "2.0.0");
    let v = wait_for(LIMIT, "the rollout done", || {
        sim_reconcile(&hub, sim(1), g[1], "2.0.0", committed, "2.0.0");
        let v = hub.admin_json(&["rollout", "status", "r1"]);
        (v["state"] == "done").then_some(v)
    });
    assert_eq!(v["counts"]["committed"], 2, "{v:#}");
}
