//! Every tool the tests use is installed. The one list is
//! `scripts/install-test-prerequisites.sh` (its `need TOOL PACKAGE…` lines), which `.ci/run`
//! and the README run: a missing tool fails here, naming the script and the packages,
//! instead of failing some other test obscurely or skipping it.

use std::path::Path;

pub use railgrid_testkit::INSTALL;

fn on_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(
            std::fs::read_dir("/usr/lib/postgresql")
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path().join("bin")),
        )
        .any(|dir| dir.join(tool).is_file())
}

#[test]
fn every_tool_the_tests_use_is_installed() {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-test-prerequisites.sh");
    let text = std::fs::read_to_string(&script).expect("the prerequisites script");
    let needs: Vec<(&str, Vec<&str>)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("need "))
        .map(|l| {
            let mut words = l.split_whitespace();
            let tool = words.next().expect("a tool");
            (tool, words.collect())
        })
        .collect();
    assert!(needs.len() >= 10, "the script lists its tools: {needs:?}");
    let missing: Vec<String> = needs
        .iter()
        .filter(|(tool, _)| !on_path(tool))
        .map(|(tool, packages)| format!("{tool} ({})", packages.join(" ")))
        .collect();
    assert!(
        missing.is_empty(),
        "missing test prerequisites: {}; run {INSTALL}",
        missing.join(", ")
    );
}
