//! Wire types: everything railgrid sends or receives as JSON, in one place, so that a
//! change to the protocol is a change to this crate and nothing else; and the checks both
//! sides of a message share (a job's spec, its secrets, a selector).
//!
//! Rules for evolving them (the runner's API and, next, the hub protocol v1):
//! - a new field is optional: `#[serde(default)]` on the way in, so that an older peer's
//!   message still parses, and, where leaving it out changes nothing, skipped on the way
//!   out when empty (so specs keep their canonical form, which idempotent resubmission
//!   compares);
//! - unknown fields are ignored, so that a newer peer's message parses too (only `Limits`
//!   refuses them: a limit this runner does not know must not silently not apply);
//! - a field is never renamed, retyped or given a new meaning; that is a new API version
//!   (`/v2/…`), served beside the old one;
//! - states are never removed; a client meeting a state it does not know treats it as
//!   terminal only if it can say so (`is_terminal`), so new states must be added with care.

pub mod access;
pub mod admission;
pub mod desired;
pub mod drain;
pub mod egress;
pub mod fleet_job;
pub mod health;
pub mod hub;
pub mod hub_dir;
pub mod job;
pub mod labels;
pub mod report;
pub mod rollout;
pub mod runner;
pub mod secret;
pub mod selector;
pub mod spec;

use railgrid_util as util;
use railgrid_util::{env_policy, env_vars};
