//! `railgrid agent install | uninstall`: prints the plan, asks before a purge, applies it.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use super::usage;
use crate::agent::install::{self, InstallError, InstallOptions, Plan, UninstallOptions};
use crate::cli::{AgentInstallArgs, AgentUninstallArgs};

/// Whatever stops a plan from being made is a refusal: nothing has been changed yet.
fn to_exit(e: InstallError) -> anyhow::Error {
    usage(e)
}

pub(super) fn install(args: AgentInstallArgs) -> anyhow::Result<ExitCode> {
    let opts = InstallOptions {
        hub: (!args.link.hub.is_empty()).then_some(args.link.hub),
        agent_id: args.link.agent_id,
        token_file: args.link.token_file,
        enrol_token: args.link.enrol_token,
        ca_file: args.link.ca_file,
        trusted_keys: args.link.trusted_key,
        labels: args.link.label,
        runner_user: args.runner_user,
        prefix: args.prefix,
        root: args.root,
        dry_run: args.dry_run,
        no_start: args.no_start,
    };
    let plan = install::plan_install(&opts).map_err(to_exit)?;
    if args.json {
        return super::print_stdout(&plan.to_json().to_string());
    }
    finish(&plan, opts.dry_run, "installed")
}

pub(super) fn uninstall(args: AgentUninstallArgs) -> anyhow::Result<ExitCode> {
    let opts = UninstallOptions {
        purge: args.purge,
        root: args.root,
        dry_run: args.dry_run,
    };
    let plan = install::plan_uninstall(&opts).map_err(to_exit)?;
    if opts.purge && !opts.dry_run && !args.yes && !plan.is_noop() {
        confirm_purge(&plan)?;
    }
    finish(&plan, opts.dry_run, "uninstalled")
}

/// Prints the plan (`--dry-run`) or applies it, a line per step as it is done.
fn finish(plan: &Plan, dry_run: bool, done_word: &str) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if dry_run {
        writeln!(out, "{} (--dry-run: nothing is changed)", plan.title)?;
        for step in &plan.steps {
            writeln!(out, "{}", step.line())?;
        }
        for note in &plan.notes {
            writeln!(out, "note: {note}")?;
        }
        let files = plan.files();
        if !files.is_empty() {
            writeln!(out, "\nfiles that would be written:\n{files}")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "{}", plan.title)?;
    out.flush()?;
    let applied = plan.apply(|step| {
        let _ = writeln!(out, "{}", step.line());
        let _ = out.flush();
    });
    if let Err(e) = applied {
        return Err(anyhow::Error::new(e).context(
            "stopped here: the steps above are done, the rest are not; run the command again to finish",
        ));
    }
    for note in &plan.notes {
        writeln!(out, "note: {note}")?;
    }
    if plan.is_noop() {
        writeln!(out, "nothing to change: already {done_word}")?;
    } else {
        writeln!(out, "{done_word}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `--purge` without `--yes`: asks on a terminal, refuses without one.
fn confirm_purge(plan: &Plan) -> anyhow::Result<()> {
    let gone: Vec<&str> = plan
        .steps
        .iter()
        .filter(|s| s.removes_tree())
        .map(|s| s.subject.as_str())
        .collect();
    if !std::io::stdin().is_terminal() {
        return Err(usage(anyhow::anyhow!(
            "--purge removes {} with everything in them: give --yes to confirm (there is no terminal to ask on)",
            gone.join(", ")
        )));
    }
    let mut err = std::io::stderr().lock();
    writeln!(
        err,
        "{}: besides the service and its binary, this removes",
        plan.title
    )?;
    for path in &gone {
        writeln!(err, "  {path}")?;
    }
    write!(err, "Remove them for good? [y/N] ")?;
    err.flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(usage(anyhow::anyhow!("not confirmed: nothing was changed")))
    }
}
