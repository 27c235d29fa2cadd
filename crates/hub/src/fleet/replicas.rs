//! Hubs sharing one store (PostgreSQL): each keeps the whole fleet in memory, as a
//! single hub does, and follows what the others change.
//!
//! Every change is in the store before any hub acts on it; the store then tells the
//! other hubs which agent, or the fleet, changed ([`Event`]). This task loads that
//! from the store, under the fleet's `changes` lock (so it never interleaves with a
//! change of this hub), merges it into memory and announces it: a poll held here for
//! an agent whose settings changed through another hub is answered at once.
//!
//! The safety net: every [`RECHECK`], the store is asked whether every generation
//! handed out has been seen here ([`Store::in_sync`]); one missed (a notification
//! lost with its connection, say) makes this hub load everything again, as does a
//! reconnect of the store's listener ([`Event::Resync`]).
//!
//! What is merged never moves anything back: a scope only for a generation at least the
//! one held, a report only when newer than the one held.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{stored_labels, AgentEntry, AgentState, Fleet, FleetError, Releases, Scope};
use crate::store::{AgentRow, AgentSnapshot, Event, FleetSnapshot, Store};
use crate::util;

/// How often the store is asked whether a change was missed.
const RECHECK: Duration = Duration::from_secs(2);
/// Checks failed in a row before the replica counts its database as lost.
const LOST_AFTER: u32 = 2;
/// An agent seen this long past the longest hold counts as connected (to some hub).
pub(super) const SEEN_MARGIN: Duration = Duration::from_secs(10);

/// Follows the other hubs' changes; a handle that stops the task.
pub struct ReplicaSync(tokio::task::JoinHandle<()>);

impl ReplicaSync {
    /// `None` for a store no other hub shares.
    pub fn spawn<S: Store>(fleet: Arc<Fleet<S>>) -> Option<Self> {
        let mut events = fleet.store.events()?;
        Some(Self(tokio::spawn(async move {
            let mut tick = tokio::time::interval(RECHECK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // A change that could not be loaded: everything is, at the next check. Only
            // a load of everything clears it.
            let mut stale = false;
            let mut failed_checks = 0u32;
            loop {
                tokio::select! {
                    // Cancel-safe: mpsc::recv loses no message when another arm wins.
                    event = events.recv() => {
                        let Some(event) = event else { return };
                        let resync = event == Event::Resync;
                        match fleet.follow(event).await {
                            Ok(()) if resync => stale = false,
                            Ok(()) => {}
                            Err(e) => {
                                if !stale {
                                    tracing::error!(error = %util::error_chain(&e), "could not load another replica's change (everything is loaded again at the next check)");
                                }
                                stale = true;
                            }
                        }
                    }
                    _ = tick.tick() => match fleet.recheck(stale).await {
                        Ok(()) => {
                            if stale || failed_checks > 0 {
                                tracing::info!("this hub follows the other replicas' changes again");
                            }
                            stale = false;
                            failed_checks = 0;
                            fleet.store_lost.store(false, Ordering::Release);
                        }
                        Err(e) => {
                            failed_checks += 1;
                            if failed_checks == LOST_AFTER {
                                tracing::error!(error = %util::error_chain(&e), "this hub replica cannot reach its database: reconciles are refused (503) until it can, so that agents move to another replica");
                                fleet.store_lost.store(true, Ordering::Release);
                                // The polls held now are answered too: 503, at once.
                                for e in &fleet.agents.all() {
                                    e.generation.send_modify(|_| {});
                                }
                            }
                            stale = true;
                        }
                    },
                }
            }
        })))
    }

    pub fn stop(self) {
        self.0.abort();
    }
}

impl<S: Store> Fleet<S> {
    async fn follow(&self, event: Event) -> Result<(), FleetError> {
        match event {
            Event::Agent(id) => {
                let _one = self.changes.lock().await;
                self.follow_agent(&id).await?;
            }
            Event::Fleet => {
                let _one = self.changes.lock().await;
                self.follow_fleet().await?;
            }
            Event::Output(_) => self.jobs.moved(),
            Event::Queued(id) => {
                let _one = self.changes.lock().await;
                self.follow_queued(&id).await?;
            }
            Event::Tokens => self.tokens_moved.send_modify(|n| *n = n.wrapping_add(1)),
            Event::Resync => {
                self.tokens_moved.send_modify(|n| *n = n.wrapping_add(1));
                self.reload().await?;
            }
        }
        Ok(())
    }

    /// Called with `changes` held.
    pub(super) async fn follow_agent(&self, id: &str) -> Result<(), FleetError> {
        if let Some(snap) = self.store.load_agent(id).await? {
            if let Some(entry) = self.adopt_agent(snap) {
                self.resync_locked(&entry).await?;
            }
        }
        Ok(())
    }

    /// Called with `changes` held.
    async fn follow_fleet(&self) -> Result<(), FleetError> {
        let snap = self.store.load_fleet().await?;
        if self.adopt_fleet(snap) {
            self.bump_fleet().await?;
        }
        Ok(())
    }

    /// What another replica did for agent `id` (its jobs, its settings) and for the
    /// fleet, before this one answers it.
    pub(super) async fn catch_up(&self, id: &str) -> Result<(), FleetError> {
        let _one = self.changes.lock().await;
        self.follow_fleet().await?;
        self.follow_agent(id).await
    }

    /// Whether the report stored for `id` already says it rolled `version` back.
    pub(super) async fn rollback_stored(
        &self,
        id: &str,
        version: &str,
    ) -> Result<bool, FleetError> {
        if !self.replicated {
            return Ok(false);
        }
        let Some(snap) = self.store.load_agent(id).await? else {
            return Ok(false);
        };
        let report: Option<crate::proto::report::AgentReport> = snap
            .agent
            .report
            .as_deref()
            .and_then(|r| serde_json::from_str(r).ok());
        Ok(report
            .and_then(|r| r.upgrade)
            .is_some_and(|u| u.state == super::ROLLED_BACK && u.target.as_deref() == Some(version)))
    }

    /// The fleet's scope a generation of its own, settings kept (see [`Self::adopt_fleet`]).
    async fn bump_fleet(&self) -> Result<(), FleetError> {
        let mut settings = self.fleet_scope().settings;
        let generation = loop {
            match self.store.set_scope("", &settings, Some(&settings)).await? {
                Ok(g) => break g,
                Err(stored) => settings = stored,
            }
        };
        {
            let mut fleet = util::write(&self.fleet);
            if generation >= fleet.generation {
                fleet.generation = generation;
                fleet.settings = settings;
            }
        }
        self.newest.fetch_max(generation, Ordering::AcqRel);
        for e in &self.agents.all() {
            self.announce(e);
        }
        Ok(())
    }

    /// The periodic check: everything again when a change was missed (or the last
    /// attempt to load one failed).
    async fn recheck(&self, stale: bool) -> Result<(), FleetError> {
        if stale || !self.store.in_sync().await? {
            tracing::info!("loading the fleet again from the hub database (a change by another replica may have been missed)");
            self.reload().await?;
        }
        Ok(())
    }

    /// Loads everything and merges it.
    async fn reload(&self) -> Result<(), FleetError> {
        let _one = self.changes.lock().await;
        let mut snap = self.store.load().await?;
        let (fleet, mut own) = snap.take_scopes();
        let mut jobs: HashMap<String, Vec<_>> = HashMap::new();
        for j in snap.open_jobs {
            jobs.entry(j.agent.clone()).or_default().push(j);
        }
        self.adopt_queue(jobs.remove("").unwrap_or_default());
        if self.adopt_fleet(FleetSnapshot {
            scope: fleet,
            generation: snap.generation,
            releases: snap.releases,
            halts: snap.halts,
        }) {
            self.bump_fleet().await?;
        }
        for agent in snap.agents {
            let scope = own.remove(&agent.id);
            let open_jobs = jobs.remove(&agent.id).unwrap_or_default();
            if let Some(entry) = self.adopt_agent(AgentSnapshot {
                agent,
                scope,
                open_jobs,
            }) {
                self.resync_locked(&entry).await?;
            }
        }
        self.jobs.moved();
        Ok(())
    }

    /// Takes in the fleet's scope, releases and halts. True when the fleet's scope
    /// changed under a generation this hub had already passed (one of its own changes
    /// took a later one meanwhile): polls waiting past that one would not see it, so the
    /// caller gives the fleet a new generation.
    fn adopt_fleet(&self, snap: FleetSnapshot) -> bool {
        let newest = self.newest.load(Ordering::Acquire);
        *util::write(&self.releases) = Releases::load(snap.releases, snap.halts);
        let mut behind = false;
        if let Some(s) = snap.scope {
            let mut fleet = util::write(&self.fleet);
            if s.generation > fleet.generation {
                behind = s.generation < newest;
                *fleet = Scope {
                    generation: s.generation,
                    settings: s.settings,
                };
            }
        }
        self.newest.fetch_max(snap.generation, Ordering::AcqRel);
        for e in &self.agents.all() {
            self.announce(e);
        }
        behind
    }

    /// Takes in one agent as stored. `Some(entry)` when what it is sent changed under a
    /// generation its held polls are already past (see [`Self::adopt_fleet`]): the
    /// caller gives it a new one.
    fn adopt_agent(&self, snap: AgentSnapshot) -> Option<Arc<AgentEntry>> {
        let AgentSnapshot {
            agent,
            scope,
            open_jobs,
        } = snap;
        let own = scope.map_or_else(Scope::default, |s| Scope {
            generation: s.generation,
            settings: s.settings,
        });
        self.newest.fetch_max(own.generation, Ordering::AcqRel);
        let revoked = agent.revoked_at.is_some();
        let Some(entry) = self.agents.get(&agent.id) else {
            let generation = own.generation.max(util::read(&self.fleet).generation);
            let mut state = AgentState {
                hub_labels: stored_labels(&agent),
                next_token_sha256: agent.next_token_sha256.clone(),
                rotate_asked: agent.rotate_asked,
                token_issued_ms: agent
                    .token_issued_ms
                    .unwrap_or(agent.enrolled_at.saturating_mul(1000)),
                ..AgentState::new(agent.token_sha256.clone(), agent.enrolled_at, own)
            };
            adopt_report(&mut state, &agent, false);
            let entry = AgentEntry::new(
                agent.id.clone(),
                state,
                revoked,
                generation,
                agent.jobs_version,
            );
            let entry = self.agents.insert(entry);
            self.adopt_jobs(&entry, open_jobs);
            self.announce(&entry);
            return None;
        };
        let announced = *entry.generation.borrow();
        // Jobs first (they move the agent's jobs' version, never its generation) and the
        // scope's generation last: an answer computed meanwhile never carries the new
        // generation without what it stands for.
        self.adopt_jobs(&entry, open_jobs);
        entry.jobs_moved(agent.jobs_version);
        let mut moved = false;
        let token_changed;
        {
            let mut st = util::lock(&entry.state);
            token_changed = st.token_sha256 != agent.token_sha256;
            st.token_sha256 = agent.token_sha256.clone();
            st.next_token_sha256 = agent.next_token_sha256.clone();
            st.rotate_asked = agent.rotate_asked;
            if let Some(t) = agent.token_issued_ms {
                st.token_issued_ms = t;
            }
            st.enrolled_at = agent.enrolled_at;
            st.hub_labels = stored_labels(&agent);
            if own.generation > st.own.generation {
                moved |= own.settings != st.own.settings;
                st.own = own;
            }
            adopt_report(&mut st, &agent, entry.dirty.load(Ordering::Acquire));
        }
        self.agents.reindex(&entry);
        let was_revoked = entry.revoked.swap(revoked, Ordering::AcqRel);
        if (revoked && !was_revoked) || token_changed {
            // Its held polls see the flag, or that their token is no longer the one.
            entry.generation.send_modify(|_| {});
        }
        self.announce(&entry);
        let now = *entry.generation.borrow();
        (moved && now <= announced && !revoked).then_some(entry)
    }

    /// Takes in the reports other hubs wrote (for `agent list` and `agent show`).
    pub async fn adopt_reports(&self) -> Result<(), FleetError> {
        if !self.replicated {
            return Ok(());
        }
        let rows = self.store.load_agents().await?;
        // Each entry is looked up alone: reindexing takes the label index, which comes
        // before the agents' map in the lock order (docs/design.md).
        for row in rows {
            let Some(entry) = self.agents.get(&row.id) else {
                continue;
            };
            let dirty = entry.dirty.load(Ordering::Acquire);
            adopt_report(&mut util::lock(&entry.state), &row, dirty);
            self.agents.reindex(&entry);
        }
        Ok(())
    }
}

/// The stored report, when it is newer than the one held: seen later, or seen in the
/// same second and other than the one held while this hub holds none of its own to
/// write (`dirty`: a report this hub took that is not in the store yet is the newer).
fn adopt_report(st: &mut AgentState, row: &AgentRow, dirty: bool) {
    let same_second_newer = || {
        !dirty
            && row.last_seen == st.last_seen
            && row.observed_generation >= st.observed_generation
            && row
                .report
                .as_deref()
                .and_then(|r| serde_json::from_str(r).ok())
                != st.report
    };
    if row.last_seen > st.last_seen || same_second_newer() {
        st.last_seen = row.last_seen;
        st.observed_generation = row.observed_generation;
        // A report that no longer parses is left out: the agent sends a new one.
        st.report = row
            .report
            .as_deref()
            .and_then(|r| serde_json::from_str(r).ok());
    }
}
