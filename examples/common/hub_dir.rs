//! A running hub as the benchmarks reach it, from its data dir: the URL and pid in
//! `hub.json`, the admin token, and an HTTPS client that trusts the hub's CA.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

pub(crate) struct HubDir {
    pub(crate) http: reqwest::Client,
    pub(crate) url: String,
    pub(crate) admin: String,
    /// For the benchmarks that measure the hub's process (not every one does).
    #[allow(dead_code)]
    pub(crate) pid: u32,
}

impl HubDir {
    pub(crate) fn open(dir: &Path) -> anyhow::Result<Self> {
        let info: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("hub.json"))?)?;
        let url = info["url"].as_str().context("url")?.to_owned();
        let pid = info["pid"].as_u64().context("pid")? as u32;
        let admin = std::fs::read_to_string(dir.join("admin.token"))?
            .trim()
            .to_owned();
        let http = reqwest::Client::builder()
            .use_rustls_tls()
            .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(
                dir.join("ca.pem"),
            )?)?)
            .pool_max_idle_per_host(usize::MAX)
            .pool_idle_timeout(Duration::from_secs(5))
            .build()?;
        Ok(Self {
            http,
            url,
            admin,
            pid,
        })
    }

    /// Enrols `PREFIX-0` … `PREFIX-{n-1}`, 32 requests at a time: (id, token), in order.
    #[allow(dead_code)]
    pub(crate) async fn enrol_many(
        self: &std::sync::Arc<Self>,
        prefix: &str,
        n: usize,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let mut set = tokio::task::JoinSet::new();
        for chunk in (0..n).collect::<Vec<_>>().chunks(n.div_ceil(32).max(1)) {
            let (hub, chunk, prefix) = (self.clone(), chunk.to_vec(), prefix.to_owned());
            set.spawn(async move {
                let mut out = Vec::new();
                for i in chunk {
                    let id = format!("{prefix}-{i}");
                    let v = hub
                        .admin(
                            reqwest::Method::POST,
                            "/v1/admin/agents",
                            serde_json::json!({"id": id}),
                        )
                        .await?;
                    let token = v["token"].as_str().context("token")?.to_owned();
                    out.push((i, id, token));
                }
                anyhow::Ok(out)
            });
        }
        let mut all = Vec::with_capacity(n);
        while let Some(r) = set.join_next().await {
            all.extend(r??);
        }
        all.sort();
        Ok(all.into_iter().map(|(_, id, token)| (id, token)).collect())
    }

    /// An admin request with a JSON body: the JSON answer, or the status and text.
    #[allow(dead_code)]
    pub(crate) async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        let resp = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.admin)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(&body)?)
            .send()
            .await?;
        let status = resp.status();
        let text = String::from_utf8_lossy(&resp.bytes().await?).into_owned();
        anyhow::ensure!(status.is_success(), "{path}: {status}: {text}");
        Ok(serde_json::from_str(&text)?)
    }
}
