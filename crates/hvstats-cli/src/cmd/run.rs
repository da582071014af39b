//! `hvstats run`: run a partition and print its counters.
//!
//! With `--image`, a raw guest image runs under the conventions of `hvstats_guest::layout`
//! (RDI = VP index, RSI = VP count, port 0xF4 = exit status, port 0x3F8 = serial). Without it, a
//! built-in demo runs several VPs with port I/O, CPUID, MSR, APIC, HLT-with-interrupt and hypercall
//! traffic. Every partition is enlightened (Hyper-V CPUID leaves, synthetic MSRs, the hypercall page
//! and the stats hypercalls) and published under the runtime directory while it runs, so
//! `hvstats snapshot` in another process sees its counters.
//! The output is a perfmon-style table per VP, or with `--json` one object holding the partition's
//! counters and, per VP, the WHv counter sets and every page counter. A VP that faulted or did not
//! stop in time is reported with its RIP and reason, and the command exits with status 3.
//! SIGINT (Ctrl-C) or SIGTERM stops the VPs; what they counted is printed as usual, the instance
//! is removed, and the command exits with status 130 or 143.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use hvstats::Hypervisor;
use hvstats::whv;
use hvstats_abi::catalog::Presentation;
use hvstats_abi::hal::{PhysicalCounterResourceDescriptor, PhysicalCounterResourceList};
use hvstats_abi::whv::InterceptCounter;
use hvstats_abi::{ObjectKind, catalog::counters_of};
use hvstats_guest::program::LoopCount;
use hvstats_guest::{GuestImage, Mode, Workload, layout};
use hvstats_host::error_chain::error_chain;
use hvstats_hwc::{Allocator, Lifetime, PmuShape};
use hvstats_kvm::enlightenment::HyperV;
use hvstats_kvm::{
    FaultCause, Handlers, HardwareCounters, Partition, PartitionConfig, RipSeen, RunReport, VpOutcome,
};
use hvstats_observe::claim::Claim;
use hvstats_present::{json_keys, present};
use serde_json::{Map, Value, json};

use crate::input;
use crate::output::{self, ExitStatus, note, out};
use crate::signals::{self, Signal};

/// Flags of `hvstats run`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// A raw guest image to run (without it: the built-in demo).
    #[arg(long)]
    image: Option<PathBuf>,
    /// CPU mode the VPs start in: real, protected or long.
    #[arg(long, default_value = "long", value_parser = parse_mode)]
    mode: Mode,
    /// Guest physical address the image is loaded at.
    #[arg(long, default_value = "0x10000", value_parser = parse_number)]
    load_gpa: u64,
    /// Guest physical address execution starts at (default: the load address).
    #[arg(long, value_parser = parse_number)]
    entry: Option<u64>,
    /// Guest RAM, e.g. 2M, 64MiB, 0x400000 (1 MiB to 3 GiB).
    #[arg(long, default_value = "2M", value_parser = parse_memory)]
    memory: u64,
    /// Number of virtual processors, 1 to 64 (default: 1 for an image, 4 for the demo).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(layout::MAX_VPS)))]
    vps: Option<u32>,
    /// Seconds to wait for every VP to stop (more than 0, at most 86400); a VP still running then
    /// is reported as timed out and the command exits with status 3.
    #[arg(long, default_value_t = 10.0, value_parser = parse_timeout, conflicts_with_all = ["duration", "forever"])]
    timeout: f64,
    /// Run for this many seconds, then stop the VPs and print what they counted (exit status 0):
    /// the demo repeats its traffic until then, so other commands can watch it live.
    #[arg(long, value_name = "SECS", value_parser = parse_timeout, conflicts_with = "forever")]
    duration: Option<f64>,
    /// Run until SIGINT (Ctrl-C), SIGTERM or SIGHUP, then print what the VPs counted (exit status
    /// 0): the demo repeats its traffic until then.
    #[arg(long)]
    forever: bool,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// In tables, also list the counters KVM cannot maintain (they read 0).
    #[arg(long)]
    all: bool,
    /// Withhold the AccessStats privilege: the guest's HvMapStatsPage gets ACCESS_DENIED.
    #[arg(long)]
    no_access_stats: bool,
    /// How many stats pages the partition may have mapped at once (its quota); a map beyond it
    /// gets INSUFFICIENT_MEMORY.
    #[arg(long, default_value_t = hvstats::rules::DEFAULT_STATS_PAGE_QUOTA)]
    max_stats_pages: u32,
    /// Where the running instance is published for `hvstats snapshot` and the hardware counter
    /// table lives (default: $HVSTATS_RUNTIME_DIR, else /run/hvstats).
    #[arg(long)]
    runtime_dir: Option<PathBuf>,
    /// The partition's name for readers: the `vm` label of its series in `serve`, its name in
    /// `snapshot`, `top` and `record`, the same on every run (default: `demo`, or the image's
    /// file name without its extension). At most 64 bytes, no control characters.
    #[arg(long, value_name = "NAME", value_parser = parse_name)]
    name: Option<String>,
}

/// The most bytes of a partition name the runtime directory's index keeps.
const MAX_NAME_BYTES: usize = hvstats::index::TEXT_BYTES;

fn parse_name(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > MAX_NAME_BYTES || s.chars().any(char::is_control) {
        return Err(format!("{s:?}: a name of 1 to {MAX_NAME_BYTES} bytes without control characters"));
    }
    Ok(s.to_owned())
}

/// The name a partition gets without `--name`: what it runs, never who runs it (a pid would make
/// its series new on every run).
fn default_name(image: Option<&Path>) -> String {
    let stem = image.and_then(Path::file_stem).map(|s| s.to_string_lossy().into_owned());
    match stem.and_then(|s| parse_name(&s).ok()) {
        Some(name) => name,
        None if image.is_some() => "image".to_owned(),
        None => "demo".to_owned(),
    }
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    Mode::parse(s).ok_or_else(|| format!("unknown mode {s:?}: real, protected or long"))
}

fn parse_number(s: &str) -> Result<u64, String> {
    let s = s.trim().replace('_', "");
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("not a number: {s:?}"))
}

/// The most seconds `--timeout` accepts (a day).
const MAX_TIMEOUT_SECONDS: f64 = 86_400.0;

fn parse_timeout(s: &str) -> Result<f64, String> {
    let t: f64 = s.trim().parse().map_err(|_| format!("not a number of seconds: {s:?}"))?;
    if t > 0.0 && t <= MAX_TIMEOUT_SECONDS {
        Ok(t)
    } else {
        Err(format!("{s} is not in the range: more than 0 and at most {MAX_TIMEOUT_SECONDS} seconds"))
    }
}

/// Guest RAM between 1 MiB and 3 GiB, as the partition accepts it.
fn parse_memory(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    if (1 << 20..=3 << 30).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{n} bytes is not in the range 1 MiB (1048576) to 3 GiB (3221225472)"))
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let (digits, shift) = [("kib", 10), ("mib", 20), ("gib", 30), ("k", 10), ("m", 20), ("g", 30)]
        .iter()
        .find_map(|(suffix, shift)| lower.strip_suffix(suffix).map(|d| (d.to_string(), *shift)))
        .unwrap_or((lower.clone(), 0));
    let n = parse_number(&digits)?;
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("size too large: {t:?}"))
}

/// The demo: every VP does a mix of intercepts, VP `i` a little more than VP `i - 1`. Real mode
/// cannot reach the APIC or take exceptions through the VMM's IDT, and only long mode pages.
fn demo_workload(mode: Mode) -> Workload {
    let mut w = Workload {
        cpuid: LoopCount::per_vp(2000, 500),
        out: LoopCount::per_vp(500, 100),
        in_: LoopCount::per_vp(300, 100),
        rdmsr: LoopCount::per_vp(400, 100),
        wrmsr: LoopCount::per_vp(200, 50),
        user_msr: LoopCount::per_vp(100, 25),
        serial: b"hvstats demo VP done\n".to_vec(),
        exit_status: 0,
        ..Workload::default()
    };
    if mode != Mode::Real {
        w.hypercalls = LoopCount::per_vp(100, 25);
        w.hlt = LoopCount::per_vp(50, 10);
        w.eoi = LoopCount::per_vp(200, 50);
        w.self_ipi = LoopCount::per_vp(100, 20);
        w.tpr = LoopCount::per_vp(50, 10);
        w.ud2 = LoopCount::per_vp(20, 5);
    }
    if mode == Mode::Long {
        w.invlpg = LoopCount::per_vp(30, 10);
        w.page_faults = LoopCount::per_vp(10, 5);
    }
    w
}

/// Runs `hvstats run`.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Before any thread exists, so that none of them dies of these signals (see `signals`).
    signals::block().context("blocking SIGINT and SIGTERM")?;
    let runtime_dir = super::runtime_dir(args.runtime_dir.clone())?;
    let (image, vps) = guest(&args)?;
    let hv = match Hypervisor::new_published(&runtime_dir) {
        Ok(hv) => hv,
        Err(e) => {
            note!("not publishing this instance for `hvstats snapshot`: {}", error_chain(&e));
            Hypervisor::new().context("creating the hypervisor instance")?
        }
    };
    let _claim = claim_own_vm(&runtime_dir, &hv);
    let hardware = hardware_counters(&runtime_dir);
    let mut config = PartitionConfig {
        vp_count: vps,
        memory_bytes: args.memory,
        mode: image.mode,
        timeout: run_length(&args),
        hardware_counters: hardware.as_ref().ok().cloned(),
        name: args.name.clone().unwrap_or_else(|| default_name(args.image.as_deref())),
        ..PartitionConfig::default()
    };
    let mut handlers = Handlers::builtin();
    HyperV::new(hv.clone(), !args.no_access_stats).install(&mut config, &mut handlers);
    let partition = Partition::new(&hv, config, handlers).context("creating the partition")?;
    partition.stats().set_stats_page_quota(args.max_stats_pages);
    partition.load(image.load_gpa, &image.bytes).context("loading the image")?;
    let (report, signal) = signals::during(|_| partition.run(image.entry), |_| partition.stop())
        .context("watching for SIGINT and SIGTERM")?;
    if let Ok(h) = &hardware {
        let status = h.allocator.free(h.handle);
        if !status.is_success() {
            note!("freeing hardware counter allocation {}: {status}", h.handle);
        }
    }
    let report = report.context("running the partition")?;
    let ending = Ending::of(&args);
    if let Some(signal) = signal {
        note!(
            "{}: stopped the VPs after {:.3} s; printing what they counted",
            signal.name(),
            report.elapsed.as_secs_f64()
        );
    }
    let unavailable = hardware.as_ref().err().map(String::as_str);
    if args.json {
        output::print_json(&json_report(&partition, &report, unavailable)?, true)?;
    } else {
        print_tables(&partition, &report, args.all, unavailable, ending)?;
    }
    note_what_went_unseen(&partition, &report, ending, args.timeout);
    // A signal that came while printing still ends the command as that signal asks.
    let signal = match signal {
        Some(s) => Some(s),
        None => signals::take_pending().unwrap_or(None),
    };
    Ok(exit_status(&report, signal, ending).into())
}

/// The guest to run and its VPs: `--image`, or the demo workload built for `--mode`.
fn guest(args: &Args) -> anyhow::Result<(GuestImage, u32)> {
    match &args.image {
        Some(path) => {
            let bytes = input::read_regular(path, args.memory, "an image for this guest RAM")?;
            if bytes.is_empty() {
                bail!("{} is empty", path.display());
            }
            let entry = args.entry.unwrap_or(args.load_gpa);
            Ok((GuestImage { mode: args.mode, load_gpa: args.load_gpa, entry, bytes }, args.vps.unwrap_or(1)))
        }
        None => {
            let mut workload = demo_workload(args.mode);
            workload.repeat = args.duration.is_some() || args.forever;
            let image =
                workload.build(args.mode, layout::DEFAULT_LOAD_GPA).context("building the demo guest")?;
            Ok((image, args.vps.unwrap_or(4)))
        }
    }
}

/// This process publishes its own partitions: it claims itself, so an observer of every VM on the
/// host (`observe --all`, `serve --observe-all`) leaves its VM to this instance instead of
/// publishing it twice. `None` (said) when it cannot.
fn claim_own_vm(runtime_dir: &Path, hv: &Hypervisor) -> Option<Claim> {
    let name = hv.published_name()?;
    let me = std::process::id() as i32;
    Claim::take(runtime_dir, me, &name.to_string())
        .map_err(|e| note!("not claiming this VM for its own instance: {}", error_chain(&e)))
        .ok()
}

/// Says what the run could not count (tracepoints unavailable) and which VPs faulted or did not
/// stop within `--timeout` (`timeout` seconds).
fn note_what_went_unseen(partition: &Partition, report: &RunReport, ending: Ending, timeout: f64) {
    let missing = partition.unavailable_sources(0);
    if let Some(first) = missing.first() {
        note!("{} tracepoint counters are unavailable and read 0: {first}", missing.len());
    }
    for vp in &report.vps {
        match &vp.fault {
            Some(f) if f.cause.is_fault() => {
                note!("VP {} faulted at {}: {}", vp.index, f.location(), f.reason())
            }
            Some(f) if ending == Ending::Guests && matches!(f.cause, FaultCause::TimedOut) => {
                note!("VP {} did not stop within --timeout {timeout} s (at {})", vp.index, f.location())
            }
            _ => {}
        }
    }
}

/// How long the VPs may run: `--duration`, practically unbounded with `--forever` (a century,
/// which a deadline computed from now still holds), else `--timeout`.
fn run_length(args: &Args) -> Duration {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);
    match (args.duration, args.forever) {
        (Some(d), _) => Duration::from_secs_f64(d),
        (None, true) => CENTURY,
        (None, false) => Duration::from_secs_f64(args.timeout),
    }
}

/// How a run was meant to end: by its guests (their exit port, within `--timeout`), or by the
/// host (`--duration` passing, a signal under `--forever`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Guests,
    Duration,
    Forever,
}

impl Ending {
    fn of(args: &Args) -> Self {
        match (args.duration, args.forever) {
            (Some(_), _) => Ending::Duration,
            (None, true) => Ending::Forever,
            (None, false) => Ending::Guests,
        }
    }
}

/// The exit status of a run: a signal first (the VPs it stopped are not guest faults; under
/// `--forever` it is the way to end), then a fault, then a VP still running at `--timeout`.
fn exit_status(report: &RunReport, signal: Option<Signal>, ending: Ending) -> ExitStatus {
    match signal {
        Some(_) if ending == Ending::Forever => ExitStatus::Success,
        Some(s) => s.exit_status(),
        None if report.faulted() => ExitStatus::GuestFault,
        None if report.timed_out() && ending == Ending::Guests => ExitStatus::GuestFault,
        None => ExitStatus::Success,
    }
}

/// Two general-purpose counters on every processor, from the host's shared allocation table, for
/// guest cycles and instructions retired; or why the PMU cannot be used.
fn hardware_counters(runtime_dir: &Path) -> Result<HardwareCounters, String> {
    let pmu = PmuShape::from_env_or_discover().map_err(|e| error_chain(&e))?;
    if let Some(reason) = pmu.absent_reason() {
        return Err(format!("no PMU: {reason}"));
    }
    let allocator = Allocator::open(runtime_dir, pmu).map_err(|e| error_chain(&e))?;
    let counters = [PhysicalCounterResourceDescriptor::range(0, 1)];
    let handle = allocator
        .try_allocate(None, Some(&PhysicalCounterResourceList::new(&counters)), Lifetime::Process)
        .map_err(|e| format!("hardware counters 0-1 on every processor: {}", error_chain(&e)))?;
    Ok(HardwareCounters { allocator: Arc::new(allocator), handle })
}

/// A VP's guest cycles and instructions, or why they are unavailable (never zeros in their place).
fn hardware_json(vp: &VpOutcome, unavailable: Option<&str>) -> Value {
    match (&vp.hardware, unavailable) {
        (Some(Ok(c)), _) => json!({"cycles": c.cycles, "instructions": c.instructions}),
        (Some(Err(why)), _) => json!({"unavailable": error_chain(why)}),
        (None, Some(why)) => json!({"unavailable": why}),
        (None, None) => json!({"unavailable": "not requested"}),
    }
}

/// Every counter of `kind` as a total keyed by what it holds ([`json_keys`]); one no source
/// maintains on KVM is null, not the 0 its page slot reads.
fn counters_json(kind: ObjectKind, page: &hvstats::SharedPage) -> Value {
    let mut m = Map::new();
    for c in counters_of(kind) {
        let value = if c.maintained.is_maintained() { json!(page.get(c.id)) } else { Value::Null };
        m.insert(json_keys::key(c, json_keys::Held::Total), value);
    }
    Value::Object(m)
}

fn pair(c: InterceptCounter) -> Value {
    json!({"Count": c.count, "Time100ns": c.time_100ns})
}

/// The `--json` object (shape given in the issue).
fn json_report(
    partition: &Partition,
    report: &RunReport,
    unavailable: Option<&str>,
) -> anyhow::Result<Value> {
    let stats = partition.stats();
    let vps = report
        .vps
        .iter()
        .map(|vp| vp_json(partition, vp, unavailable))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(json!({
        json_keys::SCHEMA_KEY: json_keys::SCHEMA_VERSION,
        "elapsed_seconds": report.elapsed.as_secs_f64(),
        "partition": {"name": partition.config().name, "counters": counters_json(ObjectKind::Partition, stats.page())},
        "vps": vps,
    }))
}

/// One VP's object of the `--json` report.
fn vp_json(partition: &Partition, vp: &VpOutcome, unavailable: Option<&str>) -> anyhow::Result<Value> {
    let i = vp.index;
    let rt = whv::runtime_counters(partition, i)?;
    let ic = whv::intercept_counters(partition, i)?;
    let ev = whv::event_counters(partition, i)?;
    let ap = whv::apic_counters(partition, i)?;
    let page = partition.stats().vp_page(i).context("VP page")?;
    let mut obj = json!({
        "index": i,
        "exit_status": vp.exit_status,
        "serial": String::from_utf8_lossy(&vp.serial),
        "runtime": {
            "TotalRuntime100ns": rt.total_runtime_100ns,
            "HypervisorRuntime100ns": rt.hypervisor_runtime_100ns,
        },
        "intercepts": {
            "PageInvalidations": pair(ic.page_invalidations),
            "ControlRegisterAccesses": pair(ic.control_register_accesses),
            "IoInstructions": pair(ic.io_instructions),
            "HaltInstructions": pair(ic.halt_instructions),
            "CpuidInstructions": pair(ic.cpuid_instructions),
            "MsrAccesses": pair(ic.msr_accesses),
            "OtherIntercepts": pair(ic.other_intercepts),
            "PendingInterrupts": pair(ic.pending_interrupts),
            "EmulatedInstructions": pair(ic.emulated_instructions),
            "DebugRegisterAccesses": pair(ic.debug_register_accesses),
            "PageFaultIntercepts": pair(ic.page_fault_intercepts),
        },
        "events": {
            "PageFaultCount": ev.page_fault_count,
            "ExceptionCount": ev.exception_count,
            "InterruptCount": ev.interrupt_count,
        },
        "apic": {
            "MmioAccessCount": ap.mmio_access_count,
            "EoiAccessCount": ap.eoi_access_count,
            "TprAccessCount": ap.tpr_access_count,
            "SentIpiCount": ap.sent_ipi_count,
            "SelfIpiCount": ap.self_ipi_count,
        },
        "counters": counters_json(ObjectKind::Vp, page),
        "hardware": hardware_json(vp, unavailable),
    });
    if let Some(f) = &vp.fault {
        let rip = (f.rip_seen != RipSeen::Unknown).then_some(f.rip);
        let (key, what) = if f.cause.is_fault() { ("fault", "reason") } else { ("stopped", "why") };
        obj[key] =
            json!({ "kind": f.cause.kind(), what: f.reason(), "rip": rip, "rip_seen": f.rip_seen.as_str() });
    }
    Ok(obj)
}

/// The text report: the partition's counters, then each VP's.
fn print_tables(
    partition: &Partition,
    report: &RunReport,
    all: bool,
    unavailable: Option<&str>,
    ending: Ending,
) -> anyhow::Result<()> {
    let secs = report.elapsed.as_secs_f64().max(1e-9);
    out!(
        "partition {}: {} VPs, {} mode, ran {:.3} s",
        partition.stats().id(),
        report.vps.len(),
        partition.config().mode.name(),
        secs
    )?;
    let ppage = partition.stats().page();
    for c in counters_of(ObjectKind::Partition)
        .filter(|c| !c.is_bookkeeping() && (all || c.maintained.is_maintained()))
    {
        out!("  {:<40} {:>14}", c.name, ppage.get(c.id))?;
    }
    let hidden = counters_of(ObjectKind::Vp).filter(|c| !c.maintained.is_maintained()).count();
    for vp in &report.vps {
        // Bring the page up to date before reading it.
        whv::runtime_counters(partition, vp.index)?;
        let page = partition.stats().vp_page(vp.index).context("VP page")?;
        out!()?;
        out!("VP {} — {}", vp.index, vp_status(vp, ending))?;
        if !vp.serial.is_empty() {
            out!("  serial: {:?}", String::from_utf8_lossy(&vp.serial))?;
        }
        match hardware_json(vp, unavailable) {
            Value::Object(m) if m.contains_key("cycles") => {
                out!("  guest cycles {}, instructions retired {}", m["cycles"], m["instructions"])?
            }
            v => out!(
                "  guest cycles and instructions retired: unavailable: {}",
                v["unavailable"].as_str().unwrap_or("")
            )?,
        }
        print_vp_counters(page, secs, all)?;
    }
    out!()?;
    if !all {
        out!(
            "{hidden} VP counters KVM cannot maintain are not shown (--all lists them; `hvstats catalog` says why)."
        )?;
    }
    Ok(())
}

/// How a VP ended, as its heading says it.
fn vp_status(vp: &VpOutcome, ending: Ending) -> String {
    match (&vp.fault, vp.exit_status) {
        (Some(f), _) if f.cause.is_fault() => format!("FAULT at {}: {}", f.location(), f.reason()),
        (Some(f), _) if ending == Ending::Duration && matches!(f.cause, FaultCause::TimedOut) => {
            format!("ran for --duration, stopped at {}", f.location())
        }
        (Some(f), _) if matches!(f.cause, FaultCause::TimedOut) => {
            format!("TIMED OUT at {}: still running after --timeout", f.location())
        }
        (Some(f), _) => format!("{} at {}", f.reason(), f.location()),
        (None, Some(s)) => format!("exit status {s}"),
        (None, None) => "no exit status".into(),
    }
}

/// A VP's counters over the whole run of `secs` seconds (they started at 0): total, rate or share
/// of the time, and average cost; those KVM cannot maintain only with `all`.
fn print_vp_counters(page: &hvstats::SharedPage, secs: f64, all: bool) -> anyhow::Result<()> {
    out!("  {:<40} {:>14} {:>14} {:>14}", "counter", "total", "per second", "avg cost (ns)")?;
    for c in counters_of(ObjectKind::Vp) {
        let maintained = c.maintained.is_maintained();
        if !(maintained || all) || c.presentation == Presentation::Cost {
            continue;
        }
        let total = page.get(c.id);
        let rate = match present::over_interval(c, 0, total, secs, None) {
            Some(p) if c.presentation == Presentation::Rate => format!("{:.0}", p.value),
            Some(p) if c.presentation == Presentation::PercentTime => format!("{:.1}%", p.value),
            _ => String::new(),
        };
        let cost = c.cost().filter(|cost| cost.maintained.is_maintained()).map(|cost| {
            present::over_interval(cost, 0, page.get(cost.id), secs, Some((0, total)))
                .map_or_else(|| "-".to_string(), |p| format!("{:.0}", p.value))
        });
        let marker = if maintained { "" } else { " (not maintained)" };
        out!("  {:<40} {:>14} {:>14} {:>14}{marker}", c.name, total, rate, cost.unwrap_or_default())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_named_by_what_it_runs_never_by_who_runs_it() {
        assert_eq!(default_name(None), "demo");
        assert_eq!(default_name(Some(Path::new("/srv/guests/web-1.bin"))), "web-1");
        assert_eq!(default_name(Some(Path::new("/srv/guests/\u{7}.bin"))), "image");
        assert_eq!(parse_name("db-1"), Ok("db-1".to_owned()));
        for bad in ["", "a\nb", &"x".repeat(65)] {
            let e = parse_name(bad).unwrap_err();
            assert!(e.contains("1 to 64 bytes without control characters"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_demo_builds_in_every_mode() {
        for mode in [Mode::Real, Mode::Protected, Mode::Long] {
            demo_workload(mode).build(mode, layout::DEFAULT_LOAD_GPA).unwrap();
        }
    }

    #[test]
    fn sizes_and_numbers_parse() {
        assert_eq!(parse_size("2M"), Ok(2 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("0x400000"), Ok(0x40_0000));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999999G").is_err());
        assert_eq!(parse_number("0x10000"), Ok(0x10000));
        assert_eq!(parse_number("4096"), Ok(4096));
        assert!(parse_mode("unreal").is_err());
    }
}
