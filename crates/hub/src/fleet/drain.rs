//! Drains at the hub (`hub agent drain|resume`, docs/design.md, "Drain"): an agent's own
//! desired settings `accept_jobs: false` and `drain_deadline_ms`, changed as every
//! desired setting is (stored, a new generation, the agent's poll woken). The dispatcher
//! gives a draining agent no queued job; its pinned jobs wait (the runner refuses them
//! until the drain ends); the agent cancels what still runs at the deadline.

use super::{Fleet, FleetError};
use crate::proto::hub::{AgentView, DesiredChange, DesiredSettings, DrainRequest};
use crate::proto::selector::Selector;
use crate::store::Store;

/// The longest drain deadline the hub takes.
const MAX_DEADLINE_SECS: u64 = 366 * 24 * 3600;

impl<S: Store> Fleet<S> {
    /// Drains the agents `req` names that a token reaching agents matching `reach` may
    /// act on; each as it is now.
    pub async fn drain(
        &self,
        req: &DrainRequest,
        reach: Option<&Selector>,
    ) -> Result<Vec<AgentView>, FleetError> {
        let deadline_ms = match req.deadline_secs {
            Some(s) if s > MAX_DEADLINE_SECS => {
                return Err(FleetError::BadSetting {
                    field: "deadline_secs".into(),
                    why: format!("{s} is beyond a year ({MAX_DEADLINE_SECS} s)"),
                })
            }
            Some(s) => Some(crate::util::unix_now_ms().saturating_add(s * 1000)),
            None => None,
        };
        // A drain given again without a deadline keeps the one in force.
        let change = DesiredChange {
            set: DesiredSettings {
                accept_jobs: Some(false),
                drain_deadline_ms: deadline_ms,
                ..DesiredSettings::default()
            },
            clear: Vec::new(),
        };
        self.change_each(req, reach, &change, "drained").await
    }

    /// Ends the hub's drain of the agents `req` names (a drain their host keeps stays),
    /// as [`Self::drain`] picks them.
    pub async fn resume(
        &self,
        req: &DrainRequest,
        reach: Option<&Selector>,
    ) -> Result<Vec<AgentView>, FleetError> {
        if req.deadline_secs.is_some() {
            return Err(FleetError::BadSetting {
                field: "deadline_secs".into(),
                why: "a resume has no deadline".into(),
            });
        }
        let change = DesiredChange {
            set: DesiredSettings::default(),
            clear: vec!["accept_jobs".into(), "drain_deadline_ms".into()],
        };
        self.change_each(req, reach, &change, "resumed").await
    }

    /// Applies `change` to each agent `req` names; a selector picks, among those it
    /// matches, the ones `reach` matches too.
    async fn change_each(
        &self,
        req: &DrainRequest,
        reach: Option<&Selector>,
        change: &DesiredChange,
        what: &str,
    ) -> Result<Vec<AgentView>, FleetError> {
        let ids = match (&req.agent, &req.selector) {
            (Some(id), None) => {
                if self.reach(id, reach)?.is_revoked() {
                    return Err(FleetError::Revoked(id.clone()));
                }
                vec![id.clone()]
            }
            (None, Some(text)) => {
                let selector = Selector::parse(text).map_err(|e| FleetError::BadSetting {
                    field: "selector".into(),
                    why: e.to_string(),
                })?;
                let ids = self.matching(&selector, false);
                if ids.is_empty() {
                    return Err(FleetError::BadSetting {
                        field: "selector".into(),
                        why: format!("no agent matches {selector}"),
                    });
                }
                let reached: Vec<String> = ids
                    .iter()
                    .filter(|id| self.reach(id, reach).is_ok())
                    .cloned()
                    .collect();
                if let (true, Some(sel)) = (reached.is_empty(), reach) {
                    return Err(FleetError::OutOfScope(format!(
                        "this token reaches only agents whose hub labels match {sel}; none of the {} agents matching {selector} does",
                        ids.len()
                    )));
                }
                reached
            }
            _ => {
                return Err(FleetError::BadSetting {
                    field: "agent".into(),
                    why: "give exactly one of agent and selector".into(),
                })
            }
        };
        self.change_ids(&ids, change, what).await
    }

    async fn change_ids(
        &self,
        ids: &[String],
        change: &DesiredChange,
        what: &str,
    ) -> Result<Vec<AgentView>, FleetError> {
        let mut views = Vec::with_capacity(ids.len());
        for id in ids {
            self.change(Some(id), change).await?;
            views.push(self.view_of(id)?);
        }
        tracing::info!(agents = ids.len(), "agents {what} at the hub");
        Ok(views)
    }
}
