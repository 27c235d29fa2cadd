//! The agent's configuration: a TOML file, overridden by `RAILGRID_*` environment variables,
//! overridden by flags; then validated into [`AgentConfig`].
//!
//! Every value remembers where it came from, so an error names the file and key, the
//! variable or the flag that holds the bad value, and says what is accepted.
//!
//! Each setting is declared once, in the `settings!` list: its TOML key (which is also its
//! path in [`RawConfig`]), its variable (a constant of [`env_vars`]) and its flag. The
//! lookup in every source, the precedence and the origin named in errors all come from
//! that list; `load_with` only parses and checks the winning text.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::env_vars;

use crate::supervisor::account::Account;
use crate::supervisor::{self, DEFAULT_MAX_LOG_BYTES, DEFAULT_STOP_GRACE, MIN_LOG_BYTES};

/// Config file of a root agent.
pub(crate) const ROOT_CONFIG: &str = "/etc/railgrid/agent.toml";
/// State directory of a root agent.
pub(crate) const ROOT_STATE_DIR: &str = "/var/lib/railgrid";
/// Log directory of a root agent.
pub(crate) const ROOT_LOG_DIR: &str = "/var/log/railgrid";
/// Daily agent log files kept.
pub(crate) const DEFAULT_LOG_MAX_FILES: usize = 7;

/// The file as written. Unknown keys are errors: a typo must not silently mean "default".
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub(crate) state_dir: Option<PathBuf>,
    pub(crate) log_dir: Option<PathBuf>,
    #[serde(default)]
    pub(crate) runner: RawRunner,
    #[serde(default)]
    pub(crate) hub: RawHub,
    #[serde(default)]
    pub(crate) log: RawLog,
    #[serde(default)]
    pub(crate) upgrade: RawUpgrade,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpgrade {
    /// minisign public key lines (`RW…`).
    pub(crate) trusted_keys: Option<Vec<String>>,
    pub(crate) settle: Option<String>,
    pub(crate) deadline: Option<String>,
    pub(crate) hub_wait: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRunner {
    pub(crate) user: Option<String>,
    pub(crate) stop_grace: Option<String>,
    pub(crate) initial_backoff: Option<String>,
    pub(crate) max_log_bytes: Option<u64>,
    pub(crate) max_jobs: Option<usize>,
    pub(crate) max_jobs_per_owner: Option<usize>,
    pub(crate) max_queued: Option<usize>,
    pub(crate) max_output_bytes: Option<u64>,
    pub(crate) delegate_cgroup: Option<bool>,
    pub(crate) job_path: Option<String>,
    pub(crate) max_kept_bytes: Option<u64>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHub {
    /// One URL, or several: replicas of one hub, tried in turn.
    pub(crate) url: Option<HubUrls>,
    pub(crate) agent_id: Option<String>,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLog {
    pub(crate) max_files: Option<usize>,
}

/// `hub.url`: a string, or a list of replicas' URLs.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum HubUrls {
    One(String),
    Many(Vec<String>),
}

impl AsText for HubUrls {
    fn as_text(&self) -> String {
        match self {
            HubUrls::One(u) => u.clone(),
            HubUrls::Many(v) => v.join(","),
        }
    }
}

/// Values given on the command line.
#[derive(Debug, Default, Clone)]
pub(crate) struct Flags {
    pub(crate) config: Option<PathBuf>,
    pub(crate) state_dir: Option<PathBuf>,
    pub(crate) log_dir: Option<PathBuf>,
    pub(crate) runner_user: Option<String>,
    /// `--hub`, repeated; `None` when not given.
    pub(crate) hub: Option<Vec<String>>,
    pub(crate) agent_id: Option<String>,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) ca_file: Option<PathBuf>,
    /// `--trusted-key`, repeated; `None` when not given.
    pub(crate) trusted_keys: Option<Vec<String>>,
}

/// The settings of the runner child; a change to any of them restarts it on reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunnerSettings {
    /// `None`: run the runner as the agent's own (non-root) account.
    pub(crate) user: Option<Account>,
    pub(crate) stop_grace: Duration,
    pub(crate) initial_backoff: Duration,
    pub(crate) max_log_bytes: u64,
    /// Job engine limits passed to the runner; `None` keeps the runner's defaults.
    pub(crate) max_jobs: Option<usize>,
    pub(crate) max_jobs_per_owner: Option<usize>,
    pub(crate) max_queued: Option<usize>,
    pub(crate) max_output_bytes: Option<u64>,
    /// Give the runner a cgroup of its own, delegated to its account, so that jobs get the
    /// cgroup tier (Linux). `true`: the agent runs in a cgroup delegated to it (a systemd
    /// unit with `Delegate=yes`). Unset: only where a root agent runs in the root cgroup
    /// (no service manager), in a subtree it makes. `false`: never.
    pub(crate) delegate_cgroup: Option<bool>,
    /// PATH of every job (a job's own `PATH` still wins); `None` keeps the baseline.
    pub(crate) job_path: Option<String>,
    /// Bytes finished jobs keep on disk (spools and workspaces); `None`: the runner's
    /// default.
    pub(crate) max_kept_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HubSettings {
    /// `https://host[:port]`, without a trailing slash: one, or the replicas of one hub
    /// (same token, same CA), tried in this order and in turn on failure.
    pub(crate) urls: Vec<String>,
    /// This agent's name at the hub (the `{id}` of its reconcile URL).
    pub(crate) agent_id: String,
    pub(crate) token_file: PathBuf,
    pub(crate) ca_file: Option<PathBuf>,
}

/// How the agent upgrades itself (docs/design.md, invariant 13).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UpgradeSettings {
    /// minisign public key lines; a release must be signed by one of them. Empty: every
    /// upgrade from the hub is refused.
    pub(crate) trusted_keys: Vec<String>,
    /// How long the new agent's runner must stay healthy before the upgrade commits.
    pub(crate) settle: Duration,
    /// How long after the switch the upgrade may take to commit before the watcher rolls
    /// it back.
    pub(crate) deadline: Duration,
    /// How much longer than `deadline` a new agent that is healthy on its host may wait
    /// for a hub it cannot reach, before the watcher rolls it back, blaming nothing.
    pub(crate) hub_wait: Duration,
}

pub(crate) const DEFAULT_SETTLE: Duration = Duration::from_secs(30);
pub(crate) const DEFAULT_DEADLINE: Duration = Duration::from_secs(120);
pub(crate) const DEFAULT_HUB_WAIT: Duration = Duration::from_secs(3600);
/// The deadline must leave room for the settle period, a runner start and a hub round
/// trip.
const MIN_DEADLINE_OVER_SETTLE: Duration = Duration::from_secs(5);

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentConfig {
    /// The file that was read, if any.
    pub(crate) config_path: Option<PathBuf>,
    pub(crate) state_dir: PathBuf,
    pub(crate) log_dir: PathBuf,
    pub(crate) runner: RunnerSettings,
    pub(crate) hub: Option<HubSettings>,
    pub(crate) log_max_files: usize,
    pub(crate) upgrade: UpgradeSettings,
}

#[derive(Debug, Error)]
pub(crate) enum ConfigError {
    #[error("could not read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
    #[error("running as root needs an account for the runner: set runner.user (e.g. --runner-user nobody)")]
    NoRunnerUser,
    #[error("no default state directory: set state_dir, XDG_STATE_HOME or HOME")]
    NoHome,
    #[error(
        "the host name cannot be the hub agent id ({message}): set hub.agent_id (or --agent-id)"
    )]
    NoAgentId { message: String },
}

/// A setting's value as text, the form every source gives it in: flags and files are
/// turned into it so that one parser (and one error message) serves all three sources.
trait AsText {
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

/// A list, as its variable gives it: comma-separated.
impl AsText for Vec<String> {
    fn as_text(&self) -> String {
        self.join(",")
    }
}

/// One setting, named once for every source: its key in the file, its environment
/// variable (from [`env_vars`]) and its flag, if it has one.
#[derive(Debug)]
struct Setting {
    key: Key,
    /// Dotted TOML key, `runner.max_jobs`.
    toml: &'static str,
    /// Environment variable, `RAILGRID_RUNNER_MAX_JOBS`.
    env: &'static str,
    flag: Option<Flag>,
    /// The value in the file, as text.
    file: fn(&RawConfig) -> Option<String>,
}

#[derive(Debug)]
struct Flag {
    /// `--runner-user`.
    name: &'static str,
    /// The value on the command line, as text.
    value: fn(&Flags) -> Option<String>,
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
        enum Key {
            $($key),*
        }

        /// Every setting, in the order of [`Key`].
        const SETTINGS: &[Setting] = &[$(
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
    HubUrl: hub.url, env HUB_URL, flag "--hub" => hub;
    AgentId: hub.agent_id, env HUB_AGENT_ID, flag "--agent-id" => agent_id;
    TokenFile: hub.token_file, env HUB_TOKEN_FILE, flag "--token-file" => token_file;
    CaFile: hub.ca_file, env HUB_CA_FILE, flag "--ca-file" => ca_file;
    LogMaxFiles: log.max_files, env LOG_MAX_FILES;
    TrustedKeys: upgrade.trusted_keys, env UPGRADE_TRUSTED_KEYS, flag "--trusted-key" => trusted_keys;
    Settle: upgrade.settle, env UPGRADE_SETTLE;
    Deadline: upgrade.deadline, env UPGRADE_DEADLINE;
    HubWait: upgrade.hub_wait, env UPGRADE_HUB_WAIT;
}

impl Key {
    fn setting(self) -> &'static Setting {
        let setting = &SETTINGS[self as usize];
        debug_assert_eq!(setting.key, self, "SETTINGS is in the order of Key");
        setting
    }
}

/// Where a value came from: named in errors.
#[derive(Debug, Clone)]
enum Origin {
    File(PathBuf, Key),
    Env(Key),
    Flag(&'static str),
}

impl Origin {
    fn describe(&self) -> String {
        match self {
            Origin::File(path, key) => format!("{}: key {}", path.display(), key.setting().toml),
            Origin::Env(key) => format!("environment variable {}", key.setting().env),
            Origin::Flag(flag) => format!("flag {flag}"),
        }
    }

    /// Relative paths in a file are relative to the file; elsewhere to the current dir.
    fn base_dir(&self) -> Option<PathBuf> {
        match self {
            Origin::File(path, _) => path.parent().map(Path::to_path_buf),
            _ => std::env::current_dir().ok(),
        }
    }
}

/// The sources of one load, in precedence order.
struct Sources<'a> {
    file: Option<(PathBuf, RawConfig)>,
    env: &'a dyn Fn(&str) -> Option<String>,
    flags: &'a Flags,
}

impl Sources<'_> {
    /// The winning value of `key` as text: flag, then environment (unless empty), then file.
    fn get(&self, key: Key) -> Option<(String, Origin)> {
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

    fn path(&self, key: Key) -> Option<PathBuf> {
        self.path_from(key).map(|(p, _)| p)
    }

    fn path_from(&self, key: Key) -> Option<(PathBuf, Origin)> {
        let (v, origin) = self.get(key)?;
        let p = PathBuf::from(v);
        let p = match origin.base_dir() {
            Some(base) if p.is_relative() => base.join(p),
            _ => p,
        };
        // Drops `.` components; `..` stays (resolving it would need the file system).
        Some((std::path::absolute(&p).unwrap_or(p), origin))
    }

    fn duration(&self, key: Key, default: Duration) -> Result<Duration, ConfigError> {
        let Some((v, origin)) = self.get(key) else {
            return Ok(default);
        };
        let d = humantime::parse_duration(&v).map_err(|e| {
            invalid(
                &origin,
                format!("invalid duration {v:?} ({e}); use forms like 250ms, 2s, 1m"),
            )
        })?;
        if d.is_zero() {
            return Err(invalid(&origin, "must be greater than zero".into()));
        }
        Ok(d)
    }

    /// A number that, when set, must be at least 1.
    fn positive(&self, key: Key) -> Result<Option<usize>, ConfigError> {
        let n: Option<usize> = self.optional(key, "a whole number of at least 1")?;
        match (n, self.get(key)) {
            (Some(0), Some((_, origin))) => Err(invalid(&origin, "must be at least 1".into())),
            _ => Ok(n),
        }
    }

    fn optional<T: std::str::FromStr>(
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

    fn number<T: std::str::FromStr>(
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

/// Longest runner stop grace accepted. It is the runner's whole stop budget, and the
/// service manager's own stop timeout (TimeoutStopSec, ExitTimeOut) must cover it plus the
/// agent's reap (see `agent::SERVICE_STOP_TIMEOUT`); a reload waits for it too.
pub(crate) const MAX_STOP_GRACE: Duration = Duration::from_secs(60);

fn bounded(
    src: &Sources<'_>,
    key: Key,
    default: Duration,
    max: Duration,
) -> Result<Duration, ConfigError> {
    let d = src.duration(key, default)?;
    match src.get(key) {
        Some((_, origin)) if d > max => Err(invalid(
            &origin,
            format!(
                "{} is longer than the {} allowed; the service manager's stop timeout must exceed it",
                humantime::format_duration(d),
                humantime::format_duration(max)
            ),
        )),
        _ => Ok(d),
    }
}

fn invalid(origin: &Origin, message: String) -> ConfigError {
    ConfigError::Invalid {
        origin: origin.describe(),
        message,
    }
}

/// The config file used when none is named: `/etc/railgrid/agent.toml` for root, else
/// `$XDG_CONFIG_HOME/railgrid/agent.toml` (or `~/.config/...`).
pub(crate) fn default_config_path(
    root: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<PathBuf> {
    if root {
        return Some(PathBuf::from(ROOT_CONFIG));
    }
    let base = env(env_vars::XDG_CONFIG_HOME)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            env(env_vars::HOME)
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".config"))
        })?;
    Some(base.join("railgrid").join("agent.toml"))
}

/// State (and log) directory of a non-root agent: `$XDG_STATE_HOME/railgrid` or
/// `~/.local/state/railgrid`.
fn default_user_dir(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let base = env(env_vars::XDG_STATE_HOME)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            env(env_vars::HOME)
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local/state"))
        })?;
    Some(base.join("railgrid"))
}

/// Loads the configuration for the process's own environment.
pub(crate) fn load(flags: &Flags) -> Result<AgentConfig, ConfigError> {
    load_with(flags, crate::sys::is_root(), &|k| std::env::var(k).ok())
}

/// Loads the configuration from `flags`, the file they (or the defaults) name, and `env`.
pub(crate) fn load_with(
    flags: &Flags,
    root: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<AgentConfig, ConfigError> {
    let explicit = flags.config.clone().or_else(|| {
        env(env_vars::CONFIG)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    let file = match explicit {
        Some(path) => Some((path.clone(), read_file(&path)?)),
        None => match default_config_path(root, env) {
            Some(path) if path.exists() => Some((path.clone(), read_file(&path)?)),
            _ => None,
        },
    };
    resolve(flags, root, env, file, true)
}

/// Checks `text`, the would-be config file at `path` of a root agent, as the agent will
/// load it, less what depends on the host: the runner's account (it may not exist yet)
/// and the token file (it may not be written yet). `agent install` checks what it writes.
pub(crate) fn check_text(path: &Path, text: &str) -> Result<(), ConfigError> {
    let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string().trim().replace('\n', " "),
    })?;
    resolve(
        &Flags::default(),
        true,
        &|_| None,
        Some((path.to_owned(), raw)),
        false,
    )
    .map(drop)
}

/// The configuration from `flags`, `file` and `env`; `host`: look up the runner's
/// account and check the token file too.
fn resolve(
    flags: &Flags,
    root: bool,
    env: &dyn Fn(&str) -> Option<String>,
    file: Option<(PathBuf, RawConfig)>,
    host: bool,
) -> Result<AgentConfig, ConfigError> {
    let src = Sources { file, env, flags };

    let user_dir = || default_user_dir(env).ok_or(ConfigError::NoHome);
    let chosen_state_dir = src.path(Key::StateDir);
    // An agent given its own state directory keeps its logs there too, unless told
    // otherwise: a trial run in /var/tmp does not write to /var/log.
    let log_dir = match (src.path(Key::LogDir), &chosen_state_dir) {
        (Some(p), _) => p,
        (None, Some(state)) => state.clone(),
        (None, None) if root => PathBuf::from(ROOT_LOG_DIR),
        (None, None) => user_dir()?,
    };
    let state_dir = match chosen_state_dir {
        Some(p) => p,
        None if root => PathBuf::from(ROOT_STATE_DIR),
        None => user_dir()?,
    };

    let user = match src.get(Key::RunnerUser) {
        // Not looked up: the account may not exist yet (install creates it after).
        Some(_) if !host => None,
        Some((name, origin)) => {
            let acct = Account::by_name(&name).map_err(|e| invalid(&origin, e.to_string()))?;
            if acct.uid == 0 {
                return Err(invalid(
                    &origin,
                    format!("user {name} is uid 0; the runner must never run as root"),
                ));
            }
            let (own_uid, _) = crate::sys::current_ids();
            if !root && acct.uid != own_uid {
                return Err(invalid(&origin, format!("only a root agent can run the runner as another user ({name}); drop the setting to run it as yourself")));
            }
            (acct.uid != own_uid).then_some(acct)
        }
        None if root => return Err(ConfigError::NoRunnerUser),
        None => None,
    };
    let max_log_bytes = src.number(Key::MaxLogBytes, DEFAULT_MAX_LOG_BYTES, "a number of bytes")?;
    if let (true, Some((_, origin))) = (max_log_bytes < MIN_LOG_BYTES, src.get(Key::MaxLogBytes)) {
        return Err(invalid(
            &origin,
            format!("must be at least {MIN_LOG_BYTES}"),
        ));
    }
    let runner = RunnerSettings {
        user,
        stop_grace: bounded(&src, Key::StopGrace, DEFAULT_STOP_GRACE, MAX_STOP_GRACE)?,
        initial_backoff: src.duration(Key::InitialBackoff, supervisor::DEFAULT_INITIAL_BACKOFF)?,
        max_log_bytes,
        max_jobs: src.positive(Key::MaxJobs)?,
        max_jobs_per_owner: src.positive(Key::MaxJobsPerOwner)?,
        max_queued: src.optional(Key::MaxQueued, "a whole number of jobs")?,
        max_output_bytes: src.optional(Key::MaxOutputBytes, "a number of bytes")?,
        delegate_cgroup: src.optional(Key::DelegateCgroup, "true or false")?,
        max_kept_bytes: src.optional(Key::MaxKeptBytes, "a number of bytes")?,
        job_path: match src.get(Key::JobPath) {
            Some((path, origin)) => {
                Some(crate::env_policy::check_search_path(&path).map_err(|m| invalid(&origin, m))?)
            }
            None => None,
        },
    };

    let hub = match (src.get(Key::HubUrl), src.path_from(Key::TokenFile)) {
        (None, None) => None,
        (Some((text, origin)), token) => {
            let mut urls: Vec<String> = Vec::new();
            for url in text.split(',').map(str::trim).filter(|u| !u.is_empty()) {
                if !url.starts_with("https://") {
                    return Err(invalid(
                        &origin,
                        format!("hub URL {url:?} must start with https://"),
                    ));
                }
                let url = url.trim_end_matches('/').to_owned();
                if !urls.contains(&url) {
                    urls.push(url);
                }
            }
            if urls.is_empty() {
                return Err(invalid(&origin, "no hub URL given".into()));
            }
            let Some((token_file, token_origin)) = token else {
                return Err(invalid(
                    &origin,
                    "a hub needs a token file: set hub.token_file (or --token-file)".into(),
                ));
            };
            if host {
                check_secret_file(&token_file).map_err(|m| invalid(&token_origin, m))?;
            }
            let agent_id = match src.get(Key::AgentId) {
                Some((id, origin)) => check_agent_id(&id).map_err(|m| invalid(&origin, m))?,
                None => default_agent_id()?,
            };
            let ca_file = src.path(Key::CaFile);
            if let (true, Some(ca), Some((_, origin))) = (host, &ca_file, src.get(Key::CaFile)) {
                // Read now: a CA file that cannot serve is a configuration error (exit
                // 2) before a runner starts, not a retry loop later.
                crate::hub_client::read_ca(ca)
                    .map_err(|e| invalid(&origin, crate::error_chain(&e)))?;
            }
            Some(HubSettings {
                urls,
                agent_id,
                token_file,
                ca_file,
            })
        }
        (None, Some((_, origin))) => {
            return Err(invalid(
                &origin,
                "a token file without a hub URL: set hub.url (or --hub)".into(),
            ));
        }
    };
    if let (None, Some((_, origin))) = (&hub, src.get(Key::AgentId)) {
        return Err(invalid(
            &origin,
            "an agent id without a hub URL: set hub.url (or --hub)".into(),
        ));
    }
    let log_max_files = src.number(
        Key::LogMaxFiles,
        DEFAULT_LOG_MAX_FILES,
        "a whole number of files",
    )?;

    let trusted_keys = match src.get(Key::TrustedKeys) {
        Some((text, origin)) => {
            let keys: Vec<String> = text
                .split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(str::to_owned)
                .collect();
            for k in &keys {
                crate::release::public_key(k, Path::new(k)).map_err(|_| {
                    invalid(
                        &origin,
                        format!(
                            "{k:?} is not a minisign public key line (the RW… line of a .pub file)"
                        ),
                    )
                })?;
            }
            keys
        }
        None => Vec::new(),
    };
    let settle = src.duration(Key::Settle, DEFAULT_SETTLE)?;
    let deadline = src.duration(Key::Deadline, DEFAULT_DEADLINE)?;
    let hub_wait = src.duration(Key::HubWait, DEFAULT_HUB_WAIT)?;
    if deadline < settle + MIN_DEADLINE_OVER_SETTLE {
        let origin = src
            .get(Key::Deadline)
            .or_else(|| src.get(Key::Settle))
            .map(|(_, o)| o)
            .unwrap_or(Origin::Env(Key::Deadline));
        return Err(invalid(
            &origin,
            format!(
                "upgrade.deadline ({}) must exceed upgrade.settle ({}) by at least {}",
                humantime::format_duration(deadline),
                humantime::format_duration(settle),
                humantime::format_duration(MIN_DEADLINE_OVER_SETTLE)
            ),
        ));
    }

    Ok(AgentConfig {
        config_path: src.file.as_ref().map(|(p, _)| p.clone()),
        state_dir,
        log_dir,
        runner,
        hub,
        log_max_files: log_max_files.max(1),
        upgrade: UpgradeSettings {
            trusted_keys,
            settle,
            deadline,
            hub_wait,
        },
    })
}

fn read_file(path: &Path) -> Result<RawConfig, ConfigError> {
    let text =
        crate::small_file::read_string(path, crate::small_file::CONFIG_MAX).map_err(|source| {
            ConfigError::Read {
                path: path.to_owned(),
                source,
            }
        })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string().trim().replace('\n', " "),
    })
}

/// Longest agent id, as the hub accepts it.
const MAX_AGENT_ID: usize = 128;

/// An agent id is one segment of the reconcile URL and a name operators type: letters,
/// digits, `.`, `_` and `-`, not starting with `.` or `-`.
pub(crate) fn check_agent_id(id: &str) -> Result<String, String> {
    let ok = !id.is_empty()
        && id.len() <= MAX_AGENT_ID
        && !id.starts_with(['.', '-'])
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(id.to_owned())
    } else {
        Err(format!("invalid agent id {id:?}: use 1 to {MAX_AGENT_ID} letters, digits, '.', '_' or '-', not starting with '.' or '-'"))
    }
}

/// The host name, as the agent id when none is set.
fn default_agent_id() -> Result<String, ConfigError> {
    let host = crate::sys::hostname().unwrap_or_default();
    check_agent_id(&host).map_err(|message| ConfigError::NoAgentId { message })
}

/// A file holding a secret must be a regular file readable by its owner only.
fn check_secret_file(path: &Path) -> Result<(), String> {
    let file = crate::small_file::SmallFile::open(path)
        .map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
    let meta = file.meta();
    let (euid, _) = crate::sys::current_ids();
    if meta.uid() != euid && meta.uid() != 0 {
        return Err(format!(
            "token file {} is owned by uid {}, not by the agent (uid {euid}) or root: another account could read or replace it",
            path.display(),
            meta.uid()
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "token file {} is readable by group or others (mode {mode:04o}, owner uid {}): run chmod 600 {}",
            path.display(),
            meta.uid(),
            path.display()
        ));
    }
    Ok(())
}

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

    /// The runner's own state directory, `<state>/runner`.
    pub(crate) fn runner_dir(&self) -> PathBuf {
        self.state_dir.join("runner")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::fs;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn write(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("agent.toml");
        fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn flags_beat_environment_beat_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "state_dir = \"from-file\"\nlog_dir = \"/logs\"\n[runner]\nstop_grace = \"3s\"\n",
        );
        let flags = Flags {
            config: Some(path.clone()),
            ..Flags::default()
        };
        let env = env_of(&[
            ("RAILGRID_LOG_DIR", "/env-logs"),
            ("RAILGRID_RUNNER_STOP_GRACE", "4s"),
        ]);
        let c = load_with(&flags, false, &env).unwrap();
        assert_eq!(
            c.state_dir,
            dir.path().join("from-file"),
            "relative to the file"
        );
        assert_eq!(c.log_dir, PathBuf::from("/env-logs"));
        assert_eq!(c.runner.stop_grace, Duration::from_secs(4));
        let flags = Flags {
            log_dir: Some("/flag-logs".into()),
            ..flags
        };
        assert_eq!(
            load_with(&flags, false, &env).unwrap().log_dir,
            PathBuf::from("/flag-logs")
        );
    }

    #[test]
    fn errors_name_the_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "[runner]\nstop_grace = \"soon\"\n");
        let flags = Flags {
            config: Some(path.clone()),
            ..Flags::default()
        };
        let err = load_with(&flags, false, &env_of(&[("HOME", "/h")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&path.display().to_string())
                && err.contains("runner.stop_grace")
                && err.contains("250ms"),
            "{err}"
        );

        let path = write(dir.path(), "[runner]\nuser = \"nobody\"\nbogus = 1\n");
        let err = load_with(&flags, false, &env_of(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("bogus") && err.contains(&path.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn job_limits_pass_through_and_zero_is_refused() {
        let env = env_of(&[("HOME", "/h"), ("RAILGRID_RUNNER_MAX_JOBS", "3")]);
        let c = load_with(&Flags::default(), false, &env).unwrap();
        assert_eq!((c.runner.max_jobs, c.runner.max_queued), (Some(3), None));
        let env = env_of(&[("HOME", "/h"), ("RAILGRID_RUNNER_MAX_JOBS", "0")]);
        let err = load_with(&Flags::default(), false, &env)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("RAILGRID_RUNNER_MAX_JOBS") && err.contains("at least 1"),
            "{err}"
        );
    }

    #[test]
    fn stop_grace_is_bounded() {
        let env = env_of(&[("HOME", "/h"), ("RAILGRID_RUNNER_STOP_GRACE", "1h")]);
        let err = load_with(&Flags::default(), false, &env)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("RAILGRID_RUNNER_STOP_GRACE") && err.contains("1m"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "[runner]\nstop_grace = \"61s\"\n");
        let flags = Flags {
            config: Some(path.clone()),
            ..Flags::default()
        };
        let err = load_with(&flags, false, &env_of(&[("HOME", "/h")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("runner.stop_grace") && err.contains(&path.display().to_string()),
            "{err}"
        );
        let env = env_of(&[("HOME", "/h"), ("RAILGRID_RUNNER_STOP_GRACE", "1m")]);
        let c = load_with(&Flags::default(), false, &env).unwrap();
        assert_eq!(c.runner.stop_grace, MAX_STOP_GRACE);
    }

    #[test]
    fn root_needs_a_runner_user() {
        let err = load_with(
            &Flags::default(),
            true,
            &env_of(&[("RAILGRID_CONFIG", "/nonexistent/agent.toml")]),
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }), "{err}");
        let flags = Flags {
            state_dir: Some("/s".into()),
            ..Flags::default()
        };
        // With no file at the root default path this machine may or may not have one; name an empty one.
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "");
        let flags = Flags {
            config: Some(path),
            ..flags
        };
        let err = load_with(&flags, true, &env_of(&[])).unwrap_err();
        assert!(matches!(err, ConfigError::NoRunnerUser));
        assert!(err.to_string().contains("--runner-user nobody"));
    }

    #[test]
    fn a_token_file_open_to_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        fs::write(&token, "secret").unwrap();
        fs::set_permissions(&token, fs::Permissions::from_mode(0o640)).unwrap();
        let flags = Flags {
            state_dir: Some(dir.path().into()),
            log_dir: Some(dir.path().into()),
            hub: Some(vec!["https://hub.example".into()]),
            token_file: Some(token.clone()),
            config: Some(write(dir.path(), "")),
            ..Flags::default()
        };
        let err = load_with(&flags, false, &env_of(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--token-file") && err.contains("chmod 600"),
            "{err}"
        );
        fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load_with(&flags, false, &env_of(&[]))
            .unwrap()
            .hub
            .is_some());
    }

    #[test]
    fn the_replicas_of_a_hub_come_as_a_list_from_every_source() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        fs::write(&token, "secret").unwrap();
        fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
        let file = write(
            dir.path(),
            "[hub]\nurl = [\"https://a:8443/\", \"https://b:8443\", \"https://a:8443\"]\nagent_id = \"x\"\n",
        );
        let flags = Flags {
            config: Some(file),
            token_file: Some(token),
            ..Flags::default()
        };
        let env = env_of(&[("HOME", "/h")]);
        let hub = load_with(&flags, false, &env).unwrap().hub.unwrap();
        assert_eq!(
            hub.urls,
            ["https://a:8443", "https://b:8443"],
            "in order, once each"
        );
        let env = env_of(&[("HOME", "/h"), ("RAILGRID_HUB_URL", "https://c, https://d")]);
        let hub = load_with(&flags, false, &env).unwrap().hub.unwrap();
        assert_eq!(
            hub.urls,
            ["https://c", "https://d"],
            "the environment over the file"
        );
        let with_flags = Flags {
            hub: Some(vec!["https://e".into(), "https://f".into()]),
            ..flags.clone()
        };
        let hub = load_with(&with_flags, false, &env).unwrap().hub.unwrap();
        assert_eq!(
            hub.urls,
            ["https://e", "https://f"],
            "flags over everything"
        );
        let bad = Flags {
            hub: Some(vec!["https://e".into(), "http://plain".into()]),
            ..flags
        };
        let err = load_with(&bad, false, &env).unwrap_err().to_string();
        assert!(
            err.contains("http://plain") && err.contains("https://"),
            "{err}"
        );
    }

    #[test]
    fn the_agent_id_defaults_to_the_host_name_and_must_fit_a_url() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        fs::write(&token, "secret").unwrap();
        fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
        let flags = Flags {
            config: Some(write(dir.path(), "[hub]\nurl = \"https://hub.example/\"\n")),
            token_file: Some(token),
            ..Flags::default()
        };
        let env = env_of(&[("HOME", "/h")]);
        let hub = load_with(&flags, false, &env).unwrap().hub.unwrap();
        assert_eq!(hub.urls, ["https://hub.example"], "no trailing slash");
        if let Some(host) = crate::sys::hostname().filter(|h| check_agent_id(h).is_ok()) {
            assert_eq!(hub.agent_id, host);
        }
        let env = env_of(&[("HOME", "/h"), ("RAILGRID_HUB_AGENT_ID", "from-env")]);
        let hub = load_with(&flags, false, &env).unwrap().hub.unwrap();
        assert_eq!(hub.agent_id, "from-env");
        let with_flag = Flags {
            agent_id: Some("build-17.example".into()),
            ..flags.clone()
        };
        let hub = load_with(&with_flag, false, &env).unwrap().hub.unwrap();
        assert_eq!(hub.agent_id, "build-17.example");

        for bad in ["a/b", "../x", "", "-x", "a b", "é"] {
            let flags = Flags {
                agent_id: Some(bad.into()),
                ..flags.clone()
            };
            let err = load_with(&flags, false, &env).unwrap_err().to_string();
            assert!(
                err.contains("--agent-id") && err.contains("invalid agent id"),
                "{bad:?}: {err}"
            );
        }
        let no_hub = Flags {
            agent_id: Some("a1".into()),
            ..Flags::default()
        };
        let err = load_with(&no_hub, false, &env_of(&[("HOME", "/h")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("without a hub URL"), "{err}");
    }

    #[test]
    fn non_root_defaults_follow_xdg() {
        let env = env_of(&[("XDG_STATE_HOME", "/x/state"), ("HOME", "/home/u")]);
        let c = load_with(&Flags::default(), false, &env).unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/x/state/railgrid"));
        assert_eq!(c.log_dir, PathBuf::from("/x/state/railgrid"));
        assert_eq!(
            default_config_path(false, &env),
            Some(PathBuf::from("/home/u/.config/railgrid/agent.toml"))
        );
    }

    #[test]
    fn the_shipped_example_parses() {
        let text = include_str!("../../packaging/agent.toml.example");
        let raw: RawConfig = toml::from_str(text).unwrap();
        assert_eq!(raw.runner.user.as_deref(), Some("nobody"));
    }

    /// The shipped example with its commented-out keys (`# max_jobs = 4`, `# [hub]`) put in.
    fn example_with_every_key() -> String {
        let text = include_str!("../../packaging/agent.toml.example");
        text.lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest)
                    if rest.starts_with('[')
                        || rest.split_once(" = ").is_some_and(|(k, _)| {
                            k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                        }) =>
                {
                    rest
                }
                _ => line,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The dotted keys of a TOML document's values.
    fn toml_keys(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
        for (k, v) in table {
            let key = format!("{prefix}{k}");
            match v {
                toml::Value::Table(t) => toml_keys(t, &format!("{key}."), out),
                _ => out.push(key),
            }
        }
    }

    #[test]
    fn the_shipped_example_shows_every_setting() {
        let text = example_with_every_key();
        let raw: RawConfig = toml::from_str(&text).unwrap();
        for s in SETTINGS {
            assert!(
                (s.file)(&raw).is_some(),
                "{} not read from the file",
                s.toml
            );
        }
        let mut keys = Vec::new();
        toml_keys(&toml::from_str(&text).unwrap(), "", &mut keys);
        keys.sort();
        let mut expected: Vec<String> = SETTINGS.iter().map(|s| s.toml.to_owned()).collect();
        expected.sort();
        assert_eq!(keys, expected);
    }

    #[test]
    fn every_setting_is_named_once_in_each_source() {
        let distinct = |names: Vec<&str>| {
            let mut sorted = names.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), names.len(), "a name is used twice: {names:?}");
        };
        distinct(SETTINGS.iter().map(|s| s.toml).collect());
        distinct(SETTINGS.iter().map(|s| s.env).collect());
        distinct(
            SETTINGS
                .iter()
                .filter_map(|s| s.flag.as_ref().map(|f| f.name))
                .collect(),
        );
        for (i, s) in SETTINGS.iter().enumerate() {
            assert_eq!(s.key as usize, i, "{}", s.toml);
            assert_eq!(s.key.setting().toml, s.toml);
        }

        // Every variable is a constant of env_vars.rs, and every agent-setting constant
        // there is a setting.
        let consts: Vec<&str> = include_str!("../env_vars.rs")
            .lines()
            .filter_map(|l| {
                l.strip_prefix("pub(crate) const ")
                    .or_else(|| l.strip_prefix("pub const "))?
                    .split_once(": &str = \"")
            })
            .filter_map(|(_, value)| value.strip_suffix("\";"))
            .collect();
        for s in SETTINGS {
            assert!(consts.contains(&s.env), "{} is not in env_vars.rs", s.env);
        }
        // The hub's own variables are `railgrid hub`'s, not the agent's.
        let not_settings = [
            env_vars::CONFIG,
            env_vars::LOG,
            env_vars::JOB_ID,
            env_vars::HUB_DATA_DIR,
            env_vars::HUB_ADMIN_URL,
            env_vars::HUB_ADMIN_TOKEN_FILE,
            env_vars::HUB_ADMIN_CA_FILE,
        ];
        for c in consts.iter().filter(|c| c.starts_with("RAILGRID_")) {
            assert!(
                not_settings.contains(c) || SETTINGS.iter().any(|s| s.env == *c),
                "{c} is in env_vars.rs but is no setting"
            );
        }
    }

    #[test]
    fn every_setting_takes_flag_then_environment_then_file() {
        let raw: RawConfig = toml::from_str(&example_with_every_key()).unwrap();
        let file = Some((PathBuf::from("/etc/agent.toml"), raw));
        let all_flags = Flags {
            config: None,
            state_dir: Some("/flag".into()),
            log_dir: Some("/flag".into()),
            runner_user: Some("flag".into()),
            hub: Some(vec!["flag".into()]),
            agent_id: Some("flag".into()),
            token_file: Some("/flag".into()),
            ca_file: Some("/flag".into()),
            trusted_keys: Some(vec!["flag".into()]),
        };
        let no_flags = Flags::default();
        let env = |k: &str| k.starts_with("RAILGRID_").then(|| "env".to_owned());
        let empty_env = |k: &str| k.starts_with("RAILGRID_").then(String::new);
        let both = Sources {
            file: file.clone(),
            env: &env,
            flags: &all_flags,
        };
        let env_file = Sources {
            file: file.clone(),
            env: &env,
            flags: &no_flags,
        };
        let file_only = Sources {
            file,
            env: &empty_env,
            flags: &no_flags,
        };
        let none = Sources {
            file: None,
            env: &empty_env,
            flags: &no_flags,
        };
        for s in SETTINGS {
            let (v, origin) = both.get(s.key).unwrap();
            match &s.flag {
                Some(flag) => {
                    assert!(v.contains("flag"), "{}: {v}", s.toml);
                    assert_eq!(origin.describe(), format!("flag {}", flag.name));
                }
                None => assert_eq!(v, "env", "{}", s.toml),
            }
            let (v, origin) = env_file.get(s.key).unwrap();
            assert_eq!(v, "env", "{}", s.toml);
            assert_eq!(origin.describe(), format!("environment variable {}", s.env));
            let (_, origin) = file_only.get(s.key).unwrap();
            assert_eq!(
                origin.describe(),
                format!("/etc/agent.toml: key {}", s.toml)
            );
            assert!(none.get(s.key).is_none(), "{}", s.toml);
        }
    }

    /// Each row of the table in docs/operations.md names a setting by its variable and flag.
    #[test]
    fn the_documented_settings_match() {
        let docs = include_str!("../../docs/operations.md");
        let table = docs
            .split_once("| key | variable | flag | default |")
            .unwrap()
            .1
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with('|'));
        let mut rows = 0;
        for row in table {
            let cells: Vec<&str> = row.split('|').map(|c| c.trim().trim_matches('`')).collect();
            let (key, var, flag) = (cells[1], cells[2], cells[3]);
            let s = SETTINGS
                .iter()
                .find(|s| s.toml == key)
                .unwrap_or_else(|| panic!("documented {key} is no setting"));
            assert_eq!(var, s.env, "{key}");
            assert_eq!(flag, s.flag.as_ref().map_or("", |f| f.name), "{key}");
            rows += 1;
        }
        assert_eq!(rows, SETTINGS.len(), "every setting has its row");
    }

    /// `check-config` prints every setting under its file key.
    #[test]
    fn the_effective_configuration_names_every_setting() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        fs::write(&token, "secret").unwrap();
        fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
        // A CA file is read when the configuration is loaded: a real one.
        let ca = dir.path().join("ca.pem");
        let cert = rcgen::generate_simple_self_signed(vec!["hub.example".into()]).unwrap();
        fs::write(&ca, cert.cert.pem()).unwrap();
        let flags = Flags {
            config: Some(write(dir.path(), "")),
            hub: Some(vec!["https://hub.example".into()]),
            token_file: Some(token),
            ca_file: Some(ca),
            ..Flags::default()
        };
        let env = env_of(&[
            ("HOME", "/h"),
            ("RAILGRID_RUNNER_MAX_JOBS", "2"),
            ("RAILGRID_RUNNER_MAX_JOBS_PER_OWNER", "2"),
            ("RAILGRID_RUNNER_MAX_QUEUED", "2"),
            ("RAILGRID_RUNNER_MAX_OUTPUT_BYTES", "2"),
        ]);
        let c = load_with(&flags, false, &env).unwrap();
        let text = toml::to_string(&c.effective()).unwrap();
        let mut keys = Vec::new();
        toml_keys(&toml::from_str(&text).unwrap(), "", &mut keys);
        keys.retain(|k| k != "config_file" && k != "hub.token");
        keys.sort();
        let mut expected: Vec<String> = SETTINGS.iter().map(|s| s.toml.to_owned()).collect();
        expected.sort();
        assert_eq!(keys, expected);
    }
}
