//! One suite for every store: each case runs against SQLite and against a real
//! PostgreSQL (railgrid-testkit's, as the binary's integration tests start theirs), so that
//! the two backends cannot drift apart in what [`Store`] and [`JobStore`] promise.

use std::future::Future;

use railgrid_hub_store::postgres::{PgStore, MAINTENANCE_APPLICATION};
use railgrid_hub_store::sqlite::SqliteStore;
use railgrid_hub_store::*;
use railgrid_proto::desired::MAX_GENERATION;
use railgrid_proto::hub::DesiredSettings;
use railgrid_proto::job::Stream;
use railgrid_testkit::pg;

mod access;
mod fleet;
mod jobs;
mod secrets;
use self::access::*;
use self::fleet::*;
use self::jobs::*;
use self::secrets::*;

/// A database under test, empty at first.
trait Backend {
    type Store: Store;

    /// A handle to it; a second one sees what the first made durable.
    fn open(&self) -> impl Future<Output = Self::Store>;

    /// A handle as an offline command takes it (`hub store renumber`), with every other
    /// handle dropped.
    fn open_alone(&self) -> impl Future<Output = Self::Store> {
        self.open()
    }

    /// Runs one statement on the database behind the store's back: a long-lived hub's
    /// counters, or a row no hub would write.
    fn sql(&self, statement: &str);
}

struct Sqlite(tempfile::TempDir);

impl Sqlite {
    fn fresh() -> Self {
        Sqlite(tempfile::tempdir().expect("tempdir"))
    }
}

impl Backend for Sqlite {
    type Store = SqliteStore;

    async fn open(&self) -> SqliteStore {
        SqliteStore::open(&self.0.path().join("hub.db")).expect("open the SQLite store")
    }

    fn sql(&self, statement: &str) {
        let conn = rusqlite::Connection::open(self.0.path().join("hub.db")).expect("open");
        conn.execute(statement, [])
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
}

/// A database of its own on the one server every case of this process shares.
struct Postgres {
    pg: &'static pg::Postgres,
    db: String,
}

impl Postgres {
    fn fresh() -> Self {
        static CASES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let pg = pg::Postgres::shared();
        let db = format!(
            "case{}",
            CASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        pg.create_db(&db);
        Postgres { pg, db }
    }
}

impl Backend for Postgres {
    type Store = PgStore;

    async fn open(&self) -> PgStore {
        PgStore::connect(&self.pg.url(&self.db))
            .await
            .expect("connect to PostgreSQL")
    }

    async fn open_alone(&self) -> PgStore {
        let url = self.pg.url(&self.db);
        PgStore::connect_as(&url, MAINTENANCE_APPLICATION)
            .await
            .expect("connect to PostgreSQL")
    }

    fn sql(&self, statement: &str) {
        self.pg.sql(&self.db, statement);
    }
}

/// Each case is a test of its own on each backend, on a fresh database: one that fails
/// hides no other.
macro_rules! cases {
    ($($case:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(&super::Sqlite::fresh()).await;
                }
            )*
        }

        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&super::Postgres::fresh()).await;
                }
            )*
        }
    };
}

cases! {
    what_is_stored_is_loaded_again,
    no_generation_past_the_protocols_bound_is_handed_out,
    a_change_from_a_stale_copy_is_refused_with_the_stored_settings,
    output_is_taken_once_by_offset_capped_and_read_back_from_any_offset,
    jobs_are_listed_newest_first_and_only_done_ones_are_pruned,
    releases_halts_and_renumbering_move_the_fleets_generation,
    the_hubs_labels_merge_and_go_with_a_revoked_agent,
    a_queued_job_is_assigned_once_within_the_agents_room_and_groups_are_listed,
    a_write_from_an_older_copy_never_undoes_an_end,
    rollouts_hold_their_agents_and_move_only_from_the_state_read,
    the_latest_fetch_of_a_release_is_kept_per_agent,
    an_enrolment_token_enrols_as_many_hosts_as_it_may_and_never_takes_an_id,
    a_token_is_revoked_even_when_its_row_no_longer_reads,
    admin_tokens_audit_and_rotation_are_kept,
    secrets_are_set_by_version_under_one_key_and_resealed_at_once,
    reports_land_on_their_agents_in_batches_and_never_over_a_newer_one,
    retention_deletes_each_job_with_its_output_however_many_go,
}

fn settings(max_jobs: usize) -> DesiredSettings {
    DesiredSettings {
        max_jobs: Some(max_jobs),
        ..DesiredSettings::default()
    }
}

async fn what_is_stored_is_loaded_again(b: &impl Backend) {
    let store = b.open().await;
    let g1 = store.enrol("a", "hash-a", 100, false).await.expect("enrol");
    assert_eq!(g1, Enrol::Done(1));
    assert_eq!(
        store.enrol("a", "other", 101, true).await.expect("again"),
        Enrol::Exists
    );
    let g2 = store
        .set_scope("", &settings(4), None)
        .await
        .expect("fleet");
    assert_eq!(g2, Ok(2));
    let g3 = store
        .set_scope("a", &settings(1), None)
        .await
        .expect("agent");
    assert_eq!(g3, Ok(3));
    store
        .record_reports(vec![ReportRow {
            id: "a".into(),
            seen_at: 200,
            observed_generation: 3,
            report: "{}".into(),
        }])
        .await
        .expect("reports");
    assert_eq!(store.revoke("a", 300).await.expect("revoke"), Some(4));
    assert_eq!(store.revoke("nobody", 300).await.expect("revoke"), None);
    drop(store);

    let store = b.open().await;
    let snap = store.load().await.expect("load");
    assert_eq!(snap.generation, 4);
    assert_eq!(snap.agents.len(), 1);
    let a = &snap.agents[0];
    assert_eq!(
        (a.revoked_at, a.last_seen, a.observed_generation),
        (Some(300), Some(200), 3)
    );
    assert_eq!(a.token_sha256, "hash-a");
    assert_eq!(snap.scopes.len(), 2);
    assert_eq!(snap.scopes[0].scope, "");
    assert_eq!(snap.scopes[0].settings, settings(4));
    assert_eq!(snap.scopes[1].generation, 4);
    // A revoked id is given again only when asked, to a new agent: a new token, a new
    // generation, none of the old one's own settings.
    let refused = store
        .enrol("a", "hash-b", 400, false)
        .await
        .expect("refused");
    assert_eq!(refused, Enrol::Revoked);
    let g = store
        .enrol("a", "hash-b", 400, true)
        .await
        .expect("re-enrol");
    assert_eq!(g, Enrol::Done(5));
    let snap = store.load().await.expect("load");
    let own = snap
        .scopes
        .iter()
        .find(|s| s.scope == "a")
        .expect("a's scope");
    assert_eq!(
        (own.generation, &own.settings),
        (5, &DesiredSettings::default())
    );
}

async fn no_generation_past_the_protocols_bound_is_handed_out(b: &impl Backend) {
    let store = b.open().await;
    b.sql(&format!(
        "UPDATE meta SET value = {} WHERE key = 'generation'",
        MAX_GENERATION - 1
    ));
    let last = store.set_scope("", &settings(1), None).await.expect("last");
    assert_eq!(last, Ok(MAX_GENERATION));
    let e = store
        .set_scope("", &settings(2), None)
        .await
        .expect_err("exhausted");
    assert!(matches!(e, StoreError::GenerationsExhausted(_)), "{e}");
    assert!(e.to_string().contains("hub store renumber"), "{e}");
    let snap = store.load().await.expect("load");
    assert_eq!(snap.generation, MAX_GENERATION, "nothing moved");
    assert_eq!(snap.scopes[0].settings, settings(1), "nothing changed");
}

async fn a_change_from_a_stale_copy_is_refused_with_the_stored_settings(b: &impl Backend) {
    let store = b.open().await;
    // A scope never set counts as the default.
    let unset = DesiredSettings::default();
    let g = store.set_scope("", &settings(2), Some(&unset)).await;
    assert_eq!(g.expect("set"), Ok(1));
    let stale = store.set_scope("", &settings(3), Some(&unset)).await;
    assert_eq!(
        stale.expect("compare"),
        Err(settings(2)),
        "the stored settings come back"
    );
    let snap = store.load().await.expect("load");
    assert_eq!(snap.generation, 1, "a refused change takes no generation");
    assert_eq!(snap.scopes[0].settings, settings(2));
}

/// One assignment, alone in its batch.
async fn assign(store: &impl JobStore, job: &str, agent: &str, max_open: usize) -> Assigned {
    let batch = [Assignment {
        job: job.into(),
        agent: agent.into(),
        max_open,
    }];
    store.assign_jobs(&batch).await.expect("assign")[0]
}

fn job(id: &str) -> JobRow {
    JobRow {
        agent: "a".into(),
        created_ms: 1,
        progress: JobProgress {
            state: "pending".into(),
            ..JobProgress::default()
        },
        ..JobRow::queued(id)
    }
}

async fn output_is_taken_once_by_offset_capped_and_read_back_from_any_offset(b: &impl Backend) {
    let store = b.open().await;
    store.enrol("a", "h", 1, false).await.expect("enrol");
    let (seq, _) = store
        .insert_job(&job("j"))
        .await
        .expect("insert")
        .expect("new");
    assert_eq!(seq, 1);
    assert_eq!(store.insert_job(&job("j")).await.expect("again"), None);
    let put = |offset: u64, data: &'static [u8]| {
        store.append_output(
            "j",
            Stream::Stdout,
            offset,
            bytes::Bytes::from_static(data),
            8,
        )
    };
    assert_eq!(put(0, b"abc").await.expect("put"), Appended::Length(3));
    assert_eq!(put(0, b"abc").await.expect("again"), Appended::Length(3));
    assert_eq!(put(2, b"cdef").await.expect("overlap"), Appended::Length(6));
    assert_eq!(put(9, b"x").await.expect("gap"), Appended::Gap(6));
    // Past the cap (8): counted, not kept.
    assert_eq!(put(6, b"ghijk").await.expect("cap"), Appended::Length(11));
    let row = store.get_job("j").await.expect("get").expect("row");
    assert_eq!((row.stdout_length, row.stdout_stored), (11, 8));
    for (offset, limit, want) in [
        (0, 100, &b"abcdefgh"[..]),
        (4, 100, b"efgh"),
        (3, 2, b"de"),
        (8, 100, b""),
        (u64::MAX, 100, b""),
    ] {
        let got = store
            .read_output("j", Stream::Stdout, offset, limit)
            .await
            .expect("read");
        assert_eq!(got, want, "from {offset}, {limit}");
    }
    let nothing = bytes::Bytes::new();
    let no_job = store.append_output("nope", Stream::Stdout, 0, nothing, 8);
    assert_eq!(no_job.await.expect("no job"), Appended::NoJob);
    assert_eq!(store.job_agent("j").await.expect("agent"), Some("a".into()));
}

async fn jobs_are_listed_newest_first_and_only_done_ones_are_pruned(b: &impl Backend) {
    let store = b.open().await;
    store.enrol("a", "h", 1, false).await.expect("enrol");
    for id in ["j1", "j2", "j3"] {
        store.insert_job(&job(id)).await.expect("insert");
    }
    let other = JobRow {
        agent: "b".into(),
        ..job("k")
    };
    store.insert_job(&other).await.expect("insert");
    let ids = |rows: Vec<JobRow>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let all = store.list_jobs(JobFilter::default(), None, 10).await;
    assert_eq!(ids(all.expect("list")), ["k", "j3", "j2", "j1"]);
    let of_a = JobFilter {
        agent: Some("a"),
        ..JobFilter::default()
    };
    let a = store.list_jobs(of_a, Some(3), 1).await.expect("page");
    assert_eq!(ids(a), ["j2"], "below seq 3, one");

    let done = JobProgress {
        state: "succeeded".into(),
        exit_code: Some(0),
        finished_ms: Some(5),
        stdout_bytes: 2,
        done: true,
        ..JobProgress::default()
    };
    let put = |offset: u64, data: &'static str| {
        store.append_output("j1", Stream::Stdout, offset, data.into(), 8)
    };
    assert_eq!(put(0, "ok").await.expect("put"), Appended::Length(2));
    let g = store
        .update_jobs("a", vec![("j1".into(), done.clone())], true)
        .await
        .expect("update");
    assert_eq!(g, Some(6), "enrol, four jobs, this change");
    assert_eq!(put(2, "late").await.expect("put"), Appended::Length(2));
    let quiet = store.update_jobs("a", vec![("j2".into(), done.clone())], false);
    assert_eq!(quiet.await.expect("update"), None, "no generation taken");
    let j1 = store.get_job("j1").await.expect("get").expect("row");
    assert_eq!(j1.progress, done, "the progress is stored as given");

    let open = store.load().await.expect("load").open_jobs;
    assert_eq!(ids(open), ["j3", "k"], "done jobs are not loaded as open");
    assert_eq!(store.retain_jobs(1).await.expect("retain"), 1, "j1 goes");
    assert_eq!(store.get_job("j1").await.expect("get"), None);
    let output = store.read_output("j1", Stream::Stdout, 0, 10).await;
    assert!(output.expect("read").is_empty(), "its output went with it");
    assert!(store.get_job("j2").await.expect("get").is_some(), "kept");
    assert_eq!(store.retain_jobs(0).await.expect("retain"), 1, "j2 goes");
    let all = store.list_jobs(JobFilter::default(), None, 10).await;
    assert_eq!(ids(all.expect("list")), ["k", "j3"]);
}

async fn a_queued_job_is_assigned_once_within_the_agents_room_and_groups_are_listed(
    b: &impl Backend,
) {
    let store = b.open().await;
    store.enrol("a", "h", 1, false).await.expect("enrol");
    store.enrol("b", "h", 1, false).await.expect("enrol");
    let queued = |id: &str| JobRow {
        agent: String::new(),
        progress: JobProgress {
            state: "queued".into(),
            ..JobProgress::default()
        },
        selector: Some("queue=build".into()),
        priority: 90,
        queue_deadline_ms: Some(99),
        attempt: 2,
        retries: 3,
        avoid: Some("b".into()),
        ..job(id)
    };
    let (_, generation) = store
        .insert_job(&queued("q1"))
        .await
        .expect("insert")
        .expect("new");
    assert_eq!(generation, None, "a queued job moves no agent's scope");
    store.insert_job(&queued("q2")).await.expect("insert");
    store.insert_job(&queued("q3")).await.expect("insert");
    let q1 = store.get_job("q1").await.expect("get").expect("row");
    assert_eq!(
        (
            q1.agent.as_str(),
            q1.selector.as_deref(),
            q1.priority,
            q1.queue_deadline_ms
        ),
        ("", Some("queue=build"), 90, Some(99))
    );
    assert_eq!(
        (q1.attempt, q1.retries, q1.avoid.as_deref()),
        (2, 3, Some("b"))
    );
    assert_eq!(assign(&store, "q1", "a", 1).await, Assigned::To(3));
    let snap = store.load().await.expect("load");
    let a = snap.scopes.iter().find(|s| s.scope == "a");
    assert_eq!(
        a.map(|s| s.generation),
        Some(1),
        "a job takes a number of the counter but leaves its agent's generation (its enrolment's)"
    );
    let versions: Vec<(&str, u64)> = snap
        .agents
        .iter()
        .map(|a| (a.id.as_str(), a.jobs_version))
        .collect();
    assert_eq!(
        versions,
        [("a", 3), ("b", 0)],
        "the number is a's jobs' version"
    );
    assert_eq!(
        assign(&store, "q1", "b", 1).await,
        Assigned::Gone,
        "assigned once"
    );
    assert_eq!(
        assign(&store, "q2", "a", 1).await,
        Assigned::Full,
        "a holds its one job"
    );
    let q1 = store.get_job("q1").await.expect("get").expect("row");
    assert_eq!(
        (q1.agent.as_str(), q1.progress.state.as_str()),
        ("a", "pending")
    );
    let expired = JobProgress {
        state: "expired".into(),
        error: Some("no agent took it".into()),
        finished_ms: Some(100),
        done: true,
        ..JobProgress::default()
    };
    assert!(store.end_queued("q2", &expired).await.expect("expire"));
    assert!(
        !store.end_queued("q2", &expired).await.expect("again"),
        "once"
    );
    assert!(
        !store.end_queued("q1", &expired).await.expect("assigned"),
        "q1 has an agent"
    );
    assert_eq!(assign(&store, "q2", "b", 1).await, Assigned::Gone);
    // One batch counts its own: b takes one of two, and a third job is not there.
    store.insert_job(&queued("q4")).await.expect("insert");
    store.insert_job(&queued("q5")).await.expect("insert");
    let to_b = |job: &str| Assignment {
        job: job.into(),
        agent: "b".into(),
        max_open: 1,
    };
    let batch = [to_b("q4"), to_b("q5"), to_b("nope")];
    let got = store.assign_jobs(&batch).await.expect("batch");
    assert!(
        matches!(got[..], [Assigned::To(_), Assigned::Full, Assigned::Full]),
        "{got:?}"
    );
    let of = |selector| JobFilter {
        selector: Some(selector),
        ..JobFilter::default()
    };
    let routed = store.list_jobs(of("queue=build"), None, 10).await;
    let routed: Vec<_> = routed.expect("list").into_iter().map(|r| r.id).collect();
    assert_eq!(routed, ["q5", "q4", "q3", "q2", "q1"]);
    let member = JobRow {
        group: Some("g".into()),
        ..job("g.a")
    };
    store.insert_job(&member).await.expect("insert");
    let of_group = JobFilter {
        group: Some("g"),
        ..JobFilter::default()
    };
    let members = store.list_jobs(of_group, None, 10).await.expect("list");
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].group.as_deref(), Some("g"));
    store
        .update_jobs("a", vec![("g.a".into(), expired.clone())], false)
        .await
        .expect("end");
    let open = store.load().await.expect("load").open_jobs;
    let open: Vec<_> = open
        .iter()
        .map(|r| (r.id.as_str(), r.agent.as_str()))
        .collect();
    assert_eq!(
        open,
        [("q1", "a"), ("q3", ""), ("q4", "b"), ("q5", "")],
        "the queue survives a restart"
    );
}

async fn releases_halts_and_renumbering_move_the_fleets_generation(b: &impl Backend) {
    let store = b.open().await;
    store.enrol("a", "h", 1, false).await.expect("enrol");
    let release = ReleaseRow {
        version: "1.2.3".into(),
        os: "linux".into(),
        arch: "x86_64".into(),
        size: 10,
        sha256: "ab".repeat(32),
        signature: "sig".into(),
        key_id: "k1".into(),
        published_at: 7,
    };
    assert_eq!(store.put_release(&release).await.expect("release"), 2);
    let again = ReleaseRow {
        signature: "sig2".into(),
        ..release.clone()
    };
    assert_eq!(store.put_release(&again).await.expect("re-publish"), 3);
    let halt = HaltRow {
        version: "1.2.3".into(),
        agent: "a".into(),
        reason: "crashed".into(),
        halted_at: 9,
    };
    assert_eq!(store.set_halt("1.2.3", Some(&halt)).await.expect("halt"), 4);
    let snap = store.load().await.expect("load");
    assert_eq!(
        snap.releases,
        [again],
        "one artifact per version and platform"
    );
    assert_eq!(snap.halts, [halt]);
    assert_eq!(store.set_halt("1.2.3", None).await.expect("lift"), 5);
    assert!(store.load().await.expect("load").halts.is_empty());
    let (_, version) = store
        .insert_job(&job("j"))
        .await
        .expect("job")
        .expect("new");
    assert_eq!(version, Some(6));
    assert_eq!(store.load().await.expect("load").agents[0].jobs_version, 6);

    drop(store);
    let store = b.open_alone().await;
    assert_eq!(store.renumber().await.expect("renumber"), 6, "as it was");
    let snap = store.load().await.expect("load");
    assert_eq!(snap.generation, 1);
    assert!(snap.scopes.iter().all(|s| s.generation == 1));
    assert_eq!(snap.agents[0].observed_generation, MUST_RESET);
    assert_eq!(
        snap.agents[0].jobs_version, 0,
        "a jobs' version is a number of the same counter, started over with it"
    );
}

async fn the_hubs_labels_merge_and_go_with_a_revoked_agent(b: &impl Backend) {
    let store = b.open().await;
    let labels = |text: &str| railgrid_proto::labels::parse_list(text).expect("labels");
    store.enrol("a", "h", 1, false).await.expect("enrol");
    let none = store.change_labels("nobody", &labels("x=1"), &[]).await;
    assert_eq!(none.expect("unknown"), None);
    let set = store
        .change_labels("a", &labels("tier=prod,zone=a"), &[])
        .await;
    assert_eq!(set.expect("set"), Some((2, labels("tier=prod,zone=a"))));
    let remove = ["zone".to_owned(), "never-set".to_owned()];
    let merged = store.change_labels("a", &labels("gpu=a100"), &remove).await;
    assert_eq!(
        merged.expect("merge"),
        Some((3, labels("gpu=a100,tier=prod")))
    );
    drop(store);
    let store = b.open().await;
    let agents = store.load().await.expect("load").agents;
    assert_eq!(agents[0].labels, r#"{"gpu":"a100","tier":"prod"}"#);
    store.revoke("a", 5).await.expect("revoke");
    let revoked = store.change_labels("a", &labels("x=1"), &[]).await;
    assert_eq!(
        revoked.expect("revoked"),
        None,
        "a revoked agent takes no labels"
    );
    store.enrol("a", "h2", 6, true).await.expect("re-enrol");
    let agents = store.load().await.expect("load").agents;
    assert_eq!(
        agents[0].labels, "{}",
        "a new agent under the id starts without"
    );
}

fn progress(state: &str, done: bool) -> JobProgress {
    JobProgress {
        state: state.into(),
        exit_code: done.then_some(7),
        stdout_bytes: if done { 10 } else { 4 },
        done,
        ..JobProgress::default()
    }
}

/// Two reconciles' writes landing out of order (the first one's client went away while
/// it waited for the database): the newer, a job done, stands.
async fn a_write_from_an_older_copy_never_undoes_an_end(b: &impl Backend) {
    let store = b.open().await;
    store.enrol("a", "h", 1, false).await.expect("enrol");
    store.insert_job(&job("j")).await.expect("insert");
    let done = vec![("j".to_owned(), progress("failed", true))];
    store.update_jobs("a", done, true).await.expect("done");
    let stale = vec![("j".to_owned(), progress("running", false))];
    store.update_jobs("a", stale, false).await.expect("stale");
    let row = store.get_job("j").await.expect("get").expect("row");
    assert_eq!(
        (
            row.progress.state.as_str(),
            row.progress.done,
            row.progress.exit_code
        ),
        ("failed", true, Some(7))
    );
    assert_eq!(row.progress.stdout_bytes, 10);

    // An end written from an older copy keeps the end first recorded.
    store.insert_job(&job("k")).await.expect("insert");
    let ended = vec![("k".to_owned(), progress("cancelled", false))];
    store.update_jobs("a", ended, false).await.expect("ended");
    let other = vec![("k".to_owned(), progress("succeeded", false))];
    store.update_jobs("a", other, false).await.expect("other");
    let row = store.get_job("k").await.expect("get").expect("row");
    assert_eq!(row.progress.state, "cancelled");
}

async fn rollouts_hold_their_agents_and_move_only_from_the_state_read(b: &impl Backend) {
    use railgrid_hub_store::rollouts::{
        MemberRow, Progress, Recorded, RolloutRow, StateMove, ROLLOUT_LEASE,
    };
    use railgrid_proto::rollout::{ABORTED, GIVEN, PAUSED, PENDING, RUNNING, SKIPPED};
    let store = b.open().await;
    let member = |agent: &str, wave: usize| MemberRow {
        agent: agent.into(),
        wave,
        position: wave,
        state: PENDING.into(),
        from_version: Some("1.0.0".into()),
        ..MemberRow::default()
    };
    let row = RolloutRow {
        version: "2.0.0".into(),
        waves: "1,100%".into(),
        max_parallel: 1,
        state: RUNNING.into(),
        created_ms: 5,
        ..RolloutRow::default()
    };
    let r1 = store
        .insert_rollout(&row, &[member("a", 0), member("b", 1)])
        .await
        .expect("insert")
        .expect("no clash");
    assert_eq!((r1.id.as_str(), r1.seq), ("r1", 1));
    let clash = store
        .insert_rollout(&row, &[member("b", 0), member("c", 1)])
        .await
        .expect("insert");
    assert_eq!(clash, Err(vec![("b".into(), "r1".into())]));

    // The driver's step is written under the lease, from the state it read.
    let moving = |to: &str| StateMove {
        to: to.into(),
        reason: Some("why".into()),
        now_ms: 9,
        failures_accepted: None,
    };
    assert!(store
        .take_lease(ROLLOUT_LEASE, "h1", 100, 200)
        .await
        .expect("lease"));
    assert!(!store
        .take_lease(ROLLOUT_LEASE, "h2", 150, 250)
        .await
        .expect("held"));
    let step = Progress {
        id: "r1".into(),
        state: RUNNING.into(),
        wave: 0,
        last_commit_ms: None,
        members: vec![MemberRow {
            state: GIVEN.into(),
            given_ms: Some(7),
            ..member("a", 0)
        }],
        moved: None,
    };
    assert_eq!(
        store.record_rollout("h1", 300, &step).await.expect("step"),
        Recorded::Written
    );
    assert_eq!(
        store
            .record_rollout("h2", 300, &step)
            .await
            .expect("not h2's"),
        Recorded::LeaseLost
    );
    // An operator pauses it meanwhile: a step read while running writes nothing.
    let paused = store
        .move_rollout("r1", &[RUNNING], &moving(PAUSED))
        .await
        .expect("pause")
        .expect("was running");
    assert_eq!(paused.state, PAUSED);
    assert_eq!(
        store
            .move_rollout("r1", &[RUNNING], &moving(PAUSED))
            .await
            .expect("again"),
        None
    );
    let stale = Progress {
        wave: 1,
        ..step.clone()
    };
    assert_eq!(
        store
            .record_rollout("h1", 300, &stale)
            .await
            .expect("stale"),
        Recorded::Moved
    );
    // Past its expiry another hub takes the lease, and the first writes no more.
    assert!(store
        .take_lease(ROLLOUT_LEASE, "h2", 301, 400)
        .await
        .expect("taken"));
    let resumed = Progress {
        state: PAUSED.into(),
        ..step
    };
    assert_eq!(
        store
            .record_rollout("h1", 500, &resumed)
            .await
            .expect("lost"),
        Recorded::LeaseLost
    );
    // A final state ends the members never given it, and frees the agents.
    store
        .move_rollout("r1", &[PAUSED], &moving(ABORTED))
        .await
        .expect("abort")
        .expect("was paused");
    let (r, members) = store.get_rollout("r1").await.expect("get").expect("r1");
    assert_eq!((r.state.as_str(), r.finished_ms), (ABORTED, Some(9)));
    let states: Vec<&str> = members.iter().map(|m| m.state.as_str()).collect();
    assert_eq!(states, [GIVEN, SKIPPED]);
    assert_eq!(members[0].given_ms, Some(7));
    let r2 = store
        .insert_rollout(&row, &[member("b", 0)])
        .await
        .expect("insert")
        .expect("b is free");
    assert_eq!(r2.id, "r2");
    let active: Vec<String> = store
        .list_rollouts(true)
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(active, ["r2"]);
    assert_eq!(store.list_rollouts(false).await.expect("all").len(), 2);
    assert_eq!(store.get_rollout("r9").await.expect("get"), None);
}

async fn the_latest_fetch_of_a_release_is_kept_per_agent(b: &impl Backend) {
    use railgrid_hub_store::rollouts::Fetch;
    let store = b.open().await;
    for (agent, version, now_ms) in [
        ("a", "2.0.0", 5),
        ("b", "2.0.0", 6),
        ("a", "2.0.0", 9),
        ("a", "3.0.0", 7),
    ] {
        let f = Fetch {
            agent: agent.into(),
            version: version.into(),
            now_ms,
        };
        store.record_fetch(&f).await.expect("record");
    }
    let mut got = store.fetches("2.0.0").await.expect("fetches");
    got.sort();
    assert_eq!(got, [("a".to_owned(), 9), ("b".to_owned(), 6)]);
    assert!(store.fetches("9.9.9").await.expect("none").is_empty());
}
