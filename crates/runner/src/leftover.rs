//! Ending the jobs of a runner that is gone: one code path for the two places that do it.
//!
//! - a starting runner reconciles what its predecessor left (`Engine::start`, in the
//!   background while it already serves), and
//! - `railgrid runner reap`, which the agent runs as the runner's account after every runner
//!   stop, to end what a runner that was SIGKILLed (or crashed) could not.
//!
//! A record left `starting`/`running` whose process still lives (same pid *and* start time;
//! see [`live_job_process`]) has its group stopped (SIGTERM, grace, SIGKILL), and whatever
//! stayed in its cgroup goes with `cgroup.kill`; then the job is marked `lost` with a
//! reason. The owner of these jobs is dead, so nobody waits for them: the grace is at most
//! [`RECONCILE_GRACE`].
//!
//! `reap` takes the runner lock first: while a runner holds it, the jobs are that runner's,
//! and `reap` does nothing and says so.

use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;
use tokio::time::Instant;

use super::job;
use super::store::{JobStoreError, Outcome, Recorded, Store};
use crate::proc_tree::Group;
use crate::proto::job::{JobRecord, JobState};
pub use crate::proto::runner::{Ended, ReapReport};
use crate::supervisor::lock;
use crate::sys::{self, ProcessId};

/// Longest grace a job of a dead runner gets: there is no one left to wait for.
pub const RECONCILE_GRACE: Duration = Duration::from_secs(10);
/// How long `reap` waits for a `lost` that the database could not take at once.
const REAP_COMMIT_WAIT: Duration = Duration::from_secs(3);

use crate::proc_tree::StopDeadline;

#[derive(Debug, Error)]
pub enum LeftoverError {
    #[error("refusing to reap as root: run `runner reap` as the runner's account, which owns jobs.db and the jobs")]
    Root,
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error(transparent)]
    Store(#[from] JobStoreError),
    #[error("internal task failed while reaping {path}: {message}")]
    Task { path: PathBuf, message: String },
}

/// Who ends the leftovers; it shapes the reason recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// A new runner, at its start.
    Restart,
    /// `runner reap`, after a runner stop.
    Reap,
}

/// One job a dead runner left `starting`/`running`.
pub struct Leftover {
    pub rec: JobRecord,
    #[cfg(target_os = "linux")]
    pub cgroup: Option<sys::cgroup::Cgroup>,
}

impl Leftover {
    /// A record alone, with no job cgroup looked up (the reap's read-only path).
    fn without_cgroup(rec: JobRecord) -> Self {
        Self {
            rec,
            #[cfg(target_os = "linux")]
            cgroup: None,
        }
    }
}

/// The grace a leftover gets: its own kill grace, at most `cap`.
pub fn grace_for(rec: &JobRecord, cap: Duration) -> Duration {
    Duration::from_secs(rec.spec.kill_grace_secs()).min(cap)
}

/// Job cgroups with no record left running: `(id, cgroup)`.
pub type EndedCgroups = Vec<(String, Cgroup)>;

/// The records left `starting`/`running`, each with its job cgroup where there is one,
/// and the job cgroups that belong to no such record (jobs that had ended). Blocking.
pub fn find(
    store: &Store,
    #[cfg_attr(not(target_os = "linux"), allow(unused_variables))] tier: Option<
        &super::confine::CgroupTier,
    >,
) -> Result<(Vec<Leftover>, EndedCgroups), JobStoreError> {
    let stale = store.in_states(&[JobState::Starting, JobState::Running])?;
    #[cfg(target_os = "linux")]
    {
        let mut cgroups: std::collections::HashMap<String, Cgroup> = tier
            .map(|t| t.leftovers().into_iter().collect())
            .unwrap_or_default();
        let left = stale
            .into_iter()
            .map(|rec| Leftover {
                cgroup: cgroups.remove(&rec.id),
                rec,
            })
            .collect();
        Ok((left, cgroups.into_iter().collect()))
    }
    #[cfg(not(target_os = "linux"))]
    Ok((
        stale.into_iter().map(|rec| Leftover { rec }).collect(),
        Vec::new(),
    ))
}

#[cfg(target_os = "linux")]
pub use crate::sys::cgroup::Cgroup;
/// Stands in for a cgroup where there are none.
#[cfg(not(target_os = "linux"))]
#[derive(Debug, Clone)]
pub struct Cgroup;

/// Stops what still lives of `left`: its process group (verified by pid and start time
/// before any signal), then whatever stayed in its cgroup, each with `grace` before
/// SIGKILL. When `hurry` is given, a passed stop deadline cuts the grace short.
pub async fn stop(
    left: &Leftover,
    grace: Duration,
    context: Context,
    hurry: Option<StopDeadline>,
) -> Ended {
    let rec = &left.rec;
    let (prefix, agent) = match context {
        Context::Restart => ("the runner restarted while the job ran", ""),
        Context::Reap => (
            "the runner stopped without ending the job",
            " by the agent's reap",
        ),
    };
    let mut killed = false;
    // One grace for the group and the cgroup together, not one each.
    let deadline = Instant::now() + grace;
    #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
    let mut reason = match (live_job_process(rec), orphaned_group(rec)) {
        (Some(pid), _) => {
            tracing::warn!(job = %rec.id, pid = pid.get(), grace = ?grace, "a job of a runner that is gone is still running: stopping its process group");
            // Found by its environment when the record has no pid: its start time now.
            let start = rec.start_time.or_else(|| sys::process_start_time(pid));
            let name = format!("job {}", rec.id);
            kill_orphan_group(&name, pid, start.map(|t| (pid, t)), grace, hurry.clone()).await;
            killed = true;
            format!("{prefix}; its process group was killed{agent}")
        }
        (None, Some(pgid)) => {
            tracing::warn!(job = %rec.id, pgid = pgid.get(), grace = ?grace, "the leader of a job of a runner that is gone has exited, but its process group lives on: stopping it");
            let name = format!("job {}", rec.id);
            let identity = rec.start_time.map(|t| (pgid, t));
            kill_orphan_group(&name, pgid, identity, grace, hurry.clone()).await;
            killed = true;
            format!("{prefix}; its process had exited, and what it left in its process group was killed{agent}")
        }
        (None, None) => format!("{prefix}; its process was already gone"),
    };
    // Whatever left the group but stayed in the job's cgroup goes too.
    #[cfg(target_os = "linux")]
    if let Some(cg) = &left.cgroup {
        if cg.populated().unwrap_or(false) {
            tracing::warn!(job = %rec.id, cgroup = %cg.path().display(), "processes of a job of a runner that is gone are still in its cgroup: stopping them");
            reason = format!("{prefix}; its cgroup was killed{agent}");
            killed = true;
        }
        stop_orphan_cgroup(
            cg,
            deadline.saturating_duration_since(Instant::now()),
            hurry,
        )
        .await;
    }
    Ended {
        id: rec.id.clone(),
        pid: rec.pid,
        killed,
        reason,
    }
}

/// The `lost` outcome of a leftover. What the job produced died with the runner that
/// counted it; what reached the spool is what is known.
pub fn lost_outcome(spool_root: &Path, id: &str, reason: String) -> Outcome {
    let spooled = |s: job::Stream| file_len(&spool_root.join(id).join(s.name()));
    let stdout_bytes = spooled(job::Stream::Stdout);
    let stderr_bytes = spooled(job::Stream::Stderr);
    Outcome {
        error: Some(reason),
        stdout_bytes,
        stderr_bytes,
        spooled_bytes: stdout_bytes + stderr_bytes,
        ..Outcome::default()
    }
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The record's process, if that very process still lives: same pid *and* start time. A
/// recycled pid has another start time and is never touched. A record without a pid (the
/// runner died between spawn and recording it) is matched by the job id in the initial
/// environment of our own processes.
pub fn live_job_process(rec: &JobRecord) -> Option<ProcessId> {
    let Some(pid) = rec.pid else {
        return sys::find_own_process_with_env(job::JOB_ID_VAR, &rec.id);
    };
    let pid = ProcessId::new(pid)?;
    if !sys::group::process_alive(pid) {
        return None;
    }
    match (rec.start_time, sys::process_start_time(pid)) {
        (Some(want), Some(got)) if want == got => Some(pid),
        // No start time to compare (not Linux): a live pid is not proof enough.
        _ => None,
    }
}

/// The process group of a record whose leader has exited while members of its group live
/// on (`sh -c 'server & exit 0'`). The kernel never hands out a pid that is still the id
/// of a live process group, so while the group has members its id is still this job's:
/// it cannot be a recycled pid's.
pub fn orphaned_group(rec: &JobRecord) -> Option<ProcessId> {
    let pgid = ProcessId::new(rec.pid?)?;
    (rec.start_time.is_some() && !sys::group::process_alive(pgid) && sys::group::group_alive(pgid))
        .then_some(pgid)
}

/// SIGTERM to the orphaned job's group, grace (cut short by `hurry`), SIGKILL. `identity`
/// is checked again right before the first signal.
async fn kill_orphan_group(
    name: &str,
    pgid: ProcessId,
    identity: Option<(ProcessId, u64)>,
    grace: Duration,
    hurry: Option<StopDeadline>,
) {
    let Ok(g) = Group::new(name, pgid.get()) else {
        return;
    };
    let g = match identity {
        Some((pid, start_time)) => g.verified(pid, start_time),
        None => g,
    };
    g.terminate(grace, hurry, |_| {}).await;
}

/// Stops whatever lives in a job cgroup left by a previous runner: SIGTERM to each
/// process, `grace` (cut short by `hurry`), then `cgroup.kill`; then removes the cgroup.
#[cfg(target_os = "linux")]
pub async fn stop_orphan_cgroup(cg: &Cgroup, grace: Duration, hurry: Option<StopDeadline>) {
    Group::cgroup_only("leftover cgroup", cg.clone())
        .terminate(grace, hurry, |_| {})
        .await;
    if let Err(e) = cg.remove() {
        tracing::warn!(cgroup = %cg.path().display(), error = %e, "could not remove a job cgroup left by a previous runner");
    }
}

/// `railgrid runner reap`: with the runner lock, ends every job a dead runner left
/// running (each with `min(kill_grace, grace)`) and marks it lost. Run as the runner's
/// account, so that jobs.db and its WAL files keep their owner and every signal comes from
/// the jobs' own account. Job cgroups are not looked at: where the runner had a delegated
/// cgroup, the agent has emptied its whole tree with `cgroup.kill` before, and the next
/// runner removes the empty job cgroups.
pub async fn reap(state_dir: &Path, grace: Duration) -> Result<ReapReport, LeftoverError> {
    if sys::is_root() {
        return Err(LeftoverError::Root);
    }
    let paths = super::Paths::new(state_dir);
    let task = |e: tokio::task::JoinError| LeftoverError::Task {
        path: paths.dir.clone(),
        message: e.to_string(),
    };
    let lock_path = paths.lock.clone();
    let held = tokio::task::spawn_blocking(move || lock::acquire(&lock_path))
        .await
        .map_err(task)?;
    let _lock = match held {
        Ok(l) => l,
        Err(e @ (lock::LockError::Held { .. } | lock::LockError::HeldUnknown { .. })) => {
            // 0: the holder wrote no pid.
            let pid = match e {
                lock::LockError::Held { pid, .. } => pid,
                _ => 0,
            };
            tracing::warn!(pid, lock = %paths.lock.display(), "a runner holds the lock: its jobs are its own; nothing reaped");
            return Ok(ReapReport {
                held_by: Some(pid),
                ..ReapReport::default()
            });
        }
        Err(e) => return Err(e.into()),
    };
    let db = paths.dir.join("jobs.db");
    if !db.exists() {
        // No runner ever ran here: nothing to reap, and no database to create.
        return Ok(ReapReport::default());
    }
    let path = db.clone();
    let opened = tokio::task::spawn_blocking(move || Store::open(&path))
        .await
        .map_err(task)?;
    let (store, leftovers) = match opened {
        Ok(store) => {
            let store = std::sync::Arc::new(store);
            let s = store.clone();
            let (leftovers, _) = tokio::task::spawn_blocking(move || find(&s, None))
                .await
                .map_err(task)??;
            (Some(store), leftovers)
        }
        // The jobs are ended all the same: the records say which processes they are.
        Err(open_err) => {
            tracing::warn!(db = %db.display(), error = %crate::error_chain(&open_err), "could not open the job database for writing: ending its jobs from a read-only look; their records stay as they are");
            let recs = tokio::task::spawn_blocking(move || {
                Store::read_only_in_states(&db, &[JobState::Starting, JobState::Running])
            })
            .await
            .map_err(task)?
            .map_err(|_| open_err)?;
            (
                None,
                recs.into_iter().map(Leftover::without_cgroup).collect(),
            )
        }
    };
    let spool_root = paths.dir.join("jobs");
    let ended = futures_util::future::join_all(leftovers.iter().map(|left| {
        let grace = grace_for(&left.rec, grace);
        stop(left, grace, Context::Reap, None)
    }))
    .await;
    // All marks at once, and one deadline for those the disk cannot take yet: one at a
    // time, a few held ends would outlast the agent's patience with the reap.
    let deadline = tokio::time::Instant::now() + REAP_COMMIT_WAIT;
    let marked = futures_util::future::join_all(ended.iter().map(|e| {
        let outcome = lost_outcome(&spool_root, &e.id, e.reason.clone());
        let store = store.as_ref();
        async move {
            let Some(store) = store else {
                return false;
            };
            match store.mark_finished(&e.id, JobState::Lost, &outcome).await {
                Ok(Recorded::Committed) => true,
                Ok(Recorded::Held(later)) => matches!(
                    tokio::time::timeout_at(deadline, later).await,
                    Ok(Ok(()))
                ),
                Err(err) => {
                    tracing::error!(job = %e.id, error = %crate::error_chain(&err), "could not mark the job lost");
                    false
                }
            }
        }
    }))
    .await;
    let mut report = ReapReport::default();
    for (e, committed) in ended.into_iter().zip(marked) {
        tracing::warn!(job = %e.id, pid = ?e.pid, reason = %e.reason, "reaped: marked lost");
        if !committed {
            report.uncommitted.push(e.id.clone());
        }
        report.ended.push(e);
    }
    Ok(report)
}
