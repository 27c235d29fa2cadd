//! The replicated store: PostgreSQL, shared by any number of stateless hubs.
//!
//! - **The same statements as SQLite** ([`crate::migrations::MIGRATIONS`], with `BYTEA` for
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

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio::sync::mpsc;
use tokio_postgres_rustls::MakeRustlsConnect;

mod access;
mod copy;
mod exec;
mod jobs;
mod listen;
mod rollouts;
mod secrets;
mod tls;

pub use self::copy::CopyTarget;
use self::listen::{Listener, Seen};
pub use self::tls::redact;
use self::tls::{split_root_cert, tls_config, Tls};
use super::{
    AgentRow, AgentSnapshot, Enrol, Event, FleetSnapshot, HaltRow, Labels, ReleaseRow, ReportRow,
    Snapshot, Store, StoreError,
};
use crate::encode;
use crate::fleet;
use crate::migrations::MIGRATIONS;
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
/// The name `hub store renumber` and `hub store copy` connect with: they hold no hub's
/// lock, and take it exclusively to work alone.
pub const MAINTENANCE_APPLICATION: &str = "railgrid-hub-maintenance";
/// The advisory lock every running hub holds shared (on its listening connection), and
/// `hub store renumber` takes exclusively.
const HUBS_LOCK: i64 = 0x7261_696c_6875_6273; // "railhubs"

pub struct PgStore {
    /// The URL without its password, for messages.
    url: String,
    pool: Pool,
    /// This hub, in its notifications.
    origin: String,
    events: Mutex<Option<mpsc::UnboundedReceiver<Event>>>,
    listener: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<Seen>>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl PgStore {
    /// Connects to `url`, applies the migrations this hub knows, and starts listening.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_as(url, HUB_APPLICATION).await
    }

    /// [`Self::connect`], the connections named `application` where the URL names none
    /// (what [`Self::hubs_connected`] tells hubs apart by).
    pub async fn connect_as(url: &str, application: &str) -> Result<Self, StoreError> {
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
        // Maintenance must never pass for a hub (it would hold the hubs' lock), whatever
        // the URL names.
        if config.get_application_name().is_none() || application == MAINTENANCE_APPLICATION {
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

    /// Takes the hubs' lock exclusively for `conn`'s transaction, or refuses: the
    /// maintenance that must run with no hub on the database (renumber, copy).
    async fn alone(&self, conn: &impl GenericClient) -> Result<(), StoreError> {
        let alone: bool = conn
            .query_one(
                &format!("SELECT pg_try_advisory_xact_lock({HUBS_LOCK})"),
                &[],
            )
            .await
            .map_err(self.err())?
            .get(0);
        if alone {
            Ok(())
        } else {
            Err(StoreError::HubsRunning(self.url.clone()))
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

impl PgStore {
    /// Where the hubs connected to this database connect from (their connections as
    /// [`HUB_APPLICATION`] names them), for commands that must run with every hub stopped.
    pub async fn hubs_connected(&self) -> Result<Vec<String>, StoreError> {
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
}

/// The bodies of `crate::fleet`: whole loads in one read-only snapshot, changes in a
/// transaction that tells the other hubs at commit.
impl Store for PgStore {
    async fn load(&self) -> Result<Snapshot, StoreError> {
        // One snapshot of the whole database: agents and jobs agree with each other.
        let snap = self.snapshot(async |t| fleet::load(t).await).await?;
        crate::util::lock(&self.seen).loaded(snap.generation);
        Ok(snap)
    }

    async fn enrol(
        &self,
        id: &str,
        token_sha256: &str,
        now: u64,
        reuse_revoked: bool,
    ) -> Result<Enrol, StoreError> {
        self.transact(async |t| fleet::enrol(t, id, token_sha256, now, reuse_revoked).await)
            .await
    }

    async fn revoke(&self, id: &str, now: u64) -> Result<Option<u64>, StoreError> {
        self.transact(async |t| fleet::revoke(t, id, now).await)
            .await
    }

    async fn renumber(&self) -> Result<u64, StoreError> {
        self.transact(async |t| fleet::renumber(t).await).await
    }

    async fn set_scope(
        &self,
        scope: &str,
        settings: &DesiredSettings,
        base: Option<&DesiredSettings>,
    ) -> Result<Result<u64, DesiredSettings>, StoreError> {
        let json = encode(&self.url, "desired settings to store", settings)?;
        self.transact(async |t| fleet::set_scope(t, scope, &json, base).await)
            .await
    }

    async fn record_reports(&self, batch: Vec<ReportRow>) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.transact(async |t| fleet::record_reports(t, batch).await)
            .await
    }

    async fn put_release(&self, row: &ReleaseRow) -> Result<u64, StoreError> {
        self.transact(async |t| fleet::put_release(t, row).await)
            .await
    }

    async fn change_labels(
        &self,
        id: &str,
        set: &Labels,
        remove: &[String],
    ) -> Result<Option<(u64, Labels)>, StoreError> {
        self.transact(async |t| fleet::change_labels(t, id, set, remove).await)
            .await
    }

    async fn set_halt(&self, version: &str, halt: Option<&HaltRow>) -> Result<u64, StoreError> {
        self.transact(async |t| fleet::set_halt(t, version, halt).await)
            .await
    }

    fn replicated(&self) -> bool {
        true
    }

    fn events(&self) -> Option<mpsc::UnboundedReceiver<Event>> {
        crate::util::lock(&self.events).take()
    }

    async fn load_agent(&self, id: &str) -> Result<Option<AgentSnapshot>, StoreError> {
        self.snapshot(async |t| fleet::agent(t, id).await).await
    }

    async fn in_sync(&self) -> Result<bool, StoreError> {
        let newest = self.generation().await?;
        Ok(crate::util::lock(&self.seen).check(newest))
    }

    async fn load_fleet(&self) -> Result<FleetSnapshot, StoreError> {
        self.plain(async |t| fleet::fleet(t).await).await
    }

    async fn generation(&self) -> Result<u64, StoreError> {
        self.plain(async |t| fleet::generation(t).await).await
    }

    async fn load_agents(&self) -> Result<Vec<AgentRow>, StoreError> {
        self.plain(async |t| fleet::agents(t).await).await
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
