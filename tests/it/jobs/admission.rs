//! Admission limits changed on a running runner, and the byte budget of finished jobs.

use super::*;

/// A job that runs until it is stopped, and says when it runs.
fn long_job(id: &str) -> Value {
    json!({"id": id, "argv": ["sh", "-c", "echo ready; exec sleep 1000"], "kill_grace_secs": 1})
}

/// Waits until job `id` (a [`long_job`]) runs, and returns its pid, which leads its group;
/// the runner's guard kills that group if the test fails.
fn wait_ready(r: &mut Runner, id: &str) -> i32 {
    let pid = r.pid_when_printed(id, "ready\n");
    r.guard.as_mut().expect("runner").own_group(pid);
    pid
}

fn admission_of(r: &Runner) -> Value {
    get_json(&r.socket(), "/v1/admission").expect("GET /v1/admission")
}

fn put_admission(r: &Runner, body: &str) -> (u16, Value) {
    let (status, body) =
        http(&r.socket(), "PUT", "/v1/admission", Some(body)).expect("PUT /v1/admission");
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// (jobs_running, jobs_queued) of `/v1/health`.
fn job_counts(r: &Runner) -> (u64, u64) {
    let h = get_json(&r.socket(), "/v1/health").expect("health");
    let count = |k: &str| h[k].as_u64().unwrap_or_else(|| panic!("{k} in {h}"));
    (count("jobs_running"), count("jobs_queued"))
}

fn limits(max_jobs: u64, max_jobs_per_owner: u64, max_queued: u64) -> Value {
    json!({"max_jobs": max_jobs, "max_jobs_per_owner": max_jobs_per_owner, "max_queued": max_queued})
}

#[test]
fn raising_max_jobs_starts_a_queued_job_at_once_and_leaves_the_running_one_alone() {
    let mut r = Runner::started(&["--max-jobs", "1"]);
    let runner_pid = r.guard.as_ref().expect("runner").pid();
    submit_ok(&r, long_job("first"));
    let first = wait_ready(&mut r, "first");
    let first_started = r.job("first")["started_ms"].clone();
    submit_ok(&r, long_job("second"));
    assert_eq!(r.job("second")["state"], "queued");
    assert_eq!(job_counts(&r), (1, 1));
    // Without --max-jobs-per-owner, the per-owner limit is max_jobs, and follows it.
    assert_eq!(admission_of(&r), limits(1, 1, 1000));

    let (status, body) = put_admission(&r, r#"{"max_jobs": 2}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, limits(2, 2, 1000));
    let second = wait_ready(&mut r, "second");
    assert_ne!(first, second);

    let rec = r.job("first");
    assert_eq!(rec["state"], "running", "{rec}");
    assert_eq!(rec["pid"], first, "{rec}");
    assert_eq!(rec["started_ms"], first_started, "{rec}");
    assert!(alive(first), "the running job was disturbed");
    assert_eq!(r.output("first", "stdout"), "ready\n");
    let h = get_json(&r.socket(), "/v1/health").expect("health");
    assert_eq!(h["pid"], runner_pid, "the runner restarted: {h}");
    assert_eq!(job_counts(&r), (2, 0));
    assert_eq!(admission_of(&r), limits(2, 2, 1000));
}

#[test]
fn lowering_max_jobs_stops_no_running_job_and_holds_new_starts() {
    let mut r = Runner::started(&["--max-jobs", "2"]);
    submit_ok(&r, long_job("a"));
    submit_ok(&r, long_job("b"));
    let a = wait_ready(&mut r, "a");
    let b = wait_ready(&mut r, "b");

    let (status, body) = put_admission(&r, r#"{"max_jobs": 1}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, limits(1, 1, 1000));
    for (id, pid) in [("a", a), ("b", b)] {
        let rec = r.job(id);
        assert_eq!(rec["state"], "running", "{rec}");
        assert_eq!(rec["pid"], pid, "{rec}");
        assert!(alive(pid), "job {id} was stopped by a lower limit");
    }
    // Scheduling runs within the submission: a job that could start has by now.
    submit_ok(&r, json!({"id": "c", "argv": ["echo", "c-ran"]}));
    assert_eq!(job_counts(&r), (2, 1));

    // One ends: one runs, which is the limit, so c still waits.
    let (status, _) = http(&r.socket(), "POST", "/v1/jobs/a/cancel", None).expect("cancel");
    assert_eq!(status, 200);
    assert_eq!(r.wait("a")["state"], "cancelled");
    wait_for(LIMIT, "a to leave the scheduler", || {
        (job_counts(&r).0 == 1).then_some(())
    });
    submit_ok(&r, json!({"id": "d", "argv": ["echo", "d-ran"]}));
    assert_eq!(job_counts(&r), (1, 2));
    assert_eq!(r.job("c")["state"], "queued");
    assert_eq!(r.job("b")["pid"], b);

    // Under the new limit: the queue runs, one job at a time.
    let (status, _) = http(&r.socket(), "POST", "/v1/jobs/b/cancel", None).expect("cancel");
    assert_eq!(status, 200);
    assert_eq!(r.wait("c")["state"], "succeeded");
    assert_eq!(r.wait("d")["state"], "succeeded");
    assert_eq!(r.output("c", "stdout"), "c-ran\n");
    assert_eq!(job_counts(&r), (0, 0));
}

#[test]
fn lowering_max_queued_keeps_queued_jobs_and_refuses_new_ones_until_the_queue_drains() {
    let mut r = Runner::started(&["--max-jobs", "1"]);
    submit_ok(&r, long_job("hold"));
    wait_ready(&mut r, "hold");
    for i in 0..3 {
        submit_ok(&r, json!({"id": format!("q-{i}"), "argv": ["true"]}));
    }
    let (status, body) = put_admission(&r, r#"{"max_queued": 1}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, limits(1, 1, 1));
    assert_eq!(job_counts(&r), (1, 3), "accepted jobs were dropped");
    let (status, body) = r.submit(json!({"argv": ["true"]}));
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "queue_full");

    let (status, _) = http(&r.socket(), "POST", "/v1/jobs/hold/cancel", None).expect("cancel");
    assert_eq!(status, 200);
    for i in 0..3 {
        assert_eq!(r.wait(&format!("q-{i}"))["state"], "succeeded");
    }
    let id = submit_ok(&r, json!({"argv": ["true"]}));
    assert_eq!(r.wait(&id)["state"], "succeeded");
}

#[test]
fn a_bad_admission_change_is_refused_naming_the_field_and_changes_nothing() {
    let r = Runner::started(&["--max-jobs", "2", "--max-queued", "5"]);
    let before = limits(2, 2, 5);
    for (body, code, field) in [
        (r#"{"max_jobs": 0}"#, "invalid_admission", "max_jobs"),
        (
            r#"{"max_jobs": 3, "max_jobs_per_owner": 0}"#,
            "invalid_admission",
            "max_jobs_per_owner",
        ),
        (r#"{"max_jobs": -1}"#, "invalid_json", "max_jobs"),
        (r#"{"max_queued": "ten"}"#, "invalid_json", "max_queued"),
        ("{not json", "invalid_json", "invalid admission change"),
    ] {
        let (status, resp) = put_admission(&r, body);
        assert_eq!(status, 400, "{body}: {resp}");
        assert_eq!(resp["error"]["code"], code, "{body}: {resp}");
        let message = resp["error"]["message"].as_str().expect("message");
        assert!(message.contains(field), "{body}: {message}");
        assert_eq!(admission_of(&r), before, "{body} changed the limits");
    }
    // Unknown fields are ignored; a field left out keeps its value.
    let (status, resp) = put_admission(&r, r#"{"max_queued": 0, "max_cpus": 9}"#);
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp, limits(2, 2, 0));
    assert_eq!(admission_of(&r), limits(2, 2, 0));
    assert_eq!(r.submit(json!({"argv": ["true"]})).0, 429);

    // Like every route but health, both need the token.
    for method in ["GET", "PUT"] {
        let (status, body) =
            http_with(&r.socket(), method, "/v1/admission", Some("{}"), None).expect("request");
        assert_eq!(status, 401, "{method}: {body}");
    }
}

#[test]
fn the_client_reads_and_changes_the_admission_limits() {
    use railgrid::proto::admission::{Admission, AdmissionChange};
    use railgrid::runner::client::ClientError;
    let r = Runner::started(&["--max-jobs", "1", "--max-jobs-per-owner", "1"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = railgrid::runner::client::Client::new(&r.socket());
    let first = rt.block_on(client.admission()).expect("admission");
    assert_eq!(
        first,
        Admission {
            max_jobs: 1,
            max_jobs_per_owner: 1,
            max_queued: 1000
        }
    );
    let change = AdmissionChange {
        max_jobs: Some(4),
        max_queued: Some(7),
        ..AdmissionChange::default()
    };
    let changed = rt.block_on(client.set_admission(&change)).expect("set");
    // A per-owner limit given by flag stays: only what the change names moves.
    let want = Admission {
        max_jobs: 4,
        max_jobs_per_owner: 1,
        max_queued: 7,
    };
    assert_eq!(changed, want);
    assert_eq!(rt.block_on(client.admission()).expect("admission"), want);
    let zero = AdmissionChange {
        max_jobs_per_owner: Some(0),
        ..AdmissionChange::default()
    };
    match rt.block_on(client.set_admission(&zero)) {
        Err(ClientError::Api {
            status: 400,
            code,
            message,
        }) => {
            assert_eq!(code, "invalid_admission");
            assert!(message.contains("max_jobs_per_owner"), "{message}");
        }
        other => panic!("a per-owner limit of 0 was not refused: {other:?}"),
    }
    assert_eq!(rt.block_on(client.admission()).expect("admission"), want);
}

/// Workspaces count: a build's checkout and artifacts stay in its workspace, and kept
/// spools alone let a handful of builds fill a disk. Past `--max-kept-bytes` the oldest
/// finished jobs go, never a running one; `job prune` deletes by hand.
#[test]
fn finished_jobs_keep_at_most_their_byte_budget_and_prune_deletes_them() {
    let r = Runner::started(&["--max-kept-bytes", &(5u64 << 20).to_string()]);
    // A running job whose workspace is larger than the budget on its own.
    let running = submit_ok(
        &r,
        json!({"id": "running", "argv": ["sh", "-c", "head -c 6291456 /dev/zero > big; echo ready; sleep 1000"]}),
    );
    wait_for(LIMIT, "the running job's file", || {
        r.output(&running, "stdout").contains("ready").then_some(())
    });
    for n in 0..4 {
        let id = submit_ok(
            &r,
            json!({"id": format!("build-{n}"), "argv": ["sh", "-c", "head -c 2097152 /dev/zero > artifact"]}),
        );
        assert_eq!(r.wait(&id)["state"], "succeeded");
    }
    let health = wait_for(LIMIT, "retention within the budget", || {
        let h = get_json(&r.socket(), "/v1/health")?;
        (h["kept_bytes"].as_u64()? <= 5 << 20).then_some(h)
    });
    assert_eq!(health["max_kept_bytes"], 5u64 << 20, "{health}");
    let work = r.runner_dir().join("work");
    assert!(!work.join("build-0").exists(), "the oldest went");
    assert!(
        work.join("build-3").join("artifact").exists(),
        "the newest stays"
    );
    assert!(
        work.join("running").join("big").exists(),
        "a running job's workspace stays"
    );

    let out = r
        .cli()
        .args(["prune", "--keep", "0"])
        .output()
        .expect("prune");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("deleted") && text.contains("freed"), "{text}");
    assert!(!work.join("build-3").exists(), "pruned");
    assert!(
        work.join("running").join("big").exists(),
        "never a running job's"
    );
    let health = get_json(&r.socket(), "/v1/health").expect("health");
    assert_eq!(health["finished_jobs"], 0, "{health}");
    http(
        &r.socket(),
        "POST",
        &format!("/v1/jobs/{running}/cancel"),
        None,
    )
    .expect("cancel");
    r.wait(&running);
}
