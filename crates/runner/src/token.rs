//! The API token: the runner's socket serves only clients that can read
//! `<runner>/api.token`, a fresh random secret written at each start.
//!
//! Why a token on a socket that is already 0600: jobs run as the runner's account, so file
//! modes do not keep them off the socket, and Landlock does not govern connecting to it.
//! Landlock does keep them from reading this file (see `confine::FsGuard`), so a job cannot
//! list, read or cancel other jobs through the API. The account and root can, as before.

use std::fs;
use std::io::{self, Read};
use std::path::Path;

/// File name of the token, beside the socket.
pub const TOKEN_FILE: &str = "api.token";

/// Writes a new token into `dir` (0600, replacing the old one atomically) and returns it.
pub fn create(dir: &Path) -> io::Result<String> {
    let mut raw = [0u8; 32];
    fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    crate::util::write_atomic(&dir.join(TOKEN_FILE), token.as_bytes(), 0o600)?;
    Ok(token)
}

/// Reads the token a client presents, from the file beside `socket`.
pub fn read_beside(socket: &Path) -> io::Result<String> {
    let text = crate::small_file::read_string(
        &socket.with_file_name(TOKEN_FILE),
        crate::small_file::TOKEN_MAX,
    )?;
    Ok(text.trim().to_owned())
}

/// Compares in time independent of where the first difference is.
pub fn matches(expected: &str, presented: &str) -> bool {
    let (a, b) = (expected.as_bytes(), presented.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_private_fresh_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let first = create(dir.path()).unwrap();
        let second = create(dir.path()).unwrap();
        assert_ne!(first, second);
        assert_eq!(first.len(), 64);
        let path = dir.path().join(TOKEN_FILE);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            read_beside(&dir.path().join("runner.sock")).unwrap(),
            second
        );
        assert!(matches(&second, &second));
        assert!(!matches(&second, &first));
        assert!(!matches(&second, &second[..63]));
    }
}
