//! The guest physical layout shared by the VMM and the guest programs.
//!
//! The boot contract lives in the ABI crate ([`hvstats_abi::boot`], [`hvstats_abi::apic`]) so
//! the VMM needs nothing from this crate; it is re-exported here under the name the programs use.

pub use hvstats_abi::apic::{
    APIC_BASE, APIC_EOI, APIC_ICR_LOW, APIC_LVT_TIMER, APIC_SVR, APIC_TIMER_DIVIDE, APIC_TIMER_INITIAL,
    APIC_TPR, ICR_SELF,
};
pub use hvstats_abi::boot::{
    CODE_SELECTOR, DATA_SELECTOR, DEFAULT_LOAD_GPA, EXIT_PORT, GDT_BASE, HYPERCALL_INPUT, HYPERCALL_PAGE,
    IDT_BASE, IDT_LIMIT, MAX_IMAGE_SIZE, MAX_VPS, PAGE_TABLES_BASE, SERIAL_PORT, SINK_MMIO, SINK_MSR,
    SINK_PORT, STACK_SIZE, STACKS_BOTTOM, STACKS_TOP,
};
