//! A plan: the steps one command takes, each shown as it is done.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use super::command::run_command;
use super::manager::Cmd;
use super::{account, InstallError};
use crate::file_error::FileError;
use crate::sys::exe::PinnedExe;

/// What a step does to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Create,
    Update,
    Keep,
    Run,
    Remove,
    Skip,
}

impl Verb {
    pub fn word(self) -> &'static str {
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

pub(super) enum Action {
    None,
    /// Created, or its mode set, when it exists.
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
    /// Everything in `path` but `keep`, which goes last by a step of its own.
    EmptyDirExcept {
        path: PathBuf,
        keep: &'static str,
    },
    /// Refuses to go on while an agent holds the state directory (checked once the
    /// service is stopped, right before the purge).
    EnsureNoHolder {
        state_dir: PathBuf,
    },
}

/// How long a command marked `retry` is tried: launchd's stop timeout and a margin.
const RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(100);

/// One line of the plan.
pub struct Step {
    pub verb: Verb,
    /// The path, account or command.
    pub subject: String,
    /// Why, or what changes.
    pub detail: String,
    pub(super) action: Action,
}

impl Step {
    pub(super) fn new(
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
    pub fn removes_tree(&self) -> bool {
        matches!(self.action, Action::RemoveTree { .. })
    }

    /// `  create  /etc/railgrid/agent.toml (0600): runner.user = "railgrid"`.
    pub fn line(&self) -> String {
        let mut line = format!("  {:<7} {}", self.verb.word(), self.subject);
        if !self.detail.is_empty() {
            let _ = write!(line, ": {}", self.detail);
        }
        line
    }
}

/// Everything one command does, in order.
pub struct Plan {
    pub title: String,
    pub steps: Vec<Step>,
    /// Said after the steps (what the plan leaves to the operator).
    pub notes: Vec<String>,
    /// The root's install lock, held from the plan to the last step.
    pub(super) _lock: std::fs::File,
}

impl Plan {
    /// True when applying it would change nothing.
    pub fn is_noop(&self) -> bool {
        self.steps
            .iter()
            .all(|s| matches!(s.verb, Verb::Keep | Verb::Skip))
    }

    /// The files the plan writes, as `--dry-run` shows them (secrets not shown).
    /// The plan as JSON (`--dry-run --json`): the files' text too, secrets left out.
    pub fn to_json(&self) -> serde_json::Value {
        let steps: Vec<serde_json::Value> = self
            .steps
            .iter()
            .map(|s| {
                let mut v = serde_json::json!({
                    "verb": s.verb.word(),
                    "subject": s.subject,
                    "detail": s.detail,
                });
                if let Action::File {
                    path,
                    mode,
                    bytes,
                    secret,
                } = &s.action
                {
                    v["file"] = serde_json::json!({
                        "path": path,
                        "mode": format!("{mode:04o}"),
                        "bytes": bytes.len(),
                        "text": (!*secret).then(|| String::from_utf8_lossy(bytes).into_owned()),
                    });
                }
                v
            })
            .collect();
        serde_json::json!({
            "title": self.title,
            "steps": steps,
            "notes": self.notes,
            "changes": !self.is_noop(),
        })
    }

    pub fn files(&self) -> String {
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
    pub fn apply(&self, mut done: impl FnMut(&Step)) -> Result<(), InstallError> {
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
        Action::Dir { path, mode } => {
            use std::os::unix::fs::PermissionsExt;
            let made = std::fs::DirBuilder::new().mode(*mode).create(path);
            made.or_else(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists if path.is_dir() => Ok(()),
                _ => Err(e),
            })
            // The umask narrowed what `mode` asked for.
            .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode)))
            .map_err(FileError::write(path))?;
            Ok(())
        }
        Action::File {
            path, mode, bytes, ..
        } => Ok(crate::util::write_atomic(path, bytes, *mode).map_err(FileError::write(path))?),
        Action::Binary { path, exe } => {
            // Read through the pinned descriptor: the bytes installed are the bytes
            // running, whatever the path it was started from names now.
            let mut bytes = Vec::with_capacity(exe.identity().size as usize);
            exe.reader()
                .and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut bytes))
                .map_err(FileError::read(exe.path()))?;
            Ok(crate::util::write_atomic(path, &bytes, 0o755).map_err(FileError::write(path))?)
        }
        Action::Account { commands } => account::create(commands),
        Action::Command(cmd) => {
            let deadline = std::time::Instant::now() + RETRY_FOR;
            loop {
                match run_command(&cmd.argv) {
                    Err(InstallError::Command { .. }) if cmd.may_fail => return Ok(()),
                    Err(InstallError::Command { .. })
                        if cmd.retry && std::time::Instant::now() < deadline =>
                    {
                        std::thread::sleep(std::time::Duration::from_millis(500));
                    }
                    other => return other,
                }
            }
        }
        Action::EmptyDirExcept { path, keep } => {
            let entries = match std::fs::read_dir(path) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(source) => {
                    return Err(FileError::Read {
                        path: path.to_owned(),
                        source,
                    }
                    .into())
                }
            };
            for entry in entries {
                let entry = entry.map_err(FileError::read(path))?;
                if entry.file_name() == *keep {
                    continue;
                }
                let p = entry.path();
                let gone = match entry.file_type() {
                    Ok(t) if t.is_dir() => std::fs::remove_dir_all(&p),
                    _ => std::fs::remove_file(&p),
                };
                gone.map_err(FileError::remove(p))?;
            }
            Ok(())
        }
        Action::EnsureNoHolder { state_dir } => {
            match crate::instance::holders(state_dir).and_then(|h| h.first().copied()) {
                Some(pid) => Err(InstallError::AgentRunning {
                    pid,
                    dir: state_dir.clone(),
                }),
                None => Ok(()),
            }
        }
        Action::RemoveFile { path } => match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(FileError::Remove {
                path: path.to_owned(),
                source: e,
            }
            .into()),
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
            Err(e) => Err(FileError::Remove {
                path: path.to_owned(),
                source: e,
            }
            .into()),
            Ok(()) => Ok(()),
        },
        Action::RemoveTree { path } => match std::fs::remove_dir_all(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(FileError::Remove {
                path: path.to_owned(),
                source: e,
            }
            .into()),
            _ => Ok(()),
        },
    }
}
