//! The README, followed as written: every shell block marked `<!-- readme-test … -->` is
//! run in order, as a reader would run it, with `/var/tmp/` moved into a directory of the
//! test's own, `/srv/hello-src` into another one outside the scratch directories jobs get
//! their own of, and the hub's port 7443 replaced by a free one (a reader's quick-start
//! hub may still be running). `PATH` holds `~/.cargo/bin` and the system's directories only,
//! and `railgrid` is in none of them until the block that installs it.
//!
//! Markers: `readme-test` (the block must exit 0), `readme-test: expect: TEXT` (and print
//! TEXT), `readme-test: background; ready: CMD` (a long-running command, started in a
//! process group of its own as a terminal would, until CMD succeeds; at the end it gets
//! the Ctrl-C the README promises stops it, and must exit 0), `readme-test: installs
//! railgrid` (`cargo install`: not run, which would build the release again; the binary
//! under test is put where it would put one, `~/.cargo/bin/railgrid`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::fixtures::*;

const README: &str = include_str!("../../README.md");
const LIMIT: Duration = Duration::from_secs(60);
const MARKER: &str = "<!-- readme-test";

/// Shell blocks that are shown but not run here: the build and install (the test runs the
/// binary it was built with) and the test command itself.
const UNMARKED: &[&str] = &[
    "cargo build --release",
    "./target/release/railgrid agent install",
    "bash scripts/install-test-prerequisites.sh",
    // A build step of its own (an example binary): the same man pages the CLI test
    // parses the definitions of.
    "cargo run --example man",
];

#[derive(Debug)]
enum Mode {
    Run { expect: Option<String> },
    Background { ready: String },
    Install,
}

#[derive(Debug)]
struct Block {
    line: usize,
    mode: Mode,
    body: String,
}

fn parse(readme: &str) -> Vec<Block> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if line == "```sh" {
            // An unmarked block: allowed only for what UNMARKED names.
            let first = lines.get(i + 1).copied().unwrap_or_default();
            let marked = i > 0 && lines[i - 1].trim().starts_with(MARKER);
            assert!(
                marked || UNMARKED.iter().any(|u| first.starts_with(u)),
                "README.md:{}: a shell block without a readme-test marker: {first}",
                i + 1
            );
        }
        let Some(rest) = line.strip_prefix(MARKER) else {
            i += 1;
            continue;
        };
        let spec = rest
            .trim_end_matches("-->")
            .trim()
            .trim_start_matches(':')
            .trim();
        let mut mode = Mode::Run { expect: None };
        let mut background = false;
        let mut ready = None;
        for part in spec.split("; ").map(str::trim).filter(|p| !p.is_empty()) {
            if part == "installs railgrid" {
                mode = Mode::Install;
            } else if part == "background" {
                background = true;
            } else if let Some(cmd) = part.strip_prefix("ready:") {
                ready = Some(cmd.trim().to_owned());
            } else if let Some(text) = part.strip_prefix("expect:") {
                mode = Mode::Run {
                    expect: Some(text.trim().to_owned()),
                };
            } else {
                panic!("README.md:{}: unknown readme-test option {part:?}", i + 1);
            }
        }
        if background {
            mode = Mode::Background {
                ready: ready.unwrap_or_else(|| {
                    panic!("README.md:{}: a background block needs ready: CMD", i + 1)
                }),
            };
        }
        assert_eq!(
            lines.get(i + 1).map(|l| l.trim()),
            Some("```sh"),
            "README.md:{}: a readme-test marker must stand right above a ```sh block",
            i + 1
        );
        let mut body = String::new();
        let mut j = i + 2;
        while j < lines.len() && lines[j].trim() != "```" {
            body.push_str(lines[j]);
            body.push('\n');
            j += 1;
        }
        blocks.push(Block {
            line: i + 1,
            mode,
            body,
        });
        i = j + 1;
    }
    blocks
}

/// A reader's shell, in the test's directory: `~/.cargo/bin` (where rustup's profile puts
/// it) and the system's directories on PATH, nothing else.
fn shell(dir: &Path, script: &str) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg("-ec")
        .arg(script)
        .current_dir(dir)
        .env_clear()
        .env(
            "PATH",
            format!("{}:/usr/bin:/bin", dir.join("home/.cargo/bin").display()),
        )
        .env("HOME", dir.join("home"))
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null());
    cmd
}

fn has(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A command running in the background, as in a second terminal.
struct Background {
    guard: Guard,
    line: usize,
    log: PathBuf,
}

#[test]
fn the_readme_works_as_written() {
    let blocks = parse(README);
    assert!(
        blocks.len() >= 8,
        "only {} readme-test blocks found in README.md",
        blocks.len()
    );
    if !requires_root("the README is followed as root (it runs the runner as nobody)") {
        return;
    }
    for tool in ["bash", "curl", "cc"] {
        assert!(
            has(tool),
            "the README's examples need {tool}: apt-get install -y {tool} (.ci/run does)"
        );
    }
    let dir = tempdir();
    let root = dir.path();
    // The runner account must pass through it, as through /var/tmp.
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::create_dir(root.join("home")).expect("mkdir home");
    let var_tmp = format!("{}/", root.display());
    // Where jobs see the host's own file system (read-only): not under /tmp.
    fs::create_dir_all("/srv").expect("mkdir /srv");
    let srv = tempfile::Builder::new()
        .prefix("railgrid-readme")
        .tempdir_in("/srv")
        .expect("a directory in /srv");
    fs::set_permissions(srv.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let hello_src = srv.path().join("hello-src");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("addr").port()
    };
    let reader = |text: &str| {
        text.replace("/var/tmp/", &var_tmp)
            .replace("/srv/hello-src", &path_str(&hello_src))
            .replace("127.0.0.1:7443", &format!("127.0.0.1:{port}"))
    };

    let mut background: Vec<Background> = Vec::new();
    for (n, block) in blocks.iter().enumerate() {
        let script = reader(&block.body);
        match &block.mode {
            Mode::Install => {
                assert!(
                    block.body.trim_start().starts_with("cargo install"),
                    "README.md:{}: an install block runs cargo install",
                    block.line
                );
                let bin = root.join("home/.cargo/bin");
                fs::create_dir_all(&bin).expect("mkdir ~/.cargo/bin");
                std::os::unix::fs::symlink(BIN, bin.join("railgrid")).expect("symlink");
                eprintln!("README.md:{}: installed", block.line);
            }
            Mode::Run { expect } => {
                let mut guard = Guard::new(
                    shell(root, &script)
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .spawn()
                        .expect("spawn bash"),
                );
                let out = guard.wait_output(LIMIT);
                let stdout = String::from_utf8_lossy(&out.stdout);
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(
                    out.status.success(),
                    "README.md:{}: the block failed ({}):\n{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
                    block.line,
                    out.status,
                    block.body
                );
                eprintln!("README.md:{}: ok", block.line);
                if let Some(want) = expect {
                    assert!(
                        stdout.contains(want.as_str()),
                        "README.md:{}: {want:?} not in the output:\n{stdout}\nstderr:\n{stderr}",
                        block.line
                    );
                }
            }
            Mode::Background { ready } => {
                let log = root.join(format!("background-{n}.log"));
                let file = fs::File::create(&log).expect("log");
                let child = shell(root, &script)
                    .process_group(0)
                    .stdout(file.try_clone().expect("dup"))
                    .stderr(file)
                    .spawn()
                    .expect("spawn bash");
                let mut guard = Guard::new(child);
                let pgid = guard.pid();
                guard.own_group(pgid);
                let ready = reader(ready);
                let started = Background {
                    guard,
                    line: block.line,
                    log,
                };
                wait_for(
                    LIMIT,
                    &format!("README.md:{} to be ready", block.line),
                    || {
                        let ok = shell(root, &ready)
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .status()
                            .is_ok_and(|s| s.success());
                        assert!(
                            alive(started.guard.pid()),
                            "README.md:{}: the background command ended early:\n{}",
                            started.line,
                            read_lossy(&started.log)
                        );
                        ok.then_some(())
                    },
                );
                background.push(started);
            }
        }
    }
    // Ctrl-C in each terminal, last started first: each stops and exits 0.
    while let Some(mut bg) = background.pop() {
        let _ = killpg(Pid::from_raw(bg.guard.pid()), Signal::SIGINT);
        let out = bg.guard.wait_output(LIMIT);
        assert_eq!(
            out.status.code(),
            Some(0),
            "README.md:{}: Ctrl-C did not stop it cleanly:\n{}",
            bg.line,
            read_lossy(&bg.log)
        );
    }
}

#[test]
fn the_readme_markers_are_understood() {
    let blocks = parse(
        "<!-- readme-test -->\n```sh\ntrue\n```\n\n<!-- readme-test: expect: hi -->\n```sh\necho hi\n```\n\
         <!-- readme-test: background; ready: test -e x -->\n```sh\nsleep 1\n```\n",
    );
    assert_eq!(blocks.len(), 3);
    assert!(matches!(blocks[0].mode, Mode::Run { expect: None }));
    assert!(matches!(&blocks[1].mode, Mode::Run { expect: Some(e) } if e == "hi"));
    assert!(matches!(&blocks[2].mode, Mode::Background { ready } if ready == "test -e x"));
    assert_eq!(blocks[1].body, "echo hi\n");
}
