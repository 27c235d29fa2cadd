//! The key that seals secrets at rest: 32 random bytes in a file beside the hub
//! (`<data-dir>/secrets.key` or `--secrets-key-file`, 0600, 64 hex digits), never in the
//! store. Values are sealed with XChaCha20-Poly1305 (a random 24-byte nonce each), bound
//! to their secret's name and version, so that no sealed value can stand in for
//! another's. The store keeps each value's key fingerprint, which says which key opens
//! it without saying anything of the key.

use std::io;
use std::path::{Path, PathBuf};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use sha2::{Digest, Sha256};

const NONCE: usize = 24;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the secrets key file {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the secrets key file {path} is not 64 hex digits (32 bytes) and a newline")]
    Malformed { path: PathBuf },
    #[error("the secrets key file {path} is open to others (owner uid {owner}, mode {mode:o}): chmod 600 it, owned by the hub's account")]
    Exposed {
        path: PathBuf,
        owner: u32,
        mode: u32,
    },
}

/// One key, and its fingerprint.
pub(super) struct Key {
    cipher: XChaCha20Poly1305,
    id: String,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("id", &self.id).finish()
    }
}

/// Where a sealed value belongs: its secret's name, version and scope, bound to it so
/// that none of them can be changed in the store without the value failing to open.
pub(super) struct Place<'a> {
    pub name: &'a str,
    pub version: u64,
    pub selector: Option<&'a str>,
}

impl Place<'_> {
    fn aad(&self) -> Vec<u8> {
        let scope = self.selector.map_or(String::new(), |s| format!("\0{s}"));
        format!("railgrid secret\0{}\0{}{scope}", self.name, self.version).into_bytes()
    }
}

/// The bytes that sealed value `sealed` holds of its value: what it takes in an answer,
/// at least.
pub(super) fn value_len(sealed: &[u8]) -> usize {
    sealed.len().saturating_sub(NONCE + 16)
}

impl Key {
    fn from_bytes(bytes: &[u8; 32]) -> Self {
        let mut h = Sha256::new();
        h.update(b"railgrid secrets key fingerprint\0");
        h.update(bytes);
        let id = h
            .finalize()
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect();
        Self {
            cipher: XChaCha20Poly1305::new(bytes.into()),
            id,
        }
    }

    /// A fresh key, and its file's text.
    pub(super) fn generate() -> io::Result<(Self, String)> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(io::Error::other)?;
        let text = format!(
            "{}\n",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        Ok((Self::from_bytes(&bytes), text))
    }

    /// Reads the key in `path`: a regular file, private to this account.
    pub(super) fn read(path: &Path) -> Result<Self, KeyError> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let io = |source| KeyError::Io {
            path: path.to_owned(),
            source,
        };
        let file = crate::small_file::SmallFile::open(path).map_err(io)?;
        if crate::small_file::private(file.meta()).is_err() {
            return Err(KeyError::Exposed {
                path: path.to_owned(),
                owner: file.meta().uid(),
                mode: file.meta().permissions().mode() & 0o777,
            });
        }
        let text = file.read_string(crate::small_file::TOKEN_MAX).map_err(io)?;
        let hex = text.strip_suffix('\n').unwrap_or(&text);
        let malformed = || KeyError::Malformed {
            path: path.to_owned(),
        };
        if hex.len() != 64 {
            return Err(malformed());
        }
        let mut bytes = [0u8; 32];
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(malformed());
        }
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(malformed)?, 16)
                .map_err(|_| malformed())?;
        }
        Ok(Self::from_bytes(&bytes))
    }

    /// The fingerprint the store keeps beside each value this key sealed.
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// Seals `value` for `place`: nonce, then ciphertext.
    pub(super) fn seal(&self, place: &Place<'_>, value: &[u8]) -> io::Result<Vec<u8>> {
        let mut nonce = [0u8; NONCE];
        getrandom::fill(&mut nonce).map_err(io::Error::other)?;
        let aad = place.aad();
        let sealed = self
            .cipher
            .encrypt(
                (&nonce).into(),
                Payload {
                    msg: value,
                    aad: &aad,
                },
            )
            .map_err(|_| io::Error::other("sealing failed"))?;
        let mut out = nonce.to_vec();
        out.extend(sealed);
        Ok(out)
    }

    /// Opens what [`Self::seal`] made for `place`; `None` when it was not sealed by this
    /// key for that place (or was altered).
    pub(super) fn open(&self, place: &Place<'_>, sealed: &[u8]) -> Option<Vec<u8>> {
        let (nonce, body) = (sealed.get(..NONCE)?, sealed.get(NONCE..)?);
        let aad = place.aad();
        self.cipher
            .decrypt(
                nonce.into(),
                Payload {
                    msg: body,
                    aad: &aad,
                },
            )
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_opens_only_with_its_key_name_version_and_scope() {
        let at = |name, version, selector| Place {
            name,
            version,
            selector,
        };
        let (key, text) = Key::generate().expect("key");
        let here = at("DEPLOY", 3, Some("queue=deploy"));
        let sealed = key.seal(&here, b"s3cr3t value").expect("seal");
        assert_eq!(value_len(&sealed), b"s3cr3t value".len());
        assert!(!sealed
            .windows(b"s3cr3t".len())
            .any(|w| w == b"s3cr3t".as_slice()));
        assert_eq!(
            key.open(&here, &sealed).as_deref(),
            Some(&b"s3cr3t value"[..])
        );
        for elsewhere in [
            at("OTHER", 3, Some("queue=deploy")),
            at("DEPLOY", 2, Some("queue=deploy")),
            at("DEPLOY", 3, None),
            at("DEPLOY", 3, Some("queue=build")),
        ] {
            assert_eq!(key.open(&elsewhere, &sealed), None);
        }
        let (other, _) = Key::generate().expect("key");
        assert_ne!(other.id(), key.id());
        assert_eq!(other.open(&here, &sealed), None);
        let mut flipped = sealed.clone();
        *flipped.last_mut().expect("bytes") ^= 1;
        assert_eq!(key.open(&here, &flipped), None);
        assert_eq!(key.open(&here, &sealed[..10]), None);

        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("secrets.key");
        crate::util::write_atomic(&path, text.as_bytes(), 0o600).expect("write");
        let again = Key::read(&path).expect("read");
        assert_eq!(again.id(), key.id());
        crate::util::write_atomic(&path, text.as_bytes(), 0o644).expect("write");
        assert!(matches!(Key::read(&path), Err(KeyError::Exposed { .. })));
        for bad in ["abc\n".to_owned(), format!("+{}\n", &text[1..64])] {
            crate::util::write_atomic(&path, bad.as_bytes(), 0o600).expect("write");
            assert!(matches!(Key::read(&path), Err(KeyError::Malformed { .. })));
        }
    }
}
