//! `hvstats hwc`: the host's hardware counter table for operators — the PMU, who holds what,
//! allocate and free.
//!
//! The decisions are `hvstats_hwc`'s; this module reads flags into seed 002's arguments and
//! prints the answers. Statuses are printed by name and value, and any status other than
//! `STATUS_SUCCESS` exits with status 1.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use hvstats_abi::hal::{
    GroupAffinity, NtStatus, PhysicalCounterResourceDescriptor as Descriptor, PhysicalCounterResourceList,
};
use hvstats_hwc::pmu::MAX_PROCESSORS;
use hvstats_hwc::{Allocation, Allocator, CounterSetHandle, CpuSet, HwcError, Lifetime, PMU_ENV, PmuShape};
use hvstats_present::json_keys;
use hvstats_present::text::Escaped;
use serde_json::{Value, json};

use crate::output;
use crate::signals;

/// Flags of `hvstats hwc`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// The PMU's shape per CPU (or why there is none) and the current holders.
    List(ListArgs),
    /// Allocate hardware counters (HalAllocateHardwareCounters); prints the handle.
    Alloc(AllocArgs),
    /// Free an allocation by handle (HalFreeHardwareCounters).
    Free(FreeArgs),
}

/// Flags every `hwc` subcommand has.
#[derive(clap::Args)]
struct Common {
    /// The runtime directory holding the table (default: $HVSTATS_RUNTIME_DIR, or /run/hvstats).
    /// The PMU shape is discovered, or taken from $HVSTATS_PMU (e.g. "gp=6,fixed=3,cpus=128", "none").
    #[arg(long)]
    runtime_dir: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct ListArgs {
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args)]
struct AllocArgs {
    #[command(flatten)]
    common: Common,
    /// Processors as a CPU list ("0-3,8"); repeatable. With no --cpus or --group: every processor.
    #[arg(long, value_name = "LIST")]
    cpus: Vec<String>,
    /// A processor group (64 processors each: group G bit B is CPU 64*G+B); pairs with --mask.
    #[arg(long, value_name = "G")]
    group: Vec<u16>,
    /// The processor mask of the matching --group, in hex ("0xff").
    #[arg(long, value_name = "HEX")]
    mask: Vec<String>,
    /// A counter index (general-purpose counters first, then fixed); repeatable.
    #[arg(long, value_name = "N")]
    counter: Vec<u32>,
    /// A range of counter indices "A-B", inclusive; repeatable.
    #[arg(long, value_name = "A-B")]
    range: Vec<String>,
    /// The counter overflow interrupt.
    #[arg(long)]
    overflow: bool,
    /// The event buffer configuration.
    #[arg(long)]
    event_buffer: bool,
    /// An identification tag; repeatable.
    #[arg(long, value_name = "N")]
    tag: Vec<u32>,
    /// The whole PMU of the processors (no resource list).
    #[arg(long, conflicts_with_all = ["counter", "range", "overflow", "event_buffer", "tag"])]
    exclusive: bool,
    /// Hold the allocation while this command runs, and free it on SIGINT or SIGTERM (or when the
    /// process dies). Without --hold the allocation persists until `hvstats hwc free HANDLE`.
    #[arg(long)]
    hold: bool,
}

#[derive(clap::Args)]
struct FreeArgs {
    #[command(flatten)]
    common: Common,
    /// The handle printed by `hvstats hwc alloc`.
    handle: u64,
}

/// Runs `hvstats hwc`.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::List(a) => list(a),
        Command::Alloc(a) => alloc(a),
        Command::Free(a) => free(a),
    }
}

fn open(common: &Common) -> anyhow::Result<Allocator> {
    let dir = super::runtime_dir(common.runtime_dir.clone())?;
    let pmu = PmuShape::from_env_or_discover()?;
    Ok(Allocator::open(&dir, pmu)?)
}

fn print(text: &str) -> anyhow::Result<()> {
    Ok(output::print(text)?)
}

/// A JSON document as printed: with the schema version of hvstats' JSON.
fn versioned(mut v: Value) -> Value {
    if let Value::Object(map) = &mut v {
        map.insert(json_keys::SCHEMA_KEY.to_owned(), json!(json_keys::SCHEMA_VERSION));
    }
    v
}

fn status_json(s: NtStatus) -> Value {
    json!({ "status": s.name().unwrap_or("unknown"), "code": format!("{:#010X}", s.0) })
}

fn exit_for(s: NtStatus) -> ExitCode {
    if s.is_success() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn pmu_json(pmu: &PmuShape) -> Value {
    let runs: Vec<Value> = pmu
        .runs()
        .into_iter()
        .map(|(first, last, c)| {
            json!({
                "cpus": CpuSet::from_iter(first..=last).to_string(),
                "gp": c.gp, "gp_width": c.gp_width, "fixed": c.fixed, "fixed_width": c.fixed_width,
            })
        })
        .collect();
    json!({
        "present": pmu.is_present(),
        "source": pmu.source(),
        "processors": pmu.processors(),
        "absent_reason": pmu.absent_reason(),
        "cpus": runs,
    })
}

fn allocation_json(a: &Allocation) -> Value {
    json!({
        "handle": a.handle.raw(),
        "pid": a.holder.pid,
        "process": a.holder.name,
        "start_time": a.holder.start_time,
        "lifetime": if a.holder.persistent { "until_freed" } else { "process" },
        "process_running": a.holder.process_runs(),
        "cpus": a.cpus.to_string(),
        "resources": a.resources,
        "resources_text": a.resources.to_string(),
    })
}

fn lifetime_text(a: &Allocation) -> &'static str {
    match (a.holder.persistent, a.holder.process_runs()) {
        (false, _) => "while it runs",
        (true, true) => "until freed",
        (true, false) => "until freed (process ended)",
    }
}

fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let allocator = open(&args.common)?;
    let pmu = allocator.pmu();
    let holders = allocator.allocations()?;
    if args.common.json {
        let v = json!({
            "pmu": pmu_json(pmu),
            "table": allocator.table_path(),
            "holders": holders.iter().map(allocation_json).collect::<Vec<_>>(),
        });
        print(&format!("{}\n", serde_json::to_string_pretty(&versioned(v))?))?;
        return Ok(ExitCode::SUCCESS);
    }
    print(&pmu_text(pmu))?;
    print(&format!("table: {}\n", allocator.table_path().display()))?;
    print(&holders_text(&holders))?;
    Ok(ExitCode::SUCCESS)
}

/// The processors and the PMU's counters on each, as `list` prints them.
fn pmu_text(pmu: &PmuShape) -> String {
    let mut s = String::new();
    let source = match pmu.source() {
        hvstats_hwc::pmu::ShapeSource::Discovered => "discovered".to_owned(),
        hvstats_hwc::pmu::ShapeSource::Configured => format!("configured by {PMU_ENV}"),
    };
    let groups = pmu.processors().div_ceil(64);
    s +=
        &format!("processors: {} (groups 0-{}; group G bit B is CPU 64*G+B)\n", pmu.processors(), groups - 1);
    match pmu.absent_reason() {
        Some(reason) => s += &format!("PMU ({source}): no PMU: {reason}\n"),
        None => {
            s += &format!("PMU ({source}):\n");
            for (first, last, c) in pmu.runs() {
                let cpus = CpuSet::from_iter(first..=last);
                let fixed = if c.fixed > 0 {
                    format!(", fixed {}-{}", c.gp, c.gp + c.fixed - 1)
                } else {
                    String::new()
                };
                let gp = if c.gp > 0 { format!("general-purpose 0-{}", c.gp - 1) } else { "none".into() };
                s += &format!("  CPUs {cpus}: {c} (counter indices: {gp}{fixed})\n");
            }
        }
    }
    s
}

/// Who holds which counters, as `list` prints them.
fn holders_text(holders: &[Allocation]) -> String {
    let mut s = String::new();
    if holders.is_empty() {
        s += "holders: none\n";
    } else {
        s += "holders:\n";
        s += &format!(
            "  {:<8} {:<8} {:<16} {:<28} {:<12} RESOURCES\n",
            "HANDLE", "PID", "PROCESS", "HELD", "CPUS"
        );
        for a in holders {
            s += &format!(
                "  {:<8} {:<8} {:<16} {:<28} {:<12} {}\n",
                a.handle.raw(),
                a.holder.pid,
                Escaped(&a.holder.name),
                lifetime_text(a),
                a.cpus.to_string(),
                a.resources
            );
        }
    }
    s
}

fn parse_u32_range(text: &str) -> anyhow::Result<(u32, u32)> {
    let (a, b) = text.split_once('-').with_context(|| format!("--range {text:?} is not A-B"))?;
    let n =
        |s: &str| s.trim().parse::<u32>().with_context(|| format!("--range {text:?}: {s:?} is not a number"));
    Ok((n(a)?, n(b)?))
}

fn parse_mask(text: &str) -> anyhow::Result<u64> {
    let digits = text.trim().trim_start_matches("0x").trim_start_matches("0X");
    u64::from_str_radix(digits, 16).with_context(|| format!("--mask {text:?} is not a 64-bit hex mask"))
}

/// The affinity the flags name: `None` (every processor) when they name none.
fn affinity(args: &AllocArgs) -> anyhow::Result<Option<Vec<GroupAffinity>>> {
    if args.group.len() != args.mask.len() {
        bail!("each --group needs one --mask ({} groups, {} masks)", args.group.len(), args.mask.len());
    }
    if args.cpus.is_empty() && args.group.is_empty() {
        return Ok(None);
    }
    let mut groups = Vec::new();
    for list in &args.cpus {
        groups.extend(CpuSet::parse(list, MAX_PROCESSORS - 1)?.to_group_affinities());
    }
    for (&g, m) in args.group.iter().zip(&args.mask) {
        groups.push(GroupAffinity::new(g, parse_mask(m)?));
    }
    Ok(Some(groups))
}

/// The resource list the flags name: `None` for --exclusive.
fn descriptors(args: &AllocArgs) -> anyhow::Result<Option<Vec<Descriptor>>> {
    let mut d: Vec<Descriptor> = args.counter.iter().map(|&i| Descriptor::single(i)).collect();
    for r in &args.range {
        let (a, b) = parse_u32_range(r)?;
        d.push(Descriptor::range(a, b));
    }
    if args.overflow {
        d.push(Descriptor::overflow(0));
    }
    if args.event_buffer {
        d.push(Descriptor::event_buffer(0, 0, 0));
    }
    d.extend(args.tag.iter().map(|&t| Descriptor::identification_tag(t)));
    match (args.exclusive, d.is_empty()) {
        (true, _) => Ok(None),
        (false, false) => Ok(Some(d)),
        (false, true) => {
            bail!(
                "name what to allocate (--counter, --range, --overflow, --event-buffer, --tag) or --exclusive"
            )
        }
    }
}

fn alloc(args: AllocArgs) -> anyhow::Result<ExitCode> {
    let affinity = affinity(&args)?;
    let descriptors = descriptors(&args)?;
    let list = descriptors.as_deref().map(PhysicalCounterResourceList::new);
    let allocator = open(&args.common)?;
    let lifetime = if args.hold { Lifetime::Process } else { Lifetime::UntilFreed };
    if args.hold {
        signals::block()?;
    }
    let handle = match allocator.try_allocate(affinity.as_deref(), list.as_ref(), lifetime) {
        Ok(h) => h,
        Err(HwcError::Table(e)) => return Err(e.into()),
        Err(e) => return refused(&e, args.common.json),
    };
    let held = allocator.allocation(handle)?.context("the allocation just made is not in the table")?;
    if args.common.json {
        let mut v = status_json(NtStatus::SUCCESS);
        v["handle"] = json!(handle.raw());
        v["allocation"] = allocation_json(&held);
        print(&format!("{}\n", versioned(v)))?;
    } else {
        let until = if args.hold {
            "held until this command ends (SIGINT/SIGTERM)".to_owned()
        } else {
            format!("held until `hvstats hwc free {handle}`")
        };
        print(&format!(
            "handle {handle}: {}; CPUs {}: {}; {until}\n",
            NtStatus::SUCCESS,
            held.cpus,
            held.resources
        ))?;
    }
    if !args.hold {
        return Ok(ExitCode::SUCCESS);
    }
    free_at_signal(&allocator, handle, args.common.json)
}

/// Says why an allocation was refused, with its status.
fn refused(e: &HwcError, json: bool) -> anyhow::Result<ExitCode> {
    let s = e.status();
    let why = match e {
        HwcError::Refused(why) => Some(why.to_string()),
        _ => None,
    };
    if json {
        let mut v = status_json(s);
        v["handle"] = Value::Null;
        v["reason"] = json!(why);
        print(&format!("{}\n", versioned(v)))?;
    } else {
        let why = why.map(|w| format!(": {w}")).unwrap_or_default();
        print(&format!("allocation refused: {s}{why}\n"))?;
    }
    Ok(exit_for(s))
}

/// Holds `handle` until SIGINT or SIGTERM, then frees it and says so.
fn free_at_signal(allocator: &Allocator, handle: CounterSetHandle, json: bool) -> anyhow::Result<ExitCode> {
    let signal = signals::wait()?.name();
    let s = allocator.free(handle);
    if json {
        let mut v = status_json(s);
        v["freed"] = json!(handle.raw());
        v["signal"] = json!(signal);
        print(&format!("{}\n", versioned(v)))?;
    } else {
        print(&format!("signal {signal}: freed handle {handle}: {s}\n"))?;
    }
    Ok(exit_for(s))
}

fn free(args: FreeArgs) -> anyhow::Result<ExitCode> {
    let allocator = open(&args.common)?;
    let handle = CounterSetHandle::from_raw(args.handle);
    let s = match allocator.try_free(handle) {
        Ok(()) => NtStatus::SUCCESS,
        Err(HwcError::Table(e)) => return Err(e.into()),
        Err(e) => e.status(),
    };
    if args.common.json {
        let mut v = status_json(s);
        v["handle"] = json!(handle.raw());
        print(&format!("{}\n", versioned(v)))?;
    } else if s.is_success() {
        print(&format!("handle {handle} freed: {s}\n"))?;
    } else {
        print(&format!("handle {handle} is not held: {s}\n"))?;
    }
    Ok(exit_for(s))
}
