//! How the observer's cost grows with the VMs: `hvstats observe --all` over fleets of 64, 256
//! and 1,024 VMs of 4 vCPU threads each.
//!
//! Each VM is a process of the bench's minimal VMM (`hvstats-bench-vmm`, a
//! [`hvstats_testkit::PacedVm`]): one KVM VM, its 4 vCPU threads each leaving the guest once a
//! second, and KVM's statistics descriptors open on the VM and each vCPU as QEMU 8.1 and later
//! keeps them, so the observer reads them as it would a QEMU's. The fleet grows from one row to
//! the next; each row runs a fresh `hvstats observe --all` (the real binary, its own process) told
//! to observe the fleet alone (`--vm` each VMM's pid), waits until it publishes every VM (or
//! publishes no more for a while: a VM it refused is not published), then measures windows of
//! refreshes.
//!
//! Our side: the observer's CPU time per 1 s refresh (every thread of the process, from the
//! kernel's schedstat, in seconds); the baseline: the refresh interval. The ratio is the share of
//! one CPU the observer takes (goal: at most 1 %). The facts: the VMs and vCPU threads observed
//! (published) and the VMs not, the refusals it said, the CPU per VM and per vCPU thread a refresh (µs), the observer's RSS and
//! descriptors (by kind) at the end, the descriptors that count (all but the KVM statistics
//! copied from the VMMs) per vCPU thread, a VMM's RSS, the per-VM cost over the smallest
//! row's, and the time from the observer's start until it published every VM, per VM (what
//! attaching costs, which the refreshes measured after it do not show; polled once a second). A host without the memory for a fleet runs the largest it can (leaving
//! [`MEMORY_RESERVE`] free): the row's `vms` fact says how many, beside `vms_asked`.

use std::io::BufRead;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hvstats_sources::kvm_stats::KvmStats;

use crate::row::{CpuClock, Pace, Plan, Rounds, Row, Spread};
use crate::shutdown::{Hvstats, binary, hvstats_binary, root};

/// The rows, by fleet size.
pub const ROWS: [&str; 3] = ["observe-scale-64", "observe-scale-256", "observe-scale-1024"];

/// The VMs of each row.
pub const FLEETS: [usize; 3] = [64, 256, 1024];

/// The row of an observer that leaves every VM of the largest fleet out (`--vm` naming none of
/// them): what a VM left out by a filter costs, beside what one observed costs.
pub const LEFT_OUT_ROW: &str = "observe-scale-1024-left-out";

/// vCPU threads of each VM.
pub const VCPUS_EACH: usize = 4;

/// The memory a fleet leaves free on the host (other work shares it).
pub const MEMORY_RESERVE: u64 = 4 << 30;

/// The observer's refresh interval, and each vCPU's pace.
const INTERVAL: Duration = Duration::from_secs(1);

/// Refreshes per measured window.
const WINDOW: u32 = 3;

/// How long the observer may go without saying a word of a VM before the row measures what it
/// has.
const QUIET: Duration = Duration::from_secs(20);

/// The rows `wanted` selects, over one fleet grown from row to row; `kvm` says whether this host
/// can run a VM, and if not why. A row this host cannot measure is skipped, with why.
pub fn observe_scale_rows(
    plan: &Plan<'_>,
    kvm: &Result<(), String>,
    wanted: &dyn Fn(&str) -> bool,
) -> Vec<Row> {
    let asked: Vec<(&'static str, usize)> = ROWS.into_iter().zip(FLEETS).filter(|(n, _)| wanted(n)).collect();
    let left_out = wanted(LEFT_OUT_ROW);
    if asked.is_empty() && !left_out {
        return Vec::new();
    }
    let tools = kvm.clone().and_then(|()| root()).and_then(|()| {
        Ok((hvstats_binary()?, binary("hvstats-bench-vmm", "cargo build -p hvstats-bench --bins")?))
    });
    let (hvstats, vmm) = match tools {
        Ok(tools) => tools,
        Err(why) => {
            let names = asked.into_iter().map(|(name, _)| name).chain(left_out.then_some(LEFT_OUT_ROW));
            return names.map(|name| Row::Skipped { name, why: why.clone() }).collect();
        }
    };
    let _ = hvstats_observe::raise_fd_limit();
    let mut fleet = Fleet::default();
    let mut rows = Vec::new();
    let mut smallest: Option<f64> = None;
    for (name, vms) in asked {
        let row = fleet.grow(&vmm, vms).and_then(|()| measure(plan, name, &hvstats, &fleet, vms));
        rows.push(match row {
            Ok(mut row) => {
                let per_vm = fact(&row, "us_per_vm");
                let base = *smallest.get_or_insert(per_vm);
                if let Row::Measured { facts, .. } = &mut row {
                    facts.push(("us_per_vm_over_smallest_row", per_vm / base));
                }
                row
            }
            Err(why) => Row::Skipped { name, why },
        });
    }
    if left_out {
        let vms = FLEETS[FLEETS.len() - 1];
        let observed = rows.iter().find(|r| r.name() == ROWS[ROWS.len() - 1]).map(|r| fact(r, "us_per_vm"));
        let row =
            fleet.grow(&vmm, vms).and_then(|()| measure_left_out(plan, &hvstats, &fleet, vms, observed));
        rows.push(row.unwrap_or_else(|why| Row::Skipped { name: LEFT_OUT_ROW, why }));
    }
    rows
}

/// The CPU per refresh of observer `pid` over the plan's rounds of [`WINDOW`] refreshes, beside
/// the refresh interval: the rounds of row `name`.
fn refreshes(plan: &Plan<'_>, name: &'static str, pid: i32) -> Result<Rounds, String> {
    let mut rounds = Rounds::default();
    for _ in 0..plan.start(&[name], Pace::Slow).max(2) {
        let before = process_cpu(pid)?;
        let start = Instant::now();
        std::thread::sleep(INTERVAL * WINDOW);
        let refreshes = start.elapsed().as_secs_f64() / INTERVAL.as_secs_f64();
        rounds.ours.push((process_cpu(pid)? - before) / refreshes);
        rounds.baseline.push(INTERVAL.as_secs_f64());
        plan.tick();
    }
    Ok(rounds)
}

/// [`LEFT_OUT_ROW`]: a fresh `hvstats observe --all` told to observe a VM of a UUID none of the
/// fleet's `vms` VMs has, so it leaves every one out, measured over the plan's rounds of
/// [`WINDOW`] refreshes once a few refreshes passed; `observed`, the CPU per VM of the row that
/// observes them all, where it was measured.
fn measure_left_out(
    plan: &Plan<'_>,
    hvstats: &Path,
    fleet: &Fleet,
    vms: usize,
    observed: Option<f64>,
) -> Result<Row, String> {
    let name = LEFT_OUT_ROW;
    let left_out = fleet.pids(vms).len();
    let dir = crate::authority::TempRuntime::new("left-out").map_err(|e| e.to_string())?;
    let none = "00000000-0000-0000-0000-000000000000";
    let args = ["observe", "--all", "--interval", "1", "--vm", none];
    let observer = Hvstats::start(hvstats, &args, dir.path())?;
    let pid = observer.child.id() as i32;
    // Its first refresh finds and leaves out every VM; those after it are what a refresh costs.
    std::thread::sleep(4 * INTERVAL);
    let rounds = refreshes(plan, name, pid)?;
    if published(dir.path()).0 != 0 {
        return Err("the observer observed a VM it was told to leave out".into());
    }
    let [fds, ..] = descriptors(pid);
    let per_vm = Spread::of(&rounds.ours).median * 1e6 / left_out.max(1) as f64;
    let mut facts = vec![
        ("vms_left_out", left_out as f64),
        ("us_per_left_out_vm", per_vm),
        ("descriptors", fds),
        ("rss_mib", status_kib(pid, "VmRSS:").unwrap_or(f64::NAN) / 1024.0),
    ];
    if let Some(observed) = observed {
        facts.push(("us_per_left_out_vm_over_observed_vm", per_vm / observed));
    }
    Ok(Row::Measured { name, rounds, unit: "s/refresh", goal: None, facts })
}

fn fact(row: &Row, name: &str) -> f64 {
    match row {
        Row::Measured { facts, .. } => facts.iter().find(|(n, _)| *n == name).map_or(f64::NAN, |(_, v)| *v),
        Row::Skipped { .. } => f64::NAN,
    }
}

/// The VMM processes of the bench, ended (their standard input closed, then killed) on drop.
#[derive(Default)]
struct Fleet {
    vmms: Vec<Child>,
    /// Each VMM's RSS once its vCPUs ran, in KiB.
    rss_kib: Vec<f64>,
    /// Why the fleet stopped growing short of a row's size, if it did.
    short: Option<String>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for vmm in &mut self.vmms {
            drop(vmm.stdin.take());
            let _ = vmm.kill();
        }
        for vmm in &mut self.vmms {
            let _ = vmm.wait();
        }
    }
}

impl Fleet {
    /// Starts VMMs until there are `vms`, or until the host's available memory would fall below
    /// [`MEMORY_RESERVE`] (then the fleet is what ran, and `short` says why).
    fn grow(&mut self, vmm: &Path, vms: usize) -> Result<(), String> {
        while self.vmms.len() < vms && self.short.is_none() {
            let available = mem_available()?;
            if available < MEMORY_RESERVE {
                self.short = Some(format!(
                    "{} VMs ran: {} MiB of memory left, {} MiB kept free",
                    self.vmms.len(),
                    available >> 20,
                    MEMORY_RESERVE >> 20
                ));
                break;
            }
            let child = start_vmm(vmm)?;
            self.rss_kib.push(status_kib(child.id() as i32, "VmRSS:").unwrap_or(f64::NAN));
            self.vmms.push(child);
        }
        match self.vmms.is_empty() {
            true => Err(self.short.clone().unwrap_or_else(|| "no VM ran".into())),
            false => Ok(()),
        }
    }

    fn pids(&self, vms: usize) -> Vec<i32> {
        self.vmms.iter().take(vms).map(|c| c.id() as i32).collect()
    }
}

/// A VMM of [`VCPUS_EACH`] vCPUs paced at [`INTERVAL`], once it said it is ready.
pub(crate) fn start_vmm(vmm: &Path) -> Result<Child, String> {
    let pace = INTERVAL.as_millis().to_string();
    let mut child = Command::new(vmm)
        .args([VCPUS_EACH.to_string().as_str(), pace.as_str()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("{}: {e}", vmm.display()))?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    if line.trim() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("{} did not start its VM", vmm.display()));
    }
    Ok(child)
}

/// The host's available memory, in bytes.
fn mem_available() -> Result<u64, String> {
    let text = std::fs::read_to_string("/proc/meminfo").map_err(|e| format!("/proc/meminfo: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib << 10)
        .ok_or_else(|| "/proc/meminfo: no MemAvailable".into())
}

/// A `KEY: n kB` field of a process's status, in KiB.
fn status_kib(pid: i32, key: &str) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The CPU time every thread of process `pid` has run, in seconds (the first field of each
/// thread's schedstat: nanoseconds).
fn process_cpu(pid: i32) -> Result<f64, String> {
    let dir = format!("/proc/{pid}/task");
    let tasks = std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?;
    let mut ns = 0u64;
    for task in tasks.flatten() {
        let text = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        ns += text.split_whitespace().next().and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    }
    Ok(ns as f64 / 1e9)
}

/// The descriptors process `pid` holds: all, perf events, KVM statistics, BPF objects.
fn descriptors(pid: i32) -> [f64; 4] {
    let mut counts = [0f64; 4];
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten() {
        let target =
            std::fs::read_link(fd.path()).map(|t| t.to_string_lossy().into_owned()).unwrap_or_default();
        counts[0] += 1.0;
        match () {
            () if target.contains("perf_event") => counts[1] += 1.0,
            () if target.contains("kvm-") && target.contains("-stats") => counts[2] += 1.0,
            () if target.contains("bpf") => counts[3] += 1.0,
            () => {}
        }
    }
    counts
}

/// The VMs and vCPUs the observer publishes in runtime directory `dir`.
pub(crate) fn published(dir: &Path) -> (usize, usize) {
    match hvstats_present::live::Live::new(Some(dir.to_owned())).read() {
        Ok(reading) => (reading.instances.iter().map(|i| i.partitions.len()).sum(), reading.vp_count()),
        Err(_) => (0, 0),
    }
}

/// Waits until the observer publishes `vms` VMs, or published no more for [`QUIET`]: the VMs
/// and vCPUs it then publishes.
fn settle(dir: &Path, vms: usize) -> (usize, usize) {
    let mut last = (0, 0);
    let mut since = Instant::now();
    while last.0 < vms && since.elapsed() < QUIET {
        std::thread::sleep(INTERVAL);
        let now = published(dir);
        if now.0 > last.0 {
            since = Instant::now();
        }
        last = now;
    }
    last
}

/// The refusals the observer said so far, a VM waiting for descriptors ("not observed for now")
/// included (its first said on standard error, for the reader of the row to see why). The
/// observer's log budget may hold some back: the `vms_not_observed` fact is the count.
fn refusals(observer: &Hvstats) -> usize {
    let refusal = |l: &String| {
        ["refused pid ", "not observed for now", "cannot observe pid "].iter().any(|w| l.contains(w))
    };
    let said: Vec<String> = observer.lines.try_iter().filter(refusal).collect();
    if let Some(first) = said.first() {
        eprintln!("hvstats-bench: the observer said {} refusals, the first: {first}", said.len());
    }
    said.len()
}

/// One row: a fresh observer of the fleet's first `vms` VMs, measured over the plan's rounds of
/// [`WINDOW`] refreshes.
fn measure(
    plan: &Plan<'_>,
    name: &'static str,
    hvstats: &Path,
    fleet: &Fleet,
    vms: usize,
) -> Result<Row, String> {
    let pids = fleet.pids(vms);
    // On tmpfs, as the unit's runtime directory (/run/hvstats) is: the pages' writeback is not
    // the observer's cost there.
    let dir = crate::authority::TempRuntime::new("scale").map_err(|e| e.to_string())?;
    let mut args = vec!["observe".to_owned(), "--all".into(), "--interval".into(), "1".into()];
    args.extend(pids.iter().flat_map(|p| ["--vm".to_owned(), p.to_string()]));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let observer = Hvstats::start(hvstats, &args, dir.path())?;
    let pid = observer.child.id() as i32;
    let (attached, vcpus) = settle(dir.path(), pids.len());
    let to_publish = started.elapsed().as_secs_f64();
    if attached == 0 {
        return Err(format!("the observer attached none of {} VMs in time", pids.len()));
    }
    // Its first refreshes after the last attach are behind it.
    std::thread::sleep(2 * INTERVAL);
    let rounds = refreshes(plan, name, pid)?;
    let refusals = refusals(&observer);
    let [fds, perf, stats, bpf] = descriptors(pid);
    let rss_mib = status_kib(pid, "VmRSS:").unwrap_or(f64::NAN) / 1024.0;
    let cpu = Spread::of(&rounds.ours).median;
    let threads = vcpus.max(1) as f64;
    if published(dir.path()) != (attached, vcpus) {
        return Err(format!(
            "the observer's VMs changed while measured (from {attached} VMs of {vcpus} vCPUs)"
        ));
    }
    let facts = vec![
        ("vms", attached as f64),
        ("vms_asked", FLEETS[ROWS.iter().position(|n| *n == name).unwrap_or(0)] as f64),
        ("vms_not_observed", (pids.len() - attached) as f64),
        ("refusals_said", refusals as f64),
        ("vcpu_threads", vcpus as f64),
        ("us_per_vm", cpu * 1e6 / attached as f64),
        ("us_per_vcpu_thread", cpu * 1e6 / threads),
        ("rss_mib", rss_mib),
        ("descriptors", fds),
        ("perf_descriptors", perf),
        ("kvm_stats_descriptors", stats),
        ("bpf_descriptors", bpf),
        ("counting_descriptors_per_vcpu_thread", (fds - stats) / threads),
        ("vmm_rss_kib", Spread::of(&fleet.rss_kib).median),
        ("ms_to_publish_per_vm", to_publish * 1e3 / attached as f64),
    ];
    drop(observer);
    let mut facts = facts;
    // What the kernel's part of a refresh costs at least: the observer's cost over it says how
    // much of the rest is ours.
    match Floor::measure(&pids) {
        Ok(floor) => {
            let per_vm = |s: f64| s * 1e6 / attached as f64;
            facts.push(("floor_walk_us_per_vm", per_vm(floor.walk)));
            facts.push(("floor_kvm_stats_us_per_vm", per_vm(floor.stats)));
            facts.push(("floor_us_per_vm", per_vm(floor.walk + floor.stats)));
            facts.push(("us_per_vm_over_floor", cpu / (floor.walk + floor.stats)));
            facts.push(("floor_kvm_stats_pread_us_per_vm", per_vm(floor.preads)));
            if let Some(batched) = floor.batched {
                facts.push(("floor_kvm_stats_io_uring_us_per_vm", per_vm(batched)));
            }
        }
        Err(why) => eprintln!("hvstats-bench: {name}: no floor measured: {why}"),
    }
    Ok(Row::Measured { name, rounds, unit: "s/refresh", goal: Some(0.01), facts })
}

/// The least CPU a refresh of the fleet costs in the kernel, measured in this process over
/// [`WINDOW`] rounds a refresh interval apart (the caches as cold as an observer finds them): one
/// walk of the VMMs' threads as the observer walks them (the listed processes' threads, or where
/// the kernel lacks that, the host's every task; without its check of each VMM's descriptor),
/// and one reading of the data block of every KVM statistics descriptor of the VMs (copied from
/// the VMMs as the observer copies them) as the observer reads them: copied in the kernel in one
/// pass ([`hvstats_host::bpf::stats_copy`]) and out of its array, where the kernel has what that
/// needs, else one `pread` each; in seconds a round. What any observer that gives every vCPU
/// thread's run time and every KVM statistic each refresh pays here, whatever it does with them.
struct Floor {
    walk: f64,
    stats: f64,
    /// The statistics read by one `pread` each.
    preads: f64,
    /// The statistics read through `io_uring` instead ([`batched_reads`]), where it could.
    batched: Option<f64>,
}

impl Floor {
    fn measure(pids: &[i32]) -> Result<Self, String> {
        let mut walker = FloorWalk::open(pids)?;
        let mut stats = Vec::new();
        for &pid in pids {
            stats.extend(kvm_stats_of(pid)?);
        }
        let mut data: Vec<Vec<u64>> = stats.iter().map(|s| vec![0; s.data_words()]).collect();
        let mut copy = KernelCopy::of(&stats);
        let (mut walk, mut read, mut preads) = (0.0, 0.0, 0.0);
        for _ in 0..WINDOW {
            std::thread::sleep(INTERVAL);
            let start = CpuClock::now();
            let walked = walker.walk()?;
            walk += start.elapsed().as_secs_f64();
            if walked == 0 {
                return Err("the task iterator walked no thread".into());
            }
            let start = CpuClock::now();
            for (stats, data) in stats.iter().zip(&mut data) {
                stats.read_into(data).map_err(|e| format!("a KVM statistics descriptor: {e}"))?;
            }
            preads += start.elapsed().as_secs_f64();
            let start = CpuClock::now();
            if let Some(copy) = copy.as_mut() {
                copy.read(&stats, &mut data)?;
            }
            read += start.elapsed().as_secs_f64();
        }
        let rounds = f64::from(WINDOW);
        let batched = batched_reads(&stats, &mut data)
            .map_err(|e| eprintln!("hvstats-bench: no io_uring reads measured: {e}"))
            .ok();
        let stats = if copy.is_some() { read } else { preads } / rounds;
        Ok(Self { walk: walk / rounds, stats, preads: preads / rounds, batched })
    }
}

/// Every statistics descriptor of a floor listed in the kernel's copy of them, each in its slot.
struct KernelCopy(hvstats_host::bpf::stats_copy::StatsCopy, Vec<u32>);

impl KernelCopy {
    /// The copy of every one of `stats`; `None` where the kernel has no such copy, or it does not
    /// take one of them (it is read by `pread` then, as the observer reads it).
    fn of(stats: &[KvmStats]) -> Option<Self> {
        use hvstats_host::bpf::stats_copy::{StatsCopy, StatsOf};
        let mut copy = StatsCopy::open().ok()?;
        let mut slots = Vec::with_capacity(stats.len());
        for s in stats {
            let of = if s.id().contains("vcpu") { StatsOf::Vcpu } else { StatsOf::Vm };
            slots.push(copy.add(s.as_fd(), of, s.data_block().1).ok()??);
        }
        Some(Self(copy, slots))
    }

    /// One run, and every descriptor's data block copied out of it into `data`.
    fn read(&mut self, stats: &[KvmStats], data: &mut [Vec<u64>]) -> Result<(), String> {
        self.0.run().map_err(|e| format!("the kernel's copy of KVM's statistics: {e}"))?;
        for ((slot, stats), data) in self.1.iter().zip(stats).zip(data) {
            if !self.0.copy(*slot, 0..stats.data_words(), data) {
                return Err(format!("the kernel's copy did not copy {}", stats.id()));
            }
        }
        Ok(())
    }
}

/// The walk a [`Floor`] measures, the observer's, of these VMMs' threads.
struct FloorWalk(hvstats_host::bpf::listed_tasks::ObservedTasks, std::collections::BTreeSet<i32>);

impl FloorWalk {
    /// The walk of `pids`' threads, walked once (a listed walk makes its room at its first).
    fn open(pids: &[i32]) -> Result<Self, String> {
        use hvstats_host::bpf::{listed_tasks::ObservedTasks, task_iter};
        let program = task_iter::shared().ok_or("no task iterator")?;
        let walk = ObservedTasks::open(program).map_err(|e| format!("the task iterator: {e}"))?;
        let mut walk = Self(walk, pids.iter().copied().collect());
        walk.walk()?;
        Ok(walk)
    }

    /// Walks once; the threads walked.
    fn walk(&mut self) -> Result<usize, String> {
        let walked = self.0.walk(&self.1).map(|w| w.tasks().count());
        walked.map_err(|e| format!("the task iterator: {e}"))
    }
}

/// The same reads as the floor's `pread`s, made through one `io_uring` (its descriptors
/// registered, one submission a ring's fill), in CPU seconds a round of the whole process: KVM's
/// statistics descriptors cannot be read without blocking as io_uring asks (no `FMODE_NOWAIT`),
/// so each read goes to a kernel worker thread of this process, whose time this counts.
fn batched_reads(stats: &[KvmStats], data: &mut [Vec<u64>]) -> std::io::Result<f64> {
    use io_uring::{IoUring, opcode, types};
    const ENTRIES: u32 = 1024;
    let mut ring = IoUring::new(ENTRIES)?;
    let fds: Vec<i32> = stats.iter().map(|s| s.as_fd().as_raw_fd()).collect();
    ring.submitter().register_files(&fds)?;
    let mut cpu = 0.0;
    for _ in 0..WINDOW {
        std::thread::sleep(INTERVAL);
        let start = process_cpu_now();
        let (mut queued, mut done) = (0, 0);
        while done < stats.len() {
            let mut submission = ring.submission();
            while queued < stats.len() && !submission.is_full() {
                let (at, len) = stats[queued].data_block();
                let buf = &mut data[queued];
                let len = len.min(buf.len() * 8) as u32;
                let read = opcode::Read::new(types::Fixed(queued as u32), buf.as_mut_ptr().cast(), len)
                    .offset(at)
                    .build()
                    .user_data(queued as u64);
                // SAFETY: the buffer outlives the read: every read queued is waited for below
                // before `data` is touched again or dropped.
                unsafe { submission.push(&read) }.map_err(std::io::Error::other)?;
                queued += 1;
            }
            drop(submission);
            ring.submit_and_wait(1)?;
            for completion in ring.completion() {
                if completion.result() < 0 {
                    return Err(std::io::Error::from_raw_os_error(-completion.result()));
                }
                done += 1;
            }
        }
        cpu += process_cpu_now() - start;
    }
    Ok(cpu / f64::from(WINDOW))
}

/// This process's CPU time now, every thread of it, in seconds.
fn process_cpu_now() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_PROCESS_CPUTIME_ID always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Copies of the KVM statistics descriptors (the VM's and each vCPU's) VMM `pid` holds.
fn kvm_stats_of(pid: i32) -> Result<Vec<KvmStats>, String> {
    use hvstats_observe::vm_identity::{copy_fd, pidfd};
    let pidfd = pidfd(pid).map_err(|e| format!("pidfd_open({pid}): {e}"))?;
    let dir = format!("/proc/{pid}/fd");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?.flatten() {
        let target = std::fs::read_link(entry.path()).unwrap_or_default();
        let target = target.to_string_lossy();
        if !(target.starts_with("anon_inode:kvm-vcpu-stats:") || target == "anon_inode:kvm-vm-stats") {
            continue;
        }
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let file = copy_fd(&pidfd, fd).map_err(|e| format!("pidfd_getfd({pid}, {fd}): {e}"))?;
        out.push(KvmStats::parse(file).map_err(|e| format!("{target} of {pid}: {e}"))?);
    }
    Ok(out)
}
