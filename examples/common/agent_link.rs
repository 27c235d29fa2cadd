//! One simulated agent's link to a hub, as lean as a client can be and still speak the
//! protocol: a TLS connection of its own (as each host has) with hyper's HTTP/1.1 client
//! on it, driven in the agent's own task. reqwest's pool, URL parsing and per-request
//! machinery cost the simulated agents more CPU than the hub spends answering them, on the
//! same two cores (docs/benchmarks.md, "The hub beside etcd").

// Each benchmark that includes this file uses a part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
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

/// The connection's own future, which moves its bytes while it is polled.
type Driven = http1::Connection<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>, Full<Bytes>>;

/// One connection; [`Link::post`] sends a request on it and drives it until the answer.
pub(crate) struct Link {
    send: http1::SendRequest<Full<Bytes>>,
    conn: std::pin::Pin<Box<Driven>>,
    host: hyper::header::HeaderValue,
}

impl Link {
    pub(crate) async fn connect(t: &Target) -> anyhow::Result<Self> {
        let tcp = TcpStream::connect(&t.addr).await?;
        tcp.set_nodelay(true)?;
        let tls = t.tls.connect(t.name.clone(), tcp).await?;
        let (send, conn) = http1::handshake(TokioIo::new(tls)).await?;
        Ok(Self {
            send,
            conn: Box::pin(conn),
            host: t.host.clone(),
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
        use hyper::header;
        let req = hyper::Request::post(path)
            .header(header::HOST, self.host.clone())
            .header(header::AUTHORIZATION, auth.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let send = &mut self.send;
        let exchange = async move {
            let resp = send.send_request(req).await?;
            anyhow::ensure!(resp.status().is_success(), "{path}: {}", resp.status());
            Ok(resp.into_body().collect().await?.to_bytes())
        };
        let conn = &mut self.conn;
        let driven = async {
            tokio::select! {
                r = exchange => r,
                // The connection is driven here, in the agent's task; it ends only when
                // the hub closes it.
                c = conn => Err(anyhow!("the hub closed the connection: {c:?}")),
            }
        };
        tokio::time::timeout(limit, driven)
            .await
            .map_err(|_| anyhow!("{path}: no answer within {limit:?}"))?
    }
}
