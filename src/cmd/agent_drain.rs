//! `railgrid agent drain | resume`: the host's own drain (docs/design.md, "Drain"), for an
//! operator on the host before a reboot or maintenance. The drain is a file in the state
//! directory (so it holds across agent restarts, and for an agent not running yet); the
//! agent reads it on SIGHUP and says through its status file when it holds it and how
//! many jobs are left, which `--wait` follows.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::agent::{state_dir_of, NOT_RUNNING};
use super::agent_reload::{running_agent, POLL};
use crate::agent::drain::kept::{self, HOST_DRAIN_FILE, HOST_REASON};
use crate::agent::status::{self, AgentStatus};
use crate::cli::{AgentDrainArgs, AgentResumeArgs};
use crate::proto::drain::{Drain, DrainReport};
use crate::sys::group::{signal_process, Sig};
use crate::sys::ProcessId;

/// How long the agent has to take a changed drain (a SIGHUP also reads the configuration
/// again, which may restart the runner for new settings: its stop grace).
const TAKE_TIMEOUT: Duration = Duration::from_secs(90);

pub(super) fn drain(args: AgentDrainArgs) -> anyhow::Result<ExitCode> {
    let state_dir = state_dir_of(args.target.config, args.target.state_dir)?;
    let now = crate::util::unix_now_ms();
    let kept = kept::read(&state_dir, HOST_DRAIN_FILE);
    let drain = Drain {
        reason: HOST_REASON.into(),
        since_ms: kept.as_ref().map_or(now, |d| d.since_ms),
        deadline_ms: match args.deadline {
            Some(d) => Some(now.saturating_add(d.as_millis() as u64)),
            None => kept.and_then(|d| d.deadline_ms),
        },
    };
    kept::write(&state_dir, HOST_DRAIN_FILE, &drain)?;
    let Some(st) = running_agent(&state_dir)? else {
        eprintln!(
            "railgrid: the drain is kept in {}: the agent holds it from its next start",
            state_dir.join(HOST_DRAIN_FILE).display()
        );
        return Ok(ExitCode::from(NOT_RUNNING));
    };
    let held = |d: &DrainReport| {
        d.host
            && match drain.deadline_ms {
                Some(ours) => d.deadline_ms.is_some_and(|theirs| theirs <= ours),
                None => true,
            }
    };
    let Some(st) = tell(&state_dir, &st, |st| st.drain.as_ref().is_some_and(held))? else {
        return Ok(ExitCode::from(NOT_RUNNING));
    };
    if let Some(d) = &st.drain {
        eprintln!(
            "railgrid: this host is {}: new jobs are refused, running ones finish",
            d.summary(crate::util::unix_now_ms())
        );
    }
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    wait_idle(&state_dir, st)
}

pub(super) fn resume(args: AgentResumeArgs) -> anyhow::Result<ExitCode> {
    let state_dir = state_dir_of(args.target.config, args.target.state_dir)?;
    if !kept::remove(&state_dir, HOST_DRAIN_FILE)? {
        eprintln!("railgrid: this host was not drained on the host (no `agent drain` in force)");
    }
    let Some(st) = running_agent(&state_dir)? else {
        eprintln!("railgrid: the host's drain is gone: the agent takes jobs from its next start");
        return Ok(ExitCode::SUCCESS);
    };
    let Some(st) = tell(&state_dir, &st, |st| {
        !st.drain.as_ref().is_some_and(|d| d.host)
    })?
    else {
        return Ok(ExitCode::from(NOT_RUNNING));
    };
    match &st.drain {
        None => eprintln!("railgrid: the host takes jobs again"),
        Some(d) => eprintln!(
            "railgrid: the host's own drain ended, but it is still draining: {} (a drain of the hub ends with `railgrid hub agent resume`)",
            d.reason
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// SIGHUP to the agent, then its status once `done` holds of it; `None` (said) when the
/// agent is gone.
fn tell(
    state_dir: &std::path::Path,
    st: &AgentStatus,
    done: impl Fn(&AgentStatus) -> bool,
) -> anyhow::Result<Option<AgentStatus>> {
    let pid = ProcessId::from_u32(st.pid)
        .with_context(|| format!("{} names no valid pid", status::path(state_dir).display()))?;
    if !signal_process(pid, Sig::SIGHUP)
        .with_context(|| format!("could not send SIGHUP to the agent (pid {pid})"))?
    {
        eprintln!("railgrid: agent not running (pid {pid} is gone); the change is kept for its next start");
        return Ok(None);
    }
    let deadline = Instant::now() + TAKE_TIMEOUT;
    loop {
        // A file being replaced is read whole or not at all; a failed read is tried again.
        if let Ok(now) = status::read(state_dir) {
            if now.pid != st.pid || !status::agent_alive(state_dir, &now) {
                bail!("the agent (pid {pid}) ended before it took the change; it is kept for its next start");
            }
            if done(&now) {
                return Ok(Some(now));
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "the agent (pid {pid}) did not take the change within {} (is it an older version, without drains?); see {}",
                humantime::format_duration(TAKE_TIMEOUT),
                status::path(state_dir).display()
            );
        }
        std::thread::sleep(POLL);
    }
}

/// Follows the status file until no job is left: exit 0, or 1 when the deadline
/// cancelled what was left.
fn wait_idle(state_dir: &std::path::Path, mut st: AgentStatus) -> anyhow::Result<ExitCode> {
    let pid = st.pid;
    let mut shown = None;
    let mut left_at_deadline = None;
    loop {
        let Some(d) = st.drain.as_ref() else {
            eprintln!("railgrid: the drain was ended (agent resume, or the hub's) before the host was idle");
            return Ok(ExitCode::FAILURE);
        };
        let now = crate::util::unix_now_ms();
        if d.past_deadline(now) && left_at_deadline.is_none() {
            left_at_deadline = Some(d.jobs_left.or(shown.flatten()).unwrap_or(0));
        }
        if d.jobs_left == Some(0) {
            return Ok(match left_at_deadline.filter(|n| *n > 0) {
                None => {
                    eprintln!("railgrid: no job is left on this host");
                    ExitCode::SUCCESS
                }
                Some(n) => {
                    eprintln!(
                        "railgrid: the deadline passed with {n} job(s) left: they were cancelled (reason `drain deadline`; see `railgrid job list`)"
                    );
                    ExitCode::FAILURE
                }
            });
        }
        if shown != Some(d.jobs_left) {
            if let Some(n) = d.jobs_left {
                eprintln!("railgrid: waiting for {n} job(s)");
            }
            shown = Some(d.jobs_left);
        }
        std::thread::sleep(POLL * 4);
        // Read failures (a file being replaced) are tried again.
        while let Err(e) = status::read(state_dir).map(|n| st = n) {
            tracing::debug!(error = %e, "status file not readable yet");
            std::thread::sleep(POLL);
        }
        if st.pid != pid || !status::agent_alive(state_dir, &st) {
            bail!("the agent (pid {pid}) ended while the host drained; the drain is kept for its next start");
        }
    }
}
