//! `hvstats hwc`.

use std::process::ExitCode;

/// Flags of `hvstats hwc`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `hvstats hwc`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("hvstats hwc is not available in this build")
}
