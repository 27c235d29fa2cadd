//! N simulated agents upgrading through one running hub: each long-polls, and when its
//! desired state names VERSION it downloads the artifact (streamed, hashed, checked),
//! then reports VERSION as committed. Measured: desired version set -> each agent
//! committed (p50/p99/max, and all of them), against the same N downloads made directly
//! at once (the peer: the bytes alone, no protocol). Used by `bench/upgrade.sh`.
//!
//!   upgrade_bench DATA_DIR AGENTS VERSION
//!
//! DATA_DIR is a running hub's data dir; VERSION must be published there for this host's
//! platform.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use railgrid::hub_client;
use railgrid::proto::desired::Artifact;
use railgrid::proto::report::{AgentReport, UpgradeReport};

#[path = "common/hub_dir.rs"]
mod hub_dir;
#[path = "common/hub_http.rs"]
mod hub_http;
use hub_dir::HubDir as Hub;
use hub_http::{download, reconcile};

/// An admin call with a JSON body (or none); its JSON answer.
async fn admin(
    hub: &Hub,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> anyhow::Result<serde_json::Value> {
    let mut req = hub
        .http
        .request(method, format!("{}{path}", hub.url))
        .bearer_auth(&hub.admin);
    if let Some(b) = body {
        req = req
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(&b)?);
    }
    let resp = req.send().await?;
    let status = resp.status();
    let bytes = resp.bytes().await?;
    anyhow::ensure!(
        status.is_success(),
        "{path}: {status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    Ok(serde_json::from_slice(&bytes)?)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(version: &str, generation: u64, committed: bool) -> AgentReport {
    AgentReport {
        version: version.into(),
        os: std::env::consts::OS.into(),
        arch: std::env::consts::ARCH.into(),
        hostname: "bench".into(),
        labels: Default::default(),
        observed_generation: generation,
        runner: Default::default(),
        upgrade: committed.then(|| UpgradeReport::toward("committed", version, None)),
        jobs_summary: None,
        drain: None,
        jobs: Vec::new(),
        jobs_version: None,
        refused_generation: None,
    }
}

/// One simulated agent: long polls until its desired state names `version`, then
/// downloads and reports it committed. When it finished, after `start`.
async fn agent(
    http: reqwest::Client,
    base: String,
    id: String,
    auth: reqwest::header::HeaderValue,
    version: String,
) -> anyhow::Result<Instant> {
    let url = format!("{base}/v1/agents/{id}/reconcile");
    let mut generation = 0;
    loop {
        let d = reconcile(&http, &url, &auth, &report("0.0.1", generation, false), 30).await?;
        generation = d.generation;
        let Some(agent) = d.agent.filter(|a| a.version == version) else {
            continue;
        };
        let Artifact {
            url: path, sha256, ..
        } = agent
            .artifact
            .ok_or_else(|| anyhow!("no artifact for {version}"))?;
        download(&http, &format!("{base}{path}"), &auth, &sha256).await?;
        reconcile(&http, &url, &auth, &report(&version, generation, true), 0).await?;
        return Ok(Instant::now());
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 4,
        "usage: upgrade_bench DATA_DIR AGENTS VERSION"
    );
    let dir = PathBuf::from(&args[1]);
    let n: usize = args[2].parse().context("AGENTS")?;
    let version = args[3].clone();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(dir, n, version))
}

async fn run(dir: PathBuf, n: usize, version: String) -> anyhow::Result<()> {
    let hub = Hub::open(&dir)?;
    let mut auths = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("up-{i}");
        let v = admin(
            &hub,
            reqwest::Method::POST,
            "/v1/admin/agents",
            Some(serde_json::json!({ "id": id })),
        )
        .await?;
        let token = v["token"].as_str().context("token")?;
        auths.push((id, hub_client::bearer(token)?));
    }
    let mut tasks = Vec::with_capacity(n);
    for (id, auth) in &auths {
        tasks.push(tokio::spawn(agent(
            hub.http.clone(),
            hub.url.clone(),
            id.clone(),
            auth.clone(),
            version.clone(),
        )));
    }
    // Every agent holds its poll before the change.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = admin(&hub, reqwest::Method::GET, "/v1/health", None).await?;
        if v["polls_held"].as_u64().unwrap_or(0) >= n as u64 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the agents did not all connect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let start = Instant::now();
    admin(
        &hub,
        reqwest::Method::PUT,
        "/v1/admin/desired/fleet",
        Some(serde_json::json!({ "set": { "version": version } })),
    )
    .await?;
    let mut done = Vec::with_capacity(n);
    for t in tasks {
        done.push(t.await??.duration_since(start));
    }
    let all = start.elapsed();
    done.sort();

    // The peer: the same N downloads, all at once, straight from the hub.
    let releases = admin(&hub, reqwest::Method::GET, "/v1/admin/releases", None).await?;
    let art = releases
        .as_array()
        .and_then(|a| a.iter().find(|r| r["version"] == version.as_str()))
        .and_then(|r| r["artifacts"].as_array()?.first().cloned())
        .context("the release")?;
    let sha = art["sha256"].as_str().context("sha256")?.to_owned();
    let size = art["size"].as_u64().context("size")?;
    let raw_start = Instant::now();
    let mut raw = Vec::with_capacity(n);
    for (id, auth) in &auths {
        let (http, url, auth, sha) = (
            hub.http.clone(),
            format!(
                "{}/v1/releases/{version}/{}-{}?agent={id}",
                hub.url,
                std::env::consts::OS,
                std::env::consts::ARCH
            ),
            auth.clone(),
            sha.clone(),
        );
        raw.push(tokio::spawn(async move {
            download(&http, &url, &auth, &sha)
                .await
                .map(|_| Instant::now())
        }));
    }
    for t in raw {
        t.await??;
    }
    let raw_all = raw_start.elapsed();

    let mib = (size * n as u64) as f64 / (1024.0 * 1024.0);
    println!(
        "{n} simulated agents, artifact {:.1} MiB: desired set -> committed p50 {:.0} ms, p99 {:.0} ms, all {:.0} ms ({:.0} MiB/s); the same {n} downloads alone: {:.0} ms ({:.0} MiB/s); ratio {:.2}",
        size as f64 / (1024.0 * 1024.0),
        percentile(&done, 0.5).as_secs_f64() * 1e3,
        percentile(&done, 0.99).as_secs_f64() * 1e3,
        all.as_secs_f64() * 1e3,
        mib / all.as_secs_f64(),
        raw_all.as_secs_f64() * 1e3,
        mib / raw_all.as_secs_f64(),
        all.as_secs_f64() / raw_all.as_secs_f64(),
    );
    Ok(())
}
