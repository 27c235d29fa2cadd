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

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod effective;
mod error;
pub mod raw;
mod settings;
mod sources;
#[cfg(test)]
mod tests;

pub use self::error::ConfigError;
pub use self::raw::{Flags, RawConfig};
pub use self::settings::{
    AgentConfig, HubSettings, MetricsSettings, RunnerSettings, SandboxSettings, UpgradeSettings,
};
use self::sources::{invalid, Key, Origin, Sources};
use crate::env_vars;
use crate::proto::labels::{self, Labels};

use crate::supervisor::account::Account;
use crate::supervisor::{self, DEFAULT_MAX_LOG_BYTES, DEFAULT_STOP_GRACE, MIN_LOG_BYTES};

/// Config file of a root agent.
pub const ROOT_CONFIG: &str = "/etc/railgrid/agent.toml";
/// State directory of a root agent.
pub const ROOT_STATE_DIR: &str = "/var/lib/railgrid";
/// Log directory of a root agent.
pub const ROOT_LOG_DIR: &str = "/var/log/railgrid";
/// Daily agent log files kept.
pub const DEFAULT_LOG_MAX_FILES: usize = 7;

pub const DEFAULT_SETTLE: Duration = Duration::from_secs(30);
/// How long running jobs have to finish before an upgrade's switch (docs/design.md,
/// "Upgrades never kill a job that can finish").
pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(3600);
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(120);
pub const DEFAULT_HUB_WAIT: Duration = Duration::from_secs(3600);
/// The deadline must leave room for the settle period, a runner start and a hub round
/// trip.
const MIN_DEADLINE_OVER_SETTLE: Duration = Duration::from_secs(5);

/// Longest runner stop grace accepted. It is the runner's whole stop budget, and the
/// service manager's own stop timeout (TimeoutStopSec, ExitTimeOut) must cover it plus the
/// agent's reap (see `agent::SERVICE_STOP_TIMEOUT`); a reload waits for it too.
pub const MAX_STOP_GRACE: Duration = Duration::from_secs(60);

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

/// The config file used when none is named: `/etc/railgrid/agent.toml` for root, else
/// `$XDG_CONFIG_HOME/railgrid/agent.toml` (or `~/.config/...`).
pub fn default_config_path(root: bool, env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
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

/// The `[runner] sandbox*` settings: a known mode, absolute shared directories, and a
/// list of names (the runner checks the directories as its own account, and the names
/// against its deny list).
fn sandbox_settings(src: &Sources<'_>) -> Result<SandboxSettings, ConfigError> {
    let list = |key: Key| -> Vec<String> {
        src.get(key)
            .map(|(text, _)| {
                text.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mode = match src.get(Key::Sandbox) {
        Some((m, _)) if ["auto", "required", "off"].contains(&m.as_str()) => Some(m),
        Some((m, origin)) => {
            return Err(invalid(
                &origin,
                format!("{m:?}: give auto, required or off"),
            ))
        }
        None => None,
    };
    let network = match src.get(Key::Network) {
        Some((n, origin)) => match n.parse::<crate::proto::job::Network>() {
            Ok(_) => Some(n),
            Err(why) => return Err(invalid(&origin, why)),
        },
        None => None,
    };
    let mut shared = Vec::new();
    if let Some((_, origin)) = src.get(Key::SandboxShared) {
        for dir in list(Key::SandboxShared) {
            if !Path::new(&dir).is_absolute() {
                return Err(invalid(
                    &origin,
                    format!("{dir:?}: give absolute directories"),
                ));
            }
            shared.push(PathBuf::from(dir));
        }
    }
    Ok(SandboxSettings {
        mode,
        shared,
        tmp_size: src.optional(Key::SandboxTmpSize, "a number of bytes")?,
        allow_syscalls: list(Key::SandboxAllowSyscalls),
        network,
    })
}

/// Loads the configuration for the process's own environment.
pub fn load(flags: &Flags) -> Result<AgentConfig, ConfigError> {
    load_with(flags, crate::sys::is_root(), &|k| std::env::var(k).ok())
}

/// Loads the configuration from `flags`, the file they (or the defaults) name, and `env`.
pub fn load_with(
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
pub fn check_text(path: &Path, text: &str) -> Result<(), ConfigError> {
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
        sandbox: sandbox_settings(&src)?,
    };

    let hub = hub_settings(&src, host, &state_dir)?;
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
    let drain_deadline = src.duration_or_zero(Key::DrainDeadline, DEFAULT_DRAIN_DEADLINE)?;
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
        labels: host_labels(&src)?,
        log_max_files: log_max_files.max(1),
        upgrade: UpgradeSettings {
            trusted_keys,
            settle,
            deadline,
            hub_wait,
            drain_deadline,
        },
        metrics: metrics_settings(&src)?,
    })
}

/// `[metrics]`: off unless `listen` is set; an address other than loopback (a network
/// could read the host's jobs and versions) only with `allow_remote = true`.
fn metrics_settings(src: &Sources<'_>) -> Result<Option<MetricsSettings>, ConfigError> {
    let allow_remote = src
        .optional::<bool>(Key::MetricsAllowRemote, "true or false")?
        .unwrap_or(false);
    let Some((text, origin)) = src.get(Key::MetricsListen) else {
        return Ok(None);
    };
    let listen: std::net::SocketAddr = text.trim().parse().map_err(|_| {
        invalid(
            &origin,
            format!("invalid value {text:?}; expected an address and port such as 127.0.0.1:9469"),
        )
    })?;
    if !listen.ip().is_loopback() && !allow_remote {
        return Err(invalid(
            &origin,
            format!("{listen} is not a loopback address: the agent's metrics name its jobs and versions; set metrics.allow_remote = true to serve them there"),
        ));
    }
    Ok(Some(MetricsSettings {
        listen,
        allow_remote,
    }))
}

/// The hub settings, when a hub is named; `host`: check the token and CA files too.
/// With an enrolment token and no token file, the token the agent is given goes to
/// `<state_dir>/hub.token`.
fn hub_settings(
    src: &Sources<'_>,
    host: bool,
    state_dir: &Path,
) -> Result<Option<HubSettings>, ConfigError> {
    let enrol = src.path_from(Key::EnrolToken);
    let token = src.path_from(Key::TokenFile);
    if let (None, Some((_, origin))) = (src.get(Key::HubUrl), &enrol) {
        return Err(invalid(
            origin,
            "an enrolment token without a hub URL: set hub.url (or --hub)".into(),
        ));
    }
    let token = match (token, &enrol) {
        (Some(t), _) => Some(t),
        (None, Some((_, origin))) => Some((state_dir.join(ENROLLED_TOKEN_FILE), origin.clone())),
        (None, None) => None,
    };
    Ok(match (src.get(Key::HubUrl), token) {
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
                        "a hub needs a token file: set hub.token_file (or --token-file), or an enrolment token (hub.enrol_token_file, --enrol-token)".into(),
                    ));
            };
            let enrol_token_file = enrol.as_ref().map(|(p, _)| p.clone());
            // With an enrolment token, the agent's own token file may not exist yet:
            // it is made at the first contact.
            let enrolling = enrol_token_file.is_some() && !token_file.exists();
            if host && !enrolling {
                check_secret_file(&token_file).map_err(|m| invalid(&token_origin, m))?;
            }
            if let (true, Some((path, origin))) = (host && enrolling, &enrol) {
                check_secret_file(path).map_err(|m| invalid(origin, m))?;
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
                enrol_token_file,
                ca_file,
            })
        }
        (None, Some((_, origin))) => {
            return Err(invalid(
                &origin,
                "a token file without a hub URL: set hub.url (or --hub)".into(),
            ));
        }
    })
}

/// The labels the host declares (`agent.labels`): checked, and none of the automatic
/// ones, which the agent sets itself.
fn host_labels(src: &Sources<'_>) -> Result<Labels, ConfigError> {
    let Some((text, origin)) = src.get(Key::Labels) else {
        return Ok(Labels::new());
    };
    let labels = labels::parse_list(&text).map_err(|e| invalid(&origin, e.to_string()))?;
    labels::check(&labels, true).map_err(|e| invalid(&origin, e.to_string()))?;
    Ok(labels)
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
pub fn check_agent_id(id: &str) -> Result<String, String> {
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
/// Where an agent that enrolled itself keeps its own token, in its state dir.
pub const ENROLLED_TOKEN_FILE: &str = "hub.token";

fn check_secret_file(path: &Path) -> Result<(), String> {
    let file = crate::small_file::SmallFile::open(path)
        .map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
    match crate::small_file::private(file.meta()) {
        Ok(()) => {}
        Err(crate::small_file::Exposed::Owner(uid)) => {
            let (euid, _) = crate::sys::current_ids();
            return Err(format!(
                "token file {} is owned by uid {uid}, not by the agent (uid {euid}) or root: another account could read or replace it",
                path.display()
            ));
        }
        Err(crate::small_file::Exposed::Mode(mode)) => {
            return Err(format!(
                "token file {} is readable by group or others (mode {mode:04o}, owner uid {}): run chmod 600 {}",
                path.display(),
                file.meta().uid(),
                path.display()
            ));
        }
    }
    Ok(())
}
