//! One hub, as the agent talks to it: its settings, an HTTPS client that trusts its CA,
//! and the token, only as the header value that carries it; every text taken from an
//! answer is redacted of the token before it is logged or shown.

use std::time::Duration;

use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};

use super::HubLinkError;
use crate::config::HubSettings;
use crate::hub_client::{self, HubClientError};
use crate::proto::desired::DesiredState;
use crate::proto::hub::ErrorBody;
use crate::proto::report::AgentReport;

/// How long the hub may hold a reconcile before it answers (the long poll).
pub(super) const WAIT: Duration = Duration::from_secs(30);
/// A reconcile's whole time limit: the hub's hold and room for the exchange.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(WAIT.as_secs() + 15);
/// Connecting, TLS handshake included.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest desired state read from the hub.
const MAX_ANSWER: usize = 1 << 20;
/// The most of a hub's error text that goes into a log line.
const MAX_ERROR_TEXT: usize = 300;
/// What stands for the token in text from a hub.
const REDACTED: &str = "<redacted>";
/// A tail of a hub's text at least this long that begins the token is redacted too.
const MIN_PARTIAL: usize = 4;

/// What talking to one hub takes: its settings, an HTTPS client that trusts its CA, and
/// the token, only as the header value that carries it.
pub struct Connection {
    pub(super) settings: HubSettings,
    pub(super) client: reqwest::Client,
    pub(super) auth: HeaderValue,
    /// The replica in use, of `settings.urls`.
    pub(super) current: usize,
}

impl Connection {
    /// What uploads to this hub take.
    pub(crate) fn link(&self) -> crate::upload::HubLink {
        crate::upload::HubLink {
            client: self.client.clone(),
            url: self.base().to_owned(),
            auth: self.auth.clone(),
        }
    }

    /// The URL of the replica in use.
    pub(super) fn base(&self) -> &str {
        &self.settings.urls[self.current % self.settings.urls.len()]
    }

    /// Moves on to the next replica; false when there is no other.
    pub(super) fn rotate(&mut self) -> bool {
        if self.settings.urls.len() < 2 {
            return false;
        }
        self.current = (self.current + 1) % self.settings.urls.len();
        true
    }

    /// Reads the token file and the CA file and builds the client. Blocking (two small
    /// file reads): called on a blocking thread, or before the runtime matters.
    pub fn load(settings: &HubSettings) -> Result<Self, HubLinkError> {
        let path = &settings.token_file;
        let text = crate::small_file::read_string(path, crate::small_file::TOKEN_MAX).map_err(
            |source| HubLinkError::TokenRead {
                path: path.clone(),
                source,
            },
        )?;
        let token = text.trim();
        if token.is_empty() {
            return Err(HubLinkError::TokenEmpty { path: path.clone() });
        }
        let auth = hub_client::bearer(token)
            .map_err(|_| HubLinkError::TokenInvalid { path: path.clone() })?;
        let client = hub_client::build(settings.ca_file.as_deref(), CONNECT_TIMEOUT)
            .map_err(HubLinkError::Client)?;
        Ok(Self {
            settings: settings.clone(),
            client,
            auth,
            current: 0,
        })
    }

    pub(super) fn url(&self, wait: Duration) -> String {
        format!(
            "{}/v1/agents/{}/reconcile?wait={}",
            self.base(),
            self.settings.agent_id,
            wait.as_secs()
        )
    }

    /// One reconcile: the report out, the desired state back; the hub may hold it for
    /// `wait` when nothing is new.
    pub(super) async fn reconcile(
        &self,
        report: &AgentReport,
        wait: Duration,
    ) -> Result<DesiredState, HubLinkError> {
        let url = self.url(wait);
        let body = serde_json::to_vec(report).map_err(|source| HubLinkError::Encode {
            url: url.clone(),
            source,
        })?;
        let resp = self
            .client
            .post(&url)
            .header(AUTHORIZATION, self.auth.clone())
            .header(CONTENT_TYPE, "application/json")
            .timeout(REQUEST_TIMEOUT)
            .body(body)
            .send()
            .await
            .map_err(|e| request_error(&url, e))?;
        let status = resp.status();
        let bytes = hub_client::read_capped(resp, MAX_ANSWER)
            .await
            .map_err(|e| match e {
                HubClientError::Body { source, .. } if source.is_timeout() => {
                    HubLinkError::Timeout {
                        url: url.clone(),
                        after: REQUEST_TIMEOUT,
                    }
                }
                other => HubLinkError::Client(other),
            })?;
        if status == reqwest::StatusCode::OK {
            return self.desired(url, &bytes);
        }
        let message = self.error_text(&bytes);
        let code = status.as_u16();
        if status == reqwest::StatusCode::BAD_REQUEST && message.contains("observed_generation") {
            return Err(HubLinkError::GenerationRefused { url, message });
        }
        if matches!(
            status,
            reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN
        ) {
            return Err(HubLinkError::Refused {
                url,
                status: code,
                message,
            });
        }
        Err(HubLinkError::Status {
            url,
            status: code,
            message,
        })
    }

    /// The desired state in a 200 answer, if it is one this agent takes.
    pub(super) fn desired(&self, url: String, body: &[u8]) -> Result<DesiredState, HubLinkError> {
        let mut desired: DesiredState =
            serde_json::from_slice(body).map_err(|e| HubLinkError::Decode {
                why: self.hub_text(&e.to_string()),
                url: url.clone(),
            })?;
        if let Some(agent) = &mut desired.agent {
            // Before the check: a token is made of characters a version may hold, and the
            // version is logged, kept and shown.
            agent.version = self.redact(&agent.version);
        }
        desired
            .check()
            .map_err(|source| HubLinkError::Invalid { url, source })?;
        Ok(desired)
    }

    /// The hub's `{"error": …}` message (or the start of whatever it sent instead), as
    /// `": message"`, through [`Self::hub_text`].
    pub(super) fn error_text(&self, body: &[u8]) -> String {
        let text = match serde_json::from_slice::<ErrorBody>(body) {
            Ok(e) => e.error,
            Err(_) => String::from_utf8_lossy(body).into_owned(),
        };
        let text = self.hub_text(&text);
        let text = text.trim();
        if text.is_empty() {
            String::new()
        } else {
            format!(": {text}")
        }
    }

    /// Text from a hub's answer, fit for a log line and the status file: on one line,
    /// without the token, cut short. The token goes before the cut, so that the cut
    /// cannot leave a part of it; a tail that begins the token (the hub cut its own
    /// echo) goes too.
    pub(super) fn hub_text(&self, text: &str) -> String {
        let text: String = text
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let mut text: String = self.redact(&text).chars().take(MAX_ERROR_TEXT).collect();
        if let Some(token) = self.token() {
            let partial = (MIN_PARTIAL.min(token.len())..token.len())
                .rev()
                .filter_map(|n| token.get(..n))
                .find(|start| text.ends_with(start));
            if let Some(start) = partial {
                text.truncate(text.len() - start.len());
                text.push_str(REDACTED);
            }
        }
        text
    }

    /// `text` with the token (`Bearer <token>` too) replaced.
    pub(super) fn redact(&self, text: &str) -> String {
        match self.token() {
            Some(token) => text.replace(token, REDACTED),
            None => text.to_owned(),
        }
    }

    /// The token, read back from the header that holds it.
    pub(super) fn token(&self) -> Option<&str> {
        std::str::from_utf8(self.auth.as_bytes())
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .filter(|t| !t.is_empty())
    }
}

fn request_error(url: &str, e: reqwest::Error) -> HubLinkError {
    if e.is_timeout() {
        let after = if e.is_connect() {
            CONNECT_TIMEOUT
        } else {
            REQUEST_TIMEOUT
        };
        return HubLinkError::Timeout {
            url: url.to_owned(),
            after,
        };
    }
    HubLinkError::Request {
        url: url.to_owned(),
        // The message names the URL once already.
        source: e.without_url(),
    }
}

/// Checks that the hub settings can be used (the token file holds a token, the CA file
/// a certificate) without contacting the hub: `agent check-config`.
pub fn check(settings: &HubSettings) -> Result<(), HubLinkError> {
    match &settings.enrol_token_file {
        // Not enrolled yet: the enrolment token stands in for the agent's own.
        Some(enrol) if !settings.token_file.exists() => Connection::load(&HubSettings {
            token_file: enrol.clone(),
            ..settings.clone()
        })
        .map(drop),
        _ => Connection::load(settings).map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::desired;
    use std::path::Path;

    fn settings(dir: &Path, token: &str) -> HubSettings {
        let path = dir.join("token");
        std::fs::write(&path, token).expect("token");
        HubSettings {
            urls: vec!["https://hub.example".into()],
            agent_id: "a1".into(),
            enrol_token_file: None,
            token_file: path,
            ca_file: None,
        }
    }

    #[test]
    fn the_token_is_read_trimmed_and_kept_only_as_a_sensitive_header() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = Connection::load(&settings(dir.path(), "s3cret-token\n")).expect("load");
        assert_eq!(conn.auth.to_str().expect("ascii"), "Bearer s3cret-token");
        assert!(conn.auth.is_sensitive());
        assert!(!format!("{:?}", conn.auth).contains("s3cret"));
        assert_eq!(
            conn.url(WAIT),
            "https://hub.example/v1/agents/a1/reconcile?wait=30"
        );
        // A hub that echoes the token gets it redacted.
        let text = conn.error_text(br#"{"error": "bad token s3cret-token\nsecond line"}"#);
        assert_eq!(text, ": bad token <redacted> second line");
        assert_eq!(conn.error_text(b""), "");

        let err = Connection::load(&settings(dir.path(), " \n"))
            .err()
            .expect("empty");
        assert!(matches!(err, HubLinkError::TokenEmpty { .. }), "{err}");
        let err = Connection::load(&settings(dir.path(), "tok1\ntok2"))
            .err()
            .expect("two lines");
        assert!(matches!(err, HubLinkError::TokenInvalid { .. }), "{err}");
        assert!(!err.to_string().contains("tok1"), "{err}");
    }

    #[test]
    fn the_token_is_redacted_before_a_hubs_text_is_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = format!("rga_{}", "ab".repeat(32));
        let conn = Connection::load(&settings(dir.path(), &token)).expect("load");
        // The token straddles the cut at MAX_ERROR_TEXT, 12 characters in.
        let pad = "x".repeat(MAX_ERROR_TEXT - 12 - "Bearer ".len());
        let body = serde_json::json!({"error": format!("{pad}Bearer {token} is unknown")});
        let text = conn.error_text(body.to_string().as_bytes());
        assert!(!text.contains("rga_"), "{text}");
        assert!(text.ends_with("xBearer <redacted> i"), "{text}");
        assert_eq!(text.chars().count(), ": ".len() + MAX_ERROR_TEXT);

        // A hub that cut its own echo: the tail that begins the token goes too.
        let body = serde_json::json!({"error": format!("no such token {}", &token[..20])});
        let text = conn.error_text(body.to_string().as_bytes());
        assert_eq!(text, ": no such token <redacted>");
        // A text that only happens to end like the token's first letters is kept.
        assert_eq!(conn.error_text(b"try rg"), ": try rg");
    }

    #[test]
    fn an_answer_echoing_the_token_is_refused_without_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = "tok-0123456789";
        let conn = Connection::load(&settings(dir.path(), token)).expect("load");
        let url = conn.url(WAIT);
        let answer = |body: String| {
            let e = conn
                .desired(url.clone(), body.as_bytes())
                .expect_err("refused");
            let text = crate::error_chain(&e);
            assert!(!text.contains(token), "{text}");
            text
        };
        let text = answer(format!(r#"{{"generation": "Bearer {token}"}}"#));
        assert!(text.contains("not a desired state: invalid type"), "{text}");
        // Long quotes are cut.
        let long = "y".repeat(1 << 16);
        assert!(answer(format!(r#"{{"generation": "{long}"}}"#)).len() < 1000);
        // A version of the allowed characters that is the token.
        let text = answer(format!(
            r#"{{"generation": 3, "agent": {{"version": "{token}"}}}}"#
        ));
        assert!(
            text.contains("the agent version it asks for is not a version"),
            "{text}"
        );
        let text = answer(r#"{"generation": 18446744073709551615}"#.to_owned());
        assert!(
            text.contains("generation 18446744073709551615 is beyond"),
            "{text}"
        );

        let ok = conn
            .desired(
                url,
                br#"{"generation": 9007199254740992, "agent": {"version": "1.2.0"}}"#,
            )
            .expect("at the bound");
        assert_eq!(ok.generation, desired::MAX_GENERATION);
    }
}
