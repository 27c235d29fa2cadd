//! The fleet's queue: jobs submitted with a selector instead of an agent wait here until
//! an eligible agent has room (docs/hub.md, "Routing jobs").
//!
//! Jobs are kept in one lane per distinct selector, each ordered by priority (higher
//! first) then submission order. With aging (`hub serve --priority-aging DUR`, a point
//! each DUR waited), a job's priority grows while it waits, so a stream of higher ones
//! never starves it. Growing at one rate for all, it never changes the order of two
//! queued jobs over time: a job ranks by `created - priority × DUR` (the earlier, the
//! sooner), a number fixed at submission, and the lanes stay sorted maps. A dispatch round ([`Fleet::dispatch`]) takes a look at
//! the fleet once, not once per job: which agents may take work now and how much, and,
//! per lane, which of them match. It then hands out the best head of all lanes, again
//! and again, each to the least-loaded matching agent (open jobs / its `max_jobs`, then
//! the one that got a job longest ago), until no lane has an agent with room.
//!
//! The store decides every assignment ([`JobStore::assign_job`]): the job must still be
//! queued and the agent below its `max_jobs`, so two replicas never hand out one job
//! twice. Once assigned, the job is in the agent's desired state like a job submitted
//! for it, and at-most-once is the per-agent path's. The assignment is stored before
//! the agent's poll is woken.
//!
//! Task: [`Dispatcher`] runs a round when a job is queued, room may have opened (a job
//! done, an agent reconciling with room, labels or settings changed) and every second
//! (agents that connected or went away, queue timeouts).

use std::cmp::{Ordering as Order, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::super::{AgentEntry, AgentState, Fleet, FleetError};
use super::OpenJob;
use crate::proto::fleet_job::EXPIRED;
use crate::proto::hub::DesiredSettings;
use crate::proto::job::JobState;
use crate::proto::selector::Selector;
use crate::store::{Assigned, Assignment, JobProgress, JobRow, Store};
use crate::util;

/// Jobs queued at once, at most: past it, a submission is refused.
pub(in crate::fleet) const MAX_QUEUED: usize = 100_000;
/// Assignments per round: the round holds the fleet's change lock, and submissions
/// and reports must not wait behind a long one. The next round follows at once.
const ROUND: usize = 256;
/// How often a round runs without a reason.
const TICK: Duration = Duration::from_secs(1);
/// When an agent's report does not say how many jobs its runner admits.
const UNKNOWN_MAX_JOBS: usize = 1;

/// Its rank (lower first), then submission order.
type Key = (i64, u64);

/// A job in the queue.
#[derive(Debug)]
pub(in crate::fleet) struct Queued {
    row: JobRow,
}

impl Queued {
    /// Strict: by priority alone. Aging by a point each `aging_ms`: by when a job of
    /// priority 0 submitted at that time would rank with it (module doc).
    fn key(&self, aging_ms: u64) -> Key {
        let priority = i64::from(self.row.priority);
        let rank = match aging_ms {
            0 => -priority,
            every => (self.row.created_ms as i64).saturating_sub(priority * every as i64),
        };
        (rank, self.row.seq)
    }
}

struct Lane {
    takers: Takers,
    jobs: BTreeMap<Key, Queued>,
}

/// Which agents may take a lane's jobs.
#[derive(Clone)]
struct Takers {
    selector: Selector,
    /// A scoped token's selector, on the agents' hub labels.
    scope: Option<Selector>,
}

impl Takers {
    /// Whether an agent with these labels may take this lane's jobs.
    fn fit(&self, st: &AgentState) -> bool {
        self.selector.matches_in_force(st.in_force())
            && self
                .scope
                .as_ref()
                .is_none_or(|s| s.matches(&st.hub_labels))
    }
}

/// The queued jobs, by selector.
#[derive(Default)]
pub(in crate::fleet) struct Queue {
    /// A point of priority each this many ms waited; 0: strict.
    aging_ms: u64,
    lanes: HashMap<String, Lane>,
    /// Each job's lane and key.
    index: HashMap<String, (String, Key)>,
    deadlines: BTreeSet<(u64, String)>,
}

impl Queue {
    pub(in crate::fleet) fn new(aging: Option<Duration>) -> Self {
        Self {
            aging_ms: aging.map_or(0, |a| (a.as_millis() as u64).max(1)),
            ..Self::default()
        }
    }

    pub(in crate::fleet) fn len(&self) -> usize {
        self.index.len()
    }

    /// Takes in a queued job; false (and left out) when its selector no longer parses.
    pub(in crate::fleet) fn insert(&mut self, row: JobRow) -> bool {
        let Some(selector_text) = row.selector.clone() else {
            return false;
        };
        if self.index.contains_key(&row.id) {
            return true;
        }
        // One lane per selector and scope.
        let text = match &row.scope {
            Some(scope) => format!("{selector_text}\u{1f}{scope}"),
            None => selector_text.clone(),
        };
        let lane = match self.lanes.entry(text.clone()) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let scope = match row.scope.as_deref().map(Selector::parse).transpose() {
                    Ok(scope) => scope,
                    Err(_) => return false,
                };
                match Selector::parse(&selector_text) {
                    Ok(selector) => v.insert(Lane {
                        takers: Takers { selector, scope },
                        jobs: BTreeMap::new(),
                    }),
                    Err(_) => return false,
                }
            }
        };
        let q = Queued { row };
        let key = q.key(self.aging_ms);
        if let Some(d) = q.row.queue_deadline_ms {
            self.deadlines.insert((d, q.row.id.clone()));
        }
        self.index.insert(q.row.id.clone(), (text, key));
        lane.jobs.insert(key, q);
        true
    }

    pub(in crate::fleet) fn remove(&mut self, id: &str) -> Option<JobRow> {
        let (text, key) = self.index.remove(id)?;
        let lane = self.lanes.get_mut(&text)?;
        let q = lane.jobs.remove(&key)?;
        if lane.jobs.is_empty() {
            self.lanes.remove(&text);
        }
        if let Some(d) = q.row.queue_deadline_ms {
            self.deadlines.remove(&(d, q.row.id.clone()));
        }
        Some(q.row)
    }

    /// How many jobs wait under each selector (and scope, after a `|`), and when the
    /// one waiting longest was submitted (Unix ms).
    pub(in crate::fleet) fn depths(&self) -> Vec<(String, u64, u64)> {
        self.lanes
            .iter()
            .map(|(text, lane)| {
                let oldest = lane.jobs.values().map(|q| q.row.created_ms).min();
                (
                    text.replace('\u{1f}', " | scope "),
                    lane.jobs.len() as u64,
                    oldest.unwrap_or(0),
                )
            })
            .collect()
    }

    /// Every queued job's id (for a replica that loads the queue again).
    fn ids(&self) -> Vec<String> {
        self.index.keys().cloned().collect()
    }

    /// The jobs whose deadline is at or before `now`.
    fn due(&self, now: u64) -> Vec<String> {
        self.deadlines
            .range(..=(now, String::from('\u{10ffff}')))
            .map(|(_, id)| id.clone())
            .collect()
    }

    #[cfg(test)]
    fn head(&self, lane: &str) -> Option<(Key, String)> {
        let (k, q) = self.lanes.get(lane)?.jobs.first_key_value()?;
        Some((*k, q.row.id.clone()))
    }

    /// How many jobs of its lane go before `id`.
    fn ahead(&self, id: &str) -> usize {
        let Some((text, key)) = self.index.get(id) else {
            return 0;
        };
        self.lanes
            .get(text)
            .map_or(0, |l| l.jobs.range(..*key).count())
    }
}

/// An agent that may take work now, as one round sees it.
struct Slot {
    entry: Arc<AgentEntry>,
    /// The lanes (by the round's numbering) whose jobs it may take.
    fits: Vec<bool>,
    open: usize,
    max: usize,
    last_assigned_ms: u64,
}

impl Slot {
    fn has_room(&self) -> bool {
        self.open < self.max
    }

    /// Less loaded first (open / max, compared without division), then the one that
    /// got a job longest ago, then by id (a stable order).
    fn before(&self, other: &Slot) -> Order {
        (self.open * other.max)
            .cmp(&(other.open * self.max))
            .then(self.last_assigned_ms.cmp(&other.last_assigned_ms))
            .then_with(|| self.entry.id.cmp(&other.entry.id))
    }
}

/// How an agent stands for the queue.
enum Standing {
    Revoked,
    Away,
    NotServing,
    /// Drained, by the hub or on the host: it finishes what it has and takes nothing new.
    Draining,
    Full,
    Room {
        open: usize,
        max: usize,
    },
}

/// What matching agents there are for a queued job, counted.
#[derive(Default, Clone, Copy)]
struct Census {
    matching: usize,
    connected: usize,
    draining: usize,
    serving: usize,
    room: usize,
}

/// The censuses taken for a listing of queued jobs, by selector text.
#[derive(Default)]
pub(in crate::fleet) struct Censuses(HashMap<String, Census>);

impl<S: Store> Fleet<S> {
    /// Wakes the dispatcher: a job was queued, or room may have opened.
    pub(in crate::fleet) fn kick(&self) {
        if util::lock(&self.jobs.queue).len() > 0 {
            self.jobs.dispatch.notify_one();
        }
    }

    /// Whether `entry` may take a queued job now (it holds fewer jobs than it may).
    pub(in crate::fleet) fn kick_if_room(&self, entry: &Arc<AgentEntry>) {
        if util::lock(&self.jobs.queue).len() > 0
            && matches!(self.standing(entry), Standing::Room { .. })
        {
            self.jobs.dispatch.notify_one();
        }
    }

    fn standing(&self, entry: &Arc<AgentEntry>) -> Standing {
        let fleet = self.fleet_scope().settings;
        self.standing_locked(entry, &util::lock(&entry.state), &fleet)
    }

    /// [`Fleet::standing`] with the agent's state locked and the fleet's settings read
    /// by the caller, once for all the agents it looks at.
    fn standing_locked(
        &self,
        entry: &AgentEntry,
        st: &AgentState,
        fleet: &DesiredSettings,
    ) -> Standing {
        if entry.is_revoked() {
            return Standing::Revoked;
        }
        let settings = fleet.overlaid(&st.own.settings);
        if !self.connected(entry, st.last_seen) {
            return Standing::Away;
        }
        let Some(report) = st.report.as_ref().filter(|r| r.runner.state == "running") else {
            return Standing::NotServing;
        };
        if !settings.runner_enabled.unwrap_or(true) {
            return Standing::NotServing;
        }
        if settings.accept_jobs == Some(false) || report.drain.is_some() {
            return Standing::Draining;
        }
        let max = report
            .jobs_summary
            .map(|j| j.max_jobs as usize)
            .filter(|m| *m > 0)
            .unwrap_or(UNKNOWN_MAX_JOBS);
        let open = st.jobs.len();
        if open >= max {
            return Standing::Full;
        }
        Standing::Room { open, max }
    }

    /// Queues a selected job the store holds now.
    pub(in crate::fleet) fn enqueue(&self, row: JobRow) {
        let id = row.id.clone();
        if !util::lock(&self.jobs.queue).insert(row) {
            tracing::error!(job = %id, "a queued job's selector does not parse; it stays queued at the hub until cancelled");
        }
        self.kick();
    }

    /// One dispatch round; how many jobs it handed out. Takes the change lock.
    pub(in crate::fleet) async fn dispatch(&self) -> Result<usize, FleetError> {
        if self.jobs.queued_len() == 0 {
            return Ok(0);
        }
        let _one = self.changes.lock().await;
        let fleet = self.fleet_scope().settings;
        // The lanes as they stand, numbered for this round; the agents are looked at
        // without the queue's lock, which every reconcile takes.
        let lanes: Vec<(String, Takers)> = util::lock(&self.jobs.queue)
            .lanes
            .iter()
            .map(|(text, lane)| (text.clone(), lane.takers.clone()))
            .collect();
        let mut slots: Vec<Slot> = self
            .agents
            .matching_any(lanes.iter().map(|(_, t)| &t.selector))
            .into_iter()
            .filter_map(|entry| {
                let st = util::lock(&entry.state);
                let Standing::Room { open, max } = self.standing_locked(&entry, &st, &fleet) else {
                    return None;
                };
                let fits: Vec<bool> = lanes.iter().map(|(_, t)| t.fit(&st)).collect();
                let last_assigned_ms = st.last_assigned_ms;
                drop(st);
                fits.contains(&true).then_some(Slot {
                    entry,
                    fits,
                    open,
                    max,
                    last_assigned_ms,
                })
            })
            .collect();
        let plan = {
            let q = util::lock(&self.jobs.queue);
            // A lane emptied meanwhile has nothing to plan; one opened meanwhile waits
            // for the next round.
            let now: Vec<Option<&Lane>> = lanes.iter().map(|(text, _)| q.lanes.get(text)).collect();
            plan(&now, &mut slots)
        };
        if plan.is_empty() {
            return Ok(0);
        }
        if plan.len() == ROUND {
            // More may fit: the next round follows at once.
            self.jobs.dispatch.notify_one();
        }
        let batch: Vec<Assignment> = plan
            .iter()
            .map(|&(ref job, slot)| Assignment {
                job: job.clone(),
                agent: slots[slot].entry.id.clone(),
                max_open: slots[slot].max,
            })
            .collect();
        let outcomes = self.store.assign_jobs(&batch).await?;
        let mut given = 0;
        let now = util::unix_now_ms();
        let mut woken = Vec::new();
        for ((job, slot), outcome) in plan.into_iter().zip(outcomes) {
            let entry = &slots[slot].entry;
            match outcome {
                Assigned::To(change) => {
                    given += 1;
                    self.assigned(&job, entry, change, now);
                    if !woken.contains(&(slot, change)) {
                        woken.push((slot, change));
                    }
                }
                // Another replica assigned it (its change reaches this hub as that
                // agent's), or it ended there.
                Assigned::Gone => drop(util::lock(&self.jobs.queue).remove(&job)),
                // Fuller than this hub knew (another replica's assignments): the job
                // waits for the next round.
                Assigned::Full => {}
            }
        }
        // Stored, then woken.
        for (slot, version) in woken {
            slots[slot].entry.jobs_moved(version);
        }
        if given > 0 {
            self.jobs.moved();
        }
        Ok(given)
    }

    /// Queued job `id` is `entry`'s now, as stored: out of the queue, into the agent's
    /// desired state. Its poll is woken by the caller.
    fn assigned(&self, id: &str, entry: &Arc<AgentEntry>, change: u64, now: u64) {
        let Some(mut row) = util::lock(&self.jobs.queue).remove(id) else {
            return;
        };
        crate::metrics::DISPATCH.observe(now.saturating_sub(row.created_ms) as f64 / 1000.0);
        row.agent = entry.id.clone();
        row.progress.state = crate::proto::fleet_job::PENDING.into();
        let job = OpenJob::given(row, self.replicated);
        {
            let mut st = util::lock(&entry.state);
            st.jobs.insert(id.to_owned(), job);
            st.last_assigned_ms = now;
        }
        util::write(&self.jobs.index).insert(id.to_owned(), entry.clone());
        tracing::info!(job = %id, agent = %entry.id, change, "queued job assigned");
    }

    /// Ends the queued jobs past their queue timeout as `expired`. Takes the change lock.
    pub(in crate::fleet) async fn expire(&self) -> Result<(), FleetError> {
        let now = util::unix_now_ms();
        if util::lock(&self.jobs.queue).due(now).is_empty() {
            return Ok(());
        }
        let _one = self.changes.lock().await;
        let due = util::lock(&self.jobs.queue).due(now);
        let mut censuses = Censuses::default();
        for id in due {
            let Some(row) = util::lock(&self.jobs.queue).remove(&id) else {
                continue;
            };
            let timeout = row
                .queue_deadline_ms
                .unwrap_or(now)
                .saturating_sub(row.created_ms);
            let why = format!(
                "no agent took it within its queue timeout of {}: {}",
                humantime::format_duration(Duration::from_secs(timeout / 1000)),
                self.queue_waiting_in(&row, &mut censuses)
            );
            if self
                .end_queued_row(&row, EXPIRED, why.clone(), false)
                .await?
            {
                tracing::info!(job = %id, reason = %why, "queued job expired");
            }
        }
        Ok(())
    }

    /// Ends a queued job, as stored; false when it was no longer queued there. Called
    /// with `changes` held, the job out of the queue.
    async fn end_queued_row(
        &self,
        row: &JobRow,
        state: &str,
        why: String,
        cancel: bool,
    ) -> Result<bool, FleetError> {
        let p = JobProgress {
            state: state.into(),
            cancel_requested: cancel,
            error: Some(why),
            finished_ms: Some(util::unix_now_ms()),
            done: true,
            ..row.progress.clone()
        };
        let ended = self.store.end_queued(&row.id, &p).await?;
        if ended {
            crate::metrics::job_ended(&p.state, p.error.as_deref(), None);
            self.jobs.count_done(1);
        }
        self.jobs.moved();
        Ok(ended)
    }

    /// Cancels a queued job at the hub: no agent was given it. Called with `changes`
    /// held; false when it is not queued here.
    pub(in crate::fleet) async fn cancel_queued(&self, id: &str) -> Result<bool, FleetError> {
        let Some(row) = util::lock(&self.jobs.queue).remove(id) else {
            return Ok(false);
        };
        let why = "cancelled at the hub while queued: no agent was given it".to_owned();
        match self
            .end_queued_row(&row, JobState::Cancelled.as_str(), why, true)
            .await
        {
            Ok(_) => {
                tracing::info!(job = %id, "queued job cancelled");
                Ok(true)
            }
            Err(e) => {
                util::lock(&self.jobs.queue).insert(row);
                Err(e)
            }
        }
    }

    /// Why a queued job waits, as the fleet stands now; `censuses` counts the agents a
    /// selector matches once for all the jobs of a listing.
    pub(in crate::fleet) fn queue_waiting_in(
        &self,
        row: &JobRow,
        censuses: &mut Censuses,
    ) -> String {
        let Some(text) = row.selector.as_deref() else {
            return "queued".into();
        };
        let Ok(selector) = Selector::parse(text) else {
            return format!("its selector {text:?} does not parse: cancel it");
        };
        let c = match censuses.0.get(text) {
            Some(c) => *c,
            None => {
                let c = self.census(&selector);
                censuses.0.insert(text.to_owned(), c);
                c
            }
        };
        let agents = |n: usize| if n == 1 { "agent" } else { "agents" };
        let ahead = util::lock(&self.jobs.queue).ahead(&row.id);
        if c.matching == 0 {
            format!("no agent matches {text}: it waits for one that does (a host enrolled with these labels, or labelled with `railgrid hub agent label`)")
        } else if c.connected == 0 {
            format!(
                "no connected agent matches {text} ({} {} match, none connected)",
                c.matching,
                agents(c.matching)
            )
        } else if c.serving == 0 && c.draining > 0 {
            format!(
                "{} connected {} match {text}: {} draining, none taking jobs",
                c.connected,
                agents(c.connected),
                c.draining
            )
        } else if c.serving == 0 {
            format!(
                "{} connected {} match {text}, none with its runner serving (disabled, or not running)",
                c.connected,
                agents(c.connected)
            )
        } else if c.room == 0 {
            format!("{} {} match, all full", c.serving, agents(c.serving))
        } else if ahead > 0 {
            format!(
                "{ahead} {} ahead of it for {text}",
                if ahead == 1 { "job" } else { "jobs" }
            )
        } else {
            format!(
                "{} {} match with room: being assigned",
                c.room,
                agents(c.room)
            )
        }
    }

    /// The agents `selector` matches, by how they stand.
    fn census(&self, selector: &Selector) -> Census {
        let mut c = Census::default();
        let fleet = self.fleet_scope().settings;
        for e in self.agents.matching_any([selector]) {
            let st = util::lock(&e.state);
            if e.is_revoked() || !selector.matches_in_force(st.in_force()) {
                continue;
            }
            c.matching += 1;
            match self.standing_locked(&e, &st, &fleet) {
                Standing::Revoked | Standing::Away => continue,
                Standing::NotServing => {}
                Standing::Draining => c.draining += 1,
                Standing::Full => c.serving += 1,
                Standing::Room { .. } => {
                    c.serving += 1;
                    c.room += 1;
                }
            }
            c.connected += 1;
        }
        c
    }

    /// Takes in a job another replica queued or ended while queued (its row now).
    /// Called with `changes` held.
    pub(in crate::fleet) async fn follow_queued(&self, id: &str) -> Result<(), FleetError> {
        match self.store.get_job(id).await? {
            Some(row) if row.agent.is_empty() && !row.progress.done => self.enqueue(row),
            _ => {
                util::lock(&self.jobs.queue).remove(id);
            }
        }
        self.jobs.moved();
        Ok(())
    }

    /// The queue as the store holds it now (a replica's reload). Called with `changes`
    /// held.
    pub(in crate::fleet) fn adopt_queue(&self, rows: Vec<JobRow>) {
        let open: std::collections::HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        {
            let mut q = util::lock(&self.jobs.queue);
            for id in q.ids() {
                if !open.contains(id.as_str()) {
                    q.remove(&id);
                }
            }
        }
        for row in rows {
            self.enqueue(row);
        }
    }
}

/// Runs dispatch rounds; a handle that stops the task.
pub struct Dispatcher(tokio::task::JoinHandle<()>);

impl Dispatcher {
    pub fn spawn<S: Store>(fleet: Arc<Fleet<S>>) -> Self {
        Self(tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                tokio::select! {
                    // Cancel-safe: a `notify_one` while another arm wins is kept as a
                    // permit for the next `notified`.
                    () = fleet.jobs.dispatch.notified() => {}
                    _ = tick.tick() => {}
                }
                let r = match fleet.expire().await {
                    Ok(()) => fleet.dispatch().await.map(drop),
                    Err(e) => Err(e),
                };
                match r {
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!("the fleet's queue is dispatched again");
                    }
                    Ok(()) => {}
                    Err(e) => {
                        if !failing {
                            tracing::error!(error = %util::error_chain(&e), "could not dispatch the fleet's queue (tried again every second)");
                        }
                        failing = true;
                    }
                }
            }
        }))
    }

    pub fn stop(self) {
        self.0.abort();
    }
}

/// Which queued jobs go to which slot this round, best first: the best head of all lanes
/// again and again, each to the least-loaded matching slot with room, until no lane has
/// one or [`ROUND`] are planned. The slots count what they were given.
fn plan(lanes: &[Option<&Lane>], slots: &mut [Slot]) -> Vec<(String, usize)> {
    // Per lane: the slots that may take its jobs, and how far into the lane this round
    // has got.
    let mut progress: Vec<(Vec<usize>, usize)> = (0..lanes.len())
        .map(|n| ((0..slots.len()).filter(|&i| slots[i].fits[n]).collect(), 0))
        .collect();
    let mut heads = BinaryHeap::new();
    for (n, lane) in lanes.iter().enumerate() {
        if let Some(key) = lane.and_then(|l| l.jobs.keys().next()) {
            heads.push(Reverse((*key, n)));
        }
    }
    let now = util::unix_now_ms();
    let mut plan = Vec::new();
    while let Some(Reverse((_, n))) = heads.pop() {
        if plan.len() == ROUND {
            break;
        }
        let (fits, taken) = &mut progress[n];
        let Some(lane) = lanes[n] else { continue };
        let mut jobs = lane.jobs.iter().skip(*taken);
        let Some((_, job)) = jobs.next() else {
            continue;
        };
        // A retry goes to another agent than the one it was lost on, when one has room.
        let avoided = |i: usize| Some(&slots[i].entry.id) == job.row.avoid.as_ref();
        let Some(best) = fits
            .iter()
            .copied()
            .filter(|&i| slots[i].has_room())
            .min_by(|&a, &b| {
                avoided(a)
                    .cmp(&avoided(b))
                    .then_with(|| slots[a].before(&slots[b]))
            })
        else {
            // No room for this lane this round: its jobs wait.
            continue;
        };
        plan.push((job.row.id.clone(), best));
        slots[best].open += 1;
        slots[best].last_assigned_ms = now;
        *taken += 1;
        if let Some((key, _)) = jobs.next() {
            heads.push(Reverse((*key, n)));
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, seq: u64, priority: u8, selector: &str, deadline: Option<u64>) -> JobRow {
        JobRow {
            seq,
            selector: Some(selector.into()),
            priority,
            queue_deadline_ms: deadline,
            ..JobRow::queued(id)
        }
    }

    #[test]
    fn an_aging_queue_lets_a_low_job_pass_the_high_ones_that_came_long_after_it() {
        use super::super::JobLimits;
        let every = Duration::from_secs(3);
        let mut q = Queue::new(Some(every));
        let at = |id: &str, seq: u64, priority: u8, created_ms: u64| JobRow {
            created_ms,
            ..row(id, seq, priority, "x", None)
        };
        q.insert(at("low", 1, 0, 1_000_000));
        // High ones within the 100 points × 3 s it takes the low one to catch up…
        q.insert(at("high-soon", 2, 100, 1_000_000 + 299_000));
        // …go first; those after, not.
        q.insert(at("high-late", 3, 100, 1_000_000 + 301_000));
        q.insert(at("same-later", 4, 0, 1_000_001));
        let mut order = Vec::new();
        while let Some((_, id)) = q.head("x") {
            order.push(id.clone());
            q.remove(&id);
        }
        assert_eq!(order, ["high-soon", "low", "same-later", "high-late"]);
        let strict = JobLimits {
            priority_aging: None,
            ..JobLimits::default()
        };
        assert_eq!(strict.effective_priority(10, 3_600_000), 10);
        let aging = JobLimits {
            priority_aging: Some(every),
            ..JobLimits::default()
        };
        assert_eq!(aging.effective_priority(10, 9_500), 13);
        assert_eq!(aging.effective_priority(90, 3_600_000), 100);
    }

    #[test]
    fn a_lane_serves_priority_then_submission_order() {
        let mut q = Queue::default();
        assert!(q.insert(row("low", 1, 10, "queue=build", None)));
        assert!(q.insert(row("first", 2, 50, "queue=build", Some(5))));
        assert!(q.insert(row("high", 3, 90, "queue=build", None)));
        assert!(q.insert(row("second", 4, 50, "queue=build", None)));
        assert!(q.insert(row("gpu", 5, 50, "queue=gpu", Some(9))));
        assert!(!q.insert(row("bad", 6, 50, "a in (", None)));
        let mut order = Vec::new();
        while let Some((_, id)) = q.head("queue=build") {
            order.push(id.clone());
            q.remove(&id);
        }
        assert_eq!(order, ["high", "first", "second", "low"]);
        assert_eq!(q.len(), 1);
        assert_eq!(
            q.due(8),
            Vec::<String>::new(),
            "first's deadline left with it"
        );
        assert_eq!(q.due(9), ["gpu"]);
    }

    #[test]
    fn jobs_ahead_are_counted_in_their_lane_only() {
        let mut q = Queue::default();
        q.insert(row("a", 1, 50, "x", None));
        q.insert(row("b", 2, 50, "y", None));
        q.insert(row("c", 3, 50, "x", None));
        q.insert(row("d", 4, 60, "x", None));
        assert_eq!(
            (q.ahead("d"), q.ahead("a"), q.ahead("c"), q.ahead("b")),
            (0, 1, 2, 0)
        );
    }
}
