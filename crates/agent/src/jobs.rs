//! Jobs through the hub, on the agent's side.
//!
//! Task: [`JobsTask`], one per agent with a hub; the agent's main loop holds its
//! [`JobsHandle`], the hub task a [`JobsLink`].
//! - In: the jobs the hub offers, handed over by the hub task from every answer it takes
//!   ([`JobsLink::offer`]): its `jobs` and `cancel_jobs`. They never pass through the
//!   reconciler: runner settings it refuses hold no job back, and no job spec is written
//!   to `desired.json` (the runner's database is a job's record once it has it; the hub
//!   offers again what it has not seen reported). Each listed job gets a follower; a job
//!   the hub no longer lists is done at the hub, and its follower goes. The link to the
//!   hub the hub task publishes (a SIGHUP's new token, another replica), for the uploads.
//! - Out, to the runner: each job that comes with its spec, submitted with the hub's id
//!   (idempotent: the runner answers 200 for a job it has, and starts nothing), in the
//!   hub's order; cancels.
//! - Out, to the hub: each job's output ([`upload`]), and its state as a [`JobReport`]
//!   that the hub task sends with its next reconcile (a change of one wakes it).
//!
//! A job runs at most once: the runner is the only place that starts it, it starts an id
//! once, and the hub sends a job's spec only until it has seen the job reported. So an
//! agent killed between taking a job and reporting it submits it again after its
//! restart and the runner, which has it, starts nothing.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch, Semaphore};

use super::runner_link::RunnerLink;
use super::upload::{upload_stream, Links};
use crate::proto::drain::DrainReport;
use crate::proto::fleet_job::{DesiredJob, JobReport};
use crate::proto::job::Stream;
use crate::proto::job::{JobRecord, JobSpec, JobState, Truncation};
use crate::proto::secret::Values;
use crate::runner::client::{Client, ClientError};

/// Jobs whose state and output are followed at once; the others wait their turn (each
/// followed job holds three requests to the runner).
const FOLLOWED: usize = 64;
/// How long one wait on the runner lasts before it is asked again.
const WAIT_SECS: u64 = 300;
/// Pauses between tries at the runner: doubling from the first to the longest.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(10);
/// The most of a job's error (and of a truncation reason) a report carries, in bytes:
/// the hub's thousand open jobs of an agent fit in the 1 MiB a report may be.
const MAX_ERROR: usize = 256;
const MAX_REASON: usize = 128;

/// What the hub offers this host: its jobs (a spec with those not yet seen reported) and
/// the ids of those to cancel, in the hub's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Offer {
    jobs: Vec<DesiredJob>,
    cancel: Vec<String>,
}

/// The latest report of each followed job (a change moves `moved`), and the hub's offer.
struct Reports {
    map: Mutex<HashMap<String, JobReport>>,
    moved: watch::Sender<u64>,
    offered: watch::Sender<Offer>,
}

impl Reports {
    fn set(&self, r: JobReport) {
        let changed = {
            let mut map = crate::util::lock(&self.map);
            if map.get(&r.id) == Some(&r) {
                false
            } else {
                map.insert(r.id.clone(), r);
                true
            }
        };
        if changed {
            self.moved.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn remove(&self, id: &str) {
        crate::util::lock(&self.map).remove(id);
    }
}

/// The way to the jobs task.
pub(super) struct JobsHandle {
    link: JobsLink,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

/// The hub task's side of the jobs task: the hub's offer in, the followed jobs' latest
/// reports out, to go with each reconcile.
#[derive(Clone)]
pub(super) struct JobsLink(Arc<Reports>);

impl JobsLink {
    /// Hands over what a hub's answer offers: `jobs`, and `cancel` of them.
    pub(super) fn offer(&self, jobs: Vec<DesiredJob>, cancel: Vec<String>) {
        let offer = Offer { jobs, cancel };
        self.0.offered.send_if_modified(|o| {
            let changed = *o != offer;
            if changed {
                *o = offer;
            }
            changed
        });
    }

    /// Every followed job's latest report, in no order.
    pub(super) fn reports(&self) -> Vec<JobReport> {
        crate::util::lock(&self.0.map).values().cloned().collect()
    }

    /// Moves whenever a report changes.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.moved.subscribe()
    }
}

impl JobsHandle {
    /// Starts the task.
    pub(super) fn spawn(
        runner: RunnerLink,
        link: Links,
        drain: watch::Receiver<Option<DrainReport>>,
    ) -> Self {
        let reports = Arc::new(Reports {
            map: Mutex::new(HashMap::new()),
            moved: watch::Sender::new(0),
            offered: watch::Sender::new(Offer::default()),
        });
        let (stop, stop_rx) = oneshot::channel();
        let task = JobsTask {
            offered: reports.offered.subscribe(),
            stop: stop_rx,
            runner,
            client: None,
            link,
            drain,
            reports: reports.clone(),
            followers: HashMap::new(),
            turn: None,
            slots: Arc::new(Semaphore::new(FOLLOWED)),
        };
        Self {
            link: JobsLink(reports),
            stop: Some(stop),
            task: tokio::spawn(task.run()),
        }
    }

    pub(super) fn link(&self) -> JobsLink {
        self.link.clone()
    }

    /// Ends every follower (the runner's jobs go on; a restarted agent follows them again
    /// from what the hub holds) and the task.
    pub(super) async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the jobs task failed");
        }
    }
}

struct Follower {
    cancel: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

struct JobsTask {
    offered: watch::Receiver<Offer>,
    stop: oneshot::Receiver<()>,
    runner: RunnerLink,
    /// The runner's API client, taken when the first job comes.
    client: Option<Arc<Client>>,
    link: Links,
    /// The drain in force on the host: a job the runner refuses for it waits for its end.
    drain: watch::Receiver<Option<DrainReport>>,
    reports: Arc<Reports>,
    followers: HashMap<String, Follower>,
    /// Says when the follower started last has submitted its job: the next one submits
    /// after it, so the runner queues the hub's jobs in the hub's order.
    turn: Option<oneshot::Receiver<()>>,
    slots: Arc<Semaphore>,
}

impl JobsTask {
    async fn run(mut self) {
        loop {
            self.converge().await;
            tokio::select! {
                // Cancel-safe: a watch receiver keeps its seen-version between polls.
                r = self.offered.changed() => if r.is_err() { break },
                // Cancel-safe: polled by reference, it resolves once.
                _ = &mut self.stop => break,
            }
        }
        for (_, f) in self.followers.drain() {
            f.task.abort();
        }
        tracing::debug!("jobs task stopped");
    }

    async fn converge(&mut self) {
        // Taken out at once: the hub task cannot offer while this is borrowed.
        let Offer {
            jobs,
            cancel: cancel_jobs,
        } = self.offered.borrow_and_update().clone();
        let runner = match &self.client {
            Some(r) => r.clone(),
            None if jobs.is_empty() => return,
            None => {
                let Ok(client) = self.runner.client().await else {
                    return;
                };
                self.client = Some(client.clone());
                client
            }
        };
        let listed: HashSet<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
        let cancel: HashSet<&str> = cancel_jobs.iter().map(String::as_str).collect();
        let reports = &self.reports;
        self.followers.retain(|id, f| {
            if listed.contains(id.as_str()) {
                return true;
            }
            // Done at the hub.
            f.task.abort();
            reports.remove(id);
            false
        });
        for j in &jobs {
            let cancelled = cancel.contains(j.id.as_str());
            if let Some(f) = self.followers.get(&j.id) {
                if cancelled {
                    f.cancel.send_replace(true);
                }
                continue;
            }
            let (cancel_tx, cancel_rx) = watch::channel(cancelled);
            let (submitted, next_turn) = oneshot::channel();
            let job = Job {
                id: j.id.clone(),
                spec: j.spec.clone(),
                secret_values: j.secret_values.clone(),
                cancel: cancel_rx,
                turn: self.turn.replace(next_turn),
                submitted: Some(submitted),
                runner: runner.clone(),
                link: self.link.clone(),
                drain: self.drain.clone(),
                reports: self.reports.clone(),
                failing: None,
            };
            let slots = self.slots.clone();
            let task = tokio::spawn(job.follow(slots));
            self.followers.insert(
                j.id.clone(),
                Follower {
                    cancel: cancel_tx,
                    task,
                },
            );
        }
    }
}

/// At most `max` bytes of `s`, cut on a character boundary.
fn cut(s: &str, max: usize) -> String {
    crate::util::prefix_bytes(s, max).to_owned()
}

fn report_of(rec: &JobRecord, output_done: bool) -> JobReport {
    JobReport {
        id: rec.id.clone(),
        state: rec.state,
        exit_code: rec.exit_code,
        signal: rec.signal,
        error: rec.error.as_deref().map(|e| cut(e, MAX_ERROR)),
        stdout_bytes: rec.stdout_bytes,
        stderr_bytes: rec.stderr_bytes,
        output_truncated: rec.output_truncated.as_ref().map(|t| Truncation {
            stdout: t.stdout.as_deref().map(|s| cut(s, MAX_REASON)),
            stderr: t.stderr.as_deref().map(|s| cut(s, MAX_REASON)),
        }),
        output_done,
        egress_denied: rec.egress_denied.clone(),
    }
}

/// A job that ended before the runner ran it (or without the runner knowing it).
fn ended_here(id: &str, state: JobState, error: String) -> JobReport {
    JobReport {
        id: id.to_owned(),
        state,
        exit_code: None,
        signal: None,
        error: Some(cut(&error, MAX_ERROR)),
        stdout_bytes: 0,
        stderr_bytes: 0,
        output_truncated: None,
        output_done: true,
        egress_denied: Vec::new(),
    }
}

/// One hub job, followed from its submission to its last byte at the hub.
struct Job {
    id: String,
    spec: Option<JobSpec>,
    /// The values of the secrets `spec` names, held only until the runner has the job.
    secret_values: Values,
    cancel: watch::Receiver<bool>,
    turn: Option<oneshot::Receiver<()>>,
    submitted: Option<oneshot::Sender<()>>,
    runner: Arc<Client>,
    link: Links,
    drain: watch::Receiver<Option<DrainReport>>,
    reports: Arc<Reports>,
    /// The failure being retried, logged once.
    failing: Option<String>,
}

impl Job {
    async fn follow(mut self, slots: Arc<Semaphore>) {
        if let Some(turn) = self.turn.take() {
            // An error: the follower before went (its job is done at the hub) without
            // saying so.
            let _ = turn.await;
        }
        let started = self.start().await;
        if let Some(tx) = self.submitted.take() {
            let _ = tx.send(());
        }
        let Some((rec, created)) = started else {
            return;
        };
        // A job the runner has just created has no output at the hub yet.
        let known = created.then_some(0);
        self.reports.set(report_of(&rec, false));
        // A cancel does not wait for a slot: it goes to the runner at once.
        let mut cancel_sent = false;
        let _slot = loop {
            tokio::select! {
                p = slots.clone().acquire_owned() => match p {
                    Ok(p) => break p,
                    Err(_) => return,
                },
                // Cancel-safe: `wait_for` only observes the channel.
                open = async { self.cancel.wait_for(|c| *c).await.is_ok() }, if !cancel_sent => {
                    if !open {
                        return;
                    }
                    cancel_sent = self.cancel_at_runner().await.is_some();
                    if !cancel_sent {
                        tokio::time::sleep(RETRY_FIRST).await;
                    }
                }
            }
        };
        let (runner, link, id) = (self.runner.clone(), self.link.clone(), self.id.clone());
        let stdout = upload_stream(&id, Stream::Stdout, &runner, &link, known);
        let stderr = upload_stream(&id, Stream::Stderr, &runner, &link, known);
        let ((), (), rec) = tokio::join!(stdout, stderr, self.track(rec, cancel_sent));
        let mut last = rec;
        last.output_done = true;
        self.reports.set(last);
    }

    fn failed(&mut self, what: &str, e: &ClientError) {
        let why = format!("{what}: {}", crate::error_chain(e));
        if self.failing.as_deref() != Some(why.as_str()) {
            tracing::warn!(job = %self.id, error = %why, "a hub job could not go on; retrying (logged again when the failure changes)");
            self.failing = Some(why);
        }
    }

    /// The job's record once the runner has it, and whether this submission created it:
    /// submitted if it comes with its spec, and not cancelled meanwhile. `None` when it
    /// ended without running, reported so.
    async fn start(&mut self) -> Option<(JobRecord, bool)> {
        let mut pause = crate::util::Doubling::new(RETRY_FIRST, RETRY_MAX);
        let mut created = false;
        loop {
            let cancelled = *self.cancel.borrow();
            if let (Some(spec), false) = (&self.spec, cancelled) {
                match self.runner.submit_with(spec, &self.secret_values.0).await {
                    Ok((new, sub)) => {
                        created |= new;
                        self.secret_values = Values::default();
                        if new {
                            tracing::info!(job = %self.id, state = sub.state.as_str(), "hub job submitted to the runner");
                        }
                    }
                    // Not taken while the host drains: it waits for the drain's end (or
                    // its cancel), and the hub shows it waiting for this agent.
                    Err(ClientError::Api {
                        status: 503, code, ..
                    }) if code == "draining" => {
                        self.wait_out_drain().await;
                        // Paced: the runner may still be told the drain's end.
                        tokio::time::sleep(pause.pause()).await;
                        continue;
                    }
                    // Refused for good: a bad spec, an id taken, one too large, or a
                    // network wider than the host's policy (403).
                    Err(ClientError::Api {
                        status: 400 | 403 | 409 | 413 | 422,
                        message,
                        ..
                    }) => {
                        tracing::warn!(job = %self.id, error = %message, "the runner refused the hub's job");
                        self.reports
                            .set(ended_here(&self.id, JobState::Rejected, message));
                        return None;
                    }
                    Err(e) => {
                        self.failed("submitting it to the runner", &e);
                        tokio::time::sleep(pause.pause()).await;
                        continue;
                    }
                }
            }
            match self.runner.get(&self.id).await {
                Ok(rec) => return Some((rec, created)),
                Err(ClientError::Api { status: 404, .. }) if cancelled => {
                    self.reports.set(ended_here(
                        &self.id,
                        JobState::Cancelled,
                        "cancelled at the hub before it started".into(),
                    ));
                    return None;
                }
                Err(ClientError::Api { status: 404, .. }) if self.spec.is_none() => {
                    self.reports.set(ended_here(
                        &self.id,
                        JobState::Lost,
                        format!("the runner has no record of job {} (its state dir was reset, or its retention deleted the job)", self.id),
                    ));
                    return None;
                }
                Err(e) => {
                    self.failed("reading it from the runner", &e);
                    tokio::time::sleep(pause.pause()).await;
                }
            }
        }
    }

    /// Waits until the host no longer drains, the job is cancelled, or the drain's watch
    /// is gone (the agent is stopping).
    async fn wait_out_drain(&mut self) {
        if self.failing.as_deref() != Some("draining") {
            tracing::info!(job = %self.id, "the host is draining: the hub's job waits for the drain's end");
            self.failing = Some("draining".into());
        }
        tokio::select! {
            // Cancel-safe: `wait_for` only observes the channel.
            _ = self.drain.wait_for(|d| d.is_none()) => {}
            _ = self.cancel.wait_for(|c| *c) => {}
        }
    }

    /// The runner's cancel (group, grace, kill); the record it answers, reported, or
    /// `None` when the runner could not be asked.
    async fn cancel_at_runner(&mut self) -> Option<JobRecord> {
        match self.runner.cancel(&self.id).await {
            Ok(r) => {
                tracing::info!(job = %self.id, "hub job cancelled");
                self.reports.set(report_of(&r, false));
                Some(r)
            }
            Err(e) => {
                self.failed("cancelling it", &e);
                None
            }
        }
    }

    /// Follows the job's state until its end is recorded, cancelling it when asked;
    /// every change is reported.
    async fn track(&mut self, mut rec: JobRecord, mut cancel_sent: bool) -> JobReport {
        let mut pause = crate::util::Doubling::new(RETRY_FIRST, RETRY_MAX);
        loop {
            if rec.state.is_terminal() && !rec.commit_pending {
                return report_of(&rec, false);
            }
            if *self.cancel.borrow() && !cancel_sent {
                match self.cancel_at_runner().await {
                    Some(r) => {
                        cancel_sent = true;
                        rec = r;
                        continue;
                    }
                    None => {
                        // Tried again soon, not after a long wait on the runner.
                        tokio::time::sleep(pause.pause()).await;
                        continue;
                    }
                }
            }
            let until = if matches!(rec.state, JobState::Queued | JobState::Starting) {
                "started"
            } else {
                "ended"
            };
            let runner = self.runner.clone();
            tokio::select! {
                r = runner.wait_for(&self.id, until, WAIT_SECS) => match r {
                    Ok(r) => {
                        pause.reset();
                        rec = r;
                        self.reports.set(report_of(&rec, false));
                    }
                    Err(ClientError::Api { status: 404, .. }) => {
                        return ended_here(&self.id, JobState::Lost, format!("the runner no longer has job {}", self.id));
                    }
                    Err(e) => {
                        self.failed("following it", &e);
                        tokio::time::sleep(pause.pause()).await;
                    }
                },
                // Cancel-safe: `changed` only observes; the wait is asked again after.
                r = self.cancel.changed(), if !cancel_sent => {
                    if r.is_err() {
                        // The task is going away with its follower.
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }
}
