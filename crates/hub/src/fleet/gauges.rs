//! What the fleet is now, counted for a metrics scrape: agents by state and version, open
//! jobs by state, the queue by selector (and how long its oldest job has waited), held polls, and the rollouts that are not over.

use super::*;
use crate::metrics::Gauges;

impl<S: Store> Fleet<S> {
    /// One pass over the agents (each behind its own lock, briefly), the queue, and the
    /// rollouts not over (a few rows).
    pub async fn gauges(&self) -> Result<Gauges, FleetError> {
        let mut g = Gauges::default();
        for e in self.agents.all() {
            if e.is_revoked() {
                g.revoked += 1;
                continue;
            }
            let settings = self.effective(&e).1;
            let st = util::lock(&e.state);
            if self.connected(&e, st.last_seen) {
                g.connected += 1;
            } else {
                g.disconnected += 1;
            }
            let drained = settings.accept_jobs == Some(false)
                || st.report.as_ref().is_some_and(|r| r.drain.is_some());
            if drained {
                g.draining += 1;
            }
            if let Some(r) = &st.report {
                *g.by_version.entry(r.version.clone()).or_default() += 1;
            }
            for job in st.jobs.values() {
                *g.open_jobs.entry(job.state().to_owned()).or_default() += 1;
            }
        }
        {
            let now = util::unix_now_ms();
            for (text, n, oldest_ms) in self.jobs.queue_depths() {
                *g.open_jobs.entry(QUEUED.into()).or_default() += n;
                g.queue_oldest_secs
                    .insert(text.clone(), now.saturating_sub(oldest_ms) / 1000);
                g.queue_depth.insert(text, n);
            }
        }
        g.polls_held = self.held.load(Ordering::Relaxed) as u64;
        for r in self.store.list_rollouts(false).await? {
            *g.rollouts.entry(r.state.clone()).or_default() += 1;
            if crate::proto::rollout::is_final(&r.state) {
                continue;
            }
            if let Some((_, members)) = self.store.get_rollout(&r.id).await? {
                for m in members {
                    *g.rollout_members.entry(m.state).or_default() += 1;
                }
            }
        }
        Ok(g)
    }
}

use crate::proto::fleet_job::QUEUED;
