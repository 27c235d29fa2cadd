//! The HTTPS client side of the hub protocol, shared by the agent's reconcile loop and the
//! hub's admin commands (the admin API's client is the binary's `hub_client::admin`): a reqwest client on rustls that trusts the system roots plus the
//! hub's own CA (pinned by file), and answers read with a size cap, so that a hub that is
//! broken or hostile can make a request fail but never make its caller buffer without end.

use std::path::{Path, PathBuf};
use std::time::Duration;

use railgrid_util::small_file;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum HubClientError {
    #[error("could not read the hub CA file {path}")]
    ReadCa {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the hub CA file {path} holds no PEM certificate")]
    BadCa {
        path: PathBuf,
        #[source]
        source: reqwest::Error,
    },
    #[error("the hub CA file {path} holds no certificate (-----BEGIN CERTIFICATE----- …)")]
    NoCertificate { path: PathBuf },
    #[error("could not build the HTTPS client")]
    Build(#[source] reqwest::Error),
    #[error("{url}: the answer is larger than {cap} bytes")]
    TooLarge { url: String, cap: usize },
    #[error("{url}: the answer was cut off")]
    Body {
        url: String,
        #[source]
        source: reqwest::Error,
    },
}

/// A client for one hub. `ca_file` is added to the system's trust roots (a hub with a
/// public certificate needs none). `timeout` bounds connecting; each request sets its own
/// total timeout (a long poll is held for as long as it asks).
pub fn build(
    ca_file: Option<&Path>,
    connect_timeout: Duration,
) -> Result<reqwest::Client, HubClientError> {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .https_only(true)
        .connect_timeout(connect_timeout)
        // A redirect could carry the bearer token to another host.
        .redirect(reqwest::redirect::Policy::none())
        // Below the reference hub's 10 s wait for the next request on a kept-alive
        // connection: a connection the hub is about to close is not reused.
        .pool_idle_timeout(Duration::from_secs(5))
        .user_agent(concat!("railgrid/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = ca_file {
        for cert in read_ca(path)? {
            b = b.add_root_certificate(cert);
        }
    }
    b.build().map_err(HubClientError::Build)
}

/// The certificates of the CA file at `path`: a regular file of at most
/// [`small_file::CONFIG_MAX`] bytes holding at least one.
pub fn read_ca(path: &Path) -> Result<Vec<reqwest::Certificate>, HubClientError> {
    let pem = small_file::read(path, small_file::CONFIG_MAX).map_err(|source| {
        HubClientError::ReadCa {
            path: path.to_owned(),
            source,
        }
    })?;
    parse_ca(path, &pem)
}

/// The certificates of the CA file `path` holds as `pem`: at least one.
pub fn parse_ca(path: &Path, pem: &[u8]) -> Result<Vec<reqwest::Certificate>, HubClientError> {
    let certs =
        reqwest::Certificate::from_pem_bundle(pem).map_err(|source| HubClientError::BadCa {
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(HubClientError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// Checks the CA file `path` holds as `pem` as [`build`] would use it: the certificates
/// must parse and a client must accept them as roots.
pub fn check_ca(path: &Path, pem: &[u8]) -> Result<(), HubClientError> {
    let mut b = reqwest::Client::builder().use_rustls_tls();
    for cert in parse_ca(path, pem)? {
        b = b.add_root_certificate(cert);
    }
    b.build().map(drop).map_err(HubClientError::Build)
}

/// The body of `resp`, refused once it passes `cap` bytes (whatever Content-Length
/// claims, which is checked first only to fail early).
pub async fn read_capped(
    mut resp: reqwest::Response,
    cap: usize,
) -> Result<Vec<u8>, HubClientError> {
    let url = resp.url().to_string();
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Err(HubClientError::TooLarge { url, cap });
    }
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > cap {
                    return Err(HubClientError::TooLarge { url, cap });
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(source) => return Err(HubClientError::Body { url, source }),
        }
    }
}

/// An `Authorization` value that reqwest and hyper keep out of their debug output.
pub fn bearer(
    token: &str,
) -> Result<reqwest::header::HeaderValue, reqwest::header::InvalidHeaderValue> {
    let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))?;
    v.set_sensitive(true);
    Ok(v)
}
