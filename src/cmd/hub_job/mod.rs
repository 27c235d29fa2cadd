//! `railgrid hub job …`: jobs on agents, through the hub's admin API.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use super::admin::{ago, clean};
use super::interrupts::{follow_or_cancel, Interrupts, DETACHED};
use super::job::shell_exit_code;
use super::print_stdout;
use super::table::Table;

mod group;
use crate::cli::{HubJobCommand, HubJobSubmitArgs};
use crate::hub_client::admin::{AdminClient, AdminError, Target};
use crate::proto::fleet_job::{HubJobSubmit, HubJobView};
use crate::proto::job::JobState;

/// How long a follower waits before it asks a hub that went away again.
const RECONNECT: Duration = Duration::from_secs(1);

pub(super) fn run(target: &Target, cmd: HubJobCommand, json: bool) -> anyhow::Result<ExitCode> {
    super::admin::admin_exit(target, |c| async move { command(&c, cmd, json).await })
}

async fn command(c: &AdminClient, cmd: HubJobCommand, json: bool) -> anyhow::Result<ExitCode> {
    match cmd {
        HubJobCommand::Submit(a) => submit(c, *a, json).await,
        HubJobCommand::List {
            agent,
            select,
            group,
            limit,
        } => {
            let select = select.map(|s| s.to_string());
            let filter = [
                ("agent", agent.as_deref()),
                ("selector", select.as_deref()),
                ("group", group.as_deref()),
            ];
            let jobs = c.jobs(&filter, limit).await?;
            if json {
                return print_stdout(&serde_json::to_string_pretty(&jobs)?);
            }
            print_stdout(job_table(&jobs).trim_end())
        }
        HubJobCommand::Status { id } => {
            let v = c.job(&id).await?;
            if json {
                return print_stdout(&serde_json::to_string_pretty(&v)?);
            }
            print_stdout(job_detail(&v).trim_end())
        }
        HubJobCommand::Logs {
            id,
            stdout,
            stderr,
            follow,
        } => {
            let (want_out, want_err) = match (stdout, stderr) {
                (false, false) => (true, true),
                picked => picked,
            };
            let out = async {
                if !want_out {
                    return Ok(());
                }
                let mut w = tokio::io::stdout();
                if follow {
                    follow_stream(c, &id, "stdout", &mut w).await
                } else {
                    print_all(c, &id, "stdout", &mut w).await
                }
            };
            // Both: each stream where it belongs. One picked: it goes to stdout, as the
            // local `job logs --stderr` prints it, for a pipe to read.
            let err = async {
                if !want_err {
                    return Ok(());
                }
                let mut w: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>> = if want_out {
                    Box::pin(tokio::io::stderr())
                } else {
                    Box::pin(tokio::io::stdout())
                };
                if follow {
                    follow_stream(c, &id, "stderr", &mut w).await
                } else {
                    print_all(c, &id, "stderr", &mut w).await
                }
            };
            let (a, b) = tokio::join!(out, err);
            a?;
            b?;
            Ok(ExitCode::SUCCESS)
        }
        HubJobCommand::Wait { id, group } => match (id, group) {
            (_, Some(group)) => group::wait(c, &group).await,
            (Some(id), None) => {
                let v = c.wait_job(&id).await?;
                Ok(ended(&v))
            }
            (None, None) => unreachable!("clap requires an id or --group"),
        },
        HubJobCommand::Cancel {
            id: None,
            group: Some(group),
        } => group::cancel(c, &group, json).await,
        HubJobCommand::Cancel { id, .. } => {
            let id = id.unwrap_or_default();
            let v = c.cancel_job(&id).await?;
            if json {
                return print_stdout(&serde_json::to_string_pretty(&v)?);
            }
            if v.cancel_requested {
                return print_stdout(&format!("{} {} (cancel requested)", v.id, v.state));
            }
            let line = if v.job_state() == Some(JobState::Cancelled) {
                format!("{} cancelled", v.id)
            } else {
                format!(
                    "{} has already ended ({}): nothing to cancel",
                    v.id,
                    clean(&v.state)
                )
            };
            print_stdout(&line)
        }
    }
}

async fn submit(c: &AdminClient, a: HubJobSubmitArgs, json: bool) -> anyhow::Result<ExitCode> {
    if a.connected_only && !a.each {
        return Err(super::usage(anyhow::anyhow!(
            "--connected-only goes with --each (a fan-out)"
        )));
    }
    if a.each {
        return group::submit(c, a, json).await;
    }
    let mut spec = super::job::spec_of(a.job)?;
    super::hub_secret::name_secrets(&mut spec, &a.secret).map_err(super::usage)?;
    // Before the submission: a Ctrl-C from then on cancels the job.
    let signals = if a.wait {
        Some(Interrupts::new()?)
    } else {
        None
    };
    let v = c
        .submit_job(&HubJobSubmit {
            agent: a.agent,
            selector: a.select.map(|s| s.to_string()),
            priority: a.priority,
            // Whole seconds, at least one: what the hub takes.
            queue_timeout_secs: a
                .queue_timeout
                .map(|d| d.as_secs_f64().ceil().max(1.0) as u64),
            retries: a.retry,
            spec,
        })
        .await?;
    let Some(mut signals) = signals else {
        if json {
            return print_stdout(&serde_json::to_string_pretty(&v)?);
        }
        return print_stdout(&v.id);
    };
    let id = v.id.clone();
    let follow = async {
        let (mut out, mut err) = (tokio::io::stdout(), tokio::io::stderr());
        let (a, b) = tokio::join!(
            follow_stream(c, &id, "stdout", &mut out),
            follow_stream(c, &id, "stderr", &mut err),
        );
        a?;
        b?;
        Ok::<_, anyhow::Error>(c.wait_job(&id).await?)
    };
    let detach = format!("railgrid hub job logs --follow {id}");
    let cancel = || async { c.cancel_job(&id).await.map_err(anyhow::Error::from) };
    let Some(v) = follow_or_cancel(
        &mut signals,
        follow,
        &id,
        "through the hub",
        &detach,
        cancel,
    )
    .await?
    else {
        return Ok(ExitCode::from(DETACHED));
    };
    Ok(ended(&v))
}

/// The job's line in a table, and the exit code a shell shows for it ("-" before it
/// ends), as `wait` exits with.
fn shell_exit(j: &HubJobView) -> String {
    match j.job_state() {
        Some(s) if s.is_terminal() && (j.exit_code.is_some() || j.signal.is_some()) => {
            shell_exit_code(s, j.exit_code, j.signal).to_string()
        }
        _ => "-".into(),
    }
}

/// True for failures a follower rides out: the hub unreachable, restarting, or busy.
fn transient(e: &AdminError) -> bool {
    match e {
        AdminError::Request { .. } | AdminError::Client(_) => true,
        AdminError::Status { status, .. } => {
            status.is_server_error() || *status == reqwest::StatusCode::TOO_MANY_REQUESTS
        }
        _ => false,
    }
}

/// Copies a stream to `out` as it reaches the hub, until the job is done and all of it
/// is out; a hub that goes away meanwhile is asked again, from the offset reached.
pub(super) async fn follow_stream(
    c: &AdminClient,
    id: &str,
    stream: &str,
    out: &mut (impl tokio::io::AsyncWrite + Unpin),
) -> Result<(), AdminError> {
    let mut offset = 0;
    let mut lost = false;
    loop {
        let step = async {
            offset = c.follow_output(id, stream, offset, out).await?;
            // The hub ended the stream: the job is done, or the hub went away.
            c.output(id, stream, offset).await
        };
        match step.await {
            Ok(slice) => {
                if write_slice(out, &slice, &mut offset).await? {
                    return Ok(());
                }
            }
            Err(e) if transient(&e) => {
                if !lost {
                    eprintln!(
                        "railgrid: lost the hub while following job {id} ({}); trying again",
                        crate::error_chain(&e)
                    );
                    lost = true;
                }
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(RECONNECT).await;
    }
}

/// Writes what the hub holds of a stream now to `out`.
async fn print_all(
    c: &AdminClient,
    id: &str,
    stream: &str,
    out: &mut (impl tokio::io::AsyncWrite + Unpin),
) -> Result<(), AdminError> {
    let mut offset = 0;
    loop {
        let slice = c.output(id, stream, offset).await?;
        if slice.bytes.is_empty() || write_slice(out, &slice, &mut offset).await? {
            let _ = tokio::io::AsyncWriteExt::flush(out).await;
            return Ok(());
        }
    }
}

/// Writes `slice` to `out` and moves `offset` past it; true once the stream is complete
/// (then flushed).
async fn write_slice(
    out: &mut (impl tokio::io::AsyncWrite + Unpin),
    slice: &crate::hub_client::admin::Output,
    offset: &mut u64,
) -> Result<bool, AdminError> {
    use tokio::io::AsyncWriteExt;
    if !slice.bytes.is_empty() {
        out.write_all(&slice.bytes)
            .await
            .map_err(AdminError::Output)?;
        *offset = slice.next;
    }
    if slice.complete {
        let _ = out.flush().await;
    }
    Ok(slice.complete)
}

/// Says on stderr how a done job ended when its own exit does not say it, and what of
/// its output was cut; the exit code a shell would show for it.
pub(super) fn ended(v: &HubJobView) -> ExitCode {
    let state = v.job_state();
    // "cancelled: cancelled" says nothing twice.
    let why = v
        .error
        .as_deref()
        .filter(|e| *e != v.state)
        .map(|e| format!(": {}", clean(e)))
        .unwrap_or_default();
    let line = match state {
        // A job whose program could not start (not found: 127, not executable: 126)
        // carries the runner's reason, as `railgrid job` prints it.
        Some(JobState::Failed) if v.error.is_some() => Some(format!("failed{why}")),
        Some(JobState::Succeeded | JobState::Failed) if v.exit_code.is_some() => None,
        Some(JobState::Succeeded | JobState::Failed) => match v.signal {
            Some(sig) => Some(format!("was killed by signal {sig}")),
            None => Some(format!("failed{why}")),
        },
        Some(JobState::TimedOut) => Some(format!("timed out{why}")),
        _ => Some(format!("{}{why}", clean(&v.state))),
    };
    if let Some(line) = line {
        eprintln!("railgrid: job {} {line}", v.id);
    }
    if let Some(t) = &v.output_truncated {
        for (name, why) in [("stdout", &t.stdout), ("stderr", &t.stderr)] {
            if let Some(why) = why {
                eprintln!("railgrid: job {} {name} was cut: {}", v.id, clean(why));
            }
        }
    }
    let code = match state {
        Some(s) => shell_exit_code(s, v.exit_code, v.signal),
        None => 1,
    };
    ExitCode::from(code)
}

fn job_table(jobs: &[HubJobView]) -> String {
    let mut table = Table::new(
        "{:<24} {:<20} {:<10} {:>4} {:>14} {:<18} {}",
        &[
            "ID",
            "AGENT",
            "STATE",
            "EXIT",
            "OUT/ERR BYTES",
            "SUBMITTED",
            "COMMAND",
        ],
    );
    for j in jobs {
        let exit = shell_exit(j);
        let state = if j.cancel_requested {
            format!("{}*", j.state)
        } else {
            j.state.clone()
        };
        let agent = if j.agent.is_empty() { "-" } else { &j.agent };
        table.row(&[
            &j.id,
            &agent,
            &state,
            &exit,
            &format!("{}/{}", j.stdout_stored, j.stderr_stored),
            &ago(Some(j.created_ms / 1000)),
            &clean(&j.spec.argv.join(" ")),
        ]);
    }
    table.finish()
}

fn job_detail(j: &HubJobView) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| {
        let _ = writeln!(out, "{k:<16} {v}");
    };
    line("id", j.id.clone());
    line(
        "agent",
        if j.agent.is_empty() {
            "- (none yet)".into()
        } else {
            j.agent.clone()
        },
    );
    if let Some(s) = &j.selector {
        line("selector", clean(s));
    }
    match j.effective_priority {
        Some(e) if e != j.priority => line(
            "priority",
            format!("{} ({e} with its wait in the queue)", j.priority),
        ),
        _ => line("priority", j.priority.to_string()),
    }
    if j.attempt > 1 || j.retries > 0 {
        line(
            "attempt",
            format!("{} ({} retries left if it is lost)", j.attempt, j.retries),
        );
    }
    if let (Some(d), false) = (j.queue_deadline_ms, j.done) {
        if j.agent.is_empty() {
            line(
                "expires",
                format!(
                    "in {} unless an agent takes it",
                    humantime::format_duration(Duration::from_secs(
                        d.saturating_sub(crate::util::unix_now_ms()) / 1000
                    ))
                ),
            );
        }
    }
    line("command", clean(&j.spec.argv.join(" ")));
    if !j.spec.env.is_empty() {
        let names: Vec<&str> = j.spec.env.keys().map(String::as_str).collect();
        line(
            "env",
            clean(&format!(
                "{} (values stored with the job, shown to every token with jobs:read; credentials go in secrets)",
                names.join(", ")
            )),
        );
    }
    let secrets: Vec<&str> = crate::proto::secret::names(&j.spec)
        .map(String::as_str)
        .collect();
    if !secrets.is_empty() {
        line("secrets", clean(&secrets.join(", ")));
    }
    let state = if j.cancel_requested {
        format!("{} (cancel requested)", j.state)
    } else {
        j.state.clone()
    };
    line("state", state);
    if let Some(w) = &j.waiting {
        line("waiting", clean(w));
    }
    line(
        "done",
        if j.done {
            "yes".into()
        } else {
            "no (running, or its output is still arriving)".into()
        },
    );
    if let Some(c) = j.exit_code {
        line("exit code", c.to_string());
    }
    if let Some(s) = j.signal {
        line("signal", s.to_string());
    }
    if let Some(e) = &j.error {
        line("error", clean(e));
    }
    line("submitted", ago(Some(j.created_ms / 1000)));
    if let Some(s) = j.started_ms {
        line("started", ago(Some(s / 1000)));
    }
    if let Some(f) = j.finished_ms {
        line("finished", ago(Some(f / 1000)));
        let took = |from: u64| {
            humantime::format_duration(std::time::Duration::from_millis(
                f.saturating_sub(from) / 100 * 100,
            ))
        };
        line(
            "took",
            match j.started_ms {
                Some(s) => format!("{} ({} from submission)", took(s), took(j.created_ms)),
                None => format!("{} from submission", took(j.created_ms)),
            },
        );
    }
    if let Some(s) = j.job_state().filter(|s| s.is_terminal()) {
        line(
            "exit (shell)",
            shell_exit_code(s, j.exit_code, j.signal).to_string(),
        );
    }
    line(
        "stdout",
        format!(
            "{} bytes at the hub ({} printed)",
            j.stdout_stored, j.stdout_bytes
        ),
    );
    line(
        "stderr",
        format!(
            "{} bytes at the hub ({} printed)",
            j.stderr_stored, j.stderr_bytes
        ),
    );
    if let Some(t) = &j.output_truncated {
        if let Some(w) = &t.stdout {
            line("stdout cut", clean(w));
        }
        if let Some(w) = &t.stderr {
            line("stderr cut", clean(w));
        }
    }
    for d in &j.egress_denied {
        line(
            "egress denied",
            clean(&format!("{} ×{}: {}", d.destination, d.count, d.reason)),
        );
    }
    out
}
