//! `hvstats`: Hyper-V hypervisor statistics on KVM.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

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
    /// Observe the KVM VMs of other processes and publish their Hyper-V counters.
    Observe(cmd::observe::Args),
    /// Measure what exact accounting costs on the userspace exit path.
    Bench(cmd::bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Catalog(args) => cmd::catalog::run(args),
        Command::Dump(args) => cmd::dump::run(args),
        Command::Run(args) => cmd::run::run(args),
        Command::Snapshot(args) => cmd::snapshot::run(args),
        Command::Hwc(args) => cmd::hwc::run(args),
        Command::Observe(args) => cmd::observe::run(args),
        Command::Bench(args) => cmd::bench::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hvstats: {e:#}");
            ExitCode::FAILURE
        }
    }
}
