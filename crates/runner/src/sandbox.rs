//! The runner's side of a job's sandbox (docs/security.md, "A sandbox for every job"):
//! whether this host lets the runner make one (tried once, at start, by making one),
//! what each job's holds (its mounts, from the job's workspace and the operator's shared
//! directories), and the seccomp filter every sandboxed job installs. The namespaces and
//! the mounts themselves are made in `sys::sandbox`.
//!
//! `runner.sandbox`: `auto` (the default) sandboxes every job where the kernel allows it
//! and runs jobs as before where it does not, saying why in the runner's health and each
//! job's confinement; `required` refuses jobs instead; `off` turns it off.

use std::ffi::CString;
use std::io;
use std::os::fd::BorrowedFd;

#[cfg(target_os = "linux")]
use crate::sys::sandbox::Mount;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What the operator asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SandboxMode {
    #[default]
    Auto,
    Required,
    Off,
}

/// The sandbox's settings (`runner.sandbox*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    pub mode: SandboxMode,
    /// Directories bound read-write and shared by every job (a compiler cache, say).
    pub shared: Vec<PathBuf>,
    /// The size of each of the job's private `/tmp` and `/var/tmp`.
    pub tmp_bytes: u64,
    /// The size of its `/dev/shm`.
    pub shm_bytes: u64,
    /// System calls taken off the default deny list.
    pub allow_syscalls: Vec<String>,
    /// The network a job may reach unless it asks for less (`runner.network`).
    pub network: crate::proto::job::Network,
}

pub use crate::proto::runner::DEFAULT_TMP_BYTES;
/// A job's `/dev/shm` unless configured (Docker's default).
pub const DEFAULT_SHM_BYTES: u64 = 64 << 20;

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            mode: SandboxMode::Auto,
            shared: Vec::new(),
            tmp_bytes: DEFAULT_TMP_BYTES,
            shm_bytes: DEFAULT_SHM_BYTES,
            allow_syscalls: Vec::new(),
            network: crate::proto::job::Network::Open,
        }
    }
}

/// Where a job gets a fresh tmpfs (or, for `/dev`, a tmpfs of its own making).
const FRESH: &[&str] = &["/tmp", "/var/tmp", "/dev"];

/// The device nodes a job's `/dev` holds, bound from the host's.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// What a runner can give its jobs, decided at its start.
#[derive(Debug)]
pub struct Sandboxing {
    config: SandboxConfig,
    runner_dir: PathBuf,
    /// The empty directory each job's new root is attached at (in its own mount
    /// namespace: every job uses the same one).
    root: PathBuf,
    root_c: CString,
    uid_map: CString,
    gid_map: CString,
    #[cfg(target_os = "linux")]
    filter: Option<crate::sys::sandbox::Filter>,
    /// Host directories the plan binds or mounts over, checked at start.
    var_tmp: bool,
    devices: Vec<&'static str>,
    /// Why jobs run without a sandbox, when they do.
    unavailable: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("runner.sandbox_shared {path}: {why}")]
    Shared { path: PathBuf, why: String },
    #[error("could not prepare the sandbox's mount point {path}")]
    Root {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the sandbox's seccomp filter could not be built: {0}")]
    Filter(String),
}

impl Sandboxing {
    /// Sets the sandbox up for the runner whose directory is `runner_dir` and tries it
    /// once; what is refused is said (and logged), never fatal but for a bad shared
    /// directory or, with `required`, a host that refuses (the caller decides).
    pub fn detect(config: SandboxConfig, runner_dir: &Path) -> Result<Self, SandboxError> {
        let runner_dir =
            std::fs::canonicalize(runner_dir).map_err(|source| SandboxError::Root {
                path: runner_dir.to_owned(),
                source,
            })?;
        let mut shared = Vec::new();
        for path in &config.shared {
            shared.push(check_shared(path, &runner_dir)?);
        }
        let root = runner_dir.join("sandbox");
        let (uid, gid) = crate::sys::current_ids();
        let cstr = |s: String| CString::new(s).unwrap_or_default();
        let mut s = Self {
            config: SandboxConfig { shared, ..config },
            root_c: CString::new(root.as_os_str().as_bytes()).unwrap_or_default(),
            root,
            uid_map: cstr(format!("{uid} {uid} 1\n")),
            gid_map: cstr(format!("{gid} {gid} 1\n")),
            #[cfg(target_os = "linux")]
            filter: None,
            var_tmp: Path::new("/var/tmp").is_dir(),
            devices: DEVICES
                .iter()
                .copied()
                .filter(|d| Path::new("/dev").join(d).exists())
                .collect(),
            unavailable: None,
            runner_dir,
        };
        if s.config.mode == SandboxMode::Off {
            s.unavailable = Some("turned off (runner.sandbox = \"off\")".into());
            return Ok(s);
        }
        s.prepare()?;
        Ok(s)
    }

    #[cfg(target_os = "linux")]
    fn prepare(&mut self) -> Result<(), SandboxError> {
        match std::fs::create_dir(&self.root) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(SandboxError::Root {
                    path: self.root.clone(),
                    source,
                })
            }
        }
        self.filter = Some(
            super::seccomp::filter(&self.config.allow_syscalls).map_err(SandboxError::Filter)?,
        );
        if let Err(why) = self.probe() {
            self.unavailable = Some(why);
        }
        match &self.unavailable {
            None => tracing::info!(
                shared = ?self.config.shared,
                "every job runs in a sandbox of its own: user, mount, PID, IPC, UTS and cgroup namespaces, private /tmp, the host read-only, seccomp"
            ),
            Some(why) => tracing::warn!(
                required = self.config.mode == SandboxMode::Required,
                "jobs cannot run in a sandbox here: {why}"
            ),
        }
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    fn prepare(&mut self) -> Result<(), SandboxError> {
        self.unavailable = Some("no namespaces on this system (Linux only)".into());
        Ok(())
    }

    /// Makes a sandbox as a job's would be and ends it at once.
    #[cfg(target_os = "linux")]
    fn probe(&self) -> Result<(), String> {
        use std::os::fd::AsFd;
        let null = std::fs::File::open("/dev/null").map_err(|e| e.to_string())?;
        let work = self.runner_dir.join("work");
        let dir = crate::sys::dirfd::Dir::open(&work).map_err(|e| e.to_string())?;
        // The probe binds the work root itself where a job's workspace would be.
        let plan = self
            .plan(".", dir.as_fd(), None, &self.config.network, &[])
            .map_err(|e| e.to_string())?;
        let spec = crate::sys::launch::LaunchSpec {
            programs: &[],
            argv: &[],
            env: &[],
            cwd: dir.as_fd(),
            stdin: null.as_fd(),
            stdout: null.as_fd(),
            stderr: null.as_fd(),
            limits: crate::sys::spawn::Rlimits::default(),
            cgroup_procs: None,
            landlock: None,
        };
        crate::sys::sandbox::probe(&spec, &plan.spec(self)).map_err(|e| self.why(&plan, &e))
    }

    /// In words, why a sandbox could not be made, with what an operator does about it.
    #[cfg(target_os = "linux")]
    pub fn why(&self, plan: &JobSandbox, e: &crate::sys::sandbox::SandboxError) -> String {
        use crate::sys::start::Step;
        let at = e
            .mount
            .and_then(|i| plan.mounts.get(i))
            .map(|m| format!(" ({})", describe(m)))
            .unwrap_or_default();
        let hint = match (e.step, e.source.raw_os_error()) {
            (Step::Namespaces, Some(libc::EPERM | libc::ENOSPC | libc::EINVAL)) => {
                ": user namespaces are refused to this account (kernel.unprivileged_userns_clone = 0, user.max_user_namespaces = 0, an AppArmor restriction as on Ubuntu 23.10+, or a seccomp filter around the runner; docs/security.md says what to allow)"
            }
            (Step::Mounts, _) => ": the kernel refused a mount in the job's namespaces",
            _ => "",
        };
        format!("{}{at} failed: {}{hint}", e.step, e.source)
    }

    /// Whether jobs run sandboxed.
    pub fn held(&self) -> bool {
        self.unavailable.is_none()
    }

    pub fn mode(&self) -> SandboxMode {
        self.config.mode
    }

    /// Why jobs run without one, when they do.
    pub fn unavailable(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    /// The operator's shared directories, as every job is given them.
    pub fn shared(&self) -> &[PathBuf] {
        &self.config.shared
    }

    /// The network a job gets unless it asks for less (`runner.network`).
    pub fn network(&self) -> &crate::proto::job::Network {
        &self.config.network
    }

    /// The network of a job that asked for `asked`: the policy where it asked nothing.
    /// Whether it asked for more is admission's to refuse.
    pub fn network_of(
        &self,
        asked: Option<&crate::proto::job::Network>,
    ) -> crate::proto::job::Network {
        asked.unwrap_or(&self.config.network).clone()
    }

    /// Job `id`'s sandbox: its workspace (open as `workspace`) and its working directory
    /// (`cwd`: where it is under the work root, and open) bound read-write, each from its
    /// descriptor (the very directory that was checked, never a path looked up again), the
    /// rest of the runner's directory hidden; a network namespace of its own when its
    /// `network` is `none`.
    #[cfg(target_os = "linux")]
    pub fn plan(
        &self,
        id: &str,
        workspace: BorrowedFd<'_>,
        cwd: Option<(&Path, BorrowedFd<'_>)>,
        network: &crate::proto::job::Network,
        files: &[(&str, &[u8])],
    ) -> io::Result<JobSandbox> {
        let mut b = Builder {
            root: &self.root,
            mounts: Vec::new(),
            made: Vec::new(),
        };
        b.tmpfs(Path::new("/tmp"), self.config.tmp_bytes, "1777");
        // Secrets as files: on the job's private /tmp, never in its workspace.
        if !files.is_empty() {
            let dir = Path::new(crate::proto::secret::FILES_DIR);
            b.mounts.push(Mount::PrivateDir {
                path: c(&b.under(dir)),
            });
            for (name, value) in files {
                b.mounts.push(Mount::File {
                    path: c(&b.under(&dir.join(name))),
                    content: crate::sys::sandbox::Hidden(value.to_vec()),
                });
            }
        }
        if self.var_tmp {
            b.tmpfs(Path::new("/var/tmp"), self.config.tmp_bytes, "1777");
        }
        // A minimal /dev of its own.
        let dev = Path::new("/dev");
        b.tmpfs(dev, 1 << 20, "755");
        for d in &self.devices {
            b.bind(c(&dev.join(d)), &dev.join(d), true);
        }
        b.dir(&dev.join("pts"));
        b.dir(&dev.join("shm"));
        b.mounts.push(Mount::Devpts {
            target: c(&b.under(&dev.join("pts"))),
        });
        b.tmpfs(&dev.join("shm"), self.config.shm_bytes, "1777");
        for (to, at) in [
            ("pts/ptmx", "ptmx"),
            ("/proc/self/fd", "fd"),
            ("/proc/self/fd/0", "stdin"),
            ("/proc/self/fd/1", "stdout"),
            ("/proc/self/fd/2", "stderr"),
        ] {
            let at = c(&b.under(&dev.join(at)));
            b.mounts.push(Mount::Symlink {
                to: c(Path::new(to)),
                at,
            });
        }
        b.mounts.push(Mount::Proc {
            target: c(&b.under(Path::new("/proc"))),
        });
        // The runner's directory hidden, but for this job's workspace (and cwd).
        b.dirs_in_fresh(&self.runner_dir);
        b.tmpfs(&self.runner_dir, 1 << 20, "700");
        let work = self.runner_dir.join("work");
        let ws_rel = PathBuf::from(id);
        for (rel, fd) in std::iter::once((ws_rel.as_path(), workspace)).chain(cwd) {
            let at = work.join(rel);
            let mut path = self.runner_dir.clone();
            for part in Path::new("work").join(rel).components() {
                path.push(part);
                b.dir(&path);
            }
            let st = nix::sys::stat::fstat(fd).map_err(io::Error::from)?;
            let target = c(&b.under(&at));
            b.mounts.push(Mount::BindChecked {
                base: c(&work),
                rel: c(rel),
                dev: st.st_dev as u64,
                ino: st.st_ino as u64,
                target,
            });
        }
        for dir in &self.config.shared {
            b.dirs_in_fresh(dir);
            b.bind(c(dir), dir, false);
        }
        let host: String = id
            .chars()
            .map(|ch| {
                if ch.is_ascii_alphanumeric() || ch == '-' {
                    ch
                } else {
                    '-'
                }
            })
            .take(56)
            .collect();
        let start = work.join(cwd.map_or(ws_rel.as_path(), |(rel, _)| rel));
        Ok(JobSandbox {
            own_network: network.own_namespace(),
            proxy: matches!(network, crate::proto::job::Network::Allow(_)),
            mounts: b.mounts,
            cwd: c(&start),
            hostname: c_str(&format!("job-{host}")),
        })
    }
}

/// A path as C takes it (a path from the OS holds no NUL).
fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

fn c_str(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

/// A job's mounts, in order, with the directories already made.
#[cfg(target_os = "linux")]
struct Builder<'a> {
    root: &'a Path,
    mounts: Vec<crate::sys::sandbox::Mount>,
    made: Vec<PathBuf>,
}

#[cfg(target_os = "linux")]
impl Builder<'_> {
    /// Where the job's `path` is before the pivot.
    fn under(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }

    fn tmpfs(&mut self, at: &Path, bytes: u64, mode: &str) {
        let target = c(&self.under(at));
        self.mounts.push(Mount::Tmpfs {
            target,
            options: c_str(&format!("size={bytes},mode={mode}")),
        });
    }

    fn dir(&mut self, at: &Path) {
        if !self.made.iter().any(|m| m == at) {
            let path = c(&self.under(at));
            self.mounts.push(Mount::Dir { path });
            self.made.push(at.to_owned());
        }
    }

    fn bind(&mut self, source: CString, at: &Path, file: bool) {
        let target = c(&self.under(at));
        self.mounts.push(Mount::Bind {
            source,
            target,
            file,
        });
    }

    /// Each component of `path` below the fresh tmpfs it lies in, if it does (a state
    /// dir in /var/tmp, say): made there before anything is mounted on it.
    fn dirs_in_fresh(&mut self, path: &Path) {
        let Some(fresh) = FRESH.iter().map(Path::new).find(|f| path.starts_with(f)) else {
            return;
        };
        let mut at = fresh.to_path_buf();
        for part in path
            .strip_prefix(fresh)
            .into_iter()
            .flat_map(Path::components)
        {
            at.push(part);
            self.dir(&at.clone());
        }
    }
}

/// One job's sandbox, made before its launch.
#[derive(Debug)]
pub struct JobSandbox {
    /// Its network namespace (`none` and `allow`).
    own_network: bool,
    /// The egress proxy's socket in it (`allow`).
    proxy: bool,
    #[cfg(target_os = "linux")]
    mounts: Vec<crate::sys::sandbox::Mount>,
    #[cfg(not(target_os = "linux"))]
    mounts: Vec<()>,
    cwd: CString,
    hostname: CString,
}

#[cfg(target_os = "linux")]
impl JobSandbox {
    /// What `sys::sandbox` takes, borrowing this and `s`.
    pub fn spec<'a>(&'a self, s: &'a Sandboxing) -> crate::sys::sandbox::Sandbox<'a> {
        crate::sys::sandbox::Sandbox {
            root: &s.root_c,
            uid_map: &s.uid_map,
            gid_map: &s.gid_map,
            mounts: &self.mounts,
            hostname: &self.hostname,
            cwd: &self.cwd,
            seccomp: s.filter.as_ref(),
            own_network: self.own_network,
            proxy_port: self.proxy.then_some(crate::egress::PORT),
        }
    }
}

/// A mount, in words, for an error.
#[cfg(target_os = "linux")]
fn describe(m: &crate::sys::sandbox::Mount) -> String {
    use crate::sys::sandbox::Mount;
    let s = |c: &CString| String::from_utf8_lossy(c.as_bytes()).into_owned();
    match m {
        Mount::Tmpfs { target, .. } => format!("a tmpfs at {}", s(target)),
        Mount::Dir { path } => format!("the directory {}", s(path)),
        Mount::Bind { source, target, .. } => format!("{} bound at {}", s(source), s(target)),
        Mount::BindChecked {
            base, rel, target, ..
        } => format!("{}/{} bound at {}", s(base), s(rel), s(target)),
        Mount::Symlink { at, .. } => format!("the symlink {}", s(at)),
        Mount::Proc { target } => format!("/proc at {}", s(target)),
        Mount::Devpts { target } => format!("devpts at {}", s(target)),
        Mount::PrivateDir { path } => format!("the directory {}", s(path)),
        Mount::File { path, .. } => format!("the secret file {}", s(path)),
    }
}

/// A shared directory as jobs get it: absolute, an existing directory, and not in the
/// runner's own (which jobs never see).
fn check_shared(path: &Path, runner_dir: &Path) -> Result<PathBuf, SandboxError> {
    let bad = |why: &str| SandboxError::Shared {
        path: path.to_owned(),
        why: why.into(),
    };
    if !path.is_absolute() {
        return Err(bad("give an absolute path"));
    }
    let real = std::fs::canonicalize(path).map_err(|e| bad(&format!("{e}")))?;
    if !real.is_dir() {
        return Err(bad("not a directory"));
    }
    if real.starts_with(runner_dir) || runner_dir.starts_with(&real) {
        return Err(bad(&format!(
            "it holds or lies in the runner's directory {}, which jobs never see",
            runner_dir.display()
        )));
    }
    Ok(real)
}
