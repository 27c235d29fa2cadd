//! The list commands' plain-text tables: one layout a table, written once for its header
//! and its rows, so that the two cannot drift apart.

use std::fmt::{Display, Write as _};

/// One piece of a layout: text between columns, or a column and its padding.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Left(usize),
    Right(usize),
    /// The last column: not padded.
    Rest,
}

/// A table being written: its layout and the lines so far.
pub(super) struct Table {
    layout: Vec<Piece>,
    out: String,
}

impl Table {
    /// A table laid out as `layout` says, in `format!`'s words: `{:<N}` and `{:>N}` pad a
    /// column to N characters on the right or on the left, `{}` is an unpadded column,
    /// text outside braces is written as it is. Any other column is a programming error,
    /// which panics when the table is made.
    /// Its first row is `header`.
    pub(super) fn new(layout: &str, header: &[&str]) -> Self {
        let mut table = Self {
            layout: parse(layout),
            out: String::new(),
        };
        let cells: Vec<&dyn Display> = header.iter().map(|h| h as &dyn Display).collect();
        table.row(&cells);
        table
    }

    /// Writes one row: a cell a column, in order.
    pub(super) fn row(&mut self, cells: &[&dyn Display]) {
        let columns = self.layout.iter().filter(|p| !matches!(p, Piece::Text(_)));
        debug_assert_eq!(cells.len(), columns.count(), "a cell for each column");
        let mut cells = cells.iter();
        for piece in &self.layout {
            let mut cell = || cells.next().map(|c| c.to_string()).unwrap_or_default();
            let _ = match piece {
                Piece::Text(t) => write!(self.out, "{t}"),
                Piece::Left(w) => write!(self.out, "{:<w$}", cell(), w = *w),
                Piece::Right(w) => write!(self.out, "{:>w$}", cell(), w = *w),
                Piece::Rest => write!(self.out, "{}", cell()),
            };
        }
        self.out.push('\n');
    }

    /// The table's text, a line a row.
    pub(super) fn finish(self) -> String {
        self.out
    }
}

fn parse(layout: &str) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut rest = layout;
    while let Some(open) = rest.find('{') {
        let close = open + rest[open..].find('}').expect("a column's `{` is closed");
        if open > 0 {
            pieces.push(Piece::Text(rest[..open].to_owned()));
        }
        let spec = &rest[open + 1..close];
        let width = |w: &str| {
            w.parse()
                .unwrap_or_else(|_| panic!("a column's width is a number: {{{spec}}}"))
        };
        pieces.push(if spec.is_empty() {
            Piece::Rest
        } else if let Some(w) = spec.strip_prefix(":<") {
            Piece::Left(width(w))
        } else if let Some(w) = spec.strip_prefix(":>") {
            Piece::Right(width(w))
        } else {
            panic!("a column is {{}}, {{:<N}} or {{:>N}}, not {{{spec}}}")
        });
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_owned()));
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_written_as_format_writes_the_same_layout() {
        let mut t = Table::new("{:<6} {:>9}  {:<4} {}", &["ID", "USES", "NAME", "REST"]);
        t.row(&[&"et1", &"2/5", &"cï", &"a b"]);
        t.row(&[&"toolongforit", &7, &"", &""]);
        let mut want = String::new();
        for (a, b, c, d) in [
            ("ID", "USES", "NAME", "REST"),
            ("et1", "2/5", "cï", "a b"),
            ("toolongforit", "7", "", ""),
        ] {
            let _ = writeln!(want, "{a:<6} {b:>9}  {c:<4} {d}");
        }
        assert_eq!(t.finish(), want);
    }

    #[test]
    #[should_panic(expected = "not {:^5}")]
    fn a_column_it_cannot_pad_is_refused() {
        Table::new("{:<3} {:^5}", &["A", "B"]);
    }

    #[test]
    fn text_after_the_last_column_is_kept() {
        let mut t = Table::new("{:<3}|", &["A"]);
        t.row(&[&1]);
        assert_eq!(t.finish(), "A  |\n1  |\n");
    }
}
