//! The `railgrid job` client as a person uses it: output, exit codes, interrupts, detach.

use super::*;

/// The client's own process, its stdout and stderr read line by line on threads, so the
/// test can wait for a line with a deadline.
struct Client {
    guard: Guard,
    out: std::sync::mpsc::Receiver<String>,
    err: std::sync::mpsc::Receiver<String>,
    err_seen: Vec<String>,
}

fn lines_of(pipe: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

impl Client {
    /// `job submit --id ID -- sh -c SCRIPT` in the foreground, once the script printed
    /// `ready`.
    fn submitted(r: &Runner, id: &str, script: &str) -> Self {
        let mut child = r
            .cli()
            .args(["submit", "--id", id, "--", "sh", "-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn client");
        let out = lines_of(child.stdout.take().expect("stdout"));
        let err = lines_of(child.stderr.take().expect("stderr"));
        let client = Self {
            guard: Guard::new(child),
            out,
            err,
            err_seen: Vec::new(),
        };
        client.wait_line("ready");
        client
    }

    fn wait_line(&self, want: &str) {
        let line = self
            .out
            .recv_timeout(LIMIT)
            .unwrap_or_else(|_| panic!("no line {want:?} from the client"));
        assert_eq!(line, want);
    }

    fn wait_err(&mut self, needle: &str) {
        while !self.err_seen.iter().any(|l| l.contains(needle)) {
            let line = self.err.recv_timeout(LIMIT).unwrap_or_else(|_| {
                panic!("no {needle:?} on the client's stderr: {:?}", self.err_seen)
            });
            self.err_seen.push(line);
        }
    }

    /// Waits for the exit; returns the code and all of stderr.
    fn exit(&mut self) -> (Option<i32>, String) {
        let out = self.guard.wait_output(LIMIT);
        self.err_seen.extend(self.err.try_iter());
        (out.status.code(), self.err_seen.join("\n"))
    }
}

#[test]
fn a_job_that_cannot_start_says_why_and_exits_as_a_shell_would() {
    let r = Runner::started(&[]);
    for (id, program, code, says) in [
        ("missing", "no-such-program", 127, "not found in PATH"),
        ("not-executable", "/etc/passwd", 126, "Permission denied"),
    ] {
        let out = r
            .cli()
            .args(["submit", "--id", id, "--", program])
            .output()
            .expect("submit");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{program}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.contains("failed: could not start") && err.contains(says),
            "{err}"
        );
        for cmd in [vec!["wait", id], vec!["logs", id]] {
            let out = r.cli().args(&cmd).output().expect("client");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(code), "{cmd:?}: {err}");
            assert!(err.contains(says), "{cmd:?}: {err}");
        }
        let rec = r.job(id);
        assert_eq!(rec["exit_code"], code, "{rec}");
        assert!(rec["pid"].is_null(), "{rec}");
    }
}

#[test]
fn interrupting_a_submitted_job_cancels_it_and_a_second_interrupt_detaches() {
    let r = Runner::started(&[]);
    // Ends on SIGTERM: the first interrupt cancels it and the client exits as it did.
    let mut client = Client::submitted(&r, "calm", "echo ready; exec sleep 1000");
    client.guard.signal(Signal::SIGINT);
    let (code, err) = client.exit();
    assert_eq!(code, Some(128 + 15), "{err}");
    assert!(err.contains("cancelling job calm"), "{err}");
    assert_eq!(r.job("calm")["state"], "cancelled");

    // Ignores SIGTERM, so cancelling takes its grace: SIGTERM to the client cancels, a
    // Ctrl-C then detaches, and the job is still stopped.
    let mut client = Client::submitted(&r, "stubborn", "trap '' TERM; echo ready; exec sleep 1000");
    client.guard.signal(Signal::SIGTERM);
    client.wait_err("cancelling job stubborn");
    client.guard.signal(Signal::SIGINT);
    let (code, err) = client.exit();
    assert_eq!(code, Some(130), "{err}");
    assert!(
        err.contains("detached") && err.contains("logs --follow stubborn"),
        "{err}"
    );
    let rec = r.wait("stubborn");
    assert_eq!(rec["state"], "cancelled", "{rec}");
}

#[test]
fn detach_returns_the_id_and_unenforceable_limits_are_named() {
    let r = Runner::started(&[]);
    let out = r
        .cli()
        .args([
            "submit",
            "--detach",
            "--id",
            "bg",
            "--cpu-millis",
            "500",
            "--",
            "true",
        ])
        .output()
        .expect("submit");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "bg");
    let err = String::from_utf8_lossy(&out.stderr);
    let health = get_json(&r.socket(), "/v1/health").expect("health");
    if health["confinement"] == "process-group" {
        assert!(err.contains("cpu_millis will not be enforced"), "{err}");
    }
    assert_eq!(r.wait("bg")["state"], "succeeded");
}

#[test]
fn a_client_without_access_to_the_socket_is_told_whose_it_is() {
    if !requires_root("needs root to run the client as another account") {
        return;
    }
    let r = Runner::started(&[]);
    let daemon = uzers::get_user_by_name("daemon").expect("daemon");
    let out = r
        .cli()
        .args(["list"])
        .uid(daemon.uid())
        .gid(daemon.primary_group_id())
        .output()
        .expect("list");
    let err = exited(&out, 1);
    assert!(
        err.contains("belongs to the runner's account (nobody)")
            && !err.contains("is the agent running"),
        "{err}"
    );
}

#[test]
fn job_list_writes_a_row_a_job_under_its_header_with_control_characters_made_safe() {
    let r = Runner::started(&[]);
    run_ok(
        r.cli()
            .args(["submit", "--id", "esc", "--", "echo", "\x1b[2Jgone"]),
        "job submit",
    );
    let out = run_ok(r.cli().arg("list"), "job list");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("ID ") && header.ends_with(" OWNER      ARGV"),
        "{text}"
    );
    let row = lines.next().unwrap_or_default();
    assert!(
        row.starts_with("esc ") && row.contains(" succeeded ") && row.ends_with(" echo ?[2Jgone"),
        "{text}"
    );
    assert!(
        !text.contains('\x1b'),
        "an escape sequence reached the terminal: {text:?}"
    );
}
