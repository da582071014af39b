//! The boot contract between the VMM and the guest programs of an hvstats partition.
//!
//! Neither side owns these facts: the VMM (hvstats-kvm) builds its descriptor tables, page tables
//! and stacks at these addresses and handles these ports and MSRs; the guest programs
//! (hvstats-guest) rely on them. Keeping them here lets both depend on the ABI crate and nothing
//! else. They are conventions of hvstats partitions, not of x86 or Hyper-V.
//!
//! A VP is entered in one of three [`Mode`]s with RDI (EDI) = VP index and RSI (ESI) = VP count,
//! on its own stack, with IDTR pointing at [`IDT_BASE`].

/// The CPU mode a partition's VPs start in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// 16-bit real mode; CS = DS = SS-independent segment of the load address.
    Real,
    /// 32-bit protected mode with flat segments, no paging.
    Protected,
    /// 64-bit long mode with the VMM's identity map of the low 4 GiB.
    Long,
}

impl Mode {
    /// The assembler bitness of the mode.
    pub const fn bitness(self) -> u32 {
        match self {
            Mode::Real => 16,
            Mode::Protected => 32,
            Mode::Long => 64,
        }
    }

    /// Parses `real`, `protected` or `long`.
    ///
    /// ```
    /// use hvstats_abi::boot::Mode;
    /// assert_eq!(Mode::parse("long"), Some(Mode::Long));
    /// assert_eq!(Mode::parse(Mode::Real.name()), Some(Mode::Real));
    /// assert_eq!(Mode::parse("paged"), None);
    /// ```
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "real" => Some(Mode::Real),
            "protected" => Some(Mode::Protected),
            "long" => Some(Mode::Long),
            _ => None,
        }
    }

    /// The mode's name as [`Mode::parse`] accepts it.
    pub const fn name(self) -> &'static str {
        match self {
            Mode::Real => "real",
            Mode::Protected => "protected",
            Mode::Long => "long",
        }
    }

    /// For real mode, the code segment base an address runs under (its 64 KiB-aligned part).
    pub const fn real_mode_segment_base(gpa: u64) -> u64 {
        gpa & 0xF_0000
    }
}

/// The GDT the VMM writes for protected and long mode (null, code at 0x08, data at 0x10).
pub const GDT_BASE: u64 = 0x500;
/// The code segment selector in protected and long mode.
pub const CODE_SELECTOR: u16 = 0x08;
/// The data segment selector in protected and long mode.
pub const DATA_SELECTOR: u16 = 0x10;
/// The IDT (one 4 KiB page) that IDTR points at in protected and long mode; zero at entry.
pub const IDT_BASE: u64 = 0x1000;
/// IDTR's limit: the offset of the IDT page's last byte (size - 1), as the CPU wants it.
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

/// The stack top of VP `index`.
pub const fn stack_top(index: u32) -> u64 {
    STACKS_TOP - index as u64 * STACK_SIZE
}

/// Where workloads that make hypercalls enable the hypercall page (just above VP 0's stack).
pub const HYPERCALL_PAGE: u64 = STACKS_TOP;
/// The input page of those hypercalls (8-byte aligned blocks, within one page).
pub const HYPERCALL_INPUT: u64 = STACKS_TOP + 0x1000;

/// Port whose write stops the VP; the value written is its exit status.
pub const EXIT_PORT: u16 = 0xF4;
/// Port whose bytes are the guest's serial output (a 16550's THR; LSR at `SERIAL_PORT + 5`).
pub const SERIAL_PORT: u16 = 0x3F8;
/// A port the VMM handles in userspace doing nothing (reads return 0): traffic for counting.
pub const SINK_PORT: u16 = 0xE0;
/// An MSR the VMM handles in userspace doing nothing (reads return 0): traffic for counting.
pub const SINK_MSR: u32 = 0x4000_1000;

/// A device register no memory slot backs and no in-kernel device claims (the HPET's base, which
/// KVM does not emulate): each guest access is an MMIO exit handled in userspace, where reads
/// return all ones and writes are dropped. Traffic for counting memory intercepts.
pub const SINK_MMIO: u64 = 0xFED0_0000;

/// The port the hypercall page writes to; a write there is the hypercall instruction (`vmcall`
/// does not reach userspace on every host).
pub const HYPERCALL_PORT: u8 = 0xF5;
/// The hypercall page code the VMM writes: `out HYPERCALL_PORT, al; ret`.
pub const HYPERCALL_CODE: [u8; 3] = [0xE6, HYPERCALL_PORT, 0xC3];

const _: () = assert!(STACKS_BOTTOM > DEFAULT_LOAD_GPA);
const _: () = assert!(PAGE_TABLES_BASE + 6 * 0x1000 <= DEFAULT_LOAD_GPA);
