//! Would the child's account be allowed to reach a path? Checked by the supervisor (often
//! root, which may go anywhere) before anything starts, so a child that could never run is
//! refused at construction with the directory that blocks it, not at every restart.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The account whose permissions count.
#[derive(Debug, Clone)]
pub struct Who {
    pub uid: u32,
    pub groups: Vec<u32>,
}

/// Where access stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// The path that lacks the permission.
    pub at: PathBuf,
    pub mode: u32,
    pub owner: u32,
    /// "search" for a directory, "execute" for the program.
    pub need: &'static str,
}

impl Who {
    fn allows(&self, meta: &fs::Metadata, bits_for_other: u32) -> bool {
        let mode = meta.permissions().mode();
        let shift = if meta.uid() == self.uid {
            6
        } else if self.groups.contains(&meta.gid()) {
            3
        } else {
            0
        };
        mode & (bits_for_other << shift) != 0
    }

    /// Every directory from the root down to `path` (included when `path_is_dir`) must be
    /// searchable. Paths that cannot be read are left to fail later, with the OS's error.
    pub fn can_reach(&self, path: &Path, path_is_dir: bool) -> Result<(), Denied> {
        let mut dirs: Vec<&Path> = path.ancestors().skip(1).collect();
        dirs.reverse();
        if path_is_dir {
            dirs.push(path);
        }
        for dir in dirs {
            let Ok(meta) = fs::metadata(dir) else {
                continue;
            };
            if !self.allows(&meta, 0o001) {
                return Err(Denied {
                    at: dir.to_owned(),
                    mode: meta.permissions().mode() & 0o7777,
                    owner: meta.uid(),
                    need: "search",
                });
            }
        }
        Ok(())
    }

    /// `program` is reachable and executable.
    pub fn can_execute(&self, program: &Path) -> Result<(), Denied> {
        self.can_reach(program, false)?;
        if let Ok(meta) = fs::metadata(program) {
            self.can_execute_file(program, &meta)?;
        }
        Ok(())
    }

    /// The file with `meta` (named `at` in errors) is executable, whatever its path.
    pub fn can_execute_file(&self, at: &Path, meta: &fs::Metadata) -> Result<(), Denied> {
        if !self.allows(meta, 0o001) {
            return Err(Denied {
                at: at.to_owned(),
                mode: meta.permissions().mode() & 0o7777,
                owner: meta.uid(),
                need: "execute",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_directory_blocks_others() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("inner");
        fs::create_dir(&inner).unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        let me = Who {
            uid: fs::metadata(dir.path()).unwrap().uid(),
            groups: vec![],
        };
        assert_eq!(me.can_reach(&inner, true), Ok(()));
        let stranger = Who {
            uid: 4_000_000,
            groups: vec![],
        };
        let denied = stranger.can_reach(&inner, true).unwrap_err();
        assert_eq!(denied.at, dir.path());
        assert_eq!(denied.mode, 0o700);
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(stranger.can_reach(&inner, true), Ok(()));
    }
}
