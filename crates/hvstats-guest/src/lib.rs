//! Guest programs for hvstats partitions, written with iced-x86's assembler.
//!
//! A partition runs a raw image: bytes loaded at a guest physical address and entered in one of
//! three CPU modes ([`Mode`]). The VMM sets the mode up (segments, GDT, paging), points IDTR at
//! [`layout::IDT_BASE`], gives every VP its own stack, and enters with RDI (EDI) = VP index and
//! RSI (ESI) = VP count. [`Program`] is a small builder on top of iced-x86's `CodeAssembler` with the
//! pieces guests need (exit with a status, serial output, counted loops, interrupt handlers), and
//! [`workload`] builds the programs the tests and the demo run. [`bios`] builds `-bios` images for
//! QEMU whose guest does a known number of intercepts.

#![deny(missing_docs)]

pub mod bios;
pub mod hyperv;
pub mod layout;
pub mod program;
pub mod workload;

pub use program::{BuildError, GuestImage, Mode, Program};
pub use workload::Workload;
