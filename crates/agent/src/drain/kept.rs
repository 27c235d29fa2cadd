//! Drains kept in the agent's state directory, so that they outlive agent restarts,
//! reboots and kill -9:
//! - `host-drain.json`, the host's own: written by `railgrid agent drain`, removed by
//!   `railgrid agent resume`, read by the agent at its start and on SIGHUP. An operator
//!   who drained a host before maintenance finds it drained after, until they resume it.
//! - `upgrade-drain.json`, an upgrade's: written before the runner drains for a switch,
//!   removed once no upgrade waits; an agent killed while it drained starts drained.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::proto::drain::Drain;

/// The host's drain, inside the agent's state directory.
pub const HOST_DRAIN_FILE: &str = "host-drain.json";
/// An upgrade's drain, beside it.
pub const UPGRADE_DRAIN_FILE: &str = "upgrade-drain.json";
/// What a host drain says of itself.
pub const HOST_REASON: &str = "drained on the host (`railgrid agent drain`)";
/// The file is a few hundred bytes; a larger one is not ours.
const MAX_FILE: u64 = 64 * 1024;

#[derive(Debug, Error)]
pub enum KeptError {
    #[error("could not write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not remove {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The drain kept as `name` in `state_dir`, if there is one. A file that cannot be read
/// is a drain (its reason says why): the host was told to take no new job, and keeps to
/// it until told otherwise. Blocking.
pub fn read(state_dir: &Path, name: &str) -> Option<Drain> {
    let path = state_dir.join(name);
    let unreadable = |e: &dyn std::fmt::Display| {
        tracing::warn!(path = %path.display(), error = %e, "a kept drain cannot be read: draining until it is ended");
        Drain {
            reason: crate::util::clip_to(&format!("{} could not be read", path.display()), 200)
                .into_owned(),
            since_ms: crate::util::unix_now_ms(),
            deadline_ms: None,
        }
    };
    match crate::small_file::read(&path, MAX_FILE) {
        Ok(bytes) => match serde_json::from_slice::<Drain>(&bytes) {
            Ok(d) if d.check().is_ok() => Some(d),
            Ok(_) => Some(unreadable(&"not a valid drain")),
            Err(e) => Some(unreadable(&e)),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(unreadable(&e)),
    }
}

/// Keeps `drain` as `name` (0600, replaced atomically, fsynced). Blocking.
pub fn write(state_dir: &Path, name: &str, drain: &Drain) -> Result<(), KeptError> {
    let path = state_dir.join(name);
    let bytes = serde_json::to_vec_pretty(drain).map_err(|e| KeptError::Write {
        path: path.clone(),
        source: std::io::Error::other(e),
    })?;
    crate::util::write_atomic(&path, &bytes, 0o600)
        .map_err(|source| KeptError::Write { path, source })
}

/// Removes the drain kept as `name`; true if there was one. Blocking.
pub fn remove(state_dir: &Path, name: &str) -> Result<bool, KeptError> {
    let path = state_dir.join(name);
    let removed =
        crate::sys::dirfd::Dir::open(state_dir).and_then(|dir| match dir.remove_file(name) {
            Ok(()) => dir.sync().map(|()| true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        });
    removed.map_err(|source| KeptError::Remove { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_outlives_its_writer_and_an_unreadable_one_still_drains() {
        let dir = tempfile::tempdir().expect("tempdir");
        let name = HOST_DRAIN_FILE;
        assert_eq!(read(dir.path(), name), None);
        let d = Drain {
            reason: HOST_REASON.into(),
            since_ms: 5,
            deadline_ms: Some(9),
        };
        write(dir.path(), name, &d).expect("write");
        assert_eq!(read(dir.path(), name), Some(d));
        std::fs::write(dir.path().join(name), b"{not json").expect("corrupt");
        let kept = read(dir.path(), name).expect("still draining");
        assert!(kept.reason.contains("could not be read"), "{kept:?}");
        assert!(remove(dir.path(), name).expect("remove"));
        assert!(!remove(dir.path(), name).expect("again"));
        assert_eq!(read(dir.path(), name), None);
    }
}
