//! Stops: the runner's stop budget, jobs that ignore SIGTERM, a stop as `agent status` shows it, an agent and runner killed with -9.

use super::*;

/// A job whose own process ignores SIGTERM (SIG_IGN survives exec), with a kill grace far
/// longer than any stop may take.
const STUBBORN: &str = r#"{"id":"stubborn","argv":["sh","-c","trap \"\" TERM; echo ready; exec sleep 1000"],"kill_grace_secs":120}"#;

/// Submits [`STUBBORN`], waits until it has set its trap, and returns its pid (the leader
/// of its group), which `guard` kills on drop should the test fail.
fn start_stubborn(host: &Host, guard: &mut Guard) -> i32 {
    let (code, body) = http(&host.socket(), "POST", "/v1/jobs", Some(STUBBORN)).expect("submit");
    assert_eq!(code, 201, "{body}");
    // The job may print before the runner has recorded its pid: wait for both.
    let pid = wait_for(LIMIT, "the stubborn job to be ready", || {
        let (_, out) = get(&host.socket(), "/v1/jobs/stubborn/output/stdout")?;
        let pid = get_json(&host.socket(), "/v1/jobs/stubborn")?["pid"].as_i64()?;
        (out == "ready\n").then_some(pid as i32)
    });
    guard.own_group(pid);
    pid
}

/// The record of the stubborn job, through a new agent's runner.
fn stubborn_record(host: &Host) -> (Guard, Value) {
    let mut agent = host.start_agent();
    host.wait_runner("a runner of a new agent", |_| true);
    let rec = wait_for(LIMIT, "the stubborn job's end", || {
        let rec = get_json(&host.socket(), "/v1/jobs/stubborn")?;
        let state = rec["state"].as_str()?;
        (!matches!(state, "queued" | "starting" | "running")).then_some(rec)
    });
    agent.signal(Signal::SIGTERM);
    let _ = agent.wait_output(LIMIT);
    (agent, rec)
}

#[test]
fn sigterm_ends_every_job_within_the_runner_stop_budget() {
    let host = Host::new();
    let mut agent = host.start_agent_with(&[("RAILGRID_RUNNER_STOP_GRACE", "3s")]);
    let pid = start_stubborn(&host, &mut agent);
    agent.signal(Signal::SIGTERM);
    let out = agent.wait_output(LIMIT);
    exited(&out, 0);
    assert!(
        live_in_group(pid).is_empty(),
        "the job's processes outlived the agent"
    );
    let runner_log = read_lossy(&host.path("logs/runner.log"));
    assert!(runner_log.contains("kill grace shortened"), "{runner_log}");

    let (_agent, rec) = stubborn_record(&host);
    assert_ended(&rec, "cancelled", "cut from 2m");
}

#[test]
fn the_agent_reaps_the_jobs_of_a_runner_that_could_not_stop_them() {
    let host = Host::new();
    // The process-group tier, whose only way to end such a job is the reap (in the cgroup
    // tier, `cgroup.kill` ends it first: a_delegated_agent_empties_the_runners_cgroup_tree…).
    let mut agent = Guard::new(
        host.agent_cmd(&[])
            .env("RAILGRID_RUNNER_DELEGATE_CGROUP", "false")
            .env("RAILGRID_RUNNER_STOP_GRACE", "1s")
            .spawn()
            .expect("spawn agent"),
    );
    let runner = host.wait_runner("a runner", |_| true);
    agent.own_group(runner);
    let pid = start_stubborn(&host, &mut agent);
    // A runner that cannot act on SIGTERM: the supervisor SIGKILLs it at stop_grace, and
    // only the agent's reap is left to end the job.
    kill(Pid::from_raw(runner), Signal::SIGSTOP).expect("SIGSTOP the runner");
    agent.signal(Signal::SIGTERM);
    let out = agent.wait_output(LIMIT);
    exited(&out, 0);
    assert!(!alive(runner), "the runner survived");
    assert!(
        live_in_group(pid).is_empty(),
        "the job's processes outlived the agent"
    );
    let reaped = host.status()["reaped"].clone();
    assert!(
        reaped.as_array().is_some_and(|r| r
            .iter()
            .any(|l| l.as_str().is_some_and(|l| l.contains("job stubborn")))),
        "{reaped}"
    );
    let out = agent_status(&host.state());
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("reaped after the runner stopped: job stubborn"),
        "{out:?}"
    );

    let (_agent, rec) = stubborn_record(&host);
    assert_eq!(rec["state"], "lost", "{rec}");
    assert_says(&rec, "error", "reap");
}

#[test]
fn after_a_kill_9_of_agent_and_runner_the_next_runner_serves_at_once() {
    let host = Host::new();
    let mut first = host.start_agent();
    let runner = host.wait_runner("a runner", |_| true);
    first.own_group(runner);
    let pid = start_stubborn(&host, &mut first);
    // As the OOM killer would: both at once, nothing gets to clean up.
    sigkill(first.pid());
    sigkill(runner);
    let _ = first.wait_output(LIMIT);
    wait_for(LIMIT, "the runner to die", || {
        (!alive(runner)).then_some(())
    });
    assert!(alive(pid), "the job outlives agent and runner");

    let mut agent = host.start_agent();
    agent.own_group(pid);
    let new_runner = host.wait_runner("a runner of the new agent", |_| true);
    agent.own_group(new_runner);
    // The leftover ignores SIGTERM and gets 10 s of grace: alive while health answers.
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    let still_alive = alive(pid);
    assert_eq!(health["reconciling"], true, "{health}");
    assert!(
        still_alive,
        "the runner served only after ending the leftover"
    );

    let rec = wait_for(LIMIT, "the leftover to be marked lost", || {
        let rec = get_json(&host.socket(), "/v1/jobs/stubborn")?;
        (rec["state"] == "lost").then_some(rec)
    });
    assert_error(&rec, "process group was killed");
    assert!(live_in_group(pid).is_empty(), "the leftover survived");
    wait_for(LIMIT, "health to say reconciliation is over", || {
        let h = get_json(&host.socket(), "/v1/health")?;
        (h["reconciling"] == false).then_some(())
    });
}

#[test]
fn agent_status_shows_a_stop_in_progress() {
    let host = Host::new();
    let mut agent = host.start_agent_with(&[("RAILGRID_RUNNER_STOP_GRACE", "5s")]);
    start_stubborn(&host, &mut agent);
    assert_eq!(host.status()["stopping"], false);
    agent.signal(Signal::SIGTERM);
    // The stubborn job holds the stop for its (cut) grace: the status says why meanwhile.
    wait_for(LIMIT, "agent status to show the stop", || {
        (host.status()["stopping"] == true).then_some(())
    });
    let out = agent_status(&host.state());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("stopping"), "{text}");
    let out = agent.wait_output(LIMIT);
    assert_eq!(out.status.code(), Some(0));
}
