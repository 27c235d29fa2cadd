//! The hub's listener: TLS over TCP, HTTP/1.1, with the bounds a public endpoint needs.
//!
//! - Connections are capped: past `max_connections`, a connection gets its TLS handshake
//!   and one `503` with `Retry-After`, then is closed (a few hundred such answers at a
//!   time; past that, it is closed at once).
//! - The TLS handshake and each request's headers must arrive within
//!   [`HANDSHAKE_TIMEOUT`] and [`HEADER_TIMEOUT`]: a client that opens connections and
//!   sends nothing holds them that long, not forever.
//! - Bodies are capped by the API ([`super::api::MAX_BODY_BYTES`]).
//!
//! A held long poll is one connection task parked on its agent's watch channel.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections past the cap that are answered 503 at once, at most.
const OVERFLOW_ANSWERS: usize = 256;
/// What a client over the cap is told to wait.
const RETRY_AFTER_SECS: u64 = 5;

/// Accepts connections on `listener` until `stop` resolves, and returns what it said.
pub(crate) async fn accept_loop<W>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    max_connections: usize,
    stop: impl std::future::Future<Output = W>,
) -> W {
    let acceptor = TlsAcceptor::from(tls);
    let permits = Arc::new(Semaphore::new(max_connections));
    let overflow = Arc::new(Semaphore::new(OVERFLOW_ANSWERS));
    let mut failing = false;
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            // Cancel-safe: TcpListener::accept loses no connection when another arm wins.
            r = listener.accept() => r,
            why = &mut stop => return why,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => {
                failing = false;
                tcp
            }
            Err(e) => {
                // Out of descriptors, most likely: the connections already open are being
                // served; try again shortly instead of spinning.
                if !failing {
                    tracing::error!(error = %e, "could not accept a connection");
                    failing = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    serve_one(tcp, acceptor, app).await;
                    drop(permit);
                });
            }
            Err(_) => match overflow.clone().try_acquire_owned() {
                Ok(permit) => {
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        refuse(tcp, acceptor).await;
                        drop(permit);
                    });
                }
                Err(_) => drop(tcp),
            },
        }
    }
}

async fn serve_one(tcp: TcpStream, acceptor: TlsAcceptor, app: Router) {
    let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await else {
        return;
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app));
    let _ = conn.await;
}

/// One connection over the cap: a 503 that says when to come back, then closed.
async fn refuse(tcp: TcpStream, acceptor: TlsAcceptor) {
    let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await else {
        return;
    };
    let svc = hyper::service::service_fn(|_req: hyper::Request<Incoming>| async {
        let body = serde_json::json!({
            "error": "the hub is at its connection limit; retry later"
        })
        .to_string();
        hyper::Response::builder()
            .status(hyper::StatusCode::SERVICE_UNAVAILABLE)
            .header(hyper::header::RETRY_AFTER, RETRY_AFTER_SECS.to_string())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::CONNECTION, "close")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(tls), svc);
    let _ = tokio::time::timeout(HEADER_TIMEOUT * 2, conn).await;
}
