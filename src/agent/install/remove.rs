//! The plan of `agent uninstall`: what an install put on the host, taken away.
//!
//! Uninstall believes nothing it reads without checking it: the manifest's prefix and
//! directories, the unit's binary and the config's directories must be plain absolute
//! paths, and a directory is removed only if an install could have created it.

use std::path::{Path, PathBuf};

use super::converge::creatable_dirs;
use super::manager::Manager;
use super::manifest;
use super::plan::{shell_words, Action, Plan, Step, Verb};
use super::root::{check_host_path, Root};
use super::{templates, InstallError, UninstallOptions, CONFIG_DIR};
use crate::agent::config::{RawConfig, ROOT_CONFIG};

/// Refuses what is not a regular file where install keeps one.
pub(super) fn check_regular(path: &Path) -> Result<(), InstallError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.is_file() => Err(InstallError::Invalid(format!(
            "{} is not a regular file: move it away",
            path.display()
        ))),
        _ => Ok(()),
    }
}

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
pub(crate) fn plan_uninstall(o: &UninstallOptions) -> Result<Plan, InstallError> {
    let root = Root::new(o.root.clone())?;
    super::check_privileges("uninstall", &root, o.dry_run)?;
    let manager = Manager::host();
    if root.on_host() {
        manager.check_running()?;
    }
    let manifest_path = root.at(manifest::PATH)?;
    let manifest = manifest::read(&manifest_path)?;
    let service_file = manager.service_file();
    let unit_path = root.at(&service_file)?;
    let prefix = match &manifest {
        Some(m) => {
            templates::check_prefix(&m.prefix).map_err(|why| InstallError::BadManifest {
                path: manifest_path.clone(),
                message: why,
            })?;
            Some(m.prefix.clone())
        }
        None => std::fs::read_to_string(&unit_path)
            .ok()
            .and_then(|u| prefix_from_unit(&u)),
    };

    let mut steps = Vec::new();
    let mut notes = Vec::new();
    let run = |steps: &mut Vec<Step>, cmds: Vec<super::manager::Cmd>| {
        for c in cmds {
            steps.push(Step::new(
                Verb::Run,
                shell_words(&c.argv),
                "",
                Action::Command(c),
            ));
        }
    };
    let has_unit = unit_path.symlink_metadata().is_ok();
    let stops = root.on_host() && {
        let cmds = manager.stop_commands(manager.state(), has_unit);
        let any = !cmds.is_empty();
        run(&mut steps, cmds);
        any
    };
    let remove = |steps: &mut Vec<Step>, path: PathBuf, what: &str| -> Result<(), InstallError> {
        if path.symlink_metadata().is_ok() {
            if path.is_dir() {
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
    };
    remove(&mut steps, unit_path, "the service's file")?;
    if root.on_host() && has_unit {
        run(&mut steps, manager.forget_commands());
    }
    if let Some(prefix) = &prefix {
        let bin = root.at(templates::binary_path(prefix))?;
        let prev = bin.with_file_name("railgrid.prev");
        remove(&mut steps, bin, "the binary")?;
        remove(
            &mut steps,
            prev,
            "the previous binary, kept by the self-upgrade",
        )?;
    }

    // The directories the agent uses, by config::load's rule.
    let config_path = root.at(ROOT_CONFIG)?;
    let raw: RawConfig = match std::fs::read_to_string(&config_path) {
        Ok(text) => toml::from_str(&text).map_err(|e| InstallError::ForeignConfig {
            path: config_path.clone(),
            message: e.message().trim().to_owned(),
        })?,
        Err(_) => RawConfig::default(),
    };
    let (state, log) = super::agent_dirs(&raw);
    if o.purge {
        let mut purge: Vec<(PathBuf, &str)> =
            vec![(CONFIG_DIR.into(), "config, token, CA and manifest")];
        purge.push((state.clone(), "state: job records and spooled output"));
        if log != state {
            purge.push((log.clone(), "logs"));
        }
        let mut checked = false;
        for (dir, what) in purge {
            // A config may name any directory: only a plain one named for railgrid is
            // removed whole, so that a typo cannot purge /srv.
            let named = dir
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains("railgrid"));
            let path = match (named, check_host_path(&dir)) {
                (true, Ok(())) => root.at(&dir)?,
                _ => {
                    steps.push(Step::new(Verb::Skip, dir.display().to_string(), format!("{what}; not a plain path named for railgrid, so not removed: remove it by hand"), Action::None));
                    continue;
                }
            };
            if !path.exists() {
                continue;
            }
            if dir == state && !checked {
                checked = true;
                // Checked again right before, once the service is stopped.
                if !stops {
                    if let Some(pid) =
                        crate::agent::instance::holders(&path).and_then(|h| h.first().copied())
                    {
                        return Err(InstallError::AgentRunning { pid, dir: path });
                    }
                }
                steps.push(Step::new(
                    Verb::Keep,
                    path.display().to_string(),
                    "checked: no agent holds it",
                    Action::EnsureNoHolder {
                        state_dir: path.clone(),
                    },
                ));
            }
            steps.push(Step::new(
                Verb::Remove,
                path.display().to_string(),
                what,
                Action::RemoveTree { path },
            ));
        }
    } else if manifest.is_some() || !steps.is_empty() {
        notes.push(format!(
            "kept {} (config, token and the install's manifest), {} and {}: --purge removes them",
            root.at(CONFIG_DIR)?.display(),
            root.at(&state)
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| state.display().to_string()),
            root.at(&log)
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| log.display().to_string()),
        ));
    }
    if let (Some(m), Some(prefix)) = (&manifest, &prefix) {
        let allowed = creatable_dirs(manager, prefix);
        let mut dirs: Vec<&PathBuf> = m
            .created_dirs
            .iter()
            .filter(|d| allowed.contains(d) && check_host_path(d).is_ok())
            .collect();
        // Deepest first: a directory empties before its parent is tried.
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            let path = root.at(dir)?;
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
                "kept the account {user}: files it owns may remain elsewhere; remove it with: {}",
                if cfg!(target_os = "macos") {
                    format!("dscl . -delete /Users/{user}; dscl . -delete /Groups/{user}")
                } else {
                    format!("userdel {user}")
                }
            ));
        }
    }
    if steps.iter().all(|s| s.verb == Verb::Skip) && notes.is_empty() {
        notes.push("nothing of railgrid is installed here".into());
    }
    let shown = prefix.map_or_else(
        || "no binary found".to_owned(),
        |p| format!("prefix {}", p.display()),
    );
    Ok(Plan {
        title: format!(
            "railgrid agent uninstall{}: {}, {shown}",
            if o.purge { " --purge" } else { "" },
            manager.name(),
        ),
        steps,
        notes,
    })
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
