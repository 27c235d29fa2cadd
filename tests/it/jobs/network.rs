//! A job's network (docs/security.md, "Egress"): with `none` it has a network namespace of
//! its own, loopback only, so neither a service on the host's loopback nor an abstract
//! Unix socket of the host is in its reach; a job narrows the runner's policy and never
//! widens it; and `none` is never given without the sandbox that keeps it.

use super::*;

/// What a job that tries the host's TCP service on `port`, the host's abstract socket
/// `name` and a listener on its own loopback says, one line each.
fn probe_script(port: u16, name: &str) -> String {
    format!(
        r#"perl -MSocket -MIO::Socket::INET -e '
            my $t = IO::Socket::INET->new(PeerAddr => "127.0.0.1:{port}", Timeout => 5);
            print $t ? "tcp reached\n" : "tcp refused\n";
            socket(my $u, AF_UNIX, SOCK_STREAM, 0) or die "socket: $!";
            print connect($u, pack_sockaddr_un("\0{name}")) ? "unix reached\n" : "unix refused\n";
            my $l = IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1:0") or die "listen: $!";
            my $c = IO::Socket::INET->new(PeerAddr => "127.0.0.1:" . $l->sockport, Timeout => 5);
            print $c ? "loopback up\n" : "loopback down\n";'"#
    )
}

#[test]
fn with_network_none_a_job_reaches_neither_the_hosts_services_nor_its_abstract_sockets() {
    use std::os::linux::net::SocketAddrExt;
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("a host service");
    let port = tcp.local_addr().expect("port").port();
    let name = format!("railgrid-test-{}", std::process::id());
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract name");
    let _unix = std::os::unix::net::UnixListener::bind_addr(&addr).expect("an abstract socket");
    let r = Runner::started(&[]);
    let script = probe_script(port, &name);

    // The runner's policy is `open` by default: the host's loopback answers.
    let open = submit_ok(&r, json!({"argv": ["sh", "-c", script]}));
    let rec = r.wait(&open);
    assert_eq!(rec["exit_code"], 0, "{rec}");
    let out = r.output(&open, "stdout");
    assert!(out.contains("tcp reached"), "{out}");

    // A job that asks for none: nothing of the host, its own loopback up.
    let none = submit_ok(&r, json!({"argv": ["sh", "-c", script], "network": "none"}));
    let rec = r.wait(&none);
    assert_eq!(rec["exit_code"], 0, "{rec}");
    let out = r.output(&none, "stdout");
    assert_eq!(out, "tcp refused\nunix refused\nloopback up\n");
    assert_says(&rec, "confinement", "; network: none");
}

#[test]
fn a_job_never_widens_the_runners_network_and_none_needs_the_sandbox() {
    let r = Runner::started(&["--network", "none"]);
    let (status, body) = r.submit(json!({"argv": ["true"], "network": "open"}));
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "network_policy", "{body}");
    assert_says(&body["error"], "message", "runner.network = \"none\"");
    // Its own default is the runner's: none.
    let id = submit_ok(&r, json!({"argv": ["true"]}));
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "succeeded", "{rec}");
    assert_says(&rec, "confinement", "; network: none");

    // A submitter that may widen it says so (the runner's own token, here).
    let wide = submit_ok(
        &r,
        json!({"argv": ["true"], "network": "open", "widen_network": true}),
    );
    let rec = r.wait(&wide);
    assert_eq!(rec["state"], "succeeded", "{rec}");
    assert!(!says(&rec, "confinement", "network"), "{rec}");

    // Under an `allow` policy, a rule of the job's must lie inside one of the runner's.
    let allow = Runner::started(&["--network", "allow *.example.com:443"]);
    let id = submit_ok(
        &allow,
        json!({"argv": ["true"], "network": "allow api.example.com:443"}),
    );
    assert_eq!(allow.wait(&id)["state"], "succeeded");
    for wider in ["allow example.com:443", "allow api.example.com:80", "open"] {
        let (status, body) = allow.submit(json!({"argv": ["true"], "network": wider}));
        assert_eq!(status, 403, "{wider}: {body}");
        assert_eq!(body["error"]["code"], "network_policy", "{body}");
    }

    let off = Runner::started(&["--network", "none", "--sandbox", "off"]);
    let (status, body) = off.submit(json!({"argv": ["true"]}));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "no_sandbox", "{body}");
    assert_says(&body["error"], "message", "network \"none\"");
}

/// A bare repository served as git's dumb HTTP protocol reads it, and a small file.
fn served_files(root: &Path) {
    let git = |args: &[&str], dir: &Path| {
        let out = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(dir)
            .output()
            .expect("git");
        assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
    };
    let src = root.join("src");
    fs::create_dir_all(&src).expect("src");
    fs::write(src.join("README"), "cloned through the proxy\n").expect("README");
    git(&["init", "-q", "-b", "main"], &src);
    git(&["add", "README"], &src);
    git(&["commit", "-q", "-m", "one"], &src);
    git(&["clone", "-q", "--bare", "src", "repo.git"], root);
    git(&["update-server-info"], &root.join("repo.git"));
    fs::write(root.join("hello.txt"), "hello over TLS\n").expect("hello");
}

#[test]
fn with_network_allow_a_job_reaches_only_what_its_rules_name_and_its_status_lists_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    served_files(dir.path());
    let ca = TestCa::new();
    let server = FileServer::start(dir.path().to_owned(), ca.server());
    // A port with no server: a rule for it by name only, which leads to loopback.
    let spare = std::net::TcpListener::bind("127.0.0.1:0").expect("spare");
    let (port, named_only) = (server.port, spare.local_addr().expect("addr").port());
    drop(spare);
    // A plain HTTP service: what the proxy forwards, as the service saw it.
    let plain = std::net::TcpListener::bind("127.0.0.1:0").expect("plain");
    let plain_port = plain.local_addr().expect("addr").port();
    let seen = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = plain.accept().expect("accept");
        let mut head = Vec::new();
        let mut b = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut b).expect("read");
            assert!(n > 0, "the request ended early");
            head.extend_from_slice(&b[..n]);
        }
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nplain ok\n");
        String::from_utf8_lossy(&head).into_owned()
    });
    let r = Runner::started(&[]);
    // The job asks for localhost: its own loopback is NO_PROXY, so it says otherwise.
    let script = format!(
        r#"unset NO_PROXY no_proxy
        printf '%s\n' "$CA_PEM" > ca.pem
        echo "proxy $HTTPS_PROXY"
        curl -sS --cacert ca.pem https://localhost:{port}/hello.txt; echo "curl=$?"
        GIT_SSL_CAINFO=$PWD/ca.pem git clone -q https://localhost:{port}/repo.git clone && cat clone/README; echo "git=$?"
        curl -sS -H 'Proxy-Authorization: Basic c2VjcmV0' http://127.0.0.1:{plain_port}/x?y=1; echo "plain=$?"
        curl -sS -o /dev/null --cacert ca.pem https://localhost:{other}/ 2>/dev/null; echo "other port=$?"
        curl -sS -w '%{{http_code}}\n' http://169.254.169.254/latest/meta-data/; echo "metadata=$?"
        curl -sS -o /dev/null --cacert ca.pem https://localhost:{named_only}/ 2>/dev/null; echo "named only=$?"
        openssl s_client -proxy 127.0.0.1:3128 -connect localhost:{port} -servername evil.example </dev/null >/dev/null 2>&1; echo "fronted=$?"
        curl --noproxy '*' -sS --max-time 5 https://localhost:{port}/hello.txt 2>/dev/null; echo "direct=$?"
        "#,
        other = port + 1,
    );
    let network = format!(
        "allow localhost:{port} 127.0.0.1:{port} localhost:{named_only} 127.0.0.1:{plain_port}"
    );
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", script], "network": network, "env": {"CA_PEM": ca.pem()}}),
    );
    let rec = r.wait(&id);
    let out = r.output(&id, "stdout");
    assert_eq!(
        rec["state"],
        "succeeded",
        "{rec}\n{out}\n{}",
        r.output(&id, "stderr")
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "proxy http://127.0.0.1:3128",
            "hello over TLS",
            "curl=0",
            "cloned through the proxy",
            "git=0",
            "plain ok",
            "plain=0",
            "other port=56",
            "railgrid egress proxy: 169.254.169.254:80 refused: no rule allows the address 169.254.169.254 on port 80",
            "403",
            "metadata=0",
            "named only=56",
            "fronted=1",
            "direct=7",
        ],
        "{out}"
    );
    assert_says(&rec, "confinement", &format!("; network: {network}"));
    // Forwarded in origin form, its Host the one allowed, the proxy's own headers dropped.
    let head = seen.join().expect("the plain service");
    assert!(head.starts_with("GET /x?y=1 HTTP/1.1\r\n"), "{head}");
    assert!(
        head.to_lowercase()
            .contains(&format!("\r\nhost: 127.0.0.1:{plain_port}\r\n")),
        "{head}"
    );
    assert!(
        !head.to_lowercase().contains("proxy-authorization"),
        "{head}"
    );
    let denied = rec["egress_denied"]
        .as_array()
        .expect("egress_denied")
        .clone();
    let reason = |dest: String| {
        denied
            .iter()
            .find(|d| d["destination"] == dest.as_str())
            .map(|d| {
                (
                    d["count"].as_u64().unwrap_or(0),
                    d["reason"].as_str().unwrap_or("").to_owned(),
                )
            })
            .unwrap_or_else(|| panic!("{dest} not denied: {denied:?}"))
    };
    assert_eq!(
        reason(format!("localhost:{}", port + 1)).1,
        format!("no rule allows localhost on port {}", port + 1)
    );
    assert_eq!(reason("169.254.169.254:80".into()).0, 1);
    let named = reason(format!("localhost:{named_only}")).1;
    assert!(
        named.starts_with("localhost resolves to ")
            && named.ends_with("(loopback), which no rule names"),
        "{named}"
    );
    assert_eq!(
        reason(format!("localhost:{port}")).1,
        "the TLS handshake names evil.example, not localhost"
    );
    assert_eq!(denied.len(), 4, "{denied:?}");

    // The text status lists them too.
    let status = r.cli().args(["status", &id]).output().expect("job status");
    assert!(
        text(&status.stdout).contains("denied:   169.254.169.254:80 ×1: no rule allows"),
        "{}",
        text(&status.stdout)
    );
}

#[test]
fn a_job_holds_at_most_its_proxys_share_of_tunnels_and_the_runner_answers_throughout() {
    let ca = TestCa::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = FileServer::start(dir.path().to_owned(), ca.server());
    let port = server.port;
    let r = Runner::started(&[]);
    // 300 tunnels opened and held (the server waits for a handshake that never comes);
    // what their CONNECTs got within two seconds, in order.
    let script = format!(
        r#"perl -MIO::Socket::INET -e '
            my (%got, @held);
            for (1..300) {{
                my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:3128") or die "connect: $!";
                print $s "CONNECT localhost:{port} HTTP/1.1\r\nHost: localhost\r\n\r\n";
                push @held, $s;
            }}
            my $read = 0;
            eval {{
                local $SIG{{ALRM}} = sub {{ die }};
                alarm 2;
                for my $s (@held) {{
                    my ($code) = (<$s> // "") =~ m{{^HTTP/1.1 (\d+)}};
                    $got{{$code // "none"}}++;
                    $read++;
                }}
                alarm 0;
            }};
            $got{{none}} += 300 - $read;
            print join(" ", map {{ "$_=$got{{$_}}" }} sort keys %got), "\n";'"#
    );
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", script], "network": format!("allow localhost:{port} 127.0.0.1:{port}")}),
    );
    // Meanwhile the runner answers.
    let health = get_json(&r.socket(), "/v1/health");
    assert!(
        health.is_some(),
        "the runner did not answer while the job held its tunnels"
    );
    let rec = r.wait(&id);
    let out = r.output(&id, "stdout");
    assert_eq!(
        rec["state"],
        "succeeded",
        "{rec}\n{}",
        r.output(&id, "stderr")
    );
    let count = |code: &str| {
        out.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{code}=")))
            .map_or(0, |n| n.parse::<u32>().expect("count"))
    };
    // How many got through depends on how fast connections are upgraded; never more
    // than the job's share, and some.
    assert!(count("200") <= 256 && count("200") >= 1, "{out}");
    assert_eq!(count("200") + count("503") + count("none"), 300, "{out}");
}
