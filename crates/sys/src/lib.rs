//! The only place in railgrid with `unsafe` code and raw system calls.
//!
//! Everything here is a small synchronous function that turns an OS call into a typed
//! `Result` at once. Callers elsewhere never see a raw errno, a raw fd or a raw pid.

#[cfg(target_os = "linux")]
pub mod cgroup;
mod child;
pub mod dirfd;
pub mod errno;
pub mod exe;
#[cfg(target_os = "linux")]
pub mod fdpass;
pub mod group;
#[cfg(target_os = "linux")]
pub mod landlock;
#[cfg(target_os = "linux")]
pub mod launch;
pub mod locks;
pub mod memory;
pub mod pipe;
#[cfg(target_os = "linux")]
pub mod procfs;
#[cfg(target_os = "linux")]
pub mod sandbox;
pub mod spawn;
pub mod splice;
pub mod start;

use std::fmt;

use nix::unistd::Pid;

/// A process id that is known to be > 1, so that signalling it can never mean
/// "every process" (-1), "my own group" (0) or init (1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessId(i32);

impl ProcessId {
    /// Returns `None` for 0, 1 and negative values.
    pub fn new(raw: i32) -> Option<Self> {
        (raw > 1).then_some(Self(raw))
    }

    pub fn from_u32(raw: u32) -> Option<Self> {
        i32::try_from(raw).ok().and_then(Self::new)
    }

    pub fn get(self) -> i32 {
        self.0
    }

    pub(crate) fn as_nix(self) -> Pid {
        Pid::from_raw(self.0)
    }

    /// The calling process.
    pub fn current() -> Self {
        Self(std::process::id() as i32)
    }
}

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Makes this process non-dumpable: processes of the same account (without
/// CAP_SYS_PTRACE) can then no longer ptrace it or read its `/proc/<pid>/{mem,environ,fd}`,
/// and it leaves no core dump. Linux only; a no-op elsewhere.
pub fn forbid_inspection() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_DUMPABLE takes one integer argument and touches no memory of ours.
        if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The size of a memory page, from the system (4 KiB on most hosts, 16 KiB on some ARM
/// ones): never a constant.
pub fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n > 0)
        .unwrap_or(4096)
}

/// The host name (`gethostname`), where it is valid UTF-8.
pub fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for `buf.len()` bytes; gethostname writes at most that
    // many and touches nothing else.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    // POSIX leaves a truncated name without its terminating NUL: then the whole buffer.
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    std::str::from_utf8(&buf[..len]).ok().map(str::to_owned)
}

/// CLOCK_MONOTONIC in microseconds (what sd_notify's `MONOTONIC_USEC` names).
pub fn monotonic_usec() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid one given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    if rc != 0 {
        return 0;
    }
    (t.tv_sec.max(0) as u64) * 1_000_000 + (t.tv_nsec.max(0) as u64) / 1000
}

/// True when the effective uid is 0.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The effective uid and gid of this process.
pub fn current_ids() -> (u32, u32) {
    (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    )
}

/// Sets the process umask, returning the previous one. Called once at daemon start, before
/// any thread or file exists, so every file and socket the process creates is private.
pub fn set_umask(mask: u32) -> u32 {
    use nix::sys::stat::{umask, Mode};
    umask(Mode::from_bits_truncate(mask as libc::mode_t)).bits() as u32
}

/// Whether `path` (not followed) carries a POSIX access ACL, which can grant write access
/// that the mode bits do not show. Always false where the OS has no such attribute here.
#[cfg(target_os = "linux")]
pub fn has_access_acl(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let name = c"system.posix_acl_access";
    // SAFETY: both strings are NUL-terminated; a null buffer of size 0 asks only for the
    // attribute's size.
    let n = unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    n > 0
}

#[cfg(not(target_os = "linux"))]
pub fn has_access_acl(_path: &std::path::Path) -> bool {
    false
}

/// Changes the owner of `path` (not following a final symlink).
pub fn chown(path: &std::path::Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
}

/// The start time of `pid` in clock ticks since boot, where the OS exposes it (Linux).
/// With the pid it identifies a process across pid reuse.
pub fn process_start_time(pid: ProcessId) -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        procfs::stat(pid).ok().flatten().map(|s| s.start_time)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pid;
        None
    }
}

/// The command line of `pid`, where the OS exposes it (Linux).
pub fn process_cmdline(pid: ProcessId) -> Option<Vec<String>> {
    #[cfg(target_os = "linux")]
    {
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        Some(
            raw.split(|&b| b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect(),
        )
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pid;
        None
    }
}

/// The real uid of `pid`, where the OS exposes it (Linux).
pub fn process_uid(pid: ProcessId) -> Option<u32> {
    #[cfg(target_os = "linux")]
    {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("Uid:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pid;
        None
    }
}

/// A live process of this uid, leading its own group, whose initial environment holds
/// `name=value` (Linux: /proc/<pid>/environ, readable for our own processes only).
pub fn find_own_process_with_env(name: &str, value: &str) -> Option<ProcessId> {
    #[cfg(target_os = "linux")]
    {
        let (uid, _) = current_ids();
        let needle = format!("{name}={value}");
        procfs::processes().ok()?.into_iter().find_map(|st| {
            let pid = ProcessId::new(st.pid)?;
            if st.pgrp != st.pid || st.state == 'Z' || process_uid(pid) != Some(uid) {
                return None;
            }
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            environ
                .split(|&b| b == 0)
                .any(|kv| kv == needle.as_bytes())
                .then_some(pid)
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (name, value);
        None
    }
}

/// Raises this process's soft limit on open files to its hard limit and returns the new
/// soft limit: a hub holds one descriptor per connected agent.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(std::io::Error::from)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(std::io::Error::from)?;
    }
    Ok(hard.max(soft))
}
