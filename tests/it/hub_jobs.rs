//! Jobs through the hub, end to end: the reference hub over TLS, a real agent and its
//! runner (as `nobody` when root), `railgrid hub job …` as an operator types it, and the
//! parties killed and restarted under running jobs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(30);

/// A hub, and a host enrolled at it as `a1` whose agent is started on demand.
struct Fleet {
    _dir: tempfile::TempDir,
    hub_dir: PathBuf,
    hub: Option<TestHub>,
    host: Host,
    token_file: PathBuf,
    agent: Option<Guard>,
}

impl Fleet {
    fn new(hub_args: &[&str]) -> Self {
        let dir = tempdir();
        let hub_dir = dir.path().join("hub");
        let hub = TestHub::start(&hub_dir, hub_args);
        let token_file = hub.enrol("a1");
        Self {
            _dir: dir,
            hub_dir,
            hub: Some(hub),
            host: Host::new(),
            token_file,
            agent: None,
        }
    }

    fn hub(&self) -> &TestHub {
        self.hub.as_ref().expect("hub running")
    }

    fn start_agent(&mut self) {
        let mut cmd = self.host.agent_cmd(&[]);
        cmd.args(self.hub().link("a1", &self.token_file))
            .stderr(std::process::Stdio::null());
        self.agent = Some(Guard::new(cmd.spawn().expect("spawn agent")));
    }

    /// kill -9 of the agent: nothing of it runs its shutdown.
    fn kill_agent(&mut self) {
        let mut agent = self.agent.take().expect("agent running");
        agent.signal(Signal::SIGKILL);
        agent.wait_output(LIMIT);
    }

    fn jobs(&self, args: &[&str]) -> Output {
        let mut all = vec!["job"];
        all.extend_from_slice(args);
        self.hub().admin(&all)
    }

    /// `hub job submit --agent a1 [flags] -- argv`, as it ended.
    fn submit_output(&self, flags: &[&str], argv: &[&str]) -> Output {
        let mut args = vec!["submit", "--agent", "a1"];
        args.extend_from_slice(flags);
        args.push("--");
        args.extend_from_slice(argv);
        self.jobs(&args)
    }

    /// [`Self::submit_output`] that must succeed: the job's id.
    fn submit(&self, flags: &[&str], argv: &[&str]) -> String {
        let out = self.submit_output(flags, argv);
        assert!(
            out.status.success(),
            "submit failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn status(&self, id: &str) -> Value {
        self.hub().admin_json(&["job", "status", id])
    }

    fn wait_status(&self, id: &str, what: &str, accept: impl Fn(&Value) -> bool) -> Value {
        wait_for(LIMIT, what, || {
            let v = self.status(id);
            accept(&v).then_some(v)
        })
    }

    fn wait_done(&self, id: &str) -> Value {
        self.wait_status(id, &format!("job {id} done at the hub"), |v| {
            v["done"] == true
        })
    }

    /// What the hub holds of a stream.
    fn logs(&self, id: &str, stream: &str) -> Vec<u8> {
        let mut args = vec!["logs", id];
        if stream == "stderr" {
            args.push("--stderr");
        }
        let out = self.jobs(&args);
        succeeded(&out);
        out.stdout
    }

    /// The runner's record of a job, from its socket.
    fn runner_job(&self, id: &str) -> Option<Value> {
        get_json(&self.host.socket(), &format!("/v1/jobs/{id}"))
    }

    fn spool(&self, id: &str, stream: &str) -> Vec<u8> {
        fs::read(self.host.state().join(format!("runner/jobs/{id}/{stream}"))).unwrap_or_default()
    }

    fn restart_hub(&mut self, sig: Signal) {
        let hub = self.hub.take().expect("hub running");
        let listen = hub.listen.clone();
        let mut guard = hub.guard;
        guard.signal(sig);
        guard.wait_output(LIMIT);
        self.hub = Some(TestHub::start_on(&self.hub_dir, &listen, &[]));
    }
}

fn runs(marks: &Path, id: &str) -> usize {
    read_lossy(&marks.join(id)).lines().count()
}

fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

#[test]
fn a_job_runs_on_its_agent_and_its_output_and_exit_code_come_back_through_the_hub() {
    let mut f = Fleet::new(&[]);
    f.start_agent();
    let out = f.submit_output(
        &["--id", "j-exit", "--wait", "--env", "WHO=hub"],
        &["sh", "-c", "echo out $WHO; echo err >&2; exit 7"],
    );
    assert_eq!(
        code(&out),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out hub\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("err"));

    let v = f.status("j-exit");
    assert_eq!(v["state"], "failed");
    assert_eq!(v["exit_code"], 7);
    assert_eq!(v["done"], true);
    assert_eq!(v["agent"], "a1");
    assert_eq!(f.logs("j-exit", "stderr"), b"err\n");
    // The same job is the runner's job, by the same id.
    let rec = f.runner_job("j-exit").expect("the runner has it");
    assert_eq!(rec["exit_code"], 7);

    // A signal is 128 + it, as a shell shows it; `job wait` agrees with `submit --wait`.
    let id = f.submit(&[], &["sh", "-c", "kill -TERM $$"]);
    let out = f.jobs(&["wait", &id]);
    assert_eq!(code(&out), Some(128 + 15));
    let out = f.submit_output(&["--wait", "--timeout", "1s"], &["sleep", "30"]);
    assert_eq!(
        code(&out),
        Some(124),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let list = f.hub().admin_json(&["job", "list", "--agent", "a1"]);
    assert_eq!(list.as_array().map(Vec::len), Some(3));
    assert_eq!(list[2]["id"], "j-exit", "newest first");
    // An id is one job: a second submission of it is refused.
    let again = f.submit_output(&["--id", "j-exit"], &["true"]);
    assert_eq!(code(&again), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists already"));
}

#[test]
fn a_cancel_from_the_hub_ends_the_running_job_s_process_group() {
    let mut f = Fleet::new(&[]);
    f.start_agent();
    let id = f.submit(&[], &["sh", "-c", "sleep 600 & sleep 600; wait"]);
    f.wait_status(&id, "the job running", |v| v["state"] == "running");
    let pid = f
        .runner_job(&id)
        .and_then(|r| r["pid"].as_i64())
        .expect("pid") as i32;
    assert!(alive(pid));
    let asked = Instant::now();
    let out = f.jobs(&["cancel", &id]);
    succeeded(&out);
    let v = f.wait_done(&id);
    assert_eq!(v["state"], "cancelled");
    assert_eq!(v["signal"], 15);
    // The whole group: the shell and both sleeps.
    wait_for(LIMIT, "the job's group gone", || {
        live_in_group(pid).is_empty().then_some(())
    });
    assert!(asked.elapsed() < LIMIT);
    assert_eq!(code(&f.jobs(&["wait", &id])), Some(128 + 15));
}

#[test]
fn jobs_for_an_agent_that_is_away_wait_at_the_hub_bounded_and_start_when_it_returns() {
    let mut f = Fleet::new(&["--max-open-jobs", "2"]);
    let marks = f.host.marks_dir();
    let m = path_str(&marks);
    let first = f.submit(&["--id", "w1"], &["sh", "-c", &format!("echo x >> {m}/w1")]);
    let second = f.submit(&["--id", "w2"], &["sh", "-c", &format!("echo x >> {m}/w2")]);
    let v = f.status(&first);
    assert_eq!(v["state"], "pending");
    assert_says(&v, "waiting", "agent a1 has never reconciled");
    let refused = f.submit_output(&[], &["true"]);
    assert_eq!(code(&refused), Some(1));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("2 jobs not done") && why.contains("--max-open-jobs"),
        "{why}"
    );

    // A job cancelled before its agent was ever sent it ends at once, at the hub.
    let out = f.jobs(&["cancel", &second]);
    succeeded(&out);
    let v = f.status(&second);
    assert_eq!(
        (v["state"].as_str(), v["done"].as_bool()),
        (Some("cancelled"), Some(true))
    );
    assert_says(&v, "error", "before agent a1 was sent it");

    f.start_agent();
    let v = f.wait_done(&first);
    assert_eq!(v["state"], "succeeded");
    assert_eq!(runs(&marks, "w1"), 1);
    assert_eq!(
        runs(&marks, "w2"),
        0,
        "a cancelled job never reached the runner"
    );
    assert!(f.runner_job(&second).is_none());
}

#[test]
fn a_spec_the_runner_refuses_ends_at_the_hub_as_rejected_with_the_runner_s_reason() {
    let mut f = Fleet::new(&[]);
    f.start_agent();
    let out = f.submit_output(&["--wait", "--cwd", "../../etc"], &["true"]);
    assert_eq!(code(&out), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("rejected") && stderr.contains("outside the workspace root"),
        "{stderr}"
    );

    // What the runner would refuse without looking at its file system is refused at
    // submission, past the CLI through the admin API: a loader variable, an owner with a
    // control character (accepted before, and `rejected` only once the agent had it).
    let token = f.hub().admin_token();
    for (id, spec, needle) in [
        (
            "j-preload",
            r#""env": {"LD_PRELOAD": "/tmp/x.so"}"#,
            "LD_PRELOAD",
        ),
        ("j-owner", r#""owner": "ci\u001b[2Jx""#, "owner"),
    ] {
        let body =
            format!(r#"{{"agent": "a1", "spec": {{"id": "{id}", "argv": ["true"], {spec}}}}}"#);
        let (status, text) = f
            .hub()
            .curl("POST", "/v1/admin/jobs", Some(&token), Some(&body));
        assert_eq!(status, 400, "{text}");
        assert!(
            text.contains(needle) && text.contains(r#""error""#),
            "{text}"
        );
        assert!(
            !text.contains('\u{1b}'),
            "the control character is not echoed: {text}"
        );
        let (status, _) = f
            .hub()
            .curl("GET", &format!("/v1/admin/jobs/{id}"), Some(&token), None);
        assert_eq!(status, 404, "nothing was stored of {id}");
    }
}

/// A job printing 200 000 numbers over a few seconds: its output is known exactly.
fn slow_seq(marks: &Path, id: &str) -> Vec<String> {
    let m = path_str(marks);
    let script = format!(
        "echo x >> {m}/{id}; i=0; while [ $i -lt 40 ]; do seq $((i*5000+1)) $((i*5000+5000)); i=$((i+1)); sleep 0.1; done"
    );
    vec!["sh".into(), "-c".into(), script]
}

fn seq_bytes(n: u32) -> Vec<u8> {
    (1..=n)
        .map(|i| format!("{i}\n"))
        .collect::<String>()
        .into_bytes()
}

/// A fleet with its agent running [`slow_seq`] as job `id`, once some of its output is
/// at the hub; the marks dir.
fn slow_job_under_way(id: &str) -> (Fleet, PathBuf) {
    let mut f = Fleet::new(&[]);
    f.start_agent();
    let marks = f.host.marks_dir();
    let argv = slow_seq(&marks, id);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    f.submit(&["--id", id], &argv);
    f.wait_status(id, "output at the hub", |v| {
        v["stdout_stored"].as_u64() > Some(0)
    });
    (f, marks)
}

#[test]
fn the_hub_restarted_mid_upload_loses_and_duplicates_no_byte() {
    let (mut f, marks) = slow_job_under_way("up");
    let id = "up";
    f.restart_hub(Signal::SIGKILL);
    f.wait_status(id, "more output after a hub restart", |v| {
        v["stdout_stored"].as_u64() > Some(300_000)
    });
    f.restart_hub(Signal::SIGTERM);
    let v = f.wait_done(id);
    assert_eq!(v["state"], "succeeded");
    let got = f.logs(id, "stdout");
    let want = seq_bytes(200_000);
    assert_eq!(got.len(), want.len(), "lengths differ");
    assert!(
        got == want,
        "the output at the hub is not what the job printed"
    );
    assert_eq!(runs(&marks, "up"), 1);
}

#[test]
fn an_agent_killed_mid_job_does_not_run_it_again_and_its_output_and_end_reach_the_hub() {
    let (mut f, marks) = slow_job_under_way("k9");
    let id = "k9";
    f.kill_agent();
    f.start_agent();
    let v = f.wait_done(id);
    // The runner stopped with the agent (its jobs cancelled), or was reclaimed by the
    // new one (its jobs lost): either way the hub has the runner's end of the job, and
    // what the job printed.
    let rec = f.runner_job(id).expect("the runner's record");
    assert_eq!(v["state"], rec["state"], "{v}");
    assert_eq!(v["error"], rec["error"], "{v}");
    let spooled = f.spool(id, "stdout");
    assert!(!spooled.is_empty());
    assert!(
        f.logs(id, "stdout") == spooled,
        "the hub's output is not the spool's"
    );
    assert!(seq_bytes(200_000).starts_with(&spooled));
    assert_eq!(runs(&marks, "k9"), 1, "the job ran again");
}

#[test]
fn an_agent_killed_as_its_runner_takes_a_job_does_not_run_it_twice() {
    let mut f = Fleet::new(&[]);
    f.start_agent();
    let marks = f.host.marks_dir();
    let m = path_str(&marks);
    let id = f.submit(
        &["--id", "early"],
        &[
            "sh",
            "-c",
            &format!("echo x >> {m}/early; sleep 2; echo end"),
        ],
    );
    // As soon as the runner has the job, whether or not the hub heard of it.
    wait_for(LIMIT, "the runner has the job", || f.runner_job(&id));
    f.kill_agent();
    f.start_agent();
    let v = f.wait_done(&id);
    let rec = f.runner_job(&id).expect("the runner's record");
    assert_eq!(v["state"], rec["state"], "{v}");
    assert_eq!(runs(&marks, "early"), 1, "the job ran again");
    assert_eq!(f.logs(&id, "stdout"), f.spool(&id, "stdout"));
}

#[test]
fn uploads_are_idempotent_by_offset_and_only_the_job_s_agent_may_make_them() {
    let f = Fleet::new(&[]);
    let other = f.hub().enrol("a2");
    let other = read_lossy(&other).trim().to_owned();
    let mine = read_lossy(&f.token_file).trim().to_owned();
    let id = f.submit(&["--id", "u1"], &["true"]);
    let hub = f.hub();
    let put = |token: &str, offset: u64, body: &str| {
        hub.curl(
            "PUT",
            &format!("/v1/jobs/{id}/output/stdout?offset={offset}"),
            Some(token),
            Some(body),
        )
    };
    assert_eq!(put(&mine, 0, "abc"), (200, r#"{"length":3}"#.into()));
    // The same bytes again, and an overlap: only what is new is taken.
    assert_eq!(put(&mine, 0, "abc").1, r#"{"length":3}"#);
    assert_eq!(put(&mine, 1, "bcde").1, r#"{"length":5}"#);
    let (status, body) = put(&mine, 9, "x");
    assert_eq!(status, 409);
    assert!(
        body.contains(r#""length":5"#) && body.contains("resume from 5"),
        "{body}"
    );
    assert_eq!(put(&other, 5, "zz").0, 401, "another agent's token");
    assert_eq!(put("rga_nope", 5, "zz").0, 401);
    let (status, _) = hub.curl(
        "PUT",
        "/v1/jobs/nojob/output/stdout?offset=0",
        Some(&mine),
        Some("x"),
    );
    assert_eq!(status, 401, "an unknown job reads as a wrong token");
    assert_eq!(put(&mine, 5, "").1, r#"{"length":5}"#);
    assert_eq!(f.logs(&id, "stdout"), b"abcde");
    // Offsets past what the hub counts in are refused, not wrapped.
    assert_eq!(put(&mine, 1 << 63, "x").0, 400);
    let admin = hub.admin_token();
    let (status, body) = hub.curl(
        "GET",
        &format!("/v1/jobs/{id}/output/stdout?offset=0"),
        Some(&admin),
        None,
    );
    assert_eq!(
        status, 405,
        "the admin reads output under /v1/admin: {body}"
    );
    for offset in [1u64 << 63, u64::MAX] {
        let (status, body) = hub.curl(
            "GET",
            &format!("/v1/admin/jobs/{id}/output/stdout?offset={offset}"),
            Some(&admin),
            None,
        );
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("out of range"), "{body}");
    }
    let (status, body) = hub.curl(
        "GET",
        &format!("/v1/admin/jobs/{id}/output/stdout?offset=3"),
        Some(&admin),
        None,
    );
    assert_eq!((status, body.as_str()), (200, "de"));
    assert!(
        hub.curl("GET", "/v1/health", None, None).0 == 200,
        "the hub lives on"
    );
}

#[test]
fn the_jobs_of_a_revoked_agent_end_and_never_reach_an_agent_enrolled_again_under_its_id() {
    let mut f = Fleet::new(&[]);
    f.start_agent();
    let running = f.submit(&[], &["sleep", "600"]);
    f.wait_status(&running, "the job running", |v| v["state"] == "running");
    f.kill_agent();
    // Submitted while the agent is away: never sent to it.
    let waiting = f.submit(&[], &["true"]);
    f.hub().admin_ok(&["agent", "revoke", "a1"]);
    for (id, state) in [(&running, "lost"), (&waiting, "cancelled")] {
        let v = f.status(id);
        assert_eq!(
            (v["state"].as_str(), v["done"].as_bool()),
            (Some(state), Some(true)),
            "{v}"
        );
        assert_says(&v, "error", "revoked");
    }
    // Enrolled again under the same id (another host, say), deliberately: none of it is
    // handed over.
    let token = f.hub().enrol_again("a1");
    let (code, body) = f.hub().reconcile("a1", read_lossy(&token).trim(), 0);
    assert_eq!(code, 200, "{body}");
    let desired: Value = serde_json::from_str(&body).expect("json");
    assert!(
        desired["jobs"].as_array().is_none_or(|j| j.is_empty()),
        "{desired}"
    );
}

#[test]
fn the_hub_keeps_its_cap_of_a_stream_and_says_so() {
    let mut f = Fleet::new(&["--max-job-output", "1000"]);
    f.start_agent();
    let out = f.submit_output(&["--id", "big", "--wait"], &["seq", "1", "10000"]);
    assert_eq!(code(&out), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stdout was cut") && stderr.contains("first 1000 bytes"),
        "{stderr}"
    );
    let v = f.status("big");
    assert_eq!(v["stdout_stored"], 1000);
    assert_eq!(v["stdout_bytes"], seq_bytes(10_000).len());
    assert_says(&v["output_truncated"], "stdout", "48894");
    assert_eq!(f.logs("big", "stdout"), &seq_bytes(10_000)[..1000]);

    // A done job takes no more output, from its own agent either.
    let token = read_lossy(&f.token_file).trim().to_owned();
    let (status, body) = f.hub().curl(
        "PUT",
        "/v1/jobs/big/output/stdout?offset=48894",
        Some(&token),
        Some("EVIL"),
    );
    assert_eq!((status, body.as_str()), (200, r#"{"length":48894}"#));
    assert_eq!(f.logs("big", "stdout"), &seq_bytes(10_000)[..1000]);
    // Reading past what a done job's stream holds is an error, not an empty "complete".
    let admin = f.hub().admin_token();
    let (status, body) = f.hub().curl(
        "GET",
        "/v1/admin/jobs/big/output/stdout?offset=5000",
        Some(&admin),
        None,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("past the 1000 bytes"), "{body}");
}

#[test]
fn hub_job_commands_say_what_the_local_ones_say() {
    let mut f = Fleet::new(&[]);
    f.start_agent();
    // A program that is not there: the runner's reason, and 127, as `railgrid job` says.
    let out = f.submit_output(&["--wait"], &["nosuchprog"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), Some(127), "{err}");
    assert!(
        err.contains("nosuchprog") && err.contains("not found"),
        "{err}"
    );

    // Both streams, each where it belongs; --owner and limits reach the runner.
    let out = f.submit_output(
        &[
            "--id",
            "both",
            "--owner",
            "ci",
            "--open-files",
            "64",
            "--wait",
        ],
        &["sh", "-c", "echo out; echo err >&2; ulimit -n; exit 3"],
    );
    assert_eq!(
        code(&out),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let logs = f.jobs(&["logs", "both"]);
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "out\n64\n");
    assert_eq!(String::from_utf8_lossy(&logs.stderr), "err\n");
    let only = f.jobs(&["logs", "both", "--stderr"]);
    assert_eq!(
        (
            String::from_utf8_lossy(&only.stdout).as_ref(),
            String::from_utf8_lossy(&only.stderr).as_ref()
        ),
        ("err\n", ""),
        "one stream picked goes to stdout, as the local `job logs --stderr` prints it"
    );
    let rec = f.runner_job("both").expect("the runner's record");
    assert_eq!(rec["owner"], "ci", "{rec}");

    // A cancelled job shows the code a shell shows (143), not the signal's number.
    let id = f.submit(&["--id", "term"], &["sleep", "600"]);
    f.wait_status(&id, "running", |v| v["state"] == "running");
    succeeded(&f.jobs(&["cancel", &id]));
    f.wait_done(&id);
    let list = String::from_utf8_lossy(&f.jobs(&["list"]).stdout).into_owned();
    let row = list
        .lines()
        .find(|l| l.starts_with("term "))
        .expect("the row");
    assert!(row.split_whitespace().any(|c| c == "143"), "{list}");
    let status = String::from_utf8_lossy(&f.jobs(&["status", "term"]).stdout).into_owned();
    assert!(
        status.contains("exit (shell)     143")
            && status.contains("took")
            && status.contains("started"),
        "{status}"
    );

    // The data dir from the environment: no --data-dir to type.
    let out = railgrid()
        .env("RAILGRID_HUB_DATA_DIR", &f.hub_dir)
        .args(["hub", "job", "status", "both"])
        .output()
        .expect("status");
    succeeded(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("both"));
}
