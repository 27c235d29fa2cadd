//! One agent per state directory.
//!
//! The agent takes an exclusive flock on `<state>/agent.lock` before it touches anything
//! else in the state directory, and holds it for its whole life. A second `agent run` on
//! the same directory refuses at once, naming the first. Without this, the second agent
//! took the first one's live runner for an orphan and killed it with its jobs. With it, a
//! runner lock that is held while the agent lock is free can only belong to a runner
//! orphaned by a killed agent, which is the one case the stale-holder reclaim is for.
//!
//! The status file is written by the lock holder only, and `agent status` believes a
//! status file only while the pid it names holds this lock.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::AgentError;
use crate::supervisor::lock::{self, LockError, PidLock};

/// The agent's instance lock, inside the state directory.
pub const AGENT_LOCK: &str = "agent.lock";

/// Proof that this process is the one agent of its state directory. Dropping it (or the
/// process dying) releases the directory.
#[derive(Debug)]
pub struct Instance {
    _lock: PidLock,
}

pub fn lock_path(state_dir: &Path) -> PathBuf {
    state_dir.join(AGENT_LOCK)
}

/// Creates the state directory if needed (0700; `prepare` later sets its final mode) and
/// takes the instance lock. Directories missing above it are made 0711 when `traversable`
/// (the runner is another account and must pass through them), else 0700. Blocking, but
/// only for a few mkdirs, an open and a flock: called once, before the runtime does
/// anything else.
pub fn acquire(state_dir: &Path, traversable: bool) -> Result<Instance, AgentError> {
    let dir_err = |path: &Path| {
        let path = path.to_owned();
        move |source| AgentError::Dir { path, source }
    };
    let mut missing: Vec<&Path> = state_dir.ancestors().take_while(|p| !p.exists()).collect();
    missing.reverse();
    for dir in missing {
        match fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(dir_err(dir)(e)),
        }
        if traversable && dir != state_dir {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o711)).map_err(dir_err(dir))?;
        }
    }
    // Another account's state dir (a root quick start, then an ordinary user): say whose,
    // instead of failing on its lock with "Permission denied".
    let (ours, _) = crate::sys::current_ids();
    if let Ok(meta) = fs::symlink_metadata(state_dir) {
        use std::os::unix::fs::MetadataExt;
        if ours != 0 && meta.uid() != ours {
            return Err(AgentError::StateDirOwner {
                path: state_dir.to_owned(),
                owner: crate::supervisor::account::Account::by_uid(meta.uid())
                    .map_or_else(|| format!("uid {}", meta.uid()), |a| a.name),
                uid: meta.uid(),
                ours,
            });
        }
    }
    // A level someone else made between the caller's check and these mkdirs is theirs.
    super::dirs::check_trusted_parents(state_dir)?;
    match lock::acquire(&lock_path(state_dir)) {
        Ok(lock) => Ok(Instance { _lock: lock }),
        Err(LockError::Held { pid, .. }) => Err(AgentError::AlreadyRunning {
            holder: format!("pid {pid}"),
            state_dir: state_dir.to_owned(),
        }),
        Err(LockError::HeldUnknown { .. }) => Err(AgentError::AlreadyRunning {
            holder: "just starting, pid not written yet".into(),
            state_dir: state_dir.to_owned(),
        }),
        Err(e) => Err(AgentError::InstanceLock(e)),
    }
}

/// Who holds the instance lock of `state_dir`, as the kernel tells it: `Some(pids)`
/// (empty when nobody does) on Linux, `None` where the OS does not say. The lock file is
/// never opened, so asking can never get in the way of an agent taking it.
pub fn holders(state_dir: &Path) -> Option<Vec<i32>> {
    match crate::sys::locks::flock_holders_at(&lock_path(state_dir)) {
        Ok(found) => found,
        // No lock file: no agent ever ran here with this build, so none holds it.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Some(Vec::new()),
        Err(_) => None,
    }
}
