//! The agent's side of the hub protocol (v1, docs/hub.md): a long-poll reconcile loop.
//!
//! Task: [`HubTask`], one per agent with a `[hub]`; callers hold a [`HubHandle`].
//! - Out, to the hub: `POST {url}/v1/agents/{id}/reconcile?wait=30` with the agent's
//!   report ([`AgentReport`]: version, platform, host name, the generation applied, the
//!   runner's state and its job counts, each hub job's state, and the `jobs_version` of
//!   the last answer whose jobs it took) and `Authorization: Bearer <token>`.
//! - In, from the hub: a desired state ([`DesiredState`]), read with a 1 MiB cap.
//! - Out, to the jobs task: each answer's jobs and cancels ([`JobsLink::offer`]); a job
//!   is not a setting, and moves no generation.
//! - Out, to the reconciler: each desired state that differs from the one in force
//!   ([`ReconcilerHandle::desired`]); the reconciler applies it, keeps it in
//!   `<state>/desired.json` ([`persist`]) and says on its watch channel ([`Observed`])
//!   what it applied, which the next report carries.
//! - Out, to the reporter: the link's state ([`HubStatus`]: connected, last contact,
//!   last error, generation), on every change.
//! - In, through the handle: new hub settings (SIGHUP: the token file is read again),
//!   and shutdown.
//!
//! A failure (the hub down, a refused token, a broken answer, a desired state the
//! reconciler could not apply) is retried with capped, jittered exponential backoff
//! ([`backoff_delay`]) and logged once per change of state, never once per retry; a desired
//! state refused again after a poll the hub held (it knows the refusal from
//! `refused_generation`) is polled for again at once, the hold pacing the retries. Nothing
//! here stops the runner or ends the agent: without the hub the agent keeps the desired
//! state it applied last (docs/design.md, invariant 12).
//!
//! The token goes from its file (0600) into one `Authorization` value marked sensitive,
//! and nowhere else: not into a log line, the status file, an error, or a child. A hub
//! may echo it (in an error, in a field serde then quotes, as a version): every text
//! taken from an answer goes through [`Connection::hub_text`] or [`Connection::redact`].
//!
//! A desired state is taken only within the protocol's bounds ([`DesiredState::check`]:
//! a generation up to [`desired::MAX_GENERATION`], an agent version of the hub's form).
//! A hub that refuses the generation this agent reports (400 naming
//! `observed_generation`) is sent generation 0 until it answers, and that answer is
//! applied as a reset, even though it is older than the one applied.

mod connection;
mod enrol;
mod error;
mod pace;

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use self::connection::WAIT;
pub use self::connection::{check, Connection};
pub use self::enrol::enrol_if_needed;
pub use self::error::HubLinkError;
use self::pace::{Backoff, Pace};
use super::config::HubSettings;
use super::desired::Observed;
use super::jobs::JobsLink;
use super::reconciler::ReconcilerHandle;
use super::reporter::ReporterHandle;
use super::runner_link::RunnerLink;
use super::status::HubStatus;
use crate::build_info;
use crate::proto::desired::DesiredState;
use crate::proto::drain::DrainReport;
use crate::proto::labels::Labels;
use crate::proto::report::{AgentReport, JobsSummary, RunnerReport, UpgradeReport};
use crate::supervisor::State;

/// An answer with nothing new that took less than this was not held: the hub does not
/// long-poll, and its `poll_interval_secs` paces the agent.
const HELD: Duration = Duration::from_millis(500);
/// The longest pause between reconciles a hub may ask for (`poll_interval_secs`).
const MAX_POLL_INTERVAL: Duration = Duration::from_secs(3600);
/// How long a report waits for the runner's job counts.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);
/// After a report that found the runner running but could not count its jobs (its
/// socket not answering yet), the next goes out this soon, then twice as late each time
/// up to a held poll: the hub routes queued jobs by the runner's admission limit.
const SUMMARY_RETRY: Duration = Duration::from_secs(1);

/// The runner's state as a report names it: a runner the desired state disables is
/// `disabled`, not `stopped`.
fn runner_report(o: &Observed) -> RunnerReport {
    let state = match o.runner.state {
        State::Stopped if !o.desired.runner.enabled => "disabled",
        State::Stopped => "stopped",
        State::Running => "running",
        State::Backoff => "backoff",
    };
    RunnerReport {
        state: state.to_owned(),
        pid: o.runner.pid,
        starts: o.runner.starts,
        last_error: o.runner.last_error.clone(),
    }
}

enum Msg {
    /// New hub settings, and the host's labels.
    Reload(Box<(HubSettings, Labels)>),
    Shutdown,
}

/// The way to the hub task.
pub(super) struct HubHandle {
    tx: mpsc::UnboundedSender<Msg>,
    task: tokio::task::JoinHandle<()>,
}

/// What the agent's task set-up hands the hub task besides its connection.
pub(super) struct HubCtx {
    /// For the runner's job counts, in each report that finds it running.
    pub(super) runner: RunnerLink,
    /// The hub's jobs on this host: what each answer offers goes in, their reports go
    /// with every reconcile.
    pub(super) jobs: JobsLink,
    /// The labels the host declares (`agent.labels`).
    pub(super) labels: Labels,
    pub(super) reconciler: ReconcilerHandle,
    pub(super) reporter: ReporterHandle,
    pub(super) upgrade: watch::Receiver<Option<UpgradeReport>>,
    /// The drain in force on the host, reported with every reconcile.
    pub(super) drain: watch::Receiver<Option<DrainReport>>,
    /// Moved on every answered reconcile, for an upgrade's commit.
    pub(super) reached: watch::Sender<Contact>,
    /// The replica in use, for the uploads and downloads.
    pub(super) links: watch::Sender<Option<super::upload::HubLink>>,
}

impl HubHandle {
    /// Starts the reconcile loop.
    pub(super) fn spawn(conn: Connection, ctx: HubCtx) -> Self {
        let HubCtx {
            runner,
            jobs,
            labels,
            reconciler,
            reporter,
            upgrade,
            drain,
            reached,
            links,
        } = ctx;
        let (tx, rx) = mpsc::unbounded_channel();
        let observed = reconciler.observed();
        let generation = observed.borrow().desired.generation;
        let status = HubStatus {
            url: conn.base().to_owned(),
            agent_id: conn.settings.agent_id.clone(),
            connected: false,
            last_contact: None,
            last_error: None,
            generation,
            desired_version: None,
        };
        let jobs_moved = jobs.subscribe();
        let task = HubTask {
            rx,
            links,
            jobs,
            jobs_moved,
            labels,
            conn,
            reconciler,
            observed,
            reporter,
            runner,
            hostname: crate::sys::hostname().unwrap_or_default(),
            status,
            hub_failure: None,
            apply_failure: None,
            ever_connected: false,
            summary_retry: SUMMARY_RETRY,
            tried: 0,
            reset: false,
            backoff: Backoff::default(),
            published: None,
            upgrade,
            upgrade_open: true,
            drain,
            drain_open: true,
            jobs_version: None,
            refused: None,
            reached,
        };
        Self {
            tx,
            task: tokio::spawn(task.run()),
        }
    }

    /// New hub settings (SIGHUP): the token and CA files are read again, and the next
    /// reconcile goes out at once. Settings that cannot be used are logged and the ones in
    /// use kept.
    /// The host's labels go with the next report, whatever becomes of the settings.
    pub(super) fn reload(&self, settings: HubSettings, labels: Labels) {
        let _ = self.tx.send(Msg::Reload(Box::new((settings, labels))));
    }

    /// Ends the loop (a reconcile in flight is dropped) and waits for it.
    pub(super) async fn shutdown(self) {
        let _ = self.tx.send(Msg::Shutdown);
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the hub task failed");
        }
    }
}

struct HubTask {
    rx: mpsc::UnboundedReceiver<Msg>,
    /// The replica in use, for the upgrader's downloads.
    links: watch::Sender<Option<super::upload::HubLink>>,
    /// The hub's jobs on this host; their reports go with every reconcile.
    jobs: JobsLink,
    jobs_moved: watch::Receiver<u64>,
    /// The labels the host declares, as the last configuration read says.
    labels: Labels,
    conn: Connection,
    reconciler: ReconcilerHandle,
    observed: watch::Receiver<Observed>,
    reporter: ReporterHandle,
    /// For the runner's job counts, in each report that finds it running.
    runner: RunnerLink,
    hostname: String,
    /// What the status file says of the link; sent to the reporter on every change.
    status: HubStatus,
    /// The failure to reach the hub (or to get a desired state from it) being reported;
    /// `None` while it answers.
    hub_failure: Option<String>,
    /// The failure to apply the hub's desired state being reported.
    apply_failure: Option<String>,
    ever_connected: bool,
    /// When to report again after one without the runner's job counts.
    summary_retry: Duration,
    /// Replicas that failed since the last answer.
    tried: usize,
    /// The hub refused the generation reported: generation 0 is reported until its
    /// answer is applied, as a reset.
    reset: bool,
    backoff: Backoff,
    /// What the reporter was sent last.
    published: Option<HubStatus>,
    /// The self-upgrade's state, reported with every reconcile.
    upgrade: watch::Receiver<Option<UpgradeReport>>,
    upgrade_open: bool,
    /// The drain in force on the host, reported with every reconcile.
    drain: watch::Receiver<Option<DrainReport>>,
    drain_open: bool,
    /// The `jobs_version` of the last answer whose jobs went to the jobs task, echoed in
    /// every report: a hub holding the poll answers at once when its own differs.
    jobs_version: Option<u64>,
    /// The generation of the desired state the reconciler last refused, while it is the
    /// newest the hub gave: reported, so that a hub holds the next poll rather than
    /// answer the same state at once.
    refused: Option<u64>,
    /// How the link fares, for an upgrade's commit.
    reached: watch::Sender<Contact>,
}

/// What an upgrade's commit needs to know of the link to the hub.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Contact {
    /// Reconciles the hub answered since this process started (a commit needs one).
    pub answered: u64,
    /// The latest try did not get through for a reason that is no fault of this build:
    /// no connection, a timeout, or the hub answering 5xx or 429.
    pub away: bool,
}

/// What the main loop does after a reconcile, or a message.
enum Next {
    /// The next reconcile, as soon as the spacing allows.
    Again,
    /// The next reconcile after this pause.
    Pause(Duration),
    Stop,
}

impl HubTask {
    async fn run(mut self) {
        tracing::info!(url = %self.conn.base(), replicas = self.conn.settings.urls.len(), agent_id = %self.conn.settings.agent_id, "reconciling with the hub");
        let mut pace = Pace::new();
        loop {
            if let Some(until) = pace.take() {
                if !self.pause_until(until).await {
                    break;
                }
            }
            let report = self.report().await;
            let recount = self.recount_after(&report);
            // The first answer at once: a new agent (an upgraded one, waiting to commit)
            // learns that its hub answers without waiting out a held poll.
            let wait = if self.ever_connected {
                WAIT
            } else {
                Duration::ZERO
            };
            // From the request's start, the report built: how long the hub held it.
            let started = Instant::now();
            let next = tokio::select! {
                // Cancel-safe: dropping a reconcile in flight closes its connection; the
                // next one carries a fresh report, and applying it again changes nothing.
                answer = self.conn.reconcile(&report, wait) => self.answered(answer, started, wait).await,
                // Cancel-safe: mpsc::recv loses no message when another arm wins.
                msg = self.rx.recv() => self.control(msg).await,
                // Cancel-safe: a watch receiver keeps its seen-version between polls. The
                // runner changed under a held poll: report it now, not in 30 s.
                () = runner_moved(&mut self.observed, &report) => Next::Again,
                // Cancel-safe: a sleep.
                () = recount_in(recount) => Next::Again,
                // Cancel-safe, as above. A job changed: the hub hears of it now.
                r = self.jobs_moved.changed() => match r {
                    Ok(()) => Next::Again,
                    Err(_) => Next::Stop,
                },
                // Cancel-safe, as above. A drain began, ended or counted a job less: the
                // hub hears of it now (it routes around a drain, and `drain --wait`
                // watches the count).
                r = self.drain.changed(), if self.drain_open => {
                    // The drain task ends only with the agent: its last word stays.
                    self.drain_open = r.is_ok();
                    Next::Again
                },
                // Cancel-safe, as above. The upgrade moved: the hub hears of it now
                // (a rollback halts the version fleet-wide).
                r = self.upgrade.changed(), if self.upgrade_open => {
                    if r.is_err() {
                        // The upgrade task is done (the agent is switching): its last
                        // state stays in the reports.
                        self.upgrade_open = false;
                    }
                    Next::Again
                },
            };
            match next {
                Next::Again => {}
                Next::Pause(d) => {
                    if !self.pause_until(Instant::now() + d).await {
                        break;
                    }
                }
                Next::Stop => break,
            }
        }
        tracing::debug!("hub task stopped");
    }

    /// Waits until `until`, acting on messages meanwhile; false once told to stop. New
    /// settings cut the pause short.
    async fn pause_until(&mut self, until: Instant) -> bool {
        loop {
            tokio::select! {
                // Cancel-safe: a sleep is recreated from the same deadline.
                () = tokio::time::sleep_until(until) => return true,
                // Cancel-safe: mpsc::recv loses no message when another arm wins.
                msg = self.rx.recv() => match self.control(msg).await {
                    Next::Stop => return false,
                    Next::Again => return true,
                    Next::Pause(_) => {}
                },
            }
        }
    }

    async fn control(&mut self, msg: Option<Msg>) -> Next {
        let (settings, labels) = match msg {
            Some(Msg::Reload(reload)) => *reload,
            Some(Msg::Shutdown) | None => return Next::Stop,
        };
        if labels != self.labels {
            tracing::info!(labels = %crate::proto::labels::to_list(&labels), "SIGHUP: new labels, for the next report");
            self.labels = labels;
        }
        let load = settings.clone();
        let loaded = tokio::task::spawn_blocking(move || Connection::load(&load))
            .await
            .unwrap_or_else(|source| {
                Err(HubLinkError::Task {
                    what: "hub settings reload",
                    source,
                })
            });
        match loaded {
            Ok(conn) => {
                if conn.settings != self.conn.settings {
                    tracing::info!(url = %settings.urls.join(","), agent_id = %settings.agent_id, "SIGHUP: new hub settings");
                }
                self.conn = conn;
                self.relink();
                self.status.url = self.conn.base().to_owned();
                self.status.agent_id = settings.agent_id;
                self.backoff.reset();
                // The host may take now what it refused: the next answer comes at once.
                self.refused = None;
                self.publish();
                Next::Again
            }
            Err(e) => {
                tracing::error!(error = %crate::error_chain(&e), "SIGHUP: the new hub settings cannot be used; keeping the ones in use");
                Next::Pause(Duration::ZERO)
            }
        }
    }

    /// The host's labels with the ones the agent sets itself.
    fn reported_labels(&self) -> Labels {
        let mut labels = self.labels.clone();
        for (k, v) in [
            ("os", std::env::consts::OS),
            ("arch", std::env::consts::ARCH),
            ("hostname", self.hostname.as_str()),
        ] {
            // A host name outside the value grammar is left out rather than sent.
            if crate::proto::labels::check_value(k, v).is_ok() {
                labels.insert(k.to_owned(), v.to_owned());
            }
        }
        labels
    }

    /// How soon to report again for want of the runner's job counts (`None`: no need).
    fn recount_after(&mut self, report: &AgentReport) -> Option<Duration> {
        if report.runner.state != "running" || report.jobs_summary.is_some() {
            self.summary_retry = SUMMARY_RETRY;
            return None;
        }
        let after = self.summary_retry;
        self.summary_retry = (after * 2).min(WAIT);
        Some(after)
    }

    /// The report for the next reconcile, from what the reconciler observes now.
    async fn report(&mut self) -> AgentReport {
        let observed = self.observed.borrow_and_update().clone();
        self.jobs_moved.borrow_and_update();
        let jobs = self.jobs.reports();
        let jobs_summary = if observed.runner.state == State::Running {
            self.jobs().await
        } else {
            None
        };
        AgentReport {
            version: build_info::VERSION.to_owned(),
            os: std::env::consts::OS.to_owned(),
            arch: std::env::consts::ARCH.to_owned(),
            hostname: self.hostname.clone(),
            labels: self.reported_labels(),
            observed_generation: if self.reset {
                0
            } else {
                observed.desired.generation
            },
            runner: runner_report(&observed),
            upgrade: self.upgrade.borrow_and_update().clone(),
            drain: self.drain.borrow_and_update().clone(),
            jobs_summary,
            jobs,
            jobs_version: self.jobs_version,
            refused_generation: self.refused,
        }
    }

    /// The runner's job counts, when it answers in time.
    async fn jobs(&mut self) -> Option<JobsSummary> {
        let client = self.runner.client().await.ok()?;
        match tokio::time::timeout(HEALTH_TIMEOUT, client.health()).await {
            Ok(Ok(health)) => Some(JobsSummary {
                running: health.jobs_running,
                queued: health.jobs_queued,
                max_jobs: health.max_jobs,
            }),
            Ok(Err(e)) => {
                tracing::debug!(error = %crate::error_chain(&e), "no job counts for the hub report");
                None
            }
            Err(_) => None,
        }
    }

    /// Acts on the answer to the reconcile sent at `sent`.
    async fn answered(
        &mut self,
        answer: Result<DesiredState, HubLinkError>,
        sent: Instant,
        wait: Duration,
    ) -> Next {
        // Whether the hub held the poll: measured before the reconciler takes its turn.
        let answered_in = sent.elapsed();
        super::metrics::RECONCILE.observe(answered_in.as_secs_f64());
        let counter = if answer.is_ok() {
            &super::metrics::RECONCILES_OK
        } else {
            &super::metrics::RECONCILES_FAILED
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let desired = match answer {
            Ok(mut d) => {
                // Out of the state at once: nothing keeps, shows or logs it.
                if let Some(new) = d.new_token.take() {
                    self.take_token(new.0).await;
                }
                d
            }
            Err(e) => {
                self.hub_failed(&e);
                if matches!(e, HubLinkError::GenerationRefused { .. }) && !self.reset {
                    // Retrying the same report would be refused for ever.
                    let applied = self.observed.borrow().desired.generation;
                    tracing::warn!(applied, "the hub refuses the generation this agent reports: reporting generation 0, and taking the hub's answer as a reset");
                    self.reset = true;
                    // Nothing it refused stands beside a reset: the answer comes at once.
                    self.refused = None;
                    return Next::Again;
                }
                // Replicas of one hub: the next one is tried at once, each once a
                // round; a round of failures is paced by the backoff.
                let failed = self.conn.base().to_owned();
                if self.conn.rotate() {
                    self.relink();
                    self.status.url = self.conn.base().to_owned();
                    self.publish();
                    tracing::info!(failed = %failed, next = %self.conn.base(), "trying the next hub replica");
                    self.tried += 1;
                    if self.tried < self.conn.settings.urls.len() {
                        return Next::Again;
                    }
                    self.tried = 0;
                }
                let pause = self.backoff.next();
                tracing::debug!(retry_in = ?pause, failures = self.backoff.failures, "next reconcile after the backoff");
                return Next::Pause(pause);
            }
        };
        self.tried = 0;
        self.reachable(&desired);
        self.reached.send_modify(|c| {
            c.answered += 1;
            c.away = false;
        });
        let applied = self.observed.borrow().desired.clone();
        let reset = self.reset && desired.generation < applied.generation;
        if desired.generation < applied.generation && !reset {
            // A hub restored from an older backup: never go back. The reference hub moves
            // past the reported generation; another one is asked again after the backoff.
            // Nor is a refusal of a generation it no longer gives reported.
            self.refused = None;
            let e = HubLinkError::NotApplied {
                generation: desired.generation,
                why: format!(
                    "it is older than the applied generation {}",
                    applied.generation
                ),
            };
            self.apply_failed(&e);
            return Next::Pause(self.backoff.next());
        }
        // The jobs go to the jobs task from here, whatever becomes of the runner settings
        // beside them; the reconciler and desired.json see settings only.
        let mut desired = desired;
        self.jobs.offer(
            std::mem::take(&mut desired.jobs),
            std::mem::take(&mut desired.cancel_jobs),
        );
        let jobs_version = desired.jobs_version.take();
        let jobs_news = std::mem::replace(&mut self.jobs_version, jobs_version) != jobs_version;
        let news = desired != applied;
        if news {
            if reset {
                tracing::warn!(
                    applied = applied.generation,
                    generation = desired.generation,
                    "reset to the hub's desired state, older than the one applied"
                );
            }
            let before = self.observed.borrow().handled;
            self.reconciler.desired(desired.clone(), reset);
            if !self.wait_handled(before).await {
                return Next::Stop;
            }
            let refused = self.observed.borrow().refused.clone();
            if let Some(why) = refused {
                let e = HubLinkError::NotApplied {
                    generation: desired.generation,
                    why,
                };
                self.apply_failed(&e);
                // A generation refused for the first time is asked for again at once, with
                // the refusal reported; refused again after a poll the hub held (it knows
                // the refusal: it held until the hold's end, or a job cut it short), again
                // at once, the hold pacing the retries, so that jobs keep coming as they
                // are given. A hub that answers a known refusal at once (one older than
                // the field) gets the backoff.
                let before = self.refused.replace(desired.generation);
                let first = before != Some(desired.generation);
                if first || jobs_news || answered_in >= HELD {
                    if !first {
                        self.backoff.reset();
                    }
                    return Next::Again;
                }
                return Next::Pause(self.backoff.next());
            }
        }
        self.refused = None;
        // A reset was answered at once because generation 0 was reported, whatever the
        // hub does with polls: poll again at once, with the generation now applied.
        let was_reset = std::mem::replace(&mut self.reset, false);
        self.applied();
        // Something new is reported back at once, and a hub that held the poll is polled
        // again at once; one that answered "nothing new" without holding it (it does
        // not long-poll) is asked again after the interval it names.
        if news || jobs_news || was_reset || wait.is_zero() || sent.elapsed() >= HELD {
            return Next::Again;
        }
        let interval = desired
            .poll_interval_secs
            .map_or(Duration::ZERO, Duration::from_secs);
        Next::Pause(interval.min(MAX_POLL_INTERVAL))
    }

    /// Waits until the reconciler has handled the desired state handed to it after
    /// `before` others; false once told to stop.
    async fn wait_handled(&mut self, before: u64) -> bool {
        loop {
            if self.observed.borrow().handled > before {
                return true;
            }
            tokio::select! {
                // Cancel-safe: a watch receiver keeps its seen-version between polls.
                changed = self.observed.changed() => {
                    if changed.is_err() {
                        // The reconciler is gone: the agent is stopping.
                        return false;
                    }
                }
                // Cancel-safe: mpsc::recv loses no message when another arm wins.
                msg = self.rx.recv() => {
                    if let Next::Stop = self.control(msg).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Uploads and downloads go where reconciles go.
    fn relink(&self) {
        self.links.send_replace(Some(self.conn.link()));
    }

    /// A new token from the hub (a rotation): stored (0600, fsynced) before it is used,
    /// so that an agent killed at any point has a token that works: the old one until
    /// the hub sees the new one used, the new one after. One that cannot be stored is
    /// not used (the hub sends another with a later answer).
    async fn take_token(&mut self, token: String) {
        let Ok(auth) = crate::hub_client::bearer(&token) else {
            tracing::warn!("the hub sent a new token this agent cannot use; keeping its own");
            return;
        };
        let path = self.conn.settings.token_file.clone();
        let line = format!("{token}\n");
        let written = tokio::task::spawn_blocking(move || {
            crate::util::write_atomic(&path, line.as_bytes(), 0o600)
        })
        .await;
        match written {
            Ok(Ok(())) => {
                self.conn.auth = auth;
                self.relink();
                tracing::info!(token_file = %self.conn.settings.token_file.display(), "the hub rotated this agent's token: the new one is kept in the token file and used from now on");
            }
            Ok(Err(e)) => {
                tracing::warn!(token_file = %self.conn.settings.token_file.display(), error = %e, "could not keep the new hub token; the current one stays in use (the hub takes it until the new one is used)");
            }
            Err(e) => tracing::warn!(error = %e, "the token write failed"),
        }
    }

    fn hub_failed(&mut self, e: &HubLinkError) {
        let away = e.is_away();
        self.reached
            .send_if_modified(|c| std::mem::replace(&mut c.away, away) != away);
        let message = crate::error_chain(e);
        if self.hub_failure.as_deref() != Some(message.as_str()) {
            tracing::warn!(error = %message, "hub reconcile failed; retrying with backoff (logged again when the failure changes)");
            self.hub_failure = Some(message.clone());
        }
        self.status.connected = false;
        self.status.last_error = Some(message);
        self.publish();
    }

    /// The hub answered with a desired state.
    fn reachable(&mut self, desired: &DesiredState) {
        let was_failing = self.hub_failure.take().is_some();
        // "Again" only after an earlier success: an agent started while its hub was
        // down has never reached it.
        if !self.ever_connected {
            tracing::info!(url = %self.conn.base(), generation = desired.generation, "connected to the hub");
        } else if was_failing {
            tracing::info!(url = %self.conn.base(), "hub reachable again");
        }
        self.ever_connected = true;
        self.status.connected = true;
        self.status.last_contact = Some(crate::util::unix_now());
        self.status.desired_version = desired.agent.as_ref().map(|a| a.version.clone());
        self.publish();
    }

    fn apply_failed(&mut self, e: &HubLinkError) {
        let message = crate::error_chain(e);
        if self.apply_failure.as_deref() != Some(message.as_str()) {
            tracing::warn!(error = %message, "the hub's desired state is not applied; keeping the one in force");
            self.apply_failure = Some(message.clone());
        }
        self.status.last_error = Some(message);
        self.publish();
    }

    /// The hub's desired state is the one in force: nothing is failing.
    fn applied(&mut self) {
        if self.apply_failure.take().is_some() {
            tracing::info!("the hub's desired state is applied");
        }
        self.backoff.reset();
        self.status.last_error = None;
        self.publish();
    }

    /// Sends the link's state to the reporter when it changed.
    fn publish(&mut self) {
        let generation = self.observed.borrow().desired.generation;
        self.status.generation = generation;
        if self.published.as_ref() != Some(&self.status) {
            self.published = Some(self.status.clone());
            self.reporter.hub(self.status.clone());
        }
    }
}

/// Resolves once what the reconciler observes differs from what `sent` reported: the
/// runner's state or pid, or the generation applied. Pending for ever once the
/// reconciler is gone.
async fn recount_in(after: Option<Duration>) {
    match after {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

async fn runner_moved(observed: &mut watch::Receiver<Observed>, sent: &AgentReport) {
    loop {
        if observed.changed().await.is_err() {
            return std::future::pending().await;
        }
        let o = observed.borrow_and_update();
        let now = runner_report(&o);
        if now.state != sent.runner.state
            || now.pid != sent.runner.pid
            || o.desired.generation != sent.observed_generation
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn a_disabled_runner_is_reported_as_such() {
        let mut o = Observed {
            desired: DesiredState::default(),
            handled: 0,
            refused: None,
            runner: crate::supervisor::Status {
                state: State::Stopped,
                pid: None,
                starts: 2,
                last_error: None,
                since: SystemTime::now(),
            },
        };
        assert_eq!(runner_report(&o).state, "stopped");
        o.desired.runner.enabled = false;
        assert_eq!(runner_report(&o).state, "disabled");
        o.runner.state = State::Running;
        o.runner.pid = Some(9);
        let r = runner_report(&o);
        assert_eq!((r.state.as_str(), r.pid, r.starts), ("running", Some(9), 2));
    }
}
