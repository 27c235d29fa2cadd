//! One TLS connection, request after request. An agent's reconcile is served here, and
//! while its poll is held the connection keeps nothing of the request: no read buffer, no
//! hyper state, only the TLS session and the small future that waits on the agent's
//! channel. Every other request is lent to hyper, one at a time ([`passage`]), so hyper's
//! buffers live for that request only; a request whose end this reader cannot tell
//! (chunked, HTTP/1.0, malformed) gives hyper the rest of the connection.
//! docs/benchmarks.md, "Memory per held poll", says what a held poll costs.

mod head;
mod passage;
mod reply;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::header;
use axum::response::IntoResponse;
use axum::Router;
use bytes::BufMut as _;
use futures_util::future::BoxFuture;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use self::head::Head;
use self::passage::{Passage, Signals};
use super::agents::{self, Admitted};
use super::error::{ApiError, ApiResult};
use super::extract;
use super::state::Hub;
use crate::serve::{Connections, Peer, HEADER_TIMEOUT, MAX_BUF_BYTES};
use crate::store::Store;
use crate::unproven::{Place, PLACE};

/// The hub's connections, served with its state and its router.
pub(crate) struct Conns<S: Store> {
    hub: Arc<Hub<S>>,
    app: Router,
}

impl<S: Store> Conns<S> {
    pub(crate) fn new(hub: Arc<Hub<S>>) -> Arc<Self> {
        Arc::new(Self {
            app: super::router(hub.clone()),
            hub,
        })
    }
}

impl<S: Store> Connections for Conns<S> {
    fn serve(
        &self,
        tls: TlsStream<TcpStream>,
        peer: Option<Peer>,
        place: Arc<Place>,
    ) -> BoxFuture<'static, ()> {
        let mut conn = Conn {
            hub: self.hub.clone(),
            app: self.app.clone(),
            io: tls,
            read: Vec::new(),
            peer,
            place,
        };
        // Served in place: a future that took the connection by value would keep two
        // copies of it (its TLS session is over a kilobyte) for as long as it is held.
        Box::pin(async move { conn.run().await })
    }
}

/// A connection's state between requests.
struct Conn<S: Store, T> {
    hub: Arc<Hub<S>>,
    app: Router,
    io: T,
    /// Bytes read and not served yet (a request's head, perhaps its body or the next
    /// request); freed while a poll is held.
    read: Vec<u8>,
    peer: Option<Peer>,
    place: Arc<Place>,
}

/// How a request is served.
enum Serve {
    /// Here: an agent's reconcile, its token known good.
    Reconcile {
        admitted: Admitted,
        len: usize,
        body: u64,
        wait: u64,
        close: bool,
    },
    /// By hyper, alone: `whole` bytes of head and body.
    Lend { whole: u64, close: bool },
    /// By hyper, with the rest of the connection.
    Rest,
}

impl<S: Store, T: AsyncRead + AsyncWrite + Unpin + Send> Conn<S, T> {
    async fn run(&mut self) {
        loop {
            // The next request's head, within the time hyper would give it (an idle
            // connection too: a client that keeps one open opens another). Each head is
            // parsed once it is in, and once only then.
            let deadline = tokio::time::Instant::now() + HEADER_TIMEOUT;
            let next = loop {
                match head::parse(&self.read) {
                    // A head longer than hyper would hold is its to refuse.
                    Head::Partial if self.read.len() < MAX_BUF_BYTES => {}
                    Head::Partial | Head::Hyper => break Serve::Rest,
                    Head::Other { len, body, close } => {
                        break Serve::Lend {
                            whole: (len as u64).saturating_add(body),
                            close,
                        }
                    }
                    // A token that is not the agent's goes to the router, which refuses
                    // it in its own words (and reads no byte of the body).
                    Head::Reconcile(r) => {
                        break match agents::admit(&self.hub, r.id, r.token) {
                            Ok(admitted) => Serve::Reconcile {
                                admitted,
                                len: r.len,
                                body: r.body,
                                wait: r.wait,
                                close: r.close,
                            },
                            Err(_) => Serve::Lend {
                                whole: (r.len as u64).saturating_add(r.body),
                                close: r.close,
                            },
                        }
                    }
                }
                match tokio::time::timeout_at(deadline, self.read_more()).await {
                    Ok(true) => {}
                    Ok(false) | Err(_) => return,
                }
            };
            let go_on = match next {
                Serve::Reconcile {
                    admitted,
                    len,
                    body,
                    wait,
                    close,
                } => {
                    self.place.proven();
                    self.read.drain(..len);
                    self.reconcile(admitted, body, wait, close).await && !close
                }
                // Boxed: hyper's connection state is large, and is needed only meanwhile.
                Serve::Lend { whole, close } => {
                    let go_on = Box::pin(self.lend(whole)).await && !close;
                    if !go_on {
                        // hyper's shutdown left the connection open: it ends here, told.
                        let _ = tokio::time::timeout(HEADER_TIMEOUT, self.io.shutdown()).await;
                    }
                    go_on
                }
                Serve::Rest => {
                    Box::pin(self.rest()).await;
                    false
                }
            };
            if !go_on {
                return;
            }
        }
    }

    /// Reads more of a head, never past what hyper would hold; false when the connection
    /// ends first.
    async fn read_more(&mut self) -> bool {
        let room = MAX_BUF_BYTES - self.read.len();
        self.read.reserve_exact(room.min(2048));
        matches!(
            self.io.read_buf(&mut (&mut self.read).limit(room)).await,
            Ok(n) if n > 0
        )
    }

    /// An agent's reconcile: its report taken, its poll held, its answer written. False
    /// when the connection cannot go on.
    async fn reconcile(&mut self, admitted: Admitted, body: u64, wait: u64, close: bool) -> bool {
        let hub = self.hub.clone();
        let report = match Box::pin(self.body(body)).await {
            Ok(report) => report,
            // The body was not read through: the next request's start is unknown.
            Err(e) => {
                Box::pin(self.reply(e.into_response(), true)).await;
                return false;
            }
        };
        let peer = self.peer;
        let mut poll = match Box::pin(async {
            agents::take(&hub, &admitted, peer, extract::json(&report)?).await
        })
        .await
        {
            Ok(poll) => poll,
            Err(e) => return Box::pin(self.reply(e.into_response(), close)).await,
        };
        drop(report);
        if self.read.is_empty() {
            self.read = Vec::new();
        }
        if !self
            .hold(&mut poll, agents::held_for(&hub, Some(wait)))
            .await
        {
            return false;
        }
        match Box::pin(agents::answer(&hub, admitted, poll, peer)).await {
            Ok(json) => reply::write_json(&mut self.io, &json, close).await.is_ok() && !close,
            Err(e) => Box::pin(self.reply(e.into_response(), close)).await,
        }
    }

    /// Holds `poll`, watching the connection meanwhile: false when the agent went away
    /// (its poll ends with it, as when hyper served it).
    async fn hold(&mut self, poll: &mut crate::fleet::Poll, wait: std::time::Duration) -> bool {
        let hold = self.hub.fleet.hold(poll, wait);
        tokio::pin!(hold);
        let mut probe = [0u8; 64];
        loop {
            tokio::select! {
                // The answer first: a client that sent its request and closed its side
                // still gets it.
                biased;
                () = &mut hold => return true,
                // Cancel-safe: a read that loses the race has taken nothing.
                got = self.io.read(&mut probe) => match got {
                    Ok(0) | Err(_) => return false,
                    // A request sent before the answer: kept for its turn.
                    Ok(n) if self.read.len() + n <= MAX_BUF_BYTES => {
                        self.read.extend_from_slice(&probe[..n]);
                    }
                    Ok(_) => return false,
                },
            }
        }
    }

    /// The request's body of `len` bytes, within the time the router gives one.
    async fn body(&mut self, len: u64) -> ApiResult<Vec<u8>> {
        let max = agents::MAX_REPORT_BYTES;
        let len = match usize::try_from(len) {
            Ok(n) if n <= max => n,
            _ => return Err(extract::too_large(max)),
        };
        let fill =
            async {
                while self.read.len() < len {
                    self.read.reserve(len - self.read.len());
                    match self.io.read_buf(&mut self.read).await {
                        Ok(0) => return Err(ApiError::new(
                            axum::http::StatusCode::BAD_REQUEST,
                            "could not read the request body: the connection ended before it did",
                        )),
                        Ok(_) => {}
                        Err(e) => return Err(extract::unreadable(&e)),
                    }
                }
                Ok(())
            };
        match tokio::time::timeout(extract::BODY_TIMEOUT, fill).await {
            Ok(r) => r?,
            Err(_) => return Err(extract::too_slow()),
        }
        let rest = self.read.split_off(len);
        Ok(std::mem::replace(&mut self.read, rest))
    }

    async fn reply(&mut self, resp: axum::response::Response, close: bool) -> bool {
        reply::write(&mut self.io, resp, close).await.is_ok() && !close
    }

    /// One request served by hyper: `whole` bytes from where the connection stands.
    /// False when the connection cannot go on (hyper failed, or left some of the
    /// request unread, or its answer closes the connection, or the client went away).
    async fn lend(&mut self, whole: u64) -> bool {
        let have = self
            .read
            .len()
            .min(usize::try_from(whole).unwrap_or(usize::MAX));
        let rest = self.read.split_off(have);
        let request = std::mem::replace(&mut self.read, rest);
        let closing = Arc::new(AtomicBool::new(false));
        let signals = Arc::new(Signals::default());
        let svc = self.service(closing.clone(), Some(signals.clone()));
        let left = whole.saturating_sub(have as u64);
        let mut passage = Passage::new(request, left, signals.clone(), &mut self.io);
        let served = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .max_buf_size(MAX_BUF_BYTES)
            // The client going away mid-request ends the passage: hyper drops the
            // handler, as it always did.
            .serve_connection(TokioIo::new(&mut passage), svc)
            .await;
        let taken = passage.taken();
        self.read.extend_from_slice(&passage.early());
        served.is_ok() && taken && !signals.is_gone() && !closing.load(Ordering::Acquire)
    }

    /// The rest of the connection, served by hyper.
    async fn rest(&mut self) {
        let svc = self.service(Arc::new(AtomicBool::new(false)), None);
        let passage = Passage::rest(std::mem::take(&mut self.read), &mut self.io);
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .max_buf_size(MAX_BUF_BYTES)
            .serve_connection(TokioIo::new(passage), svc)
            .await;
    }

    /// The router as hyper calls it: with the peer's address, in the connection's place,
    /// telling `closing` when an answer ends the connection. A lent request's answer tells
    /// its passage once hyper has let go of it (`signals`).
    fn service(
        &self,
        closing: Arc<AtomicBool>,
        signals: Option<Arc<Signals>>,
    ) -> impl hyper::service::Service<
        hyper::Request<Incoming>,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
        Future = impl Send,
    > + Clone {
        let app = TowerToHyperService::new(self.app.clone());
        let (peer, place) = (self.peer, self.place.clone());
        hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            use hyper::service::Service as _;
            if let Some(p) = peer {
                req.extensions_mut().insert(p);
            }
            let call = PLACE.scope(place.clone(), app.call(req));
            let (closing, signals) = (closing.clone(), signals.clone());
            async move {
                let resp = call.await?;
                let close = resp
                    .headers()
                    .get_all(header::CONNECTION)
                    .iter()
                    .any(|v| head::has_token(v.as_bytes(), "close"));
                if close {
                    closing.store(true, Ordering::Release);
                }
                Ok(match signals {
                    Some(s) => {
                        resp.map(|body| axum::body::Body::new(Answered { body, signals: s }))
                    }
                    None => resp,
                })
            }
        })
    }
}

/// A lent request's answer body: once hyper lets go of it (written, or abandoned), the
/// passage ends.
struct Answered {
    body: axum::body::Body,
    signals: Arc<Signals>,
}

impl axum::body::HttpBody for Answered {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Answered {
    fn drop(&mut self) {
        self.signals.answered();
    }
}
