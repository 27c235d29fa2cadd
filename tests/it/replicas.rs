//! Hub replicas on one PostgreSQL: a real cluster started for each test ([`Postgres`]),
//! two `hub serve --store postgres://…` over TLS on loopback, and a real agent given
//! both URLs.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(30);
/// What the replica logs when its safety net, not a notification, brought a change.
const RELOADED: &str = "loading the fleet again from the hub database";

/// Two replicas started at once on an empty database.
struct Pair {
    _dir: tempfile::TempDir,
    a: Option<TestHub>,
    b: TestHub,
}

impl Pair {
    fn start(pg: &Postgres, db: &str) -> Pair {
        Self::start_with(pg, db, &[])
    }

    fn start_with(pg: &Postgres, db: &str, extra: &[&str]) -> Pair {
        let url = pg.create_db(db);
        let mut args = vec!["--store", &url];
        args.extend_from_slice(extra);
        let dir = tempdir();
        let (da, db_) = (dir.path().join("a"), dir.path().join("b"));
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| TestHub::start(&da, &args));
            let b = s.spawn(|| TestHub::start(&db_, &args));
            (a.join().expect("replica a"), b.join().expect("replica b"))
        });
        // One replica made the admin token; the operator copies it to the other.
        let token = [&a, &b]
            .iter()
            .map(|h| h.dir.join("admin.token"))
            .find(|p| p.exists())
            .expect("one replica wrote admin.token");
        for h in [&a, &b] {
            let to = h.dir.join("admin.token");
            if to != token {
                std::fs::copy(&token, &to).expect("copy the admin token");
            }
        }
        Pair {
            _dir: dir,
            a: Some(a),
            b,
        }
    }

    fn a(&self) -> &TestHub {
        self.a.as_ref().expect("replica a running")
    }
}

/// An agent enrolled as `a1` (through B), given A's URL first and B's second.
fn start_agent(host: &Host, pair: &Pair) -> (Guard, PathBuf) {
    let token = pair.b.enrol("a1");
    let mut cmd = host.agent_cmd(&[
        "--hub",
        &pair.a().url,
        "--hub",
        &pair.b.url,
        "--agent-id",
        "a1",
        "--token-file",
        &path_str(&token),
        "--ca-file",
        &path_str(&pair.a().ca()),
    ]);
    let log = host.path("agent.log");
    cmd.stderr(Stdio::from(std::fs::File::create(&log).expect("agent log")));
    (Guard::new(cmd.spawn().expect("spawn agent")), log)
}

fn hub_status(host: &Host) -> Value {
    host.status()["hub"].clone()
}

/// Waits until the agent applied `generation` or later, from `url`; the time it took.
fn wait_applied(host: &Host, generation: u64, url: &str, what: &str) -> Duration {
    let t = Instant::now();
    wait_for(LIMIT, what, || {
        let h = hub_status(host);
        (h["connected"] == true
            && h["url"] == url
            && h["generation"].as_u64().is_some_and(|g| g >= generation))
        .then_some(())
    });
    t.elapsed()
}

fn generation_of(v: &Value) -> u64 {
    v["generation"].as_u64().expect("generation")
}

#[test]
fn replicas_started_at_once_make_one_schema_and_share_the_ca_and_admin_token() {
    let Some(pg) = Postgres::start() else { return };
    let pair = Pair::start(&pg, "fresh");
    assert_eq!(
        pg.sql(
            "fresh",
            "SELECT count(*), max(version) FROM railgrid_migrations"
        ),
        "16|1001",
        "each migration once: the shared ones, then the replicas' own from 1001"
    );
    assert_eq!(
        pg.sql(
            "fresh",
            "SELECT count(*) FROM meta WHERE key = 'generation'"
        ),
        "1"
    );
    assert_eq!(
        read_lossy(&pair.a().ca()),
        read_lossy(&pair.b.ca()),
        "one CA for agents to pin"
    );
    assert!(read_lossy(&pair.a().ca()).contains("BEGIN CERTIFICATE"));
    // Either replica takes the admin token, and sees what the other did.
    pair.a().enrol("web-1");
    let listed = pair.b.admin_json(&["agent", "list"]);
    assert_eq!(listed[0]["id"], "web-1", "{listed}");
    // One replica applied the migrations; the other waited on the lock and found them.
    let applied = |h: &TestHub| h.log().matches("applied a hub schema migration").count();
    assert_eq!(applied(pair.a()) + applied(&pair.b), 16);
    // A replica restarted on the database applies nothing again.
    let b = pair.b;
    let dir = b.dir.clone();
    let before = applied(&b);
    b.stop();
    let b = TestHub::start(&dir, &["--store", &pg.url("fresh")]);
    assert_eq!(applied(&b), before);
    let shown = b.admin_json(&["agent", "show", "web-1"]);
    assert_eq!(shown["id"], "web-1");

    // The way back from a counter at its end, `hub store renumber`: refused while a
    // replica is connected, done in one transaction once none is.
    let renumber = || {
        railgrid()
            .args(["hub", "store", "renumber", "--store", &pg.url("fresh")])
            .output()
            .expect("renumber")
    };
    let out = renumber();
    exited_saying(&out, 2, "hubs are connected");
    b.stop();
    let mut pair_a = pair.a;
    pair_a.take().expect("replica a").stop();
    let out = renumber();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("and is 1"),
        "{out:?}"
    );
    assert_eq!(
        pg.sql("fresh", "SELECT value FROM meta WHERE key = 'generation'"),
        "1"
    );
    assert_eq!(
        pg.sql("fresh", "SELECT DISTINCT observed_generation FROM agents"),
        "9223372036854775807",
        "every agent is marked to take the hub's state"
    );
}

#[test]
fn a_change_through_one_replica_wakes_the_agent_held_by_the_other() {
    let Some(pg) = Postgres::start() else { return };
    let pair = Pair::start(&pg, "wake");
    let host = Host::new();
    let (_agent, log) = start_agent(&host, &pair);
    let first = generation_of(&pair.b.admin_json(&["desired", "show", "--agent", "a1"]));
    wait_applied(&host, first, &pair.a().url, "the agent reconciles with A");
    wait_for(LIMIT, "A holds the agent's poll", || {
        let v = pair.a().admin_json(&["agent", "show", "a1"]);
        (v["connected"] == true).then_some(())
    });

    // Through B: the poll held by A is answered by A's notification.
    let changed = pair
        .b
        .admin_json(&["desired", "set", "--agent", "a1", "--max-jobs", "3"]);
    let took = wait_applied(
        &host,
        generation_of(&changed),
        &pair.a().url,
        "the agent applies B's change through A",
    );
    eprintln!("a change through B reached the agent held by A in {took:?}");
    assert!(
        !pair.a().log().contains(RELOADED),
        "the notification brought the change, not the safety net:\n{}",
        pair.a().log()
    );
    assert_eq!(
        hub_status(&host)["url"],
        pair.a().url,
        "{}",
        read_lossy(&log)
    );

    // The fleet's scope too, from B.
    let fleet = pair
        .b
        .admin_json(&["desired", "set", "--fleet", "--max-jobs-per-owner", "2"]);
    wait_applied(
        &host,
        generation_of(&fleet),
        &pair.a().url,
        "the agent applies B's fleet change through A",
    );

    // A's notifications cut (its listening connection killed): it listens again, loads
    // everything, and a change made meanwhile still arrives.
    let killed = pg.sql(
        "wake",
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'",
    );
    assert_eq!(killed, "2", "both replicas listen");
    let later = pair
        .b
        .admin_json(&["desired", "set", "--agent", "a1", "--max-jobs", "4"]);
    wait_applied(
        &host,
        generation_of(&later),
        &pair.a().url,
        "a change made while A listened again",
    );
    wait_for_text(
        &pair.a().dir.with_extension("log"),
        "lost the hub database's notifications",
        LIMIT,
    );
}

#[test]
fn replicas_answer_an_agents_jobs_with_one_version_and_hold_what_it_took() {
    let Some(pg) = Postgres::start() else { return };
    let pair = Pair::start(&pg, "jobsv");
    let token = std::fs::read_to_string(pair.b.enrol("a2")).expect("token");
    let t = token.trim();
    let answer = |hub: &TestHub, body: &str, wait: u64| -> Value {
        let path = format!("/v1/agents/a2/reconcile?wait={wait}");
        let (code, out) = hub.curl("POST", &path, Some(t), Some(body));
        assert_eq!(code, 200, "{out}");
        serde_json::from_str(&out).expect("desired")
    };
    let first = answer(pair.a(), &report(0), 0);
    let g = generation_of(&first);
    let echo = |v: &Value| {
        let mut r: Value = serde_json::from_str(&report(g)).expect("report");
        r["jobs_version"] = v.clone();
        r.to_string()
    };
    pair.b
        .admin_ok(&["job", "submit", "--agent", "a2", "--id", "j1", "--", "true"]);
    // Behind: B answers at once, the job in it, and A (once it followed) names the same
    // list with the same version: an agent whose polls alternate between them (a load
    // balancer per request) is not answered at once for ever.
    let from_b = answer(&pair.b, &echo(&first["jobs_version"]), 30);
    assert_eq!(from_b["jobs"][0]["id"], "j1", "{from_b}");
    assert_eq!(generation_of(&from_b), g, "a job is no setting");
    let v = from_b["jobs_version"].clone();
    wait_for(LIMIT, "A answers with B's version", || {
        let d = answer(pair.a(), &echo(&first["jobs_version"]), 0);
        (d["jobs_version"] == v).then_some(())
    });
    // Taken: A holds it, and wakes for a job given through B.
    let woken = std::thread::scope(|s| {
        let poll = s.spawn(|| answer(pair.a(), &echo(&v), 30));
        wait_for(LIMIT, "A holds the poll that echoes B's version", || {
            let (_, body) = pair.a().curl("GET", "/v1/health", None, None);
            body.contains("\"polls_held\":1").then_some(())
        });
        pair.b
            .admin_ok(&["job", "submit", "--agent", "a2", "--id", "j2", "--", "true"]);
        poll.join().expect("poll")
    });
    let ids: Vec<&Value> = woken["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| &j["id"])
        .collect();
    assert!(ids.contains(&&Value::from("j2")), "{woken}");
    assert_ne!(woken["jobs_version"], v, "{woken}");
}

#[test]
fn an_agent_whose_replica_is_killed_fails_over_and_keeps_its_jobs_and_runner() {
    let Some(pg) = Postgres::start() else { return };
    let mut pair = Pair::start(&pg, "failover");
    let host = Host::new();
    let (_agent, log) = start_agent(&host, &pair);
    let first = generation_of(&pair.b.admin_json(&["desired", "show", "--agent", "a1"]));
    wait_applied(&host, first, &pair.a().url, "the agent reconciles with A");
    let runner = host.wait_runner("the runner", |_| true);

    // A job submitted through B runs through A, and its output reads back exactly.
    let submit = |hub: &TestHub, argv: &[&str]| {
        let mut args = vec!["job", "submit", "--agent", "a1", "--"];
        args.extend_from_slice(argv);
        hub.admin_ok(&args).trim().to_owned()
    };
    let before = submit(&pair.b, &["sh", "-c", "printf 'one\\ntwo\\n'"]);
    wait_for(LIMIT, "the job done", || {
        let v = pair.a().admin_json(&["job", "status", &before]);
        (v["done"] == true).then_some(())
    });
    assert_eq!(pair.b.admin_ok(&["job", "logs", &before]), "one\ntwo\n");

    // A secret set through B seals under B's key file, which A does not have yet: a job
    // naming it, which the agent gets through A, fails there saying where the key goes.
    // With the file copied, the next one gets the value (masked in its output), and the
    // value is at rest in neither replica's data dir nor in PostgreSQL's.
    let value = "replica-secret-4e7d1a90";
    let file = host.path("secret");
    std::fs::write(&file, value).expect("secret file");
    pair.b.admin_ok(&[
        "secret",
        "set",
        "SHARED_TOKEN",
        "--from-file",
        &path_str(&file),
    ]);
    let job = |id: &str| {
        pair.b.admin_ok(&[
            "job",
            "submit",
            "--agent",
            "a1",
            "--id",
            id,
            "--secret",
            "SHARED_TOKEN",
            "--",
            "sh",
            "-c",
            "echo \"$SHARED_TOKEN\"",
        ]);
        wait_for(LIMIT, "the job with a secret done", || {
            let v = pair.b.admin_json(&["job", "status", id]);
            (v["done"] == true).then_some(v)
        })
    };
    // (A may not know that B never sent it: the job goes without its value, which the
    // runner refuses, and A's log says why.)
    let v = job("keyless");
    assert_eq!(v["state"], "rejected", "{v}");
    assert_says(&v, "error", "came without its value");
    let a_log = pair.a().log();
    assert!(
        a_log.contains(&path_str(&pair.a().dir.join("secrets.key"))),
        "{a_log}"
    );
    std::fs::copy(
        pair.b.dir.join("secrets.key"),
        pair.a().dir.join("secrets.key"),
    )
    .expect("copy the key file");
    let v = job("keyed");
    assert_eq!(v["state"], "succeeded", "{v}");
    assert_eq!(
        pair.b.admin_ok(&["job", "logs", "keyed"]),
        "***SHARED_TOKEN***\n"
    );
    for dir in [pg.dir(), &pair.a().dir, &pair.b.dir] {
        let found = files_holding(dir, value.as_bytes());
        assert!(found.is_empty(), "the value at rest in {found:?}");
    }

    // A cancel through B of a job the agent runs through A.
    let long = submit(&pair.b, &["sleep", "60"]);
    wait_for(LIMIT, "the long job running", || {
        let v = pair.a().admin_json(&["job", "status", &long]);
        (v["state"] == "running").then_some(())
    });
    pair.b.admin_ok(&["job", "cancel", &long]);
    let cancelled = wait_for(LIMIT, "the cancel reaches the runner through A", || {
        let v = pair.a().admin_json(&["job", "status", &long]);
        (v["done"] == true).then_some(v)
    });
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");

    // kill -9 of A: the agent moves to B.
    let mut a = pair.a.take().expect("a");
    a.guard.signal(Signal::SIGKILL);
    a.guard.wait_output(LIMIT);
    let changed = pair
        .b
        .admin_json(&["desired", "set", "--agent", "a1", "--max-jobs", "5"]);
    let took = wait_applied(
        &host,
        generation_of(&changed),
        &pair.b.url,
        "the agent fails over to B",
    );
    eprintln!("failover to B and the change applied in {took:?}");
    assert!(
        read_lossy(&log).contains("trying the next hub replica"),
        "{}",
        read_lossy(&log)
    );
    assert_eq!(
        host.status()["runner"]["pid"].as_i64(),
        Some(i64::from(runner)),
        "the runner was never restarted"
    );
    // And jobs go on, through B alone.
    let after = submit(&pair.b, &["sh", "-c", "echo three; echo four >&2"]);
    wait_for(LIMIT, "the job through B done", || {
        let v = pair.b.admin_json(&["job", "status", &after]);
        (v["done"] == true).then_some(())
    });
    assert_eq!(pair.b.admin_ok(&["job", "logs", &after]), "three\n");
    assert_eq!(
        pair.b.admin_ok(&["job", "logs", &after, "--stderr"]),
        "four\n"
    );
}

#[test]
fn uploads_through_either_replica_keep_exact_offsets() {
    let Some(pg) = Postgres::start() else { return };
    let pair = Pair::start(&pg, "offsets");
    let token = std::fs::read_to_string(pair.a().enrol("a2")).expect("token");
    let token = token.trim();
    let job = pair
        .b
        .admin_ok(&[
            "job", "submit", "--agent", "a2", "--id", "j-off", "--", "true",
        ])
        .trim()
        .to_owned();
    assert_eq!(job, "j-off");
    // A knows of the job B took (its agent would poll A).
    wait_for(LIMIT, "A has the job", || {
        let (code, body) = pair.a().reconcile("a2", token, 0);
        (code == 200 && body.contains("j-off")).then_some(())
    });
    let put = |hub: &TestHub, offset: u64, data: &str| {
        hub.curl(
            "PUT",
            &format!("/v1/jobs/j-off/output/stdout?offset={offset}"),
            Some(token),
            Some(data),
        )
    };
    // An upload to A, then the agent "moves" and resumes (overlapping) at B, then a
    // late retry of the first reaches A.
    assert_eq!(put(pair.a(), 0, "abc"), (200, r#"{"length":3}"#.into()));
    assert_eq!(put(&pair.b, 2, "cdef"), (200, r#"{"length":6}"#.into()));
    assert_eq!(put(pair.a(), 0, "abc"), (200, r#"{"length":6}"#.into()));
    let (code, body) = put(&pair.b, 9, "x");
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("resume from 6"), "{body}");
    assert_eq!(pair.a().admin_ok(&["job", "logs", "j-off"]), "abcdef");
    assert_eq!(pair.b.admin_ok(&["job", "logs", "j-off"]), "abcdef");
    // Many at once, alternating replicas, each starting where the hub is: no byte
    // twice, none lost.
    let mut expected = String::from("abcdef");
    std::thread::scope(|s| {
        for i in 0..8 {
            let (hub, token) = (if i % 2 == 0 { pair.a() } else { &pair.b }, token);
            s.spawn(move || {
                hub.curl(
                    "PUT",
                    "/v1/jobs/j-off/output/stdout?offset=6",
                    Some(token),
                    Some("0123456789"),
                )
            });
        }
    });
    expected.push_str("0123456789");
    assert_eq!(pair.b.admin_ok(&["job", "logs", "j-off"]), expected);
}

#[test]
fn a_replica_reaches_its_database_over_verified_tls_only() {
    let Some((cert, key, ca)) = db_certificate() else {
        return;
    };
    let Some(pg) = Postgres::start_with(Some((&cert, &key))) else {
        return;
    };
    pg.sql("postgres", "CREATE DATABASE tls");
    let port = pg.tcp_port.expect("tcp");
    let dir = tempdir();
    let ca_file = dir.path().join("db-ca.pem");
    std::fs::write(&ca_file, &ca).expect("ca");
    let url = format!(
        "postgres://postgres@127.0.0.1:{port}/tls?sslmode=require&sslrootcert={}",
        path_str(&ca_file)
    );
    let hub = TestHub::start(&dir.path().join("hub"), &["--store", &url]);
    hub.enrol("over-tls");
    assert_eq!(
        pg.sql("tls", "SELECT id FROM agents"),
        "over-tls",
        "the replica's writes are in the database"
    );
    assert_eq!(
        pg.sql(
            "postgres",
            "SELECT bool_and(ssl) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE datname = 'tls'"
        ),
        "t",
        "every connection of the replica is TLS"
    );
    drop(hub);

    // A certificate from another CA is refused, and the message says where it failed
    // without the password.
    let other = dir.path().join("other-ca.pem");
    std::fs::write(&other, db_certificate().expect("another CA").2).expect("ca");
    let url = format!(
        "postgres://postgres:pw-not-shown@127.0.0.1:{port}/tls?sslmode=require&sslrootcert={}",
        path_str(&other)
    );
    let out = railgrid()
        .args(["hub", "serve", "--data-dir"])
        .arg(dir.path().join("refused"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--tls-self-signed",
            "--store",
            &url,
        ])
        .output()
        .expect("hub serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{port}/tls")),
        "{stderr}"
    );
    assert!(!stderr.contains("pw-not-shown"), "{stderr}");
}

/// A CA and a certificate from it for 127.0.0.1: (cert PEM, key PEM, CA PEM).
fn db_certificate() -> Option<(String, String, String)> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().ok()?;
    let mut p = CertificateParams::new(Vec::<String>::new()).ok()?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = p.self_signed(&ca_key).ok()?;
    let key = KeyPair::generate().ok()?;
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .ok()?
        .signed_by(&key, &ca, &ca_key)
        .ok()?;
    Some((cert.pem(), key.serialize_pem(), ca.pem()))
}

#[test]
fn replicas_without_their_database_refuse_agents_who_keep_their_runner_until_it_is_back() {
    let Some(pg) = Postgres::start() else { return };
    // Polls may be held for minutes: one held when the database goes must still be
    // answered at once.
    let pair = Pair::start_with(&pg, "outage", &["--max-wait", "300s"]);
    let host = Host::new();
    let (_agent, _log) = start_agent(&host, &pair);
    let first = generation_of(&pair.b.admin_json(&["desired", "show", "--agent", "a1"]));
    wait_applied(&host, first, &pair.a().url, "the agent reconciles with A");
    let runner = host.wait_runner("the runner", |_| true);
    let token = std::fs::read_to_string(pair.b.enrol("a2")).expect("token");
    let (code, body) = pair.a().reconcile("a2", token.trim(), 0);
    assert_eq!(code, 200, "{body}");
    let g = generation_of(&serde_json::from_str(&body).expect("desired"));

    let held = std::thread::scope(|s| {
        let poll = s.spawn(|| {
            // curl gives up after 60 s: far less than the 250 s this poll asks for.
            pair.a().curl(
                "POST",
                "/v1/agents/a2/reconcile?wait=250",
                Some(token.trim()),
                Some(&report(g)),
            )
        });
        wait_for(LIMIT, "A holds a2's poll", || {
            let (_, body) = pair.a().curl("GET", "/v1/health", None, None);
            body.contains("\"polls_held\":2").then_some(())
        });
        pg.stop();
        poll.join().expect("poll")
    });
    assert_eq!(held.0, 503, "a poll held when the database went: {held:?}");
    assert!(held.1.contains("lost its database"), "{held:?}");
    // Both replicas find their database gone and refuse, so that no agent is answered
    // from what may be stale; the agent keeps what it applied.
    wait_for(
        LIMIT,
        "the agent told the replicas lost their database",
        || {
            let h = hub_status(&host);
            says(&h, "last_error", "lost its database").then_some(())
        },
    );
    assert_eq!(
        host.status()["runner"]["pid"].as_i64(),
        Some(i64::from(runner)),
        "the runner is left alone"
    );

    pg.restart();
    let changed = wait_for(LIMIT, "B takes changes again", || {
        let out = pair.b.admin(&[
            "desired",
            "set",
            "--agent",
            "a1",
            "--max-jobs",
            "6",
            "--json",
        ]);
        out.status
            .success()
            .then(|| serde_json::from_slice::<Value>(&out.stdout).expect("json"))
    });
    wait_for(
        LIMIT,
        "the agent applies the change after the outage",
        || {
            let h = hub_status(&host);
            (h["connected"] == true
                && h["generation"]
                    .as_u64()
                    .is_some_and(|g| g >= generation_of(&changed)))
            .then_some(())
        },
    );
    assert_eq!(
        host.status()["runner"]["pid"].as_i64(),
        Some(i64::from(runner)),
        "the runner was never restarted"
    );
}

/// An agent labelled `queue=build`, enrolled as `id`, given `first`'s URL then `second`'s.
fn start_builder(host: &Host, id: &str, first: &TestHub, second: &TestHub) -> Guard {
    let token = first.enrol(id);
    let mut cmd = host.agent_cmd(&[
        "--hub",
        &first.url,
        "--hub",
        &second.url,
        "--agent-id",
        id,
        "--token-file",
        &path_str(&token),
        "--ca-file",
        &path_str(&first.ca()),
        "--label",
        "queue=build",
    ]);
    cmd.env("RAILGRID_RUNNER_SANDBOX_SHARED", first.marks())
        .stderr(Stdio::null());
    Guard::new(cmd.spawn().expect("spawn agent"))
}

#[test]
fn two_replicas_dispatch_one_queue_and_no_job_is_assigned_or_run_twice() {
    const JOBS: usize = 500;
    let Some(pg) = Postgres::start() else { return };
    let pair = Pair::start(&pg, "queue");
    pair.a()
        .admin_ok(&["desired", "set", "--fleet", "--max-jobs", "4"]);
    let (h1, h2) = (Host::new(), Host::new());
    let _q1 = start_builder(&h1, "q1", pair.a(), &pair.b);
    let _q2 = start_builder(&h2, "q2", &pair.b, pair.a());
    wait_for(LIMIT, "both agents serving four slots", || {
        let list = pair.a().admin_json(&["agent", "list"]);
        let ready = list.as_array()?.iter().filter(|a| {
            a["connected"] == true
                && a["report"]["runner"]["state"] == "running"
                && a["report"]["jobs_summary"]["max_jobs"] == 4
        });
        (ready.count() == 2).then_some(())
    });
    let marks = pair.a().marks();
    let ran = marks.join("ran");
    let script = format!("echo $0 >> {}", ran.display());
    // Submitted at once through both replicas, so that both dispatch from one queue.
    std::thread::scope(|s| {
        for t in 0..8 {
            let (pair, script) = (&pair, &script);
            s.spawn(move || {
                let hub = if t % 2 == 0 { pair.a() } else { &pair.b };
                for n in (t..JOBS).step_by(8) {
                    let id = format!("r{n}");
                    let out = hub.admin(&[
                        "job",
                        "submit",
                        "--id",
                        &id,
                        "--select",
                        "queue=build",
                        "--",
                        "sh",
                        "-c",
                        script,
                        &id,
                    ]);
                    assert!(
                        out.status.success(),
                        "{id}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            });
        }
    });
    let jobs = wait_for(Duration::from_secs(180), "every job done", || {
        let jobs = pair.b.admin_json(&["job", "list", "--limit", "1000"]);
        let all = jobs.as_array()?.clone();
        (all.len() == JOBS && all.iter().all(|j| j["done"] == true)).then_some(all)
    });
    let mut per_agent = std::collections::BTreeMap::new();
    for j in &jobs {
        assert_eq!(j["state"], "succeeded", "{j:#}");
        *per_agent
            .entry(j["agent"].as_str().expect("agent").to_owned())
            .or_insert(0) += 1;
    }
    assert_eq!(
        per_agent.keys().collect::<Vec<_>>(),
        ["q1", "q2"],
        "{per_agent:?}"
    );
    let mut lines: Vec<String> = read_lossy(&ran).lines().map(str::to_owned).collect();
    lines.sort();
    let runs = lines.len();
    lines.dedup();
    assert_eq!((runs, lines.len()), (JOBS, JOBS), "every job ran, once");
    // Both replicas handed jobs out.
    for hub in [pair.a(), &pair.b] {
        assert!(hub.log().contains("queued job assigned"), "{}", hub.log());
    }
}

/// A simulated agent's reconcile through `hub`, answered at once: its report says it runs
/// `version` and, when given, where an upgrade stands (state, target). The generation it
/// is answered, and whether that answer asks it for `wants`.
pub(super) fn sim_reconcile(
    hub: &TestHub,
    (id, token): (&str, &str),
    generation: u64,
    version: &str,
    upgrade: Option<(&str, &str)>,
    wants: &str,
) -> (u64, bool) {
    let report = serde_json::json!({
        "version": version,
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "hostname": id,
        "observed_generation": generation,
        "runner": {"state": "running"},
        "upgrade": upgrade.map(|(state, target)| serde_json::json!({"state": state, "target": target})),
    });
    let path = format!("/v1/agents/{id}/reconcile");
    let (code, body) = hub.curl("POST", &path, Some(token), Some(&report.to_string()));
    assert_eq!(code, 200, "{body}");
    let d: Value = serde_json::from_str(&body).expect("desired state");
    (
        d["generation"].as_u64().expect("generation"),
        d["agent"]["version"] == wants,
    )
}

/// Simulated agent `id` downloads `version`'s artifact as an agent does, with its token:
/// the evidence a rollout counts its commit on.
pub(super) fn sim_fetch(hub: &TestHub, (id, token): (&str, &str), version: &str) {
    let path = format!(
        "/v1/releases/{version}/{}-{}?agent={id}",
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    let (code, body) = hub.curl("GET", &path, Some(token), None);
    assert_eq!(code, 200, "{body}");
}

#[test]
fn one_replica_drives_a_rollout_and_another_takes_it_over_when_it_dies() {
    let Some(pg) = Postgres::start() else { return };
    let dir = tempdir();
    let key = keygen(dir.path(), "publisher");
    let public = path_str(&key.public);
    let pair = Pair::start_with(&pg, "rollouts", &["--release-key", &public]);
    let bin = dir.path().join("artifact");
    std::fs::write(&bin, b"not run: the agents here are simulated").expect("artifact");
    release(pair.a(), &key, dir.path(), "2.0.0", &bin);
    let tokens: Vec<(&str, String)> = ["s1", "s2"]
        .into_iter()
        .map(|id| (id, read_lossy(&pair.b.enrol(id)).trim().to_owned()))
        .collect();
    let sim = |i: usize| (tokens[i].0, tokens[i].1.as_str());
    let mut generations = [0u64; 2];
    for (i, g) in generations.iter_mut().enumerate() {
        *g = sim_reconcile(pair.a(), sim(i), 0, "1.0.0", None, "2.0.0").0;
    }
    pair.b.admin_ok(&["agent", "label", "s1", "rollout=canary"]);
    let said = pair.a().admin_ok(&[
        "rollout",
        "start",
        "--version",
        "2.0.0",
        "--waves",
        "1,100%",
    ]);
    assert!(said.starts_with("rollout r1 started"), "{said}");

    // The canary is given the version by whichever replica holds the lease; it commits.
    let (g, given) = wait_for(LIMIT, "the canary given 2.0.0", || {
        let (g, given) = sim_reconcile(pair.a(), sim(0), generations[0], "1.0.0", None, "2.0.0");
        given.then_some((g, given))
    });
    assert!(given);
    let drives = |h: &TestHub| h.log().contains("this hub drives the rollouts");
    let (holder, other) = wait_for(LIMIT, "the replica that drives", || {
        match (drives(pair.a()), drives(&pair.b)) {
            (true, false) => Some((pair.a(), &pair.b)),
            (false, true) => Some((&pair.b, pair.a())),
            (false, false) => None,
            (true, true) => panic!("both replicas drive the rollouts"),
        }
    });
    let committed = Some(("committed", "2.0.0"));
    sim_fetch(other, sim(0), "2.0.0");
    generations[0] = sim_reconcile(other, sim(0), g, "2.0.0", committed, "2.0.0").0;
    // The replica that drives dies; the other takes the lease over and goes on.
    holder.guard.signal(Signal::SIGKILL);
    let status = || other.admin_json(&["rollout", "status", "r1"]);
    wait_for(
        Duration::from_secs(60),
        "the second wave given by the other replica",
        || {
            let (g, given) = sim_reconcile(other, sim(1), generations[1], "1.0.0", None, "2.0.0");
            generations[1] = g;
            given.then_some(())
        },
    );
    assert!(drives(other), "{}", other.log());
    sim_fetch(other, sim(1), "2.0.0");
    sim_reconcile(other, sim(1), generations[1], "2.0.0", committed, "2.0.0");
    let v = wait_for(LIMIT, "the rollout done", || {
        let v = status();
        (v["state"] == "done").then_some(v)
    });
    assert_eq!(v["counts"]["committed"], 2, "{v:#}");
}
