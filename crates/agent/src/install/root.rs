//! Host paths, as install and uninstall reach them: on the host itself, or under an image
//! directory (`--root`).
//!
//! Every path comes from somewhere an attacker of an image may have written (a config's
//! `state_dir`, the manifest, the unit): a host path must be absolute and plain (no `..`,
//! no `.`), and under `--root` no component below the root may be a symlink, so that
//! nothing is read, written or removed outside the image.

use std::path::{Component, Path, PathBuf};

use super::InstallError;
use crate::file_error::FileError;

pub(super) struct Root(pub(super) Option<PathBuf>);

impl Root {
    /// Checks `--root`: an existing directory, named absolutely.
    pub(super) fn new(root: Option<PathBuf>) -> Result<Self, InstallError> {
        // `--root /srv/img/` is `/srv/img`.
        let root = root.map(|r| {
            let trimmed = r.to_string_lossy().trim_end_matches('/').to_owned();
            if trimmed.is_empty() {
                PathBuf::from("/")
            } else {
                PathBuf::from(trimmed)
            }
        });
        if let Some(dir) = &root {
            let plain = check_host_path(dir).is_ok();
            if !plain || !dir.is_dir() {
                return Err(InstallError::Invalid(format!(
                    "--root {}: give the absolute path of an existing directory",
                    dir.display()
                )));
            }
            // Whoever could rename DIR, or a directory below it, could swap in a link
            // between a check and a write: DIR and every directory above it must be
            // root's, and not writable by others (a sticky /tmp is fine above it).
            for (i, a) in dir.ancestors().enumerate() {
                check_meta(a, i > 0)?;
            }
        }
        Ok(Self(root))
    }

    /// Takes the install lock of this root (the root directory itself, flocked): two
    /// installs or uninstalls at once on one host or image would interleave their steps.
    pub(super) fn lock(&self) -> Result<std::fs::File, InstallError> {
        let dir = self.0.clone().unwrap_or_else(|| PathBuf::from("/"));
        let file = std::fs::File::open(&dir).map_err(FileError::read(&dir))?;
        match fs4::FileExt::try_lock(&file) {
            Ok(()) => Ok(file),
            Err(fs4::TryLockError::WouldBlock) => Err(InstallError::Invalid(format!(
                "another railgrid agent install or uninstall is running on {}: wait for it, then run this again",
                dir.display()
            ))),
            Err(fs4::TryLockError::Error(source)) => Err(FileError::Read { path: dir, source }.into()),
        }
    }

    pub(super) fn on_host(&self) -> bool {
        self.0.is_none()
    }

    /// Where `host` is, checked: a plain absolute path, and under `--root` one reached
    /// through no symlink.
    pub(super) fn at(&self, host: impl AsRef<Path>) -> Result<PathBuf, InstallError> {
        let host = host.as_ref();
        check_host_path(host)?;
        let Some(root) = &self.0 else {
            return Ok(host.to_owned());
        };
        let parts: Vec<Component<'_>> = host.components().skip(1).collect();
        let mut path = root.clone();
        for (i, part) in parts.iter().enumerate() {
            path.push(part);
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(InstallError::Invalid(format!(
                        "{} is a symlink: under --root, install and uninstall follow none, so that nothing outside {} is touched",
                        path.display(),
                        root.display()
                    )))
                }
                Ok(_) => {}
                // The rest does not exist yet: nothing below can be a link.
                Err(_) => {
                    parts[i + 1..].iter().for_each(|p| path.push(p));
                    return Ok(path);
                }
            }
        }
        Ok(path)
    }

    /// The ancestors of `host` (itself included) that do not exist yet, parents first.
    pub(super) fn missing_dirs(&self, host: &Path) -> Result<Vec<PathBuf>, InstallError> {
        let mut missing = Vec::new();
        for a in host.ancestors().filter(|a| a.parent().is_some()) {
            if self.at(a)?.exists() {
                break;
            }
            missing.push(a.to_owned());
        }
        missing.reverse();
        Ok(missing)
    }
}

impl Root {
    /// Refuses `host` (and every directory above it, below the root) when an account
    /// other than root (or this one) owns it or may write it: root would run, or read
    /// secrets from, what that account put there.
    pub(super) fn check_trusted(&self, host: &Path) -> Result<(), InstallError> {
        let chain: Vec<&Path> = host.ancestors().collect();
        for h in chain.iter().rev() {
            let path = self.at(h)?;
            if !path.exists() {
                break;
            }
            check_meta(&path, false)?;
        }
        Ok(())
    }
}

/// Refuses `path` when an account other than root (or this one) owns it or may write
/// it (its mode, or an ACL); `sticky_ok`: a sticky world-writable directory (/tmp) is
/// fine, as no one else may rename what is in it.
pub(super) fn check_meta(path: &Path, sticky_ok: bool) -> Result<(), InstallError> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    let (euid, _) = crate::sys::current_ids();
    let mode = meta.mode() & 0o7777;
    let owner_ok = meta.uid() == 0 || meta.uid() == euid;
    let others_write = mode & 0o002 != 0 || (mode & 0o020 != 0 && meta.gid() != 0);
    let sticky = mode & 0o1000 != 0;
    let acl = crate::sys::has_access_acl(path);
    if !owner_ok || (others_write && !(sticky_ok && sticky)) || (acl && !(sticky_ok && sticky)) {
        return Err(InstallError::Invalid(format!(
            "{} is owned by uid {} with mode {mode:04o}{}: an account other than root could replace what root runs or reads there; make it root's and not writable by others (chown root {}; chmod go-w {}{}), or choose another --prefix or --root",
            path.display(),
            meta.uid(),
            if acl { " and an ACL" } else { "" },
            path.display(),
            path.display(),
            if acl { format!("; setfacl -b {}", path.display()) } else { String::new() }
        )));
    }
    Ok(())
}

/// Reads a regular file of at most `cap` bytes; `None` when there is none. Anything else
/// in its place (a directory, a FIFO, a device, a link) is refused before it is opened,
/// and the read is bounded whatever the file became since.
pub(super) fn read_regular(path: &Path, cap: u64) -> Result<Option<Vec<u8>>, InstallError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(InstallError::NoAccess {
                path: path.to_owned(),
            })
        }
        Err(source) => {
            return Err(FileError::Read {
                path: path.to_owned(),
                source,
            }
            .into())
        }
    };
    if !meta.is_file() || meta.len() > cap {
        return Err(InstallError::Invalid(format!(
            "{} is not a regular file of at most {cap} bytes: move it away",
            path.display()
        )));
    }
    let read = || -> std::io::Result<Vec<u8>> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)?;
        if !f.metadata()?.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        let mut bytes = Vec::new();
        f.take(cap).read_to_end(&mut bytes)?;
        Ok(bytes)
    };
    match read() {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(InstallError::NoAccess {
            path: path.to_owned(),
        }),
        Err(source) => Err(FileError::Read {
            path: path.to_owned(),
            source,
        }
        .into()),
    }
}

/// A host path as install writes and removes them: absolute, with no `.` or `..`.
pub(super) fn check_host_path(path: &Path) -> Result<(), InstallError> {
    let plain = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && path.as_os_str().len() == path.components().collect::<PathBuf>().as_os_str().len();
    if plain {
        Ok(())
    } else {
        Err(InstallError::Invalid(format!(
            "{}: not a plain absolute path (no ., .., // or trailing /)",
            path.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_could_leave_the_root_are_refused() {
        for bad in ["relative", "/a/../b", "/a/./b", "/a//b", "/a/b/", "/.."] {
            assert!(check_host_path(Path::new(bad)).is_err(), "{bad}");
        }
        assert!(check_host_path(Path::new("/var/lib/railgrid")).is_ok());
        assert!(check_host_path(Path::new("/")).is_ok());
    }

    #[test]
    fn no_symlink_is_followed_under_a_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("img");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("etc/railgrid")).unwrap();
        let r = Root::new(Some(root.clone())).unwrap();
        assert_eq!(r.at("/etc").unwrap(), root.join("etc"));
        assert_eq!(r.at("/usr/local/bin").unwrap(), root.join("usr/local/bin"));
        let err = r.at("/etc/railgrid/agent.toml").unwrap_err().to_string();
        assert!(err.contains("is a symlink"), "{err}");
        assert!(r.at("/etc/railgrid").is_err(), "the link itself");
        assert!(r.at("/var/../etc").is_err());
        assert_eq!(
            r.missing_dirs(Path::new("/usr/local/bin")).unwrap(),
            [
                Path::new("/usr"),
                Path::new("/usr/local"),
                Path::new("/usr/local/bin")
            ]
        );
    }
}
