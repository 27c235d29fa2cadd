//! Secrets kept at the hub (docs/security.md, "Secrets"): sealed in its database under a
//! key file beside it, given only to jobs whose agents are in their scope, masked in
//! every output, and at rest nowhere in plaintext.

use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;

use super::*;

const TOKEN: &str = "hub-tok-7c1e9b2f+Q/x";
const NEXT: &str = "hub-tok-next-5d3a80";
const KEY_LINE: &str = "MIIEpAIBAAKCAQEA7hub";

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The job's output never shows `value` nor its base64, and shows its masked form.
fn masked(out: &str, value: &str) {
    assert!(!out.contains(value), "{out}");
    assert!(!out.contains(&b64(value)), "{out}");
}

/// Runs on `hub` a job on a1 giving it `secrets`, printing what `script` prints; its
/// status once done.
fn run(hub: &TestHub, id: &str, secrets: &[&str], script: &str) -> Value {
    let mut args = vec!["job", "submit", "--agent", "a1", "--id", id];
    for s in secrets {
        args.extend(["--secret", s]);
    }
    args.extend(["--", "sh", "-c", script]);
    hub.admin_ok(&args);
    // Long enough for an agent to find a restarted hub again.
    wait_for(Duration::from_secs(90), &format!("job {id} done"), || {
        let v = hub.admin_json(&["job", "status", id]);
        (v["done"] == true).then_some(v)
    })
}

#[test]
fn a_hub_secret_reaches_only_jobs_in_its_scope_masked_and_is_never_at_rest_in_plaintext() {
    let tmp = tempdir();
    let hub_dir = tmp.path().join("hub");
    let (h, mut hub) = HubHost::enrolled(&hub_dir, "a1");
    hub.admin_ok(&["agent", "label", "a1", "queue=deploy"]);
    let mut agent = h.start_agent(&hub.url);
    h.host.wait_runner("a runner", |_| true);

    let value_file = tmp.path().join("token");
    fs::write(&value_file, format!("{TOKEN}\n")).expect("value");
    let key_file = tmp.path().join("key");
    fs::write(
        &key_file,
        format!("-----BEGIN KEY-----\n{KEY_LINE}\n-----END KEY-----\n"),
    )
    .expect("key");
    let vf = path_str(&value_file);
    // The token's set, again later with a new value.
    let set_token = [
        "secret",
        "set",
        "DEPLOY_TOKEN",
        "--from-file",
        &vf,
        "--select",
        "queue=deploy",
    ];
    hub.admin_ok(&set_token);
    let kf = path_str(&key_file);
    hub.admin_ok(&[
        "secret",
        "set",
        "DEPLOY_KEY",
        "--from-file",
        &kf,
        "--keep-newline",
        "--select",
        "queue=deploy",
    ]);
    hub.admin_ok(&["secret", "set", "ANYWHERE", "--from-file", &vf]);
    // Too short to mask safely: refused, saying the bound.
    let short = tmp.path().join("short");
    fs::write(&short, "abc").expect("short");
    exited_saying(
        &hub.admin(&["secret", "set", "SHORT", "--from-file", &path_str(&short)]),
        2,
        "at least 8",
    );
    // The key file: made at the first set, 0600, beside the database, not in it.
    let key = hub_dir.join("secrets.key");
    assert_eq!(
        fs::metadata(&key).expect("key file").permissions().mode() & 0o777,
        0o600
    );
    let list = hub.admin_json(&["secret", "list"]);
    assert_eq!(list.as_array().map(Vec::len), Some(3), "{list}");
    assert_eq!(list[1]["name"], "DEPLOY_KEY", "{list}");
    assert_eq!(list[1]["selector"], "queue=deploy", "{list}");
    assert_eq!(list[1]["set_by"], "root", "{list}");
    assert!(!list.to_string().contains(TOKEN) && !list.to_string().contains(KEY_LINE));

    let deployer = refused_at_submission(&hub, tmp.path(), &vf);
    given_and_masked(&hub, &deployer);

    // A relabelled agent is not sent a secret it no longer matches, though the job was
    // admitted while it did: the job fails at the hub, saying why.
    drop(agent);
    let out = hub.admin(&[
        "job",
        "submit",
        "--agent",
        "a1",
        "--id",
        "s2",
        "--secret",
        "DEPLOY_TOKEN",
        "--",
        "true",
    ]);
    succeeded(&out);
    hub.admin_ok(&["agent", "label", "a1", "queue=other"]);
    agent = h.start_agent(&hub.url);
    let v = wait_for(APPLIED, "job s2 done", || {
        let v = hub.admin_json(&["job", "status", "s2"]);
        (v["done"] == true).then_some(v)
    });
    assert_eq!(v["state"], "failed", "{v:#}");
    assert_says(
        &v,
        "error",
        "agent a1's hub labels no longer match: it was not sent",
    );
    hub.admin_ok(&["agent", "label", "a1", "queue=deploy"]);
    hub.admin_ok(&["secret", "rm", "ANYWHERE"]);
    exited_saying(
        &hub.admin(&["secret", "rm", "ANYWHERE"]),
        1,
        "no secret ANYWHERE",
    );

    // Rotation: every secret sealed anew under a new key file; jobs still get them.
    let before = fs::read(&key).expect("key");
    let old_id = list[0]["key"].clone();
    let rotated = hub.admin_json(&["secret", "rotate-key"]);
    assert_eq!(rotated["resealed"], 2, "{rotated}");
    assert_ne!(fs::read(&key).expect("key"), before);
    // The key it replaced is kept beside it, for backups of the database taken before.
    assert_eq!(
        fs::read(hub_dir.join("secrets.key.old")).expect("old key"),
        before
    );
    assert!(!hub_dir.join("secrets.key.new").exists());
    assert_ne!(hub.admin_json(&["secret", "list"])[0]["key"], old_id);
    let v = run(
        &hub,
        "s3",
        &["DEPLOY_TOKEN"],
        "printf '%s' \"$DEPLOY_TOKEN\" | sha256sum",
    );
    assert_eq!(v["state"], "succeeded", "{v:#}");
    let sum = |s: &str| {
        use sha2::Digest as _;
        format!("{:x}", sha2::Sha256::digest(s.as_bytes()))
    };
    assert!(hub
        .admin_ok(&["job", "logs", "s3"])
        .starts_with(&sum(TOKEN)));

    // kill -9 of the hub while a new value is being set: the old value or the new one
    // after its restart, never neither.
    fs::write(&value_file, NEXT).expect("next value");
    let mut setting = hub
        .admin_cmd(&set_token)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("set");
    hub.guard.signal(Signal::SIGKILL);
    hub.guard.wait_output(APPLIED);
    let _ = setting.wait();
    let listen = hub.listen.clone();
    hub = TestHub::start_on(&hub_dir, &listen, &[]);
    // The agent finds the hub again on its own (its backoff may be long).
    h.wait_status("the agent back", Duration::from_secs(90), |st| {
        st["hub"]["connected"] == true
    });
    let v = run(
        &hub,
        "s4",
        &["DEPLOY_TOKEN"],
        "printf '%s' \"$DEPLOY_TOKEN\" | sha256sum",
    );
    assert_eq!(v["state"], "succeeded", "{v:#}");
    let printed = hub.admin_ok(&["job", "logs", "s4"]);
    assert!(
        printed.starts_with(&sum(TOKEN)) || printed.starts_with(&sum(NEXT)),
        "{printed}"
    );

    // At rest nowhere: not in the hub's data dir (its database and log included), the
    // agent's state and log dirs (the runner's state is inside), nor any answer.
    drop(agent);
    at_rest_nowhere(&h, &hub, &hub_dir);

    // A hub started with another key file refuses to, naming the file.
    hub.stop();
    let other = tmp.path().join("other.key");
    write_private(&other, &format!("{}\n", "ab".repeat(32)));
    let out = railgrid()
        .args(["hub", "serve", "--data-dir"])
        .arg(&hub_dir)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--tls-self-signed",
            "--secrets-key-file",
        ])
        .arg(&other)
        .output()
        .expect("hub serve");
    let err = exited(&out, 2);
    assert!(
        err.contains(&path_str(&other)) && err.contains("sealed under key"),
        "{err}"
    );
}

/// The refusals at submission, and of a selected token; the token that may use the
/// deploy secrets.
fn refused_at_submission(hub: &TestHub, tmp: &Path, vf: &str) -> PathBuf {
    // Refused at submission: a selection that may reach agents outside the scope, an
    // agent outside it, a secret the hub does not have, and a token whose selection
    // does not hold the secret's scope.
    let out = hub.admin(&[
        "job",
        "submit",
        "--select",
        "os=linux",
        "--secret",
        "DEPLOY_TOKEN",
        "--",
        "true",
    ]);
    let err = exited(&out, 1);
    assert!(
        err.contains("only for agents matching queue=deploy"),
        "{err}"
    );
    let out = hub.admin(&[
        "job", "submit", "--agent", "a1", "--secret", "NOPE", "--", "true",
    ]);
    assert!(exited(&out, 1).contains("no secret NOPE"));
    let deployer = tmp.join("deployer.token");
    hub.create_token(
        "deployer",
        "jobs:submit,jobs:read",
        &["--select", "queue=deploy"],
        &deployer,
    );
    let out = hub.admin_with(
        &deployer,
        &[
            "job", "submit", "--agent", "a1", "--secret", "ANYWHERE", "--", "true",
        ],
    );
    let err = exited(&out, 1);
    assert!(
        err.contains("403") && err.contains("secret ANYWHERE may reach any agent"),
        "{err}"
    );

    // Nor may a selected token relabel an agent of its own into another secret's scope.
    hub.admin_ok(&[
        "secret",
        "set",
        "PROD_TOKEN",
        "--from-file",
        vf,
        "--select",
        "env=prod",
    ]);
    let labeller = tmp.join("labeller.token");
    hub.create_token(
        "labeller",
        "agents:write",
        &["--select", "queue=deploy"],
        &labeller,
    );
    let out = hub.admin_with(&labeller, &["agent", "label", "a1", "env=prod"]);
    let err = exited(&out, 1);
    assert!(
        err.contains("403") && err.contains("scope of secret PROD_TOKEN"),
        "{err}"
    );
    hub.admin_ok(&["secret", "rm", "PROD_TOKEN"]);
    deployer
}

/// A job given both deploy secrets, through the hub, shows them masked everywhere.
fn given_and_masked(hub: &TestHub, deployer: &Path) {
    // Given: a byte at a time with a pause between, in base64 at three alignments, and as
    // a 0400 file on the job's private tmpfs; every output shows it masked.
    let script = format!(
        r#"{PRINT_DEPLOY_TOKEN}
        stat -c %a "$RAILGRID_SECRETS_DIR/DEPLOY_KEY"
        cat "$RAILGRID_SECRETS_DIR/DEPLOY_KEY""#
    );
    let out = hub.admin_with(
        deployer,
        &[
            "job",
            "submit",
            "--agent",
            "a1",
            "--id",
            "s1",
            "--secret",
            "DEPLOY_TOKEN",
            "--secret",
            "DEPLOY_KEY=file",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    succeeded(&out);
    let v = wait_for(APPLIED, "job s1 done", || {
        let v = hub.admin_json(&["job", "status", "s1"]);
        (v["done"] == true).then_some(v)
    });
    assert_eq!(v["state"], "succeeded", "{v:#}");
    let stdout = hub.admin_ok(&["job", "logs", "s1"]);
    let stderr = hub.admin_ok(&["job", "logs", "s1", "--stderr"]);
    assert_deploy_token_masked(&stdout, &stderr);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[3], "400", "{stdout}");
    assert!(
        stdout.contains("***DEPLOY_KEY***") && !stdout.contains(KEY_LINE),
        "{stdout}"
    );
    masked(&format!("{stdout}{stderr}"), TOKEN);
    // The job's record names its secrets, never a value; the audit log names each use.
    assert_eq!(
        v["spec"]["secrets"],
        serde_json::json!(["DEPLOY_TOKEN"]),
        "{v}"
    );
    let audit = hub.admin_json(&["audit", "list"]).to_string();
    assert!(
        audit.contains("secrets sent with a job")
            && audit.contains("s1 to agent a1: DEPLOY_TOKEN, DEPLOY_KEY"),
        "{audit}"
    );
    // Each set and removal too, by name and version.
    for line in [
        "PUT /v1/admin/secrets/{name}",
        "DEPLOY_TOKEN version 1",
        "DELETE /v1/admin/secrets/{name}",
    ] {
        assert!(audit.contains(line), "{line}: {audit}");
    }
}

/// No value, nor its base64, in any file of the hub, the agent or its runner, nor in
/// any answer.
fn at_rest_nowhere(h: &HubHost, hub: &TestHub, hub_dir: &Path) {
    let hub_log = hub_dir.with_extension("log");
    for needle in [TOKEN, NEXT, KEY_LINE, &b64(TOKEN), &b64(NEXT)] {
        for dir in [hub_dir, &h.host.state(), &h.host.path("logs")] {
            let found = files_holding(dir, needle.as_bytes());
            assert!(found.is_empty(), "{needle} at rest in {found:?}");
        }
        assert!(
            !read_lossy(&hub_log).contains(needle),
            "{needle} in the hub's log"
        );
        for args in [
            &["job", "list"][..],
            &["job", "status", "s1"],
            &["audit", "list"],
            &["secret", "list"],
        ] {
            assert!(
                !hub.admin_json(args).to_string().contains(needle),
                "{needle} in {args:?}"
            );
        }
    }
}
