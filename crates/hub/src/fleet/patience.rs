//! The hub's patience with an agent that is gone (`hub serve --agent-patience`, default
//! 10 minutes): the jobs it was sent end `lost` once it has not been seen for that long, so
//! that `job wait` returns, `--retry` sends them to another agent, and the fleet's queue
//! does not count them against a host that is not there. A job the agent was never sent
//! keeps waiting for it (a pinned job waits at the hub while its agent is away); one
//! that ended there, its output on the way, stays as it ended.
//!
//! Whether such a job ran, and how far, is not known: an agent cut off from the hub
//! (not dead) may still be running it, which is why only `--retry` runs it again.

use std::time::Duration;

use super::{Fleet, FleetError};
use crate::store::{JobProgress, Store};
use crate::util;

/// How often the fleet is looked at: a quarter of the patience, within these bounds.
const EVERY_MIN: Duration = Duration::from_secs(1);
const EVERY_MAX: Duration = Duration::from_secs(10);

/// How often to look for agents gone past `patience`.
pub(super) fn every(patience: Option<Duration>) -> Duration {
    patience.map_or(EVERY_MAX, |p| (p / 4).clamp(EVERY_MIN, EVERY_MAX))
}

impl<S: Store> Fleet<S> {
    /// Ends, as `lost`, the jobs sent to every agent not seen for the hub's patience; how
    /// many. With replicas, the agents' last contact is read from the store first: an
    /// agent polling another replica is not absent.
    pub async fn end_jobs_of_absent(&self) -> Result<usize, FleetError> {
        let Some(patience) = self.jobs.limits.agent_patience else {
            return Ok(0);
        };
        let absent_since = |last_seen: Option<u64>| {
            let now = crate::util::unix_now();
            last_seen.is_some_and(|t| t.saturating_add(patience.as_secs()) <= now)
        };
        let candidates = || {
            self.agents
                .all()
                .into_iter()
                .filter(|e| !e.is_revoked())
                .filter(|e| {
                    let st = util::lock(&e.state);
                    !self.connected(e, st.last_seen)
                        && absent_since(st.last_seen)
                        && st.jobs.values().any(|j| j.lost_if_sent(0, "").is_some())
                })
                .collect::<Vec<_>>()
        };
        if candidates().is_empty() {
            return Ok(0);
        }
        self.adopt_reports().await?;
        let _one = self.changes.lock().await;
        let mut ended_jobs = 0;
        for entry in candidates() {
            let now = crate::util::unix_now_ms();
            let away = humantime::format_duration(patience);
            let why = format!(
                "agent {} was not seen for {away} (hub serve --agent-patience): whether the job ran there, and how it ended, is not known",
                entry.id
            );
            let updates: Vec<(String, JobProgress)> = {
                let st = util::lock(&entry.state);
                st.jobs
                    .values()
                    .filter_map(|j| Some((j.id.clone(), j.lost_if_sent(now, &why)?)))
                    .collect()
            };
            if updates.is_empty() {
                continue;
            }
            ended_jobs += updates.len();
            tracing::warn!(agent = %entry.id, jobs = updates.len(), patience = %away, "an agent gone past the hub's patience: its jobs end lost");
            self.save_jobs(&entry, updates, false).await?;
        }
        Ok(ended_jobs)
    }
}
