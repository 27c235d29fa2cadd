//! Sealed secrets, in PostgreSQL: the same statements as SQLite, each change behind the
//! `secret_seq` row's lock (the module doc of `store::secrets`).

use super::*;
use crate::secrets::{Put, SecretRow, SecretStore, COLUMNS, TURN};

fn secret_row(r: &tokio_postgres::Row) -> SecretRow {
    SecretRow {
        name: r.get(0),
        version: u64_of(r.get(1)),
        selector: r.get(2),
        sealed: r.get(3),
        key_id: r.get(4),
        set_by: r.get(5),
        set_ms: u64_of(r.get(6)),
    }
}

impl SecretStore for PgStore {
    async fn secrets(&self) -> Result<Vec<SecretRow>, StoreError> {
        let e = self.err();
        let conn = self.conn().await?;
        let rows = conn.query(sql::SECRETS_ALL, &[]).await.map_err(&e)?;
        Ok(rows.iter().map(secret_row).collect())
    }

    async fn secrets_named(&self, names: &[String]) -> Result<Vec<SecretRow>, StoreError> {
        let e = self.err();
        let conn = self.conn().await?;
        let rows = conn
            .query(
                &format!("SELECT {COLUMNS} FROM job_secrets WHERE name = ANY($1) ORDER BY name"),
                &[&names],
            )
            .await
            .map_err(&e)?;
        Ok(rows.iter().map(secret_row).collect())
    }

    async fn put_secret(&self, row: &SecretRow, previous: Option<u64>) -> Result<Put, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        next_seq(&tx, TURN, &self.url).await?;
        let other = tx
            .query_opt(sql::OTHER_SECRET_KEY, &[&row.key_id])
            .await
            .map_err(&e)?;
        if let Some(other) = other {
            return Ok(Put::OtherKey(other.get(0)));
        }
        let now = tx
            .query_opt(sql::SECRET_VERSION, &[&row.name])
            .await
            .map_err(&e)?
            .map(|r| u64_of(r.get(0)));
        if now != previous {
            return Ok(Put::Moved);
        }
        tx.execute(
            sql::SECRET_PUT,
            &[
                &row.name,
                &(row.version as i64),
                &row.selector,
                &row.sealed,
                &row.key_id,
                &row.set_by,
                &(row.set_ms as i64),
            ],
        )
        .await
        .map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        Ok(Put::Done)
    }

    async fn remove_secret(&self, name: &str, version: u64) -> Result<Option<u64>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        next_seq(&tx, TURN, &self.url).await?;
        let gone = tx
            .query_opt(sql::SECRET_DELETE, &[&name, &(version as i64)])
            .await
            .map_err(&e)?
            .map(|r| u64_of(r.get(0)));
        tx.commit().await.map_err(&e)?;
        Ok(gone)
    }

    async fn reseal_secrets(&self, rows: &[SecretRow], from: &str) -> Result<Put, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        next_seq(&tx, TURN, &self.url).await?;
        let count: i64 = tx
            .query_one(sql::SECRET_COUNT, &[])
            .await
            .map_err(&e)?
            .get(0);
        if u64_of(count) != rows.len() as u64 {
            return Ok(Put::Moved);
        }
        for row in rows {
            let n = tx
                .execute(
                    sql::SECRET_RESEAL,
                    &[
                        &row.sealed,
                        &row.key_id,
                        &row.name,
                        &(row.version as i64),
                        &from,
                    ],
                )
                .await
                .map_err(&e)?;
            if n != 1 {
                return Ok(Put::Moved);
            }
        }
        tx.commit().await.map_err(&e)?;
        Ok(Put::Done)
    }
}
