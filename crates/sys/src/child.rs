//! Steps a new job process takes on itself before exec, shared by both launch paths
//! (`launch`, the clone child; `spawn::job_exec`, the fork child). Each is plain system
//! calls on data prepared before the child existed: no allocation, no lock.

/// Resource limits a job's processes get before exec; `None` leaves the runner's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rlimits {
    pub address_space: Option<u64>,
    pub cpu_secs: Option<u64>,
    pub open_files: Option<u64>,
    pub processes: Option<u64>,
}

impl Rlimits {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Every signal handler back to the default: the runner's handlers must never run in a
/// job, and a job starts with standard dispositions (SIGPIPE included). On Linux the raw
/// system call, because glibc's wrapper refuses the signals it reserves (32, 33), and an
/// ignored disposition of those would survive exec. All zeroes is SIG_DFL with no flags in
/// the kernel's struct, whatever its layout; the buffer is larger than that struct on
/// every architecture.
///
/// # Safety
/// Only in a child between its creation and exec.
pub(super) unsafe fn reset_signal_handlers() {
    #[cfg(target_os = "linux")]
    {
        let dfl = [0u64; 8];
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    dfl.as_ptr(),
                    std::ptr::null_mut::<libc::c_void>(),
                    8usize,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    for sig in 1..32 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}

/// Whatever the runner has open stays out of the job, even a descriptor some library
/// opened without O_CLOEXEC: everything from 3 up is closed on exec. Best effort:
/// close_range needs Linux 5.11.
///
/// # Safety
/// Only in a child between its creation and exec.
pub(super) unsafe fn close_stray_descriptors() {
    #[cfg(target_os = "linux")]
    libc::syscall(
        libc::SYS_close_range,
        3 as libc::c_uint,
        libc::c_uint::MAX,
        libc::CLOSE_RANGE_CLOEXEC,
    );
}

/// Sets the job's rlimits, soft and hard; `false` when one was refused (errno says why).
///
/// # Safety
/// Only in a child between its creation and exec.
pub(super) unsafe fn set_rlimits(l: Rlimits) -> bool {
    #[cfg(not(target_os = "macos"))]
    let nproc = Some((libc::RLIMIT_NPROC, l.processes));
    #[cfg(target_os = "macos")]
    let nproc = None;
    for (res, v) in [
        Some((libc::RLIMIT_AS, l.address_space)),
        Some((libc::RLIMIT_CPU, l.cpu_secs)),
        Some((libc::RLIMIT_NOFILE, l.open_files)),
        nproc,
    ]
    .into_iter()
    .flatten()
    {
        if let Some(v) = v {
            let lim = libc::rlimit {
                rlim_cur: v as libc::rlim_t,
                rlim_max: v as libc::rlim_t,
            };
            if libc::setrlimit(res as _, &lim) < 0 {
                return false;
            }
        }
    }
    true
}

/// Records that a child failed at `step`, with the errno it left, in the cells (shared
/// with the runner) the runner reads once the child has gone.
pub(super) fn record_failure(
    step_cell: &std::sync::atomic::AtomicI32,
    errno_cell: &std::sync::atomic::AtomicI32,
    step: Step,
) {
    use std::sync::atomic::Ordering;
    let errno = std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL);
    errno_cell.store(errno, Ordering::SeqCst);
    step_cell.store(step.code(), Ordering::SeqCst);
}

/// The step of the launch that failed, so that an error says "chdir" rather than only the
/// errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Clone,
    Setsid,
    JoinCgroup,
    Setrlimit,
    Stdio,
    Chdir,
    Landlock,
    Exec,
    /// A sandbox's namespaces (`clone` with them, or the cgroup namespace).
    Namespaces,
    /// A sandbox's uid and gid maps.
    IdMaps,
    /// A mount of a sandbox's file system.
    Mounts,
    PivotRoot,
    Hostname,
    NoNewPrivs,
    Seccomp,
    /// The loopback of a sandbox's own network namespace.
    Loopback,
    /// The listening socket of the runner's proxy, in a sandbox's own network namespace.
    Proxy,
}

impl Step {
    pub(super) fn code(self) -> i32 {
        self as i32 + 1
    }

    pub(super) fn from_code(code: i32) -> Self {
        match code {
            2 => Step::Setsid,
            3 => Step::JoinCgroup,
            4 => Step::Setrlimit,
            5 => Step::Stdio,
            6 => Step::Chdir,
            7 => Step::Landlock,
            8 => Step::Exec,
            9 => Step::Namespaces,
            10 => Step::IdMaps,
            11 => Step::Mounts,
            12 => Step::PivotRoot,
            13 => Step::Hostname,
            14 => Step::NoNewPrivs,
            15 => Step::Seccomp,
            16 => Step::Loopback,
            17 => Step::Proxy,
            _ => Step::Clone,
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::Clone => "clone",
            Step::Setsid => "setsid",
            Step::JoinCgroup => "join its cgroup",
            Step::Setrlimit => "setrlimit",
            Step::Stdio => "set up stdin/stdout/stderr",
            Step::Chdir => "chdir to its working directory",
            Step::Landlock => "restrict itself to its Landlock ruleset",
            Step::Exec => "execve",
            Step::Namespaces => "make its namespaces (user, mount, PID, IPC, UTS, cgroup, network)",
            Step::IdMaps => "map its uid and gid in its user namespace",
            Step::Mounts => "mount its file system",
            Step::PivotRoot => "enter its own root (pivot_root)",
            Step::Hostname => "set its hostname",
            Step::NoNewPrivs => "set no_new_privs",
            Step::Seccomp => "install its seccomp filter",
            Step::Loopback => "bring up the loopback of its network namespace",
            Step::Proxy => "listen for the egress proxy in its network namespace",
        })
    }
}
