//! `hub job submit --each`, `hub job wait --group` and `hub job cancel --group`: a
//! fan-out's members followed together, each line of their output prefixed by its agent.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use tokio::io::{AsyncBufReadExt, AsyncReadExt};

use super::super::admin::clean;
use super::super::interrupts::{follow_or_cancel, Interrupts, DETACHED};
use super::super::print_stdout;
use super::super::table::Table;
use super::{ended, follow_stream, shell_exit};
use crate::cli::HubJobSubmitArgs;
use crate::hub_client::admin::{AdminClient, AdminError};
use crate::proto::fleet_job::{HubGroupSubmit, HubJobView};
use crate::proto::job::JobState;

/// The most members a group's listing returns (the hub's page bound).
const MAX_MEMBERS: u64 = 1000;
/// The longest piece of output printed as one line: a longer line is cut into pieces,
/// each prefixed, so that a job printing no newline cannot make this client hold it all.
const MAX_LINE: u64 = 64 * 1024;

pub(super) async fn submit(
    c: &AdminClient,
    a: HubJobSubmitArgs,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let Some(selector) = a.select else {
        return Err(super::super::usage(anyhow::anyhow!(
            "--each needs --select: the agents a fan-out reaches"
        )));
    };
    let signals = if a.wait {
        Some(Interrupts::new()?)
    } else {
        None
    };
    let g = c
        .submit_group(&HubGroupSubmit {
            selector: selector.to_string(),
            priority: a.priority,
            connected_only: a.connected_only,
            spec: {
                let mut spec = super::super::job::spec_of(a.job)?;
                super::super::hub_secret::name_secrets(&mut spec, &a.secret)
                    .map_err(super::super::usage)?;
                spec
            },
        })
        .await?;
    let Some(mut signals) = signals else {
        if json {
            return print_stdout(&serde_json::to_string_pretty(&g)?);
        }
        let members: Vec<&str> = g.jobs.iter().map(|j| j.agent.as_str()).collect();
        eprintln!(
            "railgrid: group {} has {} members, on {}",
            g.group,
            g.jobs.len(),
            members.join(", ")
        );
        return print_stdout(&g.group);
    };
    let what = format!("group {}", g.group);
    let detach = format!("railgrid hub job wait --group {}", g.group);
    let cancel = || async { cancel_all(c, &g.group).await.map(drop) };
    let follow = follow_members(c, g.jobs);
    match follow_or_cancel(
        &mut signals,
        follow,
        &what,
        "through the hub",
        &detach,
        cancel,
    )
    .await?
    {
        Some(code) => Ok(code),
        None => Ok(ExitCode::from(DETACHED)),
    }
}

pub(super) async fn wait(c: &AdminClient, group: &str) -> anyhow::Result<ExitCode> {
    follow_members(c, members(c, group).await?).await
}

pub(super) async fn cancel(c: &AdminClient, group: &str, json: bool) -> anyhow::Result<ExitCode> {
    let views = cancel_all(c, group).await?;
    if json {
        return print_stdout(&serde_json::to_string_pretty(&views)?);
    }
    let asked = views.iter().filter(|v| v.cancel_requested).count();
    let now = views
        .iter()
        .filter(|v| v.job_state() == Some(JobState::Cancelled))
        .count();
    print_stdout(&format!(
        "group {group}: {} members, {asked} being cancelled, {now} cancelled, {} ended before",
        views.len(),
        views.len() - asked - now
    ))
}

/// The members of `group`, by agent.
async fn members(c: &AdminClient, group: &str) -> anyhow::Result<Vec<HubJobView>> {
    let mut jobs = c.jobs(&[("group", Some(group))], MAX_MEMBERS).await?;
    if jobs.is_empty() {
        anyhow::bail!("no job of group {:?} at the hub", clean(group));
    }
    jobs.sort_by(|a, b| a.agent.cmp(&b.agent));
    Ok(jobs)
}

/// Cancels every member not done; each as the hub shows it then.
async fn cancel_all(c: &AdminClient, group: &str) -> anyhow::Result<Vec<HubJobView>> {
    let mut out = Vec::new();
    for j in members(c, group).await? {
        out.push(if j.done {
            j
        } else {
            c.cancel_job(&j.id).await?
        });
    }
    Ok(out)
}

/// Streams every member's output, each line prefixed by its agent, until all are done;
/// then a table on stderr and the exit code: 0 only if every member succeeded, else the
/// first failing member's (in agent order).
async fn follow_members(c: &AdminClient, jobs: Vec<HubJobView>) -> anyhow::Result<ExitCode> {
    let streams = jobs.iter().flat_map(|j| {
        ["stdout", "stderr"].map(|stream| follow_prefixed(c, &j.id, &j.agent, stream))
    });
    for r in futures_util::future::join_all(streams).await {
        r?;
    }
    let mut done = Vec::with_capacity(jobs.len());
    for j in &jobs {
        done.push(c.wait_job(&j.id).await?);
    }
    eprint!("{}", table(&done));
    let failed = done
        .iter()
        .find(|v| v.job_state() != Some(JobState::Succeeded));
    Ok(match failed {
        None => ExitCode::SUCCESS,
        Some(v) => ended(v),
    })
}

/// One member's stream, copied to this process's stream of the same name with
/// `[AGENT] ` before each line.
async fn follow_prefixed(
    c: &AdminClient,
    id: &str,
    agent: &str,
    stream: &str,
) -> Result<(), AdminError> {
    let (w, r) = tokio::io::duplex(MAX_LINE as usize);
    let copy = async move {
        let mut w = w;
        follow_stream(c, id, stream, &mut w).await
        // `w` dropped here: the printer sees the end.
    };
    let prefix = format!("[{agent}] ");
    let print = async move {
        let mut r = tokio::io::BufReader::new(r);
        let mut line = Vec::new();
        loop {
            line.clear();
            match (&mut r).take(MAX_LINE).read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            let mut out = Vec::with_capacity(prefix.len() + line.len());
            out.extend_from_slice(prefix.as_bytes());
            out.extend_from_slice(&line);
            // One write per line, under the lock: members' lines never interleave.
            let _ = if stream == "stdout" {
                std::io::stdout().lock().write_all(&out)
            } else {
                std::io::stderr().lock().write_all(&out)
            };
        }
    };
    let (copied, ()) = tokio::join!(copy, print);
    copied
}

fn table(jobs: &[HubJobView]) -> String {
    let mut table = Table::new(
        "{:<20} {:<28} {:<10} {:>4}",
        &["AGENT", "JOB", "STATE", "EXIT"],
    );
    for j in jobs {
        table.row(&[&j.agent, &j.id, &j.state, &shell_exit(j)]);
    }
    let mut out = table.finish();
    let ok = jobs
        .iter()
        .filter(|j| j.job_state() == Some(JobState::Succeeded))
        .count();
    let _ = writeln!(out, "{ok} of {} members succeeded", jobs.len());
    out
}
