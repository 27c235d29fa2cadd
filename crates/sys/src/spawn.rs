//! Preparing a child between fork and exec: new session, then credentials.

use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::unistd::{setgid, setsid, setuid, Gid, Uid};

pub use super::child::Rlimits;

/// The account a child switches to before exec. Built before fork so that the
/// `pre_exec` closure allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, set first (while still privileged). Empty clears them.
    pub groups: Vec<u32>,
}

/// Makes the child the leader of a new session (and so of a new process group whose id is
/// its pid), and switches it to `creds` when given: supplementary groups, then gid, then
/// uid, so that no root group survives the drop; then enters `dir` as that account, so a
/// directory the account may not enter fails the launch instead of being entered by root.
///
/// std's own `uid()`/`gid()` cannot be used: they run before `pre_exec` closures, and
/// `setgroups` needs privilege that is gone after `setuid`. For the same reason std's
/// `current_dir` (which runs first, as root) is not used when switching accounts.
///
/// With `cgroup_procs` (an open `cgroup.procs`), the child first moves itself into that
/// cgroup, while it may still do so as the caller.
pub fn session_leader_as(
    cmd: &mut Command,
    creds: Option<Credentials>,
    dir: WorkDir<'_>,
    cgroup_procs: Option<std::os::fd::OwnedFd>,
) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    enum Dir {
        Path(std::ffi::CString),
        Fd(std::os::fd::OwnedFd),
    }
    let dir = match dir {
        WorkDir::Path(p) => Dir::Path(std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(
            |_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in working directory"),
        )?),
        WorkDir::Fd(fd) => Dir::Fd(fd.try_clone_to_owned()?),
    };
    let creds = creds.map(|c| {
        let groups: Vec<Gid> = c.groups.iter().map(|g| Gid::from_raw(*g)).collect();
        (Uid::from_raw(c.uid), Gid::from_raw(c.gid), groups)
    });
    // SAFETY: the closure runs in the forked child before exec. It only calls setsid, write,
    // setgroups, setgid, setuid and chdir or fchdir — plain system calls that are async-signal-safe —
    // and it does not allocate: the group list, the directory's C string and the cgroup
    // descriptor were made above, before fork, and are only borrowed here.
    unsafe {
        cmd.pre_exec(move || {
            setsid()?;
            if let Some(fd) = &cgroup_procs {
                nix::unistd::write(fd, b"0")?;
            }
            if let Some((uid, gid, groups)) = &creds {
                set_groups(groups)?;
                setgid(*gid)?;
                setuid(*uid)?;
            }
            match &dir {
                Dir::Path(p) => nix::unistd::chdir(p.as_c_str())?,
                Dir::Fd(fd) => nix::unistd::fchdir(fd)?,
            }
            Ok(())
        });
    }
    Ok(())
}

/// Where a child starts: a configured path (the supervisor's `--dir`, the operator's own),
/// or a directory already resolved and checked, entered by descriptor (a job's cwd).
#[derive(Debug, Clone, Copy)]
pub enum WorkDir<'a> {
    Path(&'a std::path::Path),
    Fd(std::os::fd::BorrowedFd<'a>),
}

#[cfg(not(target_vendor = "apple"))]
fn set_groups(groups: &[Gid]) -> std::io::Result<()> {
    nix::unistd::setgroups(groups).map_err(std::io::Error::from)
}

#[cfg(target_vendor = "apple")]
fn set_groups(groups: &[Gid]) -> std::io::Result<()> {
    // SAFETY: Gid is a transparent wrapper of gid_t, so the slice is a valid gid_t array
    // of `groups.len()` entries for the duration of the call.
    let rc = unsafe {
        libc::setgroups(
            groups.len() as libc::c_int,
            groups.as_ptr() as *const libc::gid_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The supplementary groups `initgroups(user, gid)` would set: the user's groups from the
/// group database plus `gid`. Done in the parent because the lookup allocates and reads
/// files, which must not happen between fork and exec.
#[cfg(not(target_vendor = "apple"))]
pub fn group_list(user: &str, gid: u32) -> std::io::Result<Vec<u32>> {
    let name = std::ffi::CString::new(user)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in user name"))?;
    let groups = nix::unistd::getgrouplist(&name, Gid::from_raw(gid))?;
    Ok(groups.into_iter().map(|g| g.as_raw()).collect())
}

/// macOS has no usable `getgrouplist` in nix; the child keeps only its primary group.
#[cfg(target_vendor = "apple")]
pub fn group_list(_user: &str, gid: u32) -> std::io::Result<Vec<u32>> {
    Ok(vec![gid])
}

/// What a job's child does between fork and exec on the portable path (no `clone` with a
/// pidfd): the same steps as `sys::launch`, in the same order, all prepared before fork.
pub(super) struct JobExec {
    /// The working directory, open: entered with `fchdir`.
    pub(super) cwd: std::os::fd::OwnedFd,
    /// An open `cgroup.procs` to join first.
    pub(super) cgroup_procs: Option<std::os::fd::OwnedFd>,
    pub(super) limits: Rlimits,
    /// A Landlock ruleset to restrict the child to, last before exec (Linux).
    pub(super) landlock: Option<std::os::fd::OwnedFd>,
    /// The paths to try, in order, as execvp tries PATH.
    pub(super) programs: Vec<std::ffi::CString>,
    pub(super) argv: Vec<std::ffi::CString>,
    pub(super) env: Vec<std::ffi::CString>,
}

/// Pointer arrays into a [`JobExec`]'s strings, made before fork so the child allocates
/// nothing. The strings they point into move with them into the closure.
struct ExecArrays {
    exec: JobExec,
    programs: Vec<*const libc::c_char>,
    argv: Vec<*const libc::c_char>,
    env: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into the CStrings owned by `exec` in the same struct, which
// never changes them; the struct is only ever used by the one child that runs the closure.
unsafe impl Send for ExecArrays {}
// SAFETY: as above: nothing is ever written through the pointers.
unsafe impl Sync for ExecArrays {}

/// Sets `cmd` up to become a job: new session, its cgroup, rlimits, `fchdir` to its
/// working directory, Landlock, then `execve` of each candidate in turn with the job's own
/// argv and environment (std's stdio set-up has run by then). The exec happens here,
/// inside the closure, so the PATH lookup is the job's own, under its Landlock ruleset;
/// if every candidate fails, the closure returns the errno execvp would report and std
/// reports it from `spawn`.
pub(super) fn job_exec(cmd: &mut Command, exec: JobExec) {
    let ptrs = |v: &[std::ffi::CString]| -> Vec<*const libc::c_char> {
        v.iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let arrays = ExecArrays {
        programs: exec.programs.iter().map(|p| p.as_ptr()).collect(),
        argv: ptrs(&exec.argv),
        env: ptrs(&exec.env),
        exec,
    };
    // SAFETY: the closure runs in the forked child before exec and makes only plain
    // system calls (rt_sigaction or signal, close_range, setsid, write, setrlimit, fchdir,
    // prctl, landlock_restrict_self, execve) on data prepared above; it allocates nothing
    // and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            use std::os::fd::AsRawFd;
            let a = &arrays;
            let e = &a.exec;
            // As the clone path: default dispositions, nothing of the runner's left open.
            super::child::reset_signal_handlers();
            super::child::close_stray_descriptors();
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = &e.cgroup_procs {
                if libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if !super::child::set_rlimits(e.limits) {
                return Err(std::io::Error::last_os_error());
            }
            if libc::fchdir(e.cwd.as_raw_fd()) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            #[cfg(target_os = "linux")]
            if let Some(ruleset) = &e.landlock {
                if !super::landlock::restrict_self(ruleset.as_raw_fd()) {
                    return Err(std::io::Error::last_os_error());
                }
            }
            let mut denied = false;
            let mut last = libc::ENOENT;
            for &program in &a.programs {
                libc::execve(program, a.argv.as_ptr(), a.env.as_ptr());
                let errno = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::ENOENT);
                match errno {
                    libc::EACCES => denied = true,
                    libc::ENOENT | libc::ENOTDIR => {}
                    other => return Err(std::io::Error::from_raw_os_error(other)),
                }
                last = errno;
            }
            let _ = last;
            Err(std::io::Error::from_raw_os_error(if denied {
                libc::EACCES
            } else {
                libc::ENOENT
            }))
        });
    }
}

/// Spawns `cmd` as a daemon of its own and returns its pid: a new session, then a fork
/// whose parent exits at once, so that the process that execs is nobody's child but
/// init's (no zombie is left for a caller that re-executes itself and forgets it, and no
/// signal to the caller's group or session reaches it). The middle process passes the
/// final pid back on a pipe before it exits, and is reaped here. An exec failure of the
/// final process still fails this call, through std's own error pipe, which it inherits.
/// Other `pre_exec` steps of `cmd` run in the final process, after this one.
pub fn spawn_detached(cmd: &mut Command) -> std::io::Result<u32> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let (rx, tx) = nix::unistd::pipe()?;
    for fd in [&rx, &tx] {
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )?;
    }
    let tx_raw = tx.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and calls only setsid,
    // fork, write and _exit, which are async-signal-safe; it allocates nothing (the pid
    // goes out from a stack buffer).
    unsafe {
        cmd.pre_exec(move || {
            setsid()?;
            match nix::unistd::fork()? {
                nix::unistd::ForkResult::Parent { child } => {
                    let bytes = child.as_raw().to_ne_bytes();
                    libc::write(tx_raw, bytes.as_ptr().cast(), bytes.len());
                    libc::_exit(0)
                }
                nix::unistd::ForkResult::Child => Ok(()),
            }
        });
    }
    let spawned = cmd.spawn();
    drop(tx);
    let mut middle = spawned?;
    let _ = middle.wait();
    let mut buf = [0u8; 4];
    std::fs::File::from(rx).read_exact(&mut buf)?;
    let pid = i32::from_ne_bytes(buf);
    u32::try_from(pid).map_err(|_| std::io::Error::other("no pid from the detached process"))
}
