//! The agent's own executable, pinned: the runner is launched from the bytes the agent
//! was started from, never from whatever the path names later (docs/design.md, invariant 14).
//!
//! Linux: the agent opens `/proc/self/exe` once at start, which is the inode it runs from
//! even when the path has been replaced since, and keeps the descriptor. That keeps the
//! inode alive across a rename over the path (how package managers and `install` replace a
//! binary), and the kernel refuses to open a running executable for writing (ETXTBSY), so
//! its bytes do not change while the agent runs from them. The runner is exec'd from the
//! descriptor (`execveat(fd, "", AT_EMPTY_PATH)`): no path is looked up at all. Before
//! every launch, [`PinnedExe::verify`] still compares size, mtime and SHA-256
//! through the descriptor with what was recorded at start, for the file systems that do not
//! deny writes to running programs (some network and FUSE ones); a launch from bytes that
//! differ is refused, with the reason.
//!
//! Elsewhere (macOS) there is no exec from a descriptor: the runner is launched from the
//! path, and `verify` checks that the path still names the recorded file (same device,
//! inode, size, mtime and SHA-256). A replaced binary then makes the launch fail with the
//! reason instead of running the new file: the old agent never starts a runner from it,
//! but unlike on Linux it cannot go on starting runners from its own bytes either.

#[cfg(target_os = "linux")]
use std::ffi::CString;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// What the agent's executable was when it was pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExeIdentity {
    /// The path it was started as (canonical); only a name on Linux.
    pub path: PathBuf,
    pub device: u64,
    pub inode: u64,
    pub size: u64,
    /// Seconds and nanoseconds since the epoch.
    pub mtime: (i64, i64),
    /// Lowercase hex.
    pub sha256: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ExeError {
    #[error("could not find this program's own executable")]
    Find(#[source] io::Error),
    #[error("could not open executable {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not read executable {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("executable {path} is no longer the file this agent started from ({what} was {was}, is {now}): refusing to launch from it; restart the agent to run the new file")]
    Changed {
        path: PathBuf,
        what: &'static str,
        was: String,
        now: String,
    },
}

/// The executable this process started from, held open (Linux) and identified.
#[derive(Debug)]
pub struct PinnedExe {
    identity: ExeIdentity,
    meta: Metadata,
    /// The running inode, which launches exec (Linux). Elsewhere it only keeps the file
    /// that was hashed open.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    file: File,
}

impl PinnedExe {
    /// Pins the executable of this process. Blocking: it reads the whole file once.
    pub fn current() -> Result<Self, ExeError> {
        let path = std::env::current_exe()
            .and_then(std::fs::canonicalize)
            .map_err(ExeError::Find)?;
        // /proc/self/exe is the inode this process runs, even if the path was replaced
        // between our exec and now; opening the path could pin a different file.
        #[cfg(target_os = "linux")]
        let open = Path::new("/proc/self/exe");
        #[cfg(not(target_os = "linux"))]
        let open = path.as_path();
        Self::open_as(open, path)
    }

    /// Pins the file at `path` (what [`PinnedExe::current`] does with the running one).
    pub fn open(path: &Path) -> Result<Self, ExeError> {
        Self::open_as(path, path.to_owned())
    }

    fn open_as(open: &Path, path: PathBuf) -> Result<Self, ExeError> {
        // std opens with O_CLOEXEC: the descriptor reaches no child but the one that execs it.
        let file = File::open(open).map_err(|source| ExeError::Open {
            path: path.clone(),
            source,
        })?;
        let meta = file.metadata().map_err(|source| ExeError::Read {
            path: path.clone(),
            source,
        })?;
        let sha256 = hash(&file, meta.len()).map_err(|source| ExeError::Read {
            path: path.clone(),
            source,
        })?;
        let identity = ExeIdentity {
            path,
            device: meta.dev(),
            inode: meta.ino(),
            size: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            sha256,
        };
        Ok(Self {
            identity,
            meta,
            file,
        })
    }

    pub fn identity(&self) -> &ExeIdentity {
        &self.identity
    }

    pub fn path(&self) -> &Path {
        &self.identity.path
    }

    /// A reader of the pinned file from its start (a duplicate descriptor, so a reader
    /// that seeks cannot move anything this handle relies on: it reads by offset).
    pub fn reader(&self) -> io::Result<File> {
        use std::io::Seek;
        let mut f = self.file.try_clone()?;
        f.seek(io::SeekFrom::Start(0))?;
        Ok(f)
    }

    /// The file's metadata when it was pinned (mode and owner decide who may exec it).
    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }

    /// Checks that what a launch would exec is still the pinned file, byte for byte.
    /// Blocking: it re-reads the whole file.
    pub fn verify(&self) -> Result<(), ExeError> {
        let path = &self.identity.path;
        let read = |source| ExeError::Read {
            path: path.clone(),
            source,
        };
        #[cfg(target_os = "linux")]
        let file = &self.file;
        // Launched by path here: check the file the path names now.
        #[cfg(not(target_os = "linux"))]
        let opened = File::open(path).map_err(|source| ExeError::Open {
            path: path.clone(),
            source,
        })?;
        #[cfg(not(target_os = "linux"))]
        let file = &opened;
        let now = file.metadata().map_err(read)?;
        let was = &self.meta;
        // Not ctime: unlinking the old file (a rename over its path) moves it too. A write
        // that restores mtime is still caught by the hash.
        let checks: [(&'static str, String, String); 4] = [
            ("device", was.dev().to_string(), now.dev().to_string()),
            ("inode", was.ino().to_string(), now.ino().to_string()),
            ("size", was.len().to_string(), now.len().to_string()),
            (
                "mtime",
                format!("{}.{:09}", was.mtime(), was.mtime_nsec()),
                format!("{}.{:09}", now.mtime(), now.mtime_nsec()),
            ),
        ];
        for (what, was, now) in checks {
            if was != now {
                return Err(self.changed(what, was, now));
            }
        }
        let sha256 = hash(file, now.len()).map_err(read)?;
        if sha256 != self.identity.sha256 {
            return Err(self.changed("sha256", self.identity.sha256.clone(), sha256));
        }
        Ok(())
    }

    fn changed(&self, what: &'static str, was: String, now: String) -> ExeError {
        ExeError::Changed {
            path: self.identity.path.clone(),
            what,
            was,
            now,
        }
    }

    /// Makes `cmd` exec the pinned bytes, with `argv` and exactly `env` (`K=V`), as its
    /// last step before exec (register it after every other `pre_exec` step). Linux only:
    /// elsewhere `cmd` execs its program path as usual, and this does nothing.
    ///
    /// The exec happens inside the closure because std would exec the path; std's own
    /// environment set-up runs after the closures, so `env` is passed here, whole.
    pub fn exec_pinned(
        &self,
        cmd: &mut Command,
        argv: &[&std::ffi::OsStr],
        env: &[(String, String)],
    ) -> io::Result<()> {
        self.exec_fd(cmd, argv, env, false)
    }

    /// [`Self::exec_pinned`] for a file that may be a script (`#!`): the kernel hands a
    /// script's interpreter `/dev/fd/N`, so the child execs a duplicate of the descriptor
    /// that stays open across the exec. For candidates of an upgrade, which are tested as
    /// they are, whatever they are.
    pub fn exec_pinned_any(
        &self,
        cmd: &mut Command,
        argv: &[&std::ffi::OsStr],
        env: &[(String, String)],
    ) -> io::Result<()> {
        self.exec_fd(cmd, argv, env, true)
    }

    /// Replaces this process with the pinned file (`argv`, `env`): the agent's re-exec
    /// onto a verified new binary, now at `at`. Returns only on failure. Linux: from the
    /// descriptor, so that exactly the verified bytes run; elsewhere from `at`, once it
    /// is the pinned file (device and inode).
    pub fn exec_self(
        &self,
        at: &Path,
        argv: &[std::ffi::OsString],
        env: &[(std::ffi::OsString, std::ffi::OsString)],
    ) -> io::Error {
        use std::os::unix::ffi::OsStrExt;
        let c = |s: &std::ffi::OsStr| c_string(s.as_bytes());
        let argv: Option<Vec<_>> = argv.iter().map(|a| c(a)).collect();
        let env: Option<Vec<_>> = env
            .iter()
            .map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                c_string(&kv)
            })
            .collect();
        let (Some(argv), Some(env)) = (argv, env) else {
            return io::Error::new(io::ErrorKind::InvalidInput, "NUL in an argument");
        };
        #[cfg(target_os = "linux")]
        {
            let _ = at;
            // A script's interpreter opens /dev/fd/N: it gets a duplicate without
            // close-on-exec. Anything else execs from the descriptor as it is, which then
            // does not stay open in the new program.
            let mut magic = [0u8; 2];
            let script = self.file.read_at(&mut magic, 0).is_ok_and(|n| n == 2) && &magic == b"#!";
            let result = if script {
                match nix::unistd::dup(&self.file) {
                    Ok(fd) => nix::unistd::fexecve(&fd, &argv, &env),
                    Err(e) => return e.into(),
                }
            } else {
                nix::unistd::fexecve(&self.file, &argv, &env)
            };
            match result {
                Ok(never) => match never {},
                Err(e) => e.into(),
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            // No exec from a descriptor: the path, once it names the pinned file.
            match std::fs::metadata(at) {
                Ok(m) if m.dev() == self.meta.dev() && m.ino() == self.meta.ino() => {}
                Ok(_) => {
                    return io::Error::other(format!(
                        "{} is no longer the verified file",
                        at.display()
                    ))
                }
                Err(e) => return e,
            }
            let Some(path) = c_string(at.as_os_str().as_bytes()) else {
                return io::Error::new(io::ErrorKind::InvalidInput, "NUL in the path");
            };
            match nix::unistd::execve(&path, &argv, &env) {
                Ok(never) => match never {},
                Err(e) => e.into(),
            }
        }
    }

    /// Copies the pinned bytes into `out` (from the descriptor, by offset), checking
    /// that they still hash to what was pinned. Blocking.
    pub fn copy_to(&self, out: &mut File) -> io::Result<()> {
        use std::io::Write;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 256 * 1024];
        let mut at = 0u64;
        let len = self.identity.size;
        while at < len {
            let n = self.file.read_at(&mut buf, at)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])?;
            at += n as u64;
        }
        let sha: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if at != len || sha != self.identity.sha256 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the pinned executable {} no longer reads as the file that was pinned",
                    self.identity.path.display()
                ),
            ));
        }
        out.sync_all()
    }

    fn exec_fd(
        &self,
        cmd: &mut Command,
        argv: &[&std::ffi::OsStr],
        env: &[(String, String)],
        inheritable: bool,
    ) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            use std::os::unix::ffi::OsStrExt;
            let nul = |_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in an argument");
            let argv = argv
                .iter()
                .map(|a| CString::new(a.as_bytes()).map_err(nul))
                .collect::<io::Result<Vec<_>>>()?;
            let env = env
                .iter()
                .map(|(k, v)| CString::new(format!("{k}={v}")).map_err(nul))
                .collect::<io::Result<Vec<_>>>()?;
            let exec = PinnedExec {
                argv_ptrs: pointers(&argv),
                env_ptrs: pointers(&env),
                _argv: argv,
                _env: env,
                fd: self.file.try_clone()?,
                inheritable,
            };
            // SAFETY: the closure runs in the forked child and makes at most two system
            // calls, dup and execveat, on a descriptor and pointer arrays prepared above;
            // it allocates nothing and takes no lock.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(cmd, move || {
                    let e = &exec;
                    let fd = if e.inheritable {
                        // dup's copy has no close-on-exec.
                        let fd = libc::dup(e.fd.as_raw_fd());
                        if fd < 0 {
                            return Err(io::Error::last_os_error());
                        }
                        fd
                    } else {
                        e.fd.as_raw_fd()
                    };
                    libc::syscall(
                        libc::SYS_execveat,
                        fd,
                        c"".as_ptr(),
                        e.argv_ptrs.as_ptr(),
                        e.env_ptrs.as_ptr(),
                        libc::AT_EMPTY_PATH,
                    );
                    // Only reached when the exec failed.
                    Err(io::Error::last_os_error())
                });
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (cmd, argv, env, inheritable);
        Ok(())
    }
}

/// A NUL-terminated string for exec, or `None` for one with a NUL inside.
fn c_string(bytes: &[u8]) -> Option<std::ffi::CString> {
    std::ffi::CString::new(bytes).ok()
}

/// A NUL-terminated array of pointers into `strings`.
#[cfg(target_os = "linux")]
fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// What the child needs to exec the pinned file, made before fork.
#[cfg(target_os = "linux")]
struct PinnedExec {
    argv_ptrs: Vec<*const libc::c_char>,
    env_ptrs: Vec<*const libc::c_char>,
    /// The strings the pointers point into; moved with them, never changed.
    _argv: Vec<CString>,
    _env: Vec<CString>,
    fd: File,
    /// Exec a duplicate that survives the exec (for scripts).
    inheritable: bool,
}

// SAFETY: the pointers point into the CStrings owned by the same struct, which are never
// changed or dropped before it; only the one child that runs the closure reads them.
#[cfg(target_os = "linux")]
unsafe impl Send for PinnedExec {}
// SAFETY: as above: nothing is ever written through the pointers.
#[cfg(target_os = "linux")]
unsafe impl Sync for PinnedExec {}

/// SHA-256 of the first `len` bytes of `file`, read by offset so that the descriptor's
/// position (shared with any child that inherited it) does not matter.
fn hash(file: &File, len: u64) -> io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut at = 0u64;
    while at < len {
        let n = file.read_at(&mut buf, at)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    // A file that shrank under us reads short; that is a change, not a hash.
    if at != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the file ended at byte {at} of {len}"),
        ));
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_running_executable_is_pinned_with_its_hash() {
        let exe = PinnedExe::current().unwrap();
        let id = exe.identity();
        let bytes = std::fs::read(&id.path).unwrap();
        assert_eq!(id.size, bytes.len() as u64);
        let want: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(id.sha256, want);
        exe.verify().unwrap();
    }

    #[test]
    fn bytes_changed_in_place_are_refused_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prog");
        std::fs::write(&path, b"#!/bin/sh\necho one\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe = PinnedExe::open(&path).unwrap();
        exe.verify().unwrap();
        // Same size, new bytes.
        std::fs::write(&path, b"#!/bin/sh\necho two\n").unwrap();
        let err = exe.verify().unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ExeError::Changed { .. }), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
    }

    #[test]
    fn a_replaced_path_does_not_change_the_pinned_file_on_linux() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prog");
        std::fs::write(&path, b"old").unwrap();
        let exe = PinnedExe::open(&path).unwrap();
        let tmp = dir.path().join("prog.new");
        std::fs::write(&tmp, b"new!").unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let verified = exe.verify();
        if cfg!(target_os = "linux") {
            // The descriptor still holds the old inode, unchanged.
            verified.unwrap();
        } else {
            assert!(matches!(verified, Err(ExeError::Changed { .. })));
        }
    }
}
