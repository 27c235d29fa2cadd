//! `railgrid agent run | status | check-config`.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Context;

use super::{print_stdout, usage};
use crate::agent::config::{self, AgentConfig, Flags};
use crate::agent::status::{self, AgentStatus};
use crate::agent::{self as agent_mod, AgentError};
use crate::cli::{AgentArgs, AgentStatusArgs};

fn flags(args: &AgentArgs) -> Flags {
    Flags {
        config: args.config.clone(),
        state_dir: args.state_dir.clone(),
        log_dir: args.log_dir.clone(),
        runner_user: args.runner_user.clone(),
        hub: (!args.link.hub.is_empty()).then(|| args.link.hub.clone()),
        agent_id: args.link.agent_id.clone(),
        token_file: args.link.token_file.clone(),
        enrol_token: args.link.enrol_token.clone(),
        ca_file: args.link.ca_file.clone(),
        trusted_keys: (!args.link.trusted_key.is_empty()).then(|| args.link.trusted_key.clone()),
        labels: (!args.link.label.is_empty()).then(|| args.link.label.clone()),
    }
}

pub(super) fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    // Before any secret is near: the agent will hold the hub token, and without this any
    // process of its own account could read its memory and environment through /proc.
    if let Err(e) = crate::sys::forbid_inspection() {
        eprintln!("railgrid: warning: could not make the agent non-dumpable: {e}");
    }
    let flags = flags(&args);
    let cfg = config::load(&flags).map_err(usage)?;
    // Before any thread exists: state, logs and sockets are private unless made otherwise.
    crate::sys::set_umask(0o077);
    // Before anything else is touched (the log, the runner, the status file): a second
    // agent on a live state directory refuses here and changes nothing.
    let to_exit = |e: AgentError| {
        if e.is_config() {
            usage(e)
        } else {
            anyhow::Error::new(e)
        }
    };
    agent_mod::dirs::preflight(&cfg).map_err(to_exit)?;
    let traversable = cfg.runner.user.is_some();
    let instance = crate::agent::instance::acquire(&cfg.state_dir, traversable).map_err(to_exit)?;
    std::fs::create_dir_all(&cfg.log_dir)
        .with_context(|| format!("could not create log directory {}", cfg.log_dir.display()))?;
    let appender = tracing_appender::rolling::Builder::new()
        .rotation(tracing_appender::rolling::Rotation::DAILY)
        .filename_prefix("agent")
        .filename_suffix("log")
        .max_log_files(cfg.log_max_files)
        .build(&cfg.log_dir)
        .with_context(|| format!("could not open the agent log in {}", cfg.log_dir.display()))?;
    let (writer, _guard) = tracing_appender::non_blocking(appender);
    // Under launchd stderr is a file nobody rotates (the plist's StandardErrorPath): the
    // rolling log has every line, and stderr keeps only what comes before it.
    let launchd = matches!(
        crate::agent::upgrade::service::Service::detect(),
        crate::agent::upgrade::service::Service::Launchd { .. }
    );
    crate::logging::init(args.log.format, Some(writer), !launchd);

    let rt = super::current_thread_runtime()?;
    let state_dir = cfg.state_dir.clone();
    let reload = move || config::load(&flags);
    match rt.block_on(agent_mod::run(cfg, &instance, reload)) {
        Ok(None) => Ok(ExitCode::SUCCESS),
        Ok(Some(switch)) => {
            // Everything the old agent held goes first: its runtime (tasks, sockets), its
            // log writer (flushed), the state directory's lock (the new agent takes it).
            drop(rt);
            drop(_guard);
            drop(instance);
            let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
            let env: Vec<(std::ffi::OsString, std::ffi::OsString)> = std::env::vars_os().collect();
            // The bytes are checked once more, through the descriptor that will be
            // exec'd: the file was writable until now, and nothing runs that changed.
            if let Err(e) = switch.exe.verify() {
                crate::agent::upgrade::undo_switch_after_stop(&state_dir, &switch);
                return Err(anyhow::Error::new(e).context(
                    "the new binary changed after it was verified: not running it; the previous binary is back",
                ));
            }
            let e = switch.exe.exec_self(&switch.at, &argv, &env);
            Err(anyhow::Error::new(e).context(format!(
                "could not re-execute the agent from {} (version {}); the upgrade watcher restores the previous binary",
                switch.at.display(),
                switch.to
            )))
        }
        Err(e @ AgentError::Supervisor(crate::supervisor::Error::RootChild { .. })) => Err(usage(
            anyhow::Error::new(e).context("set runner.user (e.g. --runner-user nobody)"),
        )),
        Err(e) if e.is_config() => Err(usage(e)),
        Err(e) => Err(e.into()),
    }
}

pub(super) fn check_config(args: crate::cli::CheckConfigArgs) -> anyhow::Result<ExitCode> {
    let cfg: AgentConfig = config::load(&flags(&args.agent)).map_err(usage)?;
    // The token and CA files must be usable too; the hub itself is not contacted.
    if let Some(hub) = &cfg.hub {
        crate::agent::hub::check(hub).map_err(usage)?;
    }
    let text = cfg.effective().to_string();
    if args.json {
        let value: toml::Value = toml::from_str(&text)?;
        return print_stdout(&serde_json::to_string(&value)?);
    }
    print_stdout(&format!(
        "# railgrid agent: effective configuration (valid)\n{}",
        text.trim_end()
    ))
}

/// `railgrid agent upgrade --clear-bad`: forgets the versions remembered as bad.
pub(super) fn upgrade(args: crate::cli::AgentUpgradeArgs) -> anyhow::Result<ExitCode> {
    if !args.clear_bad {
        return Err(usage(anyhow::anyhow!(
            "nothing to do: give --clear-bad (the hub decides upgrades; see railgrid hub desired set --version)"
        )));
    }
    let state_dir = state_dir_of(args.target.config.clone(), args.target.state_dir.clone())?;
    if !state_dir.is_dir() {
        return Err(usage(anyhow::anyhow!(
            "no agent state directory at {}: give the agent's --state-dir or --config",
            state_dir.display()
        )));
    }
    let cleared = crate::agent::upgrade::record::update(&state_dir, |r| {
        let gone: Vec<String> = r.bad_versions.drain(..).map(|b| b.version).collect();
        (!gone.is_empty(), gone)
    })?;
    if cleared.is_empty() {
        print_stdout("no versions were remembered as bad")
    } else {
        print_stdout(&format!(
            "forgot {}: the agent tries them again when the hub asks (within a minute, or at once on SIGHUP)",
            cleared.join(", ")
        ))
    }
}

/// `railgrid agent upgrade-watch`: the upgrade's watcher, started by the agent.
pub(super) fn upgrade_watch(args: crate::cli::UpgradeWatchArgs) -> anyhow::Result<ExitCode> {
    use crate::agent::upgrade::{service::Service, watcher};
    let service = Service::parse(&args.service).ok_or_else(|| {
        usage(anyhow::anyhow!(
            "--service {:?}: give standalone, systemd:UNIT or launchd:LABEL",
            args.service
        ))
    })?;
    let finish = service.clone();
    let outcome = watcher::watch(&watcher::WatchArgs {
        state_dir: args.state_dir,
        to_sha256: args.to_sha256,
        service,
        stop_timeout: args.stop_timeout,
        agent_args: args.agent_args,
    });
    finish.finish_watcher();
    let outcome = outcome?;
    tracing::info!(?outcome, "the upgrade watcher is done");
    Ok(ExitCode::SUCCESS)
}

/// `railgrid agent upgrade-guard`: a watcher again for an upgrade whose watcher is gone.
pub(super) fn upgrade_guard(
    state_dir: &std::path::Path,
    log_dir: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    use crate::agent::upgrade::{service, watcher};
    if !state_dir.join(crate::agent::upgrade::record::FILE).exists() {
        return Ok(ExitCode::SUCCESS);
    }
    let started = watcher::revive(
        state_dir,
        "",
        watcher::Renew::FromNow,
        std::time::Duration::from_secs(90),
        &service::log_path(log_dir),
        &[],
    )?;
    if started {
        eprintln!("railgrid: an upgrade was in flight without its watcher: started one");
    }
    Ok(ExitCode::SUCCESS)
}

/// The state directory a command names: `--state-dir`, or the one of the config file.
pub(super) fn state_dir_of(
    config_path: Option<std::path::PathBuf>,
    state_dir: Option<std::path::PathBuf>,
) -> anyhow::Result<std::path::PathBuf> {
    if let Some(dir) = state_dir {
        return Ok(dir);
    }
    let flags = Flags {
        config: config_path,
        ..Flags::default()
    };
    match config::load(&flags) {
        Ok(cfg) => Ok(cfg.state_dir),
        Err(config::ConfigError::NoRunnerUser) => Ok(config::ROOT_STATE_DIR.into()),
        Err(e) => Err(usage(e)),
    }
}

/// Exit code when no agent is running.
pub(super) const NOT_RUNNING: u8 = 3;

pub(super) fn status(args: AgentStatusArgs) -> anyhow::Result<ExitCode> {
    // Only the state directory matters here; a config that lacks a runner user is still
    // good enough to find it.
    let state_dir = state_dir_of(args.target.config.clone(), args.target.state_dir.clone())?;
    let read = status::read(&state_dir);
    // An agent that holds the state directory but has not written its status yet (it is
    // reclaiming an orphan, or starting its runner) is starting, not absent.
    let holder = crate::agent::instance::holders(&state_dir)
        .and_then(|h| h.first().copied())
        .filter(|pid| !matches!(&read, Ok(st) if st.pid as i32 == *pid));
    if let Some(pid) = holder {
        if args.json {
            let starting = serde_json::json!({
                "running": true,
                "starting": true,
                "pid": pid,
                "state_dir": state_dir,
            });
            print_stdout(&serde_json::to_string_pretty(&starting)?)?;
        } else {
            print_stdout(&format!(
                "agent:      starting (pid {pid} holds {}; no status written yet)",
                crate::agent::instance::lock_path(&state_dir).display()
            ))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let st = match read {
        Ok(st) => st,
        Err(status::ReadError::Missing { path }) => {
            if args.json {
                let none = serde_json::json!({
                    "running": false,
                    "state_dir": state_dir,
                    "reason": format!("no status file at {}", path.display()),
                });
                print_stdout(&serde_json::to_string_pretty(&none)?)?;
            } else {
                eprintln!(
                    "railgrid: agent not running (no status file at {})",
                    path.display()
                );
            }
            return Ok(ExitCode::from(NOT_RUNNING));
        }
        Err(e) => return Err(e.into()),
    };
    let alive = status::agent_alive(&state_dir, &st);
    let last_line = last_log_line(&st.log_dir.join(crate::agent::RUNNER_LOG));
    let kept = alive.then(|| runner_kept(&state_dir)).flatten();
    if args.json {
        let mut value = serde_json::to_value(&st)?;
        // The file says what the agent last wrote; whether it still runs is known here.
        value["running"] = alive.into();
        value["runner"]["last_log_line"] = last_line.into();
        if let Some(h) = &kept {
            value["runner"]["kept"] = serde_json::json!({
                "finished_jobs": h.finished_jobs,
                "bytes": h.kept_bytes,
                "max_bytes": h.max_kept_bytes,
            });
            value["runner"]["sandbox"] = h.sandbox.clone().into();
            value["runner"]["network"] = h.network.clone().into();
        }
        print_stdout(&serde_json::to_string_pretty(&value)?)?;
    } else {
        let mut text = render(&st, alive, last_line.as_deref());
        if let Some(h) = &kept {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!(
                "kept:       {} finished jobs, {} of {} (runner.max_kept_bytes; `railgrid job prune` deletes them)",
                h.finished_jobs,
                super::job::mib(h.kept_bytes),
                super::job::mib(h.max_kept_bytes)
            ));
            text.push_str(&format!("\nsandbox:    {} (runner.sandbox)", h.sandbox));
            text.push_str(&format!(
                "\nnetwork:    {} (runner.network, or the hub's)",
                h.network
            ));
        }
        print_stdout(&text)?;
    }
    if alive {
        Ok(ExitCode::SUCCESS)
    } else {
        if !args.json {
            eprintln!("railgrid: agent not running (last seen as pid {})", st.pid);
        }
        Ok(ExitCode::from(NOT_RUNNING))
    }
}

/// What the runner's finished jobs keep and its sandbox, from its health, where this account may reach its
/// socket (root, or the runner's account) within a second; `None` otherwise.
fn runner_kept(state_dir: &std::path::Path) -> Option<crate::proto::health::Health> {
    let socket = crate::runner::Paths::new(state_dir).socket;
    let rt = super::current_thread_runtime().ok()?;
    rt.block_on(async {
        let client = crate::runner::client::Client::new(&socket);
        tokio::time::timeout(Duration::from_secs(1), client.health())
            .await
            .ok()?
            .ok()
    })
}

/// The last line of the runner's log, where this account may read it: the runner's own
/// last word (why it exited) is there, not in the agent's status.
fn last_log_line(path: &std::path::Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let tail = len.min(4096);
    f.seek(SeekFrom::Start(len - tail)).ok()?;
    let mut buf = Vec::new();
    f.take(tail).read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim_end().to_owned())
}

fn ago(t: SystemTime) -> String {
    let d = SystemTime::now().duration_since(t).unwrap_or_default();
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

fn render(st: &AgentStatus, alive: bool, last_line: Option<&str>) -> String {
    let mut out = String::new();
    let agent = match (alive, st.stopping) {
        (true, true) => "stopping: ending the runner and its jobs",
        (true, false) => "running",
        (false, _) => "not running",
    };
    out.push_str(&format!(
        "agent:      {agent} (pid {}, version {}, started {} ago, updated {} ago)\n",
        st.pid,
        st.version,
        ago(st.started_at),
        ago(st.updated_at)
    ));
    let r = &st.runner;
    let state = match r.state {
        crate::supervisor::State::Stopped if !st.runner_enabled => {
            "disabled by the desired state".to_owned()
        }
        s => format!("{s:?}").to_lowercase(),
    };
    let pid = r.pid.map(|p| format!("pid {p}, ")).unwrap_or_default();
    out.push_str(&format!(
        "runner:     {state} ({pid}{} starts, for {})\n",
        r.starts,
        ago(r.since)
    ));
    if let Some(err) = &r.last_error {
        out.push_str(&format!("last exit:  {err}\n"));
    }
    let log = st.log_dir.join(crate::agent::RUNNER_LOG);
    match last_line {
        Some(line) => out.push_str(&format!(
            "runner log: {} (last line: {line})\n",
            log.display()
        )),
        None => out.push_str(&format!("runner log: {}\n", log.display())),
    }
    if !st.reclaimed_pids.is_empty() {
        let pids: Vec<String> = st.reclaimed_pids.iter().map(i32::to_string).collect();
        out.push_str(&format!("reclaimed orphan runners: {}\n", pids.join(", ")));
    }
    for line in &st.reaped {
        out.push_str(&format!("reaped after the runner stopped: {line}\n"));
    }
    if let Some(exe) = &st.exe {
        out.push_str(&format!(
            "executable: {} (sha256 {}, {} bytes; runners are launched from these bytes)\n",
            exe.path.display(),
            exe.sha256,
            exe.size
        ));
    }
    if let Some(hub) = &st.hub {
        let link = match (hub.connected, hub.last_contact) {
            (true, _) => "connected".to_owned(),
            (false, Some(t)) => format!(
                "not connected (last contact {} ago)",
                ago(std::time::UNIX_EPOCH + Duration::from_secs(t))
            ),
            (false, None) => "not connected (never reached)".to_owned(),
        };
        out.push_str(&format!(
            "hub:        {} as {}: {link}, generation {} applied\n",
            hub.url, hub.agent_id, hub.generation
        ));
        if let Some(err) = &hub.last_error {
            out.push_str(&format!("hub error:  {err}\n"));
        }
        if let Some(v) = &hub.desired_version {
            out.push_str(&format!("desired version: {v}\n"));
        }
    }
    if let Some(u) = &st.upgrade {
        let target = u
            .target
            .as_deref()
            .map(|t| format!(" {t}"))
            .unwrap_or_default();
        out.push_str(&format!("upgrade:    {}{target}\n", u.state));
        if let Some(w) = &u.waiting {
            out.push_str(&format!("            {w}\n"));
        }
        if let Some(e) = &u.error {
            out.push_str(&format!("            {e}\n"));
        }
        if !u.bad_versions.is_empty() {
            out.push_str(&format!(
                "bad versions: {} (not tried again; railgrid agent upgrade --clear-bad)\n",
                u.bad_versions.join(", ")
            ));
        }
    }
    if let Some(d) = &st.drain {
        out.push_str(&format!(
            "drain:      {}: {}\n",
            d.summary(crate::util::unix_now_ms()),
            d.reason
        ));
        if d.host {
            out.push_str("            (ended on the host: railgrid agent resume)\n");
        }
    }
    if let Some(r) = st.reloads.as_ref().filter(|r| r.count > 0) {
        let when = r
            .last_at
            .map(|t| {
                format!(
                    " {} ago",
                    ago(std::time::UNIX_EPOCH + Duration::from_secs(t))
                )
            })
            .unwrap_or_default();
        let how = match &r.last_error {
            None => "applied".to_owned(),
            Some(why) => format!("refused, the running configuration kept: {why}"),
        };
        out.push_str(&format!("reloads:    {}; the last{when}: {how}\n", r.count));
    }
    out.push_str(&format!("state dir:  {}\n", st.state_dir.display()));
    out.push_str(&format!("log dir:    {}\n", st.log_dir.display()));
    out.push_str(&format!(
        "config:     {}",
        st.config_path
            .as_ref()
            .map_or_else(|| "(defaults)".to_owned(), |p| p.display().to_string())
    ));
    out
}
