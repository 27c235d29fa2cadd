//! The dashboard's sessions: a token with `agents:read` or `jobs:read` traded at login
//! for a random session id in an `HttpOnly; Secure; SameSite=Strict` cookie. The hub keeps
//! the id's SHA-256, the token's (checked again at every request, so a token revoked or
//! rotated away ends its sessions), the expiry and the logout's CSRF value; nothing is
//! written to disk. Sessions live on the replica that made them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::token;
use crate::util;

/// How long a session lasts.
pub(super) const LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// Sessions kept at once, at most: past it the oldest go.
const MAX_SESSIONS: usize = 10_000;
/// Sessions of one token at once, at most: past it that token's oldest goes, so that
/// logins with one token never end another token's sessions.
pub(super) const MAX_PER_TOKEN: usize = 16;
/// The cookie.
pub(super) const COOKIE: &str = "railgrid_session";

/// One logged-in browser.
#[derive(Debug, Clone)]
pub(super) struct Session {
    /// The SHA-256 of the token it logged in with.
    pub(super) token_sha256: String,
    pub(super) csrf: String,
    pub(super) until: Instant,
    /// The order sessions were opened in: the lowest is the oldest.
    serial: u64,
}

#[derive(Default)]
pub(crate) struct Sessions {
    /// By the SHA-256 of the session id.
    all: Mutex<HashMap<String, Session>>,
    opened: std::sync::atomic::AtomicU64,
}

impl Sessions {
    /// A new session for the token `token_sha256`: its id (for the cookie) and session.
    pub(super) fn open(&self, token_sha256: String) -> Option<(String, Session)> {
        let id = token::new_session_id().ok()?;
        let csrf = token::new_session_id().ok()?;
        let session = Session {
            token_sha256,
            csrf,
            until: Instant::now() + LIFETIME,
            serial: self
                .opened
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        };
        let mut all = util::lock(&self.all);
        let now = Instant::now();
        all.retain(|_, s| s.token_sha256 != session.token_sha256 || s.until > now);
        let own = all
            .values()
            .filter(|s| s.token_sha256 == session.token_sha256)
            .count();
        if own >= MAX_PER_TOKEN {
            let oldest = all
                .iter()
                .filter(|(_, s)| s.token_sha256 == session.token_sha256)
                .min_by_key(|(_, s)| s.serial)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                all.remove(&k);
            }
        }
        if all.len() >= MAX_SESSIONS {
            all.retain(|_, s| s.until > Instant::now());
            if all.len() >= MAX_SESSIONS {
                let oldest = all
                    .iter()
                    .min_by_key(|(_, s)| s.until)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    all.remove(&k);
                }
            }
        }
        all.insert(token::sha256_hex(&id), session.clone());
        Some((id, session))
    }

    /// The live session of cookie value `id`.
    pub(super) fn get(&self, id: &str) -> Option<Session> {
        let key = token::sha256_hex(id);
        let mut all = util::lock(&self.all);
        match all.get(&key) {
            Some(s) if s.until > Instant::now() => Some(s.clone()),
            Some(_) => {
                all.remove(&key);
                None
            }
            None => None,
        }
    }

    pub(super) fn close(&self, id: &str) {
        util::lock(&self.all).remove(&token::sha256_hex(id));
    }
}

/// The value of cookie `name` in a `Cookie` header.
pub(super) fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header
        .split(';')
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_by_its_id_until_closed() {
        let s = Sessions::default();
        let (id, session) = s.open("t".into()).expect("session");
        assert_eq!(s.get(&id).map(|x| x.csrf), Some(session.csrf));
        assert!(s.get("other").is_none());
        s.close(&id);
        assert!(s.get(&id).is_none());
        assert_eq!(
            cookie("a=1; railgrid_session=xyz; b=2", COOKIE),
            Some("xyz")
        );
        assert_eq!(cookie("a=1", COOKIE), None);
    }

    #[test]
    fn logins_with_one_token_end_only_that_tokens_oldest_sessions() {
        let s = Sessions::default();
        let (root, _) = s.open("root".into()).expect("root");
        let mut viewer = Vec::new();
        for _ in 0..MAX_PER_TOKEN * 3 {
            viewer.push(s.open("viewer".into()).expect("viewer").0);
        }
        assert!(s.get(&root).is_some(), "another token's session is kept");
        let live = viewer.iter().filter(|id| s.get(id).is_some()).count();
        assert_eq!(live, MAX_PER_TOKEN);
        assert!(s.get(viewer.last().expect("last")).is_some());
        assert!(s.get(&viewer[0]).is_none(), "its own oldest went");
    }
}
