//! A flood of clients without a token against a running hub, beside honest agents: how
//! much the hub grows, whether it gives the memory back, and what the honest agents see.
//! Used by `bench/hub_flood.sh`; see docs/benchmarks.md.
//!
//!   hub_flood DATA_DIR FLOOD_CONNECTIONS [HONEST_AGENTS] [ROUNDS]
//!
//! Each flood connection completes TLS, then sends a request line and headers that never
//! end (`FLOOD_PAD_KIB`, default 1024, 4 KiB at a time), and holds the connection while it
//! may: 1 MiB measures the buffers, 12 KiB (under the hub's bound) the unproven budget. Meanwhile
//! the honest agents long-poll; fleet changes are timed until every honest agent has
//! them, and a new honest connection's first reconcile is timed. Then the flood stops
//! and the hub's memory is read again. Ends with one JSON line.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use railgrid::hub_client;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};

#[path = "common/agent_link.rs"]
mod agent_link;
#[path = "common/hub_dir.rs"]
mod hub_dir;
use hub_dir::HubDir as Hub;

/// What a flood connection sends of its never-ending headers, at most.
fn pad() -> usize {
    std::env::var("FLOOD_PAD_KIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1024)
        << 10
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS for pid {pid}"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(generation: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "version": "bench", "os": "linux", "arch": "x86_64", "hostname": "bench",
        "observed_generation": generation,
    }))
    .unwrap_or_default()
}

async fn reconcile(
    http: &reqwest::Client,
    url: &str,
    auth: &reqwest::header::HeaderValue,
    generation: u64,
    wait: u64,
) -> anyhow::Result<u64> {
    let resp = http
        .post(url)
        .query(&[("wait", wait)])
        .header(reqwest::header::AUTHORIZATION, auth.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(report(generation))
        .timeout(Duration::from_secs(wait + 30))
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success(), "reconcile: {}", resp.status());
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await?)?;
    v["generation"].as_u64().context("generation")
}

/// An honest agent: long polls, telling `seen` each new generation.
async fn honest(
    http: reqwest::Client,
    url: String,
    auth: reqwest::header::HeaderValue,
    seen: mpsc::UnboundedSender<(u64, Instant)>,
    errors: Arc<AtomicU64>,
) {
    let mut generation = 0;
    loop {
        match reconcile(&http, &url, &auth, generation, 30).await {
            Ok(g) if g != generation => {
                generation = g;
                let _ = seen.send((g, Instant::now()));
            }
            Ok(_) => {}
            Err(_) => {
                errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// One flood connection; counts itself in `handshaked` once TLS is up, and holds on
/// until `stop` or the hub closes it.
async fn flood_one(
    addr: std::net::SocketAddr,
    tls: tokio_rustls::TlsConnector,
    handshaked: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) {
    let work = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
        let mut s = tls.connect(name, tcp).await.ok()?;
        handshaked.fetch_add(1, Ordering::Relaxed);
        s.write_all(b"POST /v1/agents/x/reconcile HTTP/1.1\r\nHost: x\r\nX-Pad: ")
            .await
            .ok()?;
        let chunk = vec![b'a'; 4 << 10];
        let (mut sent, pad) = (0, pad());
        while sent < pad {
            s.write_all(&chunk).await.ok()?;
            sent += chunk.len();
        }
        // Held open, headers unfinished, until the hub gives up on it.
        let mut buf = [0u8; 1024];
        let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
        Some(())
    };
    tokio::select! {
        _ = work => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage_line = "usage: hub_flood DATA_DIR FLOOD_CONNECTIONS [HONEST_AGENTS] [ROUNDS]";
    let dir = PathBuf::from(args.get(1).ok_or_else(|| anyhow!(usage_line))?);
    let flood: usize = args.get(2).ok_or_else(|| anyhow!(usage_line))?.parse()?;
    let n: usize = args.get(3).map_or(Ok(200), |s| s.parse())?;
    let rounds: usize = args.get(4).map_or(Ok(5), |s| s.parse())?;
    railgrid::sys::raise_open_files_limit()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(&dir, flood, n, rounds))
}

/// Fleet changes, each timed until every honest agent has it (`n` of them).
async fn propagation(
    hub: &Hub,
    rx: &mut mpsc::UnboundedReceiver<(u64, Instant)>,
    n: usize,
    rounds: usize,
    base: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut lat = Vec::new();
    for round in 0..rounds {
        while rx.try_recv().is_ok() {}
        let t = Instant::now();
        let v = hub
            .admin(
                reqwest::Method::PUT,
                "/v1/admin/desired/fleet",
                serde_json::json!({"set": {"max_jobs": base + round + 1}}),
            )
            .await?;
        let g = v["generation"].as_u64().context("generation")?;
        let mut got = 0;
        let deadline = t + Duration::from_secs(60);
        while got < n {
            match tokio::time::timeout_at(deadline.into(), rx.recv()).await {
                Ok(Some((seen, at))) if seen >= g => {
                    got += 1;
                    lat.push(at - t);
                }
                Ok(Some(_)) => {}
                _ => anyhow::bail!("round {round}: {got} of {n} agents saw generation {g}"),
            }
        }
    }
    lat.sort();
    Ok(lat)
}

async fn run(dir: &std::path::Path, flood: usize, n: usize, rounds: usize) -> anyhow::Result<()> {
    let hub = Hub::open(dir)?;
    let mut tokens = Vec::new();
    for i in 0..=n {
        let v = hub
            .admin(
                reqwest::Method::POST,
                "/v1/admin/agents",
                serde_json::json!({"id": format!("honest-{i}")}),
            )
            .await?;
        tokens.push(v["token"].as_str().context("token")?.to_owned());
    }
    let late = tokens.pop().context("a token for the late agent")?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let errors = Arc::new(AtomicU64::new(0));
    for (i, tok) in tokens.iter().enumerate() {
        tokio::spawn(honest(
            hub.http.clone(),
            format!("{}/v1/agents/honest-{i}/reconcile", hub.url),
            hub_client::bearer(tok)?,
            tx.clone(),
            errors.clone(),
        ));
    }
    let mut first = 0;
    while first < n {
        rx.recv().await.context("agents")?;
        first += 1;
    }
    let calm = propagation(&hub, &mut rx, n, rounds, 0).await?;
    let rss_base = rss_kib(hub.pid)?;

    // The flood.
    let ca = std::fs::read(dir.join("ca.pem"))?;
    let tls = agent_link::connector(&ca)?;
    let addr: std::net::SocketAddr = hub
        .url
        .trim_start_matches("https://")
        .parse()
        .context("the hub's address")?;
    let (stop_tx, stop) = watch::channel(false);
    let handshaked = Arc::new(AtomicU64::new(0));
    // The flood runs on a runtime and thread of its own: on the honest agents' runtime,
    // its thousands of tasks would delay the honest answers in this very process, and
    // the figures would be the client's, not the hub's.
    let t = Instant::now();
    let flooding = {
        let handshaked = handshaked.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the flood's runtime");
            rt.block_on(async move {
                let mut flooders = tokio::task::JoinSet::new();
                for _ in 0..flood {
                    flooders.spawn(flood_one(
                        addr,
                        tls.clone(),
                        handshaked.clone(),
                        stop.clone(),
                    ));
                }
                while flooders.join_next().await.is_some() {}
            });
        })
    };
    // The hub's peak while the flood builds up and holds. The admin's connection is kept
    // in use (the client drops one idle for 5 s): the changes below are then timed from a
    // connection already open, as the honest agents' are; a new one's wait is timed apart.
    let mut rss_peak = rss_base;
    let mut kept = Instant::now();
    while t.elapsed() < Duration::from_secs(8) {
        rss_peak = rss_peak.max(rss_kib(hub.pid)?);
        if kept.elapsed() >= Duration::from_secs(1) {
            hub.admin(
                reqwest::Method::GET,
                "/v1/admin/desired/fleet",
                serde_json::json!({}),
            )
            .await?;
            kept = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let during = propagation(&hub, &mut rx, n, rounds, rounds).await?;
    // New agents, each with a client of its own: a new connection, which must find a
    // place among the unproven and a turn to shake hands. The slowest of five.
    let mut new_conn = Duration::ZERO;
    let mut late_ok = true;
    for _ in 0..5 {
        let fresh = reqwest::Client::builder()
            .use_rustls_tls()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
            .build()?;
        let t_new = Instant::now();
        late_ok &= reconcile(
            &fresh,
            &format!("{}/v1/agents/honest-{n}/reconcile", hub.url),
            &hub_client::bearer(&late)?,
            0,
            0,
        )
        .await
        .is_ok();
        new_conn = new_conn.max(t_new.elapsed());
    }
    rss_peak = rss_peak.max(rss_kib(hub.pid)?);
    let shaken = handshaked.load(Ordering::Relaxed);
    stop_tx.send_replace(true);
    tokio::task::spawn_blocking(move || flooding.join())
        .await?
        .map_err(|_| anyhow!("the flood's thread panicked"))?;
    // Past the hub's next look at its connections (every 5 s).
    tokio::time::sleep(Duration::from_secs(7)).await;
    let rss_after = rss_kib(hub.pid)?;

    let mib = |k: u64| k as f64 / 1024.0;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "hub RSS: {:.1} MiB with {n} honest polls, {:.1} MiB at the flood's peak ({flood} connections, {shaken} of them through TLS), {:.1} MiB after it",
        mib(rss_base),
        mib(rss_peak),
        mib(rss_after)
    );
    println!(
        "honest agents, fleet change -> all: calm p50 {:.1} ms p99 {:.1} ms; under the flood p50 {:.1} ms p99 {:.1} ms; a new agent's first reconcile at most {:.1} ms of 5 ({}); errors {}",
        ms(percentile(&calm, 0.5)),
        ms(percentile(&calm, 0.99)),
        ms(percentile(&during, 0.5)),
        ms(percentile(&during, 0.99)),
        ms(new_conn),
        if late_ok { "answered" } else { "failed" },
        errors.load(Ordering::Relaxed)
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "hub_flood", "flood": flood, "honest": n, "handshaked": shaken,
            "pad_kib": pad() >> 10,
            "rss_base_mib": (mib(rss_base) * 10.0).round() / 10.0,
            "rss_peak_mib": (mib(rss_peak) * 10.0).round() / 10.0,
            "rss_after_mib": (mib(rss_after) * 10.0).round() / 10.0,
            "calm_p99_ms": (ms(percentile(&calm, 0.99)) * 10.0).round() / 10.0,
            "flood_p50_ms": (ms(percentile(&during, 0.5)) * 10.0).round() / 10.0,
            "flood_p99_ms": (ms(percentile(&during, 0.99)) * 10.0).round() / 10.0,
            "new_agent_ms": (ms(new_conn) * 10.0).round() / 10.0,
        })
    );
    Ok(())
}
