//! SQLite's side of [`Tx`]: statements run at once on the worker thread that holds the
//! connection, so a body over it never waits ([`crate::exec::run_now`]).

use std::sync::Arc;

use rusqlite::types::{ToSqlOutput, ValueRef};

use super::{sql, SqliteStore};
pub(super) use crate::exec::run_now;
use crate::exec::{Decided, Lock, Param, Row, Tx, Value};
use crate::sql::lite;
use crate::StoreError;

/// The store's one connection, in a transaction or not (a read alone needs none).
pub(super) struct LiteTx<'c> {
    conn: &'c rusqlite::Connection,
    path: Arc<str>,
}

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        match self {
            Param::Int(n) => n.to_sql(),
            Param::Text(s) => s.to_sql(),
            Param::Bytes(b) => b.to_sql(),
            Param::Bool(b) => b.to_sql(),
        }
    }
}

impl LiteTx<'_> {
    fn err(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        sql(&self.path)
    }
}

impl Tx for LiteTx<'_> {
    fn name(&self) -> &str {
        &self.path
    }

    fn shared(&self) -> bool {
        false
    }

    fn tell(&mut self, _kind: char, _generation: Option<u64>, _key: &str) {}

    async fn try_lock(&mut self, _work: Lock) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn execute(&mut self, statement: &str, args: &[Param<'_>]) -> Result<u64, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(&lite(statement))
            .map_err(self.err())?;
        let n = stmt
            .execute(rusqlite::params_from_iter(args))
            .map_err(self.err())?;
        Ok(n as u64)
    }

    async fn query(&mut self, statement: &str, args: &[Param<'_>]) -> Result<Vec<Row>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(&lite(statement))
            .map_err(self.err())?;
        let width = stmt.column_count();
        let mut rows = stmt
            .query(rusqlite::params_from_iter(args))
            .map_err(self.err())?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(self.err())? {
            let mut values = Vec::with_capacity(width);
            for i in 0..width {
                let v = r.get_ref(i).map_err(self.err())?;
                values.push(cell(v).map_err(|found| StoreError::Column {
                    store: self.path.to_string(),
                    index: i,
                    want: "a value of the schema's types",
                    found,
                })?);
            }
            out.push(Row {
                values,
                store: self.path.clone(),
            });
        }
        Ok(out)
    }
}

impl SqliteStore {
    /// Runs `body` in one transaction on the worker thread, committed when it decides so
    /// (rolled back when it decides so, or fails). A body written once runs through
    /// [`run_now`]: `transact(move |t| run_now(secrets::put(t, &row, ..)))`.
    pub(super) async fn transact<T: Send + 'static>(
        &self,
        body: impl FnOnce(&mut LiteTx<'_>) -> Result<Decided<T>, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.with(move |conn, path| {
            let tx = conn.transaction().map_err(sql(path))?;
            let decided = body(&mut LiteTx {
                conn: &tx,
                path: path.into(),
            })?;
            match decided {
                Decided::Commit(out) => {
                    tx.commit().map_err(sql(path))?;
                    Ok(out)
                }
                Decided::Rollback(out) => Ok(out),
            }
        })
        .await
    }

    /// Runs `body` outside a transaction: reads, which see one state (the one connection
    /// is the body's alone meanwhile), or one statement that commits alone.
    pub(super) async fn plain<T: Send + 'static>(
        &self,
        body: impl FnOnce(&mut LiteTx<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.with(move |conn, path| {
            body(&mut LiteTx {
                conn,
                path: path.into(),
            })
        })
        .await
    }
}

/// A column's value as SQLite holds it, as the store reads it; what the schema never
/// holds (a floating-point number, text that is not UTF-8) is named instead.
pub(super) fn cell(v: ValueRef<'_>) -> Result<Value, &'static str> {
    Ok(match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(n) => Value::Int(n),
        ValueRef::Text(t) => Value::Text(
            std::str::from_utf8(t)
                .map_err(|_| "text that is not UTF-8")?
                .to_owned(),
        ),
        ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
        ValueRef::Real(_) => return Err("a floating-point number"),
    })
}
