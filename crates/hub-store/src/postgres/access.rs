//! Access (tokens, enrolment, audit, rotation) in PostgreSQL: the same statements as
//! SQLite. A change the other hubs must see (a new or revoked token) is announced as the
//! tokens' event; an enrolment and a rotation as the agent's change.

use super::*;
use crate::access::{
    AccessStore, AdminTokenRow, AuditRow, EnrolTokenRow, Enrolled, Enrolment, ADMIN_TOKEN_COLUMNS,
    ENROL_TOKEN_COLUMNS,
};

fn admin_token_row(r: &tokio_postgres::Row) -> AdminTokenRow {
    AdminTokenRow {
        name: r.get(0),
        sha256: r.get(1),
        scopes: r.get(2),
        selector: r.get(3),
        created_ms: u64_of(r.get(4)),
        expires_ms: opt_u64(r.get(5)),
        revoked_ms: opt_u64(r.get(6)),
    }
}

fn enrol_row(url: &str, r: &tokio_postgres::Row) -> Result<EnrolTokenRow, StoreError> {
    let id: String = r.get(0);
    let labels: String = r.get(4);
    let labels = crate::parse_labels(url, &id, &labels)?;
    Ok(EnrolTokenRow {
        sha256: r.get(1),
        max_uses: opt_u64(r.get(2)),
        uses: u64_of(r.get(3)),
        labels,
        created_ms: u64_of(r.get(5)),
        expires_ms: opt_u64(r.get(6)),
        revoked_ms: opt_u64(r.get(7)),
        id,
    })
}

fn audit_row(r: &tokio_postgres::Row) -> AuditRow {
    AuditRow {
        seq: u64_of(r.get(0)),
        at_ms: u64_of(r.get(1)),
        token: r.get(2),
        peer: r.get(3),
        action: r.get(4),
        target: r.get(5),
        outcome: r.get(6),
        count: u64_of(r.get(7)),
    }
}

impl PgStore {
    /// Tells the other hubs that the tokens changed, and commits.
    async fn commit_tokens(
        &self,
        tx: deadpool_postgres::Transaction<'_>,
    ) -> Result<(), StoreError> {
        let e = self.err();
        notify(&tx, &self.payload('t', 0, "")).await.map_err(&e)?;
        tx.commit().await.map_err(&e)
    }

    /// Revokes the row of `table` whose `key` is `value` at `now_ms` (a second revocation
    /// keeps the first time): the row as it then is, with `columns`, if there is one. The
    /// row is decoded after the commit, as on SQLite: a token is revoked even when its row
    /// no longer decodes, and the error that says so comes after.
    async fn revoke_row<T>(
        &self,
        table: &str,
        key: &str,
        columns: &str,
        value: &str,
        now_ms: u64,
        decode: impl Fn(&tokio_postgres::Row) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let row = tx
            .query_opt(
                &format!(
                    "UPDATE {table} SET revoked_ms = COALESCE(revoked_ms, $2) WHERE {key} = $1
                     RETURNING {columns}"
                ),
                &[&value, &(now_ms as i64)],
            )
            .await
            .map_err(&e)?;
        self.commit_tokens(tx).await?;
        row.as_ref().map(decode).transpose()
    }
}

impl AccessStore for PgStore {
    async fn create_admin_token(&self, row: &AdminTokenRow) -> Result<bool, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let n = tx
            .execute(
                sql::ADMIN_TOKEN_INSERT,
                &[
                    &row.name,
                    &row.sha256,
                    &row.scopes,
                    &row.selector,
                    &(row.created_ms as i64),
                    &row.expires_ms.map(|m| m as i64),
                ],
            )
            .await
            .map_err(&e)?;
        if n == 0 {
            return Ok(false);
        }
        self.commit_tokens(tx).await?;
        Ok(true)
    }

    async fn admin_tokens(&self) -> Result<Vec<AdminTokenRow>, StoreError> {
        let conn = self.conn().await?;
        Ok(conn
            .query(sql::ADMIN_TOKENS_ALL, &[])
            .await
            .map_err(self.err())?
            .iter()
            .map(admin_token_row)
            .collect())
    }

    async fn revoke_admin_token(
        &self,
        name: &str,
        now_ms: u64,
    ) -> Result<Option<AdminTokenRow>, StoreError> {
        let decode = |r: &_| Ok(admin_token_row(r));
        self.revoke_row(
            "admin_tokens",
            "name",
            ADMIN_TOKEN_COLUMNS,
            name,
            now_ms,
            decode,
        )
        .await
    }

    async fn create_enrol_token(&self, row: &EnrolTokenRow) -> Result<EnrolTokenRow, StoreError> {
        let labels = encode(&self.url, "an enrolment token's labels", &row.labels)?;
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let seq = next_seq(&tx, "enrol_token_seq", &self.url).await?;
        let stored = EnrolTokenRow {
            id: format!("et{seq}"),
            ..row.clone()
        };
        tx.execute(
            sql::ENROL_TOKEN_INSERT,
            &[
                &stored.id,
                &stored.sha256,
                &stored.max_uses.map(|n| n as i64),
                &labels,
                &(stored.created_ms as i64),
                &stored.expires_ms.map(|m| m as i64),
            ],
        )
        .await
        .map_err(&e)?;
        self.commit_tokens(tx).await?;
        Ok(stored)
    }

    async fn enrol_tokens(&self) -> Result<Vec<EnrolTokenRow>, StoreError> {
        let conn = self.conn().await?;
        conn.query(sql::ENROL_TOKENS_ALL, &[])
            .await
            .map_err(self.err())?
            .iter()
            .map(|r| enrol_row(&self.url, r))
            .collect()
    }

    async fn revoke_enrol_token(
        &self,
        id: &str,
        now_ms: u64,
    ) -> Result<Option<EnrolTokenRow>, StoreError> {
        let decode = |r: &_| enrol_row(&self.url, r);
        self.revoke_row(
            "enrol_tokens",
            "id",
            ENROL_TOKEN_COLUMNS,
            id,
            now_ms,
            decode,
        )
        .await
    }

    async fn self_enrol(&self, en: &Enrolment, agent_sha256: &str) -> Result<Enrolled, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        // The token's row locked: two hosts enrolling with its last use take turns.
        let token = tx
            .query_opt(
                &format!(
                    "SELECT {ENROL_TOKEN_COLUMNS} FROM enrol_tokens WHERE sha256 = $1 FOR UPDATE"
                ),
                &[&en.token_sha256],
            )
            .await
            .map_err(&e)?;
        let Some(token) = token.map(|r| enrol_row(&self.url, &r)).transpose()? else {
            return Ok(Enrolled::UnknownToken);
        };
        if let Some(why) = token.refusal(en.now_ms, None) {
            return Ok(Enrolled::Refused { via: token.id, why });
        }
        let existing = tx
            .query_opt(sql::AGENT_ENROLMENT_LOCKED, &[&en.id])
            .await
            .map_err(&e)?;
        let mut again = false;
        if let Some(row) = existing {
            if let Some(revoked) = row.get::<_, Option<i64>>(0) {
                return Ok(Enrolled::Retired {
                    revoked_ms: u64_of(revoked).saturating_mul(1000),
                });
            }
            // The same token's enrolment of an agent never seen: its answer was lost on
            // the way, and the host asks again.
            again = row.get::<_, Option<i64>>(4).is_none()
                && row.get::<_, Option<String>>(5).as_deref() == Some(token.id.as_str());
            if !again {
                return Ok(Enrolled::Taken {
                    enrolled_ms: u64_of(row.get(1)).saturating_mul(1000),
                    peer: row.get(2),
                    host: row.get(3),
                });
            }
        }
        if let Some(why) = token.refusal(en.now_ms, Some(again)) {
            return Ok(Enrolled::Refused { via: token.id, why });
        }
        let labels = encode(&self.url, "an enrolment token's labels", &token.labels)?;
        let inserted = tx
            .execute(
                sql::AGENT_ENROL,
                &[
                    &en.id,
                    &agent_sha256,
                    &((en.now_ms / 1000) as i64),
                    &labels,
                    &(en.now_ms as i64),
                    &token.id,
                    &en.peer,
                    &en.host,
                    &again,
                ],
            )
            .await
            .map_err(&e)?;
        if inserted == 0 {
            // Enrolled by another hub between the two statements: nothing changes.
            return Ok(Enrolled::Taken {
                enrolled_ms: en.now_ms,
                peer: None,
                host: None,
            });
        }
        if !again {
            tx.execute(sql::ENROL_TOKEN_USE, &[&token.id])
                .await
                .map_err(&e)?;
        }
        let generation = self.bump_and_commit(tx, &en.id).await?;
        Ok(Enrolled::Done {
            generation,
            via: token.id,
            labels: token.labels,
        })
    }

    async fn append_audit(&self, row: &AuditRow) -> Result<u64, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let seq = next_seq(&tx, "audit_seq", &self.url).await?;
        tx.execute(
            sql::AUDIT_INSERT,
            &[
                &seq,
                &(row.at_ms as i64),
                &row.token,
                &row.peer,
                &row.action,
                &row.target,
                &row.outcome,
                &(row.count.max(1) as i64),
            ],
        )
        .await
        .map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        Ok(u64_of(seq))
    }

    async fn add_audit_count(&self, seq: u64, n: u64) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        conn.execute(sql::AUDIT_ADD_COUNT, &[&(seq as i64), &(n as i64)])
            .await
            .map(drop)
            .map_err(self.err())
    }

    async fn audit(
        &self,
        since_ms: u64,
        token: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AuditRow>, StoreError> {
        let conn = self.conn().await?;
        let mut rows: Vec<AuditRow> = conn
            .query(
                sql::AUDIT_PAGE,
                &[&(since_ms as i64), &token, &(limit as i64)],
            )
            .await
            .map_err(self.err())?
            .iter()
            .map(audit_row)
            .collect();
        rows.reverse();
        Ok(rows)
    }

    async fn prune_audit(&self, before_ms: u64) -> Result<usize, StoreError> {
        let conn = self.conn().await?;
        let n = conn
            .execute(sql::AUDIT_PRUNE, &[&(before_ms as i64)])
            .await
            .map_err(self.err())?;
        Ok(n as usize)
    }

    async fn ask_rotation(&self, ids: Option<&[String]>) -> Result<Vec<(String, u64)>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let all: Vec<String> = match ids {
            Some(ids) => ids.to_vec(),
            None => tx
                .query(sql::LIVE_AGENT_IDS, &[])
                .await
                .map_err(&e)?
                .iter()
                .map(|r| r.get(0))
                .collect(),
        };
        let mut asked: Vec<(String, u64)> = Vec::new();
        for id in all {
            let n = tx
                .execute(sql::AGENT_ASK_ROTATION, &[&id])
                .await
                .map_err(&e)?;
            if n == 1 {
                let g = bump_scope(&tx, &id, &self.url).await?;
                asked.push((id, g));
            }
        }
        let scopes: Vec<(&str, u64)> = asked.iter().map(|(id, g)| (id.as_str(), *g)).collect();
        self.commit_changes(tx, &scopes).await?;
        Ok(asked)
    }

    async fn set_next_token(&self, id: &str, next_sha256: &str) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        conn.execute(sql::AGENT_SET_NEXT_TOKEN, &[&id, &next_sha256])
            .await
            .map_err(self.err())?;
        Ok(())
    }

    async fn promote_token(
        &self,
        id: &str,
        next_sha256: &str,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        // The agent's scope moves: the other hubs load it, and refuse its old token too.
        let promoted = self
            .change_agent(
                id,
                sql::AGENT_ROTATE,
                &[&id, &next_sha256, &(now_ms as i64)],
            )
            .await?;
        Ok(promoted.is_some())
    }

    async fn replace_secret(&self, name: &str, value: &str) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        conn.execute(
            "INSERT INTO hub_secrets (name, value) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            &[&name, &value],
        )
        .await
        .map_err(self.err())?;
        Ok(())
    }
}
