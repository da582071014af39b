//! The guest physical layout shared by the VMM and the guest programs.
//!
//! These are conventions of hvstats partitions, not of x86: the VMM builds its tables at these
//! addresses and the guest programs rely on them.

/// The GDT the VMM writes for protected and long mode (null, code at 0x08, data at 0x10).
pub const GDT_BASE: u64 = 0x500;
/// The code segment selector in protected and long mode.
pub const CODE_SELECTOR: u16 = 0x08;
/// The data segment selector in protected and long mode.
pub const DATA_SELECTOR: u16 = 0x10;
/// The IDT (one 4 KiB page) that IDTR points at in protected and long mode; zero at entry.
pub const IDT_BASE: u64 = 0x1000;
/// Limit of the IDT.
pub const IDT_LIMIT: u16 = 0xFFF;
/// The long-mode page tables: PML4 here, then the PDPT and four page directories.
pub const PAGE_TABLES_BASE: u64 = 0x2000;
/// Where raw images are loaded unless the caller says otherwise.
pub const DEFAULT_LOAD_GPA: u64 = 0x1_0000;
/// The top of VP 0's stack; VP `i` uses `STACKS_TOP - i * STACK_SIZE`.
pub const STACKS_TOP: u64 = 0x9_0000;
/// Bytes of stack per VP.
pub const STACK_SIZE: u64 = 0x400;
/// The most VPs the stack area holds.
pub const MAX_VPS: u32 = 64;
/// The lowest byte of the stack area.
pub const STACKS_BOTTOM: u64 = STACKS_TOP - MAX_VPS as u64 * STACK_SIZE;
/// The largest image that fits between the load address and the stacks.
pub const MAX_IMAGE_SIZE: u64 = STACKS_BOTTOM - DEFAULT_LOAD_GPA;

/// Where workloads that make hypercalls enable the hypercall page (just above VP 0's stack).
pub const HYPERCALL_PAGE: u64 = STACKS_TOP;
/// The input page of those hypercalls (8-byte aligned blocks, within one page).
pub const HYPERCALL_INPUT: u64 = STACKS_TOP + 0x1000;

/// Port whose write stops the VP; the value written is its exit status.
pub const EXIT_PORT: u16 = 0xF4;
/// Port whose bytes are the guest's serial output.
pub const SERIAL_PORT: u16 = 0x3F8;
/// A port the VMM handles in userspace doing nothing (reads return 0): traffic for counting.
pub const SINK_PORT: u16 = 0xE0;

/// The local APIC's MMIO base.
pub const APIC_BASE: u64 = 0xFEE0_0000;
/// APIC EOI register.
pub const APIC_EOI: u64 = APIC_BASE + 0xB0;
/// APIC TPR register.
pub const APIC_TPR: u64 = APIC_BASE + 0x80;
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
/// ICR destination shorthand "self".
pub const ICR_SELF: u32 = 1 << 18;
