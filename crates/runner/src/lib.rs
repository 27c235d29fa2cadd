//! The runner: `railgrid runner run`, started by the agent under the supervisor.
//!
//! Tasks:
//! - the *API server* ([`api`]): HTTP/1.1 + JSON on `<state>/runner/runner.sock` (mode
//!   0600, never a network port). In: requests. Out: responses.
//! - the *job engine* ([`engine`]): one task per running job.
//! - the *main task* (`run`): holds the runner lock for the process's life, serves until
//!   SIGTERM or SIGINT, then stops every job's group, stops the server, removes the socket
//!   and releases the lock. With a stop budget (`--stop-budget`, which the agent sets to
//!   its own `runner.stop_grace`), all of that fits in the budget: job graces are cut to
//!   end [`stop_reserve`] before it, which leaves time for SIGKILL, reaping, recording and
//!   the server's drain.
//!
//! `railgrid runner reap` ([`leftover::reap`]) is the short-lived other mode: it ends the
//! jobs of a runner that is gone, and exits.

pub mod api;
pub mod client;
pub mod confine;
pub mod egress;
pub mod engine;
pub mod job;
pub mod leftover;
pub mod metrics;
pub mod process;
pub mod sandbox;
#[cfg(target_os = "linux")]
mod seccomp;
pub mod serve;
pub mod store;
pub mod token;

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::time::Instant as TokioInstant;

use thiserror::Error;
use tokio::signal::unix::{signal, SignalKind};

use railgrid_build as build_info;
use railgrid_proto as proto;
use railgrid_supervisor::lock::{self, LockError, PidLock};
use railgrid_supervisor::{self as supervisor, proc_tree};
use railgrid_sys as sys;
use railgrid_util::{self as util, env_vars, error_chain, metrics_text, small_file, stream_body};

/// How long open requests may take to finish after the jobs have stopped.
const SERVER_DRAIN: Duration = Duration::from_secs(2);

#[derive(Debug, Error)]
pub enum RunnerError {
    #[error("refusing to run the runner as root: the agent starts it as runner.user; run it by hand as that user")]
    Root,
    #[error("could not create runner directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("could not remove the stale socket {path}")]
    StaleSocket {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not write the API token {path}")]
    Token {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not listen on {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not install signal handlers")]
    Signals(#[source] io::Error),
    #[error(transparent)]
    Engine(#[from] engine::EngineError),
    #[error("the API server on {path} failed")]
    Serve {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What a stop keeps back of its budget for what follows the jobs' graces: SIGKILL and
/// reaping of each group, recording the ends, the server's drain. A fifth of the budget,
/// between 200 ms (or half a smaller budget) and 3 s.
pub fn stop_reserve(budget: Duration) -> Duration {
    (budget / 5).clamp(
        Duration::from_millis(200).min(budget / 2),
        Duration::from_secs(3),
    )
}

/// The runner's lock file, inside the runner directory.
pub const RUNNER_LOCK: &str = "runner.lock";
/// The runner's API socket, inside the runner directory.
pub const RUNNER_SOCKET: &str = "runner.sock";

/// Paths of a runner's state: the runner's file names are its own, and everyone else (the
/// agent, `railgrid job`) finds them here.
pub struct Paths {
    pub dir: PathBuf,
    pub lock: PathBuf,
    pub socket: PathBuf,
}

impl Paths {
    /// `<state>/runner/...`.
    pub fn new(state_dir: &Path) -> Self {
        let dir = state_dir.join("runner");
        Self {
            lock: dir.join(RUNNER_LOCK),
            socket: dir.join(RUNNER_SOCKET),
            dir,
        }
    }
}

/// Runs the runner until SIGTERM or SIGINT. The caller sets a 077 umask before the
/// runtime starts, so the socket is never briefly reachable by others.
pub async fn run(
    state_dir: &Path,
    cfg: engine::EngineConfig,
    max_api_connections: usize,
    stop_budget: Option<Duration>,
) -> Result<(), RunnerError> {
    if crate::sys::is_root() {
        return Err(RunnerError::Root);
    }
    // Jobs run as this account: without this, one could read this process's memory (other
    // jobs' environments), its environment and its descriptors through /proc or ptrace.
    if let Err(e) = crate::sys::forbid_inspection() {
        tracing::warn!(error = %e, "could not make the runner non-dumpable: jobs can inspect it");
    }
    let mut term = signal(SignalKind::terminate()).map_err(RunnerError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(RunnerError::Signals)?;
    let paths = Paths::new(state_dir);
    std::fs::create_dir_all(&paths.dir).map_err(|source| RunnerError::Dir {
        path: paths.dir.clone(),
        source,
    })?;
    let lock_path = paths.lock.clone();
    let lock: PidLock = tokio::task::spawn_blocking(move || lock::acquire(&lock_path))
        .await
        .map_err(|e| LockError::Lock {
            path: paths.lock.clone(),
            source: io::Error::other(e),
        })??;

    // Holding the lock, any socket file left behind is a dead runner's.
    match std::fs::remove_file(&paths.socket) {
        Ok(()) => tracing::info!(socket = %paths.socket.display(), "removed a stale socket"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(RunnerError::StaleSocket {
                path: paths.socket.clone(),
                source,
            })
        }
    }
    // The token first: when the socket appears, the token that opens it is in place.
    let token = token::create(&paths.dir).map_err(|source| RunnerError::Token {
        path: paths.dir.join(token::TOKEN_FILE),
        source,
    })?;
    let bind_err = |source| RunnerError::Bind {
        path: paths.socket.clone(),
        source,
    };
    let listener = tokio::net::UnixListener::bind(&paths.socket).map_err(bind_err)?;
    std::fs::set_permissions(&paths.socket, std::fs::Permissions::from_mode(0o600))
        .map_err(bind_err)?;

    let engine = engine::Engine::start(paths.dir.clone(), cfg).await?;
    let app = api::router(api::Api {
        engine: engine.clone(),
        started: Instant::now(),
        token: token.into(),
    });
    tracing::info!(pid = std::process::id(), socket = %paths.socket.display(), version = build_info::VERSION, "runner serving");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(serve::serve(
        listener,
        app,
        max_api_connections,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let early = tokio::select! {
        // Cancel-safe (all arms): signal streams buffer deliveries; the server task is
        // polled by reference and can be awaited again below.
        _ = term.recv() => { tracing::info!("SIGTERM received: runner stopping"); None }
        _ = int.recv() => { tracing::info!("SIGINT received: runner stopping"); None }
        r = &mut server => Some(r),
    };
    // Jobs first, so their waiters and followers see them end; then the server, giving
    // open requests a moment to finish. Both within the budget.
    let stop_began = TokioInstant::now();
    let (jobs_by, all_by) = match stop_budget {
        Some(budget) => {
            let reserve = stop_reserve(budget);
            tracing::info!(budget = ?budget, jobs_by = ?(budget - reserve), "stopping within the stop budget");
            (
                Some(stop_began + budget - reserve),
                Some(stop_began + budget - reserve / 2),
            )
        }
        None => (None, None),
    };
    engine.shutdown(jobs_by).await;
    let drain = all_by.map_or(SERVER_DRAIN, |t| {
        SERVER_DRAIN.min(t.saturating_duration_since(TokioInstant::now()))
    });
    let served = match early {
        Some(r) => r,
        None => {
            let _ = stop_tx.send(());
            match tokio::time::timeout(drain, &mut server).await {
                Ok(r) => r,
                Err(_) => {
                    server.abort();
                    Ok(Ok(()))
                }
            }
        }
    };
    let _ = std::fs::remove_file(&paths.socket);
    drop(lock);
    served
        .map_err(|e| io::Error::other(e.to_string()))
        .and_then(|r| r)
        .map_err(|source| RunnerError::Serve {
            path: paths.socket.clone(),
            source,
        })?;
    tracing::info!("runner stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stop_reserve_leaves_most_of_the_budget_to_the_jobs() {
        let ms = Duration::from_millis;
        assert_eq!(
            stop_reserve(Duration::from_secs(10)),
            Duration::from_secs(2)
        );
        assert_eq!(
            stop_reserve(Duration::from_secs(60)),
            Duration::from_secs(3)
        );
        assert_eq!(stop_reserve(Duration::from_secs(1)), ms(200));
        assert_eq!(stop_reserve(ms(300)), ms(150));
        assert_eq!(stop_reserve(Duration::ZERO), Duration::ZERO);
    }
}
