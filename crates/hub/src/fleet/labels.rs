//! The labels the hub sets on an agent (`hub agent label`), over the ones its host
//! reports: stored first, then taken in, as every change of the fleet is.

use std::sync::atomic::Ordering;

use super::{Fleet, FleetError};
use crate::proto::hub::AgentView;
use crate::proto::labels;
use crate::proto::selector::Selector;
use crate::store::{parse_labels, AgentRow, Labels, Store};
use crate::util;

/// The hub's labels of a stored agent; ones that no longer parse are left out (and
/// said), so that one bad row does not keep the hub from starting.
pub(super) fn stored_labels(row: &AgentRow) -> Labels {
    parse_labels("the hub database", &row.id, &row.labels).unwrap_or_else(|e| {
        tracing::error!(agent = %row.id, error = %crate::error_chain(&e), "the hub's labels of this agent do not parse; it has none until they are set again");
        Labels::new()
    })
}

impl<S: Store> Fleet<S> {
    /// The ids of the agents not revoked whose labels match `selector` now (and that are
    /// connected, with `connected_only`), in id order.
    pub(super) fn matching(&self, selector: &Selector, connected_only: bool) -> Vec<String> {
        let mut agents: Vec<String> = self
            .agents
            .all()
            .into_iter()
            .filter(|e| !e.is_revoked())
            .filter(|e| {
                let st = util::lock(&e.state);
                selector.matches(&st.labels())
                    && (!connected_only || self.connected(e, st.last_seen))
            })
            .map(|e| e.id.clone())
            .collect();
        agents.sort();
        agents
    }

    /// Agent `id`, if a token that reaches only agents matching `reach` (`None`: any)
    /// may act on it.
    pub fn reach(
        &self,
        id: &str,
        reach: Option<&Selector>,
    ) -> Result<std::sync::Arc<super::AgentEntry>, FleetError> {
        let entry = self.entry(id)?;
        if let Some(sel) = reach {
            self.check_scope(&entry, sel)?;
        }
        Ok(entry)
    }

    /// The labels the hub set on agent `id` (not those its host reports): what a secret's
    /// scope is matched against (docs/security.md, "Secrets").
    pub fn hub_labels(&self, id: &str) -> Result<Labels, FleetError> {
        let entry = self.entry(id)?;
        let labels = util::lock(&entry.state).hub_labels.clone();
        Ok(labels)
    }

    /// Sets `set` on agent `id` and removes `remove` (the hub's labels only: a label its
    /// host reports stays, under the hub's if both name a key), for a token that reaches
    /// only agents matching `reach`: the agent must match it before and after, so that
    /// a relabel moves no agent into a token's reach, nor out of it.
    pub async fn change_labels(
        &self,
        id: &str,
        set: &Labels,
        remove: &[String],
        reach: Option<&Selector>,
    ) -> Result<AgentView, FleetError> {
        let bad = |e: labels::LabelError| FleetError::BadSetting {
            field: "labels".into(),
            why: e.to_string(),
        };
        labels::check(set, false).map_err(bad)?;
        for k in remove {
            labels::check_key(k).map_err(bad)?;
        }
        let entry = self.entry(id)?;
        let _one = self.changes.lock().await;
        if let Some(sel) = reach {
            let mut after = util::lock(&entry.state).hub_labels.clone();
            self.check_scope(&entry, sel)?;
            for k in remove {
                after.remove(k);
            }
            after.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
            out_of_reach(id, &after, sel).map_err(|e| match e {
                FleetError::OutOfScope(why) => {
                    FleetError::OutOfScope(format!("{why} once relabelled"))
                }
                e => e,
            })?;
        }
        let Some((generation, now)) = self.store.change_labels(id, set, remove).await? else {
            return Err(FleetError::Revoked(id.to_owned()));
        };
        self.newest.fetch_max(generation, Ordering::AcqRel);
        let shown = labels::to_list(&now);
        {
            let mut st = util::lock(&entry.state);
            st.hub_labels = now;
            st.own.generation = st.own.generation.max(generation);
        }
        self.agents.reindex(&entry);
        self.announce(&entry);
        tracing::info!(agent = %id, labels = %shown, "the hub's labels of an agent changed");
        self.kick();
        Ok(self.view(&entry))
    }
}

/// Refuses agent `id` with hub labels `labels` to a token that reaches only agents
/// matching `sel`.
pub(super) fn out_of_reach(id: &str, labels: &Labels, sel: &Selector) -> Result<(), FleetError> {
    if sel.matches(labels) {
        return Ok(());
    }
    Err(FleetError::OutOfScope(format!(
        "this token reaches only agents whose hub labels match {sel}; agent {id} does not"
    )))
}
