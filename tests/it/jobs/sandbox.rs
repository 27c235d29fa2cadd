//! Every job in a sandbox of its own (docs/security.md, "A sandbox for every job"), run by
//! a real runner as `nobody` (as root) or as the test's own account: what one job leaves
//! the next never sees, a job sees its own processes only and the host read-only, what
//! leaves its process group dies with it even in the process-group tier, its seccomp
//! filter refuses the kernel's keyring, a real build still works, and `required` refuses
//! jobs where the kernel refuses namespaces.

use super::*;

/// The sandbox a runner's health says it gives.
fn sandbox_of(r: &Runner) -> String {
    get_json(&r.socket(), "/v1/health").expect("health")["sandbox"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Runs `script` as a job of `r` to its end; its record and stdout.
fn run(r: &Runner, script: &str) -> (Value, String) {
    let id = submit_ok(r, json!({"argv": ["sh", "-c", script]}));
    let rec = r.wait(&id);
    let out = r.output(&id, "stdout");
    (rec, out)
}

/// Host processes whose command line holds `marker`.
fn host_processes_with(marker: &str) -> Vec<i32> {
    fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

#[test]
fn one_job_never_sees_what_another_left_nor_other_processes_nor_a_writable_host() {
    let r = Runner::started(&[]);
    assert_eq!(sandbox_of(&r), "namespaces+seccomp");
    // A host directory the runner's account may write, outside the scratch directories
    // every job gets a fresh one of: read-only in the sandbox.
    let open = tempfile::Builder::new()
        .prefix("open")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a directory in the target's");
    fs::set_permissions(open.path(), fs::Permissions::from_mode(0o777)).expect("chmod");

    // Job 1 plants in every shared scratch directory, and runs on with a secret.
    let planted = r#"for d in /tmp /var/tmp /dev/shm; do echo implant > $d/implant && echo "in $d"; done
        echo planted; exec sh -c 'sleep 1000; :' s3cr3t-first"#;
    let first = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", planted], "env": {"FIRST_SECRET": "s3cr3t-first"}}),
    );
    wait_for(LIMIT, "job 1 planted", || {
        (r.output(&first, "stdout") == "in /tmp\nin /var/tmp\nin /dev/shm\nplanted\n").then_some(())
    });
    let rec = wait_for(LIMIT, "job 1's start recorded", || {
        let rec = r.job(&first);
        rec["confinement"].is_string().then_some(rec)
    });
    assert!(
        rec["confinement"]
            .as_str()
            .is_some_and(|c| c.starts_with("sandbox+")),
        "{rec}"
    );

    // Job 2 finds none of it, sees its own processes only, and writes nothing outside
    // its workspace.
    let script = format!(
        r#"for d in /tmp /var/tmp /dev/shm; do test -e $d/implant && echo "seen in $d"; done
        set -- /proc/[0-9]*; echo "processes: $#"
        printf 's3cr3t-%s\n' first > "$HOME/pattern"
        grep -l -f "$HOME/pattern" /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | sed 's/^/secret in /'
        touch {open}/written 2>&1 | grep -q 'Read-only file system' && echo read-only
        touch /usr/written 2>&1 | grep -q 'Read-only file system' && echo usr-read-only
        echo "host: $(hostname)"
        touch "$HOME/mine" && echo workspace-writable"#,
        open = open.path().display()
    );
    let (rec, out) = run(&r, &script);
    assert_eq!(rec["state"], "succeeded", "{rec} {out}");
    assert!(!out.contains("seen in"), "{out}");
    assert!(!out.contains("secret in"), "{out}");
    // Its PID 1 and the shell (the glob forks nothing).
    assert!(out.contains("processes: 2\n"), "{out}");
    assert!(
        out.contains("read-only\n") && out.contains("usr-read-only\n"),
        "{out}"
    );
    assert!(out.contains("host: job-"), "{out}");
    assert!(out.contains("workspace-writable"), "{out}");
    assert!(
        fs::read_dir(open.path())
            .expect("open dir")
            .next()
            .is_none(),
        "a write reached the host"
    );
    let (status, _) = http(
        &r.socket(),
        "POST",
        &format!("/v1/jobs/{first}/cancel"),
        None,
    )
    .expect("cancel");
    assert_eq!(status, 200);
    r.wait(&first);
}

#[test]
fn what_leaves_the_group_dies_with_the_job_and_the_kernel_keyring_is_refused() {
    // The process-group tier: no cgroup of the runner's own.
    let r = Runner::started(&[]);
    assert_eq!(sandbox_of(&r), "namespaces+seccomp");
    let marker = format!("1{}.25", std::process::id());
    let escape = format!(
        r#"setsid sh -c 'trap "" TERM; exec sleep {marker}' &
        sh -c 'sh -c "exec sleep {marker}" & exit' &
        echo ready; wait"#
    );
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", escape], "kill_grace_secs": 1}),
    );
    wait_for(LIMIT, "the escapees running", || {
        (r.output(&id, "stdout") == "ready\n" && host_processes_with(&marker).len() >= 2)
            .then_some(())
    });
    let (status, _) =
        http(&r.socket(), "POST", &format!("/v1/jobs/{id}/cancel"), None).expect("cancel");
    assert_eq!(status, 200);
    let rec = r.wait(&id);
    assert_eq!(rec["state"], "cancelled", "{rec}");
    wait_for(LIMIT, "the escapees gone with their job", || {
        host_processes_with(&marker).is_empty().then_some(())
    });

    // A fork bomb stays within its limit (its processes end with it).
    let bomb = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", "b() { b | b & }; b; sleep 2"], "limits": {"processes": 64},
               "timeout_secs": 5}),
    );
    r.wait(&bomb);

    // The seccomp filter: the kernel keyring (keyctl, 250 on x86_64) and a user
    // namespace of the job's own are refused.
    let keyctl = match std::env::consts::ARCH {
        "aarch64" => 219,
        _ => 250,
    };
    let script = format!(
        r#"perl -e 'syscall({keyctl}, 0, 0, 0, 0, 0); print $!+0, "\n"'
        unshare -U true 2>/dev/null || echo no-userns"#
    );
    let (rec, out) = run(&r, &script);
    assert_eq!(rec["state"], "succeeded", "{rec}");
    assert_eq!(
        out, "1\nno-userns\n",
        "EPERM (1) for keyctl, no user namespace"
    );
}

#[test]
fn a_real_build_runs_in_the_sandbox_from_a_shared_checkout() {
    // A local repository, in a directory the operator shares with every job.
    let shared = tempdir();
    fs::set_permissions(shared.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let repo = shared.path().join("hello");
    fs::create_dir(&repo).expect("repo");
    fs::write(
        repo.join("hello.c"),
        "#include <stdio.h>\nint main(void) { puts(\"hello, world\"); return 0; }\n",
    )
    .expect("hello.c");
    fs::write(
        repo.join("Makefile"),
        "test: hello\n\ttest \"$$(./hello)\" = \"hello, world\" && echo '1 test passed'\nhello: hello.c\n\tcc -O2 -o hello hello.c\n",
    )
    .expect("Makefile");
    for args in [
        vec!["init", "-q"],
        vec!["add", "."],
        vec![
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "hello",
        ],
    ] {
        run_ok(Command::new("git").arg("-C").arg(&repo).args(args), "git");
    }
    chown_runner_dir(shared.path());
    let shared_s = path_str(shared.path());
    let r = Runner::started(&["--sandbox-shared", &shared_s]);
    let script = format!(
        "git clone -q {} src && cd src && make -s test",
        repo.display()
    );
    let (rec, out) = run(&r, &script);
    assert_eq!(rec["state"], "succeeded", "{rec}");
    assert!(out.ends_with("1 test passed\n"), "{out}");
    // Its record names what it shares with every other job.
    let confinement = rec["confinement"].as_str().unwrap_or_default();
    assert!(confinement.starts_with("sandbox+"), "{rec}");
    assert!(
        confinement.ends_with(&format!("; shared: {shared_s}")),
        "{rec}"
    );
}

#[test]
fn a_rust_crate_is_tested_in_the_sandbox_with_a_toolchain_under_opt() {
    if !requires_root("binds the test's own Rust toolchain under /opt") {
        return;
    }
    // This build's toolchain, where an operator installs one for every account.
    let out = run_ok(Command::new("rustc").args(["--print", "sysroot"]), "rustc");
    let sysroot = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let opt = tempfile::Builder::new()
        .prefix("railgrid-rust")
        .tempdir_in("/opt")
        .expect("a directory in /opt");
    fs::set_permissions(opt.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let _toolchain = Mounted::bind(&sysroot, opt.path());

    let r = Runner::started(&[]);
    let script = r#"mkdir -p src
        printf '[package]\nname = "adder"\nversion = "0.1.0"\nedition = "2021"\n' > Cargo.toml
        printf 'pub fn add(a: u32, b: u32) -> u32 { a + b }\n#[test]\nfn adds() { assert_eq!(add(2, 2), 4); }\n' > src/lib.rs
        cargo test --offline 2>&1"#;
    let path = format!("{}/bin:/usr/bin:/bin", opt.path().display());
    let id = submit_ok(
        &r,
        json!({"argv": ["sh", "-c", script], "env": {"PATH": path}, "timeout_secs": 300}),
    );
    let rec = r.wait(&id);
    let out = r.output(&id, "stdout");
    assert_eq!(rec["state"], "succeeded", "{rec} {out}");
    assert!(out.contains("test result: ok. 1 passed"), "{out}");
    assert_says(&rec, "confinement", "sandbox+");
}

#[test]
fn where_the_kernel_refuses_namespaces_jobs_run_as_before_or_are_refused_as_required() {
    // The runner itself in a user namespace that may make no other (bubblewrap's
    // --disable-userns), as a host whose sysctl or AppArmor refuses them.
    let without_userns = |r: &mut Runner, mode: &str| {
        let mut cmd = Command::new("bwrap");
        cmd.args(["--dev-bind", "/", "/", "--unshare-user", "--disable-userns"])
            .args(["--die-with-parent", "--"])
            .arg(env!("CARGO_BIN_EXE_railgrid"))
            .args(["runner", "run", "--sandbox", mode, "--state-dir"])
            .arg(r.state())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_runner_user(&mut cmd);
        // The runner is bubblewrap's child: its health answers with another pid.
        r.guard = Some(Guard::new(cmd.spawn().expect("bwrap")));
        wait_for(LIMIT, "the runner in bubblewrap to answer", || {
            get_json(&r.socket(), "/v1/health").map(drop)
        });
    };
    let mut r = Runner::new();
    without_userns(&mut r, "auto");
    let said = sandbox_of(&r);
    assert!(
        said.starts_with("none: ") && said.contains("user namespace"),
        "{said}"
    );
    let (rec, out) = run(&r, "echo ran");
    assert_eq!(out, "ran\n");
    assert_says(&rec, "confinement", "no sandbox: ");
    drop(r);

    let mut r = Runner::new();
    without_userns(&mut r, "required");
    let (status, body) = r.submit(json!({"argv": ["true"]}));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "no_sandbox", "{body}");
    assert_says(&body["error"], "message", "runner.sandbox = \"required\"");
}
