//! Counter sources in the kernel: what KVM, perf and procfs know about a VP that the run loop does
//! not see (intercepts handled inside KVM, CPU time, migrations).
//!
//! The host-sources layer our partitions and the observer share: [`tracefs`] (find or mount,
//! event ids and formats) for the VP tracepoint groups, the observer's counters and the in-kernel
//! programs; per-thread perf groups are `hvstats::perf_group`, `stat` lines
//! `hvstats::task_stat`, schedstat `hvstats::sched`. Each source is opened for one VP thread and
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
pub mod tracefs;
pub mod tracepoint;
pub mod vcpu_stats;
