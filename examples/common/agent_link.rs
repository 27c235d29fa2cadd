//! One simulated agent's link to a hub, as lean as a client can be and still speak the
//! protocol: a TLS connection of its own (as each host has), HTTP/1.1 requests one after
//! another on it, in the agent's own task. reqwest's pool, URL parsing and per-request
//! machinery cost the simulated agents more CPU than the hub spends answering them, on the
//! same two cores (docs/benchmarks.md, "The hub beside etcd").

// Each benchmark that includes this file uses a part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Where and how to reach one hub.
#[derive(Clone)]
pub(crate) struct Target {
    addr: String,
    host: hyper::header::HeaderValue,
    name: rustls::pki_types::ServerName<'static>,
    tls: TlsConnector,
}

impl Target {
    /// The hub at `url` (`https://ADDR`), whose certificate `ca_pem` signed.
    pub(crate) fn new(url: &str, ca_pem: &[u8]) -> anyhow::Result<Self> {
        let addr = url
            .strip_prefix("https://")
            .context("an https:// URL")?
            .trim_end_matches('/')
            .to_owned();
        let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
        Ok(Self {
            host: addr.parse()?,
            name: rustls::pki_types::ServerName::try_from(host.to_owned())?,
            addr,
            tls: connector(ca_pem)?,
        })
    }
}

/// A TLS client that trusts the hub's CA (`ca.pem` in its data dir) alone.
pub(crate) fn connector(ca_pem: &[u8]) -> anyhow::Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem) {
        roots.add(cert?)?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(cfg)))
}

/// One connection; [`Link::post`] sends a request on it and reads its answer. The
/// request is written by hand and only what an agent needs of the answer is read (its
/// status, its length, its body), as a load generator does: on the hub's two cores, the
/// simulated agents' own HTTP machinery would otherwise be timed as the hub's.
pub(crate) struct Link {
    tls: tokio_rustls::client::TlsStream<TcpStream>,
    host: String,
    /// The request being written, then the answer being read; kept between requests.
    buf: Vec<u8>,
}

impl Link {
    pub(crate) async fn connect(t: &Target) -> anyhow::Result<Self> {
        let tcp = TcpStream::connect(&t.addr).await?;
        tcp.set_nodelay(true)?;
        let tls = t.tls.connect(t.name.clone(), tcp).await?;
        Ok(Self {
            tls,
            host: t.host.to_str()?.to_owned(),
            buf: Vec::with_capacity(1024),
        })
    }

    /// `POST path` with a JSON `body` and `auth`: the answer's body, within `limit`.
    pub(crate) async fn post(
        &mut self,
        path: &str,
        auth: &hyper::header::HeaderValue,
        body: Vec<u8>,
        limit: Duration,
    ) -> anyhow::Result<Bytes> {
        use std::io::Write as _;
        self.buf.clear();
        write!(
            self.buf,
            "POST {path} HTTP/1.1\r\nhost: {}\r\nauthorization: ",
            self.host
        )?;
        self.buf.extend_from_slice(auth.as_bytes());
        write!(
            self.buf,
            "\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )?;
        self.buf.extend_from_slice(&body);
        tokio::time::timeout(limit, self.exchange())
            .await
            .map_err(|_| anyhow!("{path}: no answer within {limit:?}"))?
            .with_context(|| format!("POST {path}"))
    }

    async fn exchange(&mut self) -> anyhow::Result<Bytes> {
        self.tls.write_all(&self.buf).await?;
        self.tls.flush().await?;
        self.buf.clear();
        let (head, len) = loop {
            if self.tls.read_buf(&mut self.buf).await? == 0 {
                anyhow::bail!("the hub closed the connection");
            }
            let mut headers = [httparse::EMPTY_HEADER; 16];
            let mut resp = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(head) = resp.parse(&self.buf)? {
                let code = resp.code.context("a status")?;
                anyhow::ensure!((200..300).contains(&code), "status {code}");
                let len = resp
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .context("an answer with a content-length")?;
                break (head, std::str::from_utf8(len.value)?.parse::<usize>()?);
            }
        };
        while self.buf.len() < head + len {
            self.buf.reserve(head + len - self.buf.len());
            if self.tls.read_buf(&mut self.buf).await? == 0 {
                anyhow::bail!("the hub closed the connection mid-answer");
            }
        }
        anyhow::ensure!(self.buf.len() == head + len, "bytes past the answer");
        Ok(Bytes::copy_from_slice(&self.buf[head..]))
    }
}
