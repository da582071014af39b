//! Counter sources in the kernel: what KVM, perf and procfs know about a VP that the run loop does
//! not see (intercepts handled inside KVM, CPU time, migrations).
//!
//! They read the host through the host readers of `hvstats_host` (tracefs, perf groups, `stat`
//! lines, schedstat, the in-kernel programs) and write the catalog's counters. Each source is opened for one VP thread and
//! read on demand through one seam, [`counter_source::CounterSource`]: a VP's sources are the list
//! [`counter_source::open_all`] makes, and [`crate::accounting::VpSources`] merges them into the
//! VP's page. The sources that read a thread from outside its process (its schedstat, the host's
//! page faults on it) serve observed VMs' vCPU threads too, through
//! [`counter_source::open_observed_all`]; an observed VM's in-kernel counting and QMP statistics
//! are read once for all its vCPUs by the observer.

pub mod counter_source;
pub mod host_faults;
pub mod kvm_stats;
pub mod perf_sw;
pub mod thread;
pub mod thread_time;
pub mod tracepoint;
pub mod vcpu_stats;
