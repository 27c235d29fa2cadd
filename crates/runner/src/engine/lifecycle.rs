//! One job from launch to its recorded end: the job task (`run_job`) records `starting`,
//! launches the job, waits for its exit, timeout or cancel, stops what is left of it through
//! its [`crate::proc_tree::Group`] (process group, and cgroup where there is one), collects
//! its last output and records the end; then it frees the job's slot and schedules the next.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::admission::Cancel;
use super::{blocking, Engine, EngineError};
use crate::confine::Tiers;
use crate::job;
use crate::proc_tree::{self, Reapable};
use crate::proto::job::{JobSpec, JobState};
use crate::store::{Outcome, Recorded};
use crate::supervisor;
use crate::sys::{self, ProcessId};

/// Most characters of a job's argv its "job running" log line shows.
const LOG_ARGV_CHARS: usize = 1024;

impl Engine {
    pub(super) async fn run_job(
        self,
        id: String,
        spec: Option<Arc<JobSpec>>,
        mut cancel: watch::Receiver<Option<Cancel>>,
        admitted_ms: i64,
    ) {
        let (state, outcome) = match self.execute(&id, spec, &mut cancel, admitted_ms).await {
            Ok(done) => done,
            Err(e) => (
                JobState::Failed,
                Outcome {
                    exit_code: match &e {
                        EngineError::Job(j) => j.shell_exit_code(),
                        _ => None,
                    },
                    error: Some(crate::error_chain(&e)),
                    ..Outcome::default()
                },
            ),
        };
        // Resolves after the first try: an end the disk could not take yet is held and
        // shown meanwhile, so the job leaves the scheduler either way.
        match self.inner.store.mark_finished(&id, state, &outcome).await {
            Ok(recorded) => self.when_recorded(&id, state.as_str(), recorded),
            Err(e) => {
                tracing::error!(job = %id, error = %crate::error_chain(&e), "could not record the job's end")
            }
        }
        tracing::info!(job = %id, state = state.as_str(), exit_code = ?outcome.exit_code, signal = ?outcome.signal, "job finished");
        let ran = (crate::util::unix_now_ms() as i64).saturating_sub(admitted_ms);
        crate::metrics::job_ended(state.as_str(), u64::try_from(ran).ok());
        {
            let mut s = self.sched();
            if let Some(run) = s.running.remove(&id) {
                if let Some(n) = s.per_owner.get_mut(&run.owner) {
                    *n = n.saturating_sub(1);
                }
            }
        }
        self.bump();
        self.schedule();
        // Measured once the end is recorded and the job's slot is free: a large workspace
        // delays nobody.
        self.count_finished(&id, outcome.spooled_bytes).await;
        if let Err(e) = self.retain().await {
            tracing::warn!(error = %crate::error_chain(&e), "retention failed");
        }
    }

    async fn execute(
        &self,
        id: &str,
        spec: Option<Arc<JobSpec>>,
        cancel: &mut watch::Receiver<Option<Cancel>>,
        admitted_ms: i64,
    ) -> Result<(JobState, Outcome), EngineError> {
        let (spec, mut started) = match self.launch(id, spec, cancel, admitted_ms).await? {
            Launched::Cancelled(state, outcome) => return Ok((state, outcome)),
            Launched::Running(spec, started) => (spec, started),
        };
        let pid = started.child.pid();
        let asked_grace = Duration::from_secs(spec.kill_grace_secs());
        let timeout = Some(Duration::from_secs(spec.timeout_secs()));
        let name = format!("job {id}");
        let ended_by = tokio::select! {
            // Cancel-safe: `Child::wait` may be dropped and called again.
            _ = started.child.wait() => None,
            // Cancel-safe: sleeping holds no state.
            _ = async { match timeout { Some(t) => tokio::time::sleep(t).await, None => std::future::pending().await } } => Some(JobState::TimedOut),
            // Cancel-safe: `changed` only observes the channel.
            _ = cancel.changed() => Some(JobState::Cancelled),
        };
        #[cfg(target_os = "linux")]
        let cgroup = started.cgroup.take();
        #[cfg(not(target_os = "linux"))]
        let cgroup: Option<()> = None;
        // Fitted when the stop begins: a stop that began before the runner's own is cut
        // short below when the runner's deadline passes.
        let (grace, grace_cut) = self.fit_grace(id, asked_grace);
        if let Some(g) = pid.and_then(|pgid| job_group(&name, pgid)) {
            #[cfg(target_os = "linux")]
            let g = match &cgroup {
                Some(cg) => g.with_cgroup(cg.clone()),
                None => g,
            };
            let stop = Stop {
                id,
                name: &name,
                pgid: pid.map_or(0, ProcessId::get),
                in_cgroup: cgroup.is_some(),
                grace,
                // A stop that began before the runner's own is cut short when the
                // runner's deadline passes: SIGKILL at once.
                hurry: Some(self.inner.stop_deadline.subscribe()),
            };
            stop.run(&g, ended_by, &mut started.child).await;
        }
        let status = started.child.wait().await.ok();
        #[cfg(target_os = "linux")]
        if let Some(cg) = &cgroup {
            if let Err(e) = cg.remove() {
                tracing::warn!(job = %id, cgroup = %cg.path().display(), error = %e, "could not remove the job's cgroup");
            }
        }
        last_output(id, &mut started).await;
        let error = match ended_by {
            Some(JobState::TimedOut) => Some(format!(
                "timed out after {}s",
                timeout.map(|t| t.as_secs()).unwrap_or(0)
            )),
            Some(JobState::Cancelled) => {
                let why = cancel.borrow().as_ref().and_then(|c| c.why.clone());
                Some(self.cancel_reason(why.as_deref(), asked_grace, grace, grace_cut))
            }
            _ => None,
        };
        let outcome = outcome_of(status, error, &started);
        let state = match ended_by {
            Some(s) => s,
            None if outcome.exit_code == Some(0) => JobState::Succeeded,
            None => JobState::Failed,
        };
        Ok((state, outcome))
    }

    /// Records `starting`, makes the workspace and launches the job, unless a cancel came
    /// first; then records `running` (not awaited: the writer keeps the order).
    async fn launch(
        &self,
        id: &str,
        spec: Option<Arc<JobSpec>>,
        cancel: &mut watch::Receiver<Option<Cancel>>,
        admitted_ms: i64,
    ) -> Result<Launched, EngineError> {
        // Its secrets' values, held since admission, taken at once: whichever way the
        // launch ends, none stays in memory. A runner that restarted since has none.
        let secrets = crate::util::lock(&self.inner.secrets)
            .remove(id)
            .unwrap_or_default();
        // Committed before the job is launched: a runner killed after the launch leaves a
        // `starting` record for the next one to reconcile, never a `queued` one it would
        // run a second time.
        let starting = self.inner.store.mark_starting(id, admitted_ms);
        let spec = match spec {
            Some(spec) => spec,
            None => {
                let store = self.inner.store.clone();
                let sid = id.to_owned();
                let rec = blocking(move || store.get(&sid))
                    .await??
                    .ok_or_else(|| EngineError::NotFound { id: id.to_owned() })?;
                Arc::new(rec.spec)
            }
        };
        if let Some(uses) = super::retention::foreign_workspace(&spec) {
            if let Some(run) = self.sched().running.get_mut(id) {
                run.uses = Some(uses);
            }
        }
        // The workspace is made while the writer commits: two mkdirs, too short to be
        // worth a trip to the blocking pool.
        let workspace = job::prepare_workspace(&self.inner.paths, id, spec.cwd.as_deref(), false)
            .map_err(EngineError::Job);
        // A start the disk could not take yet is waited for (or cancelled): launching before
        // it is committed could run the job twice after a restart.
        if let Recorded::Held(later) = starting.await? {
            tracing::warn!(job = %id, "could not record the job's start yet (is the disk full?): it starts once it is");
            self.bump();
            tokio::select! {
                // Cancel-safe: a dropped `Pending` leaves the change held in the writer.
                r = later => r?,
                // Cancel-safe: `changed` only observes the channel.
                _ = cancel.changed() => {}
            }
        }
        let workspace = workspace?;
        self.bump();
        let activity = self.inner.activity.clone();
        let notify: Arc<dyn Fn() + Send + Sync> =
            Arc::new(move || activity.send_modify(|n| *n = n.wrapping_add(1)));
        // A cancel that arrived while the job was starting wins before any of its code runs.
        if let Some(c) = cancel.borrow().clone() {
            let outcome = Outcome {
                error: Some(match c.why {
                    Some(why) => format!("cancelled before it started: {why}"),
                    None => "cancelled before it started".into(),
                }),
                ..Outcome::default()
            };
            return Ok(Launched::Cancelled(JobState::Cancelled, outcome));
        }
        if crate::proto::secret::names(&spec).next().is_some() && secrets.is_empty() {
            let names: Vec<&str> = crate::proto::secret::names(&spec)
                .map(String::as_str)
                .collect();
            return Err(EngineError::SecretsLost {
                names: names.join(", "),
            });
        }
        let started = job::start(
            &self.inner.paths,
            job::Job {
                id,
                spec: &spec,
                secrets: &secrets,
            },
            &workspace,
            job::Baseline {
                output_cap: self.inner.cfg.max_output_bytes,
                path: self
                    .inner
                    .cfg
                    .job_path
                    .as_deref()
                    .unwrap_or(crate::supervisor::DEFAULT_PATH),
                launch: self.inner.launch,
            },
            Tiers {
                cgroups: self.inner.cgroups.as_ref(),
                fs: self.inner.fs_guard.as_ref(),
                sandbox: Some(&self.inner.sandbox),
            },
            notify,
        )
        .map_err(EngineError::Job)?;
        let pid = started.child.pid();
        let start_time = pid.and_then(sys::process_start_time);
        {
            let mut s = self.sched();
            if let Some(run) = s.running.get_mut(id) {
                run.stdout = Some(started.stdout.clone());
                run.stderr = Some(started.stderr.clone());
                run.denials = started.egress.as_ref().map(|e| e.denials.clone());
            }
        }
        // Not awaited: the job runs either way, and the writer applies writes in order, so
        // the job's end is recorded after this. A failure is logged by the writer.
        let recorded =
            self.inner
                .store
                .mark_running(id, started.pid, start_time, &started.confinement);
        // Waiters that read the store (`wait?until=started`) are woken again once it has
        // the start: a silent job makes no other activity to wake them.
        let activity = self.inner.activity.clone();
        tokio::spawn(async move {
            let _ = recorded.await;
            activity.send_modify(|n| *n = n.wrapping_add(1));
        });
        self.bump();
        // Cut: an argv may hold a megabyte, a log line should not.
        let argv = format!("{:?}", spec.argv);
        let argv = crate::util::clip_to(&argv, LOG_ARGV_CHARS);
        tracing::info!(job = %id, pid = started.pid, %argv, "job running");

        Ok(Launched::Running(spec, started))
    }

    /// Why a cancelled job ended, as its record says it: the cancel's own reason (a
    /// drain's deadline) first, then the runner's stop, and a kill grace the stop cut.
    fn cancel_reason(
        &self,
        why: Option<&str>,
        asked: Duration,
        grace: Duration,
        cut: bool,
    ) -> String {
        let shutting_down = self.inner.shutting_down.load(Ordering::Relaxed);
        let mut reason = match (why, shutting_down) {
            (Some(why), _) => format!("cancelled: {why}"),
            (None, true) => "cancelled: the runner is shutting down".into(),
            (None, false) => "cancelled".into(),
        };
        if shutting_down && cut {
            reason.push_str(&format!(
                "; its kill grace was cut from {} to {} to fit the runner's stop budget",
                humantime::format_duration(asked),
                humantime::format_duration(Duration::from_millis(grace.as_millis() as u64))
            ));
        }
        reason
    }
}

/// What `launch` came to.
enum Launched {
    /// A cancel arrived while the job was starting: none of its code ran.
    Cancelled(JobState, Outcome),
    Running(Arc<JobSpec>, job::Started),
}

/// Ending what is left of one job: its leader (when it was stopped), or what the leader
/// left in its group or cgroup.
struct Stop<'a> {
    id: &'a str,
    name: &'a str,
    pgid: i32,
    in_cgroup: bool,
    grace: Duration,
    hurry: Option<proc_tree::StopDeadline>,
}

impl Stop<'_> {
    async fn run(
        self,
        g: &proc_tree::Group,
        ended_by: Option<JobState>,
        leader: &mut impl Reapable,
    ) {
        let Stop {
            id,
            name,
            pgid,
            in_cgroup,
            grace,
            hurry,
        } = self;
        let on_kill = |cut_short: bool| {
            if cut_short {
                tracing::warn!(job = %id, "the runner's stop budget is spent: SIGKILL");
            } else if in_cgroup {
                tracing::warn!(child = %name, "grace period over: cgroup.kill");
            } else {
                tracing::warn!(child = %name, pid = pgid, "grace period over: SIGKILL to the process group");
            }
        };
        let out = match ended_by {
            Some(_) => {
                if in_cgroup {
                    tracing::info!(child = %name, pid = pgid, grace = ?grace, "stopping: SIGTERM to the process group and the cgroup");
                } else {
                    tracing::info!(child = %name, pid = pgid, grace = ?grace, "stopping: SIGTERM to the process group");
                }
                g.stop_leader(leader, grace, hurry, on_kill).await
            }
            // The leader is gone; nothing it left in its group or cgroup outlives it.
            None if g.alive() => {
                if in_cgroup {
                    tracing::warn!(child = %name, "the job left processes in its cgroup: SIGTERM");
                } else {
                    tracing::warn!(child = %name, pgid, "the child left processes in its group: SIGTERM");
                }
                g.terminate(grace, hurry, on_kill).await
            }
            None => proc_tree::Outcome::default(),
        };
        if let (Some(status), false) = (out.leader, in_cgroup) {
            tracing::info!(child = %name, pid = pgid, "exited: {}", supervisor::describe(status));
        }
        if out.survivors {
            if in_cgroup {
                tracing::error!(child = %name, "the job's cgroup still has live processes after cgroup.kill");
            } else if ended_by.is_some() {
                tracing::error!(child = %name, pgid, "process group still has live members after SIGKILL");
            }
        }
    }
}

/// The group is gone, so all it wrote is in the pipes: the spoolers take that and end,
/// without waiting for a process that left the group and holds the pipes.
async fn last_output(id: &str, started: &mut job::Started) {
    started.stdout.drain();
    started.stderr.drain();
    let spoolers = std::mem::take(&mut started.spoolers);
    let joined = async {
        for h in spoolers {
            let _ = h.await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(5), joined)
        .await
        .is_err()
    {
        tracing::warn!(job = %id, "the job's last output could not be spooled in time (a stalled disk?)");
    }
}

/// The job's recorded end: its exit, `error`, and what its streams produced and kept.
fn outcome_of(
    status: Option<std::process::ExitStatus>,
    error: Option<String>,
    started: &job::Started,
) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    Outcome {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        error,
        stdout_bytes: started.stdout.produced.load(Ordering::Relaxed),
        stderr_bytes: started.stderr.produced.load(Ordering::Relaxed),
        spooled_bytes: started.stdout.written.load(Ordering::Relaxed)
            + started.stderr.written.load(Ordering::Relaxed),
        stdout_truncated: started.stdout.truncated.load(Ordering::Relaxed),
        stderr_truncated: started.stderr.truncated.load(Ordering::Relaxed),
        output_truncated: job::truncation(&started.stdout, &started.stderr),
        egress_denied: started
            .egress
            .as_ref()
            .map(|e| e.denials.snapshot())
            .unwrap_or_default(),
    }
}

/// The job's process group, or `None` (logged) when its id could never be signalled.
fn job_group(name: &str, pgid: ProcessId) -> Option<proc_tree::Group> {
    proc_tree::Group::new(name, pgid.get())
        .map_err(|e| tracing::error!(child = %name, error = %e, "not stopping the job"))
        .ok()
}
