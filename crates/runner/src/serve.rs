//! The runner's HTTP server loop: hyper on the Unix socket, with bounds that keep any one
//! local client from exhausting the runner.
//!
//! Why bounds on a private socket: jobs run as the runner's account and can connect to it
//! (the API token keeps them from using it, not from connecting). Without bounds, a job
//! could open connections until the runner has no descriptors left to start jobs with.
//! So: at most [`MAX_CONNECTIONS`] (by default) at once from any account but root (one
//! more is answered 503 and closed as soon as it is accepted), a connection that has not sent a whole request header
//! within [`HEADER_READ`] of being accepted (or of its previous request) is closed, silent
//! ones included, and a client without the token is answered on a connection that is then
//! closed (see `api::authorize`). Clients with the token may keep connections open and
//! long-poll. Root's connections (the agent, an operator) skip the count: a job, which
//! never runs as root, cannot crowd them out.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

/// Connections served at once by default, root's not counted.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection may take to send a request header.
pub const HEADER_READ: Duration = Duration::from_secs(5);
/// Refusals answered at once; more connections over the limit are closed unanswered.
const MAX_REFUSALS: usize = 16;
/// How long a refusal may take, reading the request and writing the 503.
const REFUSAL_TIME: Duration = Duration::from_millis(500);
/// Pause after a failed accept (out of descriptors, most likely) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `stop` resolves, then lets in-flight requests finish.
pub async fn serve(
    listener: UnixListener,
    app: Router,
    max_connections: usize,
    stop: impl Future<Output = ()>,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(max_connections));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ);
    tokio::pin!(stop);
    loop {
        // Cancel-safe: dropping a pending accept loses nothing.
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "could not accept an API connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let root = stream.peer_cred().is_ok_and(|c| c.uid() == 0);
        let permit = if root {
            None
        } else {
            match permits.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    tracing::debug!("API connection limit reached: refusing a new connection");
                    // Answered while few refusals are in flight; beyond that, only closed.
                    if let Ok(slot) = refusals.clone().try_acquire_owned() {
                        tokio::spawn(async move {
                            refuse(stream, max_connections).await;
                            drop(slot);
                        });
                    }
                    continue;
                }
            }
        };
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _permit = permit;
            let _ = conn.await;
        });
    }
    graceful.shutdown().await;
    Ok(())
}

/// Answers a connection over the limit with a 503 that says why. The request is read first
/// (briefly: [`REFUSAL_TIME`] in all), so that the client is done writing and reads the
/// answer rather than a reset. The client may try again shortly.
async fn refuse(mut stream: tokio::net::UnixStream, max: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = format!(
        "{{\"error\":{{\"code\":\"too_many_connections\",\"message\":\"the runner is serving its limit of {max} API connections from accounts other than root; try again shortly\"}}}}"
    );
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\nretry-after: 1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}
