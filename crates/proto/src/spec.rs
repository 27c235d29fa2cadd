//! The validation of job specs (the type itself is `proto::job::JobSpec`): one check for
//! the runner that runs a job and the hub that takes it for an agent.
//!
//! A spec is checked completely before anything is stored or started; every refusal names
//! the field (and the variable, for the environment) so a client can fix it.

use thiserror::Error;

use crate::env_policy::{self, EnvError};
use crate::job::JobSpec;
use crate::util::clip;

/// Default grace between SIGTERM and SIGKILL of a job's process group.
pub const DEFAULT_KILL_GRACE_SECS: u64 = 5;
/// Longest kill grace accepted. A runner stop with a budget (the agent's) cuts it to fit,
/// and a dead runner's jobs get at most `leftover::RECONCILE_GRACE`.
pub const MAX_KILL_GRACE_SECS: u64 = 300;
/// Wall-clock limit of a job that names none: every job has one.
pub const DEFAULT_TIMEOUT_SECS: u64 = 24 * 3600;
/// Longest wall-clock limit accepted.
pub const MAX_TIMEOUT_SECS: u64 = 30 * 24 * 3600;
/// Longest id a client may choose.
const MAX_ID_LEN: usize = 128;
/// Largest `stdin` accepted inline.
pub const MAX_STDIN_BYTES: usize = 1024 * 1024;

/// Longest `cwd`: PATH_MAX, past which no call can open it.
const MAX_CWD_BYTES: usize = 4096;
/// Largest single string exec takes, its NUL included: Linux's MAX_ARG_STRLEN (32 pages of
/// 4 KiB). Longer, and `execve` fails with E2BIG after the job was accepted.
pub const MAX_ARG_STRLEN: usize = 128 * 1024;
/// Largest `argv` and `env` together, each string counted with its NUL and its pointer as
/// the kernel counts them. Linux takes a quarter of the stack limit (2 MiB under the usual
/// 8 MiB); half of that leaves room for the runner's own variables and the program's path.
pub const MAX_EXEC_BYTES: usize = 1024 * 1024;
/// Smallest `open_files`: stdin, stdout and stderr, the descriptor the dynamic loader opens
/// libraries with (`sh` starts with 4), and the ones a shell moves its own to around a
/// redirection (dash uses 10 and above, so needs 11).
pub const MIN_OPEN_FILES: u64 = 16;
/// Smallest `memory_bytes`: as RLIMIT_AS it must hold the program and its shared
/// libraries mapped (dash starts with 2.6 MiB, bash with 3.9 MiB, on x86-64 glibc).
pub const MIN_MEMORY_BYTES: u64 = 8 << 20;

/// Smallest `cpu_millis`: cpu.max takes at least 1 ms of CPU per 100 ms period.
pub const MIN_CPU_MILLIS: u64 = 10;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SpecError {
    #[error(transparent)]
    Secret(#[from] crate::secret::SecretError),
    #[error("field argv is required and must name a program: [\"program\", \"arg\", ...]")]
    NoArgv,
    #[error("field argv[{index}] holds a NUL byte")]
    NulInArgv { index: usize },
    #[error("field argv[{index}] is {len} bytes; exec takes at most {} per argument (MAX_ARG_STRLEN, 128 KiB with its NUL)", MAX_ARG_STRLEN - 1)]
    ArgTooLong { index: usize, len: usize },
    #[error("field env: variable {} is {len} bytes as NAME=VALUE; exec takes at most {} per variable (MAX_ARG_STRLEN, 128 KiB with its NUL)", clip(.name), MAX_ARG_STRLEN - 1)]
    EnvTooLong { name: String, len: usize },
    #[error("fields argv and env take {total} bytes together (each string with its NUL and an 8-byte pointer); at most {MAX_EXEC_BYTES} (1 MiB) are accepted, so that exec can pass them with the runner's own variables")]
    ExecTooLarge { total: usize },
    #[error("field env: {0}")]
    Env(EnvError),
    #[error("field id {:?} is invalid: use 1-128 characters from A-Z a-z 0-9 . _ -", clip(.id))]
    BadId { id: String },
    #[error("field owner {:?} is invalid: use 1-128 characters from A-Z a-z 0-9 . _ - @", clip(.owner))]
    BadOwner { owner: String },
    #[error("field env: {} is set by the runner and cannot be given", clip(.name))]
    Reserved { name: String },
    #[error("field timeout_secs must be greater than zero")]
    ZeroTimeout,
    #[error("field {field} is {got}; at most {max} is accepted")]
    TooLong {
        field: &'static str,
        got: u64,
        max: u64,
    },
    #[error("field stdin is {len} bytes; at most {max} are accepted")]
    StdinTooLarge { len: usize, max: usize },
    #[error("field cwd holds a NUL byte")]
    NulInCwd,
    #[error("field cwd is {len} bytes; at most {MAX_CWD_BYTES} (PATH_MAX) are accepted")]
    CwdTooLong { len: usize },
    #[error("field limits.cpu_millis is {got}; at least {MIN_CPU_MILLIS} (1% of a CPU) is needed")]
    CpuTooSmall { got: u64 },
    #[error("field limits.{field} is {got}; at least {min} is needed ({why})")]
    LimitTooSmall {
        field: &'static str,
        got: u64,
        min: u64,
        why: &'static str,
    },
}

impl JobSpec {
    /// Checks everything that does not need the file system.
    pub fn validate(&self) -> Result<(), SpecError> {
        crate::secret::check_names(self)?;
        if self.argv.first().is_none_or(|p| p.is_empty()) {
            return Err(SpecError::NoArgv);
        }
        if let Some(index) = self.argv.iter().position(|a| a.contains('\0')) {
            return Err(SpecError::NulInArgv { index });
        }
        if let Some((index, a)) = self
            .argv
            .iter()
            .enumerate()
            .find(|(_, a)| a.len() >= MAX_ARG_STRLEN)
        {
            return Err(SpecError::ArgTooLong {
                index,
                len: a.len(),
            });
        }
        for (k, v) in &self.env {
            env_policy::check(k, v).map_err(SpecError::Env)?;
            if k == crate::env_vars::JOB_ID {
                return Err(SpecError::Reserved { name: k.clone() });
            }
            // `NAME=VALUE` is one string to exec.
            let len = k.len() + 1 + v.len();
            if len >= MAX_ARG_STRLEN {
                return Err(SpecError::EnvTooLong {
                    name: k.clone(),
                    len,
                });
            }
        }
        // The kernel counts a pointer per string too (8 bytes on 64-bit, less elsewhere).
        let pointer = 8;
        let total = self
            .argv
            .iter()
            .map(|a| a.len() + 1 + pointer)
            .sum::<usize>()
            + self
                .env
                .iter()
                .map(|(k, v)| k.len() + 1 + v.len() + 1 + pointer)
                .sum::<usize>();
        if total > MAX_EXEC_BYTES {
            return Err(SpecError::ExecTooLarge { total });
        }
        if let Some(id) = &self.id {
            if !valid_name(id, false) {
                return Err(SpecError::BadId { id: id.clone() });
            }
        }
        if let Some(owner) = &self.owner {
            if !valid_owner(owner) {
                return Err(SpecError::BadOwner {
                    owner: owner.clone(),
                });
            }
        }
        if self.timeout_secs == Some(0) {
            return Err(SpecError::ZeroTimeout);
        }
        for (field, got, max) in [
            ("timeout_secs", self.timeout_secs, MAX_TIMEOUT_SECS),
            ("kill_grace_secs", self.kill_grace_secs, MAX_KILL_GRACE_SECS),
        ] {
            if let Some(got) = got.filter(|g| *g > max) {
                return Err(SpecError::TooLong { field, got, max });
            }
        }
        if let Some(stdin) = &self.stdin {
            if stdin.len() > MAX_STDIN_BYTES {
                return Err(SpecError::StdinTooLarge {
                    len: stdin.len(),
                    max: MAX_STDIN_BYTES,
                });
            }
        }
        if let Some(cwd) = &self.cwd {
            if cwd.contains('\0') {
                return Err(SpecError::NulInCwd);
            }
            if cwd.len() > MAX_CWD_BYTES {
                return Err(SpecError::CwdTooLong { len: cwd.len() });
            }
        }
        if let Some(got) = self
            .limits
            .as_ref()
            .and_then(|l| l.cpu_millis)
            .filter(|m| *m < MIN_CPU_MILLIS)
        {
            return Err(SpecError::CpuTooSmall { got });
        }
        if let Some(l) = &self.limits {
            // Limits below these fail the job before its first instruction (or a shell's
            // first redirection), with an error about the launch rather than the limit.
            for (field, value, min, why) in [
                (
                    "open_files",
                    l.open_files,
                    MIN_OPEN_FILES,
                    "stdin, stdout, stderr, the libraries a program loads and the descriptors a shell moves its own to",
                ),
                ("processes", l.processes, 1, "the job itself"),
                ("cpu_secs", l.cpu_secs, 1, "RLIMIT_CPU counts whole seconds"),
                (
                    "memory_bytes",
                    l.memory_bytes,
                    MIN_MEMORY_BYTES,
                    "8 MiB: as address space it must hold a shell and its shared libraries",
                ),
            ] {
                if let Some(got) = value.filter(|v| *v < min) {
                    return Err(SpecError::LimitTooSmall {
                        field,
                        got,
                        min,
                        why,
                    });
                }
            }
        }
        Ok(())
    }

    /// A spec with only `argv` set.
    pub fn from_argv<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> Self {
        Self {
            argv: argv.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    pub fn owner(&self) -> &str {
        self.owner.as_deref().unwrap_or("default")
    }

    pub fn timeout_secs(&self) -> u64 {
        self.timeout_secs
            .unwrap_or(DEFAULT_TIMEOUT_SECS)
            .min(MAX_TIMEOUT_SECS)
    }

    pub fn kill_grace_secs(&self) -> u64 {
        self.kill_grace_secs
            .unwrap_or(DEFAULT_KILL_GRACE_SECS)
            .min(MAX_KILL_GRACE_SECS)
    }

    /// The spec as stored: identical specs compare equal whatever the field order of the
    /// request, so resubmission is recognised.
    pub fn canonical(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// True when `id` is one a job may have.
pub fn valid_id(id: &str) -> bool {
    valid_name(id, false)
}

/// True when `owner` is one a job may have (a list filter with another matches nothing).
pub fn valid_owner(owner: &str) -> bool {
    valid_name(owner, true)
}

/// Ids and owners end up in paths and logs: a small alphabet keeps them harmless.
fn valid_name(s: &str, allow_at: bool) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ID_LEN
        && s != "."
        && s != ".."
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') || (allow_at && c == '@')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Limits;

    fn spec(argv: &[&str]) -> JobSpec {
        JobSpec::from_argv(argv.iter().copied())
    }

    #[test]
    fn refuses_what_it_must() {
        assert_eq!(spec(&[]).validate(), Err(SpecError::NoArgv));
        assert_eq!(spec(&[""]).validate(), Err(SpecError::NoArgv));
        let mut s = spec(&["true"]);
        s.env.insert("LD_PRELOAD".into(), "/x.so".into());
        assert!(matches!(
            s.validate(),
            Err(SpecError::Env(EnvError::Loader { .. }))
        ));
        let mut s = spec(&["true"]);
        s.id = Some("../../etc".into());
        assert!(matches!(s.validate(), Err(SpecError::BadId { .. })));
        let mut s = spec(&["true"]);
        s.id = Some("..".into());
        assert!(matches!(s.validate(), Err(SpecError::BadId { .. })));
        let mut s = spec(&["true"]);
        s.timeout_secs = Some(0);
        assert_eq!(s.validate(), Err(SpecError::ZeroTimeout));
        let mut s = spec(&["true"]);
        s.kill_grace_secs = Some(u64::MAX);
        assert!(matches!(
            s.validate(),
            Err(SpecError::TooLong {
                field: "kill_grace_secs",
                ..
            })
        ));
        for (limits, field) in [
            (
                Limits {
                    open_files: Some(2),
                    ..Limits::default()
                },
                "open_files",
            ),
            (
                Limits {
                    processes: Some(0),
                    ..Limits::default()
                },
                "processes",
            ),
            (
                Limits {
                    memory_bytes: Some(4096),
                    ..Limits::default()
                },
                "memory_bytes",
            ),
            // The minimums once documented, with which not even `sh` starts.
            (
                Limits {
                    open_files: Some(3),
                    ..Limits::default()
                },
                "open_files",
            ),
            (
                Limits {
                    memory_bytes: Some(1 << 20),
                    ..Limits::default()
                },
                "memory_bytes",
            ),
        ] {
            let mut s = spec(&["true"]);
            s.limits = Some(limits);
            assert!(
                matches!(s.validate(), Err(SpecError::LimitTooSmall { field: f, .. }) if f == field),
                "{field}"
            );
        }
        let mut s = spec(&["true"]);
        s.limits = Some(Limits {
            open_files: Some(MIN_OPEN_FILES),
            processes: Some(1),
            memory_bytes: Some(MIN_MEMORY_BYTES),
            cpu_secs: Some(1),
            cpu_millis: Some(MIN_CPU_MILLIS),
        });
        assert_eq!(s.validate(), Ok(()));
    }

    #[test]
    fn what_exec_cannot_take_is_refused_naming_it() {
        let big = "x".repeat(MAX_ARG_STRLEN);
        let s = spec(&["echo", "ok", &big]);
        assert_eq!(
            s.validate(),
            Err(SpecError::ArgTooLong {
                index: 2,
                len: MAX_ARG_STRLEN
            })
        );
        // The longest string exec takes, NUL included, is accepted.
        let s = spec(&["echo", &big[1..]]);
        assert_eq!(s.validate(), Ok(()));

        let mut s = spec(&["true"]);
        s.env.insert("BIG".into(), big[4..].into());
        let message = s.validate().expect_err("refused").to_string();
        assert!(message.contains("variable BIG"), "{message}");
        let mut s = spec(&["true"]);
        s.env.insert("BIG".into(), big[5..].into());
        assert_eq!(s.validate(), Ok(()));

        // Each fits, all of them together do not.
        let mut s = spec(&["true"]);
        for i in 0..9 {
            s.env.insert(format!("V{i}"), big[1000..].into());
        }
        let message = s.validate().expect_err("refused").to_string();
        assert!(message.contains(&MAX_EXEC_BYTES.to_string()), "{message}");
    }

    #[test]
    fn echoed_values_are_cut() {
        let mut s = spec(&["true"]);
        s.owner = Some("o".repeat(100_000));
        let message = s.validate().expect_err("refused").to_string();
        assert!(message.len() < 300, "{message}");
        assert!(message.contains('…'), "{message}");
        let mut s = spec(&["true"]);
        s.env.insert("N=".repeat(50_000), String::new());
        let message = s.validate().expect_err("refused").to_string();
        assert!(message.len() < 300, "{message}");
    }

    #[test]
    fn canonical_form_ignores_field_order() {
        let a: JobSpec =
            serde_json::from_str(r#"{"argv":["a"],"env":{"B":"2","A":"1"},"unknown":1}"#).unwrap();
        let b: JobSpec = serde_json::from_str(r#"{"env":{"A":"1","B":"2"},"argv":["a"]}"#).unwrap();
        assert_eq!(a.canonical(), b.canonical());
    }
}
