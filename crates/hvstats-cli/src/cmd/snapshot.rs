//! `hvstats snapshot`.

use std::process::ExitCode;

/// Flags of `hvstats snapshot`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `hvstats snapshot`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("hvstats snapshot is not available in this build")
}
