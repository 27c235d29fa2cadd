//! What the hub shows of jobs: one job, a page of them, and a wait for one to be done.

use std::time::Duration;

use super::queue::Censuses;
use super::*;

/// What the hub shows of a job.
pub(super) fn view(row: JobRow, limits: &JobLimits) -> HubJobView {
    let p = row.progress;
    let hub_cut = |length: u64, stored: u64| {
        (length > stored).then(|| {
            format!(
                "the hub keeps the first {} bytes of each stream ({stored} of {length} kept)",
                limits.max_output
            )
        })
    };
    let join = |runner: Option<String>, hub: Option<String>| match (runner, hub) {
        (Some(r), Some(h)) => Some(format!("{r}; {h}")),
        (r, h) => r.or(h),
    };
    let runner = p.runner_truncated.unwrap_or_default();
    // Queued: what its wait added, as the queue ranks it.
    let effective_priority = (row.agent.is_empty() && !p.done).then(|| {
        limits.effective_priority(
            row.priority,
            crate::util::unix_now_ms().saturating_sub(row.created_ms),
        )
    });
    let output_truncated = Truncation::of(
        join(runner.stdout, hub_cut(row.stdout_length, row.stdout_stored)),
        join(runner.stderr, hub_cut(row.stderr_length, row.stderr_stored)),
    );
    HubJobView {
        id: row.id,
        agent: row.agent,
        selector: row.selector,
        scope: row.scope,
        priority: row.priority,
        effective_priority,
        attempt: row.attempt,
        retries: row.retries,
        queue_deadline_ms: row.queue_deadline_ms,
        group: row.group,
        spec: row.spec,
        state: p.state,
        cancel_requested: p.cancel_requested && !p.done,
        exit_code: p.exit_code,
        signal: p.signal,
        error: p.error,
        created_ms: row.created_ms,
        started_ms: p.started_ms,
        finished_ms: p.finished_ms,
        stdout_bytes: p.stdout_bytes,
        stderr_bytes: p.stderr_bytes,
        stdout_stored: row.stdout_stored,
        stderr_stored: row.stderr_stored,
        output_truncated,
        done: p.done,
        waiting: None,
        egress_denied: p.egress_denied,
    }
}

impl<S: Store> Fleet<S> {
    /// [`Self::job`], refused to a token whose job scopes do not reach it.
    pub async fn job_for(
        &self,
        id: &str,
        scope: Option<&Selector>,
    ) -> Result<HubJobView, FleetError> {
        let job = self.job(id).await?;
        match scope {
            Some(sel) if !self.job_in_scope(&job, sel) => Err(FleetError::OutOfScope(format!(
                "this token sees jobs only on agents whose hub labels match {sel}; job {} is not one",
                util::clip(id)
            ))),
            _ => Ok(job),
        }
    }

    pub async fn job(&self, id: &str) -> Result<HubJobView, FleetError> {
        let row = self
            .store
            .get_job(id)
            .await?
            .ok_or_else(|| FleetError::NoSuchJob(util::clip(id).into_owned()))?;
        Ok(self.shown(row))
    }

    /// A job's view, with what a queued or pending one waits for.
    pub(super) fn shown(&self, row: JobRow) -> HubJobView {
        self.shown_in(row, &mut Censuses::default())
    }

    /// [`Fleet::shown`] for one job of a listing.
    fn shown_in(&self, row: JobRow, censuses: &mut Censuses) -> HubJobView {
        let queued = row.agent.is_empty() && !row.progress.done;
        let waiting = queued.then(|| self.queue_waiting_in(&row, censuses));
        let mut v = view(row, &self.jobs.limits);
        if v.state == PENDING && !v.done {
            v.waiting = self
                .jobs
                .agent_of(&v.id)
                .map(|e| self.waiting_for(&e, &v.id));
        } else {
            v.waiting = waiting;
        }
        v
    }

    fn waiting_for(&self, entry: &AgentEntry, id: &str) -> String {
        let drained = self.effective(entry).1.accept_jobs == Some(false);
        let st = util::lock(&entry.state);
        let drain = st.report.as_ref().and_then(|r| r.drain.as_ref());
        let connected = self.connected(entry, st.last_seen);
        let offered = st.jobs.get(id).is_some_and(|j| j.offered);
        let runner = st
            .report
            .as_ref()
            .map(|r| r.runner.state.as_str())
            .filter(|s| !s.is_empty() && *s != "running");
        if entry.is_revoked() {
            format!("agent {} is revoked", entry.id)
        } else if !connected && st.last_seen.is_none() {
            format!("agent {} has never reconciled with this hub", entry.id)
        } else if !connected {
            format!("agent {} is not connected to this hub", entry.id)
        } else if let Some(state) = runner {
            format!(
                "agent {}'s runner is {} (see `railgrid hub agent show {}`)",
                entry.id,
                util::clip(state),
                entry.id
            )
        } else if drained || drain.is_some() {
            let why = drain.map_or(crate::proto::drain::HUB_REASON, |d| d.reason.as_str());
            format!(
                "agent {} is draining ({}): it takes the job once the drain ends",
                entry.id,
                util::clip(why)
            )
        } else if offered {
            format!("sent to agent {}, which has not reported it yet", entry.id)
        } else {
            format!("waiting for agent {} to take it", entry.id)
        }
    }

    pub async fn jobs(
        &self,
        filter: JobFilter<'_>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<HubJobView>, FleetError> {
        let rows = self.store.list_jobs(filter, before, limit).await?;
        let mut censuses = Censuses::default();
        Ok(rows
            .into_iter()
            .map(|r| self.shown_in(r, &mut censuses))
            .collect())
    }

    /// The job once it is done, or as it is when `timeout` has passed.
    pub async fn wait_job(&self, id: &str, timeout: Duration) -> Result<HubJobView, FleetError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut activity = self.job_activity();
        loop {
            activity.borrow_and_update();
            let v = self.job(id).await?;
            if v.done {
                return Ok(v);
            }
            tokio::select! {
                // Cancel-safe: `changed` only observes the channel.
                r = activity.changed() => if r.is_err() { return Ok(v) },
                () = tokio::time::sleep_until(deadline) => return Ok(v),
            }
        }
    }
}
