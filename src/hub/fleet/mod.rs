//! The fleet as the hub holds it in memory: every enrolled agent, the desired settings of
//! the fleet and of each agent, and the long polls waiting on them.
//!
//! Reads (authorising a reconcile, computing an agent's desired state, listing agents)
//! never touch the database. Changes are made durable in the [`Store`] first, then
//! applied here, then announced: each agent has a `watch` channel carrying the generation
//! of its effective desired state, and a held poll waits on its own agent's channel only.
//! So a change to one agent wakes that agent's poll, a fleet change wakes every poll, and
//! a held poll costs a parked future: no thread, no timer but its own deadline, no query.
//!
//! Generations come from one counter in the store; an agent's effective generation is the
//! larger of the fleet's and its own, so it only ever grows.
//!
//! Jobs ([`jobs`]): each agent's open jobs (not yet done) are in memory with it, and
//! are part of its desired state; every change to them is in the store before it is
//! acted on, and a change of what the agent is sent moves its generation, as a change
//! of its settings does.
//!
//! Task: [`ReportFlusher`] writes the reports queued by reconciles to the store in one
//! transaction a second (an agent sends its report again at each reconcile, so a batch
//! lost to a crash costs a `last_seen` a second old, never a decision).

mod jobs;
mod releases;
mod replicas;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use thiserror::Error;
use tokio::sync::watch;

use super::store::{HaltRow, ReleaseRow, ReportRow, Snapshot, Store, StoreError, MUST_RESET};
use super::token;
use crate::proto::desired::{self, DesiredRunner, DesiredState};
use crate::proto::hub::{AgentView, DesiredChange, DesiredSettings, DesiredView, ReleaseView};
use crate::proto::report::AgentReport;
use crate::util;

use self::jobs::OpenJob;
pub(crate) use self::jobs::{JobLimits, OutputSlice, Upload};
use self::releases::Releases;
pub(crate) use self::releases::ROLLED_BACK;
pub(crate) use self::replicas::ReplicaSync;

/// How often queued reports are written.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Agent ids: what a host name, a FQDN or a cloud instance id needs, nothing that could
/// be read as a path or need quoting.
const MAX_ID_LEN: usize = 128;
/// How often, at most, the hub logs that one agent reports a generation ahead of it.
const AHEAD_LOG_EVERY: Duration = Duration::from_secs(60);
/// The largest admission limit the hub passes on (the runner's own bound).
const MAX_LIMIT: usize = 100_000;

#[derive(Debug, Error)]
pub(crate) enum FleetError {
    #[error("unknown agent {0:?}")]
    NoSuchAgent(String),
    #[error("the token is not valid for agent {0:?}")]
    BadToken(String),
    #[error("agent {0:?} was revoked; enrol it again with `railgrid hub agent add {0}`")]
    Revoked(String),
    #[error("agent {0:?} is already enrolled; revoke it first to give it a new token")]
    Exists(String),
    #[error("invalid agent id {id:?}: {why}")]
    BadId { id: String, why: &'static str },
    #[error("{field}: {why}")]
    BadSetting { field: String, why: String },
    #[error("no job {0:?}")]
    NoSuchJob(String),
    #[error("job {0:?} exists already; give another --id")]
    JobExists(String),
    #[error("agent {agent:?} has {max} jobs not done yet, the most it may have waiting (hub serve --max-open-jobs): wait for some to finish, or cancel some")]
    TooManyJobs { agent: String, max: usize },
    #[error("the token is not valid for job {0:?}")]
    JobToken(String),
    #[error("agent {0:?} is revoked: it takes no jobs until it is enrolled again")]
    RevokedAgent(String),
    #[error("no release {0:?} is published")]
    NoSuchRelease(String),
    #[error("release {0:?} is not halted")]
    NotHalted(String),
    #[error(
        "this hub replica has lost its database and may be behind the others: try another replica"
    )]
    StoreLost,
    #[error("this hub replica is catching up with agent {0:?}'s state: retry in a moment")]
    CatchingUp(String),
    /// Answered 400 naming `observed_generation`: the agent then reports 0 and takes the
    /// hub's own desired state as a reset (docs/hub.md, "Generations").
    #[error("observed_generation {observed} is ahead of this hub's generation {current} for agent {agent:?} (a hub restored from an older backup, or renumbered): report 0 and take this hub's desired state")]
    AheadOfHub {
        agent: String,
        observed: u64,
        current: u64,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One desired-settings scope and the generation of its last change.
#[derive(Debug, Clone, Default)]
struct Scope {
    generation: u64,
    settings: DesiredSettings,
}

/// What changes about an agent, behind its own lock.
#[derive(Debug)]
struct AgentState {
    token_sha256: String,
    enrolled_at: u64,
    own: Scope,
    last_seen: Option<u64>,
    observed_generation: u64,
    report: Option<AgentReport>,
    /// Its jobs that are not done, by id.
    jobs: HashMap<String, OpenJob>,
    /// When a report ahead of the hub was last logged.
    ahead_logged_at: Option<u64>,
    /// When a report ahead of this replica last made it load the agent from the store.
    caught_up_at: Option<std::time::Instant>,
}

pub(crate) struct AgentEntry {
    id: String,
    state: Mutex<AgentState>,
    revoked: AtomicBool,
    /// The generation of its effective desired state; held polls wait on it.
    generation: watch::Sender<u64>,
    /// Polls held open now.
    polls: AtomicUsize,
    /// Its latest report waits for the next batch.
    dirty: AtomicBool,
}

impl AgentEntry {
    fn new(id: String, state: AgentState, revoked: bool, generation: u64) -> Arc<Self> {
        Arc::new(Self {
            id,
            state: Mutex::new(state),
            revoked: AtomicBool::new(revoked),
            generation: watch::Sender::new(generation),
            polls: AtomicUsize::new(0),
            dirty: AtomicBool::new(false),
        })
    }

    fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// True at most once a second: a catch-up with the store may start now.
    fn may_catch_up(&self) -> bool {
        let mut st = util::lock(&self.state);
        let due = st
            .caught_up_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if due {
            st.caught_up_at = Some(std::time::Instant::now());
        }
        due
    }
}

/// Counts a held poll, for its agent's `connected` and the hub's `polls_held`, while it
/// lives: a poll whose client goes away is dropped mid-wait, and must uncount itself.
struct Held<'a> {
    agent: &'a AtomicUsize,
    hub: &'a AtomicUsize,
}

impl<'a> Held<'a> {
    fn new(agent: &'a AtomicUsize, hub: &'a AtomicUsize) -> Self {
        agent.fetch_add(1, Ordering::Relaxed);
        hub.fetch_add(1, Ordering::Relaxed);
        Self { agent, hub }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.agent.fetch_sub(1, Ordering::Relaxed);
        self.hub.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) struct Fleet<S: Store> {
    store: Arc<S>,
    fleet: RwLock<Scope>,
    agents: RwLock<HashMap<String, Arc<AgentEntry>>>,
    /// Enrolments and desired changes, one at a time: each reads a scope, stores its new
    /// version and applies it, and two interleaved would lose one.
    changes: tokio::sync::Mutex<()>,
    /// Agents whose latest report is not in the store yet.
    reports: Mutex<Vec<Arc<AgentEntry>>>,
    /// Long polls held now, over all agents.
    held: AtomicUsize,
    /// The newest generation handed out.
    newest: AtomicU64,
    /// How long the hub asks agents to wait between reconciles when they do not long poll.
    poll_interval: Duration,
    /// The agent of each open job.
    job_index: RwLock<HashMap<String, Arc<AgentEntry>>>,
    /// Moves on every change to any job (its state, its output): what `job wait` and
    /// `job logs --follow` wait on.
    job_activity: watch::Sender<u64>,
    job_limits: JobLimits,
    /// Jobs done since retention last ran.
    jobs_done: AtomicUsize,
    releases: RwLock<Releases>,
    /// Other hubs share the store ([`replicas`]).
    replicated: bool,
    /// A replica that cannot reach the store refuses reconciles, so that its agents
    /// move to one that can, instead of being answered from what may be stale.
    store_lost: AtomicBool,
    /// The longest a poll is held: with replicas, an agent seen within it (and a
    /// margin) counts as connected, wherever its poll is held.
    max_wait: Duration,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl<S: Store> Fleet<S> {
    /// Loads the fleet from `store`.
    pub(crate) async fn load(
        store: Arc<S>,
        poll_interval: Duration,
        max_wait: Duration,
        job_limits: JobLimits,
    ) -> Result<Self, FleetError> {
        let Snapshot {
            agents,
            scopes,
            open_jobs,
            generation,
            releases,
            halts,
        } = store.load().await?;
        tracing::debug!(agents = agents.len(), generation, "loaded the fleet");
        let mut fleet = Scope::default();
        let mut own: HashMap<String, Scope> = HashMap::new();
        for s in scopes {
            let scope = Scope {
                generation: s.generation,
                settings: s.settings,
            };
            if s.scope.is_empty() {
                fleet = scope;
            } else {
                own.insert(s.scope, scope);
            }
        }
        let mut map = HashMap::with_capacity(agents.len());
        for a in agents {
            let own = own.remove(&a.id).unwrap_or_default();
            let generation = own.generation.max(fleet.generation);
            // A report that no longer parses is dropped: the agent sends a new one.
            let report = a.report.and_then(|r| serde_json::from_str(&r).ok());
            let state = AgentState {
                token_sha256: a.token_sha256,
                enrolled_at: a.enrolled_at,
                own,
                last_seen: a.last_seen,
                observed_generation: a.observed_generation,
                report,
                jobs: HashMap::new(),
                ahead_logged_at: None,
                caught_up_at: None,
            };
            let entry = AgentEntry::new(a.id.clone(), state, a.revoked_at.is_some(), generation);
            map.insert(a.id, entry);
        }
        let mut job_index = HashMap::with_capacity(open_jobs.len());
        for row in open_jobs {
            let Some(entry) = map.get(&row.agent) else {
                continue;
            };
            job_index.insert(row.id.clone(), entry.clone());
            let job = OpenJob::loaded(row);
            util::lock(&entry.state).jobs.insert(job.id.clone(), job);
        }
        Ok(Self {
            fleet: RwLock::new(fleet),
            agents: RwLock::new(map),
            changes: tokio::sync::Mutex::new(()),
            reports: Mutex::new(Vec::new()),
            held: AtomicUsize::new(0),
            newest: AtomicU64::new(generation),
            poll_interval,
            job_index: RwLock::new(job_index),
            job_activity: watch::Sender::new(0),
            job_limits,
            jobs_done: AtomicUsize::new(0),
            releases: RwLock::new(Releases::load(releases, halts)),
            replicated: store.replicated(),
            store_lost: AtomicBool::new(false),
            max_wait,
            store,
        })
    }

    fn entry(&self, id: &str) -> Result<Arc<AgentEntry>, FleetError> {
        util::read(&self.agents)
            .get(id)
            .cloned()
            .ok_or_else(|| FleetError::NoSuchAgent(id.chars().take(MAX_ID_LEN).collect()))
    }

    fn fleet_scope(&self) -> Scope {
        util::read(&self.fleet).clone()
    }

    /// The agent behind `id` if `token` is its token and it is not revoked. An unknown id
    /// and a wrong token read the same to the caller.
    pub(crate) fn authorize(&self, id: &str, token: &str) -> Result<Arc<AgentEntry>, FleetError> {
        let bad = || FleetError::BadToken(id.chars().take(MAX_ID_LEN).collect());
        let entry = self.entry(id).map_err(|_| bad())?;
        let ok = token::matches(token, &util::lock(&entry.state).token_sha256);
        if !ok {
            return Err(bad());
        }
        if entry.is_revoked() {
            return Err(FleetError::Revoked(id.to_owned()));
        }
        Ok(entry)
    }

    /// A reconcile: records `report`, then answers with the agent's desired state, at
    /// once when the agent is behind it, else when it changes or `wait` has passed.
    pub(crate) async fn reconcile(
        &self,
        entry: &Arc<AgentEntry>,
        mut report: AgentReport,
        wait: Duration,
    ) -> Result<DesiredState, FleetError> {
        if self.store_lost.load(Ordering::Acquire) {
            return Err(FleetError::StoreLost);
        }
        let observed = report.observed_generation;
        let token = util::lock(&entry.state).token_sha256.clone();
        let mut rx = entry.generation.subscribe();
        // A fleet change takes its generation before each agent's channel is told: what
        // this agent may have been answered already counts too.
        let mut current = (*rx.borrow_and_update()).max(self.effective(entry).0);
        if observed > current && self.replicated {
            // An agent that moved here from another replica may be ahead of what this
            // one has followed so far: catch up before taking it for a restore (once a
            // second per agent: a hostile report must not make every reconcile a load;
            // in between it is asked to come back, never reset to a lagging copy).
            if !entry.may_catch_up() {
                return Err(FleetError::CatchingUp(entry.id.clone()));
            }
            self.catch_up(&entry.id).await?;
            current = (*rx.borrow_and_update()).max(self.effective(entry).0);
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
        if !jobs.is_empty() {
            self.job_reports(entry, jobs).await?;
        }
        // Once per rollback, when the agent first reports it: an agent keeps reporting
        // its rollback, and a halt an operator resumed must stay resumed.
        let rolled_back_of = |r: &AgentReport| {
            r.upgrade
                .as_ref()
                .filter(|u| u.state == ROLLED_BACK)
                .and_then(|u| u.target.clone())
        };
        let rolled_back = rolled_back_of(&report).filter(|v| {
            util::lock(&entry.state)
                .report
                .as_ref()
                .and_then(rolled_back_of)
                .as_ref()
                != Some(v)
        });
        // Only a version this agent was sent: a token cannot halt any string it likes.
        let rolled_back = rolled_back.filter(|v| {
            desired::is_version(v) && self.effective(entry).1.version.as_deref() == Some(v.as_str())
        });
        let rolled_back = rolled_back.map(|v| {
            let reason = report
                .upgrade
                .as_ref()
                .and_then(|u| u.error.clone())
                .unwrap_or_default();
            (v, reason)
        });
        // The halt first: whoever sees the rollback in the agent's report sees the halt.
        if let Some((version, reason)) = rolled_back {
            self.halt_on_rollback(entry, &version, reason).await?;
        }
        self.queue_report(entry, report);
        if !wait.is_zero() && *rx.borrow() <= observed {
            let _held = Held::new(&entry.polls, &self.held);
            // Either way the answer is computed below from what holds now.
            let _ = tokio::time::timeout(
                wait,
                rx.wait_for(|g| {
                    *g > observed || entry.is_revoked() || self.store_lost.load(Ordering::Acquire)
                }),
            )
            .await;
        }
        if self.store_lost.load(Ordering::Acquire) {
            return Err(FleetError::StoreLost);
        }
        // Revoked, or enrolled again with another token (through another replica),
        // while the poll was held.
        if entry.is_revoked() || util::lock(&entry.state).token_sha256 != token {
            return Err(FleetError::Revoked(entry.id.clone()));
        }
        Ok(self.desired_for(entry, true))
    }

    /// Once a minute per agent at most: a hostile agent may send such reports as fast as
    /// it can, and each one would be a line.
    fn log_ahead(&self, entry: &AgentEntry, observed: u64, current: u64) {
        let now = now_secs();
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
    async fn resync_locked(&self, entry: &AgentEntry) -> Result<(), FleetError> {
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
    fn queue_report(&self, entry: &Arc<AgentEntry>, mut report: AgentReport) {
        bound_report(&mut report);
        {
            let mut st = util::lock(&entry.state);
            st.last_seen = Some(now_secs());
            st.observed_generation = report.observed_generation;
            st.report = Some(report);
        }
        if !entry.dirty.swap(true, Ordering::AcqRel) {
            util::lock(&self.reports).push(entry.clone());
        }
    }

    /// Writes the queued reports; called by the flusher and once at shutdown.
    pub(crate) async fn flush_reports(&self) -> Result<usize, FleetError> {
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

    /// The effective settings of an agent: the fleet's, overridden field by field by its
    /// own, with the generation of the later of the two.
    fn effective(&self, entry: &AgentEntry) -> (u64, DesiredSettings) {
        let fleet = self.fleet_scope();
        let st = util::lock(&entry.state);
        (
            fleet.generation.max(st.own.generation),
            fleet.settings.overlaid(&st.own.settings),
        )
    }

    /// What `entry` is sent; `offer`: it is being sent (not shown to an admin), so the
    /// jobs it starts have been offered.
    fn desired_for(&self, entry: &AgentEntry, offer: bool) -> DesiredState {
        let (generation, s) = self.effective(entry);
        let (jobs, cancel_jobs, agent) = {
            let mut st = util::lock(&entry.state);
            let (jobs, cancel) = jobs::desired(&mut st.jobs, offer);
            let agent = s.version.map(|version| {
                util::read(&self.releases).desired_agent(
                    &entry.id,
                    version,
                    s.rollback.unwrap_or(false),
                    st.report.as_ref(),
                )
            });
            (jobs, cancel, agent.flatten())
        };
        DesiredState {
            generation,
            poll_interval_secs: Some(self.poll_interval.as_secs()),
            agent,
            runner: DesiredRunner {
                enabled: s.runner_enabled.unwrap_or(true),
                max_jobs: s.max_jobs,
                max_jobs_per_owner: s.max_jobs_per_owner,
                max_queued: None,
                max_output_bytes: None,
            },
            jobs,
            cancel_jobs,
        }
    }

    /// Tells `entry`'s held polls its effective generation, if it moved.
    fn announce(&self, entry: &AgentEntry) {
        let (generation, _) = self.effective(entry);
        entry.generation.send_if_modified(|g| {
            let moved = *g != generation;
            *g = generation;
            moved
        });
    }

    /// Enrols `id` and returns its token (the hub keeps only its hash).
    pub(crate) async fn enrol(&self, id: &str) -> Result<String, FleetError> {
        check_id(id)?;
        let _one = self.changes.lock().await;
        let token = token::new_agent_token().map_err(|e| FleetError::BadSetting {
            field: "token".into(),
            why: e.to_string(),
        })?;
        let hash = token::sha256_hex(&token);
        let now = now_secs();
        let Some(generation) = self.store.enrol(id, &hash, now).await? else {
            return Err(FleetError::Exists(id.to_owned()));
        };
        self.newest.fetch_max(generation, Ordering::AcqRel);
        let existing = util::read(&self.agents).get(id).cloned();
        match existing {
            Some(entry) => {
                {
                    let mut st = util::lock(&entry.state);
                    st.token_sha256 = hash;
                    st.enrolled_at = now;
                    st.own.generation = generation;
                    st.observed_generation = 0;
                }
                entry.revoked.store(false, Ordering::Release);
                self.announce(&entry);
            }
            None => {
                let own = Scope {
                    generation,
                    settings: DesiredSettings::default(),
                };
                let fleet_gen = self.fleet_scope().generation;
                let state = AgentState {
                    token_sha256: hash,
                    enrolled_at: now,
                    own,
                    last_seen: None,
                    observed_generation: 0,
                    report: None,
                    jobs: HashMap::new(),
                    ahead_logged_at: None,
                    caught_up_at: None,
                };
                let entry = AgentEntry::new(id.to_owned(), state, false, generation.max(fleet_gen));
                util::write(&self.agents).insert(id.to_owned(), entry);
            }
        }
        tracing::info!(agent = %id, "agent enrolled");
        Ok(token)
    }

    /// Revokes `id`: its token is refused from now on, and a poll it holds is answered
    /// with 401 at once.
    pub(crate) async fn revoke(&self, id: &str) -> Result<AgentView, FleetError> {
        let entry = self.entry(id)?;
        let _one = self.changes.lock().await;
        if let Some(generation) = self.store.revoke(id, now_secs()).await? {
            self.newest.fetch_max(generation, Ordering::AcqRel);
            let mut st = util::lock(&entry.state);
            st.own.generation = st.own.generation.max(generation);
        }
        entry.revoked.store(true, Ordering::Release);
        // Wakes its held polls, which see the flag, before anything else can fail.
        entry.generation.send_modify(|_| {});
        self.end_jobs_of_revoked(&entry).await?;
        tracing::info!(agent = %id, "agent revoked");
        Ok(self.view(&entry))
    }

    /// Applies `change` to the fleet (`agent` = `None`) or to one agent's own settings.
    pub(crate) async fn change(
        &self,
        agent: Option<&str>,
        change: &DesiredChange,
    ) -> Result<DesiredView, FleetError> {
        let entry = agent.map(|id| self.entry(id)).transpose()?;
        let _one = self.changes.lock().await;
        let mut current = match &entry {
            None => self.fleet_scope().settings,
            Some(e) => util::lock(&e.state).own.settings.clone(),
        };
        let scope = entry.as_ref().map_or("", |e| e.id.as_str());
        // Compared and set in the store: a replica whose copy is behind another's change
        // computes this change again from the stored settings, and loses neither.
        let (generation, next) = loop {
            let next = changed(&current, change)?;
            if next == current {
                // Nothing to converge to: no new generation, no wake-up of a single poll.
                drop(_one);
                return self.desired_view(agent);
            }
            match self.store.set_scope(scope, &next, Some(&current)).await? {
                Ok(generation) => break (generation, next),
                Err(stored) => current = stored,
            }
        };
        self.newest.fetch_max(generation, Ordering::AcqRel);
        match &entry {
            None => {
                let mut fleet = util::write(&self.fleet);
                if generation >= fleet.generation {
                    *fleet = Scope {
                        generation,
                        settings: next,
                    };
                }
                drop(fleet);
                let all = self.all();
                for e in &all {
                    self.announce(e);
                }
                tracing::info!(
                    generation,
                    agents = all.len(),
                    "fleet desired state changed"
                );
            }
            Some(e) => {
                {
                    let mut st = util::lock(&e.state);
                    if generation >= st.own.generation {
                        st.own = Scope {
                            generation,
                            settings: next,
                        };
                    }
                }
                self.announce(e);
                tracing::info!(agent = %e.id, generation, "agent desired state changed");
            }
        }
        self.desired_view(agent)
    }

    /// One scope's own settings (and, for an agent, what it is sent).
    pub(crate) fn desired_view(&self, agent: Option<&str>) -> Result<DesiredView, FleetError> {
        match agent {
            None => {
                let fleet = self.fleet_scope();
                Ok(DesiredView {
                    scope: "fleet".into(),
                    generation: fleet.generation,
                    settings: fleet.settings,
                    effective: None,
                })
            }
            Some(id) => {
                let entry = self.entry(id)?;
                let own = util::lock(&entry.state).own.clone();
                Ok(DesiredView {
                    scope: id.to_owned(),
                    generation: own.generation,
                    settings: own.settings,
                    effective: Some(self.desired_for(&entry, false)),
                })
            }
        }
    }

    pub(crate) fn view_of(&self, id: &str) -> Result<AgentView, FleetError> {
        let entry = self.entry(id)?;
        Ok(self.view(&entry))
    }

    fn view(&self, entry: &AgentEntry) -> AgentView {
        let desired_generation = *entry.generation.borrow();
        let st = util::lock(&entry.state);
        AgentView {
            id: entry.id.clone(),
            enrolled_at: st.enrolled_at,
            revoked: entry.is_revoked(),
            last_seen: st.last_seen,
            connected: self.connected(entry, st.last_seen),
            desired_generation,
            // Marked to be reset by a renumbering: it has applied nothing of this hub's yet.
            observed_generation: if st.observed_generation == MUST_RESET {
                0
            } else {
                st.observed_generation
            },
            report: st.report.clone(),
        }
    }

    /// Whether `entry` holds a poll here, or reconciled a moment ago: an answered poll
    /// (a change, a job for it) is followed by the agent's next at once, and `connected`
    /// must not flicker in between. With replicas, recently enough to hold one at another
    /// hub.
    fn connected(&self, entry: &AgentEntry, last_seen: Option<u64>) -> bool {
        if entry.polls.load(Ordering::Relaxed) > 0 {
            return true;
        }
        let recent = if self.replicated {
            self.max_wait.as_secs() + replicas::SEEN_MARGIN.as_secs()
        } else {
            replicas::SEEN_MARGIN.as_secs()
        };
        last_seen.is_some_and(|t| t + recent >= now_secs())
    }

    fn all(&self) -> Vec<Arc<AgentEntry>> {
        util::read(&self.agents).values().cloned().collect()
    }

    /// Every agent, by id.
    pub(crate) fn list(&self) -> Vec<AgentView> {
        let mut all = self.all();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all.iter().map(|e| self.view(e)).collect()
    }

    /// Publishes an artifact whose bytes the caller has stored and whose signature it
    /// has verified.
    pub(crate) async fn publish_release(&self, row: ReleaseRow) -> Result<(), FleetError> {
        let _one = self.changes.lock().await;
        let generation = self.store.put_release(&row).await?;
        tracing::info!(version = %row.version, os = %row.os, arch = %row.arch, sha256 = %row.sha256, size = row.size, key_id = %row.key_id, "release published");
        util::write(&self.releases).put(row);
        self.fleet_moved(generation);
        Ok(())
    }

    /// Keeps a published binary where other replicas fetch it (nothing for a single hub,
    /// whose data dir has it).
    pub(crate) async fn share_release_bytes(
        &self,
        sha256: &str,
        path: &std::path::Path,
    ) -> Result<(), FleetError> {
        if !self.replicated {
            return Ok(());
        }
        let data = tokio::fs::read(path)
            .await
            .map_err(|source| FleetError::BadSetting {
                field: "binary".into(),
                why: format!("could not read {}: {source}", path.display()),
            })?;
        Ok(self.store.put_blob(sha256, data).await?)
    }

    /// A published binary another replica took, from the store.
    pub(crate) async fn shared_release_bytes(
        &self,
        sha256: &str,
    ) -> Result<Option<Vec<u8>>, FleetError> {
        Ok(self.store.get_blob(sha256).await?)
    }

    /// The artifact of `version` for a platform, if published.
    pub(crate) fn release(&self, version: &str, os: &str, arch: &str) -> Option<ReleaseRow> {
        util::read(&self.releases).get(version, os, arch).cloned()
    }

    /// Every published version, with how many agents run it and whether it is halted.
    pub(crate) fn releases(&self) -> Vec<ReleaseView> {
        let all = self.all();
        let reports: Vec<AgentReport> = all
            .iter()
            .filter(|e| !e.is_revoked())
            .filter_map(|e| util::lock(&e.state).report.clone())
            .collect();
        util::read(&self.releases).views(reports.iter())
    }

    /// Lifts the halt of `version`: agents are offered it again.
    pub(crate) async fn resume_release(&self, version: &str) -> Result<(), FleetError> {
        let _one = self.changes.lock().await;
        {
            let r = util::read(&self.releases);
            if !r.is_halted(version) {
                return Err(if r.has_version(version) {
                    FleetError::NotHalted(version.to_owned())
                } else {
                    FleetError::NoSuchRelease(version.to_owned())
                });
            }
        }
        let generation = self.store.set_halt(version, None).await?;
        util::write(&self.releases).resume(version);
        tracing::info!(%version, "release resumed: offered to agents again");
        self.fleet_moved(generation);
        Ok(())
    }

    /// An agent rolled `version` back: no agent that has not started it is offered it
    /// any more (docs/design.md, invariant 13, the fleet halt).
    async fn halt_on_rollback(
        &self,
        entry: &AgentEntry,
        version: &str,
        reason: String,
    ) -> Result<(), FleetError> {
        if util::read(&self.releases).is_halted(version) {
            return Ok(());
        }
        let _one = self.changes.lock().await;
        if util::read(&self.releases).is_halted(version) {
            return Ok(());
        }
        if self.rollback_stored(&entry.id, version).await? {
            // Reported to another replica before (and resumed since): not a new one.
            return Ok(());
        }
        let mut reason = reason;
        cut(&mut reason, MAX_ERROR_FIELD);
        let row = HaltRow {
            version: version.to_owned(),
            agent: entry.id.clone(),
            reason,
            halted_at: now_secs(),
        };
        let generation = self.store.set_halt(version, Some(&row)).await?;
        tracing::warn!(%version, agent = %entry.id, reason = %row.reason, "an agent rolled this version back: halted for the fleet until `hub release resume`");
        util::write(&self.releases).halt(row);
        self.fleet_moved(generation);
        Ok(())
    }

    /// The fleet's scope took `generation` (its settings unchanged): every agent's desired
    /// state may differ, so every held poll is told.
    fn fleet_moved(&self, generation: u64) {
        self.newest.fetch_max(generation, Ordering::AcqRel);
        util::write(&self.fleet).generation = generation;
        for e in &self.all() {
            self.announce(e);
        }
    }

    /// (enrolled agents, polls held now).
    pub(crate) fn counts(&self) -> (usize, usize) {
        let n = util::read(&self.agents).len();
        (n, self.held.load(Ordering::Relaxed))
    }
}

/// What the hub keeps of a report's free text: enough for any real value, so that an
/// agent's token cannot make the hub hold (or `agent list` return) megabytes per agent.
const MAX_FIELD: usize = 256;
const MAX_ERROR_FIELD: usize = 1024;
const MAX_BAD_VERSIONS: usize = 16;

fn cut(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
}

/// Cuts a report's strings to what the hub keeps.
fn bound_report(r: &mut AgentReport) {
    for f in [
        &mut r.version,
        &mut r.os,
        &mut r.arch,
        &mut r.hostname,
        &mut r.runner.state,
    ] {
        cut(f, MAX_FIELD);
    }
    if let Some(e) = &mut r.runner.last_error {
        cut(e, MAX_ERROR_FIELD);
    }
    if let Some(u) = &mut r.upgrade {
        cut(&mut u.state, MAX_FIELD);
        if let Some(t) = &mut u.target {
            cut(t, MAX_FIELD);
        }
        if let Some(e) = &mut u.error {
            cut(e, MAX_ERROR_FIELD);
        }
        u.bad_versions.truncate(MAX_BAD_VERSIONS);
        for v in &mut u.bad_versions {
            cut(v, MAX_FIELD);
        }
    }
}

/// `current` with `change` applied, validated.
fn changed(
    current: &DesiredSettings,
    change: &DesiredChange,
) -> Result<DesiredSettings, FleetError> {
    let mut next = current.overlaid(&change.set);
    for field in &change.clear {
        match field.as_str() {
            "runner_enabled" => next.runner_enabled = None,
            "max_jobs" => next.max_jobs = None,
            "max_jobs_per_owner" => next.max_jobs_per_owner = None,
            "version" => next.version = None,
            "rollback" => next.rollback = None,
            other => return Err(FleetError::BadSetting {
                field: format!("clear[{other:?}]"),
                why:
                    "not a desired setting (runner_enabled, max_jobs, max_jobs_per_owner, version, rollback)"
                        .into(),
            }),
        }
    }
    for (field, v) in [
        ("max_jobs", change.set.max_jobs),
        ("max_jobs_per_owner", change.set.max_jobs_per_owner),
    ] {
        if let Some(n) = v {
            if n == 0 || n > MAX_LIMIT {
                return Err(FleetError::BadSetting {
                    field: field.into(),
                    why: format!("{n} is out of range (1 to {MAX_LIMIT})"),
                });
            }
        }
    }
    if let Some(v) = &change.set.version {
        if !desired::is_version(v) {
            return Err(FleetError::BadSetting {
                field: "version".into(),
                why: format!("{v:?} is not a version (such as 1.4.0)"),
            });
        }
    }
    Ok(next)
}

fn check_id(id: &str) -> Result<(), FleetError> {
    let why = if id.is_empty() {
        "empty"
    } else if id.len() > MAX_ID_LEN {
        "longer than 128 bytes"
    } else if id.starts_with(['.', '-']) {
        "starts with '.' or '-'"
    } else if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        "only letters, digits, '.', '_' and '-' are allowed"
    } else {
        return Ok(());
    };
    Err(FleetError::BadId {
        id: id.chars().take(MAX_ID_LEN).collect(),
        why,
    })
}

/// Writes queued reports once a second; a handle that flushes a last time at shutdown.
pub(crate) struct ReportFlusher(tokio::task::JoinHandle<()>);

impl ReportFlusher {
    pub(crate) fn spawn<S: Store>(fleet: Arc<Fleet<S>>) -> Self {
        Self(tokio::spawn(async move {
            let mut tick = tokio::time::interval(FLUSH_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                tick.tick().await;
                fleet.retain_jobs().await;
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

    pub(crate) fn stop(self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_ids_are_checked() {
        for ok in ["web-1", "i-0abc.eu-west-1", "a_b", "X"] {
            assert!(check_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".hidden", "-x", "a/b", "a b", "é", &"a".repeat(129)] {
            assert!(check_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_change_sets_clears_and_validates() {
        let current = DesiredSettings {
            max_jobs: Some(4),
            version: Some("1.0.0".into()),
            ..DesiredSettings::default()
        };
        let next = changed(
            &current,
            &DesiredChange {
                set: DesiredSettings {
                    runner_enabled: Some(false),
                    ..DesiredSettings::default()
                },
                clear: vec!["version".into()],
            },
        )
        .expect("valid");
        assert_eq!(next.runner_enabled, Some(false));
        assert_eq!(next.max_jobs, Some(4));
        assert_eq!(next.version, None);

        let zero = DesiredChange {
            set: DesiredSettings {
                max_jobs: Some(0),
                ..DesiredSettings::default()
            },
            clear: vec![],
        };
        let e = changed(&current, &zero).expect_err("0 jobs");
        assert!(e.to_string().starts_with("max_jobs:"), "{e}");
        let unknown = DesiredChange {
            clear: vec!["colour".into()],
            ..DesiredChange::default()
        };
        assert!(changed(&current, &unknown).is_err());
    }
}
