//! Starting a job's process: the argv, PATH candidates and environment made into C
//! strings before the child exists, handed with the job's descriptors to `sys` as one
//! plan (`sys::start`), which takes one of two launch paths with the same steps in the
//! same order (clone+vfork where the kernel allows, else fork and exec).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::JobError;
use crate::process::JobProcess;
use crate::proto::job::JobSpec;
use crate::supervisor::DEFAULT_PATH;
use crate::sys::dirfd::Dir;
use crate::sys::errno::Failure;
use crate::sys::spawn::Rlimits;
use crate::sys::start::{self, Step};

/// How job processes are started; `sys` makes the choice and takes either path.
pub use crate::sys::start::Method as LaunchMethod;

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
    /// The sandbox it starts in, when it does.
    #[cfg(target_os = "linux")]
    pub(super) sandbox: Option<crate::sys::sandbox::Sandbox<'a>>,
}

impl Launch<'_> {
    /// Starts the process the way the runner chose at start.
    pub(super) fn run(self, method: LaunchMethod) -> Result<JobProcess, JobError> {
        let ExecStrings {
            programs,
            argv,
            env,
            search,
        } = ExecStrings::new(self.spec, self.env)?;
        let program = &self.spec.argv[0];
        let plan = start::Plan {
            programs,
            argv,
            env,
            cwd: self.cwd.as_fd(),
            stdin: self.stdio.stdin,
            stdout: self.stdio.stdout,
            stderr: self.stdio.stderr,
            limits: self.limits,
            cgroup_procs: self.cgroup_procs,
            landlock: self.landlock,
        };
        let spawn_err = spawn_error(program);
        #[cfg(target_os = "linux")]
        if let Some(sb) = &self.sandbox {
            return match start::start_sandboxed(plan, sb) {
                Ok((launched, init)) => {
                    JobProcess::from_launched(launched, Some(init)).map_err(spawn_err)
                }
                Err(e) => Err(sandbox_error(self.spec, &search, e)),
            };
        }
        let started = start::start(plan, method).map_err(|e| {
            // A program looked up in PATH and not found is said as a shell says it, by
            // either path; any other failure names its step where it is known.
            let said = matches!(e.step, None | Some(Step::Exec))
                .then(|| not_found_in_path(program, &search, e.failure()))
                .flatten();
            match (said, e.step) {
                (Some(said), _) => spawn_err(said),
                (None, Some(step)) => JobError::Launch {
                    program: program.clone(),
                    step,
                    source: e.source,
                },
                (None, None) => spawn_err(e.source),
            }
        })?;
        match started {
            #[cfg(target_os = "linux")]
            start::Started::Pidfd(launched) => {
                JobProcess::from_launched(launched, None).map_err(spawn_err)
            }
            start::Started::Child(child) => Ok(JobProcess::Std(child)),
        }
    }
}

/// A sandboxed start that failed: at exec, as any start says it; before, naming the step
/// (and the mount) of the sandbox.
#[cfg(target_os = "linux")]
fn sandbox_error(spec: &JobSpec, search: &str, e: crate::sys::sandbox::SandboxError) -> JobError {
    let program = &spec.argv[0];
    // Its workspace or cwd is found again in the job's namespaces, by descriptor checks:
    // not the directory that was checked any more (ESTALE), or a symlink now (ELOOP).
    let swapped = matches!(e.source.raw_os_error(), Some(libc::ESTALE | libc::ELOOP));
    if let (Step::Mounts, true, Some(cwd)) = (e.step, swapped, &spec.cwd) {
        return JobError::CwdChanged { cwd: cwd.clone() };
    }
    let failure = crate::sys::errno::failure(&e.source);
    if e.step == Step::Exec {
        if let Some(said) = not_found_in_path(program, search, failure) {
            return spawn_error(program)(said);
        }
    }
    JobError::Launch {
        program: program.to_owned(),
        step: e.step,
        source: e.source,
    }
}

/// A failure to start `program`, as the job's record names it.
fn spawn_error(program: &str) -> impl Fn(io::Error) -> JobError + '_ {
    move |source| JobError::Spawn {
        program: program.to_owned(),
        source,
    }
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
fn not_found_in_path(program: &str, search: &str, failure: Failure) -> Option<io::Error> {
    if program.contains('/') {
        return None;
    }
    match failure {
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
