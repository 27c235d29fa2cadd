//! The runner's job engine through its real API and the `railgrid job` CLI: real
//! processes, real SQLite, real sockets.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{json, Value};

use crate::fixtures::*;

mod admission;
mod api;
mod client;
mod confine;
mod network;
mod recovery;
mod runs;
mod sandbox;
mod secrets;

const LIMIT: Duration = Duration::from_secs(30);

fn submit_ok(r: &Runner, spec: Value) -> String {
    let (status, body) = r.submit(spec);
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().expect("id").to_owned()
}

/// `spec` is refused as an invalid spec (400) with a message that names `part`; the
/// message.
fn refused_spec(r: &Runner, spec: Value, part: &str) -> String {
    let (status, body) = r.submit(spec);
    assert_eq!(status, 400, "{part}: {body}");
    assert_eq!(body["error"]["code"], "invalid_spec", "{body}");
    assert_says(&body["error"], "message", part);
    body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// One GET with the token, returning the whole response, headers included (lower-cased
/// header names, as hyper sends them).
fn raw_get(socket: &Path, path: &str) -> String {
    raw_request(socket, "GET", path)
}

/// [`raw_get`] with any method.
fn raw_request(socket: &Path, method: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let token = fs::read_to_string(socket.with_file_name("api.token")).expect("token");
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("connect");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: 0\r\nAuthorization: Bearer {}\r\n\r\n",
        token.trim()
    )
    .expect("write");
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).expect("read");
    String::from_utf8_lossy(&resp).to_lowercase()
}

fn tree_script() -> &'static str {
    r#"for i in $(seq 20); do sleep 1000 & done
       sh -c 'trap "" TERM; exec sleep 1000' &
       echo ready; wait"#
}

fn assert_no_survivors(r: &Runner, rec: &Value) {
    let pid = rec["pid"].as_i64().expect("pid") as i32;
    let survivors = live_in_group(pid);
    assert!(
        survivors.is_empty(),
        "survivors of job group {pid}: {survivors:?} ({})",
        r.dir.path().display()
    );
}
