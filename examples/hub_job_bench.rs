//! Jobs through the hub against the same jobs on the agent's runner socket, in one run:
//! throughput of trivial jobs (`true`) and the latency from submit to the first byte of
//! a job's output. Used by `bench/hub_jobs.sh`; see docs/benchmarks.md.
//!
//!   hub_job_bench HUB_DIR AGENT_ID RUNNER_SOCKET JOBS CONCURRENCY

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use railgrid::proto::job::JobSpec;
use railgrid::runner::client::Client;
use railgrid::runner::job::Stream;
use serde_json::{json, Value};

#[path = "common/first_byte.rs"]
mod first_byte;
use first_byte::FirstByte;

const LATENCY_RUNS: usize = 100;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[path = "common/hub_dir.rs"]
mod hub_dir;

/// The hub, and the agent the jobs are for.
struct Hub {
    hub: hub_dir::HubDir,
    agent: String,
}

impl Hub {
    fn open(dir: &Path, agent: &str) -> anyhow::Result<Self> {
        Ok(Self {
            hub: hub_dir::HubDir::open(dir)?,
            agent: agent.to_owned(),
        })
    }

    async fn submit(&self, argv: &[&str]) -> anyhow::Result<String> {
        let resp = self
            .hub
            .http
            .post(format!("{}/v1/admin/jobs", self.hub.url))
            .bearer_auth(&self.hub.admin)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(json!({"agent": self.agent, "spec": {"argv": argv}}).to_string())
            .send()
            .await?;
        let status = resp.status();
        let v: Value = serde_json::from_slice(&resp.bytes().await?)?;
        anyhow::ensure!(status.as_u16() == 201, "submit: {status}: {v}");
        Ok(v["id"].as_str().context("id")?.to_owned())
    }

    async fn wait_done(&self, id: &str) -> anyhow::Result<Value> {
        loop {
            let bytes = self
                .hub
                .http
                .get(format!(
                    "{}/v1/admin/jobs/{id}/wait?timeout_secs=30",
                    self.hub.url
                ))
                .bearer_auth(&self.hub.admin)
                .send()
                .await?
                .bytes()
                .await?;
            let v: Value = serde_json::from_slice(&bytes)?;
            if v["done"] == true {
                return Ok(v);
            }
        }
    }

    /// Time from `t0` to the first byte of the job's stdout at the hub.
    async fn first_byte(&self, id: &str, t0: Instant) -> anyhow::Result<Duration> {
        let mut resp = self
            .hub
            .http
            .get(format!(
                "{}/v1/admin/jobs/{id}/output/stdout?follow=true",
                self.hub.url
            ))
            .bearer_auth(&self.hub.admin)
            .send()
            .await?;
        while let Some(chunk) = resp.chunk().await? {
            if !chunk.is_empty() {
                return Ok(t0.elapsed());
            }
        }
        Err(anyhow!("no output from {id}"))
    }
}

/// `jobs` trivial jobs through `run_one`, `conc` at a time: jobs per second.
async fn throughput<F, Fut>(jobs: usize, conc: usize, run_one: F) -> anyhow::Result<f64>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..conc {
        let n = jobs / conc + usize::from(w < jobs % conc);
        let run_one = run_one.clone();
        set.spawn(async move {
            for _ in 0..n {
                run_one().await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(jobs as f64 / t.elapsed().as_secs_f64())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: hub_job_bench HUB_DIR AGENT_ID RUNNER_SOCKET JOBS CONCURRENCY";
    let dir = PathBuf::from(args.get(1).ok_or_else(|| anyhow!(usage))?);
    let agent = args.get(2).ok_or_else(|| anyhow!(usage))?;
    let socket = PathBuf::from(args.get(3).ok_or_else(|| anyhow!(usage))?);
    let jobs: usize = args.get(4).map_or(Ok(500), |s| s.parse())?;
    let conc: usize = args.get(5).map_or(Ok(4), |s| s.parse())?;
    let hub = Arc::new(Hub::open(&dir, agent)?);
    let runner = Arc::new(Client::new(&socket));

    // Local: submit and wait for each job on the runner's socket, `conc` clients.
    let r = runner.clone();
    let local = throughput(jobs, conc, move || {
        let r = r.clone();
        async move {
            let (_, sub) = r.submit(&JobSpec::from_argv(["true"])).await?;
            let rec = r.wait(&sub.id).await?;
            anyhow::ensure!(rec.exit_code == Some(0), "{} ended {:?}", rec.id, rec.state);
            Ok(())
        }
    })
    .await?;

    // Hub, the same shape: each client submits a job and waits until it is done at the
    // hub (ended, and its output there).
    let h = hub.clone();
    let through_hub = throughput(jobs, conc, move || {
        let h = h.clone();
        async move {
            let id = h.submit(&["true"]).await?;
            let v = h.wait_done(&id).await?;
            anyhow::ensure!(v["exit_code"] == 0, "{id} ended {v}");
            Ok(())
        }
    })
    .await?;

    // Hub, a batch: all submitted at once, then waited for.
    let t = Instant::now();
    let mut ids = Vec::with_capacity(jobs);
    for _ in 0..jobs {
        ids.push(hub.submit(&["true"]).await?);
    }
    for id in &ids {
        let v = hub.wait_done(id).await?;
        anyhow::ensure!(v["exit_code"] == 0, "{id} ended {v}");
    }
    let batch = jobs as f64 / t.elapsed().as_secs_f64();

    // Latency: submit to the first byte of output, one job at a time.
    let mut local_lat = Vec::with_capacity(LATENCY_RUNS);
    for _ in 0..LATENCY_RUNS {
        let t0 = Instant::now();
        let (_, sub) = runner.submit(&JobSpec::from_argv(["echo", "x"])).await?;
        let mut first = FirstByte(None, t0);
        runner
            .output(&sub.id, Stream::Stdout, true, &mut first)
            .await?;
        local_lat.push(
            first
                .0
                .ok_or_else(|| anyhow!("no output from {}", sub.id))?,
        );
    }
    let mut hub_lat = Vec::with_capacity(LATENCY_RUNS);
    for _ in 0..LATENCY_RUNS {
        let t0 = Instant::now();
        let id = hub.submit(&["echo", "x"]).await?;
        hub_lat.push(hub.first_byte(&id, t0).await?);
        hub.wait_done(&id).await?;
    }
    local_lat.sort();
    hub_lat.sort();

    println!("local_jobs_per_sec={local:.0}");
    println!("hub_jobs_per_sec={through_hub:.1}");
    println!("hub_batch_jobs_per_sec={batch:.1}");
    println!("hub_over_local={:.3}", through_hub / local);
    println!("hub_batch_over_local={:.3}", batch / local);
    for (name, lat) in [("local", &local_lat), ("hub", &hub_lat)] {
        println!("{name}_first_byte_p50_ms={:.2}", ms(percentile(lat, 0.5)));
        println!("{name}_first_byte_p99_ms={:.2}", ms(percentile(lat, 0.99)));
    }
    println!(
        "first_byte_p50_hub_over_local={:.1}",
        ms(percentile(&hub_lat, 0.5)) / ms(percentile(&local_lat, 0.5))
    );
    Ok(())
}
