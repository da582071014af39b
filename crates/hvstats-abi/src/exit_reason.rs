//! VMX and SVM exit reasons, and the Hyper-V intercept class each one is counted under.
//!
//! On a host with hardware virtualization KVM's `kvm:kvm_exit` tracepoint fires once per VM exit
//! with the architecture's exit reason (VMX: the basic exit reason, bits 15:0; SVM: the full exit
//! code). A Hyper-V VP page counts intercepts by class (CPUID, I/O, HLT, control registers, …), so
//! an observer of a VM it did not start needs one table per architecture saying which reasons make
//! up each class. The tables live here, beside the catalog, so that the class → counter mapping
//! and the reason names are ABI facts with tests rather than scattered constants.
//!
//! Sources: Linux `arch/x86/include/uapi/asm/vmx.h` and `svm.h`. Reasons not listed here, and
//! exits with flag bits set (VMX bit 31, failed VM entry), belong to [`InterceptClass::Other`].

/// The value of `kvm_exit`'s `isa` field on Intel VMX hosts.
pub const ISA_VMX: u32 = 1;
/// The value of `kvm_exit`'s `isa` field on AMD SVM hosts.
pub const ISA_SVM: u32 = 2;

/// The Hyper-V intercept classes of the VP page: each has a count counter (and, where the catalog
/// has one, a cost counter), a label for exporters, and — but emulated instructions, which no
/// exit reason names — the VM exits counted under it. The one table of the idea: the exit tables
/// below, the WHv Intercepts set ([`InterceptClass::WHV`]) and the exporters' `intercept` label
/// all derive from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InterceptClass {
    /// INVLPG, INVLPGA, INVPCID.
    PageInvalidation,
    /// Control register accesses.
    ControlRegister,
    /// Port I/O instructions.
    Io,
    /// HLT.
    Halt,
    /// MWAIT (and MWAIT-like waits).
    Mwait,
    /// CPUID (VMX reason 10, SVM 0x72): VP "CPUID instructions/sec".
    Cpuid,
    /// RDMSR and WRMSR.
    Msr,
    /// External (host) interrupts that forced an exit.
    ExternalInterrupt,
    /// Interrupt-window exits: the guest became able to take a pending interrupt.
    PendingInterrupt,
    /// Debug register accesses.
    DebugRegister,
    /// Page fault exceptions intercepted.
    PageFault,
    /// Accesses to the virtual APIC's registers that exit (APIC access, APIC write).
    ApicAccess,
    /// EOI-induced exits.
    ApicEoi,
    /// TPR-below-threshold exits.
    ApicTpr,
    /// VMCALL / VMMCALL.
    Hypercall,
    /// Every other exit reason.
    Other,
    /// Instructions the hypervisor emulated (no exit reason of their own: KVM's emulator).
    Emulated,
}

impl InterceptClass {
    /// Every class, in a fixed order.
    pub const ALL: [InterceptClass; 17] = [
        InterceptClass::PageInvalidation,
        InterceptClass::ControlRegister,
        InterceptClass::Io,
        InterceptClass::Halt,
        InterceptClass::Mwait,
        InterceptClass::Cpuid,
        InterceptClass::Msr,
        InterceptClass::ExternalInterrupt,
        InterceptClass::PendingInterrupt,
        InterceptClass::DebugRegister,
        InterceptClass::PageFault,
        InterceptClass::ApicAccess,
        InterceptClass::ApicEoi,
        InterceptClass::ApicTpr,
        InterceptClass::Hypercall,
        InterceptClass::Other,
        InterceptClass::Emulated,
    ];

    /// The classes VM exits are counted under (every class an exit reason can name, and Other for
    /// the rest), in a fixed order (the index order of counting arrays).
    pub const EXITS: [InterceptClass; 16] = [
        InterceptClass::PageInvalidation,
        InterceptClass::ControlRegister,
        InterceptClass::Io,
        InterceptClass::Halt,
        InterceptClass::Mwait,
        InterceptClass::Cpuid,
        InterceptClass::Msr,
        InterceptClass::ExternalInterrupt,
        InterceptClass::PendingInterrupt,
        InterceptClass::DebugRegister,
        InterceptClass::PageFault,
        InterceptClass::ApicAccess,
        InterceptClass::ApicEoi,
        InterceptClass::ApicTpr,
        InterceptClass::Hypercall,
        InterceptClass::Other,
    ];

    /// The classes of `WHV_PROCESSOR_INTERCEPT_COUNTERS`, in the struct's order (seed 000).
    pub const WHV: [InterceptClass; 11] = [
        InterceptClass::PageInvalidation,
        InterceptClass::ControlRegister,
        InterceptClass::Io,
        InterceptClass::Halt,
        InterceptClass::Cpuid,
        InterceptClass::Msr,
        InterceptClass::Other,
        InterceptClass::PendingInterrupt,
        InterceptClass::Emulated,
        InterceptClass::DebugRegister,
        InterceptClass::PageFault,
    ];

    /// The class's position in [`InterceptClass::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The exporters' `intercept` label value, e.g. `cpuid`, `hlt`, `control_register`.
    pub const fn label(self) -> &'static str {
        match self {
            InterceptClass::PageInvalidation => "invlpg",
            InterceptClass::ControlRegister => "control_register",
            InterceptClass::Io => "io",
            InterceptClass::Halt => "hlt",
            InterceptClass::Mwait => "mwait",
            InterceptClass::Cpuid => "cpuid",
            InterceptClass::Msr => "msr",
            InterceptClass::ExternalInterrupt => "external_interrupt",
            InterceptClass::PendingInterrupt => "pending_interrupt",
            InterceptClass::DebugRegister => "debug_register",
            InterceptClass::PageFault => "page_fault",
            InterceptClass::ApicAccess => "apic_access",
            InterceptClass::ApicEoi => "apic_eoi",
            InterceptClass::ApicTpr => "apic_tpr",
            InterceptClass::Hypercall => "hypercall",
            InterceptClass::Other => "other",
            InterceptClass::Emulated => "emulated",
        }
    }

    /// Short name for logs and tables.
    pub const fn name(self) -> &'static str {
        match self {
            InterceptClass::PageInvalidation => "page-invalidation",
            InterceptClass::ControlRegister => "control-register",
            InterceptClass::Io => "io",
            InterceptClass::Halt => "halt",
            InterceptClass::Mwait => "mwait",
            InterceptClass::Cpuid => "cpuid",
            InterceptClass::Msr => "msr",
            InterceptClass::ExternalInterrupt => "external-interrupt",
            InterceptClass::PendingInterrupt => "pending-interrupt",
            InterceptClass::DebugRegister => "debug-register",
            InterceptClass::PageFault => "page-fault",
            InterceptClass::ApicAccess => "apic-access",
            InterceptClass::ApicEoi => "apic-eoi",
            InterceptClass::ApicTpr => "apic-tpr",
            InterceptClass::Hypercall => "hypercall",
            InterceptClass::Other => "other",
            InterceptClass::Emulated => "emulated",
        }
    }
}

/// One row of an exit reason table: reasons `first..=last`, their name, their class, and an
/// extra condition on another `kvm_exit` field (ftrace filter syntax) when the reason alone does
/// not decide the class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitReasonRow {
    /// The first reason of the range.
    pub first: u64,
    /// The last reason of the range (equal to `first` for a single reason).
    pub last: u64,
    /// The architecture's name (for a range, the name of the family).
    pub name: &'static str,
    /// The class these exits are counted under.
    pub class: InterceptClass,
    /// A further condition, e.g. the exception vector in `intr_info`.
    pub condition: Option<&'static str>,
}

const fn one(reason: u64, name: &'static str, class: InterceptClass) -> ExitReasonRow {
    ExitReasonRow { first: reason, last: reason, name, class, condition: None }
}

const fn range(first: u64, last: u64, name: &'static str, class: InterceptClass) -> ExitReasonRow {
    ExitReasonRow { first, last, name, class, condition: None }
}

use InterceptClass as C;

/// `intr_info` of a VMX exception exit for a page fault: valid (bit 31), hardware exception
/// (type 3, bits 10:8), error code delivered (bit 11), vector 14.
pub const VMX_PAGE_FAULT_INTR_INFO: u32 = 0x8000_0b0e;

/// VMX basic exit reasons with a class other than [`InterceptClass::Other`], and the named ones
/// that are counted as other. A page-fault exception is reason 0 with
/// [`VMX_PAGE_FAULT_INTR_INFO`]; every other exception or NMI is "other".
pub const VMX: &[ExitReasonRow] = &[
    ExitReasonRow {
        first: 0,
        last: 0,
        name: "EXCEPTION_NMI (#PF)",
        class: C::PageFault,
        condition: Some("intr_info == 0x80000b0e"),
    },
    one(1, "EXTERNAL_INTERRUPT", C::ExternalInterrupt),
    one(2, "TRIPLE_FAULT", C::Other),
    one(7, "INTERRUPT_WINDOW", C::PendingInterrupt),
    one(8, "NMI_WINDOW", C::PendingInterrupt),
    one(9, "TASK_SWITCH", C::Other),
    one(10, "CPUID", C::Cpuid),
    one(12, "HLT", C::Halt),
    one(14, "INVLPG", C::PageInvalidation),
    one(16, "RDTSC", C::Other),
    one(18, "VMCALL", C::Hypercall),
    one(28, "CR_ACCESS", C::ControlRegister),
    one(29, "DR_ACCESS", C::DebugRegister),
    one(30, "IO_INSTRUCTION", C::Io),
    one(31, "MSR_READ", C::Msr),
    one(32, "MSR_WRITE", C::Msr),
    one(36, "MWAIT_INSTRUCTION", C::Mwait),
    one(39, "MONITOR_INSTRUCTION", C::Mwait),
    one(40, "PAUSE_INSTRUCTION", C::Other),
    one(43, "TPR_BELOW_THRESHOLD", C::ApicTpr),
    one(44, "APIC_ACCESS", C::ApicAccess),
    one(45, "EOI_INDUCED", C::ApicEoi),
    one(48, "EPT_VIOLATION", C::Other),
    one(49, "EPT_MISCONFIG", C::Other),
    one(54, "WBINVD", C::Other),
    one(55, "XSETBV", C::Other),
    one(56, "APIC_WRITE", C::ApicAccess),
    one(58, "INVPCID", C::PageInvalidation),
    one(67, "UMWAIT", C::Mwait),
    one(68, "TPAUSE", C::Mwait),
    one(84, "MSR_READ_IMM", C::Msr),
    one(85, "MSR_WRITE_IMM", C::Msr),
];

/// SVM exit codes with a class other than [`InterceptClass::Other`], and some named ones that
/// are counted as other.
pub const SVM: &[ExitReasonRow] = &[
    range(0x000, 0x01f, "READ_CR*/WRITE_CR*", C::ControlRegister),
    range(0x020, 0x03f, "READ_DR*/WRITE_DR*", C::DebugRegister),
    one(0x04e, "EXCP_BASE + #PF", C::PageFault),
    one(0x060, "INTR", C::ExternalInterrupt),
    one(0x064, "VINTR", C::PendingInterrupt),
    one(0x065, "CR0_SEL_WRITE", C::ControlRegister),
    one(0x06e, "RDTSC", C::Other),
    one(0x072, "CPUID", C::Cpuid),
    one(0x077, "PAUSE", C::Other),
    one(0x078, "HLT", C::Halt),
    one(0x079, "INVLPG", C::PageInvalidation),
    one(0x07a, "INVLPGA", C::PageInvalidation),
    one(0x07b, "IOIO", C::Io),
    one(0x07c, "MSR", C::Msr),
    one(0x07f, "SHUTDOWN", C::Other),
    one(0x081, "VMMCALL", C::Hypercall),
    one(0x08a, "MONITOR", C::Mwait),
    one(0x08b, "MWAIT", C::Mwait),
    one(0x08c, "MWAIT_COND", C::Mwait),
    range(0x08f, 0x09f, "EFER/CR*_WRITE_TRAP", C::ControlRegister),
    one(0x0a2, "INVPCID", C::PageInvalidation),
    one(0x0a6, "IDLE_HLT", C::Halt),
    one(0x400, "NPF", C::Other),
    one(0x401, "AVIC_INCOMPLETE_IPI", C::ApicAccess),
    one(0x402, "AVIC_UNACCELERATED_ACCESS", C::ApicAccess),
];

/// The table of `kvm_exit`'s `isa` value ([`ISA_VMX`] or [`ISA_SVM`]).
pub const fn table(isa: u32) -> Option<&'static [ExitReasonRow]> {
    match isa {
        ISA_VMX => Some(VMX),
        ISA_SVM => Some(SVM),
        _ => None,
    }
}

/// The row of `reason` in `rows`, ignoring rows with a further condition.
fn row_of(rows: &'static [ExitReasonRow], reason: u64) -> Option<&'static ExitReasonRow> {
    rows.iter().find(|r| r.condition.is_none() && (r.first..=r.last).contains(&reason))
}

/// The class of a VMX exit with raw `exit_reason` (flags included) and `intr_info`.
pub fn vmx_class(exit_reason: u32, intr_info: u32) -> InterceptClass {
    if exit_reason == 0 && intr_info == VMX_PAGE_FAULT_INTR_INFO {
        return InterceptClass::PageFault;
    }
    // An exit with a flag set (failed VM entry) is not the basic reason's intercept.
    if exit_reason > 0xffff {
        return InterceptClass::Other;
    }
    row_of(VMX, u64::from(exit_reason)).map_or(InterceptClass::Other, |r| r.class)
}

/// The class of an SVM exit with exit code `code`.
pub fn svm_class(code: u64) -> InterceptClass {
    row_of(SVM, code).map_or(InterceptClass::Other, |r| r.class)
}

/// The name of a VMX basic exit reason or SVM exit code, when the table names it.
pub fn reason_name(isa: u32, reason: u64) -> Option<&'static str> {
    let rows = table(isa)?;
    rows.iter().find(|r| (r.first..=r.last).contains(&reason)).map(|r| r.name)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn vmx_reasons_fall_in_their_classes() {
        assert_eq!(vmx_class(10, 0), C::Cpuid);
        assert_eq!(vmx_class(12, 0), C::Halt);
        assert_eq!(vmx_class(30, 0), C::Io);
        assert_eq!(vmx_class(31, 0), C::Msr);
        assert_eq!(vmx_class(32, 0), C::Msr);
        assert_eq!(vmx_class(28, 0), C::ControlRegister);
        assert_eq!(vmx_class(1, 0), C::ExternalInterrupt);
        assert_eq!(vmx_class(7, 0), C::PendingInterrupt);
        assert_eq!(vmx_class(18, 0), C::Hypercall);
        assert_eq!(vmx_class(45, 0), C::ApicEoi);
        assert_eq!(vmx_class(0, VMX_PAGE_FAULT_INTR_INFO), C::PageFault);
        // #UD (vector 6) and NMIs are other exceptions.
        assert_eq!(vmx_class(0, 0x8000_0306), C::Other);
        assert_eq!(vmx_class(48, 0), C::Other);
        assert_eq!(vmx_class(200, 0), C::Other);
        // Failed VM entry with the basic reason of CPUID is not a CPUID intercept.
        assert_eq!(vmx_class(0x8000_000a, 0), C::Other);
    }

    #[test]
    fn svm_codes_fall_in_their_classes() {
        assert_eq!(svm_class(0x072), C::Cpuid);
        assert_eq!(svm_class(0x078), C::Halt);
        assert_eq!(svm_class(0x07b), C::Io);
        assert_eq!(svm_class(0x07c), C::Msr);
        assert_eq!(svm_class(0x000), C::ControlRegister);
        assert_eq!(svm_class(0x013), C::ControlRegister);
        assert_eq!(svm_class(0x09f), C::ControlRegister);
        assert_eq!(svm_class(0x025), C::DebugRegister);
        assert_eq!(svm_class(0x04e), C::PageFault);
        // Another exception vector (#UD = 0x46) is other.
        assert_eq!(svm_class(0x046), C::Other);
        assert_eq!(svm_class(0x060), C::ExternalInterrupt);
        assert_eq!(svm_class(0x081), C::Hypercall);
        assert_eq!(svm_class(0x400), C::Other);
        assert_eq!(svm_class(u64::MAX), C::Other);
    }

    #[test]
    fn rows_do_not_overlap_and_are_sorted() {
        for rows in [VMX, SVM] {
            for pair in rows.windows(2) {
                assert!(pair[0].first <= pair[0].last, "{:?}", pair[0]);
                assert!(pair[0].last < pair[1].first, "{:?} overlaps {:?}", pair[0], pair[1]);
            }
        }
    }

    #[test]
    fn every_class_but_other_has_reasons_on_both_architectures_or_is_known_not_to() {
        for (rows, missing) in [(VMX, &[][..]), (SVM, &[C::ApicEoi, C::ApicTpr][..])] {
            let present: BTreeSet<_> = rows.iter().map(|r| r.class).collect();
            for class in InterceptClass::EXITS {
                let expect = !missing.contains(&class);
                assert_eq!(present.contains(&class), expect, "{class:?}");
            }
        }
    }

    #[test]
    fn classes_count_into_distinct_vp_counters() {
        let counters: BTreeSet<_> = InterceptClass::ALL.iter().map(|c| c.counter()).collect();
        assert_eq!(counters.len(), InterceptClass::ALL.len());
        let labels: BTreeSet<_> = InterceptClass::ALL.iter().map(|c| c.label()).collect();
        assert_eq!(labels.len(), InterceptClass::ALL.len());
        for (i, c) in InterceptClass::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
            assert!(c.counter().counter().is_some(), "{c:?} counts into a catalog counter");
        }
        for c in InterceptClass::WHV {
            assert!(c.cost().is_some(), "{c:?}: the WHv Intercepts set pairs every count with a time");
        }
        // Exits are counted under every class but the emulator's.
        assert!(!InterceptClass::EXITS.contains(&C::Emulated));
        assert_eq!(InterceptClass::EXITS.len() + 1, InterceptClass::ALL.len());
    }

    #[test]
    fn names_come_from_the_tables() {
        assert_eq!(reason_name(ISA_VMX, 10), Some("CPUID"));
        assert_eq!(reason_name(ISA_SVM, 0x07b), Some("IOIO"));
        assert_eq!(reason_name(ISA_SVM, 0x011), Some("READ_CR*/WRITE_CR*"));
        assert_eq!(reason_name(3, 10), None);
    }
}
