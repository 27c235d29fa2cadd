//! `railgrid hub serve` and the admin commands (`hub agent …`, `hub desired …`).

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use super::admin::{admin, ago, clean};
use super::token_file::{create_token_file, write_token};
use super::{print_stdout, usage};
use crate::cli::{
    DesiredScope, HubAgentCommand, HubArgs, HubCommand, HubDesiredCommand, HubDesiredSetArgs,
    HubServeArgs, HubStoreCommand,
};
use crate::hub::tls::TlsSource;
use crate::hub::{self, ServeOptions};
use crate::hub_client::admin::{AdminClient, Target};
use crate::proto::hub::{AgentView, DesiredChange, DesiredSettings, DesiredView, LabelChange};

pub(super) fn run(args: HubArgs) -> anyhow::Result<ExitCode> {
    let HubArgs {
        data_dir,
        url,
        token_file,
        ca_file,
        json,
        command,
    } = args;
    // Neither given: the hub on this host, at its default data dir.
    let data_dir = match (&data_dir, &url) {
        (None, None) => default_data_dir(),
        _ => data_dir,
    };
    let target = Target {
        data_dir,
        url,
        token_file,
        ca_file,
    };
    match command {
        HubCommand::Serve(a) => serve(target, *a),
        HubCommand::Agent {
            command: HubAgentCommand::Drain(a),
        } => super::hub_drain::drain(&target, a, json),
        HubCommand::Agent {
            command: HubAgentCommand::Resume(a),
        } => admin(&target, |c| super::hub_drain::resume(c, a, json)),
        HubCommand::Agent {
            command: HubAgentCommand::Rotate { id, .. },
        } => admin(&target, |c| super::hub_access::rotate(c, id, json)),
        HubCommand::Agent { command } => admin(&target, |c| agent(c, command, json)),
        HubCommand::Desired { command } => admin(&target, |c| desired(c, command, json)),
        HubCommand::Job { command } => super::hub_job::run(&target, command, json),
        HubCommand::Release { command } => {
            admin(&target, |c| super::hub_release::run(c, command, json))
        }
        HubCommand::Rollout { command } => {
            admin(&target, |c| super::hub_rollout::run(c, command, json))
        }
        HubCommand::Token { command } => {
            let t = target.clone();
            admin(&target, |c| async move {
                super::hub_access::token(c, &t, command, json).await
            })
        }
        HubCommand::EnrolToken { command } => admin(&target, |c| {
            super::hub_access::enrol_token(c, command, json)
        }),
        HubCommand::Secret { command } => {
            admin(&target, |c| super::hub_secret::secret(c, command, json))
        }
        HubCommand::Audit { command } => {
            admin(&target, |c| super::hub_access::audit(c, command, json))
        }
        HubCommand::Store { command } => store(target, command, json),
    }
}

fn store(target: Target, command: HubStoreCommand, json: bool) -> anyhow::Result<ExitCode> {
    let a = match command {
        HubStoreCommand::Renumber(a) => a,
        HubStoreCommand::Copy(a) => return super::hub_store_copy::run(a, json),
    };
    let url = super::hub_config::store_url(a.store, a.config.as_deref()).map_err(usage)?;
    let rt = super::current_thread_runtime()?;
    let done = rt
        .block_on(crate::hub::renumber::renumber(
            target.data_dir.as_deref(),
            url.as_deref(),
        ))
        .map_err(|e| if e.is_config() { usage(e) } else { e.into() })?;
    print_stdout(&format!(
        "renumbered {}: the generation counter was {} and is 1; each agent takes the hub's desired state at its next reconcile",
        done.store, done.was
    ))
}

/// `/var/lib/railgrid-hub` as root; `$XDG_STATE_HOME/railgrid-hub` (or
/// `~/.local/state/railgrid-hub`) otherwise; `None` without a home.
fn default_data_dir() -> Option<std::path::PathBuf> {
    if crate::sys::is_root() {
        return Some("/var/lib/railgrid-hub".into());
    }
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    env(crate::env_vars::XDG_STATE_HOME)
        .map(std::path::PathBuf::from)
        .or_else(|| {
            env(crate::env_vars::HOME).map(|h| std::path::Path::new(&h).join(".local/state"))
        })
        .map(|base| base.join("railgrid-hub"))
}

fn serve(target: Target, a: HubServeArgs) -> anyhow::Result<ExitCode> {
    let Some(data_dir) = target.data_dir else {
        return Err(usage(anyhow::anyhow!(
            "hub serve needs --data-dir DIR (its database, tokens and CA live there)"
        )));
    };
    let tls = match (a.tls_cert, a.tls_key) {
        (Some(cert), Some(key)) => TlsSource::Files { cert, key },
        _ => TlsSource::SelfSigned { names: a.tls_name },
    };
    if let Some(u) = &a.url {
        if !u.starts_with("https://") {
            return Err(usage(anyhow::anyhow!(
                "--url {u:?} must start with https://"
            )));
        }
    }
    // Everything the hub writes is its own: tokens, keys, the database.
    crate::sys::set_umask(0o077);
    let opts = ServeOptions {
        data_dir: std::path::absolute(&data_dir)?,
        listen: a.listen,
        tls,
        url: a.url,
        max_connections: a.max_connections.map(|n| n.max(1)),
        max_wait: a.max_wait,
        poll_interval: Duration::from_secs(30),
        job_limits: crate::hub::fleet::JobLimits {
            max_open: a.max_open_jobs as usize,
            max_output: a.max_job_output,
            keep_done: a.keep_done_jobs,
            agent_patience: (!a.agent_patience.is_zero()).then_some(a.agent_patience),
            priority_aging: (!a.priority_aging.is_zero()).then_some(a.priority_aging),
        },
        release_keys: a
            .release_key
            .iter()
            .map(std::path::absolute)
            .collect::<Result<_, _>>()?,
        store: super::hub_config::store_url(a.store, a.config.as_deref()).map_err(usage)?,
        keep_audit: a.keep_audit,
        metrics_listen: a.metrics_listen,
        agent_token_max_age: a.agent_token_max_age,
        secrets_key_file: a
            .secrets_key_file
            .as_deref()
            .map(std::path::absolute)
            .transpose()?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match rt.block_on(hub::serve(opts)) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.is_config() => Err(usage(e)),
        Err(e) => Err(e.into()),
    }
}

async fn agent(c: AdminClient, cmd: HubAgentCommand, json: bool) -> anyhow::Result<String> {
    match cmd {
        HubAgentCommand::Add {
            id,
            token_out,
            reuse_revoked_id,
        } => {
            // The file first: a token the hub hands out and nobody can store is lost, and
            // the agent would have to be revoked and added again.
            let file = token_out.as_deref().map(create_token_file).transpose()?;
            let enrolled = match c.enrol(&id, reuse_revoked_id).await {
                Ok(e) => e,
                Err(e) => {
                    if let Some(path) = &token_out {
                        let _ = std::fs::remove_file(path);
                    }
                    return Err(e.into());
                }
            };
            match (token_out, file) {
                (Some(path), Some(file)) => {
                    write_token(file, &path, &enrolled.token)?;
                    if json {
                        Ok(serde_json::json!({"id": enrolled.id, "token_file": path}).to_string())
                    } else {
                        Ok(format!(
                            "enrolled agent {}; its token is in {} (0600): give it to the agent as hub.token_file",
                            enrolled.id,
                            path.display()
                        ))
                    }
                }
                _ if json => Ok(serde_json::to_string(&enrolled)?),
                _ => Ok(format!(
                    "enrolled agent {}\ntoken: {}\nThe token is shown this once (the hub keeps only its hash): put it in a 0600 file on the agent's host and set hub.token_file.",
                    enrolled.id, enrolled.token
                )),
            }
        }
        HubAgentCommand::List => {
            let agents = c.list().await?;
            if json {
                return Ok(serde_json::to_string(&agents)?);
            }
            Ok(agent_table(&agents))
        }
        HubAgentCommand::Show { id } => {
            let a = c.show(&id).await?;
            if json {
                return Ok(serde_json::to_string(&a)?);
            }
            Ok(agent_detail(&a))
        }
        HubAgentCommand::Label { id, set, remove } => {
            if set.is_empty() && remove.is_empty() {
                return Err(usage(anyhow::anyhow!(
                    "give labels to set (K=V) or --remove K"
                )));
            }
            let change = LabelChange {
                set: set.into_iter().collect(),
                remove,
            };
            let a = c.labels(&id, &change).await?;
            if json {
                return Ok(serde_json::to_string(&a)?);
            }
            Ok(format!(
                "agent {}: hub labels {}; labels in force {}",
                a.id,
                shown_labels(&a.hub_labels),
                shown_labels(&a.labels)
            ))
        }
        HubAgentCommand::Drain(_) | HubAgentCommand::Resume(_) | HubAgentCommand::Rotate { .. } => {
            unreachable!("run by hub_drain")
        }
        HubAgentCommand::Revoke { id } => {
            let a = c.revoke(&id).await?;
            if json {
                return Ok(serde_json::to_string(&a)?);
            }
            Ok(format!(
                "revoked agent {}: its token is refused from now on",
                a.id
            ))
        }
    }
}

async fn desired(c: AdminClient, cmd: HubDesiredCommand, json: bool) -> anyhow::Result<String> {
    let view = match cmd {
        HubDesiredCommand::Show(scope) => c.desired(scope_id(&scope)).await?,
        HubDesiredCommand::Set(args) => {
            let change = desired_change(&args);
            if change.set == DesiredSettings::default() && change.clear.is_empty() {
                return Err(usage(anyhow::anyhow!(
                    "nothing to set: give --runner-enabled, --max-jobs, --max-jobs-per-owner, --version, --rollback or --clear"
                )));
            }
            let view = c.set_desired(scope_id(&args.scope), &change).await?;
            if let (true, Some(v)) = (args.scope.fleet, &args.version) {
                eprintln!(
                    "railgrid: every agent takes {v} at once; `railgrid hub rollout start --version {v}` is the safe way: canaries first, wave by wave, halted at the first rollback"
                );
            }
            view
        }
    };
    if json {
        return Ok(serde_json::to_string(&view)?);
    }
    Ok(desired_text(&view))
}

fn scope_id(s: &DesiredScope) -> Option<&str> {
    if s.fleet {
        None
    } else {
        s.agent.as_deref()
    }
}

fn desired_change(a: &HubDesiredSetArgs) -> DesiredChange {
    DesiredChange {
        set: DesiredSettings {
            runner_enabled: a.runner_enabled,
            // Given with every --runner-enabled: --force holds for this change only.
            force_stop: a.runner_enabled.map(|_| a.force),
            max_jobs: a.max_jobs,
            max_jobs_per_owner: a.max_jobs_per_owner,
            version: a.version.clone(),
            rollback: a.rollback,
            network: a.network.clone(),
            ..DesiredSettings::default()
        },
        clear: a.clear.clone(),
    }
}

/// Labels less `os` and `arch`, which the table shows in a column of their own.
fn without_platform(labels: &crate::proto::labels::Labels) -> crate::proto::labels::Labels {
    let mut rest = labels.clone();
    for k in ["os", "arch"] {
        rest.remove(k);
    }
    rest
}

fn agent_table(agents: &[AgentView]) -> String {
    if agents.is_empty() {
        return "no agents enrolled (railgrid hub agent add ID)".into();
    }
    let now = crate::util::unix_now_ms();
    let rows: Vec<[String; 9]> = agents
        .iter()
        .map(|a| {
            let r = a.report.as_ref();
            [
                a.id.clone(),
                if a.revoked {
                    "revoked".into()
                } else if a.connected {
                    "yes".into()
                } else {
                    "no".into()
                },
                ago(a.last_seen),
                r.map_or("-".into(), |r| clean(&r.version)),
                r.filter(|r| !r.os.is_empty())
                    .map_or("-".into(), |r| clean(&format!("{}/{}", r.os, r.arch))),
                // What a disconnected agent last said is not what holds now: its age.
                r.map_or("-".into(), |r| {
                    let mut state = clean(&r.runner.state);
                    if let Some(d) = a.drain_summary(now) {
                        state = format!("{state}, {d}");
                    }
                    if a.connected || a.revoked {
                        state
                    } else {
                        format!("{state} ({})", ago(a.last_seen))
                    }
                }),
                format!("{}/{}", a.observed_generation, a.desired_generation),
                r.and_then(|r| r.upgrade.as_ref())
                    .map_or("-".into(), |u| match &u.waiting {
                        Some(w) => clean(&format!("{}: {w}", u.state)),
                        None => clean(&u.state),
                    }),
                shown_labels(&without_platform(&a.labels)),
            ]
        })
        .collect();
    let header = [
        "ID",
        "CONNECTED",
        "LAST SEEN",
        "VERSION",
        "OS/ARCH",
        "RUNNER",
        "GENERATION",
        "UPGRADE",
        "LABELS",
    ];
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[&str]| {
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                let _ = write!(out, "{cell}");
            } else {
                let _ = write!(out, "{cell:<w$}  ");
            }
        }
        out.push('\n');
    };
    line(&mut out, &header);
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&mut out, &cells);
    }
    out
}

/// Labels as `k=v,k2=v2`, or `-` for none.
fn shown_labels(labels: &crate::proto::labels::Labels) -> String {
    if labels.is_empty() {
        return "-".into();
    }
    clean(&crate::proto::labels::to_list(labels))
}

fn agent_detail(a: &AgentView) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "agent:       {}", a.id);
    let _ = writeln!(out, "revoked:     {}", a.revoked);
    let _ = writeln!(out, "connected:   {}", a.connected);
    let _ = writeln!(out, "last seen:   {}", ago(a.last_seen));
    let _ = writeln!(
        out,
        "generation:  {} applied, {} desired{}",
        a.observed_generation,
        a.desired_generation,
        if a.observed_generation >= a.desired_generation {
            ""
        } else {
            " (converging)"
        }
    );
    let _ = writeln!(out, "labels:      {}", shown_labels(&a.labels));
    if !a.hub_labels.is_empty() {
        let _ = writeln!(out, "  by hub:    {}", shown_labels(&a.hub_labels));
    }
    if let Some(d) = a.drain_summary(crate::util::unix_now_ms()) {
        let why = a
            .report
            .as_ref()
            .and_then(|r| r.drain.as_ref())
            .map(|d| format!(": {}", clean(&d.reason)))
            .unwrap_or_default();
        let _ = writeln!(out, "drain:       {d}{why}");
    }
    if let Some(r) = &a.report {
        let _ = writeln!(out, "version:     {}", clean(&r.version));
        let _ = writeln!(
            out,
            "host:        {}",
            clean(&format!("{} ({}/{})", r.hostname, r.os, r.arch))
        );
        let pid = r
            .runner
            .pid
            .map(|p| format!(", pid {p}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "runner:      {}{pid}, {} starts",
            clean(&r.runner.state),
            r.runner.starts
        );
        if let Some(e) = &r.runner.last_error {
            let _ = writeln!(out, "last error:  {}", clean(e));
        }
        if let Some(j) = &r.jobs_summary {
            let _ = writeln!(
                out,
                "jobs:        {} running, {} queued",
                j.running, j.queued
            );
        }
        if let Some(u) = &r.upgrade {
            let target = u
                .target
                .as_deref()
                .map(|t| format!(" {}", clean(t)))
                .unwrap_or_default();
            let _ = writeln!(out, "upgrade:     {}{target}", clean(&u.state));
            if let Some(e) = &u.error {
                let _ = writeln!(out, "             {}", clean(e));
            }
            if !u.bad_versions.is_empty() {
                let _ = writeln!(out, "bad:         {}", clean(&u.bad_versions.join(", ")));
            }
        }
    }
    out
}

fn desired_text(v: &DesiredView) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "scope:       {}", v.scope);
    let _ = writeln!(out, "generation:  {}", v.generation);
    let s = &v.settings;
    let show = |o: Option<String>| o.unwrap_or_else(|| "(not set)".into());
    let _ = writeln!(
        out,
        "runner_enabled:      {}",
        show(s.runner_enabled.map(|b| b.to_string()))
    );
    let _ = writeln!(
        out,
        "max_jobs:            {}",
        show(s.max_jobs.map(|n| n.to_string()))
    );
    let _ = writeln!(
        out,
        "max_jobs_per_owner:  {}",
        show(s.max_jobs_per_owner.map(|n| n.to_string()))
    );
    let _ = writeln!(out, "version:             {}", show(s.version.clone()));
    if let Some(r) = s.rollback {
        let _ = writeln!(out, "rollback:            {r}");
    }
    if let Some(n) = &s.network {
        let _ = writeln!(out, "network:             {n}");
    }
    if let Some(e) = &v.effective {
        let _ = writeln!(
            out,
            "sent to the agent:   generation {}, runner {}, max_jobs {}, max_jobs_per_owner {}, version {}",
            e.generation,
            if e.runner.enabled { "enabled" } else { "disabled" },
            e.runner.max_jobs.map_or("(agent's own)".into(), |n| n.to_string()),
            e.runner
                .max_jobs_per_owner
                .map_or("(agent's own)".into(), |n| n.to_string()),
            e.agent.as_ref().map_or("(any)".into(), |a| a.version.clone()),
        );
    }
    out
}
