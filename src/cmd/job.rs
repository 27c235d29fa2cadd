//! `railgrid job ...`: a client of this host's runner.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use super::{print_stdout, usage};
use crate::agent::config::{self, Flags};
use crate::cli::{JobCommand, JobSubmitArgs, JobTarget};
use crate::runner::client::{Client, ClientError};
use crate::runner::job::Stream;
use crate::runner::spec::{JobSpec, Limits};
use crate::runner::store::{JobRecord, JobState};
use crate::runner::Paths;

fn socket(target: &JobTarget) -> anyhow::Result<PathBuf> {
    if let Some(s) = &target.socket {
        return Ok(s.clone());
    }
    let state_dir = match &target.state_dir {
        Some(d) => d.clone(),
        None => match config::load(&Flags::default()) {
            Ok(cfg) => cfg.state_dir,
            Err(config::ConfigError::NoRunnerUser) => config::ROOT_STATE_DIR.into(),
            Err(e) => return Err(usage(e)),
        },
    };
    Ok(Paths::new(&state_dir).socket)
}

pub(super) fn run(target: JobTarget, command: JobCommand) -> anyhow::Result<ExitCode> {
    let client = Client::new(&socket(&target)?);
    let rt = super::current_thread_runtime()?;
    rt.block_on(async move {
        match command {
            JobCommand::Submit(args) => submit(&client, args).await,
            JobCommand::List {
                state,
                owner,
                limit,
                json,
            } => {
                let mut q = format!("?limit={limit}");
                if let Some(s) = state {
                    q.push_str(&format!("&state={s}"));
                }
                if let Some(o) = owner {
                    q.push_str(&format!("&owner={o}"));
                }
                let jobs = client.list(&q).await.map_err(api_err)?;
                if json {
                    return print_stdout(&serde_json::to_string_pretty(&jobs)?);
                }
                let mut out = format!(
                    "{:<36} {:<10} {:<6} {:<10} ARGV",
                    "ID", "STATE", "EXIT", "OWNER"
                );
                for j in &jobs {
                    out.push_str(&format!(
                        "\n{:<36} {:<10} {:<6} {:<10} {}",
                        j.id,
                        j.state.as_str(),
                        j.exit_code
                            .map(|c| c.to_string())
                            .unwrap_or_else(|| "-".into()),
                        j.owner,
                        j.spec.argv.join(" ")
                    ));
                }
                print_stdout(&out)
            }
            JobCommand::Status { id, json } => {
                let rec = client.get(&id).await.map_err(api_err)?;
                if json {
                    print_stdout(&serde_json::to_string_pretty(&rec)?)
                } else {
                    print_stdout(&render(&rec))
                }
            }
            JobCommand::Logs { id, stderr, follow } => {
                let stream = if stderr {
                    Stream::Stderr
                } else {
                    Stream::Stdout
                };
                let mut out = tokio::io::stdout();
                client
                    .output(&id, stream, follow, &mut out)
                    .await
                    .map_err(api_err)?;
                Ok(ExitCode::SUCCESS)
            }
            JobCommand::Wait { id } => {
                let rec = client.wait(&id).await.map_err(api_err)?;
                Ok(ExitCode::from(exit_code(&rec)))
            }
            JobCommand::Cancel { id } => {
                // Cancel returns at once; the group's grace may take a while: report the end.
                client.cancel(&id).await.map_err(api_err)?;
                let rec = client.wait(&id).await.map_err(api_err)?;
                print_stdout(&format!("{} {}", rec.id, rec.state.as_str()))
            }
        }
    })
}

/// Errors the runner refused as the client's fault become exit code 2.
fn api_err(e: ClientError) -> anyhow::Error {
    match &e {
        // 429 is the runner's load, not the caller's mistake: a runtime failure (1).
        ClientError::Api { status, .. } if (400..500).contains(status) && *status != 429 => {
            usage(e)
        }
        _ => e.into(),
    }
}

async fn submit(client: &Client, args: JobSubmitArgs) -> anyhow::Result<ExitCode> {
    let limits = Limits {
        memory_bytes: args.memory_bytes,
        cpu_secs: args.cpu_secs,
        open_files: args.open_files,
        processes: args.processes,
        cpu_millis: args.cpu_millis,
    };
    let spec = JobSpec {
        id: args.id,
        argv: args.command,
        cwd: args.cwd,
        env: args.env.into_iter().collect(),
        timeout_secs: args.timeout.map(|d| d.as_secs().max(1)),
        owner: args.owner,
        limits: (limits != Limits::default()).then_some(limits),
        ..JobSpec::default()
    };
    let (created, sub) = client.submit(&spec).await.map_err(api_err)?;
    if !args.wait {
        let note = if created { "" } else { " (already submitted)" };
        return print_stdout(&format!("{}{note}", sub.id));
    }
    // Stream both outputs while the job runs, then exit as the job did.
    let (mut out, mut err) = (tokio::io::stdout(), tokio::io::stderr());
    let (a, b) = tokio::join!(
        client.output(&sub.id, Stream::Stdout, true, &mut out),
        client.output(&sub.id, Stream::Stderr, true, &mut err),
    );
    a.context("streaming stdout")?;
    b.context("streaming stderr")?;
    let rec = client.wait(&sub.id).await.map_err(api_err)?;
    if rec.state != JobState::Succeeded && rec.state != JobState::Failed {
        eprintln!(
            "railgrid: job {} {}{}",
            rec.id,
            rec.state.as_str(),
            rec.error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        );
    }
    Ok(ExitCode::from(exit_code(&rec)))
}

/// The exit code a shell would show for the job: its own, 128 + signal, 124 for a
/// timeout (as timeout(1)), 1 otherwise.
fn exit_code(rec: &JobRecord) -> u8 {
    match rec.state {
        JobState::TimedOut => 124,
        _ => match (rec.exit_code, rec.signal) {
            (Some(c), _) => c.clamp(0, 255) as u8,
            (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
            _ => 1,
        },
    }
}

fn render(r: &JobRecord) -> String {
    let mut out = format!(
        "job:      {}\nstate:    {}\nargv:     {}\nowner:    {}\n",
        r.id,
        r.state.as_str(),
        r.spec.argv.join(" "),
        r.owner
    );
    if let Some(pid) = r.pid {
        out.push_str(&format!("pid:      {pid}\n"));
    }
    if let Some(c) = r.exit_code {
        out.push_str(&format!("exit:     {c}\n"));
    }
    if let Some(s) = r.signal {
        out.push_str(&format!("signal:   {s}\n"));
    }
    if let Some(e) = &r.error {
        out.push_str(&format!("error:    {e}\n"));
    }
    let trunc = |t: bool| if t { " (truncated)" } else { "" };
    out.push_str(&format!(
        "output:   stdout {} bytes{}, stderr {} bytes{}\n",
        r.stdout_bytes,
        trunc(r.stdout_truncated),
        r.stderr_bytes,
        trunc(r.stderr_truncated)
    ));
    out.push_str(&format!(
        "confined: {}",
        r.confinement.as_deref().unwrap_or("-")
    ));
    out
}
