//! What the fleet's operations can run into; the HTTP layer maps each to a status.

use thiserror::Error;

use crate::store::StoreError;

#[derive(Debug, Error)]
pub enum FleetError {
    #[error("unknown agent {0:?}")]
    NoSuchAgent(String),
    #[error("the token is not valid for agent {0:?}")]
    BadToken(String),
    #[error("agent {0:?} was revoked; to give its id to a new agent (with none of the old one's settings, labels or jobs): `railgrid hub agent add {0} --reuse-revoked-id`")]
    Revoked(String),
    #[error("agent id {id:?} was revoked{at}: the id of a revoked agent is never given to an enrolling host; enrol this one under another --agent-id (or, deliberately, `railgrid hub agent add {id} --reuse-revoked-id`)")]
    IdRetired { id: String, at: String },
    #[error("agent {0:?} is already enrolled; revoke it first to give it a new token")]
    Exists(String),
    #[error("invalid agent id {id:?}: {why}")]
    BadId { id: String, why: &'static str },
    #[error("{field}: {why}")]
    BadSetting { field: String, why: String },
    #[error("no job {0:?}")]
    NoSuchJob(String),
    #[error("job {0:?} exists already; give another --id")]
    JobExists(String),
    #[error("agent {agent:?} has {max} jobs not done yet, the most it may have waiting (hub serve --max-open-jobs): wait for some to finish, or cancel some")]
    TooManyJobs { agent: String, max: usize },
    #[error("the fleet's queue holds {0} jobs, the most it may: wait for some to be taken, or cancel some")]
    QueueFull(usize),
    #[error("the token is not valid for job {0:?}")]
    JobToken(String),
    #[error("agent {0:?} was revoked: a job pinned to it is refused (its id is never given to another host by itself)")]
    RevokedAgent(String),
    #[error("no release {0:?} is published")]
    NoSuchRelease(String),
    #[error("release {0:?} is not halted")]
    NotHalted(String),
    #[error("release {version} is halted ({why}): `railgrid hub release resume {version}` lifts the halt")]
    Halted { version: String, why: String },
    #[error("release {version} is not published for the platform of {agents}: publish it with `railgrid hub release publish --os OS --arch ARCH`, or select fewer agents")]
    NotForPlatform { version: String, agents: String },
    #[error("not an enrolment token of this hub (hub enrol-token create makes one)")]
    BadEnrolToken,
    #[error("enrolment token {id} enrols no host: {why}")]
    EnrolRefused { id: String, why: &'static str },
    #[error("agent id {id:?} is taken: enrolled {first}; this host, {this}, needs another --agent-id (or revoke the first: `railgrid hub agent revoke {id}`)")]
    IdTaken {
        id: String,
        first: String,
        this: String,
    },
    #[error("{0}")]
    OutOfScope(String),
    #[error("no rollout {0:?}")]
    NoSuchRollout(String),
    /// The agents another rollout still holds: one rollout per agent at a time.
    #[error("{}", rollout_clash(.0))]
    RolloutClash(Vec<(String, String)>),
    #[error("rollout {id} is {state}: {why}")]
    RolloutState {
        id: String,
        state: String,
        why: String,
    },
    #[error(
        "this hub replica has lost its database and may be behind the others: try another replica"
    )]
    StoreLost,
    #[error("this hub replica is catching up with agent {0:?}'s state: retry in a moment")]
    CatchingUp(String),
    /// Answered 400 naming `observed_generation`: the agent then reports 0 and takes the
    /// hub's own desired state as a reset (docs/hub.md, "Generations").
    #[error("observed_generation {observed} is ahead of this hub's generation {current} for agent {agent:?} (a hub restored from an older backup, or renumbered): report 0 and take this hub's desired state")]
    AheadOfHub {
        agent: String,
        observed: u64,
        current: u64,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn rollout_clash(clash: &[(String, String)]) -> String {
    let shown: Vec<String> = clash
        .iter()
        .take(5)
        .map(|(agent, rollout)| format!("{agent} (in {rollout})"))
        .collect();
    let more = clash.len().saturating_sub(shown.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "another rollout holds {}{more}: wait for it to end, or `railgrid hub rollout abort ID`",
        shown.join(", ")
    )
}
