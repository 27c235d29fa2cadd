//! Egress for jobs whose network is `allow` (docs/security.md, "Egress"): the proxy
//! that is their only way out, the rules' verdicts, and the refusals it counts.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

mod decide;
mod denials;
mod hello;
mod proxy;
mod relay;

pub use self::denials::{Denials, TOTAL as DENIED_TOTAL};
use crate::proto::egress::Rules;

/// Where a job finds the proxy, in its own network namespace.
pub const PORT: u16 = 3128;

/// The proxy variables a job with a proxy gets, in both cases (programs read one or the
/// other), set after its spec's own so that none of them points elsewhere.
pub fn proxy_env(env: &mut BTreeMap<String, String>) {
    let url = format!("http://127.0.0.1:{PORT}");
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.insert(name.to_owned(), url.clone());
        env.insert(name.to_ascii_lowercase(), url.clone());
    }
    // The job's own loopback is its own: nothing to ask the proxy for.
    let local = "localhost,127.0.0.1,::1".to_owned();
    env.insert("NO_PROXY".to_owned(), local.clone());
    env.insert("no_proxy".to_owned(), local);
}

/// A job's running proxy: ends when dropped.
pub struct Egress {
    pub denials: Arc<Denials>,
    task: tokio::task::JoinHandle<()>,
    _stop: tokio::sync::watch::Sender<()>,
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves job `job`'s proxy on `listener` (made in its network namespace) by `rules`.
pub fn start(listener: OwnedFd, job: &str, rules: Rules) -> io::Result<Egress> {
    let listener = std::net::TcpListener::from(listener);
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let denials = Arc::new(Denials::default());
    let (stop_tx, stop) = tokio::sync::watch::channel(());
    let proxy = Arc::new(proxy::Proxy {
        job: job.to_owned(),
        rules,
        denials: denials.clone(),
        stop,
        slots: Arc::new(tokio::sync::Semaphore::new(proxy::MAX_CONNECTIONS)),
        lookups: Arc::new(tokio::sync::Semaphore::new(proxy::MAX_LOOKUPS)),
    });
    let task = tokio::spawn(proxy.serve(listener));
    Ok(Egress {
        denials,
        task,
        _stop: stop_tx,
    })
}
