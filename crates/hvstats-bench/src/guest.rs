//! Rows that run a guest on KVM: the userspace exit with exact accounting on against off, and a
//! hypercall against a plain exit. Each run is timed in the CPU time of its VP's thread (in the
//! guest, in KVM and handling exits), so a busy host's preemptions count for neither side; and
//! both sides of a round run at once, pinned to one CPU, so that they take turns on it and
//! whatever else the host runs meanwhile (a neighbour's burst, a clock change) weighs on both
//! alike, where one after the other it weighed on whichever ran then.

use std::sync::Arc;
use std::time::Duration;

use hvstats::Hypervisor;
use hvstats_guest::program::LoopCount;
use hvstats_guest::{Mode, Workload, layout};
use hvstats_kvm::enlightenment::HyperV;
use hvstats_kvm::{Handlers, Partition, PartitionConfig, RunReport};

use crate::error::{BenchError, Present, Step};
use crate::row::{Pace, Plan, Rounds, Row};

/// Names of the rows of [`exit_rows`].
pub const EXIT_ROWS: [&str; 2] = ["exit-accounting-on-vs-off", "hypercall-vs-plain-exit"];

/// Loads `workload` into a one-VP long-mode partition of `hv` made with `config` and `handlers`,
/// runs it to its end and returns the VP's report.
fn run_one(
    hv: &Arc<Hypervisor>,
    workload: &Workload,
    config: PartitionConfig,
    handlers: Handlers,
    what: &'static str,
) -> Result<hvstats_kvm::VpOutcome, BenchError> {
    let image = workload.build(Mode::Long, layout::DEFAULT_LOAD_GPA).step(format!("building the {what}"))?;
    let partition = Partition::new(hv, config, handlers).step("creating the bench partition")?;
    partition.load(image.load_gpa, &image.bytes).step(format!("loading the {what}"))?;
    let report: RunReport = partition.run(image.entry).step(format!("running the {what}"))?;
    let vp = report.vps.into_iter().next().present("the bench partition has no VP")?;
    if let Some(f) = &vp.fault {
        return Err(BenchError::GuestFault {
            what,
            reason: f.reason().to_string(),
            location: f.location().to_string(),
        });
    }
    Ok(vp)
}

/// CPU time per exit of the VP thread of a one-VP long-mode guest doing `exits` OUTs to the sink
/// port (each one a userspace exit), the exit port write included.
///
/// # Errors
/// When the guest cannot be built or run, or faults.
pub fn exit_round_trip(hv: &Arc<Hypervisor>, exits: u32, accounting: bool) -> Result<Duration, BenchError> {
    let workload = Workload { out: LoopCount::fixed(exits), ..Workload::default() };
    let config =
        PartitionConfig { accounting, timeout: Duration::from_secs(120), ..PartitionConfig::default() };
    let vp = run_one(hv, &workload, config, Handlers::builtin(), "bench guest")?;
    Ok(vp.cpu_time / (exits + 1))
}

/// CPU time per hypercall of the VP thread of a one-VP enlightened guest making `n`
/// HvCallNotifyLongSpinWait.
///
/// # Errors
/// When the guest cannot be built or run, or faults.
pub fn hypercall_round_trip(hv: &Arc<Hypervisor>, n: u32) -> Result<Duration, BenchError> {
    let workload = Workload { hypercalls: LoopCount::fixed(n), ..Workload::default() };
    let mut config = PartitionConfig { timeout: Duration::from_secs(120), ..PartitionConfig::default() };
    let mut handlers = Handlers::builtin();
    HyperV::new(hv.clone(), true).install(&mut config, &mut handlers);
    let vp = run_one(hv, &workload, config, handlers, "hypercall bench guest")?;
    Ok(vp.cpu_time / n.max(1))
}

/// The userspace exit round trip with accounting on against off (`exits` per run), and a
/// hypercall (`hypercalls` per run) against a plain exit with accounting on: the rows of the two
/// that `wanted` selects.
///
/// # Errors
/// When a warm-up guest cannot be built, run, or faults.
pub fn exit_rows(
    hv: &Arc<Hypervisor>,
    plan: &Plan<'_>,
    exits: u32,
    hypercalls: u32,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Vec<Row>, BenchError> {
    // One run to warm up page tables, caches and the tracefs mount.
    exit_round_trip(hv, 1000, true)?;
    let ns = |d: Duration| d.as_nanos() as f64;
    let run = |accounting| exit_round_trip(hv, exits, accounting).map(ns).unwrap_or(f64::NAN);
    let mut rows = Vec::new();
    if wanted(EXIT_ROWS[0]) {
        let accounting = together(plan, EXIT_ROWS[0], || run(true), || run(false));
        rows.push(Row::measured(EXIT_ROWS[0], accounting, "ns/exit", Some(1.02)));
    }
    if wanted(EXIT_ROWS[1]) {
        hypercall_round_trip(hv, 100)?;
        let hypercall = together(
            plan,
            EXIT_ROWS[1],
            || hypercall_round_trip(hv, hypercalls).map(ns).unwrap_or(f64::NAN),
            || run(true),
        );
        rows.push(Row::measured(EXIT_ROWS[1], hypercall, "ns/exit", None));
    }
    Ok(rows)
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is ours and its size is given; pid 0 is the calling thread.
    let got = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE, within the set.
        .filter(|&i| got == 0 && unsafe { libc::CPU_ISSET(i, &set) })
        .collect();
    if cpus.is_empty() { vec![0] } else { cpus }
}

/// Pins the calling thread (and the threads it starts from now on) to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it for `cpu` below
    // CPU_SETSIZE (taken from `allowed_cpus`); sched_setaffinity reads it, pid 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Row `name`'s `ours` and `baseline` (each a guest run) over the plan's rounds: in each round
/// both at once, each from a thread pinned to the same CPU (the round's, in turn over the CPUs
/// this process may use), so that their VP threads, which inherit the pinning, take turns on it.
fn together(
    plan: &Plan<'_>,
    name: &str,
    ours: impl Fn() -> f64 + Sync,
    baseline: impl Fn() -> f64 + Sync,
) -> Rounds {
    let cpus = allowed_cpus();
    let mut rounds = Rounds::default();
    for round in 0..plan.start(&[name], Pace::Quick) as usize {
        let cpu = cpus[round % cpus.len()];
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| {
                pin_to(cpu);
                ours()
            });
            let b = s.spawn(|| {
                pin_to(cpu);
                baseline()
            });
            (a.join().unwrap_or(f64::NAN), b.join().unwrap_or(f64::NAN))
        });
        rounds.ours.push(a);
        rounds.baseline.push(b);
        plan.tick();
    }
    rounds
}
