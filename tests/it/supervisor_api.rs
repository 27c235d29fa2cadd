//! The `Supervisor` library API, as the agent uses it.

use std::time::Duration;

use railgrid::supervisor::account::Account;
use railgrid::supervisor::{env, Config, Identity, State, Supervisor};

use crate::fixtures::*;

fn config(dir: &std::path::Path, script: &str) -> Config {
    let identity = if is_root() {
        Identity::User(Account::by_name("nobody").expect("nobody"))
    } else {
        Identity::Inherit
    };
    let account = match &identity {
        Identity::User(a) => a.clone(),
        Identity::Inherit => Account::current(),
    };
    let mut c = Config::new("test-child", "/bin/sh", dir.join("child.log"));
    c.args = vec!["-c".into(), script.into()];
    c.env = env::child_env(&account, None, None, &[]).expect("env");
    c.identity = identity;
    c.initial_backoff = Duration::from_millis(50);
    c.stop_grace = Duration::from_secs(2);
    c
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_starts_and_records_the_last_error() {
    let dir = tempdir();
    let sup = Supervisor::new(config(dir.path(), "exit 3")).expect("new");
    sup.start().await.expect("start");
    until("three starts", || sup.starts() >= 3).await;
    let err = sup.last_error().expect("last error");
    assert!(err.contains("exited with status 3"), "{err}");
    sup.stop().await;
    assert_eq!(sup.status().state, State::Stopped);
    let n = sup.starts();
    sup.stop().await; // stopping a stopped supervisor is a no-op
    assert_eq!(sup.starts(), n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_is_a_no_op_while_running_and_stop_reaps() {
    let dir = tempdir();
    let sup = Supervisor::new(config(dir.path(), "echo up; exec sleep 1000")).expect("new");
    let log = dir.path().join("child.log");
    let ups = || read_lossy(&log).matches("up").count();
    sup.start().await.expect("start");
    until("the child to print", || ups() == 1).await;
    let pid = sup.status().pid.expect("pid") as i32;
    for _ in 0..5 {
        sup.start().await.expect("start again");
    }
    assert_eq!(sup.starts(), 1);
    assert_eq!(sup.status().pid, Some(pid as u32));
    sup.stop().await;
    assert!(!sup.alive());
    assert!(!alive(pid), "child {pid} survived stop");

    // A supervisor can be started again after a stop, appending to the same log.
    sup.start().await.expect("restart");
    until("the second child to print", || ups() == 2).await;
    // Counted just after the spawn returns, which a busy machine may let the child outrun.
    until("the second start counted", || sup.starts() == 2).await;
    sup.stop().await;
}

#[test]
fn construction_refuses_what_it_must() {
    let dir = tempdir();
    let mut c = config(dir.path(), "true");
    c.program = "sh".into();
    assert!(Supervisor::new(c).is_err_and(|e| e.to_string().contains("not an absolute path")));

    let mut c = config(dir.path(), "true");
    c.dir = dir.path().join("missing");
    assert!(Supervisor::new(c).is_err_and(|e| e.to_string().contains("missing")));

    let mut c = config(dir.path(), "true");
    c.env.push(("LD_PRELOAD".into(), "/x.so".into()));
    assert!(Supervisor::new(c).is_err());

    let mut c = config(dir.path(), "true");
    c.identity = Identity::User(Account::numeric(0, 0));
    let err = Supervisor::new(c).err().expect("uid 0 refused");
    assert!(
        err.to_string().contains("root") || err.to_string().contains("only root can switch"),
        "{err}"
    );
}
