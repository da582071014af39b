//! `hvstats-bench`: what hvstats costs, each figure measured side by side with its baseline in
//! the same run, and how sure each row is. A development tool kept out of the shipped `hvstats`
//! binary (`hvstats bench` runs this one when it is installed beside it); the rows are measured
//! by the `hvstats_bench` library, whose documentation says what each compares.
//!
//! The output is a table, or with `--json` one object per row and line (see [`Row::json`]). While
//! rows run, a progress bar on standard error says which and how far, on a terminal only (never
//! in a pipe, a file or with `--quiet`). Exit status: 0 measured (whatever the verdicts), 1 a
//! row's set-up failed, 2 a usage error.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use hvstats_bench::{Options, Progress, Row};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// What hvstats costs, each row measured side by side with its baseline in one run.
#[derive(Parser, Debug)]
#[command(name = "hvstats-bench", version, about, long_about = None)]
struct Args {
    /// One JSON object per row instead of a table.
    #[arg(long)]
    json: bool,
    /// Rounds per comparison; two make an ABBA block, and 12 (six blocks) is the fewest for a
    /// 95 % interval that can decide a goal [default: 40 for rows whose round takes well under a
    /// second, 12 for those whose round takes seconds].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds: Option<u32>,
    /// Userspace exits per guest run (KVM rows).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    exits: u32,
    /// Hypercalls per guest run (KVM rows).
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    hypercalls: u32,
    /// Run only the rows whose name contains this (repeat it for rows of several names).
    #[arg(long, value_name = "TEXT")]
    only: Vec<String>,
    /// Partitions of 16 VPs of the snapshot row (4096: 65,536 VPs).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    partitions: u32,
    /// Also draw the curve of the `observe-scale-*` rows measured (the observer's CPU per refresh
    /// per VM and per vCPU thread, against the VMs) as an SVG into this file.
    #[arg(long, value_name = "FILE")]
    chart: Option<std::path::PathBuf>,
    /// No progress bar, even on a terminal.
    #[arg(long, short)]
    quiet: bool,
}

/// A progress bar on standard error: hidden off a terminal and under `--quiet`.
struct Bar(ProgressBar);

impl Bar {
    fn new(quiet: bool) -> Self {
        let target = if quiet { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() };
        let bar = ProgressBar::with_draw_target(None, target);
        if let Ok(style) =
            ProgressStyle::with_template("{elapsed:>4} [{bar:24}] {pos}/{len} rounds  {wide_msg}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        Self(bar)
    }
}

impl Progress for Bar {
    fn group(&self, rows: &[&str], rounds: u32) {
        self.0.set_length(u64::from(rounds));
        self.0.set_position(0);
        self.0.set_message(rows.join(", "));
    }

    fn round(&self) {
        self.0.inc(1);
    }
}

fn print(rows: &[Row], json: bool) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        for row in rows {
            writeln!(out, "{}", row.json())?;
        }
    } else {
        writeln!(out, "{}", hvstats_bench::table_header())?;
        for row in rows {
            writeln!(out, "{}", row.table_line())?;
        }
    }
    out.flush()
}

fn run(args: Args) -> anyhow::Result<()> {
    let options = Options {
        rounds: args.rounds,
        exits: args.exits,
        hypercalls: args.hypercalls,
        only: args.only.clone(),
        partitions: args.partitions,
    };
    let bar = Bar::new(args.quiet);
    let rows = hvstats_bench::run(&options, &bar);
    bar.0.finish_and_clear();
    let rows = rows.context("the bench could not run")?;
    if let Some(path) = &args.chart {
        match hvstats_bench::chart::scale_svg(&rows).map_err(anyhow::Error::msg)? {
            Some(svg) => {
                std::fs::write(path, svg).with_context(|| format!("cannot write {}", path.display()))?
            }
            None => eprintln!("hvstats-bench: no observe-scale row was measured: no chart drawn"),
        }
    }
    match print(&rows, args.json) {
        // A reader that went away (`| head`) ends the output quietly.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("cannot write to standard output"),
    }
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hvstats-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
