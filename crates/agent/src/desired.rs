//! The desired state in force: `<state>/desired.json`, the hub's desired state as it was
//! last applied (kept by the reconciler, read at start so that a host restarted while its
//! hub is down comes back as it was last told), and [`Observed`], the watch on which the
//! reconciler publishes what it applied and observes for the hub and upgrade tasks.

use std::path::{Path, PathBuf};

use thiserror::Error;

use super::config::AgentConfig;
use crate::proto::desired::{self, DesiredState};
use crate::supervisor::Status;

/// The desired state last applied from the hub, inside the state directory.
pub(crate) const DESIRED_FILE: &str = "desired.json";

/// What keeping or reading `<state>/desired.json` can run into.
#[derive(Debug, Error)]
pub(crate) enum DesiredError {
    #[error("could not write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a desired state")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path} holds a desired state no hub hands out")]
    Invalid {
        path: PathBuf,
        #[source]
        source: desired::Invalid,
    },
    #[error("the agent's {what} failed")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

/// What the reconciler has applied and what it observes of the runner: published on a
/// watch channel, from which the hub task builds its reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Observed {
    /// The desired state in force, as it was given (a hub's limits not yet merged with
    /// the config file's), without jobs: the hub task hands those to the jobs task.
    pub(super) desired: DesiredState,
    /// How many desired states from the hub have been handled (applied or refused): the
    /// hub task waits for this to move before it reports again.
    pub(super) handled: u64,
    /// Why the last desired state from the hub was not applied; `None` when it was.
    pub(super) refused: Option<String>,
    /// The runner's status, `starts` over the agent's life.
    pub(super) runner: Status,
}

/// `<state>/desired.json`.
pub(crate) fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(DESIRED_FILE)
}

/// Keeps `desired` in `<state>/desired.json` (0600, replaced atomically): a start while
/// the hub is unreachable begins from it. It holds settings only (never a job's spec,
/// which may carry what its submitter would not have on every host's disk). Blocking
/// (fsync).
pub(super) fn persist(state_dir: &Path, desired: &DesiredState) -> Result<(), DesiredError> {
    let path = path(state_dir);
    let mut bytes = serde_json::to_vec_pretty(desired).map_err(|e| DesiredError::Write {
        path: path.clone(),
        source: std::io::Error::other(e),
    })?;
    bytes.push(b'\n');
    crate::util::write_atomic(&path, &bytes, 0o600)
        .map_err(|source| DesiredError::Write { path, source })
}

/// The desired state [`persist`] kept, if there is one. Blocking (a file read).
pub(super) fn load(state_dir: &Path) -> Result<Option<DesiredState>, DesiredError> {
    let path = path(state_dir);
    // Written pretty-printed from an answer of up to 1 MiB of compact JSON: room for that.
    let bytes = match crate::small_file::read(&path, 8 * crate::small_file::CONFIG_MAX) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(DesiredError::Read { path, source }),
    };
    let desired: DesiredState =
        serde_json::from_slice(&bytes).map_err(|source| DesiredError::Corrupt {
            path: path.clone(),
            source,
        })?;
    desired
        .check()
        .map_err(|source| DesiredError::Invalid { path, source })?;
    Ok(Some(desired))
}

/// The desired state an agent with a hub starts from: the one it applied last, kept in
/// `<state>/desired.json`, so that a host restarted while its hub is down comes back as
/// it was last told; without one (or with one that cannot be read), the embedded
/// default (runner enabled, the config file's limits) at generation 0, which any
/// desired state of the hub supersedes.
pub(super) async fn initial_from_hub(cfg: &AgentConfig) -> DesiredState {
    let state_dir = cfg.state_dir.clone();
    let kept = tokio::task::spawn_blocking(move || load(&state_dir))
        .await
        .unwrap_or_else(|source| {
            Err(DesiredError::Task {
                what: "desired state read",
                source,
            })
        });
    match kept {
        Ok(Some(mut d)) => {
            // Jobs are the runner's once it has them, and the hub's until then: what an
            // older agent kept of them is not a job to start.
            d.jobs.clear();
            d.cancel_jobs.clear();
            tracing::info!(generation = d.generation, runner_enabled = d.runner.enabled, path = %path(&cfg.state_dir).display(), "starting from the desired state the hub gave last");
            d
        }
        Ok(None) => DesiredState::default(),
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "ignoring the kept desired state; starting from the standalone default until the hub answers");
            DesiredState::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_persisted_desired_state_beyond_the_bound_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(path(dir.path()), r#"{"generation": 9007199254740993}"#).expect("write");
        let err = load(dir.path()).expect_err("beyond");
        assert!(matches!(err, DesiredError::Invalid { .. }), "{err}");
    }

    #[test]
    fn the_persisted_desired_state_round_trips_and_a_corrupt_one_is_an_error() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(load(dir.path()).expect("none").is_none());
        let mut d = DesiredState {
            generation: 4,
            ..DesiredState::default()
        };
        d.runner.enabled = false;
        persist(dir.path(), &d).expect("persist");
        let mode = std::fs::metadata(path(dir.path()))
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load(dir.path()).expect("read"), Some(d));
        std::fs::write(path(dir.path()), "{not json").expect("corrupt");
        let err = load(dir.path()).expect_err("corrupt");
        assert!(
            err.to_string().contains(DESIRED_FILE),
            "the error names the file: {err}"
        );
    }
}
