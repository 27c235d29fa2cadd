//! The files the admin commands write a new token to: 0600, never over another file.

use std::path::Path;

use anyhow::Context;

use super::usage;

/// A new file for a token, 0600; an existing file is not overwritten (it may be another
/// agent's token). A usage error: nothing was enrolled yet.
pub(super) fn create_token_file(path: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("could not create {} for the token", path.display()))
        .map_err(usage)
}

pub(super) fn write_token(mut f: std::fs::File, path: &Path, token: &str) -> anyhow::Result<()> {
    use std::io::Write;
    f.write_all(format!("{token}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| {
            format!(
                "could not write the token to {} (the agent is enrolled: revoke and add it again once the path is fixed)",
                path.display()
            )
        })
}
