//! The hub's listener: TLS over TCP, HTTP/1.1, with the bounds a public endpoint needs.
//!
//! - Connections are capped: past `max_connections`, a connection gets its TLS handshake
//!   and one `503` with `Retry-After`, then is closed (a few hundred such answers at a
//!   time; past that, it is closed at once).
//! - The TLS handshake and each request's headers must arrive within
//!   [`HANDSHAKE_TIMEOUT`] and [`HEADER_TIMEOUT`]: a client that opens connections and
//!   sends nothing holds them that long, not forever.
//! - Bodies are capped by the API (`http::MAX_BODY_BYTES`).
//! - A connection's read buffer holds at most [`MAX_BUF_BYTES`]: a request line and
//!   headers longer than that get 431, and nobody can make the hub keep hyper's default
//!   buffer (about 400 KiB) per connection.
//! - Connections that have not shown a valid token yet (agent or admin) are **unproven**:
//!   at most [`MAX_UNPROVEN`] of them get a TLS handshake and buffers at once
//!   ([`super::unproven`]). A connection that comes when all places are taken closes the
//!   oldest unproven one and takes its place, before its own handshake. So what all
//!   clients without a token hold together is bounded (about [`MAX_UNPROVEN`] × 50 KiB),
//!   and an honest client still gets in. A request whose token a route accepts calls
//!   [`super::unproven::proven`], which frees its connection's place for good.
//! - Once a burst of connections has closed (at least [`TRIM_AFTER`] fewer than the most
//!   open since the last look, every [`TRIM_EVERY`]) and no flood is under way (few
//!   unproven places taken), the heap's free pages go back to the kernel: a flood that has
//!   passed leaves the hub at its usual size, not at its peak. Never during one: a trim
//!   holds the allocator's locks while it walks the heap, and every thread waits.
//!
//! What a connection then carries is [`Connections`]'s to serve (the HTTP layer,
//! `hub::http::conn`). A held long poll is one connection task parked on its agent's
//! watch channel.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::unproven::{Place, Places};

/// What serves a connection once its TLS handshake is done, until it ends.
pub(crate) trait Connections: Send + Sync + 'static {
    /// `place`: the connection's place among the unproven ones, to give up once a
    /// request shows a valid token.
    fn serve(
        &self,
        tls: TlsStream<TcpStream>,
        peer: Option<Peer>,
        place: Arc<Place>,
    ) -> BoxFuture<'static, ()>;
}

pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection's read buffer, at most (hyper's least is 8 KiB): an agent's or an
/// admin's request line and headers take under 2 KiB.
pub(crate) const MAX_BUF_BYTES: usize = 16 * 1024;
/// Connections without a proven token served at once (see the module's doc), or half of
/// `--max-connections` when that is less.
pub(crate) const MAX_UNPROVEN: usize = 2048;
/// How often the number of open connections is looked at, for a trim of the heap.
const TRIM_EVERY: Duration = Duration::from_secs(5);
/// How many connections must have closed since the most open, for a trim.
const TRIM_AFTER: usize = 512;

/// Connections past the cap that are answered 503 at once, at most.
const OVERFLOW_ANSWERS: usize = 256;
/// What a client over the cap is told to wait.
const RETRY_AFTER_SECS: u64 = 5;

/// Accepts connections on `listener` until `stop` resolves, and returns what it said.
pub(crate) async fn accept_loop<W>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    conns: Arc<dyn Connections>,
    max_connections: usize,
    stop: impl std::future::Future<Output = W>,
) -> W {
    let acceptor = TlsAcceptor::from(tls);
    let permits = Arc::new(Semaphore::new(max_connections));
    // Half the connections at most: a flood of them must leave room for proven ones, and
    // must fill the places (so that newcomers evict) before it fills the connections.
    let unproven_max = MAX_UNPROVEN.min((max_connections / 2).max(1));
    let places = Places::new(unproven_max);
    let overflow = Arc::new(Semaphore::new(OVERFLOW_ANSWERS));
    let mut failing = false;
    let mut look = tokio::time::interval(TRIM_EVERY);
    let mut most_open = 0;
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            // Cancel-safe: TcpListener::accept loses no connection when another arm wins.
            r = listener.accept() => r,
            why = &mut stop => return why,
            // Cancel-safe: a missed tick is simply taken at the next poll.
            _ = look.tick() => {
                let open = max_connections - permits.available_permits();
                most_open = most_open.max(open);
                if most_open - open >= TRIM_AFTER && places.in_use() < unproven_max / 8 {
                    most_open = open;
                    tokio::task::spawn_blocking(crate::sys::memory::trim_heap);
                }
                continue;
            }
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
                let (acceptor, conns, places) = (acceptor.clone(), conns.clone(), places.clone());
                tokio::spawn(async move {
                    serve_one(tcp, acceptor, conns, places).await;
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

/// The address a request came from, in its extensions (for the audit log).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub std::net::SocketAddr);

async fn serve_one(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    conns: Arc<dyn Connections>,
    places: Arc<Places>,
) {
    let peer = tcp.peer_addr().ok().map(Peer);
    // The place first, then the handshake, both within the handshake's time.
    let handshake = async {
        let place = places.take().await?;
        let tls = tokio::select! {
            tls = acceptor.accept(tcp) => tls.ok()?,
            // Cancel-safe: an abandoned handshake just closes the connection.
            () = place.evicted() => return None,
        };
        Some((place, tls))
    };
    // Boxed: the handshake's state (a TLS session in the making) is needed only until
    // it is done, not for the connection's life.
    let Ok(Some((place, tls))) = Box::pin(tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)).await
    else {
        return;
    };
    let served = conns.serve(tls, peer, place.clone());
    tokio::select! {
        () = served => {}
        // Cancel-safe: dropping the connection closes it, which is the point.
        () = place.evicted() => {}
    }
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
        .max_buf_size(MAX_BUF_BYTES)
        .keep_alive(false)
        .serve_connection(TokioIo::new(tls), svc);
    let _ = tokio::time::timeout(HEADER_TIMEOUT * 2, conn).await;
}
