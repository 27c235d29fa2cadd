//! The hub's admin API (`/v1/admin/…`, admin token): enrolment, the fleet's view of its
//! agents, and desired settings per agent and for the whole fleet.

use serde::{Deserialize, Serialize};

use super::desired::DesiredState;
use super::report::AgentReport;

/// `POST /v1/admin/agents` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrolRequest {
    pub id: String,
    /// Takes the id of a revoked agent for a new one, which starts with none of the old
    /// one's settings, labels or jobs (without it, a revoked id is refused).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reuse_revoked: bool,
}

/// The answer to an enrolment: the agent's token, shown this once (the hub keeps only
/// its SHA-256).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enrolled {
    pub id: String,
    pub token: String,
}

/// One agent as the hub knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentView {
    pub id: String,
    /// Unix seconds.
    pub enrolled_at: u64,
    #[serde(default)]
    pub revoked: bool,
    /// Unix seconds of the last reconcile; `None` before the first one.
    #[serde(default)]
    pub last_seen: Option<u64>,
    /// True while one of its long polls is held open by this hub.
    #[serde(default)]
    pub connected: bool,
    /// The generation of its effective desired state (fleet and own settings merged).
    pub desired_generation: u64,
    /// The generation it reported applied last.
    #[serde(default)]
    pub observed_generation: u64,
    /// Its latest report.
    #[serde(default)]
    pub report: Option<AgentReport>,
    /// The labels in force: the reported ones (the host's, `os`, `arch`, `hostname`),
    /// the hub's over them.
    #[serde(default)]
    pub labels: crate::labels::Labels,
    /// The labels the hub set (`hub agent label`).
    #[serde(default)]
    pub hub_labels: crate::labels::Labels,
    /// False while the hub drains it (`hub agent drain`); what the host says of the
    /// drain in force is in its report.
    #[serde(default = "yes")]
    pub accept_jobs: bool,
    /// When the hub's drain cancels what still runs there (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_deadline_ms: Option<u64>,
}

fn yes() -> bool {
    true
}

impl AgentView {
    /// The drain in force, as a listing shows it: what the host reports, or the hub's
    /// own word until the host has heard it.
    pub fn drain_summary(&self, now_ms: u64) -> Option<String> {
        match self.report.as_ref().and_then(|r| r.drain.as_ref()) {
            Some(d) => Some(d.summary(now_ms)),
            None if !self.accept_jobs => Some("draining (not yet taken by the agent)".into()),
            None => None,
        }
    }
}

/// `POST /v1/admin/drain` and `/v1/admin/resume`: the agents, by id or by selector.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRequest {
    pub agent: Option<String>,
    pub selector: Option<String>,
    /// Drain only: cancel what still runs this many seconds from now.
    pub deadline_secs: Option<u64>,
}

/// `POST /v1/admin/agents/{id}/labels`: the hub's labels to set and to remove.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelChange {
    #[serde(default)]
    pub set: crate::labels::Labels,
    #[serde(default)]
    pub remove: Vec<String>,
}

/// Declares every desired setting once: its name (the field, what `clear` takes, what
/// errors list), its type, what it means and the check a value set must pass. A new
/// setting is one line here; merging, clearing and checking follow.
macro_rules! desired_settings {
    ($( $(#[doc = $doc:literal])* $name:ident: $ty:ty $(, checked by $check:path)?; )*) => {
        /// Desired settings of one scope (the fleet, or one agent's overrides). A field
        /// left out is not set here: an agent's own setting wins over the fleet's, field by
        /// field, and a setting nobody sets keeps the agent's own (config file) value.
        #[serde_with::skip_serializing_none]
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct DesiredSettings {
            $( $(#[doc = $doc])* pub $name: Option<$ty>, )*
        }

        /// Every desired setting by name, as `clear` takes them and errors list them.
        pub const SETTINGS: &[&str] = &[$(stringify!($name)),*];

        impl DesiredSettings {
            /// `self` with every field `over` sets taken from `over`.
            pub fn overlaid(&self, over: &DesiredSettings) -> DesiredSettings {
                DesiredSettings {
                    $( $name: over.$name.as_ref().or(self.$name.as_ref()).cloned(), )*
                }
            }

            /// Unsets the setting called `name`; false when no setting is called that.
            pub fn clear(&mut self, name: &str) -> bool {
                match name {
                    $( stringify!($name) => { self.$name = None; true } )*
                    _ => false,
                }
            }

            /// The first setting given here whose value its check refuses, and why.
            pub fn refused(&self) -> Option<(&'static str, String)> {
                $($(
                    if let Some(v) = &self.$name {
                        if let Err(why) = $check(v) {
                            return Some((stringify!($name), why));
                        }
                    }
                )?)*
                None
            }
        }
    };
}

desired_settings! {
    runner_enabled: bool;
    max_jobs: usize, checked by limit;
    max_jobs_per_owner: usize, checked by limit;
    /// The agent version wanted (acted on by the self-upgrade).
    version: String, checked by version;
    /// True: `version` may be older than what runs (an explicit rollback).
    rollback: bool;
    /// False: the agent is drained (`hub agent drain`): it gets no new job.
    accept_jobs: bool;
    /// When the drain cancels what still runs on the agent (Unix ms).
    drain_deadline_ms: u64;
    /// True: a disabled runner stops at once (`desired set --runner-enabled false
    /// --force`) instead of draining first.
    force_stop: bool;
    /// The network jobs reach unless they ask for less (`none`, `open`; docs/security.md,
    /// "Egress"): the host's `runner.network` when no scope sets it.
    network: crate::job::Network;
}

/// The largest admission limit the hub passes on (the runner's own bound).
pub const MAX_LIMIT: usize = 100_000;

fn limit(n: &usize) -> Result<(), String> {
    if *n == 0 || *n > MAX_LIMIT {
        return Err(format!("{n} is out of range (1 to {MAX_LIMIT})"));
    }
    Ok(())
}

fn version(v: &String) -> Result<(), String> {
    if !super::desired::is_version(v) {
        return Err(format!("{v:?} is not a version (such as 1.4.0)"));
    }
    Ok(())
}

/// `PUT /v1/admin/desired/…` body: the fields to set (`set`) and those to unset
/// (`clear`, by name) in one scope; every accepted change bumps the generation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredChange {
    #[serde(default)]
    pub set: DesiredSettings,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clear: Vec<String>,
}

/// `GET /v1/admin/desired/…`: one scope's own settings, and for an agent also what it is
/// sent (fleet and own merged).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredView {
    /// `fleet`, or the agent's id.
    pub scope: String,
    /// The generation of this scope's last change (0: never set).
    pub generation: u64,
    pub settings: DesiredSettings,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective: Option<DesiredState>,
}

/// One version in `GET /v1/admin/releases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseView {
    pub version: String,
    pub artifacts: Vec<ReleaseArtifact>,
    /// Agents that report running it (committed, or with no upgrade of their own).
    #[serde(default)]
    pub agents: u64,
    /// Agents that run it but have not committed to it yet.
    #[serde(default)]
    pub pending: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<Halt>,
}

/// One platform's binary of a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseArtifact {
    pub os: String,
    pub arch: String,
    pub size: u64,
    pub sha256: String,
    /// The publisher key that signed it.
    pub key_id: String,
    /// Unix seconds.
    pub published_at: u64,
}

/// Why a version is not offered to agents that have not started it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Halt {
    /// The agent that rolled it back.
    pub agent: String,
    pub reason: String,
    /// Unix seconds.
    pub at: u64,
}

/// Every error of the hub's API: `{"error": "..."}` with the HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_settings_win_field_by_field() {
        let fleet = DesiredSettings {
            runner_enabled: Some(true),
            max_jobs: Some(8),
            max_jobs_per_owner: None,
            version: Some("1.0.0".into()),
            ..DesiredSettings::default()
        };
        let own = DesiredSettings {
            max_jobs: Some(2),
            max_jobs_per_owner: Some(1),
            ..DesiredSettings::default()
        };
        let merged = fleet.overlaid(&own);
        assert_eq!(merged.runner_enabled, Some(true));
        assert_eq!(merged.max_jobs, Some(2));
        assert_eq!(merged.max_jobs_per_owner, Some(1));
        assert_eq!(merged.version.as_deref(), Some("1.0.0"));
    }
}
