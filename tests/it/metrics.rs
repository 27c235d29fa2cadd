//! Metrics, as a real monitoring system takes them: the hub's (over TLS with a token, and
//! in plain HTTP on --metrics-listen) and the agent's with its runner's, checked by
//! `promtool check metrics` and scraped by a real Prometheus, whose query returns the
//! jobs just run; and the alert and recording rules of packaging/prometheus, loaded by that
//! Prometheus and tested with `promtool test rules`.

use std::fs;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::fixtures::*;

const LIMIT: Duration = Duration::from_secs(60);

/// `curl -s URL` (plain HTTP): the status and body.
fn get(url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}", url])
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// `promtool check metrics` on `text`: its complaints, if any.
fn promtool(text: &str, what: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/install-test-prerequisites.sh installs it)");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool on {what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The value of the single series `query` returns, once Prometheus has it.
fn prom_value(prom: &str, query: &str) -> Option<f64> {
    let url = format!(
        "{prom}/api/v1/query?query={}",
        query
            .replace('{', "%7B")
            .replace('}', "%7D")
            .replace('"', "%22")
            .replace('=', "%3D")
    );
    let (code, body) = get(&url);
    if code != 200 {
        return None;
    }
    let v: Value = serde_json::from_str(&body).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

#[test]
fn the_hub_and_the_agent_are_scraped_by_a_real_prometheus() {
    let dir = tempdir();
    let hub = TestHub::start(
        &dir.path().join("hub"),
        &["--metrics-listen", "127.0.0.1:0"],
    );
    let info: Value =
        serde_json::from_str(&read_lossy(&hub.dir.join("hub.json"))).expect("hub.json");
    let hub_metrics = info["metrics"]
        .as_str()
        .expect("metrics address")
        .to_owned();
    let token = hub.enrol("m1");
    let agent_port = free_port();
    let host = Host::new();
    let _agent = Guard::new(
        host.agent_cmd(&[])
            .args(hub.link("m1", &token))
            .env("RAILGRID_METRICS_LISTEN", format!("127.0.0.1:{agent_port}"))
            .stderr(Stdio::null())
            .spawn()
            .expect("agent"),
    );
    host.wait_runner("the runner serving", |_| true);
    for (id, code) in [("ok1", 0), ("ok2", 0), ("bad", 3)] {
        let out = hub.admin(&[
            "job",
            "submit",
            "--agent",
            "m1",
            "--id",
            id,
            "--wait",
            "--",
            "sh",
            "-c",
            &format!("exit {code}"),
        ]);
        assert_eq!(out.status.code(), Some(code), "{id}");
    }

    // Every endpoint passes promtool; the TLS one wants a token with agents:read.
    let (code, plain) = get(&format!("http://{hub_metrics}/metrics"));
    assert_eq!(code, 200);
    promtool(&plain, "the hub (plain)");
    assert!(
        plain.contains("railgrid_jobs_ended_total{state=\"succeeded\",reason=\"\"} 2"),
        "{plain}"
    );
    let (code, _) = hub.curl("GET", "/metrics", None, None);
    assert_eq!(code, 401);
    let (code, tls) = hub.curl("GET", "/metrics", Some(&hub.admin_token()), None);
    assert_eq!(code, 200);
    promtool(&tls, "the hub (TLS)");
    let reader = dir.path().join("reader.token");
    hub.create_token("jobs-only", "jobs:read", &[], &reader);
    let (code, body) = hub.curl("GET", "/metrics", Some(read_lossy(&reader).trim()), None);
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("agents:read"), "{body}");
    let agent_url = format!("http://127.0.0.1:{agent_port}/metrics");
    let (code, agent) = wait_for(LIMIT, "the agent's metrics with its runner's", || {
        let (code, body) = get(&agent_url);
        (code == 200 && body.contains("railgrid_runner_jobs_ended_total")).then_some((code, body))
    });
    assert_eq!(code, 200);
    promtool(&agent, "the agent");
    assert!(agent.contains("railgrid_agent_runner_up 1"), "{agent}");
    assert!(
        agent.contains("railgrid_agent_state_fs_size_bytes "),
        "{agent}"
    );
    // Every metric the rules name is one a hub or an agent exports.
    let rules = read_lossy(std::path::Path::new(RULES));
    for name in metric_names(&rules) {
        let exported = format!("# TYPE {name} ");
        assert!(
            plain.contains(&exported) || agent.contains(&exported),
            "{RULES} names {name}, which neither the hub nor the agent exports"
        );
    }

    // A real Prometheus scrapes both, and a query returns the jobs just run.
    let prom_port = free_port();
    let config = dir.path().join("prometheus.yml");
    fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: hub\n    static_configs:\n      - targets: ['{hub_metrics}']\n  - job_name: agent\n    static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n",
            fs::canonicalize(RULES).expect("the rules").display()
        ),
    )
    .expect("config");
    let _prometheus = Guard::new(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.path().join("prometheus.log")).expect("log"))
            .spawn()
            .expect("prometheus (scripts/install-test-prerequisites.sh installs it)"),
    );
    let prom = format!("http://127.0.0.1:{prom_port}");
    let succeeded = wait_for(LIMIT, "Prometheus to have the runner's jobs", || {
        prom_value(
            &prom,
            "railgrid_runner_jobs_ended_total{state=\"succeeded\"}",
        )
    });
    assert_eq!(succeeded, 2.0);
    let failed = wait_for(LIMIT, "Prometheus to have the hub's jobs", || {
        prom_value(
            &prom,
            "railgrid_jobs_ended_total{job=\"hub\",state=\"failed\"}",
        )
    });
    assert_eq!(failed, 1.0);
    let up = wait_for(LIMIT, "the agent up in Prometheus", || {
        prom_value(&prom, "railgrid_agents{state=\"connected\"}")
    });
    assert_eq!(up, 1.0);
    // Prometheus loaded the rules and evaluates them without an error.
    let loaded = wait_for(LIMIT, "the rules evaluated", || {
        let (code, body) = get(&format!("{prom}/api/v1/rules"));
        let v: Value = serde_json::from_str(&body).ok()?;
        let groups = v["data"]["groups"].as_array()?.clone();
        let evaluated = groups.len() == 2
            && groups.iter().all(|g| {
                g["rules"].as_array().is_some_and(|r| {
                    r.iter()
                        .all(|r| r["lastEvaluation"] != "0001-01-01T00:00:00Z")
                })
            });
        (code == 200 && evaluated).then_some(groups)
    });
    for g in &loaded {
        for r in g["rules"].as_array().expect("rules") {
            assert_eq!(r["health"], "ok", "{r}");
        }
    }
    let ratio = wait_for(LIMIT, "the disk ratio recorded", || {
        prom_value(&prom, "railgrid:agent_state_fs_avail:ratio")
    });
    assert!((0.0..=1.0).contains(&ratio), "{ratio}");
}

/// The alert and recording rules operators load (docs/operations.md, "Alerts").
const RULES: &str = "packaging/prometheus/railgrid.rules.yml";

/// The `railgrid_…` metrics an expression text names (a histogram's by its family).
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for (i, _) in text.match_indices("railgrid_") {
        if text[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let family = name.strip_suffix("_bucket").unwrap_or(&name).to_owned();
        names.insert(family);
    }
    names
}

#[test]
fn the_alert_rules_fire_and_stay_quiet_as_their_tests_say() {
    for args in [
        &["check", "rules", "railgrid.rules.yml"][..],
        &["test", "rules", "railgrid.test.yml"][..],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir("packaging/prometheus")
            .output()
            .expect("promtool (scripts/install-test-prerequisites.sh installs it)");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
