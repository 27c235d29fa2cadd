//! The job engine: admission, scheduling, supervision of each job, reconciliation after a
//! restart, and retention.
//!
//! This file holds the handle ([`Engine`]), the state its tasks share (`Inner`), the limits and
//! the errors. Each part of the work has a file of its own: `admission` (submit, cancel, the
//! FIFO queue and per-owner limits), `lifecycle` (one job from launch to its recorded end),
//! `reconcile` (what a previous runner left), `retention` (deleting old finished jobs),
//! `query` (reads and `wait`) and `shutdown` (the stop and its budget).
//!
//! Tasks:
//! - one *job task* per started job (`run_job`, in `lifecycle`): spawns it, waits for exit,
//!   timeout or cancel, stops its process group (SIGTERM, kill grace, SIGKILL), records the
//!   outcome.
//! - two *spool tasks* per job (see [`super::job`]).
//! - one *leftover task* per job a previous runner left running (`end_leftover`, in
//!   `reconcile`, see [`super::leftover`]): started by `Engine::start` and run while the
//!   runner serves, so that a dead runner's jobs never delay the API. `/v1/health` counts them.
//!
//! Stop: `shutdown` takes a deadline (the runner's stop budget less a reserve); every kill
//! grace, of jobs and leftovers alike, is cut to fit it, and a stop still running when it
//! passes ends with SIGKILL (`cgroup.kill`).
//!
//! State: the store is the truth for every job (with the state changes it holds in memory
//! while the disk is full, which reads show); the scheduler (`Sched`) holds only the
//! admission limits in force, the FIFO queue and what runs now. Every change bumps
//! `activity`, which waiters and followers watch, and so does the commit of a held change
//! (`when_recorded`).

mod admission;
mod drain;
pub use self::drain::DrainError;
mod lifecycle;
mod query;
pub use self::query::Until;
mod reconcile;
mod retention;
mod shutdown;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;

use self::admission::{Limits, Sched};
pub use self::retention::Totals;
use super::confine::{CgroupTier, FsGuard};
use super::job::{self, JobError, JobPaths};
use super::sandbox::Sandboxing;
use super::store::{JobStoreError, Store};
use crate::proto::job::JobSpec;
use crate::proto::spec::SpecError;

pub use crate::proto::runner::DEFAULT_MAX_KEPT_BYTES;

/// Limits of one runner. The admission limits (`max_jobs`, `max_jobs_per_owner`,
/// `max_queued`) are those it starts with: [`Engine::set_admission`] changes them while it
/// runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub max_jobs: usize,
    /// `None`: as many as `max_jobs`, and changed with it until it is set.
    pub max_jobs_per_owner: Option<usize>,
    pub max_queued: usize,
    /// Per stream.
    pub max_output_bytes: u64,
    pub max_finished_jobs: usize,
    pub max_spool_bytes: u64,
    /// Spools and workspaces of finished jobs, together.
    pub max_kept_bytes: u64,
    /// Every job's PATH unless its spec sets one; `None` is [`crate::supervisor::DEFAULT_PATH`].
    pub job_path: Option<String>,
    /// Start jobs with fork and exec even where `clone` with a pidfd works.
    pub force_fork: bool,
    /// Every job's sandbox (`runner.sandbox*`).
    pub sandbox: crate::sandbox::SandboxConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_jobs: crate::proto::runner::default_max_jobs(),
            max_jobs_per_owner: None,
            max_queued: crate::proto::runner::DEFAULT_MAX_QUEUED,
            max_output_bytes: 64 * 1024 * 1024,
            max_finished_jobs: 1000,
            max_spool_bytes: 1024 * 1024 * 1024,
            max_kept_bytes: DEFAULT_MAX_KEPT_BYTES,
            job_path: None,
            force_fork: false,
            sandbox: crate::sandbox::SandboxConfig::default(),
        }
    }
}

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Job(JobError),
    #[error("job {} already exists with a different spec", crate::util::clip(.id))]
    Conflict { id: String },
    #[error("the queue is full ({max} jobs waiting): retry later")]
    QueueFull { max: usize },
    #[error("{field} must be at least 1: with no room to run, queued jobs would wait forever (to take no new jobs, set max_queued to 0)")]
    InvalidAdmission { field: &'static str },
    #[error("no job {}", crate::util::clip(.id))]
    NotFound { id: String },
    #[error("the runner is shutting down")]
    ShuttingDown,
    #[error("this host is draining: {reason}; it takes no new job until the drain ends (`railgrid agent resume` on the host, or `hub agent resume` at the hub)")]
    Draining { reason: String },
    #[error(transparent)]
    Drain(#[from] DrainError),
    #[error("this runner requires a sandbox for every job (runner.sandbox = \"required\"), and this host cannot make one: {why}")]
    NoSandbox { why: String },
    #[error("the job asks for network \"{asked}\", wider than this runner's policy (runner.network = \"{policy}\"): a job may narrow it, never widen it, unless its submitter may (the hub's jobs:network scope)")]
    NetworkWider {
        asked: crate::proto::job::Network,
        policy: crate::proto::job::Network,
    },
    #[error("the job's secrets ({names}) were held in this runner's memory only, and the runner that admitted it is gone: submit the job again")]
    SecretsLost { names: String },
    #[error(
        "network \"{network}\" is kept by the job's sandbox, and this host cannot make one: {why}"
    )]
    NoNetworkSandbox { network: &'static str, why: String },
    #[error(transparent)]
    Sandbox(crate::sandbox::SandboxError),
    #[error(transparent)]
    Store(#[from] JobStoreError),
    #[error("internal task failed: {0}")]
    Task(String),
}

impl EngineError {
    /// Refused for want of disk space (507): the job database is full or holds too many
    /// unwritten changes, or the job's workspace could not be made.
    pub fn is_disk_full(&self) -> bool {
        match self {
            EngineError::Store(e) => e.is_disk_full(),
            EngineError::Job(JobError::Io { source, .. }) => crate::sys::errno::is_no_space(source),
            _ => false,
        }
    }
}

/// A job's secrets, name to value.
pub type Secrets = std::collections::BTreeMap<String, String>;

struct Inner {
    cfg: EngineConfig,
    totals: Mutex<Totals>,
    paths: JobPaths,
    store: Arc<Store>,
    sched: Mutex<Sched>,
    activity: watch::Sender<u64>,
    shutting_down: AtomicBool,
    ids: AtomicU64,
    /// The values of admitted jobs' secrets, by job id, in memory only (docs/security.md,
    /// "Secrets"): taken when the job starts, gone with it.
    secrets: Mutex<std::collections::HashMap<String, Secrets>>,
    /// Serializes retention passes.
    retention: tokio::sync::Mutex<()>,
    /// Job tasks, awaited at shutdown.
    tasks: Mutex<tokio::task::JoinSet<()>>,
    /// The cgroup tier, when the runner's cgroup is delegated to it.
    cgroups: Option<CgroupTier>,
    /// The Landlock ruleset jobs restrict themselves to, where the kernel has Landlock.
    fs_guard: Option<FsGuard>,
    /// How job processes are started on this host.
    launch: job::LaunchMethod,
    /// Every job's sandbox, where the host lets the runner make one.
    sandbox: Sandboxing,
    /// When the stop must be done by; set by `shutdown`.
    stop_deadline: watch::Sender<Option<Instant>>,
    /// Leftovers of a previous runner (jobs and job cgroups) not yet ended.
    reconciling: AtomicUsize,
    /// The drain in force (see `drain`), kept in `drain_file` across runner restarts.
    drain: watch::Sender<Option<crate::proto::drain::Drain>>,
    drain_file: PathBuf,
}

/// A handle to the engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// Runs `f` on the blocking pool (store reads, file removal), never on a runtime worker;
/// every part of the engine goes through it.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, EngineError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| EngineError::Task(e.to_string()))
}

impl Engine {
    /// Opens the store, starts ending what a previous runner left (in the background), and
    /// re-queues queued jobs. Returns without waiting for any process.
    pub async fn start(runner_dir: PathBuf, cfg: EngineConfig) -> Result<Self, EngineError> {
        let limits = Limits::new(cfg.max_jobs, cfg.max_jobs_per_owner, cfg.max_queued)?;
        let paths = JobPaths::open(&runner_dir).map_err(EngineError::Job)?;
        let force_fork = cfg.force_fork;
        let sandbox = {
            let (config, dir) = (cfg.sandbox.clone(), runner_dir.clone());
            blocking(move || Sandboxing::detect(config, &dir))
                .await?
                .map_err(EngineError::Sandbox)?
        };
        let db = runner_dir.join("jobs.db");
        let store = Arc::new(blocking(move || Store::open(&db)).await??);
        let drain_file = runner_dir.join(drain::DRAIN_FILE);
        let path = drain_file.clone();
        let drain = blocking(move || drain::load(&path)).await?;
        let (activity, _) = watch::channel(0);
        let engine = Self {
            inner: Arc::new(Inner {
                cfg,
                totals: Mutex::new(Totals::default()),
                retention: tokio::sync::Mutex::new(()),
                paths,
                store,
                sched: Mutex::new(Sched::new(limits)),
                activity,
                shutting_down: AtomicBool::new(false),
                ids: AtomicU64::new(0),
                secrets: Mutex::new(std::collections::HashMap::new()),
                tasks: Mutex::new(tokio::task::JoinSet::new()),
                cgroups: CgroupTier::detect(),
                fs_guard: runner_dir.parent().and_then(FsGuard::detect),
                launch: job::LaunchMethod::detect(force_fork),
                sandbox,
                stop_deadline: watch::channel(None).0,
                reconciling: AtomicUsize::new(0),
                drain: watch::channel(drain).0,
                drain_file,
            }),
        };
        engine.reconcile().await?;
        engine.spawn_drain_deadline();
        Ok(engine)
    }

    fn bump(&self) {
        self.inner.activity.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that changes whenever any job changes state or writes output.
    pub fn activity(&self) -> watch::Receiver<u64> {
        self.inner.activity.subscribe()
    }

    pub fn paths(&self) -> &JobPaths {
        &self.inner.paths
    }

    /// Limits of `spec` this host will not enforce as asked, and why.
    pub fn unenforced(&self, spec: &JobSpec) -> Vec<String> {
        spec.limits
            .as_ref()
            .map(|l| super::confine::unenforced(self.inner.cgroups.as_ref(), l))
            .unwrap_or_default()
    }

    /// The confinement tier jobs get: `cgroup` or `process-group`.
    pub fn confinement(&self) -> &'static str {
        CgroupTier::name(self.inner.cgroups.as_ref())
    }

    /// What keeps jobs away from the runner and each other: see `FsGuard::isolation`;
    /// `none` without it.
    pub fn isolation(&self) -> &'static str {
        self.inner
            .fs_guard
            .as_ref()
            .map_or("none", FsGuard::isolation)
    }

    /// Which sandbox jobs get: `namespaces+seccomp`, or `none: why`.
    pub fn sandbox(&self) -> String {
        match self.inner.sandbox.unavailable() {
            None => "namespaces+seccomp".into(),
            Some(why) => format!("none: {why}"),
        }
    }

    /// The network jobs reach unless they ask for less.
    pub fn network(&self) -> &crate::proto::job::Network {
        self.inner.sandbox.network()
    }

    /// Why `spec` is refused for its network: wider than the runner's policy, or `none`
    /// where no sandbox can keep it.
    pub(super) fn network_refusal(&self, spec: &JobSpec) -> Option<EngineError> {
        let policy = self.inner.sandbox.network();
        let asked = self.inner.sandbox.network_of(spec.network.as_ref());
        if !spec.widen_network && !asked.within(policy) {
            return Some(EngineError::NetworkWider {
                asked,
                policy: policy.clone(),
            });
        }
        if asked.own_namespace() {
            if let Some(why) = self.inner.sandbox.unavailable() {
                return Some(EngineError::NoNetworkSandbox {
                    network: asked.kind(),
                    why: why.to_owned(),
                });
            }
        }
        None
    }

    /// Why a job is refused for want of a sandbox (`runner.sandbox = "required"` on a
    /// host that refuses one).
    pub(super) fn sandbox_refusal(&self) -> Option<String> {
        let s = &self.inner.sandbox;
        (s.mode() == crate::sandbox::SandboxMode::Required)
            .then(|| s.unavailable().map(str::to_owned))
            .flatten()
    }

    /// `clone-vfork` or `fork`: how jobs are started (see `job::LaunchMethod`).
    pub fn launch_method(&self) -> &'static str {
        self.inner.launch.name()
    }

    /// The bound on what finished jobs keep on disk.
    pub fn max_kept_bytes(&self) -> u64 {
        self.inner.cfg.max_kept_bytes
    }

    /// Jobs starting or running, and jobs queued, counted at one instant (a job moving
    /// from the queue to its start is counted once).
    pub fn job_counts(&self) -> (usize, usize) {
        let s = self.sched();
        (s.running.len(), s.queue.len())
    }

    /// Jobs (and job cgroups) of a previous runner still being ended.
    pub fn reconciling(&self) -> usize {
        self.inner.reconciling.load(Ordering::Relaxed)
    }

    /// Job state changes held in memory because the database could not take them yet.
    pub fn commits_pending(&self) -> usize {
        self.inner.store.held_count()
    }
}
