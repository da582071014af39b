//! `hvstats bench`: what exact accounting costs on the userspace exit path.
//!
//! Runs the same guest (N port writes handled in userspace) with accounting on and off, rounds
//! interleaved so both see the same machine, and reports the median time per exit of each, the
//! difference, and the accounting work measured alone. The goal is at most 2% of the round trip.
//!
//! Then the hypercall path: the round trip of an HvCallNotifyLongSpinWait (which does nothing)
//! next to the plain exit's, and what refreshing the VP page costs, both the part the VP thread
//! does before every hypercall and a full merge of every source.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use std::sync::Arc;

use hvstats::Hypervisor;
use hvstats_guest::program::LoopCount;
use hvstats_guest::{Mode, Workload, layout};
use hvstats_kvm::enlightenment::HyperV;
use hvstats_kvm::{Handlers, Partition, PartitionConfig, accounting, exit_cost};

/// Run time per exit of a one-VP long-mode guest doing `exits` OUTs to the sink port (each one a
/// userspace exit), the exit port write included.
fn exit_round_trip(hv: &Arc<Hypervisor>, exits: u32, accounting: bool) -> anyhow::Result<Duration> {
    let workload = Workload { out: LoopCount::fixed(exits), ..Workload::default() };
    let image = workload.build(Mode::Long, layout::DEFAULT_LOAD_GPA).context("building the bench guest")?;
    let config =
        PartitionConfig { accounting, timeout: Duration::from_secs(120), ..PartitionConfig::default() };
    let partition =
        Partition::new(hv, config, Handlers::builtin()).context("creating the bench partition")?;
    partition.load(image.load_gpa, &image.bytes)?;
    let report = partition.run(image.entry)?;
    let vp = report.vps.first().context("the bench partition has no VP")?;
    if let Some(f) = &vp.fault {
        anyhow::bail!("bench guest faulted: {} at {:#x}", f.reason, f.rip);
    }
    Ok(vp.run_time / (exits + 1))
}

/// Flags of `hvstats bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Userspace exits per guest run.
    #[arg(long, default_value_t = 20_000)]
    exits: u32,
    /// Runs with accounting on, and as many off (interleaved).
    #[arg(long, default_value_t = 10)]
    rounds: u32,
    /// Hypercalls per guest run (as many runs as --rounds).
    #[arg(long, default_value_t = 5_000)]
    hypercalls: u32,
}

/// Run time per hypercall of a one-VP enlightened guest making `n` HvCallNotifyLongSpinWait.
fn hypercall_round_trip(hv: &Arc<Hypervisor>, n: u32) -> anyhow::Result<Duration> {
    let workload = Workload { hypercalls: LoopCount::fixed(n), ..Workload::default() };
    let image = workload.build(Mode::Long, layout::DEFAULT_LOAD_GPA)?;
    let mut config = PartitionConfig { timeout: Duration::from_secs(120), ..PartitionConfig::default() };
    let mut handlers = Handlers::builtin();
    HyperV::new(hv.clone(), true).install(&mut config, &mut handlers);
    let partition = Partition::new(hv, config, handlers).context("creating the bench partition")?;
    partition.load(image.load_gpa, &image.bytes)?;
    let report = partition.run(image.entry)?;
    let vp = &report.vps[0];
    if let Some(f) = &vp.fault {
        anyhow::bail!("hypercall bench guest faulted: {} at {:#x}", f.reason, f.rip);
    }
    Ok(vp.run_time / n)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Runs `hvstats bench`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.exits > 0 && args.rounds > 0 && args.hypercalls > 0,
        "--exits, --rounds and --hypercalls must be positive"
    );
    let hv = Hypervisor::new().context("creating the hypervisor instance")?;
    // One run to warm up page tables, caches and the tracefs mount.
    exit_round_trip(&hv, 1000, true)?;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        // Alternate which goes first, so neither always runs on a warmer or quieter machine.
        for accounting in if round % 2 == 0 { [true, false] } else { [false, true] } {
            let per_exit = exit_round_trip(&hv, args.exits, accounting)?;
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
    hypercall_round_trip(&hv, 100)?;
    let calls = (0..args.rounds)
        .map(|_| hypercall_round_trip(&hv, args.hypercalls))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let call = median(calls);
    let refresh = accounting::refresh_cost(10_000).context("measuring the VP page refresh")?;
    println!("hypercall path ({} hypercalls per run, {} runs, median):", args.hypercalls, args.rounds);
    println!(
        "  HvCallNotifyLongSpinWait round trip {:>8.0} ns/call ({:+.0} ns over a userspace exit)",
        ns(call),
        ns(call) - ns(on)
    );
    println!("  VP page refresh before a hypercall  {:>8.0} ns", ns(refresh.exit_path));
    println!("  VP page refresh of every source     {:>8.0} ns (collector, WHv API)", ns(refresh.everything));
    Ok(ExitCode::SUCCESS)
}
