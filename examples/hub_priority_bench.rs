//! Priority under a steady stream, against one running hub: one simulated agent that runs
//! one job at a time, each for HOLD; priority-100 jobs submitted at RATE a second (more
//! than it can run) for STREAM seconds, and one priority-0 job a second in. Measured:
//! how long that job waited for an agent, and the longest and median wait of the others,
//! until every job has started. `bench/hub_priority.sh` runs it once per setting of
//! `hub serve --priority-aging`; see docs/benchmarks.md.
//!
//!   hub_priority_bench DATA_DIR [STREAM_SECS] [RATE_PER_S] [HOLD_MS]

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
use sim_agent::{agent, Sim};

/// The job that must not starve.
const LOW: &str = "low";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: hub_priority_bench DATA_DIR [STREAM_SECS] [RATE_PER_S] [HOLD_MS]";
    let dir = PathBuf::from(args.get(1).ok_or_else(|| anyhow!(usage))?);
    let stream: u64 = args.get(2).map_or(Ok(60), |s| s.parse())?;
    let rate: u64 = args.get(3).map_or(Ok(30), |s| s.parse())?;
    let hold: u64 = args.get(4).map_or(Ok(50), |s| s.parse())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(
        dir,
        Duration::from_secs(stream),
        rate,
        Duration::from_millis(hold),
    ))
}

async fn run(dir: PathBuf, stream: Duration, rate: u64, hold: Duration) -> anyhow::Result<()> {
    let hub = Arc::new(Hub::open(&dir)?);
    let (id, token) = hub.enrol_many("prio", 1).await?.pop().context("an agent")?;
    let (tx, mut started) = mpsc::unbounded_channel();
    let (_serving, serving_rx) = tokio::sync::watch::channel(true);
    let sim = Sim {
        i: 0,
        id,
        token,
        labels: [("queue".to_owned(), "q".to_owned())].into(),
        max_jobs: 1,
        hold,
    };
    tokio::spawn(agent(hub.clone(), sim, tx, serving_rx));
    let submitted: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let submit = |id: String, priority: u8| {
        let (hub, submitted) = (hub.clone(), submitted.clone());
        async move {
            submitted
                .lock()
                .expect("lock")
                .insert(id.clone(), Instant::now());
            let body = json!({"selector": "queue=q", "priority": priority,
                "spec": {"id": id, "argv": ["true"]}});
            hub.admin(reqwest::Method::POST, "/v1/admin/jobs", body)
                .await
                .map(drop)
        }
    };
    let t = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate as u32);
    let mut n = 0usize;
    let mut low_sent = false;
    while t.elapsed() < stream {
        tick.tick().await;
        submit(format!("high-{n}"), 100).await?;
        n += 1;
        if !low_sent && t.elapsed() >= Duration::from_secs(1) {
            submit(LOW.into(), 0).await?;
            low_sent = true;
        }
    }
    eprintln!(
        "submitted {n} priority-100 jobs and one priority-0 job in {:.1?}",
        t.elapsed()
    );
    let mut waits: Vec<Duration> = Vec::with_capacity(n);
    let mut low = None;
    while waits.len() + usize::from(low.is_some()) < n + 1 {
        let (id, _, at) = tokio::time::timeout(Duration::from_secs(600), started.recv())
            .await
            .map_err(|_| anyhow!("jobs still waiting after 10 minutes"))?
            .context("the agent is gone")?;
        let from = submitted.lock().expect("lock").remove(&id);
        let Some(from) = from else { continue };
        let wait = at.saturating_duration_since(from);
        if id == LOW {
            low = Some(wait);
        } else {
            waits.push(wait);
        }
    }
    waits.sort();
    let low = low.context("the low job")?;
    let secs = |d: Duration| (d.as_secs_f64() * 10.0).round() / 10.0;
    println!(
        "{}",
        json!({
            "bench": "hub_priority",
            "stream_s": stream.as_secs(),
            "rate_per_s": rate,
            "hold_ms": hold.as_millis() as u64,
            "jobs": n + 1,
            "drained_s": secs(t.elapsed()),
            "low_priority_wait_s": secs(low),
            "high_priority_wait_p50_s": secs(waits[waits.len() / 2]),
            "high_priority_wait_max_s": secs(*waits.last().context("jobs")?),
        })
    );
    Ok(())
}
