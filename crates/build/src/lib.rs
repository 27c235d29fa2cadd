//! What this binary is: version, commit and target, fixed at build time.

use serde::{Deserialize, Serialize};

/// The version this binary reports; `RAILGRID_BUILD_VERSION` at build time overrides the
/// crate version.
pub const VERSION: &str = env!("RAILGRID_VERSION");
/// The git commit it was built from, empty when unknown.
pub const COMMIT: &str = env!("RAILGRID_COMMIT");
/// The target triple it was built for.
pub const TARGET: &str = env!("RAILGRID_TARGET");

/// `railgrid version --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildInfo {
    pub version: String,
    pub commit: Option<String>,
    pub target: String,
}

pub fn current() -> BuildInfo {
    BuildInfo {
        version: VERSION.to_owned(),
        commit: (!COMMIT.is_empty()).then(|| COMMIT.to_owned()),
        target: TARGET.to_owned(),
    }
}
