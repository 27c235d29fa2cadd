//! The hub's connections: TLS or nothing, bodies only after the token, held polls counted, requests in turn on one connection, heads and lengths past any reason, answers read late.

use super::*;

#[test]
fn a_connection_that_never_starts_tls_is_closed() {
    use std::io::Read;
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let mut tcp = std::net::TcpStream::connect(&hub.listen).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut buf = [0u8; 16];
    // The hub's handshake timeout (10 s) ends it; a hub that held it would run into the
    // read timeout instead, an error rather than the end of the stream.
    let n = tcp.read(&mut buf).expect("the hub closed the connection");
    assert_eq!(n, 0, "the hub sent bytes to a client that said nothing");
}

#[test]
fn no_body_is_read_before_the_token_and_a_slow_body_is_cut_off() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let t = token(&hub.enrol("slow"));
    // No token, a large body announced and never sent: refused at once, not buffered.
    let answer = raw_tls(
        &hub,
        b"POST /v1/agents/slow/reconcile HTTP/1.1\r\nHost: hub\r\nContent-Length: 100000\r\n\r\n",
        Duration::from_secs(30),
    );
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    // With the token, a body that stops half way: 408 once the body timeout passes.
    let req = format!(
        "POST /v1/agents/slow/reconcile HTTP/1.1\r\nHost: hub\r\nAuthorization: bearer {t}\r\nContent-Length: 1000\r\n\r\n{{\"version\""
    );
    let answer = raw_tls(&hub, req.as_bytes(), Duration::from_secs(40));
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive"), "{answer}");
}

#[test]
fn held_polls_are_counted_while_held_only() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let t = token(&hub.enrol("count"));
    let polls: Vec<HeldPoll> = (0..3)
        .map(|_| HeldPoll::start(&hub, "count", &t, 1, 30))
        .collect();
    wait_for(Duration::from_secs(10), "3 polls held", || {
        (held(&hub) == 3).then_some(())
    });
    // Clients that go away mid-wait (killed) are uncounted.
    drop(polls);
    wait_for(Duration::from_secs(10), "no poll held", || {
        (held(&hub) == 0).then_some(())
    });
    // Connected a few seconds more (an answered poll is followed by the next at once, and
    // `connected` must not flicker in between), then not.
    wait_for(Duration::from_secs(30), "no longer connected", || {
        (!connected(&hub, "count")).then_some(())
    });
}

#[test]
fn one_connection_carries_polls_and_other_requests_in_turn() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let t = token(&hub.enrol("pipe"));
    let body = report(0);
    let poll = |token: &str, extra: &str| {
        format!(
            "POST /v1/agents/pipe/reconcile?wait=0 HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}\r\n{body}",
            body.len()
        )
    };
    // Sent at once, on one connection: a health check and a refused poll (served by
    // hyper, one at a time), two polls (served by the connection itself), the last of
    // which closes it. Each is answered, in order, and nothing of one leaks into the
    // next.
    let health = "GET /v1/health HTTP/1.1\r\nHost: hub\r\n\r\n";
    let all = [
        health.to_owned(),
        poll(&t, ""),
        poll("rga_not_this_one", ""),
        health.to_owned(),
        poll(&t, "Connection: close\r\n"),
    ]
    .concat();
    let answer = raw_tls(&hub, all.as_bytes(), Duration::from_secs(30));
    let statuses: Vec<&str> = answer
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &answer[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, ["200", "200", "401", "200", "200"], "{answer}");
    assert_eq!(answer.matches("\"generation\":").count(), 2, "{answer}");
    assert_eq!(answer.matches("\"polls_held\":").count(), 2, "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");

    // A chunked poll (whose end only hyper reads) is served too, by hyper.
    let chunked = format!(
        "POST /v1/agents/pipe/reconcile HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer {t}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let answer = raw_tls(&hub, chunked.as_bytes(), Duration::from_secs(30));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"generation\":"), "{answer}");
}

#[test]
fn a_length_past_any_body_is_hypers_to_refuse_and_the_hub_keeps_serving() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    // A length whose sum with the head wraps around u64: as many such connections as the
    // hub has threads, and the hub still answers (each is refused, or cut off by its
    // timeouts, never served in a loop).
    let len = "GET / HTTP/1.1\r\nHost: hub\r\nContent-Length: \r\n\r\n".len() + 20;
    let head = format!(
        "GET / HTTP/1.1\r\nHost: hub\r\nContent-Length: {}\r\n\r\n",
        u64::MAX - len as u64 + 1
    );
    assert_eq!(head.len(), len);
    let head = head.as_bytes();
    std::thread::scope(|s| {
        let floods: Vec<_> = (0..4)
            .map(|_| s.spawn(|| raw_tls(&hub, head, Duration::from_secs(5))))
            .collect();
        let started = Instant::now();
        let (code, body) = hub.curl("GET", "/v1/health", None, None);
        assert_eq!(code, 200, "{body}");
        assert!(started.elapsed() < Duration::from_secs(30));
        for f in floods {
            let answer = f.join().expect("flood");
            assert!(!answer.contains("200 OK"), "{answer}");
        }
    });
}

#[test]
fn a_poll_hyper_serves_ends_when_its_client_goes_away() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let t = token(&hub.enrol("gone"));
    let body = report(1);
    // `Expect: 100-continue` is hyper's to serve: the poll is held there.
    let req = format!(
        "POST /v1/agents/gone/reconcile?wait=30 HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer {t}\r\nExpect: 100-continue\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    std::thread::scope(|s| {
        // Gone once this read gives up, long before the poll's 30 s.
        let client = s.spawn(|| raw_tls(&hub, req.as_bytes(), Duration::from_secs(3)));
        wait_for(Duration::from_secs(10), "the poll held", || {
            (held(&hub) == 1).then_some(())
        });
        let answer = client.join().expect("client");
        assert!(
            !answer.contains("200 OK"),
            "answered before any change: {answer}"
        );
    });
    wait_for(
        Duration::from_secs(10),
        "the poll ended with its client",
        || (held(&hub) == 0).then_some(()),
    );
}

#[test]
fn a_large_answer_reaches_a_client_that_reads_it_late_whole() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let admin = hub.admin_token();
    // 400 agents, enrolled over one connection: their list is over 64 KiB.
    let mut enrol: String = (0..400)
        .map(|i| {
            let body = format!("{{\"id\":\"late-{i}\"}}");
            format!(
                "POST /v1/admin/agents HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer {admin}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        })
        .collect();
    enrol.push_str("GET /v1/health HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n\r\n");
    let enrolled = raw_tls(&hub, enrol.as_bytes(), Duration::from_secs(120));
    assert_eq!(
        enrolled.matches("HTTP/1.1 201").count(),
        400,
        "{enrolled:.300}"
    );
    // A client with a small receive window that starts reading a second late, on a
    // connection kept open: the answer waits in the hub's buffers, and comes whole.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (head, body) = rt.block_on(async {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        let tcp = socket
            .connect(hub.listen.parse().expect("address"))
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let tls = tls_connector(&hub).connect(name, tcp).await.expect("tls");
        let mut tls = tokio::io::BufReader::new(tls);
        let req = format!(
            "GET /v1/admin/agents HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer {admin}\r\n\r\n"
        );
        tls.get_mut()
            .write_all(req.as_bytes())
            .await
            .expect("write");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let read = async {
            let mut head = String::new();
            loop {
                let mut line = String::new();
                tls.read_line(&mut line).await.expect("head");
                if line == "\r\n" || line.is_empty() {
                    break;
                }
                head.push_str(&line);
            }
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .expect("content-length")
                .trim()
                .parse()
                .expect("length");
            let mut body = vec![0u8; len];
            tls.read_exact(&mut body).await.expect("the whole body");
            (head, body)
        };
        tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("answered within a minute")
    });
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.len() > 64 * 1024, "{}", body.len());
    let agents: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(agents.as_array().map(Vec::len), Some(400));
}

#[test]
fn headers_that_never_end_are_cut_off() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    // A request line and half a header, then nothing: the hub's header timeout (10 s)
    // closes the connection (its answer, if any, is an error); a hub that waited would
    // leave this read to its own 60 s limit with nothing.
    let started = std::time::Instant::now();
    let answer = raw_tls(
        &hub,
        b"GET /v1/health HTTP/1.1\r\nHost: hub\r\nX-Slow: ",
        Duration::from_secs(60),
    );
    assert!(
        started.elapsed() < Duration::from_secs(55),
        "the connection was held for {:?}",
        started.elapsed()
    );
    assert!(!answer.contains("200 OK"), "{answer}");
}

#[test]
fn a_path_that_does_not_decode_is_answered_in_the_apis_error_shape() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let admin = hub.admin_token();
    for path in [
        "/v1/admin/agents/%ff",
        "/v1/admin/jobs/%C0%80/output/stdout",
    ] {
        let (code, body) = hub.curl("GET", path, Some(&admin), None);
        assert_eq!(code, 400, "{path}: {body}");
        let v = json(&body);
        assert!(
            v["error"].as_str().unwrap_or("").contains("request path"),
            "{path}: {body}"
        );
    }
}
