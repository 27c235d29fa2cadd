//! The commands install and uninstall run (useradd, systemctl, launchctl, dscl): run to
//! completion with no input, a failure carrying the command as it would be typed and its
//! stderr.

use super::InstallError;

/// Runs a command to completion; a failure carries its stderr.
pub(crate) fn run_command(argv: &[String]) -> Result<(), InstallError> {
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

/// `argv` as a shell would need it typed: words with spaces or quotes are quoted.
pub(super) fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|w| {
            let plain = !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c));
            if plain {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_shown_as_they_would_be_typed() {
        let argv: Vec<String> = ["useradd", "--comment", "railgrid runner", "it's", "x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            shell_words(&argv),
            "useradd --comment 'railgrid runner' 'it'\\''s' x"
        );
    }
}
