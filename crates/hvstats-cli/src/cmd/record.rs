//! `hvstats record`: samples every live instance to a recording file ([`recording`]) every
//! interval, for a duration or until Ctrl-C (or SIGTERM), which ends the file after its last whole
//! sample. A progress bar shows on a terminal only.

use std::io::{BufWriter, Seek, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cmd::recording::{self, Header, Sample};
use crate::output::note;
use crate::output_file::OutputFile;
use hvstats_present::live::Live;

/// Flags of `hvstats record`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The recording to write: a new file (`-` or /dev/stdout: standard output).
    #[arg(short = 'o', long, value_name = "FILE")]
    output: PathBuf,
    /// Replace FILE if it is an existing regular file (by writing a new file and renaming it).
    #[arg(long)]
    force: bool,
    /// Seconds between samples, at least the publishers' refresh cadence (0.1 s).
    #[arg(long, value_name = "SECS", default_value_t = 1.0, value_parser = parse_interval)]
    interval: f64,
    /// Stop after this many seconds (default: at Ctrl-C).
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    duration: Option<f64>,
    /// The runtime directory the instances are published under (default: $HVSTATS_RUNTIME_DIR,
    /// or /run/hvstats).
    #[arg(long, value_name = "DIR")]
    runtime_dir: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short = 'q')]
    quiet: bool,
}

/// A sampling interval: at least the publishers' refresh cadence (counters move no more often), at
/// most a year.
fn parse_interval(s: &str) -> Result<f64, String> {
    crate::cmd::interval_up_to(s, crate::cmd::YEAR_SECONDS)
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    crate::cmd::seconds_in(s, 0.01, crate::cmd::YEAR_SECONDS)
}

/// Runs `hvstats record`.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let live = Live::new(Some(crate::cmd::runtime_dir(args.runtime_dir)?));
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
    }
    let mut output = OutputFile::create(&args.output, args.force)?;
    let mut out = BufWriter::new(output.file().try_clone().context("cannot duplicate the output")?);
    let started_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let write_error = |e: anyhow::Error| e.context(format!("writing {}", args.output.display()));
    // A recording written into a pipe whose reader went away (`record -o /dev/stdout | head`)
    // ends there, quietly, as every command's output does.
    let mut reader_gone = false;
    match recording::write_line(&mut out, &Header::new(args.interval, started_ms)) {
        Err(e) if is_closed_pipe(&e) => reader_gone = true,
        result => result.map_err(write_error)?,
    }
    // In place once it has its header: readable while it grows.
    output.put_in_place()?;

    let interval = Duration::from_secs_f64(args.interval);
    let samples = args.duration.map(|d| (d / args.interval).floor() as u64 + 1);
    let target = if args.quiet { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() };
    let bar = ProgressBar::with_draw_target(samples, target);
    let template = match samples {
        Some(_) => "{spinner} recording {elapsed} {wide_bar} {pos}/{len} samples  {msg}",
        None => "{spinner} recording {elapsed}, {pos} samples  {msg} (Ctrl-C ends)",
    };
    bar.set_style(ProgressStyle::with_template(template).context("the progress bar template")?);

    let start = Instant::now();
    let mut taken = 0u64;
    // The bytes of whole lines written, and the last whole sample's time.
    let mut whole = out.get_mut().stream_position().unwrap_or(0);
    let mut last_t = 0.0;
    // What could not be read, each said once; any of it makes the exit status 1, as snapshot's.
    let mut problems: Vec<String> = Vec::new();
    let mut most_vps = 0usize;
    while !reader_gone && !stop.load(Ordering::SeqCst) && samples.is_none_or(|n| taken < n) {
        let reading = live.read()?;
        for problem in &reading.problems {
            if !problems.contains(problem) && problems.len() < 64 {
                bar.suspend(|| note!("{problem}"));
                problems.push(problem.clone());
            }
        }
        most_vps = most_vps.max(reading.vp_count());
        let t = reading.at.saturating_duration_since(start).as_secs_f64();
        match recording::write_line(&mut out, &Sample::of(&reading, t)) {
            Err(e) if is_closed_pipe(&e) => {
                reader_gone = true;
                break;
            }
            Err(e) => {
                // A full disk (or any failed write) leaves whole records: the sample written in
                // part is cut off, so the file ends at its last whole line.
                bar.finish_and_clear();
                let (file, _unwritten) = out.into_parts();
                let kept = cut_to(&file, whole);
                let e = write_error(e);
                return Err(match kept {
                    Ok(()) => e.context(format!(
                        "the recording ends after {taken} whole samples ({whole} bytes), at t = {last_t:.2} s"
                    )),
                    Err(cut) => {
                        e.context(format!("and cutting it back to its last whole line failed: {cut}"))
                    }
                });
            }
            Ok(()) => {
                whole = out.get_mut().stream_position().unwrap_or(whole);
                last_t = t;
            }
        }
        taken += 1;
        bar.set_position(taken);
        bar.set_message(format!(
            "{} VMs, {} VPs",
            reading.instances.iter().map(|i| i.partitions.len()).sum::<usize>(),
            reading.vp_count()
        ));
        if samples.is_some_and(|n| taken >= n) {
            break;
        }
        // Sleep to the next tick in small steps, so Ctrl-C ends the recording at once.
        let next = start + interval.mul_f64(taken as f64);
        while !stop.load(Ordering::SeqCst) {
            let left = next.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }
    bar.finish_and_clear();
    if !reader_gone {
        let _ = writeln!(std::io::stderr(), "hvstats: recorded {taken} samples to {}", args.output.display());
        if most_vps == 0 {
            note!("no VP was live under {} while recording", live.dir().display());
        }
    }
    if !problems.is_empty() {
        note!("{} thing(s) could not be read while recording (see above)", problems.len());
        return Ok(crate::output::ExitStatus::RuntimeError.into());
    }
    Ok(ExitCode::SUCCESS)
}

/// Cuts the recording `file` back to its first `len` bytes (its whole lines), and puts its offset
/// there; nothing to do for standard output that is no regular file.
fn cut_to(file: &std::fs::File, len: u64) -> std::io::Result<()> {
    if !file.metadata()?.is_file() {
        return Ok(());
    }
    file.set_len(len)?;
    let mut file = file;
    file.seek(std::io::SeekFrom::Start(len))?;
    Ok(())
}

/// True when `e` is a write into a pipe nobody reads any more.
fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}
