//! What the hub link can run into, each naming the hub's URL or the file at fault, and
//! none carrying the token.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use crate::hub_client::HubClientError;
use crate::proto::desired;

#[derive(Debug, Error)]
pub enum HubLinkError {
    #[error("could not read the hub token file {path}")]
    TokenRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the hub token file {path} is empty: write the token `railgrid hub agent add` printed into it")]
    TokenEmpty { path: PathBuf },
    #[error("the hub token in {path} holds characters an HTTP header cannot carry (a control character, or more than one line)")]
    TokenInvalid { path: PathBuf },
    #[error(transparent)]
    Client(HubClientError),
    #[error("the hub refused to enrol this host: {url} answered {status}: {message}")]
    EnrolRefused {
        url: String,
        status: u16,
        message: String,
    },
    #[error("could not write the hub token file {path}")]
    TokenWrite {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the hub refused this agent's token (revoked or unknown): {url} answered {status}{message}; the agent needs a new token in its token file, then SIGHUP")]
    Refused {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{url} answered {status}{message}")]
    Status {
        url: String,
        status: u16,
        message: String,
    },
    #[error("could not reach the hub at {url}")]
    Request {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the hub at {url} did not answer within {}", humantime::format_duration(*after))]
    Timeout { url: String, after: Duration },
    #[error("could not encode the report for {url}")]
    Encode {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    // Serde's message as text: it quotes the hub's answer, so it is redacted first.
    #[error("{url}: the answer is not a desired state: {why}")]
    Decode { url: String, why: String },
    #[error("{url}: the answer is not a desired state this agent takes")]
    Invalid {
        url: String,
        #[source]
        source: desired::Invalid,
    },
    #[error("{url} answered 400{message}: the hub refuses the generation this agent reports")]
    GenerationRefused { url: String, message: String },
    #[error("could not apply the hub's desired state of generation {generation}: {why}")]
    NotApplied { generation: u64, why: String },
    #[error("the agent's {what} failed")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl HubLinkError {
    /// The hub could not be reached, or said it cannot serve now: nothing this build
    /// did. A TLS failure, a refused token or an answer this build cannot take is not
    /// (a new build that broke its TLS or its reports must not look healthy).
    pub fn is_away(&self) -> bool {
        match self {
            HubLinkError::Timeout { .. } => true,
            HubLinkError::Status { status, .. } => *status >= 500 || *status == 429,
            HubLinkError::Request { source, .. } => {
                let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source);
                while let Some(e) = cause {
                    // An io::Error's own `source` skips the error it wraps: look inside.
                    let inner = e
                        .downcast_ref::<std::io::Error>()
                        .and_then(|io| io.get_ref())
                        .map(|i| i as &(dyn std::error::Error + 'static));
                    if e.is::<rustls::Error>() || inner.is_some_and(|i| i.is::<rustls::Error>()) {
                        return false;
                    }
                    cause = e.source();
                }
                // No connection, a timeout, or a connection the hub (a restart, its own
                // bound on connections without a token, a balancer) closed or reset
                // under the request: all the hub's side. What this build did wrong (a
                // request it could not build, a redirect, an answer it cannot decode)
                // is not.
                !(source.is_builder() || source.is_redirect() || source.is_decode())
            }
            _ => false,
        }
    }
}
