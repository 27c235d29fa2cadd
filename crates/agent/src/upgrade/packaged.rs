//! A binary the system's package manager installed is the package manager's to replace
//! (docs/upgrade.md, "Hosts installed from the Debian package"): the agent never renames
//! another file over it, so `dpkg --verify` stays clean and an `apt install` of a newer
//! package is never undone by a rollout, nor a rollout by the next `apt upgrade`.

use std::path::Path;

/// dpkg's lists of what each installed package owns.
const DPKG_INFO: &str = "/var/lib/dpkg/info";

/// The package whose files include `exe`, by dpkg's database; `None` where there is no
/// dpkg or no package owns it (an `agent install`, a binary copied by hand).
pub(super) fn dpkg_owner(exe: &Path) -> Option<String> {
    dpkg_owner_in(Path::new(DPKG_INFO), exe)
}

fn dpkg_owner_in(info: &Path, exe: &Path) -> Option<String> {
    let exe = exe.to_str()?;
    // dpkg lists paths as the package shipped them: /usr/bin, or /bin on a merged /usr.
    let also = exe.strip_prefix("/usr");
    for entry in std::fs::read_dir(info).ok()?.flatten() {
        let name = entry.file_name();
        let Some(package) = name.to_str().and_then(|n| n.strip_suffix(".list")) else {
            continue;
        };
        let Ok(list) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        if list.lines().any(|l| l == exe || Some(l) == also) {
            // `name:arch` for a package of a foreign architecture.
            return Some(package.split(':').next().unwrap_or(package).to_owned());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_is_the_packages_that_lists_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("coreutils.list"), "/.\n/bin\n/bin/true\n").unwrap();
        std::fs::write(
            dir.path().join("railgrid:amd64.list"),
            "/.\n/usr\n/usr/bin\n/usr/bin/railgrid\n",
        )
        .unwrap();
        let owner = |p: &str| dpkg_owner_in(dir.path(), Path::new(p));
        assert_eq!(owner("/usr/bin/railgrid").as_deref(), Some("railgrid"));
        assert_eq!(owner("/usr/bin/true").as_deref(), Some("coreutils"));
        assert_eq!(owner("/usr/local/bin/railgrid"), None);
        assert_eq!(
            dpkg_owner_in(&dir.path().join("none"), Path::new("/usr/bin/railgrid")),
            None
        );
    }
}
