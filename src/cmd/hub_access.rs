//! `railgrid hub token|enrol-token|audit …` and `hub agent rotate` (docs/hub.md,
//! "Access").

use std::fmt::Write as _;
use std::path::Path;

use super::admin::clean;
use super::table::Table;
use super::token_file::{create_token_file, write_token};
use crate::cli::{HubAuditCommand, HubEnrolTokenCommand, HubTokenCommand};
use crate::hub_client::admin::{AdminClient, Target};
use crate::proto::access::{EnrolTokenRequest, EnrolTokenView, TokenRequest, TokenView};

use crate::util::rfc3339_ms as when;

/// A secret made now: into `out` (created 0600 first, so that a token the hub hands out
/// is never lost for want of a place), or printed once.
async fn deliver<F, V>(
    out: Option<&Path>,
    json: bool,
    what: &str,
    make: F,
) -> anyhow::Result<String>
where
    F: std::future::Future<
        Output = Result<crate::proto::access::TokenMade<V>, crate::hub_client::admin::AdminError>,
    >,
    V: serde::Serialize,
{
    let file = out.map(create_token_file).transpose()?;
    let made = match make.await {
        Ok(m) => m,
        Err(e) => {
            if let Some(path) = out {
                let _ = std::fs::remove_file(path);
            }
            return Err(e.into());
        }
    };
    match (out, file) {
        (Some(path), Some(file)) => {
            write_token(file, path, &made.token)?;
            if json {
                let mut v = serde_json::to_value(&made.view)?;
                v["token_file"] = serde_json::json!(path);
                return Ok(v.to_string());
            }
            Ok(format!("{what}; its token is in {} (0600)", path.display()))
        }
        _ if json => Ok(serde_json::to_string(&made)?),
        _ => Ok(format!(
            "{what}\ntoken: {}\nThe token is shown this once (the hub keeps only its hash): keep it in a 0600 file.",
            made.token
        )),
    }
}

pub(super) async fn token(
    c: AdminClient,
    target: &Target,
    cmd: HubTokenCommand,
    json: bool,
) -> anyhow::Result<String> {
    match cmd {
        HubTokenCommand::Create(a) => {
            let req = TokenRequest {
                name: a.name.clone(),
                scopes: a.scopes,
                selector: a.select.map(|s| s.to_string()),
                ttl_secs: a.ttl.map(|d| d.as_secs().max(1)),
            };
            let what = format!("made admin token {}", a.name);
            deliver(a.token_out.as_deref(), json, &what, c.create_token(&req)).await
        }
        HubTokenCommand::List => {
            let all = c.tokens().await?;
            if json {
                return Ok(serde_json::to_string(&all)?);
            }
            Ok(token_table(&all))
        }
        HubTokenCommand::Revoke { name } => {
            let v = c.revoke_token(&name).await?;
            if json {
                return Ok(serde_json::to_string(&v)?);
            }
            Ok(format!(
                "admin token {} is refused from now on",
                clean(&v.name)
            ))
        }
        HubTokenCommand::RotateRoot => {
            let token = c.rotate_root().await?;
            // The hub wrote it to its data dir; this host's copy is that file when the
            // command ran against it, else it is printed once.
            match &target.data_dir {
                Some(dir) if target.url.is_none() => {
                    if json {
                        return Ok(serde_json::json!({"token_file": dir.join(crate::hub::ADMIN_TOKEN_FILE)}).to_string());
                    }
                    Ok(format!(
                        "rotated the root admin token: the new one is in {} (0600); the old one is refused from now on",
                        dir.join(crate::hub::ADMIN_TOKEN_FILE).display()
                    ))
                }
                _ if json => Ok(serde_json::json!({ "token": token }).to_string()),
                _ => Ok(format!(
                    "rotated the root admin token; the old one is refused from now on\ntoken: {token}\nShown this once: keep it in a 0600 file (--token-file)."
                )),
            }
        }
    }
}

fn token_table(all: &[TokenView]) -> String {
    if all.is_empty() {
        return "no admin tokens but the root one (railgrid hub token create)".into();
    }
    let mut table = Table::new(
        "{:<20} {:<21} {:<21} {:<21} {}",
        &["NAME", "CREATED", "EXPIRES", "REVOKED", "SCOPES (SELECTOR)"],
    );
    for t in all {
        let selector = t.selector.as_deref().map(|s| format!(" ({})", clean(s)));
        table.row(&[
            &clean(&t.name),
            &when(Some(t.created_ms)),
            &when(t.expires_ms),
            &when(t.revoked_ms),
            &format!("{}{}", t.scopes.join(","), selector.unwrap_or_default()),
        ]);
    }
    table.finish().trim_end().to_owned()
}

pub(super) async fn enrol_token(
    c: AdminClient,
    cmd: HubEnrolTokenCommand,
    json: bool,
) -> anyhow::Result<String> {
    match cmd {
        HubEnrolTokenCommand::Create(a) => {
            let req = EnrolTokenRequest {
                uses: a.uses,
                ttl_secs: a.ttl.map(|d| d.as_secs().max(1)),
                labels: a.labels.into_iter().collect(),
            };
            let uses = a
                .uses
                .map_or_else(|| "any number of".to_owned(), |n| n.to_string());
            let what = format!("made an enrolment token for {uses} host(s)");
            deliver(
                a.token_out.as_deref(),
                json,
                &what,
                c.create_enrol_token(&req),
            )
            .await
        }
        HubEnrolTokenCommand::List => {
            let all = c.enrol_tokens().await?;
            if json {
                return Ok(serde_json::to_string(&all)?);
            }
            Ok(enrol_table(&all))
        }
        HubEnrolTokenCommand::Revoke { id } => {
            let v = c.revoke_enrol_token(&id).await?;
            if json {
                return Ok(serde_json::to_string(&v)?);
            }
            Ok(format!(
                "enrolment token {} enrols no host from now on (the {} it enrolled keep their own tokens)",
                clean(&v.id),
                v.uses
            ))
        }
    }
}

fn enrol_table(all: &[EnrolTokenView]) -> String {
    if all.is_empty() {
        return "no enrolment tokens (railgrid hub enrol-token create)".into();
    }
    let mut table = Table::new(
        "{:<6} {:>9} {:<21} {:<21} {:<21} {}",
        &["ID", "USES", "CREATED", "EXPIRES", "REVOKED", "LABELS"],
    );
    for t in all {
        let uses = match t.max_uses {
            Some(m) => format!("{}/{m}", t.uses),
            None => t.uses.to_string(),
        };
        table.row(&[
            &clean(&t.id),
            &uses,
            &when(Some(t.created_ms)),
            &when(t.expires_ms),
            &when(t.revoked_ms),
            &clean(&crate::proto::labels::to_list(&t.labels)),
        ]);
    }
    table.finish().trim_end().to_owned()
}

pub(super) async fn audit(
    c: AdminClient,
    cmd: HubAuditCommand,
    json: bool,
) -> anyhow::Result<String> {
    let HubAuditCommand::List { since, token } = cmd;
    let lines = c
        .audit(since.map(|d| d.as_secs().max(1)), token.as_deref())
        .await?;
    if json {
        return Ok(serde_json::to_string(&lines)?);
    }
    if lines.is_empty() {
        return Ok("nothing in the audit log".into());
    }
    let mut out = String::new();
    for l in &lines {
        // A line that stands for refusals alike within its minute says how many.
        let times = if l.count > 1 {
            format!(" (×{} this minute)", l.count)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{} {:<16} {:<15} {:<40} {:<24} {}{times}",
            when(Some(l.at_ms)),
            clean(&l.token),
            clean(&l.peer),
            clean(&l.action),
            clean(&l.target),
            clean(&l.outcome)
        );
    }
    Ok(out.trim_end().to_owned())
}

pub(super) async fn rotate(
    c: AdminClient,
    id: Option<String>,
    json: bool,
) -> anyhow::Result<String> {
    let agents = c.rotate_agents(id.as_deref()).await?;
    if json {
        return Ok(serde_json::json!({ "agents": agents }).to_string());
    }
    Ok(format!(
        "{} agent(s) get a new token at their next reconcile (within a second when connected); the old one works until the agent uses the new",
        agents.len()
    ))
}
