//! The Debian package (packaging/deb/build.sh): built from the binary the tests run, with
//! what a package of a service needs where Debian puts it, and nothing lintian calls an
//! error.

use std::path::Path;
use std::process::Command;

use crate::fixtures::*;

#[test]
fn the_debian_package_holds_the_service_and_its_pages_and_lintian_finds_no_error() {
    let out = tempdir();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let built = Command::new("bash")
        .arg(repo.join("packaging/deb/build.sh"))
        .arg(BIN)
        .arg(out.path())
        .env("DEB_COMPRESSION", "gzip")
        .output()
        .expect("build.sh");
    assert!(built.status.success(), "{}", text(&built.stderr));
    let deb = text(&built.stdout).trim().to_owned();
    assert!(deb.ends_with(".deb") && Path::new(&deb).is_file(), "{deb}");

    let listing = Command::new("dpkg-deb")
        .args(["-c", &deb])
        .output()
        .expect("dpkg-deb -c");
    let listing = text(&listing.stdout);
    for (mode, path) in [
        ("-rwxr-xr-x", "./usr/bin/railgrid"),
        ("-rw-r--r--", "./lib/systemd/system/railgrid-agent.service"),
        ("-rw-r--r--", "./usr/share/man/man1/railgrid.1.gz"),
        (
            "-rw-r--r--",
            "./usr/share/man/man1/railgrid-hub-job-submit.1.gz",
        ),
        (
            "-rw-r--r--",
            "./usr/share/bash-completion/completions/railgrid",
        ),
        ("-rw-r--r--", "./usr/share/zsh/vendor-completions/_railgrid"),
        (
            "-rw-r--r--",
            "./usr/share/fish/vendor_completions.d/railgrid.fish",
        ),
        ("-rw-r--r--", "./usr/share/doc/railgrid/examples/agent.toml"),
        ("-rw-r--r--", "./usr/share/doc/railgrid/copyright"),
    ] {
        assert!(
            listing
                .lines()
                .any(|l| l.starts_with(mode) && l.contains(" root/root ") && l.ends_with(path)),
            "{path} ({mode}, root's) is not in the package:\n{listing}"
        );
    }
    let unit = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "dpkg-deb --fsys-tarfile {deb} | tar -xOf - ./lib/systemd/system/railgrid-agent.service"
        ))
        .output()
        .expect("the unit");
    let unit = text(&unit.stdout);
    assert!(
        unit.contains(
            "\nExecStart=/usr/bin/railgrid agent run --config /etc/railgrid/agent.toml\n"
        ),
        "{unit}"
    );
    // The packaged binary is dpkg's: the service may not write beside it.
    assert!(
        !unit.contains("ReadWritePaths") && !unit.contains("/usr/local"),
        "{unit}"
    );
    let control = Command::new("dpkg-deb")
        .args(["-f", &deb])
        .output()
        .expect("control");
    let control = text(&control.stdout);
    assert!(control.contains("\nDepends: libc6 (>= 2."), "{control}");

    let lintian = Command::new("lintian")
        .args(["--tag-display-limit", "0", &deb])
        .output()
        .expect("lintian");
    let report = text(&lintian.stdout);
    let errors: Vec<&str> = report.lines().filter(|l| l.starts_with("E:")).collect();
    assert!(
        errors.is_empty(),
        "lintian:\n{report}{}",
        text(&lintian.stderr)
    );
}
