//! The typed VP counter sets of `WHvGetVirtualProcessorCounters` (seed 000).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `WHV_PROCESSOR_COUNTER_SET` (open enum: an unknown set is reported, not rejected at decode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(transparent)]
pub struct CounterSet(pub u32);

impl CounterSet {
    /// `WHvProcessorCounterSetRuntime`: [`RuntimeCounters`].
    pub const RUNTIME: Self = Self(0);
    /// `WHvProcessorCounterSetIntercepts`: [`InterceptCounters`].
    pub const INTERCEPTS: Self = Self(1);
    /// `WHvProcessorCounterSetEvents`: [`EventCounters`].
    pub const EVENTS: Self = Self(2);
    /// `WHvProcessorCounterSetApic`: [`ApicCounters`].
    pub const APIC: Self = Self(3);

    /// The size of the set's struct, or `None` for an unknown set.
    pub const fn size(self) -> Option<usize> {
        match self {
            Self::RUNTIME => Some(size_of::<RuntimeCounters>()),
            Self::INTERCEPTS => Some(size_of::<InterceptCounters>()),
            Self::EVENTS => Some(size_of::<EventCounters>()),
            Self::APIC => Some(size_of::<ApicCounters>()),
            _ => None,
        }
    }
}

/// An `HRESULT` as returned by the WHv API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HResult(pub u32);

impl HResult {
    /// `S_OK`.
    pub const S_OK: Self = Self(0);
    /// `WHV_E_INSUFFICIENT_BUFFER`: the buffer is smaller than the counter set.
    pub const WHV_E_INSUFFICIENT_BUFFER: Self = Self(0x8037_0301);
    /// `WHV_E_UNKNOWN_PROPERTY`: the counter set is not recognized.
    pub const WHV_E_UNKNOWN_PROPERTY: Self = Self(0x8037_0302);
    /// `E_INVALIDARG`: an argument (e.g. the VP index) is not valid.
    pub const E_INVALIDARG: Self = Self(0x8007_0057);
    /// `E_FAIL`: an unspecified failure (e.g. a backend source could not be read).
    pub const E_FAIL: Self = Self(0x8000_4005);
}

/// `WHV_PROCESSOR_RUNTIME_COUNTERS` (16 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct RuntimeCounters {
    /// Time spent in guest and hypervisor code, in 100 ns.
    pub total_runtime_100ns: u64,
    /// Time spent in hypervisor code, in 100 ns.
    pub hypervisor_runtime_100ns: u64,
}

/// `WHV_PROCESSOR_INTERCEPT_COUNTER` (16 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct InterceptCounter {
    /// Number of intercepts.
    pub count: u64,
    /// Time spent handling them, in 100 ns.
    pub time_100ns: u64,
}

/// `WHV_PROCESSOR_INTERCEPT_COUNTERS` (176 bytes: 11 counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct InterceptCounters {
    /// INVLPG.
    pub page_invalidations: InterceptCounter,
    /// `ControlRegisterAccesses`: from VP "Control register accesses/sec" and its cost.
    pub control_register_accesses: InterceptCounter,
    /// `IoInstructions` (IN/OUT/INS/OUTS): from VP "IO instructions/sec" and its cost.
    pub io_instructions: InterceptCounter,
    /// HLT.
    pub halt_instructions: InterceptCounter,
    /// `CpuidInstructions`: from VP "CPUID instructions/sec" and its cost.
    pub cpuid_instructions: InterceptCounter,
    /// RDMSR/WRMSR.
    pub msr_accesses: InterceptCounter,
    /// Any other intercept.
    pub other_intercepts: InterceptCounter,
    /// Interrupt-window (TPR reduction) intercepts.
    pub pending_interrupts: InterceptCounter,
    /// `EmulatedInstructions`: from VP "Emulated instructions/sec" and its cost.
    pub emulated_instructions: InterceptCounter,
    /// `DebugRegisterAccesses`: from VP "Debug register accesses/sec" and its cost.
    pub debug_register_accesses: InterceptCounter,
    /// `PageFaultIntercepts`: from VP "Page fault intercepts/sec" and its cost.
    pub page_fault_intercepts: InterceptCounter,
}

/// `WHV_PROCESSOR_EVENT_COUNTERS` (24 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct EventCounters {
    /// Page faults delivered to the guest.
    pub page_fault_count: u64,
    /// Exceptions delivered to the guest.
    pub exception_count: u64,
    /// Interrupts delivered to the guest.
    pub interrupt_count: u64,
}

/// `WHV_PROCESSOR_APIC_COUNTERS` (40 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ApicCounters {
    /// `MmioAccessCount`: from VP "APIC MMIO accesses/sec".
    pub mmio_access_count: u64,
    /// `EoiAccessCount`: from VP "APIC EOI accesses/sec".
    pub eoi_access_count: u64,
    /// `TprAccessCount`: from VP "APIC TPR accesses/sec".
    pub tpr_access_count: u64,
    /// `SentIpiCount`: from VP "APIC IPIs sent/sec", self IPIs included.
    pub sent_ipi_count: u64,
    /// `SelfIpiCount`: from VP "APIC self IPIs sent/sec".
    pub self_ipi_count: u64,
}

const _: () = assert!(size_of::<RuntimeCounters>() == 16);
const _: () = assert!(size_of::<InterceptCounter>() == 16);
const _: () = assert!(size_of::<InterceptCounters>() == 176);
const _: () = assert!(size_of::<EventCounters>() == 24);
const _: () = assert!(size_of::<ApicCounters>() == 40);
