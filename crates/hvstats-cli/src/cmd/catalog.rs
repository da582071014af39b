//! `hvstats catalog`.

use std::process::ExitCode;

/// Flags of `hvstats catalog`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `hvstats catalog`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("hvstats catalog is not available in this build")
}
