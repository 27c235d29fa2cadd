//! What replicas must agree on and a single hub keeps in its data dir: the admin token
//! and the CA of `--tls-self-signed`.
//!
//! The first replica to start on an empty database stores its own (made then, or
//! already in its data dir); the others take those. The admin token's *hash* is what is
//! shared: a replica started without `admin.token` accepts the token the first one
//! wrote, and the operator copies that file to where admin commands run. The CA is
//! shared whole (certificate and key), so that every replica's certificate chains to
//! the one `ca.pem` agents pin; anyone who can read the database can then mint
//! certificates agents trust, which is why `--tls-cert`/`--tls-key` from the operator's
//! own PKI is the choice for a database others can read.

use std::path::Path;

use super::store::Store;
use super::{tls, token, HubError, ADMIN_TOKEN_FILE};

pub(super) const ADMIN_SECRET: &str = "admin_token_sha256";
/// Root tokens rotated away, comma-separated, newest last: a replica's `admin.token` that
/// holds one is stale, not another database's.
const RETIRED_SECRET: &str = "admin_token_sha256_retired";
/// How many rotated root tokens are remembered.
const RETIRED_KEPT: usize = 8;
const CA_SECRET: &str = "self_signed_ca";
/// Between the certificate and the key in [`CA_SECRET`].
const CA_SPLIT: &str = "\n--railgrid-ca-key--\n";

/// The admin token's hash all replicas accept.
pub(super) async fn admin_token<S: Store>(store: &S, data: &Path) -> Result<String, HubError> {
    let path = data.join(ADMIN_TOKEN_FILE);
    let local = match crate::small_file::read_string(&path, crate::small_file::TOKEN_MAX) {
        Ok(t) if !t.trim().is_empty() => Some(token::sha256_hex(t.trim())),
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(HubError::File { path, source }),
    };
    if let Some(shared) = store.get_secret(ADMIN_SECRET).await? {
        if let Some(l) = local.as_ref().filter(|l| **l != shared) {
            let retired = store.get_secret(RETIRED_SECRET).await?.unwrap_or_default();
            if !retired.split(',').any(|r| r == l) {
                return Err(HubError::Mismatch {
                    what: "admin token",
                    path,
                });
            }
            // Rotated through another replica since this one last ran.
            std::fs::remove_file(&path).map_err(|source| HubError::File {
                path: path.clone(),
                source,
            })?;
            tracing::warn!(path = %path.display(), "this replica's admin.token was rotated away (`hub token rotate-root`): removed; copy the new one here to run admin commands on this host");
            return Ok(shared);
        }
        if local.is_none() {
            tracing::info!(path = %path.display(), "this replica takes the admin token another replica made: copy that replica's admin.token here (0600) to run admin commands on this host");
        }
        return Ok(shared);
    }
    let (hash, made) = match local {
        Some(h) => (h, false),
        None => {
            let t = token::new_admin_token().map_err(HubError::Random)?;
            crate::util::write_atomic(&path, format!("{t}\n").as_bytes(), 0o600).map_err(
                |source| HubError::File {
                    path: path.clone(),
                    source,
                },
            )?;
            tracing::info!(path = %path.display(), "wrote the admin token of the hub replicas");
            (token::sha256_hex(&t), true)
        }
    };
    let shared = store.shared_secret(ADMIN_SECRET, hash.clone()).await?;
    if shared != hash {
        // Another replica stored its own first.
        if made {
            let _ = std::fs::remove_file(&path);
            tracing::info!(path = %path.display(), "another replica made the admin token first: copy its admin.token here to run admin commands on this host");
            return Ok(shared);
        }
        return Err(HubError::Mismatch {
            what: "admin token",
            path,
        });
    }
    Ok(shared)
}

/// Puts the replicas' CA in `data` (storing this one's when it is the first).
pub(super) async fn self_signed_ca<S: Store>(store: &S, data: &Path) -> Result<(), HubError> {
    let split = |v: &str| {
        v.split_once(CA_SPLIT)
            .map(|(c, k)| (c.to_owned(), k.to_owned()))
    };
    let local = tls::local_ca(data)?;
    let shared = match store.get_secret(CA_SECRET).await? {
        Some(v) => v,
        None => {
            let (cert, key, made) = match local.clone() {
                Some((c, k)) => (c, k, false),
                None => {
                    let (c, k) = tls::new_ca()?;
                    (c, k, true)
                }
            };
            let value = format!("{cert}{CA_SPLIT}{key}");
            let stored = store.shared_secret(CA_SECRET, value.clone()).await?;
            if stored == value && made {
                tracing::info!(ca = %data.join(tls::CA_FILE).display(), "made the CA of the hub replicas (--tls-self-signed): agents pin this file");
            }
            stored
        }
    };
    let Some((cert, key)) = split(&shared) else {
        return Err(HubError::Mismatch {
            what: "CA (unreadable in the database)",
            path: data.join(tls::CA_FILE),
        });
    };
    match local {
        Some((c, k)) if c == cert && k == key => Ok(()),
        Some(_) => Err(HubError::Mismatch {
            what: "CA",
            path: data.join(tls::CA_FILE),
        }),
        None => Ok(tls::adopt_ca(data, &cert, &key)?),
    }
}

/// The secrets a single hub keeps in its data dir `data`, as replicas share them (for
/// `hub store copy`): the admin token's hash and, with `--tls-self-signed`, the CA.
pub(super) fn of_data_dir(data: &Path) -> Result<Vec<(String, String)>, HubError> {
    let path = data.join(ADMIN_TOKEN_FILE);
    let token = match crate::small_file::read_string(&path, crate::small_file::TOKEN_MAX) {
        Ok(t) if !t.trim().is_empty() => t,
        Ok(_) => {
            return Err(HubError::CopyNeeds {
                path,
                what: "the admin token (it is empty)",
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(HubError::CopyNeeds {
                path,
                what: "the admin token",
            })
        }
        Err(source) => return Err(HubError::File { path, source }),
    };
    let mut secrets = vec![(ADMIN_SECRET.to_owned(), token::sha256_hex(token.trim()))];
    if let Some((cert, key)) = tls::local_ca(data)? {
        secrets.push((CA_SECRET.to_owned(), format!("{cert}{CA_SPLIT}{key}")));
    }
    Ok(secrets)
}

/// Remembers `old` as a root token rotated away, so that a replica's stale copy of it is
/// told from another database's token at that replica's next start.
pub(super) async fn retire_admin_token<S: Store>(
    store: &S,
    old: &str,
) -> Result<(), super::store::StoreError> {
    let retired = store.get_secret(RETIRED_SECRET).await?.unwrap_or_default();
    let mut all: Vec<&str> = retired.split(',').filter(|r| !r.is_empty()).collect();
    all.push(old);
    let keep = all.len().saturating_sub(RETIRED_KEPT);
    store
        .replace_secret(RETIRED_SECRET, &all[keep..].join(","))
        .await
}
