//! A reference hub for tests: `railgrid hub serve` over real TLS on 127.0.0.1 with its
//! own CA, in a temporary data dir, and the admin commands and HTTPS calls made against
//! it (with curl, as an operator would).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use super::support::{railgrid, read_lossy, wait_for, Guard};

pub struct TestHub {
    pub dir: PathBuf,
    pub guard: Guard,
    pub url: String,
    pub listen: String,
    log: PathBuf,
}

impl TestHub {
    /// Starts a hub on a free port, self-signed, and waits until it serves.
    pub fn start(dir: &Path, extra: &[&str]) -> TestHub {
        Self::start_on(dir, "127.0.0.1:0", extra)
    }

    /// Starts a hub on `listen` (a restart reuses the first one's address).
    pub fn start_on(dir: &Path, listen: &str, extra: &[&str]) -> TestHub {
        std::fs::create_dir_all(dir).expect("hub dir");
        let log = dir.with_extension("log");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("hub log");
        let child = railgrid()
            .args(["hub", "serve", "--data-dir"])
            .arg(dir)
            .args(["--listen", listen, "--tls-self-signed"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn hub serve");
        let pid = child.id();
        let guard = Guard::new(child);
        let info: serde_json::Value = wait_for(Duration::from_secs(20), "hub.json", || {
            let v: serde_json::Value =
                serde_json::from_str(&read_lossy(&dir.join("hub.json"))).ok()?;
            (v["pid"].as_u64() == Some(u64::from(pid))).then_some(v)
        });
        TestHub {
            dir: dir.to_owned(),
            guard,
            url: info["url"].as_str().expect("url").to_owned(),
            listen: info["listen"].as_str().expect("listen").to_owned(),
            log,
        }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    pub fn log(&self) -> String {
        read_lossy(&self.log)
    }

    /// `railgrid hub --data-dir DIR ARGS…`.
    pub fn admin(&self, args: &[&str]) -> Output {
        self.admin_cmd(args)
            .output()
            .expect("run hub admin command")
    }

    /// The command of [`admin`](Self::admin), to spawn.
    pub fn admin_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = railgrid();
        cmd.arg("hub").arg("--data-dir").arg(&self.dir).args(args);
        cmd
    }

    /// An admin command that must succeed; its stdout.
    pub fn admin_ok(&self, args: &[&str]) -> String {
        let out = self.admin(args);
        assert!(
            out.status.success(),
            "railgrid hub {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `hub desired set --agent AGENT ARGS…`, which must succeed.
    pub fn set_desired(&self, agent: &str, args: &[&str]) -> String {
        let mut all = vec!["desired", "set", "--agent", agent];
        all.extend_from_slice(args);
        self.admin_ok(&all)
    }

    pub fn admin_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.push("--json");
        serde_json::from_str(&self.admin_ok(&all)).expect("admin --json output")
    }

    /// Enrols `id` and writes its token to `<dir>/../<id>.token`; returns that path.
    pub fn enrol(&self, id: &str) -> PathBuf {
        let path = self.dir.with_file_name(format!("{id}.token"));
        let _ = std::fs::remove_file(&path);
        let p = path.to_str().expect("utf-8").to_owned();
        self.admin_ok(&["agent", "add", id, "--token-out", &p]);
        path
    }

    /// curl against the hub: (status, body). `token` is sent as the bearer.
    pub fn curl(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, String) {
        curl(&self.url, &self.ca(), method, path, token, body)
    }

    /// A reconcile of agent `id` reporting `generation`, answered at once.
    pub fn reconcile(&self, id: &str, token: &str, generation: u64) -> (u16, String) {
        let path = format!("/v1/agents/{id}/reconcile");
        self.curl("POST", &path, Some(token), Some(&report(generation)))
    }

    pub fn admin_token(&self) -> String {
        read_lossy(&self.dir.join("admin.token")).trim().to_owned()
    }

    /// Stops the hub (SIGTERM) and waits for its exit.
    pub fn stop(mut self) -> Output {
        self.guard.signal(nix::sys::signal::Signal::SIGTERM);
        self.guard.wait_output(Duration::from_secs(20))
    }
}

/// curl with the hub's CA pinned: (status, body).
pub fn curl(
    url: &str,
    ca: &Path,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "60", "-X", method, "--cacert"])
        .arg(ca)
        .args(["-w", "\n%{http_code}"]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    if body.is_some() {
        cmd.args([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            "@-",
        ]);
    }
    cmd.arg(format!("{url}{path}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .expect("curl (install curl to run the hub tests)");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        if let Some(b) = body {
            // The hub may refuse a large body before reading it all.
            let _ = stdin.write_all(b.as_bytes());
        }
    }
    let out = child.wait_with_output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// The smallest valid report at `generation`.
pub fn report(generation: u64) -> String {
    format!(
        r#"{{"version":"0.0.0-test","os":"linux","arch":"x86_64","hostname":"test","observed_generation":{generation}}}"#
    )
}

/// A TLS client that trusts `hub`'s CA alone.
pub fn tls_connector(hub: &TestHub) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(hub.ca()).expect("ca.pem");
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
        roots.add(cert.expect("cert")).expect("root");
    }
    let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
}

/// Sends `request` (raw HTTP/1.1 bytes) over TLS to the hub and returns what it answered
/// before closing, or within `limit`.
pub fn raw_tls(hub: &TestHub, request: &[u8], limit: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let connector = tls_connector(hub);
        let tcp = tokio::net::TcpStream::connect(&hub.listen)
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let mut tls = connector.connect(name, tcp).await.expect("tls");
        tls.write_all(request).await.expect("write");
        let mut out = Vec::new();
        let _ = tokio::time::timeout(limit, tls.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    })
}
