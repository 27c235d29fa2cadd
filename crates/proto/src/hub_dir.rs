//! What a hub leaves in its data directory for the admin commands of its host (`hub.json`,
//! `admin.token`), and the header a release upload carries its signature in: read by the
//! admin client, written by the hub, so kept by neither.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The root admin token's file in the data directory.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";
/// Where the hub says it serves, in the data directory.
pub const HUB_FILE: &str = "hub.json";
/// The header of `PUT /v1/admin/releases/…` that carries the release's minisign
/// signature, hex-encoded.
pub const SIGNATURE_HEADER: &str = "x-railgrid-signature";

/// `<data>/hub.json`: where the hub serves, for the admin commands on its host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HubFile {
    pub url: String,
    pub listen: String,
    pub pid: u32,
    /// The CA agents pin, when the hub made its own.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Where `/metrics` is served in plain HTTP (`--metrics-listen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
}
