//! `hub serve --config FILE`: what a replica's command line should not carry. Today
//! that is the store's URL, which may hold the database password (`ps` shows every
//! argument to every account).
//!
//! ```toml
//! [store]
//! url = "postgres://railgrid:secret@db.internal/railgrid?sslmode=require"
//! ```
//!
//! Unknown keys are errors; a file whose URL holds a password must be 0600 (or
//! stricter) and belong to the hub's account or root.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HubConfig {
    store: Option<StoreSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreSection {
    url: String,
}

/// The store URL: `--store` or the config file's (never both: clap refuses), else none
/// (SQLite).
pub(super) fn store_url(
    flag: Option<String>,
    file: Option<&Path>,
) -> anyhow::Result<Option<String>> {
    let from_file = match file {
        Some(path) => read(path)?,
        None => None,
    };
    if let Some(u) = flag
        .as_deref()
        .filter(|u| crate::hub::store::postgres::redact(u) != *u)
    {
        tracing::warn!(store = %crate::hub::store::postgres::redact(u), "the database password is on the command line, where every account on this host can read it (ps): put the URL in --config FILE (0600)");
    }
    let url = flag.or(from_file);
    if let Some(u) = &url {
        if !(u.starts_with("postgres://") || u.starts_with("postgresql://")) {
            anyhow::bail!(
                "the store {} is not a postgres:// URL (without --store the hub keeps SQLite in its data dir)",
                crate::hub::store::postgres::redact(u)
            );
        }
    }
    Ok(url)
}

fn read(path: &Path) -> anyhow::Result<Option<String>> {
    let file = crate::small_file::SmallFile::open(path)
        .map_err(|e| anyhow::anyhow!("cannot read the hub config {}: {e}", path.display()))?;
    let meta = file.meta().clone();
    let text = file
        .read_string(crate::small_file::KEY_MAX)
        .map_err(|e| anyhow::anyhow!("cannot read the hub config {}: {e}", path.display()))?;
    // toml's messages quote the line: never the file's text, which may be a password.
    let cfg: HubConfig = toml::from_str(&text).map_err(|e| {
        let at = e
            .span()
            .map(|s| format!(" (line {})", text[..s.start].lines().count().max(1)))
            .unwrap_or_default();
        anyhow::anyhow!(
            "the hub config {} is not valid{at}: {}",
            path.display(),
            e.message()
        )
    })?;
    let Some(store) = cfg.store else {
        // Given a config, a replica meant to share a database: starting alone on SQLite
        // instead would split the fleet.
        anyhow::bail!(
            "the hub config {} has no [store] url: give the database (url = \"postgres://…\"), or leave --config out for SQLite in the data dir",
            path.display()
        );
    };
    let has_password = crate::hub::store::postgres::redact(&store.url) != store.url;
    if has_password && crate::small_file::private(&meta).is_err() {
        let mode = meta.permissions().mode() & 0o777;
        anyhow::bail!(
            "the hub config {} holds the database password but is mode {mode:04o}, owner uid {}: make it the hub's own and chmod 600 {}",
            path.display(),
            meta.uid(),
            path.display()
        );
    }
    Ok(Some(store.url))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str, mode: u32) -> std::path::PathBuf {
        let p = dir.join("hub.toml");
        std::fs::write(&p, text).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
        p
    }

    #[test]
    fn the_flag_wins_and_a_password_needs_a_private_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plain = write(dir.path(), "[store]\nurl = \"postgres://db/x\"\n", 0o644);
        assert_eq!(
            store_url(None, Some(&plain)).expect("read"),
            Some("postgres://db/x".into())
        );
        let secret = write(
            dir.path(),
            "[store]\nurl = \"postgres://u:pw@db/x\"\n",
            0o644,
        );
        let e = store_url(None, Some(&secret)).expect_err("readable password");
        assert!(e.to_string().contains("chmod 600"), "{e}");
        assert!(!e.to_string().contains("pw@"), "{e}");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(store_url(None, Some(&secret)).expect("private").is_some());
        let bad = write(
            dir.path(),
            "[store]\nurl = \"postgres://u:Secr3t-Word@db/x\"\nport = 1\n",
            0o600,
        );
        let e = store_url(None, Some(&bad)).expect_err("unknown key");
        // A distinctive password: a temporary directory's random name can hold any short one.
        assert!(!e.to_string().contains("Secr3t-Word"), "{e}");
        assert!(store_url(Some("mysql://x".into()), None).is_err());
        let empty = write(dir.path(), "# [store]\n", 0o600);
        let e = store_url(None, Some(&empty)).expect_err("no store");
        assert!(e.to_string().contains("no [store] url"), "{e}");
        assert_eq!(store_url(None, None).expect("none"), None);
    }
}
