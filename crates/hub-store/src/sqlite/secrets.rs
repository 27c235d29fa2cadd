//! Sealed secrets, in SQLite.

use super::*;
use crate::secrets::{Put, SecretRow, SecretStore, COLUMNS, TURN};

fn secret_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SecretRow> {
    Ok(SecretRow {
        name: r.get(0)?,
        version: u64_of(r.get(1)?),
        selector: r.get(2)?,
        sealed: r.get(3)?,
        key_id: r.get(4)?,
        set_by: r.get(5)?,
        set_ms: u64_of(r.get(6)?),
    })
}

/// A key other than `key_id` that seals a secret.
fn other_key(
    tx: &rusqlite::Transaction<'_>,
    key_id: &str,
    path: &str,
) -> Result<Option<String>, StoreError> {
    tx.query_row(&lite(sql::OTHER_SECRET_KEY), params![key_id], |r| r.get(0))
        .optional()
        .map_err(sql(path))
}

impl SecretStore for SqliteStore {
    async fn secrets(&self) -> Result<Vec<SecretRow>, StoreError> {
        self.with(|conn, path| {
            conn.prepare(&lite(sql::SECRETS_ALL))
                .and_then(|mut s| s.query_map([], secret_row)?.collect())
                .map_err(sql(path))
        })
        .await
    }

    async fn secrets_named(&self, names: &[String]) -> Result<Vec<SecretRow>, StoreError> {
        let names = names.to_vec();
        self.with(move |conn, path| {
            let mut s = conn
                .prepare(&format!(
                    "SELECT {COLUMNS} FROM job_secrets WHERE name = ?1"
                ))
                .map_err(sql(path))?;
            let mut rows = Vec::with_capacity(names.len());
            for name in &names {
                if let Some(row) = s
                    .query_row(params![name], secret_row)
                    .optional()
                    .map_err(sql(path))?
                {
                    rows.push(row);
                }
            }
            Ok(rows)
        })
        .await
    }

    async fn put_secret(&self, row: &SecretRow, previous: Option<u64>) -> Result<Put, StoreError> {
        let row = row.clone();
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            next_seq(&tx, TURN, path)?;
            if let Some(other) = other_key(&tx, &row.key_id, path)? {
                return Ok(Put::OtherKey(other));
            }
            let now: Option<i64> = tx
                .query_row(&lite(sql::SECRET_VERSION), params![row.name], |r| r.get(0))
                .optional()
                .map_err(&e)?;
            if now.map(u64_of) != previous {
                return Ok(Put::Moved);
            }
            tx.execute(
                &lite(sql::SECRET_PUT),
                params![
                    row.name,
                    row.version as i64,
                    row.selector,
                    row.sealed,
                    row.key_id,
                    row.set_by,
                    row.set_ms as i64
                ],
            )
            .map_err(&e)?;
            tx.commit().map_err(&e)?;
            Ok(Put::Done)
        })
        .await
    }

    async fn remove_secret(&self, name: &str, version: u64) -> Result<Option<u64>, StoreError> {
        let name = name.to_owned();
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            next_seq(&tx, TURN, path)?;
            let gone: Option<i64> = tx
                .query_row(
                    &lite(sql::SECRET_DELETE),
                    params![name, version as i64],
                    |r| r.get(0),
                )
                .optional()
                .map_err(&e)?;
            tx.commit().map_err(&e)?;
            Ok(gone.map(u64_of))
        })
        .await
    }

    async fn reseal_secrets(&self, rows: &[SecretRow], from: &str) -> Result<Put, StoreError> {
        let (rows, from) = (rows.to_vec(), from.to_owned());
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            next_seq(&tx, TURN, path)?;
            let count: i64 = tx
                .query_row(&lite(sql::SECRET_COUNT), [], |r| r.get(0))
                .map_err(&e)?;
            if u64_of(count) != rows.len() as u64 {
                return Ok(Put::Moved);
            }
            for row in &rows {
                let n = tx
                    .execute(
                        &lite(sql::SECRET_RESEAL),
                        params![row.sealed, row.key_id, row.name, row.version as i64, from],
                    )
                    .map_err(&e)?;
                if n != 1 {
                    return Ok(Put::Moved);
                }
            }
            tx.commit().map_err(&e)?;
            Ok(Put::Done)
        })
        .await
    }
}
