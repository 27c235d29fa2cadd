//! Who may use the hub's admin API, and what they did (docs/hub.md, "Access"; design
//! invariant 21).
//!
//! - The *root* admin token (`admin.token`, or the replicas' shared one) may do
//!   everything, and can be rotated without a restart ([`Access::rotate_root`]).
//! - *Scoped* tokens (`hub token create`) may do what their scopes name, and their job
//!   scopes reach only agents whose hub labels match their selector.
//! - *Enrolment* tokens let hosts enrol themselves (`hub enrol-token create`); they open
//!   nothing else.
//!
//! Tokens are known by their SHA-256 only. Each hub keeps the admin tokens in memory and
//! loads them again when another replica says they changed, when a token it does not know
//! is shown (at most once a second), and every [`REFRESH`].
//!
//! Task: [`AuditKeeper`] counts refusals into the audit log and deletes its lines past
//! their retention.

mod audit;
mod delegation;
mod scopes;
mod throttle;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::store::access::{AdminTokenRow, EnrolTokenRow};
use super::store::Store;
use super::token;
use crate::metrics::AuthRoute;
use crate::proto::access::{
    EnrolTokenRequest, EnrolTokenView, TokenMade, TokenRequest, TokenView, ROOT_NAME, SCOPES,
};
use crate::proto::selector::Selector;
use crate::util;

pub use self::audit::{AuditKeeper, Audited};
pub use self::delegation::Exceeds;
pub use self::scopes::{is_fleet_wide, scope_of};
use self::throttle::{Bucket, Throttle};

/// How often the admin tokens are loaded again without a reason.
const REFRESH: Duration = Duration::from_secs(10);
/// The least time between two loads for a token nobody knows.
const MISS_RELOAD: Duration = Duration::from_secs(1);
/// Enrolments per token: a burst of this many, then one per [`ENROL_EVERY`].
const ENROL_BURST: f64 = 20.0;
const ENROL_EVERY: Duration = Duration::from_millis(500);
/// The longest a token may live.
const MAX_TTL_SECS: u64 = 10 * 366 * 24 * 3600;
/// Admin token names: what an audit line can show plainly.
const MAX_NAME: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("{field}: {why}")]
    Bad { field: &'static str, why: String },
    #[error("a token named {0:?} exists already (names are never used twice, so that the audit log reads one way)")]
    NameTaken(String),
    #[error("no admin token named {0:?}")]
    NoSuchToken(String),
    #[error("no enrolment token {0:?}")]
    NoSuchEnrolToken(String),
    #[error("could not make a token")]
    Random(#[source] getrandom::Error),
    #[error("could not write the new root token to {path}")]
    RootFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Exceeds(#[from] Exceeds),
    #[error(transparent)]
    Store(#[from] super::store::StoreError),
}

/// Who made a request, once their token is known.
#[derive(Debug, Clone, PartialEq)]
pub enum Caller {
    Root,
    Token {
        name: String,
        scopes: Vec<String>,
        /// The agents it reaches (by their hub labels), whatever it does to them.
        selector: Option<Selector>,
    },
}

impl Caller {
    /// The name the audit log gives it.
    pub fn name(&self) -> &str {
        match self {
            Caller::Root => ROOT_NAME,
            Caller::Token { name, .. } => name,
        }
    }

    pub fn may(&self, scope: &str) -> bool {
        match self {
            Caller::Root => true,
            Caller::Token { scopes, .. } => scopes.iter().any(|s| s == scope),
        }
    }
}

pub struct Access<S: Store> {
    store: Arc<S>,
    /// Where the single hub keeps `admin.token`.
    data_dir: PathBuf,
    replicated: bool,
    root_sha256: RwLock<String>,
    /// Admin tokens by SHA-256.
    tokens: RwLock<HashMap<String, AdminTokenRow>>,
    /// The SHA-256 of every enrolment token (spent, expired and revoked ones too): a
    /// source past its burst of failures still enrols with a token this hub made.
    enrol_tokens: RwLock<std::collections::HashSet<String>>,
    loaded: Mutex<Option<Instant>>,
    /// Each enrolment token's rate: a bucket of [`ENROL_BURST`] filling at one per
    /// [`ENROL_EVERY`].
    enrolments: Mutex<HashMap<String, Bucket>>,
    /// Failed authentications, per source.
    pub throttle: Throttle,
    refusals: audit::Refusals,
}

impl<S: Store> Access<S> {
    pub async fn load(
        store: Arc<S>,
        data_dir: PathBuf,
        root_sha256: String,
    ) -> Result<Self, AccessError> {
        let access = Self {
            replicated: store.replicated(),
            store,
            data_dir,
            root_sha256: RwLock::new(root_sha256),
            tokens: RwLock::new(HashMap::new()),
            enrol_tokens: RwLock::new(std::collections::HashSet::new()),
            loaded: Mutex::new(None),
            enrolments: Mutex::new(HashMap::new()),
            throttle: Throttle::default(),
            refusals: audit::Refusals::default(),
        };
        access.reload().await?;
        Ok(access)
    }

    /// Loads the admin tokens (and, with replicas, the root token's hash) again.
    pub async fn reload(&self) -> Result<(), AccessError> {
        let rows = self.store.admin_tokens().await?;
        *util::write(&self.tokens) = rows.into_iter().map(|r| (r.sha256.clone(), r)).collect();
        let enrol = self.store.enrol_tokens().await?;
        *util::write(&self.enrol_tokens) = enrol.into_iter().map(|r| r.sha256).collect();
        if self.replicated {
            if let Some(root) = self.store.get_secret(super::shared::ADMIN_SECRET).await? {
                *util::write(&self.root_sha256) = root;
            }
        }
        *util::lock(&self.loaded) = Some(Instant::now());
        Ok(())
    }

    fn due(&self, every: Duration) -> bool {
        util::lock(&self.loaded).is_none_or(|t| t.elapsed() >= every)
    }

    /// The caller `token` stands for, if any: the root token, or a scoped one not revoked
    /// and not expired.
    pub async fn who(&self, token: &str) -> Option<Caller> {
        let sha = token::sha256_hex(token);
        if self.due(REFRESH) {
            if let Err(e) = self.reload().await {
                tracing::warn!(error = %util::error_chain(&e), "could not load the admin tokens again (the ones loaded before are used)");
            }
        }
        if let Some(c) = self.known(&sha) {
            return Some(c);
        }
        // Made or rotated through another replica a moment ago?
        if self.due(MISS_RELOAD) && self.reload().await.is_ok() {
            return self.known(&sha);
        }
        None
    }

    /// The caller a token stands for, by its SHA-256 (a dashboard session keeps no
    /// token).
    pub async fn who_sha256(&self, sha: &str) -> Option<Caller> {
        if self.due(REFRESH) {
            let _ = self.reload().await;
        }
        self.known(sha)
    }

    /// Comparing hashes, not tokens: a timing difference could at most reveal a prefix of
    /// a hash, which opens nothing.
    fn known(&self, sha: &str) -> Option<Caller> {
        if *util::read(&self.root_sha256) == sha {
            return Some(Caller::Root);
        }
        let tokens = util::read(&self.tokens);
        let row = tokens.get(sha)?;
        let now = util::unix_now_ms();
        if row.revoked_ms.is_some() || row.expires_ms.is_some_and(|e| now >= e) {
            return None;
        }
        Some(Caller::Token {
            name: row.name.clone(),
            scopes: row.scopes.split(',').map(str::to_owned).collect(),
            // Checked when it was made.
            selector: row
                .selector
                .as_deref()
                .and_then(|s| Selector::parse(s).ok()),
        })
    }

    /// Makes a scoped admin token for `caller`, within its rights; its secret is in the
    /// answer only.
    pub async fn create_token(
        &self,
        caller: &Caller,
        req: &TokenRequest,
    ) -> Result<TokenMade<TokenView>, AccessError> {
        let bad = |field, why: String| AccessError::Bad { field, why };
        let name = req.name.as_str();
        let ok_name = !name.is_empty()
            && name.len() <= MAX_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            && name != ROOT_NAME;
        if !ok_name {
            return Err(bad(
                "name",
                format!(
                    "{:?}: 1 to {MAX_NAME} letters, digits, '.', '_' or '-', and not {ROOT_NAME:?}",
                    util::clip(name)
                ),
            ));
        }
        if req.scopes.is_empty() {
            return Err(bad(
                "scopes",
                format!("give one or more of {}", SCOPES.join(", ")),
            ));
        }
        let mut scopes: Vec<String> = Vec::new();
        for s in &req.scopes {
            if !SCOPES.contains(&s.as_str()) {
                return Err(bad(
                    "scopes",
                    format!("{:?} is not a scope: {}", util::clip(s), SCOPES.join(", ")),
                ));
            }
            if !scopes.contains(s) {
                scopes.push(s.clone());
            }
        }
        let selector = req
            .selector
            .as_deref()
            .map(|s| Selector::parse(s).map_err(|e| bad("selector", e.to_string())))
            .transpose()?;
        caller.may_grant(&scopes, selector.as_ref())?;
        let now = util::unix_now_ms();
        let expires_ms = ttl(req.ttl_secs, now)?;
        let secret = token::new_admin_token().map_err(AccessError::Random)?;
        let row = AdminTokenRow {
            name: name.to_owned(),
            sha256: token::sha256_hex(&secret),
            scopes: scopes.join(","),
            selector: selector.map(|s| s.to_string()),
            created_ms: now,
            expires_ms,
            revoked_ms: None,
        };
        if !self.store.create_admin_token(&row).await? {
            return Err(AccessError::NameTaken(name.to_owned()));
        }
        tracing::info!(token = %row.name, scopes = %row.scopes, selector = row.selector.as_deref().unwrap_or(""), "admin token made");
        let view = token_view(&row);
        util::write(&self.tokens).insert(row.sha256.clone(), row);
        Ok(TokenMade {
            token: secret,
            view,
        })
    }

    pub async fn tokens(&self) -> Result<Vec<TokenView>, AccessError> {
        let rows = self.store.admin_tokens().await?;
        Ok(rows.iter().map(token_view).collect())
    }

    /// Revokes token `name`, if `caller` could have made it.
    pub async fn revoke_token(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<TokenView, AccessError> {
        let no_such = || AccessError::NoSuchToken(util::clip(name).into_owned());
        let rows = self.store.admin_tokens().await?;
        let target = rows.iter().find(|r| r.name == name).ok_or_else(no_such)?;
        let view = token_view(target);
        let selector = view
            .selector
            .as_deref()
            .and_then(|s| Selector::parse(s).ok());
        caller.may_grant(&view.scopes, selector.as_ref())?;
        let row = self
            .store
            .revoke_admin_token(name, util::unix_now_ms())
            .await?
            .ok_or_else(no_such)?;
        tracing::info!(token = %row.name, "admin token revoked");
        let view = token_view(&row);
        util::write(&self.tokens).insert(row.sha256.clone(), row);
        Ok(view)
    }

    /// A new root token: the old one is refused from now on (by every replica, within
    /// a second of seeing it). A single hub writes it to its `admin.token`.
    pub async fn rotate_root(&self) -> Result<String, AccessError> {
        let secret = token::new_admin_token().map_err(AccessError::Random)?;
        let sha = token::sha256_hex(&secret);
        let old = util::read(&self.root_sha256).clone();
        let path = self.data_dir.join(super::ADMIN_TOKEN_FILE);
        if self.replicated {
            super::shared::retire_admin_token(&*self.store, &old).await?;
            self.store
                .replace_secret(super::shared::ADMIN_SECRET, &sha)
                .await?;
        }
        // The token's home for a single hub; for a replica, the copy on the host the
        // operator asked (the other replicas' copies are stale now, and set aside at
        // their next start).
        let write = format!("{secret}\n");
        let written = tokio::task::spawn_blocking(move || {
            crate::util::write_atomic(&path, write.as_bytes(), 0o600).map_err(|source| {
                AccessError::RootFile {
                    path: path.clone(),
                    source,
                }
            })
        })
        .await
        .map_err(|e| AccessError::RootFile {
            path: self.data_dir.join(super::ADMIN_TOKEN_FILE),
            source: std::io::Error::other(e),
        })?;
        written?;
        *util::write(&self.root_sha256) = sha;
        tracing::warn!("the root admin token was rotated: the old one is refused from now on");
        Ok(secret)
    }

    /// Makes an enrolment token for `caller`, whose hosts it must reach.
    pub async fn create_enrol_token(
        &self,
        caller: &Caller,
        req: &EnrolTokenRequest,
    ) -> Result<TokenMade<EnrolTokenView>, AccessError> {
        crate::proto::labels::check(&req.labels, false).map_err(|e| AccessError::Bad {
            field: "labels",
            why: e.to_string(),
        })?;
        caller.may_enrol(&req.labels)?;
        if req.uses == Some(0) {
            return Err(AccessError::Bad {
                field: "uses",
                why: "0 would enrol no host".into(),
            });
        }
        let now = util::unix_now_ms();
        let secret = token::new_enrol_token().map_err(AccessError::Random)?;
        let row = EnrolTokenRow {
            sha256: token::sha256_hex(&secret),
            max_uses: req.uses,
            labels: req.labels.clone(),
            created_ms: now,
            expires_ms: ttl(req.ttl_secs, now)?,
            ..EnrolTokenRow::default()
        };
        let row = self.store.create_enrol_token(&row).await?;
        util::write(&self.enrol_tokens).insert(row.sha256.clone());
        tracing::info!(enrol_token = %row.id, uses = ?row.max_uses, "enrolment token made");
        Ok(TokenMade {
            token: secret,
            view: enrol_view(&row),
        })
    }

    pub async fn enrol_tokens(&self) -> Result<Vec<EnrolTokenView>, AccessError> {
        Ok(self
            .store
            .enrol_tokens()
            .await?
            .iter()
            .map(enrol_view)
            .collect())
    }

    /// Revokes enrolment token `id`, if `caller` could have made it.
    pub async fn revoke_enrol_token(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<EnrolTokenView, AccessError> {
        let no_such = || AccessError::NoSuchEnrolToken(util::clip(id).into_owned());
        let rows = self.store.enrol_tokens().await?;
        let target = rows.iter().find(|r| r.id == id).ok_or_else(no_such)?;
        caller.may_enrol(&target.labels)?;
        let row = self
            .store
            .revoke_enrol_token(id, util::unix_now_ms())
            .await?
            .ok_or_else(no_such)?;
        tracing::info!(enrol_token = %row.id, "enrolment token revoked");
        Ok(enrol_view(&row))
    }

    /// Whether `token` is an enrolment token of this hub (made on another replica a
    /// moment ago too), by its hash in memory.
    pub async fn is_enrol_token(&self, token: &str) -> bool {
        let sha = token::sha256_hex(token);
        if util::read(&self.enrol_tokens).contains(&sha) {
            return true;
        }
        if self.due(MISS_RELOAD) && self.reload().await.is_ok() {
            return util::read(&self.enrol_tokens).contains(&sha);
        }
        false
    }

    /// A failed authentication on `route` from `peer`: counted, and `Some(wait)` once
    /// the source is past its burst (answered 429 then; throttle.rs).
    pub fn failed(&self, route: AuthRoute, peer: Option<IpAddr>) -> Option<Duration> {
        crate::metrics::auth_failed(route);
        self.throttle.failed(peer)
    }

    /// Whether an enrolment with `token` may be tried now (its rate, per token and
    /// replica); a token nobody knows spends a bucket of its own, which it never gets.
    pub fn may_enrol(&self, token: &str) -> bool {
        let key = token::sha256_hex(token);
        let mut all = util::lock(&self.enrolments);
        // Bounded: buckets full again are forgotten.
        if all.len() > 10_000 {
            all.retain(|_, b| !b.is_full(ENROL_BURST, ENROL_EVERY));
        }
        all.entry(key)
            .or_insert_with(|| Bucket::full(ENROL_BURST))
            .take(ENROL_BURST, ENROL_EVERY)
            .is_ok()
    }
}

fn ttl(ttl_secs: Option<u64>, now: u64) -> Result<Option<u64>, AccessError> {
    match ttl_secs {
        Some(0) => Err(AccessError::Bad {
            field: "ttl_secs",
            why: "0 would end it at once".into(),
        }),
        Some(s) if s > MAX_TTL_SECS => Err(AccessError::Bad {
            field: "ttl_secs",
            why: "more than ten years".into(),
        }),
        Some(s) => Ok(Some(now.saturating_add(s * 1000))),
        None => Ok(None),
    }
}

fn token_view(r: &AdminTokenRow) -> TokenView {
    TokenView {
        name: r.name.clone(),
        scopes: r.scopes.split(',').map(str::to_owned).collect(),
        selector: r.selector.clone(),
        created_ms: r.created_ms,
        expires_ms: r.expires_ms,
        revoked_ms: r.revoked_ms,
    }
}

fn enrol_view(r: &EnrolTokenRow) -> EnrolTokenView {
    EnrolTokenView {
        id: r.id.clone(),
        max_uses: r.max_uses,
        uses: r.uses,
        labels: r.labels.clone(),
        created_ms: r.created_ms,
        expires_ms: r.expires_ms,
        revoked_ms: r.revoked_ms,
    }
}
