//! Exact accounting of a VP into its stats page.
//!
//! Two kinds of writes reach a VP page:
//! - the run loop's own counts of userspace exits, by class, with the time spent handling each
//!   ([`ExitAccounting`]); only the VP thread writes these, with a plain add;
//! - values the kernel keeps (tracepoint counts, KVM's stats, migrations, thread time), merged into
//!   the page by [`VpSources`]; the VP thread does this at hypercalls (the intercept counters a
//!   guest can check, [`VpSources::merge_exits`]) and at its end, the partition's collector on a
//!   cadence and the WHv API on demand (everything, [`VpSources::merge`]), serialized by a lock,
//!   so every merge writes values that were exact at that moment.

use std::sync::atomic::{AtomicU64, Ordering};

use hvstats::SharedPage;
use hvstats::sched::{SchedStat, SchedStatFile};
use hvstats::whv::VpExtras;
use hvstats_abi::catalog::{maintained_by, maintained_count};
use hvstats_abi::histogram::{BUCKETS, HISTOGRAM_SLOTS};
use hvstats_abi::source::{PerfSoftwareEvent, Source, SourceKind, ThreadTime};
use hvstats_abi::{Counter, ObjectKind, Presentation, Unit};

use crate::cycles;
use crate::sources::kvm_stats::{KvmStats, Stat};
use crate::sources::perf_sw::Migrations;
use crate::sources::thread_time::{ThreadClock, ThreadTimes};
use crate::sources::tracepoint::{Tracepoint, TracepointCounts, VpTracepoints};

/// What kind of userspace exit the run loop handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitClass {
    /// Port I/O handled by a port handler.
    Io,
    /// A hypercall trapped through a port.
    Hypercall,
    /// An MSR access passed to userspace.
    Msr,
    /// An MMIO access passed to userspace.
    Mmio,
    /// Anything else.
    Other,
}

/// Counts the run loop keeps that a merge needs too (written by the VP thread only).
#[derive(Debug, Default)]
pub struct UserExitCounts {
    /// MSR accesses handled in userspace (KVM's `kvm_msr` does not fire for them).
    pub msr: AtomicU64,
    /// Hypercall port writes (KVM's `kvm_pio` counts them, they are not I/O instructions).
    pub hypercalls: AtomicU64,
}

impl UserExitCounts {
    fn bump(counter: &AtomicU64) {
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// The counters the exit path writes, named by the catalog's run-loop keys at compile time (a
/// run-loop count the catalog no longer names fails the build).
mod counter {
    use hvstats_abi::CounterId;
    use hvstats_abi::source::RunLoopCount as Count;

    pub const IO_MESSAGES: CounterId = Count::IoExits.counter();
    pub const IO_COST: CounterId = Count::IoTime.counter();
    pub const HYPERCALLS: CounterId = Count::Hypercalls.counter();
    pub const HYPERCALLS_COST: CounterId = Count::HypercallsTime.counter();
    pub const OTHER_MESSAGES: CounterId = Count::OtherExits.counter();
    pub const MSR_COST: CounterId = Count::MsrTime.counter();
    pub const MEMORY_MESSAGES: CounterId = Count::MmioExits.counter();
    pub const OTHER: CounterId = Count::OtherIntercepts.counter();
    pub const OTHER_COST: CounterId = Count::OtherInterceptsTime.counter();
    pub const IO_HISTOGRAM: CounterId = Count::IoHistogram.counter();
    pub const HYPERCALLS_HISTOGRAM: CounterId = Count::HypercallsHistogram.counter();
    pub const MSR_HISTOGRAM: CounterId = Count::MsrHistogram.counter();
    pub const MMIO_HISTOGRAM: CounterId = Count::MmioHistogram.counter();
    pub const OTHER_HISTOGRAM: CounterId = Count::OtherHistogram.counter();
}

/// The run loop's accounting of userspace exits into the VP page.
#[derive(Debug)]
pub struct ExitAccounting {
    enabled: bool,
    io_ticks: u64,
    msr_ticks: u64,
    other_ticks: u64,
    hypercall_ticks: u64,
}

impl ExitAccounting {
    /// Accounting that writes (`enabled`) or does nothing (for measuring its cost).
    pub fn new(enabled: bool) -> Self {
        if enabled {
            cycles::calibrate();
        }
        Self { enabled, io_ticks: 0, msr_ticks: 0, other_ticks: 0, hypercall_ticks: 0 }
    }

    /// True when exits are accounted.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Counts a hypercall as it begins, before the VP's page is refreshed for it, so the caller
    /// sees its own call in the page; its time is added when it ends, by [`record`](Self::record).
    pub fn begin_hypercall(&mut self, page: &SharedPage, user: &UserExitCounts) {
        if !self.enabled {
            return;
        }
        UserExitCounts::bump(&user.hypercalls);
        page.add(counter::HYPERCALLS, 1);
    }

    /// Records one userspace exit of `class` that took `ticks` ([`cycles`]) to handle: its count,
    /// its class's cumulative time and a bucket of its class's histogram. Only the VP thread calls
    /// this for its page (single writer: plain loads and stores).
    pub fn record(&mut self, page: &SharedPage, user: &UserExitCounts, class: ExitClass, ticks: u64) {
        if !self.enabled {
            return;
        }
        let (count, cost, total, histogram) = match class {
            ExitClass::Io => {
                (Some(counter::IO_MESSAGES), counter::IO_COST, &mut self.io_ticks, counter::IO_HISTOGRAM)
            }
            // Counted when it began (`begin_hypercall`); a hypercall is no I/O intercept message.
            ExitClass::Hypercall => {
                (None, counter::HYPERCALLS_COST, &mut self.hypercall_ticks, counter::HYPERCALLS_HISTOGRAM)
            }
            ExitClass::Msr => {
                UserExitCounts::bump(&user.msr);
                (
                    Some(counter::OTHER_MESSAGES),
                    counter::MSR_COST,
                    &mut self.msr_ticks,
                    counter::MSR_HISTOGRAM,
                )
            }
            ExitClass::Mmio => {
                page.add(counter::MEMORY_MESSAGES, 1);
                (Some(counter::OTHER), counter::OTHER_COST, &mut self.other_ticks, counter::MMIO_HISTOGRAM)
            }
            ExitClass::Other => {
                page.add(counter::OTHER_MESSAGES, 1);
                (Some(counter::OTHER), counter::OTHER_COST, &mut self.other_ticks, counter::OTHER_HISTOGRAM)
            }
        };
        // The histogram: its sum and one bucket, two more plain loads and stores.
        page.record_time(histogram, cycles::to_ns(ticks));
        if let Some(count) = count {
            page.add(count, 1);
        }
        *total += ticks;
        page.set(cost, cycles::to_100ns(*total));
    }
}

/// The VP counters kept from the vCPU's KVM statistics: the catalog's `KvmStats(Vcpu(..))` rows,
/// each the sum of the statistics its key names.
///
/// HLT time is the whole time halted: KVM first polls for a wake-up (`halt_poll_success_ns` when
/// one came, `halt_poll_fail_ns` when it gave up), then blocks (`halt_wait_ns`); a halt ended by
/// polling never shows in `halt_wait_ns` alone.
const FROM_KVM_STATS: [&Counter; maintained_count(ObjectKind::Vp, SourceKind::KvmStats)] =
    maintained_by(ObjectKind::Vp, SourceKind::KvmStats);

/// The VP counters kept from tracepoint counts: the catalog's `Tracepoint(..)` rows.
const FROM_TRACEPOINTS: [&Counter; maintained_count(ObjectKind::Vp, SourceKind::Tracepoint)] =
    maintained_by(ObjectKind::Vp, SourceKind::Tracepoint);

/// The VP counters kept from the thread's clocks and perf software events.
const FROM_THREAD: [&Counter;
    maintained_count(ObjectKind::Vp, SourceKind::ThreadTime)
        + maintained_count(ObjectKind::Vp, SourceKind::PerfSoftware)] = {
    const T: usize = maintained_count(ObjectKind::Vp, SourceKind::ThreadTime);
    const P: usize = maintained_count(ObjectKind::Vp, SourceKind::PerfSoftware);
    let times: [&Counter; T] = maintained_by(ObjectKind::Vp, SourceKind::ThreadTime);
    let perf: [&Counter; P] = maintained_by(ObjectKind::Vp, SourceKind::PerfSoftware);
    let mut out = [&hvstats_abi::CATALOG[0]; T + P];
    let mut i = 0;
    while i < T + P {
        out[i] = if i < T { times[i] } else { perf[i - T] };
        i += 1;
    }
    out
};

/// The statistics a KVM-stats counter sums (none for a counter of another source).
pub(crate) fn kvm_stat_names(counter: &Counter) -> &'static [&'static str] {
    match counter.maintained.source() {
        Some(Source::KvmStats(key)) => key.names(),
        _ => &[],
    }
}

/// A counter's value from the sum of its statistics: nanoseconds converted to its time unit,
/// raw counts otherwise.
fn stat_value(counter: &Counter, stats: &[Stat], data: &[u64]) -> u64 {
    match counter.unit {
        Unit::Time100ns => stats.iter().map(|s| s.nanoseconds(data)).sum::<u64>() / 100,
        Unit::Nanoseconds => stats.iter().map(|s| s.nanoseconds(data)).sum(),
        _ => stats.iter().map(|s| s.raw(data)).sum(),
    }
}

/// Copies one of KVM's log2 histograms into `page`: the sum from its `_ns` statistic, the buckets
/// from its `_hist` statistic, whose bucketing (`fls64` of the nanoseconds, capped at the last
/// bucket) is the page's own. `stats` are the two, in that order; nothing is written without both.
fn write_kvm_histogram(page: &SharedPage, counter: &Counter, stats: &[Stat], data: &[u64]) {
    let [sum, buckets] = stats else { return };
    let slots = page.histogram_slots(counter.id);
    slots[0].store(sum.nanoseconds(data), Ordering::Relaxed);
    let values = buckets.values(data);
    for (slot, &v) in slots[1..].iter().zip(values.iter().take(BUCKETS)) {
        slot.store(v, Ordering::Relaxed);
    }
    // A kernel with more buckets than the page: the excess belongs in the last, open bucket.
    if values.len() > BUCKETS {
        let rest: u64 = values[BUCKETS..].iter().fold(0, |a, &v| a.wrapping_add(v));
        let last = &slots[HISTOGRAM_SLOTS - 1];
        last.store(values[BUCKETS - 1].wrapping_add(rest), Ordering::Relaxed);
    }
}

/// Writes a tracepoint reading into `page`: each tracepoint counter gets its count, with the
/// userspace part KVM's tracepoint does not see (MSR exits) added and the part it counts as
/// something else (hypercall port writes, which `kvm_pio` sees) taken off. A tracepoint that is
/// unavailable (or unreadable right now) leaves its counter as it is: never a guessed value.
pub(crate) fn write_tracepoint_counts(page: &SharedPage, counts: &TracepointCounts, user: &UserExitCounts) {
    let user_msr = user.msr.load(Ordering::Relaxed);
    let hypercalls = user.hypercalls.load(Ordering::Relaxed);
    for counter in FROM_TRACEPOINTS {
        let Some(Source::Tracepoint(tp)) = counter.maintained.source() else { continue };
        let Some(n) = counts[tp.index()] else { continue };
        // By xAPIC MMIO, plus by x2APIC MSR.
        let n = n + tp.added().iter().map(|a| counts[a.index()].unwrap_or(0)).sum::<u64>();
        let value = match tp {
            Tracepoint::Msr => n + user_msr,
            Tracepoint::Pio => n.saturating_sub(hypercalls),
            _ => n,
        };
        page.set(counter.id, value);
    }
}

/// Writes the thread's times (written together: Hypervisor run time = total less guest time of
/// the same reading), its CPU wait and dispatches (one schedstat reading) and its migrations,
/// when read, into `page`.
pub(crate) fn write_thread_counts(
    page: &SharedPage,
    times: ThreadTimes,
    sched: Option<SchedStat>,
    migrated: Option<u64>,
) {
    for counter in FROM_THREAD {
        let value = match counter.maintained.source() {
            Some(Source::ThreadTime(ThreadTime::Total)) => Some(times.total_100ns),
            Some(Source::ThreadTime(ThreadTime::Hypervisor)) => Some(times.hypervisor_100ns()),
            Some(Source::ThreadTime(ThreadTime::CpuWait)) => sched.map(|s| s.wait_ns),
            Some(Source::ThreadTime(ThreadTime::Dispatches)) => sched.map(|s| s.dispatches),
            Some(Source::PerfSoftware(PerfSoftwareEvent::CpuMigrations)) => migrated,
            _ => None,
        };
        if let Some(v) = value {
            page.set(counter.id, v);
        }
    }
}

/// A vCPU's KVM statistics with the ones hvstats keeps looked up once, and a buffer for the data
/// block, so a refresh is one `pread` and a few indexed loads.
#[derive(Debug)]
pub(crate) struct VcpuStats {
    stats: KvmStats,
    /// By [`FROM_KVM_STATS`] row, the statistics the kernel has (one it lacks adds nothing).
    lookups: [Vec<Stat>; FROM_KVM_STATS.len()],
    data: Vec<u64>,
}

impl VcpuStats {
    pub(crate) fn new(stats: KvmStats) -> Self {
        let lookups = FROM_KVM_STATS.map(|c| {
            let found: Vec<Stat> = kvm_stat_names(c).iter().filter_map(|n| stats.stat(n)).collect();
            // A histogram needs both of its statistics, the sum and the buckets, in that order.
            let whole = c.presentation != Presentation::Histogram || found.len() == 2;
            if whole { found } else { Vec::new() }
        });
        let data = vec![0; stats.data_words()];
        Self { stats, lookups, data }
    }

    /// Reads the statistics and writes their counters; leaves them as they are when the read fails.
    pub(crate) fn merge(&mut self, page: &SharedPage) {
        if self.stats.read_into(&mut self.data).is_err() {
            return;
        }
        for (counter, stats) in FROM_KVM_STATS.iter().zip(&self.lookups) {
            if counter.presentation == Presentation::Histogram {
                write_kvm_histogram(page, counter, stats, &self.data);
            } else {
                page.set(counter.id, stat_value(counter, stats, &self.data));
            }
        }
    }
}

/// The kernel sources of one VP, opened on (or for) its thread.
///
/// A merge has two parts. The *exit* part ([`merge_exits`](Self::merge_exits)) reads what a guest
/// can see change from one instruction to the next: the intercepts KVM handles in the kernel
/// (tracepoints, one group read) and KVM's statistics (one `pread`). The *time* part reads the
/// thread's CPU and guest time and its migrations, which change whenever the thread runs. The VP
/// thread refreshes its own page at every hypercall with the exit part only; every other caller
/// (the collector, the WHv API) and the end of the VP merge both ([`merge`](Self::merge)). Which
/// one runs is the caller's choice, made where it calls (see `vp::Refresh`). Either way every value written is exact at the moment it is written: the
/// times are written together (Hypervisor run time = total less guest time of the same reading),
/// never one updated without the other.
#[derive(Debug)]
pub struct VpSources {
    tracepoints: VpTracepoints,
    stats: Option<VcpuStats>,
    migrations: Option<Migrations>,
    migrated: Option<u64>,
    clock: Option<ThreadClock>,
    times: ThreadTimes,
    sched: Option<SchedStatFile>,
    sched_stat: Option<SchedStat>,
    thread_gone: bool,
    exceptions: u64,
}

impl VpSources {
    /// Opens the sources of thread `tid` running the vCPU whose fd is `vcpu_fd`.
    pub fn open(tid: libc::pid_t, vcpu_fd: std::os::fd::RawFd) -> Self {
        Self {
            tracepoints: VpTracepoints::open(tid),
            stats: KvmStats::open(vcpu_fd).ok().map(VcpuStats::new),
            migrations: Migrations::open(tid).ok(),
            migrated: None,
            clock: ThreadClock::open(tid).ok(),
            times: ThreadTimes::default(),
            sched: SchedStatFile::open(std::process::id() as libc::pid_t, tid).ok(),
            sched_stat: None,
            thread_gone: false,
            exceptions: 0,
        }
    }

    /// The tracepoint counters (to tell which are unavailable).
    pub fn tracepoints(&self) -> &VpTracepoints {
        &self.tracepoints
    }

    /// The vCPU's KVM stats, when the kernel has them.
    pub fn kvm_stats(&self) -> Option<&KvmStats> {
        self.stats.as_ref().map(|s| &s.stats)
    }

    /// Called on the VP's own thread as it ends: takes the thread's last times, so the next
    /// merge writes its final times, and keeps them from then on (its tid may be reused).
    pub fn thread_exiting(&mut self) {
        if !self.thread_gone {
            self.read_times();
        }
        self.thread_gone = true;
    }

    /// Reads every source and writes its values into `page`, inside one sequence-counter window
    /// (readers get all of it or none of it).
    pub fn merge(&mut self, page: &SharedPage, user: &UserExitCounts) -> VpExtras {
        let _merge = page.begin_merge();
        let extras = self.write_exits(page, user);
        if !self.thread_gone {
            self.read_times();
        }
        write_thread_counts(page, self.times, self.sched_stat, self.migrated);
        extras
    }

    /// The thread's CPU and guest time and its migrations, kept for the next write.
    fn read_times(&mut self) {
        if let Some(t) = self.clock.as_ref().and_then(|c| c.read().ok()) {
            self.times = t;
        }
        if let Some(m) = self.migrations.as_ref().and_then(|m| m.read().ok()) {
            self.migrated = Some(m);
        }
        if let Some(s) = self.sched.as_ref().and_then(|s| s.read().ok()) {
            self.sched_stat = Some(s);
        }
    }

    /// Reads the intercept sources (tracepoints and KVM statistics) and writes their counters
    /// into `page`: every counter a guest can see change because of what it executed.
    pub fn merge_exits(&mut self, page: &SharedPage, user: &UserExitCounts) -> VpExtras {
        let _merge = page.begin_merge();
        self.write_exits(page, user)
    }

    /// The exit part of a merge, inside the caller's sequence-counter window.
    fn write_exits(&mut self, page: &SharedPage, user: &UserExitCounts) -> VpExtras {
        let counts = self.tracepoints.read_all();
        write_tracepoint_counts(page, &counts, user);
        if let Some(n) = counts[Tracepoint::InjException.index()] {
            self.exceptions = n;
        }
        if let Some(stats) = self.stats.as_mut() {
            stats.merge(page);
        }
        VpExtras { exception_count: self.exceptions }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvstats_abi::ObjectKind;
    use hvstats_abi::catalog::vp;

    /// A vCPU (never run) whose sources are opened for the calling thread, as the VP thread does.
    fn vcpu() -> Option<(kvm_ioctls::VmFd, kvm_ioctls::VcpuFd)> {
        let Ok(kvm) = kvm_ioctls::Kvm::new() else {
            assert!(
                std::env::var("HVSTATS_REQUIRE_KVM").as_deref() != Ok("1"),
                "/dev/kvm is required (HVSTATS_REQUIRE_KVM=1)"
            );
            eprintln!("skipping: /dev/kvm is not available");
            return None;
        };
        let vm = kvm.create_vm().unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        Some((vm, vcpu))
    }

    #[test]
    fn the_vp_thread_refreshes_intercepts_and_leaves_times_to_full_merges() {
        use std::os::fd::AsRawFd;
        let Some((_vm, vcpu)) = vcpu() else { return };
        let mut sources = VpSources::open(crate::sources::thread_time::gettid(), vcpu.as_raw_fd());
        let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
        let user = UserExitCounts::default();
        user.msr.store(3, Ordering::Relaxed);
        sources.merge_exits(&page, &user);
        if sources.tracepoints().unavailable(Tracepoint::Msr).is_none() {
            // The vCPU never ran: KVM handled no MSR access, the run loop three.
            assert_eq!(page.get(vp::MSR_ACCESSES), 3);
        }
        assert_eq!(page.get(vp::TOTAL_RUN_TIME), 0, "times are not read on the VP thread's exit path");
        sources.merge(&page, &user);
        let total = page.get(vp::TOTAL_RUN_TIME);
        assert!(total > 0);
        assert!(page.get(vp::HYPERVISOR_RUN_TIME) <= total);
        // Ending on its own thread takes the final reading; later merges keep it.
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(3) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        sources.thread_exiting();
        sources.merge(&page, &user);
        let last = page.get(vp::TOTAL_RUN_TIME);
        assert!(last > total, "a merge after the thread ended writes its final times");
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(3) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        sources.merge(&page, &user);
        assert_eq!(page.get(vp::TOTAL_RUN_TIME), last, "the final times are kept");
    }

    #[test]
    fn the_whole_tracepoint_group_reads_as_each_counter_does() {
        let mut tps = VpTracepoints::open(crate::sources::thread_time::gettid());
        if let Some(why) = tps.unavailable(Tracepoint::Cpuid) {
            eprintln!("skipping: {why}");
            return;
        }
        let all = tps.read_all();
        for tp in Tracepoint::ALL {
            match tps.unavailable(tp) {
                None if tp.counted_for_partitions() => {
                    assert_eq!(all[tp.index()], Some(0), "{tp:?}: this thread runs no guest")
                }
                _ => assert_eq!(all[tp.index()], None, "{tp:?}"),
            }
            assert_eq!(tps.read(tp), all[tp.index()]);
        }
    }

    /// Each userspace exit class lands in its own histogram and count, whatever workload a KVM
    /// host can produce (with the in-kernel irqchip no exit of a full run is of class Other).
    #[test]
    fn each_exit_class_is_counted_in_its_own_histogram() {
        use std::sync::atomic::Ordering;
        let mut accounting = ExitAccounting::new(true);
        let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
        let user = UserExitCounts::default();
        let count = |counter| {
            let slots = page.histogram_slots(counter).each_ref().map(|s| s.load(Ordering::Relaxed));
            hvstats_abi::histogram::Log2Histogram::from_slots(&slots).map(|h| h.count())
        };
        accounting.record(&page, &user, ExitClass::Other, 1_000);
        accounting.record(&page, &user, ExitClass::Other, 2_000);
        accounting.record(&page, &user, ExitClass::Mmio, 1_000);
        assert_eq!(count(vp::OTHER_TIME_HISTOGRAM), Some(2));
        assert_eq!(count(vp::MEMORY_TIME_HISTOGRAM), Some(1));
        assert_eq!(count(vp::IO_TIME_HISTOGRAM), Some(0));
        assert_eq!(page.get(vp::MEMORY_INTERCEPT_MESSAGES), 1);
        assert_eq!(page.get(vp::OTHER_INTERCEPTS), 3, "MMIO exits are other intercepts too");
        assert!(page.get(vp::OTHER_INTERCEPTS_COST) > 0);
    }
}
