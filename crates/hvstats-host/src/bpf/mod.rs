//! Counting tracepoints in the kernel with eBPF, without a compiler: programs assembled at run
//! time ([`insn`], [`program`]) from a tracepoint's format and ftrace-style filters ([`filter`]),
//! loaded with `bpf(2)` ([`sys`]), counting per thread into one row of an array each (the
//! counting [`engine`]).
//!
//! The observer uses this so that what it costs an observed guest does not grow with what it
//! counts: one program per tracepoint classifies each firing, where perf needs one filtered
//! counter per class, each evaluated on every firing. Perf counters remain where BPF is not
//! permitted.

pub mod btf;
pub mod engine;
pub mod filter;
pub mod insn;
pub mod keep;
mod limits;
pub mod listed_tasks;
pub mod program;
pub mod raw;
pub mod stats_copy;
pub mod sys;
pub mod task_iter;
pub mod vm_files;

pub use engine::{
    Adoption, CarriedColumn, Claim, Context, Engine, EngineError, EngineLayout, MAX_ROWS, MIN_ROWS,
    ROWS_PER_CPU, Slot, SpanColumn, ThreadTable, TracepointColumn, rows_allowed, rows_for_host,
};
pub use keep::VmToken;
