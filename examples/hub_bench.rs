//! N simulated agents long-polling running hubs, on a few threads: polls held, hub
//! memory and CPU at idle, what a metrics scrape costs, propagation of a fleet change to
//! every agent, and reconciles/s at steady state. Used by `bench/hub.sh` and
//! `bench/hub_replicas.sh`; see docs/benchmarks.md.
//!
//!   hub_bench DATA_DIR[,DATA_DIR…] AGENTS [ROUNDS] [BUSY_CLIENTS] [BUSY_SECS]
//!
//! Each DATA_DIR is a running hub's data dir (its hub.json, admin.token and ca.pem are
//! read). With several (replicas on one database), agent i polls hub i mod n, and every
//! change is made through the first: the others learn of it from the database.
//! `BENCH_DB_XACTS`, a shell command printing the database's transaction count, makes
//! the benchmark report database transactions per reconcile.
//!
//! Each simulated agent long polls over a TLS connection of its own with hyper's HTTP/1.1
//! client ([`agent_link`]), as lean as etcd's watchers in `etcd_bench`; the admin calls,
//! scrapes and busy clients go through reqwest.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use railgrid::hub_client;
use railgrid::proto::report::AgentReport;
use tokio::sync::mpsc;

#[path = "common/measure.rs"]
mod measure;
use measure::{percentile, usage};

#[path = "common/agent_link.rs"]
mod agent_link;
#[path = "common/hub_dir.rs"]
mod hub_dir;
#[path = "common/hub_http.rs"]
mod hub_http;
use hub_dir::HubDir as Hub;

impl Hub {
    async fn polls_held(&self) -> anyhow::Result<u64> {
        let bytes = self
            .http
            .get(format!("{}/v1/health", self.url))
            .send()
            .await?
            .bytes()
            .await?;
        let v: serde_json::Value = serde_json::from_slice(&bytes)?;
        v["polls_held"].as_u64().context("polls_held")
    }
}

fn report(generation: u64) -> AgentReport {
    AgentReport {
        version: "bench".into(),
        os: "linux".into(),
        arch: "x86_64".into(),
        hostname: "bench".into(),
        labels: Default::default(),
        observed_generation: generation,
        runner: Default::default(),
        upgrade: None,
        drain: None,
        jobs_summary: None,
        jobs: Vec::new(),
        jobs_version: None,
        refused_generation: None,
    }
}

/// The database's transaction count, if `BENCH_DB_XACTS` says how to get it.
fn db_xacts() -> Option<u64> {
    let cmd = std::env::var("BENCH_DB_XACTS").ok()?;
    let out = std::process::Command::new("sh")
        .args(["-c", &cmd])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// All a simulated agent reads of its desired state.
#[derive(serde::Deserialize)]
struct Generation {
    generation: u64,
}

/// One simulated agent: long polls forever over a link of its own, telling `seen` each
/// generation it gets.
async fn agent(
    target: agent_link::Target,
    path: String,
    auth: reqwest::header::HeaderValue,
    seen: mpsc::UnboundedSender<(u64, Instant, usize)>,
    errors: Arc<AtomicU64>,
    replica: usize,
) {
    let mut generation = 0;
    let mut link = None;
    loop {
        let polled = async {
            if link.is_none() {
                link = Some(agent_link::Link::connect(&target).await?);
            }
            let link = link.as_mut().context("a link")?;
            let body = serde_json::to_vec(&report(generation))?;
            let answer = link
                .post(&path, &auth, body, Duration::from_secs(30 + 30))
                .await?;
            anyhow::Ok(serde_json::from_slice::<Generation>(&answer)?)
        };
        match polled.await {
            Ok(d) => {
                if d.generation != generation {
                    generation = d.generation;
                    let _ = seen.send((generation, Instant::now(), replica));
                }
            }
            Err(_) => {
                link = None;
                errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage_line = "usage: hub_bench DATA_DIR AGENTS [ROUNDS] [BUSY_CLIENTS] [BUSY_SECS]";
    let dirs: Vec<PathBuf> = args
        .get(1)
        .ok_or_else(|| anyhow!(usage_line))?
        .split(',')
        .map(PathBuf::from)
        .collect();
    let n: usize = args.get(2).ok_or_else(|| anyhow!(usage_line))?.parse()?;
    let rounds: usize = args.get(3).map_or(Ok(5), |s| s.parse())?;
    let busy: usize = args.get(4).map_or(Ok(64), |s| s.parse())?;
    let busy_secs: u64 = args.get(5).map_or(Ok(10), |s| s.parse())?;
    railgrid::sys::raise_open_files_limit()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(&dirs, n, rounds, busy, busy_secs))
}

/// Summed over the hubs: (resident KiB, CPU seconds).
fn usage_all(hubs: &[Arc<Hub>]) -> anyhow::Result<(u64, f64)> {
    let mut total = (0, 0.0);
    for h in hubs {
        let (rss, cpu) = usage(h.pid)?;
        total.0 += rss;
        total.1 += cpu;
    }
    Ok(total)
}

async fn polls_held(hubs: &[Arc<Hub>]) -> u64 {
    let mut n = 0;
    for h in hubs {
        n += h.polls_held().await.unwrap_or(0);
    }
    n
}

/// Sequential admin GETs of one path: their latencies, size and the hub's CPU each.
struct Scrapes {
    n: usize,
    p50: Duration,
    max: Duration,
    bytes: usize,
    cpu_ms: f64,
}

/// Fleet changes, one at a time, and when each agent had each.
struct Rounds {
    /// Every agent's time from the change to its answer, sorted.
    all: Vec<Duration>,
    /// The same for agents held by a hub other than the one the change was made through.
    others: Vec<Duration>,
    /// The last agent's time, per change.
    worst: Vec<Duration>,
    /// The generation of the last change.
    latest: u64,
    /// The hubs' CPU seconds per change, until the last agent had it.
    hub_cpu: Vec<String>,
}

/// `rounds` fleet changes through the first hub, each timed until all `n` agents told
/// `rx` they had it.
async fn propagation(
    hubs: &[Arc<Hub>],
    rx: &mut mpsc::UnboundedReceiver<(u64, Instant, usize)>,
    n: usize,
    rounds: usize,
) -> anyhow::Result<Rounds> {
    let mut all = Vec::new();
    // Agents held by a hub other than the one the change was made through.
    let mut others = Vec::new();
    let mut worst = Vec::new();
    let mut latest = 0;
    let mut hub_cpu_rounds = Vec::new();
    for r in 0..rounds {
        let (_, cpu0) = usage_all(hubs)?;
        let t0 = Instant::now();
        let v = hubs[0]
            .admin(
                reqwest::Method::PUT,
                "/v1/admin/desired/fleet",
                serde_json::json!({"set": {"max_jobs": r + 1}}),
            )
            .await?;
        let g = v["generation"].as_u64().context("generation")?;
        latest = g;
        let mut got = 0;
        let mut lat = Vec::with_capacity(n);
        while got < n {
            let (gen, at, replica) = tokio::time::timeout(Duration::from_secs(60), rx.recv())
                .await
                .map_err(|_| anyhow!("round {r}: {got} of {n} agents saw generation {g}"))?
                .context("agents gone")?;
            if gen >= g {
                got += 1;
                lat.push(at - t0);
                if replica != 0 {
                    others.push(at - t0);
                }
            }
        }
        lat.sort();
        hub_cpu_rounds.push(format!("{:.2}", usage_all(hubs)?.1 - cpu0));
        worst.push(*lat.last().expect("n > 0"));
        all.extend(lat);
        // Let every agent's next poll be held again before the next round.
        let t = Instant::now();
        while (polls_held(hubs).await as usize) < n && t.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    all.sort();
    others.sort();
    Ok(Rounds {
        all,
        others,
        worst,
        latest,
        hub_cpu: hub_cpu_rounds,
    })
}

/// What `busy` clients reconciling without waiting did over the phase.
struct Busy {
    done: f64,
    secs: f64,
    hub_cpu: f64,
    xacts: (Option<u64>, Option<u64>),
}

/// Steady state: `busy` clients reconciling without waiting, as fast as they can, for
/// `busy_secs`, reporting generation `latest`.
async fn busy_phase(
    hubs: &[Arc<Hub>],
    auths: &[(String, reqwest::header::HeaderValue, usize)],
    busy: usize,
    busy_secs: u64,
    latest: u64,
) -> anyhow::Result<Busy> {
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (_, cpu_a) = usage_all(hubs)?;
    let xacts_a = db_xacts();
    let t = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for (url, auth, r) in auths.iter().take(busy) {
        let (url, auth) = (url.clone(), auth.clone());
        let (http, count, stop) = (hubs[*r].http.clone(), count.clone(), stop.clone());
        clients.spawn(async move {
            let report = report(latest);
            while !stop.load(Ordering::Relaxed) {
                if hub_http::reconcile(&http, &url, &auth, &report, 0)
                    .await
                    .is_ok()
                {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(busy_secs)).await;
    stop.store(true, Ordering::Relaxed);
    while clients.join_next().await.is_some() {}
    let secs = t.elapsed().as_secs_f64();
    let (_, cpu_b) = usage_all(hubs)?;
    let xacts_b = db_xacts();
    let done = count.load(Ordering::Relaxed) as f64;
    let hub_cpu = cpu_b - cpu_a;
    Ok(Busy {
        done,
        secs,
        hub_cpu,
        xacts: (xacts_a, xacts_b),
    })
}

async fn scrape(hub: &Hub, path: &str, n: usize) -> anyhow::Result<Scrapes> {
    let mut times = Vec::with_capacity(n);
    let mut bytes = 0;
    let (_, cpu0) = usage(hub.pid)?;
    for _ in 0..n {
        let t = Instant::now();
        let resp = hub
            .http
            .get(format!("{}{path}", hub.url))
            .bearer_auth(&hub.admin)
            .send()
            .await?;
        anyhow::ensure!(resp.status().is_success(), "{path}: {}", resp.status());
        bytes = resp.bytes().await?.len();
        times.push(t.elapsed());
    }
    let (_, cpu1) = usage(hub.pid)?;
    times.sort();
    Ok(Scrapes {
        n,
        p50: percentile(&times, 0.5),
        max: *times.last().context("n > 0")?,
        bytes,
        cpu_ms: (cpu1 - cpu0) * 1000.0 / n as f64,
    })
}

async fn run(
    dirs: &[PathBuf],
    n: usize,
    rounds: usize,
    busy: usize,
    busy_secs: u64,
) -> anyhow::Result<()> {
    let hubs = dirs
        .iter()
        .map(|d| Hub::open(d).map(Arc::new))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let hub = hubs[0].clone();
    let (rss0, _) = usage_all(&hubs)?;

    let t = Instant::now();
    let tokens = hub.enrol_many("bench", n).await?;
    eprintln!("enrolled {n} agents in {:.1?}", t.elapsed());

    let (tx, mut rx) = mpsc::unbounded_channel();
    let errors = Arc::new(AtomicU64::new(0));
    let auths: Vec<(String, reqwest::header::HeaderValue, usize)> = tokens
        .iter()
        .enumerate()
        .map(|(i, (id, tok))| {
            let r = i % hubs.len();
            (
                format!("{}/v1/agents/{id}/reconcile", hubs[r].url),
                hub_client::bearer(tok).expect("header"),
                r,
            )
        })
        .collect();
    // Started at 2000 a second: ten thousand TLS handshakes at once would only measure
    // the handshake timeout (a real fleet reconnecting after a hub restart is spread by
    // its agents' jittered backoff).
    let t = Instant::now();
    let targets = dirs
        .iter()
        .zip(&hubs)
        .map(|(d, h)| agent_link::Target::new(&h.url, &std::fs::read(d.join("ca.pem"))?))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (i, ((id, _), (_, auth, r))) in tokens.iter().zip(&auths).enumerate() {
        tokio::spawn(agent(
            targets[*r].clone(),
            format!("/v1/agents/{id}/reconcile?wait=30"),
            auth.clone(),
            tx.clone(),
            errors.clone(),
            *r,
        ));
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    loop {
        let held = polls_held(&hubs).await;
        if held as usize >= n {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(300),
            "only {held} of {n} polls held after 5 minutes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("{n} polls held after {:.1?}", t.elapsed());
    let ramp_errors = errors.load(Ordering::Relaxed);
    while rx.try_recv().is_ok() {}

    // Idle with every poll held.
    let (_, cpu_a) = usage_all(&hubs)?;
    let idle = Duration::from_secs(10);
    tokio::time::sleep(idle).await;
    let (rss, cpu_b) = usage_all(&hubs)?;
    let idle_cpu = (cpu_b - cpu_a) / idle.as_secs_f64() * 100.0;

    // Scrapes with every poll held: the whole fleet in the text format, one at a time,
    // beside the admin API's agent list (the same agents, as JSON) for scale.
    let scrapes = scrape(&hub, "/metrics", 20).await?;
    let listing = scrape(&hub, "/v1/admin/agents", 5).await?;

    let Rounds {
        all,
        others,
        worst,
        latest,
        hub_cpu: hub_cpu_rounds,
    } = propagation(&hubs, &mut rx, n, rounds).await?;

    let Busy {
        done,
        secs,
        hub_cpu,
        xacts: (xacts_a, xacts_b),
    } = busy_phase(&hubs, &auths, busy, busy_secs, latest).await?;

    println!(
        "agents (polls held)            {n}, over {} hub{}",
        hubs.len(),
        if hubs.len() == 1 { "" } else { "s" }
    );
    println!(
        "hub RSS (all hubs)             {:.1} MiB ({:.1} MiB per 1000 held polls over {:.1} MiB at start)",
        rss as f64 / 1024.0,
        (rss.saturating_sub(rss0)) as f64 / 1024.0 / (n as f64 / 1000.0),
        rss0 as f64 / 1024.0
    );
    println!("hub CPU at idle, polls held    {idle_cpu:.2} %");
    println!(
        "fleet change -> every agent    p50 {:.1?}  p99 {:.1?}  max {:.1?}  (over {rounds} changes; worst per change {:?})",
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        all.last().copied().unwrap_or_default(),
        worst
    );
    if !others.is_empty() {
        println!(
            "  agents held by another hub   p50 {:.1?}  p99 {:.1?}  max {:.1?}",
            percentile(&others, 0.5),
            percentile(&others, 0.99),
            others.last().copied().unwrap_or_default()
        );
    }
    println!(
        "hub CPU seconds per change     {} (until the last agent had it)",
        hub_cpu_rounds.join(", ")
    );
    println!(
        "reconciles/s, {busy} clients       {:.0}  (hub CPU {:.2} s over {secs:.1} s: {:.0} reconciles per hub CPU-second)",
        done / secs,
        hub_cpu,
        if hub_cpu > 0.0 { done / hub_cpu } else { 0.0 }
    );
    if let (Some(a), Some(b)) = (xacts_a, xacts_b) {
        println!(
            "database transactions          {:.3} per reconcile ({} over {done:.0} reconciles, with the checks' own)",
            (b.saturating_sub(a)) as f64 / done.max(1.0),
            b.saturating_sub(a)
        );
    }
    for (what, m) in [
        ("GET /metrics", &scrapes),
        ("GET /v1/admin/agents", &listing),
    ] {
        println!(
            "{what:<30} p50 {:.1?}  max {:.1?}  {:.0} KiB  (hub CPU {:.1} ms each, over {})",
            m.p50,
            m.max,
            m.bytes as f64 / 1024.0,
            m.cpu_ms,
            m.n
        );
    }
    println!(
        "agent errors (retried)         {ramp_errors} while connecting, {} after",
        errors.load(Ordering::Relaxed) - ramp_errors
    );
    // For bench/hub.sh, which sets it beside etcd's.
    let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    println!(
        "{}",
        serde_json::json!({
            "bench": "hub",
            "agents": n,
            "p50_ms": ms(percentile(&all, 0.5)),
            "p99_ms": ms(percentile(&all, 0.99)),
            "rss_per_1000_mib": (rss.saturating_sub(rss0) as f64 / 1024.0 / (n as f64 / 1000.0) * 10.0).round() / 10.0,
        })
    );
    Ok(())
}
