//! The replicated store: PostgreSQL, shared by any number of stateless hubs.
//!
//! - **The same statements as SQLite** ([`super::sqlite::MIGRATIONS`], with `BYTEA` for
//!   `BLOB`), plus what replicas share: `hub_secrets` (the admin token's hash, the CA of
//!   `--tls-self-signed`) and `release_blobs` (published binaries). Migrations run at
//!   start in one transaction under an advisory lock, so replicas starting together on
//!   an empty database make one schema; `railgrid_migrations` records each.
//! - **Wake-ups across replicas.** Every transaction that changes what agents are sent
//!   (or a job's output) ends with `pg_notify`, delivered on commit to every listening
//!   hub: `<origin> <kind> <key>`, where origin is the sending hub (it ignores its own).
//!   A task of the store ([`Listener`]) holds one connection that `LISTEN`s and turns
//!   notifications into [`Event`]s; when that connection drops, it reconnects and says
//!   [`Event::Resync`], since notifications sent meanwhile are lost.
//! - **A pool** (`deadpool-postgres`) of ordinary connections for everything else.
//! - **TLS with rustls**: `sslmode=require` verifies the server's certificate against the
//!   system's roots, or against `sslrootcert=FILE` in the URL (read here: the driver does
//!   not know it). The URL's password never appears in a message.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio::sync::mpsc;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, Row};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::sqlite::{parse_settings, MIGRATIONS};
use super::{
    plan_append, AgentRow, AgentSnapshot, AppendPlan, Appended, Event, FleetSnapshot, HaltRow,
    JobProgress, JobRow, ReleaseRow, ReportRow, ScopeRow, Snapshot, Store, StoreError, Stream,
};
use crate::proto::desired::MAX_GENERATION;
use crate::proto::hub::DesiredSettings;

/// The notification channel of railgrid hubs.
const CHANNEL: &str = "railgrid_hub";
/// The advisory lock key migrations run under ("railgrid" in ASCII).
const MIGRATION_LOCK: i64 = 0x7261_696c_6772_6964;
/// What replicas add to the shared schema, numbered from [`REPLICA_BASE`] + 1 so that the
/// shared list can grow without renumbering them.
const REPLICA_BASE: i64 = 1000;
const REPLICA_MIGRATIONS: &[&str] = &["CREATE TABLE hub_secrets (
        name TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    CREATE TABLE release_blobs (
        sha256 TEXT PRIMARY KEY,
        data BYTEA NOT NULL
    );"];
/// Connections per hub: the hub's writes are few and short (reads come from memory).
const POOL_SIZE: usize = 16;
/// Waiting for a pooled connection, and for a new one.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest pause between attempts to listen again.
const LISTEN_BACKOFF_MAX: Duration = Duration::from_secs(10);
/// How often the listening connection proves it is alive, and how long it may take.
const LISTEN_PING: Duration = Duration::from_secs(10);
/// A connection whose peer went silent is given up after this (TCP keepalives and
/// `tcp_user_timeout`), and a statement is cancelled by the server after
/// [`STATEMENT_TIMEOUT`]: a half-open connection must not hold the hub's changes.
const DEAD_PEER: Duration = Duration::from_secs(30);
const STATEMENT_TIMEOUT: &str = "30s";

/// The name a hub's connections carry (`application_name`), unless its URL gives one.
const HUB_APPLICATION: &str = "railgrid-hub";
/// The name `hub store renumber` connects with: it holds no hub's lock.
pub(crate) const RENUMBER_APPLICATION: &str = "railgrid-hub-renumber";
/// The advisory lock every running hub holds shared (on its listening connection), and
/// `hub store renumber` takes exclusively.
const HUBS_LOCK: i64 = 0x7261_696c_6875_6273; // "railhubs"

/// Takes the next generation, never past [`MAX_GENERATION`] (no row then).
const NEXT_GENERATION: &str =
    "UPDATE meta SET value = value + 1 WHERE key = 'generation' AND value < $1 RETURNING value";

const JOB_COLUMNS: &str = "id, seq, agent, spec, created_ms, state, cancel_requested, exit_code,
    exit_signal, error, finished_ms, stdout_bytes, stderr_bytes, runner_truncated, done,
    stdout_length, stderr_length, stdout_stored, stderr_stored, started_ms";

/// The states of a job that has not ended (in the expressions' SQL form).
const OPEN_STATES: &str = "'pending', 'queued', 'starting', 'running'";

const AGENT_COLUMNS: &str =
    "id, token_sha256, enrolled_at, revoked_at, last_seen, observed_generation, report";

pub(crate) struct PgStore {
    /// The URL without its password, for messages.
    url: String,
    pool: Pool,
    /// This hub, in its notifications.
    origin: String,
    events: Mutex<Option<mpsc::UnboundedReceiver<Event>>>,
    listener: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<Seen>>,
}

/// The generations this hub knows about: those it handed out, those in the other hubs'
/// notifications, and all up to the last full load. A number missing below the store's
/// counter for two checks in a row is a change this hub missed.
#[derive(Debug, Default)]
struct Seen {
    /// Every generation up to here is accounted for.
    synced: u64,
    above: BTreeSet<u64>,
    /// The store's counter when a gap was first found.
    gap_at: Option<u64>,
}

impl Seen {
    fn add(&mut self, generation: u64) {
        if generation > self.synced {
            self.above.insert(generation);
        }
        self.advance();
    }

    fn advance(&mut self) {
        while self.above.remove(&(self.synced + 1)) {
            self.synced += 1;
        }
    }

    /// Everything up to `generation` was loaded.
    fn loaded(&mut self, generation: u64) {
        if generation > self.synced {
            self.synced = generation;
            self.above.retain(|g| *g > generation);
            self.advance();
        }
        self.gap_at = None;
    }

    /// Whether nothing up to `newest` (the store's counter) is missing, allowing one
    /// check for notifications in flight.
    fn check(&mut self, newest: u64) -> bool {
        self.advance();
        if self.synced >= newest {
            self.gap_at = None;
            return true;
        }
        match self.gap_at {
            Some(g) if self.synced < g => false,
            _ => {
                self.gap_at = Some(newest);
                true
            }
        }
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// The URL with its password replaced, for messages and logs. Whatever lies before
/// the last `@` is user and password (the driver's reading and ours may differ on an
/// unencoded `@`: cutting too much is safe, too little is not), and a query key that
/// decodes to `password` in any case is hidden.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(not a postgres:// URL)".into();
    };
    let rest = match rest.rsplit_once('@') {
        Some((user, after)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:***@{after}"),
            None => format!("{user}@{after}"),
        },
        None => rest.to_owned(),
    };
    let rest = match rest.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if percent_decoded(k).eq_ignore_ascii_case("password") => {
                        format!("{k}=***")
                    }
                    _ => kv.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => rest,
    };
    format!("{scheme}://{rest}")
}

/// `%XX` decoded (bytes that do not decode are kept as they are).
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Takes `sslrootcert=FILE` out of the URL's query (the driver refuses what it does not
/// know).
fn split_root_cert(url: &str) -> (String, Option<PathBuf>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut root = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| match kv.strip_prefix("sslrootcert=") {
            Some(path) => {
                root = Some(PathBuf::from(path));
                false
            }
            None => true,
        })
        .collect();
    if kept.is_empty() {
        (base.to_owned(), root)
    } else {
        (format!("{base}?{}", kept.join("&")), root)
    }
}

fn tls_config(url: &str, root: Option<PathBuf>) -> Result<rustls::ClientConfig, StoreError> {
    let mut roots = rustls::RootCertStore::empty();
    match root {
        Some(path) => {
            let pem = crate::small_file::read(&path, crate::small_file::CONFIG_MAX).map_err(
                |source| StoreError::DatabaseCa {
                    url: url.to_owned(),
                    path: path.clone(),
                    source,
                },
            )?;
            use rustls::pki_types::pem::PemObject;
            for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem).flatten() {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(StoreError::DatabaseCa {
                    url: url.to_owned(),
                    path,
                    source: std::io::Error::other("no certificate in it"),
                });
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::BadUrl {
            url: url.to_owned(),
            why: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(cfg)
}

/// rustls for the driver. The driver asks for a connector even where it will not use
/// it (a Unix socket, which has no host name, with TLS off): such a connector is given
/// a name no certificate can hold (`.invalid` is reserved), so that it fails closed if
/// it is ever used.
#[derive(Clone)]
struct Tls(MakeRustlsConnect);

impl<S> MakeTlsConnect<S> for Tls
where
    MakeRustlsConnect: MakeTlsConnect<S>,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, hostname: &str) -> Result<Self::TlsConnect, Self::Error> {
        let name = if hostname.is_empty() {
            "no-host-name.invalid"
        } else {
            hostname
        };
        MakeTlsConnect::<S>::make_tls_connect(&mut self.0, name)
    }
}

fn u64_of(n: i64) -> u64 {
    n.max(0) as u64
}

fn opt_u64(v: Option<i64>) -> Option<u64> {
    v.map(u64_of)
}

fn corrupt(url: &str, what: String) -> impl FnOnce(serde_json::Error) -> StoreError + '_ {
    move |source| StoreError::Corrupt {
        path: url.to_owned(),
        what,
        source,
    }
}

fn agent_row(r: &Row) -> AgentRow {
    AgentRow {
        id: r.get(0),
        token_sha256: r.get(1),
        enrolled_at: u64_of(r.get(2)),
        revoked_at: opt_u64(r.get(3)),
        last_seen: opt_u64(r.get(4)),
        observed_generation: u64_of(r.get(5)),
        report: r.get(6),
    }
}

fn job_row(url: &str, r: &Row) -> Result<JobRow, StoreError> {
    let id: String = r.get(0);
    let spec: String = r.get(3);
    let spec =
        serde_json::from_str(&spec).map_err(corrupt(url, format!("the spec of job {id:?}")))?;
    let truncated: Option<String> = r.get(13);
    let runner_truncated = truncated
        .map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(corrupt(url, format!("the truncation of job {id:?}")))?;
    Ok(JobRow {
        seq: u64_of(r.get(1)),
        agent: r.get(2),
        spec,
        created_ms: u64_of(r.get(4)),
        progress: JobProgress {
            state: r.get(5),
            cancel_requested: r.get::<_, i64>(6) != 0,
            exit_code: r.get::<_, Option<i64>>(7).map(|c| c as i32),
            signal: r.get::<_, Option<i64>>(8).map(|s| s as i32),
            error: r.get(9),
            finished_ms: opt_u64(r.get(10)),
            started_ms: opt_u64(r.get(19)),
            stdout_bytes: u64_of(r.get(11)),
            stderr_bytes: u64_of(r.get(12)),
            runner_truncated,
            done: r.get::<_, i64>(14) != 0,
        },
        stdout_length: u64_of(r.get(15)),
        stderr_length: u64_of(r.get(16)),
        stdout_stored: u64_of(r.get(17)),
        stderr_stored: u64_of(r.get(18)),
        id,
    })
}

fn scope_row(url: &str, r: &Row) -> Result<ScopeRow, StoreError> {
    let scope: String = r.get(0);
    let settings: String = r.get(2);
    let settings = parse_settings(url, &scope, Some(&settings))?;
    Ok(ScopeRow {
        generation: u64_of(r.get(1)),
        scope,
        settings,
    })
}

fn release_row(r: &Row) -> ReleaseRow {
    ReleaseRow {
        version: r.get(0),
        os: r.get(1),
        arch: r.get(2),
        size: u64_of(r.get(3)),
        sha256: r.get(4),
        signature: r.get(5),
        key_id: r.get(6),
        published_at: u64_of(r.get(7)),
    }
}

fn halt_row(r: &Row) -> HaltRow {
    HaltRow {
        version: r.get(0),
        agent: r.get(1),
        reason: r.get(2),
        halted_at: u64_of(r.get(3)),
    }
}

fn encode(url: &str, what: &str, v: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|source| StoreError::Corrupt {
        path: url.to_owned(),
        what: what.to_owned(),
        source,
    })
}

impl PgStore {
    /// Connects to `url`, applies the migrations this hub knows, and starts listening.
    pub(crate) async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_as(url, HUB_APPLICATION).await
    }

    /// [`Self::connect`], the connections named `application` where the URL names none
    /// (what [`Self::hubs_connected`] tells hubs apart by).
    pub(crate) async fn connect_as(url: &str, application: &str) -> Result<Self, StoreError> {
        let shown = redact(url);
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(StoreError::BadUrl {
                url: shown,
                why: "give a postgres:// URL".into(),
            });
        }
        let (driver_url, root) = split_root_cert(url);
        let mut config =
            tokio_postgres::Config::from_str(&driver_url).map_err(|e| StoreError::BadUrl {
                url: shown.clone(),
                why: e.to_string(),
            })?;
        // A Unix socket is local: libpq never uses TLS on one, and a certificate
        // could not name it.
        let unix = !config.get_hosts().is_empty()
            && config
                .get_hosts()
                .iter()
                .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
        if unix {
            if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
                return Err(StoreError::BadUrl {
                    url: shown,
                    why: "sslmode=require needs a TCP host: a Unix socket is never TLS".into(),
                });
            }
            config.ssl_mode(tokio_postgres::config::SslMode::Disable);
        }
        if !unix && config.get_ssl_mode() == tokio_postgres::config::SslMode::Prefer {
            // `prefer` (also the driver's default) falls back to plain text when a
            // server, or whoever answers for it, declines TLS, and a password can then
            // be asked for in clear: over a network, TLS or nothing, unless the URL says
            // `sslmode=disable`.
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
        }
        config
            .keepalives(true)
            .keepalives_idle(DEAD_PEER / 3)
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3)
            .tcp_user_timeout(DEAD_PEER);
        let options = match config.get_options() {
            Some(o) if o.contains("statement_timeout") => o.to_owned(),
            Some(o) => format!("{o} -c statement_timeout={STATEMENT_TIMEOUT}"),
            None => format!("-c statement_timeout={STATEMENT_TIMEOUT}"),
        };
        config.options(options);
        // Renumbering must never pass for a hub (it would hold the hubs' lock), whatever
        // the URL names.
        if config.get_application_name().is_none() || application == RENUMBER_APPLICATION {
            config.application_name(application);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let tls = Tls(MakeRustlsConnect::new(tls_config(&shown, root)?));
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::BadUrl {
                url: shown.clone(),
                why: e.to_string(),
            })?;
        let origin = {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b).map_err(|e| StoreError::BadUrl {
                url: shown.clone(),
                why: format!("no randomness for the hub's replica id: {e}"),
            })?;
            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let store = Self {
            url: shown.clone(),
            pool,
            origin: origin.clone(),
            events: Mutex::new(Some(rx)),
            // Listening starts once the schema is there.
            listener: tokio::spawn(async {}),
            seen: seen.clone(),
        };
        store.migrate().await?;
        let (listening, ready) = tokio::sync::oneshot::channel();
        let listener = Listener {
            config,
            tls,
            url: shown.clone(),
            origin,
            tx,
            seen,
        };
        let mut store = store;
        store.listener = tokio::spawn(listener.run(listening));
        // Before anything is loaded: a change committed between the load and the first
        // LISTEN would otherwise never be announced.
        match tokio::time::timeout(CONNECT_TIMEOUT, ready).await {
            Ok(Ok(())) => Ok(store),
            _ => Err(StoreError::BadUrl {
                url: shown,
                why: format!(
                    "could not LISTEN for the other replicas' changes within {CONNECT_TIMEOUT:?}"
                ),
            }),
        }
    }

    fn err(&self) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
        move |source| StoreError::Postgres {
            url: self.url.clone(),
            source,
        }
    }

    async fn conn(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(|source| StoreError::Pool {
            url: self.url.clone(),
            source,
        })
    }

    /// Applies the migrations not applied yet, under the advisory lock, in one
    /// transaction: a replica that starts meanwhile waits, then finds them applied.
    async fn migrate(&self) -> Result<(), StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(&e)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS railgrid_migrations (
                version BIGINT PRIMARY KEY,
                applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
            )",
        )
        .await
        .map_err(&e)?;
        let row = tx
            .query_one(
                "SELECT COALESCE(MAX(version) FILTER (WHERE version <= $1), 0),
                        COALESCE(MAX(version) FILTER (WHERE version > $1), $1)
                 FROM railgrid_migrations",
                &[&REPLICA_BASE],
            )
            .await
            .map_err(&e)?;
        let (shared, replica): (i64, i64) = (row.get(0), row.get::<_, i64>(1) - REPLICA_BASE);
        let lists: [(i64, i64, Vec<String>); 2] = [
            (
                0,
                shared,
                MIGRATIONS
                    .iter()
                    .map(|m| m.replace("BLOB", "BYTEA"))
                    .collect(),
            ),
            (
                REPLICA_BASE,
                replica,
                REPLICA_MIGRATIONS.iter().map(|m| (*m).to_owned()).collect(),
            ),
        ];
        for (base, applied, list) in &lists {
            if *applied > list.len() as i64 {
                return Err(StoreError::NewerSchema {
                    path: self.url.clone(),
                    found: base + applied,
                    known: *base as usize + list.len(),
                });
            }
        }
        for (base, applied, list) in &lists {
            for (n, sql) in list.iter().enumerate().skip((*applied).max(0) as usize) {
                let version = base + n as i64 + 1;
                tx.batch_execute(sql).await.map_err(&e)?;
                tx.execute(
                    "INSERT INTO railgrid_migrations (version) VALUES ($1)",
                    &[&version],
                )
                .await
                .map_err(&e)?;
                tracing::info!(version, database = %self.url, "applied a hub schema migration");
            }
        }
        tx.commit().await.map_err(&e)?;
        Ok(())
    }

    /// `<origin> <kind> <generation> <key>`; generation 0 for a change that took none.
    fn payload(&self, kind: char, generation: u64, key: &str) -> String {
        format!("{} {kind} {generation} {key}", self.origin)
    }

    /// A generation this hub handed out, once committed.
    fn took(&self, generation: u64) {
        crate::util::lock(&self.seen).add(generation);
    }
}

/// A read-only transaction that sees one snapshot; rolled back if dropped (a pooled
/// connection never goes back to the pool inside it).
async fn snapshot(
    conn: &mut Object,
) -> Result<deadpool_postgres::Transaction<'_>, tokio_postgres::Error> {
    conn.build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
}

/// Tells the other hubs, on commit.
async fn notify(
    tx: &deadpool_postgres::Transaction<'_>,
    payload: &str,
) -> Result<(), tokio_postgres::Error> {
    tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &payload])
        .await
        .map(drop)
}

async fn next_generation(
    tx: &deadpool_postgres::Transaction<'_>,
    url: &str,
) -> Result<u64, StoreError> {
    let err = |source| StoreError::Postgres {
        url: url.to_owned(),
        source,
    };
    let row = tx
        .query_opt(NEXT_GENERATION, &[&(MAX_GENERATION as i64)])
        .await
        .map_err(err)?;
    row.map(|r| u64_of(r.get(0)))
        .ok_or_else(|| StoreError::GenerationsExhausted(url.to_owned()))
}

async fn bump_scope(
    tx: &deadpool_postgres::Transaction<'_>,
    scope: &str,
    url: &str,
) -> Result<u64, StoreError> {
    let generation = next_generation(tx, url).await?;
    tx.execute(
        "INSERT INTO desired (scope, generation, settings) VALUES ($1, $2, '{}')
         ON CONFLICT (scope) DO UPDATE SET generation = excluded.generation",
        &[&scope, &(generation as i64)],
    )
    .await
    .map_err(|source| StoreError::Postgres {
        url: url.to_owned(),
        source,
    })?;
    Ok(generation)
}

impl PgStore {
    /// Where the hubs connected to this database connect from (their connections as
    /// [`HUB_APPLICATION`] names them), for commands that must run with every hub stopped.
    pub(crate) async fn hubs_connected(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT DISTINCT coalesce(host(client_addr), 'a local socket')
                 FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = $1",
                &[&HUB_APPLICATION],
            )
            .await
            .map_err(self.err())?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn select_jobs(
        &self,
        conn: &impl GenericClient,
        query: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<JobRow>, StoreError> {
        let stmt = conn.prepare_cached(query).await.map_err(self.err())?;
        let rows = conn.query(&stmt, params).await.map_err(self.err())?;
        rows.iter().map(|r| job_row(&self.url, r)).collect()
    }

    async fn fleet_snapshot(&self, conn: &impl GenericClient) -> Result<FleetSnapshot, StoreError> {
        let e = self.err();
        let generation: i64 = conn
            .query_one("SELECT value FROM meta WHERE key = 'generation'", &[])
            .await
            .map_err(&e)?
            .get(0);
        let scope = conn
            .query_opt(
                "SELECT scope, generation, settings FROM desired WHERE scope = ''",
                &[],
            )
            .await
            .map_err(&e)?
            .map(|r| scope_row(&self.url, &r))
            .transpose()?;
        let releases = conn
            .query(
                "SELECT version, os, arch, size, sha256, signature, key_id, published_at
                 FROM releases ORDER BY published_at, version, os, arch",
                &[],
            )
            .await
            .map_err(&e)?
            .iter()
            .map(release_row)
            .collect();
        let halts = conn
            .query(
                "SELECT version, agent, reason, halted_at FROM halts ORDER BY version",
                &[],
            )
            .await
            .map_err(&e)?
            .iter()
            .map(halt_row)
            .collect();
        Ok(FleetSnapshot {
            scope,
            generation: u64_of(generation),
            releases,
            halts,
        })
    }
}

impl Store for PgStore {
    async fn load(&self) -> Result<Snapshot, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        // One snapshot of the whole database: agents and jobs agree with each other.
        let conn = snapshot(&mut conn).await.map_err(&e)?;
        let result = async {
            let fleet = self.fleet_snapshot(&conn).await?;
            let agents = conn
                .query(
                    &format!("SELECT {AGENT_COLUMNS} FROM agents ORDER BY id"),
                    &[],
                )
                .await
                .map_err(&e)?
                .iter()
                .map(agent_row)
                .collect();
            let scopes = conn
                .query(
                    "SELECT scope, generation, settings FROM desired ORDER BY scope",
                    &[],
                )
                .await
                .map_err(&e)?
                .iter()
                .map(|r| scope_row(&self.url, r))
                .collect::<Result<Vec<_>, _>>()?;
            let open_jobs = self
                .select_jobs(
                    &conn,
                    &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE done = 0 ORDER BY seq"),
                    &[],
                )
                .await?;
            Ok(Snapshot {
                agents,
                scopes,
                open_jobs,
                generation: fleet.generation,
                releases: fleet.releases,
                halts: fleet.halts,
            })
        }
        .await;
        conn.commit().await.map_err(&e)?;
        if let Ok(snap) = &result {
            crate::util::lock(&self.seen).loaded(snap.generation);
        }
        result
    }

    async fn enrol(
        &self,
        id: &str,
        token_sha256: &str,
        now: u64,
    ) -> Result<Option<u64>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let existing = tx
            .query_opt(
                "SELECT revoked_at FROM agents WHERE id = $1 FOR UPDATE",
                &[&id],
            )
            .await
            .map_err(&e)?;
        if let Some(row) = existing {
            if row.get::<_, Option<i64>>(0).is_none() {
                return Ok(None);
            }
        }
        // Two replicas enrolling one id at once: the second waits on the first's row
        // and finds it enrolled.
        let inserted = tx
            .execute(
                "INSERT INTO agents (id, token_sha256, enrolled_at, observed_generation)
                 VALUES ($1, $2, $3, 0)
                 ON CONFLICT (id) DO UPDATE SET token_sha256 = excluded.token_sha256,
                     enrolled_at = excluded.enrolled_at, revoked_at = NULL
                 WHERE agents.revoked_at IS NOT NULL",
                &[&id, &token_sha256, &(now as i64)],
            )
            .await
            .map_err(&e)?;
        if inserted == 0 {
            return Ok(None);
        }
        let generation = bump_scope(&tx, id, &self.url).await?;
        notify(&tx, &self.payload('a', generation, id))
            .await
            .map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        self.took(generation);
        Ok(Some(generation))
    }

    async fn revoke(&self, id: &str, now: u64) -> Result<Option<u64>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let n = tx
            .execute(
                "UPDATE agents SET revoked_at = $2 WHERE id = $1",
                &[&id, &(now as i64)],
            )
            .await
            .map_err(&e)?;
        if n == 0 {
            return Ok(None);
        }
        let generation = bump_scope(&tx, id, &self.url).await?;
        notify(&tx, &self.payload('a', generation, id))
            .await
            .map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        self.took(generation);
        Ok(Some(generation))
    }

    async fn renumber(&self) -> Result<u64, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let alone: bool = tx
            .query_one(
                &format!("SELECT pg_try_advisory_xact_lock({HUBS_LOCK})"),
                &[],
            )
            .await
            .map_err(&e)?
            .get(0);
        if !alone {
            return Err(StoreError::HubsRunning(self.url.clone()));
        }
        let was: i64 = tx
            .query_one(
                "SELECT value FROM meta WHERE key = 'generation' FOR UPDATE",
                &[],
            )
            .await
            .map_err(&e)?
            .get(0);
        for statement in super::RENUMBER {
            tx.execute(statement, &[]).await.map_err(&e)?;
        }
        tx.commit().await.map_err(&e)?;
        Ok(u64_of(was))
    }

    async fn set_scope(
        &self,
        scope: &str,
        settings: &DesiredSettings,
        base: Option<&DesiredSettings>,
    ) -> Result<Result<u64, DesiredSettings>, StoreError> {
        let json = encode(&self.url, "desired settings to store", settings)?;
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        // The generation row first, as every writer takes it: one lock order.
        let generation = next_generation(&tx, &self.url).await?;
        if let Some(base) = base {
            let stored: Option<String> = tx
                .query_opt(
                    "SELECT settings FROM desired WHERE scope = $1 FOR UPDATE",
                    &[&scope],
                )
                .await
                .map_err(&e)?
                .map(|r| r.get(0));
            let stored = parse_settings(&self.url, scope, stored.as_deref())?;
            if stored != *base {
                // Rolled back with the transaction: the counter does not move.
                return Ok(Err(stored));
            }
        }
        tx.execute(
            "INSERT INTO desired (scope, generation, settings) VALUES ($1, $2, $3)
             ON CONFLICT (scope) DO UPDATE SET generation = excluded.generation,
                 settings = excluded.settings",
            &[&scope, &(generation as i64), &json],
        )
        .await
        .map_err(&e)?;
        let payload = if scope.is_empty() {
            self.payload('f', generation, "")
        } else {
            self.payload('a', generation, scope)
        };
        notify(&tx, &payload).await.map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        self.took(generation);
        Ok(Ok(generation))
    }

    async fn record_reports(&self, batch: Vec<ReportRow>) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        // One statement for the batch: a thousand reports are one round trip. Rows in
        // id order, as every replica locks them (no deadlock between two flushes), and
        // never an older report over a newer one another replica wrote.
        let mut batch = batch;
        batch.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        let ids: Vec<&str> = batch.iter().map(|r| r.id.as_str()).collect();
        let seen: Vec<i64> = batch.iter().map(|r| r.seen_at as i64).collect();
        let observed: Vec<i64> = batch.iter().map(|r| r.observed_generation as i64).collect();
        let reports: Vec<&str> = batch.iter().map(|r| r.report.as_str()).collect();
        tx.execute(
            "UPDATE agents SET last_seen = b.seen, observed_generation = b.observed,
                 report = b.report
             FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[])
                 AS b(id, seen, observed, report)
             WHERE agents.id = b.id AND (agents.last_seen IS NULL OR agents.last_seen <= b.seen)",
            &[&ids, &seen, &observed, &reports],
        )
        .await
        .map_err(&e)?;
        tx.commit().await.map_err(&e)
    }

    async fn insert_job(&self, job: &JobRow) -> Result<Option<(u64, u64)>, StoreError> {
        let spec = encode(&self.url, "a job spec to store", &job.spec)?;
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let generation = bump_scope(&tx, &job.agent, &self.url).await?;
        let seq: i64 = tx
            .query_one(
                "UPDATE meta SET value = value + 1 WHERE key = 'job_seq' RETURNING value",
                &[],
            )
            .await
            .map_err(&e)?
            .get(0);
        let n = tx
            .execute(
                "INSERT INTO jobs (id, seq, agent, spec, created_ms, state)
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
                &[
                    &job.id,
                    &seq,
                    &job.agent,
                    &spec,
                    &(job.created_ms as i64),
                    &job.progress.state,
                ],
            )
            .await
            .map_err(&e)?;
        if n == 0 {
            return Ok(None);
        }
        notify(&tx, &self.payload('a', generation, &job.agent))
            .await
            .map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        self.took(generation);
        Ok(Some((u64_of(seq), generation)))
    }

    async fn update_jobs(
        &self,
        agent: &str,
        jobs: Vec<(String, JobProgress)>,
        bump: bool,
    ) -> Result<Option<u64>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let generation = if bump {
            Some(bump_scope(&tx, agent, &self.url).await?)
        } else {
            None
        };
        // Each replica writes from its own copy of the job: the statement keeps what
        // another may have written meanwhile. A cancel asked stays asked, an ended job's
        // outcome stays as it ended, and a done job is not touched.
        let stmt = tx
            .prepare_cached(&format!(
                "UPDATE jobs SET
                     cancel_requested = GREATEST(cancel_requested, $3),
                     state = CASE WHEN state IN ({OPEN}) THEN $2 ELSE state END,
                     exit_code = CASE WHEN state IN ({OPEN}) THEN $4 ELSE exit_code END,
                     exit_signal = CASE WHEN state IN ({OPEN}) THEN $5 ELSE exit_signal END,
                     error = CASE WHEN state IN ({OPEN}) THEN $6 ELSE error END,
                     finished_ms = CASE WHEN state IN ({OPEN}) THEN $7 ELSE finished_ms END,
                     stdout_bytes = GREATEST(stdout_bytes, $8),
                     stderr_bytes = GREATEST(stderr_bytes, $9),
                     runner_truncated = COALESCE($10, runner_truncated), done = $11,
                     started_ms = COALESCE(started_ms, $12)
                 WHERE id = $1 AND done = 0",
                OPEN = OPEN_STATES
            ))
            .await
            .map_err(&e)?;
        // In id order, as every replica locks them.
        let mut jobs = jobs;
        jobs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (id, p) in &jobs {
            let truncated = p
                .runner_truncated
                .as_ref()
                .map(|t| encode(&self.url, "a truncation to store", t))
                .transpose()?;
            tx.execute(
                &stmt,
                &[
                    id,
                    &p.state,
                    &(p.cancel_requested as i64),
                    &p.exit_code.map(i64::from),
                    &p.signal.map(i64::from),
                    &p.error,
                    &p.finished_ms.map(|m| m as i64),
                    &(p.stdout_bytes as i64),
                    &(p.stderr_bytes as i64),
                    &truncated,
                    &(p.done as i64),
                    &p.started_ms.map(|m| m as i64),
                ],
            )
            .await
            .map_err(&e)?;
        }
        notify(&tx, &self.payload('a', generation.unwrap_or(0), agent))
            .await
            .map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        if let Some(g) = generation {
            self.took(g);
        }
        Ok(generation)
    }

    async fn append_output(
        &self,
        job: &str,
        stream: Stream,
        offset: u64,
        data: bytes::Bytes,
        cap: u64,
    ) -> Result<Appended, StoreError> {
        let e = self.err();
        let s = stream.name();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        // The job's row locked: an upload through another replica (an agent that moved
        // mid-upload, its first request still in flight) waits, then sees this length.
        let lens = tx
            .query_opt(
                &format!("SELECT {s}_length, {s}_stored, done FROM jobs WHERE id = $1 FOR UPDATE"),
                &[&job],
            )
            .await
            .map_err(&e)?;
        let Some(row) = lens else {
            return Ok(Appended::NoJob);
        };
        let stored = u64_of(row.get(1));
        let done = row.get::<_, i64>(2) != 0;
        let (skip, keep, length) =
            match plan_append(u64_of(row.get(0)), stored, done, offset, data.len(), cap) {
                AppendPlan::Answer(a) => return Ok(a),
                AppendPlan::Take { skip, keep, length } => (skip, keep, length),
            };
        if keep > 0 {
            tx.execute(
                "INSERT INTO job_output (job, stream, start, data) VALUES ($1, $2, $3, $4)",
                &[&job, &s, &(stored as i64), &&data[skip..skip + keep]],
            )
            .await
            .map_err(&e)?;
        }
        tx.execute(
            &format!("UPDATE jobs SET {s}_length = $2, {s}_stored = $3 WHERE id = $1"),
            &[&job, &(length as i64), &((stored + keep as u64) as i64)],
        )
        .await
        .map_err(&e)?;
        notify(&tx, &self.payload('o', 0, job)).await.map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        Ok(Appended::Length(length))
    }

    async fn read_output(
        &self,
        job: &str,
        stream: Stream,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<u8>, StoreError> {
        let conn = self.conn().await?;
        let offset = offset.min(i64::MAX as u64);
        let stmt = conn
            .prepare_cached(
                "SELECT start, data FROM job_output
                 WHERE job = $1 AND stream = $2 AND start >= COALESCE(
                     (SELECT MAX(start) FROM job_output
                      WHERE job = $1 AND stream = $2 AND start <= $3), 0)
                 ORDER BY start",
            )
            .await
            .map_err(self.err())?;
        let rows = conn
            .query(&stmt, &[&job, &stream.name(), &(offset as i64)])
            .await
            .map_err(self.err())?;
        let mut out = Vec::new();
        for row in rows {
            let start = u64_of(row.get(0));
            let data: &[u8] = row.get(1);
            let from = offset.saturating_sub(start).min(data.len() as u64) as usize;
            let take = (data.len() - from).min(limit - out.len());
            out.extend_from_slice(&data[from..from + take]);
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    async fn get_job(&self, id: &str) -> Result<Option<JobRow>, StoreError> {
        let conn = self.conn().await?;
        let mut rows = self
            .select_jobs(
                &conn,
                &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"),
                &[&id],
            )
            .await?;
        Ok(rows.pop())
    }

    async fn job_agent(&self, id: &str) -> Result<Option<String>, StoreError> {
        let conn = self.conn().await?;
        let row = conn
            .query_opt("SELECT agent FROM jobs WHERE id = $1", &[&id])
            .await
            .map_err(self.err())?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn list_jobs(
        &self,
        agent: Option<&str>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<JobRow>, StoreError> {
        let conn = self.conn().await?;
        let before = before.map_or(i64::MAX, |b| b.min(i64::MAX as u64) as i64);
        let limit = limit as i64;
        match agent {
            Some(a) => {
                self.select_jobs(
                    &conn,
                    &format!(
                        "SELECT {JOB_COLUMNS} FROM jobs WHERE agent = $1 AND seq < $2
                         ORDER BY seq DESC LIMIT $3"
                    ),
                    &[&a, &before, &limit],
                )
                .await
            }
            None => {
                self.select_jobs(
                    &conn,
                    &format!(
                        "SELECT {JOB_COLUMNS} FROM jobs WHERE seq < $1 ORDER BY seq DESC LIMIT $2"
                    ),
                    &[&before, &limit],
                )
                .await
            }
        }
    }

    async fn retain_jobs(&self, keep: usize) -> Result<usize, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        // Every replica retains: one at a time, the others skip this round.
        let got: bool = tx
            .query_one(
                "SELECT pg_try_advisory_xact_lock($1)",
                &[&(MIGRATION_LOCK + 1)],
            )
            .await
            .map_err(&e)?
            .get(0);
        if !got {
            return Ok(0);
        }
        let done: i64 = tx
            .query_one("SELECT COUNT(*) FROM jobs WHERE done = 1", &[])
            .await
            .map_err(&e)?
            .get(0);
        let over = (u64_of(done) as usize).saturating_sub(keep);
        if over == 0 {
            return Ok(0);
        }
        let ids: Vec<String> = tx
            .query(
                "SELECT id FROM jobs WHERE done = 1 ORDER BY seq LIMIT $1",
                &[&(over as i64)],
            )
            .await
            .map_err(&e)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        tx.execute("DELETE FROM job_output WHERE job = ANY($1)", &[&ids])
            .await
            .map_err(&e)?;
        tx.execute("DELETE FROM jobs WHERE id = ANY($1)", &[&ids])
            .await
            .map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        Ok(ids.len())
    }

    async fn put_release(&self, row: &ReleaseRow) -> Result<u64, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let generation = bump_scope(&tx, "", &self.url).await?;
        tx.execute(
            "INSERT INTO releases (version, os, arch, size, sha256, signature, key_id, published_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (version, os, arch) DO UPDATE SET size = excluded.size,
                 sha256 = excluded.sha256, signature = excluded.signature,
                 key_id = excluded.key_id, published_at = excluded.published_at",
            &[
                &row.version,
                &row.os,
                &row.arch,
                &(row.size as i64),
                &row.sha256,
                &row.signature,
                &row.key_id,
                &(row.published_at as i64),
            ],
        )
        .await
        .map_err(&e)?;
        notify(&tx, &self.payload('f', generation, ""))
            .await
            .map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        self.took(generation);
        Ok(generation)
    }

    async fn set_halt(&self, version: &str, halt: Option<&HaltRow>) -> Result<u64, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let generation = bump_scope(&tx, "", &self.url).await?;
        match halt {
            Some(h) => {
                tx.execute(
                    "INSERT INTO halts (version, agent, reason, halted_at) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (version) DO UPDATE SET agent = excluded.agent,
                         reason = excluded.reason, halted_at = excluded.halted_at",
                    &[&version, &h.agent, &h.reason, &(h.halted_at as i64)],
                )
                .await
            }
            None => {
                tx.execute("DELETE FROM halts WHERE version = $1", &[&version])
                    .await
            }
        }
        .map_err(&e)?;
        notify(&tx, &self.payload('f', generation, ""))
            .await
            .map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        self.took(generation);
        Ok(generation)
    }

    fn replicated(&self) -> bool {
        true
    }

    fn events(&self) -> Option<mpsc::UnboundedReceiver<Event>> {
        crate::util::lock(&self.events).take()
    }

    async fn load_agent(&self, id: &str) -> Result<Option<AgentSnapshot>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let conn = snapshot(&mut conn).await.map_err(&e)?;
        let result = async {
            let Some(agent) = conn
                .query_opt(
                    &format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = $1"),
                    &[&id],
                )
                .await
                .map_err(&e)?
            else {
                return Ok(None);
            };
            let scope = conn
                .query_opt(
                    "SELECT scope, generation, settings FROM desired WHERE scope = $1",
                    &[&id],
                )
                .await
                .map_err(&e)?
                .map(|r| scope_row(&self.url, &r))
                .transpose()?;
            let open_jobs = self
                .select_jobs(
                    &conn,
                    &format!(
                        "SELECT {JOB_COLUMNS} FROM jobs WHERE agent = $1 AND done = 0 ORDER BY seq"
                    ),
                    &[&id],
                )
                .await?;
            Ok(Some(AgentSnapshot {
                agent: agent_row(&agent),
                scope,
                open_jobs,
            }))
        }
        .await;
        conn.commit().await.map_err(&e)?;
        result
    }

    async fn in_sync(&self) -> Result<bool, StoreError> {
        let newest = self.generation().await?;
        Ok(crate::util::lock(&self.seen).check(newest))
    }

    async fn load_fleet(&self) -> Result<FleetSnapshot, StoreError> {
        let conn = self.conn().await?;
        self.fleet_snapshot(&conn).await
    }

    async fn generation(&self) -> Result<u64, StoreError> {
        let conn = self.conn().await?;
        let row = conn
            .query_one("SELECT value FROM meta WHERE key = 'generation'", &[])
            .await
            .map_err(self.err())?;
        Ok(u64_of(row.get(0)))
    }

    async fn load_agents(&self) -> Result<Vec<AgentRow>, StoreError> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                &format!("SELECT {AGENT_COLUMNS} FROM agents ORDER BY id"),
                &[],
            )
            .await
            .map_err(self.err())?;
        Ok(rows.iter().map(agent_row).collect())
    }

    async fn shared_secret(&self, name: &str, value: String) -> Result<String, StoreError> {
        let e = self.err();
        let conn = self.conn().await?;
        conn.execute(
            "INSERT INTO hub_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
            &[&name, &value],
        )
        .await
        .map_err(&e)?;
        let row = conn
            .query_one("SELECT value FROM hub_secrets WHERE name = $1", &[&name])
            .await
            .map_err(&e)?;
        Ok(row.get(0))
    }

    async fn get_secret(&self, name: &str) -> Result<Option<String>, StoreError> {
        let conn = self.conn().await?;
        let row = conn
            .query_opt("SELECT value FROM hub_secrets WHERE name = $1", &[&name])
            .await
            .map_err(self.err())?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn put_blob(&self, sha256: &str, data: Vec<u8>) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        conn.execute(
            "INSERT INTO release_blobs (sha256, data) VALUES ($1, $2) ON CONFLICT (sha256) DO NOTHING",
            &[&sha256, &data],
        )
        .await
        .map_err(self.err())?;
        Ok(())
    }

    async fn get_blob(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let conn = self.conn().await?;
        let row = conn
            .query_opt(
                "SELECT data FROM release_blobs WHERE sha256 = $1",
                &[&sha256],
            )
            .await
            .map_err(self.err())?;
        Ok(row.map(|r| r.get(0)))
    }
}

/// The task that listens for the other hubs' notifications, on a connection of its own.
struct Listener {
    config: tokio_postgres::Config,
    tls: Tls,
    url: String,
    origin: String,
    tx: mpsc::UnboundedSender<Event>,
    seen: Arc<Mutex<Seen>>,
}

impl Listener {
    async fn run(self, listening: tokio::sync::oneshot::Sender<()>) {
        let mut listening = Some(listening);
        let mut pause = Duration::from_millis(200);
        loop {
            match self.listen(&mut listening, &mut pause).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(database = %self.url, error = %crate::util::error_chain(&e), "lost the hub database's notifications; listening again (everything is loaded again once it is back)");
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LISTEN_BACKOFF_MAX);
        }
    }

    /// Listens until the connection fails (`Err`) or the store is gone (`Ok`). The first
    /// time, `listening` is told once LISTEN is in place; every later time, the hub is
    /// told to load everything (what changed meanwhile was announced to nobody).
    async fn listen(
        &self,
        listening: &mut Option<tokio::sync::oneshot::Sender<()>>,
        pause: &mut Duration,
    ) -> Result<(), ListenError> {
        use futures_util::StreamExt;
        let (client, mut connection) = self.config.connect(self.tls.clone()).await?;
        let (ntx, mut nrx) = mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(m) = messages.next().await {
                match m {
                    Ok(AsyncMessage::Notification(n)) => {
                        if ntx.send(Ok(n.payload().to_owned())).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = ntx.send(Err(e));
                        return;
                    }
                }
            }
        });
        let _abort = AbortOnDrop(driver);
        // Held for the connection's life, by every hub: `hub store renumber` runs only
        // when it can take the lock exclusively, so never beside a running hub.
        if self.config.get_application_name() != Some(RENUMBER_APPLICATION) {
            client
                .batch_execute(&format!("SELECT pg_advisory_lock_shared({HUBS_LOCK})"))
                .await?;
        }
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        *pause = Duration::from_millis(200);
        match listening.take() {
            Some(tx) => {
                let _ = tx.send(());
            }
            None => {
                if self.tx.send(Event::Resync).is_err() {
                    return Ok(());
                }
            }
        }
        let mut ping = tokio::time::interval(LISTEN_PING);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ping.tick().await;
        loop {
            tokio::select! {
                // Cancel-safe: mpsc::recv loses no message when another arm wins.
                m = nrx.recv() => {
                    let Some(m) = m else {
                        // The connection ended without an error: the server closed it.
                        return Err(ListenError::Silent);
                    };
                    let payload = m?;
                    let Some((generation, event)) = parse(&payload, &self.origin) else {
                        continue;
                    };
                    if generation > 0 {
                        crate::util::lock(&self.seen).add(generation);
                    }
                    if let Some(event) = event {
                        if self.tx.send(event).is_err() {
                            return Ok(());
                        }
                    }
                }
                // A connection whose peer vanished says nothing: a query that must come
                // back proves it is still the one notifications arrive on.
                _ = ping.tick() => {
                    match tokio::time::timeout(LISTEN_PING, client.batch_execute("SELECT 1")).await {
                        Ok(r) => r?,
                        Err(_) => return Err(ListenError::Silent),
                    }
                    if self.tx.is_closed() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ListenError {
    #[error(transparent)]
    Postgres(#[from] tokio_postgres::Error),
    #[error("the listening connection went silent")]
    Silent,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The generation a notification names, and its event unless this hub sent it.
fn parse(payload: &str, own: &str) -> Option<(u64, Option<Event>)> {
    let mut parts = payload.splitn(4, ' ');
    let (origin, kind) = (parts.next()?, parts.next()?);
    let generation = parts.next()?.parse().ok()?;
    let key = parts.next().unwrap_or("");
    if origin == own {
        return Some((generation, None));
    }
    let event = match kind {
        "a" => Event::Agent(key.to_owned()),
        "f" => Event::Fleet,
        "o" => Event::Output(key.to_owned()),
        _ => return None,
    };
    Some((generation, Some(event)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redact("postgres://hub:s3cret@db.example:5432/railgrid?sslmode=require"),
            "postgres://hub:***@db.example:5432/railgrid?sslmode=require"
        );
        assert_eq!(
            redact("postgresql://db/railgrid?user=hub&password=s3cret"),
            "postgresql://db/railgrid?user=hub&password=***"
        );
        assert_eq!(redact("postgres://hub@db/x"), "postgres://hub@db/x");
        // An unencoded `@` in the password, a key in another case or percent-encoded.
        let leaks = [
            "postgresql://u:Ab@cdSECRET@/db?host=/s",
            "postgresql:///db?host=/s&user=u&pass%77ord=SECRET",
            "postgresql:///db?user=u&PASSWORD=SECRET",
            "postgresql:///db?user=u&%70assword=SECRET",
        ];
        for url in leaks {
            assert!(!redact(url).contains("SECRET"), "{url}: {}", redact(url));
        }
        assert!(!redact("nonsense s3cret").contains("s3cret"));
    }

    #[test]
    fn the_root_certificate_is_taken_out_of_the_url() {
        assert_eq!(
            split_root_cert("postgres://db/x?sslmode=require&sslrootcert=/etc/ca.pem"),
            (
                "postgres://db/x?sslmode=require".to_owned(),
                Some(PathBuf::from("/etc/ca.pem"))
            )
        );
        assert_eq!(
            split_root_cert("postgres://db/x?sslrootcert=/ca"),
            ("postgres://db/x".to_owned(), Some(PathBuf::from("/ca")))
        );
        assert_eq!(
            split_root_cert("postgres://db/x"),
            ("postgres://db/x".into(), None)
        );
    }

    #[test]
    fn notifications_name_their_change_and_skip_our_own() {
        assert_eq!(
            parse("ab a 7 web-1", "cd"),
            Some((7, Some(Event::Agent("web-1".into()))))
        );
        assert_eq!(parse("ab f 8 ", "cd"), Some((8, Some(Event::Fleet))));
        assert_eq!(
            parse("ab o 0 j1", "cd"),
            Some((0, Some(Event::Output("j1".into()))))
        );
        assert_eq!(parse("cd a 9 web-1", "cd"), Some((9, None)));
        assert_eq!(parse("ab z 1 x", "cd"), None);
        assert_eq!(parse("ab a x web-1", "cd"), None);
        assert_eq!(parse("", "cd"), None);
    }

    #[test]
    fn a_missed_generation_is_found_after_one_more_check() {
        let mut seen = Seen::default();
        seen.loaded(10);
        seen.add(12);
        seen.add(11);
        assert!(seen.check(12), "all seen");
        seen.add(14);
        // 13 may be a notification in flight: one check of grace.
        assert!(seen.check(14));
        assert!(!seen.check(14), "13 never came");
        seen.loaded(14);
        assert!(seen.check(14));
        assert_eq!(seen.synced, 14);
    }
}
