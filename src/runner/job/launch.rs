//! Starting a job's process: the argv, PATH candidates and environment made into C
//! strings before the child exists, then one of two launch paths with the same steps in
//! the same order (clone+vfork where the kernel allows, else fork and exec).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::JobError;
use crate::proto::job::JobSpec;
use crate::runner::process::JobProcess;
use crate::supervisor::DEFAULT_PATH;
use crate::sys::dirfd::Dir;
use crate::sys::errno::{self, Failure};
use crate::sys::spawn::{self, Rlimits};

/// How job processes are started, decided once when the runner starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchMethod {
    /// `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)` (Linux 5.2+, see `sys::launch`): no
    /// copy of the runner's page tables, and a pidfd to wait on.
    CloneVfork,
    /// fork and exec: older kernels, seccomp filters that refuse `CLONE_PIDFD`, other
    /// systems. The same steps in the same order, in std's `pre_exec`.
    Fork,
}

impl LaunchMethod {
    /// The best this host offers, unless `force_fork`. Logs when it falls back.
    pub fn detect(force_fork: bool) -> Self {
        if force_fork {
            tracing::info!("job launch: fork and exec (forced by --job-launch fork)");
            return LaunchMethod::Fork;
        }
        #[cfg(target_os = "linux")]
        {
            if crate::sys::launch::clone_pidfd_works() {
                return LaunchMethod::CloneVfork;
            }
            tracing::warn!("this kernel (or a seccomp filter) refuses clone with CLONE_PIDFD: jobs are started with fork and exec");
        }
        LaunchMethod::Fork
    }

    /// For the runner's health report.
    pub fn name(self) -> &'static str {
        match self {
            LaunchMethod::CloneVfork => "clone-vfork",
            LaunchMethod::Fork => "fork",
        }
    }
}

/// The job's ends of its standard streams.
pub(super) struct Stdio3 {
    pub(super) stdin: OwnedFd,
    pub(super) stdout: OwnedFd,
    pub(super) stderr: OwnedFd,
}

/// Everything a job's process is made from, prepared before it exists; either launch
/// path takes it whole.
pub(super) struct Launch<'a> {
    pub(super) spec: &'a JobSpec,
    pub(super) env: &'a BTreeMap<String, String>,
    pub(super) cwd: &'a Dir,
    pub(super) stdio: Stdio3,
    pub(super) limits: Rlimits,
    /// The job's `cgroup.procs`, which the child joins before exec.
    pub(super) cgroup_procs: Option<BorrowedFd<'a>>,
    /// The Landlock ruleset the child restricts itself with.
    pub(super) landlock: Option<BorrowedFd<'a>>,
}

impl Launch<'_> {
    /// Starts the process the way the runner chose at start.
    pub(super) fn run(self, method: LaunchMethod) -> Result<JobProcess, JobError> {
        let strings = ExecStrings::new(self.spec, self.env)?;
        match method {
            #[cfg(target_os = "linux")]
            LaunchMethod::CloneVfork => clone_vfork(self, strings),
            _ => fork_exec(self, strings),
        }
    }
}

/// A failure to start `program`, as the job's record names it.
fn spawn_error(program: &str) -> impl Fn(io::Error) -> JobError + '_ {
    move |source| JobError::Spawn {
        program: program.to_owned(),
        source,
    }
}

/// Launches without fork (see `sys::launch`): setsid, join the job's cgroup, rlimits,
/// stdio, chdir, exec.
#[cfg(target_os = "linux")]
fn clone_vfork(l: Launch<'_>, strings: ExecStrings) -> Result<JobProcess, JobError> {
    use crate::sys::launch::{self, LaunchSpec};
    let program = &l.spec.argv[0];
    let spawn_err = spawn_error(program);
    let launched = launch::launch(&LaunchSpec {
        programs: &strings.programs,
        argv: &strings.argv,
        env: &strings.env,
        cwd: l.cwd.as_fd(),
        stdin: l.stdio.stdin.as_fd(),
        stdout: l.stdio.stdout.as_fd(),
        stderr: l.stdio.stderr.as_fd(),
        limits: l.limits,
        cgroup_procs: l.cgroup_procs,
        landlock: l.landlock,
    })
    .map_err(|e| {
        match (
            e.step,
            not_found_in_path(program, &strings.search, &e.source),
        ) {
            (launch::Step::Exec, Some(said)) => spawn_err(said),
            _ => JobError::Launch {
                program: program.clone(),
                step: e.step,
                source: e.source,
            },
        }
    })?;
    JobProcess::from_launched(launched).map_err(spawn_err)
}

/// What both launch paths hand the child: the PATH candidates, argv and environment as C
/// strings, made before the child exists (it may not allocate), and the PATH searched.
struct ExecStrings {
    programs: Vec<std::ffi::CString>,
    argv: Vec<std::ffi::CString>,
    env: Vec<std::ffi::CString>,
    search: String,
}

impl ExecStrings {
    fn new(spec: &JobSpec, env: &BTreeMap<String, String>) -> Result<Self, JobError> {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let nul = || JobError::Spawn {
            program: spec.argv[0].clone(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "NUL byte"),
        };
        let search = env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
        let programs = program_candidates(&spec.argv[0], search)
            .iter()
            .map(|p| CString::new(p.as_os_str().as_bytes()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| nul())?;
        let argv = spec
            .argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| nul())?;
        let env = env
            .iter()
            .map(|(k, v)| CString::new(format!("{k}={v}")))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| nul())?;
        Ok(Self {
            programs,
            argv,
            env,
            search: search.to_owned(),
        })
    }
}

/// A failed exec of a name looked up in PATH, said as a shell says it; `None` for a name
/// with a slash, or another error.
fn not_found_in_path(program: &str, search: &str, e: &io::Error) -> Option<io::Error> {
    if program.contains('/') {
        return None;
    }
    match errno::failure(e) {
        Failure::NotFound => Some(io::Error::new(
            io::ErrorKind::NotFound,
            format!("not found in PATH {search}"),
        )),
        Failure::Denied => Some(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("not executable (Permission denied) in PATH {search}"),
        )),
        _ => None,
    }
}

/// The paths execvp would try for `program`: itself when it has a slash, else it in each
/// entry of `search` (an empty entry is the working directory), relative entries kept
/// relative so that they are resolved from the job's own working directory.
fn program_candidates(program: &str, search: &str) -> Vec<PathBuf> {
    if program.contains('/') {
        return vec![PathBuf::from(program)];
    }
    search
        .split(':')
        .map(|dir| Path::new(if dir.is_empty() { "." } else { dir }).join(program))
        .collect()
}

/// The portable path: std's fork, then the same preparation as `launch` in `pre_exec`
/// (see `sys::spawn::job_exec`), which also does the exec, trying each PATH entry as the
/// job itself would.
fn fork_exec(l: Launch<'_>, strings: ExecStrings) -> Result<JobProcess, JobError> {
    let (program, stdio) = (&l.spec.argv[0], l.stdio);
    let spawn_err = spawn_error(program);
    let ExecStrings {
        programs,
        argv,
        env: c_env,
        search,
    } = strings;
    let dup = |fd: BorrowedFd<'_>| fd.try_clone_to_owned().map_err(&spawn_err);
    let exec = spawn::JobExec {
        cwd: dup(l.cwd.as_fd())?,
        cgroup_procs: l.cgroup_procs.map(dup).transpose()?,
        limits: l.limits,
        landlock: l.landlock.map(dup).transpose()?,
        programs,
        argv,
        env: c_env,
    };
    let mut cmd = std::process::Command::new(program);
    cmd.env_clear()
        .stdin(Stdio::from(stdio.stdin))
        .stdout(Stdio::from(stdio.stdout))
        .stderr(Stdio::from(stdio.stderr));
    spawn::job_exec(&mut cmd, exec);
    let child = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| spawn_err(not_found_in_path(program, &search, &e).unwrap_or(e)))?;
    Ok(JobProcess::Std(child))
}
