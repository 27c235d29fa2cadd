//! What `rollout status` shows: each member as its agent reports it now, each wave, and
//! what the rollout waits for, in words.

use std::collections::BTreeMap;

use super::step::Seen;
use crate::proto::rollout::{
    MemberView, RolloutView, WaveView, DEFERRED, GIVEN, HALTED, PAUSED, PENDING, REVERTING,
    ROLLING_BACK, RUNNING, STOPPED,
};
use crate::store::rollouts::{MemberRow, RolloutRow};

/// Members named in a `waiting` text, at most.
const NAMED: usize = 5;

/// The state a member is shown in: one under way is `draining` or `switching`.
fn shown_state(m: &MemberRow, s: &Seen) -> String {
    if m.state != GIVEN {
        return m.state.clone();
    }
    match s.upgrade.as_ref().map(|u| u.state.as_str()) {
        Some("draining") => "draining".into(),
        _ => "switching".into(),
    }
}

fn detail(r: &RolloutRow, m: &MemberRow, s: &Seen) -> Option<String> {
    if !s.known {
        return Some("revoked".into());
    }
    match m.state.as_str() {
        GIVEN if m.error.as_deref() == Some(super::step::UNPROVEN) => m.error.clone(),
        GIVEN | REVERTING => {
            if !s.connected {
                return Some("not connected: it takes the version when it is back".into());
            }
            let target = if m.state == GIVEN {
                Some(r.version.as_str())
            } else {
                m.from_version.as_deref()
            };
            let u = s.upgrade.as_ref().filter(|u| u.target.as_deref() == target);
            Some(match u {
                Some(u) if u.state == "draining" => format!(
                    "draining: {}",
                    u.waiting.as_deref().unwrap_or("waiting for its jobs")
                ),
                Some(u) => u.state.replace('_', " "),
                None => "given the version; not started yet".into(),
            })
        }
        PENDING if !s.connected => Some("not connected".into()),
        _ => m.error.clone(),
    }
}

/// The view of `r`; `members` with what is seen of each (none in a listing but counts).
pub(super) fn build(
    r: &RolloutRow,
    members: &[MemberRow],
    seen: &[Seen],
    detailed: bool,
    now_ms: u64,
) -> RolloutView {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let views: Vec<MemberView> = members
        .iter()
        .zip(seen)
        .map(|(m, s)| {
            let state = shown_state(m, s);
            *counts.entry(state.clone()).or_default() += 1;
            MemberView {
                agent: m.agent.clone(),
                wave: m.wave,
                state,
                detail: detail(r, m, s),
                from_version: m.from_version.clone(),
                version: s.version.clone(),
                given_ms: m.given_ms,
                ended_ms: m.ended_ms,
            }
        })
        .collect();
    let active = !crate::proto::rollout::is_final(&r.state);
    let waves = if detailed {
        let n = members.iter().map(|m| m.wave + 1).max().unwrap_or(0);
        (0..n)
            .map(|w| WaveView {
                index: w,
                state: if w < r.wave || (!active && w <= r.wave) {
                    "done"
                } else if w == r.wave && active {
                    "active"
                } else {
                    "pending"
                }
                .into(),
                members: views.iter().filter(|v| v.wave == w).cloned().collect(),
            })
            .collect()
    } else {
        Vec::new()
    };
    RolloutView {
        id: r.id.clone(),
        version: r.version.clone(),
        selector: r.selector.clone(),
        waves_spec: r.waves.clone(),
        soak_secs: r.soak_ms / 1000,
        max_parallel: r.max_parallel,
        max_failures: r.max_failures,
        deadline_ms: r.deadline_ms,
        state: r.state.clone(),
        reason: r.reason.clone(),
        wave: r.wave,
        created_ms: r.created_ms,
        finished_ms: r.finished_ms,
        waiting: waiting(r, members, &views, now_ms),
        counts,
        waves,
    }
}

/// What the rollout waits for, in words; `None` once it is over.
fn waiting(r: &RolloutRow, m: &[MemberRow], views: &[MemberView], now_ms: u64) -> Option<String> {
    let id = &r.id;
    let reason = r.reason.as_deref().unwrap_or("");
    match r.state.as_str() {
        PAUSED => Some(format!(
            "paused: `railgrid hub rollout resume {id}` goes on"
        )),
        HALTED => Some(format!(
            "halted ({reason}): lift the halt with `railgrid hub release resume {}` and then `railgrid hub rollout resume {id}`, or `railgrid hub rollout abort {id} [--rollback]`",
            r.version
        )),
        STOPPED => Some(format!(
            "stopped ({reason}): `railgrid hub rollout resume {id}` goes on with these failures taken on, or `railgrid hub rollout abort {id} [--rollback]`"
        )),
        RUNNING | ROLLING_BACK => {
            let under: Vec<String> = m
                .iter()
                .zip(views)
                .filter(|(row, _)| row.state == GIVEN || row.state == REVERTING)
                .map(|(_, v)| match &v.detail {
                    Some(d) => format!("{} ({d})", v.agent),
                    None => v.agent.clone(),
                })
                .collect();
            let waves = m.iter().map(|x| x.wave + 1).max().unwrap_or(0);
            let head = format!("wave {} of {waves}", r.wave + 1);
            if !under.is_empty() {
                let more = under.len().saturating_sub(NAMED);
                let mut text = format!("{head}: {}", under[..under.len().min(NAMED)].join(", "));
                if more > 0 {
                    text.push_str(&format!(" and {more} more"));
                }
                let queued = m
                    .iter()
                    .filter(|x| x.wave <= r.wave && x.state == PENDING)
                    .count();
                if queued > 0 {
                    text.push_str(&format!(
                        "; {queued} waiting for a place (--max-parallel {})",
                        r.max_parallel
                    ));
                }
                return Some(text);
            }
            if let Some(t) = r.last_commit_ms {
                let until = t.saturating_add(r.soak_ms);
                if r.state == RUNNING && until > now_ms {
                    let secs = (until - now_ms).div_ceil(1000);
                    return Some(format!(
                        "{head}: soaking, the next wave starts in {secs}s"
                    ));
                }
            }
            let deferred = m.iter().filter(|x| x.state == DEFERRED).count();
            Some(if deferred > 0 {
                format!("{head}: {deferred} member(s) deferred until they are back")
            } else {
                head
            })
        }
        _ => None,
    }
}
