//! Bearer tokens: 256 random bits, hex, with a prefix that says what they open (`rga_`
//! an agent, `rgh_` the hub's admin API, `rge_` an enrolment) so that a secret scanner, or a person, can tell
//! one found in a paste. The hub keeps only their SHA-256.

use sha2::{Digest, Sha256};

const AGENT_PREFIX: &str = "rga_";
const ADMIN_PREFIX: &str = "rgh_";
const ENROL_PREFIX: &str = "rge_";

/// Lowercase hex, appended to `out` (on every reconcile's path: no allocation per byte).
fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
}

fn random_hex(prefix: &str) -> Result<String, getrandom::Error> {
    random_hex_of::<32>(prefix)
}

fn random_hex_of<const N: usize>(prefix: &str) -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes)?;
    let mut s = String::with_capacity(prefix.len() + 2 * N);
    s.push_str(prefix);
    push_hex(&mut s, &bytes);
    Ok(s)
}

pub(crate) fn new_agent_token() -> Result<String, getrandom::Error> {
    random_hex(AGENT_PREFIX)
}

/// A job id for a submission that names none: 64 random bits, unique in any fleet's
/// history, and a valid runner job id.
pub(crate) fn new_job_id() -> Result<String, getrandom::Error> {
    random_hex_of::<8>("hj-")
}

pub(crate) fn new_admin_token() -> Result<String, getrandom::Error> {
    random_hex(ADMIN_PREFIX)
}

/// A dashboard session's id, or the CSRF value of its logout: 256 random bits, hex.
pub(crate) fn new_session_id() -> Result<String, getrandom::Error> {
    random_hex("")
}

/// A token a host trades for its own agent token (`rge_`): it opens nothing else.
pub(crate) fn new_enrol_token() -> Result<String, getrandom::Error> {
    random_hex(ENROL_PREFIX)
}

pub(crate) fn sha256_hex(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    let mut s = String::with_capacity(64);
    push_hex(&mut s, &digest);
    s
}

/// The token of an `Authorization` header's value `Bearer <token>` (the scheme in any
/// case, RFC 7235); why it is not one otherwise.
pub(crate) fn bearer_text(value: &str) -> Result<&str, &'static str> {
    match value.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err("the Authorization header must be `Bearer <token>`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_prefixed_and_hashed() {
        let a = new_agent_token().expect("random");
        let b = new_agent_token().expect("random");
        assert_ne!(a, b);
        assert!(a.starts_with("rga_") && a.len() == 68, "{a}");
        assert!(new_admin_token().expect("random").starts_with("rgh_"));
        let h = sha256_hex(&a);
        assert_eq!(h.len(), 64);
        assert_eq!(sha256_hex(&a), h);
        assert_ne!(sha256_hex(&b), h);
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
