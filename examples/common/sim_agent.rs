//! A simulated agent for the routing benchmarks: it reports its labels and a running
//! runner that admits `max_jobs`, takes each job whose spec it is sent (telling
//! `started`), holds it for `hold` (0: ends it at once), and reports it `succeeded`.

// Each example takes what it needs of this module.
#![allow(dead_code)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use railgrid::hub_client;
use railgrid::proto::desired::DesiredState;
use railgrid::proto::job::JobState;
use railgrid::proto::report::{AgentReport, JobReport, JobsSummary, RunnerReport};
use tokio::sync::mpsc;

use super::hub_dir::HubDir as Hub;

/// A job reached an agent: (job id, agent index, when).
pub(crate) type Started = (String, usize, Instant);

/// Who a simulated agent is.
pub(crate) struct Sim {
    pub(crate) i: usize,
    pub(crate) id: String,
    pub(crate) token: String,
    pub(crate) labels: railgrid::proto::labels::Labels,
    pub(crate) max_jobs: u64,
    /// How long each job runs.
    pub(crate) hold: Duration,
}

/// One simulated agent: reports its labels and a running runner, takes each job whose
/// spec it is sent (telling `started`), and reports it `succeeded` with all its output.
pub(crate) async fn agent(
    hub: Arc<Hub>,
    sim: Sim,
    started: mpsc::UnboundedSender<Started>,
    mut serving: tokio::sync::watch::Receiver<bool>,
) {
    let Sim {
        i,
        id,
        token,
        labels,
        max_jobs,
        hold,
    } = sim;
    let url = format!("{}/v1/agents/{id}/reconcile", hub.url);
    let auth = hub_client::bearer(&token).expect("header");
    let mut generation = 0;
    let mut jobs_version = None;
    let mut mine: HashSet<String> = HashSet::new();
    loop {
        let report = AgentReport {
            version: "bench".into(),
            os: "linux".into(),
            arch: "x86_64".into(),
            hostname: id.clone(),
            labels: labels.clone(),
            observed_generation: generation,
            runner: RunnerReport {
                state: if *serving.borrow_and_update() {
                    "running"
                } else {
                    "stopped"
                }
                .into(),
                ..RunnerReport::default()
            },
            upgrade: None,
            drain: None,
            jobs_summary: Some(JobsSummary {
                running: 0,
                queued: 0,
                max_jobs,
            }),
            jobs: mine
                .iter()
                .map(|j| JobReport {
                    id: j.clone(),
                    state: JobState::Succeeded,
                    exit_code: Some(0),
                    signal: None,
                    error: None,
                    stdout_bytes: 0,
                    stderr_bytes: 0,
                    output_truncated: None,
                    output_done: true,
                    egress_denied: Vec::new(),
                })
                .collect(),
            jobs_version,
            refused_generation: None,
        };
        let sent = hub
            .http
            .post(&url)
            .query(&[("wait", 30)])
            .header(reqwest::header::AUTHORIZATION, auth.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(&report).expect("json"))
            .timeout(Duration::from_secs(60))
            .send();
        // The runner stopped or started under a held poll: report it now, as an agent does.
        let sent = tokio::select! {
            r = sent => r,
            _ = serving.changed() => continue,
        };
        let desired: DesiredState = match sent {
            Ok(r) if r.status().is_success() => {
                match r.bytes().await.map(|b| serde_json::from_slice(&b)) {
                    Ok(Ok(d)) => d,
                    _ => continue,
                }
            }
            _ => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        generation = desired.generation;
        jobs_version = desired.jobs_version;
        let now = Instant::now();
        let listed: HashSet<&str> = desired.jobs.iter().map(|j| j.id.as_str()).collect();
        mine.retain(|j| listed.contains(j.as_str()));
        let mut took = false;
        for j in &desired.jobs {
            if j.spec.is_some() && mine.insert(j.id.clone()) {
                let _ = started.send((j.id.clone(), i, now));
                took = true;
            }
        }
        // The jobs it took run this long before it reports them done.
        if took && !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
    }
}
