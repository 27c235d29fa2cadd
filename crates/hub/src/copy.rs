//! `railgrid hub store copy --from DATA_DIR --to URL`: a stopped single hub moved onto an
//! empty PostgreSQL database, so that replicas take over its agents with the tokens they
//! have (docs/hub.md, "From one SQLite hub to replicas").
//!
//! Everything goes in one transaction: every table of the SQLite store (agents with their
//! token hashes, labels and generations; desired settings; jobs and their output;
//! releases and halts; rollouts; tokens and the audit log), then what a single hub keeps
//! as files and replicas keep in the database (the admin token's hash, the CA of
//! `--tls-self-signed`, the release binaries, each checked against its SHA-256). Each
//! table is read back and its rows counted and summed; one difference and nothing is
//! committed. The data dir's lock is held throughout, so no hub serves it meanwhile, and
//! the database's hubs' lock is taken exclusively, so no replica starts on it.

use std::collections::BTreeSet;
use std::path::Path;

use super::store::copy::{Cell, Sum, Table};
use super::store::postgres::{redact, CopyTarget, PgStore, MAINTENANCE_APPLICATION};
use super::store::sqlite::SqliteStore;
use super::{lock_data_dir, shared, HubError, DB_FILE, RELEASES_DIR};

/// What a copy moved.
#[derive(Debug)]
pub struct Copied {
    pub from: String,
    pub to: String,
    /// Each table, with its rows and sum, as read back.
    pub tables: Vec<(String, Sum)>,
    pub binaries: u64,
    pub binary_bytes: u64,
    /// The hub holds secrets, which the replicas open only with its key file.
    pub secrets_key: Option<std::path::PathBuf>,
    /// Whether the CA of `--tls-self-signed` went over.
    pub ca: bool,
}

pub async fn copy(from: &Path, to: &str) -> Result<Copied, HubError> {
    let db = from.join(DB_FILE);
    if !db.is_file() {
        return Err(HubError::NoStore { path: db });
    }
    let _lock = lock_data_dir(from)?;
    // Opening migrates an older store forward, as `hub serve` of this version would.
    let source = SqliteStore::open(&db)?;
    let secrets = shared::of_data_dir(from)?;
    // Sealed values go over as they are; the key that opens them never goes into the
    // database, so the replicas need its file.
    let sealed = crate::store::secrets::SecretStore::secrets(&source).await?;
    let secrets_key = match sealed.first() {
        None => None,
        Some(row) => {
            let path = from.join(crate::secrets::KEY_FILE);
            if !path.is_file() {
                return Err(HubError::CopyNeeds {
                    path,
                    what: "the key that seals the hub's secrets (if the hub ran with --secrets-key-file, copy that file here first)",
                });
            }
            crate::secrets::check_key_file(&path, &row.key_id)?;
            Some(path)
        }
    };
    let shown = redact(to);
    let store = PgStore::connect_as(to, MAINTENANCE_APPLICATION).await?;
    let hubs = store.hubs_connected().await?;
    if !hubs.is_empty() {
        return Err(HubError::HubsConnected {
            store: shown,
            from: hubs.join(", "),
        });
    }
    let target = store.begin_copy().await?;
    let mut tables = Vec::new();
    let mut binaries = BTreeSet::new();
    for table in source.tables().await? {
        let sha = (table.name == "releases")
            .then(|| table.column("sha256"))
            .flatten();
        let mut want = Sum::default();
        let mut after = i64::MIN;
        loop {
            let (rows, last) = source.page(&table, after).await?;
            if rows.is_empty() {
                break;
            }
            for row in &rows {
                want.add(row);
                if let Some(Cell::Text(s)) = sha.and_then(|i| row.get(i)) {
                    binaries.insert(s.clone());
                }
            }
            target.insert(&table, &rows).await?;
            after = last;
        }
        tables.push((
            table.name.clone(),
            check(&target, &table, want, &shown).await?,
        ));
    }

    let ca = secrets.iter().any(|(name, _)| name != shared::ADMIN_SECRET);
    let rows: Vec<Vec<Cell>> = secrets
        .into_iter()
        .map(|(k, v)| vec![Cell::Text(k), Cell::Text(v)])
        .collect();
    let table = Table::new("hub_secrets", &["name", "value"]);
    target.insert(&table, &rows).await?;
    let mut want = Sum::default();
    rows.iter().for_each(|r| want.add(r));
    // Not shown: what it sums is secret, and its rows are named below.
    check(&target, &table, want, &shown).await?;

    let table = Table::new("release_blobs", &["sha256", "data"]);
    let mut want = Sum::default();
    let mut binary_bytes = 0;
    for sha in &binaries {
        let row = vec![Cell::Text(sha.clone()), Cell::Bytes(binary(from, sha)?)];
        binary_bytes += row[1].size() as u64;
        want.add(&row);
        target.insert(&table, std::slice::from_ref(&row)).await?;
    }
    check(&target, &table, want, &shown).await?;
    target.commit().await?;
    Ok(Copied {
        from: db.display().to_string(),
        to: shown,
        tables,
        binaries: binaries.len() as u64,
        binary_bytes,
        ca,
        secrets_key,
    })
}

/// `table` read back from the target: its sum when it is `want`.
async fn check(target: &CopyTarget, table: &Table, want: Sum, url: &str) -> Result<Sum, HubError> {
    let got = target.sum(table).await?;
    if got != want {
        return Err(HubError::CopyMismatch {
            table: table.name.clone(),
            url: url.to_owned(),
            want: want.rows,
            want_sum: want.hex(),
            got: got.rows,
            got_sum: got.hex(),
        });
    }
    Ok(got)
}

/// The release binary `sha256` from the data dir, whole.
fn binary(data: &Path, sha256: &str) -> Result<Vec<u8>, HubError> {
    let path = data.join(RELEASES_DIR).join(sha256);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(HubError::CopyBinary {
                path,
                sha256: sha256.to_owned(),
            })
        }
        Err(source) => return Err(HubError::File { path, source }),
    };
    if crate::release::sha256_hex(&bytes) != sha256 {
        return Err(HubError::CopyBinary {
            path,
            sha256: sha256.to_owned(),
        });
    }
    Ok(bytes)
}
