//! Launching a job process on Linux with `clone(CLONE_VM | CLONE_VFORK)`, the way
//! posix_spawn does it, plus what posix_spawn cannot do: rlimits and joining a cgroup before
//! the first instruction of the job runs.
//!
//! Why not fork: the runner is a multi-threaded process with a large address space. fork
//! copies its page tables, and every page either side writes afterwards takes a
//! copy-on-write fault with a TLB shootdown across the runner's threads; exec then tears
//! the copy down again. For trivial jobs that was most of the runner's CPU. Why not
//! posix_spawn: it has no rlimits and (in the glibc versions we target) no cgroup.
//!
//! The child shares the parent's memory until it execs, and the parent thread is suspended
//! meanwhile. So the child only makes plain system calls on data prepared before the clone:
//! it allocates nothing, takes no lock, and reports a failure through a shared word before
//! `_exit(127)`. All signals are blocked around the clone, and the child resets every
//! handler to the default before unblocking, so no handler of the runner ever runs in it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use super::child::Rlimits;
use super::child::Step;
use super::ProcessId;

/// What the child needs, all of it built before the clone.
pub struct LaunchSpec<'a> {
    /// The paths to try, in order, as execvp would try each entry of PATH: absolute, or
    /// relative to `cwd`. The child tries them itself, after it has restricted itself to
    /// its Landlock ruleset, so the kernel judges each one as the job's own lookup; the
    /// runner never probes paths on the job's behalf.
    pub programs: &'a [CString],
    pub argv: &'a [CString],
    /// `NAME=value` entries: the complete environment.
    pub env: &'a [CString],
    /// The working directory, already resolved and checked: the child `fchdir`s to it, so
    /// no path is looked up again between the check and the job's first instruction.
    pub cwd: BorrowedFd<'a>,
    pub stdin: BorrowedFd<'a>,
    pub stdout: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
    pub limits: Rlimits,
    /// An open `cgroup.procs` the child writes itself into before anything else.
    pub cgroup_procs: Option<BorrowedFd<'a>>,
    /// A Landlock ruleset the child restricts itself to, last before exec.
    pub landlock: Option<BorrowedFd<'a>>,
}

#[derive(Debug, thiserror::Error)]
#[error("{step} failed")]
pub struct LaunchError {
    pub step: Step,
    #[source]
    pub source: io::Error,
}

/// A launched process: its pid (leader of its own session and process group) and a pidfd
/// that becomes readable when it exits.
#[derive(Debug)]
pub struct Launched {
    pub pid: ProcessId,
    pub pidfd: OwnedFd,
}

/// The child's only channel back: which step failed and its errno.
struct Shared<'a> {
    spec: &'a LaunchSpec<'a>,
    programs: *const *const libc::c_char,
    programs_len: usize,
    argv: *const *const libc::c_char,
    env: *const *const libc::c_char,
    stdio: [RawFd; 3],
    step: AtomicI32,
    errno: AtomicI32,
}

const STACK_SIZE: usize = 64 * 1024;

/// What a clone child reads of a [`LaunchSpec`] as raw pointers: the null-terminated
/// argv and environment, the program candidates, and the stdio sources (copied above 2
/// where one is itself 0, 1 or 2: the child moves them onto 0, 1 and 2, and a source could
/// be overwritten before it is used). They borrow the spec and live as long as this.
pub(super) struct Strings {
    pub(super) programs: Vec<*const libc::c_char>,
    pub(super) argv: Vec<*const libc::c_char>,
    pub(super) env: Vec<*const libc::c_char>,
    pub(super) stdio: [RawFd; 3],
    _lifted: Vec<OwnedFd>,
}

impl Strings {
    pub(super) fn new(spec: &LaunchSpec<'_>) -> io::Result<Self> {
        let terminated = |all: &[CString]| -> Vec<*const libc::c_char> {
            all.iter()
                .map(|a| a.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        let mut lifted = Vec::new();
        let mut stdio = [0; 3];
        for (slot, fd) in [spec.stdin, spec.stdout, spec.stderr].iter().enumerate() {
            stdio[slot] = if fd.as_raw_fd() < 3 {
                // F_DUPFD_CLOEXEC from 3 up.
                let high = fd.try_clone_to_owned()?;
                let raw = high.as_raw_fd();
                lifted.push(high);
                raw
            } else {
                fd.as_raw_fd()
            };
        }
        Ok(Self {
            programs: spec.programs.iter().map(|p| p.as_ptr()).collect(),
            argv: terminated(spec.argv),
            env: terminated(spec.env),
            stdio,
            _lifted: lifted,
        })
    }
}

/// Every signal blocked on this thread for as long as it lives (around a clone: no handler
/// of the runner may run in the child before it has reset them), the old mask back after.
pub(super) struct BlockedSignals(libc::sigset_t);

impl BlockedSignals {
    pub(super) fn all() -> Self {
        let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigfillset initialises `all`; pthread_sigmask reads it and fills `old`.
        unsafe {
            libc::sigfillset(all.as_mut_ptr());
            libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr());
            Self(old.assume_init())
        }
    }
}

impl Drop for BlockedSignals {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `all`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut());
        }
    }
}

/// Tries each program in turn as execvp would: a path that is missing or not a directory
/// on the way goes on to the next; any other refusal ends the search; "permission
/// denied" wins if one was seen, so a program found but not executable is not reported
/// as missing. Returns only on failure, with the errno to report.
///
/// # Safety
/// Only in a child before exec, with `programs` (`len` of them), `argv` and `env` valid.
pub(super) unsafe fn exec_first(
    programs: *const *const libc::c_char,
    len: usize,
    argv: *const *const libc::c_char,
    env: *const *const libc::c_char,
) -> libc::c_int {
    let mut denied = false;
    for i in 0..len {
        libc::execve(*programs.add(i), argv, env);
        let errno = *libc::__errno_location();
        if errno == libc::EACCES {
            denied = true;
        } else if errno != libc::ENOENT && errno != libc::ENOTDIR {
            return errno;
        }
    }
    if denied {
        libc::EACCES
    } else {
        libc::ENOENT
    }
}

/// Starts the process. Returns once it has exec'd (or failed to).
pub fn launch(spec: &LaunchSpec<'_>) -> Result<Launched, LaunchError> {
    let fail = |step: Step| move |source: io::Error| LaunchError { step, source };
    let strings = Strings::new(spec).map_err(fail(Step::Stdio))?;
    let shared = Shared {
        spec,
        programs: strings.programs.as_ptr(),
        programs_len: strings.programs.len(),
        argv: strings.argv.as_ptr(),
        env: strings.env.as_ptr(),
        stdio: strings.stdio,
        step: AtomicI32::new(0),
        errno: AtomicI32::new(0),
    };

    let stack = Stack::new().map_err(fail(Step::Clone))?;
    let mut pidfd: libc::c_int = -1;
    let mask = BlockedSignals::all();
    // SAFETY: `child` runs on its own stack (`stack.top()`, valid until after the clone
    // returns, which with CLONE_VFORK is after the child exec'd or exited) and only reads
    // `shared`, which lives on this frame for as long. CLONE_PIDFD stores the pidfd in
    // `pidfd`. The calling thread is suspended until the child is done with our memory.
    let pid = unsafe {
        libc::clone(
            child,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            &shared as *const Shared<'_> as *mut libc::c_void,
            &mut pidfd as *mut libc::c_int,
        )
    };
    let clone_err = io::Error::last_os_error();
    drop(mask);
    drop(stack);
    drop(strings);
    if pid < 0 {
        return Err(LaunchError {
            step: Step::Clone,
            source: clone_err,
        });
    }
    // SAFETY: the kernel handed us this pidfd; nobody else owns it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let step = shared.step.load(Ordering::SeqCst);
    if step != 0 {
        let errno = shared.errno.load(Ordering::SeqCst);
        // The child has exited with 127; reap it so it leaves no zombie.
        let _ = reap(pid, true);
        return Err(LaunchError {
            step: Step::from_code(step),
            source: io::Error::from_raw_os_error(errno),
        });
    }
    let pid = ProcessId::new(pid).ok_or_else(|| LaunchError {
        step: Step::Clone,
        source: io::Error::other(format!("clone returned pid {pid}")),
    })?;
    Ok(Launched { pid, pidfd })
}

/// Runs in the child, on its own stack, sharing the parent's memory. Plain system calls only.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Shared` of the suspended parent frame (see `launch`).
    let sh = unsafe { &*(arg as *const Shared<'_>) };
    let fail = |step: Step| -> libc::c_int {
        super::child::record_failure(&sh.step, &sh.errno, step);
        // SAFETY: _exit ends the child at once, without running the parent's atexit work.
        unsafe { libc::_exit(127) }
    };
    // SAFETY: the whole block: each call is a thin wrapper of one system call on memory that
    // was prepared before the clone and stays valid while the parent is suspended.
    unsafe {
        super::child::reset_signal_handlers();
        if libc::setsid() < 0 {
            return fail(Step::Setsid);
        }
        if let Some(fd) = sh.spec.cgroup_procs {
            if libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                return fail(Step::JoinCgroup);
            }
        }
        if !super::child::set_rlimits(sh.spec.limits) {
            return fail(Step::Setrlimit);
        }
        for (target, &src) in sh.stdio.iter().enumerate() {
            if libc::dup2(src, target as RawFd) < 0 {
                return fail(Step::Stdio);
            }
        }
        super::child::close_stray_descriptors();
        if libc::fchdir(sh.spec.cwd.as_raw_fd()) < 0 {
            return fail(Step::Chdir);
        }
        if let Some(ruleset) = sh.spec.landlock {
            if !super::landlock::restrict_self(ruleset.as_raw_fd()) {
                return fail(Step::Landlock);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        *libc::__errno_location() = exec_first(sh.programs, sh.programs_len, sh.argv, sh.env);
        fail(Step::Exec)
    }
}

/// A child's stack: mapped fresh, with a guard page below it.
#[derive(Debug)]
pub(super) struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone; moving it to another thread moves
// the ownership of the memory with it.
unsafe impl Send for Stack {}
// SAFETY: a shared `Stack` gives no access to the memory, only its address and length.
unsafe impl Sync for Stack {}

impl Stack {
    pub(super) fn new() -> io::Result<Self> {
        let page = super::page_size();
        let len = STACK_SIZE + page;
        // SAFETY: an anonymous private mapping; checked for MAP_FAILED below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self { base, len };
        // SAFETY: the lowest page of our own mapping becomes the guard.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The highest address: stacks grow down on every architecture we build for.
    pub(super) fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of our mapping, which is 16-byte aligned (page aligned).
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped, after the child is done with it.
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

/// Whether this kernel (and any seccomp filter around the runner) lets [`launch`] work:
/// `clone` with `CLONE_PIDFD` needs Linux 5.2, and a filter may refuse the flag. Tried
/// once, with a child that exits at once without touching anything.
pub fn clone_pidfd_works() -> bool {
    extern "C" fn exit_at_once(_: *mut libc::c_void) -> libc::c_int {
        // SAFETY: ends the child at once; it shares our memory and must not return into it.
        unsafe { libc::_exit(0) }
    }
    let Ok(stack) = Stack::new() else {
        return false;
    };
    let mut pidfd: libc::c_int = -1;
    // SAFETY: the child runs on its own stack, touches no memory of ours and exits at
    // once; CLONE_VFORK suspends this thread until it has.
    let pid = unsafe {
        libc::clone(
            exit_at_once,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            std::ptr::null_mut(),
            &mut pidfd as *mut libc::c_int,
        )
    };
    drop(stack);
    if pid <= 0 {
        return false;
    }
    let _ = reap(pid, true);
    if pidfd < 0 {
        return false;
    }
    // SAFETY: the kernel handed us this pidfd; nobody else owns it.
    drop(unsafe { OwnedFd::from_raw_fd(pidfd) });
    true
}

/// Reaps `pid` if it has exited (or waits for it, with `block`). Returns its raw wait
/// status for `ExitStatus::from_raw`, or `None` while it runs.
pub fn reap(pid: i32, block: bool) -> io::Result<Option<i32>> {
    let mut status = 0;
    let flags = if block { 0 } else { libc::WNOHANG };
    loop {
        // SAFETY: waitpid writes only `status`.
        let r = unsafe { libc::waitpid(pid, &mut status, flags) };
        if r == pid {
            return Ok(Some(status));
        }
        if r == 0 {
            return Ok(None);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Registers a pidfd with the tokio reactor, so that its exit can be awaited.
pub fn watch_pidfd(pidfd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd owns its descriptor for as long as the AsyncFd holds it and always
    // returns the same one from as_raw_fd.
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
            .map_err(|e| e.into_parts().1)
    }
}
