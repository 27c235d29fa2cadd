//! The SQLite store read table by table for `hub store copy`, a page at a time in rowid
//! order (every table here has a rowid), so that memory stays bounded.

use super::{sql, SqliteStore};
use crate::copy::{quote, Cell, Table, NOT_COPIED, PAGE_BYTES, PAGE_ROWS};
use crate::StoreError;

impl SqliteStore {
    /// Every table a copy moves (all but SQLite's own and [`NOT_COPIED`]), with its
    /// columns in order.
    pub async fn tables(&self) -> Result<Vec<Table>, StoreError> {
        self.with(|conn, path| {
            let mut stmt = conn
                .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
                .map_err(sql(path))?;
            let names = stmt
                .query_map([], |r| r.get::<_, String>(0))
                .map_err(sql(path))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql(path))?;
            let mut tables = Vec::new();
            for name in names.into_iter().filter(|n| !NOT_COPIED.contains(&n.as_str())) {
                let mut info = conn
                    .prepare(&format!("PRAGMA table_info({})", quote(&name)))
                    .map_err(sql(path))?;
                let columns = info
                    .query_map([], |r| r.get::<_, String>(1))
                    .map_err(sql(path))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(sql(path))?;
                tables.push(Table { name, columns });
            }
            Ok(tables)
        })
        .await
    }

    /// `table`'s rows after rowid `after`, a page of them, and the last one's rowid.
    pub async fn page(
        &self,
        table: &Table,
        after: i64,
    ) -> Result<(Vec<Vec<Cell>>, i64), StoreError> {
        let query = format!(
            "SELECT rowid, {} FROM {} WHERE rowid > ?1 ORDER BY rowid LIMIT {PAGE_ROWS}",
            table
                .columns
                .iter()
                .map(|c| quote(c))
                .collect::<Vec<_>>()
                .join(", "),
            quote(&table.name)
        );
        let width = table.columns.len();
        let t = table.clone();
        self.with(move |conn, path| {
            let mut stmt = conn.prepare(&query).map_err(sql(path))?;
            let mut rows = stmt.query([after]).map_err(sql(path))?;
            let (mut page, mut last, mut bytes) = (Vec::new(), after, 0);
            while let Some(r) = rows.next().map_err(sql(path))? {
                last = r.get(0).map_err(sql(path))?;
                let mut row = Vec::with_capacity(width);
                for i in 1..=width {
                    let odd = |why: &str| StoreError::Uncopyable {
                        store: path.to_owned(),
                        at: format!("{}.{} (rowid {last})", t.name, t.columns[i - 1]),
                        why: why.to_owned(),
                    };
                    let cell = super::exec::cell(r.get_ref(i).map_err(sql(path))?).map_err(odd)?;
                    bytes += cell.size();
                    row.push(cell);
                }
                page.push(row);
                if bytes >= PAGE_BYTES {
                    break;
                }
            }
            Ok((page, last))
        })
        .await
    }
}
