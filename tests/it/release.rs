//! `railgrid release keygen|sign|verify`, and their interoperability with the `minisign`
//! tool (Debian package `minisign`; `.ci/run` installs it): each signs, the other verifies.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use crate::fixtures::*;

fn release(args: &[&str]) -> Output {
    railgrid()
        .arg("release")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("railgrid release")
}

fn minisign(args: &[&str]) -> Output {
    let out = Command::new("minisign")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) => o,
        Err(e) => panic!(
            "the interoperability tests need the minisign tool ({e}): run {} (Debian package minisign)", crate::prerequisites::INSTALL
        ),
    }
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p).expect("stat").permissions().mode() & 0o777
}

#[test]
fn keys_are_made_once_and_a_signed_binary_verifies_with_its_version() {
    let dir = tempdir();
    let (sk, pk) = (dir.path().join("rel.key"), dir.path().join("rel.pub"));
    let (sks, pks) = (path_str(&sk), path_str(&pk));
    let said = succeeded(&release(&[
        "keygen",
        "--secret-key",
        &sks,
        "--public-key",
        &pks,
    ]));
    assert!(said.contains("trusted_keys: RW"), "{said}");
    assert_eq!(mode(&sk), 0o600);
    let before = fs::read(&sk).expect("key");
    let again = release(&["keygen", "--secret-key", &sks, "--public-key", &pks]);
    exited_saying(&again, 2, "never overwritten");
    assert_eq!(fs::read(&sk).expect("key"), before, "a key was overwritten");

    // A copy of this very binary: its version comes from running it.
    let bin = dir.path().join("railgrid");
    fs::copy(BIN, &bin).expect("copy");
    let bins = path_str(&bin);
    let said = succeeded(&release(&["sign", "--secret-key", &sks, &bins]));
    let version = env!("CARGO_PKG_VERSION");
    assert!(said.contains(&format!("version {version}")), "{said}");
    let said = succeeded(&release(&["verify", "--public-key", &pks, &bins]));
    assert!(
        said.contains(&format!("version:{version}\tfile:railgrid\tsha256:")),
        "{said}"
    );

    // One byte changed, or another key: refused, exit 1, naming the file and the key.
    let mut bytes = fs::read(&bin).expect("bin");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    fs::write(&bin, &bytes).expect("tamper");
    let bad = release(&["verify", "--public-key", &pks, &bins]);
    exited_saying(&bad, 1, "does not verify");

    // Not a railgrid binary: the version must be given.
    let other = dir.path().join("notes.txt");
    fs::write(&other, "hello").expect("file");
    let no_version = release(&["sign", "--secret-key", &sks, &path_str(&other)]);
    exited_saying(&no_version, 2, "give --version V");
    succeeded(&release(&[
        "sign",
        "--secret-key",
        &sks,
        "--version",
        "1.0.0",
        &path_str(&other),
    ]));
    // A key line alone (as an agent's trusted_keys holds it) verifies too.
    let line = fs::read_to_string(&pk).expect("pub");
    let line = line.lines().nth(1).expect("key line");
    let line_file = dir.path().join("line.pub");
    fs::write(&line_file, line).expect("line");
    succeeded(&release(&[
        "verify",
        "--public-key",
        &path_str(&line_file),
        &path_str(&other),
    ]));
}

#[test]
fn railgrid_and_the_minisign_tool_read_each_other_s_keys_and_signatures() {
    let dir = tempdir();
    let file = dir.path().join("artifact");
    fs::write(&file, b"release bytes").expect("file");
    let f = path_str(&file);

    // railgrid's key and signature, checked by minisign.
    let (sk, pk) = (dir.path().join("r.key"), dir.path().join("r.pub"));
    succeeded(&release(&[
        "keygen",
        "--secret-key",
        &path_str(&sk),
        "--public-key",
        &path_str(&pk),
    ]));
    succeeded(&release(&[
        "sign",
        "--secret-key",
        &path_str(&sk),
        "--version",
        "2.0.0",
        &f,
    ]));
    let v = minisign(&["-V", "-p", &path_str(&pk), "-m", &f]);
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
    assert!(String::from_utf8_lossy(&v.stdout).contains("version:2.0.0"));

    // minisign's key (unencrypted, -W) and signature, checked by railgrid.
    let (msk, mpk) = (dir.path().join("m.key"), dir.path().join("m.pub"));
    let g = minisign(&["-G", "-W", "-p", &path_str(&mpk), "-s", &path_str(&msk)]);
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    let s = minisign(&["-S", "-s", &path_str(&msk), "-m", &f, "-t", "version:3.0.0"]);
    assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    let said = succeeded(&release(&["verify", "--public-key", &path_str(&mpk), &f]));
    assert!(said.contains("trusted comment: version:3.0.0"), "{said}");
    // And railgrid's key does not pass minisign's signature.
    let other = release(&["verify", "--public-key", &path_str(&pk), &f]);
    assert_eq!(other.status.code(), Some(1));
}

#[test]
fn an_encrypted_key_signs_only_with_its_password_file_and_never_prompts() {
    let dir = tempdir();
    let pw = dir.path().join("pw");
    fs::write(&pw, "correct horse\n").expect("pw");
    let wrong = dir.path().join("wrong");
    fs::write(&wrong, "battery staple\n").expect("pw");
    let (sk, pk) = (
        path_str(&dir.path().join("e.key")),
        path_str(&dir.path().join("e.pub")),
    );
    let pws = path_str(&pw);
    succeeded(&release(&[
        "keygen",
        "--secret-key",
        &sk,
        "--public-key",
        &pk,
        "--password-file",
        &pws,
    ]));
    let file = dir.path().join("artifact");
    fs::write(&file, b"bytes").expect("file");
    let f = path_str(&file);
    // stdin is null: a prompt would fail, not hang; none is made.
    let no_pw = release(&["sign", "--secret-key", &sk, "--version", "1.0.0", &f]);
    exited_saying(&no_pw, 2, "give its --password-file");
    let bad = release(&[
        "sign",
        "--secret-key",
        &sk,
        "--password-file",
        &path_str(&wrong),
        "--version",
        "1.0.0",
        &f,
    ]);
    exited_saying(&bad, 1, "with that password");
    assert!(!Path::new(&format!("{f}.minisig")).exists());
    succeeded(&release(&[
        "sign",
        "--secret-key",
        &sk,
        "--password-file",
        &pws,
        "--version",
        "1.0.0",
        &f,
    ]));
    let v = minisign(&["-V", "-p", &pk, "-m", &f]);
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
}
