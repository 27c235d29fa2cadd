//! Writes the man pages of `railgrid` and each of its subcommands into a directory,
//! from the same definitions the parser uses (clap_mangen): `railgrid.1`,
//! `railgrid-hub-job-submit.1` …
//!
//!   cargo run --example man -- OUT_DIR

use clap::CommandFactory;

fn main() -> anyhow::Result<()> {
    let out = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: man OUT_DIR"))?;
    let out = std::path::PathBuf::from(out);
    std::fs::create_dir_all(&out)?;
    let cmd = railgrid::cli::Cli::command();
    let mut written = 0;
    write_all(&cmd, "railgrid", &out, &mut written)?;
    println!("{written} man pages in {}", out.display());
    Ok(())
}

/// The page of `cmd` (named `name`), then those of its subcommands.
fn write_all(
    cmd: &clap::Command,
    name: &str,
    out: &std::path::Path,
    written: &mut usize,
) -> anyhow::Result<()> {
    // clap keeps names as `&'static str`; a generator that ends at once may leak them.
    let static_name: &'static str = Box::leak(name.to_owned().into_boxed_str());
    let cmd = cmd.clone().name(static_name);
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    std::fs::write(out.join(format!("{name}.1")), page)?;
    *written += 1;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let sub_name = format!("{name}-{}", sub.get_name());
        write_all(sub, &sub_name, out, written)?;
    }
    Ok(())
}
