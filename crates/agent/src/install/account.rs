//! The runner's account: found, or created as a system account with no login shell and
//! its home inside the state directory (Linux `useradd --system`, macOS `dscl` with a free
//! id below 500). The commands are chosen when the plan is made, so that `--dry-run`
//! prints exactly what would run.

use std::path::{Path, PathBuf};

use super::InstallError;

/// What the install does about the account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AccountPlan {
    /// It exists: uid, and where it was found.
    Exists { uid: u32 },
    /// It is created by these commands, in order.
    Create { commands: Vec<Vec<String>> },
    /// It cannot be created here (an image without a password database): why.
    Skip { reason: String },
}

/// The account's home: inside the state directory, where the runner keeps its own state.
pub(super) fn home(state_dir: &Path) -> PathBuf {
    state_dir.join("runner")
}

/// Decides what to do about `name`; `root` is the `--root` directory, if any.
pub(super) fn plan(
    name: &str,
    root: Option<&Path>,
    home: &Path,
) -> Result<AccountPlan, InstallError> {
    crate::supervisor::account::check_name(name)
        .map_err(|e| InstallError::Invalid(e.to_string()))?;
    if name == "root" {
        return Err(InstallError::RootRunner {
            name: name.to_owned(),
        });
    }
    let found = match root {
        None => uzers::get_user_by_name(name).map(|u| (u.uid(), u.primary_group_id())),
        Some(root) => match entry(&root.join("etc/passwd"), name)? {
            Some(fields) => Some(ids(&fields, name)?),
            None => None,
        },
    };
    if let Some((uid, gid)) = found {
        if uid == 0 {
            return Err(InstallError::RootRunner {
                name: name.to_owned(),
            });
        }
        // The supervisor refuses a runner in group 0 (root's), as it refuses uid 0.
        if gid == 0 {
            return Err(InstallError::Invalid(format!(
                "the account {name} has primary group 0 (root's): the runner never runs in it; give --runner-user another account"
            )));
        }
        let group = match root {
            None => uzers::get_group_by_gid(gid).is_some(),
            Some(root) => group_of_gid(&root.join("etc/group"), gid)?,
        };
        if !group {
            return Err(InstallError::Invalid(format!(
                "the account {name} is incomplete: its primary group {gid} does not exist (a useradd cut short?); remove it (userdel {name}) and run this again"
            )));
        }
        return Ok(AccountPlan::Exists { uid });
    }
    // Only a name install creates must be portable; an existing one is used as it is.
    check_name(name)?;
    if !crate::sys::is_root() {
        return Ok(AccountPlan::Skip {
            reason: format!(
                "only root can create the account {name}: create it, or run this as root"
            ),
        });
    }
    if cfg!(target_os = "macos") {
        if let Some(root) = root {
            return Ok(AccountPlan::Skip {
                reason: format!(
                    "{} is not this host's directory service: create the account {name} in the image",
                    root.display()
                ),
            });
        }
        return Ok(AccountPlan::Create {
            commands: dscl_commands(name, home, free_macos_id()?, macos_group(name)),
        });
    }
    if let Some(root) = root {
        if !std::fs::symlink_metadata(root.join("etc/passwd")).is_ok_and(|m| m.is_file()) {
            return Ok(AccountPlan::Skip {
                reason: format!(
                    "{} has no etc/passwd: create the account {name} where the image is finished",
                    root.display()
                ),
            });
        }
    }
    if let Some(root) = root {
        check_account_files(root)?;
    }
    let mut argv: Vec<String> = vec!["useradd".into()];
    if let Some(root) = root {
        // --prefix edits ROOT/etc/{passwd,group,shadow} without a chroot: the image need
        // not hold a useradd of its own.
        argv.extend(["--prefix".into(), root.display().to_string()]);
    }
    // A group of that name (left by an earlier userdel) becomes the account's group.
    let group_gid = match root {
        None => uzers::get_group_by_name(name).map(|g| g.gid()),
        Some(root) => uid_in_passwd(&root.join("etc/group"), name)?,
    };
    if group_gid == Some(0) {
        return Err(InstallError::Invalid(format!(
            "a group {name} with gid 0 (root's) exists: the runner's account cannot be in it; give --runner-user another name"
        )));
    }
    let group_exists = group_gid.is_some();
    argv.push("--system".into());
    if group_exists {
        argv.extend(["--gid".into(), name.to_owned()]);
    } else {
        argv.push("--user-group".into());
    }
    argv.extend([
        "--no-create-home".into(),
        "--home-dir".into(),
        home.display().to_string(),
        "--shell".into(),
        no_login_shell(root),
        "--comment".into(),
        "railgrid runner".into(),
        name.to_owned(),
    ]);
    Ok(AccountPlan::Create {
        commands: vec![argv],
    })
}

/// Runs the commands of a [`AccountPlan::Create`].
pub(super) fn create(commands: &[Vec<String>]) -> Result<(), InstallError> {
    for argv in commands {
        super::command::run_command(argv)?;
    }
    Ok(())
}

/// The name goes to useradd/dscl and into the config: the portable account-name set.
fn check_name(name: &str) -> Result<(), InstallError> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'));
    if name == "root" {
        return Err(InstallError::RootRunner {
            name: name.to_owned(),
        });
    }
    if !ok {
        return Err(InstallError::Invalid(format!(
            "--runner-user {name:?}: use 1 to 32 lowercase letters, digits, '_' or '-', not starting with '-'"
        )));
    }
    Ok(())
}

/// The id of `name` in a passwd or group file (the third field); `None` when it has no
/// line, or there is no file.
fn uid_in_passwd(passwd: &Path, name: &str) -> Result<Option<u32>, InstallError> {
    Ok(entry(passwd, name)?.and_then(|f| f.get(2)?.parse().ok()))
}

/// The fields of `name`'s line in a passwd or group file; `None` without one.
fn entry(file: &Path, name: &str) -> Result<Option<Vec<String>>, InstallError> {
    let Some(bytes) = super::root::read_regular(file, 64 << 20)? else {
        return Ok(None);
    };
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .map(|l| l.split(':').map(str::to_owned).collect::<Vec<_>>())
        .find(|f| f.first().map(String::as_str) == Some(name)))
}

/// The uid and gid of a passwd line; a line without numbers is refused, not ignored.
fn ids(fields: &[String], name: &str) -> Result<(u32, u32), InstallError> {
    let num = |i: usize| fields.get(i).and_then(|f| f.parse::<u32>().ok());
    match (num(2), num(3)) {
        (Some(uid), Some(gid)) => Ok((uid, gid)),
        _ => Err(InstallError::Invalid(format!(
            "the account {name} in the image's etc/passwd has no numeric uid and gid: fix that line"
        ))),
    }
}

/// Whether a group file has a group with `gid`.
fn group_of_gid(file: &Path, gid: u32) -> Result<bool, InstallError> {
    let Some(bytes) = super::root::read_regular(file, 64 << 20)? else {
        return Ok(false);
    };
    let gid = gid.to_string();
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .any(|l| l.split(':').nth(2) == Some(gid.as_str())))
}

/// `useradd --prefix DIR` writes DIR/etc/passwd and its siblings (backups, locks,
/// temporaries) by path, following links: none of them may be anything but a regular
/// file, so that an image cannot point a write of root's elsewhere.
fn check_account_files(root: &Path) -> Result<(), InstallError> {
    for base in ["passwd", "group", "shadow", "gshadow", "subuid", "subgid"] {
        for suffix in ["", "-", "+", ".lock", ".OLD"] {
            let path = root.join("etc").join(format!("{base}{suffix}"));
            if let Ok(meta) = std::fs::symlink_metadata(&path) {
                if !meta.is_file() {
                    return Err(InstallError::Invalid(format!(
                        "{} is not a regular file: useradd would write through it; move it away",
                        path.display()
                    )));
                }
            }
        }
    }
    let lock = root.join("etc/.pwd.lock");
    if std::fs::symlink_metadata(&lock).is_ok_and(|m| !m.is_file()) {
        return Err(InstallError::Invalid(format!(
            "{} is not a regular file: useradd would write through it; move it away",
            lock.display()
        )));
    }
    Ok(())
}

/// A shell that refuses logins, as the target system has it.
fn no_login_shell(root: Option<&Path>) -> String {
    const SHELLS: [&str; 4] = [
        "/usr/sbin/nologin",
        "/sbin/nologin",
        "/usr/bin/false",
        "/bin/false",
    ];
    let base = root.unwrap_or(Path::new("/"));
    SHELLS
        .iter()
        .find(|s| base.join(s.trim_start_matches('/')).exists())
        .or_else(|| SHELLS.iter().find(|s| Path::new(s).exists()))
        .unwrap_or(&SHELLS[0])
        .to_string()
}

/// macOS: the commands that create a hidden system account with uid `id`, and its
/// group with the same id unless a group of that name exists (`group`: its gid), which is
/// then the account's group, untouched.
fn dscl_commands(name: &str, home: &Path, id: u32, group: Option<u32>) -> Vec<Vec<String>> {
    let set = |record: &str, key: &str, value: &str| -> Vec<String> {
        ["dscl", ".", "-create", record, key, value]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let group_record = format!("/Groups/{name}");
    let user = format!("/Users/{name}");
    let gid = group.unwrap_or(id).to_string();
    let id = id.to_string();
    let mut cmds = Vec::new();
    if group.is_none() {
        cmds.push(set(&group_record, "PrimaryGroupID", &gid));
        cmds.push(set(&group_record, "RealName", "railgrid runner"));
    }
    cmds.extend([
        set(&user, "UniqueID", &id),
        set(&user, "PrimaryGroupID", &gid),
        set(&user, "UserShell", "/usr/bin/false"),
        set(&user, "NFSHomeDirectory", &home.display().to_string()),
        set(&user, "RealName", "railgrid runner"),
        set(&user, "Password", "*"),
        set(&user, "IsHidden", "1"),
    ]);
    cmds
}

/// macOS: the gid of the group `name`, when it exists.
fn macos_group(name: &str) -> Option<u32> {
    let argv: Vec<String> = [
        "dscl",
        ".",
        "-read",
        &format!("/Groups/{name}"),
        "PrimaryGroupID",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    super::command::command_output(&argv)
        .ok()?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// macOS: the highest free id below 500 that is neither a uid nor a gid (system
/// accounts live there, and the GUI hides them).
fn free_macos_id() -> Result<u32, InstallError> {
    let used = |path: &str, key: &str| -> Result<Vec<u32>, InstallError> {
        let argv: Vec<String> = ["dscl", ".", "-list", path, key]
            .iter()
            .map(|s| s.to_string())
            .collect();
        Ok(super::command::command_output(&argv)?
            .lines()
            .filter_map(|l| l.split_whitespace().last()?.parse().ok())
            .collect())
    };
    let mut taken = used("/Users", "UniqueID")?;
    taken.extend(used("/Groups", "PrimaryGroupID")?);
    (300..500)
        .rev()
        .find(|id| !taken.contains(id))
        .ok_or_else(|| InstallError::Invalid("no free id between 300 and 499 for the runner's account: create it by hand and give --runner-user".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passwd_file_is_searched_by_whole_name() {
        let dir = tempfile::tempdir().unwrap();
        let passwd = dir.path().join("passwd");
        std::fs::write(
            &passwd,
            "root:x:0:0:root:/root:/bin/bash\nrailgrid-x:x:998:998::/:/usr/sbin/nologin\nrailgrid:x:999:999::/var/lib/railgrid/runner:/usr/sbin/nologin\n",
        )
        .unwrap();
        assert_eq!(uid_in_passwd(&passwd, "railgrid").unwrap(), Some(999));
        assert_eq!(uid_in_passwd(&passwd, "railgri").unwrap(), None);
        assert_eq!(uid_in_passwd(&passwd, "root").unwrap(), Some(0));
        assert_eq!(
            uid_in_passwd(&dir.path().join("none"), "root").unwrap(),
            None
        );
    }

    #[test]
    fn root_and_odd_names_are_refused() {
        assert!(matches!(
            check_name("root"),
            Err(InstallError::RootRunner { .. })
        ));
        for bad in ["", "-x", "Build", "a b", "a:b", &"x".repeat(33)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["railgrid", "_railgrid", "build-17"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn the_macos_account_is_hidden_without_a_shell_or_password() {
        let cmds = dscl_commands(
            "_railgrid",
            Path::new("/var/lib/railgrid/runner"),
            499,
            None,
        );
        let flat: Vec<String> = cmds.iter().map(|c| c.join(" ")).collect();
        assert!(flat.contains(&"dscl . -create /Users/_railgrid UniqueID 499".to_owned()));
        assert!(
            flat.contains(&"dscl . -create /Users/_railgrid UserShell /usr/bin/false".to_owned())
        );
        assert!(flat.contains(&"dscl . -create /Users/_railgrid Password *".to_owned()));
        assert!(flat.contains(
            &"dscl . -create /Users/_railgrid NFSHomeDirectory /var/lib/railgrid/runner".to_owned()
        ));
        assert!(
            flat[0].starts_with("dscl . -create /Groups/_railgrid PrimaryGroupID 499"),
            "the group first"
        );
        let with_group = dscl_commands("_railgrid", Path::new("/x"), 499, Some(20));
        assert!(
            with_group.iter().all(|c| !c.join(" ").contains("/Groups/")),
            "an existing group is left alone"
        );
        assert!(with_group
            .iter()
            .any(|c| c.join(" ") == "dscl . -create /Users/_railgrid PrimaryGroupID 20"));
    }
}
