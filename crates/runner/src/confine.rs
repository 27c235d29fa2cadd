//! Confinement of job processes, the best the host offers, reported per job.
//!
//! - **cgroup** (Linux, when the runner's own cgroup v2 is delegated to it): every job starts
//!   inside its own cgroup `<runner cgroup>/job-<id>`, joined before its first instruction.
//!   Stopping it ends with `cgroup.kill`, so even a process that left the job's process
//!   group (setsid, a daemonizing build server) dies with the job. `memory_bytes`,
//!   `processes` and `cpu_millis` become `memory.max`, `pids.max` and `cpu.max` where those
//!   controllers are available.
//! - **process-group** otherwise: the job leads its own process group, which is signalled
//!   whole; a process that calls setsid escapes it.
//!
//! rlimits apply on top in both tiers (the per-process ones always; `memory_bytes` and
//! `processes` only when no cgroup controller enforces them, because RLIMIT_AS counts
//! address space rather than memory and RLIMIT_NPROC counts every process of the uid).
//!
//! **landlock** (Linux 5.19+, on top of either tier): jobs run as the runner's account, so
//! without more they could read `jobs.db` (every job's environment), other jobs' output and
//! workspaces, and the runner's API token. Each job restricts itself, last before exec, to
//! a Landlock ruleset that allows every path except the state directory, of which it keeps
//! its own workspace. From Landlock ABI 6 the job can also no longer signal anything
//! outside its own domain: not the runner, not another job. See [`FsGuard`] for what that
//! costs a job.
//!
//! Still not a boundary against a hostile job: the job may write whatever the runner's
//! account may outside the runner's directory, the delegated cgroup tree included. It can
//! connect to the runner's socket (Landlock does not govern that), but cannot read the API
//! token that every endpoint but health asks for (see `runner::token`).

use std::io;
#[cfg(target_os = "linux")]
use std::path::{Path, PathBuf};
#[cfg(target_os = "linux")]
use std::sync::{Arc, Mutex};
#[cfg(target_os = "linux")]
use std::time::SystemTime;

use crate::proto::job::Limits;
#[cfg(target_os = "linux")]
use crate::sys::landlock::{self, Ruleset};
use crate::sys::spawn::Rlimits;

#[cfg(target_os = "linux")]
use crate::proto::runner::RUNNER_LEAF;
/// Job cgroups are `job-<id>` beside the runner's leaf.
#[cfg(target_os = "linux")]
const JOB_PREFIX: &str = "job-";
/// `cpu.max` period, microseconds.
#[cfg(target_os = "linux")]
const CPU_PERIOD_US: u64 = 100_000;

/// The confinement a runner has to offer its jobs, beyond process groups and rlimits.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tiers<'a> {
    pub cgroups: Option<&'a CgroupTier>,
    pub fs: Option<&'a FsGuard>,
    /// The sandbox, held or not (it says which).
    pub sandbox: Option<&'a crate::sandbox::Sandboxing>,
}

/// The cgroup tier, when the runner's cgroup is delegated to it.
#[derive(Debug)]
pub struct CgroupTier {
    #[cfg(target_os = "linux")]
    base: crate::sys::cgroup::Cgroup,
    controllers: Vec<&'static str>,
}

/// A job's own cgroup, open for the launch.
#[cfg(target_os = "linux")]
pub struct JobCgroup {
    pub cgroup: crate::sys::cgroup::Cgroup,
    pub procs: std::fs::File,
}

/// How one job is confined.
pub struct Plan {
    pub rlimits: Rlimits,
    #[cfg(target_os = "linux")]
    pub cgroup: Option<JobCgroup>,
    /// What applied, for the job's record: `cgroup+memory.max+rlimits`,
    /// `process-group+rlimits; not enforced: cpu_millis`, ...
    pub confinement: String,
}

impl CgroupTier {
    /// Sets the tier up when the runner's own cgroup v2 is delegated to it: moves the
    /// runner into a leaf and enables what it can of memory, pids and cpu for job cgroups.
    /// `None` (and a log line saying why) otherwise.
    #[cfg(target_os = "linux")]
    pub fn detect() -> Option<Self> {
        use crate::sys::cgroup::Cgroup;
        let own = match Cgroup::own() {
            Ok(Some(c)) => c,
            Ok(None) => {
                tracing::info!(
                    "no cgroup v2 hierarchy mounted: jobs are confined to their process group"
                );
                return None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not read this process's cgroup: jobs are confined to their process group");
                return None;
            }
        };
        // A runner started in the leaf of an earlier one (where a restart must place it once
        // the delegated cgroup has controllers enabled) manages the leaf's parent.
        let base = match own.parent() {
            Some(parent)
                if own.path().file_name() == Some(std::ffi::OsStr::new(RUNNER_LEAF))
                    && parent.delegated_to_us() =>
            {
                parent
            }
            _ => own,
        };
        if !base.delegated_to_us() {
            tracing::info!(cgroup = %base.path().display(), "the runner's cgroup is not delegated to its account: jobs are confined to their process group");
            return None;
        }
        if !base.can_kill() {
            tracing::info!(cgroup = %base.path().display(), "this kernel has no cgroup.kill (Linux 5.14): jobs are confined to their process group");
            return None;
        }
        let leaf = base.child(RUNNER_LEAF);
        if let Err(e) = leaf.create().and_then(|()| leaf.move_self()) {
            tracing::warn!(cgroup = %leaf.path().display(), error = %e, "could not move the runner into its own leaf cgroup: jobs are confined to their process group");
            return None;
        }
        let available = base.controllers().unwrap_or_default();
        let mut controllers = Vec::new();
        for c in ["memory", "pids", "cpu"] {
            if !available.iter().any(|a| a == c) {
                continue;
            }
            match base.enable(c) {
                Ok(()) => controllers.push(c),
                Err(e) => {
                    tracing::warn!(cgroup = %base.path().display(), controller = c, error = %e, "could not enable a controller for job cgroups")
                }
            }
        }
        tracing::info!(cgroup = %base.path().display(), controllers = ?controllers, "each job gets its own cgroup");
        Some(Self { base, controllers })
    }

    #[cfg(not(target_os = "linux"))]
    pub fn detect() -> Option<Self> {
        None
    }

    /// The controllers job cgroups get.
    pub fn controllers(&self) -> &[&'static str] {
        &self.controllers
    }

    /// `cgroup` or `process-group`, for the runner's health report.
    pub fn name(tier: Option<&Self>) -> &'static str {
        if tier.is_some() {
            "cgroup"
        } else {
            "process-group"
        }
    }

    /// Job cgroups a previous runner left behind (it was killed): `(id, cgroup)`.
    #[cfg(target_os = "linux")]
    pub fn leftovers(&self) -> Vec<(String, crate::sys::cgroup::Cgroup)> {
        self.base
            .children()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|name| {
                let id = name.strip_prefix(JOB_PREFIX)?.to_owned();
                Some((id, self.base.child(&name)))
            })
            .collect()
    }

    #[cfg(target_os = "linux")]
    fn job_cgroup(&self, id: &str, limits: &Limits) -> io::Result<(JobCgroup, Vec<&'static str>)> {
        let cg = self.base.child(&format!("{JOB_PREFIX}{id}"));
        // An empty one left by a job of this id that ended is removed first; a populated
        // one (a dead runner's job, still being ended) makes this job start without the
        // cgroup tier rather than inside a cgroup that is about to be killed.
        if !cg.populated().unwrap_or(false) {
            let _ = cg.remove();
        }
        cg.create_new()?;
        let mut applied = Vec::new();
        let has = |c: &str| self.controllers.contains(&c);
        if let (Some(bytes), true) = (limits.memory_bytes, has("memory")) {
            cg.write("memory.max", &bytes.to_string())?;
            // Without this, memory.max only pushes the job into swap.
            let _ = cg.write("memory.swap.max", "0");
            applied.push("memory.max");
        }
        if let (Some(n), true) = (limits.processes, has("pids")) {
            cg.write("pids.max", &n.to_string())?;
            applied.push("pids.max");
        }
        if let (Some(m), true) = (limits.cpu_millis, has("cpu")) {
            let quota = m.saturating_mul(CPU_PERIOD_US) / 1000;
            cg.write("cpu.max", &format!("{quota} {CPU_PERIOD_US}"))?;
            applied.push("cpu.max");
        }
        let procs = cg.open_procs()?;
        Ok((JobCgroup { cgroup: cg, procs }, applied))
    }
}

/// What of `limits` this host will not enforce as asked, and why, for the submitter (the
/// job's `confinement` says the same once it runs).
pub fn unenforced(tier: Option<&CgroupTier>, limits: &Limits) -> Vec<String> {
    let has = |c: &str| tier.is_some_and(|t| t.controllers.contains(&c));
    const HOW: &str =
        "the cgroup tier: runner.delegate_cgroup = true under a systemd unit with Delegate=yes";
    let mut out = Vec::new();
    if limits.cpu_millis.is_some() && !has("cpu") {
        out.push(format!(
            "cpu_millis will not be enforced: it needs the cpu controller of {HOW}"
        ));
    }
    if limits.memory_bytes.is_some() && !has("memory") {
        out.push(format!(
            "memory_bytes is enforced as RLIMIT_AS (address space, not memory): memory.max needs {HOW}"
        ));
    }
    if limits.processes.is_some() && !has("pids") {
        out.push(format!(
            "processes is enforced as RLIMIT_NPROC, which counts every process of the runner's account: pids.max needs {HOW}"
        ));
    }
    out
}

/// Decides how job `id` is confined and prepares it (its cgroup, when the tier is there).
/// A cgroup that cannot be made costs the job that tier, not its start: the job runs in
/// the process-group tier and its record says so.
pub fn plan(tier: Option<&CgroupTier>, id: &str, limits: &Limits, landlock: bool) -> Plan {
    let mut parts: Vec<&str> = Vec::new();
    #[cfg(target_os = "linux")]
    let mut cgroup = None;
    let mut cgroup_applied: Vec<&'static str> = Vec::new();
    #[cfg(target_os = "linux")]
    if let Some(tier) = tier {
        match tier.job_cgroup(id, limits) {
            Ok((cg, applied)) => {
                cgroup = Some(cg);
                cgroup_applied = applied;
            }
            Err(e) => {
                tracing::warn!(job = %id, cgroup = %tier.base.path().display(), error = %e, "could not create the job's cgroup: process-group confinement only")
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (tier, id);
    #[cfg(target_os = "linux")]
    let in_cgroup = cgroup.is_some();
    #[cfg(not(target_os = "linux"))]
    let in_cgroup = false;
    parts.push(if in_cgroup { "cgroup" } else { "process-group" });
    parts.extend(cgroup_applied.iter().copied());
    let rlimits = Rlimits {
        address_space: limits
            .memory_bytes
            .filter(|_| !cgroup_applied.contains(&"memory.max")),
        cpu_secs: limits.cpu_secs,
        open_files: limits.open_files,
        processes: limits
            .processes
            .filter(|_| !cgroup_applied.contains(&"pids.max")),
    };
    if !rlimits.is_empty() {
        parts.push("rlimits");
    }
    if landlock {
        parts.push("landlock");
    }
    let mut confinement = parts.join("+");
    if limits.cpu_millis.is_some() && !cgroup_applied.contains(&"cpu.max") {
        confinement.push_str("; not enforced: cpu_millis");
    }
    Plan {
        rlimits,
        #[cfg(target_os = "linux")]
        cgroup,
        confinement,
    }
}

/// The file-system tier: for each job, a Landlock ruleset that allows every path except
/// the state directory (the runner's files, and the agent's in a non-root layout), of which
/// it keeps the job's own workspace (and its `cwd`, when that is elsewhere in the work root).
///
/// Landlock only allows, so "everything but D" is spelled as: every entry of `/` except
/// the one that leads to D, every entry of that one except the next, and so on down to D,
/// then the job's workspace. What that costs a job: it cannot list or create entries
/// directly in the directories on the way to the state directory (`/`, and with the default
/// state dir `/var`, `/var/lib`), nor use the other entries of one of those it may not
/// list; below any other entry nothing changes. Symlinks among those entries need no rule:
/// access is judged where they lead. An entry that cannot be opened or added is left out
/// (denied), never the whole guard. Set-user-id programs no longer raise privileges
/// (`no_new_privs`), and a job can no longer mount (so no nested sandboxes).
///
/// The entries are listed once and listed again when one of the listed directories changes
/// (an entry added or removed changes its mtime), checked at each job's start. Each job's
/// ruleset opens them (`O_PATH`), adds its few dozen rules and closes them again: between
/// jobs the runner holds no descriptor beside its state dir, so a file system mounted next
/// to one of those directories can be unmounted, and a file deleted there gives its space
/// back. (A running job's Landlock domain keeps a reference to the inodes of its rules, not
/// to their mounts, for that job's life.)
#[cfg(target_os = "linux")]
#[derive(Debug)]
pub struct FsGuard {
    abi: i32,
    hidden: PathBuf,
    current: Mutex<Option<Arc<Allowed>>>,
}

/// The entries beside the path to the hidden directory, by name, and the directories they
/// were listed from with their mtime then.
#[cfg(target_os = "linux")]
#[derive(Debug)]
struct Allowed {
    entries: Vec<PathBuf>,
    listed: Vec<(PathBuf, Option<SystemTime>)>,
    /// Set when a directory changed too shortly before it was listed for its mtime to
    /// tell a later change apart (timestamps are coarse): list again once this has passed.
    recheck_at: Option<SystemTime>,
}

/// How old a directory's last change must be, when it is listed, for its mtime to be
/// trusted as the mark of that listing; a change that a same-tick mtime hides is seen at
/// most this long after it.
#[cfg(target_os = "linux")]
const RACY: std::time::Duration = std::time::Duration::from_secs(2);

/// Landlock ABI 1 refuses every rename or link across directories (git, cargo and `mv`
/// would fail in jobs): the guard needs ABI 2 (Linux 5.19).
#[cfg(target_os = "linux")]
const MIN_ABI: i32 = 2;

#[cfg(target_os = "linux")]
impl FsGuard {
    /// `None` (and a log line saying why) where the kernel's Landlock cannot do it.
    pub fn detect(hidden: &Path) -> Option<Self> {
        let abi = match landlock::abi() {
            Some(abi) if abi >= MIN_ABI => abi,
            Some(abi) => {
                tracing::warn!(
                    abi,
                    "Landlock ABI {abi} is too old (2 is needed): jobs can read the runner's files"
                );
                return None;
            }
            None => {
                tracing::warn!("no Landlock in this kernel: jobs can read the runner's files");
                return None;
            }
        };
        let guard = Self {
            abi,
            hidden: hidden.to_owned(),
            current: Mutex::new(None),
        };
        match guard.allowed().and_then(|_| Ruleset::new(abi)) {
            Ok(_) => {
                tracing::info!(abi, isolation = guard.isolation(), hidden = %hidden.display(), "jobs are kept out of the state directory by Landlock");
                Some(guard)
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not set Landlock up: jobs can read the runner's files");
                None
            }
        }
    }

    /// `landlock+signals` (ABI 6+: signals scoped too), `landlock`, or `landlock-partial`
    /// (ABI 2: jobs can still truncate the runner's files, which Landlock governs from 3).
    pub fn isolation(&self) -> &'static str {
        match self.abi {
            6.. => "landlock+signals",
            3..=5 => "landlock",
            _ => "landlock-partial",
        }
    }

    /// The ruleset for a job whose workspace is `workspace` and whose working directory,
    /// when the spec names one, is `cwd`: both open already, so the rules are made from the
    /// very directories that were checked.
    pub fn ruleset_for(
        &self,
        workspace: &crate::sys::dirfd::Dir,
        cwd: Option<&crate::sys::dirfd::Dir>,
    ) -> io::Result<Ruleset> {
        let allowed = self.allowed()?;
        let mut ruleset = Ruleset::new(self.abi)?;
        for entry in &allowed.entries {
            use std::os::fd::AsFd;
            // Left out (so denied) if it cannot be opened now: vanished, or unreadable.
            // The descriptor is closed at the end of this step: the rule holds the inode,
            // not the mount.
            let added =
                open_entry(entry).and_then(|(fd, is_dir)| ruleset.allow(fd.as_fd(), is_dir));
            if let Err(e) = added {
                tracing::debug!(entry = %entry.display(), error = %e, "an entry could not be added to a job's Landlock ruleset; jobs cannot use it");
            }
        }
        for dir in std::iter::once(workspace).chain(cwd) {
            ruleset.allow(std::os::fd::AsFd::as_fd(dir), true)?;
        }
        Ok(ruleset)
    }

    /// The ruleset of a sandboxed job: its whole root, from `/` down. The sandbox itself
    /// keeps the runner's directory out of it (a tmpfs over it, but for the job's own
    /// workspace); what Landlock still adds is its scoping of signals and abstract Unix
    /// sockets (ABI 6).
    pub fn ruleset_sandboxed(&self) -> io::Result<Ruleset> {
        use std::os::fd::AsFd;
        let mut ruleset = Ruleset::new(self.abi)?;
        let (root, _) = open_entry(Path::new("/"))?;
        ruleset.allow(root.as_fd(), true)?;
        Ok(ruleset)
    }

    fn allowed(&self) -> io::Result<Arc<Allowed>> {
        let mut current = crate::util::lock(&self.current);
        if let Some(a) = current.as_ref() {
            let due = a.recheck_at.is_some_and(|at| SystemTime::now() >= at);
            if !due && a.listed.iter().all(|(dir, t)| mtime(dir) == *t) {
                return Ok(a.clone());
            }
        }
        let allowed = Arc::new(self.list()?);
        *current = Some(allowed.clone());
        Ok(allowed)
    }

    fn list(&self) -> io::Result<Allowed> {
        let hidden = std::fs::canonicalize(&self.hidden)?;
        let listed_at = SystemTime::now();
        let mut entries = Vec::new();
        let mut listed = Vec::new();
        // `/`, then each directory on the way down, each with the step it leads to.
        let mut path: Vec<&Path> = hidden.ancestors().collect();
        path.reverse();
        for pair in path.windows(2) {
            let (dir, toward) = (pair[0], pair[1]);
            listed.push((dir.to_owned(), mtime(dir)));
            // A directory this account may not list (the agent's state dir, 0711) keeps
            // its other entries from jobs: they have no business there.
            let Ok(list) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in list.flatten() {
                // A symlink needs no rule: access is judged where it leads.
                if entry.file_type().is_ok_and(|t| t.is_symlink()) {
                    continue;
                }
                let entry = entry.path();
                if entry != toward {
                    entries.push(entry);
                }
            }
        }
        let racy = listed.iter().any(|(_, t)| {
            t.is_none_or(|t| listed_at.duration_since(t).map_or(true, |age| age < RACY))
        });
        Ok(Allowed {
            entries,
            listed,
            recheck_at: racy.then(|| listed_at + RACY),
        })
    }
}

#[cfg(target_os = "linux")]
fn mtime(dir: &Path) -> Option<SystemTime> {
    std::fs::metadata(dir).and_then(|m| m.modified()).ok()
}

/// Opens `path` (`O_PATH`, not following a last symlink) for a rule. A symlink gets no rule
/// of its own (access is judged where it leads): reported as an error, so it is left out.
#[cfg(target_os = "linux")]
fn open_entry(path: &Path) -> io::Result<(std::os::fd::OwnedFd, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(path)?;
    let meta = file.metadata()?;
    if meta.file_type().is_symlink() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is a symlink", path.display()),
        ));
    }
    Ok((file.into(), meta.is_dir()))
}

/// Other systems have no Landlock.
#[cfg(not(target_os = "linux"))]
#[derive(Debug)]
pub struct FsGuard;

#[cfg(not(target_os = "linux"))]
impl FsGuard {
    pub fn detect(_hidden: &std::path::Path) -> Option<Self> {
        None
    }

    pub fn isolation(&self) -> &'static str {
        "none"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_cgroup_limits_are_rlimits_and_the_rest_is_reported() {
        let limits = Limits {
            memory_bytes: Some(1 << 30),
            processes: Some(64),
            cpu_millis: Some(500),
            ..Limits::default()
        };
        let p = plan(None, "j", &limits, false);
        assert_eq!(p.rlimits.address_space, Some(1 << 30));
        assert_eq!(p.rlimits.processes, Some(64));
        assert_eq!(
            p.confinement,
            "process-group+rlimits; not enforced: cpu_millis"
        );
        assert_eq!(
            plan(None, "j", &Limits::default(), false).confinement,
            "process-group"
        );
        assert_eq!(
            plan(None, "j", &limits, true).confinement,
            "process-group+rlimits+landlock; not enforced: cpu_millis"
        );
    }
}
