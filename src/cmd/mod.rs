//! Glue between the command line and the library: builds configs from flags, runs the
//! async parts on an explicitly built runtime, and classifies errors into exit codes.

mod admin;
mod agent;
mod agent_drain;
mod agent_reload;
mod hub;
mod hub_access;
mod hub_config;
mod hub_drain;
mod hub_job;
mod hub_release;
mod hub_rollout;
mod hub_secret;
mod hub_store_copy;
mod install;
mod interrupts;
mod job;
mod release;
mod runner;
mod supervise;
mod table;
mod token_file;

use std::fmt;
use std::io::Write;
use std::process::ExitCode;

use crate::build_info;
use crate::cli::{AgentCommand, Cli, Command, RunnerCommand};

/// An error the user must fix (bad flags, bad config, refused identity): exit code 2.
#[derive(Debug)]
pub struct UsageError(pub anyhow::Error);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for UsageError {}

/// Wraps an error as a usage error.
pub fn usage(err: impl Into<anyhow::Error>) -> anyhow::Error {
    anyhow::Error::new(UsageError(err.into()))
}

/// Exit code for an error returned by [`run`]: 2 for usage errors, 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    if err.downcast_ref::<UsageError>().is_some() {
        2
    } else {
        1
    }
}

/// Runs one command.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        // The agent sets up its own logging once it knows its log directory.
        Command::Agent {
            command: AgentCommand::Run(args),
        } => agent::run(args),
        command => {
            let format = match &command {
                Command::Runner {
                    command: RunnerCommand::Run(a),
                } => a.log.format,
                Command::Hub(a) => match &a.command {
                    crate::cli::HubCommand::Serve(s) => s.log.format,
                    _ => log_format_of_env(),
                },
                _ => log_format_of_env(),
            };
            crate::logging::init(format, None, true);
            match command {
                Command::Version { json } => version(json),
                Command::Completions { shell } => completions(shell),
                Command::Supervise(args) => supervise::run(*args),
                Command::Agent { command } => agent_command(command),
                Command::Runner { command } => match command {
                    RunnerCommand::Run(args) => runner::run(args),
                    RunnerCommand::Reap(args) => runner::reap(args),
                },
                Command::Job { target, command } => job::run(target, command),
                Command::Hub(args) => hub::run(*args),
                Command::Release { command } => release::run(command),
            }
        }
    }
}

/// The agent's commands but `agent run`, which sets up its own logging.
fn agent_command(command: AgentCommand) -> anyhow::Result<ExitCode> {
    match command {
        AgentCommand::Status(args) => agent::status(args),
        AgentCommand::Reload(args) => agent_reload::reload(args),
        AgentCommand::Drain(args) => agent_drain::drain(args),
        AgentCommand::Resume(args) => agent_drain::resume(args),
        AgentCommand::CheckConfig(args) => agent::check_config(args),
        AgentCommand::Install(args) => install::install(args),
        AgentCommand::Uninstall(args) => install::uninstall(args),
        AgentCommand::Upgrade(args) => agent::upgrade(args),
        AgentCommand::UpgradeWatch(args) => agent::upgrade_watch(args),
        AgentCommand::UpgradeGuard { state_dir, log_dir } => {
            agent::upgrade_guard(&state_dir, &log_dir)
        }
        AgentCommand::Run(_) => unreachable!("`agent run` is dispatched before logging starts"),
    }
}

/// `RAILGRID_LOG_FORMAT` for the commands without a `--log-format` of their own.
fn log_format_of_env() -> crate::logging::LogFormat {
    match std::env::var(crate::env_vars::LOG_FORMAT).as_deref() {
        Ok("json") => crate::logging::LogFormat::Json,
        _ => crate::logging::LogFormat::Text,
    }
}

/// The completion script for `shell`, from the same definitions the parser uses.
fn completions(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    use clap::CommandFactory;
    let mut cmd = crate::cli::Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "railgrid", &mut out);
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(&out).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e.into()),
    }
}

fn version(json: bool) -> anyhow::Result<ExitCode> {
    let info = build_info::current();
    let text = if json {
        serde_json::to_string(&info)?
    } else {
        let commit = info.commit.as_deref().unwrap_or("unknown commit");
        format!("railgrid {} ({commit}, {})", info.version, info.target)
    };
    print_stdout(&text)
}

/// Prints a line to stdout; a closed pipe (`railgrid version | head -c0`) is not an error.
fn print_stdout(text: &str) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e.into()),
    }
}

/// A runtime on the calling thread: the supervisor needs no more, and one thread keeps
/// an idle `supervise` small.
fn current_thread_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
