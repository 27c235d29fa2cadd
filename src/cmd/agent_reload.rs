//! `railgrid agent reload`: SIGHUP to the running agent, then its word, through the status
//! file, that the new configuration is applied or refused. The unit's `ExecReload`, so
//! that `systemctl reload` returns when the reload is over and fails when it was refused.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::agent::{state_dir_of, NOT_RUNNING};
use crate::agent::status::{self, AgentStatus, ReadError};
use crate::cli::AgentReloadArgs;
use crate::sys::group::{signal_process, Sig};
use crate::sys::ProcessId;

/// How often the status file is read while waiting.
pub(super) const POLL: Duration = Duration::from_millis(50);

/// The running agent's status, or `None` (said on stderr) when no agent runs on
/// `state_dir`.
pub(super) fn running_agent(state_dir: &std::path::Path) -> anyhow::Result<Option<AgentStatus>> {
    let st = match status::read(state_dir) {
        Ok(st) => st,
        Err(ReadError::Missing { path }) => {
            eprintln!(
                "railgrid: agent not running (no status file at {})",
                path.display()
            );
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    if !status::agent_alive(state_dir, &st) {
        eprintln!("railgrid: agent not running (last seen as pid {})", st.pid);
        return Ok(None);
    }
    Ok(Some(st))
}

pub(super) fn reload(args: AgentReloadArgs) -> anyhow::Result<ExitCode> {
    let state_dir = state_dir_of(args.target.config, args.target.state_dir)?;
    let Some(st) = running_agent(&state_dir)? else {
        return Ok(ExitCode::from(NOT_RUNNING));
    };
    if let Some(main) = args.pid.filter(|&p| p != st.pid) {
        bail!(
            "the service's main process is pid {main}, but {} names pid {} as the agent: not signalling either",
            status::path(&state_dir).display(),
            st.pid
        );
    }
    let pid = ProcessId::from_u32(st.pid)
        .with_context(|| format!("{} names no valid pid", status::path(&state_dir).display()))?;
    let before = st.reloads.as_ref().map(|r| r.count);
    if !signal_process(pid, Sig::SIGHUP)
        .with_context(|| format!("could not send SIGHUP to the agent (pid {pid})"))?
    {
        eprintln!("railgrid: agent not running (pid {pid} is gone)");
        return Ok(ExitCode::from(NOT_RUNNING));
    }
    let Some(before) = before else {
        eprintln!(
            "railgrid: sent SIGHUP to the agent (pid {pid}); its version ({}) does not report the end of a reload: see its log",
            st.version
        );
        return Ok(ExitCode::SUCCESS);
    };
    let deadline = Instant::now() + args.timeout;
    loop {
        std::thread::sleep(POLL);
        // A file being replaced is read whole or not at all; a failed read is tried again.
        let now = status::read(&state_dir).ok();
        if let Some(reloads) = now
            .as_ref()
            .filter(|n| n.pid == st.pid)
            .and_then(|n| n.reloads.as_ref())
            .filter(|r| r.count > before)
        {
            return Ok(match &reloads.last_error {
                None => {
                    eprintln!("railgrid: the agent (pid {pid}) applied its configuration");
                    ExitCode::SUCCESS
                }
                Some(why) => {
                    eprintln!("railgrid: the agent (pid {pid}) refused the new configuration and keeps the running one: {why}");
                    ExitCode::FAILURE
                }
            });
        }
        // The same process re-executed (an upgrade's switch): the new agent read the
        // configuration when it started, after this command began.
        if let Some(n) = now.as_ref().filter(|n| n.pid == st.pid).filter(|n| {
            n.started_at > st.started_at || n.reloads.as_ref().is_some_and(|r| r.count < before)
        }) {
            eprintln!(
                "railgrid: the agent (pid {pid}) started again as version {} and read its configuration then",
                n.version
            );
            return Ok(ExitCode::SUCCESS);
        }
        let gone = now
            .as_ref()
            .is_some_and(|n| n.pid != st.pid || !status::agent_alive(&state_dir, n));
        if gone {
            bail!("the agent (pid {pid}) ended before it finished the reload");
        }
        if Instant::now() >= deadline {
            bail!(
                "the agent (pid {pid}) did not finish the reload within {}: a runner restart for new settings takes its stop grace; see {}",
                humantime::format_duration(args.timeout),
                status::path(&state_dir).display()
            );
        }
    }
}
