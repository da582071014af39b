//! `hvstats plot`: charts of a recording (drawn by [`hvstats_surfaces::chart`]) written to a PNG
//! or SVG file named by its extension.

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use hvstats_abi::Counter;
use hvstats_surfaces::chart::{
    Format, MAX_BITMAP_BYTES, VisitVp, busiest, charts_of, first_and_last_totals, image_size, quiet_defaults,
    render,
};
use hvstats_surfaces::recording::SampleReader;

use crate::output_file::OutputFile;

/// Flags of `hvstats plot`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// A recording made by `hvstats record`.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// The chart to write: `.png` or `.svg`.
    #[arg(short = 'o', long, value_name = "CHART")]
    output: PathBuf,
    /// A VP counter to chart, by catalog name or the name report and snapshot print (`HLT time
    /// halted`) (repeat for several; default: the three busiest
    /// rates).
    #[arg(long = "counter", value_name = "NAME")]
    counters: Vec<String>,
    /// Chart size in pixels, WIDTHxHEIGHT of each counter's chart (all the charts together at most
    /// 64 MiB of bitmap).
    #[arg(long, value_name = "WxH", default_value = "1000x360", value_parser = parse_size)]
    size: (u32, u32),
    /// Replace CHART if it is an existing regular file (by writing a new file and renaming it).
    #[arg(long)]
    force: bool,
}

fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let parsed = s.split_once('x').and_then(|(w, h)| Some((w.parse::<u32>().ok()?, h.parse::<u32>().ok()?)));
    match parsed {
        Some((w, h)) if (200..=8000).contains(&w) && (150..=8000).contains(&h) => Ok((w, h)),
        _ => Err(format!("{s:?}: WIDTHxHEIGHT, 200 to 8000 by 150 to 8000 pixels")),
    }
}

/// Streams the VPs of the recording at `path`, with the number of their sample, to `f`.
fn stream_vps(path: &Path, f: &mut VisitVp<'_>) -> anyhow::Result<()> {
    let file = crate::input::open_regular(path)?;
    let reading = || format!("reading {}", path.display());
    let mut reader = SampleReader::new(BufReader::new(file)).with_context(reading)?;
    let mut n = 0;
    while reader.next_with(|at| f(n, at)).with_context(reading)?.is_some() {
        n += 1;
    }
    Ok(())
}

/// A usage error of `plot`: said on standard error, exit status 2, nothing written.
fn usage(message: impl std::fmt::Display) -> anyhow::Result<ExitCode> {
    crate::output::note!("{message}");
    Ok(crate::output::ExitStatus::Usage.into())
}

/// Runs `hvstats plot`.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    // The command line first: nothing is read or written for a wrong one.
    let format = match Format::of(&args.output) {
        Ok(f) => f,
        Err(e) => return usage(e),
    };
    let mut named = Vec::new();
    for name in &args.counters {
        match crate::suggest::counter_by_label(hvstats_abi::ObjectKind::Vp, name) {
            Some(c) => named.push(c),
            None => {
                return usage(format!(
                    "--counter {name:?} is not a VP counter of the catalog (hvstats catalog lists them){}",
                    crate::suggest::did_you_mean(hvstats_abi::ObjectKind::Vp, name)
                ));
            }
        }
    }
    let charted = if named.is_empty() { 3 } else { named.len() };
    let Some(size) = image_size(args.size, charted) else {
        return usage(format!(
            "--size {}x{} with {charted} charts is larger than {} MiB of bitmap: fewer --counter or a \
             smaller --size",
            args.size.0,
            args.size.1,
            MAX_BITMAP_BYTES >> 20
        ));
    };
    let file = crate::input::open_regular(&args.file)?;
    // The output before the long read: a path that cannot be written fails at once.
    let mut output = OutputFile::create(&args.output, args.force)?;
    let reading = || format!("reading {}", args.file.display());
    let mut reader = SampleReader::new(BufReader::new(file)).with_context(reading)?;
    let header = reader.header().clone();
    let counters: Vec<&'static Counter> = if named.is_empty() {
        // The first and last samples decide which counters moved most.
        let (first, last) = first_and_last_totals(&mut reader).with_context(reading)?;
        let busiest = busiest(&header, &first, &last, 3);
        // A quiet recording is charted flat, not refused.
        if busiest.is_empty() { quiet_defaults(&header, 3) } else { busiest }
    } else {
        named
    };
    let charts = charts_of(&header, &counters, |f| stream_vps(&args.file, f))?;
    let size = (size.0, args.size.1 * counters.len().max(1) as u32);
    let bytes = render(format, &charts, size)?;
    let shown = args.output.display();
    output.file().write_all(&bytes).with_context(|| format!("writing {shown}"))?;
    output.put_in_place()?;
    let _ = writeln!(std::io::stderr(), "hvstats: wrote {shown}");
    Ok(ExitCode::SUCCESS)
}
