//! The hub's TLS: a certificate and key given as PEM files, or a CA of its own
//! (`--tls-self-signed`) made at first start. The CA's certificate goes to
//! `<data>/ca.pem` for agents and admin commands to pin; its key stays in
//! `<data>/tls/ca.key` (0600). The server certificate is signed anew from that CA at every
//! start, for `localhost`, `127.0.0.1`, `::1` and each `--tls-name`, so a changed name
//! list needs no ceremony and the CA agents pinned stays the same.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

use crate::file_error::FileError;

/// The CA's certificate, for agents to pin (`--ca-file`).
pub const CA_FILE: &str = "ca.pem";
const TLS_DIR: &str = "tls";
const CA_KEY: &str = "ca.key";
const CA_NAME: &str = "railgrid hub CA";

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("could not read {what} {path}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{path} holds no usable {what}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} exists but the CA key {key} does not: restore the key, or move {path} away to make a new CA (agents must then pin the new ca.pem)")]
    LostCaKey { path: PathBuf, key: PathBuf },
    #[error("could not make the hub's certificates")]
    Generate(#[source] rcgen::Error),
    #[error("the certificate and key do not make a TLS configuration")]
    Config(#[source] rustls::Error),
}

/// Where the server's certificate comes from.
#[derive(Debug, Clone)]
pub enum TlsSource {
    Files { cert: PathBuf, key: PathBuf },
    SelfSigned { names: Vec<String> },
}

/// The CA of `--tls-self-signed` in `data_dir` (certificate PEM, key PEM), if made.
pub fn local_ca(data_dir: &Path) -> Result<Option<(String, String)>, TlsError> {
    let cert = data_dir.join(CA_FILE);
    let key = data_dir.join(TLS_DIR).join(CA_KEY);
    if !key.exists() {
        return Ok(None);
    }
    let text =
        |what, path: &Path| read(what, path).map(|b| String::from_utf8_lossy(&b).into_owned());
    Ok(Some((text("the CA", &cert)?, text("the CA key", &key)?)))
}

/// A new CA for `--tls-self-signed`: (certificate PEM, key PEM), written nowhere.
pub fn new_ca() -> Result<(String, String), TlsError> {
    let key = KeyPair::generate().map_err(TlsError::Generate)?;
    let ca = ca_params()?.self_signed(&key).map_err(TlsError::Generate)?;
    Ok((ca.pem(), key.serialize_pem()))
}

/// Writes a CA made by another replica into `data_dir`, where `--tls-self-signed` finds
/// it: every replica then serves a certificate from the one CA agents pin.
pub fn adopt_ca(data_dir: &Path, cert: &str, key: &str) -> Result<(), TlsError> {
    let tls_dir = data_dir.join(TLS_DIR);
    crate::sys::dirfd::Dir::open(data_dir)
        .and_then(|d| d.make_child(TLS_DIR, 0o700))
        .map_err(FileError::write(&tls_dir))?;
    let key_file = tls_dir.join(CA_KEY);
    crate::util::write_atomic(&key_file, key.as_bytes(), 0o600)
        .map_err(FileError::write(&key_file))?;
    let ca_file = data_dir.join(CA_FILE);
    crate::util::write_atomic(&ca_file, cert.as_bytes(), 0o644)
        .map_err(FileError::write(&ca_file))?;
    Ok(())
}

/// The rustls server configuration (HTTP/1.1 only) for `source`.
pub fn server_config(
    data_dir: &Path,
    source: &TlsSource,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let (chain, key) = match source {
        TlsSource::Files { cert, key } => (read_chain(cert)?, read_key(key)?),
        TlsSource::SelfSigned { names } => self_signed(data_dir, names)?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(TlsError::Config)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    crate::small_file::read(path, crate::small_file::CONFIG_MAX).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read("the TLS certificate", path)?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            what: "certificate",
            path: path.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::Pem {
            what: "certificate",
            path: path.to_owned(),
            source: rustls::pki_types::pem::Error::NoItemsFound,
        });
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read("the TLS key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|source| TlsError::Pem {
        what: "private key",
        path: path.to_owned(),
        source,
    })
}

/// The CA's parameters. The same at every start: the certificate made from them and the
/// stored key is the issuer of the server certificate, and chains to the `ca.pem`
/// written at first start (same name, same key).
fn ca_params() -> Result<CertificateParams, TlsError> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(TlsError::Generate)?;
    p.distinguished_name.push(DnType::CommonName, CA_NAME);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

fn self_signed(
    data_dir: &Path,
    names: &[String],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let ca_file = data_dir.join(CA_FILE);
    let tls_dir = data_dir.join(TLS_DIR);
    let key_file = tls_dir.join(CA_KEY);
    let ca_key = if key_file.exists() {
        let pem = read("the CA key", &key_file)?;
        let pem = String::from_utf8_lossy(&pem);
        KeyPair::from_pem(&pem).map_err(TlsError::Generate)?
    } else if ca_file.exists() {
        return Err(TlsError::LostCaKey {
            path: ca_file,
            key: key_file,
        });
    } else {
        let key = KeyPair::generate().map_err(TlsError::Generate)?;
        crate::sys::dirfd::Dir::open(data_dir)
            .and_then(|d| d.make_child(TLS_DIR, 0o700))
            .map_err(FileError::write(&tls_dir))?;
        crate::util::write_atomic(&key_file, key.serialize_pem().as_bytes(), 0o600)
            .map_err(FileError::write(&key_file))?;
        tracing::info!(ca = %ca_file.display(), "made the hub's own CA (--tls-self-signed): agents pin this file");
        key
    };
    let ca = ca_params()?
        .self_signed(&ca_key)
        .map_err(TlsError::Generate)?;
    if !ca_file.exists() {
        crate::util::write_atomic(&ca_file, ca.pem().as_bytes(), 0o644)
            .map_err(FileError::write(&ca_file))?;
    }
    let mut sans: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    for n in names {
        if !sans.contains(n) {
            sans.push(n.clone());
        }
    }
    let mut p = CertificateParams::new(sans).map_err(TlsError::Generate)?;
    p.distinguished_name
        .push(DnType::CommonName, "railgrid hub");
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    p.use_authority_key_identifier_extension = true;
    let server_key = KeyPair::generate().map_err(TlsError::Generate)?;
    let cert = p
        .signed_by(&server_key, &ca, &ca_key)
        .map_err(TlsError::Generate)?;
    let key = PrivateKeyDer::try_from(server_key.serialize_der()).map_err(|_| TlsError::Pem {
        what: "private key",
        path: key_file,
        source: rustls::pki_types::pem::Error::NoItemsFound,
    })?;
    Ok((vec![cert.der().clone()], key))
}
