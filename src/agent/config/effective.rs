//! The effective configuration as `check-config` prints it: every setting with the value
//! in force, the token redacted.

use std::path::PathBuf;

use serde::Serialize;

use super::settings::AgentConfig;
use crate::supervisor::account::Account;

/// The effective configuration as `check-config` prints it. It holds no secret: the
/// token stays in its file.
#[derive(Debug, Serialize)]
pub(crate) struct Effective {
    pub(crate) config_file: String,
    pub(crate) state_dir: PathBuf,
    pub(crate) log_dir: PathBuf,
    pub(crate) runner: EffectiveRunner,
    pub(crate) hub: Option<EffectiveHub>,
    pub(crate) log: EffectiveLog,
    pub(crate) upgrade: EffectiveUpgrade,
}

#[derive(Debug, Serialize)]
pub(crate) struct EffectiveUpgrade {
    pub(crate) trusted_keys: Vec<String>,
    pub(crate) settle: String,
    pub(crate) deadline: String,
    pub(crate) hub_wait: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct EffectiveRunner {
    pub(crate) user: String,
    pub(crate) stop_grace: String,
    pub(crate) initial_backoff: String,
    pub(crate) max_log_bytes: u64,
    pub(crate) max_jobs: Option<usize>,
    pub(crate) max_jobs_per_owner: Option<usize>,
    pub(crate) max_queued: Option<usize>,
    pub(crate) max_output_bytes: Option<u64>,
    /// `true`, `false`, or `auto` (unset: see [`RunnerSettings::delegate_cgroup`]).
    pub(crate) delegate_cgroup: String,
    pub(crate) job_path: String,
    pub(crate) max_kept_bytes: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct EffectiveHub {
    pub(crate) url: Vec<String>,
    pub(crate) agent_id: String,
    pub(crate) token_file: PathBuf,
    pub(crate) token: &'static str,
    pub(crate) ca_file: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub(crate) struct EffectiveLog {
    pub(crate) max_files: usize,
}

impl AgentConfig {
    pub(crate) fn effective(&self) -> Effective {
        Effective {
            config_file: self.config_path.as_ref().map_or_else(
                || "(none: defaults)".to_owned(),
                |p| p.display().to_string(),
            ),
            state_dir: self.state_dir.clone(),
            log_dir: self.log_dir.clone(),
            runner: EffectiveRunner {
                user: self.runner.user.as_ref().map_or_else(
                    || format!("{} (the agent's own account)", Account::current().name),
                    |a| a.name.clone(),
                ),
                stop_grace: humantime::format_duration(self.runner.stop_grace).to_string(),
                initial_backoff: humantime::format_duration(self.runner.initial_backoff)
                    .to_string(),
                max_log_bytes: self.runner.max_log_bytes,
                max_jobs: self.runner.max_jobs,
                max_jobs_per_owner: self.runner.max_jobs_per_owner,
                max_queued: self.runner.max_queued,
                max_output_bytes: self.runner.max_output_bytes,
                delegate_cgroup: self
                    .runner
                    .delegate_cgroup
                    .map_or_else(|| "auto".to_owned(), |d| d.to_string()),
                job_path: self.runner.job_path.clone().unwrap_or_else(|| {
                    format!("{} (the default)", crate::supervisor::DEFAULT_PATH)
                }),
                max_kept_bytes: self
                    .runner
                    .max_kept_bytes
                    .unwrap_or(crate::runner::engine::DEFAULT_MAX_KEPT_BYTES),
            },
            hub: self.hub.as_ref().map(|h| EffectiveHub {
                url: h.urls.clone(),
                agent_id: h.agent_id.clone(),
                token_file: h.token_file.clone(),
                token: "<redacted>",
                ca_file: h.ca_file.clone(),
            }),
            log: EffectiveLog {
                max_files: self.log_max_files,
            },
            upgrade: EffectiveUpgrade {
                trusted_keys: self.upgrade.trusted_keys.clone(),
                settle: humantime::format_duration(self.upgrade.settle).to_string(),
                deadline: humantime::format_duration(self.upgrade.deadline).to_string(),
                hub_wait: humantime::format_duration(self.upgrade.hub_wait).to_string(),
            },
        }
    }
}
