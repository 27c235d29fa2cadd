//! Admission and scheduling: `submit` and `cancel`, the FIFO queue, and `schedule`, which
//! starts queued jobs while there is room under the runner's and each owner's limit. The
//! scheduler's state (`Sched`) is only the limits, the queue and what runs now; the store
//! holds the rest. The limits live beside the queue, under its lock, so a change to them
//! (`set_admission`) and the scheduling it calls for see one state.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::watch;

use super::{blocking, Engine, EngineError};
use crate::job::{self, JobError, SpoolStats};
use crate::proto::admission::{Admission, AdmissionChange};
use crate::proto::job::{JobRecord, JobSpec, JobState};
use crate::store::{self, Inserted, Outcome};

pub(super) struct RunningJob {
    pub(super) owner: String,
    pub(super) cancel: watch::Sender<Option<Cancel>>,
    pub(super) stdout: Option<Arc<SpoolStats>>,
    pub(super) stderr: Option<Arc<SpoolStats>>,
    /// What its egress proxy refused so far.
    pub(super) denials: Option<Arc<crate::egress::Denials>>,
    /// Another job's workspace its `cwd` is in (`../ID/…`): retention leaves it alone.
    pub(super) uses: Option<String>,
}

/// A cancel sent to a running job. `why`, when given, is said in the job's record (the
/// deadline of a drain: `cancelled: drain deadline (upgrade to 1.4.0)`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Cancel {
    pub(super) why: Option<Arc<str>>,
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

pub(super) struct Sched {
    pub(super) limits: Limits,
    pub(super) queue: VecDeque<Queued>,
    pub(super) running: HashMap<String, RunningJob>,
    pub(super) per_owner: HashMap<String, usize>,
}

impl Sched {
    pub(super) fn new(limits: Limits) -> Self {
        Self {
            limits,
            queue: VecDeque::new(),
            running: HashMap::new(),
            per_owner: HashMap::new(),
        }
    }
}

/// The admission limits in force: the runner's flags at first, then what `set_admission`
/// made them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limits {
    pub(super) admission: Admission,
    /// The per-owner limit was never set (by `--max-jobs-per-owner` or a change), so it is
    /// `max_jobs` and moves with it, as for a runner started with the new `--max-jobs`.
    pub(super) per_owner_follows: bool,
}

impl Limits {
    /// A runner's first limits; a per-owner limit of `None` follows `max_jobs`.
    pub(super) fn new(
        max_jobs: usize,
        max_jobs_per_owner: Option<usize>,
        max_queued: usize,
    ) -> Result<Self, EngineError> {
        let admission = checked(Admission {
            max_jobs,
            max_jobs_per_owner: max_jobs_per_owner.unwrap_or(max_jobs),
            max_queued,
        })?;
        Ok(Self {
            admission,
            per_owner_follows: max_jobs_per_owner.is_none(),
        })
    }

    /// These limits with `change` applied, or why not (see [`checked`]).
    pub(super) fn changed(self, change: AdmissionChange) -> Result<Self, EngineError> {
        let old = self.admission;
        let per_owner_follows = self.per_owner_follows && change.max_jobs_per_owner.is_none();
        let max_jobs = change.max_jobs.unwrap_or(old.max_jobs);
        let admission = checked(Admission {
            max_jobs,
            max_jobs_per_owner: match change.max_jobs_per_owner {
                Some(n) => n,
                None if per_owner_follows => max_jobs,
                None => old.max_jobs_per_owner,
            },
            max_queued: change.max_queued.unwrap_or(old.max_queued),
        })?;
        Ok(Self {
            admission,
            per_owner_follows,
        })
    }
}

/// `limits`, unless one leaves no room to run (0 jobs in all or per owner): queued jobs
/// would wait forever. `max_queued` may be 0, which refuses every new job and lets those
/// already queued start.
fn checked(limits: Admission) -> Result<Admission, EngineError> {
    for (field, value) in [
        ("max_jobs", limits.max_jobs),
        ("max_jobs_per_owner", limits.max_jobs_per_owner),
    ] {
        if value == 0 {
            return Err(EngineError::InvalidAdmission { field });
        }
    }
    Ok(limits)
}

impl Engine {
    pub(super) fn sched(&self) -> std::sync::MutexGuard<'_, Sched> {
        crate::util::lock(&self.inner.sched)
    }

    /// Admits a job: 201 with a new record, 200 with the existing one for an identical
    /// resubmission.
    pub async fn submit(
        &self,
        spec: JobSpec,
        secrets: super::Secrets,
    ) -> Result<(bool, JobRecord), EngineError> {
        spec.validate()?;
        crate::proto::secret::check_values(&spec, &secrets)
            .map_err(|e| EngineError::Spec(e.into()))?;
        crate::job::mask::check(secrets.values().map(String::as_bytes))
            .map_err(|e| EngineError::Job(e.into()))?;
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
        if let Some(d) = self.inner.drain.borrow().as_ref() {
            return Err(EngineError::Draining {
                reason: d.reason.clone(),
            });
        }
        if let Some(why) = self.sandbox_refusal() {
            return Err(EngineError::NoSandbox { why });
        }
        if let Some(e) = self.network_refusal(&spec) {
            return Err(e);
        }
        if let (false, Some(why)) = (
            spec.secret_files.is_empty(),
            self.inner.sandbox.unavailable(),
        ) {
            return Err(EngineError::NoSandbox {
                why: format!("secrets as files are kept on the job's private tmpfs: {why}"),
            });
        }
        // Every job runs as one account: only a sandbox (its own PID namespace) or
        // Landlock (no ptrace across domains) keeps another job out of this one's
        // /proc/<pid>/environ.
        if let (false, Some(why), true) = (
            spec.secrets.is_empty(),
            self.inner.sandbox.unavailable(),
            self.inner.fs_guard.is_none(),
        ) {
            return Err(EngineError::NoSandbox {
                why: format!("without a sandbox or Landlock, another job of the runner's account could read a secret from this one's /proc/<pid>/environ: {why}"),
            });
        }
        {
            let s = self.sched();
            let max = s.limits.admission.max_queued;
            if s.queue.len() >= max {
                return Err(EngineError::QueueFull { max });
            }
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
        if !secrets.is_empty() {
            crate::util::lock(&self.inner.secrets).insert(rec.id.clone(), secrets);
        }
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
                let _ = run.cancel.send(Some(Cancel::default()));
                false
            } else if let Some(pos) = s.queue.iter().position(|q| q.id == id) {
                s.queue.remove(pos);
                true
            } else {
                false
            }
        };
        if queued {
            self.finish_queued(id, "cancelled while queued".into())
                .await?;
        }
        self.get(id)
            .await?
            .ok_or_else(|| EngineError::NotFound { id: id.to_owned() })
    }

    /// Records a job taken off the queue as cancelled, with `error` saying why.
    pub(super) async fn finish_queued(&self, id: &str, error: String) -> Result<(), EngineError> {
        crate::util::lock(&self.inner.secrets).remove(id);
        let outcome = Outcome {
            error: Some(error),
            ..Outcome::default()
        };
        let recorded = self
            .inner
            .store
            .mark_finished(id, JobState::Cancelled, &outcome)
            .await?;
        self.when_recorded(id, "cancelled", recorded);
        crate::metrics::job_ended(JobState::Cancelled.as_str(), None);
        self.count_finished(id, 0).await;
        self.bump();
        Ok(())
    }

    /// The admission limits in force.
    pub fn admission(&self) -> Admission {
        self.sched().limits.admission
    }

    /// Changes the admission limits while jobs run, and returns those now in force. A
    /// refused change changes nothing. A raised limit starts queued jobs at once; a lowered
    /// one stops no running job, it only holds new starts until fewer run than it allows;
    /// and a `max_queued` below the queue's length keeps every queued job, refusing new
    /// ones (429) until the queue is shorter than it. A per-owner limit that was never set
    /// follows `max_jobs`. Lasts until the runner stops: the next one starts from its flags.
    pub fn set_admission(&self, change: AdmissionChange) -> Result<Admission, EngineError> {
        let (before, limits) = {
            let mut s = self.sched();
            let before = s.limits.admission;
            s.limits = s.limits.changed(change)?;
            (before, s.limits.admission)
        };
        // A caller converging on a desired state may send the same limits every pass.
        if limits != before {
            tracing::info!(
                max_jobs = limits.max_jobs,
                max_jobs_per_owner = limits.max_jobs_per_owner,
                max_queued = limits.max_queued,
                "admission limits changed"
            );
        }
        self.schedule();
        Ok(limits)
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
            while s.running.len() < s.limits.admission.max_jobs {
                let per_owner = s.limits.admission.max_jobs_per_owner;
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
                        denials: None,
                        stderr: None,
                        uses: spec
                            .as_deref()
                            .and_then(super::retention::foreign_workspace),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn change(
        max_jobs: Option<usize>,
        max_jobs_per_owner: Option<usize>,
        max_queued: Option<usize>,
    ) -> AdmissionChange {
        AdmissionChange {
            max_jobs,
            max_jobs_per_owner,
            max_queued,
        }
    }

    fn admission(max_jobs: usize, max_jobs_per_owner: usize, max_queued: usize) -> Admission {
        Admission {
            max_jobs,
            max_jobs_per_owner,
            max_queued,
        }
    }

    #[test]
    fn a_change_keeps_the_limits_it_leaves_out() {
        let limits = Limits::new(4, Some(2), 10).expect("valid");
        let new = limits.changed(change(Some(8), None, None)).expect("valid");
        assert_eq!(new.admission, admission(8, 2, 10));
        let new = new.changed(change(None, None, Some(3))).expect("valid");
        assert_eq!(new.admission, admission(8, 2, 3));
        assert_eq!(
            limits.changed(AdmissionChange::default()).expect("valid"),
            limits
        );
        // No queue at all is a limit too: it refuses new jobs.
        let none_queued = limits.changed(change(None, None, Some(0))).expect("valid");
        assert_eq!(none_queued.admission, admission(4, 2, 0));
    }

    #[test]
    fn a_per_owner_limit_never_set_follows_max_jobs_until_it_is_set() {
        let limits = Limits::new(2, None, 10).expect("valid");
        assert_eq!(limits.admission, admission(2, 2, 10));
        let raised = limits.changed(change(Some(5), None, None)).expect("valid");
        assert_eq!(raised.admission, admission(5, 5, 10));
        let set = raised.changed(change(None, Some(3), None)).expect("valid");
        assert_eq!(set.admission, admission(5, 3, 10));
        let lowered = set.changed(change(Some(1), None, None)).expect("valid");
        assert_eq!(lowered.admission, admission(1, 3, 10));
        // A per-owner limit from the runner's flags stays as it is.
        let flagged = Limits::new(2, Some(2), 10).expect("valid");
        let raised = flagged.changed(change(Some(5), None, None)).expect("valid");
        assert_eq!(raised.admission, admission(5, 2, 10));
    }

    #[test]
    fn no_room_to_run_is_refused_naming_the_limit() {
        let limits = Limits::new(4, None, 10).expect("valid");
        for (field, bad) in [
            ("max_jobs", change(Some(0), None, Some(5))),
            ("max_jobs", change(Some(0), Some(2), None)),
            ("max_jobs_per_owner", change(Some(3), Some(0), None)),
        ] {
            let err = limits.changed(bad).expect_err("0 refused");
            assert!(
                matches!(err, EngineError::InvalidAdmission { field: f } if f == field),
                "{err}"
            );
            assert!(err.to_string().starts_with(&format!("{field} ")), "{err}");
        }
        for (field, max_jobs, per_owner) in
            [("max_jobs", 0, None), ("max_jobs_per_owner", 1, Some(0))]
        {
            let err = Limits::new(max_jobs, per_owner, 10).expect_err("0 refused");
            assert!(err.to_string().starts_with(&format!("{field} ")), "{err}");
        }
    }
}
