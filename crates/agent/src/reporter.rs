//! The status reporter: keeps `<state>/agent-status.json` and the service manager up to
//! date with what the agent observes.
//!
//! Task: [`ReporterTask`], one per agent.
//! - In (through [`ReporterHandle`]): the runner's status (from the reconciler, on every
//!   change and every few seconds), what a runner stop left and the agent ended, the
//!   config file in use, the link to the hub (from the hub task, on every change), the
//!   start of the agent's stop, and at last `finish`.
//! - Out: the status file, written atomically (fsync of file and directory) on a blocking
//!   thread, never on the runtime's; sd_notify `READY=1` (once, after the first status
//!   that shows a runner, so the file names it by then), `STATUS=` (when its line changes),
//!   `STOPPING=1`, and `RELOADING=1` … `READY=1` around a SIGHUP, the `READY=1` only once
//!   the reload's end is in the file (what `agent reload`, the unit's `ExecReload`, waits
//!   for).
//!
//! Updates coalesce: whatever arrived while a file was being written goes into one next
//! write, so a flapping runner costs at most one write in flight and one pending.

use std::path::PathBuf;
use std::time::SystemTime;

use tokio::sync::{mpsc, oneshot};

use super::notify::Notifier;
use super::status::{self, AgentStatus, HubStatus};
use crate::supervisor::{State, Status};

/// What the reporter is told.
enum Msg {
    /// The runner's status (`starts` over the agent's life) and whether a runner is
    /// wanted at all: a runner the desired state disables is not a failure to start.
    Runner {
        status: Status,
        wanted: bool,
    },
    Reaped(Vec<String>),
    ConfigPath(Option<PathBuf>),
    Hub(HubStatus),
    Upgrade(Option<crate::proto::report::UpgradeReport>),
    Drain(Option<crate::proto::drain::DrainReport>),
    Stopping,
    Reloading,
    /// A SIGHUP arrived: the configuration is read again and applied.
    ReloadBegun,
    /// That reload is over: applied (`Ok`) or refused, with the reason.
    Reloaded(Result<(), String>),
    /// The agent has stopped: write the last status (`running: false`) and end.
    Finish(oneshot::Sender<()>),
}

/// The way to the reporter task; cheap to clone.
#[derive(Clone)]
pub(super) struct ReporterHandle {
    // Unbounded: messages are small and coalesced on arrival, and a sender (the
    // reconciler, a signal handler) must never wait on a disk.
    tx: mpsc::UnboundedSender<Msg>,
    /// The status as last written, for the metrics.
    latest: tokio::sync::watch::Receiver<AgentStatus>,
}

impl ReporterHandle {
    /// Starts the reporter with the agent's initial status. Nothing is written until the
    /// first runner status arrives.
    pub(super) fn spawn(initial: AgentStatus) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let (latest_tx, latest) = tokio::sync::watch::channel(initial.clone());
        let task = ReporterTask {
            rx,
            latest: latest_tx,
            status: initial,
            notifier: Notifier::from_env(),
            wanted: true,
            ready: false,
            reload_done: false,
            last_line: String::new(),
        };
        tokio::spawn(task.run());
        Self { tx, latest }
    }

    /// The status as last written.
    pub(super) fn latest(&self) -> AgentStatus {
        self.latest.borrow().clone()
    }

    pub(super) fn runner(&self, status: Status, wanted: bool) {
        self.send(Msg::Runner { status, wanted });
    }

    pub(super) fn reaped(&self, ended: Vec<String>) {
        self.send(Msg::Reaped(ended));
    }

    pub(super) fn config_path(&self, path: Option<PathBuf>) {
        self.send(Msg::ConfigPath(path));
    }

    pub(super) fn hub(&self, hub: HubStatus) {
        self.send(Msg::Hub(hub));
    }

    pub(super) fn upgrade(&self, upgrade: Option<crate::proto::report::UpgradeReport>) {
        self.send(Msg::Upgrade(upgrade));
    }

    pub(super) fn drain(&self, drain: Option<crate::proto::drain::DrainReport>) {
        self.send(Msg::Drain(drain));
    }

    /// `RELOADING=1`, at once: the agent re-executes itself; the new one says READY=1.
    pub(super) fn reloading(&self) {
        self.send(Msg::Reloading);
    }

    /// `RELOADING=1` at once (once the agent has said `READY=1`: a service manager ignores
    /// it before).
    pub(super) fn reload_begun(&self) {
        self.send(Msg::ReloadBegun);
    }

    /// Counts the reload in the status file, then `READY=1`.
    pub(super) fn reloaded(&self, outcome: Result<(), String>) {
        self.send(Msg::Reloaded(outcome));
    }

    /// `STOPPING=1`, at once.
    pub(super) fn stopping(&self) {
        self.send(Msg::Stopping);
    }

    /// Writes the final status (`running: false`) after everything sent before, and waits
    /// until it is on disk.
    pub(super) async fn finish(self) {
        let (done, wait) = oneshot::channel();
        self.send(Msg::Finish(done));
        let _ = wait.await;
    }

    fn send(&self, msg: Msg) {
        // Fails only once the task has finished, when there is nothing left to report.
        let _ = self.tx.send(msg);
    }
}

struct ReporterTask {
    rx: mpsc::UnboundedReceiver<Msg>,
    latest: tokio::sync::watch::Sender<AgentStatus>,
    status: AgentStatus,
    notifier: Option<Notifier>,
    wanted: bool,
    ready: bool,
    /// A reload ended since the last write: `READY=1` once the file says so.
    reload_done: bool,
    last_line: String,
}

impl ReporterTask {
    async fn run(mut self) {
        while let Some(first) = self.rx.recv().await {
            let mut dirty = false;
            let mut finish = None;
            self.take(first, &mut dirty, &mut finish);
            // Everything queued meanwhile goes into the same write.
            while let Ok(msg) = self.rx.try_recv() {
                self.take(msg, &mut dirty, &mut finish);
            }
            if dirty {
                self.write().await;
                self.notify_status();
            }
            if std::mem::take(&mut self.reload_done) && self.ready {
                self.notify("READY=1");
            }
            if let Some(done) = finish {
                let _ = done.send(());
                return;
            }
        }
    }

    fn take(&mut self, msg: Msg, dirty: &mut bool, finish: &mut Option<oneshot::Sender<()>>) {
        match msg {
            Msg::Runner { status, wanted } => {
                self.status.runner = status;
                self.status.runner_enabled = wanted;
                self.wanted = wanted;
            }
            Msg::Reaped(ended) => self.status.reaped = ended,
            Msg::ConfigPath(path) => self.status.config_path = path,
            Msg::Hub(hub) => self.status.hub = Some(hub),
            Msg::Stopping => {
                self.notify("STOPPING=1");
                self.status.stopping = true;
            }
            Msg::Reloading => {
                self.notify(&format!(
                    "RELOADING=1\nMONOTONIC_USEC={}",
                    crate::sys::monotonic_usec()
                ));
                self.status.stopping = true;
            }
            Msg::ReloadBegun => {
                if self.ready {
                    self.notify(&format!(
                        "RELOADING=1\nMONOTONIC_USEC={}",
                        crate::sys::monotonic_usec()
                    ));
                }
            }
            Msg::Reloaded(outcome) => {
                let reloads = self.status.reloads.get_or_insert_with(Default::default);
                reloads.count += 1;
                reloads.last_at = Some(crate::util::unix_now());
                reloads.last_error = outcome.err();
                self.reload_done = true;
            }
            Msg::Upgrade(u) => self.status.upgrade = u,
            Msg::Drain(d) => self.status.drain = d,
            Msg::Finish(done) => {
                self.status.running = false;
                *finish = Some(done);
            }
        }
        *dirty = true;
    }

    /// fsyncs: on a blocking thread.
    async fn write(&mut self) {
        self.status.updated_at = SystemTime::now();
        let snapshot = self.status.clone();
        self.latest.send_replace(snapshot.clone());
        let written =
            tokio::task::spawn_blocking(move || status::write(&snapshot.state_dir, &snapshot))
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        if let Err(e) = written {
            tracing::warn!(error = %e, path = %status::path(&self.status.state_dir).display(), "could not write agent status");
        }
    }

    fn notify_status(&mut self) {
        let runner = &self.status.runner;
        let line = status_line(runner, self.wanted);
        if line != self.last_line {
            self.notify(&format!("STATUS={line}"));
            self.last_line = line;
        }
        if !self.ready && (runner.state != State::Stopped || !self.wanted) {
            self.ready = true;
            self.notify("READY=1");
            crate::util::release_startup_code();
        }
    }

    fn notify(&self, msg: &str) {
        if let Some(n) = &self.notifier {
            n.send(msg);
        }
    }
}

/// The `STATUS=` line for the service manager.
fn status_line(runner: &Status, wanted: bool) -> String {
    match (runner.state, runner.pid, &runner.last_error) {
        (State::Running, Some(pid), _) => {
            format!("runner running (pid {pid}, {} starts)", runner.starts)
        }
        (State::Backoff, _, Some(err)) => format!("runner restarting after: {err}"),
        (State::Stopped, _, _) if !wanted => "runner disabled by the desired state".to_owned(),
        (state, _, _) => format!("runner {state:?}").to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn initial(state_dir: PathBuf) -> AgentStatus {
        let now = SystemTime::now();
        AgentStatus {
            version: "test".into(),
            pid: std::process::id(),
            pid_start_time: None,
            started_at: now,
            updated_at: now,
            running: true,
            stopping: false,
            config_path: None,
            log_dir: state_dir.clone(),
            state_dir,
            runner: runner(State::Stopped, 0),
            reclaimed_pids: Vec::new(),
            reaped: Vec::new(),
            exe: None,
            runner_enabled: true,
            hub: None,
            upgrade: None,
            reloads: None,
            drain: None,
        }
    }

    fn runner(state: State, starts: u64) -> Status {
        Status {
            state,
            pid: (state == State::Running).then_some(42),
            starts,
            last_error: None,
            since: SystemTime::now(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_update_before_finish_is_what_the_file_says() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reporter = ReporterHandle::spawn(initial(dir.path().to_owned()));
        for n in 1..=200 {
            reporter.runner(runner(State::Running, n), true);
        }
        reporter.reaped(vec!["job a (pid 7): left running".into()]);
        reporter.config_path(Some("/etc/railgrid/agent.toml".into()));
        let hub = HubStatus {
            url: "https://hub.example".into(),
            agent_id: "a1".into(),
            connected: false,
            last_contact: Some(1_700_000_000),
            last_error: Some("could not reach the hub".into()),
            generation: 4,
            desired_version: None,
        };
        reporter.hub(hub.clone());
        reporter.runner(runner(State::Stopped, 200), false);
        reporter.clone().finish().await;

        let st = status::read(dir.path()).expect("status");
        assert!(!st.running);
        assert_eq!(st.runner.starts, 200);
        assert_eq!(st.runner.pid, None);
        assert!(!st.runner_enabled);
        assert_eq!(st.hub, Some(hub));
        assert_eq!(st.reaped, ["job a (pid 7): left running"]);
        assert_eq!(
            st.config_path.as_deref(),
            Some(std::path::Path::new("/etc/railgrid/agent.toml"))
        );
        // Finished: later updates go nowhere, and say so by not panicking.
        reporter.runner(runner(State::Backoff, 201), true);
    }

    #[test]
    fn a_disabled_runner_reads_as_such() {
        assert_eq!(
            status_line(&runner(State::Stopped, 3), false),
            "runner disabled by the desired state"
        );
        assert_eq!(
            status_line(&runner(State::Stopped, 3), true),
            "runner stopped"
        );
        assert_eq!(
            status_line(&runner(State::Running, 3), true),
            "runner running (pid 42, 3 starts)"
        );
    }
}
