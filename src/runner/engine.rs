//! The job engine: admission, scheduling, supervision of each job, reconciliation after a
//! restart, and retention.
//!
//! Tasks:
//! - one *job task* per started job (`run_job`): spawns it, waits for exit, timeout or
//!   cancel, stops its process group (SIGTERM, kill grace, SIGKILL), records the outcome.
//! - two *spool tasks* per job (see [`super::job`]).
//! - one *leftover task* per job a previous runner left running (`end_leftover`, see
//!   [`super::leftover`]): started by `Engine::start` and run while the runner serves, so
//!   that a dead runner's jobs never delay the API. `/v1/health` counts them.
//!
//! Stop: `shutdown` takes a deadline (the runner's stop budget less a reserve); every kill
//! grace, of jobs and leftovers alike, is cut to fit it, and a stop still running when it
//! passes ends with SIGKILL (`cgroup.kill`).
//!
//! State: the store is the truth for every job (with the state changes it holds in memory
//! while the disk is full, which reads show); the scheduler (`Sched`) holds only the FIFO
//! queue and what runs now. Every change bumps `activity`, which waiters and followers
//! watch, and so does the commit of a held change (`when_recorded`).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;

use super::confine::{CgroupTier, FsGuard, Tiers};
use super::job::{self, JobError, JobPaths, SpoolStats};
use super::leftover::{self, Context, Leftover};
use super::spec::{self, SpecError};
use super::store::{Inserted, Outcome, Recorded, Store, StoreError};
use crate::proc_tree::{self, Reapable};
use crate::proto::job::{JobRecord, JobSpec, JobState};
use crate::supervisor;
use crate::sys::{self, ProcessId};

/// Limits of one runner.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub max_jobs: usize,
    pub max_jobs_per_owner: usize,
    pub max_queued: usize,
    /// Per stream.
    pub max_output_bytes: u64,
    pub max_finished_jobs: usize,
    pub max_spool_bytes: u64,
    /// Every job's PATH unless its spec sets one; `None` is [`crate::supervisor::DEFAULT_PATH`].
    pub job_path: Option<String>,
    /// Start jobs with fork and exec even where `clone` with a pidfd works.
    pub force_fork: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Self {
            max_jobs: cpus,
            max_jobs_per_owner: cpus,
            max_queued: 1000,
            max_output_bytes: 64 * 1024 * 1024,
            max_finished_jobs: 1000,
            max_spool_bytes: 1024 * 1024 * 1024,
            job_path: None,
            force_fork: false,
        }
    }
}

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Job(JobError),
    #[error("job {id} already exists with a different spec")]
    Conflict { id: String },
    #[error("the queue is full ({max} jobs waiting): retry later")]
    QueueFull { max: usize },
    #[error("no job {id}")]
    NotFound { id: String },
    #[error("the runner is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("internal task failed: {0}")]
    Task(String),
}

impl EngineError {
    /// Refused for want of disk space (507): the job database is full or holds too many
    /// unwritten changes, or the job's workspace could not be made.
    pub fn is_disk_full(&self) -> bool {
        match self {
            EngineError::Store(e) => e.is_disk_full(),
            EngineError::Job(JobError::Io { source, .. }) => {
                source.raw_os_error() == Some(libc::ENOSPC)
                    || source.kind() == std::io::ErrorKind::StorageFull
            }
            _ => false,
        }
    }
}

struct RunningJob {
    owner: String,
    cancel: watch::Sender<Option<JobState>>,
    stdout: Option<Arc<SpoolStats>>,
    stderr: Option<Arc<SpoolStats>>,
}

/// A job waiting for admission.
struct Queued {
    id: String,
    owner: String,
    /// The spec, kept at hand so that starting the job needs no read of the store; left
    /// out when it carries a large stdin, which then waits in the store only.
    spec: Option<Arc<JobSpec>>,
}

impl Queued {
    fn new(id: String, owner: String, spec: JobSpec) -> Self {
        let small = spec
            .stdin
            .as_ref()
            .is_none_or(|s| s.len() <= MAX_QUEUED_STDIN);
        Self {
            id,
            owner,
            spec: small.then(|| Arc::new(spec)),
        }
    }
}

/// Specs with a larger stdin are read back from the store when their job starts, so that
/// a full queue does not hold its stdins in memory.
const MAX_QUEUED_STDIN: usize = 4096;

#[derive(Default)]
struct Sched {
    queue: VecDeque<Queued>,
    running: HashMap<String, RunningJob>,
    per_owner: HashMap<String, usize>,
}

/// Finished jobs kept, known without asking the store on every job's end.
#[derive(Debug, Default)]
struct Totals {
    count: usize,
    bytes: u64,
}

/// How many of the oldest finished jobs retention looks at per pass.
const RETAIN_BATCH: u32 = 64;

struct Inner {
    cfg: EngineConfig,
    totals: Mutex<Totals>,
    paths: JobPaths,
    store: Arc<Store>,
    sched: Mutex<Sched>,
    activity: watch::Sender<u64>,
    shutting_down: AtomicBool,
    ids: AtomicU64,
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
    /// When the stop must be done by; set by `shutdown`.
    stop_deadline: watch::Sender<Option<Instant>>,
    /// Leftovers of a previous runner (jobs and job cgroups) not yet ended.
    reconciling: AtomicUsize,
}

/// A handle to the engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

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
        let paths = JobPaths::open(&runner_dir).map_err(EngineError::Job)?;
        let force_fork = cfg.force_fork;
        let db = runner_dir.join("jobs.db");
        let store = Arc::new(blocking(move || Store::open(&db)).await??);
        let (activity, _) = watch::channel(0);
        let engine = Self {
            inner: Arc::new(Inner {
                cfg,
                totals: Mutex::new(Totals::default()),
                retention: tokio::sync::Mutex::new(()),
                paths,
                store,
                sched: Mutex::new(Sched::default()),
                activity,
                shutting_down: AtomicBool::new(false),
                ids: AtomicU64::new(0),
                tasks: Mutex::new(tokio::task::JoinSet::new()),
                cgroups: CgroupTier::detect(),
                fs_guard: runner_dir.parent().and_then(FsGuard::detect),
                launch: job::LaunchMethod::detect(force_fork),
                stop_deadline: watch::channel(None).0,
                reconciling: AtomicUsize::new(0),
            }),
        };
        engine.reconcile().await?;
        Ok(engine)
    }

    fn sched(&self) -> std::sync::MutexGuard<'_, Sched> {
        crate::util::lock(&self.inner.sched)
    }

    fn totals(&self) -> std::sync::MutexGuard<'_, Totals> {
        crate::util::lock(&self.inner.totals)
    }

    fn count_finished(&self, bytes: u64) {
        let mut t = self.totals();
        t.count += 1;
        t.bytes += bytes;
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

    /// `clone-vfork` or `fork`: how jobs are started (see `job::LaunchMethod`).
    pub fn launch_method(&self) -> &'static str {
        self.inner.launch.name()
    }

    pub fn running_count(&self) -> usize {
        self.sched().running.len()
    }

    /// Jobs (and job cgroups) of a previous runner still being ended.
    pub fn reconciling(&self) -> usize {
        self.inner.reconciling.load(Ordering::Relaxed)
    }

    /// Job state changes held in memory because the database could not take them yet.
    pub fn commits_pending(&self) -> usize {
        self.inner.store.held_count()
    }

    /// When a state change was held rather than committed (a full disk), wakes waiters
    /// once it is committed: `wait` returns only committed ends.
    fn when_recorded(&self, id: &str, what: &str, recorded: Recorded) {
        let Recorded::Held(later) = recorded else {
            return;
        };
        tracing::warn!(job = %id, change = what, "could not record the job's change yet (is the disk full?): it is kept in memory, shown by the API, and written as soon as the database takes it");
        let activity = self.inner.activity.clone();
        let id = id.to_owned();
        tokio::spawn(async move {
            match later.await {
                Ok(()) => tracing::info!(job = %id, "recorded the job's change held in memory"),
                Err(e) => {
                    tracing::error!(job = %id, error = %crate::error_chain(&e), "could not record the job's change")
                }
            }
            activity.send_modify(|n| *n = n.wrapping_add(1));
        });
    }

    /// Records left in `starting`/`running` by a previous runner become `lost`, after a
    /// job process that still lives (same pid *and* start time) has had its group killed:
    /// in the background, one task per job, each with at most [`leftover::RECONCILE_GRACE`].
    /// Queued jobs are queued again and may start meanwhile.
    async fn reconcile(&self) -> Result<(), EngineError> {
        let inner = self.inner.clone();
        #[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
        let (leftovers, ended_cgroups) =
            blocking(move || leftover::find(&inner.store, inner.cgroups.as_ref())).await??;
        let store = self.inner.store.clone();
        let (count, bytes) = blocking(move || store.finished_totals()).await??;
        *self.totals() = Totals { count, bytes };
        let store = self.inner.store.clone();
        let queued = blocking(move || store.in_states(&[JobState::Queued])).await??;
        {
            let mut s = self.sched();
            for rec in queued {
                s.queue.push_back(Queued::new(rec.id, rec.owner, rec.spec));
            }
        }
        #[cfg(target_os = "linux")]
        let n = leftovers.len() + ended_cgroups.len();
        #[cfg(not(target_os = "linux"))]
        let n = leftovers.len();
        if n > 0 {
            tracing::warn!(
                jobs = leftovers.len(),
                "ending what a previous runner left running, in the background"
            );
        }
        self.inner.reconciling.store(n, Ordering::Relaxed);
        {
            let mut tasks = crate::util::lock(&self.inner.tasks);
            for left in leftovers {
                let engine = self.clone();
                tasks.spawn(async move { engine.end_leftover(left).await });
            }
            // Cgroups of jobs that had ended (the runner died before removing them).
            #[cfg(target_os = "linux")]
            for (id, cg) in ended_cgroups {
                let engine = self.clone();
                tasks.spawn(async move {
                    tracing::info!(job = %id, cgroup = %cg.path().display(), "removing a job cgroup left by a previous runner");
                    let grace = Duration::from_secs(spec::DEFAULT_KILL_GRACE_SECS)
                        .min(leftover::RECONCILE_GRACE);
                    let hurry = Some(engine.inner.stop_deadline.subscribe());
                    leftover::stop_orphan_cgroup(&cg, grace, hurry).await;
                    engine.reconciled();
                });
            }
        }
        self.schedule();
        Ok(())
    }

    /// Ends one job of a previous runner and marks it lost.
    async fn end_leftover(self, left: Leftover) {
        let id = left.rec.id.clone();
        let grace = leftover::grace_for(&left.rec, leftover::RECONCILE_GRACE);
        let hurry = Some(self.inner.stop_deadline.subscribe());
        let ended = leftover::stop(&left, grace, Context::Restart, hurry).await;
        let outcome = leftover::lost_outcome(&self.inner.paths.spool_root, &id, ended.reason);
        match self
            .inner
            .store
            .mark_finished(&id, JobState::Lost, &outcome)
            .await
        {
            Ok(recorded) => {
                self.when_recorded(&id, "lost", recorded);
                self.count_finished(outcome.spooled_bytes);
                tracing::warn!(job = %id, "marked lost");
            }
            Err(e) => {
                tracing::error!(job = %id, error = %crate::error_chain(&e), "could not mark a job of a previous runner lost")
            }
        }
        self.reconciled();
    }

    fn reconciled(&self) {
        self.inner.reconciling.fetch_sub(1, Ordering::Relaxed);
        self.bump();
    }

    /// `asked`, cut to what is left of the stop budget once a stop has begun. Returns the
    /// grace and whether it was cut, which is logged with the job and both graces.
    fn fit_grace(&self, id: &str, asked: Duration) -> (Duration, bool) {
        let Some(deadline) = *self.inner.stop_deadline.borrow() else {
            return (asked, false);
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left >= asked {
            return (asked, false);
        }
        tracing::warn!(job = %id, asked = ?asked, given = ?left, "kill grace shortened to fit the runner's stop budget");
        (left, true)
    }

    /// Admits a job: 201 with a new record, 200 with the existing one for an identical
    /// resubmission.
    pub async fn submit(&self, spec: JobSpec) -> Result<(bool, JobRecord), EngineError> {
        spec.validate()?;
        if self.inner.shutting_down.load(Ordering::Relaxed) {
            return Err(EngineError::ShuttingDown);
        }
        let id = match &spec.id {
            Some(id) => id.clone(),
            None => self.new_id(),
        };
        // A client-chosen id may be a resubmission: answered from the record, before
        // anything touches the filesystem (the job's workspace is the existing job's).
        let existing = match spec.id {
            Some(_) => self.get(&id).await?,
            None => None,
        };
        if let Some(existing) = existing {
            return if existing.spec.canonical() == spec.canonical() {
                Ok((false, existing))
            } else {
                Err(EngineError::Conflict { id })
            };
        }
        if self.sched().queue.len() >= self.inner.cfg.max_queued {
            return Err(EngineError::QueueFull {
                max: self.inner.cfg.max_queued,
            });
        }
        // A working directory the client chose is checked now, so a bad one is its 400.
        // The default workspace is made when the job starts.
        if spec.cwd.is_some() {
            let paths = self.inner.paths.clone();
            let (wid, cwd) = (id.clone(), spec.cwd.clone());
            match blocking(move || job::prepare_workspace(&paths, &wid, cwd.as_deref(), true))
                .await?
            {
                Ok(_) => {}
                // An identical submission of the same id, admitted meanwhile, made it.
                Err(JobError::WorkspaceExists { .. })
                    if self
                        .get(&id)
                        .await?
                        .is_some_and(|rec| rec.spec.canonical() == spec.canonical()) =>
                {
                    let rec = self
                        .get(&id)
                        .await?
                        .ok_or_else(|| EngineError::NotFound { id: id.clone() })?;
                    return Ok((false, rec));
                }
                // A directory that was there before is left as it was.
                Err(e @ JobError::WorkspaceExists { .. }) => return Err(EngineError::Job(e)),
                // Only what this admission made is removed.
                Err(e) => {
                    let _ = std::fs::remove_dir_all(self.inner.paths.workspace(&id));
                    return Err(EngineError::Job(e));
                }
            }
        }
        let rec = match self.inner.store.insert(&id, &spec).await? {
            Inserted::New(rec) => rec,
            Inserted::Existing(rec) => return Ok((false, rec)),
            Inserted::Conflict(_) => return Err(EngineError::Conflict { id }),
        };
        self.sched()
            .queue
            .push_back(Queued::new(rec.id.clone(), rec.owner.clone(), spec));
        self.bump();
        self.schedule();
        Ok((true, rec))
    }

    fn new_id(&self) -> String {
        let n = self.inner.ids.fetch_add(1, Ordering::Relaxed);
        format!("j{:x}-{}-{n}", super::store::now_ms(), std::process::id())
    }

    pub async fn get(&self, id: &str) -> Result<Option<JobRecord>, EngineError> {
        let store = self.inner.store.clone();
        let id = id.to_owned();
        let mut rec = blocking(move || store.get(&id)).await??;
        if let Some(r) = rec.as_mut() {
            self.overlay_live(r);
        }
        Ok(rec)
    }

    pub async fn list(
        &self,
        state: Option<JobState>,
        owner: Option<String>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<JobRecord>, EngineError> {
        let store = self.inner.store.clone();
        let mut recs =
            blocking(move || store.list(state, owner.as_deref(), before, limit)).await??;
        for r in &mut recs {
            self.overlay_live(r);
        }
        Ok(recs)
    }

    /// Running jobs report their output counters (bytes produced, kept or not) and why
    /// output was cut, live.
    fn overlay_live(&self, rec: &mut JobRecord) {
        let s = self.sched();
        if let Some(run) = s.running.get(&rec.id) {
            if let Some(st) = &run.stdout {
                rec.stdout_bytes = st.produced.load(Ordering::Relaxed);
                rec.stdout_truncated = st.truncated.load(Ordering::Relaxed);
            }
            if let Some(st) = &run.stderr {
                rec.stderr_bytes = st.produced.load(Ordering::Relaxed);
                rec.stderr_truncated = st.truncated.load(Ordering::Relaxed);
            }
            if let (Some(out), Some(err)) = (&run.stdout, &run.stderr) {
                rec.output_truncated = job::truncation(out, err);
            }
        }
    }

    /// Cancels a queued job at once, or a running one with SIGTERM, grace, SIGKILL to its
    /// group. Cancelling a finished job changes nothing.
    pub async fn cancel(&self, id: &str) -> Result<JobRecord, EngineError> {
        let queued = {
            let mut s = self.sched();
            if let Some(run) = s.running.get(id) {
                let _ = run.cancel.send(Some(JobState::Cancelled));
                false
            } else if let Some(pos) = s.queue.iter().position(|q| q.id == id) {
                s.queue.remove(pos);
                true
            } else {
                false
            }
        };
        if queued {
            let outcome = Outcome {
                error: Some("cancelled while queued".into()),
                ..Outcome::default()
            };
            let recorded = self
                .inner
                .store
                .mark_finished(id, JobState::Cancelled, &outcome)
                .await?;
            self.when_recorded(id, "cancelled", recorded);
            self.count_finished(0);
            self.bump();
        }
        self.get(id)
            .await?
            .ok_or_else(|| EngineError::NotFound { id: id.to_owned() })
    }

    /// Waits until the job's end is committed or `timeout` passes; returns the record. An
    /// end held in memory (a full disk) is shown with `commit_pending` until it is written.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<JobRecord, EngineError> {
        let deadline = Instant::now() + timeout;
        let mut activity = self.activity();
        loop {
            // While the scheduler holds the job it has not ended: no need to ask the store.
            if !self.is_active(id) {
                let rec = self
                    .get(id)
                    .await?
                    .ok_or_else(|| EngineError::NotFound { id: id.to_owned() })?;
                if rec.state.is_terminal() && !rec.commit_pending {
                    return Ok(rec);
                }
            }
            tokio::select! {
                // Cancel-safe: `changed` only observes the channel.
                r = activity.changed() => if r.is_err() { break },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        self.get(id)
            .await?
            .ok_or_else(|| EngineError::NotFound { id: id.to_owned() })
    }

    /// True while the job is queued or running in this runner.
    fn is_active(&self, id: &str) -> bool {
        let s = self.sched();
        s.running.contains_key(id) || s.queue.iter().any(|q| q.id == id)
    }

    /// Starts queued jobs while there is room, FIFO, skipping owners at their limit.
    fn schedule(&self) {
        let mut started = Vec::new();
        {
            let mut s = self.sched();
            // Checked under the scheduler lock, which shutdown takes after setting it: no
            // job can start after shutdown has broadcast its cancels.
            if self.inner.shutting_down.load(Ordering::Relaxed) {
                return;
            }
            while s.running.len() < self.inner.cfg.max_jobs {
                let per_owner = self.inner.cfg.max_jobs_per_owner;
                let Some(pos) = s
                    .queue
                    .iter()
                    .position(|q| s.per_owner.get(&q.owner).copied().unwrap_or(0) < per_owner)
                else {
                    break;
                };
                let Some(Queued { id, owner, spec }) = s.queue.remove(pos) else {
                    break;
                };
                let (cancel, cancel_rx) = watch::channel(None);
                *s.per_owner.entry(owner.clone()).or_default() += 1;
                s.running.insert(
                    id.clone(),
                    RunningJob {
                        owner,
                        cancel,
                        stdout: None,
                        stderr: None,
                    },
                );
                started.push((id, spec, cancel_rx, super::store::now_ms()));
            }
        }
        if started.is_empty() {
            return;
        }
        let mut tasks = crate::util::lock(&self.inner.tasks);
        // Reap finished tasks so the set does not grow without bound.
        while tasks.try_join_next().is_some() {}
        for (id, spec, cancel_rx, admitted_ms) in started {
            let engine = self.clone();
            tasks.spawn(async move { engine.run_job(id, spec, cancel_rx, admitted_ms).await });
        }
    }

    async fn run_job(
        self,
        id: String,
        spec: Option<Arc<JobSpec>>,
        mut cancel: watch::Receiver<Option<JobState>>,
        admitted_ms: i64,
    ) {
        let (state, outcome) = match self.execute(&id, spec, &mut cancel, admitted_ms).await {
            Ok(done) => done,
            Err(e) => (
                JobState::Failed,
                Outcome {
                    exit_code: match &e {
                        EngineError::Job(j) => j.shell_exit_code(),
                        _ => None,
                    },
                    error: Some(crate::error_chain(&e)),
                    ..Outcome::default()
                },
            ),
        };
        self.count_finished(outcome.spooled_bytes);
        // Resolves after the first try: an end the disk could not take yet is held and
        // shown meanwhile, so the job leaves the scheduler either way.
        match self.inner.store.mark_finished(&id, state, &outcome).await {
            Ok(recorded) => self.when_recorded(&id, state.as_str(), recorded),
            Err(e) => {
                tracing::error!(job = %id, error = %crate::error_chain(&e), "could not record the job's end")
            }
        }
        tracing::info!(job = %id, state = state.as_str(), exit_code = ?outcome.exit_code, signal = ?outcome.signal, "job finished");
        {
            let mut s = self.sched();
            if let Some(run) = s.running.remove(&id) {
                if let Some(n) = s.per_owner.get_mut(&run.owner) {
                    *n = n.saturating_sub(1);
                }
            }
        }
        self.bump();
        self.schedule();
        if let Err(e) = self.retain().await {
            tracing::warn!(error = %crate::error_chain(&e), "retention failed");
        }
    }

    async fn execute(
        &self,
        id: &str,
        spec: Option<Arc<JobSpec>>,
        cancel: &mut watch::Receiver<Option<JobState>>,
        admitted_ms: i64,
    ) -> Result<(JobState, Outcome), EngineError> {
        // Committed before the job is launched: a runner killed after the launch leaves a
        // `starting` record for the next one to reconcile, never a `queued` one it would
        // run a second time.
        let starting = self.inner.store.mark_starting(id, admitted_ms);
        let spec = match spec {
            Some(spec) => spec,
            None => {
                let store = self.inner.store.clone();
                let sid = id.to_owned();
                let rec = blocking(move || store.get(&sid))
                    .await??
                    .ok_or_else(|| EngineError::NotFound { id: id.to_owned() })?;
                Arc::new(rec.spec)
            }
        };
        // The workspace is made while the writer commits: two mkdirs, too short to be
        // worth a trip to the blocking pool.
        let workspace = job::prepare_workspace(&self.inner.paths, id, spec.cwd.as_deref(), false)
            .map_err(EngineError::Job);
        // A start the disk could not take yet is waited for (or cancelled): launching before
        // it is committed could run the job twice after a restart.
        if let Recorded::Held(later) = starting.await? {
            tracing::warn!(job = %id, "could not record the job's start yet (is the disk full?): it starts once it is");
            self.bump();
            tokio::select! {
                // Cancel-safe: a dropped `Pending` leaves the change held in the writer.
                r = later => r?,
                // Cancel-safe: `changed` only observes the channel.
                _ = cancel.changed() => {}
            }
        }
        let workspace = workspace?;
        self.bump();
        let activity = self.inner.activity.clone();
        let notify: Arc<dyn Fn() + Send + Sync> =
            Arc::new(move || activity.send_modify(|n| *n = n.wrapping_add(1)));
        // A cancel that arrived while the job was starting wins before any of its code runs.
        if let Some(state) = *cancel.borrow() {
            let outcome = Outcome {
                error: Some("cancelled before it started".into()),
                ..Outcome::default()
            };
            return Ok((state, outcome));
        }
        let mut started = job::start(
            &self.inner.paths,
            id,
            &spec,
            &workspace,
            job::Baseline {
                output_cap: self.inner.cfg.max_output_bytes,
                path: self
                    .inner
                    .cfg
                    .job_path
                    .as_deref()
                    .unwrap_or(crate::supervisor::DEFAULT_PATH),
                launch: self.inner.launch,
            },
            Tiers {
                cgroups: self.inner.cgroups.as_ref(),
                fs: self.inner.fs_guard.as_ref(),
            },
            notify,
        )
        .map_err(EngineError::Job)?;
        let pid = started.child.pid();
        let start_time = pid.and_then(sys::process_start_time);
        {
            let mut s = self.sched();
            if let Some(run) = s.running.get_mut(id) {
                run.stdout = Some(started.stdout.clone());
                run.stderr = Some(started.stderr.clone());
            }
        }
        // Not awaited: the job runs either way, and the writer applies writes in order, so
        // the job's end is recorded after this. A failure is logged by the writer.
        drop(
            self.inner
                .store
                .mark_running(id, started.pid, start_time, &started.confinement),
        );
        self.bump();
        tracing::info!(job = %id, pid = started.pid, argv = ?spec.argv, "job running");

        let asked_grace = Duration::from_secs(spec.kill_grace_secs());
        let timeout = Some(Duration::from_secs(spec.timeout_secs()));
        let name = format!("job {id}");
        let ended_by = tokio::select! {
            // Cancel-safe: `Child::wait` may be dropped and called again.
            _ = started.child.wait() => None,
            // Cancel-safe: sleeping holds no state.
            _ = async { match timeout { Some(t) => tokio::time::sleep(t).await, None => std::future::pending().await } } => Some(JobState::TimedOut),
            // Cancel-safe: `changed` only observes the channel.
            _ = cancel.changed() => Some((*cancel.borrow()).unwrap_or(JobState::Cancelled)),
        };
        #[cfg(target_os = "linux")]
        let cgroup = started.cgroup.take();
        #[cfg(not(target_os = "linux"))]
        let cgroup: Option<()> = None;
        // Fitted when the stop begins: a stop that began before the runner's own is cut
        // short below when the runner's deadline passes.
        let (grace, grace_cut) = self.fit_grace(id, asked_grace);
        // A stop that began before the runner's own is cut short when the runner's
        // deadline passes: SIGKILL at once.
        let hurry = Some(self.inner.stop_deadline.subscribe());
        if let Some(g) = pid.and_then(|pgid| job_group(&name, pgid)) {
            #[cfg(target_os = "linux")]
            let g = match &cgroup {
                Some(cg) => g.with_cgroup(cg.clone()),
                None => g,
            };
            let in_cgroup = cgroup.is_some();
            let pgid = pid.map_or(0, ProcessId::get);
            let on_kill = |cut_short: bool| {
                if cut_short {
                    tracing::warn!(job = %id, "the runner's stop budget is spent: SIGKILL");
                } else if in_cgroup {
                    tracing::warn!(child = %name, "grace period over: cgroup.kill");
                } else {
                    tracing::warn!(child = %name, pid = pgid, "grace period over: SIGKILL to the process group");
                }
            };
            let out = match ended_by {
                Some(_) => {
                    if in_cgroup {
                        tracing::info!(child = %name, pid = pgid, grace = ?grace, "stopping: SIGTERM to the process group and the cgroup");
                    } else {
                        tracing::info!(child = %name, pid = pgid, grace = ?grace, "stopping: SIGTERM to the process group");
                    }
                    g.stop_leader(&mut started.child, grace, hurry, on_kill)
                        .await
                }
                // The leader is gone; nothing it left in its group or cgroup outlives it.
                None if g.alive() => {
                    if in_cgroup {
                        tracing::warn!(child = %name, "the job left processes in its cgroup: SIGTERM");
                    } else {
                        tracing::warn!(child = %name, pgid, "the child left processes in its group: SIGTERM");
                    }
                    g.terminate(grace, hurry, on_kill).await
                }
                None => proc_tree::Outcome::default(),
            };
            if let (Some(status), false) = (out.leader, in_cgroup) {
                tracing::info!(child = %name, pid = pgid, "exited: {}", supervisor::describe(status));
            }
            if out.survivors {
                if in_cgroup {
                    tracing::error!(child = %name, "the job's cgroup still has live processes after cgroup.kill");
                } else if ended_by.is_some() {
                    tracing::error!(child = %name, pgid, "process group still has live members after SIGKILL");
                }
            }
        }
        let status = started.child.wait().await.ok();
        #[cfg(target_os = "linux")]
        if let Some(cg) = &cgroup {
            if let Err(e) = cg.remove() {
                tracing::warn!(job = %id, cgroup = %cg.path().display(), error = %e, "could not remove the job's cgroup");
            }
        }
        // The group is gone, so all it wrote is in the pipes: the spoolers take that and
        // end, without waiting for a process that left the group and holds the pipes.
        started.stdout.drain();
        started.stderr.drain();
        let spoolers = std::mem::take(&mut started.spoolers);
        let joined = async {
            for h in spoolers {
                let _ = h.await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(5), joined)
            .await
            .is_err()
        {
            tracing::warn!(job = %id, "the job's last output could not be spooled in time (a stalled disk?)");
        }
        use std::os::unix::process::ExitStatusExt;
        let outcome = Outcome {
            exit_code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            error: match ended_by {
                Some(JobState::TimedOut) => Some(format!(
                    "timed out after {}s",
                    timeout.map(|t| t.as_secs()).unwrap_or(0)
                )),
                Some(JobState::Cancelled)
                    if self.inner.shutting_down.load(Ordering::Relaxed) && grace_cut =>
                {
                    Some(format!(
                        "cancelled: the runner is shutting down; its kill grace was cut from {} to {} to fit the runner's stop budget",
                        humantime::format_duration(asked_grace),
                        humantime::format_duration(Duration::from_millis(grace.as_millis() as u64))
                    ))
                }
                Some(JobState::Cancelled) if self.inner.shutting_down.load(Ordering::Relaxed) => {
                    Some("cancelled: the runner is shutting down".into())
                }
                Some(JobState::Cancelled) => Some("cancelled".into()),
                _ => None,
            },
            stdout_bytes: started.stdout.produced.load(Ordering::Relaxed),
            stderr_bytes: started.stderr.produced.load(Ordering::Relaxed),
            spooled_bytes: started.stdout.written.load(Ordering::Relaxed)
                + started.stderr.written.load(Ordering::Relaxed),
            stdout_truncated: started.stdout.truncated.load(Ordering::Relaxed),
            stderr_truncated: started.stderr.truncated.load(Ordering::Relaxed),
            output_truncated: job::truncation(&started.stdout, &started.stderr),
        };
        let state = match ended_by {
            Some(s) => s,
            None if outcome.exit_code == Some(0) => JobState::Succeeded,
            None => JobState::Failed,
        };
        Ok((state, outcome))
    }

    /// Deletes the oldest finished jobs, records and files together, beyond the count and
    /// spool-size bounds.
    async fn retain(&self) -> Result<(), EngineError> {
        // One pass at a time: two passes would delete the same oldest jobs and count them twice.
        let _pass = self.inner.retention.lock().await;
        let (max_jobs, max_bytes) = (
            self.inner.cfg.max_finished_jobs,
            self.inner.cfg.max_spool_bytes,
        );
        let over = |t: &Totals| t.count > max_jobs || t.bytes > max_bytes;
        if !over(&self.totals()) {
            return Ok(());
        }
        let store = self.inner.store.clone();
        let finished = blocking(move || store.finished_oldest_first(RETAIN_BATCH)).await??;
        for (id, b) in finished {
            if !over(&self.totals()) {
                break;
            }
            let paths = self.inner.paths.clone();
            let rid = id.clone();
            blocking(move || {
                let _ = std::fs::remove_dir_all(paths.spool_dir(&rid));
                let _ = std::fs::remove_dir_all(paths.workspace(&rid));
            })
            .await?;
            self.inner.store.delete(&id).await?;
            let mut t = self.totals();
            t.count = t.count.saturating_sub(1);
            t.bytes = t.bytes.saturating_sub(b);
        }
        Ok(())
    }

    /// Stops every running job (SIGTERM, grace, SIGKILL to each group) and records them
    /// cancelled, and finishes ending a previous runner's leftovers. With a `deadline`,
    /// every grace is cut to end by then (logged per job), and what still runs at the
    /// deadline is SIGKILLed. Queued jobs stay queued for the next runner.
    pub async fn shutdown(&self, deadline: Option<Instant>) {
        // Before the cancels: the jobs they wake fit their grace to it.
        if deadline.is_some() {
            self.inner.stop_deadline.send_replace(deadline);
        }
        self.inner.shutting_down.store(true, Ordering::Relaxed);
        {
            let s = self.sched();
            for run in s.running.values() {
                let _ = run.cancel.send(Some(JobState::Cancelled));
            }
        }
        let mut tasks = std::mem::take(&mut *crate::util::lock(&self.inner.tasks));
        while tasks.join_next().await.is_some() {}
    }
}

/// The job's process group, or `None` (logged) when its id could never be signalled.
fn job_group(name: &str, pgid: ProcessId) -> Option<proc_tree::Group> {
    proc_tree::Group::new(name, pgid.get())
        .map_err(|e| tracing::error!(child = %name, error = %e, "not stopping the job"))
        .ok()
}
