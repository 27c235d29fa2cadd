//! Reaching the database: TLS with rustls (`sslmode=require` verifies against the
//! system's roots, or against `sslrootcert=FILE` in the URL, read here since the driver
//! does not), and the URL as it may be shown, its password never in it.

use std::path::PathBuf;
use std::sync::Arc;

use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::StoreError;

/// The URL with its password replaced, for messages and logs. Whatever lies before
/// the last `@` is user and password (the driver's reading and ours may differ on an
/// unencoded `@`: cutting too much is safe, too little is not), and a query key that
/// decodes to `password` in any case is hidden.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(not a postgres:// URL)".into();
    };
    let rest = match rest.rsplit_once('@') {
        Some((user, after)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:***@{after}"),
            None => format!("{user}@{after}"),
        },
        None => rest.to_owned(),
    };
    let rest = match rest.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if percent_decoded(k).eq_ignore_ascii_case("password") => {
                        format!("{k}=***")
                    }
                    _ => kv.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => rest,
    };
    format!("{scheme}://{rest}")
}

/// `%XX` decoded (bytes that do not decode are kept as they are).
pub(super) fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Takes `sslrootcert=FILE` out of the URL's query (the driver refuses what it does not
/// know).
pub(super) fn split_root_cert(url: &str) -> (String, Option<PathBuf>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut root = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| match kv.strip_prefix("sslrootcert=") {
            Some(path) => {
                root = Some(PathBuf::from(path));
                false
            }
            None => true,
        })
        .collect();
    if kept.is_empty() {
        (base.to_owned(), root)
    } else {
        (format!("{base}?{}", kept.join("&")), root)
    }
}

pub(super) fn tls_config(
    url: &str,
    root: Option<PathBuf>,
) -> Result<rustls::ClientConfig, StoreError> {
    let mut roots = rustls::RootCertStore::empty();
    match root {
        Some(path) => {
            let pem = crate::small_file::read(&path, crate::small_file::CONFIG_MAX).map_err(
                |source| StoreError::DatabaseCa {
                    url: url.to_owned(),
                    path: path.clone(),
                    source,
                },
            )?;
            use rustls::pki_types::pem::PemObject;
            for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem).flatten() {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(StoreError::DatabaseCa {
                    url: url.to_owned(),
                    path,
                    source: std::io::Error::other("no certificate in it"),
                });
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::BadUrl {
            url: url.to_owned(),
            why: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(cfg)
}

/// rustls for the driver. The driver asks for a connector even where it will not use
/// it (a Unix socket, which has no host name, with TLS off): such a connector is given
/// a name no certificate can hold (`.invalid` is reserved), so that it fails closed if
/// it is ever used.
#[derive(Clone)]
pub(super) struct Tls(pub(super) MakeRustlsConnect);

impl<S> MakeTlsConnect<S> for Tls
where
    MakeRustlsConnect: MakeTlsConnect<S>,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, hostname: &str) -> Result<Self::TlsConnect, Self::Error> {
        let name = if hostname.is_empty() {
            "no-host-name.invalid"
        } else {
            hostname
        };
        MakeTlsConnect::<S>::make_tls_connect(&mut self.0, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redact("postgres://hub:s3cret@db.example:5432/railgrid?sslmode=require"),
            "postgres://hub:***@db.example:5432/railgrid?sslmode=require"
        );
        assert_eq!(
            redact("postgresql://db/railgrid?user=hub&password=s3cret"),
            "postgresql://db/railgrid?user=hub&password=***"
        );
        assert_eq!(redact("postgres://hub@db/x"), "postgres://hub@db/x");
        // An unencoded `@` in the password, a key in another case or percent-encoded.
        let leaks = [
            "postgresql://u:Ab@cdSECRET@/db?host=/s",
            "postgresql:///db?host=/s&user=u&pass%77ord=SECRET",
            "postgresql:///db?user=u&PASSWORD=SECRET",
            "postgresql:///db?user=u&%70assword=SECRET",
        ];
        for url in leaks {
            assert!(!redact(url).contains("SECRET"), "{url}: {}", redact(url));
        }
        assert!(!redact("nonsense s3cret").contains("s3cret"));
    }

    #[test]
    fn the_root_certificate_is_taken_out_of_the_url() {
        assert_eq!(
            split_root_cert("postgres://db/x?sslmode=require&sslrootcert=/etc/ca.pem"),
            (
                "postgres://db/x?sslmode=require".to_owned(),
                Some(PathBuf::from("/etc/ca.pem"))
            )
        );
        assert_eq!(
            split_root_cert("postgres://db/x?sslrootcert=/ca"),
            ("postgres://db/x".to_owned(), Some(PathBuf::from("/ca")))
        );
        assert_eq!(
            split_root_cert("postgres://db/x"),
            ("postgres://db/x".into(), None)
        );
    }
}
