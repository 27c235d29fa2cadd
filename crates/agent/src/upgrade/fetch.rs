//! The download of a release into the executable's own directory (so that the switch is
//! one rename on one file system): capped at the size the desired state names, refused
//! early when the file system cannot hold it, resumed with HTTP Range after an
//! interruption (from the bytes already on disk, also after an agent restart).
//!
//! Nothing downloaded is trusted here: the bytes are checked afterwards
//! ([`super::candidate`]), and until then the file is mode 0600.

use std::io::SeekFrom;
use std::path::Path;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, CONTENT_RANGE, RANGE};
use reqwest::StatusCode;
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use super::UpgradeError;
use crate::proto::desired::Artifact;
use crate::sys::dirfd::Dir;
use crate::upload::HubLink;

/// Room left on the file system beyond the download: the rest of the host must still
/// be able to write its logs.
const SPACE_MARGIN: u64 = 16 * 1024 * 1024;
/// Tries of one download before the upgrade is retried later.
const TRIES: u32 = 5;
/// The longest wait for the next piece of the body.
const IDLE: Duration = Duration::from_secs(30);

/// The artifact's URL on the agent's own hub: a path, or an absolute URL of the same
/// origin. The agent's token goes nowhere else.
fn url_of(link: &HubLink, art: &Artifact) -> Result<String, UpgradeError> {
    if art.url.starts_with('/') && !art.url.starts_with("//") {
        return Ok(format!("{}{}", link.url, art.url));
    }
    if art
        .url
        .strip_prefix(link.url.as_str())
        .is_some_and(|rest| rest.starts_with('/'))
    {
        return Ok(art.url.clone());
    }
    Err(UpgradeError::ForeignUrl {
        url: crate::util::clip(&art.url).into_owned(),
        hub: link.url.clone(),
    })
}

/// Downloads `art` into `name` in `dir` (at `dir_path`, for messages). On success the
/// file holds exactly `art.size` bytes, synced.
pub(super) async fn download(
    link: &HubLink,
    art: &Artifact,
    dir: &Dir,
    dir_path: &Path,
    name: &str,
) -> Result<(), UpgradeError> {
    let url = url_of(link, art)?;
    let path = dir_path.join(name);
    let io = |source| UpgradeError::Io {
        path: path.clone(),
        source,
    };
    let file = dir.write_file(name, 0o600).map_err(io)?;
    let mut have = file.metadata().map_err(io)?.len();
    if have > art.size {
        file.set_len(0).map_err(io)?;
        have = 0;
    }
    // Written through tokio's blocking pool: a slow disk must not stall the agent.
    let mut file = tokio::fs::File::from_std(file);
    let free = dir.free_space().map_err(io)?;
    let need = art.size - have;
    if free < need.saturating_add(SPACE_MARGIN) {
        drop(file);
        let _ = dir.remove_file(name);
        return Err(UpgradeError::NoSpace {
            dir: dir_path.to_owned(),
            need,
            free,
        });
    }
    let mut tries = 0;
    loop {
        if have == art.size {
            break;
        }
        tries += 1;
        match fetch_from(link, &url, art.size, &mut file, &mut have).await {
            Ok(()) if have == art.size => break,
            Ok(()) => {
                tracing::warn!(%url, have, size = art.size, "the download ended early; resuming");
            }
            Err(Fetch::Disk(source)) => {
                drop(file);
                let _ = dir.remove_file(name);
                if crate::sys::errno::is_no_space(&source) {
                    return Err(UpgradeError::NoSpace {
                        dir: dir_path.to_owned(),
                        need: art.size - have,
                        free: dir.free_space().unwrap_or(0),
                    });
                }
                return Err(UpgradeError::Io { path, source });
            }
            Err(Fetch::TooLarge) => {
                drop(file);
                let _ = dir.remove_file(name);
                return Err(UpgradeError::TooLarge {
                    url,
                    size: art.size,
                });
            }
            Err(Fetch::Net(why)) => {
                if tries >= TRIES {
                    return Err(UpgradeError::Download { url, why });
                }
                tracing::warn!(%url, have, size = art.size, error = %why, "the download was interrupted; resuming from the bytes on disk");
            }
        }
        if tries >= TRIES {
            return Err(UpgradeError::Download {
                url,
                why: format!("ended at byte {have} of {}", art.size),
            });
        }
        tokio::time::sleep(Duration::from_millis(250 * u64::from(tries))).await;
    }
    file.sync_all().await.map_err(io)?;
    Ok(())
}

enum Fetch {
    /// Worth another try from where it stopped.
    Net(String),
    /// The server sends more than the desired state said: refused, never stored.
    TooLarge,
    Disk(std::io::Error),
}

/// One request: from `*have` to the end, written at `*have` as it arrives.
async fn fetch_from(
    link: &HubLink,
    url: &str,
    size: u64,
    file: &mut tokio::fs::File,
    have: &mut u64,
) -> Result<(), Fetch> {
    let mut req = link
        .client
        .get(url)
        .header(AUTHORIZATION, link.auth.clone());
    if *have > 0 {
        req = req.header(RANGE, format!("bytes={have}-"));
    }
    let mut resp = match tokio::time::timeout(IDLE, req.send()).await {
        Err(_) => {
            return Err(Fetch::Net(format!(
                "no answer within {}",
                humantime::format_duration(IDLE)
            )))
        }
        Ok(r) => r.map_err(|e| Fetch::Net(crate::util::error_chain(&e.without_url())))?,
    };
    match resp.status() {
        StatusCode::PARTIAL_CONTENT => {
            let start = resp
                .headers()
                .get(CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("bytes "))
                .and_then(|v| v.split_once('-'))
                .and_then(|(s, _)| s.parse::<u64>().ok());
            if start != Some(*have) {
                return Err(Fetch::Net(format!(
                    "asked for the bytes from {have}, got a range from {start:?}"
                )));
            }
        }
        StatusCode::OK => {
            // The whole file again: start over.
            *have = 0;
            file.set_len(0).await.map_err(Fetch::Disk)?;
        }
        s => {
            let text = crate::hub_client::read_capped(resp, 4096)
                .await
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            return Err(Fetch::Net(format!(
                "answered {s}: {}",
                crate::util::clip(text.trim())
            )));
        }
    }
    file.seek(SeekFrom::Start(*have))
        .await
        .map_err(Fetch::Disk)?;
    loop {
        let chunk = match tokio::time::timeout(IDLE, resp.chunk()).await {
            Err(_) => {
                return Err(Fetch::Net(format!(
                    "no data for {}",
                    humantime::format_duration(IDLE)
                )))
            }
            Ok(Err(e)) => return Err(Fetch::Net(crate::util::error_chain(&e.without_url()))),
            Ok(Ok(None)) => return Ok(()),
            Ok(Ok(Some(c))) => c,
        };
        if *have + chunk.len() as u64 > size {
            return Err(Fetch::TooLarge);
        }
        file.write_all(&chunk).await.map_err(Fetch::Disk)?;
        // Each piece reaches the disk before it counts: a resume starts from what is
        // there, and a full disk shows here, not at the end.
        file.flush().await.map_err(Fetch::Disk)?;
        *have += chunk.len() as u64;
    }
}
