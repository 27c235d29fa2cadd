//! `railgrid runner run`.

use std::path::Path;
use std::process::ExitCode;

use super::usage;
use crate::runner::{self, RunnerError};

pub(super) fn run(state_dir: &Path) -> anyhow::Result<ExitCode> {
    if crate::sys::is_root() {
        return Err(usage(RunnerError::Root));
    }
    // Before any thread exists: everything the runner creates is private to its user.
    crate::sys::set_umask(0o077);
    let state_dir = std::path::absolute(state_dir)?;
    let rt = super::current_thread_runtime()?;
    rt.block_on(runner::run(&state_dir))?;
    Ok(ExitCode::SUCCESS)
}
