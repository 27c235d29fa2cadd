//! Fixtures shared by the tests of more than one crate: the store's conformance suite
//! (crates/hub-store) and the binary's integration tests (tests/it) start their
//! PostgreSQL the same way. A dev-dependency only; nothing here reaches a build of
//! railgrid itself. The small helpers below are the integration tests' too.

pub mod pg;

/// What installs every test prerequisite, as the README says: named wherever a test
/// finds one missing.
pub const INSTALL: &str = "bash scripts/install-test-prerequisites.sh";

/// Whether the tests run as root (uid switching, the `postgres` account).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A fresh temporary directory, removed when dropped.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("railgrid-test")
        .tempdir()
        .expect("tempdir")
}

pub fn path_str(p: &std::path::Path) -> String {
    p.to_str().expect("utf-8 path").to_owned()
}

/// A loopback port nobody listens on now (bound and let go).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
