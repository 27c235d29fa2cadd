//! The runner child: how the runner is launched (its account, its environment from
//! nothing, its command line, its cgroup) and how its stop is finished once its process
//! group is gone (`cgroup.kill` of its tree, then `runner reap` as its account).

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[cfg(target_os = "linux")]
use crate::cgroup;
use crate::config::AgentConfig;
use crate::proto::desired::DesiredRunner;
use crate::proto::runner::ReapReport;
use crate::supervisor::account::Account;
use crate::supervisor::{self, env, Identity, Supervisor};
use crate::sys::exe::PinnedExe;
use crate::{AgentError, RUNNER_LOG};

/// The grace `runner reap` gives each job a stopped runner left: the runner's own stop
/// already had its budget for a gentle end.
const REAP_GRACE: Duration = Duration::from_secs(2);
/// Longest a `runner reap` may take (its grace, SIGKILL and reaping, the database) before
/// the agent kills it.
pub(crate) const REAP_TIMEOUT: Duration = Duration::from_secs(15);

/// Prepares the directories and builds (validates) the runner's supervisor. Directory
/// creation, chown, cgroup delegation and opening the log are blocking work.
pub(super) async fn build(
    cfg: &AgentConfig,
    desired: &DesiredRunner,
    exe: &Arc<PinnedExe>,
) -> Result<Supervisor, AgentError> {
    let (cfg, desired, exe) = (cfg.clone(), desired.clone(), exe.clone());
    crate::blocking("runner supervisor build", move || {
        crate::dirs::prepare(&cfg)?;
        Ok(Supervisor::new(runner_config(&cfg, &desired, &exe)?)?)
    })
    .await?
}

/// The supervisor configuration of the runner child.
fn runner_config(
    cfg: &AgentConfig,
    desired: &DesiredRunner,
    exe: &Arc<PinnedExe>,
) -> Result<supervisor::Config, AgentError> {
    let mut c = runner_account_config(cfg, exe, "runner", "run")?;
    c.args = runner_run_args(cfg, desired);
    c.max_log_bytes = cfg.runner.max_log_bytes;
    c.stop_grace = cfg.runner.stop_grace;
    c.initial_backoff = cfg.runner.initial_backoff;
    if let Some(ask) = cgroup_ask(cfg) {
        let account = cfg.runner.user.clone().unwrap_or_else(Account::current);
        c.cgroup = runner_cgroup(&account, ask, &cfg.state_dir);
    }
    Ok(c)
}

/// `runner <verb> --state-dir S`.
fn runner_args(cfg: &AgentConfig, verb: &str) -> Vec<OsString> {
    vec![
        "runner".into(),
        verb.into(),
        "--state-dir".into(),
        cfg.state_dir.clone().into_os_string(),
    ]
}

/// The arguments of `runner run`: its stop budget, its job engine limits, the jobs' PATH.
pub(super) fn runner_run_args(cfg: &AgentConfig, desired: &DesiredRunner) -> Vec<OsString> {
    let mut args = runner_args(cfg, "run");
    // Its environment is built from nothing: the agent's own format is passed on.
    if crate::util::log_format::is_json() {
        args.push("--log-format".into());
        args.push("json".into());
    }
    // In milliseconds: exact, and one argument.
    args.push("--stop-budget".into());
    args.push(format!("{}ms", cfg.runner.stop_grace.as_millis()).into());
    let limits = [
        ("--max-jobs", desired.max_jobs.map(|n| n.to_string())),
        (
            "--max-jobs-per-owner",
            desired.max_jobs_per_owner.map(|n| n.to_string()),
        ),
        ("--max-queued", desired.max_queued.map(|n| n.to_string())),
        (
            "--max-output-bytes",
            desired.max_output_bytes.map(|n| n.to_string()),
        ),
        ("--job-path", cfg.runner.job_path.clone()),
        (
            "--max-kept-bytes",
            cfg.runner.max_kept_bytes.map(|n| n.to_string()),
        ),
    ];
    for (flag, value) in limits {
        if let Some(v) = value {
            args.push(flag.into());
            args.push(v.into());
        }
    }
    let sb = &cfg.runner.sandbox;
    if let Some(mode) = &sb.mode {
        args.extend(["--sandbox".into(), mode.into()]);
    }
    if let Some(size) = sb.tmp_size {
        args.extend(["--sandbox-tmp-size".into(), size.to_string().into()]);
    }
    for dir in &sb.shared {
        args.extend(["--sandbox-shared".into(), dir.as_os_str().to_owned()]);
    }
    for name in &sb.allow_syscalls {
        args.extend(["--sandbox-allow-syscall".into(), name.into()]);
    }
    if let Some(network) = &desired.network {
        args.extend(["--network".into(), network.to_string().into()]);
    }
    args
}

/// `railgrid runner <verb> --state-dir S` from the pinned executable, as the runner
/// account, with an environment built from nothing, in the runner's directory.
fn runner_account_config(
    cfg: &AgentConfig,
    exe: &Arc<PinnedExe>,
    name: &str,
    verb: &str,
) -> Result<supervisor::Config, AgentError> {
    let account = cfg.runner.user.clone().unwrap_or_else(Account::current);
    let env = env::child_env(&account, None, None, &[]).map_err(|source| {
        AgentError::Supervisor(supervisor::Error::Env {
            name: name.into(),
            source,
        })
    })?;
    let mut c = supervisor::Config::new(name, exe.path(), cfg.log_dir.join(RUNNER_LOG));
    // Launched from the pinned bytes, not from what the path names now (invariant 14).
    c.exe = Some(exe.clone());
    c.args = runner_args(cfg, verb);
    c.dir = cfg.runner_dir();
    c.env = env;
    c.identity = cfg
        .runner
        .user
        .clone()
        .map_or(Identity::Inherit, Identity::User);
    Ok(c)
}
/// Ends what a stopped runner could not (it was SIGKILLed at stop_grace, or had crashed
/// before): where it had a delegated cgroup, everything in that tree, jobs' cgroups and
/// all, with `cgroup.kill`; then `runner reap` as the runner's account, which ends every
/// job group still recorded running (verified by pid and start time) and marks it lost.
/// Returns what was ended, one line each, for the status file; the log says the same.
pub(super) async fn finish_runner_stop(
    cfg: &AgentConfig,
    sup: &Supervisor,
    exe: &Arc<PinnedExe>,
) -> Vec<String> {
    let mut ended = Vec::new();
    #[cfg(target_os = "linux")]
    if let Some(tree) = sup.config().cgroup.as_ref().and_then(|leaf| leaf.parent()) {
        match cgroup::kill_tree(tree).await {
            Ok(false) => {}
            Ok(true) => {
                tracing::warn!(cgroup = %tree.display(), "processes were left in the runner's cgroup tree after its stop: killed them with cgroup.kill");
                ended.push(format!(
                    "processes left in the runner's cgroup {}: killed (cgroup.kill)",
                    tree.display()
                ));
            }
            Err(e) => {
                tracing::error!(error = %crate::error_chain(&e), "could not empty the runner's cgroup tree")
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = sup;
    let reap = runner_account_config(cfg, exe, "runner reap", "reap").map(|mut c| {
        c.args.push("--grace".into());
        c.args.push(format!("{}ms", REAP_GRACE.as_millis()).into());
        c
    });
    let finished = match reap {
        Ok(c) => supervisor::run_once(&c, REAP_TIMEOUT)
            .await
            .map_err(AgentError::from),
        Err(e) => Err(e),
    };
    let finished = match finished {
        Ok(f) => f,
        Err(e) => {
            tracing::error!(error = %crate::error_chain(&e), "could not run `runner reap`: jobs the runner left running may outlive it");
            return ended;
        }
    };
    let stderr = String::from_utf8_lossy(&finished.stderr);
    let report: Option<ReapReport> = match finished.status {
        Some(st) if st.success() => serde_json::from_slice(&finished.stdout).ok(),
        _ => None,
    };
    let Some(report) = report else {
        let why = finished.status.map_or_else(
            || format!("killed after {REAP_TIMEOUT:?}"),
            supervisor::describe,
        );
        tracing::error!(status = %why, stderr = %stderr.trim(), "`runner reap` failed: jobs the runner left running may outlive it");
        return ended;
    };
    if let Some(pid) = report.held_by {
        tracing::warn!(
            pid,
            "`runner reap`: a runner still holds the runner lock; its jobs were left alone"
        );
    }
    for e in &report.ended {
        tracing::warn!(job = %e.id, pid = ?e.pid, reason = %e.reason, "reaped a job the runner left running: marked lost");
        let pid = e.pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
        ended.push(format!("job {}{pid}: {}", e.id, e.reason));
    }
    for id in &report.uncommitted {
        tracing::error!(job = %id, "`runner reap` could not record the job as lost (is the disk full?); the next runner reconciles it");
    }
    ended
}

/// Whether a cgroup is asked for the runner: `runner.delegate_cgroup`, or, unset, where a
/// root agent may make one (Linux).
#[cfg(target_os = "linux")]
fn cgroup_ask(cfg: &AgentConfig) -> Option<cgroup::Ask> {
    match cfg.runner.delegate_cgroup {
        Some(true) => Some(cgroup::Ask::Delegated),
        Some(false) => None,
        None => Some(cgroup::Ask::Auto),
    }
}

#[cfg(not(target_os = "linux"))]
fn cgroup_ask(cfg: &AgentConfig) -> Option<()> {
    cfg.runner.delegate_cgroup.filter(|d| *d).map(|_| ())
}

/// The cgroup delegated to the runner, or `None` (logged) where the host cannot give one:
/// its jobs then get process-group confinement, in which a process that calls setsid or
/// setpgid leaves its job.
#[cfg(target_os = "linux")]
fn runner_cgroup(acct: &Account, ask: cgroup::Ask, state_dir: &std::path::Path) -> Option<PathBuf> {
    match cgroup::delegate_to_runner(acct, ask, state_dir) {
        Ok(dir) => Some(dir),
        Err(e) if ask == cgroup::Ask::Auto => {
            tracing::info!(reason = %crate::error_chain(&e), "no cgroup for the runner: its jobs get process-group confinement, which a job that calls setsid or setpgid leaves");
            None
        }
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "runner.delegate_cgroup: no cgroup for the runner; its jobs get process-group confinement, which a job that calls setsid or setpgid leaves");
            None
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn runner_cgroup(_acct: &Account, _ask: (), _state_dir: &std::path::Path) -> Option<PathBuf> {
    tracing::warn!("runner.delegate_cgroup needs Linux cgroup v2; ignored");
    None
}
