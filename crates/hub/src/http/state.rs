//! What every route is served with: the fleet, the admin token's hash, and the release
//! settings.

use std::sync::Arc;
use std::time::Duration;

use crate::fleet::Fleet;
use crate::store::Store;

/// The hub's state, shared by every request.
pub(crate) struct Hub<S: Store> {
    pub fleet: Arc<Fleet<S>>,
    /// This hub among its replicas, in its metrics (host name and port).
    pub replica: String,
    /// The dashboard's sessions.
    pub sessions: super::session::Sessions,
    /// Who may use the admin API, and the audit log.
    pub access: Arc<crate::access::Access<S>>,
    /// Secrets for jobs, sealed.
    pub secrets: Arc<crate::secrets::Secrets<S>>,
    /// The longest a reconcile is held, whatever `wait` asks.
    pub max_wait: Duration,
    /// The publishers' keys: a release is taken only signed by one of them.
    pub release_keys: Vec<minisign::PublicKey>,
    /// Where published binaries are kept, by SHA-256.
    pub releases_dir: std::path::PathBuf,
    /// One binary at a time is brought from the database (replicas): a thousand agents
    /// asking at once for one this replica lacks must not load it a thousand times.
    pub fetching: tokio::sync::Mutex<()>,
    /// The common answer to a reconcile, serialised once.
    pub answers: super::rendered::Rendered,
}
