//! `railgrid agent run` with a hub: against hubs that misbehave (written here, over real
//! TLS with a test CA), with no hub at all, and against the reference hub.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::agent::{Host, LIMIT};
use crate::hubs::TestHub;
use crate::support::*;

/// A CA of the test's own, and server configurations whose certificates it signed.
struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl TestCa {
    fn new() -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "railgrid test CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("self-signed");
        Self { cert, key }
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A TLS server configuration for 127.0.0.1 and localhost, signed by this CA.
    fn server(&self) -> Arc<rustls::ServerConfig> {
        let mut params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "railgrid test hub");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("signed");
        let chain = vec![cert.der().clone()];
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocols")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
        Arc::new(config)
    }
}

/// How a fake hub misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Misbehaviour {
    /// 500 with an error message.
    ServerError,
    /// 200 with a body that is no JSON.
    Garbage,
    /// 200 with a 100 MiB body, streamed (no Content-Length).
    Huge,
    /// Completes TLS, reads the request, never answers.
    Silent,
    /// Accepts the TCP connection and never says a thing (no TLS handshake).
    Mute,
}

/// A hub's answer to a request, as the test script says it: its status line and body.
type Script = Arc<dyn Fn(&str) -> (&'static str, String) + Send + Sync>;

/// What a fake hub does with each request.
#[derive(Clone)]
enum Reply {
    Misbehave(Misbehaviour),
    Script(Script),
}

/// A hub that misbehaves, on 127.0.0.1 over TLS, in a runtime of its own. Dropping it
/// ends every connection.
struct FakeHub {
    rt: Option<tokio::runtime::Runtime>,
    url: String,
    /// The requests it read (head and body), in order.
    requests: Arc<Mutex<Vec<String>>>,
    /// TCP connections it accepted.
    connections: Arc<AtomicUsize>,
}

impl FakeHub {
    fn start(how: Misbehaviour, tls: Arc<rustls::ServerConfig>) -> Self {
        Self::serve(Reply::Misbehave(how), tls)
    }

    /// A hub that answers each request (head and body) as `script` says.
    fn scripted(
        tls: Arc<rustls::ServerConfig>,
        script: impl Fn(&str) -> (&'static str, String) + Send + Sync + 'static,
    ) -> Self {
        Self::serve(Reply::Script(Arc::new(script)), tls)
    }

    fn serve(reply: Reply, tls: Arc<rustls::ServerConfig>) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let url = format!("https://{}", listener.local_addr().expect("addr"));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let (reqs, conns) = (requests.clone(), connections.clone());
        rt.spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                conns.fetch_add(1, Ordering::SeqCst);
                let (acceptor, reqs, reply) = (acceptor.clone(), reqs.clone(), reply.clone());
                tokio::spawn(async move {
                    if matches!(reply, Reply::Misbehave(Misbehaviour::Mute)) {
                        let _held = tcp;
                        return std::future::pending::<()>().await;
                    }
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Some(req) = read_request(&mut tls).await else {
                        return;
                    };
                    reqs.lock().expect("requests").push(req.clone());
                    let _ = match reply {
                        Reply::Misbehave(how) => answer(how, &mut tls).await,
                        Reply::Script(script) => {
                            let (status, body) = script(&req);
                            let _ = tls.write_all(simple(status, &body).as_bytes()).await;
                            tls.shutdown().await
                        }
                    };
                });
            }
        });
        Self {
            rt: Some(rt),
            url,
            requests,
            connections,
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("requests").clone()
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// One HTTP/1.1 request, head and body (by Content-Length).
async fn read_request(s: &mut (impl AsyncRead + Unpin)) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// A whole HTTP/1.1 response with a JSON body.
fn simple(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The `Authorization` header value of a request the agent sent.
fn authorization(req: &str) -> String {
    req.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("authorization")
                .then(|| value.trim().to_owned())
        })
        .expect("an Authorization header")
}

/// The report a request carries.
fn report_of(req: &str) -> Value {
    serde_json::from_str(req.split_once("\r\n\r\n").expect("body").1).expect("report")
}

async fn answer(
    how: Misbehaviour,
    s: &mut (impl tokio::io::AsyncWrite + Unpin),
) -> std::io::Result<()> {
    match how {
        Misbehaviour::ServerError => {
            let text = simple(
                "500 Internal Server Error",
                r#"{"error": "the store is on fire"}"#,
            );
            s.write_all(text.as_bytes()).await?;
        }
        Misbehaviour::Garbage => {
            let text = simple("200 OK", "<html>surely not a desired state</html>");
            s.write_all(text.as_bytes()).await?;
        }
        Misbehaviour::Huge => {
            s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
            )
            .await?;
            let block = vec![b' '; 64 << 10];
            let head = format!("{:x}\r\n", block.len());
            for _ in 0..(100 << 20) / block.len() {
                s.write_all(head.as_bytes()).await?;
                s.write_all(&block).await?;
                s.write_all(b"\r\n").await?;
            }
            s.write_all(b"0\r\n\r\n").await?;
        }
        Misbehaviour::Silent | Misbehaviour::Mute => std::future::pending().await,
    }
    s.flush().await?;
    s.shutdown().await
}

/// A host whose agent talks to a hub: the token (in a 0600 file) and the CA it trusts.
struct HubHost {
    host: Host,
    token: String,
    token_file: PathBuf,
    ca_file: PathBuf,
}

impl HubHost {
    /// A host with a token of its own and `ca_pem` as the hub's CA.
    fn new(ca_pem: &str) -> Self {
        let host = Host::new();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .subsec_nanos();
        let token = format!("tok-{}-{nanos:09}-do-not-leak", std::process::id());
        write_private(&host.path("token"), &token);
        fs::write(host.path("ca.pem"), ca_pem).expect("ca");
        Self {
            token_file: host.path("token"),
            ca_file: host.path("ca.pem"),
            host,
            token,
        }
    }

    /// A host enrolled at the reference hub `hub` as `id`.
    fn enrolled(hub_dir: &Path, id: &str) -> (Self, TestHub) {
        let host = Host::new();
        let hub = TestHub::start(hub_dir, &[]);
        let token_file = hub.enrol(id);
        let token = read_lossy(&token_file).trim().to_owned();
        assert!(!token.is_empty());
        let me = Self {
            ca_file: hub.ca(),
            host,
            token,
            token_file,
        };
        (me, hub)
    }

    /// `agent run` against `url`, as agent `a1`.
    fn start_agent(&self, url: &str) -> Guard {
        self.start_agent_as(url, "a1")
    }

    fn start_agent_as(&self, url: &str, id: &str) -> Guard {
        Guard::new(self.agent_command(url, id).spawn().expect("spawn agent"))
    }

    fn agent_command(&self, url: &str, id: &str) -> std::process::Command {
        let token = path_str(&self.token_file);
        let ca = path_str(&self.ca_file);
        let mut cmd = self.host.agent_cmd(&[
            "--hub",
            url,
            "--agent-id",
            id,
            "--token-file",
            &token,
            "--ca-file",
            &ca,
        ]);
        // The agent's log file has it all; an unread pipe could fill up.
        cmd.stderr(Stdio::null());
        cmd
    }

    /// `agent status --json`.
    fn status_json(&self) -> Value {
        let out = railgrid()
            .args(["agent", "status", "--json", "--state-dir"])
            .arg(self.host.state())
            .output()
            .expect("agent status");
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// Waits until the status file shows a hub error containing `needle`, and returns
    /// what `agent status --json` says then.
    fn wait_hub_error(&self, needle: &str, limit: Duration) -> Value {
        wait_for(limit, &format!("hub last_error with {needle:?}"), || {
            let st = self.host.status();
            st["hub"]["last_error"]
                .as_str()?
                .contains(needle)
                .then_some(())
        });
        self.status_json()
    }

    /// Waits until the status file says `accept`; returns it.
    fn wait_status(&self, what: &str, limit: Duration, accept: impl Fn(&Value) -> bool) -> Value {
        wait_for(limit, what, || {
            let st = self.host.status();
            accept(&st).then_some(st)
        })
    }

    /// The token is in none of the agent's files: logs, the runner's log, the status
    /// file, the kept desired state.
    fn assert_token_kept_secret(&self) {
        self.assert_kept_secret(&self.token);
    }

    /// `secret` (the token, or a part of it) is in none of the agent's files.
    fn assert_kept_secret(&self, secret: &str) {
        let mut files = vec![
            self.host.state().join("agent-status.json"),
            self.host.state().join("desired.json"),
        ];
        for entry in fs::read_dir(self.host.path("logs"))
            .expect("logs")
            .flatten()
        {
            files.push(entry.path());
        }
        for f in files {
            assert!(
                !read_lossy(&f).contains(secret),
                "the token leaked into {}",
                f.display()
            );
        }
        assert!(!self.status_json().to_string().contains(secret));
    }
}

/// `agent check-config` with the host's config, a hub, its token file and `extra`.
fn check_config(h: &HubHost, extra: &[&str]) -> std::process::Output {
    railgrid()
        .args(["agent", "check-config", "--config"])
        .arg(h.host.path("agent.toml"))
        .args(["--hub", "https://hub.example", "--token-file"])
        .arg(h.host.path("token"))
        .args(extra)
        .args(if is_root() {
            &["--runner-user", "nobody"][..]
        } else {
            &[][..]
        })
        .output()
        .expect("check-config")
}

fn write_private(path: &Path, text: &str) {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .expect("create");
    f.write_all(text.as_bytes()).expect("write");
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// How often the agent log says `needle`.
fn count(log: &str, needle: &str) -> usize {
    log.matches(needle).count()
}

/// The agent against a hub that misbehaves `how`: it stays up, its runner keeps running
/// (the same process throughout), `agent status` shows `expect` as the hub's last error,
/// the log says it once however often it is retried, and the token leaks nowhere.
fn the_agent_rides_out(how: Misbehaviour, expect: &str, limit: Duration, attempts: usize) {
    let ca = TestCa::new();
    let hub = FakeHub::start(how, ca.server());
    let h = HubHost::new(&ca.pem());
    let agent = h.start_agent(&hub.url);
    let runner = h.host.wait_runner("a runner", |_| true);

    let st = h.wait_hub_error(expect, limit);
    assert_eq!(st["hub"]["connected"], false, "{st:#}");
    assert_eq!(st["hub"]["url"], hub.url.as_str());
    assert_eq!(st["hub"]["agent_id"], "a1");
    // Retried, with backoff, and the log said it once.
    wait_for(limit, &format!("{attempts} attempts"), || {
        (hub.connections() >= attempts).then_some(())
    });
    let log = h.host.agent_log();
    assert_eq!(count(&log, "hub reconcile failed"), 1, "{log}");
    assert!(log.contains(expect), "{log}");

    assert!(alive(agent.pid()), "the agent is up");
    let st = h.host.status();
    assert_eq!(st["runner"]["pid"], runner, "{st:#}");
    assert_eq!(st["runner"]["starts"], 1, "{st:#}");
    assert_eq!(
        get_json(&h.host.socket(), "/v1/health").expect("health")["pid"],
        runner
    );
    h.assert_token_kept_secret();
}

#[test]
fn a_hub_answering_500_leaves_the_runner_alone_and_the_error_in_status() {
    let ca = TestCa::new();
    let hub = FakeHub::start(Misbehaviour::ServerError, ca.server());
    let h = HubHost::new(&ca.pem());
    let _agent = h.start_agent(&hub.url);
    let runner = h.host.wait_runner("a runner", |_| true);
    let st = h.wait_hub_error("answered 500: the store is on fire", LIMIT);
    assert_eq!(st["hub"]["connected"], false, "{st:#}");
    wait_for(LIMIT, "three attempts", || {
        (hub.connections() >= 3).then_some(())
    });
    assert_eq!(count(&h.host.agent_log(), "hub reconcile failed"), 1);

    // What the agent sent: its report, with the token in one header.
    let requests = hub.requests();
    let first = &requests[0];
    assert!(
        first.starts_with("POST /v1/agents/a1/reconcile?wait=0 HTTP/1.1\r\n"),
        "{first}"
    );
    assert!(
        first.contains(&format!("authorization: Bearer {}\r\n", h.token)),
        "{first}"
    );
    let r = report_of(first);
    assert_eq!(r["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(r["os"], std::env::consts::OS);
    assert_eq!(r["arch"], std::env::consts::ARCH);
    assert!(!r["hostname"].as_str().expect("hostname").is_empty());
    assert_eq!(r["observed_generation"], 0);
    // Once the runner serves, the report has its pid and job counts.
    let later = wait_for(LIMIT, "a report of the running runner", || {
        hub.requests()
            .iter()
            .map(|q| report_of(q))
            .find(|r| r["runner"]["pid"] == runner && r["jobs_summary"].is_object())
    });
    assert_eq!(later["runner"]["state"], "running");
    assert_eq!(later["runner"]["starts"], 1);
    assert_eq!(later["jobs_summary"]["running"], 0);

    let text = railgrid()
        .args(["agent", "status", "--state-dir"])
        .arg(h.host.state())
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("hub:        {} as a1: not connected", hub.url))
            && text.contains("hub error:  https://")
            && text.contains("the store is on fire"),
        "{text}"
    );
    assert_eq!(h.host.status()["runner"]["pid"], runner);
    h.assert_token_kept_secret();
}

#[test]
fn a_hub_answering_garbage_is_an_error_not_a_crash() {
    the_agent_rides_out(
        Misbehaviour::Garbage,
        "the answer is not a desired state",
        LIMIT,
        3,
    );
}

#[test]
fn a_hub_answering_100_mib_is_cut_off_at_the_cap() {
    the_agent_rides_out(
        Misbehaviour::Huge,
        "the answer is larger than 1048576 bytes",
        LIMIT,
        3,
    );
}

#[test]
fn a_hub_with_a_certificate_of_another_ca_is_refused() {
    let other = TestCa::new();
    let ca = TestCa::new();
    let hub = FakeHub::start(Misbehaviour::Garbage, other.server());
    let h = HubHost::new(&ca.pem());
    let agent = h.start_agent(&hub.url);
    let runner = h.host.wait_runner("a runner", |_| true);
    let st = h.wait_hub_error("invalid peer certificate", LIMIT);
    assert_eq!(st["hub"]["connected"], false);
    wait_for(LIMIT, "three attempts", || {
        (hub.connections() >= 3).then_some(())
    });
    assert!(
        hub.requests().is_empty(),
        "no request (and no token) went to a hub the agent does not trust"
    );
    assert_eq!(count(&h.host.agent_log(), "hub reconcile failed"), 1);
    assert!(alive(agent.pid()));
    assert_eq!(h.host.status()["runner"]["pid"], runner);
    h.assert_token_kept_secret();
}

#[test]
fn a_hub_that_accepts_and_never_answers_times_out() {
    // The TCP connection is taken, the TLS handshake never comes: the connect timeout.
    the_agent_rides_out(
        Misbehaviour::Mute,
        "did not answer within 10s",
        Duration::from_secs(60),
        2,
    );
}

#[test]
fn a_hub_that_holds_a_request_past_its_wait_times_out() {
    // TLS done, the request read, no answer: the request timeout (wait + 15 s).
    the_agent_rides_out(
        Misbehaviour::Silent,
        "did not answer within 45s",
        Duration::from_secs(120),
        2,
    );
}

/// The agent against a hub that answers 200 with `body` (made from the request's
/// `Authorization` value): refused as an invalid answer, shown as `expect`, logged once,
/// nothing applied or kept, the runner untouched, and the token nowhere.
fn an_invalid_answer_is_refused(body: fn(&str) -> String, expect: &str) {
    let ca = TestCa::new();
    let hub = FakeHub::scripted(ca.server(), move |req| {
        ("200 OK", body(&authorization(req)))
    });
    let h = HubHost::new(&ca.pem());
    let agent = h.start_agent(&hub.url);
    let runner = h.host.wait_runner("a runner", |_| true);
    let st = h.wait_hub_error(expect, LIMIT);
    assert_eq!(st["hub"]["connected"], false, "{st:#}");
    wait_for(LIMIT, "three attempts", || {
        (hub.connections() >= 3).then_some(())
    });
    let log = h.host.agent_log();
    assert_eq!(count(&log, "hub reconcile failed"), 1, "{log}");
    let st = h.host.status();
    assert_eq!(st["hub"]["generation"], 0, "{st:#}");
    assert!(st["hub"]["desired_version"].is_null(), "{st:#}");
    assert_eq!(st["runner"]["pid"], runner, "{st:#}");
    assert_eq!(st["runner"]["starts"], 1, "{st:#}");
    assert!(
        !h.host.state().join("desired.json").exists(),
        "nothing kept"
    );
    // Every report still says nothing from the hub is applied.
    let last = hub
        .requests()
        .last()
        .map(|r| report_of(r))
        .expect("a request");
    assert_eq!(last["observed_generation"], 0);
    assert!(alive(agent.pid()));
    h.assert_token_kept_secret();
}

#[test]
fn a_generation_beyond_2_pow_53_is_refused_and_not_kept() {
    // Applied, it would be kept, and every real answer refused as older from then on.
    an_invalid_answer_is_refused(
        |_| r#"{"generation": 18446744073709551615, "runner": {"enabled": false}}"#.to_owned(),
        "generation 18446744073709551615 is beyond",
    );
}

#[test]
fn a_hub_echoing_the_token_as_the_generation_leaks_it_nowhere() {
    // serde's error quotes the string it could not take as a number.
    an_invalid_answer_is_refused(
        |auth| format!(r#"{{"generation": "{auth}"}}"#),
        "the answer is not a desired state",
    );
}

#[test]
fn a_hub_echoing_the_token_as_the_agent_version_is_refused() {
    // The token's characters are all allowed in a version: only redacting it first
    // keeps it out of the log, the status file and desired.json.
    an_invalid_answer_is_refused(
        |auth| {
            let token = auth.strip_prefix("Bearer ").expect("a bearer token");
            format!(r#"{{"generation": 3, "agent": {{"version": "{token}"}}}}"#)
        },
        "the agent version it asks for is not a version",
    );
}

#[test]
fn a_token_straddling_the_cut_of_a_hubs_error_leaks_no_part_of_it() {
    // The error text is cut at 300 characters: here within the token, 12 characters in.
    let ca = TestCa::new();
    let hub = FakeHub::scripted(ca.server(), |req| {
        let pad = "x".repeat(300 - 12 - "Bearer ".len());
        let body =
            serde_json::json!({"error": format!("{pad}{} is not known", authorization(req))});
        ("401 Unauthorized", body.to_string())
    });
    let h = HubHost::new(&ca.pem());
    let _agent = h.start_agent(&hub.url);
    h.host.wait_runner("a runner", |_| true);
    let st = h.wait_hub_error("the hub refused this agent's token", LIMIT);
    let err = st["hub"]["last_error"].as_str().expect("error");
    assert!(err.contains("xxxxBearer <redacted"), "{err}");
    h.assert_kept_secret(&h.token[..8]);
}

#[test]
fn an_agent_ahead_of_its_hub_takes_the_hubs_state_and_a_renumbered_hub_is_followed() {
    // The agent applied generation 100 once; the reference hub never handed it out (it
    // was restored from an older backup): the hub's own state wins, as a reset.
    let tmp = tempdir();
    let dir = tmp.path().join("hub");
    let (h, hub) = HubHost::enrolled(&dir, "a1");
    let state = h.host.state();
    fs::create_dir_all(&state).expect("state dir");
    fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).expect("chmod");
    write_private(&state.join("desired.json"), r#"{"generation": 100}"#);
    let agent = h.start_agent(&hub.url);
    let runner = h.host.wait_runner("a runner", |_| true);
    let g = hub_generation(&hub, "a1");
    assert!(g < 100, "{g}");
    h.wait_status("the hub's own generation applied", LIMIT, connected_at(g));
    let log = h.host.agent_log();
    assert!(
        log.contains("the hub refuses the generation this agent reports")
            && log.contains("reset to the hub's desired state"),
        "{log}"
    );

    // A counter at the end of its range: changes are refused, naming the way back.
    let (url, listen) = (hub.url.clone(), hub.listen.clone());
    assert!(hub.stop().status.success());
    let db = rusqlite::Connection::open(dir.join("hub.db")).expect("db");
    db.execute(
        "UPDATE meta SET value = ?1 WHERE key = 'generation'",
        [1i64 << 53],
    )
    .expect("edit");
    drop(db);
    let hub = TestHub::start_on(&dir, &listen, &[]);
    assert_eq!(hub.url, url);
    let out = hub.admin(&["desired", "set", "--fleet", "--max-jobs", "3"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("hub store renumber"), "{err}");

    // The way back: with the hub stopped, the counter starts over; the agent, whose
    // number may now name another state, is told to take the hub's.
    let refused = railgrid()
        .args(["hub", "store", "renumber", "--data-dir"])
        .arg(&dir)
        .output()
        .expect("renumber");
    assert_eq!(
        refused.status.code(),
        Some(2),
        "a serving hub holds the data dir"
    );
    assert!(hub.stop().status.success());
    let out = railgrid()
        .args(["hub", "store", "renumber", "--data-dir"])
        .arg(&dir)
        .output()
        .expect("renumber");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("was 9007199254740992 and is 1"), "{text}");
    let hub = TestHub::start_on(&dir, &listen, &[]);
    h.wait_status(
        "generation 1 applied",
        Duration::from_secs(90),
        connected_at(1),
    );
    let shown = hub.admin_json(&["desired", "set", "--fleet", "--max-jobs", "3"]);
    assert_eq!(shown["generation"], 2, "{shown}");
    // Within a long poll, not after one has timed out: the agent's reset must leave it
    // polling at once (it once paused the 30 s a hub that does not hold polls asks for).
    let changed = std::time::Instant::now();
    h.wait_status("generation 2 applied", APPLIED, connected_at(2));
    assert!(
        changed.elapsed() < Duration::from_secs(10),
        "generation 2 took {:?}",
        changed.elapsed()
    );
    wait_for(APPLIED, "max_jobs 3 at the runner", || {
        (admission(&h)?["max_jobs"] == 3).then_some(())
    });
    assert_eq!(h.host.status()["runner"]["pid"], runner);
    assert!(alive(agent.pid()));
    h.assert_token_kept_secret();
}

/// A port nothing listens on.
fn closed_port_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    format!("https://{addr}")
}

#[test]
fn an_agent_started_while_its_hub_is_down_keeps_the_last_desired_state() {
    let ca = TestCa::new();
    let h = HubHost::new(&ca.pem());
    // What the hub said last: no runner on this host.
    let state = h.host.state();
    fs::create_dir_all(&state).expect("state dir");
    fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).expect("chmod");
    write_private(
        &state.join("desired.json"),
        r#"{"generation": 5, "runner": {"enabled": false}}"#,
    );
    let url = closed_port_url();
    let agent = h.start_agent(&url);

    let st = h.wait_hub_error("Connection refused", LIMIT);
    assert_eq!(st["hub"]["connected"], false, "{st:#}");
    assert_eq!(st["hub"]["generation"], 5, "{st:#}");
    assert_eq!(st["runner_enabled"], false, "{st:#}");
    assert_eq!(st["runner"]["state"], "stopped", "{st:#}");
    assert_eq!(st["runner"]["starts"], 0, "no runner was started: {st:#}");
    assert!(st["runner"]["pid"].is_null());
    assert!(!h.host.socket().exists(), "no runner socket");
    let out = railgrid()
        .args(["agent", "status", "--state-dir"])
        .arg(&state)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("runner:     disabled by the desired state")
            && text.contains("generation 5 applied"),
        "{text}"
    );
    assert!(
        h.host
            .agent_log()
            .contains("starting from the desired state the hub gave last"),
        "{}",
        h.host.agent_log()
    );
    assert!(alive(agent.pid()));
    h.assert_token_kept_secret();
}

/// An agent whose kept desired state is `kept` starts from the standalone default (a
/// runner), saying why, while its hub is down.
fn the_kept_desired_state_is_ignored(kept: &str) {
    let ca = TestCa::new();
    let h = HubHost::new(&ca.pem());
    let state = h.host.state();
    fs::create_dir_all(&state).expect("state dir");
    fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).expect("chmod");
    write_private(&state.join("desired.json"), kept);
    let _agent = h.start_agent(&closed_port_url());
    // The standalone default: a runner.
    h.host.wait_runner("a runner", |_| true);
    let log = h.host.agent_log();
    assert!(
        log.contains("ignoring the kept desired state") && log.contains("desired.json"),
        "{log}"
    );
    assert_eq!(h.status_json()["hub"]["generation"], 0);
}

#[test]
fn a_corrupt_kept_desired_state_is_logged_and_ignored() {
    the_kept_desired_state_is_ignored("{\"generation\": 5, \"runn");
}

#[test]
fn a_kept_desired_state_beyond_2_pow_53_is_ignored() {
    // Kept by an agent that did not check the bound: it would refuse every real answer
    // as older.
    the_kept_desired_state_is_ignored(
        r#"{"generation": 9007199254740993, "runner": {"enabled": false}}"#,
    );
}

#[test]
fn an_unusable_token_file_is_a_configuration_error() {
    let ca = TestCa::new();
    let h = HubHost::new(&ca.pem());
    write_private(&h.host.path("token"), "\n");
    let mut agent = h.start_agent(&closed_port_url());
    let out = agent.wait_output(LIMIT);
    assert_eq!(out.status.code(), Some(2));
    assert!(!h.host.state().join("runner").exists(), "nothing started");
    let check = check_config(&h, &[]);
    let err = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(2), "{err}");
    assert!(err.contains("is empty"), "{err}");

    // A good token: check-config names the file, never the token.
    write_private(&h.host.path("token"), &h.token);
    let ca = h.host.path("ca.pem");
    let check = check_config(
        &h,
        &["--agent-id", "a7", "--ca-file", ca.to_str().expect("utf-8")],
    );
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{check:?}");
    assert!(
        text.contains("agent_id = \"a7\"")
            && text.contains("token = \"<redacted>\"")
            && text.contains(&path_str(&h.host.path("token"))),
        "{text}"
    );
    assert!(!text.contains(&h.token), "{text}");
}

/// The reference hub gives up to this long for a change to reach the agent and be applied
/// (a runner stop included).
const APPLIED: Duration = Duration::from_secs(30);

/// The runner's admission limits, from its API.
fn admission(h: &HubHost) -> Option<Value> {
    get_json(&h.host.socket(), "/v1/admission")
}

/// The effective generation the hub sends `id`.
fn hub_generation(hub: &TestHub, id: &str) -> u64 {
    hub.admin_json(&["desired", "show", "--agent", id])["effective"]["generation"]
        .as_u64()
        .expect("effective generation")
}

fn connected_at(generation: u64) -> impl Fn(&Value) -> bool {
    move |st: &Value| {
        st["hub"]["connected"] == true && st["hub"]["generation"].as_u64() == Some(generation)
    }
}

#[test]
fn the_hubs_desired_state_stops_and_starts_the_runner() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    let agent = h.start_agent(&hub.url);
    let first = h.host.wait_runner("a runner", |_| true);
    let g = hub_generation(&hub, "a1");
    h.wait_status(
        "connected, the hub's generation applied",
        LIMIT,
        connected_at(g),
    );

    let changed = std::time::Instant::now();
    hub.set_desired("a1", &["--runner-enabled", "false"]);
    let off = hub_generation(&hub, "a1");
    assert!(off > g);
    let st = h.wait_status("the runner stopped by the hub", APPLIED, |st| {
        st["hub"]["generation"].as_u64() == Some(off) && st["runner"]["state"] == "stopped"
    });
    println!("runner disabled by the hub in {:?}", changed.elapsed());
    assert_eq!(st["runner_enabled"], false);
    assert!(st["runner"]["pid"].is_null());
    wait_for(LIMIT, "the old runner gone", || {
        (!alive(first)).then_some(())
    });
    // Kept for a start while the hub is down.
    let kept: Value =
        serde_json::from_str(&read_lossy(&h.host.state().join("desired.json"))).expect("kept");
    assert_eq!(kept["generation"], off);
    assert_eq!(kept["runner"]["enabled"], false);
    let mode = fs::metadata(h.host.state().join("desired.json"))
        .expect("desired.json")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // The hub hears what was applied.
    let shown = wait_for(LIMIT, "the hub sees generation applied", || {
        let a = hub.admin_json(&["agent", "show", "a1"]);
        (a["observed_generation"].as_u64() == Some(off)).then_some(a)
    });
    assert_eq!(shown["report"]["runner"]["state"], "disabled", "{shown:#}");
    assert_eq!(shown["report"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(shown["report"]["os"], std::env::consts::OS);

    hub.set_desired("a1", &["--runner-enabled", "true"]);
    let on = hub_generation(&hub, "a1");
    let second = h.host.wait_runner("a runner started by the hub", |st| {
        st["hub"]["generation"].as_u64() == Some(on) && st["runner"]["starts"] == 2
    });
    assert_ne!(second, first);

    // A desired agent version, without trusted keys: shown, refused, and the runner is
    // left alone.
    hub.set_desired("a1", &["--version", "9.9.9"]);
    let v = hub_generation(&hub, "a1");
    let st = h.wait_status("the desired version", APPLIED, connected_at(v));
    assert_eq!(st["hub"]["desired_version"], "9.9.9", "{st:#}");
    assert_eq!(st["runner"]["pid"], second, "no restart for a version");
    let st = wait_for(LIMIT, "the upgrade refused", || {
        let st = h.host.status();
        (st["upgrade"]["state"] == "refused").then_some(st)
    });
    assert!(
        st["upgrade"]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("no [upgrade] trusted_keys"),
        "{st:#}"
    );
    let log = h.host.agent_log();
    assert!(log.contains("the upgrade takes it from here"), "{log}");
    assert!(
        log.contains("hub: the desired state disables the runner; it drains first")
            && log.contains("the runner has no job left: stopping it")
            && log.contains("hub: the desired state enables the runner; starting it"),
        "{log}"
    );
    assert!(alive(agent.pid()));
    h.assert_token_kept_secret();
}

#[test]
fn a_restarted_hub_keeps_the_agent_and_its_desired_state() {
    let tmp = tempdir();
    let dir = tmp.path().join("hub");
    let (h, hub) = HubHost::enrolled(&dir, "a1");
    let _agent = h.start_agent(&hub.url);
    h.host.wait_runner("a runner", |_| true);
    let off = disable_runner(&h, &hub, "a1");

    let (url, listen) = (hub.url.clone(), hub.listen.clone());
    let out = hub.stop();
    assert!(out.status.success(), "hub exit: {:?}", out.status);
    h.wait_status("the agent sees the hub gone", LIMIT, |st| {
        st["hub"]["connected"] == false
    });
    // Without its hub the agent keeps what it was told: still no runner.
    let st = h.host.status();
    assert_eq!(st["runner"]["state"], "stopped", "{st:#}");
    assert_eq!(st["runner"]["starts"], 1, "{st:#}");

    let hub = TestHub::start_on(&dir, &listen, &[]);
    assert_eq!(hub.url, url);
    // The same token still works, and the same desired state holds.
    h.wait_status(
        "connected again",
        Duration::from_secs(90),
        connected_at(off),
    );
    assert!(
        h.host.agent_log().contains("hub reachable again"),
        "{}",
        h.host.agent_log()
    );
    assert_eq!(h.host.status()["runner"]["starts"], 1);
    hub.set_desired("a1", &["--runner-enabled", "true"]);
    h.host
        .wait_runner("a runner started after the hub's restart", |st| {
            st["runner"]["starts"] == 2
        });
    h.assert_token_kept_secret();
}

#[test]
fn a_revoked_token_shows_in_status_and_the_runner_keeps_running() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    // Each retry is logged at debug level: the test sees them happen.
    let mut cmd = h.agent_command(&hub.url, "a1");
    cmd.env("RAILGRID_LOG", "info,railgrid::agent::hub=debug");
    let agent = Guard::new(cmd.spawn().expect("spawn agent"));
    let runner = h.host.wait_runner("a runner", |_| true);
    let g = hub_generation(&hub, "a1");
    h.wait_status("connected", LIMIT, connected_at(g));

    hub.admin_ok(&["agent", "revoke", "a1"]);
    let st = h.wait_hub_error(
        "the hub refused this agent's token (revoked or unknown)",
        LIMIT,
    );
    assert_eq!(st["hub"]["connected"], false);
    let err = st["hub"]["last_error"].as_str().expect("error");
    assert!(err.contains("answered 401"), "{err}");
    // Retried (each one refused) and logged once.
    let seen = hub.admin_json(&["agent", "show", "a1"]);
    assert_eq!(seen["revoked"], true);
    wait_for(LIMIT, "three tries, each refused", || {
        (count(&h.host.agent_log(), "next reconcile after the backoff") >= 3).then_some(())
    });
    let log = h.host.agent_log();
    assert_eq!(count(&log, "hub reconcile failed"), 1, "{log}");
    assert!(alive(agent.pid()));
    let now = h.host.status();
    assert_eq!(now["runner"]["pid"], runner);
    assert_eq!(now["runner"]["starts"], 1);
    assert_eq!(
        get_json(&h.host.socket(), "/v1/health").expect("health")["pid"],
        runner
    );
    h.assert_token_kept_secret();

    // Enrolled again: the new token in the same file, and SIGHUP reads it.
    let fresh = hub.enrol("a1");
    assert_eq!(fresh, h.token_file);
    let new_token = read_lossy(&fresh).trim().to_owned();
    assert_ne!(new_token, h.token);
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    h.wait_status("connected with the new token", LIMIT, |st| {
        st["hub"]["connected"] == true
    });
    assert!(h.host.agent_log().contains("hub reachable again"));
    assert_eq!(h.host.status()["runner"]["pid"], runner);
    assert!(!h.host.agent_log().contains(&new_token));
}

#[test]
fn admission_limits_from_the_hub_reach_the_running_runner_and_survive_its_restart() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    // A limit the hub leaves alone comes from the config file.
    fs::write(h.host.path("agent.toml"), "[runner]\nmax_queued = 7\n").expect("config");
    let agent = h.start_agent(&hub.url);
    let runner = h.host.wait_runner("a runner", |_| true);
    let g = hub_generation(&hub, "a1");
    h.wait_status("connected", LIMIT, connected_at(g));
    assert_eq!(admission(&h).expect("admission")["max_queued"], 7);

    hub.set_desired("a1", &["--max-jobs", "3"]);
    let three = hub_generation(&hub, "a1");
    h.wait_status("max_jobs applied", APPLIED, connected_at(three));
    let limits = admission(&h).expect("admission");
    assert_eq!(limits["max_jobs"], 3, "{limits}");
    assert_eq!(limits["max_queued"], 7, "{limits}");
    // Live: the same runner.
    let st = h.host.status();
    assert_eq!(st["runner"]["pid"], runner, "{st:#}");
    assert_eq!(st["runner"]["starts"], 1, "{st:#}");
    assert!(
        h.host
            .agent_log()
            .contains("changed; the running runner took the new admission limits"),
        "{}",
        h.host.agent_log()
    );

    // A runner restarted after a crash comes back with the hub's limit, not the old one.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9");
    h.host
        .wait_runner("the restarted runner", |st| st["runner"]["starts"] == 2);
    let limits = wait_for(LIMIT, "the restarted runner's limits", || admission(&h));
    assert_eq!(limits["max_jobs"], 3, "{limits}");
    assert_eq!(limits["max_queued"], 7, "{limits}");

    // SIGHUP with a hub: the hub's desired state stays, the file's new value joins it.
    fs::write(h.host.path("agent.toml"), "[runner]\nmax_queued = 9\n").expect("config");
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    let limits = wait_for(LIMIT, "the reloaded max_queued", || {
        admission(&h).filter(|l| l["max_queued"] == 9)
    });
    assert_eq!(limits["max_jobs"], 3, "{limits}");
    assert_eq!(h.host.status()["runner"]["starts"], 2);

    // The hub stops setting the limit: the running runner goes back to its default in
    // place (a restart would end its jobs).
    let runner = h.host.status()["runner"]["pid"].clone();
    hub.set_desired("a1", &["--clear", "max_jobs"]);
    let cleared = hub_generation(&hub, "a1");
    h.wait_status("the cleared limit applied", APPLIED, connected_at(cleared));
    let limits = admission(&h).expect("admission");
    assert_ne!(limits["max_jobs"], 3, "{limits}");
    let st = h.host.status();
    assert_eq!(st["runner"]["pid"], runner, "{st:#}");
    assert_eq!(st["runner"]["starts"], 2, "{st:#}");
    assert!(!h.host.agent_log().contains("restarting the runner"));
    h.assert_token_kept_secret();
}

#[test]
fn sighup_with_a_hub_keeps_the_hubs_desired_state() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    fs::write(h.host.path("agent.toml"), "[runner]\nstop_grace = \"3s\"\n").expect("config");
    let agent = h.start_agent(&hub.url);
    h.host.wait_runner("a runner", |_| true);
    let off = disable_runner(&h, &hub, "a1");

    // A new local setting: applied with the hub's desired state, which keeps the runner
    // off (a standalone reload would have started one).
    fs::write(h.host.path("agent.toml"), "[runner]\nstop_grace = \"4s\"\n").expect("config");
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for(LIMIT, "the reload", || {
        h.host
            .agent_log()
            .contains("SIGHUP: runner settings unchanged")
            .then_some(())
    });
    let st = h.host.status();
    assert_eq!(st["runner"]["state"], "stopped", "{st:#}");
    assert_eq!(st["runner_enabled"], false, "{st:#}");
    assert_eq!(st["hub"]["generation"], off);

    // Enabled again, the runner comes with the reloaded settings.
    hub.set_desired("a1", &["--runner-enabled", "true"]);
    h.host.wait_runner("a runner started by the hub", |st| {
        st["runner"]["starts"] == 2
    });
    // Another local change while it runs: a restart, saying why.
    fs::write(h.host.path("agent.toml"), "[runner]\nstop_grace = \"5s\"\n").expect("config");
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    h.host
        .wait_runner("a runner with the new stop grace", |st| {
            st["runner"]["starts"] == 3
        });
    assert!(
        h.host
            .agent_log()
            .contains("SIGHUP: restarting the runner: stop_grace changed"),
        "{}",
        h.host.agent_log()
    );
}

#[test]
fn admission_limits_set_before_the_agent_starts_need_no_runner_restart() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    hub.set_desired("a1", &["--max-jobs", "13"]);
    let g = hub_generation(&hub, "a1");
    // The runner starts from the standalone default; the hub's first answer comes while
    // it may not serve yet, and its limit is still taken live.
    let _agent = h.start_agent(&hub.url);
    let st = h.wait_status("the hub's limit applied", APPLIED, connected_at(g));
    let first = st["runner"]["pid"].clone();
    let limits = wait_for(LIMIT, "the runner's limits", || admission(&h));
    assert_eq!(limits["max_jobs"], 13, "{limits}");
    let st = h.host.status();
    assert_eq!(st["runner"]["starts"], 1, "{st:#}");
    assert_eq!(st["runner"]["pid"], first, "{st:#}");
    let log = h.host.agent_log();
    assert!(!log.contains("restarting the runner"), "{log}");
    assert!(
        log.contains("max_jobs, max_jobs_per_owner changed; the running runner took the new admission limits"),
        "{log}"
    );
}

#[test]
fn an_agent_started_while_its_hub_is_down_says_connected_when_it_first_answers() {
    let tmp = tempdir();
    let dir = tmp.path().join("hub");
    let (h, hub) = HubHost::enrolled(&dir, "a1");
    let (url, listen) = (hub.url.clone(), hub.listen.clone());
    assert!(hub.stop().status.success());
    let _agent = h.start_agent(&url);
    h.wait_hub_error("Connection refused", LIMIT);

    let hub = TestHub::start_on(&dir, &listen, &[]);
    let g = hub_generation(&hub, "a1");
    h.wait_status("connected", Duration::from_secs(90), connected_at(g));
    let log = h.host.agent_log();
    assert!(log.contains("connected to the hub"), "{log}");
    assert!(!log.contains("hub reachable again"), "{log}");
}

/// Disables agent `id`'s runner at the hub, waits until the agent has stopped it, and
/// returns the generation that did it.
fn disable_runner(h: &HubHost, hub: &TestHub, id: &str) -> u64 {
    hub.set_desired(id, &["--runner-enabled", "false"]);
    let off = hub_generation(hub, id);
    h.wait_status("the runner stopped by the hub", APPLIED, |st| {
        connected_at(off)(st) && st["runner"]["state"] == "stopped"
    });
    off
}

#[test]
fn the_hosts_labels_and_the_hubs_reach_agent_list_and_a_sighup_changes_the_hosts() {
    let tmp = tempdir();
    let (h, hub) = HubHost::enrolled(&tmp.path().join("hub"), "a1");
    let config = h.host.path("agent.toml");
    fs::write(
        &config,
        "[agent]\nlabels = { queue = \"build\", tier = \"dev\" }\n",
    )
    .expect("config");
    let agent = h.start_agent(&hub.url);
    let labels_at_hub = |what: &str, accept: &dyn Fn(&Value) -> bool| {
        wait_for(LIMIT, what, || {
            let a = hub.admin_json(&["agent", "show", "a1"]);
            accept(&a["labels"]).then_some(a)
        })
    };
    let shown = labels_at_hub("the host's labels at the hub", &|l| l["queue"] == "build");
    assert_eq!(shown["labels"]["tier"], "dev", "{shown:#}");
    assert_eq!(
        shown["labels"]["os"],
        std::env::consts::OS,
        "added by the agent"
    );
    assert_eq!(shown["labels"]["arch"], std::env::consts::ARCH);
    assert!(shown["labels"]["hostname"].is_string(), "{shown:#}");

    // The hub's label wins over the host's, and both show in the list.
    let set: Value = serde_json::from_str(&hub.admin_ok(&[
        "agent",
        "label",
        "a1",
        "tier=prod",
        "zone=b",
        "--json",
    ]))
    .expect("json");
    assert_eq!(set["labels"]["tier"], "prod", "{set:#}");
    assert_eq!(
        set["hub_labels"],
        serde_json::json!({"tier": "prod", "zone": "b"})
    );
    let table = hub.admin_ok(&["agent", "list"]);
    assert!(table.contains("queue=build,tier=prod,zone=b"), "{table}");
    let detail = hub.admin_ok(&["agent", "show", "a1"]);
    assert!(detail.contains("by hub:    tier=prod,zone=b"), "{detail}");
    // The report that follows (the change answered the held poll) says how many jobs
    // the runner runs at once.
    h.host.wait_runner("a runner", |_| true);
    hub.admin_ok(&["agent", "label", "a1", "zone=c"]);
    wait_for(LIMIT, "the runner's admission limit in the report", || {
        let a = hub.admin_json(&["agent", "show", "a1"]);
        (a["report"]["jobs_summary"]["max_jobs"].as_u64() >= Some(1)).then_some(())
    });

    // A SIGHUP sends the host's new labels; the hub's stay over them.
    fs::write(
        &config,
        "[agent]\nlabels = { queue = \"test\", tier = \"dev\" }\n",
    )
    .expect("config");
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    let shown = labels_at_hub("the new host labels", &|l| l["queue"] == "test");
    assert_eq!(shown["labels"]["tier"], "prod", "{shown:#}");
    // Removing the hub's label shows the host's again.
    hub.admin_ok(&["agent", "label", "a1", "--remove", "tier"]);
    labels_at_hub("the host's tier again", &|l| l["tier"] == "dev");

    // Bad input is refused, naming it, and changes nothing.
    for (args, code, says) in [
        (vec!["agent", "label", "a1", "Tier=x"], 2, "\"Tier\""),
        (vec!["agent", "label", "a1", "tier"], 2, "KEY=VALUE"),
        (vec!["agent", "label", "a1"], 2, "--remove"),
        (vec!["agent", "label", "nobody", "x=1"], 1, "unknown agent"),
    ] {
        let out = hub.admin(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let kept = hub.admin_json(&["agent", "show", "a1"]);
    assert_eq!(
        kept["hub_labels"],
        serde_json::json!({"zone": "c"}),
        "{kept:#}"
    );
}
