//! `railgrid agent run` and `railgrid runner run`: the agent/runner pair on one host with no
//! hub, against real processes, sockets and files.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use sha2::Digest;

use crate::support::*;

pub const LIMIT: Duration = Duration::from_secs(20);

/// A temp dir the runner account can traverse, holding state, logs and an empty config.
pub struct Host {
    dir: tempfile::TempDir,
}

/// A root agent outside a service manager makes a cgroup of its own, named after its state
/// dir, and removes it when it stops; one killed with -9 leaves it: the host removes it
/// (whatever is left inside is killed).
impl Drop for Host {
    fn drop(&mut self) {
        if let Some(own) = own_cgroup(&self.state()) {
            if own.exists() {
                let _ = fs::write(own.join("cgroup.kill"), "1");
                remove_cgroup_tree(&own);
            }
        }
    }
}

/// The cgroup a root agent on `state` makes for itself: `<v2 hierarchy>/railgrid-agent.<hash>`.
pub fn own_cgroup(state: &Path) -> Option<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })?;
    let digest = sha2::Sha256::digest(state.as_os_str().as_encoded_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    Some(mount.join(format!("railgrid-agent.{hex}")))
}

impl Host {
    pub fn new() -> Self {
        let dir = tempdir();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        fs::write(dir.path().join("agent.toml"), "").expect("config");
        Self { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn state(&self) -> PathBuf {
        self.path("state")
    }

    pub fn socket(&self) -> PathBuf {
        self.state().join("runner/runner.sock")
    }

    pub fn agent_cmd(&self, extra: &[&str]) -> Command {
        self.agent_cmd_from(Path::new(BIN), extra)
    }

    /// `agent run` of the binary at `program`.
    pub fn agent_cmd_from(&self, program: &Path, extra: &[&str]) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("RAILGRID_LOG", "info");
        cmd.args(["agent", "run", "--config"])
            .arg(self.path("agent.toml"))
            .arg("--state-dir")
            .arg(self.state())
            .arg("--log-dir")
            .arg(self.path("logs"));
        if is_root() {
            cmd.args(["--runner-user", "nobody"]);
        }
        cmd.args(extra)
            .env("RAILGRID_RUNNER_INITIAL_BACKOFF", "100ms")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    }

    pub fn start_agent(&self) -> Guard {
        Guard::new(self.agent_cmd(&[]).spawn().expect("spawn agent"))
    }

    /// An agent started with `env` set, once its runner runs.
    pub fn start_agent_with(&self, env: &[(&str, &str)]) -> Guard {
        let agent = Guard::new(
            self.agent_cmd(&[])
                .envs(env.iter().copied())
                .spawn()
                .expect("spawn agent"),
        );
        self.wait_runner("a runner", |_| true);
        agent
    }

    pub fn status(&self) -> Value {
        let text = fs::read_to_string(self.state().join("agent-status.json")).unwrap_or_default();
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// Waits until the status file reports a running runner whose health answers, and
    /// returns its pid.
    pub fn wait_runner(&self, what: &str, accept: impl Fn(&Value) -> bool) -> i32 {
        wait_for(LIMIT, what, || {
            let st = self.status();
            let pid = st["runner"]["pid"].as_i64()? as i32;
            if st["runner"]["state"] != "running" || !accept(&st) {
                return None;
            }
            let health = get_json(&self.socket(), "/v1/health")?;
            (health["pid"].as_i64()? as i32 == pid).then_some(pid)
        })
    }

    /// Runs `agent run` on `state` with `extra`, which must refuse (exit 2); its stderr.
    fn refused_start(&self, state: &Path, extra: &[&str]) -> String {
        let out = railgrid()
            .args(["agent", "run", "--config"])
            .arg(self.path("agent.toml"))
            .arg("--state-dir")
            .arg(state)
            .arg("--log-dir")
            .arg(self.path("logs"))
            .args(extra)
            .output()
            .expect("agent run");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{err}");
        err
    }

    pub fn agent_log(&self) -> String {
        let mut text = String::new();
        for entry in fs::read_dir(self.path("logs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("agent") {
                text.push_str(&read_lossy(&entry.path()));
            }
        }
        text
    }
}

fn get_json(socket: &Path, path: &str) -> Option<Value> {
    let (status, body) = get(socket, path)?;
    (status == 200)
        .then(|| serde_json::from_str(&body).ok())
        .flatten()
}

/// A refused start made nothing in `dir`.
fn assert_empty(dir: &Path) {
    assert!(
        fs::read_dir(dir).expect("read_dir").next().is_none(),
        "a refused start made files in {}",
        dir.display()
    );
}

fn sigkill(pid: i32) {
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill -9");
}

#[test]
fn the_agent_starts_the_runner_and_health_answers() {
    let host = Host::new();
    let _agent = host.start_agent();
    let pid = host.wait_runner("a healthy runner", |_| true);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(health["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(health["jobs_running"], 0);
    assert!(health["uptime_secs"].is_u64());

    let mode = fs::metadata(host.socket())
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "socket mode");
    let runner_dir = fs::metadata(host.state().join("runner")).expect("runner dir");
    assert_eq!(runner_dir.permissions().mode() & 0o777, 0o700);
    if is_root() {
        let nobody = uzers::get_user_by_name("nobody").expect("nobody");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            runner_dir.uid(),
            nobody.uid(),
            "runner dir owned by the runner user"
        );
        let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
        let uid_line = status.lines().find(|l| l.starts_with("Uid:")).expect("Uid");
        assert!(
            uid_line
                .split_whitespace()
                .skip(1)
                .all(|u| u == nobody.uid().to_string()),
            "{uid_line}"
        );
    }

    let out = railgrid()
        .args(["agent", "status", "--json", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("status");
    assert!(out.status.success(), "{out:?}");
    let st: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(st["runner"]["pid"], pid);
    let out = railgrid()
        .args(["agent", "status", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("agent:      running") && text.contains(&format!("pid {pid}")),
        "{text}"
    );
}

#[test]
fn a_killed_runner_is_restarted_and_the_status_says_why() {
    let host = Host::new();
    let _agent = host.start_agent();
    let first = host.wait_runner("the first runner", |_| true);
    sigkill(first);
    let second = host.wait_runner("a restarted runner", |st| st["runner"]["starts"] == 2);
    assert_ne!(first, second);
    let st = host.status();
    let err = st["runner"]["last_error"].as_str().expect("last_error");
    assert!(err.contains("signal 9"), "{err}");
}

#[test]
fn an_orphan_runner_of_a_killed_agent_is_reclaimed() {
    let host = Host::new();
    let mut first_agent = host.start_agent();
    let orphan = host.wait_runner("the first runner", |_| true);
    sigkill(first_agent.pid());
    let _ = first_agent.wait_output(LIMIT);
    assert!(alive(orphan), "the runner should outlive a SIGKILLed agent");

    let _agent = host.start_agent();
    let runner = host.wait_runner("a runner of the new agent", |st| {
        st["reclaimed_pids"]
            .as_array()
            .is_some_and(|a| a.iter().any(|p| p == orphan))
    });
    assert_ne!(runner, orphan);
    assert!(!alive(orphan), "orphan runner {orphan} survived");
    // Exactly one runner holds the lock: the new one.
    let lock = fs::read_to_string(host.state().join("runner/runner.lock")).expect("lock");
    assert_eq!(lock.trim(), runner.to_string());
    let out = railgrid()
        .args(["agent", "status", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("status");
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains(&format!("reclaimed orphan runners: {orphan}")));
}

#[test]
fn sigterm_stops_the_runner_and_exits_zero() {
    let host = Host::new();
    let mut agent = host.start_agent();
    let runner = host.wait_runner("a runner", |_| true);
    agent.signal(Signal::SIGTERM);
    // Within the default 10 s stop grace, plus a margin.
    let out = agent.wait_output(Duration::from_secs(10) + Duration::from_secs(10));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!alive(runner), "runner {runner} survived the agent");
    assert!(live_in_group(runner).is_empty());
    assert!(!host.socket().exists(), "the socket was left behind");
    assert_eq!(host.status()["running"], false);
    let out = railgrid()
        .args(["agent", "status", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("status");
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent not running"));
}

#[test]
fn agent_secrets_never_reach_the_runner() {
    // The runner is non-dumpable: only root may read its environment.
    if !requires_root("reading the runner's /proc/<pid>/environ needs root") {
        return;
    }
    let host = Host::new();
    let child = host
        .agent_cmd(&[])
        .env("RAILGRID_HUB_TOKEN", "secret-hub-token")
        .env("AWS_SECRET_ACCESS_KEY", "secret-aws-key")
        .spawn()
        .expect("spawn");
    let _agent = Guard::new(child);
    let runner = host.wait_runner("a runner", |_| true);
    let environ = fs::read(format!("/proc/{runner}/environ")).expect("environ");
    let environ = String::from_utf8_lossy(&environ);
    assert!(
        !environ.contains("RAILGRID_HUB_TOKEN") && !environ.contains("secret"),
        "{environ}"
    );
    assert!(!environ.contains("AWS_SECRET_ACCESS_KEY"), "{environ}");
    let mut names: Vec<&str> = environ
        .split('\0')
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["HOME", "LOGNAME", "PATH", "USER"]);
}

#[test]
fn the_runner_log_is_private_and_capped() {
    let host = Host::new();
    let cap = 1024u64;
    let child = host
        .agent_cmd(&[])
        .env("RAILGRID_RUNNER_MAX_LOG_BYTES", cap.to_string())
        .env("RAILGRID_RUNNER_INITIAL_BACKOFF", "10ms")
        .spawn()
        .expect("spawn");
    let _agent = Guard::new(child);
    let log = host.path("logs/runner.log");
    // Each runner start logs a few lines: enough restarts rotate the log.
    for n in 1..=6 {
        let pid = host.wait_runner("a runner", |st| st["runner"]["starts"] == n);
        sigkill(pid);
    }
    host.wait_runner("the last runner", |st| st["runner"]["starts"] == 7);
    assert!(
        host.path("logs/runner.log.1").exists(),
        "six restarts should have rotated the log"
    );
    for p in [log.clone(), host.path("logs/runner.log.1")] {
        let meta = fs::metadata(&p).expect("log");
        assert!(
            meta.len() <= cap,
            "{} holds {} bytes, cap {cap}",
            p.display(),
            meta.len()
        );
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }
    assert!(
        read_lossy(&log).contains("runner serving"),
        "{}",
        read_lossy(&log)
    );
}

#[test]
fn a_second_runner_on_a_held_lock_fails_naming_the_holder() {
    let host = Host::new();
    let _agent = host.start_agent();
    let runner = host.wait_runner("a runner", |_| true);
    let mut cmd = railgrid();
    cmd.args(["runner", "run", "--state-dir"]).arg(host.state());
    if is_root() {
        let nobody = uzers::get_user_by_name("nobody").expect("nobody");
        cmd.uid(nobody.uid())
            .gid(nobody.primary_group_id())
            .env_clear();
    }
    let out = cmd.output().expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("another runner (pid {runner}) holds")),
        "{err}"
    );
    // The running runner is untouched.
    assert_eq!(
        get_json(&host.socket(), "/v1/health").expect("health")["pid"],
        runner
    );
}

#[test]
fn the_runner_refuses_root() {
    if !requires_root("needs root") {
        return;
    }
    let host = Host::new();
    let out = railgrid()
        .args(["runner", "run", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to run the runner as root"));
}

fn agent_fails(host: &Host, extra: &[&str]) -> String {
    // The file alone decides: no environment override may mask a bad value.
    let child = host
        .agent_cmd(extra)
        .env_remove("RAILGRID_RUNNER_INITIAL_BACKOFF")
        .spawn()
        .expect("spawn");
    let out = Guard::new(child).wait_output(LIMIT);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "expected exit 2 for {extra:?}: {err}"
    );
    err
}

#[test]
fn configuration_errors_exit_2_naming_file_and_key() {
    let host = Host::new();
    let config = host.path("agent.toml");
    let config_s = config.display().to_string();

    fs::write(&config, "[runner]\nstop_grace = \"10s\"\nbogus_key = 1\n").expect("write");
    let err = agent_fails(&host, &[]);
    assert!(
        err.contains(&config_s) && err.contains("bogus_key"),
        "{err}"
    );

    fs::write(&config, "[runner]\ninitial_backoff = \"a while\"\n").expect("write");
    let err = agent_fails(&host, &[]);
    assert!(
        err.contains(&config_s) && err.contains("runner.initial_backoff") && err.contains("250ms"),
        "{err}"
    );

    fs::write(&config, "").expect("write");
    let token = host.path("token");
    fs::write(&token, "t0ken").expect("token");
    fs::set_permissions(&token, fs::Permissions::from_mode(0o644)).expect("chmod");
    let token_s = token.display().to_string();
    let err = agent_fails(
        &host,
        &["--hub", "https://hub.invalid", "--token-file", &token_s],
    );
    assert!(
        err.contains(&token_s) && err.contains("readable by group or others"),
        "{err}"
    );
    assert!(
        !err.contains("t0ken"),
        "the token leaked into an error: {err}"
    );

    if is_root() {
        let out = railgrid()
            .args(["agent", "run", "--config", &config_s, "--state-dir"])
            .arg(host.state())
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("set runner.user (e.g. --runner-user nobody)"),
            "{err}"
        );
    } else {
        eprintln!("SKIPPED part: root without runner.user (needs root)");
    }
    assert!(
        !host.state().join("runner").exists(),
        "nothing is created before validation"
    );

    let out = railgrid()
        .args([
            "agent",
            "check-config",
            "--config",
            &config_s,
            "--state-dir",
            "/srv/rg",
            "--runner-user",
            "nobody",
        ])
        .output()
        .expect("check");
    if is_root() {
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("state_dir = \"/srv/rg\"") && text.contains("user = \"nobody\""),
            "{text}"
        );
    }
}

/// `agent reload` (SIGHUP, then the agent's word in its status file): it returns once the
/// reload is over, so what it says is already true when it returns.
fn reload(host: &Host) -> std::process::Output {
    railgrid()
        .args(["agent", "reload", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("agent reload")
}

#[test]
fn a_reload_keeps_the_running_config_when_the_new_one_is_broken() {
    let host = Host::new();
    let config = host.path("agent.toml");
    fs::write(&config, "[runner]\nstop_grace = \"3s\"\n").expect("write");
    let agent = host.start_agent();
    let runner = host.wait_runner("a runner", |_| true);

    fs::write(
        &config,
        "[runner]\nstop_grace = \"3 fortnights and a bit\"\n",
    )
    .expect("write");
    let out = reload(&host);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("refused the new configuration") && err.contains("runner.stop_grace"),
        "{err}"
    );
    assert!(
        host.agent_log().contains("keeping the running one"),
        "{}",
        host.agent_log()
    );
    assert_eq!(
        get_json(&host.socket(), "/v1/health").expect("health")["pid"],
        runner
    );
    let st = host.status();
    assert_eq!(st["runner"]["starts"], 1);
    assert_eq!(st["reloads"]["count"], 1, "{st}");

    // A valid change of the runner's settings restarts it, before the reload returns.
    fs::write(&config, "[runner]\nstop_grace = \"4s\"\n").expect("write");
    let out = reload(&host);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let st = host.status();
    assert_eq!(st["runner"]["starts"], 2, "{st}");
    assert_eq!(st["reloads"]["count"], 2, "{st}");
    assert_eq!(st["reloads"]["last_error"], serde_json::Value::Null, "{st}");
    assert_ne!(st["runner"]["pid"], runner, "{st}");
    assert!(!alive(runner));

    // No agent: exit 3, and a pid that is not the agent's is refused.
    let out = railgrid()
        .args(["agent", "reload", "--pid", "1", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("reload");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not signalling either"),
        "{out:?}"
    );
    drop(agent);
    let out = railgrid()
        .args(["agent", "reload", "--state-dir"])
        .arg(host.path("nowhere"))
        .output()
        .expect("reload");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

#[test]
fn systemd_notifications_bracket_the_runner() {
    let host = Host::new();
    let sock_path = host.path("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind");
    fs::set_permissions(&sock_path, fs::Permissions::from_mode(0o600)).expect("chmod");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let child = host
        .agent_cmd(&[])
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "200000")
        .spawn()
        .expect("spawn");
    let mut agent = Guard::new(child);

    let mut seen = Vec::new();
    let recv_until = |want: &str, seen: &mut Vec<String>| {
        wait_for(LIMIT, want, || {
            let mut buf = [0u8; 4096];
            if let Ok(n) = sock.recv(&mut buf) {
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
            seen.iter().any(|m| m.contains(want)).then_some(())
        })
    };
    recv_until("READY=1", &mut seen);
    // READY=1 came once the runner was started: it is there now.
    let st = host.status();
    let runner = st["runner"]["pid"]
        .as_i64()
        .expect("runner pid after READY=1") as i32;
    assert!(alive(runner));
    assert!(seen.iter().any(|m| m.starts_with("STATUS=")), "{seen:?}");
    // The main loop pings the watchdog at half of WATCHDOG_USEC.
    recv_until("WATCHDOG=1", &mut seen);

    // A reload: RELOADING=1, then READY=1 again once it is over.
    assert_eq!(reload(&host).status.code(), Some(0));
    recv_until("RELOADING=1", &mut seen);
    let reloading = seen
        .iter()
        .position(|m| m.contains("RELOADING=1"))
        .expect("reloading");
    assert!(seen[reloading].contains("MONOTONIC_USEC="), "{seen:?}");
    wait_for(LIMIT, "READY=1 after the reload", || {
        let mut buf = [0u8; 4096];
        if let Ok(n) = sock.recv(&mut buf) {
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        seen[reloading..]
            .iter()
            .any(|m| m.contains("READY=1"))
            .then_some(())
    });

    agent.signal(Signal::SIGTERM);
    recv_until("STOPPING=1", &mut seen);
    let out = agent.wait_output(LIMIT);
    assert_eq!(out.status.code(), Some(0));
    let ready = seen
        .iter()
        .position(|m| m.contains("READY=1"))
        .expect("ready");
    let stopping = seen
        .iter()
        .position(|m| m.contains("STOPPING=1"))
        .expect("stopping");
    assert!(ready < stopping, "{seen:?}");
}

#[test]
fn a_runner_dir_of_another_account_is_refused_not_reowned() {
    if !is_root() || uzers::get_user_by_name("daemon").is_none() {
        eprintln!("SKIPPED: needs root and the daemon account");
        return;
    }
    let host = Host::new();
    let mut agent = host.start_agent();
    host.wait_runner("a runner as nobody", |_| true);
    agent.signal(Signal::SIGTERM);
    assert_eq!(agent.wait_output(LIMIT).status.code(), Some(0));

    let out = railgrid()
        .args(["agent", "run", "--config"])
        .arg(host.path("agent.toml"))
        .arg("--state-dir")
        .arg(host.state())
        .arg("--log-dir")
        .arg(host.path("logs"))
        .args(["--runner-user", "daemon"])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&host.state().join("runner").display().to_string()) && err.contains("daemon"),
        "{err}"
    );
}

#[test]
fn job_limits_in_the_agent_config_reach_the_runner() {
    let host = Host::new();
    fs::write(
        host.path("agent.toml"),
        "[runner]\nmax_jobs = 1\nmax_queued = 1\n",
    )
    .expect("config");
    let _agent = host.start_agent();
    host.wait_runner("a runner", |_| true);
    let spec = |id: &str| format!(r#"{{"id":"{id}","argv":["sleep","1000"]}}"#);
    let socket = host.socket();
    assert_eq!(
        http(&socket, "POST", "/v1/jobs", Some(&spec("a")))
            .expect("post")
            .0,
        201
    );
    assert_eq!(
        http(&socket, "POST", "/v1/jobs", Some(&spec("b")))
            .expect("post")
            .0,
        201
    );
    wait_for(LIMIT, "job a to run", || {
        (get_json(&socket, "/v1/jobs/a")?["state"] == "running").then_some(())
    });
    // One running, one queued: the queue is full at 1.
    assert_eq!(
        get_json(&socket, "/v1/jobs/b").expect("b")["state"],
        "queued"
    );
    assert_eq!(
        http(&socket, "POST", "/v1/jobs", Some(&spec("c")))
            .expect("post")
            .0,
        429
    );
}

#[test]
fn a_delegated_agent_gives_its_runner_a_cgroup_and_jobs_get_the_cgroup_tier() {
    let Some(cg) = DelegatedCgroup::new("agent", None) else {
        return;
    };
    let host = Host::new();
    let cmd = host.agent_cmd(&[]);
    let mut cmd = in_cgroup(&cmd, &cg.dir, None);
    cmd.env("RAILGRID_RUNNER_DELEGATE_CGROUP", "true")
        .env("RAILGRID_RUNNER_INITIAL_BACKOFF", "100ms")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let agent = Guard::new(cmd.spawn().expect("spawn agent"));
    let runner = host.wait_runner("a healthy runner", |_| true);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(health["confinement"], "cgroup", "{health}");
    // The agent moved into its leaf; the runner started in its own, in the delegated tree.
    assert_eq!(cg.procs("agent"), [agent.pid()]);
    assert_eq!(cg.procs("runner/runner"), [runner]);
    assert!(cg.procs("").is_empty());
    if let Some(nobody) = uzers::get_user_by_name("nobody") {
        use std::os::unix::fs::MetadataExt;
        let meta = fs::metadata(cg.dir.join("runner/cgroup.procs")).expect("tree");
        assert_eq!(
            meta.uid(),
            nobody.uid(),
            "the runner's tree is delegated to it"
        );
    }

    // A runner killed and restarted by the agent goes back into its leaf.
    sigkill(runner);
    let again = host.wait_runner("a restarted runner", |st| st["runner"]["pid"] != runner);
    assert_eq!(cg.procs("runner/runner"), [again]);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(health["confinement"], "cgroup", "{health}");
}

/// Outside a service manager (this test's process is in the hierarchy's root cgroup), a
/// root agent makes a cgroup of its own: jobs get the cgroup tier, so a job's setsid and
/// setpgid children end with it; the agent removes the cgroup when it stops.
#[test]
fn a_root_agent_without_a_service_manager_gives_its_jobs_a_cgroup_nothing_escapes() {
    if !requires_root("a cgroup of the agent's own needs root") {
        return;
    }
    let in_root =
        fs::read_to_string("/proc/self/cgroup").is_ok_and(|t| t.lines().any(|l| l == "0::/"));
    let host = Host::new();
    let Some(own) = own_cgroup(&host.state()).filter(|_| in_root) else {
        eprintln!("SKIPPED: this test must run in the root cgroup of a cgroup v2 hierarchy");
        return;
    };
    let mut agent = host.start_agent();
    let runner = host.wait_runner("a runner", |_| true);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(health["confinement"], "cgroup", "{health}");
    assert!(own.join("runner/runner").exists(), "{}", own.display());
    let procs = fs::read_to_string(own.join("runner/runner/cgroup.procs")).expect("procs");
    assert_eq!(procs.trim(), runner.to_string());

    // Children that leave the job's process group: a new session, a new group. Each
    // prints its pid.
    let script = "setsid sh -c 'echo $$; exec sleep 300' & \
         perl -e 'setpgrp(0,0); $| = 1; print \"$$\\n\"; sleep 300' & \
         sleep 300";
    let body = serde_json::json!({"id": "escape", "argv": ["sh", "-c", script]}).to_string();
    let (code, reply) = http(&host.socket(), "POST", "/v1/jobs", Some(&body)).expect("submit");
    assert_eq!(code, 201, "{reply}");
    let pids: Vec<i32> = wait_for(LIMIT, "both escapees running", || {
        let (_, out) = get(&host.socket(), "/v1/jobs/escape/output/stdout")?;
        let pids: Vec<i32> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
        (pids.len() == 2).then_some(pids)
    });
    // The job may print before the runner has recorded its pid.
    let leader = wait_for(LIMIT, "the job's pid", || {
        get_json(&host.socket(), "/v1/jobs/escape")?["pid"].as_i64()
    }) as i32;
    for p in &pids {
        let pgid = nix::unistd::getpgid(Some(Pid::from_raw(*p))).expect("pgid");
        assert_ne!(pgid.as_raw(), leader, "{p} left the job's group {leader}");
    }
    http(&host.socket(), "POST", "/v1/jobs/escape/cancel", None).expect("cancel");
    wait_for(LIMIT, "the escapees gone with their job", || {
        pids.iter().all(|p| !alive(*p)).then_some(())
    });

    agent.signal(Signal::SIGTERM);
    let out = agent.wait_output(LIMIT);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !own.exists(),
        "the agent's own cgroup {} is removed",
        own.display()
    );
}

#[test]
fn a_second_agent_on_a_live_state_dir_refuses_and_touches_nothing() {
    let host = Host::new();
    let first = host.start_agent();
    let runner = host.wait_runner("a runner", |_| true);
    let (code, body) = http(
        &host.socket(),
        "POST",
        "/v1/jobs",
        Some(r#"{"id":"keep","argv":["sleep","1000"]}"#),
    )
    .expect("submit");
    assert_eq!(code, 201, "{body}");
    let job_pid = wait_for(LIMIT, "the job running", || {
        let job = get_json(&host.socket(), "/v1/jobs/keep")?;
        (job["state"] == "running").then(|| job["pid"].as_i64())?
    }) as i32;

    let mut second = Guard::new(host.agent_cmd(&[]).spawn().expect("spawn agent"));
    let out = second.wait_output(LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("another agent (pid {})", first.pid())),
        "{err}"
    );
    // Nothing of the first agent's was touched: its runner, its job, its status file.
    assert!(alive(runner), "the first agent's runner was killed");
    assert!(alive(job_pid), "the first agent's job was killed");
    assert_eq!(
        get_json(&host.socket(), "/v1/health").expect("health")["pid"],
        runner
    );
    assert_eq!(
        get_json(&host.socket(), "/v1/jobs/keep").expect("job")["state"],
        "running"
    );
    assert_eq!(host.status()["pid"], first.pid());
    let out = railgrid()
        .args(["agent", "status", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("status");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("running (pid {}", first.pid())));
}

#[test]
fn agent_status_believes_only_the_holder_of_the_agent_lock() {
    if !cfg!(target_os = "linux") {
        eprintln!("SKIPPED: the kernel's lock table is read on Linux only");
        return;
    }
    let host = Host::new();
    let mut agent = host.start_agent();
    let runner = host.wait_runner("a runner", |_| true);
    // The runner outlives a SIGKILLed agent: the guard kills it at the end.
    agent.own_group(runner);
    agent.signal(Signal::SIGKILL);
    let _ = agent.wait_output(LIMIT);
    // A status file that says running, naming a live process that looks like an agent
    // (`agent run` in its command line: a recycled pid) but holds no agent lock.
    let mut impostor = Guard::new(
        Command::new("sh")
            .args(["-c", "sleep 1000", "agent", "run"])
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sh"),
    );
    impostor.own_group(impostor.pid());
    let mut st = host.status();
    st["pid"] = serde_json::json!(impostor.pid());
    st["pid_start_time"] = Value::Null;
    fs::write(host.state().join("agent-status.json"), st.to_string()).expect("write status");
    let out = railgrid()
        .args(["agent", "status", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("status");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

#[test]
fn a_start_the_runner_account_could_not_reach_is_refused_before_anything_is_made() {
    if !requires_root("needs root (a runner account other than the agent's)") {
        return;
    }
    let host = Host::new();
    // The runner account may not pass through this one.
    let closed = host.path("closed");
    fs::create_dir(&closed).expect("mkdir");
    fs::set_permissions(&closed, fs::Permissions::from_mode(0o700)).expect("chmod");
    let state = closed.join("deeper/state");
    let err = host.refused_start(&state, &["--runner-user", "nobody"]);
    assert!(
        err.contains("runner user nobody cannot reach") && err.contains(&path_str(&closed)),
        "{err}"
    );
    assert_empty(&closed);
    assert!(
        !host.path("logs").exists(),
        "a refused start made the log dir"
    );
}

#[test]
fn agent_status_shows_where_things_are_and_json_always_parses() {
    let host = Host::new();
    let status = |json: bool| {
        let mut cmd = railgrid();
        cmd.args(["agent", "status", "--state-dir"])
            .arg(host.state());
        if json {
            cmd.arg("--json");
        }
        cmd.output().expect("agent status")
    };
    // Before any agent ran: still a JSON object.
    let out = status(true);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json before any agent");
    assert_eq!(v["running"], false);

    let mut agent = host.start_agent();
    host.wait_runner("a runner", |_| true);
    let out = status(false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for want in [
        format!("state dir:  {}", host.state().display()),
        format!("log dir:    {}", host.path("logs").display()),
        format!("runner log: {}", host.path("logs/runner.log").display()),
        format!("config:     {}", host.path("agent.toml").display()),
    ] {
        assert!(text.contains(&want), "{want:?} in:\n{text}");
    }
    // What finished jobs keep, from the runner, on a line of its own.
    assert!(
        text.lines()
            .any(|l| l.starts_with("kept:       0 finished jobs")),
        "{text}"
    );
    let v: Value = serde_json::from_slice(&status(true).stdout).expect("json");
    assert_eq!(v["running"], true);
    assert_eq!(v["runner"]["kept"]["finished_jobs"], 0, "{v}");

    agent.signal(Signal::SIGTERM);
    let _ = agent.wait_output(LIMIT);
    let out = status(true);
    assert_eq!(out.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json after the stop");
    assert_eq!(v["running"], false);
}

/// A job whose own process ignores SIGTERM (SIG_IGN survives exec), with a kill grace far
/// longer than any stop may take.
const STUBBORN: &str = r#"{"id":"stubborn","argv":["sh","-c","trap \"\" TERM; echo ready; exec sleep 1000"],"kill_grace_secs":120}"#;

/// Submits [`STUBBORN`], waits until it has set its trap, and returns its pid (the leader
/// of its group), which `guard` kills on drop should the test fail.
fn start_stubborn(host: &Host, guard: &mut Guard) -> i32 {
    let (code, body) = http(&host.socket(), "POST", "/v1/jobs", Some(STUBBORN)).expect("submit");
    assert_eq!(code, 201, "{body}");
    // The job may print before the runner has recorded its pid: wait for both.
    let pid = wait_for(LIMIT, "the stubborn job to be ready", || {
        let (_, out) = get(&host.socket(), "/v1/jobs/stubborn/output/stdout")?;
        let pid = get_json(&host.socket(), "/v1/jobs/stubborn")?["pid"].as_i64()?;
        (out == "ready\n").then_some(pid as i32)
    });
    guard.own_group(pid);
    pid
}

/// The record of the stubborn job, through a new agent's runner.
fn stubborn_record(host: &Host) -> (Guard, Value) {
    let mut agent = host.start_agent();
    host.wait_runner("a runner of a new agent", |_| true);
    let rec = wait_for(LIMIT, "the stubborn job's end", || {
        let rec = get_json(&host.socket(), "/v1/jobs/stubborn")?;
        let state = rec["state"].as_str()?;
        (!matches!(state, "queued" | "starting" | "running")).then_some(rec)
    });
    agent.signal(Signal::SIGTERM);
    let _ = agent.wait_output(LIMIT);
    (agent, rec)
}

#[test]
fn sigterm_ends_every_job_within_the_runner_stop_budget() {
    let host = Host::new();
    let mut agent = host.start_agent_with(&[("RAILGRID_RUNNER_STOP_GRACE", "3s")]);
    let pid = start_stubborn(&host, &mut agent);
    agent.signal(Signal::SIGTERM);
    let out = agent.wait_output(LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        live_in_group(pid).is_empty(),
        "the job's processes outlived the agent"
    );
    let runner_log = read_lossy(&host.path("logs/runner.log"));
    assert!(runner_log.contains("kill grace shortened"), "{runner_log}");

    let (_agent, rec) = stubborn_record(&host);
    assert_ended(&rec, "cancelled", "cut from 2m");
}

#[test]
fn the_agent_reaps_the_jobs_of_a_runner_that_could_not_stop_them() {
    let host = Host::new();
    // The process-group tier, whose only way to end such a job is the reap (in the cgroup
    // tier, `cgroup.kill` ends it first: a_delegated_agent_empties_the_runners_cgroup_tree…).
    let mut agent = Guard::new(
        host.agent_cmd(&[])
            .env("RAILGRID_RUNNER_DELEGATE_CGROUP", "false")
            .env("RAILGRID_RUNNER_STOP_GRACE", "1s")
            .spawn()
            .expect("spawn agent"),
    );
    let runner = host.wait_runner("a runner", |_| true);
    agent.own_group(runner);
    let pid = start_stubborn(&host, &mut agent);
    // A runner that cannot act on SIGTERM: the supervisor SIGKILLs it at stop_grace, and
    // only the agent's reap is left to end the job.
    kill(Pid::from_raw(runner), Signal::SIGSTOP).expect("SIGSTOP the runner");
    agent.signal(Signal::SIGTERM);
    let out = agent.wait_output(LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!alive(runner), "the runner survived");
    assert!(
        live_in_group(pid).is_empty(),
        "the job's processes outlived the agent"
    );
    let reaped = host.status()["reaped"].clone();
    assert!(
        reaped.as_array().is_some_and(|r| r
            .iter()
            .any(|l| l.as_str().is_some_and(|l| l.contains("job stubborn")))),
        "{reaped}"
    );
    let out = railgrid()
        .args(["agent", "status", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("status");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("reaped after the runner stopped: job stubborn"),
        "{out:?}"
    );

    let (_agent, rec) = stubborn_record(&host);
    assert_eq!(rec["state"], "lost", "{rec}");
    assert!(
        rec["error"].as_str().expect("error").contains("reap"),
        "{rec}"
    );
}

#[test]
fn after_a_kill_9_of_agent_and_runner_the_next_runner_serves_at_once() {
    let host = Host::new();
    let mut first = host.start_agent();
    let runner = host.wait_runner("a runner", |_| true);
    first.own_group(runner);
    let pid = start_stubborn(&host, &mut first);
    // As the OOM killer would: both at once, nothing gets to clean up.
    sigkill(first.pid());
    sigkill(runner);
    let _ = first.wait_output(LIMIT);
    wait_for(LIMIT, "the runner to die", || {
        (!alive(runner)).then_some(())
    });
    assert!(alive(pid), "the job outlives agent and runner");

    let mut agent = host.start_agent();
    agent.own_group(pid);
    let new_runner = host.wait_runner("a runner of the new agent", |_| true);
    agent.own_group(new_runner);
    // The leftover ignores SIGTERM and gets 10 s of grace: alive while health answers.
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    let still_alive = alive(pid);
    assert_eq!(health["reconciling"], true, "{health}");
    assert!(
        still_alive,
        "the runner served only after ending the leftover"
    );

    let rec = wait_for(LIMIT, "the leftover to be marked lost", || {
        let rec = get_json(&host.socket(), "/v1/jobs/stubborn")?;
        (rec["state"] == "lost").then_some(rec)
    });
    assert_error(&rec, "process group was killed");
    assert!(live_in_group(pid).is_empty(), "the leftover survived");
    wait_for(LIMIT, "health to say reconciliation is over", || {
        let h = get_json(&host.socket(), "/v1/health")?;
        (h["reconciling"] == false).then_some(())
    });
}

#[test]
fn a_delegated_agent_empties_the_runners_cgroup_tree_when_the_runner_could_not() {
    let Some(cg) = DelegatedCgroup::new("stop", None) else {
        eprintln!("SKIPPED: needs root and a cgroup v2 hierarchy with cgroup.kill");
        return;
    };
    let host = Host::new();
    let mut cmd = in_cgroup(&host.agent_cmd(&[]), &cg.dir, None);
    cmd.env("RAILGRID_RUNNER_DELEGATE_CGROUP", "true")
        .env("RAILGRID_RUNNER_STOP_GRACE", "1s")
        .env("RAILGRID_RUNNER_INITIAL_BACKOFF", "100ms")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut agent = Guard::new(cmd.spawn().expect("spawn agent"));
    let runner = host.wait_runner("a runner", |_| true);
    agent.own_group(runner);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(health["confinement"], "cgroup", "{health}");
    // A job that leaves a process outside its group, and ignores SIGTERM itself.
    let spec = r#"{"id":"escaping","argv":["sh","-c","setsid sh -c 'trap \"\" TERM; echo $$ > escaped.pid; exec sleep 1000' & while [ ! -s escaped.pid ]; do sleep 0.01; done; trap '' TERM; echo ready; exec sleep 1000"],"kill_grace_secs":120}"#;
    let (code, body) = http(&host.socket(), "POST", "/v1/jobs", Some(spec)).expect("submit");
    assert_eq!(code, 201, "{body}");
    wait_for(LIMIT, "the job to be ready", || {
        let (_, out) = get(&host.socket(), "/v1/jobs/escaping/output/stdout")?;
        (out == "ready\n").then_some(())
    });
    let file = host.state().join("runner/work/escaping/escaped.pid");
    let escapee: i32 = fs::read_to_string(file)
        .expect("escaped.pid")
        .trim()
        .parse()
        .expect("pid");
    let pid = wait_for(LIMIT, "the job's pid", || {
        get_json(&host.socket(), "/v1/jobs/escaping")?["pid"].as_i64()
    }) as i32;
    agent.own_group(pid);
    agent.own_group(escapee);

    kill(Pid::from_raw(runner), Signal::SIGSTOP).expect("SIGSTOP the runner");
    agent.signal(Signal::SIGTERM);
    let out = agent.wait_output(LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!alive(escapee), "the escapee outlived the agent");
    assert!(live_in_group(pid).is_empty(), "the job outlived the agent");
    assert!(cg.procs("runner").is_empty());
    let reaped = host.status()["reaped"].to_string();
    assert!(reaped.contains("cgroup.kill"), "{reaped}");
}

#[test]
fn runner_job_path_is_every_jobs_path_unless_the_job_sets_its_own() {
    let host = Host::new();
    fs::write(
        host.path("agent.toml"),
        "[runner]\njob_path = \"/opt/railgrid-test/bin:/usr/bin:/bin\"\n",
    )
    .expect("config");
    let _agent = host.start_agent();
    host.wait_runner("a runner", |_| true);
    let socket = host.socket();
    for (id, env, want) in [
        ("runner-wide", "{}", "/opt/railgrid-test/bin:/usr/bin:/bin"),
        ("own", r#"{"PATH":"/bin"}"#, "/bin"),
    ] {
        let spec = format!(r#"{{"id":"{id}","argv":["sh","-c","echo $PATH"],"env":{env}}}"#);
        let (code, body) = http(&socket, "POST", "/v1/jobs", Some(&spec)).expect("post");
        assert_eq!(code, 201, "{body}");
        wait_for(LIMIT, "the job to end", || {
            (get_json(&socket, &format!("/v1/jobs/{id}"))?["state"] == "succeeded").then_some(())
        });
        let (_, out) = get(&socket, &format!("/v1/jobs/{id}/output/stdout")).expect("output");
        assert_eq!(out.trim(), want);
    }

    // A relative entry is refused, naming the key.
    fs::write(
        host.path("agent.toml"),
        "[runner]\njob_path = \"bin:/usr/bin\"\n",
    )
    .expect("config");
    let out = railgrid()
        .args(["agent", "check-config", "--config"])
        .arg(host.path("agent.toml"))
        .arg("--state-dir")
        .arg(host.state())
        .args(if is_root() {
            vec!["--runner-user", "nobody"]
        } else {
            vec![]
        })
        .output()
        .expect("check-config");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("runner.job_path") && err.contains("not an absolute"),
        "{err}"
    );
}

#[test]
fn the_agent_cannot_be_inspected_by_processes_of_its_own_account() {
    // The agent runs as an ordinary account (nobody when the test is root, else the
    // test's own), and a process of that same account tries to read its environment.
    let host = Host::new();
    let mut cmd = railgrid();
    cmd.args(["agent", "run", "--config"])
        .arg(host.path("agent.toml"))
        .arg("--state-dir")
        .arg(host.state())
        .env("RAILGRID_AGENT_TEST_SECRET", "s3cret")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let as_nobody = |cmd: &mut Command| {
        if is_root() {
            let nobody = uzers::get_user_by_name("nobody").expect("nobody");
            cmd.uid(nobody.uid()).gid(nobody.primary_group_id());
        }
    };
    as_nobody(&mut cmd);
    if is_root() {
        // Sticky, as /tmp: nobody may make its state dir here, and no one else may move it.
        fs::set_permissions(host.dir.path(), fs::Permissions::from_mode(0o1777)).expect("chmod");
    }
    let agent = Guard::new(cmd.spawn().expect("spawn agent"));
    host.wait_runner("a runner", |_| true);
    let mut reader = Command::new("cat");
    reader.arg(format!("/proc/{}/environ", agent.pid()));
    as_nobody(&mut reader);
    let out = reader.output().expect("cat");
    assert!(
        !out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("s3cret"),
        "the agent's environment was readable by its own account: {out:?}"
    );
}

/// The version `program version --json` reports.
fn reported_version(program: &Path) -> String {
    let out = Command::new(program)
        .args(["version", "--json"])
        .output()
        .expect("version");
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("version json");
    v["version"].as_str().expect("version").to_owned()
}

/// Writes to `to` a copy of the test binary that reports another version (every digit of
/// its own version string made a 9, so the length stays; a real second build would take
/// minutes), and returns that version. The copy is checked to run and to report it.
fn build_of_another_version(to: &Path) -> String {
    let own = reported_version(Path::new(BIN));
    let other: String = own
        .chars()
        .map(|c| if c.is_ascii_digit() { '9' } else { c })
        .collect();
    assert_ne!(own, other, "version {own} has no digit to change");
    let mut bytes = fs::read(BIN).expect("read the binary");
    let (from, into) = (own.as_bytes(), other.as_bytes());
    let mut patched = 0;
    let mut i = 0;
    while i + from.len() <= bytes.len() {
        if &bytes[i..i + from.len()] == from {
            bytes[i..i + from.len()].copy_from_slice(into);
            patched += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    assert!(patched > 0, "version {own} not found in {BIN}");
    fs::write(to, &bytes).expect("write the other build");
    fs::set_permissions(to, fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_eq!(reported_version(to), other, "the patched copy must run");
    other
}

#[test]
fn a_runner_restarted_after_the_binary_was_replaced_runs_the_agents_own_bytes() {
    let host = Host::new();
    let bin = host.path("bin");
    fs::create_dir(&bin).expect("bin dir");
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).expect("chmod");
    let exe = bin.join("railgrid");
    fs::copy(BIN, &exe).expect("copy the binary");
    let own = reported_version(&exe);
    let staged = bin.join(".railgrid.new");
    let other = build_of_another_version(&staged);

    let _agent = Guard::new(host.agent_cmd_from(&exe, &[]).spawn().expect("spawn agent"));
    let first = host.wait_runner("the first runner", |_| true);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(health["version"], own.as_str());

    // Replaced the way package managers do it: a rename over the path.
    fs::rename(&staged, &exe).expect("replace the binary");
    assert_eq!(reported_version(&exe), other);
    sigkill(first);
    let second = host.wait_runner("a restarted runner", |st| st["runner"]["starts"] == 2);
    assert_ne!(first, second);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(
        health["version"],
        own.as_str(),
        "the restarted runner must run the agent's bytes, not the file now at {}",
        exe.display()
    );

    // The status names the pinned file: the original bytes, not what the path holds now.
    let out = railgrid()
        .args(["agent", "status", "--json", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("status");
    let st: Value = serde_json::from_slice(&out.stdout).expect("status json");
    let original = fs::read(BIN).expect("read the binary");
    let sha: String = sha2::Sha256::digest(&original)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(st["exe"]["sha256"], sha.as_str(), "{st}");
    assert_eq!(st["exe"]["size"], original.len() as u64);
    assert_eq!(
        st["exe"]["path"],
        path_str(&fs::canonicalize(&exe).expect("canonical")).as_str()
    );
    let out = railgrid()
        .args(["agent", "status", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("executable: {}", exe.display())) && text.contains(&sha),
        "{text}"
    );
}

#[test]
fn a_state_dir_below_a_directory_another_account_controls_is_refused() {
    let host = Host::new();
    // Writable by everyone and not sticky: anyone could rename the state dir away and put
    // their own in its place.
    let open = host.path("open");
    fs::create_dir(&open).expect("mkdir");
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).expect("chmod");
    let user: &[&str] = if is_root() {
        &["--runner-user", "nobody"]
    } else {
        &[]
    };
    let err = host.refused_start(&open.join("state"), user);
    assert!(
        err.contains("others may write to it") && err.contains(&path_str(&open)),
        "{err}"
    );
    assert_empty(&open);
}

#[test]
fn agent_status_shows_a_stop_in_progress() {
    let host = Host::new();
    let mut agent = host.start_agent_with(&[("RAILGRID_RUNNER_STOP_GRACE", "5s")]);
    start_stubborn(&host, &mut agent);
    assert_eq!(host.status()["stopping"], false);
    agent.signal(Signal::SIGTERM);
    // The stubborn job holds the stop for its (cut) grace: the status says why meanwhile.
    wait_for(LIMIT, "agent status to show the stop", || {
        (host.status()["stopping"] == true).then_some(())
    });
    let out = railgrid()
        .args(["agent", "status", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("agent status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("stopping"), "{text}");
    let out = agent.wait_output(LIMIT);
    assert_eq!(out.status.code(), Some(0));
}
