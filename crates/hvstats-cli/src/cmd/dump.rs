//! `hvstats dump`.

use std::process::ExitCode;

/// Flags of `hvstats dump`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `hvstats dump`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("hvstats dump is not available in this build")
}
