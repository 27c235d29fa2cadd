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
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

mod launch;
pub mod mask;
mod spool;
mod workspace;

pub use self::launch::LaunchMethod;
use self::launch::{Launch, Stdio3};
use self::spool::{spool, SpoolTarget};
pub use self::spool::{truncation, SpoolStats};
pub use self::workspace::{prepare_workspace, Workspace};
use super::confine::{self, Tiers};
use super::process::JobProcess;
use crate::proto::job::JobSpec;
use crate::sys::dirfd::Dir;
use crate::sys::errno::{self, Failure};
use crate::sys::pipe;
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

pub use crate::proto::job::Stream;

#[derive(Debug, Error)]
pub enum JobError {
    #[error("network \"{network}\" needs the job's sandbox, which it does not have here")]
    NoNetworkNamespace { network: &'static str },
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
    #[error("field cwd {:?} changed while the job started (a symlink or another directory swapped in): it was not entered", clip(.cwd))]
    CwdChanged { cwd: String },
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
        step: crate::sys::start::Step,
        #[source]
        source: io::Error,
    },
    #[error("could not start {}", clip(.program))]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "secrets as files need the job's sandbox (its private tmpfs), which it does not have here"
    )]
    NoSecretFiles,
    #[error(transparent)]
    Mask(#[from] mask::MaskError),
    #[error("could not serve the job's egress proxy")]
    Proxy {
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
                step: crate::sys::start::Step::Exec,
                source,
                ..
            } => source,
            _ => return None,
        };
        match errno::failure(source) {
            Failure::NotFound => Some(127),
            Failure::Denied | Failure::NotExecutable | Failure::IsDirectory => Some(126),
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
                | JobError::Mask(_)
        )
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> JobError + '_ {
    move |source| JobError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A started job process and its output tasks.
pub struct Started {
    pub child: JobProcess,
    /// The job's egress proxy (network `allow`): ends when dropped.
    pub egress: Option<super::egress::Egress>,
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
fn job_env(
    ws: &Path,
    id: &str,
    spec: &JobSpec,
    secrets: &BTreeMap<String, String>,
    path: &str,
    network: &crate::proto::job::Network,
) -> BTreeMap<String, String> {
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
    // Names checked at admission: none is the baseline's, the spec's or a proxy's.
    for name in &spec.secrets {
        if let Some(v) = secrets.get(name) {
            env.insert(name.clone(), v.clone());
        }
    }
    if !spec.secret_files.is_empty() {
        env.insert(
            crate::env_vars::SECRETS_DIR.to_owned(),
            crate::proto::secret::FILES_DIR.to_owned(),
        );
    }
    if let crate::proto::job::Network::Allow(_) = network {
        super::egress::proxy_env(&mut env);
    }
    env
}

/// The job to start: its id, its spec, and the values of the secrets it names.
#[derive(Clone, Copy)]
pub struct Job<'a> {
    pub id: &'a str,
    pub spec: &'a JobSpec,
    pub secrets: &'a BTreeMap<String, String>,
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
    job: Job<'_>,
    workspace: &Workspace,
    baseline: Baseline<'_>,
    tiers: Tiers<'_>,
    on_output: Arc<dyn Fn() + Send + Sync>,
) -> Result<Started, JobError> {
    let Job { id, spec, secrets } = job;
    // Built before anything runs: a job whose output could not be masked does not start.
    let patterns = mask::Patterns::new(secrets.iter().map(|(n, v)| (n.as_str(), v.as_bytes())))?;
    let Tiers {
        cgroups: tier,
        fs,
        sandbox,
    } = tiers;
    #[cfg(target_os = "linux")]
    let sandboxed = sandbox.filter(|s| s.held());
    // Admission refused a wider one, and `none` without a sandbox to keep it.
    let network = match sandbox {
        Some(s) => s.network_of(spec.network.as_ref()),
        None => spec
            .network
            .clone()
            .unwrap_or(crate::proto::job::Network::Open),
    };
    let cap = baseline.output_cap;
    let ws = paths.workspace(id);
    let spool_dir = paths.spool_dir(id);
    let env = job_env(&ws, id, spec, secrets, baseline.path, &network);

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
        .map(|g| match sandboxed {
            Some(_) => g.ruleset_sandboxed(),
            None => g.ruleset_for(&workspace.dir, workspace.cwd.as_ref()),
        })
        .transpose()
        .map_err(|source| JobError::Landlock {
            workspace: ws.clone(),
            source,
        })?;
    #[cfg(target_os = "linux")]
    let job_sandbox = sandboxed
        .map(|s| {
            let cwd = workspace
                .cwd
                .as_ref()
                .zip(workspace.cwd_rel.as_deref())
                .map(|(dir, rel)| (rel, dir.as_fd()));
            let files: Vec<(&str, &[u8])> = spec
                .secret_files
                .iter()
                .filter_map(|n| Some((n.as_str(), secrets.get(n)?.as_bytes())))
                .collect();
            s.plan(id, workspace.dir.as_fd(), cwd, &network, &files)
        })
        .transpose()
        .map_err(io_err(&ws))?;
    #[cfg(not(target_os = "linux"))]
    let ruleset: Option<()> = fs.and(None);
    let mut plan = confine::plan(
        tier,
        id,
        &spec.limits.clone().unwrap_or_default(),
        ruleset.is_some(),
    );
    // Which sandbox held, and why not where none did.
    #[cfg(target_os = "linux")]
    let held = job_sandbox.is_some();
    #[cfg(not(target_os = "linux"))]
    let held = false;
    if network.own_namespace() && !held {
        return Err(JobError::NoNetworkNamespace {
            network: network.kind(),
        });
    }
    if !spec.secret_files.is_empty() && !held {
        return Err(JobError::NoSecretFiles);
    }
    if held {
        plan.confinement = format!("sandbox+{}", plan.confinement);
        if network.own_namespace() {
            plan.confinement = format!("{}; network: {network}", plan.confinement);
        }
        // What it shares with every other job, named in its record.
        let shared = sandbox.map_or(&[][..], |s| s.shared());
        if !shared.is_empty() {
            let dirs: Vec<_> = shared.iter().map(|d| d.display().to_string()).collect();
            plan.confinement = format!("{}; shared: {}", plan.confinement, dirs.join(", "));
        }
    } else if let Some(why) = sandbox.and_then(|s| s.unavailable()) {
        plan.confinement = format!("{}; no sandbox: {why}", plan.confinement);
    }
    let stdio = Stdio3 {
        stdin: stdin_r,
        stdout: out_w,
        stderr: err_w,
    };
    #[cfg(target_os = "linux")]
    let (cgroup, landlock) = (plan.cgroup, ruleset.as_ref().map(|r| r.fd()));
    #[cfg(target_os = "linux")]
    let cgroup_procs = cgroup.as_ref().map(|c| c.procs.as_fd());
    #[cfg(not(target_os = "linux"))]
    let (cgroup_procs, landlock) = (None, None);
    let launched = Launch {
        spec,
        env: &env,
        cwd: workspace.cwd(),
        stdio,
        limits: plan.rlimits,
        cgroup_procs,
        landlock,
        #[cfg(target_os = "linux")]
        sandbox: job_sandbox.as_ref().zip(sandboxed).map(|(j, s)| j.spec(s)),
    }
    .run(baseline.launch);
    #[cfg(target_os = "linux")]
    let cgroup = cgroup.map(|c| c.cgroup);
    let mut child = match launched {
        Ok(child) => child,
        Err(e) => {
            #[cfg(target_os = "linux")]
            if let Some(c) = cgroup {
                let _ = c.remove();
            }
            return Err(e);
        }
    };
    // Its proxy, served from here on its socket in the job's network namespace; a job
    // whose proxy cannot be served is not left running without one (it could reach
    // nothing, and would fail for a reason nobody could see).
    let egress = match (&network, child.take_proxy()) {
        (crate::proto::job::Network::Allow(rules), fd) => {
            let served = fd
                .ok_or_else(|| io::Error::other("the sandbox handed over no proxy socket"))
                .and_then(|fd| super::egress::start(fd, id, rules.clone()));
            match served {
                Ok(e) => Some(e),
                Err(source) => {
                    // Dropped unreaped: killed with its group (see `JobProcess`).
                    drop(child);
                    #[cfg(target_os = "linux")]
                    if let Some(c) = cgroup {
                        let _ = c.remove();
                    }
                    return Err(JobError::Proxy { source });
                }
            }
        }
        _ => None,
    };
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
    let (stdout, stderr, spoolers) =
        spool_streams(paths, id, cap, [out_r, err_r], patterns, on_output)?;
    Ok(Started {
        child,
        egress,
        pid,
        stdout,
        stderr,
        spoolers,
        confinement: plan.confinement,
        #[cfg(target_os = "linux")]
        cgroup,
    })
}

/// Both streams' counters and their spool tasks.
type Spooled = (
    Arc<SpoolStats>,
    Arc<SpoolStats>,
    Vec<tokio::task::JoinHandle<()>>,
);

/// One spool task per stream, each masking the job's secrets before a byte is written.
fn spool_streams(
    paths: &JobPaths,
    id: &str,
    cap: u64,
    [out_r, err_r]: [File; 2],
    patterns: Option<Arc<mask::Patterns>>,
    on_output: Arc<dyn Fn() + Send + Sync>,
) -> Result<Spooled, JobError> {
    let (stdout, stderr): (Arc<SpoolStats>, Arc<SpoolStats>) = Default::default();
    let mut spoolers = Vec::new();
    for (reader, stream, stats) in [
        (out_r, Stream::Stdout, &stdout),
        (err_r, Stream::Stderr, &stderr),
    ] {
        let path = paths.spool_file(id, stream);
        let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))
            .map_err(io_err(&path))?;
        let target = SpoolTarget {
            root: paths.spool.clone(),
            id: id.to_owned(),
            stream,
            path,
        };
        let (stats, notify) = (stats.clone(), on_output.clone());
        let masker = patterns.clone().map(mask::Masker::new);
        spoolers.push(tokio::spawn(async move {
            spool(rx, &target, cap, &stats, &*notify, masker).await
        }));
    }
    Ok((stdout, stderr, spoolers))
}
