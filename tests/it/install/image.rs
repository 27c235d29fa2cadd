//! Images that try to make install or uninstall reach outside them: links, `..`, files of other accounts, odd file types, an install cut short, races.

use super::*;

#[test]
fn nothing_outside_the_image_is_read_written_or_removed() {
    let dir = tempdir();
    let root = image(dir.path());
    let r = path_str(&root);
    // A victim outside the image, reached through a link or a path with `..`.
    let victim = dir.path().join("victim/railgrid");
    fs::create_dir_all(&victim).expect("victim");
    fs::write(victim.join("data"), "precious\n").expect("data");
    std::os::unix::fs::symlink(dir.path().join("victim"), root.join("etc/railgrid")).expect("link");
    refused_saying(install_at(&r, &["--runner-user", "nobody"]), "is a symlink");
    refused_saying(
        uninstall(&["--root", &r, "--purge", "--yes"]),
        "is a symlink",
    );
    fs::remove_file(root.join("etc/railgrid")).expect("unlink");

    // A config whose state directory climbs out of the image: refused by install, never
    // purged by uninstall.
    let escape = format!("/..{}", victim.display());
    fs::create_dir_all(root.join("etc/railgrid")).expect("dir");
    fs::set_permissions(root.join("etc/railgrid"), fs::Permissions::from_mode(0o700))
        .expect("chmod");
    fs::write(
        root.join("etc/railgrid/agent.toml"),
        format!("state_dir = \"{escape}\"\n[runner]\nuser = \"nobody\"\n"),
    )
    .expect("config");
    refused_saying(install_at(&r, &[]), "plain absolute paths");
    let said = succeeded(&uninstall(&["--root", &r, "--purge", "--yes"]));
    assert!(said.contains("not removed: remove it by hand"), "{said}");
    assert_eq!(read_lossy(&victim.join("data")), "precious\n");

    // A manifest that names a prefix outside: refused as not ours.
    fs::create_dir_all(root.join("etc/railgrid")).expect("dir");
    fs::write(
        root.join("etc/railgrid/install.json"),
        format!(
            "{{\"service\":\"systemd\",\"prefix\":\"/..{}\",\"created_dirs\":[],\"runner_user\":null,\"installed_by\":\"0\"}}",
            dir.path().join("victim").display()
        ),
    )
    .expect("manifest");
    refused_saying(uninstall(&["--root", &r]), "is not an install manifest");
    assert_eq!(read_lossy(&victim.join("data")), "precious\n");
}

#[test]
fn uninstall_then_install_again_still_restores_the_image_on_purge() {
    let dir = tempdir();
    let root = image(dir.path());
    let before = contents(&snapshot(&root));
    let r = path_str(&root);
    succeeded(&install_at(&r, &["--runner-user", "nobody"]));
    let said = succeeded(&uninstall(&["--root", &r]));
    assert!(said.contains("kept"), "{said}");
    assert!(
        root.join("etc/railgrid/agent.toml").exists(),
        "the config stays"
    );
    assert!(
        !root.join("usr/local/bin/railgrid").exists(),
        "the binary goes"
    );
    // Installs at another prefix and back, then a purge: everything goes.
    succeeded(&install_at(&r, &["--prefix", "/opt/rg"]));
    let said = succeeded(&install_at(&r, &["--prefix", "/usr/local"]));
    assert!(
        said.contains("the binary of the install at prefix /opt/rg"),
        "{said}"
    );
    assert!(!root.join("opt/rg/bin/railgrid").exists());
    succeeded(&uninstall(&["--root", &r, "--purge", "--yes"]));
    assert_eq!(contents(&snapshot(&root)), before);
}

#[test]
fn files_other_accounts_own_are_refused_or_made_roots_again() {
    if !requires_root("chown needs root") {
        return;
    }
    let dir = tempdir();
    let root = image(dir.path());
    let r = path_str(&root);
    succeeded(&install_at(&r, &["--runner-user", "nobody"]));
    let bin = root.join("usr/local/bin/railgrid");
    let chown =
        |path: &Path, uid: u32| std::os::unix::fs::chown(path, Some(uid), None).expect("chown");

    // The binary, the same bytes but another account's and writable by all: rewritten.
    chown(&bin, 65534);
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o777)).expect("chmod");
    let said = succeeded(&install_at(&r, &[]));
    assert!(said.contains("owner uid 65534 and mode 0777"), "{said}");
    assert_eq!(
        (fs::metadata(&bin).expect("bin").uid(), mode(&bin)),
        (0, 0o755)
    );

    // A previous binary (run as root by the unit and a rollback) that is not root's.
    let prev = root.join("usr/local/bin/railgrid.prev");
    fs::write(&prev, "#!/bin/sh\n").expect("prev");
    chown(&prev, 65534);
    refused_saying(install_at(&r, &[]), "railgrid.prev is owned by uid 65534");
    fs::remove_file(&prev).expect("rm prev");

    // The binary's directory, or one above it, in another account's hands.
    for d in ["usr/local/bin", "usr/local"] {
        let path = root.join(d);
        chown(&path, 65534);
        let err = refused(install_at(&r, &[]));
        assert!(
            err.contains(&format!("{} is owned by uid 65534", path.display())),
            "{err}"
        );
        chown(&path, 0);
    }
    fs::set_permissions(root.join("usr/local"), fs::Permissions::from_mode(0o777)).expect("chmod");
    refused_saying(install_at(&r, &[]), "mode 0777");
    fs::set_permissions(root.join("usr/local"), fs::Permissions::from_mode(0o755)).expect("chmod");

    // The config's directory, opened up: tightened again.
    fs::set_permissions(root.join("etc/railgrid"), fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let said = succeeded(&install_at(&r, &[]));
    assert!(said.contains("directory, mode 0755 to 0700"), "{said}");
    assert_eq!(mode(&root.join("etc/railgrid")), 0o700);
}

#[test]
fn odd_files_in_the_image_are_refused_without_reading_them() {
    let dir = tempdir();
    let root = image(dir.path());
    let r = path_str(&root);
    fs::create_dir_all(root.join("etc/railgrid")).expect("dir");
    fs::set_permissions(root.join("etc/railgrid"), fs::Permissions::from_mode(0o700))
        .expect("chmod");
    let config = root.join("etc/railgrid/agent.toml");
    // A FIFO would block a reader for ever: the command must refuse, not hang.
    nix::unistd::mkfifo(&config, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    for args in [
        vec!["agent", "install", "--root", &r],
        vec!["agent", "uninstall", "--root", &r, "--purge", "--yes"],
    ] {
        let child = railgrid()
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let out = Guard::new(child).wait_output(LIMIT);
        let err = refused(out);
        assert!(err.contains("is not a regular file"), "{args:?}: {err}");
    }
    fs::remove_file(&config).expect("rm fifo");

    // A config that is not ours: where, never what (it may hold a secret).
    fs::write(&config, "[runner]\ndelegate_cgroup = \"SECRET-hunter2\"\n").expect("config");
    let err = refused_saying(install_at(&r, &[]), "at line 2");
    assert!(!err.contains("hunter2"), "{err}");
    fs::write(&config, "SECRET_hunter2 = 1\n").expect("config");
    let err = refused(install_at(&r, &[]));
    assert!(!err.contains("hunter2"), "{err}");

    // A config of ours that the agent would refuse at start: refused now, not at boot.
    fs::write(
        &config,
        "[runner]\nuser = \"nobody\"\nstop_grace = \"99h\"\n",
    )
    .expect("config");
    let err = refused(install_at(&r, &[]));
    assert!(
        err.contains("would not load") && err.contains("stop_grace"),
        "{err}"
    );
}

#[test]
fn an_install_cut_short_while_moving_the_prefix_is_finished_by_uninstall() {
    if !requires_root("mounting a tmpfs needs root") {
        return;
    }
    // An image on a tmpfs with room for one copy of the binary, not two: the second
    // install, to another prefix, fails writing the binary.
    let size = fs::metadata(BIN).expect("BIN").len();
    let dir = tempdir();
    let t = dir.path();
    let script = r#"
T=$1; B=$2; SIZE=$3
mkdir -p "$T/img"
mount -t tmpfs -o "size=$SIZE,mode=0755" tmpfs "$T/img" || exit 90
"$B" agent install --root "$T/img" --prefix /opt/a --runner-user nobody > "$T/first" 2>&1 || exit 91
"$B" agent install --root "$T/img" --prefix /opt/b > "$T/second" 2>&1 && exit 92
cp "$T/img/etc/railgrid/install.json" "$T/manifest"
"$B" agent uninstall --root "$T/img" --purge --yes > "$T/remove" 2>&1 || exit 93
find "$T/img" -mindepth 1 > "$T/left"
exit 0
"#;
    let out = in_namespace(script)
        .arg(t)
        .arg(BIN)
        .arg(format!("{}", size + size / 2))
        .output()
        .expect("unshare");
    let step = |name: &str| read_lossy(&t.join(name));
    assert!(
        out.status.success(),
        "{out:?}\nfirst: {}\nsecond: {}\nremove: {}",
        step("first"),
        step("second"),
        step("remove")
    );
    assert!(
        step("second").contains("No space left on device"),
        "{}",
        step("second")
    );
    let manifest: serde_json::Value = serde_json::from_str(&step("manifest")).expect("manifest");
    assert_eq!(manifest["prefix"], "/opt/b");
    assert_eq!(
        manifest["previous_prefixes"],
        serde_json::json!(["/opt/a"]),
        "{manifest:#}"
    );
    assert!(
        step("remove").contains("/opt/a/bin/railgrid"),
        "{}",
        step("remove")
    );
    assert_eq!(step("left"), "", "the image is empty again");
}

#[test]
fn an_image_cannot_point_roots_writes_elsewhere_or_race_them() {
    if !requires_root("chown and useradd need root") {
        return;
    }
    let dir = tempdir();
    let root = image(dir.path());
    let r = path_str(&root);
    seed_accounts(&root);
    // useradd --prefix writes passwd- and friends by path: a link there is refused.
    let victim = dir.path().join("victim");
    fs::write(&victim, "precious\n").expect("victim");
    std::os::unix::fs::symlink(&victim, root.join("etc/passwd-")).expect("link");
    let err = refused(install_at(&r, &[]));
    assert!(
        err.contains("etc/passwd-") && err.contains("not a regular file"),
        "{err}"
    );
    assert_eq!(read_lossy(&victim), "precious\n");
    fs::remove_file(root.join("etc/passwd-")).expect("unlink");

    // An account in root's group: the supervisor would refuse it at every start.
    fs::write(
        root.join("etc/passwd"),
        format!(
            "{}operator:x:11:0:operator:/root:/sbin/nologin\n",
            read_lossy(&root.join("etc/passwd"))
        ),
    )
    .expect("passwd");
    refused_saying(
        install_at(&r, &["--runner-user", "operator"]),
        "primary group 0",
    );

    // An image another account owns could be swapped under a running install.
    std::os::unix::fs::chown(&root, Some(65534), None).expect("chown");
    refused_saying(
        install_at(&r, &["--runner-user", "nobody"]),
        "is owned by uid 65534",
    );
    std::os::unix::fs::chown(&root, Some(0), None).expect("chown");

    // A unit another account owns is written again as root's.
    succeeded(&install_at(&r, &["--runner-user", "nobody"]));
    let unit = root.join("etc/systemd/system/railgrid-agent.service");
    std::os::unix::fs::chown(&unit, Some(65534), None).expect("chown");
    let said = succeeded(&install_at(&r, &[]));
    assert!(said.contains("owner uid 65534 to this account's"), "{said}");
    assert_eq!(fs::metadata(&unit).expect("unit").uid(), 0);

    // One install or uninstall at a time per root.
    // The holder waits for the lock rather than giving up: the probe below takes it for a
    // moment, and a holder that tried then with --nonblock would exit, leaving it free.
    let mut holder = Guard::new(
        Command::new("flock")
            .args(["--exclusive", "--no-fork"])
            .arg(&root)
            .args(["sleep", "60"])
            .spawn()
            .expect("flock"),
    );
    wait_for(LIMIT, "the root locked by flock", || {
        let probe = Command::new("flock")
            .args(["--exclusive", "--nonblock"])
            .arg(&root)
            .arg("true")
            .status()
            .expect("flock probe");
        (!probe.success()).then_some(())
    });
    let out = install_at(&r, &["--dry-run"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        err.contains("another railgrid agent install or uninstall is running"),
        "{err}"
    );
    holder.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = holder.wait_output(LIMIT);

    // An agent on a state directory not named for railgrid: the purge still waits for it.
    let config = root.join("etc/railgrid/agent.toml");
    fs::write(
        &config,
        format!("state_dir = \"/srv/data\"\n{}", read_lossy(&config)),
    )
    .expect("config");
    fs::create_dir_all(root.join("srv/data")).expect("state");
    fs::write(root.join("srv/data/agent.lock"), "").expect("lock");
    let mut agent = Guard::new(
        Command::new("flock")
            .arg("--no-fork")
            .arg(root.join("srv/data/agent.lock"))
            .args(["sleep", "60"])
            .spawn()
            .expect("flock"),
    );
    let err = wait_for(
        LIMIT,
        "a purge refused while an agent holds the state",
        || {
            let out = uninstall(&["--root", &r, "--purge", "--yes", "--dry-run"]);
            (out.status.code() == Some(2))
                .then(|| String::from_utf8_lossy(&out.stderr).into_owned())
        },
    );
    assert!(err.contains("still holds"), "{err}");
    agent.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = agent.wait_output(LIMIT);
    assert!(config.exists(), "nothing was removed");
}
