//! A job's egress proxy: the only way out of a job whose network is `allow` (docs/security.md,
//! "Egress"). It listens inside the job's network namespace (PID 1 made the socket and
//! handed it over) and connects from the runner's, for each request deciding by the
//! job's rules alone: `CONNECT` tunnels, whose TLS ClientHello must name the host the
//! tunnel was allowed for, and plain HTTP forwarded one request at a time, each checked.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::decide::{decide, Refused, Verdict};
use super::denials::Denials;
use super::hello::{self, Hello};
use super::relay::relay;
use crate::proto::egress::{host_name, Rules};

/// Connections a job may hold through its proxy at once; more wait in the listen
/// backlog. With [`super::relay::COPY_BUF`] and hyper's head buffer, bounds the proxy's memory per job
/// (docs/security.md, "Egress").
pub(super) const MAX_CONNECTIONS: usize = 256;
/// A request head larger than this is refused.
const MAX_HEAD: usize = 64 * 1024;
const HEADER_READ: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a tunnel's first bytes may take to show whether they are a TLS handshake.
const HELLO_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a name lookup may take, and how many of one job's run at once.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
pub(super) const MAX_LOOKUPS: usize = 8;
/// Refusals logged per job before only every 1000th is.
const LOGGED: u64 = 20;

type Body = BoxBody<Bytes, hyper::Error>;

/// One job's proxy, as its connections share it.
pub(super) struct Proxy {
    pub(super) job: String,
    pub(super) rules: Rules,
    pub(super) denials: Arc<Denials>,
    /// Ends every connection and tunnel when its sender goes (the job has ended).
    pub(super) stop: tokio::sync::watch::Receiver<()>,
    /// One per connection, and one more per tunnel for its whole life (hyper lets the
    /// connection go once it is upgraded): [`MAX_CONNECTIONS`] in all.
    pub(super) slots: Arc<Semaphore>,
    /// Name lookups in flight: each takes a thread of the runner's blocking pool, which a
    /// job must not fill.
    pub(super) lookups: Arc<Semaphore>,
}

impl Proxy {
    /// Serves `listener` until the task is aborted (when the job ends).
    pub(super) async fn serve(self: Arc<Self>, listener: TcpListener) {
        let permits = self.slots.clone();
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ)
            .max_buf_size(MAX_HEAD)
            .preserve_header_case(true);
        loop {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(job = %self.job, error = %e, "egress proxy: could not accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let proxy = self.clone();
            let conn = http
                .serve_connection(
                    TokioIo::new(stream),
                    hyper::service::service_fn(move |req| {
                        let proxy = proxy.clone();
                        async move { Ok::<_, Infallible>(proxy.handle(req).await) }
                    }),
                )
                .with_upgrades();
            let mut stop = self.stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = conn => {}
                    _ = stop.changed() => {}
                }
                drop(permit);
            });
        }
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let Some((host, port)) = target(&req) else {
            return answer(
                StatusCode::BAD_REQUEST,
                "railgrid egress proxy: ask for an absolute http:// URL or CONNECT host:port\n",
            );
        };
        let destination = format!("{host}:{port}");
        // A tunnel outlives its connection's slot: it takes its own before the 200.
        let tunnel_slot = match req.method() == Method::CONNECT {
            true => match self.slots.clone().try_acquire_owned() {
                Ok(s) => Some(s),
                Err(_) => {
                    let text = format!("railgrid egress proxy: {MAX_CONNECTIONS} connections of this job are open already\n");
                    return answer(StatusCode::SERVICE_UNAVAILABLE, &text);
                }
            },
            false => None,
        };
        let lookups = self.lookups.clone();
        let resolve = |name: String, port: u16| async move {
            let _turn = lookups.acquire_owned().await;
            match tokio::time::timeout(LOOKUP_TIMEOUT, resolve(name, port)).await {
                Ok(r) => r,
                Err(_) => Err(std::io::Error::other(format!(
                    "no answer within {LOOKUP_TIMEOUT:?}"
                ))),
            }
        };
        let addrs = match decide(&self.rules, &host, port, resolve).await {
            Verdict::Connect(a) => a,
            Verdict::Refused(r) => return self.refuse(&destination, &r),
            Verdict::Unresolved(why) => return answer(StatusCode::BAD_GATEWAY, &why),
        };
        let upstream = match connect(&addrs).await {
            Ok(s) => s,
            Err(why) => {
                let text =
                    format!("railgrid egress proxy: could not connect to {destination}: {why}\n");
                return answer(StatusCode::BAD_GATEWAY, &text);
            }
        };
        if let Some(slot) = tunnel_slot {
            tokio::spawn(async move {
                self.tunnel(req, upstream, host, destination).await;
                drop(slot);
            });
            return Response::new(empty());
        }
        forward(req, upstream, &host, port).await
    }

    /// Counts a refusal, and logs it while the job has not refused many.
    fn note(&self, destination: &str, why: &str, address: bool) {
        let n = self.denials.record(destination, why, address);
        if n <= LOGGED || n % 1000 == 0 {
            tracing::info!(job = %self.job, destination, reason = why, refused = n, "egress refused");
        }
    }

    /// Counts the refusal and says it in a 403.
    fn refuse(&self, destination: &str, r: &Refused) -> Response<Body> {
        self.note(destination, &r.why, r.address);
        answer(
            StatusCode::FORBIDDEN,
            &format!("railgrid egress proxy: {destination} refused: {}\n", r.why),
        )
    }

    /// A `CONNECT` tunnel once the 200 is out: its TLS ClientHello, if it opens with
    /// one, must name `host`; then bytes both ways until either side ends.
    async fn tunnel(
        self: Arc<Self>,
        req: Request<Incoming>,
        mut upstream: TcpStream,
        host: String,
        destination: String,
    ) {
        let Ok(upgraded) = hyper::upgrade::on(req).await else {
            return;
        };
        // The accepted socket itself, and what hyper read past the request's head
        // (a client may send its ClientHello without waiting for the 200).
        let Ok(parts) = upgraded.downcast::<TokioIo<TcpStream>>() else {
            tracing::warn!(job = %self.job, "egress proxy: a tunnel that is not a TCP connection");
            return;
        };
        let mut client = parts.io.into_inner();
        let mut stop = self.stop.clone();
        let first = tokio::select! {
            r = first_bytes(parts.read_buf.to_vec(), &mut client, &upstream) => r,
            _ = stop.changed() => return,
        };
        let first = match first {
            Ok(b) => b,
            Err(why) => {
                self.note(&destination, &why, false);
                return;
            }
        };
        if let Hello::ServerName(Some(name)) = hello::read(&first) {
            // A name the job wrote is shown only once it is a host name.
            let why = match host_name(&name) {
                Some(n) if host_name(&host).as_deref() == Some(n.as_str()) => None,
                Some(n) => Some(format!("the TLS handshake names {n}, not {host}")),
                None => Some("the TLS handshake names no host name".to_owned()),
            };
            if let Some(why) = why {
                self.note(&destination, &why, false);
                return;
            }
        }
        if upstream.write_all(&first).await.is_err() {
            return;
        }
        tokio::select! {
            _ = relay(client, upstream) => {}
            _ = stop.changed() => {}
        }
    }
}

/// `(host, port)` a request asks for: `CONNECT host:port`, or an absolute `http://` URL.
fn target(req: &Request<Incoming>) -> Option<(String, u16)> {
    let uri = req.uri();
    let auth = uri.authority()?;
    let port = if req.method() == Method::CONNECT {
        auth.port_u16()?
    } else {
        if uri.scheme_str() != Some("http") {
            return None;
        }
        auth.port_u16().unwrap_or(80)
    };
    Some((auth.host().to_owned(), port))
}

async fn resolve(name: String, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    Ok(tokio::net::lookup_host((name.as_str(), port))
        .await?
        .collect())
}

/// The first of `addrs` that answers.
async fn connect(addrs: &[SocketAddr]) -> Result<TcpStream, String> {
    let mut last = String::from("no address");
    for a in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(a)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = format!("{a}: {e}"),
            Err(_) => last = format!("{a}: no answer within {CONNECT_TIMEOUT:?}"),
        }
    }
    Err(last)
}

/// The tunnel's first bytes from the client, after those hyper had read (`buf`),
/// enough to read a whole ClientHello when they start one; nothing when the server
/// speaks first (TLS never does).
async fn first_bytes(
    mut buf: Vec<u8>,
    client: &mut TcpStream,
    upstream: &TcpStream,
) -> Result<Vec<u8>, String> {
    let mut chunk = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + HELLO_TIMEOUT;
    if buf.is_empty() {
        tokio::select! {
            r = client.read(&mut chunk) => match r {
                Ok(0) | Err(_) => return Ok(buf),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            },
            _ = upstream.readable() => return Ok(buf),
            // Neither side spoke: a handshake held back to slip past the check later.
            _ = tokio::time::sleep_until(deadline) => {
                return Err("nothing was said in the tunnel in time".into())
            }
        }
    }
    while hello::read(&buf) == Hello::Incomplete && buf.len() < hello::MAX_RECORD {
        match tokio::time::timeout_at(deadline, client.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                return Err("the tunnel closed inside its TLS handshake".into())
            }
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return Err("the TLS handshake did not arrive whole in time".into()),
        }
    }
    match hello::read(&buf) {
        Hello::Malformed | Hello::Incomplete => {
            Err("a TLS handshake that is not a readable ClientHello".into())
        }
        _ => Ok(buf),
    }
}

/// Plain HTTP: the request sent on to `host:port` in origin form, its `Host` the one
/// it was allowed for, without hop-by-hop headers; one request per upstream connection.
async fn forward(
    mut req: Request<Incoming>,
    upstream: TcpStream,
    host: &str,
    port: u16,
) -> Response<Body> {
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    *req.uri_mut() = match path.parse() {
        Ok(u) => u,
        Err(_) => return answer(StatusCode::BAD_REQUEST, "railgrid egress proxy: bad path\n"),
    };
    let headers = req.headers_mut();
    for h in [
        "proxy-connection",
        "proxy-authorization",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
    ] {
        headers.remove(h);
    }
    let authority = if port == 80 {
        host.to_owned()
    } else {
        format!("{host}:{port}")
    };
    match hyper::header::HeaderValue::from_str(&authority) {
        Ok(v) => {
            headers.insert(hyper::header::HOST, v);
        }
        Err(_) => return answer(StatusCode::BAD_REQUEST, "railgrid egress proxy: bad host\n"),
    }
    headers.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(upstream)).await {
            Ok(p) => p,
            Err(e) => return answer(StatusCode::BAD_GATEWAY, &format!("{e}\n")),
        };
    tokio::spawn(conn);
    match sender.send_request(req).await {
        Ok(resp) => resp.map(BodyExt::boxed),
        Err(e) => answer(
            StatusCode::BAD_GATEWAY,
            &format!("railgrid egress proxy: {authority}: {e}\n"),
        ),
    }
}

fn empty() -> Body {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

fn answer(status: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(text.to_owned()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
