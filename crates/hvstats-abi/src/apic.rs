//! The local APIC registers hvstats guests touch and KVM's tracepoints are filtered on.
//!
//! The guest workloads program the timer, write EOI and TPR and send self-IPIs through these
//! addresses; the KVM backend filters `kvm_mmio` and `kvm_apic_ipi` on the same values, so the
//! counts a guest expects and the filters that count them cannot drift apart.

/// The local APIC's MMIO base (its architectural default).
pub const APIC_BASE: u64 = 0xFEE0_0000;
/// Size of the local APIC's MMIO page.
pub const APIC_PAGE_SIZE: u64 = 0x1000;
/// APIC TPR register.
pub const APIC_TPR: u64 = APIC_BASE + 0x80;
/// APIC EOI register.
pub const APIC_EOI: u64 = APIC_BASE + 0xB0;
/// APIC spurious interrupt vector register (bit 8 enables the APIC).
pub const APIC_SVR: u64 = APIC_BASE + 0xF0;
/// APIC ICR, low half (writing it sends the IPI).
pub const APIC_ICR_LOW: u64 = APIC_BASE + 0x300;
/// APIC LVT timer register.
pub const APIC_LVT_TIMER: u64 = APIC_BASE + 0x320;
/// APIC timer initial count.
pub const APIC_TIMER_INITIAL: u64 = APIC_BASE + 0x380;
/// APIC timer divide configuration.
pub const APIC_TIMER_DIVIDE: u64 = APIC_BASE + 0x3E0;

/// The x2APIC MSR of the TPR (x2APIC registers are MSRs 0x800 + MMIO offset / 16).
pub const X2APIC_TPR_MSR: u32 = 0x808;
/// The x2APIC MSR of the EOI register.
pub const X2APIC_EOI_MSR: u32 = 0x80B;
/// IA32_APIC_BASE: bit 11 enables the APIC, bit 10 (with it) selects x2APIC mode.
pub const IA32_APIC_BASE: u32 = 0x1B;
/// IA32_APIC_BASE bits EN | EXTD.
pub const APIC_BASE_X2APIC_ENABLE: u32 = (1 << 11) | (1 << 10);

/// ICR destination shorthand field (bits 19:18).
pub const ICR_SHORTHAND_MASK: u32 = 0b11 << 18;
/// ICR destination shorthand "self" (01).
pub const ICR_SELF: u32 = 1 << 18;
/// ICR destination shorthand "all including self" (10).
pub const ICR_ALL_INCLUDING_SELF: u32 = 1 << 19;
