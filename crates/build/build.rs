//! Stamps railgrid with its version, commit and target.
//!
//! `RAILGRID_BUILD_VERSION` overrides the Cargo version, so tests and release tooling can
//! build a binary that reports another version from the same source.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=RAILGRID_BUILD_VERSION");
    println!("cargo:rerun-if-env-changed=RAILGRID_BUILD_COMMIT");
    let version = std::env::var("RAILGRID_BUILD_VERSION")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| std::env::var("CARGO_PKG_VERSION").unwrap_or_default());
    println!("cargo:rustc-env=RAILGRID_VERSION={version}");

    let commit = std::env::var("RAILGRID_BUILD_COMMIT")
        .ok()
        .or_else(git_commit)
        .unwrap_or_default();
    println!("cargo:rustc-env=RAILGRID_COMMIT={commit}");
    println!(
        "cargo:rustc-env=RAILGRID_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
}

fn git_commit() -> Option<String> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    // The repository's, above this crate's directory.
    let git = std::path::Path::new(&dir)
        .ancestors()
        .map(|d| d.join(".git"))
        .find(|g| g.join("HEAD").exists());
    if let Some(git) = git {
        println!("cargo:rerun-if-changed={}", git.join("HEAD").display());
        if let Ok(head) = std::fs::read_to_string(git.join("HEAD")) {
            if let Some(r) = head.strip_prefix("ref: ") {
                let path = git.join(r.trim());
                if path.exists() {
                    println!("cargo:rerun-if-changed={}", path.display());
                }
            }
        }
    }
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(&dir)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}
