//! What `hub store copy` moves from one hub's SQLite store into an empty PostgreSQL
//! database, and the sums that prove it arrived whole (docs/hub.md, "From one SQLite hub
//! to replicas"). Both stores run the same migrations, so a table is copied column for
//! column; what arrived is read back and summed the same way as what was read.

use sha2::{Digest, Sha256};

/// Tables a copy leaves behind: `leases` names the hub that drives rollouts now, and
/// the replicas elect their own.
pub const NOT_COPIED: &[&str] = &["leases"];

/// The most rows, and about the most bytes, read from the source at once: a page of
/// job output stays small in memory whatever the store holds.
pub const PAGE_ROWS: usize = 500;
pub const PAGE_BYTES: usize = 8 << 20;

/// A value as both stores hold it: the schema has BIGINT, TEXT and BLOB (BYTEA) only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    Null,
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

impl Cell {
    /// About what the value takes in memory.
    pub fn size(&self) -> usize {
        match self {
            Cell::Null | Cell::Int(_) => 8,
            Cell::Text(s) => s.len(),
            Cell::Bytes(b) => b.len(),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Cell::Null => "NULL",
            Cell::Int(_) => "an integer",
            Cell::Text(_) => "text",
            Cell::Bytes(_) => "bytes",
        }
    }
}

/// A table and its columns, in the source's order.
#[derive(Debug, Clone)]
pub struct Table {
    pub name: String,
    pub columns: Vec<String>,
}

impl Table {
    pub fn new(name: &str, columns: &[&str]) -> Self {
        Self {
            name: name.to_owned(),
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
        }
    }

    /// The index of `column`, if the table has it.
    pub fn column(&self, column: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == column)
    }
}

/// An identifier as SQL takes it, whatever it holds.
pub fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A table's row count and an order-free sum of its rows' SHA-256: the same rows give
/// the same sum whatever order each store returns them in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sum {
    pub rows: u64,
    sum: u128,
}

impl Sum {
    pub fn add(&mut self, row: &[Cell]) {
        let mut h = Sha256::new();
        for cell in row {
            let (tag, bytes): (u8, &[u8]) = match cell {
                Cell::Null => (0, &[]),
                Cell::Int(i) => (1, &i.to_le_bytes()),
                Cell::Text(s) => (2, s.as_bytes()),
                Cell::Bytes(b) => (3, b),
            };
            // Tagged and length-prefixed: no two rows share an encoding.
            h.update([tag]);
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        }
        let digest = h.finalize();
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest[..16]);
        self.rows += 1;
        self.sum = self.sum.wrapping_add(u128::from_le_bytes(first));
    }

    /// The sum, as shown to the operator.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_depends_on_the_rows_not_their_order() {
        let a = vec![Cell::Text("a".into()), Cell::Int(1)];
        let b = vec![Cell::Text("b".into()), Cell::Null];
        let (mut x, mut y) = (Sum::default(), Sum::default());
        x.add(&a);
        x.add(&b);
        y.add(&b);
        y.add(&a);
        assert_eq!(x, y);
        assert_eq!(x.rows, 2);
        // A value moved between columns, or typed otherwise, is another row.
        let mut z = Sum::default();
        z.add(&[Cell::Text("a1".into()), Cell::Null]);
        z.add(&b);
        assert_ne!(x, z);
        let mut w = Sum::default();
        w.add(&[Cell::Bytes(b"a".to_vec()), Cell::Int(1)]);
        w.add(&b);
        assert_ne!(x, w);
    }
}
