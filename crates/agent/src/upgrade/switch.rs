//! The switch (see the module's doc): the running binary kept as `<exe>.prev`, the watcher
//! started from it, the new file renamed over `<exe>`; and its undo when the agent stops
//! before it re-executes.

use std::path::{Path, PathBuf};

use super::record::{self, Kind, Phase};
use super::*;
use crate::sys::dirfd::Dir;
use crate::sys::exe::PinnedExe;

/// `<exe>.prev`.
pub fn prev_path(exe: &Path) -> PathBuf {
    let mut s = exe.as_os_str().to_owned();
    s.push(".prev");
    PathBuf::from(s)
}

/// [`undo_switch`] for the caller of [`crate::run`], once the agent has stopped.
pub fn undo_switch_after_stop(state_dir: &Path, switch: &Switch) {
    undo_switch(state_dir, switch);
}

/// Puts the previous binary back after a switch the agent will not re-exec into.
pub(crate) fn undo_switch(state_dir: &Path, switch: &Switch) {
    let outcome = record::update(state_dir, |r| {
        let Some(u) = r.upgrade.as_mut() else {
            return (false, Ok(()));
        };
        if u.to_sha256 != switch.exe.identity().sha256 || u.phase != Phase::Pending {
            return (false, Ok(()));
        }
        let prev = prev_path(&u.exe);
        let restored = match (exe_dir(&u.exe), exe_dir(&prev)) {
            (Ok((dir, name)), Ok((_, prev_name))) => Dir::open(&dir)
                .and_then(|d| d.rename(&prev_name, &name).and_then(|()| d.sync()))
                .map_err(|e| {
                    format!(
                        "could not rename {} over {}: {e}",
                        prev.display(),
                        u.exe.display()
                    )
                }),
            _ => Err(format!("{} has no directory", u.exe.display())),
        };
        u.phase = Phase::Aborted;
        u.reason = Some(match &restored {
            Ok(()) => "the agent was stopped during the switch; the previous binary is back".into(),
            Err(e) => format!("the agent was stopped during the switch; {e}"),
        });
        u.finished_at = Some(crate::util::unix_now());
        (true, restored)
    });
    match outcome {
        Ok(Ok(())) => tracing::info!("stopped during the switch: the previous binary is back"),
        Ok(Err(e)) => tracing::error!(error = %e, "stopped during the switch"),
        Err(e) => tracing::error!(error = %crate::error_chain(&e), "stopped during the switch"),
    }
}

impl UpgradeTask {
    /// The switch (see the module's doc). `download`: the new file's name in the
    /// executable's directory (a hub upgrade); `None` when it is at the path already.
    pub(super) async fn switch(
        &mut self,
        kind: Kind,
        new: PinnedExe,
        download: Option<&str>,
        version: &str,
    ) -> Result<Switch, UpgradeError> {
        self.set(SWITCHING, Some(version), None);
        let cfg = &self.ctx.cfg;
        let exe = self.ctx.exe.clone();
        let exe_path = exe.path().to_owned();
        let (dir_path, name) = exe_dir(&exe_path)?;
        let now = crate::util::unix_now();
        // The runner's stop comes after the switch and before the new agent starts: the
        // deadline leaves room for it.
        let stop = cfg.runner.stop_grace + crate::reconciler::REAP_TIMEOUT;
        let upgrade = Upgrade {
            phase: Phase::Switching,
            kind,
            from: build_info::VERSION.to_owned(),
            from_sha256: exe.identity().sha256.clone(),
            to: version.to_owned(),
            to_sha256: new.identity().sha256.clone(),
            exe: exe_path.clone(),
            started_at: now,
            deadline: now + (stop + cfg.upgrade.deadline).as_secs(),
            attempts: 0,
            agent_pid: std::process::id(),
            agent_start_time: sys_start_time(),
            watcher_pid: None,
            watcher_start_time: None,
            execed_at: None,
            hub_wait: cfg.upgrade.hub_wait.as_secs(),
            healthy_at: None,
            hub_away_at: None,
            blameless: false,
            reason: None,
            finished_at: None,
        };
        let state_dir = cfg.state_dir.clone();
        let log = service::log_path(&cfg.log_dir);
        let service = Service::detect();
        let stop_timeout = stop + Duration::from_secs(5);
        let download = download.map(str::to_owned);
        let to_sha = upgrade.to_sha256.clone();
        let stopping = self.stopping.clone();
        if *stopping.borrow() {
            return Err(UpgradeError::Stopping);
        }
        let result = tokio::task::spawn_blocking(move || {
            record::update(&state_dir, |r| {
                r.upgrade = Some(upgrade);
                (true, ())
            })?;
            let dir = Dir::open(&dir_path).map_err(|source| UpgradeError::Io {
                path: dir_path.clone(),
                source,
            })?;
            keep_prev(&dir, &dir_path, &name, &exe)?;
            let prev = prev_path(&exe_path);
            let agent_args: Vec<OsString> = std::env::args_os().skip(1).collect();
            watcher::launch(
                &prev,
                &state_dir,
                &to_sha,
                &service,
                stop_timeout,
                &log,
                &agent_args,
            )
            .map_err(UpgradeError::Watcher)?;
            // Nothing is renamed before the watcher is known to run: it records itself.
            let until = Instant::now() + WATCHER_START;
            loop {
                let rec = record::peek(&state_dir)?;
                if rec
                    .upgrade
                    .as_ref()
                    .is_some_and(|u| u.to_sha256 == to_sha && u.watcher_pid.is_some())
                {
                    break;
                }
                if Instant::now() >= until {
                    return Err(UpgradeError::Watcher(std::io::Error::other(format!(
                        "it did not start within {}",
                        humantime::format_duration(WATCHER_START)
                    ))));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // The last moment a stop can still keep the previous binary in place.
            if *stopping.borrow() {
                return Err(UpgradeError::Stopping);
            }
            if let Some(download) = &download {
                dir.rename(download, &name)
                    .and_then(|()| dir.sync())
                    .map_err(|source| UpgradeError::Io {
                        path: exe_path.clone(),
                        source,
                    })?;
            }
            let pending = record::update(&state_dir, |r| match r.upgrade.as_mut() {
                Some(u) if u.to_sha256 == to_sha && u.phase == Phase::Switching => {
                    u.phase = Phase::Pending;
                    (true, true)
                }
                _ => (false, false),
            })?;
            if !pending {
                return Err(UpgradeError::Superseded);
            }
            Ok::<_, UpgradeError>(())
        })
        .await
        .map_err(|source| UpgradeError::Task {
            what: "switch",
            source,
        })?;
        if let Err(e) = result {
            // Nothing was renamed over the executable: close the record, so that the
            // watcher (if it started) exits and the next attempt starts clean.
            let dir = self.ctx.cfg.state_dir.clone();
            let why = crate::error_chain(&e);
            let _ = tokio::task::spawn_blocking(move || {
                record::update(&dir, |r| match r.upgrade.as_mut() {
                    Some(u) if u.phase == Phase::Switching => {
                        u.phase = Phase::Aborted;
                        u.reason = Some(format!("the switch failed: {why}"));
                        u.finished_at = Some(crate::util::unix_now());
                        (true, ())
                    }
                    _ => (false, ()),
                })
            })
            .await;
            return Err(e);
        }
        tracing::info!(from = build_info::VERSION, to = %version, kind = ?kind, "the new binary is in place: stopping the runner and re-executing");
        Ok(Switch {
            exe: new,
            at: self.ctx.exe.path().to_owned(),
            to: version.to_owned(),
        })
    }
}

/// Keeps the running binary's bytes as `<exe>.prev`: a hard link when the path still
/// names the running file, else a copy from the pinned descriptor; then checks it.
fn keep_prev(dir: &Dir, dir_path: &Path, name: &str, exe: &PinnedExe) -> Result<(), UpgradeError> {
    let prev = format!("{name}.prev");
    let tmp = format!(".{name}.prev.tmp");
    let io = |source| UpgradeError::Io {
        path: dir_path.join(&prev),
        source,
    };
    let _ = dir.remove_file(&tmp);
    let id = exe.identity();
    let running = Some((id.device, id.inode));
    // Left by a switch that stopped before its rename: `.prev` is the running file
    // already (renaming a second name of the same file over it would do nothing).
    if dir.identify(&prev).map_err(io)? == running {
        return Ok(());
    }
    let same = dir.identify(name).map_err(io)? == running;
    if same {
        dir.link(name, &tmp).map_err(io)?;
    } else {
        let mut f = dir.create_new_file(&tmp, 0o755).map_err(io)?;
        // Exactly 0755, whatever the umask: the runner's account executes it after a
        // rollback.
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o755))
            .map_err(io)?;
        if let Err(e) = exe.copy_to(&mut f) {
            let _ = dir.remove_file(&tmp);
            return Err(io(e));
        }
    }
    dir.rename(&tmp, &prev)
        .and_then(|()| dir.sync())
        .map_err(io)?;
    // Gone after the rename, unless both names were one file already.
    let _ = dir.remove_file(&tmp);
    let check = PinnedExe::open(&dir_path.join(&prev)).map_err(|source| UpgradeError::Pin {
        path: dir_path.join(&prev),
        source,
    })?;
    if check.identity().sha256 != id.sha256 {
        return Err(UpgradeError::Hash {
            path: dir_path.join(&prev),
            want: id.sha256.clone(),
            got: check.identity().sha256.clone(),
        });
    }
    Ok(())
}

/// The directory and file name of the executable.
pub(super) fn exe_dir(exe: &Path) -> Result<(PathBuf, String), UpgradeError> {
    match (exe.parent(), exe.file_name().and_then(|n| n.to_str())) {
        (Some(d), Some(n)) if !d.as_os_str().is_empty() => Ok((d.to_owned(), n.to_owned())),
        _ => Err(UpgradeError::NoDir {
            path: exe.to_owned(),
        }),
    }
}

/// `.<name>.<version>.download`: hidden, and one per version, so a download resumes
/// only the version it was.
pub(super) fn download_name(name: &str, version: &str) -> String {
    format!(".{name}.{version}.download")
}

/// Removes downloads of other versions left by earlier attempts.
pub(super) fn remove_stale_downloads(dir: &Path, name: &str, keep: &str) {
    let prefix = format!(".{name}.");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let n = e.file_name();
        let Some(n) = n.to_str() else { continue };
        if n.starts_with(&prefix) && n.ends_with(".download") && n != keep {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn exe_in(dir: &Path, name: &str, bytes: &[u8]) -> PinnedExe {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        PinnedExe::open(&path).expect("pin")
    }

    #[test]
    fn the_previous_binary_is_a_link_while_the_path_names_the_running_file_and_a_copy_after() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let exe = exe_in(tmp.path(), "railgrid", b"#!/bin/sh\necho one\n");
        let dir = Dir::open(tmp.path()).expect("dir");
        keep_prev(&dir, tmp.path(), "railgrid", &exe).expect("keep");
        let (cur, prev) = (
            tmp.path().join("railgrid"),
            tmp.path().join("railgrid.prev"),
        );
        let ino = |p: &Path| std::fs::metadata(p).expect("stat").ino();
        assert_eq!(ino(&cur), ino(&prev), "a second name of the running file");
        // Kept again (a switch that stopped before its rename): nothing changes.
        keep_prev(&dir, tmp.path(), "railgrid", &exe).expect("again");
        assert_eq!(ino(&cur), ino(&prev));

        // The path replaced by other bytes: `.prev` is a copy of the pinned ones, 0755.
        std::fs::remove_file(&prev).expect("rm");
        std::fs::remove_file(&cur).expect("rm");
        std::fs::write(&cur, b"other bytes").expect("replace");
        keep_prev(&dir, tmp.path(), "railgrid", &exe).expect("copy");
        assert_eq!(
            std::fs::read(&prev).expect("read"),
            b"#!/bin/sh\necho one\n"
        );
        let mode = std::fs::metadata(&prev).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert!(!tmp.path().join(".railgrid.prev.tmp").exists());
    }

    #[test]
    fn downloads_of_other_versions_go_and_the_one_in_use_stays() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let keep = download_name("railgrid", "1.2.0");
        assert_eq!(keep, ".railgrid.1.2.0.download");
        for n in [
            keep.as_str(),
            ".railgrid.1.1.0.download",
            ".other.1.1.0.download",
            "railgrid",
        ] {
            std::fs::write(tmp.path().join(n), b"x").expect("write");
        }
        remove_stale_downloads(tmp.path(), "railgrid", &keep);
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        left.sort();
        assert_eq!(left, [".other.1.1.0.download", keep.as_str(), "railgrid"]);
    }

    #[test]
    fn the_executable_needs_a_directory_and_a_name() {
        assert_eq!(
            exe_dir(Path::new("/usr/local/bin/railgrid")).expect("split"),
            (PathBuf::from("/usr/local/bin"), "railgrid".to_owned())
        );
        assert!(exe_dir(Path::new("railgrid")).is_err());
        assert!(exe_dir(Path::new("/")).is_err());
        assert_eq!(
            prev_path(Path::new("/usr/local/bin/railgrid")),
            PathBuf::from("/usr/local/bin/railgrid.prev")
        );
    }
}
