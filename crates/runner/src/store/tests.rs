use super::schema::MIGRATIONS;
use super::*;

fn spec(argv: &[&str]) -> JobSpec {
    JobSpec::from_argv(argv.iter().copied())
}

/// A store in a new directory, kept while the store is in use.
fn fresh() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("jobs.db")).unwrap();
    (dir, store)
}

/// Inserts job `id` running `argv`, once committed.
fn insert(store: &Store, id: &str, argv: &[&str]) -> Inserted {
    store.insert(id, &spec(argv)).wait().unwrap()
}

/// The states job `id` went through, in order.
fn states(store: &Store, id: &str) -> Vec<String> {
    let all = store.transitions(id).unwrap();
    all.into_iter().map(|(state, _)| state).collect()
}

/// Records job `id` as succeeded with `outcome`, once committed.
fn succeed(store: &Store, id: &str, outcome: Outcome) {
    store
        .mark_finished(id, JobState::Succeeded, &outcome)
        .wait()
        .unwrap();
}

#[test]
fn insert_is_idempotent_by_id_and_spec() {
    let (_dir, store) = fresh();
    assert!(matches!(insert(&store, "a", &["true"]), Inserted::New(_)));
    assert!(matches!(
        insert(&store, "a", &["true"]),
        Inserted::Existing(_)
    ));
    assert!(matches!(
        insert(&store, "a", &["false"]),
        Inserted::Conflict(_)
    ));
}

#[test]
fn transitions_are_recorded_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    {
        let store = Store::open(&path).unwrap();
        insert(&store, "a", &["true"]);
        store.mark_starting("a", now_ms()).wait().unwrap();
        store
            .mark_running("a", 1234, Some(99), "rlimits")
            .wait()
            .unwrap();
        succeed(
            &store,
            "a",
            Outcome {
                exit_code: Some(0),
                stdout_bytes: 5,
                ..Outcome::default()
            },
        );
    }
    let store = Store::open(&path).unwrap();
    let rec = store.get("a").unwrap().unwrap();
    assert_eq!(rec.state, JobState::Succeeded);
    assert_eq!(
        (rec.pid, rec.start_time, rec.exit_code, rec.stdout_bytes),
        (Some(1234), Some(99), Some(0), 5)
    );
    assert_eq!(
        states(&store, "a"),
        ["queued", "starting", "running", "succeeded"]
    );
}

/// Returns once the writer is busy in a write that ends when the returned sender is
/// used, so that the writes queued meanwhile share the next batch. The held write's own
/// result is of no interest.
fn hold_writer(store: &Store) -> (std::sync::mpsc::Sender<()>, Pending<()>) {
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (inside, entered) = std::sync::mpsc::channel::<()>();
    let held = store.write(move |_, _| {
        inside.send(()).ok();
        wait.recv().ok();
        Ok(())
    });
    entered.recv().unwrap();
    (go, held)
}

#[test]
fn a_failing_write_does_not_undo_the_others_committed_with_it() {
    let (dir, store) = fresh();
    let (go, held) = hold_writer(&store);
    let b = store.insert("b", &spec(&["true"]));
    // Half done, then failing: its first half must not be committed.
    let bad = store.write(|c, path| {
        c.execute_batch(
            "INSERT INTO jobs (id, owner, spec, state, created_ms) VALUES ('d', '', '{}', 'queued', 0); \
             INSERT INTO no_such_table VALUES (1);",
        )
        .map_err(sql(path))
    });
    let c = store.insert("c", &spec(&["true"]));
    go.send(()).unwrap();
    let _ = held.wait();
    assert!(matches!(b.wait().unwrap(), Inserted::New(_)));
    assert!(matches!(bad.wait(), Err(JobStoreError::Sql { .. })));
    assert!(matches!(c.wait().unwrap(), Inserted::New(_)));
    drop(store);
    let store = Store::open(&dir.path().join("jobs.db")).unwrap();
    assert!(store.get("b").unwrap().is_some());
    assert!(store.get("c").unwrap().is_some());
    assert!(store.get("d").unwrap().is_none());
}

#[test]
fn writes_after_a_rolled_back_transaction_fail_rather_than_commit_alone() {
    let (_dir, store) = fresh();
    let (go, held) = hold_writer(&store);
    let a = store.insert("a", &spec(&["true"]));
    // What SQLITE_FULL does to a transaction, on purpose.
    let rollback = store.write(|c, path| c.execute_batch("ROLLBACK").map_err(sql(path)));
    let c = store.insert("c", &spec(&["true"]));
    go.send(()).unwrap();
    let _ = held.wait();
    let _ = rollback.wait();
    assert!(
        a.wait().is_err(),
        "a write that was rolled back reported success"
    );
    assert!(
        c.wait().is_err(),
        "a write after the rollback reported success"
    );
    assert!(store.get("a").unwrap().is_none());
    assert!(store.get("c").unwrap().is_none());
    // The writer goes on.
    assert!(matches!(insert(&store, "d", &["true"]), Inserted::New(_)));
}

#[test]
fn writes_queued_before_the_store_is_dropped_land() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    {
        let store = Store::open(&path).unwrap();
        for i in 0..100 {
            drop(store.insert(&format!("j{i}"), &spec(&["true"])));
        }
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.in_states(&[JobState::Queued]).unwrap().len(), 100);
}

/// Fails the next `n` state changes the writer tries as a full disk would.
fn fill(store: &Store, n: u32) {
    store.faults.store(n, std::sync::atomic::Ordering::SeqCst);
}

fn held(r: Recorded) -> Pending<()> {
    match r {
        Recorded::Held(later) => later,
        Recorded::Committed => panic!("committed on a full disk"),
    }
}

fn finished(code: i32) -> Outcome {
    Outcome {
        exit_code: Some(code),
        stdout_bytes: 3,
        output_truncated: Truncation::of(Some("disk full writing x".into()), None),
        ..Outcome::default()
    }
}

#[test]
fn a_refused_change_is_held_shown_and_committed_in_order() {
    let (_dir, store) = fresh();
    insert(&store, "a", &["true"]);
    // Refused on the first try and on two retries.
    fill(&store, 3);
    let starting = held(store.mark_starting("a", 7).wait().unwrap());
    // Queued behind the held one, so held without a try of its own.
    let running = held(
        store
            .mark_running("a", 42, Some(9), "rlimits")
            .wait()
            .unwrap(),
    );
    let ended = held(
        store
            .mark_finished("a", JobState::Succeeded, &finished(0))
            .wait()
            .unwrap(),
    );
    assert_eq!(store.held_count(), 3);
    let shown = store.get("a").unwrap().unwrap();
    assert_eq!(shown.state, JobState::Succeeded);
    assert!(shown.commit_pending);
    assert_eq!((shown.pid, shown.exit_code), (Some(42), Some(0)));
    let listed = store.list(None, None, None, 10).unwrap();
    assert_eq!(listed, vec![shown]);

    starting.wait().unwrap();
    running.wait().unwrap();
    ended.wait().unwrap();
    assert_eq!(store.held_count(), 0);
    let rec = store.get("a").unwrap().unwrap();
    assert_eq!(rec.state, JobState::Succeeded);
    assert!(!rec.commit_pending);
    assert_eq!(
        (rec.pid, rec.started_ms, rec.exit_code),
        (Some(42), Some(7), Some(0))
    );
    assert_eq!(
        rec.output_truncated.and_then(|t| t.stdout).as_deref(),
        Some("disk full writing x")
    );
    assert_eq!(
        states(&store, "a"),
        ["queued", "starting", "running", "succeeded"]
    );
}

#[test]
fn filters_of_a_list_see_held_states() {
    let (_dir, store) = fresh();
    for id in ["a", "b", "c"] {
        store.insert(id, &spec(&["true"])).wait().unwrap();
    }
    fill(&store, u32::MAX);
    let _a = held(store.mark_starting("a", 1).wait().unwrap());
    let ids = |state| -> Vec<String> {
        store
            .list(Some(state), None, None, 10)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect()
    };
    assert_eq!(ids(JobState::Queued), ["c", "b"]);
    assert_eq!(ids(JobState::Starting), ["a"]);
    // The limit counts what is shown, not what the database holds.
    let first = store.list(Some(JobState::Queued), None, None, 1).unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].id, "c");
    fill(&store, 0);
}

#[test]
fn new_jobs_are_refused_while_too_many_changes_are_held() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&dir.path().join("jobs.db")).unwrap();
    store.max_held = 2;
    insert(&store, "a", &["true"]);
    fill(&store, u32::MAX);
    let _s = held(store.mark_starting("a", 1).wait().unwrap());
    let r = held(store.mark_running("a", 2, None, "none").wait().unwrap());
    let refused = store.insert("b", &spec(&["true"])).wait();
    assert!(
        matches!(&refused, Err(e @ JobStoreError::Backlog { count: 2, .. }) if e.is_disk_full()),
        "{:?}",
        refused.err()
    );
    // Space returns: the held changes land at the next try, and jobs are taken again.
    fill(&store, 0);
    r.wait().unwrap();
    insert(&store, "c", &["true"]);
    let rec = store.get("a").unwrap().unwrap();
    assert_eq!(rec.state, JobState::Running, "{rec:?}");
}

#[test]
fn a_change_rolled_back_with_its_batch_is_retried() {
    let (_dir, store) = fresh();
    insert(&store, "a", &["true"]);
    let (go, hold) = hold_writer(&store);
    let starting = store.mark_starting("a", 1);
    // What SQLITE_FULL does to a transaction, after the change ran in it.
    let rollback = store.write(|c, path| c.execute_batch("ROLLBACK").map_err(sql(path)));
    go.send(()).unwrap();
    let _ = hold.wait();
    let _ = rollback.wait();
    held(starting.wait().unwrap()).wait().unwrap();
    let rec = store.get("a").unwrap().unwrap();
    assert_eq!((rec.state, rec.commit_pending), (JobState::Starting, false));
}

/// A real SQLITE_FULL: the database may not grow past the pages it has.
fn no_more_pages(store: &Store) {
    store
        .write(|c, path| {
            let pages: i64 = c
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .map_err(sql(path))?;
            c.pragma_update(None, "max_page_count", pages)
                .map_err(sql(path))
        })
        .wait()
        .unwrap();
}

#[test]
fn a_real_full_database_refuses_inserts_as_disk_full() {
    let (_dir, store) = fresh();
    no_more_pages(&store);
    let mut big = spec(&["cat"]);
    big.stdin = Some("x".repeat(256 * 1024));
    let refused = store.insert("big", &big).wait();
    assert!(
        matches!(&refused, Err(e @ JobStoreError::Full { .. }) if e.is_disk_full()),
        "{:?}",
        refused.err()
    );
    assert!(store.get("big").unwrap().is_none());
}

#[test]
fn the_writes_after_one_that_found_the_disk_full_fail_as_disk_full_too() {
    let (_dir, store) = fresh();
    no_more_pages(&store);
    let mut big = spec(&["cat"]);
    big.stdin = Some("x".repeat(256 * 1024));
    // One batch: the first insert fills the disk and SQLite rolls the transaction
    // back; the small one after it never ran, and must say why.
    let (go, holder) = hold_writer(&store);
    let first = store.insert("big", &big);
    let second = store.insert("small", &spec(&["true"]));
    go.send(()).unwrap();
    let _ = holder.wait();
    for (name, r) in [("first", first.wait()), ("second", second.wait())] {
        assert!(
            matches!(&r, Err(e) if e.is_disk_full()),
            "{name}: {:?}",
            r.err()
        );
    }
}

#[test]
fn a_store_dropped_with_held_changes_stops() {
    let (_dir, store) = fresh();
    insert(&store, "a", &["true"]);
    fill(&store, u32::MAX);
    let later = held(store.mark_starting("a", 1).wait().unwrap());
    drop(store);
    assert!(matches!(
        later.wait(),
        Err(JobStoreError::WriterGone { .. })
    ));
}

/// A database as schema 1 left it, holding the row `insert` writes.
fn schema_1_with(insert: &str, params: impl rusqlite::Params) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let c = Connection::open(&path).unwrap();
    c.execute_batch(MIGRATIONS[0]).unwrap();
    c.pragma_update(None, "user_version", 1).unwrap();
    c.execute(insert, params).unwrap();
    (dir, path)
}

#[test]
fn a_database_of_schema_1_is_migrated_and_read() {
    let (_dir, path) = schema_1_with(
        "INSERT INTO jobs (id, owner, spec, state, exit_code, created_ms) \
         VALUES ('old', '', ?1, 'succeeded', 0, 5)",
        params![spec(&["true"]).canonical()],
    );
    let store = Store::open(&path).unwrap();
    let rec = store.get("old").unwrap().unwrap();
    assert_eq!((rec.state, rec.exit_code), (JobState::Succeeded, Some(0)));
    assert_eq!(rec.output_truncated, None);
    drop(store);
    let c = Connection::open(&path).unwrap();
    let version: i64 = c
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version as usize, MIGRATIONS.len());
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    Store::open(&path).unwrap();
    let c = Connection::open(&path).unwrap();
    c.pragma_update(None, "user_version", 99).unwrap();
    drop(c);
    assert!(matches!(
        Store::open(&path),
        Err(JobStoreError::TooNew { found: 99, .. })
    ));
}

#[test]
fn records_from_before_produced_counts_keep_their_spooled_size() {
    // As the first schema left it: `*_bytes` were the bytes kept.
    let (_dir, path) = schema_1_with(
        "INSERT INTO jobs (id, owner, spec, state, created_ms, stdout_bytes, stderr_bytes) \
         VALUES ('old', 'o', '{}', 'succeeded', 0, 7, 3)",
        [],
    );
    let store = Store::open(&path).unwrap();
    assert_eq!(store.finished_totals().unwrap(), (1, 10));
    insert(&store, "new", &["true"]);
    succeed(
        &store,
        "new",
        Outcome {
            stdout_bytes: 5_000,
            spooled_bytes: 1_024,
            ..Outcome::default()
        },
    );
    assert_eq!(store.get("new").unwrap().unwrap().stdout_bytes, 5_000);
    assert_eq!(store.finished_totals().unwrap(), (2, 1_034));
    assert_eq!(
        store.finished_oldest_first(10).unwrap(),
        vec![("old".to_owned(), 10), ("new".to_owned(), 1_024)]
    );
}
