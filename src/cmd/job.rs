//! `railgrid job ...`: a client of this host's runner.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use super::admin::clean;
use super::interrupts::{follow_or_cancel, Interrupts, DETACHED};
use super::table::Table;
use super::{print_stdout, usage};
use crate::agent::config::{self, Flags};
use crate::cli::{JobCommand, JobSubmitArgs, JobTarget};
use crate::proto::job::{JobRecord, JobSpec, JobState, Limits};
use crate::runner::client::{Client, ClientError};
use crate::runner::job::Stream;
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
    let socket = socket(&target)?;
    let client = Client::new(&socket);
    let rt = super::current_thread_runtime()?;
    rt.block_on(async move {
        match command {
            JobCommand::Submit(args) => submit(&client, &socket, *args).await,
            JobCommand::List {
                state,
                owner,
                limit,
                json,
            } => {
                let mut q = format!("?limit={limit}");
                if let Some(s) = state {
                    q.push_str(&format!("&state={}", crate::util::percent_encode(&s)));
                }
                if let Some(o) = owner {
                    q.push_str(&format!("&owner={}", crate::util::percent_encode(&o)));
                }
                let jobs = client.list(&q).await.map_err(api_err)?;
                if json {
                    return print_stdout(&serde_json::to_string_pretty(&jobs)?);
                }
                let mut table = Table::new(
                    "{:<36} {:<10} {:<6} {:<10} {}",
                    &["ID", "STATE", "EXIT", "OWNER", "ARGV"],
                );
                for j in &jobs {
                    let exit = j.exit_code.map_or("-".into(), |c| c.to_string());
                    // Another owner's argv, made safe for this terminal.
                    let argv = clean(&j.spec.argv.join(" "));
                    table.row(&[&j.id, &j.state.as_str(), &exit, &j.owner, &argv]);
                }
                print_stdout(table.finish().trim_end())
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
                // A job that never started has no output: say why instead of nothing.
                let rec = client.get(&id).await.map_err(api_err)?;
                if never_started(&rec) {
                    report_end(&rec);
                    return Ok(ExitCode::from(exit_code(&rec)));
                }
                Ok(ExitCode::SUCCESS)
            }
            JobCommand::Wait { id } => {
                let rec = client.wait(&id).await.map_err(api_err)?;
                report_end(&rec);
                Ok(ExitCode::from(exit_code(&rec)))
            }
            JobCommand::Prune { keep, json } => {
                let p = client.prune(keep).await.map_err(api_err)?;
                if json {
                    return print_stdout(&serde_json::to_string(&p)?);
                }
                print_stdout(&format!(
                    "deleted {} finished jobs, {} freed; {} finished jobs keep {}",
                    p.deleted,
                    mib(p.freed_bytes),
                    p.finished_jobs,
                    mib(p.kept_bytes)
                ))
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

/// Bytes as MiB with one decimal, for people.
pub(super) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
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

/// The job the flags describe.
pub(super) fn spec_of(a: crate::cli::JobSpecArgs) -> anyhow::Result<JobSpec> {
    for (name, _) in &a.env {
        if looks_like_a_credential(name) {
            eprintln!(
                "railgrid: warning: --env {name}: an --env value is stored with the job and shown to whoever may read its status (jobs:read at a hub); a credential belongs in a secret (--secret-file locally; docs/security.md, \"Secrets\")"
            );
        }
    }
    let network = match a.allow.is_empty() {
        true => a.network,
        false => Some(crate::proto::job::Network::Allow(
            crate::proto::egress::Rules::new(a.allow).map_err(anyhow::Error::msg)?,
        )),
    };
    Ok(JobSpec {
        id: a.id,
        argv: a.command,
        cwd: a.cwd,
        env: a.env.into_iter().collect(),
        timeout_secs: a.timeout.map(|d| d.as_secs().max(1)),
        owner: a.owner,
        limits: limits_of(&a.limits),
        network,
        widen_network: a.widen_network,
        ..JobSpec::default()
    })
}

/// Whether a variable's name says it holds a credential.
fn looks_like_a_credential(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    [
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "API_KEY",
        "APIKEY",
        "PRIVATE_KEY",
        "CREDENTIAL",
        "AUTH",
    ]
    .iter()
    .any(|w| upper.contains(w))
}

/// The limits the flags give, `None` for none.
fn limits_of(a: &crate::cli::JobLimitArgs) -> Option<Limits> {
    let limits = Limits {
        memory_bytes: a.memory_bytes,
        cpu_secs: a.cpu_secs,
        open_files: a.open_files,
        processes: a.processes,
        cpu_millis: a.cpu_millis,
    };
    (limits != Limits::default()).then_some(limits)
}

/// `--secret-file NAME=FILE` (or `--secret-mount`, `flag`): each file's contents, for a
/// variable (`variable`) with one trailing newline dropped.
fn secret_files(
    flag: &str,
    args: &[String],
    variable: bool,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let mut out = std::collections::BTreeMap::new();
    for a in args {
        let (name, path) = a
            .split_once('=')
            .with_context(|| format!("{flag} {a:?}: give NAME=FILE"))?;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{flag} {name}: reading {path}"))?;
        let text = match text.strip_suffix('\n') {
            Some(t) if variable => t.strip_suffix('\r').unwrap_or(t),
            _ => &text,
        };
        if out.insert(name.to_owned(), text.to_owned()).is_some() {
            anyhow::bail!("{flag} {name} is given twice");
        }
    }
    Ok(out)
}

async fn submit(
    client: &Client,
    socket: &std::path::Path,
    args: JobSubmitArgs,
) -> anyhow::Result<ExitCode> {
    let mut spec = spec_of(args.job)?;
    let mut secrets = secret_files("--secret-file", &args.secret_file, true)?;
    spec.secrets = secrets.keys().cloned().collect();
    let mounted = secret_files("--secret-mount", &args.secret_mount, false)?;
    spec.secret_files = mounted.keys().cloned().collect();
    for (name, value) in mounted {
        if secrets.insert(name.clone(), value).is_some() {
            anyhow::bail!("secret {name} is given both as a variable and as a file");
        }
    }
    // Before the submission: a Ctrl-C from then on is the job's to handle.
    let signals = if args.detach {
        None
    } else {
        Some(Interrupts::new()?)
    };
    let (created, sub) = client.submit_with(&spec, &secrets).await.map_err(api_err)?;
    for w in &sub.warnings {
        eprintln!("railgrid: warning: {w}");
    }
    let Some(mut signals) = signals else {
        let note = if created { "" } else { " (already submitted)" };
        return print_stdout(&format!("{}{note}", sub.id));
    };
    // Stream both outputs while the job runs, then exit as the job did.
    let follow = async {
        let (mut out, mut err) = (tokio::io::stdout(), tokio::io::stderr());
        let (a, b) = tokio::join!(
            client.output(&sub.id, Stream::Stdout, true, &mut out),
            client.output(&sub.id, Stream::Stderr, true, &mut err),
        );
        a.context("streaming stdout")?;
        b.context("streaming stderr")?;
        client.wait(&sub.id).await.map_err(api_err)
    };
    let detach = format!(
        "railgrid job --socket {} logs --follow {}",
        socket.display(),
        sub.id
    );
    let how = "(SIGTERM to its process group, SIGKILL after its grace)";
    let cancel = || async { client.cancel(&sub.id).await.map_err(api_err) };
    let Some(rec) = follow_or_cancel(&mut signals, follow, &sub.id, how, &detach, cancel).await?
    else {
        return Ok(ExitCode::from(DETACHED));
    };
    report_end(&rec);
    Ok(ExitCode::from(exit_code(&rec)))
}

/// True for a job whose process never ran: it could not be started.
fn never_started(rec: &JobRecord) -> bool {
    rec.state == JobState::Failed && rec.pid.is_none() && rec.signal.is_none()
}

/// One line on stderr for a job that did not end by its own exit: it could not start,
/// timed out, was cancelled, was lost, or was killed by a signal. A job that exited (0 or
/// not) says nothing more, as a command run from a shell.
fn report_end(rec: &JobRecord) {
    let why = rec
        .error
        .as_deref()
        .map(|e| format!(": {e}"))
        .unwrap_or_default();
    let line = match rec.state {
        // The record's error already says "could not start …".
        JobState::Failed if never_started(rec) => match &rec.error {
            Some(e) => format!("failed: {e}"),
            None => "could not be started".to_owned(),
        },
        JobState::Succeeded | JobState::Failed => match (rec.exit_code, rec.signal) {
            (None, Some(sig)) => format!("was killed by signal {sig}"),
            _ => return,
        },
        JobState::TimedOut => format!("timed out{why}"),
        // "cancelled: cancelled" says nothing twice.
        other if rec.error.as_deref() == Some(other.as_str()) => other.as_str().to_owned(),
        other => format!("{}{why}", other.as_str()),
    };
    eprintln!("railgrid: job {} {line}", rec.id);
}

/// The exit code a shell would show for the job: its own (127 not found and 126 not
/// executable for a program that could not start), 128 + signal, 124 for a timeout (as
/// timeout(1)), 1 otherwise.
fn exit_code(rec: &JobRecord) -> u8 {
    shell_exit_code(rec.state, rec.exit_code, rec.signal)
}

/// [`exit_code`] from a job's state and how its process ended.
pub(super) fn shell_exit_code(state: JobState, exit_code: Option<i32>, signal: Option<i32>) -> u8 {
    match state {
        JobState::TimedOut => 124,
        _ => match (exit_code, signal) {
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
    if !r.spec.env.is_empty() {
        let names: Vec<&str> = r.spec.env.keys().map(String::as_str).collect();
        out.push_str(&format!(
            "env:      {} (values stored with the job and shown by its status; credentials go in secrets)\n",
            super::admin::clean(&names.join(", "))
        ));
    }
    let secrets: Vec<&str> = crate::proto::secret::names(&r.spec)
        .map(String::as_str)
        .collect();
    if !secrets.is_empty() {
        out.push_str(&format!(
            "secrets:  {}\n",
            super::admin::clean(&secrets.join(", "))
        ));
    }
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
    for d in &r.egress_denied {
        out.push_str(&format!(
            "denied:   {} ×{}: {}\n",
            super::admin::clean(&d.destination),
            d.count,
            super::admin::clean(&d.reason)
        ));
    }
    out.push_str(&format!(
        "confined: {}",
        r.confinement.as_deref().unwrap_or("-")
    ));
    out
}
