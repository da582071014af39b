//! Which counters the observer maintains for VMs hvstats did not start, and from what.
//!
//! An observed VM (a QEMU, Firecracker, cloud-hypervisor or crosvm process) is published with the
//! same partition and VP pages as a partition hvstats runs itself, but fewer sources reach it: the
//! observer sees the VMM's threads from outside, through per-thread perf counters, procfs, KVM's
//! binary stats as QEMU's QMP reports them, and — on VMX/SVM hosts — `kvm:kvm_exit` by reason.
//! It never sees the VMM's own exit handling, so userspace costs and hypercall classes are
//! unavailable. This table says so per counter; a counter it marks unavailable is published as
//! not available (readers show null), never as 0.
//!
//! Kept apart from the catalog table so the catalog can evolve independently; keyed by
//! [`CounterId`].

use crate::catalog::{CounterId, partition, vp};
use crate::object::ObjectKind;

/// Where the observer gets a counter's value from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObservedSource {
    /// The statistics authority (object counts).
    Authority,
    /// perf tracepoint counters (`kvm:*`) on the vCPU thread.
    Tracepoint,
    /// `kvm:kvm_userspace_exit` filtered by exit reason, on the vCPU thread.
    UserspaceExit,
    /// `kvm:kvm_exit` filtered by exit reason (VMX/SVM hosts only, see
    /// [`crate::exit_reason`]).
    KvmExit,
    /// perf software events on the vCPU thread.
    PerfSoftware,
    /// The vCPU thread's CPU and guest time from procfs.
    ThreadTime,
    /// KVM's binary stats, through QEMU's QMP `query-stats` (when a QMP socket is given).
    QmpStats,
}

impl ObservedSource {
    /// Short name for tables and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            ObservedSource::Authority => "authority",
            ObservedSource::Tracepoint => "tracepoint",
            ObservedSource::UserspaceExit => "userspace-exit",
            ObservedSource::KvmExit => "kvm-exit",
            ObservedSource::PerfSoftware => "perf-software",
            ObservedSource::ThreadTime => "thread-time",
            ObservedSource::QmpStats => "qmp-stats",
        }
    }
}

/// Whether the observer maintains a counter of an observed VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Observed {
    /// Maintained from this source; the note says how (and when it is only sometimes available).
    By(ObservedSource, &'static str),
    /// Not available for observed VMs; the note says why.
    No(&'static str),
}

impl Observed {
    /// True when the counter has a source.
    pub const fn is_maintained(self) -> bool {
        matches!(self, Observed::By(..))
    }

    /// The note: how it is maintained, or why it is not.
    pub const fn note(self) -> &'static str {
        match self {
            Observed::By(_, note) | Observed::No(note) => note,
        }
    }
}

use Observed::{By, No};
use ObservedSource::*;

const NO_TIME: &str = "the VMM's exit handling is not visible from outside: no per-intercept time";
const NO_HYPERCALL_CLASS: &str = "the observed VMM (or KVM) handles hypercalls; their codes are not visible";
const NO_VTLB: &str = "KVM has no virtual TLB";
const QMP_OR_EXIT: &str =
    "kvm:kvm_exit by reason on VMX/SVM hosts, else KVM's vCPU stat through QMP (--qmp); else unavailable";

/// The counters the observer maintains; every other partition or VP counter is unavailable.
const MAINTAINED: &[(CounterId, Observed)] = &[
    (partition::VIRTUAL_PROCESSORS, By(Authority, "vCPU file descriptors of the VMM process")),
    (partition::VIRTUAL_TLB_FLUSH_ENTRIES, By(QmpStats, "VM stat remote_tlb_flush through QMP (--qmp)")),
    (vp::TOTAL_RUN_TIME, By(PerfSoftware, "task-clock of the vCPU thread since attach")),
    (
        vp::HYPERVISOR_RUN_TIME,
        By(ThreadTime, "task-clock less the thread's guest time (stat field 43) since attach"),
    ),
    (
        vp::HYPERCALLS,
        By(KvmExit, "VMCALL/VMMCALL exits on VMX/SVM hosts, else vCPU stat hypercalls through QMP"),
    ),
    (vp::PAGE_INVALIDATIONS, By(KvmExit, QMP_OR_EXIT)),
    (vp::CONTROL_REGISTER_ACCESSES, By(Tracepoint, "kvm:kvm_cr")),
    (vp::IO_INSTRUCTIONS, By(Tracepoint, "kvm:kvm_pio")),
    (vp::HLT_INSTRUCTIONS, By(KvmExit, QMP_OR_EXIT)),
    (vp::MWAIT_INSTRUCTIONS, By(KvmExit, "MWAIT/MONITOR exits on VMX/SVM hosts only")),
    (vp::CPUID_INSTRUCTIONS, By(Tracepoint, "kvm:kvm_cpuid")),
    (
        vp::MSR_ACCESSES,
        By(Tracepoint, "kvm:kvm_msr plus MSR exits to the VMM (kvm_userspace_exit reasons 29, 30)"),
    ),
    (vp::OTHER_INTERCEPTS, By(KvmExit, "kvm_exit less every classified reason, on VMX/SVM hosts only")),
    (vp::EXTERNAL_INTERRUPTS, By(KvmExit, QMP_OR_EXIT)),
    (vp::PENDING_INTERRUPTS, By(KvmExit, QMP_OR_EXIT)),
    (vp::EMULATED_INSTRUCTIONS, By(QmpStats, "vCPU stat insn_emulation through QMP (--qmp)")),
    (vp::DEBUG_REGISTER_ACCESSES, By(KvmExit, "DR access exits on VMX/SVM hosts only")),
    (vp::PAGE_FAULT_INTERCEPTS, By(KvmExit, QMP_OR_EXIT)),
    (vp::REFLECTED_GUEST_PAGE_FAULTS, By(QmpStats, "vCPU stat pf_guest through QMP (--qmp)")),
    (vp::APIC_MMIO_ACCESSES, By(Tracepoint, "kvm:kvm_mmio on the local APIC page")),
    (vp::IO_INTERCEPT_MESSAGES, By(UserspaceExit, "kvm_userspace_exit reason 2 (KVM_EXIT_IO)")),
    (vp::MEMORY_INTERCEPT_MESSAGES, By(UserspaceExit, "kvm_userspace_exit reason 6 (KVM_EXIT_MMIO)")),
    (
        vp::APIC_EOI_ACCESSES,
        By(
            Tracepoint,
            "kvm:kvm_mmio writes of the APIC EOI register, plus kvm:kvm_msr writes of x2APIC MSR 0x80B",
        ),
    ),
    (
        vp::OTHER_MESSAGES,
        By(UserspaceExit, "kvm_userspace_exit other than IO, MMIO and signal interruptions (reason 10)"),
    ),
    (vp::LOGICAL_PROCESSOR_MIGRATIONS, By(PerfSoftware, "cpu-migrations of the vCPU thread")),
    (
        vp::APIC_TPR_ACCESSES,
        By(
            Tracepoint,
            "kvm:kvm_mmio accesses of the APIC TPR register, plus kvm:kvm_msr accesses of x2APIC MSR 0x808",
        ),
    ),
    (vp::VIRTUAL_INTERRUPTS, By(QmpStats, "vCPU stat irq_injections through QMP (--qmp)")),
    (vp::APIC_IPIS_SENT, By(Tracepoint, "kvm:kvm_apic_ipi")),
    (vp::APIC_SELF_IPIS_SENT, By(Tracepoint, "kvm:kvm_apic_ipi filtered on the self shorthand")),
    (vp::DISPATCHES, By(ThreadTime, "schedstat of the vCPU thread since attach: times put on a CPU")),
    (
        vp::CPU_WAIT_TIME_PER_DISPATCH,
        By(ThreadTime, "schedstat of the vCPU thread since attach: time runnable, waiting for a CPU"),
    ),
];

/// Whether and from what the observer maintains counter `id` of an observed VM; `None` for the
/// hypervisor and LP objects, which the observer's instance keeps as any instance does.
pub fn observed(id: CounterId) -> Option<Observed> {
    match id.kind {
        ObjectKind::Hypervisor | ObjectKind::LogicalProcessor => return None,
        ObjectKind::Partition | ObjectKind::Vp => {}
    }
    if let Some((_, o)) = MAINTAINED.iter().find(|(c, _)| *c == id) {
        return Some(*o);
    }
    let counter = id.counter()?;
    let why = if counter.presentation == crate::catalog::Presentation::Cost {
        NO_TIME
    } else if counter.name.ends_with("hypercalls/sec") {
        NO_HYPERCALL_CLASS
    } else if !counter.maintained.is_maintained() {
        // Not maintained for hvstats' own partitions either: the catalog's reason holds.
        counter.maintained.note()
    } else if matches!(id, partition::GPA_PAGES | partition::GPA_SPACE_MODIFICATIONS) {
        "the VMM's memory slots are not visible from outside"
    } else if counter.name.contains("TLB") {
        NO_VTLB
    } else {
        "no source outside the VMM process gives it"
    };
    Some(No(why))
}

/// The partition and VP counters an observed VM never has (to publish as not available).
pub fn never_observed() -> impl Iterator<Item = CounterId> {
    crate::catalog::CATALOG.iter().map(|c| c.id).filter(|id| matches!(observed(*id), Some(No(_))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::CATALOG;

    #[test]
    fn every_partition_and_vp_counter_has_an_answer() {
        for c in CATALOG {
            let o = observed(c.id);
            match c.id.kind {
                ObjectKind::Partition | ObjectKind::Vp => {
                    let o = o.unwrap_or_else(|| panic!("{} has no answer", c.name));
                    assert!(!o.note().is_empty(), "{}", c.name);
                }
                _ => assert!(o.is_none()),
            }
        }
    }

    #[test]
    fn the_table_has_no_duplicates_and_only_partition_or_vp_counters() {
        for (i, (a, _)) in MAINTAINED.iter().enumerate() {
            assert!(matches!(a.kind, ObjectKind::Partition | ObjectKind::Vp));
            assert!(a.counter().is_some());
            assert!(MAINTAINED[i + 1..].iter().all(|(b, _)| b != a), "{a:?} twice");
        }
    }

    #[test]
    fn costs_and_hypercall_classes_are_unavailable_for_observed_vms() {
        assert_eq!(observed(vp::CPUID_INSTRUCTIONS_COST), Some(No(NO_TIME)));
        assert_eq!(observed(vp::IO_INSTRUCTIONS_COST), Some(No(NO_TIME)));
        assert_eq!(observed(vp::GPA_SPACE_HYPERCALLS), Some(No(NO_HYPERCALL_CLASS)));
        assert!(observed(vp::CPUID_INSTRUCTIONS).is_some_and(Observed::is_maintained));
        assert!(never_observed().any(|c| c == vp::HYPERCALLS_COST));
        assert!(!never_observed().any(|c| c == vp::IO_INSTRUCTIONS));
    }
}
