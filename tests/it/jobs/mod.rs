//! The runner's job engine through its real API and the `railgrid job` CLI: real
//! processes, real SQLite, real sockets.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{json, Value};

use crate::support::*;

mod admission;
mod api;
mod client;
mod confine;
mod recovery;
mod runs;

const LIMIT: Duration = Duration::from_secs(30);

struct Runner {
    dir: tempfile::TempDir,
    guard: Option<Guard>,
}

fn as_runner_user(cmd: &mut Command) {
    if is_root() {
        let nobody = uzers::get_user_by_name("nobody").expect("nobody");
        cmd.uid(nobody.uid()).gid(nobody.primary_group_id());
    }
}

/// Gives the runner account the runner directory (as the agent does).
fn chown_runner_dir(dir: &Path) {
    if !is_root() {
        return;
    }
    let nobody = uzers::get_user_by_name("nobody").expect("nobody");
    let (uid, gid) = (nobody.uid(), nobody.primary_group_id());
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid)).expect("chown");
        if p.is_dir() && !p.is_symlink() {
            stack.extend(
                fs::read_dir(&p)
                    .expect("read_dir")
                    .flatten()
                    .map(|e| e.path()),
            );
        }
    }
}

impl Runner {
    fn new() -> Self {
        Self::in_dir(tempdir())
    }

    /// A runner's state dir in `dir` (which a test may have mounted something on).
    fn in_dir(dir: tempfile::TempDir) -> Self {
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let runner_dir = dir.path().join("state/runner");
        fs::create_dir_all(&runner_dir).expect("mkdir");
        fs::set_permissions(dir.path().join("state"), fs::Permissions::from_mode(0o711))
            .expect("chmod");
        fs::set_permissions(&runner_dir, fs::Permissions::from_mode(0o700)).expect("chmod");
        chown_runner_dir(&runner_dir);
        Self { dir, guard: None }
    }

    fn started(extra: &[&str]) -> Self {
        let mut r = Self::new();
        r.start(extra);
        r
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn runner_dir(&self) -> PathBuf {
        self.state().join("runner")
    }

    fn socket(&self) -> PathBuf {
        self.runner_dir().join("runner.sock")
    }

    fn start(&mut self, extra: &[&str]) {
        let mut cmd = railgrid();
        cmd.args(["runner", "run", "--state-dir"])
            .arg(self.state())
            .args(extra)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("RUNNER_SECRET", "runner-secret-value")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_runner_user(&mut cmd);
        let child = cmd.spawn().expect("spawn runner");
        let pid = child.id() as i32;
        self.guard = Some(Guard::new(child));
        wait_for(LIMIT, "the runner to answer", || {
            let h = get_json(&self.socket(), "/v1/health")?;
            (h["pid"] == pid).then_some(())
        });
    }

    fn submit(&self, spec: Value) -> (u16, Value) {
        let (status, body) = http(&self.socket(), "POST", "/v1/jobs", Some(&spec.to_string()))
            .expect("POST /v1/jobs");
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    fn job(&self, id: &str) -> Value {
        get_json(&self.socket(), &format!("/v1/jobs/{id}")).expect("job")
    }

    fn wait(&self, id: &str) -> Value {
        wait_for(LIMIT, &format!("job {id} to end"), || {
            let rec = get_json(
                &self.socket(),
                &format!("/v1/jobs/{id}/wait?timeout_secs=5"),
            )?;
            let state = rec["state"].as_str()?;
            (!matches!(state, "queued" | "starting" | "running")).then_some(rec)
        })
    }

    /// The pid of job `id` once it has printed `line` (a job may print before the runner
    /// has recorded its pid, so both are awaited).
    fn pid_when_printed(&self, id: &str, line: &str) -> i32 {
        wait_for(LIMIT, &format!("job {id} to print {line:?}"), || {
            let pid = self.job(id)["pid"].as_i64()?;
            (self.output(id, "stdout") == line).then_some(pid as i32)
        })
    }

    fn output(&self, id: &str, stream: &str) -> String {
        get(&self.socket(), &format!("/v1/jobs/{id}/output/{stream}"))
            .expect("output")
            .1
    }

    fn cli(&self) -> Command {
        let mut cmd = railgrid();
        cmd.arg("job").arg("--socket").arg(self.socket());
        cmd
    }
}

fn submit_ok(r: &Runner, spec: Value) -> String {
    let (status, body) = r.submit(spec);
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().expect("id").to_owned()
}

/// One GET with the token, returning the whole response, headers included (lower-cased
/// header names, as hyper sends them).
fn raw_get(socket: &Path, path: &str) -> String {
    raw_request(socket, "GET", path)
}

/// [`raw_get`] with any method.
fn raw_request(socket: &Path, method: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let token = fs::read_to_string(socket.with_file_name("api.token")).expect("token");
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("connect");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: 0\r\nAuthorization: Bearer {}\r\n\r\n",
        token.trim()
    )
    .expect("write");
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).expect("read");
    String::from_utf8_lossy(&resp).to_lowercase()
}

fn tree_script() -> &'static str {
    r#"for i in $(seq 20); do sleep 1000 & done
       sh -c 'trap "" TERM; exec sleep 1000' &
       echo ready; wait"#
}

fn assert_no_survivors(r: &Runner, rec: &Value) {
    let pid = rec["pid"].as_i64().expect("pid") as i32;
    let survivors = live_in_group(pid);
    assert!(
        survivors.is_empty(),
        "survivors of job group {pid}: {survivors:?} ({})",
        r.dir.path().display()
    );
}
