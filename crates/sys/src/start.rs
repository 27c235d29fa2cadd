//! Starting a job's process from one plan. `sys` chooses the path (clone+vfork where the
//! kernel allows it, see [`super::launch`]; else fork and exec, with the same steps in
//! the same order in std's `pre_exec`, see [`super::spawn`]) and says what failed as a
//! [`Step`] and a kind of failure ([`Failure`]), never as a bare errno.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::process::Stdio;

use super::child::Rlimits;
pub use super::child::Step;
use super::errno::{self, Failure};

/// How job processes are started, decided once when the runner starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)` (Linux 5.2+, see `sys::launch`): no
    /// copy of the runner's page tables, and a pidfd to wait on.
    CloneVfork,
    /// fork and exec: older kernels, seccomp filters that refuse `CLONE_PIDFD`, other
    /// systems. The same steps in the same order, in std's `pre_exec`.
    Fork,
}

impl Method {
    /// The best this host offers, unless `force_fork`. Logs when it falls back.
    pub fn detect(force_fork: bool) -> Self {
        if force_fork {
            tracing::info!("job launch: fork and exec (forced by --job-launch fork)");
            return Method::Fork;
        }
        #[cfg(target_os = "linux")]
        {
            if super::launch::clone_pidfd_works() {
                return Method::CloneVfork;
            }
            tracing::warn!("this kernel (or a seccomp filter) refuses clone with CLONE_PIDFD: jobs are started with fork and exec");
        }
        Method::Fork
    }

    /// For the runner's health report.
    pub fn name(self) -> &'static str {
        match self {
            Method::CloneVfork => "clone-vfork",
            Method::Fork => "fork",
        }
    }
}

/// Everything a job's process is made from, all of it prepared before the process
/// exists: the child may not allocate, and looks nothing up by path but its program.
pub struct Plan<'a> {
    /// The paths to try, in order, as execvp would try each entry of PATH (see
    /// [`super::launch::LaunchSpec::programs`]).
    pub programs: Vec<CString>,
    pub argv: Vec<CString>,
    /// `NAME=value` entries: the complete environment.
    pub env: Vec<CString>,
    /// The working directory, already resolved and checked, entered by descriptor.
    pub cwd: BorrowedFd<'a>,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub limits: Rlimits,
    /// An open `cgroup.procs` the child writes itself into before anything else.
    pub cgroup_procs: Option<BorrowedFd<'a>>,
    /// A Landlock ruleset the child restricts itself to, last before exec.
    pub landlock: Option<BorrowedFd<'a>>,
}

#[cfg(target_os = "linux")]
impl Plan<'_> {
    /// The plan as the clone paths read it.
    fn spec(&self) -> super::launch::LaunchSpec<'_> {
        super::launch::LaunchSpec {
            programs: &self.programs,
            argv: &self.argv,
            env: &self.env,
            cwd: self.cwd,
            stdin: self.stdin.as_fd(),
            stdout: self.stdout.as_fd(),
            stderr: self.stderr.as_fd(),
            limits: self.limits,
            cgroup_procs: self.cgroup_procs,
            landlock: self.landlock,
        }
    }
}

/// A started job process, leader of its own session and process group.
pub enum Started {
    /// From the clone path: its pid and a pidfd to wait on.
    #[cfg(target_os = "linux")]
    Pidfd(super::launch::Launched),
    /// From the fork path.
    Child(tokio::process::Child),
}

/// A job process that did not start: the step that failed, where the path knows it (the
/// fork path hears only the errno std passes back), and the system's reason.
#[derive(Debug, thiserror::Error)]
#[error("{} failed", .step.map_or_else(|| "the launch".to_owned(), |s| s.to_string()))]
pub struct StartError {
    pub step: Option<Step>,
    #[source]
    pub source: io::Error,
}

impl StartError {
    fn at(step: Step) -> impl FnOnce(io::Error) -> Self {
        move |source| Self {
            step: Some(step),
            source,
        }
    }

    /// What kind of failure it was.
    pub fn failure(&self) -> Failure {
        errno::failure(&self.source)
    }
}

/// Starts the process of `plan` by `method`.
pub fn start(plan: Plan<'_>, method: Method) -> Result<Started, StartError> {
    match method {
        #[cfg(target_os = "linux")]
        Method::CloneVfork => clone_vfork(plan),
        _ => fork_exec(plan),
    }
}

/// Starts the process of `plan` in a sandbox made as `sb` says (see `sys::sandbox`): its
/// PID 1 (pid and pidfd), and what PID 1 leaves the job's status in.
#[cfg(target_os = "linux")]
pub fn start_sandboxed(
    plan: Plan<'_>,
    sb: &super::sandbox::Sandbox<'_>,
) -> Result<(super::launch::Launched, super::sandbox::Init), super::sandbox::SandboxError> {
    super::sandbox::launch(&plan.spec(), sb)
}

/// Without fork (see `sys::launch`): setsid, join the job's cgroup, rlimits, stdio,
/// chdir, Landlock, exec.
#[cfg(target_os = "linux")]
fn clone_vfork(plan: Plan<'_>) -> Result<Started, StartError> {
    let launched = super::launch::launch(&plan.spec()).map_err(|e| StartError {
        step: Some(e.step),
        source: e.source,
    })?;
    Ok(Started::Pidfd(launched))
}

/// The portable path: std's fork, then the same preparation in `pre_exec` (see
/// `sys::spawn::job_exec`), which also does the exec, trying each PATH entry as the job
/// itself would.
fn fork_exec(plan: Plan<'_>) -> Result<Started, StartError> {
    let dup = |fd: BorrowedFd<'_>, step| fd.try_clone_to_owned().map_err(StartError::at(step));
    let exec = super::spawn::JobExec {
        cwd: dup(plan.cwd, Step::Chdir)?,
        cgroup_procs: plan
            .cgroup_procs
            .map(|fd| dup(fd, Step::JoinCgroup))
            .transpose()?,
        limits: plan.limits,
        landlock: plan
            .landlock
            .map(|fd| dup(fd, Step::Landlock))
            .transpose()?,
        programs: plan.programs,
        argv: plan.argv,
        env: plan.env,
    };
    let program = OsStr::from_bytes(exec.argv[0].as_bytes()).to_owned();
    let mut cmd = std::process::Command::new(program);
    cmd.env_clear()
        .stdin(Stdio::from(plan.stdin))
        .stdout(Stdio::from(plan.stdout))
        .stderr(Stdio::from(plan.stderr));
    super::spawn::job_exec(&mut cmd, exec);
    let child = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| StartError { step: None, source })?;
    Ok(Started::Child(child))
}
