//! The reconciler: the one place where a desired state is applied to this host.
//!
//! Task: [`ReconcilerTask`], one per agent; it owns the runner's [`Supervisor`].
//! - In (through [`ReconcilerHandle`]): a new agent configuration, with the desired state
//!   derived from it (SIGHUP, standalone: [`standalone`]) or without one (SIGHUP with a
//!   hub: the hub's desired state in force is applied again with the new local
//!   settings); the hub's desired states (from the hub task); `shutdown`. Also the
//!   supervisor's status changes and a [`STATUS_EVERY`] tick.
//! - Out: the runner started, restarted or stopped to match (each stop finished with
//!   `cgroup.kill` and `runner reap`, see [`finish_runner_stop`]), or, when only its
//!   admission limits changed, told them while it runs (`PUT /v1/admission`, no
//!   restart; [`decide`] says which); the runner's status and what a stop reaped, to the
//!   [`ReporterHandle`]; a hub's desired state, once applied, to `<state>/desired.json`;
//!   what is applied and observed ([`Observed`]), on a watch channel the hub task
//!   reports from.
//!
//! Commands are applied one at a time, in order: a SIGTERM that arrives during a
//! reload's runner restart is acted on when that restart is done. The watchdog pings
//! from its own task meanwhile.

mod child;
mod decide;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot, watch};

pub(super) use self::child::REAP_TIMEOUT;
use self::child::{build, finish_runner_stop, runner_run_args};
pub(super) use self::decide::standalone;
use self::decide::{admission_names, decide, RunnerSpec, Step};
use super::config::AgentConfig;
use super::desired::{self, Observed};
use super::reporter::ReporterHandle;
use super::runner_link::RunnerLink;
use super::AgentError;
use crate::proto::admission::{Admission, AdmissionChange};
use crate::proto::desired::DesiredState;
use crate::proto::drain::DrainReport;
use crate::supervisor::{State, Status, Supervisor};
use crate::sys::exe::PinnedExe;

/// The runner's status goes to the reporter at least this often, so a reader of the
/// status file can tell a hung agent by a stale `updated_at`.
const STATUS_EVERY: Duration = Duration::from_secs(10);
/// How long the runner has to take new admission limits before it is restarted with
/// them instead.
const ADJUST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a runner that does not serve yet is asked again, within ADJUST_TIMEOUT.
const ADJUST_POLL: Duration = Duration::from_millis(100);

/// Whether `apply` converged to what it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Applied,
    /// Not applied, and why (also logged); what runs is kept.
    Refused(String),
}

enum Command {
    /// A re-read configuration and the desired state derived from it; `None` keeps the
    /// desired state in force (a hub's) and applies it again with the new settings.
    Reload {
        cfg: Box<AgentConfig>,
        desired: Option<Box<DesiredState>>,
        /// Told once the reload is applied or refused (why); dropped unsent when the
        /// reconciler ends first.
        done: oneshot::Sender<Result<(), String>>,
    },
    /// A desired state from the hub; `reset`: applied even if older than the one in
    /// force (the hub refused that one's generation).
    Desired {
        desired: Box<DesiredState>,
        reset: bool,
    },
    Shutdown,
}

/// A reconciler built (its first runner validated) but not yet running.
pub(super) struct Reconciler {
    cfg: AgentConfig,
    desired: DesiredState,
    exe: Arc<PinnedExe>,
    runner: RunnerLink,
    first: Supervisor,
}

impl Reconciler {
    /// Builds the runner's supervisor for `cfg` and `desired`: every reason the runner
    /// would be refused shows here, before anything has started.
    pub(super) async fn new(
        cfg: AgentConfig,
        desired: DesiredState,
        exe: Arc<PinnedExe>,
        runner: RunnerLink,
    ) -> Result<Self, AgentError> {
        let spec = RunnerSpec::new(&cfg, &desired);
        let first = build(&cfg, &spec.desired, &exe).await?;
        Ok(Self {
            cfg,
            desired,
            exe,
            runner,
            first,
        })
    }

    /// Starts the runner (where the desired state wants one) and the reconciler's task.
    /// `drain`: the drain in force on the host, which a runner disabled with
    /// `drain_first` waits out before it stops.
    pub(super) async fn spawn(
        self,
        reporter: ReporterHandle,
        drain: watch::Receiver<Option<DrainReport>>,
    ) -> Result<(ReconcilerHandle, ReconcilerTaskHandle), AgentError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (observed, observed_rx) = watch::channel(Observed {
            desired: self.desired.clone(),
            handled: 0,
            refused: None,
            runner: stopped_status(),
        });
        let mut task = ReconcilerTask {
            rx,
            cfg: self.cfg,
            desired: self.desired,
            exe: self.exe,
            runner: self.runner,
            sup: None,
            running: None,
            changes: None,
            earlier_starts: 0,
            reporter,
            observed,
            drain,
            stop_when_idle: false,
            refusal: None,
        };
        let spec = RunnerSpec::new(&task.cfg, &task.desired);
        if spec.desired.enabled {
            task.start(self.first, spec).await?;
        }
        task.report();
        let handle = ReconcilerHandle {
            tx: tx.clone(),
            observed: observed_rx,
        };
        let task = ReconcilerTaskHandle {
            tx,
            task: tokio::spawn(task.run()),
        };
        Ok((handle, task))
    }
}

/// The way to the reconciler task; cheap to clone (the main loop and the hub task each
/// hold one).
#[derive(Clone)]
pub(super) struct ReconcilerHandle {
    tx: mpsc::UnboundedSender<Command>,
    observed: watch::Receiver<Observed>,
}

impl ReconcilerHandle {
    /// Queues a re-read configuration and its desired state (`None`: keep the one in
    /// force); applied after whatever is being applied now. The receiver says when it has
    /// been (its runner restarted, when the change needs that), or why it was refused.
    pub(super) fn reload(
        &self,
        cfg: AgentConfig,
        desired: Option<DesiredState>,
    ) -> oneshot::Receiver<Result<(), String>> {
        let (done, applied) = oneshot::channel();
        let _ = self.tx.send(Command::Reload {
            cfg: Box::new(cfg),
            desired: desired.map(Box::new),
            done,
        });
        applied
    }

    /// Queues a desired state from the hub. [`Observed::handled`] moves on once it has
    /// been applied or refused. `reset`: applied even if older than the one in force.
    pub(super) fn desired(&self, desired: DesiredState, reset: bool) {
        let _ = self.tx.send(Command::Desired {
            desired: Box::new(desired),
            reset,
        });
    }

    /// What is applied and observed, updated on every change.
    pub(super) fn observed(&self) -> watch::Receiver<Observed> {
        self.observed.clone()
    }
}

/// The reconciler task itself, held by the main loop only: its end, and its shutdown.
pub(super) struct ReconcilerTaskHandle {
    tx: mpsc::UnboundedSender<Command>,
    task: tokio::task::JoinHandle<Result<(), AgentError>>,
}

impl ReconcilerTaskHandle {
    /// Resolves only if the task ended on its own: a runner it could not start.
    pub(super) async fn failed(&mut self) -> Result<(), AgentError> {
        joined((&mut self.task).await)
    }

    /// Stops the runner (finishing the stop) and ends the task.
    pub(super) async fn shutdown(self) -> Result<(), AgentError> {
        let _ = self.tx.send(Command::Shutdown);
        joined(self.task.await)
    }
}

fn joined(r: Result<Result<(), AgentError>, tokio::task::JoinError>) -> Result<(), AgentError> {
    r.unwrap_or_else(|source| {
        Err(AgentError::Task {
            what: "reconciler",
            source,
        })
    })
}

fn stopped_status() -> Status {
    Status {
        state: State::Stopped,
        pid: None,
        starts: 0,
        last_error: None,
        since: SystemTime::now(),
    }
}

struct ReconcilerTask {
    rx: mpsc::UnboundedReceiver<Command>,
    cfg: AgentConfig,
    /// The desired state applied last.
    desired: DesiredState,
    exe: Arc<PinnedExe>,
    runner: RunnerLink,
    sup: Option<Supervisor>,
    /// The spec the runner runs with (built from, or since adjusted to), while started.
    running: Option<RunnerSpec>,
    changes: Option<watch::Receiver<Status>>,
    /// Starts by supervisors already replaced: `starts` counts over the agent's life.
    earlier_starts: u64,
    reporter: ReporterHandle,
    observed: watch::Sender<Observed>,
    drain: watch::Receiver<Option<DrainReport>>,
    /// The desired state disables the runner, draining first: it stops once no job is
    /// left (docs/design.md, "Drain").
    stop_when_idle: bool,
    /// Why the last runner settings were refused: the same refusal again (the hub's
    /// state asked for at each answer) is logged at debug level only.
    refusal: Option<String>,
}

impl ReconcilerTask {
    async fn run(mut self) -> Result<(), AgentError> {
        let mut tick = tokio::time::interval(STATUS_EVERY);
        loop {
            tokio::select! {
                // Cancel-safe: mpsc::recv loses no message when another arm wins.
                cmd = self.rx.recv() => match cmd {
                    Some(Command::Reload { cfg, desired, done }) => {
                        let outcome = self.reload(*cfg, desired.map(|d| *d)).await?;
                        self.runner_spawned().await;
                        // The runner as it is now reaches the status file before the
                        // reload's end does.
                        self.report();
                        let _ = done.send(match outcome {
                            Outcome::Applied => Ok(()),
                            Outcome::Refused(why) => Err(why),
                        });
                    }
                    Some(Command::Desired { desired, reset }) => {
                        self.apply_hub(*desired, reset).await?;
                    }
                    Some(Command::Shutdown) | None => break,
                },
                // Cancel-safe: a watch receiver keeps its seen-version between polls.
                status = changed(&mut self.changes) => self.send_status(status),
                // Cancel-safe, as above. A disabled runner drained: it stops now.
                r = self.drain.changed(), if self.stop_when_idle => {
                    if r.is_err() || self.idle() {
                        tracing::info!("the runner has no job left: stopping it, as the desired state asks");
                        self.stop_when_idle = false;
                        self.stop_runner().await;
                        self.report();
                    }
                }
                // Cancel-safe: an interval keeps its schedule between polls.
                _ = tick.tick() => self.report(),
            }
        }
        self.stop_runner().await;
        self.report();
        Ok(())
    }

    /// SIGHUP: the directories are fixed for the agent's life; the rest is applied.
    async fn reload(
        &mut self,
        mut cfg: AgentConfig,
        desired: Option<DesiredState>,
    ) -> Result<Outcome, AgentError> {
        if cfg.state_dir != self.cfg.state_dir || cfg.log_dir != self.cfg.log_dir {
            tracing::warn!(
                "SIGHUP: state_dir and log_dir changes take effect when the agent restarts"
            );
            cfg.state_dir = self.cfg.state_dir.clone();
            cfg.log_dir = self.cfg.log_dir.clone();
        }
        let desired = desired.unwrap_or_else(|| self.desired.clone());
        self.apply("SIGHUP", cfg, desired, false).await
    }

    /// A desired state from the hub: applied with the configuration in force, then kept
    /// in `<state>/desired.json` for a start while the hub is unreachable.
    async fn apply_hub(&mut self, desired: DesiredState, reset: bool) -> Result<(), AgentError> {
        if let Some(agent) = &desired.agent {
            let new = Some(agent) != self.desired.agent.as_ref();
            if new && agent.version != crate::build_info::VERSION {
                tracing::info!(version = %agent.version, rollback = agent.rollback, running = crate::build_info::VERSION, "the hub asks for another agent version: the upgrade takes it from here");
            }
        }
        let outcome = self
            .apply("hub", self.cfg.clone(), desired.clone(), reset)
            .await?;
        if outcome == Outcome::Applied {
            let state_dir = self.cfg.state_dir.clone();
            let saved = tokio::task::spawn_blocking(move || desired::persist(&state_dir, &desired))
                .await
                .unwrap_or_else(|source| {
                    Err(desired::DesiredError::Task {
                        what: "desired state write",
                        source,
                    })
                });
            if let Err(e) = saved {
                tracing::error!(error = %crate::error_chain(&e), "could not keep the hub's desired state: a start while the hub is unreachable would not know it");
            }
        }
        self.observed.send_modify(|o| {
            o.handled += 1;
            o.refused = match outcome {
                Outcome::Applied => None,
                Outcome::Refused(why) => Some(why),
            };
        });
        Ok(())
    }

    /// Converges to `cfg` and `desired` (an older generation only on a `reset`). Settings
    /// that cannot be applied are logged and the running ones kept; only a runner that
    /// cannot be started at all is an error.
    async fn apply(
        &mut self,
        origin: &str,
        cfg: AgentConfig,
        desired: DesiredState,
        reset: bool,
    ) -> Result<Outcome, AgentError> {
        let want = RunnerSpec::new(&cfg, &desired);
        let generation = desired.generation;
        let floor = if reset { 0 } else { self.desired.generation };
        let step = decide(floor, self.running.as_ref(), &desired, &want);
        if step != Step::Stale {
            self.stop_when_idle = false;
        }
        match step {
            Step::Stale => {
                tracing::warn!(
                    got = generation,
                    applied = self.desired.generation,
                    "{origin}: ignoring an older desired state than the one applied"
                );
                return Ok(Outcome::Refused(format!(
                    "generation {generation} is older than the applied {}",
                    self.desired.generation
                )));
            }
            Step::Keep => {
                tracing::info!(generation, "{origin}: runner settings unchanged");
                self.accept(cfg, desired);
            }
            Step::Stop if desired.runner.drain_first && !self.idle() => {
                tracing::info!(
                    generation,
                    "{origin}: the desired state disables the runner; it drains first (its jobs finish, none is taken), then stops"
                );
                self.stop_when_idle = true;
                self.accept(cfg, desired);
            }
            Step::Stop => {
                tracing::info!(
                    generation,
                    "{origin}: the desired state disables the runner; stopping it"
                );
                self.stop_runner().await;
                self.accept(cfg, desired);
            }
            Step::Start => {
                tracing::info!(
                    generation,
                    "{origin}: the desired state enables the runner; starting it"
                );
                return self.restart(origin, cfg, desired, want).await;
            }
            Step::Restart(reasons) => {
                tracing::info!(
                    generation,
                    "{origin}: restarting the runner: {} changed",
                    reasons.join(", ")
                );
                return self.restart(origin, cfg, desired, want).await;
            }
            Step::Adjust(change) => {
                let names = admission_names(&change).join(", ");
                match self.adjust(&change).await {
                    Ok(now) => {
                        tracing::info!(
                            generation,
                            max_jobs = now.max_jobs,
                            max_jobs_per_owner = now.max_jobs_per_owner,
                            max_queued = now.max_queued,
                            "{origin}: {names} changed; the running runner took the new admission limits"
                        );
                        // A restart after a crash must not bring the old limits back.
                        if let Some(sup) = &self.sup {
                            sup.set_args(runner_run_args(&cfg, &want.desired));
                        }
                        self.running = Some(want);
                        self.accept(cfg, desired);
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::error_chain(&e), generation, "{origin}: restarting the runner: {names} changed, and the running runner did not take the new limits");
                        return self.restart(origin, cfg, desired, want).await;
                    }
                }
            }
        }
        self.report();
        Ok(Outcome::Applied)
    }

    /// True when the runner holds no job (a drain counted none left), or is not running.
    fn idle(&self) -> bool {
        let running = self.observed.borrow().runner.state == State::Running;
        !running || self.drain.borrow().as_ref().and_then(|d| d.jobs_left) == Some(0)
    }

    /// Changes the running runner's admission limits (`PUT /v1/admission`), once it
    /// serves: one started moments ago (the agent's start, then the hub's first answer)
    /// is waited for, within ADJUST_TIMEOUT, rather than restarted.
    async fn adjust(&self, change: &AdmissionChange) -> Result<Admission, AgentError> {
        let socket = self.runner.socket().to_owned();
        // A runner that has not written its token yet is no problem: a refused request
        // reads it again.
        let client = self
            .runner
            .client()
            .await
            .map_err(|source| AgentError::Task {
                what: "runner client",
                source,
            })?;
        let deadline = tokio::time::Instant::now() + ADJUST_TIMEOUT;
        let timed_out = |socket| AgentError::AdmissionTimeout {
            socket,
            after: ADJUST_TIMEOUT,
        };
        loop {
            match tokio::time::timeout_at(deadline, client.health()).await {
                Ok(Ok(_)) => break,
                Ok(Err(_)) if tokio::time::Instant::now() + ADJUST_POLL < deadline => {
                    tokio::time::sleep(ADJUST_POLL).await;
                }
                Ok(Err(source)) => return Err(AgentError::Admission { socket, source }),
                Err(_) => return Err(timed_out(socket)),
            }
        }
        match tokio::time::timeout_at(deadline, client.set_admission(change)).await {
            Ok(Ok(now)) => Ok(now),
            Ok(Err(source)) => Err(AgentError::Admission { socket, source }),
            Err(_) => Err(timed_out(socket)),
        }
    }

    /// Replaces the runner (if one runs) with one built from `want`. A runner that cannot
    /// be built (its account, its directories) is refused before anything is stopped.
    async fn restart(
        &mut self,
        origin: &str,
        cfg: AgentConfig,
        desired: DesiredState,
        want: RunnerSpec,
    ) -> Result<Outcome, AgentError> {
        let sup = match build(&cfg, &want.desired, &self.exe).await {
            Ok(sup) => sup,
            Err(e) => {
                let why = crate::error_chain(&e);
                if self.refusal.as_ref() == Some(&why) {
                    tracing::debug!(error = %why, "{origin}: still cannot apply the new runner settings; keeping the running ones");
                } else {
                    tracing::error!(error = %why, "{origin}: cannot apply the new runner settings; keeping the running ones");
                }
                self.refusal = Some(why.clone());
                return Ok(Outcome::Refused(why));
            }
        };
        self.refusal = None;
        self.stop_runner().await;
        self.accept(cfg, desired);
        self.start(sup, want).await?;
        self.report();
        Ok(Outcome::Applied)
    }

    fn accept(&mut self, cfg: AgentConfig, desired: DesiredState) {
        if cfg.config_path != self.cfg.config_path {
            self.reporter.config_path(cfg.config_path.clone());
        }
        self.cfg = cfg;
        self.observed.send_if_modified(|o| {
            let changed = o.desired != desired;
            o.desired = desired.clone();
            changed
        });
        self.desired = desired;
    }

    async fn start(&mut self, sup: Supervisor, spec: RunnerSpec) -> Result<(), AgentError> {
        if let Some(old) = self.sup.take() {
            self.earlier_starts += old.starts();
        }
        let sup = self.sup.insert(sup);
        sup.start().await?;
        self.changes = Some(sup.subscribe());
        self.running = Some(spec);
        Ok(())
    }

    /// Stops the runner, if one runs, and finishes the stop. Only this and `start` touch
    /// the supervisor.
    async fn stop_runner(&mut self) {
        let Some(sup) = &self.sup else { return };
        if self.running.take().is_none() {
            return;
        }
        sup.stop().await;
        let reaped = finish_runner_stop(&self.cfg, sup, &self.exe).await;
        self.reporter.reaped(reaped);
    }

    /// Until a runner just started has a process (or its start failed into a backoff),
    /// within ADJUST_TIMEOUT: a reload ends with its runner there, not about to be.
    async fn runner_spawned(&mut self) {
        let (Some(changes), Some(_)) = (self.changes.as_mut(), self.running.as_ref()) else {
            return;
        };
        let spawned = changes.wait_for(|s| s.state != State::Stopped);
        let _ = tokio::time::timeout(ADJUST_TIMEOUT, spawned).await;
    }

    fn report(&self) {
        let status = match &self.sup {
            Some(sup) => sup.status(),
            None => stopped_status(),
        };
        self.send_status(status);
    }

    fn send_status(&self, mut status: Status) {
        status.starts += self.earlier_starts;
        self.observed.send_if_modified(|o| {
            // `since` alone (a fresh snapshot of no supervisor) is no change.
            let changed = (
                o.runner.state,
                o.runner.pid,
                o.runner.starts,
                &o.runner.last_error,
            ) != (status.state, status.pid, status.starts, &status.last_error);
            if changed {
                o.runner = status.clone();
            }
            changed
        });
        self.reporter.runner(status, self.desired.runner.enabled);
    }
}

/// The next status of the supervisor, if there is one; pending otherwise.
async fn changed(rx: &mut Option<watch::Receiver<Status>>) -> Status {
    if let Some(rx) = rx {
        if rx.changed().await.is_ok() {
            return rx.borrow_and_update().clone();
        }
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_watch_without_a_supervisor_never_fires() {
        let mut none = None;
        let waited = tokio::time::timeout(Duration::from_secs(3600), changed(&mut none)).await;
        assert!(waited.is_err());

        let (tx, rx) = watch::channel(Status {
            state: State::Stopped,
            pid: None,
            starts: 0,
            last_error: None,
            since: SystemTime::now(),
        });
        let mut some = Some(rx);
        tx.send_modify(|s| s.starts = 1);
        assert_eq!(changed(&mut some).await.starts, 1);
        // A supervisor that went away: pending, not a busy loop of errors.
        drop(tx);
        let waited = tokio::time::timeout(Duration::from_secs(3600), changed(&mut some)).await;
        assert!(waited.is_err());
    }
}
