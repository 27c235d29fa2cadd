//! `railgrid agent run` with a hub: against hubs that misbehave (written here, over real
//! TLS with a test CA), with no hub at all, and against the reference hub.

mod desired;
mod hostile;
mod kept;

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
