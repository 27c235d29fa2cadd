//! Self-upgrade under a real systemd 252 ([`Container`]), against the reference hub on
//! the host's loopback: the watcher as a transient unit of its own, a crash-at-start
//! release rolled back through systemd and halted, a binary replaced by hand followed in
//! lockstep, an operator's `systemctl stop` in the commit window (the watcher outlives
//! it, puts the previous binary back and leaves the service stopped), and a reboot in
//! the commit window finished by the unit's `ExecStartPre` guard from `railgrid.prev`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::container::{Container, Options, BUILT};
use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(90);
/// Where the test's files are bound in the container.
const SHARE: &str = "/opt/railgrid-test";
const EXE: &str = "/usr/local/bin/railgrid";

/// A hub with a release key on the host, and a container whose agent is installed
/// against it as `a1`.
struct Fleet {
    dir: tempfile::TempDir,
    key: Key,
    hub: TestHub,
    c: Container,
}

impl Fleet {
    /// `settle`: the agent's settle period (the commit window the test acts in).
    fn up(name: &str, settle: &str, persistent: bool) -> Option<Self> {
        if !requires_root("booting a systemd container needs root") {
            return None;
        }
        let dir = tempdir();
        let (key, hub) = signed_hub(dir.path());
        let token = hub.enrol("a1");
        let share = dir.path().join("share");
        fs::create_dir(&share).expect("share");
        fs::set_permissions(&share, fs::Permissions::from_mode(0o755)).expect("chmod");
        fs::copy(&token, share.join("a1.token")).expect("token");
        fs::copy(hub.ca(), share.join("ca.pem")).expect("ca");
        fs::copy(&builds().v2, share.join("railgrid-v2")).expect("v2");
        let c = Container::boot_with(
            name,
            Options {
                binary: Some(builds().v1.clone()),
                binds: vec![(share, SHARE)],
                persistent,
            },
        )?;
        // Short bounds for the test, in a drop-in as an operator would set them.
        c.ok(&format!(
            "mkdir -p /etc/systemd/system/railgrid-agent.service.d && printf '[Service]\\n\
             Environment=RAILGRID_UPGRADE_SETTLE={settle} RAILGRID_UPGRADE_DEADLINE=40s \
             RAILGRID_RUNNER_STOP_GRACE=2s\\n' > /etc/systemd/system/railgrid-agent.service.d/test.conf"
        ));
        c.ok(&format!(
            "{BUILT} agent install --runner-user nobody --hub {url} --agent-id a1 \
             --token-file {SHARE}/a1.token --ca-file {SHARE}/ca.pem --trusted-key '{line}'",
            url = hub.url,
            line = key.line
        ));
        let f = Self { dir, key, hub, c };
        f.wait_status("the agent connected with its runner", |st| {
            st["hub"]["connected"] == true && st["runner"]["state"] == "running"
        });
        Some(f)
    }

    fn status(&self) -> Value {
        let out = self.c.sh("railgrid agent status --json 2>/dev/null");
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    fn wait_status(&self, what: &str, accept: impl Fn(&Value) -> bool) -> Value {
        wait_for(LIMIT, what, || {
            let st = self.status();
            accept(&st).then_some(st)
        })
    }

    /// Signs `binary` as `version`, publishes it, and makes it the fleet's version.
    fn roll(&self, version: &str, binary: &Path) {
        release(&self.hub, &self.key, self.dir.path(), version, binary);
        self.hub
            .admin_ok(&["desired", "set", "--fleet", "--version", version]);
    }

    fn sha(&self, path: &str) -> String {
        self.c
            .ok(&format!("sha256sum {path}"))
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    fn show(&self, unit: &str, prop: &str) -> String {
        self.c
            .ok(&format!("systemctl show {unit} -p {prop} --value"))
            .trim()
            .to_owned()
    }

    /// The active transient units of upgrade watchers.
    fn watchers(&self) -> String {
        self.c
            .ok("systemctl list-units --no-legend --plain --state=active 'railgrid-upgrade-watch-*'")
            .trim()
            .to_owned()
    }

    /// Waits until no watcher's unit is active.
    fn no_watcher(&self) {
        wait_for(LIMIT, "the watcher's unit gone", || {
            self.watchers().is_empty().then_some(())
        });
    }

    fn journal(&self, unit: &str) -> String {
        self.c
            .ok(&format!("journalctl -b --no-pager -o cat -u '{unit}'"))
    }

    /// The agent runs `version` from the file at its path, with a runner of that build.
    fn assert_running(&self, version: &str) {
        let st = self.wait_status(&format!("agent {version} running"), |st| {
            st["version"] == version && st["runner"]["state"] == "running"
        });
        let health = self.c.wait(
            "the runner's health",
            LIMIT,
            "curl -sf --unix-socket /var/lib/railgrid/runner/runner.sock http://x/v1/health",
            |t| t.contains("\"pid\""),
        );
        let health: Value = serde_json::from_str(&health).expect("health");
        assert_eq!(
            health["version"], version,
            "the runner runs the agent's build"
        );
        assert_eq!(st["exe"]["sha256"].as_str(), Some(self.sha(EXE).as_str()));
        assert_eq!(self.show("railgrid-agent", "ActiveState"), "active");
    }

    /// What the hub's report of a1 says of the upgrade, once it reaches `state`.
    fn hub_upgrade(&self, state: &str) -> Value {
        wait_for(LIMIT, &format!("the hub sees upgrade {state}"), || {
            let v = self.hub.admin_json(&["agent", "show", "a1"]);
            let u = v["report"]["upgrade"].clone();
            (u["state"] == state).then_some(u)
        })
    }
}

#[test]
fn under_systemd_a_crashing_release_is_rolled_back_and_a_hand_replaced_binary_followed() {
    let Some(f) = Fleet::up("upgrade", "1s", false) else {
        return;
    };
    let v1 = sha256_hex(&builds().v1);
    assert_eq!(f.sha(EXE), v1);

    // A release that crashes at start: systemd restarts it, the watcher (a transient
    // unit, from the old bytes) counts the restarts, puts the previous binary back and
    // restarts the service; the hub halts the version.
    let crash = script(f.dir.path(), "crash", "99.5.0", "exit 1");
    f.roll("99.5.0", &crash);
    let u = f.hub_upgrade("rolled_back");
    assert_eq!(u["target"], "99.5.0", "{u}");
    // systemd's own count saw every restart (NRestarts: the crash at start comes and
    // goes between two looks at MainPID).
    assert_says(&u, "error", "was restarted 3 times before it committed");
    f.assert_running(&builds().v1_version);
    assert_eq!(f.sha(EXE), v1, "the previous binary is back");
    let watch = f.journal("railgrid-upgrade-watch-*");
    assert!(watch.contains("rolling the upgrade back"), "{watch}");
    let releases = f.hub.admin_json(&["release", "list"]);
    let halted = releases
        .as_array()
        .expect("releases")
        .iter()
        .find(|r| r["version"] == "99.5.0")
        .expect("the release");
    assert_eq!(halted["halted"]["agent"], "a1", "{releases}");
    f.no_watcher();

    // The binary replaced by hand (as a package manager does): the agent test-runs it,
    // keeps its own bytes as .prev, and restarts onto it in the same process.
    let main = f.show("railgrid-agent", "MainPID");
    f.c.ok(&format!(
        "cp {SHARE}/railgrid-v2 {EXE}.new && mv -f {EXE}.new {EXE}"
    ));
    f.wait_status("the replaced binary committed", |st| {
        st["version"] == V2 && st["upgrade"]["state"] == "committed"
    });
    f.assert_running(V2);
    assert_eq!(f.sha(EXE), sha256_hex(&builds().v2));
    assert_eq!(
        f.sha(&format!("{EXE}.prev")),
        v1,
        "the previous binary is kept"
    );
    assert_eq!(
        f.show("railgrid-agent", "MainPID"),
        main,
        "re-executed in place"
    );
    f.no_watcher();
    assert_eq!(f.hub_upgrade("committed")["target"], V2);
}

#[test]
fn under_systemd_a_stop_or_a_reboot_in_the_commit_window_ends_on_a_verified_binary() {
    let Some(mut f) = Fleet::up("reboot", "8s", true) else {
        return;
    };
    let (v1, v2) = (sha256_hex(&builds().v1), sha256_hex(&builds().v2));
    f.roll(V2, &builds().v2);
    let pending = |f: &Fleet| {
        f.wait_status("the new version in its commit window", |st| {
            st["version"] == V2 && st["upgrade"]["state"] == "pending_commit"
        })
    };
    pending(&f);
    assert!(
        !f.watchers().is_empty(),
        "the watcher runs as a unit of its own"
    );

    // The operator stops the service: the watcher outlives the stop, puts the previous
    // binary back, blames nobody, and leaves the service stopped.
    f.c.ok("systemctl stop railgrid-agent");
    f.no_watcher();
    assert_eq!(f.sha(EXE), v1, "the previous binary is back");
    assert_eq!(f.show("railgrid-agent", "ActiveState"), "inactive");
    let watch = f.journal("railgrid-upgrade-watch-*");
    assert!(watch.contains("stays stopped"), "{watch}");
    let record: Value =
        serde_json::from_str(&f.c.ok("cat /var/lib/railgrid/upgrade.json")).expect("record");
    assert_eq!(record["upgrade"]["phase"], "aborted", "{record}");
    assert_eq!(record["bad_versions"], serde_json::json!([]), "{record}");

    // Started again, it takes the upgrade again; a reboot in the commit window: the
    // watcher is stopped with the host, the unit's guard starts another from .prev
    // before the agent, and the new version commits.
    f.c.ok("systemctl start railgrid-agent");
    pending(&f);
    f.c.reboot();
    f.wait_status("committed after the reboot", |st| {
        st["version"] == V2 && st["upgrade"]["state"] == "committed"
    });
    let guard = f.journal("railgrid-agent");
    assert!(
        guard.contains("an upgrade was in flight without its watcher: started one"),
        "{guard}"
    );
    f.assert_running(V2);
    assert_eq!(f.sha(EXE), v2);
    assert_eq!(f.sha(&format!("{EXE}.prev")), v1);
    assert_eq!(f.hub_upgrade("committed")["target"], V2);
}
