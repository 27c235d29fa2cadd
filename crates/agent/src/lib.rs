//! The agent: `railgrid agent run`, the long-lived daemon that keeps exactly one runner
//! alive on this host.
//!
//! Tasks (all on one runtime thread; blocking work goes to `spawn_blocking`):
//! - the *main loop* ([`run`]): signal handling only. In: SIGTERM/SIGINT (stop and exit),
//!   SIGHUP (re-read the configuration). Out: the re-read configuration and its desired
//!   state to the reconciler; `STOPPING=1` through the reporter.
//! - the *reconciler* ([`reconciler`]): owns the [`Supervisor`](crate::supervisor::Supervisor) of the runner and is the
//!   one place a desired state is applied (from the config file standalone, from the hub
//!   otherwise). In: reloads, the hub's desired states, the supervisor's status. Out:
//!   runner starts, restarts and finished stops; the runner's status to the reporter;
//!   what it applied and observes to the hub task.
//! - the *hub task* ([`hub`], with a `[hub]` only): the long-poll reconcile with the hub.
//!   In: desired states from the hub, what the reconciler applied and observes, new hub
//!   settings on SIGHUP, the followed jobs' reports. Out: reports to the hub, desired
//!   states to the reconciler, the link's state to the reporter, the link in use (for
//!   uploads and downloads).
//! - the *jobs task* ([`jobs`], with a `[hub]` only), the main loop's like the others: the
//!   hub's jobs on this host. In: the desired state in force (its jobs and cancels), the
//!   link in use. Out: submissions, cancels and output uploads; each job's report for the
//!   hub task. The reconciler, the hub task, the jobs task and the upgrade reach the
//!   runner's API through one shared [`RunnerLink`](runner_link::RunnerLink).
//! - the *status reporter* ([`reporter`]): `<state>/agent-status.json` (written on a
//!   blocking thread, updates coalesced) and sd_notify READY/STATUS/STOPPING.
//! - the *watchdog task* (`WatchdogTask`): `WATCHDOG=1` at half systemd's interval, on its
//!   own so that a long runner stop in the reconciler does not read as a hung agent.
//! - the supervisor's own task and log thread (see [`crate::supervisor`]).
//!
//! The runner is this same executable re-executed as `railgrid runner run --state-dir`,
//! as the runner account, with an environment built from nothing: the agent's secrets
//! (hub token, cloud keys) never reach it.
//!
//! Stopping the runner (at exit, and before a reload restarts it) is a budget: the runner
//! is told `--stop-budget` = `runner.stop_grace` and fits its jobs' kill graces into it;
//! the supervisor SIGKILLs it if it overruns. Then the agent finishes the stop
//! (`finish_runner_stop`): `cgroup.kill` on the runner's cgroup tree where it has one, and
//! `railgrid runner reap` as the runner's account, which ends every job group still
//! recorded running (verified by pid and start time) and marks it lost. So no job outlives
//! a runner stop, and the agent itself never opens the runner's database nor signals a
//! job. The service manager's stop timeout covers all of it: see [`SERVICE_STOP_TIMEOUT`].

#[cfg(target_os = "linux")]
pub mod cgroup;
pub mod config;
mod desired;
pub mod dirs;
pub mod drain;
pub mod hub;
pub mod install;
pub mod instance;
mod jobs;
mod metrics;
pub mod notify;
mod reconciler;
mod reporter;
mod runner_link;
pub mod status;
pub mod upgrade;
mod upload;

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use thiserror::Error;
use tokio::signal::unix::{signal, SignalKind};

use self::config::{AgentConfig, ConfigError, MAX_STOP_GRACE};
use self::drain::DrainHandle;
use self::hub::{HubHandle, HubLinkError};
use self::jobs::JobsHandle;
use self::notify::Notifier;
use self::reconciler::{Reconciler, REAP_TIMEOUT};
use self::reporter::ReporterHandle;
use self::runner_link::RunnerLink;
use self::status::{AgentStatus, HubStatus};
use self::upgrade::{Switch, UpgradeCtx, UpgradeHandle};
use railgrid_build as build_info;
use railgrid_hub_client as hub_client;
use railgrid_proto as proto;
use railgrid_proto::desired::DesiredState;
use railgrid_release as release;
use railgrid_runner as runner;
use railgrid_supervisor::lock::{self, LockError};
use railgrid_supervisor::{self as supervisor, proc_tree, State, Status};
use railgrid_sys::exe::{ExeError, PinnedExe};
use railgrid_sys::{self as sys, ProcessId};
use railgrid_util::{
    self as util, env_policy, env_vars, error_chain, file_error, metrics_text, small_file,
};

/// The capped log of the runner, inside the log directory.
pub const RUNNER_LOG: &str = "runner.log";
/// Room for the rest of an agent stop: the supervisor's SIGKILL wait and log drain, the
/// cgroup tree's kill, the status file.
#[cfg_attr(not(test), allow(dead_code))]
const STOP_MARGIN: Duration = Duration::from_secs(15);
/// The least stop timeout the service manager must give the agent (systemd
/// `TimeoutStopSec`, launchd `ExitTimeOut`): the longest `runner.stop_grace`, the reap and
/// a margin. The shipped unit and plist are checked against it (a number that exists for
/// the packaging files, so only their test reads it).
#[cfg_attr(not(test), allow(dead_code))]
pub const SERVICE_STOP_TIMEOUT: Duration =
    Duration::from_secs(MAX_STOP_GRACE.as_secs() + REAP_TIMEOUT.as_secs() + STOP_MARGIN.as_secs());

#[derive(Debug, Error)]
pub enum AgentError {
    #[error("could not serve the agent's metrics on {addr} (metrics.listen): another program may hold the port")]
    MetricsListen {
        addr: std::net::SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("the state directory {path} belongs to {owner} (uid {uid}), not to this account (uid {ours}): an agent of {owner} used it; remove it as {owner}, or give another --state-dir")]
    StateDirOwner {
        path: PathBuf,
        owner: String,
        uid: u32,
        ours: u32,
    },
    #[error("could not create directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not give {path} to uid {uid} gid {gid}")]
    Chown {
        path: PathBuf,
        uid: u32,
        gid: u32,
        #[source]
        source: io::Error,
    },
    #[error("runner user {user} cannot reach {path}: {dir} is mode {mode:04o} owned by uid {owner}; make it traversable (chmod o+x {dir}) or choose another state directory")]
    Unreachable {
        user: String,
        path: PathBuf,
        dir: PathBuf,
        mode: u32,
        owner: u32,
    },
    #[error("the state directory {} is below {dir} ({why}, mode {mode:04o}, owned by uid {owner}): another account could move or replace what the agent keeps there; choose a state directory whose every parent belongs to root or to the agent's account and is writable by no one else", path.display())]
    UntrustedParent {
        path: PathBuf,
        dir: PathBuf,
        why: &'static str,
        mode: u32,
        owner: u32,
    },
    #[error("{path} holds files of uid {owner}, but runner.user is {user} (uid {uid}): move the directory away, or chown -R it to {user} if you trust its contents")]
    RunnerDirOwner {
        path: PathBuf,
        owner: u32,
        user: String,
        uid: u32,
    },
    #[error("could not pin the agent's own executable (the runner is launched from its bytes)")]
    Exe(#[source] ExeError),
    #[error(transparent)]
    Supervisor(#[from] supervisor::Error),
    #[error("could not reclaim the runner lock")]
    Reclaim(#[source] LockError),
    #[error("could not install signal handlers")]
    Signals(#[source] io::Error),
    #[error("another agent ({holder}) is running with state directory {}: stop it first (systemctl stop railgrid-agent), or give this one another --state-dir", state_dir.display())]
    AlreadyRunning { holder: String, state_dir: PathBuf },
    #[error("could not take the agent lock of the state directory")]
    InstanceLock(#[source] LockError),
    #[error("the agent's {what} failed")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    #[error("the hub settings cannot be used")]
    Hub(#[source] HubLinkError),
    #[error("the runner at {} did not take the new admission limits", socket.display())]
    Admission {
        socket: PathBuf,
        #[source]
        source: crate::runner::client::ClientError,
    },
    #[error("the runner at {} did not take the new admission limits within {after:?}", socket.display())]
    AdmissionTimeout { socket: PathBuf, after: Duration },
}

impl AgentError {
    /// True for errors an operator fixes in the configuration (exit code 2).
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            AgentError::Unreachable { .. }
                | AgentError::StateDirOwner { .. }
                | AgentError::UntrustedParent { .. }
                | AgentError::RunnerDirOwner { .. }
                | AgentError::AlreadyRunning { .. }
                | AgentError::Supervisor(_)
                | AgentError::MetricsListen { .. }
                | AgentError::Hub(_)
        )
    }
}

/// Runs the agent until SIGTERM or SIGINT (`None`), or until a new binary is in place
/// and the runner stopped (`Some`: the caller re-executes from it). `reload` re-reads the
/// configuration on SIGHUP. `_instance` is the state directory's agent lock, held for as
/// long as this runs.
pub async fn run(
    cfg: AgentConfig,
    _instance: &instance::Instance,
    reload: impl Fn() -> Result<AgentConfig, ConfigError>,
) -> Result<Option<Switch>, AgentError> {
    // Signals first: one that arrives while the runner starts must not be lost.
    let mut term = signal(SignalKind::terminate()).map_err(AgentError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(AgentError::Signals)?;
    let mut hup = signal(SignalKind::hangup()).map_err(AgentError::Signals)?;

    let exe = pin_own_exe().await?;
    tracing::info!(exe = %exe.path().display(), sha256 = %exe.identity().sha256, size = exe.identity().size, "pinned the agent's executable: runners are launched from these bytes");
    // A host that joins by an enrolment token gets its own token first (a signal stops
    // the wait for a hub out of reach).
    if let Some(settings) = &cfg.hub {
        tokio::select! {
            r = hub::enrol_if_needed(settings) => r.map_err(AgentError::Hub)?,
            // Cancel-safe: signal streams keep a signal that arrived between polls.
            _ = term.recv() => return Ok(None),
            _ = int.recv() => return Ok(None),
        }
    }
    let hub = hub_connection(&cfg).await?;
    let mut desired = match &hub {
        Some(_) => desired::initial_from_hub(&cfg).await,
        None => reconciler::standalone(&cfg, None),
    };
    let runner = RunnerLink::new(&cfg.state_dir);
    // Validates the runner before anything is touched (exit 2 for a refused account).
    let reconciler =
        Reconciler::new(cfg.clone(), desired.clone(), exe.clone(), runner.clone()).await?;

    let reclaimed = reclaim_orphan_runner(&cfg).await?;

    let reporter = ReporterHandle::spawn(initial_status(
        &cfg,
        &exe,
        &desired,
        reclaimed.into_iter().collect(),
    ));
    // Before the runner starts: a port in use is a configuration error.
    let metrics = match &cfg.metrics {
        Some(m) => Some(
            metrics::MetricsHandle::spawn(
                m,
                reporter.clone(),
                runner.clone(),
                cfg.state_dir.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(None);
    let (reconciler, mut task) = reconciler.spawn(reporter.clone(), drain_rx).await?;
    let drain = DrainHandle::spawn(
        reconciler.observed(),
        runner.clone(),
        drain::Kept::read(&cfg.state_dir).await,
        cfg.state_dir.clone(),
        reporter.clone(),
        drain_tx,
    );
    let (reached_tx, reached) = tokio::sync::watch::channel(hub::Contact::default());
    let (links_tx, links) = tokio::sync::watch::channel(hub.as_ref().map(hub::Connection::link));
    let mut upgrade = UpgradeHandle::spawn(UpgradeCtx {
        cfg: cfg.clone(),
        exe: exe.clone(),
        observed: reconciler.observed(),
        link: links,
        reached,
        reporter: reporter.clone(),
        runner: runner.clone(),
        drain: drain.for_upgrade(),
    });
    // The hub's jobs on this host, as the hub task hands them over from each answer, are
    // this loop's; the hub task reads their reports and publishes the link their uploads
    // take.
    let (hub, jobs) = match hub {
        Some(conn) => {
            let jobs = JobsHandle::spawn(runner.clone(), links_tx.subscribe(), drain.report());
            let ctx = hub::HubCtx {
                runner: runner.clone(),
                jobs: jobs.link(),
                labels: cfg.labels.clone(),
                reconciler: reconciler.clone(),
                reporter: reporter.clone(),
                upgrade: upgrade.report(),
                drain: drain.report(),
                reached: reached_tx,
                links: links_tx,
            };
            (Some(HubHandle::spawn(conn, ctx)), Some(jobs))
        }
        None => (None, None),
    };
    // Its own task, so the pings go on while the reconciler waits out a runner stop (a
    // reload's, which may take the whole stop grace and the reap): a hung agent stops
    // pinging, a busy one does not.
    let _watchdog = notify::watchdog_interval().map(WatchdogTask::spawn);
    tracing::info!(version = build_info::VERSION, pid = std::process::id(), state_dir = %cfg.state_dir.display(), "agent running");

    let mut switch = None;
    let why = loop {
        tokio::select! {
            // Cancel-safe: signal streams keep a signal that arrived between polls.
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            // Cancel-safe: see `UpgradeHandle::switched`.
            s = upgrade.switched() => {
                switch = Some(s);
                break "the upgrade";
            }
            _ = hup.recv() => {
                desired = on_sighup(&reload, &reporter, &upgrade, &hub, &reconciler, desired);
                drain.set_host(drain::Kept::read(&cfg.state_dir).await.host);
            }
            // Cancel-safe: polling a JoinHandle by reference does not consume it. Ready
            // only when the reconciler gave up (a runner it could not start).
            res = task.failed() => return res.map(|()| None),
        }
    };
    match &switch {
        Some(s) => {
            tracing::info!(to = %s.to, "switching to the new binary: stopping the runner");
            // The same process goes on as the new agent: a reload to the service
            // manager, which the new agent's READY=1 ends.
            reporter.reloading();
        }
        None => {
            tracing::info!("{why} received: stopping the runner");
            reporter.stopping();
        }
    }
    // First, so that no desired state arrives while the runner stops. The followers go
    // too: the runner's jobs go on, and a restarted agent follows them again from what the
    // hub holds.
    if let Some(hub) = hub {
        hub.shutdown().await;
    }
    if let Some(jobs) = jobs {
        jobs.shutdown().await;
    }
    // The runner keeps the drain it was told, across its stop and the next start.
    drain.shutdown();
    let undone = match &switch {
        Some(_) => {
            drop(upgrade);
            None
        }
        None => upgrade.shutdown(&cfg).await,
    };
    if let Some(to) = undone {
        reporter.upgrade(Some(stopped_during_switch(to)));
    }
    task.shutdown().await?;
    // A stop asked for while the runner stopped for the switch wins: the previous binary
    // goes back, and the agent exits instead of re-executing.
    if switch.is_some() {
        use futures_util::FutureExt;
        let stop = term.recv().now_or_never().is_some() || int.recv().now_or_never().is_some();
        if let Some(s) = switch.take_if(|_| stop) {
            undo_switch(&cfg, s, &reporter).await;
        }
    }
    if let Some(s) = &switch {
        start_commit_window(&cfg, s).await;
    }
    #[cfg(target_os = "linux")]
    if switch.is_none() {
        // The runner has stopped: a cgroup subtree the agent made for itself goes too (a
        // re-executed agent keeps it).
        let dir = cfg.state_dir.clone();
        let _ = tokio::task::spawn_blocking(move || cgroup::release_own(&dir)).await;
    }
    if let Some(m) = metrics {
        m.stop();
    }
    reporter.finish().await;
    match &switch {
        Some(_) => tracing::info!("runner stopped: re-executing the agent"),
        None => tracing::info!("agent stopped"),
    }
    Ok(switch)
}

/// The hub's settings and credentials, read before anything starts: an unusable token or
/// CA file is a configuration error (exit 2), not a hub that happens to be down.
async fn hub_connection(cfg: &AgentConfig) -> Result<Option<hub::Connection>, AgentError> {
    let Some(settings) = cfg.hub.clone() else {
        return Ok(None);
    };
    let conn = blocking("hub settings", move || hub::Connection::load(&settings)).await?;
    Ok(Some(conn.map_err(AgentError::Hub)?))
}

/// Only before the first start, and only because this agent holds the state dir's
/// instance lock: a runner lock held now belongs to an orphan of a killed agent, which is
/// stopped. Its pid, if there was one.
async fn reclaim_orphan_runner(cfg: &AgentConfig) -> Result<Option<i32>, AgentError> {
    let lock_path = crate::runner::Paths::new(&cfg.state_dir).lock;
    let grace = cfg.runner.stop_grace;
    let path = lock_path.clone();
    let reclaimed = blocking("runner lock reclaim", move || {
        lock::reclaim_stale_holder(&path, grace)
    })
    .await?
    .map_err(AgentError::Reclaim)?;
    if let Some(pid) = reclaimed {
        tracing::warn!(pid, lock = %lock_path.display(), "reclaimed an orphan runner left by a previous agent");
    }
    Ok(reclaimed)
}

/// `f` on a blocking thread: its panic is the agent's error, naming `what`.
pub(crate) async fn blocking<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, AgentError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|source| AgentError::Task { what, source })
}

/// Puts the previous binary back after a stop asked for during the switch.
async fn undo_switch(cfg: &AgentConfig, s: Switch, reporter: &ReporterHandle) {
    tracing::info!("stop asked for during the switch: putting the previous binary back");
    let dir = cfg.state_dir.clone();
    let to = s.to.clone();
    let _ = tokio::task::spawn_blocking(move || upgrade::undo_switch(&dir, &s)).await;
    reporter.upgrade(Some(stopped_during_switch(to)));
}

/// The runner's stop is over: the new agent's time to commit starts now (the watcher's
/// deadline had room for the stop, in case this agent died in it).
async fn start_commit_window(cfg: &AgentConfig, s: &Switch) {
    let (dir, sha, deadline) = (
        cfg.state_dir.clone(),
        s.exe.identity().sha256.clone(),
        cfg.upgrade.deadline,
    );
    let _ = tokio::task::spawn_blocking(move || {
        upgrade::record::update(&dir, |r| match r.upgrade.as_mut() {
            Some(u) if u.to_sha256 == sha => {
                let now = crate::util::unix_now();
                u.deadline = u.deadline.min(now + deadline.as_secs());
                // The last step before the exec: from here a failure is the new
                // version's.
                u.execed_at = Some(now);
                (true, ())
            }
            _ => (false, ()),
        })
    })
    .await;
}

/// What the status file says of a switch a stop undid (the hub hears it at the next
/// start).
fn stopped_during_switch(to: String) -> crate::proto::report::UpgradeReport {
    crate::proto::report::UpgradeReport::toward(
        "failed",
        &to,
        Some("the agent was stopped during the switch; the previous binary is back"),
    )
}

/// SIGHUP: reads the configuration again and hands it to every task; the reporter counts
/// the reload once the reconciler has applied (or refused) it. The desired state in force
/// after it.
fn on_sighup(
    reload: &impl Fn() -> Result<AgentConfig, ConfigError>,
    reporter: &ReporterHandle,
    upgrade: &UpgradeHandle,
    hub: &Option<HubHandle>,
    reconciler: &reconciler::ReconcilerHandle,
    desired: DesiredState,
) -> DesiredState {
    reporter.reload_begun();
    match reload() {
        Ok(new) => {
            upgrade.reload(new.clone());
            let (desired, applied) = apply_reload(new, hub, reconciler, desired);
            let reporter = reporter.clone();
            // Its own task: the loop goes on taking signals while the runner restarts
            // for the new settings.
            tokio::spawn(async move {
                let outcome = applied.await.unwrap_or_else(|_| {
                    Err("the agent ended before the new configuration was applied".to_owned())
                });
                reporter.reloaded(outcome);
            });
            desired
        }
        Err(e) => {
            let why = crate::error_chain(&e);
            tracing::error!(error = %why, "SIGHUP: the new configuration is invalid; keeping the running one");
            reporter.reloaded(Err(why));
            desired
        }
    }
}

/// Hands a re-read configuration to the hub task and the reconciler; the desired state in
/// force after it (a standalone agent derives a new one from the file), and the
/// reconciler's word that it is applied.
fn apply_reload(
    new: AgentConfig,
    hub: &Option<HubHandle>,
    reconciler: &reconciler::ReconcilerHandle,
    desired: DesiredState,
) -> (
    DesiredState,
    tokio::sync::oneshot::Receiver<Result<(), String>>,
) {
    match (hub, new.hub.clone()) {
        (Some(hub), Some(settings)) => {
            hub.reload(settings, new.labels.clone());
            (desired, reconciler.reload(new, None))
        }
        (Some(_), None) => {
            tracing::warn!("SIGHUP: removing the hub takes effect when the agent restarts; the hub's desired state stays in force");
            (desired, reconciler.reload(new, None))
        }
        (None, added) => {
            if added.is_some() {
                tracing::warn!("SIGHUP: a hub takes effect when the agent restarts; running standalone until then");
            }
            let desired = reconciler::standalone(&new, Some(&desired));
            let applied = reconciler.reload(new, Some(desired.clone()));
            (desired, applied)
        }
    }
}

/// The status file's first content: nothing has been started yet.
fn initial_status(
    cfg: &AgentConfig,
    exe: &PinnedExe,
    desired: &DesiredState,
    reclaimed: Vec<i32>,
) -> AgentStatus {
    let now = SystemTime::now();
    AgentStatus {
        version: build_info::VERSION.to_owned(),
        pid: std::process::id(),
        pid_start_time: sys::process_start_time(ProcessId::current()),
        started_at: now,
        updated_at: now,
        running: true,
        stopping: false,
        config_path: cfg.config_path.clone(),
        state_dir: cfg.state_dir.clone(),
        log_dir: cfg.log_dir.clone(),
        runner: Status {
            state: State::Stopped,
            pid: None,
            starts: 0,
            last_error: None,
            since: now,
        },
        reclaimed_pids: reclaimed,
        reaped: Vec::new(),
        exe: Some(status::ExeStatus::from(exe.identity())),
        runner_enabled: desired.runner.enabled,
        upgrade: None,
        reloads: Some(status::Reloads::default()),
        drain: None,
        hub: cfg.hub.as_ref().map(|h| HubStatus {
            url: h.urls[0].clone(),
            agent_id: h.agent_id.clone(),
            connected: false,
            last_contact: None,
            last_error: None,
            generation: desired.generation,
            desired_version: None,
        }),
    }
}

/// The systemd watchdog's pings, from a task of their own; aborted when dropped.
struct WatchdogTask(tokio::task::JoinHandle<()>);

impl WatchdogTask {
    fn spawn(every: Duration) -> Self {
        Self(tokio::spawn(async move {
            let Some(notifier) = Notifier::from_env() else {
                return;
            };
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                notifier.send("WATCHDOG=1");
            }
        }))
    }
}

impl Drop for WatchdogTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The running executable, pinned (docs/design.md, invariant 14): runners are launched from its
/// bytes, never from what its path names later. Hashing it is blocking work.
async fn pin_own_exe() -> Result<Arc<PinnedExe>, AgentError> {
    tokio::task::spawn_blocking(PinnedExe::current)
        .await
        .map_err(|e| AgentError::Exe(ExeError::Find(io::Error::other(e))))?
        .map(Arc::new)
        .map_err(AgentError::Exe)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The duration after `key` in a unit file (`90s`, `1min 30s`).
    fn unit_value(unit: &str, key: &str) -> Duration {
        let v = unit
            .lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in the unit"));
        humantime::parse_duration(v.trim()).unwrap_or_else(|e| panic!("{key}{v}: {e}"))
    }

    #[test]
    fn the_service_managers_wait_for_the_whole_stop_budget() {
        assert!(SERVICE_STOP_TIMEOUT > MAX_STOP_GRACE + REAP_TIMEOUT);
        let unit = include_str!("../../../packaging/systemd/railgrid-agent.service");
        let stop = unit_value(unit, "TimeoutStopSec=");
        assert!(
            stop >= SERVICE_STOP_TIMEOUT,
            "TimeoutStopSec={stop:?} in railgrid-agent.service is below {SERVICE_STOP_TIMEOUT:?}: the longest runner.stop_grace ({MAX_STOP_GRACE:?}), the reap ({REAP_TIMEOUT:?}) and a margin"
        );

        let plist = include_str!("../../../packaging/launchd/com.railgrid.agent.plist");
        let after = plist
            .split_once("<key>ExitTimeOut</key>")
            .expect("ExitTimeOut in the plist")
            .1;
        let secs: u64 = after
            .split_once("<integer>")
            .and_then(|(_, r)| r.split_once("</integer>"))
            .and_then(|(n, _)| n.trim().parse().ok())
            .expect("ExitTimeOut is an <integer>");
        assert!(
            Duration::from_secs(secs) >= SERVICE_STOP_TIMEOUT,
            "ExitTimeOut {secs} in com.railgrid.agent.plist is below {SERVICE_STOP_TIMEOUT:?}"
        );
    }
}
