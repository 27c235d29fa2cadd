//! `railgrid agent install | uninstall` into image directories (`--root`): what an image
//! alone can show. The files written and removed, byte for byte, the rendered unit
//! checked by `systemd-analyze verify` for each prefix, the account created with the
//! real `useradd`, and the refusals. What systemd does with the unit (the start, the
//! order of stop and replace, restarts, the watchdog, uninstall) is tested against a
//! real systemd in tests/it/systemd.rs and tests/it/systemd_upgrade.rs.

mod image;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::fixtures::*;

fn install(args: &[&str]) -> Output {
    railgrid()
        .args(["agent", "install"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("agent install")
}

/// `agent install --root ROOT ARGS`: an install into the image at `root`.
fn install_at(root: &str, args: &[&str]) -> Output {
    let mut all = vec!["--root", root];
    all.extend_from_slice(args);
    install(&all)
}

fn uninstall(args: &[&str]) -> Output {
    railgrid()
        .args(["agent", "uninstall"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("agent uninstall")
}

/// Everything under `dir`: path → (mode, uid, size, inode, mtime, contents' hash).
type Snapshot = BTreeMap<PathBuf, (u32, u32, u64, u64, i64, String)>;

fn snapshot(dir: &Path) -> Snapshot {
    use sha2::Digest;
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            let meta = fs::symlink_metadata(&path).expect("lstat");
            let hash = if meta.is_file() {
                format!("{:x}", sha2::Sha256::digest(fs::read(&path).expect("read")))
            } else {
                String::new()
            };
            if meta.is_dir() {
                todo.push(path.clone());
            }
            let rel = path.strip_prefix(dir).expect("under dir").to_owned();
            out.insert(
                rel,
                (
                    meta.mode(),
                    meta.uid(),
                    meta.len(),
                    meta.ino(),
                    meta.mtime(),
                    hash,
                ),
            );
        }
    }
    out
}

/// A snapshot without inodes and times: what a restored directory must equal.
fn contents(s: &Snapshot) -> BTreeMap<PathBuf, (u32, u32, u64, String)> {
    s.iter()
        .map(|(p, (m, u, l, _, _, h))| (p.clone(), (*m, *u, *l, h.clone())))
        .collect()
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// A minisign public key line, made by `railgrid release keygen`.
fn trusted_key(dir: &Path) -> String {
    let (sk, pk) = (dir.join("rel.key"), dir.join("rel.pub"));
    succeeded(
        &railgrid()
            .args(["release", "keygen", "--secret-key"])
            .arg(&sk)
            .arg("--public-key")
            .arg(&pk)
            .output()
            .expect("keygen"),
    );
    read_lossy(&pk)
        .lines()
        .nth(1)
        .expect("the key line")
        .to_owned()
}

/// An image directory that already has an /etc of its own (which must survive).
fn image(parent: &Path) -> PathBuf {
    let root = parent.join("image");
    fs::create_dir_all(root.join("etc")).expect("image");
    fs::write(root.join("etc/hostname"), "image\n").expect("hostname");
    root
}

#[test]
fn install_into_an_image_writes_every_file_and_uninstall_purge_leaves_it_as_it_was() {
    let dir = tempdir();
    let root = image(dir.path());
    let before = snapshot(&root);
    let token = dir.path().join("token.in");
    fs::write(&token, "tok-123\n").expect("token");
    let ca = dir.path().join("ca.pem");
    let params = rcgen::CertificateParams::new(vec!["hub.example".to_owned()]).expect("params");
    let cert = params
        .self_signed(&rcgen::KeyPair::generate().expect("key"))
        .expect("cert");
    fs::write(&ca, cert.pem()).expect("ca");
    let key = trusted_key(dir.path());
    let r = path_str(&root);
    let said = succeeded(&install_at(
        &r,
        &[
            "--hub",
            "https://hub.example:8443",
            "--agent-id",
            "build-17",
            "--token-file",
            &path_str(&token),
            "--ca-file",
            &path_str(&ca),
            "--trusted-key",
            &key,
            "--runner-user",
            "nobody",
        ],
    ));
    assert!(said.contains("installed"), "{said}");
    assert!(
        !said.contains("tok-123"),
        "the token is never printed: {said}"
    );

    // The binary: these bytes, executable.
    let bin = root.join("usr/local/bin/railgrid");
    assert_eq!(fs::read(&bin).expect("binary"), fs::read(BIN).expect("BIN"));
    assert_eq!(mode(&bin), 0o755);
    // The config: 0600, the flags' values, and an agent can load it.
    let config = root.join("etc/railgrid/agent.toml");
    assert_eq!(mode(&config), 0o600);
    assert_eq!(mode(&root.join("etc/railgrid")), 0o700);
    let text = read_lossy(&config);
    let value: toml::Value = toml::from_str(&text).expect("TOML");
    assert_eq!(value["runner"]["user"].as_str(), Some("nobody"));
    assert_eq!(
        value["hub"]["url"].as_str(),
        Some("https://hub.example:8443")
    );
    assert_eq!(value["hub"]["agent_id"].as_str(), Some("build-17"));
    assert_eq!(
        value["hub"]["token_file"].as_str(),
        Some("/etc/railgrid/token")
    );
    assert_eq!(
        value["hub"]["ca_file"].as_str(),
        Some("/etc/railgrid/hub-ca.pem")
    );
    assert_eq!(
        value["upgrade"]["trusted_keys"].as_array().map(|a| a.len()),
        Some(1)
    );
    assert_eq!(
        value["upgrade"]["trusted_keys"][0].as_str(),
        Some(key.as_str())
    );
    // The token: a copy, 0600.
    let token_copy = root.join("etc/railgrid/token");
    assert_eq!(read_lossy(&token_copy), "tok-123\n");
    assert_eq!(mode(&token_copy), 0o600);
    assert_eq!(
        read_lossy(&root.join("etc/railgrid/hub-ca.pem")),
        read_lossy(&ca)
    );
    // The unit: the template from packaging/, as shipped.
    let unit = root.join("etc/systemd/system/railgrid-agent.service");
    assert_eq!(
        read_lossy(&unit),
        read_lossy(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/packaging/systemd/railgrid-agent.service"
        )))
    );
    assert_eq!(mode(&unit), 0o644);
    // The runner's account was not created: the image has no password database.
    assert!(!root.join("etc/passwd").exists());

    // The flags' config loads (the token and CA paths are the host's, so they are
    // pointed at the image's copies here).
    let check = railgrid()
        .args(["agent", "check-config", "--config"])
        .arg(&config)
        .arg("--token-file")
        .arg(&token_copy)
        .arg("--ca-file")
        .arg(&ca)
        .output()
        .expect("check-config");
    let shown = succeeded(&check);
    assert!(shown.contains("agent_id = \"build-17\""), "{shown}");

    // Without --yes and without a terminal: refused, nothing removed.
    refused_saying(uninstall(&["--root", &r, "--purge"]), "give --yes");
    assert!(config.exists() && bin.exists());

    let said = succeeded(&uninstall(&["--root", &r, "--purge", "--yes"]));
    assert!(said.contains("uninstalled"), "{said}");
    assert_eq!(
        contents(&snapshot(&root)),
        contents(&before),
        "the image is as it was before the install"
    );
}

#[test]
fn install_again_changes_nothing_and_a_changed_flag_changes_only_its_key() {
    let dir = tempdir();
    let root = image(dir.path());
    let r = path_str(&root);
    succeeded(&install_at(&r, &["--runner-user", "nobody"]));
    let first = snapshot(&root);
    let said = succeeded(&install_at(&r, &["--runner-user", "nobody"]));
    assert!(
        said.contains("nothing to change: already installed"),
        "{said}"
    );
    assert!(
        !said.contains("  create") && !said.contains("  update"),
        "{said}"
    );
    assert_eq!(snapshot(&root), first, "not a file was rewritten");

    // No --runner-user now: the config's account stays.
    let said = succeeded(&install_at(&r, &[]));
    assert!(said.contains("nothing to change"), "{said}");

    // The operator's edits survive a change made by flags.
    let config = root.join("etc/railgrid/agent.toml");
    let edited = read_lossy(&config).replacen(
        "[runner]\n",
        "[runner]\n# ours: three at once\nmax_jobs = 3\n",
        1,
    );
    fs::write(&config, &edited).expect("edit");
    let token = dir.path().join("t");
    fs::write(&token, "secret-token\n").expect("token");
    let said = succeeded(&install_at(
        &r,
        &[
            "--hub",
            "https://hub.example",
            "--token-file",
            &path_str(&token),
        ],
    ));
    assert!(said.contains("hub.url = \"https://hub.example\""), "{said}");
    assert!(
        said.contains("hub.token_file = \"/etc/railgrid/token\""),
        "{said}"
    );
    assert!(
        !said.contains("runner.user"),
        "the account is not touched: {said}"
    );
    let text = read_lossy(&config);
    assert!(
        text.contains("# ours: three at once\nmax_jobs = 3"),
        "{text}"
    );
    assert!(text.contains("user = \"nobody\""), "{text}");
    assert!(text.contains("url = \"https://hub.example\""), "{text}");

    // A hub without a token, a bad key or CA, a bad prefix: refused, nothing written.
    let now = snapshot(&root);
    let bad_ca = dir.path().join("bad-ca.pem");
    fs::write(
        &bad_ca,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .expect("ca");
    let err = refused(install_at(&r, &["--ca-file", &path_str(&bad_ca)]));
    assert!(
        err.contains("--ca-file") && err.contains("bad-ca.pem"),
        "{err}"
    );
    refused_saying(install_at(&r, &["--hub", "http://hub.example"]), "https://");
    refused_saying(
        install_at(&r, &["--trusted-key", "RWnot-a-key"]),
        "not a minisign public key",
    );
    refused_saying(install_at(&r, &["--prefix", "opt/x"]), "--prefix");
    refused_saying(
        install_at(&r, &["--runner-user", "root"]),
        "never runs as root",
    );
    assert_eq!(snapshot(&root), now);
}

#[test]
fn install_with_an_enrolment_token_keeps_it_private_and_writes_no_agent_token() {
    let dir = tempdir();
    let root = image(dir.path());
    let r = path_str(&root);
    let enrol = dir.path().join("enrol");
    fs::write(&enrol, "rge_0123456789abcdef\n").expect("enrol token");
    let said = succeeded(&install_at(
        &r,
        &[
            "--runner-user",
            "nobody",
            "--hub",
            "https://hub.example",
            "--enrol-token",
            &path_str(&enrol),
        ],
    ));
    assert!(
        said.contains("hub.enrol_token_file = \"/etc/railgrid/enrol.token\""),
        "{said}"
    );
    let kept = root.join("etc/railgrid/enrol.token");
    assert_eq!(read_lossy(&kept), "rge_0123456789abcdef\n");
    assert_eq!(mode(&kept), 0o600);
    assert!(
        !root.join("etc/railgrid/token").exists(),
        "the agent makes its own"
    );
    let text = read_lossy(&root.join("etc/railgrid/agent.toml"));
    assert!(!text.lines().any(|l| l.starts_with("token_file")), "{text}");
    // Without a hub (none given, none in the config), an enrolment token is refused.
    let other = dir.path().join("other");
    fs::create_dir(&other).expect("dir");
    let o = path_str(&image(&other));
    let err = refused(install_at(&o, &["--enrol-token", &path_str(&enrol)]));
    assert!(
        err.contains("give --hub URL too") || err.contains("belong to a hub"),
        "{err}"
    );
}

#[test]
fn a_config_that_is_not_railgrids_is_refused_and_left_alone() {
    let dir = tempdir();
    let root = image(dir.path());
    fs::create_dir_all(root.join("etc/railgrid")).expect("dir");
    fs::write(
        root.join("etc/railgrid/agent.toml"),
        "[server]\nport = 80\n",
    )
    .expect("foreign");
    let before = snapshot(&root);
    let err = refused_saying(
        install_at(&path_str(&root), &[]),
        "is not a railgrid agent config",
    );
    assert!(err.contains("etc/railgrid/agent.toml"), "{err}");
    assert_eq!(snapshot(&root), before, "nothing was written");
}

#[test]
fn dry_run_prints_every_action_and_file_and_changes_nothing() {
    let dir = tempdir();
    let root = image(dir.path());
    let before = snapshot(&root);
    let token = dir.path().join("t");
    fs::write(&token, "do-not-print-me\n").expect("token");
    let said = succeeded(&install_at(
        &path_str(&root),
        &[
            "--dry-run",
            "--hub",
            "https://hub.example",
            "--token-file",
            &path_str(&token),
            "--prefix",
            "/opt/rg",
        ],
    ));
    for path in [
        "opt/rg/bin/railgrid",
        "etc/railgrid/agent.toml",
        "etc/railgrid/token",
        "etc/systemd/system/railgrid-agent.service",
        "etc/railgrid/install.json",
    ] {
        let full = root.join(path).display().to_string();
        assert!(said.contains(&format!("create  {full}")), "{path}: {said}");
    }
    assert!(said.contains("account railgrid"), "{said}");
    assert!(
        said.contains("ExecStart=/opt/rg/bin/railgrid agent run --config /etc/railgrid/agent.toml"),
        "{said}"
    );
    assert!(said.contains("url = \"https://hub.example\""), "{said}");
    assert!(said.contains("(a secret of 16 bytes, not shown)"), "{said}");
    assert!(!said.contains("do-not-print-me"), "{said}");
    assert_eq!(snapshot(&root), before, "a dry run writes nothing");
}

/// `sh -c SCRIPT ARGS…` in a private mount namespace of its own: what it mounts goes
/// with it.
fn in_namespace(script: &str) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
    ]);
    cmd
}

/// `sh -c SCRIPT` in a private mount namespace where the image's /etc and
/// /usr/local (or /opt) lie over the host's, and /var/lib and /var/log are empty.
fn in_image(root: &Path, script: &str, args: &[String]) -> Command {
    let mut mounts = String::new();
    for dir in ["etc", "usr/local", "opt"] {
        if root.join(dir).is_dir() && Path::new("/").join(dir).is_dir() {
            mounts.push_str(&format!(
                "mount -t overlay overlay -o lowerdir={}:/{dir} /{dir} && ",
                root.join(dir).display()
            ));
        }
    }
    mounts.push_str("mount -t tmpfs -o mode=0755 tmpfs /var/lib && mount -t tmpfs -o mode=0755 tmpfs /var/log && ");
    let mut cmd = in_namespace(&format!("{mounts}{script}"));
    cmd.args(args);
    cmd
}

#[test]
fn the_rendered_unit_passes_systemd_analyze_verify() {
    if !requires_root("mounting an image needs root") {
        return;
    }
    // The image's /usr/local or /opt lies over the host's: both exist on Debian.
    for prefix in ["/usr/local", "/opt/railgrid"] {
        let top = Path::new(prefix).ancestors().nth(1).expect("a parent");
        assert!(top.is_dir(), "{} is missing on this host", top.display());
        let dir = tempdir();
        let root = image(dir.path());
        succeeded(&install_at(
            &path_str(&root),
            &["--prefix", prefix, "--runner-user", "nobody"],
        ));
        let out = in_image(
            &root,
            "exec systemd-analyze verify --man=no /etc/systemd/system/railgrid-agent.service",
            &[],
        )
        .output()
        .expect("systemd-analyze");
        assert!(
            out.status.success(),
            "prefix {prefix}: systemd-analyze verify failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // It does check: the same unit without its binary fails.
        fs::remove_file(
            root.join(prefix.trim_start_matches('/'))
                .join("bin/railgrid"),
        )
        .expect("rm");
        let out = in_image(
            &root,
            "exec systemd-analyze verify --man=no /etc/systemd/system/railgrid-agent.service",
            &[],
        )
        .output()
        .expect("systemd-analyze");
        assert!(!out.status.success(), "verify without the binary passed");
        assert!(String::from_utf8_lossy(&out.stderr).contains("is not executable"));
    }
}

#[test]
fn install_refuses_without_root_and_without_a_service_manager() {
    if !is_root() {
        refused_saying(install(&["--no-start"]), "must run as root");
        return;
    }
    // As an ordinary account: refused before anything is looked at.
    let dir = tempdir();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let bin = dir.path().join("railgrid");
    fs::copy(BIN, &bin).expect("copy");
    let out = Command::new(&bin)
        .args(["agent", "install", "--no-start"])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("install as nobody");
    let err = refused_saying(out, "must run as root");
    assert!(err.contains("--root DIR"), "{err}");

    // On the host itself, where systemd is not PID 1: refused, nothing written.
    if Path::new("/run/systemd/system").exists() {
        eprintln!(
            "skipped the host half: systemd runs here, and this test installs nothing for real"
        );
        return;
    }
    // In a namespace where /etc and /usr/local are read-only overlays: a regression
    // that went ahead would fail to write, never touch the host.
    let image = image(dir.path());
    let out = in_image(
        &image,
        "exec \"$@\" agent install --runner-user nobody",
        &[BIN.to_owned()],
    )
    .output()
    .expect("install on the host");
    let err = refused_saying(out, "systemd is not running on this host");
    assert!(err.contains("/run/systemd/system"), "{err}");
    let out = in_image(&image, "exec \"$@\" agent uninstall", &[BIN.to_owned()])
        .output()
        .expect("uninstall on the host");
    refused_saying(out, "systemd is not running");
    assert!(!Path::new("/etc/railgrid").exists());
}

/// A password database of its own: the host's is never touched.
fn seed_accounts(root: &Path) {
    let etc = root.join("etc");
    fs::write(etc.join("passwd"), "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n").expect("passwd");
    fs::write(etc.join("group"), "root:x:0:\nnogroup:x:65534:\n").expect("group");
    fs::write(
        etc.join("shadow"),
        "root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n",
    )
    .expect("shadow");
    fs::write(etc.join("gshadow"), "root:*::\nnogroup:*::\n").expect("gshadow");
    for f in ["shadow", "gshadow"] {
        fs::set_permissions(etc.join(f), fs::Permissions::from_mode(0o640)).expect("chmod");
    }
}

#[test]
fn the_runner_account_is_created_once_as_a_system_account() {
    if !requires_root("useradd needs root") {
        return;
    }
    let dir = tempdir();
    let root = image(dir.path());
    seed_accounts(&root);
    let host_passwd = fs::read(Path::new("/etc/passwd")).expect("host passwd");
    let r = path_str(&root);
    let said = succeeded(&install_at(&r, &[]));
    assert!(
        said.contains("create  account railgrid: useradd --prefix"),
        "{said}"
    );
    let line = |root: &Path| -> Vec<String> {
        read_lossy(&root.join("etc/passwd"))
            .lines()
            .filter(|l| l.starts_with("railgrid:"))
            .map(str::to_owned)
            .collect()
    };
    let lines = line(&root);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let fields: Vec<&str> = lines[0].split(':').collect();
    let uid: u32 = fields[2].parse().expect("uid");
    assert!(uid > 0 && uid < 1000, "a system uid: {uid}");
    assert_eq!(
        fields[5], "/var/lib/railgrid/runner",
        "home inside the state dir"
    );
    assert!(
        fields[6].ends_with("nologin") || fields[6].ends_with("false"),
        "{}",
        fields[6]
    );
    let group = read_lossy(&root.join("etc/group"));
    assert!(
        group
            .lines()
            .any(|l| l.starts_with(&format!("railgrid:x:{}:", fields[3]))),
        "{group}"
    );
    let config = read_lossy(&root.join("etc/railgrid/agent.toml"));
    assert!(config.contains("user = \"railgrid\""), "{config}");

    // Again: the account is found, not added twice.
    let said = succeeded(&install_at(&r, &[]));
    assert!(
        said.contains(&format!("keep    account railgrid: exists (uid {uid})")),
        "{said}"
    );
    assert_eq!(line(&root), lines);
    assert_eq!(
        fs::read("/etc/passwd").expect("host passwd"),
        host_passwd,
        "the host's accounts are untouched"
    );

    // Uninstall keeps it, and says how to remove it.
    let said = succeeded(&uninstall(&["--root", &r, "--purge", "--yes"]));
    assert!(said.contains("kept the account railgrid"), "{said}");
    assert!(said.contains("userdel railgrid"), "{said}");
    assert_eq!(line(&root), lines);
}
