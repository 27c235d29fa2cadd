//! Whether this process logs JSON: set once by the binary's logging when it is set up,
//! read by the agent, which passes it on to the runner it starts (whose environment is
//! built from nothing).

use std::sync::atomic::{AtomicBool, Ordering};

static JSON: AtomicBool = AtomicBool::new(false);

/// Whether this process logs JSON.
pub fn is_json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// Said once, as the log is set up.
pub fn set_json(json: bool) {
    JSON.store(json, Ordering::Relaxed);
}
