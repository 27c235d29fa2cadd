//! Directories held by descriptor, and everything below them reached relative to that
//! descriptor: a path is resolved once, checked, and from then on only the descriptor is
//! used. A path checked and then resolved again (to open, to build a Landlock rule, to
//! chdir) can be redirected in between by whoever can rename entries on the way, and a
//! job can do that inside its own workspace.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, OFlag};
use nix::sys::stat::{self, Mode};

/// An open directory.
#[derive(Debug)]
pub struct Dir(OwnedFd);

/// Flags of a directory that is only ever used as an anchor (`*at` calls, `fchdir`,
/// Landlock rules), never read: `O_PATH` where the OS has it, so even a directory the
/// account may only traverse can be held.
#[cfg(target_os = "linux")]
const ANCHOR: OFlag = OFlag::O_PATH;
#[cfg(not(target_os = "linux"))]
const ANCHOR: OFlag = OFlag::O_RDONLY;

/// How often openat2 is asked again after EAGAIN before the walk takes over.
#[cfg(target_os = "linux")]
const OPENAT2_TRIES: usize = 8;

fn anchor_flags() -> OFlag {
    ANCHOR | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

impl Dir {
    /// Opens the directory at `path`, symlinks included: this is where resolution starts,
    /// a path from the caller's own configuration (a state dir may well be a symlink to
    /// another disk), never one a job can write. What lies below is reached with
    /// [`Self::make_child`] and [`Self::open_beneath`], which follow nothing.
    pub fn open(path: &Path) -> io::Result<Self> {
        Ok(Self(fcntl::openat(
            fcntl::AT_FDCWD,
            path,
            anchor_flags() - OFlag::O_NOFOLLOW,
            Mode::empty(),
        )?))
    }

    /// Creates the directory `name` (one component) inside this one with `mode`, unless
    /// it exists, and opens it without following a symlink: something planted under
    /// that name is refused, never followed.
    pub fn make_child(&self, name: &str, mode: u32) -> io::Result<Self> {
        self.child(name, mode, true)
    }

    /// Creates the directory `name` (one component) inside this one with `mode` and opens
    /// it; `EEXIST` when something is already there, which is then left alone.
    pub fn create_child(&self, name: &str, mode: u32) -> io::Result<Self> {
        self.child(name, mode, false)
    }

    fn child(&self, name: &str, mode: u32, may_exist: bool) -> io::Result<Self> {
        single_component(name)?;
        match stat::mkdirat(
            self.0.as_fd(),
            name,
            Mode::from_bits_truncate(mode as libc::mode_t),
        ) {
            Ok(()) => {}
            Err(Errno::EEXIST) if may_exist => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Self(fcntl::openat(
            self.0.as_fd(),
            name,
            anchor_flags(),
            Mode::empty(),
        )?))
    }

    /// Opens the directory `rel` below this one. No symlink is followed at any component
    /// and `..` may not climb above this directory. The errors say which rule refused:
    /// `EXDEV` for an escape, `ELOOP` for a symlink, `ENOENT` for a missing component,
    /// `ENOTDIR` for one that is not a directory, `ENAMETOOLONG` for a path too long.
    ///
    /// `.` and `..` are folded by spelling first: with no symlink allowed anywhere, that is
    /// what they mean, and it spares the kernel the `..` it cannot always vouch for (any
    /// rename on the system while it resolves one makes openat2 fail with EAGAIN).
    pub fn open_beneath(&self, rel: &Path) -> io::Result<Self> {
        let names = fold_beneath(rel)?;
        if names.is_empty() {
            return self.try_clone();
        }
        #[cfg(target_os = "linux")]
        if OPENAT2.load(std::sync::atomic::Ordering::Relaxed) {
            let folded: PathBuf = names.iter().collect();
            let how = fcntl::OpenHow::new()
                .flags(anchor_flags() - OFlag::O_NOFOLLOW)
                .resolve(
                    fcntl::ResolveFlag::RESOLVE_BENEATH
                        | fcntl::ResolveFlag::RESOLVE_NO_SYMLINKS
                        | fcntl::ResolveFlag::RESOLVE_NO_MAGICLINKS,
                );
            for _ in 0..OPENAT2_TRIES {
                match fcntl::openat2(self.0.as_fd(), &folded, how) {
                    Ok(fd) => return Ok(Self(fd)),
                    // Not expected without `..`; the walk settles it either way.
                    Err(Errno::EAGAIN) => continue,
                    // Linux before 5.6, or a seccomp filter that does not know openat2
                    // (older container profiles answer EPERM): the walk from now on.
                    Err(Errno::ENOSYS) | Err(Errno::EPERM) => {
                        OPENAT2.store(false, std::sync::atomic::Ordering::Relaxed);
                        break;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        self.walk(&names)
    }

    /// [`Self::open_beneath`] without openat2: one component at a time, each opened with
    /// `O_NOFOLLOW` relative to the descriptor of the one before.
    fn walk(&self, names: &[&OsStr]) -> io::Result<Self> {
        let mut cur: Option<OwnedFd> = None;
        for name in names {
            let dir = cur.as_ref().map_or(self.0.as_fd(), |fd| fd.as_fd());
            cur = Some(open_step(dir, name)?);
        }
        match cur {
            Some(fd) => Ok(Self(fd)),
            None => self.try_clone(),
        }
    }

    #[cfg(test)]
    fn walk_beneath(&self, rel: &Path) -> io::Result<Self> {
        self.walk(&fold_beneath(rel)?)
    }

    /// `Ok` when this process may enter the directory (search permission).
    pub fn searchable(&self) -> io::Result<()> {
        Ok(nix::unistd::faccessat(
            self.0.as_fd(),
            ".",
            nix::unistd::AccessFlags::X_OK,
            fcntl::AtFlags::empty(),
        )?)
    }

    /// True when `other` is this very directory (same device and inode).
    pub fn same_as(&self, other: &Dir) -> io::Result<bool> {
        let (a, b) = (stat::fstat(self.0.as_fd())?, stat::fstat(other.0.as_fd())?);
        Ok(a.st_dev == b.st_dev && a.st_ino == b.st_ino)
    }

    /// Opens the regular file `name` in this directory for appending, created with
    /// `mode` if needed; a symlink under that name is refused.
    /// `O_NONBLOCK`: a FIFO planted under that name must not hang the opener, and is then
    /// refused with anything else that is not a regular file.
    pub fn append_file(&self, name: &str, mode: u32) -> io::Result<File> {
        let flags = OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_NONBLOCK;
        self.open_regular(name, flags, mode)
    }

    /// Creates `name` in this directory (which must not exist yet), for writing.
    pub fn create_new_file(&self, name: &str, mode: u32) -> io::Result<File> {
        Ok(File::from(self.open_child(
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
            mode,
        )?))
    }

    /// Opens the regular file `name` in this directory for reading, not following a
    /// symlink.
    pub fn open_file(&self, name: &str) -> io::Result<File> {
        self.open_regular(name, OFlag::O_RDONLY | OFlag::O_NONBLOCK, 0)
    }

    /// Opens the regular file `name` for writing (not appending: the caller positions
    /// its writes), creating it with `mode` when missing; a symlink is refused.
    pub fn write_file(&self, name: &str, mode: u32) -> io::Result<File> {
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK;
        self.open_regular(name, flags, mode)
    }

    /// [`Self::open_child`], refused unless it is a regular file.
    fn open_regular(&self, name: &str, flags: OFlag, mode: u32) -> io::Result<File> {
        let fd = self.open_child(name, flags, mode)?;
        regular(&fd, name)?;
        Ok(File::from(fd))
    }

    /// Opens the entry `name` of this directory with `flags`, never through a symlink
    /// and never inherited by a child.
    fn open_child(&self, name: &str, flags: OFlag, mode: u32) -> io::Result<OwnedFd> {
        single_component(name)?;
        Ok(fcntl::openat(
            self.0.as_fd(),
            name,
            flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode as libc::mode_t),
        )?)
    }

    /// A second name `to` for the file `from`, both in this directory (a hard link).
    pub fn link(&self, from: &str, to: &str) -> io::Result<()> {
        single_component(from)?;
        single_component(to)?;
        Ok(nix::unistd::linkat(
            self.0.as_fd(),
            from,
            self.0.as_fd(),
            to,
            fcntl::AtFlags::empty(),
        )?)
    }

    /// Device and inode of the entry `name`, not following a symlink; `None` when there
    /// is none.
    pub fn identify(&self, name: &str) -> io::Result<Option<(u64, u64)>> {
        single_component(name)?;
        match stat::fstatat(self.0.as_fd(), name, fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            #[allow(clippy::unnecessary_cast)]
            Ok(st) => Ok(Some((st.st_dev as u64, st.st_ino as u64))),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Bytes an unprivileged writer may still use on this directory's file system. Asked
    /// of the descriptor itself (fstatfs takes an O_PATH one since Linux 3.12): a
    /// directory the account may only traverse answers too.
    pub fn free_space(&self) -> io::Result<u64> {
        let st = nix::sys::statvfs::fstatvfs(&self.0)?;
        #[allow(clippy::unnecessary_cast)]
        Ok((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
    }

    /// Renames `from` to `to`, both in this directory.
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        single_component(from)?;
        single_component(to)?;
        Ok(fcntl::renameat(self.0.as_fd(), from, self.0.as_fd(), to)?)
    }

    /// Removes the file `name` from this directory.
    pub fn remove_file(&self, name: &str) -> io::Result<()> {
        single_component(name)?;
        Ok(nix::unistd::unlinkat(
            self.0.as_fd(),
            name,
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        )?)
    }

    /// Flushes the directory's entries to disk (after a create or rename in it).
    pub fn sync(&self) -> io::Result<()> {
        Ok(nix::unistd::fsync(self.open_self()?.as_fd())?)
    }

    /// The directory itself, opened for reading through this descriptor: an O_PATH
    /// descriptor cannot be fsynced.
    fn open_self(&self) -> io::Result<OwnedFd> {
        Ok(fcntl::openat(
            self.0.as_fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// Where this directory is now, for messages and records only: never to be opened
    /// again (Linux asks the kernel; elsewhere `None`).
    pub fn current_path(&self) -> Option<PathBuf> {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            std::fs::read_link(format!("/proc/self/fd/{}", self.0.as_raw_fd())).ok()
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
    }

    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self(self.0.try_clone()?))
    }
}

/// Refuses what is not a regular file (a FIFO, a device, a directory planted there).
fn regular(fd: &OwnedFd, name: &str) -> io::Result<()> {
    if stat::fstat(fd.as_fd())?.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name} is not a regular file"),
        ));
    }
    Ok(())
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl From<Dir> for OwnedFd {
    fn from(d: Dir) -> Self {
        d.0
    }
}

/// Whether openat2 may be used: cleared the first time the kernel (or a seccomp filter)
/// refuses it, so a host without it pays for the refusal once.
#[cfg(target_os = "linux")]
static OPENAT2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// At most this many components, this many bytes: a path longer than any real checkout
/// needs is refused before anything is opened.
const MAX_COMPONENTS: usize = 256;
const MAX_PATH_BYTES: usize = 4096;

/// The names of `rel` with `.` and `..` folded by spelling; `EXDEV` when it is absolute or
/// climbs out, `ENAMETOOLONG` past the bounds.
fn fold_beneath(rel: &Path) -> io::Result<Vec<&OsStr>> {
    if rel.as_os_str().len() > MAX_PATH_BYTES {
        return Err(Errno::ENAMETOOLONG.into());
    }
    let mut names = Vec::new();
    for comp in rel.components() {
        match comp {
            Component::CurDir => {}
            Component::ParentDir => {
                if names.pop().is_none() {
                    return Err(Errno::EXDEV.into());
                }
            }
            Component::Normal(name) => {
                if names.len() == MAX_COMPONENTS {
                    return Err(Errno::ENAMETOOLONG.into());
                }
                names.push(name);
            }
            Component::RootDir | Component::Prefix(_) => return Err(Errno::EXDEV.into()),
        }
    }
    Ok(names)
}

/// One step of the walk: `name` in `dir`, a directory, not a symlink.
fn open_step(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    match fcntl::openat(dir, name, anchor_flags(), Mode::empty()) {
        Ok(fd) => Ok(fd),
        // With O_NOFOLLOW | O_DIRECTORY a symlink fails as ELOOP or ENOTDIR depending
        // on the system: look, so the error says which.
        Err(Errno::ENOTDIR) | Err(Errno::ELOOP) => {
            let st = stat::fstatat(dir, name, fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)?;
            if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                Err(Errno::ELOOP.into())
            } else {
                Err(Errno::ENOTDIR.into())
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Names given to the one-component helpers must be exactly one component.
fn single_component(name: &str) -> io::Result<()> {
    let mut comps = Path::new(name).components();
    match (comps.next(), comps.next()) {
        (Some(Component::Normal(_)), None) => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a single file name"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno(r: io::Result<Dir>) -> Option<i32> {
        r.err().and_then(|e| e.raw_os_error())
    }

    fn check_rules(open: impl Fn(&Dir, &str) -> io::Result<Dir>) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/file"), "").unwrap();
        std::os::unix::fs::symlink("b", root.join("a/link")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("out")).unwrap();
        let dir = Dir::open(&root).unwrap();
        let b = open(&dir, "a/b").unwrap();
        assert_eq!(
            b.current_path(),
            Some(root.join("a/b")).filter(|_| cfg!(target_os = "linux"))
        );
        assert!(open(&dir, "a/b/..")
            .unwrap()
            .same_as(&Dir::open(&root.join("a")).unwrap())
            .unwrap());
        assert!(open(&dir, ".").unwrap().same_as(&dir).unwrap());
        assert_eq!(errno(open(&dir, "..")), Some(libc::EXDEV));
        assert_eq!(errno(open(&dir, "a/../../root")), Some(libc::EXDEV));
        assert_eq!(errno(open(&dir, "a/link")), Some(libc::ELOOP));
        assert_eq!(errno(open(&dir, "out/root")), Some(libc::ELOOP));
        assert_eq!(errno(open(&dir, "a/missing")), Some(libc::ENOENT));
        assert_eq!(errno(open(&dir, "a/file")), Some(libc::ENOTDIR));
        assert_eq!(errno(open(&dir, "/etc")), Some(libc::EXDEV));
    }

    #[test]
    fn beneath_refuses_escapes_and_symlinks() {
        check_rules(|d, p| d.open_beneath(Path::new(p)));
    }

    #[test]
    fn the_walk_follows_the_same_rules() {
        check_rules(|d, p| {
            if p.starts_with('/') {
                d.open_beneath(Path::new(p))
            } else {
                d.walk_beneath(Path::new(p))
            }
        });
    }

    #[test]
    fn a_child_planted_as_a_symlink_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::open(tmp.path()).unwrap();
        std::os::unix::fs::symlink("/", tmp.path().join("ws")).unwrap();
        assert!(dir.make_child("ws", 0o700).is_err());
        assert!(dir.make_child("real", 0o700).is_ok());
        assert!(dir.make_child("real", 0o700).is_ok());
        assert!(dir.make_child("a/b", 0o700).is_err());
        std::os::unix::fs::symlink("/etc/passwd", tmp.path().join("f")).unwrap();
        assert!(dir.append_file("f", 0o600).is_err());
    }
}
