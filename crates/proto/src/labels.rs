//! Agent labels (docs/hub.md, "Routing jobs"): `key=value` pairs that route
//! jobs. A host declares some, the agent adds `os`, `arch` and `hostname` itself, and the
//! hub sets others; the hub's win. Keys are `[a-z0-9][a-z0-9._/-]{0,62}`, values
//! `[A-Za-z0-9._-]{0,63}`: neither can hold `,`, `=`, a space or a parenthesis, so a label
//! list and a selector are plain text with one reading.

use std::collections::BTreeMap;
use std::fmt;

/// Labels by key, in key order.
pub type Labels = BTreeMap<String, String>;

/// The labels the agent sets itself; a host cannot declare them.
pub const AUTOMATIC: [&str; 3] = ["os", "arch", "hostname"];

/// The most labels one source may give an agent.
pub const MAX_LABELS: usize = 64;

/// A label the grammar refuses, with the text named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelError {
    Key(String),
    Value {
        key: String,
        value: String,
    },
    /// `k=v` was expected.
    Pair(String),
    Automatic(String),
    TooMany(usize),
}

impl fmt::Display for LabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabelError::Key(k) => write!(
                f,
                "invalid label key {k:?}: a key is 1 to 63 of a-z 0-9 . _ / - and starts with a letter or digit"
            ),
            LabelError::Value { key, value } => write!(
                f,
                "invalid value {value:?} of label {key}: a value is at most 63 of A-Z a-z 0-9 . _ -"
            ),
            LabelError::Pair(p) => write!(f, "invalid label {p:?}: give KEY=VALUE"),
            LabelError::Automatic(k) => write!(
                f,
                "label {k} is set by the agent itself (os, arch and hostname are), not by the host"
            ),
            LabelError::TooMany(n) => write!(f, "{n} labels: at most {MAX_LABELS} are allowed"),
        }
    }
}

impl std::error::Error for LabelError {}

/// Checks a label key.
pub fn check_key(key: &str) -> Result<(), LabelError> {
    let mut chars = key.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._/-".contains(c));
    if first_ok && rest_ok && key.len() <= 63 {
        Ok(())
    } else {
        Err(LabelError::Key(key.to_owned()))
    }
}

/// Checks a label value (empty is a value).
pub fn check_value(key: &str, value: &str) -> Result<(), LabelError> {
    let ok = value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(LabelError::Value {
            key: key.to_owned(),
            value: value.to_owned(),
        })
    }
}

/// Checks labels as one source gives them; `host`: a host's own, which may not name an
/// automatic key.
pub fn check(labels: &Labels, host: bool) -> Result<(), LabelError> {
    if labels.len() > MAX_LABELS {
        return Err(LabelError::TooMany(labels.len()));
    }
    for (k, v) in labels {
        check_key(k)?;
        check_value(k, v)?;
        if host && AUTOMATIC.contains(&k.as_str()) {
            return Err(LabelError::Automatic(k.clone()));
        }
    }
    Ok(())
}

/// One `KEY=VALUE`.
pub fn parse_pair(text: &str) -> Result<(String, String), LabelError> {
    let (k, v) = text
        .split_once('=')
        .ok_or_else(|| LabelError::Pair(text.to_owned()))?;
    let (k, v) = (k.trim(), v.trim());
    check_key(k)?;
    check_value(k, v)?;
    Ok((k.to_owned(), v.to_owned()))
}

/// `k=v,k2=v2` (spaces around each allowed; empty text is no label); a key given twice
/// keeps its last value.
pub fn parse_list(text: &str) -> Result<Labels, LabelError> {
    let mut labels = Labels::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = parse_pair(part)?;
        labels.insert(k, v);
    }
    if labels.len() > MAX_LABELS {
        return Err(LabelError::TooMany(labels.len()));
    }
    Ok(labels)
}

/// `k=v,k2=v2`, the form [`parse_list`] reads.
pub fn to_list(labels: &Labels) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The labels in force: the host's (with the automatic ones), then the hub's over them.
pub fn effective(host: &Labels, hub: &Labels) -> Labels {
    InForce { host, hub }.to_labels()
}

/// The labels in force read where they are, without a copy: what the dispatcher and a
/// queued job's census match thousands of agents against.
#[derive(Debug, Clone, Copy)]
pub struct InForce<'a> {
    pub host: &'a Labels,
    pub hub: &'a Labels,
}

impl<'a> InForce<'a> {
    pub fn get(&self, key: &str) -> Option<&'a String> {
        self.hub.get(key).or_else(|| self.host.get(key))
    }

    pub fn to_labels(self) -> Labels {
        let mut all = self.host.clone();
        all.extend(self.hub.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_follow_the_grammar() {
        for good in ["queue", "a", "k8s.io/zone", "gpu-count", "x_1", "0"] {
            assert_eq!(check_key(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "Queue",
            "-x",
            ".x",
            "a b",
            "a=b",
            "a,b",
            "é",
            &"k".repeat(64),
        ] {
            assert!(check_key(bad).is_err(), "{bad:?}");
        }
        for good in ["", "build", "A100", "1.2.3", "a_b-c"] {
            assert_eq!(check_value("k", good), Ok(()), "{good}");
        }
        for bad in ["a b", "a,b", "a=b", "(a)", "x/y", &"v".repeat(64)] {
            assert!(check_value("k", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_list_reads_back_as_written_and_names_the_bad_text() {
        let labels = parse_list(" queue=build, gpu=a100 ,,zone=").expect("labels");
        assert_eq!(to_list(&labels), "gpu=a100,queue=build,zone=");
        assert_eq!(parse_list(&to_list(&labels)), Ok(labels));
        let e = parse_list("queue=build,gpu").expect_err("no value");
        assert_eq!(e, LabelError::Pair("gpu".into()));
        assert!(e.to_string().contains("\"gpu\""), "{e}");
        let e = parse_list("Queue=x").expect_err("bad key").to_string();
        assert!(e.contains("\"Queue\""), "{e}");
    }

    #[test]
    fn a_host_cannot_declare_an_automatic_label_and_the_hubs_win() {
        let host = parse_list("os=plan9").expect("parses");
        assert_eq!(check(&host, true), Err(LabelError::Automatic("os".into())));
        assert_eq!(check(&host, false), Ok(()), "the hub may set any key");
        let host = parse_list("queue=build,tier=dev").expect("host");
        let hub = parse_list("tier=prod").expect("hub");
        assert_eq!(to_list(&effective(&host, &hub)), "queue=build,tier=prod");
    }
}
