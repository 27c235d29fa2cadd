//! railgrid: a fleet agent that keeps one supervised runner alive on a host, the runner
//! that executes jobs in confined process trees, and the reference hub they reconcile
//! against — one binary. See docs/design.md for the invariants each module upholds.

pub mod cli;
pub mod cmd;
pub mod hub_client;
pub mod logging;

// The crates below this one, under the names the code above them uses.
pub use railgrid_agent as agent;
pub use railgrid_build as build_info;
pub use railgrid_hub as hub;
pub use railgrid_proto as proto;
pub use railgrid_release as release;
pub use railgrid_runner as runner;
pub use railgrid_supervisor as supervisor;
pub use railgrid_supervisor::proc_tree;
pub use railgrid_sys as sys;
pub use railgrid_util as util;
pub use railgrid_util::{env_policy, env_vars, file_error, metrics_text, small_file, stream_body};

pub(crate) use util::error_chain;
