//! A job in namespaces of its own (Linux; docs/security.md, "A sandbox for every job"):
//! user, mount, PID, IPC, UTS and cgroup namespaces, made by the runner's unprivileged
//! account, with a PID 1 that reaps and forwards signals, and a root of its own.
//!
//! Three processes take part, and they share the runner's memory (`CLONE_VM`), so that
//! making a sandbox never copies the runner's page tables (see `launch`, why):
//!
//! 1. The runner's thread clones **PID 1** into the new namespaces, on a stack of its own,
//!    without `CLONE_VFORK`, and waits on a pipe.
//! 2. PID 1 joins the job's cgroup and takes a cgroup namespace rooted there, maps the
//!    runner's uid and gid to themselves, and builds the job's file system in the order
//!    bubblewrap does: every mount private; a recursive copy of `/` made read-only in one
//!    call (`open_tree` + `mount_setattr(AT_RECURSIVE)`) attached at the sandbox's mount
//!    point; private tmpfs, a minimal `/dev`, its own `/proc`, the workspace and the shared
//!    directories bound read-write, the state directory hidden; `pivot_root` into it and
//!    the old root detached; its own hostname.
//! 3. PID 1 clones **the job** (`CLONE_VM | CLONE_VFORK`), which takes the steps of every
//!    launch (setsid, rlimits, stdio, cwd) and then `no_new_privs`, Landlock and the seccomp
//!    filter, and execs. PID 1 tells the runner through the pipe, and from then on runs on
//!    its own stack only: it blocks every signal and waits for them (`sigwaitinfo`), sends
//!    each but `SIGCHLD` to every process of the namespace (`kill(-1)`, so a `setsid`
//!    escapee gets the job's SIGTERM too), reaps orphans, and once the job's own process
//!    has ended writes its wait status where the runner reads it ([`Init`]) and exits.
//!    Its exit ends every process left in the namespace (the kernel SIGKILLs them), and a
//!    SIGKILL of PID 1 from outside does the same.
//!
//! Everything the two children use is prepared before the first clone: they allocate
//! nothing, take no lock, and make plain system calls; a failure is a [`Step`] (and, for a
//! mount, its index) and an errno in shared memory.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use super::child::Step;
use super::launch::{LaunchError, LaunchSpec, Launched, Stack};
use super::ProcessId;

// From <linux/mount.h>; stable kernel ABI.
const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// One step of building the job's file system, all paths absolute and under the
/// sandbox's mount point (`target`) or on the host (`source`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// A tmpfs at `target` with `options` (`size=…,mode=…`).
    Tmpfs { target: CString, options: CString },
    /// A directory made (0755) where a tmpfs made before allows it.
    Dir { path: CString },
    /// `source` bound onto `target`, read-write; `file`: `target` is made as an empty
    /// file first (a device node, say), else it must be a directory.
    Bind {
        source: CString,
        target: CString,
        file: bool,
    },
    /// The directory `rel` beneath `base` bound onto `target`, read-write: found again in
    /// the job's mount namespace (a descriptor of the runner's leads to mounts of another
    /// namespace, which cannot be bound) with no symlink and nothing outside `base` on the
    /// way, and bound only if it is the very directory the runner checked (`dev`, `ino`).
    BindChecked {
        base: CString,
        rel: CString,
        dev: u64,
        ino: u64,
        target: CString,
    },
    /// A symlink at `at` pointing to `to`.
    Symlink { to: CString, at: CString },
    /// The namespace's own `/proc`.
    Proc { target: CString },
    /// A devpts instance of the job's own.
    Devpts { target: CString },
    /// A directory made 0700 where a tmpfs made before allows it.
    PrivateDir { path: CString },
    /// A file made (never opened if it exists) 0400 with `content`.
    File { path: CString, content: Hidden },
}

/// Bytes a `Debug` of a mount never shows (a secret's value).
#[derive(Clone, PartialEq, Eq)]
pub struct Hidden(pub Vec<u8>);

impl std::fmt::Debug for Hidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({} bytes)", self.0.len())
    }
}

/// What makes a job's sandbox, beyond its launch.
pub struct Sandbox<'a> {
    /// The empty directory the new root is attached at before `pivot_root`.
    pub root: &'a CStr,
    /// `/proc/self/uid_map` and `gid_map` lines: the runner's ids mapped to themselves.
    pub uid_map: &'a CStr,
    pub gid_map: &'a CStr,
    pub mounts: &'a [Mount],
    pub hostname: &'a CStr,
    /// The job's working directory, as a path in its new root (entered after the pivot:
    /// a descriptor would lead back into the old tree).
    pub cwd: &'a CStr,
    /// A seccomp filter the job installs last before exec.
    pub seccomp: Option<&'a Filter>,
    /// A network namespace of its own, with its loopback up and nothing else.
    pub own_network: bool,
    /// In that namespace, a TCP socket listening on `127.0.0.1:port`, made by PID 1 and
    /// handed to the runner ([`Init::take_proxy`]): the egress proxy's door, which the
    /// runner serves from the host's namespace.
    pub proxy_port: Option<u16>,
}

/// Seccomp-BPF programs, as `prctl(PR_SET_SECCOMP)` takes each, installed in order (the
/// kernel runs them all; for the same kind of answer, the last installed wins).
pub struct Filter {
    programs: Vec<Vec<libc::sock_filter>>,
}

impl Filter {
    pub fn new(programs: Vec<Vec<libc::sock_filter>>) -> Self {
        Self { programs }
    }

    fn fprogs(&self) -> Vec<libc::sock_fprog> {
        self.programs
            .iter()
            .map(|p| libc::sock_fprog {
                len: p.len() as libc::c_ushort,
                filter: p.as_ptr() as *mut libc::sock_filter,
            })
            .collect()
    }
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lens: Vec<usize> = self.programs.iter().map(Vec::len).collect();
        write!(f, "Filter({lens:?} instructions)")
    }
}

// SAFETY: the programs are plain data, never mutated after they are made.
unsafe impl Send for Filter {}
// SAFETY: as above: shared, the programs are only read.
unsafe impl Sync for Filter {}

/// Why a sandbox could not be made: the step, the mount it was at (its index in
/// [`Sandbox::mounts`]) and the errno.
#[derive(Debug, thiserror::Error)]
#[error("{step} failed")]
pub struct SandboxError {
    pub step: Step,
    pub mount: Option<usize>,
    #[source]
    pub source: io::Error,
}

impl From<LaunchError> for SandboxError {
    fn from(e: LaunchError) -> Self {
        Self {
            step: e.step,
            mount: None,
            source: e.source,
        }
    }
}

/// Held while a PID 1 makes its sandbox.
static SETUP: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The job's wait status, which PID 1 writes before it exits.
#[derive(Debug)]
struct StatusCell {
    /// `i32::MIN` until written.
    status: AtomicI32,
}

/// A sandbox's PID 1, as the runner keeps it until it has reaped it: its stack (PID 1
/// runs on it, in the runner's memory) and where it leaves the job's status.
#[derive(Debug)]
pub struct Init {
    cell: Arc<StatusCell>,
    _stack: Stack,
    proxy: Option<OwnedFd>,
}

impl Init {
    /// The job's own wait status (for `ExitStatus::from_raw`), once PID 1 has exited;
    /// `None` when PID 1 was killed before the job ended (its own status then says how).
    pub fn job_status(&self) -> Option<i32> {
        let s = self.cell.status.load(Ordering::SeqCst);
        (s != i32::MIN).then_some(s)
    }

    /// The listening socket PID 1 made in the job's network namespace, once.
    pub fn take_proxy(&mut self) -> Option<OwnedFd> {
        self.proxy.take()
    }
}

/// What both children share with the runner's waiting thread.
struct Shared<'a> {
    spec: &'a LaunchSpec<'a>,
    sb: &'a Sandbox<'a>,
    programs: *const *const libc::c_char,
    programs_len: usize,
    argv: *const *const libc::c_char,
    env: *const *const libc::c_char,
    stdio: [RawFd; 3],
    fprogs: *const libc::sock_fprog,
    fprogs_len: usize,
    /// Set up only, run no job: a probe.
    probe: bool,
    job_stack: *mut libc::c_void,
    /// PID 1 writes one byte here once the job has exec'd (or failed).
    ready: RawFd,
    /// PID 1 sends the proxy's listening socket here (-1: no proxy).
    proxy_tx: RawFd,
    cell: *const StatusCell,
    step: AtomicI32,
    mount: AtomicI32,
    errno: AtomicI32,
}

/// Starts `spec` in a sandbox made as `sb` says. Returns once the job has exec'd (or
/// failed to): its PID 1 (leader of its own session and process group, with a pidfd) and
/// the [`Init`] to keep until it is reaped.
pub fn launch(spec: &LaunchSpec<'_>, sb: &Sandbox<'_>) -> Result<(Launched, Init), SandboxError> {
    run(spec, sb, false)
}

/// Makes a sandbox as `sb` says and ends it at once, running nothing: whether this host
/// lets the runner make one, and if not, which step refused.
pub fn probe(spec: &LaunchSpec<'_>, sb: &Sandbox<'_>) -> Result<(), SandboxError> {
    let (launched, _init) = run(spec, sb, true)?;
    let _ = super::launch::reap(launched.pid.get(), true);
    Ok(())
}

fn run(
    spec: &LaunchSpec<'_>,
    sb: &Sandbox<'_>,
    probe: bool,
) -> Result<(Launched, Init), SandboxError> {
    let fail = |step: Step| {
        move |source: io::Error| SandboxError {
            step,
            mount: None,
            source,
        }
    };
    let strings = super::launch::Strings::new(spec).map_err(fail(Step::Stdio))?;
    let (ready_r, ready_w) = super::pipe::pipe().map_err(fail(Step::Clone))?;
    let init_stack = Stack::new().map_err(fail(Step::Clone))?;
    let job_stack = Stack::new().map_err(fail(Step::Clone))?;
    let cell = Arc::new(StatusCell {
        status: AtomicI32::new(i32::MIN),
    });
    let fprogs = sb.seccomp.map(Filter::fprogs).unwrap_or_default();
    let proxy = match sb.proxy_port {
        Some(_) if sb.own_network => Some(super::fdpass::pair().map_err(fail(Step::Proxy))?),
        _ => None,
    };
    // One sandbox made at a time (see `init` on the maps).
    let _one = SETUP
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let shared = Shared {
        spec,
        sb,
        programs: strings.programs.as_ptr(),
        programs_len: strings.programs.len(),
        argv: strings.argv.as_ptr(),
        env: strings.env.as_ptr(),
        stdio: strings.stdio,
        fprogs: fprogs.as_ptr(),
        fprogs_len: fprogs.len(),
        probe,
        job_stack: job_stack.top(),
        ready: ready_w.as_raw_fd(),
        proxy_tx: proxy.as_ref().map_or(-1, |(_, tx)| tx.as_raw_fd()),
        cell: Arc::as_ptr(&cell),
        step: AtomicI32::new(0),
        mount: AtomicI32::new(-1),
        errno: AtomicI32::new(0),
    };
    let net = if sb.own_network {
        libc::CLONE_NEWNET
    } else {
        0
    };
    let flags = libc::CLONE_VM
        | libc::CLONE_PIDFD
        | libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | net
        | libc::SIGCHLD;
    let mut pidfd: libc::c_int = -1;
    let mask = super::launch::BlockedSignals::all();
    // SAFETY: PID 1 runs on `init_stack` (kept mapped by the returned `Init` for as long
    // as it lives) and reads `shared` only until it writes to the pipe, which this thread
    // waits for below, `shared` living on this frame until then. CLONE_PIDFD stores the
    // pidfd in `pidfd`.
    let pid = unsafe {
        libc::clone(
            init,
            init_stack.top(),
            flags,
            &shared as *const Shared<'_> as *mut libc::c_void,
            &mut pidfd as *mut libc::c_int,
        )
    };
    let clone_err = io::Error::last_os_error();
    drop(mask);
    drop(ready_w);
    if pid < 0 {
        return Err(SandboxError {
            step: Step::Namespaces,
            mount: None,
            source: clone_err,
        });
    }
    // SAFETY: the kernel handed us this pidfd; nobody else owns it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    // One byte once the job has exec'd; nothing (end of file) if PID 1 ended first.
    let mut byte = [0u8; 1];
    let _ = super::pipe::read_now(&ready_r, &mut byte);
    drop(strings);
    drop(fprogs);
    let step = shared.step.load(Ordering::SeqCst);
    if step != 0 {
        let _ = super::launch::reap(pid, true);
        let mount = shared.mount.load(Ordering::SeqCst);
        return Err(SandboxError {
            step: Step::from_code(step),
            mount: usize::try_from(mount).ok(),
            source: io::Error::from_raw_os_error(shared.errno.load(Ordering::SeqCst)),
        });
    }
    drop(job_stack);
    let proxy = match proxy {
        Some((rx, _tx)) => match super::fdpass::recv_now(&rx) {
            Ok(fd) => Some(fd),
            Err(source) => {
                let _ = super::launch::reap(pid, true);
                return Err(SandboxError {
                    step: Step::Proxy,
                    mount: None,
                    source,
                });
            }
        },
        None => None,
    };
    let pid = ProcessId::new(pid).ok_or_else(|| SandboxError {
        step: Step::Clone,
        mount: None,
        source: io::Error::other(format!("clone returned pid {pid}")),
    })?;
    Ok((
        Launched { pid, pidfd },
        Init {
            cell,
            _stack: init_stack,
            proxy,
        },
    ))
}

/// Records `step` (and the errno) for the runner.
fn failed(sh: &Shared<'_>, step: Step) -> libc::c_int {
    super::child::record_failure(&sh.step, &sh.errno, step);
    127
}

/// PID 1 of the new namespaces. Plain system calls only; see the module doc.
extern "C" fn init(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Shared` of the runner's frame, which waits on the pipe.
    let sh = unsafe { &*(arg as *const Shared<'_>) };
    // SAFETY: the whole block: each call is one system call on memory prepared before the
    // clone, valid while the runner waits; PID 1 keeps every signal blocked (they were
    // blocked around the clone) and takes them with sigwaitinfo only.
    unsafe {
        super::child::reset_signal_handlers();
        // A copy of every descriptor of the runner came with the clone, and PID 1 never
        // execs: the runner's lock, socket and database must not outlive the runner in it.
        let keep = [
            sh.stdio[0],
            sh.stdio[1],
            sh.stdio[2],
            sh.ready,
            sh.proxy_tx,
            sh.spec.cgroup_procs.map_or(-1, |f| f.as_raw_fd()),
            sh.spec.landlock.map_or(-1, |f| f.as_raw_fd()),
        ];
        close_all_but(keep);
        if libc::setsid() < 0 {
            return bail(sh, Step::Setsid);
        }
        if let Some(fd) = sh.spec.cgroup_procs {
            if libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                return bail(sh, Step::JoinCgroup);
            }
            if libc::unshare(libc::CLONE_NEWCGROUP) < 0 {
                return bail(sh, Step::Namespaces);
            }
        }
        // The runner is not dumpable (so its own account cannot read its memory), and
        // the memory is PID 1's too: /proc/self then belongs to root, and the maps cannot
        // be written. Dumpable for those three writes only, one sandbox at a time (the
        // runner holds SETUP meanwhile), and jobs see no process outside their namespace.
        let dumpable = libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0);
        libc::prctl(libc::PR_SET_DUMPABLE, 1 as libc::c_ulong, 0, 0, 0);
        let mapped = write_file(c"/proc/self/setgroups", b"deny")
            && write_file(c"/proc/self/uid_map", sh.sb.uid_map.to_bytes())
            && write_file(c"/proc/self/gid_map", sh.sb.gid_map.to_bytes());
        libc::prctl(
            libc::PR_SET_DUMPABLE,
            dumpable.max(0) as libc::c_ulong,
            0,
            0,
            0,
        );
        if !mapped {
            return bail(sh, Step::IdMaps);
        }
        if let Err(step) = build_root(sh) {
            return bail(sh, step);
        }
        if libc::sethostname(sh.sb.hostname.as_ptr(), sh.sb.hostname.to_bytes().len()) < 0 {
            return bail(sh, Step::Hostname);
        }
        if sh.sb.own_network && !loopback_up() {
            return bail(sh, Step::Loopback);
        }
        if let (Some(port), true) = (sh.sb.proxy_port, sh.proxy_tx >= 0) {
            if !hand_over_listener(port, sh.proxy_tx) {
                return bail(sh, Step::Proxy);
            }
        }
        if sh.probe {
            libc::close(sh.ready);
            libc::_exit(0);
        }
        // The job: it shares this memory until it execs, and PID 1 waits meanwhile.
        let job = libc::clone(
            job,
            sh.job_stack,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            arg,
        );
        if job < 0 {
            return bail(sh, Step::Clone);
        }
        let cell = sh.cell;
        let failed_early = sh.step.load(Ordering::SeqCst) != 0;
        // The runner reads the outcome and may let `sh` go from here on; PID 1 keeps no
        // descriptor at all (the job has its own).
        libc::write(sh.ready, b"1".as_ptr().cast(), 1);
        libc::syscall(
            libc::SYS_close_range,
            0 as libc::c_uint,
            libc::c_uint::MAX,
            0,
        );
        if failed_early {
            let mut st = 0;
            libc::waitpid(job, &mut st, 0);
            libc::_exit(127);
        }
        reap_and_forward(job, cell)
    }
}

/// Brings up the loopback interface of PID 1's new network namespace (down when made),
/// which its user namespace's capabilities allow.
///
/// # Safety
/// Only in PID 1, after its id maps are written.
unsafe fn loopback_up() -> bool {
    let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
    if s < 0 {
        return false;
    }
    let mut req: libc::ifreq = std::mem::zeroed();
    for (to, from) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *to = *from as libc::c_char;
    }
    let ok = libc::ioctl(s, libc::SIOCGIFFLAGS, &mut req) == 0 && {
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        libc::ioctl(s, libc::SIOCSIFFLAGS, &req) == 0
    };
    libc::close(s);
    ok
}

/// Listens on `127.0.0.1:port` in PID 1's network namespace and sends the socket to the
/// runner through `tx`; PID 1 keeps neither.
///
/// # Safety
/// Only in PID 1, after its loopback is up.
unsafe fn hand_over_listener(port: u16, tx: RawFd) -> bool {
    let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
    if s < 0 {
        return false;
    }
    let mut addr: libc::sockaddr_in = std::mem::zeroed();
    addr.sin_family = libc::AF_INET as libc::sa_family_t;
    addr.sin_port = port.to_be();
    addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
    let ok = libc::bind(
        s,
        (&addr as *const libc::sockaddr_in).cast(),
        std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
    ) == 0
        && libc::listen(s, 1024) == 0
        && super::fdpass::send(tx, s);
    libc::close(s);
    libc::close(tx);
    ok
}

/// Closes every descriptor but those in `keep` (-1: none).
///
/// # Safety
/// Only in PID 1, before anything else opens one.
unsafe fn close_all_but(mut keep: [RawFd; 7]) {
    keep.sort_unstable();
    let mut from: libc::c_uint = 0;
    for fd in keep {
        if fd < 0 {
            continue;
        }
        let fd = fd as libc::c_uint;
        if fd > from {
            libc::syscall(libc::SYS_close_range, from, fd - 1, 0);
        }
        from = fd + 1;
    }
    libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, 0);
}

/// Tells the runner PID 1 failed at `step`, and ends it.
///
/// # Safety
/// Only in PID 1 before it writes to the pipe.
unsafe fn bail(sh: &Shared<'_>, step: Step) -> libc::c_int {
    failed(sh, step);
    libc::close(sh.ready);
    libc::_exit(127)
}

/// The rest of PID 1's life, on its own stack: forwards every signal to the namespace,
/// reaps, and leaves the status of `job` in `cell` when it ends.
///
/// # Safety
/// Only in PID 1, with every signal blocked.
unsafe fn reap_and_forward(job: libc::pid_t, cell: *const StatusCell) -> ! {
    let mut all: libc::sigset_t = std::mem::zeroed();
    libc::sigfillset(&mut all);
    loop {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let sig = libc::sigwaitinfo(&all, &mut info);
        if sig < 0 {
            continue;
        }
        if sig != libc::SIGCHLD {
            // Every process of the namespace but PID 1 itself.
            libc::kill(-1, sig);
            continue;
        }
        loop {
            let mut st = 0;
            let pid = libc::waitpid(-1, &mut st, libc::WNOHANG);
            if pid <= 0 {
                break;
            }
            if pid == job {
                // SAFETY: the runner keeps the cell until it has reaped this process.
                (*cell).status.store(st, Ordering::SeqCst);
                libc::_exit(0);
            }
        }
    }
}

/// Writes `data` to `path` (a /proc file) in one call.
///
/// # Safety
/// Plain system calls; for the children before exec.
unsafe fn write_file(path: &CStr, data: &[u8]) -> bool {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return false;
    }
    let ok = libc::write(fd, data.as_ptr().cast(), data.len()) == data.len() as isize;
    libc::close(fd);
    ok
}

/// The job's file system, as the module doc says; the step that failed.
///
/// # Safety
/// Only in PID 1, in its new mount namespace.
unsafe fn build_root(sh: &Shared<'_>) -> Result<(), Step> {
    let none = std::ptr::null::<libc::c_char>();
    if libc::mount(
        none,
        c"/".as_ptr(),
        none,
        libc::MS_REC | libc::MS_PRIVATE,
        std::ptr::null(),
    ) < 0
    {
        return Err(Step::Mounts);
    }
    let tree = libc::syscall(
        libc::SYS_open_tree,
        libc::AT_FDCWD,
        c"/".as_ptr(),
        OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint,
    ) as libc::c_int;
    if tree < 0 {
        return Err(Step::Mounts);
    }
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    if libc::syscall(
        libc::SYS_mount_setattr,
        tree,
        c"".as_ptr(),
        (libc::AT_EMPTY_PATH as libc::c_uint) | AT_RECURSIVE,
        &attr as *const MountAttr,
        std::mem::size_of::<MountAttr>(),
    ) < 0
    {
        libc::close(tree);
        return Err(Step::Mounts);
    }
    let moved = libc::syscall(
        libc::SYS_move_mount,
        tree,
        c"".as_ptr(),
        libc::AT_FDCWD,
        sh.sb.root.as_ptr(),
        MOVE_MOUNT_F_EMPTY_PATH,
    );
    libc::close(tree);
    if moved < 0 {
        return Err(Step::Mounts);
    }
    for (i, m) in sh.sb.mounts.iter().enumerate() {
        if !apply(m) {
            sh.mount.store(i as i32, Ordering::SeqCst);
            return Err(Step::Mounts);
        }
    }
    if libc::chdir(sh.sb.root.as_ptr()) < 0
        || libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) < 0
        || libc::umount2(c".".as_ptr(), libc::MNT_DETACH) < 0
        || libc::chdir(c"/".as_ptr()) < 0
    {
        return Err(Step::PivotRoot);
    }
    Ok(())
}

/// One step of [`build_root`].
///
/// # Safety
/// Only in PID 1, in its new mount namespace.
unsafe fn apply(m: &Mount) -> bool {
    let none = std::ptr::null::<libc::c_char>();
    let fixed = (libc::MS_NOSUID | libc::MS_NODEV) as libc::c_ulong;
    match m {
        Mount::Tmpfs { target, options } => {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                fixed,
                options.as_ptr().cast(),
            ) == 0
        }
        Mount::Dir { path } => {
            libc::mkdir(path.as_ptr(), 0o755) == 0 || *libc::__errno_location() == libc::EEXIST
        }
        Mount::Bind {
            source,
            target,
            file,
        } => {
            if *file {
                let fd = libc::open(
                    target.as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                    0o644,
                );
                if fd < 0 {
                    return false;
                }
                libc::close(fd);
            }
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                none,
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ) == 0
        }
        Mount::BindChecked {
            base,
            rel,
            dev,
            ino,
            target,
        } => bind_checked(base, rel, (*dev, *ino), target),
        Mount::Symlink { to, at } => libc::symlink(to.as_ptr(), at.as_ptr()) == 0,
        Mount::Proc { target } => {
            libc::mount(
                c"proc".as_ptr(),
                target.as_ptr(),
                c"proc".as_ptr(),
                fixed | libc::MS_NOEXEC as libc::c_ulong,
                std::ptr::null(),
            ) == 0
        }
        Mount::Devpts { target } => {
            libc::mount(
                c"devpts".as_ptr(),
                target.as_ptr(),
                c"devpts".as_ptr(),
                (libc::MS_NOSUID | libc::MS_NOEXEC) as libc::c_ulong,
                c"newinstance,ptmxmode=0666,mode=620".as_ptr().cast(),
            ) == 0
        }
        Mount::PrivateDir { path } => libc::mkdir(path.as_ptr(), 0o700) == 0,
        Mount::File { path, content } => write_new(path, &content.0),
    }
}

/// [`Mount::File`]: a new file, 0400, holding `content`.
///
/// # Safety
/// Only in PID 1, in its new mount namespace.
unsafe fn write_new(path: &CStr, content: &[u8]) -> bool {
    let fd = libc::open(
        path.as_ptr(),
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        0o400,
    );
    if fd < 0 {
        return false;
    }
    let mut at = 0;
    while at < content.len() {
        let n = libc::write(fd, content[at..].as_ptr().cast(), content.len() - at);
        if n <= 0 {
            libc::close(fd);
            return false;
        }
        at += n as usize;
    }
    libc::close(fd) == 0
}

/// [`Mount::BindChecked`]: opens `rel` beneath `base` with no symlink, no magic link and
/// nothing outside it on the way (`openat2`), checks it is `(dev, ino)`, and binds it
/// from its descriptor. (The runner's own descriptor cannot be bound: its mount is in the
/// runner's namespace, and the kernel binds only from the caller's.)
///
/// # Safety
/// Only in PID 1, in its new mount namespace.
unsafe fn bind_checked(base: &CStr, rel: &CStr, (dev, ino): (u64, u64), target: &CStr) -> bool {
    const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
    const RESOLVE_NO_SYMLINKS: u64 = 0x04;
    const RESOLVE_BENEATH: u64 = 0x08;
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    let dir = libc::open(base.as_ptr(), flags as libc::c_int | libc::O_NOFOLLOW);
    if dir < 0 {
        return false;
    }
    let how = OpenHow {
        flags,
        mode: 0,
        resolve: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    let mut fd = libc::syscall(
        libc::SYS_openat2,
        dir,
        rel.as_ptr(),
        &how as *const OpenHow,
        std::mem::size_of::<OpenHow>(),
    ) as libc::c_int;
    if fd < 0 && *libc::__errno_location() == libc::ENOSYS {
        // Where a seccomp filter hides openat2 (systemd-nspawn's in Debian 12, for one), a
        // plain open: the inode check below still refuses anything but the very directory.
        fd = libc::openat(dir, rel.as_ptr(), flags as libc::c_int | libc::O_NOFOLLOW);
    }
    libc::close(dir);
    if fd < 0 {
        return false;
    }
    let mut st: libc::stat = std::mem::zeroed();
    let same = libc::fstat(fd, &mut st) == 0 && st.st_dev as u64 == dev && st.st_ino as u64 == ino;
    if !same {
        libc::close(fd);
        *libc::__errno_location() = libc::ESTALE;
        return false;
    }
    // "/proc/self/fd/N", written without allocating.
    let mut path = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let mut digits = [0u8; 10];
    let (mut n, mut len) = (fd as u32, 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        path[14 + i] = digits[len - 1 - i];
    }
    let ok = libc::mount(
        path.as_ptr().cast(),
        target.as_ptr(),
        std::ptr::null(),
        libc::MS_BIND,
        std::ptr::null(),
    ) == 0;
    libc::close(fd);
    ok
}

/// The job's process: the steps of every launch, then no_new_privs, Landlock and the
/// seccomp filter, and exec. Shares PID 1's (the runner's) memory until then.
extern "C" fn job(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the runner's `Shared`, valid while PID 1 is suspended (vfork).
    let sh = unsafe { &*(arg as *const Shared<'_>) };
    // SAFETY: the whole block: plain system calls on memory prepared before the clones.
    unsafe {
        super::child::reset_signal_handlers();
        if libc::setsid() < 0 {
            return exit_failed(sh, Step::Setsid);
        }
        if !super::child::set_rlimits(sh.spec.limits) {
            return exit_failed(sh, Step::Setrlimit);
        }
        for (target, &src) in sh.stdio.iter().enumerate() {
            if libc::dup2(src, target as RawFd) < 0 {
                return exit_failed(sh, Step::Stdio);
            }
        }
        super::child::close_stray_descriptors();
        if libc::chdir(sh.sb.cwd.as_ptr()) < 0 {
            return exit_failed(sh, Step::Chdir);
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) < 0 {
            return exit_failed(sh, Step::NoNewPrivs);
        }
        if let Some(ruleset) = sh.spec.landlock {
            if !super::landlock::restrict_self(ruleset.as_raw_fd()) {
                return exit_failed(sh, Step::Landlock);
            }
        }
        for i in 0..sh.fprogs_len {
            if libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                sh.fprogs.add(i),
            ) < 0
            {
                return exit_failed(sh, Step::Seccomp);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        let err = super::launch::exec_first(sh.programs, sh.programs_len, sh.argv, sh.env);
        *libc::__errno_location() = err;
        exit_failed(sh, Step::Exec)
    }
}

/// Records `step` and ends the job's process.
///
/// # Safety
/// Only in the job's process before exec.
unsafe fn exit_failed(sh: &Shared<'_>, step: Step) -> libc::c_int {
    failed(sh, step);
    libc::_exit(127)
}
