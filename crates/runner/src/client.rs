//! A client of the runner API over its Unix socket, used by `railgrid job` (and, later, by
//! the agent).

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use thiserror::Error;
use tokio::io::AsyncWriteExt;

use super::job::Stream;
use crate::proto::admission::{Admission, AdmissionChange};
use crate::proto::drain::{Drain, DrainView};
use crate::proto::health::Health;
use crate::proto::job::{JobRecord, JobSpec, Submitted};

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("could not connect to the runner at {path} (is the agent running? see `railgrid agent status`)")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("may not connect to the runner at {path}: the socket belongs to the runner's account ({owner}); run this as {owner} or as root")]
    ConnectDenied { path: PathBuf, owner: String },
    #[error("request to the runner at {path} failed")]
    Http {
        path: PathBuf,
        #[source]
        source: hyper::Error,
    },
    #[error("{message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    #[error("malformed response from the runner at {path}")]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("could not write job output")]
    Output(#[source] std::io::Error),
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Tries after a 503 for the runner's connection limit, and the first pause between them
/// (doubling: 0.1 + 0.2 + 0.4 + 0.8 s).
const BUSY_RETRIES: u32 = 4;
const BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// True for the errors of a request written to a connection its peer had already closed:
/// the runner cannot have read it, so sending it again cannot run anything twice.
fn never_reached_the_runner(e: &hyper::Error) -> bool {
    use std::error::Error;
    e.is_canceled()
        || e.source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                )
            })
}

fn read_token(socket: &Path) -> Result<String, String> {
    super::token::read_beside(socket).map_err(|e| {
        format!(
            "could not read the runner's API token {}: {e} (run as the runner's account or root)",
            socket.with_file_name(super::token::TOKEN_FILE).display()
        )
    })
}

pub struct Client {
    socket: PathBuf,
    /// One kept-alive connection, reused by requests whose response is read at once.
    idle: std::sync::Mutex<Option<Sender>>,
    /// The API token beside the socket, or why it could not be read (reported if the
    /// runner then refuses a request). Read again when the runner refuses it: a restarted
    /// runner has a new one.
    token: std::sync::Mutex<Result<String, String>>,
}

impl Client {
    pub fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_owned(),
            idle: std::sync::Mutex::new(None),
            token: std::sync::Mutex::new(read_token(socket)),
        }
    }

    /// Reads the token again; true when there is one, so a refused request is worth one
    /// more try (another task may have re-read it already, so "unchanged" proves nothing).
    fn reload_token(&self) -> bool {
        let fresh = read_token(&self.socket);
        let usable = fresh.is_ok();
        *crate::util::lock(&self.token) = fresh;
        usable
    }

    fn http(&self, source: hyper::Error) -> ClientError {
        ClientError::Http {
            path: self.socket.clone(),
            source,
        }
    }

    /// The idle connection if it is still usable (and `true`), else a new one.
    async fn sender(&self) -> Result<(Sender, bool), ClientError> {
        let idle = crate::util::lock(&self.idle).take();
        if let Some(mut sender) = idle {
            if sender.ready().await.is_ok() {
                return Ok((sender, true));
            }
        }
        Ok((self.connect().await?, false))
    }

    /// A refused connection names whose socket it is: the runner is running, this
    /// client's account is the problem.
    fn connect_error(&self, source: std::io::Error) -> ClientError {
        if source.kind() == std::io::ErrorKind::PermissionDenied {
            use std::os::unix::fs::MetadataExt;
            // The socket itself, or a directory on the way to it, is another account's.
            let owner = std::fs::metadata(&self.socket)
                .map(|m| m.uid())
                .or_else(|_| {
                    self.socket
                        .parent()
                        .map_or(Err(source.kind().into()), std::fs::metadata)
                        .map(|m| m.uid())
                });
            if let Ok(uid) = owner {
                let owner = uzers::get_user_by_uid(uid).map_or_else(
                    || format!("uid {uid}"),
                    |u| u.name().to_string_lossy().into_owned(),
                );
                return ClientError::ConnectDenied {
                    path: self.socket.clone(),
                    owner,
                };
            }
        }
        ClientError::Connect {
            path: self.socket.clone(),
            source,
        }
    }

    async fn connect(&self) -> Result<Sender, ClientError> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| self.connect_error(source))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.http(e))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    fn keep(&self, sender: Sender) {
        *crate::util::lock(&self.idle) = Some(sender);
    }

    fn request(
        &self,
        method: &Method,
        uri: &str,
        body: &Option<Bytes>,
    ) -> Result<Request<Full<Bytes>>, ClientError> {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(hyper::header::HOST, "localhost");
        if let Ok(token) = &*crate::util::lock(&self.token) {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        req.body(Full::new(body.clone().unwrap_or_default()))
            .map_err(|e| ClientError::Api {
                status: 0,
                code: "client".into(),
                message: format!("could not build request {uri}: {e}"),
            })
    }

    /// Sends one request. Sent again, on a new connection, when the runner cannot have
    /// acted on it: a kept-alive connection it had closed meanwhile (it restarted, or its
    /// header timeout passed) failed before it read the request; it refused the token (a
    /// restarted runner has a new one, read again first); or it was at its connection
    /// limit (503 with Retry-After: a few tries, with growing pauses).
    async fn send(
        &self,
        method: Method,
        uri: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(Response<Incoming>, Sender), ClientError> {
        let body = body.map(Bytes::from);
        let (mut sender, mut reused) = self.sender().await?;
        let mut token_retried = false;
        let mut busy_retries = 0;
        loop {
            match sender
                .send_request(self.request(&method, uri, &body)?)
                .await
            {
                Ok(resp)
                    if resp.status() == StatusCode::UNAUTHORIZED
                        && !token_retried
                        && self.reload_token() =>
                {
                    token_retried = true;
                }
                Ok(resp)
                    if resp.status() == StatusCode::SERVICE_UNAVAILABLE
                        && resp.headers().contains_key(hyper::header::RETRY_AFTER)
                        && busy_retries < BUSY_RETRIES =>
                {
                    tokio::time::sleep(BUSY_PAUSE * (1 << busy_retries)).await;
                    busy_retries += 1;
                }
                Ok(resp) => return Ok((resp, sender)),
                Err(e) if reused && never_reached_the_runner(&e) => {}
                // A new connection closed before the runner read the request: it was over
                // its connection limit and could not answer in time.
                Err(e) if never_reached_the_runner(&e) && busy_retries < BUSY_RETRIES => {
                    tokio::time::sleep(BUSY_PAUSE * (1 << busy_retries)).await;
                    busy_retries += 1;
                }
                Err(e) => return Err(self.http(e)),
            }
            // Bounded: the token is retried once, a stale connection once (a new one is
            // never "reused"), the connection limit BUSY_RETRIES times.
            sender = self.connect().await?;
            reused = false;
        }
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        uri: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, T), ClientError> {
        let (status, bytes) = self.whole(method, uri, body).await?;
        let value = serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode {
            path: self.socket.clone(),
            source,
        })?;
        Ok((status, value))
    }

    /// A request whose successful answer is read whole (the connection is then free for
    /// the next request); an error status is the runner's error.
    async fn whole(
        &self,
        method: Method,
        uri: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, hyper::body::Bytes), ClientError> {
        let (resp, sender) = self.send(method, uri, body).await?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| self.http(e))?
            .to_bytes();
        self.keep(sender);
        if !status.is_success() {
            return Err(self.api_error(status, &bytes));
        }
        Ok((status, bytes))
    }

    /// A request body.
    fn encode(&self, value: &impl serde::Serialize) -> Result<Vec<u8>, ClientError> {
        serde_json::to_vec(value).map_err(|source| ClientError::Decode {
            path: self.socket.clone(),
            source,
        })
    }

    /// The runner's metrics, in Prometheus' text format.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let (_, bytes) = self.whole(Method::GET, "/v1/metrics", None).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    pub async fn health(&self) -> Result<Health, ClientError> {
        Ok(self.json(Method::GET, "/v1/health", None).await?.1)
    }

    /// The admission limits in force.
    pub async fn admission(&self) -> Result<Admission, ClientError> {
        Ok(self.json(Method::GET, "/v1/admission", None).await?.1)
    }

    /// Changes the admission limits without restarting the runner; returns those now in
    /// force. Idempotent: sending the same change again changes nothing.
    pub async fn set_admission(&self, change: &AdmissionChange) -> Result<Admission, ClientError> {
        let body = self.encode(change)?;
        Ok(self.json(Method::PUT, "/v1/admission", Some(body)).await?.1)
    }

    /// The drain in force and the jobs it waits for.
    pub async fn drain(&self) -> Result<DrainView, ClientError> {
        Ok(self.json(Method::GET, "/v1/drain", None).await?.1)
    }

    /// Puts `drain` in force, or ends the one in force (`None`). Idempotent.
    pub async fn set_drain(&self, drain: Option<&Drain>) -> Result<DrainView, ClientError> {
        Ok(match drain {
            Some(d) => {
                let body = self.encode(d)?;
                self.json(Method::PUT, "/v1/drain", Some(body)).await?.1
            }
            None => self.json(Method::DELETE, "/v1/drain", None).await?.1,
        })
    }

    /// Returns whether the job was created (false: an identical job already existed).
    pub async fn submit(&self, spec: &JobSpec) -> Result<(bool, Submitted), ClientError> {
        self.submit_with(spec, &Default::default()).await
    }

    /// [`Self::submit`] with the values of the secrets `spec` names, which travel beside
    /// it over the socket and are never stored.
    pub async fn submit_with(
        &self,
        spec: &JobSpec,
        secret_values: &std::collections::BTreeMap<String, String>,
    ) -> Result<(bool, Submitted), ClientError> {
        #[derive(serde::Serialize)]
        struct Body<'a> {
            #[serde(flatten)]
            spec: &'a JobSpec,
            #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
            secret_values: &'a std::collections::BTreeMap<String, String>,
        }
        let body = self.encode(&Body {
            spec,
            secret_values,
        })?;
        let (status, sub) = self.json(Method::POST, "/v1/jobs", Some(body)).await?;
        Ok((status == StatusCode::CREATED, sub))
    }

    pub async fn get(&self, id: &str) -> Result<JobRecord, ClientError> {
        Ok(self
            .json(Method::GET, &format!("/v1/jobs/{id}"), None)
            .await?
            .1)
    }

    pub async fn list(&self, query: &str) -> Result<Vec<JobRecord>, ClientError> {
        Ok(self
            .json(Method::GET, &format!("/v1/jobs{query}"), None)
            .await?
            .1)
    }

    /// Deletes the oldest finished jobs until `keep` are left.
    pub async fn prune(&self, keep: usize) -> Result<crate::proto::job::Pruned, ClientError> {
        Ok(self
            .json(Method::POST, &format!("/v1/prune?keep={keep}"), None)
            .await?
            .1)
    }

    pub async fn cancel(&self, id: &str) -> Result<JobRecord, ClientError> {
        Ok(self
            .json(Method::POST, &format!("/v1/jobs/{id}/cancel"), None)
            .await?
            .1)
    }

    /// Waits until the job's end is recorded, however long it takes, in bounded long
    /// polls. An end the runner holds in memory (its disk is full) is waited for too: it
    /// is not yet durable.
    pub async fn wait(&self, id: &str) -> Result<JobRecord, ClientError> {
        let mut noted = false;
        loop {
            let rec: JobRecord = self
                .json(
                    Method::GET,
                    &format!("/v1/jobs/{id}/wait?timeout_secs=300"),
                    None,
                )
                .await?
                .1;
            if rec.state.is_terminal() && !rec.commit_pending {
                return Ok(rec);
            }
            if rec.state.is_terminal() && !noted {
                noted = true;
                tracing::warn!(job = %id, state = rec.state.as_str(), "the job has ended, but the runner could not record it yet (is its disk full?): waiting until it does");
            }
        }
    }

    /// Waits up to `timeout_secs` for the job to leave the queue (`started`) or to end
    /// (`ended`); the record either way.
    pub async fn wait_for(
        &self,
        id: &str,
        until: &str,
        timeout_secs: u64,
    ) -> Result<JobRecord, ClientError> {
        let uri = format!("/v1/jobs/{id}/wait?until={until}&timeout_secs={timeout_secs}");
        Ok(self.json(Method::GET, &uri, None).await?.1)
    }

    /// A stream of the job from `offset`, followed: the body runs until the job has ended
    /// and everything it spooled has been sent.
    pub async fn follow(
        &self,
        id: &str,
        stream: Stream,
        offset: u64,
    ) -> Result<Incoming, ClientError> {
        let uri = format!(
            "/v1/jobs/{id}/output/{}?follow=true&offset={offset}",
            stream.name()
        );
        // Held until the job ends: not kept for reuse.
        let (resp, _sender) = self.send(Method::GET, &uri, None).await?;
        Ok(self.ok_or_api_error(resp).await?.into_body())
    }

    /// Copies a stream of the job to `out` from `offset`, following it until the job ends
    /// when `follow` is set.
    pub async fn output(
        &self,
        id: &str,
        stream: Stream,
        follow: bool,
        out: &mut (impl tokio::io::AsyncWrite + Unpin),
    ) -> Result<(), ClientError> {
        if follow {
            let uri = format!("/v1/jobs/{id}/output/{}?follow=true", stream.name());
            // A followed stream holds its connection until the job ends: not kept for reuse.
            let (resp, _sender) = self.send(Method::GET, &uri, None).await?;
            let resp = self.ok_or_api_error(resp).await?;
            return self.copy_body(resp.into_body(), out).await;
        }
        // Slices of at most 8 MiB each, until the runner says there is no more.
        let mut offset = 0u64;
        loop {
            let uri = format!("/v1/jobs/{id}/output/{}?offset={offset}", stream.name());
            let (resp, sender) = self.send(Method::GET, &uri, None).await?;
            let resp = self.ok_or_api_error(resp).await?;
            let header = |name: &str| {
                resp.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let next = header("x-next-offset").and_then(|v| v.parse::<u64>().ok());
            let complete = header("x-complete").as_deref() == Some("true");
            let copied = self.copy_body(resp.into_body(), out).await;
            self.keep(sender);
            copied?;
            match next {
                Some(n) if n > offset && !complete => offset = n,
                _ => return Ok(()),
            }
        }
    }

    async fn ok_or_api_error(
        &self,
        resp: Response<Incoming>,
    ) -> Result<Response<Incoming>, ClientError> {
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Err(self.api_error(status, &bytes))
    }

    /// The runner's error envelope as an error; a refusal for want of a token says why
    /// this client had none.
    fn api_error(&self, status: StatusCode, bytes: &[u8]) -> ClientError {
        #[derive(serde::Deserialize)]
        struct Wrapper {
            error: Inner,
        }
        #[derive(serde::Deserialize)]
        struct Inner {
            code: String,
            message: String,
        }
        let (code, message) = match serde_json::from_slice::<Wrapper>(bytes) {
            Ok(w) => (w.error.code, w.error.message),
            Err(_) => (
                "http".into(),
                format!(
                    "runner answered {status}: {}",
                    String::from_utf8_lossy(bytes)
                ),
            ),
        };
        let message = match (&*crate::util::lock(&self.token), status) {
            (Err(why), StatusCode::UNAUTHORIZED) => why.clone(),
            _ => message,
        };
        ClientError::Api {
            status: status.as_u16(),
            code,
            message,
        }
    }

    async fn copy_body(
        &self,
        mut body: Incoming,
        out: &mut (impl tokio::io::AsyncWrite + Unpin),
    ) -> Result<(), ClientError> {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| self.http(e))?;
            if let Some(data) = frame.data_ref() {
                out.write_all(data).await.map_err(ClientError::Output)?;
                out.flush().await.map_err(ClientError::Output)?;
            }
        }
        Ok(())
    }
}
