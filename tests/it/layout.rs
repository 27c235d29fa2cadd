//! The floors of the layout (docs/design.md, "Layout"): no source file over 1 000 lines,
//! no function over 200, no import circle between the modules of one room of a crate, and
//! crates that depend only on those below them, none but railgrid-sys allowing unsafe
//! code. Read from the tree as rustfmt leaves it; a failure names the file, the function,
//! the circle or the dependency.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 1000;
const MAX_FN_LINES: usize = 200;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file below `dir`, in order.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Each function's name, first line (from 1) and length: from its `fn` line to the `}`
/// at the same indent, as rustfmt lays it out.
fn functions(lines: &[&str]) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let body = line.trim_start();
        let indent = line.len() - body.len();
        let name = [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "async ",
            "const ",
            "unsafe ",
        ]
        .iter()
        .fold(body, |b, p| b.strip_prefix(p).unwrap_or(b))
        .strip_prefix("fn ")
        .map(|rest| rest.split(['(', '<']).next().unwrap_or(rest).to_owned());
        let Some(name) = name.filter(|_| !line.ends_with('}')) else {
            i += 1;
            continue;
        };
        let Some(open) =
            (i..lines.len()).find(|&j| lines[j].ends_with('{') || lines[j].ends_with(';'))
        else {
            break;
        };
        if lines[open].ends_with(';') {
            i += 1;
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let end = (open + 1..lines.len())
            .find(|&j| lines[j] == close)
            .unwrap_or(lines.len() - 1);
        out.push((name, i + 1, end - i + 1));
        i = end + 1;
    }
    out
}

#[test]
fn no_file_over_a_thousand_lines_and_no_function_over_two_hundred() {
    let mut over = Vec::new();
    for dir in ["src", "crates", "tests", "examples"] {
        for path in rust_files(&root().join(dir)) {
            let text = fs::read_to_string(&path).expect("a source file");
            let lines: Vec<&str> = text.lines().collect();
            let shown = path.strip_prefix(root()).unwrap_or(&path).display();
            if lines.len() > MAX_FILE_LINES {
                over.push(format!("{shown}: {} lines", lines.len()));
            }
            for (name, at, len) in functions(&lines) {
                if len > MAX_FN_LINES {
                    over.push(format!("{shown}:{at}: fn {name} is {len} lines"));
                }
            }
        }
    }
    assert!(
        over.is_empty(),
        "past the layout's floors:\n{}",
        over.join("\n")
    );
}

#[test]
fn the_function_reader_measures_what_rustfmt_writes() {
    let text = "fn one() -> u8 { 1 }\nimpl X {\n    pub(crate) async fn two(\n        a: u8,\n    ) -> u8 {\n        a\n    }\n    fn three();\n}\n";
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(functions(&lines), [("two".to_owned(), 3, 5)]);
}

/// In a crate whose sources are `src`, `src/a/b.rs` and `src/a/b/mod.rs` are module `a::b`.
fn module_of(src: &Path, path: &Path) -> Vec<String> {
    let rel = path.strip_prefix(src).expect("below the crate's sources");
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The module paths `text` (of module `at`) names through `crate::`, `super::` and
/// `self::`, groups (`{a, b::c}`) included; its unit tests left out.
fn references(at: &[String], text: &str) -> BTreeSet<Vec<String>> {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices(['c', 's']) {
        let rest = &text[i..];
        let after_word = text[..i]
            .chars()
            .next_back()
            .is_some_and(|c| word(c) || c == ':');
        if after_word
            || !["crate::", "super::", "self::"]
                .iter()
                .any(|p| rest.starts_with(p))
        {
            continue;
        }
        let end = rest
            .find(|c: char| !(word(c) || c.is_whitespace() || ":{},".contains(c)))
            .unwrap_or(rest.len());
        let (head, group) = match rest[..end].split_once("::{") {
            Some((head, group)) => (head, group.split('}').next()),
            None => (
                rest[..end]
                    .split(|c: char| !(word(c) || c == ':'))
                    .next()
                    .unwrap_or(""),
                None,
            ),
        };
        let mut segs = head.split("::").filter(|s| !s.is_empty()).peekable();
        let mut base = at.to_vec();
        match segs.peek() {
            Some(&"crate") => base.clear(),
            Some(&"self") => {}
            _ => {
                while segs.peek() == Some(&"super") {
                    segs.next();
                    base.pop();
                }
            }
        }
        base.extend(
            segs.filter(|s| !matches!(*s, "crate" | "self"))
                .map(str::to_owned),
        );
        let Some(group) = group else {
            out.insert(base);
            continue;
        };
        for item in group.split(',') {
            let first = item.split_whitespace().next().unwrap_or("");
            let mut path = base.clone();
            path.extend(
                first
                    .split("::")
                    .filter(|s| !s.is_empty() && *s != "self")
                    .map(str::to_owned),
            );
            out.insert(path);
        }
    }
    out
}

/// The sources of every crate: the binary's, then each below `crates/`.
fn crate_sources() -> Vec<PathBuf> {
    let mut all = vec![root().join("src")];
    let mut crates: Vec<PathBuf> = fs::read_dir(root().join("crates"))
        .expect("crates/")
        .map(|e| e.expect("a directory entry").path().join("src"))
        .collect();
    crates.sort();
    all.extend(crates);
    all
}

#[test]
fn no_import_circle_between_the_modules_of_one_room() {
    let mut circles = Vec::new();
    for src in crate_sources() {
        circles.extend(circles_in(&src));
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

/// The import circles between the modules of one room of the crate whose sources are
/// `src`.
fn circles_in(src: &Path) -> Vec<String> {
    let files: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = rust_files(src)
        .into_iter()
        .map(|path| {
            let at = module_of(src, &path);
            let refs = references(&at, &fs::read_to_string(&path).expect("a source file"));
            (at, refs)
        })
        .collect();
    // For each room (a module with children): which child reaches which sibling.
    let mut rooms: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (module, refs) in &files {
        for depth in 0..module.len() {
            let (room, child) = (&module[..depth], &module[depth]);
            let edges = rooms
                .entry(room.to_vec())
                .or_default()
                .entry(child.clone())
                .or_default();
            for r in refs {
                if r.len() > depth && r[..depth] == *room && r[depth] != *child {
                    edges.insert(r[depth].clone());
                }
            }
        }
    }
    let mut circles = Vec::new();
    let krate = src.parent().unwrap_or(src).display();
    for (room, graph) in &rooms {
        for start in graph.keys() {
            if let Some(circle) = circle_from(graph, start) {
                circles.push(format!(
                    "{krate}: {}: {}",
                    room.join("::"),
                    circle.join(" -> ")
                ));
                break;
            }
        }
    }
    circles
}

/// The crates from the bottom up: each may depend only on those before it. The binary's
/// own crate (the CLI, the commands and the admin client) is last; the test fixtures' crate,
/// which no build of railgrid takes, is first.
const CRATES: &[&str] = &[
    "railgrid-testkit",
    "railgrid-sys",
    "railgrid-util",
    "railgrid-build",
    "railgrid-proto",
    "railgrid-release",
    "railgrid-hub-client",
    "railgrid-hub-store",
    "railgrid-hub",
    "railgrid-supervisor",
    "railgrid-runner",
    "railgrid-agent",
    "railgrid",
];

/// The only crate that may hold unsafe code.
const UNSAFE_CRATE: &str = "railgrid-sys";

#[test]
fn each_crate_depends_only_on_those_below_it_and_only_sys_may_hold_unsafe_code() {
    let mut wrong = Vec::new();
    let mut manifests = vec![root().join("Cargo.toml")];
    manifests.extend(
        crate_sources()
            .iter()
            .skip(1)
            .map(|s| s.with_file_name("Cargo.toml")),
    );
    let workspace: toml::Table = fs::read_to_string(root().join("Cargo.toml"))
        .expect("Cargo.toml")
        .parse()
        .expect("Cargo.toml is TOML");
    let forbidden = workspace["workspace"]["lints"]["rust"]["unsafe_code"].as_str();
    if forbidden != Some("forbid") {
        wrong.push(format!(
            "the workspace's lints do not forbid unsafe code ({forbidden:?})"
        ));
    }
    for manifest in manifests {
        let text = fs::read_to_string(&manifest).expect("a crate's Cargo.toml");
        let table: toml::Table = text.parse().expect("Cargo.toml is TOML");
        let name = table["package"]["name"].as_str().expect("a package name");
        let Some(place) = CRATES.iter().position(|c| *c == name) else {
            wrong.push(format!(
                "{name} is not in the layout's list of crates (CRATES)"
            ));
            continue;
        };
        for kind in ["dependencies", "dev-dependencies", "build-dependencies"] {
            let Some(deps) = table.get(kind).and_then(toml::Value::as_table) else {
                continue;
            };
            for dep in deps.keys().filter(|d| d.starts_with("railgrid")) {
                match CRATES.iter().position(|c| c == dep) {
                    Some(at) if at < place => {}
                    _ => wrong.push(format!("{name} depends on {dep}, which is not below it")),
                }
            }
        }
        let inherits = table
            .get("lints")
            .and_then(|l| l.get("workspace"))
            .and_then(toml::Value::as_bool)
            == Some(true);
        if name != UNSAFE_CRATE && !inherits {
            wrong.push(format!(
                "{name} does not take the workspace's lints, which forbid unsafe code"
            ));
        }
        if name == UNSAFE_CRATE && inherits {
            wrong.push(format!(
                "{name} takes the workspace's lints, which forbid its unsafe code"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the crates' layering:\n{}",
        wrong.join("\n")
    );
}

/// A path from `start` back to it, if there is one.
fn circle_from(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_owned(), vec![start.to_owned()])];
    let mut seen = BTreeSet::new();
    while let Some((node, path)) = stack.pop() {
        for next in graph.get(&node).into_iter().flatten() {
            if next == start {
                let mut circle = path.clone();
                circle.push(start.to_owned());
                return Some(circle);
            }
            if seen.insert(next.clone()) && graph.contains_key(next) {
                let mut p = path.clone();
                p.push(next.clone());
                stack.push((next.clone(), p));
            }
        }
    }
    None
}

#[test]
fn the_reference_reader_finds_paths_and_groups() {
    let at: Vec<String> = ["hub", "http", "ui"].map(str::to_owned).to_vec();
    let refs = references(
        &at,
        "use super::state::Hub;\nuse crate::hub::{fleet::Fleet, store};\nlet x = self::pages::a();\n",
    );
    let want: BTreeSet<Vec<String>> = [
        vec!["hub", "http", "state", "Hub"],
        vec!["hub", "fleet", "Fleet"],
        vec!["hub", "store"],
        vec!["hub", "http", "ui", "pages", "a"],
    ]
    .into_iter()
    .map(|v| v.into_iter().map(str::to_owned).collect())
    .collect();
    assert_eq!(refs, want);
}

/// The runner's surface for the agent that starts it: its API client and where its
/// socket and lock live. Defaults, the cgroup leaf and `runner reap`'s report are the
/// two sides' contract, in railgrid-proto (`proto::runner`).
const RUNNER_SURFACE: &[&str] = &["client", "Paths"];

#[test]
fn the_agent_takes_from_the_runner_only_its_client_and_its_paths() {
    let src = root().join("crates/agent/src");
    let mut wrong = Vec::new();
    for path in rust_files(&src) {
        let text = fs::read_to_string(&path).expect("read a source file");
        let text = text.replace("railgrid_runner::", "crate::runner::");
        let at = module_of(&src, &path);
        for r in references(&at, &text) {
            if r.first().map(String::as_str) == Some("runner")
                && r.get(1)
                    .is_some_and(|s| !RUNNER_SURFACE.contains(&s.as_str()))
            {
                wrong.push(format!("{}: runner::{}", path.display(), r[1..].join("::")));
            }
        }
    }
    assert!(wrong.is_empty(), "reaches into the runner: {wrong:#?}");
}
