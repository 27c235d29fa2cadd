//! Ending a process tree: the one `SIGTERM → grace → SIGKILL` of railgrid.
//!
//! Every stop goes through [`Group::terminate`] (or [`Group::stop_leader`] when the
//! caller still has the leader to reap, or [`Group::terminate_blocking`] outside the
//! runtime): the supervisor's stop and its cleanup after a crash, the engine's job stop,
//! the reconciliation of jobs a dead runner left, and the reclaim of a stale runner lock.
//!
//! A [`Group`] is what one stop reaches:
//! - a process group (or, for a lock holder that leads none, one process),
//! - on Linux, a cgroup: SIGTERM goes to the group *and* every process in the cgroup, the
//!   grace waits for the cgroup to empty, and the kill is `cgroup.kill`,
//! - an identity (pid + start time) verified right before the first signal, so that a
//!   recycled pid is never signalled.
//!
//! A stop deadline ([`StopDeadline`]) cuts a grace short: once it has passed, the stop
//! goes straight to SIGKILL. Raw signals and `/proc` stay in `crate::sys`; this module only
//! decides what to send when. The OS has no event for "group empty", so the waits poll —
//! only while stopping, and only until their deadline.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::sys::group::{self, Sig};
use crate::sys::{self, ProcessId};

/// How often a stop re-checks whether what it signalled is gone. Only while stopping.
const POLL: Duration = Duration::from_millis(5);
/// How long a group or cgroup may take to empty after SIGKILL.
pub const KILL_WAIT: Duration = Duration::from_secs(2);

/// When a runner stop must be done by, once it has begun; `None` before a stop.
pub type StopDeadline = watch::Receiver<Option<Instant>>;

#[derive(Debug, Error)]
pub enum GroupError {
    #[error("refusing to signal process group {pgid}: {why}")]
    Refused { pgid: i32, why: &'static str },
    #[error("could not send {sig} to {what} {pid}")]
    Signal {
        what: &'static str,
        pid: i32,
        sig: Sig,
        #[source]
        source: io::Error,
    },
}

/// What one stop reaches. Built once, terminated once.
#[derive(Debug, Clone)]
pub struct Group {
    /// Shown with the warnings this module logs itself ("job 7", "runner").
    name: String,
    /// The process group signalled, or with `lone` only that process.
    pgid: Option<ProcessId>,
    lone: bool,
    #[cfg(target_os = "linux")]
    cgroup: Option<sys::cgroup::Cgroup>,
    /// The leader's pid and start time, checked before the first signal.
    identity: Option<(ProcessId, u64)>,
}

/// What a stop did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// SIGTERM was sent: something lived and was what it claimed to be.
    pub signalled: bool,
    /// The grace was not enough (or was cut short): SIGKILL or `cgroup.kill` was needed.
    pub killed: bool,
    /// A stop deadline ended the grace early.
    pub cut_short: bool,
    /// Something still lived after the kill and [`KILL_WAIT`].
    pub survivors: bool,
    /// How the leader ended, when the stop reaped it.
    pub leader: Option<ExitStatus>,
}

/// A child process this process can reap: tokio's, or a job launched without fork.
pub trait Reapable {
    /// Waits for the child to exit and reaps it; must be cancel-safe.
    fn wait(&mut self) -> impl std::future::Future<Output = io::Result<ExitStatus>> + Send;
}

impl Reapable for tokio::process::Child {
    async fn wait(&mut self) -> io::Result<ExitStatus> {
        tokio::process::Child::wait(self).await
    }
}

/// Stands in for "no leader to reap" in the shared stop.
struct NoLeader;

impl Reapable for NoLeader {
    async fn wait(&mut self) -> io::Result<ExitStatus> {
        std::future::pending().await
    }
}

impl Group {
    /// Process group `pgid`. Refuses 0, 1 and negative ids (every process, our group,
    /// init) and our own group, so that a confused id can never take railgrid down.
    pub fn new(name: impl Into<String>, pgid: i32) -> Result<Self, GroupError> {
        let pid = ProcessId::new(pgid).ok_or(GroupError::Refused {
            pgid,
            why: "groups 0 and 1 are never signalled",
        })?;
        if pgid == group::own_group() {
            return Err(GroupError::Refused {
                pgid,
                why: "it is our own group",
            });
        }
        Ok(Self::unchecked(name.into(), Some(pid)))
    }

    /// Only process `pid`, which leads no group of its own: its group is someone else's.
    pub fn lone(name: impl Into<String>, pid: ProcessId) -> Result<Self, GroupError> {
        if pid == ProcessId::current() {
            return Err(GroupError::Refused {
                pgid: pid.get(),
                why: "it is this process",
            });
        }
        let mut g = Self::unchecked(name.into(), Some(pid));
        g.lone = true;
        Ok(g)
    }

    /// Only what lives in `cg`: the job cgroup of a job whose group is gone.
    #[cfg(target_os = "linux")]
    pub fn cgroup_only(name: impl Into<String>, cg: sys::cgroup::Cgroup) -> Self {
        let mut g = Self::unchecked(name.into(), None);
        g.cgroup = Some(cg);
        g
    }

    fn unchecked(name: String, pgid: Option<ProcessId>) -> Self {
        Self {
            name,
            pgid,
            lone: false,
            #[cfg(target_os = "linux")]
            cgroup: None,
            identity: None,
        }
    }

    /// Adds the cgroup tier: every process in `cg` is signalled too, the grace waits for
    /// `cg` to empty, and the kill is `cgroup.kill`.
    #[cfg(target_os = "linux")]
    pub fn with_cgroup(mut self, cg: sys::cgroup::Cgroup) -> Self {
        self.cgroup = Some(cg);
        self
    }

    /// Signal only while `pid` is the process that started at `start_time`, or, once that
    /// process has exited, while its group still has members: the kernel never hands out
    /// a pid that is the id of a live group, so such a group is still the same one.
    pub fn verified(mut self, pid: ProcessId, start_time: u64) -> Self {
        self.identity = Some((pid, start_time));
        self
    }

    /// True while something this stop would reach lives: the cgroup is populated, or
    /// (without one) the group has a live member.
    pub fn alive(&self) -> bool {
        #[cfg(target_os = "linux")]
        if let Some(cg) = &self.cgroup {
            // A cgroup that cannot be read any more was removed: nothing lives in it.
            return cg.populated().unwrap_or(false);
        }
        match self.pgid {
            Some(pid) if self.lone => group::process_alive(pid),
            Some(pgid) => group::group_alive(pgid),
            None => false,
        }
    }

    /// Stops what the group holds when its leader has already been reaped (or there is
    /// none): nothing is signalled when nothing lives. `on_kill(cut_short)` runs right
    /// before the SIGKILL, for the caller's own log line.
    pub async fn terminate(
        &self,
        grace: Duration,
        hurry: Option<StopDeadline>,
        on_kill: impl FnOnce(bool),
    ) -> Outcome {
        if !self.alive() {
            return Outcome::default();
        }
        self.stop(None::<&mut NoLeader>, grace, hurry, on_kill)
            .await
    }

    /// Stops a group whose leader this process has yet to reap: the grace waits for the
    /// leader and the rest, and the leader is reaped after the kill.
    pub async fn stop_leader(
        &self,
        leader: &mut impl Reapable,
        grace: Duration,
        hurry: Option<StopDeadline>,
        on_kill: impl FnOnce(bool),
    ) -> Outcome {
        self.stop(Some(leader), grace, hurry, on_kill).await
    }

    async fn stop<L: Reapable>(
        &self,
        mut leader: Option<&mut L>,
        grace: Duration,
        hurry: Option<StopDeadline>,
        on_kill: impl FnOnce(bool),
    ) -> Outcome {
        let mut out = Outcome::default();
        if !self.identity_holds() {
            return out;
        }
        let deadline = Instant::now() + grace;
        self.signal(Sig::SIGTERM);
        out.signalled = true;
        let graced = async {
            let mut status = None;
            if let Some(l) = leader.as_deref_mut() {
                match tokio::time::timeout_at(deadline, l.wait()).await {
                    Ok(reaped) => status = reaped.ok(),
                    Err(_) => return (false, None),
                }
            }
            (self.wait_empty(deadline).await, status)
        };
        let gone = tokio::select! {
            // A stop with nothing left to do wins over a deadline already passed.
            biased;
            // Cancel-safe: waiting on the leader (`Reapable::wait` is cancel-safe) and
            // polling the group hold no state; a grace cut short is followed by SIGKILL.
            (gone, status) = graced => {
                out.leader = status;
                gone
            }
            // Cancel-safe: a fresh wait on the deadline.
            () = deadline_passed(hurry) => {
                out.cut_short = true;
                false
            }
        };
        if gone {
            return out;
        }
        // A grace cut short ends the wait without a last look: the group may have emptied
        // since, and an empty group's id may already be someone else's. Without a leader
        // of ours to hold the id, look again (and at the identity) before SIGKILL.
        if leader.is_none() && (!self.alive() || !self.identity_holds()) {
            return out;
        }
        on_kill(out.cut_short);
        out.killed = true;
        self.kill();
        if let Some(l) = leader {
            if let Ok(status) = l.wait().await {
                out.leader = Some(status);
            }
        }
        out.survivors = !self.wait_empty(Instant::now() + KILL_WAIT).await;
        out
    }

    /// The blocking stop, for a caller outside the runtime (the lock reclaim at agent
    /// start). The stop is over once nothing lives and `released()` says so too; a signal
    /// that cannot be sent is an error rather than a warning. `on_kill` runs right before
    /// the SIGKILL.
    pub fn terminate_blocking(
        &self,
        grace: Duration,
        kill_wait: Duration,
        mut released: impl FnMut() -> bool,
        on_kill: impl FnOnce(),
    ) -> Result<Outcome, GroupError> {
        let mut out = Outcome::default();
        if !self.identity_holds() {
            return Ok(out);
        }
        let mut gone = || !self.alive() && released();
        self.try_signal(Sig::SIGTERM)?;
        out.signalled = true;
        if wait_blocking(grace, &mut gone) {
            return Ok(out);
        }
        // The holder may have exited during the grace and its pid be another's by now.
        if !self.identity_holds() {
            return Ok(out);
        }
        on_kill();
        out.killed = true;
        self.try_signal(Sig::SIGKILL)?;
        out.survivors = !wait_blocking(kill_wait, &mut gone);
        Ok(out)
    }

    fn identity_holds(&self) -> bool {
        let Some((pid, start_time)) = self.identity else {
            return true;
        };
        if group::process_alive(pid) {
            if sys::process_start_time(pid) == Some(start_time) {
                return true;
            }
            tracing::warn!(target_name = %self.name, pid = pid.get(), "not signalling: the pid now belongs to another process");
            return false;
        }
        // The leader has exited: its group id is still ours while members live.
        self.pgid
            .is_some_and(|pgid| !self.lone && group::group_alive(pgid))
    }

    /// SIGKILL now, without a grace: `cgroup.kill`, or SIGKILL to the group.
    pub fn kill_now(&self) {
        self.kill();
    }

    /// [`Self::kill_now`], then waits up to `wait` for nothing to live; returns whether
    /// it emptied.
    pub async fn kill_and_wait(&self, wait: Duration) -> bool {
        self.kill();
        self.wait_empty(Instant::now() + wait).await
    }

    fn kill(&self) {
        #[cfg(target_os = "linux")]
        if let Some(cg) = &self.cgroup {
            match cg.kill() {
                Ok(()) => return,
                Err(e) if self.pgid.is_some() => {
                    tracing::error!(child = %self.name, cgroup = %cg.path().display(), error = %e, "cgroup.kill failed: SIGKILL to the process group");
                }
                Err(e) => {
                    tracing::warn!(child = %self.name, cgroup = %cg.path().display(), error = %e, "cgroup.kill failed");
                    return;
                }
            }
        }
        self.signal(Sig::SIGKILL);
    }

    /// Signals the group and every process in the cgroup; a failure is logged.
    fn signal(&self, sig: Sig) {
        if let Err(e) = self.try_signal(sig) {
            tracing::warn!(child = %self.name, error = %crate::error_chain(&e), "could not signal {sig}");
        }
        #[cfg(target_os = "linux")]
        if let Some(cg) = &self.cgroup {
            if let Err(e) = cg.signal_all(sig) {
                tracing::warn!(child = %self.name, cgroup = %cg.path().display(), error = %e, "could not signal {sig} to the cgroup");
            }
        }
    }

    fn try_signal(&self, sig: Sig) -> Result<(), GroupError> {
        let Some(pid) = self.pgid else {
            return Ok(());
        };
        let (what, sent) = if self.lone {
            ("process", group::signal_process(pid, sig))
        } else if !group::group_alive(pid) {
            // Nobody left in it (a leader reaped, the rest in a cgroup or gone): its id may
            // already be another group's.
            return Ok(());
        } else {
            ("process group", group::signal_group(pid, sig))
        };
        sent.map(drop).map_err(|source| GroupError::Signal {
            what,
            pid: pid.get(),
            sig,
            source,
        })
    }

    /// Waits until nothing lives, or `deadline`. Returns whether everything is gone.
    async fn wait_empty(&self, deadline: Instant) -> bool {
        loop {
            if !self.alive() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

fn wait_blocking(limit: Duration, done: &mut impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// Resolves once the stop deadline in `rx` has passed; never while there is none (or no
/// `rx` at all). A fresh call starts a fresh wait, so it may be raced again and again.
pub async fn deadline_passed(rx: Option<StopDeadline>) {
    let Some(mut rx) = rx else {
        return std::future::pending().await;
    };
    loop {
        let deadline = *rx.borrow_and_update();
        match deadline {
            Some(d) => return tokio::time::sleep_until(d).await,
            None => {
                if rx.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
    use tokio::io::AsyncBufReadExt as _;

    /// A shell leading its own group, running `script`, which says `ready` once set up.
    async fn leader(script: &str) -> (tokio::process::Child, ProcessId) {
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(script)
            .stdout(std::process::Stdio::piped())
            .process_group(0);
        let mut child = tokio::process::Command::from(cmd)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn sh");
        let out = child.stdout.take().expect("stdout");
        let mut line = String::new();
        tokio::io::BufReader::new(out)
            .read_line(&mut line)
            .await
            .expect("read");
        assert_eq!(line.trim(), "ready");
        let pid = ProcessId::from_u32(child.id().expect("pid")).expect("pid > 1");
        (child, pid)
    }

    #[test]
    fn refuses_groups_that_are_not_a_childs() {
        for pgid in [-1, 0, 1, group::own_group()] {
            assert!(
                matches!(Group::new("t", pgid), Err(GroupError::Refused { .. })),
                "group {pgid} was accepted"
            );
        }
        assert!(Group::lone("t", ProcessId::current()).is_err());
    }

    #[tokio::test]
    async fn a_group_that_exits_on_sigterm_is_not_killed() {
        let (mut child, pid) = leader("echo ready; exec sleep 30").await;
        let g = Group::new("t", pid.get()).unwrap();
        let out = g
            .stop_leader(&mut child, Duration::from_secs(10), None, |_| {
                panic!("SIGKILL was not needed")
            })
            .await;
        assert!(out.signalled && !out.killed && !out.survivors && !out.cut_short);
        assert_eq!(out.leader.and_then(|s| s.signal()), Some(libc::SIGTERM));
        assert!(!group::group_alive(pid));
    }

    #[tokio::test]
    async fn what_ignores_sigterm_gets_sigkill_after_the_grace() {
        // A grandchild that ignores SIGTERM keeps the group alive after the leader exits.
        let (mut child, pid) =
            leader("(trap '' TERM; echo ready; exec sleep 30) & exec sleep 30").await;
        let g = Group::new("t", pid.get()).unwrap();
        let grace = Duration::from_millis(200);
        let started = Instant::now();
        let mut noticed = None;
        let out = g
            .stop_leader(&mut child, grace, None, |cut| noticed = Some(cut))
            .await;
        assert!(started.elapsed() >= grace);
        assert_eq!(noticed, Some(false));
        assert!(out.signalled && out.killed && !out.survivors && !out.cut_short);
        assert!(!group::group_alive(pid));
    }

    #[tokio::test]
    async fn a_stop_deadline_cuts_the_grace_short() {
        let (mut child, pid) = leader("trap '' TERM; echo ready; exec sleep 30").await;
        let g = Group::new("t", pid.get()).unwrap();
        let (tx, rx) = watch::channel(None);
        let started = Instant::now();
        let stop = g.stop_leader(&mut child, Duration::from_secs(60), Some(rx), |_| {});
        // The deadline is set while the stop is already under way.
        tx.send_replace(Some(Instant::now() + Duration::from_millis(100)));
        let out = stop.await;
        assert!(out.killed && out.cut_short && !out.survivors);
        assert_eq!(out.leader.and_then(|s| s.signal()), Some(libc::SIGKILL));
        assert!(started.elapsed() < Duration::from_secs(30));
    }

    #[tokio::test]
    async fn nothing_is_signalled_when_the_identity_does_not_match() {
        let (mut child, pid) = leader("echo ready; exec sleep 30").await;
        let start = sys::process_start_time(pid).unwrap_or(0);
        let g = Group::new("t", pid.get())
            .unwrap()
            .verified(pid, start.wrapping_add(1));
        let out = g.terminate(Duration::ZERO, None, |_| {}).await;
        assert!(!out.signalled);
        assert!(group::process_alive(pid));
        child.kill().await.expect("kill");
    }

    #[tokio::test]
    async fn an_empty_group_is_left_alone() {
        let (mut child, pid) = leader("echo ready; exit 0").await;
        child.wait().await.expect("wait");
        let out = Group::new("t", pid.get())
            .unwrap()
            .terminate(Duration::ZERO, None, |_| {})
            .await;
        assert!(!out.signalled);
    }

    #[test]
    fn the_blocking_stop_kills_what_ignores_sigterm() {
        let mut child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg("trap '' TERM; echo ready; exec sleep 30")
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("spawn sh");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("read");
        let pid = ProcessId::from_u32(child.id()).expect("pid");
        let g = Group::new("t", pid.get()).unwrap();
        let mut killed = false;
        let out = g
            .terminate_blocking(
                Duration::from_millis(100),
                KILL_WAIT,
                || true,
                || killed = true,
            )
            .expect("signals");
        assert!(killed && out.killed && !out.survivors);
        assert_eq!(child.wait().expect("wait").signal(), Some(libc::SIGKILL));
    }
}
