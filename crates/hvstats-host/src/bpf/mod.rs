//! Counting tracepoints in the kernel with eBPF, without a compiler: programs assembled at run
//! time ([`insn`], [`program`]) from a tracepoint's format and ftrace-style filters ([`filter`]),
//! loaded with `bpf(2)` ([`sys`]), counting per thread into per-CPU arrays ([`tally`]).
//!
//! The observer uses this so that what it costs an observed guest does not grow with what it
//! counts: one program per tracepoint classifies each firing, where perf needs one filtered
//! counter per class, each evaluated on every firing. Perf counters remain where BPF is not
//! permitted.

pub mod filter;
pub mod insn;
pub mod keep;
pub mod program;
pub mod raw;
pub mod sys;
pub mod tally;

pub use keep::VmToken;
pub use tally::{
    Adoption, CarriedColumn, Claim, Context, Slot, SpanColumn, Tally, TallyError, TallyLayout, ThreadTable,
    TracepointColumn,
};
