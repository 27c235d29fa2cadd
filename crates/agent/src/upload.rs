//! One job stream, from the runner's spool to the hub: the runner's followed output
//! (`GET /v1/jobs/{id}/output/{stream}?follow=true&offset=N`) is read as it is written,
//! and sent on in pieces with `PUT {hub}/v1/jobs/{id}/output/{stream}?offset=N`.
//!
//! The hub's acknowledged length is the only position there is: an upload starts by
//! asking for it (an empty upload at offset 0), and after any failure (the hub or the
//! runner gone, a 409 for a gap) it starts over from what the hub acknowledged, so no
//! byte is sent twice into the stream or left out of it. Uploads are idempotent by
//! offset, so repeating one the hub took changes nothing.
//!
//! The job never waits for this: it writes to its spool, and the upload reads the spool
//! behind it. Memory is bounded per stream: one piece being sent and what arrived
//! meanwhile, at most [`PIECE`] each.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http_body_util::BodyExt;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};

use crate::hub_client;
use crate::proto::fleet_job::OutputAck;
use crate::proto::job::Stream;
use crate::runner::client::Client;

/// The most sent in one upload (the hub takes at most 1 MiB).
pub(super) const PIECE: usize = 1024 * 1024;
/// One upload's time limit.
const PUT_TIMEOUT: Duration = Duration::from_secs(30);
/// Pauses after a failure: doubling from the first to the longest.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// The link in use, as the hub task publishes it (`None`: no hub); read anew at each
/// request, so a SIGHUP's new token or another replica applies to the next one.
pub(super) type Links = tokio::sync::watch::Receiver<Option<HubLink>>;

/// How the agent reaches the hub for uploads: its client, its URL and the agent's
/// token (as the sensitive header that carries it, nowhere else).
#[derive(Clone)]
pub(super) struct HubLink {
    pub(super) client: reqwest::Client,
    pub(super) url: String,
    pub(super) auth: HeaderValue,
}

/// Why one upload did not go through.
enum PutError {
    /// The hub holds less than the offset: resume from its length.
    Gap(u64),
    /// Worth trying again after a pause (the hub unreachable, 5xx, 429, a refused token
    /// that a SIGHUP may fix).
    Retry(String),
}

impl HubLink {
    /// Uploads `data` at `offset`; the stream's acknowledged length.
    async fn put(
        &self,
        job: &str,
        stream: Stream,
        offset: u64,
        data: Bytes,
    ) -> Result<u64, PutError> {
        let url = format!(
            "{}/v1/jobs/{job}/output/{}?offset={offset}",
            self.url,
            stream.name()
        );
        let resp = self
            .client
            .put(&url)
            .header(AUTHORIZATION, self.auth.clone())
            .header(CONTENT_TYPE, "application/octet-stream")
            .timeout(PUT_TIMEOUT)
            .body(data)
            .send()
            .await
            .map_err(|e| PutError::Retry(format!("{url}: {e}")))?;
        let status = resp.status();
        let body = hub_client::read_capped(resp, 64 * 1024)
            .await
            .map_err(|e| PutError::Retry(crate::error_chain(&e)))?;
        let ack = serde_json::from_slice::<OutputAck>(&body).ok();
        match (status.as_u16(), ack) {
            (200, Some(a)) => Ok(a.length),
            (409, Some(a)) => Err(PutError::Gap(a.length)),
            (code, _) => Err(PutError::Retry(format!("{url} answered {code}"))),
        }
    }
}

/// Grows from [`RETRY_FIRST`] to [`RETRY_MAX`] while failures follow each other.
struct Retry(crate::util::Doubling);

impl Retry {
    fn new() -> Self {
        Self(crate::util::Doubling::new(RETRY_FIRST, RETRY_MAX))
    }

    async fn pause(&mut self) {
        tokio::time::sleep(self.0.pause()).await;
    }

    fn reset(&mut self) {
        self.0.reset();
    }
}

/// Uploads one stream of `job` until the runner has sent all of it (the job has ended)
/// and the hub has acknowledged every byte. `link` is read anew at every try, so a
/// SIGHUP's new token applies to the next one. `known`: what the hub holds, when this
/// agent knows it without asking (0 for a job its runner has just created).
pub(super) async fn upload_stream(
    job: &str,
    stream: Stream,
    runner: &Client,
    link: &Links,
    known: Option<u64>,
) {
    let mut retry = Retry::new();
    let mut failing: Option<String> = None;
    let note = |why: String, failing: &mut Option<String>| {
        if failing.as_deref() != Some(why.as_str()) {
            tracing::warn!(job, stream = stream.name(), error = %why, "job output upload failed; retrying from what the hub holds");
            *failing = Some(why);
        }
    };
    // What the hub holds: where the next try starts.
    let mut acked: Option<u64> = known;
    loop {
        // None: the agent has no hub, and nothing to send it to.
        let Some(hub) = link.borrow().clone() else {
            return;
        };
        let offset = match acked {
            Some(a) => a,
            None => match hub.put(job, stream, 0, Bytes::new()).await {
                Ok(length) => length,
                Err(PutError::Gap(length)) => length,
                Err(PutError::Retry(why)) => {
                    note(why, &mut failing);
                    retry.pause().await;
                    continue;
                }
            },
        };
        acked = Some(offset);
        let mut body = match runner.follow(job, stream, offset).await {
            Ok(b) => b,
            // The runner has no such job (any more): there is nothing to send.
            Err(crate::runner::client::ClientError::Api { status: 404, .. }) => return,
            Err(e) => {
                note(
                    format!("the runner: {}", crate::error_chain(&e)),
                    &mut failing,
                );
                retry.pause().await;
                continue;
            }
        };
        let mut pos = offset;
        let mut buf = BytesMut::new();
        // Some(true): the runner sent all; Some(false): its stream broke.
        let mut end: Option<bool> = None;
        loop {
            // Waits for the first piece, then takes what else is ready, up to a piece.
            if buf.is_empty() && end.is_none() {
                match body.frame().await {
                    None => end = Some(true),
                    Some(Err(_)) => end = Some(false),
                    Some(Ok(f)) => {
                        if let Ok(d) = f.into_data() {
                            buf.extend_from_slice(&d);
                        }
                    }
                }
            }
            while buf.len() < PIECE && end.is_none() {
                // Cancel-safe: a frame future that is not ready holds nothing.
                match body.frame().now_or_never() {
                    None => break,
                    Some(None) => end = Some(true),
                    Some(Some(Err(_))) => end = Some(false),
                    Some(Some(Ok(f))) => {
                        if let Ok(d) = f.into_data() {
                            buf.extend_from_slice(&d);
                        }
                    }
                }
            }
            if buf.is_empty() {
                break;
            }
            let n = buf.len().min(PIECE);
            let piece = buf.split_to(n).freeze();
            let Some(hub) = link.borrow().clone() else {
                return;
            };
            match hub.put(job, stream, pos, piece).await {
                Ok(length) if length == pos + n as u64 => {
                    pos = length;
                    acked = Some(length);
                    retry.reset();
                    if failing.take().is_some() {
                        tracing::info!(
                            job,
                            stream = stream.name(),
                            "job output reaches the hub again"
                        );
                    }
                }
                // The hub holds another length than this stream's position (an upload of an
                // earlier agent went further): start over from it.
                Ok(length) | Err(PutError::Gap(length)) => {
                    acked = Some(length);
                    end = Some(false);
                    break;
                }
                Err(PutError::Retry(why)) => {
                    note(why, &mut failing);
                    end = Some(false);
                    break;
                }
            }
        }
        match end {
            Some(true) if buf.is_empty() => return,
            _ => retry.pause().await,
        }
    }
}
