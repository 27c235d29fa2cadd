//! Jobs routed by labels through a running hub, against the same jobs pinned to an agent,
//! in one run: N simulated agents (labels `queue=q0…`, a runner that admits MAX_JOBS and
//! ends each job the moment it has it) long-poll the hub; jobs are submitted with a
//! selector, then the same number pinned with `agent`. Used by `bench/hub_route.sh`; see
//! docs/benchmarks.md.
//!
//!   hub_route_bench DATA_DIR AGENTS JOBS [MAX_JOBS] [LABEL_SETS]
//!
//! Measured: submit → the agent has the spec (p50/p99) on an idle fleet, one job at a
//! time; jobs started per second with JOBS submitted at once (16 at a time), and the
//! spread (the most jobs one agent got, over its fair share); and the dispatch rate
//! alone: JOBS queued while every runner is stopped, then all runners started.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use serde_json::json;
use tokio::sync::mpsc;

#[path = "common/hub_dir.rs"]
mod hub_dir;
use hub_dir::HubDir as Hub;
#[path = "common/sim_agent.rs"]
mod sim_agent;
use sim_agent::{agent, Sim, Started};

/// Jobs in the idle-fleet latency phase, each submitted once the last one started.
const LATENCY_RUNS: usize = 200;
/// Submissions in flight at once in the bulk phase.
const SUBMITTERS: usize = 16;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Bench {
    hub: Arc<Hub>,
    /// Whether the simulated runners serve (a stopped one gets no queued job).
    serving: tokio::sync::watch::Sender<bool>,
    agents: Vec<String>,
    sets: usize,
    started: mpsc::UnboundedReceiver<Started>,
    submitted: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Bench {
    /// Submits job `n` (selected by its label set, or pinned to agent n mod N).
    async fn submit(&self, n: usize, tag: &str, pinned: bool) -> anyhow::Result<()> {
        let id = format!("{tag}-{n}");
        let route = if pinned {
            json!({"agent": self.agents[n % self.agents.len()]})
        } else {
            json!({"selector": format!("queue=q{}", n % self.sets)})
        };
        let mut body = json!({"spec": {"id": id, "argv": ["true"]}});
        body.as_object_mut()
            .context("object")?
            .extend(route.as_object().context("object")?.clone());
        self.submitted
            .lock()
            .expect("lock")
            .insert(id, Instant::now());
        self.hub
            .admin(reqwest::Method::POST, "/v1/admin/jobs", body)
            .await?;
        Ok(())
    }

    /// Waits for `count` starts; their (latency, agent).
    async fn starts(&mut self, count: usize) -> anyhow::Result<Vec<(Duration, usize)>> {
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            let (id, agent, at) =
                tokio::time::timeout(Duration::from_secs(120), self.started.recv())
                    .await
                    .map_err(|_| {
                        anyhow!("only {} of {count} jobs started in 2 minutes", out.len())
                    })?
                    .context("agents gone")?;
            let from = self.submitted.lock().expect("lock").remove(&id);
            if let Some(from) = from {
                out.push((at.saturating_duration_since(from), agent));
            }
        }
        Ok(out)
    }

    /// One job at a time on an idle fleet: (p50, p99).
    async fn latency(&mut self, tag: &str, pinned: bool) -> anyhow::Result<(f64, f64)> {
        let mut lat = Vec::with_capacity(LATENCY_RUNS);
        for n in 0..LATENCY_RUNS {
            self.submit(n, tag, pinned).await?;
            lat.push(self.starts(1).await?[0].0);
        }
        lat.sort();
        Ok((ms(percentile(&lat, 0.5)), ms(percentile(&lat, 0.99))))
    }

    /// Sets every runner serving or stopped, and waits until the hub shows it.
    async fn serve(&self, on: bool) -> anyhow::Result<()> {
        self.serving.send_replace(on);
        let want = if on { "running" } else { "stopped" };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let list = self
                .hub
                .admin(reqwest::Method::GET, "/v1/admin/agents", json!({}))
                .await?;
            let all = list.as_array().context("agents")?;
            if all.iter().all(|a| a["report"]["runner"]["state"] == want) {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "runners not {want} after 2 minutes"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `jobs` selected jobs queued while no runner serves, then every runner started:
    /// jobs handed out per second from then until all have started.
    async fn drain_queue(&mut self, jobs: usize) -> anyhow::Result<f64> {
        self.serve(false).await?;
        for n in 0..jobs {
            self.submit(n, "queued", false).await?;
        }
        let t = Instant::now();
        self.serving.send_replace(true);
        self.starts(jobs).await?;
        let took = t.elapsed();
        eprintln!("queue of {jobs}: all handed out {took:.1?} after the runners started");
        Ok(jobs as f64 / took.as_secs_f64())
    }

    /// `jobs` submitted at once: (jobs started per second, most on one agent / fair share).
    async fn bulk(&mut self, jobs: usize, tag: &str, pinned: bool) -> anyhow::Result<(f64, f64)> {
        let t = Instant::now();
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let this: &Bench = self;
        let submitters = (0..SUBMITTERS).map(|_| {
            let next = next.clone();
            async move {
                loop {
                    let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if n >= jobs {
                        return anyhow::Ok(());
                    }
                    this.submit(n, tag, pinned).await?;
                }
            }
        });
        for r in futures_util::future::join_all(submitters).await {
            r?;
        }
        let submitted = t.elapsed();
        let starts = self.starts(jobs).await?;
        let took = t.elapsed();
        let mut per_agent = vec![0usize; self.agents.len()];
        for (_, a) in &starts {
            per_agent[*a] += 1;
        }
        let fair = jobs as f64 / self.agents.len() as f64;
        let most = per_agent.iter().copied().max().unwrap_or(0) as f64;
        eprintln!(
            "{tag}: {jobs} submitted in {submitted:.1?}, all started after {took:.1?}; most on one agent {most} (fair share {fair:.1})"
        );
        Ok((jobs as f64 / took.as_secs_f64(), most / fair))
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: hub_route_bench DATA_DIR AGENTS JOBS [MAX_JOBS] [LABEL_SETS]";
    let dir = PathBuf::from(args.get(1).ok_or_else(|| anyhow!(usage))?);
    let n: usize = args.get(2).ok_or_else(|| anyhow!(usage))?.parse()?;
    let jobs: usize = args.get(3).ok_or_else(|| anyhow!(usage))?.parse()?;
    let max_jobs: u64 = args.get(4).map_or(Ok(4), |s| s.parse())?;
    let sets: usize = args.get(5).map_or(Ok(4), |s| s.parse())?;
    railgrid::sys::raise_open_files_limit()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(dir, n, jobs, max_jobs, sets))
}

async fn run(
    dir: PathBuf,
    n: usize,
    jobs: usize,
    max_jobs: u64,
    sets: usize,
) -> anyhow::Result<()> {
    let hub = Arc::new(Hub::open(&dir)?);
    let t = Instant::now();
    let enrolled: Vec<(usize, String, String)> = hub
        .enrol_many("route", n)
        .await?
        .into_iter()
        .enumerate()
        .map(|(i, (id, token))| (i, id, token))
        .collect();
    eprintln!("enrolled {n} agents in {:.1?}", t.elapsed());
    let (tx, rx) = mpsc::unbounded_channel();
    let (serving, serving_rx) = tokio::sync::watch::channel(true);
    for (k, (i, id, token)) in enrolled.iter().enumerate() {
        let labels = [("queue".to_owned(), format!("q{}", i % sets))].into();
        let sim = Sim {
            i: *i,
            id: id.clone(),
            token: token.clone(),
            labels,
            max_jobs,
            hold: Duration::ZERO,
        };
        tokio::spawn(agent(hub.clone(), sim, tx.clone(), serving_rx.clone()));
        if k % 100 == 99 {
            // Spread like a real fleet's jittered reconnects, not ten thousand handshakes.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Every agent connected with its report in: what `agent list` says.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let list = hub
            .admin(reqwest::Method::GET, "/v1/admin/agents", json!({}))
            .await?;
        let ready = list
            .as_array()
            .map_or(0, |a| a.iter().filter(|a| a["connected"] == true).count());
        if ready == n {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {ready} of {n} agents connected"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut b = Bench {
        hub,
        serving,
        agents: enrolled.iter().map(|(_, id, _)| id.clone()).collect(),
        sets,
        started: rx,
        submitted: Arc::new(Mutex::new(HashMap::new())),
    };
    let (sel_p50, sel_p99) = b.latency("lat-sel", false).await?;
    let (pin_p50, pin_p99) = b.latency("lat-pin", true).await?;
    eprintln!("idle fleet, submit -> agent has it: selected p50 {sel_p50:.1} ms p99 {sel_p99:.1} ms; pinned p50 {pin_p50:.1} ms p99 {pin_p99:.1} ms");
    let (sel_rate, sel_spread) = b.bulk(jobs, "bulk-sel", false).await?;
    let (pin_rate, pin_spread) = b.bulk(jobs, "bulk-pin", true).await?;
    let dispatch_rate = b.drain_queue(jobs).await?;
    println!(
        "{}",
        json!({
            "bench": "hub_route",
            "agents": n,
            "jobs": jobs,
            "max_jobs": max_jobs,
            "label_sets": sets,
            "selected_p50_ms": (sel_p50 * 10.0).round() / 10.0,
            "selected_p99_ms": (sel_p99 * 10.0).round() / 10.0,
            "pinned_p50_ms": (pin_p50 * 10.0).round() / 10.0,
            "pinned_p99_ms": (pin_p99 * 10.0).round() / 10.0,
            "selected_jobs_per_s": sel_rate.round(),
            "pinned_jobs_per_s": pin_rate.round(),
            "selected_spread": (sel_spread * 100.0).round() / 100.0,
            "dispatch_jobs_per_s": dispatch_rate.round(),
            "pinned_spread": (pin_spread * 100.0).round() / 100.0,
        })
    );
    Ok(())
}
