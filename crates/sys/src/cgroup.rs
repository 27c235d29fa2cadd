//! cgroup v2 directories: finding our own, creating children, limits, membership, kill.
//!
//! Plain file operations on the unified hierarchy; the policy (when to use a cgroup, what
//! to put in it) lives with the runner.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::group::Sig;
use super::ProcessId;

/// One cgroup v2 directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The cgroup this process belongs to in the unified hierarchy, when that hierarchy is
    /// mounted (pure v2, or the `unified` mount of a hybrid system).
    pub fn own() -> io::Result<Option<Self>> {
        let Some(mount) = unified_mount()? else {
            return Ok(None);
        };
        let text = fs::read_to_string("/proc/self/cgroup")?;
        let Some(rel) = text.lines().find_map(|l| l.strip_prefix("0::")) else {
            return Ok(None);
        };
        Ok(Some(Self::at(mount.join(rel.trim_start_matches('/')))))
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn parent(&self) -> Option<Self> {
        self.dir.parent().map(Self::at)
    }

    pub fn child(&self, name: &str) -> Self {
        Self::at(self.dir.join(name))
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// True when this process may manage the cgroup: create children and move processes
    /// (write access to the directory and to `cgroup.procs`), as delegation grants.
    pub fn delegated_to_us(&self) -> bool {
        use nix::unistd::{access, AccessFlags};
        let w = AccessFlags::W_OK;
        access(&self.dir, w | AccessFlags::X_OK).is_ok()
            && access(&self.file("cgroup.procs"), w).is_ok()
            && access(&self.file("cgroup.subtree_control"), w).is_ok()
    }

    /// Creates the directory; an existing one is fine.
    pub fn create(&self) -> io::Result<()> {
        match fs::create_dir(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        }
    }

    /// Creates the cgroup, which must not exist yet: one already there belongs to someone
    /// else (a job of a dead runner still being ended), and is never joined.
    pub fn create_new(&self) -> io::Result<()> {
        fs::create_dir(&self.dir)
    }

    /// Removes the (empty, unpopulated) cgroup. A missing one is fine.
    pub fn remove(&self) -> io::Result<()> {
        match fs::remove_dir(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    pub fn exists(&self) -> bool {
        self.file("cgroup.procs").exists()
    }

    /// Child cgroups, by name.
    pub fn children(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                out.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(out)
    }

    pub fn write(&self, name: &str, value: &str) -> io::Result<()> {
        let path = self.file(name);
        let mut f = OpenOptions::new().write(true).open(&path)?;
        f.write_all(value.as_bytes())
    }

    /// Controllers this cgroup may hand to its children.
    pub fn controllers(&self) -> io::Result<Vec<String>> {
        Ok(fs::read_to_string(self.file("cgroup.controllers"))?
            .split_whitespace()
            .map(str::to_owned)
            .collect())
    }

    /// Enables `controller` for the children. Fails (EBUSY) while processes live in this
    /// cgroup itself: v2 keeps processes in leaves only.
    pub fn enable(&self, controller: &str) -> io::Result<()> {
        self.write("cgroup.subtree_control", &format!("+{controller}"))
    }

    /// Moves the calling process (all its threads) here.
    pub fn move_self(&self) -> io::Result<()> {
        self.write("cgroup.procs", "0")
    }

    /// `cgroup.procs` open for writing, close-on-exec: a child writes "0" into it before
    /// exec to start life inside this cgroup.
    pub fn open_procs(&self) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(self.file("cgroup.procs"))
    }

    /// Processes in this cgroup (not its children).
    pub fn pids(&self) -> io::Result<Vec<i32>> {
        Ok(fs::read_to_string(self.file("cgroup.procs"))?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    /// True while any process lives in this cgroup or below it.
    pub fn populated(&self) -> io::Result<bool> {
        let events = fs::read_to_string(self.file("cgroup.events"))?;
        Ok(events
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["populated", "1"]))
    }

    /// Sends `sig` to every process in this cgroup (not its children). Processes that are
    /// gone already are skipped.
    pub fn signal_all(&self, sig: Sig) -> io::Result<()> {
        for pid in self.pids()? {
            if let Some(pid) = ProcessId::new(pid) {
                if pid != ProcessId::current() {
                    let _ = super::group::signal_process(pid, sig);
                }
            }
        }
        Ok(())
    }

    /// SIGKILLs everything in the subtree at once through `cgroup.kill` (Linux 5.14), which
    /// no process can dodge by forking; on older kernels, SIGKILL to each member.
    pub fn kill(&self) -> io::Result<()> {
        match self.write("cgroup.kill", "1") {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.signal_all(Sig::SIGKILL),
            Err(e) => Err(e),
        }
    }

    /// True when the kernel offers `cgroup.kill`.
    pub fn can_kill(&self) -> bool {
        self.file("cgroup.kill").exists()
    }
}

/// Where the unified (v2) hierarchy is mounted, from /proc/self/mountinfo.
fn unified_mount() -> io::Result<Option<PathBuf>> {
    let text = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text.lines().find_map(|line| {
        // "<id> <parent> <dev> <root> <mount point> <options> [optional...] - <fstype> ..."
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mount = left.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_mount(mount)))
    }))
}

/// mountinfo escapes space, tab, newline and backslash as octal `\NNN`.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).and_then(|d| {
            if !d.iter().all(|c| (b'0'..=b'7').contains(c)) {
                return None;
            }
            u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok()
        });
        if let (b'\\', Some(v)) = (b[i], octal) {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape_mount(r"/sys/fs/cgroup"), "/sys/fs/cgroup");
        assert_eq!(unescape_mount(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape_mount(r"/x\"), r"/x\");
    }
}
