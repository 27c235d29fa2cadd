//! Startup reconciliation: what a previous runner left behind is ended in the background
//! (one task per leftover job or job cgroup, see [`crate::leftover`]) while this
//! runner already serves, its queued jobs are queued again, and the retention totals are
//! read back. Also `when_recorded`, which follows a state change the disk could not take
//! yet until it is committed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::admission::Queued;
use super::retention::Totals;
use super::{blocking, Engine, EngineError};
use crate::leftover::{self, Context, Leftover};
use crate::proto::job::JobState;
use crate::proto::spec;
use crate::store::Recorded;

impl Engine {
    /// When a state change was held rather than committed (a full disk), wakes waiters
    /// once it is committed: `wait` returns only committed ends.
    pub(super) fn when_recorded(&self, id: &str, what: &str, recorded: Recorded) {
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
    pub(super) async fn reconcile(&self) -> Result<(), EngineError> {
        let inner = self.inner.clone();
        #[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
        let (leftovers, ended_cgroups) =
            blocking(move || leftover::find(&inner.store, inner.cgroups.as_ref())).await??;
        let store = self.inner.store.clone();
        let (count, bytes) = blocking(move || store.finished_totals()).await??;
        // Workspaces are measured in the background: a large work root delays nothing.
        *self.totals() = Totals {
            count,
            bytes,
            kept: bytes,
        };
        let engine = self.clone();
        tokio::spawn(async move {
            if let Err(e) = engine.measure_kept().await {
                tracing::warn!(error = %crate::error_chain(&e), "could not measure the finished jobs' workspaces");
            }
        });
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
                self.count_finished(&id, outcome.spooled_bytes).await;
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
}
