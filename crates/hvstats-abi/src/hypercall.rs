//! The hypercall ABI of the stats calls: codes, the input and result values, the input blocks.

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

macro_rules! hypercall_codes {
    ($($name:ident = $value:literal, $tlfs:literal, $class:ident;)*) => {
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
        }
    };
}

hypercall_codes! {
    SWITCH_VIRTUAL_ADDRESS_SPACE = 0x0001, "HvCallSwitchVirtualAddressSpace", VirtualMmu;
    FLUSH_VIRTUAL_ADDRESS_SPACE = 0x0002, "HvCallFlushVirtualAddressSpace", VirtualMmu;
    FLUSH_VIRTUAL_ADDRESS_LIST = 0x0003, "HvCallFlushVirtualAddressList", VirtualMmu;
    GET_LOGICAL_PROCESSOR_RUN_TIME = 0x0004, "HvCallGetLogicalProcessorRunTime", LogicalProcessor;
    NOTIFY_LONG_SPIN_WAIT = 0x0008, "HvCallNotifyLongSpinWait", LongSpinWait;
    SEND_SYNTHETIC_CLUSTER_IPI = 0x000B, "HvCallSendSyntheticClusterIpi", VirtualInterrupt;
    GET_PARTITION_ID = 0x0046, "HvCallGetPartitionId", Other;
    MAP_GPA_PAGES = 0x004B, "HvCallMapGpaPages", GpaSpace;
    UNMAP_GPA_PAGES = 0x004C, "HvCallUnmapGpaPages", GpaSpace;
    GET_VP_REGISTERS = 0x0050, "HvCallGetVpRegisters", VirtualProcessor;
    SET_VP_REGISTERS = 0x0051, "HvCallSetVpRegisters", VirtualProcessor;
    POST_MESSAGE = 0x005C, "HvCallPostMessage", SyntheticInterrupt;
    SIGNAL_EVENT = 0x005D, "HvCallSignalEvent", SyntheticInterrupt;
    MAP_STATS_PAGE = 0x006C, "HvCallMapStatsPage", GpaSpace;
    UNMAP_STATS_PAGE = 0x006D, "HvCallUnmapStatsPage", GpaSpace;
    MAP_STATS_PAGE2 = 0x0131, "HvCallMapStatsPage2", GpaSpace;
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
