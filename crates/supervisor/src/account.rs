//! Resolving the account a child runs as.

use std::path::PathBuf;

use thiserror::Error;

/// A user from the password database, resolved once so that the child's uid, gid, home and
/// name cannot disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

#[derive(Debug, Error)]
pub enum AccountError {
    #[error("no such user {name:?}: create the account or name an existing one")]
    NoSuchUser { name: String },
    #[error("user {name:?} has a name that is not valid UTF-8")]
    BadName { name: String },
    #[error("{0:?} is not a user name: {1}")]
    NotAName(String, &'static str),
}

/// The longest user name looked up (`LOGIN_NAME_MAX`): a longer one is refused before it
/// reaches the C library, whose lookups are not written for names of megabytes.
pub const MAX_NAME_LEN: usize = 256;

/// Refuses what no password database holds, before any lookup.
pub fn check_name(name: &str) -> Result<(), AccountError> {
    let refuse = |why| {
        Err(AccountError::NotAName(
            crate::util::clip(name).into_owned(),
            why,
        ))
    };
    if name.is_empty() {
        return refuse("it is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return refuse("it is longer than 256 bytes");
    }
    if name.chars().any(|c| c.is_control() || c == ':' || c == '/') {
        return refuse("it holds a control character, ':' or '/'");
    }
    Ok(())
}

impl Account {
    /// Looks `name` up in the password database.
    pub fn by_name(name: &str) -> Result<Self, AccountError> {
        check_name(name)?;
        let user = uzers::get_user_by_name(name).ok_or_else(|| AccountError::NoSuchUser {
            name: name.to_owned(),
        })?;
        Self::from_user(&user)
    }

    /// Looks `uid` up; `None` when the uid has no entry (a numeric-only account).
    pub fn by_uid(uid: u32) -> Option<Self> {
        uzers::get_user_by_uid(uid).and_then(|u| Self::from_user(&u).ok())
    }

    /// The account this process runs as. Read from the password database, never from the
    /// environment, so a child's HOME and USER do not depend on what the agent inherited.
    pub fn current() -> Self {
        let (uid, gid) = crate::sys::current_ids();
        Self::by_uid(uid).unwrap_or_else(|| Self::numeric(uid, gid))
    }

    /// An account known only by its ids: named by its uid, with `/` as home.
    pub fn numeric(uid: u32, gid: u32) -> Self {
        Self {
            name: uid.to_string(),
            uid,
            gid,
            home: PathBuf::from("/"),
        }
    }

    fn from_user(user: &uzers::User) -> Result<Self, AccountError> {
        use uzers::os::unix::UserExt;
        let name = user
            .name()
            .to_str()
            .ok_or_else(|| AccountError::BadName {
                name: user.name().to_string_lossy().into_owned(),
            })?
            .to_owned();
        Ok(Self {
            name,
            uid: user.uid(),
            gid: user.primary_group_id(),
            home: user.home_dir().to_path_buf(),
        })
    }
}
