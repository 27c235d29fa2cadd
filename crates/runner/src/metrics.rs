//! The runner's metrics in Prometheus' text format (`GET /v1/metrics` on its socket, with
//! its token): the agent serves them beside its own (`[metrics] listen`). Jobs ended by
//! state and their durations are counted as they end; the rest is read at each scrape.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use crate::metrics_text::{gauge, labelled, sample, Histogram};

/// Upper bounds of the job duration buckets, in seconds.
const DURATION_BUCKETS: &[f64] = &[
    0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
];

static JOB_DURATION: Histogram = Histogram::new(DURATION_BUCKETS);
static JOBS_ENDED: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// A job ended as `state`, `ran_ms` after it was admitted (when it ran at all).
pub fn job_ended(state: &str, ran_ms: Option<u64>) {
    *crate::util::lock(&JOBS_ENDED)
        .entry(state.to_owned())
        .or_default() += 1;
    if let Some(ms) = ran_ms {
        JOB_DURATION.observe(ms as f64 / 1000.0);
    }
}

/// What is, read from the engine at a scrape.
pub struct Now<'a> {
    pub running: u64,
    pub queued: u64,
    pub max_jobs: u64,
    pub kept_bytes: u64,
    pub finished_jobs: u64,
    pub commits_pending: u64,
    pub draining: bool,
    pub confinement: &'a str,
}

pub fn render(now: &Now<'_>) -> String {
    let mut out = String::with_capacity(4096);
    sample(
        &mut out,
        "railgrid_runner_jobs_running",
        "Jobs running now.",
        "gauge",
        now.running,
    );
    sample(
        &mut out,
        "railgrid_runner_jobs_queued",
        "Jobs admitted and waiting for a slot.",
        "gauge",
        now.queued,
    );
    sample(
        &mut out,
        "railgrid_runner_max_jobs",
        "Jobs the runner runs at once, at most.",
        "gauge",
        now.max_jobs,
    );
    sample(
        &mut out,
        "railgrid_runner_spool_bytes",
        "Bytes finished jobs keep on disk (spools and workspaces).",
        "gauge",
        now.kept_bytes,
    );
    sample(
        &mut out,
        "railgrid_runner_finished_jobs",
        "Finished jobs kept (records and files).",
        "gauge",
        now.finished_jobs,
    );
    sample(
        &mut out,
        "railgrid_runner_commits_pending",
        "Job state changes held in memory for want of room on disk.",
        "gauge",
        now.commits_pending,
    );
    sample(
        &mut out,
        "railgrid_runner_egress_denied_total",
        "Connections jobs' egress proxies refused since the runner started (network allow).",
        "counter",
        crate::egress::DENIED_TOTAL.load(std::sync::atomic::Ordering::Relaxed),
    );
    sample(
        &mut out,
        "railgrid_runner_draining",
        "1 while a drain is in force (no new job is taken).",
        "gauge",
        u64::from(now.draining),
    );
    gauge(
        &mut out,
        "railgrid_runner_confinement",
        "The tier that holds jobs (1 for the one in force): cgroup or process-group.",
        "gauge",
    );
    let _ = writeln!(
        out,
        "railgrid_runner_confinement{{tier=\"{}\"}} 1",
        crate::metrics_text::escape(now.confinement)
    );
    gauge(
        &mut out,
        "railgrid_runner_jobs_ended_total",
        "Jobs that ended since the runner started, by state.",
        "counter",
    );
    labelled(
        &mut out,
        "railgrid_runner_jobs_ended_total",
        "state",
        &crate::util::lock(&JOBS_ENDED),
    );
    JOB_DURATION.render(
        &mut out,
        "railgrid_runner_job_duration_seconds",
        "From a job's admission to its end.",
    );
    out
}
