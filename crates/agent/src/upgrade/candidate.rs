//! A new binary, checked before a single byte of it runs, then run once to see that it
//! is what it says: the hash and size the desired state names, a signature by a key of
//! the agent's own configuration, a version that is no downgrade, and a test run of
//! `<new> version --json` (as the runner's account, with an empty environment, within a
//! timeout) that must report exactly the version expected.
//!
//! The file is pinned (held open and hashed) once; the signature is checked, the test
//! run exec'd and, later, the agent re-exec'd from that same descriptor, so the bytes
//! that were verified are the bytes that run.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::UpgradeError;
use crate::proto::desired::Artifact;
use crate::supervisor::account::Account;
use crate::sys::exe::PinnedExe;
use crate::sys::spawn::{self, Credentials, WorkDir};

/// How long `<new> version --json` may take.
const TEST_RUN_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of its output that is read.
const MAX_TEST_OUTPUT: u64 = 64 * 1024;

/// Pins the downloaded file at `path` and checks hash, size and signature. Blocking.
pub(super) fn verify_download(
    path: &Path,
    art: &Artifact,
    keys: &[minisign::PublicKey],
    version: &str,
) -> Result<PinnedExe, UpgradeError> {
    let exe = PinnedExe::open(path).map_err(|source| UpgradeError::Pin {
        path: path.to_owned(),
        source,
    })?;
    let id = exe.identity();
    if id.size != art.size {
        return Err(UpgradeError::Size {
            path: path.to_owned(),
            want: art.size,
            got: id.size,
        });
    }
    if !id.sha256.eq_ignore_ascii_case(&art.sha256) {
        return Err(UpgradeError::Hash {
            path: path.to_owned(),
            want: art.sha256.clone(),
            got: id.sha256.clone(),
        });
    }
    let reader = exe.reader().map_err(|source| UpgradeError::Io {
        path: path.to_owned(),
        source,
    })?;
    let verified = crate::release::check(keys, &art.signature, reader).map_err(|source| {
        UpgradeError::Signature {
            version: version.to_owned(),
            source,
        }
    })?;
    // What the signer said it signed, when it said it (railgrid's own signatures do).
    if let Some(signed) = verified.fields.get("version") {
        if signed != version {
            return Err(UpgradeError::SignedVersion {
                version: version.to_owned(),
                signed: signed.clone(),
            });
        }
    }
    tracing::info!(%version, key_id = %verified.key_id, sha256 = %id.sha256, "the new binary's hash and signature verify");
    Ok(exe)
}

/// Refuses `to` when it is older than `from` and the hub did not ask for a rollback.
pub(super) fn check_order(from: &str, to: &str, rollback: bool) -> Result<(), UpgradeError> {
    if rollback {
        return Ok(());
    }
    let parse = |v: &str| semver::Version::parse(v).ok();
    match (parse(from), parse(to)) {
        (Some(f), Some(t)) if t < f => Err(UpgradeError::Downgrade {
            from: from.to_owned(),
            to: to.to_owned(),
        }),
        (Some(_), Some(_)) => Ok(()),
        _ => Err(UpgradeError::Unordered {
            from: from.to_owned(),
            to: to.to_owned(),
        }),
    }
}

/// Makes the pinned file executable (0755: the runner's account runs it too).
pub(super) fn make_executable(path: &Path) -> Result<(), UpgradeError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(|source| {
        UpgradeError::Io {
            path: path.to_owned(),
            source,
        }
    })
}

/// Runs `<exe> version --json` from the pinned descriptor, as `runner` (or this
/// agent's own account), with an empty environment, in `/`; the version it reports.
pub(super) async fn test_run(
    exe: &PinnedExe,
    runner: Option<&Account>,
) -> Result<String, UpgradeError> {
    let path = exe.path().to_owned();
    let fail = |why: String| UpgradeError::TestRun {
        path: path.clone(),
        why,
    };
    let mut cmd = std::process::Command::new(&path);
    cmd.args(["version", "--json"])
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let creds = runner.map(|a| Credentials {
        uid: a.uid,
        gid: a.gid,
        groups: Vec::new(),
    });
    spawn::session_leader_as(&mut cmd, creds, WorkDir::Path(Path::new("/")), None)
        .map_err(|e| fail(e.to_string()))?;
    let argv = [
        std::ffi::OsStr::new("railgrid"),
        std::ffi::OsStr::new("version"),
        std::ffi::OsStr::new("--json"),
    ];
    exe.exec_pinned_any(&mut cmd, &argv, &[])
        .map_err(|e| fail(e.to_string()))?;
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| fail(format!("it does not start: {e}")))?;
    let pid = child.id();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let run = async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        // Both at once: a child that fills one pipe must not stall on it while the
        // other is read.
        let read_out = async {
            if let Some(s) = stdout.as_mut() {
                let _ = s.take(MAX_TEST_OUTPUT).read_to_end(&mut out).await;
            }
        };
        let read_err = async {
            if let Some(s) = stderr.as_mut() {
                let _ = s.take(MAX_TEST_OUTPUT).read_to_end(&mut err).await;
            }
        };
        tokio::join!(read_out, read_err);
        let status = child.wait().await;
        (status, out, err)
    };
    let ran = tokio::time::timeout(TEST_RUN_TIMEOUT, run).await;
    // Its own session and group: whatever it left in them ends with it, answered or not.
    if let Some(p) = pid.and_then(crate::sys::ProcessId::from_u32) {
        let _ = crate::sys::group::signal_group(p, nix::sys::signal::Signal::SIGKILL);
    }
    let (status, out, err) = match ran {
        Ok(r) => r,
        Err(_) => {
            return Err(fail(format!(
                "`version --json` did not answer within {}",
                humantime::format_duration(TEST_RUN_TIMEOUT)
            )));
        }
    };
    let status = status.map_err(|e| fail(e.to_string()))?;
    let stderr_tail = || {
        let text = String::from_utf8_lossy(&err);
        let text = text.trim();
        if text.is_empty() {
            String::new()
        } else {
            format!(": {}", crate::util::clip(text))
        }
    };
    if !status.success() {
        return Err(fail(format!(
            "`version --json` failed ({status}){}",
            stderr_tail()
        )));
    }
    let info: serde_json::Value = serde_json::from_slice(&out).map_err(|_| {
        fail(format!(
            "`version --json` did not print railgrid's JSON{}",
            stderr_tail()
        ))
    })?;
    info["version"]
        .as_str()
        .filter(|v| crate::proto::desired::is_version(v))
        .map(str::to_owned)
        .ok_or_else(|| fail("`version --json` names no version".into()))
}
