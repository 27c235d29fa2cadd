//! What the agent trusts: its own bytes, its directories' owners, processes of its own account.

use super::*;

#[test]
fn the_agent_cannot_be_inspected_by_processes_of_its_own_account() {
    // The agent runs as an ordinary account (nobody when the test is root, else the
    // test's own), and a process of that same account tries to read its environment.
    let host = Host::new();
    let mut cmd = railgrid();
    cmd.args(["agent", "run", "--config"])
        .arg(host.path("agent.toml"))
        .arg("--state-dir")
        .arg(host.state())
        .env("RAILGRID_AGENT_TEST_SECRET", "s3cret")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let as_nobody = |cmd: &mut Command| {
        if is_root() {
            let nobody = uzers::get_user_by_name("nobody").expect("nobody");
            cmd.uid(nobody.uid()).gid(nobody.primary_group_id());
        }
    };
    as_nobody(&mut cmd);
    if is_root() {
        // Sticky, as /tmp: nobody may make its state dir here, and no one else may move it.
        fs::set_permissions(host.dir.path(), fs::Permissions::from_mode(0o1777)).expect("chmod");
    }
    let agent = Guard::new(cmd.spawn().expect("spawn agent"));
    host.wait_runner("a runner", |_| true);
    let mut reader = Command::new("cat");
    reader.arg(format!("/proc/{}/environ", agent.pid()));
    as_nobody(&mut reader);
    let out = reader.output().expect("cat");
    assert!(
        !out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("s3cret"),
        "the agent's environment was readable by its own account: {out:?}"
    );
}

/// The version `program version --json` reports.
fn reported_version(program: &Path) -> String {
    let out = fresh(|| Command::new(program).args(["version", "--json"]).output())
        .expect("version --json");
    assert!(out.status.success(), "version --json: {}", out.status);
    let v: Value = serde_json::from_slice(&out.stdout).expect("version json");
    v["version"].as_str().expect("version").to_owned()
}

/// Writes to `to` a copy of the test binary that reports another version (every digit of
/// its own version string made a 9, so the length stays; a real second build would take
/// minutes), and returns that version. The copy is checked to run and to report it.
fn build_of_another_version(to: &Path) -> String {
    let own = reported_version(Path::new(BIN));
    let other: String = own
        .chars()
        .map(|c| if c.is_ascii_digit() { '9' } else { c })
        .collect();
    assert_ne!(own, other, "version {own} has no digit to change");
    let mut bytes = fs::read(BIN).expect("read the binary");
    let (from, into) = (own.as_bytes(), other.as_bytes());
    let mut patched = 0;
    let mut i = 0;
    while i + from.len() <= bytes.len() {
        if &bytes[i..i + from.len()] == from {
            bytes[i..i + from.len()].copy_from_slice(into);
            patched += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    assert!(patched > 0, "version {own} not found in {BIN}");
    fs::write(to, &bytes).expect("write the other build");
    fs::set_permissions(to, fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_eq!(reported_version(to), other, "the patched copy must run");
    other
}

#[test]
fn a_runner_restarted_after_the_binary_was_replaced_runs_the_agents_own_bytes() {
    let host = Host::new();
    let bin = host.path("bin");
    fs::create_dir(&bin).expect("bin dir");
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).expect("chmod");
    let exe = bin.join("railgrid");
    fs::copy(BIN, &exe).expect("copy the binary");
    let own = reported_version(&exe);
    let staged = bin.join(".railgrid.new");
    let other = build_of_another_version(&staged);

    let _agent = Guard::new(fresh(|| host.agent_cmd_from(&exe, &[]).spawn()).expect("spawn agent"));
    let first = host.wait_runner("the first runner", |_| true);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(health["version"], own.as_str());

    // Replaced the way package managers do it: a rename over the path.
    fs::rename(&staged, &exe).expect("replace the binary");
    assert_eq!(reported_version(&exe), other);
    sigkill(first);
    let second = host.wait_runner("a restarted runner", |st| st["runner"]["starts"] == 2);
    assert_ne!(first, second);
    let health = get_json(&host.socket(), "/v1/health").expect("health");
    assert_eq!(
        health["version"],
        own.as_str(),
        "the restarted runner must run the agent's bytes, not the file now at {}",
        exe.display()
    );

    // The status names the pinned file: the original bytes, not what the path holds now.
    let out = railgrid()
        .args(["agent", "status", "--json", "--state-dir"])
        .arg(host.state())
        .output()
        .expect("status");
    let st: Value = serde_json::from_slice(&out.stdout).expect("status json");
    let sha = sha256_hex(Path::new(BIN));
    assert_eq!(st["exe"]["sha256"], sha.as_str(), "{st}");
    assert_eq!(
        st["exe"]["size"],
        fs::metadata(BIN).expect("the binary").len()
    );
    assert_eq!(
        st["exe"]["path"],
        path_str(&fs::canonicalize(&exe).expect("canonical")).as_str()
    );
    let out = agent_status(&host.state());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("executable: {}", exe.display())) && text.contains(&sha),
        "{text}"
    );
}

#[test]
fn a_state_dir_below_a_directory_another_account_controls_is_refused() {
    let host = Host::new();
    // Writable by everyone and not sticky: anyone could rename the state dir away and put
    // their own in its place.
    let open = host.path("open");
    fs::create_dir(&open).expect("mkdir");
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).expect("chmod");
    let user: &[&str] = if is_root() {
        &["--runner-user", "nobody"]
    } else {
        &[]
    };
    let err = host.refused_start(&open.join("state"), user);
    assert!(
        err.contains("others may write to it") && err.contains(&path_str(&open)),
        "{err}"
    );
    assert_empty(&open);
}
