//! Agents by label, for the dispatcher (docs/design.md, invariant 17): a round looks only
//! at the agents a queued selector can match, not at the whole fleet. An `=` or `in`
//! requirement narrows to the agents with that label, an existence one to those with the
//! key; a selector of only `!=`, `notin` and `!key` narrows nothing. The round still
//! matches every candidate against the whole selector: the index only says where to look.
//!
//! Kept up to date wherever an agent's labels in force change (a report with new host
//! labels, the hub's labels, an enrolment under the id, another replica's word), through
//! `Registry::reindex`.

use std::collections::{HashMap, HashSet};

use crate::proto::labels::Labels;
use crate::proto::selector::{Requirement, Selector};

#[derive(Default)]
pub(super) struct LabelIndex {
    /// key → value → the agents with that label in force.
    by_label: HashMap<String, HashMap<String, HashSet<String>>>,
    /// Each agent's labels as indexed.
    of: HashMap<String, Labels>,
}

impl LabelIndex {
    /// Indexes `id` under `labels` (its labels in force now).
    pub(super) fn set(&mut self, id: &str, labels: &Labels) {
        if self.of.get(id) == Some(labels) {
            return;
        }
        if let Some(old) = self.of.remove(id) {
            for (k, v) in old {
                let Some(values) = self.by_label.get_mut(&k) else {
                    continue;
                };
                if let Some(ids) = values.get_mut(&v) {
                    ids.remove(id);
                    if ids.is_empty() {
                        values.remove(&v);
                    }
                }
                if values.is_empty() {
                    self.by_label.remove(&k);
                }
            }
        }
        for (k, v) in labels {
            self.by_label
                .entry(k.clone())
                .or_default()
                .entry(v.clone())
                .or_default()
                .insert(id.to_owned());
        }
        self.of.insert(id.to_owned(), labels.clone());
    }

    /// The agents `selector` can match: those of its narrowest `=`, `in` or existence
    /// requirement; `None` when it has none (every agent is a candidate).
    pub(super) fn candidates(&self, selector: &Selector) -> Option<HashSet<&str>> {
        let mut best: Option<HashSet<&str>> = None;
        for r in selector.requirements() {
            let values = self.by_label.get(r.key());
            let found: HashSet<&str> = match r {
                Requirement::Eq(_, v) => values
                    .and_then(|vs| vs.get(v))
                    .into_iter()
                    .flatten()
                    .map(String::as_str)
                    .collect(),
                Requirement::In(_, wanted) => wanted
                    .iter()
                    .filter_map(|v| values?.get(v))
                    .flatten()
                    .map(String::as_str)
                    .collect(),
                Requirement::Exists(_) => values
                    .into_iter()
                    .flat_map(|vs| vs.values())
                    .flatten()
                    .map(String::as_str)
                    .collect(),
                Requirement::Ne(..) | Requirement::NotIn(..) | Requirement::Absent(_) => continue,
            };
            if best.as_ref().is_none_or(|b| found.len() < b.len()) {
                best = Some(found);
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn ids(set: Option<HashSet<&str>>) -> Option<Vec<&str>> {
        set.map(|s| {
            let mut v: Vec<&str> = s.into_iter().collect();
            v.sort_unstable();
            v
        })
    }

    #[test]
    fn a_selector_narrows_to_the_agents_of_its_tightest_requirement() {
        let mut ix = LabelIndex::default();
        ix.set("a", &labels(&[("queue", "build"), ("gpu", "a100")]));
        ix.set("b", &labels(&[("queue", "build")]));
        ix.set("c", &labels(&[("queue", "test")]));
        let sel = |t: &str| Selector::parse(t).expect("selector");
        assert_eq!(
            ids(ix.candidates(&sel("queue=build"))),
            Some(vec!["a", "b"])
        );
        assert_eq!(ids(ix.candidates(&sel("queue=build,gpu"))), Some(vec!["a"]));
        assert_eq!(
            ids(ix.candidates(&sel("queue in (test,build)"))),
            Some(vec!["a", "b", "c"])
        );
        assert_eq!(ids(ix.candidates(&sel("queue=nowhere"))), Some(vec![]));
        assert_eq!(ids(ix.candidates(&sel("queue!=build"))), None, "all");
        // Relabelled: the old labels no longer find it, the new ones do.
        ix.set("b", &labels(&[("queue", "test")]));
        assert_eq!(ids(ix.candidates(&sel("queue=build"))), Some(vec!["a"]));
        assert_eq!(ids(ix.candidates(&sel("queue=test"))), Some(vec!["b", "c"]));
        ix.set("a", &Labels::new());
        assert_eq!(ids(ix.candidates(&sel("gpu"))), Some(vec![]));
    }
}
