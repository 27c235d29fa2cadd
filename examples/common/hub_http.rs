//! What a simulated agent asks of the hub over reqwest, the way a real agent asks it: a
//! reconcile (held up to `wait` seconds) and a release download checked against its
//! SHA-256.

// Each example takes what it needs of this module.
#![allow(dead_code)]

use std::time::Duration;

use railgrid::proto::desired::DesiredState;
use railgrid::proto::report::AgentReport;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use sha2::Digest;

/// POSTs `report` to the reconcile `url`; the desired state it is answered with.
pub(crate) async fn reconcile(
    http: &reqwest::Client,
    url: &str,
    auth: &HeaderValue,
    report: &AgentReport,
    wait: u64,
) -> anyhow::Result<DesiredState> {
    let resp = http
        .post(url)
        .query(&[("wait", wait)])
        .header(AUTHORIZATION, auth.clone())
        .header(CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(report)?)
        .timeout(Duration::from_secs(wait + 30))
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success(), "reconcile: {}", resp.status());
    Ok(serde_json::from_slice(&resp.bytes().await?)?)
}

/// Downloads `url`, streamed and hashed, and checks its SHA-256; the bytes read.
pub(crate) async fn download(
    http: &reqwest::Client,
    url: &str,
    auth: &HeaderValue,
    sha256: &str,
) -> anyhow::Result<u64> {
    let mut resp = http
        .get(url)
        .header(AUTHORIZATION, auth.clone())
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success(), "download: {}", resp.status());
    let mut hasher = sha2::Sha256::new();
    let mut n = 0u64;
    while let Some(chunk) = resp.chunk().await? {
        n += chunk.len() as u64;
        hasher.update(&chunk);
    }
    let got: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    anyhow::ensure!(got == sha256, "sha256 {got}, expected {sha256}");
    Ok(n)
}
