//! What an upgrade can run into: refusals (nothing was tried), and failures of the
//! download, the checks or the switch, each naming the file or URL at fault.

use std::path::PathBuf;

use thiserror::Error;

use super::record::RecordError;
use crate::release::SignatureError;
use crate::sys::exe::ExeError;

#[derive(Debug, Error)]
pub enum UpgradeError {
    #[error("{path} belongs to the package {package}: the package manager upgrades it (apt install railgrid={version}, or ./railgrid_{version}_<arch>.deb), never the agent (docs/upgrade.md)")]
    Packaged {
        path: PathBuf,
        package: String,
        version: String,
    },
    #[error("no [upgrade] trusted_keys are configured: every upgrade from the hub is refused (add the publisher's RW… key line, or --trusted-key)")]
    NoKeys,
    #[error("the hub has no release of {version} for {platform}")]
    NoArtifact { version: String, platform: String },
    #[error("{to} is older than {from}: a downgrade is refused unless the hub asks for it (hub desired set --rollback true)")]
    Downgrade { from: String, to: String },
    #[error("cannot tell whether {to} is older than {from} (not semantic versions): refused unless the hub asks for it (hub desired set --rollback true)")]
    Unordered { from: String, to: String },
    #[error("{version} was rolled back on this host ({reason}): it is not tried again until the hub asks for another version, or `railgrid agent upgrade --clear-bad`")]
    Bad { version: String, reason: String },
    #[error("the artifact's URL {url:?} is not on the agent's hub {hub}: refused")]
    ForeignUrl { url: String, hub: String },
    #[error("the download of {url} failed: {why}")]
    Download { url: String, why: String },
    #[error("{url} sent more than the {size} bytes the desired state names: refused")]
    TooLarge { url: String, size: u64 },
    #[error("not enough space in {dir}: the download needs {need} more bytes, {free} are free")]
    NoSpace { dir: PathBuf, need: u64, free: u64 },
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not read the new binary {path}")]
    Pin {
        path: PathBuf,
        #[source]
        source: ExeError,
    },
    #[error("the new binary {path} is {got} bytes, not the {want} the desired state names")]
    Size { path: PathBuf, want: u64, got: u64 },
    #[error("the new binary {path} has SHA-256 {got}, not the {want} the desired state names")]
    Hash {
        path: PathBuf,
        want: String,
        got: String,
    },
    #[error("release {version} is refused: {source}")]
    Signature {
        version: String,
        #[source]
        source: SignatureError,
    },
    #[error("release {version} is refused: its signature says it is {signed:?}")]
    SignedVersion { version: String, signed: String },
    #[error("the new binary {path} failed its test run: {why}")]
    TestRun { path: PathBuf, why: String },
    #[error("the new binary reports version {got}, not {want}")]
    WrongVersion { want: String, got: String },
    #[error("the executable {path} has no directory or name to upgrade in")]
    NoDir { path: PathBuf },
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("could not start the upgrade watcher")]
    Watcher(#[source] std::io::Error),
    #[error("the upgrade record changed during the switch (its watcher ended it): not switching")]
    Superseded,
    #[error("the agent is stopping: not switching")]
    Stopping,
    #[error("the upgrade's {what} failed")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl UpgradeError {
    /// Errors that no retry of the same artifact can fix.
    pub(super) fn is_refusal(&self) -> bool {
        matches!(
            self,
            UpgradeError::NoKeys
                | UpgradeError::Packaged { .. }
                | UpgradeError::NoArtifact { .. }
                | UpgradeError::Downgrade { .. }
                | UpgradeError::Unordered { .. }
                | UpgradeError::Bad { .. }
                | UpgradeError::ForeignUrl { .. }
                | UpgradeError::Signature { .. }
                | UpgradeError::SignedVersion { .. }
                | UpgradeError::WrongVersion { .. }
                | UpgradeError::TestRun { .. }
                | UpgradeError::Hash { .. }
                | UpgradeError::Size { .. }
                | UpgradeError::TooLarge { .. }
        )
    }
}
