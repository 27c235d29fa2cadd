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

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot, watch};

#[cfg(target_os = "linux")]
use super::cgroup;
use super::config::{AgentConfig, RunnerSettings};
use super::reporter::ReporterHandle;
use super::{AgentError, REAP_GRACE, REAP_TIMEOUT, RUNNER_LOG};
use crate::proto::admission::{Admission, AdmissionChange};
use crate::proto::desired::{DesiredRunner, DesiredState};
use crate::runner::client::Client;
use crate::runner::leftover::ReapReport;
use crate::supervisor::account::Account;
use crate::supervisor::{self, env, Identity, State, Status, Supervisor};
use crate::sys::exe::PinnedExe;

/// The runner's status goes to the reporter at least this often, so a reader of the
/// status file can tell a hung agent by a stale `updated_at`.
const STATUS_EVERY: Duration = Duration::from_secs(10);
/// How long the runner has to take new admission limits before it is restarted with
/// them instead.
const ADJUST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a runner that does not serve yet is asked again, within ADJUST_TIMEOUT.
const ADJUST_POLL: Duration = Duration::from_millis(100);

/// The desired state a standalone agent derives from its configuration: a runner,
/// enabled, with the file's job engine limits. `prev` is the one derived last: the
/// generation moves on only when what is desired changed.
pub(super) fn standalone(cfg: &AgentConfig, prev: Option<&DesiredState>) -> DesiredState {
    let r = &cfg.runner;
    let runner = DesiredRunner {
        enabled: true,
        max_jobs: r.max_jobs,
        max_jobs_per_owner: r.max_jobs_per_owner,
        max_queued: r.max_queued,
        max_output_bytes: r.max_output_bytes,
    };
    let generation = match prev {
        None => 1,
        Some(p) if p.runner == runner => p.generation,
        Some(p) => p.generation + 1,
    };
    DesiredState {
        generation,
        poll_interval_secs: None,
        agent: None,
        runner,
        ..DesiredState::default()
    }
}

/// Everything the runner child is launched from: the settings only this host decides,
/// and the runner part of the desired state, each limit it leaves out taken from the
/// config file. Two equal specs are the same runner.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RunnerSpec {
    /// The config file's runner settings without those the desired state carries (so a
    /// file limit the desired state overrides is no reason to restart).
    local: RunnerSettings,
    desired: DesiredRunner,
}

impl RunnerSpec {
    fn new(cfg: &AgentConfig, desired: &DesiredState) -> Self {
        let (d, r) = (&desired.runner, &cfg.runner);
        // The admission limits resolved to the values the runner would use (the hub's,
        // else the file's, else the runner's defaults): a limit the hub stops setting is
        // then a new value the running runner takes, not a reason to restart it and end
        // its jobs.
        let defaults = crate::runner::engine::EngineConfig::default();
        let max_jobs = d.max_jobs.or(r.max_jobs).unwrap_or(defaults.max_jobs);
        Self {
            local: RunnerSettings {
                max_jobs: None,
                max_jobs_per_owner: None,
                max_queued: None,
                max_output_bytes: None,
                ..r.clone()
            },
            desired: DesiredRunner {
                enabled: d.enabled,
                max_jobs: Some(max_jobs),
                max_jobs_per_owner: Some(
                    d.max_jobs_per_owner
                        .or(r.max_jobs_per_owner)
                        .unwrap_or(max_jobs),
                ),
                max_queued: Some(d.max_queued.or(r.max_queued).unwrap_or(defaults.max_queued)),
                max_output_bytes: d.max_output_bytes.or(r.max_output_bytes),
            },
        }
    }
}

/// What converging to a desired state takes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// Nothing: the runner is as wanted (or absent, as wanted).
    Keep,
    Start,
    /// Stop the running runner, start one with the new spec; the settings that differ.
    Restart(Vec<&'static str>),
    /// Only admission limits changed, each to a value: the running runner can take them.
    Adjust(AdmissionChange),
    Stop,
    /// An older generation than the one applied: never go back.
    Stale,
}

/// The convergence decision, from what runs (`running`: its spec, `None` when no runner
/// is wanted or started) and what is wanted.
fn decide(
    applied_generation: u64,
    running: Option<&RunnerSpec>,
    desired: &DesiredState,
    want: &RunnerSpec,
) -> Step {
    if desired.generation < applied_generation {
        return Step::Stale;
    }
    match (running, want.desired.enabled) {
        (None, false) => Step::Keep,
        (Some(_), false) => Step::Stop,
        (None, true) => Step::Start,
        (Some(spec), true) => {
            let restart = restart_reasons(spec, want);
            if !restart.is_empty() {
                return Step::Restart(restart);
            }
            match admission_change(&spec.desired, &want.desired) {
                Some(change) => Step::Adjust(change),
                None => Step::Keep,
            }
        }
    }
}

/// The settings that differ between two runners and that only a new runner can take: the
/// local ones and the spool cap (admission limits are always resolved to a value, which
/// the running runner takes).
fn restart_reasons(old: &RunnerSpec, new: &RunnerSpec) -> Vec<&'static str> {
    let (a, b) = (&old.local, &new.local);
    let (da, db) = (&old.desired, &new.desired);
    [
        ("user", a.user != b.user),
        ("stop_grace", a.stop_grace != b.stop_grace),
        ("initial_backoff", a.initial_backoff != b.initial_backoff),
        ("max_log_bytes", a.max_log_bytes != b.max_log_bytes),
        ("delegate_cgroup", a.delegate_cgroup != b.delegate_cgroup),
        ("job_path", a.job_path != b.job_path),
        ("max_kept_bytes", a.max_kept_bytes != b.max_kept_bytes),
        (
            "max_output_bytes",
            da.max_output_bytes != db.max_output_bytes,
        ),
    ]
    .into_iter()
    .filter_map(|(name, differs)| differs.then_some(name))
    .collect()
}

/// The admission limits that changed to a value, as the runner's `PUT /v1/admission`
/// takes them; `None` when none did.
fn admission_change(old: &DesiredRunner, new: &DesiredRunner) -> Option<AdmissionChange> {
    let changed = |a: Option<usize>, b: Option<usize>| b.filter(|_| a != b);
    let change = AdmissionChange {
        max_jobs: changed(old.max_jobs, new.max_jobs),
        max_jobs_per_owner: changed(old.max_jobs_per_owner, new.max_jobs_per_owner),
        max_queued: changed(old.max_queued, new.max_queued),
    };
    (change != AdmissionChange::default()).then_some(change)
}

/// The names of the limits an admission change sets, for the log.
fn admission_names(change: &AdmissionChange) -> Vec<&'static str> {
    [
        ("max_jobs", change.max_jobs.is_some()),
        ("max_jobs_per_owner", change.max_jobs_per_owner.is_some()),
        ("max_queued", change.max_queued.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect()
}

/// What the reconciler has applied and what it observes of the runner: published on a
/// watch channel, from which the hub task builds its reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Observed {
    /// The desired state in force, as it was given (a hub's limits not yet merged with
    /// the config file's).
    pub(super) desired: DesiredState,
    /// How many desired states from the hub have been handled (applied or refused): the
    /// hub task waits for this to move before it reports again.
    pub(super) handled: u64,
    /// Why the last desired state from the hub was not applied; `None` when it was.
    pub(super) refused: Option<String>,
    /// The runner's status, `starts` over the agent's life.
    pub(super) runner: Status,
}

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
    first: Supervisor,
}

impl Reconciler {
    /// Builds the runner's supervisor for `cfg` and `desired`: every reason the runner
    /// would be refused shows here, before anything has started.
    pub(super) async fn new(
        cfg: AgentConfig,
        desired: DesiredState,
        exe: Arc<PinnedExe>,
    ) -> Result<Self, AgentError> {
        let spec = RunnerSpec::new(&cfg, &desired);
        let first = build(&cfg, &spec.desired, &exe).await?;
        Ok(Self {
            cfg,
            desired,
            exe,
            first,
        })
    }

    /// Starts the runner (where the desired state wants one) and the reconciler's task.
    pub(super) async fn spawn(
        self,
        reporter: ReporterHandle,
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
            sup: None,
            running: None,
            changes: None,
            earlier_starts: 0,
            reporter,
            observed,
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
    sup: Option<Supervisor>,
    /// The spec the runner runs with (built from, or since adjusted to), while started.
    running: Option<RunnerSpec>,
    changes: Option<watch::Receiver<Status>>,
    /// Starts by supervisors already replaced: `starts` counts over the agent's life.
    earlier_starts: u64,
    reporter: ReporterHandle,
    observed: watch::Sender<Observed>,
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
            let saved =
                tokio::task::spawn_blocking(move || super::hub::persist(&state_dir, &desired))
                    .await
                    .unwrap_or_else(|source| {
                        Err(super::hub::HubError::Task {
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
        match decide(floor, self.running.as_ref(), &desired, &want) {
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

    /// Changes the running runner's admission limits (`PUT /v1/admission`), once it
    /// serves: one started moments ago (the agent's start, then the hub's first answer)
    /// is waited for, within ADJUST_TIMEOUT, rather than restarted.
    async fn adjust(&self, change: &AdmissionChange) -> Result<Admission, AgentError> {
        let socket = crate::runner::Paths::new(&self.cfg.state_dir).socket;
        let path = socket.clone();
        // Reads the API token beside the socket: a small blocking read. A runner that
        // has not written its token yet is no problem: a refused request reads it again.
        let client = tokio::task::spawn_blocking(move || Client::new(&path))
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
                tracing::error!(error = %why, "{origin}: cannot apply the new runner settings; keeping the running ones");
                return Ok(Outcome::Refused(why));
            }
        };
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

/// Prepares the directories and builds (validates) the runner's supervisor. Directory
/// creation, chown, cgroup delegation and opening the log are blocking work.
async fn build(
    cfg: &AgentConfig,
    desired: &DesiredRunner,
    exe: &Arc<PinnedExe>,
) -> Result<Supervisor, AgentError> {
    let (cfg, desired, exe) = (cfg.clone(), desired.clone(), exe.clone());
    tokio::task::spawn_blocking(move || {
        super::prepare(&cfg)?;
        Ok(Supervisor::new(runner_config(&cfg, &desired, &exe)?)?)
    })
    .await
    .unwrap_or_else(|source| {
        Err(AgentError::Task {
            what: "runner supervisor build",
            source,
        })
    })
}

/// The supervisor configuration of the runner child.
fn runner_config(
    cfg: &AgentConfig,
    desired: &DesiredRunner,
    exe: &Arc<PinnedExe>,
) -> Result<supervisor::Config, AgentError> {
    let mut c = runner_account_config(cfg, exe, "runner", "run")?;
    c.args = runner_run_args(cfg, desired);
    c.max_log_bytes = cfg.runner.max_log_bytes;
    c.stop_grace = cfg.runner.stop_grace;
    c.initial_backoff = cfg.runner.initial_backoff;
    if let Some(ask) = cgroup_ask(cfg) {
        let account = cfg.runner.user.clone().unwrap_or_else(Account::current);
        c.cgroup = runner_cgroup(&account, ask, &cfg.state_dir);
    }
    Ok(c)
}

/// `runner <verb> --state-dir S`.
fn runner_args(cfg: &AgentConfig, verb: &str) -> Vec<OsString> {
    vec![
        "runner".into(),
        verb.into(),
        "--state-dir".into(),
        cfg.state_dir.clone().into_os_string(),
    ]
}

/// The arguments of `runner run`: its stop budget, its job engine limits, the jobs' PATH.
fn runner_run_args(cfg: &AgentConfig, desired: &DesiredRunner) -> Vec<OsString> {
    let mut args = runner_args(cfg, "run");
    // In milliseconds: exact, and one argument.
    args.push("--stop-budget".into());
    args.push(format!("{}ms", cfg.runner.stop_grace.as_millis()).into());
    let limits = [
        ("--max-jobs", desired.max_jobs.map(|n| n.to_string())),
        (
            "--max-jobs-per-owner",
            desired.max_jobs_per_owner.map(|n| n.to_string()),
        ),
        ("--max-queued", desired.max_queued.map(|n| n.to_string())),
        (
            "--max-output-bytes",
            desired.max_output_bytes.map(|n| n.to_string()),
        ),
        ("--job-path", cfg.runner.job_path.clone()),
        (
            "--max-kept-bytes",
            cfg.runner.max_kept_bytes.map(|n| n.to_string()),
        ),
    ];
    for (flag, value) in limits {
        if let Some(v) = value {
            args.push(flag.into());
            args.push(v.into());
        }
    }
    args
}

/// `railgrid runner <verb> --state-dir S` from the pinned executable, as the runner
/// account, with an environment built from nothing, in the runner's directory.
fn runner_account_config(
    cfg: &AgentConfig,
    exe: &Arc<PinnedExe>,
    name: &str,
    verb: &str,
) -> Result<supervisor::Config, AgentError> {
    let account = cfg.runner.user.clone().unwrap_or_else(Account::current);
    let env = env::child_env(&account, None, None, &[]).map_err(|source| {
        AgentError::Supervisor(supervisor::Error::Env {
            name: name.into(),
            source,
        })
    })?;
    let mut c = supervisor::Config::new(name, exe.path(), cfg.log_dir.join(RUNNER_LOG));
    // Launched from the pinned bytes, not from what the path names now (invariant 14).
    c.exe = Some(exe.clone());
    c.args = runner_args(cfg, verb);
    c.dir = cfg.runner_dir();
    c.env = env;
    c.identity = cfg
        .runner
        .user
        .clone()
        .map_or(Identity::Inherit, Identity::User);
    Ok(c)
}
/// Ends what a stopped runner could not (it was SIGKILLed at stop_grace, or had crashed
/// before): where it had a delegated cgroup, everything in that tree, jobs' cgroups and
/// all, with `cgroup.kill`; then `runner reap` as the runner's account, which ends every
/// job group still recorded running (verified by pid and start time) and marks it lost.
/// Returns what was ended, one line each, for the status file; the log says the same.
async fn finish_runner_stop(
    cfg: &AgentConfig,
    sup: &Supervisor,
    exe: &Arc<PinnedExe>,
) -> Vec<String> {
    let mut ended = Vec::new();
    #[cfg(target_os = "linux")]
    if let Some(tree) = sup.config().cgroup.as_ref().and_then(|leaf| leaf.parent()) {
        match cgroup::kill_tree(tree).await {
            Ok(false) => {}
            Ok(true) => {
                tracing::warn!(cgroup = %tree.display(), "processes were left in the runner's cgroup tree after its stop: killed them with cgroup.kill");
                ended.push(format!(
                    "processes left in the runner's cgroup {}: killed (cgroup.kill)",
                    tree.display()
                ));
            }
            Err(e) => {
                tracing::error!(error = %crate::error_chain(&e), "could not empty the runner's cgroup tree")
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = sup;
    let reap = runner_account_config(cfg, exe, "runner reap", "reap").map(|mut c| {
        c.args.push("--grace".into());
        c.args.push(format!("{}ms", REAP_GRACE.as_millis()).into());
        c
    });
    let finished = match reap {
        Ok(c) => supervisor::run_once(&c, REAP_TIMEOUT)
            .await
            .map_err(AgentError::from),
        Err(e) => Err(e),
    };
    let finished = match finished {
        Ok(f) => f,
        Err(e) => {
            tracing::error!(error = %crate::error_chain(&e), "could not run `runner reap`: jobs the runner left running may outlive it");
            return ended;
        }
    };
    let stderr = String::from_utf8_lossy(&finished.stderr);
    let report: Option<ReapReport> = match finished.status {
        Some(st) if st.success() => serde_json::from_slice(&finished.stdout).ok(),
        _ => None,
    };
    let Some(report) = report else {
        let why = finished.status.map_or_else(
            || format!("killed after {REAP_TIMEOUT:?}"),
            supervisor::describe,
        );
        tracing::error!(status = %why, stderr = %stderr.trim(), "`runner reap` failed: jobs the runner left running may outlive it");
        return ended;
    };
    if let Some(pid) = report.held_by {
        tracing::warn!(
            pid,
            "`runner reap`: a runner still holds the runner lock; its jobs were left alone"
        );
    }
    for e in &report.ended {
        tracing::warn!(job = %e.id, pid = ?e.pid, reason = %e.reason, "reaped a job the runner left running: marked lost");
        let pid = e.pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
        ended.push(format!("job {}{pid}: {}", e.id, e.reason));
    }
    for id in &report.uncommitted {
        tracing::error!(job = %id, "`runner reap` could not record the job as lost (is the disk full?); the next runner reconciles it");
    }
    ended
}

/// Whether a cgroup is asked for the runner: `runner.delegate_cgroup`, or, unset, where a
/// root agent may make one (Linux).
#[cfg(target_os = "linux")]
fn cgroup_ask(cfg: &AgentConfig) -> Option<cgroup::Ask> {
    match cfg.runner.delegate_cgroup {
        Some(true) => Some(cgroup::Ask::Delegated),
        Some(false) => None,
        None => Some(cgroup::Ask::Auto),
    }
}

#[cfg(not(target_os = "linux"))]
fn cgroup_ask(cfg: &AgentConfig) -> Option<()> {
    cfg.runner.delegate_cgroup.filter(|d| *d).map(|_| ())
}

/// The cgroup delegated to the runner, or `None` (logged) where the host cannot give one:
/// its jobs then get process-group confinement, in which a process that calls setsid or
/// setpgid leaves its job.
#[cfg(target_os = "linux")]
fn runner_cgroup(acct: &Account, ask: cgroup::Ask, state_dir: &std::path::Path) -> Option<PathBuf> {
    match cgroup::delegate_to_runner(acct, ask, state_dir) {
        Ok(dir) => Some(dir),
        Err(e) if ask == cgroup::Ask::Auto => {
            tracing::info!(reason = %crate::error_chain(&e), "no cgroup for the runner: its jobs get process-group confinement, which a job that calls setsid or setpgid leaves");
            None
        }
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "runner.delegate_cgroup: no cgroup for the runner; its jobs get process-group confinement, which a job that calls setsid or setpgid leaves");
            None
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn runner_cgroup(_acct: &Account, _ask: (), _state_dir: &std::path::Path) -> Option<PathBuf> {
    tracing::warn!("runner.delegate_cgroup needs Linux cgroup v2; ignored");
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_jobs: Option<usize>, stop_grace: Duration) -> AgentConfig {
        AgentConfig {
            config_path: None,
            state_dir: "/state".into(),
            log_dir: "/logs".into(),
            runner: RunnerSettings {
                user: None,
                stop_grace,
                initial_backoff: Duration::from_secs(1),
                max_log_bytes: 8 << 20,
                max_jobs,
                max_jobs_per_owner: Some(2),
                max_queued: None,
                max_output_bytes: None,
                delegate_cgroup: Some(false),
                job_path: Some("/opt/bin:/usr/bin".into()),
                max_kept_bytes: None,
            },
            hub: None,
            log_max_files: 7,
            upgrade: crate::agent::config::UpgradeSettings {
                trusted_keys: Vec::new(),
                settle: Duration::from_secs(30),
                deadline: Duration::from_secs(120),
                hub_wait: Duration::from_secs(3600),
            },
        }
    }

    #[test]
    fn the_config_files_limits_become_the_desired_runner() {
        let cfg = config(Some(4), Duration::from_secs(10));
        let d = standalone(&cfg, None);
        assert_eq!(d.generation, 1);
        assert!(d.runner.enabled);
        assert_eq!(d.runner.max_jobs, Some(4));
        assert_eq!(d.runner.max_jobs_per_owner, Some(2));
        // What only this host decides stays out of it: the spec keeps it locally.
        let spec = RunnerSpec::new(&cfg, &d);
        assert_eq!(spec.local.max_jobs, None);
        assert_eq!(spec.local.job_path.as_deref(), Some("/opt/bin:/usr/bin"));
        assert_eq!(spec.local.stop_grace, Duration::from_secs(10));
    }

    #[test]
    fn the_generation_moves_only_when_the_desired_runner_changes() {
        let first = standalone(&config(Some(4), Duration::from_secs(10)), None);
        // A local setting changed: the same desired state.
        let same = standalone(&config(Some(4), Duration::from_secs(3)), Some(&first));
        assert_eq!(same.generation, 1);
        let next = standalone(&config(Some(8), Duration::from_secs(3)), Some(&same));
        assert_eq!(next.generation, 2);
    }

    #[test]
    fn convergence_decisions() {
        let cfg = config(Some(4), Duration::from_secs(10));
        let d = standalone(&cfg, None);
        let spec = RunnerSpec::new(&cfg, &d);
        assert_eq!(decide(1, None, &d, &spec), Step::Start);
        assert_eq!(decide(1, Some(&spec), &d, &spec), Step::Keep);

        // A local setting (the stop grace): another runner, saying why.
        let grace = config(Some(4), Duration::from_secs(3));
        let want = RunnerSpec::new(&grace, &d);
        assert_eq!(
            decide(1, Some(&spec), &d, &want),
            Step::Restart(vec!["stop_grace"])
        );
        // An admission limit changed to a value: the running runner takes it.
        let limits = standalone(&config(Some(8), Duration::from_secs(10)), Some(&d));
        let want = RunnerSpec::new(&cfg, &limits);
        assert_eq!(
            decide(1, Some(&spec), &limits, &want),
            Step::Adjust(AdmissionChange {
                max_jobs: Some(8),
                ..AdmissionChange::default()
            })
        );
        // The spool cap only reaches a new runner.
        let mut spool = limits.clone();
        spool.runner.max_output_bytes = Some(1 << 20);
        let want = RunnerSpec::new(&cfg, &spool);
        assert_eq!(
            decide(2, Some(&spec), &spool, &want),
            Step::Restart(vec!["max_output_bytes"])
        );

        // Disabled: stop a running runner, leave an absent one absent.
        let mut off = limits.clone();
        off.generation = 3;
        off.runner.enabled = false;
        let want = RunnerSpec::new(&cfg, &off);
        assert_eq!(decide(2, Some(&spec), &off, &want), Step::Stop);
        assert_eq!(decide(3, None, &off, &want), Step::Keep);

        // Never back to an older generation.
        assert_eq!(decide(3, None, &d, &spec), Step::Stale);
    }

    #[test]
    fn a_limit_the_hub_leaves_out_is_the_config_files() {
        let cfg = config(Some(4), Duration::from_secs(10));
        let hub = DesiredState {
            generation: 7,
            runner: DesiredRunner {
                max_jobs_per_owner: Some(1),
                ..DesiredRunner::default()
            },
            ..DesiredState::default()
        };
        let spec = RunnerSpec::new(&cfg, &hub);
        assert_eq!(spec.desired.max_jobs, Some(4), "from the file");
        assert_eq!(spec.desired.max_jobs_per_owner, Some(1), "from the hub");
        let defaults = crate::runner::engine::EngineConfig::default();
        assert_eq!(
            spec.desired.max_queued,
            Some(defaults.max_queued),
            "the runner's default"
        );

        // The file's limit changes under a hub that leaves it out (SIGHUP): adjusted.
        let reloaded = config(Some(6), Duration::from_secs(10));
        let want = RunnerSpec::new(&reloaded, &hub);
        assert_eq!(
            decide(7, Some(&spec), &hub, &want),
            Step::Adjust(AdmissionChange {
                max_jobs: Some(6),
                ..AdmissionChange::default()
            })
        );
        // A limit dropped everywhere goes back to the runner's default, which the running
        // runner takes: no restart, no job ended.
        let none = config(None, Duration::from_secs(10));
        let want = RunnerSpec::new(&none, &hub);
        assert_eq!(
            decide(7, Some(&spec), &hub, &want),
            Step::Adjust(AdmissionChange {
                max_jobs: Some(defaults.max_jobs),
                ..AdmissionChange::default()
            })
        );
    }

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
