//! Delegating a cgroup v2 subtree to the runner, so that its jobs get the cgroup tier.
//!
//! The agent must itself run in a cgroup delegated to it (a systemd unit with
//! `Delegate=yes`). Layout, with `U` the agent's cgroup:
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

use crate::runner::confine::RUNNER_LEAF;
use crate::supervisor::account::Account;
use crate::sys::cgroup::Cgroup;

const AGENT_LEAF: &str = "agent";
const RUNNER_TREE: &str = "runner";

#[derive(Debug, Error)]
pub(crate) enum CgroupError {
    #[error("no cgroup v2 hierarchy is mounted")]
    NoHierarchy,
    #[error("the agent runs in the root cgroup; run it as a service with a delegated cgroup (systemd: Delegate=yes)")]
    RootCgroup,
    #[error("could not {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Sets up the layout above and returns the cgroup the runner must start in.
pub(crate) fn delegate_to_runner(acct: &Account) -> Result<PathBuf, CgroupError> {
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
    // Already moved (a re-executed agent in the same unit): the unit is the parent.
    let unit = match own.parent() {
        Some(p)
            if own.path().file_name() == Some(std::ffi::OsStr::new(AGENT_LEAF))
                && p.child(RUNNER_TREE).exists() =>
        {
            p
        }
        _ => own,
    };
    if unit.parent().is_none_or(|p| !p.exists()) {
        return Err(CgroupError::RootCgroup);
    }
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

/// How long the runner's tree may take to empty after `cgroup.kill`.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Kills everything left in the runner's cgroup tree (the runner's leaf and every job's
/// cgroup, whatever left its process group) with `cgroup.kill`, and waits for it to
/// empty. Membership is the kernel's, so this cannot hit a process outside the tree, and
/// no pid is read. Returns whether anything was there.
pub(crate) async fn kill_tree(tree: &Path) -> Result<bool, CgroupError> {
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
