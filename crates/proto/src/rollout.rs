//! Rollouts (`/v1/admin/rollouts`, docs/hub.md, "Rollouts"): a version taken by the
//! matching agents wave by wave, canaries first, each wave only once the one before has
//! committed and soaked, with a bound on how many agents are upgrading at once.

use serde::{Deserialize, Serialize};

/// The waves a rollout takes when none are given.
pub const DEFAULT_WAVES: &str = "1,10%,50%,100%";
/// Members upgrading at once, at most, when not given.
pub const DEFAULT_MAX_PARALLEL: usize = 10;
/// The most waves a rollout may have.
pub const MAX_WAVES: usize = 20;

/// Rollout states. A rollout that is `running`, `paused`, `halted` or `stopped` still
/// holds its agents (no other rollout may take them) and may go on (`rollout resume`);
/// `done`, `aborted`, `expired` and `rolled_back` are final. `rolling_back` takes the
/// members that committed back to the version each ran before.
pub const RUNNING: &str = "running";
pub const PAUSED: &str = "paused";
pub const HALTED: &str = "halted";
pub const STOPPED: &str = "stopped";
pub const DONE: &str = "done";
pub const ABORTED: &str = "aborted";
pub const EXPIRED: &str = "expired";
pub const ROLLING_BACK: &str = "rolling_back";
pub const ROLLED_BACK: &str = "rolled_back";

/// The states in which a rollout holds its agents.
pub const ACTIVE: &[&str] = &[RUNNING, PAUSED, HALTED, STOPPED, ROLLING_BACK];

/// True for a state a rollout never leaves.
pub fn is_final(state: &str) -> bool {
    !ACTIVE.contains(&state)
}

/// Member states, as stored: `pending` (its wave has not come, or no slot yet),
/// `given` (the version is in its desired state; it drains, downloads or switches),
/// `committed`, `rolled_back` (its watcher restored the previous binary), `failed` (it
/// could not download or verify the version: not its binary's fault), `deferred` (not
/// connected when its wave came: it takes the version when it returns), `skipped` (the
/// rollout ended before its turn), and, while rolling back, `reverting` and `reverted`.
pub const PENDING: &str = "pending";
pub const GIVEN: &str = "given";
pub const COMMITTED: &str = "committed";
pub const MEMBER_ROLLED_BACK: &str = "rolled_back";
pub const FAILED: &str = "failed";
pub const DEFERRED: &str = "deferred";
pub const SKIPPED: &str = "skipped";
pub const REVERTING: &str = "reverting";
pub const REVERTED: &str = "reverted";

/// `POST /v1/admin/rollouts`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutRequest {
    pub version: String,
    /// Only the agents whose labels match (all agents when absent).
    pub selector: Option<String>,
    /// Cumulative sizes: counts (`1`) or percentages (`10%`) of the selection
    /// ([`DEFAULT_WAVES`] when absent).
    pub waves: Option<String>,
    /// How long after the last commit of a wave the next one starts.
    #[serde(default)]
    pub soak_secs: u64,
    pub max_parallel: Option<usize>,
    /// Members that may fail to take the version before the rollout stops.
    #[serde(default)]
    pub max_failures: usize,
    /// The rollout stops where it is if it has not finished this long after its start.
    pub deadline_secs: Option<u64>,
}

/// `POST /v1/admin/rollouts/{id}/abort`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortRequest {
    /// Take the members that committed back to the version each ran before, wave by
    /// wave.
    #[serde(default)]
    pub rollback: bool,
}

/// One member of a rollout, as `rollout status` shows it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    pub agent: String,
    pub wave: usize,
    /// The stored state ([`PENDING`] …).
    pub state: String,
    /// What it does now, in words: `draining (waiting for 2 job(s))`, `switching
    /// (downloading)`, `not connected`, the error of a failure …
    pub detail: Option<String>,
    /// The version it ran when the rollout started.
    pub from_version: Option<String>,
    /// The version it reports now.
    pub version: Option<String>,
    /// When the version was put in its desired state (Unix ms).
    pub given_ms: Option<u64>,
    /// When it reached its last state (Unix ms).
    pub ended_ms: Option<u64>,
}

/// One wave: its members, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaveView {
    pub index: usize,
    /// `pending`, `active` or `done`.
    pub state: String,
    pub members: Vec<MemberView>,
}

/// A rollout as `rollout status` shows it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutView {
    pub id: String,
    pub version: String,
    pub selector: Option<String>,
    pub waves_spec: String,
    pub soak_secs: u64,
    pub max_parallel: usize,
    pub max_failures: usize,
    pub deadline_ms: Option<u64>,
    pub state: String,
    /// Why it is in its state (what halted or stopped it, who paused it …).
    pub reason: Option<String>,
    /// The wave under way (0-based).
    pub wave: usize,
    pub created_ms: u64,
    pub finished_ms: Option<u64>,
    /// What it waits for now, in words.
    pub waiting: Option<String>,
    /// Members by stored state.
    pub counts: std::collections::BTreeMap<String, usize>,
    /// Every wave with its members (empty in a listing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<WaveView>,
}
