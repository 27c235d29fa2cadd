//! Each setting declared once (its TOML key, its variable, its flag) and looked up in every
//! source in precedence order: flag, then environment, then file. The origin of the value
//! that won is what an error names.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::ConfigError;
use super::raw::{Flags, HubUrls, RawConfig};
use crate::env_vars;

/// A setting's value as text, the form every source gives it in: flags and files are
/// turned into it so that one parser (and one error message) serves all three sources.
pub(super) trait AsText {
    fn as_text(&self) -> String;
}

impl AsText for String {
    fn as_text(&self) -> String {
        self.clone()
    }
}

impl AsText for PathBuf {
    fn as_text(&self) -> String {
        self.display().to_string()
    }
}

macro_rules! as_text_by_display {
    ($($t:ty),*) => {
        $(impl AsText for $t {
            fn as_text(&self) -> String {
                self.to_string()
            }
        })*
    };
}
as_text_by_display!(u64, usize, bool);

/// Labels, as their variable gives them: `k=v,k2=v2`.
impl AsText for std::collections::BTreeMap<String, String> {
    fn as_text(&self) -> String {
        crate::proto::labels::to_list(self)
    }
}

/// A list, as its variable gives it: comma-separated.
impl AsText for Vec<String> {
    fn as_text(&self) -> String {
        self.join(",")
    }
}

/// One setting, named once for every source: its key in the file, its environment
/// variable (from [`env_vars`]) and its flag, if it has one.
#[derive(Debug)]
pub(super) struct Setting {
    pub(super) key: Key,
    /// Dotted TOML key, `runner.max_jobs`.
    pub(super) toml: &'static str,
    /// Environment variable, `RAILGRID_RUNNER_MAX_JOBS`.
    pub(super) env: &'static str,
    pub(super) flag: Option<Flag>,
    /// The value in the file, as text.
    pub(super) file: fn(&RawConfig) -> Option<String>,
}

#[derive(Debug)]
pub(super) struct Flag {
    /// `--runner-user`.
    pub(super) name: &'static str,
    /// The value on the command line, as text.
    pub(super) value: fn(&Flags) -> Option<String>,
}

/// Declares every setting once: `Key` and [`SETTINGS`] (in the same order) come from the
/// one list below. A line reads `Variant: toml.path, env CONST[, flag "--name" => field]`:
/// the TOML key is also the field path in [`RawConfig`], `CONST` names a constant of
/// [`env_vars`], and `field` is the [`Flags`] field that holds the flag.
macro_rules! settings {
    ($(
        $key:ident: $first:ident $(. $rest:ident)*, env $env:ident
            $(, flag $flag:literal => $flag_field:ident)?;
    )*) => {
        /// Every setting; see [`SETTINGS`] for its names.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(super) enum Key {
            $($key),*
        }

        /// Every setting, in the order of [`Key`].
        pub(super) const SETTINGS: &[Setting] = &[$(
            Setting {
                key: Key::$key,
                toml: concat!(stringify!($first) $(, ".", stringify!($rest))*),
                env: env_vars::$env,
                flag: settings!(@flag $($flag => $flag_field)?),
                file: |raw| raw.$first $(.$rest)*.as_ref().map(AsText::as_text),
            }
        ),*];
    };
    (@flag) => { None };
    (@flag $flag:literal => $field:ident) => {
        Some(Flag {
            name: $flag,
            value: |flags| flags.$field.as_ref().map(AsText::as_text),
        })
    };
}

settings! {
    StateDir: state_dir, env STATE_DIR, flag "--state-dir" => state_dir;
    LogDir: log_dir, env LOG_DIR, flag "--log-dir" => log_dir;
    RunnerUser: runner.user, env RUNNER_USER, flag "--runner-user" => runner_user;
    StopGrace: runner.stop_grace, env RUNNER_STOP_GRACE;
    InitialBackoff: runner.initial_backoff, env RUNNER_INITIAL_BACKOFF;
    MaxLogBytes: runner.max_log_bytes, env RUNNER_MAX_LOG_BYTES;
    MaxJobs: runner.max_jobs, env RUNNER_MAX_JOBS;
    MaxJobsPerOwner: runner.max_jobs_per_owner, env RUNNER_MAX_JOBS_PER_OWNER;
    MaxQueued: runner.max_queued, env RUNNER_MAX_QUEUED;
    MaxOutputBytes: runner.max_output_bytes, env RUNNER_MAX_OUTPUT_BYTES;
    DelegateCgroup: runner.delegate_cgroup, env RUNNER_DELEGATE_CGROUP;
    JobPath: runner.job_path, env RUNNER_JOB_PATH;
    MaxKeptBytes: runner.max_kept_bytes, env RUNNER_MAX_KEPT_BYTES;
    Sandbox: runner.sandbox, env RUNNER_SANDBOX;
    SandboxShared: runner.sandbox_shared, env RUNNER_SANDBOX_SHARED;
    SandboxTmpSize: runner.sandbox_tmp_size, env RUNNER_SANDBOX_TMP_SIZE;
    SandboxAllowSyscalls: runner.sandbox_allow_syscalls, env RUNNER_SANDBOX_ALLOW_SYSCALLS;
    Network: runner.network, env RUNNER_NETWORK;
    HubUrl: hub.url, env HUB_URL, flag "--hub" => hub;
    AgentId: hub.agent_id, env HUB_AGENT_ID, flag "--agent-id" => agent_id;
    TokenFile: hub.token_file, env HUB_TOKEN_FILE, flag "--token-file" => token_file;
    EnrolToken: hub.enrol_token_file, env HUB_ENROL_TOKEN_FILE, flag "--enrol-token" => enrol_token;
    CaFile: hub.ca_file, env HUB_CA_FILE, flag "--ca-file" => ca_file;
    LogMaxFiles: log.max_files, env LOG_MAX_FILES;
    TrustedKeys: upgrade.trusted_keys, env UPGRADE_TRUSTED_KEYS, flag "--trusted-key" => trusted_keys;
    Settle: upgrade.settle, env UPGRADE_SETTLE;
    Deadline: upgrade.deadline, env UPGRADE_DEADLINE;
    HubWait: upgrade.hub_wait, env UPGRADE_HUB_WAIT;
    DrainDeadline: upgrade.drain_deadline, env UPGRADE_DRAIN_DEADLINE;
    Labels: agent.labels, env AGENT_LABELS, flag "--label" => labels;
    MetricsListen: metrics.listen, env METRICS_LISTEN;
    MetricsAllowRemote: metrics.allow_remote, env METRICS_ALLOW_REMOTE;
}

impl Key {
    pub(super) fn setting(self) -> &'static Setting {
        let setting = &SETTINGS[self as usize];
        debug_assert_eq!(setting.key, self, "SETTINGS is in the order of Key");
        setting
    }
}

/// Where a value came from: named in errors.
#[derive(Debug, Clone)]
pub(super) enum Origin {
    File(PathBuf, Key),
    Env(Key),
    Flag(&'static str),
}

impl Origin {
    pub(super) fn describe(&self) -> String {
        match self {
            Origin::File(path, key) => format!("{}: key {}", path.display(), key.setting().toml),
            Origin::Env(key) => format!("environment variable {}", key.setting().env),
            Origin::Flag(flag) => format!("flag {flag}"),
        }
    }

    /// Relative paths in a file are relative to the file; elsewhere to the current dir.
    pub(super) fn base_dir(&self) -> Option<PathBuf> {
        match self {
            Origin::File(path, _) => path.parent().map(Path::to_path_buf),
            _ => std::env::current_dir().ok(),
        }
    }
}

/// The sources of one load, in precedence order.
pub(super) struct Sources<'a> {
    pub(super) file: Option<(PathBuf, RawConfig)>,
    pub(super) env: &'a dyn Fn(&str) -> Option<String>,
    pub(super) flags: &'a Flags,
}

impl Sources<'_> {
    /// The winning value of `key` as text: flag, then environment (unless empty), then file.
    pub(super) fn get(&self, key: Key) -> Option<(String, Origin)> {
        let setting = key.setting();
        if let Some(flag) = &setting.flag {
            if let Some(v) = (flag.value)(self.flags) {
                return Some((v, Origin::Flag(flag.name)));
            }
        }
        if let Some(v) = (self.env)(setting.env).filter(|v| !v.is_empty()) {
            return Some((v, Origin::Env(key)));
        }
        let (path, raw) = self.file.as_ref()?;
        let v = (setting.file)(raw)?;
        Some((v, Origin::File(path.clone(), key)))
    }

    pub(super) fn path(&self, key: Key) -> Option<PathBuf> {
        self.path_from(key).map(|(p, _)| p)
    }

    pub(super) fn path_from(&self, key: Key) -> Option<(PathBuf, Origin)> {
        let (v, origin) = self.get(key)?;
        let p = PathBuf::from(v);
        let p = match origin.base_dir() {
            Some(base) if p.is_relative() => base.join(p),
            _ => p,
        };
        // Drops `.` components; `..` stays (resolving it would need the file system).
        Some((std::path::absolute(&p).unwrap_or(p), origin))
    }

    pub(super) fn duration(&self, key: Key, default: Duration) -> Result<Duration, ConfigError> {
        let d = self.duration_or_zero(key, default)?;
        match self.get(key) {
            Some((_, origin)) if d.is_zero() => {
                Err(invalid(&origin, "must be greater than zero".into()))
            }
            _ => Ok(d),
        }
    }

    /// A duration that may be zero (`0`: the thing it bounds is skipped).
    pub(super) fn duration_or_zero(
        &self,
        key: Key,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        let Some((v, origin)) = self.get(key) else {
            return Ok(default);
        };
        humantime::parse_duration(&v).map_err(|e| {
            invalid(
                &origin,
                format!("invalid duration {v:?} ({e}); use forms like 250ms, 2s, 1m"),
            )
        })
    }

    /// A number that, when set, must be at least 1.
    pub(super) fn positive(&self, key: Key) -> Result<Option<usize>, ConfigError> {
        let n: Option<usize> = self.optional(key, "a whole number of at least 1")?;
        match (n, self.get(key)) {
            (Some(0), Some((_, origin))) => Err(invalid(&origin, "must be at least 1".into())),
            _ => Ok(n),
        }
    }

    pub(super) fn optional<T: std::str::FromStr>(
        &self,
        key: Key,
        what: &str,
    ) -> Result<Option<T>, ConfigError> {
        let Some((v, origin)) = self.get(key) else {
            return Ok(None);
        };
        v.trim()
            .parse()
            .map(Some)
            .map_err(|_| invalid(&origin, format!("invalid value {v:?}; expected {what}")))
    }

    pub(super) fn number<T: std::str::FromStr>(
        &self,
        key: Key,
        default: T,
        what: &str,
    ) -> Result<T, ConfigError> {
        let Some((v, origin)) = self.get(key) else {
            return Ok(default);
        };
        v.trim()
            .parse()
            .map_err(|_| invalid(&origin, format!("invalid value {v:?}; expected {what}")))
    }
}

impl AsText for HubUrls {
    fn as_text(&self) -> String {
        match self {
            HubUrls::One(u) => u.clone(),
            HubUrls::Many(v) => v.join(","),
        }
    }
}

/// An invalid value, named by where it came from.
pub(super) fn invalid(origin: &Origin, message: String) -> ConfigError {
    ConfigError::Invalid {
        origin: origin.describe(),
        message,
    }
}
