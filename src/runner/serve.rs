//! The runner's HTTP server loop: hyper on the Unix socket, with bounds that keep any one
//! local client from exhausting the runner.
//!
//! Why bounds on a private socket: jobs run as the runner's account and can connect to it
//! (the API token keeps them from using it, not from connecting). Without bounds, a job
//! could open connections until the runner has no descriptors left to start jobs with.
//! So: at most [`MAX_CONNECTIONS`] at once from any account but root (one more is closed
//! as soon as it is accepted), a connection that has not sent a whole request header
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

/// Connections served at once, root's not counted.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection may take to send a request header.
pub const HEADER_READ: Duration = Duration::from_secs(5);
/// Pause after a failed accept (out of descriptors, most likely) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `stop` resolves, then lets in-flight requests finish.
pub async fn serve(
    listener: UnixListener,
    app: Router,
    stop: impl Future<Output = ()>,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
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
                    tracing::debug!("API connection limit reached: closing a new connection");
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
