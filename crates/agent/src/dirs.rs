//! The agent's directories: the log directory, the state directory and the runner's
//! `<state>/runner`, made with the modes and owners the runner account needs, and checked
//! before anything is created, so that a refused start leaves nothing behind.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::config::AgentConfig;
use super::AgentError;
use crate::supervisor::account::Account;
use crate::sys;

/// Creates the log dir (0700), the state dir (0700, or 0711 when the runner runs as
/// another account and must traverse it) and `<state>/runner` (0700, owned by the runner).
pub(super) fn prepare(cfg: &AgentConfig) -> Result<(), AgentError> {
    let other = cfg.runner.user.as_ref();
    make_dir(&cfg.log_dir, 0o700)?;
    make_dir(&cfg.state_dir, if other.is_some() { 0o711 } else { 0o700 })?;
    let runner_dir = cfg.runner_dir();
    make_dir(&runner_dir, 0o700)?;
    if let Some(acct) = other {
        check_runner_dir_owner(&runner_dir, acct)?;
        sys::chown(&runner_dir, acct.uid, acct.gid).map_err(|source| AgentError::Chown {
            path: runner_dir.clone(),
            uid: acct.uid,
            gid: acct.gid,
            source,
        })?;
        check_reachable(&runner_dir, acct)?;
    }
    Ok(())
}

/// Checks, before anything is created, what would make `prepare` refuse later: that the
/// runner account can pass through every directory that exists above the state directory
/// (the agent makes the rest). A refused start then leaves nothing behind.
pub fn preflight(cfg: &AgentConfig) -> Result<(), AgentError> {
    check_trusted_parents(&cfg.state_dir)?;
    let Some(acct) = cfg.runner.user.as_ref() else {
        return Ok(());
    };
    // The deepest path on the way whose parent exists: every directory above it does.
    let Some(first) = cfg
        .state_dir
        .ancestors()
        .find(|p| p.parent().is_some_and(Path::exists))
    else {
        return Ok(());
    };
    check_reachable(first, acct).map_err(|e| match e {
        AgentError::Unreachable {
            user,
            dir,
            mode,
            owner,
            ..
        } => AgentError::Unreachable {
            user,
            path: cfg.runner_dir(),
            dir,
            mode,
            owner,
        },
        other => other,
    })
}

/// Every existing directory above `state_dir` (and it, once it exists) must belong to root
/// or to this agent's account, and be writable by no one else unless it is sticky (as
/// `/tmp` is: there only an entry's owner may rename or delete it, and the next level is
/// checked in turn). Otherwise another account could swap the state directory, or a
/// directory on the way to it, for one of its own, and a root agent would then create,
/// chown and lock files where that account chose. Called before anything is created, and
/// again once the state directory exists, so a directory someone made in between is seen.
pub fn check_trusted_parents(state_dir: &Path) -> Result<(), AgentError> {
    let me = sys::current_ids().0;
    let mut dirs: Vec<&Path> = state_dir
        .ancestors()
        .filter(|p| !p.as_os_str().is_empty())
        .collect();
    dirs.reverse();
    for dir in dirs {
        let Ok(meta) = fs::metadata(dir) else {
            // Not there yet: made by the agent, which checks again afterwards.
            break;
        };
        let mode = meta.permissions().mode() & 0o7777;
        let owner = meta.uid();
        let why = if owner != 0 && owner != me {
            "another account owns it"
        } else if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            "others may write to it"
        } else {
            continue;
        };
        return Err(AgentError::UntrustedParent {
            path: state_dir.to_owned(),
            dir: dir.to_owned(),
            why,
            mode,
            owner,
        });
    }
    Ok(())
}

/// The runner's files (lock, socket, job records) belong to the account that ran it. A
/// directory that already holds another account's files is refused rather than re-owned:
/// chowning a tree another user controls is how root gets tricked through symlinks.
fn check_runner_dir_owner(dir: &Path, acct: &Account) -> Result<(), AgentError> {
    let err = |source| AgentError::Dir {
        path: dir.to_owned(),
        source,
    };
    let owner = fs::symlink_metadata(dir).map_err(err)?.uid();
    if owner == acct.uid {
        return Ok(());
    }
    let empty = fs::read_dir(dir).map_err(err)?.next().is_none();
    if empty {
        return Ok(());
    }
    Err(AgentError::RunnerDirOwner {
        path: dir.to_owned(),
        owner,
        user: acct.name.clone(),
        uid: acct.uid,
    })
}

fn make_dir(path: &Path, mode: u32) -> Result<(), AgentError> {
    let err = |source| AgentError::Dir {
        path: path.to_owned(),
        source,
    };
    fs::create_dir_all(path).map_err(err)?;
    let meta = fs::metadata(path).map_err(err)?;
    if meta.uid() == sys::current_ids().0 && meta.permissions().mode() & 0o777 != mode {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(err)?;
    }
    Ok(())
}

/// The runner account must be able to traverse every directory above its own.
fn check_reachable(path: &Path, acct: &Account) -> Result<(), AgentError> {
    let who = crate::supervisor::access::Who {
        uid: acct.uid,
        groups: sys::spawn::group_list(&acct.name, acct.gid).unwrap_or_else(|_| vec![acct.gid]),
    };
    who.can_reach(path, false)
        .map_err(|d| AgentError::Unreachable {
            user: acct.name.clone(),
            path: path.to_owned(),
            dir: d.at,
            mode: d.mode,
            owner: d.owner,
        })
}
