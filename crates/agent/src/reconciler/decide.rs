//! The reconciler's decision, apart from its effects: what a standalone agent desires, and
//! given the runner in force and a new desired state, whether to keep, adjust, restart,
//! start or stop it. Pure functions, tested without a runner.

use crate::config::{AgentConfig, RunnerSettings};
use crate::proto::admission::AdmissionChange;
use crate::proto::desired::{DesiredRunner, DesiredState};
use crate::proto::runner;

/// The desired state a standalone agent derives from its configuration: a runner,
/// enabled, with the file's job engine limits. `prev` is the one derived last: the
/// generation moves on only when what is desired changed.
pub(crate) fn standalone(cfg: &AgentConfig, prev: Option<&DesiredState>) -> DesiredState {
    let r = &cfg.runner;
    let runner = DesiredRunner {
        enabled: true,
        drain_first: false,
        max_jobs: r.max_jobs,
        max_jobs_per_owner: r.max_jobs_per_owner,
        max_queued: r.max_queued,
        max_output_bytes: r.max_output_bytes,
        network: None,
    };
    let generation = match prev {
        None => 1,
        Some(p) if p.runner == runner => p.generation,
        Some(p) => p.generation + 1,
    };
    DesiredState {
        generation,
        poll_interval_secs: None,
        agent: None,
        runner,
        ..DesiredState::default()
    }
}

/// Everything the runner child is launched from: the settings only this host decides,
/// and the runner part of the desired state, each limit it leaves out taken from the
/// config file. Two equal specs are the same runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RunnerSpec {
    /// The config file's runner settings without those the desired state carries (so a
    /// file limit the desired state overrides is no reason to restart).
    pub(super) local: RunnerSettings,
    pub(super) desired: DesiredRunner,
}

impl RunnerSpec {
    pub(super) fn new(cfg: &AgentConfig, desired: &DesiredState) -> Self {
        let (d, r) = (&desired.runner, &cfg.runner);
        // The admission limits resolved to the values the runner would use (the hub's,
        // else the file's, else the runner's defaults): a limit the hub stops setting is
        // then a new value the running runner takes, not a reason to restart it and end
        // its jobs.
        let max_jobs = d
            .max_jobs
            .or(r.max_jobs)
            .unwrap_or_else(runner::default_max_jobs);
        Self {
            local: RunnerSettings {
                max_jobs: None,
                max_jobs_per_owner: None,
                max_queued: None,
                max_output_bytes: None,
                sandbox: crate::config::SandboxSettings {
                    network: None,
                    ..r.sandbox.clone()
                },
                ..r.clone()
            },
            desired: DesiredRunner {
                enabled: d.enabled,
                // How a stop goes, not what runs: never a reason to restart.
                drain_first: false,
                max_jobs: Some(max_jobs),
                max_jobs_per_owner: Some(
                    d.max_jobs_per_owner
                        .or(r.max_jobs_per_owner)
                        .unwrap_or(max_jobs),
                ),
                max_queued: Some(
                    d.max_queued
                        .or(r.max_queued)
                        .unwrap_or(runner::DEFAULT_MAX_QUEUED),
                ),
                max_output_bytes: d.max_output_bytes.or(r.max_output_bytes),
                // The hub's, else the file's (checked when it was loaded).
                network: d
                    .network
                    .clone()
                    .or_else(|| r.sandbox.network.as_deref()?.parse().ok()),
            },
        }
    }
}

/// What converging to a desired state takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// Nothing: the runner is as wanted (or absent, as wanted).
    Keep,
    Start,
    /// Stop the running runner, start one with the new spec; the settings that differ.
    Restart(Vec<&'static str>),
    /// Only admission limits changed, each to a value: the running runner can take them.
    Adjust(AdmissionChange),
    Stop,
    /// An older generation than the one applied: never go back.
    Stale,
}

/// The convergence decision, from what runs (`running`: its spec, `None` when no runner
/// is wanted or started) and what is wanted.
pub(super) fn decide(
    applied_generation: u64,
    running: Option<&RunnerSpec>,
    desired: &DesiredState,
    want: &RunnerSpec,
) -> Step {
    if desired.generation < applied_generation {
        return Step::Stale;
    }
    match (running, want.desired.enabled) {
        (None, false) => Step::Keep,
        (Some(_), false) => Step::Stop,
        (None, true) => Step::Start,
        (Some(spec), true) => {
            let restart = restart_reasons(spec, want);
            if !restart.is_empty() {
                return Step::Restart(restart);
            }
            match admission_change(&spec.desired, &want.desired) {
                Some(change) => Step::Adjust(change),
                None => Step::Keep,
            }
        }
    }
}

/// The settings that differ between two runners and that only a new runner can take: the
/// local ones and the spool cap (admission limits are always resolved to a value, which
/// the running runner takes).
pub(super) fn restart_reasons(old: &RunnerSpec, new: &RunnerSpec) -> Vec<&'static str> {
    let (a, b) = (&old.local, &new.local);
    let (da, db) = (&old.desired, &new.desired);
    [
        ("user", a.user != b.user),
        ("stop_grace", a.stop_grace != b.stop_grace),
        ("initial_backoff", a.initial_backoff != b.initial_backoff),
        ("max_log_bytes", a.max_log_bytes != b.max_log_bytes),
        ("delegate_cgroup", a.delegate_cgroup != b.delegate_cgroup),
        ("job_path", a.job_path != b.job_path),
        ("max_kept_bytes", a.max_kept_bytes != b.max_kept_bytes),
        ("sandbox", a.sandbox != b.sandbox),
        (
            "max_output_bytes",
            da.max_output_bytes != db.max_output_bytes,
        ),
        ("network", da.network != db.network),
    ]
    .into_iter()
    .filter_map(|(name, differs)| differs.then_some(name))
    .collect()
}

/// The admission limits that changed to a value, as the runner's `PUT /v1/admission`
/// takes them; `None` when none did.
pub(super) fn admission_change(
    old: &DesiredRunner,
    new: &DesiredRunner,
) -> Option<AdmissionChange> {
    let changed = |a: Option<usize>, b: Option<usize>| b.filter(|_| a != b);
    let change = AdmissionChange {
        max_jobs: changed(old.max_jobs, new.max_jobs),
        max_jobs_per_owner: changed(old.max_jobs_per_owner, new.max_jobs_per_owner),
        max_queued: changed(old.max_queued, new.max_queued),
    };
    (change != AdmissionChange::default()).then_some(change)
}

/// The names of the limits an admission change sets, for the log.
pub(super) fn admission_names(change: &AdmissionChange) -> Vec<&'static str> {
    [
        ("max_jobs", change.max_jobs.is_some()),
        ("max_jobs_per_owner", change.max_jobs_per_owner.is_some()),
        ("max_queued", change.max_queued.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn config(max_jobs: Option<usize>, stop_grace: Duration) -> AgentConfig {
        AgentConfig {
            config_path: None,
            state_dir: "/state".into(),
            log_dir: "/logs".into(),
            runner: RunnerSettings {
                user: None,
                stop_grace,
                initial_backoff: Duration::from_secs(1),
                max_log_bytes: 8 << 20,
                max_jobs,
                max_jobs_per_owner: Some(2),
                max_queued: None,
                max_output_bytes: None,
                delegate_cgroup: Some(false),
                job_path: Some("/opt/bin:/usr/bin".into()),
                max_kept_bytes: None,
                sandbox: Default::default(),
            },
            hub: None,
            labels: Default::default(),
            log_max_files: 7,
            metrics: None,
            upgrade: crate::config::UpgradeSettings {
                trusted_keys: Vec::new(),
                settle: Duration::from_secs(30),
                deadline: Duration::from_secs(120),
                hub_wait: Duration::from_secs(3600),
                drain_deadline: Duration::from_secs(3600),
            },
        }
    }

    #[test]
    fn the_config_files_limits_become_the_desired_runner() {
        let cfg = config(Some(4), Duration::from_secs(10));
        let d = standalone(&cfg, None);
        assert_eq!(d.generation, 1);
        assert!(d.runner.enabled);
        assert_eq!(d.runner.max_jobs, Some(4));
        assert_eq!(d.runner.max_jobs_per_owner, Some(2));
        // What only this host decides stays out of it: the spec keeps it locally.
        let spec = RunnerSpec::new(&cfg, &d);
        assert_eq!(spec.local.max_jobs, None);
        assert_eq!(spec.local.job_path.as_deref(), Some("/opt/bin:/usr/bin"));
        assert_eq!(spec.local.stop_grace, Duration::from_secs(10));
    }

    #[test]
    fn the_generation_moves_only_when_the_desired_runner_changes() {
        let first = standalone(&config(Some(4), Duration::from_secs(10)), None);
        // A local setting changed: the same desired state.
        let same = standalone(&config(Some(4), Duration::from_secs(3)), Some(&first));
        assert_eq!(same.generation, 1);
        let next = standalone(&config(Some(8), Duration::from_secs(3)), Some(&same));
        assert_eq!(next.generation, 2);
    }

    #[test]
    fn convergence_decisions() {
        let cfg = config(Some(4), Duration::from_secs(10));
        let d = standalone(&cfg, None);
        let spec = RunnerSpec::new(&cfg, &d);
        assert_eq!(decide(1, None, &d, &spec), Step::Start);
        assert_eq!(decide(1, Some(&spec), &d, &spec), Step::Keep);

        // A local setting (the stop grace): another runner, saying why.
        let grace = config(Some(4), Duration::from_secs(3));
        let want = RunnerSpec::new(&grace, &d);
        assert_eq!(
            decide(1, Some(&spec), &d, &want),
            Step::Restart(vec!["stop_grace"])
        );
        // An admission limit changed to a value: the running runner takes it.
        let limits = standalone(&config(Some(8), Duration::from_secs(10)), Some(&d));
        let want = RunnerSpec::new(&cfg, &limits);
        assert_eq!(
            decide(1, Some(&spec), &limits, &want),
            Step::Adjust(AdmissionChange {
                max_jobs: Some(8),
                ..AdmissionChange::default()
            })
        );
        // The spool cap only reaches a new runner.
        let mut spool = limits.clone();
        spool.runner.max_output_bytes = Some(1 << 20);
        let want = RunnerSpec::new(&cfg, &spool);
        assert_eq!(
            decide(2, Some(&spec), &spool, &want),
            Step::Restart(vec!["max_output_bytes"])
        );

        // Disabled: stop a running runner, leave an absent one absent.
        let mut off = limits.clone();
        off.generation = 3;
        off.runner.enabled = false;
        let want = RunnerSpec::new(&cfg, &off);
        assert_eq!(decide(2, Some(&spec), &off, &want), Step::Stop);
        assert_eq!(decide(3, None, &off, &want), Step::Keep);

        // Never back to an older generation.
        assert_eq!(decide(3, None, &d, &spec), Step::Stale);
    }

    #[test]
    fn a_limit_the_hub_leaves_out_is_the_config_files() {
        let cfg = config(Some(4), Duration::from_secs(10));
        let hub = DesiredState {
            generation: 7,
            runner: DesiredRunner {
                max_jobs_per_owner: Some(1),
                ..DesiredRunner::default()
            },
            ..DesiredState::default()
        };
        let spec = RunnerSpec::new(&cfg, &hub);
        assert_eq!(spec.desired.max_jobs, Some(4), "from the file");
        assert_eq!(spec.desired.max_jobs_per_owner, Some(1), "from the hub");
        assert_eq!(
            spec.desired.max_queued,
            Some(runner::DEFAULT_MAX_QUEUED),
            "the runner's default"
        );

        // The file's limit changes under a hub that leaves it out (SIGHUP): adjusted.
        let reloaded = config(Some(6), Duration::from_secs(10));
        let want = RunnerSpec::new(&reloaded, &hub);
        assert_eq!(
            decide(7, Some(&spec), &hub, &want),
            Step::Adjust(AdmissionChange {
                max_jobs: Some(6),
                ..AdmissionChange::default()
            })
        );
        // A limit dropped everywhere goes back to the runner's default, which the running
        // runner takes: no restart, no job ended.
        let none = config(None, Duration::from_secs(10));
        let want = RunnerSpec::new(&none, &hub);
        assert_eq!(
            decide(7, Some(&spec), &hub, &want),
            Step::Adjust(AdmissionChange {
                max_jobs: Some(runner::default_max_jobs()),
                ..AdmissionChange::default()
            })
        );
    }
}
