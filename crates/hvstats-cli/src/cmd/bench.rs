//! `hvstats bench`: what exact accounting costs on the userspace exit path.
//!
//! Runs the same guest (N port writes handled in userspace) with accounting on and off, rounds
//! interleaved so both see the same machine, and reports the median time per exit of each, the
//! difference, and the accounting work measured alone. The goal is at most 2% of the round trip.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use hvstats::Hypervisor;
use hvstats_kvm::exit_cost;

/// Flags of `hvstats bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Userspace exits per guest run.
    #[arg(long, default_value_t = 20_000)]
    exits: u32,
    /// Runs with accounting on, and as many off (interleaved).
    #[arg(long, default_value_t = 10)]
    rounds: u32,
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Runs `hvstats bench`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.exits > 0 && args.rounds > 0, "--exits and --rounds must be positive");
    let hv = Hypervisor::new().context("creating the hypervisor instance")?;
    // One run to warm up page tables, caches and the tracefs mount.
    exit_cost::round_trip(&hv, 1000, true)?;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        // Alternate which goes first, so neither always runs on a warmer or quieter machine.
        for accounting in if round % 2 == 0 { [true, false] } else { [false, true] } {
            let per_exit = exit_cost::round_trip(&hv, args.exits, accounting)?;
            if accounting { on.push(per_exit) } else { off.push(per_exit) }
        }
    }
    let (on_min, off_min) =
        (on.iter().min().copied().unwrap_or_default(), off.iter().min().copied().unwrap_or_default());
    let (on, off) = (median(on), median(off));
    let alone = exit_cost::accounting_alone(1_000_000);
    let ns = |d: Duration| d.as_nanos() as f64;
    println!("userspace exit round trip ({} exits per run, {} runs each, medians):", args.exits, args.rounds);
    println!("  accounting on   {:>10.0} ns/exit", ns(on));
    println!("  accounting off  {:>10.0} ns/exit", ns(off));
    println!(
        "  difference      {:>+10.0} ns/exit ({:+.2}% of the round trip)",
        ns(on) - ns(off),
        (ns(on) - ns(off)) / ns(off) * 100.0
    );
    println!(
        "  fastest runs: on {:.0} ns/exit, off {:.0} ns/exit ({:+.2}%)",
        ns(on_min),
        ns(off_min),
        (ns(on_min) - ns(off_min)) / ns(off_min) * 100.0
    );
    println!(
        "  accounting work alone {:>6.1} ns/exit ({:.3}% of the round trip; goal <= 2%)",
        ns(alone),
        ns(alone) / ns(off) * 100.0
    );
    Ok(ExitCode::SUCCESS)
}
