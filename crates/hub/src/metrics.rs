//! The hub's metrics in Prometheus' text format (`GET /metrics`, scope `agents:read`, or
//! `hub serve --metrics-listen ADDR` in plain HTTP for a scraper on a private network).
//!
//! Counters and histograms of what happens (reconciles, wake-ups, jobs ended, dispatch
//! latency, job durations, upgrades, store errors) are kept here, process-wide (one hub
//! per process), in atomics; what *is* (agents by state and version, open jobs, queue
//! depth, rollouts) is read from the fleet's memory at each scrape, without the store
//! but for the rollouts' few rows. Names follow Prometheus practice: a `railgrid_`
//! prefix, base units (seconds), `_total` for counters.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use crate::metrics_text::{escape, gauge, labelled, sample, Counter, Histogram};

/// Upper bounds of the dispatch latency buckets, in seconds.
const DISPATCH_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 300.0];
/// Upper bounds of the job duration buckets, in seconds.
const DURATION_BUCKETS: &[f64] = &[
    0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
];

pub static RECONCILES: Counter =
    Counter::new("railgrid_reconciles_total", "Reconciles this hub answered.");
pub static WAKEUPS: Counter = Counter::new(
    "railgrid_wakeups_total",
    "Held polls woken by a change of their agent's desired state.",
);
pub static STORE_ERRORS: Counter = Counter::new(
    "railgrid_store_errors_total",
    "Requests that failed on the hub's database.",
);
pub static ENROLMENTS: Counter = Counter::new(
    "railgrid_enrolments_total",
    "Hosts that enrolled themselves with an enrolment token.",
);
pub static UNPROVEN_COMMITS: Counter = Counter::new(
    "railgrid_rollout_unproven_claims_total",
    "Rollout steps that ignored a member's claim of the version, made without the hub having served it the artifact.",
);
pub static DISPATCH: Histogram = Histogram::new(DISPATCH_BUCKETS);
pub static JOB_DURATION: Histogram = Histogram::new(DURATION_BUCKETS);
/// Where an authentication failed, as `railgrid_auth_failures_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthRoute {
    /// The admin API (`/v1/admin/…`).
    Admin,
    /// The dashboard's login.
    Login,
    /// A host's enrolment (`POST /v1/enrol`).
    Enrol,
    /// The agents' routes: reconcile, output upload, release download.
    Agent,
}

impl AuthRoute {
    const ALL: [AuthRoute; 4] = [
        AuthRoute::Admin,
        AuthRoute::Login,
        AuthRoute::Enrol,
        AuthRoute::Agent,
    ];

    fn name(self) -> &'static str {
        match self {
            AuthRoute::Admin => "admin",
            AuthRoute::Login => "login",
            AuthRoute::Enrol => "enrol",
            AuthRoute::Agent => "agent",
        }
    }
}

static AUTH_FAILURES: [std::sync::atomic::AtomicU64; 4] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 4];

/// An authentication failed on `route` (a token unknown, revoked or expired, or a login
/// form from elsewhere).
pub fn auth_failed(route: AuthRoute) {
    AUTH_FAILURES[route as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Jobs that ended, by (state, what cancelled it).
static JOBS_ENDED: Mutex<BTreeMap<(String, &'static str), u64>> = Mutex::new(BTreeMap::new());
/// Upgrades agents reported ending, by outcome.
static UPGRADES: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

/// A job ended as `state` (with `error`, for a cancel's reason).
pub fn job_ended(state: &str, error: Option<&str>, ran_ms: Option<u64>) {
    let reason = match (state, error) {
        ("cancelled", Some(e)) if e.contains("drain deadline") => "drain",
        ("cancelled", Some(e)) if e.contains("upgrade") => "upgrade",
        ("cancelled", _) => "cancel",
        _ => "",
    };
    *crate::util::lock(&JOBS_ENDED)
        .entry((state.to_owned(), reason))
        .or_default() += 1;
    if let Some(ms) = ran_ms {
        JOB_DURATION.observe(ms as f64 / 1000.0);
    }
}

/// An agent reported an upgrade that ended `committed` or `rolled_back`.
pub fn upgrade_ended(outcome: &'static str) {
    *crate::util::lock(&UPGRADES).entry(outcome).or_default() += 1;
}

/// What is, read from the fleet at a scrape.
#[derive(Debug, Default)]
pub struct Gauges {
    pub connected: u64,
    pub disconnected: u64,
    pub revoked: u64,
    pub draining: u64,
    pub by_version: BTreeMap<String, u64>,
    pub open_jobs: BTreeMap<String, u64>,
    pub queue_depth: BTreeMap<String, u64>,
    pub queue_oldest_secs: BTreeMap<String, u64>,
    pub polls_held: u64,
    pub rollouts: BTreeMap<String, u64>,
    pub rollout_members: BTreeMap<String, u64>,
}

/// The exposition: `replica` names this hub among its replicas.
pub fn render(g: &Gauges, replica: &str) -> String {
    let mut out = String::with_capacity(8192);
    let info = crate::build_info::current();
    gauge(
        &mut out,
        "railgrid_build_info",
        "The hub's build (1), by version, commit and replica.",
        "gauge",
    );
    let _ = writeln!(
        out,
        "railgrid_build_info{{version=\"{}\",commit=\"{}\",replica=\"{}\"}} 1",
        escape(&info.version),
        escape(info.commit.as_deref().unwrap_or("unknown")),
        escape(replica)
    );
    gauge(
        &mut out,
        "railgrid_agents",
        "Enrolled agents by state.",
        "gauge",
    );
    for (state, n) in [
        ("connected", g.connected),
        ("disconnected", g.disconnected),
        ("revoked", g.revoked),
        ("draining", g.draining),
    ] {
        let _ = writeln!(out, "railgrid_agents{{state=\"{state}\"}} {n}");
    }
    gauge(
        &mut out,
        "railgrid_agents_by_version",
        "Agents (not revoked) by the version they report.",
        "gauge",
    );
    labelled(
        &mut out,
        "railgrid_agents_by_version",
        "version",
        &g.by_version,
    );
    gauge(
        &mut out,
        "railgrid_jobs_open",
        "Jobs not done, by state.",
        "gauge",
    );
    labelled(&mut out, "railgrid_jobs_open", "state", &g.open_jobs);
    gauge(
        &mut out,
        "railgrid_queue_depth",
        "Selected jobs waiting in the fleet's queue, by selector.",
        "gauge",
    );
    labelled(&mut out, "railgrid_queue_depth", "selector", &g.queue_depth);
    gauge(
        &mut out,
        "railgrid_queue_oldest_seconds",
        "How long the job waiting longest in the fleet's queue has waited, by selector.",
        "gauge",
    );
    labelled(
        &mut out,
        "railgrid_queue_oldest_seconds",
        "selector",
        &g.queue_oldest_secs,
    );
    gauge(
        &mut out,
        "railgrid_jobs_ended_total",
        "Jobs that ended, by state (and, for a cancel, by what cancelled it: cancel, drain, upgrade).",
        "counter",
    );
    for ((state, reason), n) in crate::util::lock(&JOBS_ENDED).iter() {
        let _ = writeln!(
            out,
            "railgrid_jobs_ended_total{{state=\"{}\",reason=\"{reason}\"}} {n}",
            escape(state)
        );
    }
    DISPATCH.render(
        &mut out,
        "railgrid_dispatch_latency_seconds",
        "From a selected job's submission to its assignment to an agent.",
    );
    JOB_DURATION.render(
        &mut out,
        "railgrid_job_duration_seconds",
        "From a job's start on its agent to its end, as the hub heard them.",
    );
    for counter in [
        &RECONCILES,
        &WAKEUPS,
        &STORE_ERRORS,
        &ENROLMENTS,
        &UNPROVEN_COMMITS,
    ] {
        counter.render(&mut out);
    }
    sample(
        &mut out,
        "railgrid_polls_held",
        "Long polls this hub holds now.",
        "gauge",
        g.polls_held,
    );
    gauge(
        &mut out,
        "railgrid_upgrades_total",
        "Upgrades agents reported ending, by outcome.",
        "counter",
    );
    for outcome in ["committed", "rolled_back"] {
        let n = crate::util::lock(&UPGRADES)
            .get(outcome)
            .copied()
            .unwrap_or(0);
        let _ = writeln!(out, "railgrid_upgrades_total{{outcome=\"{outcome}\"}} {n}");
    }
    gauge(
        &mut out,
        "railgrid_auth_failures_total",
        "Failed authentications, by route (admin, login, enrol, agent); past a source's burst they are answered 429.",
        "counter",
    );
    for route in AuthRoute::ALL {
        let n = AUTH_FAILURES[route as usize].load(std::sync::atomic::Ordering::Relaxed);
        let _ = writeln!(
            out,
            "railgrid_auth_failures_total{{route=\"{}\"}} {n}",
            route.name()
        );
    }
    gauge(&mut out, "railgrid_rollouts", "Rollouts by state.", "gauge");
    labelled(&mut out, "railgrid_rollouts", "state", &g.rollouts);
    gauge(
        &mut out,
        "railgrid_rollout_members",
        "Members of the rollouts that are not over, by state.",
        "gauge",
    );
    labelled(
        &mut out,
        "railgrid_rollout_members",
        "state",
        &g.rollout_members,
    );
    out
}
