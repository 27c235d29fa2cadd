//! One job process: the hardened spawn (the single choke point for every job process) and
//! the spooling of its output.
//!
//! A job is argv, never a shell string. Its environment is a small baseline plus the
//! spec's variables (loader variables were refused at submission). Its working directory
//! is opened once, beneath the workspace root and through no symlink, and that descriptor
//! is what is checked, what its Landlock rule is made from and what the child `fchdir`s
//! to: no checked path is ever resolved again. It leads its own session and
//! process group, gets the spec's rlimits before exec, and reads /dev/null unless the spec
//! gives stdin. Output goes to append-only spool files as it is produced, each capped.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use thiserror::Error;

use super::confine::{self, Tiers};
use super::process::JobProcess;
use crate::proto::job::JobSpec;
use crate::supervisor::DEFAULT_PATH;
use crate::sys::dirfd::Dir;
use crate::sys::pipe;
use crate::sys::spawn::{self, Rlimits};
use crate::util::clip;

/// Set in every job's environment to the job's id.
pub const JOB_ID_VAR: &str = crate::env_vars::JOB_ID;

/// The runner's directories for jobs, each opened once when the runner starts: what is
/// made or opened below them goes through these descriptors.
#[derive(Debug, Clone)]
pub struct JobPaths {
    /// `<runner>/work`: every job's working directory must resolve inside it.
    pub work_root: PathBuf,
    /// `<runner>/jobs`: spool files.
    pub spool_root: PathBuf,
    work: Arc<Dir>,
    spool: Arc<Dir>,
}

impl JobPaths {
    /// Creates (0700) and opens `<runner>/work` and `<runner>/jobs`.
    pub fn open(runner_dir: &Path) -> Result<Self, JobError> {
        let open = |name: &str| -> Result<(PathBuf, Arc<Dir>), JobError> {
            let path = runner_dir.join(name);
            let dir = Dir::open(runner_dir)
                .and_then(|d| d.make_child(name, 0o700))
                .map_err(io_err(&path))?;
            Ok((path, Arc::new(dir)))
        };
        let (work_root, work) = open("work")?;
        let (spool_root, spool) = open("jobs")?;
        Ok(Self {
            work_root,
            spool_root,
            work,
            spool,
        })
    }

    pub fn workspace(&self, id: &str) -> PathBuf {
        self.work_root.join(id)
    }

    pub fn spool_dir(&self, id: &str) -> PathBuf {
        self.spool_root.join(id)
    }

    pub fn spool_file(&self, id: &str, stream: Stream) -> PathBuf {
        self.spool_dir(id).join(stream.name())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "stdout" => Some(Stream::Stdout),
            "stderr" => Some(Stream::Stderr),
            _ => None,
        }
    }
}

#[derive(Debug, Error)]
pub enum JobError {
    #[error("field cwd {:?} resolves to {resolved}, outside the workspace root {root}", clip(.cwd))]
    CwdOutside {
        cwd: String,
        resolved: PathBuf,
        root: PathBuf,
    },
    #[error("field cwd {:?} does not exist in the workspace ({path})", clip(.cwd))]
    CwdMissing { cwd: String, path: PathBuf },
    #[error("field cwd {:?} passes through a symlink ({path}): a job's cwd must be a path of real directories inside the workspace root", clip(.cwd))]
    CwdSymlink { cwd: String, path: PathBuf },
    #[error("field cwd {:?} is not a directory ({path})", clip(.cwd))]
    CwdNotDir { cwd: String, path: PathBuf },
    #[error("field cwd {:?} cannot be entered by the runner's account ({path})", clip(.cwd))]
    CwdDenied {
        cwd: String,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{path} already exists, so it cannot be the new workspace of job {id}: choose another id (the work root may hold shared checkouts)")]
    WorkspaceExists { id: String, path: PathBuf },
    #[error("could not prepare {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not start {}: {step} failed", clip(.program))]
    Launch {
        program: String,
        step: crate::sys::launch::Step,
        #[source]
        source: io::Error,
    },
    #[error("could not start {}", clip(.program))]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("could not build the Landlock ruleset of the job with workspace {workspace}")]
    Landlock {
        workspace: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl JobError {
    /// The exit code a shell reports for a program it could not start, when that is why:
    /// 127 not found, 126 found but not executable. The record of such a job carries it
    /// (with no pid: nothing ran), so `railgrid job` exits as `sh -c` would.
    pub fn shell_exit_code(&self) -> Option<i32> {
        let source = match self {
            JobError::Spawn { source, .. } => source,
            JobError::Launch {
                step: crate::sys::launch::Step::Exec,
                source,
                ..
            } => source,
            _ => return None,
        };
        match (source.kind(), source.raw_os_error()) {
            (io::ErrorKind::NotFound, _) | (_, Some(libc::ENOENT)) => Some(127),
            (io::ErrorKind::PermissionDenied, _)
            | (_, Some(libc::EACCES))
            | (_, Some(libc::ENOEXEC))
            | (_, Some(libc::EISDIR)) => Some(126),
            _ => None,
        }
    }

    /// Errors in the spec (400) rather than in the runner.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            JobError::CwdOutside { .. }
                | JobError::CwdMissing { .. }
                | JobError::CwdSymlink { .. }
                | JobError::CwdNotDir { .. }
                | JobError::CwdDenied { .. }
                | JobError::WorkspaceExists { .. }
        )
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> JobError + '_ {
    move |source| JobError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A job's workspace and working directory, open.
#[derive(Debug)]
pub struct Workspace {
    /// `<work>/<id>`.
    pub dir: Dir,
    /// The spec's `cwd`, when it names one.
    pub cwd: Option<Dir>,
}

impl Workspace {
    /// Where the job starts.
    pub fn cwd(&self) -> &Dir {
        self.cwd.as_ref().unwrap_or(&self.dir)
    }
}

/// Creates the job's workspace (0700, with a `tmp` inside) and opens it and the job's
/// working directory. `cwd` is relative to the workspace, or absolute under the work root;
/// either way it is opened beneath the work root with no symlink at any component, so
/// neither `..` nor a symlink (nor one swapped in while this runs) can lead out of it. The
/// work root itself is refused: from there a job could reach every workspace.
///
/// With `fresh` (a job being admitted), the workspace must not exist yet: a directory
/// already there under a new job's id is someone else's (a shared checkout), never
/// adopted. At the job's start it may (the admission made it).
pub fn prepare_workspace(
    paths: &JobPaths,
    id: &str,
    cwd: Option<&str>,
    fresh: bool,
) -> Result<Workspace, JobError> {
    let ws = paths.workspace(id);
    // Made and opened by descriptor, never through a symlink: another job can write in
    // the work root (without Landlock) and plant one where this workspace should be.
    let planted = |path: PathBuf| {
        move |e: io::Error| JobError::Io {
            path,
            source: match e.raw_os_error() {
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
                    io::Error::new(io::ErrorKind::InvalidInput, "not a directory (a symlink?)")
                }
                _ => e,
            },
        }
    };
    let dir = if fresh {
        paths.work.create_child(id, 0o700).map_err(|e| {
            if e.raw_os_error() == Some(libc::EEXIST) {
                JobError::WorkspaceExists {
                    id: id.to_owned(),
                    path: ws.clone(),
                }
            } else {
                planted(ws.clone())(e)
            }
        })?
    } else {
        paths
            .work
            .make_child(id, 0o700)
            .map_err(planted(ws.clone()))?
    };
    dir.make_child("tmp", 0o700)
        .map_err(planted(ws.join("tmp")))?;
    let Some(cwd) = cwd else {
        return Ok(Workspace { dir, cwd: None });
    };
    let outside = |resolved: PathBuf| JobError::CwdOutside {
        cwd: cwd.to_owned(),
        resolved,
        root: paths.work_root.clone(),
    };
    let rel = if Path::new(cwd).is_absolute() {
        let canonical = fs::canonicalize(&paths.work_root).ok();
        let under = Path::new(cwd)
            .strip_prefix(&paths.work_root)
            .ok()
            .or_else(|| {
                canonical
                    .as_deref()
                    .and_then(|c| Path::new(cwd).strip_prefix(c).ok())
            });
        match under {
            Some(rel) if !rel.as_os_str().is_empty() => rel.to_owned(),
            Some(_) => return Err(outside(paths.work_root.clone())),
            None => return Err(outside(lexical_normal(Path::new(cwd)))),
        }
    } else {
        Path::new(id).join(cwd)
    };
    let wanted = paths.work_root.join(&rel);
    let opened = paths
        .work
        .open_beneath(&rel)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EXDEV) => outside(lexical_normal(&wanted)),
            Some(libc::ELOOP) => JobError::CwdSymlink {
                cwd: cwd.to_owned(),
                path: wanted.clone(),
            },
            Some(libc::ENOENT) => JobError::CwdMissing {
                cwd: cwd.to_owned(),
                path: wanted.clone(),
            },
            Some(libc::ENOTDIR) => JobError::CwdNotDir {
                cwd: cwd.to_owned(),
                path: wanted.clone(),
            },
            Some(libc::EACCES) | Some(libc::ENAMETOOLONG) => JobError::CwdDenied {
                cwd: cwd.to_owned(),
                path: wanted.clone(),
                source: e,
            },
            _ => io_err(&wanted)(e),
        })?;
    if opened.same_as(&paths.work).map_err(io_err(&wanted))? {
        return Err(outside(paths.work_root.clone()));
    }
    // Opened, but can the job enter it? (O_PATH needs no search permission; fchdir does.)
    opened.searchable().map_err(|source| JobError::CwdDenied {
        cwd: cwd.to_owned(),
        path: wanted.clone(),
        source,
    })?;
    Ok(Workspace {
        dir,
        cwd: Some(opened),
    })
}

/// `path` with `.` and `..` folded by spelling alone (no symlinks consulted).
fn lexical_normal(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Counters of one spooled stream, shared with the API while the job runs.
#[derive(Debug, Default)]
pub struct SpoolStats {
    /// Bytes on disk.
    pub written: AtomicU64,
    /// Bytes the job produced, kept or not.
    pub produced: AtomicU64,
    pub truncated: AtomicBool,
    /// Why the stream was cut, once it was: the cap, or a spool file that could not be
    /// written.
    pub reason: OnceLock<String>,
    /// Set by [`SpoolStats::drain`]; `drained` wakes the spool task.
    draining: AtomicBool,
    drained: tokio::sync::Notify,
}

impl SpoolStats {
    /// Tells the spool task that every process of the job's group is gone, so what they
    /// wrote is all in the pipe: it takes that and ends, without waiting for the end of
    /// file that a process which left the group (setsid) and holds the pipe would delay.
    /// What such a process writes later is not spooled.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.drained.notify_waiters();
    }

    /// Resolves once [`SpoolStats::drain`] was called, before or during the wait.
    async fn drain_asked(&self) {
        let notified = self.drained.notified();
        tokio::pin!(notified);
        // Registered before the flag is read: a drain between the two is not missed.
        notified.as_mut().enable();
        if self.draining.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }

    /// Marks the stream cut; the first reason stays.
    fn cut(&self, reason: impl FnOnce() -> String) {
        self.truncated.store(true, Ordering::Relaxed);
        if self.reason.get().is_none() {
            let _ = self.reason.set(reason());
        }
    }
}

/// Why the job's output was cut short, for its record.
pub fn truncation(
    stdout: &SpoolStats,
    stderr: &SpoolStats,
) -> Option<crate::proto::job::Truncation> {
    crate::proto::job::Truncation::of(stdout.reason.get().cloned(), stderr.reason.get().cloned())
}

/// What a failed spool write says in the record: a full disk by that name.
fn spool_failure(what: &str, path: &Path, e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENOSPC) || e.kind() == io::ErrorKind::StorageFull {
        format!("disk full {what} {}: {e}", path.display())
    } else {
        format!("could not write ({what}) {}: {e}", path.display())
    }
}

/// A started job process and its output tasks.
pub struct Started {
    pub child: JobProcess,
    pub pid: i32,
    pub stdout: Arc<SpoolStats>,
    pub stderr: Arc<SpoolStats>,
    pub spoolers: Vec<tokio::task::JoinHandle<()>>,
    pub confinement: String,
    /// The job's own cgroup, in the cgroup tier.
    #[cfg(target_os = "linux")]
    pub cgroup: Option<crate::sys::cgroup::Cgroup>,
}

/// The job's complete environment: the baseline, then the spec's variables (which were
/// checked at submission and may override the baseline).
fn job_env(ws: &Path, id: &str, spec: &JobSpec, path: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_owned(), path.to_owned());
    env.insert("HOME".to_owned(), ws.to_string_lossy().into_owned());
    env.insert("LANG".to_owned(), "C.UTF-8".to_owned());
    env.insert(
        "TMPDIR".to_owned(),
        ws.join("tmp").to_string_lossy().into_owned(),
    );
    // Marks the process as this job's, for the next runner if this one dies between
    // spawning it and recording its pid.
    env.insert(JOB_ID_VAR.to_owned(), id.to_owned());
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

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

/// What every job of this runner gets, whatever its spec.
#[derive(Debug, Clone, Copy)]
pub struct Baseline<'a> {
    /// Bytes kept per output stream.
    pub output_cap: u64,
    /// The job's PATH unless its spec sets one (`runner.job_path`, else [`DEFAULT_PATH`]).
    pub path: &'a str,
    pub launch: LaunchMethod,
}

/// Starts the job's process. `on_output` is called by the spool tasks after each write
/// (to wake followers).
pub fn start(
    paths: &JobPaths,
    id: &str,
    spec: &JobSpec,
    workspace: &Workspace,
    baseline: Baseline<'_>,
    tiers: Tiers<'_>,
    on_output: Arc<dyn Fn() + Send + Sync>,
) -> Result<Started, JobError> {
    let Tiers { cgroups: tier, fs } = tiers;
    let cap = baseline.output_cap;
    let ws = paths.workspace(id);
    let spool_dir = paths.spool_dir(id);
    let env = job_env(&ws, id, spec, baseline.path);

    let (out_r, out_w) = pipe::pipe().map_err(io_err(&spool_dir))?;
    let (err_r, err_w) = pipe::pipe().map_err(io_err(&spool_dir))?;
    let (stdin_r, stdin_w) = match spec.stdin {
        Some(_) => {
            let (r, w) = pipe::pipe().map_err(io_err(&spool_dir))?;
            (OwnedFd::from(r), Some(w))
        }
        None => {
            let null = Path::new("/dev/null");
            (File::open(null).map_err(io_err(null))?.into(), None)
        }
    };
    #[cfg(target_os = "linux")]
    let ruleset = fs
        .map(|g| g.ruleset_for(&workspace.dir, workspace.cwd.as_ref()))
        .transpose()
        .map_err(|source| JobError::Landlock {
            workspace: ws.clone(),
            source,
        })?;
    #[cfg(not(target_os = "linux"))]
    let ruleset: Option<()> = fs.and(None);
    let plan = confine::plan(
        tier,
        id,
        &spec.limits.clone().unwrap_or_default(),
        ruleset.is_some(),
    );
    let stdio = Stdio3 {
        stdin: stdin_r,
        stdout: out_w,
        stderr: err_w,
    };
    #[cfg(target_os = "linux")]
    let (child, cgroup) = {
        use std::os::fd::AsFd;
        let cg = plan.cgroup;
        let procs = cg.as_ref().map(|c| c.procs.as_fd());
        let landlock = ruleset.as_ref().map(|r| r.fd());
        let launched = match baseline.launch {
            LaunchMethod::CloneVfork => launch(
                spec,
                &env,
                workspace.cwd(),
                stdio,
                plan.rlimits,
                procs,
                landlock,
            ),
            LaunchMethod::Fork => fork_exec(
                spec,
                &env,
                workspace.cwd(),
                stdio,
                plan.rlimits,
                procs,
                landlock,
            ),
        };
        let cgroup = cg.map(|c| c.cgroup);
        match launched {
            Ok(child) => (child, cgroup),
            Err(e) => {
                if let Some(c) = cgroup {
                    let _ = c.remove();
                }
                return Err(e);
            }
        }
    };
    #[cfg(not(target_os = "linux"))]
    let child = fork_exec(spec, &env, workspace.cwd(), stdio, plan.rlimits, None, None)?;
    // The child's ends of the pipes were closed above (moved into the launch), so the
    // spool tasks see end-of-file when the job's last writer exits.
    let pid = child.pid().map_or(0, |p| p.get());
    if let (Some(text), Some(w)) = (spec.stdin.clone(), stdin_w) {
        let path = spool_dir.join("stdin");
        let mut tx = tokio::net::unix::pipe::Sender::from_owned_fd(w).map_err(io_err(&path))?;
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            // A job that exits without reading its stdin is not an error.
            let _ = tx.write_all(text.as_bytes()).await;
        });
    }
    let stdout = Arc::new(SpoolStats::default());
    let stderr = Arc::new(SpoolStats::default());
    let mut spoolers = Vec::new();
    for (reader, stream, stats) in [
        (out_r, Stream::Stdout, &stdout),
        (err_r, Stream::Stderr, &stderr),
    ] {
        let path = paths.spool_file(id, stream);
        let stats = stats.clone();
        let notify = on_output.clone();
        let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))
            .map_err(io_err(&path))?;
        let target = SpoolTarget {
            root: paths.spool.clone(),
            id: id.to_owned(),
            stream,
            path,
        };
        let handle = tokio::spawn(async move { spool(rx, &target, cap, &stats, &*notify).await });
        spoolers.push(handle);
    }
    Ok(Started {
        child,
        pid,
        stdout,
        stderr,
        spoolers,
        confinement: plan.confinement,
        #[cfg(target_os = "linux")]
        cgroup,
    })
}

/// The job's ends of its standard streams.
struct Stdio3 {
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

/// Launches without fork (see `sys::launch`): setsid, join the job's cgroup, rlimits,
/// stdio, chdir, exec.
#[cfg(target_os = "linux")]
fn launch(
    spec: &JobSpec,
    env: &BTreeMap<String, String>,
    cwd: &Dir,
    stdio: Stdio3,
    limits: Rlimits,
    cgroup_procs: Option<std::os::fd::BorrowedFd<'_>>,
    landlock: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<JobProcess, JobError> {
    use std::os::fd::AsFd;

    use crate::sys::launch::{self, LaunchSpec};

    let program = &spec.argv[0];
    let spawn_err = |source: io::Error| JobError::Spawn {
        program: program.clone(),
        source,
    };
    let ExecStrings {
        programs,
        argv,
        env: c_env,
        search,
    } = ExecStrings::new(spec, env)?;
    let launched = launch::launch(&LaunchSpec {
        programs: &programs,
        argv: &argv,
        env: &c_env,
        cwd: cwd.as_fd(),
        stdin: stdio.stdin.as_fd(),
        stdout: stdio.stdout.as_fd(),
        stderr: stdio.stderr.as_fd(),
        limits,
        cgroup_procs,
        landlock,
    })
    .map_err(
        |e| match (e.step, not_found_in_path(program, &search, &e.source)) {
            (launch::Step::Exec, Some(said)) => spawn_err(said),
            _ => JobError::Launch {
                program: program.clone(),
                step: e.step,
                source: e.source,
            },
        },
    )?;
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
    match e.raw_os_error() {
        Some(libc::ENOENT) => Some(io::Error::new(
            io::ErrorKind::NotFound,
            format!("not found in PATH {search}"),
        )),
        Some(libc::EACCES) => Some(io::Error::new(
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
fn fork_exec(
    spec: &JobSpec,
    env: &BTreeMap<String, String>,
    cwd: &Dir,
    stdio: Stdio3,
    limits: Rlimits,
    cgroup_procs: Option<std::os::fd::BorrowedFd<'_>>,
    landlock: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<JobProcess, JobError> {
    let program = &spec.argv[0];
    let spawn_err = |source: io::Error| JobError::Spawn {
        program: program.clone(),
        source,
    };
    let ExecStrings {
        programs,
        argv,
        env: c_env,
        search,
    } = ExecStrings::new(spec, env)?;
    let dup = |fd: std::os::fd::BorrowedFd<'_>| fd.try_clone_to_owned().map_err(spawn_err);
    let exec = spawn::JobExec {
        cwd: dup(cwd.as_fd())?,
        cgroup_procs: cgroup_procs.map(dup).transpose()?,
        limits,
        landlock: landlock.map(dup).transpose()?,
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

/// Copies a job's stream into its spool file until every writer is gone. Past `cap`
/// bytes are counted and dropped, so a slow reader or a chatty job never blocks: the pipe
/// is always drained. A write that fails (a full disk) ends the file there for good, so it
/// holds a prefix of the output and never one with a hole; `stats.reason` says why.
/// The spool file is created with the first byte: a job that prints nothing costs no
/// inodes (file creation dominates the runner's cost for trivial jobs). Reads are async
/// (no thread per stream); writes go straight to the page cache, which takes microseconds,
/// so they stay on the runtime rather than paying a thread hand-off per chunk.
/// Most a drain takes: more than a pipe holds, so all the dead group wrote is taken.
const DRAIN_MAX: usize = 2 * 1024 * 1024;

async fn spool(
    mut reader: tokio::net::unix::pipe::Receiver,
    target: &SpoolTarget,
    cap: u64,
    stats: &SpoolStats,
    notify: &(dyn Fn() + Send + Sync),
) {
    use tokio::io::AsyncReadExt;
    let path = &target.path;
    let mut buf = vec![0u8; 64 * 1024];
    let mut file: Option<File> = None;
    let mut written = 0u64;
    // The file could not be created or written: the rest is counted and dropped.
    let mut broken = false;
    // Once a drain is asked for: how much more may be taken, so a process outside the
    // group that writes without pause cannot keep the drain going.
    let mut drain_left: Option<usize> = None;
    loop {
        let n = match drain_left.as_mut() {
            Some(left) => {
                let want = buf.len().min(*left);
                // Straight from the pipe, not through the reactor, whose readiness may lag
                // behind what the dead group wrote last. Empty (WouldBlock) or closed: done.
                match crate::sys::pipe::read_now(&reader, &mut buf[..want]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        *left -= n;
                        n
                    }
                }
            }
            None => tokio::select! {
                // Cancel-safe: a read that loses the race has taken nothing.
                r = reader.read(&mut buf) => match r {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                },
                // Cancel-safe: the flag behind it stays set.
                () = stats.drain_asked() => {
                    drain_left = Some(DRAIN_MAX);
                    continue;
                }
            },
        };
        stats.produced.fetch_add(n as u64, Ordering::Relaxed);
        let keep = if broken {
            0
        } else {
            (cap.saturating_sub(written) as usize).min(n)
        };
        if keep > 0 && file.is_none() {
            match target.open() {
                Ok(f) => file = Some(f),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "could not create spool file; dropping output");
                    stats.cut(|| spool_failure("creating", path, &e));
                    broken = true;
                }
            }
        }
        let mut kept = 0;
        if let (true, Some(f)) = (keep > 0, file.as_mut()) {
            // By hand rather than `write_all`, to count what a failing write left in the
            // file.
            while kept < keep {
                match f.write(&buf[kept..keep]) {
                    Ok(0) => {
                        let e = io::Error::from(io::ErrorKind::WriteZero);
                        stats.cut(|| spool_failure("writing", path, &e));
                        broken = true;
                        break;
                    }
                    Ok(k) => kept += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "could not write spool file; dropping the rest of the output");
                        stats.cut(|| spool_failure("writing", path, &e));
                        broken = true;
                        break;
                    }
                }
            }
            written += kept as u64;
            stats.written.store(written, Ordering::Relaxed);
            if broken {
                file = None;
            }
        }
        if kept < n {
            stats.cut(|| format!("cap of {cap} bytes reached"));
        }
        // Followers only care about bytes they can read.
        if kept > 0 {
            notify();
        }
    }
    notify();
}

/// Where one stream is spooled: `<jobs>/<id>/<stream>`, made and opened through the spool
/// root's descriptor (`path` is for messages).
struct SpoolTarget {
    root: Arc<Dir>,
    id: String,
    stream: Stream,
    path: PathBuf,
}

impl SpoolTarget {
    /// Creates the job's spool dir (0700) and its stream's file (0600, append-only); a
    /// symlink planted at either is refused, never followed.
    fn open(&self) -> io::Result<File> {
        self.root
            .make_child(&self.id, 0o700)?
            .append_file(self.stream.name(), 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(dir: &Path) -> JobPaths {
        JobPaths::open(dir).unwrap()
    }

    /// As at a job's start: the workspace may exist.
    fn prepare_workspace_t(
        p: &JobPaths,
        id: &str,
        cwd: Option<&str>,
    ) -> Result<Workspace, JobError> {
        prepare_workspace(p, id, cwd, false)
    }

    #[test]
    fn a_new_job_never_adopts_a_directory_already_under_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        fs::create_dir(p.workspace("shared")).unwrap();
        fs::write(p.workspace("shared").join("keep"), "").unwrap();
        assert!(matches!(
            prepare_workspace(&p, "shared", Some("missing"), true),
            Err(JobError::WorkspaceExists { .. })
        ));
        assert!(p.workspace("shared").join("keep").exists());
        assert!(prepare_workspace(&p, "new", None, true).is_ok());
        assert!(prepare_workspace(&p, "new", None, false).is_ok());
    }

    #[test]
    fn a_planted_workspace_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        std::os::unix::fs::symlink(dir.path(), p.workspace("victim")).unwrap();
        assert!(matches!(
            prepare_workspace_t(&p, "victim", None),
            Err(JobError::Io { .. })
        ));
    }

    #[test]
    fn cwd_escapes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("../../etc")),
            Err(JobError::CwdOutside { .. })
        ));
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("/etc")),
            Err(JobError::CwdOutside { .. })
        ));
        std::os::unix::fs::symlink("/etc", p.workspace("a").join("link")).unwrap();
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("link")),
            Err(JobError::CwdSymlink { .. })
        ));
        fs::create_dir(p.workspace("a").join("src")).unwrap();
        // Even a symlink that stays inside is refused: it could be swapped at any moment.
        std::os::unix::fs::symlink("src", p.workspace("a").join("inner")).unwrap();
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("inner")),
            Err(JobError::CwdSymlink { .. })
        ));
        fs::write(p.workspace("a").join("file"), "").unwrap();
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("file")),
            Err(JobError::CwdNotDir { .. })
        ));
        let ws = prepare_workspace_t(&p, "a", Some("src")).unwrap();
        let src = Dir::open(&p.workspace("a").join("src")).unwrap();
        assert!(ws.cwd().same_as(&src).unwrap());
        let abs = p.workspace("a").join("src");
        let ws = prepare_workspace_t(&p, "b", Some(abs.to_str().unwrap())).unwrap();
        assert!(ws.cwd().same_as(&src).unwrap());
        // Another job's workspace is inside the root too: allowed, like a shared checkout.
        assert!(prepare_workspace_t(&p, "b", Some("../a/src")).is_ok());
        // The root itself is not.
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("..")),
            Err(JobError::CwdOutside { .. })
        ));
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("missing")),
            Err(JobError::CwdMissing { .. })
        ));
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("../../nonexistent")),
            Err(JobError::CwdOutside { .. })
        ));
    }

    #[tokio::test]
    async fn a_drain_takes_what_is_in_the_pipe_while_another_process_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let paths = paths(dir.path());
        let path = paths.spool_file("j", Stream::Stdout);
        let target = SpoolTarget {
            root: paths.spool.clone(),
            id: "j".into(),
            stream: Stream::Stdout,
            path: path.clone(),
        };
        let (r, w) = pipe::pipe().unwrap();
        let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(r)).unwrap();
        let stats = Arc::new(SpoolStats::default());
        let st = stats.clone();
        let task = tokio::spawn(async move { spool(rx, &target, 1024, &st, &|| {}).await });
        // Stands for a process that left the job's group with the pipe as its stdout.
        let escapee = File::from(w.try_clone().unwrap());
        let mut job = File::from(w);
        job.write_all(b"last words").unwrap();
        drop(job);
        stats.drain();
        tokio::time::timeout(std::time::Duration::from_secs(60), task)
            .await
            .expect("the spool task waited for the escapee")
            .unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"last words");
        assert_eq!(stats.produced.load(Ordering::Relaxed), 10);
        drop(escapee);
    }
}
