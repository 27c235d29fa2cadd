//! The agent's service under a real systemd 252, booted in a container for the test
//! ([`Container`]): `agent install`, the runner as its account in the unit's delegated
//! cgroup under `NoNewPrivileges=yes`, jobs confined by cgroups of their own, install
//! again (nothing to change), a new build installed over it, a restart after kill -9, a
//! reload, the watchdog, a stop with a job that ignores SIGTERM, a hub added, and
//! `agent uninstall --purge` with an upgrade's watcher running.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::container::{Container, BUILT};

const LIMIT: Duration = Duration::from_secs(60);
const SOCKET: &str = "/var/lib/railgrid/runner/runner.sock";

/// The runner's pid once the agent says it runs and its socket answers.
fn runner_serving(c: &Container, what: &str) -> i64 {
    let pid = c.wait(
        what,
        LIMIT,
        "railgrid agent status --json 2>/dev/null",
        |t| {
            serde_json::from_str::<Value>(t)
                .is_ok_and(|v| v["runner"]["state"] == "running" && v["runner"]["pid"].is_i64())
        },
    );
    let v: Value = serde_json::from_str(&pid).expect("status");
    c.wait(
        "the runner's socket",
        LIMIT,
        &format!("curl -sf --unix-socket {SOCKET} http://x/v1/health"),
        |t| t.contains("\"pid\""),
    );
    v["runner"]["pid"].as_i64().expect("runner pid")
}

fn show(c: &Container, prop: &str) -> String {
    c.ok(&format!("systemctl show railgrid-agent -p {prop} --value"))
        .trim()
        .to_owned()
}

#[test]
fn the_service_lives_its_whole_life_under_a_real_systemd() {
    let Some(c) = Container::boot("life") else {
        return;
    };
    let before = c.ok("ls /etc /usr/local/bin /var/lib /var/log | sort");

    // Install: the unit is active, the runner runs as its account in the unit's cgroup.
    let out = c.ok(&format!("{BUILT} agent install --runner-user nobody"));
    assert!(out.contains("installed"), "{out}");
    assert_eq!(show(&c, "ActiveState"), "active");
    let runner = runner_serving(&c, "the runner serving");
    assert_eq!(c.ok(&format!("ps -o user= -p {runner}")).trim(), "nobody");
    let cgroup = c.ok(&format!("cat /proc/{runner}/cgroup"));
    assert!(
        cgroup
            .lines()
            .any(|l| l == "0::/system.slice/railgrid-agent.service/runner/runner"),
        "{cgroup}"
    );
    let health = c.ok(&format!(
        "curl -sf --unix-socket {SOCKET} http://x/v1/health"
    ));
    assert!(health.contains(r#""confinement":"cgroup""#), "{health}");
    // The unit lets the runner make every job's sandbox.
    assert!(
        health.contains(r#""sandbox":"namespaces+seccomp""#),
        "{health}"
    );
    // The unit's NoNewPrivileges=yes keeps the runner and its jobs on their account.
    let status = c.ok(&format!("cat /proc/{runner}/status"));
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert_eq!(
        c.ok("railgrid job submit --wait --timeout 30s --id whoami -- id -u")
            .trim(),
        "65534"
    );
    let status = c.ok("railgrid job status whoami");
    assert!(status.contains("confined: sandbox+"), "{status}");

    // Install again: nothing to change, and the agent is left alone.
    let main = show(&c, "MainPID");
    let again = c.ok(&format!("{BUILT} agent install"));
    assert!(again.contains("nothing to change"), "{again}");
    assert_eq!(show(&c, "MainPID"), main);

    // A new build installed over it: the agent is stopped before its file is replaced,
    // then runs the new file.
    let next = c.ok(&format!(
        "cp {BUILT} /root/railgrid-next && printf x >> /root/railgrid-next && \
         /root/railgrid-next agent install"
    ));
    let stop = next
        .find("run     systemctl stop")
        .expect("the stop is shown");
    let update = next
        .find("update  /usr/local/bin/railgrid")
        .expect("the update is shown");
    assert!(stop < update, "{next}");
    assert_ne!(show(&c, "MainPID"), main);
    assert_eq!(show(&c, "ActiveState"), "active");
    assert_eq!(
        c.ok("cmp /root/railgrid-next /usr/local/bin/railgrid && echo same")
            .trim(),
        "same"
    );
    runner_serving(&c, "the runner of the new build");

    // A job in a sandbox and a cgroup of its own: its setsid and setpgid children end with
    // its cancel. Their pids are the host's, as the job cannot see them.
    c.ok("railgrid job submit --detach --id escape -- sh -c \
          'setsid sleep 301 & perl -e \"setpgrp(0,0); sleep 302\" & sleep 300'");
    let pids = c.wait(
        "both escapees running",
        LIMIT,
        "pgrep -f '^sleep 301$'; pgrep -f '^perl -e setpgrp'; true",
        |t| t.lines().count() == 2,
    );
    let pids: Vec<&str> = pids.lines().map(str::trim).collect();
    for p in &pids {
        let cg = c.ok(&format!("cat /proc/{p}/cgroup"));
        assert!(cg.contains("/runner/job-escape"), "{p}: {cg}");
    }
    c.ok("railgrid job cancel escape");
    let alive = format!(
        "for p in {}; do kill -0 $p 2>/dev/null && echo $p; done; true",
        pids.join(" ")
    );
    c.wait("no escapee left", LIMIT, &alive, str::is_empty);

    // kill -9 of the agent: systemd restarts it, and there is one runner.
    let main = show(&c, "MainPID");
    c.ok("systemctl kill -s KILL --kill-whom=main railgrid-agent");
    c.wait(
        "the agent restarted",
        LIMIT,
        "systemctl show railgrid-agent -p NRestarts --value",
        |t| t == "1",
    );
    runner_serving(&c, "a runner again");
    assert_ne!(show(&c, "MainPID"), main);
    c.wait(
        "one runner",
        LIMIT,
        "ps -eo args= | grep -c '^/usr/local/bin/railgrid runner run'",
        |t| t == "1",
    );

    reload_applies_or_is_refused_in_the_same_process(&c);

    the_watchdog_restarts_a_hung_agent(&c);

    // A stop with a job that ignores SIGTERM: done within TimeoutStopSec, nothing left.
    c.ok("railgrid job submit --detach --id stubborn -- sh -c 'trap \"\" TERM; exec sleep 1000'");
    c.wait(
        "the stubborn job running",
        LIMIT,
        "pgrep -xc sleep || true",
        |t| t == "1",
    );
    let timeout_us: u64 = show(&c, "TimeoutStopUSec")
        .trim_end_matches('s')
        .parse()
        .map(|s: u64| s * 1_000_000)
        .unwrap_or(90_000_000);
    let started = Instant::now();
    c.ok("systemctl stop railgrid-agent");
    let took = started.elapsed();
    assert!(
        took < Duration::from_micros(timeout_us),
        "the stop took {took:?}"
    );
    assert_eq!(show(&c, "ActiveState"), "inactive");
    assert_eq!(c.ok("pgrep -xc sleep || true").trim(), "0");
    let left = c.ok(
        "cat /sys/fs/cgroup/system.slice/railgrid-agent.service/cgroup.procs 2>/dev/null || true",
    );
    assert!(left.trim().is_empty(), "left in the unit's cgroup: {left}");
    let log = c.ok("journalctl -b -u railgrid-agent --no-pager | tail -n 30");
    assert!(!log.contains("Failed with result 'timeout'"), "{log}");

    // A hub added: a reload would not take it, so a restart; the token is not shown.
    c.ok("systemctl start railgrid-agent");
    let main = show(&c, "MainPID");
    c.ok("umask 077 && printf 'host-token\\n' > /root/token");
    let hub = c.ok(&format!(
        "{BUILT} agent install --hub https://hub.example --token-file /root/token"
    ));
    assert!(hub.contains("hub.url = \"https://hub.example\""), "{hub}");
    assert!(!hub.contains("host-token"), "{hub}");
    assert_ne!(show(&c, "MainPID"), main);
    assert_eq!(show(&c, "ActiveState"), "active");

    // Uninstall --purge, with a watcher of an upgrade running: the watcher and the
    // service stopped, and the container as it was.
    c.ok("systemd-run --unit=railgrid-upgrade-watch-test --service-type=exec sleep 1000");
    c.ok("railgrid agent uninstall --purge --yes");
    assert_eq!(
        c.ok("systemctl show railgrid-upgrade-watch-test -p ActiveState --value")
            .trim(),
        "inactive"
    );
    c.ok("rm /root/token /root/railgrid-next");
    assert_eq!(
        c.ok("ls /etc /usr/local/bin /var/lib /var/log | sort"),
        before,
        "{}",
        c.console().len()
    );
    assert_eq!(show(&c, "LoadState"), "not-found");
}

/// `systemctl reload` returns once the agent has applied the configuration: a changed
/// runner setting has restarted the runner by then. A broken file fails the reload with
/// the reason, and the agent keeps the running configuration, in the same process.
fn reload_applies_or_is_refused_in_the_same_process(c: &Container) {
    let main = show(c, "MainPID");
    let old_runner = runner_serving(c, "the runner before the reload");
    c.ok(
        "sed -i '/^\\[runner\\]/a stop_grace = \"3s\"' /etc/railgrid/agent.toml && \
          systemctl reload railgrid-agent",
    );
    let st: Value = serde_json::from_str(&c.ok("railgrid agent status --json")).expect("status");
    assert_eq!(st["reloads"]["count"], 1, "{st}");
    assert_eq!(st["reloads"]["last_error"], Value::Null, "{st}");
    assert_ne!(
        st["runner"]["pid"], old_runner,
        "the runner restarted within the reload: {st}"
    );
    assert_eq!(st["runner"]["state"], "running", "{st}");
    let refused = c.sh(
        "echo 'max_jobs = \"many\"' >> /etc/railgrid/agent.toml && systemctl reload railgrid-agent",
    );
    assert!(
        !refused.status.success(),
        "a refused configuration fails the reload: {refused:?}"
    );
    let journal = c.ok("journalctl -u railgrid-agent --no-pager -o cat");
    assert!(
        journal.contains("refused the new configuration and keeps the running one")
            && journal.contains("max_jobs"),
        "{journal}"
    );
    assert_eq!(show(c, "ActiveState"), "active");
    assert_eq!(show(c, "MainPID"), main);
    // The file does not load, so its state directory is named.
    let st: Value =
        serde_json::from_str(&c.ok("railgrid agent status --json --state-dir /var/lib/railgrid"))
            .expect("status");
    assert_eq!(st["reloads"]["count"], 2, "{st}");
    c.ok("sed -i '/^max_jobs = \"many\"$/d' /etc/railgrid/agent.toml");
}

/// A hung agent (SIGSTOP): the watchdog (4 s in a drop-in here) kills and restarts it.
fn the_watchdog_restarts_a_hung_agent(c: &Container) {
    c.ok("mkdir -p /etc/systemd/system/railgrid-agent.service.d && \
          printf '[Service]\\nWatchdogSec=4s\\n' > /etc/systemd/system/railgrid-agent.service.d/watchdog.conf && \
          systemctl daemon-reload && systemctl restart railgrid-agent");
    runner_serving(c, "a runner after the restart");
    let restarts: u32 = show(c, "NRestarts").parse().expect("NRestarts");
    c.ok("kill -STOP $(systemctl show railgrid-agent -p MainPID --value)");
    c.wait(
        "the watchdog's restart",
        LIMIT,
        "systemctl show railgrid-agent -p NRestarts --value",
        |t| t.parse::<u32>().is_ok_and(|n| n > restarts),
    );
    let journal = c.ok("journalctl -u railgrid-agent --no-pager -o cat");
    assert!(journal.contains("Watchdog timeout"), "{journal}");
    runner_serving(c, "a runner after the watchdog");
    c.wait(
        "one runner",
        LIMIT,
        "ps -eo args= | grep -c '^/usr/local/bin/railgrid runner run'",
        |t| t == "1",
    );
    c.ok("rm -r /etc/systemd/system/railgrid-agent.service.d && systemctl daemon-reload");
}
