//! `railgrid hub secret set|list|rm|rotate-key` (docs/security.md, "Secrets"), and the
//! `--secret` of `hub job submit`.

use std::io::Read as _;

use anyhow::Context as _;

use super::admin::clean;
use super::table::Table;
use crate::cli::{HubSecretCommand, HubSecretSetArgs};
use crate::hub_client::admin::AdminClient;
use crate::proto::job::JobSpec;
use crate::proto::secret::{SecretSet, MAX_VALUE};
use crate::util::rfc3339_ms as when;

pub(super) async fn secret(
    c: AdminClient,
    cmd: HubSecretCommand,
    json: bool,
) -> anyhow::Result<String> {
    match cmd {
        HubSecretCommand::Set(a) => {
            let name = a.name.clone();
            let req = SecretSet {
                value: value(&a)?,
                selector: a.select.map(|s| s.to_string()),
            };
            let v = c.set_secret(&name, &req).await?;
            if json {
                return Ok(serde_json::to_string(&v)?);
            }
            Ok(format!(
                "secret {} is at version {}, for {}",
                clean(&v.name),
                v.version,
                v.selector
                    .as_deref()
                    .map_or("any agent".to_owned(), |s| format!(
                        "agents matching {}",
                        clean(s)
                    ))
            ))
        }
        HubSecretCommand::List => {
            let all = c.secrets().await?;
            if json {
                return Ok(serde_json::to_string(&all)?);
            }
            let mut t = Table::new(
                "{:<24} {:>7} {:<16} {:<21} {:<16} {}",
                &["NAME", "VERSION", "SET BY", "SET AT", "KEY", "FOR"],
            );
            for v in &all {
                let scope = v.selector.as_deref().map_or("any agent".to_owned(), clean);
                t.row(&[
                    &clean(&v.name),
                    &v.version,
                    &clean(&v.set_by),
                    &when(Some(v.set_ms)),
                    &clean(&v.key),
                    &scope,
                ]);
            }
            Ok(t.finish())
        }
        HubSecretCommand::Rm { name } => {
            let v = c.remove_secret(&name).await?;
            if json {
                return Ok(v.to_string());
            }
            Ok(format!("secret {} removed", clean(&name)))
        }
        HubSecretCommand::RotateKey => {
            let v = c.rotate_secrets_key().await?;
            if json {
                return Ok(v.to_string());
            }
            Ok(format!(
                "every secret ({}) is sealed under key {} now; the key file was replaced: back it up, and give it to every replica",
                v["resealed"],
                clean(v["key"].as_str().unwrap_or("?"))
            ))
        }
    }
}

/// The value `secret set` was given: a file's or standard input's, one trailing newline
/// dropped unless asked not to.
fn value(a: &HubSecretSetArgs) -> anyhow::Result<String> {
    let limit = MAX_VALUE as u64 + 2;
    let mut bytes = Vec::new();
    match &a.from_file {
        Some(path) => {
            bytes = crate::small_file::read(path, limit)
                .with_context(|| format!("--from-file {}", path.display()))?;
        }
        None => {
            std::io::stdin()
                .take(limit + 1)
                .read_to_end(&mut bytes)
                .context("reading the value from standard input")?;
        }
    }
    let mut text =
        String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("a secret's value is UTF-8 text"))?;
    if !a.keep_newline {
        if text.ends_with('\n') {
            text.pop();
        }
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

/// `--secret NAME` (a variable) and `--secret NAME=file` (a file in the job's secrets
/// directory), into `spec`.
pub(super) fn name_secrets(spec: &mut JobSpec, args: &[String]) -> anyhow::Result<()> {
    for a in args {
        match a.split_once('=') {
            None => spec.secrets.push(a.clone()),
            Some((name, "file")) => spec.secret_files.push(name.to_owned()),
            Some(_) => anyhow::bail!("--secret {a:?}: give NAME (a variable) or NAME=file"),
        }
    }
    crate::proto::secret::check_names(spec).map_err(|e| anyhow::anyhow!("--secret: {e}"))
}
