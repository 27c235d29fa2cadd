//! Drains on the agent's side (docs/design.md, "Drain"): one drain in force on the host,
//! made of every reason there is to take no new job, set on the runner, which refuses new
//! jobs under it and cancels what is left at its deadline.
//!
//! Task: [`DrainTask`], one per agent; the main loop holds its [`DrainHandle`].
//! - In: the host's drain ([`kept`], at start and on SIGHUP); an upgrade's drain while
//!   it waits to switch; the desired state in force ([`Observed`]: a hub's `accept_jobs:
//!   false` and `drain_deadline_ms`), and the runner's status (a restarted runner is
//!   told again).
//! - Out: `PUT|DELETE /v1/drain` on the runner whenever the drain in force differs from
//!   what it was told, and `GET /v1/drain` every [`TICK`] while draining (the jobs left);
//!   a [`DrainReport`] on a watch channel, for the hub task (each report carries it), the
//!   jobs task (a refused hub job waits for the drain's end) and an upgrade (which
//!   switches once nothing is left), and to the status reporter.
//!
//! Deadlines are wall-clock times (a hub's are its clock's): hosts and hubs keep time
//! with NTP.

pub mod kept;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::desired::Observed;
use super::reporter::ReporterHandle;
use super::runner_link::RunnerLink;
use crate::proto::desired::DesiredState;
use crate::proto::drain::{Drain, DrainReport, HUB_REASON};
use crate::supervisor::State;

/// How often the jobs left are counted while draining, and a failed `PUT` tried again.
const TICK: Duration = Duration::from_secs(1);
/// What a runner the hub disables says while it drains.
const DISABLE_REASON: &str = "the hub disables the runner: it stops once no job is left";
/// How long the runner has to answer.
const RUNNER_TIMEOUT: Duration = Duration::from_secs(5);

/// The reasons to drain other than the hub's (which comes with the desired state).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Sources {
    host: Option<Drain>,
    upgrade: Option<Drain>,
}

/// The way to the drain task.
pub(super) struct DrainHandle {
    sources: Arc<watch::Sender<Sources>>,
    report: watch::Receiver<Option<DrainReport>>,
    state_dir: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

/// What the drain task starts from: the drains kept in the state directory ([`kept`]).
pub(super) struct Kept {
    pub(super) host: Option<Drain>,
    pub(super) upgrade: Option<Drain>,
}

impl Kept {
    /// Read off the async threads; a read that fails is a drain (see [`kept::read`]).
    pub(super) async fn read(state_dir: &Path) -> Self {
        let dir = state_dir.to_owned();
        let read = tokio::task::spawn_blocking(move || Self {
            host: kept::read(&dir, kept::HOST_DRAIN_FILE),
            upgrade: kept::read(&dir, kept::UPGRADE_DRAIN_FILE),
        });
        read.await.unwrap_or_else(|_| Self {
            host: Some(Drain {
                reason: format!("{}; its file could not be read", kept::HOST_REASON),
                since_ms: crate::util::unix_now_ms(),
                deadline_ms: None,
            }),
            upgrade: None,
        })
    }
}

impl DrainHandle {
    /// Starts the task with the drains kept in the state directory.
    /// `report`: where the drain in force is published (made before the reconciler, which
    /// reads it too).
    pub(super) fn spawn(
        observed: watch::Receiver<Observed>,
        runner: RunnerLink,
        kept: Kept,
        state_dir: PathBuf,
        reporter: ReporterHandle,
        report_tx: watch::Sender<Option<DrainReport>>,
    ) -> Self {
        let (sources, sources_rx) = watch::channel(Sources {
            host: kept.host,
            upgrade: kept.upgrade,
        });
        let report = report_tx.subscribe();
        let task = DrainTask {
            sources: sources_rx,
            observed,
            runner,
            reporter,
            report: report_tx,
            hub_since: None,
            told: None,
        };
        Self {
            sources: Arc::new(sources),
            report,
            state_dir,
            task: tokio::spawn(task.run()),
        }
    }

    /// The upgrade's way to the drain.
    pub(super) fn for_upgrade(&self) -> UpgradeDrain {
        UpgradeDrain {
            sources: self.sources.clone(),
            report: self.report.clone(),
            state_dir: self.state_dir.clone(),
        }
    }

    /// The host's drain, read again (SIGHUP).
    pub(super) fn set_host(&self, drain: Option<Drain>) {
        self.sources.send_if_modified(|s| {
            let moved = s.host != drain;
            s.host = drain;
            moved
        });
    }

    /// The drain in force on the host, as it is reported.
    pub(super) fn report(&self) -> watch::Receiver<Option<DrainReport>> {
        self.report.clone()
    }

    /// Ends the task; the runner keeps the drain it was told.
    pub(super) fn shutdown(self) {
        self.task.abort();
    }
}

/// An upgrade's way to the drain (docs/design.md, "Upgrades never kill a job that can
/// finish"): a drain while it waits to switch, kept in `upgrade-drain.json` so that an
/// agent killed meanwhile starts drained, and the jobs it waits for.
#[derive(Clone)]
pub(super) struct UpgradeDrain {
    sources: Arc<watch::Sender<Sources>>,
    report: watch::Receiver<Option<DrainReport>>,
    state_dir: PathBuf,
}

impl UpgradeDrain {
    /// The upgrade's drain in force (one kept by an agent that was killed in it, too).
    pub(super) fn current(&self) -> Option<Drain> {
        self.sources.borrow().upgrade.clone()
    }

    /// Puts `drain` in force; kept first, but in force even when it cannot be kept.
    pub(super) async fn begin(&self, drain: Drain) {
        let (dir, d) = (self.state_dir.clone(), drain.clone());
        let kept =
            tokio::task::spawn_blocking(move || kept::write(&dir, kept::UPGRADE_DRAIN_FILE, &d))
                .await;
        if let Ok(Err(e)) = kept {
            tracing::warn!(error = %crate::error_chain(&e), "could not keep the upgrade's drain: an agent restarted before the switch takes jobs until it drains again");
        }
        self.set(Some(drain));
    }

    /// Ends the upgrade's drain, if one is in force.
    pub(super) async fn end(&self) {
        if self.current().is_none() {
            return;
        }
        let dir = self.state_dir.clone();
        let removed =
            tokio::task::spawn_blocking(move || kept::remove(&dir, kept::UPGRADE_DRAIN_FILE)).await;
        if let Ok(Err(e)) = removed {
            tracing::warn!(error = %crate::error_chain(&e), "could not remove the upgrade's kept drain: the next agent drains until it finds no upgrade waiting");
        }
        self.set(None);
    }

    fn set(&self, drain: Option<Drain>) {
        self.sources.send_if_modified(|s| {
            let moved = s.upgrade != drain;
            s.upgrade = drain;
            moved
        });
    }

    /// The drain in force on the host, with the jobs left.
    pub(super) fn report(&self) -> watch::Receiver<Option<DrainReport>> {
        self.report.clone()
    }
}

/// The hub's drain in the desired state in force, begun at `since_ms`: a drain, or a
/// runner disabled with `drain_first`.
fn hub_drain(desired: &DesiredState, since_ms: u64) -> Option<Drain> {
    let disabling = !desired.runner.enabled && desired.runner.drain_first;
    let reason = match (!desired.accept_jobs, disabling) {
        (false, false) => return None,
        (true, false) => HUB_REASON.to_owned(),
        (false, true) => DISABLE_REASON.to_owned(),
        (true, true) => format!("{HUB_REASON}; {DISABLE_REASON}"),
    };
    Some(Drain {
        reason,
        since_ms,
        deadline_ms: desired.drain_deadline_ms,
    })
}

/// One drain of all the reasons in force: each reason said, the earliest start and the
/// earliest deadline (every source's deadline holds).
fn combined(parts: &[Option<&Drain>]) -> Option<Drain> {
    let parts: Vec<&Drain> = parts.iter().flatten().copied().collect();
    let first = parts.first()?;
    let mut reason = first.reason.clone();
    for d in &parts[1..] {
        reason.push_str("; ");
        reason.push_str(&d.reason);
    }
    Some(Drain {
        reason: crate::util::prefix_bytes(&reason, crate::proto::drain::MAX_REASON).to_owned(),
        since_ms: parts
            .iter()
            .map(|d| d.since_ms)
            .min()
            .unwrap_or(first.since_ms),
        deadline_ms: parts.iter().filter_map(|d| d.deadline_ms).min(),
    })
}

struct DrainTask {
    sources: watch::Receiver<Sources>,
    observed: watch::Receiver<Observed>,
    runner: RunnerLink,
    reporter: ReporterHandle,
    report: watch::Sender<Option<DrainReport>>,
    /// When the hub's drain was first seen (the hub says only whether it drains).
    hub_since: Option<u64>,
    /// What the runner was told last, and the runner's start count then: a restarted
    /// runner is told again.
    told: Option<(Option<Drain>, u64)>,
}

impl DrainTask {
    async fn run(mut self) {
        loop {
            let (want, host, runner) = {
                let s = self.sources.borrow_and_update();
                let o = self.observed.borrow_and_update();
                let hub = hub_drain(
                    &o.desired,
                    *self.hub_since.get_or_insert_with(crate::util::unix_now_ms),
                );
                if hub.is_none() {
                    self.hub_since = None;
                }
                let want = combined(&[s.host.as_ref(), hub.as_ref(), s.upgrade.as_ref()]);
                (
                    want,
                    s.host.is_some(),
                    (o.runner.clone(), o.desired.runner.enabled),
                )
            };
            let jobs_left = match runner {
                (r, _) if r.state == State::Running => self.tell(&want, r.starts).await,
                // No runner, no jobs: a disabled runner's were stopped.
                (r, false) if r.state == State::Stopped => Some(0),
                _ => None,
            };
            let report = want.as_ref().map(|d| DrainReport {
                reason: d.reason.clone(),
                since_ms: d.since_ms,
                deadline_ms: d.deadline_ms,
                jobs_left,
                host,
            });
            if self.report.send_if_modified(|r| {
                let moved = *r != report;
                *r = report.clone();
                moved
            }) {
                self.reporter.drain(report);
            }
            let told = self.told.as_ref().is_some_and(|(d, _)| *d == want);
            let tick = want.is_some() || !told;
            tokio::select! {
                // Cancel-safe: watch receivers keep their seen-version between polls.
                r = self.sources.changed() => if r.is_err() { return },
                r = self.observed.changed() => if r.is_err() { return },
                // Cancel-safe: a sleep.
                () = tokio::time::sleep(TICK), if tick => {}
            }
        }
    }

    /// Tells the runner `want` unless it was told so since it started, and returns the
    /// jobs it still holds; `None` when it could not be asked.
    async fn tell(&mut self, want: &Option<Drain>, starts: u64) -> Option<u64> {
        let client = self.runner.client().await.ok()?;
        let same = self
            .told
            .as_ref()
            .is_some_and(|(d, s)| d == want && *s == starts);
        let asked = async {
            if same {
                client.drain().await
            } else {
                client.set_drain(want.as_ref()).await
            }
        };
        match tokio::time::timeout(RUNNER_TIMEOUT, asked).await {
            Ok(Ok(view)) => {
                self.told = Some((want.clone(), starts));
                Some(view.jobs_left())
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %crate::error_chain(&e), "could not tell the runner the drain in force; trying again");
                self.told = None;
                None
            }
            Err(_) => {
                self.told = None;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(reason: &str, since_ms: u64, deadline_ms: Option<u64>) -> Drain {
        Drain {
            reason: reason.into(),
            since_ms,
            deadline_ms,
        }
    }

    #[test]
    fn every_reason_is_said_and_the_earliest_deadline_holds() {
        assert_eq!(combined(&[None, None]), None);
        let host = drain("host", 20, None);
        let hub = drain("hub", 10, Some(500));
        let upgrade = drain("upgrade to 1.4.0", 30, Some(300));
        assert_eq!(combined(&[Some(&host), None]), Some(host.clone()));
        assert_eq!(
            combined(&[Some(&host), Some(&hub), Some(&upgrade)]),
            Some(drain("host; hub; upgrade to 1.4.0", 10, Some(300)))
        );
    }

    #[test]
    fn the_hub_drains_only_when_it_takes_jobs_away() {
        let mut d = DesiredState::default();
        assert_eq!(hub_drain(&d, 7), None);
        d.accept_jobs = false;
        d.drain_deadline_ms = Some(99);
        assert_eq!(hub_drain(&d, 7), Some(drain(HUB_REASON, 7, Some(99))));
        d.runner.enabled = false;
        assert_eq!(
            hub_drain(&d, 7).map(|d| d.reason),
            Some(HUB_REASON.to_owned()),
            "a runner disabled at once is no drain"
        );
        d.runner.drain_first = true;
        d.accept_jobs = true;
        assert_eq!(hub_drain(&d, 7), Some(drain(DISABLE_REASON, 7, Some(99))));
    }
}
