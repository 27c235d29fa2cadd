//! A job's leader process as the engine waits for it: launched through `sys::launch` on
//! Linux (waited for through its pidfd), or through std's fork/exec elsewhere.

use std::io;
use std::process::ExitStatus;

use crate::sys::ProcessId;

pub enum JobProcess {
    #[cfg(target_os = "linux")]
    Pidfd {
        pid: ProcessId,
        fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
        status: Option<ExitStatus>,
        /// A sandbox's PID 1 (which `pid` is): the job's own status comes from it.
        init: Option<crate::sys::sandbox::Init>,
    },
    Std(tokio::process::Child),
}

impl JobProcess {
    #[cfg(target_os = "linux")]
    /// A process that cannot be watched is not left running: its group is killed and it is
    /// reaped before the error returns.
    pub fn from_launched(
        l: crate::sys::launch::Launched,
        init: Option<crate::sys::sandbox::Init>,
    ) -> io::Result<Self> {
        match crate::sys::launch::watch_pidfd(l.pidfd) {
            Ok(fd) => Ok(JobProcess::Pidfd {
                pid: l.pid,
                fd,
                status: None,
                init,
            }),
            Err(e) => {
                let _ = crate::sys::group::signal_group(l.pid, crate::sys::group::Sig::SIGKILL);
                let _ = crate::sys::launch::reap(l.pid.get(), true);
                Err(e)
            }
        }
    }

    /// The egress proxy's listening socket, made in the job's network namespace (once).
    pub fn take_proxy(&mut self) -> Option<std::os::fd::OwnedFd> {
        match self {
            #[cfg(target_os = "linux")]
            JobProcess::Pidfd { init, .. } => init.as_mut()?.take_proxy(),
            JobProcess::Std(_) => None,
        }
    }

    pub fn pid(&self) -> Option<ProcessId> {
        match self {
            #[cfg(target_os = "linux")]
            JobProcess::Pidfd { pid, .. } => Some(*pid),
            JobProcess::Std(c) => c.id().and_then(ProcessId::from_u32),
        }
    }
}

impl crate::proc_tree::Reapable for JobProcess {
    /// Cancel-safe: the status is kept once reaped, and waiting again returns it.
    async fn wait(&mut self) -> io::Result<ExitStatus> {
        match self {
            #[cfg(target_os = "linux")]
            JobProcess::Pidfd {
                pid,
                fd,
                status,
                init,
            } => {
                use std::os::unix::process::ExitStatusExt;
                loop {
                    if let Some(s) = status {
                        return Ok(*s);
                    }
                    if let Some(raw) = crate::sys::launch::reap(pid.get(), false)? {
                        // A sandbox's PID 1 leaves the job's own status; killed before the
                        // job ended, its own says how.
                        let raw = init
                            .as_ref()
                            .and_then(crate::sys::sandbox::Init::job_status)
                            .unwrap_or(raw);
                        *status = Some(ExitStatus::from_raw(raw));
                        continue;
                    }
                    // The pidfd turns readable when the process exits.
                    let mut ready = fd.readable().await?;
                    ready.clear_ready();
                }
            }
            JobProcess::Std(c) => c.wait().await,
        }
    }
}

#[cfg(target_os = "linux")]
impl Drop for JobProcess {
    /// A job process dropped before it was reaped (an error path after the launch) is
    /// killed with its group and reaped off the runtime, never left running or a zombie.
    fn drop(&mut self) {
        if let JobProcess::Pidfd {
            pid, status: None, ..
        } = self
        {
            let pid = *pid;
            let _ = crate::sys::group::signal_group(pid, crate::sys::group::Sig::SIGKILL);
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn_blocking(move || crate::sys::launch::reap(pid.get(), true));
            } else {
                let _ = crate::sys::launch::reap(pid.get(), true);
            }
        }
    }
}
