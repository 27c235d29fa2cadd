//! N simulated agents through one running hub, each upgrading as a real agent reports it
//! (downloading, switching, a settle period, committed) or, for a release that crashes at
//! start, rolled back by its watcher. Four rounds, side by side:
//!  1. a good version set for the fleet at once (the peer): desired set -> all committed,
//!     and the most agents upgrading at once;
//!  2. the next good version by a rollout: start -> 100 % committed, the most upgrading at
//!     once (the bound is --max-parallel), and the waves;
//!  3. a crash-at-start version by a rollout: the agents that were ever sent it (the goal:
//!     exactly the first wave) and start -> halted;
//!  4. the same crash set for the fleet at once (the peer): the agents that were sent it
//!     before the halt.
//!
//!   rollout_bench DATA_DIR AGENTS SETTLE_MS MAX_PARALLEL V1 V2 BAD1 BAD2
//!
//! DATA_DIR is a running hub's data dir; the four versions are published there for this
//! host's platform. Ends with one JSON line.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use railgrid::hub_client;
use railgrid::proto::desired::DesiredState;
use railgrid::proto::report::{AgentReport, UpgradeReport};

#[path = "common/hub_dir.rs"]
mod hub_dir;
#[path = "common/hub_http.rs"]
mod hub_http;
use hub_dir::HubDir as Hub;

/// What every simulated agent shares with the benchmark.
#[derive(Default)]
struct Shared {
    /// Agents between being sent a version and its end (committed or rolled back).
    upgrading: AtomicUsize,
    /// The most at once, since the last reset.
    peak: AtomicUsize,
    /// (version, agent) pairs: each agent that was ever sent each version.
    sent: Mutex<HashSet<(String, String)>>,
    /// (version, agent, when) of each commit.
    committed: Mutex<Vec<(String, String, Instant)>>,
}

struct Sim {
    http: reqwest::Client,
    url: String,
    id: String,
    auth: reqwest::header::HeaderValue,
    version: String,
    bad: HashSet<String>,
    crashing: Arc<HashSet<String>>,
    settle: Duration,
    shared: Arc<Shared>,
}

impl Sim {
    fn report(&self, generation: u64, upgrade: Option<UpgradeReport>) -> AgentReport {
        AgentReport {
            version: self.version.clone(),
            os: std::env::consts::OS.into(),
            arch: std::env::consts::ARCH.into(),
            hostname: self.id.clone(),
            labels: Default::default(),
            observed_generation: generation,
            runner: railgrid::proto::report::RunnerReport {
                state: "running".into(),
                ..Default::default()
            },
            upgrade,
            jobs_summary: None,
            drain: None,
            jobs: Vec::new(),
            jobs_version: None,
            refused_generation: None,
        }
    }

    async fn reconcile(&self, report: &AgentReport, wait: u64) -> anyhow::Result<DesiredState> {
        let url = format!("{}/v1/agents/{}/reconcile", self.url, self.id);
        hub_http::reconcile(&self.http, &url, &self.auth, report, wait).await
    }

    async fn download(&self, path: &str, sha256: &str) -> anyhow::Result<()> {
        let url = format!("{}{path}", self.url);
        hub_http::download(&self.http, &url, &self.auth, sha256).await?;
        Ok(())
    }

    fn upgrade(state: &str, target: &str, error: Option<&str>) -> Option<UpgradeReport> {
        Some(UpgradeReport::toward(state, target, error))
    }

    /// Long polls; takes each version it is sent as a real agent would report it.
    async fn run(mut self) -> anyhow::Result<()> {
        let mut generation = 0;
        let mut last: Option<UpgradeReport> = None;
        loop {
            let d = self
                .reconcile(&self.report(generation, last.clone()), 30)
                .await?;
            generation = d.generation;
            let Some(want) = d.agent.filter(|a| a.version != self.version) else {
                continue;
            };
            let v = want.version.clone();
            if self.bad.contains(&v) {
                continue;
            }
            let art = want
                .artifact
                .ok_or_else(|| anyhow!("no artifact for {v}"))?;
            if !crate::first_sent(&self.shared, &v, &self.id) {
                continue;
            }
            let n = self.shared.upgrading.fetch_add(1, Ordering::SeqCst) + 1;
            self.shared.peak.fetch_max(n, Ordering::SeqCst);
            let up = Self::upgrade("downloading", &v, None);
            self.reconcile(&self.report(generation, up), 0).await?;
            self.download(&art.url, &art.sha256).await?;
            let up = Self::upgrade("switching", &v, None);
            self.reconcile(&self.report(generation, up), 0).await?;
            tokio::time::sleep(self.settle).await;
            if self.crashing.contains(&v) {
                // The watcher put the previous binary back.
                self.bad.insert(v.clone());
                last = Self::upgrade("rolled_back", &v, Some("exited before it committed"));
            } else {
                self.version = v.clone();
                last = Self::upgrade("committed", &v, None);
                crate::lock(&self.shared.committed).push((v, self.id.clone(), Instant::now()));
            }
            self.shared.upgrading.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// True the first time `agent` is sent `version`.
fn first_sent(shared: &Shared, version: &str, agent: &str) -> bool {
    lock(&shared.sent).insert((version.to_owned(), agent.to_owned()))
}

fn sent(shared: &Shared, version: &str) -> usize {
    lock(&shared.sent)
        .iter()
        .filter(|(v, _)| v == version)
        .count()
}

fn committed(shared: &Shared, version: &str) -> Vec<Instant> {
    lock(&shared.committed)
        .iter()
        .filter(|(v, _, _)| v == version)
        .map(|(_, _, t)| *t)
        .collect()
}

/// Polls `check` every 20 ms until it is true, for at most `limit`.
async fn until(
    what: &str,
    limit: Duration,
    mut check: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while !check().await? {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 9,
        "usage: rollout_bench DATA_DIR AGENTS SETTLE_MS MAX_PARALLEL V1 V2 BAD1 BAD2"
    );
    let dir = PathBuf::from(&args[1]);
    let n: usize = args[2].parse().context("AGENTS")?;
    let settle = Duration::from_millis(args[3].parse().context("SETTLE_MS")?);
    let parallel: usize = args[4].parse().context("MAX_PARALLEL")?;
    let v: Vec<String> = args[5..9].to_vec();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(dir, n, settle, parallel, v))
}

async fn run(
    dir: PathBuf,
    n: usize,
    settle: Duration,
    parallel: usize,
    v: Vec<String>,
) -> anyhow::Result<()> {
    let hub = Arc::new(Hub::open(&dir)?);
    let shared = Arc::new(Shared::default());
    let crashing = Arc::new(HashSet::from([v[2].clone(), v[3].clone()]));
    let tokens = hub.enrol_many("sim", n).await?;
    let mut tasks = tokio::task::JoinSet::new();
    for (id, token) in tokens {
        let sim = Sim {
            http: hub.http.clone(),
            url: hub.url.clone(),
            id,
            auth: hub_client::bearer(&token)?,
            version: "0.0.1".into(),
            bad: HashSet::new(),
            crashing: crashing.clone(),
            settle,
            shared: shared.clone(),
        };
        tasks.spawn(sim.run());
    }
    let health = |hub: Arc<Hub>| async move {
        hub.admin(reqwest::Method::GET, "/v1/health", serde_json::Value::Null)
            .await
    };
    until("every agent polling", Duration::from_secs(60), async || {
        Ok(health(hub.clone()).await?["polls_held"]
            .as_u64()
            .unwrap_or(0)
            >= n as u64)
    })
    .await?;
    let limit = Duration::from_secs(600);
    let get = reqwest::Method::GET;
    let (put, post) = (reqwest::Method::PUT, reqwest::Method::POST);

    // 1. The peer: the fleet's version set at once.
    shared.peak.store(0, Ordering::SeqCst);
    let t0 = Instant::now();
    hub.admin(
        put.clone(),
        "/v1/admin/desired/fleet",
        serde_json::json!({"set": {"version": v[0]}}),
    )
    .await?;
    until("all on V1", limit, async || {
        Ok(committed(&shared, &v[0]).len() >= n)
    })
    .await?;
    let direct_ms = t0.elapsed().as_millis();
    let direct_peak = shared.peak.load(Ordering::SeqCst);

    // 2. A rollout of V2.
    shared.peak.store(0, Ordering::SeqCst);
    let t0 = Instant::now();
    let r = hub
        .admin(
            post.clone(),
            "/v1/admin/rollouts",
            serde_json::json!({"version": v[1], "max_parallel": parallel}),
        )
        .await?;
    let id = r["id"].as_str().context("rollout id")?.to_owned();
    let waves: Vec<usize> = r["waves"]
        .as_array()
        .context("waves")?
        .iter()
        .map(|w| w["members"].as_array().map_or(0, Vec::len))
        .collect();
    let path = format!("/v1/admin/rollouts/{id}");
    until("the rollout done", limit, async || {
        let s = hub
            .admin(get.clone(), &path, serde_json::Value::Null)
            .await?;
        anyhow::ensure!(s["state"] != "halted", "halted: {s}");
        Ok(s["state"] == "done")
    })
    .await?;
    let rollout_ms = t0.elapsed().as_millis();
    let all_ms = committed(&shared, &v[1])
        .iter()
        .map(|t| t.duration_since(t0).as_millis())
        .max()
        .unwrap_or(0);
    let rollout_peak = shared.peak.load(Ordering::SeqCst);

    // 3. A crash-at-start version by a rollout.
    let t0 = Instant::now();
    let r = hub
        .admin(
            post.clone(),
            "/v1/admin/rollouts",
            serde_json::json!({"version": v[2], "max_parallel": parallel}),
        )
        .await?;
    let id = r["id"].as_str().context("rollout id")?.to_owned();
    let first_wave = r["waves"][0]["members"].as_array().map_or(0, Vec::len);
    let path = format!("/v1/admin/rollouts/{id}");
    until("the rollout halted", limit, async || {
        let s = hub
            .admin(get.clone(), &path, serde_json::Value::Null)
            .await?;
        Ok(s["state"] == "halted")
    })
    .await?;
    let halt_ms = t0.elapsed().as_millis();
    // Time for anything sent late to show.
    tokio::time::sleep(settle * 2).await;
    let rollout_bad = sent(&shared, &v[2]);
    hub.admin(
        post.clone(),
        &format!("/v1/admin/rollouts/{id}/abort"),
        serde_json::json!({}),
    )
    .await?;

    // 4. The peer: the crash set for the fleet at once.
    let t0 = Instant::now();
    hub.admin(
        put,
        "/v1/admin/desired/fleet",
        serde_json::json!({"set": {"version": v[3]}}),
    )
    .await?;
    until("the fleet halt", limit, async || {
        let rel = hub
            .admin(get.clone(), "/v1/admin/releases", serde_json::Value::Null)
            .await?;
        Ok(rel.as_array().is_some_and(|a| {
            a.iter()
                .any(|r| r["version"] == v[3].as_str() && !r["halted"].is_null())
        }))
    })
    .await?;
    let direct_halt_ms = t0.elapsed().as_millis();
    tokio::time::sleep(settle * 2).await;
    let direct_bad = sent(&shared, &v[3]);
    tasks.abort_all();

    println!(
        "{n} simulated agents (settle {} ms): fleet version set at once -> all committed {direct_ms} ms, {direct_peak} upgrading at once",
        settle.as_millis()
    );
    println!(
        "rollout, waves {waves:?}, max-parallel {parallel}: start -> 100 % committed {all_ms} ms (done {rollout_ms} ms), at most {rollout_peak} upgrading at once; ratio to at once {:.1}",
        all_ms as f64 / direct_ms.max(1) as f64
    );
    println!(
        "crash at start by a rollout: {rollout_bad} agent(s) ever sent it (first wave: {first_wave}), halted {halt_ms} ms after the start; set at once: {direct_bad} agent(s) sent it, halted after {direct_halt_ms} ms"
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "rollout",
            "agents": n,
            "settle_ms": settle.as_millis() as u64,
            "max_parallel": parallel,
            "waves": waves,
            "direct_all_ms": direct_ms as u64,
            "direct_peak": direct_peak,
            "rollout_all_ms": all_ms as u64,
            "rollout_peak": rollout_peak,
            "crash_sent_rollout": rollout_bad,
            "crash_first_wave": first_wave,
            "crash_halt_ms": halt_ms as u64,
            "crash_sent_direct": direct_bad,
        })
    );
    Ok(())
}
