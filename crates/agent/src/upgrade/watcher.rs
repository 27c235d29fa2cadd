//! `railgrid agent upgrade-watch`: the guard of one upgrade, run from the *previous*
//! binary's bytes (`<exe>.prev`), outside the agent's process tree and service, so that
//! a rollback never depends on a line of the new binary's code (docs/design.md, invariant 13).
//!
//! It watches `<state>/upgrade.json` and the agent. It exits as soon as the upgrade it
//! guards is committed (or is no longer the one in the record). It rolls back when the
//! deadline passes first, or when the new agent keeps dying (standalone: it dies twice,
//! the first time being started again from the new binary, since a kill between the
//! rename and the re-exec is no fault of the new version; under a service manager: three
//! restarts). A rollback, under the record's lock so that a late commit cannot win too:
//! stop the new agent (standalone), restore `<exe>.prev` over `<exe>` when `<exe>` is not
//! the previous binary already (checked by SHA-256), mark the record rolled back and the
//! version bad (when the new version ran), then bring an agent back (restart the service,
//! or start `agent run` again with its arguments).
//!
//! Under a service manager, a service stopped on purpose after the re-exec (`systemctl
//! stop`, not a shutdown) is the operator's word: the previous binary is put back, the
//! version is not blamed, and the service is left stopped; the upgrade is tried again
//! once it starts. While the host shuts down the watcher does nothing (it is stopped
//! with it); at the next boot the unit's `ExecStartPre` guard starts another from
//! `<exe>.prev`, with the commit window counted again from then, so that a slow reboot
//! is not taken for a version that never got healthy.
//!
//! The deadline is judged on what the host can see. A new agent whose runner served for
//! the settle period, and which says every few seconds that only the hub cannot be
//! reached, is given up to the record's `hub_wait` more (the old agent set it: the new
//! binary cannot lengthen it). Past that it is rolled back *without blame*: the record
//! says `aborted`, the version is not remembered as bad, and no hub halts it (a hub
//! outage during a fleet upgrade must not halt a good release everywhere); the upgrade is
//! tried again later.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::record::{self, Phase, RecordError};
use super::service::{Seen, Service};
use crate::sys::exe::PinnedExe;
use crate::sys::ProcessId;

/// How often the record and the agent are looked at.
const TICK: Duration = Duration::from_millis(200);
/// Restarts of the new agent a service manager may make before the watcher gives up on
/// it.
const MAX_SERVICE_RESTARTS: usize = 3;
/// How long the service may show no agent running before the watcher takes it as dead
/// (longer than the unit's RestartSec).
const MAX_DOWN: Duration = Duration::from_secs(10);
/// How long the service must stay stopped on purpose before the watcher takes it as the
/// operator's stop (a `systemctl restart` passes through `inactive` for a moment).
const STOPPED_FOR: Duration = Duration::from_secs(2);
/// After SIGKILL, how long the agent may take to be gone.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How old the new agent's word that the hub is away may be and still count (it renews
/// it every few seconds).
const HUB_AWAY_FRESH: u64 = 15;

/// Whether a rollback is the new version's fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blame {
    /// It crashed, never got healthy, or kept dying: remembered as bad, and halted by the
    /// hub that sent it.
    Version,
    /// Healthy on the host, but the hub stayed out of reach: tried again later.
    Nobody,
    /// The operator stopped the service in the commit window: the previous binary is put
    /// back and the service left stopped; tried again when it starts.
    Stopped,
}

/// What the deadline means for `u` at `now`.
#[derive(Debug, PartialEq, Eq)]
enum AtDeadline {
    /// Not reached yet, or healthy and waiting for an unreachable hub within its bound.
    Wait,
    /// Healthy, but the hub stayed away past the bound.
    HubAway,
    /// Not healthy (or not saying so) by the deadline.
    Missed,
}

fn at_deadline(u: &record::Upgrade, now: u64) -> AtDeadline {
    if now < u.deadline {
        return AtDeadline::Wait;
    }
    let waiting_for_hub = u.healthy_at.is_some()
        && u.hub_away_at
            .is_some_and(|t| now.saturating_sub(t) <= HUB_AWAY_FRESH);
    match (waiting_for_hub, now < u.deadline.saturating_add(u.hub_wait)) {
        (true, true) => AtDeadline::Wait,
        (true, false) => AtDeadline::HubAway,
        (false, _) => AtDeadline::Missed,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("could not bring an agent back ({service})")]
    Restart {
        service: String,
        #[source]
        source: std::io::Error,
    },
}

/// What the watcher was started with.
#[derive(Debug, Clone)]
pub struct WatchArgs {
    pub state_dir: PathBuf,
    /// The new binary it guards.
    pub to_sha256: String,
    pub service: Service,
    /// How long the agent may take to stop on SIGTERM before it is killed.
    pub stop_timeout: Duration,
    /// Standalone: the agent's arguments (after the program name).
    pub agent_args: Vec<OsString>,
}

/// How the watch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Committed,
    RolledBack(String),
    /// The record holds another upgrade, or none: nothing to guard.
    NotGuarding,
}

pub fn watch(a: &WatchArgs) -> Result<Outcome, WatchError> {
    // What this watcher guards, as the old binary wrote it: a rollback can go on from
    // this even if the record becomes unreadable later.
    let initial = record::update(&a.state_dir, |r| match r.upgrade.as_mut() {
        Some(u) if u.to_sha256 == a.to_sha256 => {
            u.watcher_pid = Some(std::process::id());
            u.watcher_start_time = crate::sys::process_start_time(crate::sys::ProcessId::current());
            (true, Some(u.clone()))
        }
        _ => (false, None),
    })?;
    let Some(initial) = initial else {
        return Ok(Outcome::NotGuarding);
    };
    match watch_from(a) {
        Ok(outcome) => Ok(outcome),
        Err(e) => {
            // Never leave an upgrade unguarded: whatever failed, put the previous binary
            // back from what this watcher knew at its start.
            tracing::error!(error = %crate::error_chain(&e), "the watch failed; rolling back from what it knew at its start");
            force_rollback(
                a,
                &initial,
                format!("the upgrade's watcher failed: {}", crate::error_chain(&e)),
            )
        }
    }
}

/// How long the record may be unreadable before the watcher gives up on it.
const UNREADABLE: Duration = Duration::from_secs(10);

fn watch_from(a: &WatchArgs) -> Result<Outcome, WatchError> {
    tracing::info!(state_dir = %a.state_dir.display(), to_sha256 = %a.to_sha256, service = %a.service.to_arg(), "watching the upgrade");
    let mut restarted = false;
    let mut seen_pids: BTreeSet<u32> = BTreeSet::new();
    let mut down_since: Option<Instant> = None;
    let mut stopped_since: Option<Instant> = None;
    let mut restarts_at_start: Option<u64> = None;
    let mut counted_restarts: u64 = 0;
    let mut unreadable: Option<Instant> = None;
    let mut waiting_for_hub = false;
    let mut bounds: Option<(u64, u64)> = None;
    loop {
        let rec = match record::peek(&a.state_dir) {
            Ok(r) => {
                unreadable = None;
                r
            }
            Err(e) => {
                let since = *unreadable.get_or_insert_with(Instant::now);
                if since.elapsed() >= UNREADABLE {
                    return Err(e.into());
                }
                tracing::warn!(error = %crate::error_chain(&e), "the upgrade record cannot be read; trying again");
                std::thread::sleep(TICK);
                continue;
            }
        };
        let Some(u) = rec.upgrade.filter(|u| u.to_sha256 == a.to_sha256) else {
            return Ok(Outcome::NotGuarding);
        };
        match u.phase {
            Phase::Committed => {
                tracing::info!(version = %u.to, "the upgrade is committed; the watcher exits");
                return Ok(Outcome::Committed);
            }
            Phase::RolledBack | Phase::Aborted => {
                return Ok(Outcome::RolledBack(u.reason.unwrap_or_default()))
            }
            Phase::Switching | Phase::Pending => {}
        }
        // The bounds only ever shrink (the old agent moves the deadline closer after the
        // runner's stop); whatever the new binary writes into the record cannot lengthen
        // them.
        let mut u = u;
        let (deadline, hub_wait) = bounds.get_or_insert((u.deadline, u.hub_wait));
        *deadline = (*deadline).min(u.deadline);
        *hub_wait = (*hub_wait).min(u.hub_wait);
        (u.deadline, u.hub_wait) = (*deadline, *hub_wait);
        let now = crate::util::unix_now();
        let after = |t: u64| {
            humantime::format_duration(Duration::from_secs(t.saturating_sub(u.started_at)))
        };
        match at_deadline(&u, now) {
            AtDeadline::Wait => {
                if now >= u.deadline && !waiting_for_hub {
                    waiting_for_hub = true;
                    tracing::warn!(version = %u.to, up_to = %after(u.deadline + u.hub_wait), "the new agent is healthy on this host but cannot reach its hub: waiting for the hub past the deadline");
                }
            }
            AtDeadline::HubAway => {
                let why = format!(
                    "version {} was healthy on this host, but its hub could not be reached within {} after the switch began; rolled back without blame, to be tried again",
                    u.to,
                    after(u.deadline + u.hub_wait)
                );
                return rollback(a, why, Blame::Nobody);
            }
            AtDeadline::Missed => {
                let why = format!(
                    "version {} did not commit by its deadline ({} after the switch began)",
                    u.to,
                    after(u.deadline)
                );
                return rollback(a, why, Blame::Version);
            }
        }
        match &a.service {
            Service::Standalone => {
                let alive = ProcessId::from_u32(u.agent_pid).is_some_and(|p| {
                    crate::sys::group::process_alive(p)
                        && (u.agent_start_time.is_none()
                            || crate::sys::process_start_time(p) == u.agent_start_time)
                });
                if !alive {
                    if u.phase == Phase::Switching {
                        return rollback(
                            a,
                            "the agent exited during the switch".into(),
                            Blame::Version,
                        );
                    }
                    if restarted {
                        return rollback(
                            a,
                            format!("the new agent ({}) exited before it committed, twice", u.to),
                            Blame::Version,
                        );
                    }
                    restarted = true;
                    tracing::warn!(pid = u.agent_pid, version = %u.to, "the agent exited before committing; starting it once more from the new binary");
                    if let Err(e) = restart_new(a, &u.exe) {
                        return rollback(
                            a,
                            format!(
                                "the new agent exited, and could not be started again: {}",
                                crate::error_chain(&e)
                            ),
                            Blame::Version,
                        );
                    }
                }
            }
            service => {
                let (seen, counted) = service.agent_seen();
                // A crash at start can come and go between two looks: the manager's own
                // count sees every restart.
                if let Some(n) = counted {
                    let first = *restarts_at_start.get_or_insert(n);
                    counted_restarts = n.saturating_sub(first);
                }
                if seen != Seen::Stopped {
                    stopped_since = None;
                }
                match seen {
                    Seen::Running(pid) => {
                        seen_pids.insert(pid);
                        down_since = None;
                    }
                    Seen::ShuttingDown => down_since = None,
                    Seen::Stopped => {
                        let since = *stopped_since.get_or_insert_with(Instant::now);
                        // Before the re-exec the old agent undoes its own switch.
                        if since.elapsed() >= STOPPED_FOR && u.execed_at.is_some() {
                            let why = format!(
                                "the agent's service was stopped before version {} committed; the previous binary is back",
                                u.to
                            );
                            return rollback(a, why, Blame::Stopped);
                        }
                    }
                    Seen::Down => {
                        // Not restarted (exit 2 is not, by the unit), or not coming up.
                        let since = *down_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= MAX_DOWN && u.execed_at.is_some() {
                            return rollback(
                                a,
                                format!(
                                    "the new agent ({}) is not running under its service",
                                    u.to
                                ),
                                Blame::Version,
                            );
                        }
                    }
                }
                let restarts = seen_pids
                    .len()
                    .saturating_sub(1)
                    .max(usize::try_from(counted_restarts).unwrap_or(usize::MAX));
                if restarts >= MAX_SERVICE_RESTARTS {
                    return rollback(
                        a,
                        format!(
                            "the new agent ({}) was restarted {restarts} times before it committed",
                            u.to
                        ),
                        Blame::Version,
                    );
                }
            }
        }
        std::thread::sleep(TICK);
    }
}

/// Starts a watcher of the upgrade to `to_sha256` from `program` (the previous binary),
/// where `service` keeps it out of the agent's tree and service.
pub fn launch(
    program: &Path,
    state_dir: &Path,
    to_sha256: &str,
    service: &Service,
    stop_timeout: Duration,
    log: &Path,
    agent_args: &[OsString],
) -> std::io::Result<()> {
    let mut args: Vec<OsString> = vec![
        "agent".into(),
        "upgrade-watch".into(),
        "--state-dir".into(),
        state_dir.into(),
        "--to-sha256".into(),
        to_sha256.into(),
        "--service".into(),
        service.to_arg().into(),
        "--stop-timeout".into(),
        format!("{}s", stop_timeout.as_secs()).into(),
        "--".into(),
    ];
    args.extend(agent_args.iter().cloned());
    let tag = format!("{}-{}", std::process::id(), crate::util::unix_now());
    service.start_watcher(program, &args, log, &tag).map(drop)
}

/// True while the watcher the record names runs (same pid and start time).
fn watcher_alive(u: &super::record::Upgrade) -> bool {
    u.watcher_pid
        .and_then(ProcessId::from_u32)
        .is_some_and(|p| {
            crate::sys::group::process_alive(p)
                && (u.watcher_start_time.is_none()
                    || crate::sys::process_start_time(p) == u.watcher_start_time)
        })
}

/// Starts a watcher again for the upgrade in flight when the one the record names is
/// gone (a reboot, a kill): from `<exe>.prev`, once its SHA-256 is the previous
/// binary's. Returns whether one was started.
pub fn revive(
    state_dir: &Path,
    to_sha256: &str,
    window: Renew,
    stop_timeout: Duration,
    log: &Path,
    agent_args: &[OsString],
) -> Result<bool, WatchError> {
    let rec = record::peek(state_dir)?;
    let Some(u) = rec
        .upgrade
        .filter(|u| u.to_sha256 == to_sha256 || to_sha256.is_empty())
    else {
        return Ok(false);
    };
    if !matches!(u.phase, Phase::Switching | Phase::Pending) || watcher_alive(&u) {
        return Ok(false);
    }
    let prev = super::prev_path(&u.exe);
    let prev_sha = PinnedExe::open(&prev).map(|e| e.identity().sha256.clone());
    if prev_sha.as_deref().ok() != Some(u.from_sha256.as_str()) {
        tracing::error!(prev = %prev.display(), "the upgrade's watcher is gone and the previous binary is not at .prev: no watcher can be started");
        return Ok(false);
    }
    if window == Renew::FromNow {
        let sha = u.to_sha256.clone();
        record::update(state_dir, |r| match r.upgrade.as_mut() {
            Some(u) if u.to_sha256 == sha => {
                let deadline = renewed_deadline(u.started_at, u.deadline, crate::util::unix_now());
                let changed = deadline != u.deadline;
                u.deadline = deadline;
                (changed, ())
            }
            _ => (false, ()),
        })?;
    }
    tracing::warn!(version = %u.to, "the upgrade's watcher is gone: starting another from the previous binary");
    launch(
        &prev,
        state_dir,
        &u.to_sha256,
        &Service::detect(),
        stop_timeout,
        log,
        agent_args,
    )
    .map_err(|source| WatchError::Restart {
        service: "watcher".into(),
        source,
    })?;
    Ok(true)
}

/// Whether a watcher started again gets its commit window counted again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renew {
    /// The deadline stays: the new binary asks (it may not lengthen its own window).
    Keep,
    /// From now: the unit's guard asks, from the previous binary, before the agent
    /// starts (after a reboot that may have taken longer than the window).
    FromNow,
}

/// A switch's deadline counted again from `now`: as long a window as the switch first
/// gave, never shorter than what is left.
fn renewed_deadline(started_at: u64, deadline: u64, now: u64) -> u64 {
    let window = deadline.saturating_sub(started_at);
    deadline.max(now.saturating_add(window))
}

/// Standalone: starts the agent again from the binary now at `exe`, and records it.
fn restart_new(a: &WatchArgs, exe: &Path) -> Result<(), WatchError> {
    let pid = a
        .service
        .restart_agent(exe, &a.agent_args)
        .map_err(|source| WatchError::Restart {
            service: a.service.to_arg(),
            source,
        })?;
    if let Some(pid) = pid {
        record::update(&a.state_dir, |r| match r.upgrade.as_mut() {
            Some(u) if u.to_sha256 == a.to_sha256 => {
                u.agent_pid = pid;
                u.agent_start_time =
                    ProcessId::from_u32(pid).and_then(crate::sys::process_start_time);
                (true, ())
            }
            _ => (false, ()),
        })?;
    }
    Ok(())
}

/// The rollback when the record cannot be used: stop, restore, a fresh record saying
/// so (the unreadable one kept beside it), and an agent brought back.
fn force_rollback(
    a: &WatchArgs,
    initial: &super::record::Upgrade,
    why: String,
) -> Result<Outcome, WatchError> {
    if a.service == Service::Standalone {
        stop_agent(initial.agent_pid, initial.agent_start_time, a.stop_timeout);
    }
    let mut why = why;
    if let Err(e) = restore(&initial.exe, &initial.from_sha256) {
        why = format!("{why}; {e}");
    }
    let path = record::path(&a.state_dir);
    let _ = std::fs::rename(&path, path.with_extension("json.unreadable"));
    let mut u = initial.clone();
    u.phase = Phase::RolledBack;
    u.reason = Some(why.clone());
    u.finished_at = Some(crate::util::unix_now());
    let to = u.to.clone();
    let _ = record::update(&a.state_dir, |r| {
        r.upgrade = Some(u);
        r.remember_bad(&to, &why);
        (true, ())
    });
    a.service
        .restart_agent(&initial.exe, &a.agent_args)
        .map_err(|source| WatchError::Restart {
            service: a.service.to_arg(),
            source,
        })?;
    Ok(Outcome::RolledBack(why))
}

fn rollback(a: &WatchArgs, why: String, blame: Blame) -> Result<Outcome, WatchError> {
    tracing::warn!(reason = %why, "rolling the upgrade back");
    let done = record::update(&a.state_dir, |r| {
        let Some(u) = r.upgrade.as_mut().filter(|u| u.to_sha256 == a.to_sha256) else {
            return (false, None);
        };
        if matches!(
            u.phase,
            Phase::Committed | Phase::RolledBack | Phase::Aborted
        ) {
            // The agent committed while the lock was being taken.
            return (false, None);
        }
        if a.service == Service::Standalone {
            stop_agent(u.agent_pid, u.agent_start_time, a.stop_timeout);
        }
        let mut why = why;
        match restore(&u.exe, &u.from_sha256) {
            Ok(true) => {
                tracing::info!(exe = %u.exe.display(), version = %u.from, "restored the previous binary")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(error = %e, "could not restore the previous binary");
                why = format!("{why}; {e}");
            }
        }
        // The version is to blame only once it ran (the old agent re-executed into it, or
        // a new agent counted a start), and only for what it did.
        let ran = blame == Blame::Version
            && u.phase == Phase::Pending
            && (u.execed_at.is_some() || u.attempts > 0);
        u.phase = if ran {
            Phase::RolledBack
        } else {
            Phase::Aborted
        };
        u.reason = Some(why.clone());
        u.blameless = blame == Blame::Nobody;
        u.finished_at = Some(crate::util::unix_now());
        let (to, exe) = (u.to.clone(), u.exe.clone());
        if ran {
            r.remember_bad(&to, &why);
        }
        (true, Some((exe, why)))
    })?;
    let Some((exe, why)) = done else {
        let rec = record::peek(&a.state_dir)?;
        return Ok(match rec.upgrade.map(|u| u.phase) {
            Some(Phase::Committed) => Outcome::Committed,
            _ => Outcome::NotGuarding,
        });
    };
    if blame == Blame::Stopped {
        tracing::info!(service = %a.service.to_arg(), "the service stays stopped, as it was asked");
        return Ok(Outcome::RolledBack(why));
    }
    a.service
        .restart_agent(&exe, &a.agent_args)
        .map_err(|source| WatchError::Restart {
            service: a.service.to_arg(),
            source,
        })?;
    tracing::info!(service = %a.service.to_arg(), "an agent from the previous binary is coming back");
    Ok(Outcome::RolledBack(why))
}

/// SIGTERM to the agent (when it is still the process recorded), then SIGKILL after
/// `timeout`; returns once it is gone or the kill had its time.
fn stop_agent(pid: u32, start_time: Option<u64>, timeout: Duration) {
    use nix::sys::signal::Signal;
    let Some(p) = ProcessId::from_u32(pid) else {
        return;
    };
    let same = || {
        crate::sys::group::process_alive(p)
            && (start_time.is_none() || crate::sys::process_start_time(p) == start_time)
    };
    if !same() {
        return;
    }
    let leads_group = crate::sys::group::group_of(p).ok().flatten() == Some(p.get());
    let _ = crate::sys::group::signal_process(p, Signal::SIGTERM);
    let until = Instant::now() + timeout;
    while same() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    if same() {
        tracing::warn!(pid, "the agent did not stop in time; killing it");
        let _ = crate::sys::group::signal_process(p, Signal::SIGKILL);
        let until = Instant::now() + KILL_WAIT;
        while same() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // What the failed binary started in its own group goes with it; a group the agent
    // does not lead (it was started from a shell, a test) is someone else's.
    if leads_group {
        let _ = crate::sys::group::signal_group(p, Signal::SIGKILL);
    }
}

/// Puts the binary with `from_sha256` back at `exe`: `Ok(false)` when it is there
/// already, `Ok(true)` when `<exe>.prev` was renamed over it.
fn restore(exe: &Path, from_sha256: &str) -> Result<bool, String> {
    let sha = |p: &Path| PinnedExe::open(p).map(|e| e.identity().sha256.clone());
    if sha(exe).is_ok_and(|s| s == from_sha256) {
        return Ok(false);
    }
    let prev = super::prev_path(exe);
    match sha(&prev) {
        Ok(s) if s == from_sha256 => {}
        Ok(s) => {
            return Err(format!(
                "{} is not the previous binary (sha256 {s}, expected {from_sha256}): restore it by hand",
                prev.display()
            ))
        }
        Err(e) => return Err(format!("{}: {}", prev.display(), crate::util::error_chain(&e))),
    }
    let (Some(dir), Some(name), Some(prev_name)) = (
        exe.parent(),
        exe.file_name().and_then(|n| n.to_str()),
        prev.file_name().and_then(|n| n.to_str()),
    ) else {
        return Err(format!("{} has no directory", exe.display()));
    };
    let dir = crate::sys::dirfd::Dir::open(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    dir.rename(prev_name, name)
        .and_then(|()| dir.sync())
        .map_err(|e| {
            format!(
                "could not rename {} over {}: {e}",
                prev.display(),
                exe.display()
            )
        })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewed_window_is_as_long_as_the_first_and_never_shorter_than_what_is_left() {
        // A switch at 1000 with 150 s to commit, a reboot that took 10 min.
        assert_eq!(renewed_deadline(1000, 1150, 1600), 1750);
        // Back within the window: at least the whole window again.
        assert_eq!(renewed_deadline(1000, 1150, 1010), 1160);
        // A clock that went back never shortens it.
        assert_eq!(renewed_deadline(1000, 1150, 900), 1150);
        // A broken record (deadline before the start) gets no window of its own.
        assert_eq!(renewed_deadline(1000, 990, 2000), 2000);
    }
}
