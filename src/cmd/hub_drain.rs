//! `railgrid hub agent drain | resume` (docs/hub.md, "Draining agents"): the hub's drain
//! of agents, by id or selector, and `--wait`, which follows the agents' reports until
//! each is idle and then says what the deadline cancelled.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use super::admin::clean;
use super::print_stdout;
use crate::cli::{HubAgentsArgs, HubDrainArgs};
use crate::hub_client::admin::{AdminClient, Target};
use crate::proto::fleet_job::HubJobView;
use crate::proto::hub::{AgentView, DrainRequest};

/// How often `--wait` asks the hub.
const POLL: Duration = Duration::from_millis(500);
/// What a job cancelled by a drain's deadline says of itself (the runner's words).
const DEADLINE_WORDS: &str = "drain deadline";

pub(super) fn drain(target: &Target, a: HubDrainArgs, json: bool) -> anyhow::Result<ExitCode> {
    super::admin::admin_exit(target, |c| async move { run_drain(&c, a, json).await })
}

fn request(a: &HubAgentsArgs, deadline: Option<Duration>) -> DrainRequest {
    DrainRequest {
        agent: a.id.clone(),
        selector: a.select.as_ref().map(|s| s.to_string()),
        deadline_secs: deadline.map(|d| d.as_secs().max(1)),
    }
}

pub(super) async fn resume(c: AdminClient, a: HubAgentsArgs, json: bool) -> anyhow::Result<String> {
    let views = c.resume(&request(&a, None)).await?;
    if json {
        return Ok(serde_json::to_string(&views)?);
    }
    Ok(views
        .iter()
        .map(|v| {
            let host = v.report.as_ref().and_then(|r| r.drain.as_ref()).filter(|d| d.host);
            match host {
                Some(d) => format!(
                    "agent {}: the hub's drain ended; its host still drains it ({}: `railgrid agent resume` on the host)",
                    v.id,
                    clean(&d.reason)
                ),
                None => format!("agent {}: takes jobs again", v.id),
            }
        })
        .collect::<Vec<_>>()
        .join("\n"))
}

async fn run_drain(c: &AdminClient, a: HubDrainArgs, json: bool) -> anyhow::Result<ExitCode> {
    let began_ms = crate::util::unix_now_ms();
    let views = c.drain(&request(&a.agents, a.deadline)).await?;
    if !a.wait {
        if json {
            return print_stdout(&serde_json::to_string(&views)?);
        }
        return print_stdout(&lines(&views));
    }
    if !json {
        eprintln!("{}", lines(&views));
    }
    // Each agent's report counts once it is of the drain's generation or later.
    let drained: HashMap<String, u64> = views
        .iter()
        .map(|v| (v.id.clone(), v.desired_generation))
        .collect();
    let mut shown = None;
    let last = loop {
        let now: Vec<AgentView> = c
            .list()
            .await?
            .into_iter()
            .filter(|v| drained.contains_key(&v.id))
            .collect();
        let waiting: Vec<(&AgentView, Option<u64>)> = now
            .iter()
            .filter_map(|v| {
                let left = left_on(v, drained[&v.id]);
                (left != Some(0)).then_some((v, left))
            })
            .collect();
        if waiting.is_empty() {
            break now;
        }
        let said: Vec<String> = waiting
            .iter()
            .map(|(v, left)| match left {
                Some(n) => format!("{} ({n} left)", v.id),
                None if !v.connected => format!("{} (not connected)", v.id),
                None => format!("{} (not yet drained)", v.id),
            })
            .collect();
        let said = said.join(", ");
        if shown.as_ref() != Some(&said) {
            eprintln!("railgrid: waiting for {said}");
            shown = Some(said);
        }
        tokio::time::sleep(POLL).await;
    };
    let mut cancelled = Vec::new();
    for id in drained.keys() {
        let jobs = c.jobs(&[("agent", Some(id.as_str()))], 1000).await?;
        cancelled.extend(jobs.into_iter().filter(|j| by_deadline(j, began_ms)));
    }
    cancelled.sort_by(|a, b| (&a.agent, &a.id).cmp(&(&b.agent, &b.id)));
    if json {
        let out = serde_json::json!({"agents": last, "cancelled": cancelled});
        print_stdout(&out.to_string())?;
    } else {
        for v in &last {
            eprintln!("railgrid: agent {} is idle", v.id);
        }
        for j in &cancelled {
            eprintln!(
                "railgrid: job {} on {} was cancelled at the drain's deadline",
                clean(&j.id),
                clean(&j.agent)
            );
        }
    }
    Ok(if cancelled.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The jobs `v` still holds, once its report is of `generation` (the drain's) or later
/// and carries the drain; `Some(0)` for a revoked agent (its jobs are over at the hub).
fn left_on(v: &AgentView, generation: u64) -> Option<u64> {
    if v.revoked {
        return Some(0);
    }
    if v.observed_generation < generation {
        return None;
    }
    v.report.as_ref()?.drain.as_ref()?.jobs_left
}

/// A hub job a drain's deadline cancelled, since `began_ms`.
fn by_deadline(j: &HubJobView, began_ms: u64) -> bool {
    j.state == "cancelled"
        && j.finished_ms.is_some_and(|t| t >= began_ms)
        && j.error
            .as_deref()
            .is_some_and(|e| e.contains(DEADLINE_WORDS))
}

fn lines(views: &[AgentView]) -> String {
    let now = crate::util::unix_now_ms();
    views
        .iter()
        .map(|v| {
            let state = v
                .drain_summary(now)
                .unwrap_or_else(|| "draining".to_owned());
            format!("agent {}: {state}", v.id)
        })
        .collect::<Vec<_>>()
        .join("\n")
}
