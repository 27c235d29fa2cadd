use super::sources::SETTINGS;
use super::*;
use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn write(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("agent.toml");
    fs::write(&p, text).unwrap();
    p
}

/// Flags that name a file holding `text` as the configuration, and the file.
fn file_flags(dir: &Path, text: &str) -> (Flags, PathBuf) {
    let path = write(dir, text);
    let flags = Flags {
        config: Some(path.clone()),
        ..Flags::default()
    };
    (flags, path)
}

/// An owner-only token file in `dir`.
fn token_file(dir: &Path) -> PathBuf {
    let token = dir.join("token");
    fs::write(&token, "secret").unwrap();
    fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
    token
}

/// The message of a refused configuration, checked to hold every one of `parts`.
fn refused(flags: &Flags, env: &dyn Fn(&str) -> Option<String>, parts: &[&str]) -> String {
    let err = load_with(flags, false, env).unwrap_err().to_string();
    for part in parts {
        assert!(err.contains(part), "{part:?} not in: {err}");
    }
    err
}

#[test]
fn flags_beat_environment_beat_file() {
    let dir = tempfile::tempdir().unwrap();
    let (flags, _) = file_flags(
        dir.path(),
        "state_dir = \"from-file\"\nlog_dir = \"/logs\"\n[runner]\nstop_grace = \"3s\"\n",
    );
    let env = env_of(&[
        ("RAILGRID_LOG_DIR", "/env-logs"),
        ("RAILGRID_RUNNER_STOP_GRACE", "4s"),
    ]);
    let c = load_with(&flags, false, &env).unwrap();
    assert_eq!(
        c.state_dir,
        dir.path().join("from-file"),
        "relative to the file"
    );
    assert_eq!(c.log_dir, PathBuf::from("/env-logs"));
    assert_eq!(c.runner.stop_grace, Duration::from_secs(4));
    let flags = Flags {
        log_dir: Some("/flag-logs".into()),
        ..flags
    };
    assert_eq!(
        load_with(&flags, false, &env).unwrap().log_dir,
        PathBuf::from("/flag-logs")
    );
}

#[test]
fn errors_name_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let (flags, path) = file_flags(dir.path(), "[runner]\nstop_grace = \"soon\"\n");
    let shown = path.display().to_string();
    let env = env_of(&[("HOME", "/h")]);
    refused(&flags, &env, &[&shown, "runner.stop_grace", "250ms"]);
    write(dir.path(), "[runner]\nuser = \"nobody\"\nbogus = 1\n");
    refused(&flags, &env_of(&[]), &["bogus", &shown]);
}

#[test]
fn job_limits_pass_through_and_zero_is_refused() {
    let env = env_of(&[("HOME", "/h"), ("RAILGRID_RUNNER_MAX_JOBS", "3")]);
    let c = load_with(&Flags::default(), false, &env).unwrap();
    assert_eq!((c.runner.max_jobs, c.runner.max_queued), (Some(3), None));
    let env = env_of(&[("HOME", "/h"), ("RAILGRID_RUNNER_MAX_JOBS", "0")]);
    refused(
        &Flags::default(),
        &env,
        &["RAILGRID_RUNNER_MAX_JOBS", "at least 1"],
    );
}

#[test]
fn stop_grace_is_bounded() {
    let env = env_of(&[("HOME", "/h"), ("RAILGRID_RUNNER_STOP_GRACE", "1h")]);
    refused(
        &Flags::default(),
        &env,
        &["RAILGRID_RUNNER_STOP_GRACE", "1m"],
    );
    let dir = tempfile::tempdir().unwrap();
    let (flags, path) = file_flags(dir.path(), "[runner]\nstop_grace = \"61s\"\n");
    let shown = path.display().to_string();
    refused(
        &flags,
        &env_of(&[("HOME", "/h")]),
        &["runner.stop_grace", &shown],
    );
    let env = env_of(&[("HOME", "/h"), ("RAILGRID_RUNNER_STOP_GRACE", "1m")]);
    let c = load_with(&Flags::default(), false, &env).unwrap();
    assert_eq!(c.runner.stop_grace, MAX_STOP_GRACE);
}

#[test]
fn root_needs_a_runner_user() {
    let err = load_with(
        &Flags::default(),
        true,
        &env_of(&[("RAILGRID_CONFIG", "/nonexistent/agent.toml")]),
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }), "{err}");
    let flags = Flags {
        state_dir: Some("/s".into()),
        ..Flags::default()
    };
    // With no file at the root default path this machine may or may not have one; name an empty one.
    let dir = tempfile::tempdir().unwrap();
    let flags = Flags {
        config: Some(write(dir.path(), "")),
        ..flags
    };
    let err = load_with(&flags, true, &env_of(&[])).unwrap_err();
    assert!(matches!(err, ConfigError::NoRunnerUser));
    assert!(err.to_string().contains("--runner-user nobody"));
}

#[test]
fn a_token_file_open_to_others_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    fs::write(&token, "secret").unwrap();
    fs::set_permissions(&token, fs::Permissions::from_mode(0o640)).unwrap();
    let flags = Flags {
        state_dir: Some(dir.path().into()),
        log_dir: Some(dir.path().into()),
        hub: Some(vec!["https://hub.example".into()]),
        token_file: Some(token.clone()),
        config: Some(write(dir.path(), "")),
        ..Flags::default()
    };
    refused(&flags, &env_of(&[]), &["--token-file", "chmod 600"]);
    fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
    assert!(load_with(&flags, false, &env_of(&[]))
        .unwrap()
        .hub
        .is_some());
}

#[test]
fn the_replicas_of_a_hub_come_as_a_list_from_every_source() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    let file = write(
        dir.path(),
        "[hub]\nurl = [\"https://a:8443/\", \"https://b:8443\", \"https://a:8443\"]\nagent_id = \"x\"\n",
    );
    let flags = Flags {
        config: Some(file),
        token_file: Some(token),
        ..Flags::default()
    };
    let env = env_of(&[("HOME", "/h")]);
    let hub = load_with(&flags, false, &env).unwrap().hub.unwrap();
    assert_eq!(
        hub.urls,
        ["https://a:8443", "https://b:8443"],
        "in order, once each"
    );
    let env = env_of(&[("HOME", "/h"), ("RAILGRID_HUB_URL", "https://c, https://d")]);
    let hub = load_with(&flags, false, &env).unwrap().hub.unwrap();
    assert_eq!(
        hub.urls,
        ["https://c", "https://d"],
        "the environment over the file"
    );
    let with_flags = Flags {
        hub: Some(vec!["https://e".into(), "https://f".into()]),
        ..flags.clone()
    };
    let hub = load_with(&with_flags, false, &env).unwrap().hub.unwrap();
    assert_eq!(
        hub.urls,
        ["https://e", "https://f"],
        "flags over everything"
    );
    let bad = Flags {
        hub: Some(vec!["https://e".into(), "http://plain".into()]),
        ..flags
    };
    refused(&bad, &env, &["http://plain", "https://"]);
}

#[test]
fn the_agent_id_defaults_to_the_host_name_and_must_fit_a_url() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    let flags = Flags {
        config: Some(write(dir.path(), "[hub]\nurl = \"https://hub.example/\"\n")),
        token_file: Some(token),
        ..Flags::default()
    };
    let env = env_of(&[("HOME", "/h")]);
    let hub = load_with(&flags, false, &env).unwrap().hub.unwrap();
    assert_eq!(hub.urls, ["https://hub.example"], "no trailing slash");
    if let Some(host) = crate::sys::hostname().filter(|h| check_agent_id(h).is_ok()) {
        assert_eq!(hub.agent_id, host);
    }
    let env = env_of(&[("HOME", "/h"), ("RAILGRID_HUB_AGENT_ID", "from-env")]);
    let hub = load_with(&flags, false, &env).unwrap().hub.unwrap();
    assert_eq!(hub.agent_id, "from-env");
    let with_flag = Flags {
        agent_id: Some("build-17.example".into()),
        ..flags.clone()
    };
    let hub = load_with(&with_flag, false, &env).unwrap().hub.unwrap();
    assert_eq!(hub.agent_id, "build-17.example");

    for bad in ["a/b", "../x", "", "-x", "a b", "é"] {
        let flags = Flags {
            agent_id: Some(bad.into()),
            ..flags.clone()
        };
        refused(&flags, &env, &["--agent-id", "invalid agent id"]);
    }
    let no_hub = Flags {
        agent_id: Some("a1".into()),
        ..Flags::default()
    };
    refused(&no_hub, &env_of(&[("HOME", "/h")]), &["without a hub URL"]);
}

#[test]
fn non_root_defaults_follow_xdg() {
    let env = env_of(&[("XDG_STATE_HOME", "/x/state"), ("HOME", "/home/u")]);
    let c = load_with(&Flags::default(), false, &env).unwrap();
    assert_eq!(c.state_dir, PathBuf::from("/x/state/railgrid"));
    assert_eq!(c.log_dir, PathBuf::from("/x/state/railgrid"));
    assert_eq!(
        default_config_path(false, &env),
        Some(PathBuf::from("/home/u/.config/railgrid/agent.toml"))
    );
}

#[test]
fn the_shipped_example_parses() {
    let text = include_str!("../../../../packaging/agent.toml.example");
    let raw: RawConfig = toml::from_str(text).unwrap();
    assert_eq!(raw.runner.user.as_deref(), Some("nobody"));
}

/// The shipped example with its commented-out keys (`# max_jobs = 4`, `# [hub]`) put in.
fn example_with_every_key() -> String {
    let text = include_str!("../../../../packaging/agent.toml.example");
    text.lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest)
                if rest.starts_with('[')
                    || rest.split_once(" = ").is_some_and(|(k, _)| {
                        k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    }) =>
            {
                rest
            }
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The dotted keys of a TOML document's values; a setting whose value is a table
/// (`agent.labels`) is one key.
fn toml_keys(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in table {
        let key = format!("{prefix}{k}");
        match v {
            toml::Value::Table(t) if !SETTINGS.iter().any(|s| s.toml == key) => {
                toml_keys(t, &format!("{key}."), out)
            }
            _ => out.push(key),
        }
    }
}

#[test]
fn the_shipped_example_shows_every_setting() {
    let text = example_with_every_key();
    let raw: RawConfig = toml::from_str(&text).unwrap();
    for s in SETTINGS {
        assert!(
            (s.file)(&raw).is_some(),
            "{} not read from the file",
            s.toml
        );
    }
    let mut keys = Vec::new();
    toml_keys(&toml::from_str(&text).unwrap(), "", &mut keys);
    keys.sort();
    let mut expected: Vec<String> = SETTINGS.iter().map(|s| s.toml.to_owned()).collect();
    expected.sort();
    assert_eq!(keys, expected);
}

#[test]
fn every_setting_is_named_once_in_each_source() {
    let distinct = |names: Vec<&str>| {
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "a name is used twice: {names:?}");
    };
    distinct(SETTINGS.iter().map(|s| s.toml).collect());
    distinct(SETTINGS.iter().map(|s| s.env).collect());
    distinct(
        SETTINGS
            .iter()
            .filter_map(|s| s.flag.as_ref().map(|f| f.name))
            .collect(),
    );
    for (i, s) in SETTINGS.iter().enumerate() {
        assert_eq!(s.key as usize, i, "{}", s.toml);
        assert_eq!(s.key.setting().toml, s.toml);
    }

    // Every variable is a constant of env_vars.rs, and every agent-setting constant
    // there is a setting.
    let consts: Vec<&str> = include_str!("../../../../crates/util/src/env_vars.rs")
        .lines()
        .filter_map(|l| {
            l.strip_prefix("pub const ")
                .or_else(|| l.strip_prefix("pub const "))?
                .split_once(": &str = \"")
        })
        .filter_map(|(_, value)| value.strip_suffix("\";"))
        .collect();
    for s in SETTINGS {
        assert!(consts.contains(&s.env), "{} is not in env_vars.rs", s.env);
    }
    // The hub's own variables are `railgrid hub`'s, not the agent's.
    let not_settings = [
        env_vars::CONFIG,
        env_vars::LOG,
        env_vars::LOG_FORMAT,
        env_vars::JOB_ID,
        env_vars::SECRETS_DIR,
        env_vars::HUB_DATA_DIR,
        env_vars::HUB_ADMIN_URL,
        env_vars::HUB_ADMIN_TOKEN_FILE,
        env_vars::HUB_ADMIN_CA_FILE,
    ];
    for c in consts.iter().filter(|c| c.starts_with("RAILGRID_")) {
        assert!(
            not_settings.contains(c) || SETTINGS.iter().any(|s| s.env == *c),
            "{c} is in env_vars.rs but is no setting"
        );
    }
}

#[test]
fn every_setting_takes_flag_then_environment_then_file() {
    let raw: RawConfig = toml::from_str(&example_with_every_key()).unwrap();
    let file = Some((PathBuf::from("/etc/agent.toml"), raw));
    let all_flags = Flags {
        config: None,
        state_dir: Some("/flag".into()),
        log_dir: Some("/flag".into()),
        runner_user: Some("flag".into()),
        hub: Some(vec!["flag".into()]),
        agent_id: Some("flag".into()),
        token_file: Some("/flag".into()),
        enrol_token: Some("/flag".into()),
        ca_file: Some("/flag".into()),
        trusted_keys: Some(vec!["flag".into()]),
        labels: Some(vec!["flag=flag".into()]),
    };
    let no_flags = Flags::default();
    let env = |k: &str| k.starts_with("RAILGRID_").then(|| "env".to_owned());
    let empty_env = |k: &str| k.starts_with("RAILGRID_").then(String::new);
    let both = Sources {
        file: file.clone(),
        env: &env,
        flags: &all_flags,
    };
    let env_file = Sources {
        file: file.clone(),
        env: &env,
        flags: &no_flags,
    };
    let file_only = Sources {
        file,
        env: &empty_env,
        flags: &no_flags,
    };
    let none = Sources {
        file: None,
        env: &empty_env,
        flags: &no_flags,
    };
    for s in SETTINGS {
        let (v, origin) = both.get(s.key).unwrap();
        match &s.flag {
            Some(flag) => {
                assert!(v.contains("flag"), "{}: {v}", s.toml);
                assert_eq!(origin.describe(), format!("flag {}", flag.name));
            }
            None => assert_eq!(v, "env", "{}", s.toml),
        }
        let (v, origin) = env_file.get(s.key).unwrap();
        assert_eq!(v, "env", "{}", s.toml);
        assert_eq!(origin.describe(), format!("environment variable {}", s.env));
        let (_, origin) = file_only.get(s.key).unwrap();
        assert_eq!(
            origin.describe(),
            format!("/etc/agent.toml: key {}", s.toml)
        );
        assert!(none.get(s.key).is_none(), "{}", s.toml);
    }
}

/// Each row of the table in docs/operations.md names a setting by its variable and flag.
#[test]
fn the_documented_settings_match() {
    let docs = include_str!("../../../../docs/operations.md");
    let table = docs
        .split_once("| key | variable | flag | default |")
        .unwrap()
        .1
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    let mut rows = 0;
    for row in table {
        let cells: Vec<&str> = row.split('|').map(|c| c.trim().trim_matches('`')).collect();
        let (key, var, flag) = (cells[1], cells[2], cells[3]);
        let s = SETTINGS
            .iter()
            .find(|s| s.toml == key)
            .unwrap_or_else(|| panic!("documented {key} is no setting"));
        assert_eq!(var, s.env, "{key}");
        assert_eq!(flag, s.flag.as_ref().map_or("", |f| f.name), "{key}");
        rows += 1;
    }
    assert_eq!(rows, SETTINGS.len(), "every setting has its row");
}

/// `check-config` prints every setting under its file key.
#[test]
fn the_effective_configuration_names_every_setting() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    // A CA file is read when the configuration is loaded: a real one.
    let ca = dir.path().join("ca.pem");
    let cert = rcgen::generate_simple_self_signed(vec!["hub.example".into()]).unwrap();
    fs::write(&ca, cert.cert.pem()).unwrap();
    let flags = Flags {
        config: Some(write(dir.path(), "")),
        hub: Some(vec!["https://hub.example".into()]),
        token_file: Some(token.clone()),
        enrol_token: Some(token),
        ca_file: Some(ca),
        ..Flags::default()
    };
    let env = env_of(&[
        ("HOME", "/h"),
        ("RAILGRID_METRICS_LISTEN", "127.0.0.1:9469"),
        ("RAILGRID_RUNNER_MAX_JOBS", "2"),
        ("RAILGRID_RUNNER_MAX_JOBS_PER_OWNER", "2"),
        ("RAILGRID_RUNNER_MAX_QUEUED", "2"),
        ("RAILGRID_RUNNER_MAX_OUTPUT_BYTES", "2"),
    ]);
    let c = load_with(&flags, false, &env).unwrap();
    let text = c.effective().to_string();
    let mut keys = Vec::new();
    toml_keys(&toml::from_str(&text).unwrap(), "", &mut keys);
    keys.retain(|k| k != "config_file" && k != "hub.token");
    keys.sort();
    let mut expected: Vec<String> = SETTINGS.iter().map(|s| s.toml.to_owned()).collect();
    expected.sort();
    assert_eq!(keys, expected);
}

#[test]
fn labels_come_from_every_source_and_a_bad_one_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let (flags, path) = file_flags(dir.path(), "[agent]\nlabels = { queue = \"build\" }\n");
    let env = env_of(&[("HOME", "/h")]);
    let c = load_with(&flags, false, &env).unwrap();
    assert_eq!(crate::proto::labels::to_list(&c.labels), "queue=build");
    let env = env_of(&[
        ("HOME", "/h"),
        ("RAILGRID_AGENT_LABELS", "gpu=a100, queue=test"),
    ]);
    let c = load_with(&flags, false, &env).unwrap();
    assert_eq!(
        crate::proto::labels::to_list(&c.labels),
        "gpu=a100,queue=test"
    );
    let with_flag = Flags {
        labels: Some(vec!["zone=b".into()]),
        ..flags.clone()
    };
    let c = load_with(&with_flag, false, &env).unwrap();
    assert_eq!(crate::proto::labels::to_list(&c.labels), "zone=b");

    let bad = Flags {
        labels: Some(vec!["os=plan9".into()]),
        ..flags.clone()
    };
    refused(&bad, &env, &["flag --label", "os, arch and hostname"]);
    let env = env_of(&[("HOME", "/h"), ("RAILGRID_AGENT_LABELS", "queue")]);
    refused(
        &flags,
        &env,
        &["RAILGRID_AGENT_LABELS", "\"queue\"", "KEY=VALUE"],
    );
    write(dir.path(), "[agent]\nlabels = { Queue = \"x y\" }\n");
    let shown = path.display().to_string();
    refused(
        &flags,
        &env_of(&[("HOME", "/h")]),
        &[&shown, "agent.labels", "\"Queue\""],
    );
}

#[test]
fn an_enrolment_token_puts_the_agents_own_token_in_the_state_dir() {
    let dir = tempfile::tempdir().unwrap();
    let enrol = token_file(dir.path());
    let flags = Flags {
        config: Some(write(dir.path(), "")),
        state_dir: Some(dir.path().join("state")),
        runner_user: Some("nobody".into()),
        hub: Some(vec!["https://hub.example".into()]),
        enrol_token: Some(enrol.clone()),
        ..Flags::default()
    };
    let env = env_of(&[("HOME", "/h")]);
    let c = load_with(&flags, true, &env).unwrap();
    let hub = c.hub.expect("a hub");
    assert_eq!(hub.token_file, dir.path().join("state/hub.token"));
    assert_eq!(hub.enrol_token_file, Some(enrol));
    // Without a hub, an enrolment token is a mistake, named.
    let alone = Flags { hub: None, ..flags };
    let e = load_with(&alone, true, &env).unwrap_err().to_string();
    assert!(e.contains("enrolment token without a hub URL"), "{e}");
}

#[test]
fn metrics_listen_only_on_loopback_unless_allowed() {
    let env_with = |listen: &'static str, allow: Option<&'static str>| {
        let mut v = vec![("HOME", "/h"), ("RAILGRID_METRICS_LISTEN", listen)];
        if let Some(a) = allow {
            v.push(("RAILGRID_METRICS_ALLOW_REMOTE", a));
        }
        env_of(&v)
    };
    let flags = Flags::default();
    let c = load_with(&flags, false, &env_with("127.0.0.1:9469", None)).unwrap();
    assert_eq!(c.metrics.map(|m| m.listen.port()), Some(9469));
    let e = load_with(&flags, false, &env_with("0.0.0.0:9469", None))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not a loopback address") && e.contains("RAILGRID_METRICS_LISTEN"),
        "{e}"
    );
    let c = load_with(&flags, false, &env_with("0.0.0.0:9469", Some("true"))).unwrap();
    assert!(c.metrics.is_some_and(|m| m.allow_remote));
    let e = load_with(&flags, false, &env_with("localhost", None))
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected an address and port"), "{e}");
    assert!(load_with(&flags, false, &env_of(&[("HOME", "/h")]))
        .unwrap()
        .metrics
        .is_none());
}
