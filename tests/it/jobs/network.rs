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

    let off = Runner::started(&["--network", "none", "--sandbox", "off"]);
    let (status, body) = off.submit(json!({"argv": ["true"]}));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "no_sandbox", "{body}");
    assert_says(&body["error"], "message", "network \"none\"");
}
