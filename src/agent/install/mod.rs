//! `railgrid agent install | uninstall`: the host's agent service in one command, safe to
//! run again.
//!
//! Both commands first look at the host without touching it and make a [`Plan`]: every
//! directory, file, account and service-manager command, each marked create, update, keep
//! or remove, with the reason. `--dry-run` prints the plan (and the files it would write);
//! otherwise it is applied step by step, each printed as it is done, so a failure shows
//! exactly what was and was not done. Running install again plans only the differences:
//! an installed host plans nothing but `keep`.

mod account;
mod config_file;
mod manager;
mod manifest;
pub(crate) mod templates;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

use self::config_file::Wanted;
use self::manager::{Cmd, Manager};
use self::manifest::Manifest;
use crate::agent::config::{RawConfig, ROOT_CONFIG, ROOT_LOG_DIR, ROOT_STATE_DIR};
use crate::sys::exe::{ExeError, PinnedExe};

/// The directory of the config, token and CA.
const CONFIG_DIR: &str = "/etc/railgrid";
/// Where install keeps the hub token and the hub's CA.
pub(crate) const TOKEN_FILE: &str = "/etc/railgrid/token";
pub(crate) const CA_FILE: &str = "/etc/railgrid/hub-ca.pem";
/// Largest token or CA file accepted.
const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// The runner's account when none is named: macOS names system accounts with `_`.
pub(crate) fn default_runner_user() -> &'static str {
    if cfg!(target_os = "macos") {
        "_railgrid"
    } else {
        "railgrid"
    }
}

#[derive(Debug, Error)]
pub(crate) enum InstallError {
    #[error("railgrid agent {command} must run as root (it writes {CONFIG_DIR} and the service's file): run it with sudo, or give --root DIR to write an image")]
    NotRoot { command: &'static str },
    #[error("{manager} is not running on this host ({why}): give --root / to write the files without starting anything, or run `railgrid agent run` under your own supervisor")]
    NoServiceManager { manager: &'static str, why: String },
    #[error("{path} exists but is not a railgrid agent config ({message}): move it away or fix it; nothing was changed")]
    ForeignConfig { path: PathBuf, message: String },
    #[error("the runner's account {name:?} is root (uid 0): the runner never runs as root; give --runner-user with another account")]
    RootRunner { name: String },
    #[error("{0}")]
    Invalid(String),
    #[error("{path} is not an install manifest of railgrid ({message}): move it away to uninstall by the defaults")]
    BadManifest { path: PathBuf, message: String },
    #[error("an agent (pid {pid}) still holds {dir}: stop it first (systemctl stop railgrid-agent), then purge")]
    AgentRunning { pid: i32, dir: PathBuf },
    #[error("could not read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not remove {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not run {command}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error(transparent)]
    Exe(#[from] ExeError),
}

impl InstallError {
    /// A refusal before anything was done (exit 2), as opposed to a failure midway.
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::NotRoot { .. }
                | Self::NoServiceManager { .. }
                | Self::ForeignConfig { .. }
                | Self::RootRunner { .. }
                | Self::Invalid(_)
                | Self::BadManifest { .. }
                | Self::AgentRunning { .. }
        )
    }
}

/// `agent install`'s flags.
#[derive(Debug, Clone, Default)]
pub(crate) struct InstallOptions {
    pub(crate) hub: Option<String>,
    pub(crate) agent_id: Option<String>,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) ca_file: Option<PathBuf>,
    pub(crate) trusted_keys: Vec<String>,
    pub(crate) runner_user: Option<String>,
    pub(crate) prefix: PathBuf,
    pub(crate) root: Option<PathBuf>,
    pub(crate) dry_run: bool,
    pub(crate) no_start: bool,
}

/// `agent uninstall`'s flags (the confirmation of `--purge` is the command line's).
#[derive(Debug, Clone, Default)]
pub(crate) struct UninstallOptions {
    pub(crate) purge: bool,
    pub(crate) root: Option<PathBuf>,
    pub(crate) dry_run: bool,
}

/// What a step does to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    Create,
    Update,
    Keep,
    Run,
    Remove,
    Skip,
}

impl Verb {
    fn word(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Update => "update",
            Self::Keep => "keep",
            Self::Run => "run",
            Self::Remove => "remove",
            Self::Skip => "skip",
        }
    }
}

enum Action {
    None,
    Dir {
        path: PathBuf,
        mode: u32,
    },
    File {
        path: PathBuf,
        mode: u32,
        bytes: Vec<u8>,
        secret: bool,
    },
    Binary {
        path: PathBuf,
        exe: Arc<PinnedExe>,
    },
    Account {
        commands: Vec<Vec<String>>,
    },
    Command(Cmd),
    RemoveFile {
        path: PathBuf,
    },
    /// Only when empty: a directory an install created, which may hold other files now.
    RemoveEmptyDir {
        path: PathBuf,
    },
    RemoveTree {
        path: PathBuf,
    },
}

/// One line of the plan.
pub(crate) struct Step {
    pub(crate) verb: Verb,
    /// The path, account or command.
    pub(crate) subject: String,
    /// Why, or what changes.
    pub(crate) detail: String,
    action: Action,
}

impl Step {
    fn new(
        verb: Verb,
        subject: impl Into<String>,
        detail: impl Into<String>,
        action: Action,
    ) -> Self {
        Self {
            verb,
            subject: subject.into(),
            detail: detail.into(),
            action,
        }
    }

    /// Removes a directory with everything in it (`--purge`).
    pub(crate) fn removes_tree(&self) -> bool {
        matches!(self.action, Action::RemoveTree { .. })
    }

    /// `  create  /etc/railgrid/agent.toml (0600): runner.user = "railgrid"`.
    pub(crate) fn line(&self) -> String {
        let mut line = format!("  {:<7} {}", self.verb.word(), self.subject);
        if !self.detail.is_empty() {
            let _ = write!(line, ": {}", self.detail);
        }
        line
    }
}

/// Everything one command does, in order.
pub(crate) struct Plan {
    pub(crate) title: String,
    pub(crate) steps: Vec<Step>,
    /// Said after the steps (what the plan leaves to the operator).
    pub(crate) notes: Vec<String>,
}

impl Plan {
    /// True when applying it would change nothing.
    pub(crate) fn is_noop(&self) -> bool {
        self.steps
            .iter()
            .all(|s| matches!(s.verb, Verb::Keep | Verb::Skip))
    }

    /// The files the plan writes, as `--dry-run` shows them (secrets not shown).
    pub(crate) fn files(&self) -> String {
        let mut out = String::new();
        for step in &self.steps {
            if let Action::File {
                path,
                mode,
                bytes,
                secret,
            } = &step.action
            {
                let _ = writeln!(out, "--- {} (mode {mode:04o})", path.display());
                if *secret {
                    let _ = writeln!(out, "(a secret of {} bytes, not shown)", bytes.len());
                } else {
                    out.push_str(&String::from_utf8_lossy(bytes));
                    if !bytes.ends_with(b"\n") {
                        out.push('\n');
                    }
                }
            }
        }
        out
    }

    /// Applies every step in order, calling `done` after each; stops at the first failure.
    pub(crate) fn apply(&self, mut done: impl FnMut(&Step)) -> Result<(), InstallError> {
        for step in &self.steps {
            apply_step(&step.action)?;
            done(step);
        }
        Ok(())
    }
}

fn apply_step(action: &Action) -> Result<(), InstallError> {
    use std::os::unix::fs::DirBuilderExt;
    match action {
        Action::None => Ok(()),
        Action::Dir { path, mode } => std::fs::DirBuilder::new()
            .mode(*mode)
            .create(path)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists if path.is_dir() => Ok(()),
                _ => Err(e),
            })
            .map_err(|source| InstallError::Write {
                path: path.clone(),
                source,
            }),
        Action::File {
            path, mode, bytes, ..
        } => crate::util::write_atomic(path, bytes, *mode).map_err(|source| InstallError::Write {
            path: path.clone(),
            source,
        }),
        Action::Binary { path, exe } => {
            // Read through the pinned descriptor: the bytes installed are the bytes
            // running, whatever the path it was started from names now.
            let mut bytes = Vec::with_capacity(exe.identity().size as usize);
            exe.reader()
                .and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut bytes))
                .map_err(|source| InstallError::Read {
                    path: exe.path().to_owned(),
                    source,
                })?;
            crate::util::write_atomic(path, &bytes, 0o755).map_err(|source| InstallError::Write {
                path: path.clone(),
                source,
            })
        }
        Action::Account { commands } => account::create(commands),
        Action::Command(cmd) => match run_command(&cmd.argv) {
            Err(InstallError::Command { .. }) if cmd.may_fail => Ok(()),
            other => other,
        },
        Action::RemoveFile { path } => match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(InstallError::Remove {
                path: path.clone(),
                source: e,
            }),
            _ => Ok(()),
        },
        Action::RemoveEmptyDir { path } => match std::fs::remove_dir(path) {
            // Not empty any more (or gone): it stays, as said in the plan.
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.kind() == std::io::ErrorKind::DirectoryNotEmpty =>
            {
                Ok(())
            }
            Err(e) => Err(InstallError::Remove {
                path: path.clone(),
                source: e,
            }),
            Ok(()) => Ok(()),
        },
        Action::RemoveTree { path } => match std::fs::remove_dir_all(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(InstallError::Remove {
                path: path.clone(),
                source: e,
            }),
            _ => Ok(()),
        },
    }
}

/// Runs a command to completion; a failure carries its stderr.
pub(crate) fn run_command(argv: &[String]) -> Result<(), InstallError> {
    let out = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| InstallError::Spawn {
            command: argv.join(" "),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(InstallError::Command {
        command: argv.join(" "),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

/// Host paths, seen through `--root`.
struct Root(Option<PathBuf>);

impl Root {
    fn at(&self, host: impl AsRef<Path>) -> PathBuf {
        let host = host.as_ref();
        match &self.0 {
            Some(root) => root.join(host.strip_prefix("/").unwrap_or(host)),
            None => host.to_owned(),
        }
    }

    fn on_host(&self) -> bool {
        self.0.is_none()
    }

    /// The ancestors of `host` (itself included) that do not exist yet, parents first.
    fn missing_dirs(&self, host: &Path) -> Vec<PathBuf> {
        let mut missing: Vec<PathBuf> = host
            .ancestors()
            .filter(|a| a.parent().is_some())
            .take_while(|a| !self.at(a).exists())
            .map(Path::to_owned)
            .collect();
        missing.reverse();
        missing
    }
}

fn check_privileges(command: &'static str, root: &Root, dry_run: bool) -> Result<(), InstallError> {
    if root.on_host() && !dry_run && !crate::sys::is_root() {
        return Err(InstallError::NotRoot { command });
    }
    Ok(())
}

/// Reads a small file given on the command line (a token, a CA).
fn read_small(path: &Path, what: &str) -> Result<Vec<u8>, InstallError> {
    let meta = std::fs::metadata(path).map_err(|source| InstallError::Read {
        path: path.to_owned(),
        source,
    })?;
    if !meta.is_file() || meta.len() > MAX_SECRET_BYTES {
        return Err(InstallError::Invalid(format!(
            "{what} {}: not a regular file of at most {MAX_SECRET_BYTES} bytes",
            path.display()
        )));
    }
    std::fs::read(path).map_err(|source| InstallError::Read {
        path: path.to_owned(),
        source,
    })
}

fn check_flags(o: &InstallOptions) -> Result<(), InstallError> {
    if let Some(url) = &o.hub {
        if !url.starts_with("https://") || url.len() <= "https://".len() {
            return Err(InstallError::Invalid(format!(
                "--hub {url:?}: the hub URL must start with https://"
            )));
        }
    }
    if let Some(id) = &o.agent_id {
        crate::agent::config::check_agent_id(id)
            .map_err(|m| InstallError::Invalid(format!("--agent-id: {m}")))?;
    }
    for key in &o.trusted_keys {
        crate::release::public_key(key, Path::new(key)).map_err(|_| {
            InstallError::Invalid(format!(
                "--trusted-key {key:?} is not a minisign public key line (the RW… line of a .pub file)"
            ))
        })?;
    }
    Ok(())
}

/// A file step: create, update or keep `path` with `bytes`.
fn file_step(path: PathBuf, mode: u32, bytes: Vec<u8>, secret: bool, what: &str) -> Step {
    use std::os::unix::fs::PermissionsExt;
    let subject = format!("{} (mode {mode:04o})", path.display());
    let current = std::fs::read(&path).ok();
    let current_mode = std::fs::metadata(&path)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777);
    let (verb, detail) = match (current, current_mode) {
        (None, _) => (Verb::Create, what.to_owned()),
        (Some(old), Some(m)) if old == bytes && m == mode => (Verb::Keep, "unchanged".to_owned()),
        (Some(old), Some(m)) if old == bytes => {
            (Verb::Update, format!("mode {m:04o} to {mode:04o}"))
        }
        (Some(_), _) => (Verb::Update, what.to_owned()),
    };
    let action = if verb == Verb::Keep {
        Action::None
    } else {
        Action::File {
            path,
            mode,
            bytes,
            secret,
        }
    };
    Step::new(verb, subject, detail, action)
}

/// Plans `agent install`.
pub(crate) fn plan_install(o: &InstallOptions) -> Result<Plan, InstallError> {
    let manager = Manager::host();
    let root = Root(o.root.clone());
    templates::check_prefix(&o.prefix).map_err(InstallError::Invalid)?;
    check_privileges("install", &root, o.dry_run)?;
    if root.on_host() {
        manager.check_running()?;
    }
    check_flags(o)?;

    let config_path = root.at(ROOT_CONFIG);
    let existing = config_file::read_existing(&config_path)?;
    let existing_raw: RawConfig = existing
        .as_deref()
        .map(|t| toml::from_str(t).expect("checked by read_existing"))
        .unwrap_or_default();
    let old_manifest = manifest::read(&root.at(manifest::PATH))?;
    let token = o
        .token_file
        .as_deref()
        .map(|f| read_small(f, "--token-file"))
        .transpose()?;
    if let Some(token) = &token {
        let text = String::from_utf8_lossy(token);
        if text.trim().is_empty() || text.trim().lines().count() != 1 {
            return Err(InstallError::Invalid(format!(
                "--token-file {}: the token must be one line",
                o.token_file.as_ref().expect("given").display()
            )));
        }
    }
    let ca = o
        .ca_file
        .as_deref()
        .map(|f| read_small(f, "--ca-file"))
        .transpose()?;
    if let Some(path) = &o.ca_file {
        // The agent's own client reads it: what it refuses at start is refused here.
        crate::hub_client::build(Some(path), std::time::Duration::from_secs(10)).map_err(|e| {
            InstallError::Invalid(format!(
                "--ca-file {}: {}",
                path.display(),
                crate::util::error_chain(&e)
            ))
        })?;
    }
    let runner_user = match (&o.runner_user, &existing_raw.runner.user) {
        (Some(name), _) => Some(name.clone()),
        (None, Some(_)) => None,
        (None, None) => Some(default_runner_user().to_owned()),
    };
    let wanted = Wanted {
        runner_user,
        hub_url: o.hub.clone(),
        agent_id: o.agent_id.clone(),
        token_file: token.as_ref().map(|_| PathBuf::from(TOKEN_FILE)),
        ca_file: ca.as_ref().map(|_| PathBuf::from(CA_FILE)),
        trusted_keys: (!o.trusted_keys.is_empty()).then(|| o.trusted_keys.clone()),
    };
    let converged =
        config_file::converge(existing.as_deref(), &wanted, manager == Manager::Systemd)?;
    let user = converged
        .runner_user
        .clone()
        .unwrap_or_else(|| default_runner_user().to_owned());
    let state_dir = existing_raw
        .state_dir
        .clone()
        .unwrap_or_else(|| ROOT_STATE_DIR.into());
    let account = account::plan(&user, o.root.as_deref(), &account::home(&state_dir))?;

    let mut steps = Vec::new();
    let mut created_dirs = old_manifest
        .as_ref()
        .map(|m| m.created_dirs.clone())
        .unwrap_or_default();
    let service_file = manager.service_file();
    let bin = templates::binary_path(&o.prefix);
    let mut dirs: Vec<(PathBuf, u32)> = vec![
        (o.prefix.join("bin"), 0o755),
        (CONFIG_DIR.into(), 0o700),
        (
            service_file.parent().expect("a directory").to_owned(),
            0o755,
        ),
    ];
    if manager == Manager::Launchd {
        // launchd opens the plist's stdout and stderr paths but creates no directory.
        dirs.push((ROOT_LOG_DIR.into(), 0o700));
    }
    for (dir, mode) in dirs {
        for missing in root.missing_dirs(&dir) {
            let mode = if missing == dir { mode } else { 0o755 };
            let path = root.at(&missing);
            if !steps
                .iter()
                .any(|s: &Step| matches!(&s.action, Action::Dir { path: p, .. } if *p == path))
            {
                steps.push(Step::new(
                    Verb::Create,
                    path.display().to_string(),
                    format!("directory, mode {mode:04o}"),
                    Action::Dir { path, mode },
                ));
            }
            if !created_dirs.contains(&missing) {
                created_dirs.push(missing);
            }
        }
    }

    let mut created_account = old_manifest
        .as_ref()
        .is_some_and(|m| m.created_account && m.runner_user.as_deref() == Some(user.as_str()));
    steps.push(match account {
        account::AccountPlan::Exists { uid } => Step::new(
            Verb::Keep,
            format!("account {user}"),
            format!("exists (uid {uid})"),
            Action::None,
        ),
        account::AccountPlan::Create { commands } => {
            created_account = true;
            let shown: Vec<String> = commands.iter().map(|c| c.join(" ")).collect();
            Step::new(
                Verb::Create,
                format!("account {user}"),
                shown.join("; "),
                Action::Account { commands },
            )
        }
        account::AccountPlan::Skip { reason } => {
            Step::new(Verb::Skip, format!("account {user}"), reason, Action::None)
        }
    });

    let exe = Arc::new(PinnedExe::current()?);
    let target = root.at(&bin);
    let this = format!(
        "railgrid {} (sha256 {}, {:.1} MiB)",
        crate::build_info::VERSION,
        &exe.identity().sha256[..16],
        exe.identity().size as f64 / (1024.0 * 1024.0)
    );
    let binary_changed;
    steps.push(match same_binary(&exe, &target) {
        Some(why) => {
            binary_changed = false;
            Step::new(Verb::Keep, target.display().to_string(), why, Action::None)
        }
        None => {
            binary_changed = true;
            let verb = if target.exists() {
                Verb::Update
            } else {
                Verb::Create
            };
            Step::new(
                verb,
                target.display().to_string(),
                this,
                Action::Binary {
                    path: target.clone(),
                    exe: exe.clone(),
                },
            )
        }
    });

    // What the running agent reads again on SIGHUP.
    let mut config_steps = Vec::new();
    if let Some(token) = token {
        config_steps.push(file_step(
            root.at(TOKEN_FILE),
            0o600,
            token,
            true,
            "the hub token",
        ));
    }
    if let Some(ca) = ca {
        config_steps.push(file_step(
            root.at(CA_FILE),
            0o644,
            ca,
            false,
            "the hub's CA",
        ));
    }
    let what = if converged.changes.is_empty() {
        "unchanged".to_owned()
    } else {
        converged.changes.join(", ")
    };
    config_steps.push(file_step(
        config_path,
        0o600,
        converged.text.into_bytes(),
        false,
        &what,
    ));
    let config_changed = config_steps.iter().any(|s| s.verb != Verb::Keep);
    steps.extend(config_steps);
    let unit_text = manager.render(&o.prefix);
    steps.push(file_step(
        root.at(&service_file),
        0o644,
        unit_text.into_bytes(),
        false,
        match manager {
            Manager::Systemd => "the unit",
            Manager::Launchd => "the daemon's plist",
        },
    ));
    let file_changed = steps.last().is_some_and(|s| s.verb != Verb::Keep);
    let new_manifest = Manifest {
        service: manager.name().to_owned(),
        prefix: o.prefix.clone(),
        created_dirs,
        runner_user: Some(user.clone()),
        created_account,
        installed_by: crate::build_info::VERSION.to_owned(),
    };
    let manifest_unchanged = old_manifest.as_ref().is_some_and(|m| {
        Manifest {
            installed_by: m.installed_by.clone(),
            ..new_manifest.clone()
        } == *m
    });
    if manifest_unchanged {
        steps.push(Step::new(
            Verb::Keep,
            root.at(manifest::PATH).display().to_string(),
            "unchanged",
            Action::None,
        ));
    } else {
        steps.push(file_step(
            root.at(manifest::PATH),
            0o600,
            new_manifest.to_bytes(),
            false,
            "what uninstall removes",
        ));
    }

    let mut notes = Vec::new();
    if root.on_host() {
        let now = manager.state();
        let commands = manager.install_commands(now, file_changed, config_changed, !o.no_start);
        let restarts = commands.iter().any(|c| {
            c.argv
                .iter()
                .any(|a| a == "restart" || a == "bootstrap" || a == "start")
        });
        for c in commands {
            steps.push(Step::new(
                Verb::Run,
                c.argv.join(" "),
                "",
                Action::Command(c),
            ));
        }
        if binary_changed && now.running && !restarts {
            notes.push("the running agent takes the new binary by itself within a second (lockstep, docs/upgrade.md)".into());
        }
        if o.no_start {
            notes.push("not started (--no-start): the service starts at the next boot".into());
        }
    } else {
        notes.push(format!(
            "nothing was started or enabled (--root): {} starts the agent from {} once the image boots",
            manager.name(),
            root.at(&service_file).display()
        ));
    }
    Ok(Plan {
        title: format!(
            "railgrid agent install: {}, prefix {}, runner account {user}",
            manager.name(),
            o.prefix.display()
        ),
        steps,
        notes,
    })
}

/// Why `target` needs no copy (it is the running file, or the same bytes), or `None`.
fn same_binary(exe: &PinnedExe, target: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(target).ok()?;
    let id = exe.identity();
    if meta.dev() == id.device && meta.ino() == id.inode {
        return Some("this is the running binary".into());
    }
    if meta.len() != id.size {
        return None;
    }
    let theirs = PinnedExe::open(target).ok()?;
    (theirs.identity().sha256 == id.sha256)
        .then(|| format!("already this build (sha256 {})", &id.sha256[..16]))
}

/// Plans `agent uninstall`.
pub(crate) fn plan_uninstall(o: &UninstallOptions) -> Result<Plan, InstallError> {
    let root = Root(o.root.clone());
    check_privileges("uninstall", &root, o.dry_run)?;
    let manager = Manager::host();
    if root.on_host() {
        manager.check_running()?;
    }
    let manifest_path = root.at(manifest::PATH);
    let manifest = manifest::read(&manifest_path)?;
    let service_file = manager.service_file();
    let prefix = match &manifest {
        Some(m) => m.prefix.clone(),
        // Installed by an older hand: the unit names the binary.
        None => std::fs::read_to_string(root.at(&service_file))
            .ok()
            .and_then(|u| templates::unit_binary(&u).map(PathBuf::from))
            .and_then(|b| b.parent()?.parent().map(Path::to_owned))
            .unwrap_or_else(|| templates::DEFAULT_PREFIX.into()),
    };
    let mut steps = Vec::new();
    let mut notes = Vec::new();
    let on_host = root.on_host();
    if on_host {
        for c in manager.stop_commands(manager.state()) {
            steps.push(Step::new(
                Verb::Run,
                c.argv.join(" "),
                "",
                Action::Command(c),
            ));
        }
    }
    let remove = |steps: &mut Vec<Step>, path: PathBuf, what: &str| {
        if path.symlink_metadata().is_ok() {
            steps.push(Step::new(
                Verb::Remove,
                path.display().to_string(),
                what,
                Action::RemoveFile { path },
            ));
        }
    };
    let unit_path = root.at(&service_file);
    let had_unit = unit_path.exists();
    remove(&mut steps, unit_path, "the service's file");
    if on_host && had_unit {
        for c in manager.forget_commands() {
            steps.push(Step::new(
                Verb::Run,
                c.argv.join(" "),
                "",
                Action::Command(c),
            ));
        }
    }
    let bin = root.at(templates::binary_path(&prefix));
    let prev = bin.with_file_name("railgrid.prev");
    remove(&mut steps, bin, "the binary");
    remove(
        &mut steps,
        prev,
        "the previous binary, kept by the self-upgrade",
    );

    // The directories of the config's own settings, when it names others.
    let raw: RawConfig = std::fs::read_to_string(root.at(ROOT_CONFIG))
        .ok()
        .and_then(|t| toml::from_str(&t).ok())
        .unwrap_or_default();
    if o.purge {
        let state = raw
            .state_dir
            .clone()
            .unwrap_or_else(|| ROOT_STATE_DIR.into());
        let log = raw.log_dir.clone().unwrap_or_else(|| ROOT_LOG_DIR.into());
        if let Some(pid) =
            crate::agent::instance::holders(&root.at(&state)).and_then(|h| h.first().copied())
        {
            return Err(InstallError::AgentRunning {
                pid,
                dir: root.at(&state),
            });
        }
        for (dir, what) in [
            (PathBuf::from(CONFIG_DIR), "config, token, CA and manifest"),
            (state, "state: job records and spooled output"),
            (log, "logs"),
        ] {
            let path = root.at(&dir);
            if !path.exists() {
                continue;
            }
            // A config may name any directory; only one named for railgrid is removed
            // whole, so that a typo cannot purge /srv.
            let ours = dir
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains("railgrid"));
            if ours {
                steps.push(Step::new(
                    Verb::Remove,
                    path.display().to_string(),
                    what,
                    Action::RemoveTree { path },
                ));
            } else {
                steps.push(Step::new(
                    Verb::Skip,
                    path.display().to_string(),
                    format!("{what}; not named for railgrid, so not removed: remove it by hand"),
                    Action::None,
                ));
            }
        }
    } else {
        remove(&mut steps, manifest_path, "the install's manifest");
        notes.push(format!(
            "kept {} (config and token), {} and {}: --purge removes them",
            root.at(CONFIG_DIR).display(),
            root.at(raw
                .state_dir
                .as_deref()
                .unwrap_or(Path::new(ROOT_STATE_DIR)))
                .display(),
            root.at(raw.log_dir.as_deref().unwrap_or(Path::new(ROOT_LOG_DIR)))
                .display()
        ));
    }
    if let Some(m) = &manifest {
        let mut dirs = m.created_dirs.clone();
        // Deepest first: a directory empties before its parent is tried.
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in &dirs {
            let path = root.at(dir);
            let purged = steps.iter().any(|s: &Step| matches!(&s.action, Action::RemoveTree { path: t } if path.starts_with(t)));
            if path.is_dir() && !purged && (o.purge || !dir.starts_with(CONFIG_DIR)) {
                steps.push(Step::new(
                    Verb::Remove,
                    path.display().to_string(),
                    "directory the install created, if empty",
                    Action::RemoveEmptyDir { path },
                ));
            }
        }
        if let (Some(user), true) = (&m.runner_user, m.created_account) {
            notes.push(format!(
                "kept the account {user}: files it owns may remain elsewhere; remove it with {}",
                if cfg!(target_os = "macos") {
                    format!("dscl . -delete /Users/{user} and /Groups/{user}")
                } else {
                    format!("userdel {user}")
                }
            ));
        }
    }
    if steps.is_empty() {
        notes.push("nothing of railgrid is installed here".into());
    }
    Ok(Plan {
        title: format!(
            "railgrid agent uninstall{}: {}, prefix {}",
            if o.purge { " --purge" } else { "" },
            manager.name(),
            prefix.display()
        ),
        steps,
        notes,
    })
}
