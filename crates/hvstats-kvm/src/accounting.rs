//! Exact accounting of a VP into its stats page.
//!
//! Two kinds of writes reach a VP page:
//! - the run loop's own counts of userspace exits, by class, with the time spent handling each
//!   ([`ExitAccounting`]); only the VP thread writes these, with a plain add;
//! - values the kernel keeps (tracepoint counts, KVM's stats, migrations, thread time), merged into
//!   the page by [`VpSources::merge`]; the VP thread does this at hypercalls and at its end, the
//!   partition's collector on a cadence and the WHv API on demand, serialized by a lock, so every
//!   merge writes values that were exact at that moment.

use std::sync::atomic::{AtomicU64, Ordering};

use hvstats::SharedPage;
use hvstats::whv::VpExtras;
use hvstats_abi::catalog::vp;
use hvstats_abi::page::PAGE_SLOTS;

use crate::cycles;
use crate::sources::kvm_stats::KvmStats;
use crate::sources::perf_sw::Migrations;
use crate::sources::thread_time::{self, ThreadTimes};
use crate::sources::tracepoint::{Tracepoint, VpTracepoints};

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

/// Page slots of the counters the exit path writes, computed at compile time (looking a counter
/// up by id walks the catalog, too slow for every exit).
mod slot {
    use super::vp;
    use hvstats_abi::CounterId;

    const fn of(c: CounterId) -> usize {
        c.slot()
    }
    pub const IO_MESSAGES: usize = of(vp::IO_INTERCEPT_MESSAGES);
    pub const IO_COST: usize = of(vp::IO_INSTRUCTIONS_COST);
    pub const HYPERCALLS: usize = of(vp::HYPERCALLS);
    pub const HYPERCALLS_COST: usize = of(vp::HYPERCALLS_COST);
    pub const OTHER_MESSAGES: usize = of(vp::OTHER_MESSAGES);
    pub const MSR_COST: usize = of(vp::MSR_ACCESSES_COST);
    pub const MEMORY_MESSAGES: usize = of(vp::MEMORY_INTERCEPT_MESSAGES);
    pub const OTHER: usize = of(vp::OTHER_INTERCEPTS);
    pub const OTHER_COST: usize = of(vp::OTHER_INTERCEPTS_COST);
}

fn slots(page: &SharedPage) -> &[AtomicU64; PAGE_SLOTS] {
    // SAFETY: a SharedPage maps PAGE_SIZE bytes, page-aligned, for as long as it lives, and its
    // values are only ever accessed as relaxed atomics (as SharedPage itself does).
    unsafe { &*(page.host_address() as *const [AtomicU64; PAGE_SLOTS]) }
}

fn add(slots: &[AtomicU64; PAGE_SLOTS], slot: usize, delta: u64) {
    let v = &slots[slot];
    v.store(v.load(Ordering::Relaxed).wrapping_add(delta), Ordering::Relaxed);
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
        add(slots(page), slot::HYPERCALLS, 1);
    }

    /// Records one userspace exit of `class` that took `ticks` ([`cycles`]) to handle. Only the VP thread
    /// calls this for its page (single writer: plain loads and stores).
    pub fn record(&mut self, page: &SharedPage, user: &UserExitCounts, class: ExitClass, ticks: u64) {
        if !self.enabled {
            return;
        }
        let s = slots(page);
        let (count, cost, total) = match class {
            ExitClass::Io => {
                add(s, slot::IO_MESSAGES, 1);
                (None, slot::IO_COST, &mut self.io_ticks)
            }
            // Counted when it began (`begin_hypercall`); a hypercall is no I/O intercept message.
            ExitClass::Hypercall => (None, slot::HYPERCALLS_COST, &mut self.hypercall_ticks),
            ExitClass::Msr => {
                UserExitCounts::bump(&user.msr);
                add(s, slot::OTHER_MESSAGES, 1);
                (None, slot::MSR_COST, &mut self.msr_ticks)
            }
            ExitClass::Mmio => {
                add(s, slot::MEMORY_MESSAGES, 1);
                (Some(slot::OTHER), slot::OTHER_COST, &mut self.other_ticks)
            }
            ExitClass::Other => {
                add(s, slot::OTHER_MESSAGES, 1);
                (Some(slot::OTHER), slot::OTHER_COST, &mut self.other_ticks)
            }
        };
        if let Some(count) = count {
            add(s, count, 1);
        }
        *total += ticks;
        s[cost].store(cycles::to_100ns(*total), Ordering::Relaxed);
    }
}

/// The kernel sources of one VP, opened on (or for) its thread.
#[derive(Debug)]
pub struct VpSources {
    tid: libc::pid_t,
    tracepoints: VpTracepoints,
    stats: Option<KvmStats>,
    migrations: Option<Migrations>,
    times: ThreadTimes,
    thread_gone: bool,
    exceptions: u64,
}

impl VpSources {
    /// Opens the sources of thread `tid` running the vCPU whose fd is `vcpu_fd`.
    pub fn open(tid: libc::pid_t, vcpu_fd: std::os::fd::RawFd) -> Self {
        Self {
            tid,
            tracepoints: VpTracepoints::open(tid),
            stats: KvmStats::open(vcpu_fd).ok(),
            migrations: Migrations::open(tid).ok(),
            times: ThreadTimes::default(),
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
        self.stats.as_ref()
    }

    /// Marks the thread as exited: its times stay at the last reading (its tid may be reused).
    pub fn thread_exited(&mut self) {
        self.thread_gone = true;
    }

    /// Reads every source and writes its values into `page`.
    pub fn merge(&mut self, page: &SharedPage, user: &UserExitCounts) -> VpExtras {
        let tp = |t| self.tracepoints.read(t);
        let user_msr = user.msr.load(Ordering::Relaxed);
        let hypercalls = user.hypercalls.load(Ordering::Relaxed);
        // A tracepoint that is unavailable (or unreadable right now) leaves its counter as it is:
        // never a guessed value.
        let from_tracepoints = [
            (vp::CPUID_INSTRUCTIONS, tp(Tracepoint::Cpuid)),
            (vp::MSR_ACCESSES, tp(Tracepoint::Msr).map(|n| n + user_msr)),
            (vp::IO_INSTRUCTIONS, tp(Tracepoint::Pio).map(|n| n.saturating_sub(hypercalls))),
            (vp::CONTROL_REGISTER_ACCESSES, tp(Tracepoint::Cr)),
            (vp::APIC_MMIO_ACCESSES, tp(Tracepoint::ApicMmio)),
            (vp::APIC_TPR_ACCESSES, tp(Tracepoint::ApicTpr)),
            (vp::APIC_EOI_ACCESSES, tp(Tracepoint::ApicEoi)),
            (vp::APIC_IPIS_SENT, tp(Tracepoint::ApicIpi)),
            (vp::APIC_SELF_IPIS_SENT, tp(Tracepoint::ApicSelfIpi)),
        ];
        for (counter, value) in from_tracepoints {
            if let Some(v) = value {
                page.set(counter, v);
            }
        }
        if let Some(n) = tp(Tracepoint::InjException) {
            self.exceptions = n;
        }
        if let Some(snap) = self.stats.as_ref().and_then(|s| s.snapshot().ok()) {
            page.set(vp::PAGE_INVALIDATIONS, snap.raw("invlpg"));
            page.set(vp::HLT_INSTRUCTIONS, snap.raw("halt_exits"));
            page.set(vp::HLT_INSTRUCTIONS_COST, snap.nanoseconds("halt_wait_ns") / 100);
            page.set(vp::EXTERNAL_INTERRUPTS, snap.raw("irq_exits"));
            page.set(vp::PENDING_INTERRUPTS, snap.raw("irq_window_exits"));
            page.set(vp::EMULATED_INSTRUCTIONS, snap.raw("insn_emulation"));
            page.set(vp::PAGE_FAULT_INTERCEPTS, snap.raw("pf_taken"));
            page.set(vp::REFLECTED_GUEST_PAGE_FAULTS, snap.raw("pf_guest"));
            page.set(vp::VIRTUAL_INTERRUPTS, snap.raw("irq_injections"));
        }
        if let Some(m) = self.migrations.as_ref().and_then(|m| m.read().ok()) {
            page.set(vp::LOGICAL_PROCESSOR_MIGRATIONS, m);
        }
        if !self.thread_gone {
            if let Ok(t) = thread_time::read(self.tid) {
                self.times = t;
            }
        }
        page.set(vp::TOTAL_RUN_TIME, self.times.total_100ns);
        page.set(vp::HYPERVISOR_RUN_TIME, self.times.hypervisor_100ns());
        VpExtras { exception_count: self.exceptions }
    }
}
