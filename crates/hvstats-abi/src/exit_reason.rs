//! VMX and SVM exit reasons, and the Hyper-V intercept class each one is counted under.
//!
//! On a host with hardware virtualization KVM's `kvm:kvm_exit` tracepoint fires once per VM exit
//! with the architecture's exit reason (VMX: the exit reason field, basic reason in bits 15:0 and
//! flags above; SVM: the exit code). A Hyper-V VP page counts intercepts by class (CPUID, I/O,
//! HLT, control registers, …), so an observer of a VM it did not start needs one table per
//! architecture saying which reasons make up each class and how the class's counter gets them.
//! The tables live here, beside the catalog, so that the class of every reason, the ftrace
//! filters that select a class on `kvm_exit` (made from them in [`crate::exit_filter`]) and the
//! reference classification ([`row_of`]) are one set of ABI facts with tests, and `docs/exits.md`
//! is checked against them.
//!
//! Sources: Linux `arch/x86/include/uapi/asm/vmx.h` and `svm.h` (the codes),
//! `arch/x86/kvm/vmx/vmx.c` `kvm_vmx_exit_handlers` and `arch/x86/kvm/svm/svm.c`
//! `svm_exit_handlers` (what KVM does with each), `arch/x86/kvm/trace.h` (the record). A reason no
//! row names is [`InterceptClass::Other`]; so is a VMX exit with a flag other than bus lock (bit
//! 26) or enclave mode (bit 27) — a failed VM entry (bit 31) above all, which KVM returns to the
//! VMM as `KVM_EXIT_FAIL_ENTRY` instead of handling the basic reason.

/// The value of `kvm_exit`'s `isa` field on Intel VMX hosts.
pub const ISA_VMX: u32 = 1;
/// The value of `kvm_exit`'s `isa` field on AMD SVM hosts.
pub const ISA_SVM: u32 = 2;

/// The basic exit reason: bits 15:0 of the VMX exit reason.
pub const VMX_BASIC_REASON: u32 = 0xffff;
/// VMX exit reason bit 26: a bus lock was detected while the guest ran (the exit is still its
/// basic reason's).
pub const VMX_BUS_LOCK_DETECTED: u32 = 1 << 26;
/// VMX exit reason bit 27: the exit came from SGX enclave mode (the exit is still its basic
/// reason's).
pub const VMX_ENCLAVE_MODE: u32 = 1 << 27;
/// VMX exit reason bit 31: the VM entry failed; KVM does not handle the basic reason.
pub const VMX_FAILED_VMENTRY: u32 = 1 << 31;
/// The VMX flags that leave an exit its basic reason's: KVM handles it as that reason.
pub const VMX_KEPT_FLAGS: u32 = VMX_BUS_LOCK_DETECTED | VMX_ENCLAVE_MODE;
/// The combinations of kept flags an exit may carry besides none.
pub const VMX_FLAG_SETS: [u32; 3] = [VMX_BUS_LOCK_DETECTED, VMX_ENCLAVE_MODE, VMX_KEPT_FLAGS];

/// SVM exit code −1 (`SVM_EXIT_ERR`, as `kvm_exit`'s `unsigned int`): VMRUN found invalid guest
/// state. A real code, never a placeholder.
pub const SVM_EXIT_ERR: u32 = 0xffff_ffff;

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
    /// Page fault exceptions of the guest, intercepted.
    PageFault,
    /// Faults of the second-level translation: EPT violations and misconfigurations, NPF.
    NestedPageFault,
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
    /// Every class, in a fixed order: those VM exits are counted under ([`Self::EXITS`]), then
    /// [`InterceptClass::Emulated`].
    pub const ALL: [InterceptClass; 18] = {
        let mut all = [InterceptClass::Emulated; 18];
        let mut i = 0;
        while i < Self::EXITS.len() {
            all[i] = Self::EXITS[i];
            i += 1;
        }
        all
    };

    /// The classes VM exits are counted under (every class an exit reason can name, and Other for
    /// the rest), in a fixed order (the index order of counting arrays).
    pub const EXITS: [InterceptClass; 17] = [
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
        InterceptClass::NestedPageFault,
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
            InterceptClass::NestedPageFault => "nested_page_fault",
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
            InterceptClass::NestedPageFault => "nested-page-fault",
            InterceptClass::ApicAccess => "apic-access",
            InterceptClass::ApicEoi => "apic-eoi",
            InterceptClass::ApicTpr => "apic-tpr",
            InterceptClass::Hypercall => "hypercall",
            InterceptClass::Other => "other",
            InterceptClass::Emulated => "emulated",
        }
    }
}

/// A field of the `kvm_exit` record, besides the exit reason, that a row's condition reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitField {
    /// `intr_info` (VMX: the exit's interruption information; SVM: EXITINTINFO).
    IntrInfo,
    /// `info1` (VMX: the exit qualification; SVM: EXITINFO1).
    Info1,
}

impl ExitField {
    /// The field's name in the record (and in filters).
    pub const fn name(self) -> &'static str {
        match self {
            ExitField::IntrInfo => "intr_info",
            ExitField::Info1 => "info1",
        }
    }
}

/// A condition on another field of the record: the field holds one of `values`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Condition {
    /// The field.
    pub field: ExitField,
    /// The values it may hold.
    pub values: &'static [u64],
    /// What the values mean.
    pub meaning: &'static str,
}

/// How the counter of an exit's class gets the exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// From `kvm_exit` itself: the class's counter is the exits of its rows (Other: every exit no
    /// class took).
    Exit,
    /// By the tracepoint named, which fires for what KVM does with the exit (`kvm_cpuid` for
    /// CPUID); `kvm_exit` only takes the exit out of Other and times it.
    Tracepoint(&'static str),
    /// From `kvm_exit`, added to the count of the tracepoint the class's counter is counted from,
    /// which does not fire for this exit (an EOI APICv virtualized).
    Added,
}

/// One row of an exit reason table: reasons `first..=last`, their name, their class, how the
/// class's counter gets them, and a condition on another `kvm_exit` field when the reason alone
/// does not decide the class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitReasonRow {
    /// The first reason of the range (VMX: a basic reason).
    pub first: u64,
    /// The last reason of the range (equal to `first` for a single reason).
    pub last: u64,
    /// The architecture's name (for a range, the name of the family).
    pub name: &'static str,
    /// A further condition: the row takes only the exits that meet it, and a row of the same
    /// reasons without one takes the rest.
    pub when: Option<Condition>,
    /// The class these exits are counted under.
    pub class: InterceptClass,
    /// How the class's counter gets them.
    pub counted: Counted,
    /// What KVM does with them, or why they count where they do.
    pub note: &'static str,
}

/// The fields of a `kvm_exit` record the tables read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitFields {
    /// `exit_reason`.
    pub exit_reason: u32,
    /// `info1`.
    pub info1: u64,
    /// `intr_info`.
    pub intr_info: u32,
}

impl ExitFields {
    /// The value of `field`.
    pub const fn get(&self, field: ExitField) -> u64 {
        match field {
            ExitField::IntrInfo => self.intr_info as u64,
            ExitField::Info1 => self.info1,
        }
    }
}

use Counted::{Added as A, Exit as E, Tracepoint as T};
use InterceptClass as C;

const fn row(
    first: u64,
    last: u64,
    name: &'static str,
    class: InterceptClass,
    counted: Counted,
    note: &'static str,
) -> ExitReasonRow {
    ExitReasonRow { first, last, name, when: None, class, counted, note }
}

const fn one(
    reason: u64,
    name: &'static str,
    class: InterceptClass,
    counted: Counted,
    note: &'static str,
) -> ExitReasonRow {
    row(reason, reason, name, class, counted, note)
}

const fn when(
    reason: u64,
    name: &'static str,
    condition: Condition,
    class: InterceptClass,
    counted: Counted,
    note: &'static str,
) -> ExitReasonRow {
    ExitReasonRow { first: reason, last: reason, name, when: Some(condition), class, counted, note }
}

/// `intr_info` of a VMX exception exit for a page fault: valid (bit 31), hardware exception
/// (type 3, bits 10:8), error code delivered (bit 11), vector 14.
pub const VMX_PAGE_FAULT_INTR_INFO: u32 = 0x8000_0b0e;
/// `intr_info` bit 12 of a VMX exception exit: NMI unblocking due to IRET. A #PF may carry it.
pub const VMX_INTR_INFO_UNBLOCK_NMI: u32 = 1 << 12;
/// The exit qualification of a VMX APIC-access exit for a linear write (access type 1, bits
/// 15:12) of the EOI register (offset 0xB0, bits 11:0).
pub const VMX_APIC_ACCESS_EOI_WRITE: u64 = 0x10b0;
/// EXITINFO1 of an SVM AVIC unaccelerated access that is a write (bit 32) of the EOI register
/// (offset 0xB0, bits 11:4).
pub const SVM_AVIC_EOI_WRITE: u64 = (1 << 32) | 0xb0;

const VMX_PAGE_FAULT: Condition = Condition {
    field: ExitField::IntrInfo,
    values: &[VMX_PAGE_FAULT_INTR_INFO as u64, (VMX_PAGE_FAULT_INTR_INFO | VMX_INTR_INFO_UNBLOCK_NMI) as u64],
    meaning: "vector 14 (#PF), with or without NMI unblocking (bit 12)",
};
const VMX_FAST_EOI: Condition = Condition {
    field: ExitField::Info1,
    values: &[VMX_APIC_ACCESS_EOI_WRITE],
    meaning: "a linear write of the EOI register (offset 0xB0)",
};
const SVM_AVIC_EOI: Condition = Condition {
    field: ExitField::Info1,
    values: &[SVM_AVIC_EOI_WRITE],
    meaning: "a write (bit 32) of the EOI register (offset 0xB0)",
};

const NO_HANDLER: &str = "KVM never asks for it and has no handler: an unexpected exit";
const NESTED: &str = "a VMX instruction of a nested hypervisor";
const SVM_NESTED: &str = "an SVM instruction of a nested hypervisor";
const FAILED_ENTRY: &str =
    "a failed VM entry (with bit 31, which makes it Other whatever the basic reason): KVM_EXIT_FAIL_ENTRY";

/// The VMX basic exit reasons Linux defines (`vmx.h`), each with its class. A page-fault
/// exception is reason 0 with a #PF `intr_info`; every other exception or NMI is "other".
pub const VMX: &[ExitReasonRow] = &[
    when(
        0,
        "EXCEPTION_NMI",
        VMX_PAGE_FAULT,
        C::PageFault,
        E,
        "a guest #PF KVM intercepts: shadow paging, or EPT with a guest MAXPHYADDR below the host's",
    ),
    one(
        0,
        "EXCEPTION_NMI",
        C::Other,
        E,
        "every other exception KVM intercepts (#UD, #DB, #BP, #AC, #MC, …) and host NMIs",
    ),
    one(1, "EXTERNAL_INTERRUPT", C::ExternalInterrupt, E, "a host interrupt (KVM's irq_exits)"),
    one(2, "TRIPLE_FAULT", C::Other, E, "the guest shut down (KVM_EXIT_SHUTDOWN)"),
    one(3, "INIT_SIGNAL", C::Other, E, NO_HANDLER),
    one(4, "SIPI_SIGNAL", C::Other, E, NO_HANDLER),
    one(
        7,
        "INTERRUPT_WINDOW",
        C::PendingInterrupt,
        E,
        "the guest can take a pending interrupt (KVM's irq_window_exits)",
    ),
    one(8, "NMI_WINDOW", C::PendingInterrupt, E, "the guest can take a pending NMI (KVM's nmi_window_exits)"),
    one(9, "TASK_SWITCH", C::Other, E, "a hardware task switch, emulated"),
    one(10, "CPUID", C::Cpuid, T("kvm_cpuid"), "handled in the kernel"),
    one(12, "HLT", C::Halt, E, "KVM's halt_exits"),
    one(13, "INVD", C::Other, E, "emulated as WBINVD"),
    one(14, "INVLPG", C::PageInvalidation, E, "intercepted under shadow paging only"),
    one(15, "RDPMC", C::Other, E, "the virtual PMU"),
    one(16, "RDTSC", C::Other, E, NO_HANDLER),
    one(18, "VMCALL", C::Hypercall, E, "KVM's hypercalls (its own, Hyper-V's, Xen's)"),
    row(19, 27, "VMCLEAR … VMXON", C::Other, E, NESTED),
    one(28, "CR_ACCESS", C::ControlRegister, T("kvm_cr"), "MOV to or from CR0, CR3, CR4, CR8, CLTS, LMSW"),
    one(29, "DR_ACCESS", C::DebugRegister, E, "MOV to or from a debug register"),
    one(30, "IO_INSTRUCTION", C::Io, T("kvm_pio"), "in the kernel or passed to the VMM"),
    one(
        31,
        "MSR_READ",
        C::Msr,
        T("kvm_msr"),
        "in the kernel; the VMM's MSR exits are added from kvm_userspace_exit",
    ),
    one(32, "MSR_WRITE", C::Msr, T("kvm_msr"), "as MSR_READ; x2APIC EOI and TPR writes count there too"),
    one(33, "INVALID_STATE", C::Other, E, FAILED_ENTRY),
    one(34, "MSR_LOAD_FAIL", C::Other, E, FAILED_ENTRY),
    one(36, "MWAIT_INSTRUCTION", C::Mwait, E, "emulated as a NOP"),
    one(37, "MONITOR_TRAP_FLAG", C::Other, E, "single-stepping (a debugger, or a nested hypervisor)"),
    one(39, "MONITOR_INSTRUCTION", C::Other, E, "MONITOR only arms the wait: not an MWAIT instruction"),
    one(40, "PAUSE_INSTRUCTION", C::Other, E, "pause-loop exiting: a spinning vCPU"),
    one(41, "MCE_DURING_VMENTRY", C::Other, E, FAILED_ENTRY),
    one(
        43,
        "TPR_BELOW_THRESHOLD",
        C::ApicTpr,
        A,
        "a TPR write the TPR shadow took, below the threshold: kvm_mmio and kvm_msr do not fire",
    ),
    when(
        44,
        "APIC_ACCESS",
        VMX_FAST_EOI,
        C::ApicEoi,
        A,
        "an EOI KVM completes without emulating it (kvm_intel.fasteoi, the default): kvm_mmio does not fire",
    ),
    one(44, "APIC_ACCESS", C::ApicAccess, T("kvm_mmio"), "emulated: kvm_mmio on the APIC page"),
    one(
        45,
        "EOI_INDUCED",
        C::ApicEoi,
        A,
        "an EOI APICv virtualized that KVM must see (level-triggered): kvm_mmio and kvm_msr do not fire",
    ),
    row(46, 47, "GDTR_IDTR, LDTR_TR", C::Other, E, "descriptor-table exiting (UMIP emulation)"),
    one(48, "EPT_VIOLATION", C::NestedPageFault, E, "a guest-physical access EPT does not allow (yet)"),
    one(49, "EPT_MISCONFIG", C::NestedPageFault, E, "KVM's MMIO: a guest-physical address without memory"),
    one(50, "INVEPT", C::Other, E, NESTED),
    one(51, "RDTSCP", C::Other, E, NO_HANDLER),
    one(52, "PREEMPTION_TIMER", C::Other, E, "KVM's own deadline: the guest's APIC timer, or a forced exit"),
    one(53, "INVVPID", C::Other, E, NESTED),
    one(54, "WBINVD", C::Other, E, "emulated"),
    one(55, "XSETBV", C::Other, E, "emulated"),
    one(
        56,
        "APIC_WRITE",
        C::ApicAccess,
        A,
        "a write to an APIC register APICv virtualized and KVM completes: kvm_mmio does not fire",
    ),
    one(57, "RDRAND", C::Other, E, "#UD injected"),
    one(58, "INVPCID", C::PageInvalidation, E, "emulated"),
    one(59, "VMFUNC", C::Other, E, NESTED),
    one(60, "ENCLS", C::Other, E, "SGX"),
    one(61, "RDSEED", C::Other, E, "#UD injected"),
    one(62, "PML_FULL", C::Other, E, "dirty-page logging"),
    one(63, "XSAVES", C::Other, E, NO_HANDLER),
    one(64, "XRSTORS", C::Other, E, NO_HANDLER),
    one(67, "UMWAIT", C::Mwait, E, "an MWAIT-like wait; KVM never asks for it"),
    one(68, "TPAUSE", C::Mwait, E, "an MWAIT-like wait; KVM never asks for it"),
    one(
        74,
        "BUS_LOCK",
        C::Other,
        E,
        "a bus lock of the guest (KVM_EXIT_X86_BUS_LOCK); any other exit may carry one as bit 26",
    ),
    one(75, "NOTIFY", C::Other, E, "the notify window expired"),
    one(76, "SEAMCALL", C::Other, E, "#UD injected"),
    one(77, "TDCALL", C::Other, E, "#UD injected"),
    one(84, "MSR_READ_IMM", C::Msr, T("kvm_msr"), "RDMSR with an immediate"),
    one(85, "MSR_WRITE_IMM", C::Msr, T("kvm_msr"), "WRMSRNS with an immediate"),
];

/// The SVM exit codes KVM handles (`svm_exit_handlers`, and `SVM_EXIT_ERR`), and the other codes
/// `svm.h` names, each with its class.
pub const SVM: &[ExitReasonRow] = &[
    row(
        0x000,
        0x00f,
        "READ_CR0 … READ_CR15",
        C::ControlRegister,
        T("kvm_cr"),
        "KVM intercepts CR0, CR3, CR4, CR8",
    ),
    row(
        0x010,
        0x01f,
        "WRITE_CR0 … WRITE_CR15",
        C::ControlRegister,
        T("kvm_cr"),
        "KVM intercepts CR0, CR3, CR4, CR8",
    ),
    row(0x020, 0x02f, "READ_DR0 … READ_DR15", C::DebugRegister, E, "DR0 to DR7"),
    row(0x030, 0x03f, "WRITE_DR0 … WRITE_DR15", C::DebugRegister, E, "DR0 to DR7"),
    one(0x041, "EXCP_BASE + #DB", C::Other, E, "a debug exception"),
    one(0x043, "EXCP_BASE + #BP", C::Other, E, "a breakpoint"),
    one(0x046, "EXCP_BASE + #UD", C::Other, E, "an invalid opcode, emulated"),
    one(0x04d, "EXCP_BASE + #GP", C::Other, E, "a general protection fault KVM looks at"),
    one(
        0x04e,
        "EXCP_BASE + #PF",
        C::PageFault,
        E,
        "a guest #PF KVM intercepts: shadow paging (npt=0), or a guest MAXPHYADDR below the host's",
    ),
    one(0x051, "EXCP_BASE + #AC", C::Other, E, "an alignment check"),
    one(0x052, "EXCP_BASE + #MC", C::Other, E, "a machine check"),
    one(0x060, "INTR", C::ExternalInterrupt, E, "a host interrupt (KVM's irq_exits)"),
    one(0x061, "NMI", C::Other, E, "a host NMI"),
    one(0x062, "SMI", C::Other, E, "a system management interrupt"),
    one(0x063, "INIT", C::Other, E, NO_HANDLER),
    one(
        0x064,
        "VINTR",
        C::PendingInterrupt,
        E,
        "the guest can take a pending interrupt (KVM's irq_window_exits)",
    ),
    one(0x065, "CR0_SEL_WRITE", C::ControlRegister, T("kvm_cr"), "a CR0 write changing more than TS or MP"),
    row(0x066, 0x06d, "IDTR_READ … TR_WRITE", C::Other, E, NO_HANDLER),
    one(0x06e, "RDTSC", C::Other, E, NO_HANDLER),
    one(0x06f, "RDPMC", C::Other, E, "the virtual PMU"),
    row(0x070, 0x071, "PUSHF, POPF", C::Other, E, NO_HANDLER),
    one(0x072, "CPUID", C::Cpuid, T("kvm_cpuid"), "handled in the kernel"),
    one(0x073, "RSM", C::Other, E, "leaving SMM"),
    one(0x074, "IRET", C::Other, E, "NMI blocking tracked through IRET"),
    one(0x075, "SWINT", C::Other, E, NO_HANDLER),
    one(0x076, "INVD", C::Other, E, "emulated as WBINVD"),
    one(0x077, "PAUSE", C::Other, E, "pause-loop exiting: a spinning vCPU"),
    one(0x078, "HLT", C::Halt, E, "KVM's halt_exits"),
    one(0x079, "INVLPG", C::PageInvalidation, E, "intercepted under shadow paging only"),
    one(0x07a, "INVLPGA", C::PageInvalidation, E, "a nested hypervisor's"),
    one(0x07b, "IOIO", C::Io, T("kvm_pio"), "in the kernel or passed to the VMM"),
    one(
        0x07c,
        "MSR",
        C::Msr,
        T("kvm_msr"),
        "RDMSR and WRMSR; the VMM's MSR exits are added from kvm_userspace_exit",
    ),
    one(0x07d, "TASK_SWITCH", C::Other, E, "a hardware task switch, emulated"),
    one(0x07e, "FERR_FREEZE", C::Other, E, NO_HANDLER),
    one(0x07f, "SHUTDOWN", C::Other, E, "the guest shut down (KVM_EXIT_SHUTDOWN)"),
    one(0x080, "VMRUN", C::Other, E, SVM_NESTED),
    one(0x081, "VMMCALL", C::Hypercall, E, "KVM's hypercalls (its own, Hyper-V's, Xen's)"),
    row(0x082, 0x086, "VMLOAD, VMSAVE, STGI, CLGI, SKINIT", C::Other, E, SVM_NESTED),
    one(0x087, "RDTSCP", C::Other, E, "#UD injected"),
    one(0x088, "ICEBP", C::Other, E, NO_HANDLER),
    one(0x089, "WBINVD", C::Other, E, "emulated"),
    one(0x08a, "MONITOR", C::Other, E, "MONITOR only arms the wait: not an MWAIT instruction"),
    one(0x08b, "MWAIT", C::Mwait, E, "emulated as a NOP"),
    one(0x08c, "MWAIT_COND", C::Mwait, E, NO_HANDLER),
    one(0x08d, "XSETBV", C::Other, E, "emulated"),
    one(0x08e, "RDPRU", C::Other, E, "#UD injected"),
    one(0x08f, "EFER_WRITE_TRAP", C::Msr, A, "SEV-ES: the guest wrote EFER (an MSR); kvm_msr does not fire"),
    row(
        0x090,
        0x09f,
        "CR0_WRITE_TRAP … CR15_WRITE_TRAP",
        C::ControlRegister,
        A,
        "SEV-ES: CR0, CR4, CR8 written, after the fact; kvm_cr does not fire",
    ),
    one(0x0a2, "INVPCID", C::PageInvalidation, E, "emulated"),
    one(0x0a5, "BUS_LOCK", C::Other, E, "a bus lock of the guest (KVM_EXIT_X86_BUS_LOCK)"),
    one(0x0a6, "IDLE_HLT", C::Halt, E, "HLT with no interrupt pending (the idle-HLT intercept)"),
    one(0x400, "NPF", C::NestedPageFault, E, "a nested page fault, KVM's MMIO among them"),
    one(
        0x401,
        "AVIC_INCOMPLETE_IPI",
        C::ApicAccess,
        A,
        "an ICR write AVIC could not deliver alone: kvm_mmio and kvm_msr do not fire",
    ),
    when(
        0x402,
        "AVIC_UNACCELERATED_ACCESS",
        SVM_AVIC_EOI,
        C::ApicEoi,
        A,
        "an EOI AVIC leaves to KVM (level-triggered): kvm_mmio does not fire",
    ),
    one(
        0x402,
        "AVIC_UNACCELERATED_ACCESS",
        C::ApicAccess,
        T("kvm_mmio, kvm_avic_unaccelerated_access"),
        "a fault is emulated (kvm_mmio); a trap-like write is counted from kvm_avic_unaccelerated_access",
    ),
    one(
        0x403,
        "VMGEXIT",
        C::Other,
        E,
        "SEV-ES and SNP: a request through the GHCB, whose reason kvm_exit does not show",
    ),
    one(SVM_EXIT_ERR as u64, "ERR", C::Other, E, "VMRUN found invalid guest state: KVM_EXIT_FAIL_ENTRY"),
];

/// The table of `kvm_exit`'s `isa` value ([`ISA_VMX`] or [`ISA_SVM`]).
pub const fn table(isa: u32) -> Option<&'static [ExitReasonRow]> {
    match isa {
        ISA_VMX => Some(VMX),
        ISA_SVM => Some(SVM),
        _ => None,
    }
}

impl ExitReasonRow {
    /// True when reason `r` (a VMX basic reason) is in the row's range.
    pub const fn contains(&self, r: u64) -> bool {
        self.first <= r && r <= self.last
    }

    /// True when the record meets the row's condition (or the row has none).
    pub fn admits(&self, fields: &ExitFields) -> bool {
        self.when.is_none_or(|c| c.values.contains(&fields.get(c.field)))
    }
}

/// The reason a table's rows name: VMX's basic reason when its flags leave it its meaning
/// (`None` for a failed entry or any other flag), SVM's code as it is.
pub const fn basic_reason(isa: u32, exit_reason: u32) -> Option<u64> {
    match isa {
        ISA_VMX if exit_reason & !(VMX_BASIC_REASON | VMX_KEPT_FLAGS) != 0 => None,
        ISA_VMX => Some((exit_reason & VMX_BASIC_REASON) as u64),
        ISA_SVM => Some(exit_reason as u64),
        _ => None,
    }
}

/// The row an exit of `isa` falls in (the reference the filters are tested against): a row
/// whose condition the record meets before a row of the same reason without one; `None` when no
/// row takes it (it is Other).
pub fn row_of(isa: u32, fields: &ExitFields) -> Option<&'static ExitReasonRow> {
    let rows = table(isa)?;
    let reason = basic_reason(isa, fields.exit_reason)?;
    rows.iter()
        .find(|r| r.contains(reason) && r.when.is_some() && r.admits(fields))
        .or_else(|| rows.iter().find(|r| r.contains(reason) && r.when.is_none()))
}

/// The class of an exit of `isa`.
pub fn class_of(isa: u32, fields: &ExitFields) -> InterceptClass {
    row_of(isa, fields).map_or(InterceptClass::Other, |r| r.class)
}

#[cfg(test)]
/// The name of a VMX basic exit reason or SVM exit code, when the table names it.
pub(crate) fn reason_name(isa: u32, reason: u64) -> Option<&'static str> {
    let rows = table(isa)?;
    rows.iter().find(|r| r.contains(reason)).map(|r| r.name)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::collections::BTreeSet;

    use super::*;

    fn exit(exit_reason: u32) -> ExitFields {
        ExitFields { exit_reason, ..ExitFields::default() }
    }

    #[test]
    fn vmx_reasons_fall_in_their_classes_with_or_without_the_kept_flags() {
        let class = |reason| class_of(ISA_VMX, &exit(reason));
        assert_eq!(class(10), C::Cpuid);
        assert_eq!(class(12), C::Halt);
        assert_eq!(class(12 | VMX_BUS_LOCK_DETECTED), C::Halt);
        assert_eq!(class(12 | VMX_ENCLAVE_MODE), C::Halt);
        assert_eq!(class(12 | VMX_KEPT_FLAGS), C::Halt);
        assert_eq!(class(45), C::ApicEoi);
        assert_eq!(class(56), C::ApicAccess);
        assert_eq!(class(43), C::ApicTpr);
        assert_eq!(class(48), C::NestedPageFault);
        assert_eq!(class(49), C::NestedPageFault);
        assert_eq!(class(39), C::Other, "MONITOR is not an MWAIT instruction");
        assert_eq!(class(200), C::Other);
        // A failed VM entry is not its basic reason's intercept, whatever the reason.
        assert_eq!(class(0x8000_000a), C::Other);
        assert_eq!(class(0x8000_0021), C::Other);
        // Nor is an exit with a flag hvstats does not know.
        assert_eq!(class(0x1000_000a), C::Other);
        let pf = |intr_info| class_of(ISA_VMX, &ExitFields { exit_reason: 0, intr_info, info1: 0 });
        assert_eq!(pf(0x8000_0b0e), C::PageFault);
        assert_eq!(pf(0x8000_1b0e), C::PageFault, "NMI unblocking (bit 12)");
        assert_eq!(pf(0x8000_0306), C::Other, "#UD");
        assert_eq!(pf(0x8000_0202), C::Other, "an NMI");
        let apic = |info1| class_of(ISA_VMX, &ExitFields { exit_reason: 44, intr_info: 0, info1 });
        assert_eq!(apic(0x10b0), C::ApicEoi, "a linear EOI write, completed without emulation");
        assert_eq!(apic(0x00b0), C::ApicAccess, "a read of EOI is emulated");
        assert_eq!(apic(0x1080), C::ApicAccess, "a TPR write is emulated");
    }

    #[test]
    fn svm_codes_fall_in_their_classes_and_exit_err_is_other() {
        let class = |code| class_of(ISA_SVM, &exit(code));
        assert_eq!(class(0x072), C::Cpuid);
        assert_eq!(class(0x078), C::Halt);
        assert_eq!(class(0x0a6), C::Halt);
        assert_eq!(class(0x013), C::ControlRegister);
        assert_eq!(class(0x094), C::ControlRegister);
        assert_eq!(class(0x08f), C::Msr);
        assert_eq!(class(0x025), C::DebugRegister);
        assert_eq!(class(0x04e), C::PageFault);
        assert_eq!(class(0x046), C::Other);
        assert_eq!(class(0x400), C::NestedPageFault);
        assert_eq!(class(0x401), C::ApicAccess);
        assert_eq!(class(0x402), C::ApicAccess);
        assert_eq!(
            class_of(ISA_SVM, &ExitFields { exit_reason: 0x402, info1: SVM_AVIC_EOI_WRITE, intr_info: 0 }),
            C::ApicEoi
        );
        assert_eq!(class(SVM_EXIT_ERR), C::Other);
        assert_eq!(class(0x8000_0001), C::Other, "a GHCB code is not a VMCB exit code");
        // SVM has no flags: a code with high bits is another code.
        assert_eq!(class(0x0400_0078), C::Other);
    }

    #[test]
    fn rows_are_sorted_and_only_a_conditional_row_shares_its_reason() {
        for rows in [VMX, SVM] {
            for pair in rows.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                assert!(a.first <= a.last, "{a:?}");
                let shared = a.first == b.first && a.last == b.last && a.when.is_some() && b.when.is_none();
                assert!(a.last < b.first || shared, "{a:?} overlaps {b:?}");
                assert!(a.when.is_none() || a.first == a.last, "a condition is on one reason: {a:?}");
            }
            for r in rows {
                assert!(r.last <= u64::from(u32::MAX), "{r:?}");
            }
        }
        for r in VMX {
            assert!(r.last <= u64::from(VMX_BASIC_REASON), "{r:?}");
        }
    }

    #[test]
    fn every_class_but_other_has_exits_on_both_architectures_or_is_known_not_to() {
        for (isa, missing) in [(ISA_VMX, &[][..]), (ISA_SVM, &[C::ApicTpr][..])] {
            let present: BTreeSet<_> = table(isa).unwrap().iter().map(|r| r.class).collect();
            for class in InterceptClass::EXITS {
                assert_eq!(present.contains(&class), !missing.contains(&class), "{class:?}");
            }
        }
    }

    #[test]
    fn added_and_tracepoint_rows_are_of_classes_a_tracepoint_counts_and_exit_rows_are_not() {
        // The classes whose counter comes from a tracepoint (catalog keys, checked in the catalog
        // against these): their rows are counted by it or added to it; every other class's rows
        // are counted from kvm_exit.
        let by_tracepoint =
            [C::ControlRegister, C::Io, C::Cpuid, C::Msr, C::ApicAccess, C::ApicEoi, C::ApicTpr];
        for r in VMX.iter().chain(SVM) {
            match r.counted {
                Counted::Exit => assert!(!by_tracepoint.contains(&r.class), "{r:?}"),
                Counted::Tracepoint(_) | Counted::Added => assert!(by_tracepoint.contains(&r.class), "{r:?}"),
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
        assert_eq!(reason_name(ISA_SVM, 0x011), Some("WRITE_CR0 … WRITE_CR15"));
        assert_eq!(reason_name(ISA_SVM, u64::from(SVM_EXIT_ERR)), Some("ERR"));
        assert_eq!(reason_name(3, 10), None);
    }
}
