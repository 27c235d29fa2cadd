//! The reference hub: `railgrid hub serve`, the control plane agents reconcile against
//! (hub protocol v1, docs/hub.md). Its admin API's client is the binary's (`railgrid hub …`).
//!
//! Tasks of `hub serve`:
//! - the *accept loop* ([`serve::accept_loop`]): TLS connections, capped; one task per
//!   connection, which serves the API ([`api`]). A held long poll is such a task parked
//!   on its agent's watch channel ([`fleet`]).
//! - the *report flusher* ([`fleet::ReportFlusher`]): writes agents' reports to the store
//!   in batches.
//! - the *housekeeper* ([`fleet::Housekeeper`]): deletes done jobs past the hub's bound,
//!   ends the jobs of agents gone past its patience.
//! - the *dispatcher* ([`fleet::Dispatcher`]): hands the fleet's queued jobs to agents
//!   with room.
//! - the *roller* ([`fleet::Roller`]): drives the rollouts, wave by wave, while this hub
//!   holds their lease in the store.
//!
//! In: agents' reconciles (report in, desired state out), admin requests. Out: the
//! store ([`store`]), which holds everything that must survive a restart.
//!
//! The data dir (0700) holds `hub.db` (SQLite), `admin.token` (0600), `hub.json` (the URL
//! served, for the admin commands), `hub.lock` (one hub per data dir), and with
//! `--tls-self-signed` `ca.pem` and `tls/ca.key` (0600).

pub mod access;
pub mod copy;
pub mod fleet;
mod http;
pub mod metrics;
pub mod renumber;
pub mod secrets;
mod serve;
mod shared;
pub mod tls;
mod token;
mod unproven;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use railgrid_build as build_info;
use railgrid_proto as proto;
use railgrid_release as release;
use railgrid_sys as sys;
use railgrid_util as util;
use railgrid_util::{error_chain, file_error, metrics_text, small_file, stream_body};
use thiserror::Error;

pub use railgrid_hub_store as store;

use self::fleet::{Dispatcher, Fleet, FleetError, Housekeeper, ReplicaSync, ReportFlusher, Roller};
use self::store::postgres::PgStore;
use self::store::sqlite::SqliteStore;
use self::store::{Store, StoreError};
use self::tls::{TlsError, TlsSource};

pub use crate::proto::hub_dir::{HubFile, ADMIN_TOKEN_FILE, HUB_FILE};
const LOCK_FILE: &str = "hub.lock";
const DB_FILE: &str = "hub.db";
/// Published release binaries, each named by its SHA-256.
const RELEASES_DIR: &str = "releases";
/// Descriptors kept out of the connection cap: the database, the overflow answers, logs.
const FILES_KEPT: usize = 512;
/// Connections served at once when `--max-connections` is not given.
const DEFAULT_MAX_CONNECTIONS: usize = 20_000;

#[derive(Debug, Error)]
pub enum HubError {
    #[error("could not prepare the hub's data dir {path}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another hub is serving data dir {path} (it holds {lock}): stop it first, or give this one another --data-dir")]
    AlreadyRunning { path: PathBuf, lock: PathBuf },
    #[error("could not read or write {path}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not make a random token")]
    Random(#[source] getrandom::Error),
    #[error("could not listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Fleet(#[from] FleetError),
    #[error(transparent)]
    Access(#[from] access::AccessError),
    #[error("could not install signal handlers")]
    Signals(#[source] std::io::Error),
    #[error("{path} is not the {what} of the other replicas on this database: move it away (this replica then takes theirs), or give this replica its own database")]
    Mismatch { what: &'static str, path: PathBuf },
    #[error(
        "hubs are connected to the database {store} (from {from}): stop every hub on it first"
    )]
    HubsConnected { store: String, from: String },
    #[error("there is no hub database at {path}: give the --data-dir of the hub")]
    NoStore { path: PathBuf },
    #[error("give the hub's --data-dir (SQLite), or its --store URL or --config (PostgreSQL)")]
    NoTarget,
    #[error("{path} is missing: it holds {what}, which the replicas need; put it back (from a backup of the data dir) and copy again")]
    CopyNeeds { path: PathBuf, what: &'static str },
    #[error("{path} does not hold the release binary the store names (SHA-256 {sha256}): put it back from a backup of the data dir and copy again")]
    CopyBinary { path: PathBuf, sha256: String },
    #[error("{table} read back from {url} is not what was copied ({want} rows, sum {want_sum}; read {got} rows, sum {got_sum}): nothing was committed")]
    CopyMismatch {
        table: String,
        url: String,
        want: u64,
        want_sum: String,
        got: u64,
        got_sum: String,
    },
    #[error("--release-key {path}")]
    ReleaseKey {
        path: PathBuf,
        #[source]
        source: crate::release::ReleaseError,
    },
    #[error(transparent)]
    Secrets(#[from] secrets::SecretsError),
}

impl HubError {
    /// True for errors the operator fixes in the command line or the data dir (exit 2).
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            HubError::AlreadyRunning { .. }
                | HubError::Tls(_)
                | HubError::Listen { .. }
                | HubError::ReleaseKey { .. }
                | HubError::Mismatch { .. }
                | HubError::HubsConnected { .. }
                | HubError::NoStore { .. }
                | HubError::NoTarget
                | HubError::CopyNeeds { .. }
                | HubError::CopyBinary { .. }
                | HubError::Secrets(
                    secrets::SecretsError::Key(_)
                        | secrets::SecretsError::NoKey { .. }
                        | secrets::SecretsError::OtherKey { .. }
                        | secrets::SecretsError::Write { .. }
                )
                | HubError::Store(
                    StoreError::BadUrl { .. }
                        | StoreError::DatabaseCa { .. }
                        | StoreError::HubsRunning(_)
                        | StoreError::NotEmpty { .. }
                )
        )
    }
}

/// `hub serve` options.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub tls: TlsSource,
    /// The URL agents and admins use, when it is not `https://<listen address>`.
    pub url: Option<String>,
    /// `None`: [`DEFAULT_MAX_CONNECTIONS`], or fewer if the open-files limit says so.
    pub max_connections: Option<usize>,
    pub max_wait: Duration,
    pub poll_interval: Duration,
    pub job_limits: fleet::JobLimits,
    /// Public key files of the publishers whose releases the hub takes.
    pub release_keys: Vec<PathBuf>,
    /// `postgres://…`: a database shared with other hubs; `None`: SQLite in the data dir.
    pub store: Option<String>,
    /// How long audit lines are kept.
    pub keep_audit: Duration,
    /// Agents whose token is older are sent a new one (`None`: only when asked).
    pub agent_token_max_age: Option<Duration>,
    /// Where `/metrics` is served in plain HTTP, without a token (a private network).
    pub metrics_listen: Option<SocketAddr>,
    /// The key that seals secrets (`None`: [`secrets::KEY_FILE`] in the data dir).
    pub secrets_key_file: Option<PathBuf>,
}

/// Serves until SIGTERM or SIGINT.
pub async fn serve(opts: ServeOptions) -> Result<(), HubError> {
    use tokio::signal::unix::{signal, SignalKind};
    let signals = (
        signal(SignalKind::terminate()).map_err(HubError::Signals)?,
        signal(SignalKind::interrupt()).map_err(HubError::Signals)?,
    );

    let data = opts.data_dir.clone();
    let prepared = tokio::task::spawn_blocking(move || prepare(&data, &opts))
        .await
        .map_err(|e| HubError::DataDir {
            path: PathBuf::new(),
            source: std::io::Error::other(e),
        })??;
    let Prepared {
        opts,
        _lock,
        release_keys,
        tls,
    } = prepared;
    match opts.store.clone() {
        None => {
            let data = opts.data_dir.clone();
            let tls_source = opts.tls.clone();
            let keys = tokio::task::spawn_blocking(move || {
                let tls = match tls {
                    Some(tls) => tls,
                    None => tls::server_config(&data, &tls_source)?,
                };
                Ok::<_, HubError>((admin_token(&data)?, tls))
            })
            .await
            .map_err(|e| HubError::DataDir {
                path: PathBuf::new(),
                source: std::io::Error::other(e),
            })??;
            let store = SqliteStore::open(&opts.data_dir.join(DB_FILE))?;
            run(Arc::new(store), opts, keys, release_keys, signals).await
        }
        Some(url) => {
            let store = PgStore::connect(&url).await?;
            tracing::info!(database = %store::postgres::redact(&url), "the hub's store is PostgreSQL, shared with any other replicas");
            let admin_sha256 = shared::admin_token(&store, &opts.data_dir).await?;
            if let TlsSource::SelfSigned { .. } = &opts.tls {
                shared::self_signed_ca(&store, &opts.data_dir).await?;
            }
            let tls = match tls {
                Some(tls) => tls,
                None => tls::server_config(&opts.data_dir, &opts.tls)?,
            };
            let keys = (admin_sha256, tls);
            run(Arc::new(store), opts, keys, release_keys, signals).await
        }
    }
}

/// Serves from `store` until a signal, with the admin token's SHA-256 and the TLS
/// configuration.
async fn run<S: Store>(
    store: Arc<S>,
    opts: ServeOptions,
    (admin_sha256, tls): (String, Arc<rustls::ServerConfig>),
    release_keys: Vec<minisign::PublicKey>,
    (mut term, mut int): (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
) -> Result<(), HubError> {
    let access =
        Arc::new(access::Access::load(store.clone(), opts.data_dir.clone(), admin_sha256).await?);
    let key_file = opts
        .secrets_key_file
        .clone()
        .unwrap_or_else(|| opts.data_dir.join(secrets::KEY_FILE));
    let secrets = Arc::new(secrets::Secrets::load(store.clone(), key_file).await?);
    let fleet = Arc::new(
        Fleet::load(
            store.clone(),
            opts.poll_interval,
            opts.max_wait,
            opts.job_limits,
        )
        .await?
        .with_token_max_age(opts.agent_token_max_age),
    );

    // Connections past the open-files limit would be refused by the kernel (EMFILE)
    // instead of answered 503: keep the cap under it, with room for the database, the
    // overflow answers and the log.
    let asked = opts.max_connections;
    let mut max_connections = asked.unwrap_or(DEFAULT_MAX_CONNECTIONS);
    match crate::sys::raise_open_files_limit() {
        Ok(n) => {
            let room = (n as usize).saturating_sub(FILES_KEPT).max(1);
            match asked {
                Some(asked) if room < asked => tracing::warn!(
                    open_files = n,
                    asked,
                    max_connections = room,
                    "--max-connections is above what the open-files limit allows; lowered (raise LimitNOFILE to serve more)"
                ),
                None if room < max_connections => tracing::info!(
                    open_files = n,
                    max_connections = room,
                    "serving at most this many connections at once, as the open-files limit allows (raise LimitNOFILE to serve more)"
                ),
                _ => {}
            }
            max_connections = max_connections.min(room);
        }
        Err(e) => tracing::warn!(error = %e, "could not raise the open-files limit"),
    }
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|source| HubError::Listen {
            addr: opts.listen,
            source,
        })?;
    let local = listener.local_addr().map_err(|source| HubError::Listen {
        addr: opts.listen,
        source,
    })?;
    let hub = Arc::new(http::Hub {
        fleet: fleet.clone(),
        replica: format!(
            "{}:{}",
            crate::sys::hostname().unwrap_or_default(),
            local.port()
        ),
        access: access.clone(),
        secrets,
        sessions: Default::default(),
        max_wait: opts.max_wait,
        release_keys,
        releases_dir: opts.data_dir.join(RELEASES_DIR),
        fetching: tokio::sync::Mutex::new(()),
        answers: Default::default(),
    });
    // Metrics in plain HTTP, for a scraper on a private network: no token, nothing but
    // /metrics.
    let metrics = match opts.metrics_listen {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| HubError::Listen { addr, source })?;
            let bound = l
                .local_addr()
                .map_err(|source| HubError::Listen { addr, source })?;
            let router = http::metrics_router(hub.clone());
            tracing::info!(listen = %bound, "serving /metrics in plain HTTP, without a token");
            Some((
                bound,
                tokio::spawn(async move {
                    if let Err(e) = axum::serve(l, router).await {
                        tracing::error!(error = %e, "the metrics listener failed");
                    }
                }),
            ))
        }
        None => None,
    };
    let url = opts.url.clone().unwrap_or_else(|| default_url(local));
    let ca_file =
        matches!(opts.tls, TlsSource::SelfSigned { .. }).then(|| opts.data_dir.join(tls::CA_FILE));
    let info = HubFile {
        url: url.clone(),
        listen: local.to_string(),
        pid: std::process::id(),
        ca_file,
        metrics: metrics.as_ref().map(|(a, _)| a.to_string()),
    };
    let hub_file = opts.data_dir.join(HUB_FILE);
    let json = serde_json::to_vec_pretty(&info).unwrap_or_default();
    crate::util::write_atomic(&hub_file, &json, 0o644).map_err(|source| HubError::File {
        path: hub_file,
        source,
    })?;
    let (agents, _) = fleet.counts();
    tracing::info!(%url, listen = %local, agents, data_dir = %opts.data_dir.display(), "hub serving");

    let flusher = ReportFlusher::spawn(fleet.clone());
    let housekeeper = Housekeeper::spawn(fleet.clone());
    let dispatcher = Dispatcher::spawn(fleet.clone());
    let roller = Roller::spawn(fleet.clone());
    let keeper = access::AuditKeeper::spawn(access.clone(), opts.keep_audit);
    // Another replica made or revoked a token: loaded at once, not at the next refresh.
    let tokens = {
        let (access, mut moved) = (access.clone(), fleet.tokens_moved());
        tokio::spawn(async move {
            while moved.changed().await.is_ok() {
                if let Err(e) = access.reload().await {
                    tracing::warn!(error = %crate::error_chain(&e), "could not load the admin tokens another replica changed (loaded again within seconds)");
                }
            }
        })
    };
    let replicas = ReplicaSync::spawn(fleet.clone());
    let stop = async {
        tokio::select! {
            // Cancel-safe: signal streams keep a signal that arrived between polls.
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    };
    let why = serve::accept_loop(listener, tls, http::Conns::new(hub), max_connections, stop).await;
    tracing::info!("{why} received: stopping the hub");
    flusher.stop();
    housekeeper.stop();
    dispatcher.stop();
    roller.stop();
    keeper.stop();
    access.flush_refusals().await;
    if let Some((_, task)) = metrics {
        task.abort();
    }
    tokens.abort();
    if let Some(r) = replicas {
        r.stop();
    }
    if let Err(e) = fleet.flush_reports().await {
        tracing::error!(error = %crate::error_chain(&e), "could not write the last agent reports");
    }
    tracing::info!("hub stopped");
    Ok(())
}

/// `https://ADDR`, with `localhost` for an unspecified address (the certificate names it).
fn default_url(addr: SocketAddr) -> String {
    match addr {
        a if a.ip().is_unspecified() => format!("https://localhost:{}", a.port()),
        SocketAddr::V6(a) => format!("https://[{}]:{}", a.ip(), a.port()),
        SocketAddr::V4(a) => format!("https://{a}"),
    }
}

struct Prepared {
    opts: ServeOptions,
    _lock: std::fs::File,
    release_keys: Vec<minisign::PublicKey>,
    /// The TLS configuration from the operator's files (`None`: self-signed, made in the
    /// data dir).
    tls: Option<Arc<rustls::ServerConfig>>,
}

/// The operator's files (certificate, key, release keys), then the data dir (0700) and
/// its lock: blocking work, done before anything listens. Every input is checked before
/// anything is written, so a bad one leaves the data dir as it was.
fn prepare(data: &Path, opts: &ServeOptions) -> Result<Prepared, HubError> {
    use std::os::unix::fs::PermissionsExt;
    let tls = match &opts.tls {
        TlsSource::Files { .. } => Some(tls::server_config(data, &opts.tls)?),
        TlsSource::SelfSigned { .. } => None,
    };
    let release_keys = opts
        .release_keys
        .iter()
        .map(|path| {
            crate::release::load_public_key(path).map_err(|source| HubError::ReleaseKey {
                path: path.clone(),
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let dir_err = |source| HubError::DataDir {
        path: data.to_owned(),
        source,
    };
    std::fs::create_dir_all(data).map_err(dir_err)?;
    std::fs::set_permissions(data, std::fs::Permissions::from_mode(0o700)).map_err(dir_err)?;
    let lock = lock_data_dir(data)?;
    sweep_releases(&data.join(RELEASES_DIR));
    for key in &release_keys {
        tracing::info!(key_id = %crate::release::id_of(key), "taking releases signed by this key");
    }
    Ok(Prepared {
        opts: opts.clone(),
        _lock: lock,
        release_keys,
        tls,
    })
}

/// Removes what uploads and fetches of release binaries left when the hub was killed
/// mid-way (`.upload-*`, and `.<sha256>.tmp.*` of a copy from the database): with the data
/// dir's lock held, no other hub is writing them.
fn sweep_releases(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".upload-") || (name.starts_with('.') && name.contains(".tmp.")) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::info!(path = %entry.path().display(), "removed a release upload that a stopped hub left")
                }
                Err(e) => {
                    tracing::warn!(path = %entry.path().display(), error = %e, "could not remove a release upload that a stopped hub left")
                }
            }
        }
    }
}

/// The data dir's lock, held for as long as the returned file lives: one hub (or one
/// offline command such as `hub store renumber`) per data dir.
fn lock_data_dir(data: &Path) -> Result<std::fs::File, HubError> {
    let lock_path = data.join(LOCK_FILE);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|source| HubError::File {
            path: lock_path.clone(),
            source,
        })?;
    match fs4::FileExt::try_lock(&lock) {
        Ok(()) => {}
        Err(fs4::TryLockError::WouldBlock) => {
            return Err(HubError::AlreadyRunning {
                path: data.to_owned(),
                lock: lock_path,
            })
        }
        Err(fs4::TryLockError::Error(source)) => {
            return Err(HubError::File {
                path: lock_path,
                source,
            })
        }
    }
    Ok(lock)
}

/// The admin token's SHA-256; the token is made and written (0600) at first start.
fn admin_token(data: &Path) -> Result<String, HubError> {
    let path = data.join(ADMIN_TOKEN_FILE);
    let err = |source| HubError::File {
        path: path.clone(),
        source,
    };
    match crate::small_file::read_string(&path, crate::small_file::TOKEN_MAX) {
        Ok(t) if !t.trim().is_empty() => return Ok(token::sha256_hex(t.trim())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let t = token::new_admin_token().map_err(HubError::Random)?;
    crate::util::write_atomic(&path, format!("{t}\n").as_bytes(), 0o600).map_err(err)?;
    tracing::info!(path = %path.display(), "wrote the hub's admin token");
    Ok(token::sha256_hex(&t))
}
