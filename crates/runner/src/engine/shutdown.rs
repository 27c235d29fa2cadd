//! The runner's stop: `shutdown` cancels every running job and waits for all job and
//! leftover tasks; its deadline is the stop budget, which `fit_grace` cuts each kill grace to.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::admission::Cancel;
use super::Engine;

impl Engine {
    /// `asked`, cut to what is left of the stop budget once a stop has begun. Returns the
    /// grace and whether it was cut, which is logged with the job and both graces.
    pub(super) fn fit_grace(&self, id: &str, asked: Duration) -> (Duration, bool) {
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
        // A stop past a drain's deadline (an upgrade's switch) ends what is left for the
        // drain's reason, whichever of the two reaches a job first.
        let why = self
            .inner
            .drain
            .borrow()
            .as_ref()
            .filter(|d| d.past_deadline(crate::util::unix_now_ms()))
            .map(super::drain::deadline_reason);
        {
            let s = self.sched();
            for run in s.running.values() {
                // A job a drain's deadline is ending keeps its reason.
                run.cancel.send_if_modified(|c| {
                    let first = c.is_none();
                    c.get_or_insert_with(|| Cancel { why: why.clone() });
                    first
                });
            }
        }
        let mut tasks = std::mem::take(&mut *crate::util::lock(&self.inner.tasks));
        while tasks.join_next().await.is_some() {}
    }
}
