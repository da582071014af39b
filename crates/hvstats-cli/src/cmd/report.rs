//! `hvstats report`: what a recording says per VP (made by [`hvstats_surfaces::report`]), as text
//! or JSON.

use std::io::BufReader;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use hvstats_surfaces::report::{self, Digest};

/// Flags of `hvstats report`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// A recording made by `hvstats record`.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `hvstats report`.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let file = crate::input::open_regular(&args.file)?;
    let metadata = file.metadata()?;
    let digest =
        Digest::read(BufReader::new(file)).with_context(|| format!("reading {}", args.file.display()))?;
    let bytes_per_sample = (digest.samples > 0).then(|| metadata.len() / digest.samples as u64);
    // Through the shared output path: a closed pipe ends quietly, a full device is an error.
    if args.json {
        crate::output::print_json(&report::document(&digest, bytes_per_sample), true)?;
    } else {
        for piece in report::text(&digest) {
            crate::output::print(&piece)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
