//! Signalling processes and process groups, and telling whether any of them still live.
//!
//! A zombie is not alive: it holds no resources but a table slot, and where the reaper
//! (init or a container's pid 1) is slow or absent it may stay a zombie for a long time.

use std::io;

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::getpgrp;

use super::ProcessId;

pub use nix::sys::signal::Signal as Sig;

/// Sends `sig` to every process in group `pgid`. Returns `Ok(false)` when the group no
/// longer exists. Refuses the caller's own group, so a confused pgid can never take the
/// supervisor down with its child. (`ProcessId` already rules out groups 0 and 1.)
pub fn signal_group(pgid: ProcessId, sig: Signal) -> io::Result<bool> {
    if pgid.as_nix() == getpgrp() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to signal process group {pgid}: it is our own group"),
        ));
    }
    match killpg(pgid.as_nix(), sig) {
        Ok(()) => Ok(true),
        Err(Errno::ESRCH) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Sends `sig` to one process. Returns `Ok(false)` when it no longer exists.
pub fn signal_process(pid: ProcessId, sig: Signal) -> io::Result<bool> {
    if pid == ProcessId::current() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to signal pid {pid}: it is this process"),
        ));
    }
    match kill(pid.as_nix(), sig) {
        Ok(()) => Ok(true),
        Err(Errno::ESRCH) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The id of the process group `pid` belongs to, or `None` when `pid` is gone.
pub fn group_of(pid: ProcessId) -> io::Result<Option<i32>> {
    match nix::unistd::getpgid(Some(pid.as_nix())) {
        Ok(pgid) => Ok(Some(pgid.as_raw())),
        Err(Errno::ESRCH) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The process group of the calling process.
pub fn own_group() -> i32 {
    getpgrp().as_raw()
}

/// True when some member of group `pgid` is alive (not a zombie).
pub fn group_alive(pgid: ProcessId) -> bool {
    match killpg(pgid.as_nix(), None) {
        Err(Errno::ESRCH) => false,
        // EPERM: members exist but belong to someone else; they are alive as far as we know.
        Err(_) => true,
        Ok(()) => live_members_exist(pgid),
    }
}

/// True when `pid` exists and is not a zombie.
pub fn process_alive(pid: ProcessId) -> bool {
    match kill(pid.as_nix(), None) {
        Err(Errno::ESRCH) => false,
        Err(_) => true,
        Ok(()) => not_zombie(pid),
    }
}

#[cfg(target_os = "linux")]
fn live_members_exist(pgid: ProcessId) -> bool {
    // killpg(0) also succeeds for zombies; /proc tells them apart. If /proc shows no
    // member at all (hidepid, another pid namespace), it cannot judge: alive.
    match super::procfs::processes() {
        Ok(all) => {
            let mut members = all
                .into_iter()
                .filter(|st| st.pgrp == pgid.get())
                .peekable();
            if members.peek().is_none() {
                return true;
            }
            members.any(|st| st.state != 'Z' && st.state != 'X')
        }
        Err(_) => true,
    }
}

#[cfg(not(target_os = "linux"))]
fn live_members_exist(_pgid: ProcessId) -> bool {
    true
}

#[cfg(target_os = "linux")]
fn not_zombie(pid: ProcessId) -> bool {
    match super::procfs::stat(pid) {
        Ok(Some(st)) => st.state != 'Z' && st.state != 'X',
        Ok(None) => false,
        Err(_) => true,
    }
}

#[cfg(not(target_os = "linux"))]
fn not_zombie(_pid: ProcessId) -> bool {
    true
}
