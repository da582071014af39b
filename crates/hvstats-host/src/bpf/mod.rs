//! Counting tracepoints in the kernel with eBPF, without a compiler: programs assembled at run
//! time ([`insn`], [`program`]) from a tracepoint's format and ftrace-style filters ([`filter`]),
//! loaded with `bpf(2)` ([`sys`]), counting per thread into per-CPU arrays (the counting
//! [`engine`]).
//!
//! The observer uses this so that what it costs an observed guest does not grow with what it
//! counts: one program per tracepoint classifies each firing, where perf needs one filtered
//! counter per class, each evaluated on every firing. Perf counters remain where BPF is not
//! permitted.

pub mod engine;
pub mod filter;
pub mod insn;
pub mod keep;
pub mod program;
pub mod raw;
pub mod sys;

pub use engine::{
    Adoption, CarriedColumn, Claim, Context, Engine, EngineError, EngineLayout, Slot, SpanColumn,
    ThreadTable, TracepointColumn,
};
pub use keep::VmToken;
