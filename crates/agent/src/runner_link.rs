//! The agent's one way to its runner's API, shared by the reconciler (admission
//! changes), the hub task (job counts), the jobs task (submissions, output, cancels) and
//! the upgrade (health before a commit).
//!
//! The client is made at first use, off the async threads (it reads the API token beside
//! the socket), and kept for the agent's life: it reads the token again when a restarted
//! runner refuses the old one, and it keeps one connection alive for all of them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::OnceCell;

use crate::runner::client::Client;

#[derive(Clone)]
pub(crate) struct RunnerLink {
    socket: PathBuf,
    client: Arc<OnceCell<Arc<Client>>>,
}

impl RunnerLink {
    /// The link to the runner of the agent with state directory `state_dir`.
    pub(crate) fn new(state_dir: &Path) -> Self {
        Self {
            socket: crate::runner::Paths::new(state_dir).socket,
            client: Arc::new(OnceCell::new()),
        }
    }

    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    /// The client; an error only when the task that reads its token failed (panicked).
    pub(crate) async fn client(&self) -> Result<Arc<Client>, tokio::task::JoinError> {
        let client = self
            .client
            .get_or_try_init(|| {
                let socket = self.socket.clone();
                async move {
                    let made = tokio::task::spawn_blocking(move || Client::new(&socket));
                    made.await.map(Arc::new)
                }
            })
            .await?;
        Ok(client.clone())
    }
}
