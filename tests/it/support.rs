//! Helpers shared by the integration tests: running the binary, polling with deadlines,
//! looking at processes, and cleaning up what a test started.

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

pub use super::prerequisites::INSTALL;

pub const BIN: &str = env!("CARGO_BIN_EXE_railgrid");

pub fn railgrid() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("RAILGRID_LOG", "info");
    cmd
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Runs `start` (a spawn of a binary this test process wrote) again while the kernel says
/// the file is busy: a child another test thread forked meanwhile holds the write
/// descriptor until its own exec closes it, a moment later. Within 10 s.
pub fn fresh<T>(mut start: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match start() {
            Err(e)
                if e.kind() == std::io::ErrorKind::ExecutableFileBusy
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// True as root; otherwise says `SKIPPED: {why}` and is false. CI runs as root, so there
/// nothing is skipped.
pub fn requires_root(why: &str) -> bool {
    if !is_root() {
        eprintln!("SKIPPED: {why}");
    }
    is_root()
}

/// The flags that give a child an account: `--user nobody` as root, nothing otherwise.
pub fn user_flags() -> Vec<&'static str> {
    if is_root() {
        vec!["--user", "nobody"]
    } else {
        vec![]
    }
}

/// Polls `f` until it returns `Some`, or panics after `limit` naming `what`.
pub fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn read_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Waits until the file at `path` contains `needle`, and returns its text.
pub fn wait_for_text(path: &Path, needle: &str, limit: Duration) -> String {
    wait_for(limit, &format!("{needle:?} in {}", path.display()), || {
        let text = read_lossy(path);
        text.contains(needle).then_some(text)
    })
}

/// Fields of /proc/<pid>/stat: (pid, state, pgrp). Written here rather than taken from
/// the crate, so the tests do not check the code with itself.
fn proc_stats() -> Vec<(i32, char, i32)> {
    let mut out = Vec::new();
    for entry in fs::read_dir("/proc").expect("read /proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let (Some(state), Some(pgrp)) = (fields.first(), fields.get(2)) else {
            continue;
        };
        let (Some(state), Ok(pgrp)) = (state.chars().next(), pgrp.parse()) else {
            continue;
        };
        out.push((pid, state, pgrp));
    }
    out
}

/// Live (not zombie) processes in group `pgid`.
pub fn live_in_group(pgid: i32) -> Vec<i32> {
    proc_stats()
        .into_iter()
        .filter(|&(_, state, pgrp)| pgrp == pgid && state != 'Z' && state != 'X')
        .map(|(pid, _, _)| pid)
        .collect()
}

/// True when `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next());
            !matches!(state, Some("Z") | Some("X"))
        }
        Err(_) => false,
    }
}

/// A process a test started. Dropping it terminates it (SIGTERM, then SIGKILL) and
/// kills the groups it registered, so a failing test leaves nothing behind.
pub struct Guard {
    pub child: Option<Child>,
    groups: Vec<i32>,
}

impl Guard {
    pub fn new(child: Child) -> Self {
        Self {
            child: Some(child),
            groups: Vec::new(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// Also SIGKILL this process group on drop.
    pub fn own_group(&mut self, pgid: i32) {
        if pgid > 1 {
            self.groups.push(pgid);
        }
    }

    pub fn signal(&self, sig: Signal) {
        let _ = kill(Pid::from_raw(self.pid()), sig);
    }

    /// Waits up to `limit` for exit and returns the output; panics on timeout.
    pub fn wait_output(&mut self, limit: Duration) -> Output {
        let mut child = self.child.take().expect("child present");
        let deadline = Instant::now() + limit;
        loop {
            match child.try_wait().expect("try_wait") {
                Some(_) => return child.wait_with_output().expect("output"),
                None if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let out = child.wait_with_output().expect("output");
                    panic!(
                        "process did not exit within {limit:?}; stderr:\n{}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = Pid::from_raw(child.id() as i32);
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        for g in &self.groups {
            let _ = killpg(Pid::from_raw(*g), Signal::SIGKILL);
        }
    }
}

/// Starts `railgrid supervise` with `args` (which include `--`), stderr captured.
pub fn supervise(args: &[&str]) -> Guard {
    let child = railgrid()
        .arg("supervise")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn railgrid supervise");
    Guard::new(child)
}

/// A loopback port nobody listens on now (bound and let go).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("railgrid-test")
        .tempdir()
        .expect("tempdir")
}

pub fn path_str(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_owned()
}

pub fn join(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// One HTTP/1.1 request over a Unix socket, the way `curl --unix-socket` does it, with the
/// runner's API token (when the runner has one), as an authorized client sends it.
pub fn http(socket: &Path, method: &str, path: &str, body: Option<&str>) -> Option<(u16, String)> {
    let token = std::fs::read_to_string(socket.with_file_name("api.token")).ok();
    http_with(socket, method, path, body, token.as_deref())
}

/// [`http`] with the given token, or none.
pub fn http_with(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let body = body.unwrap_or("");
    let auth = token
        .map(|t| format!("Authorization: Bearer {}\r\n", t.trim()))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).ok()?;
    let resp = String::from_utf8_lossy(&resp).into_owned();
    let status = resp.split_whitespace().nth(1)?.parse().ok()?;
    let body = resp.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

pub fn get(socket: &Path, path: &str) -> Option<(u16, String)> {
    http(socket, "GET", path, None)
}

/// Asserts that the job record `rec` ended in `state` with an error that says `part`.
pub fn assert_ended(rec: &serde_json::Value, state: &str, part: &str) {
    assert_eq!(rec["state"], state, "{rec}");
    assert_error(rec, part);
}

/// Asserts that the job record `rec` has an error that says `part`.
pub fn assert_error(rec: &serde_json::Value, part: &str) {
    let error = rec["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {rec}"));
    assert!(error.contains(part), "{part:?} not in: {rec}");
}

pub fn get_json(socket: &Path, path: &str) -> Option<serde_json::Value> {
    let (status, body) = get(socket, path)?;
    (status == 200)
        .then(|| serde_json::from_str(&body).ok())
        .flatten()
}

/// A fresh cgroup v2 directory for one test, handed to `owner` (as the agent delegates one
/// to the runner account) when given. Dropping it kills whatever is left inside and
/// removes it with its children.
pub struct DelegatedCgroup {
    pub dir: PathBuf,
}

impl DelegatedCgroup {
    /// `None` (and a note saying why) where this host cannot make one.
    pub fn new(name: &str, owner: Option<&str>) -> Option<Self> {
        if !is_root() {
            eprintln!("skipping: making a cgroup for the test needs root");
            return None;
        }
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let Some(mount) = mountinfo.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(mount))
        }) else {
            eprintln!("skipping: no cgroup v2 hierarchy is mounted");
            return None;
        };
        let dir = mount.join(format!("railgrid-test-{name}-{}", std::process::id()));
        if let Err(e) = fs::create_dir(&dir) {
            eprintln!("skipping: cannot create {}: {e}", dir.display());
            return None;
        }
        let cg = Self { dir };
        if !cg.dir.join("cgroup.kill").exists() {
            eprintln!("skipping: this kernel has no cgroup.kill");
            return None;
        }
        if let Some(owner) = owner {
            let user = uzers::get_user_by_name(owner).expect("owner");
            for p in [
                "",
                "cgroup.procs",
                "cgroup.subtree_control",
                "cgroup.threads",
            ] {
                std::os::unix::fs::chown(
                    cg.dir.join(p),
                    Some(user.uid()),
                    Some(user.primary_group_id()),
                )
                .expect("chown");
            }
        }
        Some(cg)
    }

    /// Pids in `sub` (a path below this cgroup, "" for itself).
    pub fn procs(&self, sub: &str) -> Vec<i32> {
        fs::read_to_string(self.dir.join(sub).join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for DelegatedCgroup {
    fn drop(&mut self) {
        let _ = fs::write(self.dir.join("cgroup.kill"), "1");
        remove_cgroup_tree(&self.dir);
    }
}

/// Waits (a while) for the cgroup `dir` to empty, then removes it with its children.
pub fn remove_cgroup_tree(dir: &Path) {
    let mut dirs = vec![dir.to_owned()];
    let mut i = 0;
    while i < dirs.len() {
        if let Ok(rd) = fs::read_dir(&dirs[i]) {
            dirs.extend(rd.flatten().filter(|e| e.path().is_dir()).map(|e| e.path()));
        }
        i += 1;
    }
    let populated = |d: &Path| {
        fs::read_to_string(d.join("cgroup.events")).is_ok_and(|e| e.contains("populated 1"))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while populated(dir) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    for d in dirs.iter().rev() {
        let _ = fs::remove_dir(d);
    }
}

/// `cmd` (program, arguments, environment) started inside the cgroup `dir`: a root shell
/// moves itself there, then execs the program, as `user` when given (setpriv).
pub fn in_cgroup(cmd: &Command, dir: &Path, user: Option<&str>) -> Command {
    let mut out = Command::new("sh");
    out.arg("-c");
    match user {
        Some(u) => {
            let group = uzers::get_user_by_name(u)
                .and_then(|u| uzers::get_group_by_gid(u.primary_group_id()))
                .expect("the user's group");
            out.arg(
                r#"echo $$ > "$0/cgroup.procs" || exit 1; u=$1 g=$2; shift 2
                   exec setpriv --reuid="$u" --regid="$g" --clear-groups -- "$@""#,
            )
            .arg(dir)
            .arg(u)
            .arg(group.name());
        }
        None => {
            out.arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
                .arg(dir);
        }
    }
    out.arg(cmd.get_program()).args(cmd.get_args());
    out.env_clear().env("PATH", "/usr/bin:/bin");
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => out.env(k, v),
            None => out.env_remove(k),
        };
    }
    out
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A tmpfs of `size` mounted over `path` (an existing directory) for one test; unmounted
/// (lazily) when dropped, also when the test failed half-way. Root only.
pub struct Mounted(PathBuf);

impl Mounted {
    pub fn tmpfs(path: &Path, size: &str, mode: &str) -> Self {
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size},mode={mode}"))
            .arg("tmpfs")
            .arg(path)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount -t tmpfs at {}: {status}",
            path.display()
        );
        Self(path.to_path_buf())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A tmpfs of `size` mounted at a fresh directory for one test (root only: `None` and a
/// note otherwise).
pub struct Tmpfs {
    pub path: PathBuf,
    // Unmounted before its directory is removed: fields drop in order.
    _mount: Mounted,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size: &str, mode: &str) -> Option<Self> {
        if !is_root() {
            eprintln!("SKIPPED part: mounting a tmpfs needs root");
            return None;
        }
        let dir = tempdir();
        let path = dir.path().join("mnt");
        fs::create_dir(&path).expect("mkdir");
        Some(Self {
            _mount: Mounted::tmpfs(&path, size, mode),
            path,
            _dir: dir,
        })
    }

    /// Bytes free, as statvfs says.
    pub fn free(&self) -> u64 {
        let s = nix::sys::statvfs::statvfs(&self.path).expect("statvfs");
        s.blocks_available() as u64 * s.fragment_size() as u64
    }
}

/// Writes to `path` until the file system has no room left at all.
pub fn fill(path: &Path) {
    use std::io::Write as _;
    let mut f = fs::File::create(path).expect("create filler");
    for chunk in [1 << 20, 4096, 1] {
        let buf = vec![0u8; chunk];
        loop {
            match f.write(&buf) {
                Ok(n) if n == chunk => {}
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
    }
    // Already full: even one byte more is refused.
    assert!(f.write(b"x").is_err(), "{} is not full", path.display());
}
