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
//! travel with its desired state; every change to them is in the store before it is
//! acted on, and a change of what the agent is sent moves its jobs' own version
//! ([`jobs::version`]), never its generation: a held poll waits on both.
//!
//! Tasks: [`ReportFlusher`] writes the reports queued by reconciles to the store in one
//! transaction a second (an agent sends its report again at each reconcile, so a batch
//! lost to a crash costs a `last_seen` a second old, never a decision); [`Housekeeper`]
//! deletes done jobs past the bound and ends the jobs of agents gone past the patience.

mod drain;
mod error;
mod gauges;
mod groups;
mod housekeeping;
mod jobs;
mod label_index;
mod labels;
mod patience;
mod reconcile;
mod registry;
mod releases;
mod replicas;
mod retry;
mod rollout;
mod tokens;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use super::store::{
    Enrol, HaltRow, Labels, ReleaseRow, ReportRow, ScopeRow, Snapshot, Store, MUST_RESET,
};
use super::token;
use crate::proto::desired::{self, DesiredRunner, DesiredState};
use crate::proto::hub::{AgentView, DesiredChange, DesiredSettings, DesiredView, ReleaseView};
use crate::proto::labels::InForce;
use crate::proto::report::AgentReport;
use crate::util;

pub use self::error::FleetError;
pub use self::housekeeping::Housekeeper;
use self::jobs::board::JobBoard;
pub use self::jobs::queue::Dispatcher;
use self::jobs::version::JobsVersion;
use self::jobs::OpenJob;
pub use self::jobs::{JobLimits, OutputSlice, Upload};
use self::labels::stored_labels;
use self::reconcile::changed;
pub use self::reconcile::{Poll, ReportFlusher};
use self::registry::Registry;
use self::releases::Releases;
pub use self::releases::ROLLED_BACK;
pub use self::replicas::ReplicaSync;
pub use self::rollout::Roller;

/// How often queued reports are written.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Agent ids: what a host name, a FQDN or a cloud instance id needs, nothing that could
/// be read as a path or need quoting.
const MAX_ID_LEN: usize = 128;
/// How often, at most, the hub logs that one agent reports a generation ahead of it.
const AHEAD_LOG_EVERY: Duration = Duration::from_secs(60);

/// One desired-settings scope and the generation of its last change.
#[derive(Debug, Clone, Default)]
struct Scope {
    generation: u64,
    settings: DesiredSettings,
}

impl From<ScopeRow> for Scope {
    fn from(row: ScopeRow) -> Self {
        Self {
            generation: row.generation,
            settings: row.settings,
        }
    }
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
    /// The labels the hub set on it, over the ones its report carries.
    hub_labels: Labels,
    /// Its jobs that are not done, by id.
    jobs: HashMap<String, OpenJob>,
    /// When the fleet's queue last gave it a job (0: never), for the least-loaded choice.
    last_assigned_ms: u64,
    /// When a report ahead of the hub was last logged.
    ahead_logged_at: Option<u64>,
    /// When a report ahead of this replica last made it load the agent from the store.
    caught_up_at: Option<std::time::Instant>,
    /// The token it is being sent, which works beside its own until it is used.
    next_token_sha256: Option<String>,
    /// A new token goes with its next answer.
    rotate_asked: bool,
    /// When its token was made (Unix ms).
    token_issued_ms: u64,
}

impl AgentState {
    /// An agent enrolled at `enrolled_at` that has not reported yet.
    fn new(token_sha256: String, enrolled_at: u64, own: Scope) -> Self {
        Self {
            token_sha256,
            enrolled_at,
            own,
            last_seen: None,
            observed_generation: 0,
            report: None,
            hub_labels: Labels::new(),
            jobs: HashMap::new(),
            last_assigned_ms: 0,
            ahead_logged_at: None,
            caught_up_at: None,
            next_token_sha256: None,
            rotate_asked: false,
            token_issued_ms: enrolled_at.saturating_mul(1000),
        }
    }

    /// The labels in force: the reported ones (the host's and the automatic), the hub's
    /// over them.
    fn labels(&self) -> Labels {
        self.in_force().to_labels()
    }

    /// [`AgentState::labels`], read where they are.
    fn in_force(&self) -> InForce<'_> {
        static NONE: Labels = Labels::new();
        InForce {
            host: self.report.as_ref().map_or(&NONE, |r| &r.labels),
            hub: &self.hub_labels,
        }
    }
}

pub struct AgentEntry {
    id: String,
    state: Mutex<AgentState>,
    revoked: AtomicBool,
    /// The generation of its effective desired state; held polls wait on it.
    generation: watch::Sender<u64>,
    /// The version of what it is sent of its jobs; held polls wait on it too.
    jobs_version: JobsVersion,
    /// The jobs' version this hub last answered it with, while it echoes none (an agent
    /// older than the field); until then, the one loaded.
    echoless: AtomicU64,
    /// Polls held open now.
    polls: AtomicUsize,
    /// Its latest report waits for the next batch.
    dirty: AtomicBool,
}

impl AgentEntry {
    fn new(
        id: String,
        state: AgentState,
        revoked: bool,
        generation: u64,
        jobs_version: u64,
    ) -> Arc<Self> {
        Arc::new(Self {
            id,
            state: Mutex::new(state),
            revoked: AtomicBool::new(revoked),
            generation: watch::Sender::new(generation),
            jobs_version: JobsVersion::new(jobs_version),
            echoless: AtomicU64::new(jobs_version),
            polls: AtomicUsize::new(0),
            dirty: AtomicBool::new(false),
        })
    }

    fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// What it is sent of its jobs changed, as stored with `version`: its held polls
    /// answer.
    fn jobs_moved(&self, version: u64) {
        self.jobs_version.advance(version, &self.polls);
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

/// The hub's agents, their jobs and the fleet's desired state, in memory.
///
/// Its std locks are never held across an `.await`, and nest in one order only (an inner
/// lock may be taken with an outer one held, never the reverse), reads as writes: a
/// waiting writer queues new readers behind it, so two readers taking two locks in
/// opposite orders deadlock as soon as a writer waits between them. The order:
/// `changes` (async) → `agents` (its label index, then its map) → an agent's `state` →
/// `releases` → `fleet` → `jobs` (its index, then its queue) → `reports` → the
/// metrics' own.
pub struct Fleet<S: Store> {
    store: Arc<S>,
    fleet: RwLock<Scope>,
    /// The agents, by id and by their labels in force.
    agents: Registry,
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
    /// The open jobs: which agent holds each, the queue, and what wakes their waiters.
    jobs: JobBoard,
    /// Wakes the [`Roller`]: an agent's version or upgrade moved.
    rollout_kick: tokio::sync::Notify,
    /// Moves when another replica changed the admin or enrolment tokens.
    tokens_moved: watch::Sender<u64>,
    releases: RwLock<Releases>,
    /// Other hubs share the store ([`replicas`]).
    replicated: bool,
    /// A replica that cannot reach the store refuses reconciles, so that its agents
    /// move to one that can, instead of being answered from what may be stale.
    store_lost: AtomicBool,
    /// The longest a poll is held: with replicas, an agent seen within it (and a
    /// margin) counts as connected, wherever its poll is held.
    max_wait: Duration,
    /// Agents whose token is older are sent a new one at their next reconcile.
    token_max_age: Option<Duration>,
}

impl<S: Store> Fleet<S> {
    /// Loads the fleet from `store`.
    pub async fn load(
        store: Arc<S>,
        poll_interval: Duration,
        max_wait: Duration,
        job_limits: JobLimits,
    ) -> Result<Self, FleetError> {
        let mut snap = store.load().await?;
        let (fleet, mut own) = snap.take_scopes();
        let fleet = fleet.map(Scope::from).unwrap_or_default();
        let Snapshot {
            agents,
            open_jobs,
            generation,
            releases,
            halts,
            ..
        } = snap;
        tracing::debug!(agents = agents.len(), generation, "loaded the fleet");
        let mut map = HashMap::with_capacity(agents.len());
        for a in agents {
            let own = own.remove(&a.id).map(Scope::from).unwrap_or_default();
            let generation = own.generation.max(fleet.generation);
            // A report that no longer parses is dropped: the agent sends a new one.
            let hub_labels = stored_labels(&a);
            let report = a.report.and_then(|r| serde_json::from_str(&r).ok());
            let state = AgentState {
                last_seen: a.last_seen,
                observed_generation: a.observed_generation,
                report,
                hub_labels,
                next_token_sha256: a.next_token_sha256,
                rotate_asked: a.rotate_asked,
                token_issued_ms: a
                    .token_issued_ms
                    .unwrap_or(a.enrolled_at.saturating_mul(1000)),
                ..AgentState::new(a.token_sha256, a.enrolled_at, own)
            };
            let revoked = a.revoked_at.is_some();
            let entry = AgentEntry::new(a.id.clone(), state, revoked, generation, a.jobs_version);
            map.insert(a.id, entry);
        }
        let mut job_index = HashMap::with_capacity(open_jobs.len());
        let mut queued = Vec::new();
        for row in open_jobs {
            if row.agent.is_empty() {
                queued.push(row);
                continue;
            }
            let Some(entry) = map.get(&row.agent) else {
                continue;
            };
            job_index.insert(row.id.clone(), entry.clone());
            let job = OpenJob::loaded(row);
            util::lock(&entry.state).jobs.insert(job.id.clone(), job);
        }
        let loaded = Self {
            fleet: RwLock::new(fleet),
            agents: Registry::new(map),
            changes: tokio::sync::Mutex::new(()),
            reports: Mutex::new(Vec::new()),
            held: AtomicUsize::new(0),
            newest: AtomicU64::new(generation),
            poll_interval,
            jobs: JobBoard::new(job_index, job_limits),
            rollout_kick: tokio::sync::Notify::new(),
            tokens_moved: watch::Sender::new(0),
            releases: RwLock::new(Releases::load(releases, halts)),
            replicated: store.replicated(),
            store_lost: AtomicBool::new(false),
            max_wait,
            token_max_age: None,
            store,
        };
        for row in queued {
            loaded.enqueue(row);
        }
        Ok(loaded)
    }

    /// Agents whose token is older than `age` are sent a new one.
    pub fn with_token_max_age(mut self, age: Option<Duration>) -> Self {
        self.token_max_age = age;
        self
    }

    fn entry(&self, id: &str) -> Result<Arc<AgentEntry>, FleetError> {
        self.agents
            .get(id)
            .ok_or_else(|| FleetError::NoSuchAgent(id.chars().take(MAX_ID_LEN).collect()))
    }

    fn fleet_scope(&self) -> Scope {
        util::read(&self.fleet).clone()
    }

    /// The agent behind `id` if `token` is its token and it is not revoked. An unknown id
    /// and a wrong token read the same to the caller.
    pub fn authorize(&self, id: &str, token: &str) -> Result<Arc<AgentEntry>, FleetError> {
        self.authorize_sha256(id, &token::sha256_hex(token))
    }

    /// [`Fleet::authorize`] with the token's SHA-256 (hex) already taken: a reconcile
    /// keeps it, and hashes each token once.
    pub fn authorize_sha256(&self, id: &str, sha: &str) -> Result<Arc<AgentEntry>, FleetError> {
        let bad = || FleetError::BadToken(id.chars().take(MAX_ID_LEN).collect());
        let entry = self.entry(id).map_err(|_| bad())?;
        let ok = {
            let st = util::lock(&entry.state);
            // The token it is being sent works beside its own until it is used.
            sha == st.token_sha256 || st.next_token_sha256.as_deref() == Some(sha)
        };
        if !ok {
            return Err(bad());
        }
        if entry.is_revoked() {
            return Err(FleetError::Revoked(id.to_owned()));
        }
        Ok(entry)
    }

    /// The generation of an agent's effective settings, without them: what every
    /// reconcile and every announcement compares.
    fn effective_generation(&self, entry: &AgentEntry) -> u64 {
        let fleet = util::read(&self.fleet).generation;
        fleet.max(util::lock(&entry.state).own.generation)
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
        // Before the jobs it names (see `JobsVersion::current`).
        let jobs_version = offer.then(|| entry.jobs_version.current());
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
                drain_first: s.runner_enabled == Some(false) && s.force_stop != Some(true),
                max_jobs: s.max_jobs,
                max_jobs_per_owner: s.max_jobs_per_owner,
                max_queued: None,
                max_output_bytes: None,
                network: s.network,
            },
            jobs,
            cancel_jobs,
            jobs_version,
            accept_jobs: s.accept_jobs.unwrap_or(true),
            drain_deadline_ms: s.drain_deadline_ms.filter(|_| s.accept_jobs == Some(false)),
            new_token: None,
        }
    }

    /// Tells `entry`'s held polls its effective generation, if it moved.
    fn announce(&self, entry: &AgentEntry) {
        let generation = self.effective_generation(entry);
        let moved = entry.generation.send_if_modified(|g| {
            let moved = *g != generation;
            *g = generation;
            moved
        });
        if moved && entry.polls.load(Ordering::Relaxed) > 0 {
            crate::metrics::WAKEUPS.inc();
        }
    }

    /// Enrols `id` and returns its token (the hub keeps only its hash).
    /// Enrols agent `id` (a revoked id only with `reuse_revoked`, as a new agent); its
    /// token.
    pub async fn enrol(&self, id: &str, reuse_revoked: bool) -> Result<String, FleetError> {
        check_id(id)?;
        let _one = self.changes.lock().await;
        let token = token::new_agent_token().map_err(|e| FleetError::BadSetting {
            field: "token".into(),
            why: e.to_string(),
        })?;
        let hash = token::sha256_hex(&token);
        let now = crate::util::unix_now();
        let generation = match self.store.enrol(id, &hash, now, reuse_revoked).await? {
            Enrol::Done(generation) => generation,
            Enrol::Exists => return Err(FleetError::Exists(id.to_owned())),
            Enrol::Revoked => {
                return Err(FleetError::IdRetired {
                    id: id.to_owned(),
                    at: String::new(),
                })
            }
        };
        self.enrolled(id, hash, now, generation, Labels::new());
        tracing::info!(agent = %id, "agent enrolled");
        self.kick();
        Ok(token)
    }

    /// Takes in an enrolment the store has made: `id` with the token `hash`, its scope at
    /// `generation`, and the hub's labels it starts with.
    fn enrolled(&self, id: &str, hash: String, now: u64, generation: u64, hub_labels: Labels) {
        self.newest.fetch_max(generation, Ordering::AcqRel);
        match self.agents.get(id) {
            Some(entry) => {
                {
                    let mut st = util::lock(&entry.state);
                    st.token_sha256 = hash;
                    st.enrolled_at = now;
                    st.own.generation = generation;
                    st.observed_generation = 0;
                    // A new agent under the id: what the hub said of the old one goes.
                    st.hub_labels = hub_labels;
                    st.own = Scope {
                        generation,
                        settings: DesiredSettings::default(),
                    };
                    st.next_token_sha256 = None;
                    st.rotate_asked = false;
                    st.token_issued_ms = now.saturating_mul(1000);
                }
                self.agents.reindex(&entry);
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
                    hub_labels,
                    ..AgentState::new(hash, now, own)
                };
                let generation = generation.max(fleet_gen);
                let entry = AgentEntry::new(id.to_owned(), state, false, generation, 0);
                self.agents.insert(entry);
            }
        }
    }

    /// Revokes `id`: its token is refused from now on, and a poll it holds is answered
    /// with 401 at once.
    pub async fn revoke(&self, id: &str) -> Result<AgentView, FleetError> {
        let entry = self.entry(id)?;
        let _one = self.changes.lock().await;
        if let Some(generation) = self.store.revoke(id, crate::util::unix_now()).await? {
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
    pub async fn change(
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
                let all = self.agents.all();
                for e in &all {
                    self.announce(e);
                }
                tracing::info!(
                    generation,
                    agents = all.len(),
                    "fleet desired state changed"
                );
                self.kick();
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
                self.kick();
            }
        }
        self.desired_view(agent)
    }

    /// One scope's own settings (and, for an agent, what it is sent).
    pub fn desired_view(&self, agent: Option<&str>) -> Result<DesiredView, FleetError> {
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

    pub fn view_of(&self, id: &str) -> Result<AgentView, FleetError> {
        let entry = self.entry(id)?;
        Ok(self.view(&entry))
    }

    fn view(&self, entry: &AgentEntry) -> AgentView {
        let desired_generation = *entry.generation.borrow();
        let settings = self.effective(entry).1;
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
            labels: st.labels(),
            hub_labels: st.hub_labels.clone(),
            accept_jobs: settings.accept_jobs.unwrap_or(true),
            drain_deadline_ms: settings
                .drain_deadline_ms
                .filter(|_| settings.accept_jobs == Some(false)),
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
        last_seen.is_some_and(|t| t + recent >= crate::util::unix_now())
    }

    /// Every agent, by id.
    pub fn list(&self) -> Vec<AgentView> {
        let mut all = self.agents.all();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all.iter().map(|e| self.view(e)).collect()
    }

    /// Publishes an artifact whose bytes the caller has stored and whose signature it
    /// has verified.
    pub async fn publish_release(&self, row: ReleaseRow) -> Result<(), FleetError> {
        let _one = self.changes.lock().await;
        let generation = self.store.put_release(&row).await?;
        tracing::info!(version = %row.version, os = %row.os, arch = %row.arch, sha256 = %row.sha256, size = row.size, key_id = %row.key_id, "release published");
        util::write(&self.releases).put(row);
        self.fleet_moved(generation);
        Ok(())
    }

    /// Keeps a published binary where other replicas fetch it (nothing for a single hub,
    /// whose data dir has it).
    pub async fn share_release_bytes(
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
    pub async fn shared_release_bytes(&self, sha256: &str) -> Result<Option<Vec<u8>>, FleetError> {
        Ok(self.store.get_blob(sha256).await?)
    }

    /// The artifact of `version` for a platform, if published.
    pub fn release(&self, version: &str, os: &str, arch: &str) -> Option<ReleaseRow> {
        util::read(&self.releases).get(version, os, arch).cloned()
    }

    /// Every published version, with how many agents run it and whether it is halted.
    pub fn releases(&self) -> Vec<ReleaseView> {
        let all = self.agents.all();
        let reports: Vec<AgentReport> = all
            .iter()
            .filter(|e| !e.is_revoked())
            .filter_map(|e| util::lock(&e.state).report.clone())
            .collect();
        util::read(&self.releases).views(reports.iter())
    }

    /// Lifts the halt of `version`: agents are offered it again.
    pub async fn resume_release(&self, version: &str) -> Result<(), FleetError> {
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
        crate::util::cut_bytes(&mut reason, reconcile::MAX_ERROR_FIELD);
        let row = HaltRow {
            version: version.to_owned(),
            agent: entry.id.clone(),
            reason,
            halted_at: crate::util::unix_now(),
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
        for e in &self.agents.all() {
            self.announce(e);
        }
    }

    /// Moves when another replica changed the tokens.
    pub fn tokens_moved(&self) -> watch::Receiver<u64> {
        self.tokens_moved.subscribe()
    }

    /// (enrolled agents, polls held now).
    pub fn counts(&self) -> (usize, usize) {
        (self.agents.len(), self.held.load(Ordering::Relaxed))
    }
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
