//! `railgrid hub rollout start|status|pause|resume|abort` (docs/hub.md, "Rollouts").

use std::fmt::Write as _;
use std::time::Duration;

use super::admin::clean;
use super::table::Table;
use super::usage;
use crate::cli::{HubRolloutCommand, HubRolloutStartArgs};
use crate::hub_client::admin::AdminClient;
use crate::proto::rollout::{AbortRequest, RolloutRequest, RolloutView};

pub(super) async fn run(
    c: AdminClient,
    cmd: HubRolloutCommand,
    json: bool,
) -> anyhow::Result<String> {
    let view = match cmd {
        HubRolloutCommand::Start(a) => {
            let v = c.start_rollout(&request(a)?).await?;
            if json {
                return Ok(serde_json::to_string(&v)?);
            }
            let sizes: Vec<String> = v
                .waves
                .iter()
                .map(|w| w.members.len().to_string())
                .collect();
            return Ok(format!(
                "rollout {id} started: {version} to {n} agent(s) in {w} wave(s) ({sizes}); follow it with `railgrid hub rollout status {id}`",
                id = v.id,
                version = v.version,
                n = v.waves.iter().map(|w| w.members.len()).sum::<usize>(),
                w = v.waves.len(),
                sizes = sizes.join(", "),
            ));
        }
        HubRolloutCommand::Status { id: None } => {
            let all = c.rollouts().await?;
            if json {
                return Ok(serde_json::to_string(&all)?);
            }
            return Ok(list(&all));
        }
        HubRolloutCommand::Status { id: Some(id) } => c.rollout(&id).await?,
        HubRolloutCommand::Pause { id } => c.steer_rollout(&id, "pause", None).await?,
        HubRolloutCommand::Resume { id } => c.steer_rollout(&id, "resume", None).await?,
        HubRolloutCommand::Abort { id, rollback } => {
            c.steer_rollout(&id, "abort", Some(&AbortRequest { rollback }))
                .await?
        }
    };
    if json {
        return Ok(serde_json::to_string(&view)?);
    }
    Ok(status(&view))
}

fn request(a: HubRolloutStartArgs) -> anyhow::Result<RolloutRequest> {
    if !crate::proto::desired::is_version(&a.version) {
        return Err(usage(anyhow::anyhow!(
            "--version {:?} is not a version (such as 1.4.0)",
            a.version
        )));
    }
    if a.max_parallel == 0 {
        return Err(usage(anyhow::anyhow!(
            "--max-parallel 0 would upgrade no agent: give 1 or more"
        )));
    }
    if a.deadline == Some(Duration::ZERO) {
        return Err(usage(anyhow::anyhow!(
            "--deadline 0s would end the rollout at once"
        )));
    }
    Ok(RolloutRequest {
        version: a.version,
        selector: a.select.map(|s| s.to_string()),
        waves: Some(a.waves),
        soak_secs: a.soak.as_secs(),
        max_parallel: Some(a.max_parallel),
        max_failures: a.max_failures,
        deadline_secs: a.deadline.map(|d| d.as_secs().max(1)),
    })
}

/// How long since `from_ms` (until `to_ms`, or now).
fn elapsed(from_ms: u64, to_ms: Option<u64>) -> String {
    let to = to_ms.unwrap_or_else(crate::util::unix_now_ms);
    let secs = to.saturating_sub(from_ms) / 1000;
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}

fn list(all: &[RolloutView]) -> String {
    if all.is_empty() {
        return "no rollouts (railgrid hub rollout start --version V)".into();
    }
    let mut table = Table::new(
        "{:<6} {:<14} {:<13} {:>6} {:>11}  {:<12} {}",
        &[
            "ID",
            "VERSION",
            "STATE",
            "WAVE",
            "COMMITTED",
            "TOOK",
            "SELECTOR",
        ],
    );
    for v in all {
        let total: usize = v.counts.values().sum();
        let committed = v.counts.get("committed").copied().unwrap_or(0);
        let selector = v.selector.as_deref().map(clean);
        table.row(&[
            &clean(&v.id),
            &clean(&v.version),
            &clean(&v.state),
            &(v.wave + 1),
            &format!("{committed}/{total}"),
            &elapsed(v.created_ms, v.finished_ms),
            &selector.unwrap_or_else(|| "(all agents)".into()),
        ]);
    }
    table.finish().trim_end().to_owned()
}

fn status(v: &RolloutView) -> String {
    let mut out = String::new();
    let total: usize = v.counts.values().sum();
    let _ = writeln!(
        out,
        "rollout {}: {} to {total} agent(s) ({}), {} for {}",
        clean(&v.id),
        clean(&v.version),
        v.selector
            .as_deref()
            .map(|s| format!("selected by {}", clean(s)))
            .unwrap_or_else(|| "the whole fleet".into()),
        clean(&v.state),
        elapsed(v.created_ms, v.finished_ms),
    );
    if let Some(w) = &v.waiting {
        let _ = writeln!(out, "waiting:  {}", clean(w));
    } else if let Some(r) = &v.reason {
        let _ = writeln!(out, "reason:   {}", clean(r));
    }
    let counts: Vec<String> = v.counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let _ = writeln!(out, "members:  {}", counts.join(", "));
    let _ = writeln!(
        out,
        "settings: waves {}, soak {}s, max-parallel {}, max-failures {}{}",
        clean(&v.waves_spec),
        v.soak_secs,
        v.max_parallel,
        v.max_failures,
        v.deadline_ms
            .map(|d| format!(
                ", deadline in {}",
                elapsed(crate::util::unix_now_ms(), Some(d))
            ))
            .unwrap_or_default()
    );
    out.push('\n');
    let mut table = Table::new(
        "{:<5} {:<8} {:<24} {:<12} {:<14} {:<14} {}",
        &["WAVE", "", "AGENT", "STATE", "FROM", "NOW", "DETAIL"],
    );
    let shown = |v: Option<&str>| v.map(clean).unwrap_or_else(|| "-".into());
    for w in &v.waves {
        for (i, m) in w.members.iter().enumerate() {
            let (wave, state) = match i {
                0 => ((w.index + 1).to_string(), w.state.as_str()),
                _ => (String::new(), ""),
            };
            table.row(&[
                &wave,
                &state,
                &clean(&m.agent),
                &clean(&m.state),
                &shown(m.from_version.as_deref()),
                &shown(m.version.as_deref()),
                &m.detail.as_deref().map(clean).unwrap_or_default(),
            ]);
        }
    }
    out.push_str(&table.finish());
    out.trim_end().to_owned()
}
