//! `hvstats bench`: what hvstats costs, each figure measured side by side with its baseline in
//! the same run.
//!
//! These machines are noisy, so every row is a ratio of medians over several rounds, ours and the
//! baseline interleaved (alternating which goes first), each timed in the CPU time of the thread
//! doing it (time spent preempted counts for neither side; faults and syscalls count). With `--json`, one object per line:
//! `{"name", "ours", "baseline", "unit", "ratio", "goal", "met"}` with `ratio = ours / baseline`
//! (lower is better) and `met` whether the ratio is within the goal (`null` for a row without
//! one); the table marks each row `met` or `MISSED` the same way. A row that needs what this host
//! lacks (KVM) is `{"name", "skipped": why}`. Rows are named by what they measured: the snapshot
//! row by the VPs it really read (`--partitions` × 16).
//!
//! Rows: the VP thread's page update against an uncontended and a shared `fetch_add`; a
//! kept-mapping read of one VP against a `pread` of a vCPU's KVM stats fd (and, without KVM,
//! against a `pread` of the same page); a consistent copy of a VP page (inside its sequence
//! counter) against a plain one; the full snapshot of 65,536 VPs against a memcpy of the
//! same counter bytes; adding a partition to an instance of 4,096 against one of 64; the
//! userspace exit with accounting on against off; a hypercall against a plain exit.

use std::hint::black_box;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use hvstats::attach::Attach;
use hvstats::index::Entry;
use hvstats::reader::ArenaReader;
use hvstats::rules::StatsObject;
use hvstats::{Hypervisor, InstanceConfig, PartitionStats};
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::vp;
use hvstats_abi::page::PageLayout;
use hvstats_guest::program::LoopCount;
use hvstats_guest::{Mode, Workload, layout};
use hvstats_kvm::enlightenment::HyperV;
use hvstats_kvm::{Handlers, Partition, PartitionConfig};
use serde_json::{Value, json};

use crate::output::{self, note};

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
        anyhow::bail!("bench guest faulted: {} at {}", f.reason(), f.location());
    }
    Ok(vp.run_time / (exits + 1))
}

/// Flags of `hvstats bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// One JSON object per row instead of a table.
    #[arg(long)]
    json: bool,
    /// Rounds per comparison (medians are reported).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds: u32,
    /// Userspace exits per guest run (KVM rows).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    exits: u32,
    /// Hypercalls per guest run (KVM rows).
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    hypercalls: u32,
    /// Run only the rows whose name contains this (repeat it for rows of several names).
    #[arg(long, value_name = "TEXT")]
    only: Vec<String>,
    /// Partitions × VPs of the snapshot row (the issue's scale: 4096 × 16).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    partitions: u32,
}

/// One row of the report.
enum Row {
    Measured { name: &'static str, ours: f64, baseline: f64, unit: &'static str, goal: Option<f64> },
    Skipped { name: &'static str, why: String },
}

impl Row {
    fn json(&self) -> Value {
        match self {
            Row::Measured { name, ours, baseline, unit, goal } => json!({
                "name": name, "ours": ours, "baseline": baseline, "unit": unit,
                "ratio": ours / baseline, "goal": goal, "met": self.met(),
            }),
            Row::Skipped { name, why } => json!({ "name": name, "skipped": why }),
        }
    }

    /// Whether a measured row's ratio is within its goal: `None` without a goal (or a measure).
    /// A ratio that is not a number (a side that measured nothing) misses its goal.
    fn met(&self) -> Option<bool> {
        match self {
            Row::Measured { ours, baseline, goal: Some(goal), .. } => Some(ours / baseline <= *goal),
            Row::Measured { goal: None, .. } | Row::Skipped { .. } => None,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Row::Measured { name, .. } | Row::Skipped { name, .. } => name,
        }
    }

    /// The table's mark for [`met`](Self::met).
    fn mark(&self) -> &'static str {
        match self.met() {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "-",
        }
    }
}

/// Whether `--only` (each value a part of a row's name; none: every row) selects row `name`.
fn selects(only: &[String], name: &str) -> bool {
    only.is_empty() || only.iter().any(|part| name.contains(part.as_str()))
}

/// The name of the snapshot row for `partitions` partitions of 16 VPs: what it really read.
fn snapshot_row_name(partitions: u32) -> String {
    format!("snapshot-{}-vps-vs-memcpy", u64::from(partitions) * 16)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Medians of `ours` and `baseline` over `rounds`, interleaved, alternating which goes first.
fn side_by_side(rounds: u32, mut ours: impl FnMut() -> f64, mut baseline: impl FnMut() -> f64) -> (f64, f64) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 0 {
            a.push(ours());
            b.push(baseline());
        } else {
            b.push(baseline());
            a.push(ours());
        }
    }
    (median(a), median(b))
}

/// The calling thread's CPU time: what single-threaded rows measure, so that time the thread
/// spends preempted on a busy host counts for neither side.
#[derive(Clone, Copy)]
struct CpuClock(Duration);

impl CpuClock {
    fn now() -> Self {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid out-pointer; CLOCK_THREAD_CPUTIME_ID always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Self(Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.clamp(0, 999_999_999) as u32))
    }

    fn elapsed(self) -> Duration {
        Self::now().0.saturating_sub(self.0)
    }
}

fn ns_per(start: CpuClock, n: u64) -> f64 {
    start.elapsed().as_nanos() as f64 / n as f64
}

const OPS: u64 = 2_000_000;

/// The VP thread's update of its own page as its exit path does it: a plain load and store at
/// a slot known at compile time.
fn page_updates(page: &hvstats::SharedPage) -> f64 {
    let start = CpuClock::now();
    for _ in 0..OPS {
        page.add(vp::CPUID_INSTRUCTIONS, black_box(1));
    }
    ns_per(start, OPS)
}

fn fetch_adds(counter: &AtomicU64) -> f64 {
    let start = CpuClock::now();
    for _ in 0..OPS {
        black_box(counter).fetch_add(black_box(1), Ordering::Relaxed);
    }
    ns_per(start, OPS)
}

/// `threads` threads at once, each running `f(thread)`; the median of their ns/op.
fn in_threads(threads: usize, f: &(dyn Fn(usize) -> f64 + Sync)) -> f64 {
    let barrier = std::sync::Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    f(t)
                })
            })
            .collect();
        median(handles.into_iter().map(|h| h.join().unwrap_or(f64::NAN)).collect())
    })
}

fn update_rows(rounds: u32, hv: &Arc<Hypervisor>) -> anyhow::Result<Vec<Row>> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8);
    let part = hv.create_partition(threads as u32).context("creating the bench partition")?;
    let page0 = part.vp_page(0).context("VP 0")?;
    let own = AtomicU64::new(0);
    let (ours, baseline) = side_by_side(rounds, || page_updates(page0), || fetch_adds(&own));
    let mut rows = vec![Row::Measured {
        name: "update-vs-fetch-add",
        ours,
        baseline,
        unit: "ns/update",
        goal: Some(0.33),
    }];
    let shared = AtomicU64::new(0);
    let part_ref: &PartitionStats = &part;
    let vp_pages = |t: usize| part_ref.vp_page(t as u32).map_or(f64::NAN, page_updates);
    let (ours, baseline) = side_by_side(
        rounds,
        || in_threads(threads, &vp_pages),
        || in_threads(threads, &|_| fetch_adds(&shared)),
    );
    rows.push(Row::Measured {
        name: "update-vs-shared-fetch-add",
        ours,
        baseline,
        unit: "ns/update",
        goal: Some(0.1),
    });
    hv.remove_partition(part.id());
    Ok(rows)
}

/// A temporary runtime directory for the instances the bench publishes, removed on drop.
struct TempRuntime(std::path::PathBuf);

impl TempRuntime {
    fn new(what: &str) -> anyhow::Result<Self> {
        // tmpfs, as the runtime directory (/run) is, when there is one: a disk-backed file would
        // add writeback of the pages to what is measured.
        let base = match std::path::Path::new("/dev/shm") {
            shm if shm.is_dir() => shm.to_owned(),
            _ => std::env::temp_dir(),
        };
        let dir = base.join(format!("hvstats-bench-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TempRuntime {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn published(dir: &std::path::Path) -> anyhow::Result<Arc<Hypervisor>> {
    Hypervisor::with_config(InstanceConfig {
        runtime_dir: Some(dir.to_owned()),
        logical_processors: Some(vec![0]),
        ..Default::default()
    })
    .context("publishing a bench instance")
}

/// Words of a VP page this build's layout uses (headers and counters).
fn vp_words() -> usize {
    PageLayout::of(ObjectKind::Vp).end_offset / 8 + 1
}

fn read_rows(rounds: u32, kvm: &Result<(), String>) -> anyhow::Result<Vec<Row>> {
    let rt = TempRuntime::new("read")?;
    let hv = published(&rt.0)?;
    let part = hv.create_partition(1)?;
    part.vp_page(0).context("VP 0")?.set(vp::HYPERCALLS, 1);
    let mut attach = Attach::new(&rt.0);
    attach.refresh()?;
    let instance = attach.instances().next().context("the bench instance is not found")?;
    let object = StatsObject::Vp(part.id(), 0);
    let mut words = vec![0u64; vp_words()];
    let n = 200_000u64;
    let mut kept = || {
        let start = CpuClock::now();
        for _ in 0..n {
            let _ = instance.read_prefix(black_box(object), &mut words);
        }
        black_box(&words);
        ns_per(start, n)
    };
    let mut rows = Vec::new();
    match kvm {
        Ok(()) => {
            let vcpu =
                hvstats_kvm::sources::kvm_stats::IdleVcpu::new().context("opening a vCPU's KVM stats fd")?;
            let stats = &vcpu.stats;
            let mut buf = vec![0u64; stats.data_words()];
            let (ours, baseline) = side_by_side(rounds, &mut kept, || {
                let start = CpuClock::now();
                for _ in 0..n / 10 {
                    let _ = stats.read_into(&mut buf);
                }
                ns_per(start, n / 10)
            });
            rows.push(Row::Measured {
                name: "read-vp-vs-stats-fd",
                ours,
                baseline,
                unit: "ns/read",
                goal: Some(0.2),
            });
        }
        Err(why) => rows.push(Row::Skipped { name: "read-vp-vs-stats-fd", why: why.clone() }),
    }
    // Without KVM, the nearest baseline: one pread of the same page from the arena file.
    let file = std::fs::File::open(hv.published_path().context("published path")?)?;
    let offset = part.vp_page(0).context("VP 0")?.file_offset();
    let mut page = vec![0u8; vp_words() * 8];
    let (ours, baseline) = side_by_side(rounds, &mut kept, || {
        let start = CpuClock::now();
        for _ in 0..n / 10 {
            let _ = file.read_at(&mut page, offset);
        }
        ns_per(start, n / 10)
    });
    rows.push(Row::Measured { name: "read-vp-vs-pread-page", ours, baseline, unit: "ns/read", goal: None });
    Ok(rows)
}

/// What consistency costs a reader: copying a VP page from the arena inside its sequence counter
/// (two more loads and a compare, retried while a merge is under way) over the plain copy checked
/// only against the slot's entry, both of the words the layout uses, side by side.
fn consistency_row(rounds: u32) -> anyhow::Result<Row> {
    let rt = TempRuntime::new("consistent")?;
    let hv = published(&rt.0)?;
    let part = hv.create_partition(1)?;
    part.vp_page(0).context("VP 0")?.set(vp::HYPERCALLS, 1);
    let file = std::fs::File::open(hv.published_path().context("published path")?)?;
    let arena = ArenaReader::open(file).context("opening the bench arena")?;
    anyhow::ensure!(arena.is_mapped(), "the bench arena is ours, so mapped");
    let (slot, generation) = (0..arena.slots())
        .find_map(|slot| {
            let entry = Entry::decode(&arena.entry_words(slot).ok()?).ok()??;
            (entry.kind == ObjectKind::Vp).then_some((slot, entry.generation))
        })
        .context("the bench VP is not in the arena")?;
    let (mut consistent, mut plain) = (vec![0u64; vp_words()], vec![0u64; vp_words()]);
    let n = 500_000u64;
    let sequence = vp::SEQUENCE.slot();
    let (ours, baseline) = side_by_side(
        rounds,
        || {
            let start = CpuClock::now();
            for _ in 0..n {
                let _ =
                    arena.read_page_prefix_consistent(black_box(slot), generation, &mut consistent, sequence);
            }
            black_box(&consistent);
            ns_per(start, n)
        },
        || {
            let start = CpuClock::now();
            for _ in 0..n {
                let _ = arena.read_page_prefix(black_box(slot), generation, &mut plain);
            }
            black_box(&plain);
            ns_per(start, n)
        },
    );
    Ok(Row::Measured {
        name: "vp-read-consistent-vs-plain",
        ours,
        baseline,
        unit: "ns/read",
        goal: Some(1.1),
    })
}

fn snapshot_row(rounds: u32, partitions: u32, name: &'static str) -> anyhow::Result<Row> {
    let rt = TempRuntime::new("snapshot")?;
    let hv = published(&rt.0)?;
    let parts = (0..partitions)
        .map(|_| hv.create_partition(16))
        .collect::<Result<Vec<_>, _>>()
        .context("publishing the bench partitions")?;
    for (i, p) in parts.iter().enumerate() {
        for n in 0..16 {
            if let Some(page) = p.vp_page(n) {
                page.set(vp::HYPERCALLS, i as u64);
            }
        }
    }
    let mut attach = Attach::new(&rt.0);
    attach.refresh()?;
    let instance = attach.instances_mut().next().context("the bench instance is not found")?;
    let words = vp_words();
    let sources: Vec<*const u8> = parts
        .iter()
        .flat_map(|p| (0..16).filter_map(|n| p.vp_page(n).map(|pg| pg.host_address() as *const u8)))
        .collect();
    let mut copy = vec![0u8; sources.len() * words * 8];
    let (ours, baseline) = side_by_side(
        rounds,
        || {
            let start = CpuClock::now();
            let snapshot = black_box(instance.snapshot());
            let elapsed = start.elapsed().as_secs_f64() * 1e3;
            if std::env::var_os("HVSTATS_BENCH_TRACE").is_some() {
                let t = CpuClock::now();
                drop(snapshot);
                note!("snapshot {elapsed:.1} ms, dropping it {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
            }
            elapsed
        },
        || {
            let start = CpuClock::now();
            for (i, src) in sources.iter().enumerate() {
                // SAFETY: each source is a live VP page of PAGE_SIZE bytes (the partitions are
                // held above) and `copy` has room for `words` words per page.
                unsafe {
                    std::ptr::copy_nonoverlapping(*src, copy.as_mut_ptr().add(i * words * 8), words * 8);
                }
            }
            black_box(&copy);
            start.elapsed().as_secs_f64() * 1e3
        },
    );
    Ok(Row::Measured { name, ours, baseline, unit: "ms/snapshot", goal: Some(10.0) })
}

fn partition_add_row(rounds: u32) -> anyhow::Result<Row> {
    let (small_rt, large_rt) = (TempRuntime::new("add-64")?, TempRuntime::new("add-4096")?);
    let (small, large) = (published(&small_rt.0)?, published(&large_rt.0)?);
    let _keep_small: Vec<_> = (0..64).map(|_| small.create_partition(16)).collect::<Result<_, _>>()?;
    let _keep_large: Vec<_> = (0..4096).map(|_| large.create_partition(16)).collect::<Result<_, _>>()?;
    let adds = 200u32;
    let time_adds = |hv: &Arc<Hypervisor>| {
        let mut total = Duration::ZERO;
        for _ in 0..adds {
            let start = CpuClock::now();
            let p = hv.create_partition(16);
            total += start.elapsed();
            if let Ok(p) = p {
                hv.remove_partition(p.id());
            }
        }
        total.as_nanos() as f64 / f64::from(adds) / 1e3
    };
    let (ours, baseline) = side_by_side(rounds, || time_adds(&large), || time_adds(&small));
    Ok(Row::Measured { name: "partition-add-4096-vs-64", ours, baseline, unit: "us/add", goal: Some(2.0) })
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
        anyhow::bail!("hypercall bench guest faulted: {} at {}", f.reason(), f.location());
    }
    Ok(vp.run_time / n)
}

fn kvm_rows(args: &Args, hv: &Arc<Hypervisor>) -> anyhow::Result<Vec<Row>> {
    // One run to warm up page tables, caches and the tracefs mount.
    exit_round_trip(hv, 1000, true)?;
    let ns = |d: Duration| d.as_nanos() as f64;
    let run = |accounting| exit_round_trip(hv, args.exits, accounting).map(ns).unwrap_or(f64::NAN);
    let (on, off) = side_by_side(args.rounds, || run(true), || run(false));
    hypercall_round_trip(hv, 100)?;
    let (call, plain) = side_by_side(
        args.rounds,
        || hypercall_round_trip(hv, args.hypercalls).map(ns).unwrap_or(f64::NAN),
        || run(true),
    );
    Ok(vec![
        Row::Measured {
            name: "exit-accounting-on-vs-off",
            ours: on,
            baseline: off,
            unit: "ns/exit",
            goal: Some(1.02),
        },
        Row::Measured {
            name: "hypercall-vs-plain-exit",
            ours: call,
            baseline: plain,
            unit: "ns/exit",
            goal: None,
        },
    ])
}

/// What `hvstats observe` costs: the observed guest's time per exit with the observer over
/// without it (a QEMU with KVM; goal ≤ 1.01, i.e. an exit rate ≥ 0.99 of the unobserved one),
/// and, runnable anywhere, a thread's time per counted `getppid` with the observer's counters on
/// it over without (an enabled syscall tracepoint also sends every system call through the slow
/// path, so this overstates the cost).
fn observe_rows(rounds: u32, kvm: &Result<(), String>, wanted: &dyn Fn(&str) -> bool) -> Vec<Row> {
    use hvstats_kvm::observe::overhead;
    let mut rows = Vec::new();
    let per = |rates: &overhead::ExitRates| {
        let (on, off) = rates.medians();
        (1e9 / on, 1e9 / off)
    };
    if wanted(overhead::GUEST_ROW) {
        let measured = match kvm {
            Ok(()) => {
                overhead::guest_exit_rate_on_vs_off(rounds, Duration::from_secs(2), Duration::from_secs(1))
                    .map_err(|e| hvstats::snapshot::error_chain(&e))
            }
            Err(why) => Err(why.clone()),
        };
        rows.push(match measured {
            Ok(rates) => {
                let (ours, baseline) = per(&rates);
                Row::Measured { name: overhead::GUEST_ROW, ours, baseline, unit: "ns/exit", goal: Some(1.01) }
            }
            Err(why) => Row::Skipped { name: overhead::GUEST_ROW, why },
        });
    }
    rows.extend(counting_cost_rows(rounds, wanted));
    if wanted(overhead::COUNTING_ROW) {
        rows.push(match overhead::counted_event_rate_on_vs_off(rounds, 200_000) {
            Ok(rates) => {
                let (ours, baseline) = per(&rates);
                Row::Measured { name: overhead::COUNTING_ROW, ours, baseline, unit: "ns/event", goal: None }
            }
            Err(why) => Row::Skipped { name: overhead::COUNTING_ROW, why },
        });
    }
    rows
}

/// What counting a tracepoint costs the firing thread: 1, 4 and 16 filtered perf events
/// against one in-kernel program counting as many classes, and the VMX load (every intercept
/// class of `kvm_exit` against one) on a tracepoint that fires on every host. ns per call.
fn counting_cost_rows(rounds: u32, wanted: &dyn Fn(&str) -> bool) -> Vec<Row> {
    use hvstats_kvm::observe::counting_cost as cost;
    let to_rows = |names: &[&'static str], measured: Result<Vec<cost::CostRow>, String>| -> Vec<Row> {
        match measured {
            Ok(rows) => rows
                .into_iter()
                .filter(|r| wanted(r.name))
                .map(|r| Row::Measured {
                    name: r.name,
                    ours: r.ours,
                    baseline: r.baseline,
                    unit: "ns/event",
                    goal: r.goal,
                })
                .collect(),
            Err(why) => names
                .iter()
                .filter(|n| wanted(n))
                .map(|name| Row::Skipped { name, why: why.clone() })
                .collect(),
        }
    };
    let mut rows = Vec::new();
    let mut names: Vec<&'static str> = cost::PERF_VS_PROGRAM_ROWS.iter().map(|(_, n)| *n).collect();
    names.extend([cost::PROGRAM_16_VS_NONE, cost::PERF_16_VS_NONE]);
    if names.iter().any(|n| wanted(n)) {
        rows.extend(to_rows(&names, cost::tracepoint_costs(rounds, 200_000)));
    }
    let names = [cost::VMX_PROXY_ROW, cost::VMX_PROXY_PERF_ROW];
    if names.iter().any(|n| wanted(n)) {
        rows.extend(to_rows(&names, cost::vmx_proxy(rounds, 200_000)));
    }
    rows
}

/// Whether this host can run the KVM rows, and if not, why.
fn kvm_usable() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(drop)
        .map_err(|e| format!("needs KVM: /dev/kvm cannot be opened ({e})"))
}

/// Runs `hvstats bench`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let hv = Hypervisor::new().context("creating the hypervisor instance")?;
    let kvm = kvm_usable();
    let wanted = |name: &str| selects(&args.only, name);
    // A group measured together runs when any of its rows is wanted (`--only` a whole row name).
    let any = |names: &[&str]| names.iter().any(|name| wanted(name));
    let mut rows = Vec::new();
    if any(&["update-vs-fetch-add", "update-vs-shared-fetch-add"]) {
        rows.extend(update_rows(args.rounds, &hv)?);
    }
    if any(&["read-vp-vs-stats-fd", "read-vp-vs-pread-page"]) {
        rows.extend(read_rows(args.rounds, &kvm)?);
    }
    if wanted("vp-read-consistent-vs-plain") {
        rows.push(consistency_row(args.rounds)?);
    }
    let snapshot_name = snapshot_row_name(args.partitions);
    if wanted(&snapshot_name) {
        // Rows are named once per run: leaking this one name keeps them all `&'static str`.
        rows.push(snapshot_row(args.rounds, args.partitions, snapshot_name.leak())?);
    }
    if wanted("partition-add-4096-vs-64") {
        rows.push(partition_add_row(args.rounds)?);
    }
    if any(&[
        "serve-scrape-65536-vps-one-by-one-vs-snapshot-json",
        "serve-scrape-65536-vps-capped-vs-snapshot-json",
    ]) {
        let scrape = crate::cmd::serve::bench::scrape_rows(args.rounds)?;
        rows.extend(scrape.into_iter().map(|r| Row::Measured {
            name: r.name,
            ours: r.ours,
            baseline: r.baseline,
            unit: r.unit,
            goal: None,
        }));
    }
    rows.extend(observe_rows(args.rounds, &kvm, &wanted));
    match &kvm {
        Ok(()) if any(&["exit-accounting-on-vs-off", "hypercall-vs-plain-exit"]) => {
            rows.extend(kvm_rows(&args, &hv)?);
        }
        Ok(()) => {}
        Err(why) => {
            for name in ["exit-accounting-on-vs-off", "hypercall-vs-plain-exit"] {
                if wanted(name) {
                    rows.push(Row::Skipped { name, why: why.clone() });
                }
            }
        }
    }
    // Only the rows asked for, not the others measured with them.
    rows.retain(|row| wanted(row.name()));
    output::with_stdout(|out| {
        if args.json {
            for row in &rows {
                writeln!(out, "{}", row.json())?;
            }
        } else {
            writeln!(
                out,
                "{:<30} {:>14} {:>14} {:>12} {:>8} {:>6} {:>6}",
                "row", "ours", "baseline", "unit", "ratio", "goal", "met"
            )?;
            for row in &rows {
                match row {
                    Row::Measured { name, ours, baseline, unit, goal } => writeln!(
                        out,
                        "{name:<30} {ours:>14.3} {baseline:>14.3} {unit:>12} {:>8.3} {:>6} {:>6}",
                        ours / baseline,
                        goal.map_or("-".to_owned(), |g| format!("<={g}")),
                        row.mark(),
                    )?,
                    Row::Skipped { name, why } => writeln!(out, "{name:<30} skipped: {why}")?,
                }
            }
        }
        Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(ours: f64, baseline: f64, goal: Option<f64>) -> Row {
        Row::Measured { name: "r", ours, baseline, unit: "ns", goal }
    }

    #[test]
    fn a_row_is_marked_met_or_missed_against_its_goal_in_the_table_and_the_json() {
        let missed = measured(125.0, 409.0, Some(0.2));
        assert_eq!((missed.met(), missed.mark()), (Some(false), "MISSED"));
        assert_eq!(missed.json()["met"], false);
        let met = measured(60.0, 409.0, Some(0.2));
        assert_eq!((met.met(), met.mark()), (Some(true), "met"));
        assert_eq!(met.json()["met"], true);
        let no_goal = measured(1.0, 2.0, None);
        assert_eq!((no_goal.met(), no_goal.mark()), (None, "-"));
        assert!(no_goal.json()["met"].is_null());
        assert_eq!(measured(f64::NAN, 1.0, Some(1.0)).met(), Some(false), "nothing measured");
        let skipped = Row::Skipped { name: "r", why: "needs KVM".into() };
        assert_eq!(skipped.met(), None);
        assert!(skipped.json().get("met").is_none());
    }

    #[test]
    fn only_selects_rows_by_any_part_of_their_name_and_repeats() {
        let only = |parts: &[&str]| parts.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>();
        assert!(selects(&[], "read-vp-vs-stats-fd"));
        assert!(selects(&only(&["read-vp-vs-stats-fd"]), "read-vp-vs-stats-fd"));
        assert!(!selects(&only(&["read-vp-vs-stats-fd"]), "read-vp-vs-pread-page"));
        let two = only(&["read-vp-vs-stats-fd", "snapshot-"]);
        assert!(selects(&two, "snapshot-1024-vps-vs-memcpy"));
        assert!(selects(&two, "read-vp-vs-stats-fd"));
        assert!(!selects(&two, "update-vs-fetch-add"));
    }

    #[test]
    fn the_snapshot_row_is_named_by_the_vps_it_read() {
        assert_eq!(snapshot_row_name(4096), "snapshot-65536-vps-vs-memcpy");
        assert_eq!(snapshot_row_name(64), "snapshot-1024-vps-vs-memcpy");
        assert_eq!(snapshot_row_name(65_536), "snapshot-1048576-vps-vs-memcpy");
    }
}
