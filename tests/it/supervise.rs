//! `railgrid supervise` end to end.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(20);

fn args<'a>(log: &'a str, extra: &[&'a str], cmd: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--log", log];
    v.extend(user_flags());
    v.extend_from_slice(extra);
    v.push("--");
    v.extend_from_slice(cmd);
    v
}

#[test]
fn child_environment_is_built_from_scratch() {
    let dir = tempdir();
    let log = path_str(&dir.path().join("child.log"));
    let child = railgrid()
        .arg("supervise")
        .args(args(
            &log,
            &["--initial-backoff", "1m", "--env", "EXTRA=yes"],
            &["env"],
        ))
        .env("RAILGRID_HUB_TOKEN", "secret-hub-token")
        .env("AWS_SECRET_ACCESS_KEY", "secret-aws-key")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let _guard = Guard::new(child);
    let text = wait_for_text(dir.path().join("child.log").as_path(), "EXTRA=yes", LIMIT);
    // `env` printed everything it had and exited; the one-minute backoff keeps it from
    // printing again before the guard stops supervise.
    let names: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    let expected: BTreeSet<&str> = ["HOME", "PATH", "USER", "LOGNAME", "EXTRA"].into();
    assert_eq!(names, expected, "child environment:\n{text}");
    assert!(
        !text.contains("secret"),
        "a secret of the parent reached the child:\n{text}"
    );
    assert!(text.contains("PATH=/usr/local/bin:/opt/homebrew/bin:/usr/bin:/bin\n"));
}

#[test]
fn as_root_the_child_runs_as_nobody_without_root_groups() {
    if !requires_root("needs root to switch users (CI runs as root)") {
        return;
    }
    let dir = tempdir();
    let log = path_str(&dir.path().join("child.log"));
    let _sup = supervise(&args(
        &log,
        &["--initial-backoff", "1m"],
        &[
            "sh",
            "-c",
            "grep -E '^(Uid|Gid|Groups):' /proc/self/status; id -un; echo done",
        ],
    ));
    let text = wait_for_text(&dir.path().join("child.log"), "done", LIMIT);
    let nobody = uzers::get_user_by_name("nobody").expect("nobody exists");
    let (uid, gid) = (
        nobody.uid().to_string(),
        nobody.primary_group_id().to_string(),
    );
    let field = |name: &str| -> Vec<String> {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {text}"));
        line.split_whitespace().skip(1).map(str::to_owned).collect()
    };
    assert_eq!(
        field("Uid:"),
        vec![uid.clone(); 4],
        "real, effective, saved, fs uid:\n{text}"
    );
    assert_eq!(
        field("Gid:"),
        vec![gid.clone(); 4],
        "real, effective, saved, fs gid:\n{text}"
    );
    let groups = field("Groups:");
    assert!(
        !groups.iter().any(|g| g == "0"),
        "root group kept: {groups:?}"
    );
    assert!(text.contains("nobody\n"));
}

#[test]
fn root_child_requests_are_refused_before_anything_starts() {
    let dir = tempdir();
    let log_path = dir.path().join("child.log");
    let log = path_str(&log_path);
    let marker = dir.path().join("ran");
    let script = format!("touch {}", marker.display());

    let out = railgrid()
        .args([
            "supervise",
            "--log",
            &log,
            "--uid",
            "0",
            "--gid",
            "0",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .output()
        .expect("run");
    let err = exited(&out, 2);
    if is_root() {
        assert!(
            err.contains("refusing to run the child as root") && err.contains("--user"),
            "{err}"
        );
    } else {
        assert!(err.contains("only root can switch users"), "{err}");
    }

    if is_root() {
        // Root with no account for the child at all.
        let out = railgrid()
            .args(["supervise", "--log", &log, "--", "sh", "-c", &script])
            .output()
            .expect("run");
        exited_saying(&out, 2, "pass --user NAME");
    } else {
        eprintln!("SKIPPED part: root without --user (needs root)");
    }
    assert!(!marker.exists(), "the child ran");
    assert!(!log_path.exists(), "the log was created before the refusal");
}

#[test]
fn bad_flags_are_usage_errors() {
    let dir = tempdir();
    let log = path_str(&dir.path().join("child.log"));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["supervise", "--", "true"], "--log"),
        (
            vec![
                "supervise",
                "--log",
                &log,
                "--env",
                "LD_PRELOAD=/tmp/x.so",
                "--",
                "true",
            ],
            "LD_PRELOAD",
        ),
        (
            vec![
                "supervise",
                "--log",
                &log,
                "--stop-grace",
                "soon",
                "--",
                "true",
            ],
            "250ms",
        ),
        (
            vec!["supervise", "--log", &log, "--", "no-such-program-railgrid"],
            "not found in the child's PATH",
        ),
        (
            vec![
                "supervise",
                "--log",
                "/nonexistent-dir/child.log",
                "--",
                "/bin/true",
            ],
            "/nonexistent-dir/child.log",
        ),
        (
            vec![
                "supervise",
                "--log",
                &log,
                "--dir",
                "/nonexistent-dir",
                "--",
                "/bin/true",
            ],
            "/nonexistent-dir",
        ),
        (
            vec![
                "supervise",
                "--log",
                &log,
                "--user",
                "no-such-user-railgrid",
                "--",
                "/bin/true",
            ],
            "no such user",
        ),
    ];
    for (argv, needle) in cases {
        let mut argv = argv.clone();
        if is_root() && !argv.contains(&"--user") && argv.len() > 3 {
            argv.splice(1..1, ["--user", "nobody"]);
        }
        let out = railgrid().args(&argv).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{argv:?}: {err}");
        assert!(
            err.contains(needle),
            "{argv:?}: expected {needle:?} in:\n{err}"
        );
    }
}

#[test]
fn log_is_capped_rotated_and_private() {
    let dir = tempdir();
    let log_path = dir.path().join("child.log");
    let log = path_str(&log_path);
    let cap: u64 = 1024 * 1024;
    let script = "yes 0123456789012345678901234567890123456789 | head -c 52428800; echo END-OF-OUTPUT; exec sleep 1000";
    let _sup = supervise(&args(
        &log,
        &["--max-log-bytes", "1048576"],
        &["sh", "-c", script],
    ));
    wait_for(Duration::from_secs(60), "END-OF-OUTPUT in the log", || {
        let text = read_lossy(&log_path);
        text.ends_with("END-OF-OUTPUT\n").then_some(())
    });
    let backup = dir.path().join("child.log.1");
    let main_len = fs::metadata(&log_path).expect("log").len();
    let backup_len = fs::metadata(&backup).expect("rotated log exists").len();
    assert!(main_len <= cap, "log holds {main_len} bytes, cap {cap}");
    assert!(
        backup_len <= cap,
        "backup holds {backup_len} bytes, cap {cap}"
    );
    assert!(
        backup_len > cap / 2,
        "rotation left only {backup_len} bytes in the backup"
    );
    for p in [&log_path, &backup] {
        let mode = fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} has mode {mode:o}", p.display());
    }
    // Rotation cuts at line ends: the backup holds whole lines only.
    let text = read_lossy(&backup);
    assert!(
        text.ends_with('\n') && text.lines().all(|l| l.len() == 40),
        "partial lines in the backup"
    );
}

#[test]
fn stop_takes_down_the_whole_group_including_a_term_ignorer() {
    let dir = tempdir();
    let log_path = dir.path().join("child.log");
    let log = path_str(&log_path);
    let script = r#"
        for i in $(seq 50); do sleep 1000 & done
        sh -c 'trap "" TERM; echo ignorer $$; exec sleep 1000' &
        echo leader $$
        echo ready
        wait
    "#;
    let mut sup = supervise(&args(&log, &["--stop-grace", "1s"], &["sh", "-c", script]));
    let text = wait_for_text(&log_path, "ready", LIMIT);
    let leader: i32 = text
        .lines()
        .find_map(|l| l.strip_prefix("leader "))
        .and_then(|p| p.trim().parse().ok())
        .expect("leader pid");
    sup.own_group(leader);
    wait_for(LIMIT, "52 processes in the child's group", || {
        (live_in_group(leader).len() >= 52).then_some(())
    });
    let text = wait_for_text(&log_path, "ignorer", LIMIT);
    let ignorer: i32 = text
        .lines()
        .find_map(|l| l.strip_prefix("ignorer "))
        .and_then(|p| p.trim().parse().ok())
        .expect("ignorer pid");

    sup.signal(Signal::SIGTERM);
    let out = sup.wait_output(Duration::from_secs(1) + Duration::from_secs(10));
    let err = exited(&out, 0);
    assert!(
        err.contains("SIGKILL"),
        "the TERM-ignoring grandchild needed SIGKILL:\n{err}"
    );
    assert!(
        !alive(ignorer),
        "the TERM-ignoring grandchild {ignorer} survived"
    );
    let survivors = live_in_group(leader);
    assert!(
        survivors.is_empty(),
        "survivors in group {leader}: {survivors:?}"
    );
}

#[test]
fn a_crashing_child_is_restarted_with_growing_pauses() {
    let dir = tempdir();
    let log_path = dir.path().join("child.log");
    let log = path_str(&log_path);
    let mut sup = supervise(&args(
        &log,
        &["--initial-backoff", "100ms"],
        &["sh", "-c", "echo start $(date +%s%N); exit 3"],
    ));
    let text = wait_for(LIMIT, "five starts", || {
        let text = read_lossy(&log_path);
        (text.matches("start ").count() >= 5).then_some(text)
    });
    sup.signal(Signal::SIGTERM);
    let out = sup.wait_output(LIMIT);
    let err = exited(&out, 0);

    let starts: Vec<u128> = text
        .lines()
        .filter_map(|l| l.strip_prefix("start "))
        .map(|t| t.trim().parse().expect("nanoseconds"))
        .collect();
    let gaps_ms: Vec<u128> = starts
        .windows(2)
        .map(|w| (w[1] - w[0]) / 1_000_000)
        .collect();
    for (i, gap) in gaps_ms.iter().take(4).enumerate() {
        let floor = 100u128 << i;
        assert!(
            *gap >= floor,
            "gap {i} was {gap} ms, below the {floor} ms backoff: {gaps_ms:?}"
        );
    }
    assert!(
        gaps_ms.windows(2).take(3).all(|w| w[1] > w[0]),
        "gaps do not grow: {gaps_ms:?}"
    );
    assert!(err.contains("exited with status 3"), "{err}");
    assert!(err.contains("start=5"), "every launch is counted:\n{err}");
}

#[test]
fn lock_flag_reclaims_a_stale_holder_before_the_first_start() {
    let dir = tempdir();
    let lock = dir.path().join("runner.lock");
    let mut holder = crate::lock::spawn_holder(&lock);
    let pid = holder.pid();
    let log = path_str(&dir.path().join("child.log"));
    let lock_s = path_str(&lock);
    let mut sup = supervise(&args(
        &log,
        &["--lock", &lock_s, "--stop-grace", "1s"],
        &["sleep", "1000"],
    ));
    wait_for(LIMIT, "the stale holder to be gone", || {
        (!alive(pid)).then_some(())
    });
    holder.reap();
    sup.signal(Signal::SIGTERM);
    let out = sup.wait_output(LIMIT);
    let err = exited(&out, 0);
    assert!(
        err.contains("reclaimed stale lock holder") && err.contains(&pid.to_string()),
        "{err}"
    );
}

#[test]
fn version_reports_json() {
    let out = railgrid()
        .args(["version", "--json"])
        .output()
        .expect("run");
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["target"].as_str().is_some_and(|t| t.contains('-')));
    assert!(v.get("commit").is_some());
}

#[test]
fn paths_the_child_account_cannot_reach_are_refused_up_front() {
    if !requires_root("needs root to judge another account's access") {
        return;
    }
    let dir = tempdir();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
    let log = path_str(&dir.path().join("child.log"));
    let private = path_str(dir.path());
    // Spawned with a deadline: a supervise that wrongly accepted would run forever.
    let out = supervise(&[
        "--log",
        &log,
        "--user",
        "nobody",
        "--dir",
        &private,
        "--",
        "/bin/true",
    ])
    .wait_output(LIMIT);
    let err = exited(&out, 2);
    assert!(
        err.contains(&private) && err.contains("0700") && err.contains("search"),
        "{err}"
    );

    let program = dir.path().join("tool");
    fs::write(&program, "#!/bin/sh\nexit 0\n").expect("write");
    fs::set_permissions(&program, fs::Permissions::from_mode(0o700)).expect("chmod");
    let program_s = path_str(&program);
    let out = supervise(&["--log", &log, "--user", "nobody", "--", &program_s]).wait_output(LIMIT);
    exited_saying(&out, 2, "cannot run as uid");
}

/// The pid a child printed as `<label> <pid>` in the log.
fn printed_pid(text: &str, label: &str) -> i32 {
    text.lines()
        .find_map(|l| l.strip_prefix(label)?.strip_prefix(' '))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("{label} pid in the log:\n{text}"))
}

/// True while `pid` has its stdout open on a pipe.
fn holds_a_pipe(pid: i32) -> bool {
    fs::read_link(format!("/proc/{pid}/fd/1"))
        .is_ok_and(|t| t.to_string_lossy().starts_with("pipe:"))
}

#[test]
fn stop_does_not_wait_for_a_process_that_escaped_the_group() {
    let dir = tempdir();
    let log_path = dir.path().join("child.log");
    let log = path_str(&log_path);
    // The escapee leaves the group (setsid) and keeps the log pipe as its stdout. The
    // leader's last words on SIGTERM end without a newline: held back, then flushed.
    let script = r#"
        setsid sh -c 'echo escapee $$; exec sleep 1000' &
        trap 'printf "last words on SIGTERM"; exit 0' TERM
        echo leader $$
        echo line before the stop
        while :; do sleep 1 & wait $!; done
    "#;
    let mut sup = supervise(&args(&log, &["--stop-grace", "10s"], &["sh", "-c", script]));
    let text = wait_for_text(&log_path, "escapee ", LIMIT);
    let text = if text.contains("line before the stop") {
        text
    } else {
        wait_for_text(&log_path, "line before the stop", LIMIT)
    };
    let escapee = printed_pid(&text, "escapee");
    sup.own_group(escapee);
    sup.own_group(printed_pid(&text, "leader"));
    wait_for(LIMIT, "the escapee to hold the log pipe", || {
        holds_a_pipe(escapee).then_some(())
    });

    sup.signal(Signal::SIGTERM);
    let out = sup.wait_output(LIMIT);
    let err = exited(&out, 0);
    assert!(
        alive(escapee) && holds_a_pipe(escapee),
        "the test needs the escapee to outlive the stop with the pipe open"
    );
    assert!(
        err.contains("still holds its output pipe; what it writes from now on is not logged"),
        "stop should have drained the pipe, not waited for its last writer:\n{err}"
    );
    let text = read_lossy(&log_path);
    assert!(
        text.contains("line before the stop\n") && text.ends_with("last words on SIGTERM"),
        "output written before the group died is missing:\n{text}"
    );
}

#[test]
fn stop_after_a_crash_does_not_wait_for_an_escapee_of_the_crashed_child() {
    let dir = tempdir();
    let log_path = dir.path().join("child.log");
    let log = path_str(&log_path);
    let script = r#"
        setsid sh -c 'echo escapee $$; exec sleep 1000' &
        echo leader $$
        sleep 0.1
        echo crashing now
        exit 3
    "#;
    let mut sup = supervise(&args(
        &log,
        &["--initial-backoff", "1m"],
        &["sh", "-c", script],
    ));
    let text = wait_for_text(&log_path, "crashing now", LIMIT);
    let text = if text.contains("escapee ") {
        text
    } else {
        wait_for_text(&log_path, "escapee ", LIMIT)
    };
    let escapee = printed_pid(&text, "escapee");
    let leader = printed_pid(&text, "leader");
    sup.own_group(escapee);
    sup.own_group(leader);
    // The leader is gone and its group cleaned up: the supervisor is backing off.
    wait_for(LIMIT, "the crashed child's group to be gone", || {
        live_in_group(leader).is_empty().then_some(())
    });

    sup.signal(Signal::SIGTERM);
    let out = sup.wait_output(LIMIT);
    let err = exited(&out, 0);
    assert!(
        err.contains("exited with status 3"),
        "the child should have crashed once:\n{err}"
    );
    assert!(
        alive(escapee) && holds_a_pipe(escapee),
        "the test needs the escapee to outlive the stop with the pipe open"
    );
    assert!(
        err.contains("still holds its output pipe; what it writes from now on is not logged"),
        "{err}"
    );
    assert_eq!(read_lossy(&log_path).matches("crashing now").count(), 1);
}
