//! `railgrid runner run` and `railgrid runner reap`.

use std::process::ExitCode;

use super::usage;
use crate::cli::{ReapArgs, RunnerArgs};
use crate::runner::engine::EngineConfig;
use crate::runner::sandbox::SandboxMode;
use crate::runner::{self, RunnerError};

pub(super) fn run(args: RunnerArgs) -> anyhow::Result<ExitCode> {
    if crate::sys::is_root() {
        return Err(usage(RunnerError::Root));
    }
    // Before any thread exists: everything the runner creates is private to its user.
    crate::sys::set_umask(0o077);
    let state_dir = std::path::absolute(&args.state_dir)?;
    let defaults = EngineConfig::default();
    let max_jobs = args.max_jobs.unwrap_or(defaults.max_jobs).max(1);
    let cfg = EngineConfig {
        max_jobs,
        max_jobs_per_owner: args.max_jobs_per_owner.map(|n| n.max(1)),
        max_queued: args.max_queued,
        max_output_bytes: args.max_output_bytes,
        max_finished_jobs: args.max_finished_jobs,
        max_spool_bytes: args.max_spool_bytes,
        max_kept_bytes: args.max_kept_bytes,
        job_path: args
            .job_path
            .map(|p| crate::env_policy::check_search_path(&p))
            .transpose()
            .map_err(|m| usage(anyhow::anyhow!("--job-path: {m}")))?,
        force_fork: args.job_launch == crate::cli::JobLaunch::Fork,
        sandbox: crate::runner::sandbox::SandboxConfig {
            mode: match args.sandbox {
                crate::cli::SandboxFlag::Auto => SandboxMode::Auto,
                crate::cli::SandboxFlag::Required => SandboxMode::Required,
                crate::cli::SandboxFlag::Off => SandboxMode::Off,
            },
            shared: args.sandbox_shared,
            tmp_bytes: args.sandbox_tmp_size,
            shm_bytes: args.sandbox_shm_size,
            allow_syscalls: args.sandbox_allow_syscall,
            network: args.network,
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(runner::run(
        &state_dir,
        cfg,
        args.max_api_connections.max(1),
        // A budget beyond any service manager's patience is a typo; an hour also keeps
        // deadline arithmetic far from overflow.
        args.stop_budget
            .map(|b| b.min(std::time::Duration::from_secs(3600))),
    ))?;
    Ok(ExitCode::SUCCESS)
}

pub(super) fn reap(args: ReapArgs) -> anyhow::Result<ExitCode> {
    if crate::sys::is_root() {
        return Err(usage(runner::leftover::LeftoverError::Root));
    }
    crate::sys::set_umask(0o077);
    let state_dir = std::path::absolute(&args.state_dir)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(runner::leftover::reap(&state_dir, args.grace))?;
    super::print_stdout(&serde_json::to_string(&report)?)
}
