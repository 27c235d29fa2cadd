//! Files and names an operator gives the agent and the hub: whatever they turn out to be
//! (a FIFO, a device, a file of megabytes, a name of megabytes), the command exits 2 at
//! once with the path named, and nothing is started.

use std::fs;
use std::time::{Duration, Instant};

use crate::fixtures::*;

/// Well above a refusal, well below a hang.
const LIMIT: Duration = Duration::from_secs(10);

fn fails_at_once(what: &str, mut cmd: std::process::Command) -> String {
    let started = Instant::now();
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let out = Guard::new(child).wait_output(LIMIT);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{what}: expected exit 2: {err}");
    assert!(
        started.elapsed() < LIMIT,
        "{what}: took {:?}",
        started.elapsed()
    );
    err
}

#[test]
fn agent_inputs_that_are_no_regular_small_files_exit_2_at_once() {
    let host = Host::new();
    let fifo = host.path("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let fifo_s = path_str(&fifo);
    let token = host.path("token");
    fs::write(&token, "rga_t0ken\n").expect("token");
    fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let token_s = path_str(&token);
    let hub = ["--hub", "https://hub.invalid", "--token-file", &token_s];

    // A CA file that is a FIFO: before, `agent run` blocked in open(2) for ever.
    let mut args = hub.to_vec();
    args.extend(["--ca-file", &fifo_s]);
    let err = fails_at_once("--ca-file FIFO", host.agent_cmd(&args));
    assert!(err.contains(&fifo_s) && err.contains("a FIFO"), "{err}");

    // A CA file that never ends: before, it was read until the kernel killed the agent.
    let mut args = hub.to_vec();
    args.extend(["--ca-file", "/dev/zero"]);
    let err = fails_at_once("--ca-file /dev/zero", host.agent_cmd(&args));
    assert!(
        err.contains("/dev/zero") && err.contains("character device"),
        "{err}"
    );

    // A token file that is a FIFO.
    let err = fails_at_once(
        "--token-file FIFO",
        host.agent_cmd(&["--hub", "https://hub.invalid", "--token-file", &fifo_s]),
    );
    assert!(err.contains(&fifo_s) && err.contains("a FIFO"), "{err}");

    // The config itself.
    let with_config = |config: &std::path::Path| {
        let mut cmd = railgrid();
        cmd.args(["agent", "run", "--config"])
            .arg(config)
            .arg("--state-dir")
            .arg(host.state())
            .args(if is_root() {
                &["--runner-user", "nobody"][..]
            } else {
                &[]
            });
        cmd
    };
    let err = fails_at_once("--config /dev/zero", with_config("/dev/zero".as_ref()));
    assert!(err.contains("/dev/zero"), "{err}");
    let big = host.path("big.toml");
    fs::write(&big, vec![b'#'; (1 << 20) + 1]).expect("write");
    let err = fails_at_once("a config of more than 1 MiB", with_config(&big));
    assert!(
        err.contains(&path_str(&big)) && err.contains("larger than"),
        "{err}"
    );

    // A user name of megabytes aborted the agent inside the C library's lookup; a config
    // now holds at most 1 MiB, and a name longer than a login name is refused unread.
    let long = "u".repeat(512 << 10);
    fs::write(
        host.path("agent.toml"),
        format!("[runner]\nuser = \"{long}\"\n"),
    )
    .expect("write");
    let mut cmd = railgrid();
    cmd.args(["agent", "run", "--config"])
        .arg(host.path("agent.toml"))
        .arg("--state-dir")
        .arg(host.state());
    let err = fails_at_once("a 512 KiB runner.user", cmd);
    assert!(
        err.contains("longer than 256 bytes") && err.len() < 4096,
        "{}",
        &err[..err.len().min(500)]
    );
    assert!(
        !host.state().join("runner").exists(),
        "nothing is made before validation"
    );
}

#[test]
fn hub_inputs_that_are_no_regular_small_files_exit_2_at_once() {
    let dir = tempdir();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let fifo_s = path_str(&fifo);
    let data = dir.path().join("data");
    let serve = |extra: &[&str]| {
        let mut cmd = railgrid();
        cmd.args(["hub", "serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .args(extra);
        cmd
    };
    for (what, extra) in [
        (
            "--tls-cert FIFO",
            vec!["--tls-cert", &fifo_s, "--tls-key", &fifo_s],
        ),
        (
            "--tls-cert /dev/zero",
            vec!["--tls-cert", "/dev/zero", "--tls-key", "/dev/zero"],
        ),
        (
            "--release-key FIFO",
            vec!["--tls-self-signed", "--release-key", &fifo_s],
        ),
        (
            "--config FIFO",
            vec!["--tls-self-signed", "--config", &fifo_s],
        ),
    ] {
        let err = fails_at_once(what, serve(&extra));
        assert!(
            err.contains(&fifo_s) || err.contains("/dev/zero"),
            "{what}: the path is named: {err}"
        );
        // Every input is checked before anything is written.
        for made in ["admin.token", "hub.db", "ca.pem"] {
            assert!(!data.join(made).exists(), "{what}: {made} was written");
        }
    }

    // The admin client's CA file, as anything but a small regular file: exit 2.
    let token = dir.path().join("admin.token");
    fs::write(&token, "rgh_t0ken\n").expect("token");
    fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    for ca in [fifo_s.as_str(), "/dev/zero"] {
        let mut cmd = railgrid();
        cmd.args(["hub", "--hub", "https://hub.invalid", "--ca-file", ca])
            .arg("--token-file")
            .arg(&token)
            .args(["agent", "list"]);
        let err = fails_at_once(&format!("hub --ca-file {ca}"), cmd);
        assert!(err.contains(ca), "{err}");
    }
}

/// An ordinary user after root (the README's quick start run as root first): files root
/// left where the user's commands go are named with their owner, exit 2, instead of a bare
/// "Permission denied" and exit 1.
#[test]
fn what_another_account_left_is_named_with_its_owner_and_exits_2() {
    use std::os::unix::process::CommandExt;
    if !requires_root("another account's files need root to make") {
        return;
    }
    let dir = tempdir();
    fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let log = dir.path().join("demo.log");
    fs::write(&log, "root's\n").expect("log");
    fs::set_permissions(&log, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let state = dir.path().join("state");
    fs::create_dir(&state).expect("state");
    let config = dir.path().join("agent.toml");
    fs::write(&config, "").expect("config");
    fs::set_permissions(&config, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("chmod");
    let nobody = uzers::get_user_by_name("nobody").expect("nobody");
    let as_nobody = |args: &[&str]| {
        let mut cmd = railgrid();
        cmd.args(args)
            .uid(nobody.uid())
            .gid(nobody.primary_group_id())
            .env("HOME", "/nonexistent");
        cmd
    };
    let log_s = path_str(&log);
    let err = fails_at_once(
        "supervise --log of root's",
        as_nobody(&["supervise", "--log", &log_s, "--", "/bin/true"]),
    );
    assert!(
        err.contains(&log_s) && err.contains("belongs to root"),
        "{err}"
    );
    let (state_s, config_s) = (path_str(&state), path_str(&config));
    let err = fails_at_once(
        "agent run --state-dir of root's",
        as_nobody(&[
            "agent",
            "run",
            "--config",
            &config_s,
            "--state-dir",
            &state_s,
        ]),
    );
    assert!(
        err.contains(&state_s) && err.contains("belongs to root"),
        "{err}"
    );
}
