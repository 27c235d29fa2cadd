//! A job's workspace: made fresh under the workspace root (never adopting what is there),
//! and its working directory opened once, beneath it and through no symlink; that
//! descriptor is what is checked and what the child `fchdir`s to.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{io_err, JobError, JobPaths};
use crate::sys::dirfd::Dir;
use crate::sys::errno::{self, Failure};

/// A job's workspace and working directory, open.
#[derive(Debug)]
pub struct Workspace {
    /// `<work>/<id>`.
    pub dir: Dir,
    /// The spec's `cwd`, when it names one.
    pub cwd: Option<Dir>,
    /// Where that is, relative to the work root (`..` folded: no symlink on the way).
    pub cwd_rel: Option<PathBuf>,
}

impl Workspace {
    /// Where the job starts.
    pub fn cwd(&self) -> &Dir {
        self.cwd.as_ref().unwrap_or(&self.dir)
    }
}

/// Creates the job's workspace (0700, with a `tmp` inside) and opens it and the job's
/// working directory. `cwd` is relative to the workspace, or absolute under the work root;
/// either way it is opened beneath the work root with no symlink at any component, so
/// neither `..` nor a symlink (nor one swapped in while this runs) can lead out of it. The
/// work root itself is refused: from there a job could reach every workspace.
///
/// With `fresh` (a job being admitted), the workspace must not exist yet: a directory
/// already there under a new job's id is someone else's (a shared checkout), never
/// adopted. At the job's start it may (the admission made it).
pub fn prepare_workspace(
    paths: &JobPaths,
    id: &str,
    cwd: Option<&str>,
    fresh: bool,
) -> Result<Workspace, JobError> {
    let ws = paths.workspace(id);
    // Made and opened by descriptor, never through a symlink: another job can write in
    // the work root (without Landlock) and plant one where this workspace should be.
    let planted = |path: PathBuf| {
        move |e: io::Error| JobError::Io {
            path,
            source: match errno::failure(&e) {
                Failure::Symlink | Failure::NotDirectory => {
                    io::Error::new(io::ErrorKind::InvalidInput, "not a directory (a symlink?)")
                }
                _ => e,
            },
        }
    };
    let dir = if fresh {
        paths.work.create_child(id, 0o700).map_err(|e| {
            if errno::failure(&e) == Failure::Exists {
                JobError::WorkspaceExists {
                    id: id.to_owned(),
                    path: ws.clone(),
                }
            } else {
                planted(ws.clone())(e)
            }
        })?
    } else {
        paths
            .work
            .make_child(id, 0o700)
            .map_err(planted(ws.clone()))?
    };
    dir.make_child("tmp", 0o700)
        .map_err(planted(ws.join("tmp")))?;
    let Some(cwd) = cwd else {
        return Ok(Workspace {
            dir,
            cwd: None,
            cwd_rel: None,
        });
    };
    let outside = |resolved: PathBuf| JobError::CwdOutside {
        cwd: cwd.to_owned(),
        resolved,
        root: paths.work_root.clone(),
    };
    let rel = if Path::new(cwd).is_absolute() {
        let canonical = fs::canonicalize(&paths.work_root).ok();
        let under = Path::new(cwd)
            .strip_prefix(&paths.work_root)
            .ok()
            .or_else(|| {
                canonical
                    .as_deref()
                    .and_then(|c| Path::new(cwd).strip_prefix(c).ok())
            });
        match under {
            Some(rel) if !rel.as_os_str().is_empty() => rel.to_owned(),
            Some(_) => return Err(outside(paths.work_root.clone())),
            None => return Err(outside(lexical_normal(Path::new(cwd)))),
        }
    } else {
        Path::new(id).join(cwd)
    };
    let wanted = paths.work_root.join(&rel);
    let opened = paths
        .work
        .open_beneath(&rel)
        .map_err(|e| match errno::failure(&e) {
            Failure::Outside => outside(lexical_normal(&wanted)),
            Failure::Symlink => JobError::CwdSymlink {
                cwd: cwd.to_owned(),
                path: wanted.clone(),
            },
            Failure::NotFound => JobError::CwdMissing {
                cwd: cwd.to_owned(),
                path: wanted.clone(),
            },
            Failure::NotDirectory => JobError::CwdNotDir {
                cwd: cwd.to_owned(),
                path: wanted.clone(),
            },
            Failure::Denied | Failure::NameTooLong => JobError::CwdDenied {
                cwd: cwd.to_owned(),
                path: wanted.clone(),
                source: e,
            },
            _ => io_err(&wanted)(e),
        })?;
    if opened.same_as(&paths.work).map_err(io_err(&wanted))? {
        return Err(outside(paths.work_root.clone()));
    }
    // Opened, but can the job enter it? (O_PATH needs no search permission; fchdir does.)
    opened.searchable().map_err(|source| JobError::CwdDenied {
        cwd: cwd.to_owned(),
        path: wanted.clone(),
        source,
    })?;
    Ok(Workspace {
        dir,
        cwd: Some(opened),
        cwd_rel: Some(lexical_normal(&rel)),
    })
}

/// `path` with `.` and `..` folded by spelling alone (no symlinks consulted).
fn lexical_normal(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(dir: &Path) -> JobPaths {
        JobPaths::open(dir).unwrap()
    }

    /// As at a job's start: the workspace may exist.
    fn prepare_workspace_t(
        p: &JobPaths,
        id: &str,
        cwd: Option<&str>,
    ) -> Result<Workspace, JobError> {
        prepare_workspace(p, id, cwd, false)
    }

    #[test]
    fn a_new_job_never_adopts_a_directory_already_under_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        fs::create_dir(p.workspace("shared")).unwrap();
        fs::write(p.workspace("shared").join("keep"), "").unwrap();
        assert!(matches!(
            prepare_workspace(&p, "shared", Some("missing"), true),
            Err(JobError::WorkspaceExists { .. })
        ));
        assert!(p.workspace("shared").join("keep").exists());
        assert!(prepare_workspace(&p, "new", None, true).is_ok());
        assert!(prepare_workspace(&p, "new", None, false).is_ok());
    }

    #[test]
    fn a_planted_workspace_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        std::os::unix::fs::symlink(dir.path(), p.workspace("victim")).unwrap();
        assert!(matches!(
            prepare_workspace_t(&p, "victim", None),
            Err(JobError::Io { .. })
        ));
    }

    #[test]
    fn cwd_escapes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = paths(dir.path());
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("../../etc")),
            Err(JobError::CwdOutside { .. })
        ));
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("/etc")),
            Err(JobError::CwdOutside { .. })
        ));
        std::os::unix::fs::symlink("/etc", p.workspace("a").join("link")).unwrap();
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("link")),
            Err(JobError::CwdSymlink { .. })
        ));
        fs::create_dir(p.workspace("a").join("src")).unwrap();
        // Even a symlink that stays inside is refused: it could be swapped at any moment.
        std::os::unix::fs::symlink("src", p.workspace("a").join("inner")).unwrap();
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("inner")),
            Err(JobError::CwdSymlink { .. })
        ));
        fs::write(p.workspace("a").join("file"), "").unwrap();
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("file")),
            Err(JobError::CwdNotDir { .. })
        ));
        let ws = prepare_workspace_t(&p, "a", Some("src")).unwrap();
        let src = Dir::open(&p.workspace("a").join("src")).unwrap();
        assert!(ws.cwd().same_as(&src).unwrap());
        let abs = p.workspace("a").join("src");
        let ws = prepare_workspace_t(&p, "b", Some(abs.to_str().unwrap())).unwrap();
        assert!(ws.cwd().same_as(&src).unwrap());
        // Another job's workspace is inside the root too: allowed, like a shared checkout.
        assert!(prepare_workspace_t(&p, "b", Some("../a/src")).is_ok());
        // The root itself is not.
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("..")),
            Err(JobError::CwdOutside { .. })
        ));
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("missing")),
            Err(JobError::CwdMissing { .. })
        ));
        assert!(matches!(
            prepare_workspace_t(&p, "a", Some("../../nonexistent")),
            Err(JobError::CwdOutside { .. })
        ));
    }
}
