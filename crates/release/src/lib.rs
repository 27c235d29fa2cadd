//! Release signing: minisign keys and signatures (Ed25519 over the file's BLAKE2b hash),
//! in the formats of the `minisign` tool, so that a release can be signed with either and
//! checked with either (`railgrid release keygen|sign|verify`).
//!
//! A railgrid signature's trusted comment, which the signature covers, says what was
//! signed: `version:1.4.0`, `file:railgrid`, `sha256:<hex>`, `timestamp:<unix>`, separated
//! by tabs as minisign's own. The hub and the agent read the version from it, so that a signed
//! 1.4.0 cannot be passed off as another version.
//!
//! Nothing here prompts: a secret key is unencrypted unless a password file is given, and
//! an encrypted one is opened only with its password file.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use minisign::{KeyPair, PublicKey, PublicKeyBox, SecretKey, SecretKeyBox, SignatureBox};
use sha2::{Digest, Sha256};
use thiserror::Error;

use railgrid_proto as proto;
use railgrid_util::file_error::FileError;
use railgrid_util::{self as util, small_file};

/// How long `FILE version --json` may take when `sign` asks a binary its version.
/// The largest release binary: what a hub takes, and what `release sign` and `verify` read.
pub const MAX_RELEASE: u64 = 512 * 1024 * 1024;

const VERSION_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum ReleaseError {
    #[error("{path} exists already: keys are never overwritten (remove it first, or choose another path)")]
    Exists { path: PathBuf },
    #[error(transparent)]
    File(#[from] FileError),
    #[error("the password file {path} is empty")]
    EmptyPassword { path: PathBuf },
    #[error("{path} is not a minisign {what}: {why}")]
    Format {
        path: PathBuf,
        what: &'static str,
        why: String,
    },
    #[error("the secret key {path} is encrypted: give its --password-file")]
    Encrypted { path: PathBuf },
    #[error("could not open the secret key {path} with that password: {why}")]
    Password { path: PathBuf, why: String },
    #[error("could not make a key pair: {0}")]
    Generate(String),
    #[error("could not sign {path}: {why}")]
    Sign { path: PathBuf, why: String },
    #[error("the signature {signature} does not verify {path} with key {key_id}: {why}")]
    Bad {
        path: PathBuf,
        signature: PathBuf,
        key_id: String,
        why: String,
    },
    #[error("could not tell the version of {path} ({why}): give --version V")]
    Version { path: PathBuf, why: String },
}

impl ReleaseError {
    /// True for what the operator fixes in the command line or the files named (exit 2).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            ReleaseError::Exists { .. }
                | ReleaseError::EmptyPassword { .. }
                | ReleaseError::Format { .. }
                | ReleaseError::Encrypted { .. }
                | ReleaseError::Version { .. }
        )
    }
}

/// A file to sign or verify: a release binary, at most what a hub takes.
fn read_binary(path: &Path) -> Result<Vec<u8>, ReleaseError> {
    read(path, MAX_RELEASE)
}

fn read(path: &Path, max: u64) -> Result<Vec<u8>, ReleaseError> {
    Ok(crate::small_file::read(path, max).map_err(FileError::read(path))?)
}

fn read_text(path: &Path) -> Result<String, ReleaseError> {
    let bytes = read(path, crate::small_file::KEY_MAX)?;
    String::from_utf8(bytes).map_err(|_| ReleaseError::Format {
        path: path.to_owned(),
        what: "file",
        why: "it is not text".into(),
    })
}

/// The password in `path` (its first line).
pub fn read_password(path: &Path) -> Result<String, ReleaseError> {
    let text = read_text(path)?;
    let pw = text.lines().next().unwrap_or("").to_owned();
    if pw.is_empty() {
        return Err(ReleaseError::EmptyPassword {
            path: path.to_owned(),
        });
    }
    Ok(pw)
}

/// Creates `path` with `mode`, never over an existing file.
fn create(path: &Path, mode: u32, text: &str) -> Result<(), ReleaseError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::AlreadyExists => ReleaseError::Exists {
                path: path.to_owned(),
            },
            _ => FileError::write(path)(source).into(),
        })?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(FileError::write(path))?;
    Ok(())
}

/// A key id as minisign shows it: 16 hex digits.
fn key_id(keynum: &[u8]) -> String {
    let mut n = [0u8; 8];
    n.copy_from_slice(&keynum[..8]);
    format!("{:016X}", u64::from_le_bytes(n))
}

/// Makes a key pair: the secret key (0600, encrypted with `password` if given) and the
/// public key (0644), neither over an existing file. Returns the public key's line (the
/// `RW…` an agent's `trusted_keys` takes) and its id.
pub fn keygen(
    secret: &Path,
    public: &Path,
    password: Option<String>,
) -> Result<(String, String), ReleaseError> {
    for p in [secret, public] {
        if p.exists() {
            return Err(ReleaseError::Exists { path: p.to_owned() });
        }
    }
    let kp = match password {
        Some(pw) => KeyPair::generate_encrypted_keypair(Some(pw)),
        None => KeyPair::generate_unencrypted_keypair(),
    }
    .map_err(|e| ReleaseError::Generate(e.to_string()))?;
    let id = key_id(kp.pk.keynum());
    let pk_box = kp
        .pk
        .to_box()
        .map_err(|e| ReleaseError::Generate(e.to_string()))?;
    let sk_box = kp
        .sk
        .to_box(None)
        .map_err(|e| ReleaseError::Generate(e.to_string()))?;
    let line = kp.pk.to_base64();
    // The secret first: a public key without its secret is of no use, the reverse is.
    create(secret, 0o600, &sk_box.into_string())?;
    create(public, 0o644, &pk_box.into_string())?;
    Ok((line, id))
}

fn open_secret(path: &Path, password: Option<String>) -> Result<SecretKey, ReleaseError> {
    let text = read_text(path)?;
    let sk_box = SecretKeyBox::from_string(&text).map_err(|e| ReleaseError::Format {
        path: path.to_owned(),
        what: "secret key",
        why: e.to_string(),
    })?;
    match password {
        Some(pw) => sk_box
            .into_secret_key(Some(pw))
            .map_err(|e| ReleaseError::Password {
                path: path.to_owned(),
                why: e.to_string(),
            }),
        None => sk_box.into_unencrypted_secret_key().map_err(|e| {
            if e.to_string().contains("encrypted") {
                ReleaseError::Encrypted {
                    path: path.to_owned(),
                }
            } else {
                ReleaseError::Format {
                    path: path.to_owned(),
                    what: "secret key",
                    why: e.to_string(),
                }
            }
        }),
    }
}

/// The public key in the file at `path`.
pub fn load_public_key(path: &Path) -> Result<PublicKey, ReleaseError> {
    public_key(&read_text(path)?, path)
}

/// A public key from a file (minisign's two lines) or a key line (`RW…`).
pub fn public_key(text: &str, path: &Path) -> Result<PublicKey, ReleaseError> {
    let bad = |e: minisign::PError| ReleaseError::Format {
        path: path.to_owned(),
        what: "public key",
        why: e.to_string(),
    };
    let text = text.trim();
    if text.lines().count() == 1 {
        PublicKey::from_base64(text).map_err(bad)
    } else {
        PublicKeyBox::from_string(text)
            .and_then(PublicKeyBox::into_public_key)
            .map_err(bad)
    }
}

/// The SHA-256 of `bytes`, as release records name binaries.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `<file> version --json`, as the signer's own account, with an empty environment.
pub fn version_of(file: &Path) -> Result<String, ReleaseError> {
    let why = |why: String| ReleaseError::Version {
        path: file.to_owned(),
        why,
    };
    // A bare name would be looked up in PATH: run the file named, wherever it is.
    let file_path = std::path::absolute(file).unwrap_or_else(|_| file.to_owned());
    let mut child = std::process::Command::new(&file_path)
        .args(["version", "--json"])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| why(format!("it does not run: {e}")))?;
    let deadline = std::time::Instant::now() + VERSION_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(why(format!(
                    "`version --json` did not answer within {}",
                    humantime::format_duration(VERSION_TIMEOUT)
                )));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(why(e.to_string())),
        }
    }
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    let v: serde_json::Value = serde_json::from_str(&out)
        .map_err(|_| why("`version --json` did not print railgrid's JSON".into()))?;
    v["version"]
        .as_str()
        .filter(|v| crate::proto::desired::is_version(v))
        .map(str::to_owned)
        .ok_or_else(|| why("`version --json` names no version".into()))
}

/// Signs `file` with the secret key at `secret`; writes `<file>.minisig` and returns its
/// path and trusted comment.
pub fn sign(
    secret: &Path,
    password: Option<String>,
    file: &Path,
    version: &str,
) -> Result<(PathBuf, String), ReleaseError> {
    let sk = open_secret(secret, password)?;
    let data = read_binary(file)?;
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let timestamp = crate::util::unix_now();
    let trusted = format!(
        "version:{version}\tfile:{name}\tsha256:{}\ttimestamp:{timestamp}",
        sha256_hex(&data)
    );
    let pk = PublicKey::from_secret_key(&sk).map_err(|e| ReleaseError::Sign {
        path: file.to_owned(),
        why: e.to_string(),
    })?;
    let untrusted = format!("signature from railgrid secret key {}", key_id(pk.keynum()));
    let sig = minisign::sign(
        Some(&pk),
        &sk,
        std::io::Cursor::new(&data),
        Some(&trusted),
        Some(&untrusted),
    )
    .map_err(|e| ReleaseError::Sign {
        path: file.to_owned(),
        why: e.to_string(),
    })?;
    let out = signature_path(file);
    let tmp = out.with_extension("minisig.tmp");
    let _ = std::fs::remove_file(&tmp);
    create(&tmp, 0o644, &sig.into_string())?;
    std::fs::rename(&tmp, &out).map_err(FileError::write(&out))?;
    Ok((out, trusted))
}

/// `<file>.minisig`.
pub fn signature_path(file: &Path) -> PathBuf {
    let mut s = file.as_os_str().to_owned();
    s.push(".minisig");
    PathBuf::from(s)
}

/// What a good signature says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub key_id: String,
    pub trusted_comment: String,
    /// The trusted comment's `key:value` fields (`version`, `file`, `sha256`, …).
    pub fields: BTreeMap<String, String>,
}

/// Why a signature does not vouch for some bytes, against a set of trusted keys.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SignatureError {
    #[error("the signature is not in minisign's format: {0}")]
    Format(String),
    #[error("no key is trusted to sign releases")]
    NoKeys,
    #[error("it is signed by key {key_id}, which is not trusted (trusted: {})", trusted.join(", "))]
    UntrustedKey {
        key_id: String,
        trusted: Vec<String>,
    },
    #[error("the signature by key {key_id} does not verify the bytes: {why}")]
    Bad { key_id: String, why: String },
}

/// Checks `signature` (a `.minisig` file's text) over `data` with whichever of `keys`
/// made it (chosen by key id, so that several keys may be trusted while one is rotated).
pub fn check<R: Read + std::io::Seek>(
    keys: &[PublicKey],
    signature: &str,
    data: R,
) -> Result<Verified, SignatureError> {
    let sig =
        SignatureBox::from_string(signature).map_err(|e| SignatureError::Format(e.to_string()))?;
    if keys.is_empty() {
        return Err(SignatureError::NoKeys);
    }
    let key_id = key_id(sig.keynum());
    let Some(key) = keys.iter().find(|k| k.keynum() == sig.keynum()) else {
        return Err(SignatureError::UntrustedKey {
            key_id,
            trusted: keys.iter().map(|k| self::key_id(k.keynum())).collect(),
        });
    };
    minisign::verify(key, &sig, data, true, false, false).map_err(|e| SignatureError::Bad {
        key_id: key_id.clone(),
        why: e.to_string(),
    })?;
    Ok(verified(key_id, &sig))
}

fn verified(key_id: String, sig: &SignatureBox) -> Verified {
    let trusted_comment = sig.trusted_comment().unwrap_or_default();
    let fields = trusted_comment
        .split('\t')
        .filter_map(|f| f.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    Verified {
        key_id,
        trusted_comment,
        fields,
    }
}

/// The key id of a public key, as minisign shows it.
pub fn id_of(key: &PublicKey) -> String {
    key_id(key.keynum())
}

/// Checks `signature` (default `<file>.minisig`) over `file` with `key`.
pub fn verify(
    key: &PublicKey,
    file: &Path,
    signature: Option<&Path>,
) -> Result<Verified, ReleaseError> {
    let sig_path = signature.map_or_else(|| signature_path(file), Path::to_owned);
    let text = read_text(&sig_path)?;
    let sig = SignatureBox::from_string(&text).map_err(|e| ReleaseError::Format {
        path: sig_path.clone(),
        what: "signature",
        why: e.to_string(),
    })?;
    let data = read_binary(file)?;
    let key_id = key_id(key.keynum());
    minisign::verify(key, &sig, std::io::Cursor::new(&data), true, false, false).map_err(|e| {
        ReleaseError::Bad {
            path: file.to_owned(),
            signature: sig_path.clone(),
            key_id: key_id.clone(),
            why: e.to_string(),
        }
    })?;
    Ok(verified(key_id, &sig))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_its_file_only_and_says_what_was_signed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sk, pk) = (dir.path().join("k.key"), dir.path().join("k.pub"));
        let (line, id) = keygen(&sk, &pk, None).expect("keygen");
        assert!(line.starts_with("RW"), "{line}");
        assert_eq!(id.len(), 16);
        assert!(matches!(
            keygen(&sk, &dir.path().join("other.pub"), None),
            Err(ReleaseError::Exists { .. })
        ));
        let file = dir.path().join("railgrid");
        std::fs::write(&file, b"the release").expect("file");
        let (sig, trusted) = sign(&sk, None, &file, "1.4.0").expect("sign");
        assert_eq!(sig, dir.path().join("railgrid.minisig"));
        assert!(trusted.starts_with("version:1.4.0\tfile:railgrid\tsha256:"));

        let from_file = public_key(&std::fs::read_to_string(&pk).expect("pub"), &pk).expect("pk");
        let from_line = public_key(&line, &pk).expect("pk line");
        for key in [&from_file, &from_line] {
            let v = verify(key, &file, None).expect("verify");
            assert_eq!(v.key_id, id);
            assert_eq!(v.fields["version"], "1.4.0");
            assert_eq!(v.fields["sha256"], sha256_hex(b"the release"));
        }
        std::fs::write(&file, b"the releasE").expect("tamper");
        assert!(matches!(
            verify(&from_file, &file, None),
            Err(ReleaseError::Bad { .. })
        ));
        let (sk2, pk2) = (dir.path().join("2.key"), dir.path().join("2.pub"));
        let (line2, _) = keygen(&sk2, &pk2, None).expect("keygen 2");
        std::fs::write(&file, b"the release").expect("restore");
        let e =
            verify(&public_key(&line2, &pk2).expect("pk2"), &file, None).expect_err("another key");
        assert!(e.to_string().contains("does not verify"), "{e}");
    }
}
