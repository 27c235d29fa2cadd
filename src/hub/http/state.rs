//! What every route is served with: the fleet, the admin token's hash, and the release
//! settings.

use std::sync::Arc;
use std::time::Duration;

use crate::hub::fleet::Fleet;
use crate::hub::store::Store;

/// The hub's state, shared by every request.
pub(crate) struct Hub<S: Store> {
    pub(crate) fleet: Arc<Fleet<S>>,
    /// This hub among its replicas, in its metrics (host name and port).
    pub(crate) replica: String,
    /// The dashboard's sessions.
    pub(crate) sessions: super::session::Sessions,
    /// Who may use the admin API, and the audit log.
    pub(crate) access: Arc<crate::hub::access::Access<S>>,
    /// Secrets for jobs, sealed.
    pub(crate) secrets: Arc<crate::hub::secrets::Secrets<S>>,
    /// The longest a reconcile is held, whatever `wait` asks.
    pub(crate) max_wait: Duration,
    /// The publishers' keys: a release is taken only signed by one of them.
    pub(crate) release_keys: Vec<minisign::PublicKey>,
    /// Where published binaries are kept, by SHA-256.
    pub(crate) releases_dir: std::path::PathBuf,
    /// One binary at a time is brought from the database (replicas): a thousand agents
    /// asking at once for one this replica lacks must not load it a thousand times.
    pub(crate) fetching: tokio::sync::Mutex<()>,
    /// The common answer to a reconcile, serialised once.
    pub(crate) answers: super::rendered::Rendered,
}
