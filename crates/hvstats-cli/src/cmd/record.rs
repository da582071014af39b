//! `hvstats record`: samples every live instance to a recording file ([`hvstats_surfaces::recording`]) every
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

use crate::output::note;
use crate::output_file::OutputFile;
use hvstats_present::live::Live;
use hvstats_surfaces::recording::{self, Header, RecordingError, Sample};

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
    let live = Live::new(Some(crate::cmd::runtime_dir(args.runtime_dir.clone())?));
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
    }
    let recorder = Recorder::create(&args)?;
    let samples = args.duration.map(|d| (d / args.interval).floor() as u64 + 1);
    let bar = progress_bar(samples, args.quiet)?;
    let seen = recorder.sample(&live, &bar, &stop, samples, Duration::from_secs_f64(args.interval));
    bar.finish_and_clear();
    let seen = seen?;
    if !seen.reader_gone {
        let shown = args.output.display();
        let _ = writeln!(std::io::stderr(), "hvstats: recorded {} samples to {shown}", seen.taken);
        if seen.most_vps == 0 {
            note!("no VP was live under {} while recording", live.dir().display());
        }
    }
    if !seen.problems.is_empty() {
        note!("{} thing(s) could not be read while recording (see above)", seen.problems.len());
        return Ok(crate::output::ExitStatus::RuntimeError.into());
    }
    Ok(ExitCode::SUCCESS)
}

/// The progress bar: `samples` of them, or counted up until Ctrl-C; hidden with `--quiet`.
fn progress_bar(samples: Option<u64>, quiet: bool) -> anyhow::Result<ProgressBar> {
    let target = if quiet { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() };
    let bar = ProgressBar::with_draw_target(samples, target);
    let template = match samples {
        Some(_) => "{spinner} recording {elapsed} {wide_bar} {pos}/{len} samples  {msg}",
        None => "{spinner} recording {elapsed}, {pos} samples  {msg} (Ctrl-C ends)",
    };
    bar.set_style(ProgressStyle::with_template(template).context("the progress bar template")?);
    Ok(bar)
}

/// How a recording went.
#[derive(Default)]
struct Seen {
    /// Samples written.
    taken: u64,
    /// The reader of the pipe written into went away.
    reader_gone: bool,
    /// What could not be read, each said once; any of it makes the exit status 1, as snapshot's.
    problems: Vec<String>,
    /// The most VPs live in one reading.
    most_vps: usize,
}

/// The recording being written, and how far it is whole.
struct Recorder {
    /// The file, in place once it has its header: readable while it grows.
    output: OutputFile,
    out: BufWriter<std::fs::File>,
    /// The path given, for messages.
    path: PathBuf,
    /// Samples written.
    taken: u64,
    /// The bytes of whole lines written.
    whole: u64,
    /// The last whole sample's time.
    last_t: f64,
    /// A recording written into a pipe whose reader went away (`record -o /dev/stdout | head`)
    /// ends there, quietly, as every command's output does.
    reader_gone: bool,
}

impl Recorder {
    /// Creates the output and writes its header.
    fn create(args: &Args) -> anyhow::Result<Self> {
        let mut output = OutputFile::create(&args.output, args.force)?;
        let out = BufWriter::new(output.file().try_clone().context("cannot duplicate the output")?);
        let mut recorder = Self {
            output,
            out,
            path: args.output.clone(),
            taken: 0,
            whole: 0,
            last_t: 0.0,
            reader_gone: false,
        };
        let started_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        match recording::write_line(&mut recorder.out, &Header::new(args.interval, started_ms)) {
            Err(e) if is_closed_pipe(&e) => recorder.reader_gone = true,
            result => result.map_err(|e| recorder.write_error(e))?,
        }
        recorder.output.put_in_place()?;
        recorder.whole = recorder.out.get_mut().stream_position().unwrap_or(0);
        Ok(recorder)
    }

    /// `e`, said as a failure to write this recording.
    fn write_error(&self, e: RecordingError) -> anyhow::Error {
        anyhow::Error::new(e).context(format!("writing {}", self.path.display()))
    }

    /// Samples `live` every `interval` until Ctrl-C, the reader goes away, or `samples` are taken.
    fn sample(
        mut self,
        live: &Live,
        bar: &ProgressBar,
        stop: &AtomicBool,
        samples: Option<u64>,
        interval: Duration,
    ) -> anyhow::Result<Seen> {
        let start = Instant::now();
        let mut seen = Seen::default();
        while !self.reader_gone && !stop.load(Ordering::SeqCst) && samples.is_none_or(|n| self.taken < n) {
            let reading = live.read()?;
            for problem in &reading.problems {
                if !seen.problems.contains(problem) && seen.problems.len() < 64 {
                    bar.suspend(|| note!("{problem}"));
                    seen.problems.push(problem.clone());
                }
            }
            seen.most_vps = seen.most_vps.max(reading.vp_count());
            let t = reading.at.saturating_duration_since(start).as_secs_f64();
            match recording::write_line(&mut self.out, &Sample::of(&reading, t)) {
                Err(e) if is_closed_pipe(&e) => self.reader_gone = true,
                Err(e) => return Err(self.cut_back(e)),
                Ok(()) => self.written(t),
            }
            if self.reader_gone {
                break;
            }
            bar.set_position(self.taken);
            bar.set_message(format!(
                "{} VMs, {} VPs",
                reading.instances.iter().map(|i| i.partitions.len()).sum::<usize>(),
                reading.vp_count()
            ));
            if samples.is_some_and(|n| self.taken >= n) {
                break;
            }
            sleep_until(start + interval.mul_f64(self.taken as f64), stop);
        }
        Ok(Seen { taken: self.taken, reader_gone: self.reader_gone, ..seen })
    }

    /// Counts the sample of time `t` just written whole.
    fn written(&mut self, t: f64) {
        self.whole = self.out.get_mut().stream_position().unwrap_or(self.whole);
        self.last_t = t;
        self.taken += 1;
    }

    /// The error of a failed write. A full disk (or any failed write) leaves whole records: the
    /// sample written in part is cut off (and what is still buffered of it dropped), so the file
    /// ends at its last whole line.
    fn cut_back(self, e: RecordingError) -> anyhow::Error {
        let e = self.write_error(e);
        let (taken, whole, last_t) = (self.taken, self.whole, self.last_t);
        let (file, _unwritten) = self.out.into_parts();
        match cut_to(&file, whole) {
            Ok(()) => e.context(format!(
                "the recording ends after {taken} whole samples ({whole} bytes), at t = {last_t:.2} s"
            )),
            Err(cut) => e.context(format!("and cutting it back to its last whole line failed: {cut}")),
        }
    }
}

/// Sleeps to `next` in small steps, so Ctrl-C ends the recording at once.
fn sleep_until(next: Instant, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let left = next.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
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
fn is_closed_pipe(e: &RecordingError) -> bool {
    matches!(e, RecordingError::Write(io) if io.kind() == std::io::ErrorKind::BrokenPipe)
}
