//! railgrid: a fleet agent that keeps one supervised runner alive on a host, the runner
//! that executes jobs in confined process trees, and the reference hub they reconcile
//! against — one binary. See docs/design.md for the invariants each module upholds.

pub(crate) mod agent;
pub(crate) mod build_info;
pub mod cli;
pub mod cmd;
pub mod env_policy;
pub(crate) mod env_vars;
pub(crate) mod file_error;
pub(crate) mod hub;
pub mod hub_client;
pub mod logging;
pub(crate) mod metrics_text;
pub(crate) mod proc_tree;
pub mod proto;
pub(crate) mod release;
pub mod runner;
pub(crate) mod small_file;
pub mod supervisor;
pub use railgrid_sys as sys;
pub(crate) mod util;

pub(crate) use util::error_chain;
