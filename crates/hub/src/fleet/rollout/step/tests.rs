use super::*;
use crate::proto::rollout::{ABORTED, DEFERRED};

const V: &str = "2.0.0";
const OLD: &str = "1.0.0";

fn rollout(sizes: &[usize]) -> (RolloutRow, Vec<MemberRow>, Vec<Seen>) {
    let ids: Vec<String> = (0..sizes.iter().sum::<usize>())
        .map(|n| format!("a{n}"))
        .collect();
    let members = plan::assign(ids, sizes)
        .into_iter()
        .enumerate()
        .map(|(position, (agent, wave))| MemberRow {
            agent,
            wave,
            position,
            state: PENDING.into(),
            from_version: Some(OLD.into()),
            ..MemberRow::default()
        })
        .collect::<Vec<_>>();
    let seen = members.iter().map(|_| idle(OLD)).collect();
    let r = RolloutRow {
        id: "r1".into(),
        version: V.into(),
        state: RUNNING.into(),
        max_parallel: 10,
        ..RolloutRow::default()
    };
    (r, members, seen)
}

fn idle(version: &str) -> Seen {
    Seen {
        known: true,
        connected: true,
        version: Some(version.into()),
        upgrade: None,
        own_version: None,
        fresh: true,
        away_ms: 0,
        fetched_ms: None,
    }
}

fn upgrade(state: &str, target: &str, error: Option<&str>) -> Option<UpgradeReport> {
    Some(UpgradeReport::toward(state, target, error))
}

/// Runs a step at `now` and applies it as the driver would: rows, wave, state, and the
/// agents' own versions.
fn run(
    r: &mut RolloutRow,
    members: &mut [MemberRow],
    seen: &mut [Seen],
    now: u64,
    halted: Option<&str>,
) -> Step {
    let f = Facts {
        now_ms: now,
        halted: halted.map(Into::into),
        ..Facts::default()
    };
    let s = step(r, members, seen, &f);
    for changed in &s.members {
        let row = members
            .iter_mut()
            .find(|m| m.agent == changed.agent)
            .expect("a member");
        *row = changed.clone();
    }
    r.wave = s.wave;
    r.last_commit_ms = s.last_commit_ms;
    if let Some((to, reason)) = &s.moved {
        r.state = to.clone();
        r.reason = reason.clone();
    }
    for a in s.before.iter().chain(&s.after) {
        if let Act::Give { agent, version, .. } = a {
            let i = members
                .iter()
                .position(|m| m.agent == *agent)
                .expect("member");
            seen[i].own_version = Some(version.clone());
        }
    }
    s
}

fn states(members: &[MemberRow]) -> Vec<&str> {
    members.iter().map(|m| m.state.as_str()).collect()
}

/// `rollout abort --rollback`, as the store moves the rollout.
fn abort_with_rollback(r: &mut RolloutRow) {
    r.state = ROLLING_BACK.into();
    r.wave = 0;
}

/// Served the artifact by the hub (later than any step of these tests), switched and
/// committed.
fn commit(s: &mut Seen) {
    s.fetched_ms = Some(1 << 40);
    s.version = Some(V.into());
    s.upgrade = upgrade("committed", V, None);
}

#[test]
fn a_release_that_rolls_back_on_the_canary_halts_before_any_other_member_gets_it() {
    let (mut r, mut m, mut seen) = rollout(&[1, 1, 2]);
    let s = run(&mut r, &mut m, &mut seen, 1_000, None);
    assert_eq!(states(&m), [GIVEN, PENDING, PENDING, PENDING]);
    assert_eq!(
        s.after,
        vec![Act::Give {
            agent: "a0".into(),
            version: V.into(),
            rollback: false
        }]
    );
    seen[0].upgrade = upgrade("rolled_back", V, Some("exited before it committed"));
    let s = run(&mut r, &mut m, &mut seen, 2_000, None);
    assert_eq!(states(&m), [MEMBER_ROLLED_BACK, PENDING, PENDING, PENDING]);
    assert_eq!(r.state, HALTED);
    assert!(
        r.reason
            .as_deref()
            .is_some_and(|w| w.contains("rolled back on a0: exited before it committed")),
        "{r:?}"
    );
    assert!(s.after.is_empty(), "{s:?}");
    // Halted, it observes and gives nothing.
    let s = run(
        &mut r,
        &mut m,
        &mut seen,
        3_000,
        Some("2.0.0 rolled back on a0"),
    );
    assert!(s.after.is_empty() && s.members.is_empty(), "{s:?}");
}

#[test]
fn each_wave_waits_for_every_commit_of_the_last_and_its_soak() {
    let (mut r, mut m, mut seen) = rollout(&[1, 2, 3]);
    r.soak_ms = 10_000;
    run(&mut r, &mut m, &mut seen, 1_000, None);
    commit(&mut seen[0]);
    run(&mut r, &mut m, &mut seen, 2_000, None);
    assert_eq!(states(&m)[..3], [COMMITTED, PENDING, PENDING]);
    assert_eq!((r.wave, r.last_commit_ms), (0, Some(2_000)), "soaking");
    run(&mut r, &mut m, &mut seen, 11_999, None);
    assert_eq!(r.wave, 0);
    run(&mut r, &mut m, &mut seen, 12_000, None);
    assert_eq!(r.wave, 1);
    assert_eq!(
        states(&m),
        [COMMITTED, GIVEN, GIVEN, PENDING, PENDING, PENDING]
    );
    // One of two committed: the wave is not over.
    commit(&mut seen[1]);
    seen[2].upgrade = upgrade("switching", V, None);
    run(&mut r, &mut m, &mut seen, 30_000, None);
    assert_eq!((r.wave, states(&m)[3]), (1, PENDING));
    commit(&mut seen[2]);
    run(&mut r, &mut m, &mut seen, 31_000, None);
    run(&mut r, &mut m, &mut seen, 41_000, None);
    assert_eq!(r.wave, 2);
    for s in &mut seen[3..] {
        commit(s);
    }
    let s = run(&mut r, &mut m, &mut seen, 42_000, None);
    assert_eq!(r.state, DONE, "{s:?}");
    assert!(m.iter().all(|x| x.state == COMMITTED));
    // The whole fleet: the version goes to the fleet's settings, and the members' own
    // settings give way to it.
    assert_eq!(s.before[0], Act::FleetVersion(V.into()));
    assert_eq!(s.before.len(), 7, "{:?}", s.before);
}

#[test]
fn never_more_than_max_parallel_are_under_way() {
    let (mut r, mut m, mut seen) = rollout(&[5]);
    r.max_parallel = 2;
    run(&mut r, &mut m, &mut seen, 1, None);
    assert_eq!(states(&m), [GIVEN, GIVEN, PENDING, PENDING, PENDING]);
    commit(&mut seen[1]);
    run(&mut r, &mut m, &mut seen, 2, None);
    assert_eq!(states(&m), [GIVEN, COMMITTED, GIVEN, PENDING, PENDING]);
    // A member already on the version (the hub served it the artifact) takes no place.
    seen[4] = idle(V);
    seen[4].fetched_ms = Some(0);
    run(&mut r, &mut m, &mut seen, 3, None);
    assert_eq!(states(&m), [GIVEN, COMMITTED, GIVEN, PENDING, COMMITTED]);
}

#[test]
fn a_member_away_is_deferred_holds_up_nothing_and_takes_the_version_when_back() {
    let (mut r, mut m, mut seen) = rollout(&[1, 2]);
    r.selector = Some("queue=build".into());
    seen[2].connected = false;
    run(&mut r, &mut m, &mut seen, 1, None);
    commit(&mut seen[0]);
    run(&mut r, &mut m, &mut seen, 2, None);
    assert_eq!(r.wave, 1);
    assert_eq!(states(&m), [COMMITTED, GIVEN, DEFERRED]);
    commit(&mut seen[1]);
    let s = run(&mut r, &mut m, &mut seen, 3, None);
    assert_eq!(r.state, DONE);
    // Selected: the member away is given the version, for when it is back.
    assert_eq!(
        s.before,
        vec![Act::Give {
            agent: "a2".into(),
            version: V.into(),
            rollback: false
        }]
    );

    // Back before the end, it is given the version like the others.
    let (mut r, mut m, mut seen) = rollout(&[1, 2]);
    seen[2].connected = false;
    run(&mut r, &mut m, &mut seen, 1, None);
    commit(&mut seen[0]);
    run(&mut r, &mut m, &mut seen, 2, None);
    seen[2].connected = true;
    run(&mut r, &mut m, &mut seen, 3, None);
    assert_eq!(states(&m), [COMMITTED, GIVEN, GIVEN]);
}

#[test]
fn failures_past_the_allowance_stop_and_a_resume_takes_them_on() {
    let (mut r, mut m, mut seen) = rollout(&[3]);
    run(&mut r, &mut m, &mut seen, 1, None);
    seen[1].upgrade = upgrade("failed", V, Some("sha256 mismatch"));
    run(&mut r, &mut m, &mut seen, 2, None);
    assert_eq!(r.state, STOPPED);
    assert!(r
        .reason
        .as_deref()
        .is_some_and(|w| w.contains("a1: sha256 mismatch")));
    r.state = RUNNING.into();
    r.failures_accepted = 1;
    commit(&mut seen[0]);
    commit(&mut seen[2]);
    run(&mut r, &mut m, &mut seen, 3, None);
    assert_eq!(r.state, DONE);
    assert_eq!(states(&m), [COMMITTED, FAILED, COMMITTED]);
}

#[test]
fn past_its_deadline_a_rollout_stops_where_it_is() {
    let (mut r, mut m, mut seen) = rollout(&[1, 1]);
    r.deadline_ms = Some(100);
    run(&mut r, &mut m, &mut seen, 1, None);
    let s = run(&mut r, &mut m, &mut seen, 100, None);
    assert_eq!(r.state, EXPIRED);
    assert!(s.after.is_empty());
    assert!(r.reason.as_deref().is_some_and(|w| w.contains("0 of 2")));
}

#[test]
fn paused_it_watches_its_members_and_gives_the_version_to_none() {
    let (mut r, mut m, mut seen) = rollout(&[1, 1]);
    run(&mut r, &mut m, &mut seen, 1, None);
    r.state = PAUSED.into();
    commit(&mut seen[0]);
    let s = run(&mut r, &mut m, &mut seen, 2, None);
    assert_eq!(states(&m), [COMMITTED, PENDING]);
    assert!(s.after.is_empty());
    assert_eq!(r.state, PAUSED);
}

#[test]
fn a_member_given_the_version_keeps_it_whoever_changed_it() {
    let (mut r, mut m, mut seen) = rollout(&[1]);
    run(&mut r, &mut m, &mut seen, 1, None);
    seen[0].own_version = Some("9.9.9".into());
    let s = run(&mut r, &mut m, &mut seen, 2, None);
    assert_eq!(
        s.after,
        vec![Act::Give {
            agent: "a0".into(),
            version: V.into(),
            rollback: false
        }]
    );
    seen[0].known = false;
    run(&mut r, &mut m, &mut seen, 3, None);
    assert_eq!(states(&m), [SKIPPED]);
}

#[test]
fn a_rollback_takes_the_committed_members_back_wave_by_wave() {
    let (mut r, mut m, mut seen) = rollout(&[1, 2]);
    r.max_parallel = 2;
    run(&mut r, &mut m, &mut seen, 1, None);
    commit(&mut seen[0]);
    run(&mut r, &mut m, &mut seen, 2, None);
    commit(&mut seen[1]);
    run(&mut r, &mut m, &mut seen, 3, None);
    assert_eq!(states(&m), [COMMITTED, COMMITTED, GIVEN]);
    seen[2].upgrade = upgrade("switching", V, None);
    abort_with_rollback(&mut r);
    let s = run(&mut r, &mut m, &mut seen, 4, None);
    // Wave 1 first, a2 still under way counting against the bound.
    assert_eq!(states(&m), [REVERTING, COMMITTED, GIVEN]);
    assert_eq!(
        s.after,
        vec![Act::Give {
            agent: "a0".into(),
            version: OLD.into(),
            rollback: true
        }]
    );
    seen[0].version = Some(OLD.into());
    seen[0].upgrade = upgrade("committed", OLD, None);
    // The member under way commits meanwhile: it goes back too, in its wave.
    commit(&mut seen[2]);
    run(&mut r, &mut m, &mut seen, 5, None);
    assert_eq!(r.wave, 1);
    assert_eq!(states(&m), [REVERTED, REVERTING, REVERTING]);
    seen[1].version = Some(OLD.into());
    run(&mut r, &mut m, &mut seen, 6, None);
    assert_eq!(states(&m), [REVERTED, REVERTED, REVERTING]);
    assert_eq!(r.state, ROLLING_BACK);
    seen[2].version = Some(OLD.into());
    let s = run(&mut r, &mut m, &mut seen, 7, None);
    assert_eq!(r.state, ROLLED_BACK);
    assert_eq!(s.before.len(), 3, "their own settings give way: {s:?}");
    assert_ne!(r.state, ABORTED);
}

#[test]
fn a_member_counts_as_committed_only_once_its_agent_says_so() {
    let (mut r, mut m, mut seen) = rollout(&[1, 1]);
    run(&mut r, &mut m, &mut seen, 1, None);
    // Just switched: the new agent reports the version before it has committed.
    seen[0].version = Some(V.into());
    run(&mut r, &mut m, &mut seen, 2, None);
    assert_eq!(states(&m), [GIVEN, PENDING]);
    seen[0].upgrade = upgrade("pending_commit", V, None);
    run(&mut r, &mut m, &mut seen, 3, None);
    assert_eq!(states(&m), [GIVEN, PENDING]);
    commit(&mut seen[0]);
    run(&mut r, &mut m, &mut seen, 4, None);
    assert_eq!(states(&m), [COMMITTED, GIVEN]);
}

#[test]
fn an_end_reported_before_the_member_took_its_settings_is_not_taken() {
    let (mut r, mut m, mut seen) = rollout(&[1]);
    run(&mut r, &mut m, &mut seen, 1, None);
    // Left over from an earlier rollout of the same version.
    seen[0].upgrade = upgrade("rolled_back", V, Some("old news"));
    seen[0].fresh = false;
    run(&mut r, &mut m, &mut seen, 2, None);
    assert_eq!((states(&m)[0], r.state.as_str()), (GIVEN, RUNNING));
    seen[0].upgrade = upgrade("failed", V, Some("old news"));
    run(&mut r, &mut m, &mut seen, 3, None);
    assert_eq!(states(&m), [GIVEN]);
    seen[0].fresh = true;
    run(&mut r, &mut m, &mut seen, 4, None);
    assert_eq!(states(&m), [FAILED]);
}

#[test]
fn a_halted_rollout_resumed_goes_on_past_the_rollback_it_took_on() {
    let (mut r, mut m, mut seen) = rollout(&[1, 1]);
    run(&mut r, &mut m, &mut seen, 1, None);
    seen[0].upgrade = upgrade("rolled_back", V, Some("crashed"));
    run(&mut r, &mut m, &mut seen, 2, None);
    assert_eq!(r.state, HALTED);
    // The operator lifted the version's halt and resumed the rollout.
    r.state = RUNNING.into();
    run(&mut r, &mut m, &mut seen, 3, None);
    assert_eq!(r.state, RUNNING);
    assert_eq!(states(&m), [MEMBER_ROLLED_BACK, GIVEN]);
    commit(&mut seen[1]);
    run(&mut r, &mut m, &mut seen, 4, None);
    assert_eq!(r.state, DONE);
}

#[test]
fn a_member_given_the_version_and_gone_for_long_is_deferred() {
    let (mut r, mut m, mut seen) = rollout(&[1, 1]);
    run(&mut r, &mut m, &mut seen, 1, None);
    seen[0].connected = false;
    seen[0].away_ms = GIVEN_AWAY_MS - 1;
    run(&mut r, &mut m, &mut seen, 2, None);
    assert_eq!(states(&m), [GIVEN, PENDING]);
    seen[0].away_ms = GIVEN_AWAY_MS;
    run(&mut r, &mut m, &mut seen, 3, None);
    assert_eq!(states(&m), [DEFERRED, GIVEN]);
}

#[test]
fn a_failed_member_trying_again_holds_a_place() {
    let (mut r, mut m, mut seen) = rollout(&[3]);
    r.max_parallel = 1;
    r.max_failures = 1;
    run(&mut r, &mut m, &mut seen, 1, None);
    seen[0].upgrade = upgrade("failed", V, Some("disk full"));
    run(&mut r, &mut m, &mut seen, 2, None);
    assert_eq!(states(&m), [FAILED, GIVEN, PENDING]);
    commit(&mut seen[1]);
    seen[0].upgrade = upgrade("downloading", V, None);
    run(&mut r, &mut m, &mut seen, 3, None);
    assert_eq!(
        states(&m),
        [FAILED, COMMITTED, PENDING],
        "a0 is at it again"
    );
    seen[0].upgrade = upgrade("failed", V, Some("disk full"));
    run(&mut r, &mut m, &mut seen, 4, None);
    assert_eq!(states(&m), [FAILED, COMMITTED, GIVEN]);
}

#[test]
fn a_rollback_takes_back_at_once_what_was_given_and_not_switched() {
    let (mut r, mut m, mut seen) = rollout(&[1, 2]);
    run(&mut r, &mut m, &mut seen, 1, None);
    commit(&mut seen[0]);
    run(&mut r, &mut m, &mut seen, 2, None);
    assert_eq!(states(&m), [COMMITTED, GIVEN, GIVEN]);
    // a1 switches; a2 was withheld the version by a halt and is idle.
    seen[1].upgrade = upgrade("switching", V, None);
    abort_with_rollback(&mut r);
    let s = run(&mut r, &mut m, &mut seen, 3, None);
    assert_eq!(states(&m), [REVERTING, GIVEN, REVERTING]);
    assert!(s.after.contains(&Act::Give {
        agent: "a2".into(),
        version: OLD.into(),
        rollback: true
    }));
    seen[0].version = Some(OLD.into());
    commit(&mut seen[1]);
    run(&mut r, &mut m, &mut seen, 4, None);
    assert_eq!(states(&m), [REVERTED, REVERTING, REVERTED]);
    seen[1].version = Some(OLD.into());
    run(&mut r, &mut m, &mut seen, 5, None);
    assert_eq!(r.state, ROLLED_BACK);
}

#[test]
fn a_whole_fleet_rollout_leaves_the_fleets_version_alone_while_another_holds_agents() {
    let (r, mut m, mut seen) = rollout(&[1]);
    m[0].state = COMMITTED.into();
    seen[0] = idle(V);
    seen[0].own_version = Some(V.into());
    let alone = Facts {
        now_ms: 5,
        ..Facts::default()
    };
    let s = step(&r, &m, &seen, &alone);
    assert_eq!(s.moved, Some((DONE.into(), None)));
    assert_eq!(
        s.before,
        vec![Act::FleetVersion(V.into()), Act::Clear("a0".into())]
    );
    let other = Facts {
        other_active: true,
        ..alone
    };
    let s = step(&r, &m, &seen, &other);
    assert_eq!(s.moved, Some((DONE.into(), None)));
    assert!(s.before.is_empty(), "{s:?}");
}

#[test]
fn a_members_word_alone_counts_for_nothing_and_holds_its_wave_up() {
    let (mut r, mut m, mut seen) = rollout(&[1, 1, 1]);
    run(&mut r, &mut m, &mut seen, 11_000, None);
    // The canary says it committed, never having fetched the artifact: not counted.
    seen[0].version = Some(V.into());
    seen[0].upgrade = upgrade("committed", V, None);
    let s = run(&mut r, &mut m, &mut seen, 12_000, None);
    assert_eq!(states(&m), [GIVEN, PENDING, PENDING]);
    assert_eq!(s.unproven, ["a0"]);
    assert_eq!(m[0].error.as_deref(), Some(UNPROVEN));
    // A fetch from before it was given the version is no evidence either.
    seen[0].fetched_ms = Some(11_000 - CLOCK_SKEW_MS - 1);
    run(&mut r, &mut m, &mut seen, 13_000, None);
    assert_eq!(states(&m), [GIVEN, PENDING, PENDING]);
    // Served it after: its commit counts, and the next wave starts.
    seen[0].fetched_ms = Some(12_500);
    run(&mut r, &mut m, &mut seen, 14_000, None);
    assert_eq!(states(&m), [COMMITTED, GIVEN, PENDING]);
    // A member that says it runs the version before it is offered is given it like any
    // other, and counts only with the evidence.
    seen[2] = idle(V);
    commit(&mut seen[1]);
    let s = run(&mut r, &mut m, &mut seen, 15_000, None);
    assert_eq!(states(&m), [COMMITTED, COMMITTED, GIVEN]);
    let s = if s.unproven.is_empty() {
        run(&mut r, &mut m, &mut seen, 16_000, None)
    } else {
        s
    };
    assert_eq!(s.unproven, ["a2"]);
    assert_eq!(r.state, RUNNING);
}

#[test]
fn a_member_that_stops_running_the_version_during_its_soak_has_failed() {
    let (mut r, mut m, mut seen) = rollout(&[1, 1]);
    r.soak_ms = 10_000;
    run(&mut r, &mut m, &mut seen, 1_000, None);
    commit(&mut seen[0]);
    run(&mut r, &mut m, &mut seen, 2_000, None);
    assert_eq!(states(&m), [COMMITTED, PENDING]);
    // It runs the old version again (restored by hand, say) before the soak is over.
    seen[0] = idle(OLD);
    run(&mut r, &mut m, &mut seen, 12_500, None);
    assert_eq!(states(&m), [FAILED, PENDING]);
    assert!(
        m[0].error
            .as_deref()
            .is_some_and(|e| e.contains("during its wave's soak")),
        "{m:?}"
    );
}
