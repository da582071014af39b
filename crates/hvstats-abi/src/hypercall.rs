//! The hypercall ABI: the codes, and the stats calls' input and result values and input blocks.
//!
//! The codes are one table ([`HYPERCALLS`]): each code's TLFS name, the seed 001 class it is counted
//! under, what else it feeds (the TLB flush counters), and how KVM's Hyper-V emulation handles it.
//! Our own partitions' run loop classifies the hypercalls it serves with it, the observer of VMs
//! on KVM classifies `kvm:kvm_hv_hypercall` records with it, and `docs/hyperv-hypercalls.md` is
//! rendered from it (by the `hypercall_page` module, which also reads the catalog's counter
//! names, so the arrow goes from the page to the table and never back).

use core::fmt;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::object::{StatsObjectIdentity, StatsObjectType};
use crate::status::HvStatus;

/// A hypercall code (open enum).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(transparent)]
pub struct HypercallCode(pub u16);

/// The seed 001 class a hypercall is counted under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HypercallClass {
    /// GPA space hypercalls (mapping pages into a partition's GPA space).
    GpaSpace,
    /// Logical processor hypercalls.
    LogicalProcessor,
    /// Long spin wait notifications.
    LongSpinWait,
    /// Synthetic interrupt controller hypercalls.
    SyntheticInterrupt,
    /// Virtual interrupt hypercalls.
    VirtualInterrupt,
    /// Virtual MMU hypercalls (address space switches and flushes).
    VirtualMmu,
    /// Virtual processor hypercalls.
    VirtualProcessor,
    /// Everything else, unknown codes included.
    Other,
}

impl HypercallClass {
    /// Every class.
    pub const ALL: [HypercallClass; 8] = [
        HypercallClass::GpaSpace,
        HypercallClass::LogicalProcessor,
        HypercallClass::LongSpinWait,
        HypercallClass::SyntheticInterrupt,
        HypercallClass::VirtualInterrupt,
        HypercallClass::VirtualMmu,
        HypercallClass::VirtualProcessor,
        HypercallClass::Other,
    ];
}

/// What a hypercall adds besides one to its class's counter, where KVM emulates it and traces the
/// work in a tracepoint of its own (`arch/x86/kvm/hyperv.c`; `docs/hyperv-hypercalls.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HypercallEffect {
    /// Its class's counter only.
    ClassOnly,
    /// A flush of one address space (`kvm:kvm_hv_flush_tlb`/`_ex` follows, with the call's
    /// `flags`): one Address space flush, or one Address domain flush (the whole virtual TLB) when
    /// the flags hold [`flush_flags::ALL_VIRTUAL_ADDRESS_SPACES`].
    AddressSpaceFlush,
    /// A flush of a list of GVA ranges, one range per rep element (the hypercall record's
    /// `rep_cnt`; `kvm:kvm_hv_flush_tlb`/`_ex` follows with the call's `flags`): that many Local
    /// flushed GVA ranges, or Global GVA range flushes when the flags hold
    /// [`flush_flags::ALL_VIRTUAL_ADDRESS_SPACES`].
    GvaRangeFlush,
    /// A synthetic cluster IPI (`kvm:kvm_hv_send_ipi`/`_ex` follows). No seed 001 counter counts
    /// the sends; the interrupts it delivers are Virtual interrupts of their targets.
    SyntheticIpi,
}

/// The `Flags` of the TLB flush hypercalls (TLFS `HvCallFlushVirtualAddressSpace`; Linux
/// `HV_FLUSH_*`), as `kvm:kvm_hv_flush_tlb`/`_ex` record them.
pub mod flush_flags {
    /// Bit 0: flush on every VP (the processor mask is ignored).
    pub const ALL_PROCESSORS: u64 = 1 << 0;
    /// Bit 1: flush every address space, not only the one named.
    pub const ALL_VIRTUAL_ADDRESS_SPACES: u64 = 1 << 1;
    /// Bit 2: flush non-global mappings only.
    pub const NON_GLOBAL_MAPPINGS_ONLY: u64 = 1 << 2;
    /// Bit 3: the GVA ranges are in the extended range format.
    pub const USE_EXTENDED_RANGE_FORMAT: u64 = 1 << 3;
}

/// A kernel release whose `arch/x86/kvm/hyperv.c` the table was checked against, oldest first
/// (the trees: `hypercall_page`'s `CHECKED_KERNELS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelRelease {
    /// Linux 5.15 (LTS).
    V5_15,
    /// Linux 6.1 (LTS).
    V6_1,
    /// Linux 6.6 (LTS).
    V6_6,
    /// Linux 6.12 (LTS).
    V6_12,
}

impl KernelRelease {
    /// Every checked release, oldest first.
    pub const ALL: [KernelRelease; 4] =
        [KernelRelease::V5_15, KernelRelease::V6_1, KernelRelease::V6_6, KernelRelease::V6_12];

    /// `5.15`, `6.1`, `6.6`, `6.12`.
    pub const fn name(self) -> &'static str {
        match self {
            KernelRelease::V5_15 => "5.15",
            KernelRelease::V6_1 => "6.1",
            KernelRelease::V6_6 => "6.6",
            KernelRelease::V6_12 => "6.12",
        }
    }
}

/// Where KVM's `kvm_hv_hypercall` completes a code it knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvmPath {
    /// In the kernel.
    Kernel,
    /// In the VMM: `KVM_EXIT_HYPERV` of type `KVM_EXIT_HYPERV_HCALL`, completed (and
    /// `kvm_hv_hypercall_done` traced) when the VMM enters the vCPU again.
    Vmm,
    /// In the kernel when an eventfd is bound to the connection id, else (`INVALID_PORT_ID`) in
    /// the VMM as [`KvmPath::Vmm`].
    EventfdOrVmm,
    /// In the VMM when SynDbg is enabled and uses hypercalls; else `INVALID_HYPERCALL_CODE`
    /// (SynDbg off) or `OPERATION_DENIED`, in the kernel.
    SynDbgVmm,
}

/// How KVM handles a code, and the oldest checked release that does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvmEmulation {
    /// Where the call completes.
    pub path: KvmPath,
    /// The oldest checked release that handles the code (every newer one does too).
    pub since: KernelRelease,
}

const fn kvm(path: KvmPath, since: KernelRelease) -> Option<KvmEmulation> {
    Some(KvmEmulation { path, since })
}

/// A code hvstats' own partitions serve or classify but KVM answers with
/// `HV_STATUS_INVALID_HYPERCALL_CODE`.
const NOT_IN_KVM: Option<KvmEmulation> = None;

/// The extended hypercalls KVM hands to the VMM, whatever their name: `HV_EXT_CALL_QUERY_CAPABILITIES
/// ..= HV_EXT_CALL_MAX` (0x8001 + 64) in `kvm_hv_hypercall`, since 6.6 among the checked releases.
pub const KVM_EXTENDED_CALLS: (HypercallCode, HypercallCode, KvmEmulation) = (
    HypercallCode(0x8001),
    HypercallCode(0x8041),
    KvmEmulation { path: KvmPath::Vmm, since: KernelRelease::V6_6 },
);

/// One row of the hypercall table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HypercallRow {
    /// The call code.
    pub code: HypercallCode,
    /// The TLFS name.
    pub name: &'static str,
    /// The seed 001 class it is counted under.
    pub class: HypercallClass,
    /// What else it feeds.
    pub effect: HypercallEffect,
    /// The `kvm:` tracepoint that records the work of the call where KVM does it (fired after
    /// `kvm_hv_hypercall`, once the input is read), if any.
    pub record: Option<&'static str>,
    /// How KVM handles it; `None` where KVM answers `HV_STATUS_INVALID_HYPERCALL_CODE`.
    pub kvm: Option<KvmEmulation>,
    /// Where the TLFS documents it (a page of the TLFS, `tlfs/` in
    /// MicrosoftDocs/Virtualization-Documentation), which gives its class.
    pub tlfs: &'static str,
}

macro_rules! hypercall_codes {
    ($($name:ident = $value:literal, $tlfs:literal, $class:ident, $effect:ident, $record:expr,
        $kvm:expr, $section:literal;)*) => {
        impl HypercallCode {
            $(
                #[doc = $tlfs]
                pub const $name: Self = Self($value);
            )*

            /// The TLFS name of a known code.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($value => Some($tlfs),)*
                    _ => None,
                }
            }

            /// The class this code is counted under.
            pub const fn class(self) -> HypercallClass {
                match self.0 {
                    $($value => HypercallClass::$class,)*
                    _ => HypercallClass::Other,
                }
            }

            /// What this code adds besides its class's counter.
            pub const fn effect(self) -> HypercallEffect {
                match self.0 {
                    $($value => HypercallEffect::$effect,)*
                    _ => HypercallEffect::ClassOnly,
                }
            }

            /// How KVM handles this code (`None`: `HV_STATUS_INVALID_HYPERCALL_CODE`).
            pub const fn kvm(self) -> Option<KvmEmulation> {
                let (first, last, ext) = KVM_EXTENDED_CALLS;
                match self.0 {
                    $($value => $kvm,)*
                    c if c >= first.0 && c <= last.0 => Some(ext),
                    _ => None,
                }
            }
        }

        /// Every named code, in code order: the one table of hypercall codes, their TLFS names,
        /// seed 001 classes, further counters and KVM's handling (`docs/hyperv-hypercalls.md` is
        /// rendered from it by `hypercall_page`'s `write_markdown`).
        pub const HYPERCALLS: &[HypercallRow] = &[
            $(HypercallRow {
                code: HypercallCode($value),
                name: $tlfs,
                class: HypercallClass::$class,
                effect: HypercallEffect::$effect,
                record: $record,
                kvm: $kvm,
                tlfs: $section,
            },)*
        ];
    };
}

use KernelRelease::{V5_15, V6_6};

hypercall_codes! {
    SWITCH_VIRTUAL_ADDRESS_SPACE = 0x0001, "HvCallSwitchVirtualAddressSpace", VirtualMmu, ClassOnly,
        None, NOT_IN_KVM, "virtual-mmu.md";
    FLUSH_VIRTUAL_ADDRESS_SPACE = 0x0002, "HvCallFlushVirtualAddressSpace", VirtualMmu, AddressSpaceFlush,
        Some("kvm_hv_flush_tlb"), kvm(KvmPath::Kernel, V5_15), "virtual-mmu.md";
    FLUSH_VIRTUAL_ADDRESS_LIST = 0x0003, "HvCallFlushVirtualAddressList", VirtualMmu, GvaRangeFlush,
        Some("kvm_hv_flush_tlb"), kvm(KvmPath::Kernel, V5_15), "virtual-mmu.md";
    GET_LOGICAL_PROCESSOR_RUN_TIME = 0x0004, "HvCallGetLogicalProcessorRunTime", LogicalProcessor, ClassOnly,
        None, NOT_IN_KVM, "none (HvGuestHypercall.h: V1 Power Management and Run time metrics IDs)";
    NOTIFY_LONG_SPIN_WAIT = 0x0008, "HvCallNotifyLongSpinWait", LongSpinWait, ClassOnly,
        None, kvm(KvmPath::Kernel, V5_15), "vp-properties.md (Guest Spinlocks)";
    SEND_SYNTHETIC_CLUSTER_IPI = 0x000B, "HvCallSendSyntheticClusterIpi", VirtualInterrupt, SyntheticIpi,
        Some("kvm_hv_send_ipi"), kvm(KvmPath::Kernel, V5_15), "virtual-interrupts.md (Synthetic Cluster IPI)";
    FLUSH_VIRTUAL_ADDRESS_SPACE_EX = 0x0013, "HvCallFlushVirtualAddressSpaceEx", VirtualMmu,
        AddressSpaceFlush,
        Some("kvm_hv_flush_tlb_ex"), kvm(KvmPath::Kernel, V5_15), "virtual-mmu.md";
    FLUSH_VIRTUAL_ADDRESS_LIST_EX = 0x0014, "HvCallFlushVirtualAddressListEx", VirtualMmu, GvaRangeFlush,
        Some("kvm_hv_flush_tlb_ex"), kvm(KvmPath::Kernel, V5_15), "virtual-mmu.md";
    SEND_SYNTHETIC_CLUSTER_IPI_EX = 0x0015, "HvCallSendSyntheticClusterIpiEx", VirtualInterrupt, SyntheticIpi,
        Some("kvm_hv_send_ipi_ex"), kvm(KvmPath::Kernel, V5_15),
        "virtual-interrupts.md (Synthetic Cluster IPI)";
    GET_PARTITION_ID = 0x0046, "HvCallGetPartitionId", Other, ClassOnly,
        None, NOT_IN_KVM, "datatypes/hv_partition_privilege_mask.md (AccessPartitionId)";
    MAP_GPA_PAGES = 0x004B, "HvCallMapGpaPages", GpaSpace, ClassOnly,
        None, NOT_IN_KVM, "hypercalls/HvCallMapGpaPages.md";
    UNMAP_GPA_PAGES = 0x004C, "HvCallUnmapGpaPages", GpaSpace, ClassOnly,
        None, NOT_IN_KVM, "hypercalls/HvCallUnmapGpaPages.md";
    GET_VP_REGISTERS = 0x0050, "HvCallGetVpRegisters", VirtualProcessor, ClassOnly,
        None, NOT_IN_KVM, "hypercalls/HvCallGetVpRegisters.md";
    SET_VP_REGISTERS = 0x0051, "HvCallSetVpRegisters", VirtualProcessor, ClassOnly,
        None, NOT_IN_KVM, "hypercalls/HvCallSetVpRegisters.md";
    POST_MESSAGE = 0x005C, "HvCallPostMessage", SyntheticInterrupt, ClassOnly,
        None, kvm(KvmPath::Vmm, V5_15), "inter-partition-communication.md (SynIC Messages)";
    SIGNAL_EVENT = 0x005D, "HvCallSignalEvent", SyntheticInterrupt, ClassOnly,
        None, kvm(KvmPath::EventfdOrVmm, V5_15), "inter-partition-communication.md (SynIC Event Flags)";
    POST_DEBUG_DATA = 0x0069, "HvCallPostDebugData", Other, ClassOnly,
        None, kvm(KvmPath::SynDbgVmm, V5_15), "none (HvGuestHypercall.h: V1 Dbg Call IDs)";
    RETRIEVE_DEBUG_DATA = 0x006A, "HvCallRetrieveDebugData", Other, ClassOnly,
        None, kvm(KvmPath::SynDbgVmm, V5_15), "none (HvGuestHypercall.h: V1 Dbg Call IDs)";
    RESET_DEBUG_SESSION = 0x006B, "HvCallResetDebugSession", Other, ClassOnly,
        None, kvm(KvmPath::SynDbgVmm, V5_15), "none (HvGuestHypercall.h: V1 Dbg Call IDs)";
    MAP_STATS_PAGE = 0x006C, "HvCallMapStatsPage", GpaSpace, ClassOnly,
        None, NOT_IN_KVM, "hypercalls/HvCallMapStatsPage2.md";
    UNMAP_STATS_PAGE = 0x006D, "HvCallUnmapStatsPage", GpaSpace, ClassOnly,
        None, NOT_IN_KVM, "hypercalls/HvCallUnmapStatsPage.md";
    MAP_STATS_PAGE2 = 0x0131, "HvCallMapStatsPage2", GpaSpace, ClassOnly,
        None, NOT_IN_KVM, "hypercalls/HvCallMapStatsPage2.md";
    EXT_QUERY_CAPABILITIES = 0x8001, "HvExtCallQueryCapabilities", Other, ClassOnly,
        None, kvm(KvmPath::Vmm, V6_6), "hypercall-interface.md (Extended Hypercall Interface)";
    EXT_GET_BOOT_ZEROED_MEMORY = 0x8002, "HvExtCallGetBootZeroedMemory", Other, ClassOnly,
        None, kvm(KvmPath::Vmm, V6_6), "hypercall-interface.md (Extended Hypercall Interface)";
    EXT_MEMORY_HEAT_HINT = 0x8003, "HvExtCallMemoryHeatHint", Other, ClassOnly,
        None, kvm(KvmPath::Vmm, V6_6), "hypercall-interface.md (Extended Hypercall Interface)";
    EXT_EPF_SETUP = 0x8004, "HvExtCallEpfSetup", Other, ClassOnly,
        None, kvm(KvmPath::Vmm, V6_6), "hypercall-interface.md (Extended Hypercall Interface)";
    EXT_MEMORY_HEAT_HINT_ASYNC = 0x8006, "HvExtCallMemoryHeatHintAsync", Other, ClassOnly,
        None, kvm(KvmPath::Vmm, V6_6), "hypercall-interface.md (Extended Hypercall Interface)";
}

impl fmt::Debug for HypercallCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}({:#06x})", self.0),
            None => write!(f, "HypercallCode({:#06x})", self.0),
        }
    }
}

/// `HV_PARTITION_ID_SELF`: the caller's own partition.
pub const HV_PARTITION_ID_SELF: u64 = u64::MAX;
/// `HV_VP_INDEX_SELF`: the calling VP.
pub const HV_VP_INDEX_SELF: u32 = 0xFFFF_FFFE;

/// The hypercall input value (RCX on x64).
///
/// Bits: 15:0 call code; 16 fast; 26:17 variable header size; 43:32 rep count; 59:48 rep start
/// index; 31:27, 47:44 and 63:60 reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct HypercallInput(pub u64);

impl HypercallInput {
    /// The reserved bits: 31:27, 47:44, 63:60.
    pub const RESERVED_MASK: u64 = (0x1F << 27) | (0xF << 44) | (0xF << 60);

    /// A simple (non-rep, memory-based) call of `code`.
    pub const fn simple(code: HypercallCode) -> Self {
        Self(code.0 as u64)
    }

    /// The call code.
    pub const fn code(self) -> HypercallCode {
        HypercallCode(self.0 as u16)
    }

    /// The fast bit (register-based input).
    pub const fn fast(self) -> bool {
        self.0 & (1 << 16) != 0
    }

    /// The variable header size, in 8-byte units.
    pub const fn variable_header_size(self) -> u16 {
        ((self.0 >> 17) & 0x3FF) as u16
    }

    /// Bits 43:32: how many elements a rep call processes (0 for a simple call).
    pub const fn rep_count(self) -> u16 {
        ((self.0 >> 32) & 0xFFF) as u16
    }

    /// Bits 59:48: the first element a rep call processes (nonzero when resuming).
    pub const fn rep_start(self) -> u16 {
        ((self.0 >> 48) & 0xFFF) as u16
    }

    /// The reserved bits that are set (zero when the value is well formed).
    pub const fn reserved(self) -> u64 {
        self.0 & Self::RESERVED_MASK
    }

    /// Sets bit 16 (fast: input in registers, not in a GPA page).
    pub const fn with_fast(self, fast: bool) -> Self {
        Self((self.0 & !(1 << 16)) | ((fast as u64) << 16))
    }

    /// Sets bits 43:32 to `count`, truncated to 12 bits.
    pub const fn with_rep_count(self, count: u16) -> Self {
        Self((self.0 & !(0xFFF << 32)) | (((count & 0xFFF) as u64) << 32))
    }

    /// Sets bits 59:48 to `start`, truncated to 12 bits.
    pub const fn with_rep_start(self, start: u16) -> Self {
        Self((self.0 & !(0xFFF << 48)) | (((start & 0xFFF) as u64) << 48))
    }

    /// Sets bits 26:17 to `size` (in 8-byte units), truncated to 10 bits.
    pub const fn with_variable_header_size(self, size: u16) -> Self {
        Self((self.0 & !(0x3FF << 17)) | (((size & 0x3FF) as u64) << 17))
    }
}

/// The hypercall result value (RAX on x64): status 15:0, reps completed 43:32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct HypercallOutput(pub u64);

impl HypercallOutput {
    /// A result with `status` and `reps_completed`.
    pub const fn new(status: HvStatus, reps_completed: u16) -> Self {
        Self(status.0 as u64 | (((reps_completed & 0xFFF) as u64) << 32))
    }

    /// Bits 15:0: the `HV_STATUS` of the call.
    pub const fn status(self) -> HvStatus {
        HvStatus(self.0 as u16)
    }

    /// Bits 43:32: how many rep elements completed (the rep start to resume from).
    pub const fn reps_completed(self) -> u16 {
        ((self.0 >> 32) & 0xFFF) as u16
    }
}

/// The layout of the HYPERCALL MSR (TLFS "Hypercall Page"): enable bit, locked bit, reserved
/// bits, and the GPA page of the hypercall page in bits 63:12.
pub mod hypercall_msr {
    /// Bit 0: the hypercall page is enabled.
    pub const ENABLE: u64 = 1 << 0;
    /// Bit 1: the MSR is locked (accepted and kept).
    pub const LOCKED: u64 = 1 << 1;
    /// Bits 11:2: reserved, must be zero.
    pub const RESERVED: u64 = 0xFFC;
    /// Bits 63:12: the hypercall page's GPA (page aligned).
    pub const GPA_MASK: u64 = !0xFFF;
}

/// Byte offsets in the input blocks of HvCallMapStatsPage(2) and HvCallUnmapStatsPage, for
/// guests that build them field by field.
pub mod map_input {
    use super::{MapStatsPageInput, UnmapStatsPageInput};

    /// `StatsType` (u32).
    pub const STATS_TYPE: usize = core::mem::offset_of!(MapStatsPageInput, stats_type);
    /// Padding (u32), must be zero.
    pub const PADDING: usize = core::mem::offset_of!(MapStatsPageInput, padding);
    /// `ObjectIdentity` (16 bytes).
    pub const IDENTITY: usize = core::mem::offset_of!(MapStatsPageInput, identity);
    /// The partition id of a partition or VP identity (u64).
    pub const PARTITION_ID: usize = IDENTITY;
    /// The VP index of a VP identity (u32).
    pub const VP_INDEX: usize = IDENTITY + 8;
    /// The stats area type of any identity (u8).
    pub const AREA: usize = IDENTITY + crate::object::IDENTITY_AREA_OFFSET;
    /// `TargetGpaPage` (u64), map only.
    pub const TARGET_GPA_PAGE: usize = core::mem::offset_of!(MapStatsPageInput, target_gpa_page);

    const _: () = assert!(IDENTITY == core::mem::offset_of!(UnmapStatsPageInput, identity));
    const _: () = assert!(STATS_TYPE == 0 && PADDING == 4 && IDENTITY == 8 && TARGET_GPA_PAGE == 24);
}

/// Input block of HvCallMapStatsPage / HvCallMapStatsPage2 (seed 003): 32 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct MapStatsPageInput {
    /// `StatsType` @0.
    pub stats_type: StatsObjectType,
    /// Padding @4; must be zero.
    pub padding: u32,
    /// `ObjectIdentity` @8.
    pub identity: StatsObjectIdentity,
    /// `TargetGpaPage` @24: the GPA page number where the page should appear.
    pub target_gpa_page: u64,
}

/// Input block of HvCallUnmapStatsPage: 24 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct UnmapStatsPageInput {
    /// `StatsType` @0.
    pub stats_type: StatsObjectType,
    /// Padding @4; must be zero.
    pub padding: u32,
    /// `ObjectIdentity` @8.
    pub identity: StatsObjectIdentity,
}

/// Output block of HvCallGetPartitionId: 8 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct GetPartitionIdOutput {
    /// The caller's partition id.
    pub partition_id: u64,
}

const _: () = assert!(size_of::<StatsObjectType>() == 4);
const _: () = assert!(size_of::<MapStatsPageInput>() == 32);
const _: () = assert!(size_of::<UnmapStatsPageInput>() == 24);
const _: () = assert!(size_of::<GetPartitionIdOutput>() == 8);

/// `HV_X64_MSR_GUEST_OS_ID`: the guest announces itself; the hypercall page needs it nonzero.
pub const MSR_GUEST_OS_ID: u32 = 0x4000_0000;
/// `HV_X64_MSR_HYPERCALL`: bit 0 enables the hypercall page, bits 63:12 are its GPA page.
pub const MSR_HYPERCALL: u32 = 0x4000_0001;
/// `HV_X64_MSR_VP_INDEX`: the calling VP's index (read-only).
pub const MSR_VP_INDEX: u32 = 0x4000_0002;
/// "Hv#1": the hypervisor interface signature in CPUID 0x40000001.EAX.
pub const INTERFACE_SIGNATURE: u32 = crate::cpuid::HV_INTERFACE_SIGNATURE;

/// The partition privilege mask (CPUID 0x40000003 EAX = bits 31:0, EBX = bits 63:32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PartitionPrivileges(pub u64);

impl PartitionPrivileges {
    /// AccessHypercallMsrs: the GUEST_OS_ID and HYPERCALL MSRs.
    pub const ACCESS_HYPERCALL_MSRS: u64 = 1 << 5;
    /// AccessVpIndex: the VP_INDEX MSR.
    pub const ACCESS_VP_INDEX: u64 = 1 << 6;
    /// `AccessStatsReg` (bit 8): the stats page MSRs.
    pub const ACCESS_STATS_REG: u64 = 1 << 8;
    /// `AccessPartitionId` (bit 33): HvCallGetPartitionId.
    pub const ACCESS_PARTITION_ID: u64 = 1 << 33;
    /// `AccessStats` (bit 40, EBX bit 8): HvMapStatsPage and HvUnmapStatsPage.
    pub const ACCESS_STATS: u64 = 1 << 40;

    /// True when the AccessStats privilege is held.
    pub const fn access_stats(self) -> bool {
        self.0 & Self::ACCESS_STATS != 0
    }

    /// True when the AccessPartitionId privilege is held.
    pub const fn access_partition_id(self) -> bool {
        self.0 & Self::ACCESS_PARTITION_ID != 0
    }
}
