//! `hvstats`: Hyper-V hypervisor statistics on KVM.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod access;
mod cmd;
mod input;
mod log_budget;
mod man_page;
mod names;
mod observer_log;
mod observer_run;
mod output;
mod output_file;
mod signals;
mod suggest;

use output::{ExitStatus, note};

/// Hyper-V hypervisor statistics on KVM: run partitions, count what they do, read TLFS stats pages.
#[derive(Parser)]
#[command(name = "hvstats", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every counter of the catalog.
    Catalog(cmd::catalog::Args),
    /// Decode a 4 KiB TLFS stats page from a file.
    Dump(cmd::dump::Args),
    /// Run a partition (the built-in demo, or a raw guest image) and print its counters.
    Run(cmd::run::Args),
    /// Print the counters of every live hvstats instance on this host.
    Snapshot(cmd::snapshot::Args),
    /// Hardware performance counters: list the PMU and its holders, allocate, free.
    Hwc(cmd::hwc::Args),
    /// Observe the KVM VMs of other processes, or the Microsoft Hypervisor (--mshv), and publish
    /// their Hyper-V counters.
    Observe(cmd::observe::Args),
    /// Measure what hvstats costs, each row beside its baseline (runs the hvstats-bench
    /// development tool, found beside hvstats or on PATH).
    Bench(cmd::bench::Args),
    /// A live full-screen view of every VP, kvm_stat style.
    Top(cmd::top::Args),
    /// Export every live instance to Prometheus over HTTP (/metrics, /api/v1/snapshot, /healthz).
    Serve(cmd::serve::Args),
    /// Sample every live instance to a recording file (newline-delimited JSON).
    Record(cmd::record::Args),
    /// Per-VP totals, deltas, rates and average costs of a recording.
    Report(cmd::report::Args),
    /// Chart a recording's VP counters over time (PNG or SVG).
    Plot(cmd::plot::Args),
    /// Write a man page for hvstats and each of its commands into a directory.
    Man(cmd::install::ManArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(cmd::install::CompletionsArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to standard output; a usage error to standard error, with its
            // own exit status. Neither printing can panic (clap reports write errors as values).
            let _ = e.print();
            if let Some(clap::error::ContextValue::String(arg)) = e.get(clap::error::ContextKind::InvalidArg)
                && let Some(hint) = cmd::serve::collector_flags::hint_for(arg)
            {
                eprintln!("{hint}");
            }
            return if e.use_stderr() { ExitStatus::Usage.into() } else { ExitStatus::Success.into() };
        }
    };
    let result = match cli.command {
        Command::Catalog(args) => cmd::catalog::run(args),
        Command::Dump(args) => cmd::dump::run(args),
        Command::Run(args) => cmd::run::run(args),
        Command::Snapshot(args) => cmd::snapshot::run(args),
        Command::Hwc(args) => cmd::hwc::run(args),
        Command::Observe(args) => cmd::observe::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Top(args) => cmd::top::run(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::Record(args) => cmd::record::run(args),
        Command::Report(args) => cmd::report::run(args),
        Command::Plot(args) => cmd::plot::run(args),
        Command::Man(args) => cmd::install::man(args, Cli::command()),
        Command::Completions(args) => cmd::install::completions(args, Cli::command()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            note!("{e:#}");
            ExitStatus::RuntimeError.into()
        }
    }
}
