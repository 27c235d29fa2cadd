//! `railgrid hub release publish|list|resume`.

use anyhow::Context;

use super::admin::{ago, clean};
use super::table::Table;
use super::usage;
use crate::cli::HubReleaseCommand;
use crate::hub_client::admin::AdminClient;
use crate::proto::hub::ReleaseView;

pub(super) async fn run(
    c: AdminClient,
    cmd: HubReleaseCommand,
    json: bool,
) -> anyhow::Result<String> {
    match cmd {
        HubReleaseCommand::Publish(a) => {
            if !crate::proto::desired::is_version(&a.version) {
                return Err(usage(anyhow::anyhow!(
                    "--version {:?} is not a version (such as 1.4.0)",
                    a.version
                )));
            }
            let signature =
                crate::small_file::read_string(&a.signature, crate::small_file::KEY_MAX)
                    .with_context(|| {
                        format!("could not read the signature {}", a.signature.display())
                    })
                    .map_err(usage)?;
            let binary = crate::small_file::read(&a.binary, crate::release::MAX_RELEASE)
                .with_context(|| format!("could not read the binary {}", a.binary.display()))
                .map_err(usage)?;
            let platform = format!("{}-{}", a.os, a.arch);
            let art = c
                .publish_release(&a.version, &platform, binary, &signature)
                .await?;
            if json {
                return Ok(serde_json::to_string(&art)?);
            }
            Ok(format!(
                "published {} for {}-{}: {} bytes, sha256 {}, signed by key {}",
                a.version, art.os, art.arch, art.size, art.sha256, art.key_id
            ))
        }
        HubReleaseCommand::List => {
            let all = c.releases().await?;
            if json {
                return Ok(serde_json::to_string(&all)?);
            }
            Ok(table(&all))
        }
        HubReleaseCommand::Resume { version } => {
            let all = c.resume_release(&version).await?;
            if json {
                return Ok(serde_json::to_string(&all)?);
            }
            Ok(format!(
                "resumed {version}: agents are offered it again\n{}",
                table(&all)
            ))
        }
    }
}

fn table(all: &[ReleaseView]) -> String {
    if all.is_empty() {
        return "no releases published (railgrid hub release publish)".into();
    }
    let mut table = Table::new(
        "{:<16} {:<20} {:>10}  {:<16} {:>6} {:>8}  {}",
        &[
            "VERSION", "PLATFORM", "SIZE", "SHA256", "AGENTS", "PENDING", "STATE",
        ],
    );
    for r in all {
        let state = match &r.halted {
            Some(h) => format!(
                "halted {}: rolled back by {}: {}",
                ago(Some(h.at)),
                clean(&h.agent),
                clean(&h.reason)
            ),
            None => "offered".into(),
        };
        if r.artifacts.is_empty() {
            table.row(&[
                &r.version,
                &"(not published)",
                &"-",
                &"-",
                &r.agents,
                &r.pending,
                &state,
            ]);
        }
        for (i, a) in r.artifacts.iter().enumerate() {
            let (agents, pending, state) = if i == 0 {
                (r.agents.to_string(), r.pending.to_string(), state.as_str())
            } else {
                (String::new(), String::new(), "")
            };
            table.row(&[
                &r.version,
                &format!("{}-{}", a.os, a.arch),
                &a.size,
                &a.sha256.get(..16).unwrap_or(&a.sha256),
                &agents,
                &pending,
                &state,
            ]);
        }
    }
    table.finish()
}
