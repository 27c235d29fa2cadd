//! A TLS server on loopback for `bench/egress.sh`: `GET /bytes/N` answers N bytes, fast
//! enough that the proxy, not the server, is what a job's download measures. Its CA's
//! certificate goes to the file given; its port is printed on stdout.
//!
//!   tls_serve CA_FILE

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let ca_file = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: tls_serve CA_FILE"))?;
    let mut ca = rcgen::CertificateParams::new(Vec::new())?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "railgrid bench CA");
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = rcgen::KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;
    std::fs::write(&ca_file, ca_cert.pem())?;
    let mut leaf =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
    leaf.distinguished_name
        .push(rcgen::DnType::CommonName, "railgrid bench server");
    let key = rcgen::KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key)?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?.port());
    let chunk: Arc<[u8]> = vec![0x5a; 256 * 1024].into();
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let (acceptor, chunk) = (acceptor.clone(), chunk.clone());
        tokio::spawn(async move {
            let Ok(mut tls) = acceptor.accept(tcp).await else {
                return;
            };
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                match tls.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let text = String::from_utf8_lossy(&head);
            let mut left: u64 = text
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.strip_prefix("/bytes/"))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let answer =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {left}\r\nConnection: close\r\n\r\n");
            if tls.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                if tls.write_all(&chunk[..n]).await.is_err() {
                    return;
                }
                left -= n as u64;
            }
            let _ = tls.shutdown().await;
        });
    }
}
