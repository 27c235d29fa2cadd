//! PostgreSQL's side of [`Tx`]: each statement awaited on the transaction's connection.

use std::error::Error;
use std::sync::Arc;

use bytes::BytesMut;
use deadpool_postgres::GenericClient;
use tokio_postgres::types::{IsNull, ToSql, Type};

use super::{PgStore, CHANNEL, HUBS_LOCK, MIGRATION_LOCK};
use crate::exec::{Decided, Lock, Param, Row, Tx, Value};
use crate::StoreError;

/// One of the pool's connections, in a transaction or not (a read alone needs none).
pub(super) struct PgTx<'a, C> {
    client: &'a C,
    url: Arc<str>,
    /// What to tell the other hubs at commit: (kind, generation or 0, key).
    told: Vec<(char, u64, String)>,
}

impl<C: GenericClient + Sync> PgTx<'_, C> {
    /// `statement`, prepared once per connection: a body that runs one statement per
    /// row (members, progress) pays for its parsing once.
    async fn prepared(&self, statement: &str) -> Result<tokio_postgres::Statement, StoreError> {
        self.client
            .prepare_cached(statement)
            .await
            .map_err(self.err())
    }
    fn err(&self) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
        move |source| StoreError::Postgres {
            url: self.url.to_string(),
            source,
        }
    }
}

/// Tells the other hubs, on commit.
async fn notify(
    tx: &deadpool_postgres::Transaction<'_>,
    payload: &str,
) -> Result<(), tokio_postgres::Error> {
    tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &payload])
        .await
        .map(drop)
}

type BoxError = Box<dyn Error + Sync + Send>;

impl ToSql for Param<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match *self {
            Param::Int(n) => n.to_sql(ty, out),
            Param::Text(s) => s.to_sql(ty, out),
            Param::Bytes(b) => b.to_sql(ty, out),
            Param::Bool(b) => b.to_sql(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <i64 as ToSql>::accepts(ty)
            || <&str as ToSql>::accepts(ty)
            || <&[u8] as ToSql>::accepts(ty)
            || <bool as ToSql>::accepts(ty)
    }

    /// Checked against the variant's own type: text never goes into a `BIGINT`.
    fn to_sql_checked(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match *self {
            Param::Int(n) => n.to_sql_checked(ty, out),
            Param::Text(s) => s.to_sql_checked(ty, out),
            Param::Bytes(b) => b.to_sql_checked(ty, out),
            Param::Bool(b) => b.to_sql_checked(ty, out),
        }
    }
}

/// One column of `row`, as the store reads it (and a copy between stores).
pub(super) fn cell(row: &tokio_postgres::Row, i: usize) -> Result<Value, tokio_postgres::Error> {
    let ty = row.columns()[i].type_();
    let v = if *ty == Type::INT8 {
        row.try_get::<_, Option<i64>>(i)?.map(Value::Int)
    } else if *ty == Type::INT4 {
        row.try_get::<_, Option<i32>>(i)?
            .map(|n| Value::Int(n.into()))
    } else if *ty == Type::INT2 {
        row.try_get::<_, Option<i16>>(i)?
            .map(|n| Value::Int(n.into()))
    } else if *ty == Type::BOOL {
        row.try_get::<_, Option<bool>>(i)?
            .map(|b| Value::Int(b.into()))
    } else if *ty == Type::BYTEA {
        row.try_get::<_, Option<Vec<u8>>>(i)?.map(Value::Bytes)
    } else {
        // Text, and anything else the driver reads as text (it says so when it cannot).
        row.try_get::<_, Option<String>>(i)?.map(Value::Text)
    };
    Ok(v.unwrap_or(Value::Null))
}

impl<C: GenericClient + Sync> Tx for PgTx<'_, C> {
    fn name(&self) -> &str {
        &self.url
    }

    fn shared(&self) -> bool {
        true
    }

    fn tell(&mut self, kind: char, generation: Option<u64>, key: &str) {
        self.told
            .push((kind, generation.unwrap_or(0), key.to_owned()));
    }

    async fn try_lock(&mut self, work: Lock) -> Result<bool, StoreError> {
        // Transaction-scoped advisory locks, numbered past the migrations' own.
        let key = match work {
            Lock::Retention => MIGRATION_LOCK + 1,
            Lock::NoHub => HUBS_LOCK,
        };
        let row = self
            .client
            .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&key])
            .await
            .map_err(self.err())?;
        row.try_get(0).map_err(self.err())
    }

    async fn execute(&mut self, statement: &str, args: &[Param<'_>]) -> Result<u64, StoreError> {
        let args: Vec<&(dyn ToSql + Sync)> = args.iter().map(|a| a as _).collect();
        let statement = self.prepared(statement).await?;
        self.client
            .execute(&statement, &args)
            .await
            .map_err(self.err())
    }

    async fn query(&mut self, statement: &str, args: &[Param<'_>]) -> Result<Vec<Row>, StoreError> {
        let args: Vec<&(dyn ToSql + Sync)> = args.iter().map(|a| a as _).collect();
        let statement = self.prepared(statement).await?;
        let rows = self
            .client
            .query(&statement, &args)
            .await
            .map_err(self.err())?;
        rows.iter()
            .map(|r| {
                let values = (0..r.len())
                    .map(|i| cell(r, i))
                    .collect::<Result<_, _>>()
                    .map_err(self.err())?;
                Ok(Row {
                    values,
                    store: self.url.clone(),
                })
            })
            .collect()
    }
}

impl PgStore {
    /// Runs `body` in one transaction, committed when it decides so (rolled back when it
    /// decides so, or fails).
    pub(super) async fn transact<T>(
        &self,
        body: impl AsyncFnOnce(
            &mut PgTx<'_, deadpool_postgres::Transaction<'_>>,
        ) -> Result<Decided<T>, StoreError>,
    ) -> Result<T, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let mut t = PgTx {
            client: &tx,
            url: self.url.as_str().into(),
            told: Vec::new(),
        };
        let decided = body(&mut t).await?;
        let told = t.told;
        match decided {
            Decided::Commit(out) => {
                // A NOTIFY is delivered at commit: never of a change that did not commit.
                for (kind, generation, key) in &told {
                    notify(&tx, &self.payload(*kind, *generation, key))
                        .await
                        .map_err(&e)?;
                }
                tx.commit().await.map_err(&e)?;
                // The generations taken count as this hub's own, once committed.
                for (_, generation, _) in told.iter().filter(|t| t.1 > 0) {
                    self.took(*generation);
                }
                Ok(out)
            }
            // Dropped: rolled back.
            Decided::Rollback(out) => Ok(out),
        }
    }

    /// Runs `body`, which only reads, in one read-only snapshot (its reads agree with
    /// each other, whatever other hubs commit meanwhile).
    pub(super) async fn snapshot<T>(
        &self,
        body: impl AsyncFnOnce(
            &mut PgTx<'_, deadpool_postgres::Transaction<'_>>,
        ) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(&e)?;
        let out = body(&mut PgTx {
            client: &tx,
            url: self.url.as_str().into(),
            told: Vec::new(),
        })
        .await?;
        tx.commit().await.map_err(&e)?;
        Ok(out)
    }

    /// Runs `body` outside a transaction: reads, or one statement that commits alone.
    pub(super) async fn plain<T>(
        &self,
        body: impl AsyncFnOnce(&mut PgTx<'_, deadpool_postgres::Object>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = self.conn().await?;
        // Nothing told: a statement that commits alone tells no other hub.
        body(&mut PgTx {
            client: &conn,
            url: self.url.as_str().into(),
            told: Vec::new(),
        })
        .await
    }
}
