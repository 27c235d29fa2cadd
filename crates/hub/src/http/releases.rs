//! The hub's release routes: the admin's publish, list and resume
//! (`/v1/admin/releases…`), and the agents' download (`GET /v1/releases/{version}/{os}-{arch}`,
//! the agent's token, HTTP Range for a resumed download).
//!
//! A published binary is kept in `<data>/releases/<sha256>`. It is taken only after its
//! signature verifies against one of the hub's release keys (`hub serve --release-key`):
//! a hub never hands its agents bytes no publisher signed. (The agents check again,
//! against keys of their own.)

use std::io::{Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::access::{checked, peer_ip};
use super::error::{ApiError, ApiResult};
use super::extract::{bearer, ApiPath};
use super::state::Hub;
use crate::metrics::AuthRoute;
use crate::proto::desired::is_version;
use crate::release::{self, SignatureError, MAX_RELEASE};
use crate::store::rollouts::Fetch;
use crate::store::{ReleaseRow, Store};
use crate::util::clip;

/// The header that carries a publish's `.minisig` file, hex-encoded (a header holds one
/// line; the file is several).
use crate::proto::hub_dir::SIGNATURE_HEADER;
/// The largest `.minisig` file.
const MAX_SIGNATURE: usize = 4096;
/// A download is sent in pieces of this.
const CHUNK: usize = 256 * 1024;

/// `os-arch` as a route names it: each part what `std::env::consts` says (`linux`,
/// `x86_64`, `aarch64`).
fn platform(s: &str) -> ApiResult<(String, String)> {
    let ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 32
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    match s.split_once('-') {
        Some((os, arch)) if ok(os) && ok(arch) => Ok((os.to_owned(), arch.to_owned())),
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "no platform {:?}: give os-arch, such as linux-x86_64 or macos-aarch64",
                clip(s)
            ),
        )),
    }
}

fn version(v: &str) -> ApiResult<()> {
    if is_version(v) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{:?} is not a version (such as 1.4.0)", clip(v)),
        ))
    }
}

fn internal(what: String, e: &std::io::Error) -> ApiError {
    tracing::error!(error = %e, "{what}");
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{what}: {e}"))
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A file in the releases dir that is removed when dropped, unless kept.
struct Upload {
    path: PathBuf,
    keep: bool,
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// `PUT /v1/admin/releases/{version}/{os}-{arch}`: the binary as the body, its signature
/// in [`SIGNATURE_HEADER`].
pub(super) async fn publish<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath((v, plat)): ApiPath<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    version(&v)?;
    let (os, arch) = platform(&plat)?;
    if hub.release_keys.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "this hub has no release keys: start it with --release-key PUBFILE (the publisher's minisign public key) to accept releases",
        ));
    }
    let signature = headers
        .get(SIGNATURE_HEADER)
        .and_then(|h| h.to_str().ok())
        .and_then(hex_decode)
        .filter(|b| b.len() <= MAX_SIGNATURE)
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("an unsigned release is refused: give its .minisig file, hex-encoded, in {SIGNATURE_HEADER} (`railgrid hub release publish --signature` does)"),
            )
        })?;

    let dir = hub.releases_dir.clone();
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| internal(format!("could not create {}", dir.display()), &e))?;
    let name = format!(".upload-{:016x}", getrandom::u64().unwrap_or(0));
    let mut upload = Upload {
        path: dir.join(name),
        keep: false,
    };
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&upload.path)
        .await
        .map_err(|e| internal(format!("could not create {}", upload.path.display()), &e))?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("could not read the binary: {e}"),
            )
        })?;
        size += chunk.len() as u64;
        if size > MAX_RELEASE {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the binary is larger than {MAX_RELEASE} bytes"),
            ));
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| internal(format!("could not write {}", upload.path.display()), &e))?;
    }
    file.sync_all()
        .await
        .map_err(|e| internal(format!("could not write {}", upload.path.display()), &e))?;
    drop(file);
    if size == 0 {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "the binary is empty",
        ));
    }
    let sha256: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();

    let keys = hub.release_keys.clone();
    let path = upload.path.clone();
    let sig = signature.clone();
    let verified = tokio::task::spawn_blocking(move || {
        let f = std::fs::File::open(&path)?;
        Ok::<_, std::io::Error>(release::check(&keys, &sig, f))
    })
    .await
    .map_err(|e| {
        internal(
            "the signature check failed".into(),
            &std::io::Error::other(e),
        )
    })?
    .map_err(|e| internal(format!("could not read {}", upload.path.display()), &e))?;
    let verified = verified.map_err(|e| {
        let why = match &e {
            SignatureError::UntrustedKey { .. } => {
                format!("{e}: the hub takes releases signed by its --release-key keys only")
            }
            _ => e.to_string(),
        };
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("release {v} for {os}-{arch} refused: {why}"),
        )
    })?;
    if let Some(signed) = verified.fields.get("version") {
        if signed != &v {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("release {v} refused: its signature says it is version {signed:?}"),
            ));
        }
    }
    if let Some(signed) = verified.fields.get("sha256") {
        if signed != &sha256 {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("release {v} refused: its signature names SHA-256 {signed}, the binary is {sha256}"),
            ));
        }
    }

    let stored = dir.join(&sha256);
    tokio::fs::rename(&upload.path, &stored)
        .await
        .map_err(|e| internal(format!("could not store {}", stored.display()), &e))?;
    upload.keep = true;
    hub.fleet.share_release_bytes(&sha256, &stored).await?;
    let row = ReleaseRow {
        version: v,
        os,
        arch,
        size,
        sha256,
        signature,
        key_id: verified.key_id,
        published_at: crate::util::unix_now(),
    };
    hub.fleet.publish_release(row.clone()).await?;
    Ok((
        StatusCode::CREATED,
        Json(crate::proto::hub::ReleaseArtifact {
            os: row.os,
            arch: row.arch,
            size: row.size,
            sha256: row.sha256,
            key_id: row.key_id,
            published_at: row.published_at,
        }),
    )
        .into_response())
}

/// `GET /v1/admin/releases`.
pub(super) async fn list<S: Store>(State(hub): State<Arc<Hub<S>>>) -> Response {
    Json(hub.fleet.releases()).into_response()
}

/// `POST /v1/admin/releases/{version}/resume`.
pub(super) async fn resume<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    ApiPath(v): ApiPath<String>,
) -> ApiResult<Response> {
    version(&v)?;
    hub.fleet.resume_release(&v).await?;
    Ok(Json(hub.fleet.releases()).into_response())
}

#[derive(Deserialize)]
pub(super) struct DownloadQuery {
    agent: String,
}

/// A `Range: bytes=N-` or `bytes=N-M` header, as (first, last) within `size`; `Err` for
/// one that cannot be met (416).
fn range(headers: &HeaderMap, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(value) = headers.get(header::RANGE) else {
        return Ok(None);
    };
    let spec = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().strip_prefix("bytes="))
        .ok_or(())?;
    let (first, last) = spec.split_once('-').ok_or(())?;
    let first: u64 = first.trim().parse().map_err(|_| ())?;
    let last = match last.trim() {
        "" => size.saturating_sub(1),
        l => l
            .parse::<u64>()
            .map_err(|_| ())?
            .min(size.saturating_sub(1)),
    };
    if first >= size || last < first {
        return Err(());
    }
    Ok(Some((first, last)))
}

/// Brings a binary another replica published into this one's data dir, checked
/// against the SHA-256 it was published with.
async fn fetch_shared<S: Store>(
    hub: &Hub<S>,
    sha256: &str,
    path: &std::path::Path,
) -> ApiResult<()> {
    let missing = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("the binary {sha256} is published but this hub does not have it"),
        )
    };
    let _one = hub.fetching.lock().await;
    if path.exists() {
        // Brought in while this request waited.
        return Ok(());
    }
    let data = hub
        .fleet
        .shared_release_bytes(sha256)
        .await?
        .ok_or_else(missing)?;
    let got: String = Sha256::digest(&data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if got != sha256 {
        return Err(internal(
            format!("the stored binary {sha256} has SHA-256 {got}"),
            &std::io::Error::other("corrupt in the database"),
        ));
    }
    let dir = hub.releases_dir.clone();
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&dir)?;
        crate::util::write_atomic(&path, &data, 0o600)
    })
    .await
    .map_err(|e| {
        internal(
            "could not store the binary".into(),
            &std::io::Error::other(e),
        )
    })?
    .map_err(|e| internal("could not store the binary".into(), &e))
}

/// `GET /v1/releases/{version}/{os}-{arch}?agent=ID`, with the agent's token.
pub(super) async fn download<S: Store>(
    State(hub): State<Arc<Hub<S>>>,
    peer: Option<axum::Extension<crate::serve::Peer>>,
    ApiPath((v, plat)): ApiPath<(String, String)>,
    query: Result<Query<DownloadQuery>, QueryRejection>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let Query(q) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid query: {} (give ?agent=ID)", e.body_text()),
        )
    })?;
    let authorized = bearer(&headers)
        .map_err(|why| ApiError::new(StatusCode::UNAUTHORIZED, why))
        .and_then(|t| Ok(hub.fleet.authorize(&q.agent, t)?));
    let action = ("GET /v1/releases/{version}/{platform}", q.agent.as_str());
    checked(
        &hub,
        AuthRoute::Agent,
        peer_ip(peer.as_ref()),
        action,
        authorized,
    )
    .await?;
    crate::unproven::proven();
    version(&v)?;
    let (os, arch) = platform(&plat)?;
    let row = hub.fleet.release(&v, &os, &arch).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no release {v} for {os}-{arch} is published"),
        )
    })?;
    let path = hub.releases_dir.join(&row.sha256);
    let mut file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fetch_shared(&hub, &row.sha256, &path).await?;
            std::fs::File::open(&path)
                .map_err(|e| internal(format!("could not open {}", path.display()), &e))?
        }
        Err(e) => return Err(internal(format!("could not open {}", path.display()), &e)),
    };
    let size = row.size;
    let (status, first, last) = match range(&headers, size) {
        Ok(None) => (StatusCode::OK, 0, size.saturating_sub(1)),
        Ok(Some((f, l))) => (StatusCode::PARTIAL_CONTENT, f, l),
        Err(()) => {
            let mut resp = ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                format!("the range asked for is not within the {size} bytes of release {v}"),
            )
            .into_response();
            if let Ok(h) = HeaderValue::from_str(&format!("bytes */{size}")) {
                resp.headers_mut().insert(header::CONTENT_RANGE, h);
            }
            return Ok(resp);
        }
    };
    file.seek(SeekFrom::Start(first))
        .map_err(|e| internal(format!("could not read {}", path.display()), &e))?;
    let length = last + 1 - first;
    let file = tokio::fs::File::from_std(file);
    // Once the artifact's last byte is read for the connection (the whole, or the range
    // that ends a download resumed after an interruption, a hub's restart included), the
    // agent has fetched the version: a rollout's evidence (docs/hub.md, "Rollouts").
    let served = Fetch {
        agent: q.agent.clone(),
        version: v.clone(),
        now_ms: 0,
    };
    let to_end = last + 1 >= size;
    let state = (file, length, to_end.then(|| (hub.fleet.clone(), served)));
    let stream = futures_util::stream::unfold(state, |(mut file, left, mut done)| async move {
        if left == 0 {
            return None;
        }
        let mut buf = vec![0u8; CHUNK.min(usize::try_from(left).unwrap_or(CHUNK))];
        match file.read(&mut buf).await {
            Ok(0) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the release file is shorter than recorded",
                )),
                (file, 0, None),
            )),
            Ok(n) => {
                buf.truncate(n);
                let left = left - n as u64;
                // The last bytes read (hyper stops asking once Content-Length is met).
                if left == 0 {
                    if let Some((fleet, mut served)) = done.take() {
                        served.now_ms = crate::util::unix_now_ms();
                        fleet.record_fetch(served).await;
                    }
                }
                Some((Ok(bytes::Bytes::from(buf)), (file, left, done)))
            }
            Err(e) => Some((Err(e), (file, 0, None))),
        }
    });
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    if status == StatusCode::PARTIAL_CONTENT {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {first}-{last}/{size}")) {
            h.insert(header::CONTENT_RANGE, v);
        }
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_read_within_the_file() {
        let mut h = HeaderMap::new();
        assert_eq!(range(&h, 10), Ok(None));
        h.insert(header::RANGE, HeaderValue::from_static("bytes=4-"));
        assert_eq!(range(&h, 10), Ok(Some((4, 9))));
        h.insert(header::RANGE, HeaderValue::from_static("bytes=2-100"));
        assert_eq!(range(&h, 10), Ok(Some((2, 9))));
        for bad in ["bytes=10-", "bytes=5-4", "items=1-", "bytes=-5", "bytes=x-"] {
            h.insert(header::RANGE, HeaderValue::from_static(bad));
            assert_eq!(range(&h, 10), Err(()), "{bad}");
        }
    }

    #[test]
    fn platforms_and_signatures_parse() {
        assert_eq!(
            platform("linux-x86_64").ok(),
            Some(("linux".into(), "x86_64".into()))
        );
        assert!(platform("linux").is_err());
        assert!(platform("../x-y").is_err());
        assert_eq!(hex_decode("6869"), Some(b"hi".to_vec()));
        assert_eq!(hex_decode("6"), None);
        assert_eq!(hex_decode("zz"), None);
    }
}
