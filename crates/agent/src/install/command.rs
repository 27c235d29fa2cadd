//! The commands install and uninstall run (useradd, systemctl, launchctl, dscl): run to
//! completion with no input, a failure carrying the command as it would be typed and its
//! stderr.

use super::InstallError;
pub(super) use crate::util::shell_words;

/// Runs a command to completion; a failure carries its stderr.
pub(super) fn run_command(argv: &[String]) -> Result<(), InstallError> {
    command_output(argv).map(drop)
}

/// Runs a command to completion: its stdout, or its failure with its stderr.
pub(super) fn command_output(argv: &[String]) -> Result<String, InstallError> {
    let out = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| InstallError::Spawn {
            command: shell_words(argv),
            source,
        })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    Err(InstallError::Command {
        command: shell_words(argv),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}
