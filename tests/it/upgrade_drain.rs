//! Upgrades drain first: a real hub, a real agent, a real second build. The switch waits
//! for a running job and takes place after it; past `upgrade.drain_deadline` what still
//! runs is cancelled with the upgrade named; an agent killed while it drains leaves a
//! runnable, verified binary and the drain in force.

use std::fs;
use std::path::Path;

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::fixtures::*;

/// A hub job on a1 that says `start`, waits for its gate, then says `done`.
fn submit_gated(up: &Up, marks: &Path, id: &str) {
    let script = format!(
        "echo start; while [ ! -e {m}/go-{id} ]; do sleep 0.05; done; echo done",
        m = marks.display()
    );
    let out = up.hub().admin(&[
        "job", "submit", "--agent", "a1", "--id", id, "--", "sh", "-c", &script,
    ]);
    succeeded(&out);
    wait_for(LIMIT, &format!("job {id} running"), || {
        (job(up, id)["state"] == "running").then_some(())
    });
}

const LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

fn job(up: &Up, id: &str) -> Value {
    up.hub().admin_json(&["job", "status", id])
}

fn wait_done(up: &Up, id: &str) -> Value {
    wait_for(LIMIT, &format!("job {id} done"), || {
        let v = job(up, id);
        (v["done"] == true).then_some(v)
    })
}

fn local_submit(up: &Up) -> std::process::Output {
    railgrid()
        .args(["job", "submit", "--state-dir"])
        .arg(up.host.state())
        .args(["--", "true"])
        .output()
        .expect("job submit")
}

#[test]
fn an_upgrade_waits_for_a_running_job_and_switches_after_it() {
    let mut up = Up::new();
    up.start_agent();
    let marks = up.host.marks_dir();
    submit_gated(&up, &marks, "build");
    up.offer_v2();
    let u = wait_for(LIMIT, "the upgrade waiting for the job", || {
        let u = up.status()["upgrade"].clone();
        let waiting = u["waiting"].as_str().unwrap_or_default();
        (u["state"] == "draining" && waiting.starts_with("waiting for 1 job(s) (deadline "))
            .then_some(u)
    });
    assert_eq!(u["target"], V2);
    let drain = wait_for(LIMIT, "the hub sees the upgrade's drain", || {
        let d = up.hub_agent()["report"]["drain"].clone();
        (d["jobs_left"] == 1).then_some(d)
    });
    assert_eq!(drain["reason"], format!("upgrade to {V2}"), "{drain:#}");
    let table = up.hub().admin_ok(&["agent", "list"]);
    assert!(table.contains("draining: waiting for 1 job(s)"), "{table}");
    let err = String::from_utf8_lossy(&local_submit(&up).stderr).into_owned();
    assert!(err.contains(&format!("draining: upgrade to {V2}")), "{err}");
    assert_ne!(up.status()["version"], V2, "no switch while a job runs");

    fs::write(marks.join("go-build"), "").expect("gate");
    let done = wait_done(&up, "build");
    assert_eq!(done["state"], "succeeded", "{done:#}");
    let logs = up.hub().admin(&["job", "logs", "build"]);
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "start\ndone\n");
    up.wait_upgrade("committed");
    up.assert_running(V2);
    // Committed, the new agent takes jobs again.
    wait_for(LIMIT, "the drain ended", || {
        up.status()["drain"].is_null().then_some(())
    });
    assert!(!up.host.state().join("upgrade-drain.json").exists());
    let out = local_submit(&up);
    succeeded(&out);
}

#[test]
fn past_its_drain_deadline_an_upgrade_cancels_what_runs_naming_itself() {
    let mut up = Up::new();
    up.env.push(("RAILGRID_UPGRADE_DRAIN_DEADLINE", "2s"));
    up.start_agent();
    let marks = up.host.marks_dir();
    submit_gated(&up, &marks, "stuck");
    up.offer_v2();
    up.wait_upgrade("committed");
    up.assert_running(V2);
    let stuck = wait_done(&up, "stuck");
    assert_eq!(stuck["state"], "cancelled", "{stuck:#}");
    let error = stuck["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!("drain deadline (upgrade to {V2})")),
        "{stuck:#}"
    );
}

#[test]
fn an_agent_killed_while_it_drains_for_an_upgrade_keeps_its_binary_and_the_drain() {
    let mut up = Up::new();
    up.start_agent();
    let marks = up.host.marks_dir();
    submit_gated(&up, &marks, "held");
    up.offer_v2();
    up.wait_upgrade("draining");
    let old = version_of(&up.exe());

    let agent = up.agent.as_mut().expect("agent");
    agent.signal(Signal::SIGKILL);
    agent.wait_output(LIMIT);
    up.agent.take();
    // The binary at the path is the verified old one, and runs; the drain is kept, and
    // the orphaned runner still refuses new jobs.
    assert_eq!(version_of(&up.exe()), old);
    assert_ne!(old, V2);
    let kept = read_lossy(&up.host.state().join("upgrade-drain.json"));
    assert!(kept.contains(&format!("upgrade to {V2}")), "{kept}");
    let err = String::from_utf8_lossy(&local_submit(&up).stderr).into_owned();
    assert!(err.contains(&format!("upgrade to {V2}")), "{err}");

    // Started again, it reclaims the orphaned runner (which ends the job) and upgrades,
    // now that no job is left.
    up.start_agent();
    up.wait_upgrade("committed");
    up.assert_running(V2);
    let held = wait_done(&up, "held");
    assert_ne!(held["state"], "succeeded", "{held:#}");
}
