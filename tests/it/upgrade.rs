//! Self-upgrade, end to end (DESIGN invariants 13 and 14): the reference hub over TLS
//! with a release key, an agent run from a copy of the binary in a directory of its own
//! (so that it may replace it), a second build of the same source stamped 99.0.0 with
//! `RAILGRID_BUILD_VERSION` (built once per test run), and every fault the upgrade must
//! survive. Each fault test checks what is on disk after, what the hub shows, that the
//! runner runs the same build as the agent, and that the executable's directory holds
//! nothing but `<exe>` and `<exe>.prev`.

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

/// The agent must end where it started: the old version running from the old file.
fn assert_refused(up: &Up, why: &str) {
    let u = up.wait_upgrade("refused");
    let error = u["error"].as_str().unwrap_or_default();
    assert!(error.contains(why), "expected {why:?} in {error:?}");
    up.assert_running(&builds().v1_version);
    assert_eq!(sha256_hex(&up.exe()), sha256_hex(&builds().v1));
    let names = up.bin_entries();
    assert_eq!(names, ["railgrid"], "nothing left beside the executable");
    let hub = up.hub_upgrade("refused");
    assert!(
        hub["error"].as_str().unwrap_or_default().contains(why),
        "{hub}"
    );
}

#[test]
fn a_corrupted_artifact_is_refused_by_its_hash() {
    let mut up = Up::new();
    up.start_agent();
    up.release(V2, &builds().v2);
    // The hub's stored copy rots (same size, other bytes).
    let sha = sha256_hex(&builds().v2);
    let stored = up.hub().dir.join("releases").join(&sha);
    let mut bytes = fs::read(&stored).expect("stored release");
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    fs::write(&stored, &bytes).expect("corrupt");
    up.want(V2);
    assert_refused(&up, "SHA-256");
}

#[test]
fn a_signature_that_does_not_verify_is_refused() {
    let mut up = Up::new();
    up.start_agent();
    up.release(V2, &builds().v2);
    // The hub's database is tampered with: the signature of other bytes, by the same key.
    let other = up.path("other");
    fs::write(&other, b"other bytes").expect("other");
    let sig = fs::read_to_string(sign(&up.key, &other, V2)).expect("signature");
    let mut hub = up.hub.take().expect("hub");
    let listen = hub.listen.clone();
    let hub_dir = hub.dir.clone();
    hub.guard.signal(Signal::SIGTERM);
    hub.guard.wait_output(LIMIT);
    let db = rusqlite::Connection::open(hub_dir.join("hub.db")).expect("hub db");
    let n = db
        .execute("UPDATE releases SET signature = ?1", [&sig])
        .expect("tamper");
    assert_eq!(n, 1);
    drop(db);
    up.hub = Some(TestHub::start_on(
        &hub_dir,
        &listen,
        &["--release-key", &path_str(&up.key.public)],
    ));
    up.want(V2);
    assert_refused(&up, "does not verify");
}

#[test]
fn a_release_signed_by_a_key_the_agent_does_not_trust_is_refused() {
    let mut up = Up::new();
    let other = keygen(up.dir.path(), "someone-else");
    up.start_agent_trusting(&other.line);
    up.release(V2, &builds().v2);
    up.want(V2);
    assert_refused(&up, "not trusted");
}

#[test]
fn an_agent_without_trusted_keys_refuses_every_upgrade() {
    let mut up = Up::new();
    up.start_agent_trusting("");
    up.release(V2, &builds().v2);
    up.want(V2);
    assert_refused(&up, "no [upgrade] trusted_keys");
}

#[test]
fn the_hub_refuses_unsigned_and_wrongly_signed_releases() {
    let up = Up::new();
    let bin = up.path("release");
    fs::copy(&builds().v2, &bin).expect("copy");
    let stranger = keygen(up.dir.path(), "stranger");
    let sig = sign(&stranger, &bin, V2);
    let out = up.publish(V2, &bin, &sig);
    assert_eq!(out.status.code(), Some(2), "refused input");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not trusted") && err.contains("--release-key"),
        "{err}"
    );
    // A signature of other bytes, by the hub's own key.
    let other = up.path("other");
    fs::write(&other, b"x").expect("other");
    let other_sig = sign(&up.key, &other, V2);
    let out = up.publish(V2, &bin, &other_sig);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("does not verify"),
        "{err}"
    );
    // The version must be the one signed.
    let good = sign(&up.key, &bin, V2);
    let out = up.publish("99.0.1", &bin, &good);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("says it is version"),
        "{err}"
    );
    // Unsigned, through the API itself.
    let (code, body) = up.hub().curl(
        "PUT",
        &format!("/v1/admin/releases/{V2}/linux-x86_64"),
        Some(&up.hub().admin_token()),
        Some("binary"),
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("unsigned"), "{body}");
    assert_eq!(up.releases(), serde_json::json!([]), "nothing was taken");
    assert!(fs::read_dir(up.hub().dir.join("releases"))
        .map(|d| d.count() == 0)
        .unwrap_or(true));
}

/// What a [`Proxy`] does when a connection first carries more than its limit towards
/// the agent (a download; reconciles are small).
#[derive(Clone)]
enum AtLimit {
    /// Closes the connection mid-body.
    Cut,
    /// Holds the rest of the body until the gate opens.
    Hold(Arc<Gate>),
}

/// A gate a proxy waits at.
#[derive(Default)]
struct Gate {
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().expect("gate") = true;
        self.opened.notify_all();
    }

    fn wait(&self) {
        let mut open = self.open.lock().expect("gate");
        while !*open {
            open = self.opened.wait(open).expect("gate");
        }
    }
}

/// A TLS-blind TCP proxy to the hub that acts once, on the first connection carrying
/// more than `limit` bytes towards the agent.
struct Proxy {
    url: String,
    stop: Arc<AtomicBool>,
    /// How many connections reached the limit (acted on for the first only).
    reached: Arc<AtomicU64>,
}

impl Proxy {
    fn start(hub_listen: &str, limit: u64, at_limit: AtLimit) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let url = format!("https://{}", listener.local_addr().expect("addr"));
        let stop = Arc::new(AtomicBool::new(false));
        let reached = Arc::new(AtomicU64::new(0));
        let (hub, stop2, reached2) = (hub_listen.to_owned(), stop.clone(), reached.clone());
        listener.set_nonblocking(true).expect("nonblocking");
        std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).expect("blocking");
                        let server = TcpStream::connect(&hub).expect("connect hub");
                        let (c2, s2) = (
                            client.try_clone().expect("clone"),
                            server.try_clone().expect("clone"),
                        );
                        std::thread::spawn(move || pipe(c2, s2, None));
                        let act = (limit, at_limit.clone(), reached2.clone());
                        std::thread::spawn(move || pipe(server, client, Some(act)));
                    }
                    // The accept loop's own pace, not a test's synchronisation.
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { url, stop, reached }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies `from` to `to`; with `act`, does what it says the first time any connection
/// passes its limit.
fn pipe(mut from: TcpStream, mut to: TcpStream, act: Option<(u64, AtLimit, Arc<AtomicU64>)>) {
    let mut buf = [0u8; 16 * 1024];
    let mut sent = 0u64;
    let mut passed = false;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let (false, Some((limit, at_limit, reached))) = (passed, &act) {
            if sent + n as u64 > *limit {
                passed = true;
                if reached.fetch_add(1, Ordering::SeqCst) == 0 {
                    let head = (*limit - sent) as usize;
                    if to.write_all(&buf[..head]).is_err() {
                        break;
                    }
                    match at_limit {
                        AtLimit::Cut => break,
                        AtLimit::Hold(gate) => {
                            gate.wait();
                            if to.write_all(&buf[head..n]).is_err() {
                                break;
                            }
                            sent += n as u64;
                            continue;
                        }
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        sent += n as u64;
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

#[test]
fn a_download_cut_mid_body_resumes_with_a_range_and_commits() {
    let mut up = Up::new();
    let proxy = Proxy::start(&up.hub().listen, 4 * 1024 * 1024, AtLimit::Cut);
    up.url = proxy.url.clone();
    up.start_agent();
    up.release(V2, &builds().v2);
    up.want(V2);
    up.wait_upgrade("committed");
    assert!(
        proxy.reached.load(Ordering::SeqCst) >= 1,
        "the proxy cut a download"
    );
    let log = read_lossy(&up.path("agent.stderr")) + &up.host.agent_log();
    assert!(
        log.contains("resuming from the bytes on disk"),
        "the download resumed: {log}"
    );
    up.assert_running(V2);
    up.assert_clean_bin();
}

#[test]
fn a_downgrade_is_refused_unless_the_hub_asks_for_a_rollback() {
    let mut up = Up::with_exe(&builds().v2);
    up.start_agent();
    let v1 = builds().v1_version.clone();
    up.release(&v1, &builds().v1);
    up.want(&v1);
    let u = up.wait_upgrade("refused");
    assert!(
        u["error"]
            .as_str()
            .unwrap_or_default()
            .contains("downgrade"),
        "{u}"
    );
    up.assert_running(V2);
    assert_eq!(up.bin_entries(), ["railgrid"]);
    // The hub asks for it on purpose.
    up.hub()
        .admin_ok(&["desired", "set", "--fleet", "--rollback", "true"]);
    up.wait_upgrade("committed");
    up.assert_running(&v1);
    up.assert_clean_bin();
}

#[test]
fn a_garbage_binary_fails_its_test_run_and_nothing_changes() {
    let mut up = Up::new();
    up.start_agent();
    let garbage = up.path("garbage");
    fs::write(&garbage, vec![0x5au8; 64 * 1024]).expect("garbage");
    up.release("99.0.3", &garbage);
    up.want("99.0.3");
    assert_refused(&up, "test run");
}

#[test]
fn a_binary_that_reports_another_version_is_refused() {
    let mut up = Up::new();
    up.start_agent();
    // The second build (99.0.0) signed and published as 99.0.1.
    up.release("99.0.1", &builds().v2);
    up.want("99.0.1");
    assert_refused(&up, "reports version 99.0.0, not 99.0.1");
}

/// The agent rolled back `version`: the restored agent runs the old build from the old
/// file, the hub halted the version (when it had sent it), and the agent remembers it as
/// bad.
fn assert_rolled_back(up: &Up, version: &str, why: &str) {
    assert_rolled_back_as(up, version, why, true);
}

fn assert_rolled_back_as(up: &Up, version: &str, why: &str, halted_by_hub: bool) {
    let u = up.wait_upgrade("rolled_back");
    assert_eq!(u["target"], version);
    assert!(u["error"].as_str().unwrap_or_default().contains(why), "{u}");
    up.assert_running(&builds().v1_version);
    assert_eq!(sha256_hex(&up.exe()), sha256_hex(&builds().v1));
    up.assert_clean_bin();
    let rec = up.record();
    assert_eq!(rec["upgrade"]["phase"], "rolled_back", "{rec}");
    assert_eq!(rec["bad_versions"][0]["version"], version, "{rec}");
    let hub = up.hub_upgrade("rolled_back");
    assert_eq!(hub["target"], version);
    let rel = up.releases();
    if !halted_by_hub {
        // Not a release the hub sent: nothing for the fleet to halt.
        assert_eq!(rel, serde_json::json!([]), "{rel}");
        return;
    }
    let halted = rel
        .as_array()
        .expect("list")
        .iter()
        .find(|r| r["version"] == version)
        .map(|r| r["halted"].clone())
        .expect("the release");
    assert_eq!(halted["agent"], "a1", "{rel}");
    assert!(
        halted["reason"].as_str().unwrap_or_default().contains(why),
        "{rel}"
    );
}

#[test]
fn a_release_that_crashes_at_start_is_rolled_back_and_halted_for_the_fleet() {
    let mut up = Up::new();
    up.hub().enrol("a2");
    up.start_agent();
    let crash = script(
        up.dir.path(),
        "crash",
        "99.0.2",
        "echo crashing >&2\nexit 1",
    );
    up.release("99.0.2", &crash);
    let started = Instant::now();
    up.want("99.0.2");
    assert_rolled_back(&up, "99.0.2", "exited before it committed");
    eprintln!(
        "rolled back {:?} after the desired version was set",
        started.elapsed()
    );
    // An agent that has not started it is not offered it.
    let a2 = up.hub().admin_json(&["desired", "show", "--agent", "a2"]);
    assert_eq!(a2["effective"]["agent"], Value::Null, "{a2}");
    let list = up.hub().admin_ok(&["release", "list"]);
    assert!(
        list.contains("halted") && list.contains("rolled back by a1"),
        "{list}"
    );
    // Not retried while the hub asks for it; resumed at the hub, still bad here.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(up.upgrade_state()["state"], "rolled_back");
    up.hub().admin_ok(&["release", "resume", "99.0.2"]);
    let a2 = up.hub().admin_json(&["desired", "show", "--agent", "a2"]);
    assert_eq!(a2["effective"]["agent"]["version"], "99.0.2", "{a2}");
    let out = railgrid()
        .args(["agent", "upgrade", "--clear-bad", "--state-dir"])
        .arg(up.host.state())
        .output()
        .expect("clear-bad");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("forgot 99.0.2"));
    assert_eq!(up.record()["bad_versions"], serde_json::json!([]));
}

#[test]
fn a_release_that_never_gets_healthy_is_rolled_back_at_the_deadline() {
    let mut up = Up::new();
    up.start_agent();
    // Runs, but never serves a runner: `agent run` just sleeps.
    let hang = script(up.dir.path(), "hang", "99.0.4", "exec sleep 600");
    up.release("99.0.4", &hang);
    up.want("99.0.4");
    assert_rolled_back(&up, "99.0.4", "did not commit by its deadline");
}

/// Starts the agent, asks for the second build, and freezes the agent (SIGSTOP) once
/// the record says `pending` (right after the rename; the re-exec comes after the
/// runner's stop), checking that it still runs the old bytes. Its pid.
fn freeze_between_rename_and_re_exec(up: &mut Up) -> i32 {
    use std::os::unix::fs::MetadataExt;
    up.start_agent();
    let pid = up.status()["pid"].as_i64().expect("pid") as i32;
    up.release(V2, &builds().v2);
    up.want(V2);
    wait_for(LIMIT, "the switch", || {
        (up.record()["upgrade"]["phase"] == "pending").then_some(())
    });
    kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("SIGSTOP");
    let exe = fs::metadata(format!("/proc/{pid}/exe")).expect("agent exe");
    let prev = fs::metadata(up.bin_dir().join("railgrid.prev")).expect(".prev");
    assert_eq!(exe.ino(), prev.ino(), "the agent has not re-executed yet");
    pid
}

#[test]
fn an_agent_killed_between_the_rename_and_the_re_exec_still_ends_on_a_verified_binary() {
    let mut up = Up::new();
    let pid = freeze_between_rename_and_re_exec(&mut up);
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("SIGKILL");
    up.agent.take().map(|mut g| g.wait_output(LIMIT));
    // Standalone, the watcher starts the agent once more, from the new, verified file.
    up.wait_upgrade("committed");
    up.assert_running(V2);
    up.assert_clean_bin();
}

#[test]
fn a_full_disk_refuses_the_download_early_and_leaves_nothing() {
    if !requires_root("mounting a small tmpfs needs root") {
        return;
    }
    let mut up = Up::new();
    // The executable's directory on a tmpfs that holds it, and not the new one too.
    let size = fs::metadata(up.exe()).expect("exe").len() + 8 * 1024 * 1024;
    let _disk = SmallDisk::mount(&up, size);
    up.start_agent();
    up.release(V2, &builds().v2);
    up.want(V2);
    let u = up.wait_upgrade("failed");
    assert!(
        u["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not enough space"),
        "{u}"
    );
    up.assert_running(&builds().v1_version);
    assert_eq!(up.bin_entries(), ["railgrid"]);
    let hub = up.hub_upgrade("failed");
    assert!(hub["error"]
        .as_str()
        .unwrap_or_default()
        .contains("not enough space"));
    up.kill_everything();
}

/// A tmpfs of a given size over the executable's directory, with the agent's binary on
/// it; unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(up: &Up, size: u64) -> Self {
        let saved = up.path("saved-railgrid");
        fs::copy(up.exe(), &saved).expect("save");
        let bin = up.bin_dir();
        let opts = format!("size={size},mode=0755");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &opts, "tmpfs"])
            .arg(&bin)
            .status()
            .expect("mount");
        assert!(mounted.success(), "mount tmpfs");
        let disk = SmallDisk(bin);
        fs::copy(&saved, up.exe()).expect("install on the tmpfs");
        disk
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_disk_that_fills_during_the_download_loses_the_download_and_nothing_else() {
    if !requires_root("mounting a small tmpfs needs root") {
        return;
    }
    let mut up = Up::new();
    let v2 = fs::metadata(&builds().v2).expect("v2").len();
    let exe = fs::metadata(up.exe()).expect("exe").len();
    // Room for the binary, the download and the agent's margin, and a little more.
    let disk = SmallDisk::mount(&up, exe + v2 + 24 * 1024 * 1024);
    let gate = Arc::new(Gate::default());
    let proxy = Proxy::start(
        &up.hub().listen,
        4 * 1024 * 1024,
        AtLimit::Hold(gate.clone()),
    );
    up.url = proxy.url.clone();
    up.start_agent();
    up.release(V2, &builds().v2);
    up.want(V2);
    // The download is under way and held: fill the disk behind its back, then let the
    // rest of the body come.
    wait_for(LIMIT, "the download held at the proxy", || {
        (proxy.reached.load(Ordering::SeqCst) >= 1).then_some(())
    });
    let filler = up.bin_dir().join("filler");
    {
        let mut f = fs::File::create(&filler).expect("filler");
        let block = vec![0u8; 1024 * 1024];
        while f.write_all(&block).is_ok() {}
    }
    gate.open();
    let u = up.wait_upgrade("failed");
    assert!(
        u["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not enough space"),
        "{u}"
    );
    fs::remove_file(&filler).expect("remove filler");
    up.assert_running(&builds().v1_version);
    assert_eq!(
        up.bin_entries(),
        ["railgrid"],
        "the partial download is gone"
    );
    assert_eq!(sha256_hex(&up.exe()), sha256_hex(&builds().v1));
    up.kill_everything();
    drop(disk);
}

/// Replaces the agent's executable as a package manager does: a new file renamed over.
fn replace_by_hand(up: &Up, with: &Path) {
    let tmp = up.bin_dir().join(".railgrid.new");
    fs::copy(with, &tmp).expect("copy");
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::rename(&tmp, up.exe()).expect("rename");
}

#[test]
fn a_binary_replaced_by_hand_is_test_run_and_taken_in_lockstep() {
    let mut up = Up::new();
    up.start_agent();
    let old = sha256_hex(&up.exe());
    // A job runs: the agent drains, and takes the new file once the job is done.
    let marks = super::hub_jobs::marks_dir(&up.host);
    let gate = marks.join("go");
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done", gate.display());
    up.hub().admin_ok(&[
        "job", "submit", "--agent", "a1", "--id", "busy", "--", "sh", "-c", &script,
    ]);
    wait_for(LIMIT, "the job running", || {
        (up.hub().admin_json(&["job", "status", "busy"])["state"] == "running").then_some(())
    });
    replace_by_hand(&up, &builds().v2);
    let replaced = Instant::now();
    let u = up.wait_upgrade("draining");
    assert_eq!(u["target"], V2, "{u:#}");
    fs::write(&gate, "").expect("gate");
    up.wait_upgrade("committed");
    let busy = wait_for(LIMIT, "the job done at the hub", || {
        let v = up.hub().admin_json(&["job", "status", "busy"]);
        (v["done"] == true).then_some(v)
    });
    assert_eq!(busy["state"], "succeeded", "{busy:#}");
    eprintln!("replaced by hand, committed {:?} later", replaced.elapsed());
    up.assert_running(V2);
    assert_eq!(sha256_hex(&up.bin_dir().join("railgrid.prev")), old);
    up.assert_clean_bin();
    assert_eq!(up.record()["upgrade"]["kind"], "local");
}

#[test]
fn a_replaced_binary_that_fails_its_test_run_is_not_run_and_the_runner_keeps_the_pinned_bytes() {
    let mut up = Up::new();
    up.start_agent();
    let garbage = up.path("garbage");
    fs::write(&garbage, vec![0u8; 4096]).expect("garbage");
    replace_by_hand(&up, &garbage);
    let u = up.wait_upgrade("refused");
    assert!(
        u["error"].as_str().unwrap_or_default().contains("test run"),
        "{u}"
    );
    // A runner restart launches from the pinned bytes, not from the garbage.
    let st = up.status();
    let runner = st["runner"]["pid"].as_i64().expect("runner") as i32;
    kill(Pid::from_raw(runner), Signal::SIGKILL).expect("kill runner");
    let st = up.wait_agent("a new runner", |st| {
        st["runner"]["state"] == "running" && st["runner"]["pid"].as_i64() != Some(runner as i64)
    });
    let health = wait_for(LIMIT, "the new runner's health", || {
        let (code, body) = get(&up.host.socket(), "/v1/health")?;
        let v: Value = serde_json::from_str(&body).ok()?;
        (code == 200 && v["pid"] == st["runner"]["pid"]).then_some(v)
    });
    assert_eq!(health["version"], builds().v1_version.as_str());
    assert_eq!(st["version"], builds().v1_version.as_str());
    assert!(!up.bin_dir().join("railgrid.prev").exists());
}

#[test]
fn a_binary_replaced_by_hand_that_crashes_at_start_is_rolled_back() {
    let mut up = Up::new();
    up.start_agent();
    let crash = script(up.dir.path(), "crash", "99.0.5", "exit 3");
    replace_by_hand(&up, &crash);
    assert_rolled_back_as(&up, "99.0.5", "exited before it committed", false);
}

#[test]
fn a_watcher_that_dies_during_the_commit_window_is_started_again_from_the_previous_binary() {
    let mut up = Up::new();
    up.start_agent();
    up.release(V2, &builds().v2);
    up.want(V2);
    // Held in the commit window: no answer from the hub counts until it is back.
    let first = wait_for(LIMIT, "the new agent waiting to commit", || {
        let rec = up.record();
        let pid = rec["upgrade"]["watcher_pid"].as_i64()?;
        (rec["upgrade"]["phase"] == "pending").then_some(pid as i32)
    });
    kill(Pid::from_raw(first), Signal::SIGKILL).expect("kill the watcher");
    let second = wait_for(LIMIT, "another watcher", || {
        let pid = up.record()["upgrade"]["watcher_pid"].as_i64()? as i32;
        (pid != first && alive(pid)).then_some(pid)
    });
    let exe = fs::read_link(format!("/proc/{second}/exe")).expect("watcher exe");
    assert!(
        exe.to_string_lossy().contains("railgrid.prev"),
        "the watcher runs the previous binary: {}",
        exe.display()
    );
    up.wait_upgrade("committed");
    wait_for(LIMIT, "the second watcher exits", || {
        (!alive(second)).then_some(())
    });
    up.assert_running(V2);
    up.assert_clean_bin();
}

#[test]
fn an_agent_stopped_during_the_switch_puts_the_previous_binary_back_and_exits() {
    let mut up = Up::new();
    up.start_agent();
    let pid = up.status()["pid"].as_i64().expect("pid") as i32;
    up.release(V2, &builds().v2);
    up.want(V2);
    wait_for(LIMIT, "the switch", || {
        (up.record()["upgrade"]["phase"] == "pending").then_some(())
    });
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM");
    let out = up.agent.take().expect("agent").wait_output(LIMIT);
    assert!(out.status.success(), "a clean stop: {:?}", out.status);
    let rec = up.record();
    assert_eq!(rec["upgrade"]["phase"], "aborted", "{rec}");
    assert_eq!(
        rec["bad_versions"],
        serde_json::json!([]),
        "not the version's fault"
    );
    assert_eq!(
        sha256_hex(&up.exe()),
        sha256_hex(&builds().v1),
        "the previous binary is back"
    );
    let watcher = rec["upgrade"]["watcher_pid"].as_i64().expect("watcher") as i32;
    wait_for(LIMIT, "the watcher exits", || {
        (!alive(watcher)).then_some(())
    });
    assert!(!alive(pid), "the agent stayed stopped");
    assert_eq!(up.bin_entries(), ["railgrid"]);
    // Started again, it reports why and takes the upgrade.
    up.start_agent();
    up.wait_upgrade("committed");
    up.assert_running(V2);
}

#[test]
fn a_new_binary_changed_in_place_before_the_re_exec_is_never_run() {
    let mut up = Up::new();
    let pid = freeze_between_rename_and_re_exec(&mut up);
    // Written into the very file that was verified (not renamed over it).
    let marker = up.path("ran");
    let evil = format!(
        "#!/bin/sh\necho ran > {}\nexec {} \"$@\"\n",
        marker.display(),
        builds().v2.display()
    );
    fs::write(up.exe(), evil).expect("overwrite in place");
    kill(Pid::from_raw(pid), Signal::SIGCONT).expect("SIGCONT");
    let out = up.agent.take().expect("agent").wait_output(LIMIT);
    assert!(
        !out.status.success(),
        "the agent refuses to re-execute: {:?} {}",
        out.status,
        read_lossy(&up.path("agent.stderr"))
    );
    assert!(!marker.exists(), "the changed bytes never ran");
    let rec = up.record();
    assert_eq!(rec["upgrade"]["phase"], "aborted", "{rec}");
    assert_eq!(
        sha256_hex(&up.exe()),
        sha256_hex(&builds().v1),
        "the previous binary is back"
    );
    assert_eq!(up.bin_entries(), ["railgrid"]);
    let log = read_lossy(&up.path("agent.stderr"));
    assert!(log.contains("changed after it was verified"), "{log}");
}

/// Asks for V2, and stops the hub once the switch is under way: (its listen address,
/// its data dir).
fn hub_gone_after_the_switch(up: &mut Up) -> (String, PathBuf) {
    up.start_agent();
    up.release(V2, &builds().v2);
    up.want(V2);
    wait_for(LIMIT, "the switch", || {
        (up.record()["upgrade"]["phase"] == "pending").then_some(())
    });
    let hub = up.hub.take().expect("hub");
    let (listen, dir) = (hub.listen.clone(), hub.dir.clone());
    hub.stop();
    // The new agent runs, healthy, and cannot reach its hub: it waits, it does not fail.
    up.wait_agent("the new agent healthy without its hub", |st| {
        st["version"] == V2
            && st["runner"]["state"] == "running"
            && st["upgrade"]["state"] == "pending_commit"
            && st["hub"]["last_error"].is_string()
    });
    (listen, dir)
}

#[test]
fn a_hub_down_past_the_deadline_delays_the_commit_and_fails_nothing() {
    let mut up = Up::new();
    let (listen, dir) = hub_gone_after_the_switch(&mut up);
    // Past the commit deadline (10 s here): healthy on the host, waiting for the hub.
    let deadline = up.record()["upgrade"]["deadline"]
        .as_u64()
        .expect("deadline");
    wait_for(Duration::from_secs(30), "the deadline passed", || {
        (crate::support::unix_now() > deadline + 2).then_some(())
    });
    let rec = up.record();
    assert_eq!(rec["upgrade"]["phase"], "pending", "{rec}");
    assert!(rec["upgrade"]["healthy_at"].is_u64(), "{rec}");
    assert!(
        read_lossy(&up.host.path("logs/upgrade-watch.log"))
            .contains("waiting for the hub past the deadline"),
        "the watcher says why it waits"
    );
    let back = crate::support::unix_now();
    up.hub = Some(TestHub::start_on(
        &dir,
        &listen,
        &["--release-key", &path_str(&up.key.public)],
    ));
    up.wait_upgrade("committed");
    let rec = up.record();
    assert!(
        rec["upgrade"]["finished_at"].as_u64().expect("finished_at") >= back,
        "committed only once the hub answered: {rec}"
    );
    up.assert_running(V2);
    up.assert_clean_bin();
    assert_eq!(up.releases()[0]["halted"], Value::Null);
}

#[test]
fn a_hub_away_past_its_bound_rolls_back_without_blame_and_halts_nothing() {
    let mut up = Up::new();
    up.env.push(("RAILGRID_UPGRADE_HUB_WAIT", "3s"));
    let (listen, dir) = hub_gone_after_the_switch(&mut up);
    let rec = wait_for(LIMIT, "the upgrade ended", || {
        let rec = up.record();
        (rec["upgrade"]["phase"] != "pending").then_some(rec)
    });
    assert_eq!(rec["upgrade"]["phase"], "aborted", "{rec}");
    assert!(
        rec["upgrade"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("rolled back without blame"),
        "{rec}"
    );
    up.assert_running(&builds().v1_version);
    assert_eq!(sha256_hex(&up.exe()), sha256_hex(&builds().v1));
    let rec = up.record();
    assert_eq!(
        rec["bad_versions"],
        serde_json::json!([]),
        "not remembered as bad: {rec}"
    );
    // The hub back once the restored agent's own proof window has passed (it gave the
    // hub 15 s to answer it, which would have blamed the version after all).
    let finished = rec["upgrade"]["finished_at"].as_u64().expect("finished_at");
    wait_for(Duration::from_secs(30), "the proof window passed", || {
        (crate::support::unix_now() > finished + 16).then_some(())
    });
    // It hears of a failure, not of a rollback, and halts nothing.
    up.hub = Some(TestHub::start_on(
        &dir,
        &listen,
        &["--release-key", &path_str(&up.key.public)],
    ));
    // It hears of a failure, or already of the upgrade tried again, never of a rollback.
    let seen = wait_for(LIMIT, "the agent's report at the hub", || {
        let v = up.hub_agent();
        v["connected"].as_bool()?.then_some(())?;
        v["report"]["upgrade"]["state"].as_str().map(str::to_owned)
    });
    assert_ne!(seen, "rolled_back");
    let rel = up.releases();
    assert_eq!(rel[0]["version"], V2, "{rel}");
    assert_eq!(rel[0]["halted"], Value::Null, "{rel}");
}

/// The other side of a rollback without blame: the restored, previous binary reaches the
/// hub at once, so the hub was not what kept the new version from it. The version is
/// blamed after all (remembered as bad, reported rolled back, halted), and not retried.
#[test]
fn a_rollback_without_blame_is_blamed_when_the_previous_binary_reaches_the_hub_at_once() {
    let mut up = Up::new();
    up.env.push(("RAILGRID_UPGRADE_HUB_WAIT", "3s"));
    let (listen, dir) = hub_gone_after_the_switch(&mut up);
    wait_for(LIMIT, "the rollback without blame", || {
        (up.record()["upgrade"]["phase"] == "aborted").then_some(())
    });
    up.hub = Some(TestHub::start_on(
        &dir,
        &listen,
        &["--release-key", &path_str(&up.key.public)],
    ));
    let u = up.wait_upgrade("rolled_back");
    assert!(
        u["error"]
            .as_str()
            .unwrap_or_default()
            .contains("was at fault"),
        "{u}"
    );
    let rec = up.record();
    assert_eq!(rec["upgrade"]["phase"], "rolled_back", "{rec}");
    assert_eq!(rec["bad_versions"][0]["version"], V2, "{rec}");
    up.hub_upgrade("rolled_back");
    let rel = up.releases();
    assert_eq!(rel[0]["halted"]["agent"], "a1", "{rel}");
    up.assert_running(&builds().v1_version);
}
