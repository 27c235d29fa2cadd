//! `railgrid hub store renumber`: the way back from a generation counter near the end of
//! its range ([`crate::proto::desired::MAX_GENERATION`]).
//!
//! No agent's report moves the counter (they are answered with the hub's own state when
//! ahead of it), so only changes made through the hub do, and 2^53 of them take centuries.
//! Should the end come near anyway (a database edited by hand, a restored backup of
//! another hub), this starts the counter over at 1 with every hub stopped. Each agent is
//! marked [`MUST_RESET`]: at its next reconcile it is told to report 0, and then takes the
//! hub's desired state as a reset (docs/hub.md, "Generations"). Settings, jobs, tokens
//! and releases are untouched.

use std::path::Path;

use super::store::postgres::PgStore;
use super::store::sqlite::SqliteStore;
use super::store::Store;
#[cfg(doc)]
use super::store::MUST_RESET;
use super::{HubError, DB_FILE};

/// What was renumbered: the counter before, and where.
#[derive(Debug)]
pub struct Renumbered {
    pub was: u64,
    pub store: String,
}

/// Renumbers the SQLite store in `data_dir` (holding its lock: no hub may be serving it),
/// or the PostgreSQL database at `url` (refused while a hub is connected to it).
pub async fn renumber(data_dir: Option<&Path>, url: Option<&str>) -> Result<Renumbered, HubError> {
    match (url, data_dir) {
        (Some(url), _) => {
            let store =
                PgStore::connect_as(url, super::store::postgres::MAINTENANCE_APPLICATION).await?;
            let hubs = store.hubs_connected().await?;
            if !hubs.is_empty() {
                return Err(HubError::HubsConnected {
                    store: super::store::postgres::redact(url),
                    from: hubs.join(", "),
                });
            }
            Ok(Renumbered {
                was: store.renumber().await?,
                store: super::store::postgres::redact(url),
            })
        }
        (None, Some(dir)) => {
            let path = dir.join(DB_FILE);
            if !path.exists() {
                return Err(HubError::NoStore { path });
            }
            let _lock = super::lock_data_dir(dir)?;
            let store = SqliteStore::open(&path)?;
            Ok(Renumbered {
                was: store.renumber().await?,
                store: path.display().to_string(),
            })
        }
        (None, None) => Err(HubError::NoTarget),
    }
}
