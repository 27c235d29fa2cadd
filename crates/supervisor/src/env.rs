//! Building a child's environment from nothing.

use std::path::Path;

use crate::env_policy::{self, EnvError};

use super::account::Account;

/// PATH given to children unless the caller sets one: system locations only, Homebrew's
/// prefix included for macOS hosts.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/opt/homebrew/bin:/usr/bin:/bin";

/// The complete environment of a child: HOME, PATH, USER and LOGNAME of the account it
/// runs as, plus what the caller adds by name. Nothing is inherited from the supervisor's
/// own environment, so its secrets (hub token, cloud keys) cannot reach the child.
pub fn child_env(
    account: &Account,
    home: Option<&Path>,
    path: Option<&str>,
    extra: &[(String, String)],
) -> Result<Vec<(String, String)>, EnvError> {
    let home = home.unwrap_or(&account.home);
    let mut env = vec![
        ("HOME".to_owned(), home.to_string_lossy().into_owned()),
        ("PATH".to_owned(), path.unwrap_or(DEFAULT_PATH).to_owned()),
        ("USER".to_owned(), account.name.clone()),
        ("LOGNAME".to_owned(), account.name.clone()),
    ];
    for (name, value) in extra {
        env_policy::check(name, value)?;
        match env.iter_mut().find(|(k, _)| k == name) {
            Some(slot) => slot.1 = value.clone(),
            None => env.push((name.clone(), value.clone())),
        }
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_from_the_account_and_adds_only_what_is_named() {
        let acct = Account::numeric(1234, 1234);
        let env = child_env(
            &acct,
            None,
            None,
            &[("A".into(), "1".into()), ("PATH".into(), "/x".into())],
        )
        .unwrap();
        assert_eq!(
            env,
            vec![
                ("HOME".into(), "/".into()),
                ("PATH".into(), "/x".into()),
                ("USER".into(), "1234".into()),
                ("LOGNAME".into(), "1234".into()),
                ("A".into(), "1".into()),
            ]
        );
    }

    #[test]
    fn refuses_loader_variables() {
        let acct = Account::numeric(1234, 1234);
        let err =
            child_env(&acct, None, None, &[("LD_PRELOAD".into(), "/x.so".into())]).unwrap_err();
        assert!(matches!(err, EnvError::Loader { .. }));
    }
}
