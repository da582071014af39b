//! `hvstats run`.

use std::process::ExitCode;

/// Flags of `hvstats run`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `hvstats run`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("hvstats run is not available in this build")
}
