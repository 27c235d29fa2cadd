//! Secrets given to a job (docs/security.md, "Secrets"): in its environment, in no record,
//! answer, spool file or log line of the runner's, and masked in its output however it
//! prints them.

use super::*;

const VALUE: &str = "tok-3f9a1c2e+5b7d/QZ";
const KEY_LINE: &str = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC";
const KEY: &str = "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END KEY-----\n";

fn base64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[test]
fn a_secret_reaches_the_job_and_nothing_else_and_its_output_shows_it_masked() {
    let mut r = Runner::started(&[]);
    // A byte at a time, a pause between (each its own read of the pipe), then its base64
    // in three alignments, on both streams.
    let script = format!(
        r#"{PRINT_DEPLOY_TOKEN}
        echo "length ${{#DEPLOY_TOKEN}}"
        stat -c %a "$RAILGRID_SECRETS_DIR/DEPLOY_KEY"
        cat "$RAILGRID_SECRETS_DIR/DEPLOY_KEY"; echo
        grep -rl MIIEvQIBADAN "$HOME" || echo "not in the workspace""#
    );
    let file = r.dir.path().join("token");
    fs::write(&file, format!("{VALUE}\n")).expect("token file");
    let key_file = r.dir.path().join("key");
    fs::write(&key_file, KEY).expect("key file");
    let out = r
        .cli()
        .arg("submit")
        .arg("--secret-file")
        .arg(format!("DEPLOY_TOKEN={}", file.display()))
        .arg("--secret-mount")
        .arg(format!("DEPLOY_KEY={}", key_file.display()))
        .args(["--detach", "--", "sh", "-c", &script])
        .output()
        .expect("job submit");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_owned();
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "succeeded", "{rec}");
    assert_eq!(rec["spec"]["secrets"], json!(["DEPLOY_TOKEN"]), "{rec}");
    let stdout = r.output(&id, "stdout");
    let stderr = r.output(&id, "stderr");
    assert_deploy_token_masked(&stdout, &stderr);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[3],
        format!("length {}", VALUE.len()),
        "the job had it whole"
    );
    assert_eq!(
        lines[4..],
        ["400", "***DEPLOY_KEY***", "not in the workspace"],
        "{stdout}"
    );
    assert_eq!(rec["spec"]["secret_files"], json!(["DEPLOY_KEY"]), "{rec}");
    // The text status names them, and says what --env is.
    let status = r.cli().args(["status", &id]).output().expect("job status");
    let status = text(&status.stdout);
    assert!(
        status.contains("\nsecrets:  DEPLOY_TOKEN, DEPLOY_KEY\n"),
        "{status}"
    );
    let env = r
        .cli()
        .args(["submit", "--env", "API_TOKEN=plain", "--", "true"])
        .output()
        .expect("job submit --env");
    assert!(
        text(&env.stderr).contains("a credential belongs in a secret"),
        "{}",
        text(&env.stderr)
    );
    // Nowhere in the runner's answers, files or log.
    let listed = get(&r.socket(), "/v1/jobs").expect("list").1;
    for text in [&stdout, &stderr, &rec.to_string(), &listed] {
        assert!(!text.contains(KEY_LINE), "{text}");
        assert!(
            !text.contains(VALUE) && !text.contains(&base64(VALUE)),
            "{text}"
        );
    }
    r.guard.as_ref().expect("runner").signal(Signal::SIGTERM);
    let log = r.guard.as_mut().expect("runner").wait_output(LIMIT);
    for needle in [VALUE.to_owned(), base64(VALUE), KEY_LINE.to_owned()] {
        assert_eq!(
            files_holding(&r.state(), needle.as_bytes()),
            Vec::<String>::new(),
            "{needle}"
        );
        assert!(
            !text(&log.stderr).contains(&needle),
            "{}",
            text(&log.stderr)
        );
    }
}

#[test]
fn secrets_are_refused_unless_named_whole_and_long_enough_to_mask() {
    let r = Runner::started(&[]);
    let cases = [
        (
            json!({"argv": ["true"], "secrets": ["A_KEY"]}),
            "came without its value",
        ),
        (
            json!({"argv": ["true"], "secrets": ["A_KEY"], "secret_values": {"A_KEY": "short"}}),
            "at least 8",
        ),
        (
            json!({"argv": ["true"], "secret_values": {"A_KEY": "long enough value"}}),
            "not a secret the spec names",
        ),
        (
            json!({"argv": ["true"], "secrets": ["PATH"], "secret_values": {"PATH": "long enough value"}}),
            "the runner sets or refuses",
        ),
    ];
    for (spec, says) in cases {
        let (status, body) = r.submit(spec);
        assert_eq!(status, 400, "{body}");
        assert_says(&body["error"], "message", says);
    }
}

#[test]
fn a_job_admitted_by_a_runner_that_died_fails_rather_than_run_without_its_secrets_files_too() {
    // One job at a time, so the second one is still queued when the runner dies.
    let mut r = Runner::started(&["--max-jobs", "1"]);
    let first = submit_ok(&r, json!({"argv": ["sleep", "60"]}));
    wait_for(LIMIT, "the first job to run", || {
        (r.job(&first)["state"] == "running").then_some(())
    });
    let queued = submit_ok(
        &r,
        json!({"argv": ["true"], "secret_files": ["A_KEY"], "secret_values": {"A_KEY": VALUE}}),
    );
    let mut old = r.guard.take().expect("runner");
    old.signal(Signal::SIGKILL);
    let _ = old.wait_output(LIMIT);
    r.start(&[]);
    let rec = r.wait(&queued);
    assert_eq!(rec["state"], "failed", "{rec}");
    assert_says(&rec, "error", "held in this runner's memory only");
    assert_says(&rec, "error", "A_KEY");
    assert_eq!(r.wait(&first)["state"], "lost");
}
