//! Rollouts and the driver's lease, in PostgreSQL: the same statements as SQLite, with
//! the rows a step reads locked (`FOR UPDATE`) so that an operator's move through
//! another replica waits for the step, or the step for it.

use super::*;
use crate::rollouts::{
    active_states_sql, overlapping, unstarted, Fetch, MemberRow, Progress, Recorded, RolloutRow,
    RolloutStore, StateMove, ROLLOUT_COLUMNS, ROLLOUT_LEASE,
};

fn rollout_row(r: &tokio_postgres::Row) -> RolloutRow {
    RolloutRow {
        id: r.get(0),
        seq: u64_of(r.get(1)),
        version: r.get(2),
        selector: r.get(3),
        waves: r.get(4),
        soak_ms: u64_of(r.get(5)),
        max_parallel: u64_of(r.get(6)) as usize,
        max_failures: u64_of(r.get(7)) as usize,
        failures_accepted: u64_of(r.get(8)) as usize,
        deadline_ms: opt_u64(r.get(9)),
        state: r.get(10),
        reason: r.get(11),
        wave: u64_of(r.get(12)) as usize,
        last_commit_ms: opt_u64(r.get(13)),
        created_ms: u64_of(r.get(14)),
        finished_ms: opt_u64(r.get(15)),
    }
}

fn member_row(r: &tokio_postgres::Row) -> MemberRow {
    MemberRow {
        agent: r.get(0),
        wave: u64_of(r.get(1)) as usize,
        position: u64_of(r.get(2)) as usize,
        state: r.get(3),
        from_version: r.get(4),
        given_ms: opt_u64(r.get(5)),
        ended_ms: opt_u64(r.get(6)),
        error: r.get(7),
    }
}

fn opt_i64(v: Option<u64>) -> Option<i64> {
    v.map(|n| n as i64)
}

/// Rollout `id`, its row locked until the transaction ends.
async fn locked(
    tx: &deadpool_postgres::Transaction<'_>,
    id: &str,
) -> Result<Option<RolloutRow>, tokio_postgres::Error> {
    Ok(tx
        .query_opt(
            &format!("SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE id = $1 FOR UPDATE"),
            &[&id],
        )
        .await?
        .as_ref()
        .map(rollout_row))
}

impl RolloutStore for PgStore {
    async fn insert_rollout(
        &self,
        row: &RolloutRow,
        members: &[MemberRow],
    ) -> Result<Result<RolloutRow, Vec<(String, String)>>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        // First: the counter's row lock makes two starts through two replicas take turns,
        // so the second sees the first's members.
        let seq = next_seq(&tx, "rollout_seq", &self.url).await?;
        let held = tx
            .query(
                &format!(
                    "SELECT m.agent, m.rollout FROM rollout_members m JOIN rollouts r ON r.id = m.rollout
                     WHERE r.state IN ({})",
                    active_states_sql()
                ),
                &[],
            )
            .await
            .map_err(&e)?
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect::<Vec<_>>();
        let clash = overlapping(held, members);
        if !clash.is_empty() {
            return Ok(Err(clash));
        }
        let stored = RolloutRow {
            id: format!("r{seq}"),
            seq: u64_of(seq),
            ..row.clone()
        };
        tx.execute(
            sql::ROLLOUT_INSERT,
            &[
                &stored.id,
                &seq,
                &stored.version,
                &stored.selector,
                &stored.waves,
                &(stored.soak_ms as i64),
                &(stored.max_parallel as i64),
                &(stored.max_failures as i64),
                &opt_i64(stored.deadline_ms),
                &stored.state,
                &stored.reason,
                &(stored.created_ms as i64),
            ],
        )
        .await
        .map_err(&e)?;
        let ins = tx.prepare(sql::MEMBER_INSERT).await.map_err(&e)?;
        for m in members {
            tx.execute(
                &ins,
                &[
                    &stored.id,
                    &m.agent,
                    &(m.wave as i64),
                    &(m.position as i64),
                    &m.state,
                    &m.from_version,
                ],
            )
            .await
            .map_err(&e)?;
        }
        tx.commit().await.map_err(&e)?;
        Ok(Ok(stored))
    }

    async fn list_rollouts(&self, active: bool) -> Result<Vec<RolloutRow>, StoreError> {
        let e = self.err();
        let conn = self.conn().await?;
        let filter = if active {
            format!("WHERE state IN ({})", active_states_sql())
        } else {
            String::new()
        };
        Ok(conn
            .query(
                &format!("SELECT {ROLLOUT_COLUMNS} FROM rollouts {filter} ORDER BY seq"),
                &[],
            )
            .await
            .map_err(&e)?
            .iter()
            .map(rollout_row)
            .collect())
    }

    async fn get_rollout(
        &self,
        id: &str,
    ) -> Result<Option<(RolloutRow, Vec<MemberRow>)>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        // One snapshot: the members as of the row.
        let tx = conn
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(&e)?;
        let Some(row) = tx.query_opt(sql::ROLLOUT_BY_ID, &[&id]).await.map_err(&e)? else {
            return Ok(None);
        };
        let members = tx
            .query(sql::ROLLOUT_MEMBERS, &[&id])
            .await
            .map_err(&e)?
            .iter()
            .map(member_row)
            .collect();
        tx.commit().await.map_err(&e)?;
        Ok(Some((rollout_row(&row), members)))
    }

    async fn move_rollout(
        &self,
        id: &str,
        from: &[&str],
        m: &StateMove,
    ) -> Result<Option<RolloutRow>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let Some(row) = locked(&tx, id).await.map_err(&e)? else {
            return Ok(None);
        };
        if !from.contains(&row.state.as_str()) {
            return Ok(None);
        }
        move_on(&tx, &row, m).await.map_err(&e)?;
        let moved = locked(&tx, id).await.map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        Ok(moved)
    }

    async fn record_rollout(
        &self,
        holder: &str,
        lease_until_ms: u64,
        p: &Progress,
    ) -> Result<Recorded, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let renewed = tx
            .execute(
                sql::LEASE_RENEW,
                &[&ROLLOUT_LEASE, &holder, &(lease_until_ms as i64)],
            )
            .await
            .map_err(&e)?;
        if renewed == 0 {
            return Ok(Recorded::LeaseLost);
        }
        let Some(row) = locked(&tx, &p.id).await.map_err(&e)? else {
            return Ok(Recorded::Moved);
        };
        if row.state != p.state {
            return Ok(Recorded::Moved);
        }
        tx.execute(
            sql::ROLLOUT_SET_WAVE,
            &[&p.id, &(p.wave as i64), &opt_i64(p.last_commit_ms)],
        )
        .await
        .map_err(&e)?;
        let upd = tx.prepare(sql::MEMBER_UPDATE).await.map_err(&e)?;
        for m in &p.members {
            tx.execute(
                &upd,
                &[
                    &p.id,
                    &m.agent,
                    &m.state,
                    &opt_i64(m.given_ms),
                    &opt_i64(m.ended_ms),
                    &m.error,
                ],
            )
            .await
            .map_err(&e)?;
        }
        if let Some(m) = &p.moved {
            move_on(&tx, &row, m).await.map_err(&e)?;
        }
        tx.commit().await.map_err(&e)?;
        Ok(Recorded::Written)
    }

    async fn record_fetch(&self, f: &Fetch) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        conn.execute(sql::FETCH_PUT, &[&f.agent, &f.version, &(f.now_ms as i64)])
            .await
            .map(drop)
            .map_err(self.err())
    }

    async fn fetches(&self, version: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let conn = self.conn().await?;
        let rows = conn
            .query(sql::VERSION_FETCHES, &[&version])
            .await
            .map_err(self.err())?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1).max(0) as u64))
            .collect())
    }

    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<bool, StoreError> {
        let e = self.err();
        let conn = self.conn().await?;
        let taken = conn
            .query_opt(
                sql::LEASE_TAKE,
                &[&name, &holder, &(until_ms as i64), &(now_ms as i64)],
            )
            .await
            .map_err(&e)?;
        Ok(taken.is_some())
    }
}

/// Moves `row` as `m` says, within the caller's transaction.
async fn move_on(
    tx: &deadpool_postgres::Transaction<'_>,
    row: &RolloutRow,
    m: &StateMove,
) -> Result<(), tokio_postgres::Error> {
    let fin = crate::proto::rollout::is_final(&m.to);
    let back = m.to == crate::proto::rollout::ROLLING_BACK;
    tx.execute(
        sql::ROLLOUT_UPDATE,
        &[
            &row.id,
            &m.to,
            &m.reason,
            &fin.then_some(m.now_ms as i64),
            &back,
            &m.failures_accepted.map(|n| n as i64),
        ],
    )
    .await?;
    if fin || back {
        tx.execute(
            &format!(
                "UPDATE rollout_members SET state = 'skipped', ended_ms = $2
                 WHERE rollout = $1 AND state IN ({})",
                unstarted(&m.to)
            ),
            &[&row.id, &(m.now_ms as i64)],
        )
        .await?;
    }
    Ok(())
}
