//! The agent's side of the hub protocol (v1, docs/hub.md): a long-poll reconcile loop.
//!
//! Task: [`HubTask`], one per agent with a `[hub]`; callers hold a [`HubHandle`].
//! - Out, to the hub: `POST {url}/v1/agents/{id}/reconcile?wait=30` with the agent's
//!   report ([`AgentReport`]: version, platform, host name, the generation applied, the
//!   runner's state and its job counts) and `Authorization: Bearer <token>`.
//! - In, from the hub: a desired state ([`DesiredState`]), read with a 1 MiB cap.
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
//! ([`backoff_delay`]) and logged once per change of state, never once per retry. Nothing
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

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use thiserror::Error;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::config::HubSettings;
use super::desired::Observed;
use super::jobs::JobsHandle;
use super::reconciler::ReconcilerHandle;
use super::reporter::ReporterHandle;
use super::status::HubStatus;
use crate::build_info;
use crate::hub_client::{self, HubClientError};
use crate::proto::desired::{self, DesiredState};
use crate::proto::hub::ErrorBody;
use crate::proto::report::{AgentReport, JobsSummary, RunnerReport, UpgradeReport};
use crate::supervisor::State;

/// How long the hub may hold a reconcile before it answers (the long poll).
const WAIT: Duration = Duration::from_secs(30);
/// A reconcile's whole time limit: the hub's hold and room for the exchange.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(WAIT.as_secs() + 15);
/// Connecting, TLS handshake included.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest desired state read from the hub.
const MAX_ANSWER: usize = 1 << 20;
/// Reconciles are paced by a bucket: a burst of [`BURST`] at once, then at most [`RATE`]
/// a second, whatever the hub answers. A job through the hub takes about four (taken,
/// reported, ended, answered), so the rate bounds a host's jobs through the hub one after
/// another, not its jobs at once (one reconcile carries them all). A hub that keeps answering with something new cannot make this loop a
/// busy one, and one that answers at once with nothing new is asked again only after its
/// `poll_interval_secs` (see [`HELD`]).
const BURST: f64 = 50.0;
const RATE: f64 = 50.0;
/// The first and the longest pause after a failure.
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// An answer with nothing new that took less than this was not held: the hub does not
/// long-poll, and its `poll_interval_secs` paces the agent.
const HELD: Duration = Duration::from_millis(500);
/// The longest pause between reconciles a hub may ask for (`poll_interval_secs`).
const MAX_POLL_INTERVAL: Duration = Duration::from_secs(3600);
/// How long a report waits for the runner's job counts.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);
/// The most of a hub's error text that goes into a log line.
const MAX_ERROR_TEXT: usize = 300;
/// What stands for the token in text from a hub.
const REDACTED: &str = "<redacted>";
/// A tail of a hub's text at least this long that begins the token is redacted too.
const MIN_PARTIAL: usize = 4;

#[derive(Debug, Error)]
pub(crate) enum HubError {
    #[error("could not read the hub token file {path}")]
    TokenRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the hub token file {path} is empty: write the token `railgrid hub agent add` printed into it")]
    TokenEmpty { path: PathBuf },
    #[error("the hub token in {path} holds characters an HTTP header cannot carry (a control character, or more than one line)")]
    TokenInvalid { path: PathBuf },
    #[error(transparent)]
    Client(HubClientError),
    #[error("the hub refused this agent's token (revoked or unknown): {url} answered {status}{message}; the agent needs a new token in its token file, then SIGHUP")]
    Refused {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{url} answered {status}{message}")]
    Status {
        url: String,
        status: u16,
        message: String,
    },
    #[error("could not reach the hub at {url}")]
    Request {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the hub at {url} did not answer within {}", humantime::format_duration(*after))]
    Timeout { url: String, after: Duration },
    #[error("could not encode the report for {url}")]
    Encode {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    // Serde's message as text: it quotes the hub's answer, so it is redacted first.
    #[error("{url}: the answer is not a desired state: {why}")]
    Decode { url: String, why: String },
    #[error("{url}: the answer is not a desired state this agent takes")]
    Invalid {
        url: String,
        #[source]
        source: desired::Invalid,
    },
    #[error("{url} answered 400{message}: the hub refuses the generation this agent reports")]
    GenerationRefused { url: String, message: String },
    #[error("could not apply the hub's desired state of generation {generation}: {why}")]
    NotApplied { generation: u64, why: String },
    #[error("the agent's {what} failed")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl HubError {
    /// The hub could not be reached, or said it cannot serve now: nothing this build
    /// did. A TLS failure, a refused token or an answer this build cannot take is not
    /// (a new build that broke its TLS or its reports must not look healthy).
    pub(crate) fn is_away(&self) -> bool {
        match self {
            HubError::Timeout { .. } => true,
            HubError::Status { status, .. } => *status >= 500 || *status == 429,
            HubError::Request { source, .. } => {
                let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source);
                while let Some(e) = cause {
                    // An io::Error's own `source` skips the error it wraps: look inside.
                    let inner = e
                        .downcast_ref::<std::io::Error>()
                        .and_then(|io| io.get_ref())
                        .map(|i| i as &(dyn std::error::Error + 'static));
                    if e.is::<rustls::Error>() || inner.is_some_and(|i| i.is::<rustls::Error>()) {
                        return false;
                    }
                    cause = e.source();
                }
                // No connection, a timeout, or a connection the hub (a restart, its own
                // bound on connections without a token, a balancer) closed or reset
                // under the request: all the hub's side. What this build did wrong (a
                // request it could not build, a redirect, an answer it cannot decode)
                // is not.
                !(source.is_builder() || source.is_redirect() || source.is_decode())
            }
            _ => false,
        }
    }
}

/// What talking to one hub takes: its settings, an HTTPS client that trusts its CA, and
/// the token, only as the header value that carries it.
pub(crate) struct Connection {
    settings: HubSettings,
    client: reqwest::Client,
    auth: HeaderValue,
    /// The replica in use, of `settings.urls`.
    current: usize,
}

impl Connection {
    /// What uploads to this hub take.
    pub(super) fn link(&self) -> super::upload::HubLink {
        super::upload::HubLink {
            client: self.client.clone(),
            url: self.base().to_owned(),
            auth: self.auth.clone(),
        }
    }

    /// The URL of the replica in use.
    fn base(&self) -> &str {
        &self.settings.urls[self.current % self.settings.urls.len()]
    }

    /// Moves on to the next replica; false when there is no other.
    fn rotate(&mut self) -> bool {
        if self.settings.urls.len() < 2 {
            return false;
        }
        self.current = (self.current + 1) % self.settings.urls.len();
        true
    }

    /// Reads the token file and the CA file and builds the client. Blocking (two small
    /// file reads): called on a blocking thread, or before the runtime matters.
    pub(crate) fn load(settings: &HubSettings) -> Result<Self, HubError> {
        let path = &settings.token_file;
        let text = crate::small_file::read_string(path, crate::small_file::TOKEN_MAX).map_err(
            |source| HubError::TokenRead {
                path: path.clone(),
                source,
            },
        )?;
        let token = text.trim();
        if token.is_empty() {
            return Err(HubError::TokenEmpty { path: path.clone() });
        }
        let auth =
            hub_client::bearer(token).map_err(|_| HubError::TokenInvalid { path: path.clone() })?;
        let client = hub_client::build(settings.ca_file.as_deref(), CONNECT_TIMEOUT)
            .map_err(HubError::Client)?;
        Ok(Self {
            settings: settings.clone(),
            client,
            auth,
            current: 0,
        })
    }

    fn url(&self, wait: Duration) -> String {
        format!(
            "{}/v1/agents/{}/reconcile?wait={}",
            self.base(),
            self.settings.agent_id,
            wait.as_secs()
        )
    }

    /// One reconcile: the report out, the desired state back; the hub may hold it for
    /// `wait` when nothing is new.
    async fn reconcile(
        &self,
        report: &AgentReport,
        wait: Duration,
    ) -> Result<DesiredState, HubError> {
        let url = self.url(wait);
        let body = serde_json::to_vec(report).map_err(|source| HubError::Encode {
            url: url.clone(),
            source,
        })?;
        let resp = self
            .client
            .post(&url)
            .header(AUTHORIZATION, self.auth.clone())
            .header(CONTENT_TYPE, "application/json")
            .timeout(REQUEST_TIMEOUT)
            .body(body)
            .send()
            .await
            .map_err(|e| request_error(&url, e))?;
        let status = resp.status();
        let bytes = hub_client::read_capped(resp, MAX_ANSWER)
            .await
            .map_err(|e| match e {
                HubClientError::Body { source, .. } if source.is_timeout() => HubError::Timeout {
                    url: url.clone(),
                    after: REQUEST_TIMEOUT,
                },
                other => HubError::Client(other),
            })?;
        if status == reqwest::StatusCode::OK {
            return self.desired(url, &bytes);
        }
        let message = self.error_text(&bytes);
        let code = status.as_u16();
        if status == reqwest::StatusCode::BAD_REQUEST && message.contains("observed_generation") {
            return Err(HubError::GenerationRefused { url, message });
        }
        if matches!(
            status,
            reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN
        ) {
            return Err(HubError::Refused {
                url,
                status: code,
                message,
            });
        }
        Err(HubError::Status {
            url,
            status: code,
            message,
        })
    }

    /// The desired state in a 200 answer, if it is one this agent takes.
    fn desired(&self, url: String, body: &[u8]) -> Result<DesiredState, HubError> {
        let mut desired: DesiredState =
            serde_json::from_slice(body).map_err(|e| HubError::Decode {
                why: self.hub_text(&e.to_string()),
                url: url.clone(),
            })?;
        if let Some(agent) = &mut desired.agent {
            // Before the check: a token is made of characters a version may hold, and the
            // version is logged, kept and shown.
            agent.version = self.redact(&agent.version);
        }
        desired
            .check()
            .map_err(|source| HubError::Invalid { url, source })?;
        Ok(desired)
    }

    /// The hub's `{"error": …}` message (or the start of whatever it sent instead), as
    /// `": message"`, through [`Self::hub_text`].
    fn error_text(&self, body: &[u8]) -> String {
        let text = match serde_json::from_slice::<ErrorBody>(body) {
            Ok(e) => e.error,
            Err(_) => String::from_utf8_lossy(body).into_owned(),
        };
        let text = self.hub_text(&text);
        let text = text.trim();
        if text.is_empty() {
            String::new()
        } else {
            format!(": {text}")
        }
    }

    /// Text from a hub's answer, fit for a log line and the status file: on one line,
    /// without the token, cut short. The token goes before the cut, so that the cut
    /// cannot leave a part of it; a tail that begins the token (the hub cut its own
    /// echo) goes too.
    fn hub_text(&self, text: &str) -> String {
        let text: String = text
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let mut text: String = self.redact(&text).chars().take(MAX_ERROR_TEXT).collect();
        if let Some(token) = self.token() {
            let partial = (MIN_PARTIAL.min(token.len())..token.len())
                .rev()
                .filter_map(|n| token.get(..n))
                .find(|start| text.ends_with(start));
            if let Some(start) = partial {
                text.truncate(text.len() - start.len());
                text.push_str(REDACTED);
            }
        }
        text
    }

    /// `text` with the token (`Bearer <token>` too) replaced.
    fn redact(&self, text: &str) -> String {
        match self.token() {
            Some(token) => text.replace(token, REDACTED),
            None => text.to_owned(),
        }
    }

    /// The token, read back from the header that holds it.
    fn token(&self) -> Option<&str> {
        std::str::from_utf8(self.auth.as_bytes())
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .filter(|t| !t.is_empty())
    }
}

fn request_error(url: &str, e: reqwest::Error) -> HubError {
    if e.is_timeout() {
        let after = if e.is_connect() {
            CONNECT_TIMEOUT
        } else {
            REQUEST_TIMEOUT
        };
        return HubError::Timeout {
            url: url.to_owned(),
            after,
        };
    }
    HubError::Request {
        url: url.to_owned(),
        // The message names the URL once already.
        source: e.without_url(),
    }
}

/// Checks that the hub settings can be used (the token file holds a token, the CA file
/// a certificate) without contacting the hub: `agent check-config`.
pub(crate) fn check(settings: &HubSettings) -> Result<(), HubError> {
    Connection::load(settings).map(drop)
}

/// The pause before the `failures`-th retry in a row: 1 s, 2 s, 4 s … up to 60 s, each
/// drawn from the upper half of its step by `random` (and never under 1 s), so that
/// agents that lost their hub together do not all come back in the same instant.
fn backoff_delay(failures: u32, random: u32) -> Duration {
    let step = BACKOFF_FIRST
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(BACKOFF_MAX);
    let full = u64::try_from(step.as_millis()).unwrap_or(u64::MAX);
    let half = full / 2;
    let extra = (full - half) * u64::from(random) / u64::from(u32::MAX);
    Duration::from_millis(half + extra).max(BACKOFF_FIRST)
}

/// Consecutive failures, and the pause before the next try.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
}

impl Backoff {
    fn next(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        // Without randomness the pauses are those of the upper bound: still capped.
        backoff_delay(self.failures, getrandom::u32().unwrap_or(u32::MAX))
    }

    fn reset(&mut self) {
        self.failures = 0;
    }
}

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

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

enum Msg {
    Reload(Box<HubSettings>),
    Shutdown,
}

/// The way to the hub task.
pub(super) struct HubHandle {
    tx: mpsc::UnboundedSender<Msg>,
    task: tokio::task::JoinHandle<()>,
}

impl HubHandle {
    /// Starts the reconcile loop. `state_dir` locates the runner's socket (for its job
    /// counts).
    pub(super) fn spawn(
        conn: Connection,
        state_dir: &Path,
        reconciler: ReconcilerHandle,
        reporter: ReporterHandle,
        upgrade: watch::Receiver<Option<UpgradeReport>>,
        reached: watch::Sender<Contact>,
        links: watch::Sender<Option<super::upload::HubLink>>,
    ) -> Self {
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
        let socket = crate::runner::Paths::new(state_dir).socket;
        let jobs = JobsHandle::spawn(reconciler.observed(), socket.clone(), conn.link());
        let jobs_moved = jobs.subscribe();
        let task = HubTask {
            rx,
            links,
            jobs,
            jobs_moved,
            conn,
            reconciler,
            observed,
            reporter,
            socket,
            runner: None,
            hostname: crate::sys::hostname().unwrap_or_default(),
            status,
            hub_failure: None,
            apply_failure: None,
            ever_connected: false,
            tried: 0,
            reset: false,
            backoff: Backoff::default(),
            published: None,
            upgrade,
            upgrade_open: true,
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
    pub(super) fn reload(&self, settings: HubSettings) {
        let _ = self.tx.send(Msg::Reload(Box::new(settings)));
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
    jobs: JobsHandle,
    jobs_moved: watch::Receiver<u64>,
    conn: Connection,
    reconciler: ReconcilerHandle,
    observed: watch::Receiver<Observed>,
    reporter: ReporterHandle,
    socket: PathBuf,
    /// The runner's API client, made at the first report that finds a runner running.
    runner: Option<crate::runner::client::Client>,
    hostname: String,
    /// What the status file says of the link; sent to the reporter on every change.
    status: HubStatus,
    /// The failure to reach the hub (or to get a desired state from it) being reported;
    /// `None` while it answers.
    hub_failure: Option<String>,
    /// The failure to apply the hub's desired state being reported.
    apply_failure: Option<String>,
    ever_connected: bool,
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
    /// How the link fares, for an upgrade's commit.
    reached: watch::Sender<Contact>,
}

/// What an upgrade's commit needs to know of the link to the hub.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Contact {
    /// Reconciles the hub answered since this process started (a commit needs one).
    pub(crate) answered: u64,
    /// The latest try did not get through for a reason that is no fault of this build:
    /// no connection, a timeout, or the hub answering 5xx or 429.
    pub(crate) away: bool,
}

/// The bucket that paces reconciles ([`BURST`], [`RATE`]).
struct Pace {
    tokens: f64,
    at: Instant,
}

impl Pace {
    fn new() -> Self {
        Self {
            tokens: BURST,
            at: Instant::now(),
        }
    }

    /// Takes a reconcile; `Some(instant)` to wait for first when the bucket is empty.
    fn take(&mut self) -> Option<Instant> {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * RATE).min(BURST);
        self.at = now;
        self.tokens -= 1.0;
        (self.tokens < 0.0).then(|| now + Duration::from_secs_f64(-self.tokens / RATE))
    }
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
            let started = Instant::now();
            let report = self.report().await;
            // The first answer at once: a new agent (an upgraded one, waiting to commit)
            // learns that its hub answers without waiting out a held poll.
            let wait = if self.ever_connected {
                WAIT
            } else {
                Duration::ZERO
            };
            let next = tokio::select! {
                // Cancel-safe: dropping a reconcile in flight closes its connection; the
                // next one carries a fresh report, and applying it again changes nothing.
                answer = self.conn.reconcile(&report, wait) => self.answered(answer, started, wait).await,
                // Cancel-safe: mpsc::recv loses no message when another arm wins.
                msg = self.rx.recv() => self.control(msg).await,
                // Cancel-safe: a watch receiver keeps its seen-version between polls. The
                // runner changed under a held poll: report it now, not in 30 s.
                () = runner_moved(&mut self.observed, &report) => Next::Again,
                // Cancel-safe, as above. A job changed: the hub hears of it now.
                r = self.jobs_moved.changed() => match r {
                    Ok(()) => Next::Again,
                    Err(_) => Next::Stop,
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
        self.jobs.shutdown().await;
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
        let settings = match msg {
            Some(Msg::Reload(settings)) => *settings,
            Some(Msg::Shutdown) | None => return Next::Stop,
        };
        let load = settings.clone();
        let loaded = tokio::task::spawn_blocking(move || Connection::load(&load))
            .await
            .unwrap_or_else(|source| {
                Err(HubError::Task {
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
                self.publish();
                Next::Again
            }
            Err(e) => {
                tracing::error!(error = %crate::error_chain(&e), "SIGHUP: the new hub settings cannot be used; keeping the ones in use");
                Next::Pause(Duration::ZERO)
            }
        }
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
            observed_generation: if self.reset {
                0
            } else {
                observed.desired.generation
            },
            runner: runner_report(&observed),
            upgrade: self.upgrade.borrow_and_update().clone(),
            jobs_summary,
            jobs,
        }
    }

    /// The runner's job counts, when it answers in time.
    async fn jobs(&mut self) -> Option<JobsSummary> {
        if self.runner.is_none() {
            // Reads the API token beside the socket: a small blocking read.
            let socket = self.socket.clone();
            let client =
                tokio::task::spawn_blocking(move || crate::runner::client::Client::new(&socket))
                    .await
                    .ok()?;
            self.runner = Some(client);
        }
        let client = self.runner.as_ref()?;
        match tokio::time::timeout(HEALTH_TIMEOUT, client.health()).await {
            Ok(Ok(health)) => Some(JobsSummary {
                running: health.jobs_running,
                queued: health.jobs_queued,
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
        answer: Result<DesiredState, HubError>,
        sent: Instant,
        wait: Duration,
    ) -> Next {
        let desired = match answer {
            Ok(d) => d,
            Err(e) => {
                self.hub_failed(&e);
                if matches!(e, HubError::GenerationRefused { .. }) && !self.reset {
                    // Retrying the same report would be refused for ever.
                    let applied = self.observed.borrow().desired.generation;
                    tracing::warn!(applied, "the hub refuses the generation this agent reports: reporting generation 0, and taking the hub's answer as a reset");
                    self.reset = true;
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
            let e = HubError::NotApplied {
                generation: desired.generation,
                why: format!(
                    "it is older than the applied generation {}",
                    applied.generation
                ),
            };
            self.apply_failed(&e);
            return Next::Pause(self.backoff.next());
        }
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
                let e = HubError::NotApplied {
                    generation: desired.generation,
                    why,
                };
                self.apply_failed(&e);
                return Next::Pause(self.backoff.next());
            }
        }
        // A reset was answered at once because generation 0 was reported, whatever the
        // hub does with polls: poll again at once, with the generation now applied.
        let was_reset = std::mem::replace(&mut self.reset, false);
        self.applied();
        // Something new is reported back at once, and a hub that held the poll is polled
        // again at once; one that answered "nothing new" without holding it (it does
        // not long-poll) is asked again after the interval it names.
        if news || was_reset || wait.is_zero() || sent.elapsed() >= HELD {
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
        let link = self.conn.link();
        self.links.send_replace(Some(link.clone()));
        self.jobs.set_link(link);
    }

    fn hub_failed(&mut self, e: &HubError) {
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
        self.status.last_contact = Some(unix_now());
        self.status.desired_version = desired.agent.as_ref().map(|a| a.version.clone());
        self.publish();
    }

    fn apply_failed(&mut self, e: &HubError) {
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

    #[test]
    fn the_backoff_doubles_from_one_second_up_to_a_minute_with_jitter() {
        // The upper bound of each step, then the lower half.
        let steps: Vec<u64> = (1..=9)
            .map(|n| backoff_delay(n, u32::MAX).as_secs())
            .collect();
        assert_eq!(steps, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        let lows: Vec<u64> = (1..=8)
            .map(|n| backoff_delay(n, 0).as_millis() as u64)
            .collect();
        assert_eq!(lows, [1000, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        // Between the bounds, and never past the cap however many failures.
        let mid = backoff_delay(5, u32::MAX / 2);
        assert!(
            mid > Duration::from_secs(8) && mid < Duration::from_secs(16),
            "{mid:?}"
        );
        assert_eq!(backoff_delay(u32::MAX, u32::MAX), BACKOFF_MAX);
        assert_eq!(backoff_delay(0, 0), BACKOFF_FIRST);
    }

    #[tokio::test(start_paused = true)]
    async fn reconciles_come_in_a_burst_then_fifty_a_second() {
        let mut pace = Pace::new();
        for _ in 0..50 {
            assert_eq!(pace.take(), None);
        }
        let t0 = Instant::now();
        let wait = pace.take().expect("the bucket is empty");
        assert_eq!(wait - t0, Duration::from_millis(20));
        tokio::time::advance(Duration::from_secs(10)).await;
        // Refilled to the burst, no further.
        for _ in 0..50 {
            assert_eq!(pace.take(), None);
        }
        assert!(pace.take().is_some());
    }

    #[test]
    fn a_success_starts_the_backoff_over() {
        let mut b = Backoff::default();
        let first = b.next();
        assert!(
            first >= BACKOFF_FIRST && first <= Duration::from_secs(1),
            "{first:?}"
        );
        for _ in 0..20 {
            assert!(b.next() <= BACKOFF_MAX);
        }
        assert!(b.next() >= BACKOFF_MAX / 2);
        b.reset();
        assert_eq!(b.next(), BACKOFF_FIRST);
    }

    #[tokio::test(start_paused = true)]
    async fn the_pauses_of_a_long_outage_add_up_as_promised() {
        // Ten minutes of failures: about one try a minute once the cap is reached, and
        // never a try within a second of the one before.
        let mut b = Backoff::default();
        let start = Instant::now();
        let mut tries = 0;
        while start.elapsed() < Duration::from_secs(600) {
            let pause = b.next();
            assert!(pause >= BACKOFF_FIRST);
            tokio::time::sleep(pause).await;
            tries += 1;
        }
        assert!((13..=26).contains(&tries), "{tries} tries in ten minutes");
    }

    fn settings(dir: &Path, token: &str) -> HubSettings {
        let path = dir.join("token");
        std::fs::write(&path, token).expect("token");
        HubSettings {
            urls: vec!["https://hub.example".into()],
            agent_id: "a1".into(),
            token_file: path,
            ca_file: None,
        }
    }

    #[test]
    fn the_token_is_read_trimmed_and_kept_only_as_a_sensitive_header() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = Connection::load(&settings(dir.path(), "s3cret-token\n")).expect("load");
        assert_eq!(conn.auth.to_str().expect("ascii"), "Bearer s3cret-token");
        assert!(conn.auth.is_sensitive());
        assert!(!format!("{:?}", conn.auth).contains("s3cret"));
        assert_eq!(
            conn.url(WAIT),
            "https://hub.example/v1/agents/a1/reconcile?wait=30"
        );
        // A hub that echoes the token gets it redacted.
        let text = conn.error_text(br#"{"error": "bad token s3cret-token\nsecond line"}"#);
        assert_eq!(text, ": bad token <redacted> second line");
        assert_eq!(conn.error_text(b""), "");

        let err = Connection::load(&settings(dir.path(), " \n"))
            .err()
            .expect("empty");
        assert!(matches!(err, HubError::TokenEmpty { .. }), "{err}");
        let err = Connection::load(&settings(dir.path(), "tok1\ntok2"))
            .err()
            .expect("two lines");
        assert!(matches!(err, HubError::TokenInvalid { .. }), "{err}");
        assert!(!err.to_string().contains("tok1"), "{err}");
    }

    #[test]
    fn the_token_is_redacted_before_a_hubs_text_is_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = format!("rga_{}", "ab".repeat(32));
        let conn = Connection::load(&settings(dir.path(), &token)).expect("load");
        // The token straddles the cut at MAX_ERROR_TEXT, 12 characters in.
        let pad = "x".repeat(MAX_ERROR_TEXT - 12 - "Bearer ".len());
        let body = serde_json::json!({"error": format!("{pad}Bearer {token} is unknown")});
        let text = conn.error_text(body.to_string().as_bytes());
        assert!(!text.contains("rga_"), "{text}");
        assert!(text.ends_with("xBearer <redacted> i"), "{text}");
        assert_eq!(text.chars().count(), ": ".len() + MAX_ERROR_TEXT);

        // A hub that cut its own echo: the tail that begins the token goes too.
        let body = serde_json::json!({"error": format!("no such token {}", &token[..20])});
        let text = conn.error_text(body.to_string().as_bytes());
        assert_eq!(text, ": no such token <redacted>");
        // A text that only happens to end like the token's first letters is kept.
        assert_eq!(conn.error_text(b"try rg"), ": try rg");
    }

    #[test]
    fn an_answer_echoing_the_token_is_refused_without_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = "tok-0123456789";
        let conn = Connection::load(&settings(dir.path(), token)).expect("load");
        let url = conn.url(WAIT);
        let answer = |body: String| {
            let e = conn
                .desired(url.clone(), body.as_bytes())
                .expect_err("refused");
            let text = crate::error_chain(&e);
            assert!(!text.contains(token), "{text}");
            text
        };
        let text = answer(format!(r#"{{"generation": "Bearer {token}"}}"#));
        assert!(text.contains("not a desired state: invalid type"), "{text}");
        // Long quotes are cut.
        let long = "y".repeat(1 << 16);
        assert!(answer(format!(r#"{{"generation": "{long}"}}"#)).len() < 1000);
        // A version of the allowed characters that is the token.
        let text = answer(format!(
            r#"{{"generation": 3, "agent": {{"version": "{token}"}}}}"#
        ));
        assert!(
            text.contains("the agent version it asks for is not a version"),
            "{text}"
        );
        let text = answer(r#"{"generation": 18446744073709551615}"#.to_owned());
        assert!(
            text.contains("generation 18446744073709551615 is beyond"),
            "{text}"
        );

        let ok = conn
            .desired(
                url,
                br#"{"generation": 9007199254740992, "agent": {"version": "1.2.0"}}"#,
            )
            .expect("at the bound");
        assert_eq!(ok.generation, desired::MAX_GENERATION);
    }

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
