//! The hub protocol's client (railgrid-hub-client, which the agent uses too) and, here in
//! the binary, the admin API's client that the `hub` commands use.

pub use railgrid_hub_client::*;

pub(crate) mod admin;
