//! `/etc/railgrid/agent.toml` as the install converges it: created from the flags, or
//! edited in place (comments, order and every other key kept) where a flag says
//! otherwise than the file; each change is named.

use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item, TableLike};

use super::InstallError;
use crate::config::RawConfig;

/// What the flags ask of the file; `None` leaves a key as the file has it.
#[derive(Debug, Clone, Default)]
pub(super) struct Wanted {
    pub runner_user: Option<String>,
    /// One URL is written as a string, several (replicas) as a list.
    pub hub_urls: Option<Vec<String>>,
    pub agent_id: Option<String>,
    pub token_file: Option<PathBuf>,
    pub enrol_token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub trusted_keys: Option<Vec<String>>,
    /// Replaces `agent.labels`.
    pub labels: Option<crate::proto::labels::Labels>,
}

/// The file to write, and what changed in it (empty: it is kept as it is).
#[derive(Debug, Clone)]
pub(super) struct Converged {
    pub text: String,
    pub changes: Vec<String>,
    /// The runner account the file names after the change.
    pub runner_user: Option<String>,
    /// Whether it names a hub: adding or removing one takes a restart.
    pub has_hub: bool,
}

const HEADER: &str = "\
# railgrid agent configuration, written by `railgrid agent install` (mode 0600).
# Edit freely: a later install changes only the keys its flags name. Every key, with
# its default: packaging/agent.toml.example and docs/operations.md.
";

/// Reads the existing file at `path`: `None` when there is none. A file that is not a
/// railgrid agent config is refused, so that install never rewrites someone else's file.
pub(super) fn read_existing(path: &Path) -> Result<Option<String>, InstallError> {
    let foreign = |message: String| InstallError::ForeignConfig {
        path: path.to_owned(),
        message,
    };
    let Some(bytes) = super::root::read_regular(path, MAX_CONFIG_BYTES)? else {
        return Ok(None);
    };
    let text = String::from_utf8(bytes).map_err(|_| foreign("not UTF-8 text".into()))?;
    if let Err(e) = toml::from_str::<RawConfig>(&text) {
        // Where, never what: the message would quote the file, which may hold anything.
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        let at = line.map(|l| format!("at line {l}")).unwrap_or_default();
        return Err(foreign(
            format!("not TOML of the agent's keys {at}")
                .trim_end()
                .to_owned(),
        ));
    }
    Ok(Some(text))
}

/// Larger is not a config of ours.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Applies `wanted` to `existing` (or to a new file).
pub(super) fn converge(
    existing: Option<&str>,
    wanted: &Wanted,
    delegate_cgroup: bool,
) -> Result<Converged, InstallError> {
    let fresh = existing.is_none();
    let mut doc: DocumentMut = match existing {
        Some(text) => text
            .parse()
            .map_err(|e: toml_edit::TomlError| InstallError::Invalid(e.to_string()))?,
        None => DocumentMut::new(),
    };
    let mut changes = Vec::new();
    let mut set_str = |doc: &mut DocumentMut, table: &str, key: &str, value: Option<&str>| {
        let Some(value) = value else { return };
        let current = doc
            .get(table)
            .and_then(Item::as_table_like)
            .and_then(|t| t.get(key))
            .and_then(Item::as_str)
            .map(str::to_owned);
        if current.as_deref() == Some(value) {
            return;
        }
        set_value(table_mut(doc, table), key, toml_edit::Value::from(value));
        changes.push(match current {
            Some(old) => format!("{table}.{key} = {value:?} (was {old:?})"),
            None => format!("{table}.{key} = {value:?}"),
        });
    };
    set_str(&mut doc, "runner", "user", wanted.runner_user.as_deref());
    if let Some([one]) = wanted.hub_urls.as_deref() {
        set_str(&mut doc, "hub", "url", Some(one));
    }
    set_str(&mut doc, "hub", "agent_id", wanted.agent_id.as_deref());
    let path_str = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    set_str(
        &mut doc,
        "hub",
        "token_file",
        path_str(&wanted.token_file).as_deref(),
    );
    set_str(
        &mut doc,
        "hub",
        "enrol_token_file",
        path_str(&wanted.enrol_token_file).as_deref(),
    );
    set_str(
        &mut doc,
        "hub",
        "ca_file",
        path_str(&wanted.ca_file).as_deref(),
    );
    match wanted.hub_urls.as_deref() {
        Some(urls) if urls.len() > 1 => {
            let current: Option<Vec<String>> = doc
                .get("hub")
                .and_then(Item::as_table_like)
                .and_then(|t| t.get("url"))
                .and_then(Item::as_value)
                .and_then(|v| match v {
                    toml_edit::Value::String(s) => Some(vec![s.value().clone()]),
                    toml_edit::Value::Array(a) => Some(
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect(),
                    ),
                    _ => None,
                });
            if current.as_deref() != Some(urls) {
                let array: toml_edit::Array = urls.iter().map(String::as_str).collect();
                set_value(
                    table_mut(&mut doc, "hub"),
                    "url",
                    toml_edit::Value::Array(array),
                );
                changes.push(match current {
                    Some(old) => format!("hub.url = {urls:?} (was {old:?})"),
                    None => format!("hub.url = {urls:?}"),
                });
            }
        }
        _ => {}
    }
    if let Some(keys) = &wanted.trusted_keys {
        let current: Option<Vec<String>> = doc
            .get("upgrade")
            .and_then(Item::as_table_like)
            .and_then(|t| t.get("trusted_keys"))
            .and_then(Item::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            });
        if current.as_ref() != Some(keys) {
            let array: toml_edit::Array = keys.iter().map(String::as_str).collect();
            set_value(
                table_mut(&mut doc, "upgrade"),
                "trusted_keys",
                toml_edit::Value::Array(array),
            );
            changes.push(format!(
                "upgrade.trusted_keys = {} key(s){}",
                keys.len(),
                if current.is_some() { " (replaced)" } else { "" }
            ));
        }
    }
    if let Some(labels) = &wanted.labels {
        let current = doc
            .get("agent")
            .and_then(Item::as_table_like)
            .and_then(|t| t.get("labels"))
            .and_then(Item::as_table_like)
            .map(|t| {
                t.iter()
                    .filter_map(|(k, v)| Some((k.to_owned(), v.as_str()?.to_owned())))
                    .collect::<crate::proto::labels::Labels>()
            });
        if current.as_ref() != Some(labels) {
            let table: toml_edit::InlineTable = labels
                .iter()
                .map(|(k, v)| (k.as_str(), toml_edit::Value::from(v)))
                .collect();
            set_value(
                table_mut(&mut doc, "agent"),
                "labels",
                toml_edit::Value::InlineTable(table),
            );
            changes.push(format!(
                "agent.labels = {}{}",
                crate::proto::labels::to_list(labels),
                if current.is_some() { " (replaced)" } else { "" }
            ));
        }
    }
    if fresh && delegate_cgroup {
        // The unit delegates the agent's cgroup: jobs get their own cgroups from the start.
        table_mut(&mut doc, "runner").insert("delegate_cgroup", toml_edit::value(true));
        changes.push("runner.delegate_cgroup = true".into());
    }
    let text = if fresh {
        format!("{HEADER}\n{doc}")
    } else {
        doc.to_string()
    };
    // What is written must load: the keys the flags set are checked by the caller, and
    // the schema here.
    let raw: RawConfig = toml::from_str(&text)
        .map_err(|e| InstallError::Invalid(format!("the resulting config is invalid: {e}")))?;
    let hub = &raw.hub;
    if hub.url.is_some() && hub.token_file.is_none() && hub.enrol_token_file.is_none() {
        return Err(InstallError::Invalid(
            "a hub needs a token: give --token-file FILE, or --enrol-token FILE, with --hub".into(),
        ));
    }
    if hub.url.is_none()
        && (hub.token_file.is_some()
            || hub.enrol_token_file.is_some()
            || hub.agent_id.is_some()
            || hub.ca_file.is_some())
    {
        return Err(InstallError::Invalid(
            "--token-file, --enrol-token, --agent-id and --ca-file belong to a hub: give --hub URL too".into(),
        ));
    }
    Ok(Converged {
        text,
        changes,
        runner_user: raw.runner.user,
        has_hub: raw.hub.url.is_some(),
    })
}

/// Sets `key` to `value`, keeping the comments around the value it replaces.
fn set_value(table: &mut dyn TableLike, key: &str, mut value: toml_edit::Value) {
    match table.get_mut(key).and_then(Item::as_value_mut) {
        Some(old) => {
            *value.decor_mut() = old.decor().clone();
            *old = value;
        }
        None => {
            table.insert(key, Item::Value(value));
        }
    }
}

/// The table `name` of the document, created when missing (an inline table stays one).
fn table_mut<'a>(doc: &'a mut DocumentMut, name: &str) -> &'a mut dyn TableLike {
    let item = doc
        .entry(name)
        .or_insert_with(|| Item::Table(toml_edit::Table::new()));
    if !item.is_table_like() {
        *item = Item::Table(toml_edit::Table::new());
    }
    item.as_table_like_mut().expect("a table")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted() -> Wanted {
        Wanted {
            runner_user: Some("railgrid".into()),
            hub_urls: Some(vec!["https://hub.example:8443".into()]),
            agent_id: Some("build-17".into()),
            token_file: Some("/etc/railgrid/token".into()),
            enrol_token_file: None,
            ca_file: None,
            trusted_keys: Some(vec!["RWQkey".into()]),
            labels: Some(crate::proto::labels::parse_list("queue=build").unwrap()),
        }
    }

    #[test]
    fn a_new_file_holds_the_flags_and_loads() {
        let c = converge(None, &wanted(), true).unwrap();
        let raw: RawConfig = toml::from_str(&c.text).unwrap();
        assert_eq!(raw.runner.user.as_deref(), Some("railgrid"));
        assert_eq!(raw.runner.delegate_cgroup, Some(true));
        assert!(
            matches!(&raw.hub.url, Some(crate::config::raw::HubUrls::One(u)) if u == "https://hub.example:8443"),
            "{:?}",
            raw.hub.url
        );
        assert_eq!(raw.upgrade.trusted_keys, Some(vec!["RWQkey".to_owned()]));
        let labels = raw.agent.labels.as_ref().map(crate::proto::labels::to_list);
        assert_eq!(labels.as_deref(), Some("queue=build"));
        assert!(c.text.starts_with("# railgrid agent configuration"));
        assert_eq!(c.changes.len(), 7, "{:?}", c.changes);
        // Converged again: nothing changes.
        let again = converge(Some(&c.text), &wanted(), false).unwrap();
        assert!(again.changes.is_empty(), "{:?}", again.changes);
    }

    #[test]
    fn replicas_are_a_list_and_one_url_a_string() {
        let mut w = wanted();
        w.hub_urls = Some(vec!["https://a:8443".into(), "https://b:8443".into()]);
        let c = converge(None, &w, false).unwrap();
        assert!(
            c.text
                .contains(r#"url = ["https://a:8443", "https://b:8443"]"#),
            "{}",
            c.text
        );
        let raw: RawConfig = toml::from_str(&c.text).unwrap();
        assert!(matches!(&raw.hub.url, Some(crate::config::raw::HubUrls::Many(v)) if v.len() == 2));
        let again = converge(Some(&c.text), &w, false).unwrap();
        assert!(again.changes.is_empty(), "{:?}", again.changes);
        let one = converge(Some(&c.text), &wanted(), false).unwrap();
        assert!(
            one.text.contains(r#"url = "https://hub.example:8443""#),
            "{}",
            one.text
        );
        assert_eq!(one.changes.len(), 1, "{:?}", one.changes);
        let back = converge(Some(&one.text), &w, false).unwrap();
        assert_eq!(
            back.changes,
            [
                r#"hub.url = ["https://a:8443", "https://b:8443"] (was ["https://hub.example:8443"])"#
            ]
        );
    }

    #[test]
    fn the_same_flags_again_change_nothing() {
        let first = converge(None, &wanted(), true).unwrap();
        let again = converge(Some(&first.text), &wanted(), true).unwrap();
        assert!(again.changes.is_empty(), "{:?}", again.changes);
        assert_eq!(again.text, first.text);
    }

    #[test]
    fn an_edited_file_keeps_its_comments_and_other_keys() {
        let existing = "# ours\nstate_dir = \"/srv/rg\"\n\n[runner]\nuser = \"nobody\" # the build account\nmax_jobs = 3\n";
        let only_hub = Wanted {
            runner_user: None,
            ..wanted()
        };
        let c = converge(Some(existing), &only_hub, true).unwrap();
        assert!(
            c.text.starts_with("# ours\nstate_dir = \"/srv/rg\"\n"),
            "{}",
            c.text
        );
        assert!(
            c.text.contains("user = \"nobody\" # the build account"),
            "{}",
            c.text
        );
        assert!(c.text.contains("max_jobs = 3"));
        assert!(
            !c.text.contains("delegate_cgroup"),
            "only a new file gets the default"
        );
        assert_eq!(c.runner_user.as_deref(), Some("nobody"));
        let user_too = converge(Some(existing), &wanted(), true).unwrap();
        assert!(user_too
            .changes
            .contains(&"runner.user = \"railgrid\" (was \"nobody\")".to_owned()));
    }

    #[test]
    fn a_hub_without_a_token_is_refused() {
        let w = Wanted {
            token_file: None,
            enrol_token_file: None,
            ..wanted()
        };
        let err = converge(None, &w, false).unwrap_err().to_string();
        assert!(err.contains("--token-file"), "{err}");
        let w = Wanted {
            hub_urls: None,
            ..wanted()
        };
        let err = converge(None, &w, false).unwrap_err().to_string();
        assert!(err.contains("--hub"), "{err}");
    }

    #[test]
    fn a_file_that_is_not_ours_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, "[server]\nport = 80\n").unwrap();
        let err = read_existing(&path).unwrap_err();
        assert!(matches!(err, InstallError::ForeignConfig { .. }), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()));
        assert_eq!(read_existing(&dir.path().join("none")).unwrap(), None);
    }
}
