//! The plan of `agent install`: what differs between the host and what the flags ask.
//!
//! Everything that can be refused is refused here, before the first step: a plan that
//! is made applies without surprises other than the machine's own (a full disk).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::command::shell_words;
use super::config_file::{self, Wanted};
use super::manager::{Changes, Manager};
use super::manifest::{self, Manifest};
use super::plan::{Action, Plan, Step, Verb};
use super::root::Root;
use super::{
    account, default_runner_user, templates, InstallError, InstallOptions, CA_FILE, CONFIG_DIR,
    ENROL_TOKEN_FILE, MAX_SECRET_BYTES, TOKEN_FILE,
};
use crate::config::{RawConfig, ROOT_CONFIG, ROOT_LOG_DIR, ROOT_STATE_DIR};
use crate::file_error::FileError;
use crate::proto::labels::{self, Labels};
use crate::sys::exe::PinnedExe;

/// Reads a small file named by `flag` (a token, a CA), the one way an operator-named file
/// is read (`small_file`: no FIFO, no device, bounded).
fn read_small(path: &Path, flag: &str) -> Result<Vec<u8>, InstallError> {
    crate::small_file::read(path, MAX_SECRET_BYTES)
        .map_err(|e| InstallError::Invalid(format!("{flag} {}: {e}", path.display())))
}

/// The token as the agent will read it: one line an HTTP header can carry.
fn check_token(bytes: &[u8], path: &Path, flag: &str) -> Result<(), InstallError> {
    let text = std::str::from_utf8(bytes).unwrap_or("");
    let token = text.trim();
    let printable = token.chars().all(|c| c.is_ascii_graphic());
    if token.is_empty() || !printable || crate::hub_client::bearer(token).is_err() {
        return Err(InstallError::Invalid(format!(
            "{flag} {}: the token must be one line of printable text (as `railgrid hub agent add --token-out` or `hub enrol-token create --token-out` writes it)",
            path.display()
        )));
    }
    Ok(())
}

fn check_flags(o: &InstallOptions) -> Result<(), InstallError> {
    for url in o.hub.iter().flatten() {
        let parsed = reqwest::Url::parse(url).ok();
        let ok = parsed
            .as_ref()
            .is_some_and(|u| u.scheme() == "https" && u.host_str().is_some_and(|h| !h.is_empty()))
            && !url.contains(|c: char| c.is_whitespace() || c == '"' || c.is_control());
        if !ok {
            return Err(InstallError::Invalid(format!(
                "--hub {url:?}: give the hub's https:// URL (https://host[:port])"
            )));
        }
    }
    if let Some(id) = &o.agent_id {
        crate::config::check_agent_id(id)
            .map_err(|m| InstallError::Invalid(format!("--agent-id: {m}")))?;
    }
    for key in &o.trusted_keys {
        crate::release::public_key(key, Path::new(key)).map_err(|_| {
            InstallError::Invalid(format!(
                "--trusted-key {key:?} is not a minisign public key line (the RW… line of a .pub file)"
            ))
        })?;
    }
    install_labels(o)?;
    templates::check_prefix(&o.prefix).map_err(InstallError::Invalid)?;
    for inside in [CONFIG_DIR, ROOT_STATE_DIR, ROOT_LOG_DIR] {
        if o.prefix.starts_with(inside) {
            return Err(InstallError::Invalid(format!(
                "--prefix {}: not inside {inside}, which uninstall --purge removes",
                o.prefix.display()
            )));
        }
    }
    Ok(())
}

/// A file step: create, update or keep `path` with `bytes`. Only a regular file is
/// replaced: anything else in its place is refused before the first step.
pub(super) fn file_step(
    path: PathBuf,
    mode: u32,
    bytes: Vec<u8>,
    secret: bool,
    what: &str,
) -> Result<Step, InstallError> {
    let subject = format!("{} (mode {mode:04o})", path.display());
    let meta = std::fs::symlink_metadata(&path).ok();
    if let Some(meta) = &meta {
        if !meta.is_file() {
            return Err(InstallError::Invalid(format!(
                "{} is not a regular file (a {}): move it away; install writes regular files only",
                path.display(),
                if meta.is_dir() {
                    "directory"
                } else if meta.file_type().is_symlink() {
                    "symlink"
                } else {
                    "special file"
                }
            )));
        }
    }
    // Bounded: a file much larger than the one to write is not it.
    let cap = bytes.len() as u64 + 1;
    let current = match &meta {
        Some(m) if m.len() < cap => super::root::read_regular(&path, cap)?,
        Some(_) => Some(Vec::new()),
        None => None,
    };
    let (euid, _) = crate::sys::current_ids();
    let foreign_owner = meta
        .as_ref()
        .map(std::os::unix::fs::MetadataExt::uid)
        .filter(|u| *u != euid);
    let current_mode = meta.map(|m| m.permissions().mode() & 0o7777);
    let (verb, detail) = match (current, current_mode) {
        (Some(old), Some(_)) if old == bytes && foreign_owner.is_some() => (
            Verb::Update,
            format!(
                "owner uid {} to this account's",
                foreign_owner.unwrap_or_default()
            ),
        ),
        (Some(old), Some(m)) if old == bytes && m == mode => (Verb::Keep, "unchanged".to_owned()),
        (Some(old), Some(m)) if old == bytes => {
            (Verb::Update, format!("mode {m:04o} to {mode:04o}"))
        }
        (Some(_), _) => (Verb::Update, what.to_owned()),
        (None, _) => (Verb::Create, what.to_owned()),
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
    Ok(Step::new(verb, subject, detail, action))
}

/// The directories install writes into, with their modes: the binary's, the config's and
/// the service file's (and launchd's log directory, which it does not create).
fn install_dirs(manager: Manager, prefix: &Path) -> Vec<(PathBuf, u32)> {
    let mut dirs = vec![
        (prefix.join("bin"), 0o755),
        (PathBuf::from(CONFIG_DIR), 0o700),
        (
            manager
                .service_file()
                .parent()
                .expect("a directory")
                .to_owned(),
            0o755,
        ),
    ];
    if manager == Manager::Launchd {
        dirs.push((ROOT_LOG_DIR.into(), 0o700));
    }
    dirs
}

/// The directories an install may create: uninstall removes no others.
pub(super) fn creatable_dirs(manager: Manager, prefix: &Path) -> Vec<PathBuf> {
    install_dirs(manager, prefix)
        .into_iter()
        .flat_map(|(d, _)| {
            d.ancestors()
                .filter(|a| a.parent().is_some())
                .map(Path::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Plans `agent install`: reads and checks what the flags name, then plans, in order, the
/// directories and the manifest, the account, the binary, what earlier prefixes left,
/// the config and its secrets, the service file, and the service manager's commands.
pub fn plan_install(o: &InstallOptions) -> Result<Plan, InstallError> {
    let manager = Manager::host();
    let root = Root::new(o.root.clone())?;
    super::check_privileges("install", &root, o.dry_run)?;
    let lock = root.lock()?;
    if root.on_host() {
        manager.check_running()?;
    }
    check_flags(o)?;

    let config_path = root.at(ROOT_CONFIG)?;
    let existing = config_file::read_existing(&config_path)?;
    let existing_raw: RawConfig = existing
        .as_deref()
        .map(|t| toml::from_str(t).expect("checked by read_existing"))
        .unwrap_or_default();
    let old_manifest = manifest::read(&root.at(manifest::PATH)?)?;
    let secrets = read_secrets(o)?;
    let wanted = wanted_of(o, &existing_raw, &secrets);
    let converged =
        config_file::converge(existing.as_deref(), &wanted, manager == Manager::Systemd)?;
    // What is written loads as the agent will load it: a config it refuses would leave
    // the service failed (exit 2 is not restarted).
    crate::config::check_text(Path::new(ROOT_CONFIG), &converged.text).map_err(|e| {
        InstallError::Invalid(format!(
            "the config would not load: {}; fix {} (railgrid agent check-config --config {} says the same)",
            crate::util::error_chain(&e),
            config_path.display(),
            config_path.display()
        ))
    })?;
    let user = converged
        .runner_user
        .clone()
        .unwrap_or_else(|| default_runner_user().to_owned());
    let (state_dir, log_dir) = super::agent_dirs(&existing_raw);
    check_agent_dirs(&config_path, [&state_dir, &log_dir], &o.prefix)?;
    let account = account::plan(&user, o.root.as_deref(), &account::home(&state_dir))?;

    let mut created_dirs = old_manifest
        .as_ref()
        .map(|m| m.created_dirs.clone())
        .unwrap_or_default();
    let previous = previous_prefixes(old_manifest.as_ref(), &o.prefix);
    let dir_steps = dir_steps(&root, manager, &o.prefix, &mut created_dirs)?;
    let config_dir = root.at(CONFIG_DIR)?;
    let (mut steps, later): (Vec<Step>, Vec<Step>) = dir_steps.into_iter().partition(
        |s| matches!(&s.action, Action::Dir { path, .. } if config_dir.starts_with(path)),
    );

    let created_account = matches!(account, account::AccountPlan::Create { .. })
        || old_manifest
            .as_ref()
            .is_some_and(|m| m.created_account && m.runner_user.as_deref() == Some(user.as_str()));
    let manifest_path = root.at(manifest::PATH)?;
    let manifest_of = |previous: Vec<PathBuf>| Manifest {
        service: manager.name().to_owned(),
        prefix: o.prefix.clone(),
        previous_prefixes: previous,
        created_dirs: created_dirs.clone(),
        runner_user: Some(user.clone()),
        created_account,
        installed_by: crate::build_info::VERSION.to_owned(),
    };
    // The manifest goes first, naming everything this install may create and every old
    // prefix still to clear: an install that fails midway can be finished or undone.
    steps.push(manifest_step(
        &manifest_path,
        &manifest_of(previous.clone()),
        old_manifest.as_ref(),
    )?);
    steps.extend(later);
    steps.push(account_step(account, &user));

    let bin = templates::binary_path(&o.prefix);
    let binary_changed = binary_steps(&root.at(&bin)?, &mut steps)?;
    steps.extend(old_prefix_steps(
        &root,
        manager,
        &o.prefix,
        &previous,
        &created_dirs,
    )?);

    for file in [
        TOKEN_FILE,
        ENROL_TOKEN_FILE,
        CA_FILE,
        ROOT_CONFIG,
        manifest::PATH,
    ] {
        steps.extend(stale_temporaries(&root.at(file)?)?);
    }
    steps.extend(stale_temporaries(&root.at(manager.service_file())?)?);
    // What the running agent reads again on SIGHUP.
    let config_steps = config_steps(&root, secrets, &config_path, &converged)?;
    let config_changed = config_steps.iter().any(|s| s.verb != Verb::Keep);
    steps.extend(config_steps);

    let service_step = service_step(&root, manager, &o.prefix, (&state_dir, &log_dir), &bin)?;
    let file_changed = service_step.verb != Verb::Keep;
    steps.push(service_step);
    if !previous.is_empty() {
        // Every old prefix is cleared: the manifest says so last.
        steps.push(file_step(
            manifest_path,
            0o600,
            manifest_of(Vec::new()).to_bytes(),
            false,
            "the old prefixes are cleared",
        )?);
    }

    let changes = Changes {
        service_file: file_changed,
        config: config_changed,
        restart: binary_changed || converged.has_hub != existing_raw.hub.url.is_some(),
    };
    let notes = service_commands(&root, manager, changes, o.no_start, &mut steps);
    Ok(Plan {
        title: format!(
            "railgrid agent install: {}, prefix {}, runner account {user}",
            manager.name(),
            o.prefix.display()
        ),
        steps,
        notes,
        _lock: lock,
    })
}

/// A file's bytes, when the flag that names it was given.
type Secret = Option<Vec<u8>>;

/// What the flags name, read and checked.
struct Secrets {
    token: Secret,
    enrol: Secret,
    ca: Secret,
}

/// The token, enrolment token and CA the flags name, read and checked.
fn read_secrets(o: &InstallOptions) -> Result<Secrets, InstallError> {
    let read_token = |path: &Option<PathBuf>, flag| -> Result<Secret, InstallError> {
        match path {
            Some(path) => {
                let bytes = read_small(path, flag)?;
                check_token(&bytes, path, flag)?;
                Ok(Some(bytes))
            }
            None => Ok(None),
        }
    };
    let token = read_token(&o.token_file, "--token-file")?;
    let enrol = read_token(&o.enrol_token, "--enrol-token")?;
    let ca = match &o.ca_file {
        Some(path) => {
            let bytes = read_small(path, "--ca-file")?;
            check_ca(&bytes, path)?;
            Some(bytes)
        }
        None => None,
    };
    Ok(Secrets { token, enrol, ca })
}

/// The labels `--label` gives, checked as the agent checks them; `None` without one.
fn install_labels(o: &InstallOptions) -> Result<Option<Labels>, InstallError> {
    if o.labels.is_empty() {
        return Ok(None);
    }
    let labels = labels::parse_list(&o.labels.join(","))
        .and_then(|l| labels::check(&l, true).map(|()| l))
        .map_err(|e| InstallError::Invalid(format!("--label: {e}")))?;
    Ok(Some(labels))
}

/// What the flags ask of the config file; the runner account defaults only for a file
/// that names none.
fn wanted_of(o: &InstallOptions, existing: &RawConfig, secrets: &Secrets) -> Wanted {
    let runner_user = match (&o.runner_user, &existing.runner.user) {
        (Some(name), _) => Some(name.clone()),
        (None, Some(_)) => None,
        (None, None) => Some(default_runner_user().to_owned()),
    };
    let mut keys: Vec<String> = Vec::new();
    for k in &o.trusted_keys {
        if !keys.contains(k) {
            keys.push(k.clone());
        }
    }
    Wanted {
        runner_user,
        hub_urls: o.hub.clone(),
        agent_id: o.agent_id.clone(),
        token_file: secrets.token.is_some().then(|| PathBuf::from(TOKEN_FILE)),
        enrol_token_file: secrets
            .enrol
            .is_some()
            .then(|| PathBuf::from(ENROL_TOKEN_FILE)),
        ca_file: secrets.ca.is_some().then(|| PathBuf::from(CA_FILE)),
        trusted_keys: (!keys.is_empty()).then_some(keys),
        labels: install_labels(o).ok().flatten(),
    }
}

/// The state and log directories go into the unit unquoted, and `--purge` removes them:
/// plain paths, and the binary not inside either.
fn check_agent_dirs(
    config_path: &Path,
    dirs: [&PathBuf; 2],
    prefix: &Path,
) -> Result<(), InstallError> {
    for dir in dirs {
        if templates::check_plain(dir).is_err() {
            return Err(InstallError::Invalid(format!(
                "{}: state_dir and log_dir must be plain absolute paths (letters, digits and / . _ - +) for the unit to name them, not {}",
                config_path.display(),
                dir.display()
            )));
        }
        if prefix.starts_with(dir) {
            return Err(InstallError::Invalid(format!(
                "--prefix {}: not inside {}, which uninstall --purge removes",
                prefix.display(),
                dir.display()
            )));
        }
    }
    Ok(())
}

/// The prefixes of earlier installs still to clear, without this one.
fn previous_prefixes(old: Option<&Manifest>, prefix: &Path) -> Vec<PathBuf> {
    let mut previous: Vec<PathBuf> = old
        .map(|m| {
            let mut p = m.previous_prefixes.clone();
            p.push(m.prefix.clone());
            p
        })
        .unwrap_or_default();
    previous.retain(|p| p != prefix);
    previous.dedup();
    previous
}

/// The directories to make or tighten: the config's first (the manifest goes there),
/// then the others. Each one that exists must be a directory root owns and no one else
/// may write. Those made are added to `created_dirs`.
fn dir_steps(
    root: &Root,
    manager: Manager,
    prefix: &Path,
    created_dirs: &mut Vec<PathBuf>,
) -> Result<Vec<Step>, InstallError> {
    let mut dir_steps = Vec::new();
    for (dir, mode) in install_dirs(manager, prefix) {
        let missing = root.missing_dirs(&dir)?;
        let existing_top = match missing.first() {
            Some(first) => first.parent().map(Path::to_owned),
            None => Some(dir.clone()),
        };
        if let Some(top) = existing_top {
            let path = root.at(&top)?;
            if !path.is_dir() {
                return Err(InstallError::Invalid(format!(
                    "{} is not a directory: move it away",
                    path.display()
                )));
            }
            if top == dir && mode == 0o700 {
                // The config's directory holds the token: its owner is checked, its mode
                // tightened.
                root.check_trusted(dir.parent().expect("a parent"))?;
                check_owner_only(&path)?;
                let now = std::fs::metadata(&path)
                    .map(|m| m.permissions().mode() & 0o7777)
                    .unwrap_or(mode);
                if now != mode {
                    dir_steps.push(Step::new(
                        Verb::Update,
                        path.display().to_string(),
                        format!("directory, mode {now:04o} to {mode:04o}"),
                        Action::Dir { path, mode },
                    ));
                }
            } else {
                root.check_trusted(&top)?;
            }
        }
        for host in missing {
            let mode = if host == dir { mode } else { 0o755 };
            let path = root.at(&host)?;
            let planned = dir_steps
                .iter()
                .any(|s: &Step| matches!(&s.action, Action::Dir { path: p, .. } if *p == path));
            if !planned {
                dir_steps.push(Step::new(
                    Verb::Create,
                    path.display().to_string(),
                    format!("directory, mode {mode:04o}"),
                    Action::Dir { path, mode },
                ));
            }
            if !created_dirs.contains(&host) {
                created_dirs.push(host);
            }
        }
    }
    Ok(dir_steps)
}

/// The manifest written first, unless the one on disk says the same (by another build).
fn manifest_step(
    path: &Path,
    first: &Manifest,
    old: Option<&Manifest>,
) -> Result<Step, InstallError> {
    let same = |a: &Manifest, b: &Manifest| {
        Manifest {
            installed_by: b.installed_by.clone(),
            ..a.clone()
        } == *b
    };
    if old.is_some_and(|m| same(first, m)) {
        return Ok(Step::new(
            Verb::Keep,
            path.display().to_string(),
            "unchanged",
            Action::None,
        ));
    }
    file_step(
        path.to_owned(),
        0o600,
        first.to_bytes(),
        false,
        "what uninstall removes",
    )
}

fn account_step(account: account::AccountPlan, user: &str) -> Step {
    match account {
        account::AccountPlan::Exists { uid } => Step::new(
            Verb::Keep,
            format!("account {user}"),
            format!("exists (uid {uid})"),
            Action::None,
        ),
        account::AccountPlan::Create { commands } => {
            let shown: Vec<String> = commands.iter().map(|c| shell_words(c)).collect();
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
    }
}

/// This build at `target` (after what an interrupted install left beside it); whether
/// it changes the file there.
fn binary_steps(target: &Path, steps: &mut Vec<Step>) -> Result<bool, InstallError> {
    let exe = Arc::new(PinnedExe::current()?);
    steps.extend(stale_temporaries(target)?);
    let prev = target.with_file_name("railgrid.prev");
    if std::fs::symlink_metadata(&prev).is_ok() {
        // Run as root by the unit's ExecStartPre and by a rollback.
        super::root::check_meta(&prev, false)?;
    }
    Ok(match binary_step(&exe, target)? {
        Some(step) => {
            steps.push(step);
            true
        }
        None => {
            steps.push(Step::new(
                Verb::Keep,
                target.display().to_string(),
                format!(
                    "already this build (sha256 {})",
                    &exe.identity().sha256[..16]
                ),
                Action::None,
            ));
            false
        }
    })
}

/// Earlier prefixes: their binaries, and the directories made for them (when empty).
fn old_prefix_steps(
    root: &Root,
    manager: Manager,
    prefix: &Path,
    previous: &[PathBuf],
    created_dirs: &[PathBuf],
) -> Result<Vec<Step>, InstallError> {
    let mut steps = Vec::new();
    let now_dirs = creatable_dirs(manager, prefix);
    for old in previous {
        let old_bin = root.at(templates::binary_path(old))?;
        for path in [old_bin.clone(), old_bin.with_file_name("railgrid.prev")] {
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
                steps.push(Step::new(
                    Verb::Remove,
                    path.display().to_string(),
                    format!("the binary of the install at prefix {}", old.display()),
                    Action::RemoveFile { path },
                ));
            }
        }
        let mut dirs: Vec<PathBuf> = creatable_dirs(manager, old)
            .into_iter()
            .filter(|d| created_dirs.contains(d) && !now_dirs.contains(d))
            .collect();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            let path = root.at(&dir)?;
            if path.is_dir() {
                steps.push(Step::new(
                    Verb::Remove,
                    path.display().to_string(),
                    format!("directory made for prefix {}, if empty", old.display()),
                    Action::RemoveEmptyDir { path },
                ));
            }
        }
    }
    Ok(steps)
}

/// The token, the CA and the config file.
fn config_steps(
    root: &Root,
    secrets: Secrets,
    config_path: &Path,
    converged: &config_file::Converged,
) -> Result<Vec<Step>, InstallError> {
    let mut steps = Vec::new();
    if let Some(token) = secrets.token {
        steps.push(file_step(
            root.at(TOKEN_FILE)?,
            0o600,
            token,
            true,
            "the hub token",
        )?);
    }
    if let Some(enrol) = secrets.enrol {
        steps.push(file_step(
            root.at(ENROL_TOKEN_FILE)?,
            0o600,
            enrol,
            true,
            "the enrolment token (the agent makes its own token from it at its first contact)",
        )?);
    }
    if let Some(ca) = secrets.ca {
        steps.push(file_step(
            root.at(CA_FILE)?,
            0o644,
            ca,
            false,
            "the hub's CA",
        )?);
    }
    let what = if converged.changes.is_empty() {
        "unchanged".to_owned()
    } else {
        converged.changes.join(", ")
    };
    steps.push(file_step(
        config_path.to_owned(),
        0o600,
        converged.text.clone().into_bytes(),
        false,
        &what,
    )?);
    Ok(steps)
}

/// The unit or plist for the binary at `bin`; a masked unit is refused.
fn service_step(
    root: &Root,
    manager: Manager,
    prefix: &Path,
    dirs: (&Path, &Path),
    bin: &Path,
) -> Result<Step, InstallError> {
    let service_file = manager.service_file();
    let what = match manager {
        Manager::Systemd => format!("the unit, for {}", bin.display()),
        Manager::Launchd => format!("the daemon's plist, for {}", bin.display()),
    };
    // The upgrade guard looks where the agent keeps its state.
    let rendered = manager.render(prefix, dirs);
    let naive = match &root.0 {
        Some(r) => r.join(service_file.strip_prefix("/").unwrap_or(&service_file)),
        None => service_file.clone(),
    };
    if std::fs::read_link(&naive).is_ok_and(|t| t == Path::new("/dev/null")) {
        return Err(InstallError::Invalid(format!(
            "{} is masked (a link to /dev/null): run systemctl unmask {} first",
            naive.display(),
            templates::UNIT_NAME
        )));
    }
    file_step(
        root.at(&service_file)?,
        0o644,
        rendered.into_bytes(),
        false,
        &what,
    )
}

/// On the host, the service manager's commands: a stop before the binary is replaced
/// when a restart is due, and the enable, start, reload or restart after. The notes
/// for the operator.
fn service_commands(
    root: &Root,
    manager: Manager,
    changes: Changes,
    no_start: bool,
    steps: &mut Vec<Step>,
) -> Vec<String> {
    let mut notes = Vec::new();
    if !root.on_host() {
        notes.push(format!(
            "nothing was started or enabled (--root): {} starts the agent from {} once the image boots",
            manager.name(),
            manager.service_file().display()
        ));
        return notes;
    }
    let now = manager.state();
    // The running agent is stopped before its binary is replaced: its own lockstep
    // would otherwise take the file while the restart below stops it mid-switch.
    let first = manager.stop_first(now, changes);
    let at = steps
        .iter()
        .position(|s| matches!(s.action, Action::Binary { .. }))
        .unwrap_or(steps.len());
    for (i, c) in first.into_iter().enumerate() {
        steps.insert(
            at + i,
            Step::new(
                Verb::Run,
                shell_words(&c.argv),
                "the new binary or hub needs a restart",
                Action::Command(c),
            ),
        );
    }
    for c in manager.install_commands(now, changes, !no_start) {
        steps.push(Step::new(
            Verb::Run,
            shell_words(&c.argv),
            "",
            Action::Command(c),
        ));
    }
    if no_start && !now.running {
        notes.push("not started (--no-start): the service starts at the next boot".into());
    }
    notes
}

/// Refuses a directory root keeps secrets in that another account owns (its mode is
/// then made right by the plan).
fn check_owner_only(path: &Path) -> Result<(), InstallError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).map_err(FileError::read(path))?;
    let (euid, _) = crate::sys::current_ids();
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(InstallError::Invalid(format!(
            "{} is owned by uid {}: the token goes there, so only root may own it; chown root {}",
            path.display(),
            meta.uid(),
            path.display()
        )));
    }
    Ok(())
}

/// Temporary copies of `target` a killed install left beside it (`util::write_atomic`'s
/// `.NAME.tmp.PID.N`, of a process that is gone): removed.
pub(super) fn stale_temporaries(target: &Path) -> Result<Vec<Step>, InstallError> {
    let (Some(dir), Some(name)) = (target.parent(), target.file_name()) else {
        return Ok(Vec::new());
    };
    let prefix = format!(".{}.tmp.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut steps = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let pid: Option<i32> = rest.split('.').next().and_then(|p| p.parse().ok());
        let gone = pid.is_some_and(|p| {
            !Path::new(&format!("/proc/{p}")).exists() || cfg!(not(target_os = "linux"))
        });
        if gone && entry.file_type().is_ok_and(|t| t.is_file()) {
            let path = entry.path();
            steps.push(Step::new(
                Verb::Remove,
                path.display().to_string(),
                "left by an interrupted install",
                Action::RemoveFile { path },
            ));
        }
    }
    Ok(steps)
}

/// The step that puts this binary at `target`, or `None` when it is there already, the
/// same bytes, mode 0755 and root's.
fn binary_step(exe: &Arc<PinnedExe>, target: &Path) -> Result<Option<Step>, InstallError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(target).ok();
    if let Some(meta) = &meta {
        if !meta.is_file() {
            return Err(InstallError::Invalid(format!(
                "{} is not a regular file: move it away",
                target.display()
            )));
        }
    }
    let (euid, _) = crate::sys::current_ids();
    let this = format!(
        "railgrid {} (sha256 {}, {:.1} MiB)",
        crate::build_info::VERSION,
        &exe.identity().sha256[..16],
        exe.identity().size as f64 / (1024.0 * 1024.0)
    );
    let step = |verb, detail: String| {
        Some(Step::new(
            verb,
            target.display().to_string(),
            detail,
            Action::Binary {
                path: target.to_owned(),
                exe: exe.clone(),
            },
        ))
    };
    let Some(meta) = meta else {
        return Ok(step(Verb::Create, this));
    };
    if !same_binary(exe, target) {
        return Ok(step(Verb::Update, this));
    }
    let mode = meta.mode() & 0o7777;
    if mode != 0o755 || meta.uid() != euid {
        return Ok(step(
            Verb::Update,
            format!(
                "owner uid {} and mode {mode:04o} to this account's and 0755",
                meta.uid()
            ),
        ));
    }
    Ok(None)
}

/// Refuses a CA file the agent's client refuses, and one with a private key in it (it
/// would be written readable by all).
fn check_ca(bytes: &[u8], path: &Path) -> Result<(), InstallError> {
    if String::from_utf8_lossy(bytes).contains("PRIVATE KEY") {
        return Err(InstallError::Invalid(format!(
            "--ca-file {}: it holds a private key; give the CA's certificate only",
            path.display()
        )));
    }
    // The bytes that will be written are the bytes checked.
    crate::hub_client::check_ca(path, bytes).map_err(|e| {
        InstallError::Invalid(format!(
            "--ca-file {}: {}",
            path.display(),
            crate::util::error_chain(&e)
        ))
    })?;
    Ok(())
}

/// Whether `target` holds this binary's bytes (or is the running file itself).
fn same_binary(exe: &PinnedExe, target: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(target) else {
        return false;
    };
    let id = exe.identity();
    if meta.dev() == id.device && meta.ino() == id.inode {
        return true;
    }
    meta.len() == id.size
        && PinnedExe::open(target).is_ok_and(|theirs| theirs.identity().sha256 == id.sha256)
}
