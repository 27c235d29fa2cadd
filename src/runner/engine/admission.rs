//! Admission and scheduling: `submit` and `cancel`, the FIFO queue, and `schedule`, which
//! starts queued jobs while there is room under the runner's and each owner's limit. The
//! scheduler's state (`Sched`) is only the queue and what runs now; the store holds the rest.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::watch;

use super::{blocking, Engine, EngineError};
use crate::proto::job::{JobRecord, JobSpec, JobState};
use crate::runner::job::{self, JobError, SpoolStats};
use crate::runner::store::{self, Inserted, Outcome};

pub(super) struct RunningJob {
    pub(super) owner: String,
    pub(super) cancel: watch::Sender<Option<JobState>>,
    pub(super) stdout: Option<Arc<SpoolStats>>,
    pub(super) stderr: Option<Arc<SpoolStats>>,
}

/// A job waiting for admission.
pub(super) struct Queued {
    pub(super) id: String,
    pub(super) owner: String,
    /// The spec, kept at hand so that starting the job needs no read of the store; left
    /// out when it carries a large stdin, which then waits in the store only.
    pub(super) spec: Option<Arc<JobSpec>>,
}

impl Queued {
    pub(super) fn new(id: String, owner: String, spec: JobSpec) -> Self {
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
pub(super) struct Sched {
    pub(super) queue: VecDeque<Queued>,
    pub(super) running: HashMap<String, RunningJob>,
    pub(super) per_owner: HashMap<String, usize>,
}

impl Engine {
    pub(super) fn sched(&self) -> std::sync::MutexGuard<'_, Sched> {
        crate::util::lock(&self.inner.sched)
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
        let made_workspace = spec.cwd.is_some();
        if made_workspace {
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
        // Whatever stops the record here, the workspace this admission made goes with it,
        // so that the client's retry (after a 507, say) is not refused for it.
        let forget_workspace = || {
            if made_workspace {
                let _ = std::fs::remove_dir_all(self.inner.paths.workspace(&id));
            }
        };
        let rec = match self.inner.store.insert(&id, &spec).await {
            Ok(Inserted::New(rec)) => rec,
            // The earlier job's workspace: it made it, not this admission.
            Ok(Inserted::Existing(rec)) => return Ok((false, rec)),
            Ok(Inserted::Conflict(_)) => return Err(EngineError::Conflict { id }),
            Err(e) => {
                forget_workspace();
                return Err(e.into());
            }
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
        format!("j{:x}-{}-{n}", store::now_ms(), std::process::id())
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

    /// Starts queued jobs while there is room, FIFO, skipping owners at their limit.
    pub(super) fn schedule(&self) {
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
                started.push((id, spec, cancel_rx, store::now_ms()));
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
}
