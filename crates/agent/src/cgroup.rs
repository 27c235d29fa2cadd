//! Delegating a cgroup v2 subtree to the runner, so that its jobs get the cgroup tier.
//!
//! `U` is a cgroup the agent may manage: the one a service manager delegated to it (a
//! systemd unit with `Delegate=yes`), or, for a root agent that no service manager placed
//! anywhere (it runs in the hierarchy's root cgroup: started by hand, by an init script,
//! by runit or s6), one it makes for itself, `<hierarchy>/railgrid-agent.<hash>`, named
//! after its state directory so that a restarted agent finds it again. Such a subtree is
//! removed when the agent stops. Layout:
//!
//! ```text
//! U/agent            the agent (moved here: v2 keeps processes in leaves only)
//! U/runner           delegated to the runner account; its controllers enabled in U
//! U/runner/runner    where the runner starts (every start: U/runner may have
//!                    controllers enabled, so it can hold no process itself)
//! U/runner/job-<id>  made by the runner, one per job
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

use crate::proto::runner::RUNNER_LEAF;
use crate::supervisor::account::Account;
use crate::sys::cgroup::Cgroup;

const AGENT_LEAF: &str = "agent";
const RUNNER_TREE: &str = "runner";
/// The name of a subtree a root agent makes for itself (with the state dir's hash).
const OWN_PREFIX: &str = "railgrid-agent.";

/// How the runner's cgroup is asked for (`runner.delegate_cgroup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// `true`: the agent's cgroup is delegated to it (or it makes its own, as root, in the
    /// root cgroup); a failure is logged as such.
    Delegated,
    /// Unset: only where no service manager placed the agent and it is root (a cgroup
    /// that a service manager did not delegate is never written).
    Auto,
}

#[derive(Debug, Error)]
pub enum CgroupError {
    #[error("no cgroup v2 hierarchy is mounted")]
    NoHierarchy,
    #[error("the agent runs in the root cgroup and is not root, so it cannot make a cgroup of its own; run it as a service with a delegated cgroup (systemd: Delegate=yes)")]
    RootCgroup,
    #[error("the agent's cgroup {0} was not delegated to it (runner.delegate_cgroup = true says it was, as a systemd unit with Delegate=yes does)")]
    NotDelegated(PathBuf),
    #[error("could not {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Sets up the layout above and returns the cgroup the runner must start in.
pub fn delegate_to_runner(
    acct: &Account,
    ask: Ask,
    state_dir: &Path,
) -> Result<PathBuf, CgroupError> {
    let io = |what: &'static str, cg: &Cgroup| {
        let path = cg.path().to_owned();
        move |source| CgroupError::Io { what, path, source }
    };
    let own = Cgroup::own()
        .map_err(|source| CgroupError::Io {
            what: "read the cgroup of",
            path: PathBuf::from("/proc/self/cgroup"),
            source,
        })?
        .ok_or(CgroupError::NoHierarchy)?;
    // Already moved (a re-executed agent in the same unit, or one in the subtree it
    // made for itself): the unit is the parent.
    let unit = match own.parent() {
        Some(p)
            if own.path().file_name() == Some(std::ffi::OsStr::new(AGENT_LEAF))
                && (p.child(RUNNER_TREE).exists()
                    || p.path().file_name()
                        == Some(std::ffi::OsStr::new(&own_name(state_dir)))) =>
        {
            p
        }
        _ => own,
    };
    let unit = if unit.parent().is_none_or(|p| !p.exists()) {
        // No service manager placed this agent: as root, it makes a subtree of its own.
        if !crate::sys::is_root() {
            return Err(CgroupError::RootCgroup);
        }
        let own = unit.child(&own_name(state_dir));
        own.create().map_err(io("create", &own))?;
        // Made under the agent's 077 umask: the runner's account must reach its tree.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(own.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(io("open to the runner's account", &own))?;
        tracing::info!(cgroup = %own.path().display(), "no service manager placed the agent in a cgroup: made one of its own");
        own
    } else if ask == Ask::Auto
        && !unit
            .path()
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(OWN_PREFIX))
    {
        return Err(CgroupError::NotDelegated(unit.path().to_owned()));
    } else {
        unit
    };
    let agent = unit.child(AGENT_LEAF);
    agent.create().map_err(io("create", &agent))?;
    agent
        .move_self()
        .map_err(io("move the agent into", &agent))?;

    let tree = unit.child(RUNNER_TREE);
    tree.create().map_err(io("create", &tree))?;
    let available = unit.controllers().unwrap_or_default();
    for c in ["memory", "pids", "cpu"] {
        if available.iter().any(|a| a == c) {
            if let Err(e) = unit.enable(c) {
                tracing::warn!(cgroup = %unit.path().display(), controller = c, error = %e, "could not enable a controller for the runner's cgroup");
            }
        }
    }
    let leaf = tree.child(RUNNER_LEAF);
    leaf.create().map_err(io("create", &leaf))?;
    for cg in [&tree, &leaf] {
        for file in [
            "",
            "cgroup.procs",
            "cgroup.subtree_control",
            "cgroup.threads",
        ] {
            let path = cg.path().join(file);
            crate::sys::chown(&path, acct.uid, acct.gid).map_err(|source| CgroupError::Io {
                what: "give the runner account",
                path,
                source,
            })?;
        }
    }
    tracing::info!(cgroup = %tree.path().display(), user = %acct.name, "delegated a cgroup to the runner");
    Ok(leaf.path().to_owned())
}

/// `railgrid-agent.<16 hex digits of the SHA-256 of the state dir's path>`.
fn own_name(state_dir: &Path) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(state_dir.as_os_str().as_encoded_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{OWN_PREFIX}{hex}")
}

/// The hierarchy's root, when this process runs in a subtree of its own (`<root>/
/// railgrid-agent.*/agent`).
fn own_subtree_root() -> Option<(Cgroup, Cgroup)> {
    let own = Cgroup::own().ok()??;
    let unit = own.parent()?;
    let is_own = own.path().file_name() == Some(std::ffi::OsStr::new(AGENT_LEAF))
        && unit
            .path()
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(OWN_PREFIX));
    let top = unit.parent()?;
    is_own.then_some((top, unit))
}

/// Moves `pid` (the upgrade watcher, standalone) out of the agent's own subtree, to the
/// hierarchy's root where the agent found itself: the watcher must outlive the agent's
/// cgroup, which the agent removes when it stops, and an agent it brings back must not
/// start inside the old agent's leaf.
pub fn move_out_of_own(pid: u32) {
    if let Some((top, _)) = own_subtree_root() {
        if let Err(e) = top.write("cgroup.procs", &pid.to_string()) {
            tracing::warn!(pid, cgroup = %top.path().display(), error = %e, "could not move the upgrade watcher out of the agent's cgroup");
        }
    }
}

/// At the agent's stop (not a re-exec): a subtree it made for itself is left and removed
/// (the runner has stopped, so it is empty); a delegated one is the service manager's.
pub fn release_own(state_dir: &Path) {
    let Ok(Some(own)) = Cgroup::own() else {
        return;
    };
    let Some(unit) = own.parent() else {
        return;
    };
    let name = own_name(state_dir);
    if own.path().file_name() != Some(std::ffi::OsStr::new(AGENT_LEAF))
        || unit.path().file_name() != Some(std::ffi::OsStr::new(&name))
    {
        return;
    }
    let Some(top) = unit.parent() else {
        return;
    };
    if let Err(e) = top.move_self() {
        tracing::warn!(cgroup = %unit.path().display(), error = %e, "could not leave the agent's own cgroup; it is left in place");
        return;
    }
    let tree = unit.child(RUNNER_TREE);
    let mut dirs: Vec<Cgroup> = tree
        .children()
        .unwrap_or_default()
        .iter()
        .map(|c| tree.child(c))
        .collect();
    dirs.extend([tree, own, unit]);
    for cg in &dirs {
        if let Err(e) = cg.remove() {
            tracing::warn!(cgroup = %cg.path().display(), error = %e, "could not remove a cgroup of the agent's own");
            return;
        }
    }
}

/// How long the runner's tree may take to empty after `cgroup.kill`.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Kills everything left in the runner's cgroup tree (the runner's leaf and every job's
/// cgroup, whatever left its process group) with `cgroup.kill`, and waits for it to
/// empty. Membership is the kernel's, so this cannot hit a process outside the tree, and
/// no pid is read. Returns whether anything was there.
pub async fn kill_tree(tree: &Path) -> Result<bool, CgroupError> {
    let cg = Cgroup::at(tree);
    let io = |what: &'static str| {
        let path = tree.to_owned();
        move |source| CgroupError::Io { what, path, source }
    };
    match cg.populated() {
        Ok(false) => return Ok(false),
        Ok(true) => {}
        // The tree is gone: nothing can live in it.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io("read cgroup.events of")(e)),
    }
    // Without cgroup.kill (Linux before 5.14) there is no kill by membership, and signals
    // sent by root to pids read from a file are what this must never do: the runner's
    // own stop and `runner reap` (as the runner account) are all there is then.
    if !cg.can_kill() {
        tracing::warn!(cgroup = %tree.display(), "this kernel has no cgroup.kill: what the runner left in its cgroup is ended by the reap only");
        return Ok(false);
    }
    let group = crate::proc_tree::Group::cgroup_only("the runner's cgroup tree", cg);
    if !group.kill_and_wait(KILL_WAIT).await {
        return Err(CgroupError::Io {
            what: "empty",
            path: tree.to_owned(),
            source: std::io::Error::other(format!(
                "processes are still there {KILL_WAIT:?} after cgroup.kill"
            )),
        });
    }
    Ok(true)
}
