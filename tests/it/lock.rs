//! The runner lock and stale-holder reclaim, against real lock holders.
//!
//! Holders are util-linux `flock(1)` processes: `flock FILE sh -c ...` takes the lock in the
//! flock process itself, which the kernel then lists in /proc/locks, and the script writes
//! that pid ($PPID) into the file as a runner would.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use railgrid::supervisor::lock::{self, LockError};

use crate::fixtures::*;

const GRACE: Duration = Duration::from_secs(1);

/// A process holding a flock, leader of its own group with two children.
pub struct Holder {
    child: Option<Child>,
    pid: i32,
}

impl Holder {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn reap(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
        self.reap();
    }
}

/// Starts `flock LOCK sh -c '...'` in a new process group; `write_pid` decides what the
/// script writes into the lock file. Returns once the holder is ready.
fn start_holder(lock: &Path, write_pid: &str) -> Holder {
    let script = format!(
        "echo {write_pid} > '{}'; sleep 1000 & sleep 1000 & echo ready; wait",
        lock.display()
    );
    let mut child = Command::new("flock")
        .arg(lock)
        .args(["sh", "-c", &script])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn flock(1) (util-linux)");
    let pid = child.id() as i32;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert_eq!(line.trim(), "ready");
    Holder {
        child: Some(child),
        pid,
    }
}

pub fn spawn_holder(lock: &Path) -> Holder {
    start_holder(lock, "$PPID")
}

fn sleeper() -> Guard {
    let child = Command::new("sleep")
        .arg("1000")
        .spawn()
        .expect("spawn sleep");
    Guard::new(child)
}

#[test]
fn reclaims_a_holder_and_its_whole_group() {
    let dir = tempdir();
    let path = dir.path().join("runner.lock");
    let mut holder = spawn_holder(&path);
    let pid = holder.pid();
    assert_eq!(live_in_group(pid).len(), 4, "flock, sh and two sleeps");

    let reclaimed = lock::reclaim_stale_holder(&path, GRACE).expect("reclaim");
    assert_eq!(reclaimed, Some(pid));
    assert!(
        live_in_group(pid).is_empty(),
        "group {pid} survived: {:?}",
        live_in_group(pid)
    );
    holder.reap();
    // The lock is free now.
    let held = lock::acquire(&path).expect("acquire after reclaim");
    drop(held);
}

#[test]
fn a_free_lock_returns_none_and_a_missing_file_too() {
    let dir = tempdir();
    let path = dir.path().join("runner.lock");
    assert_eq!(
        lock::reclaim_stale_holder(&path, GRACE).expect("missing file"),
        None
    );
    drop(lock::acquire(&path).expect("acquire"));
    assert_eq!(
        lock::reclaim_stale_holder(&path, GRACE).expect("free lock"),
        None
    );
}

#[test]
fn a_live_pid_named_in_a_free_lock_is_never_signalled() {
    let dir = tempdir();
    let path = dir.path().join("runner.lock");
    let bystander = sleeper();
    std::fs::write(&path, format!("{}\n", bystander.pid())).expect("write");
    assert_eq!(
        lock::reclaim_stale_holder(&path, GRACE).expect("reclaim"),
        None
    );
    assert!(
        alive(bystander.pid()),
        "a process that never held the lock was signalled"
    );
}

#[test]
fn a_live_pid_named_by_another_holder_is_never_signalled() {
    let dir = tempdir();
    let path = dir.path().join("runner.lock");
    let bystander = sleeper();
    // The lock is held by flock(1), but the file names the bystander.
    let holder = start_holder(&path, &bystander.pid().to_string());
    let err = lock::reclaim_stale_holder(&path, GRACE).expect_err("mismatch must be refused");
    assert!(matches!(err, LockError::NotTheHolder { .. }), "{err}");
    assert!(
        err.to_string().contains(&bystander.pid().to_string()),
        "{err}"
    );
    assert!(alive(bystander.pid()), "the bystander was signalled");
    assert!(alive(holder.pid()), "the unverified holder was signalled");
}

#[test]
fn a_second_acquire_fails_naming_the_holder() {
    let dir = tempdir();
    let path = dir.path().join("runner.lock");
    let held = lock::acquire(&path).expect("first acquire");
    let text = std::fs::read_to_string(&path).expect("read");
    assert_eq!(text, format!("{}\n", std::process::id()));
    let err = lock::acquire(&path).expect_err("second acquire");
    assert_eq!(
        err.to_string(),
        format!(
            "another runner (pid {}) holds {}",
            std::process::id(),
            path.display()
        )
    );
    drop(held);

    // Across processes too.
    let _holder = spawn_holder(&path);
    let err = lock::acquire(&path).expect_err("held by flock(1)");
    assert!(
        matches!(err, LockError::Held { pid, .. } if pid == _holder.pid()),
        "{err}"
    );
}

#[test]
fn lock_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir();
    let path = dir.path().join("runner.lock");
    let _held = lock::acquire(&path).expect("acquire");
    let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn a_holder_running_as_another_user_than_the_lock_owner_is_never_signalled() {
    if !requires_root("needs root to give the lock file to another account") {
        return;
    }
    let dir = tempdir();
    let path = dir.path().join("runner.lock");
    let holder = spawn_holder(&path);
    // The file now belongs to nobody, but a root process holds it.
    let nobody = uzers::get_user_by_name("nobody").expect("nobody");
    std::os::unix::fs::lchown(&path, Some(nobody.uid()), Some(nobody.primary_group_id()))
        .expect("chown");
    let err = lock::reclaim_stale_holder(&path, GRACE).expect_err("refused");
    assert!(matches!(err, LockError::Unsafe { .. }), "{err}");
    assert!(alive(holder.pid()));
}

#[test]
fn a_fifo_in_place_of_the_lock_is_refused_without_hanging() {
    let dir = tempdir();
    let path = dir.path().join("runner.lock");
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let err = lock::reclaim_stale_holder(&path, GRACE).expect_err("refused");
    assert!(err.to_string().contains("runner.lock"), "{err}");
}
