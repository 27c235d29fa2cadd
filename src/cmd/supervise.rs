//! `railgrid supervise`: the supervisor on its own, on the same code path as the agent's
//! runner.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, Context};
use tokio::signal::unix::{signal, SignalKind};

use super::usage;
use crate::cli::SuperviseArgs;
use crate::supervisor::account::Account;
use crate::supervisor::{self, env, lock, Config, Identity, Supervisor};

pub(super) fn run(args: SuperviseArgs) -> anyhow::Result<ExitCode> {
    let config = config(&args)?;
    let rt = super::current_thread_runtime()?;
    rt.block_on(async move {
        // Signals first, so a SIGTERM that arrives while the child starts is not lost.
        let mut term =
            signal(SignalKind::terminate()).context("could not install a SIGTERM handler")?;
        let mut int =
            signal(SignalKind::interrupt()).context("could not install a SIGINT handler")?;
        // A lost terminal (SIGHUP) or SIGQUIT would otherwise kill supervise and leave the
        // child, in its own session, unsupervised: they stop it like SIGTERM.
        let mut hup = signal(SignalKind::hangup()).context("could not install a SIGHUP handler")?;
        let mut quit = signal(SignalKind::quit()).context("could not install a SIGQUIT handler")?;
        let sup = Supervisor::new(config).map_err(refusal)?;
        if let Some(lock_path) = &args.lock {
            let path = lock_path.clone();
            let grace = args.stop_grace;
            let reclaimed =
                tokio::task::spawn_blocking(move || lock::reclaim_stale_holder(&path, grace))
                    .await
                    .context("lock reclaim task failed")?
                    .with_context(|| {
                        format!(
                            "could not reclaim the stale holder of {}",
                            lock_path.display()
                        )
                    })?;
            match reclaimed {
                Some(pid) => {
                    tracing::warn!(pid, lock = %lock_path.display(), "reclaimed stale lock holder")
                }
                None => tracing::info!(lock = %lock_path.display(), "lock is free"),
            }
        }
        let mut status = sup.subscribe();
        sup.start().await.map_err(|e| match e {
            // A log file left by another account: the operator's to fix (exit 2).
            e @ supervisor::Error::Log(supervisor::log::LogError::NotOurs { .. }) => usage(e),
            e => e.into(),
        })?;
        let mut started = false;
        let which = loop {
            // Cancel-safe: signal streams buffer deliveries between polls, and `wait_for`
            // only observes the channel.
            tokio::select! {
                _ = status.wait_for(|s| s.pid.is_some() || s.last_error.is_some()), if !started => {
                    // The first launch is done: the code that only startup ran can go.
                    started = true;
                    crate::util::release_startup_code();
                }
                _ = term.recv() => break "SIGTERM",
                _ = int.recv() => break "SIGINT",
                _ = hup.recv() => break "SIGHUP",
                _ = quit.recv() => break "SIGQUIT",
            }
        };
        tracing::info!("{which} received: stopping");
        sup.stop().await;
        Ok(ExitCode::SUCCESS)
    })
}

/// Turns construction refusals into usage errors that say which flag fixes them.
fn refusal(err: supervisor::Error) -> anyhow::Error {
    match err {
        supervisor::Error::RootChild { .. } => usage(anyhow!(
            "refusing to run the child as root: pass --user NAME, or --uid/--gid of a non-root account"
        )),
        other => usage(other),
    }
}

fn config(args: &SuperviseArgs) -> anyhow::Result<Config> {
    let identity = match (&args.user, args.uid, args.gid) {
        (Some(name), _, _) => Identity::User(Account::by_name(name).map_err(usage)?),
        (None, Some(uid), Some(gid)) => {
            let mut acct = Account::by_uid(uid).unwrap_or_else(|| Account::numeric(uid, gid));
            acct.gid = gid;
            Identity::User(acct)
        }
        _ => Identity::Inherit,
    };
    let account = match &identity {
        Identity::User(acct) => acct.clone(),
        Identity::Inherit => Account::current(),
    };
    let cwd = std::env::current_dir().context("could not read the current directory")?;
    let child_path = args.path.as_deref().unwrap_or(supervisor::DEFAULT_PATH);
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| usage(anyhow!("no PROGRAM given after --")))?;
    let program = resolve_program(program, child_path, &cwd)?;
    let env = env::child_env(
        &account,
        args.home.as_deref(),
        args.path.as_deref(),
        &args.env,
    )
    .map_err(usage)?;

    let mut c = Config::new(program.display().to_string(), program, cwd.join(&args.log));
    c.args = rest.to_vec();
    c.dir = cwd.join(&args.dir);
    c.env = env;
    c.identity = identity;
    c.max_log_bytes = args.max_log_bytes;
    c.stop_grace = args.stop_grace;
    c.initial_backoff = args.initial_backoff;
    Ok(c)
}

/// `PROGRAM` as an absolute path: taken relative to the current directory when it holds a
/// slash, else looked up in the child's PATH (not ours: the child's is what it will see).
fn resolve_program(program: &OsStr, child_path: &str, cwd: &Path) -> anyhow::Result<PathBuf> {
    let p = Path::new(program);
    if p.components().count() > 1 || p.is_absolute() {
        return Ok(cwd.join(p));
    }
    child_path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(p))
        .find(|cand| is_executable(cand))
        .ok_or_else(|| {
            usage(anyhow!(
                "program {} not found in the child's PATH ({child_path}): give its absolute path or set --path",
                p.display()
            ))
        })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
