//! Rollouts and the driver's lease, in SQLite.

use super::*;
use crate::rollouts::{
    active_states_sql, overlapping, unstarted, Fetch, MemberRow, Progress, Recorded, RolloutRow,
    RolloutStore, StateMove, ROLLOUT_COLUMNS, ROLLOUT_LEASE,
};

fn rollout_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RolloutRow> {
    Ok(RolloutRow {
        id: r.get(0)?,
        seq: u64_of(r.get(1)?),
        version: r.get(2)?,
        selector: r.get(3)?,
        waves: r.get(4)?,
        soak_ms: u64_of(r.get(5)?),
        max_parallel: u64_of(r.get(6)?) as usize,
        max_failures: u64_of(r.get(7)?) as usize,
        failures_accepted: u64_of(r.get(8)?) as usize,
        deadline_ms: opt_u64(r.get(9)?),
        state: r.get(10)?,
        reason: r.get(11)?,
        wave: u64_of(r.get(12)?) as usize,
        last_commit_ms: opt_u64(r.get(13)?),
        created_ms: u64_of(r.get(14)?),
        finished_ms: opt_u64(r.get(15)?),
    })
}

fn member_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<MemberRow> {
    Ok(MemberRow {
        agent: r.get(0)?,
        wave: u64_of(r.get(1)?) as usize,
        position: u64_of(r.get(2)?) as usize,
        state: r.get(3)?,
        from_version: r.get(4)?,
        given_ms: opt_u64(r.get(5)?),
        ended_ms: opt_u64(r.get(6)?),
        error: r.get(7)?,
    })
}

fn get_on(conn: &Connection, path: &str, id: &str) -> Result<Option<RolloutRow>, StoreError> {
    conn.query_row(&lite(sql::ROLLOUT_BY_ID), params![id], rollout_row)
        .optional()
        .map_err(sql(path))
}

fn opt_i64(v: Option<u64>) -> Option<i64> {
    v.map(|n| n as i64)
}

impl RolloutStore for SqliteStore {
    async fn insert_rollout(
        &self,
        row: &RolloutRow,
        members: &[MemberRow],
    ) -> Result<Result<RolloutRow, Vec<(String, String)>>, StoreError> {
        let (row, members) = (row.clone(), members.to_vec());
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            let held = tx
                .prepare(&format!(
                    "SELECT m.agent, m.rollout FROM rollout_members m JOIN rollouts r ON r.id = m.rollout
                     WHERE r.state IN ({})",
                    active_states_sql()
                ))
                .and_then(|mut s| {
                    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                        .collect::<Result<Vec<(String, String)>, _>>()
                })
                .map_err(&e)?;
            let clash = overlapping(held, &members);
            if !clash.is_empty() {
                return Ok(Err(clash));
            }
            let seq = next_seq(&tx, "rollout_seq", path)?;
            let stored = RolloutRow {
                id: format!("r{seq}"),
                seq: u64_of(seq),
                ..row
            };
            tx.execute(
                &lite(sql::ROLLOUT_INSERT),
                params![
                    stored.id,
                    seq,
                    stored.version,
                    stored.selector,
                    stored.waves,
                    stored.soak_ms as i64,
                    stored.max_parallel as i64,
                    stored.max_failures as i64,
                    opt_i64(stored.deadline_ms),
                    stored.state,
                    stored.reason,
                    stored.created_ms as i64,
                ],
            )
            .map_err(&e)?;
            {
                let mut ins = tx
                    .prepare(
                        &lite(sql::MEMBER_INSERT),
                    )
                    .map_err(&e)?;
                for m in &members {
                    ins.execute(params![
                        stored.id,
                        m.agent,
                        m.wave as i64,
                        m.position as i64,
                        m.state,
                        m.from_version
                    ])
                    .map_err(&e)?;
                }
            }
            tx.commit().map_err(&e)?;
            Ok(Ok(stored))
        })
        .await
    }

    async fn list_rollouts(&self, active: bool) -> Result<Vec<RolloutRow>, StoreError> {
        self.with(move |conn, path| {
            let filter = if active {
                format!("WHERE state IN ({})", active_states_sql())
            } else {
                String::new()
            };
            conn.prepare(&format!(
                "SELECT {ROLLOUT_COLUMNS} FROM rollouts {filter} ORDER BY seq"
            ))
            .and_then(|mut s| s.query_map([], rollout_row)?.collect::<Result<Vec<_>, _>>())
            .map_err(sql(path))
        })
        .await
    }

    async fn get_rollout(
        &self,
        id: &str,
    ) -> Result<Option<(RolloutRow, Vec<MemberRow>)>, StoreError> {
        let id = id.to_owned();
        self.with(move |conn, path| {
            let Some(row) = get_on(conn, path, &id)? else {
                return Ok(None);
            };
            let members = conn
                .prepare(&lite(sql::ROLLOUT_MEMBERS))
                .and_then(|mut s| {
                    s.query_map(params![id], member_row)?
                        .collect::<Result<Vec<_>, _>>()
                })
                .map_err(sql(path))?;
            Ok(Some((row, members)))
        })
        .await
    }

    async fn move_rollout(
        &self,
        id: &str,
        from: &[&str],
        m: &StateMove,
    ) -> Result<Option<RolloutRow>, StoreError> {
        let (id, m) = (id.to_owned(), m.clone());
        let from: Vec<String> = from.iter().map(|s| (*s).to_owned()).collect();
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            let Some(row) = get_on(&tx, path, &id)? else {
                return Ok(None);
            };
            if !from.contains(&row.state) {
                return Ok(None);
            }
            move_on(&tx, path, &row, &m)?;
            let moved = get_on(&tx, path, &id)?;
            tx.commit().map_err(&e)?;
            Ok(moved)
        })
        .await
    }

    async fn record_rollout(
        &self,
        holder: &str,
        lease_until_ms: u64,
        p: &Progress,
    ) -> Result<Recorded, StoreError> {
        let (holder, p) = (holder.to_owned(), p.clone());
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            let renewed = tx
                .execute(
                    &lite(sql::LEASE_RENEW),
                    params![ROLLOUT_LEASE, holder, lease_until_ms as i64],
                )
                .map_err(&e)?;
            if renewed == 0 {
                return Ok(Recorded::LeaseLost);
            }
            let Some(row) = get_on(&tx, path, &p.id)? else {
                return Ok(Recorded::Moved);
            };
            if row.state != p.state {
                return Ok(Recorded::Moved);
            }
            tx.execute(
                &lite(sql::ROLLOUT_SET_WAVE),
                params![p.id, p.wave as i64, opt_i64(p.last_commit_ms)],
            )
            .map_err(&e)?;
            {
                let mut upd = tx.prepare(&lite(sql::MEMBER_UPDATE)).map_err(&e)?;
                for m in &p.members {
                    upd.execute(params![
                        p.id,
                        m.agent,
                        m.state,
                        opt_i64(m.given_ms),
                        opt_i64(m.ended_ms),
                        m.error
                    ])
                    .map_err(&e)?;
                }
            }
            if let Some(m) = &p.moved {
                move_on(&tx, path, &row, m)?;
            }
            tx.commit().map_err(&e)?;
            Ok(Recorded::Written)
        })
        .await
    }

    async fn record_fetch(&self, f: &Fetch) -> Result<(), StoreError> {
        let f = f.clone();
        self.with(move |conn, path| {
            conn.execute(
                &lite(sql::FETCH_PUT),
                params![f.agent, f.version, f.now_ms as i64],
            )
            .map(drop)
            .map_err(sql(path))
        })
        .await
    }

    async fn fetches(&self, version: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let version = version.to_owned();
        self.with(move |conn, path| {
            conn.prepare(&lite(sql::VERSION_FETCHES))
                .and_then(|mut s| {
                    s.query_map(params![version], |r| {
                        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
                    })?
                    .collect()
                })
                .map_err(sql(path))
        })
        .await
    }

    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<bool, StoreError> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.with(move |conn, path| {
            let taken: Option<String> = conn
                .query_row(
                    &lite(sql::LEASE_TAKE),
                    params![name, holder, until_ms as i64, now_ms as i64],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql(path))?;
            Ok(taken.is_some())
        })
        .await
    }
}

/// Moves `row` as `m` says, within the caller's transaction.
fn move_on(
    tx: &rusqlite::Transaction<'_>,
    path: &str,
    row: &RolloutRow,
    m: &StateMove,
) -> Result<(), StoreError> {
    let e = sql(path);
    let fin = crate::proto::rollout::is_final(&m.to);
    let back = m.to == crate::proto::rollout::ROLLING_BACK;
    tx.execute(
        &lite(sql::ROLLOUT_UPDATE),
        params![
            row.id,
            m.to,
            m.reason,
            fin.then_some(m.now_ms as i64),
            back,
            m.failures_accepted.map(|n| n as i64),
        ],
    )
    .map_err(&e)?;
    if fin || back {
        tx.execute(
            &format!(
                "UPDATE rollout_members SET state = 'skipped', ended_ms = ?2
                 WHERE rollout = ?1 AND state IN ({})",
                unstarted(&m.to)
            ),
            params![row.id, m.now_ms as i64],
        )
        .map_err(&e)?;
    }
    Ok(())
}
