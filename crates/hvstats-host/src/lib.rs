//! Host readers: what the Linux host knows about threads and tracepoints, read the same way by
//! every hvstats component that counts (our own partitions' VPs, the observer of other processes'
//! VMs, the hardware counter allocator), and nothing about stats pages or the catalog.
//!
//! - [`os`]: the one check of a syscall's result; [`error_chain`]: an error and its causes on one line;
//! - [`task_stat`] and [`sched`]: a thread's `stat` line (clocks, faults, start time) and its
//!   schedstat (run time, CPU wait, dispatches);
//! - [`perf_event`] and [`perf_group`]: perf counters, alone or as a group read at once;
//! - [`tracefs`]: where tracefs is (mounted when needed), and each event's id and format;
//! - [`bpf`]: tracepoints counted in the kernel by eBPF programs assembled at run time;
//! - [`counting`]: a list of events counted on threads, in the kernel where permitted, by perf
//!   counters otherwise: the one engine of every tracepoint count.

#![deny(missing_docs)]

pub mod bpf;
pub mod counting;
pub mod dir_watch;
pub mod error_chain;
pub mod exit_watch;
pub mod os;
pub mod perf_event;
pub mod perf_group;
pub mod sched;
pub mod task_stat;
pub mod tracefs;
