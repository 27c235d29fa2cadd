//! The runner's API: its token, its connection bounds, and the JSON error of every bad request.

use super::*;

#[cfg(target_os = "linux")]
#[test]
fn the_runner_cannot_be_inspected_by_its_own_account() {
    if !requires_root("needs root, to run the runner as another account") {
        return;
    }
    let r = Runner::started(&[]);
    let pid = get_json(&r.socket(), "/v1/health").expect("health")["pid"].clone();
    // The kernel gives /proc/<pid> of a non-dumpable process to root: the runner's own
    // account (and so every job) can no longer read its environ, memory or descriptors.
    let environ = fs::metadata(format!("/proc/{pid}/environ")).expect("environ");
    assert_eq!(
        environ.uid(),
        0,
        "/proc/{pid}/environ belongs to the runner's account"
    );
}

#[test]
fn the_job_api_answers_only_clients_with_the_token() {
    let r = Runner::started(&[]);
    let sock = r.socket();
    // Health stays open: the agent and operators probe it with plain curl.
    let (status, _) = http_with(&sock, "GET", "/v1/health", None, None).expect("health");
    assert_eq!(status, 200);
    for (method, path) in [
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs/x"),
    ] {
        for token in [None, Some("0".repeat(64))] {
            let (status, body) =
                http_with(&sock, method, path, Some("{}"), token.as_deref()).expect("request");
            assert_eq!(status, 401, "{method} {path}: {body}");
            assert!(body.contains("\"unauthorized\""), "{body}");
        }
    }
    let token = fs::read_to_string(r.runner_dir().join("api.token")).expect("token");
    let mode = fs::metadata(r.runner_dir().join("api.token"))
        .expect("token")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let (status, body) = http_with(&sock, "GET", "/v1/jobs", None, Some(&token)).expect("list");
    assert_eq!(status, 200, "{body}");
    // A client that cannot read the token says which file it needed.
    let token_path = r.runner_dir().join("api.token");
    let aside = r.runner_dir().join("api.token.aside");
    fs::rename(&token_path, &aside).expect("move the token aside");
    let out = r.cli().arg("list").output().expect("job list");
    fs::rename(&aside, &token_path).expect("put the token back");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("could not read the runner's API token"),
        "{err}"
    );
    assert!(r.cli().arg("list").status().expect("job list").success());
}

#[test]
fn silent_and_unauthorized_connections_cannot_exhaust_the_runner() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let r = Runner::started(&[]);
    let sock = r.socket();
    // Without the token even health is answered on a connection that is then closed.
    let mut s = UnixStream::connect(&sock).expect("connect");
    s.set_read_timeout(Some(LIMIT)).expect("timeout");
    write!(s, "GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("write");
    let mut resp = String::new();
    s.read_to_string(&mut resp)
        .expect("the runner closes the connection");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(
        resp.to_ascii_lowercase().contains("connection: close"),
        "{resp}"
    );

    // A silent connection is closed by the runner after a few seconds (5; hyper's own
    // default would be 30).
    let mut silent = UnixStream::connect(&sock).expect("connect");
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut buf = [0u8; 1];
    assert_eq!(silent.read(&mut buf).expect("closed, not timed out"), 0);

    if !is_root() || !cfg!(target_os = "linux") {
        eprintln!(
            "skipped the connection cap: needs root (whose clients the cap spares) and /proc"
        );
        return;
    }
    let pid = get_json(&sock, "/v1/health").expect("health")["pid"].clone();
    let fds = || fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let before = fds();
    // A job (never root) opens more connections than the runner serves at once (256) and
    // holds them. perl is part of every Debian system (perl-base is Essential).
    let flood = "use IO::Socket::UNIX; my @s; \
        for (1..300) { my $c = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => $ARGV[0]) or last; push @s, $c } \
        print 'opened ', scalar(@s), \"\\n\"; STDOUT->flush; sleep 120;";
    let id = submit_ok(&r, json!({"argv": ["perl", "-e", flood, path_str(&sock)]}));
    let opened = wait_for(LIMIT, "the flood to connect", || {
        let out = r.output(&id, "stdout");
        out.contains('\n').then_some(out)
    });
    let cancel = || http(&sock, "POST", &format!("/v1/jobs/{id}/cancel"), None);
    if opened.trim() != "opened 300" {
        eprintln!("skipped the connection cap: the job could not connect ({opened})");
        let _ = cancel();
        return;
    }
    let most = (0..200).map(|_| fds()).max().unwrap_or(0);
    assert!(
        most < before + 256 + 16 + 16, // served, refusals being answered, slack
        "{most} descriptors, {before} before 300 connections"
    );
    // Root's clients are not crowded out: the listing answers while the flood holds on.
    let out = r.cli().arg("list").output().expect("job list");
    succeeded(&out);
    assert_eq!(cancel().expect("cancel").0, 200);
    assert_eq!(r.wait(&id)["state"], "cancelled");
}

#[test]
fn a_client_follows_the_token_of_a_restarted_runner() {
    let mut r = Runner::started(&[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = railgrid::runner::client::Client::new(&r.socket());
    rt.block_on(client.list("")).expect("list");
    let first = fs::read_to_string(r.runner_dir().join("api.token")).expect("token");
    let mut old = r.guard.take().expect("runner");
    old.signal(Signal::SIGTERM);
    let _ = old.wait_output(LIMIT);
    r.start(&[]);
    let second = fs::read_to_string(r.runner_dir().join("api.token")).expect("token");
    assert_ne!(first, second, "a restarted runner has a new token");
    rt.block_on(client.list(""))
        .expect("list after the restart");
}

#[test]
fn a_client_over_the_connection_limit_is_told_why_and_root_still_gets_in() {
    if !requires_root("needs root, to run clients as the runner's account and as root") {
        return;
    }
    let r = Runner::started(&["--max-api-connections", "1"]);
    let nobody = uzers::get_user_by_name("nobody").expect("nobody");
    let as_runner = |cmd: &mut Command| {
        cmd.uid(nobody.uid()).gid(nobody.primary_group_id());
    };
    let id = submit_ok(&r, json!({"argv": ["sleep", "1000"]}));
    // The runner's account holds the one connection with a long poll.
    let mut waiter = r.cli();
    waiter
        .args(["wait", &id])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    as_runner(&mut waiter);
    let _waiter = Guard::new(waiter.spawn().expect("job wait"));
    // Another client of that account is refused, and told why.
    let refused = wait_for(LIMIT, "a client to be refused", || {
        let mut list = r.cli();
        list.arg("list");
        as_runner(&mut list);
        let out = list.output().expect("job list");
        (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned())
    });
    assert!(refused.contains("limit of 1 API connections"), "{refused}");
    // Root's clients are not counted.
    let out = r.cli().arg("list").output().expect("job list");
    succeeded(&out);
    let (status, _) =
        http(&r.socket(), "POST", &format!("/v1/jobs/{id}/cancel"), None).expect("cancel");
    assert_eq!(status, 200);
}

#[test]
fn bad_query_values_get_the_json_invalid_query_error_naming_the_parameter() {
    let r = Runner::started(&[]);
    let id = submit_ok(&r, json!({"argv": ["echo", "hi"]}));
    r.wait(&id);
    let cases = [
        (format!("/v1/jobs/{id}/output/stdout?offset=-1"), "offset"),
        (format!("/v1/jobs/{id}/output/stdout?limit=0"), "limit"),
        (
            format!("/v1/jobs/{id}/output/stdout?limit=8388609"),
            "limit",
        ),
        (format!("/v1/jobs/{id}/output/stdout?follow=yes"), "follow"),
        ("/v1/jobs?before=abc".to_owned(), "before"),
        ("/v1/jobs?limit=0".to_owned(), "limit"),
        ("/v1/jobs?limit=100000".to_owned(), "limit"),
        ("/v1/jobs?limit=-5".to_owned(), "limit"),
        ("/v1/jobs?state=sleeping".to_owned(), "sleeping"),
        // Seqs start at 1: a `before` below can match nothing.
        ("/v1/jobs?before=0".to_owned(), "before"),
        ("/v1/jobs?before=-1".to_owned(), "before"),
        ("/v1/jobs?owner=no%20such%20owner".to_owned(), "owner"),
        ("/v1/jobs?owner=".to_owned(), "owner"),
        (
            format!("/v1/jobs/{id}/wait?timeout_secs=-1"),
            "timeout_secs",
        ),
        (
            format!("/v1/jobs/{id}/wait?timeout_secs=3601"),
            "timeout_secs",
        ),
    ];
    for (path, needle) in cases {
        let (status, body) = get(&r.socket(), &path).expect("GET");
        assert_eq!(status, 400, "{path}: {body}");
        let body: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{path}: not the JSON error ({e}): {body}"));
        assert_eq!(body["error"]["code"], "invalid_query", "{path}: {body}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains(needle), "{path}: {message}");
    }
    // The bounds themselves are accepted.
    for path in [
        "/v1/jobs?before=1".to_owned(),
        "/v1/jobs?before=9223372036854775807&owner=default".to_owned(),
        "/v1/jobs?limit=1".to_owned(),
        "/v1/jobs?limit=1000".to_owned(),
        format!("/v1/jobs/{id}/wait?timeout_secs=0"),
        format!("/v1/jobs/{id}/output/stdout?limit=8388608"),
    ] {
        let (status, body) = get(&r.socket(), &path).expect("GET");
        assert_eq!(status, 200, "{path}: {body}");
    }
}

/// The JSON error of a response, or a panic naming what came instead.
fn json_error(what: &str, status: u16, body: &str) -> (u16, String, String) {
    let v: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{what}: {status} without the JSON error ({e}): {body:?}"));
    let code = v["error"]["code"].as_str().expect("code").to_owned();
    let message = v["error"]["message"].as_str().expect("message").to_owned();
    (status, code, message)
}

#[test]
fn wrong_methods_and_unknown_routes_get_the_json_error() {
    let r = Runner::started(&[]);
    let id = submit_ok(&r, json!({"argv": ["true"]}));
    for (method, path, allowed) in [
        ("DELETE", "/v1/jobs".to_owned(), "get"),
        ("PUT", format!("/v1/jobs/{id}"), "get"),
        ("GET", format!("/v1/jobs/{id}/cancel"), "post"),
        ("POST", format!("/v1/jobs/{id}/wait"), "get"),
        ("DELETE", "/v1/admission".to_owned(), "put"),
    ] {
        let what = format!("{method} {path}");
        let resp = raw_request(&r.socket(), method, &path);
        assert!(resp.starts_with("http/1.1 405"), "{what}: {resp}");
        let (head, body) = resp.split_once("\r\n\r\n").expect("head");
        let allow = head
            .lines()
            .find_map(|l| l.strip_prefix("allow: "))
            .unwrap_or_else(|| panic!("{what}: no allow header: {head}"));
        assert!(allow.contains(allowed), "{what}: {allow}");
        // raw_request lower-cases the response.
        let (_, code, message) = json_error(&what, 405, body);
        assert_eq!(code, "method_not_allowed", "{what}");
        assert!(
            message.contains(&method.to_lowercase()),
            "{what}: {message}"
        );
    }
    for (method, path) in [
        ("GET", "/v1/nope"),
        ("POST", "/v1/jobs/x/y/z"),
        ("GET", "/"),
    ] {
        let what = format!("{method} {path}");
        let (status, body) = http(&r.socket(), method, path, None).expect("request");
        let (status, code, message) = json_error(&what, status, &body);
        assert_eq!((status, code.as_str()), (404, "not_found"), "{what}");
        assert!(message.contains(path), "{what}: {message}");
    }
    // A body over the bound: the JSON error too. Written beside the read, since the
    // runner answers before it has read all of it.
    {
        use std::io::{Read, Write};
        let token = fs::read_to_string(r.runner_dir().join("api.token")).expect("token");
        let mut s = std::os::unix::net::UnixStream::connect(r.socket()).expect("connect");
        let mut w = s.try_clone().expect("clone");
        let len = 2 * 1024 * 1024 + 1;
        let writer = std::thread::spawn(move || {
            let _ = write!(
                w,
                "POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Length: {len}\r\n\r\n",
                token.trim()
            );
            let _ = w.write_all(&vec![b' '; len]);
        });
        let mut resp = Vec::new();
        let _ = s.read_to_end(&mut resp);
        let _ = s.shutdown(std::net::Shutdown::Both);
        writer.join().expect("writer");
        let resp = String::from_utf8_lossy(&resp);
        assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
        let body = resp.split_once("\r\n\r\n").expect("head").1;
        let (_, code, message) = json_error("a large body", 413, body);
        assert_eq!(code, "too_large");
        assert!(message.contains("2097152"), "{message}");
    }
    // Without the token, still the token's error first, and in JSON.
    for (method, path) in [("DELETE", "/v1/jobs"), ("GET", "/v1/nope")] {
        let (status, body) = http_with(&r.socket(), method, path, None, None).expect("request");
        let (status, code, _) = json_error(path, status, &body);
        assert_eq!((status, code.as_str()), (401, "unauthorized"), "{path}");
    }
}

#[test]
fn what_exec_cannot_take_is_refused_at_submission_naming_it() {
    let r = Runner::started(&[]);
    // Linux's MAX_ARG_STRLEN: 128 KiB per string, its NUL included.
    const STRLEN: usize = 128 * 1024;
    let refused_briefly = |spec: Value, needle: &str| {
        let message = refused_spec(&r, spec, needle);
        assert!(
            message.len() < 400,
            "the message repeats the value: {message}"
        );
    };
    refused_briefly(
        json!({"argv": ["true"], "env": {"BIG": "x".repeat(200 * 1024)}}),
        "variable BIG",
    );
    refused_briefly(
        json!({"argv": ["true"], "env": {"BIG": "x".repeat(STRLEN - "BIG=".len())}}),
        "variable BIG",
    );
    refused_briefly(json!({"argv": ["echo", "x".repeat(STRLEN)]}), "argv[1]");
    // Each string fits; all together are more than the runner passes to exec.
    let env: serde_json::Map<String, Value> = (0..9)
        .map(|i| (format!("V{i}"), json!("x".repeat(120 * 1024))))
        .collect();
    refused_briefly(json!({"argv": ["true"], "env": env}), "1048576");

    // What is accepted, exec takes: the longest single strings, and nearly all of the
    // total, reach the program whole.
    let id = submit_ok(
        &r,
        json!({
            "argv": ["sh", "-c", "echo ${#BIG} ${#1}", "sh", "y".repeat(STRLEN - 1)],
            "env": {"BIG": "x".repeat(STRLEN - 1 - "BIG=".len())},
        }),
    );
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "succeeded", "{rec}");
    assert_eq!(
        r.output(&id, "stdout"),
        format!("{} {}\n", STRLEN - 5, STRLEN - 1)
    );
    let env: serde_json::Map<String, Value> = (0..8)
        .map(|i| (format!("V{i}"), json!("x".repeat(STRLEN - 100))))
        .collect();
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "echo ${#V0} ${#V7}"], "env": env}),
    );
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "succeeded", "{rec}");
    assert_eq!(
        r.output(&id, "stdout"),
        format!("{} {}\n", STRLEN - 100, STRLEN - 100)
    );
}

#[test]
fn echoed_client_values_are_cut_short() {
    let r = Runner::started(&[]);
    // Within hyper's 64 KiB bound on a request's URI, which it answers itself (414).
    let long = "o".repeat(60_000);
    let short = |what: &str, message: &str| {
        assert!(message.len() < 400, "{what}: {} bytes", message.len());
        assert!(message.contains("o…"), "{what}: {message}");
    };
    for spec in [
        json!({"argv": ["true"], "owner": format!("{long}!")}),
        json!({"argv": ["true"], "id": format!("{long}!")}),
        json!({"argv": ["true"], "env": {format!("{long}="): "x"}}),
        json!({"argv": ["true"], "env": {format!("LD_{long}"): "x"}}),
    ] {
        let (status, body) = r.submit(spec);
        assert_eq!(status, 400);
        short(
            "submission",
            body["error"]["message"].as_str().expect("message"),
        );
    }
    for path in [
        format!("/v1/jobs/{long}"),
        format!("/v1/jobs/{long}/wait"),
        format!("/v1/jobs?owner={long}!"),
        format!("/v1/jobs?state={long}"),
    ] {
        let (status, body) = get(&r.socket(), &path).expect("GET");
        let (_, _, message) = json_error(&path[..20], status, &body);
        short(&path[..20], &message);
    }
}

#[test]
fn limits_too_small_to_start_a_shell_are_refused_and_the_minimums_run_one() {
    let r = Runner::started(&[]);
    // The minimums once documented: neither lets `sh` start.
    for (limits, needle) in [
        (json!({"open_files": 3}), "at least 16"),
        (json!({"open_files": 15}), "at least 16"),
        (json!({"memory_bytes": 1048576}), "at least 8388608"),
    ] {
        let (status, body) = r.submit(json!({"argv": ["true"], "limits": limits}));
        assert_eq!(status, 400, "{limits}: {body}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains(needle), "{limits}: {message}");
    }
    // A shell runs with both at their minimum, redirections included (dash moves the
    // descriptor it saves to 10 or above).
    let id = submit_ok(
        &r,
        json!({
            "argv": ["sh", "-c", "echo ok >/dev/null && echo ok"],
            "limits": {"open_files": 16, "memory_bytes": 8388608},
        }),
    );
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "succeeded", "{rec}");
    assert_eq!(r.output(&id, "stdout"), "ok\n");
}

#[test]
fn glibc_unsecure_variables_are_refused_by_name_and_tmpdir_may_be_chosen() {
    let r = Runner::started(&[]);
    for name in ["GLIBC_TUNABLES", "TZDIR", "LOCALDOMAIN"] {
        let spec = json!({"argv": ["true"], "env": {name: "glibc.malloc.mxfast=0"}});
        refused_spec(&r, spec, name);
    }
    let tmp = r.runner_dir().join("work/chosen-tmp");
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "echo TMPDIR=$TMPDIR"], "env": {"TMPDIR": path_str(&tmp)}}),
    );
    r.wait(&id);
    assert_eq!(
        r.output(&id, "stdout"),
        format!("TMPDIR={}\n", tmp.display())
    );
}

/// The attack of a job on another job's cwd: a directory on the way to that cwd is
/// swapped, as fast as a thread can, with a symlink to the state directory. A path that is
/// checked and then resolved again lands some jobs in `<state>/runner`, with its API token
/// and database; resolved once by descriptor, none.
#[cfg(target_os = "linux")]
#[test]
fn a_cwd_swapped_with_a_symlink_never_lands_a_job_in_the_state_dir() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let r = Runner::started(&[]);
    let token = fs::read_to_string(r.runner_dir().join("api.token")).expect("token");
    let attack = submit_ok(&r, json!({"id": "attack", "argv": ["true"]}));
    r.wait(&attack);
    let ws = r.runner_dir().join("work/attack");
    // `x/runner` exists for real, with a decoy token, so a cwd through `x` passes every
    // check while `x` is the directory; swapped, `x/runner` is `<state>/runner`.
    fs::create_dir_all(ws.join("x/runner")).expect("mkdir");
    fs::write(ws.join("x/runner/api.token"), "decoy\n").expect("decoy");
    std::os::unix::fs::symlink(r.state(), ws.join("y")).expect("symlink");
    chown_runner_dir(&ws);

    /// Swaps `x` and `y` until dropped (also when the test fails, before its files go).
    struct Swapper {
        stop: Arc<AtomicBool>,
        swaps: Arc<AtomicU64>,
        thread: Option<std::thread::JoinHandle<()>>,
    }
    impl Drop for Swapper {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let thread = {
        let (stop, swaps, ws) = (stop.clone(), swaps.clone(), ws.clone());
        std::thread::spawn(move || {
            let (x, y) = (ws.join("x"), ws.join("y"));
            while !stop.load(Ordering::Relaxed) {
                let swapped = nix::fcntl::renameat2(
                    nix::fcntl::AT_FDCWD,
                    &x,
                    nix::fcntl::AT_FDCWD,
                    &y,
                    nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                );
                if swapped.is_err() {
                    break;
                }
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let swapper = Swapper {
        stop,
        swaps,
        thread: Some(thread),
    };
    let mut accepted = Vec::new();
    let mut refused = 0;
    for i in 0..60 {
        let id = format!("victim-{i}");
        let (status, body) = r.submit(json!({
            "id": id, "argv": ["cat", "api.token"], "cwd": "../attack/x/runner",
        }));
        match status {
            201 => accepted.push(id),
            400 => refused += 1,
            _ => panic!("submission {id}: {status} {body}"),
        }
    }
    let mut decoys = 0;
    for id in &accepted {
        let rec = r.wait(id);
        let out = r.output(id, "stdout");
        assert!(
            !out.contains(token.trim()),
            "job {id} read the runner's API token from its cwd: {rec}"
        );
        if out == "decoy\n" {
            decoys += 1;
        } else {
            // Refused at its start instead: the symlink was there when it was opened.
            let error = rec["error"].as_str().unwrap_or_default();
            assert!(
                rec["state"] == "failed" && error.contains("field cwd"),
                "job {id}: {rec}"
            );
        }
    }
    let swaps = swapper.swaps.load(Ordering::Relaxed);
    drop(swapper);
    assert!(swaps > 0, "the swapper never swapped");
    eprintln!(
        "{} accepted ({decoys} ran in the real directory), {refused} refused, {swaps} swaps",
        accepted.len(),
    );
}
