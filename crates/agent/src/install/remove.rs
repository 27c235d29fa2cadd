//! The plan of `agent uninstall`: what an install put on the host, taken away.
//!
//! Uninstall believes nothing it reads without checking it: the manifest's prefix and
//! directories, the unit's binary and the config's directories must be plain absolute
//! paths, and a directory is removed only if an install could have created it.

use std::path::{Path, PathBuf};

use super::command::shell_words;
use super::converge::creatable_dirs;
use super::manager::Manager;
use super::manifest::{self, Manifest};
use super::plan::{Action, Plan, Step, Verb};
use super::root::{check_host_path, Root};
use super::{config_file, templates, InstallError, UninstallOptions, CONFIG_DIR};
use crate::config::{RawConfig, ROOT_CONFIG};

/// The binary an install without a manifest left: only a unit of ours names it.
fn prefix_from_unit(unit: &str) -> Option<PathBuf> {
    let start = unit.lines().find_map(|l| l.strip_prefix("ExecStart="))?;
    let mut words = start.split_whitespace();
    let bin = Path::new(words.next()?);
    let ours = words.take(2).eq(["agent", "run"])
        && bin.file_name()? == "railgrid"
        && bin.parent()?.file_name()? == "bin";
    let prefix = bin.parent()?.parent()?.to_owned();
    (ours && templates::check_prefix(&prefix).is_ok()).then_some(prefix)
}

/// Plans `agent uninstall`.
///
/// The order keeps every step recoverable: the service (and an upgrade's watcher) stops
/// first, the check that no agent holds the state comes before anything is removed, and
/// the manifest goes last, so that a failure midway can be finished by running it again.
pub fn plan_uninstall(o: &UninstallOptions) -> Result<Plan, InstallError> {
    let root = Root::new(o.root.clone())?;
    super::check_privileges("uninstall", &root, o.dry_run)?;
    let lock = root.lock()?;
    let manager = Manager::host();
    if root.on_host() {
        manager.check_running()?;
    }
    let manifest_path = root.at(manifest::PATH)?;
    let manifest = manifest::read(&manifest_path)?;
    let service_file = manager.service_file();
    let unit_path = root.at(&service_file)?;
    let prefixes = installed_prefixes(manifest.as_ref(), &unit_path);
    // The directories the agent uses, by config::load's rule.
    let config_path = root.at(ROOT_CONFIG)?;
    // Only a purge needs the config's directories: a broken config does not keep the
    // service from being removed.
    let raw: RawConfig = match config_file::read_existing(&config_path) {
        Ok(text) => text
            .map(|t| toml::from_str(&t).expect("checked by read_existing"))
            .unwrap_or_default(),
        Err(e) if o.purge => return Err(e),
        Err(_) => RawConfig::default(),
    };
    let (state, log) = super::agent_dirs(&raw);

    let mut steps = Vec::new();
    let mut notes = Vec::new();
    let has_unit = unit_path.symlink_metadata().is_ok();
    let stops = root.on_host() && {
        let cmds = manager.stop_commands(manager.state(), has_unit);
        let any = !cmds.is_empty();
        run(&mut steps, cmds);
        any
    };
    let trees = if o.purge {
        purge_trees(&root, &state, &log, stops, &mut steps)?
    } else {
        Vec::new()
    };

    remove(&mut steps, unit_path, "the service's file")?;
    if root.on_host() && has_unit {
        run(&mut steps, manager.forget_commands());
    }
    steps.extend(super::converge::stale_temporaries(
        &root.at(&service_file)?,
    )?);
    for prefix in &prefixes {
        let bin = root.at(templates::binary_path(prefix))?;
        let prev = bin.with_file_name("railgrid.prev");
        steps.extend(super::converge::stale_temporaries(&bin)?);
        remove(&mut steps, bin, "the binary")?;
        remove(
            &mut steps,
            prev,
            "the previous binary, kept by the self-upgrade",
        )?;
    }
    for (path, what) in trees {
        steps.push(Step::new(
            Verb::Remove,
            path.display().to_string(),
            what,
            Action::RemoveTree { path },
        ));
    }

    let config_dir = root.at(CONFIG_DIR)?;
    let mut above_config = Vec::new();
    if let Some(m) = &manifest {
        above_config = created_dir_steps(&root, manager, m, &prefixes, &config_dir, &mut steps)?;
        notes.extend(kept_account_note(m));
    }
    if o.purge {
        if config_dir.is_dir() {
            purge_config_steps(&root, &config_dir, &manifest_path, &mut steps)?;
        }
        steps.extend(above_config);
    } else if config_dir.exists() {
        notes.push(format!(
            "kept {} (config, token and the install's manifest), the state and the logs: --purge removes them",
            config_dir.display()
        ));
    }
    if steps.iter().all(|s| s.verb == Verb::Skip) && notes.is_empty() {
        notes.push("nothing of railgrid is installed here".into());
    }
    let shown = match prefixes.first() {
        Some(p) => format!("prefix {}", p.display()),
        None => "no binary found".to_owned(),
    };
    Ok(Plan {
        title: format!(
            "railgrid agent uninstall{}: {}, {shown}",
            if o.purge { " --purge" } else { "" },
            manager.name(),
        ),
        steps,
        notes,
        _lock: lock,
    })
}

/// The prefixes installs used: the manifest's, else the one a unit of ours names.
fn installed_prefixes(manifest: Option<&Manifest>, unit_path: &Path) -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = match manifest {
        Some(m) => {
            let mut p = vec![m.prefix.clone()];
            p.extend(m.previous_prefixes.iter().cloned());
            p
        }
        // Installed without a manifest: a unit of ours names the binary.
        None => super::root::read_regular(unit_path, 1 << 20)
            .ok()
            .flatten()
            .and_then(|u| prefix_from_unit(&String::from_utf8_lossy(&u)))
            .into_iter()
            .collect(),
    };
    prefixes.dedup();
    prefixes
}

fn run(steps: &mut Vec<Step>, cmds: Vec<super::manager::Cmd>) {
    for c in cmds {
        steps.push(Step::new(
            Verb::Run,
            shell_words(&c.argv),
            "",
            Action::Command(c),
        ));
    }
}

/// Removes the file at `path`, if there is one; a directory there is refused.
fn remove(steps: &mut Vec<Step>, path: PathBuf, what: &str) -> Result<(), InstallError> {
    if let Ok(meta) = path.symlink_metadata() {
        if meta.is_dir() {
            return Err(InstallError::Invalid(format!(
                "{} is a directory, not the file uninstall removes: move it away",
                path.display()
            )));
        }
        steps.push(Step::new(
            Verb::Remove,
            path.display().to_string(),
            what,
            Action::RemoveFile { path },
        ));
    }
    Ok(())
}

/// What --purge removes whole: only plain directories named for railgrid, so that a
/// config pointing at /srv cannot purge it. Whatever the state directory is called, no
/// agent may hold it while anything goes: checked now (unless the service is being
/// stopped first), and again, as a step, once it is.
fn purge_trees(
    root: &Root,
    state: &Path,
    log: &Path,
    stops: bool,
    steps: &mut Vec<Step>,
) -> Result<Vec<(PathBuf, &'static str)>, InstallError> {
    let mut trees = Vec::new();
    let mut purge: Vec<(PathBuf, &'static str)> =
        vec![(state.to_owned(), "state: job records and spooled output")];
    if log != state {
        purge.push((log.to_owned(), "logs"));
    }
    if check_host_path(state).is_ok() {
        let path = root.at(state)?;
        if path.is_dir() {
            if !stops {
                if let Some(pid) = crate::instance::holders(&path).and_then(|h| h.first().copied())
                {
                    return Err(InstallError::AgentRunning { pid, dir: path });
                }
            }
            steps.push(Step::new(
                Verb::Keep,
                path.display().to_string(),
                "checked: no agent holds it",
                Action::EnsureNoHolder { state_dir: path },
            ));
        }
    }
    for (dir, what) in purge {
        let named = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains("railgrid"));
        let shown = shell_words(&[dir.display().to_string()]);
        if !named || check_host_path(&dir).is_err() {
            steps.push(Step::new(Verb::Skip, shown, format!("{what}; not a plain path named for railgrid, so not removed: remove it by hand"), Action::None));
            continue;
        }
        let path = root.at(&dir)?;
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {
                root.check_trusted(dir.parent().unwrap_or(Path::new("/")))?;
                trees.push((path, what));
            }
            Ok(_) => steps.push(Step::new(
                Verb::Skip,
                path.display().to_string(),
                format!("{what}; not a directory, so not removed: remove it by hand"),
                Action::None,
            )),
            Err(_) => {}
        }
    }
    Ok(trees)
}

/// The directories installs created, deepest first, when empty, into `steps`; those
/// above the config's directory are returned, to go after it.
fn created_dir_steps(
    root: &Root,
    manager: Manager,
    m: &Manifest,
    prefixes: &[PathBuf],
    config_dir: &Path,
    steps: &mut Vec<Step>,
) -> Result<Vec<Step>, InstallError> {
    let mut above_config = Vec::new();
    let allowed: Vec<PathBuf> = prefixes
        .iter()
        .flat_map(|p| creatable_dirs(manager, p))
        .collect();
    let mut dirs: Vec<&PathBuf> = m
        .created_dirs
        .iter()
        .filter(|d| allowed.contains(d) && d.as_path() != Path::new(CONFIG_DIR))
        .collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for dir in dirs {
        let path = root.at(dir)?;
        if !path.is_dir() {
            continue;
        }
        let step = Step::new(
            Verb::Remove,
            path.display().to_string(),
            "directory the install created, if empty",
            Action::RemoveEmptyDir { path: path.clone() },
        );
        if config_dir.starts_with(&path) {
            above_config.push(step);
        } else {
            steps.push(step);
        }
    }
    Ok(above_config)
}

/// The account an install created stays (files it owns may be anywhere): how to remove it.
fn kept_account_note(m: &Manifest) -> Option<String> {
    let (Some(user), true) = (&m.runner_user, m.created_account) else {
        return None;
    };
    let quoted = shell_words(std::slice::from_ref(user));
    let users = shell_words(&[format!("/Users/{user}")]);
    let groups = shell_words(&[format!("/Groups/{user}")]);
    Some(format!(
        "kept the account {quoted}: files it owns may remain elsewhere; remove it with: {}",
        if cfg!(target_os = "macos") {
            format!("dscl . -delete {users}; dscl . -delete {groups}")
        } else {
            format!("userdel {quoted}")
        }
    ))
}

/// The config directory's files, the manifest last (a purge cut short is finished by
/// running it again), then the directory.
fn purge_config_steps(
    root: &Root,
    config_dir: &Path,
    manifest_path: &Path,
    steps: &mut Vec<Step>,
) -> Result<(), InstallError> {
    root.check_trusted(Path::new(CONFIG_DIR))?;
    for name in ["agent.toml", "token", "hub-ca.pem", "install.json"] {
        steps.extend(super::converge::stale_temporaries(&config_dir.join(name))?);
    }
    steps.push(Step::new(
        Verb::Remove,
        format!("{}/*", config_dir.display()),
        "config, token and CA",
        Action::EmptyDirExcept {
            path: config_dir.to_owned(),
            keep: "install.json",
        },
    ));
    steps.push(Step::new(
        Verb::Remove,
        manifest_path.display().to_string(),
        "the install's manifest",
        Action::RemoveFile {
            path: manifest_path.to_owned(),
        },
    ));
    steps.push(Step::new(
        Verb::Remove,
        config_dir.display().to_string(),
        "directory",
        Action::RemoveEmptyDir {
            path: config_dir.to_owned(),
        },
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_unit_of_ours_names_a_binary_to_remove() {
        let unit = |start: &str| format!("[Service]\nExecStart={start}\n");
        assert_eq!(
            prefix_from_unit(&unit(
                "/opt/rg/bin/railgrid agent run --config /etc/railgrid/agent.toml"
            )),
            Some(PathBuf::from("/opt/rg"))
        );
        for other in [
            "/usr/bin/env railgrid agent run",
            "-/usr/local/bin/railgrid agent run",
            "/usr/local/bin/railgrid hub serve",
            "/../tmp/bin/railgrid agent run",
            "/bin/railgrid agent run",
        ] {
            assert_eq!(prefix_from_unit(&unit(other)), None, "{other}");
        }
    }
}
