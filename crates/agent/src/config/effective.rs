//! The effective configuration as `check-config` prints it: every setting with the value
//! in force, under its file key, in the order of the `settings!` list. It holds no
//! secret: the token stays in its file.
//!
//! Built from [`SETTINGS`] rather than restated as structs, so a new setting cannot be
//! left out: [`AgentConfig::shown`] must say what each [`Key`] holds.

use std::path::Path;
use std::time::Duration;

use toml_edit::{value, DocumentMut, Value};

use super::settings::AgentConfig;
use super::sources::{Key, SETTINGS};
use crate::supervisor::account::Account;

impl AgentConfig {
    pub fn effective(&self) -> DocumentMut {
        let mut doc = DocumentMut::new();
        let config_file = self.config_path.as_ref().map_or_else(
            || "(none: defaults)".to_owned(),
            |p| p.display().to_string(),
        );
        doc["config_file"] = value(config_file);
        for s in SETTINGS {
            let Some(v) = self.shown(s.key) else {
                continue;
            };
            match s.toml.split_once('.') {
                Some((table, key)) => {
                    if !doc.contains_key(table) {
                        doc[table] = toml_edit::table();
                    }
                    doc[table][key] = value(v);
                }
                None => doc[s.toml] = value(v),
            }
        }
        if self.hub.is_some() {
            doc["hub"]["token"] = value("<redacted>");
        }
        doc
    }

    /// The value of `key` in force, as `check-config` shows it; `None` where it is unset
    /// and has no default (a hub setting without a hub).
    fn shown(&self, key: Key) -> Option<Value> {
        let duration = |d: Duration| Value::from(humantime::format_duration(d).to_string());
        let path = |p: &Path| Value::from(p.display().to_string());
        let number = |n: u64| Value::from(i64::try_from(n).unwrap_or(i64::MAX));
        let count = |n: usize| number(n as u64);
        let list = |v: &[String]| Value::Array(v.iter().collect());
        let (r, u) = (&self.runner, &self.upgrade);
        Some(match key {
            Key::StateDir => path(&self.state_dir),
            Key::LogDir => path(&self.log_dir),
            Key::RunnerUser => Value::from(r.user.as_ref().map_or_else(
                || format!("{} (the agent's own account)", Account::current().name),
                |a| a.name.clone(),
            )),
            Key::StopGrace => duration(r.stop_grace),
            Key::InitialBackoff => duration(r.initial_backoff),
            Key::MaxLogBytes => number(r.max_log_bytes),
            Key::MaxJobs => count(r.max_jobs?),
            Key::MaxJobsPerOwner => count(r.max_jobs_per_owner?),
            Key::MaxQueued => count(r.max_queued?),
            Key::MaxOutputBytes => number(r.max_output_bytes?),
            // `auto` where unset: see [`RunnerSettings::delegate_cgroup`].
            Key::DelegateCgroup => Value::from(
                r.delegate_cgroup
                    .map_or_else(|| "auto".into(), |d| d.to_string()),
            ),
            Key::JobPath => {
                Value::from(r.job_path.clone().unwrap_or_else(|| {
                    format!("{} (the default)", crate::supervisor::DEFAULT_PATH)
                }))
            }
            Key::Sandbox => Value::from(r.sandbox.mode.clone().unwrap_or_else(|| "auto".into())),
            Key::SandboxShared => Value::Array(
                r.sandbox
                    .shared
                    .iter()
                    .map(|p| Value::from(p.display().to_string()))
                    .collect(),
            ),
            Key::SandboxTmpSize => number(
                r.sandbox
                    .tmp_size
                    .unwrap_or(crate::proto::runner::DEFAULT_TMP_BYTES),
            ),
            Key::SandboxAllowSyscalls => list(&r.sandbox.allow_syscalls),
            Key::Network => Value::from(r.sandbox.network.clone().unwrap_or_else(|| "open".into())),
            Key::MaxKeptBytes => number(
                r.max_kept_bytes
                    .unwrap_or(crate::proto::runner::DEFAULT_MAX_KEPT_BYTES),
            ),
            Key::HubUrl => list(&self.hub.as_ref()?.urls),
            Key::AgentId => Value::from(&self.hub.as_ref()?.agent_id),
            Key::TokenFile => path(&self.hub.as_ref()?.token_file),
            Key::EnrolToken => path(self.hub.as_ref()?.enrol_token_file.as_ref()?),
            Key::CaFile => path(self.hub.as_ref()?.ca_file.as_ref()?),
            Key::LogMaxFiles => count(self.log_max_files),
            Key::MetricsListen => Value::from(self.metrics.as_ref()?.listen.to_string()),
            Key::MetricsAllowRemote => Value::from(self.metrics.as_ref()?.allow_remote),
            Key::TrustedKeys => list(&u.trusted_keys),
            Key::Settle => duration(u.settle),
            Key::Deadline => duration(u.deadline),
            Key::HubWait => duration(u.hub_wait),
            Key::DrainDeadline => duration(u.drain_deadline),
            Key::Labels => Value::InlineTable(
                self.labels
                    .iter()
                    .map(|(k, v)| (k.as_str(), Value::from(v)))
                    .collect(),
            ),
        })
    }
}
