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
use tokio_postgres::types::ToSql;
use tokio_postgres_rustls::MakeRustlsConnect;

mod access;
mod copy;
mod exec;
mod jobs;
mod listen;
mod rollouts;
mod rows;
mod secrets;
mod tls;
mod tx;

pub use self::copy::CopyTarget;
use self::listen::{Listener, Seen};
use self::rows::*;
pub use self::tls::redact;
use self::tls::{split_root_cert, tls_config, Tls};
use self::tx::{next_generation, notify, snapshot};
use super::{
    merge_labels, plan_append, AgentRow, AgentSnapshot, AppendPlan, Appended, Assigned, Assignment,
    Enrol, Event, FleetSnapshot, HaltRow, JobFilter, JobProgress, JobRow, JobStore, Labels,
    ReleaseRow, ReportRow, Snapshot, Store, StoreError, Stream,
};
use crate::migrations::MIGRATIONS;
use crate::parse_settings;
use crate::proto::desired::MAX_GENERATION;
use crate::proto::hub::DesiredSettings;
use crate::sql::{self, JOB_COLUMNS};

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

const AGENT_COLUMNS: &str = "a.id, a.token_sha256, a.enrolled_at, a.revoked_at, a.last_seen,
    a.observed_generation, a.report, a.labels, a.next_token_sha256, a.rotate_asked,
    a.token_issued_ms, COALESCE(j.version, 0)";
/// The agents with their jobs' version (`agent_jobs`, migration 15).
const AGENTS: &str = "agents a LEFT JOIN agent_jobs j ON j.agent = a.id";

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

    /// The end of every change to a scope (`""`: the fleet): the other hubs are told (a
    /// NOTIFY is delivered at commit, so never of a change that did not commit), the
    /// transaction commits, and the generation it took, if any, counts as this hub's own.
    async fn commit_change(
        &self,
        tx: deadpool_postgres::Transaction<'_>,
        scope: &str,
        generation: Option<u64>,
    ) -> Result<(), StoreError> {
        let e = self.err();
        let kind = if scope.is_empty() { 'f' } else { 'a' };
        notify(&tx, &self.payload(kind, generation.unwrap_or(0), scope))
            .await
            .map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        if let Some(g) = generation {
            self.took(g);
        }
        Ok(())
    }

    /// A change to one scope that moves it: its generation is bumped, the change commits,
    /// and the generation is returned.
    async fn bump_and_commit(
        &self,
        tx: deadpool_postgres::Transaction<'_>,
        scope: &str,
    ) -> Result<u64, StoreError> {
        let generation = bump_scope(&tx, scope, &self.url).await?;
        self.commit_change(tx, scope, Some(generation)).await?;
        Ok(generation)
    }

    /// One statement on agent `id`'s row; when it changed the row, the agent's scope moves
    /// (the other hubs reload it) and its new generation is returned; else nothing changed.
    async fn change_agent(
        &self,
        id: &str,
        statement: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<u64>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        if tx.execute(statement, params).await.map_err(&e)? == 0 {
            return Ok(None);
        }
        self.bump_and_commit(tx, id).await.map(Some)
    }

    /// [`Self::commit_change`] for several agents' scopes, each with the generation it
    /// took.
    async fn commit_changes(
        &self,
        tx: deadpool_postgres::Transaction<'_>,
        scopes: &[(&str, u64)],
    ) -> Result<(), StoreError> {
        let e = self.err();
        for (scope, generation) in scopes {
            notify(&tx, &self.payload('a', *generation, scope))
                .await
                .map_err(&e)?;
        }
        tx.commit().await.map_err(&e)?;
        for (_, generation) in scopes {
            self.took(*generation);
        }
        Ok(())
    }

    /// The end of a change to a queued job (no agent's scope moves): the other hubs are
    /// told which job, at commit.
    async fn commit_queued(
        &self,
        tx: deadpool_postgres::Transaction<'_>,
        id: &str,
    ) -> Result<(), StoreError> {
        let e = self.err();
        notify(&tx, &self.payload('q', 0, id)).await.map_err(&e)?;
        tx.commit().await.map_err(&e)
    }
}

/// The next number of the counter `key` in `meta` (jobs, rollouts, enrolment tokens,
/// audit lines). Its row stays locked until the transaction ends: two replicas take turns.
async fn next_seq(
    tx: &deadpool_postgres::Transaction<'_>,
    key: &str,
    url: &str,
) -> Result<i64, StoreError> {
    let row = tx
        .query_one(sql::SEQ_NEXT, &[&key])
        .await
        .map_err(|source| StoreError::Postgres {
            url: url.to_owned(),
            source,
        })?;
    Ok(row.get(0))
}

async fn bump_scope(
    tx: &deadpool_postgres::Transaction<'_>,
    scope: &str,
    url: &str,
) -> Result<u64, StoreError> {
    let generation = next_generation(tx, url).await?;
    tx.execute(sql::DESIRED_PUT_GENERATION, &[&scope, &(generation as i64)])
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
            .query_one(sql::GENERATION, &[])
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
            .query(sql::RELEASES_ALL, &[])
            .await
            .map_err(&e)?
            .iter()
            .map(release_row)
            .collect();
        let halts = conn
            .query(sql::HALTS_ALL, &[])
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
                    &format!("SELECT {AGENT_COLUMNS} FROM {AGENTS} ORDER BY a.id"),
                    &[],
                )
                .await
                .map_err(&e)?
                .iter()
                .map(agent_row)
                .collect();
            let scopes = conn
                .query(sql::DESIRED_ALL, &[])
                .await
                .map_err(&e)?
                .iter()
                .map(|r| scope_row(&self.url, r))
                .collect::<Result<Vec<_>, _>>()?;
            let open_jobs = self.select_jobs(&conn, sql::OPEN_JOBS, &[]).await?;
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
        reuse_revoked: bool,
    ) -> Result<Enrol, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let existing = tx
            .query_opt(sql::AGENT_REVOKED_AT_LOCKED, &[&id])
            .await
            .map_err(&e)?;
        if let Some(row) = existing {
            if row.get::<_, Option<i64>>(0).is_none() {
                return Ok(Enrol::Exists);
            }
            if !reuse_revoked {
                return Ok(Enrol::Revoked);
            }
            // A new agent under the id: none of the old one's own settings.
            tx.execute(sql::DESIRED_CLEAR, &[&id]).await.map_err(&e)?;
        }
        // Two replicas enrolling one id at once: the second waits on the first's row
        // and finds it enrolled.
        let inserted = tx
            .execute(sql::AGENT_ADD, &[&id, &token_sha256, &(now as i64)])
            .await
            .map_err(&e)?;
        if inserted == 0 {
            return Ok(Enrol::Exists);
        }
        self.bump_and_commit(tx, id).await.map(Enrol::Done)
    }

    async fn revoke(&self, id: &str, now: u64) -> Result<Option<u64>, StoreError> {
        self.change_agent(id, sql::AGENT_REVOKE, &[&id, &(now as i64)])
            .await
    }

    async fn renumber(&self) -> Result<u64, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        self.alone(&tx).await?;
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
                .query_opt(sql::DESIRED_SETTINGS_LOCKED, &[&scope])
                .await
                .map_err(&e)?
                .map(|r| r.get(0));
            let stored = parse_settings(&self.url, scope, stored.as_deref())?;
            if stored != *base {
                // Rolled back with the transaction: the counter does not move.
                return Ok(Err(stored));
            }
        }
        tx.execute(sql::DESIRED_PUT, &[&scope, &(generation as i64), &json])
            .await
            .map_err(&e)?;
        self.commit_change(tx, scope, Some(generation)).await?;
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

    async fn put_release(&self, row: &ReleaseRow) -> Result<u64, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let generation = bump_scope(&tx, "", &self.url).await?;
        tx.execute(
            sql::RELEASE_PUT,
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
        self.commit_change(tx, "", Some(generation)).await?;
        Ok(generation)
    }

    async fn change_labels(
        &self,
        id: &str,
        set: &Labels,
        remove: &[String],
    ) -> Result<Option<(u64, Labels)>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        // The row locked: another replica's change to these labels waits, then merges
        // into this one's result.
        let Some(row) = tx
            .query_opt(sql::AGENT_LABELS_LOCKED, &[&id])
            .await
            .map_err(&e)?
        else {
            return Ok(None);
        };
        let stored: String = row.get(0);
        let (labels, json) = merge_labels(&self.url, id, &stored, set, remove)?;
        tx.execute(sql::AGENT_SET_LABELS, &[&id, &json])
            .await
            .map_err(&e)?;
        let generation = self.bump_and_commit(tx, id).await?;
        Ok(Some((generation, labels)))
    }

    async fn set_halt(&self, version: &str, halt: Option<&HaltRow>) -> Result<u64, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let generation = bump_scope(&tx, "", &self.url).await?;
        match halt {
            Some(h) => {
                tx.execute(
                    sql::HALT_PUT,
                    &[&version, &h.agent, &h.reason, &(h.halted_at as i64)],
                )
                .await
            }
            None => tx.execute(sql::HALT_DELETE, &[&version]).await,
        }
        .map_err(&e)?;
        self.commit_change(tx, "", Some(generation)).await?;
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
                    &format!("SELECT {AGENT_COLUMNS} FROM {AGENTS} WHERE a.id = $1"),
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
            .query_one(sql::GENERATION, &[])
            .await
            .map_err(self.err())?;
        Ok(u64_of(row.get(0)))
    }

    async fn load_agents(&self) -> Result<Vec<AgentRow>, StoreError> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                &format!("SELECT {AGENT_COLUMNS} FROM {AGENTS} ORDER BY a.id"),
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
