//! Secrets a job is given (docs/security.md, "Secrets"): named in its spec, their values
//! beside it in the submission and never in it, so that no record, answer or log that
//! shows a spec can show a value.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::job::JobSpec;
use crate::util::clip;

/// The shortest value accepted: shorter ones could not be masked in output without
/// masking ordinary text too (and saying, by where, what the secret is).
pub const MIN_VALUE: usize = 8;
/// The largest value accepted: a key or a certificate chain, not a file system.
pub const MAX_VALUE: usize = 64 * 1024;
/// Secrets one job may be given.
pub const MAX_SECRETS: usize = 32;

/// `POST /v1/jobs` as the runner reads it: the spec, and the values of the secrets it
/// names (`{"argv": […], "secrets": ["DEPLOY_TOKEN"], "secret_values": {"DEPLOY_TOKEN":
/// "…"}}`). Only `spec` is ever stored.
#[derive(Default, Deserialize, Serialize)]
pub struct Submission {
    #[serde(flatten)]
    pub spec: JobSpec,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secret_values: BTreeMap<String, String>,
}

/// Names only: a `Debug` of a submission that reaches a log says no value.
impl std::fmt::Debug for Submission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Submission")
            .field("spec", &self.spec)
            .field(
                "secret_values",
                &self.secret_values.keys().collect::<Vec<_>>(),
            )
            .finish()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("field secrets: at most {MAX_SECRETS} secrets per job, not {0}")]
    TooMany(usize),
    #[error("field secrets: {} is not a variable name (letters, digits and _, not starting with a digit)", clip(.0))]
    BadName(String),
    #[error("field secrets: {} is named twice", clip(.0))]
    Twice(String),
    #[error("field secrets: {} is also in env; a variable comes from one or the other", clip(.0))]
    AlsoInEnv(String),
    #[error("field secrets: {} names a variable the runner sets or refuses", clip(.0))]
    Reserved(String),
    #[error("secret {} came without its value (secret_values): a hub that held it back says why in its log", clip(.0))]
    Missing(String),
    #[error("secret_values: {} is not a secret the spec names", clip(.0))]
    Unnamed(String),
    #[error("secret {} is {} bytes: at least {MIN_VALUE} (shorter cannot be masked safely) and at most {MAX_VALUE}", clip(.0), .1)]
    Size(String, usize),
    #[error("secret {} holds a NUL byte", clip(.0))]
    Nul(String),
}

/// Where a job finds the secrets it is given as files (its private tmpfs).
pub const FILES_DIR: &str = "/tmp/secrets";

/// Every secret a spec names, as variables then as files.
pub fn names(spec: &JobSpec) -> impl Iterator<Item = &String> {
    spec.secrets.iter().chain(&spec.secret_files)
}

/// Checks the names a spec gives its secrets.
pub fn check_names(spec: &JobSpec) -> Result<(), SecretError> {
    let all: Vec<&String> = names(spec).collect();
    if all.len() > MAX_SECRETS {
        return Err(SecretError::TooMany(all.len()));
    }
    for (i, &name) in all.iter().enumerate() {
        check_name(name)?;
        if all[..i].contains(&name) {
            return Err(SecretError::Twice(name.clone()));
        }
        if spec.env.contains_key(name) {
            return Err(SecretError::AlsoInEnv(name.clone()));
        }
        let reserved = [
            "PATH",
            "HOME",
            "TMPDIR",
            "LANG",
            crate::env_vars::JOB_ID,
            crate::env_vars::SECRETS_DIR,
        ];
        if reserved.contains(&name.as_str())
            || name.to_ascii_uppercase().ends_with("_PROXY")
            || crate::env_policy::check(name, "").is_err()
        {
            return Err(SecretError::Reserved(name.clone()));
        }
    }
    Ok(())
}

/// A secret's name, at a hub and in a spec: a variable's (letters, digits and `_`, not
/// starting with a digit), since a job may be given it as one.
pub fn check_name(name: &str) -> Result<(), SecretError> {
    let ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 128;
    match ok {
        true => Ok(()),
        false => Err(SecretError::BadName(name.to_owned())),
    }
}

/// A value that can be given and masked: its size, and no NUL (which no variable holds).
pub fn check_value(name: &str, v: &str) -> Result<(), SecretError> {
    if !(MIN_VALUE..=MAX_VALUE).contains(&v.len()) {
        return Err(SecretError::Size(name.to_owned(), v.len()));
    }
    if v.contains('\0') {
        return Err(SecretError::Nul(name.to_owned()));
    }
    Ok(())
}

/// The values a hub sends with one job, beside its spec in the desired state: a `Debug`
/// that reaches a log says only their names.
#[derive(Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Values(pub BTreeMap<String, String>);

impl Values {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Values {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// `PUT /v1/admin/secrets/{name}`: a value, and the agents it may reach (hub labels).
#[derive(Default, Deserialize, Serialize)]
pub struct SecretSet {
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

impl std::fmt::Debug for SecretSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretSet")
            .field("selector", &self.selector)
            .finish_non_exhaustive()
    }
}

/// A secret as the hub lists it: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct SecretView {
    pub name: String,
    /// 1 when first set, one more at each set.
    pub version: u64,
    /// Only agents whose hub labels match are sent it; `None`: any agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The token that set it (its name; `root` for the admin token).
    pub set_by: String,
    pub set_ms: u64,
    /// Which key seals it (a fingerprint of the key, not the key).
    pub key: String,
}

/// Checks that `values` are exactly the secrets `spec` names, each of a size that can be
/// masked.
pub fn check_values(spec: &JobSpec, values: &BTreeMap<String, String>) -> Result<(), SecretError> {
    check_names(spec)?;
    for name in names(spec) {
        let v = values
            .get(name)
            .ok_or_else(|| SecretError::Missing(name.clone()))?;
        check_value(name, v)?;
    }
    if let Some(extra) = values.keys().find(|k| !names(spec).any(|n| n == *k)) {
        return Err(SecretError::Unnamed(extra.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(names: &[&str]) -> JobSpec {
        JobSpec {
            argv: vec!["true".into()],
            secrets: names.iter().map(|s| (*s).to_owned()).collect(),
            ..JobSpec::default()
        }
    }

    fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn values_must_match_the_names_and_be_maskable() {
        let s = spec(&["TOKEN"]);
        assert_eq!(
            check_values(&s, &values(&[("TOKEN", "long enough")])),
            Ok(())
        );
        assert_eq!(
            check_values(&s, &values(&[])),
            Err(SecretError::Missing("TOKEN".into()))
        );
        assert_eq!(
            check_values(&s, &values(&[("TOKEN", "short")])),
            Err(SecretError::Size("TOKEN".into(), 5))
        );
        assert!(matches!(
            check_values(
                &s,
                &values(&[("TOKEN", "long enough"), ("OTHER", "long enough")])
            ),
            Err(SecretError::Unnamed(_))
        ));
        let big = "x".repeat(MAX_VALUE + 1);
        assert!(check_values(&s, &values(&[("TOKEN", &big)])).is_err());
    }

    #[test]
    fn names_are_variables_of_the_jobs_own() {
        for bad in [
            "1X",
            "A-B",
            "",
            "PATH",
            "LD_PRELOAD",
            "HTTPS_PROXY",
            "RAILGRID_JOB_ID",
        ] {
            assert!(check_names(&spec(&[bad])).is_err(), "{bad:?}");
        }
        assert!(check_names(&spec(&["A", "A"])).is_err());
        let mut s = spec(&["A"]);
        s.env.insert("A".into(), "x".into());
        assert_eq!(check_names(&s), Err(SecretError::AlsoInEnv("A".into())));
    }
}
