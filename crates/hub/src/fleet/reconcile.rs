//! An agent's reconcile as the fleet answers it: the report taken (bounded, so that an
//! agent's token cannot make the hub hold megabytes), the long poll held on the agent's
//! channel, the answer computed from memory; and the reports written to the store in
//! batches by [`ReportFlusher`].

use super::*;
use crate::proto::hub::SETTINGS;

/// A reconcile whose report is taken, between its hold and its answer.
pub struct Poll {
    entry: Arc<AgentEntry>,
    rx: watch::Receiver<u64>,
    /// The agent's jobs' version ([`super::jobs::version`]).
    jobs: watch::Receiver<u64>,
    /// The newest generation the agent has had: the one it applied, or a newer one it
    /// could not apply (answered again, it would refuse it again).
    observed: u64,
    /// The jobs' version the agent echoed; `None` from an agent older than the field.
    jobs_seen: Option<u64>,
    /// The echo is ahead of this hub, which waits to follow the store rather than answer
    /// from what it has.
    jobs_follow: bool,
    /// The hash of the agent's token when its report was taken.
    token: String,
}

impl<S: Store> Fleet<S> {
    /// A reconcile's first part: `report` recorded, and what a hold then waits on. Then
    /// [`hold`](Self::hold), then [`answer`](Self::answer).
    pub async fn take_report(
        self: &Arc<Self>,
        entry: &Arc<AgentEntry>,
        presented: &str,
        mut report: AgentReport,
    ) -> Result<Poll, FleetError> {
        if self.store_lost.load(Ordering::Acquire) {
            return Err(FleetError::StoreLost);
        }
        let observed = report.observed_generation;
        // Kept with the poll, not in the report: a report that moves only by it would be
        // a store write for nothing.
        let jobs_seen = report.jobs_version.take();
        // The token it was being sent, used: its only one from now on.
        self.promote_if_next(entry, presented).await?;
        let token = util::lock(&entry.state).token_sha256.clone();
        let mut rx = entry.generation.subscribe();
        let jobs_rx = entry.jobs_version.subscribe();
        // A fleet change takes its generation before each agent's channel is told: what
        // this agent may have been answered already counts too.
        let mut current = (*rx.borrow_and_update()).max(self.effective_generation(entry));
        let mut caught_up = false;
        if observed > current && self.replicated {
            // An agent that moved here from another replica may be ahead of what this
            // one has followed so far: catch up before taking it for a restore (once a
            // second per agent: a hostile report must not make every reconcile a load;
            // in between it is asked to come back, never reset to a lagging copy).
            if !entry.may_catch_up() {
                return Err(FleetError::CatchingUp(entry.id.clone()));
            }
            self.catch_up(&entry.id).await?;
            caught_up = true;
            current = (*rx.borrow_and_update()).max(self.effective_generation(entry));
        }
        // Likewise for its jobs: another hub changed them and this one has not followed.
        // Answered from what this hub has, the agent would drop a job it runs; so catch
        // up (as seldom), or hold the poll until this hub follows. Still ahead after a
        // catch-up, the store itself is behind (a restore): the agent is answered at once
        // and takes this hub's version.
        let mut jobs_follow = false;
        if jobs_seen.is_some_and(|s| s > entry.jobs_version.current()) && self.replicated {
            if !caught_up && entry.may_catch_up() {
                self.catch_up(&entry.id).await?;
            } else if !caught_up {
                jobs_follow = true;
            }
        }
        // After a renumbering the numbers an agent holds may name other states: until it
        // has reported 0 once, any other number is taken as ahead.
        let must_reset = util::lock(&entry.state).observed_generation == MUST_RESET;
        if observed > current || (must_reset && observed != 0) {
            // The agent applied a generation this hub never handed out: the hub was
            // restored from an older backup or renumbered, or the report is hostile.
            // What the hub holds is what counts, and no report ever moves the fleet's one
            // counter: the agent is told to start over from the hub's own state.
            self.log_ahead(entry, observed, current);
            return Err(FleetError::AheadOfHub {
                agent: entry.id.clone(),
                observed,
                current,
            });
        }
        // Jobs are kept with the jobs, not in the agent's report.
        let jobs = std::mem::take(&mut report.jobs);
        let rolled_back = self.new_rollback(entry, &report);
        if !jobs.is_empty() || rolled_back.is_some() {
            // Taken in whole, never half: a poll whose client goes away is dropped where
            // it waits, and a store write answered but not yet applied here would leave
            // this hub's copy behind the store.
            let fleet = self.clone();
            let e = entry.clone();
            tokio::spawn(async move {
                if !jobs.is_empty() {
                    fleet.job_reports(&e, jobs).await?;
                }
                // The halt first: whoever sees the rollback in the agent's report sees
                // the halt.
                if let Some((version, reason)) = rolled_back {
                    fleet.halt_on_rollback(&e, &version, reason).await?;
                }
                Ok::<(), FleetError>(())
            })
            .await
            .map_err(|e| FleetError::Store(crate::store::StoreError::Worker(e)))??;
        }
        // What it refused counts as had, up to what this hub gave (never past: a hostile
        // number must not hold the poll past a change); never beside a reset (0).
        let refused = report.refused_generation.filter(|_| observed != 0);
        let had = observed.max(refused.unwrap_or(0).min(current));
        self.queue_report(entry, report);
        self.kick_if_room(entry);
        Ok(Poll {
            entry: entry.clone(),
            rx,
            jobs: jobs_rx,
            observed: had,
            jobs_seen,
            jobs_follow,
            token,
        })
    }

    /// Holds `poll` until the agent's desired state passes what it reported, what it
    /// is sent of its jobs moves past what it echoed, it is revoked, the store is lost,
    /// or `wait` has passed; at once when `wait` is zero. A future of its own, small: it
    /// is what ten thousand idle agents cost while held.
    pub async fn hold(&self, poll: &mut Poll, wait: Duration) {
        let Poll {
            entry,
            rx,
            jobs,
            observed,
            jobs_seen,
            jobs_follow,
            ..
        } = poll;
        let jobs_due = jobs_due(entry, jobs, *jobs_seen, *jobs_follow);
        if wait.is_zero() || *rx.borrow() > *observed || jobs_due {
            return;
        }
        let _held = Held::new(&entry.polls, &self.held);
        // Either way the answer is computed from what holds then.
        let settings = rx.wait_for(|g| {
            *g > *observed || entry.is_revoked() || self.store_lost.load(Ordering::Acquire)
        });
        let _ = tokio::time::timeout(wait, async {
            tokio::select! {
                // Both cancel-safe: a watch receiver keeps its seen-version.
                _ = settings => {}
                _ = jobs.changed() => {}
            }
        })
        .await;
    }

    /// A reconcile's last part: the desired state `poll`'s agent is answered with now,
    /// and the jobs it offers for the first time (no answer before carried them).
    pub async fn answer(
        &self,
        poll: Poll,
        presented: &str,
    ) -> Result<(DesiredState, std::collections::HashSet<String>), FleetError> {
        let Poll {
            entry,
            token,
            jobs_seen,
            ..
        } = poll;
        if self.store_lost.load(Ordering::Acquire) {
            return Err(FleetError::StoreLost);
        }
        // Revoked, or enrolled again with another token (through another replica),
        // while the poll was held.
        if entry.is_revoked() || util::lock(&entry.state).token_sha256 != token {
            return Err(FleetError::Revoked(entry.id.clone()));
        }
        crate::metrics::RECONCILES.inc();
        let unoffered = super::jobs::unoffered(&util::lock(&entry.state).jobs);
        let mut desired = self.desired_for(&entry, true);
        if jobs_seen.is_none() {
            // An agent older than the jobs' version: what it was answered is remembered
            // here, and it is asked back at once (it would otherwise wait out the poll
            // interval after an answer that a job, not a setting, cut short).
            let version = desired.jobs_version.unwrap_or_default();
            entry.echoless.store(version, Ordering::Release);
            desired.poll_interval_secs = Some(0);
        }
        desired.new_token = self
            .token_for_answer(&entry, presented)
            .await?
            .map(desired::NewToken);
        let fresh = desired
            .jobs
            .iter()
            .filter(|j| j.spec.is_some() && unoffered.contains(&j.id))
            .map(|j| j.id.clone())
            .collect();
        Ok((desired, fresh))
    }

    /// The version `report` says this agent rolled back, with why, when it says so for
    /// the first time: an agent keeps reporting its rollback, and a halt an operator
    /// resumed must stay resumed. Only a version this agent was sent: a token cannot
    /// halt any string it likes.
    fn new_rollback(&self, entry: &AgentEntry, report: &AgentReport) -> Option<(String, String)> {
        let rolled_back_of = |r: &AgentReport| {
            r.upgrade
                .as_ref()
                .filter(|u| u.state == ROLLED_BACK)
                .and_then(|u| u.target.clone())
        };
        let v = rolled_back_of(report)?;
        let before = util::lock(&entry.state)
            .report
            .as_ref()
            .and_then(rolled_back_of);
        if before.as_ref() == Some(&v) {
            return None;
        }
        let sent = self.effective(entry).1.version;
        if !desired::is_version(&v) || sent.as_deref() != Some(v.as_str()) {
            return None;
        }
        let reason = report
            .upgrade
            .as_ref()
            .and_then(|u| u.error.clone())
            .unwrap_or_default();
        Some((v, reason))
    }

    /// Once a minute per agent at most: a hostile agent may send such reports as fast as
    /// it can, and each one would be a line.
    pub(super) fn log_ahead(&self, entry: &AgentEntry, observed: u64, current: u64) {
        let now = crate::util::unix_now();
        let mut st = util::lock(&entry.state);
        if st
            .ahead_logged_at
            .is_some_and(|t| now.saturating_sub(t) < AHEAD_LOG_EVERY.as_secs())
        {
            return;
        }
        st.ahead_logged_at = Some(now);
        drop(st);
        tracing::warn!(agent = %entry.id, observed, current, "an agent reports a generation this hub never handed out; it is told to take the hub's own desired state (a restored or renumbered hub explains this; otherwise the agent's token may be in other hands)");
    }

    /// Gives `entry`'s scope the next generation, keeping its stored settings. Called
    /// with `changes` held.
    pub(super) async fn resync_locked(&self, entry: &AgentEntry) -> Result<(), FleetError> {
        let mut settings = util::lock(&entry.state).own.settings.clone();
        let generation = loop {
            match self
                .store
                .set_scope(&entry.id, &settings, Some(&settings))
                .await?
            {
                Ok(generation) => break generation,
                // Another replica changed them meanwhile: keep its settings.
                Err(stored) => settings = stored,
            }
        };
        self.newest.fetch_max(generation, Ordering::AcqRel);
        {
            let mut st = util::lock(&entry.state);
            st.own.generation = st.own.generation.max(generation);
            st.own.settings = settings;
        }
        self.announce(entry);
        Ok(())
    }

    /// Keeps `report` as the agent's latest and marks the agent for the next batch; the
    /// report is serialised only then, off the reconcile's path.
    pub(super) fn queue_report(&self, entry: &Arc<AgentEntry>, mut report: AgentReport) {
        bound_report(&mut report);
        let (relabelled, upgraded) = {
            let mut st = util::lock(&entry.state);
            st.last_seen = Some(crate::util::unix_now());
            st.observed_generation = report.observed_generation;
            let before = st.report.as_ref();
            let relabelled = before.map(|r| &r.labels) != Some(&report.labels);
            let upgraded = before.map(|r| (&r.version, r.upgrade.as_ref().map(|u| &u.state)))
                != Some((&report.version, report.upgrade.as_ref().map(|u| &u.state)));
            if upgraded {
                // Counted once, as the state first moves to its end.
                match report.upgrade.as_ref().map(|u| u.state.as_str()) {
                    Some("committed") => crate::metrics::upgrade_ended("committed"),
                    Some(ROLLED_BACK) => crate::metrics::upgrade_ended("rolled_back"),
                    _ => {}
                }
            }
            st.report = Some(report);
            (relabelled, upgraded)
        };
        if relabelled {
            self.agents.reindex(entry);
        }
        if upgraded {
            // A rollout may be waiting for this.
            self.rollout_kick.notify_one();
        }
        if !entry.dirty.swap(true, Ordering::AcqRel) {
            util::lock(&self.reports).push(entry.clone());
        }
    }

    /// Writes the queued reports; called by the flusher and once at shutdown.
    pub async fn flush_reports(&self) -> Result<usize, FleetError> {
        let dirty = std::mem::take(&mut *util::lock(&self.reports));
        let batch: Vec<ReportRow> = dirty
            .iter()
            .filter_map(|e| {
                // Cleared before the state is read: a report queued meanwhile marks the
                // agent again, for the next batch.
                e.dirty.store(false, Ordering::Release);
                let st = util::lock(&e.state);
                Some(ReportRow {
                    id: e.id.clone(),
                    seen_at: st.last_seen?,
                    observed_generation: st.observed_generation,
                    report: serde_json::to_string(st.report.as_ref()?).ok()?,
                })
            })
            .collect();
        let n = batch.len();
        self.store.record_reports(batch).await?;
        Ok(n)
    }
}

/// What the hub keeps of a report's free text: enough for any real value, so that an
/// agent's token cannot make the hub hold (or `agent list` return) megabytes per agent.
const MAX_FIELD: usize = 256;
pub(super) const MAX_ERROR_FIELD: usize = 1024;
const MAX_BAD_VERSIONS: usize = 16;

/// Whether a poll is answered at once for its jobs: the version it echoed is behind this
/// hub's (or ahead of it, unless this hub waits to follow: `follow`), or, from an agent
/// that echoes none, the version moved since this hub last answered it. Marks the
/// version now as seen, so that the hold wakes for a later one only.
fn jobs_due(
    entry: &AgentEntry,
    jobs: &mut watch::Receiver<u64>,
    seen: Option<u64>,
    follow: bool,
) -> bool {
    let now = *jobs.borrow_and_update();
    match seen {
        Some(seen) => seen < now || (seen > now && !follow),
        // Such an agent learns of an answer lost on its way only at its next hold's end.
        None => entry.echoless.load(Ordering::Acquire) != now,
    }
}

/// Cuts a report's strings to what the hub keeps.
pub(super) fn bound_report(r: &mut AgentReport) {
    for f in [
        &mut r.version,
        &mut r.os,
        &mut r.arch,
        &mut r.hostname,
        &mut r.runner.state,
    ] {
        crate::util::cut_bytes(f, MAX_FIELD);
    }
    if let Some(e) = &mut r.runner.last_error {
        crate::util::cut_bytes(e, MAX_ERROR_FIELD);
    }
    if let Some(u) = &mut r.upgrade {
        crate::util::cut_bytes(&mut u.state, MAX_FIELD);
        if let Some(t) = &mut u.target {
            crate::util::cut_bytes(t, MAX_FIELD);
        }
        if let Some(e) = &mut u.error {
            crate::util::cut_bytes(e, MAX_ERROR_FIELD);
        }
        u.bad_versions.truncate(MAX_BAD_VERSIONS);
        for v in &mut u.bad_versions {
            crate::util::cut_bytes(v, MAX_FIELD);
        }
    }
}

/// `current` with `change` applied, validated.
pub(super) fn changed(
    current: &DesiredSettings,
    change: &DesiredChange,
) -> Result<DesiredSettings, FleetError> {
    let mut next = current.overlaid(&change.set);
    for field in &change.clear {
        if !next.clear(field) {
            return Err(FleetError::BadSetting {
                field: format!("clear[{field:?}]"),
                why: format!("not a desired setting ({})", SETTINGS.join(", ")),
            });
        }
    }
    if let Some((field, why)) = change.set.refused() {
        return Err(FleetError::BadSetting {
            field: field.into(),
            why,
        });
    }
    Ok(next)
}

/// Writes queued reports once a second; a handle that flushes a last time at shutdown.
pub struct ReportFlusher(tokio::task::JoinHandle<()>);

impl ReportFlusher {
    pub fn spawn<S: Store>(fleet: Arc<Fleet<S>>) -> Self {
        Self(tokio::spawn(async move {
            let mut tick = tokio::time::interval(FLUSH_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                tick.tick().await;
                match fleet.flush_reports().await {
                    Ok(_) if failing => {
                        failing = false;
                        tracing::info!("agent reports are written to the hub database again");
                    }
                    Ok(_) => {}
                    Err(e) if !failing => {
                        failing = true;
                        tracing::error!(error = %util::error_chain(&e), "could not write agent reports to the hub database (agents keep being served; retrying)");
                    }
                    Err(_) => {}
                }
            }
        }))
    }

    pub fn stop(self) {
        self.0.abort();
    }
}
