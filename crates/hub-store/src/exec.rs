//! One body for a store method on both backends. A method's statements and decisions are
//! written once, as an `async fn` over [`Tx`], an open transaction; a backend only opens
//! it, runs the body and commits. SQLite runs the body on its worker thread, where
//! nothing waits ([`run_now`]); PostgreSQL awaits each statement on its connection.
//!
//! Parameters and columns cross as the few types the schema uses: 64-bit integers
//! (every number, `BIGINT` on PostgreSQL), text, bytes (`BLOB`/`BYTEA`), each possibly
//! `NULL`. A column read as another type is an error that names the database and the
//! column, never a panic.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::StoreError;

/// A statement's parameter, as both drivers bind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Param<'a> {
    Int(Option<i64>),
    Text(Option<&'a str>),
    Bytes(&'a [u8]),
    /// PostgreSQL's `BOOLEAN` (a statement's condition); SQLite's 0 or 1.
    Bool(bool),
}

impl From<bool> for Param<'_> {
    fn from(b: bool) -> Self {
        Param::Bool(b)
    }
}

impl From<Option<i64>> for Param<'_> {
    fn from(n: Option<i64>) -> Self {
        Param::Int(n)
    }
}

impl From<Option<u64>> for Param<'_> {
    fn from(n: Option<u64>) -> Self {
        Param::Int(n.map(|n| n as i64))
    }
}

impl From<Option<usize>> for Param<'_> {
    fn from(n: Option<usize>) -> Self {
        Param::Int(n.map(|n| n as i64))
    }
}

impl From<usize> for Param<'_> {
    fn from(n: usize) -> Self {
        Param::Int(Some(n as i64))
    }
}

impl From<i64> for Param<'_> {
    fn from(n: i64) -> Self {
        Param::Int(Some(n))
    }
}

/// As the store keeps every unsigned number: in a signed 64-bit column.
impl From<u64> for Param<'_> {
    fn from(n: u64) -> Self {
        Param::Int(Some(n as i64))
    }
}

impl<'a> From<Option<&'a str>> for Param<'a> {
    fn from(s: Option<&'a str>) -> Self {
        Param::Text(s)
    }
}

impl<'a> From<&'a [u8]> for Param<'a> {
    fn from(b: &'a [u8]) -> Self {
        Param::Bytes(b)
    }
}

impl<'a> From<&'a str> for Param<'a> {
    fn from(s: &'a str) -> Self {
        Param::Text(Some(s))
    }
}

impl<'a> From<&'a String> for Param<'a> {
    fn from(s: &'a String) -> Self {
        Param::Text(Some(s))
    }
}

impl<'a> From<&'a Option<String>> for Param<'a> {
    fn from(s: &'a Option<String>) -> Self {
        Param::Text(s.as_deref())
    }
}

impl<'a> From<&'a Vec<u8>> for Param<'a> {
    fn from(b: &'a Vec<u8>) -> Self {
        Param::Bytes(b)
    }
}

/// A statement's parameters: `args![a, b]` is `[Param::from(a), Param::from(b)]`.
macro_rules! args {
    ($($a:expr),* $(,)?) => { [$($crate::exec::Param::from($a)),*] };
}
pub(crate) use args;

/// One column's value, as read: the schema's few types ([`Cell`], which a copy between
/// stores reads too).
pub(crate) use crate::copy::Cell as Value;

/// A row as read: its values, and the database it came from (for errors).
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) values: Vec<Value>,
    pub(crate) store: Arc<str>,
}

impl Row {
    fn take(&mut self, i: usize) -> Value {
        self.values
            .get_mut(i)
            .map_or(Value::Null, |v| std::mem::replace(v, Value::Null))
    }

    fn wrong(&self, i: usize, want: &'static str, found: &Value) -> StoreError {
        StoreError::Column {
            store: self.store.to_string(),
            index: i,
            want,
            found: found.kind(),
        }
    }

    pub(crate) fn int(&mut self, i: usize) -> Result<i64, StoreError> {
        match self.take(i) {
            Value::Int(n) => Ok(n),
            other => Err(self.wrong(i, "an integer", &other)),
        }
    }

    pub(crate) fn opt_int(&mut self, i: usize) -> Result<Option<i64>, StoreError> {
        match self.take(i) {
            Value::Null => Ok(None),
            Value::Int(n) => Ok(Some(n)),
            other => Err(self.wrong(i, "an integer", &other)),
        }
    }

    /// A number the store keeps signed (a negative one reads as 0, as `u64_of` does).
    pub(crate) fn u64(&mut self, i: usize) -> Result<u64, StoreError> {
        self.int(i).map(crate::u64_of)
    }

    pub(crate) fn opt_u64(&mut self, i: usize) -> Result<Option<u64>, StoreError> {
        match self.take(i) {
            Value::Null => Ok(None),
            Value::Int(n) => Ok(Some(crate::u64_of(n))),
            other => Err(self.wrong(i, "an integer", &other)),
        }
    }

    pub(crate) fn opt_text(&mut self, i: usize) -> Result<Option<String>, StoreError> {
        match self.take(i) {
            Value::Null => Ok(None),
            Value::Text(s) => Ok(Some(s)),
            other => Err(self.wrong(i, "text", &other)),
        }
    }

    pub(crate) fn text(&mut self, i: usize) -> Result<String, StoreError> {
        match self.take(i) {
            Value::Text(s) => Ok(s),
            other => Err(self.wrong(i, "text", &other)),
        }
    }

    pub(crate) fn bytes(&mut self, i: usize) -> Result<Vec<u8>, StoreError> {
        match self.take(i) {
            Value::Bytes(b) => Ok(b),
            other => Err(self.wrong(i, "bytes", &other)),
        }
    }
}

/// An open transaction of either backend. Statements are written with PostgreSQL's
/// `$1` parameters (crate::sql); SQLite's runs them through `sql::lite`.
pub(crate) trait Tx {
    /// The database, as errors name it (a path, a URL).
    fn name(&self) -> &str;

    /// Whether other hubs write to this database too (PostgreSQL): a read that decides a
    /// change locks the rows it reads (`FOR UPDATE`), and a change they must load again
    /// says so ([`Tx::tell`]). SQLite's one hub needs neither.
    fn shared(&self) -> bool;

    /// `locked`, the form of `read` that locks the rows it reads, where other hubs write
    /// too ([`Tx::shared`]); else `read` (`crate::sql`'s `read_and_locked!` makes both).
    fn locking<'s>(&self, read: &'s str, locked: &'s str) -> &'s str {
        if self.shared() {
            locked
        } else {
            read
        }
    }

    /// Tells the other hubs, when the transaction commits, that `key` changed as `kind`
    /// says (`a`: an agent, `f`: the fleet, `q`: a queued job, `o`: a job's output, `t`:
    /// the tokens), with the generation the change took, if any. Nothing where no other
    /// hub is.
    fn tell(&mut self, kind: char, generation: Option<u64>, key: &str);

    /// Whether this transaction may do `work` now, which one hub at a time does while the
    /// others skip it (their turn comes round again); held until the transaction ends.
    /// SQLite's one hub always may.
    fn try_lock(&mut self, work: Lock) -> impl Future<Output = Result<bool, StoreError>>;

    /// Runs a statement; the rows it changed.
    fn execute(
        &mut self,
        sql: &str,
        args: &[Param<'_>],
    ) -> impl Future<Output = Result<u64, StoreError>>;

    /// Runs a query; every row it answered.
    fn query(
        &mut self,
        sql: &str,
        args: &[Param<'_>],
    ) -> impl Future<Output = Result<Vec<Row>, StoreError>>;

    /// The first row a query answered, if any.
    fn query_opt(
        &mut self,
        sql: &str,
        args: &[Param<'_>],
    ) -> impl Future<Output = Result<Option<Row>, StoreError>> {
        async move { Ok(self.query(sql, args).await?.into_iter().next()) }
    }
}

/// Work that one hub at a time does, the others skipping it ([`Tx::try_lock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lock {
    /// Deleting the oldest done jobs past the number kept.
    Retention,
    /// Maintenance that must run with no hub on the database (every running hub holds
    /// this lock shared; SQLite's data dir lock keeps its hub out).
    NoHub,
}

/// What a body that writes decided: its writes kept, or none of them (a compared write
/// that found the row moved must not keep what it wrote before it looked).
pub(crate) enum Decided<T> {
    Commit(T),
    Rollback(T),
}

/// The next number of the counter `key` in `meta`; its row stays locked until the end of
/// the transaction, which makes the writers behind one counter take turns.
pub(crate) async fn next_seq(tx: &mut impl Tx, key: &str) -> Result<i64, StoreError> {
    match tx.query_opt(crate::sql::SEQ_NEXT, &args![key]).await? {
        Some(mut row) => row.int(0),
        None => Err(StoreError::Missing {
            store: tx.name().to_owned(),
            what: format!("the counter {key}"),
        }),
    }
}

/// The next generation of the fleet's one counter; an error once every generation a hub
/// may hand out has been (`MAX_GENERATION`).
pub(crate) async fn next_generation(tx: &mut impl Tx) -> Result<u64, StoreError> {
    let bound = args![crate::proto::desired::MAX_GENERATION];
    match tx.query_opt(crate::sql::GENERATION_NEXT, &bound).await? {
        Some(mut row) => row.u64(0),
        None => Err(StoreError::GenerationsExhausted(tx.name().to_owned())),
    }
}

/// Gives `scope` the next generation, which is returned.
pub(crate) async fn bump_scope(tx: &mut impl Tx, scope: &str) -> Result<u64, StoreError> {
    let generation = next_generation(tx).await?;
    let put = args![scope, generation];
    tx.execute(crate::sql::DESIRED_PUT_GENERATION, &put).await?;
    Ok(generation)
}

/// `chunk`, its last item repeated up to `n` items: the rows of a statement written for
/// `n` (a batch's last chunk), so that one prepared statement serves any batch. Only for
/// a statement that takes a row twice as it takes it once (an `IN` list, an `UPDATE …
/// FROM` of the same values).
pub(crate) fn filled<T>(chunk: &[T], n: usize) -> impl Iterator<Item = &T> {
    let last = chunk.last();
    chunk
        .iter()
        .chain(std::iter::repeat_n(last, n.saturating_sub(chunk.len())).flatten())
}

/// Runs `body` to its end on this thread, for a backend whose statements never wait
/// (SQLite's, on its worker thread).
pub(crate) fn run_now<T>(body: impl Future<Output = T>) -> T {
    let mut body = pin!(body);
    match body.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        // A body over SQLite's `Tx` awaits nothing else: it cannot be pending.
        Poll::Pending => unreachable!("a store body waited on something other than SQLite"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(values: Vec<Value>) -> Row {
        Row {
            values,
            store: "test.db".into(),
        }
    }

    #[test]
    fn a_column_read_as_another_type_is_an_error_that_names_it() {
        let mut r = row(vec![Value::Text("x".into()), Value::Null, Value::Int(-3)]);
        let e = r.int(0).expect_err("text is no integer").to_string();
        assert!(e.contains("test.db") && e.contains("column 0"), "{e}");
        assert_eq!(r.opt_text(1).expect("null"), None);
        assert_eq!(r.u64(2).expect("int"), 0, "a negative count reads as 0");
        assert!(r.text(5).is_err(), "past the row: NULL, not text");
    }

    #[test]
    fn a_chunk_is_filled_with_its_last_item() {
        let filled: Vec<_> = filled(&[1, 2], 4).copied().collect();
        assert_eq!(filled, [1, 2, 2, 2]);
        assert_eq!(super::filled(&[1, 2, 3], 3).count(), 3);
        assert_eq!(super::filled::<u8>(&[], 3).count(), 0, "nothing to repeat");
    }

    #[test]
    fn arguments_take_the_stores_forms() {
        let name = String::from("n");
        let none: Option<String> = None;
        let sealed = vec![1u8];
        let a = args![&name, 7u64, -1i64, &none, &sealed];
        assert_eq!(a[1], Param::Int(Some(7)));
        assert_eq!(a[3], Param::Text(None));
        assert_eq!(a[4], Param::Bytes(&[1]));
    }
}
