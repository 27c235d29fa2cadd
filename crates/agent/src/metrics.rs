//! The agent's metrics (`[metrics] listen = "127.0.0.1:9469"`, off by default): plain
//! HTTP, `GET /metrics` only, in Prometheus' text format. The agent's own (its runner's
//! state and restarts, the hub link and its reconciles, the upgrade, the drain) from the
//! status the reporter last wrote, and then its runner's (jobs by state, their durations,
//! spool bytes, the confinement tier) from the runner's socket; and the room left on the
//! state directory's file system, where the runner keeps jobs' records, workspaces and
//! output.
//!
//! Task: [`MetricsHandle`], one per agent with metrics; the listener is bound before the
//! agent starts anything, so a port in use is a configuration error (exit 2).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::config::MetricsSettings;
use super::reporter::ReporterHandle;
use super::runner_link::RunnerLink;
use super::AgentError;
use crate::metrics_text::{escape, gauge, sample, Histogram};

/// Upper bounds of the reconcile buckets, in seconds (a long poll is held up to 30 s).
const RECONCILE_BUCKETS: &[f64] = &[0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 45.0, 60.0];
/// How long the runner has to answer a scrape.
const RUNNER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Reconciles with the hub, from the report sent to the answer (a held poll included).
pub(super) static RECONCILE: Histogram = Histogram::new(RECONCILE_BUCKETS);
pub(super) static RECONCILES_OK: AtomicU64 = AtomicU64::new(0);
pub(super) static RECONCILES_FAILED: AtomicU64 = AtomicU64::new(0);

pub(super) struct MetricsHandle(tokio::task::JoinHandle<()>);

impl MetricsHandle {
    /// Binds `settings.listen` and serves.
    pub(super) async fn spawn(
        settings: &MetricsSettings,
        reporter: ReporterHandle,
        runner: RunnerLink,
        state_dir: PathBuf,
    ) -> Result<Self, AgentError> {
        let listener = tokio::net::TcpListener::bind(settings.listen)
            .await
            .map_err(|source| AgentError::MetricsListen {
                addr: settings.listen,
                source,
            })?;
        tracing::info!(listen = %settings.listen, "serving the agent's metrics (/metrics)");
        let app = axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let (reporter, runner) = (reporter.clone(), runner.clone());
                    let state_dir = state_dir.clone();
                    async move { scrape(&reporter, &runner, state_dir).await }
                }),
            )
            .fallback(|| async { (StatusCode::NOT_FOUND, "only /metrics is served here\n") });
        Ok(Self(tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "the metrics listener failed");
            }
        })))
    }

    pub(super) fn stop(self) {
        self.0.abort();
    }
}

async fn scrape(reporter: &ReporterHandle, runner: &RunnerLink, state_dir: PathBuf) -> Response {
    let mut out = render(&reporter.latest());
    // A file system that does not answer in time (a hung network mount) leaves these out.
    let space = tokio::task::spawn_blocking(move || nix::sys::statvfs::statvfs(&state_dir));
    if let Ok(Ok(Ok(st))) = tokio::time::timeout(RUNNER_TIMEOUT, space).await {
        #[allow(clippy::unnecessary_cast)]
        let (frag, avail, size) = (
            st.fragment_size() as u64,
            st.blocks_available() as u64,
            st.blocks() as u64,
        );
        sample(
            &mut out,
            "railgrid_agent_state_fs_avail_bytes",
            "Bytes an unprivileged writer may still use on the state directory's file system.",
            "gauge",
            avail.saturating_mul(frag),
        );
        sample(
            &mut out,
            "railgrid_agent_state_fs_size_bytes",
            "The size of the state directory's file system, in bytes.",
            "gauge",
            size.saturating_mul(frag),
        );
    }
    // The runner's own, when it answers in time.
    let runner_part = async {
        let client = runner.client().await.ok()?;
        tokio::time::timeout(RUNNER_TIMEOUT, client.metrics())
            .await
            .ok()?
            .ok()
    };
    if let Some(text) = runner_part.await {
        out.push_str(&text);
    }
    let mut resp = out.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

fn render(st: &super::status::AgentStatus) -> String {
    let mut out = String::with_capacity(4096);
    let info = crate::build_info::current();
    gauge(
        &mut out,
        "railgrid_build_info",
        "The agent's build (1), by version and commit.",
        "gauge",
    );
    let _ = writeln!(
        out,
        "railgrid_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        escape(&info.version),
        escape(info.commit.as_deref().unwrap_or("unknown"))
    );
    let state = serde_json::to_value(st.runner.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    sample(
        &mut out,
        "railgrid_agent_runner_up",
        "1 while the runner runs.",
        "gauge",
        u8::from(state == "running"),
    );
    gauge(
        &mut out,
        "railgrid_agent_runner_state",
        "The runner's state (1 for the one it is in).",
        "gauge",
    );
    for s in ["running", "backoff", "stopped"] {
        let _ = writeln!(
            out,
            "railgrid_agent_runner_state{{state=\"{s}\"}} {}",
            u8::from(state == s)
        );
    }
    sample(
        &mut out,
        "railgrid_agent_runner_starts_total",
        "Runners started since the agent started.",
        "counter",
        st.runner.starts,
    );
    let hub = st.hub.as_ref();
    sample(
        &mut out,
        "railgrid_agent_hub_connected",
        "1 when the last reconcile got a desired state from the hub.",
        "gauge",
        u8::from(hub.is_some_and(|h| h.connected)),
    );
    sample(
        &mut out,
        "railgrid_agent_hub_last_contact_timestamp_seconds",
        "When the hub last answered (Unix seconds; 0: never).",
        "gauge",
        hub.and_then(|h| h.last_contact).unwrap_or(0),
    );
    sample(
        &mut out,
        "railgrid_agent_hub_generation",
        "The generation of the desired state applied.",
        "gauge",
        hub.map_or(0, |h| h.generation),
    );
    gauge(
        &mut out,
        "railgrid_agent_reconciles_total",
        "Reconciles with the hub, by outcome.",
        "counter",
    );
    let _ = writeln!(
        out,
        "railgrid_agent_reconciles_total{{outcome=\"ok\"}} {}\nrailgrid_agent_reconciles_total{{outcome=\"error\"}} {}",
        RECONCILES_OK.load(Ordering::Relaxed),
        RECONCILES_FAILED.load(Ordering::Relaxed)
    );
    RECONCILE.render(
        &mut out,
        "railgrid_agent_reconcile_duration_seconds",
        "From a report sent to the hub's answer (a long poll held by the hub included).",
    );
    gauge(
        &mut out,
        "railgrid_agent_upgrade_state",
        "The self-upgrade's state (1 for the one it is in).",
        "gauge",
    );
    let upgrade = st.upgrade.as_ref().map_or("idle", |u| u.state.as_str());
    let _ = writeln!(
        out,
        "railgrid_agent_upgrade_state{{state=\"{}\"}} 1",
        escape(upgrade)
    );
    let drain = st.drain.as_ref();
    sample(
        &mut out,
        "railgrid_agent_draining",
        "1 while a drain is in force on the host.",
        "gauge",
        u8::from(drain.is_some()),
    );
    sample(
        &mut out,
        "railgrid_agent_drain_jobs_left",
        "Jobs left on a draining host.",
        "gauge",
        drain.and_then(|d| d.jobs_left).unwrap_or(0),
    );
    out
}
