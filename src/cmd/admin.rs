//! What every `railgrid hub …` admin command shares: one call on a small runtime, its
//! errors sorted into usage (exit 2) and failures, and text from the hub made safe to
//! print.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{print_stdout, usage};
use crate::hub_client::admin::{AdminClient, AdminError, Target};

/// Runs one admin call on a small runtime; a missing target or token is a usage error.
pub(super) fn admin<F, Fut>(target: &Target, f: F) -> anyhow::Result<ExitCode>
where
    F: FnOnce(AdminClient) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<String>>,
{
    let client = AdminClient::new(target).map_err(classify)?;
    let rt = super::current_thread_runtime()?;
    let text = rt
        .block_on(f(client))
        .map_err(|e| match e.downcast::<AdminError>() {
            Ok(a) => classify(a),
            Err(e) => e,
        })?;
    print_stdout(text.trim_end())
}

/// Runs one admin command that chooses its own exit code (`job wait`, `agent drain
/// --wait`) on a small runtime; errors are sorted as [`admin`] sorts them.
pub(super) fn admin_exit<F, Fut>(target: &Target, f: F) -> anyhow::Result<ExitCode>
where
    F: FnOnce(AdminClient) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let client = AdminClient::new(target).map_err(classify)?;
    let rt = super::current_thread_runtime()?;
    rt.block_on(f(client))
        .map_err(|e| match e.downcast::<AdminError>() {
            Ok(a) => classify(a),
            Err(e) => e,
        })
}

pub(super) fn classify(e: AdminError) -> anyhow::Error {
    if e.is_usage() {
        usage(e)
    } else {
        e.into()
    }
}

/// Text an agent reported, made safe for a terminal: control characters (escape
/// sequences, newlines that would forge table rows) are shown as `?`.
pub(super) fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

pub(super) fn ago(t: Option<u64>) -> String {
    let Some(t) = t else {
        return "never".into();
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(t);
    format!(
        "{} ago",
        humantime::format_duration(Duration::from_secs(now.saturating_sub(t)))
    )
}
