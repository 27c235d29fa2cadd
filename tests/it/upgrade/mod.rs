//! Self-upgrade, end to end (DESIGN invariants 13 and 14): the reference hub over TLS
//! with a release key, an agent run from a copy of the binary in a directory of its own
//! (so that it may replace it), a second build of the same source stamped 99.0.0 with
//! `RAILGRID_BUILD_VERSION` (built once per test run), and every fault the upgrade must
//! survive. Each fault test checks what is on disk after, what the hub shows, that the
//! runner runs the same build as the agent, and that the executable's directory holds
//! nothing but `<exe>` and `<exe>.prev`.

mod by_hand;
mod download;
mod refused;
mod rollback;

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use super::agent::Host;
use super::hubs::TestHub;
use super::support::*;

const LIMIT: Duration = Duration::from_secs(60);
/// The version the second build reports.
pub(super) const V2: &str = "99.0.0";

/// The binaries every test starts from: this build (stripped, so copies are cheap) and
/// the second build.
pub(super) struct Builds {
    pub(super) v1: PathBuf,
    pub(super) v1_version: String,
    pub(super) v2: PathBuf,
}

/// `<target>/upgrade-fixtures/run-<pid>`: a static is never dropped, so a temp dir would
/// outlive every run; this one is swept by the next run once its process is gone.
fn fixture_dir(target: &Path) -> PathBuf {
    let root = target.join("upgrade-fixtures");
    if let Ok(entries) = fs::read_dir(&root) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_prefix("run-")
                .and_then(|p| p.parse::<i32>().ok());
            let gone = pid.is_some_and(|p| p as u32 == std::process::id() || !alive(p));
            if gone {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = root.join(format!("run-{}", std::process::id()));
    fs::create_dir_all(&dir).expect("the fixtures' directory");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

pub(super) fn builds() -> &'static Builds {
    static BUILDS: OnceLock<Builds> = OnceLock::new();
    BUILDS.get_or_init(|| {
        let bin = Path::new(BIN);
        let target = bin
            .parent()
            .and_then(Path::parent)
            .expect("the binary is in <target>/<profile>/");
        let dir = fixture_dir(target);
        let v1 = dir.join("railgrid-v1");
        let stripped = Command::new("strip")
            .arg("-o")
            .arg(&v1)
            .arg(BIN)
            .status()
            .is_ok_and(|s| s.success());
        if !stripped {
            fs::copy(BIN, &v1).expect("copy the binary");
        }
        let v1_version = version_of(&v1);
        // The same source, another version: cargo rebuilds only this crate for the
        // profile once its dependencies are there.
        let out = Command::new(env!("CARGO"))
            .args([
                "build",
                "--quiet",
                "--profile",
                "upgrade-fixture",
                "--bin",
                "railgrid",
            ])
            .arg("--manifest-path")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .arg("--target-dir")
            .arg(target)
            .env("RAILGRID_BUILD_VERSION", V2)
            .stdin(Stdio::null())
            .output()
            .expect("run cargo build for the second version");
        assert!(
            out.status.success(),
            "building the {V2} fixture failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v2 = dir.join("railgrid-v2");
        fs::copy(target.join("upgrade-fixture/railgrid"), &v2).expect("copy the second build");
        assert_eq!(version_of(&v2), V2);
        Builds { v1, v1_version, v2 }
    })
}

pub(super) fn version_of(bin: &Path) -> String {
    let out =
        fresh(|| Command::new(bin).args(["version", "--json"]).output()).expect("version --json");
    let v: Value = serde_json::from_slice(&out.stdout).expect("version JSON");
    v["version"].as_str().expect("version").to_owned()
}

pub(super) fn sha256_hex(path: &Path) -> String {
    use sha2::Digest;
    let bytes = fs::read(path).expect("read");
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A publisher's key pair.
pub(super) struct Key {
    pub(super) secret: PathBuf,
    pub(super) public: PathBuf,
    pub(super) line: String,
}

pub(super) fn keygen(dir: &Path, name: &str) -> Key {
    let secret = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub"));
    let out = railgrid()
        .args(["release", "keygen", "--secret-key"])
        .arg(&secret)
        .arg("--public-key")
        .arg(&public)
        .output()
        .expect("keygen");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = fs::read_to_string(&public)
        .expect("public key")
        .lines()
        .nth(1)
        .expect("key line")
        .to_owned();
    Key {
        secret,
        public,
        line,
    }
}

/// Signs `file` as `version`; its `.minisig`.
pub(super) fn sign(key: &Key, file: &Path, version: &str) -> PathBuf {
    let out = railgrid()
        .args(["release", "sign", "--secret-key"])
        .arg(&key.secret)
        .args(["--version", version])
        .arg(file)
        .output()
        .expect("sign");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut sig = file.as_os_str().to_owned();
    sig.push(".minisig");
    PathBuf::from(sig)
}

/// Signs a copy of `binary` (in `dir`) as `version` with `key` and publishes it on `hub`.
pub(super) fn release(hub: &TestHub, key: &Key, dir: &Path, version: &str, binary: &Path) {
    let copy = dir.join(format!("release-{version}"));
    fs::copy(binary, &copy).expect("copy release");
    let sig = sign(key, &copy, version);
    let out = hub.admin(&[
        "release",
        "publish",
        "--version",
        version,
        "--binary",
        &path_str(&copy),
        "--signature",
        &path_str(&sig),
    ]);
    assert!(
        out.status.success(),
        "publish {version}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Kills the agent of `host`, its runner and its watcher: every pid its files name.
pub(super) fn kill_upgrading_agent(host: &Host) {
    let state = host.state();
    let rec: Value =
        serde_json::from_str(&read_lossy(&state.join("upgrade.json"))).unwrap_or(Value::Null);
    if let Some(w) = rec["upgrade"]["watcher_pid"].as_i64() {
        let _ = kill(Pid::from_raw(w as i32), Signal::SIGKILL);
    }
    let st = host.status();
    let mut agents: Vec<i32> = Vec::new();
    for p in [st["pid"].as_i64(), rec["upgrade"]["agent_pid"].as_i64()]
        .into_iter()
        .flatten()
    {
        agents.push(p as i32);
    }
    for p in &agents {
        let _ = kill(Pid::from_raw(*p), Signal::SIGTERM);
    }
    let until = Instant::now() + Duration::from_secs(15);
    while agents.iter().any(|p| alive(*p)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in &agents {
        let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
    }
    if let Some(r) = host.status()["runner"]["pid"].as_i64() {
        if alive(r as i32) {
            let _ = nix::sys::signal::killpg(Pid::from_raw(r as i32), Signal::SIGKILL);
        }
    }
}

/// A hub with a release key, a host enrolled as `a1`, and its agent run from
/// `<dir>/bin/railgrid`.
pub(super) struct Up {
    dir: tempfile::TempDir,
    hub: Option<TestHub>,
    key: Key,
    pub(super) host: Host,
    token: PathBuf,
    pub(super) agent: Option<Guard>,
    /// The agent's hub URL (the hub's own, or a proxy's).
    url: String,
    /// More of the agent's environment, over the defaults below.
    pub(super) env: Vec<(&'static str, &'static str)>,
}

impl Up {
    pub(super) fn new() -> Self {
        Self::with_exe(&builds().v1)
    }

    /// The agent's executable starts as a copy of `exe`.
    pub(super) fn with_exe(exe: &Path) -> Self {
        let dir = tempdir();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let key = keygen(dir.path(), "publisher");
        let hub = TestHub::start(
            &dir.path().join("hub"),
            &["--release-key", &path_str(&key.public)],
        );
        let token = hub.enrol("a1");
        let bin = dir.path().join("bin");
        fs::create_dir(&bin).expect("bin dir");
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).expect("chmod");
        fs::copy(exe, bin.join("railgrid")).expect("install the agent's binary");
        let url = hub.url.clone();
        Self {
            dir,
            hub: Some(hub),
            key,
            host: Host::new(),
            token,
            agent: None,
            url,
            env: Vec::new(),
        }
    }

    pub(super) fn hub(&self) -> &TestHub {
        self.hub.as_ref().expect("hub running")
    }

    pub(super) fn exe(&self) -> PathBuf {
        self.dir.path().join("bin/railgrid")
    }

    pub(super) fn bin_dir(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts the agent, trusting `trusted` (the publisher's key line unless given).
    pub(super) fn start_agent_trusting(&mut self, trusted: &str) {
        let (ca, token) = (path_str(&self.hub().ca()), path_str(&self.token));
        let url = self.url.clone();
        let mut cmd = self.host.agent_cmd_from(
            &self.exe(),
            &[
                "--hub",
                &url,
                "--agent-id",
                "a1",
                "--token-file",
                &token,
                "--ca-file",
                &ca,
                "--trusted-key",
                trusted,
            ],
        );
        let err = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("agent.stderr"))
            .expect("agent stderr");
        cmd.env("RAILGRID_UPGRADE_SETTLE", "1s")
            .env("RAILGRID_UPGRADE_DEADLINE", "10s")
            .env("RAILGRID_RUNNER_STOP_GRACE", "2s")
            .envs(self.env.iter().copied())
            .stderr(err);
        self.agent = Some(Guard::new(fresh(|| cmd.spawn()).expect("spawn agent")));
        self.wait_agent("the agent connected with its runner", |st| {
            st["hub"]["connected"] == true && st["runner"]["state"] == "running"
        });
    }

    pub(super) fn start_agent(&mut self) {
        let line = self.key.line.clone();
        self.start_agent_trusting(&line);
    }

    pub(super) fn status(&self) -> Value {
        self.host.status()
    }

    pub(super) fn wait_agent(&self, what: &str, accept: impl Fn(&Value) -> bool) -> Value {
        wait_for(LIMIT, what, || {
            let st = self.status();
            accept(&st).then_some(st)
        })
    }

    pub(super) fn upgrade_state(&self) -> Value {
        self.status()["upgrade"].clone()
    }

    /// Waits for the agent's upgrade to reach `state`; the upgrade report.
    pub(super) fn wait_upgrade(&self, state: &str) -> Value {
        let what = format!("upgrade state {state}");
        wait_for(LIMIT, &what, || {
            let u = self.upgrade_state();
            (u["state"] == state).then_some(u)
        })
    }

    pub(super) fn publish(
        &self,
        version: &str,
        binary: &Path,
        signature: &Path,
    ) -> std::process::Output {
        self.hub().admin(&[
            "release",
            "publish",
            "--version",
            version,
            "--binary",
            &path_str(binary),
            "--signature",
            &path_str(signature),
        ])
    }

    /// Signs `binary` as `version` with the publisher's key and publishes it.
    pub(super) fn release(&self, version: &str, binary: &Path) {
        release(self.hub(), &self.key, self.dir.path(), version, binary);
    }

    pub(super) fn want(&self, version: &str) {
        self.hub()
            .admin_ok(&["desired", "set", "--fleet", "--version", version]);
    }

    /// The hub's view of a1.
    pub(super) fn hub_agent(&self) -> Value {
        self.hub().admin_json(&["agent", "show", "a1"])
    }

    pub(super) fn releases(&self) -> Value {
        self.hub().admin_json(&["release", "list"])
    }

    pub(super) fn record(&self) -> Value {
        serde_json::from_str(&read_lossy(&self.host.state().join("upgrade.json")))
            .unwrap_or(Value::Null)
    }

    /// The names in the executable's directory.
    pub(super) fn bin_entries(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.bin_dir())
            .expect("read bin dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Nothing in the executable's directory but `railgrid` and, maybe, `railgrid.prev`.
    pub(super) fn assert_clean_bin(&self) {
        let names = self.bin_entries();
        assert!(
            names
                .iter()
                .all(|n| n == "railgrid" || n == "railgrid.prev")
                && names.iter().any(|n| n == "railgrid"),
            "the executable's directory holds {names:?}"
        );
    }

    /// The agent runs `version`, from the file at its path, and its runner too.
    pub(super) fn assert_running(&self, version: &str) {
        let st = self.wait_agent(&format!("agent {version} with a running runner"), |st| {
            st["version"] == version && st["runner"]["state"] == "running" && st["running"] == true
        });
        assert!(alive(st["pid"].as_i64().expect("pid") as i32));
        let runner_pid = st["runner"]["pid"].as_i64().expect("runner pid");
        let health = wait_for(LIMIT, "the runner's health", || {
            let (code, body) = get(&self.host.socket(), "/v1/health")?;
            let v: Value = serde_json::from_str(&body).ok()?;
            (code == 200 && v["pid"].as_i64() == Some(runner_pid)).then_some(v)
        });
        assert_eq!(
            health["version"], version,
            "the runner runs the agent's build"
        );
        assert_eq!(version_of(&self.exe()), version, "the file at the path");
        assert_eq!(
            st["exe"]["sha256"].as_str(),
            Some(sha256_hex(&self.exe()).as_str()),
            "the agent runs the file at its path"
        );
    }

    /// What the hub's report of a1 says of the upgrade.
    pub(super) fn hub_upgrade(&self, state: &str) -> Value {
        wait_for(LIMIT, &format!("the hub sees upgrade {state}"), || {
            let v = self.hub_agent();
            let u = v["report"]["upgrade"].clone();
            (u["state"] == state).then_some(u)
        })
    }

    /// The agent, its runner and the watcher: every pid any file names.
    pub(super) fn kill_everything(&mut self) {
        kill_upgrading_agent(&self.host);
        self.agent.take();
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        self.kill_everything();
    }
}

/// A shell script that answers `version --json` as `version` and does `rest` for
/// anything else.
pub(super) fn script(dir: &Path, name: &str, version: &str, rest: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(
        &path,
        format!(
            "#!/bin/sh\nif [ \"$1 $2\" = \"version --json\" ]; then\n  echo '{{\"version\":\"{version}\",\"commit\":null,\"target\":\"test\"}}'\n  exit 0\nfi\n{rest}\n"
        ),
    )
    .expect("script");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

#[test]
fn a_hub_upgrade_runs_the_new_version_in_place_and_commits() {
    let mut up = Up::new();
    up.start_agent();
    let pid = up.status()["pid"].as_i64().expect("pid");
    let old_sha = sha256_hex(&up.exe());
    up.release(V2, &builds().v2);
    up.want(V2);
    let u = up.wait_upgrade("committed");
    assert_eq!(u["target"], V2);
    up.assert_running(V2);
    assert_eq!(
        up.status()["pid"].as_i64(),
        Some(pid),
        "re-executed in place: the same process"
    );
    assert_eq!(sha256_hex(&up.exe()), sha256_hex(&builds().v2));
    assert_eq!(
        sha256_hex(&up.bin_dir().join("railgrid.prev")),
        old_sha,
        "the previous binary is kept"
    );
    up.assert_clean_bin();
    assert_eq!(up.hub_upgrade("committed")["target"], V2);
    let rel = up.releases();
    let v2 = rel
        .as_array()
        .expect("list")
        .iter()
        .find(|r| r["version"] == V2)
        .expect("the release");
    assert_eq!(v2["agents"], 1, "{rel}");
    assert_eq!(v2["pending"], 0);
    // The watcher saw the commit and is gone.
    let watcher = up.record()["upgrade"]["watcher_pid"]
        .as_i64()
        .expect("watcher pid");
    wait_for(LIMIT, "the watcher exits", || {
        (!alive(watcher as i32)).then_some(())
    });
    let text = String::from_utf8_lossy(
        &railgrid()
            .args(["agent", "status", "--state-dir"])
            .arg(up.host.state())
            .output()
            .expect("agent status")
            .stdout,
    )
    .into_owned();
    assert!(
        text.contains(&format!("upgrade:    committed {V2}")),
        "{text}"
    );
}
