//! The supervisor: keeps one child process alive, safely.
//!
//! Tasks:
//! - the *supervision task* (`run`, one per started supervisor): launches the child,
//!   waits for it to exit or for a stop request, restarts it after a backoff, and on stop
//!   terminates its whole process group. In: a stop request (watch channel). Out: the
//!   published [`Status`].
//! - the *log thread* ([`log::Pump`]): copies the child's stdout and stderr into the
//!   capped log file. Blocking I/O stays off the async runtime. At stop, once the child's
//!   group is gone, it takes what is left in the pipe and ends, without waiting for a
//!   process that escaped the group and still holds the pipe.
//!
//! Callers hold a [`Supervisor`] and use its systemctl-like verbs: `start` (a no-op when
//! running), `stop` (a no-op when stopped), `alive`, `starts`, `last_error`, `status`.
//! [`run_once`] runs a short task the same way (same checks, account and environment) to
//! its end, with its output captured.
//!
//! What it promises (docs/design.md, invariants 1–5): never uid 0 for the child, decided when
//! the supervisor is constructed; an environment built from nothing; an owner-only log
//! that never holds more than twice its cap; the child leads its own session and process
//! group, and stop takes the whole group down (SIGTERM, grace, SIGKILL); restarts back off.

pub mod access;
pub mod account;
pub mod backoff;
pub mod env;
pub mod lock;
pub mod log;
pub mod proc_tree;

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::{watch, Mutex};
use tokio::time::Instant;

use railgrid_sys as sys;
use railgrid_util as util;
use railgrid_util::env_policy::{self, EnvError};
use railgrid_util::error_chain;
use sys::exe::{ExeError, PinnedExe};
use sys::group::Sig;
use sys::spawn::{self, Credentials};
use sys::ProcessId;

use crate::proc_tree::Group;
use crate::proc_tree::Reapable;

use self::account::Account;
use self::backoff::Backoff;
use self::log::{CappedLog, LogError, Pump, SharedLog};

pub use self::env::DEFAULT_PATH;

/// First restart pause.
pub const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// Longest restart pause.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// A child that ran this long is taken as healthy: the next pause starts from the initial one.
pub const DEFAULT_STABLE_AFTER: Duration = Duration::from_secs(10);
/// Time between SIGTERM and SIGKILL.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);
/// Log cap; `<log>.1` holds at most as much again.
pub const DEFAULT_MAX_LOG_BYTES: u64 = 8 * 1024 * 1024;
/// Smallest accepted log cap: below it rotation would churn on every line.
pub const MIN_LOG_BYTES: u64 = 1024;
/// Most stop waits for the log thread to copy what the child wrote last: it takes what is
/// in the pipe without waiting for writers, so this is only reached on a stalled disk.
const LOG_DRAIN: Duration = Duration::from_secs(2);
/// How long a process that escaped the group may hold [`run_once`]'s pipes.
const KILL_WAIT: Duration = crate::proc_tree::KILL_WAIT;

/// Whom the child runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// As the supervisor itself. Refused when the supervisor is root.
    Inherit,
    /// As this account. Only a root supervisor can switch, and never to uid or gid 0.
    User(Account),
}

/// What to supervise and how. Validated by [`Supervisor::new`].
#[derive(Debug, Clone)]
pub struct Config {
    /// Used in log lines and errors.
    pub name: String,
    /// Absolute path of the program.
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Working directory; must exist.
    pub dir: PathBuf,
    /// The child's *complete* environment (see [`env::child_env`]).
    pub env: Vec<(String, String)>,
    pub identity: Identity,
    pub log: PathBuf,
    pub max_log_bytes: u64,
    pub stop_grace: Duration,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub stable_after: Duration,
    /// A cgroup v2 directory the child joins before exec, at every launch. One that cannot
    /// be opened is logged and the child starts where the supervisor is.
    pub cgroup: Option<PathBuf>,
    /// The program's bytes, pinned (the agent's own executable, for its runner). When set,
    /// every launch first verifies them and then execs them, not the file `program` names
    /// now, which stays argv[0] and the name in messages (see [`sys::exe`]).
    pub exe: Option<Arc<PinnedExe>>,
}

impl Config {
    /// A config with the documented defaults for everything but what must be chosen.
    pub fn new(
        name: impl Into<String>,
        program: impl Into<PathBuf>,
        log: impl Into<PathBuf>,
    ) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            dir: PathBuf::from("/"),
            env: Vec::new(),
            identity: Identity::Inherit,
            log: log.into(),
            max_log_bytes: DEFAULT_MAX_LOG_BYTES,
            stop_grace: DEFAULT_STOP_GRACE,
            initial_backoff: DEFAULT_INITIAL_BACKOFF,
            max_backoff: MAX_BACKOFF,
            stable_after: DEFAULT_STABLE_AFTER,
            cgroup: None,
            exe: None,
        }
    }
}

#[derive(Debug, Error)]
pub enum Error {
    #[error(
        "refusing to run {name} as root: a root supervisor needs a non-root account for its child"
    )]
    RootChild { name: String },
    #[error("refusing to run {name} as uid {uid} gid 0 ({user}): the child must not be in the root group")]
    RootGroup {
        name: String,
        uid: u32,
        user: String,
    },
    #[error("refusing to run {name} as uid {wanted}: only root can switch users, and this process runs as uid {ours}")]
    OtherUser {
        name: String,
        wanted: u32,
        ours: u32,
    },
    #[error("program {path} is not an absolute path")]
    RelativeProgram { path: PathBuf },
    #[error("program {path} cannot be used")]
    Program {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("program {path} is not an executable file")]
    NotExecutable { path: PathBuf },
    #[error("working directory {path} cannot be used")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("working directory {path} is not a directory")]
    NotADir { path: PathBuf },
    #[error("{name} cannot run as uid {uid}: {} is mode {:04o} owned by uid {}, and that account may not {} it", denied.at.display(), denied.mode, denied.owner, denied.need)]
    Denied {
        name: String,
        uid: u32,
        denied: access::Denied,
    },
    #[error("invalid environment for {name}")]
    Env {
        name: String,
        #[source]
        source: EnvError,
    },
    #[error("could not read the supplementary groups of user {user}")]
    Groups {
        user: String,
        #[source]
        source: std::io::Error,
    },
    #[error("max log bytes {got} is below the minimum of {min}")]
    LogTooSmall { got: u64, min: u64 },
    #[error("initial backoff must be greater than zero")]
    ZeroBackoff,
    #[error("could not launch {name} ({path})")]
    Launch {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{name} not launched")]
    Pinned {
        name: String,
        #[source]
        source: ExeError,
    },
    #[error(transparent)]
    Log(#[from] LogError),
}

/// What the child is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Stopped,
    Running,
    Backoff,
}

/// A snapshot of the supervisor, published on every change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub state: State,
    pub pid: Option<u32>,
    pub starts: u64,
    pub last_error: Option<String>,
    /// When `state` last changed.
    #[serde(with = "crate::util::unix_secs")]
    pub since: SystemTime,
}

/// Keeps one child alive. See the module docs.
pub struct Supervisor {
    inner: Arc<Inner>,
    ctl: Mutex<Option<Running>>,
}

struct Inner {
    config: Config,
    /// The arguments of the next launch: `config.args` until [`Supervisor::set_args`].
    args: std::sync::Mutex<Vec<OsString>>,
    creds: Option<Credentials>,
    starts: AtomicU64,
    status: watch::Sender<Status>,
    /// One log for the supervisor's whole life, appended across starts and restarts.
    log: SharedLog,
}

/// A started supervision task and the way to stop it.
struct Running {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Supervisor {
    /// Validates `config` and opens the log. Everything the child could be refused for is
    /// refused here, with an error that says why, never at exec time.
    pub fn new(config: Config) -> Result<Self, Error> {
        let creds = validate(&config)?;
        if config.max_log_bytes < MIN_LOG_BYTES {
            return Err(Error::LogTooSmall {
                got: config.max_log_bytes,
                min: MIN_LOG_BYTES,
            });
        }
        if config.initial_backoff.is_zero() {
            return Err(Error::ZeroBackoff);
        }
        let log = Arc::new(std::sync::Mutex::new(CappedLog::open(
            &config.log,
            config.max_log_bytes,
        )?));
        let (status, _) = watch::channel(Status {
            state: State::Stopped,
            pid: None,
            starts: 0,
            last_error: None,
            since: SystemTime::now(),
        });
        Ok(Self {
            inner: Arc::new(Inner {
                args: std::sync::Mutex::new(config.args.clone()),
                config,
                creds,
                starts: AtomicU64::new(0),
                status,
                log,
            }),
            ctl: Mutex::new(None),
        })
    }

    /// The configuration it was built with (its `args` are those of the first launch;
    /// see [`Supervisor::set_args`]).
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Replaces the arguments of every later launch (a restart after an unexpected exit,
    /// or the next `start`); the child running now keeps its own. For a setting the
    /// running child was told some other way, so that a restart does not undo it.
    pub fn set_args(&self, args: Vec<OsString>) {
        *crate::util::lock(&self.inner.args) = args;
    }

    /// Starts supervising. A no-op while running, so a reconcile loop may call it on every
    /// pass. Launch failures do not fail `start`: they are retried with backoff and show in
    /// [`Supervisor::last_error`].
    pub async fn start(&self) -> Result<(), Error> {
        let mut ctl = self.ctl.lock().await;
        if ctl.as_ref().is_some_and(|r| !r.task.is_finished()) {
            return Ok(());
        }
        let pump = Pump::start(self.inner.log.clone())?;
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(self.inner.clone(), stop_rx, pump));
        *ctl = Some(Running { stop, task });
        Ok(())
    }

    /// Stops the child's whole process group (SIGTERM, `stop_grace`, SIGKILL), reaps it and
    /// waits for the supervision task to end. A no-op when stopped.
    pub async fn stop(&self) {
        let mut ctl = self.ctl.lock().await;
        if let Some(Running { stop, task }) = ctl.take() {
            let _ = stop.send(true);
            let _ = task.await;
        }
    }

    /// True while a child process exists (not while backing off or stopped).
    pub fn alive(&self) -> bool {
        self.inner.status.borrow().state == State::Running
    }

    /// How many times a child was launched.
    pub fn starts(&self) -> u64 {
        self.inner.starts.load(Ordering::Relaxed)
    }

    /// The latest unexpected exit or launch failure.
    pub fn last_error(&self) -> Option<String> {
        self.inner.status.borrow().last_error.clone()
    }

    pub fn status(&self) -> Status {
        self.inner.status.borrow().clone()
    }

    /// A receiver that sees every status change.
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.inner.status.subscribe()
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        // Best effort: a dropped supervisor must not leave its child running unsupervised.
        // The task, if the runtime is still alive, stops the group.
        if let Ok(ctl) = self.ctl.try_lock() {
            if let Some(running) = &*ctl {
                let _ = running.stop.send(true);
            }
        }
    }
}

impl Inner {
    fn publish(&self, f: impl FnOnce(&mut Status)) {
        self.status.send_modify(|s| {
            let before = s.state;
            f(s);
            s.starts = self.starts.load(Ordering::Relaxed);
            if s.state != before {
                s.since = SystemTime::now();
            }
        });
    }

    fn launch(&self, log_fd: &std::os::fd::OwnedFd) -> std::io::Result<tokio::process::Child> {
        let c = &self.config;
        let args = crate::util::lock(&self.args).clone();
        let mut cmd = std::process::Command::new(&c.program);
        cmd.args(&args)
            .env_clear()
            .envs(c.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_fd.try_clone()?))
            .stderr(Stdio::from(log_fd.try_clone()?));
        let procs = c.cgroup.as_ref().and_then(|dir| {
            let path = dir.join("cgroup.procs");
            match fs::OpenOptions::new().write(true).open(&path) {
                Ok(f) => Some(std::os::fd::OwnedFd::from(f)),
                Err(e) => {
                    tracing::warn!(child = %c.name, path = %path.display(), error = %e, "cannot start the child in its cgroup; starting it in ours");
                    None
                }
            }
        });
        spawn::session_leader_as(
            &mut cmd,
            self.creds.clone(),
            spawn::WorkDir::Path(&c.dir),
            procs,
        )?;
        exec_pinned(c, &args, &mut cmd)?;
        tokio::process::Command::from(cmd).spawn()
    }
}

/// The supervision task.
async fn run(inner: Arc<Inner>, mut stop: watch::Receiver<bool>, pump: Pump) {
    let c = &inner.config;
    let mut backoff = Backoff::new(c.initial_backoff, c.max_backoff, c.stable_after);
    loop {
        let started = Instant::now();
        let launched = match verify_pinned(c).await {
            Ok(()) => inner
                .launch(&pump.child_end)
                .map_err(|e| format!("could not launch {}: {e}", c.program.display())),
            Err(e) => Err(crate::error_chain(&e)),
        };
        let outcome = match launched {
            Ok(mut child) => {
                let n = inner.starts.fetch_add(1, Ordering::Relaxed) + 1;
                let pid = child.id().and_then(ProcessId::from_u32);
                inner.publish(|s| {
                    s.state = State::Running;
                    s.pid = pid.map(|p| p.get() as u32);
                });
                tracing::info!(child = %c.name, pid = pid.map(|p| p.get()), start = n, "started");
                tokio::select! {
                    // Cancel-safe: `Child::wait` may be dropped and called again.
                    status = child.wait() => {
                        let why = match status {
                            Ok(status) => describe(status),
                            Err(e) => format!("could not be waited for: {e}"),
                        };
                        tracing::warn!(child = %c.name, pid = pid.map(|p| p.get()), ran_for = ?started.elapsed(), "exited unexpectedly: {why}");
                        // Descendants that stayed in the group do not outlive their leader.
                        if let Some(pgid) = pid {
                            terminate_group(&c.name, pgid, c.stop_grace).await;
                        }
                        Some(why)
                    }
                    // Cancel-safe: `changed` only observes the channel.
                    _ = stop.changed() => {
                        if let Some(pgid) = pid {
                            stop_child(&c.name, &mut child, pgid, c.stop_grace).await;
                        }
                        None
                    }
                }
            }
            Err(why) => {
                tracing::warn!(child = %c.name, "{why}");
                Some(why)
            }
        };
        let Some(why) = outcome else { break };
        let delay = backoff.after_exit(started.elapsed());
        inner.publish(|s| {
            s.state = State::Backoff;
            s.pid = None;
            s.last_error = Some(why);
        });
        tracing::info!(child = %c.name, delay = ?delay, "restarting after backoff");
        tokio::select! {
            // Cancel-safe: sleeping holds no state.
            _ = tokio::time::sleep(delay) => {}
            // Cancel-safe: as above.
            _ = stop.changed() => break,
        }
    }
    inner.publish(|s| {
        s.state = State::Stopped;
        s.pid = None;
    });
    tracing::info!(child = %c.name, "stopped");
    // Every group this task started is gone (stopped, or cleaned up after its leader
    // exited), so their output is all in the pipe; a process that escaped them may hold
    // the pipe open, and is not waited for.
    pump.finish(LOG_DRAIN).await;
}

/// Everything a child could be refused for, decided before any launch: whom it runs as,
/// its program, its directory (judged with the child's eyes), its environment.
fn validate(config: &Config) -> Result<Option<Credentials>, Error> {
    let creds = credentials(config)?;
    check_program(config)?;
    match fs::metadata(&config.dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Error::NotADir {
                path: config.dir.clone(),
            })
        }
        Err(source) => {
            return Err(Error::Dir {
                path: config.dir.clone(),
                source,
            })
        }
    }
    if let Some(c) = &creds {
        // Root may go anywhere; the child may not. Judge with the child's eyes.
        let who = access::Who {
            uid: c.uid,
            groups: c.groups.clone(),
        };
        let denied = |denied| Error::Denied {
            name: config.name.clone(),
            uid: c.uid,
            denied,
        };
        match &config.exe {
            // Exec'd by descriptor: only the file's own mode counts, not the path to it.
            #[cfg(target_os = "linux")]
            Some(exe) => who
                .can_execute_file(&config.program, exe.metadata())
                .map_err(denied)?,
            _ => who.can_execute(&config.program).map_err(denied)?,
        }
        who.can_reach(&config.dir, true).map_err(denied)?;
    }
    for (k, v) in &config.env {
        env_policy::check(k, v).map_err(|source| Error::Env {
            name: config.name.clone(),
            source,
        })?;
    }
    Ok(creds)
}

/// What [`run_once`] saw of a short task.
#[derive(Debug)]
pub struct Finished {
    /// `None` when it was killed at the timeout.
    pub status: Option<ExitStatus>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Most output [`run_once`] keeps per stream; the rest is read and dropped.
const MAX_ONCE_OUTPUT: u64 = 1024 * 1024;

/// Runs `config`'s program once, to its end: validated, launched and confined as the
/// supervised child would be (same account, environment from nothing, own session, its
/// directory), for a short task of that child's (the runner's `reap`). Its stdout and
/// stderr are captured rather than logged; `cgroup` and the log settings are not used.
/// Past `timeout`, its process group is SIGKILLed and reaped, and `status` is `None`.
pub async fn run_once(config: &Config, timeout: Duration) -> Result<Finished, Error> {
    use tokio::io::AsyncReadExt;
    let creds = validate(config)?;
    let launch_err = |source| Error::Launch {
        name: config.name.clone(),
        path: config.program.clone(),
        source,
    };
    let mut cmd = std::process::Command::new(&config.program);
    cmd.args(&config.args)
        .env_clear()
        .envs(config.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn::session_leader_as(&mut cmd, creds, spawn::WorkDir::Path(&config.dir), None)
        .map_err(launch_err)?;
    verify_pinned(config).await?;
    exec_pinned(config, &config.args, &mut cmd).map_err(launch_err)?;
    let mut child = tokio::process::Command::from(cmd)
        .spawn()
        .map_err(launch_err)?;
    let pid = child.id().and_then(ProcessId::from_u32);
    let collect = |pipe: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>| {
        tokio::spawn(async move {
            let mut kept = Vec::new();
            if let Some(mut p) = pipe {
                let _ = (&mut p).take(MAX_ONCE_OUTPUT).read_to_end(&mut kept).await;
                let _ = tokio::io::copy(&mut p, &mut tokio::io::sink()).await;
            }
            kept
        })
    };
    let stdout = collect(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = collect(child.stderr.take().map(|p| Box::new(p) as _));
    let status = tokio::select! {
        // Cancel-safe: `Child::wait` may be dropped and called again.
        s = child.wait() => s.ok(),
        // Cancel-safe: sleeping holds no state.
        () = tokio::time::sleep(timeout) => None,
    };
    if status.is_none() {
        // Not reaped yet, so the group id cannot have been reused.
        tracing::warn!(child = %config.name, pid = pid.map(|p| p.get()), timeout = ?timeout, "did not finish in time: SIGKILL to its process group");
        if let Some(Ok(g)) = pid.map(|pgid| Group::new(&config.name, pgid.get())) {
            g.kill_now();
        }
        let _ = child.wait().await;
    }
    // Its group is gone; a process that left it and holds a pipe is not waited for long.
    let output = |h: tokio::task::JoinHandle<Vec<u8>>| async move {
        match tokio::time::timeout(KILL_WAIT, h).await {
            Ok(Ok(kept)) => kept,
            _ => Vec::new(),
        }
    };
    let stdout = output(stdout).await;
    let stderr = output(stderr).await;
    Ok(Finished {
        status,
        stdout,
        stderr,
    })
}

/// SIGTERM to the child's group, wait for the child and every live member of the group up
/// to `grace`, then SIGKILL the group and reap.
async fn stop_child(name: &str, child: &mut impl Reapable, pgid: ProcessId, grace: Duration) {
    let g = match Group::new(name, pgid.get()) {
        Ok(g) => g,
        Err(e) => return tracing::error!(child = %name, error = %e, "not stopping the child"),
    };
    tracing::info!(child = %name, pid = pgid.get(), grace = ?grace, "stopping: SIGTERM to the process group");
    let out = g
        .stop_leader(child, grace, None, |_| {
            tracing::warn!(child = %name, pid = pgid.get(), "grace period over: SIGKILL to the process group");
        })
        .await;
    if let Some(status) = out.leader {
        tracing::info!(child = %name, pid = pgid.get(), "exited: {}", describe(status));
    }
    if out.survivors {
        tracing::error!(child = %name, pgid = pgid.get(), "process group still has live members after SIGKILL");
    }
}

/// Cleans up what a child that exited by itself left in its group.
async fn terminate_group(name: &str, pgid: ProcessId, grace: Duration) {
    let Ok(g) = Group::new(name, pgid.get()) else {
        return;
    };
    if !g.alive() {
        return;
    }
    tracing::warn!(child = %name, pgid = pgid.get(), "the child left processes in its group: SIGTERM");
    g.terminate(grace, None, |_| {
        tracing::warn!(child = %name, pgid = pgid.get(), "grace period over: SIGKILL to the leftover group");
    })
    .await;
}

/// Checks, off the runtime threads (it hashes the file), that a pinned program is still
/// the bytes it was pinned as; a program that is not pinned passes.
async fn verify_pinned(c: &Config) -> Result<(), Error> {
    let Some(exe) = c.exe.clone() else {
        return Ok(());
    };
    let checked = tokio::task::spawn_blocking(move || exe.verify())
        .await
        .unwrap_or_else(|e| {
            Err(ExeError::Read {
                path: c.program.clone(),
                source: std::io::Error::other(e),
            })
        });
    checked.map_err(|source| Error::Pinned {
        name: c.name.clone(),
        source,
    })
}

/// Makes `cmd` exec `c`'s pinned bytes with `args` (last, after every other step), when
/// it has them.
fn exec_pinned(
    c: &Config,
    args: &[OsString],
    cmd: &mut std::process::Command,
) -> std::io::Result<()> {
    let Some(exe) = &c.exe else {
        return Ok(());
    };
    let argv: Vec<&std::ffi::OsStr> = std::iter::once(c.program.as_os_str())
        .chain(args.iter().map(OsString::as_os_str))
        .collect();
    exe.exec_pinned(cmd, &argv, &c.env)
}

/// "exited with status 3" or "killed by signal 9 (SIGKILL)".
pub fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    match status.signal() {
        Some(sig) => match Sig::try_from(sig) {
            Ok(name) => format!("killed by signal {sig} ({name})"),
            Err(_) => format!("killed by signal {sig}"),
        },
        None => format!("ended with {status}"),
    }
}

fn check_program(c: &Config) -> Result<(), Error> {
    if !c.program.is_absolute() {
        return Err(Error::RelativeProgram {
            path: c.program.clone(),
        });
    }
    // Pinned bytes are what runs, whatever the path names now.
    let meta = match &c.exe {
        Some(exe) => exe.metadata().clone(),
        None => fs::metadata(&c.program).map_err(|source| Error::Program {
            path: c.program.clone(),
            source,
        })?,
    };
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(Error::NotExecutable {
            path: c.program.clone(),
        });
    }
    Ok(())
}

/// Decides, once, whom the child runs as (invariant 1).
fn credentials(c: &Config) -> Result<Option<Credentials>, Error> {
    let (uid, gid) = sys::current_ids();
    let root = uid == 0;
    match &c.identity {
        Identity::Inherit if root => Err(Error::RootChild {
            name: c.name.clone(),
        }),
        Identity::Inherit => Ok(None),
        Identity::User(acct) if !root => {
            if acct.uid == uid && acct.gid == gid {
                Ok(None)
            } else {
                Err(Error::OtherUser {
                    name: c.name.clone(),
                    wanted: acct.uid,
                    ours: uid,
                })
            }
        }
        Identity::User(acct) => {
            if acct.uid == 0 {
                return Err(Error::RootChild {
                    name: c.name.clone(),
                });
            }
            let root_group = || Error::RootGroup {
                name: c.name.clone(),
                uid: acct.uid,
                user: acct.name.clone(),
            };
            if acct.gid == 0 {
                return Err(root_group());
            }
            // initgroups for a named account; none but the primary for a bare uid.
            let groups = match Account::by_uid(acct.uid) {
                Some(known) if known.name == acct.name => spawn::group_list(&acct.name, acct.gid)
                    .map_err(|source| Error::Groups {
                    user: acct.name.clone(),
                    source,
                })?,
                _ => vec![acct.gid],
            };
            if groups.contains(&0) {
                return Err(root_group());
            }
            Ok(Some(Credentials {
                uid: acct.uid,
                gid: acct.gid,
                groups,
            }))
        }
    }
}
