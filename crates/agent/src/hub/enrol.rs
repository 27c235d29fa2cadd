//! A host's first contact with a hub that knows it by an enrolment token only
//! (`agent run --enrol-token FILE`): the token is traded for the agent's own, which is
//! kept in the token file (0600, written and fsynced in place before anything uses it)
//! and used from then on; the enrolment token is not needed again.
//!
//! Neither token is ever logged, printed or kept anywhere else. A hub out of reach (or
//! answering 5xx or 429) is tried again, in turn with the other replicas, with a growing
//! pause; a refusal (a spent, expired or revoked token, an id another host has) ends the
//! agent with the hub's reason: trying again would not help.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};

use super::HubLinkError;
use crate::config::HubSettings;
use crate::hub_client;
use crate::proto::access::SelfEnrol;
use crate::proto::hub::{Enrolled, ErrorBody};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);
/// The most of a hub's answer read.
const MAX_ANSWER: usize = 64 * 1024;

/// Enrols this host unless its token file exists; then the token file holds its token.
pub async fn enrol_if_needed(settings: &HubSettings) -> Result<(), HubLinkError> {
    let Some(enrol_file) = &settings.enrol_token_file else {
        return Ok(());
    };
    if settings.token_file.exists() {
        return Ok(());
    }
    let path = enrol_file.clone();
    let text = tokio::task::spawn_blocking(move || {
        crate::small_file::read_string(&path, crate::small_file::TOKEN_MAX)
    })
    .await
    .map_err(|source| HubLinkError::Task {
        what: "enrolment token read",
        source,
    })?
    .map_err(|source| HubLinkError::TokenRead {
        path: enrol_file.clone(),
        source,
    })?;
    let token = text.trim().to_owned();
    if token.is_empty() {
        return Err(HubLinkError::TokenEmpty {
            path: enrol_file.clone(),
        });
    }
    let auth = hub_client::bearer(&token).map_err(|_| HubLinkError::TokenInvalid {
        path: enrol_file.clone(),
    })?;
    let client = hub_client::build(settings.ca_file.as_deref(), CONNECT_TIMEOUT)
        .map_err(HubLinkError::Client)?;
    let body = serde_json::to_vec(&SelfEnrol {
        id: settings.agent_id.clone(),
        hostname: crate::sys::hostname().unwrap_or_default(),
    })
    .map_err(|source| HubLinkError::Encode {
        url: settings.urls[0].clone(),
        source,
    })?;
    let mut pause = crate::util::Doubling::new(RETRY_FIRST, RETRY_MAX);
    let mut failing: Option<String> = None;
    for attempt in 0usize.. {
        let url = format!("{}/v1/enrol", settings.urls[attempt % settings.urls.len()]);
        let sent = client
            .post(&url)
            .header(AUTHORIZATION, auth.clone())
            .header(CONTENT_TYPE, "application/json")
            .timeout(REQUEST_TIMEOUT)
            .body(body.clone())
            .send()
            .await;
        let why = match sent {
            Ok(resp) => {
                let status = resp.status();
                let bytes = hub_client::read_capped(resp, MAX_ANSWER)
                    .await
                    .map_err(HubLinkError::Client)?;
                if status == reqwest::StatusCode::CREATED {
                    let enrolled: Enrolled =
                        serde_json::from_slice(&bytes).map_err(|e| HubLinkError::Decode {
                            url: url.clone(),
                            why: redact(&e.to_string(), &token),
                        })?;
                    return keep(settings, &enrolled.token, &url).await;
                }
                let message = serde_json::from_slice::<ErrorBody>(&bytes)
                    .map(|b| b.error)
                    .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
                let message = redact(&message, &token);
                if status.as_u16() == 429 || status.is_server_error() {
                    format!("{url} answered {}: {message}", status.as_u16())
                } else {
                    return Err(HubLinkError::EnrolRefused {
                        url,
                        status: status.as_u16(),
                        message,
                    });
                }
            }
            Err(e) => format!("could not reach {url}: {}", e.without_url()),
        };
        if failing.as_deref() != Some(why.as_str()) {
            tracing::warn!(error = %why, "could not enrol with the hub yet; trying again");
            failing = Some(why);
        }
        tokio::time::sleep(pause.pause()).await;
    }
    unreachable!("the loop returns")
}

/// Writes the agent's own token where the agent reads it from (0600, fsynced, replacing
/// nothing but a file of the same name half written).
async fn keep(settings: &HubSettings, token: &str, url: &str) -> Result<(), HubLinkError> {
    if hub_client::bearer(token).is_err() || !token.starts_with("rga_") {
        return Err(HubLinkError::Decode {
            url: url.to_owned(),
            why: "the token the hub sent is not an agent token".into(),
        });
    }
    let path = settings.token_file.clone();
    let line = format!("{token}\n");
    let written = tokio::task::spawn_blocking(move || {
        crate::util::write_atomic(&path, line.as_bytes(), 0o600)
    })
    .await
    .map_err(|source| HubLinkError::Task {
        what: "token write",
        source,
    })?;
    written.map_err(|source| HubLinkError::TokenWrite {
        path: settings.token_file.clone(),
        source,
    })?;
    tracing::info!(agent_id = %settings.agent_id, token_file = %settings.token_file.display(), "enrolled with the hub; the agent's own token is kept in its token file (the enrolment token is not needed again)");
    Ok(())
}

/// `text` without `token` in it.
fn redact(text: &str, token: &str) -> String {
    text.replace(token, "<redacted>")
}
