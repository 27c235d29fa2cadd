//! Access (tokens, enrolment, audit, rotation) in SQLite.

use super::*;
use crate::access::{
    AccessStore, AdminTokenRow, AuditRow, EnrolTokenRow, Enrolled, Enrolment, ADMIN_TOKEN_COLUMNS,
    ENROL_TOKEN_COLUMNS,
};

fn admin_token_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<AdminTokenRow> {
    Ok(AdminTokenRow {
        name: r.get(0)?,
        sha256: r.get(1)?,
        scopes: r.get(2)?,
        selector: r.get(3)?,
        created_ms: u64_of(r.get(4)?),
        expires_ms: opt_u64(r.get(5)?),
        revoked_ms: opt_u64(r.get(6)?),
    })
}

type RawEnrol = (
    String,
    String,
    Option<i64>,
    i64,
    String,
    i64,
    Option<i64>,
    Option<i64>,
);

fn raw_enrol(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawEnrol> {
    RawEnrol::try_from(r)
}

fn enrol_row(path: &str, raw: RawEnrol) -> Result<EnrolTokenRow, StoreError> {
    let (id, sha256, max_uses, uses, labels, created, expires, revoked) = raw;
    let labels = crate::parse_labels(path, &id, &labels)?;
    Ok(EnrolTokenRow {
        id,
        sha256,
        max_uses: opt_u64(max_uses),
        uses: u64_of(uses),
        labels,
        created_ms: u64_of(created),
        expires_ms: opt_u64(expires),
        revoked_ms: opt_u64(revoked),
    })
}

fn audit_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<AuditRow> {
    Ok(AuditRow {
        seq: u64_of(r.get(0)?),
        at_ms: u64_of(r.get(1)?),
        token: r.get(2)?,
        peer: r.get(3)?,
        action: r.get(4)?,
        target: r.get(5)?,
        outcome: r.get(6)?,
        count: u64_of(r.get(7)?),
    })
}

fn enrol_token_by(
    conn: &Connection,
    path: &str,
    column: &str,
    value: &str,
) -> Result<Option<EnrolTokenRow>, StoreError> {
    let raw = conn
        .query_row(
            &format!("SELECT {ENROL_TOKEN_COLUMNS} FROM enrol_tokens WHERE {column} = ?1"),
            params![value],
            raw_enrol,
        )
        .optional()
        .map_err(sql(path))?;
    raw.map(|r| enrol_row(path, r)).transpose()
}

impl AccessStore for SqliteStore {
    async fn create_admin_token(&self, row: &AdminTokenRow) -> Result<bool, StoreError> {
        let row = row.clone();
        self.with(move |conn, path| {
            let n = conn
                .execute(
                    &lite(sql::ADMIN_TOKEN_INSERT),
                    params![
                        row.name,
                        row.sha256,
                        row.scopes,
                        row.selector,
                        row.created_ms as i64,
                        row.expires_ms.map(|m| m as i64)
                    ],
                )
                .map_err(sql(path))?;
            Ok(n == 1)
        })
        .await
    }

    async fn admin_tokens(&self) -> Result<Vec<AdminTokenRow>, StoreError> {
        self.with(|conn, path| {
            conn.prepare(&lite(sql::ADMIN_TOKENS_ALL))
                .and_then(|mut s| {
                    s.query_map([], admin_token_row)?
                        .collect::<Result<Vec<_>, _>>()
                })
                .map_err(sql(path))
        })
        .await
    }

    async fn revoke_admin_token(
        &self,
        name: &str,
        now_ms: u64,
    ) -> Result<Option<AdminTokenRow>, StoreError> {
        let name = name.to_owned();
        self.with(move |conn, path| {
            let e = sql(path);
            conn.execute(
                "UPDATE admin_tokens SET revoked_ms = COALESCE(revoked_ms, ?2) WHERE name = ?1",
                params![name, now_ms as i64],
            )
            .map_err(&e)?;
            conn.query_row(
                &format!("SELECT {ADMIN_TOKEN_COLUMNS} FROM admin_tokens WHERE name = ?1"),
                params![name],
                admin_token_row,
            )
            .optional()
            .map_err(&e)
        })
        .await
    }

    async fn create_enrol_token(&self, row: &EnrolTokenRow) -> Result<EnrolTokenRow, StoreError> {
        let row = row.clone();
        self.with(move |conn, path| {
            let e = sql(path);
            let labels = encode(path, "an enrolment token's labels", &row.labels)?;
            let tx = conn.transaction().map_err(&e)?;
            let seq = next_seq(&tx, "enrol_token_seq", path)?;
            let stored = EnrolTokenRow {
                id: format!("et{seq}"),
                ..row
            };
            tx.execute(
                &lite(sql::ENROL_TOKEN_INSERT),
                params![
                    stored.id,
                    stored.sha256,
                    stored.max_uses.map(|n| n as i64),
                    labels,
                    stored.created_ms as i64,
                    stored.expires_ms.map(|m| m as i64)
                ],
            )
            .map_err(&e)?;
            tx.commit().map_err(&e)?;
            Ok(stored)
        })
        .await
    }

    async fn enrol_tokens(&self) -> Result<Vec<EnrolTokenRow>, StoreError> {
        self.with(|conn, path| {
            let raws = conn
                .prepare(&lite(sql::ENROL_TOKENS_ALL))
                .and_then(|mut s| s.query_map([], raw_enrol)?.collect::<Result<Vec<_>, _>>())
                .map_err(sql(path))?;
            raws.into_iter().map(|r| enrol_row(path, r)).collect()
        })
        .await
    }

    async fn revoke_enrol_token(
        &self,
        id: &str,
        now_ms: u64,
    ) -> Result<Option<EnrolTokenRow>, StoreError> {
        let id = id.to_owned();
        self.with(move |conn, path| {
            conn.execute(
                "UPDATE enrol_tokens SET revoked_ms = COALESCE(revoked_ms, ?2) WHERE id = ?1",
                params![id, now_ms as i64],
            )
            .map_err(sql(path))?;
            enrol_token_by(conn, path, "id", &id)
        })
        .await
    }

    async fn self_enrol(&self, en: &Enrolment, agent_sha256: &str) -> Result<Enrolled, StoreError> {
        let (en, agent_sha256) = (en.clone(), agent_sha256.to_owned());
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            let Some(token) = enrol_token_by(&tx, path, "sha256", &en.token_sha256)? else {
                return Ok(Enrolled::UnknownToken);
            };
            if let Some(why) = token.refusal(en.now_ms, None) {
                return Ok(Enrolled::Refused { via: token.id, why });
            }
            type Existing = (
                Option<i64>,
                i64,
                Option<String>,
                Option<String>,
                Option<i64>,
                Option<String>,
            );
            let existing: Option<Existing> = tx
                .query_row(&lite(sql::AGENT_ENROLMENT), params![en.id], |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                })
                .optional()
                .map_err(&e)?;
            let mut again = false;
            if let Some((Some(revoked), ..)) = existing {
                return Ok(Enrolled::Retired {
                    revoked_ms: u64_of(revoked).saturating_mul(1000),
                });
            }
            if let Some((None, at, peer, host, seen, via)) = existing {
                // The same token's enrolment of an agent never seen: its answer was lost
                // on the way, and the host asks again.
                again = seen.is_none() && via.as_deref() == Some(token.id.as_str());
                if !again {
                    return Ok(Enrolled::Taken {
                        enrolled_ms: u64_of(at).saturating_mul(1000),
                        peer,
                        host,
                    });
                }
            }
            if let Some(why) = token.refusal(en.now_ms, Some(again)) {
                return Ok(Enrolled::Refused { via: token.id, why });
            }
            let labels = encode(path, "an enrolment token's labels", &token.labels)?;
            let now_s = (en.now_ms / 1000) as i64;
            tx.execute(
                &lite(sql::AGENT_ENROL),
                params![
                    en.id,
                    agent_sha256,
                    now_s,
                    labels,
                    en.now_ms as i64,
                    token.id,
                    en.peer,
                    en.host,
                    again
                ],
            )
            .map_err(&e)?;
            if !again {
                tx.execute(&lite(sql::ENROL_TOKEN_USE), params![token.id])
                    .map_err(&e)?;
            }
            let generation = bump_and_commit(tx, &en.id, path)?;
            Ok(Enrolled::Done {
                generation,
                via: token.id,
                labels: token.labels,
            })
        })
        .await
    }

    async fn append_audit(&self, row: &AuditRow) -> Result<u64, StoreError> {
        let row = row.clone();
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            let seq = next_seq(&tx, "audit_seq", path)?;
            tx.execute(
                &lite(sql::AUDIT_INSERT),
                params![
                    seq,
                    row.at_ms as i64,
                    row.token,
                    row.peer,
                    row.action,
                    row.target,
                    row.outcome,
                    row.count.max(1) as i64
                ],
            )
            .map_err(&e)?;
            tx.commit().map_err(&e)?;
            Ok(u64_of(seq))
        })
        .await
    }

    async fn add_audit_count(&self, seq: u64, n: u64) -> Result<(), StoreError> {
        self.with(move |conn, path| {
            conn.execute(&lite(sql::AUDIT_ADD_COUNT), params![seq as i64, n as i64])
                .map(drop)
                .map_err(sql(path))
        })
        .await
    }

    async fn audit(
        &self,
        since_ms: u64,
        token: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AuditRow>, StoreError> {
        let token = token.map(str::to_owned);
        self.with(move |conn, path| {
            let mut rows = conn
                .prepare(&lite(sql::AUDIT_PAGE))
                .and_then(|mut s| {
                    s.query_map(params![since_ms as i64, token, limit as i64], audit_row)?
                        .collect::<Result<Vec<_>, _>>()
                })
                .map_err(sql(path))?;
            rows.reverse();
            Ok(rows)
        })
        .await
    }

    async fn prune_audit(&self, before_ms: u64) -> Result<usize, StoreError> {
        self.with(move |conn, path| {
            conn.execute(&lite(sql::AUDIT_PRUNE), params![before_ms as i64])
                .map_err(sql(path))
        })
        .await
    }

    async fn ask_rotation(&self, ids: Option<&[String]>) -> Result<Vec<(String, u64)>, StoreError> {
        let ids = ids.map(<[String]>::to_vec);
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            let mut asked = Vec::new();
            let all: Vec<String> = match ids {
                Some(ids) => ids,
                None => tx
                    .prepare(&lite(sql::LIVE_AGENT_IDS))
                    .and_then(|mut s| {
                        s.query_map([], |r| r.get(0))?
                            .collect::<Result<Vec<String>, _>>()
                    })
                    .map_err(&e)?,
            };
            for id in all {
                let n = tx
                    .execute(&lite(sql::AGENT_ASK_ROTATION), params![id])
                    .map_err(&e)?;
                if n == 1 {
                    let g = bump_scope(&tx, &id, path)?;
                    asked.push((id, g));
                }
            }
            tx.commit().map_err(&e)?;
            Ok(asked)
        })
        .await
    }

    async fn set_next_token(&self, id: &str, next_sha256: &str) -> Result<(), StoreError> {
        let (id, next) = (id.to_owned(), next_sha256.to_owned());
        self.with(move |conn, path| {
            conn.execute(&lite(sql::AGENT_SET_NEXT_TOKEN), params![id, next])
                .map(drop)
                .map_err(sql(path))
        })
        .await
    }

    async fn promote_token(
        &self,
        id: &str,
        next_sha256: &str,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let (id, next) = (id.to_owned(), next_sha256.to_owned());
        self.with(move |conn, path| {
            let n = conn
                .execute(&lite(sql::AGENT_ROTATE), params![id, next, now_ms as i64])
                .map_err(sql(path))?;
            Ok(n == 1)
        })
        .await
    }

    async fn replace_secret(&self, _name: &str, _value: &str) -> Result<(), StoreError> {
        // One hub: its secrets are files in its data dir.
        Ok(())
    }
}
