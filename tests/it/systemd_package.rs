//! The Debian package under a real systemd 252 ([`Container`]): installed the way
//! packaging/cloud-init/user-data.yaml says (its files written and its commands run as
//! cloud-init would), enrolled with an enrolment token, a job run through the hub; a
//! rollout refused (the package's binary is the package manager's), a newer package taken
//! instead, a rollout refused after it too and an older package taken back; then removed
//! (configuration and state kept) and purged, and the container is as it was.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::container::{Container, Options};
use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(90);
const SHARE: &str = "/opt/railgrid-test";

/// `binary`'s package, built into `out`.
fn package(binary: &Path, out: &Path) -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let man = Path::new(BIN)
        .parent()
        .expect("target dir")
        .join("examples/man");
    let built = Command::new("bash")
        .arg(repo.join("packaging/deb/build.sh"))
        .arg(binary)
        .arg(out)
        .arg(man)
        .env("DEB_COMPRESSION", "gzip")
        .output()
        .expect("build.sh");
    assert!(built.status.success(), "{}", text(&built.stderr));
    let deb = text(&built.stdout).trim().to_owned();
    Path::new(&deb)
        .file_name()
        .and_then(|n| n.to_str())
        .expect("the package's name")
        .to_owned()
}

/// The user-data's files and commands with its placeholders filled: (path, mode,
/// content) and the commands, as cloud-init reads them.
fn user_data(fill: &[(&str, &str)]) -> (Vec<(String, String, String)>, Vec<String>) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut yaml =
        fs::read_to_string(repo.join("packaging/cloud-init/user-data.yaml")).expect("user-data");
    for (k, v) in fill {
        // A value of several lines keeps the block's indentation.
        yaml = yaml.replace(k, &v.trim_end().replace('\n', "\n      "));
    }
    let (mut files, mut cmds) = (Vec::new(), Vec::new());
    let mut section = "";
    for line in yaml.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            section = line.trim_end_matches(':');
        } else if let Some(path) = line.strip_prefix("  - path: ") {
            files.push((path.to_owned(), String::new(), String::new()));
        } else if let Some(mode) = line.strip_prefix("    permissions: ") {
            files.last_mut().expect("a file").1 = mode.trim_matches('"').to_owned();
        } else if let Some(content) = line.strip_prefix("      ") {
            let f = files.last_mut().expect("a file");
            f.2.push_str(content);
            f.2.push('\n');
        } else if let (Some(cmd), "runcmd") = (line.strip_prefix("  - "), section) {
            cmds.push(cmd.to_owned());
        }
    }
    (files, cmds)
}

/// What of the package a host keeps: its account, files and units.
fn footprint(c: &Container) -> String {
    c.ok(
        "getent passwd railgrid; getent group railgrid; ls -d /etc/railgrid /var/lib/railgrid \
         /var/log/railgrid /usr/bin/railgrid /lib/systemd/system/railgrid-agent.service 2>/dev/null; \
         systemctl list-unit-files --no-legend 'railgrid*'; dpkg -l railgrid 2>/dev/null | grep '^.i'; true",
    )
}

#[test]
fn a_host_installs_the_package_enrols_runs_a_job_takes_a_newer_package_and_purges_clean() {
    if !requires_root("booting a systemd container needs root") {
        return;
    }
    let dir = tempdir();
    let (key, hub) = signed_hub(dir.path());
    let share = dir.path().join("share");
    fs::create_dir(&share).expect("share");
    fs::set_permissions(&share, fs::Permissions::from_mode(0o755)).expect("chmod");
    let v1 = package(&builds().v1, &share);
    let v2 = package(&builds().v2, &share);
    let enrol = dir.path().join("enrol.token");
    hub.admin_ok(&[
        "enrol-token",
        "create",
        "--label",
        "queue=pkg",
        "--token-out",
        &path_str(&enrol),
    ]);
    let Some(c) = Container::boot_with(
        "rg-package",
        Options {
            binds: vec![(share, SHARE)],
            ..Options::default()
        },
    ) else {
        return;
    };
    let before = footprint(&c);
    assert_eq!(before, "", "a fresh container has nothing of railgrid");

    // As cloud-init would: the files, then the commands.
    let (files, cmds) = user_data(&[
        ("<PACKAGE_URL>", &format!("file://{SHARE}/{v1}")),
        ("<HUB_URL>", &hub.url),
        (
            "<ENROL_TOKEN>",
            fs::read_to_string(&enrol).expect("token").trim(),
        ),
        ("<HUB_CA_PEM>", &fs::read_to_string(hub.ca()).expect("ca")),
    ]);
    assert_eq!(files.len(), 3, "{files:?}");
    for (path, mode, content) in &files {
        let parent = Path::new(path).parent().expect("parent");
        c.ok(&format!(
            "mkdir -p {parent} && cat > {path} <<'RAILGRID_EOF'\n{content}RAILGRID_EOF\nchmod {mode} {path}",
            parent = parent.display()
        ));
    }
    // The package's own state, before the service is enabled: installed, not enabled.
    c.ok(&cmds[0]);
    c.ok(&cmds[1]);
    assert_eq!(
        c.sh("systemctl is-enabled railgrid-agent").stdout,
        b"disabled\n"
    );
    assert_eq!(
        c.ok("dpkg --verify railgrid"),
        "",
        "dpkg's files as it installed them"
    );
    assert!(c
        .ok("getent passwd railgrid")
        .contains(":/var/lib/railgrid/runner:/usr/sbin/nologin"));
    // Its scripts run again change nothing.
    let installed = c.ok("getent passwd railgrid; stat -c '%a %U' /etc/railgrid /etc/railgrid/*");
    c.ok(&format!("apt-get install -y --reinstall {SHARE}/{v1}"));
    assert_eq!(
        c.ok("getent passwd railgrid; stat -c '%a %U' /etc/railgrid /etc/railgrid/*"),
        installed
    );
    for cmd in &cmds[2..] {
        c.ok(cmd);
    }
    let status = |c: &Container| -> Value {
        serde_json::from_slice(&c.sh("railgrid agent status --json 2>/dev/null").stdout)
            .unwrap_or(Value::Null)
    };
    wait_for(
        LIMIT,
        "the packaged agent enrolled, its runner running",
        || {
            let st = status(&c);
            (st["hub"]["connected"] == true && st["runner"]["state"] == "running").then_some(())
        },
    );
    let agents = hub.admin_json(&["agent", "list"]);
    let id = agents[0]["id"]
        .as_str()
        .expect("the enrolled agent")
        .to_owned();
    assert_eq!(agents[0]["labels"]["queue"], "pkg", "{agents}");

    // A job through the hub, run as the package's account.
    let out = hub.admin(&[
        "job",
        "submit",
        "--select",
        "queue=pkg",
        "--wait",
        "--",
        "id",
        "-un",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "railgrid\n");

    // A rollout does not replace dpkg's file: refused, naming the package manager.
    release(&hub, &key, dir.path(), V2, &builds().v2);
    hub.admin_ok(&["desired", "set", "--agent", &id, "--version", V2]);
    let st = wait_for(LIMIT, "the rollout refused", || {
        let st = status(&c);
        (st["upgrade"]["state"] == "refused").then_some(st)
    });
    assert!(
        says(&st["upgrade"], "error", "belongs to the package railgrid"),
        "{st}"
    );
    assert_eq!(c.ok("dpkg --verify railgrid"), "");
    // The newer package instead: the running agent restarts into it.
    c.ok(&format!("apt-get install -y {SHARE}/{v2}"));
    wait_for(LIMIT, "the agent on the newer package", || {
        let st = status(&c);
        (st["version"] == V2 && st["hub"]["connected"] == true).then_some(())
    });
    assert_eq!(c.ok("dpkg --verify railgrid"), "");
    // The other order: a rollout after the package, refused the same way; and a rollback
    // is the package manager's too.
    let v1_version = builds().v1_version.clone();
    release(&hub, &key, dir.path(), &v1_version, &builds().v1);
    hub.admin_ok(&[
        "desired",
        "set",
        "--agent",
        &id,
        "--version",
        &v1_version,
        "--rollback",
        "true",
    ]);
    wait_for(LIMIT, "the rollback by rollout refused", || {
        let st = status(&c);
        (st["upgrade"]["state"] == "refused" && st["upgrade"]["target"] == v1_version.as_str())
            .then_some(())
    });
    c.ok(&format!(
        "apt-get install -y --allow-downgrades {SHARE}/{v1}"
    ));
    wait_for(LIMIT, "the agent back on the older package", || {
        let st = status(&c);
        (st["version"] == v1_version.as_str() && st["hub"]["connected"] == true).then_some(())
    });
    assert_eq!(c.ok("dpkg --verify railgrid"), "");

    // Removed: stopped and disabled, configuration and state kept; purged: all gone.
    c.ok("apt-get remove -y railgrid");
    assert_eq!(
        c.sh("systemctl is-active railgrid-agent").stdout,
        b"inactive\n"
    );
    assert!(c.ok("ls /etc/railgrid").contains("agent.toml"));
    assert!(c.ok("ls /var/lib/railgrid").contains("runner"));
    c.ok("apt-get purge -y railgrid");
    assert_eq!(footprint(&c), before, "purged, the container is as it was");
}
