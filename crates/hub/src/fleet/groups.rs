//! Fan-out (`hub job submit --select SEL --each`): one job per agent matching a selector
//! now, each pinned to its agent and so following the per-agent path, as one group that
//! `job list|wait|cancel --group` address together.

use super::{Fleet, FleetError};
use crate::proto::fleet_job::{HubGroupSubmit, HubGroupView, HubJobSubmit};
use crate::proto::selector::Selector;
use crate::store::Store;
use crate::util;

impl<S: Store> Fleet<S> {
    /// Submits one member per matching agent (not revoked; connected too with
    /// `connected_only`), in agent id order. A member that cannot be submitted stops the
    /// fan-out, and the error says which members were.
    /// `scope`: a scoped token's selector: only agents whose hub labels match are members.
    pub async fn submit_group(
        &self,
        req: HubGroupSubmit,
        scope: Option<&Selector>,
    ) -> Result<HubGroupView, FleetError> {
        let bad = |field: &str, why: String| FleetError::BadSetting {
            field: field.into(),
            why,
        };
        let HubGroupSubmit {
            selector,
            priority,
            connected_only,
            mut spec,
        } = req;
        let parsed = Selector::parse(&selector).map_err(|e| bad("selector", e.to_string()))?;
        let group = match spec.id.take() {
            Some(id) => id,
            None => super::token::new_job_id().map_err(|e| bad("spec.id", e.to_string()))?,
        };
        let mut agents = self.matching(&parsed, connected_only);
        if let Some(sel) = scope {
            agents.retain(|a| {
                self.entry(a)
                    .is_ok_and(|e| self.check_scope(&e, sel).is_ok())
            });
        }
        if agents.is_empty() {
            let which = if connected_only {
                "connected agent"
            } else {
                "agent"
            };
            return Err(bad(
                "selector",
                format!("no {which} matches {parsed}: a fan-out needs at least one"),
            ));
        }
        let member_id = |agent: &str| format!("{group}.{agent}");
        if let Some(long) = agents
            .iter()
            .find(|a| !crate::proto::spec::valid_id(&member_id(a)))
        {
            return Err(bad(
                "spec.id",
                format!(
                    "member {:?} is not a job id (GROUP.AGENT, 1-128 characters from A-Z a-z 0-9 . _ -): give a shorter --id",
                    util::clip(&member_id(long))
                ),
            ));
        }
        let mut jobs = Vec::with_capacity(agents.len());
        for agent in &agents {
            let mut spec = spec.clone();
            spec.id = Some(member_id(agent));
            let req = HubJobSubmit {
                agent: Some(agent.clone()),
                priority,
                spec,
                ..HubJobSubmit::default()
            };
            match self.submit(req, Some(&group), scope).await {
                Ok(v) => jobs.push(v),
                Err(e) if jobs.is_empty() => return Err(e),
                Err(e) => {
                    return Err(bad(
                        "group",
                        format!(
                            "{} of {} members of group {group} were submitted before member {} was refused ({}); cancel them with `railgrid hub job cancel --group {group}`",
                            jobs.len(),
                            agents.len(),
                            member_id(agent),
                            util::error_chain(&e)
                        ),
                    ))
                }
            }
        }
        tracing::info!(%group, selector = %parsed, members = jobs.len(), "fan-out submitted");
        Ok(HubGroupView { group, jobs })
    }
}
