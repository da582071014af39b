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

use crate::exit_reason::InterceptClass;
use crate::hypercall::{HypercallClass, HypercallEffect};

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
    /// The page faults the host took on the VP thread (`/proc/<pid>/task/<tid>/stat`).
    HostFaults(HostFault),
    /// `kvm:kvm_exit` filtered by the exit reasons of an intercept class (VMX/SVM hosts only, see
    /// [`crate::exit_reason`]); observed VMs only.
    KvmExit(InterceptClass),
    /// The nanoseconds from each `kvm:kvm_exit` of an intercept class to the next `kvm:kvm_entry`
    /// of the same vCPU thread, timed in the kernel (VMX/SVM hosts only); observed VMs only.
    KvmExitTime(InterceptClass),
    /// KVM's Hyper-V emulation, as its `kvm:kvm_hv_*` tracepoints record it on the vCPU thread
    /// (guests with Hyper-V enlightenments); observed VMs only.
    KvmHv(KvmHv),
    /// The observer of other processes' VMs, about itself (the hypervisor page of its instance;
    /// other instances declare these unavailable).
    Observer(ObserverFact),
    /// The VMM's own word on its VM's run state (libvirt's domain state, QMP `query-status`); for
    /// our own partitions,
    /// the authority's (running until the partition stops).
    RunState,
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
    /// [`Source::HostFaults`].
    HostFaults,
    /// [`Source::KvmExit`].
    KvmExit,
    /// [`Source::KvmExitTime`].
    KvmExitTime,
    /// [`Source::KvmHv`].
    KvmHv,
    /// [`Source::Observer`].
    Observer,
    /// [`Source::RunState`].
    RunState,
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
            SourceKind::HostFaults => "host-faults",
            SourceKind::KvmExit => "kvm-exit",
            SourceKind::KvmExitTime => "kvm-exit-time",
            SourceKind::KvmHv => "kvm-hv",
            SourceKind::Observer => "observer",
            SourceKind::RunState => "run-state",
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
            Source::HostFaults(_) => SourceKind::HostFaults,
            Source::KvmExit(_) => SourceKind::KvmExit,
            Source::KvmExitTime(_) => SourceKind::KvmExitTime,
            Source::KvmHv(_) => SourceKind::KvmHv,
            Source::Observer(_) => SourceKind::Observer,
            Source::RunState => SourceKind::RunState,
        }
    }
}

/// What the observer counts from KVM's Hyper-V tracepoints (`kvm:kvm_hv_*`, see
/// `docs/kvm-hv-tracepoints.md`), each hypercall classified by the one hypercall table
/// ([`crate::hypercall::HYPERCALLS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvmHv {
    /// `kvm_hv_hypercall` records whose code the table puts in the class (Other: every record no
    /// other class takes).
    Hypercalls(HypercallClass),
    /// Every `kvm_hv_hypercall` record.
    AllHypercalls,
    /// The nanoseconds from `kvm_hv_hypercall` to the thread's next `kvm_hv_hypercall_done`.
    HypercallTime,
    /// `kvm_hv_hypercall_done` records whose status (`result` bits 15:0) is not success.
    FailedHypercalls,
    /// `kvm_hv_flush_tlb`/`_ex` records of the hypercalls with the effect (by the code of the
    /// thread's `kvm_hv_hypercall` record before them), whose flags flush every address space
    /// (`true`) or not: one each, or the hypercall's rep count for a GVA range list
    /// ([`HypercallEffect::flush`](crate::hypercall::HypercallEffect)).
    Flushes(HypercallEffect, bool),
    /// `kvm_hv_synic_set_irq` records: a synthetic interrupt asserted to the vCPU.
    SyntheticInterrupts,
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
    /// Hypercalls answered with a status other than success.
    FailedHypercalls,
}

impl RunLoopCount {
    /// Every run-loop count.
    pub const ALL: [RunLoopCount; 15] = [
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
        RunLoopCount::FailedHypercalls,
    ];
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
    /// `kvm_inj_exception` filtered on `reinjected == 0`: exceptions the guest raised, each once
    /// (the WHv exception count; no page counter). KVM injects an exception again, flagged
    /// `reinjected`, when the entry it was injected for did not deliver it.
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
    /// `kvm_exit` of the APIC accesses KVM completes without `kvm_mmio` (VMX APIC_WRITE, SVM
    /// AVIC_INCOMPLETE_IPI): added to [`Tracepoint::ApicMmio`]'s.
    ExitApicAccess,
    /// `kvm_exit` of the EOIs KVM completes without `kvm_mmio` or `kvm_msr` (VMX EOI_INDUCED, the
    /// EOI writes of APIC_ACCESS it does not emulate, SVM AVIC EOI writes): added to
    /// [`Tracepoint::ApicEoi`]'s.
    ExitApicEoi,
    /// `kvm_exit` of VMX TPR_BELOW_THRESHOLD: added to [`Tracepoint::ApicTpr`]'s.
    ExitApicTpr,
    /// `kvm_exit` of SVM CR write traps (SEV-ES), which `kvm_cr` does not see: added to
    /// [`Tracepoint::Cr`]'s.
    ExitCr,
    /// `kvm_exit` of the SVM EFER write trap (SEV-ES), which `kvm_msr` does not see: added to
    /// [`Tracepoint::Msr`]'s.
    ExitMsr,
    /// `kvm_avic_unaccelerated_access` of the trap-like writes (not of EOI, which
    /// [`Tracepoint::ExitApicEoi`] counts): accesses AVIC leaves to KVM that `kvm_mmio` does not
    /// see, added to [`Tracepoint::ApicMmio`]'s.
    AvicTrap,
}

impl Tracepoint {
    /// Every tracepoint, in index order.
    pub const ALL: [Tracepoint; 22] = [
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
        Tracepoint::ExitApicAccess,
        Tracepoint::ExitApicEoi,
        Tracepoint::ExitApicTpr,
        Tracepoint::ExitCr,
        Tracepoint::ExitMsr,
        Tracepoint::AvicTrap,
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
            Tracepoint::ExitApicAccess
            | Tracepoint::ExitApicEoi
            | Tracepoint::ExitApicTpr
            | Tracepoint::ExitCr
            | Tracepoint::ExitMsr => "kvm_exit",
            Tracepoint::AvicTrap => "kvm_avic_unaccelerated_access",
        }
    }

    /// For the `kvm_exit` parts, the intercept class whose exits [`Counted::Added`] to its
    /// counter's tracepoint they count (their filter is [`exit_filter::added_filter`]).
    ///
    /// [`Counted::Added`]: crate::exit_reason::Counted::Added
    /// [`exit_filter::added_filter`]: crate::exit_filter::added_filter
    pub const fn exit_class(self) -> Option<InterceptClass> {
        Some(match self {
            Tracepoint::ExitApicAccess => InterceptClass::ApicAccess,
            Tracepoint::ExitApicEoi => InterceptClass::ApicEoi,
            Tracepoint::ExitApicTpr => InterceptClass::ApicTpr,
            Tracepoint::ExitCr => InterceptClass::ControlRegister,
            Tracepoint::ExitMsr => InterceptClass::Msr,
            _ => return None,
        })
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
    /// to the xAPIC's (MMIO), and the exits KVM handles without this one firing (APICv, AVIC,
    /// SEV-ES traps).
    pub const fn added(self) -> &'static [Tracepoint] {
        match self {
            Tracepoint::ApicMmio => &[Tracepoint::ExitApicAccess, Tracepoint::AvicTrap],
            Tracepoint::ApicTpr => &[Tracepoint::X2apicTpr, Tracepoint::ExitApicTpr],
            Tracepoint::ApicEoi => &[Tracepoint::X2apicEoi, Tracepoint::ExitApicEoi],
            Tracepoint::Cr => &[Tracepoint::ExitCr],
            Tracepoint::Msr => &[Tracepoint::ExitMsr],
            _ => &[],
        }
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

/// Page faults the host took on a VP thread, as proc(5) counts them for the thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostFault {
    /// Every fault: `minflt` plus `majflt` (fields 10 and 12).
    All,
    /// The faults that waited for I/O: `majflt` (field 12).
    Major,
}

/// What the observer of other processes' VMs says about itself, on its instance's hypervisor
/// page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObserverFact {
    /// 1 while it refreshes the VMs it observes, 0 once it stopped.
    Up,
    /// When it last finished a refresh of every VM it observes.
    LastRefresh,
    /// The VMs it found in a state.
    Vms(VmsState),
    /// The VMs it found and refuses for one reason.
    Refused(crate::refusal::Refusal),
    /// The observed VMs whose QMP session answers now.
    QmpSessionsUp,
}

/// Whether the observer observes a VM it found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VmsState {
    /// Observed: published as a partition.
    Attached,
    /// Found but not observed now, for any reason (the sum of the [`ObserverFact::Refused`]
    /// rows).
    Refused,
}

impl VmsState {
    /// The `state` label of the VMs in this state.
    pub const fn label(self) -> &'static str {
        match self {
            VmsState::Attached => "attached",
            VmsState::Refused => "refused",
        }
    }
}
