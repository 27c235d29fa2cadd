//! Secrets for jobs at the hub (docs/security.md, "Secrets"): set, listed without their
//! values, removed, their key rotated; checked when a job names them, and unsealed only
//! as the answer that carries that job to an agent leaves the hub.
//!
//! A secret is scoped by a selector on hub labels (the ones operators set, never the
//! ones a host reports of itself): a job may name it only when every agent the job may
//! reach is inside that scope, and a token bound to a selection only when the secret's
//! scope is inside the token's. The agent a job reaches is checked again as the value
//! leaves: a relabelled agent is not sent a secret it no longer matches.

mod key;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

pub use self::key::KeyError;
use self::key::{value_len, Key, Place};
use crate::proto::secret::{check_name, check_value, SecretError, SecretSet, SecretView, Values};
use crate::proto::selector::Selector;
use crate::store::secrets::{Put, SecretRow, SecretStore};
use crate::store::{Labels, StoreError};
use crate::util::{self, clip};

/// The key file's name in the data dir, unless `--secrets-key-file` names another.
pub const KEY_FILE: &str = "secrets.key";
/// How often a compared write is tried again when another hub moved the secret first.
const TRIES: usize = 3;
/// The bytes of values one job may be given: with the specs an answer carries, they stay
/// under the 1 MiB an agent reads of an answer.
pub const MAX_JOB_VALUES: usize = 128 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Bad(#[from] SecretError),
    #[error("selector {}: {why}", clip(.text))]
    BadSelector { text: String, why: String },
    #[error("no secret {} at this hub (railgrid hub secret list)", clip(.0))]
    NoSuchSecret(String),
    #[error("the hub's secrets are sealed under key {found}, but there is no key file {path}: copy the key file of the hub that set them there (or name it with --secrets-key-file)")]
    NoKey { path: PathBuf, found: String },
    #[error("the hub's secrets are sealed under key {found}, but the key file {path} holds key {ours}: start with the key file they were sealed under (--secrets-key-file), which replicas share")]
    OtherKey {
        path: PathBuf,
        found: String,
        ours: String,
    },
    #[error("the secrets key file {path} could not be written")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("secret {} was changed by another hub at the same time: try again", clip(.0))]
    Moved(String),
    #[error("the secrets changed while their key was rotated: try again")]
    RotationMoved,
    #[error("{path} exists: a rotation of the secrets key is under way, or was cut short (a restart of this hub settles it)")]
    RotationPending { path: PathBuf },
    #[error("{0}")]
    OutOfScope(String),
    #[error("the secrets a job names hold {0} bytes: at most {MAX_JOB_VALUES} go with one job")]
    TooLarge(usize),
}

/// Why a job's secrets did not go with an answer.
#[derive(Debug)]
pub enum Undelivered {
    /// For good: the job cannot be given them (gone, out of scope, not opening).
    Refused(String),
    /// For now: the store did not answer.
    Passing(String),
}

/// Where a job goes: what its secrets' scopes must contain.
pub enum Target<'a> {
    /// One agent, by its hub labels.
    Agent(&'a str, &'a Labels),
    /// Any agent a selector matches (routed, or a fan-out).
    Selected(&'a Selector),
}

/// The hub's secrets: the store's sealed rows and the key that opens them.
pub struct Secrets<S> {
    store: Arc<S>,
    path: PathBuf,
    key: RwLock<Option<Arc<Key>>>,
    /// One change at a time from this hub (the store's turn orders hubs).
    changes: tokio::sync::Mutex<()>,
}

/// `path` with `.new` added: a rotation's next key, until the store has taken it.
fn next_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".new");
    PathBuf::from(p)
}

fn view(row: &SecretRow) -> SecretView {
    SecretView {
        name: row.name.clone(),
        version: row.version,
        selector: row.selector.clone(),
        set_by: row.set_by.clone(),
        set_ms: row.set_ms,
        key: row.key_id.clone(),
    }
}

fn place(row: &SecretRow) -> Place<'_> {
    Place {
        name: &row.name,
        version: row.version,
        selector: row.selector.as_deref(),
    }
}

/// Makes the key file `path` with a fresh key, never over one that exists (`None` then):
/// written whole under another name first, so that a crash leaves no torn key.
fn create_key_file(path: &Path) -> std::io::Result<Option<Key>> {
    use std::io::Write;
    let (key, text) = Key::generate()?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::hard_link(&tmp, path)
    })();
    let _ = std::fs::remove_file(&tmp);
    match written {
        Ok(()) => {
            sync_dir(path)?;
            Ok(Some(key))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
        Err(e) => Err(e),
    }
}

/// Makes a rename or link in `path`'s directory durable.
fn sync_dir(path: &Path) -> std::io::Result<()> {
    crate::sys::dirfd::Dir::open(path.parent().unwrap_or(Path::new(".")))?.sync()
}

/// `path` with `.old` added: the key a rotation replaced, for backups taken before it.
fn old_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".old");
    PathBuf::from(p)
}

/// Checks that the key file `path` opens what is sealed under key `found` (for `hub
/// store copy`, which carries sealed values to replicas that will need that file).
pub fn check_key_file(path: &Path, found: &str) -> Result<(), SecretsError> {
    let k = Key::read(path)?;
    match k.id() == found {
        true => Ok(()),
        false => Err(SecretsError::OtherKey {
            path: path.to_owned(),
            found: found.to_owned(),
            ours: k.id().to_owned(),
        }),
    }
}

fn selector(text: &str) -> Result<Selector, SecretsError> {
    Selector::parse(text).map_err(|e| SecretsError::BadSelector {
        text: text.to_owned(),
        why: e.to_string(),
    })
}

/// A stored selector: one that no longer parses reaches no agent.
fn scope_of(row: &SecretRow) -> Result<Option<Selector>, String> {
    row.selector
        .as_deref()
        .map(Selector::parse)
        .transpose()
        .map_err(|e| format!("secret {}'s selector does not parse: {e}", row.name))
}

/// Refuses a token that reaches only `reach` a secret scoped `scope` beyond it.
fn within_reach(
    name: &str,
    scope: Option<&Selector>,
    reach: Option<(&str, &Selector)>,
) -> Result<(), SecretsError> {
    let Some((token, reach)) = reach else {
        return Ok(());
    };
    match scope {
        Some(s) if s.within(reach) => Ok(()),
        Some(s) => Err(SecretsError::OutOfScope(format!(
            "token {token} reaches only agents matching {reach}; secret {name} reaches agents matching {s}, beyond it"
        ))),
        None => Err(SecretsError::OutOfScope(format!(
            "token {token} reaches only agents matching {reach}; secret {name} may reach any agent (set it with --select inside that selection)"
        ))),
    }
}

impl<S: SecretStore> Secrets<S> {
    /// Reads the key file, if there is one, and checks that it opens what the store
    /// holds; a rotation cut short is finished or undone first.
    pub async fn load(store: Arc<S>, path: PathBuf) -> Result<Self, SecretsError> {
        let rows = store.secrets().await?;
        let found = rows.first().map(|r| r.key_id.clone());
        let next = next_path(&path);
        if next.exists() {
            // The store took the next key (its rows say so) and the rename did not
            // happen: finish it. Otherwise the rotation never reached the store. A file
            // that cannot be read is left for the operator: it may be the only copy.
            let k = Key::read(&next)?;
            let taken = found.as_deref() == Some(k.id());
            let io = |source| SecretsError::Write {
                path: next.clone(),
                source,
            };
            match taken {
                true => std::fs::rename(&next, &path).map_err(io)?,
                false => std::fs::remove_file(&next).map_err(io)?,
            }
            sync_dir(&path).map_err(io)?;
            tracing::warn!(path = %path.display(), finished = taken, "a rotation of the secrets key was cut short; its end is settled");
        }
        let key = match path.exists() {
            true => Some(Arc::new(Key::read(&path)?)),
            false => None,
        };
        if let Some(found) = found {
            match &key {
                None => return Err(SecretsError::NoKey { path, found }),
                Some(k) if k.id() != found => {
                    return Err(SecretsError::OtherKey {
                        path,
                        found,
                        ours: k.id().to_owned(),
                    })
                }
                Some(_) => {}
            }
        }
        Ok(Self {
            store,
            path,
            key: RwLock::new(key),
            changes: tokio::sync::Mutex::new(()),
        })
    }

    /// Every secret, never a value.
    pub async fn list(&self) -> Result<Vec<SecretView>, SecretsError> {
        Ok(self.store.secrets().await?.iter().map(view).collect())
    }

    /// The key sealing `key_id`: the one held, or the file's if another hub rotated it.
    fn key_for(&self, key_id: &str) -> Result<Arc<Key>, SecretsError> {
        if let Some(k) = util::read(&self.key).as_ref().filter(|k| k.id() == key_id) {
            return Ok(k.clone());
        }
        // This hub's rotation between the store's commit and the file's rename.
        let next = next_path(&self.path);
        if let Ok(k) = Key::read(&next) {
            if k.id() == key_id {
                return Ok(Arc::new(k));
            }
        }
        if !self.path.exists() {
            return Err(SecretsError::NoKey {
                path: self.path.clone(),
                found: key_id.to_owned(),
            });
        }
        let k = Arc::new(Key::read(&self.path)?);
        if k.id() != key_id {
            return Err(SecretsError::OtherKey {
                path: self.path.clone(),
                found: key_id.to_owned(),
                ours: k.id().to_owned(),
            });
        }
        *util::write(&self.key) = Some(k.clone());
        Ok(k)
    }

    /// The key new values are sealed with: the key file's (read again each time: another
    /// hub may have rotated it), made the first time.
    fn current_key(&self) -> Result<Arc<Key>, SecretsError> {
        let write = |source| SecretsError::Write {
            path: self.path.clone(),
            source,
        };
        let k = match self.path.exists() {
            true => Key::read(&self.path)?,
            false => match create_key_file(&self.path).map_err(write)? {
                Some(k) => {
                    tracing::info!(path = %self.path.display(), key = k.id(), "made the key that seals secrets: back it up apart from the database (docs/security.md, \"Secrets kept at the hub\")");
                    k
                }
                None => Key::read(&self.path)?,
            },
        };
        let mut held = util::write(&self.key);
        match held.as_ref().filter(|h| h.id() == k.id()) {
            Some(h) => Ok(h.clone()),
            None => {
                let k = Arc::new(k);
                *held = Some(k.clone());
                Ok(k)
            }
        }
    }

    /// Sets secret `name` for `by` (a token's name), which reaches only agents matching
    /// `reach`'s selector, if any.
    pub async fn set(
        &self,
        name: &str,
        req: SecretSet,
        by: &str,
        reach: Option<(&str, &Selector)>,
    ) -> Result<SecretView, SecretsError> {
        check_name(name)?;
        check_value(name, &req.value)?;
        let scope = req.selector.as_deref().map(selector).transpose()?;
        // Stored as the hub prints it, so that every spelling of a scope lists alike.
        let stored = scope.as_ref().map(ToString::to_string);
        within_reach(name, scope.as_ref(), reach)?;
        let _one = self.changes.lock().await;
        for _ in 0..TRIES {
            let now = self.store.secrets_named(&[name.to_owned()]).await?;
            if let Some(old) = now.first() {
                // Nor may it take over one it could not have set.
                let old_scope = scope_of(old).map_err(SecretsError::OutOfScope)?;
                within_reach(name, old_scope.as_ref(), reach)?;
            }
            let previous = now.first().map(|r| r.version);
            let version = previous.unwrap_or(0) + 1;
            let key = self.current_key()?;
            let at = Place {
                name,
                version,
                selector: stored.as_deref(),
            };
            let sealed =
                key.seal(&at, req.value.as_bytes())
                    .map_err(|source| SecretsError::Write {
                        path: self.path.clone(),
                        source,
                    })?;
            let row = SecretRow {
                name: name.to_owned(),
                version,
                selector: stored.clone(),
                sealed,
                key_id: key.id().to_owned(),
                set_by: by.to_owned(),
                set_ms: util::unix_now_ms(),
            };
            match self.store.put_secret(&row, previous).await? {
                Put::Done => return Ok(view(&row)),
                Put::Moved => continue,
                // Another hub rotated the key: take the file's, or say why not.
                Put::OtherKey(found) => {
                    self.key_for(&found)?;
                }
            }
        }
        Err(SecretsError::Moved(name.to_owned()))
    }

    /// Removes secret `name`; its last version.
    pub async fn remove(
        &self,
        name: &str,
        reach: Option<(&str, &Selector)>,
    ) -> Result<u64, SecretsError> {
        let _one = self.changes.lock().await;
        let now = self.store.secrets_named(&[name.to_owned()]).await?;
        let Some(old) = now.first() else {
            return Err(SecretsError::NoSuchSecret(name.to_owned()));
        };
        let scope = scope_of(old).map_err(SecretsError::OutOfScope)?;
        within_reach(name, scope.as_ref(), reach)?;
        // Compared: one replaced meanwhile (in another scope, say) is not removed unseen.
        self.store
            .remove_secret(name, old.version)
            .await?
            .ok_or_else(|| SecretsError::Moved(name.to_owned()))
    }

    /// Seals every secret under a new key, which then replaces the key file: `(old key,
    /// new key, secrets resealed)`. The new key is written beside the old first (never
    /// over another rotation's), so that a hub killed at any step starts with the key
    /// that opens what the store holds; the old one stays as `.old`, for backups.
    pub async fn rotate_key(&self) -> Result<(Option<String>, String, usize), SecretsError> {
        let _one = self.changes.lock().await;
        let next = next_path(&self.path);
        let write = |path: &Path| {
            let path = path.to_owned();
            move |source| SecretsError::Write { path, source }
        };
        let Some(key) = create_key_file(&next).map_err(write(&next))? else {
            return Err(SecretsError::RotationPending { path: next });
        };
        let old = util::read(&self.key).as_ref().map(|k| k.id().to_owned());
        let mut done = None;
        for _ in 0..TRIES {
            let rows = self.store.secrets().await?;
            let from = rows.first().map(|r| r.key_id.clone());
            let mut resealed = Vec::with_capacity(rows.len());
            for row in &rows {
                let value = match self.open(row) {
                    Ok(v) => v,
                    Err(e) => {
                        let _ = std::fs::remove_file(&next);
                        return Err(e);
                    }
                };
                let sealed = key.seal(&place(row), &value).map_err(write(&next))?;
                resealed.push(SecretRow {
                    sealed,
                    key_id: key.id().to_owned(),
                    ..row.clone()
                });
            }
            let from = from.unwrap_or_else(|| key.id().to_owned());
            if self.store.reseal_secrets(&resealed, &from).await? == Put::Done {
                done = Some(resealed.len());
                break;
            }
        }
        let Some(count) = done else {
            let _ = std::fs::remove_file(&next);
            return Err(SecretsError::RotationMoved);
        };
        let kept = old_path(&self.path);
        let _ = std::fs::remove_file(&kept);
        if self.path.exists() {
            std::fs::hard_link(&self.path, &kept).map_err(write(&kept))?;
        }
        std::fs::rename(&next, &self.path)
            .and_then(|()| sync_dir(&self.path))
            .map_err(write(&self.path))?;
        let id = key.id().to_owned();
        *util::write(&self.key) = Some(Arc::new(key));
        Ok((old, id, count))
    }

    fn open(&self, row: &SecretRow) -> Result<Vec<u8>, SecretsError> {
        let key = self.key_for(&row.key_id)?;
        key.open(&place(row), &row.sealed)
            .ok_or_else(|| SecretsError::OtherKey {
                path: self.path.clone(),
                found: format!("{} (it does not open: altered in the store?)", row.key_id),
                ours: key.id().to_owned(),
            })
    }

    /// Refuses a token that reaches only `reach` labels (`after`, from `before`) that would
    /// bring an agent into the scope of a secret beyond that selection: a selected token
    /// may not relabel an agent of its own into a secret it could not use.
    pub async fn labels_allowed(
        &self,
        agent: &str,
        before: &Labels,
        after: &Labels,
        reach: Option<(&str, &Selector)>,
    ) -> Result<(), SecretsError> {
        let Some((token, sel)) = reach else {
            return Ok(());
        };
        for row in self.store.secrets().await? {
            let Ok(Some(scope)) = scope_of(&row) else {
                continue;
            };
            if scope.matches(after) && !scope.matches(before) && !scope.within(sel) {
                return Err(SecretsError::OutOfScope(format!(
                    "token {token} reaches only agents matching {sel}: these labels would bring agent {agent} into the scope of secret {} ({scope}), beyond it",
                    row.name
                )));
            }
        }
        Ok(())
    }

    /// Checks, as a job is submitted, that the secrets it names exist and reach no
    /// further than `target`, and that a token reaching only `reach` may use them.
    pub async fn admit(
        &self,
        names: &[String],
        target: Target<'_>,
        reach: Option<(&str, &Selector)>,
    ) -> Result<(), SecretsError> {
        if names.is_empty() {
            return Ok(());
        }
        let rows = self.store.secrets_named(names).await?;
        let total: usize = rows.iter().map(|r| value_len(&r.sealed)).sum();
        if total > MAX_JOB_VALUES {
            return Err(SecretsError::TooLarge(total));
        }
        for name in names {
            let Some(row) = rows.iter().find(|r| &r.name == name) else {
                return Err(SecretsError::NoSuchSecret(name.clone()));
            };
            let scope = scope_of(row).map_err(SecretsError::OutOfScope)?;
            within_reach(name, scope.as_ref(), reach)?;
            let Some(scope) = scope else { continue };
            match target {
                Target::Agent(id, labels) if !scope.matches(labels) => {
                    return Err(SecretsError::OutOfScope(format!(
                        "secret {name} is only for agents matching {scope}; agent {id}'s hub labels do not match"
                    )))
                }
                Target::Selected(sel) if !sel.within(&scope) => {
                    return Err(SecretsError::OutOfScope(format!(
                        "secret {name} is only for agents matching {scope}; the job's selector {sel} may reach others (select inside it)"
                    )))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The values of `names` for agent `agent` with hub labels `labels`, as the answer
    /// that carries the job leaves; why not, in words for the job's error.
    pub async fn unseal(
        &self,
        names: &[String],
        agent: &str,
        labels: &Labels,
    ) -> Result<Values, Undelivered> {
        let rows = self.store.secrets_named(names).await.map_err(|e| {
            Undelivered::Passing(format!(
                "the hub could not read its secrets: {}",
                util::error_chain(&e)
            ))
        })?;
        let mut values = Values::default();
        for name in names {
            let Some(row) = rows.iter().find(|r| &r.name == name) else {
                return Err(Undelivered::Refused(format!(
                    "secret {name} no longer exists at the hub"
                )));
            };
            if let Some(scope) = scope_of(row).map_err(Undelivered::Refused)? {
                if !scope.matches(labels) {
                    return Err(Undelivered::Refused(format!(
                        "secret {name} is only for agents matching {scope}, and agent {agent}'s hub labels no longer match: it was not sent"
                    )));
                }
            }
            let value = self
                .open(row)
                .map_err(|e| Undelivered::Refused(util::error_chain(&e)))?;
            let value = String::from_utf8(value)
                .map_err(|_| Undelivered::Refused(format!("secret {name} is not UTF-8 text")))?;
            values.0.insert(name.clone(), value);
        }
        Ok(values)
    }
}
