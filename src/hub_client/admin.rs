//! The client of the hub's admin API, behind `railgrid hub agent|desired …`: on the hub's
//! own host from its data dir (`admin.token`, `ca.pem`, `hub.json`), or from anywhere with
//! `--hub URL --token-file F [--ca-file PEM]`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use thiserror::Error;

use super::{self as hub_client, HubClientError};
use crate::proto::fleet_job::{HubGroupSubmit, HubGroupView, HubJobSubmit, HubJobView};
use crate::proto::hub::{
    AgentView, DesiredChange, DesiredView, DrainRequest, EnrolRequest, Enrolled, ErrorBody,
    LabelChange,
};
use crate::proto::hub_dir::{HubFile, ADMIN_TOKEN_FILE, HUB_FILE};

/// An admin answer larger than this is refused (a list of 10 000 agents fits).
const MAX_ANSWER: usize = 64 * 1024 * 1024;
const TIMEOUT: Duration = Duration::from_secs(30);
/// A release upload: tens of MiB, the hub hashing and checking it.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Error)]
pub(crate) enum AdminError {
    #[error("could not read {path}{hint}")]
    Read {
        path: PathBuf,
        hint: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} does not say where the hub serves")]
    HubFile {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the token file {path} is readable by others (mode {mode:04o}): chmod 600 {path}")]
    OpenToken { path: PathBuf, mode: u32 },
    #[error("say which hub: --data-dir DIR on the hub's host, or --hub URL --token-file FILE")]
    NoTarget,
    #[error("give --data-dir (on the hub's host) or --hub URL (from anywhere), not both")]
    BothTargets,
    #[error("hub URL {url:?} is not an https:// URL (such as https://hub.example:7443)")]
    BadUrl { url: String },
    #[error("--hub needs --token-file (the admin token)")]
    NoToken,
    #[error("the token in {path} cannot be sent in a header")]
    BadToken { path: PathBuf },
    #[error(transparent)]
    Client(#[from] HubClientError),
    #[error("could not reach the hub at {url}{hint}")]
    Request {
        url: String,
        hint: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: {status}: {message}")]
    Status {
        url: String,
        status: reqwest::StatusCode,
        message: String,
    },
    #[error("could not write the job's output")]
    Output(#[source] std::io::Error),
    #[error("{url}: the answer is not what the hub sends")]
    Parse {
        url: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Which hub the admin commands talk to.
#[derive(Debug, Clone, Default)]
pub(crate) struct Target {
    pub(crate) data_dir: Option<PathBuf>,
    pub(crate) url: Option<String>,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) ca_file: Option<PathBuf>,
}

pub(crate) struct AdminClient {
    http: reqwest::Client,
    base: String,
    auth: reqwest::header::HeaderValue,
    /// Said when the hub cannot be reached: which hub the data dir named.
    hint: String,
}

impl AdminError {
    /// True for errors the operator fixes in the command line (exit code 2): a bad
    /// target, or a request the hub refused as malformed (400: a bad id or setting).
    pub(crate) fn is_usage(&self) -> bool {
        match self {
            AdminError::Status { status, .. } => *status == reqwest::StatusCode::BAD_REQUEST,
            AdminError::NoTarget
            | AdminError::BothTargets
            | AdminError::BadUrl { .. }
            | AdminError::NoToken
            | AdminError::OpenToken { .. }
            | AdminError::Read { .. }
            | AdminError::HubFile { .. }
            | AdminError::Client(
                HubClientError::ReadCa { .. }
                | HubClientError::BadCa { .. }
                | HubClientError::NoCertificate { .. },
            ) => true,
            _ => false,
        }
    }
}

fn read(path: &Path, hint: &'static str) -> Result<String, AdminError> {
    crate::small_file::read_string(path, crate::small_file::CONFIG_MAX).map_err(|source| {
        AdminError::Read {
            path: path.to_owned(),
            hint,
            source,
        }
    })
}

impl AdminClient {
    pub(crate) fn new(target: &Target) -> Result<Self, AdminError> {
        let (url, token_file, ca_file, hint) = match (&target.url, &target.data_dir) {
            (Some(_), Some(_)) => return Err(AdminError::BothTargets),
            (Some(url), None) => (
                url.clone(),
                target.token_file.clone().ok_or(AdminError::NoToken)?,
                target.ca_file.clone(),
                String::new(),
            ),
            (None, Some(dir)) => {
                let path = dir.join(HUB_FILE);
                let text = read(
                    &path,
                    " (has `railgrid hub serve` run with this --data-dir?)",
                )?;
                let info: HubFile = serde_json::from_str(&text)
                    .map_err(|source| AdminError::HubFile { path, source })?;
                let hint = format!(
                    " (named by {}: is that hub, pid {}, still running?)",
                    dir.join(HUB_FILE).display(),
                    info.pid
                );
                (
                    info.url,
                    target
                        .token_file
                        .clone()
                        .unwrap_or_else(|| dir.join(ADMIN_TOKEN_FILE)),
                    target.ca_file.clone().or(info.ca_file),
                    hint,
                )
            }
            (None, None) => return Err(AdminError::NoTarget),
        };
        let parsed = reqwest::Url::parse(&url).ok();
        if parsed.is_none_or(|u| u.scheme() != "https" || u.host_str().is_none()) {
            return Err(AdminError::BadUrl { url });
        }
        let read_err = |source| AdminError::Read {
            path: token_file.clone(),
            hint: "",
            source,
        };
        let file = crate::small_file::SmallFile::open(&token_file).map_err(read_err)?;
        if let Err(crate::small_file::Exposed::Mode(mode)) = crate::small_file::private(file.meta())
        {
            return Err(AdminError::OpenToken {
                path: token_file,
                mode,
            });
        }
        let token = file
            .read_string(crate::small_file::TOKEN_MAX)
            .map_err(read_err)?;
        let auth = hub_client::bearer(token.trim()).map_err(|_| AdminError::BadToken {
            path: token_file.clone(),
        })?;
        let http = hub_client::build(ca_file.as_deref(), TIMEOUT)?;
        Ok(Self {
            http,
            base: url.trim_end_matches('/').to_owned(),
            auth,
            hint,
        })
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, AdminError> {
        let resp = self.send(method, path, body, Some(TIMEOUT)).await?;
        let url = resp.url().to_string();
        let bytes = hub_client::read_capped(resp, MAX_ANSWER).await?;
        serde_json::from_slice(&bytes).map_err(|source| AdminError::Parse { url, source })
    }

    /// Sends a request; a successful answer, or the hub's error as an error. `timeout`
    /// bounds the whole exchange (`None`: a followed stream, as long as it runs).
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, AdminError> {
        let url = format!("{}{path}", self.base);
        let mut req = self
            .http
            .request(method, &url)
            .header(reqwest::header::AUTHORIZATION, self.auth.clone());
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        if let Some(b) = body {
            let json = serde_json::to_vec(b).map_err(|source| AdminError::Parse {
                url: url.clone(),
                source,
            })?;
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(json);
        }
        self.exchange(req, url).await
    }

    /// Sends a built request; a successful answer, or the hub's error as an error.
    async fn exchange(
        &self,
        req: reqwest::RequestBuilder,
        url: String,
    ) -> Result<reqwest::Response, AdminError> {
        let resp = req.send().await.map_err(|source| AdminError::Request {
            url: url.clone(),
            hint: if source.is_connect() {
                self.hint.clone()
            } else {
                String::new()
            },
            source,
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let bytes = hub_client::read_capped(resp, MAX_ANSWER).await?;
        let message = serde_json::from_slice::<ErrorBody>(&bytes)
            .map(|b| b.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).chars().take(500).collect());
        Err(AdminError::Status {
            url,
            status,
            message,
        })
    }

    pub(crate) async fn enrol(
        &self,
        id: &str,
        reuse_revoked: bool,
    ) -> Result<Enrolled, AdminError> {
        let body = EnrolRequest {
            id: id.to_owned(),
            reuse_revoked,
        };
        self.call(Method::POST, "/v1/admin/agents", Some(&body))
            .await
    }

    pub(crate) async fn list(&self) -> Result<Vec<AgentView>, AdminError> {
        self.call(Method::GET, "/v1/admin/agents", None::<&()>)
            .await
    }

    pub(crate) async fn show(&self, id: &str) -> Result<AgentView, AdminError> {
        self.call(
            Method::GET,
            &format!("/v1/admin/agents/{}", crate::util::percent_encode(id)),
            None::<&()>,
        )
        .await
    }

    pub(crate) async fn revoke(&self, id: &str) -> Result<AgentView, AdminError> {
        let path = format!(
            "/v1/admin/agents/{}/revoke",
            crate::util::percent_encode(id)
        );
        self.call(Method::POST, &path, None::<&()>).await
    }

    pub(crate) async fn labels(
        &self,
        id: &str,
        change: &LabelChange,
    ) -> Result<AgentView, AdminError> {
        let path = format!(
            "/v1/admin/agents/{}/labels",
            crate::util::percent_encode(id)
        );
        self.call(Method::POST, &path, Some(change)).await
    }

    /// `POST /v1/admin/drain`: the agents drained, each as it is now.
    pub(crate) async fn drain(&self, req: &DrainRequest) -> Result<Vec<AgentView>, AdminError> {
        self.call(Method::POST, "/v1/admin/drain", Some(req)).await
    }

    pub(crate) async fn resume(&self, req: &DrainRequest) -> Result<Vec<AgentView>, AdminError> {
        self.call(Method::POST, "/v1/admin/resume", Some(req)).await
    }

    pub(crate) async fn desired(&self, agent: Option<&str>) -> Result<DesiredView, AdminError> {
        self.call(Method::GET, &desired_path(agent), None::<&()>)
            .await
    }

    pub(crate) async fn set_desired(
        &self,
        agent: Option<&str>,
        change: &DesiredChange,
    ) -> Result<DesiredView, AdminError> {
        self.call(Method::PUT, &desired_path(agent), Some(change))
            .await
    }
}

impl AdminClient {
    /// Uploads a release binary and its signature (`.minisig` text).
    pub(crate) async fn publish_release(
        &self,
        version: &str,
        platform: &str,
        binary: Vec<u8>,
        signature: &str,
    ) -> Result<crate::proto::hub::ReleaseArtifact, AdminError> {
        let url = format!(
            "{}/v1/admin/releases/{}/{}",
            self.base,
            crate::util::percent_encode(version),
            crate::util::percent_encode(platform)
        );
        let hex: String = signature.bytes().map(|b| format!("{b:02x}")).collect();
        let req = self
            .http
            .put(&url)
            .header(reqwest::header::AUTHORIZATION, self.auth.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .header(crate::proto::hub_dir::SIGNATURE_HEADER, hex)
            .timeout(PUBLISH_TIMEOUT)
            .body(binary);
        let resp = self.exchange(req, url.clone()).await?;
        let bytes = hub_client::read_capped(resp, MAX_ANSWER).await?;
        serde_json::from_slice(&bytes).map_err(|source| AdminError::Parse { url, source })
    }

    pub(crate) async fn releases(&self) -> Result<Vec<crate::proto::hub::ReleaseView>, AdminError> {
        self.call(Method::GET, "/v1/admin/releases", None::<&()>)
            .await
    }

    pub(crate) async fn resume_release(
        &self,
        version: &str,
    ) -> Result<Vec<crate::proto::hub::ReleaseView>, AdminError> {
        let path = format!(
            "/v1/admin/releases/{}/resume",
            crate::util::percent_encode(version)
        );
        self.call(Method::POST, &path, None::<&()>).await
    }
}

/// A slice of a job's stream as the hub holds it.
pub(crate) struct Output {
    pub(crate) bytes: bytes::Bytes,
    pub(crate) next: u64,
    /// The job is done and there is nothing past `next`.
    pub(crate) complete: bool,
}

impl AdminClient {
    pub(crate) async fn submit_job(&self, req: &HubJobSubmit) -> Result<HubJobView, AdminError> {
        self.call(Method::POST, "/v1/admin/jobs", Some(req)).await
    }

    pub(crate) async fn submit_group(
        &self,
        req: &HubGroupSubmit,
    ) -> Result<HubGroupView, AdminError> {
        self.call(Method::POST, "/v1/admin/groups", Some(req)).await
    }

    /// Jobs newest first, of one agent, selector or group (each `(name, value)` given).
    pub(crate) async fn jobs(
        &self,
        filter: &[(&str, Option<&str>)],
        limit: u64,
    ) -> Result<Vec<HubJobView>, AdminError> {
        let mut path = format!("/v1/admin/jobs?limit={limit}");
        for (name, value) in filter {
            if let Some(v) = value {
                path.push_str(&format!("&{name}={}", crate::util::percent_encode(v)));
            }
        }
        self.call(Method::GET, &path, None::<&()>).await
    }

    pub(crate) async fn job(&self, id: &str) -> Result<HubJobView, AdminError> {
        self.call(Method::GET, &job_path(id, ""), None::<&()>).await
    }

    pub(crate) async fn cancel_job(&self, id: &str) -> Result<HubJobView, AdminError> {
        self.call(Method::POST, &job_path(id, "/cancel"), None::<&()>)
            .await
    }

    /// The job once it is done, however long that takes, in bounded long polls.
    pub(crate) async fn wait_job(&self, id: &str) -> Result<HubJobView, AdminError> {
        const POLL_SECS: u64 = 20;
        loop {
            let path = job_path(id, &format!("/wait?timeout_secs={POLL_SECS}"));
            let resp = self
                .send(
                    Method::GET,
                    &path,
                    None::<&()>,
                    Some(Duration::from_secs(POLL_SECS) + TIMEOUT),
                )
                .await?;
            let url = resp.url().to_string();
            let bytes = hub_client::read_capped(resp, MAX_ANSWER).await?;
            let v: HubJobView = serde_json::from_slice(&bytes)
                .map_err(|source| AdminError::Parse { url, source })?;
            if v.done {
                return Ok(v);
            }
        }
    }

    /// Up to 1 MiB of a stream from `offset`.
    pub(crate) async fn output(
        &self,
        id: &str,
        stream: &str,
        offset: u64,
    ) -> Result<Output, AdminError> {
        let path = job_path(id, &format!("/output/{stream}?offset={offset}"));
        let resp = self
            .send(Method::GET, &path, None::<&()>, Some(TIMEOUT))
            .await?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let next = header("x-next-offset").and_then(|v| v.parse().ok());
        let complete = header("x-complete").as_deref() == Some("true");
        let url = resp.url().to_string();
        let bytes = resp.bytes().await.map_err(|source| AdminError::Request {
            url,
            hint: String::new(),
            source,
        })?;
        Ok(Output {
            next: next.unwrap_or(offset + bytes.len() as u64),
            bytes,
            complete,
        })
    }

    /// Copies a stream from `offset` to `out` as it reaches the hub, until the hub ends
    /// the stream (the job is done) or the connection breaks; returns the offset reached.
    pub(crate) async fn follow_output(
        &self,
        id: &str,
        stream: &str,
        mut offset: u64,
        out: &mut (impl tokio::io::AsyncWrite + Unpin),
    ) -> Result<u64, AdminError> {
        use tokio::io::AsyncWriteExt;
        let path = job_path(id, &format!("/output/{stream}?follow=true&offset={offset}"));
        let mut resp = self.send(Method::GET, &path, None::<&()>, None).await?;
        let url = resp.url().to_string();
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    out.write_all(&chunk).await.map_err(AdminError::Output)?;
                    let _ = out.flush().await;
                    offset += chunk.len() as u64;
                }
                Ok(None) => return Ok(offset),
                Err(source) => {
                    tracing::debug!(%url, error = %source, "the followed output broke off");
                    return Ok(offset);
                }
            }
        }
    }
}

fn job_path(id: &str, rest: &str) -> String {
    format!("/v1/admin/jobs/{}{rest}", crate::util::percent_encode(id))
}

fn desired_path(agent: Option<&str>) -> String {
    match agent {
        None => "/v1/admin/desired/fleet".into(),
        Some(id) => format!(
            "/v1/admin/desired/agents/{}",
            crate::util::percent_encode(id)
        ),
    }
}

impl AdminClient {
    pub(crate) async fn start_rollout(
        &self,
        req: &crate::proto::rollout::RolloutRequest,
    ) -> Result<crate::proto::rollout::RolloutView, AdminError> {
        self.call(Method::POST, "/v1/admin/rollouts", Some(req))
            .await
    }

    pub(crate) async fn rollouts(
        &self,
    ) -> Result<Vec<crate::proto::rollout::RolloutView>, AdminError> {
        self.call(Method::GET, "/v1/admin/rollouts", None::<&()>)
            .await
    }

    pub(crate) async fn rollout(
        &self,
        id: &str,
    ) -> Result<crate::proto::rollout::RolloutView, AdminError> {
        self.call(Method::GET, &rollout_path(id, ""), None::<&()>)
            .await
    }

    /// `pause`, `resume` or `abort` (with its body).
    pub(crate) async fn steer_rollout(
        &self,
        id: &str,
        verb: &str,
        abort: Option<&crate::proto::rollout::AbortRequest>,
    ) -> Result<crate::proto::rollout::RolloutView, AdminError> {
        self.call(Method::POST, &rollout_path(id, &format!("/{verb}")), abort)
            .await
    }
}

fn rollout_path(id: &str, rest: &str) -> String {
    format!(
        "/v1/admin/rollouts/{}{rest}",
        crate::util::percent_encode(id)
    )
}

impl AdminClient {
    pub(crate) async fn create_token(
        &self,
        req: &crate::proto::access::TokenRequest,
    ) -> Result<crate::proto::access::TokenMade<crate::proto::access::TokenView>, AdminError> {
        self.call(Method::POST, "/v1/admin/tokens", Some(req)).await
    }

    pub(crate) async fn tokens(&self) -> Result<Vec<crate::proto::access::TokenView>, AdminError> {
        self.call(Method::GET, "/v1/admin/tokens", None::<&()>)
            .await
    }

    pub(crate) async fn revoke_token(
        &self,
        name: &str,
    ) -> Result<crate::proto::access::TokenView, AdminError> {
        let path = format!(
            "/v1/admin/tokens/{}/revoke",
            crate::util::percent_encode(name)
        );
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// The new root token.
    pub(crate) async fn rotate_root(&self) -> Result<String, AdminError> {
        #[derive(serde::Deserialize)]
        struct Root {
            token: String,
        }
        let r: Root = self
            .call(Method::POST, "/v1/admin/tokens/rotate-root", None::<&()>)
            .await?;
        Ok(r.token)
    }

    pub(crate) async fn create_enrol_token(
        &self,
        req: &crate::proto::access::EnrolTokenRequest,
    ) -> Result<crate::proto::access::TokenMade<crate::proto::access::EnrolTokenView>, AdminError>
    {
        self.call(Method::POST, "/v1/admin/enrol-tokens", Some(req))
            .await
    }

    pub(crate) async fn enrol_tokens(
        &self,
    ) -> Result<Vec<crate::proto::access::EnrolTokenView>, AdminError> {
        self.call(Method::GET, "/v1/admin/enrol-tokens", None::<&()>)
            .await
    }

    pub(crate) async fn revoke_enrol_token(
        &self,
        id: &str,
    ) -> Result<crate::proto::access::EnrolTokenView, AdminError> {
        let path = format!(
            "/v1/admin/enrol-tokens/{}/revoke",
            crate::util::percent_encode(id)
        );
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// The agents asked for a new token.
    pub(crate) async fn rotate_agents(&self, id: Option<&str>) -> Result<Vec<String>, AdminError> {
        #[derive(serde::Deserialize)]
        struct Rotating {
            agents: Vec<String>,
        }
        let body = match id {
            Some(id) => serde_json::json!({ "agents": [id] }),
            None => serde_json::json!({ "all": true }),
        };
        let r: Rotating = self
            .call(Method::POST, "/v1/admin/agents/rotate", Some(&body))
            .await?;
        Ok(r.agents)
    }

    pub(crate) async fn audit(
        &self,
        since_secs: Option<u64>,
        token: Option<&str>,
    ) -> Result<Vec<crate::proto::access::AuditEntry>, AdminError> {
        let mut path = String::from("/v1/admin/audit?");
        if let Some(s) = since_secs {
            path.push_str(&format!("since_secs={s}&"));
        }
        if let Some(t) = token {
            path.push_str(&format!("token={}", crate::util::percent_encode(t)));
        }
        self.call(Method::GET, path.trim_end_matches(['&', '?']), None::<&()>)
            .await
    }
}

/// Secrets (`/v1/admin/secrets…`): a value goes to the hub, never comes back.
impl AdminClient {
    pub(crate) async fn set_secret(
        &self,
        name: &str,
        req: &crate::proto::secret::SecretSet,
    ) -> Result<crate::proto::secret::SecretView, AdminError> {
        let path = format!("/v1/admin/secrets/{}", crate::util::percent_encode(name));
        self.call(Method::PUT, &path, Some(req)).await
    }

    pub(crate) async fn secrets(
        &self,
    ) -> Result<Vec<crate::proto::secret::SecretView>, AdminError> {
        self.call(Method::GET, "/v1/admin/secrets", None::<&()>)
            .await
    }

    pub(crate) async fn remove_secret(&self, name: &str) -> Result<serde_json::Value, AdminError> {
        let path = format!("/v1/admin/secrets/{}", crate::util::percent_encode(name));
        self.call(Method::DELETE, &path, None::<&()>).await
    }

    pub(crate) async fn rotate_secrets_key(&self) -> Result<serde_json::Value, AdminError> {
        self.call(Method::POST, "/v1/admin/secrets/rotate-key", None::<&()>)
            .await
    }
}
