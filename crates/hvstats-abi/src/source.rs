//! Where a counter's value comes from on KVM, as typed keys.
//!
//! The catalog marks each maintained counter with a [`Source`] that names exactly what feeds it: a
//! KVM statistic, a KVM tracepoint, a run-loop count, a hypercall class, a thread clock. The KVM
//! backend builds its tables (the statistics it reads per vCPU, the tracepoints it opens, the page
//! slot of each run-loop count, the counter of each hypercall class) from these keys with the
//! functions below, so the catalog is the only place a counter's source is written down, and a
//! test can check the backend against it.
//!
//! The same keys say how the observer maintains a counter for a VM hvstats did not start
//! ([`observed`]): the row's own key where the observer can read it from outside the VMM, an
//! observed-only key written in the row where it differs, and "not available" (with why) where
//! nothing outside the VMM gives the counter.

use crate::catalog::{CATALOG, Counter, CounterId, Maintained, Presentation, Unit};
use crate::exit_reason::InterceptClass;
use crate::hypercall::HypercallClass;
use crate::object::ObjectKind;

/// Where the KVM backend gets a counter's value from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The statistics authority itself (object counts, GPA map bookkeeping).
    Authority,
    /// The VP run loop: userspace exits, counted with their time.
    RunLoop(RunLoopCount),
    /// The userspace hypercall handler: hypercalls of one class.
    Hypercall(HypercallClass),
    /// KVM's binary stats fd (per vCPU or per VM).
    KvmStats(KvmStat),
    /// A perf tracepoint counter on the VP thread (`kvm:*`).
    Tracepoint(Tracepoint),
    /// A perf software event on the VP thread.
    PerfSoftware(PerfSoftwareEvent),
    /// The VP thread's CPU and guest time (`/proc/<pid>/task/<tid>/stat`, schedstat).
    ThreadTime(ThreadTime),
    /// Host-wide procfs and sysfs (`/proc/stat`, `/proc/interrupts`, cpuidle).
    Procfs,
    /// `kvm:kvm_exit` filtered by the exit reasons of an intercept class (VMX/SVM hosts only, see
    /// [`crate::exit_reason`]); observed VMs only.
    KvmExit(InterceptClass),
}

/// The kind of a [`Source`], without its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SourceKind {
    /// [`Source::Authority`].
    Authority,
    /// [`Source::RunLoop`].
    RunLoop,
    /// [`Source::Hypercall`].
    Hypercall,
    /// [`Source::KvmStats`].
    KvmStats,
    /// [`Source::Tracepoint`].
    Tracepoint,
    /// [`Source::PerfSoftware`].
    PerfSoftware,
    /// [`Source::ThreadTime`].
    ThreadTime,
    /// [`Source::Procfs`].
    Procfs,
    /// [`Source::KvmExit`].
    KvmExit,
}

impl Source {
    /// Short name for tables and JSON (`kvm_userspace_exit` tracepoints are `userspace-exit`).
    pub const fn name(self) -> &'static str {
        if let Source::Tracepoint(tp) = self
            && tp.is_userspace_exit()
        {
            return "userspace-exit";
        }
        match self.kind() {
            SourceKind::Authority => "authority",
            SourceKind::RunLoop => "run-loop",
            SourceKind::Hypercall => "hypercall",
            SourceKind::KvmStats => "kvm-stats",
            SourceKind::Tracepoint => "tracepoint",
            SourceKind::PerfSoftware => "perf-software",
            SourceKind::ThreadTime => "thread-time",
            SourceKind::Procfs => "procfs",
            SourceKind::KvmExit => "kvm-exit",
        }
    }

    /// The kind of source, without its key.
    pub const fn kind(self) -> SourceKind {
        match self {
            Source::Authority => SourceKind::Authority,
            Source::RunLoop(_) => SourceKind::RunLoop,
            Source::Hypercall(_) => SourceKind::Hypercall,
            Source::KvmStats(_) => SourceKind::KvmStats,
            Source::Tracepoint(_) => SourceKind::Tracepoint,
            Source::PerfSoftware(_) => SourceKind::PerfSoftware,
            Source::ThreadTime(_) => SourceKind::ThreadTime,
            Source::Procfs => SourceKind::Procfs,
            Source::KvmExit(_) => SourceKind::KvmExit,
        }
    }
}

/// A count the VP run loop keeps in the page itself (single writer: the VP thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunLoopCount {
    /// Writes to a hypercall port.
    Hypercalls,
    /// Time handling them.
    HypercallsTime,
    /// Port I/O exits handled in userspace.
    IoExits,
    /// Time handling them.
    IoTime,
    /// MMIO exits handled in userspace.
    MmioExits,
    /// Userspace exits other than port I/O, MMIO and hypercalls.
    OtherExits,
    /// Time handling MSR exits.
    MsrTime,
    /// Userspace exits other than port I/O, MSR and hypercalls.
    OtherIntercepts,
    /// Time handling them.
    OtherInterceptsTime,
    /// Log2 histogram of the time handling hypercalls.
    HypercallsHistogram,
    /// Log2 histogram of the time handling port I/O exits.
    IoHistogram,
    /// Log2 histogram of the time handling MSR exits.
    MsrHistogram,
    /// Log2 histogram of the time handling MMIO exits.
    MmioHistogram,
    /// Log2 histogram of the time handling other userspace exits.
    OtherHistogram,
}

impl RunLoopCount {
    /// Every run-loop count.
    pub const ALL: [RunLoopCount; 14] = [
        RunLoopCount::Hypercalls,
        RunLoopCount::HypercallsTime,
        RunLoopCount::IoExits,
        RunLoopCount::IoTime,
        RunLoopCount::MmioExits,
        RunLoopCount::OtherExits,
        RunLoopCount::MsrTime,
        RunLoopCount::OtherIntercepts,
        RunLoopCount::OtherInterceptsTime,
        RunLoopCount::HypercallsHistogram,
        RunLoopCount::IoHistogram,
        RunLoopCount::MsrHistogram,
        RunLoopCount::MmioHistogram,
        RunLoopCount::OtherHistogram,
    ];

    /// The counter the catalog gives this count.
    ///
    /// # Panics
    /// When no catalog row is maintained by it; in a constant (as the run loop uses it) that is a
    /// compile error, so a run-loop count cannot lose its counter unnoticed.
    pub const fn counter(self) -> CounterId {
        let mut i = 0;
        while i < CATALOG.len() {
            if let Some(Source::RunLoop(k)) = CATALOG[i].maintained.source()
                && k as u8 == self as u8
            {
                return CATALOG[i].id;
            }
            i += 1;
        }
        panic!("a run-loop count without a catalog row")
    }
}

/// KVM binary statistics (`KVM_GET_STATS_FD`) by the kernel's names, summed into one counter (a
/// time counter converts their nanoseconds to its unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvmStat {
    /// Statistics of the VP's vCPU.
    Vcpu(&'static [&'static str]),
    /// Statistics of the partition's VM.
    Vm(&'static [&'static str]),
}

impl KvmStat {
    /// The statistics summed into the counter.
    pub const fn names(self) -> &'static [&'static str] {
        match self {
            KvmStat::Vcpu(names) | KvmStat::Vm(names) => names,
        }
    }
}

/// KVM tracepoints counted per VP thread (the event names under `events/kvm/` of tracefs; some
/// are counted twice, with a filter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tracepoint {
    /// `kvm_cpuid`: CPUID handled in the kernel.
    Cpuid,
    /// `kvm_msr`: RDMSR/WRMSR handled in the kernel.
    Msr,
    /// `kvm_pio`: every port access (in the kernel or passed to userspace).
    Pio,
    /// `kvm_cr`: control register accesses.
    Cr,
    /// `kvm_mmio` filtered on the local APIC page: guest accesses to APIC registers. (`kvm_apic`
    /// would also count EOIs some KVM backends perform themselves when injecting an interrupt.)
    ApicMmio,
    /// `kvm_mmio` filtered on the APIC TPR register.
    ApicTpr,
    /// `kvm_mmio` filtered on writes of the APIC EOI register.
    ApicEoi,
    /// `kvm_apic_ipi`: IPIs sent.
    ApicIpi,
    /// `kvm_apic_ipi` filtered on the "self" destination shorthand.
    ApicSelfIpi,
    /// `kvm_inj_exception`: exceptions injected (the WHv exception count; no page counter).
    InjException,
    /// `kvm_msr` filtered on x2APIC MSR 0x808, the TPR: TPR accesses by x2APIC, added to
    /// [`Tracepoint::ApicTpr`]'s. (Not `kvm_apic`: some KVM backends write EOI themselves when
    /// they inject an interrupt, and `kvm_apic` counts those too.)
    X2apicTpr,
    /// `kvm_msr` filtered on writes of x2APIC MSR 0x80B, the EOI: added to
    /// [`Tracepoint::ApicEoi`]'s.
    X2apicEoi,
    /// `kvm_userspace_exit` with reason `KVM_EXIT_IO` (2): port I/O passed to the VMM.
    UserspaceIo,
    /// `kvm_userspace_exit` with reason `KVM_EXIT_MMIO` (6): MMIO passed to the VMM.
    UserspaceMmio,
    /// `kvm_userspace_exit` with any other reason but `KVM_EXIT_INTR` (10, a signal interrupting
    /// `KVM_RUN`, which is no message).
    UserspaceOther,
    /// `kvm_userspace_exit` with reason `KVM_EXIT_X86_RDMSR` or `_WRMSR` (29, 30): MSR accesses
    /// passed to the VMM, added to [`Tracepoint::Msr`]'s for an observed VM (as the run loop's
    /// own MSR exits are for our partitions).
    UserspaceMsr,
}

impl Tracepoint {
    /// Every tracepoint, in index order.
    pub const ALL: [Tracepoint; 16] = [
        Tracepoint::Cpuid,
        Tracepoint::Msr,
        Tracepoint::Pio,
        Tracepoint::Cr,
        Tracepoint::ApicMmio,
        Tracepoint::ApicTpr,
        Tracepoint::ApicEoi,
        Tracepoint::ApicIpi,
        Tracepoint::ApicSelfIpi,
        Tracepoint::InjException,
        Tracepoint::X2apicTpr,
        Tracepoint::X2apicEoi,
        Tracepoint::UserspaceIo,
        Tracepoint::UserspaceMmio,
        Tracepoint::UserspaceOther,
        Tracepoint::UserspaceMsr,
    ];

    /// The event name under `events/kvm/`.
    pub const fn event(self) -> &'static str {
        match self {
            Tracepoint::Cpuid => "kvm_cpuid",
            Tracepoint::Msr => "kvm_msr",
            Tracepoint::Pio => "kvm_pio",
            Tracepoint::Cr => "kvm_cr",
            Tracepoint::ApicMmio | Tracepoint::ApicTpr | Tracepoint::ApicEoi => "kvm_mmio",
            Tracepoint::ApicIpi | Tracepoint::ApicSelfIpi => "kvm_apic_ipi",
            Tracepoint::InjException => "kvm_inj_exception",
            Tracepoint::X2apicTpr | Tracepoint::X2apicEoi => "kvm_msr",
            Tracepoint::UserspaceIo
            | Tracepoint::UserspaceMmio
            | Tracepoint::UserspaceOther
            | Tracepoint::UserspaceMsr => "kvm_userspace_exit",
        }
    }

    /// True for the `kvm_userspace_exit` counts (exits the VMM handles).
    pub const fn is_userspace_exit(self) -> bool {
        matches!(
            self,
            Tracepoint::UserspaceIo
                | Tracepoint::UserspaceMmio
                | Tracepoint::UserspaceOther
                | Tracepoint::UserspaceMsr
        )
    }

    /// The tracepoints whose counts are added to this one's counter: the x2APIC accesses (MSRs)
    /// to the xAPIC's (MMIO).
    pub const fn added(self) -> &'static [Tracepoint] {
        match self {
            Tracepoint::ApicTpr => &[Tracepoint::X2apicTpr],
            Tracepoint::ApicEoi => &[Tracepoint::X2apicEoi],
            _ => &[],
        }
    }

    /// True when our own VPs count it: a source of a catalog row for our partitions, a part
    /// [`added`](Self::added) to one, or the WHv exception count.
    pub fn counted_for_partitions(self) -> bool {
        self == Tracepoint::InjException
            || CATALOG.iter().any(|c| match c.maintained.source() {
                Some(Source::Tracepoint(tp)) => tp == self || tp.added().contains(&self),
                _ => false,
            })
    }

    /// True when the observer counts it on a VMM's threads: a source of a catalog row for observed
    /// VMs, a part [`added`](Self::added) to one, or the VMM's MSR exits.
    pub fn counted_for_observed(self) -> bool {
        self == Tracepoint::UserspaceMsr
            || CATALOG.iter().any(|c| match observed(c).and_then(Maintained::source) {
                Some(Source::Tracepoint(tp)) => tp == self || tp.added().contains(&self),
                _ => false,
            })
    }

    /// The index of the tracepoint in [`Tracepoint::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// A perf software event of the VP thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PerfSoftwareEvent {
    /// `cpu-migrations`.
    CpuMigrations,
}

/// A time of the VP thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThreadTime {
    /// Its CPU clock: guest, KVM and run-loop time.
    Total,
    /// Its CPU time less its guest time.
    Hypervisor,
    /// Its time runnable but waiting for a CPU (schedstat, nanoseconds).
    CpuWait,
    /// The times it was put on a CPU (schedstat).
    Dispatches,
}

/// The number of counters of `object` maintained by a source of `kind`.
pub const fn maintained_count(object: ObjectKind, kind: SourceKind) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < CATALOG.len() {
        if is_of(&CATALOG[i], object, kind) {
            n += 1;
        }
        i += 1;
    }
    n
}

/// The counters of `object` maintained by a source of `kind`, in catalog order; `N` is
/// [`maintained_count`] of the same arguments.
///
/// ```
/// use hvstats_abi::ObjectKind;
/// use hvstats_abi::source::{Source, SourceKind, Tracepoint, maintained_by, maintained_count};
///
/// const N: usize = maintained_count(ObjectKind::Vp, SourceKind::Tracepoint);
/// const FROM_TRACEPOINTS: [&hvstats_abi::Counter; N] = maintained_by(ObjectKind::Vp, SourceKind::Tracepoint);
/// let cpuid = FROM_TRACEPOINTS.iter().find(|c| c.maintained.source() == Some(Source::Tracepoint(Tracepoint::Cpuid)));
/// assert_eq!(cpuid.unwrap().name, "CPUID instructions/sec");
/// ```
///
/// # Panics
/// When `N` is not that count (in a constant: a compile error).
pub const fn maintained_by<const N: usize>(object: ObjectKind, kind: SourceKind) -> [&'static Counter; N] {
    let mut out = [&CATALOG[0]; N];
    let mut n = 0;
    let mut i = 0;
    while i < CATALOG.len() {
        if is_of(&CATALOG[i], object, kind) {
            assert!(n < N, "more counters of this source than N");
            out[n] = &CATALOG[i];
            n += 1;
        }
        i += 1;
    }
    assert!(n == N, "fewer counters of this source than N");
    out
}

const fn is_of(c: &Counter, object: ObjectKind, kind: SourceKind) -> bool {
    match c.maintained.source() {
        Some(s) => c.id.kind as u8 == object as u8 && s.kind() as u8 == kind as u8,
        None => false,
    }
}

/// The VP counter the catalog gives hypercalls of `class`.
///
/// ```
/// use hvstats_abi::catalog::vp;
/// use hvstats_abi::hypercall::HypercallClass;
/// use hvstats_abi::source::hypercall_class_counter;
/// assert_eq!(hypercall_class_counter(HypercallClass::GpaSpace), Some(vp::GPA_SPACE_HYPERCALLS));
/// ```
pub const fn hypercall_class_counter(class: HypercallClass) -> Option<CounterId> {
    let mut i = 0;
    while i < CATALOG.len() {
        if let Some(Source::Hypercall(c)) = CATALOG[i].maintained.source()
            && c as u8 == class as u8
        {
            return Some(CATALOG[i].id);
        }
        i += 1;
    }
    None
}

const NO_TIME: &str = "the VMM's exit handling is not visible from outside: no per-intercept time";
const NO_HYPERCALL_CLASS: &str = "the observed VMM (or KVM) handles hypercalls; their codes are not visible";
const NO_VTLB: &str = "KVM has no virtual TLB";
const NO_OUTSIDE: &str = "no source outside the VMM process gives it";
const OBSERVED_KVM_STAT: &str = "the same KVM statistic, through QEMU's QMP (--qmp); an intercept class is counted from \
     kvm:kvm_exit by reason instead on VMX/SVM hosts";

/// How the observer maintains `counter` for a VM hvstats did not start; `None` for the
/// hypervisor and LP objects, which the observer's instance keeps as any instance does.
///
/// The row's observed key when it has one (`observed` in the catalog), else its own key where
/// the observer reads the same thing from outside the VMM: a KVM tracepoint on the vCPU thread,
/// a count from KVM's vCPU or VM statistics (through QEMU's QMP), the vCPU thread's times and
/// migrations. Everything the VMM itself does (its exit handling, its hypercall classes, its
/// memory slots) is not available, and says why.
///
/// ```
/// use hvstats_abi::catalog::{Maintained, vp};
/// use hvstats_abi::source::{Source, Tracepoint, observed};
/// let cpuid = vp::CPUID_INSTRUCTIONS.counter().unwrap();
/// assert_eq!(observed(cpuid).and_then(Maintained::source), Some(Source::Tracepoint(Tracepoint::Cpuid)));
/// let cost = vp::IO_INSTRUCTIONS_COST.counter().unwrap();
/// assert!(!observed(cost).unwrap().is_maintained());
/// ```
pub const fn observed(counter: &Counter) -> Option<Maintained> {
    match counter.id.kind {
        ObjectKind::Hypervisor | ObjectKind::LogicalProcessor => return None,
        ObjectKind::Partition | ObjectKind::Vp => {}
    }
    if let Some(m) = counter.observed_by {
        return Some(m);
    }
    // A time per intercept is the VMM's (or KVM's) own; a thread's scheduling times are not.
    let thread_time = matches!(counter.maintained.source(), Some(Source::ThreadTime(_)));
    if counter.presentation as u8 == Presentation::Cost as u8 && !thread_time {
        return Some(Maintained::No(NO_TIME));
    }
    let source = match counter.maintained {
        // Not maintained for our own partitions either: the catalog's reason holds.
        Maintained::No(why) => return Some(Maintained::No(why)),
        Maintained::By(source, _) => source,
    };
    let same = Maintained::By(source, counter.maintained.note());
    Some(match source {
        Source::Tracepoint(_) | Source::ThreadTime(_) | Source::PerfSoftware(_) => same,
        // Counts only: KVM's times and histograms are not among what QMP is read for.
        Source::KvmStats(_)
            if counter.unit as u8 == Unit::Count as u8
                && counter.presentation as u8 != Presentation::Histogram as u8 =>
        {
            Maintained::By(source, OBSERVED_KVM_STAT)
        }
        Source::Hypercall(_) => Maintained::No(NO_HYPERCALL_CLASS),
        _ if is_tlb(counter.name) => Maintained::No(NO_VTLB),
        _ => Maintained::No(NO_OUTSIDE),
    })
}

const fn is_tlb(name: &str) -> bool {
    let (b, t) = (name.as_bytes(), b"TLB");
    let mut i = 0;
    while i + t.len() <= b.len() {
        if b[i] == t[0] && b[i + 1] == t[1] && b[i + 2] == t[2] {
            return true;
        }
        i += 1;
    }
    false
}

/// The partition and VP counters an observed VM never has (to publish as not available).
pub fn never_observed() -> impl Iterator<Item = CounterId> {
    CATALOG.iter().filter(|c| observed(c).is_some_and(|m| !m.is_maintained())).map(|c| c.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{partition, vp};

    fn observed_source(id: CounterId) -> Option<Source> {
        id.counter().and_then(observed).and_then(Maintained::source)
    }

    #[test]
    fn every_partition_and_vp_counter_has_an_observed_answer() {
        for c in CATALOG {
            match c.id.kind {
                ObjectKind::Partition | ObjectKind::Vp => {
                    let o = observed(c).unwrap_or_else(|| panic!("{} has no answer", c.name));
                    assert!(!o.note().is_empty(), "{}", c.name);
                }
                _ => assert!(observed(c).is_none(), "{}", c.name),
            }
        }
    }

    #[test]
    fn costs_hypercall_classes_and_slots_are_unavailable_for_observed_vms() {
        for id in [vp::CPUID_INSTRUCTIONS_COST, vp::IO_INSTRUCTIONS_COST, vp::HLT_INSTRUCTIONS_COST] {
            assert_eq!(id.counter().and_then(observed), Some(Maintained::No(NO_TIME)));
        }
        assert_eq!(
            vp::GPA_SPACE_HYPERCALLS.counter().and_then(observed),
            Some(Maintained::No(NO_HYPERCALL_CLASS))
        );
        assert!(observed_source(partition::GPA_PAGES).is_none());
        assert!(observed_source(vp::HALT_WAIT_HISTOGRAM).is_none(), "QMP is read for counts only");
        assert!(never_observed().any(|c| c == vp::HYPERCALLS_COST));
        assert!(!never_observed().any(|c| c == vp::IO_INSTRUCTIONS));
    }

    #[test]
    fn observed_keys_are_the_rows_own_where_the_observer_reads_the_same_thing() {
        assert_eq!(observed_source(vp::CPUID_INSTRUCTIONS), Some(Source::Tracepoint(Tracepoint::Cpuid)));
        assert_eq!(observed_source(vp::TOTAL_RUN_TIME), Some(Source::ThreadTime(ThreadTime::Total)));
        assert_eq!(
            observed_source(vp::HLT_INSTRUCTIONS),
            Some(Source::KvmStats(KvmStat::Vcpu(&["halt_exits"])))
        );
        assert_eq!(
            observed_source(vp::IO_INTERCEPT_MESSAGES),
            Some(Source::Tracepoint(Tracepoint::UserspaceIo))
        );
        assert_eq!(observed_source(vp::MWAIT_INSTRUCTIONS), Some(Source::KvmExit(InterceptClass::Mwait)));
        // A cost, but the vCPU thread's own scheduling: schedstat gives it from outside.
        assert_eq!(
            observed_source(vp::CPU_WAIT_TIME_PER_DISPATCH),
            Some(Source::ThreadTime(ThreadTime::CpuWait))
        );
        assert_eq!(Source::Tracepoint(Tracepoint::UserspaceIo).name(), "userspace-exit");
    }

    #[test]
    fn our_vps_and_the_observer_count_the_tracepoints_their_rows_name() {
        let ours: [bool; Tracepoint::ALL.len()] = Tracepoint::ALL.map(Tracepoint::counted_for_partitions);
        let observed: [bool; Tracepoint::ALL.len()] = Tracepoint::ALL.map(Tracepoint::counted_for_observed);
        for tp in [Tracepoint::Cpuid, Tracepoint::ApicTpr, Tracepoint::X2apicTpr, Tracepoint::InjException] {
            assert!(ours[tp.index()], "{tp:?}");
        }
        for tp in [Tracepoint::UserspaceIo, Tracepoint::UserspaceMsr] {
            assert!(!ours[tp.index()], "{tp:?}: our run loop counts these itself");
        }
        for tp in
            [Tracepoint::Cpuid, Tracepoint::X2apicEoi, Tracepoint::UserspaceOther, Tracepoint::UserspaceMsr]
        {
            assert!(observed[tp.index()], "{tp:?}");
        }
        assert!(!observed[Tracepoint::InjException.index()]);
    }
}
