//! The CLI among other tools: completion scripts a shell loads, JSON log lines a
//! collector parses (the hub's, the agent's and its runner's), and `--json` where a
//! script reads the answer.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(30);

/// Every line of `text` is a JSON log record with a level and a message.
fn assert_json_lines(text: &str, what: &str) -> usize {
    let mut n = 0;
    for line in text.lines().filter(|l| !l.is_empty()) {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{what}: not a JSON line ({e}): {line}"));
        assert!(v["timestamp"].is_string(), "{what}: {line}");
        assert!(v["level"].is_string(), "{what}: {line}");
        assert!(v["fields"]["message"].is_string(), "{what}: {line}");
        n += 1;
    }
    n
}

#[test]
fn completions_load_in_bash() {
    for shell in ["bash", "zsh", "fish"] {
        let out = railgrid()
            .args(["completions", shell])
            .output()
            .expect("completions");
        assert!(out.status.success(), "{shell}");
        assert!(!out.stdout.is_empty(), "{shell}");
    }
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source <('{}' completions bash) && complete -p railgrid",
            BIN
        ))
        .output()
        .expect("bash");
    let said = String::from_utf8_lossy(&out.stdout);
    succeeded(&out);
    assert!(said.contains("railgrid"), "{said}");
    let bad = railgrid()
        .args(["completions", "tcsh"])
        .output()
        .expect("bad");
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn json_logs_are_one_object_a_line_from_the_hub_the_agent_and_its_runner() {
    let dir = tempdir();
    let hub = TestHub::start(&dir.path().join("hub"), &["--log-format", "json"]);
    let n = assert_json_lines(&hub.log(), "hub serve");
    assert!(n > 0, "the hub logged nothing");

    let host = Host::new();
    let mut agent = Guard::new(
        host.agent_cmd(&["--log-format", "json"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("agent"),
    );
    host.wait_runner("the runner serving", |_| true);
    // The runner writes its log once it serves: its lines, and the agent's file.
    let runner_log = host.path("logs/runner.log");
    wait_for(LIMIT, "the runner's log", || {
        (!read_lossy(&runner_log).is_empty()).then_some(())
    });
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    agent.wait_output(LIMIT);
    assert!(assert_json_lines(&read_lossy(&runner_log), "runner run") > 0);
    let agent_logs: String = std::fs::read_dir(host.path("logs"))
        .expect("logs")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("agent"))
        .map(|e| read_lossy(&e.path()))
        .collect();
    assert!(assert_json_lines(&agent_logs, "agent run") > 0);
    assert!(
        agent_logs.contains("\"message\":\"agent stopped\""),
        "{agent_logs}"
    );
    drop(hub);
}

#[test]
fn check_config_release_verify_and_a_dry_run_install_speak_json() {
    let dir = tempdir();
    let out = railgrid()
        .args(["agent", "check-config", "--json", "--state-dir"])
        .arg(dir.path().join("state"))
        .args(["--runner-user", "nobody"])
        .output()
        .expect("check-config");
    succeeded(&out);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["runner"]["user"], "nobody", "{v:#}");

    let (sk, pk, file) = (
        dir.path().join("k.key"),
        dir.path().join("k.pub"),
        dir.path().join("f"),
    );
    std::fs::write(&file, b"bytes").expect("file");
    for args in [
        vec![
            "keygen",
            "--secret-key",
            &path_str(&sk),
            "--public-key",
            &path_str(&pk),
        ],
        vec![
            "sign",
            "--secret-key",
            &path_str(&sk),
            "--version",
            "1.0.0",
            &path_str(&file),
        ],
    ] {
        let out = railgrid()
            .arg("release")
            .args(&args)
            .output()
            .expect("release");
        succeeded(&out);
    }
    let out = railgrid()
        .args(["release", "verify", "--json", "--public-key"])
        .arg(&pk)
        .arg(&file)
        .output()
        .expect("verify");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["verified"], true, "{v:#}");
    assert!(v["key_id"].as_str().is_some_and(|k| k.len() == 16), "{v:#}");

    let root = dir.path().join("image");
    std::fs::create_dir(&root).expect("image");
    let out = railgrid()
        .args([
            "agent",
            "install",
            "--dry-run",
            "--json",
            "--runner-user",
            "nobody",
            "--root",
        ])
        .arg(&root)
        .output()
        .expect("install");
    succeeded(&out);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let steps = v["steps"].as_array().expect("steps");
    assert!(
        steps.iter().any(|s| s["file"]["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("agent.toml"))),
        "{v:#}"
    );
    assert_eq!(
        std::fs::read_dir(&root).expect("image").count(),
        0,
        "a dry run writes nothing"
    );
}

#[test]
fn man_pages_are_made_for_every_command() {
    // `cargo test` builds the examples beside the binary; a run of this test alone may not
    // have.
    let man = std::path::Path::new(BIN)
        .parent()
        .expect("target dir")
        .join("examples/man");
    if !man.exists() {
        let built = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "--example", "man", "--manifest-path"])
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .status()
            .expect("cargo build --example man");
        assert!(built.success());
    }
    let dir = tempdir();
    let out = Command::new(&man).arg(dir.path()).output().expect("man");
    succeeded(&out);
    let page = read_lossy(&dir.path().join("railgrid-hub-rollout-start.1"));
    assert!(
        page.contains(".TH") && page.contains("max\\-parallel"),
        "{page}"
    );
    let pages = std::fs::read_dir(dir.path()).expect("pages").count();
    assert!(pages > 50, "{pages} pages");
}
