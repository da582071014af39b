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

use hvstats::SharedPage;
use hvstats::whv::VpExtras;
use hvstats_abi::CounterId;

use crate::cycles;
use hvstats_sources::counter_source::{Composition, Object, Part, VpSource, VpThread};
use hvstats_sources::open_all;
use hvstats_sources::user_exits::UserExitCounts;

/// A userspace exit the run loop handled, by the counters it is accounted under. Not an
/// intercept class ([`hvstats_abi::exit_reason::InterceptClass`], what a VM exit was for): a
/// hypercall trapped through a port is a class of its own here though its VM exit was port I/O,
/// and the exits KVM handles itself never reach the run loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserExit {
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
    #[inline]
    pub fn record(&mut self, page: &SharedPage, user: &UserExitCounts, class: UserExit, ticks: u64) {
        if !self.enabled {
            return;
        }
        // Each arm names its counters as constants, so their places in the page are known when
        // this is compiled, not looked up in the layout at every exit.
        match class {
            UserExit::Io => {
                page.add(counter::IO_MESSAGES, 1);
                account(page, counter::IO_COST, &mut self.io_ticks, counter::IO_HISTOGRAM, ticks);
            }
            // Counted when it began (`begin_hypercall`); a hypercall is no I/O intercept message.
            UserExit::Hypercall => account(
                page,
                counter::HYPERCALLS_COST,
                &mut self.hypercall_ticks,
                counter::HYPERCALLS_HISTOGRAM,
                ticks,
            ),
            UserExit::Msr => {
                UserExitCounts::bump(&user.msr);
                page.add(counter::OTHER_MESSAGES, 1);
                account(page, counter::MSR_COST, &mut self.msr_ticks, counter::MSR_HISTOGRAM, ticks);
            }
            UserExit::Mmio => {
                page.add(counter::MEMORY_MESSAGES, 1);
                page.add(counter::OTHER, 1);
                account(page, counter::OTHER_COST, &mut self.other_ticks, counter::MMIO_HISTOGRAM, ticks);
            }
            UserExit::Other => {
                page.add(counter::OTHER_MESSAGES, 1);
                page.add(counter::OTHER, 1);
                account(page, counter::OTHER_COST, &mut self.other_ticks, counter::OTHER_HISTOGRAM, ticks);
            }
        }
    }
}

/// Adds `ticks` to a class's time: its histogram (the sum and one bucket, two plain loads and
/// stores) and its cumulative cost, kept in ticks in `total` and written in 100 ns units.
#[inline(always)]
fn account(page: &SharedPage, cost: CounterId, total: &mut u64, histogram: CounterId, ticks: u64) {
    page.record_time(histogram, cycles::to_ns(ticks));
    *total += ticks;
    page.set(cost, cycles::to_100ns(*total));
}

/// The kernel sources of one VP, opened on (or for) its thread: the list
/// [`open_all`](hvstats_sources::open_all) makes.
///
/// A merge has two parts. The *exit* part ([`merge_exits`](Self::merge_exits)) reads what a guest
/// can see change from one instruction to the next: the intercepts KVM handles in the kernel
/// (tracepoints, one group read) and KVM's statistics (one `pread`). The *time* part reads the
/// thread's CPU and guest time and its migrations, which change whenever the thread runs. The VP
/// thread refreshes its own page at every hypercall with the exit part only; every other caller
/// (the collector, the WHv API) and the end of the VP merge both ([`merge`](Self::merge)). Which
/// one runs is the caller's choice, made where it calls (see `vp::Refresh`). Either way every
/// value written is exact at the moment it is written: the times are written together
/// (Hypervisor run time = total less guest time of the same reading), never one updated without
/// the other.
#[derive(Debug)]
pub struct VpSources {
    sources: Composition<dyn VpSource>,
    index: u32,
}

impl VpSources {
    /// Opens the sources of `vp`, whose VP has index `index`.
    pub fn open(vp: &VpThread, index: u32) -> Self {
        Self { sources: open_all(vp), index }
    }

    /// Why some counters cannot be kept (a source the host lacks in part), said for a person.
    pub fn unavailable(&self) -> Vec<String> {
        self.sources.sources().iter().flat_map(|s| s.unavailable()).collect()
    }

    /// The VP counters some source gives.
    pub fn given(&self) -> &hvstats_abi::counter_set::CounterSet {
        &self.sources.given().vp
    }

    /// The vCPU's KVM statistic `name`, when a source reads the vCPU's statistics.
    pub fn kvm_stat(&self, name: &str) -> Option<u64> {
        self.sources.sources().iter().find_map(|s| s.kvm_stat(name))
    }

    /// Called on the VP's own thread as it ends: each source takes the reading a later merge
    /// should keep (the thread's last times).
    pub(crate) fn thread_exiting(&mut self) {
        self.sources.sources_mut().for_each(|s| s.thread_exiting());
    }

    /// Reads every source and writes its values into `page`, inside one sequence-counter window
    /// (readers get all of it or none of it).
    pub fn merge(&mut self, page: &SharedPage) -> VpExtras {
        self.merge_parts(page, &[Part::Exits, Part::Times])
    }

    /// Reads the intercept sources (tracepoints and KVM statistics) and writes their counters
    /// into `page`: every counter a guest can see change because of what it executed.
    pub fn merge_exits(&mut self, page: &SharedPage) -> VpExtras {
        self.merge_parts(page, &[Part::Exits])
    }

    fn merge_parts(&mut self, page: &SharedPage, parts: &[Part]) -> VpExtras {
        // Only a merge of every part is a publication: the intercepts merged alone at a
        // hypercall would date the times of an earlier merge as taken now.
        let _merge = match parts.contains(&Part::Times) {
            true => page.begin_publication(),
            false => page.begin_merge(),
        };
        let mut extras = VpExtras::default();
        for source in self.sources.sources_mut().filter(|s| parts.contains(&s.part())) {
            source.read();
        }
        self.sources.write(Object::Vp(self.index), page, |s| parts.contains(&s.part()));
        self.sources.sources().iter().for_each(|s| s.extras(&mut extras));
        extras
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvstats_abi::ObjectKind;
    use hvstats_abi::catalog::vp;
    use hvstats_sources::tracepoint::{Tracepoint, VpTracepoints};

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
        let user = std::sync::Arc::new(UserExitCounts::default());
        let thread = VpThread {
            tid: hvstats_sources::thread_time::gettid(),
            vcpu_fd: vcpu.as_raw_fd(),
            user: user.clone(),
        };
        let mut sources = VpSources::open(&thread, 0);
        let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
        user.msr.store(3, std::sync::atomic::Ordering::Relaxed);
        sources.merge_exits(&page);
        let msr_counted = VpTracepoints::open(hvstats_sources::thread_time::gettid())
            .unavailable(Tracepoint::Msr)
            .is_none();
        if msr_counted {
            // The vCPU never ran: KVM handled no MSR access, the run loop three.
            assert_eq!(page.get(vp::MSR_ACCESSES), 3);
        }
        assert_eq!(page.get(vp::TOTAL_RUN_TIME), 0, "times are not read on the VP thread's exit path");
        sources.merge(&page);
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
        sources.merge(&page);
        let last = page.get(vp::TOTAL_RUN_TIME);
        assert!(last > total, "a merge after the thread ended writes its final times");
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(3) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        sources.merge(&page);
        assert_eq!(page.get(vp::TOTAL_RUN_TIME), last, "the final times are kept");
    }

    #[test]
    fn the_whole_tracepoint_group_reads_as_each_counter_does() {
        let mut tps = VpTracepoints::open(hvstats_sources::thread_time::gettid());
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
        accounting.record(&page, &user, UserExit::Other, 1_000);
        accounting.record(&page, &user, UserExit::Other, 2_000);
        accounting.record(&page, &user, UserExit::Mmio, 1_000);
        assert_eq!(count(vp::OTHER_TIME_HISTOGRAM), Some(2));
        assert_eq!(count(vp::MEMORY_TIME_HISTOGRAM), Some(1));
        assert_eq!(count(vp::IO_TIME_HISTOGRAM), Some(0));
        assert_eq!(page.get(vp::MEMORY_INTERCEPT_MESSAGES), 1);
        assert_eq!(page.get(vp::OTHER_INTERCEPTS), 3, "MMIO exits are other intercepts too");
        assert!(page.get(vp::OTHER_INTERCEPTS_COST) > 0);
    }
}
