//! The transactions every part of the PostgreSQL store takes: a read-only snapshot, a
//! notification to the other hubs on commit, and the next generation.

use super::*;

/// A read-only transaction that sees one snapshot; rolled back if dropped (a pooled
/// connection never goes back to the pool inside it).
pub(super) async fn snapshot(
    conn: &mut Object,
) -> Result<deadpool_postgres::Transaction<'_>, tokio_postgres::Error> {
    conn.build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
}

/// Tells the other hubs, on commit.
pub(super) async fn notify(
    tx: &deadpool_postgres::Transaction<'_>,
    payload: &str,
) -> Result<(), tokio_postgres::Error> {
    tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &payload])
        .await
        .map(drop)
}

pub(super) async fn next_generation(
    tx: &deadpool_postgres::Transaction<'_>,
    url: &str,
) -> Result<u64, StoreError> {
    let err = |source| StoreError::Postgres {
        url: url.to_owned(),
        source,
    };
    let row = tx
        .query_opt(sql::GENERATION_NEXT, &[&(MAX_GENERATION as i64)])
        .await
        .map_err(err)?;
    row.map(|r| u64_of(r.get(0)))
        .ok_or_else(|| StoreError::GenerationsExhausted(url.to_owned()))
}
