//! Self-upgrade, end to end (DESIGN invariants 13 and 14): the reference hub over TLS
//! with a release key, an agent run from a copy of the binary in a directory of its own
//! (so that it may replace it), a second build of the same source stamped 99.0.0 with
//! `RAILGRID_BUILD_VERSION` (built once per test run), and every fault the upgrade must
//! survive. Each fault test checks what is on disk after, what the hub shows, that the
//! runner runs the same build as the agent, and that the executable's directory holds
//! nothing but `<exe>` and `<exe>.prev`.

mod by_hand;
mod download;
mod refused;
mod rollback;

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(60);
#[test]
fn a_hub_upgrade_runs_the_new_version_in_place_and_commits() {
    let mut up = Up::new();
    up.start_agent();
    let pid = up.status()["pid"].as_i64().expect("pid");
    let old_sha = sha256_hex(&up.exe());
    up.offer_v2();
    let u = up.wait_upgrade("committed");
    assert_eq!(u["target"], V2);
    up.assert_running(V2);
    assert_eq!(
        up.status()["pid"].as_i64(),
        Some(pid),
        "re-executed in place: the same process"
    );
    assert_eq!(sha256_hex(&up.exe()), sha256_hex(&builds().v2));
    assert_eq!(
        sha256_hex(&up.bin_dir().join("railgrid.prev")),
        old_sha,
        "the previous binary is kept"
    );
    up.assert_clean_bin();
    assert_eq!(up.hub_upgrade("committed")["target"], V2);
    let rel = up.releases();
    let v2 = rel
        .as_array()
        .expect("list")
        .iter()
        .find(|r| r["version"] == V2)
        .expect("the release");
    assert_eq!(v2["agents"], 1, "{rel}");
    assert_eq!(v2["pending"], 0);
    // The watcher saw the commit and is gone.
    let watcher = up.record()["upgrade"]["watcher_pid"]
        .as_i64()
        .expect("watcher pid");
    wait_for(LIMIT, "the watcher exits", || {
        (!alive(watcher as i32)).then_some(())
    });
    let text = String::from_utf8_lossy(&agent_status(&up.host.state()).stdout).into_owned();
    assert!(
        text.contains(&format!("upgrade:    committed {V2}")),
        "{text}"
    );
}
