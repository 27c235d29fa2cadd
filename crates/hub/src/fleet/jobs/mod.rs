//! Jobs through the hub: submitted by an admin, carried to their agent in its desired
//! state, followed through the agent's reports, their output taken from its uploads.
//!
//! A job is `pending` until its agent reports it, then has the runner's state; it is
//! *done* once it has ended and its agent says the hub holds all of its output, and
//! only then leaves the agent's desired state. What the agent is sent of a job:
//! - pending: its spec (the agent starts it), while the answer has room;
//! - reported, or cancelled while pending: its id only (followed, never started again:
//!   that the spec stops travelling once the runner had the job is what keeps a job to
//!   one run, also where a runner forgot it);
//! - asked to cancel and not ended: its id in `cancel_jobs` too.
//!
//! Every change that alters what the agent is sent moves the agent's jobs' version
//! ([`version`]), so the agent's held poll answers at once; its generation stays, as
//! that names its settings only.

pub(super) mod board;
mod output;
pub(super) mod queue;
pub(super) mod version;
mod view;

pub use self::output::{OutputSlice, Upload};
use self::view::view;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{AgentEntry, Fleet, FleetError};
use crate::proto::fleet_job::{
    DesiredJob, HubJobSubmit, HubJobView, JobReport, DEFAULT_PRIORITY, MAX_PRIORITY, MAX_RETRIES,
    PENDING, QUEUED,
};
use crate::proto::job::{JobSpec, JobState, Truncation};
use crate::proto::selector::Selector;
use crate::store::{Appended, JobFilter, JobProgress, JobRow, Store, Stream};
use crate::util;

/// Specs put into one answer, at most (the rest follow in later answers): far under
/// the 1 MiB an agent reads of an answer.
const SPEC_BUDGET: usize = 512 * 1024;
/// The longest error text kept of a job.
const MAX_ERROR: usize = 1024;
/// The longest truncation reason kept of a stream.
const MAX_REASON: usize = 512;
/// Kinds of egress refusal kept per job (the runner keeps 64, 16 more for addresses,
/// and one for the rest).
const MAX_DENIALS: usize = 81;

/// The hub's bounds on jobs.
#[derive(Debug, Clone, Copy)]
pub struct JobLimits {
    /// Jobs not done per agent: beyond, a submission is refused.
    pub max_open: usize,
    /// Bytes kept of each stream of a job.
    pub max_output: u64,
    /// How long an agent may be gone before the jobs it was sent end `lost` (`None`:
    /// for ever).
    pub agent_patience: Option<Duration>,
    /// Done jobs kept, newest first; older ones are deleted with their output.
    pub keep_done: usize,
    /// A queued job gains a point of priority each this long it waits (`None`: strict
    /// priority), so that every queued job runs eventually (queue.rs).
    pub priority_aging: Option<Duration>,
}

/// What `hub serve --priority-aging` is unless given: a priority-0 job goes before a
/// priority-100 job submitted 5 minutes after it.
pub(super) const DEFAULT_PRIORITY_AGING: Duration = Duration::from_secs(3);

impl JobLimits {
    /// `priority`, after `waited_ms` in the queue, as the queue orders it: at most
    /// [`MAX_PRIORITY`].
    pub fn effective_priority(&self, priority: u8, waited_ms: u64) -> u8 {
        let gained = self
            .priority_aging
            .map_or(0, |every| waited_ms / (every.as_millis() as u64).max(1));
        u64::from(priority)
            .saturating_add(gained)
            .min(u64::from(MAX_PRIORITY)) as u8
    }
}

impl Default for JobLimits {
    fn default() -> Self {
        Self {
            max_open: 1000,
            max_output: 16 * 1024 * 1024,
            keep_done: 10_000,
            agent_patience: Some(Duration::from_secs(600)),
            priority_aging: Some(DEFAULT_PRIORITY_AGING),
        }
    }
}

/// A job not done yet, as the hub holds it with its agent.
#[derive(Debug)]
pub(super) struct OpenJob {
    pub(super) id: String,
    seq: u64,
    priority: u8,
    /// Kept while the job is pending: once reported, it is never sent again.
    spec: Option<Arc<JobSpec>>,
    spec_len: usize,
    progress: JobProgress,
    /// Its spec may have reached its agent: true once an answer carried it, and for
    /// every job the hub found pending at its start (an answer before the restart may
    /// have). A pending job never offered is cancelled at the hub, at once.
    offered: bool,
}

impl OpenJob {
    /// Its state, as the hub last heard it.
    pub(super) fn state(&self) -> &str {
        &self.progress.state
    }

    pub(super) fn loaded(row: JobRow) -> Self {
        let spec_len = row.spec.canonical().len();
        Self {
            id: row.id,
            seq: row.seq,
            priority: row.priority,
            spec: (row.progress.state == PENDING).then(|| Arc::new(row.spec)),
            spec_len,
            progress: row.progress,
            offered: true,
        }
    }

    /// A job given to its agent now. With replicas the agent's poll may be held by
    /// another hub, which sends the job without this one knowing: it counts as offered,
    /// and is cancelled through the agent.
    pub(super) fn given(row: JobRow, replicated: bool) -> Self {
        Self {
            offered: replicated,
            ..Self::loaded(row)
        }
    }

    fn pending(&self) -> bool {
        self.progress.state == PENDING
    }

    /// Its progress ended `lost` with `error`, if its agent may have it (it was sent, and
    /// has not ended there).
    pub(super) fn lost_if_sent(&self, now_ms: u64, error: &str) -> Option<JobProgress> {
        if !self.offered || ended(&self.progress.state) {
            return None;
        }
        let mut next = self.progress.clone();
        next.state = JobState::Lost.as_str().into();
        next.done = true;
        next.finished_ms = Some(now_ms);
        next.error = Some(error.to_owned());
        Some(next)
    }
}

/// The ids of the jobs no answer has carried yet.
pub(super) fn unoffered(jobs: &HashMap<String, OpenJob>) -> std::collections::HashSet<String> {
    jobs.values()
        .filter(|j| !j.offered)
        .map(|j| j.id.clone())
        .collect()
}

fn ended(state: &str) -> bool {
    JobState::parse(state).is_some_and(JobState::is_terminal)
}

/// The `jobs` and `cancel_jobs` of an agent's desired state.
pub(super) fn desired(
    jobs: &mut HashMap<String, OpenJob>,
    offer: bool,
) -> (Vec<DesiredJob>, Vec<String>) {
    let mut open: Vec<&mut OpenJob> = jobs.values_mut().collect();
    open.sort_unstable_by_key(|j| (std::cmp::Reverse(j.priority), j.seq));
    let (mut out, mut cancel) = (Vec::with_capacity(open.len()), Vec::new());
    let mut budget = SPEC_BUDGET;
    for j in open {
        if j.progress.cancel_requested && !ended(&j.progress.state) {
            cancel.push(j.id.clone());
        }
        let spec = match &j.spec {
            Some(spec) if j.pending() && !j.progress.cancel_requested => {
                // By priority, then in submission order: a job that does not fit
                // waits, and so do those after it.
                if j.spec_len > budget {
                    budget = 0;
                    continue;
                }
                budget -= j.spec_len;
                if offer {
                    j.offered = true;
                }
                Some((**spec).clone())
            }
            _ => None,
        };
        out.push(DesiredJob {
            id: j.id.clone(),
            spec,
            // Unsealed as the answer leaves (`hub::secrets::deliver`), never kept here.
            secret_values: Default::default(),
        });
    }
    (out, cancel)
}

/// Where a submitted job goes.
enum Route {
    Agent(String),
    Select {
        selector: Selector,
        /// Seconds in the queue before it expires.
        timeout: Option<u64>,
    },
}

/// The route a submission names: exactly one of an agent and a selector.
fn route_of(
    agent: Option<String>,
    selector: Option<String>,
    queue_timeout_secs: Option<u64>,
) -> Result<Route, FleetError> {
    let bad = |field: &str, why: String| FleetError::BadSetting {
        field: field.into(),
        why,
    };
    match (agent, selector) {
        (Some(_), Some(_)) => Err(bad(
            "selector",
            "give either agent (one host) or selector (any matching host), not both".into(),
        )),
        (None, None) => Err(bad(
            "agent",
            "give the agent that runs the job, or a selector for any matching agent".into(),
        )),
        (Some(_), None) if queue_timeout_secs.is_some() => Err(bad(
            "queue_timeout_secs",
            "only a job routed by selector waits in the fleet's queue".into(),
        )),
        (Some(agent), None) => Ok(Route::Agent(agent)),
        (None, Some(text)) => {
            let selector = Selector::parse(&text).map_err(|e| bad("selector", e.to_string()))?;
            if queue_timeout_secs == Some(0) {
                return Err(bad(
                    "queue_timeout_secs",
                    "0: give at least 1 second, or none to wait until an agent takes it".into(),
                ));
            }
            Ok(Route::Select {
                selector,
                timeout: queue_timeout_secs,
            })
        }
    }
}

fn cut(s: &str, max: usize) -> String {
    let mut s = s.to_owned();
    crate::util::cut_bytes(&mut s, max);
    s
}

/// `prev` with the agent's report taken in. An ended job's state is final: a report
/// after it moves only its output counts and whether its output is all here.
fn merged(prev: &JobProgress, r: &JobReport, now: u64) -> JobProgress {
    let mut p = prev.clone();
    if !ended(&prev.state) {
        p.state = r.state.as_str().to_owned();
        p.exit_code = r.exit_code;
        p.signal = r.signal;
        p.error = r.error.as_deref().map(|e| cut(e, MAX_ERROR));
        if r.state.is_terminal() {
            p.finished_ms = Some(now);
        }
        if p.started_ms.is_none() {
            p.started_ms = Some(now);
        }
    }
    p.stdout_bytes = r.stdout_bytes;
    p.stderr_bytes = r.stderr_bytes;
    p.runner_truncated = r.output_truncated.as_ref().map(|t| Truncation {
        stdout: t.stdout.as_deref().map(|s| cut(s, MAX_REASON)),
        stderr: t.stderr.as_deref().map(|s| cut(s, MAX_REASON)),
    });
    if !r.egress_denied.is_empty() {
        // As the runner bounds them; an agent's report is not trusted for size.
        p.egress_denied = r
            .egress_denied
            .iter()
            .take(MAX_DENIALS)
            .map(|d| crate::proto::egress::Denial {
                destination: cut(&d.destination, MAX_REASON),
                reason: cut(&d.reason, MAX_REASON),
                count: d.count,
            })
            .collect();
    }
    p.done = ended(&p.state) && r.output_done;
    p
}

/// Whether going from `prev` to `next` changes what the agent is sent.
fn moves_desired(job: &OpenJob, next: &JobProgress) -> bool {
    job.pending() != (next.state == PENDING)
        || next.done
        || (job.progress.cancel_requested && !ended(&job.progress.state) && ended(&next.state))
}

/// What a submission's answer says a queued job waits for.
const JUST_QUEUED: &str = "queued: its status says what it waits for";

impl<S: Store> Fleet<S> {
    pub fn job_activity(&self) -> tokio::sync::watch::Receiver<u64> {
        self.jobs.activity()
    }

    /// Takes a job for `req.agent`, where it waits until the agent takes it, or for any
    /// agent matching `req.selector`, in the fleet's queue until one has room.
    /// `scope`: the selector of a scoped token's job scopes (only agents whose hub labels
    /// match may run its jobs).
    pub async fn submit_job(
        &self,
        req: HubJobSubmit,
        scope: Option<&Selector>,
    ) -> Result<HubJobView, FleetError> {
        self.submit(req, None, scope).await
    }

    /// [`Self::submit_job`], the job a member of fan-out `group`.
    pub(super) async fn submit(
        &self,
        req: HubJobSubmit,
        group: Option<&str>,
        scope: Option<&Selector>,
    ) -> Result<HubJobView, FleetError> {
        let HubJobSubmit {
            agent,
            selector,
            priority,
            queue_timeout_secs,
            retries,
            mut spec,
        } = req;
        let bad = |field: &str, why: String| FleetError::BadSetting {
            field: field.into(),
            why,
        };
        let retries = retries.unwrap_or(0);
        if retries > MAX_RETRIES {
            return Err(bad(
                "retries",
                format!("{retries} is out of range (0 to {MAX_RETRIES})"),
            ));
        }
        if retries > 0 && agent.is_some() {
            return Err(bad(
                "retries",
                "only a job routed by selector is retried (on another matching agent)".into(),
            ));
        }
        let route = route_of(agent, selector, queue_timeout_secs)?;
        let priority = priority.unwrap_or(DEFAULT_PRIORITY);
        if priority > MAX_PRIORITY {
            return Err(bad(
                "priority",
                format!("{priority} is out of range (0 to {MAX_PRIORITY})"),
            ));
        }
        let entry = match &route {
            Route::Agent(agent) => {
                let entry = self.entry(agent)?;
                if entry.is_revoked() {
                    return Err(FleetError::RevokedAgent(agent.clone()));
                }
                if let Some(sel) = scope {
                    self.check_scope(&entry, sel)?;
                }
                Some(entry)
            }
            Route::Select { .. } => None,
        };
        match spec.argv.first() {
            None => return Err(bad("spec.argv", "empty: give the program to run".into())),
            Some(p) if p.is_empty() => {
                return Err(bad(
                    "spec.argv[0]",
                    "the program is an empty string: give the program to run".into(),
                ))
            }
            Some(_) => {}
        }
        let id = match spec.id.take() {
            Some(id) => id,
            None => super::token::new_job_id().map_err(|e| bad("spec.id", e.to_string()))?,
        };
        if !crate::proto::spec::valid_id(&id) {
            return Err(bad(
                "spec.id",
                format!(
                    "{:?} is not a job id: use 1-128 characters from A-Z a-z 0-9 . _ -",
                    util::clip(&id)
                ),
            ));
        }
        spec.id = Some(id.clone());
        // The runner's own checks, at submission: a spec it would refuse (an owner with a
        // control character, a loader variable, an argument past exec's bound) is the
        // submitter's error now, not a `rejected` job later.
        spec.validate().map_err(|e| bad("spec", e.to_string()))?;
        let _one = self.changes.lock().await;
        match &entry {
            Some(entry) => {
                if util::lock(&entry.state).jobs.len() >= self.jobs.limits.max_open {
                    return Err(FleetError::TooManyJobs {
                        agent: entry.id.clone(),
                        max: self.jobs.limits.max_open,
                    });
                }
            }
            None => {
                if self.jobs.queued_len() >= queue::MAX_QUEUED {
                    return Err(FleetError::QueueFull(queue::MAX_QUEUED));
                }
            }
        }
        if self.jobs.agent_of(&id).is_some() {
            return Err(FleetError::JobExists(id));
        }
        let created_ms = crate::util::unix_now_ms();
        let (agent, state, selector, queue_deadline_ms) = match route {
            Route::Agent(agent) => (agent, PENDING, None, None),
            Route::Select { selector, timeout } => (
                String::new(),
                QUEUED,
                Some(selector.to_string()),
                timeout.map(|t| created_ms.saturating_add(t.saturating_mul(1000))),
            ),
        };
        let mut row = JobRow {
            id: id.clone(),
            seq: 0,
            agent,
            spec,
            created_ms,
            progress: JobProgress {
                state: state.into(),
                ..JobProgress::default()
            },
            selector,
            priority,
            queue_deadline_ms,
            group: group.map(str::to_owned),
            attempt: 1,
            retries,
            avoid: None,
            scope: scope.map(|s| s.to_string()),
            stdout_length: 0,
            stderr_length: 0,
            stdout_stored: 0,
            stderr_stored: 0,
        };
        let Some((seq, change)) = self.store.insert_job(&row).await? else {
            return Err(FleetError::JobExists(id));
        };
        row.seq = seq;
        let Some(entry) = entry else {
            tracing::info!(job = %id, selector = row.selector.as_deref().unwrap_or(""), priority, "job queued");
            self.enqueue(row.clone());
            self.jobs.moved();
            // Not the census `job status` takes: counting the agents a selector matches
            // at each submission would cost a large fleet's submissions more than
            // their transaction (docs/benchmarks.md, "Routing at 10 000 agents").
            let mut v = view(row, &self.jobs.limits);
            v.waiting = Some(JUST_QUEUED.into());
            return Ok(v);
        };
        let agent = entry.id.clone();
        let job = OpenJob::given(row.clone(), self.replicated);
        {
            let mut st = util::lock(&entry.state);
            st.jobs.insert(id.clone(), job);
        }
        util::write(&self.jobs.index).insert(id.clone(), entry.clone());
        if let Some(version) = change {
            entry.jobs_moved(version);
        }
        self.jobs.moved();
        tracing::info!(job = %id, agent = %agent, jobs_version = change.unwrap_or(0), "job submitted");
        Ok(self.shown(row))
    }

    /// Asks for a job's end: at once for a pending job its agent was never sent,
    /// otherwise through the agent (the runner's cancel). A job that has ended is left
    /// as it is.
    pub async fn cancel_job(&self, id: &str) -> Result<HubJobView, FleetError> {
        if self.replicated && self.jobs.agent_of(id).is_none() {
            // Taken by another replica a moment ago: follow it first.
            if let Some(agent) = self.store.job_agent(id).await? {
                let _one = self.changes.lock().await;
                if agent.is_empty() {
                    self.follow_queued(id).await?;
                } else {
                    self.follow_agent(&agent).await?;
                }
            }
        }
        {
            let _one = self.changes.lock().await;
            if self.cancel_queued(id).await? {
                drop(_one);
                return self.job(id).await;
            }
        }
        if let Some(entry) = self.jobs.agent_of(id) {
            let _one = self.changes.lock().await;
            let revoked = entry.is_revoked();
            let next = {
                let mut st = util::lock(&entry.state);
                st.jobs.get_mut(id).and_then(|job| {
                    let p = &job.progress;
                    if ended(&p.state) || p.cancel_requested {
                        return None;
                    }
                    let mut next = p.clone();
                    next.cancel_requested = true;
                    let at_hub = if job.pending() && !job.offered {
                        Some(format!(
                            "cancelled at the hub before agent {} was sent it",
                            entry.id
                        ))
                    } else if revoked {
                        Some(format!(
                            "cancelled at the hub: agent {} is revoked, so whether it ran there is not known",
                            entry.id
                        ))
                    } else {
                        None
                    };
                    if let Some(why) = at_hub {
                        next.state = JobState::Cancelled.as_str().into();
                        next.error = Some(why);
                        next.finished_ms = Some(crate::util::unix_now_ms());
                        next.done = true;
                    }
                    // At once, before the store has it: no answer computed meanwhile may
                    // send the job's spec (one that is, is followed by this cancel).
                    job.progress.cancel_requested = true;
                    Some(next)
                })
            };
            if let Some(p) = next {
                if let Err(e) = self.save_jobs(&entry, vec![(id.to_owned(), p)], true).await {
                    if let Some(job) = util::lock(&entry.state).jobs.get_mut(id) {
                        job.progress.cancel_requested = false;
                    }
                    return Err(e);
                }
                tracing::info!(job = %id, agent = %entry.id, "job cancel requested");
            }
        }
        self.job(id).await
    }

    /// Ends job `id` of agent `agent` `failed` with `why`, if it has not started: its
    /// secrets could not be sent with it (docs/security.md, "Secrets"), so it never
    /// leaves the hub.
    pub async fn fail_unsent(&self, agent: &str, id: &str, why: &str) -> Result<(), FleetError> {
        let entry = self.entry(agent)?;
        let _one = self.changes.lock().await;
        let next = util::lock(&entry.state).jobs.get(id).and_then(|j| {
            if !j.pending() || ended(&j.progress.state) {
                return None;
            }
            let mut next = j.progress.clone();
            next.state = JobState::Failed.as_str().into();
            next.error = Some(why.to_owned());
            next.finished_ms = Some(crate::util::unix_now_ms());
            next.done = true;
            Some(next)
        });
        if let Some(p) = next {
            self.save_jobs(&entry, vec![(id.to_owned(), p)], true)
                .await?;
            tracing::warn!(job = %id, agent = %agent, error = %why, "job failed at the hub");
        }
        Ok(())
    }

    /// Takes back the offer of jobs `ids` of agent `agent`, which the answer that offered
    /// them did not carry after all (their secrets were held back): as if never offered.
    pub fn withdraw(&self, agent: &str, ids: &[String]) {
        let Ok(entry) = self.entry(agent) else { return };
        let mut st = util::lock(&entry.state);
        for id in ids {
            if let Some(j) = st.jobs.get_mut(id) {
                j.offered = false;
            }
        }
    }

    /// Ends every open job of `entry`, which was just revoked: none may wait for, or be
    /// handed to, an agent enrolled later under the same id. A job never sent ends
    /// `cancelled`; one that may have reached the agent ends `lost` (whether it ran, and
    /// how it ended, is not known). Called with `changes` held.
    pub(super) async fn end_jobs_of_revoked(&self, entry: &AgentEntry) -> Result<(), FleetError> {
        let now = crate::util::unix_now_ms();
        let updates: Vec<(String, JobProgress)> = {
            let st = util::lock(&entry.state);
            st.jobs
                .values()
                .map(|j| {
                    let mut next = j.progress.clone();
                    next.done = true;
                    if ended(&j.progress.state) {
                        // Ended on the agent, its output still on the way: it stays as it
                        // ended, with what the hub holds, and says so.
                        next.error = Some(match &j.progress.error {
                            Some(e) => format!("{e}; agent {} was revoked before all of its output arrived", entry.id),
                            None => format!("agent {} was revoked before all of its output arrived", entry.id),
                        });
                        return (j.id.clone(), next);
                    }
                    let (state, why) = if j.pending() && !j.offered {
                        (
                            JobState::Cancelled,
                            format!("agent {} was revoked before it was sent the job", entry.id),
                        )
                    } else {
                        (
                            JobState::Lost,
                            format!("agent {} was revoked: whether the job ran there, and how it ended, is not known", entry.id),
                        )
                    };
                    next.state = state.as_str().into();
                    next.error = Some(why);
                    next.finished_ms = Some(now);
                    (j.id.clone(), next)
                })
                .collect()
        };
        if updates.is_empty() {
            return Ok(());
        }
        tracing::info!(agent = %entry.id, jobs = updates.len(), "ended the open jobs of a revoked agent");
        self.save_jobs(entry, updates, false).await
    }

    /// Records what changed about `updates`' jobs and applies it; `bump`: what the agent
    /// is sent changed, and its held polls answer. Called with `changes` held.
    pub(super) async fn save_jobs(
        &self,
        entry: &AgentEntry,
        updates: Vec<(String, JobProgress)>,
        bump: bool,
    ) -> Result<(), FleetError> {
        let version = self
            .store
            .update_jobs(&entry.id, updates.clone(), bump)
            .await?;
        let mut done = Vec::new();
        let mut lost = Vec::new();
        {
            let mut st = util::lock(&entry.state);
            for (id, p) in updates {
                let was_open = st.jobs.get(&id).is_some_and(|j| !ended(&j.progress.state));
                if was_open && p.state == JobState::Lost.as_str() {
                    lost.push(id.clone());
                }
                if p.done {
                    let ran = p
                        .started_ms
                        .zip(p.finished_ms)
                        .map(|(s, f)| f.saturating_sub(s));
                    crate::metrics::job_ended(&p.state, p.error.as_deref(), ran);
                    st.jobs.remove(&id);
                    done.push(id);
                } else if let Some(job) = st.jobs.get_mut(&id) {
                    if p.state != PENDING {
                        job.spec = None;
                    }
                    job.progress = p;
                }
            }
        }
        if !done.is_empty() {
            let mut index = util::write(&self.jobs.index);
            for id in &done {
                index.remove(id);
            }
            self.jobs.count_done(done.len());
            drop(index);
            // Room opened on the agent.
            self.kick();
        }
        if let Some(version) = version {
            entry.jobs_moved(version);
        }
        self.jobs.moved();
        for id in lost {
            self.retry_lost(entry, &id).await?;
        }
        Ok(())
    }

    /// Takes in the jobs of an agent's report: what changed is stored, and what changes
    /// what the agent is sent moves its jobs' version (so the reconcile answers at once).
    pub(super) async fn job_reports(
        &self,
        entry: &Arc<AgentEntry>,
        reports: Vec<JobReport>,
    ) -> Result<(), FleetError> {
        // One at a time with other changes: two reconciles of one agent (a poll it
        // abandoned, still held here, and its next) must not interleave.
        let _one = self.changes.lock().await;
        let now = crate::util::unix_now_ms();
        let (updates, bump) = {
            let st = util::lock(&entry.state);
            let mut updates = Vec::new();
            let mut bump = false;
            let mut seen = std::collections::HashSet::new();
            for r in reports.iter().take(self.jobs.limits.max_open + 64) {
                if !seen.insert(r.id.as_str()) {
                    // One report per job: a second would be merged from the same base.
                    continue;
                }
                let Some(job) = st.jobs.get(&r.id) else {
                    // Done already, or not this agent's.
                    continue;
                };
                let next = merged(&job.progress, r, now);
                if next != job.progress {
                    bump |= moves_desired(job, &next);
                    updates.push((r.id.clone(), next));
                }
            }
            (updates, bump)
        };
        if updates.is_empty() {
            return Ok(());
        }
        for (id, p) in &updates {
            if p.done {
                tracing::info!(job = %id, agent = %entry.id, state = %p.state, "job done");
            }
        }
        self.save_jobs(entry, updates, bump).await
    }

    /// Refuses `entry` to a token that reaches only agents matching `sel` (by the labels
    /// the hub set: a host's own cannot widen a token's reach).
    pub(super) fn check_scope(&self, entry: &AgentEntry, sel: &Selector) -> Result<(), FleetError> {
        super::labels::out_of_reach(&entry.id, &util::lock(&entry.state).hub_labels, sel)
    }

    /// Whether a token whose job scopes reach agents matching `sel` may see or cancel
    /// `job`: its agent matches, or, queued, it was submitted under the same selector.
    pub fn job_in_scope(&self, job: &HubJobView, sel: &Selector) -> bool {
        if job.agent.is_empty() {
            return job.scope.as_deref() == Some(sel.to_string().as_str());
        }
        self.entry(&job.agent)
            .is_ok_and(|e| self.check_scope(&e, sel).is_ok())
    }

    /// Takes in an agent's open jobs as another hub stored them: new ones, their
    /// progress, and those done (which leave); the caller moves its jobs' version as
    /// stored. Called with `changes` held, so that the store holds every change this hub
    /// made.
    pub(super) fn adopt_jobs(&self, entry: &Arc<AgentEntry>, rows: Vec<JobRow>) {
        let open: std::collections::HashSet<String> = rows.iter().map(|r| r.id.clone()).collect();
        let (mut added, mut gone) = (Vec::new(), Vec::new());
        let mut moved = false;
        {
            let mut st = util::lock(&entry.state);
            st.jobs.retain(|id, _| {
                let keep = open.contains(id);
                if !keep {
                    gone.push(id.clone());
                }
                keep
            });
            for row in rows {
                match st.jobs.get_mut(&row.id) {
                    Some(job) if job.progress != row.progress => {
                        if row.progress.state != PENDING {
                            job.spec = None;
                        }
                        job.progress = row.progress;
                        moved = true;
                    }
                    Some(_) => {}
                    None => {
                        added.push(row.id.clone());
                        st.jobs.insert(row.id.clone(), OpenJob::loaded(row));
                    }
                }
            }
        }
        if added.is_empty() && gone.is_empty() && !moved {
            return;
        }
        {
            let mut index = util::write(&self.jobs.index);
            let mut queue = util::lock(&self.jobs.queue);
            for id in &gone {
                index.remove(id);
            }
            for id in added {
                // Assigned to it by another replica.
                queue.remove(&id);
                index.insert(id, entry.clone());
            }
        }
        self.jobs.moved();
    }

    /// Deletes the oldest done jobs past the hub's bound, when some got done.
    pub(super) async fn retain_jobs(&self) {
        if !self.jobs.take_done() {
            return;
        }
        match self.store.retain_jobs(self.jobs.limits.keep_done).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(deleted = n, "old done jobs deleted"),
            Err(e) => {
                tracing::warn!(error = %util::error_chain(&e), "could not delete old done jobs (retried when more are done)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(seq: u64, state: &str) -> OpenJob {
        OpenJob {
            id: format!("j{seq}"),
            seq,
            priority: DEFAULT_PRIORITY,
            spec: Some(Arc::new(JobSpec {
                id: Some(format!("j{seq}")),
                argv: vec!["true".into()],
                ..JobSpec::default()
            })),
            spec_len: 40,
            progress: JobProgress {
                state: state.into(),
                ..JobProgress::default()
            },
            offered: false,
        }
    }

    #[test]
    fn pending_jobs_travel_with_their_spec_and_reported_ones_without() {
        let mut jobs: HashMap<String, OpenJob> = [job(2, "running"), job(1, PENDING)]
            .into_iter()
            .map(|j| (j.id.clone(), j))
            .collect();
        let mut c = job(3, PENDING);
        c.progress.cancel_requested = true;
        jobs.insert(c.id.clone(), c);
        let (d, cancel) = desired(&mut jobs, true);
        let ids: Vec<_> = d
            .iter()
            .map(|j| (j.id.as_str(), j.spec.is_some()))
            .collect();
        assert_eq!(ids, [("j1", true), ("j2", false), ("j3", false)]);
        assert_eq!(cancel, ["j3"]);
        assert!(jobs["j1"].offered);
    }

    #[test]
    fn specs_past_the_budget_wait_in_order() {
        let mut jobs = HashMap::new();
        for seq in 1..=3 {
            let mut j = job(seq, PENDING);
            j.spec_len = if seq == 2 { SPEC_BUDGET } else { 10 };
            jobs.insert(j.id.clone(), j);
        }
        let (d, _) = desired(&mut jobs, false);
        let ids: Vec<_> = d.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(ids, ["j1"]);
        assert!(!jobs["j1"].offered, "shown, not sent");
    }

    #[test]
    fn an_ended_state_is_final_and_done_needs_all_output() {
        let prev = JobProgress {
            state: "running".into(),
            ..JobProgress::default()
        };
        let mut r = JobReport {
            id: "j".into(),
            state: JobState::Succeeded,
            exit_code: Some(0),
            signal: None,
            error: Some("x".repeat(5000)),
            stdout_bytes: 10,
            stderr_bytes: 0,
            output_truncated: None,
            output_done: false,
            egress_denied: (0..100)
                .map(|i| crate::proto::egress::Denial {
                    destination: format!("{i}{}", "h".repeat(2000)),
                    reason: "r".repeat(2000),
                    count: 1,
                })
                .collect(),
        };
        let p = merged(&prev, &r, 7);
        assert_eq!(
            p.egress_denied.len(),
            MAX_DENIALS,
            "an agent's report is bounded"
        );
        assert!(p
            .egress_denied
            .iter()
            .all(|d| d.destination.len() < MAX_REASON + 8));
        assert_eq!(
            (p.state.as_str(), p.done, p.finished_ms),
            ("succeeded", false, Some(7))
        );
        assert!(p.error.as_ref().is_some_and(|e| e.len() < 1100));
        r.state = JobState::Lost;
        r.output_done = true;
        let q = merged(&p, &r, 9);
        assert_eq!(
            (q.state.as_str(), q.done, q.finished_ms),
            ("succeeded", true, Some(7))
        );
    }
}
