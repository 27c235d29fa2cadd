//! What an install put on the host, kept beside the config (`/etc/railgrid/install.json`),
//! so that uninstall removes exactly that: the binary under the prefix it was installed
//! to, and the directories that did not exist before.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::InstallError;

/// The manifest's path on the host (under `--root`, below that directory).
pub(super) const PATH: &str = "/etc/railgrid/install.json";

/// Fields it does not know are ignored: an older uninstall still reads a newer manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Manifest {
    /// `systemd` or `launchd`.
    pub service: String,
    pub prefix: PathBuf,
    /// Prefixes of earlier installs whose binaries and directories are still to go (an
    /// install that moved the prefix and was interrupted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous_prefixes: Vec<PathBuf>,
    /// Directories created by installs, as host paths, parents first.
    #[serde(default)]
    pub created_dirs: Vec<PathBuf>,
    /// The runner's account, and whether an install created it.
    pub runner_user: Option<String>,
    #[serde(default)]
    pub created_account: bool,
    /// The version that wrote this.
    pub installed_by: String,
}

/// Reads the manifest at `path` (already under the root): `None` when there is none.
pub(super) fn read(path: &Path) -> Result<Option<Manifest>, InstallError> {
    let Some(bytes) = super::root::read_regular(path, 1 << 20)? else {
        return Ok(None);
    };
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| InstallError::BadManifest {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    // Nothing in it is believed unchecked: it names what uninstall removes.
    let plain = |p: &Path| super::templates::check_plain(p).is_ok();
    if !plain(&manifest.prefix)
        || !manifest.previous_prefixes.iter().all(|p| plain(p))
        || !manifest
            .created_dirs
            .iter()
            .all(|d| super::root::check_host_path(d).is_ok())
    {
        return Err(InstallError::BadManifest {
            path: path.to_owned(),
            message: "a prefix or directory in it is not a plain absolute path".into(),
        });
    }
    Ok(Some(manifest))
}

impl Manifest {
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a manifest serializes");
        bytes.push(b'\n');
        bytes
    }
}
