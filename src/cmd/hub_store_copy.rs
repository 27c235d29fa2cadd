//! `railgrid hub store copy`: what it copied, table by table, and what to do next.

use std::fmt::Write as _;
use std::process::ExitCode;

use super::{print_stdout, usage};
use crate::cli::HubStoreCopyArgs;
use crate::hub::copy::Copied;

pub(super) fn run(a: HubStoreCopyArgs, json: bool) -> anyhow::Result<ExitCode> {
    let url = super::hub_config::store_url(a.to, a.config.as_deref())
        .map_err(usage)?
        .ok_or_else(|| {
            usage(anyhow::anyhow!(
                "give the database: --to URL or --config FILE"
            ))
        })?;
    let rt = super::current_thread_runtime()?;
    let done = rt
        .block_on(crate::hub::copy::copy(&a.from, &url))
        .map_err(|e| if e.is_config() { usage(e) } else { e.into() })?;
    if json {
        return print_stdout(&serde_json::to_string(&as_json(&done))?);
    }
    print_stdout(&text(&done))
}

fn as_json(c: &Copied) -> serde_json::Value {
    let tables: serde_json::Map<String, serde_json::Value> = c
        .tables
        .iter()
        .map(|(name, sum)| {
            (
                name.clone(),
                serde_json::json!({"rows": sum.rows, "sum": sum.hex()}),
            )
        })
        .collect();
    serde_json::json!({
        "from": c.from,
        "to": c.to,
        "tables": tables,
        "release_binaries": c.binaries,
        "release_bytes": c.binary_bytes,
        "admin_token": true,
        "ca": c.ca,
        "secrets_key_file": c.secrets_key,
    })
}

fn text(c: &Copied) -> String {
    let mut out = format!(
        "copied {} into {}, in one transaction; every table read back with the same rows and sum:\n",
        c.from, c.to
    );
    let width = c.tables.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for (name, sum) in &c.tables {
        let _ = writeln!(
            out,
            "  {name:<width$}  {:>8} rows  sum {}",
            sum.rows,
            sum.hex()
        );
    }
    let _ = writeln!(
        out,
        "  release binaries: {} ({} bytes), each checked against its SHA-256",
        c.binaries, c.binary_bytes
    );
    let _ = writeln!(
        out,
        "  the admin token's hash{}",
        if c.ca {
            ", and the CA of --tls-self-signed (the ca.pem agents pin)"
        } else {
            " (no CA of --tls-self-signed: give the replicas the certificate the hub had)"
        }
    );
    if let Some(key) = &c.secrets_key {
        let _ = writeln!(
            out,
            "  not the key that seals the secrets: copy {} (0600) into each replica's data dir, or name it with --secrets-key-file",
            key.display()
        );
    }
    out.push_str("Next: start the replicas with --store on this database, where the agents reach the hub; they keep their tokens. Copy admin.token to where admin commands run (docs/hub.md, \"From one SQLite hub to replicas\").");
    out
}
