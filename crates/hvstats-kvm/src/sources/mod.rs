//! Counter sources in the kernel: what KVM, perf and procfs know about a VP that the run loop does
//! not see (intercepts handled inside KVM, CPU time, migrations).
//!
//! Each source is opened for one VP thread and read on demand; [`crate::accounting`] merges the
//! readings into the VP's page.

pub mod kvm_stats;
pub mod perf_sw;
pub mod thread_time;
pub mod tracefs;
pub mod tracepoint;
