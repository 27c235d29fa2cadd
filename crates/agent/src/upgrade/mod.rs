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
//! make it executable, test-run it ([`candidate`]); then switch ([`switch`]): the
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
mod commit;
mod error;
mod fetch;
mod packaged;
pub mod record;
pub mod service;
mod switch;
pub mod watcher;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

pub use self::error::UpgradeError;
use self::record::{Kind, Phase, Record, Upgrade};
use self::service::Service;
pub(super) use self::switch::undo_switch;
use self::switch::{download_name, exe_dir, remove_stale_downloads};
pub use self::switch::{prev_path, undo_switch_after_stop};
use super::config::AgentConfig;
use super::desired::Observed;
use super::reporter::ReporterHandle;
use super::upload::HubLink;
use crate::build_info;
use crate::proto::desired::DesiredAgent;
use crate::proto::drain::Drain;
use crate::proto::report::UpgradeReport;
use crate::supervisor::State;
use crate::sys::dirfd::Dir;
use crate::sys::exe::PinnedExe;
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
pub const IDLE: &str = "idle";
const DOWNLOADING: &str = "downloading";
const VERIFYING: &str = "verifying";
const DRAINING: &str = "draining";
const SWITCHING: &str = "switching";
const PENDING_COMMIT: &str = "pending_commit";
const COMMITTED: &str = "committed";
const ROLLED_BACK: &str = "rolled_back";
const REFUSED: &str = "refused";
const FAILED: &str = "failed";

/// The new binary is in place: stop the runner and re-exec from it.
pub struct Switch {
    /// The new binary, pinned: the re-exec runs these bytes.
    pub exe: PinnedExe,
    /// Where it is now: the executable's path.
    pub at: PathBuf,
    pub to: String,
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
    /// For the runner's health before a commit.
    pub(super) runner: super::runner_link::RunnerLink,
    /// The runner drains before a switch.
    pub(super) drain: super::drain::UpgradeDrain,
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
            reconsider: false,
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
    /// The desired state changed while the runner drained for an upgrade it no longer
    /// asks for: look at it again at once.
    reconsider: bool,
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
            // No switch: a drain an upgrade began (or a killed agent kept) ends.
            self.ctx.drain.end().await;
            if std::mem::take(&mut self.reconsider) {
                continue;
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
                    self.ctx.drain.end().await;
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
        self.set_waiting(state, target, error, None);
    }

    fn set_waiting(
        &mut self,
        state: &str,
        target: Option<&str>,
        error: Option<String>,
        waiting: Option<String>,
    ) {
        let bad = record::peek(&self.ctx.cfg.state_dir)
            .map(|r| r.bad_versions.into_iter().map(|b| b.version).collect())
            .unwrap_or_default();
        let report = UpgradeReport {
            state: state.to_owned(),
            target: target.map(str::to_owned),
            error,
            bad_versions: bad,
            waiting,
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
            Ok(switch) => switch,
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

    /// `None`: not now (the drain before the switch was given up).
    async fn upgrade_from_hub(
        &mut self,
        wanted: &DesiredAgent,
    ) -> Result<Option<Switch>, UpgradeError> {
        let version = wanted.version.clone();
        let rec = self.peek_record().await?;
        if let Some(bad) = rec.is_bad(&version) {
            return Err(UpgradeError::Bad {
                version,
                reason: bad.reason.clone(),
            });
        }
        self.forget_other_bad(&version).await;
        if let Some(package) = packaged::dpkg_owner(self.ctx.exe.path()) {
            return Err(UpgradeError::Packaged {
                path: self.ctx.exe.path().to_owned(),
                package,
                version,
            });
        }
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
        if !self.drain_first(&version, true).await {
            let _ = dir.remove_file(&download);
            return Ok(None);
        }
        match self.switch(Kind::Hub, new, Some(&download), &version).await {
            Ok(s) => Ok(Some(s)),
            Err(e) => {
                let _ = dir.remove_file(&download);
                Err(e)
            }
        }
    }

    /// Drains the runner before a switch to `version` (docs/design.md, "Upgrades never
    /// kill a job that can finish"): true once no job is left, or at the deadline
    /// (`upgrade.drain_deadline`; zero: at once), when the runner cancels what still runs
    /// and the switch's stop budget ends it; false when the agent stops first or, with
    /// `follow_hub`, the hub no longer asks for `version`. The drain stays in force
    /// through the switch (and the new agent's commit: no job starts on a binary that
    /// may yet be rolled back); the caller ends it otherwise.
    async fn drain_first(&mut self, version: &str, follow_hub: bool) -> bool {
        let budget = self.ctx.cfg.upgrade.drain_deadline;
        if budget.is_zero() {
            return true;
        }
        let reason = format!("upgrade to {version}");
        let now = crate::util::unix_now_ms();
        // An agent killed while it drained for this version keeps the first deadline.
        let drain = match self.ctx.drain.current() {
            Some(d) if d.reason == reason => d,
            _ => Drain {
                reason,
                since_ms: now,
                deadline_ms: Some(now.saturating_add(budget.as_millis() as u64)),
            },
        };
        let deadline_ms = drain.deadline_ms.unwrap_or(u64::MAX);
        self.ctx.drain.begin(drain.clone()).await;
        let mut report = self.ctx.drain.report();
        loop {
            let left = report
                .borrow_and_update()
                .as_ref()
                .filter(|d| d.reason.contains(&drain.reason))
                .and_then(|d| d.jobs_left);
            if left == Some(0) {
                tracing::info!(%version, "no job is left: switching");
                return true;
            }
            let now = crate::util::unix_now_ms();
            if now >= deadline_ms {
                tracing::warn!(%version, jobs_left = ?left, "the upgrade's drain deadline passed: switching; what still runs is cancelled (reason: drain deadline, upgrade)");
                return true;
            }
            let waiting = match left {
                Some(n) => format!("waiting for {n} job(s)"),
                None => "waiting for the runner's count of its jobs".to_owned(),
            };
            let until = humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + Duration::from_millis(deadline_ms),
            );
            self.set_waiting(
                DRAINING,
                Some(version),
                None,
                Some(format!("{waiting} (deadline {until})")),
            );
            let wait = Duration::from_millis(deadline_ms - now);
            tokio::select! {
                // Cancel-safe: watch receivers keep their seen-version between polls.
                r = report.changed() => if r.is_err() { return false },
                _ = self.stopping.changed() => return false,
                r = self.ctx.observed.changed(), if follow_hub => {
                    let still = self.ctx.observed.borrow().desired.agent.as_ref().map(|a| a.version.clone());
                    if r.is_err() || still.as_deref() != Some(version) {
                        tracing::info!(%version, "the hub no longer asks for this version: the drain for it ends");
                        self.reconsider = true;
                        return false;
                    }
                }
                // Cancel-safe: a sleep.
                () = tokio::time::sleep(wait) => {}
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
        // The operator's file: what the hub asks for does not end this drain.
        if !self.drain_first(&version, false).await {
            return None;
        }
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
}

/// The trusted keys of `cfg` (checked when the configuration was loaded).
fn keys_of(cfg: &AgentConfig) -> Vec<minisign::PublicKey> {
    cfg.upgrade
        .trusted_keys
        .iter()
        .filter_map(|k| crate::release::public_key(k, Path::new(k)).ok())
        .collect()
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
