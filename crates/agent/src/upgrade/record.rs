//! `<state>/upgrade.json`: the one record of an upgrade in flight, shared by the agent
//! that starts it, the watcher that guards it and the agent that commits it, and the
//! versions remembered as bad. Every change is a read-modify-write under the flock of
//! `<state>/upgrade.lock`, and the file is replaced atomically, so the watcher's rollback
//! and the new agent's commit can never both win.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const FILE: &str = "upgrade.json";
const LOCK: &str = "upgrade.lock";
/// Bad versions remembered at most (oldest forgotten first).
const MAX_BAD: usize = 16;

/// Where an upgrade stands on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The old agent is replacing its binary; the new one has not been exec'd.
    Switching,
    /// The new binary is in place (and exec'd, or about to be); not committed yet.
    Pending,
    /// The new agent was healthy for the settle period and reached its hub.
    Committed,
    /// The watcher restored the previous binary after the new one ran.
    RolledBack,
    /// The switch did not get as far as running the new binary (the agent died or was
    /// stopped in it, a step failed): the previous binary is in place, and the version
    /// is not to blame.
    Aborted,
}

/// What started the upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The hub's desired version: downloaded and signature-checked.
    Hub,
    /// The executable replaced on disk by an operator or a package manager.
    Local,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadVersion {
    pub version: String,
    pub reason: String,
    /// Unix seconds.
    pub at: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upgrade {
    pub phase: Phase,
    pub kind: Kind,
    pub from: String,
    pub from_sha256: String,
    pub to: String,
    pub to_sha256: String,
    /// The executable's path (what is replaced, and restored).
    pub exe: PathBuf,
    /// Unix seconds.
    pub started_at: u64,
    /// Unix seconds by which the new agent must commit.
    pub deadline: u64,
    /// Starts of the new agent that got as far as reading this record.
    #[serde(default)]
    pub attempts: u32,
    /// The agent process (a re-exec keeps its pid) and its start time.
    pub agent_pid: u32,
    #[serde(default)]
    pub agent_start_time: Option<u64>,
    #[serde(default)]
    pub watcher_pid: Option<u32>,
    #[serde(default)]
    pub watcher_start_time: Option<u64>,
    /// Unix seconds when the old agent re-executed into the new binary (a local or hub
    /// switch that got that far): from then on a failure is the new version's.
    #[serde(default)]
    pub execed_at: Option<u64>,
    /// How much past `deadline` the watcher waits (seconds) while the new agent is
    /// healthy on its host and only the hub cannot be reached; set by the old agent, so
    /// the new binary cannot lengthen it. 0 in records of older builds: no wait.
    #[serde(default)]
    pub hub_wait: u64,
    /// Unix seconds when the new agent's runner had served for the settle period: healthy
    /// as far as the host can see.
    #[serde(default)]
    pub healthy_at: Option<u64>,
    /// Unix seconds of the new agent's latest word that it is healthy and the hub cannot
    /// be reached (a connection refused, a timeout, a 5xx or 429), renewed every few
    /// seconds while that lasts.
    #[serde(default)]
    pub hub_away_at: Option<u64>,
    /// Rolled back without blame (its hub stayed out of reach): the restored agent checks
    /// whether *it* reaches the hub, and blames the version after all if it does.
    #[serde(default)]
    pub blameless: bool,
    /// Why it was rolled back.
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub finished_at: Option<u64>,
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    #[serde(default)]
    pub upgrade: Option<Upgrade>,
    #[serde(default)]
    pub bad_versions: Vec<BadVersion>,
}

impl Record {
    pub fn is_bad(&self, version: &str) -> Option<&BadVersion> {
        self.bad_versions.iter().find(|b| b.version == version)
    }

    pub fn remember_bad(&mut self, version: &str, reason: &str) {
        self.bad_versions.retain(|b| b.version != version);
        self.bad_versions.push(BadVersion {
            version: version.to_owned(),
            reason: reason.to_owned(),
            at: crate::util::unix_now(),
        });
        let extra = self.bad_versions.len().saturating_sub(MAX_BAD);
        self.bad_versions.drain(..extra);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("could not lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not an upgrade record (move it away to start over)")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("could not write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// The record, read without the lock (for a status display); an absent file is empty.
pub fn peek(state_dir: &Path) -> Result<Record, RecordError> {
    read(&path(state_dir))
}

fn read(path: &Path) -> Result<Record, RecordError> {
    match crate::small_file::read(path, crate::small_file::CONFIG_MAX) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| RecordError::Corrupt {
            path: path.to_owned(),
            source,
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Record::default()),
        Err(source) => Err(RecordError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Reads the record under its lock, lets `f` change it, and writes it back when `f`
/// says so (returns `(true, out)`). Blocking: the lock waits for the other party.
pub fn update<T>(
    state_dir: &Path,
    f: impl FnOnce(&mut Record) -> (bool, T),
) -> Result<T, RecordError> {
    locked(state_dir, true, f).map(|o| o.expect("a blocking lock is always taken"))
}

/// [`update`] if the lock is free now; `None` when the other party holds it (the
/// watcher, in the middle of a rollback: an agent must not wait on it, since the
/// watcher may be waiting for that agent to exit).
pub fn try_update<T>(
    state_dir: &Path,
    f: impl FnOnce(&mut Record) -> (bool, T),
) -> Result<Option<T>, RecordError> {
    locked(state_dir, false, f)
}

fn locked<T>(
    state_dir: &Path,
    wait: bool,
    f: impl FnOnce(&mut Record) -> (bool, T),
) -> Result<Option<T>, RecordError> {
    let lock_path = state_dir.join(LOCK);
    let lock = open_lock(&lock_path)?;
    let err = |source| RecordError::Lock {
        path: lock_path.clone(),
        source,
    };
    if wait {
        fs4::FileExt::lock(&lock).map_err(err)?;
    } else {
        match fs4::FileExt::try_lock(&lock) {
            Ok(()) => {}
            Err(fs4::TryLockError::WouldBlock) => return Ok(None),
            Err(fs4::TryLockError::Error(e)) => return Err(err(e)),
        }
    }
    let path = path(state_dir);
    let mut record = read(&path)?;
    let (changed, out) = f(&mut record);
    if changed {
        let mut bytes = serde_json::to_vec_pretty(&record).map_err(|e| RecordError::Write {
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        bytes.push(b'\n');
        crate::util::write_atomic(&path, &bytes, 0o600)
            .map_err(|source| RecordError::Write { path, source })?;
    }
    drop(lock);
    Ok(Some(out))
}

fn open_lock(path: &Path) -> Result<File, RecordError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| RecordError::Lock {
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_versions_are_kept_once_and_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        update(dir.path(), |r| {
            for n in 0..20 {
                r.remember_bad(&format!("1.0.{n}"), "crashed");
            }
            r.remember_bad("1.0.19", "again");
            (true, ())
        })
        .expect("update");
        let r = peek(dir.path()).expect("peek");
        assert_eq!(r.bad_versions.len(), MAX_BAD);
        assert_eq!(
            r.bad_versions.last().map(|b| b.reason.as_str()),
            Some("again")
        );
        assert!(r.is_bad("1.0.0").is_none(), "the oldest are forgotten");
        assert!(r.is_bad("1.0.19").is_some());
    }
}
