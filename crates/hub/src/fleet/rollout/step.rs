//! One step of a rollout, decided from what is stored and what the agents report: no
//! I/O, so that every rule below is a unit test.
//!
//! Forward (`running`; `paused`, `halted` and `stopped` only observe): members given the
//! version are watched until they commit, roll back or fail; a rollback anywhere halts;
//! failures past the allowance stop; the members of the waves begun are given the
//! version while fewer than `max_parallel` are under way, a member that is not connected
//! when its turn comes is deferred (it is given the version when it is back, and never
//! holds up a wave); a wave is over once none of its members is pending or under way,
//! and the next one starts once the soak since the last commit has passed. After the
//! last wave the rollout is `done`.
//!
//! A member's word alone moves nothing (docs/hub.md, "Rollouts"): its commit counts only
//! once the hub served that very agent the version's artifact after it was given the
//! version ([`Seen::fetched_ms`]); a claim without it is ignored (and said, in the
//! member's row and [`Step::unproven`]), and holds its wave up. A member that stops
//! running the version before its wave's soak is over has failed.
//!
//! Back (`rolling_back`): the members that committed are given the version each ran
//! before (with `rollback`), in the same waves and bound, until none is left.

use super::plan;
use crate::proto::report::UpgradeReport;
use crate::proto::rollout::{
    COMMITTED, DEFERRED, DONE, EXPIRED, FAILED, GIVEN, HALTED, MEMBER_ROLLED_BACK, PAUSED, PENDING,
    REVERTED, REVERTING, ROLLED_BACK, ROLLING_BACK, RUNNING, SKIPPED, STOPPED,
};
use crate::store::rollouts::{MemberRow, RolloutRow};

/// The agent's upgrade states the hub reads here.
const PENDING_COMMIT: &str = "pending_commit";
const UPGRADE_COMMITTED: &str = "committed";
const UPGRADE_ROLLED_BACK: &str = "rolled_back";
const UPGRADE_FAILED: &str = "failed";
const UPGRADE_REFUSED: &str = "refused";

/// What the hub knows of a member's agent now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Seen {
    /// Enrolled and not revoked.
    pub known: bool,
    pub connected: bool,
    /// The version it reports running.
    pub version: Option<String>,
    pub upgrade: Option<UpgradeReport>,
    /// The version its own desired settings ask for.
    pub own_version: Option<String>,
    /// Its report is of its own latest settings or newer: an end it reports is of what
    /// it was given, not left over from before.
    pub fresh: bool,
    /// How long since it was last seen, when it is not connected (ms).
    pub away_ms: u64,
    /// When the hub last served it the rollout's version's artifact to its last byte.
    pub fetched_ms: Option<u64>,
}

/// How far the hubs' clocks may disagree: a fetch this much before a member was given
/// the version (by another replica's clock) still counts as after.
pub(super) const CLOCK_SKEW_MS: u64 = 5_000;

/// What a member that claims the version without evidence is told, in its row.
pub(super) const UNPROVEN: &str =
    "reports the version, but the hub never served this agent its artifact after giving it: not counted";

impl Seen {
    /// Runs `version`, committed.
    fn runs(&self, version: &str) -> bool {
        self.version.as_deref() == Some(version)
            && self
                .upgrade
                .as_ref()
                .is_none_or(|u| u.state != PENDING_COMMIT)
    }

    /// Committed to `version`: what its agent says once the new binary has been healthy
    /// for its settle period (an agent just switched reports the version before it says
    /// whether it commits).
    fn committed(&self, version: &str) -> bool {
        self.version.as_deref() == Some(version)
            && self.upgrade.as_ref().is_some_and(|u| {
                u.state == UPGRADE_COMMITTED && u.target.as_deref() == Some(version)
            })
    }

    /// Past the point of no return towards `version`: its binary switched.
    fn started(&self, version: &str) -> bool {
        self.version.as_deref() == Some(version)
            || self.upgrade.as_ref().is_some_and(|u| {
                u.target.as_deref() == Some(version)
                    && matches!(
                        u.state.as_str(),
                        "switching" | PENDING_COMMIT | UPGRADE_COMMITTED
                    )
            })
    }

    /// It was served the artifact after it was given the version at `given_ms` (any
    /// fetch, for a member never given it by this rollout).
    fn fetched_since(&self, given_ms: Option<u64>) -> bool {
        self.fetched_ms
            .is_some_and(|f| given_ms.is_none_or(|g| f.saturating_add(CLOCK_SKEW_MS) >= g))
    }

    /// Busy with an upgrade to `version` (a failed one tried again, say).
    fn upgrading(&self, version: &str) -> bool {
        self.upgrade.as_ref().is_some_and(|u| {
            u.target.as_deref() == Some(version)
                && matches!(
                    u.state.as_str(),
                    "downloading" | "verifying" | "draining" | "switching" | PENDING_COMMIT
                )
        })
    }

    /// Its upgrade to `version` ended in `states`: the error it gives.
    fn upgrade_ended(&self, version: &str, states: &[&str]) -> Option<String> {
        let u = self.upgrade.as_ref()?;
        (u.target.as_deref() == Some(version) && states.contains(&u.state.as_str())).then(|| {
            u.error
                .clone()
                .unwrap_or_else(|| format!("upgrade {}", u.state))
        })
    }
}

/// What the rest of the hub says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Facts {
    pub now_ms: u64,
    /// The version's fleet halt, in words, if halted.
    pub halted: Option<String>,
    /// The fleet's own desired version.
    pub fleet_version: Option<String>,
    /// Another rollout that is not over holds agents: the fleet's version is not this
    /// one's to set.
    pub other_active: bool,
}

/// A member given the version and away this long is deferred: it takes the version when
/// it is back, and holds up nothing meanwhile.
pub(super) const GIVEN_AWAY_MS: u64 = 5 * 60 * 1000;

/// A desired version to put in one agent's own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Act {
    /// `version` (with `rollback` when going back).
    Give {
        agent: String,
        version: String,
        rollback: bool,
    },
    /// The fleet's version, once a rollout of the whole fleet is done.
    FleetVersion(String),
    /// Its own version (and rollback) cleared: the fleet's is the same.
    Clear(String),
}

/// What one step decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Step {
    /// The members whose row changed.
    pub members: Vec<MemberRow>,
    pub wave: usize,
    pub last_commit_ms: Option<u64>,
    /// A new state and why.
    pub moved: Option<(String, Option<String>)>,
    /// Desired versions to set once the step is stored.
    pub after: Vec<Act>,
    /// What must be done before a final state is stored (it is the last word).
    pub before: Vec<Act>,
    /// Members whose claim of the version was ignored for want of evidence.
    pub unproven: Vec<String>,
}

/// Decides one step of `r` over `members` (in order), with `seen` giving each member's
/// agent (same order).
pub(super) fn step(r: &RolloutRow, members: &[MemberRow], seen: &[Seen], f: &Facts) -> Step {
    let mut m: Vec<MemberRow> = members.to_vec();
    let mut out = Step {
        wave: r.wave,
        last_commit_ms: r.last_commit_ms,
        ..Step::default()
    };
    let back = r.state == ROLLING_BACK;
    observe(r, &mut m, seen, f, &mut out);
    if back {
        revert(r, &mut m, seen, f, &mut out);
    } else {
        judge(r, &m, members, f, &mut out);
        if r.state == RUNNING && out.moved.is_none() {
            advance(r, &mut m, seen, f, &mut out);
        }
    }
    // Members under way keep what they were given, whoever changed it meanwhile.
    let given: std::collections::HashSet<String> = out
        .after
        .iter()
        .filter_map(|a| match a {
            Act::Give { agent, .. } => Some(agent.clone()),
            _ => None,
        })
        .collect();
    for (row, s) in m.iter().zip(seen) {
        let (version, rollback) = match row.state.as_str() {
            GIVEN => (Some(r.version.clone()), false),
            REVERTING => (row.from_version.clone(), true),
            _ => continue,
        };
        if let Some(version) = version {
            if s.known && !given.contains(&row.agent) && s.own_version.as_ref() != Some(&version) {
                out.after.push(Act::Give {
                    agent: row.agent.clone(),
                    version,
                    rollback,
                });
            }
        }
    }
    out.members = m
        .into_iter()
        .zip(members)
        .filter(|(now, was)| now != *was)
        .map(|(now, _)| now)
        .collect();
    out
}

fn set(row: &mut MemberRow, state: &str, now: u64, error: Option<String>) {
    row.state = state.to_owned();
    row.ended_ms = Some(now);
    row.error = error;
}

/// Members under way (or failed, which may still commit) as their agents report them.
/// An end is taken only from a report of what the member was given (`fresh`).
fn observe(r: &RolloutRow, m: &mut [MemberRow], seen: &[Seen], f: &Facts, out: &mut Step) {
    let now = f.now_ms;
    let back = r.state == ROLLING_BACK;
    for (row, s) in m.iter_mut().zip(seen) {
        // Going back, a member that could not is left as it is.
        let watched = match row.state.as_str() {
            GIVEN | REVERTING => true,
            FAILED => !back,
            _ => false,
        };
        if !watched {
            continue;
        }
        if !s.known {
            set(row, SKIPPED, now, Some("revoked".into()));
            continue;
        }
        if row.state == REVERTING {
            let Some(from) = row.from_version.clone() else {
                continue;
            };
            if s.runs(&from) {
                set(row, REVERTED, now, None);
            } else if let Some(e) = s
                .upgrade_ended(&from, &[UPGRADE_FAILED, UPGRADE_REFUSED])
                .filter(|_| s.fresh)
            {
                set(row, FAILED, now, Some(format!("going back to {from}: {e}")));
            }
            continue;
        }
        if s.committed(&r.version) && s.fetched_since(row.given_ms) {
            set(row, COMMITTED, now, None);
            out.last_commit_ms = Some(now);
        } else if (s.committed(&r.version) || s.runs(&r.version)) && !s.fetched_since(row.given_ms)
        {
            // Its word alone: ignored, said, and the wave waits.
            out.unproven.push(row.agent.clone());
            if row.error.as_deref() != Some(UNPROVEN) {
                row.error = Some(UNPROVEN.into());
            }
        } else if let Some(e) = s
            .upgrade_ended(&r.version, &[UPGRADE_ROLLED_BACK])
            .filter(|_| s.fresh)
        {
            set(row, MEMBER_ROLLED_BACK, now, Some(e));
        } else if row.state == GIVEN {
            if let Some(e) = s
                .upgrade_ended(&r.version, &[UPGRADE_FAILED, UPGRADE_REFUSED])
                .filter(|_| s.fresh)
            {
                set(row, FAILED, now, Some(e));
            } else if !s.connected && s.away_ms >= GIVEN_AWAY_MS && !back {
                row.state = DEFERRED.into();
                row.error = Some("went away while it upgraded: it goes on when it is back".into());
            }
        }
    }
}

/// Halt, failures and deadline, for a rollout going forward.
fn judge(r: &RolloutRow, m: &[MemberRow], was: &[MemberRow], f: &Facts, out: &mut Step) {
    if r.deadline_ms.is_some_and(|d| f.now_ms >= d) {
        let committed = m.iter().filter(|x| x.state == COMMITTED).count();
        out.moved = Some((
            EXPIRED.into(),
            Some(format!(
                "its deadline passed with {committed} of {} members on {}",
                m.len(),
                r.version
            )),
        ));
        return;
    }
    if r.state == HALTED || r.state == STOPPED {
        return;
    }
    // A rollback stored before (and taken on by a resume) halts nothing again.
    let rolled: Vec<&MemberRow> = m
        .iter()
        .zip(was)
        .filter(|(x, w)| x.state == MEMBER_ROLLED_BACK && w.state != MEMBER_ROLLED_BACK)
        .map(|(x, _)| x)
        .collect();
    if let Some(why) = f.halted.clone().or_else(|| {
        rolled.first().map(|x| {
            format!(
                "{} rolled back on {}: {}",
                r.version,
                x.agent,
                x.error.as_deref().unwrap_or("")
            )
        })
    }) {
        out.moved = Some((HALTED.into(), Some(why)));
        return;
    }
    if r.state != RUNNING {
        return;
    }
    let failed: Vec<&MemberRow> = m.iter().filter(|x| x.state == FAILED).collect();
    if failed.len().saturating_sub(r.failures_accepted) > r.max_failures {
        let named: Vec<String> = failed
            .iter()
            .take(5)
            .map(|x| format!("{}: {}", x.agent, x.error.as_deref().unwrap_or("failed")))
            .collect();
        out.moved = Some((
            STOPPED.into(),
            Some(format!(
                "{} member(s) could not take {} (more than --max-failures {}): {}",
                failed.len(),
                r.version,
                r.max_failures,
                named.join("; ")
            )),
        ));
    }
}

/// Gives the version to the members whose turn it is, and moves from wave to wave.
fn advance(r: &RolloutRow, m: &mut [MemberRow], seen: &[Seen], f: &Facts, out: &mut Step) {
    let now = f.now_ms;
    let waves = m.iter().map(|x| x.wave + 1).max().unwrap_or(0);
    loop {
        let w = out.wave;
        let mut under_way = under_way(r, m, seen);
        for (row, s) in m.iter_mut().zip(seen) {
            if row.wave > w || !matches!(row.state.as_str(), PENDING | DEFERRED) {
                continue;
            }
            if !s.known {
                set(row, SKIPPED, now, Some("revoked".into()));
                continue;
            }
            if !s.connected {
                if row.state == PENDING {
                    row.state = DEFERRED.into();
                    row.error = Some("not connected when its wave came".into());
                }
                continue;
            }
            if s.runs(&r.version) && s.fetched_since(None) {
                // There already, with the artifact served to it by the hub: it keeps it.
                set(row, COMMITTED, now, None);
                row.given_ms = Some(now);
                give(out, row, &r.version, false);
                continue;
            }
            if under_way >= r.max_parallel {
                continue;
            }
            under_way += 1;
            row.state = GIVEN.into();
            row.given_ms = Some(now);
            row.error = None;
            give(out, row, &r.version, false);
        }
        // The earlier waves are over: a deferred member back and under way there holds
        // up nothing.
        let settled = m.iter().filter(|x| x.wave == w).all(|x| {
            matches!(
                x.state.as_str(),
                COMMITTED | FAILED | DEFERRED | SKIPPED | MEMBER_ROLLED_BACK
            )
        });
        if !settled {
            return;
        }
        let soaked = out
            .last_commit_ms
            .is_none_or(|t| now >= t.saturating_add(r.soak_ms));
        if w + 1 < waves {
            if !soaked {
                return;
            }
            // Healthy for the whole soak: a member that no longer runs the version
            // has failed, and the next wave waits for the judgement of it.
            if soak_broken(r, m, seen, w, now) {
                return;
            }
            out.wave = w + 1;
            continue;
        }
        // The last wave is over: nothing is under way anywhere.
        if m.iter().all(|x| x.state != GIVEN) {
            out.before = finish_forward(r, m, seen, f);
            out.moved = Some((DONE.into(), None));
        }
        return;
    }
}

/// Marks failed the members of wave `w` that committed and, connected, no longer run
/// the version; whether there was one.
fn soak_broken(r: &RolloutRow, m: &mut [MemberRow], seen: &[Seen], w: usize, now: u64) -> bool {
    let mut broken = false;
    for (row, s) in m.iter_mut().zip(seen) {
        if row.wave == w && row.state == COMMITTED && s.known && s.connected && !s.runs(&r.version)
        {
            let runs = s.version.as_deref().unwrap_or("nothing");
            let why = format!(
                "stopped running {} during its wave's soak (runs {runs})",
                r.version
            );
            set(row, FAILED, now, Some(why));
            broken = true;
        }
    }
    broken
}

/// Members upgrading now: given the version, or failed and trying again.
fn under_way(r: &RolloutRow, m: &[MemberRow], seen: &[Seen]) -> usize {
    m.iter()
        .zip(seen)
        .filter(|(x, s)| x.state == GIVEN || (x.state == FAILED && s.upgrading(&r.version)))
        .count()
}

fn give(out: &mut Step, row: &MemberRow, version: &str, rollback: bool) {
    out.after.push(Act::Give {
        agent: row.agent.clone(),
        version: version.to_owned(),
        rollback,
    });
}

/// A whole-fleet rollout leaves the version to the fleet's settings (agents that join
/// later get it), and its members' own settings to the fleet; a selected one (or one
/// that ends while another rollout holds agents, whose waves the fleet's version would
/// skip) keeps it in its members' own settings, and gives it to those still away, for
/// when they are back.
fn finish_forward(r: &RolloutRow, m: &[MemberRow], seen: &[Seen], f: &Facts) -> Vec<Act> {
    let mut acts = Vec::new();
    if r.selector.is_none() && !f.other_active {
        if f.fleet_version.as_deref() != Some(r.version.as_str()) {
            acts.push(Act::FleetVersion(r.version.clone()));
        }
        for (row, s) in m.iter().zip(seen) {
            if s.known && s.own_version.as_deref() == Some(r.version.as_str()) {
                acts.push(Act::Clear(row.agent.clone()));
            }
        }
    } else {
        for (row, s) in m.iter().zip(seen) {
            if row.state == DEFERRED && s.known && s.own_version.as_deref() != Some(&r.version) {
                acts.push(Act::Give {
                    agent: row.agent.clone(),
                    version: r.version.clone(),
                    rollback: false,
                });
            }
        }
    }
    acts
}

/// Takes the members that committed back, wave by wave.
fn revert(r: &RolloutRow, m: &mut [MemberRow], seen: &[Seen], f: &Facts, out: &mut Step) {
    let now = f.now_ms;
    let waves = m.iter().map(|x| x.wave + 1).max().unwrap_or(0);
    let can_go_back = |x: &MemberRow| {
        x.state == COMMITTED
            && x.from_version
                .as_deref()
                .is_some_and(|v| v != r.version.as_str())
    };
    // Given the version but not switched to it (a halt withholds it, or the agent is
    // away): taken back at once, whatever its wave, so nothing is left waiting for it.
    for (row, s) in m.iter_mut().zip(seen.iter()) {
        if row.state == GIVEN && !(s.connected && s.started(&r.version)) {
            match row.from_version.clone() {
                Some(from) if from != r.version => {
                    row.state = REVERTING.into();
                    row.ended_ms = None;
                    give(out, row, &from, true);
                }
                _ => set(row, SKIPPED, now, Some("aborted before it switched".into())),
            }
        }
    }
    loop {
        let w = out.wave;
        let mut under_way = m
            .iter()
            .zip(seen)
            .filter(|(x, s)| x.state == GIVEN || (x.state == REVERTING && s.connected))
            .count();
        for (row, s) in m.iter_mut().zip(seen) {
            if row.wave > w || !can_go_back(row) || !s.known {
                continue;
            }
            // An agent away takes it when it is back, without holding a place.
            if s.connected {
                if under_way >= r.max_parallel {
                    continue;
                }
                under_way += 1;
            }
            row.state = REVERTING.into();
            row.given_ms = Some(now);
            row.ended_ms = None;
            if let Some(from) = row.from_version.clone() {
                give(out, row, &from, true);
            }
        }
        // A member away holds up nothing: it goes back when it returns.
        let settled = m
            .iter()
            .zip(seen)
            .filter(|(x, _)| x.wave <= w)
            .all(|(x, s)| {
                !can_go_back(x) && x.state != GIVEN && !(x.state == REVERTING && s.connected)
            });
        if !settled {
            return;
        }
        if w + 1 < waves {
            out.wave = w + 1;
            continue;
        }
        let mut before = Vec::new();
        for (row, s) in m.iter().zip(seen) {
            let to_fleet = f.fleet_version.is_none() || f.fleet_version == row.from_version;
            if row.state == REVERTED && s.known && to_fleet {
                before.push(Act::Clear(row.agent.clone()));
            }
        }
        out.before = before;
        out.moved = Some((ROLLED_BACK.into(), None));
        return;
    }
}

/// The members' waves for a rollout of `selection` (ids with their labels in force).
pub(super) fn members_of(
    selection: Vec<(String, crate::proto::labels::Labels, Option<String>)>,
    sizes_of: impl Fn(usize) -> Vec<usize>,
) -> Vec<MemberRow> {
    let from: std::collections::HashMap<&str, Option<String>> = selection
        .iter()
        .map(|(id, _, v)| (id.as_str(), v.clone()))
        .collect();
    let ordered = plan::order(selection.iter().map(|(id, l, _)| (id.as_str(), l)));
    let sizes = sizes_of(ordered.len());
    plan::assign(ordered, &sizes)
        .into_iter()
        .enumerate()
        .map(|(position, (agent, wave))| MemberRow {
            from_version: from.get(agent.as_str()).cloned().flatten(),
            agent,
            wave,
            position,
            state: PENDING.into(),
            ..MemberRow::default()
        })
        .collect()
}

/// A paused rollout: what a resume finds.
pub(super) fn is_resumable(state: &str) -> bool {
    matches!(state, PAUSED | HALTED | STOPPED)
}

#[cfg(test)]
mod tests;
