//! The agent's self-upgrade (docs/design.md, invariants 13 and 14).
//!
//! Task: [`UpgradeTask`], one per agent; the agent holds an [`UpgradeHandle`].
//! - In: the desired state in force (the reconciler's [`Observed`]): its agent version
//!   and artifact; the count of successful reconciles with the hub (for the commit);
//!   every second, the executable's path (`stat`: a replaced file is a local upgrade).
//! - Out: the upgrade's state ([`UpgradeReport`]) to the hub task (it goes with every
//!   report) and to the status file; once, a [`Switch`] to the agent's main loop, which
//!   then stops the runner and re-executes the agent from the new binary.
//!
//! A hub upgrade, in this order: refuse what cannot be (no trusted key, no artifact for
//! this platform, a downgrade, a version remembered as bad); download into the
//! executable's directory ([`fetch`]); check size, SHA-256, signature and signed version,
//! make it executable, test-run it ([`candidate`]); then switch ([`Self::switch`]): the
//! record says `switching`, `<exe>.prev` gets the running binary's bytes, the watcher is
//! started from `<exe>.prev` ([`watcher`], outside the agent's tree and service), the new
//! file is renamed over `<exe>` (file and directory fsynced), the record says `pending`.
//!
//! A local upgrade (the file at the executable's path replaced by hand or by a package
//! manager) is the same switch after a test run of the new file; it is trusted as the
//! operator's, so no signature is asked for.
//!
//! The new agent, finding a `pending` record for its own bytes, commits once its runner
//! has served `/v1/health` for the settle period and one reconcile with the hub has
//! succeeded; the watcher, seeing the commit, exits.

mod candidate;
mod fetch;
pub(crate) mod record;
pub(crate) mod service;
pub(crate) mod watcher;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::{oneshot, watch};

use self::record::{Kind, Phase, Record, RecordError, Upgrade};
use self::service::Service;
use super::config::AgentConfig;
use super::desired::Observed;
use super::reporter::ReporterHandle;
use super::upload::HubLink;
use crate::build_info;
use crate::proto::desired::DesiredAgent;
use crate::proto::report::UpgradeReport;
use crate::release::SignatureError;
use crate::supervisor::State;
use crate::sys::dirfd::Dir;
use crate::sys::exe::{ExeError, PinnedExe};
use crate::sys::ProcessId;

/// How often the executable's path is looked at (a `stat`, never a hash).
const LOCKSTEP_EVERY: Duration = Duration::from_secs(1);
/// A failed upgrade of the same artifact is tried again after this, doubling.
const RETRY_FIRST: Duration = Duration::from_secs(30);
const RETRY_MAX: Duration = Duration::from_secs(3600);
/// How long the switch waits for its watcher to say it runs.
const WATCHER_START: Duration = Duration::from_secs(10);
/// How often a pending commit looks at the runner's health.
const HEALTH_EVERY: Duration = Duration::from_secs(1);
/// How long the agent restored by a rollback without blame gives its hub to answer: one
/// that answers within it was never away.
const HUB_PROOF: Duration = Duration::from_secs(15);
/// How often a new agent that is healthy but cannot reach its hub says so to the watcher
/// (well within the watcher's freshness bound).
const HUB_AWAY_EVERY: Duration = Duration::from_secs(5);
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// Report states (the hub shows them as they are).
pub(crate) const IDLE: &str = "idle";
const DOWNLOADING: &str = "downloading";
const VERIFYING: &str = "verifying";
const SWITCHING: &str = "switching";
const PENDING_COMMIT: &str = "pending_commit";
const COMMITTED: &str = "committed";
const ROLLED_BACK: &str = "rolled_back";
const REFUSED: &str = "refused";
const FAILED: &str = "failed";

#[derive(Debug, Error)]
pub(crate) enum UpgradeError {
    #[error("no [upgrade] trusted_keys are configured: every upgrade from the hub is refused (add the publisher's RW… key line, or --trusted-key)")]
    NoKeys,
    #[error("the hub has no release of {version} for {platform}")]
    NoArtifact { version: String, platform: String },
    #[error("{to} is older than {from}: a downgrade is refused unless the hub asks for it (hub desired set --rollback true)")]
    Downgrade { from: String, to: String },
    #[error("cannot tell whether {to} is older than {from} (not semantic versions): refused unless the hub asks for it (hub desired set --rollback true)")]
    Unordered { from: String, to: String },
    #[error("{version} was rolled back on this host ({reason}): it is not tried again until the hub asks for another version, or `railgrid agent upgrade --clear-bad`")]
    Bad { version: String, reason: String },
    #[error("the artifact's URL {url:?} is not on the agent's hub {hub}: refused")]
    ForeignUrl { url: String, hub: String },
    #[error("the download of {url} failed: {why}")]
    Download { url: String, why: String },
    #[error("{url} sent more than the {size} bytes the desired state names: refused")]
    TooLarge { url: String, size: u64 },
    #[error("not enough space in {dir}: the download needs {need} more bytes, {free} are free")]
    NoSpace { dir: PathBuf, need: u64, free: u64 },
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not read the new binary {path}")]
    Pin {
        path: PathBuf,
        #[source]
        source: ExeError,
    },
    #[error("the new binary {path} is {got} bytes, not the {want} the desired state names")]
    Size { path: PathBuf, want: u64, got: u64 },
    #[error("the new binary {path} has SHA-256 {got}, not the {want} the desired state names")]
    Hash {
        path: PathBuf,
        want: String,
        got: String,
    },
    #[error("release {version} is refused: {source}")]
    Signature {
        version: String,
        #[source]
        source: SignatureError,
    },
    #[error("release {version} is refused: its signature says it is {signed:?}")]
    SignedVersion { version: String, signed: String },
    #[error("the new binary {path} failed its test run: {why}")]
    TestRun { path: PathBuf, why: String },
    #[error("the new binary reports version {got}, not {want}")]
    WrongVersion { want: String, got: String },
    #[error("the executable {path} has no directory or name to upgrade in")]
    NoDir { path: PathBuf },
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("could not start the upgrade watcher")]
    Watcher(#[source] std::io::Error),
    #[error("the upgrade record changed during the switch (its watcher ended it): not switching")]
    Superseded,
    #[error("the agent is stopping: not switching")]
    Stopping,
    #[error("the upgrade's {what} failed")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl UpgradeError {
    /// Errors that no retry of the same artifact can fix.
    fn is_refusal(&self) -> bool {
        matches!(
            self,
            UpgradeError::NoKeys
                | UpgradeError::NoArtifact { .. }
                | UpgradeError::Downgrade { .. }
                | UpgradeError::Unordered { .. }
                | UpgradeError::Bad { .. }
                | UpgradeError::ForeignUrl { .. }
                | UpgradeError::Signature { .. }
                | UpgradeError::SignedVersion { .. }
                | UpgradeError::WrongVersion { .. }
                | UpgradeError::TestRun { .. }
                | UpgradeError::Hash { .. }
                | UpgradeError::Size { .. }
                | UpgradeError::TooLarge { .. }
        )
    }
}

/// `<exe>.prev`.
pub(crate) fn prev_path(exe: &Path) -> PathBuf {
    let mut s = exe.as_os_str().to_owned();
    s.push(".prev");
    PathBuf::from(s)
}

/// The new binary is in place: stop the runner and re-exec from it.
pub(crate) struct Switch {
    /// The new binary, pinned: the re-exec runs these bytes.
    pub(crate) exe: PinnedExe,
    /// Where it is now: the executable's path.
    pub(crate) at: PathBuf,
    pub(crate) to: String,
}

/// What the agent's task set-up hands the upgrade task.
pub(super) struct UpgradeCtx {
    pub(super) cfg: AgentConfig,
    pub(super) exe: Arc<PinnedExe>,
    pub(super) observed: watch::Receiver<Observed>,
    /// The hub replica in use (the hub task moves it on a failover); `None` standalone.
    pub(super) link: watch::Receiver<Option<HubLink>>,
    /// Moves on every reconcile the hub answered, and says whether the hub is out of reach.
    pub(super) reached: watch::Receiver<super::hub::Contact>,
    pub(super) reporter: ReporterHandle,
}

pub(super) struct UpgradeHandle {
    report: watch::Receiver<Option<UpgradeReport>>,
    /// Set when the agent stops: no switch starts after it.
    stopping: watch::Sender<bool>,
    reload: tokio::sync::mpsc::UnboundedSender<AgentConfig>,
    switch: Option<oneshot::Receiver<Switch>>,
    task: tokio::task::JoinHandle<()>,
}

impl UpgradeHandle {
    pub(super) fn spawn(ctx: UpgradeCtx) -> Self {
        let (report_tx, report) = watch::channel(None);
        let (switch_tx, switch) = oneshot::channel();
        let (reload, reloads) = tokio::sync::mpsc::unbounded_channel();
        let keys = keys_of(&ctx.cfg);
        let (stopping, stop_rx) = watch::channel(false);
        let task = UpgradeTask {
            ctx,
            keys,
            reloads,
            stopping: stop_rx,
            report_tx,
            switch_tx: Some(switch_tx),
            failures: None,
            refused_local: None,
            state: None,
            local_problem: false,
        };
        Self {
            report,
            stopping,
            reload,
            switch: Some(switch),
            task: tokio::spawn(task.run()),
        }
    }

    /// A re-read configuration (SIGHUP): trusted keys, settle and deadline, and the hub's
    /// token for downloads.
    pub(super) fn reload(&self, cfg: AgentConfig) {
        let _ = self.reload.send(cfg);
    }

    /// The upgrade's state, for the hub's reports.
    pub(super) fn report(&self) -> watch::Receiver<Option<UpgradeReport>> {
        self.report.clone()
    }

    /// Resolves once the new binary is in place. Cancel-safe; pending for ever after it
    /// resolved once.
    pub(super) async fn switched(&mut self) -> Switch {
        match self.switch.as_mut() {
            Some(rx) => match rx.await {
                Ok(s) => {
                    self.switch = None;
                    s
                }
                Err(_) => {
                    self.switch = None;
                    std::future::pending().await
                }
            },
            None => std::future::pending().await,
        }
    }
}

impl UpgradeHandle {
    /// Ends the task for an agent that is stopping (not switching). A switch in flight
    /// is let finish and then undone: the operator asked for a stop, not for the new
    /// version, so the previous binary goes back and the record says `aborted` (the
    /// watcher then exits; the version is not to blame).
    pub(super) async fn shutdown(mut self, cfg: &AgentConfig) -> Option<String> {
        self.stopping.send_replace(true);
        let waited = tokio::time::timeout(SHUTDOWN_WAIT, &mut self.task).await;
        if waited.is_err() {
            self.task.abort();
        }
        let mut rx = self.switch.take()?;
        let switch = rx.try_recv().ok()?;
        let to = switch.to.clone();
        let dir = cfg.state_dir.clone();
        let _ = tokio::task::spawn_blocking(move || undo_switch(&dir, &switch)).await;
        Some(to)
    }
}

impl Drop for UpgradeHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The longest a stopping agent waits for a switch in flight (the watcher's start, a
/// copy of the binary, renames).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);

/// [`undo_switch`] for the caller of [`crate::agent::run`], once the agent has stopped.
pub(crate) fn undo_switch_after_stop(state_dir: &Path, switch: &Switch) {
    undo_switch(state_dir, switch);
}

/// Puts the previous binary back after a switch the agent will not re-exec into.
pub(super) fn undo_switch(state_dir: &Path, switch: &Switch) {
    let outcome = record::update(state_dir, |r| {
        let Some(u) = r.upgrade.as_mut() else {
            return (false, Ok(()));
        };
        if u.to_sha256 != switch.exe.identity().sha256 || u.phase != Phase::Pending {
            return (false, Ok(()));
        }
        let prev = prev_path(&u.exe);
        let restored = match (exe_dir(&u.exe), exe_dir(&prev)) {
            (Ok((dir, name)), Ok((_, prev_name))) => Dir::open(&dir)
                .and_then(|d| d.rename(&prev_name, &name).and_then(|()| d.sync()))
                .map_err(|e| {
                    format!(
                        "could not rename {} over {}: {e}",
                        prev.display(),
                        u.exe.display()
                    )
                }),
            _ => Err(format!("{} has no directory", u.exe.display())),
        };
        u.phase = Phase::Aborted;
        u.reason = Some(match &restored {
            Ok(()) => "the agent was stopped during the switch; the previous binary is back".into(),
            Err(e) => format!("the agent was stopped during the switch; {e}"),
        });
        u.finished_at = Some(crate::util::unix_now());
        (true, restored)
    });
    match outcome {
        Ok(Ok(())) => tracing::info!("stopped during the switch: the previous binary is back"),
        Ok(Err(e)) => tracing::error!(error = %e, "stopped during the switch"),
        Err(e) => tracing::error!(error = %crate::error_chain(&e), "stopped during the switch"),
    }
}

/// What the record held at start.
enum Found {
    Nothing,
    /// A pending upgrade to this very binary.
    Commit(Upgrade),
    Done(Upgrade),
}

/// A failed attempt at one artifact, and when to try it again.
struct Failed {
    key: (String, String),
    at: Instant,
    pause: Duration,
}

struct UpgradeTask {
    ctx: UpgradeCtx,
    keys: Vec<minisign::PublicKey>,
    reloads: tokio::sync::mpsc::UnboundedReceiver<AgentConfig>,
    stopping: watch::Receiver<bool>,
    report_tx: watch::Sender<Option<UpgradeReport>>,
    switch_tx: Option<oneshot::Sender<Switch>>,
    failures: Option<Failed>,
    /// The replaced file whose test run failed (dev, inode, size, mtime): not tried
    /// again until the path names another file.
    refused_local: Option<(u64, u64, u64, (i64, i64))>,
    state: Option<UpgradeReport>,
    /// The state shown is about a replaced executable that is not taken: it stays until
    /// the path names the pinned file again, or a hub upgrade moves on.
    local_problem: bool,
}

impl UpgradeTask {
    async fn run(mut self) {
        self.startup().await;
        if *self.stopping.borrow() {
            return;
        }
        let mut tick = tokio::time::interval(LOCKSTEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if let Some(switch) = self.consider().await {
                self.hand_over(switch);
                return;
            }
            if *self.stopping.borrow() {
                return;
            }
            tokio::select! {
                // Cancel-safe: a watch receiver keeps its seen-version between polls.
                r = self.ctx.observed.changed() => if r.is_err() { return },
                // Cancel-safe: mpsc::recv loses no message when another arm wins.
                Some(cfg) = self.reloads.recv() => self.reloaded(cfg).await,
                // Cancel-safe: a watch receiver keeps its seen-version between polls.
                _ = self.stopping.changed() => return,
                // Cancel-safe: an interval's tick is not lost by another arm winning.
                _ = tick.tick() => {
                    if let Some(switch) = self.lockstep().await {
                        self.hand_over(switch);
                        return;
                    }
                }
            }
        }
    }

    async fn reloaded(&mut self, cfg: AgentConfig) {
        self.keys = keys_of(&cfg);
        // The hub task hands over the new link (token, CA, replica) itself.
        self.ctx.cfg = cfg;
        // New keys may make an artifact acceptable that was refused: try it now.
        self.failures = None;
    }

    fn hand_over(&mut self, switch: Switch) {
        if let Some(tx) = self.switch_tx.take() {
            let _ = tx.send(switch);
        }
    }

    fn own_sha(&self) -> &str {
        &self.ctx.exe.identity().sha256
    }

    fn set(&mut self, state: &str, target: Option<&str>, error: Option<String>) {
        let bad = record::peek(&self.ctx.cfg.state_dir)
            .map(|r| r.bad_versions.into_iter().map(|b| b.version).collect())
            .unwrap_or_default();
        let report = UpgradeReport {
            state: state.to_owned(),
            target: target.map(str::to_owned),
            error,
            bad_versions: bad,
        };
        if self.state.as_ref() != Some(&report) {
            match (&report.error, report.state.as_str()) {
                (Some(e), _) => tracing::warn!(state, target, error = %e, "upgrade"),
                (None, IDLE) => tracing::debug!("upgrade idle"),
                (None, _) => tracing::info!(state, target, "upgrade"),
            }
            self.state = Some(report.clone());
            self.ctx.reporter.upgrade(Some(report.clone()));
            self.report_tx.send_replace(Some(report));
        }
    }

    /// What the record left from the last agent: commit our own pending upgrade, close
    /// one that never switched, say what was rolled back.
    async fn startup(&mut self) {
        let state_dir = self.ctx.cfg.state_dir.clone();
        let own = self.own_sha().to_owned();
        let own_path = self.ctx.exe.path().to_owned();
        let pid = std::process::id();
        let start_time = sys_start_time();
        let found = tokio::task::spawn_blocking(move || {
            record::update(&state_dir, |r| {
                let Some(u) = r.upgrade.as_mut() else {
                    return (false, Found::Nothing);
                };
                match u.phase {
                    // Ours to commit: the record names these very bytes.
                    Phase::Pending if u.to_sha256 == own && u.exe == own_path => {
                        u.attempts += 1;
                        u.agent_pid = pid;
                        u.agent_start_time = start_time;
                        (true, Found::Commit(u.clone()))
                    }
                    Phase::Switching | Phase::Pending if u.from_sha256 == own => {
                        // This agent runs the old bytes, so the switch never happened
                        // (the agent died before the rename and was restarted): close it.
                        u.phase = Phase::Aborted;
                        u.reason = Some("the agent restarted on the previous binary before the switch completed".into());
                        u.finished_at = Some(crate::util::unix_now());
                        (true, Found::Done(u.clone()))
                    }
                    // Another binary's upgrade (a package manager replaced the file
                    // meanwhile): the watcher guards it, not this agent.
                    _ => (false, Found::Done(u.clone())),
                }
            })
        })
        .await;
        let found = match found {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => {
                self.set(FAILED, None, Some(crate::error_chain(&e)));
                return;
            }
            Err(_) => return,
        };
        match found {
            Found::Commit(u) => self.commit(u).await,
            Found::Done(u) if u.phase == Phase::RolledBack && u.from == build_info::VERSION => {
                let reason = u.reason.clone().unwrap_or_default();
                self.set(ROLLED_BACK, Some(&u.to), Some(reason));
            }
            Found::Done(u) if u.phase == Phase::Aborted && u.from == build_info::VERSION => {
                let reason = u.reason.clone().unwrap_or_default();
                self.set(FAILED, Some(&u.to), Some(reason));
                if u.blameless {
                    self.blame_if_hub_answers(u).await;
                }
            }
            Found::Done(u) if u.phase == Phase::Committed && u.to == build_info::VERSION => {
                self.set(COMMITTED, Some(&u.to), None);
            }
            _ => self.set(IDLE, None, None),
        }
    }

    /// Waits until this new agent is healthy (its runner served `/v1/health` for the
    /// settle period, one reconcile answered), then commits. The watcher's deadline
    /// bounds the wait; nothing here gives up.
    async fn commit(&mut self, u: Upgrade) {
        self.set(PENDING_COMMIT, Some(&u.to), None);
        let settle = self.ctx.cfg.upgrade.settle;
        let socket = crate::runner::Paths::new(&self.ctx.cfg.state_dir).socket;
        let mut client = None;
        let mut healthy_since: Option<Instant> = None;
        let mut said_away: Option<Instant> = None;
        let needs_hub = self.ctx.link.borrow().is_some();
        tracing::info!(version = %u.to, settle = %humantime::format_duration(settle), attempts = u.attempts, "upgrade pending: committing once healthy");
        loop {
            let (running, enabled) = {
                let o = self.ctx.observed.borrow();
                (o.runner.state == State::Running, o.desired.runner.enabled)
            };
            let healthy = if !enabled {
                true
            } else if running {
                if client.is_none() {
                    let s = socket.clone();
                    client =
                        tokio::task::spawn_blocking(move || crate::runner::client::Client::new(&s))
                            .await
                            .ok();
                }
                match &client {
                    Some(c) => matches!(
                        tokio::time::timeout(HEALTH_TIMEOUT, c.health()).await,
                        Ok(Ok(_))
                    ),
                    None => false,
                }
            } else {
                false
            };
            self.revive_watcher(&u).await;
            if healthy {
                healthy_since.get_or_insert_with(Instant::now);
            } else {
                healthy_since = None;
                client = None;
            }
            let settled = healthy_since.is_some_and(|t| t.elapsed() >= settle);
            // Any answer since this process started: the hub round trip of this agent.
            let contact = *self.ctx.reached.borrow();
            let reached = !needs_hub || contact.answered > 0;
            if settled
                && !reached
                && contact.away
                && said_away.is_none_or(|t: Instant| t.elapsed() >= HUB_AWAY_EVERY)
            {
                // Healthy here, and only the hub is missing: the watcher waits for it
                // (up to the record's hub_wait) instead of blaming this version.
                if said_away.is_none() {
                    tracing::info!(version = %u.to, "healthy on this host; the hub is out of reach: waiting for it to commit the upgrade");
                }
                said_away = Some(Instant::now());
                self.say_hub_away(&u).await;
            }
            if settled && reached {
                match self.try_commit(&u).await {
                    Ok(true) => {
                        tracing::info!(version = %u.to, "upgrade committed");
                        self.set(COMMITTED, Some(&u.to), None);
                        return;
                    }
                    Ok(false) => {
                        // Rolled back under us: the watcher is stopping this agent.
                        self.set(
                            ROLLED_BACK,
                            Some(&u.to),
                            Some("rolled back by the watcher before the commit".into()),
                        );
                        return;
                    }
                    Err(e) => self.set(PENDING_COMMIT, Some(&u.to), Some(crate::error_chain(&e))),
                }
            }
            tokio::select! {
                () = tokio::time::sleep(HEALTH_EVERY) => {}
                // Cancel-safe: a watch receiver keeps its seen-version between polls.
                _ = self.stopping.changed() => return,
            }
        }
    }

    /// After a rollback without blame (the new version never reached its hub): if this,
    /// the previous binary, reaches the hub within [`HUB_PROOF`], the hub was not away,
    /// the new version's link to it was broken: it is blamed after all (remembered as bad,
    /// reported `rolled_back`, so the hub halts it). Nothing is retried meanwhile.
    async fn blame_if_hub_answers(&mut self, u: Upgrade) {
        if self.ctx.link.borrow().is_none() {
            return;
        }
        let mut reached = self.ctx.reached.clone();
        let answered = tokio::select! {
            // Cancel-safe: both only observe their channels.
            r = tokio::time::timeout(HUB_PROOF, reached.wait_for(|c| c.answered > 0)) => {
                r.is_ok_and(|r| r.is_ok())
            }
            _ = self.stopping.changed() => return,
        };
        if !answered {
            return;
        }
        let why = format!(
            "{}; but the previous version reached the hub at once, so version {} was at fault",
            u.reason.clone().unwrap_or_default(),
            u.to
        );
        let (dir, sha, reason) = (
            self.ctx.cfg.state_dir.clone(),
            u.to_sha256.clone(),
            why.clone(),
        );
        let to = u.to.clone();
        let blamed = tokio::task::spawn_blocking(move || {
            record::update(&dir, |r| {
                let Some(u) = r
                    .upgrade
                    .as_mut()
                    .filter(|u| u.to_sha256 == sha && u.blameless)
                else {
                    return (false, false);
                };
                u.phase = Phase::RolledBack;
                u.blameless = false;
                u.reason = Some(reason.clone());
                r.remember_bad(&to, &reason);
                (true, true)
            })
        })
        .await;
        if matches!(blamed, Ok(Ok(true))) {
            tracing::warn!(version = %u.to, "a rollback without blame is blamed on the version after all: this agent reached the hub at once");
            self.set(ROLLED_BACK, Some(&u.to), Some(why));
        }
    }

    /// Tells the watcher, through the record, that this agent is healthy on its host and
    /// cannot reach its hub.
    async fn say_hub_away(&self, u: &Upgrade) {
        let (dir, sha) = (self.ctx.cfg.state_dir.clone(), u.to_sha256.clone());
        let said = tokio::task::spawn_blocking(move || {
            record::try_update(&dir, |r| match r.upgrade.as_mut() {
                Some(u) if u.to_sha256 == sha && u.phase == Phase::Pending => {
                    let now = crate::util::unix_now();
                    u.healthy_at.get_or_insert(now);
                    u.hub_away_at = Some(now);
                    (true, ())
                }
                _ => (false, ()),
            })
        })
        .await;
        match said {
            // Said; or the lock was busy, and it is said again at the next turn.
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %crate::error_chain(&e), "could not tell the upgrade's watcher that the hub is out of reach")
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not tell the upgrade's watcher that the hub is out of reach")
            }
        }
    }

    /// The watcher of this pending upgrade died (a reboot in the commit window, a kill):
    /// a new one is started from `<exe>.prev`, the previous binary's bytes, checked by
    /// SHA-256, so that the rollback still never depends on this binary.
    async fn revive_watcher(&self, u: &Upgrade) {
        let state_dir = self.ctx.cfg.state_dir.clone();
        let log = service::log_path(&self.ctx.cfg.log_dir);
        let stop = self.ctx.cfg.runner.stop_grace + super::REAP_TIMEOUT + Duration::from_secs(5);
        let to_sha = u.to_sha256.clone();
        let _ = tokio::task::spawn_blocking(move || {
            watcher::revive(
                &state_dir,
                &to_sha,
                watcher::Renew::Keep,
                stop,
                &log,
                &std::env::args_os().skip(1).collect::<Vec<_>>(),
            )
        })
        .await;
    }

    /// `Ok(true)` once committed; `Ok(false)` when the record no longer allows it.
    async fn try_commit(&self, u: &Upgrade) -> Result<bool, UpgradeError> {
        let state_dir = self.ctx.cfg.state_dir.clone();
        let to_sha = u.to_sha256.clone();
        loop {
            let (dir, sha) = (state_dir.clone(), to_sha.clone());
            let out = tokio::task::spawn_blocking(move || {
                record::try_update(&dir, |r| match r.upgrade.as_mut() {
                    Some(u) if u.to_sha256 == sha && u.phase == Phase::Pending => {
                        u.phase = Phase::Committed;
                        u.finished_at = Some(crate::util::unix_now());
                        (true, true)
                    }
                    _ => (false, false),
                })
            })
            .await
            .map_err(|source| UpgradeError::Task {
                what: "commit",
                source,
            })??;
            match out {
                Some(done) => return Ok(done),
                // The watcher holds the lock: it is rolling back, or about to see the
                // commit; ask again shortly.
                None => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Acts on the desired agent version; `Some` once the new binary is in place.
    async fn consider(&mut self) -> Option<Switch> {
        let wanted = self.ctx.observed.borrow().desired.agent.clone();
        let Some(wanted) = wanted else {
            self.remove_downloads();
            self.keep_terminal_or_idle();
            return None;
        };
        if wanted.version == build_info::VERSION {
            self.remove_downloads();
            self.forget_other_bad(&wanted.version).await;
            self.keep_terminal_or_idle();
            return None;
        }
        let key = (
            wanted.version.clone(),
            wanted
                .artifact
                .as_ref()
                .map(|a| a.sha256.clone())
                .unwrap_or_default(),
        );
        if let Some(f) = &self.failures {
            if f.key == key && f.at.elapsed() < f.pause {
                return None;
            }
        }
        match self.upgrade_from_hub(&wanted).await {
            Ok(switch) => Some(switch),
            Err(UpgradeError::Bad { .. })
                if self.state.as_ref().is_some_and(|s| {
                    s.state == ROLLED_BACK && s.target.as_deref() == Some(wanted.version.as_str())
                }) =>
            {
                // The rollback itself stays reported: the hub halts the version on it.
                None
            }
            Err(e) => {
                let refused = e.is_refusal();
                self.set(
                    if refused { REFUSED } else { FAILED },
                    Some(&wanted.version),
                    Some(crate::error_chain(&e)),
                );
                let pause = match &self.failures {
                    Some(f) if f.key == key => (f.pause * 2).min(RETRY_MAX),
                    _ => RETRY_FIRST,
                };
                self.failures = Some(Failed {
                    key,
                    at: Instant::now(),
                    pause,
                });
                None
            }
        }
    }

    /// No version to fetch: partial downloads (an interrupted one, a version the hub no
    /// longer asks for) go.
    fn remove_downloads(&self) {
        if let Ok((dir, name)) = exe_dir(self.ctx.exe.path()) {
            remove_stale_downloads(&dir, &name, "");
        }
    }

    /// With nothing to do, a committed or rolled-back upgrade stays shown (the hub
    /// halts a rolled-back version on it); anything else becomes idle.
    fn keep_terminal_or_idle(&mut self) {
        let keep = self.local_problem
            || self.state.as_ref().is_some_and(|s| {
                matches!(s.state.as_str(), COMMITTED | ROLLED_BACK | PENDING_COMMIT)
            });
        if !keep {
            self.set(IDLE, None, None);
        }
    }

    /// A version remembered as bad is tried again once the hub has asked for another one.
    async fn forget_other_bad(&self, wanted: &str) {
        let dir = self.ctx.cfg.state_dir.clone();
        let wanted = wanted.to_owned();
        let _ = tokio::task::spawn_blocking(move || {
            record::update(&dir, |r| {
                let before = r.bad_versions.len();
                r.bad_versions.retain(|b| b.version == wanted);
                (r.bad_versions.len() != before, ())
            })
        })
        .await;
    }

    async fn upgrade_from_hub(&mut self, wanted: &DesiredAgent) -> Result<Switch, UpgradeError> {
        let version = wanted.version.clone();
        let rec = self.peek_record().await?;
        if let Some(bad) = rec.is_bad(&version) {
            return Err(UpgradeError::Bad {
                version,
                reason: bad.reason.clone(),
            });
        }
        self.forget_other_bad(&version).await;
        if self.keys.is_empty() {
            return Err(UpgradeError::NoKeys);
        }
        let Some(art) = wanted.artifact.clone() else {
            return Err(UpgradeError::NoArtifact {
                version,
                platform: format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
            });
        };
        candidate::check_order(build_info::VERSION, &version, wanted.rollback)?;
        let link = self.ctx.link.borrow().clone();
        let Some(link) = link else {
            return Err(UpgradeError::NoArtifact {
                version,
                platform: "this agent (no hub)".into(),
            });
        };
        let (dir_path, name) = exe_dir(self.ctx.exe.path())?;
        let dir = Dir::open(&dir_path).map_err(|source| UpgradeError::Io {
            path: dir_path.clone(),
            source,
        })?;
        let download = download_name(&name, &version);
        remove_stale_downloads(&dir_path, &name, &download);

        self.set(DOWNLOADING, Some(&version), None);
        let started = Instant::now();
        fetch::download(&link, &art, &dir, &dir_path, &download).await?;
        tracing::info!(%version, bytes = art.size, took = ?started.elapsed(), "downloaded the new binary");

        self.set(VERIFYING, Some(&version), None);
        let path = dir_path.join(&download);
        let keys = self.keys.clone();
        let (p, a, v) = (path.clone(), art.clone(), version.clone());
        let verified = tokio::task::spawn_blocking(move || {
            let exe = candidate::verify_download(&p, &a, &keys, &v)?;
            candidate::make_executable(&p)?;
            Ok::<_, UpgradeError>(exe)
        })
        .await
        .map_err(|source| UpgradeError::Task {
            what: "verification",
            source,
        })?;
        let new = match verified {
            Ok(exe) => exe,
            Err(e) => {
                let _ = dir.remove_file(&download);
                return Err(e);
            }
        };
        match candidate::test_run(&new, self.ctx.cfg.runner.user.as_ref()).await {
            Ok(v) if v == version => {}
            Ok(got) => {
                let _ = dir.remove_file(&download);
                return Err(UpgradeError::WrongVersion { want: version, got });
            }
            Err(e) => {
                let _ = dir.remove_file(&download);
                return Err(e);
            }
        }
        match self.switch(Kind::Hub, new, Some(&download), &version).await {
            Ok(s) => Ok(s),
            Err(e) => {
                let _ = dir.remove_file(&download);
                Err(e)
            }
        }
    }

    async fn peek_record(&self) -> Result<Record, UpgradeError> {
        let dir = self.ctx.cfg.state_dir.clone();
        tokio::task::spawn_blocking(move || record::peek(&dir))
            .await
            .map_err(|source| UpgradeError::Task {
                what: "record read",
                source,
            })?
            .map_err(UpgradeError::from)
    }

    /// Invariant 14: the executable's path names another file than the one pinned.
    async fn lockstep(&mut self) -> Option<Switch> {
        let id = self.ctx.exe.identity().clone();
        let now = stat_of(&id.path);
        let pinned = (id.device, id.inode, id.size, id.mtime);
        let Some(now) = now else {
            // Missing for a moment (a package manager between unlink and rename).
            return None;
        };
        if now == pinned {
            if self.local_problem {
                // Put back as it was: nothing is wrong any more.
                self.local_problem = false;
                self.refused_local = None;
                self.set(IDLE, None, None);
            }
            return None;
        }
        if self.refused_local == Some(now) {
            return None;
        }
        // A copy in progress changes size and mtime as it goes: wait until it holds still.
        tokio::time::sleep(Duration::from_millis(300)).await;
        if stat_of(&id.path) != Some(now) {
            return None;
        }
        let path = id.path.clone();
        let opened = tokio::task::spawn_blocking(move || PinnedExe::open(&path)).await;
        let new = match opened {
            Ok(Ok(new)) => new,
            Ok(Err(e)) => {
                self.refused_local = Some(now);
                self.local_problem = true;
                self.set(
                    REFUSED,
                    None,
                    Some(format!(
                        "the executable {} was replaced, and the new file cannot be read: {}",
                        id.path.display(),
                        crate::error_chain(&e)
                    )),
                );
                return None;
            }
            Err(_) => return None,
        };
        if new.identity().sha256 == id.sha256 {
            // The same bytes (touched, or copied over identically): nothing to run.
            self.refused_local = Some(now);
            return None;
        }
        tracing::info!(exe = %id.path.display(), sha256 = %new.identity().sha256, "the executable was replaced: test-running the new file");
        let version = match candidate::test_run(&new, self.ctx.cfg.runner.user.as_ref()).await {
            Ok(v) => v,
            Err(e) => {
                self.refused_local = Some(now);
                self.local_problem = true;
                self.set(REFUSED, None, Some(format!("{}; the agent keeps running its own bytes ({}), and its runners are launched from them", crate::error_chain(&e), build_info::VERSION)));
                return None;
            }
        };
        match self.switch(Kind::Local, new, None, &version).await {
            Ok(s) => Some(s),
            Err(e) => {
                self.refused_local = Some(now);
                self.local_problem = true;
                self.set(FAILED, Some(&version), Some(crate::error_chain(&e)));
                None
            }
        }
    }

    /// The switch (see the module's doc). `download`: the new file's name in the
    /// executable's directory (a hub upgrade); `None` when it is at the path already.
    async fn switch(
        &mut self,
        kind: Kind,
        new: PinnedExe,
        download: Option<&str>,
        version: &str,
    ) -> Result<Switch, UpgradeError> {
        self.set(SWITCHING, Some(version), None);
        let cfg = &self.ctx.cfg;
        let exe = self.ctx.exe.clone();
        let exe_path = exe.path().to_owned();
        let (dir_path, name) = exe_dir(&exe_path)?;
        let now = crate::util::unix_now();
        // The runner's stop comes after the switch and before the new agent starts: the
        // deadline leaves room for it.
        let stop = cfg.runner.stop_grace + super::REAP_TIMEOUT;
        let upgrade = Upgrade {
            phase: Phase::Switching,
            kind,
            from: build_info::VERSION.to_owned(),
            from_sha256: exe.identity().sha256.clone(),
            to: version.to_owned(),
            to_sha256: new.identity().sha256.clone(),
            exe: exe_path.clone(),
            started_at: now,
            deadline: now + (stop + cfg.upgrade.deadline).as_secs(),
            attempts: 0,
            agent_pid: std::process::id(),
            agent_start_time: sys_start_time(),
            watcher_pid: None,
            watcher_start_time: None,
            execed_at: None,
            hub_wait: cfg.upgrade.hub_wait.as_secs(),
            healthy_at: None,
            hub_away_at: None,
            blameless: false,
            reason: None,
            finished_at: None,
        };
        let state_dir = cfg.state_dir.clone();
        let log = service::log_path(&cfg.log_dir);
        let service = Service::detect();
        let stop_timeout = stop + Duration::from_secs(5);
        let download = download.map(str::to_owned);
        let to_sha = upgrade.to_sha256.clone();
        let stopping = self.stopping.clone();
        if *stopping.borrow() {
            return Err(UpgradeError::Stopping);
        }
        let result = tokio::task::spawn_blocking(move || {
            record::update(&state_dir, |r| {
                r.upgrade = Some(upgrade);
                (true, ())
            })?;
            let dir = Dir::open(&dir_path).map_err(|source| UpgradeError::Io {
                path: dir_path.clone(),
                source,
            })?;
            keep_prev(&dir, &dir_path, &name, &exe)?;
            let prev = prev_path(&exe_path);
            let agent_args: Vec<OsString> = std::env::args_os().skip(1).collect();
            watcher::launch(
                &prev,
                &state_dir,
                &to_sha,
                &service,
                stop_timeout,
                &log,
                &agent_args,
            )
            .map_err(UpgradeError::Watcher)?;
            // Nothing is renamed before the watcher is known to run: it records itself.
            let until = Instant::now() + WATCHER_START;
            loop {
                let rec = record::peek(&state_dir)?;
                if rec
                    .upgrade
                    .as_ref()
                    .is_some_and(|u| u.to_sha256 == to_sha && u.watcher_pid.is_some())
                {
                    break;
                }
                if Instant::now() >= until {
                    return Err(UpgradeError::Watcher(std::io::Error::other(format!(
                        "it did not start within {}",
                        humantime::format_duration(WATCHER_START)
                    ))));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // The last moment a stop can still keep the previous binary in place.
            if *stopping.borrow() {
                return Err(UpgradeError::Stopping);
            }
            if let Some(download) = &download {
                dir.rename(download, &name)
                    .and_then(|()| dir.sync())
                    .map_err(|source| UpgradeError::Io {
                        path: exe_path.clone(),
                        source,
                    })?;
            }
            let pending = record::update(&state_dir, |r| match r.upgrade.as_mut() {
                Some(u) if u.to_sha256 == to_sha && u.phase == Phase::Switching => {
                    u.phase = Phase::Pending;
                    (true, true)
                }
                _ => (false, false),
            })?;
            if !pending {
                return Err(UpgradeError::Superseded);
            }
            Ok::<_, UpgradeError>(())
        })
        .await
        .map_err(|source| UpgradeError::Task {
            what: "switch",
            source,
        })?;
        if let Err(e) = result {
            // Nothing was renamed over the executable: close the record, so that the
            // watcher (if it started) exits and the next attempt starts clean.
            let dir = self.ctx.cfg.state_dir.clone();
            let why = crate::error_chain(&e);
            let _ = tokio::task::spawn_blocking(move || {
                record::update(&dir, |r| match r.upgrade.as_mut() {
                    Some(u) if u.phase == Phase::Switching => {
                        u.phase = Phase::Aborted;
                        u.reason = Some(format!("the switch failed: {why}"));
                        u.finished_at = Some(crate::util::unix_now());
                        (true, ())
                    }
                    _ => (false, ()),
                })
            })
            .await;
            return Err(e);
        }
        tracing::info!(from = build_info::VERSION, to = %version, kind = ?kind, "the new binary is in place: stopping the runner and re-executing");
        Ok(Switch {
            exe: new,
            at: self.ctx.exe.path().to_owned(),
            to: version.to_owned(),
        })
    }
}

/// The trusted keys of `cfg` (checked when the configuration was loaded).
fn keys_of(cfg: &AgentConfig) -> Vec<minisign::PublicKey> {
    cfg.upgrade
        .trusted_keys
        .iter()
        .filter_map(|k| crate::release::public_key(k, Path::new(k)).ok())
        .collect()
}

/// Keeps the running binary's bytes as `<exe>.prev`: a hard link when the path still
/// names the running file, else a copy from the pinned descriptor; then checks it.
fn keep_prev(dir: &Dir, dir_path: &Path, name: &str, exe: &PinnedExe) -> Result<(), UpgradeError> {
    let prev = format!("{name}.prev");
    let tmp = format!(".{name}.prev.tmp");
    let io = |source| UpgradeError::Io {
        path: dir_path.join(&prev),
        source,
    };
    let _ = dir.remove_file(&tmp);
    let id = exe.identity();
    let running = Some((id.device, id.inode));
    // Left by a switch that stopped before its rename: `.prev` is the running file
    // already (renaming a second name of the same file over it would do nothing).
    if dir.identify(&prev).map_err(io)? == running {
        return Ok(());
    }
    let same = dir.identify(name).map_err(io)? == running;
    if same {
        dir.link(name, &tmp).map_err(io)?;
    } else {
        let mut f = dir.create_new_file(&tmp, 0o755).map_err(io)?;
        // Exactly 0755, whatever the umask: the runner's account executes it after a
        // rollback.
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o755))
            .map_err(io)?;
        if let Err(e) = exe.copy_to(&mut f) {
            let _ = dir.remove_file(&tmp);
            return Err(io(e));
        }
    }
    dir.rename(&tmp, &prev)
        .and_then(|()| dir.sync())
        .map_err(io)?;
    // Gone after the rename, unless both names were one file already.
    let _ = dir.remove_file(&tmp);
    let check = PinnedExe::open(&dir_path.join(&prev)).map_err(|source| UpgradeError::Pin {
        path: dir_path.join(&prev),
        source,
    })?;
    if check.identity().sha256 != id.sha256 {
        return Err(UpgradeError::Hash {
            path: dir_path.join(&prev),
            want: id.sha256.clone(),
            got: check.identity().sha256.clone(),
        });
    }
    Ok(())
}

/// The directory and file name of the executable.
fn exe_dir(exe: &Path) -> Result<(PathBuf, String), UpgradeError> {
    match (exe.parent(), exe.file_name().and_then(|n| n.to_str())) {
        (Some(d), Some(n)) if !d.as_os_str().is_empty() => Ok((d.to_owned(), n.to_owned())),
        _ => Err(UpgradeError::NoDir {
            path: exe.to_owned(),
        }),
    }
}

/// `.<name>.<version>.download`: hidden, and one per version, so a download resumes
/// only the version it was.
fn download_name(name: &str, version: &str) -> String {
    format!(".{name}.{version}.download")
}

/// Removes downloads of other versions left by earlier attempts.
fn remove_stale_downloads(dir: &Path, name: &str, keep: &str) {
    let prefix = format!(".{name}.");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let n = e.file_name();
        let Some(n) = n.to_str() else { continue };
        if n.starts_with(&prefix) && n.ends_with(".download") && n != keep {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// (device, inode, size, mtime) of the file at `path`, following symlinks as exec does.
fn stat_of(path: &Path) -> Option<(u64, u64, u64, (i64, i64))> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.len(), (m.mtime(), m.mtime_nsec())))
}

fn sys_start_time() -> Option<u64> {
    crate::sys::process_start_time(ProcessId::current())
}
