//! The receiving end of `hub store copy`: one transaction on an empty database, alone on
//! it (the hubs' lock taken exclusively), that takes rows table by table and reads each
//! table back to sum it. Nothing is committed unless every sum matched: a target dropped
//! before [`CopyTarget::commit`] closes its connection, and the server rolls it all back.

use deadpool_postgres::Object;
use futures_util::{pin_mut, TryStreamExt};
use tokio_postgres::types::{ToSql, Type};

use super::PgStore;
use crate::copy::{quote, Cell, Sum, Table};
use crate::StoreError;

/// Rows per INSERT, at most (and never past PostgreSQL's 65 535 parameters).
const ROWS_PER_INSERT: usize = 100;
/// Tables that are PostgreSQL's alone and hold nothing to copy over.
const OWN_TABLES: &[&str] = &["railgrid_migrations"];

/// The copy's transaction, on a connection of its own.
pub struct CopyTarget {
    conn: Option<Object>,
    url: String,
}

impl PgStore {
    /// Opens the copy's transaction: refused while a hub holds the database, or unless
    /// it is empty (every table without rows, the counters at zero).
    pub async fn begin_copy(&self) -> Result<CopyTarget, StoreError> {
        let e = self.err();
        let conn = self.conn().await?;
        conn.batch_execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
            .await
            .map_err(&e)?;
        let target = CopyTarget {
            conn: Some(conn),
            url: self.url.clone(),
        };
        let c = target.client();
        self.alone(c).await?;
        let tables: Vec<String> = c
            .query(
                "SELECT table_name::text FROM information_schema.tables
                 WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'
                 ORDER BY 1",
                &[],
            )
            .await
            .map_err(&e)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut held = Vec::new();
        for t in tables.iter().filter(|t| !OWN_TABLES.contains(&t.as_str())) {
            let query = if t == "meta" {
                // The migrations' counters, at zero until a hub used them.
                "SELECT EXISTS (SELECT 1 FROM meta WHERE value <> 0)".to_owned()
            } else {
                format!("SELECT EXISTS (SELECT 1 FROM {})", quote(t))
            };
            let any: bool = c.query_one(&query, &[]).await.map_err(&e)?.get(0);
            if any {
                held.push(format!("rows in {t}"));
            }
        }
        if !held.is_empty() {
            return Err(StoreError::NotEmpty {
                url: self.url.clone(),
                what: held.join(", "),
            });
        }
        // The source's counters take the place of the migrations' zeros.
        c.execute("DELETE FROM meta", &[]).await.map_err(&e)?;
        Ok(target)
    }
}

impl CopyTarget {
    fn client(&self) -> &Object {
        self.conn
            .as_ref()
            .expect("a copy target holds its connection until the end")
    }

    fn err(&self) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
        move |source| StoreError::Postgres {
            url: self.url.clone(),
            source,
        }
    }

    /// Inserts `rows` (in `table`'s column order), refusing a value of another type than
    /// its column's.
    pub async fn insert(&self, table: &Table, rows: &[Vec<Cell>]) -> Result<(), StoreError> {
        let e = self.err();
        let width = table.columns.len().max(1);
        let per = ROWS_PER_INSERT.min(60_000 / width).max(1);
        let columns = column_list(table);
        for chunk in rows.chunks(per) {
            let values = (0..chunk.len())
                .map(|r| {
                    let ps = (1..=width)
                        .map(|c| format!("${}", r * width + c))
                        .collect::<Vec<_>>()
                        .join(", ");
                    format!("({ps})")
                })
                .collect::<Vec<_>>()
                .join(", ");
            let stmt = self
                .client()
                .prepare(&format!(
                    "INSERT INTO {} ({columns}) VALUES {values}",
                    quote(&table.name)
                ))
                .await
                .map_err(&e)?;
            let types = stmt.params();
            let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(types.len());
            for (i, cell) in chunk.iter().flatten().enumerate() {
                let ty = &types[i];
                params.push(param(cell, ty).ok_or_else(|| StoreError::Uncopyable {
                    store: self.url.clone(),
                    at: format!("{}.{}", table.name, table.columns[i % width]),
                    why: format!("{} where the database has {ty}", cell.kind()),
                })?);
            }
            self.client().execute(&stmt, &params).await.map_err(&e)?;
        }
        Ok(())
    }

    /// `table` as this transaction now holds it, summed as the source was.
    pub async fn sum(&self, table: &Table) -> Result<Sum, StoreError> {
        let e = self.err();
        let columns = column_list(table);
        let rows = self
            .client()
            .query_raw(
                &format!("SELECT {columns} FROM {}", quote(&table.name)),
                std::iter::empty::<i64>(),
            )
            .await
            .map_err(&e)?;
        pin_mut!(rows);
        let mut sum = Sum::default();
        while let Some(row) = rows.try_next().await.map_err(&e)? {
            let mut cells = Vec::with_capacity(table.columns.len());
            for i in 0..row.len() {
                cells.push(super::exec::cell(&row, i).map_err(&e)?);
            }
            sum.add(&cells);
        }
        Ok(sum)
    }

    pub async fn commit(mut self) -> Result<(), StoreError> {
        let conn = self.conn.take().expect("committed once");
        conn.batch_execute("COMMIT")
            .await
            .map_err(|source| StoreError::Postgres {
                url: self.url.clone(),
                source,
            })
    }
}

impl Drop for CopyTarget {
    fn drop(&mut self) {
        // Not committed: the connection is closed rather than returned to the pool
        // mid-transaction, and the server rolls back everything it took.
        if let Some(conn) = self.conn.take() {
            drop(Object::take(conn));
        }
    }
}

/// `cell` as a parameter of type `ty`, if it is of that type (NULL is of every type).
fn param<'a>(cell: &'a Cell, ty: &Type) -> Option<&'a (dyn ToSql + Sync)> {
    Some(match (cell, ty) {
        (Cell::Null, &Type::INT8) => &None::<i64>,
        (Cell::Null, &Type::BYTEA) => &None::<Vec<u8>>,
        (Cell::Null, &Type::TEXT | &Type::VARCHAR) => &None::<String>,
        (Cell::Int(i), &Type::INT8) => i,
        (Cell::Text(s), &Type::TEXT | &Type::VARCHAR) => s,
        (Cell::Bytes(b), &Type::BYTEA) => b,
        _ => return None,
    })
}

/// `table`'s columns, quoted, in its order.
fn column_list(table: &Table) -> String {
    table
        .columns
        .iter()
        .map(|c| quote(c))
        .collect::<Vec<_>>()
        .join(", ")
}
