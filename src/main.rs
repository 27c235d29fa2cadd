use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = railgrid::cli::Cli::parse();
    match railgrid::cmd::run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("railgrid: {err:#}");
            ExitCode::from(railgrid::cmd::exit_code(&err))
        }
    }
}
