//! The command line: clap definitions of every subcommand, nothing else; one file per
//! role's commands.

mod agent;
mod hub;
mod job;
mod runner;

pub use self::agent::*;
pub use self::hub::*;
pub use self::job::*;
pub use self::runner::*;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::proto::selector::Selector;
use crate::supervisor;

/// `--log-format`, for the commands that run long enough to log.
#[derive(Debug, Clone, Copy, Args)]
pub struct LogFlags {
    /// How log lines are written: text, or one JSON object a line.
    #[arg(
        long = "log-format",
        value_enum,
        value_name = "FORMAT",
        env = crate::env_vars::LOG_FORMAT,
        default_value = "text"
    )]
    pub format: crate::logging::LogFormat,
}

#[derive(Debug, Parser)]
#[command(name = "railgrid", version = crate::build_info::VERSION, about = "Fleet agent, job runner and process supervisor", propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the version, commit and target of this binary.
    Version {
        /// Print JSON: {"version", "commit", "target"}.
        #[arg(long)]
        json: bool,
    },
    /// Print a completion script for SHELL (bash, zsh, fish, elvish, powershell): for
    /// example `railgrid completions bash > /etc/bash_completion.d/railgrid`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Run PROGRAM under the supervisor until SIGTERM or SIGINT, then stop its whole
    /// process group and exit 0.
    Supervise(Box<SuperviseArgs>),
    /// The host daemon: keeps one runner alive, reconciled by a hub or standalone.
    Agent {
        #[command(subcommand)]
        command: AgentCommand,
    },
    /// Submit and inspect jobs on this host's runner.
    Job {
        #[command(flatten)]
        target: JobTarget,
        #[command(subcommand)]
        command: JobCommand,
    },
    /// The job runner (started by the agent; usable by hand for debugging).
    Runner {
        #[command(subcommand)]
        command: RunnerCommand,
    },
    /// The reference hub: `hub serve`, and the admin commands that enrol agents and set
    /// their desired state.
    Hub(Box<HubArgs>),
    /// Release signing: keys and signatures in minisign's formats (the `minisign` tool
    /// reads and writes the same).
    Release {
        #[command(subcommand)]
        command: ReleaseCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum ReleaseCommand {
    /// Make a key pair: the secret key (0600; unencrypted unless --password-file) and the
    /// public key. Never prompts, never overwrites.
    Keygen {
        #[arg(long, value_name = "FILE")]
        secret_key: PathBuf,
        #[arg(long, value_name = "FILE")]
        public_key: PathBuf,
        /// Encrypt the secret key with the password in FILE (its first line).
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
    },
    /// Sign FILE: writes FILE.minisig, whose trusted comment names the version, the file
    /// name and its SHA-256.
    // `--version` is the version signed here, not railgrid's own.
    #[command(disable_version_flag = true)]
    Sign {
        #[arg(long, value_name = "FILE")]
        secret_key: PathBuf,
        /// The password of an encrypted secret key, in FILE.
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
        /// The version signed (default: what `FILE version --json` says).
        #[arg(long, value_name = "V")]
        version: Option<String>,
        file: PathBuf,
    },
    /// Check FILE's signature (FILE.minisig unless --signature) with a public key.
    Verify {
        /// A minisign public key file, or a file holding its key line (`RW…`).
        #[arg(long, value_name = "FILE")]
        public_key: PathBuf,
        #[arg(long, value_name = "FILE")]
        signature: Option<PathBuf>,
        file: PathBuf,
        /// Print JSON: the file, the key id and the trusted comment.
        #[arg(long)]
        json: bool,
    },
}

fn parse_selector(s: &str) -> Result<Selector, String> {
    Selector::parse(s).map_err(|e| e.to_string())
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    crate::proto::labels::parse_pair(s).map_err(|e| e.to_string())
}

/// Parses humantime durations ("250ms", "2s", "1m").
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use forms like 250ms, 2s, 1m)"))
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    crate::env_policy::parse_assignment(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    /// clap checks a command's definition only when that command is parsed: check them
    /// all here (duplicate names, a `--version` that clashes with clap's own flag).
    #[test]
    fn every_command_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
