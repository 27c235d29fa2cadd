//! The enrolled agents, by id and by their labels in force: the registry owns both maps,
//! so that the fleet's other parts reach an agent only through it and the label index
//! cannot fall out of step with the agents it indexes.
//!
//! Lock order within (a part of the fleet's, docs/design.md): `by_label` → `agents`. An
//! agent's own state is taken after both have been let go, or under `agents` alone.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use super::label_index::LabelIndex;
use super::AgentEntry;
use crate::proto::selector::Selector;
use crate::util;

pub(super) struct Registry {
    agents: RwLock<HashMap<String, Arc<AgentEntry>>>,
    by_label: Mutex<LabelIndex>,
}

impl Registry {
    /// The agents loaded from the store, indexed by their labels in force.
    pub(super) fn new(agents: HashMap<String, Arc<AgentEntry>>) -> Self {
        let mut by_label = LabelIndex::default();
        for e in agents.values() {
            by_label.set(&e.id, &util::lock(&e.state).labels());
        }
        Self {
            agents: RwLock::new(agents),
            by_label: Mutex::new(by_label),
        }
    }

    pub(super) fn get(&self, id: &str) -> Option<Arc<AgentEntry>> {
        util::read(&self.agents).get(id).cloned()
    }

    pub(super) fn all(&self) -> Vec<Arc<AgentEntry>> {
        util::read(&self.agents).values().cloned().collect()
    }

    pub(super) fn len(&self) -> usize {
        util::read(&self.agents).len()
    }

    /// Adds `entry` unless its id is taken (by another replica's word, taken in between):
    /// the entry under the id now, indexed.
    pub(super) fn insert(&self, entry: Arc<AgentEntry>) -> Arc<AgentEntry> {
        let entry = util::write(&self.agents)
            .entry(entry.id.clone())
            .or_insert(entry)
            .clone();
        self.reindex(&entry);
        entry
    }

    /// Indexes `entry` under its labels in force now: called wherever they may change.
    pub(super) fn reindex(&self, entry: &AgentEntry) {
        let labels = util::lock(&entry.state).labels();
        util::lock(&self.by_label).set(&entry.id, &labels);
    }

    /// The agents one of `selectors` can match, by the label index (a superset: each is
    /// still to be matched): the whole fleet only when a selector narrows nothing (only
    /// `!=`, `notin`, `!key`).
    pub(super) fn matching_any<'s>(
        &self,
        selectors: impl IntoIterator<Item = &'s Selector>,
    ) -> Vec<Arc<AgentEntry>> {
        let index = util::lock(&self.by_label);
        let mut ids: HashSet<&str> = HashSet::new();
        for selector in selectors {
            match index.candidates(selector) {
                Some(found) => ids.extend(found),
                None => return self.all(),
            }
        }
        let agents = util::read(&self.agents);
        if ids.len() == agents.len() {
            return agents.values().cloned().collect();
        }
        ids.iter()
            .filter_map(|id| agents.get(*id).cloned())
            .collect()
    }
}
