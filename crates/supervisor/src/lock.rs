//! The runner lock, and reclaiming a runner orphaned by a killed agent.
//!
//! The runner holds an exclusive `flock` on its lock file for its whole life and writes its
//! pid into it. The kernel drops the lock when the holder dies, so "held" always means "a
//! live process has it". When an agent is killed without stopping its runner (SIGKILL, OOM;
//! macOS has no parent-death signal), the runner lives on holding the lock; the next agent
//! finds it here and terminates it before it starts its own.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

use crate::proc_tree::{Group, GroupError};
use crate::sys::group;
use crate::sys::{locks, ProcessId};

/// How long a holder may take to die after SIGKILL before reclaim reports failure.
const KILL_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
pub enum LockError {
    #[error("could not open lock file {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("another runner (pid {pid}) holds {path}")]
    Held { path: PathBuf, pid: i32 },
    #[error("another process holds {path} but wrote no pid into it")]
    HeldUnknown { path: PathBuf },
    #[error("could not lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not write pid to lock file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is locked, but the kernel lists pid(s) {holders:?} as its holder while the file names pid {named}: refusing to signal anything")]
    NotTheHolder {
        path: PathBuf,
        named: i32,
        holders: Vec<i32>,
    },
    #[error("refusing to signal pid {pid}, named in {path}: {why}")]
    Unsafe {
        path: PathBuf,
        pid: i32,
        why: &'static str,
    },
    #[error("could not signal pid {pid}, the stale holder of {path}")]
    Signal {
        path: PathBuf,
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("pid {pid} still holds {path} {waited:?} after SIGKILL")]
    Survived {
        path: PathBuf,
        pid: i32,
        waited: Duration,
    },
}

/// A held lock file with our pid in it (the runner's, or the agent's own instance lock).
/// Dropping it (or the process dying) releases the lock.
#[derive(Debug)]
pub struct PidLock {
    _file: File,
    path: PathBuf,
}

impl PidLock {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Takes the exclusive lock on `path` (created 0600) and records our pid in it, truncated
/// and fsynced so a reader never sees a stale or partial pid. Fails at once, naming the
/// holder, when another process holds it.
pub fn acquire(path: &Path) -> Result<PidLock, LockError> {
    let mut file = open(path, true)?;
    match fs4::FileExt::try_lock(&file) {
        Ok(()) => {}
        Err(fs4::TryLockError::WouldBlock) => {
            // The kernel's word first: the holder may not have written its pid yet, and
            // the file may still name the one before it.
            let kernel = locks::flock_holders(&file)
                .ok()
                .flatten()
                .and_then(|h| h.first().copied());
            return Err(match kernel.or_else(|| read_pid(&mut file)) {
                Some(pid) => LockError::Held {
                    path: path.to_owned(),
                    pid,
                },
                None => LockError::HeldUnknown {
                    path: path.to_owned(),
                },
            });
        }
        Err(fs4::TryLockError::Error(source)) => {
            return Err(LockError::Lock {
                path: path.to_owned(),
                source,
            })
        }
    }
    // Over the old pid, then cut to length: a reader never finds the file empty.
    let write = |file: &mut File| -> io::Result<()> {
        let line = format!("{}\n", std::process::id());
        file.seek(SeekFrom::Start(0))?;
        file.write_all(line.as_bytes())?;
        file.set_len(line.len() as u64)?;
        file.sync_all()
    };
    write(&mut file).map_err(|source| LockError::Write {
        path: path.to_owned(),
        source,
    })?;
    Ok(PidLock {
        _file: file,
        path: path.to_owned(),
    })
}

/// Terminates the process that holds the lock on `lock_path` — and its process group when
/// it leads one — and returns its pid; returns `None` when the lock is free or absent.
///
/// The holder is verified before any signal: on Linux the kernel's lock table must list
/// the pid written in the file as the holder; elsewhere the lock must still be held after
/// the pid was read and that pid must be alive. A pid that does not hold the lock, pid 0
/// or 1, our own pid and our own group are never signalled. The group is signalled only
/// when the holder leads it (a runner started by the supervisor always does), so a runner
/// started by hand from a shell never takes the shell's job down with it.
///
/// Blocking: call it from a blocking context.
pub fn reclaim_stale_holder(lock_path: &Path, grace: Duration) -> Result<Option<i32>, LockError> {
    let mut file = match open(lock_path, false) {
        Ok(f) => f,
        Err(LockError::Open { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    if try_lock(&file, lock_path)? {
        return Ok(None);
    }
    let Some(named) = read_pid(&mut file) else {
        return Err(LockError::HeldUnknown {
            path: lock_path.to_owned(),
        });
    };
    let unsafe_pid = |why| LockError::Unsafe {
        path: lock_path.to_owned(),
        pid: named,
        why,
    };
    let pid =
        ProcessId::new(named).ok_or_else(|| unsafe_pid("pids 0 and 1 are never signalled"))?;
    if pid == ProcessId::current() {
        return Err(unsafe_pid("it is this process"));
    }
    match locks::flock_holders(&file).map_err(|source| LockError::Lock {
        path: lock_path.to_owned(),
        source,
    })? {
        Some(holders) if holders.contains(&named) => {}
        Some(holders) if holders.is_empty() && try_lock(&file, lock_path)? => return Ok(None),
        Some(holders) => {
            return Err(LockError::NotTheHolder {
                path: lock_path.to_owned(),
                named,
                holders,
            })
        }
        None => {
            // No kernel table: the lock must still be held now that the pid is read, and
            // the pid must be alive.
            if try_lock(&file, lock_path)? {
                return Ok(None);
            }
            if !group::process_alive(pid) {
                return Err(LockError::NotTheHolder {
                    path: lock_path.to_owned(),
                    named,
                    holders: Vec::new(),
                });
            }
        }
    }

    // The holder must run as the account that owns the lock file (the runner's): a pid
    // planted by anyone else never gets a root-sent signal.
    let owner = std::os::unix::fs::MetadataExt::uid(&file.metadata().map_err(|source| {
        LockError::Open {
            path: lock_path.to_owned(),
            source,
        }
    })?);
    if let Some(uid) = crate::sys::process_uid(pid) {
        if uid != owner {
            return Err(unsafe_pid(
                "it runs as another user than the owner of the lock file",
            ));
        }
    }
    let leads_group = group::group_of(pid)
        .ok()
        .flatten()
        .is_some_and(|pg| pg == named && pg != group::own_group());
    let group_err = |e| match e {
        GroupError::Signal { source, .. } => LockError::Signal {
            path: lock_path.to_owned(),
            pid: named,
            source,
        },
        GroupError::Refused { why, .. } => unsafe_pid(why),
    };
    // Its whole group when it leads one, else only the holder.
    let target = if leads_group {
        Group::new("stale lock holder", named)
    } else {
        Group::lone("stale lock holder", pid)
    }
    .map_err(group_err)?;
    // The holder as it is now (start time, where the OS tells it): should it exit during
    // the grace and its pid be reused, the SIGKILL finds another process and is not sent.
    let target = match crate::sys::process_start_time(pid) {
        Some(start) => target.verified(pid, start),
        None => target,
    };
    tracing::warn!(pid = named, lock = %lock_path.display(), group = leads_group, "reclaiming stale lock holder: SIGTERM");
    // A lock that cannot be tried ends the wait; the error is returned below.
    let mut failed = None;
    let released = || match try_lock(&file, lock_path) {
        Ok(free) => free,
        Err(e) => {
            failed = Some(e);
            true
        }
    };
    let out = target
        .terminate_blocking(grace, KILL_WAIT, released, || {
            tracing::warn!(pid = named, lock = %lock_path.display(), "stale lock holder outlived its grace period: SIGKILL");
        })
        .map_err(group_err)?;
    if let Some(e) = failed {
        return Err(e);
    }
    if !out.survivors {
        return Ok(Some(named));
    }
    Err(LockError::Survived {
        path: lock_path.to_owned(),
        pid: named,
        waited: KILL_WAIT,
    })
}

/// Tries the lock and, when it was free, releases it at once: reclaim only looks.
fn try_lock(file: &File, path: &Path) -> Result<bool, LockError> {
    match fs4::FileExt::try_lock(file) {
        Ok(()) => {
            fs4::FileExt::unlock(file).map_err(|source| LockError::Lock {
                path: path.to_owned(),
                source,
            })?;
            Ok(true)
        }
        Err(fs4::TryLockError::WouldBlock) => Ok(false),
        Err(fs4::TryLockError::Error(source)) => Err(LockError::Lock {
            path: path.to_owned(),
            source,
        }),
    }
}

fn open(path: &Path, create: bool) -> Result<File, LockError> {
    let mut opts = OpenOptions::new();
    // O_NONBLOCK: a FIFO planted in place of the lock must not hang the opener.
    opts.read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK);
    if create {
        opts.write(true).create(true).truncate(false).mode(0o600);
    }
    let err = |source| LockError::Open {
        path: path.to_owned(),
        source,
    };
    let file = opts.open(path).map_err(err)?;
    if !file.metadata().map_err(err)?.is_file() {
        return Err(err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    Ok(file)
}

fn read_pid(file: &mut File) -> Option<i32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(64).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}
